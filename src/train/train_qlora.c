/*
 * train_qlora.c - QLoRA: LoRA on a frozen block-quantized base (tide.h,
 * tide_qlora_config and tide_trainer_opts.lora_base_type; docs/training.md
 * section 11).
 *
 * The configuration. A LoRA step on a quantized base trains on per-weight
 * types (wtypes): the seven projections of every layer (q, k, v, o, gate,
 * up, down: the weights the inference mixes quantize, src/model/quant_mix.c)
 * in the base type asked for, or as a GGUF file stores them; the norms as
 * stored (f32, f16 or bf16); the embedding and the head as stored, or f32
 * where a GGUF file has them block-quantized (the fused cross-entropy and
 * the embedding's backward read float weights), dequantized once at load.
 * The q/k rows are in Hugging Face's order (qk_interleaved false), so the
 * training graph's RoPE and its backward are the ones a safetensors base
 * uses and the adapters are saved as PEFT's, whatever the base's file.
 *
 * The base at load (train_qlora_open). Every frozen weight whose stored
 * type differs from the step's, or whose q/k rows are in llama.cpp's order,
 * gets a host copy the trainer owns, made row by row (rows in parallel): a
 * row dequantized or widened to f32 by the reference (src/core/quant.h),
 * checked finite, and quantized (or rounded) to the step's type by tide's
 * quantizer; rows of the same type are copied, rows of a GGUF file's q and
 * k put back into Hugging Face's order (head by head: Hugging Face's row
 * j * hd/2 + i of a head is llama.cpp's row 2i + j, as src/model/quantize.c
 * permutes them). A weight that needs neither is read in place from the
 * checkpoint's mapping. These copies are what the planner sees as the
 * weights (their quantized bytes) and what train_lora_bind binds.
 */
#include "train/trainer_int.h"
#include "core/quant.h"

#include <omp.h>
#include <stdio.h>
#include <string.h>

typedef struct qlora_buf {
    char name[128];
    void *data;
    uint64_t nbytes;
} qlora_buf;

typedef struct train_qlora {
    qlora_buf *b;
    int n;
} train_qlora;

static const char *const proj_suffix[TIDE_W_LAYER_ROLES] = {
    "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
    "mlp.gate_proj.weight",    "mlp.up_proj.weight",      "mlp.down_proj.weight"};

/* The stored type of a weight, f32 where it is block-quantized. */
static tide_dtype float_or(tide_dtype dt) { return tide_dtype_is_quantized(dt) ? TIDE_F32 : dt; }

