/*
 * test_pool_predict.c - what the pool predicts of a workload and how policy
 * tide chooses from it (src/serve/pool_predict.c), without running a model:
 *
 *   - curves with warm weights: where a model keeps weights warm across
 *     requests (on a device, or with the weights on SSD), its need grows by
 *     every weight, each point prices its request with the weights the model
 *     would keep warm there, and the time to load them; at the need the
 *     request reads no weight again and is faster than a request streaming
 *     its weights, and faster than the cold prediction at the same budget;
 *   - the partition's cost of changing a share: a share held now costs no
 *     load, another one costs loading its warm weights again, and the
 *     greedy moves only when the queued requests repay it; a share at the
 *     same point of the curve as the one held stays as held where room is
 *     left;
 *   - the choice between shares and time-slicing: slicing where every share
 *     would stream its weights over a shared link (their sum is the bound),
 *     shares where they fit warm, and where two workloads use different
 *     resources (compute and link) and overlap; a change of regime only
 *     when predicted 10% faster (a 5% difference keeps either);
 *   - the partition searches every combination of points where there are
 *     few (a greedy would block a workload's knee);
 *   - a time-sliced turn runs at its knee, and slicing loads warm weights
 *     once where the knees fit together;
 *   - the warm weights each point predicts are the ones the model keeps at
 *     that budget (the tiny fixture, run).
 *
 * What it proves: what the pool predicts and how policy tide chooses, no
 * model run: with warm weights (weights in host memory on the h100-80g
 * profile, and on SSD) a workload's need is its unconstrained peak plus every
 * weight, at the need every weight is warm, the request faster than the cold
 * prediction there (less link and SSD time), the load time at least the bytes
 * over the slower of link and drives; a share held costs no load, another one
 * does, the greedy moves only when the queued requests repay the load, a held
 * share at the chosen point stays; shares against time-slicing: sliced when
 * every share would stream over one link, shares when all fit warm, when a
 * compute-bound and a link-bound workload overlap, and when they tie; one
 * workload never sliced.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "serve/pool_predict.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static tide_ctx *ctx;

static tide_llama_config small_config(int layers) {
    tide_llama_config cfg;
    assert_int_equal(tide_llama_config_named(ctx, "tinyllama-1.1b", &cfg), TIDE_OK);
    cfg.num_hidden_layers = layers;
    cfg.vocab_size = 8192;
    cfg.max_position_embeddings = 256;
    return cfg;
}

/* The bytes of every weight of the model, each TIDE_PLAN_ALIGN-rounded. */
static uint64_t weight_bytes(const tide_llama_config *cfg) {
    tide_llama_graph_opts go = {.batch = 1, .seq = 1, .ctx_len = 256};
    tide_graph *g = NULL;
    assert_int_equal(tide_llama_build(ctx, cfg, &go, &g), TIDE_OK);
    uint64_t n = 0;
    for (int t = 0; t < g->n_tensors; t++)
        if (g->tensors[t].role == TIDE_ROLE_WEIGHT) n += tide_plan_align(g->tensors[t].nbytes);
    tide_graph_free(g);
    return n;
}

