/*
 * planner.c - the planner (docs/design.md section 4): turns a graph, a device budget
 * and a cost model into a plan of COMPUTE/LOAD/STORE/MOVE/DROP instructions on
 * five streams. This file holds the `tide` policy and the public entry points
 * (tide_plan_make, tide_plan_min_budget, tide_plan_unconstrained_peak,
 * tide_plan_peak_unbounded, tide_plan_bounds). The machinery every policy
 * shares is the engine (planner_int.h), in layers that call downward only:
 * allocation with eviction (planner_alloc.c) and computes (planner_compute.c)
 * -> residency books, copies, emission and the simulated clock
 * (planner_engine.c) -> device space, release records and waits
 * (planner_space.c) -> the arena allocator (planner_arena.c); the
 * baselines are in baselines.c and the lifetime analysis in lifetime.c.
 *
 * ---------------------------------------------------------------- design note
 *
 * The tide policy is a simulated execution with two horizons over the
 * n_iter-unrolled op sequence (step = iter * n_ops + op; with a
 * recomputation schedule, recompute.c, op is a position of the schedule and
 * n_ops their number):
 *
 *   exec   the execution horizon: the next step whose COMPUTE is emitted. A
 *          simulated clock per stream and per link (the cost model of cost/cost.c,
 *          the same one the simulator replays with) says when each instruction would
 *          run.
 *   alloc  the allocation horizon, alloc >= exec: steps [exec, alloc) are
 *          prepared (inputs loaded or loading, outputs and scratch placed).
 *          prepare() advances it as long as space is found without evicting a
 *          tensor used in [exec, alloc]; the prefetch distance is therefore
 *          set by free memory. TIDE_HORIZON_STEPS only caps the work.
 *
 * Each prepared step's LOADs are emitted at once, in step order, so a LOAD
 * starts as early as its destination window is free: it waits on the DROP of
 * the window's previous occupant (write-after-read), and its COMPUTE waits on
 * it (read-after-write). When a step cannot be prepared and exec reaches it,
 * preparation is forced: anything not used by that step may be evicted; if
 * fragmentation leaves no window, tensors of the step itself move (a last
 * resort priced above any other eviction), and failing that alloc_compact lays
 * the working set out in an emptied arena. A single op's working set is the
 * only hard floor: "needs at least N bytes".
 *
 * Space is found by best fit on the arena's free blocks (a treap by size,
 * preferring blocks whose previous occupant is already gone in simulated
 * time), and failing that by the contiguous window of least eviction cost
 * (belady_cost): reload time divided by the distance to the next use (Belady:
 * furthest next use first), dirty victims dearer by their STORE, tensors used
 * before the allocation horizon never. Windows are searched around the few
 * resident tensors used furthest ahead (a lazy max-heap), so an allocation
 * costs O(log n) plus the window, not a scan of the arena.
 *
 * Prefetching is conservative (Cao et al.): ahead of execution a victim is
 * taken only if MIN, arriving at that step, would evict it too, so tide's
 * loads on unit-size tensors equal Belady's optimum (tests/test_planner.c).
 * When the load would then arrive late (the link is the bottleneck), a tensor
 * used just before the horizon may go instead: one extra load buys overlap.
 *
 * A dead value's space is released when alloc passes its last use, ahead of
 * exec (space_doom): later COMPUTE outputs may reuse it at once (the compute
 * stream orders them after the DROP), LOADs only once exec has emitted that
 * DROP. Which instruction released which bytes is kept exactly (a release
 * map beside the arena), so an occupant waits for its own bytes only.
 *
 * Steady state (n_iter > 1, choose_residents): the iterations repeat one
 * access pattern, where MIN streams through a single slot and loses all
 * overlap. tide keeps a fixed resident set, packed at the top of the arena,
 * as large as the budget allows beside the activations and a streaming
 * buffer, and streams the rest as in one pass.
 *
 * Residency of a tensor's device copy (the function making each transition):
 *
 *   ON_HOST/ON_SSD --alloc_block+engine_place--> PLACED --engine_load--> LOADING
 *   LOADING --(LOAD completes; COMPUTE waits on it)--> ON_DEVICE
 *   (none) --alloc_block+engine_place--> PLACED --engine_compute (output)--> ON_DEVICE dirty
 *   ON_DEVICE dirty --engine_evict: engine_store--> STORING --DROP--> ON_HOST/ON_SSD
 *   ON_DEVICE clean --engine_evict: DROP--> ON_HOST/ON_SSD (home or spill copy valid)
 *   ON_DEVICE, value dead --space_doom (ahead)--> DOOMED --engine_compute: DROP--> (none)
 *   ON_DEVICE, value dead --engine_compute: DROP--> (none)
 *   ON_DEVICE, last write of STATE/OUTPUT --engine_compute: engine_store home--> clean
 *   PLACED (never written) --engine_unplace--> (none)
 *   end --engine_finish: STORE home if dirty, DROP unless resident--> at home
 *   WARM (from the start, at its fixed offset) --every compute reads or
 *     rewrites it in place--> WARM at the end (never evicted nor dropped)
 *   IN PLACE (host_addressable, homed on host): no device copy at all; each
 *     compute reads or writes its home (in_place_opnd)
 *   ON_DEVICE --engine_compute_host, after engine_store to host if dirty--> a
 *     host copy written by the host step; the device copy DROPped as stale
 *   ON_SSD --engine_move--> ON_HOST (for a host step's input)
 *   ON_HOST, written by a host step, homed on SSD --engine_move--> its SSD
 *     home valid again (the final version of the iteration, as a device
 *     copy's final STORE home)
 *   ON_HOST spill copy, clean (its SSD copy valid), after the last use of the
 *     iteration --engine_compute(_host): DROP--> ON_SSD (MOVEd in again next
 *     iteration)
 *
 * Host steps (a COMPUTE placed on the host CPU, on the host stream): the
 * allocation horizon never passes one that is not yet computed, since the
 * steps after it may read what it writes, in host memory.
 *
 * Invariants (checked by engine_check in debug builds; the verifier proves the
 * plan-level ones independently):
 *   I1 Every arena byte is in exactly one block; a tensor block belongs to a
 *      tensor whose device copy is PLACED or ON_DEVICE at that offset; no two
 *      live device copies overlap, so the budget is never exceeded.
 *   I2 The release map records, for every byte, the instruction (or the
 *      compute step, for a release ahead of execution) that freed it last; a
 *      new occupant's first writer waits for exactly those.
 *   I3 Every instruction's waits name earlier instructions: list order is a
 *      topological order, and same-stream order is implicit.
 *   I4 A tensor used in [exec, alloc] is never evicted; the COMPUTE of a step
 *      finds all its inputs ON_DEVICE (or LOADING, waited on).
 *   I5 A value still needed (read again, or the latest version of a STATE or
 *      OUTPUT) always has a valid copy on some tier.
 *   I6 At the end, every WEIGHT/STATE/OUTPUT home holds its latest version and
 *      only resident tensors remain on the device.
 */
