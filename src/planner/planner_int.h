/*
 * planner_int.h - the plan-building engine shared by the planning policies
 * (planner.c: tide; baselines.c: static-layer, lru, zero-offload; checkpoint-layer:
 * lru over recompute.c's layer-checkpointing schedule). Internal to the planner.
 *
 * The engine owns the simulated state of one planning run: where every
 * tensor's copies are (device arena, host, SSD), what each copy's last writer
 * and readers were (to emit the waits that order hazards across streams), a
 * simulated clock per stream and per shared link (the same cost model the
 * simulator uses), and the plan being appended to. Policies decide *what* to
 * move and *when*; the engine turns each decision into instructions with
 * correct waits and keeps the books. See planner.c for the design note with
 * the invariants and the residency state diagram.
 *
 * Layers, each owning its state and calling only the ones below it:
 *   planner_alloc.c   space for a step (best fit, else the eviction window of
 *                     least cost; forced preparation; a fresh layout)
 *   planner_compute.c computes on the device and on the host, and the end of
 *                     a plan
 *   planner_engine.c  the residency books (engine.t) and copies (place, load,
 *                     store, move, drop, evict), emission with hazard waits,
 *                     the simulated clock (engine.clk), set-up
 *   planner_space.c   device space (engine.sp): release records, releases
 *                     ahead of execution, victim candidates, scratch; waits
 *   planner_arena.c   the arena allocator
 *   recompute.c       recomputation schedules (which ops run again, where):
 *                     the engine then walks positions of the schedule, not
 *                     ops (engine.sched)
 */
#ifndef TIDE_PLANNER_INT_H
#define TIDE_PLANNER_INT_H

/* Prepared steps' scratch slots (engine_space.scratch): a step keeps its slot
 * from its preparation to its COMPUTE. */
#define SCRATCH_RING 4096

#include "planner/lifetime.h"
#include "planner/planner.h"
#include "planner/planner_arena.h"
#include "sim/sim.h"

/* Device copy states (docs/design.md section 3.3; the diagram is in planner.c). */
enum { DEV_NONE = 0, DEV_PLACED, DEV_VALID };

/* A tensor's copy on HOST or SSD. */
typedef struct engine_copy {
    bool exists;                  /* space held: always for a home copy */
    bool valid;                   /* holds the latest version */
    bool home;                    /* the home copy (tier_off TIDE_HOME) */
    tide_blk *blk;                /* spill block when !home */
    int w_ins;                    /* last STORE writing it, -1 */
    int r_ins[TIDE_STREAM_COUNT]; /* last LOAD per stream reading it since */
} engine_copy;

typedef struct engine_tensor {
    uint64_t nbytes, asize;       /* true and granule-rounded bytes */
    tide_role role;
    int dev;                      /* DEV_* */
    uint64_t off;                 /* arena offset while dev != NONE */
    tide_blk *blk;                /* its arena block; NULL when a policy placed it */
    int pre[TIDE_STREAM_COUNT];   /* ALLOC: releases the first write waits for */
    int pre_step;
    int w_ins;                    /* VALID: the write (LOAD/COMPUTE) that made it */
    int r_ins[TIDE_STREAM_COUNT]; /* VALID: last read per stream since w_ins */
    int last_use;                 /* last step that touched it, -1 */
    int nu, nu_from;              /* cache: next use >= nu_from is nu */
    bool doomed;                  /* freed ahead of execution; DROP after doom_step */
    int doom_step;
    int n_loads;                  /* device copies made by LOAD */
    int drop_ins;                 /* last DROP of a device copy, -1 */
    bool evicted;                 /* dropped from the device before the end */
    bool in_place;                /* used where its host home is (host_addressable): never
                                     on the device */
    bool warm;                    /* kept at a fixed arena offset across runs (off) */
    engine_copy cp[TIDE_TIER_COUNT];  /* [HOST], [SSD] ([DEVICE] unused) */
} engine_tensor;

