/*
 * llama_layer.c - the builder pieces both LLaMA graphs use and the forward
 * of one decoder layer (model/llama_int.h).
 */
#include "model/llama_int.h"

#include <stddef.h>
#include <stdio.h>

int llama_tensor(llama_builder *b, const char *name, tide_dtype dt, tide_role role, int ndim, int64_t d0,
                 int64_t d1, int64_t d2) {
    if (b->st) return -1;
    int64_t shape[3] = {d0, d1, d2};
    int id = -1;
    b->st = tide_graph_add_tensor(b->g, name, dt, role, ndim, shape, &id);
    if (!b->st) tide_graph_set_tensor_layer(b->g, id, b->layer);
    return id;
}

int llama_act(llama_builder *b, const char *what, int k, int n_tiles, int64_t rows, int64_t cols) {
    return llama_act_dt(b, what, k, n_tiles, rows, cols, TIDE_F32);
}

int llama_act_dt(llama_builder *b, const char *what, int k, int n_tiles, int64_t rows, int64_t cols, tide_dtype dt) {
    char name[160], tile[24] = "", layer[24] = "";
    if (n_tiles > 1) snprintf(tile, sizeof tile, ".t%d", k);
    if (b->layer >= 0) snprintf(layer, sizeof layer, "l%d.", b->layer);
    snprintf(name, sizeof name, "%s%s%s%s", b->prefix ? b->prefix : "", layer, what, tile);
    return llama_tensor(b, name, dt, TIDE_ROLE_TEMP, 2, rows, cols, 0);
}

void llama_op(llama_builder *b, tide_op_kind kind, int n_in, const int *in, int n_out, const int *out,
              const tide_op_args *p) {
    if (b->st) return;
    tide_op_args a;
    if (b->bf16 && (kind == TIDE_OP_MATMUL || kind == TIDE_OP_MATMUL_GRADW || kind == TIDE_OP_CROSS_ENTROPY ||
                    kind == TIDE_OP_CE_STATS || kind == TIDE_OP_CE_BLOCK)) {
        a = p ? *p : (tide_op_args){0};
        a.bf16 = true;
        p = &a;
    }
    int id = -1;
    b->st = tide_graph_add_op_args(b->g, kind, n_in, in, n_out, out, p, b->layer, &id);
    if (!b->st) b->g->ops[id].micro_batch = b->micro_batch;
}

int llama_weight(llama_builder *b, tide_dtype dt, int64_t d0, int64_t d1, const char *fmt, int layer) {
    char name[128];
    snprintf(name, sizeof name, fmt, layer);
    if (b->wcfg) dt = tide_llama_weight_dtype(b->wcfg, name);
    int id = b->st ? -1 : tide_graph_find(b->g, name);
    return id >= 0 ? id : llama_tensor(b, name, dt, TIDE_ROLE_WEIGHT, d1 ? 2 : 1, d0, d1, 0);
}

void llama_split(llama_builder *b, llama_wsplit *w, tide_dtype dt, int64_t N, int64_t K, uint64_t max_bytes,
                 const char *fmt, int layer) {
    char name[128], bname[192];
    snprintf(name, sizeof name, fmt, layer);
    if (b->wcfg) dt = tide_llama_weight_dtype(b->wcfg, name);
    uint64_t row_bytes = tide_dtype_bytes(dt, (uint64_t)K), bytes = row_bytes * (uint64_t)N;
    int64_t nblk = max_bytes && bytes > max_bytes ? (int64_t)((bytes + max_bytes - 1) / max_bytes) : 1;
    nblk = TIDE_MIN(TIDE_MIN(nblk, N), (int64_t)LLAMA_MAX_BLOCKS);
    int64_t per = (N + nblk - 1) / nblk;
    w->n = 0;
    for (int64_t r0 = 0; r0 < N && !b->st; r0 += per) {
        int64_t r1 = TIDE_MIN(N, r0 + per);
        int id;
        if (nblk == 1) {
            id = tide_graph_find(b->g, name);
            if (id < 0) id = llama_tensor(b, name, dt, TIDE_ROLE_WEIGHT, 2, N, K, 0);
        } else {
            snprintf(bname, sizeof bname, "%s[%lld:%lld]", name, (long long)r0, (long long)r1);
            id = tide_graph_find(b->g, bname);
            if (id < 0) {
                id = llama_tensor(b, bname, dt, TIDE_ROLE_WEIGHT, 2, r1 - r0, K, 0);
                if (!b->st) b->st = tide_graph_set_tensor_home(b->g, id, name, (uint64_t)r0 * row_bytes);
            }
        }
        w->id[w->n] = id;
        w->row0[w->n++] = r0;
    }
}

/* The rows of tile k. */
static int64_t rows(const llama_layer_in *in, int k) { return (int64_t)in->tiles[k].nb * in->tiles[k].n; }

/* The first pos entry of tile k: its first step, or with a position per
 * row its first row. */
static int64_t pos0(const llama_layer_in *in, int k) {
    const llama_tile *t = &in->tiles[k];
    return in->pos_rows ? (int64_t)t->b0 * in->seq + t->t0 : t->t0;
}

