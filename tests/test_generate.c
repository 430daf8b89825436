/*
 * test_generate.c - tide_model_generate_ex on the tiny fixture checkpoint
 * (tests/fixtures/tiny-bf16-gqa), resident and offloaded:
 *
 *   - without options it is tide_model_generate (ids and logits bit for bit);
 *   - a greedy sampler (temperature 0, or top-k 1 at any temperature) draws
 *     the graph's own argmax;
 *   - a stop id ends generation after it is drawn; a callback's non-zero
 *     return ends it after that id; the callback sees every id in order;
 *   - continuation: a generation cut short, then continued from a prompt
 *     that repeats it with start_pos where the cache ends, gives the rest of
 *     the uncut generation bit for bit (the continued prefill of one token
 *     is the decode step's graph);
 *   - a seeded sampler gives the same ids run after run, resident and
 *     offloaded;
 *   - bad arguments: TIDE_E_INVALID / TIDE_E_RANGE, nothing generated;
 *   - a batch (tide_model_generate_batch): four requests of different
 *     prompts, lengths, stop ids and samplers run together give each the ids
 *     and logits (hash) of the same request run alone, on the plain engine,
 *     resident and offloaded; their decode steps share forwards; a refused
 *     request is refused alone; requests admitted while the batch runs
 *     (tide_model_generate_batch_ex) equal their runs alone too, and each
 *     is reported done as it ends, before the batch ends.
 *
 * What it proves: `tide_model_generate_ex`: without options equal to
 * `tide_model_generate` (ids and logits); greedy samplers equal to the
 * graph's argmax; stop ids and a callback end generation where they should; a
 * generation cut short and continued from the cache (`start_pos`) equal to
 * the uncut one bit for bit, greedy and sampled, resident and offloaded;
 * seeded runs repeat resident and offloaded; bad arguments; a batch
 * (`tide_model_generate_batch`) of four requests with different prompts,
 * lengths, stop ids and samplers gives each the ids and logits hash of its
 * run alone, resident, offloaded (weights on host and on SSD) and on the
 * plain engine, with decode steps shared; a refused request in the batch
 * fails alone; at a budget where only one sequence's graphs plan (found by
 * the planner in the test), a 16-request batch prefills and steps its rows
 * one at a time, each request equal to its run alone; f16 and bf16 KV
 * caches: one prefill equals a shorter prefill plus one-token steps, logits
 * bit for bit, resident and offloaded (f16 gives other logits than f32).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "cost/cost.h"
#include "planner/planner.h"
#include "tide.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { N_PROMPT = 7, N_NEW = 12 };
static const int32_t prompt[N_PROMPT] = {1, 17, 42, 250, 3, 99, 8};

typedef struct fixture {
    tide_ctx *ctx;
    tide_checkpoint *ck;
    tide_backend *be;
    tide_model *m;
} fixture;

static int setup(void **state) {
    const char *fx = getenv("TIDE_FIXTURES");
    if (!fx) {
        fprintf(stderr, "TIDE_FIXTURES is not set\n");
        return -1;
    }
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/tiny-bf16-gqa", fx);
    fixture *f = calloc(1, sizeof *f);
    f->ctx = tide_ctx_new();
    tide_ctx_set_threads(f->ctx, 2);
    if (tide_checkpoint_open(f->ctx, dir, &f->ck) || tide_backend_new(f->ctx, TIDE_BACKEND_CPU, &f->be)) {
        fprintf(stderr, "%s\n", tide_ctx_last_error(f->ctx));
        return -1;
    }
    tide_model_opts mo = {.max_batch = 1, .ctx_len = 64};
    if (tide_model_new(f->ctx, f->ck, f->be, &mo, &f->m)) return -1;
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    tide_model_free(f->m);
    tide_backend_free(f->be);
    tide_checkpoint_free(f->ck);
    tide_ctx_free(f->ctx);
    free(f);
    return 0;
}

static void set_offload(fixture *f, double fraction) {
    tide_offload_opts o = {.budget_kind = fraction > 0 ? TIDE_BUDGET_FRACTION : TIDE_BUDGET_NONE,
                           .fraction = fraction, .policy = "tide", .hw = "a100-80g"};
    assert_int_equal(tide_model_set_offload(f->m, fraction > 0 ? &o : NULL), TIDE_OK);
}

static int32_t vocab(fixture *f) { return tide_checkpoint_config(f->ck)->vocab_size; }

static void test_plain_equals_generate(void **state) {
    fixture *f = *state;
    int32_t a[N_NEW], b[N_NEW];
    tide_gen_stats sa, sb;
    int n = -1;
    assert_int_equal(tide_model_generate(f->m, prompt, N_PROMPT, N_NEW, a, &sa), TIDE_OK);
    assert_int_equal(tide_model_generate_ex(f->m, prompt, N_PROMPT, N_NEW, NULL, b, &n, &sb), TIDE_OK);
    assert_int_equal(n, N_NEW);
    assert_memory_equal(a, b, sizeof a);
    assert_true(sa.logits_hash == sb.logits_hash);
    assert_int_equal(sb.decode_tokens, N_NEW - 1);
}

static void test_greedy_sampler(void **state) {
    fixture *f = *state;
    int32_t want[N_NEW], got[N_NEW];
    assert_int_equal(tide_model_generate(f->m, prompt, N_PROMPT, N_NEW, want, NULL), TIDE_OK);
    const tide_sampler_opts cases[] = {{.temperature = 0, .seed = 3}, {.temperature = 2.5, .top_k = 1, .seed = 9}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        tide_sampler *s;
        assert_int_equal(tide_sampler_new(f->ctx, &cases[c], vocab(f), &s), TIDE_OK);
        tide_gen_opts go = {.sampler = s};
        int n = 0;
        assert_int_equal(tide_model_generate_ex(f->m, prompt, N_PROMPT, N_NEW, &go, got, &n, NULL), TIDE_OK);
        assert_int_equal(n, N_NEW);
        assert_memory_equal(got, want, sizeof want);
        tide_sampler_free(s);
    }
}

typedef struct seen {
    int32_t ids[N_NEW];
    int n, stop_after;
} seen;

static int on_token(void *user, int32_t id) {
    seen *s = user;
    s->ids[s->n++] = id;
    return s->n == s->stop_after;
}

static void test_stops(void **state) {
    fixture *f = *state;
    int32_t want[N_NEW], got[N_NEW];
    assert_int_equal(tide_model_generate(f->m, prompt, N_PROMPT, N_NEW, want, NULL), TIDE_OK);
    /* a stop id: the first occurrence of want[5] ends the generation */
    int first = 0;
    while (want[first] != want[5]) first++;
    int32_t stop[2] = {vocab(f) - 1 == want[5] ? 0 : vocab(f) - 1, want[5]};
    tide_gen_opts go = {.stop_ids = stop, .n_stop_ids = 2};
    int n = 0;
    assert_int_equal(tide_model_generate_ex(f->m, prompt, N_PROMPT, N_NEW, &go, got, &n, NULL), TIDE_OK);
    assert_true(n == first + 1 || (stop[0] != want[5] && n <= first + 1));
    assert_memory_equal(got, want, (size_t)n * sizeof *got);
    assert_true(got[n - 1] == stop[0] || got[n - 1] == stop[1]);
    /* the callback: sees each id, stops after the fourth */
    seen s = {.stop_after = 4};
    go = (tide_gen_opts){.on_token = on_token, .user = &s};
    assert_int_equal(tide_model_generate_ex(f->m, prompt, N_PROMPT, N_NEW, &go, got, &n, NULL), TIDE_OK);
    assert_int_equal(n, 4);
    assert_int_equal(s.n, 4);
    assert_memory_equal(s.ids, want, 4 * sizeof *got);
    assert_memory_equal(got, want, 4 * sizeof *got);
}

