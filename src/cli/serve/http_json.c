/*
 * http_json.c - `tide serve`'s JSON: requests of /v1/completions and
 * /v1/chat/completions read and checked field by field (a field of the wrong
 * type or out of its range is a 400 naming it), and the answers, stream
 * events, model list and errors written in OpenAI's shapes.
 *
 * Fields read: model, prompt (completions: a string, or an array of one
 * string), messages (chat: roles system, user, assistant; content a string
 * or an array of text parts), max_tokens (max_completion_tokens),
 * temperature, top_p, top_k, min_p, seed, stop (a string or an array of up
 * to CLI_MAX_STOPS), frequency_penalty, presence_penalty,
 * repetition_penalty (repeat_penalty), stream, stream_options
 * (include_usage), n and best_of (1 only).
 * echo, logprobs, top_logprobs, suffix, tools and functions, when asked for,
 * are refused (400); other fields are ignored (user, logit_bias, ...), as
 * OpenAI's clients send fields a server may not know.
 */
#include "cli/serve/http_int.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int serve_fail(serve_error *e, int status, const char *type, const char *fmt, ...) {
    e->status = status;
    e->type = type;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return -1;
}

static int bad(serve_error *e, const char *fmt, const char *field) {
    return serve_fail(e, 400, "invalid_request_error", fmt, field);
}

/* The field `name` of o, NULL when absent or null. */
static const cJSON *field(const cJSON *o, const char *name) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, name);
    return f && !cJSON_IsNull(f) ? f : NULL;
}

/* A number field in [lo, hi] (integral when `integer`): 1 present, 0
 * absent, -1 wrong (*e filled). */
static int number(const cJSON *o, const char *name, double lo, double hi, bool integer, double *out, serve_error *e) {
    const cJSON *f = field(o, name);
    if (!f) return 0;
    if (!cJSON_IsNumber(f)) return bad(e, "'%s' must be a number", name);
    double v = f->valuedouble;
    if (!isfinite(v) || v < lo || v > hi || (integer && v != floor(v)))
        return serve_fail(e, 400, "invalid_request_error", "'%s' must be %s from %g to %g (got %g)", name,
                          integer ? "an integer" : "a number", lo, hi, v);
    *out = v;
    return 1;
}

static int parse_stops(const cJSON *o, serve_request *r, serve_error *e) {
    const cJSON *f = field(o, "stop");
    if (!f) return 0;
    if (cJSON_IsString(f)) {
        if (!f->valuestring[0]) return bad(e, "'%s' must not be empty", "stop");
        return (r->stops[r->n_stops++] = strdup(f->valuestring)) ? 0 : serve_fail(e, 500, "server_error", "out of memory");
    }
    if (!cJSON_IsArray(f)) return bad(e, "'%s' must be a string or an array of strings", "stop");
    if (cJSON_GetArraySize(f) > CLI_MAX_STOPS)
        return serve_fail(e, 400, "invalid_request_error", "'stop' holds at most %d strings", CLI_MAX_STOPS);
    const cJSON *it;
    cJSON_ArrayForEach(it, f) {
        if (!cJSON_IsString(it) || !it->valuestring[0]) return bad(e, "'%s' must hold non-empty strings", "stop");
        if (!(r->stops[r->n_stops++] = strdup(it->valuestring))) return serve_fail(e, 500, "server_error", "out of memory");
    }
    return 0;
}

/* A message's content: a string, or an array of {"type":"text","text":...}
 * parts (joined). malloc'd into *out. */
