/*
 * tok_config.c - what a tokenizer learns from the files beside tokenizer.json,
 * and the public queries on a loaded tokenizer.
 *
 * BOS and EOS: tokenizer_config.json's bos_token / eos_token (a string or an
 * object with "content"), else special_tokens_map.json's, else
 * generation_config.json's bos_token_id / eos_token_id. Every id of
 * generation_config.json's eos_token_id (one or a list) also stops
 * generation. The chat template: tokenizer_config.json's chat_template (a
 * string, or a list of {name, template} of which the one named "default"),
 * else a chat_template.jinja file beside it (as transformers writes them).
 * tokenizer_config.json's add_bos_token / add_eos_token are not
 * read: what TIDE_TOKENIZE_ADD_SPECIAL adds is tokenizer.json's post-processor
 * alone, as in `tokenizers` and in transformers 5 (which ignores those keys
 * too). A config file that is present but malformed is an error naming it; a
 * missing one is not.
 */
#include "text/tok_int.h"

#include <cjson/cJSON.h>

#include <errno.h>
#include <string.h>
#include <sys/stat.h>

#define CONFIG_JSON_MAX (64ull << 20)

tide_status tok_read_json(tide_ctx *ctx, const char *path, uint64_t max, bool optional, cJSON **out) {
    char *text;
    size_t len;
    *out = NULL;
    struct stat sb;
    if (optional && stat(path, &sb) != 0 && errno == ENOENT) return TIDE_OK;
    tide_status st = tide_read_text_file(ctx, path, max, &text, &len);
    if (st) return st;
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(text, len, &end, false);
    if (!j) {
        size_t at = end && end >= text && end <= text + len ? (size_t)(end - text) : 0;
        tide_free(text);
        return tide_err(ctx, TIDE_E_FORMAT, "%s: malformed JSON near byte %zu", path, at);
    }
    tide_free(text);
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return tide_err(ctx, TIDE_E_FORMAT, "%s: not a JSON object", path);
    }
    *out = j;
    return TIDE_OK;
}

/* bos_token / eos_token: a string, or an object with "content". */
static const char *token_name(const cJSON *cfg, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (cJSON_IsString(v)) return v->valuestring;
    v = cJSON_GetObjectItemCaseSensitive(v, "content");
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static tide_status append_id(tide_tokenizer *t, int32_t **arr, int *n, int32_t id) {
    int32_t *p = tide_realloc(*arr, (size_t)(*n + 1) * sizeof *p);
    if (!p) return tide_err(t->ctx, TIDE_E_NOMEM, "out of memory reading the tokenizer's config files");
    p[(*n)++] = id;
    *arr = p;
    return TIDE_OK;
}

static tide_status add_eos(tide_tokenizer *t, int32_t id) {
    if (id < 0) return TIDE_OK;
    for (int i = 0; i < t->n_eos; i++)
        if (t->eos_ids[i] == id) return TIDE_OK;
    return append_id(t, &t->eos_ids, &t->n_eos, id);
}

/* The chat template (tok_config.c's header says where from); none is not
 * an error. */
static tide_status read_chat_template(tide_tokenizer *t, const char *dir, const cJSON *cfg) {
    const cJSON *ct = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template");
    const char *s = cJSON_IsString(ct) ? ct->valuestring : NULL;
    if (cJSON_IsArray(ct)) {
        const cJSON *e;
        cJSON_ArrayForEach(e, ct) {
            const cJSON *n = cJSON_GetObjectItemCaseSensitive(e, "name");
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(e, "template");
            if (cJSON_IsString(n) && cJSON_IsString(v) && !strcmp(n->valuestring, "default")) s = v->valuestring;
        }
    } else if (ct && !cJSON_IsString(ct) && !cJSON_IsNull(ct)) {
        return tide_err(t->ctx, TIDE_E_FORMAT, "%s/tokenizer_config.json: chat_template is neither a string nor "
                        "a list of named templates", dir);
    }
    if (s) {
        if (!(t->chat_template = tide_strdup(s)))
            return tide_err(t->ctx, TIDE_E_NOMEM, "out of memory reading the chat template");
        return TIDE_OK;
    }
    char path[4200];
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    struct stat sb;
    if (stat(path, &sb) != 0) return TIDE_OK;
    size_t len;
    return tide_read_text_file(t->ctx, path, CONFIG_JSON_MAX, &t->chat_template, &len);
}

tide_status tok_read_configs(tide_tokenizer *t, const char *dir) {
    char path[4200];
    cJSON *cfg = NULL, *stm = NULL, *gen = NULL;
    tide_status st;
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    if ((st = tok_read_json(t->ctx, path, CONFIG_JSON_MAX, true, &cfg))) return st;
    snprintf(path, sizeof path, "%s/special_tokens_map.json", dir);
    if ((st = tok_read_json(t->ctx, path, CONFIG_JSON_MAX, true, &stm))) goto out;
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    if ((st = tok_read_json(t->ctx, path, CONFIG_JSON_MAX, true, &gen))) goto out;

    t->bos = t->eos = -1;
    const char *bos = token_name(cfg, "bos_token"), *eos = token_name(cfg, "eos_token");
    if (!bos) bos = token_name(stm, "bos_token");
    if (!eos) eos = token_name(stm, "eos_token");
    if (bos) t->bos = tide_tokenizer_find(t, bos);
    if (eos) t->eos = tide_tokenizer_find(t, eos);
    const cJSON *gb = cJSON_GetObjectItemCaseSensitive(gen, "bos_token_id");
    const cJSON *ge = cJSON_GetObjectItemCaseSensitive(gen, "eos_token_id");
    if (t->bos < 0 && cJSON_IsNumber(gb)) t->bos = (int32_t)gb->valuedouble;
    if (t->eos < 0 && cJSON_IsNumber(ge)) t->eos = (int32_t)ge->valuedouble;
    if (t->eos < 0 && cJSON_IsArray(ge) && cJSON_IsNumber(cJSON_GetArrayItem(ge, 0)))
        t->eos = (int32_t)cJSON_GetArrayItem(ge, 0)->valuedouble;
    if ((t->bos >= t->n_vocab) || (t->eos >= t->n_vocab)) {
        st = tide_err(t->ctx, TIDE_E_FORMAT, "%s: bos/eos id %d outside the vocabulary (%d ids)", dir,
                      (int)TIDE_MAX(t->bos, t->eos), (int)t->n_vocab);
        goto out;
    }
    if ((st = add_eos(t, t->eos))) goto out;
    if ((st = read_chat_template(t, dir, cfg))) goto out;
    if (cJSON_IsNumber(ge) && (st = add_eos(t, (int32_t)ge->valuedouble))) goto out;
    const cJSON *e;
    if (cJSON_IsArray(ge)) {
        cJSON_ArrayForEach(e, ge) {
            if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble >= t->n_vocab) {
                st = tide_err(t->ctx, TIDE_E_FORMAT, "%s/generation_config.json: eos_token_id holds a bad id", dir);
                goto out;
            }
            if ((st = add_eos(t, (int32_t)e->valuedouble))) goto out;
        }
    }
out:
    cJSON_Delete(cfg);
    cJSON_Delete(stm);
    cJSON_Delete(gen);
    return st;
}

