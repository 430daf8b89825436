/*
 * test_train_io.c - training data and checkpoint files: the window formula
 * on a file whose ids are their own positions (first and last windows,
 * wrap-around, steps past 2^40), shuffled windows (determinism, range,
 * spread), every kind of bad token file with its status and message, .npy
 * variants, the synthetic corpus; the safetensors writer; training
 * checkpoints saved and read back (by tide_checkpoint_open and by resume,
 * bit-exact), replaced atomically, and left as they were when a save fails
 * (a failing fill, a file size limit, refused destinations, every allocation).
 *
 * What it proves: token files (u16, u32, every `.npy` integer kind; odd size,
 * too short, ids out of range, malformed headers named), batch windows and
 * shuffled starts, the synthetic corpus; the safetensors writer; checkpoints
 * saved and reloaded bit for bit; a failing fill, a file-size limit and every
 * allocation failing leave the earlier checkpoint whole and no temporary
 * behind.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/alloc_test.h"
#include "core/core.h"
#include "train/data.h"
#include "train/save.h"

typedef struct fixture {
    tide_ctx *ctx;
    char dir[64];
    char path[128];
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
    snprintf(f->dir, sizeof f->dir, "/tmp/tide_tio_XXXXXX");
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

/* f->dir/name, in f->path. */
static const char *P(fixture *f, const char *name) {
    snprintf(f->path, sizeof f->path, "%s/%s", f->dir, name);
    return f->path;
}

static void write_bytes(const char *path, const void *data, size_t n) {
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    if (n) assert_int_equal(fwrite(data, 1, n, fp), n);
    assert_int_equal(fclose(fp), 0);
}

