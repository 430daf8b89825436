/*
 * planner_engine.c - the plan-building engine shared by every policy
 * (planner_int.h): residency books, instruction emission with hazard waits, a
 * simulated clock, copies (place, load, store, move, drop) and eviction, and
 * set-up (homes, spill areas, lifetimes, costs, and what a plan reserves from
 * the start: warm tensors, the warm region, the shared scratch). Computes on
 * the device and the host and the end of a plan with its stats are in
 * planner_compute.c. The design note (invariants, state diagram) is at the
 * top of planner.c.
 */
#include "planner/planner_int.h"

#include <assert.h>
#include <string.h>

#define SSD_ALIGN 4096u

/* ---------------------------------------------------------------- small helpers */


int engine_iter(const engine *e, int step) { return e->n_ops ? step / e->n_ops : 0; }

/* Cost of steps [0, s) of the unrolled sequence. */
static double cum_at(const engine *e, int s) {
    return (double)(s / e->n_ops) * e->op_cum[e->n_ops] + e->op_cum[s % e->n_ops];
}

double engine_compute_seconds(const engine *e, int from, int to) {
    return to > from && e->n_ops ? cum_at(e, to) - cum_at(e, from) : 0;
}


int engine_next_use(engine *e, int t) {
    engine_tensor *T = &e->t[t];
    if (T->nu_from <= e->exec && T->nu >= e->exec) return T->nu;
    T->nu = tide_lifetime_use_from(&e->lt, t, e->exec, NULL);
    T->nu_from = e->exec;
    return T->nu;
}

double engine_load_seconds(const engine *e, int t) {
    const engine_tensor *T = &e->t[t];
    tide_tier src = T->cp[TIDE_TIER_HOST].valid || !T->cp[TIDE_TIER_SSD].valid ? TIDE_TIER_HOST : TIDE_TIER_SSD;
    return tide_cost_load(e->hw, src, T->nbytes, e->plan->host_addressable, NULL);
}

double engine_store_seconds(const engine *e, int t, tide_tier tier) {
    return tide_cost_store(e->hw, tier, e->t[t].nbytes, NULL);
}

static uint64_t tier_size(const engine *e, int t, tide_tier tier) {
    uint64_t n = e->t[t].nbytes;
    uint64_t al = tier == TIDE_TIER_SSD ? SSD_ALIGN : TIDE_PLAN_ALIGN;
    return (n + al - 1) / al * al;
}

static tide_arena *tier_arena(engine *e, tide_tier tier) { return tier == TIDE_TIER_SSD ? &e->ssd : &e->host; }

/* Host when it has room, unless host is getting scarce and the value comes
 * back late enough for an SSD round trip to hide in the wait (the host's
 * last quarter is kept for near reuse); SSD when host is full. */
int engine_spill_tier(engine *e, int t) {
    uint64_t n = tier_size(e, t, TIDE_TIER_HOST);
    bool host = e->host_used + n + e->stage_keep <= e->host.size &&
                tide_arena_best_fit(&e->host, n, NULL, NULL, 1) != NULL;
    if (!e->has_ssd) return host ? TIDE_TIER_HOST : -1;
    if (!host) return TIDE_TIER_SSD;
    if (e->host_used + n <= e->host.size / 4 * 3) return TIDE_TIER_HOST;
    int next = engine_next_use(e, t);
    double idle = next == TIDE_NEVER ? 1e30 : engine_compute_seconds(e, e->exec, next);
    double trip = engine_store_seconds(e, t, TIDE_TIER_SSD) + tide_cost_load(e->hw, TIDE_TIER_SSD, e->t[t].nbytes,
                                                                         e->plan->host_addressable, NULL);
    return idle >= trip ? TIDE_TIER_SSD : TIDE_TIER_HOST;
}

/* Distinct tensors of op: inputs first, then outputs not read. */
int op_distinct_tensors(const tide_op *op, int *ts, bool *is_in) {
    int n = 0;
    for (int k = 0; k < op->n_in + op->n_out; k++) {
        int t = k < op->n_in ? op->in[k] : op->out[k - op->n_in];
        bool seen = false;
        for (int j = 0; j < n && !seen; j++) seen = ts[j] == t;
        if (seen) continue;
        is_in[n] = k < op->n_in;
        ts[n++] = t;
    }
    return n;
}

/* ---------------------------------------------------------------- emission */

/* Duration and resources of an instruction: the cost model's, with the ops'
 * costs cached. */
static double ins_cost(const engine *e, const tide_ins *in, unsigned *res) {
    if (in->kind != TIDE_INS_COMPUTE || in->place != TIDE_PLACE_DEVICE) return tide_cost_ins(e->hw, e->g, in, e->plan->host_addressable, res);
    *res = TIDE_RES_COMPUTE;
    return e->op_s[in->op];
}

