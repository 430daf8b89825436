/*
 * plan.h - the plan IR: what the planner produces, the verifier proves, the
 * simulator replays, the executor runs and traces draw (docs/design.md sections 3-5).
 * It is the contract every pipeline stage shares; nothing here plans,
 * checks or runs anything.
 *
 * A plan runs a graph n_iter times. It is a list of instructions; each sits on
 * one stream and streams run their instructions in list order (FIFO). Across
 * streams, an instruction starts only after every instruction in its wait list
 * has completed. Nothing else orders streams.
 *
 * Instructions:
 *   COMPUTE op  place     runs op on the device (place DEVICE, compute stream)
 *                         or on the host CPU (place HOST, host stream). It
 *                         reads every input at dev_off[i] and writes every
 *                         output at dev_off[n_in + j]; operand k is a device
 *                         copy at arena offset dev_off[k], or, when bit k of
 *                         host_opnd is set, a HOST copy: its home (dev_off[k]
 *                         = TIDE_HOME) or a host spill copy at that offset.
 *                         A HOST compute's operands are all host copies; a
 *                         DEVICE compute may have host operands only in a
 *                         plan whose host_addressable is set (the backend's
 *                         device memory is host memory, so it can read and
 *                         write host copies in place). Scratch: a DEVICE
 *                         compute's is in the arena at scratch_off
 *                         (op->scratch_bytes); a HOST compute's is the
 *                         executor's own. An op may be computed more than once
 *                         in an iteration (recomputation): every later compute
 *                         must read the same versions of its inputs as the
 *                         first one and so writes the same versions again.
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
 *   ALL_REDUCE op, REDUCE_SCATTER op, ALL_GATHER op
 *                         a collective of a data-parallel step: runs the
 *                         graph's collective op `op` (graph.h: its kind names
 *                         the instruction's) with the plan's other `ranks` - 1
 *                         ranks on the network stream, reading its input's
 *                         device copy at dev_off[0] and writing its output's
 *                         at dev_off[1] (ALL_REDUCE: the same tensor, in
 *                         place). Operands are device copies (host_opnd 0),
 *                         no scratch. To the ordering rules it is a COMPUTE
 *                         on the network stream: a reader of its output
 *                         waits for it (no read of a reduce-scattered shard
 *                         or an all-gathered parameter before the collective
 *                         completes), and a writer of the bytes it reads or
 *                         writes waits for it (no write to a buffer a pending
 *                         collective reads). The plan is one rank's; every
 *                         rank runs the same plan on its own data.
 *
 * Conventions (the verifier enforces them): op = -1 on every instruction but
 * COMPUTE and tensor = -1 on a COMPUTE; a DEVICE COMPUTE runs on the compute
 * stream and a HOST one on the host stream, LOAD on h2d or io, STORE on d2h or
 * io, MOVE on io, DROP on any; waits name earlier instructions only (list
 * order is then a topological order: no deadlock, and a CUDA event is always
 * recorded before it is waited on). A DROP need not wait for the copy's
 * readers, but whoever reuses its bytes waits on the DROP and on every access
 * of the previous occupant. Homes are never dropped; WEIGHT and INPUT homes
 * are never written.
 *
 * Device memory: one arena of exactly device_budget bytes; every device copy
 * has an offset decided here. Live device ranges are those between the first
 * write of a range (the LOAD or the COMPUTE that produces the tensor) and the
 * completion of its DROP. A tensor not kept resident is DROPped after its
 * last use (or when evicted); at the end of the plan only resident and warm
 * tensors may still have device copies; the homes of resident ones hold the
 * latest version.
 *
 * Warm tensors (warm_off[t] != TIDE_HOME) are kept on the device across runs
 * of plans sharing the arena: a warm tensor's latest version is at arena
 * offset warm_off[t] when the plan starts (put there by an earlier run, or by
 * the caller before the first one) and must be there when it ends; that range
 * is never dropped or reused, and its home is neither read (for a STATE it may
 * be stale) nor updated. The warm region [0, warm_region) is the warm tensors'
 * alone: no other device range of the plan (a copy of a tensor elsewhere than
 * at its warm offset, an op's scratch) overlaps it, whether a warm tensor of
 * this plan covers those bytes or not. Plans sharing an arena keep their warm
 * tensors there, and bytes one plan's graph does not name (the rows of a
 * cache buffer a smaller batch leaves) still hold another's.
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
#ifndef TIDE_IR_PLAN_H
#define TIDE_IR_PLAN_H

#include "graph/graph.h"

typedef enum tide_tier { TIDE_TIER_DEVICE = 0, TIDE_TIER_HOST, TIDE_TIER_SSD, TIDE_TIER_COUNT } tide_tier;
/* The host stream runs HOST computes on the host CPU beside the device's. */
typedef enum tide_stream {
    TIDE_STREAM_COMPUTE = 0, TIDE_STREAM_H2D, TIDE_STREAM_D2H, TIDE_STREAM_IO, TIDE_STREAM_HOST,
    TIDE_STREAM_NET, /* collectives between ranks */
    TIDE_STREAM_COUNT
} tide_stream;
/* Where a COMPUTE runs. */
typedef enum tide_place { TIDE_PLACE_DEVICE = 0, TIDE_PLACE_HOST, TIDE_PLACE_COUNT } tide_place;
typedef enum tide_ins_kind {
    TIDE_INS_COMPUTE = 0, TIDE_INS_LOAD, TIDE_INS_STORE, TIDE_INS_MOVE, TIDE_INS_DROP,
    TIDE_INS_ALL_REDUCE, TIDE_INS_REDUCE_SCATTER, TIDE_INS_ALL_GATHER, TIDE_INS_COUNT
} tide_ins_kind;
/* Whether k is a collective (it names an op, like a COMPUTE). */
static inline bool tide_ins_is_collective(tide_ins_kind k) {
    return k == TIDE_INS_ALL_REDUCE || k == TIDE_INS_REDUCE_SCATTER || k == TIDE_INS_ALL_GATHER;
}
/* Whether an instruction of kind k runs an op (a COMPUTE or a collective). */
static inline bool tide_ins_runs_op(tide_ins_kind k) { return k == TIDE_INS_COMPUTE || tide_ins_is_collective(k); }

