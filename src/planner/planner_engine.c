/*
 * planner_engine.c - the plan-building engine shared by every policy
 * (planner_int.h): residency books, instruction emission with hazard waits, a
 * simulated clock, eviction, the fallback layout, the end of a plan and its
 * stats. The design note (invariants, state diagram) is at the top of
 * planner.c.
 */
#include "planner/planner_int.h"

#include <assert.h>
#include <string.h>

#define SSD_ALIGN 4096u
#define PE_SCRATCH_RING 4096

/* ---------------------------------------------------------------- small helpers */

static bool persistent(tide_role r) { return r == TIDE_ROLE_WEIGHT || r == TIDE_ROLE_STATE; }
/* Roles whose latest version must reach a home: STATE and OUTPUT. */
static bool homebound(tide_role r) { return r == TIDE_ROLE_STATE || r == TIDE_ROLE_OUTPUT; }

void pw_add(const pe *e, pe_waits *w, int ins) {
    if (ins < 0) return;
    int s = e->plan->ins[ins].stream;
    if (ins > w->w[s]) w->w[s] = ins;
}

void pw_add_rel(const pe *e, pe_waits *w, const int rel[TIDE_STREAM_COUNT], int rel_step) {
    for (int s = 0; s < TIDE_STREAM_COUNT; s++) pw_add(e, w, rel[s]);
    /* A release ahead of execution is only usable by a later COMPUTE, which
     * the compute stream orders by itself. */
    if (rel_step >= 0 && rel_step <= e->last_compute_step) pw_add(e, w, e->cs_after[rel_step]);
}

int pe_iter(const pe *e, int step) { return e->n_ops ? step / e->n_ops : 0; }

/* Cost of steps [0, s) of the unrolled sequence. */
static double cum_at(const pe *e, int s) {
    return (double)(s / e->n_ops) * e->op_cum[e->n_ops] + e->op_cum[s % e->n_ops];
}

double pe_compute_seconds(const pe *e, int from, int to) {
    return to > from && e->n_ops ? cum_at(e, to) - cum_at(e, from) : 0;
}


int pe_next_use(pe *e, int t) {
    pe_tensor *T = &e->t[t];
    if (T->nu_from <= e->exec && T->nu >= e->exec) return T->nu;
    T->nu = tide_lifetime_use_from(&e->lt, t, e->exec, NULL);
    T->nu_from = e->exec;
    return T->nu;
}

double pe_load_seconds(const pe *e, int t) {
    const pe_tensor *T = &e->t[t];
    tide_tier src = T->cp[TIDE_TIER_HOST].valid || !T->cp[TIDE_TIER_SSD].valid ? TIDE_TIER_HOST : TIDE_TIER_SSD;
    return tide_cost_load(e->hw, src, T->nbytes, NULL);
}

double pe_store_seconds(const pe *e, int t, tide_tier tier) {
    return tide_cost_store(e->hw, tier, e->t[t].nbytes, NULL);
}

static uint64_t tier_size(const pe *e, int t, tide_tier tier) {
    uint64_t n = e->t[t].nbytes;
    uint64_t al = tier == TIDE_TIER_SSD ? SSD_ALIGN : TIDE_PLAN_ALIGN;
    return (n + al - 1) / al * al;
}

static tide_arena *tier_arena(pe *e, tide_tier tier) { return tier == TIDE_TIER_SSD ? &e->ssd : &e->host; }

/* Host when it has room, unless host is getting scarce and the value comes
 * back late enough for an SSD round trip to hide in the wait (the host's
 * last quarter is kept for near reuse); SSD when host is full. */
int pe_spill_tier(pe *e, int t) {
    uint64_t n = tier_size(e, t, TIDE_TIER_HOST);
    bool host = tide_arena_best_fit(&e->host, n, NULL, NULL, 1) != NULL;
    if (!e->has_ssd) return host ? TIDE_TIER_HOST : -1;
    if (!host) return TIDE_TIER_SSD;
    if (e->host_used + n <= e->host.size / 4 * 3) return TIDE_TIER_HOST;
    int next = pe_next_use(e, t);
    double idle = next == TIDE_NEVER ? 1e30 : pe_compute_seconds(e, e->exec, next);
    double trip = pe_store_seconds(e, t, TIDE_TIER_SSD) + tide_cost_load(e->hw, TIDE_TIER_SSD, e->t[t].nbytes, NULL);
    return idle >= trip ? TIDE_TIER_SSD : TIDE_TIER_HOST;
}

/* ---------------------------------------------------------------- emission */

/* Duration and resources of an instruction: the cost model's, with the ops'
 * costs cached. */
static double ins_cost(const pe *e, const tide_ins *in, unsigned *res) {
    if (in->kind != TIDE_INS_COMPUTE || in->place != TIDE_PLACE_DEVICE) return tide_cost_ins(e->hw, e->g, in, res);
    *res = TIDE_RES_COMPUTE;
    return e->op_s[in->op];
}

