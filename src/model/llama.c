/*
 * llama.c - builds the forward graph of a LLaMA-style decoder (RMSNorm, RoPE,
 * grouped-query attention with a KV cache, SwiGLU MLP) from its configuration.
 *
 * Shapes, with R = B*T rows (batch-major), D = hidden, H heads, KV kv heads,
 * hd = D/H, I = intermediate, V = vocab, C = cache length:
 *
 *   tokens (B, T) i32, pos (T) i32 (B*T with row_pos)            INPUT
 *   h.0 = embed(model.embed_tokens.weight (V, D), tokens)        (R, D)
 *   per layer L:
 *     xn   = rmsnorm(h.L, input_layernorm (D))                   (R, D)
 *     q,k,v = xn . q_proj^T (H*hd), k_proj^T (KV*hd), v_proj^T   (R, *)
 *     qr,kr = rope(q), rope(k)
 *     attn = attention(qr, kr, v, pos, cache.L.k, cache.L.v)     (R, H*hd)
 *            (with fresh_cache the caches are only written: the run starts at 0)
 *            cache.L.k / cache.L.v (B, C, KV*hd) cache_dtype     STATE
 *            (f32 by default; f16, bf16 or q8_0: attention writes the new
 *            rows rounded to it and reads every position back converted)
 *            (with a cache_row, "cache.L.k.rN": rows N.. of them)
 *     hm   = h.L + attn . o_proj^T                               (R, D)
 *     xn2  = rmsnorm(hm, post_attention_layernorm)
 *     mlp  = (silu(xn2 . gate^T) * (xn2 . up^T)) . down^T        (R, I) -> (R, D)
 *     h.L+1 = hm + mlp
 *   last = take_last(h.N) (B, D) unless all_logits
 *   logits = rmsnorm(., model.norm.weight) . lm_head^T           (B or R, V) OUTPUT
 *   next_token = argmax(logits)                                  (B or R) i32 OUTPUT
 *
 * The decoder layer is built by model/llama_layer.c (llama_int.h), which the
 * training graph (train/train_graph.c) builds its forward with too.
 *
 * Tiled (opts tile_rows / tile_weight_bytes): every activation above exists
 * once per tile (".tK": up to tile_rows tokens of one sequence), each op runs
 * tile by tile, weight block by weight block (weight block outermost, so a
 * block is loaded once for all tiles), and each sequence has its own cache
 * tensors "cache.L.k.bB" (1, C, KV*hd), byte ranges of "cache.L.k". A tile
 * after a sequence's first reads the cache its predecessors wrote. Weights
 * above tile_weight_bytes become row blocks "NAME[r0:r1]" (byte ranges of the
 * checkpoint tensor): matmuls write their block of output columns, the
 * embedding fills in the ids of its block.
 */
#include "model/llama_int.h"

#include <stdio.h>

static int op1(llama_builder *b, tide_op_kind kind, int a, int c, int out, const tide_op_args *p) {
    int in[2] = {a, c};
    llama_op(b, kind, kind == TIDE_OP_TAKE_LAST || kind == TIDE_OP_ARGMAX ? 1 : 2, in, 1, &out, p);
    return out;
}

static const char *const infer_names[LLAMA_NAMES] = {"attn_norm", "q",     "k",        "v",      "q_rope",
                                                     "k_rope",    "attn",  "attn_out", "h_mid",  "mlp_norm",
                                                     "gate",      "up",    "swiglu",   "mlp_out", "h"};

static tide_status check_opts(tide_ctx *ctx, const tide_llama_graph_opts *o) {
    const int B = o->batch, T = o->seq;
    const int C = o->ctx_len ? o->ctx_len : T;
    if (B < 1 || T < 1 || C < T)
        return tide_err(ctx, TIDE_E_INVALID, "graph needs batch >= 1, seq >= 1 and cache length >= seq "
                        "(got batch %d, seq %d, cache %d)", B, T, C);
    if ((int64_t)B * T > (INT64_C(1) << 31))
        return tide_err(ctx, TIDE_E_INVALID, "batch %d x seq %d is too many rows", B, T);
    if (o->tile_rows < 0) return tide_err(ctx, TIDE_E_INVALID, "tile rows %d is negative", o->tile_rows);
    if (o->row_pos && o->fresh_cache)
        return tide_err(ctx, TIDE_E_INVALID, "a position per row reads the caches: not with a fresh cache");
    if (o->cache_row < 0) return tide_err(ctx, TIDE_E_INVALID, "cache row %d is negative", o->cache_row);
    return TIDE_OK;
}