static void expect_error(fixture *f, tide_status got, tide_status want, const char *part1, const char *part2) {
    const char *msg = tide_ctx_last_error(f->ctx);
    if (got != want || (part1 && !strstr(msg, part1)) || (part2 && !strstr(msg, part2)))
        fail_msg("status %d (want %d), message '%s' (want '%s', '%s')", got, want, msg, part1 ? part1 : "",
                 part2 ? part2 : "");
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

/* A raw u16 file of n ids, id i = i % vocab. */
static void write_u16_seq(const char *path, int64_t n, int64_t vocab) {
    uint16_t *v = malloc((size_t)n * 2);
    assert_non_null(v);
    for (int64_t i = 0; i < n; i++) v[i] = (uint16_t)(i % vocab);
    write_bytes(path, v, (size_t)n * 2);
    free(v);
}

/* A .npy file (format 1.0, or 2.0) with header dict `dict` and data. */
static void write_npy(const char *path, int major, const char *dict, const void *data, size_t n) {
    size_t pre = major == 1 ? 10 : 12, dl = strlen(dict), total = (pre + dl + 1 + 63) / 64 * 64;
    unsigned char *b = calloc(1, total + n);
    assert_non_null(b);
    memcpy(b, "\x93NUMPY", 6);
    b[6] = (unsigned char)major;
    size_t hl = total - pre;
    for (size_t i = 0; i < pre - 8; i++) b[8 + i] = (unsigned char)(hl >> (8 * i));
    memcpy(b + pre, dict, dl);
    memset(b + pre + dl, ' ', total - pre - dl - 1);
    b[total - 1] = '\n';
    if (n) memcpy(b + total, data, n);
    write_bytes(path, b, total + n);
    free(b);
}

/* ---------------------------------------------------------------- windows */

static uint64_t ref_start(int64_t n, const tide_batch_spec *s, int64_t step, int m, int b) {
    unsigned __int128 g = ((unsigned __int128)step * s->accum + m) * s->batch + b;
    return (uint64_t)((g * (unsigned __int128)s->seq) % (unsigned __int128)(n - s->seq - 1));
}

static void test_window_formula(void **state) {
    fixture *f = *state;
    const int64_t N = 1000, T = 8;
    write_u16_seq(P(f, "seq.bin"), N, 65536);
    tide_tokens *tk;
    assert_int_equal(tide_tokens_open(f->ctx, f->path, TIDE_TOKENS_AUTO, 65536, T, &tk), TIDE_OK);
    assert_int_equal(tide_tokens_count(tk), N);
    assert_string_equal(tide_tokens_dtype_name(tk), "u16");
    tide_batch_spec s = {.batch = 2, .seq = (int)T, .accum = 3};
    int32_t in[2 * 8], tg[2 * 8];

    /* The first windows: rows walk the file T tokens apart. */
    assert_int_equal(tide_tokens_batch(tk, &s, 0, 0, in, tg), TIDE_OK);
    for (int t = 0; t < T; t++) {
        assert_int_equal(in[t], t);
        assert_int_equal(tg[t], t + 1);
        assert_int_equal(in[T + t], T + t);
        assert_int_equal(tg[T + t], T + t + 1);
    }
    assert_int_equal(tide_tokens_window(tk, &s, 0, 2, 1), ((0 * 3 + 2) * 2 + 1) * T);
    assert_int_equal(tide_tokens_window(tk, &s, 1, 0, 0), 6 * T);

    /* Wrap-around: W = N - T - 1 starts, the last one W - 1 reads ids up to N - 2. */
    const int64_t W = N - T - 1;
    int64_t g_last = -1;
    for (int64_t g = 0; g < W && g_last < 0; g++)
        if (g * T % W == W - 1) g_last = g;
    assert_true(g_last > 0);
    int64_t step = g_last / 6, m = g_last % 6 / 2, b = g_last % 2;
    assert_int_equal(tide_tokens_window(tk, &s, step, (int)m, (int)b), W - 1);
    assert_int_equal(tide_tokens_batch(tk, &s, step, (int)m, in, tg), TIDE_OK);
    assert_int_equal(in[b * T], W - 1);
    assert_int_equal(tg[b * T + T - 1], N - 2);
    /* The row after it wraps to a small start. */
    int64_t g = g_last + 1;
    assert_int_equal(tide_tokens_window(tk, &s, g / 6, (int)(g % 6 / 2), (int)(g % 2)), (g * T) % W);
    assert_true((g * T) % W < T);
    for (int64_t k = 0; k < 5000; k++) {
        int64_t st = k * 7919 % 100000;
        assert_int_equal(tide_tokens_window(tk, &s, st, (int)(k % 3), (int)(k % 2)),
                         (int64_t)ref_start(N, &s, st, (int)(k % 3), (int)(k % 2)));
    }

    /* Steps past 2^40 with a large batch: the product passes 2^64. */
    tide_tokens_free(tk);
    write_u16_seq(P(f, "big.bin"), 20000, 65536);
    assert_int_equal(tide_tokens_open(f->ctx, f->path, TIDE_TOKENS_U16, 65536, 8192, &tk), TIDE_OK);
    tide_batch_spec big = {.batch = 64, .seq = 8192, .accum = 64};
    for (int64_t st = (int64_t)1 << 40; st < ((int64_t)1 << 40) + 50; st++)
        assert_int_equal(tide_tokens_window(tk, &big, st, 63, 63), (int64_t)ref_start(20000, &big, st, 63, 63));
    int64_t huge = INT64_MAX / 3;
    int64_t w = tide_tokens_window(tk, &big, huge, 5, 7);
    assert_int_equal(w, (int64_t)ref_start(20000, &big, huge, 5, 7));

    /* Bad arguments. */
    assert_int_equal(tide_tokens_window(tk, &big, 0, 64, 0), -1);
    assert_int_equal(tide_tokens_window(tk, &big, -1, 0, 0), -1);
    assert_int_equal(tide_tokens_window(tk, &big, 0, 0, 64), -1);
    int32_t one[1];
    expect_error(f, tide_tokens_batch(tk, &big, 0, 64, one, one), TIDE_E_INVALID, "big.bin", "micro-batch");
    tide_batch_spec longer = {.batch = 1, .seq = 19999, .accum = 1};
    expect_error(f, tide_tokens_batch(tk, &longer, 0, 0, one, one), TIDE_E_INVALID, "big.bin", "shorter");
    tide_tokens_free(tk);
    tide_tokens_free(NULL);
}

static void test_shuffle(void **state) {
    fixture *f = *state;
    const int64_t N = 12, T = 6; /* W = 5 starts */
    write_u16_seq(P(f, "small.bin"), N, 100);
    tide_tokens *tk;
    assert_int_equal(tide_tokens_open(f->ctx, f->path, TIDE_TOKENS_AUTO, 100, T, &tk), TIDE_OK);
    tide_batch_spec s = {.batch = 4, .seq = (int)T, .accum = 2, .shuffle = true, .seed = 1234};
    int hist[5] = {0};
    for (int64_t st = 0; st < 250; st++)
        for (int m = 0; m < 2; m++)
            for (int b = 0; b < 4; b++) {
                int64_t w = tide_tokens_window(tk, &s, st, m, b);
                assert_true(w >= 0 && w < 5);
                hist[w]++;
                assert_int_equal(w, tide_tokens_window(tk, &s, st, m, b)); /* a pure function */
            }
    for (int i = 0; i < 5; i++) assert_true(hist[i] > 300 && hist[i] < 500); /* 2000 draws, 400 expected */

    /* The batch reads the drawn windows; seeds differ; a big file stays in range. */
    int32_t in[4 * 6], tg[4 * 6];
    assert_int_equal(tide_tokens_batch(tk, &s, 77, 1, in, tg), TIDE_OK);
    for (int b = 0; b < 4; b++) {
        int64_t w = tide_tokens_window(tk, &s, 77, 1, b);
        for (int t = 0; t < T; t++) {
            assert_int_equal(in[b * T + t], w + t);
            assert_int_equal(tg[b * T + t], w + t + 1);
        }
    }
    tide_tokens_free(tk);
    write_u16_seq(P(f, "mid.bin"), 100003, 65536);
    assert_int_equal(tide_tokens_open(f->ctx, f->path, TIDE_TOKENS_AUTO, 65536, 16, &tk), TIDE_OK);
    tide_batch_spec a = {.batch = 8, .seq = 16, .accum = 1, .shuffle = true, .seed = 1};
    tide_batch_spec b2 = a;
    b2.seed = 2;
    int same = 0;
    int64_t W = 100003 - 17, lo = W, hi = -1;
    for (int64_t st = 0; st < 200; st++)
        for (int b = 0; b < 8; b++) {
            int64_t x = tide_tokens_window(tk, &a, st, 0, b), y = tide_tokens_window(tk, &b2, st, 0, b);
            assert_true(x >= 0 && x < W);
            same += x == y;
            lo = x < lo ? x : lo;
            hi = x > hi ? x : hi;
        }
    assert_true(same < 5);
    assert_true(lo < W / 50 && hi > W - W / 50);
    /* Far steps: no overflow, still in range. */
    assert_true(tide_tokens_window(tk, &a, (int64_t)1 << 40, 0, 7) < W);
    assert_true(tide_tokens_window(tk, &a, INT64_MAX, 0, 7) >= 0);
    tide_tokens_free(tk);
}

/* ---------------------------------------------------------------- bad data */

static void test_bad_files(void **state) {
    fixture *f = *state;
    tide_tokens *tk = (tide_tokens *)1;
    expect_error(f, tide_tokens_open(f->ctx, P(f, "none.bin"), TIDE_TOKENS_AUTO, 100, 4, &tk), TIDE_E_NOT_FOUND,
                 "none.bin", "No such file");
    assert_null(tk);
    expect_error(f, tide_tokens_open(f->ctx, f->dir, TIDE_TOKENS_AUTO, 100, 4, &tk), TIDE_E_IO, f->dir,
                 "not a regular file");

    unsigned char bytes[64] = {0};
    write_bytes(P(f, "odd.bin"), bytes, 21);
    expect_error(f, tide_tokens_open(f->ctx, f->path, TIDE_TOKENS_U16, 100, 4, &tk), TIDE_E_FORMAT, "odd.bin",
                 "odd size for u16");
    write_bytes(P(f, "odd32.bin"), bytes, 22);
    expect_error(f, tide_tokens_open(f->ctx, f->path, TIDE_TOKENS_U32, 100, 4, &tk), TIDE_E_FORMAT, "odd32.bin",
                 "odd size for u32");
    write_bytes(P(f, "empty.bin"), bytes, 0);
    expect_error(f, tide_tokens_open(f->ctx, f->path, TIDE_TOKENS_U16, 100, 4, &tk), TIDE_E_FORMAT, "empty.bin",
                 "too short for one window");
    write_bytes(P(f, "short.bin"), bytes, 10); /* 5 ids < seq 4 + 2 */
    expect_error(f, tide_tokens_open(f->ctx, f->path, TIDE_TOKENS_U16, 100, 4, &tk), TIDE_E_FORMAT, "short.bin",
                 "5 tokens");
    assert_int_equal(tide_ctx_last_status(f->ctx), TIDE_E_FORMAT);
    write_bytes(P(f, "ok.bin"), bytes, 12); /* exactly seq + 2 */
    assert_int_equal(tide_tokens_open(f->ctx, f->path, TIDE_TOKENS_U16, 100, 4, &tk), TIDE_OK);
    tide_tokens_free(tk);

    /* An id >= vocab deep in a file of several scan chunks: the first one is named. */
    int64_t n = 3 << 20;
    uint16_t *v = calloc((size_t)n, 2);
    assert_non_null(v);
    v[2500001] = 1000;
    v[2600000] = 5000;
    v[n - 1] = 60000;
    write_bytes(P(f, "range.bin"), v, (size_t)n * 2);
    free(v);
    expect_error(f, tide_tokens_open(f->ctx, f->path, TIDE_TOKENS_U16, 1000, 64, &tk), TIDE_E_RANGE, "range.bin",
                 "token 1000 at index 2500001");
    assert_non_null(strstr(tide_ctx_last_error(f->ctx), "[0, 1000)"));
    assert_int_equal(tide_tokens_open(f->ctx, f->path, TIDE_TOKENS_U16, 60001, 64, &tk), TIDE_OK);
    assert_int_equal(tide_tokens_at(tk, n - 1), 60000);
    tide_tokens_free(tk);
    uint32_t w32[8] = {1, 2, 3, 4, 5, 6, 7, 70000};
    write_bytes(P(f, "r32.bin"), w32, sizeof w32);
    expect_error(f, tide_tokens_open(f->ctx, f->path, TIDE_TOKENS_U32, 65536, 4, &tk), TIDE_E_RANGE, "r32.bin",
                 "token 70000 at index 7");

    /* Bad arguments. */
    expect_error(f, tide_tokens_open(f->ctx, f->path, TIDE_TOKENS_U32, 0, 4, &tk), TIDE_E_INVALID, "vocab", NULL);
    expect_error(f, tide_tokens_open(f->ctx, f->path, TIDE_TOKENS_U32, 10, 0, &tk), TIDE_E_INVALID, "sequence", NULL);
    expect_error(f, tide_tokens_open(f->ctx, NULL, TIDE_TOKENS_U32, 10, 4, &tk), TIDE_E_INVALID, "no path", NULL);
    assert_int_equal(tide_tokens_open(f->ctx, f->path, TIDE_TOKENS_U32, 10, 4, NULL), TIDE_E_INVALID);
}

static void test_npy(void **state) {
    fixture *f = *state;
    tide_tokens *tk;
    /* Every integer dtype; the header's dtype wins over the one asked for. */
    static const struct {
        const char *descr;
        int size;
        bool sign;
    } kinds[] = {{"<u2", 2, 0}, {"<u4", 4, 0}, {"<i4", 4, 1}, {"<i8", 8, 1}, {"<u8", 8, 0},
                 {"<i2", 2, 1}, {"|u1", 1, 0}, {"|i1", 1, 1}, {"=u2", 2, 0}, {">u1", 1, 0}};
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        unsigned char data[20 * 8];
        for (int i = 0; i < 20; i++) {
            uint64_t x = (uint64_t)(i * 5 + 1);
            memcpy(data + i * kinds[k].size, &x, (size_t)kinds[k].size);
        }
        char dict[128];
        snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (20,), }", kinds[k].descr);
        write_npy(P(f, "a.npy"), k % 2 ? 2 : 1, dict, data, (size_t)(20 * kinds[k].size));
        assert_int_equal(tide_tokens_open(f->ctx, f->path, TIDE_TOKENS_U32, 100, 8, &tk), TIDE_OK);
        assert_int_equal(tide_tokens_count(tk), 20);
        assert_string_equal(tide_tokens_dtype_name(tk), kinds[k].descr);
        for (int i = 0; i < 20; i++) assert_int_equal(tide_tokens_at(tk, i), i * 5 + 1);
        tide_batch_spec s = {.batch = 1, .seq = 8, .accum = 1};
        int32_t in[8], tg[8];
        assert_int_equal(tide_tokens_batch(tk, &s, 1, 0, in, tg), TIDE_OK);
        assert_int_equal(in[0], 8 * 5 + 1);
        assert_int_equal(tg[7], 16 * 5 + 1);
        tide_tokens_free(tk);
        if (kinds[k].sign && kinds[k].size > 1) {
            int64_t neg = -3;
            memcpy(data + 13 * kinds[k].size, &neg, (size_t)kinds[k].size);
            write_npy(P(f, "neg.npy"), 1, dict, data, (size_t)(20 * kinds[k].size));
            expect_error(f, tide_tokens_open(f->ctx, f->path, TIDE_TOKENS_AUTO, 100, 8, &tk), TIDE_E_RANGE, "neg.npy",
                         "token -3 at index 13");
        }
    }
    /* Magic without the suffix: read as .npy; a u64 id past INT64_MAX printed unsigned. */
    uint64_t big[10] = {0, 1, 2, 3, 4, 5, 6, 7, 8, UINT64_MAX};
    write_npy(P(f, "data.bin"), 1, "{'descr':'<u8','fortran_order':False,'shape':(10,)}", big, sizeof big);
    expect_error(f, tide_tokens_open(f->ctx, f->path, TIDE_TOKENS_U16, 100, 4, &tk), TIDE_E_RANGE,
                 "token 18446744073709551615 at index 9", NULL);
    uint16_t ids[10] = {0};
    /* fortran_order True is the same bytes for 1-D. */
    write_npy(P(f, "f.npy"), 1, "{\"descr\": \"<u2\", \"fortran_order\": True, \"shape\": (10,)}", ids, sizeof ids);
    assert_int_equal(tide_tokens_open(f->ctx, f->path, TIDE_TOKENS_AUTO, 100, 4, &tk), TIDE_OK);
    tide_tokens_free(tk);

    /* Malformed and unsupported headers. */
    static const struct {
        const char *dict;
        tide_status st;
        const char *msg;
    } bad[] = {
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (10,), }", TIDE_E_UNSUPPORTED, "'<f4' is not an integer"},
        {"{'descr': '>u2', 'fortran_order': False, 'shape': (10,), }", TIDE_E_UNSUPPORTED, "big-endian"},
        {"{'descr': '<u2', 'fortran_order': False, 'shape': (5, 2), }", TIDE_E_UNSUPPORTED, "2 dimensions"},
        {"{'descr': '<u2', 'fortran_order': False, 'shape': (), }", TIDE_E_UNSUPPORTED, "0 dimensions"},
        {"{'descr': '<u2', 'fortran_order': False, 'shape': (11,), }", TIDE_E_FORMAT, "says 11 ids"},
        {"{'descr': '<u2', 'fortran_order': False, 'shape': (9,), }", TIDE_E_FORMAT, "20 bytes of data"},
        {"{'descr': '<u2', 'shape': (10,), }", TIDE_E_FORMAT, "lacks 'fortran_order'"},
        {"{'descr': '<u2', 'fortran_order': False, 'shape': (10,), 'x': 1}", TIDE_E_FORMAT, "unexpected key 'x'"},
        {"{'descr': 'u', 'fortran_order': False, 'shape': (10,), }", TIDE_E_FORMAT, "dtype 'u' cannot be read"},
        {"{'descr': '<u2', 'fortran_order': Maybe, 'shape': (10,), }", TIDE_E_FORMAT, "not a dict"},
        {"['descr']", TIDE_E_FORMAT, "not a dict"},
        {"{'descr': '<u2', 'fortran_order': False, 'shape': (10,)} junk", TIDE_E_FORMAT, "not a dict"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        write_npy(P(f, "bad.npy"), 1, bad[k].dict, ids, sizeof ids);
        expect_error(f, tide_tokens_open(f->ctx, f->path, TIDE_TOKENS_AUTO, 100, 4, &tk), bad[k].st, "bad.npy",
                     bad[k].msg);
        assert_null(tk);
    }
    write_bytes(P(f, "raw.npy"), ids, sizeof ids);
    expect_error(f, tide_tokens_open(f->ctx, f->path, TIDE_TOKENS_AUTO, 100, 4, &tk), TIDE_E_FORMAT, "raw.npy",
                 "no NumPy magic");
    write_bytes(P(f, "cut.npy"), "\x93NUMPY\x01\x00\xff\x00{'descr'", 17);
    expect_error(f, tide_tokens_open(f->ctx, f->path, TIDE_TOKENS_AUTO, 100, 4, &tk), TIDE_E_FORMAT, "cut.npy",
                 "runs past the end");
    write_bytes(P(f, "ver.npy"), "\x93NUMPY\x07\x00\x00\x00", 10);
    expect_error(f, tide_tokens_open(f->ctx, f->path, TIDE_TOKENS_AUTO, 100, 4, &tk), TIDE_E_FORMAT, "ver.npy",
                 "version 7.0");
}

