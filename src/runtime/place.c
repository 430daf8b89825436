/*
 * place.c - the planned engine of a model: each graph slot gets a plan and a
 * runner over one arena shared by every slot, made on its first run.
 *
 * Resident (no budget): an unconstrained plan whose budget is the arena bytes
 * it actually uses, every op's workspace one shared range (so it stays in the
 * caches, as the plain engine's one buffer does). Where device memory is host memory (the CPU) the plan is
 * host_addressable: weights, cache, inputs and outputs are used where they
 * are, and the arena holds the activations alone. On a device (a GPU) every
 * weight and cache buffer is warm: uploaded once to a fixed range at the
 * bottom of the arena and kept there across runs and slots, the activations
 * above. The whole warm region is the plan's warm_region, reserved even
 * where its graph names no tensor: a batch below max_batch uses the first
 * rows of each cache buffer, and the other rows hold their sequences' history
 * for a later graph. The arena is at least the warm region, whatever a plan's
 * own peak; a slot that needs a larger arena grows it (the cache is copied
 * out and back, the weights uploaded again, the other slots' runners made
 * anew).
 *
 * Offloaded (a budget): the arena is exactly the budget, resolved from the
 * first graph planned; each slot's graph is tiled as finely as the budget
 * needs (runtime/tiling.c) and planned under it. Weights are homed in pinned
 * copies, the memory-mapped checkpoint or the checkpoint file; the cache in
 * its host buffers. Where device memory is host memory (the CPU), tide's
 * offloaded plans are host_addressable too: what is homed in host memory
 * (the cache, inputs, outputs, weights not on SSD) is used in place, never
 * copied, so the arena holds only the activations and the weights read from
 * SSD, and the budget bounds what a run adds to memory; spills go to SSD
 * (planner_engine.c). The baselines copy everything in, as on a device. A
 * probed profile's SSD read rate is refitted from runs that read enough
 * (refit_ssd_read). Under the tide policy, on a device or with the weights
 * on SSD, a prefix of the arena is warm as when resident, but for some
 * weights only (choose_warm: as many as the planner's predictions of a
 * prompt and its decode steps repay, possibly none): uploaded once when the
 * budget is resolved and read in place by every slot's plan and every run,
 * so a decode step streams only the others. The cache is never warm there.
 *
 * Warm state (the arena on a device, resident; offloaded: the warm weights):
 *   (none) --ensure_arena: alloc + upload_warm--> LOADED
 *   LOADED --grow: flush_warm (cache to its homes), free--> (none) --> LOADED
 *   LOADED --tide_planned_release--> (none)   (the cache's contents are dropped)
 *   offloaded: (none) --choose_warm, plan_offload: upload_warm--> LOADED
 *              --tide_planned_release (a new budget, policy)--> (none)
 */
#include "runtime/model_int.h"
#include "runtime/session.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* ---------------------------------------------------------------- the arena */

static void warm_forget(tide_model *m);

void tide_planned_release(tide_model *m) {
    for (int i = 0; i < MODEL_SLOTS; i++) {
        tide_runner_free(m->slots[i].run);
        m->slots[i].run = NULL;
    }
    if (m->arena) m->be->vt->dealloc(m->be, m->arena);
    m->arena = NULL;
    m->arena_bytes = 0;
    m->budget = 0;
    warm_forget(m);
    m->warm_chosen = false;
    m->last_planned = NULL;
}

/* Whether resident runs keep weights and cache warm in the arena (a device
 * whose memory is not host memory). */
static bool uses_warm(const tide_model *m) { return !m->offload && !m->be->vt->device_is_host; }

/* Whether offloaded runs keep some weights warm: under the tide policy
 * (the baselines stream everything, so that policies compare), on a device,
 * or where device memory is host memory with the weights on SSD (there a
 * warm weight is one the drives are not read for again). */