static void check_warm_curve(bool on_ssd) {
    tide_hw hw;
    assert_int_equal(tide_hw_load(ctx, "h100-80g", &hw), TIDE_OK);
    tide_llama_config cfg = small_config(2);
    pool_predict cold = {.ctx = ctx, .hw = &hw, .weights_on_ssd = on_ssd, .cfg = &cfg, .ctx_len = 256, .name = "w"};
    pool_predict warm = cold;
    warm.warm = true;
    uint64_t cmin = 0, cneed = 0, wmin = 0, wneed = 0;
    assert_int_equal(pool_predict_bounds(&cold, &cmin, &cneed), TIDE_OK);
    assert_int_equal(pool_predict_bounds(&warm, &wmin, &wneed), TIDE_OK);
    uint64_t wb = weight_bytes(&cfg);
    assert_int_equal(wmin, cmin);
    assert_int_equal(wneed, cneed + wb);
    pool_curve cc, wc;
    assert_int_equal(pool_predict_curve(&cold, cmin, cneed, 32, 16, &cc), TIDE_OK);
    assert_int_equal(pool_predict_curve(&warm, wmin, wneed, 32, 16, &wc), TIDE_OK);
    int top = wc.n - 1;
    assert_int_equal(wc.b[top], wneed);
    assert_int_equal(wc.warm[top], wb); /* every weight warm at the need */
    assert_true(wc.u[top] > 0);
    /* at least the bytes over the slower of the link and the drives, at most twice that */
    double expect_u = on_ssd ? fmax(tide_hw_ssd_read_seconds(&hw, wb), (double)wb / hw.h2d_bw) : (double)wb / hw.h2d_bw;
    assert_true(wc.u[top] >= expect_u * 0.999 && wc.u[top] <= 2 * expect_u);
    assert_true(wc.t[top] < wc.t[0]);
    assert_true(wc.t[top] < cc.t[cc.n - 1] * 0.9); /* no weight streamed per decode step */
    assert_true(wc.link[top] < cc.link[cc.n - 1]);
    if (on_ssd) assert_true(wc.ssd[top] < cc.ssd[cc.n - 1]);
    else assert_true(wc.ssd[top] == 0 && cc.ssd[cc.n - 1] == 0);
    for (int k = 0; k < wc.n; k++) {
        assert_true(wc.warm[k] <= wc.b[k]);
        assert_true((wc.warm[k] == 0) == (wc.u[k] == 0));
        assert_true(wc.comp[k] > 0 && wc.comp[k] <= wc.t[k] * (1 + 1e-9));
    }
    for (int k = 0; k < cc.n; k++) assert_int_equal(cc.warm[k], 0);
    print_message("  2-layer, weights %s: cold need %llu, warm need %llu; request at the need: cold %.4g s, "
                  "warm %.4g s (+ %.4g s to load %llu bytes once)\n", on_ssd ? "on SSD" : "in host memory",
                  (unsigned long long)cneed, (unsigned long long)wneed, cc.t[cc.n - 1], wc.t[top], wc.u[top],
                  (unsigned long long)wc.warm[top]);
}

static void test_warm_curve(void **state) {
    (void)state;
    check_warm_curve(false);
    check_warm_curve(true);
}

/* A curve of three points: budgets 10, 20, 40 (units of TIDE_PLAN_ALIGN),
 * request times 5, 3, 1, loads 0, 1, 2. */
static pool_curve three_points(void) {
    pool_curve c = {.n = 3};
    const double t[3] = {5, 3, 1}, u[3] = {0, 1, 2};
    for (int k = 0; k < 3; k++) {
        c.b[k] = (uint64_t)(10 << k) * TIDE_PLAN_ALIGN;
        c.t[k] = c.comp[k] = t[k];
        c.u[k] = u[k];
        c.warm[k] = u[k] > 0 ? c.b[k] / 2 : 0;
    }
    return c;
}

