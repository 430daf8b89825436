/*
 * sampler.c - the next token from a logits vector (tide.h, "sampling"): the
 * penalties over the ids accepted, temperature, top-k, top-p, min-p and one
 * draw, in that order (transformers' order), all in double.
 *
 * Each step, exactly (w: the logits as doubles, NaN read as -inf; ids at or
 * beyond n_vocab are never read):
 *   penalties   over the window W of the last penalty_last_n ids accepted (0:
 *               all of them); for each distinct id in W, once, with c its
 *               count in W:
 *                 repetition  w = w > 0 ? w / r : w * r   (transformers, CTRL;
 *                             r = 0 or 1: off)
 *                 frequency   w -= c * f                  (OpenAI's)
 *                 presence    w -= p                      (OpenAI's)
 *               a NaN made here (inf - inf) is -inf again.
 *   greedy      temperature 0: the id of the largest w, the lowest on a tie;
 *               the steps below are skipped. Penalties still apply, as in
 *               transformers.
 *   ranking     the candidates are the ids with w > -inf, ranked by w
 *               descending, then by id ascending: a strict total order, so
 *               every cut below is deterministic. "Best" below means first in
 *               this ranking.
 *   temperature e[id] = exp((w[id] - w_max) / T): the softmax's numerators
 *               with the maximum subtracted (the maximum's is exactly 1).
 *               When w_max is +inf, e is 1 for the ids at +inf and 0 for the
 *               rest (the limit of the softmax).
 *   top-k       keep the k best candidates (k = 0 or k >= their number: all).
 *               Exactly k: a tie at the k-th logit is cut by id, where
 *               transformers keeps every id tied with the k-th. So top_k 1 is
 *               the greedy id at any temperature.
 *   top-p       (0 < top_p < 1; 0 and 1 are off, as tide.h says) with Z the
 *               sum of e over what top-k kept, ranked best first, keep the
 *               shortest prefix whose sum of e is >= top_p * Z: the
 *               smallest set of most likely ids whose renormalised
 *               probabilities sum to at least top_p, never empty.
 *               (transformers' TopPLogitsWarper removes the ascending prefix
 *               whose cumulative probability is <= 1 - top_p: the same set.)
 *               The sums are exact up to double rounding: a cut that lands
 *               within rounding of top_p * Z may fall one id either side.
 *   min-p       (min_p > 0) keep the ids whose e is >= min_p times the
 *               largest e kept, that is whose probability after temperature
 *               (renormalised over the ids kept, which leaves the ratio
 *               unchanged) is >= min_p times the most likely one's
 *               (transformers' MinPLogitsWarper). The best id always stays.
 *   draw        the kept ids in ascending id order, Z = the sum of their e in
 *               that order, u = sampler_rng_uniform() in [0, 1): the first id
 *               whose running sum of e exceeds u * Z (an id with e = 0 is
 *               never drawn; when rounding leaves the running sum <= u * Z to
 *               the end, the last id with e > 0). Every draw with temperature
 *               > 0 takes exactly one number from the generator, greedy ones
 *               none, so a seed and the same logits give the same ids on every
 *               machine with IEEE doubles and a correctly rounded exp().
 * tide_sampler_probs writes e / Z for the kept ids and 0 elsewhere: exactly
 * the distribution the draw uses. The sampler records its errors on the
 * context it was made with, which must outlive it.
 *
 * Cost per draw: O(n_vocab) for the copy, the maximum and the candidates;
 * top-k is one pass with a heap of k when k <= n_vocab / 16, else an
 * introselect (quickselect, median-of-three pivot, heapsort after 2 log2 n
 * rounds), O(n) on average; top-p is the same selection steered
 * by mass (select_mass), O(n) on average, no sort. The ids kept are put back
 * in id order by a sort when few, by a scan of the vocabulary when many. No
 * allocation: w, e, the candidates and the marks are the sampler's scratch,
 * n_vocab long each.
 *
 * The window, kept only when a penalty is on (with none, accept checks the
 * id's range and records nothing). Invariants, checked by sampler_check in
 * debug builds:
 *   S1  count[id] is the number of times id occurs in W (hist[] when
 *       penalty_last_n > 0: a ring that grows up to penalty_last_n entries,
 *       hist_head its oldest once full; all ids accepted when it is 0).
 *   S2  seen[0..n_seen) are exactly the ids with count > 0, and
 *       seen_pos[id] is id's index there (-1 when count is 0), so accept is
 *       O(1) and the penalties cost O(distinct ids in W).
 * States: EMPTY (n_seen 0) --tide_sampler_accept--> HISTORY --accept-->
 * HISTORY (the oldest id leaving once W is full) --tide_sampler_reset-->
 * EMPTY.
 */
