/*
 * sgemm_bf16.c - the GEMM of a bf16 training step (tk_gemm_bf16 of
 * kernels_int.h): every product of a step built with --precision bf16
 * (MATMUL's forms, MATMUL_GRADW, the fused cross-entropy's logits and
 * gradients) on operands rounded to bf16, with f32 sums.
 *
 * An operand is f32 (rounded to bf16, to nearest even, as it is packed),
 * bf16 (taken as stored) or f16 (widened, then rounded). The driver is
 * sgemm.c's packed layout, with k taken in pairs: a panel element is the
 * 32-bit pair (element k in the low half, k + 1 in the high half) that
 * VDPBF16PS multiplies, zeros past the edges.
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
 * products). As in sgemm.c, nothing else changes the bits: not the tile
 * grid tk_gemm_bf16 cuts, the thread count, nor the buffer sizes.
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
#define BG_MC_PANELS 16
#define BG_NC 2048
#define BG_MR_MAX 12
#define BG_NR_MAX 32
/* 32-bit pairs of the stack buffer: one MR x KC and one KC x NR panel */
#define BG_STACK ((BG_MR_MAX + BG_NR_MAX) * BG_KC / 2)

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
    enum { W = BG_NC > 2048 ? BG_NC : 2048 };
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

/* t of the header over kc2 pairs of the packed panels a (kc2 x MR) and b
 * (kc2 x NR) into c (MR x NR, stride ldc): c = t, or with add c = c + t. */
typedef void (*bg_tile_fn)(int64_t kc2, const uint32_t *a, const uint32_t *b, float *c, int64_t ldc, bool add);

