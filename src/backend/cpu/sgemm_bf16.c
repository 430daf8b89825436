/*
 * sgemm_bf16.c - the GEMM of a bf16 training step (tk_gemm_bf16 of
 * kernels_int.h): every product of a step built with --precision bf16
 * (MATMUL's forms, MATMUL_GRADW, the fused cross-entropy's logits and
 * gradients) on operands rounded to bf16, with f32 sums.
 *
 * An operand is f32 (rounded to bf16, to nearest even, as it is packed),
 * bf16 (taken as stored) or f16 (widened, then rounded). The driver is
 * sgemm.c's packed layout (gemm_drive.c), with k taken in pairs: a panel
 * element is the 32-bit pair (element k in the low half, k + 1 in the high
 * half) that VDPBF16PS multiplies, zeros past the edges.
 *
 * The arithmetic of one output element is fixed by its row of op(A), its
 * column of op(B), K and beta alone:
 *     for each block b of TK_SGEMM_KC consecutive k from k = 0 (even), in
 *     order:
 *         t = 0;  for each pair (k, k + 1) of b in order:
 *                     t = t + a_{k+1} b_{k+1};  t = t + a_k b_k
 *         s = b is the first ? t : s + t
 *     c = beta == 0 ? s : c + s
 * each step one rounding (the products of two bf16 are exact in f32), the
 * order of VDPBF16PS (the odd element first). Every code path computes
 * exactly that: AVX512_BF16 with VDPBF16PS, an AVX-512F CPU without it by
 * widening the pairs in registers (a shift, a mask) into two FMAs, AVX2 and
 * the portable code with fmaf. The one difference: VDPBF16PS treats
 * subnormal inputs and results as zero (DAZ, FTZ), which the others do not
 * (an element below 1.2e-38 in magnitude; none in a trained model's
 * products). As in sgemm.c, nothing else changes the bits: not the blocks
 * of rows gemm_drive.c hands out, the thread count, nor the buffer sizes.
 *
 * Fastest of all, where the CPU has AMX-BF16 and Linux lends its tiles:
 * TDPBF16PS, whose sums within an instruction are the hardware's own (see
 * the AMX section below): on such a CPU the bits are those of the AMX
 * order, the same for every tile grid and thread count, but not the FMA
 * chain's.
 *
 * The path is chosen at run time from cpuid (cpu_features.c), never from a
 * BLAS's guess of the CPU.
 */
#include "backend/cpu/kernels_int.h"

#include <math.h>
#include <omp.h>
#include <string.h>

#define BG_KC TK_SGEMM_KC
_Static_assert(BG_KC % 2 == 0, "blocks of K are whole pairs");
#define BG_MR_MAX TK_GEMM_MR_MAX
#define BG_NR_MAX TK_GEMM_NR_MAX

typedef union { float f; uint32_t u; } bg_bits;

static int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

static inline uint16_t bg_round(float f) {
    bg_bits b = {.f = f};
    if ((b.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((b.u >> 16) | 0x40u); /* NaN stays NaN */
    return (uint16_t)((b.u + 0x7fffu + ((b.u >> 16) & 1u)) >> 16);
}

static inline float bg_lo(uint32_t p) {
    bg_bits b = {.u = p << 16};
    return b.f;
}

static inline float bg_hi(uint32_t p) {
    bg_bits b = {.u = p & 0xffff0000u};
    return b.f;
}

/* An operand: element (r, c) of op(X) at X[r * ld + c], or X[c * ld + r]
 * when t. */
typedef struct {
    const uint8_t *p;
    tide_dtype dt;
    int64_t ld;
    bool t;
} bg_op;

#ifdef TK_X86
/* 16 floats rounded as bg_round rounds them (NaN quieted, sign kept). */
TK_AVX512 static void bg_round_avx512(const float *x, int64_t n, uint16_t *d) {
    const __m512i bias = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1), quiet = _mm512_set1_epi32(0x40);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        __m512 v = _mm512_maskz_loadu_ps(m, x + i);
        __m512i u = _mm512_castps_si512(v), hi = _mm512_srli_epi32(u, 16);
        __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(bias, _mm512_and_si512(hi, one))), 16);
        r = _mm512_mask_or_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), hi, quiet);
        _mm256_mask_storeu_epi16(d + i, m, _mm512_cvtepi32_epi16(r));
    }
}
#endif

/* n consecutive elements of dt from src as bf16 into dst. */
static void bg_row(const uint8_t *src, tide_dtype dt, int64_t n, uint16_t *dst) {
    if (dt == TIDE_BF16) {
        memcpy(dst, src, (size_t)n * 2);
    } else if (dt == TIDE_F32) {
        const float *s = (const float *)(const void *)src;
#ifdef TK_X86
        if (tk_have_avx512()) {
            bg_round_avx512(s, n, dst);
            return;
        }
#endif
        for (int64_t i = 0; i < n; i++) dst[i] = bg_round(s[i]);
    } else {
        const uint16_t *s = (const uint16_t *)(const void *)src;
        for (int64_t i = 0; i < n; i++) dst[i] = bg_round(tide_f16_to_f32(s[i]));
    }
}

static const uint8_t *bg_at(const bg_op *o, int64_t i) { return o->p + (size_t)i * tide_dtype_size(o->dt); }

#ifdef TK_X86
/* One panel of bg_pack's along-k form with AVX-512: n (<= mr) rows of
 * op(X), each kc elements along k from bg_at(o, (i0 + r) * o->ld + p0),
 * rounded into pairs, then transposed into dp[p * mr + r] by tk_pack_t16
 * (rows n .. mr - 1 zeros). The same words as the scalar loop. */