static bool offload_warm(const tide_model *m) {
    return m->offload && !m->off.no_warm && m->policy == TIDE_POLICY_TIDE &&
           (!m->be->vt->device_is_host || m->off.weights_on_ssd);
}

/* Lays out the warm tensors from arena offset 0, each aligned: the
 * checkpoint's tensors in its order, first fit, while the region stays
 * within `limit` bytes (a tensor that does not fit is skipped, a later
 * smaller one may), then every cache buffer when with_state (which must all
 * fit). Sets warm_w, warm_s (NULL without state) and warm_bytes, or leaves
 * warm_w NULL when nothing is warm. */
static tide_status warm_layout_upto(tide_model *m, uint64_t limit, bool with_state) {
    uint64_t *w = tide_malloc((size_t)(m->n_weights ? m->n_weights : 1) * sizeof *w);
    uint64_t *s = with_state ? tide_malloc((size_t)(m->n_state ? m->n_state : 1) * sizeof *s) : NULL;
    tide_status st = w && (s || !with_state) ? TIDE_OK
                                             : tide_err(m->ctx, TIDE_E_NOMEM, "out of memory laying out the weights");
    uint64_t at = 0;
    for (int i = 0; !st && i < m->n_weights; i++) {
        tide_tensor_info ti;
        if ((st = tide_checkpoint_get_index(m->ck, i, &ti))) break;
        uint64_t n = tide_plan_align(ti.nbytes);
        w[i] = TIDE_HOME;
        if (n > limit - at) continue;
        w[i] = at;
        at += n;
    }
    for (int i = 0; !st && with_state && i < m->n_state; i++) {
        s[i] = at;
        at += tide_plan_align(m->state[i].nbytes);
    }
    if (st || !at) {
        tide_free(w);
        tide_free(s);
        return st;
    }
    m->warm_w = w;
    m->warm_s = s;
    m->warm_bytes = at;
    return TIDE_OK;
}

/* Forgets the warm layout (the arena's contents are left as they are). */
static void warm_forget(tide_model *m) {
    tide_free(m->warm_w);
    tide_free(m->warm_s);
    m->warm_w = m->warm_s = NULL;
    m->warm_bytes = 0;
    m->warm_loaded = false;
}

/* The resident warm layout: every checkpoint tensor, then every cache
 * buffer. Made whole or not at all. */
static tide_status warm_layout(tide_model *m) {
    return m->warm_w ? TIDE_OK : warm_layout_upto(m, UINT64_MAX, true);
}

/* Reads n bytes of file path at off into dst (host memory). TIDE_E_IO
 * names the file and the cause. */
static tide_status read_range(tide_model *m, const char *path, uint64_t off, void *dst, uint64_t n) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return tide_err(m->ctx, TIDE_E_IO, "cannot open '%s' to read the warm weights: %s", path, strerror(errno));
    for (uint64_t done = 0; done < n;) {
        size_t want = (size_t)TIDE_MIN(n - done, (uint64_t)1 << 30);
        ssize_t k = pread(fd, (char *)dst + done, want, (off_t)(off + done));
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            const char *why = k < 0 ? strerror(errno) : "the file ends first";
            close(fd);
            return tide_err(m->ctx, TIDE_E_IO, "cannot read the warm weights from '%s' at byte %llu: %s", path,
                            (unsigned long long)(off + done), why);
        }
        done += (uint64_t)k;
    }
    close(fd);
    return TIDE_OK;
}

/* Copies the warm tensors into the arena: weights from the checkpoint, the
 * cache from its homes (on the model's queue: failures on m->ctx). Where the
 * arena is host memory and the weights are homed on SSD, the warm weights
 * are read from the checkpoint file straight into it, not through the
 * mapping, whose pages would add the warm bytes a second time to the
 * process's resident memory. */
