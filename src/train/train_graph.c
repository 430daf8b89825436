/*
 * train_graph.c - the graph of one training step of a LLaMA-style decoder
 * (tide_llama_build_train in tide.h).
 *
 * With R = B*T rows, per micro-batch M (names "mbM.*"):
 *
 *   forward, keeping what the backward reads (x = kept):
 *     h.0 = embed(E, tokens.M)                                       x
 *     per layer L:  xn = rmsnorm(h.L, ln1)                           x (h.L too)
 *                   q, k, v = xn . Wq^T, Wk^T, Wv^T                    x v
 *                   qr, kr = rope(q), rope(k)                          x qr, kr
 *                   a = attention(qr, kr, v) (no cache)                x
 *                   hm = h.L + a . Wo^T                                x
 *                   xn2 = rmsnorm(hm, ln2)                             x
 *                   g, u = xn2 . Wg^T, Wu^T                            x g, u
 *                   s = silu(g) * u                                    x
 *                   h.L+1 = hm + s . Wd^T                              x
 *     hf = rmsnorm(h.N, norm)                                        x
 *     loss.M, d_hf, grad(head) = cross_entropy(hf, head, targets.M)  (fused:
 *                   logits never exist beyond a chunk of rows)
 *   backward, in reverse:
 *     d_h.N, grad(norm) = rmsnorm_bwd(h.N, norm, d_hf)
 *     per layer L from the last:
 *                   d_s = d_h . Wd;  grad(Wd) += d_h^T . s
 *                   d_g, d_u = silu_mul_bwd(g, u, d_s)
 *                   d_xn2 = d_g . Wg + d_u . Wu;  grad(Wg), grad(Wu) += ...
 *                   d_hm = d_h + rmsnorm_bwd(hm, ln2, d_xn2)   (grad(ln2) +=)
 *                   d_a = d_hm . Wo;  grad(Wo) += d_hm^T . a
 *                   d_qr, d_kr, d_v = attention_bwd(qr, kr, v, a, d_a)
 *                   d_q, d_k = rope_bwd(d_qr), rope_bwd(d_kr)
 *                   d_xn = d_q . Wq + d_k . Wk + d_v . Wv;  grad(Wq, Wk, Wv) +=
 *                   d_h.L = d_hm + rmsnorm_bwd(h.L, ln1, d_xn)  (grad(ln1) +=)
 *     grad(E) += embed_bwd(d_h.0, tokens.M)
 *
 * The first micro-batch writes each gradient fresh, later ones add into it
 * (the accumulating forms of the ops). A tied head is the embedding: its
 * gradient gets both uses. Then grad_sumsq = sum over parameters of
 * sumsq(grad) (a chain, in parameter order), and one ADAMW per parameter,
 * in place on the parameter, its master and moments, clipped by the global
 * norm.
 *
 * Loss scale: each micro-batch's cross-entropy is a mean over its B*T rows
 * divided by accum, so the step's loss is the sum of the loss.M and its
 * gradients the mean over every row of the step.
 *
 * Row tiles (tile_seqs): each micro-batch runs as tiles of whole sequences
 * (attention needs a sequence's every row), each activation once per tile
 * ("NAME.tK"). The forward runs layer by layer, each layer tile by tile (a
 * layer's weights serve every tile at once); each tile then takes its final
 * norm, loss and its backward through the norm; the backward runs layer by
 * layer, tile by tile. The embedding and the loss read the tile's rows of
 * tokens.M and targets.M (idx0); the loss, the head's gradient and every
 * weight gradient add up over the tiles.
 */
#include "graph/graph.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

typedef struct tb {
    tide_graph *g;
    tide_status st;
    int layer;
} tb;

static int tensor(tb *b, const char *name, tide_dtype dt, tide_role role, int ndim, int64_t d0, int64_t d1) {
    if (b->st) return -1;
    int64_t shape[2] = {d0, d1};
    int id = -1;
    b->st = tide_graph_add_tensor(b->g, name, dt, role, ndim, shape, &id);
    if (!b->st) tide_graph_set_tensor_layer(b->g, id, b->layer);
    return id;
}

/* Activation `what` of micro-batch m, in layer b->layer when >= 0, of row
 * tile k of nt (no suffix when there is one). */
