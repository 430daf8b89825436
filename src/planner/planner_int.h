/*
 * planner_int.h - the plan-building engine shared by the planning policies
 * (planner.c: tide; baselines.c: static-layer, lru). Internal to the planner.
 *
 * The engine owns the simulated state of one planning run: where every
 * tensor's copies are (device arena, host, SSD), what each copy's last writer
 * and readers were (to emit the waits that order hazards across streams), a
 * simulated clock per stream and per shared link (the same cost model the
 * simulator uses), and the plan being appended to. Policies decide *what* to
 * move and *when*; the engine turns each decision into instructions with
 * correct waits and keeps the books. See planner.c for the design note with
 * the invariants and the residency state diagram.
 */
#ifndef TIDE_PLANNER_INT_H
#define TIDE_PLANNER_INT_H

#include "planner/lifetime.h"
#include "planner/planner.h"
#include "planner/planner_arena.h"
#include "sim/sim.h"

/* Device copy states (DESIGN 3; the diagram is in planner.c). */
enum { PE_DEV_NONE = 0, PE_DEV_ALLOC, PE_DEV_VALID };

/* A tensor's copy on HOST or SSD. */
typedef struct pe_copy {
    bool exists;                  /* space held: always for a home copy */
    bool valid;                   /* holds the latest version */
    bool home;                    /* the home copy (tier_off TIDE_HOME) */
    tide_blk *blk;                /* spill block when !home */
    int w_ins;                    /* last STORE writing it, -1 */
    int r_ins[TIDE_STREAM_COUNT]; /* last LOAD per stream reading it since */
} pe_copy;

typedef struct pe_tensor {
    uint64_t nbytes, asize;       /* true and granule-rounded bytes */
    tide_role role;
    int dev;                      /* PE_DEV_* */
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
    pe_copy cp[TIDE_TIER_COUNT];  /* [HOST], [SSD] ([DEVICE] unused) */
} pe_tensor;

/* A prepared step's scratch range. */
typedef struct pe_scratch {
    int step;                     /* the step it serves, -1: empty slot */
    tide_blk *blk;                /* NULL once released ahead of execution */
    uint64_t off;
    int pre[TIDE_STREAM_COUNT];   /* releases its first use waits for */
    int pre_step;
} pe_scratch;

/* Index of a resource bit (cost.h) in res_free. */
enum { PE_RES_H2D = 1 };

typedef struct pe {
    tide_ctx *ctx;
    const tide_graph *g;
    const tide_hw *hw;
    tide_plan *plan;
    tide_lifetime lt;
    int n_ops, n_steps, n_iter;
    pe_tensor *t;
    tide_arena dev, host, ssd;    /* device arena; host and SSD spill areas */
    tide_relmap rel;              /* exact release record of device bytes */
    bool has_ssd;
    uint64_t host_used;           /* bytes of the host spill area in use */
    double *op_s;                 /* cost of each op */
    double *op_cum;               /* op_cum[i]: cost of ops 0..i-1 (n_ops + 1) */
    double *ins_end;              /* simulated end of each instruction */
    int cap_end;
    double stream_end[TIDE_STREAM_COUNT];
    double res_free[TIDE_RES_COUNT]; /* per resource bit (cost.h): when it is free */
    int *cs_after;                /* per step: last compute-stream instruction
                                     emitted before the next COMPUTE */
    int last_compute_step;        /* step of the last COMPUTE emitted, -1 */
    int last_compute;             /* its instruction, -1 */
    int exec;                     /* next step to compute */
    int prepared;                 /* steps < prepared have their space (>= exec + 1) */
    pe_scratch *scratch;          /* per step mod scratch_cap */
    int scratch_cap;
    tide_blk *last_freed;         /* merged free block of the last device release */
    struct pe_pend { int step; tide_blk *b; uint64_t off; } *pend; /* min-heap by step: blocks
                                     released ahead of execution, to merge once resolved */
    int n_pend, cap_pend;
    struct pe_cand { int key; int t; } *cand; /* max-heap by next use of resident tensors
                                     (lazy: stale entries skipped), when use_cand */
    int n_cand, cap_cand;
    bool use_cand;                /* pe_alloc finds victims from cand (else a full scan) */
    bool *pinned;                 /* per tensor, or NULL: kept resident across iterations,
                                     at pin_off, in a region reserved at the arena's top */
    uint64_t *pin_off;
    bool *stream;                 /* per tensor, or NULL: persistent, dropped after its last
                                     use of each iteration and loaded again in the next */
    int *vict;                    /* victims of one eviction window */
    int cap_vict;
    bool lru_loads;               /* LOADs wait for the previous COMPUTE (on demand) */
    const bool *host_op;          /* per op, or NULL: computed on the host CPU */
    int *next_host;               /* with host_op: per op o, the first op >= o placed on
                                     the host (n_ops: none) */
    tide_status st;               /* first failure */
} pe;

