/*
 * test_pool_models.c - the models a pool loads itself (tide.h, "several
 * workloads: models a pool loads"; src/serve/pool_models.c), through the
 * public header only, on the CPU backend with two committed fixtures
 * (tests/fixtures) and a named hardware profile (no measurement).
 *
 * What is checked:
 *   - an offered model is loaded on its first acquire and held: its
 *     workload generates what the same checkpoint generates alone on a
 *     resident model, token for token; a second acquire of it is the same
 *     workload, two holders; release ends the holds;
 *   - max_loaded: a model that does not fit while the loaded one is held is
 *     TIDE_E_BUSY naming the limit and the holder, and loads once the holder
 *     releases, evicting the least recently used idle model (logged with its
 *     reason, counted in tide_pool_model_info_get and tide_pool_stats);
 *   - an evicted model loads again on its next acquire;
 *   - errors: a name offered twice, no name, a bad option (TIDE_E_INVALID);
 *     an acquire of a name never offered (TIDE_E_NOT_FOUND); a model whose
 *     directory holds no checkpoint fails to load with a message naming it,
 *     is left unloaded and fails the same way again.
 */
#include "tide.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

enum { CTX_LEN = 64, N_NEW = 6, MAX_LOG = 64 };

static tide_ctx *ctx;
static tide_backend *be;
static char dir_a[1024], dir_b[1024], dir_none[1024];
static char log_lines[MAX_LOG][1024];
static int n_log;

static void on_log(void *user, const char *line) {
    (void)user;
    if (n_log < MAX_LOG) snprintf(log_lines[n_log++], sizeof log_lines[0], "%s", line);
}

static bool logged(const char *needle) {
    for (int i = 0; i < n_log; i++)
        if (strstr(log_lines[i], needle)) return true;
    return false;
}

static int setup(void **state) {
    (void)state;
    const char *fx = getenv("TIDE_FIXTURES");
    if (!fx) {
        fprintf(stderr, "TIDE_FIXTURES is not set (tests/fixtures)\n");
        return -1;
    }
    snprintf(dir_a, sizeof dir_a, "%s/tiny-bf16-gqa", fx);
    snprintf(dir_b, sizeof dir_b, "%s/tiny-f32-mha", fx);
    snprintf(dir_none, sizeof dir_none, "%s/no-such-model", fx);
    if (!(ctx = tide_ctx_new()) || tide_backend_new(ctx, TIDE_BACKEND_CPU, &be)) return -1;
    return 0;
}

static int teardown(void **state) {
    (void)state;
    tide_backend_free(be);
    tide_ctx_free(ctx);
    return 0;
}

static tide_pool *make_pool(tide_ctx *pc) {
    tide_pool_opts o = {.budget_bytes = (uint64_t)1 << 30, .policy = TIDE_POOL_TIDE, .hw = "h100-80g",
                        .no_refit = true, .log = on_log};
    tide_pool *p = NULL;
    if (tide_pool_new(pc, be, &o, &p)) fail_msg("tide_pool_new: %s", tide_ctx_last_error(pc));
    tide_pool_model_opts mo = tide_pool_model_opts_default();
    mo.ctx_len = CTX_LEN;
    mo.max_batch = 1;
    assert_int_equal(tide_pool_offer_model(p, "a", dir_a, &mo), TIDE_OK);
    assert_int_equal(tide_pool_offer_model(p, "b", dir_b, &mo), TIDE_OK);
    assert_int_equal(tide_pool_offer_model(p, "none", dir_none, &mo), TIDE_OK);
    n_log = 0;
    return p;
}

/* What dir's checkpoint generates alone, greedy, on a resident model. */
static void reference(const char *dir, const int32_t *prompt, int n, int32_t *out) {
    tide_checkpoint *ck = NULL;
    tide_model *m = NULL;
    assert_int_equal(tide_checkpoint_open(ctx, dir, &ck), TIDE_OK);
    tide_model_opts mo = {.max_batch = 1, .ctx_len = CTX_LEN};
    assert_int_equal(tide_model_new(ctx, ck, be, &mo, &m), TIDE_OK);
    assert_int_equal(tide_model_generate(m, prompt, n, N_NEW, out, NULL), TIDE_OK);
    tide_model_free(m);
    tide_checkpoint_free(ck);
}

static void test_load_hold_release(void **state) {
    (void)state;
    tide_ctx *pc = tide_ctx_new();
    tide_pool *p = make_pool(pc);
    tide_pool_model_info info;
    assert_int_equal(tide_pool_model_info_get(p, "a", &info), TIDE_OK);
    assert_false(info.loaded);
    tide_pool_workload *w = NULL, *w2 = NULL;
    assert_int_equal(tide_pool_acquire(p, "a", ctx, &w), TIDE_OK);
    assert_non_null(w);
    assert_true(logged("loaded a from "));
    assert_int_equal(tide_pool_workload_ctx_len(w), CTX_LEN);
    assert_non_null(tide_pool_workload_checkpoint(w));
    assert_int_equal(tide_pool_acquire(p, "a", ctx, &w2), TIDE_OK);
    assert_ptr_equal(w, w2);
    assert_int_equal(tide_pool_model_info_get(p, "a", &info), TIDE_OK);
    assert_true(info.loaded);
    assert_int_equal(info.holders, 2);
    assert_int_equal(info.ctx_len, CTX_LEN);
    assert_true(info.stats.min_bytes > 0);
    /* its workload generates what the checkpoint does alone */
    int32_t prompt[5] = {3, 14, 15, 92, 65}, got[N_NEW], want[N_NEW];
    int n_out = 0;
    assert_int_equal(tide_pool_generate(p, w, prompt, 5, N_NEW, NULL, got, &n_out, NULL), TIDE_OK);
    assert_int_equal(n_out, N_NEW);
    reference(dir_a, prompt, 5, want);
    assert_memory_equal(got, want, sizeof want);
    tide_pool_release(p, w);
    tide_pool_release(p, w);
    assert_int_equal(tide_pool_model_info_get(p, "a", &info), TIDE_OK);
    assert_true(info.loaded); /* kept while there is room */
    assert_int_equal(info.holders, 0);
    tide_pool_free(p);
    tide_ctx_free(pc);
}

