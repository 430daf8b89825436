/*
 * model_ext.h - what the library's own clients of a model (the pool,
 * src/serve/pool*.c) may ask of it beyond tide.h: the profile its offloaded
 * plans are priced with, read and replaced (a refit of the cost model), and
 * what its last generation ran offloaded, measured. A narrow door: the
 * model's layout (model_int.h) stays the runtime's.
 */
#ifndef TIDE_RUNTIME_MODEL_EXT_H
#define TIDE_RUNTIME_MODEL_EXT_H

#include "ir/plan.h"
#include "sim/sim.h"
#include "tide.h"

/* The most plans one generation runs (tide_model_gen_runs' arrays): the
 * prefill, the decode step and a batch's decode step. */
#define TIDE_MODEL_GEN_PLANS 3

/* What the last tide_model_generate_ex ran offloaded, for a refit of the
 * cost model (cost/refit.h): per plan run, the plan, the measured timeline
 * of its last run and how many times it ran, into the arrays
 * (TIDE_MODEL_GEN_PLANS each). Returns how many plans; 0 when none ran
 * offloaded or one of them was not measured (on a GPU without
 * tide_offload_opts.timeline). The pointers are valid until the model's
 * next run or setting. */
int tide_model_gen_runs(const tide_model *m, const tide_plan **plans, const tide_sim_event **timelines, int *runs);
/* The profile the model's offloaded plans are priced and planned with
 * (loaded by tide_model_set_offload, or set below); valid while m lives and
 * until its next setting. */
const tide_hw *tide_model_hw(const tide_model *m);
/* Replaces that profile (a refit of it): the plans are made again on next
 * use (the arena, the budget and the cache kept). Until the next
 * tide_model_set_offload, which loads the profile it is given. TIDE_OK, or
 * TIDE_E_INVALID when the model is not offloading. */
tide_status tide_model_set_hw(tide_model *m, const tide_hw *hw);

/* A generation request checked as tide_model_generate would check it
 * (declared with its full comment in src/runtime/model_int.h): the pool checks
 * a request on its caller's context before it joins a batch. */
tide_status tide_model_check_generate(const tide_model *m, tide_ctx *ctx, const int32_t *prompt, int n_prompt,
                                      int max_new, const tide_gen_opts *o, const int32_t *out_tokens);

#endif