#include "planner/planner_int.h"

#include <assert.h>
#include <string.h>

/* Safety cap on the allocation horizon's lead, in steps. The real limit is
 * free memory. A prepared step keeps its scratch in the engine's ring until
 * computed, so the lead may not exceed the ring. */
#define TIDE_HORIZON_STEPS 4096
_Static_assert(TIDE_HORIZON_STEPS <= SCRATCH_RING, "the horizon's lead must fit the engine's scratch ring");
/* A STORE costs less than a reload: the d2h link is usually idle. */
#define DIRTY_WEIGHT 0.25

/* ---------------------------------------------------------------- tide policy */

/* What belady_cost knows of the step being prepared. */
typedef struct horizon {
    int a;                        /* the step being prepared */
    int floor, floor_min;         /* see horizon_floor; floor -2: not computed yet */
    uint64_t size;                /* bytes being allocated */
    int pending;                  /* see pending_fit; -1: not computed yet */
} horizon;

/* True if a free block of at least size bytes is released ahead of
 * execution, not yet usable by a LOAD: it held a tensor dead before step a,
 * which MIN would evict first, so a prefetch must wait for it. O(pending). */
static bool pending_fit(const engine *e, uint64_t size) {
    for (int i = 0; i < e->sp.n_pend; i++) {
        const tide_blk *b = e->sp.pend[i].b;
        if (b->owner == TIDE_BLK_FREE && b->off == e->sp.pend[i].off && b->size >= size &&
            b->rel_step > e->clk.last_compute_step)
            return true;
    }
    return false;
}

/* Ahead of execution, a prefetch may only make the eviction Belady's MIN
 * would make when step a comes: MIN evicts the tensor used furthest after a
 * among all not used at a. Tensors still protected by a use in [exec, a) are
 * among those candidates. Sets h->floor to the furthest next use after a of
 * theirs: a victim used no sooner keeps the prefetch conservative (it adds
 * no load to MIN's), else the prefetch waits; and h->floor_min to the
 * soonest (see belady_cost). Looks back HORIZON_FLOOR_STEPS steps at most
 * (exact on short horizons, a bound on the work on long ones). */
#define HORIZON_FLOOR_STEPS 16
static void horizon_floor(engine *e, horizon *h) {
    int a = h->a, f = -1, fmin = TIDE_NEVER;
    int lo = a - HORIZON_FLOOR_STEPS > e->exec ? a - HORIZON_FLOOR_STEPS : e->exec;
    for (int s = a - 1; s >= lo; s--) {
        const tide_op *op = engine_op(e, s);
        for (int k = 0; k < op->n_in + op->n_out; k++) {
            int t = k < op->n_in ? op->in[k] : op->out[k - op->n_in];
            if (!e->t[t].blk) continue;
            int n = tide_lifetime_use_from(&e->lt, t, a, NULL);
            if (n == a) continue;
            if (n > f) f = n;
            if (n < fmin) fmin = n;
        }
    }
    h->floor = f;
    h->floor_min = f < 0 ? -1 : fmin;
}

/* Cost of evicting t to prepare step h->a; < 0: not allowed. */
static double belady_cost(engine *e, int t, void *user) {
    horizon *h = user;
    int a = h->a;
    int nu = engine_next_use(e, t);
    if (nu <= a) return COST_STOP; /* needed before the allocation horizon */

    if (a > e->exec) {
        /* Conservative (MIN's own evictions, made early) while the load
         * would still arrive before the compute reaches a. When it would be
         * late (the link is the bottleneck, e.g. weights cycling through
         * iterations, where MIN evicts the tensor just used and so loads one
         * step at a time), a tensor used just before the horizon may go too:
         * a streaming slot that keeps the link busy, at the price of one
         * load; the long-lived residents, used longer ago, stay. */
        bool starving = e->clk.res_free[RES_H2D_INDEX] + tide_cost_load(e->hw, TIDE_TIER_HOST, h->size, false, NULL) >=
                        e->clk.stream_end[TIDE_STREAM_COMPUTE] + engine_compute_seconds(e, e->exec, a);
        if (h->floor == -2) horizon_floor(e, h);
        if (starving) {
            if (nu < h->floor && e->t[t].last_use < e->exec - (a - e->exec) - 1) return -1;
        } else {
            if (nu < h->floor) return COST_STOP;
            if (h->pending < 0) h->pending = pending_fit(e, h->size);
            if (h->pending) return COST_STOP;
        }
        /* evicting what would come back about as soon as the prefetch pays
         * off trades traffic for nothing: wait instead (a pure write next
         * brings nothing back, but comes later still) */
        if ((int64_t)nu - a <= 2 * (int64_t)(a - e->exec)) return COST_STOP;
    }
    bool store, reread;
    int next;
    if (!engine_evict_info(e, t, &store, &reread, &next)) return -1;
    double c = 1e-18 * (double)e->t[t].asize; /* ties: fewer bytes */
    if (reread) c += engine_load_seconds(e, t) / (1.0 + (double)(next - a));
    if (store) {
        tide_tier tier = e->t[t].role == TIDE_ROLE_TEMP ? (tide_tier)engine_spill_tier(e, t) : e->plan->home[t];
        c += DIRTY_WEIGHT * engine_store_seconds(e, t, tier);
    }
    return c;
}

