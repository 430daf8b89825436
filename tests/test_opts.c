/*
 * test_opts.c - the option structs' defaults and size fields (src/core/opts.c):
 * each tide_*_opts_default() returns a struct with its size set and the
 * documented defaults; a struct of the right size or of size 0 (zero
 * initialised, as callers wrote before the field existed) is taken; any other
 * size is refused with TIDE_E_INVALID, naming the struct and both sizes,
 * before anything is made (the output handle stays NULL). Checked at each
 * entry point that takes one: tide_model_new, tide_model_set_offload,
 * tide_model_generate_ex, tide_sampler_new, tide_pool_new, tide_trainer_new,
 * tide_trainer_set_offload. The model is tests/fixtures/tiny-bf16-gqa.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "tide.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct fixture {
    tide_ctx *ctx;
    tide_checkpoint *ck;
    tide_backend *be;
} fixture;

static int setup(void **state) {
    const char *fx = getenv("TIDE_FIXTURES");
    if (!fx) {
        fprintf(stderr, "TIDE_FIXTURES is not set\n");
        return -1;
    }
    fixture *f = calloc(1, sizeof *f);
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/tiny-bf16-gqa", fx);
    f->ctx = tide_ctx_new();
    if (!f->ctx || tide_checkpoint_open(f->ctx, dir, &f->ck) || tide_backend_new(f->ctx, TIDE_BACKEND_CPU, &f->be)) {
        fprintf(stderr, "fixture: %s\n", f->ctx ? tide_ctx_last_error(f->ctx) : "no context");
        return -1;
    }
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    tide_backend_free(f->be);
    tide_checkpoint_free(f->ck);
    tide_ctx_free(f->ctx);
    free(f);
    return 0;
}

/* The last error names the struct, the size given and this library's. */
static void assert_refused(fixture *f, tide_status st, const char *type, size_t got, size_t want) {
    assert_int_equal(st, TIDE_E_INVALID);
    const char *msg = tide_ctx_last_error(f->ctx);
    char sizes[128];
    snprintf(sizes, sizeof sizes, "%s.size is %zu, this library's %s is %zu bytes", type, got, type, want);
    if (!strstr(msg, sizes)) fail_msg("message '%s' lacks '%s'", msg, sizes);
}

static void defaults_are_filled(void **state) {
    tide_model_opts mo = tide_model_opts_default();
    assert_int_equal(mo.size, sizeof mo);
    assert_int_equal(mo.max_batch, 1);
    assert_int_equal(mo.ctx_len, 0);
    tide_offload_opts oo = tide_offload_opts_default();
    assert_int_equal(oo.size, sizeof oo);
    assert_int_equal(oo.budget_kind, TIDE_BUDGET_NONE);
    assert_int_equal(oo.tile, TIDE_TILE_AUTO);
    tide_gen_opts go = tide_gen_opts_default();
    assert_int_equal(go.size, sizeof go);
    assert_null(go.sampler);
    assert_int_equal(go.n_stop_ids, 0);
    tide_sampler_opts so = tide_sampler_opts_default();
    assert_int_equal(so.size, sizeof so);
    assert_true(so.temperature == 0);
    tide_pool_opts po = tide_pool_opts_default();
    assert_int_equal(po.size, sizeof po);
    assert_int_equal(po.policy, TIDE_POOL_TIDE);
    tide_trainer_opts to = tide_trainer_opts_default();
    assert_int_equal(to.size, sizeof to);
    assert_int_equal(to.step.batch, 4);
    assert_int_equal(to.step.seq, 256);
    assert_int_equal(to.step.accum, 1);
    assert_true(to.lr == 3e-4 && to.step.grad_clip == 1.0f && to.step.beta2 == 0.95f);
}