TK_AVX512 static void bg_panel_t16(const bg_op *o, int64_t i0, int64_t n, int64_t p0, int64_t kc, int mr,
                                   uint32_t *dp) {
    enum { LD = BG_KC / 2 + 16 }; /* pairs a row: 64-byte rows */
    _Alignas(64) uint32_t rows[BG_NR_MAX][LD];
    const int64_t kc2 = (kc + 1) / 2;
    for (int64_t r = 0; r < n; r++) {
        uint16_t *row = (uint16_t *)(void *)rows[r];
        bg_row(bg_at(o, (i0 + r) * o->ld + p0), o->dt, kc, row);
        if (kc & 1) row[kc] = 0;
    }
    tk_pack_t16((const float *)(const void *)rows, LD, n, kc2, 1.0f, mr, (float *)(void *)dp);
}
#endif

/* Rows [i0, i0 + mc) x k in [p0, p0 + kc) of op(X) into panels of mr rows,
 * or k in [p0, p0 + kc) x columns [i0, i0 + mc) into panels of mr columns
 * (the B side: op(X) is then indexed (k, column)); panel q holds pair p of
 * row (column) r at d[q * kc2p * mr + p * mr + r]; rows past mc, the high
 * half of an odd kc's last pair and the pairs from kc2 = ceil(kc / 2) to
 * kc2p are zeros. `rows_k`: op(X)'s first index is the row (A), else k (B). */
static void bg_pack(const bg_op *o, bool rows_k, int64_t i0, int64_t mc, int64_t p0, int64_t kc, int mr,
                    int64_t kc2p, uint32_t *d) {
    const int64_t kc2 = (kc + 1) / 2;
    /* does one row (column) run along k in memory? */
    const bool along_k = rows_k ? !o->t : o->t;
    for (int64_t ib = 0; ib < mc; ib += mr) {
        uint32_t *dp = d + ib * kc2p;
        if (kc2p > kc2) memset(dp + kc2 * mr, 0, (size_t)((kc2p - kc2) * mr) * sizeof(uint32_t));
    }
    if (along_k) {
#ifdef TK_X86
        if (tk_have_avx512() && kc <= BG_KC && mr <= BG_NR_MAX) {
            for (int64_t ib = 0; ib < mc; ib += mr)
                bg_panel_t16(o, i0 + ib, TIDE_MIN((int64_t)mr, mc - ib), p0, kc, mr, d + ib * kc2p);
            return;
        }
#endif
        uint16_t lo[BG_KC + 2];
        for (int64_t ib = 0; ib < mc; ib += mr) {
            const int64_t n = TIDE_MIN((int64_t)mr, mc - ib);
            uint32_t *dp = d + ib * kc2p;
            for (int64_t r = 0; r < mr; r++) {
                if (r >= n) {
                    for (int64_t p = 0; p < kc2; p++) dp[p * mr + r] = 0;
                    continue;
                }
                bg_row(bg_at(o, (i0 + ib + r) * o->ld + p0), o->dt, kc, lo);
                if (kc & 1) lo[kc] = 0;
                for (int64_t p = 0; p < kc2; p++) dp[p * mr + r] = (uint32_t)lo[2 * p] | (uint32_t)lo[2 * p + 1] << 16;
            }
        }
        return;
    }
    /* rows of op(X) along the panels' width: two of them rounded whole,
     * interleaved into every panel */
    enum { W = 2048 };
    uint16_t lo[W], hi[W];
    const int64_t wm = W / mr * mr; /* whole panels a chunk */
    for (int64_t c0 = 0; c0 < mc; c0 += wm) {
        const int64_t w = TIDE_MIN(wm, mc - c0);
        for (int64_t p = 0; p < kc2; p++) {
            const int64_t k = p0 + 2 * p;
            bg_row(bg_at(o, k * o->ld + i0 + c0), o->dt, w, lo);
            if (2 * p + 1 < kc) bg_row(bg_at(o, (k + 1) * o->ld + i0 + c0), o->dt, w, hi);
            else memset(hi, 0, (size_t)w * 2);
            for (int64_t ib = c0; ib < c0 + w; ib += mr) {
                const int64_t n = TIDE_MIN((int64_t)mr, mc - ib);
                uint32_t *q = d + ib * kc2p + p * mr;
                const uint16_t *l = lo + (ib - c0), *h = hi + (ib - c0);
                int64_t r = 0;
                for (; r < n; r++) q[r] = (uint32_t)l[r] | (uint32_t)h[r] << 16;
                for (; r < mr; r++) q[r] = 0;
            }
        }
    }
}

/* ------------------------------------------------------------- register tiles */

/* A path: its register tile sums t of the header over kc2 pairs of the
 * packed panels a (kc2 x MR) and b (kc2 x NR) into c (MR x NR, stride ldc):
 * c = t, or with add c = c + t. */
typedef struct {
    const char *name;
    int mr, nr;
    tk_gemm_tile_fn tile;
} bg_kernel;

