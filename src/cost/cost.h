/*
 * cost.h - hardware profiles and the cost model: what the planner, the
 * simulator and the bounds know of a machine, and the one place that turns an
 * instruction into predicted seconds and the shared resources it holds. The
 * planner's clock, the simulator's replay and the lower bound all price
 * instructions here, so what the planner assumes is what the simulator
 * predicts.
 */
#ifndef TIDE_COST_H
#define TIDE_COST_H

#include "ir/plan.h"

/* A hardware profile: what the cost model and the simulator know of a machine. */
typedef struct tide_hw {
    char name[64];
    char source[64];              /* where the figures come from: "datasheet" (until
                                     probed), "probed", ...; "" when the profile does
                                     not say */
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
    double host_flops;            /* the host CPU's f32 matmul FLOP/s, for computes placed
                                     on it (0: the default, 1e12) */
    double host_mem_bw;           /* the host CPU's memory bandwidth, bytes/s (0: 1e11) */
    double matvec_bw[TIDE_DTYPE_COUNT]; /* by weight dtype: bytes per second (the op's,
                                     tide_op_bytes) a MATMUL of few rows moves when its
                                     weight bounds it, as in a decode step's
                                     matrix-vector products; 0: mem_bw. Measured
                                     through the backend's own kernel, which may widen
                                     16-bit weights as it streams them */
    /* The network between data-parallel ranks (all 0: the profile has none;
     * cost.c, "collectives"): */
    double net_intra_bw;          /* bus bandwidth per GPU inside a node, bytes/s each way */
    double net_intra_latency_s;   /* per ring step inside a node */
    double net_inter_bw;          /* per GPU between nodes, bytes/s each way (0: one node) */
    double net_inter_latency_s;   /* per ring step between nodes */
    int net_gpus_per_node;        /* GPUs sharing the intra-node fabric (0: every rank) */
    double op_scale[TIDE_OP_COUNT]; /* by op kind: a factor on the predicted seconds of
                                     a DEVICE compute of that kind (0: 1). Not part of
                                     profiles on disk: set by a refit from measured
                                     runs (tide_hw_refit, refit.h) */
} tide_hw;

/* Loads a profile by name (data/hw/NAME.json, shipped) or from a path (a name
 * containing '/' or ending in .json). TIDE_E_NOT_FOUND lists the shipped names;
 * TIDE_E_FORMAT names the bad field. */
tide_status tide_hw_load(tide_ctx *ctx, const char *name_or_path, tide_hw *hw);
tide_status tide_hw_save(tide_ctx *ctx, const tide_hw *hw, const char *path);
/* ---------------------------------------------------------------- cost model
 *
 * One function per instruction kind, used by the planner's clock, the
 * simulator and the bounds alike. Every duration is deterministic and
 * monotone in bytes and FLOPs. An instruction holds shared resources for its
 * whole duration (two transfers on one link never overlap: they share its
 * bandwidth, which for the total time is the same as one after the other).
 */

/* Shared resources, as bits of a mask. */
typedef enum tide_res {
    TIDE_RES_COMPUTE = 1u << 0, /* the device's compute engine */
    TIDE_RES_H2D = 1u << 1,     /* host -> device link */
    TIDE_RES_D2H = 1u << 2,     /* device -> host link */
    TIDE_RES_SSD = 1u << 3,     /* the SSDs, reads and writes alike */
    TIDE_RES_HOST = 1u << 4,    /* the host CPU's compute (HOST computes) */
    TIDE_RES_NET = 1u << 5,     /* the network between ranks (collectives) */
} tide_res;
#define TIDE_RES_COUNT 6

/* Bytes per pipelined chunk of an SSD <-> device transfer (the executor's
 * bounce buffer halves: 4 MiB each). */
#define TIDE_COST_CHUNK ((uint64_t)4 << 20)

