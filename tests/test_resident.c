/*
 * test_resident.c - resident runs of the planned engine on a device whose
 * memory is not host memory (a GPU), where every weight and KV cache buffer is
 * warm: uploaded once to a fixed range at the bottom of the arena and kept
 * there across runs and graphs. Each case compares the planned engine with
 * the plain engine (the independent reference) bit for bit, call by call:
 *
 *   - batches below the cache's capacity: a graph's cache tensors are the
 *     first rows of each cache buffer, and the rows it does not use still
 *     hold other rows' history, which nothing else may overwrite;
 *   - an arena at least as large as the warm region, whatever the plan's
 *     own peak (a plan whose activations fit in the unused rows);
 *   - every allocation of a first run refused in turn (a caller's allocator,
 *     tide_set_allocator): the run fails with TIDE_E_NOMEM and a retry gives
 *     the logits of a run never refused;
 *   - switching offloading off while already resident keeps the cache;
 *   - a failing backend call is reported on the model's own context when its
 *     backend was made on another one, with either engine.
 *
 * The device: the CUDA backend where tide_backend_new finds one (a GPU, or
 * the emulated GPU of tests/emu when this file is linked against
 * tide_cudaemu), else the cpu-async double of tests/async_backend.h told to
 * take the GPU paths (device_is_host false). Either way every copy between
 * host and device memory is checked to lie inside one live device
 * allocation; a copy that does not fails with a message saying so, as the
 * emulated GPU reports it.
 *
 * What it proves: resident runs on a device: the whole warm region reserved
 * (activations never land in unused rows of the KV cache) and the arena at
 * least its size, against the plain engine bit for bit; errors of the plain
 * engine and of uploads named on the model's own context.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "async_backend.h"
#include "backend/backend.h"
#include "core/alloc_test.h"

#include <ftw.h>
#include <stdatomic.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static char root_dir[64], bf16_dir[96], f32_dir[96], small_dir[96];
static const char *device_name = "";

/* ---------------------------------------------------------------- checked backends */

/* Every live allocation of the backend under test, so that each copy can be
 * checked against them (the executor's workers copy from several threads);
 * on a device only: on the CPU, host memory is device memory. */
enum { MAX_SPANS = 4096 };
static struct span { const char *p; size_t n; } spans[MAX_SPANS];
static int n_spans;
static bool check_spans;
static pthread_mutex_t spans_mu = PTHREAD_MUTEX_INITIALIZER;
static const tide_backend_vt *inner_vt;
static tide_backend_vt checked_vt;

/* Failure injection: once armed, the inj_at-th call of kind inj_kind fails
 * with TIDE_E_BACKEND, "injected <kind> failure", recorded where the backend
 * records that call's failures: q's context, be->ctx for the default queue
 * and for alloc (backend.h). */
enum { INJ_NONE, INJ_ALLOC, INJ_TO_DEVICE, INJ_TO_HOST, INJ_COMPUTE, INJ_KINDS };
static const char *const inj_name[INJ_KINDS] = {"", "alloc", "to_device", "to_host", "compute"};
static atomic_int inj_kind;
static atomic_long inj_at, inj_calls;

static bool injected(int kind) {
    return atomic_load(&inj_kind) == kind && atomic_fetch_add(&inj_calls, 1) + 1 == atomic_load(&inj_at);
}

static tide_status inject_fail(tide_backend *be, void *q, int kind) {
    return tide_err(tide_backend_queue_ctx(be, q), TIDE_E_BACKEND, "injected %s failure", inj_name[kind]);
}

static tide_status checked_alloc(tide_backend *be, size_t n, void **ptr) {
    if (injected(INJ_ALLOC)) return inject_fail(be, NULL, INJ_ALLOC);
    tide_status st = inner_vt->alloc(be, n, ptr);
    if (st) return st;
    pthread_mutex_lock(&spans_mu);
    assert_true(n_spans < MAX_SPANS);
    spans[n_spans++] = (struct span){*ptr, n};
    pthread_mutex_unlock(&spans_mu);
    return TIDE_OK;
}