const char *tide_tier_name(tide_tier t);
const char *tide_stream_name(tide_stream s);
const char *tide_ins_name(tide_ins_kind k);
const char *tide_place_name(tide_place p);

#define TIDE_INS_MAX_OFF (TIDE_OP_MAX_IN + TIDE_OP_MAX_OUT)

typedef struct tide_ins {
    tide_ins_kind kind;
    tide_stream stream;
    int iter;          /* iteration 0..n_iter-1 */
    int op;            /* COMPUTE, collectives: op index in the graph; else -1 */
    int tensor;        /* LOAD/STORE/MOVE/DROP: tensor index; else -1 */
    tide_place place;  /* COMPUTE: device or host CPU; else DEVICE */
    uint16_t host_opnd;/* COMPUTE: bit k set when operand k (inputs, then outputs)
                          is a host copy (dev_off[k]: TIDE_HOME or a host spill
                          offset); else 0 */
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

/* tide_policy, tide_policy_name and tide_policy_parse: tide.h. */
#define TIDE_POLICY_COUNT (TIDE_POLICY_ZERO_OFFLOAD + 1)
/* The policies before it plan any graph; zero-offload plans training steps
 * only (it places their AdamW updates on the host). */
#define TIDE_POLICY_INFERENCE_COUNT TIDE_POLICY_ZERO_OFFLOAD

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
    uint64_t *warm_off;           /* per tensor: TIDE_HOME, or the arena offset where a warm
                                     tensor lives across runs (see above) */
    uint64_t warm_region;         /* [0, warm_region) holds warm tensors only (0: no region) */
    bool host_addressable;        /* DEVICE computes may use host copies in place */
    int ranks;                    /* data-parallel ranks running this plan, each on its own
                                     data (1: a single device; collectives need >= 2) */
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
/* Whether operand k of COMPUTE in is a host copy. */
static inline bool tide_ins_host_opnd(const tide_ins *in, int k) { return in->host_opnd >> k & 1; }

/* JSON (cJSON). The graph is not serialised: loading needs the same graph (the
 * file records the graph's op and tensor counts and a fingerprint of names and
 * sizes, checked on load: TIDE_E_FORMAT on mismatch or any malformed field). */
tide_status tide_plan_save_json(const tide_plan *p, const char *path);
tide_status tide_plan_load_json(tide_ctx *ctx, const tide_graph *g, const char *path, tide_plan **out);
uint64_t tide_graph_fingerprint(const tide_graph *g);

/* Bytes rounded up to the arena's allocation granule (every device offset and
 * size a planner chooses is a multiple of it). */
#define TIDE_PLAN_ALIGN 4096u
static inline uint64_t tide_plan_align(uint64_t n) {
    return (n + TIDE_PLAN_ALIGN - 1) / TIDE_PLAN_ALIGN * TIDE_PLAN_ALIGN;
}

/* One instruction's start and end in seconds from the start of a run:
 * predicted by the simulator or measured by the executor, drawn by traces
 * (docs/design.md invariant 5: both come in this one format). */
typedef struct tide_sim_event {
    int ins;                      /* instruction index */
    double start_s, end_s;
} tide_sim_event;

#endif
