/*
 * cuda_ops.c - the CUDA backend's compute slot: each op kind's kernels,
 * enqueued on the call's queue (cuda_backend.c's note says how MATMUL maps to
 * cuBLAS and how range errors are found, at once on a synchronous queue or
 * through the queue's record on an asynchronous one). The training ops'
 * entries are in cuda_ops_train.c; MATMUL's backward forms are here with
 * the forward:
 *   - no_transpose, w (K, N): out = x . w is column-major out^T = w^T . x^T
 *     with w read as a column-major (N, K) matrix of leading dimension N,
 *     untransposed: cublasSgemm(N, N, m=N, n=R, k=K, w, lda=N, x, K, out,
 *     ldo); a 16-bit w is widened a block of columns at a time into the
 *     scratch ((K, cnt), lda=cnt), or, in the fast mode, multiplied as is
 *     with cublasGemmEx(N, N, ...) on x rounded to its dtype;
 *   - accumulate: the same calls with beta = 1 (out += the product);
 *   - with fewer than TCU_MATMUL_FUSED_R rows or no room for a widened
 *     block: tcu_matmul_small, which reads each weight once per 16 rows.
 * A block-quantized weight (cuda_quant.h) runs the forward form, and the
 * input gradient's x . w (w (K, N), rows of whole blocks: a frozen
 * quantized weight in training), fresh or accumulating: chunks of w's rows
 * dequantized to f32 into the scratch, as many as it holds (equal chunks,
 * fixed by the scratch size), each multiplied with cublasSgemm(N, N) into
 * the output (beta 1 after the first chunk). The forward form:
 *   - fewer than TCU_MATMUL_FUSED_R rows in the whole output (decoding), or
 *     no room for one dequantized weight row: tcu_qgemv, in both modes;
 *   - else the f32 mode dequantizes tiles of weight rows to f32 into the
 *     scratch and multiplies each with cublasSgemm; the fast mode
 *     dequantizes them to bf16 into the scratch's first half, rounds chunks
 *     of x to bf16 into its second half and multiplies on tensor cores
 *     (cublasGemmEx, f32 compute), as for bf16 weights.
 */
#include "backend/cuda/cuda_gemm.h"
#include "backend/cuda/cuda_int.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_quant.h"
#include "backend/cuda/cuda_train.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

static tide_status queue_blas(tide_backend *be, cu_queue *q) { return tide_cuda_queue_blas(be, q, q->ctx); }

static tide_status queue_wait(cu_queue *q, const char *what) {
    CU_TRY(q->ctx, cudaStreamSynchronize(q->stream), "cudaStreamSynchronize after %s", what);
    return TIDE_OK;
}

static const tide_tensor *tin(const tide_graph *g, const tide_op *op, int i) { return &g->tensors[op->in[i]]; }
static const tide_tensor *tout(const tide_graph *g, const tide_op *op, int i) { return &g->tensors[op->out[i]]; }

/* Runs the range check of ids (n) against [0, hi) on the queue and waits for
 * it: *bad = -1 when all are in range, else the first bad index and *value
 * its id. */
static tide_status range_check(tide_backend *be, cu_queue *q, const int32_t *ids, int64_t n, int64_t hi,
                               int64_t *bad, int32_t *value, const char *what) {
    *bad = -1;
    if (n >= TCU_FLAG_OK)
        return tide_err(q->ctx, TIDE_E_UNSUPPORTED, "cuda %s: %lld ids are more than the range check takes", what,
                        (long long)n);
    CU_TRY(q->ctx, tcu_range_check(q->stream, ids, n, hi, q->flag), "%s range check kernel", what);
    CU_TRY(q->ctx, cudaMemcpyAsync(q->hbuf, q->flag, sizeof(int32_t), cudaMemcpyDeviceToHost, q->stream),
           "cudaMemcpyAsync of the %s range flag", what);
    CU_TRY(q->ctx, cudaStreamSynchronize(q->stream), "cudaStreamSynchronize after the %s range check", what);
    if (q->hbuf[0] == TCU_FLAG_OK) return TIDE_OK;
    *bad = q->hbuf[0];
    CU_TRY(q->ctx, cudaMemcpyAsync(q->hbuf + 1, ids + *bad, sizeof(int32_t), cudaMemcpyDeviceToHost, q->stream),
           "cudaMemcpyAsync of a bad %s id", what);
    CU_TRY(q->ctx, cudaStreamSynchronize(q->stream), "cudaStreamSynchronize after reading a bad %s id", what);
    *value = q->hbuf[1];
    return TIDE_OK;
}

