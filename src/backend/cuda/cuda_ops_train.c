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
 *   - CROSS_ENTROPY, and CE_STATS and CE_BLOCK over their head block (V
 *     its rows), for each chunk of cr rows (tide_ce_chunk_rows) and each
 *     block of cnt rows of w from v0 (all of w for f32 weights; for 16-bit
 *     ones as many rows as the scratch holds widened: once per op when they
 *     all fit, else at each use, as the CPU):
 *       logits L (cr, V), columns v0.. = h (cr, D) . W^T:
 *         cublasSgemm(T, N, m=cnt, n=cr, k=D, W, D, h, D, 0, L + v0, V);
 *       CE_STATS: tcu_ce_stats_rows merges the rows' statistics of L into
 *       the running ones; CROSS_ENTROPY (tcu_ce_rows) and CE_BLOCK
 *       (tcu_ce_block_rows) turn L into G = scale (softmax - onehot), then
 *       dh (cr, D) (+)= G[:, block] . W:
 *         cublasSgemm(N, N, m=D, n=cr, k=cnt, W, D, L + v0, V, beta_h, dh, D),
 *         beta_h 1 past the first block of w (CE_BLOCK: or past the head's
 *         first block);
 *       dw[block] (cnt, D) (+)= G[:, block]^T . h:
 *         cublasSgemm(N, T, m=D, n=cnt, k=cr, h, D, L + v0, V, beta, dw + v0 D, D),
 *         beta 1 past the first chunk or when accumulating.
 *     The loss terms of all rows (CROSS_ENTROPY, the last CE_STATS) wait in
 *     the workspace's first R doubles and are summed once at the end
 *     (tcu_ce_loss). These ops run in f32 whatever the matmul mode: the
 *     gradient G is never rounded to 16 bits.
 *
 * Ids: EMBED_BWD's tokens (against the whole vocabulary for a block of the
 * gradient), the targets of the cross-entropy ops and the positions of
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
    const tide_op_args *p = &op->p;
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
    const tide_op_args *p = &op->p;
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
    const tide_op_args *p = &op->p;
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
    /* a block of the gradient: rows [vocab0, vocab0 + V) of a vocabulary of `vocab` */
    int64_t R = dy->shape[0], D = dy->shape[1], V = dt->shape[0], bad = -1;
    int64_t vocab = op->p.vocab ? op->p.vocab : V;
    int32_t val = 0;
    tide_status st = check_ids(q, ids, R, 0, vocab, false, REC_EMBED_BWD, op->p.idx0, &bad, &val, "embed_bwd");
    if (st) return st;
    if (bad >= 0)
        return tide_err(q->ctx, TIDE_E_RANGE, "embed_bwd: token id %d at position %lld of '%s' is outside the "
                        "gradient '%s' (vocabulary %lld)", val, (long long)(op->p.idx0 + bad), tok->name, dt->name,
                        (long long)vocab);
    if (op->n_in == 2)
        CU_TRY(q->ctx, cudaMemsetAsync(out[0], 0, (size_t)dt->nbytes, q->stream), "cudaMemsetAsync of '%s'",
               dt->name);
    CU_TRY(q->ctx, tcu_embed_bwd(q->stream, in[0], ids, R, D, op->p.vocab0, V, out[0]), "embed_bwd kernel");
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
    const tide_op_args *p = &op->p;
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
    const tide_op_args *p = &op->p;
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

/* ---------------------------------------------------------------- cross-entropy */

/* The work of CROSS_ENTROPY, CE_STATS and CE_BLOCK over a head w (V, D)
 * (the whole head or one block of it), in the workspace as graph/ops.c
 * sizes it: the rows' loss terms (R doubles, to 64 bytes), the logits of a
 * chunk of CR rows (CR, V), then for a 16-bit head rows of w widened to
 * f32: all of them, widened once, when they fit, else equal blocks of vb
 * rows widened at each use (the CPU's blocks). */
typedef struct ce_plan {
    const uint8_t *w;
    tide_dtype wdt;
    int64_t R, V, D, CR, vb;
    bool whole; /* every row of w in one block */
    double *terms;
    float *L, *wf;
    const char *nm, *wname;
} ce_plan;

