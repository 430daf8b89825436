/*
 * trainer_int.h - the trainer's internal layout, shared by trainer.c (plans,
 * homes, steps) and train_ckpt.c (saving and resuming).
 */
#ifndef TIDE_TRAINER_INT_H
#define TIDE_TRAINER_INT_H

#include "train/optim_place.h"
#include "backend/backend.h"
#include "planner/planner.h"
#include "probe/probe.h"
#include "runtime/runner.h"
#include "net/comm.h"

/* The home of one persistent training tensor. */
typedef struct train_home {
    void *host;        /* host home, or NULL when on SSD */
    bool pinned;       /* host came from be->vt->host_alloc */
    bool ssd;          /* an extent of the state file */
    uint64_t file_off;
} train_home;

struct tide_trainer {
    tide_ctx *ctx;
    tide_checkpoint *ck;          /* the model (not owned) */
    tide_backend *be;
    tide_llama_config cfg;
    tide_trainer_opts o;
    tide_graph *g;                /* the step graph (the runner has its own copy, same indices) */
    /* how steps run */
    bool offload;
    tide_offload_opts off;
    char *ssd_dirs;
    tide_policy policy;
    tide_hw hw;
    train_optim_mode optim;       /* where the AdamW updates of offloaded steps run */
    bool *host_ops;               /* per op of g, or NULL: the updates placed on the host CPU */
    train_optim_choice optim_choice;
    /* made by the first step */
    tide_runner *run;
    void *arena;
    uint64_t arena_bytes;
    uint64_t *warm;               /* resident on a device: per tensor its arena offset or TIDE_HOME */
    uint64_t warm_bytes;
    double plan_s, predicted_s;
    uint64_t budget;              /* offloaded: the resolved device budget plans are made under */
    int runs;                     /* steps run by this trainer (a resumed state's not counted) */
    bool refit_done;              /* the refit has been decided (train_refit.c) */
    uint64_t peak_device;
    train_home *home;             /* per tensor of g (STATE only) */
    char *state_path;             /* the SSD state file (unlinked once bound) */
    int state_fd;
    uint64_t state_bytes_ssd, state_bytes_host;
    /* inputs and outputs */
    int32_t *pos;
    float hyper[4];
    float grad_scale;             /* the last step's factor of the gradients (hyper[3]) */
    float *loss;                  /* per micro-batch */
    float sumsq;
    int *in_tok, *in_tgt;         /* tensor ids of tokens.M, targets.M */
    int64_t step;                 /* steps taken (with those of a resumed state) */
    bool failed;                  /* a step failed: the state is not consistent */
    /* resuming */
    char *resume_dir;
    void *resume;                 /* train_ckpt.c's open state */
    /* data-parallel ranks (o.step.ranks > 1; tide_trainer_set_comm) */
    tide_comm *comm;
    int rank;
    uint64_t state_bytes_rank;    /* master weights and moments this rank holds */
    /* LoRA (o.step.lora_r > 0; train_lora.c) */
    float *lora_scale;            /* the INPUT lora_scale: (alpha / r) I */
    void *lora_init;              /* the open --lora-init adapter, or NULL */
    void *qlora;                  /* QLoRA: the base's converted weights (train_qlora.c) */
};

/* Data-parallel ranks: whether state tensor i of t->g is this rank's shard
 * of a parameter ("NAME.shard") or of its master or moments (ZeRO 1, 2); the
 * whole parameter's tensor in *whole (may be NULL). */
bool train_is_shard(const tide_trainer *t, int i, int *whole);

/* LoRA (train_lora.c). Whether state tensor i of t->g is an adapter. */
bool train_is_adapter(const tide_trainer *t, int i);
/* Checks the options' adapter (lora_init) against the step and opens it,
 * fills lora_scale. */
tide_status train_lora_open(tide_trainer *t);
void train_lora_close(tide_trainer *t);
/* Adapter i's initial value into buf. */
tide_status train_lora_initial(tide_trainer *t, int i, void *buf);
/* Binds the frozen base WEIGHTs of run to the checkpoint and the scale. */
tide_status train_lora_bind(tide_trainer *t, tide_runner *run);

/* QLoRA (train_qlora.c): the host copies of the frozen weights whose type
 * or row order the step changes (a quantized base); the data of the weight
 * of that name (whole, in the checkpoint's names) or NULL where it is read
 * in place; freed by train_qlora_close (train_lora_close calls it). */
tide_status train_qlora_open(tide_trainer *t);
const void *train_qlora_data(const tide_trainer *t, const char *name, uint64_t *nbytes);
void train_qlora_close(tide_trainer *t);

/* The plan options of an offloaded step under `budget` on t's profile (the
 * caller adds the AdamW placement). */
tide_plan_opts train_offload_opts(const tide_trainer *t, uint64_t budget);
/* Copies the current value of state tensor i of t->g into dst. */
tide_status train_read_tensor(tide_trainer *t, int i, void *dst);
/* The value a resumed state gives state tensor i of t->g, into dst. */
tide_status train_resume_value(tide_trainer *t, int i, void *dst);
/* Looks a resumed state's parameters up again in a rebuilt t->g. */
tide_status train_resume_rebind(tide_trainer *t);
/* Frees what tide_trainer_resume opened. */
void train_resume_close(tide_trainer *t);
/* Saves t's training state at dir atomically (tide_train_save_dir): with
 * lora_config (adapter_config.json's text) a LoRA state, the adapters as
 * adapter_model.safetensors, their moments and the step in
 * optimizer.safetensors, the base's config.json (train_ckpt.c). */
tide_status train_save_state(tide_trainer *t, const char *dir, tide_dtype save_dtype, const char *const *extra,
                             int n_extra, const char *lora_config);
/* Binds the homes of run (a runner of a plan of the step graph) to the
 * trainer's: host homes, the state file's extents (opened by state_path),
 * the inputs and outputs but the batch. TIDE_OK or the binding's failure. */
tide_status train_bind_runner(tide_trainer *t, tide_runner *run, const char *state_path);
/* The runner options of an offloaded or resident step; timed: measure every
 * run's timeline. */
tide_runner_opts train_runner_opts(const tide_trainer *t, bool timed);
/* After the trainer's step that just ran (measured_s: its wall time): on the
 * second step of an offloaded trainer with refits on, refits t->hw from the
 * step's measured timeline when it is off its prediction by more than
 * TIDE_TRAIN_REFIT_MARGIN and replans (train_refit.c); fills the refit
 * fields of *out (may be NULL). The training state is untouched: a new plan
 * is taken only when it homes every tensor where the old one did, and any
 * failure keeps the old plan (replan -1). Returns nothing: a refit is never
 * the step's failure. */
void train_refit_after_step(tide_trainer *t, double measured_s, tide_train_stats *out);

/* The safetensors metadata key of a LoRA state's optimizer.safetensors that
 * names the base it trained on (QLoRA's base type, or "as stored"), and its
 * value for t. */
#define TIDE_LORA_BASE_KEY "tide_lora_base"
const char *train_lora_base_name(const tide_trainer *t);

#endif