int engine_emit(engine *e, tide_ins *ins, const waits *w) {
    int waits[TIDE_STREAM_COUNT], n = 0;
    double ready = e->clk.stream_end[ins->stream];
    for (int s = 0; s < TIDE_STREAM_COUNT; s++) {
        if (s == (int)ins->stream || w->w[s] < 0) continue;
        waits[n++] = w->w[s];
        if (e->clk.ins_end[w->w[s]] > ready) ready = e->clk.ins_end[w->w[s]];
    }
    int idx = tide_plan_push(e->plan, ins, waits, n);
    if (idx < 0 || tide_grow((void **)&e->clk.ins_end, &e->clk.cap_end, idx + 1, sizeof *e->clk.ins_end)) {
        e->st = tide_err(e->ctx, TIDE_E_NOMEM, "out of memory planning (%d instructions)", e->plan->n_ins);
        return -1;
    }
    unsigned res = 0;
    double dur = ins_cost(e, ins, &res);
    for (int r = 0; r < TIDE_RES_COUNT; r++)
        if ((res >> r & 1) && e->clk.res_free[r] > ready) ready = e->clk.res_free[r];
    double end = ready + dur;
    for (int r = 0; r < TIDE_RES_COUNT; r++)
        if (res >> r & 1) e->clk.res_free[r] = end;
    e->clk.ins_end[idx] = end;
    e->clk.stream_end[ins->stream] = end;

    tide_plan_stats *ps = &e->plan->stats;
    uint64_t nb = ins->tensor >= 0 ? e->t[ins->tensor].nbytes : 0;
    switch (ins->kind) {
    case TIDE_INS_COMPUTE: {
        ps->compute_s += dur;
        if (ins->place != TIDE_PLACE_DEVICE) break; /* the books below are the compute stream's */
        int step = e->compute_step;
        e->clk.last_compute_step = step;
        e->sp.dev.resolved = step;
        e->clk.last_compute = idx;
        e->clk.cs_after[step] = idx;
        break;
    }
    case TIDE_INS_LOAD:
        ps->n_loads++;
        if (ins->src == TIDE_TIER_SSD) ps->bytes_ssd_read += nb;
        else ps->bytes_h2d += nb;
        break;
    case TIDE_INS_STORE:
        ps->n_stores++;
        if (ins->dst == TIDE_TIER_SSD) ps->bytes_ssd_write += nb;
        else ps->bytes_d2h += nb;
        break;
    case TIDE_INS_MOVE:
        ps->n_moves++;
        if (ins->dst == TIDE_TIER_SSD) ps->bytes_ssd_write += nb;
        else ps->bytes_ssd_read += nb;
        break;
    default:
        break;
    }
    if (ins->stream == TIDE_STREAM_COMPUTE && ins->kind != TIDE_INS_COMPUTE && e->clk.last_compute_step >= 0)
        e->clk.cs_after[e->clk.last_compute_step] = idx;
    return idx;
}

tide_ins engine_ins_new(const engine *e, tide_ins_kind kind, tide_stream s, int step, int t) {
    tide_ins in;
    memset(&in, 0, sizeof in);
    in.kind = kind;
    in.stream = s;
    in.iter = step < 0 ? 0 : step >= e->n_steps ? e->n_iter - 1 : engine_iter(e, step);
    in.op = -1;
    in.tensor = t;
    in.tier_off = TIDE_HOME;
    in.src_off = TIDE_HOME;
    return in;
}

/* ---------------------------------------------------------------- copies */

void engine_place(engine *e, int t, tide_blk *b) {
    engine_tensor *T = &e->t[t];
    assert(T->dev == DEV_NONE && b->owner == t);
    T->dev = DEV_PLACED;
    T->blk = b;
    T->off = b->off;
    memcpy(T->pre, b->rel, sizeof T->pre);
    T->pre_step = b->rel_step;
    space_cand_push(e, t, engine_next_use(e, t));
}

void engine_place_at(engine *e, int t, uint64_t off, const int pre[TIDE_STREAM_COUNT], int pre_step) {
    engine_tensor *T = &e->t[t];
    assert(T->dev == DEV_NONE);
    T->dev = DEV_PLACED;
    T->blk = NULL;
    T->off = off;
    memcpy(T->pre, pre, sizeof T->pre);
    T->pre_step = pre_step;
}

bool engine_place_pinned(engine *e, int t) {
    if (!e->pinned || !e->pinned[t] || e->t[t].dev != DEV_NONE) return false;
    waits w; /* its slot is its own: only its own last copy went before */
    waits_init(&w);
    waits_add(e, &w, e->t[t].drop_ins);
    engine_place_at(e, t, e->pin_off[t], w.w, -1);
    return true;
}

void engine_unplace(engine *e, int t) {
    engine_tensor *T = &e->t[t];
    assert(T->dev == DEV_PLACED);
    if (T->blk) e->sp.last_freed = tide_arena_release(&e->sp.dev, T->blk, T->pre, T->pre_step);
    T->blk = NULL;
    T->dev = DEV_NONE;
}

int engine_load(engine *e, int t, int step, int extra) {
    engine_tensor *T = &e->t[t];
    assert(T->dev == DEV_PLACED);
    tide_tier src = T->cp[TIDE_TIER_HOST].valid ? TIDE_TIER_HOST : TIDE_TIER_SSD;
    engine_copy *c = &T->cp[src];
    if (!c->valid) {
        e->st = tide_err(e->ctx, TIDE_E_INVALID, "plan: internal error: '%s' has no valid copy to load",
                         e->g->tensors[t].name);
        return -1;
    }
    tide_ins in = engine_ins_new(e, TIDE_INS_LOAD, src == TIDE_TIER_HOST ? TIDE_STREAM_H2D : TIDE_STREAM_IO, step, t);
    in.src = src;
    in.dst = TIDE_TIER_DEVICE;
    in.dev_off[0] = T->off;
    in.tier_off = c->home ? TIDE_HOME : c->blk->off;
    waits w;
    waits_init(&w);
    assert(T->pre_step <= e->clk.last_compute_step);
    waits_add_release(e, &w, T->pre, T->pre_step);
    waits_add(e, &w, c->w_ins);
    waits_add(e, &w, extra);
    int idx = engine_emit(e, &in, &w);
    if (idx < 0) return -1;
    T->dev = DEV_VALID;
    T->w_ins = idx;
    for (int s = 0; s < TIDE_STREAM_COUNT; s++) T->r_ins[s] = -1;
    c->r_ins[in.stream] = idx;
    T->n_loads++;
    return idx;
}