typedef struct {
    const char *name;
    int mr, nr;
    bg_tile_fn tile;
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
static void tile_portable(int64_t kc2, const uint32_t *a, const uint32_t *b, float *c, int64_t ldc, bool add) {
    BG_GENERIC_BODY
}

static const bg_kernel bg_portable = {"portable (fmaf)", BGP_MR, BGP_NR, tile_portable};

#ifdef TK_X86
#define BG_INLINE inline __attribute__((always_inline))
#define TK_AVX512BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma")))

/* The same arithmetic compiled for FMA (the compiler vectorises it). */
TK_AVX2 static void tile_avx2(int64_t kc2, const uint32_t *a, const uint32_t *b, float *c, int64_t ldc, bool add) {
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
TK_AVX512BF16 static void tile_bf16(int64_t kc2, const uint32_t *a, const uint32_t *b, float *c, int64_t ldc,
                                    bool add) {
    tile_dp(kc2, a, b, c, ldc, add, BG5_MR, 2);
}

TK_AVX512 static void tile_avx512(int64_t kc2, const uint32_t *a, const uint32_t *b, float *c, int64_t ldc,
                                  bool add) {
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
 * on VDPBF16PS. Each call configures the tiles on its thread and releases
 * them at the end.
 */
#include <stdatomic.h>
#include <sys/syscall.h>
#include <unistd.h>

#define TK_AMX __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx2,fma")))
#define BGA_MR 32
#define BGA_NR 32
#define BGA_STEP 16  /* pairs of k per TDPBF16PS */
#define BGA_KC 1024  /* cache blocks: k (a multiple of 2 * BGA_STEP) */
#define BGA_MC 128   /* rows */
#define BGA_NC 512   /* columns */
#define BGA_STACK ((BGA_MR + BGA_NR) * BGA_KC / 2)
_Static_assert(BGA_KC % (2 * BGA_STEP) == 0, "cache blocks of whole steps");

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

/* Rows [i0, i0 + mc) of op(A), k in [p0, p0 + kc), as rows of kc2p pairs:
 * row r's pair p at d[r * kc2p + p]; rows up to mc rounded up to BGA_MR and
 * the pairs past ceil(kc / 2) zeros. */
static void bga_pack_a(const bg_op *o, int64_t i0, int64_t mc, int64_t p0, int64_t kc, int64_t kc2p, uint32_t *d) {
    const int64_t kc2 = (kc + 1) / 2, mcp = round_up(mc, BGA_MR);
    memset(d + mc * kc2p, 0, (size_t)((mcp - mc) * kc2p) * sizeof(uint32_t));
    if (!o->t) {
        /* a row's pairs are its bf16 elements in order */
        for (int64_t r = 0; r < mc; r++) {
            uint32_t *q = d + r * kc2p;
            bg_row(bg_at(o, (i0 + r) * o->ld + p0), o->dt, kc, (uint16_t *)(void *)q);
            if (kc & 1) ((uint16_t *)(void *)q)[kc] = 0;
            for (int64_t p = kc2; p < kc2p; p++) q[p] = 0;
        }
        return;
    }
    /* op(A) stored (K, M): pairs of rows of A interleaved, BGA_STEP pairs
     * at a time, then written out row by row (whole 64-byte rows) */
    _Alignas(64) uint32_t blk[BGA_MC][BGA_STEP];
    uint16_t lw[BGA_MC], hw[BGA_MC];
    for (int64_t pb = 0; pb < kc2p; pb += BGA_STEP) {
        for (int64_t q = 0; q < BGA_STEP; q++) {
            const int64_t p = pb + q, k = p0 + 2 * p;
            if (p >= kc2) {
                for (int64_t r = 0; r < mc; r++) blk[r][q] = 0;
                continue;
            }
            bg_row(bg_at(o, k * o->ld + i0), o->dt, mc, lw);
            if (2 * p + 1 < kc) bg_row(bg_at(o, (k + 1) * o->ld + i0), o->dt, mc, hw);
            else memset(hw, 0, (size_t)mc * 2);
            for (int64_t r = 0; r < mc; r++) blk[r][q] = (uint32_t)lw[r] | (uint32_t)hw[r] << 16;
        }
        for (int64_t r = 0; r < mc; r++) memcpy(d + r * kc2p + pb, blk[r], sizeof blk[r]);
    }
}

/* A 32 x 32 block c (row stride ldc floats): its tiles loaded from c (or
 * zero), `steps` steps over the packed a (32 rows of kc2p pairs) and b (a
 * panel of 32 columns, 32 uint32 a pair), stored back. */
TK_AMX static void bga_block(int64_t steps, const uint32_t *a, int64_t kc2p, const uint32_t *b, float *c, int64_t ldc,
                             bool load) {
    const int64_t sc = ldc * 4, sa = kc2p * 4;
    if (load) {
        _tile_loadd(0, c, sc);
        _tile_loadd(1, c + 16, sc);
        _tile_loadd(2, c + 16 * ldc, sc);
        _tile_loadd(3, c + 16 * ldc + 16, sc);
    } else {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
    }
    for (int64_t s = 0; s < steps; s++) {
        _tile_loadd(4, a + s * BGA_STEP, sa);
        _tile_loadd(5, a + 16 * kc2p + s * BGA_STEP, sa);
        _tile_loadd(6, b + s * BGA_STEP * BGA_NR, BGA_NR * 4);
        _tile_loadd(7, b + s * BGA_STEP * BGA_NR + 16, BGA_NR * 4);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, c, sc);
    _tile_stored(1, c + 16, sc);
    _tile_stored(2, c + 16 * ldc, sc);
    _tile_stored(3, c + 16 * ldc + 16, sc);
}

/* C (M x N, K >= 1) = the tile sums of the section's header, from C's
 * elements with beta, else from 0 (C not read). */
static void bga_gemm1(const bg_op *A, const bg_op *B, int64_t M, int64_t N, int64_t K, bool beta, float *C,
                      int64_t ldc) {
    int64_t kcb = TIDE_MIN(round_up(K, 2 * BGA_STEP), (int64_t)BGA_KC), kc2pb = kcb / 2;
    int64_t mcb = TIDE_MIN(round_up(M, BGA_MR), (int64_t)BGA_MC);
    int64_t ncb = TIDE_MIN(round_up(N, BGA_NR), (int64_t)BGA_NC);
    _Alignas(64) uint32_t stack[BGA_STACK];
    uint32_t *buf = stack, *own = NULL;
    size_t a_n = (size_t)(mcb * kc2pb), need = a_n + (size_t)(kc2pb * ncb);
    if (need > BGA_STACK) buf = own = tide_malloc_aligned(need * sizeof(uint32_t), 64);
    if (!buf) {
        /* out of memory: one block of each from the stack, to the same bits */
        mcb = BGA_MR;
        ncb = BGA_NR;
        a_n = (size_t)(mcb * kc2pb);
        buf = stack;
    }
    uint32_t *ap = buf, *bp = buf + a_n;
    _Alignas(64) float edge[BGA_MR * BGA_NR];
    bga_config_tiles();
    for (int64_t jc = 0; jc < N; jc += ncb) {
        int64_t nc = TIDE_MIN(ncb, N - jc);
        for (int64_t pc = 0; pc < K; pc += kcb) {
            int64_t kc = TIDE_MIN(kcb, K - pc), kc2p = round_up((kc + 1) / 2, BGA_STEP);
            bool load = pc > 0 || beta;
            bg_pack(B, false, jc, nc, pc, kc, BGA_NR, kc2p, bp);
            for (int64_t ic = 0; ic < M; ic += mcb) {
                int64_t mc = TIDE_MIN(mcb, M - ic);
                bga_pack_a(A, ic, mc, pc, kc, kc2p, ap);
                for (int64_t jr = 0; jr < nc; jr += BGA_NR) {
                    int64_t cols = TIDE_MIN((int64_t)BGA_NR, nc - jr);
                    for (int64_t ir = 0; ir < mc; ir += BGA_MR) {
                        int64_t rows = TIDE_MIN((int64_t)BGA_MR, mc - ir);
                        float *c = C + (ic + ir) * ldc + jc + jr;
                        if (rows == BGA_MR && cols == BGA_NR) {
                            bga_block(kc2p / BGA_STEP, ap + ir * kc2p, kc2p, bp + jr * kc2p, c, ldc, load);
                            continue;
                        }
                        /* an edge block: through a whole one on the stack */
                        if (load)
                            for (int64_t r = 0; r < rows; r++)
                                memcpy(edge + r * BGA_NR, c + r * ldc, (size_t)cols * sizeof(float));
                        bga_block(kc2p / BGA_STEP, ap + ir * kc2p, kc2p, bp + jr * kc2p, edge, BGA_NR, load);
                        for (int64_t r = 0; r < rows; r++)
                            memcpy(c + r * ldc, edge + r * BGA_NR, (size_t)cols * sizeof(float));
                    }
                }
            }
        }
    }
    bga_release();
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

/* C (M x N, K >= 1) = the sums s of the header (C not read), or with add_c
 * (K at most one block) C = C + s. */
static void bg_sums(const bg_op *A, const bg_op *B, int64_t M, int64_t N, int64_t K, float *C, int64_t ldc,
                    bool add_c) {
    const bg_kernel *kn = bg_pick();
    const int mr = kn->mr, nr = kn->nr;
    int64_t kcb = TIDE_MIN(K, (int64_t)BG_KC), kc2b = (kcb + 1) / 2;
    int64_t mcb = TIDE_MIN(round_up(M, mr), (int64_t)mr * BG_MC_PANELS);
    int64_t ncb = TIDE_MIN(round_up(N, nr), (int64_t)(BG_NC / nr * nr));
    _Alignas(64) uint32_t stack[BG_STACK];
    uint32_t *buf = stack, *own = NULL;
    size_t a_n = (size_t)round_up(mcb * kc2b, 16);
    size_t need = a_n + (size_t)(kc2b * ncb);
    if (need > BG_STACK) buf = own = tide_malloc_aligned(need * sizeof(uint32_t), 64);
    if (!buf) {
        /* out of memory: the smallest blocks of M and N, to the same bits */
        mcb = mr;
        ncb = nr;
        a_n = (size_t)round_up(mcb * kc2b, 16);
        buf = stack;
    }
    uint32_t *ap = buf, *bp = buf + a_n;
    _Alignas(64) float edge[BG_MR_MAX * BG_NR_MAX] = {0};
    for (int64_t jc = 0; jc < N; jc += ncb) {
        int64_t nc = TIDE_MIN(ncb, N - jc);
        for (int64_t pc = 0; pc < K; pc += kcb) {
            int64_t kc = TIDE_MIN(kcb, K - pc), kc2 = (kc + 1) / 2;
            bool add = pc > 0 || add_c;
            bg_pack(B, false, jc, nc, pc, kc, nr, kc2, bp);
            for (int64_t ic = 0; ic < M; ic += mcb) {
                int64_t mc = TIDE_MIN(mcb, M - ic);
                bg_pack(A, true, ic, mc, pc, kc, mr, kc2, ap);
                for (int64_t jr = 0; jr < nc; jr += nr) {
                    int64_t cols = TIDE_MIN((int64_t)nr, nc - jr);
                    for (int64_t ir = 0; ir < mc; ir += mr) {
                        int64_t rows = TIDE_MIN((int64_t)mr, mc - ir);
                        float *c = C + (ic + ir) * ldc + jc + jr;
                        if (rows == mr && cols == nr) {
                            kn->tile(kc2, ap + ir * kc2, bp + jr * kc2, c, ldc, add);
                            continue;
                        }
                        /* an edge tile: through a full one on the stack */
                        if (add)
                            for (int64_t r = 0; r < rows; r++)
                                memcpy(edge + r * nr, c + r * ldc, (size_t)cols * sizeof(float));
                        kn->tile(kc2, ap + ir * kc2, bp + jr * kc2, edge, nr, add);
                        for (int64_t r = 0; r < rows; r++)
                            memcpy(c + r * ldc, edge + r * nr, (size_t)cols * sizeof(float));
                    }
                }
            }
        }
    }
    if (own) tide_free_aligned(own);
}

/* Floats of the sums' scratch with beta 1 over more than one block of K:
 * as sgemm.c's. */
#define BG_SUMS_MAX ((int64_t)1 << 22)
#define BG_SUMS_STACK 4096

/* One product on the calling thread: C (=, +=) op(A) . op(B). */
static void bg_gemm1(const bg_op *A, const bg_op *B, int64_t M, int64_t N, int64_t K, bool beta, float *C,
                     int64_t ldc) {
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
#ifdef TK_X86
    if (bga_ok()) {
        bga_gemm1(A, B, M, N, K, beta, C, ldc);
        return;
    }
#endif
    if (!beta || K <= BG_KC) {
        bg_sums(A, B, M, N, K, C, ldc, beta);
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
            bg_sums(&a, &b, m, n, K, s, n, false);
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
    int pm, pn;
    tk_gemm_grid(M, N, K, &pm, &pn);
    int ntile = pm * pn;
    const bg_op a0 = {.p = A, .dt = adt, .ld = lda, .t = ta}, b0 = {.p = B, .dt = bdt, .ld = ldb, .t = tb};
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt) if (ntile > 1 && nt > 1)
    for (int t = 0; t < ntile; t++) {
        int im = t / pn, in = t % pn;
        int64_t r0 = M * im / pm, r1 = M * (im + 1) / pm;
        int64_t c0 = in == 0 ? 0 : (N * in / pn) & ~(int64_t)31;
        int64_t c1 = in == pn - 1 ? N : (N * (in + 1) / pn) & ~(int64_t)31;
        if (c1 <= c0) continue;
        bg_op a = a0, b = b0;
        a.p = bg_at(&a0, ta ? r0 : r0 * lda);
        b.p = bg_at(&b0, tb ? c0 * ldb : c0);
        bg_gemm1(&a, &b, r1 - r0, c1 - c0, K, beta, C + r0 * ldc + c0, ldc);
    }
}
