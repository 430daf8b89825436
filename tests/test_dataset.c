/*
 * test_dataset.c - training data sets from text (tide.h, "Training data
 * sets") against tests/fixtures/dataset, made by
 * scripts/make_dataset_fixtures.py with transformers' tokenizer and chat
 * template and PyTorch:
 *
 *   - documents (.jsonl and .txt): the token stream is exactly the ids
 *     Hugging Face gives (BOS + ids + EOS per line); its batches are those of
 *     the same ids written as a token file and opened with tide_tokens_open,
 *     in order and shuffled, and a trainer's step losses on them are the same
 *     bits;
 *   - prompt/completion and chat examples: every example's ids and which of
 *     them are trained equal the recording (transformers' Jinja rendering of
 *     the ChatML template, cut per message); the truncation count and the
 *     padding; three training steps (loss the sum of cross-entropies over the
 *     step's targets not ignored over their count, torch's cross_entropy with
 *     ignore_index) within 1e-5 of PyTorch's losses and gradient norms, the
 *     first step's gradients within 1e-4 of the largest, the target counts
 *     exact; --train-on all trains on every token but the padding;
 *   - every chat family (--template): the trained tokens of each conversation
 *     hold every assistant message and no user or system message;
 *   - evaluation: tide_trainer_eval's loss is the step's loss on the same
 *     batch, and it changes no state (the next step is the same bits as a
 *     trainer that never evaluated);
 *   - bad input: malformed JSON, a missing field, an unknown role, mixed
 *     kinds, an empty file, no tokenizer: an error naming the file and line.
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
#include <unistd.h>

#include <cmocka.h>

static char fx[4096];
static cJSON *expected;
static tide_ctx *ctx;
static tide_tokenizer *tok;
static tide_checkpoint *ck;
static tide_backend *be;
static int B, T, ACCUM, STEPS;

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    if (b) b[n] = 0;
    fclose(f);
    return b;
}

static const char *path_of(const char *name) {
    static char p[4][4200];
    static int k;
    k = (k + 1) % 4;
    snprintf(p[k], sizeof p[k], "%s/%s", fx, name);
    return p[k];
}

static int setup(void **state) {
    (void)state;
    const char *f = getenv("TIDE_FIXTURES");
    if (!f) return -1;
    snprintf(fx, sizeof fx, "%s/dataset", f);
    char *js = slurp(path_of("expected.json"));
    if (!js || !(expected = cJSON_Parse(js))) {
        free(js);
        return -1;
    }
    free(js);
    const cJSON *hp = cJSON_GetObjectItem(expected, "hparams");
    B = cJSON_GetObjectItem(hp, "batch")->valueint;
    T = cJSON_GetObjectItem(hp, "seq")->valueint;
    ACCUM = cJSON_GetObjectItem(hp, "accum")->valueint;
    STEPS = cJSON_GetObjectItem(hp, "steps")->valueint;
    ctx = tide_ctx_new();
    tide_ctx_set_threads(ctx, 2);
    if (tide_tokenizer_open(ctx, path_of("model"), &tok) || tide_checkpoint_open(ctx, path_of("model"), &ck) ||
        tide_backend_new(ctx, TIDE_BACKEND_CPU, &be) || tide_backend_set_matmul(be, TIDE_MATMUL_F32))
        return -1;
    return 0;
}

static int teardown(void **state) {
    (void)state;
    tide_backend_free(be);
    tide_checkpoint_free(ck);
    tide_tokenizer_free(tok);
    tide_ctx_free(ctx);
    cJSON_Delete(expected);
    return 0;
}

static tide_dataset *open_set(const char *name, bool all, int seq) {
    tide_dataset_opts o = {.seq = seq, .train_on_all = all};
    tide_dataset *d = NULL;
    tide_status st = tide_dataset_open(ctx, path_of(name), tok, 384, TIDE_TOKENS_AUTO, &o, &d, NULL);
    if (st) print_error("%s: %s\n", name, tide_ctx_last_error(ctx));
    assert_int_equal(st, TIDE_OK);
    return d;
}

static tide_trainer *trainer(void) {
    tide_trainer_opts o = tide_trainer_opts_default();
    const cJSON *hp = cJSON_GetObjectItem(expected, "hparams");
    o.step.batch = B;
    o.step.seq = T;
    o.step.accum = ACCUM;
    o.step.grads_out = true;
    o.lr = o.min_lr = cJSON_GetObjectItem(hp, "lr")->valuedouble;
    o.step.weight_decay = (float)cJSON_GetObjectItem(hp, "weight_decay")->valuedouble;
    o.step.beta1 = (float)cJSON_GetObjectItem(hp, "beta1")->valuedouble;
    o.step.beta2 = (float)cJSON_GetObjectItem(hp, "beta2")->valuedouble;
    o.step.eps = (float)cJSON_GetObjectItem(hp, "eps")->valuedouble;
    o.step.grad_clip = (float)cJSON_GetObjectItem(hp, "grad_clip")->valuedouble;
    o.total_steps = STEPS;
    tide_trainer *t = NULL;
    assert_int_equal(tide_trainer_new(ctx, ck, be, &o, &t), TIDE_OK);
    return t;
}

/* One step's batch of the data set (all micro-batches). */
static void step_batch(const tide_dataset *d, const tide_batch_spec *spec, int64_t s, int32_t *in, int32_t *tg) {
    size_t per = (size_t)B * (size_t)T;
    for (int m = 0; m < ACCUM; m++)
        assert_int_equal(tide_dataset_batch(d, spec, s, m, in + m * per, tg + m * per), TIDE_OK);
}

