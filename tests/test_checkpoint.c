/*
 * test_checkpoint.c - safetensors checkpoints: synthetic generation round
 * trips (every dtype, single file and sharded, determinism across seeds,
 * threads and layouts, a pinned digest), one test per kind of malformed file
 * or index (the status and a message naming the file, the tensor and the
 * problem), write failures leaving nothing behind, and tide_checkpoint_match
 * against hand-made graphs and against tide_llama_build's.
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

#include <dirent.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/alloc_test.h"
#include "core/core.h"
#include "model/checkpoint.h"

typedef struct fixture {
    tide_ctx *ctx;
    char dir[64];
} fixture;

static void remove_tree(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *de;
    char p[512];
    while ((de = readdir(d)) != NULL) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        struct stat st;
        if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode)) remove_tree(p);
        else unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    if (!f) return -1;
    f->ctx = tide_ctx_new();
    snprintf(f->dir, sizeof f->dir, "/tmp/tide_ck_XXXXXX");
    if (!f->ctx || !mkdtemp(f->dir)) return -1;
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    remove_tree(f->dir);
    tide_ctx_free(f->ctx);
    free(f);
    return 0;
}

/* dir/name into buf. */
static const char *P(char *buf, const fixture *f, const char *name) {
    snprintf(buf, 256, "%s/%s", f->dir, name);
    return buf;
}

static void write_bytes(const char *path, const void *data, size_t n) {
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    if (n) assert_int_equal(fwrite(data, 1, n, fp), n);
    assert_int_equal(fclose(fp), 0);
}

/* A safetensors file: the header JSON (padded with spaces to a multiple of 8)
 * and data_len zero bytes of data. */
static void write_st(const fixture *f, const char *name, const char *header, size_t data_len) {
    size_t hl = strlen(header), padded = (hl + 7) / 8 * 8;
    size_t n = 8 + padded + data_len;
    unsigned char *b = calloc(1, n);
    assert_non_null(b);
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    memcpy(b + 8, header, hl);
    memset(b + 8 + hl, ' ', padded - hl);
    char path[256];
    write_bytes(P(path, f, name), b, n);
    free(b);
}

static tide_llama_config tiny_config(tide_dtype dt, bool tied) {
    tide_llama_config c = {
        .name = "tiny", .hidden_size = 64, .intermediate_size = 160, .num_hidden_layers = 2,
        .num_attention_heads = 4, .num_key_value_heads = 2, .vocab_size = 128,
        .max_position_embeddings = 256, .rms_norm_eps = 1e-5f, .rope_theta = 10000.0f,
        .tie_word_embeddings = tied, .dtype = dt,
    };
    return c;
}

/* Big enough for whole generator blocks (16384 elements) in its matrices. */
static tide_llama_config small_config(tide_dtype dt) {
    tide_llama_config c = tiny_config(dt, false);
    c.hidden_size = 128;
    c.intermediate_size = 352;
    c.vocab_size = 1000;
    return c;
}

static void write_config(const fixture *f, bool tied) {
    char path[256];
    tide_llama_config c = tiny_config(TIDE_F32, tied);
    assert_int_equal(tide_llama_config_save(f->ctx, &c, P(path, f, "config.json")), TIDE_OK);
}

/* Opens f->dir expecting failure: the status, and a message holding every
 * non-NULL needle. */
static void expect_open_fails(fixture *f, tide_status want, const char *n1, const char *n2,
                              const char *n3) {
    tide_checkpoint *ck = (tide_checkpoint *)1;
    tide_status st = tide_checkpoint_open(f->ctx, f->dir, &ck);
    const char *msg = tide_ctx_last_error(f->ctx);
    bool ok = st == want && (!n1 || strstr(msg, n1)) && (!n2 || strstr(msg, n2)) &&
              (!n3 || strstr(msg, n3));
    if (!ok)
        print_error("status %s, message: %s\n  (wanted %s with '%s' '%s' '%s')\n",
                    tide_status_str(st), msg, tide_status_str(want), n1 ? n1 : "",
                    n2 ? n2 : "", n3 ? n3 : "");
    assert_true(ok);
    assert_null(ck);
}

/* A single-file checkpoint from one header; expects the failure. */
static void bad_single(fixture *f, const char *header, size_t data_len, const char *n2,
                       const char *n3) {
    write_config(f, false);
    write_st(f, "model.safetensors", header, data_len);
    expect_open_fails(f, TIDE_E_FORMAT, "model.safetensors", n2, n3);
}

/* ---------------------------------------------------------------- malformed files */

static void test_truncated_file(void **state) {
    fixture *f = *state;
    char path[256];
    write_config(f, false);
    write_bytes(P(path, f, "model.safetensors"), "\x10\0\0\0\0", 5);
    expect_open_fails(f, TIDE_E_FORMAT, "model.safetensors", "truncated", NULL);
    write_bytes(path, "", 0);
    expect_open_fails(f, TIDE_E_FORMAT, "model.safetensors", "truncated", NULL);
}

static void test_header_past_end(void **state) {
    fixture *f = *state;
    char path[256];
    write_config(f, false);
    unsigned char b[24] = {0xe8, 0x03}; /* header length 1000, file 24 bytes */
    memcpy(b + 8, "{}              ", 16);
    write_bytes(P(path, f, "model.safetensors"), b, sizeof b);
    expect_open_fails(f, TIDE_E_FORMAT, "model.safetensors", "header length 1000", "past the end");
}

static void test_header_not_json(void **state) {
    fixture *f = *state;
    bad_single(f, "{\"a\": {\"dtype\": \"F32\",", 0, "not valid JSON", NULL);
}

static void test_header_not_object(void **state) {
    fixture *f = *state;
    bad_single(f, "[1, 2, 3]", 0, "not a JSON object", NULL);
}

static void test_header_trailing_garbage(void **state) {
    fixture *f = *state;
    bad_single(f, "{} xyz", 0, "not valid JSON", NULL);
}

static void test_unknown_dtype(void **state) {
    fixture *f = *state;
    bad_single(f, "{\"w.q\": {\"dtype\": \"Q4_K\", \"shape\": [4], \"data_offsets\": [0, 2]}}", 8,
               "'w.q'", "dtype 'Q4_K'");
    bad_single(f, "{\"w.q\": {\"shape\": [4], \"data_offsets\": [0, 16]}}", 16, "'w.q'", "dtype");
}