static void test_synthetic_corpus(void **state) {
    fixture *f = *state;
    const int64_t V = 300, N = 100000;
    char a[128], b[128];
    snprintf(a, sizeof a, "%s", P(f, "syn.bin"));
    assert_int_equal(tide_tokens_write_synthetic(f->ctx, a, TIDE_TOKENS_AUTO, V, N, 7), TIDE_OK);
    snprintf(b, sizeof b, "%s", P(f, "syn.npy"));
    assert_int_equal(tide_tokens_write_synthetic(f->ctx, b, TIDE_TOKENS_U32, V, N, 7), TIDE_OK);
    struct stat sa;
    assert_int_equal(stat(a, &sa), 0);
    assert_int_equal(sa.st_size, N * 2);
    tide_tokens *ta, *tb;
    assert_int_equal(tide_tokens_open(f->ctx, a, TIDE_TOKENS_AUTO, V, 64, &ta), TIDE_OK);
    assert_int_equal(tide_tokens_open(f->ctx, b, TIDE_TOKENS_AUTO, V, 64, &tb), TIDE_OK);
    assert_string_equal(tide_tokens_dtype_name(tb), "<u2");
    assert_int_equal(tide_tokens_count(tb), N);
    /* The same ids either way; at most 4 successors per id; many ids used. */
    unsigned char *succ = calloc((size_t)(V * V), 1);
    int *used = calloc((size_t)V, sizeof *used);
    assert_non_null(succ);
    assert_non_null(used);
    for (int64_t i = 0; i < N; i++) {
        int64_t x = tide_tokens_at(ta, i);
        assert_int_equal(x, tide_tokens_at(tb, i));
        used[x] = 1;
        if (i) succ[tide_tokens_at(ta, i - 1) * V + x] = 1;
    }
    int n_used = 0;
    for (int64_t c = 0; c < V; c++) {
        int ns = 0;
        for (int64_t x = 0; x < V; x++) ns += succ[c * V + x];
        assert_true(ns <= 4);
        n_used += used[c];
    }
    assert_true(n_used > V / 4);
    free(succ);
    free(used);
    tide_tokens_free(tb);
    /* Deterministic; another seed differs. */
    assert_int_equal(tide_tokens_write_synthetic(f->ctx, b, TIDE_TOKENS_U16, V, N, 7), TIDE_OK);
    assert_int_equal(tide_tokens_write_synthetic(f->ctx, b, TIDE_TOKENS_AUTO, V, N, 7), TIDE_OK);
    snprintf(b, sizeof b, "%s", P(f, "syn2.bin"));
    assert_int_equal(tide_tokens_write_synthetic(f->ctx, b, TIDE_TOKENS_U16, V, N, 7), TIDE_OK);
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    char *x = malloc((size_t)N * 2), *y = malloc((size_t)N * 2);
    assert_int_equal(fread(x, 1, (size_t)N * 2, fa), N * 2);
    assert_int_equal(fread(y, 1, (size_t)N * 2, fb), N * 2);
    assert_memory_equal(x, y, (size_t)N * 2);
    fclose(fa);
    fclose(fb);
    assert_int_equal(tide_tokens_write_synthetic(f->ctx, b, TIDE_TOKENS_U16, V, N, 8), TIDE_OK);
    fb = fopen(b, "rb");
    assert_int_equal(fread(y, 1, (size_t)N * 2, fb), N * 2);
    fclose(fb);
    assert_memory_not_equal(x, y, (size_t)N * 2);
    free(x);
    free(y);
    tide_tokens_free(ta);
    /* A large vocab: u32 ids (raw by default, '<u4' in .npy). */
    snprintf(b, sizeof b, "%s", P(f, "wide.npy"));
    assert_int_equal(tide_tokens_write_synthetic(f->ctx, b, TIDE_TOKENS_AUTO, 100000, 1000, 1), TIDE_OK);
    assert_int_equal(tide_tokens_open(f->ctx, b, TIDE_TOKENS_AUTO, 100000, 64, &tb), TIDE_OK);
    assert_string_equal(tide_tokens_dtype_name(tb), "<u4");
    tide_tokens_free(tb);
    assert_int_equal(tide_tokens_write_synthetic(f->ctx, P(f, "wide.bin"), TIDE_TOKENS_AUTO, 100000, 1000, 1), TIDE_OK);
    assert_int_equal(tide_tokens_open(f->ctx, f->path, TIDE_TOKENS_U32, 100000, 64, &tb), TIDE_OK);
    tide_tokens_free(tb);
    expect_error(f, tide_tokens_write_synthetic(f->ctx, f->path, TIDE_TOKENS_U16, 100000, 10, 1), TIDE_E_INVALID,
                 "u16", NULL);
    expect_error(f, tide_tokens_write_synthetic(f->ctx, P(f, "no/such/x.bin"), TIDE_TOKENS_AUTO, 10, 10, 1), TIDE_E_IO,
                 "no/such/x.bin", "cannot create");
}