#define BGP_MR 4
#define BGP_NR 16
#define BG_GENERIC_BODY                                                                                   \
    float acc[BGP_MR][BGP_NR];                                                                             \
    for (int r = 0; r < BGP_MR; r++)                                                                       \
        for (int j = 0; j < BGP_NR; j++) acc[r][j] = 0.0f;                                                 \
    for (int64_t p = 0; p < kc2; p++) {                                                                    \
        float bo[BGP_NR], be[BGP_NR];                                                                      \
        for (int j = 0; j < BGP_NR; j++) bo[j] = bg_hi(b[j]), be[j] = bg_lo(b[j]);                         \
        for (int r = 0; r < BGP_MR; r++) {                                                                 \
            const float ao = bg_hi(a[r]), ae = bg_lo(a[r]);                                                \
            for (int j = 0; j < BGP_NR; j++) acc[r][j] = fmaf(ae, be[j], fmaf(ao, bo[j], acc[r][j]));      \
        }                                                                                                  \
        a += BGP_MR;                                                                                       \
        b += BGP_NR;                                                                                       \
    }                                                                                                      \
    for (int r = 0; r < BGP_MR; r++)                                                                       \
        for (int j = 0; j < BGP_NR; j++) c[r * ldc + j] = add ? c[r * ldc + j] + acc[r][j] : acc[r][j];

/* The portable tile: fmaf, one rounding a step (a library call where the
 * CPU has no FMA). */
static void tile_portable(int64_t kc2, const void *a_, const void *b_, float *c, int64_t ldc, bool add) {
    const uint32_t *a = a_, *b = b_;
    BG_GENERIC_BODY
}

static const bg_kernel bg_portable = {"portable (fmaf)", BGP_MR, BGP_NR, tile_portable};

#ifdef TK_X86
#define BG_INLINE inline __attribute__((always_inline))
#define TK_AVX512BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma")))

/* The same arithmetic compiled for FMA (the compiler vectorises it). */
TK_AVX2 static void tile_avx2(int64_t kc2, const void *a_, const void *b_, float *c, int64_t ldc, bool add) {
    const uint32_t *a = a_, *b = b_;
    BG_GENERIC_BODY
}

/* MR rows x 16 NV columns with VDPBF16PS. */
TK_AVX512BF16 static BG_INLINE void tile_dp(int64_t kc2, const uint32_t *a, const uint32_t *b, float *c,
                                            int64_t ldc, bool add, const int MR, const int NV) {
    __m512 acc[BG_MR_MAX][2];
#pragma GCC unroll 12
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 2
        for (int h = 0; h < NV; h++) acc[r][h] = _mm512_setzero_ps();
    for (int64_t p = 0; p < kc2; p++) {
        __m512i bv[2];
#pragma GCC unroll 2
        for (int h = 0; h < NV; h++) bv[h] = _mm512_loadu_si512((const void *)(b + 16 * h));
#pragma GCC unroll 12
        for (int r = 0; r < MR; r++) {
            __m512i av = _mm512_set1_epi32((int)a[r]);
#pragma GCC unroll 2
            for (int h = 0; h < NV; h++) acc[r][h] = _mm512_dpbf16_ps(acc[r][h], (__m512bh)av, (__m512bh)bv[h]);
        }
        a += MR;
        b += 16 * NV;
    }
#pragma GCC unroll 12
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 2
        for (int h = 0; h < NV; h++) {
            float *o = c + r * ldc + 16 * h;
            _mm512_storeu_ps(o, add ? _mm512_add_ps(_mm512_loadu_ps(o), acc[r][h]) : acc[r][h]);
        }
}

/* The same pairs widened in registers (an AVX-512F CPU without
 * AVX512_BF16): the high half masked, the low half shifted up, then two
 * FMAs in VDPBF16PS's order. */
TK_AVX512 static BG_INLINE void tile_wide(int64_t kc2, const uint32_t *a, const uint32_t *b, float *c, int64_t ldc,
                                          bool add, const int MR, const int NV) {
    const __m512i himask = _mm512_set1_epi32((int)0xffff0000u);
    __m512 acc[BG_MR_MAX][2];
#pragma GCC unroll 12
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 2
        for (int h = 0; h < NV; h++) acc[r][h] = _mm512_setzero_ps();
    for (int64_t p = 0; p < kc2; p++) {
        __m512 bo[2], be[2];
#pragma GCC unroll 2
        for (int h = 0; h < NV; h++) {
            __m512i w = _mm512_loadu_si512((const void *)(b + 16 * h));
            bo[h] = _mm512_castsi512_ps(_mm512_and_si512(w, himask));
            be[h] = _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
        }
#pragma GCC unroll 12
        for (int r = 0; r < MR; r++) {
            __m512 ao = _mm512_set1_ps(bg_hi(a[r])), ae = _mm512_set1_ps(bg_lo(a[r]));
#pragma GCC unroll 2
            for (int h = 0; h < NV; h++) acc[r][h] = _mm512_fmadd_ps(ae, be[h], _mm512_fmadd_ps(ao, bo[h], acc[r][h]));
        }
        a += MR;
        b += 16 * NV;
    }
#pragma GCC unroll 12
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 2
        for (int h = 0; h < NV; h++) {
            float *o = c + r * ldc + 16 * h;
            _mm512_storeu_ps(o, add ? _mm512_add_ps(_mm512_loadu_ps(o), acc[r][h]) : acc[r][h]);
        }
}

/* 12 rows x 32 columns: 24 accumulators (the widened form: 30 of the 32
 * registers). */
#define BG5_MR 12
TK_AVX512BF16 static void tile_bf16(int64_t kc2, const void *a, const void *b, float *c, int64_t ldc, bool add) {
    tile_dp(kc2, a, b, c, ldc, add, BG5_MR, 2);
}

TK_AVX512 static void tile_avx512(int64_t kc2, const void *a, const void *b, float *c, int64_t ldc, bool add) {
    tile_wide(kc2, a, b, c, ldc, add, BG5_MR, 2);
}

