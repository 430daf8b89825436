/*
 * dataset.c - training data sets from text (include/tide.h, "Training data
 * sets"): JSON Lines and plain text through the model's tokenizer, as a token
 * stream (plain documents: data.c's windows over ids held in memory) or as
 * examples, one per right-padded row with the targets outside the trained
 * part ignored; the evaluation split and batches; a stream written as a
 * token file.
 *
 * The file is read whole and parsed line by line; every row is encoded at
 * open, so a bad line is reported before any step runs, with its number.
 */
#include "train/data.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Growable arrays of ids and of per-id flags (trained or not). */
typedef struct ids_vec {
    int32_t *v;
    uint8_t *train; /* examples only */
    int64_t n, cap;
} ids_vec;

typedef struct example {
    int64_t off, len; /* in the set's ids */
} example;

struct tide_dataset {
    tide_ctx *ctx;
    char *path;
    int seq;
    tide_tokens *stream;  /* documents or a token file; NULL for examples */
    ids_vec ids;          /* examples: every example's ids, flags */
    example *ex;
    int64_t n_ex;
    int32_t pad;
    tide_dataset_info info;
};

/* A row as parsed: its ids and flags, the file line it came from. */
typedef struct reader {
    tide_ctx *ctx;
    const char *path;
    tide_tokenizer *tok;
    const tide_dataset_opts *o;
    int64_t vocab;
    tide_chat_template *chat;
    int32_t bos, eos;
    bool template_eos;    /* the tokenizer's template ends a text with the EOS */
    int kind;             /* 0 none yet, 1 documents, 2 examples */
    long line;
    ids_vec row;          /* the row being built */
    ids_vec all;          /* every row's ids, concatenated */
    int64_t *row_off;     /* per row: its start in all */
    int64_t n_rows, cap_rows;
    int64_t skipped;
} reader;

static bool vec_reserve(ids_vec *a, int64_t extra, bool flags) {
    if (a->n + extra <= a->cap) return true;
    int64_t cap = a->cap ? a->cap : 256;
    while (cap < a->n + extra) cap *= 2;
    int32_t *v = tide_realloc(a->v, (size_t)cap * sizeof *v);
    if (!v) return false;
    a->v = v;
    if (flags) {
        uint8_t *t = tide_realloc(a->train, (size_t)cap);
        if (!t) return false;
        a->train = t;
    }
    a->cap = cap;
    return true;
}

static void vec_free(ids_vec *a) {
    tide_free(a->v);
    tide_free(a->train);
    memset(a, 0, sizeof *a);
}

static tide_status line_err(reader *r, tide_status st, const char *what) {
    return tide_err(r->ctx, st, "%s:%ld: %s", r->path, r->line, what);
}

/* Encodes text[0..len) with flags and appends the ids to r->row, each
 * flagged `train`. */
static tide_status encode_add(reader *r, const char *text, size_t len, unsigned flags, bool train) {
    size_t n = 0;
    if (!vec_reserve(&r->row, (int64_t)len + 8, true)) return tide_err(r->ctx, TIDE_E_NOMEM, "%s: out of memory", r->path);
    size_t cap = (size_t)(r->row.cap - r->row.n);
    tide_status st = tide_tokenizer_encode(r->tok, text, len, flags, r->row.v + r->row.n, cap, &n);
    if (!st && n > cap) {
        if (!vec_reserve(&r->row, (int64_t)n, true)) return tide_err(r->ctx, TIDE_E_NOMEM, "%s: out of memory", r->path);
        st = tide_tokenizer_encode(r->tok, text, len, flags, r->row.v + r->row.n, n, &n);
    }
    if (st) return tide_err(r->ctx, st, "%s:%ld: cannot encode the line: %s", r->path, r->line, tide_ctx_last_error(r->ctx));
    memset(r->row.train + r->row.n, train, n);
    r->row.n += (int64_t)n;
    return TIDE_OK;
}

