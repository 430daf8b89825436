/*
 * test_qlora.c - QLoRA (LoRA on a block-quantized frozen base) through the
 * public API (tide.h: tide_trainer_opts.lora_base_type, tide_qlora_config):
 *
 *   - against tide's own f32 path: QLoRA steps on the train-f32-gqa fixture
 *     with its projections quantized to Q4_0 at load, from the PEFT adapter
 *     of lora-f32-gqa, against LoRA steps on a safetensors checkpoint that
 *     holds the same base dequantized to f32 (every projection row quantized
 *     and dequantized by the reference, src/core/quant.h); and QLoRA on a
 *     GGUF Q8_0 file tide_quantize_checkpoint makes of the fixture (its
 *     embedding and head quantized too, its q/k rows in llama.cpp's order)
 *     against LoRA on that file dequantized, q/k rows put back. The only
 *     difference left is the forward's 8-bit activations (the inference
 *     kernel's, docs/quantization.md: each within 1/254 of its block's
 *     largest) against f32 ones: over 4 steps the losses and gradient norms
 *     within 5e-3 relative, step 1's adapter gradients within 3e-2 of their
 *     tensor's largest (seen: 2.3e-3 and 1.2e-2 with Q4_0, 1.2e-3 and 1.4e-2
 *     with the GGUF file). The check can fail: the same steps on the
 *     unquantized base are asserted farther from QLoRA's than both bounds
 *     (seen: 1.3e-2 and 0.25; Q4_0's weight error is larger than the
 *     activations'), and a q/k row order not put back scrambles RoPE. (The
 *     adapters after several steps are not compared: AdamW turns gradient
 *     elements near zero into steps of lr whatever their size.) Offloaded
 *     at the minimum budget, the GGUF QLoRA steps are bit for bit the
 *     resident ones;
 *   - the minimum budget of a QLoRA step (Q8_0 projections) is below the
 *     LoRA step's on the bf16 base (the planner moves the quantized bytes);
 *   - bad input: an unknown base type, a base type without LoRA, a type
 *     whose blocks the rows cannot hold (Q4_K's 256 on rows of 64), a base
 *     type on a base already quantized: each refused with a message.
 * (Offloaded QLoRA steps bit for bit: test_train's
 * test_lora_offload_bit_identical; the CLI: tests/cli_qlora.sh.)
 */
#include "tide.h"
#include "core/quant.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

static const char *fixtures(void) {
    const char *f = getenv("TIDE_FIXTURES");
    return f ? f : "tests/fixtures";
}

static char tmpdir[512];

static void make_tmp(void) {
    const char *t = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(tmpdir, sizeof tmpdir, "%s/test_qlora.XXXXXX", t);
    assert_non_null(mkdtemp(tmpdir));
}

static void rm_tmp(void) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd)) print_message("could not remove %s\n", tmpdir);
}

/* ---------------------------------------------------------------- runs */

typedef struct run_out {
    double loss[8], norm[8];
    uint64_t budget;
    int n;
    char *names[64];
    float *vals[64];
    uint64_t bytes[64];
} run_out;

static void run_free(run_out *r) {
    for (int i = 0; i < r->n; i++) free(r->names[i]), free(r->vals[i]);
    memset(r, 0, sizeof *r);
}

static uint16_t *data;
static int64_t n_data;

static void load_data(void) {
    char path[1024];
    snprintf(path, sizeof path, "%s/train/train-f32-gqa/data.u16", fixtures());
    FILE *fp = fopen(path, "rb");
    if (!fp) fail_msg("cannot open %s", path);
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    data = malloc((size_t)n);
    assert_int_equal(fread(data, 1, (size_t)n, fp), (size_t)n);
    fclose(fp);
    n_data = n / 2;
}

/* The step options of the lora-f32-gqa fixture (its hparams), from its
 * PEFT adapter. */
