/*
 * gguf_model.c - a GGUF file as a checkpoint: the LLaMA configuration from
 * its metadata, its tensors under Hugging Face names with Hugging Face
 * shapes, read in place from the mapping (docs/gguf.md describes what is
 * read and refused).
 *
 * Names: llama.cpp's token_embd, output_norm, output and
 * blk.N.{attn_norm, attn_q, attn_k, attn_v, attn_output, ffn_norm, ffn_gate,
 * ffn_up, ffn_down} become model.embed_tokens, model.norm, lm_head and
 * model.layers.N.{input_layernorm, self_attn.{q,k,v,o}_proj,
 * post_attention_layernorm, mlp.{gate,up,down}_proj} (".weight" kept).
 * Shapes: ggml's ne[] reversed, so a matrix of rows of K elements and N rows
 * is (N, K), as in safetensors. The bytes are the file's: llama.cpp's
 * converter permutes the q/k rows of "llama" files for its rotary layout,
 * and the config says so (qk_interleaved), so tide's RoPE reads that order.
 *
 * Every tensor the model needs must be there with the shape the metadata
 * implies; anything else in the file is refused by name. Failures name the
 * file, the key or tensor (both names) and the problem: TIDE_E_FORMAT for
 * missing or inconsistent data, TIDE_E_UNSUPPORTED for valid files tide
 * cannot run (other architectures, rope scaling, biases other than Qwen2's
 * q/k/v ones, per-layer sizes). A "qwen2" file must hold those three biases
 * per layer (blk.N.attn_{q,k,v}.bias, under ...self_attn.{q,k,v}_proj.bias),
 * in the norms' type.
 */
#include "model/checkpoint.h"
#include "model/gguf.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The per-layer tensors: llama.cpp's suffix, Hugging Face's, the wtypes role
 * (-1: a norm). */
static const struct {
    const char *gg, *hf;
    int role;
} layer_names[] = {
    {"attn_norm", "input_layernorm", -1},
    {"attn_q", "self_attn.q_proj", TIDE_W_Q},
    {"attn_k", "self_attn.k_proj", TIDE_W_K},
    {"attn_v", "self_attn.v_proj", TIDE_W_V},
    {"attn_output", "self_attn.o_proj", TIDE_W_O},
    {"ffn_norm", "post_attention_layernorm", -1},
    {"ffn_gate", "mlp.gate_proj", TIDE_W_GATE},
    {"ffn_up", "mlp.up_proj", TIDE_W_UP},
    {"ffn_down", "mlp.down_proj", TIDE_W_DOWN},
};
#define N_LAYER_NAMES ((int)(sizeof layer_names / sizeof layer_names[0]))
/* Qwen2's q, k and v biases ("blk.N.attn_q.bias" ...): a layer's slots
 * N_LAYER_NAMES + 0..2, after its weights. */
#define N_LAYER_SLOTS (N_LAYER_NAMES + 3)

enum { T_EMBED = -1, T_HEAD = -2, T_NORM = -3 };

/* A parsed llama.cpp name: kind T_EMBED/T_HEAD/T_NORM, or a layer (layer,
 * entry of layer_names). */
typedef struct gg_name {
    int kind;  /* T_* or 0 for a layer tensor */
    int layer; /* kind 0 */
    int entry; /* kind 0: index into layer_names */
} gg_name;

typedef enum { NAME_OK, NAME_BIAS, NAME_ROPE_FREQS, NAME_UNKNOWN } name_kind;

