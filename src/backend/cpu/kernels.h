/*
 * kernels.h - the CPU backend's kernels: pure functions on raw pointers, one
 * per op kind (tide.h documents the op contracts). They know nothing of graphs,
 * contexts or backends; cpu_backend.c reads shapes from the graph and calls
 * them. Activations are f32 row-major; weights may be f32, f16 or bf16.
 *
 * Every kernel:
 *   - is deterministic: the same input and thread count give the same output
 *     bits on every run. No reduction order in this file depends on how work
 *     is split between threads; MATMUL's sgemm tiles are cut by thread count,
 *     which in practice does not change bits but BLAS does not promise it;
 *   - allocates nothing: workspace is the caller's `scratch` or `work`, or a
 *     bounded tile on the calling thread's stack (attention: under 96 KiB
 *     per thread);
 *   - uses `nt` OpenMP threads (nt >= 1). MATMUL sets OpenBLAS to one thread
 *     and calls it from each OpenMP thread on its own tile, so the process
 *     has one thread pool and no pool spins on cores the other one needs;
 *     it restores OpenBLAS's (process-wide) thread setting before returning,
 *     so two MATMULs must not run at the same time from different threads;
 *   - is safe in place (out == x) unless its comment says otherwise.
 *
 * The training kernels (ATTENTION's gradient and those after tk_generic) are
 * stricter: their bits do not depend on the thread count either. Each product
 * is a packed GEMM whose sums run in an order fixed by K, every other reduction
 * (over rows, over the heads of a kv group, over the whole of a tensor) runs
 * in an order fixed by the code; threads only take whole tiles, rows or
 * column blocks. Gradients are f32; an `accumulate` kernel adds into its
 * gradient output, else writes it fresh.
 *
 * Code paths are chosen at run time from cpuid (cpu_features.h), so one
 * binary built for baseline x86-64 serves every machine: on CPUs with
 * AVX-512 F/BW/VL, MATMUL's forward forms (x . w^T) run matmul_avx512.c's
 * kernels for every row count, weights widened in registers (f32 mode) or,
 * with AVX512_BF16, multiplied as stored with activations rounded to bf16
 * (the fast mode, tk_matmul_fast); there each output's bits depend on its row
 * of x, its row of w and K alone, so row tiles of any size, weight blocks and
 * thread counts all give the same bits. On CPUs with AVX2 and FMA only, the
 * hot loops (conversion, small-batch matmul, attention tiles) run AVX2 code
 * and larger matmuls OpenBLAS; other CPUs run portable loops. Results are
 * bit-identical run to run on one machine; the code paths may differ from
 * each other in the last bits (FMA rounding, summation order).
 */
#ifndef TIDE_CPU_KERNELS_H
#define TIDE_CPU_KERNELS_H

#include "core/core.h"

/* Detects CPU features once (thread-safe, idempotent). Kernels call it
 * themselves; calling it early only moves the cost. */
void tk_init(void);
/* Tests (TIDE_TEST_HOOKS builds only): true makes every kernel take its
 * portable path even on AVX2 CPUs. */
void tk_force_generic(bool on);
/* True if the AVX2/FMA paths are in use. */
bool tk_have_avx2(void);
/* The kernel family OpenBLAS chose for this CPU ("Cooperlake", "Haswell"):
 * for the record only, no kernel calls OpenBLAS. */
const char *tk_blas_corename(void);
/* The code path of the training products' f32 GEMM (tk_sgemm), chosen from
 * tk_cpu: "avx512", "avx2" or "portable". */
const char *tk_sgemm_path(void);
/* The path of the bf16 training products (sgemm_bf16.c): "avx512_bf16 ...",
 * "avx512 ..." (pairs widened), "avx2 ..." or "portable ...". */
const char *tk_gemm_bf16_path(void);

/* dst[i] = (float)src[i] for n elements of dt (f32, f16, bf16), single
 * threaded. Bit-identical to tide_convert_to_f32 for every input, NaN
 * payloads included. */
void tk_convert(const void *src, tide_dtype dt, float *dst, size_t n);

/* EMBED. table (V, D) of dt (f32, f16, bf16, or a block type: rows
 * dequantized by tk_dequant_row, D whole blocks) holding ids [vocab0, vocab0 + V) of a vocabulary
 * of `vocab` ids (0: V), tokens (R), out (R, D) f32: out[r] = the table row of
 * tokens[r] where the table holds it; other rows are zeroed when `first`, else
 * left as they are (a later chunk of a split table). Checks every id first:
 * returns TIDE_OK, or TIDE_E_RANGE with *bad set to the first position whose
 * id is outside [0, vocab); nothing is written then. */