static int parse_content(const cJSON *c, int i, char **out, serve_error *e) {
    if (cJSON_IsString(c)) {
        *out = strdup(c->valuestring);
        return *out ? 0 : serve_fail(e, 500, "server_error", "out of memory");
    }
    if (!cJSON_IsArray(c))
        return serve_fail(e, 400, "invalid_request_error", "'messages[%d].content' must be a string or an array of "
                          "text parts", i);
    size_t len = 0;
    const cJSON *p;
    cJSON_ArrayForEach(p, c) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(p, "text");
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(p, "type");
        if (!cJSON_IsString(ty) || strcmp(ty->valuestring, "text") || !cJSON_IsString(t))
            return serve_fail(e, 400, "invalid_request_error", "'messages[%d].content' parts must be "
                              "{\"type\": \"text\", \"text\": STRING} (only text is supported)", i);
        len += strlen(t->valuestring);
    }
    char *s = malloc(len + 1);
    if (!s) return serve_fail(e, 500, "server_error", "out of memory");
    s[0] = '\0';
    cJSON_ArrayForEach(p, c) strcat(s, cJSON_GetObjectItemCaseSensitive(p, "text")->valuestring);
    *out = s;
    return 0;
}

static int parse_messages(const cJSON *o, serve_request *r, serve_error *e) {
    const cJSON *f = field(o, "messages");
    if (!f) return bad(e, "'%s' is required", "messages");
    if (!cJSON_IsArray(f) || cJSON_GetArraySize(f) == 0) return bad(e, "'%s' must be a non-empty array", "messages");
    int n = cJSON_GetArraySize(f);
    if (!(r->msgs = calloc((size_t)n, sizeof *r->msgs))) return serve_fail(e, 500, "server_error", "out of memory");
    const cJSON *m;
    int i = 0;
    cJSON_ArrayForEach(m, f) {
        const cJSON *role = cJSON_IsObject(m) ? cJSON_GetObjectItemCaseSensitive(m, "role") : NULL;
        const cJSON *content = cJSON_IsObject(m) ? field(m, "content") : NULL;
        if (!cJSON_IsObject(m)) return serve_fail(e, 400, "invalid_request_error", "'messages[%d]' must be an object", i);
        if (!cJSON_IsString(role))
            return serve_fail(e, 400, "invalid_request_error", "'messages[%d].role' must be a string", i);
        static const char *const roles[] = {"system", "user", "assistant"};
        int k = 0;
        while (k < 3 && strcmp(role->valuestring, roles[k])) k++;
        if (k == 3)
            return serve_fail(e, 400, "invalid_request_error", "'messages[%d].role' '%.64s' is not system, user or "
                              "assistant", i, role->valuestring);
        if (!content) return serve_fail(e, 400, "invalid_request_error", "'messages[%d].content' is required", i);
        char *text = NULL;
        if (parse_content(content, i, &text, e)) return -1;
        r->msgs[i] = (tide_chat_msg){roles[k], text};
        r->n_msgs = ++i;
    }
    return 0;
}

