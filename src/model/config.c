/*
 * config.c - LLaMA configurations: the built-in ones with true shapes, the
 * check of a configuration's values, parameter counts, and reading and writing
 * Hugging Face config.json files.
 *
 * A config.json is accepted when it describes a plain LLaMA decoder
 * (architectures ["LlamaForCausalLM"] and/or model_type "llama", SiLU MLP, no
 * biases, no RoPE scaling) or a Qwen2 one (["Qwen2ForCausalLM"] / "qwen2": the
 * same with biases on q, k and v, no sliding window). Fields HF gives defaults to (num_key_value_heads,
 * rope_theta, tie_word_embeddings, torch_dtype) get HF's defaults here, except
 * torch_dtype, whose absence means f32 as in PyTorch. Every shape field is
 * required. Problems with the content are TIDE_E_FORMAT naming the file and the
 * field; a valid file for a model tide does not run is TIDE_E_UNSUPPORTED.
 */
#include "core/core.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Largest accepted dimension and layer count: keep every product of two sizes
 * far inside int64 and every config readable by int arithmetic. */
#define DIM_MAX (1 << 24)
#define LAYERS_MAX (1 << 16)
#define CONFIG_FILE_MAX (16u << 20)

typedef struct builtin {
    const char *name;
    int hidden, inter, layers, heads, kv_heads, vocab, max_pos;
    float eps;
} builtin;

static const builtin builtins[] = {
    {"tinyllama-1.1b", 2048, 5632, 22, 32, 4, 32000, 2048, 1e-5f},
    {"llama-7b", 4096, 11008, 32, 32, 32, 32000, 2048, 1e-6f},
    {"llama-13b", 5120, 13824, 40, 40, 40, 32000, 2048, 1e-6f},
    {"llama-65b", 8192, 22016, 80, 64, 64, 32000, 2048, 1e-5f},
    {"llama-2-70b", 8192, 28672, 80, 64, 8, 32000, 4096, 1e-5f},
    /* Llama 3.1 405B's shape (its config.json; rope theta 500000, the
     * long-context scaling of its rope not modelled) */
    {"llama-3.1-405b", 16384, 53248, 126, 128, 8, 128256, 131072, 1e-5f},
    /* the training demonstration's model: tinyllama's proportions (head_dim
     * 32, 4 query heads per kv head, intermediate 2.75x hidden), 4 layers
     * and a 2048-token vocabulary, so a step takes well under a second on
     * two cores */
    {"tinyllama-mini", 256, 704, 4, 8, 2, 2048, 2048, 1e-5f},
};
#define N_BUILTINS (sizeof builtins / sizeof builtins[0])

static const char *const builtin_names[N_BUILTINS + 1] = {
    "tinyllama-1.1b", "llama-7b", "llama-13b", "llama-65b", "llama-2-70b", "llama-3.1-405b", "tinyllama-mini", NULL,
};

const char *const *tide_llama_config_names(void) { return builtin_names; }

/* Returns TIDE_OK with *cfg filled, or TIDE_E_NOT_FOUND listing the names. */
tide_status tide_llama_config_named(tide_ctx *ctx, const char *name, tide_llama_config *cfg) {
    for (size_t i = 0; name && i < N_BUILTINS; i++) {
        const builtin *b = &builtins[i];
        if (strcmp(name, b->name) != 0) continue;
        memset(cfg, 0, sizeof *cfg);
        snprintf(cfg->name, sizeof cfg->name, "%s", b->name);
        cfg->hidden_size = b->hidden;
        cfg->intermediate_size = b->inter;
        cfg->num_hidden_layers = b->layers;
        cfg->num_attention_heads = b->heads;
        cfg->num_key_value_heads = b->kv_heads;
        cfg->vocab_size = b->vocab;
        cfg->max_position_embeddings = b->max_pos;
        cfg->rms_norm_eps = b->eps;
        cfg->rope_theta = strncmp(b->name, "llama-3", 7) ? 10000.0f : 500000.0f;
        cfg->tie_word_embeddings = false;
        cfg->dtype = TIDE_BF16;
        return TIDE_OK;
    }
    char list[256] = "";
    for (size_t i = 0; i < N_BUILTINS; i++) {
        strncat(list, i ? ", " : "", sizeof list - strlen(list) - 1);
        strncat(list, builtins[i].name, sizeof list - strlen(list) - 1);
    }
    return tide_err(ctx, TIDE_E_NOT_FOUND, "unknown model config '%s' (known: %s)",
                    name ? name : "(null)", list);
}

