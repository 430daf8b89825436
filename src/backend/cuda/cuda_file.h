/*
 * cuda_file.h - reads from a file straight into CUDA device memory through
 * cuFile (GPUDirect Storage), for the executor's SSD loads. Optional: in a
 * build without cufile.h, or on a machine where libcufile or its driver is
 * absent, every call answers TIDE_E_UNSUPPORTED and the caller keeps its
 * bounce-buffer path (pread + to_device).
 */
#ifndef TIDE_CUDA_FILE_H
#define TIDE_CUDA_FILE_H

#include "backend/backend.h"

/* True when this process can use cuFile: built with it, libcufile opened
 * and cuFileDriverOpen succeeded (tried once; thread-safe). */
bool tide_cuda_file_available(void);

/* Reads n bytes at file offset off of fd into device memory dst of be (a
 * CUDA backend). fd should be opened with O_DIRECT and off, n and dst be
 * 4 KiB aligned for the direct DMA path; anything else still works through
 * cuFile's own bounce buffers (its compatibility mode), only slower.
 * Synchronous: the bytes are in dst when it returns. Returns
 * TIDE_OK; TIDE_E_UNSUPPORTED (no cuFile here, be is not a CUDA backend, or
 * cuFile refuses to register the file); TIDE_E_IO (the read failed or came
 * short), with a message on ctx (the context of the queue the caller reads
 * for, backend.h). */
tide_status tide_cuda_file_read(tide_backend *be, tide_ctx *ctx, int fd, uint64_t off, void *dst, size_t n);

#endif
