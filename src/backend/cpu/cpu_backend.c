/*
 * cpu_backend.c - the CPU backend: "device" memory is host RAM (64-byte
 * aligned blocks), transfers are memcpy, and compute reads an op's shapes from
 * the graph and calls its kind's kernel (cpu_kernels, over kernels.h). Work is synchronous,
 * so there is nothing to synchronize.
 *
 * Queues (backend.h): synchronous only. A queue is a small struct holding the
 * context its errors go to, so that a kernel failing in an executor's worker
 * is recorded in that worker's context, not on be->ctx; the kernels' thread
 * count is that context's too (tide_ctx_threads).
 *
 * Workspace: the workspace an op gets is op->scratch_bytes of `scratch`
 * (MATMUL with non-f32 weights: with a block-quantized one, its activations
 * quantized to 8 bits, CROSS_ENTROPY's logits chunk, RMSNORM_BWD's
 * row scales, ATTENTION_BWD's score blocks: see graph/ops.c). Attention works
 * in bounded tiles on each thread's stack (under 96 KiB). ATTENTION_BWD runs
 * on no more threads than its workspace holds blocks for (its bits do not
 * depend on the count). Called without a workspace (or a smaller one than
 * ops.c gives), RMSNORM_BWD and ATTENTION_BWD allocate one for the call
 * instead; a failed allocation is TIDE_E_NOMEM.
 */
#include "backend/backend.h"
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/kernels_int.h"

#include <stdio.h>
#include <string.h>

/* Page alignment: device memory here is host memory, so the SSD store can read
 * O_DIRECT straight into an arena range whose planned offset is page aligned. */
#define CPU_ALIGN 4096

/* A queue: where the errors of calls on it go (first, as backend.h asks). */
typedef struct cpu_queue {
    tide_ctx *ctx;
} cpu_queue;

static tide_ctx *ctx_of(tide_backend *be, void *q) { return q ? ((cpu_queue *)q)->ctx : be->ctx; }

static void cpu_destroy(tide_backend *be) { tide_free(be); }

/* Names the kernels the instance runs in its current matmul mode, the
 * instruction sets detected and the path of the training products, in a
 * buffer of the calling thread (wrappers of the CPU backend, tests' async
 * one, share this slot, so it reads nothing but be->matmul). */
static const char *cpu_kernels_desc(tide_backend *be) {
    static _Thread_local char kernels[512];
    unsigned f = tk_cpu();
    char isa[160];
    tk_cpu_names(tk_cpu_detected(), isa, sizeof isa);
    bool avx512 = (f & (TK_CPU_AVX512F | TK_CPU_AVX512BW | TK_CPU_AVX512VL)) ==
                  (TK_CPU_AVX512F | TK_CPU_AVX512BW | TK_CPU_AVX512VL);
    const char *mm;
    if (be->matmul == TIDE_MATMUL_FAST && tk_matmul_fast_native(TIDE_BF16))
        mm = "matmul avx512_bf16 gemm/gemv (bf16 activations x bf16 weights, f32 sums)";
    else if (avx512)
        mm = "matmul avx512 gemm/gemv (weights widened to f32 in registers)";
    else if (f & TK_CPU_AVX2)
        mm = "matmul avx2 gemm/gemv (weights widened to f32 in registers)";
    else
        mm = "matmul portable gemm/gemv (weights widened to f32)";
    snprintf(kernels, sizeof kernels, "%s%s; block-quantized weights (q8_0 q4_0 q4_k q5_k q6_k) %s int8 "
             "gemm/gemv (activations quantized to 8 bits per 32, exact integer block sums); attention and "
             "elementwise %s; training products %s sgemm (packed f32 tiles); cpu: %s", mm,
             be->matmul == TIDE_MATMUL_FAST && !tk_matmul_fast_native(TIDE_BF16) ? " (fast mode without "
             "avx512_bf16: f32 kernels)" : "", tk_matmul_q_path(), tk_cpu_vector_path(), tk_sgemm_path(), isa);
    return kernels;
}

/* Queues hold nothing but their context, so the instance keeps no list of
 * them: a queue not freed by queue_free is the caller's leak. */
static tide_status cpu_queue_new(tide_backend *be, tide_ctx *ctx, bool async, void **q) {
    (void)be;
    *q = NULL;
    if (async) return tide_err(ctx, TIDE_E_UNSUPPORTED, "cpu backend: queues are synchronous only");
    cpu_queue *cq = tide_calloc(1, sizeof *cq);
    if (!cq) return tide_err(ctx, TIDE_E_NOMEM, "cpu backend: out of memory creating a queue");
    cq->ctx = ctx;
    *q = cq;
    return TIDE_OK;
}

static void cpu_queue_free(tide_backend *be, void *q) {
    (void)be;
    tide_free(q);
}

static tide_status cpu_alloc(tide_backend *be, size_t n, void **ptr) {
    *ptr = tide_malloc_aligned(n ? n : 1, CPU_ALIGN);
    if (!*ptr) return tide_err(be->ctx, TIDE_E_NOMEM, "cpu backend: out of memory allocating %zu bytes", n);
    return TIDE_OK;
}

static void cpu_dealloc(tide_backend *be, void *ptr) { tide_free_aligned(ptr); }

static tide_status cpu_copy(tide_backend *be, void *q, void *dst, const void *src, size_t n) {
    (void)be, (void)q;
    if (n) memcpy(dst, src, n);
    return TIDE_OK;
}

static const tide_tensor *tin(const tide_graph *g, const tide_op *op, int i) {
    return &g->tensors[op->in[i]];
}

static const tide_tensor *tout(const tide_graph *g, const tide_op *op, int i) {
    return &g->tensors[op->out[i]];
}