static tide_status add_id(reader *r, int32_t id, bool train) {
    if (!vec_reserve(&r->row, 1, true)) return tide_err(r->ctx, TIDE_E_NOMEM, "%s: out of memory", r->path);
    r->row.v[r->row.n] = id;
    r->row.train[r->row.n++] = train;
    return TIDE_OK;
}

static tide_status set_kind(reader *r, int kind) {
    if (r->kind && r->kind != kind)
        return line_err(r, TIDE_E_FORMAT, kind == 1 ? "a plain \"text\" row among examples: a file holds documents "
                                                      "or examples, not both"
                                                    : "an example among plain \"text\" rows: a file holds documents "
                                                      "or examples, not both");
    r->kind = kind;
    return TIDE_OK;
}

static tide_status document(reader *r, const char *text, size_t len) {
    tide_status st = set_kind(r, 1);
    if (!st) st = encode_add(r, text, len, TIDE_TOKENIZE_ADD_SPECIAL, true);
    if (!st && r->eos >= 0 && !r->template_eos) st = add_id(r, r->eos, true);
    return st;
}

static tide_status prompt_completion(reader *r, const cJSON *p, const cJSON *c) {
    tide_status st = set_kind(r, 2);
    if (!st) st = encode_add(r, p->valuestring, strlen(p->valuestring), TIDE_TOKENIZE_ADD_SPECIAL, r->o->train_on_all);
    if (!st) st = encode_add(r, c->valuestring, strlen(c->valuestring), 0, true);
    if (!st && r->eos >= 0) st = add_id(r, r->eos, true);
    return st;
}

/* A conversation: its rendering cut where each message begins (and where an
 * assistant message's text begins, after the header the generation prompt
 * writes); the assistant's pieces trained. */
static tide_status chat(reader *r, const cJSON *msgs) {
    tide_status st = set_kind(r, 2);
    if (st) return st;
    int n = cJSON_GetArraySize(msgs);
    if (n < 1) return line_err(r, TIDE_E_FORMAT, "\"messages\" is empty");
    tide_chat_msg *m = tide_calloc((size_t)n, sizeof *m);
    if (!m) return tide_err(r->ctx, TIDE_E_NOMEM, "%s: out of memory", r->path);
    char buf[160];
    int i = 0;
    for (const cJSON *x = msgs->child; x; x = x->next, i++) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(x, "role");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(x, "content");
        if (!cJSON_IsObject(x) || !cJSON_IsString(role) || !cJSON_IsString(content)) {
            snprintf(buf, sizeof buf, "message %d is not an object with string \"role\" and \"content\"", i);
            st = line_err(r, TIDE_E_FORMAT, buf);
            break;
        }
        if (strcmp(role->valuestring, "system") && strcmp(role->valuestring, "user") &&
            strcmp(role->valuestring, "assistant")) {
            snprintf(buf, sizeof buf, "message %d has the unknown role '%.40s' (system, user or assistant)", i,
                     role->valuestring);
            st = line_err(r, TIDE_E_FORMAT, buf);
            break;
        }
        m[i] = (tide_chat_msg){role->valuestring, content->valuestring};
    }
    if (!st && !r->chat) {
        st = tide_chat_template_get(r->ctx, r->tok, r->o->chat_template, &r->chat);
        if (st)
            st = tide_err(r->ctx, st, "%s:%ld: a \"messages\" row needs a chat template: %s", r->path, r->line,
                          tide_ctx_last_error(r->ctx));
    }
    char *full = NULL, *part = NULL;
    size_t full_len = 0, at = 0;
    if (!st && (st = tide_chat_format(r->ctx, r->chat, m, n, false, &full, &full_len)))
        st = tide_err(r->ctx, st, "%s:%ld: the chat template refuses the conversation: %s", r->path, r->line,
                      tide_ctx_last_error(r->ctx));
    for (i = 0; !st && i < n; i++) {
        bool asst = !strcmp(m[i].role, "assistant");
        size_t head = at, end = 0;
        if (asst && i > 0) { /* where the assistant's own text begins */
            if ((st = tide_chat_format(r->ctx, r->chat, m, i, true, &part, &head))) break;
            bool prefix = head >= at && head <= full_len && !memcmp(part, full, head);
            tide_free_text(part);
            part = NULL;
            if (!prefix) head = (size_t)-1;
        }
        if ((st = tide_chat_format(r->ctx, r->chat, m, i + 1, false, &part, &end))) break;
        bool prefix = end <= full_len && !memcmp(part, full, end);
        tide_free_text(part);
        part = NULL;
        if (!prefix || head == (size_t)-1 || end < head) {
            snprintf(buf, sizeof buf, "the chat template does not render message %d as a continuation of the ones "
                     "before it: its tokens cannot be told apart", i);
            st = line_err(r, TIDE_E_UNSUPPORTED, buf);
            break;
        }
        bool train = asst || r->o->train_on_all;
        if (head > at) st = encode_add(r, full + at, head - at, 0, r->o->train_on_all);
        if (!st && end > head) st = encode_add(r, full + head, end - head, 0, train);
        at = end;
    }
    if (!st && at < full_len) st = encode_add(r, full + at, full_len - at, 0, r->o->train_on_all);
    if (st && tide_ctx_last_error(r->ctx)[0] && !strstr(tide_ctx_last_error(r->ctx), r->path))
        st = tide_err(r->ctx, st, "%s:%ld: %s", r->path, r->line, tide_ctx_last_error(r->ctx));
    tide_free_text(full);
    tide_free(m);
    return st;
}