/* cublasSgemm of row-major out (R, N) (leading dimension ldo) = x (R, K) .
 * w (N, K)^T, as column-major out^T = w^T^T . x^T (see the note at the top);
 * kn: w (K, N) rows ldw apart and out = x . w; beta 1: out += the product. */
static tide_status sgemm_rows(tide_backend *be, cu_queue *q, const float *x, const float *w, int R, int K, int N,
                              bool kn, int ldw, float beta, float *out, int ldo, const char *wname) {
    const float one = 1.0f;
    cublasStatus_t bs = cublasSgemm(q->blas, kn ? CUBLAS_OP_N : CUBLAS_OP_T, CUBLAS_OP_N, N, R, K, &one, w, ldw, x,
                                    K, &beta, out, ldo);
    if (bs != CUBLAS_STATUS_SUCCESS) {
        char what[300];
        snprintf(what, sizeof what, "cublasSgemm of matmul '%s' (%d x %d x %d)", wname, R, N, K);
        return tide_cuda_blas_fail(q->ctx, bs, what);
    }
    return TIDE_OK;
}

/* The fast mode (TIDE_MATMUL_FAST) for f16/bf16 weights: the rows of x are
 * rounded to the weights' dtype in the op's scratch, as many as fit, in
 * equal chunks, and each chunk is multiplied on tensor cores:
 * cublasGemmEx(T, N, m=N, n=cnt, k=K, w (16-bit), lda=K, x16, ldb=K,
 * out + r0*ldo (f32), ldc=ldo), f32 compute. The chunking depends on the
 * scratch size alone (a property of the graph, not of the budget), so an
 * offloaded run repeats the unconstrained run's arithmetic. */