/* Gives t a spill copy on tier (none there yet): space in the tier's spill
 * area, whose previous occupants *w then waits for. Returns 0, or -1 with
 * e->st set (no space left). */
int engine_spill_copy(engine *e, int t, tide_tier tier, waits *w) {
    engine_copy *c = &e->t[t].cp[tier];
    assert(!c->exists);
    tide_arena *a = tier_arena(e, tier);
    uint64_t n = tier_size(e, t, tier);
    tide_blk *b = tide_arena_best_fit(a, n, NULL, NULL, 1);
    if (b) b = tide_arena_take(a, b, b->off, n, t);
    if (b && tier == TIDE_TIER_HOST) e->host_used += b->size;
    if (!b) {
        e->st = tide_err(e->ctx, TIDE_E_INFEASIBLE, "plan: no %s spill space left for '%s' (%llu bytes)",
                         tide_tier_name(tier), e->g->tensors[t].name, (unsigned long long)e->t[t].nbytes);
        return -1;
    }
    c->exists = true;
    c->home = false;
    c->blk = b;
    c->w_ins = -1;
    for (int s = 0; s < TIDE_STREAM_COUNT; s++) c->r_ins[s] = -1;
    waits_add_release(e, w, b->rel, -1);
    return 0;
}

uint64_t engine_copy_off(const engine_copy *c) { return c->home ? TIDE_HOME : c->blk->off; }

/* STORE of t's device copy to tier (its home there, else a spill copy).
 * Returns the STORE or -1. */
int engine_store(engine *e, int t, tide_tier tier, int step) {
    engine_tensor *T = &e->t[t];
    engine_copy *c = &T->cp[tier];
    assert(T->dev == DEV_VALID);
    tide_ins in = engine_ins_new(e, TIDE_INS_STORE, tier == TIDE_TIER_HOST ? TIDE_STREAM_D2H : TIDE_STREAM_IO, step, t);
    in.src = TIDE_TIER_DEVICE;
    in.dst = tier;
    in.dev_off[0] = T->off;
    waits w;
    waits_init(&w);
    if (!c->exists && engine_spill_copy(e, t, tier, &w)) return -1;
    in.tier_off = engine_copy_off(c);
    waits_add(e, &w, T->w_ins);
    waits_add(e, &w, c->w_ins);
    for (int s = 0; s < TIDE_STREAM_COUNT; s++) waits_add(e, &w, c->r_ins[s]);
    int idx = engine_emit(e, &in, &w);
    if (idx < 0) return -1;
    c->valid = true;
    c->w_ins = idx;
    for (int s = 0; s < TIDE_STREAM_COUNT; s++) c->r_ins[s] = -1;
    T->r_ins[in.stream] = idx;
    return idx;
}

/* DROP of t's spill copy on tier (a home is never dropped). */
int engine_drop_tier(engine *e, int t, tide_tier tier, int step) {
    engine_tensor *T = &e->t[t];
    engine_copy *c = &T->cp[tier];
    assert(c->exists && !c->home);
    /* On the stream of its latest access, so the DROP delays nothing else. */
    int last = c->w_ins;
    for (int s = 0; s < TIDE_STREAM_COUNT; s++)
        if (c->r_ins[s] >= 0 && (last < 0 || e->clk.ins_end[c->r_ins[s]] > e->clk.ins_end[last])) last = c->r_ins[s];
    tide_stream s0 = last >= 0 ? e->plan->ins[last].stream : TIDE_STREAM_D2H;
    tide_ins in = engine_ins_new(e, TIDE_INS_DROP, s0, step, t);
    in.src = tier;
    in.dst = tier;
    in.tier_off = c->blk->off;
    waits w;
    waits_init(&w);
    waits_add(e, &w, c->w_ins);
    for (int s = 0; s < TIDE_STREAM_COUNT; s++) waits_add(e, &w, c->r_ins[s]);
    int idx = engine_emit(e, &in, &w);
    if (idx < 0) return -1;
    int rel[TIDE_STREAM_COUNT];
    release_one(rel, s0, idx);
    if (tier == TIDE_TIER_HOST) e->host_used -= c->blk->size;
    tide_arena_release(tier_arena(e, tier), c->blk, rel, -1);
    memset(c, 0, sizeof *c);
    c->w_ins = -1;
    for (int s = 0; s < TIDE_STREAM_COUNT; s++) c->r_ins[s] = -1;
    return idx;
}

/* Drops spill copies that hold nothing worth keeping: stale ones, or all of
 * them when t's value is dead. */