/* Fails the op naming the first target at or past `vocab` (negative ones
 * are ignored rows), before anything is written; an asynchronous queue
 * records it as `kind`. */
static tide_status ce_check_targets(cu_queue *q, const tide_graph *g, const tide_op *op, const int32_t *targets,
                                    int64_t vocab, int32_t kind) {
    const char *nm = tide_op_name(op->kind);
    const int64_t R = tin(g, op, 0)->shape[0];
    int64_t bad = -1;
    int32_t val = 0;
    tide_status st = check_ids(q, targets, R, INT64_MIN, vocab, false, kind, op->p.idx0, &bad, &val, nm);
    if (st || bad < 0) return st;
    if (op->kind == TIDE_OP_CROSS_ENTROPY)
        return tide_err(q->ctx, TIDE_E_RANGE, "cross_entropy: target %d of row %lld of '%s' is outside the "
                        "vocabulary of '%s' (%lld ids)", val, (long long)(op->p.idx0 + bad), tin(g, op, 2)->name,
                        tin(g, op, 1)->name, (long long)vocab);
    return tide_err(q->ctx, TIDE_E_RANGE, "%s: target %d of row %lld of '%s' is outside the vocabulary of %lld ids",
                    nm, val, (long long)(op->p.idx0 + bad), tin(g, op, 2)->name, (long long)vocab);
}

/* Lays out the workspace, makes q's cuBLAS handle and widens the whole of
 * a 16-bit head when it fits. */
static tide_status ce_plan_init(tide_backend *be, cu_queue *q, const tide_graph *g, const tide_op *op,
                                const void *w, void *scratch, ce_plan *c) {
    const tide_tensor *ht = tin(g, op, 0), *wt = tin(g, op, 1);
    *c = (ce_plan){.w = w, .wdt = wt->dtype, .R = ht->shape[0], .V = wt->shape[0], .D = ht->shape[1],
                   .nm = tide_op_name(op->kind), .wname = wt->name};
    if (!fits_int(c->R, c->V, c->D))
        return tide_err(q->ctx, TIDE_E_UNSUPPORTED, "%s '%s': dimensions beyond what cuBLAS takes", c->nm, c->wname);
    c->CR = TIDE_MAX(1, TIDE_MIN(tide_ce_chunk_rows(c->R, c->V), c->R));
    const uint64_t lbytes = (uint64_t)(c->CR * c->V) * sizeof(float);
    const uint64_t tbytes = ((uint64_t)c->R * sizeof(double) + 63) / 64 * 64;
    if (!scratch || op->scratch_bytes < tbytes + lbytes) return no_workspace(q, op);
    c->terms = scratch;
    c->L = (float *)((uint8_t *)scratch + tbytes);
    c->wf = (float *)((uint8_t *)scratch + tbytes + lbytes);
    c->vb = c->V;
    if (c->wdt != TIDE_F32) {
        int64_t vb = (int64_t)((op->scratch_bytes - tbytes - lbytes) / ((uint64_t)c->D * sizeof(float)));
        if (vb < 1) return no_workspace(q, op);
        vb = TIDE_MIN(vb, c->V);
        int64_t nblk = (c->V + vb - 1) / vb;
        c->vb = (c->V + nblk - 1) / nblk; /* equal blocks, as the CPU's */
    }
    c->whole = c->vb == c->V;
    tide_status st = tide_cuda_queue_blas(be, q, q->ctx);
    if (st) return st;
    if (c->wdt != TIDE_F32 && c->whole)
        CU_TRY(q->ctx, tcu_convert(q->stream, c->w, c->wdt, c->wf, c->V * c->D), "%s weight conversion kernel", c->nm);
    return TIDE_OK;
}