/* A prepared step's scratch range. */
typedef struct scratch_slot {
    int step;                     /* the step it serves, -1: empty slot */
    tide_blk *blk;                /* NULL once released ahead of execution */
    uint64_t off;
    int pre[TIDE_STREAM_COUNT];   /* releases its first use waits for */
    int pre_step;
} scratch_slot;

/* Index of a resource bit (cost.h) in res_free. */
enum { RES_H2D_INDEX = 1 };

/* The device space (planner_space.c owns it; allocation reads it): the
 * arena's blocks, who released which bytes, releases made ahead of execution,
 * victim candidates, the scratch ring. */
typedef struct engine_space {
    tide_arena dev;               /* the device arena */
    tide_relmap rel;              /* exact release record of device bytes */
    tide_blk *last_freed;         /* merged free block of the last device release */
    struct pending_release { int step; tide_blk *b; uint64_t off; } *pend; /* min-heap by step: blocks
                                     released ahead of execution, to merge once resolved */
    int n_pend, cap_pend;
    struct victim_cand { int key; int t; } *cand; /* max-heap by next use of resident tensors
                                     (lazy: stale entries skipped), when use_cand */
    int n_cand, cap_cand;
    bool use_cand;                /* alloc_block finds victims from cand (else a full scan) */
    scratch_slot *scratch;        /* per step mod scratch_cap */
    int scratch_cap;
    bool shared;                  /* every device compute's scratch is at shared_off
                                     (tide_plan_opts.shared_scratch), held for the plan */
    uint64_t shared_off;
} engine_space;

/* The simulated clock (engine_emit advances it; everything reads it): the
 * cost model of cost/ applied to each instruction as it is emitted. */
typedef struct engine_clock {
    double *ins_end;              /* simulated end of each instruction */
    int cap_end;
    double stream_end[TIDE_STREAM_COUNT];
    double res_free[TIDE_RES_COUNT]; /* per resource bit (cost.h): when it is free */
    int *cs_after;                /* per step: last compute-stream instruction
                                     emitted before the next COMPUTE */
    int last_compute_step;        /* step of the last COMPUTE emitted, -1 */
    int last_compute;             /* its instruction, -1 */
} engine_clock;

typedef struct engine {
    tide_ctx *ctx;
    const tide_graph *g;
    const tide_hw *hw;
    tide_plan *plan;              /* being appended to */
    tide_lifetime lt;
    int n_ops, n_steps, n_iter;   /* n_ops: positions per iteration (the graph's ops, plus
                                     recomputations when sched is set); step = iter * n_ops + pos */
    int *sched;                   /* per position, the op it runs (recompute.c), or NULL: op pos */
    int compute_step;             /* step of the COMPUTE being emitted */
    engine_tensor *t;             /* residency books (planner_engine.c) */
    engine_space sp;
    engine_clock clk;
    tide_arena host, ssd;         /* host and SSD spill areas */
    bool has_ssd;
    uint64_t host_used;           /* bytes of the host spill area in use */
    uint64_t stage_keep;          /* bytes of it ordinary spills leave free: the largest
                                     host compute's operands, where state went to SSD
                                     for want of host memory (0: none kept) */
    double *op_s;                 /* cost of each op */
    double *op_cum;               /* op_cum[i]: cost of ops 0..i-1 (n_ops + 1) */
    int exec;                     /* next step to compute */
    int prepared;                 /* steps < prepared have their space (>= exec + 1) */
    /* the policy's choices */
    bool *pinned;                 /* per tensor, or NULL: kept resident across iterations,
                                     at pin_off, in a region reserved at the arena's top */
    uint64_t *pin_off;
    bool *stream;                 /* per tensor, or NULL: persistent, dropped after its last
                                     use of each iteration and loaded again in the next */
    bool lru_loads;               /* LOADs wait for the previous COMPUTE (on demand) */
    const bool *host_op;          /* per op, or NULL: computed on the host CPU */
    bool *own_host_op;            /* zero-offload: host_op made by engine_init (every ADAMW) */
    int *next_host;               /* with host_op: per position o, the first position >= o
                                     whose op is placed on the host (n_ops: none) */
    int *vict;                    /* alloc_block's: victims of one eviction window */
    int cap_vict;
    tide_status st;               /* first failure */
} engine;