static void test_share_change_cost(void **state) {
    (void)state;
    pool_curve c = three_points();
    const pool_curve *cv[1] = {&c};
    uint64_t total = 40 * TIDE_PLAN_ALIGN, share = 0;
    /* holding 20: moving to 40 saves 2 per request and loads 2 */
    uint64_t cur = 20 * TIDE_PLAN_ALIGN;
    assert_true(pool_predict_cost(&c, 1, 1, cur) == 3);
    assert_true(pool_predict_cost(&c, 2, 1, cur) == 3);
    assert_true(pool_predict_cost(&c, 2, 1, 0) == 3);
    double wt = 1;
    pool_predict_partition(1, cv, &wt, &cur, total, &share);
    assert_int_equal(share, cur); /* one request: not worth loading again */
    wt = 2;
    pool_predict_partition(1, cv, &wt, &cur, total, &share);
    assert_int_equal(share, total); /* two repay it */
    /* without a share held, the load is paid either way */
    wt = 1;
    pool_predict_partition(1, cv, &wt, NULL, total, &share);
    assert_int_equal(share, total);
    /* a share held between two points, at the point chosen: kept where room is left */
    cur = 30 * TIDE_PLAN_ALIGN;
    pool_predict_partition(1, cv, &wt, &cur, total, &share);
    assert_int_equal(share, cur);
    /* two workloads: the one holding 20 keeps it, the other gets the rest */
    pool_curve d = three_points();
    const pool_curve *cv2[2] = {&c, &d};
    double wt2[2] = {1, 1};
    uint64_t cur2[2] = {20 * TIDE_PLAN_ALIGN, 0}, sh2[2];
    pool_predict_partition(2, cv2, wt2, cur2, 30 * TIDE_PLAN_ALIGN, sh2);
    assert_int_equal(sh2[0], 20 * TIDE_PLAN_ALIGN);
    assert_int_equal(sh2[1], 10 * TIDE_PLAN_ALIGN);
    assert_true(sh2[0] + sh2[1] <= 30 * TIDE_PLAN_ALIGN);
}

/* Two points: the minimum (10 units) streams the weights over the link,
 * the need (100 units) keeps them warm. */
static pool_curve streaming(double comp, double link_min) {
    pool_curve c = {.n = 2};
    c.b[0] = 10 * TIDE_PLAN_ALIGN;
    c.b[1] = 100 * TIDE_PLAN_ALIGN;
    c.t[0] = comp + link_min;
    c.t[1] = comp;
    c.comp[0] = c.comp[1] = comp;
    c.link[0] = link_min;
    c.u[1] = 0.5;
    c.warm[1] = 50 * TIDE_PLAN_ALIGN;
    return c;
}

