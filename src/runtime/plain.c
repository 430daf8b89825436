/*
 * plain.c - the plain engine: the reference every planned run is checked
 * against. It runs a graph's ops in order on the backend with every tensor
 * resident: weights where the checkpoint maps them (uploaded once to a device
 * that is not host memory), the KV cache in the model's buffers (a device
 * copy on such a device), everything else in one buffer laid out in op order
 * and kept from run to run. It shares nothing with the planned engine but the
 * kernels: no planner, verifier, executor or runner, so a bug there cannot
 * hide in a comparison with it.
 *
 * Ops are issued asynchronously, on a queue of the run's own, where the
 * backend has events, and waited for once, at the end; elsewhere on the
 * model's synchronous queue (tide_model_queue), as are the uploads and the
 * copies of inputs and outputs. Every queue is made on the model's context,
 * so a failure names its cause there, not on the backend's context.
 */
#include "runtime/model_int.h"

void tide_plain_release(tide_model *m) {
    tide_backend *be = m->be;
    if (m->act) be->vt->dealloc(be, m->act);
    m->act = NULL;
    m->act_bytes = 0;
    for (int i = 0; i < m->n_state; i++)
        if (m->state[i].dev) {
            be->vt->dealloc(be, m->state[i].dev);
            m->state[i].dev = NULL;
        }
    if (m->dev_weights) {
        for (int i = 0; i < m->n_weights; i++)
            if (m->dev_weights[i]) be->vt->dealloc(be, m->dev_weights[i]);
        tide_free(m->dev_weights);
        m->dev_weights = NULL;
    }
}

/* A device that is not host memory gets every checkpoint tensor uploaded
 * once (on q, the model's queue), and zeroed device copies of the cache. */
static tide_status upload(tide_model *m, void *q) {
    tide_backend *be = m->be;
    if (be->vt->device_is_host || m->dev_weights) return TIDE_OK;
    tide_status st = TIDE_OK;
    void *zero = tide_calloc(1, 1 << 20);
    m->dev_weights = tide_calloc((size_t)(m->n_weights ? m->n_weights : 1), sizeof *m->dev_weights);
    if (!zero || !m->dev_weights) st = tide_err(m->ctx, TIDE_E_NOMEM, "out of memory uploading the weights");
    for (int i = 0; !st && i < m->n_weights; i++) {
        tide_tensor_info ti;
        st = tide_checkpoint_get_index(m->ck, i, &ti);
        if (!st && (st = be->vt->alloc(be, ti.nbytes ? ti.nbytes : 1, &m->dev_weights[i])))
            st = tide_model_be_fail(m, NULL, st, "cannot allocate the weights on the device");
        if (!st && (st = be->vt->to_device(be, q, m->dev_weights[i], ti.data, ti.nbytes)))
            st = tide_model_be_fail(m, q, st, "cannot upload the weights");
        tide_progress(m->ctx, "uploading", (uint64_t)i + 1, (uint64_t)m->n_weights);
    }
    for (int i = 0; !st && i < m->n_state; i++) {
        state_buf *s = &m->state[i];
        st = be->vt->alloc(be, s->nbytes, &s->dev);
        if (st) st = tide_err(m->ctx, st, "cannot allocate the KV cache (%llu bytes per layer): %s",
                              (unsigned long long)(2 * s->nbytes), tide_ctx_last_error(be->ctx));
        for (uint64_t off = 0; off < s->nbytes && !st; off += 1 << 20) {
            size_t n = (size_t)TIDE_MIN(s->nbytes - off, (uint64_t)1 << 20);
            if ((st = be->vt->to_device(be, q, (char *)s->dev + off, zero, n)))
                st = tide_model_be_fail(m, q, st, "cannot zero the KV cache on the device");
        }
    }
    tide_free(zero);
    /* no half-uploaded copies: they would pass for complete ones next time */
    if (st) tide_plain_release(m);
    return st;
}