/* A release record naming instruction ins of stream s only (ins -1: none). */
static inline void release_one(int rel[TIDE_STREAM_COUNT], int s, int ins) {
    for (int k = 0; k < TIDE_STREAM_COUNT; k++) rel[k] = -1;
    if (ins >= 0) rel[s] = ins;
}

/* Waits being gathered for one instruction: per stream the latest one. */
typedef struct waits {
    int w[TIDE_STREAM_COUNT];
} waits;

static inline void waits_init(waits *w) {
    for (int s = 0; s < TIDE_STREAM_COUNT; s++) w->w[s] = -1;
}
void waits_add(const engine *e, waits *w, int ins);
/* Adds a release record (per-stream instructions and a compute step). */
void waits_add_release(const engine *e, waits *w, const int rel[TIDE_STREAM_COUNT], int rel_step);

/* Device bytes op o needs at once in e: its distinct tensors that live in
 * the arena (neither used in place nor warm) and its scratch; 0 for an op
 * placed on the host. */
uint64_t engine_working_set(const engine *e, int o);

/* Sets up e for g under opts (homes, spill areas, lifetime, costs) and
 * allocates its plan. Returns TIDE_OK, TIDE_E_INVALID, TIDE_E_INFEASIBLE or
 * TIDE_E_NOMEM. engine_free releases everything but e->plan when keep_plan. */
tide_status engine_init(engine *e, tide_ctx *ctx, const tide_graph *g, const tide_plan_opts *opts);
void engine_free(engine *e, bool keep_plan);

/* Appends ins with waits (same-stream ones dropped), advancing the simulated
 * clock. Returns its index, or -1 (e->st = TIDE_E_NOMEM). */
int engine_emit(engine *e, tide_ins *ins, const waits *w);

/* Next use of tensor t at or after the execution step (cached). */
int engine_next_use(engine *e, int t);
int engine_iter(const engine *e, int step);
/* Predicted compute time of steps [from, to). O(1). */
double engine_compute_seconds(const engine *e, int from, int to);
double engine_load_seconds(const engine *e, int t);
double engine_store_seconds(const engine *e, int t, tide_tier tier);
/* Tier a dirty copy of t would be stored to on eviction (HOST or SSD), or -1
 * when no spill space is left. */
int engine_spill_tier(engine *e, int t);
/* What evicting t now implies: *store (a STORE must precede the DROP: the
 * value is still needed and no tier copy is valid), *reread (the value is
 * read again, so it must come back), *next (next use step). Returns false
 * when t cannot be evicted (its store has nowhere to go). */
bool engine_evict_info(engine *e, int t, bool *store, bool *reread, int *next);

/* Gives t the arena block b (an allocation made for it). */
void engine_place(engine *e, int t, tide_blk *b);
/* Gives t a device range a policy manages itself, with its release record. */
void engine_place_at(engine *e, int t, uint64_t off, const int pre[TIDE_STREAM_COUNT], int pre_step);
/* Places t at its fixed slot if it has one (a pinned resident); returns
 * whether it did. */
bool engine_place_pinned(engine *e, int t);
/* LOAD of t (placed, not valid) from its best valid tier copy. extra: one
 * more instruction to wait for (-1 none). Returns the LOAD or -1. */
int engine_load(engine *e, int t, int step, int extra);
/* Evicts t from the device: STORE first when engine_evict_info says so, then
 * DROP, on the STORE's stream or else on `stream` (the consumer of the space).
 * Returns the DROP, or -1 (e->st set). */