/* One non-blank line: its row into r->row. */
static tide_status parse_line(reader *r, const char *s, size_t len, bool jsonl) {
    if (!jsonl) return document(r, s, len);
    const char *end = NULL;
    cJSON *o = cJSON_ParseWithLengthOpts(s, len, &end, false);
    tide_status st = TIDE_OK;
    if (!o) {
        char buf[96];
        snprintf(buf, sizeof buf, "malformed JSON (near byte %lld of the line)",
                 (long long)((end && end >= s ? end : cJSON_GetErrorPtr() ? cJSON_GetErrorPtr() : s) - s) + 1);
        return line_err(r, TIDE_E_FORMAT, buf);
    }
    for (const char *e = end; e && e < s + len; e++)
        if (*e != ' ' && *e != '\t' && *e != '\r') {
            cJSON_Delete(o);
            return line_err(r, TIDE_E_FORMAT, "malformed JSON: text after the object");
        }
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(o, "text");
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(o, "prompt");
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(o, "completion");
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(o, "messages");
    if (!cJSON_IsObject(o)) st = line_err(r, TIDE_E_FORMAT, "not a JSON object");
    else if (msgs) st = cJSON_IsArray(msgs) ? chat(r, msgs) : line_err(r, TIDE_E_FORMAT, "\"messages\" is not an array");
    else if (p || c) {
        if (!cJSON_IsString(p) || !cJSON_IsString(c))
            st = line_err(r, TIDE_E_FORMAT, "\"prompt\" and \"completion\" must both be strings");
        else st = prompt_completion(r, p, c);
    } else if (text) {
        st = cJSON_IsString(text) ? document(r, text->valuestring, strlen(text->valuestring))
                                  : line_err(r, TIDE_E_FORMAT, "\"text\" is not a string");
    } else {
        st = line_err(r, TIDE_E_FORMAT, "no \"text\", \"prompt\"/\"completion\" or \"messages\" field");
    }
    cJSON_Delete(o);
    return st;
}