/* The value checks shared by check() and load(). Returns NULL when cfg is
 * valid, else a message naming the field, written into buf. */
static bool weight_dtype_ok(int dt) {
    return dt == TIDE_F32 || dt == TIDE_F16 || dt == TIDE_BF16 || tide_dtype_is_quantized((tide_dtype)dt);
}

static const char *config_problem(const tide_llama_config *cfg, char *buf, size_t n) {
    struct { const char *field; int v, max; } sizes[] = {
        {"hidden_size", cfg->hidden_size, DIM_MAX},
        {"intermediate_size", cfg->intermediate_size, DIM_MAX},
        {"num_hidden_layers", cfg->num_hidden_layers, LAYERS_MAX},
        {"num_attention_heads", cfg->num_attention_heads, DIM_MAX},
        {"num_key_value_heads", cfg->num_key_value_heads, DIM_MAX},
        {"vocab_size", cfg->vocab_size, DIM_MAX},
        {"max_position_embeddings", cfg->max_position_embeddings, DIM_MAX},
    };
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        if (sizes[i].v <= 0) {
            snprintf(buf, n, "%s is %d, must be positive", sizes[i].field, sizes[i].v);
            return buf;
        }
        if (sizes[i].v > sizes[i].max) {
            snprintf(buf, n, "%s is %d, larger than the supported %d", sizes[i].field,
                     sizes[i].v, sizes[i].max);
            return buf;
        }
    }
    if (cfg->hidden_size % cfg->num_attention_heads != 0) {
        snprintf(buf, n, "num_attention_heads (%d) does not divide hidden_size (%d)",
                 cfg->num_attention_heads, cfg->hidden_size);
        return buf;
    }
    if (cfg->num_attention_heads % cfg->num_key_value_heads != 0) {
        snprintf(buf, n, "num_key_value_heads (%d) does not divide num_attention_heads (%d)",
                 cfg->num_key_value_heads, cfg->num_attention_heads);
        return buf;
    }
    int head_dim = cfg->hidden_size / cfg->num_attention_heads;
    if (head_dim % 2 != 0) {
        snprintf(buf, n, "head dimension hidden_size/num_attention_heads = %d is odd (RoPE needs pairs)",
                 head_dim);
        return buf;
    }
    if (!(cfg->rms_norm_eps > 0.0f) || !isfinite(cfg->rms_norm_eps)) {
        snprintf(buf, n, "rms_norm_eps is %g, must be positive and finite", (double)cfg->rms_norm_eps);
        return buf;
    }
    if (!(cfg->rope_theta > 0.0f) || !isfinite(cfg->rope_theta)) {
        snprintf(buf, n, "rope_theta is %g, must be positive and finite", (double)cfg->rope_theta);
        return buf;
    }
    if (!weight_dtype_ok(cfg->dtype)) {
        snprintf(buf, n, "torch_dtype %s is not a weight dtype (f32, f16, bf16 or a block type)",
                 tide_dtype_name(cfg->dtype));
        return buf;
    }
    if (cfg->wtypes_set) {
        const tide_llama_wtypes *w = &cfg->wtypes;
        if (cfg->num_hidden_layers > TIDE_LLAMA_MAX_LAYERS) {
            snprintf(buf, n, "%d layers with per-weight types (at most %d)", cfg->num_hidden_layers,
                     TIDE_LLAMA_MAX_LAYERS);
            return buf;
        }
        bool ok = weight_dtype_ok(w->embed) && weight_dtype_ok(w->head) && weight_dtype_ok(w->norm) &&
                  !tide_dtype_is_quantized(w->norm);
        for (int L = 0; L < cfg->num_hidden_layers && ok; L++)
            for (int r = 0; r < TIDE_W_LAYER_ROLES; r++) ok = ok && weight_dtype_ok(w->layer[L][r]);
        if (!ok) {
            snprintf(buf, n, "a per-weight type is not a weight dtype (norms f32, f16 or bf16)");
            return buf;
        }
    }
    return NULL;
}

/* The role of a Hugging Face weight name: -1 embed, -2 head, -3 norm, 0..6 a
 * layer's projection (*layer set), -4 unknown. */