static tide_status upload_warm(tide_model *m) {
    tide_backend *be = m->be;
    void *q = NULL;
    tide_status st = tide_model_queue(m, &q);
    if (st) return st;
    for (int i = 0; !st && i < m->n_weights; i++) {
        tide_tensor_info ti;
        if ((st = tide_checkpoint_get_index(m->ck, i, &ti))) break;
        if (m->warm_w[i] == TIDE_HOME) continue;
        if (be->vt->device_is_host && m->offload && m->off.weights_on_ssd) {
            if ((st = read_range(m, ti.file, ti.file_offset, (char *)m->arena + m->warm_w[i], ti.nbytes))) return st;
            continue;
        }
        if ((st = be->vt->to_device(be, q, (char *)m->arena + m->warm_w[i], tide_model_weight_host(m, &ti, 0),
                                    ti.nbytes)))
            return tide_model_be_fail(m, q, st, "cannot upload the weights");
        tide_progress(m->ctx, "uploading", (uint64_t)i + 1, (uint64_t)m->n_weights);
    }
    for (int i = 0; !st && m->warm_s && i < m->n_state; i++)
        if ((st = be->vt->to_device(be, q, (char *)m->arena + m->warm_s[i], m->state[i].host, m->state[i].nbytes)))
            return tide_model_be_fail(m, q, st, "cannot upload the KV cache");
    if (st) return tide_err(m->ctx, st, "cannot read the checkpoint's tensor table");
    m->warm_loaded = true;
    return TIDE_OK;
}

/* Copies the warm cache back to its homes (before the arena goes). */
static tide_status flush_warm(tide_model *m) {
    tide_backend *be = m->be;
    void *q = NULL;
    tide_status st = tide_model_queue(m, &q);
    for (int i = 0; !st && m->warm_s && i < m->n_state; i++)
        if ((st = be->vt->to_host(be, q, m->state[i].host, (char *)m->arena + m->warm_s[i], m->state[i].nbytes)))
            return tide_model_be_fail(m, q, st, "cannot copy the KV cache out of the device");
    return st;
}

/* Makes the arena at least need bytes, and at least the warm region when
 * there is one, keeping the warm tensors (resident); slot `keep` keeps its
 * runner (it is being made). */
static tide_status ensure_arena(tide_model *m, uint64_t need, const graph_slot *keep) {
    tide_backend *be = m->be;
    tide_status st;
    if (m->warm_w) need = TIDE_MAX(need, m->warm_bytes);
    if (m->arena && need <= m->arena_bytes) return m->warm_w && !m->warm_loaded ? upload_warm(m) : TIDE_OK;
    if (m->arena) {
        if (m->warm_loaded && (st = flush_warm(m))) return st;
        for (int i = 0; i < MODEL_SLOTS; i++)
            if (&m->slots[i] != keep) {
                tide_runner_free(m->slots[i].run);
                m->slots[i].run = NULL;
            }
        be->vt->dealloc(be, m->arena);
        m->arena = NULL;
        m->arena_bytes = 0;
        m->warm_loaded = false;
    }
    need = (need + 255) & ~(uint64_t)255;
    if ((st = be->vt->alloc(be, need, &m->arena)))
        return tide_err(m->ctx, st, "cannot allocate the device arena of %llu bytes: %s", (unsigned long long)need,
                        tide_ctx_last_error(be->ctx));
    m->arena_bytes = need;
    return m->warm_w ? upload_warm(m) : TIDE_OK;
}

/* ---------------------------------------------------------------- plans */

/* Whether offloaded plans use host homes in place: where device memory is
 * host memory (the CPU), under the tide policy (the baselines plan every
 * tensor through the arena, as on a device, so that policies compare). */
static bool offload_in_place(const tide_model *m) {
    return m->be->vt->device_is_host && m->policy == TIDE_POLICY_TIDE;
}

static tide_plan_opts offload_opts(const tide_model *m, uint64_t budget) {
    return (tide_plan_opts){.policy = m->policy, .device_budget = budget, .host_budget = m->off.host_budget,
                            .n_iter = 1, .hw = &m->hw, .weights_on_ssd = m->off.weights_on_ssd,
                            .host_addressable = offload_in_place(m)};
}

