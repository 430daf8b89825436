/*
 * model_int.h - the model's internal layout. The runtime is cut by what each
 * part owns, and calls go one way:
 *
 *   generate.c  the LLaMA client: graphs by shape, forward, greedy
 *               generation, stats, traces         -> place.c, plain.c, model.c
 *   place.c     the planned engine: a slot's graph and plan (resident or
 *               offloaded), its runner and its homes, the shared arena and
 *               the warm tensors kept in it       -> runner.c, tiling.c, model.c
 *   plain.c     the plain reference engine        -> model.c
 *   model.c     the model's resources: checkpoint, KV cache homes, pinned
 *               and uploaded weight copies, its backend queue, the engine
 *               and offload settings
 *   runner.c    a graph through a verified plan on the executor (knows no
 *               model)
 */
#ifndef TIDE_MODEL_INT_H
#define TIDE_MODEL_INT_H

#include "backend/backend.h"
#include "runtime/model_ext.h"
#include "runtime/runner.h"
#include "runtime/tiling.h"
#include "sim/sim.h"
#include "trace/trace.h"

#include <stdlib.h>
#include <string.h>

/* A KV cache buffer (one layer's k or v for every batch row). */
typedef struct state_buf {
    char *name;      /* "cache.L.k" */
    void *host;      /* its home: host memory, zeroed when made */
    void *dev;       /* the plain engine's device copy on a device backend, or NULL
                        (where device memory is host memory, host is used) */
    uint64_t nbytes;
    bool pinned;     /* host came from the backend's host_alloc (page-locked) */
} state_buf;

/* A named host buffer a run reads (input) or fills (output). */
typedef struct tide_binding {
    const char *name;
    void *data;
} tide_binding;

/* A graph the model runs: its shape and how it runs. */
typedef struct graph_slot {
    int batch, seq;
    bool all_logits, fresh;
    bool row_pos;             /* a position per row (a batch of generations' decode step) */
    int cache_row;            /* the first cache row its batch uses */
    uint64_t used;            /* when it last ran (the model's slot clock): the least
                                 recently used slot goes when a new shape needs one */
    tide_graph *g;            /* the graph (untiled; the runner has its own, maybe tiled) */
    tide_runner *run;         /* the planned engine's, made on first use */
    double predicted_s;       /* simulated makespan of its plan */
    int tile_level;           /* tiling of the runner's graph (0: none) */
    int min_tile;             /* with --budget min, the tiling the minimum was found at
                                 (a tide_offload_opts.tile value; 0: none found here) */
    float *logits;            /* host outputs used when the caller gives none: */
    int32_t *next;            /* allocated once with the slot, not per run */
    int gen_runs;             /* offloaded runs in the current generation (its runner's
                                 timeline is the last one's) */
} graph_slot;

#define MODEL_SLOTS TIDE_MODEL_GEN_PLANS /* the prefill, the decode step and a batch's decode step */
/* The most decode steps a warm region is chosen for after a prompt: beyond
 * them the steps alone decide, and the prompt would not count */
#define MODEL_WARM_DECODE_STEPS 32

struct tide_model {
    tide_ctx *ctx;
    tide_checkpoint *ck;
    tide_backend *be;
    void *q;                  /* the model's synchronous queue on be, its errors on ctx
                                 (tide_model_queue; NULL: not made yet, or be has none) */
    tide_llama_config cfg;
    int max_batch, ctx_len;
    tide_dtype cache_dtype;    /* the KV cache's type (tide_model_opts.cache_dtype) */
    bool sync_issue;
    state_buf *state;
    int n_state;
    int n_weights;            /* checkpoint tensors */
    uint64_t weight_bytes, state_bytes, peak_bytes;
    /* the plain engine's device copies (device backends only) */
    void **dev_weights;
    void *act;                /* inputs, activations and scratch of its runs */
    uint64_t act_bytes;
    /* how graphs run */
    tide_engine engine;
    bool offload;             /* offloaded under off (else resident) */
    tide_offload_opts off;
    char *off_ssd_dirs;
    tide_policy policy;
    tide_hw hw;               /* the cost model of offloaded plans */
    bool hw_probed;           /* hw was measured here (no profile given): runs may refit it */
    /* the planned engine's arena, lent to every runner */
    void *arena;
    uint64_t arena_bytes;     /* offloaded: the budget; resident: the largest plan's need */
    uint64_t budget;          /* offloaded: resolved on the first plan; 0 before */
    uint64_t *warm_w;         /* per checkpoint tensor its arena offset, TIDE_HOME when not */
                              /* warm (offloaded: some weights only); NULL: nothing warm */
    uint64_t *warm_s;         /* per cache buffer likewise (NULL when offloaded: the cache
                                 stays homed in host memory) */
    uint64_t warm_bytes;      /* the warm region [0, warm_bytes) */
    bool warm_loaded;         /* the arena holds the warm tensors */
    bool warm_chosen;         /* offloaded: the warm weights are chosen (place.c choose_warm) */
    int warm_decode;          /* the decode steps choose_warm prices after a prompt: the
                                 generation that plans it, its max_new - 1 up to
                                 MODEL_WARM_DECODE_STEPS (-1: that many; set by
                                 tide_model_generate_ex) */
    /* pinned host copies of the weights (offloaded runs) */
    void **pinned;            /* per checkpoint tensor, or NULL */
    bool pinned_by_be;        /* the copies come from be->vt->host_alloc */
    uint64_t pinned_bytes;
    graph_slot slots[MODEL_SLOTS];
    uint64_t slot_clock;
    graph_slot *last_planned; /* for traces: the first offloaded graph run (the prefill) */
    tide_gen_stats acc;       /* counters of the current generation */
    uint64_t logits_hash;     /* FNV-1a over every logits output, in run order */
    float *lora_scale;        /* with a LoRA adapter (cfg.lora_r > 0): the graphs' INPUT
                                 "lora_scale", (r, r) = (alpha / r) I; else NULL */
    char notice[256];         /* the first notice of the planned engine */
    char state_notice[224];   /* the KV cache's, from its allocation ("" when none) */
};


