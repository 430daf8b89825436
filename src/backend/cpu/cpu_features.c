/*
 * cpu_features.c - what the x86-64 CPU under us can run, read once with
 * cpuid and xgetbv, so that one binary (built for baseline x86-64) picks its
 * kernels at run time: AVX2+FMA+F16C, AVX-512 F/BW/VL, AVX512_BF16, AVX512_VNNI
 * and AMX-BF16 (VNNI detected and reported, not used yet; AMX-BF16 runs the
 * products of a bf16 training step, sgemm_bf16.c).
 *
 * An instruction set counts only when the CPU has it and the operating
 * system saves its registers (XCR0): YMM state for AVX2, opmask and ZMM
 * state as well for AVX-512, the tile state for AMX (which Linux also hands
 * out per process on request: a kernel using it would have to ask first).
 * Other architectures report nothing and run the portable kernels.
 *
 * The switches that force the portable or the AVX2 paths (tk_cpu_force_*,
 * tk_force_generic) are the tests', compiled only into the test build's
 * objects (TIDE_TEST_HOOKS): the shipped library always runs what it detects.
 */
#include "backend/cpu/cpu_features.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#define CF_X86 1
#endif

static atomic_uint cf_bits; /* TK_CPU_* | TK_CPU_PROBED */
#ifdef TIDE_TEST_HOOKS
/* the tests' switches (cpu_features.h): in the test build's objects only */
static atomic_bool cf_generic;
static atomic_bool cf_no_avx512;
static atomic_bool cf_no_bf16;
static atomic_bool cf_no_amx;
#endif

#define TK_CPU_PROBED (1u << 31)

#ifdef CF_X86
static uint64_t xcr0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (uint64_t)hi << 32 | lo;
}

static unsigned probe(void) {
    unsigned a, b, c, d, f = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    bool osxsave = c >> 27 & 1, fma = c >> 12 & 1, f16c = c >> 29 & 1;
    if (!osxsave) return 0;
    uint64_t x = xcr0();
    bool ymm = (x & 0x6) == 0x6, zmm = ymm && (x & 0xe0) == 0xe0, tiles = (x & 0x60000) == 0x60000;
    if (__get_cpuid_max(0, NULL) < 7) return 0;
    __cpuid_count(7, 0, a, b, c, d);
    unsigned max_sub = a;
    if (ymm && (b >> 5 & 1) && fma && f16c) f |= TK_CPU_AVX2;
    if (zmm && (b >> 16 & 1)) f |= TK_CPU_AVX512F;
    if (zmm && (b >> 30 & 1)) f |= TK_CPU_AVX512BW;
    if (zmm && (b >> 31 & 1)) f |= TK_CPU_AVX512VL;
    if (zmm && (c >> 11 & 1)) f |= TK_CPU_AVX512VNNI;
    if (tiles && (d >> 22 & 1) && (d >> 24 & 1)) f |= TK_CPU_AMXBF16;
    if (max_sub >= 1) {
        __cpuid_count(7, 1, a, b, c, d);
        if (zmm && (a >> 5 & 1)) f |= TK_CPU_AVX512BF16;
    }
    /* the kernels built on AVX-512 take F, BW and VL together (and AVX2 for
     * their 256-bit halves); a CPU with part of them runs the AVX2 ones */
    unsigned base = TK_CPU_AVX2 | TK_CPU_AVX512F | TK_CPU_AVX512BW | TK_CPU_AVX512VL;
    if ((f & base) != base) f &= ~(TK_CPU_AVX512F | TK_CPU_AVX512BW | TK_CPU_AVX512VL | TK_CPU_AVX512BF16 |
                                   TK_CPU_AVX512VNNI);
    return f;
}
#else
static unsigned probe(void) { return 0; }
#endif

unsigned tk_cpu_detected(void) {
    unsigned v = atomic_load_explicit(&cf_bits, memory_order_relaxed);
    if (!(v & TK_CPU_PROBED)) {
        v = probe() | TK_CPU_PROBED;
        atomic_store(&cf_bits, v);
    }
    return v & ~TK_CPU_PROBED;
}

unsigned tk_cpu(void) {
    unsigned v = tk_cpu_detected();
#ifdef TIDE_TEST_HOOKS
    if (atomic_load_explicit(&cf_generic, memory_order_relaxed)) return 0;
    if (atomic_load_explicit(&cf_no_avx512, memory_order_relaxed))
        v &= ~(TK_CPU_AVX512F | TK_CPU_AVX512BW | TK_CPU_AVX512VL | TK_CPU_AVX512BF16 | TK_CPU_AVX512VNNI);
    if (atomic_load_explicit(&cf_no_bf16, memory_order_relaxed)) v &= ~(TK_CPU_AVX512BF16 | TK_CPU_AMXBF16);
    if (atomic_load_explicit(&cf_no_amx, memory_order_relaxed)) v &= ~TK_CPU_AMXBF16;
#endif
    return v;
}

#ifdef TIDE_TEST_HOOKS
void tk_cpu_force_generic(bool on) { atomic_store(&cf_generic, on); }

void tk_cpu_force_no_avx512(bool on) { atomic_store(&cf_no_avx512, on); }

void tk_cpu_force_no_bf16(bool on) { atomic_store(&cf_no_bf16, on); }

void tk_cpu_force_no_amx(bool on) { atomic_store(&cf_no_amx, on); }

void tk_force_generic(bool on) { tk_cpu_force_generic(on); }
#endif

const char *tk_cpu_vector_path(void) {
    unsigned base = TK_CPU_AVX512F | TK_CPU_AVX512BW | TK_CPU_AVX512VL;
    unsigned f = tk_cpu();
    return (f & base) == base ? "avx512 (rope avx2)" : f & TK_CPU_AVX2 ? "avx2" : "portable";
}

void tk_cpu_names(unsigned f, char *buf, size_t n) {
    static const struct { unsigned bit; const char *name; } names[] = {
        {TK_CPU_AVX2, "avx2"},           {TK_CPU_AVX512F, "avx512f"},     {TK_CPU_AVX512BW, "avx512bw"},
        {TK_CPU_AVX512VL, "avx512vl"},   {TK_CPU_AVX512BF16, "avx512_bf16"}, {TK_CPU_AVX512VNNI, "avx512_vnni"},
        {TK_CPU_AMXBF16, "amx_bf16"},
    };
    size_t len = 0;
    if (n) buf[0] = 0;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (f & names[i].bit) {
            int w = snprintf(buf + len, len < n ? n - len : 0, "%s%s", len ? " " : "", names[i].name);
            if (w > 0) len += (size_t)w;
        }
    if (!len && n) snprintf(buf, n, "none");
}