_Static_assert(BG5_MR <= BG_MR_MAX && BGP_MR <= BG_MR_MAX && BGP_NR <= BG_NR_MAX, "the stack buffers hold every tile");
static const bg_kernel bg_bf16 = {"avx512_bf16 (vdpbf16ps)", BG5_MR, 32, tile_bf16};
static const bg_kernel bg_avx512 = {"avx512 (bf16 pairs widened, fma)", BG5_MR, 32, tile_avx512};
static const bg_kernel bg_avx2 = {"avx2 (bf16 pairs widened, fma)", BGP_MR, BGP_NR, tile_avx2};
#endif


#ifdef TK_X86
/* ------------------------------------------------------------- AMX */

/*
 * AMX-BF16 (TDPBF16PS): each instruction adds to a 16 x 16 f32 tile the
 * products of a 16 x 32 bf16 tile of A and a 32 x 16 one of B (16 pairs of
 * k). Its sums within an instruction are the hardware's own: the same bits
 * for the same operands, but not the FMA chain of the other paths. The rest
 * of the order is fixed here: an element's tile sum runs over all of K in
 * steps of 32 consecutive k from k = 0 (the last padded with zero pairs),
 * starting from 0, or with beta from C's element (not c + s as above). So
 * again an element's bits depend on its row of op(A), its column of op(B),
 * K and beta alone: not on the tile grid, the threads, its place in a tile,
 * nor the cache blocks (multiples of 32 k).
 *
 * Linux lends the tile registers to a process that asks (arch_prctl
 * ARCH_REQ_XCOMP_PERM, once for all its threads); refused, the products run
 * on VDPBF16PS. Each thread of a call configures the tiles and releases
 * them at its end. The path blocks the whole product itself (the other
 * paths go through gemm_drive.c), the same bits whatever the blocking.
 */
#include <stdatomic.h>
#include <sys/syscall.h>
#include <unistd.h>

#define TK_AMX __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx2,fma")))
#define BGA_STEP 16  /* pairs of k per TDPBF16PS */
#define BGA_TILE 256 /* 32-bit pairs a tile: 16 rows of 16 */
#define BGA_GROUP 32 /* rows of op(A) (columns of op(B)) a packed group: two tiles */
#define BGA_KC 512   /* k a cache block (a multiple of 2 * BGA_STEP) */
#define BGA_NC 256   /* columns of op(B) a work item */
_Static_assert(BGA_KC % (2 * BGA_STEP) == 0, "cache blocks of whole steps");
_Static_assert(BGA_NC % BGA_GROUP == 0, "panels of whole groups");
/* pairs of one group over a whole cache block: 32 KiB, the stack's share */
#define BGA_GROUP_PAIRS (BGA_KC / 32 * 2 * BGA_TILE)

static atomic_int bga_perm; /* 0: not asked yet, 1 granted, -1 refused */

static bool bga_ok(void) {
    if (!tk_have_avx512() || !tk_cpu_has(TK_CPU_AMXBF16)) return false;
    int v = atomic_load_explicit(&bga_perm, memory_order_acquire);
    if (!v) {
        /* ARCH_REQ_XCOMP_PERM (0x1023) for XFEATURE_XTILEDATA (18) */
        v = syscall(SYS_arch_prctl, 0x1023, 18) == 0 ? 1 : -1;
        atomic_store_explicit(&bga_perm, v, memory_order_release);
    }
    return v > 0;
}

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} bga_config;

/* Palette 1, tiles 0-7 of 16 rows of 64 bytes. A constant in memory: the
 * compiler does not see LDTILECFG read its operand, and would drop stores
 * to a local one. */
static const _Alignas(64) bga_config bga_cfg = {
    .palette = 1,
    .colsb = {64, 64, 64, 64, 64, 64, 64, 64},
    .rows = {16, 16, 16, 16, 16, 16, 16, 16},
};

TK_AMX static void bga_config_tiles(void) { _tile_loadconfig(&bga_cfg); }

TK_AMX static void bga_release(void) { _tile_release(); }

/*
 * The packed layout. A step is 16 pairs of k (32 consecutive k); a group is
 * 32 rows of op(A), or 32 columns of op(B), as two tiles of 16. A packed
 * block of g groups over s steps is g * s * 2 tiles, group-major, then step,
 * then the half (rows or columns 0-15, 16-31), each tile 1 KiB contiguous:
 *   A's tile: row r's pair q at r * 16 + q (TDPBF16PS's first source);
 *   B's tile: pair q of column c at q * 16 + c (its second source, the VNNI
 *   pair layout).
 * So the two tiles of a step are 2 KiB in a row, loaded with a 64-byte
 * stride. Rows (columns) past the operand's edge and k past K are zeros.
 */

/* 16 elements of dt from src (n of them, the rest zeros) rounded to bf16
 * as bg_round rounds them, each in the low half of a 32-bit lane. */
TK_AMX static inline __m512i bga_round16(const uint8_t *src, tide_dtype dt, int64_t n) {
    const __mmask16 m = n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1);
    if (dt == TIDE_BF16) return _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, src));
    __m512 v;
    if (dt == TIDE_F32) {
        v = _mm512_maskz_loadu_ps(m, src);
    } else {
        _Alignas(64) float w[16] = {0};
        const uint16_t *h = (const uint16_t *)(const void *)src;
        for (int64_t i = 0; i < n && i < 16; i++) w[i] = tide_f16_to_f32(h[i]);
        v = _mm512_load_ps(w);
    }
    const __m512i u = _mm512_castps_si512(v), hi = _mm512_srli_epi32(u, 16);
    __m512i r = _mm512_srli_epi32(
        _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), _mm512_and_si512(hi, _mm512_set1_epi32(1)))),
        16);
    return _mm512_mask_or_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), hi, _mm512_set1_epi32(0x40));
}