/* The first step at or after `from` whose op is placed on the host
 * (INT_MAX: none). */
static int next_host_step(const engine *e, int from) {
    int o = from % e->n_ops, base = from - o;
    int s = e->next_host[o] < e->n_ops ? base + e->next_host[o]
          : e->next_host[0] < e->n_ops ? base + e->n_ops + e->next_host[0] : INT_MAX;
    return s < e->n_steps ? s : INT_MAX;
}

/* Releases what dies at step a ahead of execution (alloc has passed it). */
static int finish_prepare(engine *e, int a, const int *ts, int n) {
    for (int i = 0; i < n; i++)
        if (space_can_doom(e, ts[i], a)) space_doom(e, ts[i], a);
    space_scratch_doom(e, a);
    return 1;
}

/* Prepares step a: loads its inputs, places its outputs and scratch, then
 * releases what dies at a. Returns 1 when done, 0 when space is lacking (only
 * when !forced), -1 on failure (e->st). */
static int prepare(engine *e, int a, bool forced) {
    /* A host step needs no device space; the steps after it are prepared only
     * once it is computed (their inputs may be its outputs, in host memory,
     * and it drops the device copies of what it writes) */
    if (engine_on_host(e, a)) return a == e->exec;
    if (e->host_op && a > e->exec && next_host_step(e, e->exec) < a) return 0;
    const tide_op *op = engine_op(e, a);
    int ts[TIDE_OP_MAX_IN + TIDE_OP_MAX_OUT];
    int n = 0;
    for (int k = 0; k < op->n_in + op->n_out; k++) {
        int t = k < op->n_in ? op->in[k] : op->out[k - op->n_in];
        bool seen = false;
        for (int j = 0; j < n && !seen; j++) seen = ts[j] == t;
        if (!seen) ts[n++] = t;
    }
    /* A tensor rewritten at a while its previous value's DROP is still
     * pending needs that DROP first. */
    for (int i = 0; i < n; i++)
        if (e->t[ts[i]].doomed) {
            assert(!forced);
            return 0;
        }
    horizon h = {a, -2, -2, 0, -1};
    for (int i = 0; i < n; i++) {
        int t = ts[i];
        engine_tensor *T = &e->t[t];
        if (T->dev != DEV_NONE || T->in_place) continue;
        bool ld = tide_op_reads(op, t);
        if (engine_place_pinned(e, t)) {
            if (ld && engine_load(e, t, a, -1) < 0) return -1;
            continue;
        }
        tide_stream s = !ld ? TIDE_STREAM_COMPUTE
                      : T->cp[TIDE_TIER_HOST].valid ? TIDE_STREAM_H2D : TIDE_STREAM_IO;
        h.size = T->asize;
        h.pending = -1;
        tide_blk *b = alloc_block(e, T->asize, t, ld, s, a, belady_cost, &h, false);
        if (!b) goto no_space;
        engine_place(e, t, b);
        if (ld && engine_load(e, t, a, -1) < 0) return -1;
    }
    if (op->scratch_bytes && !e->sp.shared && e->sp.scratch[a % e->sp.scratch_cap].step != a) {
        h.size = tide_plan_align(op->scratch_bytes);
        h.pending = -1;
        tide_blk *b = alloc_block(e, tide_plan_align(op->scratch_bytes), TIDE_BLK_SCRATCH, false,
                               TIDE_STREAM_COMPUTE, a, belady_cost, &h, false);
        if (!b) goto no_space;
        space_scratch_set(e, a, b);
    }
    return finish_prepare(e, a, ts, n);
no_space:
    if (e->st) return -1;
    if (!forced) return 0;
    if (alloc_prepare_forced(e, a, belady_cost, &h)) return -1;
    return finish_prepare(e, a, ts, n);
}

/* Steady state of a multi-iteration plan. Every iteration uses the same
 * tensors in the same order, a periodic pattern: MIN keeps a fixed set and
 * cycles everything else through one slot, so each load waits for the op
 * before it. Instead, keep a fixed resident set R as large as the budget
 * allows after room for the activations and a streaming buffer (two
 * neighbouring ops' persistent tensors), and stream the rest like a single
 * pass: each
 * leaves after its last use of the iteration (a dirty STATE through a STORE
 * home) and is prefetched for the next. R is spread evenly over the
 * iteration (streaming interleaves with compute), the dearest to stream
 * first. Nothing changes when everything fits. */
static int resident_class(const engine *e, int t) {
    if (e->plan->home[t] == TIDE_TIER_SSD) return 0;
    return e->g->tensors[t].role == TIDE_ROLE_STATE ? 1 : 2;
}