static int act(tb *b, int m, int k, int nt, const char *what, int64_t rows, int64_t cols) {
    char name[128], tile[24] = "";
    if (nt > 1) snprintf(tile, sizeof tile, ".t%d", k);
    if (b->layer >= 0) snprintf(name, sizeof name, "mb%d.l%d.%s%s", m, b->layer, what, tile);
    else snprintf(name, sizeof name, "mb%d.%s%s", m, what, tile);
    return tensor(b, name, TIDE_F32, TIDE_ROLE_TEMP, cols ? 2 : 1, rows, cols);
}

static void op(tb *b, tide_op_kind kind, int n_in, const int *in, int n_out, const int *out, const tide_op_params *p) {
    if (b->st) return;
    tide_op_params z = {0};
    b->st = tide_graph_add_op(b->g, kind, n_in, in, n_out, out, p ? p : &z, b->layer, NULL);
}

/* A parameter and its optimizer tensors. */
typedef struct param {
    int w, grad, master, m, v; /* master -1 for f32 parameters */
    int layer;
    bool written;              /* its gradient has been written this step */
} param;

/* Makes tensor id (of element size es) rows [r0, ...) of `home` (d1 columns):
 * a block of a persistent tensor. */
static void set_home(tb *b, int id, const char *home, int64_t r0, int64_t d1, size_t es) {
    if (b->st || r0 < 0) return;
    b->st = tide_graph_set_tensor_home(b->g, id, home, (uint64_t)r0 * (uint64_t)d1 * es);
}

/* The parameter `name` (d0, d1), or with r0 >= 0 its block of rows: tensors
 * "NAME.vK" (and "master.NAME.vK", ...) homed at rows r0.. of the whole. */
static void add_param_block(tb *b, param *p, const char *name, tide_dtype dt, int64_t d0, int64_t d1,
                            bool grads_out, int64_t r0, int k) {
    char n1[160], n2[176], home[176];
    int nd = d1 ? 2 : 1;
    if (r0 >= 0) snprintf(n1, sizeof n1, "%s.v%d", name, k);
    else snprintf(n1, sizeof n1, "%s", name);
    p->w = tensor(b, n1, dt, TIDE_ROLE_STATE, nd, d0, d1);
    set_home(b, p->w, name, r0, d1, tide_dtype_size(dt));
    p->master = -1;
    if (dt != TIDE_F32) {
        snprintf(n2, sizeof n2, "master.%s", n1);
        p->master = tensor(b, n2, TIDE_F32, TIDE_ROLE_STATE, nd, d0, d1);
        snprintf(home, sizeof home, "master.%s", name);
        set_home(b, p->master, home, r0, d1, 4);
    }
    snprintf(n2, sizeof n2, "exp_avg.%s", n1);
    p->m = tensor(b, n2, TIDE_F32, TIDE_ROLE_STATE, nd, d0, d1);
    snprintf(home, sizeof home, "exp_avg.%s", name);
    set_home(b, p->m, home, r0, d1, 4);
    snprintf(n2, sizeof n2, "exp_avg_sq.%s", n1);
    p->v = tensor(b, n2, TIDE_F32, TIDE_ROLE_STATE, nd, d0, d1);
    snprintf(home, sizeof home, "exp_avg_sq.%s", name);
    set_home(b, p->v, home, r0, d1, 4);
    snprintf(n2, sizeof n2, "grad.%s", n1);
    p->grad = tensor(b, n2, TIDE_F32, grads_out ? TIDE_ROLE_OUTPUT : TIDE_ROLE_TEMP, nd, d0, d1);
    p->layer = b->layer;
    p->written = false;
}

static void add_param(tb *b, param *p, const char *name, tide_dtype dt, int64_t d0, int64_t d1, bool grads_out) {
    add_param_block(b, p, name, dt, d0, d1, grads_out, -1, 0);
}

/* A (vocab, D) parameter, whole (nb 1) or in nb blocks of rows: block k
 * holds ids [v0[k], v0[k + 1]). */
typedef struct vparam {
    int nb;
    int64_t vocab, v0[TIDE_VOCAB_BLOCKS_MAX + 1];
    param b[TIDE_VOCAB_BLOCKS_MAX];
} vparam;