/* Host rates when a profile does not give them (host_flops, host_mem_bw 0):
 * a server CPU's order of magnitude (tens of cores with wide vectors; several
 * memory channels). */
#define TIDE_HOST_FLOPS_DEFAULT 1e12
#define TIDE_HOST_MEM_BW_DEFAULT 1e11

/* COMPUTE: predicted seconds of op of g on hw (compute-bound or memory-bound,
 * whichever is slower, plus the launch overhead), times op_scale of its kind
 * where that is set, holding TIDE_RES_COMPUTE.
 * MATMUL runs at the peak of its weight dtype times matmul_efficiency, its
 * bytes at the profile's matvec_bw for that dtype (mem_bw when it has none);
 * ATTENTION at the peak of its activation dtype times attention_efficiency
 * (0.5 when the profile has none); GENERIC at the f32 matmul rate; the rest at
 * half the f32 peak. Bytes are those the op moves through device memory. */
double tide_cost_op(const tide_hw *hw, const tide_graph *g, const tide_op *op);
/* COMPUTE placed on the host CPU: as tide_cost_op at the host's rates
 * (host_flops, host_mem_bw; no launch overhead), holding TIDE_RES_HOST. */
double tide_cost_op_host(const tide_hw *hw, const tide_graph *g, const tide_op *op);
/* LOAD of n bytes from tier src (HOST or SSD) to the device. From HOST: the
 * h2d link. From SSD: the SSD read and the h2d copy pipelined through chunks
 * of TIDE_COST_CHUNK bytes: the slower stage for all n bytes plus the faster
 * stage for one chunk (the pipeline's fill), holding the SSDs and the link;
 * where the device's memory is host memory (host_device: a host_addressable
 * plan, the CPU), the drives read straight into it: the SSD read alone,
 * holding the SSDs. *res (may be NULL) receives the resources. */
double tide_cost_load(const tide_hw *hw, tide_tier src, uint64_t n, bool host_device, unsigned *res);
/* STORE of n bytes from the device to tier dst (HOST or SSD): as LOAD, over
 * the d2h link and SSD writes. */
double tide_cost_store(const tide_hw *hw, tide_tier dst, uint64_t n, unsigned *res);
/* MOVE of n bytes between HOST and SSD (dst: where they go): the SSDs. */
double tide_cost_move(const tide_hw *hw, tide_tier dst, uint64_t n, unsigned *res);
/* Any instruction of a plan for g: the function of its kind and placement (a
 * DROP takes no time and holds nothing); host_device: the plan is
 * host_addressable (see tide_cost_load). */
double tide_cost_ins(const tide_hw *hw, const tide_graph *g, const tide_ins *in, bool host_device, unsigned *res);

/* Collectives (cost.c): the seconds of collective op kind `kind` (graph.h)
 * over `ranks` ranks on a tensor of `bytes` bytes (the whole tensor: the
 * reduce-scatter's input, the all-gather's output), ring algorithms, holding
 * TIDE_RES_NET; hierarchical when the ranks span nodes. *intra and *inter
 * (may be NULL) receive the bytes one rank sends over each fabric. */
double tide_cost_collective(const tide_hw *hw, int kind, uint64_t bytes, int ranks, double *intra, double *inter);
/* NULL when hw's network can run collectives over `ranks` ranks, else what it
 * lacks (a sentence naming the field). */
const char *tide_hw_net_missing(const tide_hw *hw, int ranks);

/* One stage of a transfer alone: n bytes over the h2d / d2h link, or read /
 * written by the SSD tier (striped over ssd_count drives): n / bandwidth +
 * latency. */
double tide_hw_h2d_seconds(const tide_hw *hw, uint64_t n);
double tide_hw_d2h_seconds(const tide_hw *hw, uint64_t n);
double tide_hw_ssd_read_seconds(const tide_hw *hw, uint64_t n);
double tide_hw_ssd_write_seconds(const tide_hw *hw, uint64_t n);

#endif
