/*
 * test_lora.c - a PEFT LoRA adapter applied at run time
 * (tide_checkpoint_add_lora, src/model/lora.c; the branch in the inference
 * graph, src/model/llama.c), on the committed fixture
 * tests/fixtures/train/lora-f32-gqa: its adapter_init/ (r 4, alpha 8, every
 * projection, A and B nonzero) on the train-f32-gqa base, and
 * run_logits.safetensors, made by scripts/make_lora_fixture.py with PyTorch +
 * PEFT.
 *
 * What it proves:
 *   - the logits of every position of the fixture's prompt, resident on the
 *     CPU, are PEFT's unmerged forward within 2e-6 of the largest logit
 *     (f32 rounding: tide scales x A^T by alpha / r before B, PEFT after;
 *     seen 3e-7), and PEFT's merge_and_unload forward within the same bound,
 *     while the base's logits are over 100 times farther (the branch is
 *     really there);
 *   - greedy generation gives PEFT's greedy ids, and resident, the plain
 *     engine, and offloaded runs at 25% of the unconstrained peak (policies
 *     tide and lru; static-layer at its minimum, two layer buffers; on the CPU with the weights on SSD, and on
 *     a device: CUDA, the emulated GPU when linked with it, or the
 *     asynchronous test double) give the same ids and the same logits bit
 *     for bit (the adapters are planned as weights: streamed, kept warm or
 *     read from SSD); test_lora_cudaemu runs the device case on the
 *     emulated GPU;
 *   - tide_checkpoint_save_merged writes a checkpoint whose logits are
 *     PEFT's merge_and_unload ones and the run-time adapter's within the
 *     same bound (it refuses a checkpoint without an adapter and an existing
 *     directory);
 *   - an adapter in bf16 computes what an f32 adapter holding the same
 *     (rounded) values computes, within 2e-6 of the largest logit;
 *   - bad adapters are refused with the status and a message naming the
 *     cause, the checkpoint left as it was (no lora_r, the same tensors):
 *     no directory, no adapter_model.safetensors, r that does not match the
 *     tensors' shapes, a target_modules without tensors of the file (an
 *     extra tensor), an unknown module, DoRA, a tensor missing, mixed
 *     dtypes; and a second adapter on the same checkpoint.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "async_backend.h"
#include "backend/backend.h"
#include "model/st_file.h"
#include "test_select.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { MAX_PROMPT = 64, MAX_NEW = 16, VOCAB = 128 };
static char base_dir[4096], adapter_dir[4096], run_file[4096], tmp_dir[64];

/* run_logits.safetensors */
static int32_t prompt[MAX_PROMPT], want_gen[MAX_NEW];
static int n_prompt, n_gen;
static float *peft_logits, *merged_logits, *base_logits;

static void read_tensor(const tide_st_file *f, const char *name, void *dst, uint64_t max_bytes, uint64_t *n) {
    tide_ctx *ctx = tide_ctx_new();
    tide_st_tensor t;
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(f->header, name);
    if (!e || tide_st_tensor_read(ctx, run_file, f, e, &t)) fail_msg("%s: no tensor '%s'", run_file, name);
    assert_true(t.nbytes <= max_bytes);
    memcpy(dst, f->map + t.offset, t.nbytes);
    *n = t.nbytes;
    tide_ctx_free(ctx);
}

static void load_fixture(void) {
    tide_ctx *ctx = tide_ctx_new();
    tide_st_file f;
    if (tide_st_open(ctx, run_file, &f)) fail_msg("%s", tide_ctx_last_error(ctx));
    uint64_t n = 0;
    read_tensor(&f, "prompt", prompt, sizeof prompt, &n);
    n_prompt = (int)(n / 4);
    read_tensor(&f, "generated", want_gen, sizeof want_gen, &n);
    n_gen = (int)(n / 4);
    const uint64_t lb = (uint64_t)n_prompt * VOCAB * sizeof(float);
    peft_logits = malloc(lb);
    merged_logits = malloc(lb);
    base_logits = malloc(lb);
    read_tensor(&f, "logits", peft_logits, lb, &n);
    assert_int_equal(n, lb);
    read_tensor(&f, "merged_logits", merged_logits, lb, &n);
    read_tensor(&f, "base_logits", base_logits, lb, &n);
    tide_st_close(&f);
    tide_ctx_free(ctx);
}

