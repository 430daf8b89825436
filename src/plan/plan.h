/*
 * plan.h - the plan: what the planner produces, the verifier proves, the
 * simulator replays and the executor runs (DESIGN sections 3-5).
 *
 * A plan runs a graph n_iter times. It is a list of instructions; each sits on
 * one stream and streams run their instructions in list order (FIFO). Across
 * streams, an instruction starts only after every instruction in its wait list
 * has completed. Nothing else orders streams.
 *
 * Instructions:
 *   COMPUTE op            reads every input at dev_off[i], writes every output at
 *                         dev_off[n_in + j] in the device arena; scratch at
 *                         scratch_off (scratch_bytes = op->scratch_bytes).
 *   LOAD  t  src -> dev   copies tensor t from its copy on tier src (HOST or SSD)
 *                         to the device arena at dev_off[0].
 *   STORE t  dev -> dst   copies the device copy at dev_off[0] to tier dst
 *                         (HOST or SSD) at tier_off; that copy becomes valid.
 *   MOVE  t  src -> dst   copies between HOST and SSD (tier_off: destination
 *                         offset; src_off: source offset).
 *   DROP  t  tier         ends a copy's life: on DEVICE its arena range
 *                         [dev_off[0], +nbytes) is free once DROP completes; on
 *                         HOST or SSD its spill space is free.
 *   FREE t  (not an instruction): a tensor is dead after its last DROP.
 *
 * Conventions (the verifier enforces them): op = -1 on every instruction but
 * COMPUTE and tensor = -1 on a COMPUTE; COMPUTE runs on the compute stream, LOAD
 * on h2d or io, STORE on d2h or io, MOVE on io, DROP on any; waits name earlier
 * instructions only (list order is then a topological order: no deadlock, and a
 * CUDA event is always recorded before it is waited on). A DROP need not wait
 * for the copy's readers, but whoever reuses its bytes waits on the DROP and on
 * every access of the previous occupant. Homes are never dropped; WEIGHT and
 * INPUT homes are never written.
 *
 * Device memory: one arena of exactly device_budget bytes; every device copy
 * has an offset decided here. Live device ranges are those between the first
 * write of a range (the LOAD or the COMPUTE that produces the tensor) and the
 * completion of its DROP. A tensor not kept resident is DROPped after its
 * last use (or when evicted); at the end of the plan only resident tensors may
 * still have device copies, and their homes hold the latest version.
 *
 * Homes: WEIGHT and STATE tensors have a home tier (HOST or SSD) where a clean
 * copy lives before the run and where their latest version must be when the
 * plan ends. INPUT tensors start valid on HOST; OUTPUT tensors must end valid on
 * HOST. TEMP tensors have no home; they may be spilled to HOST or SSD space
 * (tier_off in the spill area of that tier) and reloaded.
 *
 * Host and SSD spill areas: host_spill_bytes and ssd_spill_bytes are the
 * highest tier_off + nbytes used by spilled copies (offsets are planned like the
 * arena's). Home copies of persistent tensors are not in the spill areas: the
 * executor keeps them where the checkpoint (or the state) lives.
 */
#ifndef TIDE_PLAN_H
#define TIDE_PLAN_H

#include "graph/graph.h"

typedef enum tide_tier { TIDE_TIER_DEVICE = 0, TIDE_TIER_HOST, TIDE_TIER_SSD, TIDE_TIER_COUNT } tide_tier;
typedef enum tide_stream {
    TIDE_STREAM_COMPUTE = 0, TIDE_STREAM_H2D, TIDE_STREAM_D2H, TIDE_STREAM_IO, TIDE_STREAM_COUNT
} tide_stream;
typedef enum tide_ins_kind {
    TIDE_INS_COMPUTE = 0, TIDE_INS_LOAD, TIDE_INS_STORE, TIDE_INS_MOVE, TIDE_INS_DROP, TIDE_INS_COUNT
} tide_ins_kind;

const char *tide_tier_name(tide_tier t);
const char *tide_stream_name(tide_stream s);
const char *tide_ins_name(tide_ins_kind k);