/* Cut after k ids, then continue: prompt + the k ids, start_pos at the
 * cache's end (all but the last id drawn were run). */
static void check_continuation(fixture *f, tide_sampler *smp, uint64_t seed) {
    int32_t want[N_NEW], got[N_NEW + N_PROMPT];
    tide_gen_opts go = {.sampler = smp};
    if (smp) tide_sampler_reset(smp, seed);
    int n = 0;
    assert_int_equal(tide_model_generate_ex(f->m, prompt, N_PROMPT, N_NEW, &go, want, &n, NULL), TIDE_OK);
    assert_int_equal(n, N_NEW);
    for (int k = 1; k < N_NEW; k += 4) {
        if (smp) tide_sampler_reset(smp, seed);
        assert_int_equal(tide_model_generate_ex(f->m, prompt, N_PROMPT, k, &go, got, &n, NULL), TIDE_OK);
        assert_int_equal(n, k);
        int32_t p2[N_PROMPT + N_NEW];
        memcpy(p2, prompt, sizeof prompt);
        memcpy(p2 + N_PROMPT, got, (size_t)k * sizeof *got);
        tide_gen_opts g2 = {.sampler = smp, .start_pos = N_PROMPT + k - 1};
        tide_gen_stats st;
        assert_int_equal(tide_model_generate_ex(f->m, p2, N_PROMPT + k, N_NEW - k, &g2, got + k, &n, &st), TIDE_OK);
        assert_int_equal(n, N_NEW - k);
        assert_int_equal(st.prefill_tokens, 1);
        assert_memory_equal(got, want, sizeof want);
    }
}