#include "text/sampler_int.h"
#include "core/core.h"

#include <assert.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ the generator */

static uint64_t splitmix64_next(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline uint64_t rotl64(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

void sampler_rng_seed(sampler_rng *r, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64_next(&x); /* never all zero */
}

uint64_t sampler_rng_next(sampler_rng *r) {
    uint64_t *s = r->s;
    uint64_t out = rotl64(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl64(s[3], 45);
    return out;
}

double sampler_rng_uniform(sampler_rng *r) { return (double)(sampler_rng_next(r) >> 11) * 0x1.0p-53; }

/* ------------------------------------------------------------ the sampler */

struct tide_sampler {
    tide_ctx *ctx;
    tide_sampler_opts o;
    int32_t n_vocab;
    sampler_rng rng;
    bool penalised;     /* a penalty is on: the window below is kept */
    /* the window W (S1, S2) */
    int32_t *hist;      /* (hist_cap) the last ids accepted, penalty_last_n > 0 only */
    int32_t hist_cap, hist_n, hist_head;
    int64_t *count;     /* (n_vocab) */
    int32_t *seen;      /* (n_vocab) the ids with count > 0, n_seen of them */
    int32_t *seen_pos;  /* (n_vocab) */
    int32_t n_seen;
    /* scratch of one draw */
    double *w;          /* (n_vocab) penalised logits */
    double *e;          /* (n_vocab) exp((w - w_max) / T), valid for the ids in idx */
    int32_t *idx;       /* (n_vocab) candidate ids, then the ids kept */
    uint8_t *mark;      /* (n_vocab) all 0 between calls */
};

static bool rep_on(const tide_sampler_opts *o) {
    return o->repetition_penalty != 0 && o->repetition_penalty != 1;
}

#ifndef NDEBUG
static bool sampler_check(const tide_sampler *s) {
    int64_t total = 0;
    for (int32_t j = 0; j < s->n_seen; j++) {
        int32_t id = s->seen[j];
        if (id < 0 || id >= s->n_vocab || s->seen_pos[id] != j || s->count[id] <= 0) return false;
        total += s->count[id];
    }
    return s->o.penalty_last_n == 0 || total == s->hist_n;
}
#endif

/* Each bad option is named; messages start with "sampler: <option>". */
static tide_status check_opts(tide_ctx *ctx, const tide_sampler_opts *o, int32_t n_vocab) {
    if (n_vocab < 1) return tide_err(ctx, TIDE_E_INVALID, "sampler: n_vocab must be >= 1 (got %d)", (int)n_vocab);
    if (!isfinite(o->temperature) || o->temperature < 0)
        return tide_err(ctx, TIDE_E_INVALID, "sampler: temperature must be finite and >= 0 (got %g)", o->temperature);
    if (o->top_k < 0) return tide_err(ctx, TIDE_E_INVALID, "sampler: top_k must be >= 0 (got %d)", (int)o->top_k);
    if (!(o->top_p >= 0 && o->top_p <= 1))
        return tide_err(ctx, TIDE_E_INVALID, "sampler: top_p must be in [0, 1] (got %g)", o->top_p);
    if (!(o->min_p >= 0 && o->min_p <= 1))
        return tide_err(ctx, TIDE_E_INVALID, "sampler: min_p must be in [0, 1] (got %g)", o->min_p);
    if (!isfinite(o->repetition_penalty) || o->repetition_penalty < 0)
        return tide_err(ctx, TIDE_E_INVALID, "sampler: repetition_penalty must be finite and >= 0 (got %g)",
                        o->repetition_penalty);
    if (!isfinite(o->frequency_penalty))
        return tide_err(ctx, TIDE_E_INVALID, "sampler: frequency_penalty must be finite (got %g)",
                        o->frequency_penalty);
    if (!isfinite(o->presence_penalty))
        return tide_err(ctx, TIDE_E_INVALID, "sampler: presence_penalty must be finite (got %g)",
                        o->presence_penalty);
    if (o->penalty_last_n < 0)
        return tide_err(ctx, TIDE_E_INVALID, "sampler: penalty_last_n must be >= 0 (got %d)",
                        (int)o->penalty_last_n);
    return TIDE_OK;
}

tide_status tide_sampler_new(tide_ctx *ctx, const tide_sampler_opts *o, int32_t n_vocab, tide_sampler **out) {
    if (!o || !out) return tide_err(ctx, TIDE_E_INVALID, "tide_sampler_new: NULL argument");
    *out = NULL;
    TIDE_OPTS_SIZE_CHECK(ctx, tide_sampler_opts, o);
    tide_status st = check_opts(ctx, o, n_vocab);
    if (st) return st;
    tide_sampler *s = tide_calloc(1, sizeof *s);
    if (!s) return tide_err(ctx, TIDE_E_NOMEM, "sampler: out of memory");
    s->ctx = ctx;
    s->o = *o;
    s->n_vocab = n_vocab;
    s->penalised = rep_on(o) || o->frequency_penalty != 0 || o->presence_penalty != 0;
    size_t n = (size_t)n_vocab;
    s->w = tide_malloc(n * sizeof *s->w);
    s->e = tide_malloc(n * sizeof *s->e);
    s->idx = tide_malloc(n * sizeof *s->idx);
    s->mark = tide_calloc(n, 1);
    bool ok = s->w && s->e && s->idx && s->mark;
    if (ok && s->penalised) {
        s->count = tide_calloc(n, sizeof *s->count);
        s->seen = tide_malloc(n * sizeof *s->seen);
        s->seen_pos = tide_malloc(n * sizeof *s->seen_pos);
        ok = s->count && s->seen && s->seen_pos;
        if (ok)
            for (size_t i = 0; i < n; i++) s->seen_pos[i] = -1;
    }
    if (!ok) {
        tide_sampler_free(s);
        return tide_err(ctx, TIDE_E_NOMEM, "sampler: out of memory (vocabulary of %d)", (int)n_vocab);
    }
    sampler_rng_seed(&s->rng, o->seed);
    *out = s;
    return TIDE_OK;
}

void tide_sampler_free(tide_sampler *s) {
    if (!s) return;
    tide_free(s->hist);
    tide_free(s->count);
    tide_free(s->seen);
    tide_free(s->seen_pos);
    tide_free(s->w);
    tide_free(s->e);
    tide_free(s->idx);
    tide_free(s->mark);
    tide_free(s);
}

static void count_add(tide_sampler *s, int32_t id) {
    if (s->count[id]++ == 0) {
        s->seen_pos[id] = s->n_seen;
        s->seen[s->n_seen++] = id;
    }
}

static void count_drop(tide_sampler *s, int32_t id) {
    if (--s->count[id] == 0) { /* swap-remove from seen */
        int32_t j = s->seen_pos[id], last = s->seen[--s->n_seen];
        s->seen[j] = last;
        s->seen_pos[last] = j;
        s->seen_pos[id] = -1;
    }
}

tide_status tide_sampler_accept(tide_sampler *s, int32_t id) {
    if (!s) return tide_err(NULL, TIDE_E_INVALID, "tide_sampler_accept: NULL sampler");
    if (id < 0 || id >= s->n_vocab)
        return tide_err(s->ctx, TIDE_E_RANGE, "sampler: id %d outside the vocabulary [0, %d)", (int)id,
                        (int)s->n_vocab);
    if (!s->penalised) return TIDE_OK;
    int32_t last_n = s->o.penalty_last_n;
    if (last_n > 0) {
        if (s->hist_n == last_n) { /* W full: its oldest id leaves */
            count_drop(s, s->hist[s->hist_head]);
            s->hist[s->hist_head] = id;
            s->hist_head = s->hist_head + 1 == last_n ? 0 : s->hist_head + 1;
        } else {
            if (s->hist_n == s->hist_cap) { /* grows until last_n, then wraps (hist_head 0 until then) */
                int64_t cap = TIDE_MIN((int64_t)last_n, TIDE_MAX((int64_t)64, 2 * (int64_t)s->hist_cap));
                int32_t *h = tide_realloc(s->hist, (size_t)cap * sizeof *h);
                if (!h) return tide_err(s->ctx, TIDE_E_NOMEM, "sampler: out of memory (penalty window)");
                s->hist = h;
                s->hist_cap = (int32_t)cap;
            }
            s->hist[s->hist_n++] = id;
        }
    }
    count_add(s, id);
    assert(s->n_seen > 4096 || sampler_check(s));
    return TIDE_OK;
}

void tide_sampler_reset(tide_sampler *s, uint64_t seed) {
    if (!s) return;
    for (int32_t j = 0; j < s->n_seen; j++) {
        s->count[s->seen[j]] = 0;
        s->seen_pos[s->seen[j]] = -1;
    }
    s->n_seen = 0;
    s->hist_n = s->hist_head = 0;
    sampler_rng_seed(&s->rng, seed);
}

/* ------------------------------------------------------------ selection */

/* a ranks before b: the higher penalised logit, the lower id on a tie. */
static inline bool ranks_before(const double *w, int32_t a, int32_t b) {
    return w[a] > w[b] || (w[a] == w[b] && a < b);
}

static inline void swap_ids(int32_t *a, size_t i, size_t j) {
    int32_t t = a[i];
    a[i] = a[j];
    a[j] = t;
}

/* Heap whose root ranks last of all (a max-heap for "ranks later"). */
static void heap_sift(const double *w, int32_t *a, size_t n, size_t i) {
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) return;
        if (c + 1 < n && ranks_before(w, a[c], a[c + 1])) c++;
        if (!ranks_before(w, a[i], a[c])) return;
        swap_ids(a, i, c);
        i = c;
    }
}

/* Sorts a[0..n) best first (heapsort: in place, O(n log n) always). */
static void sort_best(const double *w, int32_t *a, size_t n) {
    for (size_t i = n / 2; i-- > 0;) heap_sift(w, a, n, i);
    for (size_t end = n; end-- > 1;) {
        swap_ids(a, 0, end);
        heap_sift(w, a, end, 0);
    }
}

/* Rearranges a[0..n) so that a[0..k) hold its k best ids, in no particular
 * order (introselect; k >= n: nothing to do). */
static void select_best(const double *w, int32_t *a, size_t n, size_t k) {
    if (k == 0 || k >= n) return;
    size_t lo = 0, hi = n; /* the boundary k lies in (lo, hi) */
    int depth = 0;
    for (size_t m = n; m > 1; m >>= 1) depth += 2;
    while (hi - lo > 16) {
        if (depth-- == 0) break; /* bad pivots: heapsort what is left */
        size_t mid = lo + (hi - lo) / 2, last = hi - 1;
        /* median of a[lo], a[mid], a[last] into a[last], the pivot */
        if (ranks_before(w, a[mid], a[lo])) swap_ids(a, mid, lo);
        if (ranks_before(w, a[last], a[lo])) swap_ids(a, last, lo);
        if (ranks_before(w, a[mid], a[last])) swap_ids(a, mid, last);
        int32_t pivot = a[last];
        size_t p = lo;
        for (size_t i = lo; i < last; i++)
            if (ranks_before(w, a[i], pivot)) swap_ids(a, i, p++);
        swap_ids(a, p, last); /* a[lo..p) rank before the pivot, a(p..hi) after */
        if (p == k || p + 1 == k) return;
        if (k < p) hi = p;
        else lo = p + 1;
    }
    sort_best(w, a + lo, hi - lo);
}

/* The k best ids of w[0..n) above -inf into a[0..return) (fewer when fewer
 * are above -inf), in no particular order: one pass over w with a heap of k
 * whose root ranks last, O(n + k log k log(n / k)) on average. */
static size_t heap_best(const double *w, size_t n, size_t k, int32_t *a) {
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (!(w[i] > -INFINITY)) continue;
        if (m < k) { /* sift up */
            size_t c = m++;
            a[c] = (int32_t)i;
            while (c > 0 && ranks_before(w, a[(c - 1) / 2], a[c])) {
                swap_ids(a, c, (c - 1) / 2);
                c = (c - 1) / 2;
            }
        } else if (ranks_before(w, (int32_t)i, a[0])) {
            a[0] = (int32_t)i;
            heap_sift(w, a, k, 0);
        }
    }
    return m;
}