static char lora_init[1100];
static tide_trainer_opts lora_opts(void) {
    snprintf(lora_init, sizeof lora_init, "%s/train/lora-f32-gqa/adapter_init", fixtures());
    tide_trainer_opts o = tide_trainer_opts_default();
    o.step.batch = 2, o.step.seq = 16, o.step.accum = 2;
    o.step.beta1 = 0.9f, o.step.beta2 = 0.95f, o.step.eps = 1e-8f, o.step.weight_decay = 0.1f;
    o.step.grad_clip = 0.14f;
    o.step.lora_r = 4, o.step.lora_alpha = 8, o.step.lora_targets = TIDE_LORA_ALL;
    o.lr = 0.01, o.min_lr = 0.001, o.cosine = true, o.warmup = 3, o.total_steps = 10;
    o.lora_init = lora_init;
    return o;
}

/* `steps` steps of ck's model (resident, or offloaded as off says); every
 * step's loss and norm, and the adapters at the end. */
static tide_status train(tide_ctx *ctx, tide_checkpoint *ck, const tide_trainer_opts *o,
                         const tide_offload_opts *off, int steps, run_out *out) {
    memset(out, 0, sizeof *out);
    tide_backend *be = NULL;
    tide_trainer *t = NULL;
    tide_status st = tide_backend_new(ctx, TIDE_BACKEND_CPU, &be);
    if (!st) st = tide_backend_set_matmul(be, TIDE_MATMUL_F32);
    if (!st) st = tide_trainer_new(ctx, ck, be, o, &t);
    if (!st && off) st = tide_trainer_set_offload(t, off);
    const int B = o->step.batch, T = o->step.seq, A = o->step.accum;
    int32_t *in = malloc((size_t)B * T * A * 4), *tg = malloc((size_t)B * T * A * 4);
    const int64_t W = n_data - T - 1;
    for (int s = 0; !st && s < steps; s++) {
        for (int m = 0; m < A; m++)
            for (int b = 0; b < B; b++) {
                int64_t start = ((((int64_t)s * A + m) * B + b) * T) % W;
                for (int k = 0; k < T; k++) {
                    in[((size_t)m * B + b) * T + k] = data[start + k];
                    tg[((size_t)m * B + b) * T + k] = data[start + k + 1];
                }
            }
        tide_train_stats ts;
        if ((st = tide_trainer_step(t, in, tg, &ts))) break;
        out->loss[s] = ts.loss, out->norm[s] = ts.grad_norm, out->budget = ts.budget_bytes;
    }
    /* the adapters (not their moments), or with grads_out their last gradients */
    for (int i = 0; !st && i < tide_trainer_n_tensors(t); i++) {
        uint64_t nb = 0;
        const char *name = tide_trainer_tensor(t, i, NULL, &nb);
        if (strncmp(name, "base_model.model.", 17)) continue;
        assert_true(out->n < 64);
        char gn[300];
        snprintf(gn, sizeof gn, "%s%s", o->step.grads_out ? "grad." : "", name);
        out->names[out->n] = strdup(gn);
        out->vals[out->n] = malloc(nb);
        out->bytes[out->n] = nb;
        st = tide_trainer_read(t, gn, out->vals[out->n], nb);
        out->n++;
    }
    free(in);
    free(tg);
    tide_trainer_free(t);
    tide_backend_free(be);
    return st;
}

/* The largest relative loss and gradient norm difference over the steps,
 * and the largest difference of a collected element (the adapters, or their
 * gradients) relative to its tensor's largest. */
static void diff(const run_out *a, const run_out *b, int steps, double *dloss, double *dad) {
    *dloss = *dad = 0;
    for (int s = 0; s < steps; s++) {
        *dloss = fmax(*dloss, fabs(a->loss[s] - b->loss[s]) / fabs(b->loss[s]));
        *dloss = fmax(*dloss, fabs(a->norm[s] - b->norm[s]) / fabs(b->norm[s]));
    }
    assert_int_equal(a->n, b->n);
    for (int i = 0; i < a->n; i++) {
        assert_string_equal(a->names[i], b->names[i]);
        size_t n = a->bytes[i] / 4;
        double big = 0, d = 0;
        for (size_t k = 0; k < n; k++) {
            big = fmax(big, fabs(b->vals[i][k]));
            d = fmax(d, fabs((double)a->vals[i][k] - b->vals[i][k]));
        }
        *dad = fmax(*dad, d / fmax(big, 1e-30));
    }
}

