/*
 * baselines.c - the two baseline policies of docs/design.md section 6.4, planned by the
 * same engine as tide (planner_engine.c) so that policy is compared, not
 * engine; their plans are ordinary plans, checked by the same verifier.
 *
 * lru (vDNN / UVM-like): no prefetch. At each op every missing input is
 * loaded on demand: the LOAD is issued when the op's turn comes and waits for
 * the previous COMPUTE (a page fault happens when the kernel runs), and the
 * op waits for the LOAD. Outputs are allocated on demand. When the arena is
 * full the least recently used tensors are evicted (dirty ones stored first).
 * Dead values are freed, as any allocator would.
 *
 * static-layer (ZeRO-Inference, llama.cpp -ngl): whole decoder layers (the
 * persistent tensors of a layer, used only by that layer's ops) are kept
 * resident from layer 0 up to what the budget allows; the other layers stream
 * through two fixed buffers, each the size of the largest streamed layer: the
 * next streamed layer is loaded into one while the current one computes from
 * the other (resident layers are likewise loaded one layer ahead, the first
 * time). Everything else (activations, non-layer weights such as the
 * embedding table, inputs, outputs) lives in the rest of the arena, managed
 * like lru. Layout, low to high offsets:
 *
 *     [ resident layers | buffer 0 | buffer 1 | dynamic region ]
 *
 * The dynamic region is first given what the activations want at their peak,
 * then resident layers take what is left. The smallest feasible budget is
 * therefore two buffers of the largest layer plus that peak.
 *
 * zero-offload (ZeRO-Offload, DeepSpeed): training only. Every ADAMW runs on
 * the host CPU where the master weights and moments live (engine_init marks
 * them; engine_compute_host brings each gradient into host memory and drops
 * the device copies of the parameters it updates, which come up again when
 * next used). Activations are checkpointed per layer (the checkpoint-layer
 * schedule of recompute.c). Each gradient leaves the device as soon as the
 * layer run that wrote it ends: a STORE to host before the next run's first
 * COMPUTE, whether or not memory is short, so the device copy is clean and
 * free to evict. Where host memory is short (a host budget that homes the
 * state on SSD), gradients go to host only while the room to stage the
 * largest update's operands stays free, then to SSD (ZeRO-Infinity's tier);
 * with neither, a gradient stays on the device until evicted or updated.
 * Parameters stay resident while they fit and are loaded on demand
 * otherwise; allocation is lru's (no prefetch, no cost-based choice).
 */
#include "planner/planner_int.h"

#include <string.h>

/* ---------------------------------------------------------------- lru */

/* LRU victim cost: older last use is cheaper; never what step *user uses. */
static double lru_cost(engine *e, int t, void *user) {
    int step = *(const int *)user;
    if (engine_next_use(e, t) <= step) return -1;
    bool store, reread;
    int next;
    if (!engine_evict_info(e, t, &store, &reread, &next)) return -1;
    return 1.0 + (double)(e->t[t].last_use + 1);
}

tide_status policy_lru(engine *e) {
    e->lru_loads = true;
    for (int step = 0; step < e->n_steps; step++) {
        e->exec = step;
        e->prepared = step + 1;
        tide_status st = alloc_prepare_forced(e, step, lru_cost, &step);
        if (!st) st = engine_compute(e, step);
        if (st) return st;
    }
    return TIDE_OK;
}

/* ---------------------------------------------------------------- zero-offload */

/* Whether step ends a layer run: the last step of an iteration or of the
 * plan, a host step, the step before one, or a change of layer. */
static bool zo_run_ends(const engine *e, int step) {
    if (step + 1 >= e->n_steps || (step + 1) % e->n_ops == 0) return true;
    if (engine_on_host(e, step) || engine_on_host(e, step + 1)) return true;
    return engine_op(e, step)->layer != engine_op(e, step + 1)->layer;
}

/* Where gradient t goes: host while stage bytes of the host spill area stay
 * free beside it, else SSD; -1 for neither. */
static int zo_grad_tier(engine *e, int t, uint64_t stage) {
    uint64_t n = e->t[t].asize;
    if (e->host_used + n + stage <= e->host.size && tide_arena_best_fit(&e->host, n, NULL, NULL, 1))
        return TIDE_TIER_HOST;
    return e->has_ssd ? TIDE_TIER_SSD : -1;
}

/* STOREs off the device each gradient that a device COMPUTE at steps
 * [from, to] wrote and whose device copy is its only current one. */
