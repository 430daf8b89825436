/*
 * planner_alloc.c - allocation for the planner's engine (planner_int.h):
 * device space by best fit, else by the eviction window of least cost (found
 * from the candidate heap of tensors used furthest ahead, or by a scan of the
 * arena), the forced preparation of a step and the fallback of a fresh
 * layout. It evicts through the engine and reads the space's records.
 */
#include "planner/planner_int.h"

#include <assert.h>
#include <string.h>

/* ---------------------------------------------------------------- allocation */

typedef struct alloc_ctx {
    engine *e;
    uint64_t size;
    bool for_load;
    int reloc_step;               /* >= 0: the working set of this step may move */
    double target;
    victim_cost_fn cost;
    void *user;
} alloc_ctx;

/* Window cost of moving a working-set tensor (seconds: beyond any other). */
#define RELOC_COST 1e6

/* Simulated time by which a free block's previous occupants are gone (from
 * its merged record: a preference only; waits come from the exact map). */
static double rel_time(const engine *e, const tide_blk *b) {
    double t = 0;
    for (int s = 0; s < TIDE_STREAM_COUNT; s++)
        if (b->rel[s] >= 0 && e->clk.ins_end[b->rel[s]] > t) t = e->clk.ins_end[b->rel[s]];
    if (b->rel_step >= 0 && b->rel_step <= e->clk.last_compute_step && e->clk.ins_end[e->clk.cs_after[b->rel_step]] > t)
        t = e->clk.ins_end[e->clk.cs_after[b->rel_step]];
    return t;
}

/* A block released ahead of execution is pending as a whole (pending and
 * resolved blocks never merge), so its record decides for a LOAD. */
static int accept_blk(const tide_blk *b, void *user) {
    alloc_ctx *ac = user;
    if (ac->for_load && b->rel_step > ac->e->clk.last_compute_step) return 0;
    return rel_time(ac->e, b) <= ac->target ? 2 : 1;
}

static double window_cost(tide_blk *b, void *user) {
    alloc_ctx *ac = user;
    if (b->owner == TIDE_BLK_FREE) return ac->for_load && b->rel_step > ac->e->clk.last_compute_step ? -1 : 0;
    if (b->owner < 0) return -1;
    engine *e = ac->e;
    int t = b->owner;
    if (ac->reloc_step >= 0 && engine_next_use(e, t) == ac->reloc_step) {
        /* a last resort: moving a tensor the step itself uses costs its
         * store and reload, and more than any other eviction */
        if (e->t[t].dev != DEV_VALID) return RELOC_COST;
        bool store, reread;
        int next;
        if (!engine_evict_info(e, t, &store, &reread, &next)) return -1;
        return RELOC_COST + engine_load_seconds(e, t) +
               (store ? engine_store_seconds(e, t, e->t[t].role == TIDE_ROLE_TEMP ? TIDE_TIER_HOST : e->plan->home[t]) : 0);
    }
    if (e->t[t].dev != DEV_VALID) return -1;
    return ac->cost(e, t, ac->user);
}

/* Candidates tried per allocation: the resident tensors used furthest ahead. */
#define VICTIM_CANDS 8

/* Evaluates the windows that start or end at block v (covering ac->size
 * bytes); keeps the cheapest in *best, *first, *last. Returns false when v's
 * cost says no candidate used sooner can qualify either (COST_STOP). */
static bool window_at(engine *e, alloc_ctx *ac, tide_blk *v, double *best, tide_blk **first, tide_blk **last) {
    double cv = window_cost(v, ac);
    if (cv < 0) return cv > COST_STOP;
    for (int dir = 0; dir < 2; dir++) {
        tide_blk *lo = v, *hi = v;
        double sum = cv;
        bool ok = true;
        while (ok && hi->off + hi->size - lo->off < ac->size) {
            tide_blk *x = dir ? lo->prev : hi->next;
            double c = x ? window_cost(x, ac) : -1;
            if (c < 0) {
                ok = false;
                break;
            }
            sum += c;
            if (dir) lo = x;
            else hi = x;
        }
        if (ok && (*best < 0 || sum < *best)) {
            *best = sum;
            *first = lo;
            *last = hi;
        }
    }
    return true;
}

/* Window search from the candidate heap: the VICTIM_CANDS evictable tensors
 * (half as many ahead of execution) used furthest after step, each with its
 * neighbours. O(K log n + window). Returns true with *first, *last set when
 * one qualifies. */
static bool cand_window(engine *e, alloc_ctx *ac, int step, tide_blk **first, tide_blk **last) {
    struct victim_cand keep[VICTIM_CANDS + 1];
    int got = 0, k = step > e->exec ? VICTIM_CANDS / 2 : VICTIM_CANDS; /* ahead: a prefetch may wait */
    double best = -1;
    while (e->sp.n_cand && got < k) {
        struct victim_cand c = space_cand_pop(e);
        engine_tensor *T = &e->t[c.t];
        if (!T->blk || T->doomed || T->dev != DEV_VALID || engine_next_use(e, c.t) != c.key) continue; /* stale */
        bool dup = false;
        for (int i = 0; i < got && !dup; i++) dup = keep[i].t == c.t;
        if (dup) continue;
        keep[got++] = c;
        if (c.key <= step) break; /* this and the rest are needed first */
        if (!window_at(e, ac, T->blk, &best, first, last)) break;
    }
    for (int i = 0; i < got; i++) space_cand_push(e, keep[i].t, keep[i].key);
    return best >= 0;
}