/* The top-p cut without a full sort: rearranges a[0..n) and returns r, the
 * length of the shortest prefix of the ranking whose sum of e is >= goal (n
 * when none is), with a[0..r) holding that prefix in no particular order.
 * A quickselect whose pivot side is chosen by mass: after each partition the
 * better side is kept whole (its mass added) or searched further, O(n) on
 * average; heapsort and a walk once the range is small or the pivots bad.
 * The sums are formed per partition, so a cut within rounding of goal may
 * fall one id either side of a sequential sum's. */
static size_t select_mass(const double *w, const double *e, int32_t *a, size_t n, double goal) {
    size_t lo = 0, hi = n; /* a[0..lo) kept, their mass in acc; the cut lies in [lo, hi] */
    double acc = 0;
    int depth = 0;
    for (size_t m = n; m > 1; m >>= 1) depth += 2;
    while (hi - lo > 16 && depth-- > 0) {
        size_t mid = lo + (hi - lo) / 2, last = hi - 1;
        if (ranks_before(w, a[mid], a[lo])) swap_ids(a, mid, lo);
        if (ranks_before(w, a[last], a[lo])) swap_ids(a, last, lo);
        if (ranks_before(w, a[mid], a[last])) swap_ids(a, mid, last);
        int32_t pivot = a[last];
        size_t p = lo;
        double m = 0; /* the mass of a[lo..p) */
        for (size_t i = lo; i < last; i++)
            if (ranks_before(w, a[i], pivot)) {
                m += e[a[i]];
                swap_ids(a, i, p++);
            }
        swap_ids(a, p, last);
        if (acc + m >= goal) {
            hi = p;
        } else if (acc + m + e[pivot] >= goal) {
            return p + 1;
        } else {
            acc += m + e[pivot];
            lo = p + 1;
        }
    }
    sort_best(w, a + lo, hi - lo);
    for (size_t j = lo; j < hi; j++) {
        acc += e[a[j]];
        if (acc >= goal) return j + 1;
    }
    return hi;
}

