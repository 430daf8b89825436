/*
 * test_config.c - LLaMA configurations: the built-in ones (shapes and
 * parameter counts), tide_llama_config_check, and reading and writing Hugging
 * Face config.json files, with one test per kind of bad file (the status and a
 * message naming the file and the field).
 *
 * What it proves: configs and safetensors, one test per kind of malformed
 * input (truncated file, header past the end, offsets out of range or
 * overlapping, dtype/shape/size mismatch, missing or extra tensor, bad config
 * or index JSON, unknown config name), synthetic checkpoints byte-identical
 * per seed.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/alloc_test.h"
#include "core/core.h"
#include "tide.h"

typedef struct fixture {
    tide_ctx *ctx;
    char dir[64];
    char path[128]; /* dir/config.json */
} fixture;

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    if (!f) return -1;
    f->ctx = tide_ctx_new();
    snprintf(f->dir, sizeof f->dir, "/tmp/tide_cfg_XXXXXX");
    if (!f->ctx || !mkdtemp(f->dir)) return -1;
    snprintf(f->path, sizeof f->path, "%s/config.json", f->dir);
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    DIR *d = opendir(f->dir);
    if (d) {
        struct dirent *de;
        char p[512];
        while ((de = readdir(d)) != NULL) {
            if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
            snprintf(p, sizeof p, "%s/%s", f->dir, de->d_name);
            unlink(p);
        }
        closedir(d);
    }
    rmdir(f->dir);
    tide_ctx_free(f->ctx);
    free(f);
    return 0;
}

static void write_text(const char *path, const char *text) {
    FILE *fp = fopen(path, "w");
    assert_non_null(fp);
    fputs(text, fp);
    assert_int_equal(fclose(fp), 0);
}

/* A valid config.json for a small LLaMA, as a cJSON object to mutate. */
static cJSON *base_json(void) {
    cJSON *o = cJSON_CreateObject();
    cJSON *arch = cJSON_CreateArray();
    cJSON_AddItemToArray(arch, cJSON_CreateString("LlamaForCausalLM"));
    cJSON_AddItemToObject(o, "architectures", arch);
    cJSON_AddStringToObject(o, "model_type", "llama");
    cJSON_AddStringToObject(o, "hidden_act", "silu");
    cJSON_AddNumberToObject(o, "hidden_size", 64);
    cJSON_AddNumberToObject(o, "intermediate_size", 160);
    cJSON_AddNumberToObject(o, "num_hidden_layers", 2);
    cJSON_AddNumberToObject(o, "num_attention_heads", 4);
    cJSON_AddNumberToObject(o, "num_key_value_heads", 2);
    cJSON_AddNumberToObject(o, "vocab_size", 128);
    cJSON_AddNumberToObject(o, "max_position_embeddings", 256);
    cJSON_AddNumberToObject(o, "rms_norm_eps", 1e-5);
    cJSON_AddNumberToObject(o, "rope_theta", 10000);
    cJSON_AddBoolToObject(o, "tie_word_embeddings", false);
    cJSON_AddStringToObject(o, "torch_dtype", "bfloat16");
    return o;
}

static void write_json(const char *path, cJSON *o) {
    char *s = cJSON_Print(o);
    assert_non_null(s);
    write_text(path, s);
    cJSON_free(s);
    cJSON_Delete(o);
}

/* Loads f->path and asserts the status and that the message names the file
 * and contains `needle`. */
static void expect_load_fails(fixture *f, tide_status want, const char *needle) {
    tide_llama_config cfg;
    memset(&cfg, 0x5a, sizeof cfg);
    tide_llama_config before = cfg;
    tide_status st = tide_llama_config_load(f->ctx, f->path, &cfg);
    const char *msg = tide_ctx_last_error(f->ctx);
    if (st != want || !strstr(msg, f->path) || !strstr(msg, needle))
        print_error("status %s, message: %s (wanted %s and '%s')\n", tide_status_str(st), msg,
                    tide_status_str(want), needle);
    assert_int_equal(st, want);
    assert_non_null(strstr(msg, f->path));
    assert_non_null(strstr(msg, needle));
    assert_memory_equal(&cfg, &before, sizeof cfg); /* untouched on failure */
}

static void set_number(cJSON *o, const char *field, double v) {
    cJSON_DeleteItemFromObject(o, field);
    cJSON_AddNumberToObject(o, field, v);
}