static tide_backend *device_new(tide_ctx *ctx) {
    tide_backend *be = NULL;
    if (tide_backend_new(ctx, TIDE_BACKEND_CUDA, &be) != TIDE_OK) {
        tide_err_clear(ctx);
        tide_async_opts ao = {.jitter_us = 20, .seed = 5, .device_is_host = false};
        assert_int_equal(tide_async_backend_new(ctx, &ao, &be), TIDE_OK);
    }
    return be;
}

/* A model of the base with the adapter in adir (NULL: none) on be. */
static tide_model *open_model(tide_ctx *ctx, tide_backend *be, const char *adir, tide_checkpoint **ck) {
    assert_int_equal(tide_checkpoint_open(ctx, base_dir, ck), TIDE_OK);
    if (adir && tide_checkpoint_add_lora(*ck, adir)) fail_msg("add_lora %s: %s", adir, tide_ctx_last_error(ctx));
    tide_model_opts mo = {.max_batch = 1, .ctx_len = 64};
    tide_model *m = NULL;
    if (tide_model_new(ctx, *ck, be, &mo, &m)) fail_msg("model_new: %s", tide_ctx_last_error(ctx));
    return m;
}

/* Every position's logits of the prompt, resident on the CPU, f32 products
 * (a bf16 adapter's weights widened, not its activations rounded). */
static void forward(const char *adir, float *out) {
    tide_ctx *ctx = tide_ctx_new();
    tide_ctx_set_threads(ctx, 2);
    tide_backend *be = NULL;
    assert_int_equal(tide_backend_new(ctx, TIDE_BACKEND_CPU, &be), TIDE_OK);
    assert_int_equal(tide_backend_set_matmul(be, TIDE_MATMUL_F32), TIDE_OK);
    tide_checkpoint *ck = NULL;
    tide_model *m = open_model(ctx, be, adir, &ck);
    if (tide_model_forward(m, prompt, 1, n_prompt, 0, out)) fail_msg("forward: %s", tide_ctx_last_error(ctx));
    tide_model_free(m);
    tide_checkpoint_free(ck);
    tide_backend_free(be);
    tide_ctx_free(ctx);
}

static double max_abs(const float *a, int n) {
    double m = 0;
    for (int i = 0; i < n; i++) m = fmax(m, fabs((double)a[i]));
    return m;
}

static double max_diff(const float *a, const float *b, int n) {
    double m = 0;
    for (int i = 0; i < n; i++) m = fmax(m, fabs((double)a[i] - (double)b[i]));
    return m;
}

static void test_logits_match_peft(void **state) {
    (void)state;
    const int n = n_prompt * VOCAB;
    float *got = malloc((size_t)n * sizeof *got);
    forward(adapter_dir, got);
    const double scale = max_abs(peft_logits, n), d = max_diff(got, peft_logits, n);
    const double dm = max_diff(got, merged_logits, n), db = max_diff(base_logits, peft_logits, n);
    print_message("    logits: max|tide - peft| %.3g, - merged %.3g, base - peft %.3g (largest logit %.3g)\n", d,
                  dm, db, scale);
    if (d > 2e-6 * scale) fail_msg("tide's LoRA logits are %.3g from PEFT's (bound %.3g)", d, 2e-6 * scale);
    if (dm > 2e-6 * scale) fail_msg("tide's LoRA logits are %.3g from PEFT's merged (bound %.3g)", dm, 2e-6 * scale);
    if (db < 100 * 2e-6 * scale) fail_msg("the base is only %.3g from PEFT: the test tells nothing", db);
    /* the base alone is the base: the adapter changes nothing else */
    forward(NULL, got);
    if (max_diff(got, base_logits, n) > 2e-6 * scale) fail_msg("the base's logits differ from transformers'");
    free(got);
}

/* One generation of want's length on a fresh model, offloaded under o
 * (NULL: resident; plain: the plain engine). */