/* ------------------------------------------------------------ queries */

int32_t tide_tokenizer_n_vocab(const tide_tokenizer *t) { return t->n_vocab; }
const char *tide_tokenizer_chat_template(const tide_tokenizer *t) { return t->chat_template; }
int32_t tide_tokenizer_bos(const tide_tokenizer *t) { return t->bos; }
int32_t tide_tokenizer_eos(const tide_tokenizer *t) { return t->eos; }

int tide_tokenizer_eos_ids(const tide_tokenizer *t, const int32_t **ids) {
    if (ids) *ids = t->eos_ids;
    return t->n_eos;
}

bool tide_tokenizer_is_eos(const tide_tokenizer *t, int32_t id) {
    for (int i = 0; i < t->n_eos; i++)
        if (t->eos_ids[i] == id) return true;
    return false;
}

const char *tide_tokenizer_piece(const tide_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_vocab ? t->pieces[id] : NULL;
}

bool tide_tokenizer_is_special(const tide_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_vocab && (t->flags[id] & TOK_F_SPECIAL);
}

int32_t tide_tokenizer_find(const tide_tokenizer *t, const char *piece) {
    if (!piece) return -1;
    size_t n = strlen(piece);
    for (int i = 0; i < t->n_added; i++)
        if (!strcmp(t->pieces[t->added[i].id], piece)) return t->added[i].id;
    if (!t->byte_level) return tok_smap_get(&t->vocab, piece, n);
    /* byte-level: the symbol map holds the bytes an entry spells */
    uint8_t small[512], *buf = n <= sizeof small ? small : tide_malloc(n);
    long k = buf ? tok_bytelevel_bytes(piece, buf) : -1;
    int32_t id = k >= 0 ? tok_smap_get(&t->vocab, buf, (size_t)k) : -1;
    if (buf != small) tide_free(buf);
    if (id >= 0 && !strcmp(t->pieces[id], piece)) return id;
    /* an entry not spelled in the byte table (or no memory for a long one) */
    for (int32_t i = 0; i < t->n_vocab; i++)
        if (t->pieces[i] && t->piece_len[i] == n && !memcmp(t->pieces[i], piece, n)) return i;
    return -1;
}
