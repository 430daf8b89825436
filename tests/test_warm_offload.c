/*
 * test_warm_offload.c - offloaded runs that keep some weights warm in the
 * arena across runs (runtime/place.c choose_warm), on the tiny fixture
 * (tests/fixtures/tiny-bf16-gqa):
 *
 *   - on a device (the CUDA backend, or the emulated GPU when linked with
 *     it, else the cpu-async double of tests/async_backend.h taking the GPU
 *     paths) and on the CPU with the weights on SSD, two requests in turn
 *     (each a prefill and decode steps, every plan verified by its runner)
 *     give the unconstrained run's tokens and logits bit for bit, with
 *     weights warm and with none (tide_offload_opts.no_warm);
 *   - the warm runs move fewer bytes (host->device on a device, SSD reads on
 *     the CPU) than the cold ones, by the warm weights once per run (within
 *     the alignment each warm tensor rounds up to);
 *   - at the minimum budget nothing is warm and the bytes moved are the cold
 *     run's exactly;
 *   - the baselines keep nothing warm;
 *   - a prefill alone is predicted no slower with the warm weights chosen
 *     than with none (test_prefill_alone).
 *
 * What it proves: offloaded runs with warm weights, on a device (CUDA, or the
 * asynchronous test double taking the GPU paths) and on the CPU with the
 * weights on SSD: two requests (prefill and decode steps) bit-identical to
 * the unconstrained run with warm weights and without; the bytes moved fall
 * by the warm bytes once per graph run; at the minimum budget nothing is warm
 * and the bytes are the cold run's; static-layer keeps nothing warm; warm
 * weights leave room for the longest prompt: on the CPU with weights on SSD
 * and no tiling, at 8 budgets from a whole-context prompt's minimum to twice
 * it, a short request and then one of the whole context both run with the
 * unconstrained tokens (the warm region once took the room the long prompt
 * needed).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "async_backend.h"
#include "backend/backend.h"
#include "runtime/tiling.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* tokens each request generates: fewer on the emulated GPU, where every
 * kernel runs one emulated thread at a time (tests/emu/backend_emu.cmake) */
#ifndef WARM_N_NEW
#define WARM_N_NEW 10
#endif
enum { N_PROMPT = 7, N_NEW = WARM_N_NEW, N_REQ = 2 };
static const int32_t prompt[N_REQ][N_PROMPT] = {{1, 17, 42, 250, 3, 99, 8}, {5, 6, 7, 8, 9, 10, 11}};
static char fx_dir[4096], ssd_dir[64];

/* What N_REQ requests gave: tokens, logits hashes and summed counters. */
typedef struct outcome {
    int32_t tok[N_REQ][N_NEW];
    uint64_t hash[N_REQ];
    uint64_t moved;       /* bytes_h2d + bytes_ssd_read over every request */
    uint64_t warm;        /* warm_weight_bytes of the last request */
    int runs;             /* graphs run: a prefill and N_NEW - 1 decode steps each */
} outcome;

static tide_backend *device_new(tide_ctx *ctx) {
    tide_backend *be = NULL;
    if (tide_backend_new(ctx, TIDE_BACKEND_CUDA, &be) != TIDE_OK) {
        tide_err_clear(ctx);
        tide_async_opts ao = {.jitter_us = 20, .seed = 9, .device_is_host = false};
        assert_int_equal(tide_async_backend_new(ctx, &ao, &be), TIDE_OK);
    }
    assert_false(be->vt->device_is_host);
    return be;
}

/* N_REQ requests on a fresh model on the device (cpu false) or the CPU,
 * offloaded under o (NULL: unconstrained). */
