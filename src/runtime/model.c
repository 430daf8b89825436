/*
 * model.c - a model ready to run: checkpoint weights bound to a backend, the KV
 * cache state that persists between graph runs, and greedy generation.
 *
 * Graphs run in one of two ways. Resident (the default): weights are used in
 * place when the backend computes in host memory (else uploaded once), state
 * lives for the model's lifetime, and each activation is allocated at its first
 * write and released after its last read. Offloaded (tide_model_set_offload):
 * each graph runs through a verified plan under a device budget (offload.c).
 * Both call the same kernels on the same backend, so their outputs are
 * bit-identical.
 */
#include "runtime/model_int.h"

#include <string.h>

uint64_t tide_hash_bytes(uint64_t h, const void *data, uint64_t n) {
    const unsigned char *p = data;
    if (!h) h = 1469598103934665603ull;
    for (uint64_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

void tide_model_slot_clear(graph_slot *s) {
    tide_exec_free(s->ex);
    tide_plan_free(s->plan);
    tide_free(s->timeline);
    tide_free(s->logits);
    tide_free(s->next);
    tide_graph_free(s->g);
    memset(s, 0, sizeof *s);
}

void tide_model_free(tide_model *m) {
    if (!m) return;
    for (int i = 0; i < 2; i++) tide_model_slot_clear(&m->slots[i]);
    tide_model_offload_release(m);
    tide_model_unpin(m);
    for (int i = 0; i < m->n_state; i++) {
        if (m->state[i].data) m->be->vt->dealloc(m->be, m->state[i].data);
        tide_free_aligned(m->state[i].host);
        tide_free(m->state[i].name);
    }
    tide_free(m->state);
    if (m->act) m->be->vt->dealloc(m->be, m->act);
    if (m->weights) {
        for (int i = 0; i < m->n_weights; i++)
            if (m->weights[i]) m->be->vt->dealloc(m->be, m->weights[i]);
        tide_free(m->weights);
    }
    tide_free(m);
}

state_buf *tide_model_state(tide_model *m, const char *name, uint64_t min_bytes) {
    for (int s = 0; s < m->n_state; s++)
        if (strcmp(m->state[s].name, name) == 0 && m->state[s].nbytes >= min_bytes) return &m->state[s];
    return NULL;
}

/* The KV cache table: one buffer per layer and k/v. On a backend computing in
 * host memory the buffers are allocated (zeroed) now and serve both kinds of
 * runs. On a device backend their device copies are made by the first
 * resident run (ensure_device_state) and released when offloading starts,
 * whose home for the cache is host memory (offload.c): an offloaded run then
 * holds no device memory but its arena. */
static tide_status alloc_state(tide_model *m) {
    const tide_llama_config *c = &m->cfg;
    int L = c->num_hidden_layers;
    uint64_t kd = (uint64_t)c->num_key_value_heads * (uint64_t)(c->hidden_size / c->num_attention_heads);
    uint64_t nbytes = (uint64_t)m->max_batch * (uint64_t)m->ctx_len * kd * sizeof(float);
    m->state = tide_calloc((size_t)L * 2, sizeof *m->state);
    if (!m->state) return tide_err(m->ctx, TIDE_E_NOMEM, "out of memory for the KV cache table");
    for (int l = 0; l < L; l++)
        for (int kv = 0; kv < 2; kv++) {
            state_buf *s = &m->state[m->n_state];
            char name[64];
            snprintf(name, sizeof name, "cache.%d.%c", l, kv ? 'v' : 'k');
            s->name = tide_strdup(name);
            if (!s->name) return tide_err(m->ctx, TIDE_E_NOMEM, "out of memory for the KV cache");
            m->n_state++;
            s->nbytes = nbytes;
            m->state_bytes += nbytes;
        }
    return m->be->vt->device_is_host ? tide_model_device_state(m) : TIDE_OK;
}

tide_status tide_model_device_state(tide_model *m) {
    tide_backend *be = m->be;
    void *zero = NULL;
    tide_status st = TIDE_OK;
    for (int i = 0; i < m->n_state && !st; i++) {
        state_buf *s = &m->state[i];
        if (s->data) continue;
        if (!zero && !(zero = tide_calloc(1, 1 << 20))) {
            st = tide_err(m->ctx, TIDE_E_NOMEM, "out of memory zeroing the KV cache");
            break;
        }
        st = be->vt->alloc(be, s->nbytes, &s->data);
        if (st) {
            st = tide_err(m->ctx, st, "cannot allocate the KV cache (%llu bytes per layer): %s",
                          (unsigned long long)(2 * s->nbytes), tide_ctx_last_error(m->ctx));
            break;
        }
        /* zero it so that nothing unwritten is ever read as garbage */
        for (uint64_t off = 0; off < s->nbytes && !st; off += 1 << 20)
            st = be->vt->to_device(be, NULL, (char *)s->data + off, zero,
                                   TIDE_MIN(s->nbytes - off, (uint64_t)1 << 20));
        if (st) { /* half zeroed: not a cache to keep */
            be->vt->dealloc(be, s->data);
            s->data = NULL;
        }
    }
    tide_free(zero);
    return st;
}

void tide_model_release_device(tide_model *m) {
    tide_backend *be = m->be;
    if (be->vt->device_is_host) return;
    if (m->act) be->vt->dealloc(be, m->act);
    m->act = NULL;
    m->act_bytes = 0;
    for (int i = 0; i < m->n_state; i++)
        if (m->state[i].data) {
            be->vt->dealloc(be, m->state[i].data);
            m->state[i].data = NULL;
        }
    if (m->weights) {
        for (int i = 0; i < m->n_weights; i++)
            if (m->weights[i]) be->vt->dealloc(be, m->weights[i]);
        tide_free(m->weights);
        m->weights = NULL;
    }
}

tide_status tide_model_new(tide_ctx *ctx, tide_checkpoint *ck, tide_backend *be,
                           const tide_model_opts *opts, tide_model **out) {
    *out = NULL;
    tide_model *m = tide_calloc(1, sizeof *m);
    if (!m) return tide_err(ctx, TIDE_E_NOMEM, "out of memory creating a model");
    m->ctx = ctx;
    m->ck = ck;
    m->be = be;
    m->cfg = *tide_checkpoint_config(ck);
    m->max_batch = opts && opts->max_batch > 0 ? opts->max_batch : 1;
    m->ctx_len = opts && opts->ctx_len > 0 ? opts->ctx_len : m->cfg.max_position_embeddings;
    tide_status st = TIDE_OK;
    if (m->ctx_len > m->cfg.max_position_embeddings)
        st = tide_err(ctx, TIDE_E_RANGE, "cache length %d exceeds the model's max_position_embeddings %d",
                      m->ctx_len, m->cfg.max_position_embeddings);
    /* check the checkpoint against the graph's weights once */
    tide_graph *g = NULL;
    if (!st) {
        tide_llama_graph_opts go = {.batch = 1, .seq = 1, .ctx_len = m->ctx_len};
        st = tide_llama_build(ctx, &m->cfg, &go, &g);
    }
    if (!st) st = tide_checkpoint_match(ck, g);
    if (!st) {
        m->weight_bytes = tide_graph_role_bytes(g, TIDE_ROLE_WEIGHT);
        m->n_weights = tide_checkpoint_n_tensors(ck);
    }
    tide_graph_free(g);
    if (!st) st = alloc_state(m);
    if (st) {
        tide_model_free(m);
        return st;
    }
    *out = m;
    return TIDE_OK;
}

/* A backend whose memory is not host memory gets every checkpoint tensor
 * uploaded once, on the first resident run (offloaded runs never need it). */
static tide_status upload_weights(tide_model *m) {
    if (m->weights || m->be->vt->device_is_host) return TIDE_OK;
    tide_backend *be = m->be;
    m->weights = tide_calloc((size_t)m->n_weights, sizeof *m->weights);
    if (!m->weights) return tide_err(m->ctx, TIDE_E_NOMEM, "out of memory for the weight table");
    tide_status st = TIDE_OK;
    for (int i = 0; !st && i < m->n_weights; i++) {
        tide_tensor_info ti;
        st = tide_checkpoint_get_index(m->ck, i, &ti);
        if (!st) st = be->vt->alloc(be, ti.nbytes, &m->weights[i]);
        if (!st) st = be->vt->to_device(be, NULL, m->weights[i], ti.data, ti.nbytes);
        tide_progress(m->ctx, "uploading", (uint64_t)i + 1, (uint64_t)m->n_weights);
    }
    if (st) {
        /* no half-uploaded table: it would pass for a complete one next time */
        for (int i = 0; i < m->n_weights; i++)
            if (m->weights[i]) be->vt->dealloc(be, m->weights[i]);
        tide_free(m->weights);
        m->weights = NULL;
    }
    return st;
}

/* The checkpoint tensor behind graph weight t, and the byte offset of t in it
 * (a block of a split weight is a byte range of its checkpoint tensor). */
tide_status tide_model_weight_home(tide_model *m, const tide_graph *g, int t, tide_tensor_info *ti,
                                   uint64_t *off) {
    const char *home = tide_graph_tensor_home(g, t, off);
    if (tide_checkpoint_get(m->ck, home, ti))
        return tide_err(m->ctx, TIDE_E_NOT_FOUND, "weight '%s' is not in the checkpoint", home);
    if (*off + g->tensors[t].nbytes > ti->nbytes || ti->dtype != g->tensors[t].dtype)
        return tide_err(m->ctx, TIDE_E_FORMAT, "weight '%s' is not a %s range of checkpoint tensor '%s'",
                        g->tensors[t].name, tide_dtype_name(g->tensors[t].dtype), home);
    return TIDE_OK;
}

/* The state buffer behind graph state t, and t's byte offset in it. */
tide_status tide_model_state_home(tide_model *m, const tide_graph *g, int t, state_buf **sb, uint64_t *off) {
    const char *home = tide_graph_tensor_home(g, t, off);
    *sb = tide_model_state(m, home, *off + g->tensors[t].nbytes);
    if (!*sb) return tide_err(m->ctx, TIDE_E_NOT_FOUND, "state '%s' is not held by the model", g->tensors[t].name);
    return TIDE_OK;
}

int tide_model_weight_index(const tide_model *m, const tide_tensor_info *ti) {
    for (int i = 0; i < m->n_weights; i++) {
        tide_tensor_info tj;
        if (tide_checkpoint_get_index(m->ck, i, &tj) == TIDE_OK && tj.data == ti->data) return i;
    }
    return -1;
}

/* Device pointer of graph weight t. */
static tide_status weight_ptr(tide_model *m, const tide_graph *g, int t, void **ptr) {
    tide_tensor_info ti;
    uint64_t off = 0;
    tide_status st = tide_model_weight_home(m, g, t, &ti, &off);
    if (st) return st;
    if (!m->weights) {
        *ptr = (char *)ti.data + off;
        return TIDE_OK;
    }
    int i = tide_model_weight_index(m, &ti);
    if (i >= 0) {
        *ptr = (char *)m->weights[i] + off;
        return TIDE_OK;
    }
    return tide_err(m->ctx, TIDE_E_NOT_FOUND, "weight '%s' was not uploaded", g->tensors[t].name);
}

/* The graph for (batch, seq); `fresh` when the run starts at position 0, so the
 * caches are written without being read (and never loaded when offloading). */
static tide_status get_graph(tide_model *m, int batch, int seq, bool all_logits, bool fresh, graph_slot **out) {
    for (int i = 0; i < 2; i++) {
        graph_slot *s = &m->slots[i];
        if (s->g && s->batch == batch && s->seq == seq && s->all_logits == all_logits && s->fresh == fresh) {
            *out = s;
            return TIDE_OK;
        }
    }
    tide_llama_graph_opts go = {.batch = batch, .seq = seq, .ctx_len = m->ctx_len, .all_logits = all_logits,
                                .fresh_cache = fresh};
    tide_graph *g = NULL;
    tide_status st = tide_llama_build(m->ctx, &m->cfg, &go, &g);
    if (st) return st;
    graph_slot *s = &m->slots[m->next_slot];
    m->next_slot ^= 1;
    if (m->last_planned == s) m->last_planned = NULL;
    tide_model_slot_clear(s);
    *s = (graph_slot){.g = g, .batch = batch, .seq = seq, .all_logits = all_logits, .fresh = fresh};
    s->logits = tide_malloc(tide_graph_tensor_bytes(g, tide_graph_find(g, "logits")));
    s->next = tide_malloc(tide_graph_tensor_bytes(g, tide_graph_find(g, "next_token")));
    if (!s->logits || !s->next) {
        tide_model_slot_clear(s);
        return tide_err(m->ctx, TIDE_E_NOMEM, "out of memory for a graph's outputs");
    }
    *out = s;
    return TIDE_OK;
}

/* ---------------------------------------------------------------- resident runs */

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

/* Runs g once with everything resident; copies the outputs to io. The
 * activations live in one device buffer (m->act, kept from run to run and
 * grown when a graph needs more), so nothing is allocated or freed per op: on
 * a GPU a free would wait for the device. The ops are issued asynchronously,
 * on a queue of the run's own with errors on m->ctx, where the backend has
 * events, and waited for once, at the end; elsewhere on the backend's default
 * queue. Inputs and outputs are copied on the default queue, synchronously. */
static tide_status run_resident(tide_model *m, tide_graph *g, const run_io *io) {
    tide_ctx *ctx = m->ctx;
    tide_backend *be = m->be;
    int nt = g->n_tensors;
    uint64_t *off = tide_malloc((size_t)(nt ? nt : 1) * sizeof *off);
    void **ptr = tide_calloc((size_t)(nt ? nt : 1), sizeof *ptr);
    void *q = NULL; /* the ops' queue: NULL, the default one, unless async */
    tide_status st = TIDE_OK;
    if (!ptr || !off) {
        st = tide_err(ctx, TIDE_E_NOMEM, "out of memory running a graph");
        goto done;
    }
    uint64_t scratch_off = 0, need = layout_resident(ctx, g, off, &scratch_off);
    if (!need) {
        st = TIDE_E_NOMEM;
        goto done;
    }
    if ((st = upload_weights(m)) || (st = tide_model_device_state(m))) goto done;
    if (need > m->act_bytes) {
        if (m->act) be->vt->dealloc(be, m->act);
        m->act = NULL;
        m->act_bytes = 0;
        if ((st = be->vt->alloc(be, need, &m->act))) {
            st = tide_err(ctx, st, "cannot allocate %llu bytes of activations: %s", (unsigned long long)need,
                          tide_ctx_last_error(ctx));
            goto done;
        }
        m->act_bytes = need;
    }
    m->peak_bytes = TIDE_MAX(m->peak_bytes, m->weight_bytes + m->state_bytes + need);
    char *act = m->act;
    void *scratch = act + scratch_off;

    for (int t = 0; t < nt && !st; t++) {
        const tide_tensor *tt = &g->tensors[t];
        if (tt->role == TIDE_ROLE_WEIGHT) {
            st = weight_ptr(m, g, t, &ptr[t]);
        } else if (tt->role == TIDE_ROLE_STATE) {
            state_buf *sb = NULL;
            uint64_t soff = 0;
            if (!(st = tide_model_state_home(m, g, t, &sb, &soff))) ptr[t] = (char *)sb->data + soff;
        } else if (off[t] != UINT64_MAX) {
            ptr[t] = act + off[t];
        }
        if (!st && tt->role == TIDE_ROLE_INPUT) {
            const void *src = !strcmp(tt->name, "tokens") ? (const void *)io->tokens
                            : !strcmp(tt->name, "pos") ? (const void *)io->pos : NULL;
            if (!src) st = tide_err(ctx, TIDE_E_INVALID, "no data for input '%s'", tt->name);
            else st = be->vt->to_device(be, NULL, ptr[t], src, tt->nbytes);
        }
    }
    /* asynchronous from here: the inputs above were copied synchronously, so
     * the caller's buffers are free again */
    if (!st && tide_async_issue(be) && (st = be->vt->queue_new(be, ctx, true, &q))) goto done;
    bool async = q != NULL;
    m->acc.async_issue = async;
    void *in[TIDE_OP_MAX_IN], *outp[TIDE_OP_MAX_OUT];
    for (int i = 0; i < g->n_ops && !st; i++) {
        const tide_op *op = &g->ops[i];
        for (int j = 0; j < op->n_out; j++) outp[j] = ptr[op->out[j]];
        for (int j = 0; j < op->n_in; j++) in[j] = ptr[op->in[j]];
        st = be->vt->compute(be, q, g, op, in, outp, op->scratch_bytes ? scratch : NULL);
        if (!async && op->layer >= 0 && (i + 1 == g->n_ops || g->ops[i + 1].layer != op->layer))
            tide_progress(ctx, "layer", (uint64_t)op->layer + 1, (uint64_t)m->cfg.num_hidden_layers);
    }
    /* always waited for: nothing may still run on the buffers when this
     * returns (the first failure's message is kept) */
    if (!st) {
        st = tide_backend_queue_sync(be, q);
    } else {
        tide_ctx *qc = tide_backend_queue_ctx(be, q);
        char msg[TIDE_ERRMSG_MAX];
        snprintf(msg, sizeof msg, "%s", tide_ctx_last_error(qc));
        if (tide_backend_queue_sync(be, q)) tide_err(qc, st, "%s", msg);
    }
    if (async) {
        be->vt->queue_free(be, q);
        if (!st) tide_progress(ctx, "layer", (uint64_t)m->cfg.num_hidden_layers, (uint64_t)m->cfg.num_hidden_layers);
    }
    int tl = tide_graph_find(g, "logits"), tn = tide_graph_find(g, "next_token");
    if (!st) st = be->vt->to_host(be, NULL, io->logits, ptr[tl], g->tensors[tl].nbytes);
    if (!st) st = be->vt->to_host(be, NULL, io->next, ptr[tn], g->tensors[tn].nbytes);
done:
    tide_free(ptr);
    tide_free(off);
    return st;
}

/* Runs a graph slot once (planned when offloading) and folds its logits into
 * the model's hash. Outputs the caller does not want (NULL) go to the slot's
 * own buffers. */
static tide_status run_graph(tide_model *m, graph_slot *s, run_io io) {
    uint64_t lb = tide_graph_tensor_bytes(s->g, tide_graph_find(s->g, "logits"));
    if (!io.logits) io.logits = s->logits;
    if (!io.next) io.next = s->next;
    tide_status st = m->offload ? tide_model_run_planned(m, s, &io) : run_resident(m, s->g, &io);
    if (!st) m->logits_hash = tide_hash_bytes(m->logits_hash, io.logits, lb);
    return st;
}

static tide_status check_tokens(tide_model *m, const int32_t *tokens, int n) {
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= m->cfg.vocab_size)
            return tide_err(m->ctx, TIDE_E_RANGE, "token id %d at position %d is outside the vocabulary "
                            "(0 to %d)", tokens[i], i, m->cfg.vocab_size - 1);
    return TIDE_OK;
}

tide_status tide_model_forward(tide_model *m, const int32_t *tokens, int batch, int seq,
                               int start_pos, float *logits) {
    if (batch < 1 || seq < 1 || batch > m->max_batch)
        return tide_err(m->ctx, TIDE_E_INVALID, "batch %d (model holds %d) and seq %d must be >= 1",
                        batch, m->max_batch, seq);
    if (start_pos < 0 || (int64_t)start_pos + seq > m->ctx_len)
        return tide_err(m->ctx, TIDE_E_RANGE, "positions %d..%d exceed the cache length %d", start_pos,
                        start_pos + seq - 1, m->ctx_len);
    tide_status st = check_tokens(m, tokens, batch * seq);
    if (st) return st;
    graph_slot *s = NULL;
    if ((st = get_graph(m, batch, seq, true, start_pos == 0, &s))) return st;
    int32_t *pos = tide_malloc((size_t)seq * sizeof *pos);
    if (!pos) return tide_err(m->ctx, TIDE_E_NOMEM, "out of memory");
    for (int i = 0; i < seq; i++) pos[i] = start_pos + i;
    st = run_graph(m, s, (run_io){.tokens = tokens, .pos = pos, .logits = logits});
    tide_free(pos);
    return st;
}

tide_status tide_model_generate(tide_model *m, const int32_t *prompt, int n_prompt, int n_new,
                                int32_t *out_tokens, tide_gen_stats *stats) {
    if (n_prompt < 1 || n_new < 0)
        return tide_err(m->ctx, TIDE_E_INVALID, "a prompt of at least one token is needed");
    if ((int64_t)n_prompt + n_new - 1 > m->ctx_len)
        return tide_err(m->ctx, TIDE_E_RANGE, "%d prompt + %d new tokens need %d positions; the cache "
                        "holds %d", n_prompt, n_new, n_prompt + n_new - 1, m->ctx_len);
    tide_status st = check_tokens(m, prompt, n_prompt);
    if (st) return st;
    int32_t *pos = tide_malloc((size_t)n_prompt * sizeof *pos);
    if (!pos) return tide_err(m->ctx, TIDE_E_NOMEM, "out of memory");
    for (int i = 0; i < n_prompt; i++) pos[i] = i;
    memset(&m->acc, 0, sizeof m->acc);
    m->logits_hash = 0;
    graph_slot *s = NULL;
    int32_t next = 0;
    double t0 = tide_now(), pred0 = 0;
    if (n_new > 0) {
        st = get_graph(m, 1, n_prompt, false, true, &s);
        if (!st) st = run_graph(m, s, (run_io){.tokens = prompt, .pos = pos, .next = &next});
        if (!st) out_tokens[0] = next;
        pred0 = m->acc.predicted_s;
    }
    double t1 = tide_now();
    tide_free(pos);
    for (int i = 1; i < n_new && !st; i++) {
        int32_t p = n_prompt + i - 1, tok = next;
        st = get_graph(m, 1, 1, false, false, &s);
        if (!st) st = run_graph(m, s, (run_io){.tokens = &tok, .pos = &p, .next = &next});
        if (!st) out_tokens[i] = next;
        tide_progress(m->ctx, "token", (uint64_t)i + 1, (uint64_t)n_new);
    }
    double t2 = tide_now();
    if (st) return st;
    tide_gen_stats r = m->acc;
    r.prefill_s = t1 - t0;
    r.decode_s = t2 - t1;
    r.prefill_tokens = n_new > 0 ? n_prompt : 0;
    r.decode_tokens = n_new > 1 ? n_new - 1 : 0;
    r.prefill_tokens_per_s = r.prefill_s > 0 ? r.prefill_tokens / r.prefill_s : 0;
    r.decode_tokens_per_s = r.decode_s > 0 ? r.decode_tokens / r.decode_s : 0;
    r.peak_bytes = m->offload ? m->weight_bytes + m->state_bytes + m->acc.peak_device_bytes : m->peak_bytes;
    r.weight_bytes = m->weight_bytes;
    r.state_bytes = m->state_bytes;
    r.predicted_prefill_s = pred0;
    r.logits_hash = m->logits_hash;
    if (stats) *stats = r;
    return TIDE_OK;
}
