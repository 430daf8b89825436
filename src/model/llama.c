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
 *            cache.L.k / cache.L.v (B, C, KV*hd) f32             STATE
 *            (with a cache_row, "cache.L.k.rN": rows N.. of them)
 *     hm   = h.L + attn . o_proj^T                               (R, D)
 *     xn2  = rmsnorm(hm, post_attention_layernorm)
 *     mlp  = (silu(xn2 . gate^T) * (xn2 . up^T)) . down^T        (R, I) -> (R, D)
 *     h.L+1 = hm + mlp
 *   last = take_last(h.N) (B, D) unless all_logits
 *   logits = rmsnorm(., model.norm.weight) . lm_head^T           (B or R, V) OUTPUT
 *   next_token = argmax(logits)                                  (B or R) i32 OUTPUT
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

/* A 2-D weight split into row blocks of at most `max_bytes` (0: whole). */
#define MAX_BLOCKS 4096
typedef struct wsplit {
    int n;
    int id[MAX_BLOCKS];
    int64_t row0[MAX_BLOCKS];
} wsplit;

static void split(builder *b, wsplit *w, tide_dtype dt, int64_t N, int64_t K, uint64_t max_bytes,
                  const char *fmt, int layer) {
    char name[128], bname[192];
    snprintf(name, sizeof name, fmt, layer);
    uint64_t row_bytes = (uint64_t)K * tide_dtype_size(dt), bytes = row_bytes * (uint64_t)N;
    int64_t nblk = max_bytes && bytes > max_bytes ? (int64_t)((bytes + max_bytes - 1) / max_bytes) : 1;
    nblk = TIDE_MIN(TIDE_MIN(nblk, N), (int64_t)MAX_BLOCKS);
    int64_t per = (N + nblk - 1) / nblk;
    w->n = 0;
    for (int64_t r0 = 0; r0 < N && !b->st; r0 += per) {
        int64_t r1 = TIDE_MIN(N, r0 + per);
        int id;
        if (nblk == 1) {
            id = tide_graph_find(b->g, name);
            if (id < 0) id = tensor(b, name, dt, TIDE_ROLE_WEIGHT, 2, N, K, 0);
        } else {
            snprintf(bname, sizeof bname, "%s[%lld:%lld]", name, (long long)r0, (long long)r1);
            id = tide_graph_find(b->g, bname);
            if (id < 0) {
                id = tensor(b, bname, dt, TIDE_ROLE_WEIGHT, 2, r1 - r0, K, 0);
                if (!b->st) b->st = tide_graph_set_tensor_home(b->g, id, name, (uint64_t)r0 * row_bytes);
            }
        }
        w->id[w->n] = id;
        w->row0[w->n++] = r0;
    }
}

/* A run of rows: `nb` whole sequences from b0 (untiled), or rows [t0, t0+n)
 * of sequence b0. */
typedef struct tile {
    int b0, nb;
    int64_t t0, n;
} tile;

static int act(builder *b, const char *what, int64_t rows, int64_t cols) {
    char name[128];
    if (b->layer >= 0) snprintf(name, sizeof name, "l%d.%s", b->layer, what);
    else snprintf(name, sizeof name, "%s", what);
    return tensor(b, name, TIDE_F32, TIDE_ROLE_TEMP, 2, rows, cols, 0);
}