/* Device pointer of graph weight t. */
static tide_status weight_ptr(tide_model *m, const tide_graph *g, int t, void **ptr) {
    tide_tensor_info ti;
    uint64_t off = 0;
    tide_status st = tide_model_weight_home(m, g, t, &ti, &off);
    if (st) return st;
    int i = m->dev_weights ? tide_model_weight_index(m, &ti) : -1;
    if (m->dev_weights && i < 0)
        return tide_err(m->ctx, TIDE_E_NOT_FOUND, "weight '%s' was not uploaded", g->tensors[t].name);
    *ptr = (m->dev_weights ? (char *)m->dev_weights[i] : (char *)ti.data) + off;
    return TIDE_OK;
}

#define ACT_ALIGN ((uint64_t)256)

typedef struct act_free {
    uint64_t off, size;
} act_free;

/* The offset allocator of a resident run's layout: free ranges below `top`,
 * in address order, merged when adjacent; best fit, else the top grows. */
typedef struct act_alloc {
    act_free *f;
    int n, cap;
    uint64_t top;
} act_alloc;

static uint64_t act_take(act_alloc *a, uint64_t size) {
    size = (size + ACT_ALIGN - 1) & ~(ACT_ALIGN - 1);
    int best = -1;
    for (int i = 0; i < a->n; i++)
        if (a->f[i].size >= size && (best < 0 || a->f[i].size < a->f[best].size)) best = i;
    if (best >= 0) {
        uint64_t off = a->f[best].off;
        a->f[best].off += size;
        a->f[best].size -= size;
        if (!a->f[best].size) memmove(&a->f[best], &a->f[best + 1], (size_t)(--a->n - best) * sizeof *a->f);
        return off;
    }
    /* a free range ending at the top grows with it */
    uint64_t off = a->top;
    if (a->n && a->f[a->n - 1].off + a->f[a->n - 1].size == a->top) off = a->f[--a->n].off;
    a->top = off + size;
    return off;
}

static int act_give(act_alloc *a, uint64_t off, uint64_t size) {
    size = (size + ACT_ALIGN - 1) & ~(ACT_ALIGN - 1);
    int i = 0;
    while (i < a->n && a->f[i].off < off) i++;
    bool left = i > 0 && a->f[i - 1].off + a->f[i - 1].size == off;
    bool right = i < a->n && off + size == a->f[i].off;
    if (left && right) {
        a->f[i - 1].size += size + a->f[i].size;
        memmove(&a->f[i], &a->f[i + 1], (size_t)(--a->n - i) * sizeof *a->f);
    } else if (left) {
        a->f[i - 1].size += size;
    } else if (right) {
        a->f[i].off = off;
        a->f[i].size += size;
    } else {
        if (tide_grow((void **)&a->f, &a->cap, a->n + 1, sizeof *a->f)) return -1;
        memmove(&a->f[i + 1], &a->f[i], (size_t)(a->n - i) * sizeof *a->f);
        a->f[i] = (act_free){off, size};
        a->n++;
    }
    return 0;
}

/* Lays out the inputs, outputs and activations of g (everything that is not a
 * weight or the KV cache) in one buffer, in op order: a tensor takes its range
 * when first written (inputs from the start) and gives it back after its last
 * use (outputs never). off[t] = UINT64_MAX for the rest. Returns the bytes
 * needed (the op scratch, shared by all ops, comes last), or 0 with a message
 * when out of memory. */