static name_kind parse_name(const char *n, gg_name *out) {
    memset(out, 0, sizeof *out);
    if (!strcmp(n, "token_embd.weight")) return out->kind = T_EMBED, NAME_OK;
    if (!strcmp(n, "output.weight")) return out->kind = T_HEAD, NAME_OK;
    if (!strcmp(n, "output_norm.weight")) return out->kind = T_NORM, NAME_OK;
    if (!strcmp(n, "rope_freqs.weight")) return NAME_ROPE_FREQS;
    if (strncmp(n, "blk.", 4) != 0 || n[4] < '0' || n[4] > '9') return NAME_UNKNOWN;
    const char *p = n + 4;
    long L = 0;
    while (*p >= '0' && *p <= '9') {
        L = L * 10 + (*p++ - '0');
        if (L > 1000000) return NAME_UNKNOWN;
    }
    if (*p++ != '.') return NAME_UNKNOWN;
    for (int e = 0; e < N_LAYER_NAMES; e++) {
        size_t k = strlen(layer_names[e].gg);
        if (strncmp(p, layer_names[e].gg, k) != 0) continue;
        if (!strcmp(p + k, ".weight")) {
            out->layer = (int)L;
            out->entry = e;
            return NAME_OK;
        }
        if (!strcmp(p + k, ".bias")) {
            if (layer_names[e].role < TIDE_W_Q || layer_names[e].role > TIDE_W_V) return NAME_BIAS;
            out->layer = (int)L;
            out->entry = N_LAYER_NAMES + (layer_names[e].role - TIDE_W_Q);
            return NAME_OK;
        }
    }
    return NAME_UNKNOWN;
}

static char *hf_name(const gg_name *g) {
    char buf[128];
    if (g->kind == T_EMBED) snprintf(buf, sizeof buf, "model.embed_tokens.weight");
    else if (g->kind == T_HEAD) snprintf(buf, sizeof buf, "lm_head.weight");
    else if (g->kind == T_NORM) snprintf(buf, sizeof buf, "model.norm.weight");
    else if (g->entry >= N_LAYER_NAMES)
        snprintf(buf, sizeof buf, "model.layers.%d.%s.bias", g->layer, layer_names[1 + g->entry - N_LAYER_NAMES].hf);
    else snprintf(buf, sizeof buf, "model.layers.%d.%s.weight", g->layer, layer_names[g->entry].hf);
    return tide_strdup(buf);
}

/* ---------------------------------------------------------------- metadata */

typedef struct meta {
    tide_ctx *ctx;
    const tide_gguf *g;
    const char *path;
    const char *arch; /* the key prefix */
} meta;

/* An integer key "ARCH.SUFFIX" in 1..INT32_MAX into *v; absent: *v unchanged
 * unless required. */
static tide_status meta_int(const meta *m, const char *suffix, bool required, int *v) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", m->arch, suffix);
    tide_gguf_value val;
    if (!tide_gguf_get(m->g, key, &val)) {
        if (required) return tide_err(m->ctx, TIDE_E_FORMAT, "%s: no key '%s' (needed for the model's shape)", m->path, key);
        return TIDE_OK;
    }
    if (val.type == TIDE_GGUF_ARRAY)
        return tide_err(m->ctx, TIDE_E_UNSUPPORTED, "%s: key '%s' is an array (per-layer values are not supported)",
                        m->path, key);
    int64_t x;
    if (!tide_gguf_value_int(&val, &x))
        return tide_err(m->ctx, TIDE_E_FORMAT, "%s: key '%s' is %s, expected an integer", m->path, key,
                        tide_gguf_type_name(val.type));
    if (x <= 0 || x > INT32_MAX)
        return tide_err(m->ctx, TIDE_E_FORMAT, "%s: key '%s' is %lld, must be positive and below 2^31", m->path, key,
                        (long long)x);
    *v = (int)x;
    return TIDE_OK;
}