static outcome run_requests(bool cpu, const tide_offload_opts *o) {
    tide_ctx *ctx = tide_ctx_new();
    tide_ctx_set_threads(ctx, 2);
    tide_checkpoint *ck = NULL;
    tide_backend *be = NULL;
    tide_model *m = NULL;
    assert_int_equal(tide_checkpoint_open(ctx, fx_dir, &ck), TIDE_OK);
    if (cpu) assert_int_equal(tide_backend_new(ctx, TIDE_BACKEND_CPU, &be), TIDE_OK);
    else be = device_new(ctx);
    tide_model_opts mo = {.max_batch = 1, .ctx_len = 64};
    assert_int_equal(tide_model_new(ctx, ck, be, &mo, &m), TIDE_OK);
    if (o && tide_model_set_offload(m, o)) fail_msg("set_offload: %s", tide_ctx_last_error(ctx));
    outcome r;
    memset(&r, 0, sizeof r);
    for (int q = 0; q < N_REQ; q++) {
        tide_gen_opts go = {0};
        tide_gen_stats s;
        int n = 0;
        if (tide_model_generate_ex(m, prompt[q], N_PROMPT, N_NEW, &go, r.tok[q], &n, &s))
            fail_msg("%s, request %d: %s", cpu ? "cpu" : tide_backend_name(be), q, tide_ctx_last_error(ctx));
        assert_int_equal(n, N_NEW);
        r.hash[q] = s.logits_hash;
        r.moved += s.bytes_h2d + s.bytes_ssd_read;
        r.warm = s.warm_weight_bytes;
        r.runs += N_NEW;
    }
    tide_model_free(m);
    tide_backend_free(be);
    tide_checkpoint_free(ck);
    tide_ctx_free(ctx);
    return r;
}

static tide_offload_opts offload(bool cpu, tide_budget_kind kind, double fraction, const char *policy, bool no_warm) {
    return (tide_offload_opts){.budget_kind = kind, .fraction = fraction, .policy = policy, .hw = "a100-80g",
                               .weights_on_ssd = cpu, .ssd_dirs = ssd_dir, .no_warm = no_warm};
}

static void same_output(const outcome *want, const outcome *got, const char *what) {
    for (int q = 0; q < N_REQ; q++) {
        if (memcmp(want->tok[q], got->tok[q], sizeof want->tok[q]))
            fail_msg("%s: request %d's tokens differ from the unconstrained run's", what, q);
        if (want->hash[q] != got->hash[q])
            fail_msg("%s: request %d's logits differ from the unconstrained run's", what, q);
    }
}

static void check_backend(bool cpu) {
    const char *dev = cpu ? "cpu, weights on SSD" : "device";
    outcome ref = run_requests(cpu, NULL);
    tide_offload_opts wo = offload(cpu, TIDE_BUDGET_FRACTION, 0.5, "tide", false);
    tide_offload_opts co = offload(cpu, TIDE_BUDGET_FRACTION, 0.5, "tide", true);
    outcome warm = run_requests(cpu, &wo), cold = run_requests(cpu, &co);
    same_output(&ref, &warm, "warm weights");
    same_output(&ref, &cold, "no warm weights");
    if (!warm.warm) fail_msg("%s: half the peak keeps no weight warm", dev);
    assert_int_equal(cold.warm, 0);
    /* every run reads every weight once: each warm byte is a byte not moved
     * per run, but for the rounding of each warm tensor up to TIDE_PLAN_ALIGN
     * (4 KiB), which the fixture's tensors (tens of KiB) keep under a tenth */
    uint64_t saved = cold.moved > warm.moved ? cold.moved - warm.moved : 0;
    uint64_t floor = (uint64_t)warm.runs * (warm.warm / 10 * 9), ceil = (uint64_t)warm.runs * warm.warm;
    print_message("    %s: warm %llu bytes; moved %llu cold, %llu warm over %d runs\n", dev,
                  (unsigned long long)warm.warm, (unsigned long long)cold.moved, (unsigned long long)warm.moved,
                  warm.runs);
    if (saved < floor || saved > ceil)
        fail_msg("%s: %llu warm bytes saved %llu bytes over %d runs, not within [%llu, %llu]", dev,
                 (unsigned long long)warm.warm, (unsigned long long)saved, warm.runs, (unsigned long long)floor,
                 (unsigned long long)ceil);
    assert_true(saved > 0);
    /* at the minimum budget there is no room to keep anything */
    tide_offload_opts mw = offload(cpu, TIDE_BUDGET_MIN, 0, "tide", false);
    tide_offload_opts mc = offload(cpu, TIDE_BUDGET_MIN, 0, "tide", true);
    outcome minw = run_requests(cpu, &mw), minc = run_requests(cpu, &mc);
    same_output(&ref, &minw, "minimum budget");
    assert_int_equal(minw.warm, 0);
    assert_int_equal(minw.moved, minc.moved);
    /* the baselines keep nothing warm */
    tide_offload_opts so = offload(cpu, TIDE_BUDGET_FRACTION, 0.9, "static-layer", false);
    outcome st = run_requests(cpu, &so);
    same_output(&ref, &st, "static-layer");
    assert_int_equal(st.warm, 0);
}