int engine_drop_spills(engine *e, int t, int step, bool dead) {
    engine_tensor *T = &e->t[t];
    for (int k = TIDE_TIER_HOST; k <= TIDE_TIER_SSD; k++) {
        engine_copy *c = &T->cp[k];
        if (c->exists && !c->home && (dead || !c->valid) && engine_drop_tier(e, t, (tide_tier)k, step) < 0)
            return -1;
    }
    return 0;
}

/* DROP of t's device copy on stream s, waiting on every access of it. */
int engine_drop_dev(engine *e, int t, tide_stream s, int step) {
    engine_tensor *T = &e->t[t];
    tide_ins in = engine_ins_new(e, TIDE_INS_DROP, s, step, t);
    in.src = TIDE_TIER_DEVICE;
    in.dst = TIDE_TIER_DEVICE;
    in.dev_off[0] = T->off;
    waits w;
    waits_init(&w);
    waits_add(e, &w, T->w_ins);
    for (int k = 0; k < TIDE_STREAM_COUNT; k++) waits_add(e, &w, T->r_ins[k]);
    int idx = engine_emit(e, &in, &w);
    if (idx < 0) return -1;
    /* A doomed copy's bytes were released ahead (space_doom) and may hold
     * another tensor by now: their record already covers this DROP. */
    if (!T->doomed) space_released(e, T->off, T->asize, idx, -1);
    if (T->blk) {
        int rel[TIDE_STREAM_COUNT];
        release_one(rel, s, idx);
        e->sp.last_freed = tide_arena_release(&e->sp.dev, T->blk, rel, -1);
    }
    T->blk = NULL;
    T->dev = DEV_NONE;
    T->w_ins = -1;
    for (int k = 0; k < TIDE_STREAM_COUNT; k++) T->r_ins[k] = -1;
    T->drop_ins = idx;
    return idx;
}

bool engine_evict_info(engine *e, int t, bool *store, bool *reread, int *next) {
    engine_tensor *T = &e->t[t];
    int rw = 0;
    int n = tide_lifetime_use_from(&e->lt, t, e->exec, &rw);
    *next = n;
    *reread = n != TIDE_NEVER && (rw & TIDE_USE_READ);
    tide_tier home = e->plan->home[t];
    bool needed = *reread || (n == TIDE_NEVER && role_homebound(T->role) && !T->cp[home].valid);
    *store = needed && T->dev == DEV_VALID && !T->cp[TIDE_TIER_HOST].valid && !T->cp[TIDE_TIER_SSD].valid;
    if (*store && !role_homebound(T->role) && !role_persistent(T->role)) return engine_spill_tier(e, t) >= 0;
    return true;
}

int engine_evict(engine *e, int t, tide_stream stream, int step) {
    engine_tensor *T = &e->t[t];
    bool store, reread;
    int next;
    if (!engine_evict_info(e, t, &store, &reread, &next)) {
        e->st = tide_err(e->ctx, TIDE_E_INFEASIBLE,
                         "plan: '%s' must be spilled but host spill space is full and there is no SSD",
                         e->g->tensors[t].name);
        return -1;
    }
    tide_stream ds = stream;
    if (store) {
        tide_tier tier = role_homebound(T->role) || role_persistent(T->role) ? e->plan->home[t]
                                                                   : (tide_tier)engine_spill_tier(e, t);
        int s = engine_store(e, t, tier, step);
        if (s < 0) return -1;
        ds = e->plan->ins[s].stream;
    }
    int d = engine_drop_dev(e, t, ds, step);
    if (d < 0) return -1;
    T->evicted = true;
    if (!reread && engine_drop_spills(e, t, step, true) < 0) return -1;
    return d;
}

/* MOVE of t's valid copy on tier `from` (HOST or SSD) to the other one (its
 * home there, else a spill copy). Returns the MOVE or -1. */
int engine_move(engine *e, int t, tide_tier from, int step) {
    engine_tensor *T = &e->t[t];
    tide_tier to = from == TIDE_TIER_SSD ? TIDE_TIER_HOST : TIDE_TIER_SSD;
    engine_copy *src = &T->cp[from], *dst = &T->cp[to];
    assert(src->valid);
    waits w;
    waits_init(&w);
    if (!dst->exists && engine_spill_copy(e, t, to, &w)) return -1;
    tide_ins in = engine_ins_new(e, TIDE_INS_MOVE, TIDE_STREAM_IO, step, t);
    in.src = from;
    in.dst = to;
    in.src_off = engine_copy_off(src);
    in.tier_off = engine_copy_off(dst);
    waits_add(e, &w, src->w_ins);
    waits_add(e, &w, dst->w_ins);
    for (int s = 0; s < TIDE_STREAM_COUNT; s++) waits_add(e, &w, dst->r_ins[s]);
    int idx = engine_emit(e, &in, &w);
    if (idx < 0) return -1;
    dst->valid = true;
    dst->w_ins = idx;
    for (int s = 0; s < TIDE_STREAM_COUNT; s++) dst->r_ins[s] = -1;
    src->r_ins[TIDE_STREAM_IO] = idx;
    return idx;
}

/* ---------------------------------------------------------------- set-up and end */

