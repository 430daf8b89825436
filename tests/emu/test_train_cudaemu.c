/*
 * test_train_cudaemu.c - training on the CUDA backend, run on the emulated
 * GPU (tests/emu/backend_emu.cmake links it against tide_cudaemu): the
 * committed fixture tests/fixtures/train/train-bf16-gqa (bf16 parameters
 * with f32 masters, grouped-query attention, two micro-batches, clipping)
 * trained for 3 steps through the public trainer API (tide.h):
 *
 *   - resident (parameters, masters and moments kept warm in device memory);
 *   - offloaded at 25% of the step's peak and at the minimum budget, the
 *     training state homed in host memory, and at the minimum budget homed
 *     on SSD (a host budget below the state);
 *
 * all of it with the gradients as temporaries and as outputs (the last
 * step's gradients then compared too), and in the backend's fast matmul
 * mode (activations rounded to bf16 for the bf16 weights' products: 1e-3
 * of the CPU's losses). Every offloaded run bit-identical to the resident one (each step's loss
 * and gradient norm, every parameter, master and moment at the end: the
 * kernels' sums do not depend on where the planner put the bytes or on when
 * the streams ran), the resident run the same bits again when repeated, and
 * the losses and gradient norms within 1e-4 relative of the CPU trainer's
 * with the backend's f32 matmuls (f32 both sides, summed in other orders;
 * the CPU matches PyTorch within 1e-5, tests/test_train.c). QLoRA the same
 * (rank-4 adapters on the base's projections quantized to Q8_0 at load: the
 * CUDA kernels dequantize the blocks for the forward and for the input
 * gradients' x . w, the CPU's forward takes 8-bit activations, so 2e-3 of
 * the CPU's losses), offloaded (untiled) bit for bit. The emulated device runs the streams in a
 * random interleaving with random delays (TIDE_EMU_SEED), so bit-identity
 * here covers the ordering of the offloaded plans' copies and computes too.
 */
#include "tide.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#define STEPS 3

/* ---------------------------------------------------------------- the fixture */

typedef struct fixture {
    char dir[1024];
    tide_checkpoint *ck;
    tide_trainer_opts o;
    uint16_t *data;
    size_t n_data;
} fixture;

static double hparam(const cJSON *hp, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(hp, k);
    if (!cJSON_IsNumber(v)) fail_msg("expected.json: no hparams.%s", k);
    return v->valuedouble;
}