static tide_status zo_store_grads(engine *e, const bool *grad, uint64_t stage, int from, int to) {
    for (int s = from; s <= to; s++) {
        if (engine_on_host(e, s)) continue;
        const tide_op *op = engine_op(e, s);
        for (int k = 0; k < op->n_out; k++) {
            int t = op->out[k];
            const engine_tensor *T = &e->t[t];
            if (!grad[t] || T->dev != DEV_VALID || T->cp[TIDE_TIER_HOST].valid || T->cp[TIDE_TIER_SSD].valid) continue;
            int tier = zo_grad_tier(e, t, stage);
            if (tier >= 0 && engine_store(e, t, (tide_tier)tier, to) < 0) return e->st;
        }
    }
    return TIDE_OK;
}

tide_status policy_zero_offload(engine *e) {
    const tide_graph *g = e->g;
    bool *grad = tide_calloc((size_t)(g->n_tensors ? g->n_tensors : 1), sizeof *grad);
    if (!grad) return e->st = tide_err(e->ctx, TIDE_E_NOMEM, "out of memory planning");
    /* gradients: what an ADAMW reads without updating it; stage: the
     * largest update's operands, staged in host spill space */
    uint64_t stage = 0;
    for (int i = 0; i < g->n_ops; i++) {
        const tide_op *op = &g->ops[i];
        if (op->kind != TIDE_OP_ADAMW) continue;
        int ts[TIDE_OP_MAX_IN + TIDE_OP_MAX_OUT];
        bool is_in[TIDE_OP_MAX_IN + TIDE_OP_MAX_OUT];
        int n = op_distinct_tensors(op, ts, is_in);
        uint64_t b = 0;
        for (int k = 0; k < n; k++) b += e->t[ts[k]].asize;
        stage = TIDE_MAX(stage, b);
        for (int k = 0; k < op->n_in; k++)
            if (!tide_op_writes(op, op->in[k])) grad[op->in[k]] = true;
    }
    e->lru_loads = true;
    tide_status st = TIDE_OK;
    for (int step = 0, run = 0; step < e->n_steps && !st; step++) {
        e->exec = step;
        e->prepared = step + 1;
        if (!engine_on_host(e, step)) st = alloc_prepare_forced(e, step, lru_cost, &step);
        if (!st) st = engine_compute(e, step);
        if (!st && zo_run_ends(e, step)) {
            st = zo_store_grads(e, grad, stage, run, step);
            run = step + 1;
        }
    }
    tide_free(grad);
    return st;
}

/* ---------------------------------------------------------------- static-layer analysis */

typedef struct sl_layout {
    int n_layers;         /* layer indices 0..n_layers-1 */
    int *t_layer;         /* per tensor: its layer when layered, else -1 */
    uint64_t *t_off;      /* per layered tensor: offset inside its layer's slot */
    uint64_t *bytes;      /* per layer: bytes of its layered tensors */
    int *first_op;        /* per layer: first op, -1 when the layer is not usable */
    int *order;           /* usable layers by first op */
    int n_ok;
    uint64_t dyn_min;     /* largest working set of non-layered tensors of one op */
    uint64_t dyn_want;    /* peak of live non-layered tensors over an iteration */
} sl_layout;

static void sl_free(sl_layout *L) {
    tide_free(L->t_layer);
    tide_free(L->t_off);
    tide_free(L->bytes);
    tide_free(L->first_op);
    tide_free(L->order);
    memset(L, 0, sizeof *L);
}

static bool is_persistent(tide_role r) { return r == TIDE_ROLE_WEIGHT || r == TIDE_ROLE_STATE; }

/* Finds the layers a static-layer plan can treat as units: a layer's ops are
 * one contiguous run, and its layered tensors are the persistent tensors of
 * that layer used only by its ops. Returns 0 or -1 (no memory). */