static tide_llama_graph_opts slot_graph_opts(const tide_model *m, const graph_slot *s) {
    return (tide_llama_graph_opts){.batch = s->batch, .seq = s->seq, .ctx_len = m->ctx_len,
                                   .all_logits = s->all_logits, .fresh_cache = s->fresh, .row_pos = s->row_pos,
                                   .cache_row = s->cache_row, .cache_dtype = m->cache_dtype};
}

/* The warm offset of every tensor of g (TIDE_HOME: not warm). Every cache
 * tensor must be warm: its latest version lives nowhere else. */
static tide_status warm_offsets(tide_model *m, const tide_graph *g, uint64_t *warm) {
    for (int t = 0; t < g->n_tensors; t++) {
        const tide_tensor *tt = &g->tensors[t];
        warm[t] = TIDE_HOME;
        uint64_t off = 0, base;
        tide_status st;
        if (tt->role == TIDE_ROLE_WEIGHT) {
            tide_tensor_info ti;
            if ((st = tide_model_weight_home(m, g, t, &ti, &off))) return st;
            int i = tide_model_weight_index(m, &ti);
            if (i < 0 || (base = m->warm_w[i]) == TIDE_HOME) continue;
        } else if (tt->role == TIDE_ROLE_STATE && m->warm_s) {
            state_buf *sb = NULL;
            if ((st = tide_model_state_home(m, g, t, &sb, &off))) return st;
            base = m->warm_s[sb - m->state];
        } else {
            continue;
        }
        if ((base + off) % TIDE_PLAN_ALIGN == 0) warm[t] = base + off;
        else if (tt->role == TIDE_ROLE_STATE)
            return tide_err(m->ctx, TIDE_E_UNSUPPORTED, "cache tensor '%s' starts inside a page of its buffer: it "
                            "cannot be kept on the device", tt->name);
    }
    return TIDE_OK;
}

/* A resident plan of g (runtime/session.c): on a device with the warm
 * layout in place (the warm region reserved whole). */
static tide_status plan_resident(tide_model *m, tide_graph *g, tide_plan **out) {
    if (!uses_warm(m)) return tide_session_plan_resident(m->ctx, m->be, g, NULL, 0, out);
    uint64_t *warm = tide_malloc((size_t)(g->n_tensors ? g->n_tensors : 1) * sizeof *warm);
    if (!warm) return tide_err(m->ctx, TIDE_E_NOMEM, "out of memory planning");
    tide_status st = warm_layout(m);
    if (!st && !(st = warm_offsets(m, g, warm)))
        st = tide_session_plan_resident(m->ctx, m->be, g, warm, m->warm_bytes, out);
    tide_free(warm);
    return st;
}

/* The smallest budget of slot s's graph at the coarsest tiling that plans
 * (TIDE_BUDGET_MIN): the slot keeps that tiling. */
typedef struct min_search {
    tide_model *m;
    graph_slot *s;
} min_search;

static tide_status min_budget(void *user, uint64_t *b) {
    min_search *u = user;
    tide_model *m = u->m;
    tide_plan_opts po = offload_opts(m, 0);
    tide_llama_graph_opts go = slot_graph_opts(m, u->s);
    tide_graph *tg = NULL;
    int level = 0;
    tide_status st = tide_llama_plan_tiled(m->ctx, &m->cfg, &go, &po, m->off.tile, &tg, &level, NULL, b);
    if (st) return st;
    tide_graph_free(tg); /* the slot plans the graph of that level again, at the budget */
    u->s->min_tile = level > 0 ? level : TIDE_TILE_NONE;
    return TIDE_OK;
}