/* ---------------------------------------------------------------- safetensors writer */

typedef struct st_user {
    int calls, fail_at; /* fail on this call (0: never) */
    tide_ctx *ctx;      /* the writer's: where a fill's message goes */
} st_user;

/* Element j of entry i: (i * 1000 + j) in the entry's dtype (f32 here, i32 for entry 2). */
static tide_status st_fill(void *user, int i, uint64_t elem0, uint64_t n, void *dst) {
    st_user *u = user;
    if (++u->calls == u->fail_at) return tide_err(u->ctx, TIDE_E_IO, "disk home unreadable");
    for (uint64_t j = 0; j < n; j++) {
        if (i == 2) ((int32_t *)dst)[j] = (int32_t)(i * 1000 + elem0 + j);
        else ((float *)dst)[j] = (float)(i * 1000 + elem0 + j);
    }
    return TIDE_OK;
}

static void test_safetensors_writer(void **state) {
    fixture *f = *state;
    const tide_st_entry e[4] = {
        {"a.weight", TIDE_F32, 2, {3, 4}},
        {"we\"ird\\name", TIDE_F32, 1, {5}},
        {"ids", TIDE_I32, 1, {7}},
        {"scalar", TIDE_F32, 0, {0}},
    };
    const tide_st_meta meta[2] = {{"format", "pt"}, {"note", "line\nbreak"}};
    st_user u = {0};
    assert_int_equal(tide_safetensors_write(f->ctx, P(f, "t.safetensors"), e, 4, meta, 2, st_fill, &u), TIDE_OK);
    FILE *fp = fopen(f->path, "rb");
    assert_non_null(fp);
    unsigned char buf[8192];
    size_t n = fread(buf, 1, sizeof buf, fp);
    fclose(fp);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | buf[i];
    assert_int_equal((8 + hlen) % 4096, 0);
    assert_int_equal(n, 8 + hlen + (12 + 5 + 7 + 1) * 4);
    cJSON *h = cJSON_ParseWithLength((const char *)buf + 8, hlen);
    assert_non_null(h);
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(h, "__metadata__"), "note")->valuestring,
                        "line\nbreak");
    const cJSON *w = cJSON_GetObjectItemCaseSensitive(h, "we\"ird\\name");
    assert_non_null(w);
    assert_int_equal(cJSON_GetArrayItem(cJSON_GetObjectItem(w, "data_offsets"), 0)->valueint, 48);
    assert_int_equal(cJSON_GetArrayItem(cJSON_GetObjectItem(w, "data_offsets"), 1)->valueint, 68);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(cJSON_GetObjectItem(h, "scalar"), "shape")), 0);
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(h, "ids"), "dtype")->valuestring, "I32");
    cJSON_Delete(h);
    const unsigned char *d = buf + 8 + hlen;
    float x;
    int32_t k;
    memcpy(&x, d + 11 * 4, 4);
    assert_true(x == 11.0f);
    memcpy(&x, d + 12 * 4 + 4 * 4, 4);
    assert_true(x == 1004.0f);
    memcpy(&k, d + 17 * 4 + 6 * 4, 4);
    assert_int_equal(k, 2006);
    memcpy(&x, d + 24 * 4, 4);
    assert_true(x == 3000.0f);

    /* Refused entries. */
    tide_st_entry dup[2] = {e[0], e[0]};
    expect_error(f, tide_safetensors_write(f->ctx, f->path, dup, 2, NULL, 0, st_fill, &u), TIDE_E_INVALID,
                 "duplicate tensor 'a.weight'", NULL);
    const tide_st_meta dm[2] = {{"k", "1"}, {"k", "2"}};
    expect_error(f, tide_safetensors_write(f->ctx, f->path, e, 1, dm, 2, st_fill, &u), TIDE_E_INVALID,
                 "duplicate metadata key 'k'", NULL);
    tide_st_entry badd = {"x", TIDE_DTYPE_COUNT, 1, {1}}, negd = {"x", TIDE_F32, 1, {-1}}, meta_name = {"__metadata__", TIDE_F32, 0, {0}};
    expect_error(f, tide_safetensors_write(f->ctx, f->path, &badd, 1, NULL, 0, st_fill, &u), TIDE_E_INVALID, "dtype", NULL);
    expect_error(f, tide_safetensors_write(f->ctx, f->path, &negd, 1, NULL, 0, st_fill, &u), TIDE_E_INVALID, "dim 0", NULL);
    expect_error(f, tide_safetensors_write(f->ctx, f->path, &meta_name, 1, NULL, 0, st_fill, &u), TIDE_E_INVALID,
                 "no usable name", NULL);

    /* A fill that fails part way, a size limit: the old file stays, no temporary. */
    char old[8192];
    memcpy(old, buf, n);
    u = (st_user){0, 3, f->ctx};
    expect_error(f, tide_safetensors_write(f->ctx, f->path, e, 4, meta, 2, st_fill, &u), TIDE_E_IO, "t.safetensors",
                 "tensor 'ids': disk home unreadable");
    struct rlimit was;
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &was), 0);
    void (*h0)(int) = signal(SIGXFSZ, SIG_IGN);
    struct rlimit small = {4100, was.rlim_max}; /* the header fits, the data does not */
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &small), 0);
    u = (st_user){0};
    tide_status st = tide_safetensors_write(f->ctx, f->path, e, 4, meta, 2, st_fill, &u);
    setrlimit(RLIMIT_FSIZE, &was);
    signal(SIGXFSZ, h0);
    expect_error(f, st, TIDE_E_IO, "t.safetensors", strerror(EFBIG));
    fp = fopen(f->path, "rb");
    assert_int_equal(fread(buf, 1, sizeof buf, fp), n);
    fclose(fp);
    assert_memory_equal(buf, old, n);
    assert_int_equal(n_entries(f->dir), 1);
}

