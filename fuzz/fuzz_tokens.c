/* fuzz_tokens: a training token file (src/train/data.c): the first byte picks
 * the reading (auto/.npy, u16, u32) and the file's name, the rest is the
 * file; every id of an opened file is read back. */
#include "fuzz_util.h"
#include "tide.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    static const char *names[] = {"tokens.npy", "tokens.bin", "tokens.bin"};
    static const tide_token_dtype dts[] = {TIDE_TOKENS_AUTO, TIDE_TOKENS_U16, TIDE_TOKENS_U32};
    int k = data[0] % 3;
    int64_t seq = 1 + (data[0] >> 2) % 8;
    char path[512];
    fuzz_write(names[k], data + 1, size - 1, path, sizeof path);
    tide_ctx *ctx = tide_ctx_new();
    tide_tokens *tk = NULL;
    if (tide_tokens_open(ctx, path, dts[k], 1000, seq, &tk) == TIDE_OK) {
        int64_t n = tide_tokens_count(tk);
        for (int64_t i = 0; i < n; i++) {
            int64_t id = tide_tokens_at(tk, i);
            if (id < 0 || id >= 1000) abort();
        }
        (void)tide_tokens_dtype_name(tk);
        tide_tokens_free(tk);
    }
    tide_ctx_free(ctx);
    return 0;
}