static void test_bad_shape(void **state) {
    fixture *f = *state;
    bad_single(f, "{\"w.s\": {\"dtype\": \"F32\", \"shape\": \"4\", \"data_offsets\": [0, 16]}}", 16,
               "'w.s'", "bad shape");
    bad_single(f, "{\"w.s\": {\"dtype\": \"F32\", \"shape\": [-4], \"data_offsets\": [0, 16]}}", 16,
               "'w.s'", "bad shape");
    bad_single(f, "{\"w.s\": {\"dtype\": \"F32\", \"shape\": [2.5], \"data_offsets\": [0, 16]}}", 16,
               "'w.s'", "bad shape");
    bad_single(f, "{\"w.s\": {\"dtype\": \"F32\", \"shape\": [\"2\"], \"data_offsets\": [0, 8]}}", 8,
               "'w.s'", "bad shape");
    bad_single(f,
               "{\"w.s\": {\"dtype\": \"F32\", \"shape\": [1, 1, 1, 1, 1], \"data_offsets\": [0, 4]}}",
               4, "'w.s'", "5 dims");
}

static void test_bad_data_offsets(void **state) {
    fixture *f = *state;
    bad_single(f, "{\"w.o\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0]}}", 16,
               "'w.o'", "data_offsets is not two");
    bad_single(f, "{\"w.o\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, \"16\"]}}",
               16, "'w.o'", "data_offsets is not two");
    bad_single(f, "{\"w.o\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16, 32]}}",
               32, "'w.o'", "data_offsets is not two");
    bad_single(f, "{\"w.o\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [-8, 8]}}", 16,
               "'w.o'", "data_offsets is not two");
    bad_single(f, "{\"w.o\": {\"dtype\": \"F32\", \"shape\": [4]}}", 16, "'w.o'", "data_offsets");
}

static void test_begin_after_end(void **state) {
    fixture *f = *state;
    bad_single(f, "{\"w.b\": {\"dtype\": \"F32\", \"shape\": [0], \"data_offsets\": [16, 0]}}", 16,
               "'w.b'", "begin 16 > end 0");
}

static void test_end_past_data(void **state) {
    fixture *f = *state;
    bad_single(f, "{\"w.e\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16]}}", 12,
               "'w.e'", "past the end of the data section");
}

static void test_byte_size_mismatch(void **state) {
    fixture *f = *state;
    bad_single(f, "{\"w.n\": {\"dtype\": \"F32\", \"shape\": [3], \"data_offsets\": [0, 16]}}", 16,
               "'w.n'", "byte size 16");
    bad_single(f, "{\"w.n\": {\"dtype\": \"BF16\", \"shape\": [2, 4], \"data_offsets\": [0, 8]}}",
               16, "'w.n'", "(2, 4)");
}

static void test_overlap(void **state) {
    fixture *f = *state;
    bad_single(f,
               "{\"w.a\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16]},"
               " \"w.b\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [8, 24]}}",
               24, "'w.a' and 'w.b' overlap", NULL);
    /* one tensor inside another */
    bad_single(f,
               "{\"w.a\": {\"dtype\": \"F32\", \"shape\": [8], \"data_offsets\": [0, 32]},"
               " \"w.b\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [8, 12]},"
               " \"w.c\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [32, 40]}}",
               40, "'w.a' and 'w.b' overlap", NULL);
}

static void test_misaligned(void **state) {
    fixture *f = *state;
    bad_single(f, "{\"w.m\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [2, 6]}}", 8,
               "'w.m'", "not aligned");
}

static void test_duplicate_in_file(void **state) {
    fixture *f = *state;
    bad_single(f,
               "{\"w.d\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]},"
               " \"w.d\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}",
               8, "'w.d'", "twice");
}

static void test_bad_metadata(void **state) {
    fixture *f = *state;
    bad_single(f, "{\"__metadata__\": [1]}", 0, "__metadata__", NULL);
}

static void test_missing_pieces(void **state) {
    fixture *f = *state;
    char path[256];
    tide_checkpoint *ck = NULL;
    /* no directory */
    assert_int_equal(tide_checkpoint_open(f->ctx, "/nonexistent/tide/ck", &ck), TIDE_E_NOT_FOUND);
    assert_non_null(strstr(tide_ctx_last_error(f->ctx), "/nonexistent/tide/ck"));
    /* no config.json */
    write_st(f, "model.safetensors", "{}", 0);
    expect_open_fails(f, TIDE_E_NOT_FOUND, f->dir, "config.json", NULL);
    /* no model file */
    unlink(P(path, f, "model.safetensors"));
    write_config(f, false);
    expect_open_fails(f, TIDE_E_NOT_FOUND, f->dir, "model.safetensors", NULL);
    /* a bad config.json is reported as such */
    write_bytes(P(path, f, "config.json"), "{", 1);
    write_st(f, "model.safetensors", "{}", 0);
    expect_open_fails(f, TIDE_E_FORMAT, "config.json", "malformed JSON", NULL);
}

/* ---------------------------------------------------------------- malformed indexes */

#define T_A "{\"w.a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}"
#define T_B "{\"w.b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}"
#define T_AB                                                                   \
    "{\"w.a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}, " \
    "\"w.b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [8, 16]}}"
#define SHARD1 "model-00001-of-00002.safetensors"
#define SHARD2 "model-00002-of-00002.safetensors"

static void write_index(const fixture *f, const char *json) {
    char path[256];
    write_bytes(P(path, f, "model.safetensors.index.json"), json, strlen(json));
}

static void test_index_ok(void **state) {
    fixture *f = *state;
    write_config(f, false);
    write_st(f, SHARD1, T_A, 8);
    write_st(f, SHARD2, T_B, 8);
    write_index(f, "{\"metadata\": {\"total_size\": 16}, \"weight_map\": {\"w.a\": \"" SHARD1
                   "\", \"w.b\": \"" SHARD2 "\"}}");
    tide_checkpoint *ck = NULL;
    assert_int_equal(tide_checkpoint_open(f->ctx, f->dir, &ck), TIDE_OK);
    assert_int_equal(tide_checkpoint_n_tensors(ck), 2);
    assert_int_equal(ck->n_files, 2);
    tide_tensor_info ti;
    assert_int_equal(tide_checkpoint_get(ck, "w.b", &ti), TIDE_OK);
    assert_non_null(strstr(ti.file, SHARD2));
    assert_int_equal(ti.file_offset, 8 + ck->files[ck->tensors[1].file].data_start - 8);
    tide_checkpoint_free(ck);
}

