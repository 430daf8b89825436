/*
 * cpu_features.h - run-time CPU feature detection for the CPU kernels
 * (cpu_features.c): one binary for every x86-64 machine, each kernel family
 * choosing its code path from these bits.
 */
#ifndef TIDE_CPU_FEATURES_H
#define TIDE_CPU_FEATURES_H

#include <stdbool.h>
#include <stddef.h>

/* Instruction sets the CPU has and the OS has enabled. The AVX-512 bits are
 * set only together with F, BW, VL and AVX2 (the kernels' common floor). */
#define TK_CPU_AVX2 (1u << 0)       /* with FMA and F16C */
#define TK_CPU_AVX512F (1u << 1)
#define TK_CPU_AVX512BW (1u << 2)
#define TK_CPU_AVX512VL (1u << 3)
#define TK_CPU_AVX512BF16 (1u << 4)
#define TK_CPU_AVX512VNNI (1u << 5)
#define TK_CPU_AMXBF16 (1u << 6)    /* the bf16 training products (sgemm_bf16.c) */

/* The detected set (probed once; thread-safe). */
unsigned tk_cpu_detected(void);
/* The set the kernels may use: the detected one, or 0 while
 * tk_cpu_force_generic(true) is in effect (tests: the portable paths). */
unsigned tk_cpu(void);
void tk_cpu_force_generic(bool on); /* test builds only (TIDE_TEST_HOOKS) */
/* While on, tk_cpu leaves out the AVX-512 bits (tests: the AVX2 paths on an
 * AVX-512 machine). */
void tk_cpu_force_no_avx512(bool on); /* test builds only (TIDE_TEST_HOOKS) */
/* While on, tk_cpu leaves out AVX512_BF16 and AMX-BF16 (tests: the
 * conversion paths of an AVX-512F CPU without them). */
void tk_cpu_force_no_bf16(bool on); /* test builds only (TIDE_TEST_HOOKS) */
/* While on, tk_cpu leaves out AMX-BF16 alone (tests: the VDPBF16PS path on
 * an AMX CPU). */
void tk_cpu_force_no_amx(bool on); /* test builds only (TIDE_TEST_HOOKS) */
/* The path of the attention and elementwise kernels under tk_cpu:
 * "avx512 (rope avx2)", "avx2" or "portable". */
const char *tk_cpu_vector_path(void);
/* The names of the bits of f, space separated ("none" for 0), into buf. */
void tk_cpu_names(unsigned f, char *buf, size_t n);

static inline bool tk_cpu_has(unsigned bits) { return (tk_cpu() & bits) == bits; }

#endif
