/*
 * graph.h - the graph's internal layout, shared by the model builders, the
 * runner, the planner, the verifier and the backends.
 *
 * A graph is a list of tensors and a list of ops in execution order. An op
 * names its inputs and outputs by tensor index; a tensor that is both read and
 * written by one op (the KV cache in ATTENTION) appears in both lists. The
 * graph holds shapes and roles only, never data: planning needs no weights.
 */
#ifndef TIDE_GRAPH_H
#define TIDE_GRAPH_H

#include "core/core.h"

/* The op kinds the public header leaves out: GENERIC, a synthetic op for the
 * planning tests and benchmarks (any tensors; the CPU backend fills each
 * output with a deterministic function of its inputs; tide_op_args.flops
 * says what it stands for), in the public enum's hole at 9; and the number of
 * kinds, which grows with each one added. */
#define TIDE_OP_GENERIC ((tide_op_kind)9)
/* Collectives of a data-parallel step over op args `ranks` ranks (this
 * rank's view; plan.h: the instructions that run them on the network):
 *   ALL_REDUCE      x -> x in place: the sum of every rank's x (f32)
 *   REDUCE_SCATTER  x (d0, ...) -> s (ceil(d0 / ranks), ...): this rank's
 *                   rows of the sum of every rank's x (f32)
 *   ALL_GATHER      s (ceil(d0 / ranks), ...) -> x (d0, ...): every rank's
 *                   rows, concatenated (any float dtype)
 * They cost no FLOPs: the cost model prices them by the profile's network. */
#define TIDE_OP_ALL_REDUCE ((tide_op_kind)(TIDE_OP_ADD_BIAS + 1))
#define TIDE_OP_REDUCE_SCATTER ((tide_op_kind)(TIDE_OP_ADD_BIAS + 2))
#define TIDE_OP_ALL_GATHER ((tide_op_kind)(TIDE_OP_ADD_BIAS + 3))
#define TIDE_OP_COUNT (TIDE_OP_ADD_BIAS + 4)
static inline bool tide_op_is_collective(tide_op_kind k) {
    return k == TIDE_OP_ALL_REDUCE || k == TIDE_OP_REDUCE_SCATTER || k == TIDE_OP_ALL_GATHER;
}

typedef struct tide_tensor {
    char *name;
    tide_dtype dtype;
    tide_role role;
    int ndim;
    int64_t shape[TIDE_MAX_DIMS];
    uint64_t nbytes;
    int layer; /* decoder layer, -1 for none */
    char *home;        /* persistent tensor that is a byte range of another: its name */
    uint64_t home_off; /* ... and the range's first byte */
} tide_tensor;

/* An op's parameters inside the library: the public tide_op_params (the same
 * fields, which a library user sets) and what only the library's own graph
 * builders and tiler set (tide_graph_add_op leaves them 0: a whole op). */
typedef struct tide_op_args {
    float eps;        /* RMSNORM */
    float rope_theta; /* ROPE */
    int n_heads;      /* ROPE, ATTENTION */
    int n_kv_heads;   /* ATTENTION */
    int head_dim;     /* ROPE, ATTENTION */
    int batch;        /* ROPE, ATTENTION, TAKE_LAST: B (rows = B*T) */
    double flops;     /* GENERIC only: what the synthetic op stands for */
    /* tiles (all 0 for a whole op) */
    int64_t idx0;     /* EMBED: first tokens entry; ROPE, ATTENTION: first pos entry */
    bool pos_rows;    /* ROPE, ATTENTION: pos holds a position per row (include/tide.h) */
    bool rope_interleaved; /* ROPE: x holds each head's pairs (i, i + hd/2) at (2i, 2i+1),
                              as llama.cpp's GGUF q/k rows; out in (i, i + hd/2) order */
    int64_t row0;     /* MATMUL, TAKE_LAST: first output row written */
    int64_t col0;     /* MATMUL: first output column written */
    int64_t vocab0;   /* EMBED, EMBED_BWD, CE_STATS, CE_BLOCK: id of the block's first row */
    int64_t vocab;    /* the same: whole vocabulary (0: the block's rows) */
    /* training */
    bool no_transpose; /* MATMUL: out = x . w, w (K, N) */
    bool accumulate;   /* MATMUL: out += the product (the output its third input);
                          CE_STATS: the loss adds; CE_BLOCK: dw adds */
    float scale;       /* CROSS_ENTROPY, CE_*: the factor of the loss and its gradients */
    float beta1, beta2, adam_eps, weight_decay, max_norm; /* ADAMW */
    int ranks;         /* ALL_REDUCE, REDUCE_SCATTER, ALL_GATHER: ranks taking part (>= 2) */
    bool bf16;         /* MATMUL, MATMUL_GRADW, CROSS_ENTROPY, CE_*: the product's f32
                          operands rounded to bf16 first (to nearest even), f32
                          accumulation (a bf16 training step) */
} tide_op_args;

/* Input (i < n_in) or output (i - n_in) i of op takes any float dtype as
 * stored (a weight, a table, a KV cache): its kernels convert it
 * themselves. Other float tensors are f32 activations, or bf16 ones of a
 * bf16 training step (ops.c). */