/* The 16 x 16 32-bit elements of v transposed in place. */
TK_AMX static inline void bga_transpose(__m512i v[16]) {
    __m512i t[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(v[2 * i], v[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(v[2 * i], v[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) {
        v[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        v[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        v[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        v[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    /* v[4i + j]'s 128-bit lane L: column 4L + j of rows 4i .. 4i + 3 */
    for (int j = 0; j < 4; j++) {
        __m512i a = _mm512_shuffle_i32x4(v[j], v[4 + j], 0x88), b = _mm512_shuffle_i32x4(v[j], v[4 + j], 0xdd);
        __m512i c = _mm512_shuffle_i32x4(v[8 + j], v[12 + j], 0x88), d = _mm512_shuffle_i32x4(v[8 + j], v[12 + j], 0xdd);
        t[j] = _mm512_shuffle_i32x4(a, c, 0x88);
        t[8 + j] = _mm512_shuffle_i32x4(a, c, 0xdd);
        t[4 + j] = _mm512_shuffle_i32x4(b, d, 0x88);
        t[12 + j] = _mm512_shuffle_i32x4(b, d, 0xdd);
    }
    for (int i = 0; i < 16; i++) v[i] = t[i];
}

#define TK_AMXCVT \
    __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma")))

/* bga_pack_tile's lines along k for f32 lines with a whole step of k left
 * (32), on a CPU with AVX512_BF16: VCVTNE2PS2BF16 rounds 32 floats at once
 * to nearest even as bg_round does, except that it flushes a subnormal to
 * zero and may treat a NaN its own way; a vector holding either goes
 * bg_round's way, so the bits are the same. */
TK_AMXCVT static void bga_pack_tile_cvt(const float *p, int64_t ld, bool b, int64_t nl, uint32_t *d) {
    __m512i v[16];
    for (int64_t l = 0; l < 16; l++) {
        if (l >= nl) {
            v[l] = _mm512_setzero_si512();
            continue;
        }
        const float *row = p + l * ld;
        const __m512 lo = _mm512_loadu_ps(row), hi = _mm512_loadu_ps(row + 16);
        /* 0xa1: quiet NaN, signalling NaN, subnormal */
        if (_mm512_fpclass_ps_mask(lo, 0xa1) | _mm512_fpclass_ps_mask(hi, 0xa1)) {
            __m512i a = bga_round16((const uint8_t *)row, TIDE_F32, 16);
            __m512i c = bga_round16((const uint8_t *)(row + 16), TIDE_F32, 16);
            v[l] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi32_epi16(a)), _mm512_cvtepi32_epi16(c), 1);
        } else {
            v[l] = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
        }
    }
    if (b) bga_transpose(v);
    for (int i = 0; i < 16; i++) _mm512_store_si512((void *)(d + i * 16), v[i]);
}

/* One tile of op(X): lines [l0, l0 + nl) (rows of op(A), or columns of
 * op(B) with `b`) and pairs of k from k0 (kn of the k left, the rest
 * zeros), into d in A's layout or, with `b`, in B's. */
TK_AMX static void bga_pack_tile(const bg_op *o, bool b, int64_t l0, int64_t nl, int64_t k0, int64_t kn, bool cvt,
                                 uint32_t *d) {
    __m512i v[16];
    const size_t es = o->dt == TIDE_F32 ? 4 : 2;
#define BGA_AT(i) (o->p + (size_t)(i) * es)
    /* does a line run along k in memory? (op(A) plain, op(B) transposed) */
    const bool along = b ? o->t : !o->t;
    if (along && o->dt == TIDE_F32 && kn >= 32 && cvt) {
        bga_pack_tile_cvt((const float *)(const void *)BGA_AT(l0 * o->ld + k0), o->ld, b, nl, d);
        return;
    }
    if (along) {
        /* v[line]: its 16 pairs, as they lie */
        for (int64_t l = 0; l < 16; l++) {
            if (l >= nl) {
                v[l] = _mm512_setzero_si512();
                continue;
            }
            const uint8_t *src = BGA_AT((l0 + l) * o->ld + k0);
            __m512i lo = bga_round16(src, o->dt, TIDE_MAX((int64_t)0, TIDE_MIN(kn, (int64_t)16)));
            __m512i hi = kn > 16 ? bga_round16(BGA_AT((l0 + l) * o->ld + k0 + 16), o->dt, TIDE_MIN(kn - 16, (int64_t)16))
                                 : _mm512_setzero_si512();
            v[l] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi32_epi16(lo)), _mm512_cvtepi32_epi16(hi), 1);
        }
        if (b) bga_transpose(v);
    } else {
        /* v[pair q]: elements k0 + 2q (low halves) and k0 + 2q + 1 of the
         * 16 lines, two runs of memory interleaved */
        for (int64_t q = 0; q < 16; q++) {
            if (2 * q >= kn) {
                v[q] = _mm512_setzero_si512();
                continue;
            }
            const int64_t k = k0 + 2 * q;
            __m512i lo = bga_round16(BGA_AT(k * o->ld + l0), o->dt, nl);
            __m512i hi = 2 * q + 1 < kn ? bga_round16(BGA_AT((k + 1) * o->ld + l0), o->dt, nl) : _mm512_setzero_si512();
            v[q] = _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16));
        }
        if (!b) bga_transpose(v);
    }
    for (int i = 0; i < 16; i++) _mm512_store_si512((void *)(d + i * 16), v[i]);
#undef BGA_AT
}

/* Lines [l0, l0 + nl) of op(X) over k in [p0, p0 + kc), groups [g0, g1) of
 * them (g counted from l0), packed into d (whose group 0 is l0's) in steps
 * steps (kc2p = 16 * steps pairs). */
TK_AMX static void bga_pack(const bg_op *o, bool b, int64_t l0, int64_t nl, int64_t g0, int64_t g1, int64_t p0,
                            int64_t kc, int64_t steps, uint32_t *d) {
    const bool cvt = tk_cpu_has(TK_CPU_AVX512BF16);
    for (int64_t g = g0; g < g1; g++)
        for (int64_t s = 0; s < steps; s++)
            for (int64_t h = 0; h < 2; h++) {
                const int64_t l = g * BGA_GROUP + h * 16;
                uint32_t *t = d + ((g * steps + s) * 2 + h) * BGA_TILE;
                if (l >= nl) {
                    memset(t, 0, BGA_TILE * sizeof(uint32_t));
                    continue;
                }
                bga_pack_tile(o, b, l0 + l, TIDE_MIN((int64_t)16, nl - l), p0 + 32 * s, kc - 32 * s, cvt, t);
            }
}

/* Where a group of A's tiles lies: step s's first tile at a + s * step
 * bytes, its second (rows 16-31) half bytes further on, rows stride bytes
 * apart. A packed group, or rows of a bf16 op(A) as they lie (a row's 32
 * consecutive k are a tile row: whole steps only). */
typedef struct {
    const uint8_t *a;
    int64_t step, half, stride;
} bga_arows;

static bga_arows bga_packed(const uint32_t *a) {
    return (bga_arows){(const uint8_t *)a, 2 * BGA_TILE * 4, BGA_TILE * 4, 64};
}

/* A block of C (stride ldc floats) of 16 or 32 rows (r2) by 16 or 32
 * columns (c2): its tiles loaded from c (or zero), `steps` steps of a
 * group of A and a packed one of B, stored back. */
TK_AMX static inline __attribute__((always_inline)) void bga_block(int64_t steps, bga_arows a, const uint32_t *b,
                                                                   float *c, int64_t ldc, bool load, const bool r2,
                                                                   const bool c2) {
    const int64_t sc = ldc * 4;
    if (load) {
        _tile_loadd(0, c, sc);
        if (c2) _tile_loadd(1, c + 16, sc);
        if (r2) _tile_loadd(2, c + 16 * ldc, sc);
        if (r2 && c2) _tile_loadd(3, c + 16 * ldc + 16, sc);
    } else {
        _tile_zero(0);
        if (c2) _tile_zero(1);
        if (r2) _tile_zero(2);
        if (r2 && c2) _tile_zero(3);
    }
    for (int64_t s = 0; s < steps; s++) {
        const uint8_t *as = a.a + s * a.step;
        const uint32_t *bs = b + s * 2 * BGA_TILE;
        _tile_loadd(4, as, a.stride);
        _tile_loadd(6, bs, 64);
        if (r2) _tile_loadd(5, as + a.half, a.stride);
        if (c2) _tile_loadd(7, bs + BGA_TILE, 64);
        _tile_dpbf16ps(0, 4, 6);
        if (c2) _tile_dpbf16ps(1, 4, 7);
        if (r2) _tile_dpbf16ps(2, 5, 6);
        if (r2 && c2) _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, c, sc);
    if (c2) _tile_stored(1, c + 16, sc);
    if (r2) _tile_stored(2, c + 16 * ldc, sc);
    if (r2 && c2) _tile_stored(3, c + 16 * ldc + 16, sc);
}

/* The block of `rows` x `cols` (1 to 32 each) at c: whole tiles in place,
 * a part of one through a 32 x 32 block on the stack. */
TK_AMX static void bga_block_at(int64_t steps, bga_arows a, const uint32_t *b, float *c, int64_t ldc, bool load,
                                int64_t rows, int64_t cols) {
    if ((rows == 32 || rows == 16) && (cols == 32 || cols == 16)) {
        if (rows == 32 && cols == 32) bga_block(steps, a, b, c, ldc, load, true, true);
        else if (rows == 32) bga_block(steps, a, b, c, ldc, load, true, false);
        else if (cols == 32) bga_block(steps, a, b, c, ldc, load, false, true);
        else bga_block(steps, a, b, c, ldc, load, false, false);
        return;
    }
    _Alignas(64) float e[32 * 32];
    if (load)
        for (int64_t r = 0; r < rows; r++) memcpy(e + r * 32, c + r * ldc, (size_t)cols * sizeof(float));
    const bool r2 = rows > 16, c2 = cols > 16;
    if (r2 && c2) bga_block(steps, a, b, e, 32, load, true, true);
    else if (r2) bga_block(steps, a, b, e, 32, load, true, false);
    else if (c2) bga_block(steps, a, b, e, 32, load, false, true);
    else bga_block(steps, a, b, e, 32, load, false, false);
    for (int64_t r = 0; r < rows; r++) memcpy(c + r * ldc, e + r * 32, (size_t)cols * sizeof(float));
}

/*
 * C (M x N, K >= 1) = the tile sums of the section's header, from C's
 * elements with beta, else from 0 (C not read), on nt threads, in one
 * parallel region for every BGA_A_BYTES of packed rows (one, for a step's
 * products). For each cache block of k in turn, work items (a panel of up
 * to BGA_NC columns, or where there are few panels a part of its rows)
 * each pack their panel of op(B) for the block once and run it against the
 * packed groups of rows. Where there are several panels, the
 * rows are rounded and packed once beforehand, over all of K, the threads
 * sharing them; where one panel spans N (a thin product), each item packs
 * its own groups of rows as it goes, one at a time (so they stay in the
 * first-level cache), or reads bf16 rows along k in place. Where the room
 * cannot be had, the same on the calling thread with one group of each from
 * the stack, to the same bits.
 */
#define BGA_A_BYTES ((int64_t)16 << 20)
static void bga_gemm(const bg_op *A, const bg_op *B, int64_t M, int64_t N, int64_t K, bool beta, float *C,
                     int64_t ldc, int nt) {
    const int64_t kcb = TIDE_MIN(round_up(K, 32), (int64_t)BGA_KC), steps_max = kcb / 32;
    const int64_t nkb = (K + kcb - 1) / kcb;   /* cache blocks of k */
    const int64_t gp = steps_max * 2 * BGA_TILE; /* pairs of a group over a block */
    /* rows packed at once: their pairs over all of K within BGA_A_BYTES */
    const int64_t mcap = TIDE_MAX((int64_t)1, BGA_A_BYTES / (nkb * gp * 4)) * BGA_GROUP;
    int64_t mcb = TIDE_MIN(round_up(M, BGA_GROUP), mcap);
    /* few rows: each panel of B serves them alone, so narrower panels
     * (kept in the first-level cache) */
    int64_t ncb = TIDE_MIN(round_up(N, BGA_GROUP), M <= 2 * BGA_GROUP ? (int64_t)2 * BGA_GROUP : (int64_t)BGA_NC);
    if (nt < 1) nt = 1;
    const bool few_panels = (N + ncb - 1) / ncb == 1;
    /* the rows' groups (several panels only), the threads' panels of B and
     * one group of rows each */
    const int64_t a_n = few_panels ? 0 : (mcb / BGA_GROUP) * nkb * gp;
    uint32_t *own = tide_malloc_aligned((size_t)(a_n + nt * (ncb / BGA_GROUP) * gp + nt * gp) * sizeof(uint32_t), 64);
    _Alignas(64) uint32_t stack[2 * BGA_GROUP_PAIRS];
    uint32_t *abuf = own, *bbuf = own ? own + a_n : NULL, *gbuf = NULL;
    if (own) {
        gbuf = bbuf + nt * (ncb / BGA_GROUP) * gp;
    } else {
        mcb = ncb = BGA_GROUP;
        nt = 1;
        gbuf = stack;
        bbuf = stack + BGA_GROUP_PAIRS;
    }
    const int64_t npan = (N + ncb - 1) / ncb;
    const bool shared = own && npan > 1;
    for (int64_t ic = 0; ic < M; ic += mcb) {
        const int64_t mc = TIDE_MIN(mcb, M - ic), ng = round_up(mc, BGA_GROUP) / BGA_GROUP;
        /* parts of the rows an item: enough items for the threads */
        const int64_t parts = nt > 1 && npan < 2 * nt ? TIDE_MIN(ng, (2 * nt + npan - 1) / npan) : 1;
        const int64_t items = npan * parts;
        bg_op a = *A;
        a.p = bg_at(A, A->t ? ic : ic * A->ld);
#pragma omp parallel num_threads(nt) if (nt > 1 && (ng > 1 || items > 1))
        {
            const int tid = omp_get_thread_num();
            if (shared) {
                /* the rows' groups over every block of k, packed by all the
                 * threads at once */
#pragma omp for schedule(dynamic, 1)
                for (int64_t gb = 0; gb < ng * nkb; gb++) {
                    const int64_t kb = gb / ng, g = gb % ng, pc = kb * kcb, kc = TIDE_MIN(kcb, K - pc);
                    bga_pack(&a, false, g * BGA_GROUP, mc - g * BGA_GROUP, 0, 1, pc, kc, round_up(kc, 32) / 32,
                             abuf + gb * gp);
                }
            }
            bga_config_tiles();
            uint32_t *bp = bbuf + (size_t)tid * (size_t)((ncb / BGA_GROUP) * gp);
            uint32_t *ag = gbuf + (size_t)tid * (size_t)gp;
            /* block by block of k (the threads sharing its packed rows in
             * the second-level caches): an item's columns take the blocks
             * in order, each after the last (the loop's barrier) */
            for (int64_t kb = 0; kb < nkb; kb++) {
                const int64_t pc = kb * kcb, kc = TIDE_MIN(kcb, K - pc), steps = round_up(kc, 32) / 32;
                const int64_t gs = steps * 2 * BGA_TILE;
                const bool load = pc > 0 || beta;
                /* bf16 rows along k in whole steps: already tile rows */
                const bool direct = A->dt == TIDE_BF16 && !A->t && kc % 32 == 0;
#pragma omp for schedule(dynamic, 1)
                for (int64_t it = 0; it < items; it++) {
                    const int64_t pan = it / parts, part = it % parts;
                    const int64_t jc = pan * ncb, nc = TIDE_MIN(ncb, N - jc), nb = round_up(nc, BGA_GROUP) / BGA_GROUP;
                    const int64_t g0 = ng * part / parts, g1 = ng * (part + 1) / parts;
                    bg_op b = *B;
                    b.p = bg_at(B, B->t ? jc * B->ld : jc);
                    bga_pack(&b, true, 0, nc, 0, nb, pc, kc, steps, bp);
                    for (int64_t g = g0; g < g1; g++) {
                        const int64_t r0 = g * BGA_GROUP, rows = TIDE_MIN((int64_t)BGA_GROUP, mc - r0);
                        bga_arows ap;
                        if (shared) {
                            ap = bga_packed(abuf + (kb * ng + g) * gp);
                        } else if (direct && (rows == 32 || rows == 16)) {
                            /* a thin product's bf16 rows, read in place */
                            ap = (bga_arows){a.p + (size_t)(r0 * a.ld + pc) * 2, 64, 16 * a.ld * 2, a.ld * 2};
                        } else {
                            bga_pack(&a, false, r0, mc - r0, 0, 1, pc, kc, steps, ag);
                            ap = bga_packed(ag);
                        }
                        for (int64_t jb = 0; jb < nb; jb++) {
                            const int64_t c0 = jb * BGA_GROUP, cols = TIDE_MIN((int64_t)BGA_GROUP, nc - c0);
                            bga_block_at(steps, ap, bp + jb * gs, C + (ic + r0) * ldc + jc + c0, ldc, load, rows,
                                         cols);
                        }
                    }
                }
            }
            bga_release();
        }
    }
    if (own) tide_free_aligned(own);
}
#endif

static const bg_kernel *bg_pick(void) {
#ifdef TK_X86
    if (tk_have_avx512()) return tk_cpu_has(TK_CPU_AVX512BF16) ? &bg_bf16 : &bg_avx512;
    if (tk_have_avx2()) return &bg_avx2;
#endif
    return &bg_portable;
}

const char *tk_gemm_bf16_path(void) {
#ifdef TK_X86
    if (bga_ok()) return "amx_bf16 (tdpbf16ps)";
#endif
    return bg_pick()->name;
}

/* ------------------------------------------------------------- driver */

static void bg_pack_a(const void *ctx, int64_t i0, int64_t n, int64_t p0, int64_t kc, int r, int64_t kd,
                      uint32_t *dst) {
    bg_pack(ctx, true, i0, n, p0, kc, r, kd, dst);
}

static void bg_pack_b(const void *ctx, int64_t i0, int64_t n, int64_t p0, int64_t kc, int r, int64_t kd,
                      uint32_t *dst) {
    bg_pack(ctx, false, i0, n, p0, kc, r, kd, dst);
}

/* C (M x N, K >= 1) = the sums s of the header (C not read), or with add_c
 * (K at most one block) C = C + s; on nt threads (gemm_drive.c), the bits
 * of one. */
static void bg_sums(const bg_op *A, const bg_op *B, int64_t M, int64_t N, int64_t K, float *C, int64_t ldc,
                    bool add_c, int nt) {
    const bg_kernel *k = bg_pick();
    const tk_gemm_kern kn = {.mr = k->mr, .nr = k->nr, .pairs = true, .tile = k->tile, .half = NULL,
                             .pack_a = bg_pack_a, .pack_b = bg_pack_b, .a_ctx = A, .b_ctx = B};
    tk_gemm_sums(&kn, M, N, K, C, ldc, add_c, nt);
}

/* Floats of the sums' scratch with beta 1 over more than one block of K:
 * as sgemm.c's. */
#define BG_SUMS_MAX ((int64_t)1 << 22)
#define BG_SUMS_STACK 4096

/* One product on nt threads: C (=, +=) op(A) . op(B). */
static void bg_gemm(const bg_op *A, const bg_op *B, int64_t M, int64_t N, int64_t K, bool beta, float *C,
                    int64_t ldc, int nt) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {
        for (int64_t i = 0; i < M; i++) {
            float *c = C + i * ldc;
            if (!beta) memset(c, 0, (size_t)N * sizeof(float));
            else
                for (int64_t j = 0; j < N; j++) c[j] = c[j] + 0.0f;
        }
        return;
    }
    if (!beta || K <= BG_KC) {
        bg_sums(A, B, M, N, K, C, ldc, beta, nt);
        return;
    }
    _Alignas(64) float stack[BG_SUMS_STACK];
    int64_t want = TIDE_MIN(M * N, BG_SUMS_MAX), cap = BG_SUMS_STACK;
    float *s = stack, *own = NULL;
    if (want > cap && (own = tide_malloc_aligned((size_t)want * sizeof(float), 64))) s = own, cap = want;
    int64_t bn = TIDE_MIN(N, cap), bm = TIDE_MAX((int64_t)1, TIDE_MIN(M, cap / bn));
    for (int64_t i0 = 0; i0 < M; i0 += bm) {
        int64_t m = TIDE_MIN(bm, M - i0);
        for (int64_t j0 = 0; j0 < N; j0 += bn) {
            int64_t n = TIDE_MIN(bn, N - j0);
            bg_op a = *A, b = *B;
            a.p = bg_at(A, A->t ? i0 : i0 * A->ld);
            b.p = bg_at(B, B->t ? j0 * B->ld : j0);
            bg_sums(&a, &b, m, n, K, s, n, false, nt);
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1 && m * n >= TK_PAR_MIN)
            for (int64_t i = 0; i < m; i++) {
                float *c = C + (i0 + i) * ldc + j0;
                const float *si = s + i * n;
                for (int64_t j = 0; j < n; j++) c[j] = c[j] + si[j];
            }
        }
    }
    if (own) tide_free_aligned(own);
}

void tk_gemm_bf16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const void *A, tide_dtype adt, int64_t lda,
                  const void *B, tide_dtype bdt, int64_t ldb, bool beta, float *C, int64_t ldc, int nt) {
    const bg_op a0 = {.p = A, .dt = adt, .ld = lda, .t = ta}, b0 = {.p = B, .dt = bdt, .ld = ldb, .t = tb};
#ifdef TK_X86
    /* AMX: one blocking of the whole product over the threads (an
     * element's bits do not depend on it) */
    if (M > 0 && N > 0 && K > 0 && bga_ok()) {
        bga_gemm(&a0, &b0, M, N, K, beta, C, ldc, nt);
        return;
    }
#endif
    bg_gemm(&a0, &b0, M, N, K, beta, C, ldc, nt);
}