static void test_continuation(void **state) {
    fixture *f = *state;
    check_continuation(f, NULL, 0);
    tide_sampler *s;
    tide_sampler_opts so = {.temperature = 1.3, .top_p = 0.95, .seed = 5};
    assert_int_equal(tide_sampler_new(f->ctx, &so, vocab(f), &s), TIDE_OK);
    /* the sampler continues its own stream: the ids drawn in the cut run
     * moved it exactly as far as the uncut run had moved it */
    check_continuation(f, s, 5);
    set_offload(f, 0.5);
    check_continuation(f, NULL, 0);
    check_continuation(f, s, 5);
    set_offload(f, 0);
    tide_sampler_free(s);
}

static void test_seeded(void **state) {
    fixture *f = *state;
    tide_sampler *s;
    tide_sampler_opts so = {.temperature = 1.0, .top_k = 50, .repetition_penalty = 1.2, .seed = 77};
    assert_int_equal(tide_sampler_new(f->ctx, &so, vocab(f), &s), TIDE_OK);
    int32_t a[N_NEW], b[N_NEW], c[N_NEW];
    tide_gen_opts go = {.sampler = s};
    int n;
    for (int i = 0; i < N_PROMPT; i++) assert_int_equal(tide_sampler_accept(s, prompt[i]), TIDE_OK);
    assert_int_equal(tide_model_generate_ex(f->m, prompt, N_PROMPT, N_NEW, &go, a, &n, NULL), TIDE_OK);
    tide_sampler_reset(s, 77);
    for (int i = 0; i < N_PROMPT; i++) tide_sampler_accept(s, prompt[i]);
    assert_int_equal(tide_model_generate_ex(f->m, prompt, N_PROMPT, N_NEW, &go, b, &n, NULL), TIDE_OK);
    assert_memory_equal(a, b, sizeof a);
    set_offload(f, 0.5);
    tide_sampler_reset(s, 77);
    for (int i = 0; i < N_PROMPT; i++) tide_sampler_accept(s, prompt[i]);
    assert_int_equal(tide_model_generate_ex(f->m, prompt, N_PROMPT, N_NEW, &go, c, &n, NULL), TIDE_OK);
    assert_memory_equal(a, c, sizeof a);
    set_offload(f, 0);
    tide_sampler_free(s);
}