static void test_convert(void **state) {
    (void)state;
    const float src[6] = {1.0f, -2.5f, 3.14159265f, 1e-8f, 65504.0f, 1e6f};
    uint16_t h[6];
    float back[6];
    tide_convert_from_f32(src, TIDE_BF16, h, 6);
    for (int i = 0; i < 6; i++) assert_int_equal(h[i], tide_f32_to_bf16(src[i]));
    tide_convert_from_f32(src, TIDE_F16, h, 6);
    for (int i = 0; i < 6; i++) assert_int_equal(h[i], tide_f32_to_f16(src[i]));
    tide_convert_from_f32(src, TIDE_F32, back, 6);
    assert_memory_equal(back, src, sizeof src);
}

/* ---------------------------------------------------------------- training checkpoints */

static tide_llama_config tiny_config(tide_dtype dt) {
    tide_llama_config c = {
        .name = "tiny", .hidden_size = 64, .intermediate_size = 160, .num_hidden_layers = 2,
        .num_attention_heads = 4, .num_key_value_heads = 2, .vocab_size = 128,
        .max_position_embeddings = 256, .rms_norm_eps = 1e-5f, .rope_theta = 10000.0f,
        .tie_word_embeddings = false, .dtype = dt,
    };
    return c;
}

typedef struct model_params {
    int n;
    tide_train_param p[32];
    char names[32][96];
} model_params;

static void add_param(model_params *m, const char *fmt, int layer, int64_t d0, int64_t d1) {
    tide_train_param *p = &m->p[m->n];
    snprintf(m->names[m->n], sizeof m->names[0], fmt, layer);
    p->name = m->names[m->n];
    p->ndim = d1 ? 2 : 1;
    p->shape[0] = d0;
    p->shape[1] = d1;
    m->n++;
}

/* The HF parameters of cfg in model order. */
static void make_params(const tide_llama_config *c, model_params *m) {
    int64_t D = c->hidden_size, I = c->intermediate_size, V = c->vocab_size;
    int64_t hd = D / c->num_attention_heads, KV = c->num_key_value_heads * hd;
    m->n = 0;
    add_param(m, "model.embed_tokens.weight", 0, V, D);
    for (int l = 0; l < c->num_hidden_layers; l++) {
        add_param(m, "model.layers.%d.input_layernorm.weight", l, D, 0);
        add_param(m, "model.layers.%d.self_attn.q_proj.weight", l, D, D);
        add_param(m, "model.layers.%d.self_attn.k_proj.weight", l, KV, D);
        add_param(m, "model.layers.%d.self_attn.v_proj.weight", l, KV, D);
        add_param(m, "model.layers.%d.self_attn.o_proj.weight", l, D, D);
        add_param(m, "model.layers.%d.post_attention_layernorm.weight", l, D, 0);
        add_param(m, "model.layers.%d.mlp.gate_proj.weight", l, I, D);
        add_param(m, "model.layers.%d.mlp.up_proj.weight", l, I, D);
        add_param(m, "model.layers.%d.mlp.down_proj.weight", l, D, I);
    }
    add_param(m, "model.norm.weight", 0, D, 0);
    add_param(m, "lm_head.weight", 0, V, D);
}

/* The state a fill hands out: a pure function of (version, part, parameter,
 * element), not exact in 16 bits; and a fault to plant. */
typedef struct train_user {
    int version;
    long calls, fail_at; /* fail on this call (0: never) */
    tide_ctx *ctx;
} train_user;

static float state_value(int version, tide_train_part part, int param, uint64_t j) {
    uint32_t h = (uint32_t)(version * 7919 + part * 104729 + param * 1299709) + (uint32_t)j * 2654435761u;
    h ^= h >> 15;
    h *= 0x2c1b3c6du;
    h ^= h >> 12;
    return ((float)(h & 0xffffff) - 8388608.0f) * 0x1p-27f;
}

static tide_status train_fill(void *user, tide_train_part part, int param, tide_dtype dt, uint64_t elem0, uint64_t n,
                              void *dst) {
    train_user *u = user;
    if (++u->calls == u->fail_at)
        return tide_err(u->ctx, TIDE_E_IO, "cannot read parameter %d from its home", param);
    float tmp[4096];
    for (uint64_t j0 = 0; j0 < n; j0 += 4096) {
        uint64_t m = n - j0 < 4096 ? n - j0 : 4096;
        tide_train_part src = part == TIDE_PART_MODEL ? TIDE_PART_MASTER : part;
        for (uint64_t j = 0; j < m; j++) tmp[j] = state_value(u->version, src, param, elem0 + j0 + j);
        tide_convert_from_f32(tmp, part == TIDE_PART_MODEL ? dt : TIDE_F32,
                              (char *)dst + j0 * tide_dtype_size(dt), (size_t)m);
    }
    return TIDE_OK;
}