#define TIDE_INS_MAX_OFF (TIDE_OP_MAX_IN + TIDE_OP_MAX_OUT)

typedef struct tide_ins {
    tide_ins_kind kind;
    tide_stream stream;
    int iter;          /* iteration 0..n_iter-1 */
    int op;            /* COMPUTE: op index in the graph; else -1 */
    int tensor;        /* LOAD/STORE/MOVE/DROP: tensor index; else -1 */
    tide_tier src, dst;/* LOAD: src=HOST|SSD, dst=DEVICE; STORE: src=DEVICE, dst=HOST|SSD;
                          MOVE: HOST<->SSD; DROP: src = tier whose copy ends */
    uint64_t dev_off[TIDE_INS_MAX_OFF]; /* COMPUTE: in then out; LOAD/STORE/DROP(device): [0] */
    uint64_t scratch_off;
    uint64_t tier_off; /* STORE/MOVE: destination offset in the spill area
                          (UINT64_MAX: the tensor's home); LOAD: source offset
                          likewise; DROP(host/ssd): the spill offset */
    uint64_t src_off;  /* MOVE: source offset (UINT64_MAX: home) */
    int n_wait;
    int wait_at;       /* waits are plan->waits[wait_at .. wait_at + n_wait) */
} tide_ins;

#define TIDE_HOME UINT64_MAX

typedef enum tide_policy { TIDE_POLICY_TIDE = 0, TIDE_POLICY_STATIC_LAYER, TIDE_POLICY_LRU, TIDE_POLICY_COUNT } tide_policy;
const char *tide_policy_name(tide_policy p);
int tide_policy_parse(const char *s, tide_policy *out); /* 0 or -1 */

typedef struct tide_plan_stats {
    uint64_t peak_device_bytes;   /* highest byte in use of the arena at any instant */
    uint64_t peak_host_bytes;     /* spill area high water (homes excluded) */
    uint64_t peak_ssd_bytes;
    uint64_t bytes_h2d, bytes_d2h, bytes_ssd_read, bytes_ssd_write;
    uint64_t n_loads, n_stores, n_moves;
    double compute_s;             /* sum of op costs (cost model) */
    double makespan_s;            /* simulated */
    double plan_seconds;          /* wall time spent planning */
} tide_plan_stats;

typedef struct tide_plan {
    const tide_graph *g;          /* not owned */
    tide_ctx *ctx;
    tide_policy policy;
    int n_iter;
    uint64_t device_budget;
    uint64_t host_budget;         /* spill + homes on host must fit (0: unlimited) */
    tide_tier *home;              /* per tensor: HOST or SSD for WEIGHT/STATE, HOST for
                                     INPUT/OUTPUT, DEVICE for TEMP (no home) */
    bool *resident;               /* per tensor: kept on device across iterations and at
                                     the end (its home is then updated by a final STORE) */
    tide_ins *ins;
    int n_ins, cap_ins;
    int *waits;
    int n_waits, cap_waits;
    uint64_t host_spill_bytes, ssd_spill_bytes;
    tide_plan_stats stats;
} tide_plan;

/* Creation and building. tide_plan_alloc makes an empty plan for g; the
 * builders append instructions. Each returns 0, or -1 when memory is exhausted
 * (the plan is then unusable and must be freed). */
tide_plan *tide_plan_alloc(tide_ctx *ctx, const tide_graph *g, int n_iter);
void tide_plan_free(tide_plan *p);
/* Appends ins (its wait_at/n_wait ignored) with the given waits; returns the new
 * instruction's index or -1. */
int tide_plan_push(tide_plan *p, const tide_ins *ins, const int *waits, int n_wait);
/* Adds one wait to an existing instruction only if it is the last one pushed.
 * Returns 0 or -1. */
int tide_plan_add_wait(tide_plan *p, int ins, int wait_on);

/* JSON (cJSON). The graph is not serialised: loading needs the same graph (the
 * file records the graph's op and tensor counts and a fingerprint of names and
 * sizes, checked on load: TIDE_E_FORMAT on mismatch or any malformed field). */
