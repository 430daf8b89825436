/*
 * llama_int.h - the pieces of the LLaMA graph builder that the inference
 * graph (model/llama.c, tide_llama_build) and the training graph
 * (train/train_graph.c, tide_llama_build_train) share: a builder that stops
 * at its first error, activation naming, weight row blocks, and the forward
 * of one decoder layer (model/llama_layer.c).
 *
 * One layer's forward, per row tile (R rows, D hidden, H heads, KV kv
 * heads, hd = D/H, I intermediate):
 *   xn = rmsnorm(h, ln1)                          (R, D)
 *   q, k, v = xn . Wq^T, Wk^T, Wv^T               (R, H*hd), (R, KV*hd) x2
 *   qr, kr = rope(q), rope(k)
 *   a = attention(qr, kr, v, pos [, caches])      (R, H*hd)
 *   a_out = a . Wo^T;  hm = h + a_out              (R, D)
 *   xn2 = rmsnorm(hm, ln2)
 *   g, u = xn2 . Wg^T, Wu^T                       (R, I)
 *   s = silu(g) * u;  s_out = s . Wd^T            (R, I) -> (R, D)
 *   h.L+1 = hm + s_out
 * Each step runs for every tile of the range before the next step, and a
 * matmul runs weight block by weight block, each block for every tile: the
 * inference graph passes all its tiles at once (a layer's weights serve
 * every tile), the training graph one tile at a time (a tile's forward
 * whole, its activations kept for the backward).
 */
#ifndef TIDE_LLAMA_INT_H
#define TIDE_LLAMA_INT_H

#include "graph/graph.h"

/* A graph being built: every call after the first error does nothing, and
 * st holds that error. Tensors and ops are tagged with `layer` (-1: none). */
typedef struct llama_builder {
    tide_graph *g;
    tide_status st;
    int layer;
    const char *prefix; /* activation names start with it ("" or "mbM.") */
    int micro_batch;    /* the ops' tide_op.micro_batch (-1: none) */
    const tide_llama_config *wcfg; /* set: each weight's dtype is
                                      tide_llama_weight_dtype(wcfg, name), not
                                      the one the caller gives */
    tide_dtype kept_dt;  /* the dtype of the layer activations a training
                            step keeps (llama_layer_forward; the residual
                            stream stays f32): TIDE_F32 (0) or TIDE_BF16 */
    bool bf16;           /* products (MATMUL, MATMUL_GRADW, the losses) take
                            bf16-rounded operands (tide_op_args.bf16) */
} llama_builder;

/* Adds a tensor of ndim dims (d0, d1, d2); its id, or -1 after an error. */
int llama_tensor(llama_builder *b, const char *name, tide_dtype dt, tide_role role, int ndim, int64_t d0,
                 int64_t d1, int64_t d2);
/* The f32 TEMP (rows, cols) "PREFIX[lL.]WHAT[.tK]": layer L when b->layer
 * >= 0, tile k's suffix when there are n_tiles > 1. */
int llama_act(llama_builder *b, const char *what, int k, int n_tiles, int64_t rows, int64_t cols);
/* The same activation in dtype dt. */
int llama_act_dt(llama_builder *b, const char *what, int k, int n_tiles, int64_t rows, int64_t cols, tide_dtype dt);
/* Appends an op (NULL p: all parameters 0); with b->bf16 a product's
 * args get bf16 set. */
void llama_op(llama_builder *b, tide_op_kind kind, int n_in, const int *in, int n_out, const int *out,
              const tide_op_args *p);

/* The WEIGHT named by fmt (with %d the layer), (d0) or (d0, d1); the
 * graph's tensor of that name when it has one. */
int llama_weight(llama_builder *b, tide_dtype dt, int64_t d0, int64_t d1, const char *fmt, int layer);

/* A 2-D weight split into row blocks of at most `max_bytes` (0: whole). */
#define LLAMA_MAX_BLOCKS 4096
typedef struct llama_wsplit {
    int n;
    int id[LLAMA_MAX_BLOCKS];
    int64_t row0[LLAMA_MAX_BLOCKS];
} llama_wsplit;

/* The weight named by fmt (with %d the layer), (N, K): whole when it fits
 * max_bytes (the tensor of that name, made a WEIGHT unless the graph has it
 * already), else row blocks "NAME[r0:r1]" homed at their rows of NAME. */
void llama_split(llama_builder *b, llama_wsplit *w, tide_dtype dt, int64_t N, int64_t K, uint64_t max_bytes,
                 const char *fmt, int layer);

/* A run of rows: `nb` whole sequences from b0 (t0 0, n the sequence), or
 * rows [t0, t0+n) of sequence b0. */
typedef struct llama_tile {
    int b0, nb;
    int64_t t0, n;
} llama_tile;

/* One tile's activations in a layer, as the layer's forward made them
 * (ids); h is the layer's input, and on return the next layer's. */
typedef struct llama_acts {
    int h, xn, q, k, v, qr, kr, a, a_out, hm, xn2, g, u, s, s_out;
    int lora_ts[TIDE_LORA_N]; /* LoRA: (alpha/r) x A^T per target (llama_lora) */
} llama_acts;

/* LoRA adapters of one layer: per target (q, k, v, o, gate, up, down) the
 * ids of A (r, K) and B (N, r), -1 for an untargeted projection, and the
 * (r, r) scale (alpha/r) I. A targeted matmul adds
 *   t = x A^T;  ts = t . scale;  out += ts B^T
 * (ts kept in llama_acts.lora_ts: the backward reads it). */
typedef struct llama_lora {
    int a[TIDE_LORA_N], b[TIDE_LORA_N];
    int scale;
    int r;
} llama_lora;

/* The names of the layer's activations, in llama_acts order from xn, then
 * h.L+1's stem ("h"): LLAMA_NAMES entries. */
enum { LLAMA_NAMES = 15 };

/* What a layer's forward reads besides its tiles. */
typedef struct llama_layer_in {
    const tide_llama_config *cfg;
    int pos;                /* the positions INPUT */
    int seq;                /* T: rows of a sequence (pos_rows indexing) */
    bool pos_rows;          /* pos holds a position per row */
    const llama_tile *tiles;
    int n_tiles;            /* of the whole graph (names get ".tK" when > 1) */
    const int *kc, *vc;     /* the layer's caches, per sequence (per_seq) or one;
                               NULL: attention over the tile's own rows, no cache */
    bool per_seq;
    bool fresh_cache;       /* a sequence's first tile only writes its caches */
    uint64_t wmax;          /* weight row blocks (0: whole weights) */
    llama_wsplit *ws;       /* scratch */
    const char *const *names;
    const llama_lora *lora; /* the layer's adapters, or NULL */
} llama_layer_in;

/* The forward of layer L (b->layer is set to it) for tiles [k0, k1) of
 * in->tiles, acts[k] their activations. The layer's norm weights are found
 * or made WEIGHTs by name, as are its matmul weights (llama_split). Errors
 * land in b->st. */
void llama_layer_forward(llama_builder *b, const llama_layer_in *in, int L, int k0, int k1, llama_acts *acts);

#endif
