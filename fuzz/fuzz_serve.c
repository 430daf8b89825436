/* fuzz_serve: `tide serve`'s request parser (src/cli/serve/http_json.c) on
 * arbitrary bytes, for both endpoints (the first byte picks it), and, for a
 * request it accepts, the answer and stream chunk writers, whose output must
 * be JSON. The server is a minimal one: two model names, no pool. */
#include "fuzz_util.h"
#include "cli/serve/http_int.h"

#include <cjson/cJSON.h>

static void check_json(char *s) {
    if (!s) return; /* out of memory */
    cJSON *j = cJSON_Parse(s);
    if (!j) abort();
    cJSON_Delete(j);
    free(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    static serve_model models[2] = {{.name = "tiny", .dir = "/nonexistent"}, {.name = "m\xc3\xa9", .dir = "/nonexistent"}};
    static serve_server s;
    s.models = models;
    s.n_models = 2;
    bool chat = data[0] & 1;
    serve_request r;
    serve_error e;
    memset(&e, 0, sizeof e);
    if (serve_parse_request(&s, (const char *)data + 1, size - 1, chat, &r, &e) == 0) {
        const char *text = r.chat ? (r.n_msgs ? r.msgs[0].content : "") : r.prompt;
        check_json(serve_answer_json(&r, "cmpl-1", 1700000000, text ? text : "", "stop", 3, 4));
        check_json(serve_chunk_json(&r, "cmpl-1", 1700000000, text ? text : "", NULL, true));
        check_json(serve_chunk_json(&r, "cmpl-1", 1700000000, NULL, "length", false));
        check_json(serve_usage_chunk_json(&r, "cmpl-1", 1700000000, 3, 4));
    } else {
        if (e.status < 400 || e.status > 599 || !e.type) abort();
        check_json(serve_error_json(&e));
    }
    /* on failure too, as src/cli/serve/http.c does: what was parsed so far */
    serve_request_free(&r);
    return 0;
}