static tide_status meta_float(const meta *m, const char *suffix, bool required, float *v) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", m->arch, suffix);
    tide_gguf_value val;
    if (!tide_gguf_get(m->g, key, &val)) {
        if (required) return tide_err(m->ctx, TIDE_E_FORMAT, "%s: no key '%s'", m->path, key);
        return TIDE_OK;
    }
    double d;
    if (!tide_gguf_value_float(&val, &d))
        return tide_err(m->ctx, TIDE_E_FORMAT, "%s: key '%s' is %s, expected f32 or f64", m->path, key,
                        tide_gguf_type_name(val.type));
    if (!(d > 0) || !isfinite(d) || d > 3.0e38)
        return tide_err(m->ctx, TIDE_E_FORMAT, "%s: key '%s' is %g, must be positive and finite", m->path, key, d);
    *v = (float)d;
    return TIDE_OK;
}

/* Rope scaling is refused: ARCH.rope.scaling.type other than "none",
 * ARCH.rope.scaling.factor or ARCH.rope.scale_linear other than 1 (the
 * neutral values a converter may write). Other scaling keys (original context
 * length and the like) mean nothing without those. */
static tide_status check_rope_scaling(const meta *m) {
    char type_key[96], factor_key[96], linear_key[96];
    snprintf(type_key, sizeof type_key, "%s.rope.scaling.type", m->arch);
    snprintf(factor_key, sizeof factor_key, "%s.rope.scaling.factor", m->arch);
    snprintf(linear_key, sizeof linear_key, "%s.rope.scale_linear", m->arch);
    tide_gguf_value v;
    const char *s;
    uint64_t len;
    double d;
    if (tide_gguf_get(m->g, type_key, &v)) {
        if (!tide_gguf_value_str(&v, &s, &len))
            return tide_err(m->ctx, TIDE_E_FORMAT, "%s: key '%s' is %s, expected string", m->path, type_key,
                            tide_gguf_type_name(v.type));
        if (len != 4 || memcmp(s, "none", 4))
            return tide_err(m->ctx, TIDE_E_UNSUPPORTED, "%s: key '%s' is '%.*s': rope scaling is not supported",
                            m->path, type_key, (int)(len < 40 ? len : 40), s);
    }
    const char *fk[2] = {factor_key, linear_key};
    for (int i = 0; i < 2; i++) {
        if (!tide_gguf_get(m->g, fk[i], &v)) continue;
        if (!tide_gguf_value_float(&v, &d))
            return tide_err(m->ctx, TIDE_E_FORMAT, "%s: key '%s' is %s, expected f32 or f64", m->path, fk[i],
                            tide_gguf_type_name(v.type));
        if (d != 1.0 && d != 0.0)
            return tide_err(m->ctx, TIDE_E_UNSUPPORTED, "%s: key '%s' is %g: rope scaling is not supported", m->path,
                            fk[i], d);
    }
    return TIDE_OK;
}

/* ---------------------------------------------------------------- open */

static int cmp_tensor_name(const void *a, const void *b) {
    return strcmp(((const tide_ck_tensor *)a)->name, ((const tide_ck_tensor *)b)->name);
}

static const char *shape_str(char *buf, size_t n, int ndim, const int64_t *s) {
    size_t k = (size_t)snprintf(buf, n, "(");
    for (int d = 0; d < ndim && k < n; d++) k += (size_t)snprintf(buf + k, n - k, d ? ", %lld" : "%lld", (long long)s[d]);
    if (k < n) snprintf(buf + k, n - k, ")");
    return buf;
}