/* Activation field `f` of every tile of [k0, k1) = the matmul of field x by
 * the (split) weight fmt of layer L, (N, K), named `what`: block by block,
 * each block for every tile. */
#define ACT(k, f) (*(int *)((char *)&acts[k] + (f)))
static void matmul(llama_builder *b, const llama_layer_in *in, int L, int k0, int k1, llama_acts *acts, size_t x,
                   size_t out, const char *what, int64_t N, int64_t K, const char *fmt, int target) {
    llama_wsplit *ws = in->ws;
    llama_split(b, ws, in->cfg->dtype, N, K, in->wmax, fmt, L);
    for (int j = 0; j < ws->n && !b->st; j++)
        for (int k = k0; k < k1 && !b->st; k++) {
            if (j == 0) ACT(k, out) = llama_act_dt(b, what, k, in->n_tiles, rows(in, k), N, b->kept_dt);
            tide_op_args mp = {.col0 = ws->row0[j]};
            int in3[3] = {ACT(k, x), ws->id[j], ACT(k, out)};
            llama_op(b, TIDE_OP_MATMUL, j ? 3 : 2, in3, 1, &ACT(k, out), &mp);
        }
    const llama_lora *lo = in->lora;
    if (!lo || lo->a[target] < 0) return;
    /* the adapter: out += ((x A^T) . scale) B^T */
    for (int k = k0; k < k1 && !b->st; k++) {
        char nt[48], ns[48];
        snprintf(nt, sizeof nt, "%s_lora_t", what);
        snprintf(ns, sizeof ns, "%s_lora_ts", what);
        int t = llama_act_dt(b, nt, k, in->n_tiles, rows(in, k), lo->r, b->kept_dt);
        int ts = llama_act_dt(b, ns, k, in->n_tiles, rows(in, k), lo->r, b->kept_dt);
        int i1[2] = {ACT(k, x), lo->a[target]};
        llama_op(b, TIDE_OP_MATMUL, 2, i1, 1, &t, NULL);
        tide_op_args kn = {.no_transpose = true};
        int i2[2] = {t, lo->scale};
        /* the scale is no product's operand to round (a bf16 step: autocast
         * multiplies a bf16 tensor by the f32 scaling, rounding once) */
        const bool bf = b->bf16;
        b->bf16 = false;
        llama_op(b, TIDE_OP_MATMUL, 2, i2, 1, &ts, &kn);
        b->bf16 = bf;
        tide_op_args acc = {.accumulate = true};
        int i3[3] = {ts, lo->b[target], ACT(k, out)};
        llama_op(b, TIDE_OP_MATMUL, 3, i3, 1, &ACT(k, out), &acc);
        acts[k].lora_ts[target] = ts;
    }
}

/* out of every tile = kind(field a, c) where c_field < 0 means the fixed
 * tensor c_id (a weight, pos); a new activation named `what`. */
static void each(llama_builder *b, const llama_layer_in *in, int k0, int k1, llama_acts *acts, tide_op_kind kind,
                 size_t a, long c_field, int c_id, size_t out, const char *what, int64_t cols,
                 const tide_op_args *p) {
    /* the residual stream's adds stay f32 (autocast's promotion) */
    const tide_dtype dt = kind == TIDE_OP_ADD ? TIDE_F32 : b->kept_dt;
    for (int k = k0; k < k1 && !b->st; k++) {
        ACT(k, out) = llama_act_dt(b, what, k, in->n_tiles, rows(in, k), cols, dt);
        int in2[2] = {ACT(k, a), c_field >= 0 ? ACT(k, (size_t)c_field) : c_id};
        llama_op(b, kind, 2, in2, 1, &ACT(k, out), p);
    }
}

#define F(name) offsetof(llama_acts, name)