static void set_string(cJSON *o, const char *field, const char *v) {
    cJSON_DeleteItemFromObject(o, field);
    cJSON_AddStringToObject(o, field, v);
}

/* ---------------------------------------------------------------- built-ins */

static void test_named_configs(void **state) {
    fixture *f = *state;
    const char *const *names = tide_llama_config_names();
    int n = 0;
    for (; names[n]; n++) {
        tide_llama_config cfg;
        assert_int_equal(tide_llama_config_named(f->ctx, names[n], &cfg), TIDE_OK);
        assert_string_equal(cfg.name, names[n]);
        assert_int_equal(tide_llama_config_check(f->ctx, &cfg), TIDE_OK);
        assert_int_equal(cfg.dtype, TIDE_BF16);
        assert_false(cfg.tie_word_embeddings);
        bool l3 = !strcmp(names[n], "llama-3.1-405b");
        assert_true(cfg.rope_theta == (l3 ? 500000.0f : 10000.0f));
        /* the LLaMA family's vocabulary, but for the training demonstration's and Llama 3's */
        assert_int_equal(cfg.vocab_size, l3 ? 128256 : strcmp(names[n], "tinyllama-mini") ? 32000 : 2048);
    }
    assert_int_equal(n, 7);
    tide_llama_config big;
    assert_int_equal(tide_llama_config_named(f->ctx, "llama-3.1-405b", &big), TIDE_OK);
    assert_int_equal(big.hidden_size, 16384);
    assert_int_equal(big.intermediate_size, 53248);
    assert_int_equal(big.num_hidden_layers, 126);
    assert_int_equal(big.num_attention_heads, 128);
    assert_int_equal(big.num_key_value_heads, 8);

    tide_llama_config c;
    assert_int_equal(tide_llama_config_named(f->ctx, "tinyllama-1.1b", &c), TIDE_OK);
    assert_int_equal(c.hidden_size, 2048);
    assert_int_equal(c.intermediate_size, 5632);
    assert_int_equal(c.num_hidden_layers, 22);
    assert_int_equal(c.num_attention_heads, 32);
    assert_int_equal(c.num_key_value_heads, 4);
    assert_int_equal(c.max_position_embeddings, 2048);
    assert_true(c.rms_norm_eps == 1e-5f);

    assert_int_equal(tide_llama_config_named(f->ctx, "llama-2-70b", &c), TIDE_OK);
    assert_int_equal(c.hidden_size, 8192);
    assert_int_equal(c.intermediate_size, 28672);
    assert_int_equal(c.num_hidden_layers, 80);
    assert_int_equal(c.num_attention_heads, 64);
    assert_int_equal(c.num_key_value_heads, 8);
    assert_int_equal(c.max_position_embeddings, 4096);

    assert_int_equal(tide_llama_config_named(f->ctx, "llama-7b", &c), TIDE_OK);
    assert_true(c.rms_norm_eps == 1e-6f);
    assert_int_equal(c.num_key_value_heads, 32);
}

static void test_named_param_counts(void **state) {
    fixture *f = *state;
    static const struct { const char *name; double params; } want[] = {
        {"tinyllama-1.1b", 1.100e9}, {"llama-7b", 6.738e9}, {"llama-13b", 1.3016e10},
        {"llama-65b", 6.5286e10},   {"llama-2-70b", 6.898e10},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        tide_llama_config cfg;
        assert_int_equal(tide_llama_config_named(f->ctx, want[i].name, &cfg), TIDE_OK);
        double p = (double)tide_llama_config_params(&cfg);
        if (fabs(p / want[i].params - 1.0) > 0.005)
            print_error("%s: %.4e parameters, expected %.4e\n", want[i].name, p, want[i].params);
        assert_true(fabs(p / want[i].params - 1.0) <= 0.005);
    }
    /* Tying removes exactly the output head. */
    tide_llama_config cfg;
    tide_llama_config_named(f->ctx, "tinyllama-1.1b", &cfg);
    uint64_t untied = tide_llama_config_params(&cfg);
    cfg.tie_word_embeddings = true;
    assert_int_equal(untied - tide_llama_config_params(&cfg), (uint64_t)32000 * 2048);
}