tide_status tk_embed(const void *table, tide_dtype dt, int64_t V, int64_t D, int64_t vocab0,
                     int64_t vocab, bool first, const int32_t *tokens, int64_t R, float *out,
                     int64_t *bad, int nt);

/* RMSNORM (Hugging Face LlamaRMSNorm). x (R, D), w (D) of wdt, out (R, D):
 * out = w * (x * 1/sqrtf(mean(x^2) + eps)); mean(x^2) accumulated in double. */
void tk_rmsnorm(const float *x, const void *w, tide_dtype wdt, int64_t R, int64_t D, float eps,
                float *out, int nt);

/* MATMUL. x (R, K), w (N, K) of wdt (a block type: tk_matmul_q, which needs
 * scratch), out (R, N) = x . w^T, out's rows ldo
 * floats apart (ldo >= N: a block of a wider output); out must not overlap x
 * or w. Register-tiled inner products on every path (AVX-512, AVX2,
 * portable), the weights widened exactly in registers: each output's bits
 * depend on its row of x, its row of w and K alone (and the CPU's path), not
 * on R, N, the thread count or the rows a planner tiled. scratch (may be
 * NULL/0) only holds rows of x copied with padded strides, the same values.
 * Returns TIDE_OK, or TIDE_E_UNSUPPORTED if a dimension exceeds INT_MAX. */
tide_status tk_matmul(const float *x, const void *w, tide_dtype wdt, int64_t R, int64_t K,
                      int64_t N, float *out, int64_t ldo, void *scratch, size_t scratch_bytes, int nt);

/* MATMUL in the fast mode: x rounded to bf16 once (to nearest even), times
 * bf16 weights as stored, f32 accumulation (AVX512_BF16; out (+)= x . w^T
 * as tk_matmul_ex without w_kn). Each output's bits depend on its row of x,
 * its row of w and K alone: not on R, N, the thread count, or the tile a
 * planner cut the rows into. Needs scratch of at least
 * tk_matmul_fast_min_scratch(K) bytes (the rounded rows, as many at a time
 * as it holds). Where tk_matmul_fast_native(wdt) is false (f16 or f32
 * weights, or a CPU without AVX512_BF16) it is tk_matmul_ex, exact f32.
 * Returns TIDE_OK, TIDE_E_INVALID (scratch too small) or
 * TIDE_E_UNSUPPORTED (a dimension above INT_MAX). */
tide_status tk_matmul_fast(const float *x, const void *w, tide_dtype wdt, int64_t R, int64_t K, int64_t N,
                           bool accumulate, float *out, int64_t ldo, void *scratch, size_t scratch_bytes, int nt);
size_t tk_matmul_fast_min_scratch(int64_t K);
bool tk_matmul_fast_native(tide_dtype wdt);

/* MATMUL's other forms. As tk_matmul, and: w_kn: w is (K, N) and out =
 * x . w (the input gradient of a forward matmul, dx = dy . w); accumulate:
 * out += the product. Without w_kn, tk_matmul's kernels (adding). With
 * w_kn, bits independent of nt: f32 weights go to sgemm tiles fixed by the
 * shape; 16-bit ones are widened into scratch a block of whole columns at a
 * time (each output is one sum over all of K); with fewer than
 * TK_MATMUL_FUSED_R rows, or no room in scratch for one column, a fused
 * kernel reads each weight once. A block-quantized w (rows of whole
 * blocks) takes the w_kn form only (a frozen quantized weight's input
 * gradient): dequantized as the reference does (tk_dequant_row), whole
 * blocks at a time, into the same sums. w_kn false and accumulate false is
 * tk_matmul itself. Returns TIDE_OK or TIDE_E_UNSUPPORTED (a dimension above
 * INT_MAX). */
#define TK_MATMUL_FUSED_R 16
tide_status tk_matmul_ex(const float *x, const void *w, tide_dtype wdt, int64_t R, int64_t K, int64_t N,
                         bool w_kn, bool accumulate, float *out, int64_t ldo, void *scratch,
                         size_t scratch_bytes, int nt);