static void test_index_malformed(void **state) {
    fixture *f = *state;
    write_config(f, false);
    write_st(f, SHARD1, T_A, 8);
    write_index(f, "{\"weight_map\": {\"w.a\": ");
    expect_open_fails(f, TIDE_E_FORMAT, "model.safetensors.index.json", "not valid JSON", NULL);
    write_index(f, "[]");
    expect_open_fails(f, TIDE_E_FORMAT, "model.safetensors.index.json", "not a JSON object", NULL);
    write_index(f, "{\"metadata\": {}}");
    expect_open_fails(f, TIDE_E_FORMAT, "model.safetensors.index.json", "weight_map", NULL);
    write_index(f, "{\"weight_map\": {\"w.a\": 1}}");
    expect_open_fails(f, TIDE_E_FORMAT, "model.safetensors.index.json", "'w.a'", NULL);
    write_index(f, "{\"weight_map\": {\"w.a\": \"../" SHARD1 "\"}}");
    expect_open_fails(f, TIDE_E_FORMAT, "model.safetensors.index.json", "'w.a'", NULL);
}

static void test_index_missing_shard(void **state) {
    fixture *f = *state;
    write_config(f, false);
    write_st(f, SHARD1, T_A, 8);
    write_index(f, "{\"weight_map\": {\"w.a\": \"" SHARD1 "\", \"w.b\": \"" SHARD2 "\"}}");
    expect_open_fails(f, TIDE_E_NOT_FOUND, "model.safetensors.index.json", SHARD2, "'w.b'");
}

static void test_index_tensor_absent_from_shard(void **state) {
    fixture *f = *state;
    write_config(f, false);
    write_st(f, SHARD1, T_A, 8);
    write_st(f, SHARD2, T_B, 8);
    write_index(f, "{\"weight_map\": {\"w.a\": \"" SHARD1 "\", \"w.b\": \"" SHARD2
                   "\", \"w.c\": \"" SHARD2 "\"}}");
    expect_open_fails(f, TIDE_E_FORMAT, "'w.c'", SHARD2, "absent");
    /* listed in the wrong shard */
    write_index(f, "{\"weight_map\": {\"w.a\": \"" SHARD1 "\", \"w.b\": \"" SHARD1 "\", \"x\": \""
                   SHARD2 "\"}}");
    expect_open_fails(f, TIDE_E_FORMAT, "'w.b'", SHARD1, "absent");
}

static void test_shard_tensor_not_in_index(void **state) {
    fixture *f = *state;
    write_config(f, false);
    write_st(f, SHARD1, T_A, 8);
    write_st(f, SHARD2,
             "{\"w.b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}, "
             "\"w.extra\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [8, 16]}}",
             16);
    write_index(f, "{\"weight_map\": {\"w.a\": \"" SHARD1 "\", \"w.b\": \"" SHARD2 "\"}}");
    expect_open_fails(f, TIDE_E_FORMAT, "'w.extra'", SHARD2, "not in");
}

static void test_duplicate_across_shards(void **state) {
    fixture *f = *state;
    write_config(f, false);
    write_st(f, SHARD1, T_A, 8);
    write_st(f, SHARD2, T_AB, 16);
    write_index(f, "{\"weight_map\": {\"w.a\": \"" SHARD1 "\", \"w.b\": \"" SHARD2 "\"}}");
    expect_open_fails(f, TIDE_E_FORMAT, "duplicate tensor 'w.a'", SHARD1, SHARD2);
}

/* ---------------------------------------------------------------- synthetic */

static int expected_tensors(const tide_llama_config *c) {
    return 2 + 9 * c->num_hidden_layers + (c->tie_word_embeddings ? 0 : 1);
}

/* Checks that ck holds exactly the HF tensors of c with their shapes. */
static void check_layout(const tide_checkpoint *ck, const tide_llama_config *c) {
    int64_t D = c->hidden_size, I = c->intermediate_size, V = c->vocab_size;
    int64_t hd = D / c->num_attention_heads, H = c->num_attention_heads,
            KV = c->num_key_value_heads;
    assert_int_equal(tide_checkpoint_n_tensors(ck), expected_tensors(c));
    struct { char name[96]; int64_t d0, d1; } want[64];
    int n = 0;
#define W(a, b, ...) (snprintf(want[n].name, 96, __VA_ARGS__), want[n].d0 = (a), want[n++].d1 = (b))
    W(V, D, "model.embed_tokens.weight");
    W(D, 0, "model.norm.weight");
    if (!c->tie_word_embeddings) W(V, D, "lm_head.weight");
    for (int l = 0; l < c->num_hidden_layers; l++) {
        W(D, 0, "model.layers.%d.input_layernorm.weight", l);
        W(H * hd, D, "model.layers.%d.self_attn.q_proj.weight", l);
        W(KV * hd, D, "model.layers.%d.self_attn.k_proj.weight", l);
        W(KV * hd, D, "model.layers.%d.self_attn.v_proj.weight", l);
        W(D, H * hd, "model.layers.%d.self_attn.o_proj.weight", l);
        W(D, 0, "model.layers.%d.post_attention_layernorm.weight", l);
        W(I, D, "model.layers.%d.mlp.gate_proj.weight", l);
        W(I, D, "model.layers.%d.mlp.up_proj.weight", l);
        W(D, I, "model.layers.%d.mlp.down_proj.weight", l);
    }
#undef W
    assert_int_equal(n, expected_tensors(c));
    for (int i = 0; i < n; i++) {
        tide_tensor_info ti;
        if (tide_checkpoint_get(ck, want[i].name, &ti) != TIDE_OK) fail_msg("missing %s", want[i].name);
        assert_int_equal(ti.dtype, c->dtype);
        assert_int_equal(ti.ndim, want[i].d1 ? 2 : 1);
        assert_int_equal(ti.shape[0], want[i].d0);
        if (want[i].d1) assert_int_equal(ti.shape[1], want[i].d1);
        uint64_t numel = (uint64_t)want[i].d0 * (uint64_t)(want[i].d1 ? want[i].d1 : 1);
        assert_int_equal(ti.nbytes, numel * tide_dtype_size(c->dtype));
        int k = tide_checkpoint_find(ck, want[i].name);
        assert_true(k >= 0);
        assert_ptr_equal(ti.data, tide_checkpoint_tensor_data(ck, k));
        assert_string_equal(ti.file, tide_checkpoint_tensor_file(ck, k)->path);
    }
    /* get_index walks the tensors in name order */
    for (int i = 1; i < tide_checkpoint_n_tensors(ck); i++) {
        tide_tensor_info a, b;
        assert_int_equal(tide_checkpoint_get_index(ck, i - 1, &a), TIDE_OK);
        assert_int_equal(tide_checkpoint_get_index(ck, i, &b), TIDE_OK);
        assert_true(strcmp(a.name, b.name) < 0);
    }
    /* data sections start on a 4 KiB boundary */
    for (int i = 0; i < ck->n_files; i++) assert_int_equal(ck->files[i].data_start % 4096, 0);
}