/* Warm weights leave room for the longest prompt: on the CPU with the
 * weights on SSD, untiled (as a pool runs its models), at budgets from the
 * minimum of a whole-context prompt up to twice it, a short request first
 * (it chooses the warm weights) and then one of the whole context: both
 * run, with the unconstrained run's tokens. */
static void test_room_for_longest(void **state) {
    (void)state;
    enum { CTX = 64, LONG = CTX - 4 };
    tide_ctx *ctx = tide_ctx_new();
    tide_ctx_set_threads(ctx, 2);
    tide_checkpoint *ck = NULL;
    assert_int_equal(tide_checkpoint_open(ctx, fx_dir, &ck), TIDE_OK);
    tide_hw hw;
    assert_int_equal(tide_hw_load(ctx, "a100-80g", &hw), TIDE_OK);
    tide_llama_graph_opts lo = {.batch = 1, .seq = CTX, .ctx_len = CTX, .fresh_cache = true};
    tide_graph *g = NULL;
    assert_int_equal(tide_llama_build(ctx, tide_checkpoint_config(ck), &lo, &g), TIDE_OK);
    tide_plan_opts po = {.policy = TIDE_POLICY_TIDE, .n_iter = 1, .hw = &hw, .weights_on_ssd = true,
                         .host_addressable = true};
    uint64_t min = 0;
    assert_int_equal(tide_plan_min_budget(ctx, g, &po, &min), TIDE_OK);
    tide_graph_free(g);
    int32_t longp[LONG], ref[N_NEW], got[N_NEW];
    for (int i = 0; i < LONG; i++) longp[i] = (int32_t)((i * 37 + 11) % 200);
    tide_backend *be = NULL;
    assert_int_equal(tide_backend_new(ctx, TIDE_BACKEND_CPU, &be), TIDE_OK);
    tide_model_opts mo = {.max_batch = 1, .ctx_len = CTX};
    tide_model *m = NULL;
    assert_int_equal(tide_model_new(ctx, ck, be, &mo, &m), TIDE_OK);
    int n = 0;
    assert_int_equal(tide_model_generate_ex(m, longp, LONG, 4, NULL, ref, &n, NULL), TIDE_OK);
    tide_model_free(m);
    int warm_runs = 0;
    for (uint64_t b = min; b <= 2 * min; b += min / 8 / 4096 * 4096 + 4096) {
        tide_offload_opts o = {.budget_kind = TIDE_BUDGET_BYTES, .bytes = b, .policy = "tide", .hw = "a100-80g",
                               .weights_on_ssd = true, .ssd_dirs = ssd_dir, .tile = TIDE_TILE_NONE};
        assert_int_equal(tide_model_new(ctx, ck, be, &mo, &m), TIDE_OK);
        if (tide_model_set_offload(m, &o)) fail_msg("set_offload: %s", tide_ctx_last_error(ctx));
        tide_gen_stats s;
        if (tide_model_generate_ex(m, prompt[0], N_PROMPT, 2, NULL, got, &n, &s))
            fail_msg("%llu bytes, short request: %s", (unsigned long long)b, tide_ctx_last_error(ctx));
        warm_runs += s.warm_weight_bytes > 0;
        if (tide_model_generate_ex(m, longp, LONG, 4, NULL, got, &n, &s))
            fail_msg("%llu bytes (the whole context's minimum %llu), the whole context after a short request: %s",
                     (unsigned long long)b, (unsigned long long)min, tide_ctx_last_error(ctx));
        assert_int_equal(n, 4);
        assert_memory_equal(got, ref, 4 * sizeof *ref);
        tide_model_free(m);
    }
    print_message("    whole-context minimum %llu bytes; weights kept warm at %d of the budgets tried\n",
                  (unsigned long long)min, warm_runs);
    assert_true(warm_runs > 0);
    tide_backend_free(be);
    tide_checkpoint_free(ck);
    tide_ctx_free(ctx);
}