void llama_layer_forward(llama_builder *b, const llama_layer_in *in, int L, int k0, int k1, llama_acts *acts) {
    const tide_llama_config *cfg = in->cfg;
    const int64_t D = cfg->hidden_size, H = cfg->num_attention_heads, KV = cfg->num_key_value_heads;
    const int64_t hd = D / H, I = cfg->intermediate_size, kd = KV * hd;
    const tide_dtype wt = cfg->dtype;
    const char *const *nm = in->names;
    b->layer = L;
    int w_in = llama_weight(b, wt, D, 0, "model.layers.%d.input_layernorm.weight", L);
    int w_post = llama_weight(b, wt, D, 0, "model.layers.%d.post_attention_layernorm.weight", L);
    tide_op_args norm = {.eps = cfg->rms_norm_eps};

    each(b, in, k0, k1, acts, TIDE_OP_RMSNORM, F(h), -1, w_in, F(xn), nm[0], D, &norm);
    matmul(b, in, L, k0, k1, acts, F(xn), F(q), nm[1], H * hd, D, "model.layers.%d.self_attn.q_proj.weight", 0);
    matmul(b, in, L, k0, k1, acts, F(xn), F(k), nm[2], kd, D, "model.layers.%d.self_attn.k_proj.weight", 1);
    matmul(b, in, L, k0, k1, acts, F(xn), F(v), nm[3], kd, D, "model.layers.%d.self_attn.v_proj.weight", 2);
    if (cfg->qkv_bias) {
        static const char *const bias[3] = {"model.layers.%d.self_attn.q_proj.bias",
                                            "model.layers.%d.self_attn.k_proj.bias",
                                            "model.layers.%d.self_attn.v_proj.bias"};
        const size_t fld[3] = {F(q), F(k), F(v)};
        const int64_t cols[3] = {H * hd, kd, kd};
        for (int i = 0; i < 3 && !b->st; i++) {
            char what[48];
            snprintf(what, sizeof what, "%s_bias", nm[1 + i]);
            int wb = llama_weight(b, wt, cols[i], 0, bias[i], L);
            for (int k = k0; k < k1 && !b->st; k++) {
                int in2[2] = {ACT(k, fld[i]), wb};
                ACT(k, fld[i]) = llama_act(b, what, k, in->n_tiles, rows(in, k), cols[i]);
                llama_op(b, TIDE_OP_ADD_BIAS, 2, in2, 1, &ACT(k, fld[i]), NULL);
            }
        }
    }
    for (int k = k0; k < k1 && !b->st; k++) {
        tide_op_args rp = {.rope_theta = cfg->rope_theta, .n_heads = (int)H, .head_dim = (int)hd,
                             .batch = in->tiles[k].nb, .idx0 = pos0(in, k), .pos_rows = in->pos_rows,
                             .rope_interleaved = cfg->qk_interleaved};
        acts[k].qr = llama_act_dt(b, nm[4], k, in->n_tiles, rows(in, k), H * hd, b->kept_dt);
        int in2[2] = {acts[k].q, in->pos};
        llama_op(b, TIDE_OP_ROPE, 2, in2, 1, &acts[k].qr, &rp);
        rp.n_heads = (int)KV;
        acts[k].kr = llama_act_dt(b, nm[5], k, in->n_tiles, rows(in, k), kd, b->kept_dt);
        in2[0] = acts[k].k;
        llama_op(b, TIDE_OP_ROPE, 2, in2, 1, &acts[k].kr, &rp);
    }
    for (int k = k0; k < k1 && !b->st; k++) {
        const llama_tile *t = &in->tiles[k];
        tide_op_args ap = {.n_heads = (int)H, .n_kv_heads = (int)KV, .head_dim = (int)hd, .batch = t->nb,
                             .idx0 = pos0(in, k), .pos_rows = in->pos_rows};
        acts[k].a = llama_act_dt(b, nm[6], k, in->n_tiles, rows(in, k), H * hd, b->kept_dt);
        int ain[6] = {acts[k].qr, acts[k].kr, acts[k].v, in->pos}, aout[3] = {acts[k].a};
        if (!in->kc) {
            llama_op(b, TIDE_OP_ATTENTION, 4, ain, 1, aout, &ap);
            continue;
        }
        int s = in->per_seq ? t->b0 : 0;
        ain[4] = aout[1] = in->kc[s];
        ain[5] = aout[2] = in->vc[s];
        llama_op(b, TIDE_OP_ATTENTION, in->fresh_cache && t->t0 == 0 ? 4 : 6, ain, 3, aout, &ap);
    }
    matmul(b, in, L, k0, k1, acts, F(a), F(a_out), nm[7], D, H * hd, "model.layers.%d.self_attn.o_proj.weight", 3);
    each(b, in, k0, k1, acts, TIDE_OP_ADD, F(h), (long)F(a_out), -1, F(hm), nm[8], D, NULL);
    each(b, in, k0, k1, acts, TIDE_OP_RMSNORM, F(hm), -1, w_post, F(xn2), nm[9], D, &norm);
    matmul(b, in, L, k0, k1, acts, F(xn2), F(g), nm[10], I, D, "model.layers.%d.mlp.gate_proj.weight", 4);
    matmul(b, in, L, k0, k1, acts, F(xn2), F(u), nm[11], I, D, "model.layers.%d.mlp.up_proj.weight", 5);
    each(b, in, k0, k1, acts, TIDE_OP_SILU_MUL, F(g), (long)F(u), -1, F(s), nm[12], I, NULL);
    matmul(b, in, L, k0, k1, acts, F(s), F(s_out), nm[13], D, I, "model.layers.%d.mlp.down_proj.weight", 6);
    for (int k = k0; k < k1 && !b->st; k++) {
        /* the residual stream between layers belongs to none */
        char hname[32];
        snprintf(hname, sizeof hname, "%s.%d", nm[14], L + 1);
        b->layer = -1;
        int hn = llama_act(b, hname, k, in->n_tiles, rows(in, k), D);
        b->layer = L;
        int in2[2] = {acts[k].hm, acts[k].s_out};
        llama_op(b, TIDE_OP_ADD, 2, in2, 1, &hn, NULL);
        acts[k].h = hn;
    }
}
