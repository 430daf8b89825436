/*
 * fuzz_tok.h - what the tokenizer targets (fuzz_tokenizer.c, fuzz_tok_gguf.c)
 * do with a tokenizer once the input opened as one: a fixed sentence with the
 * input's last bytes encoded in both special-token modes and decoded, ids
 * taken from the input's bytes decoded and looked up, the chat template read.
 */
#ifndef TIDE_FUZZ_TOK_H
#define TIDE_FUZZ_TOK_H

#include "fuzz_util.h"
#include "tide.h"

static void encode_decode(tide_tokenizer *t, const char *text, size_t len, unsigned flags) {
    size_t n = 0;
    if (tide_tokenizer_encode(t, text, len, flags, NULL, 0, &n) != TIDE_OK) return;
    int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    size_t n2 = 0;
    if (tide_tokenizer_encode(t, text, len, flags, ids, n, &n2) != TIDE_OK || n2 != n) abort();
    size_t tl = 0;
    char small[8];
    if (tide_tokenizer_decode(t, ids, n, 0, small, sizeof small, &tl) == TIDE_OK) {
        char *buf = malloc(tl + 1);
        size_t tl2 = 0;
        if (tide_tokenizer_decode(t, ids, n, TIDE_DECODE_SKIP_SPECIAL, buf, tl + 1, &tl2) != TIDE_OK) abort();
        free(buf);
    }
    free(ids);
}

/* Writes the input to fuzz_dir()/name, opens it as a tokenizer and runs it. */
static int fuzz_tokenizer_file(const char *name, const uint8_t *data, size_t size) {
    char path[512];
    fuzz_write(name, data, size, path, sizeof path);
    tide_ctx *ctx = tide_ctx_new();
    tide_tokenizer *t = NULL;
    if (tide_tokenizer_open(ctx, path, &t) == TIDE_OK) {
        static const char fixed[] = "Hello world, it's 2026!  \t\n\xc3\xa9t\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87 <s> </s> 12345";
        size_t tail = size < 48 ? size : 48;
        size_t len = sizeof fixed - 1 + tail;
        char *text = malloc(len);
        memcpy(text, fixed, sizeof fixed - 1);
        if (tail) memcpy(text + sizeof fixed - 1, data + size - tail, tail);
        encode_decode(t, text, len, TIDE_TOKENIZE_ADD_SPECIAL);
        encode_decode(t, text, len, TIDE_TOKENIZE_SPECIAL_AS_TEXT);
        free(text);
        int32_t nv = tide_tokenizer_n_vocab(t);
        if (nv > 0) {
            int32_t ids[32];
            size_t n = 0;
            for (size_t i = 0; i < size && n < 32; i += 2) ids[n++] = (int32_t)(data[i] | data[i + 1 < size ? i + 1 : i] << 8) % nv;
            char buf[256];
            size_t tl = 0;
            tide_tokenizer_decode(t, ids, n, 0, buf, sizeof buf, &tl);
            for (size_t i = 0; i < n; i++) (void)tide_tokenizer_piece(t, ids[i]);
        }
        (void)tide_tokenizer_find(t, "<s>");
        (void)tide_tokenizer_chat_template(t);
        tide_tokenizer_free(t);
    }
    tide_ctx_free(ctx);
    return 0;
}

#endif