static tide_train_save make_save(const tide_llama_config *c, tide_dtype model_dt, const model_params *m,
                                 train_user *u, int64_t step) {
    tide_train_save s = {
        .cfg = c, .model_dtype = model_dt, .params = m->p, .n_params = m->n, .fill = train_fill, .user = u,
        .meta = {.step = step, .tokens_seen = step * 2 * 4 * 64, .batch = 4, .seq = 64, .accum = 2,
                 .shuffle = true, .seed = 0xfeedfacecafebeefull, .lr = 3e-4f, .beta1 = 0.9f, .beta2 = 0.95f,
                 .adam_eps = 1e-8f, .weight_decay = 0.1f, .max_norm = 1.0f},
    };
    return s;
}

static uint64_t numel(const tide_train_param *p) {
    uint64_t n = 1;
    for (int d = 0; d < p->ndim; d++) n *= (uint64_t)p->shape[d];
    return n;
}

/* The checkpoint at dir holds version v of the state, step `step`. */
static void check_saved(fixture *f, const char *dir, const tide_llama_config *c, tide_dtype model_dt,
                        const model_params *m, int v, int64_t step) {
    tide_checkpoint *ck;
    assert_int_equal(tide_checkpoint_open(f->ctx, dir, &ck), TIDE_OK);
    assert_int_equal(tide_checkpoint_config(ck)->dtype, model_dt);
    assert_int_equal(tide_checkpoint_config(ck)->hidden_size, c->hidden_size);
    assert_int_equal(tide_checkpoint_n_tensors(ck), m->n);
    for (int i = 0; i < m->n; i++) {
        tide_tensor_info ti;
        assert_int_equal(tide_checkpoint_get(ck, m->p[i].name, &ti), TIDE_OK);
        assert_int_equal(ti.dtype, model_dt);
        assert_int_equal(ti.ndim, m->p[i].ndim);
        for (uint64_t j = 0; j < numel(&m->p[i]); j += 97) {
            float x = state_value(v, TIDE_PART_MASTER, i, j);
            if (model_dt == TIDE_BF16) assert_int_equal(((const uint16_t *)ti.data)[j], tide_f32_to_bf16(x));
            else assert_true(((const float *)ti.data)[j] == x);
        }
    }
    /* The model as inference sees it. */
    tide_llama_config lc = *c;
    lc.dtype = model_dt;
    tide_llama_graph_opts go = {.batch = 1, .seq = 4};
    tide_graph *g;
    assert_int_equal(tide_llama_build(f->ctx, &lc, &go, &g), TIDE_OK);
    assert_int_equal(tide_checkpoint_match(ck, g), TIDE_OK);
    tide_graph_free(g);
    tide_checkpoint_free(ck);

    tide_train_resume *r;
    assert_int_equal(tide_train_resume_open(f->ctx, dir, c, m->p, m->n, &r), TIDE_OK);
    const tide_train_meta *tm = tide_train_resume_meta(r);
    assert_int_equal(tm->step, step);
    assert_int_equal(tm->tokens_seen, step * 512);
    assert_int_equal(tm->batch, 4);
    assert_int_equal(tm->seq, 64);
    assert_int_equal(tm->accum, 2);
    assert_true(tm->shuffle);
    assert_true(tm->seed == 0xfeedfacecafebeefull);
    assert_true(tm->lr == 3e-4f && tm->beta1 == 0.9f && tm->beta2 == 0.95f && tm->adam_eps == 1e-8f &&
                tm->weight_decay == 0.1f && tm->max_norm == 1.0f);
    assert_string_equal(tide_train_resume_get(r, "format"), TIDE_TRAIN_FORMAT);
    for (int i = 0; i < m->n; i++)
        for (int part = TIDE_PART_MASTER; part < TIDE_PART_COUNT; part++) {
            uint64_t off = 0;
            const float *x = tide_train_resume_tensor(r, (tide_train_part)part, i, &off);
            assert_non_null(x);
            assert_int_equal(off % 4, 0);
            for (uint64_t j = 0; j < numel(&m->p[i]); j++) {
                float want = state_value(v, (tide_train_part)part, i, j);
                if (memcmp(&x[j], &want, 4) != 0) fail_msg("part %d param %d elem %llu differs", part, i, (unsigned long long)j);
            }
        }
    assert_null(tide_train_resume_tensor(r, TIDE_PART_MODEL, 0, NULL));
    assert_null(tide_train_resume_tensor(r, TIDE_PART_MASTER, m->n, NULL));
    tide_train_resume_free(r);
}

static void test_save_roundtrip(void **state) {
    fixture *f = *state;
    tide_llama_config c = tiny_config(TIDE_BF16);
    model_params m;
    make_params(&c, &m);
    train_user u = {.version = 1};
    tide_train_save s = make_save(&c, TIDE_BF16, &m, &u, 100);
    const tide_st_meta extra[2] = {{"lr_schedule", "cosine"}, {"data", "train.bin"}};
    s.extra = extra;
    s.n_extra = 2;
    char dir[128];
    snprintf(dir, sizeof dir, "%s/runs/a/ckpt", f->dir); /* parents made */
    assert_int_equal(tide_train_save_dir(f->ctx, dir, &s), TIDE_OK);
    check_saved(f, dir, &c, TIDE_BF16, &m, 1, 100);
    tide_train_resume *r;
    assert_int_equal(tide_train_resume_open(f->ctx, dir, &c, m.p, m.n, &r), TIDE_OK);
    assert_string_equal(tide_train_resume_get(r, "lr_schedule"), "cosine");
    assert_null(tide_train_resume_get(r, "nothing"));
    assert_non_null(strstr(tide_train_resume_path(r), "ckpt/optimizer.safetensors"));
    tide_train_resume_free(r);
    struct stat sb;
    assert_int_equal(stat(dir, &sb), 0);
    assert_true(S_ISDIR(sb.st_mode));

    /* Replaced in place (f32 now, trailing slash), nothing left beside it. */
    u.version = 2;
    s = make_save(&c, TIDE_F32, &m, &u, 200);
    char slash[140];
    snprintf(slash, sizeof slash, "%s/", dir);
    assert_int_equal(tide_train_save_dir(f->ctx, slash, &s), TIDE_OK);
    check_saved(f, dir, &c, TIDE_F32, &m, 2, 200);
    char parent[128];
    snprintf(parent, sizeof parent, "%s/runs/a", f->dir);
    assert_int_equal(n_entries(parent), 1);
    assert_int_equal(n_entries(dir), 3);

    /* A relative path. */
    char cwd[512];
    assert_non_null(getcwd(cwd, sizeof cwd));
    assert_int_equal(chdir(parent), 0);
    u.version = 3;
    s = make_save(&c, TIDE_BF16, &m, &u, 300);
    assert_int_equal(tide_train_save_dir(f->ctx, "ckpt", &s), TIDE_OK);
    assert_int_equal(chdir(cwd), 0);
    check_saved(f, dir, &c, TIDE_BF16, &m, 3, 300);
    assert_int_equal(n_entries(parent), 1);

    /* Extra metadata may not shadow a standard key; bad arguments. */
    const tide_st_meta shadow = {"step", "5"};
    s.extra = &shadow;
    s.n_extra = 1;
    expect_error(f, tide_train_save_dir(f->ctx, dir, &s), TIDE_E_INVALID, "duplicate metadata key 'step'", NULL);
    check_saved(f, dir, &c, TIDE_BF16, &m, 3, 300);
    s.n_extra = 0;
    s.model_dtype = TIDE_I32;
    expect_error(f, tide_train_save_dir(f->ctx, dir, &s), TIDE_E_INVALID, "model dtype i32", NULL);
    s.model_dtype = TIDE_BF16;
    s.fill = NULL;
    expect_error(f, tide_train_save_dir(f->ctx, dir, &s), TIDE_E_INVALID, "no config, fill", NULL);
    assert_int_equal(n_entries(parent), 1);
}