static tide_status cpu_embed(tide_ctx *ctx, int nt, const tide_graph *g, const tide_op *op, void *const *in,
                             void *const *out, void *scratch) {
    const tide_op_args *p = &op->p;
    const tide_tensor *tab = tin(g, op, 0), *tok = tin(g, op, 1), *o = tout(g, op, 0);
    const int32_t *ids = (const int32_t *)in[1] + p->idx0;
    int64_t R = o->shape[0], bad = -1;
    tide_status st = tk_embed(in[0], tab->dtype, tab->shape[0], tab->shape[1], p->vocab0, p->vocab,
                              op->n_in == 2, ids, R, out[0], &bad, nt);
    if (st == TIDE_E_RANGE)
        return tide_err(ctx, st, "embed: token id %d at position %lld of '%s' is outside the vocabulary (size %lld)",
                        ids[bad], (long long)(p->idx0 + bad), tok->name,
                        (long long)(p->vocab ? p->vocab : tab->shape[0]));
    return st;
}

static tide_status cpu_rmsnorm(tide_ctx *ctx, int nt, const tide_graph *g, const tide_op *op, void *const *in,
                               void *const *out, void *scratch) {
    const tide_op_args *p = &op->p;
    const tide_tensor *x = tin(g, op, 0);
    tk_rmsnorm(in[0], in[1], tin(g, op, 1)->dtype, x->shape[0], x->shape[1], p->eps, out[0], nt);
    return TIDE_OK;
}

/* MATMUL in the backend's mode. The fast mode rounds the activations into
 * the op's workspace (ops.c gives a 16-bit weight at least one row's worth);
 * called without one, it allocates room for all R rows for the call. */
static tide_status cpu_matmul(tide_ctx *ctx, int nt, tide_matmul_mode mode, const tide_graph *g, const tide_op *op,
                              void *const *in, void *const *out, void *scratch) {
    const tide_op_args *p = &op->p;
    const tide_tensor *x = tin(g, op, 0), *w = tin(g, op, 1), *o = tout(g, op, 0);
    float *dst = (float *)out[0] + p->row0 * o->shape[1] + p->col0;
    size_t sb = scratch ? (size_t)op->scratch_bytes : 0;
    int64_t R = x->shape[0], K = x->shape[1];
    tide_status st;
    if (mode == TIDE_MATMUL_FAST && !p->no_transpose && tk_matmul_fast_native(w->dtype)) {
        void *own = NULL;
        if (sb < tk_matmul_fast_min_scratch(K)) {
            sb = (size_t)R * tk_matmul_fast_min_scratch(K);
            if (!(own = tide_malloc(sb ? sb : 1)))
                return tide_err(ctx, TIDE_E_NOMEM, "matmul '%s': out of memory for %zu bytes of bf16 activations",
                                w->name, sb);
            scratch = own;
        }
        st = tk_matmul_fast(in[0], in[1], w->dtype, R, K, w->shape[0], p->accumulate, dst, o->shape[1], scratch, sb,
                            nt);
        tide_free(own);
    } else if (tide_dtype_is_quantized(w->dtype) && !p->no_transpose && !p->accumulate) {
        /* the activations quantized into the workspace (ops.c sizes it), or
         * into room for all R rows allocated for the call */
        void *own = NULL;
        if (sb < tk_matmul_q_min_scratch(K)) {
            sb = (size_t)R * tk_matmul_q_min_scratch(K);
            if (!(own = tide_malloc_aligned(sb ? sb : 1, 64)))
                return tide_err(ctx, TIDE_E_NOMEM, "matmul '%s': out of memory for %zu bytes of quantized "
                                "activations", w->name, sb);
            scratch = own;
        }
        st = tk_matmul_q(in[0], in[1], w->dtype, R, K, w->shape[0], dst, o->shape[1], scratch, sb, nt);
        tide_free_aligned(own);
    } else if (p->no_transpose || p->accumulate) {
        st = tk_matmul_ex(in[0], in[1], w->dtype, R, K, p->no_transpose ? w->shape[1] : w->shape[0], p->no_transpose,
                          p->accumulate, dst, o->shape[1], scratch, sb, nt);
    } else if (op->micro_batch >= 0 && w->dtype == TIDE_F32) {
        /* a training step's forward on an f32 weight: the packed GEMM of the
         * step's other products (each output's bits still a function of its
         * row, its column and K alone) */
        tk_gemm(false, true, R, w->shape[0], K, 1.0f, in[0], K, in[1], K, 0.0f, dst, o->shape[1], nt);
        st = TIDE_OK;
    } else {
        st = tk_matmul(in[0], in[1], w->dtype, R, K, w->shape[0], dst, o->shape[1], scratch, sb, nt);
    }
    if (st == TIDE_E_UNSUPPORTED && tide_dtype_is_quantized(w->dtype) && (p->no_transpose || p->accumulate))
        return tide_err(ctx, st, "matmul '%s': a %s weight takes only the x . w^T form (not accumulating) and "
                        "the x . w form with rows of whole blocks", w->name, tide_dtype_name(w->dtype));
    if (st == TIDE_E_INVALID)
        return tide_err(ctx, st, "matmul '%s': a %s weight needs %lld columns in whole blocks and a workspace of "
                        "%zu bytes", w->name, tide_dtype_name(w->dtype), (long long)K, tk_matmul_q_min_scratch(K));
    if (st) return tide_err(ctx, st, "matmul '%s': dimensions beyond what BLAS takes", w->name);
    return TIDE_OK;
}

/* The table's entry: the mode is the backend's, which cpu_compute passes to
 * cpu_matmul itself. */
static tide_status cpu_matmul_f32(tide_ctx *ctx, int nt, const tide_graph *g, const tide_op *op, void *const *in,
                                  void *const *out, void *scratch) {
    return cpu_matmul(ctx, nt, TIDE_MATMUL_F32, g, op, in, out, scratch);
}