/* MATMUL with a block-quantized weight (TIDE_Q8_0, Q4_0, Q4_K, Q5_K, Q6_K,
 * rows of w as stored: K a whole number of blocks): out (R, N; rows ldo
 * apart) = x . w^T. Each row of x is quantized once into 8-bit blocks of 32
 * (f32 scale amax / 127, round to nearest even) in scratch, as many rows at
 * a time as it holds (at least tk_matmul_q_min_scratch(K) bytes: one row);
 * every block product is an exact integer, scaled and summed in f32 in one
 * fixed order (matmul_quant.c), so each output's bits depend on its row of x,
 * its row of w and K alone: not on R, N, the column block, the thread count,
 * nor on the code path (AVX-512 VNNI, AVX2 or portable all give the same
 * bits). Returns TIDE_OK, TIDE_E_INVALID (not a block type, K not whole
 * blocks, scratch too small) or TIDE_E_UNSUPPORTED (a dimension above
 * INT_MAX). tk_matmul and tk_matmul_fast call it for block types. */
tide_status tk_matmul_q(const float *x, const void *w, tide_dtype wdt, int64_t R, int64_t K, int64_t N, float *out,
                        int64_t ldo, void *scratch, size_t scratch_bytes, int nt);
size_t tk_matmul_q_min_scratch(int64_t K);
/* The path tk_matmul_q takes on this CPU now: "avx512_vnni", "avx2" or
 * "portable". */
const char *tk_matmul_q_path(void);
/* dst (n) = a row of n elements of block type dt dequantized: the
 * reference's bits (tide_dequantize_row, src/core/quant.h: ggml's
 * arithmetic), EMBED's rows. False if dt is not a block type or n not whole
 * blocks. */
bool tk_dequant_row(const void *src, tide_dtype dt, float *dst, int64_t n);

/* ROPE, Hugging Face rotate_half convention. x (R, H*hd), pos (T), out
 * (R, H*hd); row r has position pos[r % T]. For i < hd/2:
 * inv = 1/powf(theta, (float)(2i)/hd), a = (float)pos * inv,
 * out[i] = x[i]*cos a - x[i+hd/2]*sin a, out[i+hd/2] = x[i+hd/2]*cos a + x[i]*sin a.
 * hd must be even. interleaved: x's pair i is at (2i, 2i+1) of each head
 * (llama.cpp's GGUF q/k rows); out as above. */
void tk_rope(const float *x, const int32_t *pos, int64_t R, int64_t T, int H, int hd,
             float theta, bool interleaved, float *out, int nt);

/* ATTENTION shapes: B batch, T tokens per batch row (R = B*T), C cache
 * positions, H query heads, KV key/value heads (H % KV == 0), hd head size. */
typedef struct tk_attn_dims {
    int64_t B, T, C;
    int H, KV, hd;
    tide_dtype cache_dtype; /* the caches' type: F32 (0), F16, BF16, Q8_0 (hd % 32 == 0) */
} tk_attn_dims;

/* Largest head_dim the attention tiles take. */
#define TK_ATTN_MAX_HD 512

/* ATTENTION. q (R, H*hd), k, v (R, KV*hd), pos (T), kcache, vcache
 * (B, C, KV*hd of d->cache_dtype), o (R, H*hd); o must not overlap the others.
 * First writes k/v row (b, t) into cache[b][pos[t]] (rounded to nearest even
 * for f16 / bf16, quantized per 32 as tide_quantize_row for q8_0), then, with
 * every key and value read back from the cache (converted to f32), for each query
 * (b, t) and head h (kv head h / (H/KV)): softmax over cache positions
 * j <= pos[t] of q.k_j / sqrtf(hd), o = sum p_j v_j (online softmax over key
 * tiles; masked positions are never read, so stale cache bytes cannot leak).
 * Returns TIDE_OK; TIDE_E_RANGE with *bad = t when pos[t] is outside [0, C)
 * (checked before anything is written); TIDE_E_UNSUPPORTED when hd >
 * TK_ATTN_MAX_HD. */
tide_status tk_attention(const float *q, const float *k, const float *v, const int32_t *pos,
                         void *kcache, void *vcache, float *o, const tk_attn_dims *d,
                         int64_t *bad, int nt);

/* ATTENTION without a cache (a training forward): pos must be 0..T-1 and
 * each query (b, t) attends over rows 0..t of k and v of its own sequence
 * (d->C is ignored). The same tiles and order as tk_attention, so o is its
 * fresh-cache o bit for bit. Returns TIDE_OK; TIDE_E_RANGE with *bad = t
 * when pos[t] != t; TIDE_E_UNSUPPORTED when hd > TK_ATTN_MAX_HD. */
