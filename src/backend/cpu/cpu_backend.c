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
 * Workspace: the only workspace an op gets is op->scratch_bytes of `scratch`
 * (MATMUL with non-f32 weights, see graph/ops.c). Attention works in bounded tiles
 * on each thread's stack (under 96 KiB), so nothing is allocated in compute and
 * nothing needs reserving before a run.
 */
#include "backend/backend.h"
#include "backend/cpu/kernels.h"

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
    const tide_op_params *p = &op->p;
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
    const tide_op_params *p = &op->p;
    const tide_tensor *x = tin(g, op, 0);
    tk_rmsnorm(in[0], in[1], tin(g, op, 1)->dtype, x->shape[0], x->shape[1], p->eps, out[0], nt);
    return TIDE_OK;
}

static tide_status cpu_matmul(tide_ctx *ctx, int nt, const tide_graph *g, const tide_op *op, void *const *in,
                              void *const *out, void *scratch) {
    const tide_op_params *p = &op->p;
    const tide_tensor *x = tin(g, op, 0), *w = tin(g, op, 1), *o = tout(g, op, 0);
    float *dst = (float *)out[0] + p->row0 * o->shape[1] + p->col0;
    tide_status st = tk_matmul(in[0], in[1], w->dtype, x->shape[0], x->shape[1], w->shape[0], dst,
                               o->shape[1], scratch, scratch ? (size_t)op->scratch_bytes : 0, nt);
    if (st)
        return tide_err(ctx, st, "matmul '%s': dimensions beyond what BLAS takes", w->name);
    return TIDE_OK;
}

static tide_status cpu_rope(tide_ctx *ctx, int nt, const tide_graph *g, const tide_op *op, void *const *in,
                            void *const *out, void *scratch) {
    const tide_op_params *p = &op->p;
    const tide_tensor *x = tin(g, op, 0);
    tk_rope(in[0], (const int32_t *)in[1] + p->idx0, x->shape[0], x->shape[0] / p->batch, p->n_heads,
            p->head_dim, p->rope_theta, out[0], nt);
    return TIDE_OK;
}

static tide_status cpu_attention(tide_ctx *ctx, int nt, const tide_graph *g, const tide_op *op, void *const *in,
                                 void *const *out, void *scratch) {
    const tide_op_params *p = &op->p;
    /* the caches are outputs 1 and 2 (also inputs 4 and 5 unless fresh) */
    const tide_tensor *pos = tin(g, op, 3), *kc = &g->tensors[op->out[1]];
    const int32_t *pp = (const int32_t *)in[3] + p->idx0;
    tk_attn_dims d = {.B = p->batch, .T = tin(g, op, 0)->shape[0] / p->batch, .C = kc->shape[1],
                      .H = p->n_heads, .KV = p->n_kv_heads, .hd = p->head_dim};
    if (op->n_in == 4)
        for (int64_t t = 0; t < d.T; t++)
            if (pp[t] != t)
                return tide_err(ctx, TIDE_E_RANGE, "attention: a fresh cache needs positions 0..%lld, but "
                                "'%s'[%lld] is %d", (long long)d.T - 1, pos->name, (long long)t,
                                pp[t]);
    int64_t bad = -1;
    tide_status st = tk_attention(in[0], in[1], in[2], pp, out[1], out[2], out[0], &d, &bad, nt);
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

static tide_status cpu_add(tide_ctx *ctx, int nt, const tide_graph *g, const tide_op *op, void *const *in,
                           void *const *out, void *scratch) {
    tk_add(in[0], in[1], out[0], tide_tensor_numel(tin(g, op, 0)), nt);
    return TIDE_OK;
}

static tide_status cpu_take_last(tide_ctx *ctx, int nt, const tide_graph *g, const tide_op *op, void *const *in,
                                 void *const *out, void *scratch) {
    const tide_op_params *p = &op->p;
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

/* The kernel of each op kind (graph/ops.c has the kinds' contracts): a kind
 * without one here is unsupported on the CPU. */
typedef tide_status (*cpu_kernel)(tide_ctx *ctx, int nt, const tide_graph *g, const tide_op *op, void *const *in,
                                  void *const *out, void *scratch);
static const cpu_kernel cpu_kernels[TIDE_OP_COUNT] = {
    [TIDE_OP_EMBED] = cpu_embed,
    [TIDE_OP_RMSNORM] = cpu_rmsnorm,
    [TIDE_OP_MATMUL] = cpu_matmul,
    [TIDE_OP_ROPE] = cpu_rope,
    [TIDE_OP_ATTENTION] = cpu_attention,
    [TIDE_OP_SILU_MUL] = cpu_silu_mul,
    [TIDE_OP_ADD] = cpu_add,
    [TIDE_OP_TAKE_LAST] = cpu_take_last,
    [TIDE_OP_ARGMAX] = cpu_argmax,
    [TIDE_OP_GENERIC] = cpu_generic,
};

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
    be->matmul = TIDE_MATMUL_F32;
    *out = be;
    return TIDE_OK;
}