static void test_choose(void **state) {
    (void)state;
    pool_curve a = streaming(1, 9), b = streaming(1, 9);
    const pool_curve *cv[2] = {&a, &b};
    double wt[2] = {1, 1}, part = 0, slice = 0;
    uint64_t sh[2];
    /* room for one warm share: both at the minimum would stream 18 s over
     * one link; one at a time, warm, 2 x (1 + 0.5) s */
    assert_true(pool_predict_choose(2, cv, wt, NULL, 110 * TIDE_PLAN_ALIGN, false, sh, &part, &slice));
    assert_true(fabs(slice - 3) < 1e-12);
    assert_true(part > slice);
    /* room for both warm: at once, max(2 s of compute, 1 s each) + 2 loads of 0.5 s = 3 s; sliced 3 s */
    assert_false(pool_predict_choose(2, cv, wt, NULL, 200 * TIDE_PLAN_ALIGN, false, sh, &part, &slice));
    assert_int_equal(sh[0], 100 * TIDE_PLAN_ALIGN);
    assert_int_equal(sh[1], 100 * TIDE_PLAN_ALIGN);
    assert_true(fabs(part - 3) < 1e-12 && fabs(slice - 3) < 1e-12);
    /* the same, holding those shares: no load at once, two when sliced */
    uint64_t cur[2] = {100 * TIDE_PLAN_ALIGN, 100 * TIDE_PLAN_ALIGN};
    assert_false(pool_predict_choose(2, cv, wt, cur, 200 * TIDE_PLAN_ALIGN, false, sh, &part, &slice));
    assert_true(fabs(part - 2) < 1e-12);
    /* one compute-bound and one link-bound workload overlap */
    pool_curve c = {.n = 1, .b = {10 * TIDE_PLAN_ALIGN}, .t = {2}, .comp = {2}};
    pool_curve l = {.n = 1, .b = {10 * TIDE_PLAN_ALIGN}, .t = {2}, .link = {2}};
    const pool_curve *cv2[2] = {&c, &l};
    assert_false(pool_predict_choose(2, cv2, wt, NULL, 20 * TIDE_PLAN_ALIGN, false, sh, &part, &slice));
    assert_true(fabs(part - 2) < 1e-12 && fabs(slice - 4) < 1e-12);
    /* the margin: sliced now, shares must be 10% faster to return (2 < 0.9 x
     * 4: they are); a tie (two compute-bound) keeps each regime as it is */
    assert_false(pool_predict_choose(2, cv2, wt, NULL, 20 * TIDE_PLAN_ALIGN, true, sh, &part, &slice));
    const pool_curve *tie[2] = {&c, &c};
    assert_true(pool_predict_choose(2, tie, wt, NULL, 20 * TIDE_PLAN_ALIGN, true, sh, &part, &slice));
    /* slicing 5% faster than shares is not enough to leave them, and
     * shares 5% slower not enough to return: room for one warm share,
     * shares 1.5 + 1.66 s, sliced 2 x (1 + 0.5) s */
    pool_curve n1 = streaming(1, 1.66), n2 = streaming(1, 1.66);
    const pool_curve *near[2] = {&n1, &n2};
    assert_false(pool_predict_choose(2, near, wt, NULL, 110 * TIDE_PLAN_ALIGN, false, sh, &part, &slice));
    assert_true(fabs(part - 3.16) < 1e-9 && fabs(slice - 3) < 1e-12);
    assert_true(pool_predict_choose(2, near, wt, NULL, 110 * TIDE_PLAN_ALIGN, true, sh, &part, &slice));
    /* two compute-bound ones gain nothing at once: equal, so shares (no load) */
    const pool_curve *cv3[2] = {&c, &c};
    assert_false(pool_predict_choose(2, cv3, wt, NULL, 20 * TIDE_PLAN_ALIGN, false, sh, &part, &slice));
    assert_true(fabs(part - 4) < 1e-12 && fabs(slice - 4) < 1e-12);
    /* one workload is never sliced */
    assert_false(pool_predict_choose(1, cv, wt, NULL, 10 * TIDE_PLAN_ALIGN, false, sh, &part, &slice));
}

/* The partition searches every combination of the curves' points when there
 * are few: a greedy by saving per byte would first move B (saving 3 s for
 * one unit) and leave A no room for its knee (8 units saving 9.9 s); the
 * search gives A its knee, the bound on the queued work falling from 11 s
 * to 4.1 s. */
static void test_partition_search(void **state) {
    (void)state;
    pool_curve a = {.n = 2, .b = {1 * TIDE_PLAN_ALIGN, 9 * TIDE_PLAN_ALIGN}, .t = {10, 0.1}, .comp = {10, 0.1}};
    pool_curve b = {.n = 2, .b = {1 * TIDE_PLAN_ALIGN, 2 * TIDE_PLAN_ALIGN}, .t = {4, 1}, .comp = {4, 1}};
    const pool_curve *cv[2] = {&a, &b};
    double wt[2] = {1, 1}, part = 0, slice = 0;
    uint64_t sh[2];
    pool_predict_partition(2, cv, wt, NULL, 10 * TIDE_PLAN_ALIGN, sh);
    assert_int_equal(sh[0], 9 * TIDE_PLAN_ALIGN);
    assert_int_equal(sh[1], 1 * TIDE_PLAN_ALIGN);
    /* (one at a time at the whole budget is faster still: 0.1 + 1 s) */
    assert_true(pool_predict_choose(2, cv, wt, NULL, 10 * TIDE_PLAN_ALIGN, false, sh, &part, &slice));
    assert_true(fabs(part - 4.1) < 1e-12 && fabs(slice - 1.1) < 1e-12);
    /* with room for both knees, both */
    pool_predict_partition(2, cv, wt, NULL, 11 * TIDE_PLAN_ALIGN, sh);
    assert_int_equal(sh[0], 9 * TIDE_PLAN_ALIGN);
    assert_int_equal(sh[1], 2 * TIDE_PLAN_ALIGN);
}

