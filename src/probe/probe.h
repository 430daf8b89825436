/*
 * probe.h - measuring the machine at hand into a hardware profile, so the
 * planner and the simulator can predict times for the backend that will run
 * here. The shipped profiles (data/hw/) describe GPUs from their datasheets;
 * this one is measured.
 */
#ifndef TIDE_PROBE_H
#define TIDE_PROBE_H

#include "cost/cost.h"

/* Measures this machine as the CPU backend sees it and fills *out, named
 * "probed-<hostname>":
 *   flops[f32]          best rate of OpenBLAS cblas_sgemm on square matrices
 *                       (up to 2048^3; smaller when the budget is small);
 *   flops[bf16], [f16]  the same matmul preceded by converting a bf16 / f16
 *                       weight to f32, as the CPU backend computes them;
 *   flops[i32]          = flops[f32] (never a matmul dtype);
 *   matmul_efficiency   1 (the rates above are already achieved rates);
 *   mem_bw              bytes read + written per second by a parallel copy;
 *   host_flops, host_mem_bw  flops[f32] and mem_bw again (computes placed on
 *                       the host run on this same CPU);
 *   h2d_bw, d2h_bw      memcpy rate (the CPU backend's "device" is host RAM);
 *   ssd_*               O_DIRECT sequential write then read of a temporary
 *                       file in ssd_dir through the SSD store's engine, as
 *                       the executor transfers (32 MiB calls split into its
 *                       requests, many in flight; 64 to 256 MiB) and the
 *                       mean latency of 4 KiB
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

/* Names a measured profile "probed-<hostname>[-<suffix>]", every character
 * outside [A-Za-z0-9._-] replaced by '-'. */
void tide_probe_name(tide_hw *h, const char *suffix);

/* The drive part of tide_probe alone: fills h's ssd_* fields (ssd_dir and
 * errors as above), leaves the rest of h as it is. */
tide_status tide_probe_drives(tide_ctx *ctx, const char *ssd_dir, double seconds_budget, tide_hw *h);

/* The compute and link part of tide_probe_backend (below), through be's
 * vtable on any backend (the CPU's too, where "device" memory is host
 * memory): fills flops, matmul_efficiency, attention_efficiency, mem_bw,
 * launch_s, h2d_bw, d2h_bw and link_latency_s of h as tide_probe_backend
 * describes them (the block types' flops excepted), leaves the rest. seconds_budget <= 0: 6.5 s; below 1.3 s
 * the tensors are an eighth of the size. */
tide_status tide_probe_ops(tide_ctx *ctx, tide_backend *be, double seconds_budget, tide_hw *h);

/* The matrix-vector rates of tide_probe_backend's CPU profile, through be's
 * MATMUL kernel: matvec_bw[f32], [f16], [bf16] of h, each the bytes
 * (tide_op_bytes) of one product of a row by a 64 MiB weight of that dtype
 * (rows of 4096) over its best time less h->launch_s (measured first). seconds_budget
 * <= 0: 1.5 s. Errors as tide_probe_ops. */
tide_status tide_probe_matvec(tide_ctx *ctx, tide_backend *be, double seconds_budget, tide_hw *h);

/* Measures the machine as backend `be` sees it, every rate through the
 * backend itself, as the executor will use it, so that predictions follow
 * its kernels. On a backend computing in host memory (the CPU), every field
 * is measured (base is ignored): the drives as tide_probe_drives, the ops as
 * tide_probe_ops below (flops, attention_efficiency, mem_bw, launch_s, and
 * h2d_bw, d2h_bw and link_latency_s from the backend's copies, which are
 * memcpy there), matvec_bw as tide_probe_matvec; host_flops and host_mem_bw
 * are flops[f32] and mem_bw (the host is that CPU); device_mem_bytes and
 * host_mem_bytes the physical memory. An op's time there is the median of
 * its repetitions, not the best: the run will share the cores with whatever
 * else the machine runs, as the measurement does. tide_probe, which times OpenBLAS
 * directly, is what a machine offers rather than what tide's kernels reach.
 * On a device backend (CUDA), *out is `base` (NULL: all fields measured)
 * with these fields replaced:
 *   flops[f32], [f16], [bf16]  MATMUL ops of llama-7b's shape (2048 x 4096 x
 *                       4096, smaller when the budget is small) with weights
 *                       of each dtype, in the backend's current matmul mode,
 *                       less the per-op overhead below; flops[i32] = f32;
 *   flops[q8_0] ... [q6_k]  the same with a block-quantized weight, an eighth
 *                       of the rows (on the CPU matvec_bw of each block type
 *                       too);
 *   matmul_efficiency   1 (achieved rates);
 *   attention_efficiency  achieved FLOP/s of an ATTENTION op (a fresh
 *                       prefill of 1024 tokens, 32 heads of 128) over
 *                       flops[f32], at most 1;
 *   mem_bw              bytes read + written per second by an ADD op over
 *                       128 MiB tensors;
 *   launch_s            time of one tiny op, launch and wait included (the
 *                       executor waits for every op);
 *   h2d_bw, d2h_bw      copies of 64 MiB from / to pinned host memory
 *                       (host_alloc; pageable when it has none);
 *   link_latency_s      time of a 4-byte copy;
 *   device_mem_bytes    the device's memory (mem_info), host_mem_bytes the
 *                       host's physical memory;
 *   ssd_*               as tide_probe_drives.
 * Named "probed-<hostname>-<backend>". Temporary device memory is freed
 * before returning. TIDE_E_NOMEM when the device cannot hold the test
 * tensors; other errors as tide_probe. */
tide_status tide_probe_backend(tide_ctx *ctx, tide_backend *be, const char *ssd_dir, double seconds_budget,
                               const tide_hw *base, tide_hw *out);

/* tide_probe_backend measuring only the block types in `blocks` (bit d:
 * tide_dtype d; 0: none, their rates left 0, which the cost model reads as
 * the bf16 rate), within the same time budget: a run measures the types its
 * model holds. */
tide_status tide_probe_backend_blocks(tide_ctx *ctx, tide_backend *be, const char *ssd_dir, double seconds_budget,
                                      const tide_hw *base, uint32_t blocks, tide_hw *out);

#endif