static int weight_role(const char *name, int *layer) {
    static const char *const roles[TIDE_W_LAYER_ROLES] = {
        "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
        "mlp.gate_proj.weight",    "mlp.up_proj.weight",      "mlp.down_proj.weight"};
    if (strcmp(name, "model.embed_tokens.weight") == 0) return -1;
    if (strcmp(name, "lm_head.weight") == 0) return -2;
    if (strcmp(name, "model.norm.weight") == 0) return -3;
    int L, len = 0;
    if (sscanf(name, "model.layers.%d.%n", &L, &len) != 1 || len == 0 || L < 0) return -4;
    const char *rest = name + len;
    if (strcmp(rest, "input_layernorm.weight") == 0 || strcmp(rest, "post_attention_layernorm.weight") == 0 ||
        strcmp(rest, "self_attn.q_proj.bias") == 0 || strcmp(rest, "self_attn.k_proj.bias") == 0 ||
        strcmp(rest, "self_attn.v_proj.bias") == 0)
        return -3; /* the vectors: norms and biases, one type */
    for (int r = 0; r < TIDE_W_LAYER_ROLES; r++)
        if (strcmp(rest, roles[r]) == 0) {
            *layer = L;
            return r;
        }
    return -4;
}

tide_dtype tide_llama_weight_dtype(const tide_llama_config *cfg, const char *name) {
    int L = 0, r = weight_role(name, &L);
    if (!cfg->wtypes_set) {
        if (r == -3 && tide_dtype_is_quantized(cfg->dtype)) return TIDE_F32;
        return cfg->dtype;
    }
    const tide_llama_wtypes *w = &cfg->wtypes;
    switch (r) {
    case -1: return (tide_dtype)w->embed;
    case -2: return (tide_dtype)(cfg->tie_word_embeddings ? w->embed : w->head);
    case -3: return (tide_dtype)w->norm;
    case -4: return cfg->dtype;
    default: return L < TIDE_LLAMA_MAX_LAYERS ? (tide_dtype)w->layer[L][r] : cfg->dtype;
    }
}

/* Returns TIDE_OK, or TIDE_E_INVALID naming the first bad field. */
tide_status tide_llama_config_check(tide_ctx *ctx, const tide_llama_config *cfg) {
    if (!cfg) return tide_err(ctx, TIDE_E_INVALID, "no model config given");
    char buf[256];
    const char *p = config_problem(cfg, buf, sizeof buf);
    if (p) return tide_err(ctx, TIDE_E_INVALID, "model config '%.64s': %s", cfg->name, p);
    return TIDE_OK;
}

/* Returns the number of parameters: embeddings, per layer two norm vectors,
 * the four attention projections and the three MLP matrices, the final norm,
 * and the output head unless it is tied to the embeddings. */
uint64_t tide_llama_config_params(const tide_llama_config *cfg) {
    uint64_t D = (uint64_t)cfg->hidden_size, I = (uint64_t)cfg->intermediate_size;
    uint64_t V = (uint64_t)cfg->vocab_size, L = (uint64_t)cfg->num_hidden_layers;
    uint64_t H = (uint64_t)cfg->num_attention_heads, KV = (uint64_t)cfg->num_key_value_heads;
    uint64_t hd = H ? D / H : 0;
    uint64_t layer = 2 * D                 /* input and post-attention norms */
                     + D * H * hd          /* q_proj */
                     + 2 * D * KV * hd     /* k_proj, v_proj */
                     + H * hd * D          /* o_proj */
                     + 3 * D * I           /* gate, up, down */
                     + (cfg->qkv_bias ? H * hd + 2 * KV * hd : 0); /* Qwen2's q, k, v biases */
    return V * D + L * layer + D + (cfg->tie_word_embeddings ? 0 : V * D);
}

/* ---------------------------------------------------------------- loading */


/* Line and column of byte offset off in text, for parse error messages. */
static void line_col(const char *text, size_t off, int *line, int *col) {
    *line = 1;
    *col = 1;
    for (size_t i = 0; i < off && text[i]; i++) {
        if (text[i] == '\n') {
            (*line)++;
            *col = 1;
        } else {
            (*col)++;
        }
    }
}

/* Reads a required or optional integer field. Returns TIDE_OK (with *v set
 * when present), TIDE_E_FORMAT if wrong type, non-integral or out of int
 * range, or missing while required. */
