/*
 * cuda_quant.h - the CUDA backend's kernels for block-quantized weights
 * (TIDE_Q8_0, TIDE_Q4_0, TIDE_Q4_K, TIDE_Q5_K, TIDE_Q6_K; the layouts of
 * src/core/quant_blocks.h). Same conventions as cuda_kernels.h: launchers
 * callable from C that enqueue on `s` and return the launch status; device
 * pointers; nothing allocated.
 *
 * Every kernel reads a weight's elements through one decoder, which gives
 * each element's f32 value in ggml's order of operations, every product and
 * difference rounded on its own (no contraction):
 *   Q8_0, Q4_0:  d * q                      (q the signed quant as f32)
 *   Q4_K, Q5_K:  (d * sc) * q - (dmin * m)  (sc, m the 6-bit scale and min)
 *   Q6_K:        (d * sc) * q               (sc the int8 scale, q - 32)
 * with d, dmin the blocks' f16 scales widened exactly. So EMBED and the f32
 * tiles give the dequantized weight bit for bit, and the GEMV multiplies
 * the same values.
 *
 * Rows: a weight (N, K) is N rows of K elements, K a multiple of the block
 * (32 or 256), row n at byte n * tide_dtype_bytes(dt, K).
 */
#ifndef TIDE_CUDA_QUANT_H
#define TIDE_CUDA_QUANT_H

#include "tide.h"

#include <cuda_runtime_api.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Rows n0 .. n0 + cnt - 1 of the quantized weight w (rows of K elements),
 * dequantized into dst (cnt, K) row-major: f32 (bf16 false) or each value
 * rounded to nearest even bf16 (bf16 true; the fast mode's GEMM tile).
 * cudaErrorInvalidValue for a dtype that is not a block type or K not a
 * whole number of blocks. */
cudaError_t tcu_qdequant(cudaStream_t s, const void *w, tide_dtype dt, int64_t K, int64_t n0, int64_t cnt,
                         void *dst, bool bf16);

/* MATMUL's GEMV for quantized weights: out (R, N) (rows ldo floats apart) =
 * x (R, K) f32 . w (N, K)^T. A warp per weight row streams the row's blocks
 * once per group of up to TCU_QGEMV_R rows of x, decodes them in registers
 * and accumulates in f32: lane l takes the 8-element units u = l, l + 32,
 * l + 64, ... of the row in that order, a fused multiply-add per element
 * (the unit's elements in order), then the warp adds its lanes' sums by a
 * butterfly. An output's bits depend on its x row, its weight row and K
 * alone: not on R, on the other rows, or on where the row sits in a tile.
 * out must not overlap x or w. N < 2^31 * 8. */
#define TCU_QGEMV_R 8
cudaError_t tcu_qgemv(cudaStream_t s, const float *x, const void *w, tide_dtype dt, int64_t R, int64_t K,
                      int64_t N, float *out, int64_t ldo);

/* EMBED from a quantized table (V, D) holding ids [vocab0, vocab0 + V):
 * out[r] = the dequantized row of tokens[r] (range-checked) where the table
 * holds it; other rows zeroed when `first`, else kept. */
cudaError_t tcu_qembed(cudaStream_t s, const void *table, tide_dtype dt, int64_t V, int64_t D, int64_t vocab0,
                       bool first, const int32_t *tokens, int64_t R, float *out);

#ifdef __cplusplus
}
#endif
#endif