static void test_named_unknown(void **state) {
    fixture *f = *state;
    tide_llama_config cfg;
    assert_int_equal(tide_llama_config_named(f->ctx, "gpt-5", &cfg), TIDE_E_NOT_FOUND);
    const char *msg = tide_ctx_last_error(f->ctx);
    assert_non_null(strstr(msg, "gpt-5"));
    assert_non_null(strstr(msg, "tinyllama-1.1b"));
    assert_non_null(strstr(msg, "llama-2-70b"));
}

/* ---------------------------------------------------------------- check */

static void test_check(void **state) {
    fixture *f = *state;
    tide_llama_config good;
    tide_llama_config_named(f->ctx, "llama-2-70b", &good);
    assert_int_equal(tide_llama_config_check(f->ctx, &good), TIDE_OK);
    static const struct { size_t off; int value; const char *field; } bad[] = {
        {offsetof(tide_llama_config, hidden_size), 0, "hidden_size"},
        {offsetof(tide_llama_config, intermediate_size), -5, "intermediate_size"},
        {offsetof(tide_llama_config, num_hidden_layers), 0, "num_hidden_layers"},
        {offsetof(tide_llama_config, num_attention_heads), 0, "num_attention_heads"},
        {offsetof(tide_llama_config, num_key_value_heads), 0, "num_key_value_heads"},
        {offsetof(tide_llama_config, vocab_size), 0, "vocab_size"},
        {offsetof(tide_llama_config, max_position_embeddings), -1, "max_position_embeddings"},
        {offsetof(tide_llama_config, num_attention_heads), 60, "num_attention_heads"}, /* 8192 % 60 */
        {offsetof(tide_llama_config, num_key_value_heads), 7, "num_key_value_heads"},  /* 64 % 7 */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        tide_llama_config c = good;
        memcpy((char *)&c + bad[i].off, &bad[i].value, sizeof(int));
        assert_int_equal(tide_llama_config_check(f->ctx, &c), TIDE_E_INVALID);
        assert_non_null(strstr(tide_ctx_last_error(f->ctx), bad[i].field));
    }
    tide_llama_config c = good;
    c.hidden_size = 8192 - 64 * 1 + 0; /* 8128 / 64 = 127: odd head dim */
    assert_int_equal(tide_llama_config_check(f->ctx, &c), TIDE_E_INVALID);
    assert_non_null(strstr(tide_ctx_last_error(f->ctx), "odd"));
    c = good;
    c.rms_norm_eps = 0.0f;
    assert_int_equal(tide_llama_config_check(f->ctx, &c), TIDE_E_INVALID);
    assert_non_null(strstr(tide_ctx_last_error(f->ctx), "rms_norm_eps"));
    c = good;
    c.rope_theta = -1.0f;
    assert_int_equal(tide_llama_config_check(f->ctx, &c), TIDE_E_INVALID);
    assert_non_null(strstr(tide_ctx_last_error(f->ctx), "rope_theta"));
    c = good;
    c.dtype = TIDE_I32;
    assert_int_equal(tide_llama_config_check(f->ctx, &c), TIDE_E_INVALID);
    assert_non_null(strstr(tide_ctx_last_error(f->ctx), "dtype"));
}

/* ---------------------------------------------------------------- save/load */

static void assert_config_equal(const tide_llama_config *a, const tide_llama_config *b) {
    assert_string_equal(a->name, b->name);
    assert_int_equal(a->hidden_size, b->hidden_size);
    assert_int_equal(a->intermediate_size, b->intermediate_size);
    assert_int_equal(a->num_hidden_layers, b->num_hidden_layers);
    assert_int_equal(a->num_attention_heads, b->num_attention_heads);
    assert_int_equal(a->num_key_value_heads, b->num_key_value_heads);
    assert_int_equal(a->vocab_size, b->vocab_size);
    assert_int_equal(a->max_position_embeddings, b->max_position_embeddings);
    assert_true(a->rms_norm_eps == b->rms_norm_eps);
    assert_true(a->rope_theta == b->rope_theta);
    assert_int_equal(a->tie_word_embeddings, b->tie_word_embeddings);
    assert_int_equal(a->dtype, b->dtype);
}