static tide_status choose_residents(engine *e) {
    const tide_graph *g = e->g;
    const tide_lifetime *lt = &e->lt;
    int nt = g->n_tensors, n = e->n_ops;
    if (e->n_iter < 2 || n == 0) return TIDE_OK;
    /* warm tensors are a resident set already, kept where they are */
    for (int t = 0; t < nt; t++)
        if (e->t[t].warm) return TIDE_OK;
    int64_t *delta = tide_calloc((size_t)n + 1, sizeof *delta);
    /* persistent tensors only host computes use are never on the device:
     * no resident slot, no streaming buffer */
    bool *dev_use = tide_calloc((size_t)(nt ? nt : 1), sizeof *dev_use);
    if (!delta || !dev_use) {
        tide_free(delta);
        tide_free(dev_use);
        return e->st = tide_err(e->ctx, TIDE_E_NOMEM, "out of memory planning");
    }
    for (int i = 0; i < n; i++) {
        const tide_op *op = engine_op(e, i);
        if (e->host_op && e->host_op[e->sched ? e->sched[i] : i]) continue;
        for (int k = 0; k < op->n_in + op->n_out; k++) dev_use[k < op->n_in ? op->in[k] : op->out[k - op->n_in]] = true;
    }
    uint64_t cand = 0, wmax = 0, act = 0;
    for (int t = 0; t < nt; t++) {
        int a = lt->start[t], b = lt->start[t + 1];
        if (a == b) continue;
        tide_role r = g->tensors[t].role;
        uint64_t sz = e->t[t].asize;
        if (e->t[t].in_place) continue; /* never on the device */
        if (!dev_use[t] && r != TIDE_ROLE_TEMP && r != TIDE_ROLE_OUTPUT) continue;
        if (r == TIDE_ROLE_TEMP || r == TIDE_ROLE_OUTPUT) {
            delta[lt->use_op[a]] += (int64_t)sz;
            delta[lt->use_op[b - 1] + 1] -= (int64_t)sz;
        } else {
            cand += sz;
        }
    }
    /* The streaming buffer holds an op's persistent tensors while the next
     * op's load: the largest pair of neighbours (the last op's neighbour is
     * the first of the next iteration). */
    int64_t live = 0;
    uint64_t w0 = 0, wprev = 0;
    for (int i = 0; i < n; i++) {
        const tide_op *op = engine_op(e, i); /* position i of iteration 0 */
        live += delta[i];
        /* a shared scratch is reserved already, below */
        act = TIDE_MAX(act, (uint64_t)live + (e->sp.shared ? 0 : tide_plan_align(op->scratch_bytes)));
        uint64_t w = 0;
        for (int k = 0; k < op->n_in + op->n_out; k++) {
            int t = k < op->n_in ? op->in[k] : op->out[k - op->n_in];
            tide_role r = g->tensors[t].role;
            if (r != TIDE_ROLE_TEMP && r != TIDE_ROLE_OUTPUT && !e->t[t].in_place && dev_use[t]) w += e->t[t].asize;
        }
        if (i == 0) w0 = w;
        else wmax = TIDE_MAX(wmax, wprev + w);
        wprev = w;
    }
    wmax = TIDE_MAX(wmax, wprev + w0);
    tide_free(delta);
    /* The arena's free bytes (what the plan reserved from the start, a
     * shared scratch or a warm region, is no one's room), and the free block
     * that ends at its top, where the residents' slots go. */
    uint64_t budget = 0;
    tide_blk *top = e->sp.dev.head;
    for (tide_blk *b = e->sp.dev.head; b; b = b->next) {
        if (b->owner == TIDE_BLK_FREE) budget += b->size;
        top = b;
    }
    uint64_t top_free = top && top->owner == TIDE_BLK_FREE ? top->size : 0;
    if (cand + act <= budget) { /* all of it stays: nothing to stream */
        tide_free(dev_use);
        return TIDE_OK;
    }
    uint64_t room = act + wmax;
    uint64_t target = budget > room ? TIDE_MIN(budget - room, top_free) : 0;
    e->pinned = tide_calloc((size_t)nt, sizeof *e->pinned);
    e->stream = tide_calloc((size_t)nt, sizeof *e->stream);
    e->pin_off = tide_calloc((size_t)nt, sizeof *e->pin_off);
    int *order = tide_malloc((size_t)(nt ? nt : 1) * sizeof *order);
    if (!e->pinned || !e->stream || !e->pin_off || !order) {
        tide_free(order);
        tide_free(dev_use);
        return e->st = tide_err(e->ctx, TIDE_E_NOMEM, "out of memory planning");
    }
    /* candidates in order of first use (counting sort by op) */
    int m = 0;
    for (int i = 0; i < n; i++) {
        const tide_op *op = engine_op(e, i);
        for (int k = 0; k < op->n_in + op->n_out; k++) {
            int t = k < op->n_in ? op->in[k] : op->out[k - op->n_in];
            tide_role r = g->tensors[t].role;
            if (r == TIDE_ROLE_TEMP || r == TIDE_ROLE_OUTPUT || lt->use_op[lt->start[t]] != i || e->stream[t] ||
                e->t[t].in_place || !dev_use[t])
                continue;
            e->stream[t] = true; /* marks "listed" until decided below */
            order[m++] = t;
        }
    }
    tide_free(dev_use);
    /* Classes by what streaming one byte costs: SSD-homed first (the
     * slowest path), then STATE (a LOAD and a STORE), then the rest. Each
     * class fills what the ones before left, spread evenly over the
     * iteration. */
    uint64_t cls_bytes[3] = {0, 0, 0};
    for (int i = 0; i < m; i++) cls_bytes[resident_class(e, order[i])] += e->t[order[i]].asize;
    double f[3];
    uint64_t left = target;
    for (int c = 0; c < 3; c++) {
        uint64_t take = TIDE_MIN(left, cls_bytes[c]);
        f[c] = cls_bytes[c] ? (double)take / (double)cls_bytes[c] : 0;
        left -= take;
    }
    double seen[3] = {0, 0, 0}, kept[3] = {0, 0, 0};
    uint64_t total = 0;
    for (int i = 0; i < m; i++) {
        int t = order[i];
        int c = resident_class(e, t);
        double sz = (double)e->t[t].asize;
        seen[c] += sz;
        bool keep = kept[c] + sz <= f[c] * seen[c] + 0.5 && total + e->t[t].asize <= target;
        if (keep) {
            kept[c] += sz;
            total += e->t[t].asize;
        }
        e->pinned[t] = keep;
        e->stream[t] = !keep;
    }
    tide_free(order);
    /* The residents' slots, packed at the top of the arena, away from the
     * streaming below them (which then finds its space in one piece). */
    if (total) {
        uint64_t at = top->off + top->size - total;
        if (!tide_arena_take(&e->sp.dev, top, at, total, TIDE_BLK_RESERVED))
            return e->st = tide_err(e->ctx, TIDE_E_NOMEM, "out of memory planning");
        for (int t = 0; t < nt; t++)
            if (e->pinned[t]) {
                e->pin_off[t] = at;
                at += e->t[t].asize;
            }
    }
    return TIDE_OK;
}

