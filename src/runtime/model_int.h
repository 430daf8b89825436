/*
 * model_int.h - the model's internal layout, shared by the resident runner
 * (model.c) and the offloaded runner (offload.c).
 */
#ifndef TIDE_MODEL_INT_H
#define TIDE_MODEL_INT_H

#include "backend/backend.h"
#include "exec/executor.h"
#include "planner/planner.h"
#include "runtime/tiling.h"
#include "sim/sim.h"
#include "trace/trace.h"
#include "verify/verify.h"

#include <stdlib.h>
#include <string.h>

typedef struct state_buf {
    char *name;
    void *data;      /* device memory (host memory for host backends); on a
                        device backend NULL until a resident run needs it */
    void *host;      /* the home of offloaded runs when device memory is not host
                        memory (NULL otherwise: data is the home) */
    uint64_t nbytes;
} state_buf;

/* A graph the model runs, with its plan and executor when offloading. */
typedef struct graph_slot {
    tide_graph *g;
    int batch, seq;
    bool all_logits, fresh;
    tide_plan *plan;
    tide_exec *ex;
    tide_sim_event *timeline; /* measured, one per instruction of plan */
    float *logits;            /* host outputs used when the caller gives none: */
    int32_t *next;            /* allocated once with the slot, not per run */
    double predicted_s;
    int tile_level;           /* tiling of g chosen for the budget */
    int min_tile;             /* with --budget min, the tiling the minimum was found
                                 at for this graph (a tide_offload_opts.tile value;
                                 0: none found here), planned again at once */
} graph_slot;

/* What one graph run produces on the host. */
typedef struct run_io {
    const int32_t *tokens, *pos;  /* inputs */
    float *logits;                /* (rows, V) */
    int32_t *next;                /* (rows) */
} run_io;

struct tide_model {
    tide_ctx *ctx;
    tide_checkpoint *ck;
    tide_backend *be;
    tide_llama_config cfg;
    int max_batch, ctx_len;
    state_buf *state;
    int n_state;
    void **weights;        /* device copies when the backend is not host memory */
    int n_weights;
    graph_slot slots[2];   /* the prefill and the decode graph */
    int next_slot;
    uint64_t weight_bytes, state_bytes, peak_bytes;
    void *act;             /* resident runs: inputs, activations and scratch */
    uint64_t act_bytes;
    uint64_t logits_hash;  /* FNV-1a over every logits output, in run order */
    /* offloading (offload.c) */
    bool offload;
    tide_offload_opts off;
    char *off_ssd_dirs;
    tide_policy policy;
    tide_hw hw;
    bool hw_ready;
    uint64_t budget;       /* resolved on the first plan */
    void *arena;           /* one arena of `budget` bytes, lent to every executor */
    graph_slot *last_planned; /* for traces: the slot whose plan ran first (prefill) */
    tide_gen_stats acc;    /* offload counters of the current generation */
    char notice[256];      /* first notice of offloading (memory left unpinned) */
    void **pinned;         /* per checkpoint tensor: its pinned copy, or NULL */
    bool pinned_by_be;     /* the copies come from be->vt->host_alloc */
    uint64_t pinned_bytes;
};

/* Device memory `--budget auto` leaves free for the runtime (cuBLAS
 * workspaces, kernel images, later allocations of the CUDA runtime): the
 * larger of 512 MiB and 1/32 of the device's memory. */
#define TIDE_AUTO_MARGIN(total) TIDE_MAX((uint64_t)512 << 20, (uint64_t)(total) / 32)

/* TIDE_EXEC_SYNC=1: every device call completes before the next is issued,
 * even on a backend with events (slower; for comparison and diagnosis). */
static inline bool tide_model_sync_issue(void) {
    const char *v = getenv("TIDE_EXEC_SYNC");
    return v && *v && strcmp(v, "0") != 0;
}
/* Whether runs on be issue device work ahead (events, TIDE_EXEC_SYNC unset). */
static inline bool tide_async_issue(const tide_backend *be) {
    return tide_backend_has_events(be) && !tide_model_sync_issue();
}

void tide_model_slot_clear(graph_slot *s);
/* Allocates (zeroed) the device copies of the KV cache that are missing. */
tide_status tide_model_device_state(tide_model *m);
/* On a device backend, frees the device KV cache and the uploaded weights:
 * offloaded runs keep both in host memory and use the arena alone. */
void tide_model_release_device(tide_model *m);
void tide_model_offload_release(tide_model *m);
/* Frees the pinned copies of the weights. */
void tide_model_unpin(tide_model *m);
/* Runs s through its plan (made, verified and prepared on first use). */
tide_status tide_model_run_planned(tide_model *m, graph_slot *s, const run_io *io);
/* Device pointer of state tensor `name` ("cache.L.k"), or NULL. */
state_buf *tide_model_state(tide_model *m, const char *name, uint64_t min_bytes);
/* Where graph tensor t's data lives: the checkpoint tensor of a weight (t may
 * be a byte range of it) or the state buffer of a KV cache, with t's offset
 * there. TIDE_OK, or TIDE_E_NOT_FOUND / TIDE_E_FORMAT naming t. */
tide_status tide_model_weight_home(tide_model *m, const tide_graph *g, int t, tide_tensor_info *ti,
                                   uint64_t *off);
/* The checkpoint index of the tensor ti describes, or -1. */
int tide_model_weight_index(const tide_model *m, const tide_tensor_info *ti);
tide_status tide_model_state_home(tide_model *m, const tide_graph *g, int t, state_buf **sb, uint64_t *off);
uint64_t tide_hash_bytes(uint64_t h, const void *data, uint64_t n);

#endif