/* Fills ck's config and tensors from the open file g. */
static tide_status load(tide_checkpoint *ck, const tide_gguf *g) {
    tide_ctx *ctx = ck->ctx;
    const char *path = tide_gguf_path(g);
    tide_status st;
    const char *as;
    uint64_t alen;
    tide_gguf_value av;
    if (!tide_gguf_get(g, "general.architecture", &av))
        return tide_err(ctx, TIDE_E_FORMAT, "%s: no key 'general.architecture': not a model", path);
    if ((st = tide_gguf_get_str(g, "general.architecture", &as, &alen))) return st;
    char arch[32];
    if (alen == 5 && !memcmp(as, "llama", 5)) snprintf(arch, sizeof arch, "llama");
    else if (alen == 5 && !memcmp(as, "qwen2", 5)) snprintf(arch, sizeof arch, "qwen2");
    else
        return tide_err(ctx, TIDE_E_UNSUPPORTED,
                        "%s: key 'general.architecture' is '%.*s': not supported (llama: Llama 1/2/3, Mistral; qwen2)",
                        path, (int)(alen < 64 ? alen : 64), as);
    meta m = {ctx, g, path, arch};
    tide_llama_config c;
    memset(&c, 0, sizeof c);
    c.rope_theta = 10000.0f;
    c.num_key_value_heads = -1;
    if ((st = meta_int(&m, "embedding_length", true, &c.hidden_size)) ||
        (st = meta_int(&m, "feed_forward_length", true, &c.intermediate_size)) ||
        (st = meta_int(&m, "block_count", true, &c.num_hidden_layers)) ||
        (st = meta_int(&m, "attention.head_count", true, &c.num_attention_heads)) ||
        (st = meta_int(&m, "attention.head_count_kv", false, &c.num_key_value_heads)) ||
        (st = meta_int(&m, "context_length", true, &c.max_position_embeddings)) ||
        (st = meta_float(&m, "attention.layer_norm_rms_epsilon", true, &c.rms_norm_eps)) ||
        (st = meta_float(&m, "rope.freq_base", false, &c.rope_theta)) || (st = check_rope_scaling(&m)))
        return st;
    if (c.num_key_value_heads == -1) c.num_key_value_heads = c.num_attention_heads;
    c.qk_interleaved = !strcmp(arch, "llama");
    int H = c.num_attention_heads, KV = c.num_key_value_heads, D = c.hidden_size;
    if (D % H || H % KV)
        return tide_err(ctx, TIDE_E_FORMAT,
                        "%s: inconsistent head counts: %s.attention.head_count %d, head_count_kv %d, embedding_length %d "
                        "(head_count must divide embedding_length and head_count_kv divide head_count)",
                        path, arch, H, KV, D);
    int hd = D / H, rope_dim = hd, klen = hd, vlen = hd;
    if ((st = meta_int(&m, "rope.dimension_count", false, &rope_dim)) ||
        (st = meta_int(&m, "attention.key_length", false, &klen)) ||
        (st = meta_int(&m, "attention.value_length", false, &vlen)))
        return st;
    if (klen != hd || vlen != hd)
        return tide_err(ctx, TIDE_E_UNSUPPORTED,
                        "%s: %s.attention.key_length %d / value_length %d differ from embedding_length/head_count = %d: "
                        "not supported",
                        path, arch, klen, vlen, hd);
    if (rope_dim != hd)
        return tide_err(ctx, TIDE_E_UNSUPPORTED,
                        "%s: %s.rope.dimension_count %d differs from the head dimension %d (partial rotary is not "
                        "supported)",
                        path, arch, rope_dim, hd);
    if (c.num_hidden_layers > TIDE_LLAMA_MAX_LAYERS)
        return tide_err(ctx, TIDE_E_UNSUPPORTED, "%s: %s.block_count %d: at most %d layers are supported", path, arch,
                        c.num_hidden_layers, TIDE_LLAMA_MAX_LAYERS);

    /* the tensors */
    int64_t n = tide_gguf_n_tensors(g);
    int L = c.num_hidden_layers;
    const bool qwen2 = !strcmp(arch, "qwen2");
    c.qkv_bias = qwen2;
    int n_want = 3 + L * N_LAYER_SLOTS; /* with output.weight and the bias slots */
    int64_t *slot = tide_malloc((size_t)n_want * sizeof *slot);
    if (!slot) return tide_err(ctx, TIDE_E_NOMEM, "%s: out of memory", path);
    for (int i = 0; i < n_want; i++) slot[i] = -1;
    st = TIDE_OK;
    for (int64_t i = 0; i < n && !st; i++) {
        const tide_gguf_tensor *t = tide_gguf_tensor_at(g, i);
        gg_name nm;
        switch (parse_name(t->name, &nm)) {
        case NAME_BIAS:
            st = tide_err(ctx, TIDE_E_UNSUPPORTED, "%s: tensor '%s': a bias tide's graph does not have (only q, k and "
                          "v biases, in qwen2 files)", path, t->name);
            continue;
        case NAME_ROPE_FREQS:
            st = tide_err(ctx, TIDE_E_UNSUPPORTED, "%s: tensor '%s': rope frequency factors (rope scaling) are not "
                          "supported", path, t->name);
            continue;
        case NAME_UNKNOWN:
            st = tide_err(ctx, TIDE_E_UNSUPPORTED, "%s: tensor '%s' is not one of a LLaMA model's", path, t->name);
            continue;
        case NAME_OK: break;
        }
        int s;
        if (nm.kind == T_EMBED) s = 0;
        else if (nm.kind == T_HEAD) s = 1;
        else if (nm.kind == T_NORM) s = 2;
        else if (nm.layer >= L) {
            st = tide_err(ctx, TIDE_E_FORMAT, "%s: tensor '%s' is of layer %d, but %s.block_count is %d", path,
                          t->name, nm.layer, arch, L);
            continue;
        } else if (nm.entry >= N_LAYER_NAMES && !qwen2) {
            st = tide_err(ctx, TIDE_E_UNSUPPORTED, "%s: tensor '%s': biases are not part of a '%s' model (only qwen2 "
                          "has q, k and v biases)", path, t->name, arch);
            continue;
        } else s = 3 + nm.layer * N_LAYER_SLOTS + nm.entry;
        if (slot[s] >= 0) /* "blk.1" and "blk.01" */
            st = tide_err(ctx, TIDE_E_FORMAT, "%s: tensors '%s' and '%s' are the same weight", path,
                          tide_gguf_tensor_at(g, slot[s])->name, t->name);
        slot[s] = i;
    }
    const tide_gguf_tensor *embed = slot[0] >= 0 ? tide_gguf_tensor_at(g, slot[0]) : NULL;
    if (!st && !embed)
        st = tide_err(ctx, TIDE_E_FORMAT, "%s: tensor 'token_embd.weight' (model.embed_tokens.weight) is missing", path);
    if (!st && (embed->n_dims != 2 || embed->ne[0] != (uint64_t)D || embed->ne[1] == 0 || embed->ne[1] > INT32_MAX))
        st = tide_err(ctx, TIDE_E_FORMAT,
                      "%s: tensor 'token_embd.weight' has ne (%llu, %llu) in %d dims, expected (%d, vocab)", path,
                      (unsigned long long)embed->ne[0], (unsigned long long)embed->ne[1], embed->n_dims, D);
    if (st) {
        tide_free(slot);
        return st;
    }
    c.vocab_size = (int)embed->ne[1];
    int vs = c.vocab_size;
    if ((st = meta_int(&m, "vocab_size", false, &vs)) ||
        (vs != c.vocab_size && (st = tide_err(ctx, TIDE_E_FORMAT,
                                              "%s: %s.vocab_size %d differs from token_embd.weight's %d rows", path,
                                              arch, vs, c.vocab_size)))) {
        tide_free(slot);
        return st;
    }
    c.tie_word_embeddings = slot[1] < 0;

    /* each tensor there, with its shape; the types */
    int counts[TIDE_DTYPE_COUNT] = {0};
    int norm_type = -1;
    const char *norm_first = NULL;
    c.wtypes_set = true;
    if (tide_grow((void **)&ck->tensors, &ck->cap_tensors, n_want, sizeof *ck->tensors)) {
        tide_free(slot);
        return tide_err(ctx, TIDE_E_NOMEM, "%s: out of memory", path);
    }
    for (int s = 0; s < n_want && !st; s++) {
        gg_name nm = {0, 0, 0};
        int64_t want[2];
        int ndim = 2;
        const char *e = NULL; /* a layer tensor's llama.cpp suffix */
        if (s == 0) nm.kind = T_EMBED, want[0] = c.vocab_size, want[1] = D;
        else if (s == 1) nm.kind = T_HEAD, want[0] = c.vocab_size, want[1] = D;
        else if (s == 2) nm.kind = T_NORM, ndim = 1, want[0] = D;
        else {
            nm.layer = (s - 3) / N_LAYER_SLOTS;
            nm.entry = (s - 3) % N_LAYER_SLOTS;
            if (nm.entry >= N_LAYER_NAMES && !qwen2) continue; /* no bias slots */
            e = layer_names[nm.entry < N_LAYER_NAMES ? nm.entry : 1 + nm.entry - N_LAYER_NAMES].gg;
            if (nm.entry >= N_LAYER_NAMES)
                ndim = 1, want[0] = nm.entry == N_LAYER_NAMES ? (int64_t)H * hd : (int64_t)KV * hd;
            else if (layer_names[nm.entry].role < 0) ndim = 1, want[0] = D;
            else if (!strcmp(e, "attn_q")) want[0] = (int64_t)H * hd, want[1] = D;
            else if (!strcmp(e, "attn_k") || !strcmp(e, "attn_v")) want[0] = (int64_t)KV * hd, want[1] = D;
            else if (!strcmp(e, "attn_output")) want[0] = D, want[1] = (int64_t)H * hd;
            else if (!strcmp(e, "ffn_down")) want[0] = D, want[1] = c.intermediate_size;
            else want[0] = c.intermediate_size, want[1] = D;
        }
        char *hf = hf_name(&nm);
        if (!hf) {
            st = tide_err(ctx, TIDE_E_NOMEM, "%s: out of memory", path);
            break;
        }
        if (slot[s] < 0) {
            if (s != 1) {
                char gname[96];
                if (s == 2) snprintf(gname, sizeof gname, "output_norm.weight");
                else if (nm.entry >= N_LAYER_NAMES) snprintf(gname, sizeof gname, "blk.%d.%s.bias", nm.layer, e);
                else snprintf(gname, sizeof gname, "blk.%d.%s.weight", nm.layer, e);
                st = tide_err(ctx, TIDE_E_FORMAT, "%s: tensor '%s' (%s) is missing", path, gname, hf);
            }
            tide_free(hf);
            continue;
        }
        const tide_gguf_tensor *t = tide_gguf_tensor_at(g, slot[s]);
        tide_ck_tensor ct;
        memset(&ct, 0, sizeof ct);
        ct.name = hf;
        ct.dtype = t->dtype;
        ct.ndim = t->n_dims;
        for (int d = 0; d < t->n_dims; d++) ct.shape[d] = (int64_t)t->ne[t->n_dims - 1 - d];
        ct.nbytes = t->nbytes;
        ct.offset = t->file_offset;
        ct.file = 0;
        ck->tensors[ck->n_tensors++] = ct; /* freed with ck from here */
        bool same = ct.ndim == ndim;
        for (int d = 0; same && d < ndim; d++) same = ct.shape[d] == want[d];
        if (!same) {
            char a[96], b[96];
            st = tide_err(ctx, TIDE_E_FORMAT, "%s: tensor '%s' (%s): shape %s, the metadata implies %s", path, t->name,
                          hf, shape_str(a, sizeof a, ct.ndim, ct.shape), shape_str(b, sizeof b, ndim, want));
            continue;
        }
        if (ndim == 1) {
            if (tide_dtype_is_quantized(t->dtype) || t->dtype == TIDE_I32)
                st = tide_err(ctx, TIDE_E_UNSUPPORTED, "%s: tensor '%s' (%s): a norm or bias vector in %s is not "
                              "supported (f32, f16, bf16)", path, t->name, hf, tide_dtype_name(t->dtype));
            else if (norm_type >= 0 && norm_type != (int)t->dtype)
                st = tide_err(ctx, TIDE_E_UNSUPPORTED, "%s: tensor '%s' is %s but '%s' is %s: norm and bias vectors "
                              "of different types are not supported", path, t->name, tide_dtype_name(t->dtype),
                              norm_first, tide_dtype_name((tide_dtype)norm_type));
            norm_type = (int)t->dtype, norm_first = t->name;
            c.wtypes.norm = (uint8_t)t->dtype;
        } else if (s == 0) {
            c.wtypes.embed = (uint8_t)t->dtype;
        } else if (s == 1) {
            c.wtypes.head = (uint8_t)t->dtype;
        } else {
            c.wtypes.layer[nm.layer][layer_names[nm.entry].role] = (uint8_t)t->dtype;
            counts[t->dtype]++;
        }
    }
    tide_free(slot);
    if (st) return st;
    if (c.tie_word_embeddings) c.wtypes.head = c.wtypes.embed;
    int best = 0;
    for (int d = 1; d < TIDE_DTYPE_COUNT; d++)
        if (counts[d] > counts[best]) best = d;
    c.dtype = (tide_dtype)best;
    const char *gn;
    uint64_t gl;
    tide_gguf_value nv;
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    if (tide_gguf_get(g, "general.name", &nv) && tide_gguf_value_str(&nv, &gn, &gl) && gl > 0 &&
        !memchr(gn, 0, (size_t)gl))
        snprintf(c.name, sizeof c.name, "%.*s", (int)(gl < sizeof c.name ? gl : sizeof c.name - 1), gn);
    else
        snprintf(c.name, sizeof c.name, "%.*s", (int)strcspn(base, "."), base);
    if (tide_llama_config_check(ctx, &c)) {
        char msg[TIDE_ERRMSG_MAX];
        snprintf(msg, sizeof msg, "%s", tide_ctx_last_error(ctx));
        return tide_err(ctx, TIDE_E_FORMAT, "%s: %s", path, msg);
    }
    ck->cfg = c;
    if (ck->n_tensors > 1) qsort(ck->tensors, (size_t)ck->n_tensors, sizeof *ck->tensors, cmp_tensor_name);
    return TIDE_OK;
}