static uint64_t layout_resident(tide_ctx *ctx, const tide_graph *g, uint64_t *off, uint64_t *scratch_off) {
    act_alloc a = {0};
    int nt = g->n_tensors;
    int *last_use = tide_malloc((size_t)(nt ? nt : 1) * sizeof *last_use);
    int fail = !last_use;
    uint64_t scratch = 0;
    for (int t = 0; t < nt; t++) off[t] = UINT64_MAX;
    for (int t = 0; t < nt && !fail; t++) last_use[t] = -1;
    for (int i = 0; i < g->n_ops && !fail; i++)
        for (int j = 0; j < g->ops[i].n_in + g->ops[i].n_out; j++)
            last_use[j < g->ops[i].n_in ? g->ops[i].in[j] : g->ops[i].out[j - g->ops[i].n_in]] = i;
    for (int t = 0; t < nt && !fail; t++)
        if (g->tensors[t].role == TIDE_ROLE_INPUT) off[t] = act_take(&a, g->tensors[t].nbytes);
    for (int i = 0; i < g->n_ops && !fail; i++) {
        const tide_op *op = &g->ops[i];
        scratch = TIDE_MAX(scratch, op->scratch_bytes);
        for (int j = 0; j < op->n_out && !fail; j++) {
            int t = op->out[j];
            tide_role r = g->tensors[t].role;
            if (off[t] == UINT64_MAX && r != TIDE_ROLE_WEIGHT && r != TIDE_ROLE_STATE)
                off[t] = act_take(&a, g->tensors[t].nbytes);
        }
        for (int j = 0; j < op->n_in + op->n_out && !fail; j++) {
            int t = j < op->n_in ? op->in[j] : op->out[j - op->n_in];
            tide_role r = g->tensors[t].role;
            if (last_use[t] == i && off[t] != UINT64_MAX && (r == TIDE_ROLE_TEMP || r == TIDE_ROLE_INPUT)) {
                fail = act_give(&a, off[t], g->tensors[t].nbytes);
                last_use[t] = -2; /* given back once, though an op may name it twice */
            }
        }
    }
    tide_free(a.f);
    tide_free(last_use);
    if (fail) {
        tide_err(ctx, TIDE_E_NOMEM, "out of memory laying out a graph's activations");
        return 0;
    }
    *scratch_off = a.top;
    return a.top + TIDE_MAX(scratch, 1);
}

/* The host buffer bound to name among n bindings, or NULL. */
static void *bound(const tide_binding *b, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (!strcmp(b[i].name, name)) return b[i].data;
    return NULL;
}

/* Device pointers of g's tensors: weights and cache from the model, the rest
 * in the activation buffer (grown when g needs more); *scratch is the ops'
 * shared scratch. */
static tide_status bind_all(tide_model *m, const tide_graph *g, void **ptr, void **scratch) {
    tide_ctx *ctx = m->ctx;
    tide_backend *be = m->be;
    int nt = g->n_tensors;
    uint64_t *off = tide_malloc((size_t)(nt ? nt : 1) * sizeof *off);
    if (!off) return tide_err(ctx, TIDE_E_NOMEM, "out of memory running a graph");
    uint64_t scratch_off = 0, need = layout_resident(ctx, g, off, &scratch_off);
    tide_status st = need ? TIDE_OK : TIDE_E_NOMEM;
    if (!st && need > m->act_bytes) {
        if (m->act) be->vt->dealloc(be, m->act);
        m->act = NULL;
        m->act_bytes = 0;
        if ((st = be->vt->alloc(be, need, &m->act)))
            st = tide_err(ctx, st, "cannot allocate %llu bytes of activations: %s", (unsigned long long)need,
                          tide_ctx_last_error(be->ctx));
        else m->act_bytes = need;
    }
    if (!st) m->peak_bytes = TIDE_MAX(m->peak_bytes, m->weight_bytes + m->state_bytes + need);
    for (int t = 0; t < nt && !st; t++) {
        const tide_tensor *tt = &g->tensors[t];
        if (tt->role == TIDE_ROLE_WEIGHT) {
            st = weight_ptr(m, g, t, &ptr[t]);
        } else if (tt->role == TIDE_ROLE_STATE) {
            state_buf *sb = NULL;
            uint64_t soff = 0;
            if (!(st = tide_model_state_home(m, g, t, &sb, &soff)))
                ptr[t] = (char *)(sb->dev ? sb->dev : sb->host) + soff;
        } else if (off[t] != UINT64_MAX) {
            ptr[t] = (char *)m->act + off[t];
        }
    }
    *scratch = st ? NULL : (char *)m->act + scratch_off;
    tide_free(off);
    return st;
}

