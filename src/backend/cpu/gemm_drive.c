/*
 * gemm_drive.c - the blocked, threaded driver of the training GEMMs
 * (tk_gemm_sums of kernels_int.h): sgemm.c's f32 products and
 * sgemm_bf16.c's bf16 ones hand it their packing and register tiles.
 *
 * The output is walked in blocks of NC columns and K in blocks of KC (the
 * order of the sums, which the callers' headers give); each block of op(B)
 * (KC x NC) is packed once into panels of NR columns, shared by all the
 * threads, which then take the work items of the block: a block of MC rows
 * of op(A) (packed by the thread that takes it, into its own buffer) times
 * a run of B's panels. An item's tiles read a panel of B (L1) against the
 * MC x KC block of A (L2). Items are handed out dynamically; a thread that
 * takes the next item of the same rows keeps its packed A.
 *
 * Which thread computes an element, the item it is in, MC and the number of
 * items do not change its bits: every tile sums its KC block from zero and
 * adds it to the running sum in C in the same order. Threads only wait at
 * the two barriers of each (NC, KC) block: after B is packed, and before it
 * is packed again.
 */
#include "backend/cpu/kernels_int.h"

#include <omp.h>
#include <string.h>

#define GD_KC TK_SGEMM_KC
#define GD_MC_PANELS 16
#define GD_NC 2048
/* elements (4 bytes: an f32 or a bf16 pair) of the stack fallback: one MR x
 * KC panel of A and one KC x NR panel of B */
#define GD_STACK ((TK_GEMM_MR_MAX + TK_GEMM_NR_MAX) * GD_KC)
/* a product below this many flops runs on the calling thread alone */
#define GD_PAR_FLOPS 4e6
/* items per thread wanted in a block, for the dynamic hand-out to balance
 * (more items pack the same rows of A more often) */
#define GD_ITEMS_PER_THREAD 2

/* ------------------------------------------------------------- along-k packing */

#ifdef TK_X86
/* A 16 x 16 matrix of 32-bit words (r[i]: row i) transposed in place: r[q]
 * then holds word q of each of the 16 rows. Unpacks within 128-bit lanes,
 * then lane shuffles. */
TK_AVX512 static inline void gd_t16x16(__m512i r[16]) {
    __m512i t[16], u[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    /* u[4i + j], lane L: word 4L + j of rows 4i .. 4i + 3 */
    for (int i = 0; i < 4; i++) {
        u[4 * i + 0] = _mm512_unpacklo_epi64(t[4 * i + 0], t[4 * i + 2]);
        u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i + 0], t[4 * i + 2]);
        u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int j = 0; j < 4; j++) {
        __m512i x0 = _mm512_shuffle_i32x4(u[j], u[4 + j], 0x44), x1 = _mm512_shuffle_i32x4(u[j], u[4 + j], 0xee);
        __m512i y0 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0x44);
        __m512i y1 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0xee);
        r[j] = _mm512_shuffle_i32x4(x0, y0, 0x88);
        r[4 + j] = _mm512_shuffle_i32x4(x0, y0, 0xdd);
        r[8 + j] = _mm512_shuffle_i32x4(x1, y1, 0x88);
        r[12 + j] = _mm512_shuffle_i32x4(x1, y1, 0xdd);
    }
}

TK_AVX512 void tk_pack_t16(const float *X, int64_t ld, int64_t n, int64_t kc, float alpha, int mr, float *d) {
    const __m512 av = _mm512_set1_ps(alpha);
    for (int g = 0; g < mr; g += 16) {
        const int w = TIDE_MIN(16, mr - g);
        const __mmask16 keep = (__mmask16)((1u << w) - 1);
        for (int64_t k = 0; k < kc; k += 16) {
            const int64_t q1 = TIDE_MIN((int64_t)16, kc - k);
            const __mmask16 km = (__mmask16)((1u << q1) - 1);
            __m512i v[16];
            for (int r = 0; r < 16; r++) {
                if (r < w && g + r < n) {
                    __m512 x = _mm512_maskz_loadu_ps(km, X + (g + r) * ld + k);
                    v[r] = _mm512_castps_si512(alpha == 1.0f ? x : _mm512_mul_ps(av, x));
                } else {
                    v[r] = _mm512_setzero_si512();
                }
            }
            gd_t16x16(v);
            for (int64_t q = 0; q < q1; q++) _mm512_mask_storeu_epi32(d + (k + q) * mr + g, keep, v[q]);
        }
    }
}
#else
void tk_pack_t16(const float *X, int64_t ld, int64_t n, int64_t kc, float alpha, int mr, float *d) {
    (void)X, (void)ld, (void)n, (void)kc, (void)alpha, (void)mr, (void)d;
}
#endif

static int64_t gd_round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

typedef struct {
    const tk_gemm_kern *kn;
    const void *A, *B;
    int64_t M, N, K;
    float *C;
    int64_t ldc;
    bool add_c;
    int64_t mcb, ncb, kcb; /* mcb: the largest row block */
    int64_t n_ic, pan_base, pan_rem; /* row blocks: pan_base register tiles of rows each, the first pan_rem one more */
    size_t a_el; /* elements of one thread's A buffer */
    uint32_t *bp;
} gd_job;