uint64_t engine_working_set(const engine *e, int o) {
    const tide_op *op = &e->g->ops[o];
    if (e->host_op && e->host_op[o]) return 0;
    int ts[TIDE_OP_MAX_IN + TIDE_OP_MAX_OUT];
    bool is_in[TIDE_OP_MAX_IN + TIDE_OP_MAX_OUT];
    int n = op_distinct_tensors(op, ts, is_in);
    uint64_t s = e->sp.shared ? 0 : tide_plan_align(op->scratch_bytes); /* shared: reserved apart */
    for (int i = 0; i < n; i++)
        if (!e->t[ts[i]].in_place && !e->t[ts[i]].warm) s += e->t[ts[i]].asize;
    return s;
}

/* The shared scratch: the largest device op's, at the lowest free range that
 * holds it (after the warm tensors), reserved for the whole plan. *bytes
 * grows by its size. TIDE_E_INFEASIBLE when no free range holds it. */
static tide_status place_shared_scratch(engine *e, uint64_t *bytes) {
    uint64_t n = 0;
    for (int i = 0; i < e->g->n_ops; i++)
        if (!(e->host_op && e->host_op[i])) n = TIDE_MAX(n, tide_plan_align(e->g->ops[i].scratch_bytes));
    e->sp.shared = true;
    if (!n) return TIDE_OK;
    tide_blk *b = e->sp.dev.head;
    while (b && !(b->owner == TIDE_BLK_FREE && b->size >= n)) b = b->next;
    if (!b)
        return tide_err(e->ctx, TIDE_E_INFEASIBLE, "plan: a device budget of %llu bytes has no room for the "
                        "shared scratch of %llu bytes", (unsigned long long)e->sp.dev.size, (unsigned long long)n);
    e->sp.shared_off = b->off;
    if (!tide_arena_take(&e->sp.dev, b, b->off, n, TIDE_BLK_RESERVED))
        return tide_err(e->ctx, TIDE_E_NOMEM, "out of memory planning");
    *bytes += n;
    return TIDE_OK;
}

/* Reserves the warm tensors' arena ranges and makes their device copies
 * valid from the start (a warm state's home is stale). *bytes: their sum.
 * TIDE_E_INVALID names a warm tensor that is not a weight or state, lies
 * past the budget or overlaps another. */
static tide_status place_warm(engine *e, const uint64_t *warm_off, uint64_t *bytes) {
    const tide_graph *g = e->g;
    for (int t = 0; t < g->n_tensors; t++) {
        if (warm_off[t] == TIDE_HOME) continue;
        engine_tensor *T = &e->t[t];
        const char *nm = g->tensors[t].name;
        uint64_t off = warm_off[t], n = T->asize;
        if (T->role != TIDE_ROLE_WEIGHT && T->role != TIDE_ROLE_STATE)
            return tide_err(e->ctx, TIDE_E_INVALID, "plan: %s '%s' cannot be warm: only weights and state persist "
                            "across runs", tide_role_name(T->role), nm);
        if (off % TIDE_PLAN_ALIGN || off > e->sp.dev.size || n > e->sp.dev.size - off)
            return tide_err(e->ctx, TIDE_E_INVALID, "plan: warm '%s' at arena offset %llu (%llu bytes) is not an "
                            "aligned range inside the budget of %llu bytes", nm, (unsigned long long)off,
                            (unsigned long long)n, (unsigned long long)e->sp.dev.size);
        tide_blk *b = e->sp.dev.head;
        while (b && b->off + b->size <= off) b = b->next;
        if (!b || b->owner != TIDE_BLK_FREE || b->off + b->size < off + n)
            return tide_err(e->ctx, TIDE_E_INVALID, "plan: warm '%s' at arena offset %llu overlaps another warm "
                            "tensor", nm, (unsigned long long)off);
        if (!tide_arena_take(&e->sp.dev, b, off, n, TIDE_BLK_RESERVED))
            return tide_err(e->ctx, TIDE_E_NOMEM, "out of memory planning");
        T->warm = true;
        T->in_place = false;
        T->dev = DEV_VALID;
        T->off = off;
        if (T->role == TIDE_ROLE_STATE) T->cp[e->plan->home[t]].valid = false;
        *bytes += n;
    }
    return TIDE_OK;
}

/* Reserves what the warm tensors leave of the warm region [0, n): nothing
 * else of the plan goes there (the arena's other plans keep warm tensors in
 * those bytes). *bytes grows by what it reserves. TIDE_E_INVALID when n is
 * not an aligned size within the budget. */
static tide_status reserve_warm_region(engine *e, uint64_t n, uint64_t *bytes) {
    if (n % TIDE_PLAN_ALIGN || n > e->sp.dev.size)
        return tide_err(e->ctx, TIDE_E_INVALID, "plan: the warm region of %llu bytes is not a multiple of %u "
                        "within the budget of %llu bytes", (unsigned long long)n, TIDE_PLAN_ALIGN,
                        (unsigned long long)e->sp.dev.size);
    for (tide_blk *b = e->sp.dev.head; b && b->off < n; b = b->next) {
        if (b->owner != TIDE_BLK_FREE) continue;
        uint64_t k = TIDE_MIN(b->off + b->size, n) - b->off;
        if (!(b = tide_arena_take(&e->sp.dev, b, b->off, k, TIDE_BLK_RESERVED)))
            return tide_err(e->ctx, TIDE_E_NOMEM, "out of memory planning");
        *bytes += k;
    }
    e->plan->warm_region = n;
    return TIDE_OK;
}

/* The op schedule of the policy (recomputation of checkpointed
 * activations, the zero-offload policy's host updates) into e->sched and
 * *n_pos; then the tensors' lifetimes over it. */
