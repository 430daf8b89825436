/*
 * quant_mix.c - llama.cpp's quantization mixes for LLaMA models (the rules of
 * its quantizer without an importance matrix or overrides, for the mixes
 * tide writes; docs/quantization.md):
 *   - every 2-D weight gets the mix's base type; norms stay f32;
 *   - the output head (the token embedding instead when the model ties them)
 *     gets Q6_K, or Q8_0 when its rows are not whole 256-blocks, unless the
 *     base is Q8_0 (then Q8_0);
 *   - Q4_K_M, Q5_K_M: attn_v and ffn_down get Q6_K on the layers where
 *     use_more_bits holds (i < n/8, i >= 7n/8, or (i - n/8) % 3 == 2);
 *   - an 80-layer model (llama.cpp's 70B type) has attn_v in Q5_K where the
 *     rules above left Q4_K;
 *   - a row that is not whole blocks of its type falls back: Q4_K to Q5_0 and
 *     Q5_K to Q5_1 in llama.cpp, types tide lacks, so tide uses the nearest
 *     one with more bits, Q8_0 (8.5 bits per weight); Q6_K to Q8_0 as in
 *     llama.cpp; and to F16 when the row is not whole 32-blocks either.
 */
#include "model/quant_mix.h"

#include "core/core.h"

#include <string.h>
#include <strings.h>

/* LLAMA_FTYPE_MOSTLY_*: Q4_0 2, Q8_0 7, Q4_K_M 15, Q5_K_M 17, Q6_K 18 */
static const tide_quant_mix mixes[] = {
    {"Q8_0", TIDE_Q8_0, 7, false},   {"Q4_0", TIDE_Q4_0, 2, false},   {"Q4_K_M", TIDE_Q4_K, 15, true},
    {"Q5_K_M", TIDE_Q5_K, 17, true}, {"Q6_K", TIDE_Q6_K, 18, false},
};
#define N_MIXES (sizeof mixes / sizeof mixes[0])

static const char *const mix_names[] = {"Q8_0", "Q4_0", "Q4_K_M", "Q5_K_M", "Q6_K", NULL};

const char *const *tide_quant_mix_names(void) { return mix_names; }

const tide_quant_mix *tide_quant_mix_find(const char *name) {
    if (!name) return NULL;
    for (size_t i = 0; i < N_MIXES; i++)
        if (strcasecmp(name, mixes[i].name) == 0) return &mixes[i];
    return NULL;
}

bool tide_quant_use_more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

int tide_ggml_type(tide_dtype dt) {
    switch (dt) {
    case TIDE_F32: return 0;
    case TIDE_F16: return 1;
    case TIDE_Q4_0: return 2;
    case TIDE_Q8_0: return 8;
    case TIDE_Q4_K: return 12;
    case TIDE_Q5_K: return 13;
    case TIDE_Q6_K: return 14;
    case TIDE_BF16: return 30;
    case TIDE_I32: return 26;
    default: return -1;
    }
}

tide_dtype tide_quant_mix_type(const tide_quant_mix *m, int kind, int layer, int n_layers, int64_t row,
                               tide_dtype *rule_type) {
    tide_dtype t = m->base;
    if (kind == TIDE_QMIX_HEAD) {
        if (row % 256 != 0) t = TIDE_Q8_0;
        else if (t != TIDE_Q8_0) t = TIDE_Q6_K;
    } else if (kind == TIDE_W_V) {
        if (m->more_bits && tide_quant_use_more_bits(layer, n_layers)) t = TIDE_Q6_K;
        if (n_layers == 80 && t == TIDE_Q4_K) t = TIDE_Q5_K;
    } else if (kind == TIDE_W_DOWN) {
        if (m->more_bits && tide_quant_use_more_bits(layer, n_layers)) t = TIDE_Q6_K;
    }
    if (rule_type) *rule_type = t;
    int qk = tide_dtype_block(t);
    if (row % qk == 0) return t;
    if (t == TIDE_Q4_K || t == TIDE_Q5_K || t == TIDE_Q6_K) return row % 32 == 0 ? TIDE_Q8_0 : TIDE_F16;
    return TIDE_DTYPE_COUNT;
}

tide_status tide_quant_mix_apply(tide_ctx *ctx, const char *mix, tide_llama_config *cfg) {
    const tide_quant_mix *m = tide_quant_mix_find(mix);
    if (!m)
        return tide_err(ctx, TIDE_E_NOT_FOUND, "unknown quantization mix '%s' (known: Q8_0, Q4_0, Q4_K_M, Q5_K_M, Q6_K)",
                        mix ? mix : "(null)");
    if (!cfg) return tide_err(ctx, TIDE_E_INVALID, "no model config given");
    int n = cfg->num_hidden_layers;
    if (n < 1 || n > TIDE_LLAMA_MAX_LAYERS)
        return tide_err(ctx, TIDE_E_INVALID, "model config '%.64s': %d layers (a mix covers 1 to %d)", cfg->name, n,
                        TIDE_LLAMA_MAX_LAYERS);
    int64_t D = cfg->hidden_size, I = cfg->intermediate_size;
    int64_t hd = cfg->num_attention_heads > 0 ? D / cfg->num_attention_heads : 0;
    int64_t O = hd * cfg->num_attention_heads;
    tide_llama_wtypes w;
    memset(&w, 0, sizeof w);
    tide_dtype head = tide_quant_mix_type(m, TIDE_QMIX_HEAD, 0, n, D, NULL);
    tide_dtype embed = cfg->tie_word_embeddings ? head : tide_quant_mix_type(m, TIDE_QMIX_EMBED, 0, n, D, NULL);
    if (head == TIDE_DTYPE_COUNT || embed == TIDE_DTYPE_COUNT)
        return tide_err(ctx, TIDE_E_UNSUPPORTED, "%s: rows of %lld elements (hidden_size) are not whole 32-element blocks",
                        m->name, (long long)D);
    w.head = (uint8_t)head;
    w.embed = (uint8_t)embed;
    w.norm = TIDE_F32;
    for (int L = 0; L < n; L++) {
        for (int r = 0; r < TIDE_W_LAYER_ROLES; r++) {
            int64_t row = r == TIDE_W_O ? O : r == TIDE_W_DOWN ? I : D;
            tide_dtype t = tide_quant_mix_type(m, r, L, n, row, NULL);
            if (t == TIDE_DTYPE_COUNT)
                return tide_err(ctx, TIDE_E_UNSUPPORTED, "%s: rows of %lld elements (layer %d) are not whole 32-element blocks",
                                m->name, (long long)row, L);
            w.layer[L][r] = (uint8_t)t;
        }
    }
    cfg->dtype = m->base;
    cfg->wtypes = w;
    cfg->wtypes_set = true;
    return TIDE_OK;
}