static tide_status check_lora(tide_ctx *ctx, const tide_llama_config *cfg) {
    if (cfg->lora_r <= 0) return TIDE_OK;
    if (cfg->lora_r > cfg->hidden_size || !cfg->lora_targets || (cfg->lora_targets & ~TIDE_LORA_ALL) ||
        !(cfg->lora_alpha > 0) ||
        (cfg->lora_dtype != TIDE_F32 && cfg->lora_dtype != TIDE_F16 && cfg->lora_dtype != TIDE_BF16))
        return tide_err(ctx, TIDE_E_INVALID, "LoRA r %d, alpha %g, targets 0x%x, %s: r from 1 to the hidden size, "
                        "alpha > 0, targets among 0x7f, weights f32, f16 or bf16", cfg->lora_r,
                        (double)cfg->lora_alpha, cfg->lora_targets, tide_dtype_name(cfg->lora_dtype));
    if (cfg->qk_interleaved && (cfg->lora_targets & (TIDE_LORA_Q | TIDE_LORA_K)))
        return tide_err(ctx, TIDE_E_UNSUPPORTED, "LoRA on q_proj or k_proj of a model whose rows are in llama.cpp's "
                        "rotary order (GGUF) is not supported");
    return TIDE_OK;
}

/* The tiles: one for all rows, or runs of up to tile_rows of one sequence
 * (*tiled). A new array of *n, or NULL (message in ctx). */
static llama_tile *make_tiles(tide_ctx *ctx, const tide_llama_graph_opts *o, bool *tiled, int *n) {
    const int B = o->batch, T = o->seq;
    *tiled = o->tile_rows > 0 && (B > 1 || o->tile_rows < T);
    const int64_t per = *tiled ? TIDE_MIN((int64_t)o->tile_rows, (int64_t)T) : T;
    const int64_t tiles_per_seq = (T + per - 1) / per;
    const int64_t n_tiles = *tiled ? (int64_t)B * tiles_per_seq : 1;
    if (n_tiles > 65536) {
        tide_err(ctx, TIDE_E_INVALID, "%lld tiles of %lld rows are too many (at most 65536)", (long long)n_tiles,
                 (long long)per);
        return NULL;
    }
    llama_tile *tl = tide_calloc((size_t)n_tiles, sizeof *tl);
    if (!tl) {
        tide_err(ctx, TIDE_E_NOMEM, "out of memory building a graph");
        return NULL;
    }
    if (!*tiled) tl[0] = (llama_tile){.b0 = 0, .nb = B, .t0 = 0, .n = T};
    else
        for (int64_t k = 0; k < n_tiles; k++) {
            int64_t t0 = (k % tiles_per_seq) * per;
            tl[k] = (llama_tile){.b0 = (int)(k / tiles_per_seq), .nb = 1, .t0 = t0, .n = TIDE_MIN(per, T - t0)};
        }
    *n = (int)n_tiles;
    return tl;
}

/* Layer L's caches: whole (kc[0], vc[0]), rows cache_row.. of them, or
 * with tiles one per sequence (kc[s], vc[s]: byte ranges of the whole). */