tide_status tide_qlora_config(tide_ctx *ctx, const tide_llama_config *base, const char *base_type,
                              tide_llama_config *out) {
    tide_status st = tide_llama_config_check(ctx, base);
    if (st) return st;
    tide_dtype bt = TIDE_DTYPE_COUNT;
    if (base_type) {
        if (tide_dtype_parse(base_type, &bt) || !tide_dtype_is_quantized(bt))
            return tide_err(ctx, TIDE_E_INVALID, "base type '%s' is not a block type (q8_0, q4_0, q4_k, q5_k or "
                            "q6_k)", base_type);
        if (base->wtypes_set || tide_dtype_is_quantized(base->dtype) || base->qk_interleaved)
            return tide_err(ctx, TIDE_E_UNSUPPORTED, "base type %s: model '%s' is quantized already (a GGUF file's "
                            "projections are used as stored); a base type quantizes an f32, f16 or bf16 base",
                            tide_dtype_name(bt), base->name);
    }
    if (base->num_hidden_layers > TIDE_LLAMA_MAX_LAYERS)
        return tide_err(ctx, TIDE_E_INVALID, "model '%s': %d layers, at most %d with a quantized base", base->name,
                        base->num_hidden_layers, TIDE_LLAMA_MAX_LAYERS);
    const int64_t D = base->hidden_size, I = base->intermediate_size;
    const int64_t qd = (int64_t)base->num_attention_heads * (D / base->num_attention_heads);
    /* each projection's row length (K of its (N, K)) */
    const int64_t row[TIDE_W_LAYER_ROLES] = {D, D, D, qd, D, D, I};
    tide_llama_config c = *base;
    tide_llama_wtypes *w = &c.wtypes;
    w->embed = (uint8_t)float_or(tide_llama_weight_dtype(base, "model.embed_tokens.weight"));
    w->head = (uint8_t)float_or(tide_llama_weight_dtype(base, "lm_head.weight"));
    w->norm = (uint8_t)float_or(tide_llama_weight_dtype(base, "model.norm.weight"));
    for (int L = 0; L < base->num_hidden_layers; L++)
        for (int r = 0; r < TIDE_W_LAYER_ROLES; r++) {
            char name[128];
            snprintf(name, sizeof name, "model.layers.%d.%s", L, proj_suffix[r]);
            tide_dtype dt = bt != TIDE_DTYPE_COUNT ? bt : tide_llama_weight_dtype(base, name);
            if (row[r] % tide_dtype_block(dt))
                return tide_err(ctx, TIDE_E_INVALID, "base type %s needs rows of whole %d-element blocks: '%s' has "
                                "rows of %lld", tide_dtype_name(dt), tide_dtype_block(dt), name, (long long)row[r]);
            w->layer[L][r] = (uint8_t)dt;
        }
    c.wtypes_set = true;
    c.qk_interleaved = false;
    if (bt != TIDE_DTYPE_COUNT) c.dtype = bt;
    *out = c;
    return TIDE_OK;
}

/* The heads whose rows a GGUF file permuted in weight `name` (q_proj:
 * attention heads, k_proj: key/value heads), 0 for the others. */
static int permuted_heads(const tide_llama_config *ckc, const char *name) {
    if (!ckc->qk_interleaved) return 0;
    size_t n = strlen(name), s = strlen("self_attn.q_proj.weight");
    if (n < s) return 0;
    if (!strcmp(name + n - s, "self_attn.q_proj.weight")) return ckc->num_attention_heads;
    if (!strcmp(name + n - s, "self_attn.k_proj.weight")) return ckc->num_key_value_heads;
    return 0;
}

/* The stored row that holds Hugging Face's row r (heads of d rows). */
static int64_t stored_row(int64_t r, int heads, int64_t rows) {
    if (heads <= 0) return r;
    int64_t d = rows / heads, h = r / d, k = r % d;
    return h * d + 2 * (k % (d / 2)) + k / (d / 2);
}

/* Fills b with weight T from the checkpoint's tensor ti (the same shape),
 * rows in Hugging Face's order, in T's type. */