static void test_save_load_roundtrip(void **state) {
    fixture *f = *state;
    for (const char *const *n = tide_llama_config_names(); *n; n++) {
        tide_llama_config a, b;
        assert_int_equal(tide_llama_config_named(f->ctx, *n, &a), TIDE_OK);
        assert_int_equal(tide_llama_config_save(f->ctx, &a, f->path), TIDE_OK);
        assert_int_equal(tide_llama_config_load(f->ctx, f->path, &b), TIDE_OK);
        assert_config_equal(&a, &b);
    }
    /* A custom one exercising every field. */
    tide_llama_config a = {
        .name = "custom", .hidden_size = 96, .intermediate_size = 250, .num_hidden_layers = 3,
        .num_attention_heads = 6, .num_key_value_heads = 3, .vocab_size = 1000,
        .max_position_embeddings = 777, .rms_norm_eps = 3.3e-6f, .rope_theta = 500000.0f,
        .tie_word_embeddings = true, .dtype = TIDE_F16,
    }, b;
    for (int dt = TIDE_F32; dt <= TIDE_BF16; dt++) {
        a.dtype = (tide_dtype)dt;
        a.tie_word_embeddings = dt != TIDE_F32;
        assert_int_equal(tide_llama_config_save(f->ctx, &a, f->path), TIDE_OK);
        assert_int_equal(tide_llama_config_load(f->ctx, f->path, &b), TIDE_OK);
        assert_config_equal(&a, &b);
    }
    /* No temporary file remains. */
    char tmp[160];
    snprintf(tmp, sizeof tmp, "%s.tmp", f->path);
    assert_int_not_equal(access(tmp, F_OK), 0);
}

/* The saved file carries what Hugging Face needs to recognise the model. */
static void test_save_hf_fields(void **state) {
    fixture *f = *state;
    tide_llama_config a;
    tide_llama_config_named(f->ctx, "tinyllama-1.1b", &a);
    assert_int_equal(tide_llama_config_save(f->ctx, &a, f->path), TIDE_OK);
    FILE *fp = fopen(f->path, "r");
    assert_non_null(fp);
    char buf[8192];
    size_t n = fread(buf, 1, sizeof buf - 1, fp);
    fclose(fp);
    buf[n] = '\0';
    cJSON *o = cJSON_Parse(buf);
    assert_non_null(o);
    cJSON *arch = cJSON_GetObjectItem(o, "architectures");
    assert_true(cJSON_IsArray(arch));
    assert_string_equal(cJSON_GetArrayItem(arch, 0)->valuestring, "LlamaForCausalLM");
    assert_string_equal(cJSON_GetObjectItem(o, "model_type")->valuestring, "llama");
    assert_string_equal(cJSON_GetObjectItem(o, "hidden_act")->valuestring, "silu");
    assert_string_equal(cJSON_GetObjectItem(o, "torch_dtype")->valuestring, "bfloat16");
    assert_int_equal(cJSON_GetObjectItem(o, "num_key_value_heads")->valueint, 4);
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(o, "rope_scaling")));
    assert_true(cJSON_IsFalse(cJSON_GetObjectItem(o, "tie_word_embeddings")));
    /* eps written as the short decimal, not float noise */
    assert_non_null(strstr(buf, "1e-05"));
    cJSON_Delete(o);
}

static void test_save_fails(void **state) {
    fixture *f = *state;
    tide_llama_config a;
    tide_llama_config_named(f->ctx, "llama-7b", &a);
    char path[160];
    snprintf(path, sizeof path, "%s/no/such/dir/config.json", f->dir);
    assert_int_equal(tide_llama_config_save(f->ctx, &a, path), TIDE_E_IO);
    assert_non_null(strstr(tide_ctx_last_error(f->ctx), "no/such/dir/config.json"));
    a.hidden_size = 0;
    assert_int_equal(tide_llama_config_save(f->ctx, &a, f->path), TIDE_E_INVALID);
    assert_int_not_equal(access(f->path, F_OK), 0);
}

/* Entries of dir other than "." and "..". */
static int n_entries(const char *dir) {
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) n += strcmp(de->d_name, ".") && strcmp(de->d_name, "..");
    closedir(d);
    return n;
}

static void assert_file_holds(const char *path, const char *text) {
    FILE *fp = fopen(path, "r");
    assert_non_null(fp);
    char buf[64] = {0};
    size_t n = fread(buf, 1, sizeof buf - 1, fp);
    fclose(fp);
    buf[n] = '\0';
    assert_string_equal(buf, text);
}