static void generate(bool cpu, const tide_offload_opts *o, bool plain, int32_t *tok, uint64_t *hash) {
    tide_ctx *ctx = tide_ctx_new();
    tide_ctx_set_threads(ctx, 2);
    tide_backend *be = NULL;
    if (cpu) assert_int_equal(tide_backend_new(ctx, TIDE_BACKEND_CPU, &be), TIDE_OK);
    else be = device_new(ctx);
    tide_checkpoint *ck = NULL;
    tide_model *m = open_model(ctx, be, adapter_dir, &ck);
    if (plain) assert_int_equal(tide_model_set_engine(m, TIDE_ENGINE_PLAIN), TIDE_OK);
    if (o && tide_model_set_offload(m, o)) fail_msg("set_offload: %s", tide_ctx_last_error(ctx));
    tide_gen_stats s;
    int n = 0;
    if (tide_model_generate_ex(m, prompt, n_prompt, n_gen, NULL, tok, &n, &s))
        fail_msg("generate: %s", tide_ctx_last_error(ctx));
    assert_int_equal(n, n_gen);
    *hash = s.logits_hash;
    tide_model_free(m);
    tide_checkpoint_free(ck);
    tide_backend_free(be);
    tide_ctx_free(ctx);
}

static void check_offloaded(bool cpu) {
    int32_t ref[MAX_NEW], got[MAX_NEW];
    uint64_t href = 0, h = 0;
    generate(cpu, NULL, false, ref, &href);
    if (memcmp(ref, want_gen, (size_t)n_gen * sizeof *ref)) fail_msg("%s: tokens differ from PEFT's greedy ones", cpu ? "cpu" : "device");
    if (cpu) {
        generate(cpu, NULL, true, got, &h);
        assert_memory_equal(got, ref, (size_t)n_gen * sizeof *ref);
        assert_true(h == href);
    }
    /* static-layer needs two whole layers: its minimum */
    const char *pol[] = {"tide", "static-layer", "lru"};
    const double frac[] = {0.25, 0, 0.25};
    for (int p = 0; p < 3; p++) {
        tide_offload_opts o = {.budget_kind = frac[p] ? TIDE_BUDGET_FRACTION : TIDE_BUDGET_MIN, .fraction = frac[p],
                               .policy = pol[p],
                               .hw = "a100-80g", .weights_on_ssd = cpu, .ssd_dirs = tmp_dir};
        generate(cpu, &o, false, got, &h);
        if (memcmp(got, ref, (size_t)n_gen * sizeof *ref) || h != href)
            fail_msg("%s, %s at %g of the peak (0: the minimum): not the unconstrained run's tokens and logits", cpu ? "cpu" : "device",
                     pol[p], frac[p]);
    }
}

static void test_offloaded_cpu(void **state) {
    (void)state;
    check_offloaded(true);
}

static void test_offloaded_device(void **state) {
    (void)state;
    check_offloaded(false);
}

/* Every position's logits of the prompt of the checkpoint in dir, resident
 * on the CPU. */
static void forward_dir(const char *dir, float *out) {
    tide_ctx *ctx = tide_ctx_new();
    tide_ctx_set_threads(ctx, 2);
    tide_backend *be = NULL;
    assert_int_equal(tide_backend_new(ctx, TIDE_BACKEND_CPU, &be), TIDE_OK);
    tide_checkpoint *ck = NULL;
    if (tide_checkpoint_open(ctx, dir, &ck)) fail_msg("%s: %s", dir, tide_ctx_last_error(ctx));
    tide_model_opts mo = {.max_batch = 1, .ctx_len = 64};
    tide_model *m = NULL;
    if (tide_model_new(ctx, ck, be, &mo, &m)) fail_msg("model_new: %s", tide_ctx_last_error(ctx));
    if (tide_model_forward(m, prompt, 1, n_prompt, 0, out)) fail_msg("forward: %s", tide_ctx_last_error(ctx));
    tide_model_free(m);
    tide_checkpoint_free(ck);
    tide_backend_free(be);
    tide_ctx_free(ctx);
}