static tide_status gemm_fast(tide_backend *be, cu_queue *q, const tide_op *op, const float *x, const void *w,
                             const tide_tensor *wt, int R, int K, int N, float *out, int ldo, void *scratch) {
    const bool kn = op->p.no_transpose; /* w (K, N), as the note at the top says */
    tide_status st = queue_blas(be, q);
    if (st) return st;
    const cudaDataType dt = wt->dtype == TIDE_BF16 ? CUDA_R_16BF : CUDA_R_16F;
    int64_t rows = (int64_t)(op->scratch_bytes / ((uint64_t)K * 2));
    rows = TIDE_MIN(rows, (int64_t)R);
    int64_t nchunk = (R + rows - 1) / rows;
    rows = (R + nchunk - 1) / nchunk;
    const float one = 1.0f, beta = op->p.accumulate ? 1.0f : 0.0f;
    for (int64_t r0 = 0; r0 < R; r0 += rows) {
        int64_t cnt = TIDE_MIN(rows, (int64_t)R - r0);
        CU_TRY(q->ctx, tcu_round_to_16(q->stream, x + r0 * K, wt->dtype, scratch, cnt * K),
               "matmul '%s' activation rounding kernel", wt->name);
        cublasStatus_t bs = cublasGemmEx(q->blas, kn ? CUBLAS_OP_N : CUBLAS_OP_T, CUBLAS_OP_N, N, (int)cnt, K, &one,
                                         w, dt, kn ? N : K, scratch, dt, K, &beta, out + r0 * ldo, CUDA_R_32F, ldo,
                                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        if (bs != CUBLAS_STATUS_SUCCESS) {
            char what[300];
            snprintf(what, sizeof what, "cublasGemmEx of matmul '%s' (%lld x %d x %d, %s)", wt->name,
                     (long long)cnt, N, K, tide_dtype_name(wt->dtype));
            return tide_cuda_blas_fail(q->ctx, bs, what);
        }
    }
    return TIDE_OK;
}

/* Equal tiles of at most `cap` of n (cap >= 1): the tile size. */
static int64_t equal_tiles(int64_t n, int64_t cap) {
    cap = TIDE_MIN(cap, n);
    int64_t nt = (n + cap - 1) / cap;
    return (n + nt - 1) / nt;
}

/* MATMUL with a block-quantized weight w (N, K) (the note at the top). Rw is
 * the whole output's rows, which pick the path, so that every row tile of
 * an op takes the path the untiled op takes. The tile sizes follow from the
 * scratch size alone (a property of the graph). */
static tide_status matmul_quant(tide_backend *be, cu_queue *q, const tide_op *op, const float *x, const void *w,
                                const tide_tensor *wt, int64_t R, int64_t K, int64_t N, int64_t Rw, float *o,
                                int64_t ldo, void *scratch) {
    const char *tn = tide_dtype_name(wt->dtype);
    const uint64_t sb = scratch && K > 0 ? op->scratch_bytes : 0;
    if (op->p.no_transpose) { /* x (R, K) . w (K, N): N is the quantized rows' length */
        const int64_t cap = N > 0 ? (int64_t)(sb / ((uint64_t)N * 4)) : 0;
        if (cap < 1 || N % tide_dtype_block(wt->dtype))
            return tide_err(q->ctx, TIDE_E_UNSUPPORTED, "matmul '%s': the x . w form with a %s weight needs rows of "
                            "whole blocks and a workspace of one dequantized row (%lld bytes)", wt->name, tn,
                            (long long)N * 4);
        tide_status st = queue_blas(be, q);
        if (st) return st;
        const int64_t kc = equal_tiles(K, cap);
        const float one = 1.0f;
        for (int64_t k0 = 0; k0 < K; k0 += kc) {
            const int64_t c = TIDE_MIN(kc, K - k0);
            CU_TRY(q->ctx, tcu_qdequant(q->stream, w, wt->dtype, N, k0, c, scratch, false),
                   "matmul '%s' (%s) dequantization kernel", wt->name, tn);
            const float beta = k0 == 0 && !op->p.accumulate ? 0.0f : 1.0f;
            cublasStatus_t bs = cublasSgemm(q->blas, CUBLAS_OP_N, CUBLAS_OP_N, (int)N, (int)R, (int)c, &one,
                                            (const float *)scratch, (int)N, x + k0, (int)K, &beta, o, (int)ldo);
            if (bs != CUBLAS_STATUS_SUCCESS) {
                char what[300];
                snprintf(what, sizeof what, "cublasSgemm of matmul '%s' (x . w, %lld x %lld x %lld, %s)", wt->name,
                         (long long)R, (long long)N, (long long)c, tn);
                return tide_cuda_blas_fail(q->ctx, bs, what);
            }
        }
        return TIDE_OK;
    }
    if (op->p.accumulate)
        return tide_err(q->ctx, TIDE_E_UNSUPPORTED, "matmul '%s': the accumulating x . w^T form with a %s weight is "
                        "not supported on cuda", wt->name, tn);
    const bool fast = be->matmul == TIDE_MATMUL_FAST;
    /* fast: bf16 weight rows in the first half, bf16 x rows in the second
     * (256-byte aligned); f32: f32 weight rows in all of it */
    const uint64_t half = sb / 2 / 256 * 256;
    const int64_t cap = K > 0 ? (int64_t)(fast ? half / ((uint64_t)K * 2) : sb / ((uint64_t)K * 4)) : 0;
    if (Rw < TCU_MATMUL_FUSED_R || cap < 1) {
        CU_TRY(q->ctx, tcu_qgemv(q->stream, x, w, wt->dtype, R, K, N, o, ldo), "matmul '%s' (%s) gemv kernel",
               wt->name, tn);
        return TIDE_OK;
    }
    tide_status st = queue_blas(be, q);
    if (st) return st;
    const int64_t nb = equal_tiles(N, cap), rows = fast ? equal_tiles(R, cap) : R;
    const float one = 1.0f, zero = 0.0f;
    uint8_t *x16 = (uint8_t *)scratch + half;
    for (int64_t r0 = 0; r0 < R; r0 += rows) {
        const int64_t rc = TIDE_MIN(rows, R - r0);
        if (fast)
            CU_TRY(q->ctx, tcu_round_to_16(q->stream, x + r0 * K, TIDE_BF16, x16, rc * K),
                   "matmul '%s' activation rounding kernel", wt->name);
        for (int64_t n0 = 0; n0 < N; n0 += nb) {
            const int64_t cnt = TIDE_MIN(nb, N - n0);
            CU_TRY(q->ctx, tcu_qdequant(q->stream, w, wt->dtype, K, n0, cnt, scratch, fast),
                   "matmul '%s' (%s) dequantization kernel", wt->name, tn);
            if (!fast) {
                st = sgemm_rows(be, q, x, scratch, (int)R, (int)K, (int)cnt, false, (int)K, 0.0f, o + n0, (int)ldo,
                                wt->name);
                if (st) return st;
                continue;
            }
            cublasStatus_t bs = cublasGemmEx(q->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)cnt, (int)rc, (int)K, &one,
                                             scratch, CUDA_R_16BF, (int)K, x16, CUDA_R_16BF, (int)K, &zero,
                                             o + r0 * ldo + n0, CUDA_R_32F, (int)ldo, CUBLAS_COMPUTE_32F,
                                             CUBLAS_GEMM_DEFAULT);
            if (bs != CUBLAS_STATUS_SUCCESS) {
                char what[300];
                snprintf(what, sizeof what, "cublasGemmEx of matmul '%s' (%lld x %lld x %lld, %s as bf16)", wt->name,
                         (long long)rc, (long long)cnt, (long long)K, tn);
                return tide_cuda_blas_fail(q->ctx, bs, what);
            }
        }
    }
    return TIDE_OK;
}