static void check_synthetic(fixture *f, tide_dtype dt, bool tied, uint64_t shard_bytes,
                            int want_files) {
    tide_llama_config c = tiny_config(dt, tied);
    char sub[256];
    snprintf(sub, sizeof sub, "%s/ck_%s_%d_%llu", f->dir, tide_dtype_name(dt), tied,
             (unsigned long long)shard_bytes);
    assert_int_equal(tide_checkpoint_make_synthetic(f->ctx, &c, 7, shard_bytes, sub), TIDE_OK);
    tide_checkpoint *ck = NULL;
    if (tide_checkpoint_open(f->ctx, sub, &ck) != TIDE_OK) fail_msg("%s", tide_ctx_last_error(f->ctx));
    const tide_llama_config *rc = tide_checkpoint_config(ck);
    assert_int_equal(rc->dtype, dt);
    assert_int_equal(rc->tie_word_embeddings, tied);
    assert_int_equal(rc->hidden_size, 64);
    check_layout(ck, &c);
    if (want_files > 0) assert_int_equal(ck->n_files, want_files);
    else assert_true(ck->n_files > 1);
    char p[300];
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", sub);
    assert_int_equal(access(p, F_OK) == 0, ck->n_files > 1);
    tide_checkpoint_free(ck);
}

static void test_synthetic_roundtrip(void **state) {
    fixture *f = *state;
    for (int dt = TIDE_F32; dt <= TIDE_BF16; dt++) {
        check_synthetic(f, (tide_dtype)dt, false, 0, 1);
        check_synthetic(f, (tide_dtype)dt, false, 1 << 30, 1); /* fits: not sharded */
        check_synthetic(f, (tide_dtype)dt, false, 40000, -1);  /* several shards */
        check_synthetic(f, (tide_dtype)dt, true, 0, 1);
        check_synthetic(f, (tide_dtype)dt, true, 1, -1);       /* one tensor per shard */
    }
}

static void test_synthetic_one_tensor_per_shard(void **state) {
    fixture *f = *state;
    tide_llama_config c = tiny_config(TIDE_BF16, false);
    char sub[256];
    snprintf(sub, sizeof sub, "%s/one", f->dir);
    assert_int_equal(tide_checkpoint_make_synthetic(f->ctx, &c, 1, 1, sub), TIDE_OK);
    tide_checkpoint *ck = NULL;
    assert_int_equal(tide_checkpoint_open(f->ctx, sub, &ck), TIDE_OK);
    assert_int_equal(ck->n_files, expected_tensors(&c));
    char name[64];
    snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", expected_tensors(&c),
             expected_tensors(&c));
    /* files are opened in index order: the last shard holds lm_head.weight */
    int k = tide_checkpoint_find(ck, "lm_head.weight");
    assert_true(k >= 0);
    assert_string_equal(tide_checkpoint_tensor_file(ck, k)->name, name);
    tide_checkpoint_free(ck);
}

/* Concatenated bytes of every tensor, in name order. */
static unsigned char *all_bytes(fixture *f, const char *dir, size_t *n) {
    tide_checkpoint *ck = NULL;
    if (tide_checkpoint_open(f->ctx, dir, &ck) != TIDE_OK) fail_msg("%s", tide_ctx_last_error(f->ctx));
    size_t total = 0;
    for (int i = 0; i < tide_checkpoint_n_tensors(ck); i++) {
        tide_tensor_info ti;
        tide_checkpoint_get_index(ck, i, &ti);
        total += ti.nbytes;
    }
    unsigned char *b = malloc(total), *p = b;
    assert_non_null(b);
    for (int i = 0; i < tide_checkpoint_n_tensors(ck); i++) {
        tide_tensor_info ti;
        tide_checkpoint_get_index(ck, i, &ti);
        memcpy(p, ti.data, ti.nbytes);
        p += ti.nbytes;
    }
    tide_checkpoint_free(ck);
    *n = total;
    return b;
}

static unsigned char *file_bytes(const char *path, size_t *n) {
    FILE *fp = fopen(path, "rb");
    assert_non_null(fp);
    fseek(fp, 0, SEEK_END);
    long len = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)len + 1);
    assert_non_null(b);
    assert_int_equal(fread(b, 1, (size_t)len, fp), (size_t)len);
    fclose(fp);
    *n = (size_t)len;
    return b;
}

static void test_synthetic_deterministic(void **state) {
    fixture *f = *state;
    tide_llama_config c = small_config(TIDE_BF16);
    char a[256], b[256], s[256], t1[256];
    snprintf(a, sizeof a, "%s/a", f->dir);
    snprintf(b, sizeof b, "%s/b", f->dir);
    snprintf(s, sizeof s, "%s/s", f->dir);
    snprintf(t1, sizeof t1, "%s/t1", f->dir);
    assert_int_equal(tide_checkpoint_make_synthetic(f->ctx, &c, 1234, 0, a), TIDE_OK);
    assert_int_equal(tide_checkpoint_make_synthetic(f->ctx, &c, 1234, 0, b), TIDE_OK);
    assert_int_equal(tide_checkpoint_make_synthetic(f->ctx, &c, 1234, 300000, s), TIDE_OK);
    tide_ctx_set_threads(f->ctx, 1);
    assert_int_equal(tide_checkpoint_make_synthetic(f->ctx, &c, 1234, 0, t1), TIDE_OK);
    tide_ctx_set_threads(f->ctx, 0);

    /* same seed: identical files */
    char pa[300], pb[300];
    snprintf(pa, sizeof pa, "%s/model.safetensors", a);
    snprintf(pb, sizeof pb, "%s/model.safetensors", b);
    size_t na, nb;
    unsigned char *fa = file_bytes(pa, &na), *fb = file_bytes(pb, &nb);
    assert_int_equal(na, nb);
    assert_memory_equal(fa, fb, na);
    free(fb);
    snprintf(pb, sizeof pb, "%s/model.safetensors", t1); /* one thread */
    fb = file_bytes(pb, &nb);
    assert_int_equal(na, nb);
    assert_memory_equal(fa, fb, na);
    free(fb);
    free(fa);

    /* sharding changes the files, not the tensors */
    size_t n1, n2;
    unsigned char *x = all_bytes(f, a, &n1), *y = all_bytes(f, s, &n2);
    assert_int_equal(n1, n2);
    assert_memory_equal(x, y, n1);
    free(y);

    /* another seed: every tensor differs */
    assert_int_equal(tide_checkpoint_make_synthetic(f->ctx, &c, 1235, 0, b), TIDE_OK);
    tide_checkpoint *ca = NULL, *cb = NULL;
    assert_int_equal(tide_checkpoint_open(f->ctx, a, &ca), TIDE_OK);
    assert_int_equal(tide_checkpoint_open(f->ctx, b, &cb), TIDE_OK);
    assert_int_equal(tide_checkpoint_n_tensors(ca), tide_checkpoint_n_tensors(cb));
    for (int i = 0; i < tide_checkpoint_n_tensors(ca); i++) {
        tide_tensor_info ta, tb;
        tide_checkpoint_get_index(ca, i, &ta);
        tide_checkpoint_get_index(cb, i, &tb);
        assert_string_equal(ta.name, tb.name);
        assert_int_equal(ta.nbytes, tb.nbytes);
        assert_true(memcmp(ta.data, tb.data, ta.nbytes) != 0);
    }
    tide_checkpoint_free(ca);
    tide_checkpoint_free(cb);
    free(x);
}