static double rel(double a, double b) { return fabs(a - b) / fmax(fabs(b), 1e-30); }

/* ---------------------------------------------------------------- documents */

static void test_documents_stream(void **state) {
    (void)state;
    const cJSON *want = cJSON_GetObjectItem(expected, "docs_stream");
    int n = cJSON_GetArraySize(want);
    const char *files[2] = {"docs.jsonl", "docs.txt"};
    for (int f = 0; f < 2; f++) {
        tide_dataset *d = open_set(files[f], false, T);
        const tide_tokens *tk = tide_dataset_tokens(d);
        assert_non_null(tk);
        assert_int_equal(tide_tokens_count(tk), n);
        int i = 0;
        for (const cJSON *x = want->child; x; x = x->next, i++) assert_int_equal(tide_tokens_at(tk, i), x->valueint);
        tide_dataset_info in;
        tide_dataset_info_get(d, &in);
        assert_false(in.examples);
        assert_int_equal(in.rows, 6);
        tide_dataset_free(d);
    }
}

/* The .jsonl against the same ids as a token file: the same batches, and
 * a trainer's steps the same bits. */
static void test_documents_as_token_file(void **state) {
    (void)state;
    tide_dataset *d = open_set("docs.jsonl", false, 16);
    char bin[256];
    snprintf(bin, sizeof bin, "%s/tide-test-dataset-%d.u16", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp",
             (int)getpid());
    assert_int_equal(tide_dataset_write_tokens(d, bin, TIDE_TOKENS_AUTO), TIDE_OK);
    tide_tokens *tk = NULL;
    assert_int_equal(tide_tokens_open(ctx, bin, TIDE_TOKENS_AUTO, 384, 16, &tk), TIDE_OK);
    unlink(bin);
    int32_t a[2][2 * 16], b[2][2 * 16];
    for (int sh = 0; sh < 2; sh++) {
        tide_batch_spec spec = {.batch = 2, .seq = 16, .accum = 1, .shuffle = sh, .seed = 99};
        for (int64_t s = 0; s < 40; s++) {
            assert_int_equal(tide_dataset_batch(d, &spec, s, 0, a[0], a[1]), TIDE_OK);
            assert_int_equal(tide_tokens_batch(tk, &spec, s, 0, b[0], b[1]), TIDE_OK);
            assert_memory_equal(a, b, sizeof a);
        }
    }
    tide_tokens_free(tk);
    tide_dataset_free(d);
}

/* ---------------------------------------------------------------- examples */

/* Every example's ids and trained flags, read back through the evaluation
 * rows (each example once, in order): inputs e[0..L-1), targets e[1..L) where
 * trained. */