/* Moves r->row to the end of r->all as a new row. */
static tide_status end_row(reader *r) {
    for (int64_t i = 0; i < r->row.n; i++)
        if (r->row.v[i] < 0 || r->row.v[i] >= r->vocab) {
            char buf[128];
            snprintf(buf, sizeof buf, "token %d is outside the model's vocabulary of %lld", r->row.v[i],
                     (long long)r->vocab);
            return line_err(r, TIDE_E_RANGE, buf);
        }
    if (r->n_rows + 1 >= r->cap_rows) {
        int64_t cap = r->cap_rows ? 2 * r->cap_rows : 64;
        int64_t *o = tide_realloc(r->row_off, (size_t)cap * sizeof *o);
        if (!o) return tide_err(r->ctx, TIDE_E_NOMEM, "%s: out of memory", r->path);
        r->row_off = o;
        r->cap_rows = cap;
    }
    if (!vec_reserve(&r->all, r->row.n, true)) return tide_err(r->ctx, TIDE_E_NOMEM, "%s: out of memory", r->path);
    memcpy(r->all.v + r->all.n, r->row.v, (size_t)r->row.n * sizeof *r->row.v);
    memcpy(r->all.train + r->all.n, r->row.train, (size_t)r->row.n);
    r->row_off[r->n_rows++] = r->all.n;
    r->all.n += r->row.n;
    r->row_off[r->n_rows] = r->all.n;
    r->row.n = 0;
    return TIDE_OK;
}

static tide_status read_rows(reader *r, const char *text, size_t size, bool jsonl) {
    const char *p = text, *end = text + size;
    tide_status st = TIDE_OK;
    for (r->line = 1; !st && p < end; r->line++) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *e = nl ? nl : end;
        size_t len = (size_t)(e - p);
        if (len && p[len - 1] == '\r') len--;
        bool blank = true;
        for (size_t i = 0; i < len && blank; i++) blank = p[i] == ' ' || p[i] == '\t';
        if (blank) r->skipped++;
        else if (!(st = parse_line(r, p, len, jsonl))) st = end_row(r);
        p = nl ? nl + 1 : end;
    }
    if (!st && !r->n_rows)
        st = tide_err(r->ctx, TIDE_E_FORMAT, "%s: no rows: the file is empty or every line is blank", r->path);
    return st;
}

/* ---------------------------------------------------------------- sets */

void tide_dataset_free(tide_dataset *d) {
    if (!d) return;
    tide_tokens_free(d->stream);
    vec_free(&d->ids);
    tide_free(d->ex);
    tide_free(d->path);
    tide_free(d);
}

static tide_dataset *set_new(tide_ctx *ctx, const char *path, int seq) {
    tide_dataset *d = tide_calloc(1, sizeof *d);
    if (!d || !(d->path = tide_strdup(path))) {
        tide_free(d);
        return NULL;
    }
    d->ctx = ctx;
    d->seq = seq;
    return d;
}

/* Rows [r0, r1) of r as a set: a stream, or examples (truncated to T + 1). */
static tide_status make_set(reader *r, int64_t r0, int64_t r1, const char *name, tide_dataset **out) {
    *out = NULL;
    const int T = r->o->seq;
    tide_dataset *d = set_new(r->ctx, name, T);
    if (!d) return tide_err(r->ctx, TIDE_E_NOMEM, "%s: out of memory", r->path);
    d->pad = r->eos >= 0 ? r->eos : 0;
    d->info.skipped_lines = r->skipped;
    d->info.rows = r1 - r0;
    int64_t a = r->row_off[r0], b = r->row_off[r1];
    tide_status st = TIDE_OK;
    if (r->kind == 1) {
        uint32_t *ids = tide_malloc((size_t)(b - a) * sizeof *ids);
        if (!ids) st = tide_err(r->ctx, TIDE_E_NOMEM, "%s: out of memory", r->path);
        for (int64_t i = a; ids && i < b; i++) ids[i - a] = (uint32_t)r->all.v[i];
        if (!st) st = data_tokens_from_ids(r->ctx, name, ids, b - a, r->vocab, T, &d->stream);
        d->info.tokens = b - a;
    } else {
        d->info.examples = true;
        d->ex = tide_calloc((size_t)(r1 - r0), sizeof *d->ex);
        if (!d->ex || !vec_reserve(&d->ids, b - a, true))
            st = tide_err(r->ctx, TIDE_E_NOMEM, "%s: out of memory", r->path);
        int64_t pad = 0;
        for (int64_t k = r0; !st && k < r1; k++) {
            int64_t o = r->row_off[k], L = r->row_off[k + 1] - o;
            if (T && L > T + 1) {
                L = T + 1;
                d->info.truncated++;
            }
            int64_t trained = 0;
            for (int64_t i = 1; i < L; i++) trained += r->all.train[o + i];
            if (!trained && T) {
                d->info.dropped++;
                continue;
            }
            d->ex[d->n_ex++] = (example){d->ids.n, L};
            memcpy(d->ids.v + d->ids.n, r->all.v + o, (size_t)L * sizeof *d->ids.v);
            memcpy(d->ids.train + d->ids.n, r->all.train + o, (size_t)L);
            d->ids.n += L;
            d->info.targets += trained;
            pad += T - (L - 1);
        }
        d->info.tokens = d->ids.n;
        d->info.pad_fraction = d->n_ex && T ? (double)pad / ((double)d->n_ex * T) : 0;
        if (!st && !d->n_ex)
            st = tide_err(r->ctx, TIDE_E_FORMAT, "%s: no example has a trained token within --seq %d + 1 tokens (%lld "
                          "dropped)", name, T, (long long)d->info.dropped);
    }
    if (st) {
        tide_dataset_free(d);
        return st;
    }
    *out = d;
    return TIDE_OK;
}