static void checked_dealloc(tide_backend *be, void *ptr) {
    pthread_mutex_lock(&spans_mu);
    for (int i = 0; i < n_spans; i++)
        if (spans[i].p == ptr) {
            spans[i] = spans[--n_spans];
            break;
        }
    pthread_mutex_unlock(&spans_mu);
    inner_vt->dealloc(be, ptr);
}

static bool inside(const void *p, size_t n) {
    const char *c = p;
    bool ok = !check_spans;
    pthread_mutex_lock(&spans_mu);
    for (int i = 0; i < n_spans && !ok; i++)
        ok = c >= spans[i].p && c <= spans[i].p + spans[i].n && n <= (size_t)(spans[i].p + spans[i].n - c);
    pthread_mutex_unlock(&spans_mu);
    return ok;
}

static tide_status checked_to_device(tide_backend *be, void *q, void *dst, const void *src, size_t n) {
    if (injected(INJ_TO_DEVICE)) return inject_fail(be, q, INJ_TO_DEVICE);
    if (!inside(dst, n))
        return tide_err(tide_backend_queue_ctx(be, q), TIDE_E_BACKEND, "a copy of %zu bytes to the device "
                        "lands outside any device allocation", n);
    return inner_vt->to_device(be, q, dst, src, n);
}

static tide_status checked_to_host(tide_backend *be, void *q, void *dst, const void *src, size_t n) {
    if (injected(INJ_TO_HOST)) return inject_fail(be, q, INJ_TO_HOST);
    if (!inside(src, n))
        return tide_err(tide_backend_queue_ctx(be, q), TIDE_E_BACKEND, "a copy of %zu bytes from the device "
                        "reads outside any device allocation", n);
    return inner_vt->to_host(be, q, dst, src, n);
}

static tide_status checked_compute(tide_backend *be, void *q, const tide_graph *g, const tide_op *op,
                                   void *const *in, void *const *out, void *scratch) {
    if (injected(INJ_COMPUTE)) return inject_fail(be, q, INJ_COMPUTE);
    return inner_vt->compute(be, q, g, op, in, out, scratch);
}

/* be with its slots wrapped (one backend at a time): copies checked against
 * its allocations when spans, failures injected when armed. */
static tide_backend *checked(tide_backend *be, bool spans) {
    device_name = tide_backend_name(be);
    check_spans = spans;
    inner_vt = be->vt;
    checked_vt = *be->vt;
    checked_vt.alloc = checked_alloc;
    checked_vt.dealloc = checked_dealloc;
    checked_vt.to_device = checked_to_device;
    checked_vt.to_host = checked_to_host;
    checked_vt.compute = checked_compute;
    be->vt = &checked_vt;
    return be;
}

/* The device backend on ctx, checked. */
static tide_backend *device_new(tide_ctx *ctx) {
    tide_backend *be = NULL;
    if (tide_backend_new(ctx, TIDE_BACKEND_CUDA, &be) != TIDE_OK) {
        tide_err_clear(ctx);
        tide_async_opts ao = {.jitter_us = 20, .seed = 3, .device_is_host = false};
        assert_int_equal(tide_async_backend_new(ctx, &ao, &be), TIDE_OK);
    }
    assert_false(be->vt->device_is_host);
    return checked(be, true);
}

/* The CPU backend on ctx, checked (no spans: its device memory is host memory). */
static tide_backend *cpu_new(tide_ctx *ctx) {
    tide_backend *be = NULL;
    assert_int_equal(tide_backend_new(ctx, TIDE_BACKEND_CPU, &be), TIDE_OK);
    return checked(be, false);
}

/* ---------------------------------------------------------------- models */

static tide_llama_config model_config(tide_dtype dt) {
    tide_llama_config c = {
        .name = "resident-test", .hidden_size = 128, .intermediate_size = 352, .num_hidden_layers = 3,
        .num_attention_heads = 4, .num_key_value_heads = 2, .vocab_size = 300,
        .max_position_embeddings = 64, .rms_norm_eps = 1e-5f, .rope_theta = 10000.0f,
        .tie_word_embeddings = false, .dtype = dt,
    };
    return c;
}

enum { CTX_LEN = 32 };

typedef struct call { int batch, seq, pos; } call;