static void check_examples(const tide_dataset *d, const cJSON *want) {
    const cJSON *ids = cJSON_GetObjectItem(want, "ids"), *train = cJSON_GetObjectItem(want, "train");
    int n = cJSON_GetArraySize(ids);
    tide_batch_spec one = {.batch = 1, .seq = T, .accum = 1};
    assert_int_equal(tide_dataset_eval_batches(d, &one), n);
    int64_t truncated = 0, pad = 0;
    for (int k = 0; k < n; k++) {
        int32_t in[256], tg[256];
        assert_int_equal(tide_dataset_eval_batch(d, &one, k, 0, in, tg), TIDE_OK);
        const cJSON *e = cJSON_GetArrayItem(ids, k), *tr = cJSON_GetArrayItem(train, k);
        int L = cJSON_GetArraySize(e);
        truncated += L > T + 1;
        if (L > T + 1) L = T + 1;
        pad += T - (L - 1);
        for (int t = 0; t < T; t++) {
            int want_in = t < L ? cJSON_GetArrayItem(e, t)->valueint : 381;
            bool trained = t + 1 < L && cJSON_GetArrayItem(tr, t + 1)->valueint;
            int want_tg = trained ? cJSON_GetArrayItem(e, t + 1)->valueint : -1;
            if (in[t] != want_in || tg[t] != want_tg)
                fail_msg("example %d position %d: input %d target %d, expected %d and %d", k, t, in[t], tg[t],
                         want_in, want_tg);
        }
    }
    tide_dataset_info in;
    tide_dataset_info_get(d, &in);
    assert_true(in.examples);
    assert_int_equal(in.truncated, cJSON_GetObjectItem(want, "truncated")->valueint);
    assert_true(in.truncated >= truncated); /* those left out were cut too */
    assert_int_equal(in.dropped, cJSON_GetObjectItem(want, "dropped")->valueint);
    assert_int_equal(cJSON_GetObjectItem(want, "pad_positions")->valueint, pad);
    assert_true(fabs(in.pad_fraction - (double)pad / ((double)n * T)) < 1e-12);
}

/* --train-on all: every position but the padding is a target (the next
 * input), and the examples are those of the completion set plus the ones it
 * left out. */
static void check_all(const tide_dataset *all, const tide_dataset *part) {
    tide_batch_spec one = {.batch = 1, .seq = T, .accum = 1};
    tide_dataset_info a, p;
    tide_dataset_info_get(all, &a);
    tide_dataset_info_get(part, &p);
    assert_int_equal(a.dropped, 0);
    assert_int_equal(tide_dataset_eval_batches(all, &one), tide_dataset_eval_batches(part, &one) + p.dropped);
    int64_t targets = 0;
    for (int64_t k = 0; k < tide_dataset_eval_batches(all, &one); k++) {
        int32_t in[256], tg[256];
        assert_int_equal(tide_dataset_eval_batch(all, &one, k, 0, in, tg), TIDE_OK);
        int t = 0;
        for (; t < T && tg[t] >= 0; t++)
            if (t + 1 < T) assert_int_equal(tg[t], in[t + 1]);
        targets += t;
        for (; t < T; t++) assert_int_equal(tg[t], -1);
    }
    assert_int_equal(a.targets, targets);
    assert_true(a.targets > p.targets);
}

static void train_examples(const char *file, const char *key) {
    const cJSON *want = cJSON_GetObjectItem(expected, key);
    tide_dataset *d = open_set(file, false, T);
    check_examples(d, want);
    tide_dataset *all = open_set(file, true, T);
    check_all(all, d);
    tide_dataset_free(all);

    tide_trainer *t = trainer();
    tide_batch_spec spec = {.batch = B, .seq = T, .accum = ACCUM};
    size_t n = (size_t)ACCUM * B * T;
    int32_t *in = malloc(n * sizeof *in), *tg = malloc(n * sizeof *tg);
    for (int s = 0; s < STEPS; s++) {
        step_batch(d, &spec, s, in, tg);
        tide_train_stats st;
        assert_int_equal(tide_trainer_step(t, in, tg, &st), TIDE_OK);
        double el = cJSON_GetArrayItem(cJSON_GetObjectItem(want, "loss"), s)->valuedouble;
        double eg = cJSON_GetArrayItem(cJSON_GetObjectItem(want, "grad_norm"), s)->valuedouble;
        int64_t en = cJSON_GetArrayItem(cJSON_GetObjectItem(want, "targets"), s)->valueint;
        print_message("%s step %d: loss %.7f (torch %.7f), grad norm %.6f (torch %.6f), %lld targets\n", key, s,
                      st.loss, el, st.grad_norm, eg, (long long)st.n_targets);
        assert_int_equal(st.n_targets, en);
        if (rel(st.loss, el) > 1e-5 || rel(st.grad_norm, eg) > 1e-5)
            fail_msg("%s step %d: loss %.9g grad norm %.9g, torch %.9g %.9g", key, s, st.loss, st.grad_norm, el, eg);
        if (s == 0) {
            const cJSON *g = cJSON_GetObjectItem(want, "grads_step0");
            for (const cJSON *x = g->child; x; x = x->next) {
                int m = cJSON_GetArraySize(x);
                float *v = malloc((size_t)m * sizeof *v);
                char name[200];
                snprintf(name, sizeof name, "grad.%s", x->string);
                assert_int_equal(tide_trainer_read(t, name, v, (uint64_t)m * sizeof *v), TIDE_OK);
                double big = 0, worst = 0;
                for (int i = 0; i < m; i++) big = fmax(big, fabs(cJSON_GetArrayItem(x, i)->valuedouble));
                for (int i = 0; i < m; i++) worst = fmax(worst, fabs(v[i] - cJSON_GetArrayItem(x, i)->valuedouble));
                print_message("  %s: worst |difference| %.3g of the largest %.3g\n", name, worst, big);
                if (worst > 1e-4 * big) fail_msg("%s: %.3g from torch's (largest %.3g)", name, worst, big);
                free(v);
            }
        }
    }
    free(in);
    free(tg);
    tide_trainer_free(t);
    tide_dataset_free(d);
}