tide_blk *alloc_block(engine *e, uint64_t size, int owner, bool for_load, tide_stream stream, int step,
                   victim_cost_fn cost, void *user, bool relocate) {
    alloc_ctx ac = {e, size, for_load, relocate ? step : -1, 0, cost, user};
    ac.target = e->clk.stream_end[stream];
    if (for_load && e->clk.res_free[RES_H2D_INDEX] > ac.target) ac.target = e->clk.res_free[RES_H2D_INDEX];
    /* With candidates at hand (tide), blocks are merged as their releases
     * resolve (pend_resolve); the baselines and the fresh layout merge now. */
    bool ahead = e->sp.use_cand && step > e->exec && !relocate;
    tide_blk *b = tide_arena_best_fit(&e->sp.dev, size, accept_blk, &ac, 8);
    if (!b && (!e->sp.use_cand || !cost) && e->sp.dev.n_free > 1) {
        tide_arena_coalesce(&e->sp.dev);
        b = tide_arena_best_fit(&e->sp.dev, size, accept_blk, &ac, 8);
    }
    if (b) {
        b = tide_arena_take(&e->sp.dev, b, b->off, size, owner);
        if (!b) e->st = tide_err(e->ctx, TIDE_E_NOMEM, "out of memory planning");
        else space_claim(e, b);
        return b;
    }
    if (!cost) return NULL;
    tide_blk *first = NULL, *last = NULL;
    if (!(e->sp.use_cand && !relocate && cand_window(e, &ac, step, &first, &last))) {
        if (ahead) return NULL; /* no victim worth it: the prefetch waits */
        if (tide_arena_window(&e->sp.dev, size, window_cost, &ac, &first, &last)) return NULL;
    }
    uint64_t off = first->off;
    /* Collect the victims first: evicting merges blocks under the walk. The
     * new block's release record is exactly the window's (its free parts and
     * the victims' DROPs): merging may join neighbours the window excluded. */
    int nv = 0;
    for (tide_blk *x = first;; x = x->next) {
        if (x->owner >= 0) {
            if (tide_grow((void **)&e->vict, &e->cap_vict, nv + 1, sizeof *e->vict)) {
                e->st = tide_err(e->ctx, TIDE_E_NOMEM, "out of memory planning");
                return NULL;
            }
            e->vict[nv++] = x->owner;
        }
        if (x == last) break;
    }
    tide_blk *f = first;
    for (int i = 0; i < nv; i++) {
        if (e->t[e->vict[i]].dev == DEV_PLACED) engine_unplace(e, e->vict[i]);
        else if (engine_evict(e, e->vict[i], stream, step) < 0) return NULL;
        f = e->sp.last_freed;
    }
    /* The window is now free, maybe in several blocks: join them. */
    while (f->off > off) f = f->prev;
    tide_blk *l = f;
    while (l->off + l->size < off + size) l = l->next;
    f = tide_arena_merge_run(&e->sp.dev, f, l);
    assert(f->owner == TIDE_BLK_FREE && f->off <= off && off + size <= f->off + f->size);
    b = tide_arena_take(&e->sp.dev, f, off, size, owner);
    if (!b) {
        e->st = tide_err(e->ctx, TIDE_E_NOMEM, "out of memory planning");
        return NULL;
    }
    space_claim(e, b);
    return b;
}


static tide_stream load_stream(const engine *e, int t) {
    return e->t[t].cp[TIDE_TIER_HOST].valid ? TIDE_STREAM_H2D : TIDE_STREAM_IO;
}