static tide_status op_matmul(tide_backend *be, cu_queue *q, const tide_graph *g, const tide_op *op,
                             void *const *in, void *const *out, void *scratch) {
    const tide_tensor *xt = tin(g, op, 0), *wt = tin(g, op, 1);
    const bool kn = op->p.no_transpose, acc = op->p.accumulate;
    const float beta = acc ? 1.0f : 0.0f;
    int64_t R = xt->shape[0], K = xt->shape[1], N = kn ? wt->shape[1] : wt->shape[0];
    if (R > INT_MAX || K > INT_MAX || N > INT_MAX)
        return tide_err(q->ctx, TIDE_E_UNSUPPORTED, "matmul '%s': dimensions beyond what cuBLAS takes", wt->name);
    const tide_tensor *ot = tout(g, op, 0);
    int64_t ldo = ot->shape[1];
    if (ldo > INT_MAX)
        return tide_err(q->ctx, TIDE_E_UNSUPPORTED, "matmul '%s': dimensions beyond what cuBLAS takes", wt->name);
    const float *x = in[0];
    float *o = (float *)out[0] + op->p.row0 * ldo + op->p.col0; /* a tile writes its block */
    /* the path is chosen by the whole output's rows, not the tile's, so that
     * a row tile of fewer than TCU_MATMUL_FUSED_R rows takes the kernel the
     * untiled product takes and repeats its bits */
    const int64_t Rw = TIDE_MAX(R, ot->shape[0]);
    if (tide_dtype_is_quantized(wt->dtype)) return matmul_quant(be, q, op, x, in[1], wt, R, K, N, Rw, o, ldo, scratch);
    if (wt->dtype == TIDE_F32) {
        tide_status st = queue_blas(be, q);
        return st ? st
                  : sgemm_rows(be, q, x, in[1], (int)R, (int)K, (int)N, kn, (int)(kn ? N : K), beta, o, (int)ldo,
                               wt->name);
    }
    if (be->matmul == TIDE_MATMUL_FAST && Rw >= TCU_MATMUL_FUSED_R && scratch && K > 0 &&
        op->scratch_bytes / ((uint64_t)K * 2) >= 1)
        return gemm_fast(be, q, op, x, in[1], wt, (int)R, (int)K, (int)N, o, (int)ldo, scratch);
    int64_t nb = scratch && K > 0 ? (int64_t)(op->scratch_bytes / ((uint64_t)K * sizeof(float))) : 0;
    if ((Rw < TCU_MATMUL_FUSED_R || nb < 1) && !kn && !acc) {
        CU_TRY(q->ctx, tcu_matmul_fused(q->stream, x, in[1], wt->dtype, R, K, N, o, ldo), "matmul '%s' kernel",
               wt->name);
        return TIDE_OK;
    }
    if (Rw < TCU_MATMUL_FUSED_R || nb < 1) {
        CU_TRY(q->ctx, tcu_matmul_small(q->stream, x, in[1], wt->dtype, R, K, N, kn, acc, o, ldo),
               "matmul '%s' kernel", wt->name);
        return TIDE_OK;
    }
    tide_status st = queue_blas(be, q);
    if (st) return st;
    nb = TIDE_MIN(nb, N);
    int64_t nblk = (N + nb - 1) / nb;
    nb = (N + nblk - 1) / nblk; /* equal blocks, as the CPU cuts them */
    size_t es = tide_dtype_size(wt->dtype);
    const uint8_t *wb = in[1];
    for (int64_t n0 = 0; n0 < N && !st; n0 += nb) {
        int64_t cnt = TIDE_MIN(nb, N - n0);
        if (kn) /* columns n0.. of w (K, N): a (K, cnt) block */
            CU_TRY(q->ctx, tcu_convert_cols(q->stream, wb, wt->dtype, K, N, n0, cnt, scratch),
                   "matmul '%s' weight conversion kernel", wt->name);
        else
            CU_TRY(q->ctx, tcu_convert(q->stream, wb + (size_t)n0 * (size_t)K * es, wt->dtype, scratch, cnt * K),
                   "matmul '%s' weight conversion kernel", wt->name);
        st = sgemm_rows(be, q, x, scratch, (int)R, (int)K, (int)cnt, kn, (int)(kn ? cnt : K), beta, o + n0, (int)ldo,
                        wt->name);
    }
    return st;
}