static void *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)len + 1);
    assert_non_null(b);
    assert_int_equal(fread(b, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    b[len] = 0;
    *n = (size_t)len;
    return b;
}

static void fixture_open(tide_ctx *ctx, fixture *f, const char *name) {
    memset(f, 0, sizeof *f);
    const char *root = getenv("TIDE_FIXTURES");
    snprintf(f->dir, sizeof f->dir, "%s/train/%s", root ? root : "tests/fixtures", name);
    char path[1100];
    size_t n = 0;
    snprintf(path, sizeof path, "%s/expected.json", f->dir);
    char *txt = slurp(path, &n);
    cJSON *exp = cJSON_Parse(txt);
    free(txt);
    assert_non_null(exp);
    const cJSON *hp = cJSON_GetObjectItemCaseSensitive(exp, "hparams");
    assert_non_null(hp);
    f->o = (tide_trainer_opts){
        .step = {.batch = (int)hparam(hp, "batch_size"), .seq = (int)hparam(hp, "seq_len"),
                 .accum = (int)hparam(hp, "grad_accum"), .beta1 = (float)hparam(hp, "beta1"),
                 .beta2 = (float)hparam(hp, "beta2"), .eps = (float)hparam(hp, "eps"),
                 .weight_decay = (float)hparam(hp, "weight_decay"), .grad_clip = (float)hparam(hp, "grad_clip")},
        .lr = hparam(hp, "lr"), .min_lr = hparam(hp, "min_lr"), .cosine = true,
        .warmup = (int64_t)hparam(hp, "warmup_steps"), .total_steps = (int64_t)hparam(hp, "steps")};
    cJSON_Delete(exp);
    snprintf(path, sizeof path, "%s/data.u16", f->dir);
    f->data = slurp(path, &n);
    f->n_data = n / 2;
    if (tide_checkpoint_open(ctx, f->dir, &f->ck)) fail_msg("%s: %s", f->dir, tide_ctx_last_error(ctx));
}

static void fixture_close(fixture *f) {
    tide_checkpoint_free(f->ck);
    free(f->data);
}

/* Step s's tokens and targets: consecutive windows of the data, as the
 * fixture's script and tests/test_train.c take them. */
static void fixture_batch(const fixture *f, int64_t s, int32_t *in, int32_t *tg) {
    const int B = f->o.step.batch, T = f->o.step.seq, A = f->o.step.accum;
    const int64_t W = (int64_t)f->n_data - T - 1;
    for (int m = 0; m < A; m++)
        for (int b = 0; b < B; b++) {
            int64_t start = (((s * A + m) * B + b) * T) % W;
            for (int t = 0; t < T; t++) {
                size_t k = ((size_t)m * B + b) * T + (size_t)t;
                in[k] = f->data[start + t];
                tg[k] = f->data[start + t + 1];
            }
        }
}

/* ---------------------------------------------------------------- runs */

typedef struct run {
    double loss[STEPS], norm[STEPS];
    int n;
    char **names;
    void **vals;
    uint64_t *bytes;
    uint64_t state_bytes;
    uint64_t ssd_bytes; /* read and written by the steps */
} run;

static void run_free(run *r) {
    for (int i = 0; i < r->n; i++) {
        free(r->names[i]);
        free(r->vals[i]);
    }
    free(r->names);
    free(r->vals);
    free(r->bytes);
    memset(r, 0, sizeof *r);
}

/* STEPS steps of f's model on be, offloaded as off says (NULL: resident);
 * every step's loss and norm, then every persistent tensor (and, with
 * f->o.step.grads_out, the last step's gradients after them). */
static void train(tide_ctx *ctx, fixture *f, tide_backend *be, const tide_offload_opts *off, const char *what,
                  run *out) {
    memset(out, 0, sizeof *out);
    tide_trainer *t = NULL;
    tide_status st = tide_trainer_new(ctx, f->ck, be, &f->o, &t);
    if (!st && off) st = tide_trainer_set_offload(t, off);
    if (st) fail_msg("%s: %s", what, tide_ctx_last_error(ctx));
    const size_t R = (size_t)f->o.step.batch * f->o.step.seq * f->o.step.accum;
    int32_t *in = malloc(R * 4), *tg = malloc(R * 4);
    assert_true(in && tg);
    for (int s = 0; s < STEPS; s++) {
        fixture_batch(f, s, in, tg);
        tide_train_stats ts;
        if (tide_trainer_step(t, in, tg, &ts)) fail_msg("%s, step %d: %s", what, s, tide_ctx_last_error(ctx));
        out->loss[s] = ts.loss;
        out->norm[s] = ts.grad_norm;
        out->ssd_bytes += ts.bytes_ssd_read + ts.bytes_ssd_write;
    }
    const int np = tide_trainer_n_tensors(t);
    out->n = f->o.step.grads_out ? 2 * np : np;
    out->names = calloc((size_t)out->n, sizeof *out->names);
    out->vals = calloc((size_t)out->n, sizeof *out->vals);
    out->bytes = calloc((size_t)out->n, sizeof *out->bytes);
    assert_true(out->names && out->vals && out->bytes);
    for (int i = 0; i < out->n; i++) {
        tide_dtype dt;
        uint64_t nb = 0;
        const char *nm = tide_trainer_tensor(t, i % np, &dt, &nb);
        char gn[512];
        snprintf(gn, sizeof gn, "grad.%s", nm);
        bool grad = i >= np;
        if (grad && (!strncmp(nm, "master.", 7) || !strncmp(nm, "exp_avg", 7))) { /* parameters only */
            out->names[i] = strdup("");
            out->vals[i] = malloc(1);
            continue;
        }
        out->bytes[i] = grad ? nb / tide_dtype_size(dt) * 4 : nb; /* gradients are f32 */
        out->names[i] = strdup(grad ? gn : nm);
        out->vals[i] = malloc(out->bytes[i]);
        assert_true(out->names[i] && out->vals[i]);
        if (tide_trainer_read(t, out->names[i], out->vals[i], out->bytes[i]))
            fail_msg("%s: reading '%s': %s", what, out->names[i], tide_ctx_last_error(ctx));
        if (!grad) out->state_bytes += out->bytes[i];
    }
    free(in);
    free(tg);
    tide_trainer_free(t);
}

static void assert_same(const run *a, const run *b, const char *what) {
    for (int s = 0; s < STEPS; s++)
        if (memcmp(&a->loss[s], &b->loss[s], sizeof(double)) || memcmp(&a->norm[s], &b->norm[s], sizeof(double)))
            fail_msg("%s: step %d's loss %.9g and norm %.9g differ from the resident run's %.9g and %.9g", what, s,
                     a->loss[s], a->norm[s], b->loss[s], b->norm[s]);
    assert_int_equal(a->n, b->n);
    for (int i = 0; i < a->n; i++)
        if (a->bytes[i] != b->bytes[i] || memcmp(a->vals[i], b->vals[i], a->bytes[i]))
            fail_msg("%s: '%s' differs from the resident run's", what, a->names[i]);
}

static double rel(double a, double b) { return fabs(a - b) / fmax(fabs(b), 1e-30); }

/* ---------------------------------------------------------------- the test */

/* mode: the CUDA backend's matmul mode; tol: the losses' and gradient
 * norms' bound relative to the CPU's; base_type: QLoRA on the base
 * quantized to it (NULL: a full fine-tune). */
static void train_cuda(bool grads_out, tide_matmul_mode mode, double tol, const char *base_type) {
    tide_ctx *ctx = tide_ctx_new();
    assert_non_null(ctx);
    fixture f;
    fixture_open(ctx, &f, "train-bf16-gqa");
    f.o.step.grads_out = grads_out;
    if (base_type) {
        f.o.step.lora_r = 4, f.o.step.lora_alpha = 8;
        f.o.lora_base_type = base_type;
    }
    tide_backend *cpu = NULL, *gpu = NULL;
    assert_int_equal(tide_backend_new(ctx, TIDE_BACKEND_CPU, &cpu), TIDE_OK);
    if (tide_backend_new(ctx, TIDE_BACKEND_CUDA, &gpu)) fail_msg("cuda backend: %s", tide_ctx_last_error(ctx));
    assert_int_equal(tide_backend_set_matmul(gpu, mode), TIDE_OK);

    run ref, res, again;
    train(ctx, &f, cpu, NULL, "cpu, resident", &ref);
    train(ctx, &f, gpu, NULL, "cuda, resident", &res);
    for (int s = 0; s < STEPS; s++) {
        print_message("  step %d: loss %.9g (cpu %.9g), grad norm %.9g (cpu %.9g)\n", s, res.loss[s], ref.loss[s],
                      res.norm[s], ref.norm[s]);
        if (rel(res.loss[s], ref.loss[s]) > tol || rel(res.norm[s], ref.norm[s]) > tol)
            fail_msg("cuda step %d: loss %.9g, norm %.9g; the cpu's %.9g, %.9g (more than %g apart)", s, res.loss[s],
                     res.norm[s], ref.loss[s], ref.norm[s], tol);
    }
    train(ctx, &f, gpu, NULL, "cuda, resident again", &again);
    assert_same(&again, &res, "cuda, resident again");
    run_free(&again);

    const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    static const struct {
        tide_budget_kind kind;
        bool ssd;
        const char *what;
    } cs[] = {
        {TIDE_BUDGET_FRACTION, false, "cuda, offloaded at 25%, state on host"},
        {TIDE_BUDGET_MIN, false, "cuda, offloaded at the minimum budget, state on host"},
        {TIDE_BUDGET_MIN, true, "cuda, offloaded at the minimum budget, state on SSD"},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        tide_offload_opts off = {.budget_kind = cs[i].kind, .fraction = 0.25, .hw = "h100-80g", .ssd_dirs = tmp};
        /* QLoRA's smaller minimum would tile the step when the refit replans
         * (other bits: those of the run of the same tiles, which
         * tests/test_train.c checks on the CPU); here the untiled plans */
        if (base_type) off.tile = TIDE_TILE_NONE;
        /* a host budget below the training state homes it on SSD */
        if (cs[i].ssd) off.host_budget = res.state_bytes / 3;
        run r;
        train(ctx, &f, gpu, &off, cs[i].what, &r);
        if (cs[i].ssd && !r.ssd_bytes) fail_msg("%s: no byte went to or came from SSD", cs[i].what);
        assert_same(&r, &res, cs[i].what);
        print_message("  %s: bit-identical to the resident run\n", cs[i].what);
        run_free(&r);
    }
    run_free(&ref);
    run_free(&res);
    tide_backend_free(gpu);
    tide_backend_free(cpu);
    fixture_close(&f);
    tide_ctx_free(ctx);
}

static void test_train_cuda(void **state) {
    (void)state;
    train_cuda(false, TIDE_MATMUL_F32, 1e-4, NULL);
}

/* QLoRA: the frozen base's projections in Q8_0 blocks. */
static void test_qlora_cuda(void **state) {
    (void)state;
    train_cuda(false, TIDE_MATMUL_F32, 2e-3, "q8_0");
}

/* The gradients as outputs (stored to host memory as they are completed,
 * reloaded for the clipping and the update): the step graph of
 * tide_trainer_read's "grad.NAME". */
static void test_train_cuda_grads_out(void **state) {
    (void)state;
    train_cuda(true, TIDE_MATMUL_F32, 1e-4, NULL);
}

/* The backend's default, fast matmul mode: the bf16 weights' products take
 * activations rounded to bf16 (2^-8 relative each, summed with random
 * signs; 1e-4 is seen), so 1e-3 of the CPU's; the offloaded runs still
 * repeat the resident run's arithmetic bit for bit (the row chunks of the
 * rounding follow the ops' workspaces, a property of the graph). */
static void test_train_cuda_fast(void **state) {
    (void)state;
    train_cuda(false, TIDE_MATMUL_FAST, 1e-3, NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_train_cuda),
        cmocka_unit_test(test_train_cuda_grads_out),
        cmocka_unit_test(test_train_cuda_fast),
        cmocka_unit_test(test_qlora_cuda),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