/* Logits of the calls made in turn on model m (each call's batch*seq rows of
 * vocab), or NULL with *st set. */
static float *forward_calls(tide_model *m, const call *c, int n, tide_status *st) {
    const int V = model_config(TIDE_BF16).vocab_size;
    size_t rows = 0;
    for (int k = 0; k < n; k++) rows += (size_t)c[k].batch * (size_t)c[k].seq;
    float *lg = calloc(rows * (size_t)V, sizeof *lg);
    assert_non_null(lg);
    *st = TIDE_OK;
    size_t at = 0;
    for (int k = 0; k < n && !*st; k++) {
        int32_t tok[64];
        assert_true(c[k].batch * c[k].seq <= 64);
        for (int i = 0; i < c[k].batch * c[k].seq; i++) tok[i] = (int32_t)((i * 37 + k * 11 + c[k].pos + 5) % V);
        *st = tide_model_forward(m, tok, c[k].batch, c[k].seq, c[k].pos, lg + at * (size_t)V);
        at += (size_t)c[k].batch * (size_t)c[k].seq;
    }
    if (*st) {
        free(lg);
        return NULL;
    }
    return lg;
}

/* The calls on a fresh model of dir on be with engine eng: their logits. */
static float *run_calls(tide_ctx *ctx, tide_backend *be, const char *dir, int max_batch, tide_engine eng,
                        const call *c, int n) {
    tide_checkpoint *ck = NULL;
    tide_model *m = NULL;
    assert_int_equal(tide_checkpoint_open(ctx, dir, &ck), TIDE_OK);
    tide_model_opts mo = {.max_batch = max_batch, .ctx_len = CTX_LEN};
    assert_int_equal(tide_model_new(ctx, ck, be, &mo, &m), TIDE_OK);
    tide_status st = tide_model_set_engine(m, eng);
    float *lg = st ? NULL : forward_calls(m, c, n, &st);
    if (st)
        fail_msg("%s engine on %s: %s (%s)", eng == TIDE_ENGINE_PLAIN ? "plain" : "planned", device_name,
                 tide_status_str(st), tide_ctx_last_error(ctx));
    tide_model_free(m);
    tide_checkpoint_free(ck);
    return lg;
}

/* The planned engine gives the plain engine's logits, bit for bit, call by
 * call (the first differing call and batch row are named). */
static void compare_engines(const char *dir, int max_batch, const call *c, int n) {
    tide_ctx *ctx = tide_ctx_new();
    tide_backend *be = device_new(ctx);
    float *want = run_calls(ctx, be, dir, max_batch, TIDE_ENGINE_PLAIN, c, n);
    float *got = run_calls(ctx, be, dir, max_batch, TIDE_ENGINE_PLANNED, c, n);
    const size_t V = (size_t)model_config(TIDE_BF16).vocab_size;
    size_t at = 0; /* rows before call k */
    for (int k = 0; k < n; k++) {
        for (int b = 0; b < c[k].batch; b++) {
            size_t row = (size_t)c[k].seq * V, off = (at + (size_t)b * (size_t)c[k].seq) * V;
            if (memcmp(want + off, got + off, row * sizeof *got))
                fail_msg("%s: call %d (batch %d, seq %d at %d): batch row %d's logits differ from the plain "
                         "engine's", device_name, k, c[k].batch, c[k].seq, c[k].pos, b);
        }
        at += (size_t)c[k].batch * (size_t)c[k].seq;
    }
    print_message("    %s: %d calls, %zu logits rows, planned = plain\n", device_name, n, at);
    free(want);
    free(got);
    tide_backend_free(be);
    tide_ctx_free(ctx);
}

/* ---------------------------------------------------------------- cases */

/* A prefill of both rows, a decode step of row 0 alone (its graph's cache is
 * row 0 of each buffer: row 1 is free to nothing), then a decode step of both
 * rows, which reads row 1's history. */
static void test_partial_batch(void **state) {
    (void)state;
    static const call c[] = {{2, 5, 0}, {1, 1, 5}, {2, 1, 6}};
    compare_engines(bf16_dir, 2, c, 3);
}

/* One row of eight: the plan's activations fit in the rows it leaves, so its
 * own peak is below the warm region, which the arena must still hold whole. */
