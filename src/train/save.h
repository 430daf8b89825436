/*
 * save.h - training checkpoints: a streaming safetensors writer, the atomic
 * save of a whole checkpoint directory, and reading its optimizer state back
 * to resume.
 *
 * A training checkpoint is a Hugging Face model directory that
 * tide_checkpoint_open (and transformers) can load, plus the optimizer:
 *   config.json            the model's config; torch_dtype = the saved dtype
 *   model.safetensors      every trained parameter under its HF name, in the
 *                          model's dtype or f32; metadata {"format": "pt"}
 *   optimizer.safetensors  per parameter "master.<name>", "exp_avg.<name>",
 *                          "exp_avg_sq.<name>", all f32 and of the parameter's
 *                          shape: the f32 master weights (for an f32
 *                          parameter, the parameter itself) and AdamW's two
 *                          moments; metadata: format "tide-train-1", step,
 *                          tokens_seen, the batch spec and data order, the
 *                          optimizer's hyperparameters, config_fingerprint,
 *                          and any extra pairs the caller adds.
 * Resuming needs config.json and optimizer.safetensors only: a parameter is
 * its master rounded to the model's dtype.
 *
 * Every file is written with its data section on a 4096-byte boundary (the
 * header padded with spaces, as tide_checkpoint_make_synthetic does) and
 * tensors packed in the order given.
 */
#ifndef TIDE_TRAIN_SAVE_H
#define TIDE_TRAIN_SAVE_H

#include "core/core.h"
#include "model/st_file.h" /* the safetensors writer */

#include <stdbool.h>
#include <stdint.h>

/* ---------------------------------------------------------------- safetensors */

/* dst[i] = src[i] rounded to dt (f32: copied; f16, bf16: nearest even, NaN
 * kept NaN), for n elements. dt must be f32, f16 or bf16. */
void tide_convert_from_f32(const float *src, tide_dtype dt, void *dst, size_t n);

/* ---------------------------------------------------------------- training checkpoints */

#define TIDE_TRAIN_FORMAT "tide-train-1"

/* A trained parameter: its HF name and shape. */
typedef struct tide_train_param {
    const char *name;
    int ndim;
    int64_t shape[TIDE_MAX_DIMS];
} tide_train_param;

/* What the fill of a training checkpoint is asked for. */
typedef enum tide_train_part {
    TIDE_PART_MODEL = 0,  /* the parameter, in model.safetensors' dtype */
    TIDE_PART_MASTER,     /* its f32 master weights */
    TIDE_PART_EXP_AVG,    /* AdamW's first moment, f32 */
    TIDE_PART_EXP_AVG_SQ, /* AdamW's second moment, f32 */
    TIDE_PART_COUNT
} tide_train_part;

/* Produces elements [elem0, elem0 + n) of part `part` of parameter `param`,
 * of dtype dt (the model dtype for TIDE_PART_MODEL, else f32), at dst. Same
 * contract as tide_st_fill_fn: the files are written one after the other
 * (model, then optimizer with each parameter's master, exp_avg, exp_avg_sq
 * together), each tensor in increasing chunks. */
typedef tide_status (*tide_train_fill_fn)(void *user, tide_train_part part, int param, tide_dtype dt,
                                          uint64_t elem0, uint64_t n, void *dst);

/* The run's position and settings, stored as optimizer.safetensors'
 * metadata and returned on resume. */
typedef struct tide_train_meta {
    int64_t step;         /* optimizer steps done; the run continues with this step */
    int64_t tokens_seen;  /* tokens those steps consumed */
    int batch, seq, accum;  /* the batch spec (data.h) */
    bool shuffle;           /* data order */
    uint64_t seed;
    float lr, beta1, beta2, adam_eps, weight_decay, max_norm; /* AdamW */
} tide_train_meta;

typedef struct tide_train_save {
    const tide_llama_config *cfg; /* the model trained */
    tide_dtype model_dtype;       /* model.safetensors' dtype: cfg->dtype, or f32 */
    const tide_train_param *params;
    int n_params;
    tide_train_fill_fn fill;
    void *user;
    tide_train_meta meta;
    const tide_st_meta *extra; /* more metadata for optimizer.safetensors; keys */
    int n_extra;               /* other than the standard ones */
    /* A LoRA training state (non-NULL): the parameters are the adapters,
     * written to adapter_model.safetensors (PEFT's file: their names, f32)
     * instead of model.safetensors, beside this text as adapter_config.json;
     * config.json is then the base's, in its own dtype. */
    const char *lora_config;
} tide_train_save;