static tide_status op_attention(tide_backend *be, cu_queue *q, const tide_graph *g, const tide_op *op,
                                void *const *in, void *const *out, void *scratch) {
    if (op->n_out == 1) return tide_cuda_attention_nocache(be, q, g, op, in, out, scratch);
    const tide_op_args *p = &op->p;
    /* the caches are outputs 1 and 2 (also inputs 4 and 5 unless fresh; a fresh
     * cache's positions 0..T-1 are the caller's guarantee, see tide.h) */
    const tide_tensor *pos = tin(g, op, 3), *kc = &g->tensors[op->out[1]];
    int64_t B = p->batch, T = tin(g, op, 0)->shape[0] / p->batch, C = kc->shape[1];
    const int32_t *pp = (const int32_t *)in[3] + p->idx0; /* a tile's positions */
    int H = p->n_heads, KV = p->n_kv_heads, hd = p->head_dim;
    if (hd > TCU_ATTN_MAX_HD)
        return tide_err(q->ctx, TIDE_E_UNSUPPORTED, "attention: head_dim %d is above the cuda backend's limit %d",
                        hd, TCU_ATTN_MAX_HD);
    if (KV <= 0 || H % KV || B * T * H > INT_MAX)
        return tide_err(q->ctx, TIDE_E_UNSUPPORTED, "attention: %lld x %lld x %d heads (%d kv heads) is beyond "
                        "the cuda kernel's grid", (long long)B, (long long)T, H, KV);
    int64_t bad = -1;
    int32_t val = 0;
    tide_status st = TIDE_OK;
    int64_t n_pos = p->pos_rows ? B * T : T;
    if (q->async) {
        CU_TRY(q->ctx, tcu_range_record(q->stream, pp, n_pos, C, REC_ATTENTION, p->idx0, q->rec),
               "attention range record kernel");
        q->rec_armed = true;
    } else if ((st = range_check(be, q, pp, n_pos, C, &bad, &val, "attention"))) {
        return st;
    }
    if (bad >= 0)
        return tide_err(q->ctx, TIDE_E_RANGE, "attention: position %d at index %lld of '%s' is outside the cache "
                        "'%s' (capacity %lld)", val, (long long)(p->idx0 + bad), pos->name, kc->name, (long long)C);
    const int64_t kd = (int64_t)KV * hd, qd = (int64_t)H * hd;
    /* a position per row: each sequence as a batch of one at its own
     * positions, so a row computes what it computes alone */
    for (int64_t b = 0, nb = p->pos_rows ? B : 1, bb = p->pos_rows ? 1 : B; b < nb; b++) {
        const float *qb = (const float *)in[0] + b * T * qd, *kb = (const float *)in[1] + b * T * kd,
                    *vb = (const float *)in[2] + b * T * kd;
        const int64_t cb = C * (int64_t)tide_dtype_bytes(kc->dtype, (uint64_t)kd); /* a batch row's bytes */
        char *kcb = (char *)out[1] + b * cb, *vcb = (char *)out[2] + b * cb;
        float *ob = (float *)out[0] + b * T * qd;
        CU_TRY(q->ctx, tcu_cache_write_dt(q->stream, kb, vb, pp + b * T, bb, T, C, kd, (int)kc->dtype, kcb, vcb),
               "attention cache write kernel");
        CU_TRY(q->ctx, tcu_attention_dt(q->stream, qb, pp + b * T, (int)kc->dtype, kcb, vcb, ob, bb, T, C, H, KV, hd,
                                        impl_of(be)->attn_rows),
               "attention kernel");
    }
    return TIDE_OK;
}