tide_status policy_tide(engine *e) {
    const int S = e->n_steps;
    e->sp.use_cand = true;
    if (choose_residents(e)) return e->st;
    int alloc = 0;
    for (int exec = 0; exec < S; exec++) {
        e->exec = exec;
        while (alloc < S && alloc - exec < TIDE_HORIZON_STEPS) {
            int r = prepare(e, alloc, alloc == exec);
            if (r < 0) return e->st;
            if (r == 0) break;
            alloc++;
        }
        e->prepared = alloc;
        assert(alloc > exec);
        if (engine_compute(e, exec)) return e->st;
#ifndef NDEBUG
        if (e->g->n_tensors < 2000 || exec % 1024 == 0) assert(engine_check(e));
#endif
    }
    return TIDE_OK;
}

/* ---------------------------------------------------------------- entry points */

static tide_status check_opts(tide_ctx *ctx, const tide_graph *g, const tide_plan_opts *o) {
    if (!g || !o) return tide_err(ctx, TIDE_E_INVALID, "plan: no graph or options");
    if (!o->hw) return tide_err(ctx, TIDE_E_INVALID, "plan: no hardware profile given");
    if (o->n_iter < 1) return tide_err(ctx, TIDE_E_INVALID, "plan: n_iter must be >= 1 (got %d)", o->n_iter);
    if ((unsigned)o->policy >= TIDE_POLICY_COUNT)
        return tide_err(ctx, TIDE_E_INVALID, "plan: unknown policy %d", (int)o->policy);
    if (o->policy == TIDE_POLICY_ZERO_OFFLOAD && o->host_ops)
        return tide_err(ctx, TIDE_E_UNSUPPORTED, "plan: the zero-offload policy places every AdamW update on the "
                        "host itself: it takes no host placement from the caller");
    if (o->policy != TIDE_POLICY_TIDE &&
        (o->host_ops || o->host_addressable || o->warm_off || o->warm_region || o->shared_scratch))
        return tide_err(ctx, TIDE_E_UNSUPPORTED, "plan: the %s policy plans neither host placements, in-place host "
                        "tensors nor warm ones (the tide policy does)", tide_policy_name(o->policy));
    for (int i = 0; i < g->n_ops; i++) /* a rank's step: the profile must have a network for its collectives */
        if (tide_op_is_collective(g->ops[i].kind)) {
            const char *why = tide_hw_net_missing(o->hw, g->ops[i].p.ranks);
            if (why)
                return tide_err(ctx, TIDE_E_INVALID, "plan: profile '%s' cannot run collectives over %d ranks: %s",
                                o->hw->name, g->ops[i].p.ranks, why);
            if (o->host_addressable)
                return tide_err(ctx, TIDE_E_UNSUPPORTED, "plan: collectives run on device copies; a plan whose "
                                "device addresses host memory (the CPU backend) is not planned with ranks");
            break;
        }
    return TIDE_OK;
}

/* Plans g under o; simulate: fill makespan from the simulator (else from the
 * planner's own clock). */
static tide_status plan_make(tide_ctx *ctx, const tide_graph *g, const tide_plan_opts *o, bool simulate,
                             tide_plan **out) {
    double t0 = tide_now();
    *out = NULL;
    tide_status st = check_opts(ctx, g, o);
    if (st) return st;
    engine e;
    st = engine_init(&e, ctx, g, o);
    if (!st) {
        switch (o->policy) {
        case TIDE_POLICY_STATIC_LAYER: st = policy_static_layer(&e, NULL); break;
        case TIDE_POLICY_LRU: st = policy_lru(&e); break;
        case TIDE_POLICY_CHECKPOINT_LAYER: st = policy_lru(&e); break; /* over the recomputation schedule */
        case TIDE_POLICY_ZERO_OFFLOAD: st = policy_zero_offload(&e); break;
        default: st = policy_tide(&e); break;
        }
    }
    if (!st) st = engine_finish(&e, simulate, t0);
    if (st) {
        engine_free(&e, false);
        return st;
    }
    *out = e.plan;
    engine_free(&e, true);
    return TIDE_OK;
}

/* How deep a chain of producers the tide policy's second cheap
 * recomputation candidate recomputes (recompute.c). */
#define RECOMPUTE_CHAIN_DEPTH 3