static int parse_sampling(const cJSON *o, serve_request *r, serve_error *e) {
    double v;
    int k;
    if ((k = number(o, "max_tokens", 1, 1 << 20, true, &v, e)) < 0) return -1;
    if (k) r->max_tokens = (int)v;
    if ((k = number(o, "max_completion_tokens", 1, 1 << 20, true, &v, e)) < 0) return -1;
    if (k) r->max_tokens = (int)v;
    if (number(o, "temperature", 0, 100, false, &r->so.temperature, e) < 0) return -1;
    if (number(o, "top_p", 0, 1, false, &r->so.top_p, e) < 0) return -1;
    if (number(o, "min_p", 0, 1, false, &r->so.min_p, e) < 0) return -1;
    if ((k = number(o, "top_k", 0, INT32_MAX, true, &v, e)) < 0) return -1;
    if (k) r->so.top_k = (int32_t)v;
    if (number(o, "frequency_penalty", -2, 2, false, &r->so.frequency_penalty, e) < 0) return -1;
    if (number(o, "presence_penalty", -2, 2, false, &r->so.presence_penalty, e) < 0) return -1;
    if (number(o, "repetition_penalty", 0, 100, false, &r->so.repetition_penalty, e) < 0) return -1;
    if (number(o, "repeat_penalty", 0, 100, false, &r->so.repetition_penalty, e) < 0) return -1;
    if ((k = number(o, "seed", 0, 9007199254740992.0, true, &v, e)) < 0) return -1;
    if (k) r->so.seed = (uint64_t)v, r->seed_given = true;
    if ((k = number(o, "n", 1, 1, true, &v, e)) < 0)
        return serve_fail(e, 400, "invalid_request_error", "'n' must be 1 (one choice per request)");
    /* asked for and not done: refused rather than silently left out */
    static const char *const unsupported[] = {"echo", "logprobs", "top_logprobs", "suffix", "tools", "functions"};
    for (size_t i = 0; i < sizeof unsupported / sizeof unsupported[0]; i++) {
        const cJSON *u = field(o, unsupported[i]);
        bool empty = cJSON_IsFalse(u) || (cJSON_IsString(u) && !u->valuestring[0]) ||
                     (cJSON_IsArray(u) && !cJSON_GetArraySize(u));
        if (u && !empty)
            return bad(e, "'%s' is not supported by tide serve", unsupported[i]);
    }
    if ((k = number(o, "best_of", 1, 1, true, &v, e)) < 0)
        return serve_fail(e, 400, "invalid_request_error", "'best_of' must be 1 (one choice per request)");
    const cJSON *f = field(o, "stream");
    if (f && !cJSON_IsBool(f)) return bad(e, "'%s' must be true or false", "stream");
    r->stream = f && cJSON_IsTrue(f);
    if ((f = field(o, "stream_options"))) {
        if (!cJSON_IsObject(f)) return bad(e, "'%s' must be an object", "stream_options");
        if (!r->stream) return bad(e, "'%s' is taken only with \"stream\": true", "stream_options");
        const cJSON *u = field(f, "include_usage");
        if (u && !cJSON_IsBool(u)) return bad(e, "'%s' must be true or false", "stream_options.include_usage");
        r->include_usage = u && cJSON_IsTrue(u);
    }
    return parse_stops(o, r, e);
}

/* Where a string of the JSON text holds a NUL (a raw 0 byte or the escape
 * \u0000), which C strings would silently cut: true, with the field's path
 * ("messages[1].content", "stop[0]") written to `path`. The scan follows the
 * text's nesting only; its validity is cJSON's to judge. */
#define NUL_DEPTH 32
static bool json_nul_field(const char *t, size_t len, char *path, size_t cap) {
    struct frame {
        bool obj, want_key;
        int index;
        char key[48];
    } st[NUL_DEPTH];
    int depth = 0; /* frames entered; only the first NUL_DEPTH are kept */
    for (size_t i = 0; i < len; i++) {
        char c = t[i];
        struct frame *top = depth > 0 && depth <= NUL_DEPTH ? &st[depth - 1] : NULL;
        if (c == '{' || c == '[') {
            if (depth < NUL_DEPTH) st[depth] = (struct frame){.obj = c == '{', .want_key = c == '{'};
            depth++;
        } else if (c == '}' || c == ']') {
            if (depth > 0) depth--;
        } else if (c == ',' && top) {
            if (top->obj) top->want_key = true;
            else top->index++;
        } else if (c == ':' && top && top->obj) {
            top->want_key = false;
        } else if (c == '"') {
            bool is_key = top && top->obj && top->want_key;
            size_t k = 0;
            bool nul = false;
            char key[48];
            for (i++; i < len && t[i] != '"'; i++) {
                char ch = t[i];
                if (ch == '\\' && i + 1 < len) {
                    ch = t[++i];
                    if (ch == 'u' && i + 4 < len && !memcmp(t + i + 1, "0000", 4)) nul = true;
                } else if (ch == '\0') {
                    nul = true;
                }
                if (is_key && k + 1 < sizeof key) key[k++] = ch;
            }
            if (is_key) {
                key[k] = '\0';
                memcpy(top->key, key, k + 1);
            }
            if (nul) {
                size_t n = 0;
                path[0] = '\0';
                int kept = depth < NUL_DEPTH ? depth : NUL_DEPTH;
                for (int d = 0; d < kept && n < cap; d++) {
                    int w = st[d].obj ? snprintf(path + n, cap - n, "%s%s", n ? "." : "", st[d].key)
                                      : snprintf(path + n, cap - n, "[%d]", st[d].index);
                    if (w > 0) n += (size_t)w;
                }
                if (is_key && n < cap) snprintf(path + n, cap - n, "%s(a key)", n ? " " : "");
                return true;
            }
        }
    }
    return false;
}