/* dir keeps version 1 at step 10 and nothing is left beside it. */
static void assert_kept(fixture *f, const char *dir, const tide_llama_config *c, const model_params *m) {
    check_saved(f, dir, c, TIDE_BF16, m, 1, 10);
    assert_int_equal(n_entries(f->dir), 1);
    assert_int_equal(n_entries(dir), 3);
}

static void test_save_failures(void **state) {
    fixture *f = *state;
    tide_llama_config c = tiny_config(TIDE_BF16);
    model_params m;
    make_params(&c, &m);
    train_user u = {.version = 1};
    tide_train_save s = make_save(&c, TIDE_BF16, &m, &u, 10);
    char dir[128];
    snprintf(dir, sizeof dir, "%s/ck", f->dir);
    assert_int_equal(tide_train_save_dir(f->ctx, dir, &s), TIDE_OK);
    long calls = u.calls;
    assert_true(calls > 3 * m.n);

    /* A fill that fails in the model file, then in the optimizer file. */
    const long fail_at[2] = {5, calls - 7};
    for (int k = 0; k < 2; k++) {
        train_user bad = {.version = 2, .fail_at = fail_at[k], .ctx = f->ctx};
        tide_train_save sb = make_save(&c, TIDE_BF16, &m, &bad, 20);
        expect_error(f, tide_train_save_dir(f->ctx, dir, &sb), TIDE_E_IO, "not saved",
                     "from its home");
        assert_non_null(strstr(tide_ctx_last_error(f->ctx), k ? "optimizer.safetensors" : "model.safetensors"));
        assert_kept(f, dir, &c, &m);
    }

    /* A disk that fills: the size limit hit in the model file, then in the optimizer file. */
    const rlim_t limits[2] = {64 << 10, 600 << 10};
    for (int k = 0; k < 2; k++) {
        train_user v2 = {.version = 2};
        tide_train_save sb = make_save(&c, TIDE_BF16, &m, &v2, 20);
        struct rlimit was;
        assert_int_equal(getrlimit(RLIMIT_FSIZE, &was), 0);
        void (*h0)(int) = signal(SIGXFSZ, SIG_IGN);
        struct rlimit lim = {limits[k], was.rlim_max};
        assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
        tide_status st = tide_train_save_dir(f->ctx, dir, &sb);
        setrlimit(RLIMIT_FSIZE, &was);
        signal(SIGXFSZ, h0);
        expect_error(f, st, TIDE_E_IO, strerror(EFBIG), k ? "optimizer.safetensors" : "model.safetensors");
        assert_non_null(strstr(tide_ctx_last_error(f->ctx), dir));
        assert_kept(f, dir, &c, &m);
    }

    /* Every allocation failing in turn. */
    int64_t base = tide_alloc_live_bytes();
    int failures = 0;
    for (long n = 1;; n++) {
        train_user v2 = {.version = 2};
        tide_train_save sb = make_save(&c, TIDE_BF16, &m, &v2, 20);
        tide_alloc_fail_nth(n);
        tide_status st = tide_train_save_dir(f->ctx, dir, &sb);
        tide_alloc_fail_nth(0);
        assert_int_equal(tide_alloc_live_bytes(), base);
        if (st == TIDE_OK) break;
        assert_int_equal(st, TIDE_E_NOMEM);
        assert_kept(f, dir, &c, &m);
        failures++;
    }
    assert_true(failures >= 5);
    check_saved(f, dir, &c, TIDE_BF16, &m, 2, 20);
    assert_int_equal(n_entries(f->dir), 1);
}

static void test_bad_destinations(void **state) {
    fixture *f = *state;
    tide_llama_config c = tiny_config(TIDE_BF16);
    model_params m;
    make_params(&c, &m);
    train_user u = {.version = 1};
    tide_train_save s = make_save(&c, TIDE_BF16, &m, &u, 10);
    char p[160];

    /* A regular file in the way, as the destination or as its parent. */
    write_bytes(P(f, "file"), "x", 1);
    expect_error(f, tide_train_save_dir(f->ctx, f->path, &s), TIDE_E_INVALID, "exists and is not a directory", "file");
    snprintf(p, sizeof p, "%s/file/ck", f->dir);
    expect_error(f, tide_train_save_dir(f->ctx, p, &s), TIDE_E_IO, "is not a directory", "file/ck");
    snprintf(p, sizeof p, "%s/file/sub/ck", f->dir);
    expect_error(f, tide_train_save_dir(f->ctx, p, &s), TIDE_E_IO, "is not a directory", NULL);
    /* A directory of other things is never replaced. */
    snprintf(p, sizeof p, "%s/home", f->dir);
    assert_int_equal(mkdir(p, 0755), 0);
    write_bytes(P(f, "home/notes.txt"), "keep", 4);
    expect_error(f, tide_train_save_dir(f->ctx, p, &s), TIDE_E_INVALID, "holds 'notes.txt'", "refusing");
    assert_int_equal(access(f->path, F_OK), 0);
    /* A link, ".", "..", "". */
    snprintf(p, sizeof p, "%s/link", f->dir);
    assert_int_equal(symlink("home", p), 0);
    expect_error(f, tide_train_save_dir(f->ctx, p, &s), TIDE_E_INVALID, "symbolic link", NULL);
    expect_error(f, tide_train_save_dir(f->ctx, ".", &s), TIDE_E_INVALID, "not a name", NULL);
    snprintf(p, sizeof p, "%s/..", f->dir);
    expect_error(f, tide_train_save_dir(f->ctx, p, &s), TIDE_E_INVALID, "not a name", NULL);
    expect_error(f, tide_train_save_dir(f->ctx, "", &s), TIDE_E_INVALID, "no directory", NULL);
    assert_int_equal(n_entries(f->dir), 3);

    /* An empty directory is taken. */
    snprintf(p, sizeof p, "%s/empty", f->dir);
    assert_int_equal(mkdir(p, 0700), 0);
    assert_int_equal(tide_train_save_dir(f->ctx, p, &s), TIDE_OK);
    assert_int_equal(n_entries(p), 3);

    /* Stale temporaries: a dead pid's and this process's own are removed, with
     * only checkpoint files in them; a live pid's, or one with other files, stays. */
    pid_t child = fork();
    if (child == 0) _exit(0);
    assert_true(child > 0);
    assert_int_equal(waitpid(child, NULL, 0), child);
    char dead[160], mine[160], live[160], other[160], q[200];
    snprintf(dead, sizeof dead, "%s/empty.tmp-%ld-0", f->dir, (long)child);
    snprintf(mine, sizeof mine, "%s/empty.tmp-%ld-7", f->dir, (long)getpid());
    snprintf(live, sizeof live, "%s/empty.tmp-%ld-0", f->dir, (long)getppid());
    snprintf(other, sizeof other, "%s/empty.tmp-%ld-1", f->dir, (long)child);
    const char *dirs[4] = {dead, mine, live, other};
    for (int k = 0; k < 4; k++) {
        assert_int_equal(mkdir(dirs[k], 0755), 0);
        snprintf(q, sizeof q, "%s/model.safetensors", dirs[k]);
        write_bytes(q, "partial", 7);
        snprintf(q, sizeof q, "%s/optimizer.safetensors.tmp.1.0", dirs[k]);
        write_bytes(q, "partial", 7);
    }
    snprintf(q, sizeof q, "%s/mine.txt", other);
    write_bytes(q, "x", 1);
    u.version = 2;
    s = make_save(&c, TIDE_BF16, &m, &u, 20);
    assert_int_equal(tide_train_save_dir(f->ctx, p, &s), TIDE_OK);
    check_saved(f, p, &c, TIDE_BF16, &m, 2, 20);
    assert_int_not_equal(access(dead, F_OK), 0);
    assert_int_not_equal(access(mine, F_OK), 0);
    assert_int_equal(access(live, F_OK), 0);
    assert_int_equal(access(other, F_OK), 0);
}