int engine_evict(engine *e, int t, tide_stream stream, int step);
/* Releases an allocation never written (no DROP needed). */
void engine_unplace(engine *e, int t);
/* Records b as step's scratch. */
void space_scratch_set(engine *e, int step, tide_blk *b);
/* Releases step's scratch ahead of execution (it dies with the COMPUTE). */
void space_scratch_doom(engine *e, int step);
/* Frees t's arena block now, ahead of the execution horizon: its value dies
 * at step (no store needed: space_can_doom); the DROP is emitted after the
 * COMPUTE of step. */
bool space_can_doom(engine *e, int t, int step);
void space_doom(engine *e, int t, int step);

/* Allocation in the device arena with eviction. for_load: the consumer is a
 * LOAD on stream (free space whose release is still ahead of execution is
 * unusable); else the COMPUTE of step. cost rates a tensor as a victim (< 0:
 * may not be evicted; NULL: no eviction). relocate: tensors used by step
 * itself may be moved out too, as a last resort (the caller places them
 * again). Returns the block (owner set to owner, release record exact) or
 * NULL: no space (e->st unchanged) or failure (e->st set). */
typedef double (*victim_cost_fn)(engine *e, int t, void *user);
/* A cost at or below this: t may not be evicted, nor any tensor whose next use
 * comes sooner (lets the candidate search stop early). */
#define COST_STOP (-2.0)
tide_blk *alloc_block(engine *e, uint64_t size, int owner, bool for_load, tide_stream stream, int step,
                   victim_cost_fn cost, void *user, bool relocate);
/* Makes room for step's whole working set by evicting everything else and
 * laying the working set out afresh (the fallback when fragmentation leaves
 * no window); loads inputs and places outputs and scratch. Returns TIDE_OK or
 * the failure. */
tide_status alloc_compact(engine *e, int step);
/* Ensures step's inputs are loaded and outputs and scratch placed, allocating
 * with cost (victims: anything not used at step). Returns TIDE_OK or failure;
 * uses alloc_compact when no window exists. */
tide_status alloc_prepare_forced(engine *e, int step, victim_cost_fn cost, void *user);

/* COMPUTE of step (inputs valid, outputs placed), then the bookkeeping after
 * it: DROPs of doomed and dead copies, final STOREs of persistent and OUTPUT
 * tensors after their last write, release of the scratch. A step placed on
 * the host goes to engine_compute_host. */
tide_status engine_compute(engine *e, int step);
/* Whether step's op is placed on the host CPU. */
static inline bool engine_on_host(const engine *e, int step) {
    return e->host_op && e->host_op[e->sched ? e->sched[step % e->n_ops] : step % e->n_ops];
}
/* COMPUTE of a host step on the host stream: each input gets a valid host
 * copy first (a STORE from the device, or a MOVE from SSD), each output a
 * host location (its home on host, else host spill space); device copies of
 * what it writes are dropped, and what dies there is dropped everywhere. */
tide_status engine_compute_host(engine *e, int step);
/* End of plan: STORE home every dirty persistent tensor, DROP everything,
 * fill the stats (makespan from the simulator when simulate). */
tide_status engine_finish(engine *e, bool simulate, double t0);
/* Moves p's collective computes onto the network stream with the waits
 * their compute-stream order gave them, and sets p->ranks (planner_net.c). */
tide_status planner_collectives_to_net(tide_ctx *ctx, tide_plan *p);

/* Op index of a step. */
static inline int engine_op_index(const engine *e, int step) {
    return e->sched ? e->sched[step % e->n_ops] : step % e->n_ops;
}
/* Position of a step in its iteration (what the use lists count in). */
static inline int engine_pos(const engine *e, int step) { return step % e->n_ops; }
static inline const tide_op *engine_op(const engine *e, int step) { return &e->g->ops[engine_op_index(e, step)]; }
/* Distinct tensors of op: inputs first, then outputs not read; is_in[i] says
 * which. Returns their number. */
