#!/usr/bin/env python3
"""Writes tests/fixtures/quant/: blocks of every quantized type with the `gguf`
package's (gguf.quants) dequantized values, and f32 rows with its quantized
bytes for the types it quantizes (Q8_0, Q4_0, and the scalar F16 / BF16).
tests/test_quant.c compares tide's reference arithmetic (src/core/quant.c)
against them.

Every file is one case: a 16-byte header "TQF1", u32 kind (0: dequantize,
1: quantize), u32 tide dtype (include/tide.h: F16 1, BF16 2, Q8_0 4, Q4_0 5,
Q4_K 6, Q5_K 7, Q6_K 8), u32 n (elements), then
  kind 0: the blocks' bytes, then n little-endian f32 (gguf's dequantization);
  kind 1: n little-endian f32 inputs, then gguf's bytes of them.
Deterministic: the same numpy and gguf versions write the same bytes.

    pip install gguf numpy
    python3 scripts/make_quant_fixtures.py
"""
import os
import struct
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "quant")

TIDE = {T.F16: 1, T.BF16: 2, T.Q8_0: 4, T.Q4_0: 5, T.Q4_K: 6, T.Q5_K: 7, T.Q6_K: 8}
# where each block's f16 scales lie (byte offsets), and the block's size
SCALES = {T.Q8_0: ([0], 34, 32), T.Q4_0: ([0], 18, 32), T.Q4_K: ([0, 2], 144, 256),
          T.Q5_K: ([0, 2], 176, 256), T.Q6_K: ([208], 210, 256)}
# f16 scales that stress the arithmetic: largest finite, smallest and largest
# subnormal, smallest normal, one, zero, negative ones
EXTREME_F16 = [0x7BFF, 0xFBFF, 0x0001, 0x03FF, 0x8001, 0x0400, 0x3C00, 0x0000, 0x8000, 0xBC00]


def write(name, kind, qtype, n, first, second):
    path = os.path.join(OUT, name)
    with open(path, "wb") as f:
        f.write(b"TQF1" + struct.pack("<III", kind, TIDE[qtype], n))
        f.write(first.tobytes())
        f.write(second.tobytes())
    return os.path.getsize(path)


def random_f16(rng, count):
    """Random finite f16 bit patterns (any sign, exponent 0..30)."""
    out = []
    while len(out) < count:
        h = int(rng.integers(0, 1 << 16))
        if (h >> 10) & 31 != 31:
            out.append(h)
    return out


def dequant_case(rng, qtype, n_blocks):
    offs, size, qk = SCALES[qtype]
    blocks = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    scales = random_f16(rng, n_blocks * len(offs))
    for b in range(n_blocks):
        for k, off in enumerate(offs):
            h = scales[b * len(offs) + k]
            if b < min(len(EXTREME_F16), n_blocks - 4):  # the first blocks take the extreme scales
                h = EXTREME_F16[(b + k * 3) % len(EXTREME_F16)]
            blocks[b, off:off + 2] = np.frombuffer(struct.pack("<H", h), dtype=np.uint8)
    blocks[n_blocks - 1, :] = 0  # an all-zero block
    blocks[n_blocks - 2, :] = 0xFF  # every bit set but the scales (finite)
    for off in offs:
        blocks[n_blocks - 2, off:off + 2] = np.frombuffer(struct.pack("<H", 0x3555), dtype=np.uint8)
    out = quants.dequantize(blocks.reshape(-1), qtype).astype(np.float32)
    assert out.shape == (n_blocks * qk,)
    return write(f"deq_{qtype.name.lower()}.bin", 0, qtype, n_blocks * qk, blocks.reshape(-1), out)


def quant_inputs(rng, qk, n_blocks):
    """Rows that reach every branch: several magnitudes (down to scales that
    are f16 subnormals, up to near the f16 maximum), a zero block, exact ties
    of the rounding, one large element among small ones, negative and
    positive extremes, repeated magnitudes of both signs."""
    x = np.zeros((n_blocks, qk), dtype=np.float32)
    mags = [1.0, 1e-3, 3e-6, 2e-7, 40.0, 7e3, 4e5, 8e6]
    for b in range(n_blocks):
        kind = b % 8
        m = mags[(b // 8) % len(mags)]
        if kind == 0:
            x[b] = rng.normal(0, m, qk)
        elif kind == 1:
            x[b] = 0.0
        elif kind == 2:  # ties: multiples of half a step of a power-of-two scale
            x[b] = (rng.integers(-254, 255, qk) * 0.5).astype(np.float32) * np.float32(m)
            x[b, 0] = 127 * m
        elif kind == 3:
            x[b] = rng.normal(0, m * 1e-3, qk)
            x[b, rng.integers(0, qk)] = -m
        elif kind == 4:
            x[b] = rng.uniform(-m, m, qk)
        elif kind == 5:  # equal magnitudes, both signs: the first one decides Q4_0's sign
            x[b] = np.where(rng.integers(0, 2, qk) == 1, m, -m)
        elif kind == 6:
            x[b] = rng.uniform(0, m, qk)  # one-signed
        else:
            x[b] = rng.standard_t(2, qk) * m  # heavy tails
    return x.reshape(-1)


def quant_case(rng, qtype, n_blocks):
    qk = 32
    x = quant_inputs(rng, qk, n_blocks)
    q = quants.quantize(x.reshape(-1, qk * 4), qtype)
    return write(f"q_{qtype.name.lower()}.bin", 1, qtype, x.size, x, q.reshape(-1).view(np.uint8))


def scalar_case(rng, qtype):
    x = np.concatenate([
        rng.normal(0, 1, 200).astype(np.float32),
        rng.normal(0, 1e-6, 40).astype(np.float32),
        rng.normal(0, 3e4, 40).astype(np.float32),
        np.array([65504, 65519.99, 65520, -65536, 6.1e-5, 5.96e-8, 2.98e-8, 2.99e-8, 1e-10, 0.0, -0.0,
                  1.00048828125, 1.000732421875, 3.4e38, -3.4e38, 1.0 + 2**-8, 1.0 + 3 * 2**-9], dtype=np.float32),
    ]).astype(np.float32)
    if qtype == T.F16:
        q = x.astype(np.float16).view(np.uint8)
    else:
        q = quants.quantize(x, qtype).view(np.uint8)
    return write(f"q_{qtype.name.lower()}.bin", 1, qtype, x.size, x, q.reshape(-1))


def main():
    os.makedirs(OUT, exist_ok=True)
    rng = np.random.default_rng(20260601)
    total = 0
    with np.errstate(over="ignore"):
        for qtype, n in [(T.Q8_0, 48), (T.Q4_0, 48), (T.Q4_K, 14), (T.Q5_K, 14), (T.Q6_K, 14)]:
            total += dequant_case(rng, qtype, n)
        for qtype in (T.Q8_0, T.Q4_0):
            total += quant_case(rng, qtype, 64)
        for qtype in (T.F16, T.BF16):
            total += scalar_case(rng, qtype)
    from importlib.metadata import version
    print(f"wrote {OUT}: {total} bytes (gguf {version('gguf')}, numpy {np.__version__})",
          file=sys.stderr)


if __name__ == "__main__":
    main()