static void test_resume_errors(void **state) {
    fixture *f = *state;
    tide_llama_config c = tiny_config(TIDE_BF16);
    model_params m;
    make_params(&c, &m);
    train_user u = {.version = 1};
    tide_train_save s = make_save(&c, TIDE_BF16, &m, &u, 10);
    char dir[128], p[200];
    snprintf(dir, sizeof dir, "%s/ck", f->dir);
    assert_int_equal(tide_train_save_dir(f->ctx, dir, &s), TIDE_OK);
    tide_train_resume *r = (tide_train_resume *)1;

    /* Another model. */
    tide_llama_config other = c;
    other.hidden_size = 128;
    expect_error(f, tide_train_resume_open(f->ctx, dir, &other, m.p, m.n, &r), TIDE_E_FORMAT, "hidden_size is 64",
                 "128 in the model");
    assert_null(r);
    other = c;
    other.rope_theta = 500000.0f;
    expect_error(f, tide_train_resume_open(f->ctx, dir, &other, m.p, m.n, &r), TIDE_E_FORMAT, "rope_theta", dir);
    other = c;
    other.dtype = TIDE_F32; /* the masters are f32 whatever the model's dtype */
    assert_int_equal(tide_train_resume_open(f->ctx, dir, &other, m.p, m.n, &r), TIDE_OK);
    tide_train_resume_free(r);
    tide_train_resume_free(NULL);

    /* Parameters that differ: a shape, one missing from the file, one more in it. */
    model_params m2 = m;
    for (int i = 0; i < m2.n; i++) m2.p[i].name = m2.names[i];
    m2.p[3].shape[0] = 16;
    expect_error(f, tide_train_resume_open(f->ctx, dir, &c, m2.p, m2.n, &r), TIDE_E_FORMAT,
                 "tensor 'master.model.layers.0.self_attn.k_proj.weight': shape (32, 64), expected (16, 64)",
                 "optimizer.safetensors");
    m2 = m;
    for (int i = 0; i < m2.n; i++) m2.p[i].name = m2.names[i];
    snprintf(m2.names[m2.n], sizeof m2.names[0], "model.extra.weight");
    m2.p[m2.n] = (tide_train_param){m2.names[m2.n], 1, {64}};
    m2.n++;
    expect_error(f, tide_train_resume_open(f->ctx, dir, &c, m2.p, m2.n, &r), TIDE_E_NOT_FOUND,
                 "tensor 'master.model.extra.weight' is missing", NULL);
    expect_error(f, tide_train_resume_open(f->ctx, dir, &c, m.p, m.n - 1, &r), TIDE_E_FORMAT,
                 "extra tensor 'master.lm_head.weight'", NULL);
    expect_error(f, tide_train_resume_open(f->ctx, dir, &c, m.p, 0, &r), TIDE_E_INVALID, NULL, NULL);

    /* config.json replaced by another model's, matching the model given: the fingerprint tells. */
    other = c;
    other.intermediate_size = 192;
    snprintf(p, sizeof p, "%s/config.json", dir);
    assert_int_equal(tide_llama_config_save(f->ctx, &other, p), TIDE_OK);
    expect_error(f, tide_train_resume_open(f->ctx, dir, &other, m.p, m.n, &r), TIDE_E_FORMAT, "config_fingerprint",
                 "does not match");
    assert_int_equal(tide_llama_config_save(f->ctx, &c, p), TIDE_OK);

    /* Not a training checkpoint; metadata missing; no optimizer file; no config; no dir. */
    snprintf(p, sizeof p, "%s/optimizer.safetensors", dir);
    const tide_st_entry e = {"master.x", TIDE_F32, 1, {1}};
    st_user su = {0};
    const tide_st_meta fm = {"format", "pt"};
    assert_int_equal(tide_safetensors_write(f->ctx, p, &e, 1, &fm, 1, st_fill, &su), TIDE_OK);
    expect_error(f, tide_train_resume_open(f->ctx, dir, &c, m.p, m.n, &r), TIDE_E_FORMAT,
                 "not a tide training checkpoint: format 'pt'", "optimizer.safetensors");
    const tide_st_meta fm2[2] = {{"format", TIDE_TRAIN_FORMAT}, {"step", "-4"}};
    assert_int_equal(tide_safetensors_write(f->ctx, p, &e, 1, fm2, 2, st_fill, &su), TIDE_OK);
    expect_error(f, tide_train_resume_open(f->ctx, dir, &c, m.p, m.n, &r), TIDE_E_FORMAT, "metadata 'step' is '-4'",
                 NULL);
    write_bytes(p, "\x10\0\0\0\0\0\0\0{\"a\":", 14);
    expect_error(f, tide_train_resume_open(f->ctx, dir, &c, m.p, m.n, &r), TIDE_E_FORMAT, "truncated", NULL);
    assert_int_equal(unlink(p), 0);
    expect_error(f, tide_train_resume_open(f->ctx, dir, &c, m.p, m.n, &r), TIDE_E_NOT_FOUND, "optimizer.safetensors",
                 NULL);
    snprintf(p, sizeof p, "%s/config.json", dir);
    assert_int_equal(unlink(p), 0);
    expect_error(f, tide_train_resume_open(f->ctx, dir, &c, m.p, m.n, &r), TIDE_E_NOT_FOUND, "no config.json", NULL);
    snprintf(p, sizeof p, "%s/none", f->dir);
    expect_error(f, tide_train_resume_open(f->ctx, p, &c, m.p, m.n, &r), TIDE_E_NOT_FOUND, "none", NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_window_formula, setup, teardown),
        cmocka_unit_test_setup_teardown(test_shuffle, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_files, setup, teardown),
        cmocka_unit_test_setup_teardown(test_npy, setup, teardown),
        cmocka_unit_test_setup_teardown(test_synthetic_corpus, setup, teardown),
        cmocka_unit_test_setup_teardown(test_safetensors_writer, setup, teardown),
        cmocka_unit_test_setup_teardown(test_convert, setup, teardown),
        cmocka_unit_test_setup_teardown(test_save_roundtrip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_save_failures, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_destinations, setup, teardown),
        cmocka_unit_test_setup_teardown(test_resume_errors, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