/* Row block ib: its first row and its rows. */
static void gd_rows(const gd_job *j, int64_t ib, int64_t *ic, int64_t *mc) {
    const int64_t mr = j->kn->mr, p0 = ib * j->pan_base + TIDE_MIN(ib, j->pan_rem);
    *ic = p0 * mr;
    *mc = TIDE_MIN((j->pan_base + (ib < j->pan_rem)) * mr, j->M - *ic);
}

/* The depth of a packed block of kc elements of K. */
static int64_t gd_depth(const tk_gemm_kern *kn, int64_t kc) { return kn->pairs ? (kc + 1) / 2 : kc; }

/* Panels [p0, p1) (of NR columns) of the block (jc, pc) of op(B) into the
 * shared buffer, in one call (a packing runs faster over wide rows). */
static void gd_pack_b(const gd_job *j, int64_t jc, int64_t nc, int64_t pc, int64_t kc, int64_t p0, int64_t p1) {
    const int nr = j->kn->nr;
    const int64_t kd = gd_depth(j->kn, kc), jb = p0 * nr, n = TIDE_MIN(p1 * nr, nc) - jb;
    if (n > 0) j->kn->pack_b(j->kn->b_ctx, jc + jb, n, pc, kc, nr, kd, j->bp + jb * kd);
}

/* The tiles of one item: rows [ic, ic + mc) of the block, B's panels
 * [p0, p1); A packed into ap unless *packed already holds block ic. */
static void gd_item(const gd_job *j, int64_t jc, int64_t nc, int64_t pc, int64_t kc, int64_t ic, int64_t mc,
                    int64_t p0, int64_t p1, uint32_t *ap, int64_t *packed, float *edge) {
    const tk_gemm_kern *kn = j->kn;
    const int mr = kn->mr, nr = kn->nr;
    const int64_t kd = gd_depth(kn, kc), ldc = j->ldc;
    const bool add = pc > 0 || j->add_c;
    if (*packed != ic) {
        kn->pack_a(kn->a_ctx, ic, mc, pc, kc, mr, kd, ap);
        *packed = ic;
    }
    float *C = j->C;
    for (int64_t p = p0; p < p1; p++) {
        const int64_t jr = p * nr, cols = TIDE_MIN((int64_t)nr, nc - jr);
        const uint32_t *bpan = j->bp + jr * kd;
        for (int64_t ir = 0; ir < mc; ir += mr) {
            const int64_t rows = TIDE_MIN((int64_t)mr, mc - ir);
            float *c = C + (ic + ir) * ldc + jc + jr;
            const uint32_t *apan = ap + ir * kd;
            if (add) {
                /* the next tile's rows of C, read while this one runs */
                const bool down = ir + mr < mc;
                const float *next = down ? c + mr * ldc : C + ic * ldc + jc + jr + nr;
                const int64_t nrows = TIDE_MIN((int64_t)mr, down ? mc - ir - mr : mc);
                if (down || p + 1 < p1)
                    for (int64_t r = 0; r < nrows; r++)
                        for (int64_t q = 0; q < nr; q += 16) __builtin_prefetch(next + r * ldc + q);
            }
            if (rows == mr && cols == nr) {
                kn->tile(kd, apan, bpan, c, ldc, add);
                continue;
            }
            /* at most half a panel wide: half the work */
            tk_gemm_tile_fn fn = kn->half && 2 * cols <= nr ? kn->half : kn->tile;
            if (rows == mr && fn == kn->half && 2 * cols == nr) {
                fn(kd, apan, bpan, c, ldc, add);
                continue;
            }
            /* an edge tile: through a full one on the stack */
            if (add)
                for (int64_t r = 0; r < rows; r++) memcpy(edge + r * nr, c + r * ldc, (size_t)cols * sizeof(float));
            fn(kd, apan, bpan, edge, nr, add);
            for (int64_t r = 0; r < rows; r++) memcpy(c + r * ldc, edge + r * nr, (size_t)cols * sizeof(float));
        }
    }
}

/* The items of a block of nc columns: (row blocks) x (runs of panels), at
 * least GD_ITEMS_PER_THREAD a thread where the panels allow. */
static void gd_items(const gd_job *j, int64_t nc, int nth, int64_t *n_ic, int64_t *n_jg, int64_t *np) {
    *np = (nc + j->kn->nr - 1) / j->kn->nr;
    *n_ic = j->n_ic;
    int64_t want = (int64_t)nth * GD_ITEMS_PER_THREAD;
    *n_jg = nth == 1 ? 1 : TIDE_MAX((int64_t)1, TIDE_MIN(*np, (want + *n_ic - 1) / *n_ic));
}