int serve_parse_request(serve_server *s, const char *body, size_t len, bool chat, serve_request *r, serve_error *e) {
    memset(r, 0, sizeof *r);
    r->chat = chat;
    const char *end = NULL;
    cJSON *o = cJSON_ParseWithLengthOpts(body, len, &end, false);
    if (!o) return serve_fail(e, 400, "invalid_request_error", "the request body is not valid JSON");
    int rc = -1;
    /* exactly one JSON value: nothing but white space after it */
    for (const char *p = end; p && p < body + len; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            serve_fail(e, 400, "invalid_request_error", "the request body holds bytes after its JSON value "
                       "(at offset %zu of %zu)", (size_t)(p - body), len);
            goto done;
        }
    char where[160];
    if (json_nul_field(body, len, where, sizeof where)) {
        serve_fail(e, 400, "invalid_request_error", "'%s' holds a NUL character (\\u0000), which is not "
                   "accepted", where[0] ? where : "(the body)");
        goto done;
    }
    if (!cJSON_IsObject(o)) {
        serve_fail(e, 400, "invalid_request_error", "the request body must be a JSON object");
        goto done;
    }
    const cJSON *model = field(o, "model");
    if (!model) {
        bad(e, "'%s' is required", "model");
        goto done;
    }
    if (!cJSON_IsString(model)) {
        bad(e, "'%s' must be a string", "model");
        goto done;
    }
    for (int i = 0; i < s->n_models; i++)
        if (strlen(s->models[i].name) == strlen(model->valuestring) &&
            !memcmp(s->models[i].name, model->valuestring, strlen(model->valuestring)))
            r->model = &s->models[i];
    if (!r->model) {
        serve_fail(e, 404, "not_found_error", "the model '%.128s' does not exist (GET /v1/models lists those served)",
                   model->valuestring);
        goto done;
    }
    if (chat) {
        if (parse_messages(o, r, e)) goto done;
    } else {
        const cJSON *p = field(o, "prompt");
        if (p && cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1) p = cJSON_GetArrayItem(p, 0);
        if (!p) {
            bad(e, "'%s' is required", "prompt");
            goto done;
        }
        if (!cJSON_IsString(p)) {
            bad(e, "'%s' must be a string (or an array of one string)", "prompt");
            goto done;
        }
        if (!(r->prompt = strdup(p->valuestring))) {
            serve_fail(e, 500, "server_error", "out of memory");
            goto done;
        }
    }
    rc = parse_sampling(o, r, e);
done:
    cJSON_Delete(o);
    return rc;
}

void serve_request_free(serve_request *r) {
    free(r->prompt);
    for (int i = 0; i < r->n_msgs; i++) free((char *)r->msgs[i].content);
    free(r->msgs);
    for (int i = 0; i < r->n_stops; i++) free(r->stops[i]);
    memset(r, 0, sizeof *r);
}

/* ---------------------------------------------------------------- answers */

static char *print_free(cJSON *o) {
    char *s = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    return s;
}