/* FNV-1a of every tensor's bytes in name order for small_config(TIDE_BF16)
 * and seed 42. */
#ifndef PINNED_DIGEST
#define PINNED_DIGEST 0xf531d4d9b7f94c4cull
#endif

static uint64_t fnv1a(const void *p, size_t n, uint64_t h) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

/* The generator is part of the format: the same seed must give the same
 * bytes on every machine and in every version. This digest pins it; change
 * it only together with a deliberate change of the generator. */
static void test_synthetic_pinned_digest(void **state) {
    fixture *f = *state;
    tide_llama_config c = small_config(TIDE_BF16);
    char a[256];
    snprintf(a, sizeof a, "%s/pin", f->dir);
    assert_int_equal(tide_checkpoint_make_synthetic(f->ctx, &c, 42, 0, a), TIDE_OK);
    size_t n;
    unsigned char *x = all_bytes(f, a, &n);
    uint64_t h = fnv1a(x, n, 1469598103934665603ull);
    free(x);
    print_message("synthetic digest: 0x%016llx\n", (unsigned long long)h);
    assert_int_equal(h, PINNED_DIGEST);
}

/* bf16 and f16 files hold exactly the round-to-nearest-even of the f32 file. */
static void test_synthetic_dtype_rounding(void **state) {
    fixture *f = *state;
    char d32[256], d16[256], dbf[256];
    snprintf(d32, sizeof d32, "%s/f32", f->dir);
    snprintf(d16, sizeof d16, "%s/f16", f->dir);
    snprintf(dbf, sizeof dbf, "%s/bf16", f->dir);
    tide_llama_config c = small_config(TIDE_F32);
    assert_int_equal(tide_checkpoint_make_synthetic(f->ctx, &c, 5, 0, d32), TIDE_OK);
    c.dtype = TIDE_F16;
    assert_int_equal(tide_checkpoint_make_synthetic(f->ctx, &c, 5, 0, d16), TIDE_OK);
    c.dtype = TIDE_BF16;
    assert_int_equal(tide_checkpoint_make_synthetic(f->ctx, &c, 5, 0, dbf), TIDE_OK);
    tide_checkpoint *k32 = NULL, *k16 = NULL, *kbf = NULL;
    assert_int_equal(tide_checkpoint_open(f->ctx, d32, &k32), TIDE_OK);
    assert_int_equal(tide_checkpoint_open(f->ctx, d16, &k16), TIDE_OK);
    assert_int_equal(tide_checkpoint_open(f->ctx, dbf, &kbf), TIDE_OK);
    for (int i = 0; i < tide_checkpoint_n_tensors(k32); i++) {
        tide_tensor_info a, b, h;
        tide_checkpoint_get_index(k32, i, &a);
        tide_checkpoint_get_index(kbf, i, &b);
        tide_checkpoint_get_index(k16, i, &h);
        const float *x = a.data;
        const uint16_t *xb = b.data, *xh = h.data;
        size_t n = a.nbytes / 4;
        bool norm = strstr(a.name, "norm") != NULL;
        double sum = 0, sq = 0;
        for (size_t j = 0; j < n; j++) {
            if (xb[j] != tide_f32_to_bf16(x[j]) || xh[j] != tide_f32_to_f16(x[j]))
                fail_msg("%s[%zu]: f32 %a -> bf16 %04x f16 %04x", a.name, j, (double)x[j], xb[j], xh[j]);
            sum += x[j];
            sq += (double)x[j] * x[j];
        }
        double mean = sum / n, sd = sqrt(sq / n - mean * mean);
        if (norm) {
            assert_true(fabs(mean - 1.0) < 0.005);
            assert_true(sd > 0.004 && sd < 0.015);
        } else {
            assert_true(fabs(mean) < 0.003);
            assert_true(sd > 0.018 && sd < 0.023);
        }
    }
    tide_checkpoint_free(k32);
    tide_checkpoint_free(k16);
    tide_checkpoint_free(kbf);
}

/* Tensors larger than the 16 MiB write chunk, cut at other places in a single
 * file than in one-tensor shards, give the same bytes. */
static void test_synthetic_chunk_boundaries(void **state) {
    fixture *f = *state;
    tide_llama_config c = small_config(TIDE_F32);
    c.vocab_size = 17000; /* 17000 x 256 f32: 17.4 MB embedding and head */
    c.hidden_size = 256;
    c.num_attention_heads = 8;
    c.num_key_value_heads = 8;
    char a[256], b[256];
    snprintf(a, sizeof a, "%s/big1", f->dir);
    snprintf(b, sizeof b, "%s/bigN", f->dir);
    assert_int_equal(tide_checkpoint_make_synthetic(f->ctx, &c, 77, 0, a), TIDE_OK);
    assert_int_equal(tide_checkpoint_make_synthetic(f->ctx, &c, 77, 1, b), TIDE_OK);
    size_t n1, n2;
    unsigned char *x = all_bytes(f, a, &n1), *y = all_bytes(f, b, &n2);
    assert_int_equal(n1, n2);
    assert_true(n1 > (size_t)2 * 16 * 1024 * 1024);
    assert_memory_equal(x, y, n1);
    free(x);
    free(y);
}

static uint64_t progress_done, progress_total;
static int progress_calls;
static void on_progress(void *user, const char *what, uint64_t done, uint64_t total) {
    assert_string_equal(what, "generating");
    assert_true(done >= progress_done && done <= total);
    progress_done = done;
    progress_total = total;
    progress_calls++;
}