/* The positions of recompute.c's cheap schedule of g with chains up to
 * `chain` deep (0 on failure: counts as nothing recomputed). */
static int cheap_positions(tide_ctx *ctx, const tide_graph *g, const tide_hw *hw, int chain) {
    int *sched = NULL, n_pos = 0;
    if (recompute_schedule(ctx, g, hw, chain, &sched, &n_pos)) {
        tide_err_clear(ctx);
        return 0;
    }
    tide_free(sched);
    return n_pos;
}

/* Plans g under o and keeps that plan in *out when it finishes first (as
 * the tide policy's, with as_tide); a plan that fails changes nothing. */
static void keep_faster(tide_ctx *ctx, const tide_graph *g, const tide_plan_opts *o, bool as_tide, tide_plan **out) {
    tide_plan *alt = NULL;
    if (plan_make(ctx, g, o, true, &alt) == TIDE_OK && alt->stats.makespan_s < (*out)->stats.makespan_s) {
        tide_plan_free(*out);
        if (as_tide) alt->policy = TIDE_POLICY_TIDE;
        *out = alt;
    } else {
        tide_plan_free(alt);
    }
}

/* When no plan of the tide policy fits a training step (the device budget,
 * or the host budget's room to stage what host updates and spills need),
 * the zero-offload baseline's plan where it fits: every AdamW update on the
 * host, gradients stored per layer, activations recomputed per layer (tide
 * should never fail where a baseline it can compute plans). The plan keeps
 * its own placement (callers count host updates from its instructions) and
 * is labelled tide. On failure the first message stands. */
static bool has_adamw(const tide_graph *g) {
    for (int i = 0; i < g->n_ops; i++)
        if (g->ops[i].kind == TIDE_OP_ADAMW) return true;
    return false;
}

static tide_status plan_zero_offload(tide_ctx *ctx, const tide_graph *g, const tide_plan_opts *opts, double t0,
                                     tide_plan **out) {
    if (opts->policy != TIDE_POLICY_TIDE || !has_adamw(g) || opts->host_addressable || opts->warm_off ||
        opts->warm_region || opts->shared_scratch || opts->recompute_cheap)
        return TIDE_E_INFEASIBLE;
    char why[512];
    snprintf(why, sizeof why, "%s", tide_ctx_last_error(ctx));
    tide_plan_opts zo = *opts;
    zo.policy = TIDE_POLICY_ZERO_OFFLOAD;
    zo.host_ops = NULL;
    if (plan_make(ctx, g, &zo, true, out) == TIDE_OK) {
        (*out)->policy = TIDE_POLICY_TIDE;
        (*out)->stats.plan_seconds = tide_now() - t0;
        tide_err_clear(ctx);
        return TIDE_OK;
    }
    return tide_err(ctx, TIDE_E_INFEASIBLE, "%s", why);
}

/* The tide policy also simulates the layer-streaming schedule (the
 * static-layer policy) at the same budget and keeps whichever plan finishes
 * first: where whole layers fit and double buffering hides every load, that
 * regular schedule can beat fine-grained paging by a hair, and tide should
 * never lose to a baseline it can compute. Likewise with cheap recomputation
 * (recompute.c: an activation whose producer costs less than its round trip
 * over the host link is dropped after the forward and made again before its
 * backward), when the graph has such activations and the budget cannot hold
 * the plan without spilling: the simulated makespans decide whether what
 * recomputing costs is repaid by transfers that would not have hidden.
 * For a training step whose caller asks (consider_zero_offload: the final
 * plan, not each candidate of the optimizer placement search), the
 * zero-offload baseline's plan too: its eager per-layer gradient stores and
 * all-host updates can beat tide's searched split by a little where the
 * budget is large. */
tide_status tide_plan_make(tide_ctx *ctx, const tide_graph *g, const tide_plan_opts *opts, tide_plan **out) {
    double t0 = tide_now();
    tide_status st = plan_make(ctx, g, opts, true, out);
    if (st == TIDE_E_INFEASIBLE) return plan_zero_offload(ctx, g, opts, t0, out);
    if (st || opts->policy != TIDE_POLICY_TIDE || opts->host_addressable || opts->warm_off || opts->warm_region ||
        opts->shared_scratch)
        return st;
    if (!opts->host_ops && !opts->recompute_cheap) {
        tide_plan_opts so = *opts;
        so.policy = TIDE_POLICY_STATIC_LAYER;
        keep_faster(ctx, g, &so, true, out);
    }
    const tide_plan_stats *ps = &(*out)->stats;
    if (!opts->recompute_cheap && ps->bytes_d2h + ps->bytes_ssd_write > 0) {
        /* single ops where the cheap rule recomputes any (a graph with no
         * backward has nothing to recompute), then chains where they
         * recompute more */
        int single = cheap_positions(ctx, g, opts->hw, 0);
        tide_plan_opts ro = *opts;
        ro.recompute_cheap = true;
        if (single > g->n_ops) {
            keep_faster(ctx, g, &ro, false, out);
            if (cheap_positions(ctx, g, opts->hw, RECOMPUTE_CHAIN_DEPTH) > single) {
                ro.recompute_chain = RECOMPUTE_CHAIN_DEPTH;
                keep_faster(ctx, g, &ro, false, out);
            }
        }
    }
    if (opts->consider_zero_offload && has_adamw(g)) {
        tide_plan_opts zo = *opts;
        zo.policy = TIDE_POLICY_ZERO_OFFLOAD;
        zo.host_ops = NULL;
        zo.recompute_cheap = false;
        keep_faster(ctx, g, &zo, true, out);
    }
    tide_err_clear(ctx);
    (*out)->stats.plan_seconds = tide_now() - t0;
    return TIDE_OK;
}