static int sl_analyse(const tide_graph *g, sl_layout *L) {
    memset(L, 0, sizeof *L);
    int nl = 0;
    for (int t = 0; t < g->n_tensors; t++) nl = TIDE_MAX(nl, g->tensors[t].layer + 1);
    for (int i = 0; i < g->n_ops; i++) nl = TIDE_MAX(nl, g->ops[i].layer + 1);
    L->n_layers = nl;
    size_t nt = (size_t)(g->n_tensors ? g->n_tensors : 1), n = (size_t)(nl ? nl : 1);
    L->t_layer = tide_malloc(nt * sizeof *L->t_layer);
    L->t_off = tide_calloc(nt, sizeof *L->t_off);
    L->bytes = tide_calloc(n, sizeof *L->bytes);
    L->first_op = tide_malloc(n * sizeof *L->first_op);
    L->order = tide_malloc(n * sizeof *L->order);
    int *last = tide_malloc(n * sizeof *last), *count = tide_calloc(n, sizeof *count);
    int *first_use = tide_malloc(nt * sizeof *first_use), *last_use = tide_malloc(nt * sizeof *last_use);
    int64_t *delta = tide_calloc((size_t)g->n_ops + 1, sizeof *delta);
    if (!L->t_layer || !L->t_off || !L->bytes || !L->first_op || !L->order || !last || !count ||
        !first_use || !last_use || !delta) {
        tide_free(last), tide_free(count), tide_free(first_use), tide_free(last_use), tide_free(delta);
        sl_free(L);
        return -1;
    }
    for (int l = 0; l < nl; l++) L->first_op[l] = last[l] = -1;
    for (int i = 0; i < g->n_ops; i++) {
        int l = g->ops[i].layer;
        if (l < 0) continue;
        if (L->first_op[l] < 0) L->first_op[l] = i;
        last[l] = i;
        count[l]++;
    }
    for (int l = 0; l < nl; l++)
        if (L->first_op[l] >= 0 && count[l] != last[l] - L->first_op[l] + 1) L->first_op[l] = -1;
    for (int t = 0; t < g->n_tensors; t++) {
        const tide_tensor *tt = &g->tensors[t];
        L->t_layer[t] = is_persistent(tt->role) && tt->layer >= 0 && L->first_op[tt->layer] >= 0 ? tt->layer : -1;
        first_use[t] = last_use[t] = -1;
    }
    for (int i = 0; i < g->n_ops; i++) {
        const tide_op *op = &g->ops[i];
        for (int k = 0; k < op->n_in + op->n_out; k++) {
            int t = k < op->n_in ? op->in[k] : op->out[k - op->n_in];
            if (L->t_layer[t] >= 0 && L->t_layer[t] != op->layer) L->t_layer[t] = -2; /* shared: dynamic */
            if (first_use[t] < 0) first_use[t] = i;
            last_use[t] = i;
        }
    }
    for (int t = 0; t < g->n_tensors; t++) {
        if (L->t_layer[t] == -2 || first_use[t] < 0) L->t_layer[t] = -1;
        int l = L->t_layer[t];
        if (l >= 0) {
            L->t_off[t] = L->bytes[l];
            L->bytes[l] += tide_plan_align(g->tensors[t].nbytes);
        } else if (first_use[t] >= 0) {
            /* live over [first use, last use] of an iteration */
            delta[first_use[t]] += (int64_t)tide_plan_align(g->tensors[t].nbytes);
            delta[last_use[t] + 1] -= (int64_t)tide_plan_align(g->tensors[t].nbytes);
        }
    }
    int64_t live = 0;
    for (int i = 0; i < g->n_ops; i++) {
        const tide_op *op = &g->ops[i];
        live += delta[i];
        uint64_t sc = tide_plan_align(op->scratch_bytes);
        L->dyn_want = TIDE_MAX(L->dyn_want, (uint64_t)live + sc);
        uint64_t ws = sc;
        for (int k = 0; k < op->n_in + op->n_out; k++) {
            int t = k < op->n_in ? op->in[k] : op->out[k - op->n_in];
            bool seen = false;
            for (int j = 0; j < k && !seen; j++) seen = (j < op->n_in ? op->in[j] : op->out[j - op->n_in]) == t;
            if (!seen && L->t_layer[t] < 0) ws += tide_plan_align(g->tensors[t].nbytes);
        }
        L->dyn_min = TIDE_MAX(L->dyn_min, ws);
    }
    L->dyn_want = TIDE_MAX(L->dyn_want, L->dyn_min);
    /* usable layers in op order; a layer with no layered tensor is just ops */
    for (int l = 0; l < nl; l++)
        if (L->first_op[l] >= 0 && L->bytes[l] > 0) L->order[L->n_ok++] = l;
    for (int i = 1; i < L->n_ok; i++)
        for (int j = i; j > 0 && L->first_op[L->order[j]] < L->first_op[L->order[j - 1]]; j--) {
            int x = L->order[j];
            L->order[j] = L->order[j - 1];
            L->order[j - 1] = x;
        }
    tide_free(last), tide_free(count), tide_free(first_use), tide_free(last_use), tide_free(delta);
    return 0;
}

/* Bytes of R resident layers (the first R in order), two buffers for the
 * rest, and dyn. */
static uint64_t sl_need(const sl_layout *L, int R, uint64_t dyn, uint64_t *buf) {
    uint64_t res = 0, mx = 0;
    for (int k = 0; k < L->n_ok; k++) {
        uint64_t b = L->bytes[L->order[k]];
        if (k < R) res += b;
        else mx = TIDE_MAX(mx, b);
    }
    if (buf) *buf = mx;
    return res + 2 * mx + dyn;
}