static void test_synthetic_progress(void **state) {
    fixture *f = *state;
    tide_llama_config c = tiny_config(TIDE_BF16, false);
    char a[256];
    snprintf(a, sizeof a, "%s/prog", f->dir);
    tide_ctx_set_progress(f->ctx, on_progress, NULL);
    assert_int_equal(tide_checkpoint_make_synthetic(f->ctx, &c, 3, 50000, a), TIDE_OK);
    tide_ctx_set_progress(f->ctx, NULL, NULL);
    assert_true(progress_calls >= 2);
    assert_true(progress_total > 2 * tide_llama_config_params(&c));
    assert_int_equal(progress_done, progress_total);
}

/* Re-generating into a directory replaces a checkpoint of the other layout. */
static void test_synthetic_relayout(void **state) {
    fixture *f = *state;
    tide_llama_config c = tiny_config(TIDE_F16, false);
    char a[256], p[300];
    snprintf(a, sizeof a, "%s/re", f->dir);
    assert_int_equal(tide_checkpoint_make_synthetic(f->ctx, &c, 9, 30000, a), TIDE_OK);
    assert_int_equal(tide_checkpoint_make_synthetic(f->ctx, &c, 9, 60000, a), TIDE_OK);
    tide_checkpoint *ck = NULL;
    assert_int_equal(tide_checkpoint_open(f->ctx, a, &ck), TIDE_OK);
    int nshards = ck->n_files;
    tide_checkpoint_free(ck);
    int files = 0;
    DIR *d = opendir(a);
    struct dirent *de;
    while ((de = readdir(d)) != NULL) files += de->d_name[0] != '.';
    closedir(d);
    assert_int_equal(files, nshards + 2); /* shards, index, config */
    assert_int_equal(tide_checkpoint_make_synthetic(f->ctx, &c, 9, 0, a), TIDE_OK);
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", a);
    assert_int_not_equal(access(p, F_OK), 0);
    files = 0;
    d = opendir(a);
    while ((de = readdir(d)) != NULL) files += de->d_name[0] != '.';
    closedir(d);
    assert_int_equal(files, 2);
    assert_int_equal(tide_checkpoint_open(f->ctx, a, &ck), TIDE_OK);
    assert_int_equal(ck->n_files, 1);
    tide_checkpoint_free(ck);
}

/* A write that fails (here: the file size limit, as a full disk would) gives
 * TIDE_E_IO naming the file and leaves no file behind. */
static void test_synthetic_write_failure(void **state) {
    fixture *f = *state;
    tide_llama_config c = tiny_config(TIDE_F32, false);
    c.vocab_size = 4096; /* 1 MiB embedding table */
    char a[256];
    snprintf(a, sizeof a, "%s/full", f->dir);
    assert_int_equal(mkdir(a, 0755), 0);
    struct rlimit old, lim;
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
    void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
    for (int sharded = 0; sharded < 2; sharded++) {
        lim = old;
        lim.rlim_cur = 256 * 1024;
        assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
        tide_status st = tide_checkpoint_make_synthetic(f->ctx, &c, 1, sharded ? 200000 : 0, a);
        assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
        const char *msg = tide_ctx_last_error(f->ctx);
        if (st != TIDE_E_IO || !strstr(msg, a) || !strstr(msg, ".safetensors") ||
            !strstr(msg, "File too large"))
            fail_msg("status %s: %s", tide_status_str(st), msg);
        DIR *d = opendir(a);
        struct dirent *de;
        while ((de = readdir(d)) != NULL)
            if (de->d_name[0] != '.') fail_msg("left behind: %s", de->d_name);
        closedir(d);
    }
    signal(SIGXFSZ, prev);
    /* and a path that cannot be a directory */
    char bad[300];
    snprintf(bad, sizeof bad, "%s/config.json", f->dir);
    write_bytes(bad, "x", 1);
    snprintf(bad, sizeof bad, "%s/config.json/sub", f->dir);
    assert_int_equal(tide_checkpoint_make_synthetic(f->ctx, &c, 1, 0, bad), TIDE_E_IO);
    assert_non_null(strstr(tide_ctx_last_error(f->ctx), bad));
    /* and an invalid config */
    c.num_key_value_heads = 3;
    assert_int_equal(tide_checkpoint_make_synthetic(f->ctx, &c, 1, 0, a), TIDE_E_INVALID);
    assert_non_null(strstr(tide_ctx_last_error(f->ctx), "num_key_value_heads"));
}

static void test_get_missing(void **state) {
    fixture *f = *state;
    tide_llama_config c = tiny_config(TIDE_BF16, true);
    char a[256];
    snprintf(a, sizeof a, "%s/g", f->dir);
    assert_int_equal(tide_checkpoint_make_synthetic(f->ctx, &c, 1, 0, a), TIDE_OK);
    tide_checkpoint *ck = NULL;
    assert_int_equal(tide_checkpoint_open(f->ctx, a, &ck), TIDE_OK);
    tide_tensor_info ti;
    assert_int_equal(tide_checkpoint_get(ck, "lm_head.weight", &ti), TIDE_E_NOT_FOUND);
    assert_non_null(strstr(tide_ctx_last_error(f->ctx), "lm_head.weight"));
    assert_int_equal(tide_checkpoint_get_index(ck, -1, &ti), TIDE_E_NOT_FOUND);
    assert_int_equal(tide_checkpoint_get_index(ck, tide_checkpoint_n_tensors(ck), &ti),
                     TIDE_E_NOT_FOUND);
    tide_checkpoint_free(ck);
    tide_checkpoint_free(NULL);
}

/* Every allocation of open and make_synthetic failing in turn: TIDE_E_NOMEM,
 * nothing leaked, no crash. */
static void test_alloc_failures(void **state) {
    fixture *f = *state;
    tide_llama_config c = tiny_config(TIDE_BF16, false);
    char a[256];
    snprintf(a, sizeof a, "%s/oom", f->dir);
    int64_t base = tide_alloc_live_bytes();
    int failures = 0;
    for (long n = 1;; n++) {
        tide_alloc_fail_nth(n);
        tide_status st = tide_checkpoint_make_synthetic(f->ctx, &c, 1, 30000, a);
        tide_alloc_fail_nth(0);
        assert_int_equal(tide_alloc_live_bytes(), base);
        if (st == TIDE_OK) break;
        if (st != TIDE_E_NOMEM) fail_msg("allocation %ld: %s: %s", n, tide_status_str(st),
                                         tide_ctx_last_error(f->ctx));
        failures++;
    }
    assert_true(failures > 3);
    failures = 0;
    for (long n = 1;; n++) {
        tide_checkpoint *ck = NULL;
        tide_alloc_fail_nth(n);
        tide_status st = tide_checkpoint_open(f->ctx, a, &ck);
        tide_alloc_fail_nth(0);
        if (st == TIDE_OK) {
            assert_int_equal(tide_checkpoint_n_tensors(ck), expected_tensors(&c));
            tide_checkpoint_free(ck);
            assert_int_equal(tide_alloc_live_bytes(), base);
            break;
        }
        assert_int_equal(tide_alloc_live_bytes(), base);
        assert_null(ck);
        if (st != TIDE_E_NOMEM) fail_msg("allocation %ld: %s: %s", n, tide_status_str(st),
                                         tide_ctx_last_error(f->ctx));
        failures++;
    }
    assert_true(failures > 3);
}