/* A time-sliced turn's share is its knee: the smallest point as fast as
 * the whole budget (pool_predict_knee). When the knees fit the budget
 * together, slicing loads each workload's warm weights once (they stay
 * loaded between turns), none for one whose share is its knee already;
 * when they do not, again at every request. */
static void test_knee(void **state) {
    (void)state;
    pool_curve a = {.n = 3, .b = {10 * TIDE_PLAN_ALIGN, 20 * TIDE_PLAN_ALIGN, 40 * TIDE_PLAN_ALIGN},
                    .t = {5, 1, 1}, .comp = {5, 1, 1}, .u = {0, 0.5, 0.5}};
    assert_int_equal(pool_predict_knee(&a, 40 * TIDE_PLAN_ALIGN), 1);
    assert_int_equal(pool_predict_knee(&a, 30 * TIDE_PLAN_ALIGN), 1);
    assert_int_equal(pool_predict_knee(&a, 15 * TIDE_PLAN_ALIGN), 0);
    assert_int_equal(pool_predict_knee(&a, 5 * TIDE_PLAN_ALIGN), -1);
    pool_curve b = a;
    const pool_curve *cv[2] = {&a, &b};
    double wt[2] = {3, 3}, part = 0, slice = 0;
    uint64_t sh[2];
    /* knees 20 + 20 fit 40: each loads once, 2 x (3 x 1 + 0.5) */
    (void)pool_predict_choose(2, cv, wt, NULL, 40 * TIDE_PLAN_ALIGN, false, sh, &part, &slice);
    assert_true(fabs(slice - 7) < 1e-12);
    /* holding their knees: no load */
    uint64_t cur[2] = {20 * TIDE_PLAN_ALIGN, 20 * TIDE_PLAN_ALIGN};
    (void)pool_predict_choose(2, cv, wt, cur, 40 * TIDE_PLAN_ALIGN, false, sh, &part, &slice);
    assert_true(fabs(slice - 6) < 1e-12);
    /* 30: the knees do not fit together; every request loads again, 2 x 3 x (1 + 0.5) */
    (void)pool_predict_choose(2, cv, wt, NULL, 30 * TIDE_PLAN_ALIGN, false, sh, &part, &slice);
    assert_true(fabs(slice - 9) < 1e-12);
}

/* What the pool predicts a model keeps warm is what the model keeps: on the
 * CPU with the weights on SSD, untiled (as a pool runs its models), at every
 * point of a model's curve for a request of 7 + 4 tokens, the model's
 * warm_weight_bytes after such a request equals the curve's warm[k]. Two
 * models: the tiny fixture, and a synthetic one whose ops are dominated by
 * their weights (hidden 256, vocabulary 4096, one layer), where a warm
 * region leaves less room than an op's untiled working set counting its
 * weight, though the weight is read in place. (They differed where the pool
 * laid the region out in the graph's order and the model in the
 * checkpoint's, and where the model's untiled minimum counted warm weights
 * as streamed.) */