/* Smallest budget any number of resident layers works with. */
static uint64_t sl_min(const sl_layout *L) {
    uint64_t best = UINT64_MAX;
    for (int r = 0; r <= L->n_ok; r++) best = TIDE_MIN(best, sl_need(L, r, L->dyn_want, NULL));
    return best;
}

uint64_t tide_static_layer_min_budget(const tide_graph *g) {
    sl_layout L;
    if (sl_analyse(g, &L)) return UINT64_MAX;
    uint64_t a = sl_min(&L);
    sl_free(&L);
    return TIDE_MAX(a, tide_graph_max_working_set(g, NULL));
}

/* ---------------------------------------------------------------- static-layer plan */

typedef struct sl_run {
    int layer;
    int first_step;       /* first step of the run */
    bool resident;
} sl_run;

typedef struct sl_state {
    engine *e;
    sl_layout *L;
    sl_run *runs;
    int n_runs, next_issue;
    int *rank;            /* per layer: position in L->order */
    int R;                /* resident layers: order[0..R) */
    uint64_t *res_off;    /* per layer: base of its resident slot */
    uint64_t buf_base[2];
    int cur_buf;          /* buffer of the last streamed run issued, -1 */
    int buf_layer[2];     /* layer whose tensors hold each buffer, -1 */
    waits buf_rel[2];  /* what the current layer's loads into it waited for */
} sl_state;

/* Layered tensors of layer l (in tensor order). */
#define FOR_LAYER_TENSORS(S, l, t) \
    for (int t = 0; t < (S)->e->g->n_tensors; t++) if ((S)->L->t_layer[t] == (l))

/* Places (and loads, when the run reads it first) every layered tensor of
 * run r not yet on the device. */
static tide_status sl_issue(sl_state *S, int r) {
    engine *e = S->e;
    const sl_run *run = &S->runs[r];
    int l = run->layer;
    waits w;
    waits_init(&w);
    uint64_t base;
    if (run->resident) {
        base = S->res_off[l];
    } else {
        bool all_there = true;
        FOR_LAYER_TENSORS(S, l, t) all_there = all_there && e->t[t].dev != DEV_NONE;
        if (all_there) return TIDE_OK; /* the only streamed layer, still in its buffer */
        int b = S->cur_buf < 0 ? 0 : 1 - S->cur_buf;
        int old = S->buf_layer[b];
        if (old >= 0) {
            FOR_LAYER_TENSORS(S, old, t) {
                if (e->t[t].dev == DEV_PLACED) engine_unplace(e, t);
                if (e->t[t].dev == DEV_VALID && engine_evict(e, t, TIDE_STREAM_H2D, run->first_step) < 0)
                    return e->st;
                waits_add(e, &w, e->t[t].drop_ins);
            }
        }
        S->cur_buf = b;
        S->buf_layer[b] = l;
        S->buf_rel[b] = w;
        base = S->buf_base[b];
    }
    FOR_LAYER_TENSORS(S, l, t) {
        engine_tensor *T = &e->t[t];
        if (T->dev != DEV_NONE) continue;
        int rw = 0;
        int u = tide_lifetime_use_from(&e->lt, t, run->first_step, &rw);
        if (u == TIDE_NEVER) continue; /* dead: nothing left to do here */
        engine_place_at(e, t, base + S->L->t_off[t], w.w, -1);
        if ((rw & TIDE_USE_READ) && engine_load(e, t, run->first_step, -1) < 0) return e->st;
    }
    return TIDE_OK;
}

/* Puts back into its slot a layered tensor of step's op that left the
 * device (a dead value dropped before its next write), if its layer holds
 * its slot now. */
static tide_status sl_ensure(sl_state *S, int step) {
    engine *e = S->e;
    const tide_op *op = engine_op(e, step);
    for (int k = 0; k < op->n_in + op->n_out; k++) {
        int t = k < op->n_in ? op->in[k] : op->out[k - op->n_in];
        int l = S->L->t_layer[t];
        if (l < 0 || e->t[t].dev != DEV_NONE) continue;
        waits w;
        uint64_t base;
        if (S->rank[l] < S->R) {
            waits_init(&w);
            base = S->res_off[l];
        } else {
            int b = S->buf_layer[0] == l ? 0 : S->buf_layer[1] == l ? 1 : -1;
            if (b < 0) continue; /* not in a buffer: the dynamic region takes it */
            w = S->buf_rel[b];
            base = S->buf_base[b];
        }
        waits_add(e, &w, e->t[t].drop_ins);
        engine_place_at(e, t, base + S->L->t_off[t], w.w, -1);
        if (tide_op_reads(op, t) && engine_load(e, t, step, -1) < 0) return e->st;
    }
    return TIDE_OK;
}

