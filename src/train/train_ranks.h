/*
 * train_ranks.h - one data-parallel rank's training step: the collectives of
 * data parallelism (ZeRO-0, 1, 2) put into a single-device step graph
 * (train_ranks.c says how each stage shards and where each collective goes).
 */
#ifndef TIDE_TRAIN_RANKS_H
#define TIDE_TRAIN_RANKS_H

#include "graph/graph.h"

#define TIDE_TRAIN_RANKS_MAX 65536

/* The step graph of one of `ranks` ranks (1 .. TIDE_TRAIN_RANKS_MAX; 1: the
 * collectives over one rank) under ZeRO stage `zero` (0, 1 or 2) made from
 * g, the step of its micro-batches on one device (tide_llama_build_train),
 * into *out (the caller frees it).
 * TIDE_E_INVALID for bad ranks or stage (message on ctx), TIDE_E_UNSUPPORTED
 * for gradients as outputs with sharded state, TIDE_E_NOMEM. */
tide_status tide_train_rank_graph(tide_ctx *ctx, const tide_graph *g, int ranks, int zero, tide_graph **out);

/* For tide_llama_build_train: replaces *g (o's step on one device) by its
 * rank's step under o->ranks and o->zero (*g freed and NULL on failure). */
tide_status train_ranks_apply(tide_ctx *ctx, const tide_llama_train_opts *o, tide_graph **g);

/* Whether o's step is a rank's (with collectives): ranks >= 2, or one rank
 * with one_rank. */
static inline bool train_is_rank_step(const tide_llama_train_opts *o) {
    return o->ranks > 1 || (o->ranks == 1 && o->one_rank);
}

#endif
