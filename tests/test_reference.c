/*
 * test_reference.c - tide's whole model against Hugging Face transformers.
 *
 * Each directory under $TIDE_FIXTURES (made by scripts/make_fixtures.py, see
 * tests/fixtures/README.md) holds a small random LLaMA checkpoint, the float32
 * logits transformers computes for every position of an 11-token prompt
 * (logits.f32, (T, V) row-major) and its 8 greedy tokens (reference.json).
 * For every fixture this test checks, on the CPU backend and through the public
 * API only:
 *   - the logits of one forward pass over the prompt (all positions);
 *   - the same logits when the prompt is fed in two chunks (start_pos > 0, so
 *     the second chunk attends to the KV cache the first one wrote);
 *   - the greedy tokens of tide_model_generate, exactly, and that generating
 *     again (same model, then a new model) gives the same ids;
 *   - a prompt holding a token id >= vocab fails with TIDE_E_RANGE and a
 *     message naming the id.
 * TIDE_FIXTURES unset is a failure, not a skip: the fixtures are committed.
 *
 * What it proves: whole-model logits (max error / max logit <= 1e-4; measured
 * about 1.5e-6) and greedy tokens (exact) against Hugging Face `transformers`
 * on three committed fixtures: f32 tied, bf16 GQA (transformers-5 config
 * layout), f16 sharded.
 */
#include "tide.h"

#include <cjson/cJSON.h>

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

/*
 * Tolerance on the logits: max|tide - ref| / max|ref| <= 1e-4.
 * Both sides compute in f32 from the same stored weights (the reference upcasts
 * bf16/f16 exactly), so they differ only by summation order (BLAS blocking,
 * threads, softmax and RMSNorm reductions) and libm's expf/sinf/cosf/powf. For
 * these sizes (dot products of <= 256 terms, <= 3 layers) that is ~1e-6 of the
 * logit scale (transformers' own f32 result differs from its f64 one by at most
 * 1.5e-6 on these fixtures, and eager from sdpa attention by 1e-6). 1e-4
 * leaves a wide margin for that, while any real mistake (a wrong RoPE pairing,
 * a missing norm weight, bf16 rounding of activations, an off-by-one cache
 * position) shows up as 1e-2 or more.
 */
#define LOGIT_TOL 1e-4

#define PROMPT_MAX 64
#define GEN_MAX 64

/* One fixture as the reference records it. */
struct fixture {
    const char *name;
};

/* Per-test state: the reference data plus the handles it is run with. */
struct ref {
    char dir[4096];
    int32_t prompt[PROMPT_MAX];
    int n_prompt;
    int32_t generated[GEN_MAX];
    int n_gen;
    int rows, vocab;   /* logits_shape */
    float *logits;     /* (rows, vocab) */
    double max_abs;    /* max |logits| */
    tide_ctx *ctx;
    tide_checkpoint *ck;
    tide_backend *be;
};

/* Fails the test with the context's last error when a call does not return OK. */
#define CHECK_OK(r, call)                                                              \
    do {                                                                               \
        tide_status st_ = (call);                                                      \
        if (st_ != TIDE_OK) {                                                          \
            print_error("%s: %s -> %s: %s\n", (r)->dir, #call, tide_status_str(st_),   \
                        tide_ctx_last_error((r)->ctx));                                \
            fail();                                                                    \
        }                                                                              \
    } while (0)

/* Reads a whole file; returns a malloc'd buffer (NUL-terminated) or NULL. */
static char *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = NULL;
    long n = -1;
    if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0) {
        buf = malloc((size_t)n + 1);
        if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
            free(buf);
            buf = NULL;
        }
    }
    fclose(f);
    if (buf) {
        buf[n] = '\0';
        if (len)
            *len = (size_t)n;
    }
    return buf;
}

/* Reads a JSON array of ints into out[0..max-1]; returns its length or -1. */
static int json_ints(const cJSON *arr, int32_t *out, int max)
{
    if (!cJSON_IsArray(arr))
        return -1;
    int n = cJSON_GetArraySize(arr);
    if (n > max)
        return -1;
    for (int i = 0; i < n; i++) {
        const cJSON *v = cJSON_GetArrayItem(arr, i);
        if (!cJSON_IsNumber(v))
            return -1;
        out[i] = (int32_t)v->valuedouble;
    }
    return n;
}