static void test_merged(void **state) {
    (void)state;
    tide_ctx *ctx = tide_ctx_new();
    tide_checkpoint *ck = NULL;
    char out[200];
    snprintf(out, sizeof out, "%s/merged", tmp_dir);
    assert_int_equal(tide_checkpoint_open(ctx, base_dir, &ck), TIDE_OK);
    assert_int_equal(tide_checkpoint_save_merged(ck, out), TIDE_E_INVALID); /* no adapter */
    assert_int_equal(tide_checkpoint_add_lora(ck, adapter_dir), TIDE_OK);
    if (tide_checkpoint_save_merged(ck, out)) fail_msg("save_merged: %s", tide_ctx_last_error(ctx));
    assert_int_equal(tide_checkpoint_save_merged(ck, out), TIDE_E_INVALID); /* exists */
    tide_checkpoint_free(ck);
    tide_ctx_free(ctx);
    const int n = n_prompt * VOCAB;
    float *got = malloc((size_t)n * sizeof *got), *lo = malloc((size_t)n * sizeof *lo);
    forward_dir(out, got);
    forward(adapter_dir, lo);
    const double scale = max_abs(merged_logits, n), d = max_diff(got, merged_logits, n), dl = max_diff(got, lo, n);
    print_message("    merged: max|tide merged - peft merge_and_unload| %.3g, - tide --lora %.3g (largest %.3g)\n", d,
                  dl, scale);
    if (d > 2e-6 * scale) fail_msg("the merged checkpoint's logits are %.3g from PEFT's merged ones", d);
    if (dl > 2e-6 * scale) fail_msg("the merged checkpoint's logits are %.3g from the adapter's at run time", dl);
    free(got);
    free(lo);
}

/* ---------------------------------------------------------------- adapters written here */

