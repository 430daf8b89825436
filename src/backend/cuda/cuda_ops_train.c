/*
 * cuda_ops_train.c - the CUDA backend's training ops (their entries in
 * cuda_ops.c's table) and ATTENTION without a cache: shapes read from the
 * graph, ids checked, the workspace laid out as graph/ops.c sizes it, and
 * the kernels of cuda_train.cu and cuBLAS calls enqueued on the call's queue.
 *
 * cuBLAS products, row-major operands read as column-major ones (a
 * row-major (r, c) matrix is a column-major (c, r) one of leading dimension
 * c), each sum over all of its k in cuBLAS's order for the shape (the
 * handle's fixed workspace, no atomics: cuda_backend.c):
 *   - MATMUL_GRADW dw (N, K) (+)= dy (R, N)^T . x (R, K):
 *     dw^T (K, N) = x^T (K, R) . dy (R, N): cublasSgemm(N, T, m=K, n=N, k=R,
 *     x, K, dy, N, beta, dw, K);
 *   - CROSS_ENTROPY, for each chunk of cr rows (tide_ce_chunk_rows) and
 *     each block of cnt vocabulary rows from v0 (the whole vocabulary for
 *     f32 weights; for 16-bit ones as many rows as the scratch holds
 *     widened, once per chunk when they all fit, else twice, as the CPU):
 *       logits L (cr, V), columns v0.. = h (cr, D) . W^T:
 *         cublasSgemm(T, N, m=cnt, n=cr, k=D, W, D, h, D, 0, L + v0, V);
 *       after tcu_ce_rows turned L into G = scale (softmax - onehot),
 *       dh (cr, D) (+)= G[:, block] . W:
 *         cublasSgemm(N, N, m=D, n=cr, k=cnt, W, D, L + v0, V, v0 ? 1 : 0, dh, D);
 *       dw[block] (cnt, D) (+)= G[:, block]^T . h:
 *         cublasSgemm(N, T, m=D, n=cnt, k=cr, h, D, L + v0, V, beta, dw + v0 D, D),
 *         beta 1 past the first chunk or when accumulating.
 *     The loss terms of all rows wait in the workspace's first R doubles
 *     and are summed once at the end (tcu_ce_loss). CROSS_ENTROPY runs in f32
 *     whatever the matmul mode: the gradient G is never rounded to 16 bits.
 *
 * Ids: EMBED_BWD's tokens, CROSS_ENTROPY's targets and the positions of
 * fresh sequences are checked as cuda_backend.c's note says: on a
 * synchronous queue before anything is written (the op fails naming the
 * first bad one, as the CPU), on an asynchronous one through the queue's
 * record, the kernels staying inside their buffers meanwhile (a bad token
 * or target is skipped; positions are not read by ATTENTION_BWD).
 */
#include "backend/cuda/cuda_int.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_train.h"

#include <limits.h>
#include <stdio.h>

static const tide_tensor *tin(const tide_graph *g, const tide_op *op, int i) { return &g->tensors[op->in[i]]; }
static const tide_tensor *tout(const tide_graph *g, const tide_op *op, int i) { return &g->tensors[op->out[i]]; }

/* Checks ids (n): lo <= id < hi, and id == its index when iota. A
 * synchronous queue runs the check and waits for it: *bad is the first bad
 * index (-1: none) and *value its id. An asynchronous one queues a deferred
 * record of `kind` (indices from base) and *bad is -1. */
