/*
 * quant.h - the reference arithmetic of the block-quantized weight types
 * (layouts in src/core/quant_blocks.h): rows of f32 to blocks and back, one
 * element at a time in plain C, the yardstick the CPU and CUDA kernels are
 * tested against.
 *
 * Dequantization computes each element as ggml's C reference does and in its
 * order (Q8_0: q * d; Q4_0: (q - 8) * d; Q4_K / Q5_K: (d * sc) * q - dmin * m;
 * Q6_K: (d * sc) * (q - 32), every product and difference rounded to f32 in
 * turn, never fused), which gives the same bits as the `gguf` Python package's
 * numpy dequantizers (tests/test_quant.c checks it against its outputs).
 *
 * Quantization is round-to-nearest per block as ggml's reference quantizers
 * (the ones llama.cpp's quantizer uses without an importance matrix) do:
 *   Q8_0  d = amax / 127, q = round(x / d) (halves away from zero);
 *   Q4_0  d = m / -8 with m the element of largest magnitude (the first such),
 *         q = min(15, floor(x / d + 8.5));
 *   Q4_K, Q5_K  per sub-block of 32 a weighted least-squares search of a scale
 *         and a min (weights sqrt(mean x^2) + |x|) over 21 (Q4_K) or 16 (Q5_K)
 *         trial step counts, the eight scales and mins then quantized to
 *         6 bits against the largest, the elements re-rounded to the stored
 *         scales;
 *   Q6_K  per sub-block of 16 a search over 19 trial scales weighted by x^2,
 *         the sixteen scales quantized to int8 against the largest, the
 *         elements re-rounded to the stored scales.
 * docs/quantization.md states each type's error bound. Inputs must be finite
 * (a NaN or infinity gives a defined but meaningless block, never undefined
 * behaviour); callers check.
 */
#ifndef TIDE_QUANT_H
#define TIDE_QUANT_H

#include "tide.h"

#include <stdbool.h>
#include <stdint.h>

/* dst[0..n) = the n elements of a row of type dt at src (F32, F16, BF16 or a
 * block type; n whole blocks). Returns 0, or -1 (nothing written) for another
 * dtype or an n that is not whole blocks. */
int tide_dequantize_row(tide_dtype dt, const void *src, float *dst, int64_t n);

/* Writes the n elements of src as a row of type dt at dst (tide_dtype_bytes(dt,
 * n) bytes; F32, F16, BF16 round to nearest even). Returns 0, or -1 (nothing
 * written) for another dtype or an n that is not whole blocks. */
int tide_quantize_row(tide_dtype dt, const float *src, void *dst, int64_t n);

/* Whether every one of the n floats is finite. */
bool tide_quant_all_finite(const float *x, int64_t n);

#endif