/* Loads reference.json and the logits file of one fixture into r. */
static void load_reference(struct ref *r, const char *name)
{
    const char *root = getenv("TIDE_FIXTURES");
    assert_non_null(root);
    snprintf(r->dir, sizeof r->dir, "%s/%s", root, name);

    char path[4200];
    snprintf(path, sizeof path, "%s/reference.json", r->dir);
    char *text = read_all(path, NULL);
    if (!text) {
        print_error("cannot read %s\n", path);
        fail();
    }
    cJSON *js = cJSON_Parse(text);
    free(text);
    if (!js) {
        print_error("%s: malformed JSON\n", path);
        fail();
    }
    r->n_prompt = json_ints(cJSON_GetObjectItemCaseSensitive(js, "prompt"), r->prompt, PROMPT_MAX);
    r->n_gen = json_ints(cJSON_GetObjectItemCaseSensitive(js, "generated"), r->generated, GEN_MAX);
    int32_t shape[2] = {0, 0};
    int nd = json_ints(cJSON_GetObjectItemCaseSensitive(js, "logits_shape"), shape, 2);
    const cJSON *lf = cJSON_GetObjectItemCaseSensitive(js, "logits_file");
    snprintf(path, sizeof path, "%s/%s", r->dir, cJSON_IsString(lf) ? lf->valuestring : "logits.f32");
    cJSON_Delete(js);
    assert_true(r->n_prompt > 0);
    assert_true(r->n_gen > 0);
    assert_int_equal(nd, 2);
    r->rows = shape[0];
    r->vocab = shape[1];
    assert_int_equal(r->rows, r->n_prompt);

    size_t len = 0;
    r->logits = (float *)read_all(path, &len);
    if (!r->logits) {
        print_error("cannot read %s\n", path);
        fail();
    }
    /* The file is raw little-endian f32; every supported host is little-endian. */
    assert_int_equal(len, (size_t)r->rows * r->vocab * sizeof(float));
    r->max_abs = 0;
    for (size_t i = 0; i < (size_t)r->rows * r->vocab; i++)
        r->max_abs = fmax(r->max_abs, fabs(r->logits[i]));
    assert_true(r->max_abs > 0.1); /* a degenerate fixture would test nothing */
}

static int setup(void **state)
{
    const struct fixture *fx = *state;
    struct ref *r = calloc(1, sizeof *r);
    assert_non_null(r);
    *state = r;
    load_reference(r, fx->name);
    r->ctx = tide_ctx_new();
    assert_non_null(r->ctx);
    CHECK_OK(r, tide_checkpoint_open(r->ctx, r->dir, &r->ck));
    CHECK_OK(r, tide_backend_new(r->ctx, TIDE_BACKEND_CPU, &r->be));
    /* the 1e-4 tolerance is the f32 mode's (the CPU's AUTO may be FAST) */
    CHECK_OK(r, tide_backend_set_matmul(r->be, TIDE_MATMUL_F32));
    const tide_llama_config *cfg = tide_checkpoint_config(r->ck);
    assert_non_null(cfg);
    assert_int_equal(cfg->vocab_size, r->vocab);
    return 0;
}

static int teardown(void **state)
{
    struct ref *r = *state;
    if (!r)
        return 0;
    tide_backend_free(r->be);
    tide_checkpoint_free(r->ck);
    tide_ctx_free(r->ctx);
    free(r->logits);
    free(r);
    return 0;
}

static tide_model *new_model(struct ref *r)
{
    tide_model_opts opts = {.max_batch = 1, .ctx_len = 0};
    tide_model *m = NULL;
    CHECK_OK(r, tide_model_new(r->ctx, r->ck, r->be, &opts, &m));
    assert_non_null(m);
    return m;
}

/* max|got - ref| / max|ref| over rows [row0, row0 + n) of the reference;
 * also reports where the largest difference is. */
static double rel_error(const struct ref *r, const float *got, int row0, int n, int *at)
{
    double worst = 0;
    *at = -1;
    for (int i = 0; i < n * r->vocab; i++) {
        double d = fabs((double)got[i] - (double)r->logits[(size_t)row0 * r->vocab + i]);
        if (!(d <= worst)) { /* NaN counts as worst */
            worst = isnan(d) ? INFINITY : d;
            *at = row0 * r->vocab + i;
        }
    }
    return worst / r->max_abs;
}

static void expect_logits(const struct ref *r, const char *what, const float *got, int row0, int n)
{
    int at;
    double err = rel_error(r, got, row0, n, &at);
    printf("  %-18s %-14s max rel logit error %.3g (tol %.0e)\n", strrchr(r->dir, '/') + 1,
           what, err, LOGIT_TOL);
    if (!(err <= LOGIT_TOL)) {
        print_error("%s %s: logit [%d, %d] = %.7g, reference %.7g\n", r->dir, what,
                    at / r->vocab, at % r->vocab, got[at - row0 * r->vocab], r->logits[at]);
        fail();
    }
}

/* One forward pass over the whole prompt, all logits. */
static void test_forward(void **state)
{
    struct ref *r = *state;
    tide_model *m = new_model(r);
    float *got = calloc((size_t)r->rows * r->vocab, sizeof *got);
    assert_non_null(got);
    CHECK_OK(r, tide_model_forward(m, r->prompt, 1, r->n_prompt, 0, got)); /* (T, V) */
    expect_logits(r, "forward", got, 0, r->rows);
    free(got);
    tide_model_free(m);
}

/* The prompt in two chunks: the second runs at start_pos = split and must see
 * the first chunk's keys and values through the cache. */