static tide_status check_ids(cu_queue *q, const int32_t *ids, int64_t n, int64_t lo, int64_t hi, bool iota,
                             int32_t kind, int64_t base, int64_t *bad, int32_t *value, const char *what) {
    *bad = -1;
    if (n >= TCU_FLAG_OK)
        return tide_err(q->ctx, TIDE_E_UNSUPPORTED, "cuda %s: %lld ids are more than the range check takes", what,
                        (long long)n);
    if (q->async) {
        CU_TRY(q->ctx, tcu_ids_record(q->stream, ids, n, lo, hi, iota, kind, base, q->rec),
               "%s range record kernel", what);
        q->rec_armed = q->rec_armed || n > 0;
        return TIDE_OK;
    }
    CU_TRY(q->ctx, tcu_ids_check(q->stream, ids, n, lo, hi, iota, q->flag), "%s range check kernel", what);
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

static tide_status blas_fail(cu_queue *q, cublasStatus_t bs, const char *fmt, const char *name) {
    char what[300];
    snprintf(what, sizeof what, fmt, name);
    return tide_cuda_blas_fail(q->ctx, bs, what);
}

static bool fits_int(int64_t a, int64_t b, int64_t c) { return a <= INT_MAX && b <= INT_MAX && c <= INT_MAX; }

static tide_status no_workspace(cu_queue *q, const tide_op *op) {
    return tide_err(q->ctx, TIDE_E_INVALID, "cuda %s: needs its workspace of %llu bytes", tide_op_name(op->kind),
                    (unsigned long long)op->scratch_bytes);
}

/* ---------------------------------------------------------------- attention */

/* The heads and sizes of an attention op, checked against the kernels'
 * limits. */
static tide_status attn_dims(cu_queue *q, const tide_op *op, int64_t R, const char *nm) {
    const tide_op_params *p = &op->p;
    if (p->head_dim > TCU_ATTN_MAX_HD)
        return tide_err(q->ctx, TIDE_E_UNSUPPORTED, "%s: head_dim %d is above the cuda backend's limit %d", nm,
                        p->head_dim, TCU_ATTN_MAX_HD);
    if (p->n_kv_heads <= 0 || p->n_heads % p->n_kv_heads || R * p->n_heads > INT_MAX)
        return tide_err(q->ctx, TIDE_E_UNSUPPORTED, "%s: %lld rows x %d heads (%d kv heads) is beyond the cuda "
                        "kernels' grid", nm, (long long)R, p->n_heads, p->n_kv_heads);
    return TIDE_OK;
}

/* Positions (T) of fresh sequences must be 0..T-1. */
static tide_status check_fresh(cu_queue *q, const tide_graph *g, const tide_op *op, const int32_t *pos, int64_t T,
                               const char *lead) {
    int64_t bad = -1;
    int32_t val = 0;
    tide_status st = check_ids(q, pos, T, 0, T, true, REC_POSITIONS, 0, &bad, &val, tide_op_name(op->kind));
    if (st) return st;
    if (bad >= 0)
        return tide_err(q->ctx, TIDE_E_RANGE, "%s positions 0..%lld, but '%s'[%lld] is %d", lead, (long long)T - 1,
                        tin(g, op, op->kind == TIDE_OP_ATTENTION ? 3 : 5)->name, (long long)bad, val);
    return TIDE_OK;
}

/* ATTENTION without a cache: the cached form's kernels with k and v in
 * place of the caches (C = T), as the CPU's. */
tide_status tide_cuda_attention_nocache(tide_backend *be, cu_queue *q, const tide_graph *g, const tide_op *op,
                                        void *const *in, void *const *out, void *scratch) {
    const tide_op_params *p = &op->p;
    int64_t R = tin(g, op, 0)->shape[0], B = p->batch, T = R / B;
    tide_status st = attn_dims(q, op, R, "attention");
    if (!st) st = check_fresh(q, g, op, in[3], T, "attention without a cache needs");
    if (st) return st;
    CU_TRY(q->ctx, tcu_attention(q->stream, in[0], in[3], in[1], in[2], out[0], B, T, T, p->n_heads, p->n_kv_heads,
                                 p->head_dim, impl_of(be)->attn_rows),
           "attention kernel");
    return TIDE_OK;
}

tide_status tide_cuda_attention_bwd(tide_backend *be, cu_queue *q, const tide_graph *g, const tide_op *op,
                                    void *const *in, void *const *out, void *scratch) {
    const tide_op_params *p = &op->p;
    int64_t R = tin(g, op, 0)->shape[0], B = p->batch, T = R / B;
    tide_status st = attn_dims(q, op, R, "attention_bwd");
    if (!st) st = check_fresh(q, g, op, in[5], T, "attention_bwd: fresh sequences need");
    if (st) return st;
    if (!scratch || op->scratch_bytes < (uint64_t)TCU_ATTN_BWD_STATS * (uint64_t)R * (uint64_t)p->n_heads * 4)
        return no_workspace(q, op);
    CU_TRY(q->ctx, tcu_attention_bwd(q->stream, in[0], in[1], in[2], in[3], in[4], out[0], out[1], out[2], B, T,
                                     p->n_heads, p->n_kv_heads, p->head_dim, scratch),
           "attention_bwd kernels");
    return TIDE_OK;
}

/* ---------------------------------------------------------------- rows, elements */

tide_status tide_cuda_embed_bwd(tide_backend *be, cu_queue *q, const tide_graph *g, const tide_op *op,
                                void *const *in, void *const *out, void *scratch) {
    const tide_tensor *dy = tin(g, op, 0), *tok = tin(g, op, 1), *dt = tout(g, op, 0);
    const int32_t *ids = (const int32_t *)in[1] + op->p.idx0;
    int64_t R = dy->shape[0], D = dy->shape[1], V = dt->shape[0], bad = -1;
    int32_t val = 0;
    tide_status st = check_ids(q, ids, R, 0, V, false, REC_EMBED_BWD, op->p.idx0, &bad, &val, "embed_bwd");
    if (st) return st;
    if (bad >= 0)
        return tide_err(q->ctx, TIDE_E_RANGE, "embed_bwd: token id %d at position %lld of '%s' is outside the "
                        "gradient '%s' (vocabulary %lld)", val, (long long)(op->p.idx0 + bad), tok->name, dt->name,
                        (long long)V);
    if (op->n_in == 2)
        CU_TRY(q->ctx, cudaMemsetAsync(out[0], 0, (size_t)dt->nbytes, q->stream), "cudaMemsetAsync of '%s'",
               dt->name);
    CU_TRY(q->ctx, tcu_embed_bwd(q->stream, in[0], ids, R, D, V, out[0]), "embed_bwd kernel");
    return TIDE_OK;
}

tide_status tide_cuda_rmsnorm_bwd(tide_backend *be, cu_queue *q, const tide_graph *g, const tide_op *op,
                                  void *const *in, void *const *out, void *scratch) {
    const tide_tensor *x = tin(g, op, 0);
    int64_t R = x->shape[0], D = x->shape[1];
    /* the row scales, 256-byte aligned, then at least one row of partial sums */
    uint64_t need = ((uint64_t)R * 4 + 255) / 256 * 256 + (uint64_t)D * 8;
    if (!scratch || op->scratch_bytes < need) return no_workspace(q, op);
    CU_TRY(q->ctx, tcu_rmsnorm_bwd(q->stream, in[0], in[1], tin(g, op, 1)->dtype, in[2], R, D, op->p.eps,
                                   op->n_in == 4, out[0], out[1], scratch, (size_t)op->scratch_bytes),
           "rmsnorm_bwd kernels");
    return TIDE_OK;
}

tide_status tide_cuda_rope_bwd(tide_backend *be, cu_queue *q, const tide_graph *g, const tide_op *op,
                               void *const *in, void *const *out, void *scratch) {
    const tide_op_params *p = &op->p;
    int64_t R = tin(g, op, 0)->shape[0];
    CU_TRY(q->ctx, tcu_rope_inverse(q->stream, in[0], (const int32_t *)in[1] + p->idx0, R,
                                    p->pos_rows ? R : R / p->batch, p->n_heads, p->head_dim, p->rope_theta, out[0]),
           "rope_bwd kernel");
    return TIDE_OK;
}

tide_status tide_cuda_silu_mul_bwd(tide_backend *be, cu_queue *q, const tide_graph *g, const tide_op *op,
                                   void *const *in, void *const *out, void *scratch) {
    CU_TRY(q->ctx, tcu_silu_mul_bwd(q->stream, in[0], in[1], in[2], out[0], out[1], tide_tensor_numel(tin(g, op, 0))),
           "silu_mul_bwd kernel");
    return TIDE_OK;
}

tide_status tide_cuda_sumsq(tide_backend *be, cu_queue *q, const tide_graph *g, const tide_op *op, void *const *in,
                            void *const *out, void *scratch) {
    if (!scratch || op->scratch_bytes < sizeof(double)) return no_workspace(q, op);
    CU_TRY(q->ctx, tcu_sumsq(q->stream, in[0], tide_tensor_numel(tin(g, op, 0)), op->n_in == 2 ? in[1] : NULL,
                             out[0], scratch, (size_t)op->scratch_bytes),
           "sumsq kernels");
    return TIDE_OK;
}

tide_status tide_cuda_adamw(tide_backend *be, cu_queue *q, const tide_graph *g, const tide_op *op, void *const *in,
                            void *const *out, void *scratch) {
    const tide_op_params *p = &op->p;
    const tide_tensor *param = tin(g, op, 0);
    bool master = op->n_in == 7;
    int mi = master ? 2 : 1; /* index of m: outputs param, [master,] m, v are inputs 0.. in place */
    /* as the CPU: decay only matrices (norms' weights are 1-D) */
    float wd = param->ndim >= 2 ? p->weight_decay : 0.0f;
    CU_TRY(q->ctx, tcu_adamw(q->stream, out[0], param->dtype, master ? out[1] : NULL, out[mi], out[mi + 1], in[mi + 2],
                             tide_tensor_numel(param), in[mi + 3], in[mi + 4], p->beta1, p->beta2, p->adam_eps, wd,
                             p->max_norm),
           "adamw kernel of '%s'", param->name);
    return TIDE_OK;
}

/* ---------------------------------------------------------------- products */

tide_status tide_cuda_matmul_gradw(tide_backend *be, cu_queue *q, const tide_graph *g, const tide_op *op,
                                   void *const *in, void *const *out, void *scratch) {
    const tide_tensor *dy = tin(g, op, 0), *x = tin(g, op, 1), *dw = tout(g, op, 0);
    int64_t R = dy->shape[0], N = dy->shape[1], K = x->shape[1];
    if (!fits_int(R, N, K))
        return tide_err(q->ctx, TIDE_E_UNSUPPORTED, "matmul_gradw '%s': dimensions beyond what cuBLAS takes",
                        dw->name);
    tide_status st = tide_cuda_queue_blas(be, q, q->ctx);
    if (st) return st;
    const float one = 1.0f, beta = op->n_in == 3 ? 1.0f : 0.0f;
    cublasStatus_t bs = cublasSgemm(q->blas, CUBLAS_OP_N, CUBLAS_OP_T, (int)K, (int)N, (int)R, &one, in[1], (int)K,
                                    in[0], (int)N, &beta, out[0], (int)K);
    return bs == CUBLAS_STATUS_SUCCESS ? TIDE_OK : blas_fail(q, bs, "cublasSgemm of matmul_gradw '%s'", dw->name);
}

tide_status tide_cuda_cross_entropy(tide_backend *be, cu_queue *q, const tide_graph *g, const tide_op *op,
                                    void *const *in, void *const *out, void *scratch) {
    const tide_tensor *ht = tin(g, op, 0), *wt = tin(g, op, 1), *tg = tin(g, op, 2);
    const int64_t R = ht->shape[0], D = ht->shape[1], V = wt->shape[0];
    const float scale = op->p.scale;
    if (!fits_int(R, V, D))
        return tide_err(q->ctx, TIDE_E_UNSUPPORTED, "cross_entropy '%s': dimensions beyond what cuBLAS takes",
                        wt->name);
    int64_t bad = -1;
    int32_t val = 0;
    const int32_t *targets = (const int32_t *)in[2] + op->p.idx0; /* a row tile's targets */
    tide_status st = check_ids(q, targets, R, INT64_MIN, V, false, REC_TARGET, op->p.idx0, &bad, &val,
                               "cross_entropy");
    if (st) return st;
    if (bad >= 0)
        return tide_err(q->ctx, TIDE_E_RANGE, "cross_entropy: target %d of row %lld of '%s' is outside the "
                        "vocabulary of '%s' (%lld ids)", val, (long long)(op->p.idx0 + bad), tg->name, wt->name,
                        (long long)V);
    /* the workspace (graph/ops.c): R loss terms (to 64 bytes), logits (CR,
     * V), [widened rows of w] */
    const int64_t CR = TIDE_MAX(1, TIDE_MIN(tide_ce_chunk_rows(R, V), R));
    const uint64_t lbytes = (uint64_t)(CR * V) * sizeof(float);
    const uint64_t tbytes = ((uint64_t)R * sizeof(double) + 63) / 64 * 64;
    if (!scratch || op->scratch_bytes < tbytes + lbytes) return no_workspace(q, op);
    double *terms = scratch;
    float *L = (float *)((uint8_t *)scratch + tbytes), *wf = (float *)((uint8_t *)scratch + tbytes + lbytes);
    int64_t vb = V; /* rows of w per block */
    if (wt->dtype != TIDE_F32) {
        vb = (int64_t)((op->scratch_bytes - tbytes - lbytes) / ((uint64_t)D * sizeof(float)));
        if (vb < 1) return no_workspace(q, op);
        vb = TIDE_MIN(vb, V);
        int64_t nblk = (V + vb - 1) / vb;
        vb = (V + nblk - 1) / nblk; /* equal blocks, as the CPU's */
    }
    const bool whole = vb == V, f32 = wt->dtype == TIDE_F32;
    const size_t es = tide_dtype_size(wt->dtype);
    const uint8_t *wb = in[1];
    const float *h = in[0];
    float *dh = out[1], *dw = out[2];
    if ((st = tide_cuda_queue_blas(be, q, q->ctx))) return st;
    if (!f32 && whole)
        CU_TRY(q->ctx, tcu_convert(q->stream, wb, wt->dtype, wf, V * D), "cross_entropy weight conversion kernel");
    const float one = 1.0f, zero = 0.0f;
    for (int64_t r0 = 0; r0 < R; r0 += CR) {
        const int cr = (int)TIDE_MIN(CR, R - r0);
        const float *hc = h + r0 * D;
        for (int64_t v0 = 0; v0 < V; v0 += vb) {
            const int cnt = (int)TIDE_MIN(vb, V - v0);
            if (!whole)
                CU_TRY(q->ctx, tcu_convert(q->stream, wb + (size_t)(v0 * D) * es, wt->dtype, wf, cnt * D),
                       "cross_entropy weight conversion kernel");
            const float *W = f32 ? (const float *)in[1] + v0 * D : whole ? wf + v0 * D : wf;
            cublasStatus_t bs = cublasSgemm(q->blas, CUBLAS_OP_T, CUBLAS_OP_N, cnt, cr, (int)D, &one, W, (int)D, hc,
                                            (int)D, &zero, L + v0, (int)V);
            if (bs != CUBLAS_STATUS_SUCCESS) return blas_fail(q, bs, "cublasSgemm of cross_entropy '%s' logits", wt->name);
        }
        CU_TRY(q->ctx, tcu_ce_rows(q->stream, L, cr, V, targets + r0, scale, terms + r0), "cross_entropy row kernel");
        const float beta_w = op->n_in >= 4 || r0 > 0 ? 1.0f : 0.0f;
        for (int64_t v0 = 0; v0 < V; v0 += vb) {
            const int cnt = (int)TIDE_MIN(vb, V - v0);
            if (!whole)
                CU_TRY(q->ctx, tcu_convert(q->stream, wb + (size_t)(v0 * D) * es, wt->dtype, wf, cnt * D),
                       "cross_entropy weight conversion kernel");
            const float *W = f32 ? (const float *)in[1] + v0 * D : whole ? wf + v0 * D : wf;
            const float beta_h = v0 ? 1.0f : 0.0f;
            cublasStatus_t bs = cublasSgemm(q->blas, CUBLAS_OP_N, CUBLAS_OP_N, (int)D, cr, cnt, &one, W, (int)D,
                                            L + v0, (int)V, &beta_h, dh + r0 * D, (int)D);
            if (bs == CUBLAS_STATUS_SUCCESS)
                bs = cublasSgemm(q->blas, CUBLAS_OP_N, CUBLAS_OP_T, (int)D, cnt, cr, &one, hc, (int)D, L + v0, (int)V,
                                 &beta_w, dw + v0 * D, (int)D);
            if (bs != CUBLAS_STATUS_SUCCESS)
                return blas_fail(q, bs, "cublasSgemm of cross_entropy '%s' gradients", wt->name);
        }
    }
    /* 5 inputs: the loss adds into the earlier tiles' (in[4] is out[0]) */
    CU_TRY(q->ctx, tcu_ce_loss(q->stream, terms, R, scale, op->n_in == 5, out[0]), "cross_entropy loss kernel");
    return TIDE_OK;
}
