/*
 * llama.c - builds the forward graph of a LLaMA-style decoder (RMSNorm, RoPE,
 * grouped-query attention with a KV cache, SwiGLU MLP) from its configuration.
 *
 * Shapes, with R = B*T rows (batch-major), D = hidden, H heads, KV kv heads,
 * hd = D/H, I = intermediate, V = vocab, C = cache length:
 *
 *   tokens (B, T) i32, pos (T) i32                               INPUT
 *   h.0 = embed(model.embed_tokens.weight (V, D), tokens)        (R, D)
 *   per layer L:
 *     xn   = rmsnorm(h.L, input_layernorm (D))                   (R, D)
 *     q,k,v = xn . q_proj^T (H*hd), k_proj^T (KV*hd), v_proj^T   (R, *)
 *     qr,kr = rope(q), rope(k)
 *     attn = attention(qr, kr, v, pos, cache.L.k, cache.L.v)     (R, H*hd)
 *            (with fresh_cache the caches are only written: the run starts at 0)
 *            cache.L.k / cache.L.v (B, C, KV*hd) f32             STATE
 *     hm   = h.L + attn . o_proj^T                               (R, D)
 *     xn2  = rmsnorm(hm, post_attention_layernorm)
 *     mlp  = (silu(xn2 . gate^T) * (xn2 . up^T)) . down^T        (R, I) -> (R, D)
 *     h.L+1 = hm + mlp
 *   last = take_last(h.N) (B, D) unless all_logits
 *   logits = rmsnorm(., model.norm.weight) . lm_head^T           (B or R, V) OUTPUT
 *   next_token = argmax(logits)                                  (B or R) i32 OUTPUT
 */
#include "graph/graph.h"

#include <stdio.h>

typedef struct builder {
    tide_graph *g;
    tide_status st;
    int layer;
} builder;

static int tensor(builder *b, const char *name, tide_dtype dt, tide_role role, int ndim,
                  int64_t d0, int64_t d1, int64_t d2) {
    if (b->st) return -1;
    int64_t shape[3] = {d0, d1, d2};
    int id = -1;
    b->st = tide_graph_add_tensor(b->g, name, dt, role, ndim, shape, &id);
    if (!b->st) tide_graph_set_tensor_layer(b->g, id, b->layer);
    return id;
}

static int weight(builder *b, tide_dtype dt, int64_t d0, int64_t d1, const char *fmt, int layer) {
    char name[128];
    snprintf(name, sizeof name, fmt, layer);
    return tensor(b, name, dt, TIDE_ROLE_WEIGHT, d1 ? 2 : 1, d0, d1, 0);
}

static int act(builder *b, const char *what, int64_t rows, int64_t cols) {
    char name[128];
    if (b->layer >= 0) snprintf(name, sizeof name, "l%d.%s", b->layer, what);
    else snprintf(name, sizeof name, "%s", what);
    return tensor(b, name, TIDE_F32, TIDE_ROLE_TEMP, 2, rows, cols, 0);
}

static void op(builder *b, tide_op_kind kind, int n_in, const int *in, int n_out, const int *out,
               const tide_op_params *p) {
    if (b->st) return;
    b->st = tide_graph_add_op(b->g, kind, n_in, in, n_out, out, p, b->layer, NULL);
}

static int op1(builder *b, tide_op_kind kind, int a, int c, int out, const tide_op_params *p) {
    int in[2] = {a, c};
    op(b, kind, kind == TIDE_OP_TAKE_LAST || kind == TIDE_OP_ARGMAX ? 1 : 2, in, 1, &out, p);
    return out;
}