static tide_status init_schedule(engine *e, const tide_graph *g, const tide_plan_opts *o) {
    tide_ctx *ctx = e->ctx;
    int n_pos = g->n_ops;
    tide_status st = TIDE_OK;
    if (o->policy == TIDE_POLICY_CHECKPOINT_LAYER) {
        if (o->host_ops)
            return tide_err(ctx, TIDE_E_INVALID, "plan: the checkpoint-layer policy does not place ops on the host");
        if ((st = recompute_schedule(ctx, g, NULL, 0, &e->sched, &n_pos))) return st;
    } else if (o->policy == TIDE_POLICY_ZERO_OFFLOAD) {
        /* every AdamW update on the host, activations checkpointed per layer
         * (check_opts refused a caller's host placement) */
        int n_adamw = 0;
        for (int i = 0; i < g->n_ops; i++) n_adamw += g->ops[i].kind == TIDE_OP_ADAMW;
        if (!n_adamw)
            return tide_err(ctx, TIDE_E_INVALID, "plan: the zero-offload policy runs a training step's AdamW "
                            "updates on the host, and this graph has none (plan inference with tide, static-layer "
                            "or lru)");
        if (!(e->own_host_op = tide_malloc((size_t)g->n_ops * sizeof *e->own_host_op)))
            return tide_err(ctx, TIDE_E_NOMEM, "out of memory planning");
        for (int i = 0; i < g->n_ops; i++) e->own_host_op[i] = g->ops[i].kind == TIDE_OP_ADAMW;
        if ((st = recompute_schedule(ctx, g, NULL, 0, &e->sched, &n_pos))) return st;
    } else if (o->policy == TIDE_POLICY_TIDE && o->recompute_cheap) {
        if ((st = recompute_schedule(ctx, g, o->hw, o->recompute_chain, &e->sched, &n_pos))) return st;
    }
    st = tide_lifetime_build_sched(ctx, g, e->sched, n_pos, o->n_iter, &e->lt);
    if (st) return st;
    e->n_ops = n_pos;
    e->n_steps = e->lt.n_steps;
    return TIDE_OK;
}

/* The plan, the per-tensor and per-op tables, the op costs over the
 * schedule. */
static tide_status init_tables(engine *e, const tide_graph *g, const tide_plan_opts *o) {
    const int nt = g->n_tensors;
    const tide_hw *hw = o->hw;
    e->plan = tide_plan_alloc(e->ctx, g, o->n_iter);
    e->t = tide_calloc((size_t)(nt ? nt : 1), sizeof *e->t);
    e->op_s = tide_malloc((size_t)(g->n_ops ? g->n_ops : 1) * sizeof *e->op_s);
    e->op_cum = tide_malloc((size_t)(e->n_ops + 1) * sizeof *e->op_cum);
    e->clk.cs_after = tide_malloc((size_t)(e->n_steps ? e->n_steps : 1) * sizeof *e->clk.cs_after);
    e->sp.scratch_cap = SCRATCH_RING;
    e->sp.scratch = tide_calloc((size_t)e->sp.scratch_cap, sizeof *e->sp.scratch);
    if (!e->plan || !e->t || !e->op_s || !e->op_cum || !e->clk.cs_after || !e->sp.scratch)
        return tide_err(e->ctx, TIDE_E_NOMEM, "out of memory planning a graph of %d ops", g->n_ops);
    tide_plan *p = e->plan;
    p->policy = o->policy;
    p->device_budget = o->device_budget;
    e->op_cum[0] = 0;
    for (int i = 0; i < g->n_ops; i++) e->op_s[i] = tide_cost_op(hw, g, &g->ops[i]);
    for (int i = 0; i < e->n_ops; i++) e->op_cum[i + 1] = e->op_cum[i] + e->op_s[e->sched ? e->sched[i] : i];
    /* About three instructions a step: reserve once rather than copy while
     * doubling (a failure here only means growing later). */
    if (e->n_steps < INT_MAX / 4) {
        int guess = 3 * e->n_steps + 64;
        if (!tide_grow((void **)&p->ins, &p->cap_ins, guess, sizeof *p->ins) &&
            !tide_grow((void **)&p->waits, &p->cap_waits, guess, sizeof *p->waits))
            (void)tide_grow((void **)&e->clk.ins_end, &e->clk.cap_end, guess, sizeof *e->clk.ins_end);
    }
    for (int i = 0; i < e->n_steps; i++) e->clk.cs_after[i] = -1;
    for (int i = 0; i < e->sp.scratch_cap; i++) e->sp.scratch[i].step = -1;
    return TIDE_OK;
}

/* Homes: weights on SSD when asked or when host memory cannot hold them,
 * then state; *host_cap the host memory left for spill copies. */
