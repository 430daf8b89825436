/*
 * quantize.c - a Hugging Face-layout LLaMA checkpoint to a quantized GGUF
 * file (tide_quantize_checkpoint, include/tide.h), as llama.cpp's converter
 * and quantizer together would make it:
 *   - tensors under llama.cpp's names (token_embd, blk.N.attn_norm, attn_q,
 *     attn_k, attn_v, attn_output, ffn_norm, ffn_gate, ffn_up, ffn_down,
 *     output_norm, output; no output for tied embeddings), dimensions
 *     innermost first;
 *   - q_proj / k_proj rows permuted per head from Hugging Face's half-split
 *     rotary pairs to llama.cpp's adjacent ones (row h*d + 2i + j of the file
 *     is row h*d + j*d/2 + i of the checkpoint), before quantizing;
 *   - each weight in the type tide_quant_mix_apply gives it, quantized row by
 *     row by the reference quantizers (src/core/quant.c), norms in f32;
 *   - metadata: general.architecture "llama", general.name, general.file_type
 *     (llama.cpp's LLAMA_FTYPE), general.quantization_version 2,
 *     general.alignment 32, llama.context_length, embedding_length,
 *     block_count, feed_forward_length, attention.head_count,
 *     attention.head_count_kv, attention.key_length, attention.value_length,
 *     rope.dimension_count, rope.freq_base, attention.layer_norm_rms_epsilon,
 *     vocab_size;
 *   - the tokenizer of tokenizer.json (read by tide_tokenizer_open, so with
 *     tokenizer_config.json's BOS/EOS and chat template): tokenizer.ggml.model
 *     "gpt2" for byte-level BPE (with its merges and tokenizer.ggml.pre,
 *     "llama-bpe" for Llama 3's pre-tokenizer regex, else "default") and
 *     "llama" for SentencePiece-style BPE (scores: -rank of the merge that
 *     makes a token, so that llama.cpp's score-driven merging follows the
 *     merge order; tokens no merge makes score below every merge); token types
 *     (NORMAL 1, UNKNOWN 2, CONTROL 3 for special added tokens, USER_DEFINED 4
 *     for other added ones, UNUSED 5, BYTE 6 for <0xNN>); ids past the
 *     tokenizer's up to vocab_size are "[PADn]" UNUSED tokens, as llama.cpp's
 *     converter pads; bos/eos/unknown ids, add_bos_token / add_eos_token from
 *     the post-processor's template, tokenizer.chat_template. Without a
 *     tokenizer.json a placeholder SentencePiece vocabulary is written (<unk>,
 *     <s>, </s>, the 256 byte tokens where vocab_size allows, then "▁tN").
 * A GGUF input (tide_checkpoint_open reads it under Hugging Face names, its
 * q/k rows already in llama.cpp's order: qk_interleaved, so not permuted
 * again) is dequantized row by row by the reference dequantizers; its
 * tokenizer.* keys and general.name are copied byte for byte.
 */
#include "core/core.h"
#include "core/quant.h"
#include "model/checkpoint.h"
#include "model/gguf.h"
#include "model/gguf_write.h"
#include "model/quant_mix.h"
#include "text/tok_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define ROWS_PER_CHUNK 256

enum { TT_NORMAL = 1, TT_UNKNOWN = 2, TT_CONTROL = 3, TT_USER = 4, TT_UNUSED = 5, TT_BYTE = 6 };

typedef struct qtensor {
    char hf[96], gguf[64];
    int ck;            /* index into the checkpoint */
    tide_dtype type;   /* stored type */
    int64_t rows, cols; /* cols: row length (1-D: rows = 1) */
    int ndim;
    int permute_heads; /* > 0: rotary row permutation with this many heads */
    int kind, layer;   /* for tide_quant_mix_type: TIDE_QMIX_* or a tide_llama_wrole */
} qtensor;

typedef struct qjob {
    tide_ctx *ctx;
    const tide_checkpoint *ck;
    const tide_llama_config *cfg;
    qtensor *t;
    int n;
    const char *out;
    uint64_t done, total; /* elements, for progress */
} qjob;