static tide_status convert(tide_ctx *ctx, const tide_tensor *T, const tide_tensor_info *ti, int heads,
                           qlora_buf *b) {
    const int64_t rows = T->ndim == 2 ? T->shape[0] : 1, cols = T->ndim == 2 ? T->shape[1] : T->shape[0];
    if (heads > 0 && (rows % heads || (rows / heads) % 2))
        return tide_err(ctx, TIDE_E_FORMAT, "'%s': %lld rows are not %d heads of an even size", T->name,
                        (long long)rows, heads);
    const size_t in_row = (size_t)tide_dtype_bytes(ti->dtype, (uint64_t)cols);
    const size_t out_row = (size_t)tide_dtype_bytes(T->dtype, (uint64_t)cols);
    if (!(b->data = tide_malloc_aligned(T->nbytes ? (size_t)T->nbytes : 1, 4096)))
        return tide_err(ctx, TIDE_E_NOMEM, "out of memory for the %llu bytes of the quantized base's '%s'",
                        (unsigned long long)T->nbytes, T->name);
    b->nbytes = T->nbytes;
    snprintf(b->name, sizeof b->name, "%s", T->name);
    const unsigned char *src = ti->data;
    unsigned char *dst = b->data;
    const bool same = ti->dtype == T->dtype;
    int64_t bad_row = -1; /* a row the conversion refused, or -2 out of memory */
#pragma omp parallel if (rows >= 8)
    {
        float *f = same ? NULL : tide_malloc((size_t)cols * sizeof(float));
        if (!same && !f) {
#pragma omp critical
            bad_row = -2;
        }
#pragma omp for schedule(dynamic, 4)
        for (int64_t r = 0; r < rows; r++) {
            const unsigned char *s = src + (size_t)stored_row(r, heads, rows) * in_row;
            unsigned char *d = dst + (size_t)r * out_row;
            if (same) {
                memcpy(d, s, out_row);
                continue;
            }
            if (!f) continue;
            if (tide_dequantize_row(ti->dtype, s, f, cols) || !tide_quant_all_finite(f, cols) ||
                tide_quantize_row(T->dtype, f, d, cols)) {
#pragma omp critical
                if (bad_row == -1) bad_row = r;
            }
        }
        tide_free(f);
    }
    if (bad_row == -2)
        return tide_err(ctx, TIDE_E_NOMEM, "out of memory converting '%s' for the quantized base", T->name);
    if (bad_row >= 0)
        return tide_err(ctx, TIDE_E_FORMAT, "'%s' row %lld: not finite, or not convertible from %s to %s", T->name,
                        (long long)bad_row, tide_dtype_name(ti->dtype), tide_dtype_name(T->dtype));
    return TIDE_OK;
}

tide_status train_qlora_open(tide_trainer *t) {
    const tide_llama_config *ckc = tide_checkpoint_config(t->ck);
    train_qlora *q = tide_calloc(1, sizeof *q);
    if (!q) return tide_err(t->ctx, TIDE_E_NOMEM, "out of memory");
    t->qlora = q;
    int n = 0;
    for (int i = 0; i < t->g->n_tensors; i++) n += t->g->tensors[i].role == TIDE_ROLE_WEIGHT;
    if (!(q->b = tide_calloc((size_t)n + 1, sizeof *q->b))) return tide_err(t->ctx, TIDE_E_NOMEM, "out of memory");
    for (int i = 0; i < t->g->n_tensors; i++) {
        const tide_tensor *T = &t->g->tensors[i];
        if (T->role != TIDE_ROLE_WEIGHT) continue;
        tide_tensor_info ti;
        if (tide_checkpoint_get(t->ck, T->name, &ti))
            return tide_err(t->ctx, TIDE_E_FORMAT, "the checkpoint has no parameter '%s'", T->name);
        const int heads = permuted_heads(ckc, T->name);
        if (ti.dtype == T->dtype && !heads) continue; /* read in place */
        bool shape_ok = ti.ndim == T->ndim;
        for (int d = 0; d < T->ndim && shape_ok; d++) shape_ok = ti.shape[d] == T->shape[d];
        if (!shape_ok || !ti.data)
            return tide_err(t->ctx, TIDE_E_FORMAT, "checkpoint tensor '%s' (%s) does not have the shape the model "
                            "needs, or is not mapped", T->name, tide_dtype_name(ti.dtype));
        tide_status st = convert(t->ctx, T, &ti, heads, &q->b[q->n]);
        if (q->b[q->n].data) q->n++;
        if (st) return st;
    }
    return TIDE_OK;
}

const void *train_qlora_data(const tide_trainer *t, const char *name, uint64_t *nbytes) {
    const train_qlora *q = t->qlora;
    for (int i = 0; q && i < q->n; i++)
        if (!strcmp(q->b[i].name, name)) {
            if (nbytes) *nbytes = q->b[i].nbytes;
            return q->b[i].data;
        }
    return NULL;
}

void train_qlora_close(tide_trainer *t) {
    train_qlora *q = t->qlora;
    if (!q) return;
    for (int i = 0; i < q->n; i++) tide_free_aligned(q->b[i].data);
    tide_free(q->b);
    tide_free(q);
    t->qlora = NULL;
}