/* Issues runs up to r + 1: while run r computes, the next layer loads (a
 * streamed one into the other buffer). */
static tide_status sl_issue_ahead(sl_state *S, int r) {
    while (S->next_issue < S->n_runs && S->next_issue <= r + 1) {
        tide_status st = sl_issue(S, S->next_issue++);
        if (st) return st;
    }
    return TIDE_OK;
}

tide_status policy_static_layer(engine *e, uint64_t *min_needed) {
    const tide_graph *g = e->g;
    uint64_t budget = e->plan->device_budget;
    sl_layout L;
    if (sl_analyse(g, &L)) return e->st = tide_err(e->ctx, TIDE_E_NOMEM, "out of memory planning");
    sl_state S;
    memset(&S, 0, sizeof S);
    S.e = e;
    S.L = &L;
    tide_status st = TIDE_OK;
    /* Layout: the dynamic region gets its peak if it can; resident layers
     * take the rest; else the fewest bytes that work. */
    int R = -1;
    uint64_t bufsz = 0;
    /* Slack for fragmentation first (as real systems size their compute
     * buffers generously), then the bare peak. */
    for (int pass = 0; pass < 2 && R < 0; pass++)
        for (int r = L.n_ok; r >= 0; r--)
            if (sl_need(&L, r, pass ? L.dyn_want : L.dyn_want + L.dyn_want / 2, &bufsz) <= budget) {
                R = r;
                break;
            }
    if (R < 0) {
        uint64_t need = sl_min(&L);
        if (min_needed) *min_needed = need;
        st = tide_err(e->ctx, TIDE_E_INFEASIBLE,
                      "plan: static-layer: a device budget of %llu bytes is too small: it needs at least "
                      "%llu bytes (two layer buffers and the activations' peak)",
                      (unsigned long long)budget, (unsigned long long)need);
        sl_free(&L);
        return e->st = st;
    }
    S.R = R;
    S.cur_buf = -1;
    S.buf_layer[0] = S.buf_layer[1] = -1;
    S.n_runs = e->n_iter * L.n_ok;
    size_t nl = (size_t)(L.n_layers ? L.n_layers : 1);
    S.runs = tide_malloc((size_t)(S.n_runs ? S.n_runs : 1) * sizeof *S.runs);
    S.res_off = tide_calloc(nl, sizeof *S.res_off);
    S.rank = tide_malloc(nl * sizeof *S.rank);
    if (!S.runs || !S.res_off || !S.rank) {
        st = e->st = tide_err(e->ctx, TIDE_E_NOMEM, "out of memory planning");
        goto out;
    }
    uint64_t at = 0;
    for (int k = 0; k < L.n_ok; k++) {
        int l = L.order[k];
        S.rank[l] = k;
        if (k < R) {
            S.res_off[l] = at;
            at += L.bytes[l];
        }
    }
    if (R < L.n_ok) {
        S.buf_base[0] = at;
        S.buf_base[1] = at + bufsz;
        at += 2 * bufsz;
    }
    if (at > 0) { /* the static region is out of the dynamic allocator's reach */
        tide_blk *f = e->sp.dev.head;
        if (!tide_arena_take(&e->sp.dev, f, 0, at, TIDE_BLK_RESERVED)) {
            st = e->st = tide_err(e->ctx, TIDE_E_NOMEM, "out of memory planning");
            goto out;
        }
    }
    for (int it = 0, n = 0; it < e->n_iter; it++)
        for (int k = 0; k < L.n_ok; k++, n++) {
            int l = L.order[k];
            S.runs[n].layer = l;
            S.runs[n].first_step = it * e->n_ops + L.first_op[l];
            S.runs[n].resident = k < R;
        }
    /* Before the first op: the first layer. */
    if ((st = sl_issue_ahead(&S, -1))) goto out;
    int run = 0;
    for (int step = 0; step < e->n_steps; step++) {
        e->exec = step;
        e->prepared = step + 1;
        while (run < S.n_runs && S.runs[run].first_step <= step) {
            if ((st = sl_issue_ahead(&S, run))) goto out;
            run++;
        }
        if ((st = sl_ensure(&S, step))) goto out;
        if ((st = alloc_prepare_forced(e, step, lru_cost, &step))) goto out;
        if ((st = engine_compute(e, step))) goto out;
    }
out:
    tide_free(S.runs);
    tide_free(S.res_off);
    tide_free(S.rank);
    sl_free(&L);
    return st;
}