tide_status alloc_prepare_forced(engine *e, int step, victim_cost_fn cost, void *user) {
    const tide_op *op = &e->g->ops[engine_op_index(e, step)];
    int ts[TIDE_OP_MAX_IN + TIDE_OP_MAX_OUT];
    bool is_in[TIDE_OP_MAX_IN + TIDE_OP_MAX_OUT];
    int n = op_distinct_tensors(op, ts, is_in);
    /* Up to three passes: making room for one item by moving another one of
     * the step (when fragmentation leaves no other window) needs another
     * pass for the moved one. Then the fallback of a fresh layout. */
    for (int pass = 0; pass < 3; pass++) {
        bool done = true;
        for (int i = 0; i <= n; i++) {
            bool scratch = i == n;
            if (scratch ? !op->scratch_bytes || e->sp.shared || e->sp.scratch[step % e->sp.scratch_cap].step == step
                        : e->t[ts[i]].dev != DEV_NONE || e->t[ts[i]].in_place)
                continue;
            int t = scratch ? TIDE_BLK_SCRATCH : ts[i];
            bool ld = !scratch && is_in[i];
            if (!scratch && engine_place_pinned(e, t)) {
                if (ld && engine_load(e, t, step, e->lru_loads ? e->clk.last_compute : -1) < 0) return e->st;
                continue;
            }
            uint64_t size = scratch ? tide_plan_align(op->scratch_bytes) : e->t[t].asize;
            tide_stream s = ld ? load_stream(e, t) : TIDE_STREAM_COMPUTE;
            tide_blk *b = alloc_block(e, size, t, ld, s, step, cost, user, false);
            if (!b && !e->st) b = alloc_block(e, size, t, ld, s, step, cost, user, true);
            if (!b) return e->st ? e->st : alloc_compact(e, step);
            if (scratch) {
                space_scratch_set(e, step, b);
                continue;
            }
            engine_place(e, t, b);
            if (ld && engine_load(e, t, step, e->lru_loads ? e->clk.last_compute : -1) < 0) return e->st;
        }
        for (int i = 0; i < n; i++) done = done && (e->t[ts[i]].dev != DEV_NONE || e->t[ts[i]].in_place);
        if (op->scratch_bytes && !e->sp.shared) done = done && e->sp.scratch[step % e->sp.scratch_cap].step == step;
        if (done) return TIDE_OK;
    }
    return alloc_compact(e, step);
}

tide_status alloc_compact(engine *e, int step) {
    const tide_op *op = &e->g->ops[engine_op_index(e, step)];
    int ts[TIDE_OP_MAX_IN + TIDE_OP_MAX_OUT];
    bool is_in[TIDE_OP_MAX_IN + TIDE_OP_MAX_OUT];
    int n = op_distinct_tensors(op, ts, is_in);
    /* Everything out, the working set included (fragmentation is what put us
     * here); its inputs come straight back. */
    for (;;) {
        tide_blk *b = e->sp.dev.head;
        while (b && !(b->owner >= 0 || b->owner == TIDE_BLK_SCRATCH)) b = b->next;
        if (!b) break;
        if (b->owner == TIDE_BLK_SCRATCH) {
            /* only this step's scratch can be held here: never written yet */
            scratch_slot *sl = &e->sp.scratch[b->aux % e->sp.scratch_cap];
            assert(sl->step == b->aux && sl->blk == b);
            e->sp.last_freed = tide_arena_release(&e->sp.dev, b, sl->pre, sl->pre_step);
            sl->step = -1;
            sl->blk = NULL;
            continue;
        }
        int t = b->owner;
        if (e->t[t].dev == DEV_PLACED) engine_unplace(e, t);
        else if (engine_evict(e, t, TIDE_STREAM_H2D, step) < 0) return e->st;
    }
    tide_arena_coalesce(&e->sp.dev);
    /* Largest first into the empty arena: they fit, the budget covers the
     * working set. */
    int order[TIDE_OP_MAX_IN + TIDE_OP_MAX_OUT + 1], m = 0;
    for (int i = 0; i < n; i++) order[m++] = i;
    if (op->scratch_bytes && !e->sp.shared) order[m++] = -1;
    for (int i = 1; i < m; i++)
        for (int j = i; j > 0; j--) {
            uint64_t a = order[j] < 0 ? tide_plan_align(op->scratch_bytes) : e->t[ts[order[j]]].asize;
            uint64_t b = order[j - 1] < 0 ? tide_plan_align(op->scratch_bytes) : e->t[ts[order[j - 1]]].asize;
            if (a <= b) break;
            int x = order[j];
            order[j] = order[j - 1];
            order[j - 1] = x;
        }
    for (int k = 0; k < m; k++) {
        int i = order[k];
        bool scratch = i < 0;
        int t = scratch ? TIDE_BLK_SCRATCH : ts[i];
        if (!scratch && (e->t[t].dev != DEV_NONE || e->t[t].in_place)) continue; /* placed already, or
                                                                                       used in place */
        if (!scratch && engine_place_pinned(e, t)) {
            if (is_in[i] && engine_load(e, t, step, e->lru_loads ? e->clk.last_compute : -1) < 0) return e->st;
            continue;
        }
        uint64_t sz = scratch ? tide_plan_align(op->scratch_bytes) : e->t[t].asize;
        tide_blk *b = alloc_block(e, sz, t, !scratch && is_in[i],
                               !scratch && is_in[i] ? load_stream(e, t) : TIDE_STREAM_COMPUTE, step, NULL, NULL,
                               false);
        if (!b) {
            if (e->st) return e->st;
            return e->st = tide_err(e->ctx, TIDE_E_INFEASIBLE,
                                    "plan: the working set of op %d does not fit the device budget of %llu bytes",
                                    engine_op_index(e, step), (unsigned long long)e->plan->device_budget);
        }
        if (scratch) {
            space_scratch_set(e, step, b);
            continue;
        }
        engine_place(e, t, b);
        if (is_in[i] && engine_load(e, t, step, e->lru_loads ? e->clk.last_compute : -1) < 0) return e->st;
    }
    return TIDE_OK;
}