/* ---------------------------------------------------------------- match */

static tide_checkpoint *open_crafted(fixture *f, bool tied, const char *header, size_t data) {
    write_config(f, tied);
    write_st(f, "model.safetensors", header, data);
    tide_checkpoint *ck = NULL;
    if (tide_checkpoint_open(f->ctx, f->dir, &ck) != TIDE_OK) fail_msg("%s", tide_ctx_last_error(f->ctx));
    return ck;
}

static void add_t(tide_graph *g, const char *name, tide_dtype dt, tide_role role, int64_t d0,
                  int64_t d1) {
    int64_t shape[2] = {d0, d1};
    int id;
    assert_int_equal(tide_graph_add_tensor(g, name, dt, role, d1 ? 2 : 1, shape, &id), TIDE_OK);
}

static void expect_match(fixture *f, tide_checkpoint *ck, tide_graph *g, tide_status want,
                         const char *n1, const char *n2) {
    tide_status st = tide_checkpoint_match(ck, g);
    const char *msg = tide_ctx_last_error(f->ctx);
    if (st != want || (n1 && !strstr(msg, n1)) || (n2 && !strstr(msg, n2)))
        fail_msg("match: %s: %s (wanted %s '%s' '%s')", tide_status_str(st), msg,
                 tide_status_str(want), n1 ? n1 : "", n2 ? n2 : "");
}

#define MH                                                                                    \
    "{\"w.x\": {\"dtype\": \"BF16\", \"shape\": [2, 4], \"data_offsets\": [0, 16]}, "        \
    "\"w.n\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [16, 32]}, "            \
    "\"model.layers.0.self_attn.rotary_emb.inv_freq\": {\"dtype\": \"F32\", \"shape\": [2], " \
    "\"data_offsets\": [32, 40]}}"

static void test_match_handmade(void **state) {
    fixture *f = *state;
    tide_checkpoint *ck = open_crafted(f, false, MH, 40);
    tide_graph *g = tide_graph_new(f->ctx);
    add_t(g, "w.x", TIDE_BF16, TIDE_ROLE_WEIGHT, 2, 4);
    add_t(g, "w.n", TIDE_F32, TIDE_ROLE_WEIGHT, 4, 0);
    add_t(g, "act", TIDE_F32, TIDE_ROLE_TEMP, 4, 4);
    expect_match(f, ck, g, TIDE_OK, NULL, NULL); /* inv_freq ignored */
    tide_graph_free(g);

    /* a weight the checkpoint lacks */
    g = tide_graph_new(f->ctx);
    add_t(g, "w.x", TIDE_BF16, TIDE_ROLE_WEIGHT, 2, 4);
    add_t(g, "w.n", TIDE_F32, TIDE_ROLE_WEIGHT, 4, 0);
    add_t(g, "w.more", TIDE_F32, TIDE_ROLE_WEIGHT, 4, 0);
    expect_match(f, ck, g, TIDE_E_FORMAT, "'w.more'", "missing");
    tide_graph_free(g);

    /* wrong dtype */
    g = tide_graph_new(f->ctx);
    add_t(g, "w.x", TIDE_F16, TIDE_ROLE_WEIGHT, 2, 4);
    add_t(g, "w.n", TIDE_F32, TIDE_ROLE_WEIGHT, 4, 0);
    expect_match(f, ck, g, TIDE_E_FORMAT, "'w.x'", "expected f16 (2, 4), found bf16 (2, 4)");
    tide_graph_free(g);

    /* wrong shape */
    g = tide_graph_new(f->ctx);
    add_t(g, "w.x", TIDE_BF16, TIDE_ROLE_WEIGHT, 4, 2);
    add_t(g, "w.n", TIDE_F32, TIDE_ROLE_WEIGHT, 4, 0);
    expect_match(f, ck, g, TIDE_E_FORMAT, "'w.x'", "expected bf16 (4, 2), found bf16 (2, 4)");
    tide_graph_free(g);
    g = tide_graph_new(f->ctx);
    add_t(g, "w.x", TIDE_BF16, TIDE_ROLE_WEIGHT, 8, 0);
    add_t(g, "w.n", TIDE_F32, TIDE_ROLE_WEIGHT, 4, 0);
    expect_match(f, ck, g, TIDE_E_FORMAT, "'w.x'", "expected bf16 (8), found bf16 (2, 4)");
    tide_graph_free(g);

    /* a checkpoint tensor the graph does not use, or uses as a non-weight */
    g = tide_graph_new(f->ctx);
    add_t(g, "w.x", TIDE_BF16, TIDE_ROLE_WEIGHT, 2, 4);
    expect_match(f, ck, g, TIDE_E_FORMAT, "extra tensor 'w.n'", "model.safetensors");
    tide_graph_free(g);
    g = tide_graph_new(f->ctx);
    add_t(g, "w.x", TIDE_BF16, TIDE_ROLE_WEIGHT, 2, 4);
    add_t(g, "w.n", TIDE_F32, TIDE_ROLE_STATE, 4, 0);
    expect_match(f, ck, g, TIDE_E_FORMAT, "extra tensor 'w.n'", NULL);
    tide_graph_free(g);
    tide_checkpoint_free(ck);
}

#define TH                                                                               \
    "{\"model.embed_tokens.weight\": {\"dtype\": \"F32\", \"shape\": [4, 2], "          \
    "\"data_offsets\": [0, 32]}}"
#define TH_HEAD                                                                          \
    "{\"model.embed_tokens.weight\": {\"dtype\": \"F32\", \"shape\": [4, 2], "          \
    "\"data_offsets\": [0, 32]}, \"lm_head.weight\": {\"dtype\": \"F32\", \"shape\": " \
    "[4, 2], \"data_offsets\": [32, 64]}}"