static void layer_caches(llama_builder *b, const tide_llama_config *cfg, const tide_llama_graph_opts *o, bool tiled,
                         int L, int *kc, int *vc) {
    const int B = o->batch, C = o->ctx_len ? o->ctx_len : o->seq;
    const int64_t kd = (int64_t)cfg->num_key_value_heads * (cfg->hidden_size / cfg->num_attention_heads);
    const tide_dtype dt = o->cache_dtype;
    const uint64_t seq_bytes = (uint64_t)C * tide_dtype_bytes(dt, (uint64_t)kd);
    char whole[64], part[80];
    if (!tiled && !o->cache_row) {
        snprintf(whole, sizeof whole, "cache.%d.k", L);
        kc[0] = llama_tensor(b, whole, dt, TIDE_ROLE_STATE, 3, B, C, kd);
        snprintf(whole, sizeof whole, "cache.%d.v", L);
        vc[0] = llama_tensor(b, whole, dt, TIDE_ROLE_STATE, 3, B, C, kd);
        return;
    }
    const int n_seq = tiled ? B : 1;
    for (int s = 0; s < n_seq && !b->st; s++)
        for (int c = 0; c < 2 && !b->st; c++) {
            snprintf(whole, sizeof whole, "cache.%d.%c", L, c ? 'v' : 'k');
            int row = o->cache_row + (tiled ? s : 0);
            if (tiled) snprintf(part, sizeof part, "%s.b%d", whole, row);
            else snprintf(part, sizeof part, "%s.r%d", whole, row);
            int id = llama_tensor(b, part, dt, TIDE_ROLE_STATE, 3, tiled ? 1 : B, C, kd);
            if (!b->st) b->st = tide_graph_set_tensor_home(b->g, id, whole, (uint64_t)row * seq_bytes);
            (c ? vc : kc)[s] = id;
        }
}

/* Layer L's LoRA adapters (cfg->lora_r > 0, tide_checkpoint_add_lora):
 * per target of cfg->lora_targets the WEIGHTs A (r, K) and B (N, r) in
 * PEFT's names and cfg->lora_dtype, -1 elsewhere. */
static void layer_adapters(llama_builder *b, const tide_llama_config *cfg, int L, llama_lora *lo) {
    static const char *const path[TIDE_LORA_N] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                                  "self_attn.o_proj", "mlp.gate_proj",    "mlp.up_proj",
                                                  "mlp.down_proj"};
    const int64_t D = cfg->hidden_size, hd = D / cfg->num_attention_heads, I = cfg->intermediate_size;
    const int64_t q = (int64_t)cfg->num_attention_heads * hd, kv = (int64_t)cfg->num_key_value_heads * hd;
    const int64_t N[TIDE_LORA_N] = {q, kv, kv, D, I, I, D}, K[TIDE_LORA_N] = {D, D, D, q, D, D, I};
    const int r = cfg->lora_r;
    for (int i = 0; i < TIDE_LORA_N; i++) {
        lo->a[i] = lo->b[i] = -1;
        if (!(cfg->lora_targets & (1u << i))) continue;
        char name[160];
        snprintf(name, sizeof name, "base_model.model.model.layers.%d.%s.lora_A.weight", L, path[i]);
        lo->a[i] = llama_tensor(b, name, cfg->lora_dtype, TIDE_ROLE_WEIGHT, 2, r, K[i], 0);
        snprintf(name, sizeof name, "base_model.model.model.layers.%d.%s.lora_B.weight", L, path[i]);
        lo->b[i] = llama_tensor(b, name, cfg->lora_dtype, TIDE_ROLE_WEIGHT, 2, N[i], r, 0);
    }
}

/* logits (and next_token) from the last layer's h of every tile: the last
 * row of each sequence, or with all_logits every row. */
