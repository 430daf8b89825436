/*
 * data.h - training tokens: a flat file of token ids, mapped read-only, cut
 * into the (inputs, targets) windows of each micro-batch; and a generator of
 * a synthetic corpus for runs without a data set.
 *
 * Files: raw little-endian uint16 (nanoGPT's train.bin, the default), raw
 * little-endian uint32, or a 1-D integer .npy array (NumPy format 1.0, 2.0 or
 * 3.0; dtype u1/i1/u2/i2/u4/i4/u8/i8, little-endian or single-byte; the
 * header's dtype is used whatever the caller asked for). Every id is checked
 * once at open (0 <= id < vocab), so a batch never reads a bad id.
 *
 * Windows (the nanoGPT convention): with W = n_tokens - T - 1 window starts,
 * row b of micro-batch m of step s reads the T+1 tokens at
 *     start = (((s * accum + m) * B + b) * T) mod W               (in order)
 *     start = uniform(splitmix64(seed, (s * accum + m) * B + b)) in [0, W)
 *                                                                  (shuffled)
 * inputs are its first T tokens, targets its last T (shifted by one). Both are
 * pure functions of (step, micro-batch, row): a resumed run needs only the
 * step to continue the same sequence of batches, and no generator state. The
 * arithmetic is exact (128-bit) for any step a run can reach.
 *
 * A tide_tokens is read-only after open and may be shared by threads.
 */
#ifndef TIDE_TRAIN_DATA_H
#define TIDE_TRAIN_DATA_H

#include "core/core.h"

#include <stdbool.h>
#include <stdint.h>

/* How the file's bytes hold the ids. A file whose name ends in ".npy", or
 * whose bytes start with NumPy's magic, is read as .npy whatever is given. */
typedef enum tide_token_dtype {
    TIDE_TOKENS_AUTO = 0, /* .npy as above, else raw u16 */
    TIDE_TOKENS_U16,      /* raw little-endian uint16 */
    TIDE_TOKENS_U32,      /* raw little-endian uint32 */
} tide_token_dtype;

typedef struct tide_tokens tide_tokens;

/* Opens path and checks it: its size (a whole number of ids, at least
 * seq + 2 of them: one window and one more start), the .npy header, and every
 * id against vocab. Returns TIDE_OK with *out set, or, with *out NULL and a
 * message naming the file and the problem:
 *   TIDE_E_NOT_FOUND  no such file;
 *   TIDE_E_IO         cannot open, stat or map it; not a regular file;
 *   TIDE_E_FORMAT     odd size ("odd size for u16"), too short for one window,
 *                     malformed .npy (magic, header, size);
 *   TIDE_E_UNSUPPORTED a valid .npy of another kind (float, big-endian, not 1-D);
 *   TIDE_E_RANGE      an id < 0 or >= vocab: the first one, its index and value;
 *   TIDE_E_INVALID    vocab or seq < 1, a NULL argument;
 *   TIDE_E_NOMEM.
 * ctx receives the errors of later calls on the handle too. */
tide_status tide_tokens_open(tide_ctx *ctx, const char *path, tide_token_dtype dt, int64_t vocab, int64_t seq,
                             tide_tokens **out);
void tide_tokens_free(tide_tokens *tk);
/* Number of ids in the file. */
int64_t tide_tokens_count(const tide_tokens *tk);
/* Id i (0 <= i < count), widened. */
int64_t tide_tokens_at(const tide_tokens *tk, int64_t i);
/* "u16", "u32", or the .npy's dtype ("<i4", "|u1", ...). */
const char *tide_tokens_dtype_name(const tide_tokens *tk);

/* The shape of the batches of a run. */
typedef struct tide_batch_spec {
    int batch;     /* B >= 1: rows of a micro-batch */
    int seq;       /* T >= 1: tokens of a row; n_tokens >= T + 2 */
    int accum;     /* micro-batches per step >= 1 */
    bool shuffle;  /* draw window starts from seed instead of walking the file */
    uint64_t seed;
} tide_batch_spec;

/* The start of row b's window in micro-batch micro of step (the formula
 * above); -1 when an argument is out of range (no error recorded). */
int64_t tide_tokens_window(const tide_tokens *tk, const tide_batch_spec *spec, int64_t step, int micro, int b);

/* Fills inputs and targets, each (B, T) int32 row-major, for micro-batch micro
 * (0 <= micro < accum) of step (>= 0). Returns TIDE_OK, or TIDE_E_INVALID
 * naming the bad argument (also when the file is shorter than T + 2 ids). */
tide_status tide_tokens_batch(const tide_tokens *tk, const tide_batch_spec *spec, int64_t step, int micro,
                              int32_t *inputs, int32_t *targets);

/* Writes a synthetic corpus of n_tokens ids in [0, vocab) to path, whole or
 * not at all (tide_file_begin/commit). The ids follow a Markov chain drawn
 * from seed: each id has 4 successors (pseudo-random ids), taken with
 * probabilities 1/2, 1/4, 1/8, 1/8, so a model can learn it down to an
 * entropy of 1.75 bits (1.21 nats) per token, less where successors collide.
 * The bytes depend only on (vocab, n_tokens, seed). A path ending in ".npy"
 * gets a .npy file ('<u2' when vocab <= 65536, else '<u4'), which
 * tide_tokens_open reads back with TIDE_TOKENS_AUTO; otherwise raw ids of
 * dtype dt (AUTO: u16 when vocab <= 65536, else u32). Returns TIDE_OK,
 * TIDE_E_INVALID (vocab < 1, n_tokens < 1, u16 for vocab > 65536) or
 * TIDE_E_IO naming the path and the cause. */
tide_status tide_tokens_write_synthetic(tide_ctx *ctx, const char *path, tide_token_dtype dt, int64_t vocab,
                                        int64_t n_tokens, uint64_t seed);

#endif