static int64_t src_row(const qtensor *t, int64_t r) {
    if (t->permute_heads <= 0) return r;
    int64_t d = t->rows / t->permute_heads, h = r / d, k = r % d;
    return h * d + (k % 2) * (d / 2) + k / 2;
}

/* Writes tensor i: chunks of rows converted to f32, checked, quantized (rows
 * in parallel), streamed. */
static tide_status write_tensor(void *user, int i, tide_gguf_sink *sink) {
    qjob *J = user;
    const qtensor *t = &J->t[i];
    tide_tensor_info info;
    tide_status st = tide_checkpoint_get_index(J->ck, t->ck, &info);
    if (st != TIDE_OK) return st;
    size_t in_row = (size_t)tide_dtype_bytes(info.dtype, (uint64_t)t->cols);
    size_t out_row = (size_t)tide_dtype_bytes(t->type, (uint64_t)t->cols);
    int64_t chunk = ROWS_PER_CHUNK;
    float *f = tide_malloc(sizeof(float) * (size_t)t->cols * (size_t)chunk);
    uint8_t *q = tide_malloc(out_row * (size_t)chunk);
    if (!f || !q) {
        tide_free(f);
        tide_free(q);
        return tide_err(J->ctx, TIDE_E_NOMEM, "out of memory quantizing %s", t->hf);
    }
    const uint8_t *src = info.data;
    for (int64_t r0 = 0; r0 < t->rows && st == TIDE_OK; r0 += chunk) {
        int64_t nr = t->rows - r0 < chunk ? t->rows - r0 : chunk;
        int64_t bad = INT64_MAX; /* the first row holding a NaN or infinity */
#pragma omp parallel for schedule(dynamic, 4) reduction(min : bad) if (nr >= 8)
        for (int64_t r = 0; r < nr; r++) {
            float *fr = f + (size_t)r * (size_t)t->cols;
            tide_dequantize_row(info.dtype, src + (size_t)src_row(t, r0 + r) * in_row, fr, t->cols);
            if (!tide_quant_all_finite(fr, t->cols)) {
                if (r0 + r < bad) bad = r0 + r;
                continue;
            }
            tide_quantize_row(t->type, fr, q + (size_t)r * out_row, t->cols);
        }
        if (bad != INT64_MAX) {
            st = tide_err(J->ctx, TIDE_E_FORMAT, "tensor %s: row %lld holds a NaN or infinity (not quantizable)", t->hf,
                          (long long)src_row(t, bad));
            break;
        }
        st = tide_gguf_put(sink, q, out_row * (size_t)nr);
        J->done += (uint64_t)nr * (uint64_t)t->cols;
        tide_progress(J->ctx, "quantizing", J->done, J->total);
    }
    tide_free(f);
    tide_free(q);
    return st;
}

/* ------------------------------------------------------------ tokenizer */

typedef struct vocab_out {
    char **tokens;      /* owned where own[i] */
    uint32_t *lens;
    bool *own;
    float *scores;
    int32_t *types;
    int64_t n;
    char **merges;      /* gpt2 */
    int64_t n_merges;
} vocab_out;

static void vocab_free(vocab_out *v) {
    for (int64_t i = 0; i < v->n; i++)
        if (v->own && v->own[i]) tide_free(v->tokens[i]);
    for (int64_t i = 0; i < v->n_merges; i++) tide_free(v->merges[i]);
    tide_free(v->tokens);
    tide_free(v->lens);
    tide_free(v->own);
    tide_free(v->scores);
    tide_free(v->types);
    tide_free(v->merges);
    memset(v, 0, sizeof *v);
}

static bool vocab_alloc(vocab_out *v, int64_t n) {
    v->n = n;
    v->tokens = tide_calloc((size_t)n, sizeof *v->tokens);
    v->lens = tide_calloc((size_t)n, sizeof *v->lens);
    v->own = tide_calloc((size_t)n, sizeof *v->own);
    v->scores = tide_calloc((size_t)n, sizeof *v->scores);
    v->types = tide_calloc((size_t)n, sizeof *v->types);
    return v->tokens && v->lens && v->own && v->scores && v->types;
}