static tide_status cpu_rope(tide_ctx *ctx, int nt, const tide_graph *g, const tide_op *op, void *const *in,
                            void *const *out, void *scratch) {
    const tide_op_args *p = &op->p;
    const tide_tensor *x = tin(g, op, 0);
    /* a position per row: row r reads pos[r % R] */
    tk_rope(in[0], (const int32_t *)in[1] + p->idx0, x->shape[0], p->pos_rows ? x->shape[0] : x->shape[0] / p->batch,
            p->n_heads, p->head_dim, p->rope_theta, p->rope_interleaved, out[0], nt);
    return TIDE_OK;
}

static tide_status cpu_attention(tide_ctx *ctx, int nt, const tide_graph *g, const tide_op *op, void *const *in,
                                 void *const *out, void *scratch) {
    const tide_op_args *p = &op->p;
    const tide_tensor *pos = tin(g, op, 3);
    const int32_t *pp = (const int32_t *)in[3] + p->idx0;
    tk_attn_dims d = {.B = p->batch, .T = tin(g, op, 0)->shape[0] / p->batch, .H = p->n_heads,
                      .KV = p->n_kv_heads, .hd = p->head_dim};
    if (op->n_out == 1) { /* no cache: k and v are the keys and values */
        int64_t bad = -1;
        tide_status st = tk_attention_nocache(in[0], in[1], in[2], pp, out[0], &d, &bad, nt);
        if (st == TIDE_E_RANGE)
            return tide_err(ctx, st, "attention without a cache needs positions 0..%lld, but '%s'[%lld] is %d",
                            (long long)d.T - 1, pos->name, (long long)bad, pp[bad]);
        if (st == TIDE_E_UNSUPPORTED)
            return tide_err(ctx, st, "attention: head_dim %d is above the cpu backend's limit %d", d.hd,
                            TK_ATTN_MAX_HD);
        return st;
    }
    /* the caches are outputs 1 and 2 (also inputs 4 and 5 unless fresh) */
    const tide_tensor *kc = tout(g, op, 1);
    d.C = kc->shape[1];
    d.cache_dtype = kc->dtype;
    if (op->n_in == 4)
        for (int64_t t = 0; t < d.T; t++)
            if (pp[t] != t)
                return tide_err(ctx, TIDE_E_RANGE, "attention: a fresh cache needs positions 0..%lld, but "
                                "'%s'[%lld] is %d", (long long)d.T - 1, pos->name, (long long)t,
                                pp[t]);
    int64_t bad = -1;
    tide_status st = TIDE_OK;
    if (!p->pos_rows) {
        st = tk_attention(in[0], in[1], in[2], pp, out[1], out[2], out[0], &d, &bad, nt);
    } else {
        /* a position per row: each sequence as a batch of one at its own
         * positions, so a row computes what it computes alone */
        tk_attn_dims d1 = d;
        d1.B = 1;
        const int64_t qd = (int64_t)d.H * d.hd, kd = (int64_t)d.KV * d.hd, rows = d.T;
        for (int64_t b = 0; b < d.B && !st; b++) {
            const int64_t cb = d.C * (int64_t)tide_dtype_bytes(d.cache_dtype, (uint64_t)kd); /* a row's bytes */
            st = tk_attention((const float *)in[0] + b * rows * qd, (const float *)in[1] + b * rows * kd,
                              (const float *)in[2] + b * rows * kd, pp + b * rows, (char *)out[1] + b * cb,
                              (char *)out[2] + b * cb, (float *)out[0] + b * rows * qd, &d1, &bad, nt);
            if (st == TIDE_E_RANGE) bad += b * rows;
        }
    }
    if (st == TIDE_E_RANGE)
        return tide_err(ctx, st, "attention: position %d at index %lld of '%s' is outside the cache '%s' (capacity %lld)",
                        pp[bad], (long long)(p->idx0 + bad), pos->name, kc->name,
                        (long long)d.C);
    if (st == TIDE_E_UNSUPPORTED)
        return tide_err(ctx, st, "attention: head_dim %d is above the cpu backend's limit %d",
                        d.hd, TK_ATTN_MAX_HD);
    return st;
}

static tide_status cpu_silu_mul(tide_ctx *ctx, int nt, const tide_graph *g, const tide_op *op, void *const *in,
                                void *const *out, void *scratch) {
    tk_silu_mul(in[0], in[1], out[0], tide_tensor_numel(tin(g, op, 0)), nt);
    return TIDE_OK;
}

static tide_status cpu_add_bias(tide_ctx *ctx, int nt, const tide_graph *g, const tide_op *op, void *const *in,
                                void *const *out, void *scratch) {
    const tide_tensor *x = tin(g, op, 0);
    if (tk_add_bias(in[0], in[1], tin(g, op, 1)->dtype, x->shape[0], x->shape[1], out[0], nt))
        return tide_err(ctx, TIDE_E_NOMEM, "add_bias '%s': out of memory widening the bias", tin(g, op, 1)->name);
    return TIDE_OK;
}

static tide_status cpu_add(tide_ctx *ctx, int nt, const tide_graph *g, const tide_op *op, void *const *in,
                           void *const *out, void *scratch) {
    tk_add(in[0], in[1], out[0], tide_tensor_numel(tin(g, op, 0)), nt);
    return TIDE_OK;
}

static tide_status cpu_take_last(tide_ctx *ctx, int nt, const tide_graph *g, const tide_op *op, void *const *in,
                                 void *const *out, void *scratch) {
    const tide_op_args *p = &op->p;
    const tide_tensor *x = tin(g, op, 0);
    tk_take_last(in[0], p->batch, x->shape[0] / p->batch, x->shape[1], (float *)out[0] + p->row0 * x->shape[1]);
    return TIDE_OK;
}

static tide_status cpu_argmax(tide_ctx *ctx, int nt, const tide_graph *g, const tide_op *op, void *const *in,
                              void *const *out, void *scratch) {
    const tide_tensor *x = tin(g, op, 0);
    tk_argmax(in[0], x->shape[0], x->shape[1], out[0], nt);
    return TIDE_OK;
}

