/* fuzz_gguf: a GGUF file (src/model/gguf.c): open and check it, then read
 * every metadata value (arrays and nested arrays element by element, every
 * getter) and touch every tensor's first and last byte; then open it as a
 * checkpoint (src/model/gguf_model.c: config from the metadata, names and
 * shapes), as tide run does. */
#include "fuzz_util.h"
#include "model/checkpoint.h"
#include "model/gguf.h"
#include "tide.h"

static volatile unsigned char sink;

static void walk(const tide_gguf_value *v, int depth) {
    int64_t i64;
    double d;
    bool b;
    const char *s;
    uint64_t len, n;
    tide_gguf_type et;
    if (tide_gguf_value_int(v, &i64)) sink ^= (unsigned char)i64;
    if (tide_gguf_value_float(v, &d)) sink ^= (unsigned char)(d != d);
    if (tide_gguf_value_bool(v, &b)) sink ^= (unsigned char)b;
    if (tide_gguf_value_str(v, &s, &len) && len) sink ^= (unsigned char)(s[0] ^ s[len - 1]);
    if (tide_gguf_value_array(v, &n, &et)) {
        tide_gguf_value e;
        for (uint64_t k = 0; k < n && k < 4096; k++)
            if (tide_gguf_value_elem(v, k, &e)) walk(&e, depth + 1);
        if (n && tide_gguf_value_elem(v, n - 1, &e)) walk(&e, depth + 1);
        if (tide_gguf_value_elem(v, n, &e)) abort(); /* past the end must be refused */
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[512];
    fuzz_write("model.gguf", data, size, path, sizeof path);
    tide_ctx *ctx = tide_ctx_new();
    tide_gguf *g = NULL;
    if (tide_gguf_open(ctx, path, &g) == TIDE_OK) {
        for (int64_t i = 0; i < tide_gguf_n_kv(g); i++) {
            const char *key;
            tide_gguf_value v;
            if (!tide_gguf_kv(g, i, &key, &v) || tide_gguf_find_key(g, key) != i) abort();
            walk(&v, 0);
            int64_t i64;
            double d;
            bool b;
            char *s = NULL;
            (void)tide_gguf_get_int(g, key, &i64);
            (void)tide_gguf_get_float(g, key, &d);
            (void)tide_gguf_get_bool(g, key, &b);
            if (tide_gguf_get_str_dup(g, key, &s) == TIDE_OK) tide_free(s);
        }
        for (int64_t i = 0; i < tide_gguf_n_tensors(g); i++) {
            const tide_gguf_tensor *t = tide_gguf_tensor_at(g, i);
            if (tide_gguf_find_tensor(g, t->name) != i) abort();
            if (t->nbytes) {
                const unsigned char *p = tide_gguf_tensor_data(g, t);
                sink ^= p[0] ^ p[t->nbytes - 1];
            }
        }
        tide_gguf_close(g);
    }
    tide_checkpoint *ck = NULL;
    if (tide_checkpoint_open(ctx, path, &ck) == TIDE_OK) {
        for (int i = 0; i < tide_checkpoint_n_tensors(ck); i++) {
            tide_tensor_info ti;
            if (tide_checkpoint_get_index(ck, i, &ti) == TIDE_OK && ti.nbytes)
                sink ^= ((const unsigned char *)ti.data)[0] ^ ((const unsigned char *)ti.data)[ti.nbytes - 1];
        }
        tide_checkpoint_free(ck);
    }
    tide_ctx_free(ctx);
    return 0;
}