tide_status tk_attention_nocache(const float *q, const float *k, const float *v, const int32_t *pos, float *o,
                                 const tk_attn_dims *d, int64_t *bad, int nt);

/* SILU_MUL. gate, up, out (n): out = gate / (1 + expf(-gate)) * up (the AVX2
 * path: gate * s * up, the sigmoid s formed from exp(-|gate|) as
 * tk_silu_mul_bwd does, within 2 ulp of expf). */
void tk_silu_mul(const float *gate, const float *up, float *out, int64_t n, int nt);

/* ADD. a, b, out (n): out = a + b. */
void tk_add(const float *a, const float *b, float *out, int64_t n, int nt);
/* ADD_BIAS: out (R, N) = x + b for each row, b (N) of bdt (f32, f16, bf16).
 * TIDE_E_NOMEM when a 16-bit bias's f32 copy cannot be had. */
tide_status tk_add_bias(const float *x, const void *b, tide_dtype bdt, int64_t R, int64_t N, float *out, int nt);

/* TAKE_LAST. x (B*T, D), out (B, D): out[b] = x[b*T + T-1]. out must not
 * overlap x. */
void tk_take_last(const float *x, int64_t B, int64_t T, int64_t D, float *out);

/* ARGMAX. x (R, V), out (R) i32: index of the largest value of each row; the
 * first one on ties; the first NaN if the row holds a NaN (as torch.argmax). */
void tk_argmax(const float *x, int64_t R, int64_t V, int32_t *out, int nt);

/* GENERIC (synthetic op for planner tests). Every tensor is bytes. For output
 * k of nbytes n: out_k[j] = (uint8_t)(sum_i (i+1) * in_i[j % in_bytes[i]]
 * + 31*j + 17*k), i over the n_in inputs. Outputs are written in order
 * k = 0, 1, ...; an output that is also an input is read at j before j is
 * written, so in-place use is deterministic. */
void tk_generic(int n_in, const uint8_t *const *in, const uint64_t *in_bytes, int n_out,
                uint8_t *const *out, const uint64_t *out_bytes, int nt);

/* ------------------------------------------------------------- training */

/* EMBED_BWD. dy (R, D), tokens (R), dtable (V, D): dtable[tokens[r]] +=
 * dy[r] for r = 0, 1, ... in order (threads split the D columns), after
 * zeroing dtable unless accumulate. Checks every id first: TIDE_E_RANGE
 * with *bad the first row whose id is outside [0, V); nothing written then. */
tide_status tk_embed_bwd(const float *dy, const int32_t *tokens, int64_t R, int64_t D, int64_t V,
                         bool accumulate, float *dtable, int64_t *bad, int nt);
/* The same for a block of the gradient: dtable (V, D) holds the rows of ids
 * [vocab0, vocab0 + V) of a vocabulary of `vocab`; a token elsewhere adds
 * nothing, one >= vocab is TIDE_E_RANGE. */
tide_status tk_embed_bwd_block(const float *dy, const int32_t *tokens, int64_t R, int64_t D, int64_t V,
                               int64_t vocab0, int64_t vocab, bool accumulate, float *dtable, int64_t *bad, int nt);

/* MATMUL in a bf16 training step (tide_op_args.bf16): out (R, N; row stride
 * ldo, of odt: f32, or bf16 rounded to nearest even from the f32 sum) (=,
 * +=) x . w^T for w (N, K), or with w_kn x . w for w (K, N); x of xdt (f32
 * or bf16), w of wdt (f32, f16 or bf16), both taken as bf16
 * (tk_gemm_bf16's sums: each output's bits fixed by its row of x, its
 * column of the product and K, not by R, the tile or the thread count).
 * accumulate adds the product to out (a bf16 out widened first, the sum
 * rounded once). A bf16 out is formed a block of rows at a time in f32:
 * in scratch when it holds one row (N floats), else in room allocated for
 * the call. TIDE_E_NOMEM, or TIDE_E_UNSUPPORTED for a dimension above
 * INT_MAX. */
tide_status tk_matmul_bf16(const void *x, tide_dtype xdt, const void *w, tide_dtype wdt, int64_t R, int64_t K,
                           int64_t N, bool w_kn, bool accumulate, void *out, tide_dtype odt, int64_t ldo,
                           void *scratch, size_t scratch_bytes, int nt);

