/*
 * session.h - what a model (runtime/place.c, model.c) and a trainer
 * (train/trainer.c) share about running a graph through plans on one
 * backend: the cost model of resident plans, the resident plan itself, the
 * profile offloaded plans are priced with, and the budget an offloaded run
 * gets (bytes, a fraction of the unconstrained peak, the minimum, or auto).
 * One implementation each; the model and the trainer keep their own state
 * (their offload options, profile and arena) and pass it in.
 */
#ifndef TIDE_SESSION_H
#define TIDE_SESSION_H

#include "backend/backend.h"
#include "planner/planner.h"

/* The cost model of resident plans. They move nothing but inputs and
 * outputs, so any profile gives the same plan but for the timing
 * predictions, which resident runs do not report: a fixed one, no
 * measuring. */
const tide_hw *tide_session_resident_hw(void);

/* The checks of o that a model and a trainer make alike: a fraction in
 * (0, 1], a budget in bytes above 0. TIDE_OK or TIDE_E_INVALID (in ctx). */
tide_status tide_session_check_offload(tide_ctx *ctx, const tide_offload_opts *o);

/* The profile offloaded plans on be are priced with: loaded from hw_path,
 * or (NULL) a quick measurement of this machine (spill directories
 * ssd_dirs); where be multiplies 16-bit weights at the f32 rate (a device
 * in TIDE_MATMUL_F32), their peak is the f32 one. The measurement
 * includes the block types in `blocks` (bit d: tide_dtype d; the model's
 * quantized weight types). TIDE_OK or the load's or the probe's failure (in
 * ctx). */
tide_status tide_session_hw(tide_ctx *ctx, tide_backend *be, const char *hw_path, const char *ssd_dirs,
                            uint32_t blocks, tide_hw *hw);

/* A resident plan of g on be: unconstrained (priced by the resident
 * profile), every op's workspace one shared range, host_addressable where
 * device memory is host memory; with warm_off (per tensor, TIDE_HOME: not
 * warm) the warm region of warm_region bytes at the bottom of the arena.
 * Its device_budget is what it uses (at least the warm region and one
 * alignment unit). TIDE_OK or the planner's failure (in ctx). */
tide_status tide_session_plan_resident(tide_ctx *ctx, const tide_backend *be, const tide_graph *g,
                                       const uint64_t *warm_off, uint64_t warm_region, tide_plan **out);

/* The bytes `--budget auto` may take on be: the device's free memory less
 * the runtime's margin (TIDE_AUTO_MARGIN), unrounded. TIDE_E_UNSUPPORTED
 * where be cannot report its free memory (the CPU backend), TIDE_E_NOMEM
 * when no more than the margin is free, or the backend's failure; the
 * message on be's context. Meant for tide.h, where `tide serve --budget
 * auto` would call it instead of its own copy (src/cli/cmd_serve.c). */
tide_status tide_backend_auto_budget(tide_backend *be, uint64_t *bytes);

/* The smallest budget the caller's policy can plan (TIDE_BUDGET_MIN): its
 * own search, as it tiles and places updates its own way. */
typedef tide_status (*tide_session_min_fn)(void *user, uint64_t *bytes);

/* The device budget of an offloaded run of g under o (kind BYTES, FRACTION
 * of g's unconstrained peak on hw, MIN from min(user), or AUTO: on a device
 * its free memory less the margin, elsewhere 90% of hw's device memory, at
 * most the peak either way), rounded up to 256 bytes unless given in bytes.
 * `what` names g in errors ("run", "step"). TIDE_OK or the failure (in
 * ctx). */
tide_status tide_session_budget(tide_ctx *ctx, tide_backend *be, const tide_offload_opts *o, const tide_hw *hw,
                                const tide_graph *g, const char *what, tide_session_min_fn min, void *user,
                                uint64_t *out);

#endif
