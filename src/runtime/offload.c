/*
 * offload.c - offloaded runs: each graph of the model runs through a plan made
 * under the device budget, verified, and executed by the executor over one
 * arena of exactly the budget shared by all the model's graphs.
 *
 * Homes: weights live in the memory-mapped checkpoint or in pinned copies of
 * it (host home; pinned by default on a GPU, where a copy from pageable
 * memory goes through a driver bounce buffer at a fraction of the link's
 * rate) or are read straight from the checkpoint file (SSD home); the KV
 * cache lives in the
 * model's state buffers; inputs and outputs are the caller's host buffers,
 * bound again before every run.
 */
#include "probe/probe.h"
#include "trace/trace.h"
#include "runtime/model_int.h"

#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

void tide_model_offload_release(tide_model *m) {
    if (m->arena) m->be->vt->dealloc(m->be, m->arena);
    m->arena = NULL;
    m->budget = 0;
    tide_free(m->off_ssd_dirs);
    m->off_ssd_dirs = NULL;
}

void tide_model_unpin(tide_model *m) {
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

/* Bytes of host memory available now (MemAvailable), 0 when unknown. */
static uint64_t host_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    unsigned long long kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
    if (f) fclose(f);
    if (kb) return (uint64_t)kb * 1024;
    long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
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
    uint64_t limit = m->pinned_bytes + host_available() / 2;
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
                tide_err_clear(m->ctx);
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

/* The host home of weight t: its pinned copy when it has one, else the
 * memory-mapped checkpoint. */
static void *weight_host_home(tide_model *m, const tide_tensor_info *ti, uint64_t off) {
    int i = m->pinned ? tide_model_weight_index(m, ti) : -1;
    return i >= 0 && m->pinned[i] ? (char *)m->pinned[i] + off : (char *)ti->data + off;
}

tide_status tide_model_set_offload(tide_model *m, const tide_offload_opts *o) {
    tide_policy pol = TIDE_POLICY_TIDE;
    if (o && o->budget_kind != TIDE_BUDGET_NONE && o->policy && tide_policy_parse(o->policy, &pol))
        return tide_err(m->ctx, TIDE_E_INVALID, "unknown policy '%s' (tide, static-layer or lru)", o->policy);
    if (o && o->budget_kind == TIDE_BUDGET_FRACTION && !(o->fraction > 0 && o->fraction <= 1))
        return tide_err(m->ctx, TIDE_E_INVALID, "budget fraction %g is not in (0, 1]", o->fraction);
    if (o && (o->tile < TIDE_TILE_NONE || o->tile >= TIDE_TILE_LEVELS))
        return tide_err(m->ctx, TIDE_E_INVALID, "tiling %d is not auto (0), none (-1) or a level 1 to %d", o->tile,
                        TIDE_TILE_LEVELS - 1);
    if (o && o->budget_kind == TIDE_BUDGET_BYTES && !o->bytes)
        return tide_err(m->ctx, TIDE_E_INVALID, "a budget of 0 bytes");
    if (o && (o->pin_weights < -1 || o->pin_weights > 1))
        return tide_err(m->ctx, TIDE_E_INVALID, "pin_weights %d is not auto (0), always (1) or never (-1)",
                        o->pin_weights);
    for (int i = 0; i < 2; i++) tide_model_slot_clear(&m->slots[i]);
    m->last_planned = NULL;
    tide_model_offload_release(m);
    /* offloading is switched on only once everything it needs is ready: a
     * failure below leaves the model running resident */
    m->offload = false;
    m->hw_ready = false;
    if (!o || o->budget_kind == TIDE_BUDGET_NONE) {
        tide_model_unpin(m);
        return TIDE_OK;
    }
    m->off = *o;
    m->policy = pol;
    if (o->ssd_dirs) {
        m->off_ssd_dirs = tide_strdup(o->ssd_dirs);
        if (!m->off_ssd_dirs) return tide_err(m->ctx, TIDE_E_NOMEM, "out of memory");
    }
    m->off.ssd_dirs = m->off_ssd_dirs;
    m->off.hw = NULL; /* resolved now: the caller's string need not outlive this call */
    /* the device holds the arena and nothing else: the resident runs' device
     * copies of the cache and the weights go first, before the probe below
     * needs device memory (a failure after this point leaves the model
     * running resident, with those copies made again, the cache zeroed) */
    if (!m->be->vt->device_is_host) tide_model_release_device(m);
    if (o->hw) {
        tide_status st = tide_hw_load(m->ctx, o->hw, &m->hw);
        if (st) return st;
    } else {
        /* a quick measurement of this machine, so predictions mean something */
        tide_status st = tide_probe_backend(m->ctx, m->be, m->off_ssd_dirs, 1.0, NULL, &m->hw);
        if (st) return st;
    }
    if (!m->be->vt->device_is_host && m->be->matmul == TIDE_MATMUL_F32) {
        /* 16-bit weights are widened and multiplied at the f32 rate */
        for (int d = 0; d < TIDE_DTYPE_COUNT; d++)
            if (d == TIDE_F16 || d == TIDE_BF16) m->hw.flops[d] = TIDE_MIN(m->hw.flops[d], m->hw.flops[TIDE_F32]);
    }
    if (!m->be->vt->device_is_host) {
        /* the KV cache's home must be host memory the executor can copy from */
        for (int i = 0; i < m->n_state; i++) {
            state_buf *sb = &m->state[i];
            if (sb->host) continue;
            sb->host = tide_malloc_aligned(sb->nbytes, 4096);
            if (!sb->host) return tide_err(m->ctx, TIDE_E_NOMEM, "out of memory for the host KV cache");
            memset(sb->host, 0, sb->nbytes);
        }
    }
    m->notice[0] = '\0';
    bool pin = !o->weights_on_ssd && (o->pin_weights == 1 || (o->pin_weights == 0 && !m->be->vt->device_is_host));
    if (!pin) {
        tide_model_unpin(m);
    } else {
        tide_status st = pin_weights(m);
        if (st) return st;
    }
    m->hw_ready = true;
    m->offload = true;
    return TIDE_OK;
}

static tide_plan_opts plan_opts(const tide_model *m, uint64_t budget) {
    return (tide_plan_opts){.policy = m->policy, .device_budget = budget,
                            .host_budget = m->off.host_budget, .n_iter = 1, .hw = &m->hw,
                            .weights_on_ssd = m->off.weights_on_ssd};
}

static tide_llama_graph_opts slot_graph_opts(const tide_model *m, const graph_slot *s) {
    return (tide_llama_graph_opts){.batch = s->batch, .seq = s->seq, .ctx_len = m->ctx_len,
                                   .all_logits = s->all_logits, .fresh_cache = s->fresh};
}

/* Puts g in the slot in place of its graph (same inputs and outputs). */
static void slot_swap_graph(graph_slot *s, tide_graph *g) {
    tide_graph_free(s->g);
    s->g = g;
}

/* Resolves the budget from the first graph planned and allocates the arena. */
static tide_status resolve_budget(tide_model *m, graph_slot *s) {
    tide_ctx *ctx = m->ctx;
    const tide_graph *g = s->g;
    uint64_t peak = tide_plan_unconstrained_peak(ctx, g, &m->hw, 1);
    if (!peak) return tide_err(ctx, TIDE_E_INVALID, "cannot size the unconstrained run: %s", tide_ctx_last_error(ctx));
    uint64_t b = 0;
    switch (m->off.budget_kind) {
    case TIDE_BUDGET_BYTES: b = m->off.bytes; break;
    case TIDE_BUDGET_FRACTION: b = (uint64_t)((double)peak * m->off.fraction); break;
    case TIDE_BUDGET_AUTO: {
        uint64_t fr = 0, tot = 0;
        if (m->be->vt->mem_info) {
            /* the device's free memory less a margin for the runtime's own
             * allocations (cuBLAS workspaces, kernels, streams) */
            tide_status st = m->be->vt->mem_info(m->be, &fr, &tot);
            if (st) return st;
            uint64_t margin = TIDE_AUTO_MARGIN(tot);
            if (fr <= margin)
                return tide_err(ctx, TIDE_E_NOMEM, "--budget auto: the device has %llu bytes free, no more than the "
                                "%llu-byte margin kept for the runtime", (unsigned long long)fr,
                                (unsigned long long)margin);
            b = TIDE_MIN(peak, fr - margin);
        } else {
            b = TIDE_MIN(peak, m->hw.device_mem_bytes / 10 * 9);
        }
        break;
    }
    case TIDE_BUDGET_MIN: {
        tide_plan_opts po = plan_opts(m, 0);
        tide_llama_graph_opts go = slot_graph_opts(m, s);
        tide_graph *tg = NULL;
        int level = 0;
        tide_status st = tide_llama_plan_tiled(ctx, &m->cfg, &go, &po, m->off.tile, &tg, &level, NULL, &b);
        if (st) return st;
        tide_graph_free(tg); /* prepare plans the graph of that level again, at the budget */
        s->min_tile = level > 0 ? level : TIDE_TILE_NONE;
        break;
    }
    default: return tide_err(ctx, TIDE_E_INVALID, "no budget");
    }
    if (m->off.budget_kind != TIDE_BUDGET_BYTES) b = (b + 255) & ~(uint64_t)255; /* BYTES is exact */
    tide_status st = m->be->vt->alloc(m->be, b, &m->arena);
    if (st) return tide_err(ctx, st, "cannot allocate the device arena of %llu bytes: %s", (unsigned long long)b,
                            tide_ctx_last_error(ctx));
    m->budget = b;
    m->acc.budget_bytes = b;
    return TIDE_OK;
}

static tide_status bind_homes(tide_model *m, graph_slot *s) {
    const tide_graph *g = s->g;
    for (int t = 0; t < g->n_tensors; t++) {
        const tide_tensor *tt = &g->tensors[t];
        tide_status st = TIDE_OK;
        uint64_t off = 0;
        if (tt->role == TIDE_ROLE_WEIGHT) {
            tide_tensor_info ti;
            if ((st = tide_model_weight_home(m, g, t, &ti, &off))) return st;
            st = s->plan->home[t] == TIDE_TIER_SSD ? tide_exec_bind_file(s->ex, t, ti.file, ti.file_offset + off)
                                                   : tide_exec_bind_host(s->ex, t, weight_host_home(m, &ti, off));
        } else if (tt->role == TIDE_ROLE_STATE) {
            state_buf *sb = NULL;
            if ((st = tide_model_state_home(m, g, t, &sb, &off))) return st;
            st = tide_exec_bind_host(s->ex, t, (char *)(sb->host ? sb->host : sb->data) + off);
        }
        if (st) return st;
    }
    return TIDE_OK;
}

static tide_status prepare(tide_model *m, graph_slot *s) {
    tide_ctx *ctx = m->ctx;
    tide_status st;
    if (!m->budget && (st = resolve_budget(m, s))) return st;
    tide_plan_opts po = plan_opts(m, m->budget);
    /* the graph whose minimum is the budget has its tiling known: no search */
    int tile = s->min_tile ? s->min_tile : m->off.tile;
    if (tile != TIDE_TILE_NONE) {
        /* the coarsest tiling whose plan fits the budget (none when it allows) */
        tide_llama_graph_opts go = slot_graph_opts(m, s);
        tide_graph *tg = NULL;
        int level = 0;
        if ((st = tide_llama_plan_tiled(ctx, &m->cfg, &go, &po, tile, &tg, &level, &s->plan, NULL)))
            return st;
        slot_swap_graph(s, tg);
        s->tile_level = level;
    } else if ((st = tide_plan_make(ctx, s->g, &po, &s->plan))) {
        return st;
    }
    /* the model keeps its KV cache in host memory: a plan that homes it on
     * SSD (host budget too small) cannot run here */
    uint64_t state_bytes = tide_graph_role_bytes(s->g, TIDE_ROLE_STATE);
    for (int t = 0; t < s->g->n_tensors; t++)
        if (s->g->tensors[t].role == TIDE_ROLE_STATE && s->plan->home[t] != TIDE_TIER_HOST)
            return tide_err(ctx, TIDE_E_INFEASIBLE, "the host budget of %llu bytes cannot hold the KV cache "
                            "(%llu bytes), which must live in host memory", (unsigned long long)m->off.host_budget,
                            (unsigned long long)state_bytes);
    /* invariant 3: a plan the verifier rejects never runs */
    if ((st = tide_plan_verify(s->plan)))
        return tide_err(ctx, st, "the plan failed verification and was not run: %s", tide_ctx_last_error(ctx));
    s->predicted_s = s->plan->stats.makespan_s;
    /* measured where it costs nothing (synchronous issue: host clocks), or
     * where asked for (timing events on a GPU) */
    bool timed = m->off.timeline || !tide_async_issue(m->be);
    if (timed) {
        s->timeline = tide_calloc((size_t)(s->plan->n_ins ? s->plan->n_ins : 1), sizeof *s->timeline);
        if (!s->timeline) return tide_err(ctx, TIDE_E_NOMEM, "out of memory for the timeline");
    }
    tide_exec_opts eo = {.ssd_dirs = m->off_ssd_dirs, .force_pread = m->off.force_pread,
                         .direct_storage = m->off.direct_storage,
                         .arena = m->arena, .arena_bytes = m->budget,
                         .sync_issue = tide_model_sync_issue(), .timed = timed};
    if ((st = tide_exec_new(ctx, m->be, s->plan, &eo, &s->ex))) return st;
    if (!m->notice[0] && tide_exec_notice(s->ex)[0])
        snprintf(m->notice, sizeof m->notice, "%s", tide_exec_notice(s->ex));
    if (!m->last_planned) m->last_planned = s;
    return bind_homes(m, s);
}

tide_status tide_model_run_planned(tide_model *m, graph_slot *s, const run_io *io) {
    tide_status st;
    if (!s->plan && (st = prepare(m, s))) {
        /* leave no half-prepared slot behind: the next call starts again */
        tide_exec_free(s->ex);
        tide_plan_free(s->plan);
        tide_free(s->timeline);
        s->ex = NULL;
        s->plan = NULL;
        s->timeline = NULL;
        return st;
    }
    const tide_graph *g = s->g;
    int tt = tide_graph_find(g, "tokens"), tp = tide_graph_find(g, "pos");
    int tl = tide_graph_find(g, "logits"), tn = tide_graph_find(g, "next_token");
    tide_exec_stats es;
    if (!(st = tide_exec_bind_host(s->ex, tt, (void *)io->tokens)) &&
        !(st = tide_exec_bind_host(s->ex, tp, (void *)io->pos)) &&
        !(st = tide_exec_bind_host(s->ex, tl, io->logits)) && !(st = tide_exec_bind_host(s->ex, tn, io->next)))
        st = tide_exec_run(s->ex, s->timeline, &es);
    if (!m->notice[0] && tide_exec_notice(s->ex)[0])
        snprintf(m->notice, sizeof m->notice, "%s", tide_exec_notice(s->ex));
    if (st) return st;
    tide_gen_stats *a = &m->acc;
    a->bytes_h2d += es.bytes_h2d;
    a->bytes_d2h += es.bytes_d2h;
    a->bytes_ssd_read += es.bytes_ssd_read;
    a->bytes_ssd_write += es.bytes_ssd_write;
    a->exec_s += es.wall_s;
    a->ssd_read_s += es.ssd_read_s;
    a->predicted_s += s->predicted_s;
    a->peak_device_bytes = TIDE_MAX(a->peak_device_bytes, s->plan->stats.peak_device_bytes);
    a->budget_bytes = m->budget;
    a->tile_level = TIDE_MAX(a->tile_level, s->tile_level);
    a->pinned_weight_bytes = m->pinned_bytes;
    a->async_issue = es.async;
    return TIDE_OK;
}

tide_status tide_model_write_trace(tide_model *m, const char *json_path, const char *svg_path) {
    graph_slot *s = m->last_planned;
    if (!s || !s->plan)
        return tide_err(m->ctx, TIDE_E_INVALID, "no offloaded run to trace (run with a budget first)");
    if (!s->timeline)
        return tide_err(m->ctx, TIDE_E_INVALID, "no measured timeline: on a GPU it is measured only when asked "
                        "for (tide_offload_opts.timeline, tide run --trace)");
    tide_status st = TIDE_OK;
    if (json_path) st = tide_trace_write(s->plan, s->timeline, s->plan->n_ins, json_path);
    if (!st && svg_path) {
        tide_sim_result sim;
        if ((st = tide_simulate(s->plan, &m->hw, &sim))) return st;
        const tide_sim_event *tl[2] = {s->timeline, sim.events};
        const char *labels[2] = {"measured", "predicted"};
        st = tide_trace_svg_write(s->plan, tl, labels, 2, svg_path);
        tide_sim_result_free(&sim);
    }
    return st;
}

const char *tide_model_notice(const tide_model *m) { return m->notice; }