/* RMSNORM_BWD: the gradients of tk_rmsnorm's y = w * (x * rs), rs =
 * 1/sqrtf(mean(x^2) + eps) computed as tk_rmsnorm does. x, dy, dx (R, D), w
 * (D) of wdt, dw (D). dx = rs * (dy w) - x * rs^3 / D * sum(dy w x), the sum in
 * double; dw[i] (+)= sum over rows in order of dy * (x * rs), in double then
 * rounded once (so the accumulating form is exactly dw + the fresh one).
 * work: R floats. dx must not overlap x or dy. */
void tk_rmsnorm_bwd(const float *x, const void *w, tide_dtype wdt, const float *dy, int64_t R, int64_t D,
                    float eps, bool accumulate, float *dx, float *dw, float *work, int nt);

/* MATMUL_GRADW. dy (R, N), x (R, K), dw (N, K) (+)= dy^T . x: sgemm tiles of
 * dw fixed by the shape, each summing over all R rows. TIDE_E_UNSUPPORTED
 * when a dimension is above INT_MAX. */
tide_status tk_matmul_gradw(const float *dy, const float *x, int64_t R, int64_t N, int64_t K, bool accumulate,
                            float *dw, int nt);
/* The same in a bf16 step: dy of dydt and x of xdt (f32 or bf16) taken as
 * bf16, tk_gemm_bf16's f32 sums. */
tide_status tk_matmul_gradw_bf16(const void *dy, tide_dtype dydt, const void *x, tide_dtype xdt, int64_t R,
                                 int64_t N, int64_t K, bool accumulate, float *dw, int nt);

/* ROPE_BWD: dx = the rotation of dy by minus tk_rope's angle (its exact
 * transpose); shapes and angle as tk_rope. */
void tk_rope_bwd(const float *dy, const int32_t *pos, int64_t R, int64_t T, int H, int hd, float theta,
                 float *dx, int nt);

/* ATTENTION_BWD for fresh sequences (positions 0..T-1 in every batch row):
 * q, o, dout, dq (R, H*hd); k, v, dk, dv (R, KV*hd); d->C ignored. The
 * softmax is recomputed from q and k; dq, dk, dv are written fresh. work:
 * tk_attention_bwd_work(d, nt) bytes, 64-byte aligned. Returns TIDE_OK or
 * TIDE_E_UNSUPPORTED (T or a row wider than INT_MAX). */
size_t tk_attention_bwd_work(const tk_attn_dims *d, int nt);
tide_status tk_attention_bwd(const float *q, const float *k, const float *v, const float *o, const float *dout,
                             float *dq, float *dk, float *dv, const tk_attn_dims *d, float *work, int nt);

/* SILU_MUL_BWD. gate, up, dy, dgate, dup (n): with s = 1/(1 + expf(-gate)),
 * dup = dy * gate / (1 + expf(-gate)), dgate = dy * up * s * (1 + gate *
 * (1 - s)) (the AVX2 path forms s from exp(-|gate|)). Safe in place. */
void tk_silu_mul_bwd(const float *gate, const float *up, const float *dy, float *dgate, float *dup, int64_t n,
                     int nt);

/* The precision of the fused cross-entropy's products: NULL (or bf16
 * false) f32, h f32; bf16 (a bf16 training step): h of hdt (f32 or bf16)
 * and w taken as bf16 in the logits and in both gradients' products (the
 * gradient g too), tk_gemm_bf16's f32 sums, and each logit rounded to
 * bf16 before the softmax, as autocast's bf16 lm_head output is; the
 * softmax, the loss and g stay f32. */
typedef struct tk_ce_prec {
    bool bf16;
    tide_dtype hdt;
} tk_ce_prec;

/* CROSS_ENTROPY. h (R, D), w (V, D) of wdt, targets (R), loss (1), dh (R, D),
 * dw (V, D). A chunk of chunk_rows rows at a time: logits (chunk, V) = h . w^T
 * in scratch, then per row (targets < 0 give 0 loss and a 0 gradient row)
 * p = softmax, loss term logsumexp - logit[target] in double, g = scale * (p -
 * onehot) in place of the logits; then dh[chunk] = g . w and dw += g^T .
 * h[chunk] (skipped with dw NULL: a frozen head). dw is zeroed first unless
 * accumulate; the loss, scale times the
 * terms summed in double in row order, is written fresh. 16-bit weights are
 * widened a block of rows at a time into the scratch past the logits (so
 * twice per chunk, once if the whole of w fits). scratch must hold
 * chunk_rows * V floats, plus D floats for 16-bit weights, and be 64-byte
 * aligned. Returns TIDE_OK; TIDE_E_RANGE with *bad the first row whose target
 * is >= V (nothing written); TIDE_E_INVALID when scratch is too small;
 * TIDE_E_UNSUPPORTED for a dimension above INT_MAX. */