static void test_match_tied(void **state) {
    fixture *f = *state;
    tide_graph *with_head = tide_graph_new(f->ctx), *without = tide_graph_new(f->ctx);
    add_t(with_head, "model.embed_tokens.weight", TIDE_F32, TIDE_ROLE_WEIGHT, 4, 2);
    add_t(with_head, "lm_head.weight", TIDE_F32, TIDE_ROLE_WEIGHT, 4, 2);
    add_t(without, "model.embed_tokens.weight", TIDE_F32, TIDE_ROLE_WEIGHT, 4, 2);

    /* tied, no head in the file: fine whether or not the graph names one */
    tide_checkpoint *ck = open_crafted(f, true, TH, 32);
    expect_match(f, ck, with_head, TIDE_OK, NULL, NULL);
    expect_match(f, ck, without, TIDE_OK, NULL, NULL);
    tide_checkpoint_free(ck);
    /* tied with a (redundant) head in the file: tolerated */
    ck = open_crafted(f, true, TH_HEAD, 64);
    expect_match(f, ck, without, TIDE_OK, NULL, NULL);
    expect_match(f, ck, with_head, TIDE_OK, NULL, NULL);
    tide_checkpoint_free(ck);
    /* untied: the head must be there, and is extra if the graph does not use it */
    ck = open_crafted(f, false, TH, 32);
    expect_match(f, ck, with_head, TIDE_E_FORMAT, "'lm_head.weight'", "missing");
    tide_checkpoint_free(ck);
    ck = open_crafted(f, false, TH_HEAD, 64);
    expect_match(f, ck, without, TIDE_E_FORMAT, "extra tensor 'lm_head.weight'", NULL);
    tide_checkpoint_free(ck);
    tide_graph_free(with_head);
    tide_graph_free(without);
}

/* Needs tide_llama_build (src/model/llama.c). */
static void test_match_llama_graph(void **state) {
    fixture *f = *state;
    tide_llama_graph_opts o = {.batch = 1, .seq = 4, .ctx_len = 8, .all_logits = false};
    for (int tied = 0; tied < 2; tied++) {
        for (int dt = TIDE_F32; dt <= TIDE_BF16; dt++) {
            tide_llama_config c = tiny_config((tide_dtype)dt, tied);
            char a[256];
            snprintf(a, sizeof a, "%s/llama_%d_%d", f->dir, tied, dt);
            assert_int_equal(tide_checkpoint_make_synthetic(f->ctx, &c, 11, tied ? 50000 : 0, a),
                             TIDE_OK);
            tide_checkpoint *ck = NULL;
            assert_int_equal(tide_checkpoint_open(f->ctx, a, &ck), TIDE_OK);
            tide_graph *g = NULL;
            assert_int_equal(tide_llama_build(f->ctx, tide_checkpoint_config(ck), &o, &g), TIDE_OK);
            expect_match(f, ck, g, TIDE_OK, NULL, NULL);
            tide_graph_free(g);

            /* a graph for another shape or dtype does not match */
            tide_llama_config other = *tide_checkpoint_config(ck);
            other.intermediate_size = 192;
            assert_int_equal(tide_llama_build(f->ctx, &other, &o, &g), TIDE_OK);
            expect_match(f, ck, g, TIDE_E_FORMAT, "mlp", "expected");
            tide_graph_free(g);
            other = *tide_checkpoint_config(ck);
            other.dtype = dt == TIDE_BF16 ? TIDE_F16 : TIDE_BF16;
            assert_int_equal(tide_llama_build(f->ctx, &other, &o, &g), TIDE_OK);
            expect_match(f, ck, g, TIDE_E_FORMAT, "expected", "found");
            tide_graph_free(g);
            other = *tide_checkpoint_config(ck);
            other.num_hidden_layers = 1; /* layer 1 is extra */
            assert_int_equal(tide_llama_build(f->ctx, &other, &o, &g), TIDE_OK);
            expect_match(f, ck, g, TIDE_E_FORMAT, "extra tensor 'model.layers.1.", NULL);
            tide_graph_free(g);
            tide_checkpoint_free(ck);
        }
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_truncated_file, setup, teardown),
        cmocka_unit_test_setup_teardown(test_header_past_end, setup, teardown),
        cmocka_unit_test_setup_teardown(test_header_not_json, setup, teardown),
        cmocka_unit_test_setup_teardown(test_header_not_object, setup, teardown),
        cmocka_unit_test_setup_teardown(test_header_trailing_garbage, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unknown_dtype, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_shape, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_data_offsets, setup, teardown),
        cmocka_unit_test_setup_teardown(test_begin_after_end, setup, teardown),
        cmocka_unit_test_setup_teardown(test_end_past_data, setup, teardown),
        cmocka_unit_test_setup_teardown(test_byte_size_mismatch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_overlap, setup, teardown),
        cmocka_unit_test_setup_teardown(test_misaligned, setup, teardown),
        cmocka_unit_test_setup_teardown(test_duplicate_in_file, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_metadata, setup, teardown),
        cmocka_unit_test_setup_teardown(test_missing_pieces, setup, teardown),
        cmocka_unit_test_setup_teardown(test_index_ok, setup, teardown),
        cmocka_unit_test_setup_teardown(test_index_malformed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_index_missing_shard, setup, teardown),
        cmocka_unit_test_setup_teardown(test_index_tensor_absent_from_shard, setup, teardown),
        cmocka_unit_test_setup_teardown(test_shard_tensor_not_in_index, setup, teardown),
        cmocka_unit_test_setup_teardown(test_duplicate_across_shards, setup, teardown),
        cmocka_unit_test_setup_teardown(test_synthetic_roundtrip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_synthetic_one_tensor_per_shard, setup, teardown),
        cmocka_unit_test_setup_teardown(test_synthetic_deterministic, setup, teardown),
        cmocka_unit_test_setup_teardown(test_synthetic_pinned_digest, setup, teardown),
        cmocka_unit_test_setup_teardown(test_synthetic_dtype_rounding, setup, teardown),
        cmocka_unit_test_setup_teardown(test_synthetic_chunk_boundaries, setup, teardown),
        cmocka_unit_test_setup_teardown(test_synthetic_progress, setup, teardown),
        cmocka_unit_test_setup_teardown(test_synthetic_relayout, setup, teardown),
        cmocka_unit_test_setup_teardown(test_synthetic_write_failure, setup, teardown),
        cmocka_unit_test_setup_teardown(test_get_missing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_alloc_failures, setup, teardown),
        cmocka_unit_test_setup_teardown(test_match_handmade, setup, teardown),
        cmocka_unit_test_setup_teardown(test_match_tied, setup, teardown),
        cmocka_unit_test_setup_teardown(test_match_llama_graph, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