static void add_vparam(tb *b, vparam *vp, const char *name, tide_dtype dt, int64_t V, int64_t D, int nb,
                       bool grads_out) {
    vp->nb = nb > 1 ? nb : 1;
    vp->vocab = V;
    for (int k = 0; k <= vp->nb; k++) vp->v0[k] = V * k / vp->nb;
    if (vp->nb == 1) {
        add_param(b, &vp->b[0], name, dt, V, D, grads_out);
        return;
    }
    for (int k = 0; k < vp->nb; k++)
        add_param_block(b, &vp->b[k], name, dt, vp->v0[k + 1] - vp->v0[k], D, grads_out, vp->v0[k], k);
}

/* The tile parameters of block k of vp (none when it is whole). */
static void vblock(const vparam *vp, int k, tide_op_params *p) {
    if (vp->nb == 1) return;
    p->vocab0 = vp->v0[k];
    p->vocab = vp->vocab;
}

/* out = x . w^T (forward) */
static int mm(tb *b, int m, int k, int nt, const char *what, int x, int w, int64_t rows, int64_t n) {
    int o = act(b, m, k, nt, what, rows, n), in[2] = {x, w};
    op(b, TIDE_OP_MATMUL, 2, in, 1, &o, NULL);
    return o;
}

/* dx (=, +=) dy . w: the input gradient of a forward x . w^T */
static void mm_dx(tb *b, int dy, int w, int dx, bool add) {
    tide_op_params p = {.no_transpose = true, .accumulate = add};
    int in[3] = {dy, w, dx};
    op(b, TIDE_OP_MATMUL, add ? 3 : 2, in, 1, &dx, &p);
}

/* grad(w) (=, +=) dy^T . x */
static void mm_dw(tb *b, int dy, int x, param *w) {
    int in[3] = {dy, x, w->grad};
    op(b, TIDE_OP_MATMUL_GRADW, w->written ? 3 : 2, in, 1, &w->grad, NULL);
    w->written = true;
}

/* dx = rmsnorm_bwd(x, w, dy); grad(w) (=, +=) */
static void norm_bwd(tb *b, int x, param *w, int dy, int dx, float eps) {
    tide_op_params p = {.eps = eps};
    int in[4] = {x, w->w, dy, w->grad}, out[2] = {dx, w->grad};
    op(b, TIDE_OP_RMSNORM_BWD, w->written ? 4 : 3, in, 2, out, &p);
    w->written = true;
}

static int add2(tb *b, int a, int c, int out) {
    int in[2] = {a, c};
    op(b, TIDE_OP_ADD, 2, in, 1, &out, NULL);
    return out;
}

enum { P_LN1, P_Q, P_K, P_V, P_O, P_LN2, P_G, P_U, P_D, P_LAYER };