static void test_forward_chunked(void **state)
{
    struct ref *r = *state;
    tide_model *m = new_model(r);
    int split = r->n_prompt / 2;
    float *got = calloc((size_t)r->rows * r->vocab, sizeof *got);
    assert_non_null(got);
    CHECK_OK(r, tide_model_forward(m, r->prompt, 1, split, 0, got));
    CHECK_OK(r, tide_model_forward(m, r->prompt + split, 1, r->n_prompt - split, split,
                                   got + (size_t)split * r->vocab));
    expect_logits(r, "forward 2 chunks", got, 0, r->rows);
    free(got);
    tide_model_free(m);
}

static void expect_tokens(const struct ref *r, const char *what, const int32_t *got)
{
    for (int i = 0; i < r->n_gen; i++) {
        if (got[i] != r->generated[i]) {
            print_error("%s %s: token %d is %d, reference %d\n", r->dir, what, i, got[i],
                        r->generated[i]);
            fail();
        }
    }
}

/* Greedy tokens equal the reference's; generating again gives the same ids. */
static void test_generate(void **state)
{
    struct ref *r = *state;
    int32_t a[GEN_MAX], b[GEN_MAX], c[GEN_MAX];
    tide_gen_stats st;

    tide_model *m = new_model(r);
    memset(&st, 0, sizeof st);
    CHECK_OK(r, tide_model_generate(m, r->prompt, r->n_prompt, r->n_gen, a, &st));
    expect_tokens(r, "generate", a);
    assert_int_equal(st.prefill_tokens, r->n_prompt);

    /* The same model again: the first run's cache must not leak into the second. */
    CHECK_OK(r, tide_model_generate(m, r->prompt, r->n_prompt, r->n_gen, b, NULL));
    expect_tokens(r, "generate again", b);
    tide_model_free(m);

    m = new_model(r);
    CHECK_OK(r, tide_model_generate(m, r->prompt, r->n_prompt, r->n_gen, c, NULL));
    assert_memory_equal(a, c, (size_t)r->n_gen * sizeof *a);
    tide_model_free(m);
    printf("  %-18s generate       %d tokens match, deterministic\n", strrchr(r->dir, '/') + 1,
           r->n_gen);
}

/* A token id >= vocab is refused with TIDE_E_RANGE and a message naming it. */
static void test_bad_token(void **state)
{
    struct ref *r = *state;
    int32_t prompt[PROMPT_MAX], out[GEN_MAX];
    memcpy(prompt, r->prompt, (size_t)r->n_prompt * sizeof *prompt);
    int32_t bad = r->vocab + 7;
    prompt[r->n_prompt / 2] = bad;

    tide_model *m = new_model(r);
    tide_status st = tide_model_generate(m, prompt, r->n_prompt, r->n_gen, out, NULL);
    assert_int_equal(st, TIDE_E_RANGE);
    assert_int_equal(tide_ctx_last_status(r->ctx), TIDE_E_RANGE);
    char id[32];
    snprintf(id, sizeof id, "%d", (int)bad);
    const char *msg = tide_ctx_last_error(r->ctx);
    if (!strstr(msg, id)) {
        print_error("message \"%s\" does not name token id %s\n", msg, id);
        fail();
    }

    /* The model is still usable after the refusal. */
    CHECK_OK(r, tide_model_generate(m, r->prompt, r->n_prompt, r->n_gen, out, NULL));
    expect_tokens(r, "generate after error", out);
    tide_model_free(m);
}

static struct fixture fixtures[] = {
    {"tiny-f32-mha"},     /* f32, MHA, tied embeddings */
    {"tiny-bf16-gqa"},    /* bf16 storage, GQA 6/2, rope_theta 5e5 */
    {"tiny-f16-sharded"}, /* f16 storage, GQA 8/2, head_dim 8, 2 shards */
    {"tiny-qwen2"},       /* Qwen2: bf16, q/k/v biases, GQA 4/2, tied, rope_theta 1e6 */
};

/* NAME must be fixtures[i].name, as a literal, to name the tests. */
#define FIXTURE_TESTS(i, NAME)                                                         \
    {"forward " NAME, test_forward, setup, teardown, &fixtures[i]},                    \
    {"forward_chunked " NAME, test_forward_chunked, setup, teardown, &fixtures[i]},    \
    {"generate " NAME, test_generate, setup, teardown, &fixtures[i]},                  \
    {"bad_token " NAME, test_bad_token, setup, teardown, &fixtures[i]}

int main(void)
{
    if (!getenv("TIDE_FIXTURES")) {
        fprintf(stderr, "test_reference: TIDE_FIXTURES is not set (ctest sets it to "
                        "tests/fixtures)\n");
        return 1;
    }
    const struct CMUnitTest tests[] = {
        FIXTURE_TESTS(0, "tiny-f32-mha"),
        FIXTURE_TESTS(1, "tiny-bf16-gqa"),
        FIXTURE_TESTS(2, "tiny-f16-sharded"),
        FIXTURE_TESTS(3, "tiny-qwen2"),
    };
    return cmocka_run_group_tests_name("reference", tests, NULL, NULL);
}