/* A release record naming instruction ins of stream s only (ins -1: none). */
static inline void pe_rel_one(int rel[TIDE_STREAM_COUNT], int s, int ins) {
    for (int k = 0; k < TIDE_STREAM_COUNT; k++) rel[k] = -1;
    if (ins >= 0) rel[s] = ins;
}

/* Waits being gathered for one instruction: per stream the latest one. */
typedef struct pe_waits {
    int w[TIDE_STREAM_COUNT];
} pe_waits;

static inline void pw_init(pe_waits *w) {
    for (int s = 0; s < TIDE_STREAM_COUNT; s++) w->w[s] = -1;
}
void pw_add(const pe *e, pe_waits *w, int ins);
/* Adds a release record (per-stream instructions and a compute step). */
void pw_add_rel(const pe *e, pe_waits *w, const int rel[TIDE_STREAM_COUNT], int rel_step);

/* Device bytes op o needs at once in e: its distinct tensors that live in
 * the arena (neither used in place nor warm) and its scratch; 0 for an op
 * placed on the host. */
uint64_t pe_working_set(const pe *e, int o);

/* Sets up e for g under opts (homes, spill areas, lifetime, costs) and
 * allocates its plan. Returns TIDE_OK, TIDE_E_INVALID, TIDE_E_INFEASIBLE or
 * TIDE_E_NOMEM. pe_free releases everything but e->plan when keep_plan. */
tide_status pe_init(pe *e, tide_ctx *ctx, const tide_graph *g, const tide_plan_opts *opts);
void pe_free(pe *e, bool keep_plan);

/* Appends ins with waits (same-stream ones dropped), advancing the simulated
 * clock. Returns its index, or -1 (e->st = TIDE_E_NOMEM). */
int pe_emit(pe *e, tide_ins *ins, const pe_waits *w);

/* Next use of tensor t at or after the execution step (cached). */
int pe_next_use(pe *e, int t);
int pe_iter(const pe *e, int step);
/* Predicted compute time of steps [from, to). O(1). */
double pe_compute_seconds(const pe *e, int from, int to);
double pe_load_seconds(const pe *e, int t);
double pe_store_seconds(const pe *e, int t, tide_tier tier);
/* Tier a dirty copy of t would be stored to on eviction (HOST or SSD), or -1
 * when no spill space is left. */
int pe_spill_tier(pe *e, int t);
/* What evicting t now implies: *store (a STORE must precede the DROP: the
 * value is still needed and no tier copy is valid), *reread (the value is
 * read again, so it must come back), *next (next use step). Returns false
 * when t cannot be evicted (its store has nowhere to go). */
bool pe_evict_info(pe *e, int t, bool *store, bool *reread, int *next);

/* Gives t the arena block b (an allocation made for it). */
void pe_place(pe *e, int t, tide_blk *b);
/* Gives t a device range a policy manages itself, with its release record. */
void pe_place_at(pe *e, int t, uint64_t off, const int pre[TIDE_STREAM_COUNT], int pre_step);
/* Places t at its fixed slot if it has one (a pinned resident); returns
 * whether it did. */
bool pe_place_pinned(pe *e, int t);
/* LOAD of t (placed, not valid) from its best valid tier copy. extra: one
 * more instruction to wait for (-1 none). Returns the LOAD or -1. */
int pe_load(pe *e, int t, int step, int extra);
/* Evicts t from the device: STORE first when pe_evict_info says so, then
 * DROP, on the STORE's stream or else on `stream` (the consumer of the space).
 * Returns the DROP, or -1 (e->st set). */