static void test_bad_arguments(void **state) {
    fixture *f = *state;
    int32_t out[N_NEW];
    int n = 99;
    tide_gen_opts go = {.start_pos = N_PROMPT};
    assert_int_equal(tide_model_generate_ex(f->m, prompt, N_PROMPT, 4, &go, out, &n, NULL), TIDE_E_INVALID);
    assert_int_equal(n, 0);
    go = (tide_gen_opts){.n_stop_ids = 2};
    assert_int_equal(tide_model_generate_ex(f->m, prompt, N_PROMPT, 4, &go, out, &n, NULL), TIDE_E_INVALID);
    assert_int_equal(tide_model_generate_ex(f->m, prompt, 0, 4, NULL, out, &n, NULL), TIDE_E_INVALID);
    assert_int_equal(tide_model_generate_ex(f->m, prompt, N_PROMPT, 64, NULL, out, &n, NULL), TIDE_E_RANGE);
    int32_t bad[2] = {1, vocab(f)};
    assert_int_equal(tide_model_generate_ex(f->m, bad, 2, 1, NULL, out, &n, NULL), TIDE_E_RANGE);
}

/* ---------------------------------------------------------------- batches */

enum { NB = 4, NB_NEW = 12 };

typedef struct breq {
    int32_t prompt[16];
    int n_prompt, max_new;
    int32_t stop;       /* -1: none */
    uint64_t seed;      /* 0: greedy */
} breq;

static const breq batch_reqs[NB] = {
    {{1, 17, 42, 250, 3, 99, 8}, 7, 12, -1, 0},
    {{5, 6, 7}, 3, 3, -1, 0},
    {{9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20}, 12, 8, -1, 31},
    {{200, 100, 50, 25, 12}, 5, 12, -1, 0},
};

/* Runs request r alone (its own sampler when seeded) into out, n, hash. */
static void run_alone(fixture *f, tide_model *m, const breq *r, int32_t stop, int32_t *out, int *n, uint64_t *hash) {
    tide_sampler *smp = NULL;
    if (r->seed) {
        tide_sampler_opts so = {.temperature = 1.0, .top_k = 20, .seed = r->seed};
        assert_int_equal(tide_sampler_new(f->ctx, &so, vocab(f), &smp), TIDE_OK);
        for (int i = 0; i < r->n_prompt; i++) assert_int_equal(tide_sampler_accept(smp, r->prompt[i]), TIDE_OK);
    }
    tide_gen_opts go = {.sampler = smp, .stop_ids = &stop, .n_stop_ids = stop >= 0};
    tide_gen_stats gs;
    assert_int_equal(tide_model_generate_ex(m, r->prompt, r->n_prompt, r->max_new, &go, out, n, &gs), TIDE_OK);
    assert_int_equal(gs.batch, 1);
    *hash = gs.logits_hash;
    tide_sampler_free(smp);
}

/* The batch of batch_reqs (request 3 stopping at stop3, request `bad` given
 * an id outside the vocabulary) against each run alone. */