int pe_emit(pe *e, tide_ins *ins, const pe_waits *w) {
    int waits[TIDE_STREAM_COUNT], n = 0;
    double ready = e->stream_end[ins->stream];
    for (int s = 0; s < TIDE_STREAM_COUNT; s++) {
        if (s == (int)ins->stream || w->w[s] < 0) continue;
        waits[n++] = w->w[s];
        if (e->ins_end[w->w[s]] > ready) ready = e->ins_end[w->w[s]];
    }
    int idx = tide_plan_push(e->plan, ins, waits, n);
    if (idx < 0 || tide_grow((void **)&e->ins_end, &e->cap_end, idx + 1, sizeof *e->ins_end)) {
        e->st = tide_err(e->ctx, TIDE_E_NOMEM, "out of memory planning (%d instructions)", e->plan->n_ins);
        return -1;
    }
    unsigned res = 0;
    double dur = ins_cost(e, ins, &res);
    for (int r = 0; r < TIDE_RES_COUNT; r++)
        if ((res >> r & 1) && e->res_free[r] > ready) ready = e->res_free[r];
    double end = ready + dur;
    for (int r = 0; r < TIDE_RES_COUNT; r++)
        if (res >> r & 1) e->res_free[r] = end;
    e->ins_end[idx] = end;
    e->stream_end[ins->stream] = end;

    tide_plan_stats *ps = &e->plan->stats;
    uint64_t nb = ins->tensor >= 0 ? e->t[ins->tensor].nbytes : 0;
    switch (ins->kind) {
    case TIDE_INS_COMPUTE: {
        ps->compute_s += dur;
        if (ins->place != TIDE_PLACE_DEVICE) break; /* the books below are the compute stream's */
        int step = ins->iter * e->n_ops + ins->op;
        e->last_compute_step = step;
        e->dev.resolved = step;
        e->last_compute = idx;
        e->cs_after[step] = idx;
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
    if (ins->stream == TIDE_STREAM_COMPUTE && ins->kind != TIDE_INS_COMPUTE && e->last_compute_step >= 0)
        e->cs_after[e->last_compute_step] = idx;
    return idx;
}

static tide_ins ins_new(const pe *e, tide_ins_kind kind, tide_stream s, int step, int t) {
    tide_ins in;
    memset(&in, 0, sizeof in);
    in.kind = kind;
    in.stream = s;
    in.iter = step < 0 ? 0 : step >= e->n_steps ? e->n_iter - 1 : pe_iter(e, step);
    in.op = -1;
    in.tensor = t;
    in.tier_off = TIDE_HOME;
    in.src_off = TIDE_HOME;
    return in;
}

/* ---------------------------------------------------------------- copies */

void pe_place(pe *e, int t, tide_blk *b) {
    pe_tensor *T = &e->t[t];
    assert(T->dev == PE_DEV_NONE && b->owner == t);
    T->dev = PE_DEV_ALLOC;
    T->blk = b;
    T->off = b->off;
    memcpy(T->pre, b->rel, sizeof T->pre);
    T->pre_step = b->rel_step;
    pe_cand_push(e, t, pe_next_use(e, t));
}

void pe_place_at(pe *e, int t, uint64_t off, const int pre[TIDE_STREAM_COUNT], int pre_step) {
    pe_tensor *T = &e->t[t];
    assert(T->dev == PE_DEV_NONE);
    T->dev = PE_DEV_ALLOC;
    T->blk = NULL;
    T->off = off;
    memcpy(T->pre, pre, sizeof T->pre);
    T->pre_step = pre_step;
}

bool pe_place_pinned(pe *e, int t) {
    if (!e->pinned || !e->pinned[t] || e->t[t].dev != PE_DEV_NONE) return false;
    pe_waits w; /* its slot is its own: only its own last copy went before */
    pw_init(&w);
    pw_add(e, &w, e->t[t].drop_ins);
    pe_place_at(e, t, e->pin_off[t], w.w, -1);
    return true;
}

void pe_unplace(pe *e, int t) {
    pe_tensor *T = &e->t[t];
    assert(T->dev == PE_DEV_ALLOC);
    if (T->blk) e->last_freed = tide_arena_release(&e->dev, T->blk, T->pre, T->pre_step);
    T->blk = NULL;
    T->dev = PE_DEV_NONE;
}

int pe_load(pe *e, int t, int step, int extra) {
    pe_tensor *T = &e->t[t];
    assert(T->dev == PE_DEV_ALLOC);
    tide_tier src = T->cp[TIDE_TIER_HOST].valid ? TIDE_TIER_HOST : TIDE_TIER_SSD;
    pe_copy *c = &T->cp[src];
    if (!c->valid) {
        e->st = tide_err(e->ctx, TIDE_E_INVALID, "plan: internal error: '%s' has no valid copy to load",
                         e->g->tensors[t].name);
        return -1;
    }
    tide_ins in = ins_new(e, TIDE_INS_LOAD, src == TIDE_TIER_HOST ? TIDE_STREAM_H2D : TIDE_STREAM_IO, step, t);
    in.src = src;
    in.dst = TIDE_TIER_DEVICE;
    in.dev_off[0] = T->off;
    in.tier_off = c->home ? TIDE_HOME : c->blk->off;
    pe_waits w;
    pw_init(&w);
    assert(T->pre_step <= e->last_compute_step);
    pw_add_rel(e, &w, T->pre, T->pre_step);
    pw_add(e, &w, c->w_ins);
    pw_add(e, &w, extra);
    int idx = pe_emit(e, &in, &w);
    if (idx < 0) return -1;
    T->dev = PE_DEV_VALID;
    T->w_ins = idx;
    for (int s = 0; s < TIDE_STREAM_COUNT; s++) T->r_ins[s] = -1;
    c->r_ins[in.stream] = idx;
    T->n_loads++;
    return idx;
}

/* Gives t a spill copy on tier (none there yet): space in the tier's spill
 * area, whose previous occupants *w then waits for. Returns 0, or -1 with
 * e->st set (no space left). */
static int spill_copy(pe *e, int t, tide_tier tier, pe_waits *w) {
    pe_copy *c = &e->t[t].cp[tier];
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
    pw_add_rel(e, w, b->rel, -1);
    return 0;
}

static uint64_t copy_off(const pe_copy *c) { return c->home ? TIDE_HOME : c->blk->off; }

/* STORE of t's device copy to tier (its home there, else a spill copy).
 * Returns the STORE or -1. */
static int pe_store(pe *e, int t, tide_tier tier, int step) {
    pe_tensor *T = &e->t[t];
    pe_copy *c = &T->cp[tier];
    assert(T->dev == PE_DEV_VALID);
    tide_ins in = ins_new(e, TIDE_INS_STORE, tier == TIDE_TIER_HOST ? TIDE_STREAM_D2H : TIDE_STREAM_IO, step, t);
    in.src = TIDE_TIER_DEVICE;
    in.dst = tier;
    in.dev_off[0] = T->off;
    pe_waits w;
    pw_init(&w);
    if (!c->exists && spill_copy(e, t, tier, &w)) return -1;
    in.tier_off = copy_off(c);
    pw_add(e, &w, T->w_ins);
    pw_add(e, &w, c->w_ins);
    for (int s = 0; s < TIDE_STREAM_COUNT; s++) pw_add(e, &w, c->r_ins[s]);
    int idx = pe_emit(e, &in, &w);
    if (idx < 0) return -1;
    c->valid = true;
    c->w_ins = idx;
    for (int s = 0; s < TIDE_STREAM_COUNT; s++) c->r_ins[s] = -1;
    T->r_ins[in.stream] = idx;
    return idx;
}

/* DROP of t's spill copy on tier (a home is never dropped). */
static int drop_tier(pe *e, int t, tide_tier tier, int step) {
    pe_tensor *T = &e->t[t];
    pe_copy *c = &T->cp[tier];
    assert(c->exists && !c->home);
    /* On the stream of its latest access, so the DROP delays nothing else. */
    int last = c->w_ins;
    for (int s = 0; s < TIDE_STREAM_COUNT; s++)
        if (c->r_ins[s] >= 0 && (last < 0 || e->ins_end[c->r_ins[s]] > e->ins_end[last])) last = c->r_ins[s];
    tide_stream s0 = last >= 0 ? e->plan->ins[last].stream : TIDE_STREAM_D2H;
    tide_ins in = ins_new(e, TIDE_INS_DROP, s0, step, t);
    in.src = tier;
    in.dst = tier;
    in.tier_off = c->blk->off;
    pe_waits w;
    pw_init(&w);
    pw_add(e, &w, c->w_ins);
    for (int s = 0; s < TIDE_STREAM_COUNT; s++) pw_add(e, &w, c->r_ins[s]);
    int idx = pe_emit(e, &in, &w);
    if (idx < 0) return -1;
    int rel[TIDE_STREAM_COUNT];
    pe_rel_one(rel, s0, idx);
    if (tier == TIDE_TIER_HOST) e->host_used -= c->blk->size;
    tide_arena_release(tier_arena(e, tier), c->blk, rel, -1);
    memset(c, 0, sizeof *c);
    c->w_ins = -1;
    for (int s = 0; s < TIDE_STREAM_COUNT; s++) c->r_ins[s] = -1;
    return idx;
}

/* Drops spill copies that hold nothing worth keeping: stale ones, or all of
 * them when t's value is dead. */
static int drop_spills(pe *e, int t, int step, bool dead) {
    pe_tensor *T = &e->t[t];
    for (int k = TIDE_TIER_HOST; k <= TIDE_TIER_SSD; k++) {
        pe_copy *c = &T->cp[k];
        if (c->exists && !c->home && (dead || !c->valid) && drop_tier(e, t, (tide_tier)k, step) < 0)
            return -1;
    }
    return 0;
}

/* DROP of t's device copy on stream s, waiting on every access of it. */
static int drop_dev(pe *e, int t, tide_stream s, int step) {
    pe_tensor *T = &e->t[t];
    tide_ins in = ins_new(e, TIDE_INS_DROP, s, step, t);
    in.src = TIDE_TIER_DEVICE;
    in.dst = TIDE_TIER_DEVICE;
    in.dev_off[0] = T->off;
    pe_waits w;
    pw_init(&w);
    pw_add(e, &w, T->w_ins);
    for (int k = 0; k < TIDE_STREAM_COUNT; k++) pw_add(e, &w, T->r_ins[k]);
    int idx = pe_emit(e, &in, &w);
    if (idx < 0) return -1;
    /* A doomed copy's bytes were released ahead (pe_doom) and may hold
     * another tensor by now: their record already covers this DROP. */
    if (!T->doomed) pe_devrel(e, T->off, T->asize, idx, -1);
    if (T->blk) {
        int rel[TIDE_STREAM_COUNT];
        pe_rel_one(rel, s, idx);
        e->last_freed = tide_arena_release(&e->dev, T->blk, rel, -1);
    }
    T->blk = NULL;
    T->dev = PE_DEV_NONE;
    T->w_ins = -1;
    for (int k = 0; k < TIDE_STREAM_COUNT; k++) T->r_ins[k] = -1;
    T->drop_ins = idx;
    return idx;
}

bool pe_evict_info(pe *e, int t, bool *store, bool *reread, int *next) {
    pe_tensor *T = &e->t[t];
    int rw = 0;
    int n = tide_lifetime_use_from(&e->lt, t, e->exec, &rw);
    *next = n;
    *reread = n != TIDE_NEVER && (rw & TIDE_USE_READ);
    tide_tier home = e->plan->home[t];
    bool needed = *reread || (n == TIDE_NEVER && homebound(T->role) && !T->cp[home].valid);
    *store = needed && T->dev == PE_DEV_VALID && !T->cp[TIDE_TIER_HOST].valid && !T->cp[TIDE_TIER_SSD].valid;
    if (*store && !homebound(T->role) && !persistent(T->role)) return pe_spill_tier(e, t) >= 0;
    return true;
}

int pe_evict(pe *e, int t, tide_stream stream, int step) {
    pe_tensor *T = &e->t[t];
    bool store, reread;
    int next;
    if (!pe_evict_info(e, t, &store, &reread, &next)) {
        e->st = tide_err(e->ctx, TIDE_E_INFEASIBLE,
                         "plan: '%s' must be spilled but host spill space is full and there is no SSD",
                         e->g->tensors[t].name);
        return -1;
    }
    tide_stream ds = stream;
    if (store) {
        tide_tier tier = homebound(T->role) || persistent(T->role) ? e->plan->home[t]
                                                                   : (tide_tier)pe_spill_tier(e, t);
        int s = pe_store(e, t, tier, step);
        if (s < 0) return -1;
        ds = e->plan->ins[s].stream;
    }
    int d = drop_dev(e, t, ds, step);
    if (d < 0) return -1;
    T->evicted = true;
    if (!reread && drop_spills(e, t, step, true) < 0) return -1;
    return d;
}

/* ---------------------------------------------------------------- compute */

/* Operand k of a COMPUTE is tensor t's host home, used in place: waits for
 * its last writer (a read) or every access since (a write). */
static void in_place_opnd(pe *e, tide_ins *in, pe_waits *w, int k, int t, bool write) {
    pe_copy *c = &e->t[t].cp[TIDE_TIER_HOST];
    in->host_opnd |= (uint16_t)(1u << k);
    in->dev_off[k] = TIDE_HOME;
    pw_add(e, w, c->w_ins);
    if (write)
        for (int s = 0; s < TIDE_STREAM_COUNT; s++) pw_add(e, w, c->r_ins[s]);
}

/* After COMPUTE c (on stream s) wrote host copy cp of t: it holds the only
 * current version. */
static void host_written(pe *e, int t, pe_copy *cp, int c, tide_stream s) {
    pe_tensor *T = &e->t[t];
    T->cp[TIDE_TIER_HOST].valid = T->cp[TIDE_TIER_SSD].valid = false;
    cp->valid = true;
    cp->w_ins = c;
    for (int k = 0; k < TIDE_STREAM_COUNT; k++) cp->r_ins[k] = -1;
    cp->r_ins[s] = c;
}

tide_status pe_compute(pe *e, int step) {
    if (pe_on_host(e, step)) return pe_compute_host(e, step);
    const tide_op *op = &e->g->ops[pe_op_index(e, step)];
    tide_ins in = ins_new(e, TIDE_INS_COMPUTE, TIDE_STREAM_COMPUTE, step, -1);
    in.op = pe_op_index(e, step);
    pe_waits w;
    pw_init(&w);
    for (int i = 0; i < op->n_in; i++) {
        pe_tensor *T = &e->t[op->in[i]];
        if (T->in_place) {
            in_place_opnd(e, &in, &w, i, op->in[i], false);
            continue;
        }
        if (T->dev != PE_DEV_VALID)
            return e->st = tide_err(e->ctx, TIDE_E_INVALID, "plan: internal error: op %d input '%s' not on the device",
                                    in.op, e->g->tensors[op->in[i]].name);
        pw_add(e, &w, T->w_ins);
        in.dev_off[i] = T->off;
    }
    for (int j = 0; j < op->n_out; j++) {
        pe_tensor *T = &e->t[op->out[j]];
        if (T->in_place) {
            in_place_opnd(e, &in, &w, op->n_in + j, op->out[j], true);
            continue;
        }
        if (T->dev == PE_DEV_NONE)
            return e->st = tide_err(e->ctx, TIDE_E_INVALID, "plan: internal error: op %d output '%s' not placed",
                                    in.op, e->g->tensors[op->out[j]].name);
        if (T->dev == PE_DEV_ALLOC) {
            pw_add_rel(e, &w, T->pre, T->pre_step);
        } else {
            pw_add(e, &w, T->w_ins);
            for (int s = 0; s < TIDE_STREAM_COUNT; s++) pw_add(e, &w, T->r_ins[s]);
        }
        in.dev_off[op->n_in + j] = T->off;
    }
    pe_scratch *sl = &e->scratch[step % e->scratch_cap];
    if (op->scratch_bytes) {
        if (sl->step != step)
            return e->st = tide_err(e->ctx, TIDE_E_INVALID, "plan: internal error: op %d has no scratch", in.op);
        in.scratch_off = sl->off;
        pw_add_rel(e, &w, sl->pre, sl->pre_step);
    }
    int c = pe_emit(e, &in, &w);
    if (c < 0) return e->st;
    if (op->scratch_bytes) {
        if (sl->blk) {
            int rel[TIDE_STREAM_COUNT];
            pe_rel_one(rel, TIDE_STREAM_COMPUTE, c);
            pe_devrel(e, sl->off, sl->blk->size, c, -1);
            tide_arena_release(&e->dev, sl->blk, rel, -1);
        }
        sl->step = -1;
        sl->blk = NULL;
    }
    for (int i = 0; i < op->n_in; i++) {
        pe_tensor *T = &e->t[op->in[i]];
        if (T->in_place) T->cp[TIDE_TIER_HOST].r_ins[TIDE_STREAM_COMPUTE] = c;
        else T->r_ins[TIDE_STREAM_COMPUTE] = c;
        T->last_use = step;
    }
    for (int j = 0; j < op->n_out; j++) {
        pe_tensor *T = &e->t[op->out[j]];
        T->last_use = step;
        if (T->in_place) {
            host_written(e, op->out[j], &T->cp[TIDE_TIER_HOST], c, TIDE_STREAM_COMPUTE);
            continue;
        }
        T->dev = PE_DEV_VALID;
        T->w_ins = c;
        for (int s = 0; s < TIDE_STREAM_COUNT; s++) T->r_ins[s] = -1;
        T->cp[TIDE_TIER_HOST].valid = T->cp[TIDE_TIER_SSD].valid = false;
    }
    /* After the op: drops of what died, final stores. */
    int ts[TIDE_OP_MAX_IN + TIDE_OP_MAX_OUT];
    bool is_in[TIDE_OP_MAX_IN + TIDE_OP_MAX_OUT];
    int n = pe_op_tensors(op, ts, is_in);
    for (int i = 0; i < n; i++) {
        int t = ts[i];
        pe_tensor *T = &e->t[t];
        if (T->in_place || T->warm) continue; /* where they live for the whole plan */
        bool written = tide_op_writes(op, t);
        int nrw = 0;
        int next = tide_lifetime_next_use(&e->lt, t, step, &nrw);
        bool dead = next == TIDE_NEVER || nrw == TIDE_USE_WRITE;
        /* a streamed persistent tensor leaves after its last use of the
         * iteration (a dirty one through a STORE home) */
        bool leaves = e->stream && e->stream[t] && pe_op_index(e, step) == tide_lifetime_last_op(&e->lt, t);
        if (T->doomed && T->doom_step == step) {
            if (drop_dev(e, t, TIDE_STREAM_COMPUTE, step) < 0) return e->st;
            T->doomed = false;
            if (drop_spills(e, t, step, true) < 0) return e->st;
            continue;
        }
        if (written && drop_spills(e, t, step, false) < 0) return e->st;
        int sidx = -1;
        tide_tier home = e->plan->home[t];
        if (homebound(T->role) && !T->cp[home].valid &&
            ((written && step == tide_lifetime_last_write(&e->lt, t)) || next == TIDE_NEVER || leaves)) {
            /* the final version: write it home now, the link is idle */
            if ((sidx = pe_store(e, t, home, step)) < 0) return e->st;
        }
        /* A dead value whose next write is already prepared keeps its bytes:
         * that write reuses them in place. */
        if ((dead || leaves) && !(next != TIDE_NEVER && next < e->prepared)) {
            tide_stream ds = sidx >= 0 ? e->plan->ins[sidx].stream : TIDE_STREAM_COMPUTE;
            if (drop_dev(e, t, ds, step) < 0) return e->st;
            if (drop_spills(e, t, step, true) < 0) return e->st;
        }
        if (T->blk && T->dev == PE_DEV_VALID) pe_cand_push(e, t, next);
    }
    pe_pend_resolve(e, step);
    return e->st;
}

/* ---------------------------------------------------------------- host computes */

/* MOVE of t's valid SSD copy to host memory (its home there, else a spill
 * copy). Returns the MOVE or -1. */
static int move_to_host(pe *e, int t, int step) {
    pe_tensor *T = &e->t[t];
    pe_copy *src = &T->cp[TIDE_TIER_SSD], *dst = &T->cp[TIDE_TIER_HOST];
    assert(src->valid);
    pe_waits w;
    pw_init(&w);
    if (!dst->exists && spill_copy(e, t, TIDE_TIER_HOST, &w)) return -1;
    tide_ins in = ins_new(e, TIDE_INS_MOVE, TIDE_STREAM_IO, step, t);
    in.src = TIDE_TIER_SSD;
    in.dst = TIDE_TIER_HOST;
    in.src_off = copy_off(src);
    in.tier_off = copy_off(dst);
    pw_add(e, &w, src->w_ins);
    pw_add(e, &w, dst->w_ins);
    for (int s = 0; s < TIDE_STREAM_COUNT; s++) pw_add(e, &w, dst->r_ins[s]);
    int idx = pe_emit(e, &in, &w);
    if (idx < 0) return -1;
    dst->valid = true;
    dst->w_ins = idx;
    for (int s = 0; s < TIDE_STREAM_COUNT; s++) dst->r_ins[s] = -1;
    src->r_ins[TIDE_STREAM_IO] = idx;
    return idx;
}

tide_status pe_compute_host(pe *e, int step) {
    const int o = pe_op_index(e, step);
    const tide_op *op = &e->g->ops[o];
    int ts[TIDE_OP_MAX_IN + TIDE_OP_MAX_OUT];
    bool is_in[TIDE_OP_MAX_IN + TIDE_OP_MAX_OUT];
    int n = pe_op_tensors(op, ts, is_in);
    pe_waits w;
    pw_init(&w);
    for (int i = 0; i < n; i++) {
        int t = ts[i];
        pe_tensor *T = &e->t[t];
        const char *nm = e->g->tensors[t].name;
        if (T->warm && tide_op_writes(op, t))
            return e->st = tide_err(e->ctx, TIDE_E_UNSUPPORTED, "plan: op %d, placed on the host, writes '%s', "
                                    "which is kept warm on the device", o, nm);
        if (tide_op_writes(op, t) && T->role != TIDE_ROLE_TEMP && e->plan->home[t] != TIDE_TIER_HOST)
            return e->st = tide_err(e->ctx, TIDE_E_UNSUPPORTED, "plan: op %d, placed on the host, writes '%s', "
                                    "whose home is on SSD", o, nm);
        if (tide_op_reads(op, t) && !T->cp[TIDE_TIER_HOST].valid) {
            /* its value into host memory: from the device, else from SSD */
            int r = T->dev == PE_DEV_VALID    ? pe_store(e, t, TIDE_TIER_HOST, step)
                  : T->cp[TIDE_TIER_SSD].valid ? move_to_host(e, t, step)
                                               : (e->st = tide_err(e->ctx, TIDE_E_INVALID, "plan: internal error: "
                                                                   "'%s' has no valid copy for op %d", nm, o), -1);
            if (r < 0) return e->st;
        } else if (!T->cp[TIDE_TIER_HOST].exists && spill_copy(e, t, TIDE_TIER_HOST, &w)) {
            return e->st;
        }
    }
    tide_ins in = ins_new(e, TIDE_INS_COMPUTE, TIDE_STREAM_HOST, step, -1);
    in.op = o;
    in.place = TIDE_PLACE_HOST;
    for (int k = 0; k < op->n_in + op->n_out; k++) {
        bool out = k >= op->n_in;
        pe_copy *c = &e->t[out ? op->out[k - op->n_in] : op->in[k]].cp[TIDE_TIER_HOST];
        in.host_opnd |= (uint16_t)(1u << k);
        in.dev_off[k] = copy_off(c);
        pw_add(e, &w, c->w_ins);
        if (out)
            for (int s = 0; s < TIDE_STREAM_COUNT; s++) pw_add(e, &w, c->r_ins[s]);
    }
    int c = pe_emit(e, &in, &w);
    if (c < 0) return e->st;
    for (int i = 0; i < n; i++) {
        pe_tensor *T = &e->t[ts[i]];
        T->last_use = step;
        if (tide_op_writes(op, ts[i])) host_written(e, ts[i], &T->cp[TIDE_TIER_HOST], c, TIDE_STREAM_HOST);
        else T->cp[TIDE_TIER_HOST].r_ins[TIDE_STREAM_HOST] = c;
    }
    /* device copies of what it wrote are stale; what died here goes everywhere */
    for (int i = 0; i < n; i++) {
        int t = ts[i], nrw = 0;
        pe_tensor *T = &e->t[t];
        if (T->in_place || T->warm) continue;
        bool written = tide_op_writes(op, t);
        int next = tide_lifetime_next_use(&e->lt, t, step, &nrw);
        bool dead = next == TIDE_NEVER || nrw == TIDE_USE_WRITE;
        if (written || dead) {
            if (T->dev == PE_DEV_ALLOC) pe_unplace(e, t);
            else if (T->dev == PE_DEV_VALID && drop_dev(e, t, TIDE_STREAM_COMPUTE, step) < 0) return e->st;
            T->doomed = false;
        }
        if (drop_spills(e, t, step, dead && !written) < 0) return e->st;
        if (dead && written && T->role == TIDE_ROLE_TEMP && drop_spills(e, t, step, true) < 0) return e->st;
    }
    return e->st;
}

/* ---------------------------------------------------------------- set-up and end */

uint64_t pe_working_set(const pe *e, int o) {
    const tide_op *op = &e->g->ops[o];
    if (e->host_op && e->host_op[o]) return 0;
    int ts[TIDE_OP_MAX_IN + TIDE_OP_MAX_OUT];
    bool is_in[TIDE_OP_MAX_IN + TIDE_OP_MAX_OUT];
    int n = pe_op_tensors(op, ts, is_in);
    uint64_t s = tide_plan_align(op->scratch_bytes);
    for (int i = 0; i < n; i++)
        if (!e->t[ts[i]].in_place && !e->t[ts[i]].warm) s += e->t[ts[i]].asize;
    return s;
}

/* Reserves the warm tensors' arena ranges and makes their device copies
 * valid from the start (a warm state's home is stale). *bytes: their sum.
 * TIDE_E_INVALID names a warm tensor that is not a weight or state, lies
 * past the budget or overlaps another. */
static tide_status place_warm(pe *e, const uint64_t *warm_off, uint64_t *bytes) {
    const tide_graph *g = e->g;
    for (int t = 0; t < g->n_tensors; t++) {
        if (warm_off[t] == TIDE_HOME) continue;
        pe_tensor *T = &e->t[t];
        const char *nm = g->tensors[t].name;
        uint64_t off = warm_off[t], n = T->asize;
        if (T->role != TIDE_ROLE_WEIGHT && T->role != TIDE_ROLE_STATE)
            return tide_err(e->ctx, TIDE_E_INVALID, "plan: %s '%s' cannot be warm: only weights and state persist "
                            "across runs", tide_role_name(T->role), nm);
        if (off % TIDE_PLAN_ALIGN || off > e->dev.size || n > e->dev.size - off)
            return tide_err(e->ctx, TIDE_E_INVALID, "plan: warm '%s' at arena offset %llu (%llu bytes) is not an "
                            "aligned range inside the budget of %llu bytes", nm, (unsigned long long)off,
                            (unsigned long long)n, (unsigned long long)e->dev.size);
        tide_blk *b = e->dev.head;
        while (b && b->off + b->size <= off) b = b->next;
        if (!b || b->owner != TIDE_BLK_FREE || b->off + b->size < off + n)
            return tide_err(e->ctx, TIDE_E_INVALID, "plan: warm '%s' at arena offset %llu overlaps another warm "
                            "tensor", nm, (unsigned long long)off);
        if (!tide_arena_take(&e->dev, b, off, n, TIDE_BLK_RESERVED))
            return tide_err(e->ctx, TIDE_E_NOMEM, "out of memory planning");
        T->warm = true;
        T->in_place = false;
        T->dev = PE_DEV_VALID;
        T->off = off;
        if (T->role == TIDE_ROLE_STATE) T->cp[e->plan->home[t]].valid = false;
        *bytes += n;
    }
    return TIDE_OK;
}

tide_status pe_init(pe *e, tide_ctx *ctx, const tide_graph *g, const tide_plan_opts *o) {
    memset(e, 0, sizeof *e);
    e->ctx = ctx;
    e->g = g;
    e->hw = o->hw;
    e->n_iter = o->n_iter;
    e->last_compute_step = -1;
    e->last_compute = -1;
    if (!o->hw) return tide_err(ctx, TIDE_E_INVALID, "plan: no hardware profile given");
    if ((unsigned)o->policy >= TIDE_POLICY_COUNT)
        return tide_err(ctx, TIDE_E_INVALID, "plan: unknown policy %d", (int)o->policy);
    tide_status st = tide_lifetime_build(ctx, g, o->n_iter, &e->lt);
    if (st) return st;
    e->n_ops = g->n_ops;
    e->n_steps = e->lt.n_steps;
    int nt = g->n_tensors;
    const tide_hw *hw = o->hw;
    e->has_ssd = hw->ssd_count > 0 && hw->ssd_read_bw > 0 && hw->ssd_write_bw > 0;
    if (o->weights_on_ssd && !e->has_ssd)
        return tide_err(ctx, TIDE_E_INVALID, "plan: weights on SSD asked for, but the profile '%s' has no SSD",
                        hw->name);

    e->plan = tide_plan_alloc(ctx, g, o->n_iter);
    e->t = tide_calloc((size_t)(nt ? nt : 1), sizeof *e->t);
    e->op_s = tide_malloc((size_t)(g->n_ops ? g->n_ops : 1) * sizeof *e->op_s);
    e->op_cum = tide_malloc((size_t)(g->n_ops + 1) * sizeof *e->op_cum);
    e->cs_after = tide_malloc((size_t)(e->n_steps ? e->n_steps : 1) * sizeof *e->cs_after);
    e->scratch_cap = PE_SCRATCH_RING;
    e->scratch = tide_calloc((size_t)e->scratch_cap, sizeof *e->scratch);
    if (!e->plan || !e->t || !e->op_s || !e->op_cum || !e->cs_after || !e->scratch)
        return tide_err(ctx, TIDE_E_NOMEM, "out of memory planning a graph of %d ops", g->n_ops);
    tide_plan *p = e->plan;
    p->policy = o->policy;
    p->device_budget = o->device_budget;
    e->op_cum[0] = 0;
    for (int i = 0; i < g->n_ops; i++) {
        e->op_s[i] = tide_cost_op(hw, g, &g->ops[i]);
        e->op_cum[i + 1] = e->op_cum[i] + e->op_s[i];
    }
    /* About three instructions a step: reserve once rather than copy while
     * doubling (a failure here only means growing later). */
    if (e->n_steps < INT_MAX / 4) {
        int guess = 3 * e->n_steps + 64;
        if (!tide_grow((void **)&p->ins, &p->cap_ins, guess, sizeof *p->ins) &&
            !tide_grow((void **)&p->waits, &p->cap_waits, guess, sizeof *p->waits))
            (void)tide_grow((void **)&e->ins_end, &e->cap_end, guess, sizeof *e->ins_end);
    }
    for (int i = 0; i < e->n_steps; i++) e->cs_after[i] = -1;
    for (int i = 0; i < e->scratch_cap; i++) e->scratch[i].step = -1;

    /* Homes: weights on SSD when asked or when host memory cannot hold them. */
    uint64_t host_budget = o->host_budget ? o->host_budget : hw->host_mem_bytes;
    uint64_t on_host = 0;
    for (int t = 0; t < nt; t++) {
        tide_role r = g->tensors[t].role;
        if (r == TIDE_ROLE_TEMP) continue;
        if (r == TIDE_ROLE_WEIGHT && o->weights_on_ssd) p->home[t] = TIDE_TIER_SSD;
        else on_host += g->tensors[t].nbytes;
    }
    for (int pass = 0; host_budget && on_host > host_budget && pass < 2; pass++) {
        if (!e->has_ssd) break;
        tide_role want = pass == 0 ? TIDE_ROLE_WEIGHT : TIDE_ROLE_STATE;
        /* largest first, until the rest fits */
        while (on_host > host_budget) {
            int best = -1;
            for (int t = 0; t < nt; t++)
                if (g->tensors[t].role == want && p->home[t] == TIDE_TIER_HOST &&
                    (best < 0 || g->tensors[t].nbytes > g->tensors[best].nbytes))
                    best = t;
            if (best < 0) break;
            p->home[best] = TIDE_TIER_SSD;
            on_host -= g->tensors[best].nbytes;
        }
    }
    if (host_budget && on_host > host_budget)
        return tide_err(ctx, TIDE_E_INFEASIBLE,
                        "plan: host memory of %llu bytes cannot hold the %llu bytes that must live there "
                        "(inputs, outputs%s)",
                        (unsigned long long)host_budget, (unsigned long long)on_host,
                        e->has_ssd ? "" : ", weights and state: the profile has no SSD");
    p->host_budget = host_budget;
    uint64_t host_cap = host_budget ? host_budget - on_host : UINT64_C(1) << 60;
    tide_relmap_init(&e->rel);
    if (tide_arena_init(&e->dev, 0, o->device_budget, TIDE_PLAN_ALIGN) ||
        tide_arena_init(&e->host, 0, host_cap, TIDE_PLAN_ALIGN) ||
        tide_arena_init(&e->ssd, 0, e->has_ssd ? UINT64_C(1) << 60 : 0, SSD_ALIGN))
        return tide_err(ctx, TIDE_E_NOMEM, "out of memory planning");

    for (int t = 0; t < nt; t++) {
        pe_tensor *T = &e->t[t];
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
            pe_copy *c = &T->cp[p->home[t]];
            c->exists = c->home = true;
            c->valid = gt->role != TIDE_ROLE_OUTPUT;
            T->in_place = o->host_addressable && p->home[t] == TIDE_TIER_HOST;
        }
    }
    p->host_addressable = o->host_addressable;
    e->host_op = o->host_ops;
    if (e->host_op) {
        if (!(e->next_host = tide_malloc((size_t)(g->n_ops + 1) * sizeof *e->next_host)))
            return tide_err(ctx, TIDE_E_NOMEM, "out of memory planning");
        e->next_host[g->n_ops] = g->n_ops;
        for (int i = g->n_ops - 1; i >= 0; i--) e->next_host[i] = e->host_op[i] ? i : e->next_host[i + 1];
    }
    uint64_t warm_bytes = 0;
    if (o->warm_off && (st = place_warm(e, o->warm_off, &warm_bytes))) return st;
    /* Every op's working set must fit beside the warm tensors. */
    int which = -1;
    uint64_t need = 0;
    for (int i = 0; i < g->n_ops; i++) {
        uint64_t ws = pe_working_set(e, i);
        if (ws > need) need = ws, which = i;
    }
    if (g->n_ops && need > o->device_budget - warm_bytes)
        return tide_err(ctx, TIDE_E_INFEASIBLE,
                        "plan: a device budget of %llu bytes is too small: op %d (%s) needs at least %llu bytes%s",
                        (unsigned long long)o->device_budget, which, tide_op_name(g->ops[which].kind),
                        (unsigned long long)(need + warm_bytes), warm_bytes ? " with the warm tensors" : "");
    return TIDE_OK;
}

void pe_free(pe *e, bool keep_plan) {
    if (!keep_plan) tide_plan_free(e->plan);
    e->plan = NULL;
    tide_lifetime_free(&e->lt);
    tide_free(e->t);
    tide_free(e->op_s);
    tide_free(e->op_cum);
    tide_free(e->next_host);
    tide_free(e->pinned);
    tide_free(e->pin_off);
    tide_free(e->stream);
    tide_free(e->ins_end);
    tide_free(e->cs_after);
    tide_free(e->scratch);
    tide_free(e->vict);
    tide_free(e->pend);
    tide_free(e->cand);
    tide_arena_free(&e->dev);
    tide_relmap_free(&e->rel);
    tide_arena_free(&e->host);
    tide_arena_free(&e->ssd);
}

tide_status pe_finish(pe *e, bool simulate, double t0) {
    tide_plan *p = e->plan;
    int end = e->n_steps;
    e->exec = end;
    /* Resident: persistent tensors that stayed on the device from their one
     * load (or first write) to the end of a multi-iteration plan. They stay
     * there; their homes get the final version. */
    for (int t = 0; t < e->g->n_tensors; t++) {
        pe_tensor *T = &e->t[t];
        p->resident[t] = e->n_iter > 1 && persistent(T->role) && T->dev == PE_DEV_VALID && !T->evicted &&
                         T->n_loads <= 1 && !T->warm;
        if (T->warm) p->warm_off[t] = T->off;
    }
    for (int t = 0; t < e->g->n_tensors; t++) {
        pe_tensor *T = &e->t[t];
        if (T->warm) continue; /* stays, with its latest version */
        if (T->dev == PE_DEV_ALLOC) pe_unplace(e, t);
        if (T->dev != PE_DEV_VALID) continue;
        int sidx = -1;
        tide_tier home = p->home[t];
        if (homebound(T->role) && !T->cp[home].valid && (sidx = pe_store(e, t, home, end - 1)) < 0) return e->st;
        if (p->resident[t]) continue;
        if (drop_dev(e, t, sidx >= 0 ? p->ins[sidx].stream : TIDE_STREAM_COMPUTE, end - 1) < 0) return e->st;
    }
    for (int t = 0; t < e->g->n_tensors; t++)
        if (drop_spills(e, t, end - 1, true) < 0) return e->st;

    tide_plan_stats *ps = &p->stats;
    ps->peak_device_bytes = e->dev.high;
    ps->peak_host_bytes = e->host.high;
    ps->peak_ssd_bytes = e->ssd.high;
    p->host_spill_bytes = e->host.high;
    p->ssd_spill_bytes = e->ssd.high;
    double ms = 0;
    for (int s = 0; s < TIDE_STREAM_COUNT; s++)
        if (e->stream_end[s] > ms) ms = e->stream_end[s];
    ps->makespan_s = ms;
    if (simulate) {
        tide_sim_result r;
        tide_status st = tide_simulate(p, e->hw, &r);
        if (st) return e->st = st;
        ps->makespan_s = r.makespan_s;
        tide_sim_result_free(&r);
    }
    ps->plan_seconds = tide_now() - t0;
    return TIDE_OK;
}

bool pe_check(const pe *e) {
    if (!tide_arena_check(&e->dev) || !tide_arena_check(&e->host) || !tide_arena_check(&e->ssd)) return false;
    int owned = 0;
    for (const tide_blk *b = e->dev.head; b; b = b->next) {
        if (b->owner < 0) continue;
        const pe_tensor *T = &e->t[b->owner];
        if (T->blk != b || T->off != b->off || b->size < T->asize || T->dev == PE_DEV_NONE || T->doomed)
            return false;
        owned++;
    }
    int with = 0;
    for (int t = 0; t < e->g->n_tensors; t++) {
        const pe_tensor *T = &e->t[t];
        if (T->blk) with++;
        if (T->dev == PE_DEV_NONE && (T->blk || T->doomed)) return false;
        if (T->doomed && T->blk) return false;
        for (int k = TIDE_TIER_HOST; k <= TIDE_TIER_SSD; k++) {
            const pe_copy *c = &T->cp[k];
            if (c->valid && !c->exists) return false;
            if (c->exists && !c->home && (!c->blk || c->blk->owner != t)) return false;
        }
    }
    return owned == with;
}
