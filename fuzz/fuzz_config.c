/* fuzz_config: a model's config.json (src/model/config.c), loaded and
 * checked as `tide run` does. */
#include "fuzz_util.h"
#include "tide.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[512];
    fuzz_write("config.json", data, size, path, sizeof path);
    tide_ctx *ctx = tide_ctx_new();
    tide_llama_config cfg;
    if (tide_llama_config_load(ctx, path, &cfg) == TIDE_OK) {
        tide_llama_config_check(ctx, &cfg);
        (void)tide_llama_config_params(&cfg);
    }
    tide_ctx_free(ctx);
    return 0;
}
