/*
 * cuda_train.h - the CUDA backend's kernels of the training ops (the
 * backward of each forward op, the loss's row work, the gradients' sum of
 * squares, the optimizer step) and of MATMUL's backward forms where cuBLAS
 * does not serve, as launchers callable from C. Same conventions as
 * cuda_kernels.h: each enqueues on `s` and returns the launch status;
 * pointers are device pointers; workspace is the caller's; the CPU kernels
 * (src/backend/cpu/kernels.h, training part) are the reference.
 *
 * Determinism: no floating-point atomics. A sum over rows, heads or
 * elements is either one thread's loop in a fixed order or a fixed tree
 * over partial sums whose split depends on the shape (and the workspace
 * size the graph gives) alone, so results are the same bits on every run
 * of one GPU model whatever the launch timing.
 */
#ifndef TIDE_CUDA_TRAIN_H
#define TIDE_CUDA_TRAIN_H

#include "tide.h"

#include <cuda_runtime_api.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Id checks of the training ops. ids (n) i32: an id is bad when it is
 * below lo, not below hi, or (iota) not its own index. tcu_ids_check sets
 * *flag (1 i32) to TCU_FLAG_OK, then to the smallest bad index;
 * tcu_ids_record claims an empty record as tcu_range_record does:
 * rec = {kind, base + i, ids[i], hi} (saturated to INT32_MAX). n <
 * TCU_FLAG_OK; kind != 0. */
cudaError_t tcu_ids_check(cudaStream_t s, const int32_t *ids, int64_t n, int64_t lo, int64_t hi, bool iota,
                          int32_t *flag);
cudaError_t tcu_ids_record(cudaStream_t s, const int32_t *ids, int64_t n, int64_t lo, int64_t hi, bool iota,
                           int32_t kind, int64_t base, int32_t *rec);

/* Columns [n0, n0 + cnt) of w (K, N) of dt, widened exactly to f32:
 * dst (K, cnt). cudaErrorInvalidValue for a dtype other than f16, bf16. */
cudaError_t tcu_convert_cols(cudaStream_t s, const void *w, tide_dtype dt, int64_t K, int64_t N, int64_t n0,
                             int64_t cnt, float *dst);

/* MATMUL's forms without BLAS: out (R, N) (rows ldo apart) = x (R, K) . w,
 * w (K, N) when w_kn else (N, K) used transposed, of any float dtype; with
 * accumulate out += the product. A thread per output column keeps up to
 * TCU_MATMUL_FUSED_R rows' sums, over k in order. For small row counts and
 * workspaces too small for a widened block. out must not overlap x or w. */
cudaError_t tcu_matmul_small(cudaStream_t s, const float *x, const void *w, tide_dtype wdt, int64_t R, int64_t K,
                             int64_t N, bool w_kn, bool accumulate, float *out, int64_t ldo);

/* EMBED_BWD: dtable (V, D), the rows of ids [vocab0, vocab0 + V), +=
 * dy (R, D) row r at row tokens[r] - vocab0, rows in order of r (so exactly
 * the CPU's f32 sums); ids outside the block are skipped. The caller zeroes
 * dtable first for the fresh form. A block per (column block, slice of the
 * vocabulary block) walks every token. */
cudaError_t tcu_embed_bwd(cudaStream_t s, const float *dy, const int32_t *tokens, int64_t R, int64_t D,
                          int64_t vocab0, int64_t V, float *dtable);

/* RMSNORM_BWD: x, dy, dx (R, D), w (D) of wdt, dw (D), in the CPU's
 * arithmetic (tk_rmsnorm_bwd): rs = 1/sqrtf(mean(x^2) + eps) with the
 * mean's sum in double, dx = rs * (dy w) - x * (float)(rs^3 / D *
 * sum(dy w x)) (that sum in double), dw (+)= sum over rows of dy * (x * rs)
 * in double, rounded once. work (work_bytes, 8-byte aligned) holds the rows'
 * rs, then dw's partial sums over blocks of rows, as many blocks as it has
 * room for (ceil(R / 256) with graph/ops.c's size), added in block order.
 * cudaErrorInvalidValue when work holds less than R floats and one row of
 * D doubles. dx must not overlap x or dy. */
cudaError_t tcu_rmsnorm_bwd(cudaStream_t s, const float *x, const void *w, tide_dtype wdt, const float *dy,
                            int64_t R, int64_t D, float eps, bool accumulate, float *dx, float *dw, void *work,
                            size_t work_bytes);

/* SILU_MUL_BWD, in the CPU's generic arithmetic: with e = 1 + expf(-gate)
 * (expf evaluated in double, rounded once) and s = 1 / e, dup = dy * (gate
 * / e), dgate = dy * up * (s * (1 + gate * (1 - s))). Safe in place. */
cudaError_t tcu_silu_mul_bwd(cudaStream_t s, const float *gate, const float *up, const float *dy, float *dgate,
                             float *dup, int64_t n);

