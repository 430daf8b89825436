/* fuzz_chat: a chat template (src/text/chat.c): the input is the
 * chat_template of tokenizer_config.json beside a fixed tokenizer.json
 * (tests/fixtures/chat/chatml's, embedded by fuzz/CMakeLists.txt); the
 * template detected, if any, renders a fixed conversation, with and without
 * its system message. */
#include "fuzz_util.h"
#include "tide.h"

#include <cjson/cJSON.h>

extern const unsigned char fuzz_chat_tokenizer_json[];
extern const unsigned long fuzz_chat_tokenizer_json_len;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char tpath[512], cpath[512];
    fuzz_write("tokenizer.json", fuzz_chat_tokenizer_json, fuzz_chat_tokenizer_json_len, tpath,
               sizeof tpath);
    char *tmpl = malloc(size + 1);
    memcpy(tmpl, data, size);
    tmpl[size] = 0;
    cJSON *cfg = cJSON_CreateObject();
    cJSON_AddStringToObject(cfg, "chat_template", tmpl);
    cJSON_AddStringToObject(cfg, "bos_token", "<s>");
    cJSON_AddStringToObject(cfg, "eos_token", "</s>");
    char *js = cJSON_PrintUnformatted(cfg);
    cJSON_Delete(cfg);
    free(tmpl);
    if (!js) return 0;
    fuzz_write("tokenizer_config.json", (const uint8_t *)js, strlen(js), cpath, sizeof cpath);
    free(js);
    tide_ctx *ctx = tide_ctx_new();
    tide_tokenizer *t = NULL;
    if (tide_tokenizer_open(ctx, tpath, &t) == TIDE_OK) {
        tide_chat_template *c = NULL;
        if (tide_chat_template_get(ctx, t, NULL, &c) == TIDE_OK) {
            (void)tide_chat_template_name(c);
            (void)tide_chat_template_end_of_turn(c);
            static const tide_chat_msg msgs[] = {
                {"system", "You are terse."}, {"user", "Hi {{ there }} <|im_end|>"},
                {"assistant", "Hello.\n"},    {"user", "\xc3\xa9\xe4\xb8\xad and more"}};
            for (int from = 0; from < 2; from++)
                for (int gen = 0; gen < 2; gen++) {
                    char *out = NULL;
                    size_t len = 0;
                    if (tide_chat_format(ctx, c, msgs + from, 4 - from, gen, &out, &len) == TIDE_OK) {
                        if (strlen(out) != len) abort();
                        int32_t ids[16];
                        int n = tide_tokenizer_stop_ids(t, c, ids, 16);
                        (void)n;
                        tide_free_text(out);
                    }
                }
            tide_chat_template_free(c);
        }
        tide_tokenizer_free(t);
    }
    tide_ctx_free(ctx);
    return 0;
}