/* Activation `what` of tile k (no suffix when there is one tile). */
static int tact(builder *b, const char *what, int k, int n_tiles, int64_t rows, int64_t cols) {
    if (n_tiles == 1) return act(b, what, rows, cols);
    char name[96];
    snprintf(name, sizeof name, "%s.t%d", what, k);
    return act(b, name, rows, cols);
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
    if (o->tile_rows < 0) return tide_err(ctx, TIDE_E_INVALID, "tile rows %d is negative", o->tile_rows);
    if (o->row_pos && o->fresh_cache)
        return tide_err(ctx, TIDE_E_INVALID, "a position per row reads the caches: not with a fresh cache");
    if (o->cache_row < 0) return tide_err(ctx, TIDE_E_INVALID, "cache row %d is negative", o->cache_row);
    const int64_t D = cfg->hidden_size, H = cfg->num_attention_heads, KV = cfg->num_key_value_heads;
    const int64_t hd = D / H, I = cfg->intermediate_size, V = cfg->vocab_size, R = (int64_t)B * T;
    const int64_t kd = KV * hd;
    const tide_dtype wt = cfg->dtype;
    const uint64_t wmax = o->tile_weight_bytes;

    /* the tiles: one for all rows, or runs of up to tile_rows of one sequence */
    const bool tiled = o->tile_rows > 0 && (B > 1 || o->tile_rows < T);
    const int64_t per = tiled ? TIDE_MIN((int64_t)o->tile_rows, (int64_t)T) : T;
    const int64_t tiles_per_seq = (T + per - 1) / per;
    const int64_t n_tiles = tiled ? (int64_t)B * tiles_per_seq : 1;
    if (n_tiles > 65536)
        return tide_err(ctx, TIDE_E_INVALID, "%lld tiles of %lld rows are too many (at most 65536)",
                        (long long)n_tiles, (long long)per);
    tile *tl = tide_calloc((size_t)n_tiles, sizeof *tl);
    int *hs = tide_calloc((size_t)n_tiles * 12, sizeof *hs);
    wsplit *ws = tide_malloc(sizeof *ws);
    if (!tl || !hs || !ws) {
        tide_free(tl);
        tide_free(hs);
        tide_free(ws);
        return tide_err(ctx, TIDE_E_NOMEM, "out of memory building a graph");
    }
    if (!tiled) tl[0] = (tile){.b0 = 0, .nb = B, .t0 = 0, .n = T};
    else
        for (int64_t k = 0; k < n_tiles; k++) {
            int64_t t0 = (k % tiles_per_seq) * per;
            tl[k] = (tile){.b0 = (int)(k / tiles_per_seq), .nb = 1, .t0 = t0, .n = TIDE_MIN(per, T - t0)};
        }
    const int NT = (int)n_tiles;
    /* per-tile activation ids: h, xn, q, k, v, qr, kr, attn, proj, hm, xn2, gate, (up, sw, down reuse) */
    int *h = hs, *A = hs + NT, *Bq = hs + 2 * NT, *Bk = hs + 3 * NT, *Bv = hs + 4 * NT, *Cq = hs + 5 * NT,
        *Ck = hs + 6 * NT, *At = hs + 7 * NT, *P = hs + 8 * NT, *M = hs + 9 * NT, *G = hs + 10 * NT, *U = hs + 11 * NT;
#define ROWS(k) ((int64_t)tl[k].nb * tl[k].n)

    builder b = {.g = tide_graph_new(ctx), .layer = -1};
    if (!b.g) {
        tide_free(tl);
        tide_free(hs);
        tide_free(ws);
        return TIDE_E_NOMEM;
    }
    const int tokens = tensor(&b, "tokens", TIDE_I32, TIDE_ROLE_INPUT, 2, B, T, 0);
    const int pos = tensor(&b, "pos", TIDE_I32, TIDE_ROLE_INPUT, 1, o->row_pos ? R : T, 0, 0);

    /* matmul of every tile's x[k] by a (split) weight into out[k] */
    #define MATMUL_TILES(X, OUT, NAME, N_, K_, FMT, LAYER)                                              \
        do {                                                                                           \
            split(&b, ws, wt, (N_), (K_), wmax, FMT, LAYER);                                           \
            for (int j = 0; j < ws->n && !b.st; j++)                                                   \
                for (int k = 0; k < NT && !b.st; k++) {                                                \
                    if (j == 0) (OUT)[k] = tact(&b, NAME, k, NT, ROWS(k), (N_));                       \
                    tide_op_params mp = {.col0 = ws->row0[j]};                                         \
                    int in3[3] = {(X)[k], ws->id[j], (OUT)[k]};                                        \
                    op(&b, TIDE_OP_MATMUL, j ? 3 : 2, in3, 1, &(OUT)[k], &mp);                         \
                }                                                                                      \
        } while (0)

    split(&b, ws, wt, V, D, wmax, "model.embed_tokens.weight", 0);
    for (int j = 0; j < ws->n && !b.st; j++)
        for (int k = 0; k < NT && !b.st; k++) {
            if (j == 0) h[k] = tact(&b, "h.0", k, NT, ROWS(k), D);
            tide_op_params ep = {.idx0 = (int64_t)tl[k].b0 * T + tl[k].t0, .vocab0 = ws->row0[j],
                                 .vocab = ws->n > 1 ? V : 0};
            int in3[3] = {ws->id[j], tokens, h[k]};
            op(&b, TIDE_OP_EMBED, j ? 3 : 2, in3, 1, &h[k], &ep);
        }

    tide_op_params norm = {.eps = cfg->rms_norm_eps};
    int *kc = tide_calloc((size_t)B * 2, sizeof *kc), *vc = kc ? kc + B : NULL;
    if (!kc && !b.st) b.st = tide_err(ctx, TIDE_E_NOMEM, "out of memory building a graph");

    for (int L = 0; L < cfg->num_hidden_layers && !b.st; L++) {
        b.layer = L;
        int w_in = weight(&b, wt, D, 0, "model.layers.%d.input_layernorm.weight", L);
        int w_post = weight(&b, wt, D, 0, "model.layers.%d.post_attention_layernorm.weight", L);
        char cname[64];
        snprintf(cname, sizeof cname, "cache.%d.k", L);
        uint64_t seq_bytes = (uint64_t)C * (uint64_t)kd * sizeof(float);
        if (!tiled && !o->cache_row) {
            kc[0] = tensor(&b, cname, TIDE_F32, TIDE_ROLE_STATE, 3, B, C, kd);
            snprintf(cname, sizeof cname, "cache.%d.v", L);
            vc[0] = tensor(&b, cname, TIDE_F32, TIDE_ROLE_STATE, 3, B, C, kd);
        } else if (!tiled) { /* rows cache_row.. of the caches */
            for (int c = 0; c < 2 && !b.st; c++) {
                char whole[64], part[80];
                snprintf(whole, sizeof whole, "cache.%d.%c", L, c ? 'v' : 'k');
                snprintf(part, sizeof part, "%s.r%d", whole, o->cache_row);
                int id = tensor(&b, part, TIDE_F32, TIDE_ROLE_STATE, 3, B, C, kd);
                if (!b.st) b.st = tide_graph_set_tensor_home(b.g, id, whole, (uint64_t)o->cache_row * seq_bytes);
                (c ? vc : kc)[0] = id;
            }
        } else {
            for (int s = 0; s < B && !b.st; s++)
                for (int c = 0; c < 2 && !b.st; c++) {
                    char whole[64], part[80];
                    snprintf(whole, sizeof whole, "cache.%d.%c", L, c ? 'v' : 'k');
                    snprintf(part, sizeof part, "%s.b%d", whole, o->cache_row + s);
                    int id = tensor(&b, part, TIDE_F32, TIDE_ROLE_STATE, 3, 1, C, kd);
                    if (!b.st)
                        b.st = tide_graph_set_tensor_home(b.g, id, whole, (uint64_t)(o->cache_row + s) * seq_bytes);
                    (c ? vc : kc)[s] = id;
                }
        }
        for (int k = 0; k < NT; k++) A[k] = op1(&b, TIDE_OP_RMSNORM, h[k], w_in, tact(&b, "attn_norm", k, NT, ROWS(k), D), &norm);
        MATMUL_TILES(A, Bq, "q", H * hd, D, "model.layers.%d.self_attn.q_proj.weight", L);
        MATMUL_TILES(A, Bk, "k", kd, D, "model.layers.%d.self_attn.k_proj.weight", L);
        MATMUL_TILES(A, Bv, "v", kd, D, "model.layers.%d.self_attn.v_proj.weight", L);
        for (int k = 0; k < NT; k++) {
            /* a tile's first pos entry: its first step, or with a position per
             * row its first row */
            int64_t idx0 = o->row_pos ? (int64_t)tl[k].b0 * T + tl[k].t0 : tl[k].t0;
            tide_op_params rp = {.rope_theta = cfg->rope_theta, .n_heads = (int)H, .head_dim = (int)hd,
                                 .batch = tl[k].nb, .idx0 = idx0, .pos_rows = o->row_pos};
            Cq[k] = op1(&b, TIDE_OP_ROPE, Bq[k], pos, tact(&b, "q_rope", k, NT, ROWS(k), H * hd), &rp);
            rp.n_heads = (int)KV;
            Ck[k] = op1(&b, TIDE_OP_ROPE, Bk[k], pos, tact(&b, "k_rope", k, NT, ROWS(k), kd), &rp);
        }
        for (int k = 0; k < NT && !b.st; k++) {
            tide_op_params ap = {.n_heads = (int)H, .n_kv_heads = (int)KV, .head_dim = (int)hd,
                                 .batch = tl[k].nb, .idx0 = o->row_pos ? (int64_t)tl[k].b0 * T + tl[k].t0 : tl[k].t0,
                                 .pos_rows = o->row_pos};
            int s = tiled ? tl[k].b0 : 0;
            At[k] = tact(&b, "attn", k, NT, ROWS(k), H * hd);
            int ain[6] = {Cq[k], Ck[k], Bv[k], pos, kc[s], vc[s]}, aout[3] = {At[k], kc[s], vc[s]};
            op(&b, TIDE_OP_ATTENTION, o->fresh_cache && tl[k].t0 == 0 ? 4 : 6, ain, 3, aout, &ap);
        }
        MATMUL_TILES(At, P, "attn_out", D, H * hd, "model.layers.%d.self_attn.o_proj.weight", L);
        for (int k = 0; k < NT; k++) M[k] = op1(&b, TIDE_OP_ADD, h[k], P[k], tact(&b, "h_mid", k, NT, ROWS(k), D), NULL);
        for (int k = 0; k < NT; k++) A[k] = op1(&b, TIDE_OP_RMSNORM, M[k], w_post, tact(&b, "mlp_norm", k, NT, ROWS(k), D), &norm);
        MATMUL_TILES(A, G, "gate", I, D, "model.layers.%d.mlp.gate_proj.weight", L);
        MATMUL_TILES(A, U, "up", I, D, "model.layers.%d.mlp.up_proj.weight", L);
        for (int k = 0; k < NT; k++) G[k] = op1(&b, TIDE_OP_SILU_MUL, G[k], U[k], tact(&b, "swiglu", k, NT, ROWS(k), I), NULL);
        MATMUL_TILES(G, P, "mlp_out", D, I, "model.layers.%d.mlp.down_proj.weight", L);
        for (int k = 0; k < NT; k++) {
            char hname[32];
            snprintf(hname, sizeof hname, "h.%d", L + 1);
            b.layer = -1;
            int hn = tact(&b, hname, k, NT, ROWS(k), D);
            b.layer = L;
            h[k] = op1(&b, TIDE_OP_ADD, M[k], P[k], hn, NULL);
        }
    }
    b.layer = -1;
    int64_t rows = o->all_logits ? R : B;
    int wn = weight(&b, wt, D, 0, "model.norm.weight", 0);
    const char *head_name = cfg->tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
    int logits = tensor(&b, "logits", TIDE_F32, TIDE_ROLE_OUTPUT, 2, rows, V, 0);
    if (!o->all_logits) {
        /* the last row of each sequence (in its last tile), then norm and head */
        int last = act(&b, "last", B, D);
        bool first = true;
        for (int k = 0; k < NT && !b.st; k++) {
            if (tl[k].t0 + tl[k].n != T) continue;
            tide_op_params tp = {.batch = tl[k].nb, .row0 = tl[k].b0};
            int in2[2] = {h[k], last};
            op(&b, TIDE_OP_TAKE_LAST, first ? 1 : 2, in2, 1, &last, &tp);
            first = false;
        }
        int hn = op1(&b, TIDE_OP_RMSNORM, last, wn, act(&b, "final_norm", B, D), &norm);
        split(&b, ws, wt, V, D, wmax, head_name, 0);
        for (int j = 0; j < ws->n && !b.st; j++) {
            tide_op_params mp = {.col0 = ws->row0[j]};
            int in3[3] = {hn, ws->id[j], logits};
            op(&b, TIDE_OP_MATMUL, j ? 3 : 2, in3, 1, &logits, &mp);
        }
    } else {
        for (int k = 0; k < NT; k++) A[k] = op1(&b, TIDE_OP_RMSNORM, h[k], wn, tact(&b, "final_norm", k, NT, ROWS(k), D), &norm);
        split(&b, ws, wt, V, D, wmax, head_name, 0);
        for (int j = 0; j < ws->n && !b.st; j++)
            for (int k = 0; k < NT && !b.st; k++) {
                tide_op_params mp = {.col0 = ws->row0[j], .row0 = (int64_t)tl[k].b0 * T + tl[k].t0};
                int in3[3] = {A[k], ws->id[j], logits};
                op(&b, TIDE_OP_MATMUL, j || k ? 3 : 2, in3, 1, &logits, &mp);
            }
    }
    int next = tensor(&b, "next_token", TIDE_I32, TIDE_ROLE_OUTPUT, 1, rows, 0, 0);
    op1(&b, TIDE_OP_ARGMAX, logits, -1, next, NULL);
#undef MATMUL_TILES
#undef ROWS
    tide_free(kc);
    tide_free(tl);
    tide_free(hs);
    tide_free(ws);
    if (b.st) {
        tide_graph_free(b.g);
        return b.st;
    }
    *out = b.g;
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
