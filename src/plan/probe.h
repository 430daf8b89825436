/*
 * probe.h - measuring the machine at hand into a hardware profile, so the
 * planner and the simulator can predict times for the backend that will run
 * here. The shipped profiles (data/hw/) describe GPUs from their datasheets;
 * this one is measured.
 */
#ifndef TIDE_PROBE_H
#define TIDE_PROBE_H

#include "plan/plan.h"

/* Measures this machine as the CPU backend sees it and fills *out, named
 * "probed-<hostname>":
 *   flops[f32]          best rate of OpenBLAS cblas_sgemm on square matrices
 *                       (up to 2048^3; smaller when the budget is small);
 *   flops[bf16], [f16]  the same matmul preceded by converting a bf16 / f16
 *                       weight to f32, as the CPU backend computes them;
 *   flops[i32]          = flops[f32] (never a matmul dtype);
 *   matmul_efficiency   1 (the rates above are already achieved rates);
 *   mem_bw              bytes read + written per second by a parallel copy;
 *   h2d_bw, d2h_bw      memcpy rate (the CPU backend's "device" is host RAM);
 *   ssd_*               O_DIRECT sequential write then read of a temporary
 *                       file in ssd_dir (1 MiB requests, 4 KiB-aligned
 *                       buffers, up to 256 MiB) and the mean latency of 4 KiB
 *                       reads, in each directory of ssd_dir that lies on a
 *                       device of its own (st_dev); ssd_count is the number
 *                       of such devices and the figures are per-drive means.
 *                       Where the file system refuses O_DIRECT, buffered I/O
 *                       with the cache dropped is used;
 *   host_mem_bytes      physical memory; device_mem_bytes the same;
 *   launch_s, link_latency_s   fixed estimates of the CPU executor's per-op
 *                       and per-transfer overheads (5 us each).
 * ssd_dir: a directory on the drive to measure, or a comma-separated list of
 * them like tide's ssd_dirs option (NULL or "": $TMPDIR or /tmp).
 * seconds_budget: rough wall time to spend (<= 0: 10 s); sizes shrink to fit.
 * The temporary file is unlinked as soon as it is created, so it never
 * outlives the call, even on error. Returns TIDE_OK, TIDE_E_IO (a directory
 * missing or not writable, an I/O failure), TIDE_E_INVALID (an empty list) or
 * TIDE_E_NOMEM; *out is written only on success. */
tide_status tide_probe(tide_ctx *ctx, const char *ssd_dir, double seconds_budget, tide_hw *out);

#endif