static void write_text(const char *dir, const char *name, const char *text) {
    char p[4200];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* The fixture's adapter tensors, f32, in header order. */
typedef struct adapter {
    int n;
    char *name[64];
    int64_t shape[64][2];
    float *data[64];
} adapter;

static void adapter_read(adapter *a) {
    tide_ctx *ctx = tide_ctx_new();
    char p[4200];
    snprintf(p, sizeof p, "%s/adapter_model.safetensors", adapter_dir);
    tide_st_file f;
    assert_int_equal(tide_st_open(ctx, p, &f), TIDE_OK);
    memset(a, 0, sizeof *a);
    const cJSON *e;
    cJSON_ArrayForEach(e, f.header) {
        if (!strcmp(e->string, "__metadata__")) continue;
        tide_st_tensor t;
        assert_int_equal(tide_st_tensor_read(ctx, p, &f, e, &t), TIDE_OK);
        assert_int_equal(t.dtype, TIDE_F32);
        assert_true(a->n < 64);
        a->name[a->n] = strdup(e->string);
        a->shape[a->n][0] = t.shape[0];
        a->shape[a->n][1] = t.shape[1];
        a->data[a->n] = malloc(t.nbytes);
        memcpy(a->data[a->n], f.map + t.offset, t.nbytes);
        a->n++;
    }
    tide_st_close(&f);
    tide_ctx_free(ctx);
}

typedef struct wfill {
    const adapter *a;
    const int *ids;
    const tide_dtype *dt;
} wfill;

static tide_status fill(void *user, int i, uint64_t e0, uint64_t n, void *dst) {
    const wfill *w = user;
    const float *src = w->a->data[w->ids[i]] + e0;
    if (w->dt[i] == TIDE_F32) memcpy(dst, src, n * sizeof(float));
    else
        for (uint64_t k = 0; k < n; k++) ((uint16_t *)dst)[k] = tide_f32_to_bf16(src[k]);
    return TIDE_OK;
}

/* An adapter_model.safetensors in dir of a's tensors but `skip` (-1: none),
 * tensor k in bf16 where bf16 (all: -2). */
static void adapter_write(const adapter *a, const char *dir, int skip, int bf16) {
    tide_st_entry e[64];
    int ids[64];
    tide_dtype dt[64];
    int n = 0;
    for (int i = 0; i < a->n; i++) {
        if (i == skip) continue;
        dt[n] = bf16 == -2 || bf16 == i ? TIDE_BF16 : TIDE_F32;
        e[n] = (tide_st_entry){a->name[i], dt[n], 2, {a->shape[i][0], a->shape[i][1]}};
        ids[n++] = i;
    }
    char p[4200];
    snprintf(p, sizeof p, "%s/adapter_model.safetensors", dir);
    tide_ctx *ctx = tide_ctx_new();
    wfill w = {a, ids, dt};
    if (tide_safetensors_write(ctx, p, e, n, NULL, 0, fill, &w)) fail_msg("%s", tide_ctx_last_error(ctx));
    tide_ctx_free(ctx);
}

static void copy_config(const char *dir) {
    char src[4200], *text = NULL;
    snprintf(src, sizeof src, "%s/adapter_config.json", adapter_dir);
    FILE *f = fopen(src, "r");
    assert_non_null(f);
    text = calloc(1, 1 << 16);
    size_t n = fread(text, 1, (1 << 16) - 1, f);
    fclose(f);
    text[n] = '\0';
    write_text(dir, "adapter_config.json", text);
    free(text);
}

static void test_bf16_adapter(void **state) {
    (void)state;
    adapter a;
    adapter_read(&a);
    /* the f32 adapter of the bf16-rounded values, and the bf16 one */
    for (int i = 0; i < a.n; i++) {
        const uint64_t n = (uint64_t)(a.shape[i][0] * a.shape[i][1]);
        for (uint64_t k = 0; k < n; k++) a.data[i][k] = tide_bf16_to_f32(tide_f32_to_bf16(a.data[i][k]));
    }
    char d32[200], d16[200];
    snprintf(d32, sizeof d32, "%s/rounded", tmp_dir);
    snprintf(d16, sizeof d16, "%s/bf16", tmp_dir);
    mkdir(d32, 0777);
    mkdir(d16, 0777);
    copy_config(d32);
    copy_config(d16);
    adapter_write(&a, d32, -1, -1);
    adapter_write(&a, d16, -1, -2);
    const int n = n_prompt * VOCAB;
    float *x = malloc((size_t)n * sizeof *x), *y = malloc((size_t)n * sizeof *y);
    forward(d32, x);
    forward(d16, y);
    const double d = max_diff(x, y, n), scale = max_abs(x, n);
    print_message("    bf16 adapter: max|bf16 - f32 of the same values| %.3g (largest logit %.3g)\n", d, scale);
    if (d > 2e-6 * scale) fail_msg("the bf16 adapter is %.3g from the f32 one of its values", d);
    free(x);
    free(y);
    for (int i = 0; i < a.n; i++) {
        free(a.name[i]);
        free(a.data[i]);
    }
}

/* add_lora on dir fails with st and a message holding `what`; the checkpoint
 * is as it was. */
static void refused(const char *dir, tide_status st, const char *what) {
    tide_ctx *ctx = tide_ctx_new();
    tide_checkpoint *ck = NULL;
    assert_int_equal(tide_checkpoint_open(ctx, base_dir, &ck), TIDE_OK);
    const int before = tide_checkpoint_n_tensors(ck);
    tide_status got = tide_checkpoint_add_lora(ck, dir);
    const char *msg = tide_ctx_last_error(ctx);
    print_message("    %s: %s\n", what, msg);
    if (got != st) fail_msg("%s: status %d, not %d (%s)", what, got, st, msg);
    if (!strstr(msg, what)) fail_msg("the message '%s' does not say '%s'", msg, what);
    assert_int_equal(tide_checkpoint_n_tensors(ck), before);
    assert_int_equal(tide_checkpoint_config(ck)->lora_r, 0);
    /* and the checkpoint still takes the good adapter, once */
    assert_int_equal(tide_checkpoint_add_lora(ck, adapter_dir), TIDE_OK);
    assert_int_equal(tide_checkpoint_n_tensors(ck), before + 28);
    assert_int_equal(tide_checkpoint_config(ck)->lora_r, 4);
    assert_int_equal(tide_checkpoint_add_lora(ck, adapter_dir), TIDE_E_UNSUPPORTED);
    tide_checkpoint_free(ck);
    tide_ctx_free(ctx);
}

static const char cfg_fmt[] = "{\"peft_type\": \"LORA\", \"r\": %d, \"lora_alpha\": 8, \"target_modules\": [%s]%s}\n";
static const char all_targets[] =
    "\"q_proj\", \"k_proj\", \"v_proj\", \"o_proj\", \"gate_proj\", \"up_proj\", \"down_proj\"";

static void bad_dir(const char *name, int r, const char *targets, const char *extra, const adapter *a, int skip,
                    int bf16, char *out, size_t n) {
    snprintf(out, n, "%s/%s", tmp_dir, name);
    mkdir(out, 0777);
    char text[1024];
    snprintf(text, sizeof text, cfg_fmt, r, targets, extra);
    write_text(out, "adapter_config.json", text);
    if (a) adapter_write(a, out, skip, bf16);
}

static void test_bad_adapters(void **state) {
    (void)state;
    adapter a;
    adapter_read(&a);
    char d[300];
    snprintf(d, sizeof d, "%s/none", tmp_dir);
    refused(d, TIDE_E_NOT_FOUND, "adapter_config.json");
    bad_dir("nofile", 4, all_targets, "", NULL, -1, -1, d, sizeof d);
    refused(d, TIDE_E_NOT_FOUND, "adapter_model.safetensors");
    bad_dir("r8", 8, all_targets, "", &a, -1, -1, d, sizeof d);
    refused(d, TIDE_E_FORMAT, "r 8 on this model's");
    bad_dir("qonly", 4, "\"q_proj\"", "", &a, -1, -1, d, sizeof d);
    refused(d, TIDE_E_FORMAT, "is not a lora_A or lora_B weight");
    bad_dir("unknown", 4, "\"mlp\"", "", &a, -1, -1, d, sizeof d);
    refused(d, TIDE_E_FORMAT, "'mlp'");
    bad_dir("dora", 4, all_targets, ", \"use_dora\": true", &a, -1, -1, d, sizeof d);
    refused(d, TIDE_E_FORMAT, "DoRA");
    bad_dir("missing", 4, all_targets, "", &a, 5, -1, d, sizeof d);
    refused(d, TIDE_E_FORMAT, "has no tensor");
    bad_dir("mixed", 4, all_targets, "", &a, -1, 3, d, sizeof d);
    refused(d, TIDE_E_FORMAT, "all f32, all f16 or all bf16");
    for (int i = 0; i < a.n; i++) {
        free(a.name[i]);
        free(a.data[i]);
    }
}

int main(int argc, char **argv) {
    const char *fx = getenv("TIDE_FIXTURES");
    if (!fx) {
        fprintf(stderr, "TIDE_FIXTURES is not set\n");
        return 1;
    }
    snprintf(base_dir, sizeof base_dir, "%s/train/train-f32-gqa", fx);
    snprintf(adapter_dir, sizeof adapter_dir, "%s/train/lora-f32-gqa/adapter_init", fx);
    snprintf(run_file, sizeof run_file, "%s/train/lora-f32-gqa/run_logits.safetensors", fx);
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/tide-lora-XXXXXX");
    if (!mkdtemp(tmp_dir)) {
        perror("mkdtemp");
        return 1;
    }
    load_fixture();
    struct CMUnitTest tests[] = {
        cmocka_unit_test(test_logits_match_peft),
        cmocka_unit_test(test_offloaded_cpu),
        cmocka_unit_test(test_offloaded_device),
        cmocka_unit_test(test_merged),
        cmocka_unit_test(test_bf16_adapter),
        cmocka_unit_test(test_bad_adapters),
    };
    size_t n = test_select(tests, sizeof tests / sizeof tests[0], argc, argv);
    int rc = n ? _cmocka_run_group_tests("test_lora", tests, n, NULL, NULL) : 1;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp_dir);
    if (system(cmd)) rc = rc ? rc : 1;
    free(peft_logits);
    free(merged_logits);
    free(base_logits);
    return rc;
}