static bool set_token(vocab_out *v, int64_t i, const char *s, size_t len, bool copy) {
    if (copy) {
        char *c = tide_malloc(len + 1);
        if (!c) return false;
        memcpy(c, s, len);
        c[len] = 0;
        v->tokens[i] = c;
        v->own[i] = true;
    } else {
        v->tokens[i] = (char *)s;
    }
    v->lens[i] = (uint32_t)len;
    return true;
}

static bool is_byte_token(const char *s, size_t n) {
    return n == 6 && s[0] == '<' && s[1] == '0' && s[2] == 'x' && s[5] == '>' &&
           strchr("0123456789ABCDEFabcdef", s[3]) && strchr("0123456789ABCDEFabcdef", s[4]) && s[3] && s[4];
}

static int cmp_rank(const void *a, const void *b) {
    const struct tok_mslot *x = *(const struct tok_mslot *const *)a, *y = *(const struct tok_mslot *const *)b;
    return (x->rank > y->rank) - (x->rank < y->rank);
}

/* The placeholder vocabulary of a checkpoint without tokenizer.json. */
static tide_status placeholder_vocab(tide_ctx *ctx, int64_t V, vocab_out *v) {
    if (!vocab_alloc(v, V)) return tide_err(ctx, TIDE_E_NOMEM, "out of memory building the vocabulary");
    bool bytes = V >= 3 + 256;
    for (int64_t i = 0; i < V; i++) {
        char buf[32];
        int ty = TT_NORMAL;
        if (i == 0) snprintf(buf, sizeof buf, "<unk>"), ty = TT_UNKNOWN;
        else if (i == 1) snprintf(buf, sizeof buf, "<s>"), ty = TT_CONTROL;
        else if (i == 2) snprintf(buf, sizeof buf, "</s>"), ty = TT_CONTROL;
        else if (bytes && i < 3 + 256) snprintf(buf, sizeof buf, "<0x%02X>", (unsigned)(i - 3)), ty = TT_BYTE;
        else snprintf(buf, sizeof buf, "\xe2\x96\x81t%lld", (long long)i);
        if (!set_token(v, i, buf, strlen(buf), true)) return tide_err(ctx, TIDE_E_NOMEM, "out of memory");
        v->scores[i] = -(float)i;
        v->types[i] = ty;
    }
    return TIDE_OK;
}

