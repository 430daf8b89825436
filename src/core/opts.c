/*
 * opts.c - the option structs' defaults (tide_*_opts_default, as llama.cpp's
 * llama_model_default_params: a filled struct the caller edits) and the
 * check of their size field (tide_opts_size).
 *
 * ABI rule: a struct passed by pointer across the library boundary opens with
 * `size_t size`. A caller compiled against another tide.h passes its own
 * sizeof, which this library refuses unless it equals its own (a later
 * version may learn to read older sizes); 0, a zero-initialised struct, is
 * read as this version's, so that `tide_model_opts o = {0}` keeps working.
 * Every default here equals what a zero field means, so a zeroed struct and
 * a defaulted one behave the same wherever zero has a meaning.
 */
#include "core/core.h"

tide_status tide_opts_size(tide_ctx *ctx, const char *type, size_t got, size_t want) {
    if (got == 0 || got == want) return TIDE_OK;
    return tide_err(ctx, TIDE_E_INVALID,
                    "%s.size is %zu, this library's %s is %zu bytes (built against another version of tide.h? "
                    "fill it with %s_default(), or zero it)",
                    type, got, type, want, type);
}

tide_model_opts tide_model_opts_default(void) {
    return (tide_model_opts){.size = sizeof(tide_model_opts), .max_batch = 1, .ctx_len = 0, .sync_issue = false};
}

tide_offload_opts tide_offload_opts_default(void) {
    return (tide_offload_opts){.size = sizeof(tide_offload_opts), .budget_kind = TIDE_BUDGET_NONE,
                               .tile = TIDE_TILE_AUTO, .pin_weights = 0};
}

tide_gen_opts tide_gen_opts_default(void) { return (tide_gen_opts){.size = sizeof(tide_gen_opts)}; }

tide_sampler_opts tide_sampler_opts_default(void) {
    return (tide_sampler_opts){.size = sizeof(tide_sampler_opts), .temperature = 0, .top_k = 0, .top_p = 0,
                               .min_p = 0, .repetition_penalty = 0, .seed = 0};
}

tide_pool_opts tide_pool_opts_default(void) {
    return (tide_pool_opts){.size = sizeof(tide_pool_opts), .policy = TIDE_POOL_TIDE};
}

tide_trainer_opts tide_trainer_opts_default(void) {
    return (tide_trainer_opts){
        .size = sizeof(tide_trainer_opts),
        .step = {.batch = 4, .seq = 256, .accum = 1, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                 .weight_decay = 0.1f, .grad_clip = 1.0f},
        .lr = 3e-4,
        .total_steps = 100,
    };
}
