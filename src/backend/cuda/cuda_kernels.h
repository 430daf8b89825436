/*
 * cuda_kernels.h - the CUDA backend's kernels, as launchers callable from C:
 * each enqueues its kernel(s) on `s` and returns the launch status
 * (cudaSuccess, or the error of the launch; errors of the execution surface
 * at the caller's stream synchronisation). They know nothing of graphs,
 * contexts or backends; cuda_backend.c reads shapes from the graph, checks
 * ranges and calls them.
 *
 * Semantics are those of the CPU kernels (src/backend/cpu/kernels.h), which
 * are the reference:
 *   - activations f32 row-major; weights f32, f16 or bf16 converted exactly
 *     to f32 (bit-identical to tide_convert_to_f32, NaN payloads included);
 *   - every reduction has a fixed order (warp shuffles and shared-memory
 *     trees indexed by thread, no atomics), so the same input gives the same
 *     bits on every run of the same GPU;
 *   - nothing is allocated: workspace is the caller's.
 * Pointers are device pointers unless a comment says otherwise. Sizes are
 * int64_t; the caller has checked that they fit the grids (see each entry).
 */
#ifndef TIDE_CUDA_KERNELS_H
#define TIDE_CUDA_KERNELS_H

#include "tide.h"

#include <cuda_runtime_api.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Checks that this build has kernels the current device can run: returns
 * cudaSuccess, or cudaErrorNoKernelImageForDevice (or the error of the
 * query). Launches nothing. */
cudaError_t tcu_probe(void);

/* The value a range-check flag holds when every id was in range; the flag
 * holds the smallest bad index otherwise (so the caller can name it). */
#define TCU_FLAG_OK 0x7f7f7f7f

/* Range check. ids (n) i32, flag (1) i32: sets *flag to TCU_FLAG_OK, then to
 * the smallest index i with ids[i] outside [0, hi). n < TCU_FLAG_OK. */
cudaError_t tcu_range_check(cudaStream_t s, const int32_t *ids, int64_t n, int64_t hi, int32_t *flag);

/* Deferred range check (asynchronous issue, where nobody waits for a flag):
 * rec (4) i32 is a record that stays claimed once set. When some ids[i] lies
 * outside [0, hi) and rec[0] is 0, one such i claims it: rec = {kind, base +
 * i, ids[i], hi} (index and hi saturated to INT32_MAX). kind != 0. The kernels
 * that index by ids or positions (embed, cache write, attention) stay inside
 * their buffers whatever the values, so work queued behind a failed check
 * is wrong but harmless. */
cudaError_t tcu_range_record(cudaStream_t s, const int32_t *ids, int64_t n, int64_t hi, int32_t kind,
                             int64_t base, int32_t *rec);

/* dst (n) f32 = src (n) of dt (f32, f16, bf16), exactly. */
cudaError_t tcu_convert(cudaStream_t s, const void *src, tide_dtype dt, float *dst, int64_t n);

/* EMBED. table (V, D) of dt holding ids [vocab0, vocab0 + V), tokens (R) i32
 * already range-checked, out (R, D) f32: out[r] = the table row of tokens[r]
 * where the table holds it; other rows zeroed when `first`, else kept. */
cudaError_t tcu_embed(cudaStream_t s, const void *table, tide_dtype dt, int64_t V, int64_t D, int64_t vocab0,
                      bool first, const int32_t *tokens, int64_t R, float *out);

/* RMSNORM. x (R, D), w (D) of wdt, out (R, D) (may equal x):
 * out = w * (x * (1/sqrtf((float)(sum x^2 / D) + eps))), sum in double. */
cudaError_t tcu_rmsnorm(cudaStream_t s, const float *x, const void *w, tide_dtype wdt, int64_t R, int64_t D,
                        float eps, float *out);

/* MATMUL without BLAS, for weights of any dtype: out (R, N) = x (R, K) .
 * w (N, K)^T; a warp per weight row converts it once per group of up to
 * TCU_MATMUL_FUSED_R rows of x and dots it with them (f32 accumulation).
 * The path for small batches (decoding) and for scratch too small for one
 * converted weight row. out (rows ldo floats apart) must not overlap x or w.
 * N < 2^31 * 8. */
#define TCU_MATMUL_FUSED_R 16
cudaError_t tcu_matmul_fused(cudaStream_t s, const float *x, const void *w, tide_dtype wdt, int64_t R,
                             int64_t K, int64_t N, float *out, int64_t ldo);

/* ROPE (HF rotate_half). x (R, H*hd), pos (T) i32, out (R, H*hd) (may equal
 * x unless interleaved); row r has position pos[r % T]; hd even.
 * interleaved: x's pair i at (2i, 2i+1) of each head (llama.cpp's GGUF q/k
 * rows), out in HF's order. */
cudaError_t tcu_rope(cudaStream_t s, const float *x, const int32_t *pos, int64_t R, int64_t T, int H, int hd,
                     float theta, bool interleaved, float *out);