static tide_status cpu_generic(tide_ctx *ctx, int nt, const tide_graph *g, const tide_op *op, void *const *in,
                               void *const *out, void *scratch) {
    const uint8_t *ip[TIDE_OP_MAX_IN];
    uint8_t *op_[TIDE_OP_MAX_OUT];
    uint64_t ib[TIDE_OP_MAX_IN], ob[TIDE_OP_MAX_OUT];
    for (int i = 0; i < op->n_in; i++) {
        ip[i] = in[i];
        ib[i] = tin(g, op, i)->nbytes;
    }
    for (int i = 0; i < op->n_out; i++) {
        op_[i] = out[i];
        ob[i] = tout(g, op, i)->nbytes;
    }
    tk_generic(op->n_in, ip, ib, op->n_out, op_, ob, nt);
    return TIDE_OK;
}

/* ---------------------------------------------------------------- training ops */

static tide_status cpu_embed_bwd(tide_ctx *ctx, int nt, const tide_graph *g, const tide_op *op, void *const *in,
                                 void *const *out, void *scratch) {
    const tide_tensor *dy = tin(g, op, 0), *tok = tin(g, op, 1), *dt = tout(g, op, 0);
    const int32_t *ids = (const int32_t *)in[1] + op->p.idx0;
    int64_t bad = -1, vocab = op->p.vocab ? op->p.vocab : dt->shape[0];
    tide_status st = tk_embed_bwd_block(in[0], ids, dy->shape[0], dy->shape[1], dt->shape[0], op->p.vocab0, vocab,
                                        op->n_in == 3, out[0], &bad, nt);
    if (st == TIDE_E_RANGE)
        return tide_err(ctx, st, "embed_bwd: token id %d at position %lld of '%s' is outside the gradient '%s' "
                        "(vocabulary %lld)", ids[bad], (long long)(op->p.idx0 + bad), tok->name, dt->name,
                        (long long)vocab);
    return st;
}

static tide_status cpu_rmsnorm_bwd(tide_ctx *ctx, int nt, const tide_graph *g, const tide_op *op, void *const *in,
                                   void *const *out, void *scratch) {
    const tide_tensor *x = tin(g, op, 0);
    int64_t R = x->shape[0], D = x->shape[1];
    bool own = !scratch || op->scratch_bytes < (uint64_t)R * sizeof(float);
    float *rs = own ? tide_malloc((size_t)R * sizeof(float)) : scratch;
    if (!rs) return tide_err(ctx, TIDE_E_NOMEM, "rmsnorm_bwd: out of memory for %lld row scales", (long long)R);
    tk_rmsnorm_bwd(in[0], in[1], tin(g, op, 1)->dtype, in[2], R, D, op->p.eps, op->n_in == 4, out[0], out[1], rs,
                   nt);
    if (own) tide_free(rs);
    return TIDE_OK;
}

static tide_status cpu_matmul_gradw(tide_ctx *ctx, int nt, const tide_graph *g, const tide_op *op,
                                    void *const *in, void *const *out, void *scratch) {
    const tide_tensor *dy = tin(g, op, 0), *x = tin(g, op, 1);
    tide_status st = tk_matmul_gradw(in[0], in[1], dy->shape[0], dy->shape[1], x->shape[1], op->n_in == 3,
                                     out[0], nt);
    if (st) return tide_err(ctx, st, "matmul_gradw '%s': dimensions beyond what BLAS takes", tout(g, op, 0)->name);
    return TIDE_OK;
}

static tide_status cpu_rope_bwd(tide_ctx *ctx, int nt, const tide_graph *g, const tide_op *op, void *const *in,
                                void *const *out, void *scratch) {
    const tide_op_args *p = &op->p;
    const tide_tensor *dy = tin(g, op, 0);
    tk_rope_bwd(in[0], (const int32_t *)in[1] + p->idx0, dy->shape[0],
                p->pos_rows ? dy->shape[0] : dy->shape[0] / p->batch, p->n_heads, p->head_dim, p->rope_theta,
                out[0], nt);
    return TIDE_OK;
}

static tide_status cpu_attention_bwd(tide_ctx *ctx, int nt, const tide_graph *g, const tide_op *op,
                                     void *const *in, void *const *out, void *scratch) {
    const tide_op_args *p = &op->p;
    const tide_tensor *pos = tin(g, op, 5);
    const int32_t *pp = in[5];
    tk_attn_dims d = {.B = p->batch, .T = tin(g, op, 0)->shape[0] / p->batch, .H = p->n_heads,
                      .KV = p->n_kv_heads, .hd = p->head_dim};
    d.C = d.T;
    for (int64_t t = 0; t < d.T; t++)
        if (pp[t] != t)
            return tide_err(ctx, TIDE_E_RANGE, "attention_bwd: fresh sequences need positions 0..%lld, but "
                            "'%s'[%lld] is %d", (long long)d.T - 1, pos->name, (long long)t, pp[t]);
    /* the workspace's blocks, one thread's per slot; threads beyond them
     * would have no task anyway past B * KV */
    size_t per = tk_attention_bwd_work(&d, 1);
    int64_t slots = scratch && per ? (int64_t)(op->scratch_bytes / per) : 0;
    float *work = scratch;
    if (slots >= 1) {
        nt = (int)TIDE_MIN((int64_t)nt, slots);
    } else {
        size_t wb = tk_attention_bwd_work(&d, nt);
        work = tide_malloc_aligned(wb, 64);
        if (!work) return tide_err(ctx, TIDE_E_NOMEM, "attention_bwd: out of memory for %zu bytes of score tiles", wb);
    }
    tide_status st = tk_attention_bwd(in[0], in[1], in[2], in[3], in[4], out[0], out[1], out[2], &d, work, nt);
    if (work != scratch) tide_free_aligned(work);
    if (st) return tide_err(ctx, st, "attention_bwd: dimensions beyond what BLAS takes");
    return TIDE_OK;
}