static tide_status get_int(tide_ctx *ctx, const char *path, const cJSON *root, const char *field,
                           bool required, int *v) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, field);
    if (!it || (!required && cJSON_IsNull(it))) {
        if (required) return tide_err(ctx, TIDE_E_FORMAT, "%s: missing field '%s'", path, field);
        return TIDE_OK;
    }
    if (!cJSON_IsNumber(it))
        return tide_err(ctx, TIDE_E_FORMAT, "%s: field '%s' must be an integer", path, field);
    double d = it->valuedouble;
    if (d != floor(d) || d < (double)INT_MIN || d > (double)INT_MAX)
        return tide_err(ctx, TIDE_E_FORMAT, "%s: field '%s' is %g, not an integer", path, field, d);
    *v = (int)d;
    return TIDE_OK;
}

static tide_status get_float(tide_ctx *ctx, const char *path, const cJSON *root,
                             const char *field, bool required, float *v) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, field);
    if (!it || (!required && cJSON_IsNull(it))) {
        if (required) return tide_err(ctx, TIDE_E_FORMAT, "%s: missing field '%s'", path, field);
        return TIDE_OK;
    }
    if (!cJSON_IsNumber(it))
        return tide_err(ctx, TIDE_E_FORMAT, "%s: field '%s' must be a number", path, field);
    *v = (float)it->valuedouble;
    return TIDE_OK;
}

static tide_status get_bool(tide_ctx *ctx, const char *path, const cJSON *root, const char *field,
                            bool *v) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, field);
    if (!it || cJSON_IsNull(it)) return TIDE_OK;
    if (!cJSON_IsBool(it))
        return tide_err(ctx, TIDE_E_FORMAT, "%s: field '%s' must be true or false", path, field);
    *v = cJSON_IsTrue(it);
    return TIDE_OK;
}

/* The fields that say which model this is, and the ones whose non-default
 * values change the computation in ways tide does not implement. */
static tide_status check_architecture(tide_ctx *ctx, const char *path, const cJSON *root, bool *qwen2) {
    const cJSON *arch = cJSON_GetObjectItemCaseSensitive(root, "architectures");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    bool have_arch = arch && !cJSON_IsNull(arch), have_type = type && !cJSON_IsNull(type);
    if (!have_arch && !have_type)
        return tide_err(ctx, TIDE_E_FORMAT,
                        "%s: missing field 'model_type' (and no 'architectures'): cannot tell the "
                        "architecture", path);
    if (have_type) {
        if (!cJSON_IsString(type))
            return tide_err(ctx, TIDE_E_FORMAT, "%s: field 'model_type' must be a string", path);
        *qwen2 = strcmp(type->valuestring, "qwen2") == 0;
        if (strcmp(type->valuestring, "llama") != 0 && !*qwen2)
            return tide_err(ctx, TIDE_E_UNSUPPORTED,
                            "%s: model_type '%s' is not supported (only 'llama' and 'qwen2')", path,
                            type->valuestring);
    }
    if (have_arch) {
        if (!cJSON_IsArray(arch) || cJSON_GetArraySize(arch) == 0)
            return tide_err(ctx, TIDE_E_FORMAT,
                            "%s: field 'architectures' must be a non-empty array of strings", path);
        const cJSON *a;
        cJSON_ArrayForEach(a, arch) {
            if (!cJSON_IsString(a))
                return tide_err(ctx, TIDE_E_FORMAT,
                                "%s: field 'architectures' must hold only strings", path);
            bool q = strcmp(a->valuestring, "Qwen2ForCausalLM") == 0;
            if ((strcmp(a->valuestring, "LlamaForCausalLM") != 0 && !q) || (have_type && q != *qwen2))
                return tide_err(ctx, TIDE_E_UNSUPPORTED,
                                "%s: architecture '%s' is not supported (LlamaForCausalLM or "
                                "Qwen2ForCausalLM, as model_type says)", path, a->valuestring);
            *qwen2 = q;
        }
    }
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
    if (rs && !cJSON_IsNull(rs))
        return tide_err(ctx, TIDE_E_UNSUPPORTED,
                        "%s: rope_scaling is set; RoPE scaling is not supported", path);
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(root, "hidden_act");
    if (act && !cJSON_IsNull(act)) {
        if (!cJSON_IsString(act))
            return tide_err(ctx, TIDE_E_FORMAT, "%s: field 'hidden_act' must be a string", path);
        if (strcmp(act->valuestring, "silu") != 0)
            return tide_err(ctx, TIDE_E_UNSUPPORTED,
                            "%s: hidden_act '%s' is not supported (only 'silu')", path,
                            act->valuestring);
    }
    if (*qwen2) {
        /* Qwen2: biases on q, k, v (always), no sliding window */
        bool sw = false;
        tide_status st = get_bool(ctx, path, root, "use_sliding_window", &sw);
        if (st) return st;
        if (sw)
            return tide_err(ctx, TIDE_E_UNSUPPORTED, "%s: use_sliding_window is true; sliding-window "
                            "attention is not supported", path);
        return TIDE_OK;
    }
    static const char *const bias_fields[] = {"attention_bias", "mlp_bias"};
    for (size_t i = 0; i < 2; i++) {
        bool b = false;
        tide_status st = get_bool(ctx, path, root, bias_fields[i], &b);
        if (st) return st;
        if (b)
            return tide_err(ctx, TIDE_E_UNSUPPORTED, "%s: %s is true; biases are not supported",
                            path, bias_fields[i]);
    }
    return TIDE_OK;
}