tide_status tide_llama_build_train(tide_ctx *ctx, const tide_llama_config *cfg, const tide_llama_train_opts *o,
                                   tide_graph **out) {
    *out = NULL;
    tide_status st = tide_llama_config_check(ctx, cfg);
    if (st) return st;
    const int B = o->batch, T = o->seq, A = o->accum;
    if (B < 1 || T < 1 || A < 1)
        return tide_err(ctx, TIDE_E_INVALID, "a training step needs batch, seq and accum >= 1 (got %d, %d, %d)", B,
                        T, A);
    if (o->tile_seqs < 0) return tide_err(ctx, TIDE_E_INVALID, "tiles of %d sequences: negative", o->tile_seqs);
    if (o->vocab_blocks < 0 || o->vocab_blocks > TIDE_VOCAB_BLOCKS_MAX || o->vocab_blocks > cfg->vocab_size)
        return tide_err(ctx, TIDE_E_INVALID, "%d vocabulary blocks: from 0 to %d (and at most the vocabulary)",
                        o->vocab_blocks, TIDE_VOCAB_BLOCKS_MAX);
    if (T > cfg->max_position_embeddings)
        return tide_err(ctx, TIDE_E_INVALID, "seq %d is beyond the model's %d positions (max_position_embeddings)", T,
                        cfg->max_position_embeddings);
    if ((int64_t)B * T > (INT64_C(1) << 31) || A > 4096)
        return tide_err(ctx, TIDE_E_INVALID, "batch %d x seq %d x accum %d is too large", B, T, A);
    if (!(o->beta1 >= 0 && o->beta1 < 1 && o->beta2 >= 0 && o->beta2 < 1 && o->eps > 0 && o->weight_decay >= 0 &&
          o->grad_clip >= 0))
        return tide_err(ctx, TIDE_E_INVALID, "AdamW needs betas in [0, 1), eps > 0, weight decay >= 0 and a "
                        "gradient clip >= 0");
    const int64_t D = cfg->hidden_size, H = cfg->num_attention_heads, KV = cfg->num_key_value_heads;
    const int64_t hd = D / H, I = cfg->intermediate_size, V = cfg->vocab_size, R = (int64_t)B * T, kd = KV * hd;
    const int NL = cfg->num_hidden_layers;
    const tide_dtype wt = cfg->dtype;
    const float eps = cfg->rms_norm_eps;

    param *lp = tide_calloc((size_t)NL * P_LAYER, sizeof *lp);
    vparam *vps = tide_calloc(2, sizeof *vps); /* the embedding, the head */
    /* per layer the kept activations of the micro-batch being built */
    enum { K_H, K_XN, K_V, K_QR, K_KR, K_A, K_HM, K_XN2, K_G, K_U, K_S, K_N };
    const int n_tiles = o->tile_seqs > 0 && o->tile_seqs < B ? (B + o->tile_seqs - 1) / o->tile_seqs : 1;
    int *keep = tide_calloc((size_t)(NL + 1) * (size_t)n_tiles * K_N, sizeof *keep);
    tb b = {.g = tide_graph_new(ctx), .layer = -1};
    if (!lp || !vps || !keep || !b.g) {
        tide_free(lp);
        tide_free(vps);
        tide_free(keep);
        tide_graph_free(b.g);
        return tide_err(ctx, TIDE_E_NOMEM, "out of memory building a training graph");
    }

    /* parameters in checkpoint order: embedding, layers, norm, head */
    param fnorm;
    vparam *emb = &vps[0], *hp = emb;
    add_vparam(&b, emb, "model.embed_tokens.weight", wt, V, D, o->vocab_blocks, o->grads_out);
    static const char *const pname[P_LAYER] = {
        "input_layernorm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
        "post_attention_layernorm", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"};
    const int64_t pshape[P_LAYER][2] = {{D, 0}, {H * hd, D}, {kd, D}, {kd, D}, {D, H * hd},
                                        {D, 0}, {I, D},      {I, D},  {D, I}};
    for (int L = 0; L < NL && !b.st; L++) {
        b.layer = L;
        for (int k = 0; k < P_LAYER; k++) {
            char name[128];
            snprintf(name, sizeof name, "model.layers.%d.%s.weight", L, pname[k]);
            add_param(&b, &lp[L * P_LAYER + k], name, wt, pshape[k][0], pshape[k][1], o->grads_out);
        }
    }
    b.layer = -1;
    add_param(&b, &fnorm, "model.norm.weight", wt, D, 0, o->grads_out);
    if (!cfg->tie_word_embeddings) {
        hp = &vps[1];
        add_vparam(&b, hp, "lm_head.weight", wt, V, D, o->vocab_blocks, o->grads_out);
    }
    const int pos = tensor(&b, "pos", TIDE_I32, TIDE_ROLE_INPUT, 1, T, 0);
    const int hyper = tensor(&b, "hyper", TIDE_F32, TIDE_ROLE_INPUT, 1, 4, 0);
    const int sumsq = tensor(&b, "grad_sumsq", TIDE_F32, TIDE_ROLE_OUTPUT, 1, 1, 0);

    tide_op_params np = {.eps = eps};
    /* row tiles: runs of ts whole sequences of each micro-batch */
    const int ts = o->tile_seqs > 0 && o->tile_seqs < B ? o->tile_seqs : B, NT = (B + ts - 1) / ts;
    int *tk = tide_calloc((size_t)NT * 8, sizeof *tk);
    if (!tk && !b.st) b.st = tide_err(ctx, TIDE_E_NOMEM, "out of memory building a training graph");
    int *h = tk, *hf = tk + NT, *dh = tk + 2 * NT, *dhm = tk + 3 * NT;
#define NB(k) TIDE_MIN(ts, B - (k) * ts) /* sequences of tile k */
#define RK(k) ((int64_t)NB(k) * T)      /* its rows */
#define KEEP(L, k) (&keep[((size_t)(L) * NT + (size_t)(k)) * K_N])
    for (int m = 0; m < A && !b.st; m++) {
        char nm[64];
        b.layer = -1;
        snprintf(nm, sizeof nm, "tokens.%d", m);
        int tokens = tensor(&b, nm, TIDE_I32, TIDE_ROLE_INPUT, 2, B, T);
        snprintf(nm, sizeof nm, "targets.%d", m);
        int targets = tensor(&b, nm, TIDE_I32, TIDE_ROLE_INPUT, 1, R, 0);
        snprintf(nm, sizeof nm, "loss.%d", m);
        int loss = tensor(&b, nm, TIDE_F32, TIDE_ROLE_OUTPUT, 1, 1, 0);

        /* forward, layer by layer, each layer tile by tile */
        for (int k = 0; k < NT && !b.st; k++) {
            h[k] = act(&b, m, k, NT, "h.0", RK(k), D);
            for (int vb = 0; vb < emb->nb; vb++) {
                tide_op_params ep = {.idx0 = (int64_t)k * ts * T};
                vblock(emb, vb, &ep);
                int in[3] = {emb->b[vb].w, tokens, h[k]};
                op(&b, TIDE_OP_EMBED, vb ? 3 : 2, in, 1, &h[k], &ep);
            }
        }
        for (int L = 0; L < NL && !b.st; L++) {
            param *P = &lp[L * P_LAYER];
            for (int k = 0; k < NT && !b.st; k++) {
                b.layer = L;
                const int64_t Rk = RK(k);
                int *kp = KEEP(L, k);
                kp[K_H] = h[k];
                int in[4];
                kp[K_XN] = act(&b, m, k, NT, "xn", Rk, D);
                in[0] = h[k], in[1] = P[P_LN1].w;
                op(&b, TIDE_OP_RMSNORM, 2, in, 1, &kp[K_XN], &np);
                int q = mm(&b, m, k, NT, "q", kp[K_XN], P[P_Q].w, Rk, H * hd);
                int kk = mm(&b, m, k, NT, "k", kp[K_XN], P[P_K].w, Rk, kd);
                kp[K_V] = mm(&b, m, k, NT, "v", kp[K_XN], P[P_V].w, Rk, kd);
                tide_op_params rp = {.rope_theta = cfg->rope_theta, .n_heads = (int)H, .head_dim = (int)hd,
                                     .batch = NB(k)};
                kp[K_QR] = act(&b, m, k, NT, "qr", Rk, H * hd);
                in[0] = q, in[1] = pos;
                op(&b, TIDE_OP_ROPE, 2, in, 1, &kp[K_QR], &rp);
                rp.n_heads = (int)KV;
                kp[K_KR] = act(&b, m, k, NT, "kr", Rk, kd);
                in[0] = kk;
                op(&b, TIDE_OP_ROPE, 2, in, 1, &kp[K_KR], &rp);
                tide_op_params ap = {.n_heads = (int)H, .n_kv_heads = (int)KV, .head_dim = (int)hd, .batch = NB(k)};
                kp[K_A] = act(&b, m, k, NT, "a", Rk, H * hd);
                in[0] = kp[K_QR], in[1] = kp[K_KR], in[2] = kp[K_V], in[3] = pos;
                op(&b, TIDE_OP_ATTENTION, 4, in, 1, &kp[K_A], &ap);
                int proj = mm(&b, m, k, NT, "a_out", kp[K_A], P[P_O].w, Rk, D);
                kp[K_HM] = add2(&b, h[k], proj, act(&b, m, k, NT, "hm", Rk, D));
                kp[K_XN2] = act(&b, m, k, NT, "xn2", Rk, D);
                in[0] = kp[K_HM], in[1] = P[P_LN2].w;
                op(&b, TIDE_OP_RMSNORM, 2, in, 1, &kp[K_XN2], &np);
                kp[K_G] = mm(&b, m, k, NT, "g", kp[K_XN2], P[P_G].w, Rk, I);
                kp[K_U] = mm(&b, m, k, NT, "u", kp[K_XN2], P[P_U].w, Rk, I);
                kp[K_S] = act(&b, m, k, NT, "s", Rk, I);
                in[0] = kp[K_G], in[1] = kp[K_U];
                op(&b, TIDE_OP_SILU_MUL, 2, in, 1, &kp[K_S], NULL);
                int down = mm(&b, m, k, NT, "s_out", kp[K_S], P[P_D].w, Rk, D);
                b.layer = -1;
                char hn[32];
                snprintf(hn, sizeof hn, "h.%d", L + 1);
                int hn_id = act(&b, m, k, NT, hn, Rk, D);
                b.layer = L;
                h[k] = add2(&b, kp[K_HM], down, hn_id);
            }
        }
        /* per tile: the final norm, the loss and the head's gradient (the
         * loss and gradient add up over the tiles), the norm's backward */
        b.layer = -1;
        for (int k = 0; k < NT && !b.st; k++) {
            const int64_t Rk = RK(k);
            hf[k] = act(&b, m, k, NT, "hf", Rk, D);
            int in2[2] = {h[k], fnorm.w};
            op(&b, TIDE_OP_RMSNORM, 2, in2, 1, &hf[k], &np);
            int dhf = act(&b, m, k, NT, "d_hf", Rk, D);
            const float scale = (float)(1.0 / ((double)R * (double)A));
            if (hp->nb == 1) {
                param *P = &hp->b[0];
                tide_op_params cp = {.scale = scale, .idx0 = (int64_t)k * ts * T};
                int in[5] = {hf[k], P->w, targets, P->grad, loss}, outs[3] = {loss, dhf, P->grad};
                op(&b, TIDE_OP_CROSS_ENTROPY, k ? 5 : P->written ? 4 : 3, in, 3, outs, &cp);
                P->written = true;
            } else {
                /* the head in vocabulary blocks: every block's statistics (the
                 * last adds the loss), then every block's gradients */
                int stats = act(&b, m, k, NT, "ce_stats", Rk, 3);
                for (int vb = 0; vb < hp->nb && !b.st; vb++) {
                    bool last = vb == hp->nb - 1;
                    tide_op_params cp = {.scale = scale, .idx0 = (int64_t)k * ts * T, .accumulate = last && k > 0};
                    vblock(hp, vb, &cp);
                    int in[5] = {hf[k], hp->b[vb].w, targets, stats, loss}, outs[2] = {stats, loss};
                    op(&b, TIDE_OP_CE_STATS, 3 + (vb > 0) + cp.accumulate, in, last ? 2 : 1, outs, &cp);
                }
                for (int vb = 0; vb < hp->nb && !b.st; vb++) {
                    param *P = &hp->b[vb];
                    tide_op_params cp = {.scale = scale, .idx0 = (int64_t)k * ts * T, .accumulate = P->written};
                    vblock(hp, vb, &cp);
                    int in[6] = {hf[k], P->w, targets, stats}, n = 4, outs[2] = {dhf, P->grad};
                    if (vb > 0) in[n++] = dhf;
                    if (P->written) in[n++] = P->grad;
                    op(&b, TIDE_OP_CE_BLOCK, n, in, 2, outs, &cp);
                    P->written = true;
                }
            }
            dh[k] = act(&b, m, k, NT, "d_h.N", Rk, D);
            norm_bwd(&b, h[k], &fnorm, dhf, dh[k], eps);
        }

        /* backward through the layers, each layer tile by tile */
        for (int L = NL - 1; L >= 0 && !b.st; L--) {
            param *P = &lp[L * P_LAYER];
            for (int k = 0; k < NT && !b.st; k++) {
                b.layer = L;
                const int64_t Rk = RK(k);
                int *kp = KEEP(L, k);
                int ds = act(&b, m, k, NT, "d_s", Rk, I);
                mm_dx(&b, dh[k], P[P_D].w, ds, false);
                mm_dw(&b, dh[k], kp[K_S], &P[P_D]);
                int dg = act(&b, m, k, NT, "d_g", Rk, I), du = act(&b, m, k, NT, "d_u", Rk, I);
                {
                    int in[3] = {kp[K_G], kp[K_U], ds}, outs[2] = {dg, du};
                    op(&b, TIDE_OP_SILU_MUL_BWD, 3, in, 2, outs, NULL);
                }
                int dxn2 = act(&b, m, k, NT, "d_xn2", Rk, D);
                mm_dx(&b, dg, P[P_G].w, dxn2, false);
                mm_dx(&b, du, P[P_U].w, dxn2, true);
                mm_dw(&b, dg, kp[K_XN2], &P[P_G]);
                mm_dw(&b, du, kp[K_XN2], &P[P_U]);
                int dhm_n = act(&b, m, k, NT, "d_hm_norm", Rk, D);
                norm_bwd(&b, kp[K_HM], &P[P_LN2], dxn2, dhm_n, eps);
                dhm[k] = add2(&b, dh[k], dhm_n, act(&b, m, k, NT, "d_hm", Rk, D));
                int da = act(&b, m, k, NT, "d_a", Rk, H * hd);
                mm_dx(&b, dhm[k], P[P_O].w, da, false);
                mm_dw(&b, dhm[k], kp[K_A], &P[P_O]);
                int dqr = act(&b, m, k, NT, "d_qr", Rk, H * hd), dkr = act(&b, m, k, NT, "d_kr", Rk, kd),
                    dv = act(&b, m, k, NT, "d_v", Rk, kd);
                {
                    tide_op_params ap = {.n_heads = (int)H, .n_kv_heads = (int)KV, .head_dim = (int)hd,
                                         .batch = NB(k)};
                    int in[6] = {kp[K_QR], kp[K_KR], kp[K_V], kp[K_A], da, pos}, outs[3] = {dqr, dkr, dv};
                    op(&b, TIDE_OP_ATTENTION_BWD, 6, in, 3, outs, &ap);
                }
                int dq = act(&b, m, k, NT, "d_q", Rk, H * hd), dk = act(&b, m, k, NT, "d_k", Rk, kd);
                {
                    tide_op_params rp = {.rope_theta = cfg->rope_theta, .n_heads = (int)H, .head_dim = (int)hd,
                                         .batch = NB(k)};
                    int in[2] = {dqr, pos};
                    op(&b, TIDE_OP_ROPE_BWD, 2, in, 1, &dq, &rp);
                    rp.n_heads = (int)KV;
                    in[0] = dkr;
                    op(&b, TIDE_OP_ROPE_BWD, 2, in, 1, &dk, &rp);
                }
                int dxn = act(&b, m, k, NT, "d_xn", Rk, D);
                mm_dx(&b, dq, P[P_Q].w, dxn, false);
                mm_dx(&b, dk, P[P_K].w, dxn, true);
                mm_dx(&b, dv, P[P_V].w, dxn, true);
                mm_dw(&b, dq, kp[K_XN], &P[P_Q]);
                mm_dw(&b, dk, kp[K_XN], &P[P_K]);
                mm_dw(&b, dv, kp[K_XN], &P[P_V]);
                int dh_n = act(&b, m, k, NT, "d_h_norm", Rk, D);
                norm_bwd(&b, kp[K_H], &P[P_LN1], dxn, dh_n, eps);
                b.layer = -1;
                char dn[32];
                snprintf(dn, sizeof dn, "d_h.%d", L);
                int dh_id = act(&b, m, k, NT, dn, Rk, D);
                b.layer = L;
                dh[k] = add2(&b, dhm[k], dh_n, dh_id);
            }
        }
        b.layer = -1;
        for (int k = 0; k < NT && !b.st; k++)
            for (int vb = 0; vb < emb->nb; vb++) {
                param *P = &emb->b[vb];
                tide_op_params ep = {.idx0 = (int64_t)k * ts * T};
                vblock(emb, vb, &ep);
                int in[3] = {dh[k], tokens, P->grad};
                op(&b, TIDE_OP_EMBED_BWD, P->written ? 3 : 2, in, 1, &P->grad, &ep);
                P->written = true;
            }
    }
#undef NB
#undef RK
#undef KEEP
    tide_free(tk);

    /* the optimizer: parameters in checkpoint order */
    int n_par = 0;
    param **all = tide_calloc((size_t)NL * P_LAYER + 1 + 2 * TIDE_VOCAB_BLOCKS_MAX, sizeof *all);
    if (!all && !b.st) b.st = tide_err(ctx, TIDE_E_NOMEM, "out of memory building a training graph");
    if (all) {
        for (int vb = 0; vb < emb->nb; vb++) all[n_par++] = &emb->b[vb];
        for (int L = 0; L < NL; L++)
            for (int k = 0; k < P_LAYER; k++) all[n_par++] = &lp[L * P_LAYER + k];
        all[n_par++] = &fnorm;
        if (hp != emb)
            for (int vb = 0; vb < hp->nb; vb++) all[n_par++] = &hp->b[vb];
    }
    for (int i = 0; i < n_par && !b.st; i++) {
        b.layer = all[i]->layer;
        int in[2] = {all[i]->grad, sumsq};
        op(&b, TIDE_OP_SUMSQ, i ? 2 : 1, in, 1, &sumsq, NULL);
    }
    for (int i = 0; i < n_par && !b.st; i++) {
        param *P = all[i];
        b.layer = P->layer;
        tide_op_params ap = {.beta1 = o->beta1, .beta2 = o->beta2, .adam_eps = o->eps,
                             .weight_decay = o->weight_decay, .max_norm = o->grad_clip};
        int in[7], outs[4], n = 0;
        in[n++] = P->w;
        if (P->master >= 0) in[n++] = P->master;
        in[n++] = P->m;
        in[n++] = P->v;
        for (int j = 0; j < n; j++) outs[j] = in[j];
        int n_out = n;
        in[n++] = P->grad;
        in[n++] = hyper;
        in[n++] = sumsq;
        op(&b, TIDE_OP_ADAMW, n, in, n_out, outs, &ap);
    }
    tide_free(all);
    tide_free(lp);
    tide_free(vps);
    tide_free(keep);
    if (b.st) {
        tide_graph_free(b.g);
        return b.st;
    }
    *out = b.g;
    return TIDE_OK;
}

bool tide_llama_train_tile_level(tide_llama_train_opts *o, int level) {
    if (level < 0 || level >= TIDE_TILE_LEVELS) return false;
    o->tile_seqs = 0;
    o->vocab_blocks = 0;
    if (level == 0) return true;
    /* row levels: tiles of ceil(batch / 2^k) sequences down to one */
    int rows = 0;
    while (rows < 30 && (((int64_t)o->batch + (INT64_C(1) << rows) - 1) >> rows) > 1) rows++;
    if (level <= rows) {
        o->tile_seqs = (int)(((int64_t)o->batch + (INT64_C(1) << level) - 1) >> level);
        return true;
    }
    int vb = 1 << (level - rows);
    if (vb > TIDE_VOCAB_BLOCKS_MAX) return false;
    o->tile_seqs = o->batch > 1 ? 1 : 0;
    o->vocab_blocks = vb;
    return true;
}

static bool starts(const char *s, const char *p) { return strncmp(s, p, strlen(p)) == 0; }

tide_train_class tide_train_tensor_class(const tide_graph *g, int t) {
    const tide_tensor *T = &g->tensors[t];
    if (T->role == TIDE_ROLE_INPUT) return TIDE_TRAIN_INPUT;
    if (T->role == TIDE_ROLE_STATE) {
        if (starts(T->name, "master.")) return TIDE_TRAIN_MASTER;
        if (starts(T->name, "exp_avg.") || starts(T->name, "exp_avg_sq.")) return TIDE_TRAIN_MOMENT;
        return TIDE_TRAIN_PARAM;
    }
    if (T->role == TIDE_ROLE_WEIGHT) return TIDE_TRAIN_PARAM;
    if (starts(T->name, "grad.")) return TIDE_TRAIN_GRAD;
    return TIDE_TRAIN_ACT;
}

const char *tide_train_class_name(tide_train_class c) {
    static const char *const n[TIDE_TRAIN_CLASS_COUNT] = {"weights", "master weights", "moments", "gradients",
                                                          "activations", "inputs"};
    return (unsigned)c < TIDE_TRAIN_CLASS_COUNT ? n[c] : "?";
}