tide_status tide_plan_save_json(const tide_plan *p, const char *path);
tide_status tide_plan_load_json(tide_ctx *ctx, const tide_graph *g, const char *path, tide_plan **out);
uint64_t tide_graph_fingerprint(const tide_graph *g);

/* ---------------------------------------------------------------- hardware */

/* A hardware profile: what the cost model and the simulator know of a machine. */
typedef struct tide_hw {
    char name[64];
    uint64_t device_mem_bytes;
    double flops[TIDE_DTYPE_COUNT]; /* peak dense matmul FLOP/s by activation dtype
                                       (compute dtype; f32 for the CPU backend) */
    double matmul_efficiency;     /* fraction of peak large matmuls reach */
    double attention_efficiency;  /* fraction of the peak of its dtype ATTENTION
                                     reaches; 0: the default (0.5) */
    double mem_bw;                /* device memory bandwidth, bytes/s */
    double h2d_bw, d2h_bw;        /* host<->device link, bytes/s each way */
    double link_latency_s;        /* per transfer */
    double launch_s;              /* per op */
    uint64_t host_mem_bytes;
    int ssd_count;
    double ssd_read_bw, ssd_write_bw; /* per SSD, bytes/s */
    double ssd_latency_s;
} tide_hw;

/* Loads a profile by name (data/hw/NAME.json, shipped) or from a path (a name
 * containing '/' or ending in .json). TIDE_E_NOT_FOUND lists the shipped names;
 * TIDE_E_FORMAT names the bad field. */
tide_status tide_hw_load(tide_ctx *ctx, const char *name_or_path, tide_hw *hw);
tide_status tide_hw_save(tide_ctx *ctx, const tide_hw *hw, const char *path);
/* Cost model: predicted seconds for op of g on hw (compute-bound or
 * memory-bound, whichever is slower, plus launch overhead). */
double tide_hw_op_seconds(const tide_hw *hw, const tide_graph *g, const tide_op *op);
/* Predicted seconds to move n bytes over a link of a tier pair. */
double tide_hw_h2d_seconds(const tide_hw *hw, uint64_t n);
double tide_hw_d2h_seconds(const tide_hw *hw, uint64_t n);
double tide_hw_ssd_read_seconds(const tide_hw *hw, uint64_t n);
double tide_hw_ssd_write_seconds(const tide_hw *hw, uint64_t n);

/* ---------------------------------------------------------------- planning */

typedef struct tide_plan_opts {
    tide_policy policy;
    uint64_t device_budget;       /* bytes of the arena */
    uint64_t host_budget;         /* 0: the profile's host memory */
    int n_iter;                   /* >= 1 */
    const tide_hw *hw;            /* cost model */
    bool weights_on_ssd;          /* home WEIGHTs on SSD instead of host */
} tide_plan_opts;

/* Plans g under opts. Returns TIDE_OK with *out set; TIDE_E_INFEASIBLE with a
 * message "needs at least N bytes" when the budget is below what one op's
 * working set needs (or host memory cannot hold what must live there);
 * TIDE_E_NOMEM. The plan's stats are filled in (makespan from the simulator). */
tide_status tide_plan_make(tide_ctx *ctx, const tide_graph *g, const tide_plan_opts *opts,
                           tide_plan **out);
/* Smallest device budget for which the policy finds a plan (binary search
 * between the largest op working set and the unconstrained peak). */
tide_status tide_plan_min_budget(tide_ctx *ctx, const tide_graph *g, const tide_plan_opts *opts,
                                 uint64_t *min_budget);
/* Bytes the device needs with no limit: every tensor resident for the whole run
 * would be an upper bound; this is the peak of the tide policy's plan with an
 * unlimited budget (persistent tensors resident, temps freed after last use). */
uint64_t tide_plan_unconstrained_peak(tide_ctx *ctx, const tide_graph *g, const tide_hw *hw, int n_iter);

/* ---------------------------------------------------------------- tiling */

/* How a LLaMA graph is tiled (tide_llama_tile_level): TIDE_TILE_AUTO picks a
 * level, TIDE_TILE_NONE never tiles, 1..TIDE_TILE_LEVELS-1 forces a level. */