/* Resolves the budget from the first graph planned and allocates the arena. */
static tide_status resolve_budget(tide_model *m, graph_slot *s) {
    min_search u = {m, s};
    uint64_t b = 0;
    tide_status st = tide_session_budget(m->ctx, m->be, &m->off, &m->hw, s->g, "run", min_budget, &u, &b);
    if (st) return st;
    if ((st = m->be->vt->alloc(m->be, b, &m->arena)))
        return tide_err(m->ctx, st, "cannot allocate the device arena of %llu bytes: %s", (unsigned long long)b,
                        tide_ctx_last_error(m->be->ctx));
    m->budget = m->arena_bytes = b;
    return TIDE_OK;
}

/* An offloaded plan of the graph go describes at the budget, the warm
 * weights of the current layout (if any) kept where they are: the coarsest
 * tiling whose plan fits the budget less the warm region (untiled, with
 * tiling off, even where the untiled minimum is above that), planned again
 * with the warm tensors and region in place. A block of a split weight whose
 * offset is not TIDE_PLAN_ALIGN-aligned is not warm (warm_offsets). */
static tide_status plan_graph(tide_model *m, const tide_llama_graph_opts *go, int tile, tide_graph **g, int *level,
                              tide_plan **p) {
    uint64_t w = m->warm_w ? m->warm_bytes : 0;
    tide_plan_opts po = offload_opts(m, m->budget - w);
    tide_status st = tide_llama_plan_tiled(m->ctx, &m->cfg, go, &po, tile, g, level, w ? NULL : p, NULL);
    if (st == TIDE_E_INFEASIBLE && w && tile == TIDE_TILE_NONE) {
        /* the untiled minimum counts an op's warm weight in its working
         * set as if it were streamed in: beside the region it is read in
         * place, so the untiled graph may still plan (as the pool prices it) */
        tide_err_clear(m->ctx);
        *level = 0;
        st = tide_llama_build(m->ctx, &m->cfg, go, g);
    }
    if (st || !w) return st;
    uint64_t *warm = tide_malloc((size_t)((*g)->n_tensors ? (*g)->n_tensors : 1) * sizeof *warm);
    if (!warm) st = tide_err(m->ctx, TIDE_E_NOMEM, "out of memory planning");
    else if (!(st = warm_offsets(m, *g, warm))) {
        po.device_budget = m->budget;
        po.warm_off = warm;
        po.warm_region = w;
        st = tide_plan_make(m->ctx, *g, &po, p);
    }
    tide_free(warm);
    if (st) {
        tide_plan_free(*p);
        *p = NULL;
        tide_graph_free(*g);
        *g = NULL;
    }
    return st;
}

/* The predicted seconds of slot s's graph, and when it is a prompt (seq > 1)
 * of the decode steps after it (m->warm_decode: the generation's, at most
 * MODEL_WARM_DECODE_STEPS; a prompt with none, as a prefill alone, is priced
 * alone), under the current warm layout; TIDE_E_INFEASIBLE when a graph
 * cannot be planned beside it, these or a prompt of the whole context (which
 * a later run may bring). */
static tide_status predict_warm(tide_model *m, const graph_slot *s, double *secs) {
    const int steps = m->warm_decode >= 0 ? m->warm_decode : MODEL_WARM_DECODE_STEPS;
    tide_llama_graph_opts go[4] = {slot_graph_opts(m, s)};
    for (int k = 1; k < 4; k++)
        go[k] = (tide_llama_graph_opts){.batch = 1, .seq = 1, .ctx_len = m->ctx_len, .cache_row = s->cache_row,
                                        .cache_dtype = m->cache_dtype};
    /* the longest prompt a later run may bring (the whole context, fresh):
     * it must still plan beside the warm region, or that run would fail;
     * and where the model holds several sequences, their decode step as
     * one forward (tide_model_generate_batch) */
    go[2].seq = m->ctx_len;
    go[2].fresh_cache = true;
    go[2].cache_row = 0;
    go[3].batch = m->max_batch;
    go[3].row_pos = true;
    go[3].cache_row = 0;
    int tile = s->min_tile ? s->min_tile : m->off.tile;
    *secs = 0;
    for (int k = 0; k < 4; k++) {
        if (k == 1 && s->seq <= 1) continue;
        /* (only beside a warm region: without one, the budget is the
         * caller's to size for the prompts it brings) */
        if (k == 2 && (s->seq >= m->ctx_len || !m->warm_w)) continue;
        if (k == 3 && (m->max_batch <= 1 || !m->warm_w || (s->row_pos && s->batch >= m->max_batch))) continue;
        tide_graph *g = NULL;
        tide_plan *p = NULL;
        int level = 0;
        tide_status st = plan_graph(m, &go[k], k ? m->off.tile : tile, &g, &level, &p);
        if (st) return st;
        if (k < 2) *secs += (k ? steps : 1) * p->stats.makespan_s;
        tide_plan_free(p);
        tide_graph_free(g);
    }
    return TIDE_OK;
}