tide_status tk_cross_entropy(const void *h, const void *w, tide_dtype wdt, const int32_t *targets, int64_t R,
                             int64_t V, int64_t D, float scale, bool accumulate, int64_t chunk_rows, float *loss,
                             float *dh, float *dw, void *scratch, size_t scratch_bytes, int64_t *bad,
                             const tk_ce_prec *prec, int nt);

/* CE_STATS (tide.h) for a head block w (Vb, D) of ids [vocab0, vocab0 + Vb)
 * of `vocab`: stats (R, 3) = each row's (max, sum of exp(logit - max), the
 * target's logit), this block's merged into stats_in's (NULL: the first
 * block): M = max of the two, S = S_in exp(M_in - M) + S_b exp(M_b - M) in
 * double rounded to f32, t = t_in + the block's (0 where the target is
 * elsewhere). With loss (the last block): *loss = scale * the sum in double,
 * row order, of M + log S - t over rows whose target is >= 0. Logits a chunk
 * of rows at a time in scratch, as tk_cross_entropy's (same layout and
 * needs). TIDE_E_RANGE with *bad for a target >= vocab. */
tide_status tk_ce_stats(const void *h, const void *w, tide_dtype wdt, const int32_t *targets, int64_t R,
                        int64_t Vb, int64_t D, int64_t vocab0, int64_t vocab, float scale, const float *stats_in,
                        float *stats, float *loss, int64_t chunk_rows, void *scratch, size_t scratch_bytes,
                        int64_t *bad, const tk_ce_prec *prec, int nt);
/* CE_BLOCK: g = scale * (exp(logit - M) / S - onehot) per row (zero where the
 * target < 0; the target's entry formed in double as tk_cross_entropy's);
 * dh (+)= g . w (adding with dh_add), dw (+)= g^T . h (adding with dw_add;
 * skipped with dw NULL). */
tide_status tk_ce_block(const void *h, const void *w, tide_dtype wdt, const int32_t *targets, int64_t R,
                        int64_t Vb, int64_t D, int64_t vocab0, int64_t vocab, float scale, const float *stats,
                        bool dh_add, bool dw_add, float *dh, float *dw, int64_t chunk_rows, void *scratch,
                        size_t scratch_bytes, int64_t *bad, const tk_ce_prec *prec, int nt);

/* SUMSQ: returns acc_in + sum of g[i]^2 over n, summed in double in blocks
 * of a fixed size whose partial sums are added in order, rounded to f32
 * once. */
float tk_sumsq(const float *g, int64_t n, float acc_in, int nt);

/* ADAMW: one step of torch.optim.AdamW (foreach=False) in f32, in torch's
 * order of operations:
 *   clip = max_norm > 0 ? min(1, max_norm / (sqrtf(sumsq) + 1e-6f)) : 1
 *   g = grad * clip
 *   p = p * (1 - lr * wd)
 *   m = lerp(m, g, 1 - beta1)        (torch's: fma(w, g - m, m) for w < 0.5,
 *                                      fma(w - 1, g - m, g) else)
 *   v = fma((1 - beta2) * g, g, v * beta2)    (torch's addcmul, vectorised)
 *   p = p + (-step * m) / (sqrtf(v) / bc2_sqrt + eps)
 * on master (f32) when given, else on param itself (then f32); with a master,
 * param = master rounded to pdt (to nearest even). Scalars such as 1 - lr*wd
 * are formed in double and rounded to f32, as torch casts its Python floats.
 * step = lr / (1 - beta1^t) comes formed in double and rounded once, as
 * torch's step_size. Element-wise: the bits do not depend on nt. Against
 * torch 2.x on x86 the bits are torch's where its sqrt is IEEE's. */
typedef struct tk_adamw_args {
    float lr, step, bc2_sqrt; /* hyper[0..2] */
    float beta1, beta2, eps, weight_decay, max_norm;
    float sumsq;              /* the gradients' global sum of squares */
    float grad_scale;         /* hyper[3]: the factor of the gradients (0 or 1:
                                 none); < 0: no update at all */
} tk_adamw_args;
void tk_adamw(void *param, tide_dtype pdt, float *master, float *m, float *v, const float *grad, int64_t n,
              const tk_adamw_args *a, int nt);

#endif