tide_status tide_plain_run(tide_model *m, const tide_graph *g, const tide_binding *in, int n_in,
                           const tide_binding *out, int n_out) {
    tide_ctx *ctx = m->ctx;
    tide_backend *be = m->be;
    int nt = g->n_tensors;
    void **ptr = tide_calloc((size_t)(nt ? nt : 1), sizeof *ptr);
    void *sq = NULL, *scratch = NULL; /* the model's synchronous queue (NULL: be has none) */
    tide_status st = ptr ? tide_model_queue(m, &sq) : tide_err(ctx, TIDE_E_NOMEM, "out of memory running a graph");
    if (!st) st = upload(m, sq);
    if (!st) st = bind_all(m, g, ptr, &scratch);
    for (int t = 0; t < nt && !st; t++) {
        const tide_tensor *tt = &g->tensors[t];
        if (tt->role != TIDE_ROLE_INPUT) continue;
        const void *src = bound(in, n_in, tt->name);
        if (!src) st = tide_err(ctx, TIDE_E_INVALID, "no data for input '%s'", tt->name);
        else if ((st = be->vt->to_device(be, sq, ptr[t], src, tt->nbytes)))
            st = tide_model_be_fail(m, sq, st, "cannot copy an input to the device");
    }
    /* asynchronous from here: the inputs above were copied synchronously, so
     * the caller's buffers are free again */
    void *q = sq; /* the ops' queue */
    bool async = false;
    if (!st && !m->sync_issue && tide_backend_has_events(be)) {
        if ((st = be->vt->queue_new(be, ctx, true, &q))) goto done;
        async = true;
    }
    m->acc.async_issue = async;
    bool issued = !st; /* a failure from here on is the ops' queue's */
    void *ip[TIDE_OP_MAX_IN], *op_out[TIDE_OP_MAX_OUT];
    for (int i = 0; i < g->n_ops && !st; i++) {
        const tide_op *op = &g->ops[i];
        for (int j = 0; j < op->n_out; j++) op_out[j] = ptr[op->out[j]];
        for (int j = 0; j < op->n_in; j++) ip[j] = ptr[op->in[j]];
        st = be->vt->compute(be, q, g, op, ip, op_out, op->scratch_bytes ? scratch : NULL);
        if (!async && op->layer >= 0 && (i + 1 == g->n_ops || g->ops[i + 1].layer != op->layer))
            tide_progress(ctx, "layer", (uint64_t)op->layer + 1, (uint64_t)m->cfg.num_hidden_layers);
    }
    /* always waited for: nothing may still run on the buffers when this
     * returns (the first failure's message is kept, on the model's context) */
    tide_ctx *qc = tide_backend_queue_ctx(be, q);
    if (!st) {
        st = tide_backend_queue_sync(be, q);
    } else {
        char msg[TIDE_ERRMSG_MAX];
        snprintf(msg, sizeof msg, "%s", tide_ctx_last_error(qc));
        if (tide_backend_queue_sync(be, q)) tide_err(qc, st, "%s", msg);
    }
    if (st && issued && qc != ctx) tide_err(ctx, st, "%s", tide_ctx_last_error(qc)); /* be has no queues */
    if (async) {
        be->vt->queue_free(be, q);
        if (!st) tide_progress(ctx, "layer", (uint64_t)m->cfg.num_hidden_layers, (uint64_t)m->cfg.num_hidden_layers);
    }
    for (int k = 0; k < n_out && !st; k++) {
        int t = tide_graph_find(g, out[k].name);
        if (t < 0) st = tide_err(ctx, TIDE_E_NOT_FOUND, "the graph has no output '%s'", out[k].name);
        else if ((st = be->vt->to_host(be, sq, out[k].data, ptr[t], g->tensors[t].nbytes)))
            st = tide_model_be_fail(m, sq, st, "cannot copy an output from the device");
    }
done:
    tide_free(ptr);
    return st;
}