static bool ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* Whether the tokenizer's template appends the EOS to a text. */
static bool appends_eos(tide_tokenizer *tok, int32_t eos) {
    int32_t a[16], b[16];
    size_t na = 0, nb = 0;
    if (eos < 0 || tide_tokenizer_encode(tok, "a", 1, TIDE_TOKENIZE_ADD_SPECIAL, a, 16, &na) ||
        tide_tokenizer_encode(tok, "a", 1, 0, b, 16, &nb) || na > 16 || nb > 16)
        return false;
    return na > nb && a[na - 1] == eos;
}

/* The whole of path into *text (NUL-terminated, tide_free). */
static tide_status read_file(tide_ctx *ctx, const char *path, char **text, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return tide_err(ctx, errno == ENOENT ? TIDE_E_NOT_FOUND : TIDE_E_IO, "%s: cannot open the data file: %s", path,
                        strerror(errno));
    size_t cap = 1 << 16, n = 0, k;
    char *b = tide_malloc(cap);
    while (b && (k = fread(b + n, 1, cap - n - 1, f)) > 0) {
        n += k;
        if (n + 1 == cap) {
            char *g = tide_realloc(b, cap * 2);
            if (!g) {
                tide_free(b);
                b = NULL;
            }
            b = g;
            cap *= 2;
        }
    }
    bool bad = ferror(f);
    int e = errno;
    fclose(f);
    if (!b) return tide_err(ctx, TIDE_E_NOMEM, "%s: out of memory reading the data file", path);
    if (bad) {
        tide_free(b);
        return tide_err(ctx, TIDE_E_IO, "%s: cannot read the data file: %s", path, strerror(e));
    }
    b[n] = 0;
    *text = b;
    *size = n;
    return TIDE_OK;
}

static tide_status open_text(tide_ctx *ctx, const char *path, tide_tokenizer *tok, int64_t vocab,
                             const tide_dataset_opts *o, tide_dataset **out, tide_dataset **eval) {
    if (!tok)
        return tide_err(ctx, TIDE_E_INVALID, "%s: a text data set needs the model's tokenizer (tokenizer.json), and "
                        "there is none: give a token file instead", path);
    size_t size = 0;
    char *text = NULL;
    tide_status st = read_file(ctx, path, &text, &size);
    if (st) return st;
    reader r = {.ctx = ctx, .path = path, .tok = tok, .o = o, .vocab = vocab,
                .bos = tide_tokenizer_bos(tok), .eos = tide_tokenizer_eos(tok)};
    r.template_eos = appends_eos(tok, r.eos);
    st = read_rows(&r, text, size, ends_with(path, ".jsonl"));
    tide_free(text);
    int64_t n_eval = 0;
    if (!st && o->eval_split > 0) {
        n_eval = (int64_t)((double)r.n_rows * o->eval_split);
        if (n_eval < 1) n_eval = 1;
        if (n_eval >= r.n_rows)
            st = tide_err(ctx, TIDE_E_FORMAT, "%s: %lld rows: too few to keep %g of them for evaluation and train on "
                          "the rest", path, (long long)r.n_rows, o->eval_split);
    }
    char name[4200];
    if (!st) st = make_set(&r, 0, r.n_rows - n_eval, path, out);
    if (!st && n_eval) {
        snprintf(name, sizeof name, "%s (evaluation split)", path);
        if ((st = make_set(&r, r.n_rows - n_eval, r.n_rows, name, eval))) {
            tide_dataset_free(*out);
            *out = NULL;
        }
    }
    vec_free(&r.row);
    vec_free(&r.all);
    tide_free(r.row_off);
    tide_chat_template_free(r.chat);
    return st;
}