static void check_batch(fixture *f, tide_model *m, int32_t stop3, int bad) {
    int32_t want[NB][NB_NEW], got[NB][NB_NEW];
    int want_n[NB];
    uint64_t want_h[NB];
    int32_t stops[NB] = {-1, -1, -1, stop3};
    for (int i = 0; i < NB; i++)
        if (i != bad) run_alone(f, m, &batch_reqs[i], stops[i], want[i], &want_n[i], &want_h[i]);
    tide_sampler *smp[NB] = {0};
    tide_gen_opts go[NB];
    tide_gen_request rq[NB];
    breq local[NB];
    memcpy(local, batch_reqs, sizeof local);
    if (bad >= 0) local[bad].prompt[0] = vocab(f);
    for (int i = 0; i < NB; i++) {
        if (local[i].seed) {
            tide_sampler_opts so = {.temperature = 1.0, .top_k = 20, .seed = local[i].seed};
            assert_int_equal(tide_sampler_new(f->ctx, &so, vocab(f), &smp[i]), TIDE_OK);
            for (int t = 0; t < local[i].n_prompt; t++) tide_sampler_accept(smp[i], local[i].prompt[t]);
        }
        go[i] = (tide_gen_opts){.sampler = smp[i], .stop_ids = &stops[i], .n_stop_ids = stops[i] >= 0};
        rq[i] = (tide_gen_request){.prompt = local[i].prompt, .n_prompt = local[i].n_prompt,
                                   .max_new = local[i].max_new, .opts = &go[i], .out_tokens = got[i]};
    }
    tide_gen_stats bs;
    tide_status st = tide_model_generate_batch(m, rq, NB, &bs);
    assert_int_equal(st, bad >= 0 ? TIDE_E_RANGE : TIDE_OK);
    assert_int_equal(bs.batch, bad >= 0 ? NB - 1 : NB);
    assert_true(bs.batch_steps > 0); /* some steps advanced several requests at once */
    for (int i = 0; i < NB; i++) {
        tide_sampler_free(smp[i]);
        if (i == bad) {
            assert_int_equal(rq[i].status, TIDE_E_RANGE);
            assert_int_equal(rq[i].n_out, 0);
            continue;
        }
        assert_int_equal(rq[i].status, TIDE_OK);
        assert_int_equal(rq[i].n_out, want_n[i]);
        assert_memory_equal(got[i], want[i], (size_t)want_n[i] * sizeof(int32_t));
        assert_true(rq[i].stats.logits_hash == want_h[i]);
        assert_int_equal(rq[i].stats.decode_tokens, want_n[i] > 1 ? want_n[i] - 1 : 0);
    }
}

/* Hooks of a batch: admits request k before step k_at[k], records the
 * order in which requests end. */
typedef struct join_state {
    tide_gen_request *rq;
    int next, steps, n_done;
    int at[NB];          /* admit request i before the at[i]-th admit call */
    int done_order[NB];
    int calls;
} join_state;

static int join_admit(void *user, tide_gen_request **req) {
    join_state *j = user;
    j->calls++;
    if (j->next < NB && j->calls >= j->at[j->next]) {
        *req = &j->rq[j->next++];
        return 1;
    }
    return 0;
}

static void join_done(void *user, tide_gen_request *req) {
    join_state *j = user;
    assert_true(req->n_out >= 1 && req->status == TIDE_OK);
    j->done_order[j->n_done++] = (int)(req - j->rq);
}

/* A batch of NB requests (no stop ids) and their runs alone. */
typedef struct batch_case {
    int32_t want[NB][NB_NEW], got[NB][NB_NEW];
    int want_n[NB];
    uint64_t want_h[NB];
    tide_sampler *smp[NB];
    tide_gen_opts go[NB];
    tide_gen_request rq[NB];
} batch_case;

/* Runs each of reqs alone, then sets c up to run them as a batch (their own
 * samplers seeded again). */
static void case_make(fixture *f, tide_model *m, const breq *reqs, batch_case *c) {
    memset(c, 0, sizeof *c);
    for (int i = 0; i < NB; i++) run_alone(f, m, &reqs[i], -1, c->want[i], &c->want_n[i], &c->want_h[i]);
    for (int i = 0; i < NB; i++) {
        if (reqs[i].seed) {
            tide_sampler_opts so = {.temperature = 1.0, .top_k = 20, .seed = reqs[i].seed};
            assert_int_equal(tide_sampler_new(f->ctx, &so, vocab(f), &c->smp[i]), TIDE_OK);
            for (int t = 0; t < reqs[i].n_prompt; t++) tide_sampler_accept(c->smp[i], reqs[i].prompt[t]);
        }
        c->go[i] = (tide_gen_opts){.sampler = c->smp[i]};
        c->rq[i] = (tide_gen_request){.prompt = reqs[i].prompt, .n_prompt = reqs[i].n_prompt,
                                      .max_new = reqs[i].max_new, .opts = &c->go[i], .out_tokens = c->got[i]};
    }
}

