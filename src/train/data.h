/*
 * data.h - training tokens (data.c): a flat file of token ids cut into the
 * windows of each micro-batch, and a synthetic corpus. The whole interface is
 * public: tide_tokens_* in include/tide.h, with the file formats and the
 * window formula. What the data sets of dataset.c share with it is here.
 */
#ifndef TIDE_TRAIN_DATA_H
#define TIDE_TRAIN_DATA_H

#include "core/core.h"

/* A tide_tokens over n ids held in memory (ids: tide_malloc'd, owned from
 * now on, freed on failure too), checked as tide_tokens_open checks a file
 * (at least seq + 2 ids, each below vocab); name stands for the path in
 * messages. Its windows are a file's of the same ids. */
tide_status data_tokens_from_ids(tide_ctx *ctx, const char *name, uint32_t *ids, int64_t n, int64_t vocab, int64_t seq,
                                 tide_tokens **out);
/* Row b of micro-batch micro of step: the global row g in order (g mod n),
 * or shuffled (the window sampler's draw, uniform in [0, n)). n >= 1. */
int64_t data_row_draw(const tide_batch_spec *spec, uint64_t n, int64_t step, int micro, int b);
/* Writes ids[0..n) to path as raw little-endian u16 (u32 when wide), or as a
 * .npy array when path ends in ".npy"; whole or not at all. */
tide_status data_write_ids(tide_ctx *ctx, const char *path, const int32_t *ids, int64_t n, bool wide);

#endif