tide_status tide_checkpoint_open_gguf(tide_ctx *ctx, const char *path, tide_checkpoint **out) {
    *out = NULL;
    tide_checkpoint *ck = tide_calloc(1, sizeof *ck);
    if (!ck) return tide_err(ctx, TIDE_E_NOMEM, "out of memory opening checkpoint %s", path);
    ck->ctx = ctx;
    tide_status st = tide_gguf_open(ctx, path, &ck->gguf);
    if (!st && (!(ck->dir = tide_strdup(path)) ||
                tide_grow((void **)&ck->files, &ck->cap_files, 1, sizeof *ck->files)))
        st = tide_err(ctx, TIDE_E_NOMEM, "out of memory opening checkpoint %s", path);
    if (!st) {
        tide_ck_file *f = &ck->files[0];
        memset(f, 0, sizeof *f);
        ck->n_files = 1;
        f->borrowed = true; /* the mapping and fd are ck->gguf's */
        f->fd = tide_gguf_fd(ck->gguf);
        f->map = tide_gguf_map(ck->gguf);
        f->size = tide_gguf_size(ck->gguf);
        f->data_start = tide_gguf_data_start(ck->gguf);
        const char *base = strrchr(path, '/');
        if (!(f->path = tide_strdup(path)) || !(f->name = tide_strdup(base ? base + 1 : path)))
            st = tide_err(ctx, TIDE_E_NOMEM, "out of memory opening checkpoint %s", path);
    }
    if (!st) st = load(ck, ck->gguf);
    if (st) {
        tide_checkpoint_free(ck);
        return st;
    }
    *out = ck;
    return TIDE_OK;
}