/* ATTENTION_BWD of fresh sequences (positions 0..T-1, not read): q, o, dout,
 * dq (B*T, H*hd); k, v, dk, dv (B*T, KV*hd). Three kernels:
 *   - row statistics into stats (3 * B*H*T floats): per query row and head
 *     the softmax's max m, 1 / sum (the sum of expf(s - m) in double) and
 *     rowsum(dO * O) in double (the CPU's recomputation, tk_attention_bwd);
 *   - dk, dv: a block per (batch, kv head, tile of keys), over the group's
 *     query heads then the query tiles at and after the keys, in order;
 *   - dq: a block per (batch, head, tile of queries), over the key tiles
 *     up to the queries, in order.
 * Each recomputes P = expf(scale q.k - m) / sum and dS = P (dO.v - D) per
 * tile in shared memory (tiles of 32, 16, 8 or 4 rows for head_dim up to
 * 64, 128, 256, 512: under 48 KiB). No two blocks write one element, so
 * dk and dv sum over heads and queries in a fixed order. dq, dk, dv are
 * written fresh. cudaErrorInvalidValue for hd > TCU_ATTN_MAX_HD, H % KV,
 * or B*T*H >= 2^31. */
#define TCU_ATTN_BWD_STATS 3 /* floats of stats per query row and head */
cudaError_t tcu_attention_bwd(cudaStream_t s, const float *q, const float *k, const float *v, const float *o,
                              const float *dout, float *dq, float *dk, float *dv, int64_t B, int64_t T, int H,
                              int KV, int hd, float *stats);

/* CROSS_ENTROPY's row work on a chunk of logits l (R, V) with targets (R):
 * each row with a target in [0, V) becomes scale * (softmax - onehot) and
 * its loss term logsumexp - logit[target] goes to terms[r] (double); other
 * rows become zeros with term 0. The arithmetic is the CPU's ce_row
 * (expf(l - max), the sum in double, its inverse rounded to f32). */
cudaError_t tcu_ce_rows(cudaStream_t s, float *l, int64_t R, int64_t V, const int32_t *targets, float scale,
                        double *terms);

/* CROSS_ENTROPY's loss (1) = (float)(scale * sum of terms (n)), the sum in
 * double by one block in a fixed order; with add, that value is added to
 * *loss in f32 (a row tile after the first). */
cudaError_t tcu_ce_loss(cudaStream_t s, const double *terms, int64_t n, float scale, bool add, float *loss);

/* CE_STATS' row work on a chunk of logits l (R, Vb) of the head's ids
 * [vocab0, vocab0 + Vb), with targets (R): each row's max m, sum of
 * expf(l - m) (in double) and target logit (0 where the target is
 * elsewhere), merged into stats_in's (R, 3; NULL: the first block) as
 * tk_ce_stats does: M the larger max, S = S_in exp(M_in - M) + sum exp(m -
 * M) in double rounded to f32, t = t_in + the block's; written to stats
 * (R, 3), which may be stats_in. With terms (the last block): terms[r] =
 * M + log S - t in double from the rounded statistics, 0 where the target
 * is < 0. l is only read. cudaErrorInvalidValue for Vb < 1 (with rows). */
cudaError_t tcu_ce_stats_rows(cudaStream_t s, const float *l, int64_t R, int64_t Vb, const int32_t *targets,
                              int64_t vocab0, const float *stats_in, float *stats, double *terms);

/* CE_BLOCK's row work: each row of l (R, Vb) (ids [vocab0, vocab0 + Vb))
 * whose target is >= 0 becomes g = scale * (expf(l - M) * (float)(1 / S) -
 * onehot) from the whole head's stats (R, 3) = (M, S, t), the target's
 * entry formed in double, as tk_ce_block; other rows become zeros. */
cudaError_t tcu_ce_block_rows(cudaStream_t s, float *l, int64_t R, int64_t Vb, const int32_t *targets,
                              int64_t vocab0, const float *stats, float scale);

/* SUMSQ: out (1) = (float)(acc + sum g^2) with acc = *acc_in (NULL: 0; may
 * be out), the squares summed in double: partial sums over equal blocks of
 * elements (as many as parts_bytes holds doubles, at least one), then those
 * in order by one block. */
cudaError_t tcu_sumsq(cudaStream_t s, const float *g, int64_t n, const float *acc_in, float *out, double *parts,
                      size_t parts_bytes);

/* ADAMW: tk_adamw's arithmetic on the GPU, bit for bit: hyper (4) and
 * sumsq (1) are read from device memory; param of pdt, master (NULL: the
 * step runs on param, then f32), m, v, grad (n). */
cudaError_t tcu_adamw(cudaStream_t s, void *param, tide_dtype pdt, float *master, float *m, float *v,
                      const float *grad, int64_t n, const float *hyper, const float *sumsq, float beta1, float beta2,
                      float eps, float weight_decay, float max_norm);

#ifdef __cplusplus
}
#endif
#endif