static tide_status cpu_silu_mul_bwd(tide_ctx *ctx, int nt, const tide_graph *g, const tide_op *op,
                                    void *const *in, void *const *out, void *scratch) {
    tk_silu_mul_bwd(in[0], in[1], in[2], out[0], out[1], tide_tensor_numel(tin(g, op, 0)), nt);
    return TIDE_OK;
}

static tide_status cpu_cross_entropy(tide_ctx *ctx, int nt, const tide_graph *g, const tide_op *op,
                                     void *const *in, void *const *out, void *scratch) {
    const tide_tensor *h = tin(g, op, 0), *w = tin(g, op, 1), *tg = tin(g, op, 2);
    int64_t R = h->shape[0], D = h->shape[1], V = w->shape[0], bad = -1;
    const int32_t *targets = (const int32_t *)in[2] + op->p.idx0; /* a row tile's targets */
    /* the workspace's first R doubles, to 64 bytes (per-row loss terms), are
     * the GPU's (graph/ops.c) */
    uint64_t terms = ((uint64_t)R * sizeof(double) + 63) / 64 * 64;
    bool room = scratch && op->scratch_bytes > terms;
    /* the loss adding into the earlier tiles' (its last input is out[0]) */
    const bool loss_adds = tide_ce_loss_adds(op);
    const float before = loss_adds ? *(const float *)in[op->n_in - 1] : 0.0f;
    tide_status st = tk_cross_entropy(in[0], in[1], w->dtype, targets, R, V, D, op->p.scale, tide_ce_dw_adds(op),
                                      tide_ce_chunk_rows(R, V), out[0], out[1], op->n_out == 3 ? out[2] : NULL,
                                      room ? (uint8_t *)scratch + terms : NULL,
                                      room ? (size_t)(op->scratch_bytes - terms) : 0, &bad, NULL, nt);
    if (st == TIDE_E_RANGE)
        return tide_err(ctx, st, "cross_entropy: target %d of row %lld of '%s' is outside the vocabulary of '%s' "
                        "(%lld ids)", targets[bad], (long long)(op->p.idx0 + bad), tg->name, w->name, (long long)V);
    if (st == TIDE_E_INVALID)
        return tide_err(ctx, st, "cross_entropy: needs its workspace of %llu bytes",
                        (unsigned long long)op->scratch_bytes);
    if (st) return tide_err(ctx, st, "cross_entropy '%s': dimensions beyond what BLAS takes", w->name);
    if (loss_adds) *(float *)out[0] = before + *(float *)out[0];
    return TIDE_OK;
}

/* CE_STATS and CE_BLOCK: the workspace past the GPU's per-row terms, as
 * cross_entropy's. */
static tide_status cpu_ce_err(tide_ctx *ctx, tide_status st, const tide_graph *g, const tide_op *op,
                              const int32_t *targets, int64_t bad) {
    const char *nm = tide_op_name(op->kind);
    if (st == TIDE_E_RANGE)
        return tide_err(ctx, st, "%s: target %d of row %lld of '%s' is outside the vocabulary of %lld ids", nm,
                        targets[bad], (long long)(op->p.idx0 + bad), tin(g, op, 2)->name, (long long)op->p.vocab);
    if (st == TIDE_E_INVALID)
        return tide_err(ctx, st, "%s: needs its workspace of %llu bytes", nm, (unsigned long long)op->scratch_bytes);
    if (st) return tide_err(ctx, st, "%s '%s': dimensions beyond what BLAS takes", nm, tin(g, op, 1)->name);
    return TIDE_OK;
}

/* What CE_STATS and CE_BLOCK take alike: shapes, the targets from idx0, and
 * the workspace past the GPU's R per-row doubles (to 64 bytes). */
typedef struct cpu_ce {
    int64_t R, D, Vb;
    tide_dtype wdt;
    const int32_t *targets;
    void *work;
    size_t work_bytes;
} cpu_ce;

static cpu_ce cpu_ce_of(const tide_graph *g, const tide_op *op, void *const *in, void *scratch) {
    const tide_tensor *h = tin(g, op, 0), *w = tin(g, op, 1);
    cpu_ce c = {.R = h->shape[0], .D = h->shape[1], .Vb = w->shape[0], .wdt = w->dtype,
                .targets = (const int32_t *)in[2] + op->p.idx0};
    uint64_t terms = ((uint64_t)c.R * sizeof(double) + 63) / 64 * 64;
    if (scratch && op->scratch_bytes > terms) {
        c.work = (uint8_t *)scratch + terms;
        c.work_bytes = (size_t)(op->scratch_bytes - terms);
    }
    return c;
}

static tide_status cpu_ce_stats(tide_ctx *ctx, int nt, const tide_graph *g, const tide_op *op, void *const *in,
                                void *const *out, void *scratch) {
    cpu_ce c = cpu_ce_of(g, op, in, scratch);
    int64_t bad = -1;
    bool first = op->p.vocab0 == 0, last = op->n_out == 2;
    const float before = last && op->p.accumulate ? *(const float *)in[4] : 0.0f;
    tide_status st = tk_ce_stats(in[0], in[1], c.wdt, c.targets, c.R, c.Vb, c.D, op->p.vocab0, op->p.vocab,
                                 op->p.scale, first ? NULL : in[3], out[0], last ? out[1] : NULL,
                                 tide_ce_chunk_rows(c.R, c.Vb), c.work, c.work_bytes, &bad, NULL, nt);
    if (st) return cpu_ce_err(ctx, st, g, op, c.targets, bad);
    if (last && op->p.accumulate) *(float *)out[1] = before + *(float *)out[1];
    return TIDE_OK;
}