/* Fills cfg->name from "_name_or_path", else the name of the directory
 * holding the file. */
static void config_name(const cJSON *root, const char *path, tide_llama_config *cfg) {
    const cJSON *np = cJSON_GetObjectItemCaseSensitive(root, "_name_or_path");
    if (cJSON_IsString(np) && np->valuestring[0]) {
        snprintf(cfg->name, sizeof cfg->name, "%s", np->valuestring);
        return;
    }
    const char *end = strrchr(path, '/');
    if (!end) {
        snprintf(cfg->name, sizeof cfg->name, "config");
        return;
    }
    const char *start = end;
    while (start > path && start[-1] != '/') start--;
    if (start == end || (end - start == 1 && *start == '.')) {
        snprintf(cfg->name, sizeof cfg->name, "config");
        return;
    }
    snprintf(cfg->name, sizeof cfg->name, "%.*s", (int)(end - start), start);
}

static tide_status parse_config(tide_ctx *ctx, const char *path, const cJSON *root,
                                tide_llama_config *cfg) {
    if (!cJSON_IsObject(root))
        return tide_err(ctx, TIDE_E_FORMAT, "%s: not a JSON object", path);
    tide_llama_config c;
    memset(&c, 0, sizeof c);
    c.rope_theta = 10000.0f;
    c.dtype = TIDE_F32;
    c.num_key_value_heads = -1;
    bool qwen2 = false;
    tide_status st = check_architecture(ctx, path, root, &qwen2);
    if (st) return st;
    c.qkv_bias = qwen2;
    if ((st = get_int(ctx, path, root, "hidden_size", true, &c.hidden_size)) ||
        (st = get_int(ctx, path, root, "intermediate_size", true, &c.intermediate_size)) ||
        (st = get_int(ctx, path, root, "num_hidden_layers", true, &c.num_hidden_layers)) ||
        (st = get_int(ctx, path, root, "num_attention_heads", true, &c.num_attention_heads)) ||
        (st = get_int(ctx, path, root, "num_key_value_heads", false, &c.num_key_value_heads)) ||
        (st = get_int(ctx, path, root, "vocab_size", true, &c.vocab_size)) ||
        (st = get_int(ctx, path, root, "max_position_embeddings", true,
                      &c.max_position_embeddings)) ||
        (st = get_float(ctx, path, root, "rms_norm_eps", true, &c.rms_norm_eps)) ||
        (st = get_float(ctx, path, root, "rope_theta", false, &c.rope_theta)) ||
        (st = get_bool(ctx, path, root, "tie_word_embeddings", &c.tie_word_embeddings)))
        return st;
    if (c.num_key_value_heads == -1) c.num_key_value_heads = c.num_attention_heads;

    /* transformers 5 moves rope_theta into "rope_parameters" (with a rope_type);
     * a top-level rope_theta, when present, agrees with it. */
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(root, "rope_parameters");
    if (rp && !cJSON_IsNull(rp)) {
        if (!cJSON_IsObject(rp))
            return tide_err(ctx, TIDE_E_FORMAT, "%s: field 'rope_parameters' must be an object", path);
        const cJSON *rt = cJSON_GetObjectItemCaseSensitive(rp, "rope_type");
        if (rt && !cJSON_IsNull(rt) && (!cJSON_IsString(rt) || strcmp(rt->valuestring, "default") != 0))
            return tide_err(ctx, TIDE_E_UNSUPPORTED, "%s: rope_parameters.rope_type '%s' is not supported "
                            "(only 'default')", path, cJSON_IsString(rt) ? rt->valuestring : "?");
        if (!cJSON_GetObjectItemCaseSensitive(root, "rope_theta") &&
            (st = get_float(ctx, path, rp, "rope_theta", false, &c.rope_theta)))
            return st;
    }

    /* transformers >= 4.56 writes "dtype"; older versions "torch_dtype". */
    const char *dt_field = "torch_dtype";
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(root, dt_field);
    if (!dt || cJSON_IsNull(dt)) {
        dt_field = "dtype";
        dt = cJSON_GetObjectItemCaseSensitive(root, dt_field);
    }
    if (dt && !cJSON_IsNull(dt)) {
        if (!cJSON_IsString(dt))
            return tide_err(ctx, TIDE_E_FORMAT, "%s: field '%s' must be a string", path, dt_field);
        const char *s = dt->valuestring;
        if (strcmp(s, "float32") == 0) c.dtype = TIDE_F32;
        else if (strcmp(s, "float16") == 0) c.dtype = TIDE_F16;
        else if (strcmp(s, "bfloat16") == 0) c.dtype = TIDE_BF16;
        else
            return tide_err(ctx, TIDE_E_UNSUPPORTED,
                            "%s: %s '%s' is not supported (float32, float16 or bfloat16)", path,
                            dt_field, s);
    }
    int head_dim = 0;
    if ((st = get_int(ctx, path, root, "head_dim", false, &head_dim))) return st;
    if (head_dim != 0 && c.num_attention_heads > 0 &&
        (int64_t)head_dim * c.num_attention_heads != c.hidden_size)
        return tide_err(ctx, TIDE_E_UNSUPPORTED,
                        "%s: head_dim %d differs from hidden_size/num_attention_heads; not "
                        "supported", path, head_dim);
    char buf[256];
    const char *p = config_problem(&c, buf, sizeof buf);
    if (p) return tide_err(ctx, TIDE_E_FORMAT, "%s: %s", path, p);
    config_name(root, path, &c);
    *cfg = c;
    return TIDE_OK;
}