/* Each request of the batch equal to its run alone (ids and logits). */
static void case_check(batch_case *c) {
    for (int i = 0; i < NB; i++) {
        assert_int_equal(c->rq[i].status, TIDE_OK);
        assert_int_equal(c->rq[i].n_out, c->want_n[i]);
        assert_memory_equal(c->got[i], c->want[i], (size_t)c->want_n[i] * sizeof(int32_t));
        assert_true(c->rq[i].stats.logits_hash == c->want_h[i]);
        tide_sampler_free(c->smp[i]);
    }
}

static void check_join(fixture *f, tide_model *m) {
    batch_case *c = malloc(sizeof *c);
    case_make(f, m, batch_reqs, c);
    /* request 0 starts alone; 1 joins before the first step, 2 and 3 later */
    join_state j = {.rq = c->rq, .next = 1, .at = {0, 1, 3, 5}};
    tide_batch_hooks h = {.admit = join_admit, .done = join_done, .user = &j};
    tide_gen_stats bs;
    assert_int_equal(tide_model_generate_batch_ex(m, c->rq, 1, &h, &bs), TIDE_OK);
    assert_int_equal(bs.batch, NB);
    assert_true(bs.batch_steps > 0);
    assert_int_equal(j.n_done, NB);
    assert_int_equal(j.done_order[0], 1); /* 3 new tokens: ends first */
    case_check(c);
    free(c);
}

/* Prompts of one length, prefilled together as one forward (and a
 * sampled one among them): each equal to its run alone. */
static void check_same_length(fixture *f, tide_model *m) {
    breq same[NB];
    for (int i = 0; i < NB; i++) {
        same[i] = (breq){.n_prompt = 6, .max_new = 4 + 2 * i, .stop = -1, .seed = i == 2 ? 5 : 0};
        for (int t = 0; t < 6; t++) same[i].prompt[t] = (int32_t)(1 + 37 * i + 11 * t) % vocab(f);
    }
    batch_case *c = malloc(sizeof *c);
    case_make(f, m, same, c);
    tide_gen_stats bs;
    assert_int_equal(tide_model_generate_batch(m, c->rq, NB, &bs), TIDE_OK);
    /* one prefill of the four, then max_new - 1 = 9 decode steps of which
     * all but the last two advance several rows */
    assert_int_equal(bs.batch_steps, 1 + 7);
    case_check(c);
    free(c);
}

/* The smallest untiled budget of the fixture's graph of (B, T) as an
 * offloaded model on the CPU plans it (policy tide, host homes in place). */
static uint64_t graph_min(fixture *f, int B, int T, bool fresh, bool row_pos) {
    tide_llama_graph_opts go = {.batch = B, .seq = T, .ctx_len = 64, .fresh_cache = fresh, .row_pos = row_pos};
    tide_graph *g = NULL;
    assert_int_equal(tide_llama_build(f->ctx, tide_checkpoint_config(f->ck), &go, &g), TIDE_OK);
    tide_hw hw;
    assert_int_equal(tide_hw_load(f->ctx, "a100-80g", &hw), TIDE_OK);
    tide_plan_opts po = {.policy = TIDE_POLICY_TIDE, .n_iter = 1, .hw = &hw, .host_addressable = true};
    uint64_t b = 0;
    assert_int_equal(tide_plan_min_budget(f->ctx, g, &po, &b), TIDE_OK);
    tide_graph_free(g);
    return b;
}

/* A budget where one sequence's graphs plan but the batch's do not (the
 * least for a 3-token prompt and one decode row, below a 16-row decode
 * step's and a prefill of 16 prompts', untiled): the batch prefills and
 * steps its rows one at a time, each as alone. */
