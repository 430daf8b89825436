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

typedef struct tide_op {
    tide_op_kind kind;
    int n_in, n_out;
    int in[TIDE_OP_MAX_IN];
    int out[TIDE_OP_MAX_OUT];
    tide_op_params p;
    int layer;    /* decoder layer, -1 for none */
    double flops; /* estimated floating-point operations */
    uint64_t scratch_bytes; /* backend workspace the op needs besides its tensors */
} tide_op;

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

/* True if op reads tensor t / writes tensor t. */
bool tide_op_reads(const tide_op *op, int t);
bool tide_op_writes(const tide_op *op, int t);

#endif
