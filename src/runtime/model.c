/*
 * model.c - a model's resources and settings: the checkpoint it was made
 * from, the KV cache's homes, pinned copies of the weights, the queue its own
 * backend calls go on, and which engine and which budget its graphs run with
 * (model_int.h shows how the runtime's files divide the work).
 *
 * Switching engines or budgets drops every slot (its plan is made again on
 * next use) and whatever device memory the previous setting held; the cache's
 * contents are not carried from one setting to the next: its homes are zeroed.
 * Asking for the setting in effect (the engine it runs, resident while
 * resident) changes nothing, the cache included.
 */
#include "probe/probe.h"
#include "runtime/model_int.h"
#include "runtime/session.h"

#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

uint64_t tide_hash_bytes(uint64_t h, const void *data, uint64_t n) {
    const unsigned char *p = data;
    if (!h) h = 1469598103934665603ull;
    for (uint64_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

void tide_model_slot_clear(graph_slot *s) {
    tide_runner_free(s->run);
    tide_free(s->logits);
    tide_free(s->next);
    tide_graph_free(s->g);
    memset(s, 0, sizeof *s);
}

void tide_model_clear_slots(tide_model *m) {
    for (int i = 0; i < MODEL_SLOTS; i++) tide_model_slot_clear(&m->slots[i]);
    m->last_planned = NULL;
}

/* ---------------------------------------------------------------- pinned weights */

static void unpin(tide_model *m) {
    if (!m->pinned) return;
    for (int i = 0; i < m->n_weights; i++) {
        if (!m->pinned[i]) continue;
        if (m->pinned_by_be) {
            m->be->vt->host_free(m->be, m->pinned[i]);
        } else {
            tide_tensor_info ti;
            if (tide_checkpoint_get_index(m->ck, i, &ti) == TIDE_OK) munlock(m->pinned[i], ti.nbytes);
            tide_free_aligned(m->pinned[i]);
        }
    }
    tide_free(m->pinned);
    m->pinned = NULL;
    m->pinned_bytes = 0;
}

/* Copies the checkpoint's tensors into pinned host memory (host_alloc; on a
 * backend without it, aligned memory locked with mlock), in checkpoint order,
 * while the copies stay within half the host memory available before the
 * first copy. A refused allocation ends the pinning without failing: the
 * tensors left out are loaded from the memory-mapped checkpoint, and the
 * model's notice says how much was pinned. */
static tide_status pin_weights(tide_model *m) {
    tide_backend *be = m->be;
    if (!m->pinned) {
        m->pinned = tide_calloc((size_t)(m->n_weights ? m->n_weights : 1), sizeof *m->pinned);
        if (!m->pinned) return tide_err(m->ctx, TIDE_E_NOMEM, "out of memory for the pinned weight table");
        m->pinned_by_be = be->vt->host_alloc != NULL;
    }
    uint64_t total = 0;
    for (int i = 0; i < m->n_weights; i++) {
        tide_tensor_info ti;
        if (tide_checkpoint_get_index(m->ck, i, &ti) == TIDE_OK) total += ti.nbytes;
    }
    uint64_t limit = m->pinned_bytes + tide_host_available() / 2;
    const char *why = NULL;
    for (int i = 0; i < m->n_weights && !why; i++) {
        tide_tensor_info ti;
        tide_status st = tide_checkpoint_get_index(m->ck, i, &ti);
        if (st) return st;
        if (m->pinned[i]) continue;
        if (m->pinned_bytes + ti.nbytes > limit) {
            why = "half the available host memory";
            break;
        }
        void *p = NULL;
        if (m->pinned_by_be) {
            if (be->vt->host_alloc(be, ti.nbytes ? ti.nbytes : 1, &p)) {
                tide_err_clear(be->ctx);
                why = "the pinned allocation was refused";
                break;
            }
        } else {
            p = tide_malloc_aligned(ti.nbytes ? ti.nbytes : 1, 4096);
            if (!p) {
                why = "out of host memory";
                break;
            }
            /* where locking is refused the copy is still a private, resident one */
            if (ti.nbytes) (void)mlock(p, ti.nbytes);
        }
        memcpy(p, ti.data, ti.nbytes);
        m->pinned[i] = p;
        m->pinned_bytes += ti.nbytes;
        tide_progress(m->ctx, "pinning", (uint64_t)i + 1, (uint64_t)m->n_weights);
    }
    if (why && !m->notice[0])
        snprintf(m->notice, sizeof m->notice, "%llu of %llu weight bytes pinned (%s); the rest is loaded from the "
                 "memory-mapped checkpoint (pageable memory)", (unsigned long long)m->pinned_bytes,
                 (unsigned long long)total, why);
    return TIDE_OK;
}

void *tide_model_weight_host(tide_model *m, const tide_tensor_info *ti, uint64_t off) {
    int i = m->pinned ? tide_model_weight_index(m, ti) : -1;
    return i >= 0 && m->pinned[i] ? (char *)m->pinned[i] + off : (char *)ti->data + off;
}

/* ---------------------------------------------------------------- homes */

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

int tide_model_weight_index(const tide_model *m, const tide_tensor_info *ti) {
    for (int i = 0; i < m->n_weights; i++) {
        tide_tensor_info tj;
        if (tide_checkpoint_get_index(m->ck, i, &tj) == TIDE_OK && tj.data == ti->data) return i;
    }
    return -1;
}

tide_status tide_model_state_home(tide_model *m, const tide_graph *g, int t, state_buf **sb, uint64_t *off) {
    const char *home = tide_graph_tensor_home(g, t, off);
    for (int s = 0; s < m->n_state; s++)
        if (strcmp(m->state[s].name, home) == 0 && m->state[s].nbytes >= *off + g->tensors[t].nbytes) {
            *sb = &m->state[s];
            return TIDE_OK;
        }
    *sb = NULL;
    return tide_err(m->ctx, TIDE_E_NOT_FOUND, "state '%s' is not held by the model", g->tensors[t].name);
}

/* The KV cache table: one buffer per layer and k/v, its home in host memory
 * (zeroed, so that nothing unwritten is ever read as garbage). */
static void state_free_host(tide_model *m, state_buf *s) {
    if (s->pinned) m->be->vt->host_free(m->be, s->host);
    else tide_free_aligned(s->host);
    s->host = NULL;
    s->pinned = false;
}

static tide_status alloc_state(tide_model *m) {
    const tide_llama_config *c = &m->cfg;
    int L = c->num_hidden_layers;
    uint64_t kd = (uint64_t)c->num_key_value_heads * (uint64_t)(c->hidden_size / c->num_attention_heads);
    uint64_t nbytes = (uint64_t)m->max_batch * (uint64_t)m->ctx_len * tide_dtype_bytes(m->cache_dtype, kd);
    m->state = tide_calloc((size_t)L * 2, sizeof *m->state);
    if (!m->state) return tide_err(m->ctx, TIDE_E_NOMEM, "out of memory for the KV cache table");
    for (int l = 0; l < L; l++)
        for (int kv = 0; kv < 2; kv++) {
            state_buf *s = &m->state[m->n_state];
            char name[64];
            snprintf(name, sizeof name, "cache.%d.%c", l, kv ? 'v' : 'k');
            s->name = tide_strdup(name);
            /* page-locked where the backend gives it: a cache offloaded to
             * the host moves every decode step, and a GPU copies pageable
             * memory through a staging buffer at a fraction of the link */
            if (m->be->vt->host_alloc && m->be->vt->host_alloc(m->be, nbytes ? nbytes : 1, &s->host) == TIDE_OK)
                s->pinned = true;
            else if (m->be->vt->host_alloc) {
                tide_err_clear(m->be->ctx);
                if (!m->state_notice[0])
                    snprintf(m->state_notice, sizeof m->state_notice, "the KV cache's pinned allocation was refused "
                             "(%.63s); what was refused is in pageable memory and moves slower", name);
            }
            if (!s->host) s->host = tide_malloc_aligned(nbytes ? nbytes : 1, 4096);
            if (!s->name || !s->host) {
                tide_free(s->name);
                if (s->host) state_free_host(m, s);
                return tide_err(m->ctx, TIDE_E_NOMEM, "cannot allocate the KV cache (%llu bytes per layer)",
                                (unsigned long long)(2 * nbytes));
            }
            memset(s->host, 0, nbytes);
            m->n_state++;
            s->nbytes = nbytes;
            m->state_bytes += nbytes;
        }
    return TIDE_OK;
}

static void zero_state(tide_model *m) {
    for (int i = 0; i < m->n_state; i++) memset(m->state[i].host, 0, m->state[i].nbytes);
}

/* ---------------------------------------------------------------- backend calls */

tide_status tide_model_queue(tide_model *m, void **q) {
    if (!m->q && m->be->vt->queue_new) {
        void *nq = NULL;
        tide_status st = m->be->vt->queue_new(m->be, m->ctx, false, &nq);
        if (st) return st;
        m->q = nq;
    }
    *q = m->q;
    return TIDE_OK;
}

tide_status tide_model_be_fail(tide_model *m, void *q, tide_status st, const char *what) {
    return tide_err(m->ctx, st, "%s: %s", what, tide_ctx_last_error(tide_backend_queue_ctx(m->be, q)));
}

/* ---------------------------------------------------------------- life */

void tide_model_free(tide_model *m) {
    if (!m) return;
    tide_model_clear_slots(m);
    tide_planned_release(m);
    tide_plain_release(m);
    if (m->q) m->be->vt->queue_free(m->be, m->q);
    unpin(m);
    for (int i = 0; i < m->n_state; i++) {
        state_free_host(m, &m->state[i]);
        tide_free(m->state[i].name);
    }
    tide_free(m->state);
    tide_free(m->off_ssd_dirs);
    tide_free(m->lora_scale);
    tide_free(m);
}

tide_status tide_model_new(tide_ctx *ctx, tide_checkpoint *ck, tide_backend *be,
                           const tide_model_opts *opts, tide_model **out) {
    *out = NULL;
    TIDE_OPTS_SIZE_CHECK(ctx, tide_model_opts, opts);
    tide_model *m = tide_calloc(1, sizeof *m);
    if (!m) return tide_err(ctx, TIDE_E_NOMEM, "out of memory creating a model");
    m->ctx = ctx;
    m->ck = ck;
    m->be = be;
    m->cfg = *tide_checkpoint_config(ck);
    m->max_batch = opts && opts->max_batch > 0 ? opts->max_batch : 1;
    m->warm_decode = -1;
    m->ctx_len = opts && opts->ctx_len > 0 ? opts->ctx_len : m->cfg.max_position_embeddings;
    m->sync_issue = opts && opts->sync_issue;
    m->cache_dtype = opts ? opts->cache_dtype : TIDE_F32;
    tide_status st = TIDE_OK;
    if (m->ctx_len > m->cfg.max_position_embeddings)
        st = tide_err(ctx, TIDE_E_RANGE, "cache length %d exceeds the model's max_position_embeddings %d",
                      m->ctx_len, m->cfg.max_position_embeddings);
    /* check the checkpoint against the graph's weights once */
    tide_graph *g = NULL;
    if (!st) {
        tide_llama_graph_opts go = {.batch = 1, .seq = 1, .ctx_len = m->ctx_len, .cache_dtype = m->cache_dtype};
        st = tide_llama_build(ctx, &m->cfg, &go, &g);
    }
    if (!st) st = tide_checkpoint_match(ck, g);
    if (!st) {
        m->weight_bytes = tide_graph_role_bytes(g, TIDE_ROLE_WEIGHT);
        m->n_weights = tide_checkpoint_n_tensors(ck);
    }
    tide_graph_free(g);
    if (!st && m->cfg.lora_r > 0) {
        const size_t r = (size_t)m->cfg.lora_r;
        if (!(m->lora_scale = tide_calloc(r * r, sizeof *m->lora_scale)))
            st = tide_err(ctx, TIDE_E_NOMEM, "out of memory for the LoRA scale");
        for (size_t i = 0; !st && i < r; i++) m->lora_scale[i * r + i] = m->cfg.lora_alpha / (float)m->cfg.lora_r;
    }
    if (!st) st = alloc_state(m);
    if (st) {
        tide_model_free(m);
        return st;
    }
    *out = m;
    return TIDE_OK;
}

/* ---------------------------------------------------------------- settings */

/* Back to the default: resident, nothing planned, nothing held on the device
 * but what the engine about to run makes itself. */
static void reset_setting(tide_model *m) {
    tide_model_clear_slots(m);
    tide_planned_release(m);
    tide_plain_release(m);
    zero_state(m);
    m->offload = false;
    m->notice[0] = '\0';
}

tide_status tide_model_set_engine(tide_model *m, tide_engine engine) {
    if ((unsigned)engine > TIDE_ENGINE_PLAIN) return tide_err(m->ctx, TIDE_E_INVALID, "unknown engine %d", (int)engine);
    if (engine == TIDE_ENGINE_PLAIN && m->offload)
        return tide_err(m->ctx, TIDE_E_INVALID, "the plain engine runs resident only: switch offloading off first");
    if (engine == m->engine) return TIDE_OK;
    reset_setting(m);
    unpin(m);
    m->engine = engine;
    return TIDE_OK;
}

tide_status tide_model_set_offload(tide_model *m, const tide_offload_opts *o) {
    TIDE_OPTS_SIZE_CHECK(m->ctx, tide_offload_opts, o);
    tide_policy pol = TIDE_POLICY_TIDE;
    bool on = o && o->budget_kind != TIDE_BUDGET_NONE;
    if (on && o->policy && tide_policy_parse(o->policy, &pol))
        return tide_err(m->ctx, TIDE_E_INVALID, "unknown policy '%s' (tide, static-layer or lru)", o->policy);
    if (on && pol == TIDE_POLICY_ZERO_OFFLOAD)
        return tide_err(m->ctx, TIDE_E_INVALID, "policy zero-offload runs a training step's AdamW updates on the "
                        "host CPU; inference takes tide, static-layer or lru");
    tide_status st = on ? tide_session_check_offload(m->ctx, o) : TIDE_OK;
    if (st) return st;
    if (o && (o->tile < TIDE_TILE_NONE || o->tile >= TIDE_TILE_LEVELS))
        return tide_err(m->ctx, TIDE_E_INVALID, "tiling %d is not auto (0), none (-1) or a level 1 to %d", o->tile,
                        TIDE_TILE_LEVELS - 1);
    if (o && (o->pin_weights < -1 || o->pin_weights > 1))
        return tide_err(m->ctx, TIDE_E_INVALID, "pin_weights %d is not auto (0), always (1) or never (-1)",
                        o->pin_weights);
    if (on && m->engine == TIDE_ENGINE_PLAIN)
        return tide_err(m->ctx, TIDE_E_INVALID, "offloaded runs use the planned engine: the model is set to the "
                        "plain one");
    /* resident already: nothing changes, and the cache the runs built (on a
     * device, in the arena) carries on */
    if (!on && !m->offload) {
        tide_free(m->off_ssd_dirs);
        m->off_ssd_dirs = NULL;
        unpin(m); /* left by a switch that failed */
        return TIDE_OK;
    }
    /* offloading is switched on only once everything it needs is ready: a
     * failure below leaves the model running resident */
    reset_setting(m);
    tide_free(m->off_ssd_dirs);
    m->off_ssd_dirs = NULL;
    if (!on) {
        unpin(m);
        return TIDE_OK;
    }
    m->off = *o;
    m->policy = pol;
    if (o->ssd_dirs && !(m->off_ssd_dirs = tide_strdup(o->ssd_dirs)))
        return tide_err(m->ctx, TIDE_E_NOMEM, "out of memory");
    m->off.ssd_dirs = m->off_ssd_dirs;
    m->off.hw = NULL; /* resolved now: the caller's string need not outlive this call */
    uint32_t blocks = 0; /* the block types of the model's weights: a probe measures their kernels */
    for (int i = 0; i < tide_checkpoint_n_tensors(m->ck); i++) {
        tide_tensor_info ti;
        if (tide_checkpoint_get_index(m->ck, i, &ti) == TIDE_OK && tide_dtype_is_quantized(ti.dtype))
            blocks |= UINT32_C(1) << ti.dtype;
    }
    if ((st = tide_session_hw(m->ctx, m->be, o->hw, m->off_ssd_dirs, blocks, &m->hw))) return st;
    m->hw_probed = !o->hw;
    bool pin = !o->weights_on_ssd && (o->pin_weights == 1 || (o->pin_weights == 0 && !m->be->vt->device_is_host));
    if (!pin) unpin(m);
    else if ((st = pin_weights(m))) return st;
    m->offload = true;
    return TIDE_OK;
}

const char *tide_model_notice(const tide_model *m) { return m->notice[0] ? m->notice : m->state_notice; }