static void test_batch_rows_alone(void **state) {
    fixture *f = *state;
    enum { NQ = 16 };
    uint64_t one = graph_min(f, 1, 3, true, false), dec1 = graph_min(f, 1, 1, false, false);
    one = one > dec1 ? one : dec1;
    assert_true(graph_min(f, NQ, 1, false, true) > one);
    assert_true(graph_min(f, NQ, 3, true, false) > one);
    tide_model *m = NULL;
    tide_model_opts mo = {.max_batch = NQ, .ctx_len = 64};
    assert_int_equal(tide_model_new(f->ctx, f->ck, f->be, &mo, &m), TIDE_OK);
    tide_offload_opts o = {.budget_kind = TIDE_BUDGET_BYTES, .bytes = one, .policy = "tide", .hw = "a100-80g",
                           .tile = -1};
    assert_int_equal(tide_model_set_offload(m, &o), TIDE_OK);
    int32_t prompt[NQ][3], want[NQ][8], got[NQ][8];
    int want_n[NQ];
    uint64_t want_h[NQ];
    tide_gen_request rq[NQ];
    for (int i = 0; i < NQ; i++) {
        for (int t = 0; t < 3; t++) prompt[i][t] = (int32_t)(3 + 19 * i + 5 * t) % vocab(f);
        tide_gen_stats gs;
        assert_int_equal(tide_model_generate_ex(m, prompt[i], 3, 2 + i % 6, NULL, want[i], &want_n[i], &gs), TIDE_OK);
        want_h[i] = gs.logits_hash;
        rq[i] = (tide_gen_request){.prompt = prompt[i], .n_prompt = 3, .max_new = 2 + i % 6, .out_tokens = got[i]};
    }
    tide_gen_stats bs;
    assert_int_equal(tide_model_generate_batch(m, rq, NQ, &bs), TIDE_OK);
    assert_int_equal(bs.batch, NQ);
    assert_int_equal(bs.batch_steps, 0); /* no forward of several rows planned here */
    for (int i = 0; i < NQ; i++) {
        assert_int_equal(rq[i].n_out, want_n[i]);
        assert_memory_equal(got[i], want[i], (size_t)want_n[i] * sizeof(int32_t));
        assert_true(rq[i].stats.logits_hash == want_h[i]);
    }
    tide_model_free(m);
}

static void test_batch(void **state) {
    fixture *f = *state;
    tide_model *m = NULL;
    tide_model_opts mo = {.max_batch = NB, .ctx_len = 64};
    assert_int_equal(tide_model_new(f->ctx, f->ck, f->be, &mo, &m), TIDE_OK);
    /* request 3's id at step 6, as a stop id: it ends there in the batch too */
    int32_t ids[NB_NEW];
    int n = 0;
    uint64_t h;
    run_alone(f, m, &batch_reqs[3], -1, ids, &n, &h);
    int32_t stop3 = ids[6];
    check_batch(f, m, -1, -1);
    check_batch(f, m, stop3, -1);
    check_batch(f, m, -1, 1);
    check_join(f, m);
    check_same_length(f, m);
    tide_offload_opts o = {.budget_kind = TIDE_BUDGET_FRACTION, .fraction = 0.5, .policy = "tide", .hw = "a100-80g"};
    assert_int_equal(tide_model_set_offload(m, &o), TIDE_OK);
    check_batch(f, m, stop3, -1);
    check_join(f, m);
    check_same_length(f, m);
    o.weights_on_ssd = true;
    o.fraction = 0.35;
    assert_int_equal(tide_model_set_offload(m, &o), TIDE_OK);
    check_batch(f, m, -1, -1);
    assert_int_equal(tide_model_set_offload(m, NULL), TIDE_OK);
    assert_int_equal(tide_model_set_engine(m, TIDE_ENGINE_PLAIN), TIDE_OK);
    check_batch(f, m, stop3, 2);
    /* refusals of the batch itself */
    tide_gen_request rq[NB + 1] = {0};
    assert_int_equal(tide_model_generate_batch(m, rq, NB + 1, NULL), TIDE_E_INVALID);
    assert_int_equal(tide_model_generate_batch(m, rq, 0, NULL), TIDE_E_INVALID);
    tide_gen_opts cont = {.start_pos = 2};
    int32_t out[4];
    rq[0] = (tide_gen_request){.prompt = batch_reqs[0].prompt, .n_prompt = 7, .max_new = 4, .opts = &cont,
                               .out_tokens = out};
    assert_int_equal(tide_model_generate_batch(m, rq, 1, NULL), TIDE_E_INVALID);
    assert_int_equal(rq[0].status, TIDE_E_INVALID);
    tide_model_free(m);
}