static tide_status op_embed(tide_backend *be, cu_queue *q, const tide_graph *g, const tide_op *op,
                            void *const *in, void *const *out, void *scratch) {
    tide_ctx *ctx = q->ctx;
    const tide_op_args *p = &op->p;
    cudaStream_t s = q->stream;
    const tide_tensor *tab = tin(g, op, 0), *tok = tin(g, op, 1);
    const int32_t *ids = (const int32_t *)in[1] + p->idx0; /* a tile's tokens */
    int64_t R = tout(g, op, 0)->shape[0], bad = -1, vocab = p->vocab ? p->vocab : tab->shape[0];
    int32_t val = 0;
    tide_status st = TIDE_OK;
    if (q->async) {
        CU_TRY(ctx, tcu_range_record(s, ids, R, vocab, REC_EMBED, p->idx0, q->rec), "embed range record kernel");
        q->rec_armed = true;
    } else if ((st = range_check(be, q, ids, R, vocab, &bad, &val, "embed"))) {
        return st;
    }
    if (bad >= 0)
        return tide_err(ctx, TIDE_E_RANGE, "embed: token id %d at position %lld of '%s' is outside the "
                        "vocabulary (size %lld)", val, (long long)(p->idx0 + bad), tok->name, (long long)vocab);
    if (tide_dtype_is_quantized(tab->dtype)) {
        CU_TRY(ctx, tcu_qembed(s, in[0], tab->dtype, tab->shape[0], tab->shape[1], p->vocab0, op->n_in == 2, ids, R,
                               out[0]),
               "embed kernel (%s table '%s')", tide_dtype_name(tab->dtype), tab->name);
        return TIDE_OK;
    }
    CU_TRY(ctx, tcu_embed(s, in[0], tab->dtype, tab->shape[0], tab->shape[1], p->vocab0, op->n_in == 2, ids, R,
                          out[0]),
           "embed kernel");
    return TIDE_OK;
}

static tide_status op_rmsnorm(tide_backend *be, cu_queue *q, const tide_graph *g, const tide_op *op,
                              void *const *in, void *const *out, void *scratch) {
    tide_ctx *ctx = q->ctx;
    const tide_op_args *p = &op->p;
    cudaStream_t s = q->stream;
    const tide_tensor *x = tin(g, op, 0);
    CU_TRY(ctx, tcu_rmsnorm(s, in[0], in[1], tin(g, op, 1)->dtype, x->shape[0], x->shape[1], p->eps, out[0]),
           "rmsnorm kernel");
    return TIDE_OK;
}

static tide_status op_rope(tide_backend *be, cu_queue *q, const tide_graph *g, const tide_op *op,
                           void *const *in, void *const *out, void *scratch) {
    tide_ctx *ctx = q->ctx;
    const tide_op_args *p = &op->p;
    cudaStream_t s = q->stream;
    const tide_tensor *x = tin(g, op, 0);
    /* a position per row: row r reads pos[r % R] */
    CU_TRY(ctx, tcu_rope(s, in[0], (const int32_t *)in[1] + p->idx0, x->shape[0],
                         p->pos_rows ? x->shape[0] : x->shape[0] / p->batch, p->n_heads, p->head_dim, p->rope_theta,
                         p->rope_interleaved, out[0]),
           "rope kernel");
    return TIDE_OK;
}

static tide_status op_silu_mul(tide_backend *be, cu_queue *q, const tide_graph *g, const tide_op *op,
                               void *const *in, void *const *out, void *scratch) {
    tide_ctx *ctx = q->ctx;
    cudaStream_t s = q->stream;
    CU_TRY(ctx, tcu_silu_mul(s, in[0], in[1], out[0], tide_tensor_numel(tin(g, op, 0))), "silu_mul kernel");
    return TIDE_OK;
}

static tide_status op_add(tide_backend *be, cu_queue *q, const tide_graph *g, const tide_op *op,
                          void *const *in, void *const *out, void *scratch) {
    tide_ctx *ctx = q->ctx;
    cudaStream_t s = q->stream;
    CU_TRY(ctx, tcu_add(s, in[0], in[1], out[0], tide_tensor_numel(tin(g, op, 0))), "add kernel");
    return TIDE_OK;
}