static tide_status cpu_ce_block(tide_ctx *ctx, int nt, const tide_graph *g, const tide_op *op, void *const *in,
                                void *const *out, void *scratch) {
    cpu_ce c = cpu_ce_of(g, op, in, scratch);
    int64_t bad = -1;
    tide_status st = tk_ce_block(in[0], in[1], c.wdt, c.targets, c.R, c.Vb, c.D, op->p.vocab0, op->p.vocab,
                                 op->p.scale, in[3], op->p.vocab0 > 0, op->p.accumulate, out[0],
                                 op->n_out == 2 ? out[1] : NULL,
                                 tide_ce_chunk_rows(c.R, c.Vb), c.work, c.work_bytes, &bad, NULL, nt);
    return st ? cpu_ce_err(ctx, st, g, op, c.targets, bad) : TIDE_OK;
}

static tide_status cpu_sumsq(tide_ctx *ctx, int nt, const tide_graph *g, const tide_op *op, void *const *in,
                             void *const *out, void *scratch) {
    float acc = op->n_in == 2 ? *(const float *)in[1] : 0.0f;
    *(float *)out[0] = tk_sumsq(in[0], tide_tensor_numel(tin(g, op, 0)), acc, nt);
    return TIDE_OK;
}

static tide_status cpu_adamw(tide_ctx *ctx, int nt, const tide_graph *g, const tide_op *op, void *const *in,
                             void *const *out, void *scratch) {
    const tide_op_args *p = &op->p;
    const tide_tensor *param = tin(g, op, 0);
    bool master = op->n_in == 7;
    int mi = master ? 2 : 1; /* index of m: outputs param, [master,] m, v are inputs 0.. in place */
    const float *hyper = in[mi + 3], *sumsq = in[mi + 4];
    tk_adamw_args a = {.lr = hyper[0], .step = hyper[1], .bc2_sqrt = hyper[2], .beta1 = p->beta1,
                       .beta2 = p->beta2, .eps = p->adam_eps,
                       /* as is usual, decay only matrices: norms' weights and biases are 1-D */
                       .weight_decay = param->ndim >= 2 ? p->weight_decay : 0.0f, .max_norm = p->max_norm,
                       .sumsq = *sumsq, .grad_scale = hyper[3]};
    tk_adamw(out[0], param->dtype, master ? out[1] : NULL, out[mi], out[mi + 1], in[mi + 2],
             tide_tensor_numel(param), &a, nt);
    return TIDE_OK;
}

/* The kernel of each op kind (graph/ops.c has the kinds' contracts): a kind
 * without one here is unsupported on the CPU. */
typedef tide_status (*cpu_kernel)(tide_ctx *ctx, int nt, const tide_graph *g, const tide_op *op, void *const *in,
                                  void *const *out, void *scratch);
static const cpu_kernel cpu_kernels[TIDE_OP_COUNT] = {
    [TIDE_OP_EMBED] = cpu_embed,
    [TIDE_OP_RMSNORM] = cpu_rmsnorm,
    [TIDE_OP_MATMUL] = cpu_matmul_f32,
    [TIDE_OP_ROPE] = cpu_rope,
    [TIDE_OP_ATTENTION] = cpu_attention,
    [TIDE_OP_SILU_MUL] = cpu_silu_mul,
    [TIDE_OP_ADD] = cpu_add,
    [TIDE_OP_ADD_BIAS] = cpu_add_bias,
    [TIDE_OP_TAKE_LAST] = cpu_take_last,
    [TIDE_OP_ARGMAX] = cpu_argmax,
    [TIDE_OP_GENERIC] = cpu_generic,
    [TIDE_OP_EMBED_BWD] = cpu_embed_bwd,
    [TIDE_OP_RMSNORM_BWD] = cpu_rmsnorm_bwd,
    [TIDE_OP_MATMUL_GRADW] = cpu_matmul_gradw,
    [TIDE_OP_ROPE_BWD] = cpu_rope_bwd,
    [TIDE_OP_ATTENTION_BWD] = cpu_attention_bwd,
    [TIDE_OP_SILU_MUL_BWD] = cpu_silu_mul_bwd,
    [TIDE_OP_CROSS_ENTROPY] = cpu_cross_entropy,
    [TIDE_OP_CE_STATS] = cpu_ce_stats,
    [TIDE_OP_CE_BLOCK] = cpu_ce_block,
    [TIDE_OP_SUMSQ] = cpu_sumsq,
    [TIDE_OP_ADAMW] = cpu_adamw,
};

/* ---------------------------------------------------------------- bf16 steps */

/* The products of a bf16 training step (op->p.bf16): MATMUL (but with a
 * block-quantized weight, whose kernels keep their own arithmetic),
 * MATMUL_GRADW and the fused cross-entropy read their f32 or bf16 operands
 * themselves (tk_gemm_bf16) and write a bf16 output directly. */
static bool bf16_native(const tide_graph *g, const tide_op *op) {
    if (!op->p.bf16) return false;
    switch (op->kind) {
    case TIDE_OP_MATMUL: return !tide_dtype_is_quantized(tin(g, op, 1)->dtype);
    case TIDE_OP_MATMUL_GRADW: case TIDE_OP_CROSS_ENTROPY: case TIDE_OP_CE_STATS: case TIDE_OP_CE_BLOCK: return true;
    default: return false;
    }
}