static void head(llama_builder *b, const tide_llama_config *cfg, const tide_llama_graph_opts *o,
                 const llama_layer_in *li, llama_acts *acts) {
    const int B = o->batch, T = o->seq, NT = li->n_tiles;
    const int64_t D = cfg->hidden_size, V = cfg->vocab_size, rows = o->all_logits ? (int64_t)B * T : B;
    const llama_tile *tl = li->tiles;
    llama_wsplit *ws = li->ws;
    tide_op_args norm = {.eps = cfg->rms_norm_eps};
    b->layer = -1;
    int wn = llama_weight(b, cfg->dtype, D, 0, "model.norm.weight", 0);
    const char *head_name = cfg->tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
    int logits = llama_tensor(b, "logits", TIDE_F32, TIDE_ROLE_OUTPUT, 2, rows, V, 0);
    if (!o->all_logits) {
        /* the last row of each sequence (in its last tile), then norm and head */
        int last = llama_act(b, "last", 0, 1, B, D);
        bool first = true;
        for (int k = 0; k < NT && !b->st; k++) {
            if (tl[k].t0 + tl[k].n != T) continue;
            tide_op_args tp = {.batch = tl[k].nb, .row0 = tl[k].b0};
            int in2[2] = {acts[k].h, last};
            llama_op(b, TIDE_OP_TAKE_LAST, first ? 1 : 2, in2, 1, &last, &tp);
            first = false;
        }
        int hn = op1(b, TIDE_OP_RMSNORM, last, wn, llama_act(b, "final_norm", 0, 1, B, D), &norm);
        llama_split(b, ws, cfg->dtype, V, D, o->tile_weight_bytes, head_name, 0);
        for (int j = 0; j < ws->n && !b->st; j++) {
            tide_op_args mp = {.col0 = ws->row0[j]};
            int in3[3] = {hn, ws->id[j], logits};
            llama_op(b, TIDE_OP_MATMUL, j ? 3 : 2, in3, 1, &logits, &mp);
        }
    } else {
        for (int k = 0; k < NT; k++)
            acts[k].xn = op1(b, TIDE_OP_RMSNORM, acts[k].h, wn,
                             llama_act(b, "final_norm", k, NT, (int64_t)tl[k].nb * tl[k].n, D), &norm);
        llama_split(b, ws, cfg->dtype, V, D, o->tile_weight_bytes, head_name, 0);
        for (int j = 0; j < ws->n && !b->st; j++)
            for (int k = 0; k < NT && !b->st; k++) {
                tide_op_args mp = {.col0 = ws->row0[j], .row0 = (int64_t)tl[k].b0 * T + tl[k].t0};
                int in3[3] = {acts[k].xn, ws->id[j], logits};
                llama_op(b, TIDE_OP_MATMUL, j || k ? 3 : 2, in3, 1, &logits, &mp);
            }
    }
    int next = llama_tensor(b, "next_token", TIDE_I32, TIDE_ROLE_OUTPUT, 1, rows, 0, 0);
    op1(b, TIDE_OP_ARGMAX, logits, -1, next, NULL);
}