tide_status tide_dataset_open(tide_ctx *ctx, const char *path, tide_tokenizer *tok, int64_t vocab,
                              tide_token_dtype dt, const tide_dataset_opts *o, tide_dataset **out,
                              tide_dataset **eval) {
    if (!out || !o || (o->eval_split > 0 && !eval))
        return tide_err(ctx, TIDE_E_INVALID, "dataset_open: NULL out, options or eval");
    *out = NULL;
    if (eval) *eval = NULL;
    if (!path || !*path) return tide_err(ctx, TIDE_E_INVALID, "dataset_open: no path");
    bool text = ends_with(path, ".jsonl") || ends_with(path, ".txt");
    if (o->seq < (text ? 0 : 1)) return tide_err(ctx, TIDE_E_INVALID, "%s: sequence length %d < 1", path, o->seq);
    if (!(o->eval_split >= 0 && o->eval_split <= 0.5))
        return tide_err(ctx, TIDE_E_INVALID, "%s: evaluation split %g outside [0, 0.5]", path, o->eval_split);
    if (vocab < 1 || vocab > INT32_MAX)
        return tide_err(ctx, TIDE_E_INVALID, "%s: vocab %lld out of [1, 2^31)", path, (long long)vocab);
    if (text) return open_text(ctx, path, tok, vocab, o, out, eval);
    if (o->eval_split > 0)
        return tide_err(ctx, TIDE_E_INVALID, "%s: an evaluation split is taken from documents or examples (.jsonl, "
                        ".txt), not from a token file: give the evaluation set as a file of its own", path);
    tide_dataset *d = set_new(ctx, path, o->seq);
    if (!d) return tide_err(ctx, TIDE_E_NOMEM, "%s: out of memory", path);
    tide_status st = tide_tokens_open(ctx, path, dt, vocab, o->seq, &d->stream);
    if (st) {
        tide_dataset_free(d);
        return st;
    }
    d->info.tokens = tide_tokens_count(d->stream);
    d->info.rows = 1;
    *out = d;
    return TIDE_OK;
}

void tide_dataset_info_get(const tide_dataset *d, tide_dataset_info *out) { *out = d->info; }

const tide_tokens *tide_dataset_tokens(const tide_dataset *d) { return d ? d->stream : NULL; }

/* Row b (of T inputs and targets) from example k, or an ignored row (k < 0). */
static void example_row(const tide_dataset *d, int64_t k, int32_t *in, int32_t *tg) {
    const int T = d->seq;
    int64_t L = 0;
    const int32_t *v = NULL;
    const uint8_t *tr = NULL;
    if (k >= 0) {
        L = d->ex[k].len;
        v = d->ids.v + d->ex[k].off;
        tr = d->ids.train + d->ex[k].off;
    }
    for (int t = 0; t < T; t++) {
        bool real = t + 1 < L;
        in[t] = t < L ? v[t] : d->pad;
        tg[t] = real && tr[t + 1] ? v[t + 1] : -1;
    }
}