static void test_max_loaded_evicts(void **state) {
    (void)state;
    tide_ctx *pc = tide_ctx_new();
    tide_pool *p = make_pool(pc);
    assert_int_equal(tide_pool_set_max_loaded(p, 1), TIDE_OK);
    tide_pool_workload *wa = NULL, *wb = NULL;
    assert_int_equal(tide_pool_acquire(p, "a", ctx, &wa), TIDE_OK);
    /* a held: no room for b */
    assert_int_equal(tide_pool_acquire(p, "b", ctx, &wb), TIDE_E_BUSY);
    assert_null(wb);
    const char *msg = tide_ctx_last_error(ctx);
    assert_non_null(strstr(msg, "--max-loaded 1"));
    assert_non_null(strstr(msg, "a (1 request)"));
    tide_pool_model_info info;
    assert_int_equal(tide_pool_model_info_get(p, "b", &info), TIDE_OK);
    assert_false(info.loaded);
    tide_pool_release(p, wa);
    /* a idle: evicted for b */
    assert_int_equal(tide_pool_acquire(p, "b", ctx, &wb), TIDE_OK);
    assert_true(logged("evicted a (least recently used, no request): --max-loaded 1 reached, loading b"));
    assert_int_equal(tide_pool_model_info_get(p, "a", &info), TIDE_OK);
    assert_false(info.loaded);
    assert_int_equal(info.evictions, 1);
    tide_pool_stats ps;
    tide_pool_stats_get(p, &ps);
    assert_int_equal(ps.evictions, 1);
    assert_int_equal(ps.n_workloads, 1);
    int32_t prompt[3] = {7, 8, 9}, got[N_NEW], want[N_NEW];
    int n_out = 0;
    assert_int_equal(tide_pool_generate(p, wb, prompt, 3, N_NEW, NULL, got, &n_out, NULL), TIDE_OK);
    reference(dir_b, prompt, 3, want);
    assert_memory_equal(got, want, sizeof want);
    tide_pool_release(p, wb);
    /* a again: b goes */
    assert_int_equal(tide_pool_acquire(p, "a", ctx, &wa), TIDE_OK);
    assert_int_equal(tide_pool_model_info_get(p, "b", &info), TIDE_OK);
    assert_false(info.loaded);
    assert_int_equal(info.evictions, 1);
    tide_pool_stats_get(p, &ps);
    assert_int_equal(ps.evictions, 2);
    assert_int_equal(tide_pool_generate(p, wa, prompt, 3, N_NEW, NULL, got, &n_out, NULL), TIDE_OK);
    reference(dir_a, prompt, 3, want);
    assert_memory_equal(got, want, sizeof want);
    tide_pool_release(p, wa);
    tide_pool_free(p); /* frees the loaded model with it */
    tide_ctx_free(pc);
}

static void test_errors(void **state) {
    (void)state;
    tide_ctx *pc = tide_ctx_new();
    tide_pool *p = make_pool(pc);
    assert_int_equal(tide_pool_offer_model(p, "a", dir_b, NULL), TIDE_E_INVALID);
    assert_non_null(strstr(tide_ctx_last_error(pc), "'a'"));
    assert_int_equal(tide_pool_offer_model(p, "", dir_b, NULL), TIDE_E_INVALID);
    assert_int_equal(tide_pool_offer_model(p, "c", NULL, NULL), TIDE_E_INVALID);
    tide_pool_model_opts mo = tide_pool_model_opts_default();
    mo.ctx_len = 1;
    assert_int_equal(tide_pool_offer_model(p, "c", dir_b, &mo), TIDE_E_INVALID);
    mo = tide_pool_model_opts_default();
    mo.max_batch = TIDE_MAX_BATCH + 1;
    assert_int_equal(tide_pool_offer_model(p, "c", dir_b, &mo), TIDE_E_INVALID);
    assert_int_equal(tide_pool_set_max_loaded(p, -1), TIDE_E_INVALID);
    tide_pool_workload *w = (tide_pool_workload *)1;
    assert_int_equal(tide_pool_acquire(p, "zz", ctx, &w), TIDE_E_NOT_FOUND);
    assert_null(w);
    assert_non_null(strstr(tide_ctx_last_error(ctx), "'zz'"));
    for (int k = 0; k < 2; k++) { /* nothing kept: the second fails the same way */
        tide_status st = tide_pool_acquire(p, "none", ctx, &w);
        assert_true(st == TIDE_E_NOT_FOUND || st == TIDE_E_IO);
        assert_null(w);
        assert_non_null(strstr(tide_ctx_last_error(ctx), "cannot load the model 'none' from"));
        tide_pool_model_info info;
        assert_int_equal(tide_pool_model_info_get(p, "none", &info), TIDE_OK);
        assert_false(info.loaded);
    }
    tide_pool_model_info info;
    assert_int_equal(tide_pool_model_info_get(p, "zz", &info), TIDE_E_NOT_FOUND);
    tide_pool_free(p);
    tide_ctx_free(pc);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_load_hold_release),
        cmocka_unit_test(test_max_loaded_evicts),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