/* The whole-file writer under every config, profile, plan and trace save
 * (core.h): a write that fails part way (the file size limit: EFBIG, as a
 * full disk would be ENOSPC), a rename that fails, and an abort each leave
 * the old file as it was and no temporary beside it; the messages name the
 * path and the cause. */
static void test_file_atomic(void **state) {
    fixture *f = *state;
    tide_atomic_file af;
    write_text(f->path, "old");

    /* Writes refused past 64 bytes (SIGXFSZ ignored: write returns EFBIG). */
    struct rlimit was;
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &was), 0);
    void (*old_handler)(int) = signal(SIGXFSZ, SIG_IGN);
    struct rlimit small = {64, was.rlim_max};
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &small), 0);
    char big[4096];
    memset(big, 'x', sizeof big);
    tide_status st_buf = tide_write_file_atomic(f->ctx, "test file", f->path, big, sizeof big);
    char msg_buf[TIDE_ERRMSG_MAX];
    snprintf(msg_buf, sizeof msg_buf, "%s", tide_ctx_last_error(f->ctx));
    tide_status st_begin = tide_file_begin(f->ctx, "test file", f->path, &af), st_stream = TIDE_OK;
    if (st_begin == TIDE_OK) {
        for (int i = 0; i < 1000; i++) fprintf(af.fp, "line %d\n", i);
        st_stream = tide_file_commit(&af);
    }
    setrlimit(RLIMIT_FSIZE, &was);
    signal(SIGXFSZ, old_handler);
    assert_int_equal(st_buf, TIDE_E_IO);
    assert_non_null(strstr(msg_buf, f->path));
    assert_non_null(strstr(msg_buf, "write failed"));
    assert_non_null(strstr(msg_buf, strerror(EFBIG)));
    assert_int_equal(st_begin, TIDE_OK);
    assert_int_equal(st_stream, TIDE_E_IO);
    assert_non_null(strstr(tide_ctx_last_error(f->ctx), "write failed"));
    assert_null(af.fp);
    assert_file_holds(f->path, "old");
    assert_int_equal(n_entries(f->dir), 1);

    /* Abort: nothing written, nothing left. */
    assert_int_equal(tide_file_begin(f->ctx, "test file", f->path, &af), TIDE_OK);
    fputs("new", af.fp);
    assert_int_equal(n_entries(f->dir), 2);
    tide_file_abort(&af);
    tide_file_abort(&af); /* a no-op the second time */
    assert_file_holds(f->path, "old");
    assert_int_equal(n_entries(f->dir), 1);

    /* A directory in the way: the rename fails, the temporary goes. */
    char sub[160];
    snprintf(sub, sizeof sub, "%s/adir", f->dir);
    assert_int_equal(mkdir(sub, 0777), 0);
    assert_int_equal(tide_write_file_atomic(f->ctx, "test file", sub, "abc", 3), TIDE_E_IO);
    assert_non_null(strstr(tide_ctx_last_error(f->ctx), "cannot rename"));
    assert_non_null(strstr(tide_ctx_last_error(f->ctx), sub));
    assert_int_equal(n_entries(f->dir), 2);
    assert_int_equal(rmdir(sub), 0);

    /* No directory: nothing to create the temporary in. */
    snprintf(sub, sizeof sub, "%s/no/such/x.json", f->dir);
    assert_int_equal(tide_file_begin(f->ctx, "test file", sub, &af), TIDE_E_IO);
    assert_non_null(strstr(tide_ctx_last_error(f->ctx), "cannot create"));
    assert_non_null(strstr(tide_ctx_last_error(f->ctx), sub));
    assert_null(af.fp);
    tide_file_abort(&af);

    /* Success replaces the old file, streamed or whole; mode 0644 (umask 022). */
    mode_t um = umask(022);
    assert_int_equal(tide_file_begin(f->ctx, "test file", f->path, &af), TIDE_OK);
    fprintf(af.fp, "new %d", 1);
    assert_int_equal(tide_file_commit(&af), TIDE_OK);
    umask(um);
    assert_file_holds(f->path, "new 1");
    struct stat sb;
    assert_int_equal(stat(f->path, &sb), 0);
    assert_int_equal(sb.st_mode & 0777, 0644);
    assert_int_equal(tide_write_file_atomic(f->ctx, "test file", f->path, "new 2", 5), TIDE_OK);
    assert_file_holds(f->path, "new 2");
    assert_int_equal(tide_write_file_atomic(f->ctx, "test file", f->path, NULL, 0), TIDE_OK);
    assert_file_holds(f->path, "");
    assert_int_equal(n_entries(f->dir), 1);
}