tide_status tide_llama_build(tide_ctx *ctx, const tide_llama_config *cfg,
                             const tide_llama_graph_opts *o, tide_graph **out) {
    *out = NULL;
    tide_status st = tide_llama_config_check(ctx, cfg);
    if (st || (st = check_opts(ctx, o)) || (st = check_lora(ctx, cfg)) ||
        (st = tide_cache_dtype_ok(ctx, cfg, o->cache_dtype)))
        return st;
    const int B = o->batch, T = o->seq;
    const int64_t D = cfg->hidden_size, V = cfg->vocab_size, R = (int64_t)B * T;
    bool tiled;
    int NT = 0;
    llama_tile *tl = make_tiles(ctx, o, &tiled, &NT);
    if (!tl) return tide_ctx_last_status(ctx);
    llama_acts *acts = tide_calloc((size_t)NT, sizeof *acts);
    llama_wsplit *ws = tide_malloc(sizeof *ws);
    int *kc = tide_calloc((size_t)B * 2, sizeof *kc), *vc = kc ? kc + B : NULL;
    llama_builder b = {.g = acts && ws && kc ? tide_graph_new(ctx) : NULL, .layer = -1, .prefix = "", .wcfg = cfg,
                       .micro_batch = -1};
    if (!b.g) {
        tide_free(tl);
        tide_free(acts);
        tide_free(ws);
        tide_free(kc);
        return acts && ws && kc ? TIDE_E_NOMEM : tide_err(ctx, TIDE_E_NOMEM, "out of memory building a graph");
    }
    const int tokens = llama_tensor(&b, "tokens", TIDE_I32, TIDE_ROLE_INPUT, 2, B, T, 0);
    const int pos = llama_tensor(&b, "pos", TIDE_I32, TIDE_ROLE_INPUT, 1, o->row_pos ? R : T, 0, 0);

    /* the embedding, block by block, each block for every tile */
    llama_split(&b, ws, cfg->dtype, V, D, o->tile_weight_bytes, "model.embed_tokens.weight", 0);
    for (int j = 0; j < ws->n && !b.st; j++)
        for (int k = 0; k < NT && !b.st; k++) {
            if (j == 0) acts[k].h = llama_act(&b, "h.0", k, NT, (int64_t)tl[k].nb * tl[k].n, D);
            tide_op_args ep = {.idx0 = (int64_t)tl[k].b0 * T + tl[k].t0, .vocab0 = ws->row0[j],
                                 .vocab = ws->n > 1 ? V : 0};
            int in3[3] = {ws->id[j], tokens, acts[k].h};
            llama_op(&b, TIDE_OP_EMBED, j ? 3 : 2, in3, 1, &acts[k].h, &ep);
        }

    llama_layer_in li = {.cfg = cfg, .pos = pos, .seq = T, .pos_rows = o->row_pos, .tiles = tl, .n_tiles = NT,
                         .kc = kc, .vc = vc, .per_seq = tiled, .fresh_cache = o->fresh_cache,
                         .wmax = o->tile_weight_bytes, .ws = ws, .names = infer_names};
    llama_lora lo = {.r = cfg->lora_r, .scale = -1};
    if (cfg->lora_r > 0) {
        lo.scale = llama_tensor(&b, "lora_scale", TIDE_F32, TIDE_ROLE_INPUT, 2, cfg->lora_r, cfg->lora_r, 0);
        li.lora = &lo;
    }
    for (int L = 0; L < cfg->num_hidden_layers && !b.st; L++) {
        b.layer = L;
        /* the norm weights, then the caches, then the adapters, then the layer's ops */
        llama_weight(&b, cfg->dtype, D, 0, "model.layers.%d.input_layernorm.weight", L);
        llama_weight(&b, cfg->dtype, D, 0, "model.layers.%d.post_attention_layernorm.weight", L);
        layer_caches(&b, cfg, o, tiled, L, kc, vc);
        if (li.lora) layer_adapters(&b, cfg, L, &lo);
        llama_layer_forward(&b, &li, L, 0, NT, acts);
    }
    head(&b, cfg, o, &li, acts);
    tide_free(kc);
    tide_free(tl);
    tide_free(acts);
    tide_free(ws);
    if (b.st) {
        tide_graph_free(b.g);
        return b.st;
    }
    *out = b.g;
    return TIDE_OK;
}

tide_status tide_cache_dtype_ok(tide_ctx *ctx, const tide_llama_config *cfg, tide_dtype dt) {
    if (dt != TIDE_F32 && dt != TIDE_F16 && dt != TIDE_BF16 && dt != TIDE_Q8_0)
        return tide_err(ctx, TIDE_E_INVALID, "a KV cache is f32, f16, bf16 or q8_0, not %s", tide_dtype_name(dt));
    const int hd = cfg->num_attention_heads > 0 ? cfg->hidden_size / cfg->num_attention_heads : 0;
    /* q8_0 blocks of 32 along a row of KV*hd: a head's slice is whole blocks */
    if (dt == TIDE_Q8_0 && hd % 32)
        return tide_err(ctx, TIDE_E_INVALID, "a q8_0 KV cache needs a head_dim that is a multiple of 32 (this "
                        "model's is %d)", hd);
    return TIDE_OK;
}

bool tide_llama_tile_level(tide_llama_graph_opts *o, int level) {
    if (level < 0 || level >= TIDE_TILE_LEVELS) return false;
    if (level == 0) {
        o->tile_rows = 0;
        o->tile_weight_bytes = 0;
        return true;
    }
    int64_t rows = ((int64_t)o->seq + (INT64_C(1) << (level - 1)) - 1) >> (level - 1);
    o->tile_rows = (int)TIDE_MAX(rows, TIDE_MIN((int64_t)16, (int64_t)o->seq));
    o->tile_weight_bytes = TIDE_MAX((UINT64_C(64) << 20) >> (level - 1), UINT64_C(1) << 20);
    return true;
}