/* Chooses which weights stay warm in the offloaded arena, once per budget:
 * a warm region of W bytes is the checkpoint's weights in its order, first
 * fit (warm_layout_upto), uploaded once and read by every run from then on,
 * and taken from what each plan may page through. W is the candidate, among
 * 0 and the layouts that fit 1/4, 1/2, 3/4 and 7/8 of the budget, whose
 * planner-predicted prompt plus the generation's decode steps (predict_warm)
 * is fastest, a larger W taken only when strictly faster; candidates stop at
 * the first with which a graph cannot be planned, that prompt's, its decode
 * step's or a prompt of the whole context's (so that no later run fails for
 * the room the warm weights took). */
static tide_status choose_warm(tide_model *m, const graph_slot *s) {
    static const int eighths[] = {0, 2, 4, 6, 7};
    m->warm_chosen = true;
    if (!offload_warm(m)) return TIDE_OK;
    double best = 0;
    uint64_t best_limit = 0, last_bytes = UINT64_MAX;
    for (int k = 0; k < (int)(sizeof eighths / sizeof *eighths); k++) {
        uint64_t limit = m->budget / 8 * (uint64_t)eighths[k];
        warm_forget(m);
        tide_status st = warm_layout_upto(m, limit, false);
        if (st) return st;
        if (m->warm_bytes == last_bytes) continue;
        last_bytes = m->warm_bytes;
        double secs = 0;
        st = predict_warm(m, s, &secs);
        if (st == TIDE_E_INFEASIBLE && k > 0) break;
        if (st) {
            warm_forget(m);
            return st;
        }
        if (k == 0 || secs < best) best = secs, best_limit = limit;
    }
    tide_err_clear(m->ctx);
    warm_forget(m);
    return warm_layout_upto(m, best_limit, false);
}

/* An offloaded plan of slot s: the coarsest tiling whose plan fits the budget
 * (none when it allows), the warm weights kept. */
static tide_status plan_offload(tide_model *m, graph_slot *s, tide_graph **g, tide_plan **p) {
    tide_status st;
    if (!m->budget && (st = resolve_budget(m, s))) return st;
    if (!m->warm_chosen && (st = choose_warm(m, s))) return st;
    /* the graph whose minimum is the budget has its tiling known: no search */
    int tile = s->min_tile ? s->min_tile : m->off.tile;
    tide_llama_graph_opts go = slot_graph_opts(m, s);
    if ((st = plan_graph(m, &go, tile, g, &s->tile_level, p))) return st;
    /* the model keeps its KV cache in host memory: a plan that homes it on
     * SSD (host budget too small) cannot run here */
    for (int t = 0; t < (*g)->n_tensors; t++)
        if ((*g)->tensors[t].role == TIDE_ROLE_STATE && (*p)->home[t] != TIDE_TIER_HOST)
            return tide_err(m->ctx, TIDE_E_INFEASIBLE, "the host budget of %llu bytes cannot hold the KV cache "
                            "(%llu bytes), which must live in host memory", (unsigned long long)m->off.host_budget,
                            (unsigned long long)tide_graph_role_bytes(*g, TIDE_ROLE_STATE));
    /* the warm weights go up once, before the first run that reads them */
    if (m->warm_w && !m->warm_loaded) return upload_warm(m);
    return TIDE_OK;
}