/* Saves a training checkpoint at dir, atomically: dir afterwards holds either
 * what it held before or the whole new checkpoint.
 *
 * The checkpoint is built in the sibling "<dir>.tmp-<pid>-<n>" (created 0755;
 * missing parents of dir are created), every file and the directory fsynced,
 * then published: renamed to dir when dir does not exist, else exchanged with
 * it (renameat2 RENAME_EXCHANGE; where the file system lacks it, dir is moved
 * aside first) and the old checkpoint, now at the temporary name, removed; the
 * parent is fsynced last. Any failure before publication removes the temporary
 * directory and leaves dir untouched.
 *
 * An existing dir is replaced only when it holds nothing but a checkpoint's
 * files (config.json, model.safetensors, optimizer.safetensors,
 * adapter_model.safetensors, adapter_config.json, and the
 * temporaries of a crashed write of those): a directory with anything else in
 * it is refused, never deleted. Siblings "<dir>.tmp-<pid>-<n>" left by a save
 * that crashed (pid not running) or by an earlier save of this process, and
 * holding only such files, are removed. One save at a time per dir.
 *
 * Returns TIDE_OK; TIDE_E_INVALID (dir empty, "." or "..", a symbolic link,
 * not a directory, or a directory of other files; bad params, meta or dtype);
 * TIDE_E_IO naming the path and the system's cause (parent not a directory or
 * not writable, ENOSPC, EFBIG, EIO); the fill's status; TIDE_E_NOMEM. */
tide_status tide_train_save_dir(tide_ctx *ctx, const char *dir, const tide_train_save *s);

/* A fingerprint of the fields of cfg that define the model's function and
 * parameters (sizes, heads, vocab, eps, rope_theta, tied embeddings; not the
 * name, dtype or max_position_embeddings). */
uint64_t tide_train_config_fingerprint(const tide_llama_config *cfg);

/* ---------------------------------------------------------------- resuming */

typedef struct tide_train_resume tide_train_resume;

/* Opens the optimizer state of the checkpoint at dir for resuming the
 * training of cfg's model with these parameters. Checks that config.json
 * describes the same model as cfg (the fingerprint's fields), that
 * optimizer.safetensors is format TIDE_TRAIN_FORMAT of that config, that its
 * metadata is complete, and that it holds exactly the three f32 tensors of
 * every parameter, each of the parameter's shape. Returns TIDE_OK with *out
 * set, or, with *out NULL and a message naming the directory or file, the
 * tensor or field, and the mismatch: TIDE_E_NOT_FOUND (no dir, config.json or
 * optimizer.safetensors; a missing tensor), TIDE_E_FORMAT (malformed file,
 * other format, a config or tensor that differs, an extra tensor), TIDE_E_IO,
 * TIDE_E_INVALID, TIDE_E_NOMEM. */
tide_status tide_train_resume_open(tide_ctx *ctx, const char *dir, const tide_llama_config *cfg,
                                   const tide_train_param *params, int n_params, tide_train_resume **out);
void tide_train_resume_free(tide_train_resume *r);
/* The saved position and settings. */
const tide_train_meta *tide_train_resume_meta(const tide_train_resume *r);
/* A metadata value of optimizer.safetensors (standard or extra), or NULL. */
const char *tide_train_resume_get(const tide_train_resume *r, const char *key);
/* Part (MASTER, EXP_AVG or EXP_AVG_SQ) of parameter param: numel f32 values,
 * mapped read-only, valid until tide_train_resume_free; NULL for a bad index
 * or part. *file_offset (may be NULL) gets its offset in the file named by
 * tide_train_resume_path, for direct reads. */
const float *tide_train_resume_tensor(const tide_train_resume *r, tide_train_part part, int param,
                                      uint64_t *file_offset);
/* The optimizer file's path. */
const char *tide_train_resume_path(const tide_train_resume *r);

#endif