/* A prefill alone (one new token: no decode step after it) keeps weights
 * warm only where that makes the prefill itself faster: on the device, at
 * budgets from the minimum to the unconstrained peak, a whole-context prompt
 * with max_new 1 is predicted no slower with the warm weights chosen than
 * with none (tide_offload_opts.no_warm), and gives the same token. The warm
 * region is chosen by the prompt and the generation's own decode steps;
 * priced with 32 decode steps, as it was, a region that saved the decode
 * steps' loads could cost the prompt its room (a GPU bench's 4-layer
 * llama-7b prefill at half its peak ran 3x slower than with none). */
static void test_prefill_alone(void **state) {
    (void)state;
    enum { CTX = 64, LONG = CTX };
    tide_ctx *ctx = tide_ctx_new();
    tide_ctx_set_threads(ctx, 2);
    tide_checkpoint *ck = NULL;
    assert_int_equal(tide_checkpoint_open(ctx, fx_dir, &ck), TIDE_OK);
    tide_backend *be = device_new(ctx);
    int32_t longp[LONG];
    for (int i = 0; i < LONG; i++) longp[i] = (int32_t)((i * 53 + 7) % 200);
    tide_model_opts mo = {.max_batch = 1, .ctx_len = CTX};
    int checked = 0, warm_kept = 0;
    for (int f = 1; f <= 10; f++) {
        double pred[2] = {0, 0};
        int32_t tok[2] = {-1, -2};
        uint64_t warm = 0;
        for (int no_warm = 0; no_warm < 2; no_warm++) {
            tide_offload_opts o = offload(false, TIDE_BUDGET_FRACTION, f / 10.0, "tide", no_warm);
            tide_model *m = NULL;
            assert_int_equal(tide_model_new(ctx, ck, be, &mo, &m), TIDE_OK);
            if (tide_model_set_offload(m, &o)) fail_msg("set_offload: %s", tide_ctx_last_error(ctx));
            tide_gen_stats s;
            int n = 0;
            tide_status st = tide_model_generate_ex(m, longp, LONG, 1, NULL, &tok[no_warm], &n, &s);
            tide_model_free(m);
            if (st == TIDE_E_INFEASIBLE) break; /* below the whole context's minimum */
            if (st) fail_msg("%d%%: %s", f * 10, tide_ctx_last_error(ctx));
            pred[no_warm] = s.predicted_prefill_s;
            if (!no_warm) warm = s.warm_weight_bytes;
        }
        if (!(pred[1] > 0)) continue;
        checked++;
        warm_kept += warm > 0;
        print_message("    %d%% of the peak: prefill predicted %.6g s with %llu warm bytes, %.6g s with none\n",
                      f * 10, pred[0], (unsigned long long)warm, pred[1]);
        assert_int_equal(tok[0], tok[1]);
        if (pred[0] > pred[1] * (1 + 1e-9))
            fail_msg("%d%%: the prefill alone is predicted %.6g s with %llu warm bytes, slower than %.6g s with none",
                     f * 10, pred[0], (unsigned long long)warm, pred[1]);
    }
    assert_true(checked >= 3);
    tide_backend_free(be);
    tide_checkpoint_free(ck);
    tide_ctx_free(ctx);
}

static void test_device(void **state) {
    (void)state;
    check_backend(false);
}

static void test_cpu_weights_on_ssd(void **state) {
    (void)state;
    check_backend(true);
}

int main(int argc, char **argv) {
    const char *fx = getenv("TIDE_FIXTURES");
    if (!fx) {
        fprintf(stderr, "TIDE_FIXTURES is not set\n");
        return 1;
    }
    snprintf(fx_dir, sizeof fx_dir, "%s/tiny-bf16-gqa", fx);
    snprintf(ssd_dir, sizeof ssd_dir, "/tmp/tide-warm-XXXXXX");
    if (!mkdtemp(ssd_dir)) {
        perror("mkdtemp");
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_device),
        cmocka_unit_test(test_cpu_weights_on_ssd),
        cmocka_unit_test(test_room_for_longest),
        cmocka_unit_test(test_prefill_alone),
    };
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* one case by name (a glob) */
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    rmdir(ssd_dir);
    return rc;
}