/* KV cache types (f32, f16, bf16; this fixture's head_dim 16 takes no q8_0):
 * one prefill of the whole prompt and a prefill of its first tokens followed
 * by one-token steps give the same logits for every position, bit for bit,
 * resident and offloaded: each step reads every position from the cache,
 * rounded to its type, its own included. An f16 cache gives other logits than
 * an f32 one (it rounds). */
static void cache_type_logits(fixture *f, tide_dtype dt, double fraction, float *whole) {
    const int32_t V = vocab(f), P = 3;
    tide_model_opts mo = {.max_batch = 1, .ctx_len = 64, .cache_dtype = dt};
    tide_model *m = NULL;
    assert_int_equal(tide_model_new(f->ctx, f->ck, f->be, &mo, &m), TIDE_OK);
    tide_offload_opts o = {.budget_kind = TIDE_BUDGET_FRACTION, .fraction = fraction, .policy = "tide",
                           .hw = "a100-80g"};
    if (fraction > 0) assert_int_equal(tide_model_set_offload(m, &o), TIDE_OK);
    float *parts = malloc((size_t)N_PROMPT * V * sizeof(float));
    assert_non_null(parts);
    assert_int_equal(tide_model_forward(m, prompt, 1, N_PROMPT, 0, whole), TIDE_OK);
    assert_int_equal(tide_model_forward(m, prompt, 1, P, 0, parts), TIDE_OK);
    for (int t = P; t < N_PROMPT; t++)
        assert_int_equal(tide_model_forward(m, prompt + t, 1, 1, t, parts + (size_t)t * V), TIDE_OK);
    for (int t = 0; t < N_PROMPT; t++)
        if (memcmp(whole + (size_t)t * V, parts + (size_t)t * V, (size_t)V * sizeof(float)))
            fail_msg("%s cache (offload %.2f): position %d differs between one prefill and prefill + steps",
                     tide_dtype_name(dt), fraction, t);
    free(parts);
    tide_model_free(m);
}

static void test_cache_types(void **state) {
    fixture *f = *state;
    const size_t n = (size_t)N_PROMPT * (size_t)vocab(f);
    float *l[3];
    static const tide_dtype dts[3] = {TIDE_F32, TIDE_F16, TIDE_BF16};
    for (int i = 0; i < 3; i++) {
        l[i] = malloc(n * sizeof(float));
        assert_non_null(l[i]);
        cache_type_logits(f, dts[i], 0, l[i]);
        cache_type_logits(f, dts[i], 0.5, l[i]);
    }
    assert_true(memcmp(l[0], l[1], n * sizeof(float)) != 0);
    for (int i = 0; i < 3; i++) free(l[i]);
    /* a type a cache cannot have, and q8_0 with head_dim 16: refused */
    tide_model *m = NULL;
    tide_model_opts bad = {.max_batch = 1, .ctx_len = 64, .cache_dtype = TIDE_Q4_0};
    assert_int_equal(tide_model_new(f->ctx, f->ck, f->be, &bad, &m), TIDE_E_INVALID);
    assert_non_null(strstr(tide_ctx_last_error(f->ctx), "q4_0"));
    bad.cache_dtype = TIDE_Q8_0;
    assert_int_equal(tide_model_new(f->ctx, f->ck, f->be, &bad, &m), TIDE_E_INVALID);
    assert_non_null(strstr(tide_ctx_last_error(f->ctx), "multiple of 32"));
    assert_null(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plain_equals_generate), cmocka_unit_test(test_greedy_sampler),
        cmocka_unit_test(test_stops),                 cmocka_unit_test(test_continuation),
        cmocka_unit_test(test_seeded),                cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_batch),                 cmocka_unit_test(test_batch_rows_alone),
        cmocka_unit_test(test_cache_types),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