/* *W = rows [v0, v0 + cnt) of w as f32, widened into the workspace if need be. */
static tide_status ce_rows_of(cu_queue *q, const ce_plan *c, int64_t v0, int64_t cnt, const float **W) {
    if (c->wdt == TIDE_F32) {
        *W = (const float *)c->w + v0 * c->D;
        return TIDE_OK;
    }
    if (c->whole) {
        *W = c->wf + v0 * c->D;
        return TIDE_OK;
    }
    CU_TRY(q->ctx, tcu_convert(q->stream, c->w + (size_t)(v0 * c->D) * tide_dtype_size(c->wdt), c->wdt, c->wf,
                               cnt * c->D),
           "%s weight conversion kernel", c->nm);
    *W = c->wf;
    return TIDE_OK;
}

/* logits L (cr, V) = hc (cr, D) . w^T, block by block. */
static tide_status ce_logits(cu_queue *q, const ce_plan *c, const float *hc, int cr) {
    const float one = 1.0f, zero = 0.0f;
    for (int64_t v0 = 0; v0 < c->V; v0 += c->vb) {
        const int cnt = (int)TIDE_MIN(c->vb, c->V - v0);
        const float *W = NULL;
        tide_status st = ce_rows_of(q, c, v0, cnt, &W);
        if (st) return st;
        cublasStatus_t bs = cublasSgemm(q->blas, CUBLAS_OP_T, CUBLAS_OP_N, cnt, cr, (int)c->D, &one, W, (int)c->D, hc,
                                        (int)c->D, &zero, c->L + v0, (int)c->V);
        if (bs != CUBLAS_STATUS_SUCCESS) {
            char what[300];
            snprintf(what, sizeof what, "cublasSgemm of %s '%s' logits", c->nm, c->wname);
            return tide_cuda_blas_fail(q->ctx, bs, what);
        }
    }
    return TIDE_OK;
}

/* With G (cr, V) in place of the logits: dh (cr, D) (+)= G . w and dw (V,
 * D) (+)= G^T . hc (none with dw NULL: a frozen head), block by block; dh
 * adds past the first block or with dh_add, dw with dw_add. */
static tide_status ce_grads(cu_queue *q, const ce_plan *c, const float *hc, int cr, bool dh_add, bool dw_add,
                            float *dh, float *dw) {
    const float one = 1.0f, beta_w = dw_add ? 1.0f : 0.0f;
    for (int64_t v0 = 0; v0 < c->V; v0 += c->vb) {
        const int cnt = (int)TIDE_MIN(c->vb, c->V - v0);
        const float *W = NULL;
        tide_status st = ce_rows_of(q, c, v0, cnt, &W);
        if (st) return st;
        const float beta_h = v0 || dh_add ? 1.0f : 0.0f;
        cublasStatus_t bs = cublasSgemm(q->blas, CUBLAS_OP_N, CUBLAS_OP_N, (int)c->D, cr, cnt, &one, W, (int)c->D,
                                        c->L + v0, (int)c->V, &beta_h, dh, (int)c->D);
        if (bs == CUBLAS_STATUS_SUCCESS && dw)
            bs = cublasSgemm(q->blas, CUBLAS_OP_N, CUBLAS_OP_T, (int)c->D, cnt, cr, &one, hc, (int)c->D, c->L + v0,
                             (int)c->V, &beta_w, dw + v0 * c->D, (int)c->D);
        if (bs != CUBLAS_STATUS_SUCCESS) {
            char what[300];
            snprintf(what, sizeof what, "cublasSgemm of %s '%s' gradients", c->nm, c->wname);
            return tide_cuda_blas_fail(q->ctx, bs, what);
        }
    }
    return TIDE_OK;
}

tide_status tide_cuda_cross_entropy(tide_backend *be, cu_queue *q, const tide_graph *g, const tide_op *op,
                                    void *const *in, void *const *out, void *scratch) {
    const int32_t *targets = (const int32_t *)in[2] + op->p.idx0; /* a row tile's targets */
    ce_plan c;
    tide_status st = ce_check_targets(q, g, op, targets, tin(g, op, 1)->shape[0], REC_TARGET);
    if (st || (st = ce_plan_init(be, q, g, op, in[1], scratch, &c))) return st;
    const float *h = in[0];
    float *dh = out[1], *dw = op->n_out == 3 ? out[2] : NULL;
    for (int64_t r0 = 0; r0 < c.R; r0 += c.CR) {
        const int cr = (int)TIDE_MIN(c.CR, c.R - r0);
        const float *hc = h + r0 * c.D;
        if ((st = ce_logits(q, &c, hc, cr))) return st;
        CU_TRY(q->ctx, tcu_ce_rows(q->stream, c.L, cr, c.V, targets + r0, op->p.scale, c.terms + r0),
               "cross_entropy row kernel");
        if ((st = ce_grads(q, &c, hc, cr, false, tide_ce_dw_adds(op) || r0 > 0, dh + r0 * c.D, dw))) return st;
    }
    /* the loss adding into the earlier tiles' (its last input is out[0]) */
    CU_TRY(q->ctx, tcu_ce_loss(q->stream, c.terms, c.R, op->p.scale, tide_ce_loss_adds(op), out[0]),
           "cross_entropy loss kernel");
    return TIDE_OK;
}