static void check_warm_matches(const char *dir, const char *ssd, int *warm_points) {
    tide_checkpoint *ck = NULL;
    assert_int_equal(tide_checkpoint_open(ctx, dir, &ck), TIDE_OK);
    tide_backend *be = NULL;
    assert_int_equal(tide_backend_new(ctx, TIDE_BACKEND_CPU, &be), TIDE_OK);
    tide_hw hw;
    assert_int_equal(tide_hw_load(ctx, "a100-80g", &hw), TIDE_OK);
    enum { CTX = 64, PROMPT = 7, GEN = 4 };
    pool_predict pp = {.ctx = ctx, .hw = &hw, .host_addressable = true, .weights_on_ssd = true, .warm = true,
                       .cfg = tide_checkpoint_config(ck), .ck = ck, .ctx_len = CTX, .name = dir};
    uint64_t min = 0, need = 0;
    assert_int_equal(pool_predict_bounds(&pp, &min, &need), TIDE_OK);
    pool_curve cv;
    assert_int_equal(pool_predict_curve(&pp, min, need, PROMPT, GEN, &cv), TIDE_OK);
    int32_t prompt[PROMPT] = {1, 17, 42, 250, 3, 99, 8}, out[GEN];
    for (int k = 0; k < cv.n; k++) {
        if (!isfinite(cv.t[k])) continue;
        tide_model_opts mo = {.max_batch = 1, .ctx_len = CTX};
        tide_model *m = NULL;
        assert_int_equal(tide_model_new(ctx, ck, be, &mo, &m), TIDE_OK);
        tide_offload_opts o = {.budget_kind = TIDE_BUDGET_BYTES, .bytes = cv.b[k], .policy = "tide",
                               .hw = "a100-80g", .weights_on_ssd = true, .ssd_dirs = ssd, .tile = TIDE_TILE_NONE};
        if (tide_model_set_offload(m, &o)) fail_msg("point %d: %s", k, tide_ctx_last_error(ctx));
        tide_gen_stats gs;
        int n = 0;
        if (tide_model_generate_ex(m, prompt, PROMPT, GEN, NULL, out, &n, &gs))
            fail_msg("%s, point %d (%llu bytes): %s", dir, k, (unsigned long long)cv.b[k], tide_ctx_last_error(ctx));
        print_message("    %llu bytes: warm %llu predicted, %llu kept by the model\n", (unsigned long long)cv.b[k],
                      (unsigned long long)cv.warm[k], (unsigned long long)gs.warm_weight_bytes);
        if (gs.warm_weight_bytes != cv.warm[k])
            fail_msg("%s at %llu bytes: the pool predicts %llu warm bytes, the model keeps %llu", dir,
                     (unsigned long long)cv.b[k], (unsigned long long)cv.warm[k],
                     (unsigned long long)gs.warm_weight_bytes);
        *warm_points += cv.warm[k] > 0;
        tide_model_free(m);
    }
    tide_backend_free(be);
    tide_checkpoint_free(ck);
}

static void test_warm_matches_model(void **state) {
    (void)state;
    const char *fx = getenv("TIDE_FIXTURES");
    if (!fx) fail_msg("TIDE_FIXTURES is not set");
    char dir[4096], ssd[64], syn[96];
    snprintf(ssd, sizeof ssd, "/tmp/tide-pool-predict-XXXXXX");
    assert_non_null(mkdtemp(ssd));
    snprintf(syn, sizeof syn, "%s/model", ssd);
    int warm_points = 0;
    snprintf(dir, sizeof dir, "%s/tiny-bf16-gqa", fx);
    check_warm_matches(dir, ssd, &warm_points);
    tide_llama_config cfg;
    assert_int_equal(tide_llama_config_named(ctx, "tinyllama-1.1b", &cfg), TIDE_OK);
    cfg.num_hidden_layers = 1;
    cfg.hidden_size = 256;
    cfg.intermediate_size = 1024;
    cfg.num_attention_heads = 4;
    cfg.num_key_value_heads = 2;
    cfg.vocab_size = 4096;
    cfg.max_position_embeddings = 64;
    assert_int_equal(tide_checkpoint_make_synthetic(ctx, &cfg, 3, 0, syn), TIDE_OK);
    check_warm_matches(syn, ssd, &warm_points);
    assert_true(warm_points > 1);
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", ssd);
    assert_int_equal(system(cmd), 0);
}

static int setup(void **state) {
    (void)state;
    ctx = tide_ctx_new();
    return ctx ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    tide_ctx_free(ctx);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_warm_curve),
        cmocka_unit_test(test_share_change_cost),
        cmocka_unit_test(test_choose),
        cmocka_unit_test(test_partition_search),
        cmocka_unit_test(test_knee),
        cmocka_unit_test(test_warm_matches_model),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