/* Bytes that hold every tensor and the largest scratch at once. */
static uint64_t everything_bytes(const tide_graph *g) {
    uint64_t s = 0, sc = 0;
    for (int t = 0; t < g->n_tensors; t++) s += tide_plan_align(g->tensors[t].nbytes);
    for (int i = 0; i < g->n_ops; i++) sc = TIDE_MAX(sc, tide_plan_align(g->ops[i].scratch_bytes));
    return s + sc + TIDE_PLAN_ALIGN;
}

uint64_t tide_plan_unconstrained_peak(tide_ctx *ctx, const tide_graph *g, const tide_hw *hw, int n_iter) {
    tide_plan_opts o = {.policy = TIDE_POLICY_TIDE, .n_iter = n_iter, .hw = hw};
    uint64_t peak = 0;
    return tide_plan_peak_unbounded(ctx, g, &o, &peak) ? everything_bytes(g) : peak;
}

tide_status tide_plan_peak_unbounded(tide_ctx *ctx, const tide_graph *g, const tide_plan_opts *opts, uint64_t *peak) {
    tide_plan_opts o = *opts;
    o.policy = TIDE_POLICY_TIDE;
    o.device_budget = everything_bytes(g);
    o.warm_off = NULL;
    o.warm_region = 0;
    tide_plan *p = NULL;
    tide_status st = plan_make(ctx, g, &o, false, &p);
    if (st) return st;
    *peak = p->stats.peak_device_bytes;
    tide_plan_free(p);
    return TIDE_OK;
}

/* 0: feasible; 1: infeasible for lack of device memory; else the failure. */
static int try_budget(tide_ctx *ctx, const tide_graph *g, const tide_plan_opts *o, uint64_t budget,
                      tide_status *st) {
    tide_plan_opts b = *o;
    b.device_budget = budget;
    tide_plan *p = NULL;
    *st = plan_make(ctx, g, &b, false, &p);
    tide_plan_free(p);
    return *st == TIDE_OK ? 0 : *st == TIDE_E_INFEASIBLE ? 1 : 2;
}

tide_status tide_plan_max_working_set(tide_ctx *ctx, const tide_graph *g, const tide_plan_opts *opts,
                                      uint64_t *ws) {
    *ws = tide_graph_max_working_set(g, NULL);
    if (!opts->host_ops && !opts->host_addressable && opts->policy != TIDE_POLICY_ZERO_OFFLOAD) return TIDE_OK;
    /* what device computes need in the arena: no in-place tensor, no host
     * op's (engine_working_set) */
    tide_status st = check_opts(ctx, g, opts);
    if (st) return st;
    tide_plan_opts o = *opts;
    o.device_budget = everything_bytes(g);
    o.warm_off = NULL;
    o.warm_region = 0;
    o.shared_scratch = false;
    engine e;
    if ((st = engine_init(&e, ctx, g, &o))) {
        engine_free(&e, false);
        return st;
    }
    uint64_t n = TIDE_PLAN_ALIGN;
    for (int i = 0; i < g->n_ops; i++) n = TIDE_MAX(n, engine_working_set(&e, i));
    engine_free(&e, false);
    *ws = n;
    return TIDE_OK;
}

tide_status tide_plan_min_budget(tide_ctx *ctx, const tide_graph *g, const tide_plan_opts *opts,
                                 uint64_t *min_budget) {
    tide_status st = check_opts(ctx, g, opts);
    if (st) return st;
    uint64_t lo = 0;
    if ((st = tide_plan_max_working_set(ctx, g, opts, &lo))) return st;
    if (opts->policy == TIDE_POLICY_STATIC_LAYER) lo = TIDE_MAX(lo, tide_static_layer_min_budget(g));
    int r = try_budget(ctx, g, opts, lo, &st);
    if (r == 0) {
        *min_budget = lo;
        return TIDE_OK;
    }
    if (r == 2) return st;
    uint64_t hi = TIDE_MAX(tide_plan_unconstrained_peak(ctx, g, opts->hw, opts->n_iter), lo + TIDE_PLAN_ALIGN);
    for (int k = 0; (r = try_budget(ctx, g, opts, hi, &st)) == 1 && k < 4; k++) hi *= 2;
    if (r != 0) return st; /* not for lack of device memory (host, spill space) */
    /* invariant: lo infeasible, hi feasible */
    while (hi - lo > TIDE_PLAN_ALIGN) {
        uint64_t mid = tide_plan_align(lo + (hi - lo) / 2);
        if (mid <= lo || mid >= hi) break;
        r = try_budget(ctx, g, opts, mid, &st);
        if (r == 2) return st;
        if (r == 0) hi = mid;
        else lo = mid;
    }
    tide_err_clear(ctx);
    *min_budget = hi;
    return TIDE_OK;
}

/* ---------------------------------------------------------------- bounds */