void tk_gemm_sums(const tk_gemm_kern *kn, int64_t M, int64_t N, int64_t K, float *C, int64_t ldc, bool add_c,
                  int nt) {
    if (M <= 0 || N <= 0 || K <= 0) return;
    const int mr = kn->mr, nr = kn->nr;
    gd_job j = {.kn = kn, .M = M, .N = N, .K = K, .C = C, .ldc = ldc, .add_c = add_c};
    j.kcb = TIDE_MIN(K, (int64_t)GD_KC);
    const int64_t kdb = gd_depth(kn, j.kcb);
    int nth = nt > 1 && 2.0 * (double)M * (double)N * (double)K >= GD_PAR_FLOPS ? nt : 1;
    /* row blocks of at most MC rows, their register tiles shared out
     * evenly (they differ by one at most), and on several threads a
     * multiple of the threads where the tiles allow: the items of a block
     * then take the threads equally long (1024 rows on 2 threads were 5
     * blocks of 180 rows and one of 124: 540 rows for one thread, 484 for
     * the other, which then waited at each block's barrier) */
    const int64_t panels = (M + mr - 1) / mr;
    int64_t n_ic = (panels + GD_MC_PANELS - 1) / GD_MC_PANELS;
    if (nth > 1) n_ic = TIDE_MIN(panels, gd_round_up(n_ic, nth));
    j.n_ic = n_ic;
    j.pan_base = panels / n_ic;
    j.pan_rem = panels % n_ic;
    j.mcb = (j.pan_base + (j.pan_rem > 0)) * mr;
    j.ncb = TIDE_MIN(gd_round_up(N, nr), (int64_t)(GD_NC / nr * nr));
    _Alignas(64) uint32_t stack[GD_STACK];
    uint32_t *buf = NULL;
    j.a_el = (size_t)gd_round_up(j.mcb * kdb, 16);
    size_t need = (size_t)nth * j.a_el + (size_t)(kdb * j.ncb);
    if (need <= GD_STACK && nth == 1) buf = stack;
    else buf = tide_malloc_aligned(need * sizeof(uint32_t), 64);
    uint32_t *own = buf == stack ? NULL : buf;
    if (!buf) {
        /* out of memory: one thread, the smallest blocks of M and N, from
         * the stack, to the same bits (the K blocks, part of the order, stay) */
        nth = 1;
        j.mcb = mr;
        j.n_ic = panels;
        j.pan_base = 1;
        j.pan_rem = 0;
        j.ncb = nr;
        j.a_el = (size_t)gd_round_up(j.mcb * kdb, 16);
        buf = stack;
    }
    j.bp = buf + (size_t)nth * j.a_el;
    if (nth == 1) {
        /* an edge tile's rows and columns past C's are computed on, never
         * stored (zeros at first, so nothing uninitialised is read) */
        _Alignas(64) float edge[TK_GEMM_MR_MAX * TK_GEMM_NR_MAX] = {0};
        for (int64_t jc = 0; jc < N; jc += j.ncb) {
            const int64_t nc = TIDE_MIN(j.ncb, N - jc);
            int64_t n_icb, n_jg, np;
            gd_items(&j, nc, 1, &n_icb, &n_jg, &np);
            for (int64_t pc = 0; pc < K; pc += j.kcb) {
                const int64_t kc = TIDE_MIN(j.kcb, K - pc);
                int64_t packed = -1;
                gd_pack_b(&j, jc, nc, pc, kc, 0, np);
                for (int64_t ib = 0; ib < n_icb; ib++) {
                    int64_t ic, mc;
                    gd_rows(&j, ib, &ic, &mc);
                    gd_item(&j, jc, nc, pc, kc, ic, mc, 0, np, buf, &packed, edge);
                }
            }
        }
    } else {
#pragma omp parallel num_threads(nth)
        {
            uint32_t *ap = buf + (size_t)omp_get_thread_num() * j.a_el;
            _Alignas(64) float edge[TK_GEMM_MR_MAX * TK_GEMM_NR_MAX] = {0};
            const int team = omp_get_num_threads();
            for (int64_t jc = 0; jc < N; jc += j.ncb) {
                const int64_t nc = TIDE_MIN(j.ncb, N - jc);
                int64_t n_icb, n_jg, np;
                gd_items(&j, nc, team, &n_icb, &n_jg, &np);
                const int64_t items = n_icb * n_jg;
                for (int64_t pc = 0; pc < K; pc += j.kcb) {
                    const int64_t kc = TIDE_MIN(j.kcb, K - pc);
                    int64_t packed = -1;
#pragma omp for schedule(static)
                    for (int t = 0; t < team; t++) gd_pack_b(&j, jc, nc, pc, kc, np * t / team, np * (t + 1) / team);
#pragma omp for schedule(dynamic, 1)
                    for (int64_t it = 0; it < items; it++) {
                        const int64_t ib = it / n_jg, g = it % n_jg;
                        int64_t ic, mc;
                        gd_rows(&j, ib, &ic, &mc);
                        gd_item(&j, jc, nc, pc, kc, ic, mc, np * g / n_jg, np * (g + 1) / n_jg, ap, &packed, edge);
                    }
                }
            }
        }
    }
    if (own) tide_free_aligned(own);
}