#define TIDE_TILE_AUTO 0
#define TIDE_TILE_NONE (-1)
/* Graphs with more ops than this are not tried by TIDE_TILE_AUTO. */
#define TIDE_TILE_MAX_OPS 150000

/* Builds the graph of (cfg, base) tiled for opts. With min_budget NULL: the
 * coarsest level (from none) whose plan fits opts->device_budget, and, when
 * plan is not NULL, that plan (of *g; the caller frees both); with
 * min_budget: the level with the smallest minimum budget (coarsest on ties),
 * that minimum in *min_budget (and no plan). `tile` limits the choice
 * (above). On success *g is the graph and *level its level.
 * TIDE_E_INFEASIBLE when no level fits (the message gives what the finest
 * level tried needs). */
tide_status tide_plan_tiled_graph(tide_ctx *ctx, const tide_llama_config *cfg,
                                  const tide_llama_graph_opts *base, const tide_plan_opts *opts, int tile,
                                  tide_graph **g, int *level, tide_plan **plan, uint64_t *min_budget);
/* Parses "auto", "none" or a level number; TIDE_E_INVALID otherwise (with a
 * message in ctx, which may be NULL). */
tide_status tide_tile_parse(tide_ctx *ctx, const char *s, int *tile);

/* ---------------------------------------------------------------- verifier */

/* Replays p against its graph and proves DESIGN section 5's invariants: every
 * COMPUTE reads the current version of each input from device memory; live
 * device ranges never overlap (transfers in flight included); every
 * offset+size is inside the budget; every cross-stream RAW/WAR/WAW hazard on
 * device ranges and tier copies is ordered by waits; persistent tensors end at
 * home with their latest version and OUTPUT tensors end on HOST. Returns TIDE_OK
 * or TIDE_E_VERIFY with the first violation (instruction index, tensor, what).
 * Shares no logic with the planner. */
tide_status tide_plan_verify(const tide_plan *p);

/* ---------------------------------------------------------------- simulator */

typedef struct tide_sim_event {
    int ins;                      /* instruction index */
    double start_s, end_s;
} tide_sim_event;

typedef struct tide_sim_result {
    double makespan_s;
    double busy_s[TIDE_STREAM_COUNT];
    tide_sim_event *events;       /* one per instruction, in instruction order */
    int n_events;
} tide_sim_result;

/* Discrete-event replay of p on hw: streams are FIFO queues, waits delay starts,
 * H2D and D2H are separate links, IO shares the SSDs' bandwidth. Returns TIDE_OK,
 * TIDE_E_NOMEM, or TIDE_E_INVALID (a malformed instruction, an out-of-range wait,
 * or a wait that can never be met; message on p->ctx). Free the result with
 * tide_sim_result_free. */
tide_status tide_simulate(const tide_plan *p, const tide_hw *hw, tide_sim_result *out);
void tide_sim_result_free(tide_sim_result *r);

/* Perfetto / Chrome trace JSON: one track per stream (instruction slices named
 * "op name" / "load tensor" ...), a counter track "device bytes" of arena bytes
 * in use. `timeline` gives each instruction's start and end (from the simulator
 * or measured by the executor). Written via a temporary file and rename.
 * Returns TIDE_OK, TIDE_E_INVALID (a malformed timeline), TIDE_E_IO or
 * TIDE_E_NOMEM. */
tide_status tide_trace_write(const tide_plan *p, const tide_sim_event *timeline, int n,
                             const char *path);

/* Lower bound (DESIGN section 6) and ideal for a graph on hw at a budget. */
typedef struct tide_bounds {
    double compute_s;             /* sum of op costs */
    double link_s;                /* minimum bytes per link / bandwidth, max over links */
    double lower_bound_s;         /* max(compute_s, link_s) */
    double ideal_s;               /* simulated makespan with an unlimited budget */
} tide_bounds;
tide_status tide_plan_bounds(tide_ctx *ctx, const tide_graph *g, const tide_plan_opts *opts,
                             tide_bounds *out);

#endif