int pe_evict(pe *e, int t, tide_stream stream, int step);
/* Releases an allocation never written (no DROP needed). */
void pe_unplace(pe *e, int t);
/* Records b as step's scratch. */
void pe_scratch_set(pe *e, int step, tide_blk *b);
/* Releases step's scratch ahead of execution (it dies with the COMPUTE). */
void pe_scratch_doom(pe *e, int step);
/* Frees t's arena block now, ahead of the execution horizon: its value dies
 * at step (no store needed: pe_can_doom); the DROP is emitted after the
 * COMPUTE of step. */
bool pe_can_doom(pe *e, int t, int step);
void pe_doom(pe *e, int t, int step);

/* Allocation in the device arena with eviction. for_load: the consumer is a
 * LOAD on stream (free space whose release is still ahead of execution is
 * unusable); else the COMPUTE of step. cost rates a tensor as a victim (< 0:
 * may not be evicted; NULL: no eviction). relocate: tensors used by step
 * itself may be moved out too, as a last resort (the caller places them
 * again). Returns the block (owner set to owner, release record exact) or
 * NULL: no space (e->st unchanged) or failure (e->st set). */
typedef double (*pe_cost_fn)(pe *e, int t, void *user);
/* A cost at or below this: t may not be evicted, nor any tensor whose next use
 * comes sooner (lets the candidate search stop early). */
#define PE_COST_STOP (-2.0)
tide_blk *pe_alloc(pe *e, uint64_t size, int owner, bool for_load, tide_stream stream, int step,
                   pe_cost_fn cost, void *user, bool relocate);
/* Makes room for step's whole working set by evicting everything else and
 * laying the working set out afresh (the fallback when fragmentation leaves
 * no window); loads inputs and places outputs and scratch. Returns TIDE_OK or
 * the failure. */
tide_status pe_compact(pe *e, int step);
/* Ensures step's inputs are loaded and outputs and scratch placed, allocating
 * with cost (victims: anything not used at step). Returns TIDE_OK or failure;
 * uses pe_compact when no window exists. */
tide_status pe_prepare_forced(pe *e, int step, pe_cost_fn cost, void *user);

/* COMPUTE of step (inputs valid, outputs placed), then the bookkeeping after
 * it: DROPs of doomed and dead copies, final STOREs of persistent and OUTPUT
 * tensors after their last write, release of the scratch. A step placed on
 * the host goes to pe_compute_host. */
tide_status pe_compute(pe *e, int step);
/* Whether step's op is placed on the host CPU. */
static inline bool pe_on_host(const pe *e, int step) { return e->host_op && e->host_op[step % e->n_ops]; }
/* COMPUTE of a host step on the host stream: each input gets a valid host
 * copy first (a STORE from the device, or a MOVE from SSD), each output a
 * host location (its home on host, else host spill space); device copies of
 * what it writes are dropped, and what dies there is dropped everywhere. */
tide_status pe_compute_host(pe *e, int step);
/* End of plan: STORE home every dirty persistent tensor, DROP everything,
 * fill the stats (makespan from the simulator when simulate). */
tide_status pe_finish(pe *e, bool simulate, double t0);

/* Op index of a step. */
static inline int pe_op_index(const pe *e, int step) { return step % e->n_ops; }
/* Distinct tensors of op: inputs first, then outputs not read; is_in[i] says
 * which. Returns their number. */
int pe_op_tensors(const tide_op *op, int *ts, bool *is_in);
/* Records that device bytes [off, off+n) were released by instruction ins,
 * or ahead of execution at step (the exact map behind every new occupant's
 * waits). */
void pe_devrel(pe *e, uint64_t off, uint64_t n, int ins, int step);
/* Tensor t (resident in the arena) is next used at step key: a victim
 * candidate for tide's window search. */
void pe_cand_push(pe *e, int t, int key);
/* Step has been computed: blocks released ahead of it merge with their
 * neighbours. */
void pe_pend_resolve(pe *e, int step);

/* Whole-state consistency for debug asserts. */
bool pe_check(const pe *e);

/* The policies. Each plans into e (already initialised). */
tide_status pe_run_tide(pe *e);
tide_status pe_run_lru(pe *e);
tide_status pe_run_static_layer(pe *e, uint64_t *min_needed);

/* static-layer's smallest feasible budget (its layout formula). */
uint64_t tide_static_layer_min_budget(const tide_graph *g);

#endif