/* ---------------------------------------------------------------- runners */

/* Binds the homes of g's weights and cache. */
static tide_status bind_homes(tide_model *m, tide_runner *r) {
    const tide_graph *g = tide_runner_graph(r);
    const tide_plan *p = tide_runner_plan(r);
    for (int t = 0; t < g->n_tensors; t++) {
        tide_status st = TIDE_OK;
        uint64_t off = 0;
        if (g->tensors[t].role == TIDE_ROLE_WEIGHT) {
            tide_tensor_info ti;
            if ((st = tide_model_weight_home(m, g, t, &ti, &off))) return st;
            st = p->home[t] == TIDE_TIER_SSD ? tide_runner_bind_file(r, t, ti.file, ti.file_offset + off)
                                             : tide_runner_bind_tensor(r, t, tide_model_weight_host(m, &ti, off));
        } else if (g->tensors[t].role == TIDE_ROLE_STATE) {
            state_buf *sb = NULL;
            if ((st = tide_model_state_home(m, g, t, &sb, &off))) return st;
            st = tide_runner_bind_tensor(r, t, (char *)sb->host + off);
        }
        if (st) return st;
    }
    return TIDE_OK;
}

/* Plans slot s and makes its runner. */
static tide_status prepare(tide_model *m, graph_slot *s) {
    tide_ctx *ctx = m->ctx;
    tide_graph *g = NULL;
    tide_plan *p = NULL;
    tide_status st;
    if (m->offload) {
        st = plan_offload(m, s, &g, &p);
    } else {
        tide_llama_graph_opts go = slot_graph_opts(m, s);
        if (!(st = tide_llama_build(ctx, &m->cfg, &go, &g))) st = plan_resident(m, g, &p);
        if (!st) st = ensure_arena(m, p->device_budget, s);
    }
    if (st) {
        tide_plan_free(p);
        tide_graph_free(g);
        return st;
    }
    s->predicted_s = p->stats.makespan_s;
    bool async = tide_backend_has_events(m->be) && !m->sync_issue;
    /* measured where it costs nothing (synchronous issue: host clocks), or
     * where asked for (timing events on a GPU) */
    tide_runner_opts ro = {.exec = {.ssd_dirs = m->off_ssd_dirs,
                                    .direct_storage = m->off.direct_storage, .arena = m->arena,
                                    .arena_bytes = m->arena_bytes, .sync_issue = m->sync_issue,
                                    .timed = m->offload && (m->off.timeline || !async)}};
    if ((st = tide_runner_new(ctx, m->be, g, p, &ro, &s->run))) return st;
    if (!m->notice[0] && tide_runner_notice(s->run)[0])
        snprintf(m->notice, sizeof m->notice, "%s", tide_runner_notice(s->run));
    if ((st = bind_homes(m, s->run))) {
        tide_runner_free(s->run);
        s->run = NULL;
        return st;
    }
    if (m->offload && !m->last_planned) m->last_planned = s;
    return TIDE_OK;
}

/* Where device memory is host memory, an SSD LOAD is the drive's read
 * straight into the arena: a run that read at least REFIT_MIN_BYTES from
 * the drives timed their read rate on the very files and requests the plans
 * move, at length, where the quick probe sampled a scratch file for a
 * fraction of a second; a probed profile takes that rate for the plans made
 * from then on (the decode step's, after the prefill). Not on a device,
 * where the time of an SSD LOAD is a pipeline with the host link, nor with
 * a profile the caller gave. */
