/*
 * quant_mix.h - the quantization mixes llama.cpp's quantizer makes (Q8_0,
 * Q4_0, Q4_K_M, Q5_K_M, Q6_K): which type each LLaMA weight gets, with
 * llama.cpp's fallbacks for rows that are not whole blocks (mapped to tide's
 * types). docs/quantization.md states the rules; tide_quant_mix_apply
 * (include/tide.h) fills a configuration's per-weight types from them.
 */
#ifndef TIDE_QUANT_MIX_H
#define TIDE_QUANT_MIX_H

#include "core/core.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct tide_quant_mix {
    const char *name; /* "Q4_K_M" */
    tide_dtype base;  /* the type of every weight no rule changes */
    int ftype;        /* llama.cpp's LLAMA_FTYPE_MOSTLY_* number (GGUF general.file_type) */
    bool more_bits;   /* the _M rule: attn_v and ffn_down in Q6_K on the "use more bits" layers */
} tide_quant_mix;

/* The mix of that name (either case: "q4_k_m", "Q6_K"), or NULL. */
const tide_quant_mix *tide_quant_mix_find(const char *name);

/* Weight kinds for tide_quant_mix_type. */
enum { TIDE_QMIX_EMBED = -1, TIDE_QMIX_HEAD = -2 };

/* The type of one weight under mix m: kind TIDE_QMIX_EMBED, TIDE_QMIX_HEAD
 * (for a tied model pass TIDE_QMIX_HEAD for the embedding: llama.cpp treats
 * token_embd as the output then) or a tide_llama_wrole at layer `layer`, of
 * rows of `row` elements, in a model of n_layers layers. *rule_type (may be
 * NULL) is the type llama.cpp's rules give before the row fallback; the
 * result differs from it when rows are not whole blocks of it. Returns
 * TIDE_DTYPE_COUNT when no type fits (a Q8_0 or Q4_0 mix with rows that are
 * not whole 32-blocks: llama.cpp refuses those too). */
tide_dtype tide_quant_mix_type(const tide_quant_mix *m, int kind, int layer, int n_layers, int64_t row,
                               tide_dtype *rule_type);

/* llama.cpp's test for the layers that get more bits in the _M mixes. */
bool tide_quant_use_more_bits(int layer, int n_layers);

/* GGML's type number of a tide dtype (GGUF tensor infos), -1 if none. */
int tide_ggml_type(tide_dtype dt);

#endif