/* Returns TIDE_OK with *cfg filled; TIDE_E_NOT_FOUND or TIDE_E_IO when the file
 * cannot be read; TIDE_E_FORMAT or TIDE_E_UNSUPPORTED naming the file and
 * field. *cfg is unchanged on failure. */
tide_status tide_llama_config_load(tide_ctx *ctx, const char *path, tide_llama_config *cfg) {
    if (!path || !cfg) return tide_err(ctx, TIDE_E_INVALID, "config_load: NULL argument");
    char *text = NULL;
    size_t len = 0;
    tide_status st = tide_read_text_file(ctx, path, CONFIG_FILE_MAX, &text, &len);
    if (st) return st;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, false);
    if (!root) {
        int line, col;
        size_t off = end ? (size_t)(end - text) : 0;
        line_col(text, off, &line, &col);
        tide_free(text);
        return tide_err(ctx, TIDE_E_FORMAT, "%s: malformed JSON near line %d column %d", path,
                        line, col);
    }
    /* Only whitespace may follow the object. */
    for (const char *q = end; q && q < text + len; q++) {
        if (*q != ' ' && *q != '\t' && *q != '\n' && *q != '\r') {
            int line, col;
            line_col(text, (size_t)(q - text), &line, &col);
            cJSON_Delete(root);
            tide_free(text);
            return tide_err(ctx, TIDE_E_FORMAT,
                            "%s: malformed JSON: trailing text at line %d column %d", path, line,
                            col);
        }
    }
    st = parse_config(ctx, path, root, cfg);
    cJSON_Delete(root);
    tide_free(text);
    return st;
}

/* ---------------------------------------------------------------- saving */

/* A float as the shortest decimal that reads back as the same float, so that
 * 1e-5f is written "1e-05" and not 9.99999974737875e-06. */
static double float_decimal(float f) {
    char buf[32];
    for (int prec = 1; prec <= 9; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, (double)f);
        if (strtof(buf, NULL) == f) return strtod(buf, NULL);
    }
    return (double)f;
}

static const char *torch_dtype_name(tide_dtype dt) {
    switch (dt) {
    case TIDE_F16: return "float16";
    case TIDE_BF16: return "bfloat16";
    default: return "float32";
    }
}