static tide_status cpu_bf16_product(tide_ctx *ctx, int nt, const tide_graph *g, const tide_op *op,
                                    void *const *in, void *const *out, void *scratch) {
    const tide_op_args *p = &op->p;
    const tide_tensor *x = tin(g, op, 0), *w = tin(g, op, 1), *o = tout(g, op, 0);
    const char *nm = tide_op_name(op->kind);
    tide_status st = TIDE_OK;
    if (op->kind == TIDE_OP_MATMUL) {
        const int64_t ldo = o->shape[1];
        void *dst = (uint8_t *)out[0] + (size_t)(p->row0 * ldo + p->col0) * tide_dtype_size(o->dtype);
        st = tk_matmul_bf16(in[0], x->dtype, in[1], w->dtype, x->shape[0], x->shape[1],
                            p->no_transpose ? w->shape[1] : w->shape[0], p->no_transpose, p->accumulate, dst,
                            o->dtype, ldo, scratch, scratch ? (size_t)op->scratch_bytes : 0, nt);
    } else if (op->kind == TIDE_OP_MATMUL_GRADW) {
        st = tk_matmul_gradw_bf16(in[0], x->dtype, in[1], w->dtype, x->shape[0], x->shape[1], w->shape[1],
                                  op->n_in == 3, out[0], nt);
    } else {
        int64_t R = x->shape[0], D = x->shape[1], bad = -1;
        const int32_t *targets = (const int32_t *)in[2] + p->idx0;
        const tk_ce_prec pr = {.bf16 = true, .hdt = x->dtype};
        uint64_t terms = ((uint64_t)R * sizeof(double) + 63) / 64 * 64;
        bool room = scratch && op->scratch_bytes > terms;
        void *work = room ? (uint8_t *)scratch + terms : NULL;
        size_t wb = room ? (size_t)(op->scratch_bytes - terms) : 0;
        if (op->kind == TIDE_OP_CROSS_ENTROPY) {
            const bool loss_adds = tide_ce_loss_adds(op);
            const float before = loss_adds ? *(const float *)in[op->n_in - 1] : 0.0f;
            st = tk_cross_entropy(in[0], in[1], w->dtype, targets, R, w->shape[0], D, p->scale, tide_ce_dw_adds(op),
                                  tide_ce_chunk_rows(R, w->shape[0]), out[0], out[1],
                                  op->n_out == 3 ? out[2] : NULL, work, wb, &bad, &pr, nt);
            if (!st && loss_adds) *(float *)out[0] = before + *(float *)out[0];
        } else if (op->kind == TIDE_OP_CE_STATS) {
            bool first = p->vocab0 == 0, last = op->n_out == 2;
            const float before = last && p->accumulate ? *(const float *)in[4] : 0.0f;
            st = tk_ce_stats(in[0], in[1], w->dtype, targets, R, w->shape[0], D, p->vocab0, p->vocab, p->scale,
                             first ? NULL : in[3], out[0], last ? out[1] : NULL, tide_ce_chunk_rows(R, w->shape[0]),
                             work, wb, &bad, &pr, nt);
            if (!st && last && p->accumulate) *(float *)out[1] = before + *(float *)out[1];
        } else {
            st = tk_ce_block(in[0], in[1], w->dtype, targets, R, w->shape[0], D, p->vocab0, p->vocab, p->scale,
                             in[3], p->vocab0 > 0, p->accumulate, out[0], op->n_out == 2 ? out[1] : NULL,
                             tide_ce_chunk_rows(R, w->shape[0]), work, wb, &bad, &pr, nt);
        }
        if (st == TIDE_E_RANGE)
            return tide_err(ctx, st, "%s: target %d of row %lld of '%s' is outside the vocabulary of '%s'", nm,
                            targets[bad], (long long)(p->idx0 + bad), tin(g, op, 2)->name, w->name);
        if (st == TIDE_E_INVALID)
            return tide_err(ctx, st, "%s: needs its workspace of %llu bytes", nm,
                            (unsigned long long)op->scratch_bytes);
    }
    if (st == TIDE_E_NOMEM) return tide_err(ctx, st, "%s '%s': out of memory for a block of f32 sums", nm, o->name);
    if (st) return tide_err(ctx, st, "%s '%s': dimensions beyond what the kernels take", nm, w->name);
    return TIDE_OK;
}

/* True if op reads or writes a bf16 activation (a slot that is no weight,
 * table or cache: tide_op_slot_native) that its f32 kernel does not take:
 * cpu_compute_widened runs it. */
static bool op_has_bf16_act(const tide_graph *g, const tide_op *op) {
    for (int i = 0; i < op->n_in + op->n_out; i++) {
        const tide_tensor *t = i < op->n_in ? tin(g, op, i) : tout(g, op, i - op->n_in);
        if (t->dtype == TIDE_BF16 && !tide_op_slot_native(op->kind, op->n_in, i)) return true;
    }
    return false;
}

/* m bf16 values widened into dst, on nt threads (each its own run of the
 * tensor, so the copy's pages are first touched in parallel too). */
static void widen_bf16(const void *src, float *dst, int64_t m, int nt) {
    const int64_t run = INT64_C(1) << 16, runs = (m + run - 1) / run;
#pragma omp parallel for schedule(static) num_threads(nt) if (m >= TK_PAR_MIN)
    for (int64_t c = 0; c < runs; c++)
        tk_convert((const uint16_t *)src + c * run, TIDE_BF16, dst + c * run, (size_t)TIDE_MIN(run, m - c * run));
}

/* Runs the f32 kernel k of op with its bf16 activations widened into f32
 * copies (exactly: a bf16 widens without rounding) and its bf16 outputs
 * stored back rounded to nearest even: the elementwise ops, norms, rope and
 * attention of a bf16 step compute in f32 on what it keeps in bf16. An
 * output that is also an input (the accumulating forms) shares the input's
 * copy. The copies are allocated for the call (as large as the f32
 * tensors; a failure is TIDE_E_NOMEM). */