static void test_load_defaults(void **state) {
    fixture *f = *state;
    cJSON *o = base_json();
    cJSON_DeleteItemFromObject(o, "num_key_value_heads");
    cJSON_DeleteItemFromObject(o, "rope_theta");
    cJSON_DeleteItemFromObject(o, "tie_word_embeddings");
    cJSON_DeleteItemFromObject(o, "torch_dtype");
    cJSON_DeleteItemFromObject(o, "architectures"); /* model_type alone is enough */
    write_json(f->path, o);
    tide_llama_config c;
    assert_int_equal(tide_llama_config_load(f->ctx, f->path, &c), TIDE_OK);
    assert_int_equal(c.num_key_value_heads, 4); /* = num_attention_heads, as HF */
    assert_true(c.rope_theta == 10000.0f);
    assert_false(c.tie_word_embeddings);
    assert_int_equal(c.dtype, TIDE_F32);
    assert_int_equal(c.hidden_size, 64);
    assert_true(c.rms_norm_eps == 1e-5f);
    /* Named after its directory when there is no _name_or_path. */
    assert_string_equal(c.name, strrchr(f->dir, '/') + 1);

    /* The newer "dtype" key and null optional fields. */
    o = base_json();
    cJSON_DeleteItemFromObject(o, "torch_dtype");
    cJSON_AddStringToObject(o, "dtype", "float16");
    cJSON_AddNullToObject(o, "rope_scaling");
    cJSON_DeleteItemFromObject(o, "model_type"); /* architectures alone is enough */
    write_json(f->path, o);
    assert_int_equal(tide_llama_config_load(f->ctx, f->path, &c), TIDE_OK);
    assert_int_equal(c.dtype, TIDE_F16);
    assert_int_equal(c.num_key_value_heads, 2);
}

/* ---------------------------------------------------------------- bad files */

static void test_load_missing_file(void **state) {
    fixture *f = *state;
    tide_llama_config c;
    assert_int_equal(tide_llama_config_load(f->ctx, f->path, &c), TIDE_E_NOT_FOUND);
    assert_non_null(strstr(tide_ctx_last_error(f->ctx), f->path));
}

static void test_load_malformed_json(void **state) {
    fixture *f = *state;
    write_text(f->path, "{\n  \"hidden_size\": 64,\n  \"vocab_size\": \n}\n");
    expect_load_fails(f, TIDE_E_FORMAT, "malformed JSON");
    write_text(f->path, "{\"hidden_size\": 64} trailing");
    expect_load_fails(f, TIDE_E_FORMAT, "malformed JSON");
    write_text(f->path, "");
    expect_load_fails(f, TIDE_E_FORMAT, "malformed JSON");
}

static void test_load_not_object(void **state) {
    fixture *f = *state;
    write_text(f->path, "[1, 2, 3]");
    expect_load_fails(f, TIDE_E_FORMAT, "not a JSON object");
}

static void test_load_wrong_types(void **state) {
    fixture *f = *state;
    cJSON *o = base_json();
    set_string(o, "hidden_size", "64");
    write_json(f->path, o);
    expect_load_fails(f, TIDE_E_FORMAT, "hidden_size");

    o = base_json();
    set_number(o, "num_hidden_layers", 2.5);
    write_json(f->path, o);
    expect_load_fails(f, TIDE_E_FORMAT, "num_hidden_layers");

    o = base_json();
    set_string(o, "rms_norm_eps", "1e-5");
    write_json(f->path, o);
    expect_load_fails(f, TIDE_E_FORMAT, "rms_norm_eps");

    o = base_json();
    set_number(o, "tie_word_embeddings", 1);
    write_json(f->path, o);
    expect_load_fails(f, TIDE_E_FORMAT, "tie_word_embeddings");

    o = base_json();
    set_number(o, "torch_dtype", 16);
    write_json(f->path, o);
    expect_load_fails(f, TIDE_E_FORMAT, "torch_dtype");

    o = base_json();
    set_string(o, "architectures", "LlamaForCausalLM"); /* a string, not an array */
    write_json(f->path, o);
    expect_load_fails(f, TIDE_E_FORMAT, "architectures");
}