int op_distinct_tensors(const tide_op *op, int *ts, bool *is_in);
/* Records that device bytes [off, off+n) were released by instruction ins,
 * or ahead of execution at step (the exact map behind every new occupant's
 * waits). */
void space_released(engine *e, uint64_t off, uint64_t n, int ins, int step);
/* Tensor t (resident in the arena) is next used at step key: a victim
 * candidate for tide's window search. space_cand_pop takes the one used
 * furthest ahead (stale entries included: the caller checks). */
void space_cand_push(engine *e, int t, int key);
struct victim_cand space_cand_pop(engine *e);
/* Gives block b, just taken for an occupant, its exact release record (what
 * its first writer waits for). */
void space_claim(engine *e, tide_blk *b);
/* Step has been computed: blocks released ahead of it merge with their
 * neighbours. */
void space_resolve(engine *e, int step);

/* Roles that persist across runs (WEIGHT, STATE), and those whose latest
 * version must reach a home (STATE, OUTPUT). */
static inline bool role_persistent(tide_role r) { return r == TIDE_ROLE_WEIGHT || r == TIDE_ROLE_STATE; }
static inline bool role_homebound(tide_role r) { return r == TIDE_ROLE_STATE || r == TIDE_ROLE_OUTPUT; }

/* An instruction of kind on stream s for step (its iteration) and tensor t
 * (-1 for a COMPUTE), offsets at home. */
tide_ins engine_ins_new(const engine *e, tide_ins_kind kind, tide_stream s, int step, int t);
/* Gives t a spill copy on tier (none there yet), whose previous occupants w
 * then waits for. Returns 0, or -1 with e->st set. */
int engine_spill_copy(engine *e, int t, tide_tier tier, waits *w);
/* A host or SSD copy's offset: TIDE_HOME for a home. */
uint64_t engine_copy_off(const engine_copy *c);
/* STORE of t's device copy to tier (its home there, else a spill copy), MOVE
 * of its valid SSD copy into host memory, DROP of its device copy on stream
 * s (waiting on every access). Each returns the instruction or -1 (e->st). */
int engine_store(engine *e, int t, tide_tier tier, int step);
int engine_move(engine *e, int t, tide_tier from, int step);
int engine_drop_dev(engine *e, int t, tide_stream s, int step);
/* DROP of t's spill copy on tier; of every spill copy that holds nothing
 * worth keeping (stale ones, or all of them when t's value is dead). 0 or -1. */
int engine_drop_tier(engine *e, int t, tide_tier tier, int step);
int engine_drop_spills(engine *e, int t, int step, bool dead);

/* Whole-state consistency for debug asserts. */
bool engine_check(const engine *e);

/* The policies. Each plans into e (already initialised). */
tide_status policy_tide(engine *e);
/* A recomputation schedule of g (recompute.c): *sched (n_pos positions,
 * allocated) names the op of each position of an iteration. hw NULL: layer
 * checkpointing; else only cheap recomputations by hw's costs, with chains
 * of producers up to `chain` links deep (0: single ops). TIDE_OK,
 * TIDE_E_NOMEM or TIDE_E_INVALID (too long). */
tide_status recompute_schedule(tide_ctx *ctx, const tide_graph *g, const tide_hw *hw, int chain, int **sched,
                               int *n_pos);
tide_status policy_lru(engine *e);
/* zero-offload: lru over the layer-checkpointing schedule, every ADAMW on
 * the host, each gradient STOREd to host at the end of the layer run that
 * wrote it (baselines.c). */
tide_status policy_zero_offload(engine *e);
tide_status policy_static_layer(engine *e, uint64_t *min_needed);

/* static-layer's smallest feasible budget (its layout formula). */
uint64_t tide_static_layer_min_budget(const tide_graph *g);

#endif