static tide_status choose_homes(engine *e, const tide_graph *g, const tide_plan_opts *o, uint64_t *host_cap_out) {
    const int nt = g->n_tensors;
    const tide_hw *hw = o->hw;
    tide_plan *p = e->plan;
    uint64_t host_budget = o->host_budget ? o->host_budget : hw->host_mem_bytes;
    uint64_t on_host = 0;
    for (int t = 0; t < nt; t++) {
        tide_role r = g->tensors[t].role;
        if (r == TIDE_ROLE_TEMP) continue;
        if (r == TIDE_ROLE_WEIGHT && o->weights_on_ssd) p->home[t] = TIDE_TIER_SSD;
        else on_host += g->tensors[t].nbytes;
    }
    /* Host computes stage their operands in host spill copies (a state homed
     * on SSD is MOVEd in, updated and MOVEd home): room for the largest
     * one's operands is kept out of the homes when state must go to SSD. */
    uint64_t stage = 0;
    const bool *hops = e->own_host_op ? e->own_host_op : o->host_ops;
    for (int op = 0; hops && op < g->n_ops; op++) {
        if (!hops[op]) continue;
        int ts[TIDE_OP_MAX_IN + TIDE_OP_MAX_OUT];
        bool is_in[TIDE_OP_MAX_IN + TIDE_OP_MAX_OUT];
        int n = op_distinct_tensors(&g->ops[op], ts, is_in);
        uint64_t b = 0;
        for (int i = 0; i < n; i++) b += tide_plan_align(g->tensors[ts[i]].nbytes);
        stage = TIDE_MAX(stage, b);
    }
    uint64_t fit = host_budget > stage ? host_budget - stage : 0;
    for (int pass = 0; host_budget && on_host > host_budget && pass < 2; pass++) {
        if (!e->has_ssd) break;
        tide_role want = pass == 0 ? TIDE_ROLE_WEIGHT : TIDE_ROLE_STATE;
        /* largest first, until the rest fits (with the staging room, once
         * some must go) */
        while (on_host > (pass == 1 ? fit : host_budget)) {
            int best = -1;
            for (int t = 0; t < nt; t++)
                if (g->tensors[t].role == want && p->home[t] == TIDE_TIER_HOST &&
                    (best < 0 || g->tensors[t].nbytes > g->tensors[best].nbytes))
                    best = t;
            if (best < 0) break;
            p->home[best] = TIDE_TIER_SSD;
            on_host -= g->tensors[best].nbytes;
            /* the host computes' staging room, kept from ordinary spills
             * too (they go to SSD instead), or a state homed on SSD may find
             * no room to be staged in */
            if (pass == 1) e->stage_keep = stage;
        }
    }
    if (host_budget && on_host > host_budget)
        return tide_err(e->ctx, TIDE_E_INFEASIBLE,
                        "plan: host memory of %llu bytes cannot hold the %llu bytes that must live there "
                        "(inputs, outputs%s)",
                        (unsigned long long)host_budget, (unsigned long long)on_host,
                        e->has_ssd ? "" : ", weights and state: the profile has no SSD");
    p->host_budget = host_budget;
    uint64_t host_cap = host_budget ? host_budget - on_host : UINT64_C(1) << 60;
    /* Where device memory is host memory, a host spill copy is more of the
     * same memory: the arena is what the budget bounds, so spills go to SSD
     * when there is one (host computes aside, which need host copies). */
    if (o->host_addressable && e->has_ssd && !o->host_ops) host_cap = 0;
    *host_cap_out = host_cap;
    return TIDE_OK;
}

/* Every tensor's starting state: no instruction yet, its home copy (valid
 * but for outputs) for the persistent ones; and the host ops' lookahead. */
static tide_status init_tensors(engine *e, const tide_graph *g, const tide_plan_opts *o) {
    tide_plan *p = e->plan;
    for (int t = 0; t < g->n_tensors; t++) {
        engine_tensor *T = &e->t[t];
        const tide_tensor *gt = &g->tensors[t];
        T->nbytes = gt->nbytes;
        T->asize = tide_plan_align(gt->nbytes);
        T->role = gt->role;
        T->w_ins = -1;
        T->drop_ins = -1;
        T->last_use = -1;
        T->nu_from = INT_MAX;
        for (int s = 0; s < TIDE_STREAM_COUNT; s++) T->r_ins[s] = T->pre[s] = -1;
        T->pre_step = -1;
        for (int k = 0; k < TIDE_TIER_COUNT; k++) {
            T->cp[k].w_ins = -1;
            for (int s = 0; s < TIDE_STREAM_COUNT; s++) T->cp[k].r_ins[s] = -1;
        }
        if (gt->role != TIDE_ROLE_TEMP) {
            engine_copy *c = &T->cp[p->home[t]];
            c->exists = c->home = true;
            c->valid = gt->role != TIDE_ROLE_OUTPUT;
            T->in_place = o->host_addressable && p->home[t] == TIDE_TIER_HOST;
        }
    }
    p->host_addressable = o->host_addressable;
    e->host_op = e->own_host_op ? e->own_host_op : o->host_ops;
    if (e->host_op) {
        if (!(e->next_host = tide_malloc((size_t)(e->n_ops + 1) * sizeof *e->next_host)))
            return tide_err(e->ctx, TIDE_E_NOMEM, "out of memory planning");
        e->next_host[e->n_ops] = e->n_ops;
        for (int i = e->n_ops - 1; i >= 0; i--)
            e->next_host[i] = e->host_op[e->sched ? e->sched[i] : i] ? i : e->next_host[i + 1];
    }
    return TIDE_OK;
}

/* What the whole plan reserves (warm tensors and region, shared scratch),
 * then TIDE_E_INFEASIBLE unless every op's working set fits beside it. */