/* tokenizer.json's vocabulary as GGUF arrays; *model "gpt2" or "llama". */
static tide_status tokenizer_vocab(tide_ctx *ctx, const tide_tokenizer *t, int64_t V, vocab_out *v, bool *gpt2) {
    int32_t nt = t->n_vocab;
    if (nt > V)
        return tide_err(ctx, TIDE_E_FORMAT, "%s: %d tokens, more than the model's vocab_size %lld", t->json_path,
                        (int)nt, (long long)V);
    if (!vocab_alloc(v, V)) return tide_err(ctx, TIDE_E_NOMEM, "out of memory building the vocabulary");
    *gpt2 = t->byte_level;
    /* merges in rank order (a repeated pair keeps its later rank, as tokenizers does) */
    const struct tok_mslot **ms = tide_malloc(sizeof *ms * (t->merges.n + 1));
    if (!ms) return tide_err(ctx, TIDE_E_NOMEM, "out of memory building the merges");
    size_t nm = 0;
    for (size_t s = 0; s < t->merges.cap; s++)
        if (t->merges.slots[s].rank >= 0 && t->merges.slots[s].id >= 0 && t->merges.slots[s].key != UINT64_MAX)
            ms[nm++] = &t->merges.slots[s];
    if (nm > t->merges.n) nm = t->merges.n; /* never: the map counts its entries */
    qsort(ms, nm, sizeof *ms, cmp_rank);
    float *best = tide_malloc(sizeof(float) * (size_t)(nt ? nt : 1));
    if (!best) {
        tide_free(ms);
        return tide_err(ctx, TIDE_E_NOMEM, "out of memory");
    }
    for (int32_t i = 0; i < nt; i++) best[i] = 1.f; /* no merge makes it */
    for (size_t k = 0; k < nm; k++)
        if (ms[k]->id < nt && best[ms[k]->id] > 0) best[ms[k]->id] = -(float)k;
    tide_status st = TIDE_OK;
    for (int64_t i = 0; i < V && st == TIDE_OK; i++) {
        const char *p = i < nt ? t->pieces[i] : NULL;
        if (!p) {
            char buf[32];
            snprintf(buf, sizeof buf, "[PAD%lld]", (long long)i);
            if (!set_token(v, i, buf, strlen(buf), true)) st = tide_err(ctx, TIDE_E_NOMEM, "out of memory");
            v->types[i] = TT_UNUSED;
            v->scores[i] = -1e9f;
            continue;
        }
        set_token(v, i, p, t->piece_len[i], false);
        bool added = t->flags[i] & TOK_F_ADDED, special = t->flags[i] & TOK_F_SPECIAL;
        int ty = special ? TT_CONTROL : added ? TT_USER : TT_NORMAL;
        if (i == t->unk_id) ty = TT_UNKNOWN;
        else if (!*gpt2 && !added && is_byte_token(p, t->piece_len[i])) ty = TT_BYTE;
        v->types[i] = ty;
        v->scores[i] = ty != TT_NORMAL ? 0.f : best[i] <= 0 ? best[i] : -(float)(nm + (size_t)i);
    }
    if (st == TIDE_OK && *gpt2) {
        v->merges = tide_calloc(nm + 1, sizeof *v->merges);
        if (!v->merges) st = tide_err(ctx, TIDE_E_NOMEM, "out of memory building the merges");
        for (size_t k = 0; k < nm && st == TIDE_OK; k++) {
            int32_t a = (int32_t)(ms[k]->key >> 32), b = (int32_t)(ms[k]->key & 0xffffffffu);
            if (a < 0 || b < 0 || a >= nt || b >= nt || !t->pieces[a] || !t->pieces[b]) continue;
            size_t la = t->piece_len[a], lb = t->piece_len[b];
            char *m = tide_malloc(la + lb + 2);
            if (!m) {
                st = tide_err(ctx, TIDE_E_NOMEM, "out of memory building the merges");
                break;
            }
            memcpy(m, t->pieces[a], la);
            m[la] = ' ';
            memcpy(m + la + 1, t->pieces[b], lb);
            m[la + lb + 1] = 0;
            v->merges[v->n_merges++] = m;
        }
    }
    tide_free(best);
    tide_free(ms);
    return st;
}

/* tokenizer.ggml.pre for a byte-level tokenizer, from its split regex as
 * tokenizer.json spells it: Llama 3's gives "llama-bpe", Qwen2's (digits one
 * at a time) "qwen2", anything else "default". */
static const char *pre_name(const char *json_path) {
    static const struct {
        const char *pattern, *name;
    } known[] = {
        {"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}{1,3}|", "llama-bpe"},
        {"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}| ?[^", "qwen2"},
    };
    enum { N_KNOWN = sizeof known / sizeof known[0] };
    FILE *fp = fopen(json_path, "rb");
    if (!fp) return "default";
    size_t longest = 0;
    for (int i = 0; i < N_KNOWN; i++)
        if (strlen(known[i].pattern) > longest) longest = strlen(known[i].pattern);
    const char *r = "default";
    char buf[1 << 16];
    size_t keep = 0, n;
    /* a streaming search: keep the tail of each read in case a pattern spans two */
    while (!strcmp(r, "default") && (n = fread(buf + keep, 1, sizeof buf - 1 - keep, fp)) > 0) {
        buf[keep + n] = 0;
        for (int i = 0; i < N_KNOWN; i++)
            if (strstr(buf, known[i].pattern)) {
                r = known[i].name;
                break;
            }
        size_t have = keep + n, tail = longest < have ? longest : have;
        memmove(buf, buf + have - tail, tail);
        keep = tail;
    }
    fclose(fp);
    return r;
}