tide_status tide_plan_bounds(tide_ctx *ctx, const tide_graph *g, const tide_plan_opts *opts, tide_bounds *out) {
    memset(out, 0, sizeof *out);
    tide_status st = check_opts(ctx, g, opts);
    if (st) return st;
    engine e; /* for the homes the planner would choose, and the lifetimes */
    st = engine_init(&e, ctx, g, opts);
    if (st && st != TIDE_E_INFEASIBLE) {
        engine_free(&e, false);
        return st;
    }
    if (st) { /* a budget below the working set still has bounds */
        engine_free(&e, false);
        tide_plan_opts o = *opts;
        o.device_budget = everything_bytes(g);
        if ((st = engine_init(&e, ctx, g, &o))) {
            engine_free(&e, false);
            return st;
        }
    }
    const tide_hw *hw = opts->hw;
    const int n_iter = opts->n_iter;
    /* Device and host computes each take their own engine's time; the two
     * may overlap, so the bound is the busier one. */
    double compute = 0, host_compute = 0;
    for (int i = 0; i < g->n_ops; i++) {
        if (e.host_op && e.host_op[i]) host_compute += tide_cost_op_host(opts->hw, g, &g->ops[i]);
        else compute += e.op_s[i];
    }
    compute = TIDE_MAX(compute, host_compute) * n_iter;
    /* persistent tensors that only host computes use need not cross the link
     * when they live in host memory */
    bool *dev_use = tide_calloc((size_t)(g->n_tensors ? g->n_tensors : 1), sizeof *dev_use);
    if (!dev_use) {
        engine_free(&e, false);
        return tide_err(ctx, TIDE_E_NOMEM, "out of memory");
    }
    for (int i = 0; i < g->n_ops; i++) {
        const tide_op *op = &g->ops[i];
        if (e.host_op && e.host_op[i]) continue;
        for (int k = 0; k < op->n_in + op->n_out; k++) dev_use[k < op->n_in ? op->in[k] : op->out[k - op->n_in]] = true;
    }

    /* Per iteration, the bytes that must arrive from a home: tensors whose
     * value comes from outside the iteration (WEIGHT, INPUT, STATE read
     * before written). The first iteration moves them all; a later one only
     * what cannot stay resident, at most the budget left beside the largest
     * non-persistent working set of any op. */
    uint64_t in_host = 0, in_ssd = 0, out_host = 0, out_ssd = 0;
    for (int t = 0; t < g->n_tensors; t++) {
        tide_role r = g->tensors[t].role;
        int a = e.lt.start[t], b = e.lt.start[t + 1];
        if (a == b || r == TIDE_ROLE_TEMP) continue;
        uint64_t nb = g->tensors[t].nbytes;
        bool ssd = e.plan->home[t] == TIDE_TIER_SSD;
        if (!dev_use[t] && !ssd) continue;
        if (r != TIDE_ROLE_OUTPUT && (e.lt.use_rw[a] & TIDE_USE_READ)) *(ssd ? &in_ssd : &in_host) += nb;
        if ((r == TIDE_ROLE_STATE || r == TIDE_ROLE_OUTPUT) && e.lt.last_write_op[t] >= 0)
            *(ssd ? &out_ssd : &out_host) += nb;
    }
    uint64_t temp_ws = 0;
    for (int i = 0; i < g->n_ops; i++) {
        const tide_op *op = &g->ops[i];
        uint64_t s = tide_plan_align(op->scratch_bytes);
        for (int k = 0; k < op->n_in + op->n_out; k++) {
            int t = k < op->n_in ? op->in[k] : op->out[k - op->n_in];
            tide_role r = g->tensors[t].role;
            bool seen = false;
            for (int j = 0; j < k && !seen; j++) seen = (j < op->n_in ? op->in[j] : op->out[j - op->n_in]) == t;
            if (!seen && (r == TIDE_ROLE_TEMP || r == TIDE_ROLE_OUTPUT)) s += tide_plan_align(g->tensors[t].nbytes);
        }
        temp_ws = TIDE_MAX(temp_ws, s);
    }
    tide_free(dev_use);
    uint64_t room = opts->device_budget > temp_ws ? opts->device_budget - temp_ws : 0;
    /* the slower SSD-homed bytes are the ones worth keeping */
    uint64_t later_ssd = in_ssd > room ? in_ssd - room : 0;
    uint64_t room2 = room > in_ssd ? room - in_ssd : 0;
    uint64_t later_host = in_host > room2 ? in_host - room2 : 0;
    uint64_t r_host = in_host + (uint64_t)(n_iter - 1) * later_host;
    uint64_t r_ssd = in_ssd + (uint64_t)(n_iter - 1) * later_ssd;
    /* Each link's busy time if its bytes crossed in one transfer, priced by
     * the cost model the simulator uses (an SSD load holds the SSDs and the
     * h2d link): splitting them into more transfers only
     * adds latencies and pipeline fills. */
    double busy[TIDE_RES_COUNT] = {0};
    struct { uint64_t n; double s; unsigned res; } xfer[4] = {
        {r_host, 0, 0}, {r_ssd, 0, 0}, {out_host, 0, 0}, {out_ssd, 0, 0}};
    for (int k = 0; k < 4; k++) {
        if (!xfer[k].n) continue;
        tide_tier tier = k % 2 ? TIDE_TIER_SSD : TIDE_TIER_HOST;
        xfer[k].s = k < 2 ? tide_cost_load(hw, tier, xfer[k].n, opts->host_addressable, &xfer[k].res)
                          : tide_cost_store(hw, tier, xfer[k].n, &xfer[k].res);
        for (int r = 0; r < TIDE_RES_COUNT; r++)
            if (xfer[k].res >> r & 1) busy[r] += xfer[k].s;
    }
    double link = 0;
    for (int r = 0; r < TIDE_RES_COUNT; r++)
        if (!((1u << r) & TIDE_RES_COMPUTE)) link = TIDE_MAX(link, busy[r]);
    engine_free(&e, false);

    out->compute_s = compute;
    out->link_s = link;
    out->lower_bound_s = TIDE_MAX(compute, link);
    tide_plan_opts o = *opts;
    o.policy = TIDE_POLICY_TIDE;
    o.device_budget = everything_bytes(g);
    tide_plan *p = NULL;
    if ((st = plan_make(ctx, g, &o, true, &p))) return st;
    out->ideal_s = p->stats.makespan_s;
    tide_plan_free(p);
    return TIDE_OK;
}