static void test_prompt_completion(void **state) {
    (void)state;
    train_examples("pc.jsonl", "pc");
}

static void test_chat(void **state) {
    (void)state;
    train_examples("chat.jsonl", "chat");
}

/* tide_trainer_eval: the step's loss on the same batch, no state changed. */
static void test_eval_changes_nothing(void **state) {
    (void)state;
    tide_dataset *d = open_set("chat.jsonl", false, T);
    tide_trainer *a = trainer(), *b = trainer();
    tide_batch_spec spec = {.batch = B, .seq = T, .accum = ACCUM};
    size_t n = (size_t)ACCUM * B * T;
    int32_t *in = malloc(n * sizeof *in), *tg = malloc(n * sizeof *tg);
    for (int s = 0; s < 2; s++) {
        step_batch(d, &spec, s, in, tg);
        double el = 0;
        int64_t en = 0;
        assert_int_equal(tide_trainer_eval(a, in, tg, &el, &en), TIDE_OK);
        assert_int_equal(tide_trainer_steps(a), s);
        tide_train_stats sa, sb;
        assert_int_equal(tide_trainer_step(a, in, tg, &sa), TIDE_OK);
        assert_int_equal(tide_trainer_step(b, in, tg, &sb), TIDE_OK);
        assert_int_equal(en, sa.n_targets);
        assert_true(el == sa.loss);
        assert_true(sa.loss == sb.loss && sa.grad_norm == sb.grad_norm);
    }
    float x[32], y[32];
    assert_int_equal(tide_trainer_read(a, "model.norm.weight", x, sizeof x), TIDE_OK);
    assert_int_equal(tide_trainer_read(b, "model.norm.weight", y, sizeof y), TIDE_OK);
    assert_memory_equal(x, y, sizeof x);
    free(in);
    free(tg);
    tide_trainer_free(a);
    tide_trainer_free(b);
    tide_dataset_free(d);
}

/* Every chat family: the trained ids of each conversation decode to a text
 * that holds every assistant message and no user or system message. */
static void test_chat_families(void **state) {
    (void)state;
    const char *families[] = {"llama2", "llama3", "chatml", "mistral", "zephyr", "gemma"};
    char *js = slurp(path_of("chat.jsonl"));
    assert_non_null(js);
    for (size_t f = 0; f < sizeof families / sizeof *families; f++) {
        tide_dataset_opts o = {.seq = 512, .chat_template = families[f]};
        tide_dataset *d = NULL;
        if (tide_dataset_open(ctx, path_of("chat.jsonl"), tok, 384, TIDE_TOKENS_AUTO, &o, &d, NULL))
            fail_msg("%s: %s", families[f], tide_ctx_last_error(ctx));
        tide_batch_spec one = {.batch = 1, .seq = 512, .accum = 1};
        assert_int_equal(tide_dataset_eval_batches(d, &one), 5);
        const char *line = js;
        for (int k = 0; k < 5; k++, line = strchr(line, '\n') + 1) {
            int32_t in[512], tg[512], ids[512];
            size_t n = 0, len = 0;
            assert_int_equal(tide_dataset_eval_batch(d, &one, k, 0, in, tg), TIDE_OK);
            for (int t = 0; t < 512; t++)
                if (tg[t] >= 0) ids[n++] = tg[t];
            char text[4096];
            assert_int_equal(tide_tokenizer_decode(tok, ids, n, 0, text, sizeof text, &len), TIDE_OK);
            cJSON *row = cJSON_ParseWithOpts(line, NULL, false);
            const cJSON *m;
            cJSON_ArrayForEach(m, cJSON_GetObjectItem(row, "messages")) {
                const char *role = cJSON_GetObjectItem(m, "role")->valuestring;
                const char *content = cJSON_GetObjectItem(m, "content")->valuestring;
                bool in_text = strstr(text, content) != NULL;
                if (in_text != !strcmp(role, "assistant"))
                    fail_msg("%s, conversation %d: the %s message '%s' is%s among the trained tokens ('%s')",
                             families[f], k, role, content, in_text ? "" : " not", text);
            }
            cJSON_Delete(row);
        }
        tide_dataset_free(d);
    }
    free(js);
}

