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
 * The forward of each layer is the inference graph's (model/llama_int.h,
 * llama_layer_forward: the same ops, the activations named "mbM.lL.*"
 * here), run one row tile at a time; what training adds is the embedding
 * in vocabulary blocks, the loss, the backward and the optimizer.
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
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/kernels.h"
#include "model/llama_int.h"
#include "train/train_ranks.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

typedef llama_builder tb;

static int tensor(tb *b, const char *name, tide_dtype dt, tide_role role, int ndim, int64_t d0, int64_t d1) {
    return llama_tensor(b, name, dt, role, ndim, d0, d1, 0);
}

/* Activation `what` of the micro-batch of b->prefix, in layer b->layer when
 * >= 0, of row tile k of nt (no suffix when there is one). */
static int act(tb *b, int k, int nt, const char *what, int64_t rows, int64_t cols) {
    return llama_act(b, what, k, nt, rows, cols);
}

static void op(tb *b, tide_op_kind kind, int n_in, const int *in, int n_out, const int *out, const tide_op_args *p) {
    llama_op(b, kind, n_in, in, n_out, out, p);
}

/* A parameter and its optimizer tensors. */
typedef struct param {
    int w, grad, master, m, v; /* master -1 for f32 parameters */
    int layer;
    bool written;              /* its gradient has been written this step */
    bool frozen;               /* LoRA's base: a WEIGHT, no master or moments, a
                                  gradient only where an op must write one */
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
                            bool grads_out, int64_t r0, int k, int frozen) {
    char n1[160], n2[176], home[176];
    int nd = d1 ? 2 : 1;
    if (r0 >= 0) snprintf(n1, sizeof n1, "%s.v%d", name, k);
    else snprintf(n1, sizeof n1, "%s", name);
    if (frozen) {
        /* LoRA's base: frozen (frozen 2: an op still writes a gradient, which
         * nothing reads) */
        p->w = tensor(b, n1, dt, TIDE_ROLE_WEIGHT, nd, d0, d1);
        set_home(b, p->w, name, r0, d1, tide_dtype_size(dt));
        p->master = p->m = p->v = p->grad = -1;
        if (frozen == 2) {
            snprintf(n2, sizeof n2, "grad.%s", n1);
            p->grad = tensor(b, n2, TIDE_F32, TIDE_ROLE_TEMP, nd, d0, d1);
        }
        p->layer = b->layer;
        p->written = false;
        p->frozen = true;
        return;
    }
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
    p->frozen = false;
}

static void add_param(tb *b, param *p, const char *name, tide_dtype dt, int64_t d0, int64_t d1, bool grads_out,
                      int frozen) {
    add_param_block(b, p, name, dt, d0, d1, grads_out, -1, 0, frozen);
}

/* A (vocab, D) parameter, whole (nb 1) or in nb blocks of rows: block k
 * holds ids [v0[k], v0[k + 1]). */
typedef struct vparam {
    int nb;
    int64_t vocab, v0[TIDE_VOCAB_BLOCKS_MAX + 1];
    param b[TIDE_VOCAB_BLOCKS_MAX];
} vparam;

static void add_vparam(tb *b, vparam *vp, const char *name, tide_dtype dt, int64_t V, int64_t D, int nb,
                       bool grads_out, int frozen) {
    vp->nb = nb > 1 ? nb : 1;
    vp->vocab = V;
    for (int k = 0; k <= vp->nb; k++) vp->v0[k] = V * k / vp->nb;
    if (vp->nb == 1) {
        add_param(b, &vp->b[0], name, dt, V, D, grads_out, frozen);
        return;
    }
    for (int k = 0; k < vp->nb; k++)
        add_param_block(b, &vp->b[k], name, dt, vp->v0[k + 1] - vp->v0[k], D, grads_out, vp->v0[k], k, frozen);
}

/* The tile parameters of block k of vp (none when it is whole). */
static void vblock(const vparam *vp, int k, tide_op_args *p) {
    if (vp->nb == 1) return;
    p->vocab0 = vp->v0[k];
    p->vocab = vp->vocab;
}

/* dx (=, +=) dy . w: the input gradient of a forward x . w^T */
static void mm_dx(tb *b, int dy, int w, int dx, bool add) {
    tide_op_args p = {.no_transpose = true, .accumulate = add};
    int in[3] = {dy, w, dx};
    op(b, TIDE_OP_MATMUL, add ? 3 : 2, in, 1, &dx, &p);
}