static inline bool tide_op_slot_native(tide_op_kind kind, int n_in, int i) {
    switch ((int)kind) { /* TIDE_OP_GENERIC is outside the public enum */
    case TIDE_OP_EMBED: return i == 0;
    case TIDE_OP_MATMUL: case TIDE_OP_RMSNORM: case TIDE_OP_RMSNORM_BWD: case TIDE_OP_ADD_BIAS:
    case TIDE_OP_CROSS_ENTROPY: case TIDE_OP_CE_STATS: case TIDE_OP_CE_BLOCK: return i == 1;
    case TIDE_OP_ATTENTION: return (i >= 4 && i < n_in) || i > n_in;
    case TIDE_OP_ADAMW: case TIDE_OP_GENERIC: return true; /* parameters; bytes */
    default: return tide_op_is_collective(kind);           /* any float dtype, moved as bytes */
    }
}

/* tide_graph_add_op with the library's full parameters (a: NULL for none). */
tide_status tide_graph_add_op_args(tide_graph *g, tide_op_kind kind, int n_in, const int *in, int n_out,
                                   const int *out, const tide_op_args *a, int layer, int *id);

typedef struct tide_op {
    tide_op_kind kind;
    int n_in, n_out;
    int in[TIDE_OP_MAX_IN];
    int out[TIDE_OP_MAX_OUT];
    tide_op_args p;
    int layer;    /* decoder layer, -1 for none */
    int micro_batch; /* a training step's micro-batch (0 .. accum - 1) whose
                        forward, loss or backward the op computes; -1 for
                        none (inference, the optimizer) */
    double flops; /* estimated floating-point operations */
    uint64_t scratch_bytes; /* backend workspace the op needs besides its tensors */
} tide_op;

/* CROSS_ENTROPY's forms (graph/ops.c, check_cross_entropy): its weight
 * gradient is out[2] unless it writes 2 outputs (a frozen head); whether dw
 * adds into an input, and whether the loss adds into its last input. */
static inline bool tide_ce_dw_adds(const tide_op *op) { return op->n_out == 3 && op->n_in >= 4; }
static inline bool tide_ce_loss_adds(const tide_op *op) { return op->n_in == (op->n_out == 3 ? 5 : 4); }

struct tide_graph {
    tide_ctx *ctx;
    tide_tensor *tensors;
    int n_tensors, cap_tensors;
    tide_op *ops;
    int n_ops, cap_ops;
    /* name -> index, open addressing over a power-of-two table */
    int *index;
    int index_cap;
};

static inline int64_t tide_tensor_numel(const tide_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

/* Rows of a 2-D activation (shape[0]) and its row length (shape[1]). */
static inline int64_t tide_tensor_rows(const tide_tensor *t) { return t->shape[0]; }
static inline int64_t tide_tensor_cols(const tide_tensor *t) { return t->ndim > 1 ? t->shape[t->ndim - 1] : 1; }
/* Elements of one rank's shard of x over n ranks: ceil(d0 / n) of its rows
 * (rank 0's, the largest). */
int64_t tide_shard_numel(const tide_tensor *x, int n);

/* True if op reads tensor t / writes tensor t. */
bool tide_op_reads(const tide_op *op, int t);
bool tide_op_writes(const tide_op *op, int t);

/* ---------------------------------------------------------------- op descriptors (ops.c)
 *
 * One row per op kind: what every stage needs to know of it. Backends keep a
 * kernel table indexed by kind beside it (a kind without a kernel there is
 * TIDE_E_UNSUPPORTED on that backend). */

/* The rate an op runs at in the cost model (cost/cost.c). */
typedef enum tide_op_class {
    TIDE_OPC_VECTOR = 0, /* element-wise and reductions: half the f32 peak, or memory-bound */
    TIDE_OPC_MATMUL,     /* the peak of the weight's dtype x matmul_efficiency */
    TIDE_OPC_ATTENTION,  /* the peak of the activation dtype x attention_efficiency */
    TIDE_OPC_GENERIC,    /* the f32 matmul rate (synthetic ops of tests and benchmarks) */
} tide_op_class;

typedef struct tide_op_desc {
    const char *name;
    signed char min_in, max_in, n_out; /* arity; -1: any (checked by the kind's check);
                                          n_out alone -1: outputs checked there */
    tide_op_class cls;
    bool tile_rmw;      /* the form with max_in inputs takes its own output as its last
                           input: a tile written into a larger output */
    /* Checks shapes, dtypes and parameters of an op whose arity was checked;
     * sets *flops. TIDE_OK or TIDE_E_INVALID with a message naming the op. */
    tide_status (*check)(tide_graph *g, int n_in, const int *in, int n_out, const int *out,
                         const tide_op_args *p, double *flops);
    /* Bytes the op moves through memory; NULL: its distinct inputs and outputs. */
    double (*bytes)(const tide_graph *g, const tide_op *op);
    /* Backend workspace beside its tensors; NULL: none. */
    uint64_t (*scratch)(const tide_graph *g, const tide_op *op);
} tide_op_desc;

/* The row of kind k, or NULL for an unknown kind. */
const tide_op_desc *tide_op_desc_of(tide_op_kind k);
/* Checks an op of kind k against its row (arity, the tiled form's output,
 * tile offsets, then the kind's own check); sets *flops. TIDE_OK or
 * TIDE_E_INVALID naming the problem. */
tide_status tide_op_check(tide_graph *g, tide_op_kind kind, int n_in, const int *in, int n_out, const int *out,
                          const tide_op_args *p, double *flops);
/* Bytes op moves through memory (the cost model's memory-bound term). */
double tide_op_bytes(const tide_graph *g, const tide_op *op);
/* The rows of logits a CROSS_ENTROPY of rows x vocab holds at once (its
 * scratch: that many rows of vocab f32, then, for a 16-bit weight, a
 * conversion block of min(16 MiB, the weight widened to f32)). */
int64_t tide_ce_chunk_rows(int64_t rows, int64_t vocab);

#endif