static void test_arena_holds_warm(void **state) {
    (void)state;
    static const call c[] = {{1, 1, 0}, {1, 1, 1}, {3, 2, 0}, {1, 1, 2}};
    compare_engines(f32_dir, 8, c, 4);
}

/* Switching offloading off on a model already resident changes nothing: the
 * cache it holds carries on (a decode step after it gives the logits it gives
 * without the call), with either engine, on the device and on the CPU. */
static void test_offload_off_keeps_cache(void **state) {
    (void)state;
    tide_ctx *ctx = tide_ctx_new();
    static const call pre = {1, 4, 0}, dec = {1, 1, 4};
    const size_t nb = (size_t)model_config(TIDE_BF16).vocab_size * sizeof(float);
    for (int dev = 0; dev < 2; dev++) {
        tide_backend *be = dev ? device_new(ctx) : cpu_new(ctx);
        for (int eng = 0; eng < 2; eng++) {
            float *lg[2] = {NULL, NULL};
            for (int pass = 0; pass < 2; pass++) {
                tide_checkpoint *ck = NULL;
                tide_model *m = NULL;
                assert_int_equal(tide_checkpoint_open(ctx, bf16_dir, &ck), TIDE_OK);
                tide_model_opts mo = {.max_batch = 1, .ctx_len = CTX_LEN};
                assert_int_equal(tide_model_new(ctx, ck, be, &mo, &m), TIDE_OK);
                assert_int_equal(tide_model_set_engine(m, eng ? TIDE_ENGINE_PLAIN : TIDE_ENGINE_PLANNED), TIDE_OK);
                tide_status st;
                free(forward_calls(m, &pre, 1, &st));
                assert_int_equal(st, TIDE_OK);
                if (pass == 1) {
                    tide_offload_opts none = {.budget_kind = TIDE_BUDGET_NONE};
                    assert_int_equal(tide_model_set_offload(m, &none), TIDE_OK);
                    assert_int_equal(tide_model_set_offload(m, NULL), TIDE_OK);
                    assert_int_equal(tide_model_set_engine(m, eng ? TIDE_ENGINE_PLAIN : TIDE_ENGINE_PLANNED),
                                     TIDE_OK);
                }
                lg[pass] = forward_calls(m, &dec, 1, &st);
                if (st) fail_msg("%s", tide_ctx_last_error(ctx));
                tide_model_free(m);
                tide_checkpoint_free(ck);
            }
            if (memcmp(lg[0], lg[1], nb))
                fail_msg("%s, %s engine: a decode step after switching offloading off (already off) lost the "
                         "cache", tide_backend_name(be), eng ? "plain" : "planned");
            free(lg[0]);
            free(lg[1]);
        }
        tide_backend_free(be);
    }
    tide_ctx_free(ctx);
}

/* A caller's allocator that refuses its refuse_at-th allocation once armed. */
typedef struct refusing {
    long count, refuse_at;
} refusing;

static void *r_alloc(void *u, size_t n) {
    refusing *r = u;
    if (r->refuse_at > 0 && ++r->count == r->refuse_at) return NULL;
    return malloc(n);
}
static void *r_resize(void *u, void *p, size_t n) {
    refusing *r = u;
    if (r->refuse_at > 0 && ++r->count == r->refuse_at) return NULL;
    return realloc(p, n);
}
static void r_release(void *u, void *p) {
    (void)u;
    free(p);
}

/* Every allocation of a model's first resident run refused in turn: the run
 * fails with TIDE_E_NOMEM and a message (or works around the refusal and
 * gives the right logits), and running again (nothing refused) gives the
 * logits of a run never refused: no half-made state is left for the retry
 * to trip on. */