char *serve_error_json(const serve_error *e) {
    cJSON *o = cJSON_CreateObject(), *err = cJSON_AddObjectToObject(o, "error");
    if (!err) return print_free(o);
    cJSON_AddStringToObject(err, "message", e->msg);
    cJSON_AddStringToObject(err, "type", e->type);
    cJSON_AddNullToObject(err, "param");
    cJSON_AddNullToObject(err, "code");
    return print_free(o);
}

char *serve_models_json(serve_server *s) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(o, "data");
    for (int i = 0; data && i < s->n_models; i++) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "id", s->models[i].name);
        cJSON_AddStringToObject(m, "object", "model");
        cJSON_AddNumberToObject(m, "created", 0);
        cJSON_AddStringToObject(m, "owned_by", "tide");
        tide_pool_model_info info;
        tide_pool_model_info_get(s->o.pool, s->models[i].name, &info);
        cJSON_AddBoolToObject(m, "loaded", info.loaded);
        cJSON_AddNumberToObject(m, "evictions", (double)info.evictions);
        cJSON_AddItemToArray(data, m);
    }
    return print_free(o);
}

static cJSON *head(const serve_request *r, const char *id, time_t created, const char *object) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "object", object);
    cJSON_AddNumberToObject(o, "created", (double)created);
    cJSON_AddStringToObject(o, "model", r->model->name);
    return o;
}

static void add_usage(cJSON *o, int n_prompt, int n_gen) {
    cJSON *u = cJSON_AddObjectToObject(o, "usage");
    cJSON_AddNumberToObject(u, "prompt_tokens", n_prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", n_gen);
    cJSON_AddNumberToObject(u, "total_tokens", n_prompt + n_gen);
}

char *serve_answer_json(const serve_request *r, const char *id, time_t created, const char *text,
                        const char *finish, int n_prompt, int n_gen) {
    cJSON *o = head(r, id, created, r->chat ? "chat.completion" : "text_completion");
    cJSON *choices = cJSON_AddArrayToObject(o, "choices"), *c = cJSON_CreateObject();
    cJSON_AddItemToArray(choices, c);
    cJSON_AddNumberToObject(c, "index", 0);
    if (r->chat) {
        cJSON *m = cJSON_AddObjectToObject(c, "message");
        cJSON_AddStringToObject(m, "role", "assistant");
        cJSON_AddStringToObject(m, "content", text);
    } else {
        cJSON_AddStringToObject(c, "text", text);
        cJSON_AddNullToObject(c, "logprobs");
    }
    cJSON_AddStringToObject(c, "finish_reason", finish);
    add_usage(o, n_prompt, n_gen);
    return print_free(o);
}

char *serve_chunk_json(const serve_request *r, const char *id, time_t created, const char *text, const char *finish,
                       bool first) {
    cJSON *o = head(r, id, created, r->chat ? "chat.completion.chunk" : "text_completion");
    cJSON *choices = cJSON_AddArrayToObject(o, "choices"), *c = cJSON_CreateObject();
    cJSON_AddItemToArray(choices, c);
    cJSON_AddNumberToObject(c, "index", 0);
    if (r->chat) {
        cJSON *d = cJSON_AddObjectToObject(c, "delta");
        if (first) cJSON_AddStringToObject(d, "role", "assistant");
        if (text) cJSON_AddStringToObject(d, "content", text);
    } else {
        cJSON_AddStringToObject(c, "text", text ? text : "");
        cJSON_AddNullToObject(c, "logprobs");
    }
    if (finish) cJSON_AddStringToObject(c, "finish_reason", finish);
    else cJSON_AddNullToObject(c, "finish_reason");
    if (r->include_usage) cJSON_AddNullToObject(o, "usage");
    return print_free(o);
}

char *serve_usage_chunk_json(const serve_request *r, const char *id, time_t created, int n_prompt, int n_gen) {
    cJSON *o = head(r, id, created, r->chat ? "chat.completion.chunk" : "text_completion");
    cJSON_AddArrayToObject(o, "choices");
    add_usage(o, n_prompt, n_gen);
    return print_free(o);
}