/* CE_STATS: each chunk's logits, then its rows' statistics merged into the
 * running ones (in[3], which is out[0], past the first block); the last
 * block leaves each row's loss term in the workspace and sums them. */
tide_status tide_cuda_ce_stats(tide_backend *be, cu_queue *q, const tide_graph *g, const tide_op *op,
                               void *const *in, void *const *out, void *scratch) {
    const tide_op_args *p = &op->p;
    const int32_t *targets = (const int32_t *)in[2] + p->idx0;
    const bool first = p->vocab0 == 0, last = op->n_out == 2;
    ce_plan c;
    tide_status st = ce_check_targets(q, g, op, targets, p->vocab, REC_CE_STATS);
    if (st || (st = ce_plan_init(be, q, g, op, in[1], scratch, &c))) return st;
    const float *h = in[0], *stats_in = first ? NULL : in[3];
    float *stats = out[0];
    for (int64_t r0 = 0; r0 < c.R; r0 += c.CR) {
        const int cr = (int)TIDE_MIN(c.CR, c.R - r0);
        if ((st = ce_logits(q, &c, h + r0 * c.D, cr))) return st;
        CU_TRY(q->ctx, tcu_ce_stats_rows(q->stream, c.L, cr, c.V, targets + r0, p->vocab0,
                                         stats_in ? stats_in + r0 * 3 : NULL, stats + r0 * 3,
                                         last ? c.terms + r0 : NULL),
               "ce_stats row kernel");
    }
    /* with accumulate the loss adds into its 5th input (in[4] is out[1]) */
    if (last)
        CU_TRY(q->ctx, tcu_ce_loss(q->stream, c.terms, c.R, p->scale, p->accumulate, out[1]), "ce_stats loss kernel");
    return TIDE_OK;
}

/* CE_BLOCK: each chunk's logits turned into g from the whole head's
 * statistics (in[3]), then its products into dh (adding past the first
 * block: in[4] is out[0]) and dw (adding with accumulate). */
tide_status tide_cuda_ce_block(tide_backend *be, cu_queue *q, const tide_graph *g, const tide_op *op,
                               void *const *in, void *const *out, void *scratch) {
    const tide_op_args *p = &op->p;
    const int32_t *targets = (const int32_t *)in[2] + p->idx0;
    ce_plan c;
    tide_status st = ce_check_targets(q, g, op, targets, p->vocab, REC_CE_BLOCK);
    if (st || (st = ce_plan_init(be, q, g, op, in[1], scratch, &c))) return st;
    const float *h = in[0], *stats = in[3];
    float *dh = out[0], *dw = op->n_out == 2 ? out[1] : NULL;
    for (int64_t r0 = 0; r0 < c.R; r0 += c.CR) {
        const int cr = (int)TIDE_MIN(c.CR, c.R - r0);
        const float *hc = h + r0 * c.D;
        if ((st = ce_logits(q, &c, hc, cr))) return st;
        CU_TRY(q->ctx, tcu_ce_block_rows(q->stream, c.L, cr, c.V, targets + r0, p->vocab0, stats + r0 * 3, p->scale),
               "ce_block row kernel");
        if ((st = ce_grads(q, &c, hc, cr, p->vocab0 > 0, p->accumulate || r0 > 0, dh + r0 * c.D, dw))) return st;
    }
    return TIDE_OK;
}
