/* fuzz_safetensors: a safetensors file (src/model/st_file.c): open, parse the
 * header, check every tensor entry, as the model loader does. */
#include "fuzz_util.h"
#include "model/st_file.h"
#include "tide.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[512];
    fuzz_write("model.safetensors", data, size, path, sizeof path);
    tide_ctx *ctx = tide_ctx_new();
    tide_st_file f;
    if (tide_st_open(ctx, path, &f) == TIDE_OK) {
        const cJSON *e;
        cJSON_ArrayForEach(e, f.header) {
            if (e->string && strcmp(e->string, "__metadata__") == 0) continue;
            tide_st_tensor t;
            if (tide_st_tensor_read(ctx, path, &f, e, &t) == TIDE_OK) {
                /* touch the tensor's first and last byte: inside the map */
                if (t.nbytes) {
                    volatile unsigned char a = f.map[t.offset], b = f.map[t.offset + t.nbytes - 1];
                    (void)a, (void)b;
                }
            }
        }
        tide_st_close(&f);
    }
    tide_ctx_free(ctx);
    return 0;
}
