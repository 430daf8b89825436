/* fuzz_hw: a hardware profile's JSON (src/cost/hw.c), loaded by path and,
 * when valid, saved again and reloaded (the round trip must hold). */
#include "fuzz_util.h"
#include "cost/cost.h"
#include "tide.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[512], again[512];
    fuzz_write("hw.json", data, size, path, sizeof path);
    tide_ctx *ctx = tide_ctx_new();
    tide_hw hw, hw2;
    memset(&hw, 0, sizeof hw);
    if (tide_hw_load(ctx, path, &hw) == TIDE_OK) {
        snprintf(again, sizeof again, "%s/hw-again.json", fuzz_dir());
        if (tide_hw_save(ctx, &hw, again) != TIDE_OK) abort();
        if (tide_hw_load(ctx, again, &hw2) != TIDE_OK) abort();
    }
    tide_ctx_free(ctx);
    return 0;
}