/* Builds the JSON text of cfg (caller frees with cJSON_free); NULL when out of
 * memory. */
static char *config_json(const tide_llama_config *cfg) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    bool ok = true;
    cJSON *arch = cJSON_CreateArray();
    cJSON *name = arch ? cJSON_CreateString(cfg->qkv_bias ? "Qwen2ForCausalLM" : "LlamaForCausalLM") : NULL;
    if (arch && name) cJSON_AddItemToArray(arch, name);
    if (arch && name) cJSON_AddItemToObject(o, "architectures", arch);
    else {
        cJSON_Delete(arch);
        ok = false;
    }
    ok = ok && cJSON_AddStringToObject(o, "_name_or_path", cfg->name);
    ok = ok && cJSON_AddBoolToObject(o, "attention_bias", false);
    ok = ok && cJSON_AddNumberToObject(o, "attention_dropout", 0.0);
    ok = ok && cJSON_AddNumberToObject(o, "bos_token_id", 1);
    ok = ok && cJSON_AddNumberToObject(o, "eos_token_id", 2);
    ok = ok && cJSON_AddNumberToObject(o, "head_dim",
                                        cfg->hidden_size / cfg->num_attention_heads);
    ok = ok && cJSON_AddStringToObject(o, "hidden_act", "silu");
    ok = ok && cJSON_AddNumberToObject(o, "hidden_size", cfg->hidden_size);
    ok = ok && cJSON_AddNumberToObject(o, "initializer_range", 0.02);
    ok = ok && cJSON_AddNumberToObject(o, "intermediate_size", cfg->intermediate_size);
    ok = ok && cJSON_AddNumberToObject(o, "max_position_embeddings",
                                        cfg->max_position_embeddings);
    ok = ok && cJSON_AddBoolToObject(o, "mlp_bias", false);
    ok = ok && cJSON_AddStringToObject(o, "model_type", cfg->qkv_bias ? "qwen2" : "llama");
    ok = ok && cJSON_AddNumberToObject(o, "num_attention_heads", cfg->num_attention_heads);
    ok = ok && cJSON_AddNumberToObject(o, "num_hidden_layers", cfg->num_hidden_layers);
    ok = ok && cJSON_AddNumberToObject(o, "num_key_value_heads", cfg->num_key_value_heads);
    ok = ok && cJSON_AddNumberToObject(o, "pretraining_tp", 1);
    ok = ok && cJSON_AddNumberToObject(o, "rms_norm_eps", float_decimal(cfg->rms_norm_eps));
    ok = ok && cJSON_AddNullToObject(o, "rope_scaling");
    ok = ok && cJSON_AddNumberToObject(o, "rope_theta", float_decimal(cfg->rope_theta));
    ok = ok && cJSON_AddBoolToObject(o, "tie_word_embeddings", cfg->tie_word_embeddings);
    ok = ok && cJSON_AddStringToObject(o, "torch_dtype", torch_dtype_name(cfg->dtype));
    ok = ok && cJSON_AddBoolToObject(o, "use_cache", true);
    ok = ok && cJSON_AddNumberToObject(o, "vocab_size", cfg->vocab_size);
    char *text = ok ? cJSON_Print(o) : NULL;
    cJSON_Delete(o);
    return text;
}

/* Returns TIDE_OK; TIDE_E_INVALID (bad cfg), TIDE_E_NOMEM or TIDE_E_IO naming
 * the file. The file appears whole or not at all. */
tide_status tide_llama_config_save(tide_ctx *ctx, const tide_llama_config *cfg, const char *path) {
    if (!path) return tide_err(ctx, TIDE_E_INVALID, "config_save: no path");
    tide_status st = tide_llama_config_check(ctx, cfg);
    if (st) return st;
    char *text = config_json(cfg);
    if (!text) return tide_err(ctx, TIDE_E_NOMEM, "%s: out of memory building the JSON", path);
    size_t len = strlen(text);
    /* A trailing newline, as HF writes. */
    char *withnl = tide_malloc(len + 2);
    if (!withnl) {
        cJSON_free(text);
        return tide_err(ctx, TIDE_E_NOMEM, "%s: out of memory building the JSON", path);
    }
    memcpy(withnl, text, len);
    withnl[len] = '\n';
    withnl[len + 1] = '\0';
    cJSON_free(text);
    st = tide_write_file_atomic(ctx, "config", path, withnl, len + 1);
    tide_free(withnl);
    return st;
}