static void model_and_generation(void **state) {
    fixture *f = *state;
    tide_model *m = (tide_model *)f; /* must be reset to NULL by a refusal */
    tide_model_opts mo = tide_model_opts_default();
    mo.size = sizeof mo + 8;
    assert_refused(f, tide_model_new(f->ctx, f->ck, f->be, &mo, &m), "tide_model_opts", sizeof mo + 8, sizeof mo);
    assert_null(m);
    mo = (tide_model_opts){.max_batch = 1}; /* size 0: this version's */
    assert_int_equal(tide_model_new(f->ctx, f->ck, f->be, &mo, &m), TIDE_OK);
    tide_model_free(m);
    mo = tide_model_opts_default();
    assert_int_equal(tide_model_new(f->ctx, f->ck, f->be, &mo, &m), TIDE_OK);

    tide_offload_opts oo = tide_offload_opts_default();
    oo.size = 16;
    assert_refused(f, tide_model_set_offload(m, &oo), "tide_offload_opts", 16, sizeof oo);
    oo = tide_offload_opts_default();
    assert_int_equal(tide_model_set_offload(m, &oo), TIDE_OK);

    const int32_t prompt[3] = {1, 2, 3};
    int32_t out[4], ref[4];
    int n = -1;
    tide_gen_opts go = tide_gen_opts_default();
    go.size = 1;
    assert_refused(f, tide_model_generate_ex(m, prompt, 3, 4, &go, out, &n, NULL), "tide_gen_opts", 1, sizeof go);
    /* defaulted, zeroed and absent options generate the same ids */
    go = tide_gen_opts_default();
    assert_int_equal(tide_model_generate_ex(m, prompt, 3, 4, &go, ref, &n, NULL), TIDE_OK);
    assert_int_equal(n, 4);
    go = (tide_gen_opts){0};
    assert_int_equal(tide_model_generate_ex(m, prompt, 3, 4, &go, out, &n, NULL), TIDE_OK);
    assert_memory_equal(out, ref, sizeof ref);
    assert_int_equal(tide_model_generate_ex(m, prompt, 3, 4, NULL, out, &n, NULL), TIDE_OK);
    assert_memory_equal(out, ref, sizeof ref);
    tide_model_free(m);
}

static void sampler_pool_trainer(void **state) {
    fixture *f = *state;
    tide_sampler *s = (tide_sampler *)f;
    tide_sampler_opts so = tide_sampler_opts_default();
    so.size = sizeof so - 8;
    assert_refused(f, tide_sampler_new(f->ctx, &so, 320, &s), "tide_sampler_opts", sizeof so - 8, sizeof so);
    assert_null(s);
    so = (tide_sampler_opts){.temperature = 0.5};
    assert_int_equal(tide_sampler_new(f->ctx, &so, 320, &s), TIDE_OK);
    tide_sampler_free(s);

    tide_pool *p = (tide_pool *)f;
    tide_pool_opts po = tide_pool_opts_default();
    po.budget_bytes = 1 << 20;
    po.size = 3;
    assert_refused(f, tide_pool_new(f->ctx, f->be, &po, &p), "tide_pool_opts", 3, sizeof po);
    assert_null(p);

    tide_trainer *t = (tide_trainer *)f;
    tide_trainer_opts to = tide_trainer_opts_default();
    to.step.seq = 16;
    to.size = 2 * sizeof to;
    assert_refused(f, tide_trainer_new(f->ctx, f->ck, f->be, &to, &t), "tide_trainer_opts", 2 * sizeof to, sizeof to);
    assert_null(t);
    to.size = sizeof to;
    assert_int_equal(tide_trainer_new(f->ctx, f->ck, f->be, &to, &t), TIDE_OK);
    tide_offload_opts oo = tide_offload_opts_default();
    oo.size = 5;
    assert_refused(f, tide_trainer_set_offload(t, &oo), "tide_offload_opts", 5, sizeof oo);
    tide_trainer_free(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(defaults_are_filled),
        cmocka_unit_test(model_and_generation),
        cmocka_unit_test(sampler_pool_trainer),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