static tide_status reserve_and_check(engine *e, const tide_graph *g, const tide_plan_opts *o) {
    tide_ctx *ctx = e->ctx;
    tide_status st;
    uint64_t reserved = 0; /* for the whole plan: no op's working set may use it */
    if (o->warm_off && (st = place_warm(e, o->warm_off, &reserved))) return st;
    if (o->warm_region && (st = reserve_warm_region(e, o->warm_region, &reserved))) return st;
    if (o->shared_scratch && (st = place_shared_scratch(e, &reserved))) return st;
    /* Every op's working set must fit beside what is reserved. */
    int which = -1;
    uint64_t need = 0;
    for (int i = 0; i < g->n_ops; i++) {
        uint64_t ws = engine_working_set(e, i);
        if (ws > need) need = ws, which = i;
    }
    if (g->n_ops && need > o->device_budget - reserved) {
        const char *kind = tide_op_name(g->ops[which].kind);
        unsigned long long b = o->device_budget;
        if (!reserved)
            return tide_err(ctx, TIDE_E_INFEASIBLE, "plan: a device budget of %llu bytes is too small: op %d (%s) "
                            "needs at least %llu bytes", b, which, kind, (unsigned long long)need);
        return tide_err(ctx, TIDE_E_INFEASIBLE, "plan: a device budget of %llu bytes is too small: op %d (%s) needs "
                        "%llu bytes plus %llu reserved for the whole plan (warm tensors, shared scratch)", b, which,
                        kind, (unsigned long long)need, (unsigned long long)reserved);
    }
    return TIDE_OK;
}

tide_status engine_init(engine *e, tide_ctx *ctx, const tide_graph *g, const tide_plan_opts *o) {
    memset(e, 0, sizeof *e);
    e->ctx = ctx;
    e->g = g;
    e->hw = o->hw;
    e->n_iter = o->n_iter;
    e->clk.last_compute_step = -1;
    e->clk.last_compute = -1;
    if (!o->hw) return tide_err(ctx, TIDE_E_INVALID, "plan: no hardware profile given");
    if ((unsigned)o->policy >= TIDE_POLICY_COUNT)
        return tide_err(ctx, TIDE_E_INVALID, "plan: unknown policy %d", (int)o->policy);
    tide_status st = init_schedule(e, g, o);
    if (st) return st;
    const tide_hw *hw = o->hw;
    e->has_ssd = hw->ssd_count > 0 && hw->ssd_read_bw > 0 && hw->ssd_write_bw > 0;
    if (o->weights_on_ssd && !e->has_ssd)
        return tide_err(ctx, TIDE_E_INVALID, "plan: weights on SSD asked for, but the profile '%s' has no SSD",
                        hw->name);
    uint64_t host_cap = 0;
    if ((st = init_tables(e, g, o)) || (st = choose_homes(e, g, o, &host_cap))) return st;
    tide_relmap_init(&e->sp.rel);
    if (tide_arena_init(&e->sp.dev, 0, o->device_budget, TIDE_PLAN_ALIGN) ||
        tide_arena_init(&e->host, 0, host_cap, TIDE_PLAN_ALIGN) ||
        tide_arena_init(&e->ssd, 0, e->has_ssd ? UINT64_C(1) << 60 : 0, SSD_ALIGN))
        return tide_err(ctx, TIDE_E_NOMEM, "out of memory planning");
    if ((st = init_tensors(e, g, o))) return st;
    return reserve_and_check(e, g, o);
}

void engine_free(engine *e, bool keep_plan) {
    if (!keep_plan) tide_plan_free(e->plan);
    e->plan = NULL;
    tide_lifetime_free(&e->lt);
    tide_free(e->t);
    tide_free(e->op_s);
    tide_free(e->op_cum);
    tide_free(e->sched);
    tide_free(e->next_host);
    tide_free(e->own_host_op);
    tide_free(e->pinned);
    tide_free(e->pin_off);
    tide_free(e->stream);
    tide_free(e->clk.ins_end);
    tide_free(e->clk.cs_after);
    tide_free(e->sp.scratch);
    tide_free(e->vict);
    tide_free(e->sp.pend);
    tide_free(e->sp.cand);
    tide_arena_free(&e->sp.dev);
    tide_relmap_free(&e->sp.rel);
    tide_arena_free(&e->host);
    tide_arena_free(&e->ssd);
}

bool engine_check(const engine *e) {
    if (!tide_arena_check(&e->sp.dev) || !tide_arena_check(&e->host) || !tide_arena_check(&e->ssd)) return false;
    int owned = 0;
    for (const tide_blk *b = e->sp.dev.head; b; b = b->next) {
        if (b->owner < 0) continue;
        const engine_tensor *T = &e->t[b->owner];
        if (T->blk != b || T->off != b->off || b->size < T->asize || T->dev == DEV_NONE || T->doomed)
            return false;
        owned++;
    }
    int with = 0;
    for (int t = 0; t < e->g->n_tensors; t++) {
        const engine_tensor *T = &e->t[t];
        if (T->blk) with++;
        if (T->dev == DEV_NONE && (T->blk || T->doomed)) return false;
        if (T->doomed && T->blk) return false;
        for (int k = TIDE_TIER_HOST; k <= TIDE_TIER_SSD; k++) {
            const engine_copy *c = &T->cp[k];
            if (c->valid && !c->exists) return false;
            if (c->exists && !c->home && (!c->blk || c->blk->owner != t)) return false;
        }
    }
    return owned == with;
}