/* ---------------------------------------------------------------- model.c: resources */

uint64_t tide_hash_bytes(uint64_t h, const void *data, uint64_t n);
/* The checkpoint tensor behind graph weight t, and t's byte offset in it (a
 * block of a split weight is a byte range of its checkpoint tensor). TIDE_OK,
 * or TIDE_E_NOT_FOUND / TIDE_E_FORMAT naming t. */
tide_status tide_model_weight_home(tide_model *m, const tide_graph *g, int t, tide_tensor_info *ti,
                                   uint64_t *off);
/* The checkpoint index of the tensor ti describes, or -1. */
int tide_model_weight_index(const tide_model *m, const tide_tensor_info *ti);
/* The cache buffer behind graph state t, and t's byte offset in it. */
tide_status tide_model_state_home(tide_model *m, const tide_graph *g, int t, state_buf **sb, uint64_t *off);
/* The host home of weight ti at offset off: its pinned copy when it has one,
 * else the memory-mapped checkpoint. */
void *tide_model_weight_host(tide_model *m, const tide_tensor_info *ti, uint64_t off);
/* The queue the model's own backend calls go on (uploads, the plain
 * engine's copies and synchronous computes): synchronous, made on m->ctx on
 * first use, so their failures name their cause on the model's context
 * rather than on be->ctx, which other models of the backend share. *q is
 * NULL (the default queue) where be has no queues. TIDE_OK, or queue_new's
 * failure (on m->ctx). */
tide_status tide_model_queue(tide_model *m, void **q);
/* Records on m->ctx the failure st of a backend call on q ("what: cause"),
 * the cause read where the call put it: q's context, be->ctx for the default
 * queue and for calls that take no queue (alloc). Returns st. */
tide_status tide_model_be_fail(tide_model *m, void *q, tide_status st, const char *what);
/* Frees every slot's graph and runner (their plans are made again on next use). */
void tide_model_clear_slots(tide_model *m);
void tide_model_slot_clear(graph_slot *s);

/* ---------------------------------------------------------------- plain.c: the reference */

/* Runs g once with the plain engine: weights and cache where the model keeps
 * them for it, every other tensor in one buffer laid out in op order; the
 * inputs bound by name are copied in, the outputs bound by name copied out.
 * Returns TIDE_OK or the failing step's status. */
tide_status tide_plain_run(tide_model *m, const tide_graph *g, const tide_binding *in, int n_in,
                           const tide_binding *out, int n_out);
/* Frees the plain engine's device copies (weights, cache, activations). */
void tide_plain_release(tide_model *m);

/* ---------------------------------------------------------------- place.c: the planned engine */

/* Runs slot s once through its plan (graph, plan and runner made on first
 * use: resident or offloaded as the model is set), its inputs and outputs
 * bound by name. Counts the run into m->acc. */
tide_status tide_planned_run(tide_model *m, graph_slot *s, const tide_binding *io, int n_io);
/* Frees the arena and forgets the warm tensors and the resolved budget. */
void tide_planned_release(tide_model *m);
/* The plan and measured timeline of the last offloaded prefill, for traces
 * and benchmarks: TIDE_OK, or TIDE_E_INVALID when there is none (the message
 * says what is missing). */
tide_status tide_model_last_run(const tide_model *m, const tide_plan **plan, const tide_sim_event **timeline);
/* tide_model_gen_runs, tide_model_hw, tide_model_set_hw: model_ext.h */

/* ---------------------------------------------------------------- generate.c */

/* Checks the arguments of a generation against m as tide_model_generate_ex
 * does (the options' size, prompt, lengths against the cache, token ids, stop
 * ids), recording the reason on ctx (m's own when NULL). Reads only what
 * tide_model_new fixed: safe beside m's runs when ctx is not m's (the pool
 * checks a request on its caller's context before it joins a batch).
 * TIDE_OK, TIDE_E_INVALID or TIDE_E_RANGE. */
tide_status tide_model_check_generate(const tide_model *m, tide_ctx *ctx, const int32_t *prompt, int n_prompt,
                                      int max_new, const tide_gen_opts *o, const int32_t *out_tokens);

#endif