/* ROPE_BWD: as tcu_rope, the rotation by minus the angle (the sine
 * negated exactly: the transpose of ROPE's rotation, as the CPU's). */
cudaError_t tcu_rope_inverse(cudaStream_t s, const float *x, const int32_t *pos, int64_t R, int64_t T, int H, int hd,
                             float theta, float *out);

/* ATTENTION, part 1. k, v (B*T, KV*hd), pos (T) range-checked, kcache,
 * vcache (B, C, KV*hd): cache[b][pos[t]] = row (b, t); where positions
 * repeat, the last t wins (as the CPU's ordered copy). A position outside
 * [0, C) writes nothing. */
cudaError_t tcu_cache_write(cudaStream_t s, const float *k, const float *v, const int32_t *pos, int64_t B,
                            int64_t T, int64_t C, int64_t kd, float *kcache, float *vcache);
/* The same into caches of type cache_dtype (TIDE_F32, F16, BF16, or Q8_0
 * with kd % 32 == 0; else cudaErrorInvalidValue): each row rounded as
 * tide_quantize_row rounds it, bit for bit. */
cudaError_t tcu_cache_write_dt(cudaStream_t s, const float *k, const float *v, const int32_t *pos, int64_t B,
                               int64_t T, int64_t C, int64_t kd, int cache_dtype, void *kcache, void *vcache);

/* ATTENTION, part 2. q (B*T, H*hd), pos (T), kcache, vcache (B, C, KV*hd),
 * o (B*T, H*hd): for each (b, t, h), softmax over cache positions
 * j <= pos[t] of (q . k_j) * (1/sqrtf(hd)), o = sum p_j v_j (kv head
 * h / (H/KV)), an online softmax over key tiles in ascending order, f32.
 * Two kernels:
 *   - T >= TCU_ATTN_TILED_MIN_T and hd <= TCU_ATTN_TILED_MAX_HD (prefill):
 *     a block per (b, h, 64 consecutive queries) sharing tiles of 64 keys
 *     and values staged in shared memory (96 KiB dynamic at hd > 64, opted
 *     in on each call); keys up to the tile's largest position;
 *   - otherwise (decoding, hd > 128), on a GPU that refuses the first one's
 *     shared memory, or with rows_only (the backend's TIDE_CUDA_ATTENTION=rows,
 *     for comparing the two): a block per (b, t, h) reading its keys from
 *     global memory, 128 at a time.
 * A row's result depends on which kernel runs (summation orders differ), not
 * on B or on the other rows. hd <= TCU_ATTN_MAX_HD. B*T*H < 2^31. Positions
 * outside [0, C) (not range-checked yet) read no key beyond the cache. */
#define TCU_ATTN_MAX_HD 512
#define TCU_ATTN_TILED_MIN_T 16
#define TCU_ATTN_TILED_MAX_HD 128
cudaError_t tcu_attention(cudaStream_t s, const float *q, const int32_t *pos, const float *kcache,
                          const float *vcache, float *o, int64_t B, int64_t T, int64_t C, int H, int KV,
                          int hd, bool rows_only);
/* The same over caches of type cache_dtype (as tcu_cache_write_dt; q8_0
 * needs hd % 32 == 0): every key and value converted to f32 as it is read
 * (f16 / bf16 exactly, q8_0 as q * d), then the f32 arithmetic above. */
cudaError_t tcu_attention_dt(cudaStream_t s, const float *q, const int32_t *pos, int cache_dtype, const void *kcache,
                             const void *vcache, float *o, int64_t B, int64_t T, int64_t C, int H, int KV, int hd,
                             bool rows_only);

/* SILU_MUL. gate, up, out (n): out = gate / (1 + expf(-gate)) * up. */
cudaError_t tcu_silu_mul(cudaStream_t s, const float *gate, const float *up, float *out, int64_t n);

/* ADD. a, b, out (n): out = a + b. */
cudaError_t tcu_add(cudaStream_t s, const float *a, const float *b, float *out, int64_t n);
/* ADD_BIAS: out (R, N) = x + b per row, b (N) f32, f16 or bf16. */
cudaError_t tcu_add_bias(cudaStream_t s, const float *x, const void *b, tide_dtype bdt, int64_t R, int64_t N,
                         float *out);

/* ARGMAX. x (R, V), out (R) i32: first index of the row's maximum; the
 * first NaN when the row holds one. R < 2^31. */
cudaError_t tcu_argmax(cudaStream_t s, const float *x, int64_t R, int64_t V, int32_t *out);

/* GENERIC output k (nbytes n) from n_in inputs (bytes in_bytes[i] > 0):
 * out[j] = (uint8_t)(sum_i (i+1) * in_i[j % in_bytes[i]] + 31*j + 17*k).
 * An output that is also an input is read at j before j is written. */
cudaError_t tcu_generic(cudaStream_t s, int n_in, const uint8_t *const *in, const uint64_t *in_bytes, int k,
                        uint8_t *out, uint64_t n);

#ifdef __cplusplus
}
#endif
#endif