static void test_load_missing_field(void **state) {
    fixture *f = *state;
    static const char *const required[] = {
        "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
        "vocab_size", "max_position_embeddings", "rms_norm_eps",
    };
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++) {
        cJSON *o = base_json();
        cJSON_DeleteItemFromObject(o, required[i]);
        write_json(f->path, o);
        expect_load_fails(f, TIDE_E_FORMAT, required[i]);
        assert_non_null(strstr(tide_ctx_last_error(f->ctx), "missing"));
    }
    cJSON *o = base_json();
    cJSON_DeleteItemFromObject(o, "model_type");
    cJSON_DeleteItemFromObject(o, "architectures");
    write_json(f->path, o);
    expect_load_fails(f, TIDE_E_FORMAT, "model_type");
}

static void test_load_nonpositive(void **state) {
    fixture *f = *state;
    static const char *const fields[] = {
        "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
        "num_key_value_heads", "vocab_size", "max_position_embeddings",
    };
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        cJSON *o = base_json();
        set_number(o, fields[i], i % 2 ? 0 : -8);
        write_json(f->path, o);
        expect_load_fails(f, TIDE_E_FORMAT, fields[i]);
    }
    cJSON *o = base_json();
    set_number(o, "rms_norm_eps", 0);
    write_json(f->path, o);
    expect_load_fails(f, TIDE_E_FORMAT, "rms_norm_eps");
    o = base_json();
    set_number(o, "rope_theta", -1);
    write_json(f->path, o);
    expect_load_fails(f, TIDE_E_FORMAT, "rope_theta");
}

static void test_load_heads_not_dividing(void **state) {
    fixture *f = *state;
    cJSON *o = base_json();
    set_number(o, "num_attention_heads", 5); /* 64 % 5 */
    set_number(o, "num_key_value_heads", 5);
    write_json(f->path, o);
    expect_load_fails(f, TIDE_E_FORMAT, "num_attention_heads (5) does not divide hidden_size");

    o = base_json();
    set_number(o, "num_key_value_heads", 3); /* 4 % 3 */
    write_json(f->path, o);
    expect_load_fails(f, TIDE_E_FORMAT, "num_key_value_heads (3) does not divide");
}

static void test_load_odd_head_dim(void **state) {
    fixture *f = *state;
    cJSON *o = base_json();
    set_number(o, "hidden_size", 60); /* 60 / 4 = 15 */
    write_json(f->path, o);
    expect_load_fails(f, TIDE_E_FORMAT, "odd");
}

/* transformers 5 writes rope_theta inside "rope_parameters". */
static void test_load_rope_parameters(void **state) {
    fixture *f = *state;
    cJSON *o = base_json();
    cJSON_DeleteItemFromObject(o, "rope_theta");
    cJSON *rp = cJSON_CreateObject();
    cJSON_AddNumberToObject(rp, "rope_theta", 500000.0);
    cJSON_AddStringToObject(rp, "rope_type", "default");
    cJSON_AddItemToObject(o, "rope_parameters", rp);
    write_json(f->path, o);
    tide_llama_config cfg;
    assert_int_equal(tide_llama_config_load(f->ctx, f->path, &cfg), TIDE_OK);
    assert_true(cfg.rope_theta == 500000.0f);

    o = base_json();
    rp = cJSON_CreateObject();
    cJSON_AddNumberToObject(rp, "rope_theta", 500000.0);
    cJSON_AddStringToObject(rp, "rope_type", "llama3");
    cJSON_AddItemToObject(o, "rope_parameters", rp);
    write_json(f->path, o);
    expect_load_fails(f, TIDE_E_UNSUPPORTED, "llama3");
}