static void test_first_run_refused(void **state) {
    (void)state;
    assert_int_equal(tide_alloc_live_bytes(), 0);
    refusing r = {0};
    tide_allocator a = {r_alloc, r_resize, r_release, &r};
    assert_int_equal(tide_set_allocator(&a), TIDE_OK);
    tide_ctx *ctx = tide_ctx_new();
    tide_backend *be = device_new(ctx);
    static const call c = {2, 3, 0};
    float *want = run_calls(ctx, be, small_dir, 2, TIDE_ENGINE_PLANNED, &c, 1);
    const size_t nb = 2 * 3 * (size_t)model_config(TIDE_BF16).vocab_size * sizeof(float);
    int refused = 0, around = 0;
    for (long k = 1;; k++) {
        tide_checkpoint *ck = NULL;
        tide_model *m = NULL;
        assert_int_equal(tide_checkpoint_open(ctx, small_dir, &ck), TIDE_OK);
        tide_model_opts mo = {.max_batch = 2, .ctx_len = CTX_LEN};
        assert_int_equal(tide_model_new(ctx, ck, be, &mo, &m), TIDE_OK);
        r.count = 0;
        r.refuse_at = k;
        tide_status st;
        float *got = forward_calls(m, &c, 1, &st);
        bool reached = r.count >= k;
        r.refuse_at = 0;
        if (!reached) { /* fewer allocations than k: every one was refused once */
            assert_int_equal(st, TIDE_OK);
            assert_memory_equal(got, want, nb);
            free(got);
            tide_model_free(m);
            tide_checkpoint_free(ck);
            break;
        }
        if (st == TIDE_OK) { /* a refusal the library works around (a reservation made ahead) */
            if (memcmp(got, want, nb)) fail_msg("allocation %ld refused, worked around: the logits differ", k);
            around++;
        } else if (st != TIDE_E_NOMEM) {
            fail_msg("allocation %ld of the first run refused: %s (%s)", k, tide_status_str(st),
                     tide_ctx_last_error(ctx));
        } else {
            assert_true(strlen(tide_ctx_last_error(ctx)) > 0);
            refused++;
        }
        free(got);
        got = forward_calls(m, &c, 1, &st);
        if (st)
            fail_msg("allocation %ld refused, then the retry: %s (%s)", k, tide_status_str(st),
                     tide_ctx_last_error(ctx));
        if (memcmp(got, want, nb)) fail_msg("allocation %ld refused: the retry's logits differ", k);
        free(got);
        tide_model_free(m);
        tide_checkpoint_free(ck);
    }
    print_message("    %s: %d refusals failed the run with TIDE_E_NOMEM, %d were worked around; every retry "
                  "gave the unrefused run's logits\n", device_name, refused, around);
    free(want);
    tide_backend_free(be);
    tide_ctx_free(ctx);
    assert_int_equal(tide_alloc_live_bytes(), 0);
    assert_int_equal(tide_set_allocator(NULL), TIDE_OK);
    assert_true(refused > 50);
}

/* Models made on a context of their own, on a backend made on another: a
 * failing backend call (an allocation, a copy either way, a compute: the
 * 1st, 4th, 16th or 64th of its kind since the model was made) fails the run
 * with its cause named on the model's context, whatever the engine, the
 * backend (the device, the CPU, the CPU without queues) and the issue mode
 * (queued ahead, or one call at a time: sync_issue). The backend's context
 * hears nothing but the allocations' failures, which backends record there
 * (models sharing it would race on it), except where the backend has no
 * queues and every call goes on its default queue. */