static tide_status check_spec(const tide_dataset *d, const tide_batch_spec *spec, int micro, int32_t *in,
                              int32_t *tg) {
    if (!spec || !in || !tg || spec->batch < 1 || spec->accum < 1 || micro < 0 || micro >= spec->accum)
        return tide_err(d->ctx, TIDE_E_INVALID, "%s: batch: a bad spec, micro-batch or NULL buffers", d->path);
    if (spec->seq != d->seq)
        return tide_err(d->ctx, TIDE_E_INVALID, "%s: batch of sequence length %d from a data set made for %d", d->path,
                        spec->seq, d->seq);
    return TIDE_OK;
}

tide_status tide_dataset_batch(const tide_dataset *d, const tide_batch_spec *spec, int64_t step, int micro,
                               int32_t *inputs, int32_t *targets) {
    if (d->stream) return tide_tokens_batch(d->stream, spec, step, micro, inputs, targets);
    tide_status st = check_spec(d, spec, micro, inputs, targets);
    if (st) return st;
    if (step < 0) return tide_err(d->ctx, TIDE_E_INVALID, "%s: batch of a negative step", d->path);
    for (int b = 0; b < spec->batch; b++)
        example_row(d, data_row_draw(spec, (uint64_t)d->n_ex, step, micro, b), inputs + (size_t)b * d->seq,
                    targets + (size_t)b * d->seq);
    return TIDE_OK;
}

/* Rows of the evaluation: windows at multiples of T, or the examples. */
static int64_t eval_rows(const tide_dataset *d) {
    return d->stream ? (tide_tokens_count(d->stream) - 1) / d->seq : d->n_ex;
}

int64_t tide_dataset_eval_batches(const tide_dataset *d, const tide_batch_spec *spec) {
    int64_t per = (int64_t)spec->batch * spec->accum;
    return (eval_rows(d) + per - 1) / per;
}

tide_status tide_dataset_eval_batch(const tide_dataset *d, const tide_batch_spec *spec, int64_t i, int micro,
                                    int32_t *inputs, int32_t *targets) {
    tide_status st = check_spec(d, spec, micro, inputs, targets);
    if (st) return st;
    const int T = d->seq;
    int64_t n = eval_rows(d);
    for (int b = 0; b < spec->batch; b++) {
        int64_t row = (i * spec->accum + micro) * (int64_t)spec->batch + b;
        int32_t *in = inputs + (size_t)b * T, *tg = targets + (size_t)b * T;
        if (!d->stream) {
            example_row(d, row < n ? row : -1, in, tg);
            continue;
        }
        for (int t = 0; t < T; t++) {
            in[t] = row < n ? (int32_t)tide_tokens_at(d->stream, row * T + t) : 0;
            tg[t] = row < n ? (int32_t)tide_tokens_at(d->stream, row * T + t + 1) : -1;
        }
    }
    return TIDE_OK;
}

tide_status tide_dataset_write_tokens(const tide_dataset *d, const char *path, tide_token_dtype dt) {
    if (!d->stream)
        return tide_err(d->ctx, TIDE_E_INVALID, "%s: prompt/completion and chat examples cannot be written as a token "
                        "file (it holds one stream of ids, no rows and no trained parts): train on the .jsonl itself",
                        d->path);
    int64_t n = tide_tokens_count(d->stream), max = 0;
    int32_t *ids = tide_malloc((size_t)(n ? n : 1) * sizeof *ids);
    if (!ids) return tide_err(d->ctx, TIDE_E_NOMEM, "%s: out of memory", path);
    for (int64_t i = 0; i < n; i++) {
        ids[i] = (int32_t)tide_tokens_at(d->stream, i);
        if (ids[i] > max) max = ids[i];
    }
    tide_status st = TIDE_OK;
    bool wide = dt == TIDE_TOKENS_U32 || (dt == TIDE_TOKENS_AUTO && max > 65535);
    if (!wide && max > 65535)
        st = tide_err(d->ctx, TIDE_E_INVALID, "%s: id %lld does not fit u16: write u32", path, (long long)max);
    if (!st) st = data_write_ids(d->ctx, path, ids, n, wide);
    tide_free(ids);
    return st;
}
