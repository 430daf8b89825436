/*
 * refit.h - the cost model refitted from a measured run: a plan's measured
 * timeline against the predictions of the profile it was priced with gives
 * one ratio per class of instruction, and a profile whose rates (and, per op
 * kind, op_scale) absorb those ratios (refit.c).
 */
#ifndef TIDE_COST_REFIT_H
#define TIDE_COST_REFIT_H

#include "cost/cost.h"

/* The classes of instructions that are not device computes: each is priced
 * by its own rates. */
typedef enum tide_refit_link {
    TIDE_REFIT_H2D = 0,   /* LOAD from HOST: h2d_bw */
    TIDE_REFIT_D2H,       /* STORE to HOST: d2h_bw */
    TIDE_REFIT_SSD_READ,  /* LOAD from SSD, MOVE to HOST: ssd_read_bw */
    TIDE_REFIT_SSD_WRITE, /* STORE to SSD, MOVE to SSD: ssd_write_bw */
    TIDE_REFIT_HOST,      /* COMPUTE placed on the host: host_flops, host_mem_bw */
    TIDE_REFIT_LINK_COUNT
} tide_refit_link;

const char *tide_refit_link_name(tide_refit_link l);

/* One class over a measured run. */
typedef struct tide_refit_class {
    int n;                /* instructions of the class */
    double measured_s;    /* sum of their measured durations (end - start) */
    double predicted_s;   /* sum of their predicted durations (tide_cost_ins) */
    double ratio;         /* the ratio applied: measured_s / predicted_s, or for a
                             class with too little time of its own the pool's
                             (below); 0: left as it was */
} tide_refit_class;

typedef struct tide_refit {
    tide_refit_class op[TIDE_OP_COUNT];          /* DEVICE computes, by op kind */
    tide_refit_class link[TIDE_REFIT_LINK_COUNT];
    double span_s;        /* the measured run: last end less first start */
    double min_s;         /* the least measured time a class needs to be refitted
                             by its own ratio */
    double pool_ratio;    /* the ratio the classes below min_s take: their summed
                             measured over their summed predicted time where the
                             sum reaches min_s, else the whole run's (every class
                             together); 0 when nothing was measured */
} tide_refit;

/* A class is refitted by its own ratio only when its measured time is at
 * least max(TIDE_REFIT_MIN_S, TIDE_REFIT_MIN_FRACTION * span): below a
 * millisecond or a hundredth of the run, the host clock, thread wake-ups and
 * cache effects are as large as what is measured. The classes below it are
 * pooled: they take the ratio of their summed measured over their summed
 * predicted time (pool_ratio) where that sum reaches the same threshold,
 * else the ratio of the whole run. Leaving them as they were would not do:
 * a profile far off predicts them far off too, and a class measured at a
 * millisecond may be predicted at seconds. */
#define TIDE_REFIT_MIN_S 1e-3
#define TIDE_REFIT_MIN_FRACTION 0.01

/* Refits hw from one measured run of plan p: measured[i] is instruction i's
 * start and end (tide_runner_timeline; one event per instruction, in
 * instruction order), hw the profile p was priced with. Every class with
 * enough measured time (above) and a predicted time > 0 gets the ratio
 * measured / predicted of its summed durations (a class without enough, the
 * pool's), and *out is hw with:
 *   - op_scale[k] of each refitted op kind k multiplied by its ratio
 *     (exact: a device compute's predicted time is linear in op_scale);
 *   - host_flops and host_mem_bw divided by the host class's ratio (exact:
 *     a host compute has no fixed overhead);
 *   - h2d_bw, d2h_bw, ssd_read_bw and ssd_write_bw set so that the class's
 *     bandwidth term absorbs the whole difference, the per-transfer
 *     latencies (shared by both directions) kept: bw * (predicted - L) /
 *     (measured - L), L the class's summed latencies, which makes the
 *     class's predicted sum equal the measured one wherever its transfers
 *     are single stages (the host links; the SSD classes where device
 *     memory is host memory, and MOVEs). Where measured or predicted
 *     time is no more than L, and for a pooled class: bw / ratio. An SSD
 *     <-> device transfer on a device is a two-stage pipeline: scaling the
 *     drives' rate by its ratio corrects it where the drives are its
 *     slower stage, as they usually are.
 * Everything else of hw is copied unchanged, and so are the rates of
 * classes with no instruction in p. Deterministic: the same inputs give the same *out bit for bit.
 * info (may be NULL) receives every class's figures. Returns TIDE_OK, or
 * TIDE_E_INVALID (no timeline, or an event naming another instruction;
 * message on p->ctx). */
tide_status tide_hw_refit(const tide_plan *p, const tide_sim_event *measured, const tide_hw *hw, tide_hw *out,
                          tide_refit *info);

/* As tide_hw_refit over several plans priced with hw, each run runs[j]
 * times (>= 0) and measured once (measured[j], its last run's timeline,
 * stands for each of them): the class sums, the span the threshold is taken
 * of, and the instruction counts the latencies are, are the runs' sums
 * (a request's prefill once and its decode step n times). With n == 1 and
 * runs[0] == 1 it is tide_hw_refit. Returns as tide_hw_refit (a negative
 * count: TIDE_E_INVALID on that plan's ctx). */
tide_status tide_hw_refit_runs(int n, const tide_plan *const *plans, const tide_sim_event *const *measured,
                               const int *runs, const tide_hw *hw, tide_hw *out, tide_refit *info);

/* A copy of hw with every rate (compute, matvec, memory, link, SSD, host)
 * multiplied by f, latencies kept, named "scaled-F": a profile that many
 * times off, for what-if plans and for testing a refit. */
tide_hw tide_hw_scaled(const tide_hw *hw, double f);

#endif