#define REFIT_MIN_BYTES ((uint64_t)256 << 20)
static void refit_ssd_read(tide_model *m, const tide_exec_stats *es) {
    if (!m->hw_probed || !m->be->vt->device_is_host || es->bytes_ssd_read < REFIT_MIN_BYTES || !(es->ssd_read_s > 0))
        return;
    int k = m->hw.ssd_count > 0 ? m->hw.ssd_count : 1;
    m->hw.ssd_read_bw = (double)es->bytes_ssd_read / es->ssd_read_s / k;
}

tide_status tide_planned_run(tide_model *m, graph_slot *s, const tide_binding *io, int n_io) {
    tide_status st;
    if (!s->run && (st = prepare(m, s))) return st;
    for (int k = 0; k < n_io; k++)
        if ((st = tide_runner_bind(s->run, io[k].name, io[k].data))) return st;
    tide_exec_stats es;
    st = tide_runner_run(s->run, &es);
    if (!m->notice[0] && tide_runner_notice(s->run)[0])
        snprintf(m->notice, sizeof m->notice, "%s", tide_runner_notice(s->run));
    if (st) return st;
    tide_gen_stats *a = &m->acc;
    a->async_issue = es.async;
    if (!m->offload) {
        uint64_t act = m->arena_bytes - m->warm_bytes; /* what the runs add to weights and cache */
        m->peak_bytes = TIDE_MAX(m->peak_bytes, m->weight_bytes + m->state_bytes + act);
        return TIDE_OK;
    }
    refit_ssd_read(m, &es);
    s->gen_runs++;
    a->bytes_h2d += es.bytes_h2d;
    a->bytes_d2h += es.bytes_d2h;
    a->bytes_ssd_read += es.bytes_ssd_read;
    a->bytes_ssd_write += es.bytes_ssd_write;
    a->exec_s += es.wall_s;
    a->ssd_read_s += es.ssd_read_s;
    a->predicted_s += s->predicted_s;
    a->peak_device_bytes = TIDE_MAX(a->peak_device_bytes, tide_runner_plan(s->run)->stats.peak_device_bytes);
    a->budget_bytes = m->budget;
    a->tile_level = TIDE_MAX(a->tile_level, s->tile_level);
    a->pinned_weight_bytes = m->pinned_bytes;
    a->warm_weight_bytes = m->warm_bytes;
    return TIDE_OK;
}

tide_status tide_model_last_run(const tide_model *m, const tide_plan **plan, const tide_sim_event **timeline) {
    const graph_slot *s = m->last_planned;
    if (!s || !s->run)
        return tide_err(m->ctx, TIDE_E_INVALID, "no offloaded run to trace (run with a budget first)");
    *plan = tide_runner_plan(s->run);
    *timeline = tide_runner_timeline(s->run);
    if (!*timeline)
        return tide_err(m->ctx, TIDE_E_INVALID, "no measured timeline: on a GPU it is measured only when asked "
                        "for (tide_offload_opts.timeline, tide run --trace)");
    return TIDE_OK;
}

int tide_model_gen_runs(const tide_model *m, const tide_plan **plans, const tide_sim_event **timelines, int *runs) {
    int n = 0;
    for (int i = 0; m->offload && i < MODEL_SLOTS; i++) {
        const graph_slot *s = &m->slots[i];
        if (!s->run || s->gen_runs <= 0) continue;
        if (!(timelines[n] = tide_runner_timeline(s->run))) return 0;
        plans[n] = tide_runner_plan(s->run);
        runs[n++] = s->gen_runs;
    }
    return n;
}

tide_status tide_model_set_hw(tide_model *m, const tide_hw *hw) {
    if (!m->offload) return tide_err(m->ctx, TIDE_E_INVALID, "a profile for offloaded plans, on a resident model");
    m->hw = *hw;
    for (int i = 0; i < MODEL_SLOTS; i++) {
        tide_runner_free(m->slots[i].run);
        m->slots[i].run = NULL;
    }
    m->last_planned = NULL;
    return TIDE_OK;
}