static int cmp_id(const void *x, const void *y) {
    int32_t a = *(const int32_t *)x, b = *(const int32_t *)y;
    return (a > b) - (a < b);
}

/* The steps of the design note up to the draw: s->idx[0..*n_kept) the ids
 * kept in ascending order, s->e their weights (greedy: the argmax alone, e 1).
 * TIDE_E_INVALID when no logit is above -inf. */
static tide_status sampler_prepare(tide_sampler *s, const float *logits, int32_t *n_kept) {
    const tide_sampler_opts *o = &s->o;
    const size_t n = (size_t)s->n_vocab;
    double *w = s->w, *e = s->e;
    int32_t *idx = s->idx;
    for (size_t i = 0; i < n; i++) w[i] = isnan(logits[i]) ? -INFINITY : (double)logits[i];
    const bool rep = rep_on(o);
    for (int32_t j = 0; j < s->n_seen; j++) {
        int32_t id = s->seen[j];
        double x = w[id];
        if (rep) x = x > 0 ? x / o->repetition_penalty : x * o->repetition_penalty;
        x -= (double)s->count[id] * o->frequency_penalty;
        x -= o->presence_penalty;
        w[id] = isnan(x) ? -INFINITY : x;
    }
    size_t best = n;
    double w_max = -INFINITY;
    for (size_t i = 0; i < n; i++)
        if (w[i] > w_max) {
            w_max = w[i];
            best = i;
        }
    if (best == n)
        return tide_err(s->ctx, TIDE_E_INVALID,
                        "sampler: every logit of the %d in the vocabulary is -inf or NaN (after the penalties): "
                        "nothing to draw", (int)n);
    if (o->temperature <= 0) {
        idx[0] = (int32_t)best;
        e[best] = 1;
        *n_kept = 1;
        return TIDE_OK;
    }
    size_t nc = 0;
    bool by_id = true;
    const size_t k = (size_t)o->top_k;
    if (k > 0 && k <= n / 16) { /* a small top-k: one pass with a heap, no candidate list */
        nc = heap_best(w, n, k, idx);
        by_id = false;
    } else {
        for (size_t i = 0; i < n; i++)
            if (w[i] > -INFINITY) idx[nc++] = (int32_t)i;
        if (k > 0 && k < nc) {
            select_best(w, idx, nc, k);
            nc = k;
            by_id = false;
        }
    }
    const double T = o->temperature;
    for (size_t j = 0; j < nc; j++) {
        int32_t id = idx[j];
        e[id] = isinf(w_max) ? (w[id] == w_max ? 1.0 : 0.0) : exp((w[id] - w_max) / T);
    }
    if (o->top_p > 0 && o->top_p < 1 && nc > 1) {
        double z = 0;
        for (size_t j = 0; j < nc; j++) z += e[idx[j]];
        nc = select_mass(w, e, idx, nc, o->top_p * z);
        by_id = false;
    }
    if (o->min_p > 0) {
        double e_max = 0;
        for (size_t j = 0; j < nc; j++) e_max = TIDE_MAX(e_max, e[idx[j]]);
        const double floor_e = o->min_p * e_max;
        size_t k = 0;
        for (size_t j = 0; j < nc; j++)
            if (e[idx[j]] >= floor_e) idx[k++] = idx[j];
        nc = k;
    }
    if (!by_id && nc < n / 16) {
        qsort(idx, nc, sizeof *idx, cmp_id);
    } else if (!by_id) { /* many: mark them, then collect in id order (marks left all clear) */
        for (size_t j = 0; j < nc; j++) s->mark[idx[j]] = 1;
        size_t k = 0;
        for (size_t i = 0; i < n; i++)
            if (s->mark[i]) {
                s->mark[i] = 0;
                idx[k++] = (int32_t)i;
            }
    }
    *n_kept = (int32_t)nc;
    return TIDE_OK;
}

