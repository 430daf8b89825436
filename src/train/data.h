/*
 * data.h - training tokens (data.c): a flat file of token ids cut into the
 * windows of each micro-batch, and a synthetic corpus. The whole interface is
 * public: tide_tokens_* in include/tide.h, with the file formats and the
 * window formula.
 */
#ifndef TIDE_TRAIN_DATA_H
#define TIDE_TRAIN_DATA_H

#include "core/core.h"

#endif