static tide_status cpu_compute_widened(tide_ctx *ctx, tide_backend *be, const tide_graph *g, const tide_op *op,
                                       cpu_kernel k, void *const *in, void *const *out, void *scratch) {
    enum { N = TIDE_OP_MAX_IN + TIDE_OP_MAX_OUT };
    void *arg[N];
    float *buf[N] = {0};
    int ids[N];
    tide_status st = TIDE_OK;
    const int n = op->n_in + op->n_out;
    const int nt = tide_ctx_threads(ctx);
    for (int i = 0; i < n && !st; i++) {
        const bool is_in = i < op->n_in;
        const tide_tensor *t = is_in ? tin(g, op, i) : tout(g, op, i - op->n_in);
        ids[i] = is_in ? op->in[i] : op->out[i - op->n_in];
        arg[i] = is_in ? in[i] : out[i - op->n_in];
        if (t->dtype != TIDE_BF16 || tide_op_slot_native(op->kind, op->n_in, i)) continue;
        bool shared = false;
        for (int j = 0; j < i; j++)
            if (ids[j] == ids[i] && buf[j]) {
                arg[i] = buf[j]; /* the same tensor: one copy */
                shared = true;
                break;
            }
        if (shared) continue;
        const int64_t m = tide_tensor_numel(t);
        if (!(buf[i] = tide_malloc((size_t)(m ? m : 1) * sizeof(float)))) {
            st = tide_err(ctx, TIDE_E_NOMEM, "cpu %s: out of memory for an f32 copy of '%s'", tide_op_name(op->kind),
                          t->name);
            break;
        }
        if (is_in) widen_bf16(in[i], buf[i], m, nt);
        arg[i] = buf[i];
    }
    if (!st) {
        st = op->kind == TIDE_OP_MATMUL ? cpu_matmul(ctx, nt, be->matmul, g, op, arg, arg + op->n_in, scratch)
                                        : k(ctx, nt, g, op, arg, arg + op->n_in, scratch);
    }
    for (int j = 0; j < op->n_out && !st; j++) {
        const tide_tensor *t = tout(g, op, j);
        if (t->dtype != TIDE_BF16 || tide_op_slot_native(op->kind, op->n_in, op->n_in + j)) continue;
        const int64_t rows = t->shape[0] > 0 ? t->shape[0] : 1, cols = tide_tensor_numel(t) / rows;
        tk_round_bf16(arg[op->n_in + j], cols, rows, cols, out[j], cols, nt);
    }
    for (int i = 0; i < n; i++) tide_free(buf[i]);
    return st;
}

static tide_status cpu_compute(tide_backend *be, void *q, const tide_graph *g, const tide_op *op,
                               void *const *in, void *const *out, void *scratch) {
    tide_ctx *ctx = ctx_of(be, q);
    const char *nm = tide_op_name(op->kind);
    for (int i = 0; i < op->n_in; i++)
        if (!in[i]) return tide_err(ctx, TIDE_E_INVALID, "cpu %s: input %d has no data", nm, i);
    for (int i = 0; i < op->n_out; i++)
        if (!out[i]) return tide_err(ctx, TIDE_E_INVALID, "cpu %s: output %d has no data", nm, i);
    cpu_kernel k = (unsigned)op->kind < TIDE_OP_COUNT ? cpu_kernels[op->kind] : NULL;
    if (!k) return tide_err(ctx, TIDE_E_UNSUPPORTED, "cpu backend: op kind %d is not supported", (int)op->kind);
    /* block-quantized tensors: a MATMUL's weight, an EMBED's table and an
     * ATTENTION's KV caches (inputs 4, 5; outputs 1, 2) only */
    for (int i = 0; i < op->n_in + op->n_out; i++) {
        const tide_tensor *t = i < op->n_in ? tin(g, op, i) : tout(g, op, i - op->n_in);
        bool weight = (op->kind == TIDE_OP_MATMUL && i == 1) || (op->kind == TIDE_OP_EMBED && i == 0) ||
                      (op->kind == TIDE_OP_ATTENTION && ((i >= 4 && i < op->n_in) || i > op->n_in));
        if (tide_dtype_is_quantized(t->dtype) && !weight)
            return tide_err(ctx, TIDE_E_UNSUPPORTED, "cpu %s: tensor '%s' is %s; the cpu backend takes "
                            "block-quantized tensors only as a matmul's weight, an embed's table or a KV cache", nm, t->name,
                            tide_dtype_name(t->dtype));
    }
    if (bf16_native(g, op)) return cpu_bf16_product(ctx, tide_ctx_threads(ctx), g, op, in, out, scratch);
    if (op_has_bf16_act(g, op)) return cpu_compute_widened(ctx, be, g, op, k, in, out, scratch);
    if (op->kind == TIDE_OP_MATMUL) return cpu_matmul(ctx, tide_ctx_threads(ctx), be->matmul, g, op, in, out, scratch);
    return k(ctx, tide_ctx_threads(ctx), g, op, in, out, scratch);
}

static const tide_backend_vt cpu_vt = {
    .name = "cpu",
    .device_is_host = true,
    .destroy = cpu_destroy,
    .alloc = cpu_alloc,
    .dealloc = cpu_dealloc,
    .to_device = cpu_copy,
    .to_host = cpu_copy,
    .compute = cpu_compute,
    .synchronize = NULL,
    .queue_new = cpu_queue_new,
    .queue_free = cpu_queue_free,
    .queue_sync = NULL,
    .kernels = cpu_kernels_desc,
};

/* Returns TIDE_OK with *out a new CPU backend on ctx, or TIDE_E_NOMEM. */
tide_status tide_cpu_backend_new(tide_ctx *ctx, tide_backend **out) {
    *out = NULL;
    tide_backend *be = tide_calloc(1, sizeof *be);
    if (!be) return tide_err(ctx, TIDE_E_NOMEM, "out of memory creating the cpu backend");
    tk_init();
    be->vt = &cpu_vt;
    be->ctx = ctx;
    be->kind = TIDE_BACKEND_CPU;
    be->matmul = tk_matmul_fast_native(TIDE_BF16) ? TIDE_MATMUL_FAST : TIDE_MATMUL_F32; /* AUTO (backend.c) */
    *out = be;
    return TIDE_OK;
}