static void test_errors_on_model_ctx(void **state) {
    (void)state;
    tide_ctx *bctx = tide_ctx_new(), *mctx = tide_ctx_new();
    static const call c[] = {{1, 3, 0}, {1, 1, 3}};
    int n_failed = 0;
    for (int dev = 0; dev < 3; dev++) {
        tide_backend *be = dev == 1 ? device_new(bctx) : cpu_new(bctx);
        if (dev == 2) { /* a backend of the default queue alone */
            checked_vt.queue_new = NULL;
            checked_vt.queue_free = NULL;
            checked_vt.queue_sync = NULL;
        }
        for (int eng = 0; eng < 2; eng++)
            for (int sync = 0; sync < 2; sync++)
                for (int kind = INJ_ALLOC; kind < INJ_KINDS; kind++)
                    for (long at = 1; at <= 64; at *= 4) {
                        const char *en = eng ? "plain" : "planned";
                        tide_checkpoint *ck = NULL;
                        tide_model *m = NULL;
                        assert_int_equal(tide_checkpoint_open(mctx, bf16_dir, &ck), TIDE_OK);
                        tide_model_opts mo = {.max_batch = 1, .ctx_len = CTX_LEN, .sync_issue = sync};
                        assert_int_equal(tide_model_new(mctx, ck, be, &mo, &m), TIDE_OK);
                        assert_int_equal(tide_model_set_engine(m, eng ? TIDE_ENGINE_PLAIN : TIDE_ENGINE_PLANNED),
                                         TIDE_OK);
                        tide_err_clear(bctx);
                        tide_err_clear(mctx);
                        atomic_store(&inj_calls, 0);
                        atomic_store(&inj_at, at);
                        atomic_store(&inj_kind, kind);
                        tide_status st;
                        free(forward_calls(m, c, 2, &st));
                        atomic_store(&inj_kind, INJ_NONE);
                        bool reached = atomic_load(&inj_calls) >= at;
                        tide_model_free(m);
                        tide_checkpoint_free(ck);
                        if (!reached) { /* fewer calls of that kind */
                            if (st) fail_msg("%s, %s engine: %s", device_name, en, tide_ctx_last_error(mctx));
                            continue;
                        }
                        const char *mm = tide_ctx_last_error(mctx), *bm = tide_ctx_last_error(bctx);
                        if (st == TIDE_OK)
                            fail_msg("%s, %s engine%s: %s #%ld failed, the run did not", device_name, en,
                                     sync ? " (sync_issue)" : "", inj_name[kind], at);
                        if (!strstr(mm, "injected"))
                            fail_msg("%s, %s engine%s: %s #%ld failed; the model's context says '%s'", device_name,
                                     en, sync ? " (sync_issue)" : "", inj_name[kind], at, mm);
                        if (kind != INJ_ALLOC && dev != 2 && bm[0])
                            fail_msg("%s, %s engine%s: %s #%ld failed; the backend's context heard '%s'",
                                     device_name, en, sync ? " (sync_issue)" : "", inj_name[kind], at, bm);
                        n_failed++;
                    }
        tide_backend_free(be);
    }
    print_message("    %d injected failures, each named on the model's context\n", n_failed);
    assert_true(n_failed > 40);
    tide_ctx_free(bctx);
    tide_ctx_free(mctx);
}

/* ---------------------------------------------------------------- setup */

static int group_setup(void **state) {
    (void)state;
    snprintf(root_dir, sizeof root_dir, "/tmp/tide-resident-XXXXXX");
    if (!mkdtemp(root_dir)) return -1;
    snprintf(bf16_dir, sizeof bf16_dir, "%s/bf16", root_dir);
    snprintf(f32_dir, sizeof f32_dir, "%s/f32", root_dir);
    snprintf(small_dir, sizeof small_dir, "%s/small", root_dir);
    tide_ctx *ctx = tide_ctx_new();
    tide_llama_config b = model_config(TIDE_BF16), f = model_config(TIDE_F32), sm = b;
    sm.num_hidden_layers = 1; /* the refusal loop runs the model once per allocation */
    sm.hidden_size = 64;
    sm.intermediate_size = 96;
    tide_status st = tide_checkpoint_make_synthetic(ctx, &b, 11, 0, bf16_dir);
    if (!st) st = tide_checkpoint_make_synthetic(ctx, &f, 12, 0, f32_dir);
    if (!st) st = tide_checkpoint_make_synthetic(ctx, &sm, 13, 0, small_dir);
    if (st) fprintf(stderr, "synthetic checkpoint: %s\n", tide_ctx_last_error(ctx));
    tide_ctx_free(ctx);
    return st ? -1 : 0;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static int group_teardown(void **state) {
    (void)state;
    return nftw(root_dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS) ? -1 : 0;
}

int main(int argc, char **argv) {
    if (argc > 1) cmocka_set_test_filter(argv[1]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_first_run_refused), /* first: it swaps the allocator, nothing may be live */
        cmocka_unit_test(test_partial_batch),
        cmocka_unit_test(test_arena_holds_warm),
        cmocka_unit_test(test_offload_off_keeps_cache),
        cmocka_unit_test(test_errors_on_model_ctx),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