/* ---------------------------------------------------------------- the f32 reference */

static bool ends(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

/* Writes dir/config.json and dir/model.safetensors: ck's base in f32, each
 * row dequantized (a GGUF's q/k rows back in Hugging Face's order), and with
 * base_type every projection row quantized to it and dequantized. */
static void write_reference(tide_ctx *ctx, const tide_checkpoint *ck, const char *base_type, const char *dir) {
    tide_dtype bt = TIDE_F32;
    if (base_type) assert_int_equal(tide_dtype_parse(base_type, &bt), 0);
    mkdir(dir, 0777);
    tide_llama_config cfg = *tide_checkpoint_config(ck);
    const bool il = cfg.qk_interleaved;
    cfg.dtype = TIDE_F32, cfg.wtypes_set = false, cfg.qk_interleaved = false;
    char path[1200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    assert_int_equal(tide_llama_config_save(ctx, &cfg, path), TIDE_OK);
    const int n = tide_checkpoint_n_tensors(ck);
    float **vals = calloc((size_t)n, sizeof *vals);
    char *header = malloc(65536);
    size_t hl = 0, off = 0;
    hl += (size_t)snprintf(header + hl, 65536 - hl, "{");
    for (int i = 0; i < n; i++) {
        tide_tensor_info ti;
        assert_int_equal(tide_checkpoint_get_index(ck, i, &ti), TIDE_OK);
        const int64_t rows = ti.ndim == 2 ? ti.shape[0] : 1, cols = ti.ndim == 2 ? ti.shape[1] : ti.shape[0];
        const size_t in_row = (size_t)tide_dtype_bytes(ti.dtype, (uint64_t)cols);
        int heads = 0;
        if (il && ends(ti.name, "self_attn.q_proj.weight")) heads = cfg.num_attention_heads;
        if (il && ends(ti.name, "self_attn.k_proj.weight")) heads = cfg.num_key_value_heads;
        const bool proj = base_type && ends(ti.name, "_proj.weight");
        float *v = vals[i] = malloc((size_t)(rows * cols) * 4);
        void *blk = malloc((size_t)tide_dtype_bytes(bt, (uint64_t)cols) + 1);
        for (int64_t r = 0; r < rows; r++) {
            int64_t sr = r;
            if (heads) { /* Hugging Face's row j * d/2 + i of a head is llama.cpp's 2i + j */
                int64_t d = rows / heads, h = r / d, k = r % d;
                sr = h * d + 2 * (k % (d / 2)) + k / (d / 2);
            }
            assert_int_equal(tide_dequantize_row(ti.dtype, (const char *)ti.data + sr * in_row, v + r * cols, cols), 0);
            if (proj) {
                assert_int_equal(tide_quantize_row(bt, v + r * cols, blk, cols), 0);
                assert_int_equal(tide_dequantize_row(bt, blk, v + r * cols, cols), 0);
            }
        }
        free(blk);
        uint64_t nb = (uint64_t)(rows * cols) * 4;
        hl += (size_t)snprintf(header + hl, 65536 - hl, "%s\"%s\":{\"dtype\":\"F32\",\"shape\":[", i ? "," : "",
                               ti.name);
        if (ti.ndim == 2) hl += (size_t)snprintf(header + hl, 65536 - hl, "%lld,%lld", (long long)rows, (long long)cols);
        else hl += (size_t)snprintf(header + hl, 65536 - hl, "%lld", (long long)cols);
        hl += (size_t)snprintf(header + hl, 65536 - hl, "],\"data_offsets\":[%zu,%llu]}", off,
                               (unsigned long long)(off + nb));
        off += nb;
    }
    hl += (size_t)snprintf(header + hl, 65536 - hl, "}");
    assert_true(hl < 65000);
    while (hl % 8) header[hl++] = ' ';
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    uint64_t len = hl;
    assert_int_equal(fwrite(&len, 8, 1, fp), 1);
    assert_int_equal(fwrite(header, 1, hl, fp), hl);
    for (int i = 0; i < n; i++) {
        tide_tensor_info ti;
        tide_checkpoint_get_index(ck, i, &ti);
        size_t cnt = (size_t)(ti.ndim == 2 ? ti.shape[0] * ti.shape[1] : ti.shape[0]);
        assert_int_equal(fwrite(vals[i], 4, cnt, fp), cnt);
        free(vals[i]);
    }
    assert_int_equal(fclose(fp), 0);
    free(vals);
    free(header);
}

#define STEPS 4
/* Tolerances against the f32 path (the header's): the losses and gradient
 * norms of every step, relative; step 1's adapter gradients, elementwise
 * against their tensor's largest. */
#define TOL_LOSS 5e-3
#define TOL_GRAD 3e-2

/* QLoRA on ck (base_type, or as stored) against LoRA on ref (the same base
 * dequantized to f32), and where plain is given against LoRA on it (the
 * unquantized base, which must be farther): STEPS steps' losses and norms,
 * and step 1's adapter gradients. */
static void compare(tide_ctx *ctx, tide_checkpoint *ck, const char *base_type, tide_checkpoint *ref,
                    tide_checkpoint *plain, const char *what) {
    tide_trainer_opts o = lora_opts();
    run_out q[2], r[2], p[2];
    for (int g = 0; g < 2; g++) { /* STEPS steps; step 1 with its gradients */
        o.step.grads_out = g;
        const int n = g ? 1 : STEPS;
        o.lora_base_type = base_type;
        if (train(ctx, ck, &o, NULL, n, &q[g])) fail_msg("%s, QLoRA: %s", what, tide_ctx_last_error(ctx));
        o.lora_base_type = NULL;
        if (train(ctx, ref, &o, NULL, n, &r[g])) fail_msg("%s, reference: %s", what, tide_ctx_last_error(ctx));
        if (plain && train(ctx, plain, &o, NULL, n, &p[g]))
            fail_msg("%s, unquantized: %s", what, tide_ctx_last_error(ctx));
    }
    double dl, dx, dg;
    diff(&q[0], &r[0], STEPS, &dl, &dx);
    diff(&q[1], &r[1], 1, &dx, &dg);
    print_message("  %s, %d steps: loss %.7f (f32 reference %.7f); against the reference: losses and norms "
                  "%.2e, step-1 adapter gradients %.2e\n", what, STEPS, q[0].loss[STEPS - 1], r[0].loss[STEPS - 1],
                  dl, dg);
    assert_true(dl < TOL_LOSS);
    assert_true(dg < TOL_GRAD);
    if (plain) { /* the check can fail: the unquantized base is farther than that */
        double pl, pg;
        diff(&q[0], &p[0], STEPS, &pl, &dx);
        diff(&q[1], &p[1], 1, &dx, &pg);
        print_message("  %s against the unquantized base: losses and norms %.2e, gradients %.2e\n", what, pl, pg);
        assert_true(pl > TOL_LOSS && pg > TOL_GRAD);
    }
    for (int g = 0; g < 2; g++) {
        run_free(&q[g]), run_free(&r[g]);
        if (plain) run_free(&p[g]);
    }
}

static void test_reference_base_type(void **state) {
    (void)state;
    tide_ctx *ctx = tide_ctx_new();
    make_tmp();
    char base[1100], ref_dir[700];
    snprintf(base, sizeof base, "%s/train/train-f32-gqa", fixtures());
    snprintf(ref_dir, sizeof ref_dir, "%s/ref", tmpdir);
    tide_checkpoint *ck = NULL, *ref = NULL;
    assert_int_equal(tide_checkpoint_open(ctx, base, &ck), TIDE_OK);
    write_reference(ctx, ck, "q4_0", ref_dir);
    assert_int_equal(tide_checkpoint_open(ctx, ref_dir, &ref), TIDE_OK);
    compare(ctx, ck, "q4_0", ref, ck, "--base-type q4_0");
    tide_checkpoint_free(ck);
    tide_checkpoint_free(ref);
    rm_tmp();
    tide_ctx_free(ctx);
}

static void test_reference_gguf(void **state) {
    (void)state;
    tide_ctx *ctx = tide_ctx_new();
    make_tmp();
    char base[1100], gguf[700], ref_dir[700];
    snprintf(base, sizeof base, "%s/train/train-f32-gqa", fixtures());
    snprintf(gguf, sizeof gguf, "%s/base-q8_0.gguf", tmpdir);
    snprintf(ref_dir, sizeof ref_dir, "%s/ref", tmpdir);
    if (tide_quantize_checkpoint(ctx, base, gguf, "Q8_0", NULL)) fail_msg("quantize: %s", tide_ctx_last_error(ctx));
    tide_checkpoint *ck = NULL, *ref = NULL;
    assert_int_equal(tide_checkpoint_open(ctx, gguf, &ck), TIDE_OK);
    const tide_llama_config *gc = tide_checkpoint_config(ck);
    assert_true(gc->qk_interleaved && gc->wtypes_set);
    assert_int_equal(tide_llama_weight_dtype(gc, "lm_head.weight"), TIDE_Q8_0);
    assert_int_equal(tide_llama_weight_dtype(gc, "model.layers.1.mlp.down_proj.weight"), TIDE_Q8_0);
    /* the step's types: projections as stored, the head widened, the norms as stored */
    tide_llama_config qc;
    assert_int_equal(tide_qlora_config(ctx, gc, NULL, &qc), TIDE_OK);
    assert_int_equal(tide_llama_weight_dtype(&qc, "model.layers.0.self_attn.q_proj.weight"), TIDE_Q8_0);
    assert_int_equal(tide_llama_weight_dtype(&qc, "lm_head.weight"), TIDE_F32);
    assert_int_equal(tide_llama_weight_dtype(&qc, "model.embed_tokens.weight"), TIDE_F32);
    assert_int_equal(tide_llama_weight_dtype(&qc, "model.norm.weight"), TIDE_F32);
    assert_false(qc.qk_interleaved);
    write_reference(ctx, ck, NULL, ref_dir);
    assert_int_equal(tide_checkpoint_open(ctx, ref_dir, &ref), TIDE_OK);
    compare(ctx, ck, NULL, ref, NULL, "GGUF Q8_0");
    tide_trainer_opts o = lora_opts();
    run_out q;
    if (train(ctx, ck, &o, NULL, STEPS, &q)) fail_msg("QLoRA on GGUF: %s", tide_ctx_last_error(ctx));
    /* offloaded at the (untiled) minimum, state on SSD: bit for bit the
     * resident run */
    tide_offload_opts off = {.policy = "tide", .hw = "h100-80g", .ssd_dirs = tmpdir, .budget_kind = TIDE_BUDGET_MIN,
                             .host_budget = 4096, .tile = TIDE_TILE_NONE};
    run_out m;
    if (train(ctx, ck, &o, &off, STEPS, &m)) fail_msg("QLoRA on GGUF offloaded: %s", tide_ctx_last_error(ctx));
    for (int s = 0; s < STEPS; s++) {
        assert_memory_equal(&m.loss[s], &q.loss[s], sizeof m.loss[s]);
        assert_memory_equal(&m.norm[s], &q.norm[s], sizeof m.norm[s]);
    }
    for (int i = 0; i < q.n; i++) assert_memory_equal(m.vals[i], q.vals[i], q.bytes[i]);
    run_free(&q), run_free(&m);
    tide_checkpoint_free(ck);
    tide_checkpoint_free(ref);
    rm_tmp();
    tide_ctx_free(ctx);
}

/* ---------------------------------------------------------------- the minimum budget */

static void test_min_budget(void **state) {
    (void)state;
    tide_ctx *ctx = tide_ctx_new();
    make_tmp();
    char base[1100];
    snprintf(base, sizeof base, "%s/train/train-bf16-gqa", fixtures());
    tide_checkpoint *ck = NULL;
    assert_int_equal(tide_checkpoint_open(ctx, base, &ck), TIDE_OK);
    tide_trainer_opts o = lora_opts();
    o.lora_init = NULL;
    tide_offload_opts off = {.policy = "tide", .hw = "h100-80g", .ssd_dirs = tmpdir, .budget_kind = TIDE_BUDGET_MIN};
    run_out lo, q;
    if (train(ctx, ck, &o, &off, 1, &lo)) fail_msg("LoRA: %s", tide_ctx_last_error(ctx));
    o.lora_base_type = "q8_0";
    if (train(ctx, ck, &o, &off, 1, &q)) fail_msg("QLoRA: %s", tide_ctx_last_error(ctx));
    print_message("  minimum budget: LoRA on the bf16 base %llu bytes, QLoRA (Q8_0) %llu\n",
                  (unsigned long long)lo.budget, (unsigned long long)q.budget);
    assert_true(q.budget > 0 && q.budget < lo.budget);
    run_free(&lo), run_free(&q);
    tide_checkpoint_free(ck);
    rm_tmp();
    tide_ctx_free(ctx);
}

/* ---------------------------------------------------------------- bad input */

static void expect_refused(tide_checkpoint *ck, const tide_trainer_opts *o, tide_status want, const char *text) {
    tide_ctx *ctx = tide_ctx_new();
    tide_backend *be = NULL;
    tide_trainer *t = NULL;
    assert_int_equal(tide_backend_new(ctx, TIDE_BACKEND_CPU, &be), TIDE_OK);
    tide_status st = tide_trainer_new(ctx, ck, be, o, &t);
    const char *msg = tide_ctx_last_error(ctx);
    if (st != want || !strstr(msg, text))
        fail_msg("expected status %d with '%s', got %d: %s", want, text, st, msg);
    assert_null(t);
    tide_backend_free(be);
    tide_ctx_free(ctx);
}

static void test_bad_input(void **state) {
    (void)state;
    tide_ctx *ctx = tide_ctx_new();
    char base[1100];
    snprintf(base, sizeof base, "%s/train/train-bf16-gqa", fixtures());
    tide_checkpoint *ck = NULL, *gg = NULL;
    assert_int_equal(tide_checkpoint_open(ctx, base, &ck), TIDE_OK);
    tide_trainer_opts o = lora_opts();
    o.lora_init = NULL;
    o.lora_base_type = "q3_k";
    expect_refused(ck, &o, TIDE_E_INVALID, "'q3_k'");
    o.lora_base_type = "bf16";
    expect_refused(ck, &o, TIDE_E_INVALID, "not a block type");
    o.lora_base_type = "q4_k"; /* rows of 64: not whole 256-element blocks */
    expect_refused(ck, &o, TIDE_E_INVALID, "rows of 64");
    o.lora_base_type = "q8_0";
    o.step.lora_r = 0;
    expect_refused(ck, &o, TIDE_E_INVALID, "needs LoRA");
    /* a base already quantized */
    snprintf(base, sizeof base, "%s/gguf/tiny-f16-sharded-q8_0.gguf", fixtures());
    assert_int_equal(tide_checkpoint_open(ctx, base, &gg), TIDE_OK);
    tide_llama_config qc;
    assert_int_equal(tide_qlora_config(ctx, tide_checkpoint_config(gg), "q4_0", &qc), TIDE_E_UNSUPPORTED);
    assert_non_null(strstr(tide_ctx_last_error(ctx), "quantized already"));
    /* a full fine-tune of a quantized base stays refused */
    o = lora_opts();
    o.lora_init = NULL, o.step.lora_r = 0;
    expect_refused(gg, &o, TIDE_E_UNSUPPORTED, "GGUF");
    tide_checkpoint_free(ck);
    tide_checkpoint_free(gg);
    tide_ctx_free(ctx);
}

int main(void) {
    load_data();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reference_base_type),
        cmocka_unit_test(test_reference_gguf),
        cmocka_unit_test(test_min_budget),
        cmocka_unit_test(test_bad_input),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    free(data);
    return rc;
}