/* ------------------------------------------------------------ the file */

static const char *const layer_hf[TIDE_W_LAYER_ROLES] = {
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
    "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};
static const char *const layer_gguf[TIDE_W_LAYER_ROLES] = {"attn_q",   "attn_k", "attn_v",  "attn_output",
                                                           "ffn_gate", "ffn_up", "ffn_down"};

static tide_status add_tensor(tide_ctx *ctx, const tide_checkpoint *ck, const tide_llama_config *cfg, qtensor *t,
                              int *n, const char *hf, const char *gg, int permute_heads, int kind, int layer) {
    qtensor *q = &t[*n];
    memset(q, 0, sizeof *q);
    q->kind = kind;
    q->layer = layer;
    snprintf(q->hf, sizeof q->hf, "%s", hf);
    snprintf(q->gguf, sizeof q->gguf, "%s", gg);
    q->ck = tide_checkpoint_find(ck, hf);
    if (q->ck < 0) return tide_err(ctx, TIDE_E_FORMAT, "checkpoint '%s': no tensor %s", ck->dir, hf);
    tide_tensor_info info;
    tide_status st = tide_checkpoint_get_index(ck, q->ck, &info);
    if (st != TIDE_OK) return st;
    if (info.dtype == TIDE_I32 || tide_dtype_bytes(info.dtype, (uint64_t)info.shape[info.ndim - 1]) == 0)
        return tide_err(ctx, TIDE_E_UNSUPPORTED, "checkpoint '%s': tensor %s is %s (not a weight type)", ck->dir, hf,
                        tide_dtype_name(info.dtype));
    if (info.ndim == 1) {
        q->ndim = 1;
        q->rows = 1;
        q->cols = info.shape[0];
        q->type = TIDE_F32;
    } else if (info.ndim == 2) {
        q->ndim = 2;
        q->rows = info.shape[0];
        q->cols = info.shape[1];
        q->type = tide_llama_weight_dtype(cfg, hf);
    } else {
        return tide_err(ctx, TIDE_E_FORMAT, "checkpoint '%s': tensor %s has %d dimensions", ck->dir, hf, info.ndim);
    }
    if (permute_heads > 0 && (q->rows % permute_heads || (q->rows / permute_heads) % 2))
        return tide_err(ctx, TIDE_E_FORMAT, "checkpoint '%s': tensor %s: %lld rows are not %d heads of even size",
                        ck->dir, hf, (long long)q->rows, permute_heads);
    /* llama.cpp's "qwen2" keeps Hugging Face's half-split rotary order */
    q->permute_heads = cfg->qk_interleaved || cfg->qkv_bias ? 0 : permute_heads;
    (*n)++;
    return TIDE_OK;
}

tide_status tide_quantize_checkpoint(tide_ctx *ctx, const char *in_dir, const char *out_path, const char *mix,
                                     tide_quantize_stats *stats) {
    if (!in_dir || !out_path) return tide_err(ctx, TIDE_E_INVALID, "tide_quantize_checkpoint: NULL path");
    const tide_quant_mix *m = tide_quant_mix_find(mix);
    if (!m)
        return tide_err(ctx, TIDE_E_NOT_FOUND, "unknown quantization type '%s' (known: Q8_0, Q4_0, Q4_K_M, Q5_K_M, Q6_K)",
                        mix ? mix : "(null)");
    tide_quantize_stats S;
    memset(&S, 0, sizeof S);
    tide_checkpoint *ck = NULL;
    tide_status st = tide_checkpoint_open(ctx, in_dir, &ck);
    if (st != TIDE_OK) return st;
    tide_llama_config cfg = *tide_checkpoint_config(ck);
    tide_tokenizer *tok = NULL;
    tide_gguf_out *g = NULL;
    tide_gguf *src = NULL; /* a GGUF input: its tokenizer metadata is copied */
    struct stat sb;
    if (stat(in_dir, &sb) == 0 && S_ISREG(sb.st_mode) && (st = tide_gguf_open(ctx, in_dir, &src)) != TIDE_OK) {
        tide_checkpoint_free(ck);
        return st;
    }
    vocab_out voc = {0};
    int nt_max = 3 + 12 * cfg.num_hidden_layers; /* 9 per layer, and Qwen2's 3 biases */
    qtensor *T = tide_calloc((size_t)nt_max, sizeof *T);
    if (!T) {
        st = tide_err(ctx, TIDE_E_NOMEM, "out of memory");
        goto out;
    }
    if ((st = tide_quant_mix_apply(ctx, m->name, &cfg)) != TIDE_OK) goto out;

    /* tensors, in llama.cpp's converter's order */
    int n = 0;
    int H = cfg.num_attention_heads, KV = cfg.num_key_value_heads > 0 ? cfg.num_key_value_heads : H;
    if ((st = add_tensor(ctx, ck, &cfg, T, &n, "model.embed_tokens.weight", "token_embd.weight", 0,
                         cfg.tie_word_embeddings ? TIDE_QMIX_HEAD : TIDE_QMIX_EMBED, 0))) goto out;
    for (int L = 0; L < cfg.num_hidden_layers; L++) {
        char hf[96], gg[64];
        snprintf(hf, sizeof hf, "model.layers.%d.input_layernorm.weight", L);
        snprintf(gg, sizeof gg, "blk.%d.attn_norm.weight", L);
        if ((st = add_tensor(ctx, ck, &cfg, T, &n, hf, gg, 0, -9, L))) goto out;
        for (int r = 0; r < TIDE_W_LAYER_ROLES; r++) {
            if (r == TIDE_W_GATE) {
                snprintf(hf, sizeof hf, "model.layers.%d.post_attention_layernorm.weight", L);
                snprintf(gg, sizeof gg, "blk.%d.ffn_norm.weight", L);
                if ((st = add_tensor(ctx, ck, &cfg, T, &n, hf, gg, 0, -9, L))) goto out;
            }
            snprintf(hf, sizeof hf, "model.layers.%d.%s.weight", L, layer_hf[r]);
            snprintf(gg, sizeof gg, "blk.%d.%s.weight", L, layer_gguf[r]);
            if ((st = add_tensor(ctx, ck, &cfg, T, &n, hf, gg, r == TIDE_W_Q ? H : r == TIDE_W_K ? KV : 0, r, L)))
                goto out;
            if (cfg.qkv_bias && r <= TIDE_W_V) { /* Qwen2: q, k and v biases, f32 */
                snprintf(hf, sizeof hf, "model.layers.%d.%s.bias", L, layer_hf[r]);
                snprintf(gg, sizeof gg, "blk.%d.%s.bias", L, layer_gguf[r]);
                if ((st = add_tensor(ctx, ck, &cfg, T, &n, hf, gg, 0, -9, L))) goto out;
            }
        }
    }
    if ((st = add_tensor(ctx, ck, &cfg, T, &n, "model.norm.weight", "output_norm.weight", 0, -9, 0))) goto out;
    if (!cfg.tie_word_embeddings &&
        (st = add_tensor(ctx, ck, &cfg, T, &n, "lm_head.weight", "output.weight", 0, TIDE_QMIX_HEAD, 0)))
        goto out;
    if (n != tide_checkpoint_n_tensors(ck)) {
        st = tide_err(ctx, TIDE_E_FORMAT, "checkpoint '%s': %d tensors, of which %d are LLaMA weights tide converts",
                      in_dir, tide_checkpoint_n_tensors(ck), n);
        goto out;
    }

    /* metadata */
    if (!(g = tide_gguf_new())) {
        st = tide_err(ctx, TIDE_E_NOMEM, "out of memory");
        goto out;
    }
    const char *base = strrchr(in_dir, '/');
    char name[256];
    snprintf(name, sizeof name, "%s", cfg.name[0] ? cfg.name : base && base[1] ? base + 1 : in_dir);
    tide_gguf_value nv;
    const char *gn;
    uint64_t gl;
    if (src && tide_gguf_get(src, "general.name", &nv) && tide_gguf_value_str(&nv, &gn, &gl))
        snprintf(name, sizeof name, "%.*s", (int)(gl < 255 ? gl : 255), gn);
    int hd = cfg.hidden_size / H;
    const char *arch = cfg.qkv_bias ? "qwen2" : "llama";
    char key[64];
#define ARCH_KEY(k) (snprintf(key, sizeof key, "%s." k, arch), key)
    tide_gguf_kv_str(g, "general.architecture", arch);
    tide_gguf_kv_str(g, "general.name", name);
    tide_gguf_kv_u32(g, "general.file_type", (uint32_t)m->ftype);
    tide_gguf_kv_u32(g, "general.quantization_version", 2);
    tide_gguf_kv_u32(g, "general.alignment", TIDE_GGUF_ALIGNMENT);
    tide_gguf_kv_u32(g, ARCH_KEY("context_length"), (uint32_t)cfg.max_position_embeddings);
    tide_gguf_kv_u32(g, ARCH_KEY("embedding_length"), (uint32_t)cfg.hidden_size);
    tide_gguf_kv_u32(g, ARCH_KEY("block_count"), (uint32_t)cfg.num_hidden_layers);
    tide_gguf_kv_u32(g, ARCH_KEY("feed_forward_length"), (uint32_t)cfg.intermediate_size);
    tide_gguf_kv_u32(g, ARCH_KEY("attention.head_count"), (uint32_t)H);
    tide_gguf_kv_u32(g, ARCH_KEY("attention.head_count_kv"), (uint32_t)KV);
    tide_gguf_kv_u32(g, ARCH_KEY("attention.key_length"), (uint32_t)hd);
    tide_gguf_kv_u32(g, ARCH_KEY("attention.value_length"), (uint32_t)hd);
    tide_gguf_kv_u32(g, ARCH_KEY("rope.dimension_count"), (uint32_t)hd);
    tide_gguf_kv_f32(g, ARCH_KEY("rope.freq_base"), cfg.rope_theta);
    tide_gguf_kv_f32(g, ARCH_KEY("attention.layer_norm_rms_epsilon"), cfg.rms_norm_eps);
    tide_gguf_kv_u32(g, ARCH_KEY("vocab_size"), (uint32_t)cfg.vocab_size);
#undef ARCH_KEY

    char tj[4096];
    snprintf(tj, sizeof tj, "%s/tokenizer.json", in_dir);
    bool gpt2 = false;
    if (src && tide_gguf_find_key(src, "tokenizer.ggml.tokens") >= 0) {
        /* a GGUF input: its tokenizer, key for key */
        for (int64_t k = 0; k < tide_gguf_n_kv(src); k++) {
            const char *key;
            tide_gguf_value v;
            if (tide_gguf_kv(src, k, &key, &v) && !strncmp(key, "tokenizer.", 10)) tide_gguf_kv_copy(g, key, &v);
        }
        const char *model = "?";
        uint64_t ml = 1, nt = 0;
        tide_gguf_value v;
        if (tide_gguf_get(src, "tokenizer.ggml.model", &v)) tide_gguf_value_str(&v, &model, &ml);
        snprintf(S.tokenizer, sizeof S.tokenizer, "%.*s", (int)(ml < 15 ? ml : 15), model);
        if (tide_gguf_get(src, "tokenizer.ggml.tokens", &v)) tide_gguf_value_array(&v, &nt, NULL);
        S.n_vocab_tokens = (int32_t)nt;
        goto tensors;
    }
    if (!src && stat(tj, &sb) == 0) {
        if ((st = tide_tokenizer_open(ctx, in_dir, &tok)) != TIDE_OK) goto out;
        if ((st = tokenizer_vocab(ctx, tok, cfg.vocab_size, &voc, &gpt2)) != TIDE_OK) goto out;
        snprintf(S.tokenizer, sizeof S.tokenizer, "%s", gpt2 ? "gpt2" : "llama");
        S.n_vocab_tokens = tok->n_vocab;
    } else {
        if ((st = placeholder_vocab(ctx, cfg.vocab_size, &voc)) != TIDE_OK) goto out;
        snprintf(S.tokenizer, sizeof S.tokenizer, "none");
    }
    tide_gguf_kv_str(g, "tokenizer.ggml.model", gpt2 ? "gpt2" : "llama");
    if (gpt2) tide_gguf_kv_str(g, "tokenizer.ggml.pre", pre_name(tok->json_path));
    tide_gguf_kv_str_array(g, "tokenizer.ggml.tokens", (const char *const *)voc.tokens, voc.lens, (uint64_t)voc.n);
    tide_gguf_kv_f32_array(g, "tokenizer.ggml.scores", voc.scores, (uint64_t)voc.n);
    tide_gguf_kv_i32_array(g, "tokenizer.ggml.token_type", voc.types, (uint64_t)voc.n);
    if (gpt2) tide_gguf_kv_str_array(g, "tokenizer.ggml.merges", (const char *const *)voc.merges, NULL,
                                     (uint64_t)voc.n_merges);
    if (tok) {
        if (tok->bos >= 0) tide_gguf_kv_u32(g, "tokenizer.ggml.bos_token_id", (uint32_t)tok->bos);
        if (tok->eos >= 0) tide_gguf_kv_u32(g, "tokenizer.ggml.eos_token_id", (uint32_t)tok->eos);
        if (tok->unk_id >= 0) tide_gguf_kv_u32(g, "tokenizer.ggml.unknown_token_id", (uint32_t)tok->unk_id);
        bool add_bos = false, add_eos = false;
        for (int k = 0; k < tok->n_prefix; k++) add_bos = add_bos || (tok->bos >= 0 && tok->prefix[k] == tok->bos);
        for (int k = 0; k < tok->n_suffix; k++) add_eos = add_eos || (tok->eos >= 0 && tok->suffix[k] == tok->eos);
        tide_gguf_kv_bool(g, "tokenizer.ggml.add_bos_token", add_bos);
        tide_gguf_kv_bool(g, "tokenizer.ggml.add_eos_token", add_eos);
        const char *ct = tide_tokenizer_chat_template(tok);
        if (ct) tide_gguf_kv_str(g, "tokenizer.chat_template", ct);
    } else {
        tide_gguf_kv_u32(g, "tokenizer.ggml.unknown_token_id", 0);
        tide_gguf_kv_u32(g, "tokenizer.ggml.bos_token_id", 1);
        tide_gguf_kv_u32(g, "tokenizer.ggml.eos_token_id", 2);
        tide_gguf_kv_bool(g, "tokenizer.ggml.add_bos_token", false);
    }

tensors:;
    /* tensor descriptions and stats */
    uint64_t total = 0;
    for (int i = 0; i < n; i++) {
        int64_t dims[2] = {T[i].cols, T[i].rows};
        if (tide_gguf_add_tensor(g, T[i].gguf, T[i].type, T[i].ndim, dims) < 0) break;
        uint64_t el = (uint64_t)T[i].rows * (uint64_t)T[i].cols;
        total += el;
        if ((unsigned)T[i].type < TIDE_QUANT_STAT_TYPES) {
            S.tensors[T[i].type]++;
            S.elements[T[i].type] += el;
            S.bytes[T[i].type] += tide_dtype_bytes(T[i].type, el);
        }
        if (T[i].ndim == 2) {
            tide_dtype rule;
            tide_quant_mix_type(m, T[i].kind, T[i].layer, cfg.num_hidden_layers, T[i].cols, &rule);
            if (rule != T[i].type) S.fallbacks++;
        }
    }
    qjob J = {.ctx = ctx, .ck = ck, .cfg = &cfg, .t = T, .n = n, .out = out_path, .total = total};
    if ((st = tide_gguf_write(ctx, g, out_path, write_tensor, &J)) != TIDE_OK) goto out;
    if (stat(out_path, &sb) == 0) S.file_bytes = (uint64_t)sb.st_size;
    if (stats) *stats = S;
out:
    tide_gguf_close(src);
    vocab_free(&voc);
    tide_gguf_free(g);
    tide_tokenizer_free(tok);
    tide_free(T);
    tide_checkpoint_free(ck);
    return st;
}