static tide_status op_add_bias(tide_backend *be, cu_queue *q, const tide_graph *g, const tide_op *op,
                               void *const *in, void *const *out, void *scratch) {
    tide_ctx *ctx = q->ctx;
    const tide_tensor *x = tin(g, op, 0);
    CU_TRY(ctx, tcu_add_bias(q->stream, in[0], in[1], tin(g, op, 1)->dtype, x->shape[0], x->shape[1], out[0]),
           "add_bias kernel");
    return TIDE_OK;
}

static tide_status op_take_last(tide_backend *be, cu_queue *q, const tide_graph *g, const tide_op *op,
                                void *const *in, void *const *out, void *scratch) {
    tide_ctx *ctx = q->ctx;
    const tide_op_args *p = &op->p;
    cudaStream_t s = q->stream;
    const tide_tensor *x = tin(g, op, 0);
    int64_t B = p->batch, T = x->shape[0] / p->batch, D = x->shape[1];
    size_t row = (size_t)D * sizeof(float);
    float *dst = (float *)out[0] + p->row0 * D;
    const float *src = (const float *)in[0] + (T - 1) * D;
    if (B <= 0 || row == 0) return TIDE_OK;
    if ((size_t)T * row <= impl_of(be)->mem_pitch) {
        CU_TRY(ctx, cudaMemcpy2DAsync(dst, row, src, (size_t)T * row, row, (size_t)B, cudaMemcpyDeviceToDevice, s),
               "cudaMemcpy2DAsync of take_last");
        return TIDE_OK;
    }
    /* sequences longer than the largest pitch: a copy per sequence */
    for (int64_t b = 0; b < B; b++)
        CU_TRY(ctx, cudaMemcpyAsync(dst + b * D, src + b * T * D, row, cudaMemcpyDeviceToDevice, s),
               "cudaMemcpyAsync of take_last (sequence %lld)", (long long)b);
    return TIDE_OK;
}

static tide_status op_argmax(tide_backend *be, cu_queue *q, const tide_graph *g, const tide_op *op,
                             void *const *in, void *const *out, void *scratch) {
    tide_ctx *ctx = q->ctx;
    cudaStream_t s = q->stream;
    const tide_tensor *x = tin(g, op, 0);
    if (x->shape[0] > INT_MAX)
        return tide_err(ctx, TIDE_E_UNSUPPORTED, "argmax: %lld rows are beyond the cuda kernel's grid",
                        (long long)x->shape[0]);
    CU_TRY(ctx, tcu_argmax(s, in[0], x->shape[0], x->shape[1], out[0]), "argmax kernel");
    return TIDE_OK;
}

static tide_status op_generic(tide_backend *be, cu_queue *q, const tide_graph *g, const tide_op *op,
                              void *const *in, void *const *out, void *scratch) {
    tide_ctx *ctx = q->ctx;
    cudaStream_t s = q->stream;
    const uint8_t *ip[TIDE_OP_MAX_IN];
    uint64_t ib[TIDE_OP_MAX_IN];
    for (int i = 0; i < op->n_in; i++) {
        ip[i] = in[i];
        ib[i] = tin(g, op, i)->nbytes;
        if (!ib[i]) return tide_err(ctx, TIDE_E_INVALID, "generic: input %d has no bytes", i);
    }
    for (int k = 0; k < op->n_out; k++)
        CU_TRY(ctx, tcu_generic(s, op->n_in, ip, ib, k, out[k], tout(g, op, k)->nbytes),
               "generic kernel (output %d)", k);
    return TIDE_OK;
}

/* The kernel of each op kind (graph/ops.c has the kinds' contracts): each
 * enqueues its work on the queue; the caller synchronizes. A kind without one
 * here is unsupported on CUDA. */