/* ---------------------------------------------------------------- bad input */

static void expect_bad(const char *name, const char *text, const char *needle) {
    char p[256];
    snprintf(p, sizeof p, "%s/%s", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", name);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    tide_dataset_opts o = {.seq = T};
    tide_dataset *d = (tide_dataset *)1;
    tide_status st = tide_dataset_open(ctx, p, tok, 384, TIDE_TOKENS_AUTO, &o, &d, NULL);
    unlink(p);
    assert_int_not_equal(st, TIDE_OK);
    assert_null(d);
    const char *msg = tide_ctx_last_error(ctx);
    if (!strstr(msg, needle) || !strstr(msg, name)) fail_msg("%s: '%s' does not say '%s'", name, msg, needle);
}

static void test_bad_input(void **state) {
    (void)state;
    expect_bad("tide-bad1.jsonl", "{\"text\": \"a\"}\n{\"text\": \"b\"}\n{\"text\": \"c\"\n", ":3: malformed JSON");
    expect_bad("tide-bad2.jsonl", "{\"prompt\": \"a\", \"completion\": \"b\"}\n{\"prompt\": \"a\"}\n",
               ":2: \"prompt\" and \"completion\" must both be strings");
    expect_bad("tide-bad3.jsonl", "{\"foo\": 1}\n", ":1: no \"text\"");
    expect_bad("tide-bad4.jsonl", "{\"messages\": [{\"role\": \"tool\", \"content\": \"x\"}]}\n",
               ":1: message 0 has the unknown role 'tool'");
    expect_bad("tide-bad5.jsonl", "{\"text\": \"a\"}\n{\"prompt\": \"a\", \"completion\": \"b\"}\n",
               ":2: an example among plain \"text\" rows");
    expect_bad("tide-bad6.jsonl", "", "no rows");
    expect_bad("tide-bad7.jsonl", "\n  \n", "no rows");
    expect_bad("tide-bad8.jsonl", "[1, 2]\n", ":1: not a JSON object");
    expect_bad("tide-bad9.jsonl", "{\"text\": 5}\n", ":1: \"text\" is not a string");
    expect_bad("tide-bad10.jsonl", "{\"messages\": [{\"role\": \"user\"}]}\n", ":1: message 0 is not an object");
    /* a text set without a tokenizer */
    tide_dataset_opts o = {.seq = T};
    tide_dataset *d = NULL;
    assert_int_equal(tide_dataset_open(ctx, path_of("docs.jsonl"), NULL, 384, TIDE_TOKENS_AUTO, &o, &d, NULL),
                     TIDE_E_INVALID);
    assert_non_null(strstr(tide_ctx_last_error(ctx), "needs the model's tokenizer"));
    /* examples are no token file */
    d = open_set("pc.jsonl", false, T);
    assert_int_equal(tide_dataset_write_tokens(d, "/tmp/tide-never-written.u16", TIDE_TOKENS_AUTO), TIDE_E_INVALID);
    assert_int_not_equal(access("/tmp/tide-never-written.u16", F_OK), 0);
    tide_dataset_free(d);
    /* the evaluation split: the last rows */
    o.eval_split = 0.34;
    tide_dataset *e = NULL;
    assert_int_equal(tide_dataset_open(ctx, path_of("pc.jsonl"), tok, 384, TIDE_TOKENS_AUTO, &o, &d, &e), TIDE_OK);
    tide_dataset_info a, b;
    tide_dataset_info_get(d, &a);
    tide_dataset_info_get(e, &b);
    assert_int_equal(a.rows, 4);
    assert_int_equal(b.rows, 2);
    tide_dataset_free(d);
    tide_dataset_free(e);
}

int main(void) {
    if (!getenv("TIDE_FIXTURES")) {
        fprintf(stderr, "TIDE_FIXTURES is not set: skipping\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_documents_stream),     cmocka_unit_test(test_documents_as_token_file),
        cmocka_unit_test(test_prompt_completion),    cmocka_unit_test(test_chat),
        cmocka_unit_test(test_eval_changes_nothing), cmocka_unit_test(test_chat_families),
        cmocka_unit_test(test_bad_input),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