/* The sum of the kept ids' weights (the softmax's denominator), in id order
 * as every draw walks them. */
static double kept_sum(const tide_sampler *s, int32_t n) {
    double z = 0;
    for (int32_t j = 0; j < n; j++) z += s->e[s->idx[j]];
    return z;
}

tide_status tide_sampler_sample(tide_sampler *s, const float *logits, int32_t *id) {
    if (!s || !logits || !id)
        return tide_err(s ? s->ctx : NULL, TIDE_E_INVALID, "tide_sampler_sample: NULL argument");
    int32_t n;
    tide_status st = sampler_prepare(s, logits, &n);
    if (st) return st;
    const int32_t *idx = s->idx;
    const double *e = s->e;
    if (s->o.temperature <= 0) {
        *id = idx[0];
        return TIDE_OK;
    }
    const double target = sampler_rng_uniform(&s->rng) * kept_sum(s, n);
    double cum = 0;
    int32_t pick = -1;
    for (int32_t j = 0; j < n; j++) {
        if (e[idx[j]] == 0) continue;
        cum += e[idx[j]];
        pick = idx[j];
        if (cum > target) break;
    }
    *id = pick; /* the best id is kept and has e = 1, so pick >= 0 */
    return TIDE_OK;
}

tide_status tide_sampler_probs(tide_sampler *s, const float *logits, double *probs) {
    if (!s || !logits || !probs)
        return tide_err(s ? s->ctx : NULL, TIDE_E_INVALID, "tide_sampler_probs: NULL argument");
    int32_t n;
    tide_status st = sampler_prepare(s, logits, &n);
    if (st) return st;
    for (int32_t i = 0; i < s->n_vocab; i++) probs[i] = 0;
    const int32_t *idx = s->idx;
    const double *e = s->e;
    const double z = kept_sum(s, n);
    for (int32_t j = 0; j < n; j++) probs[idx[j]] = e[idx[j]] / z;
    return TIDE_OK;
}