tide_status tide_llama_build(tide_ctx *ctx, const tide_llama_config *cfg,
                             const tide_llama_graph_opts *o, tide_graph **out) {
    *out = NULL;
    tide_status st = tide_llama_config_check(ctx, cfg);
    if (st) return st;
    const int B = o->batch, T = o->seq;
    const int C = o->ctx_len ? o->ctx_len : T;
    if (B < 1 || T < 1 || C < T)
        return tide_err(ctx, TIDE_E_INVALID, "graph needs batch >= 1, seq >= 1 and cache length >= seq "
                        "(got batch %d, seq %d, cache %d)", B, T, C);
    if ((int64_t)B * T > (INT64_C(1) << 31))
        return tide_err(ctx, TIDE_E_INVALID, "batch %d x seq %d is too many rows", B, T);
    const int64_t D = cfg->hidden_size, H = cfg->num_attention_heads, KV = cfg->num_key_value_heads;
    const int64_t hd = D / H, I = cfg->intermediate_size, V = cfg->vocab_size, R = (int64_t)B * T;
    const tide_dtype wt = cfg->dtype;

    builder b = {.g = tide_graph_new(ctx), .layer = -1};
    if (!b.g) return TIDE_E_NOMEM;
    const int tokens = tensor(&b, "tokens", TIDE_I32, TIDE_ROLE_INPUT, 2, B, T, 0);
    const int pos = tensor(&b, "pos", TIDE_I32, TIDE_ROLE_INPUT, 1, T, 0, 0);
    const int embed = weight(&b, wt, V, D, "model.embed_tokens.weight", 0);
    int h = act(&b, "h.0", R, D);
    op1(&b, TIDE_OP_EMBED, embed, tokens, h, NULL);

    tide_op_params norm = {.eps = cfg->rms_norm_eps};
    tide_op_params rope_q = {.rope_theta = cfg->rope_theta, .n_heads = (int)H, .head_dim = (int)hd, .batch = B};
    tide_op_params rope_k = rope_q;
    rope_k.n_heads = (int)KV;
    tide_op_params attn = {.n_heads = (int)H, .n_kv_heads = (int)KV, .head_dim = (int)hd, .batch = B};

    for (int L = 0; L < cfg->num_hidden_layers && !b.st; L++) {
        b.layer = L;
        int w_in = weight(&b, wt, D, 0, "model.layers.%d.input_layernorm.weight", L);
        int wq = weight(&b, wt, H * hd, D, "model.layers.%d.self_attn.q_proj.weight", L);
        int wk = weight(&b, wt, KV * hd, D, "model.layers.%d.self_attn.k_proj.weight", L);
        int wv = weight(&b, wt, KV * hd, D, "model.layers.%d.self_attn.v_proj.weight", L);
        int wo = weight(&b, wt, D, H * hd, "model.layers.%d.self_attn.o_proj.weight", L);
        int w_post = weight(&b, wt, D, 0, "model.layers.%d.post_attention_layernorm.weight", L);
        int wg = weight(&b, wt, I, D, "model.layers.%d.mlp.gate_proj.weight", L);
        int wu = weight(&b, wt, I, D, "model.layers.%d.mlp.up_proj.weight", L);
        int wd = weight(&b, wt, D, I, "model.layers.%d.mlp.down_proj.weight", L);
        char cname[64];
        snprintf(cname, sizeof cname, "cache.%d.k", L);
        int kc = tensor(&b, cname, TIDE_F32, TIDE_ROLE_STATE, 3, B, C, KV * hd);
        snprintf(cname, sizeof cname, "cache.%d.v", L);
        int vc = tensor(&b, cname, TIDE_F32, TIDE_ROLE_STATE, 3, B, C, KV * hd);

        int xn = op1(&b, TIDE_OP_RMSNORM, h, w_in, act(&b, "attn_norm", R, D), &norm);
        int q = op1(&b, TIDE_OP_MATMUL, xn, wq, act(&b, "q", R, H * hd), NULL);
        int k = op1(&b, TIDE_OP_MATMUL, xn, wk, act(&b, "k", R, KV * hd), NULL);
        int v = op1(&b, TIDE_OP_MATMUL, xn, wv, act(&b, "v", R, KV * hd), NULL);
        int qr = op1(&b, TIDE_OP_ROPE, q, pos, act(&b, "q_rope", R, H * hd), &rope_q);
        int kr = op1(&b, TIDE_OP_ROPE, k, pos, act(&b, "k_rope", R, KV * hd), &rope_k);
        int ao = act(&b, "attn", R, H * hd);
        int ain[6] = {qr, kr, v, pos, kc, vc}, aout[3] = {ao, kc, vc};
        op(&b, TIDE_OP_ATTENTION, o->fresh_cache ? 4 : 6, ain, 3, aout, &attn);
        int proj = op1(&b, TIDE_OP_MATMUL, ao, wo, act(&b, "attn_out", R, D), NULL);
        int hm = op1(&b, TIDE_OP_ADD, h, proj, act(&b, "h_mid", R, D), NULL);
        int xn2 = op1(&b, TIDE_OP_RMSNORM, hm, w_post, act(&b, "mlp_norm", R, D), &norm);
        int gate = op1(&b, TIDE_OP_MATMUL, xn2, wg, act(&b, "gate", R, I), NULL);
        int up = op1(&b, TIDE_OP_MATMUL, xn2, wu, act(&b, "up", R, I), NULL);
        int sw = op1(&b, TIDE_OP_SILU_MUL, gate, up, act(&b, "swiglu", R, I), NULL);
        int down = op1(&b, TIDE_OP_MATMUL, sw, wd, act(&b, "mlp_out", R, D), NULL);
        char hname[32];
        snprintf(hname, sizeof hname, "h.%d", L + 1);
        b.layer = -1;
        int hn = act(&b, hname, R, D);
        b.layer = L;
        h = op1(&b, TIDE_OP_ADD, hm, down, hn, NULL);
    }
    b.layer = -1;
    int64_t rows = o->all_logits ? R : B;
    if (!o->all_logits) {
        tide_op_params tl = {.batch = B};
        h = op1(&b, TIDE_OP_TAKE_LAST, h, -1, act(&b, "last", B, D), &tl);
    }
    int wn = weight(&b, wt, D, 0, "model.norm.weight", 0);
    int hn = op1(&b, TIDE_OP_RMSNORM, h, wn, act(&b, "final_norm", rows, D), &norm);
    int head = cfg->tie_word_embeddings ? embed : weight(&b, wt, V, D, "lm_head.weight", 0);
    int logits = tensor(&b, "logits", TIDE_F32, TIDE_ROLE_OUTPUT, 2, rows, V, 0);
    op1(&b, TIDE_OP_MATMUL, hn, head, logits, NULL);
    int next = tensor(&b, "next_token", TIDE_I32, TIDE_ROLE_OUTPUT, 1, rows, 0, 0);
    op1(&b, TIDE_OP_ARGMAX, logits, -1, next, NULL);
    if (b.st) {
        tide_graph_free(b.g);
        return b.st;
    }
    *out = b.g;
    return TIDE_OK;
}