/* grad(w) (=, +=) dy^T . x */
static void mm_dw(tb *b, int dy, int x, param *w) {
    if (w->frozen) return;
    int in[3] = {dy, x, w->grad};
    op(b, TIDE_OP_MATMUL_GRADW, w->written ? 3 : 2, in, 1, &w->grad, NULL);
    w->written = true;
}

/* dx = rmsnorm_bwd(x, w, dy); grad(w) (=, +=) */
static void norm_bwd(tb *b, int x, param *w, int dy, int dx, float eps) {
    tide_op_args p = {.eps = eps};
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

/* LoRA target i (TIDE_LORA_* bit i) is layer parameter lora_p[i] */
static const int lora_p[TIDE_LORA_N] = {P_Q, P_K, P_V, P_O, P_G, P_U, P_D};

/* The forward's activation names (llama_int.h's order). */
static const char *const train_names[LLAMA_NAMES] = {"xn", "q",  "k",  "v", "qr", "kr",    "a", "a_out",
                                                     "hm", "xn2", "g", "u", "s",  "s_out", "h"};

/* The step being built: its parameters, its row tiles (runs of ts whole
 * sequences of each micro-batch) and the kept activations of the
 * micro-batch being built. */
typedef struct train_build {
    tb b;
    const tide_llama_config *cfg;
    const tide_llama_train_opts *o;
    param *lp;                     /* NL x P_LAYER, in checkpoint order */
    param fnorm;
    vparam *emb, *hp;              /* the head is the embedding when tied */
    int pos, hyper, sumsq;
    int ts, NT;
    llama_tile *tiles;             /* NT */
    llama_acts *keep;              /* (L, k): layer L's activations of tile k, h its input */
    int *h, *dh, *dhm;             /* per tile: the residual stream and its gradients */
    llama_wsplit *ws;
    /* LoRA (o->lora_r > 0): per layer its adapters' ids, and per layer x
     * target the A and B parameters (unused where not targeted) */
    llama_lora *lora;
    param *la, *lb;
} train_build;

static tide_status check_train_opts(tide_ctx *ctx, const tide_llama_config *cfg, const tide_llama_train_opts *o) {
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
    if (o->precision != TIDE_PRECISION_F32 && o->precision != TIDE_PRECISION_BF16)
        return tide_err(ctx, TIDE_E_INVALID, "training precision %d: f32 (%d) or bf16 (%d); resolve auto with "
                        "tide_train_precision_resolve", o->precision, TIDE_PRECISION_F32, TIDE_PRECISION_BF16);
    if (o->lora_r < 0) return tide_err(ctx, TIDE_E_INVALID, "LoRA rank %d: must be positive", o->lora_r);
    if (o->lora_r > 0) {
        if (!(o->lora_alpha > 0) || !isfinite(o->lora_alpha))
            return tide_err(ctx, TIDE_E_INVALID, "LoRA alpha %g: must be positive", (double)o->lora_alpha);
        if (o->lora_targets & ~TIDE_LORA_ALL)
            return tide_err(ctx, TIDE_E_INVALID, "LoRA targets 0x%x: unknown bits (q,k,v,o,gate,up,down are 0x7f)",
                            o->lora_targets);
        if (o->lora_r > cfg->hidden_size)
            return tide_err(ctx, TIDE_E_INVALID, "LoRA rank %d is above the hidden size %d", o->lora_r,
                            cfg->hidden_size);
    }
    return TIDE_OK;
}

/* Layer L's LoRA adapters, f32 STATE in PEFT's names: per target A (r, K)
 * then B (N, r). */
static void add_adapters(train_build *s, int L, const char *const *pname, const int64_t (*pshape)[2]) {
    tb *b = &s->b;
    const int r = s->o->lora_r;
    const unsigned bits = s->o->lora_targets ? s->o->lora_targets : TIDE_LORA_ALL;
    llama_lora *lo = &s->lora[L];
    lo->r = r;
    for (int i = 0; i < TIDE_LORA_N; i++) {
        lo->a[i] = lo->b[i] = -1;
        if (!(bits & (1u << i))) continue;
        const int k = lora_p[i];
        char name[160];
        snprintf(name, sizeof name, "base_model.model.model.layers.%d.%s.lora_A.weight", L, pname[k]);
        add_param(b, &s->la[L * TIDE_LORA_N + i], name, TIDE_F32, r, pshape[k][1], s->o->grads_out, 0);
        snprintf(name, sizeof name, "base_model.model.model.layers.%d.%s.lora_B.weight", L, pname[k]);
        add_param(b, &s->lb[L * TIDE_LORA_N + i], name, TIDE_F32, pshape[k][0], r, s->o->grads_out, 0);
        lo->a[i] = s->la[L * TIDE_LORA_N + i].w;
        lo->b[i] = s->lb[L * TIDE_LORA_N + i].w;
    }
}

/* The parameters in checkpoint order (embedding, layers, norm, head), then
 * the step's fixed inputs and grad_sumsq. */
static void add_params(train_build *s) {
    tb *b = &s->b;
    const tide_llama_config *cfg = s->cfg;
    const int64_t D = cfg->hidden_size, H = cfg->num_attention_heads, KV = cfg->num_key_value_heads;
    const int64_t hd = D / H, I = cfg->intermediate_size, V = cfg->vocab_size, kd = KV * hd;
    const bool go = s->o->grads_out;
    /* LoRA: the base frozen, the head too (its cross-entropy computes no
     * weight gradient); the norms keep a gradient their ops write */
    const bool fz = s->lora != NULL;
    add_vparam(b, s->emb, "model.embed_tokens.weight", tide_llama_weight_dtype(cfg, "model.embed_tokens.weight"), V,
               D, s->o->vocab_blocks, go, fz ? 1 : 0);
    static const char *const pname[P_LAYER] = {
        "input_layernorm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
        "post_attention_layernorm", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"};
    const int64_t pshape[P_LAYER][2] = {{D, 0}, {H * hd, D}, {kd, D}, {kd, D}, {D, H * hd},
                                        {D, 0}, {I, D},      {I, D},  {D, I}};
    for (int L = 0; L < cfg->num_hidden_layers && !b->st; L++) {
        b->layer = L;
        for (int k = 0; k < P_LAYER; k++) {
            char name[128];
            snprintf(name, sizeof name, "model.layers.%d.%s.weight", L, pname[k]);
            add_param(b, &s->lp[L * P_LAYER + k], name, tide_llama_weight_dtype(cfg, name), pshape[k][0],
                      pshape[k][1], go, fz ? (pshape[k][1] ? 1 : 2) : 0);
        }
        if (fz) add_adapters(s, L, pname, pshape);
    }
    b->layer = -1;
    add_param(b, &s->fnorm, "model.norm.weight", tide_llama_weight_dtype(cfg, "model.norm.weight"), D, 0, go,
              fz ? 2 : 0);
    if (!cfg->tie_word_embeddings) {
        s->hp = s->emb + 1;
        add_vparam(b, s->hp, "lm_head.weight", tide_llama_weight_dtype(cfg, "lm_head.weight"), V, D,
                   s->o->vocab_blocks, go, fz ? 1 : 0);
    }
    if (fz) {
        int sc = tensor(b, "lora_scale", TIDE_F32, TIDE_ROLE_INPUT, 2, s->o->lora_r, s->o->lora_r);
        for (int L = 0; L < cfg->num_hidden_layers; L++) s->lora[L].scale = sc;
    }
    s->pos = tensor(b, "pos", TIDE_I32, TIDE_ROLE_INPUT, 1, s->o->seq, 0);
    s->hyper = tensor(b, "hyper", TIDE_F32, TIDE_ROLE_INPUT, 1, 4, 0);
    s->sumsq = tensor(b, "grad_sumsq", TIDE_F32, TIDE_ROLE_OUTPUT, 1, 1, 0);
}

static int64_t tile_rows(const train_build *s, int k) { return (int64_t)s->tiles[k].nb * s->tiles[k].n; }

/* The forward of a micro-batch: the embedding tile by tile, then layer by
 * layer, each layer tile by tile, keeping every layer's activations. */
static void forward(train_build *s, int tokens) {
    tb *b = &s->b;
    const int T = s->o->seq, NT = s->NT, NL = s->cfg->num_hidden_layers;
    const vparam *emb = s->emb;
    for (int k = 0; k < NT && !b->st; k++) {
        s->h[k] = act(b, k, NT, "h.0", tile_rows(s, k), s->cfg->hidden_size);
        for (int vb = 0; vb < emb->nb; vb++) {
            tide_op_args ep = {.idx0 = (int64_t)k * s->ts * T};
            vblock(emb, vb, &ep);
            int in[3] = {emb->b[vb].w, tokens, s->h[k]};
            op(b, TIDE_OP_EMBED, vb ? 3 : 2, in, 1, &s->h[k], &ep);
        }
    }
    llama_layer_in li = {.cfg = s->cfg, .pos = s->pos, .seq = T, .tiles = s->tiles, .n_tiles = NT, .ws = s->ws,
                         .names = train_names};
    for (int L = 0; L < NL && !b->st; L++) {
        llama_acts *kp = &s->keep[(size_t)L * NT];
        li.lora = s->lora ? &s->lora[L] : NULL;
        for (int k = 0; k < NT && !b->st; k++) {
            const int h_in = s->h[k];
            kp[k].h = h_in;
            llama_layer_forward(b, &li, L, k, k + 1, kp);
            s->h[k] = kp[k].h; /* h.L+1 */
            kp[k].h = h_in;    /* the backward reads the layer's input */
        }
    }
}

/* Tile k's final norm, loss and the head's gradient (the loss and gradient
 * add up over the tiles), then its backward through the norm into dh[k]. */
static void loss_tile(train_build *s, int k, int targets, int loss) {
    tb *b = &s->b;
    const int NT = s->NT;
    const int64_t Rk = tile_rows(s, k), D = s->cfg->hidden_size, R = (int64_t)s->o->batch * s->o->seq;
    const float eps = s->cfg->rms_norm_eps;
    vparam *hp = s->hp;
    tide_op_args np = {.eps = eps};
    int hf = llama_act_dt(b, "hf", k, NT, Rk, D, b->kept_dt); /* the head's product reads it */
    int in2[2] = {s->h[k], s->fnorm.w};
    op(b, TIDE_OP_RMSNORM, 2, in2, 1, &hf, &np);
    int dhf = act(b, k, NT, "d_hf", Rk, D);
    /* over the rows of every micro-batch of the step, on every rank: a
     * micro-batch's gradients are then the same numbers on N ranks with
     * --accum A as in one process with --accum N*A, before any rounding
     * (a bf16 step's products round them) */
    const int nr = s->o->ranks > 1 ? s->o->ranks : 1;
    const float scale = (float)(1.0 / ((double)R * (double)s->o->accum * (double)nr));
    const int64_t idx0 = (int64_t)k * s->ts * s->o->seq;
    if (hp->nb == 1) {
        param *P = &hp->b[0];
        tide_op_args cp = {.scale = scale, .idx0 = idx0};
        if (P->grad < 0) {
            /* a frozen head (LoRA): no weight gradient */
            int in[4] = {hf, P->w, targets, loss}, outs[2] = {loss, dhf};
            op(b, TIDE_OP_CROSS_ENTROPY, k ? 4 : 3, in, 2, outs, &cp);
        } else {
            int in[5] = {hf, P->w, targets, P->grad, loss}, outs[3] = {loss, dhf, P->grad};
            op(b, TIDE_OP_CROSS_ENTROPY, k ? 5 : P->written ? 4 : 3, in, 3, outs, &cp);
            P->written = true;
        }
    } else {
        /* the head in vocabulary blocks: every block's statistics (the last
         * adds the loss), then every block's gradients */
        int stats = act(b, k, NT, "ce_stats", Rk, 3);
        for (int vb = 0; vb < hp->nb && !b->st; vb++) {
            bool last = vb == hp->nb - 1;
            tide_op_args cp = {.scale = scale, .idx0 = idx0, .accumulate = last && k > 0};
            vblock(hp, vb, &cp);
            int in[5] = {hf, hp->b[vb].w, targets, stats, loss}, outs[2] = {stats, loss};
            op(b, TIDE_OP_CE_STATS, 3 + (vb > 0) + cp.accumulate, in, last ? 2 : 1, outs, &cp);
        }
        for (int vb = 0; vb < hp->nb && !b->st; vb++) {
            param *P = &hp->b[vb];
            const bool dw = P->grad >= 0; /* not for a frozen head (LoRA) */
            tide_op_args cp = {.scale = scale, .idx0 = idx0, .accumulate = dw && P->written};
            vblock(hp, vb, &cp);
            int in[6] = {hf, P->w, targets, stats}, n = 4, outs[2] = {dhf, P->grad};
            if (vb > 0) in[n++] = dhf;
            if (cp.accumulate) in[n++] = P->grad;
            op(b, TIDE_OP_CE_BLOCK, n, in, dw ? 2 : 1, outs, &cp);
            P->written = dw;
        }
    }
    s->dh[k] = act(b, k, NT, "d_h.N", Rk, D);
    norm_bwd(b, s->h[k], &s->fnorm, dhf, s->dh[k], eps);
}

/* LoRA's backward of target tg of layer L for tile k, whose forward read x
 * and whose output's gradient is dy: grad(B) = dy^T ts, d_ts = dy . B,
 * d_t = d_ts . scale (the scale is symmetric), grad(A) = d_t^T x and
 * dx += d_t . A (dx holds the base's part already). */
static void lora_bwd(train_build *s, int L, int k, int tg, int dy, int x, int dx) {
    if (!s->lora || s->lora[L].a[tg] < 0) return;
    tb *b = &s->b;
    static const char *const tn[TIDE_LORA_N] = {"q", "k", "v", "a_out", "g", "u", "s_out"};
    const llama_lora *lo = &s->lora[L];
    param *A = &s->la[L * TIDE_LORA_N + tg], *B = &s->lb[L * TIDE_LORA_N + tg];
    const int64_t Rk = tile_rows(s, k);
    char nm[48];
    mm_dw(b, dy, s->keep[(size_t)L * s->NT + k].lora_ts[tg], B);
    snprintf(nm, sizeof nm, "d_%s_lora_ts", tn[tg]);
    int dts = act(b, k, s->NT, nm, Rk, lo->r);
    mm_dx(b, dy, B->w, dts, false);
    snprintf(nm, sizeof nm, "d_%s_lora_t", tn[tg]);
    int dt = act(b, k, s->NT, nm, Rk, lo->r);
    tide_op_args kn = {.no_transpose = true};
    int in[2] = {dts, lo->scale};
    const bool bf = b->bf16; /* the scale exact, as the forward's (llama_layer.c) */
    b->bf16 = false;
    op(b, TIDE_OP_MATMUL, 2, in, 1, &dt, &kn);
    b->bf16 = bf;
    mm_dw(b, dt, x, A);
    mm_dx(b, dt, A->w, dx, true);
}

/* The backward of layer L for tile k: dh[k] from d_h.L+1 to d_h.L, every
 * weight gradient added into. */
static void backward_tile(train_build *s, int L, int k) {
    tb *b = &s->b;
    const tide_llama_config *cfg = s->cfg;
    const int NT = s->NT, nb = s->tiles[k].nb;
    const int64_t D = cfg->hidden_size, H = cfg->num_attention_heads, KV = cfg->num_key_value_heads;
    const int64_t hd = D / H, I = cfg->intermediate_size, kd = KV * hd, Rk = tile_rows(s, k);
    const float eps = cfg->rms_norm_eps;
    param *P = &s->lp[L * P_LAYER];
    const llama_acts *kp = &s->keep[(size_t)L * NT + k];
    int *dh = s->dh, *dhm = s->dhm;
    b->layer = L;
    int ds = act(b, k, NT, "d_s", Rk, I);
    mm_dx(b, dh[k], P[P_D].w, ds, false);
    mm_dw(b, dh[k], kp->s, &P[P_D]);
    lora_bwd(s, L, k, 6, dh[k], kp->s, ds);
    int dg = act(b, k, NT, "d_g", Rk, I), du = act(b, k, NT, "d_u", Rk, I);
    {
        int in[3] = {kp->g, kp->u, ds}, outs[2] = {dg, du};
        op(b, TIDE_OP_SILU_MUL_BWD, 3, in, 2, outs, NULL);
    }
    int dxn2 = act(b, k, NT, "d_xn2", Rk, D);
    mm_dx(b, dg, P[P_G].w, dxn2, false);
    mm_dx(b, du, P[P_U].w, dxn2, true);
    mm_dw(b, dg, kp->xn2, &P[P_G]);
    mm_dw(b, du, kp->xn2, &P[P_U]);
    lora_bwd(s, L, k, 4, dg, kp->xn2, dxn2);
    lora_bwd(s, L, k, 5, du, kp->xn2, dxn2);
    int dhm_n = act(b, k, NT, "d_hm_norm", Rk, D);
    norm_bwd(b, kp->hm, &P[P_LN2], dxn2, dhm_n, eps);
    dhm[k] = add2(b, dh[k], dhm_n, act(b, k, NT, "d_hm", Rk, D));
    int da = act(b, k, NT, "d_a", Rk, H * hd);
    mm_dx(b, dhm[k], P[P_O].w, da, false);
    mm_dw(b, dhm[k], kp->a, &P[P_O]);
    lora_bwd(s, L, k, 3, dhm[k], kp->a, da);
    int dqr = act(b, k, NT, "d_qr", Rk, H * hd), dkr = act(b, k, NT, "d_kr", Rk, kd),
        dv = act(b, k, NT, "d_v", Rk, kd);
    {
        tide_op_args ap = {.n_heads = (int)H, .n_kv_heads = (int)KV, .head_dim = (int)hd, .batch = nb};
        int in[6] = {kp->qr, kp->kr, kp->v, kp->a, da, s->pos}, outs[3] = {dqr, dkr, dv};
        op(b, TIDE_OP_ATTENTION_BWD, 6, in, 3, outs, &ap);
    }
    int dq = act(b, k, NT, "d_q", Rk, H * hd), dk = act(b, k, NT, "d_k", Rk, kd);
    {
        tide_op_args rp = {.rope_theta = cfg->rope_theta, .n_heads = (int)H, .head_dim = (int)hd, .batch = nb};
        int in[2] = {dqr, s->pos};
        op(b, TIDE_OP_ROPE_BWD, 2, in, 1, &dq, &rp);
        rp.n_heads = (int)KV;
        in[0] = dkr;
        op(b, TIDE_OP_ROPE_BWD, 2, in, 1, &dk, &rp);
    }
    int dxn = act(b, k, NT, "d_xn", Rk, D);
    mm_dx(b, dq, P[P_Q].w, dxn, false);
    mm_dx(b, dk, P[P_K].w, dxn, true);
    mm_dx(b, dv, P[P_V].w, dxn, true);
    mm_dw(b, dq, kp->xn, &P[P_Q]);
    mm_dw(b, dk, kp->xn, &P[P_K]);
    mm_dw(b, dv, kp->xn, &P[P_V]);
    lora_bwd(s, L, k, 0, dq, kp->xn, dxn);
    lora_bwd(s, L, k, 1, dk, kp->xn, dxn);
    lora_bwd(s, L, k, 2, dv, kp->xn, dxn);
    int dh_n = act(b, k, NT, "d_h_norm", Rk, D);
    norm_bwd(b, kp->h, &P[P_LN1], dxn, dh_n, eps);
    b->layer = -1;
    char dn[32];
    snprintf(dn, sizeof dn, "d_h.%d", L);
    int dh_id = act(b, k, NT, dn, Rk, D);
    b->layer = L;
    dh[k] = add2(b, dhm[k], dh_n, dh_id);
}

/* Micro-batch m: its inputs, forward, loss and backward. */
static void micro_batch(train_build *s, int m) {
    tb *b = &s->b;
    const int B = s->o->batch, T = s->o->seq, NT = s->NT, NL = s->cfg->num_hidden_layers;
    char nm[64], prefix[24];
    snprintf(prefix, sizeof prefix, "mb%d.", m);
    b->prefix = prefix;
    b->micro_batch = m;
    b->layer = -1;
    snprintf(nm, sizeof nm, "tokens.%d", m);
    int tokens = tensor(b, nm, TIDE_I32, TIDE_ROLE_INPUT, 2, B, T);
    snprintf(nm, sizeof nm, "targets.%d", m);
    int targets = tensor(b, nm, TIDE_I32, TIDE_ROLE_INPUT, 1, (int64_t)B * T, 0);
    snprintf(nm, sizeof nm, "loss.%d", m);
    int loss = tensor(b, nm, TIDE_F32, TIDE_ROLE_OUTPUT, 1, 1, 0);

    forward(s, tokens);
    b->layer = -1;
    for (int k = 0; k < NT && !b->st; k++) loss_tile(s, k, targets, loss);
    for (int L = NL - 1; L >= 0 && !b->st; L--)
        for (int k = 0; k < NT && !b->st; k++) backward_tile(s, L, k);
    b->layer = -1;
    for (int k = 0; k < NT && !b->st; k++)
        for (int vb = 0; vb < s->emb->nb; vb++) {
            param *P = &s->emb->b[vb];
            if (P->frozen) continue;
            tide_op_args ep = {.idx0 = (int64_t)k * s->ts * T};
            vblock(s->emb, vb, &ep);
            int in[3] = {s->dh[k], tokens, P->grad};
            op(b, TIDE_OP_EMBED_BWD, P->written ? 3 : 2, in, 1, &P->grad, &ep);
            P->written = true;
        }
    b->prefix = "";
    b->micro_batch = -1;
}

/* The optimizer, parameters in checkpoint order: grad_sumsq, then AdamW. */
static void optimizer(train_build *s) {
    tb *b = &s->b;
    const tide_llama_train_opts *o = s->o;
    const int NL = s->cfg->num_hidden_layers;
    int n_par = 0, sumsq = s->sumsq;
    param **all = tide_calloc((size_t)NL * (P_LAYER + 2 * TIDE_LORA_N) + 1 + 2 * TIDE_VOCAB_BLOCKS_MAX, sizeof *all);
    if (!all && !b->st) b->st = tide_err(b->g->ctx, TIDE_E_NOMEM, "out of memory building a training graph");
    if (all && s->lora) {
        /* LoRA: the adapters alone, layer by layer, A then B per target */
        for (int L = 0; L < NL; L++)
            for (int i = 0; i < TIDE_LORA_N; i++)
                if (s->lora[L].a[i] >= 0) {
                    all[n_par++] = &s->la[L * TIDE_LORA_N + i];
                    all[n_par++] = &s->lb[L * TIDE_LORA_N + i];
                }
    } else if (all) {
        for (int vb = 0; vb < s->emb->nb; vb++) all[n_par++] = &s->emb->b[vb];
        for (int L = 0; L < NL; L++)
            for (int k = 0; k < P_LAYER; k++) all[n_par++] = &s->lp[L * P_LAYER + k];
        all[n_par++] = &s->fnorm;
        if (s->hp != s->emb)
            for (int vb = 0; vb < s->hp->nb; vb++) all[n_par++] = &s->hp->b[vb];
    }
    for (int i = 0; i < n_par && !b->st; i++) {
        b->layer = all[i]->layer;
        int in[2] = {all[i]->grad, sumsq};
        op(b, TIDE_OP_SUMSQ, i ? 2 : 1, in, 1, &sumsq, NULL);
    }
    for (int i = 0; i < n_par && !b->st; i++) {
        param *P = all[i];
        b->layer = P->layer;
        tide_op_args ap = {.beta1 = o->beta1, .beta2 = o->beta2, .adam_eps = o->eps,
                             .weight_decay = o->weight_decay, .max_norm = o->grad_clip};
        int in[7], outs[4], n = 0;
        in[n++] = P->w;
        if (P->master >= 0) in[n++] = P->master;
        in[n++] = P->m;
        in[n++] = P->v;
        for (int j = 0; j < n; j++) outs[j] = in[j];
        int n_out = n;
        in[n++] = P->grad;
        in[n++] = s->hyper;
        in[n++] = sumsq;
        op(b, TIDE_OP_ADAMW, n, in, n_out, outs, &ap);
    }
    tide_free(all);
}

tide_status tide_llama_build_train(tide_ctx *ctx, const tide_llama_config *cfg, const tide_llama_train_opts *o,
                                   tide_graph **out) {
    *out = NULL;
    tide_status st = tide_llama_config_check(ctx, cfg);
    if (st || (st = check_train_opts(ctx, cfg, o))) return st;
    if (cfg->qkv_bias)
        return tide_err(ctx, TIDE_E_UNSUPPORTED, "model '%s': training a model with q/k/v biases (Qwen2) is not "
                        "supported", cfg->name);
    /* LoRA's frozen base may be quantized (QLoRA: tide_qlora_config's types),
     * its q/k rows in Hugging Face's order */
    if (o->lora_r > 0 && cfg->qk_interleaved)
        return tide_err(ctx, TIDE_E_UNSUPPORTED, "model '%s': LoRA on q/k rows in llama.cpp's order: make the "
                        "configuration with tide_qlora_config (the rows are put back at load)", cfg->name);
    if (o->lora_r <= 0 && (tide_dtype_is_quantized(cfg->dtype) || cfg->wtypes_set || cfg->qk_interleaved))
        return tide_err(ctx, TIDE_E_UNSUPPORTED, "model '%s': training from a GGUF or quantized checkpoint is not "
                        "supported (convert it to safetensors)", cfg->name);
    const int B = o->batch, NL = cfg->num_hidden_layers;
    /* row tiles: runs of ts whole sequences of each micro-batch */
    const int ts = o->tile_seqs > 0 && o->tile_seqs < B ? o->tile_seqs : B, NT = (B + ts - 1) / ts;
    const bool bf16 = o->precision == TIDE_PRECISION_BF16;
    train_build s = {.b = {.g = tide_graph_new(ctx), .layer = -1, .prefix = "", .micro_batch = -1, .bf16 = bf16,
                           .kept_dt = bf16 ? TIDE_BF16 : TIDE_F32},
                     .cfg = cfg, .o = o, .ts = ts, .NT = NT};
    s.lp = tide_calloc((size_t)NL * P_LAYER, sizeof *s.lp);
    s.emb = s.hp = tide_calloc(2, sizeof *s.emb); /* the embedding, the head */
    s.keep = tide_calloc((size_t)(NL + 1) * (size_t)NT, sizeof *s.keep);
    s.tiles = tide_calloc((size_t)NT, sizeof *s.tiles);
    int *tk = tide_calloc((size_t)NT * 3, sizeof *tk);
    s.ws = tide_malloc(sizeof *s.ws);
    bool lora_nomem = false;
    if (o->lora_r > 0) {
        s.lora = tide_calloc((size_t)NL, sizeof *s.lora);
        s.la = tide_calloc((size_t)NL * TIDE_LORA_N, sizeof *s.la);
        s.lb = tide_calloc((size_t)NL * TIDE_LORA_N, sizeof *s.lb);
        lora_nomem = !s.lora || !s.la || !s.lb;
    }
    if (!s.lp || !s.emb || !s.keep || !s.tiles || !tk || !s.ws || !s.b.g || lora_nomem) {
        s.b.st = tide_err(ctx, TIDE_E_NOMEM, "out of memory building a training graph");
    } else {
        s.h = tk, s.dh = tk + NT, s.dhm = tk + 2 * NT;
        for (int k = 0; k < NT; k++)
            s.tiles[k] = (llama_tile){.b0 = k * ts, .nb = TIDE_MIN(ts, B - k * ts), .t0 = 0, .n = o->seq};
        add_params(&s);
        for (int m = 0; m < o->accum && !s.b.st; m++) micro_batch(&s, m);
        optimizer(&s);
    }
    tide_free(s.lp);
    tide_free(s.emb);
    tide_free(s.keep);
    tide_free(s.tiles);
    tide_free(tk);
    tide_free(s.ws);
    tide_free(s.lora);
    tide_free(s.la);
    tide_free(s.lb);
    if (s.b.st) {
        tide_graph_free(s.b.g);
        return s.b.st;
    }
    *out = s.b.g;
    return train_is_rank_step(o) ? train_ranks_apply(ctx, o, out) : TIDE_OK;
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

/* ---------------------------------------------------------------- precision */

const char *tide_train_precision_name(int precision) {
    switch (precision) {
    case TIDE_PRECISION_F32: return "f32";
    case TIDE_PRECISION_BF16: return "bf16";
    case TIDE_PRECISION_AUTO: return "auto";
    default: return NULL;
    }
}

tide_status tide_train_precision_parse(tide_ctx *ctx, const char *s, int *precision) {
    for (int p = 0; p <= TIDE_PRECISION_AUTO; p++)
        if (s && !strcmp(s, tide_train_precision_name(p))) {
            *precision = p;
            return TIDE_OK;
        }
    return tide_err(ctx, TIDE_E_INVALID, "precision '%s' is not one of f32, bf16, auto", s ? s : "");
}

const char *tide_train_bf16_path(void) { return tk_gemm_bf16_path(); }

int tide_train_precision_resolve(int precision, bool gpu) {
    if (precision != TIDE_PRECISION_AUTO) return precision;
    if (gpu) return TIDE_PRECISION_F32;
    return (tk_cpu() & TK_CPU_AVX512BF16) ? TIDE_PRECISION_BF16 : TIDE_PRECISION_F32;
}

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

/* ---------------------------------------------------------------- LoRA targets */

static const char *const lora_short[TIDE_LORA_N] = {"q", "k", "v", "o", "gate", "up", "down"};
static const char *const lora_module[TIDE_LORA_N] = {"q_proj", "k_proj", "v_proj", "o_proj",
                                                     "gate_proj", "up_proj", "down_proj"};

const char *tide_lora_target_name(int i) { return i >= 0 && i < TIDE_LORA_N ? lora_module[i] : NULL; }

tide_status tide_lora_parse_targets(tide_ctx *ctx, const char *list, unsigned *bits) {
    *bits = 0;
    const char *p = list ? list : "";
    while (*p) {
        const char *e = strchr(p, ',');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        int found = -1;
        for (int i = 0; i < TIDE_LORA_N && found < 0; i++)
            if ((strlen(lora_short[i]) == n && !strncmp(p, lora_short[i], n)) ||
                (strlen(lora_module[i]) == n && !strncmp(p, lora_module[i], n)))
                found = i;
        if (found < 0)
            return tide_err(ctx, TIDE_E_INVALID, "LoRA target '%.*s' is not one of q,k,v,o,gate,up,down (or "
                            "q_proj, ..., down_proj)", (int)n, p);
        *bits |= 1u << found;
        p += n + (e != NULL);
    }
    if (!*bits) return tide_err(ctx, TIDE_E_INVALID, "LoRA targets: the list is empty");
    return TIDE_OK;
}