static const tide_cuda_op cu_kernels[TIDE_OP_COUNT] = {
    [TIDE_OP_EMBED] = op_embed,
    [TIDE_OP_RMSNORM] = op_rmsnorm,
    [TIDE_OP_MATMUL] = op_matmul,
    [TIDE_OP_ROPE] = op_rope,
    [TIDE_OP_ATTENTION] = op_attention,
    [TIDE_OP_SILU_MUL] = op_silu_mul,
    [TIDE_OP_ADD] = op_add,
    [TIDE_OP_ADD_BIAS] = op_add_bias,
    [TIDE_OP_TAKE_LAST] = op_take_last,
    [TIDE_OP_ARGMAX] = op_argmax,
    [TIDE_OP_GENERIC] = op_generic,
    [TIDE_OP_EMBED_BWD] = tide_cuda_embed_bwd,
    [TIDE_OP_RMSNORM_BWD] = tide_cuda_rmsnorm_bwd,
    [TIDE_OP_MATMUL_GRADW] = tide_cuda_matmul_gradw,
    [TIDE_OP_ROPE_BWD] = tide_cuda_rope_bwd,
    [TIDE_OP_ATTENTION_BWD] = tide_cuda_attention_bwd,
    [TIDE_OP_SILU_MUL_BWD] = tide_cuda_silu_mul_bwd,
    [TIDE_OP_CROSS_ENTROPY] = tide_cuda_cross_entropy,
    [TIDE_OP_CE_STATS] = tide_cuda_ce_stats,
    [TIDE_OP_CE_BLOCK] = tide_cuda_ce_block,
    [TIDE_OP_SUMSQ] = tide_cuda_sumsq,
    [TIDE_OP_ADAMW] = tide_cuda_adamw,
};

tide_status tide_cuda_compute(tide_backend *be, void *vq, const tide_graph *g, const tide_op *op, void *const *in,
                              void *const *out, void *scratch) {
    cu_queue *q = queue_of(be, vq);
    const char *nm = tide_op_name(op->kind);
    for (int i = 0; i < op->n_in; i++)
        if (!in[i]) return tide_err(q->ctx, TIDE_E_INVALID, "cuda %s: input %d has no data", nm, i);
    for (int i = 0; i < op->n_out; i++)
        if (!out[i]) return tide_err(q->ctx, TIDE_E_INVALID, "cuda %s: output %d has no data", nm, i);
    tide_cuda_op k = (unsigned)op->kind < TIDE_OP_COUNT ? cu_kernels[op->kind] : NULL;
    if (!k) return tide_err(q->ctx, TIDE_E_UNSUPPORTED, "cuda backend: op kind %d is not supported", (int)op->kind);
    /* block-quantized tensors: MATMUL's weight, EMBED's table and
     * ATTENTION's KV caches (inputs 4, 5; outputs 1, 2) only (the training
     * ops, and the norms, take none) */
    for (int i = 0; i < op->n_in + op->n_out; i++) {
        const tide_tensor *t = i < op->n_in ? tin(g, op, i) : tout(g, op, i - op->n_in);
        bool weight_slot = (i == (op->kind == TIDE_OP_MATMUL ? 1 : 0) &&
                            (op->kind == TIDE_OP_MATMUL || op->kind == TIDE_OP_EMBED)) ||
                           (op->kind == TIDE_OP_ATTENTION && ((i >= 4 && i < op->n_in) || i > op->n_in));
        if (tide_dtype_is_quantized(t->dtype) && !weight_slot)
            return tide_err(q->ctx, TIDE_E_UNSUPPORTED, "cuda %s: '%s' is %s: quantized tensors are only read as "
                            "matmul weights and embedding tables", nm, t->name, tide_dtype_name(t->dtype));
    }
    /* a bf16 training step (tide_llama_train_opts.precision): not on the GPU yet */
    for (int i = 0; i < op->n_in + op->n_out; i++) {
        const tide_tensor *t = i < op->n_in ? tin(g, op, i) : tout(g, op, i - op->n_in);
        if (op->p.bf16 || (t->dtype == TIDE_BF16 && !tide_op_slot_native(op->kind, op->n_in, i)))
            return tide_err(q->ctx, TIDE_E_UNSUPPORTED, "cuda %s: '%s' belongs to a bf16 training step "
                            "(--precision bf16), which the cuda backend does not run yet: train with --precision "
                            "f32", nm, t->name);
    }
    pthread_mutex_lock(&q->mu);
    tide_status st = k(be, q, g, op, in, out, scratch);
    if (st == TIDE_OK) {
        if (!q->async) st = queue_wait(q, nm);
    } else {
        /* leave the queue idle: work enqueued before the failure must not run on */
        cudaStreamSynchronize(q->stream);
        (void)cudaGetLastError();
    }
    pthread_mutex_unlock(&q->mu);
    return st;
}