static void test_load_unsupported(void **state) {
    fixture *f = *state;
    cJSON *o = base_json();
    cJSON_DeleteItemFromObject(o, "architectures");
    cJSON *arch = cJSON_CreateArray();
    cJSON_AddItemToArray(arch, cJSON_CreateString("MistralForCausalLM"));
    cJSON_AddItemToObject(o, "architectures", arch);
    write_json(f->path, o);
    expect_load_fails(f, TIDE_E_UNSUPPORTED, "MistralForCausalLM");

    o = base_json();
    set_string(o, "model_type", "gpt2");
    write_json(f->path, o);
    expect_load_fails(f, TIDE_E_UNSUPPORTED, "gpt2");

    o = base_json();
    cJSON *rs = cJSON_CreateObject();
    cJSON_AddStringToObject(rs, "type", "linear");
    cJSON_AddNumberToObject(rs, "factor", 2.0);
    cJSON_AddItemToObject(o, "rope_scaling", rs);
    write_json(f->path, o);
    expect_load_fails(f, TIDE_E_UNSUPPORTED, "rope_scaling");

    o = base_json();
    set_string(o, "torch_dtype", "int8");
    write_json(f->path, o);
    expect_load_fails(f, TIDE_E_UNSUPPORTED, "int8");

    o = base_json();
    set_string(o, "hidden_act", "gelu");
    write_json(f->path, o);
    expect_load_fails(f, TIDE_E_UNSUPPORTED, "gelu");

    o = base_json();
    cJSON_AddBoolToObject(o, "attention_bias", true);
    write_json(f->path, o);
    expect_load_fails(f, TIDE_E_UNSUPPORTED, "attention_bias");

    o = base_json();
    cJSON_AddNumberToObject(o, "head_dim", 32); /* != 64 / 4 */
    write_json(f->path, o);
    expect_load_fails(f, TIDE_E_UNSUPPORTED, "head_dim");
}

/* Every allocation of save and load failing in turn: TIDE_E_NOMEM, nothing
 * leaked, nothing half-written. */
static void test_alloc_failures(void **state) {
    fixture *f = *state;
    tide_llama_config a, b;
    tide_llama_config_named(f->ctx, "llama-13b", &a);
    int64_t base = tide_alloc_live_bytes();
    int failures = 0;
    for (long n = 1;; n++) {
        tide_alloc_fail_nth(n);
        tide_status st = tide_llama_config_save(f->ctx, &a, f->path);
        tide_alloc_fail_nth(0);
        assert_int_equal(tide_alloc_live_bytes(), base);
        if (st == TIDE_OK) break;
        assert_int_equal(st, TIDE_E_NOMEM);
        assert_int_not_equal(access(f->path, F_OK), 0);
        failures++;
    }
    assert_true(failures >= 1);
    failures = 0;
    for (long n = 1;; n++) {
        tide_alloc_fail_nth(n);
        tide_status st = tide_llama_config_load(f->ctx, f->path, &b);
        tide_alloc_fail_nth(0);
        assert_int_equal(tide_alloc_live_bytes(), base);
        if (st == TIDE_OK) break;
        assert_int_equal(st, TIDE_E_NOMEM);
        failures++;
    }
    assert_true(failures >= 1);
    assert_int_equal(b.hidden_size, 5120);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_named_configs, setup, teardown),
        cmocka_unit_test_setup_teardown(test_named_param_counts, setup, teardown),
        cmocka_unit_test_setup_teardown(test_named_unknown, setup, teardown),
        cmocka_unit_test_setup_teardown(test_check, setup, teardown),
        cmocka_unit_test_setup_teardown(test_save_load_roundtrip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_save_hf_fields, setup, teardown),
        cmocka_unit_test_setup_teardown(test_save_fails, setup, teardown),
        cmocka_unit_test_setup_teardown(test_file_atomic, setup, teardown),
        cmocka_unit_test_setup_teardown(test_load_defaults, setup, teardown),
        cmocka_unit_test_setup_teardown(test_load_missing_file, setup, teardown),
        cmocka_unit_test_setup_teardown(test_load_rope_parameters, setup, teardown),
        cmocka_unit_test_setup_teardown(test_load_malformed_json, setup, teardown),
        cmocka_unit_test_setup_teardown(test_load_not_object, setup, teardown),
        cmocka_unit_test_setup_teardown(test_load_wrong_types, setup, teardown),
        cmocka_unit_test_setup_teardown(test_load_missing_field, setup, teardown),
        cmocka_unit_test_setup_teardown(test_load_nonpositive, setup, teardown),
        cmocka_unit_test_setup_teardown(test_load_heads_not_dividing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_load_odd_head_dim, setup, teardown),
        cmocka_unit_test_setup_teardown(test_load_unsupported, setup, teardown),
        cmocka_unit_test_setup_teardown(test_alloc_failures, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
