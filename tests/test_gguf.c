/*
 * test_gguf.c - GGUF files: the reader (src/model/gguf.c) and GGUF
 * checkpoints (src/model/gguf_model.c).
 *
 * - tests/fixtures/gguf/meta.gguf (written by the `gguf` package, see
 *   tests/fixtures/README.md): a metadata value of every type, arrays of
 *   each, arrays of strings, nested arrays, general.alignment 64 and one
 *   tensor of each ggml type tide maps, read back through every getter.
 * - A small good file built here (every field's offset recorded), then one
 *   damaged copy per kind of damage: bad magic, unknown version, truncated
 *   header, string or array length past the end, counts that overflow, tensor
 *   data out of range or misaligned, unknown or unsupported types, a row not
 *   whole blocks, duplicate keys and names, bad alignment, overlapping data.
 *   Each must fail with the right status and a message naming the key or
 *   tensor (the suite runs under ASan in CI, so a read outside the buffers
 *   the reader owns fails it too).
 *
 * What it proves: the reader accepts what the reference writer writes and
 * refuses each kind of damaged file with TIDE_E_FORMAT (TIDE_E_UNSUPPORTED for
 * valid files tide cannot use) and a message naming what is wrong.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/core.h"
#include "model/checkpoint.h"
#include "model/gguf.h"
#include "tide.h"

static char fixtures[4096];

static void fixture_path(char *buf, size_t n, const char *name) { snprintf(buf, n, "%s/%s", fixtures, name); }

/* ---------------------------------------------------------------- a builder */

typedef struct buf {
    unsigned char *p;
    size_t n, cap;
} buf;

static void put(buf *b, const void *src, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        assert_non_null(b->p);
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}
static void put_u32(buf *b, uint32_t v) {
    unsigned char x[4] = {(unsigned char)v, (unsigned char)(v >> 8), (unsigned char)(v >> 16), (unsigned char)(v >> 24)};
    put(b, x, 4);
}
static void put_u64(buf *b, uint64_t v) {
    put_u32(b, (uint32_t)v);
    put_u32(b, (uint32_t)(v >> 32));
}
static void put_str(buf *b, const char *s) {
    put_u64(b, strlen(s));
    put(b, s, strlen(s));
}
static void set_u32(buf *b, size_t at, uint32_t v) {
    for (int i = 0; i < 4; i++) b->p[at + i] = (unsigned char)(v >> (8 * i));
}
static void set_u64(buf *b, size_t at, uint64_t v) {
    for (int i = 0; i < 8; i++) b->p[at + i] = (unsigned char)(v >> (8 * i));
}

/* Offsets of the good file's fields. */
typedef struct layout {
    size_t version, n_tensors, n_kv;
    size_t key2;          /* the length of the second key's name */
    size_t str_len;       /* general.name's string length */
    size_t align_val;     /* general.alignment's value */
    size_t arr_count;     /* test.ints' element count */
    size_t strs_len1;     /* the length of test.strs' second element */
    size_t t_name[2], t_ndims[2], t_ne0[2], t_ne1[2], t_type[2], t_off[2];
    size_t data;
} layout;

/* A good version-3 file: 6 keys (a string, the alignment, an i32 array, an
 * array of strings, an empty array, a nested array) and two tensors, "a" f32
 * (8, 2) at 0 and "b" q8_0 (32, 1) at 64. */
static buf good_file(layout *L) {
    buf b = {0};
    memset(L, 0, sizeof *L);
    put_u32(&b, TIDE_GGUF_MAGIC);
    L->version = b.n;
    put_u32(&b, 3);
    L->n_tensors = b.n;
    put_u64(&b, 2);
    L->n_kv = b.n;
    put_u64(&b, 6);
    put_str(&b, "general.name");
    put_u32(&b, TIDE_GGUF_STRING);
    L->str_len = b.n;
    put_str(&b, "good");
    L->key2 = b.n;
    put_str(&b, "general.alignment");
    put_u32(&b, TIDE_GGUF_U32);
    L->align_val = b.n;
    put_u32(&b, 32);
    put_str(&b, "test.ints");
    put_u32(&b, TIDE_GGUF_ARRAY);
    put_u32(&b, TIDE_GGUF_I32);
    L->arr_count = b.n;
    put_u64(&b, 3);
    put_u32(&b, 1), put_u32(&b, (uint32_t)-2), put_u32(&b, 3);
    put_str(&b, "test.strs");
    put_u32(&b, TIDE_GGUF_ARRAY);
    put_u32(&b, TIDE_GGUF_STRING);
    put_u64(&b, 2);
    put_str(&b, "x");
    L->strs_len1 = b.n;
    put_str(&b, "yz");
    put_str(&b, "test.none");
    put_u32(&b, TIDE_GGUF_ARRAY);
    put_u32(&b, TIDE_GGUF_F64);
    put_u64(&b, 0);
    put_str(&b, "test.nest");
    put_u32(&b, TIDE_GGUF_ARRAY);
    put_u32(&b, TIDE_GGUF_ARRAY);
    put_u64(&b, 2);
    put_u32(&b, TIDE_GGUF_U16), put_u64(&b, 1);
    unsigned char u16[2] = {7, 1};
    put(&b, u16, 2);
    put_u32(&b, TIDE_GGUF_STRING), put_u64(&b, 0);
    const char *names[2] = {"a", "b"};
    uint64_t ne0[2] = {8, 32}, ne1[2] = {2, 1}, off[2] = {0, 64};
    uint32_t type[2] = {TIDE_GGML_F32, TIDE_GGML_Q8_0};
    for (int i = 0; i < 2; i++) {
        L->t_name[i] = b.n;
        put_str(&b, names[i]);
        L->t_ndims[i] = b.n;
        put_u32(&b, 2);
        L->t_ne0[i] = b.n;
        put_u64(&b, ne0[i]);
        L->t_ne1[i] = b.n;
        put_u64(&b, ne1[i]);
        L->t_type[i] = b.n;
        put_u32(&b, type[i]);
        L->t_off[i] = b.n;
        put_u64(&b, off[i]);
    }
    while (b.n % 32) put(&b, "", 1);
    L->data = b.n;
    for (int i = 0; i < 64 + 34; i++) put(&b, "\x01", 1);
    return b;
}

static void write_file(const char *path, const buf *b) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b->p, 1, b->n, f), b->n);
    assert_int_equal(fclose(f), 0);
}

static char tmp_path[256];

static int setup_tmp(void **state) {
    snprintf(tmp_path, sizeof tmp_path, "/tmp/tide_gguf_%d.gguf", (int)getpid());
    return 0;
}

static int teardown_tmp(void **state) {
    unlink(tmp_path);
    return 0;
}

/* Opens b as a file: expects status want and a message holding each of the
 * NULL-terminated needles. */
static void expect_open(const buf *b, tide_status want, ...) {
    write_file(tmp_path, b);
    tide_ctx *ctx = tide_ctx_new();
    tide_gguf *g = (tide_gguf *)1;
    tide_status st = tide_gguf_open(ctx, tmp_path, &g);
    const char *msg = tide_ctx_last_error(ctx);
    if (st != want) {
        print_error("status %s, expected %s: %s\n", tide_status_str(st), tide_status_str(want), msg);
        fail();
    }
    if (want != TIDE_OK) {
        assert_null(g);
        assert_non_null(strstr(msg, tmp_path));
        va_list ap;
        va_start(ap, want);
        for (const char *n; (n = va_arg(ap, const char *));)
            if (!strstr(msg, n)) {
                print_error("message \"%s\" lacks \"%s\"\n", msg, n);
                fail();
            }
        va_end(ap);
    }
    tide_gguf_close(st ? NULL : g);
    tide_ctx_free(ctx);
}

/* ---------------------------------------------------------------- reader */

static void test_good_built(void **state) {
    layout L;
    buf b = good_file(&L);
    write_file(tmp_path, &b);
    tide_ctx *ctx = tide_ctx_new();
    tide_gguf *g = NULL;
    assert_int_equal(tide_gguf_open(ctx, tmp_path, &g), TIDE_OK);
    assert_int_equal(tide_gguf_version(g), 3);
    assert_int_equal(tide_gguf_n_kv(g), 6);
    assert_int_equal(tide_gguf_data_start(g), L.data);
    tide_gguf_value v, e, f;
    uint64_t n;
    tide_gguf_type et;
    assert_true(tide_gguf_get(g, "test.none", &v));
    assert_true(tide_gguf_value_array(&v, &n, &et));
    assert_int_equal(n, 0);
    assert_int_equal(et, TIDE_GGUF_F64);
    assert_false(tide_gguf_value_elem(&v, 0, &e));
    assert_int_equal(tide_gguf_get_array(g, "test.nest", &v), TIDE_OK);
    assert_int_equal(v.n, 2);
    assert_true(tide_gguf_value_elem(&v, 0, &e));
    assert_true(tide_gguf_value_elem(&e, 0, &f));
    int64_t iv;
    assert_true(tide_gguf_value_int(&f, &iv));
    assert_int_equal(iv, 263);
    assert_true(tide_gguf_value_elem(&v, 1, &e));
    assert_true(tide_gguf_value_array(&e, &n, &et));
    assert_int_equal(n, 0);
    assert_int_equal(et, TIDE_GGUF_STRING);
    const tide_gguf_tensor *t = tide_gguf_tensor_at(g, tide_gguf_find_tensor(g, "b"));
    assert_non_null(t);
    assert_int_equal(t->dtype, TIDE_Q8_0);
    assert_int_equal(t->nbytes, 34);
    assert_int_equal(t->file_offset, L.data + 64);
    assert_int_equal(((const unsigned char *)tide_gguf_tensor_data(g, t))[0], 1);
    tide_gguf_close(g);
    tide_ctx_free(ctx);
    free(b.p);
}

static void test_meta_fixture(void **state) {
    char path[4200];
    fixture_path(path, sizeof path, "gguf/meta.gguf");
    tide_ctx *ctx = tide_ctx_new();
    tide_gguf *g = NULL;
    if (tide_gguf_open(ctx, path, &g)) {
        print_error("%s\n", tide_ctx_last_error(ctx));
        fail();
    }
    assert_int_equal(tide_gguf_alignment(g), 64);
    struct { const char *key; int64_t v; } ints[] = {
        {"test.u8", 200}, {"test.i8", -100}, {"test.u16", 60000}, {"test.i16", -30000},
        {"test.u32", 4000000000LL}, {"test.i32", -2000000000LL}, {"test.i64", -9000000000000000000LL},
        {"general.alignment", 64}};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        int64_t v = 0;
        assert_int_equal(tide_gguf_get_int(g, ints[i].key, &v), TIDE_OK);
        assert_true(v == ints[i].v);
    }
    /* 1.8e19 does not fit an int64: refused, naming the key */
    int64_t big;
    assert_int_equal(tide_gguf_get_int(g, "test.u64", &big), TIDE_E_FORMAT);
    assert_non_null(strstr(tide_ctx_last_error(ctx), "test.u64"));
    double d;
    assert_int_equal(tide_gguf_get_float(g, "test.f32", &d), TIDE_OK);
    assert_true(d == 1.5);
    assert_int_equal(tide_gguf_get_float(g, "test.f64", &d), TIDE_OK);
    assert_true(d == -2.25);
    bool bv = false;
    assert_int_equal(tide_gguf_get_bool(g, "test.bool", &bv), TIDE_OK);
    assert_true(bv);
    char *s = NULL;
    assert_int_equal(tide_gguf_get_str_dup(g, "test.string", &s), TIDE_OK);
    assert_string_equal(s, "h\xc3\xa9llo");
    tide_free(s);
    assert_int_equal(tide_gguf_get_str_dup(g, "general.architecture", &s), TIDE_OK);
    assert_string_equal(s, "tide-test");
    tide_free(s);
    /* wrong types and absent keys name the key */
    assert_int_equal(tide_gguf_get_int(g, "test.string", &big), TIDE_E_FORMAT);
    assert_non_null(strstr(tide_ctx_last_error(ctx), "key 'test.string' is string"));
    assert_int_equal(tide_gguf_get_float(g, "test.u8", &d), TIDE_E_FORMAT);
    assert_int_equal(tide_gguf_get_bool(g, "no.such.key", &bv), TIDE_E_NOT_FOUND);
    assert_non_null(strstr(tide_ctx_last_error(ctx), "no.such.key"));

    tide_gguf_value a, e;
    struct { const char *key; tide_gguf_type et; int n; int64_t v[4]; } iarr[] = {
        {"test.arr_u8", TIDE_GGUF_U8, 3, {1, 2, 255}},
        {"test.arr_i16", TIDE_GGUF_I16, 3, {-1, 2, -3}},
        {"test.arr_i32", TIDE_GGUF_I32, 4, {7, -8, 9, -10}},
        {"test.arr_u64", TIDE_GGUF_U64, 2, {1, 1LL << 40}}};
    for (size_t i = 0; i < sizeof iarr / sizeof iarr[0]; i++) {
        assert_int_equal(tide_gguf_get_array(g, iarr[i].key, &a), TIDE_OK);
        uint64_t n;
        tide_gguf_type et;
        assert_true(tide_gguf_value_array(&a, &n, &et));
        assert_int_equal(n, iarr[i].n);
        assert_int_equal(et, iarr[i].et);
        for (int k = 0; k < iarr[i].n; k++) {
            int64_t v;
            assert_true(tide_gguf_value_elem(&a, (uint64_t)k, &e));
            assert_true(tide_gguf_value_int(&e, &v));
            assert_true(v == iarr[i].v[k]);
        }
        assert_false(tide_gguf_value_elem(&a, (uint64_t)iarr[i].n, &e));
    }
    assert_int_equal(tide_gguf_get_array(g, "test.arr_f32", &a), TIDE_OK);
    assert_true(tide_gguf_value_elem(&a, 1, &e) && tide_gguf_value_float(&e, &d) && d == -1.0);
    assert_int_equal(tide_gguf_get_array(g, "test.arr_f64", &a), TIDE_OK);
    assert_true(tide_gguf_value_elem(&a, 0, &e) && tide_gguf_value_float(&e, &d) && d == 3.0);
    assert_int_equal(tide_gguf_get_array(g, "test.arr_bool", &a), TIDE_OK);
    assert_true(tide_gguf_value_elem(&a, 1, &e) && tide_gguf_value_bool(&e, &bv) && !bv);
    assert_true(tide_gguf_value_elem(&a, 2, &e) && tide_gguf_value_bool(&e, &bv) && bv);
    assert_int_equal(tide_gguf_get_array(g, "test.arr_str", &a), TIDE_OK);
    const char *want[3] = {"a", "", "\xe2\x96\x81t\xc3\xa9"};
    for (int k = 0; k < 3; k++) {
        const char *p;
        uint64_t len;
        assert_true(tide_gguf_value_elem(&a, (uint64_t)k, &e));
        assert_true(tide_gguf_value_str(&e, &p, &len));
        assert_int_equal(len, strlen(want[k]));
        assert_memory_equal(p, want[k], len);
    }
    assert_int_equal(tide_gguf_get_array(g, "test.nested", &a), TIDE_OK);
    assert_int_equal(a.n, 2);
    assert_int_equal(a.elem_type, TIDE_GGUF_ARRAY);
    tide_gguf_value in;
    int64_t iv;
    assert_true(tide_gguf_value_elem(&a, 0, &in) && in.n == 2);
    assert_true(tide_gguf_value_elem(&in, 1, &e) && tide_gguf_value_int(&e, &iv) && iv == 2);
    assert_true(tide_gguf_value_elem(&a, 1, &in) && in.n == 1);
    assert_true(tide_gguf_value_elem(&in, 0, &e) && tide_gguf_value_int(&e, &iv) && iv == 3);
    assert_int_equal(tide_gguf_get_array(g, "test.nested_str", &a), TIDE_OK);
    assert_true(tide_gguf_value_elem(&a, 0, &in) && in.n == 2);
    const char *p;
    uint64_t len;
    assert_true(tide_gguf_value_elem(&in, 1, &e) && tide_gguf_value_str(&e, &p, &len));
    assert_true(len == 2 && !memcmp(p, "yy", 2));
    assert_true(tide_gguf_value_elem(&a, 1, &in) && tide_gguf_value_elem(&in, 0, &e) &&
                tide_gguf_value_str(&e, &p, &len) && len == 3 && !memcmp(p, "zzz", 3));

    /* every key in file order, found again by name */
    for (int64_t i = 0; i < tide_gguf_n_kv(g); i++) {
        const char *key;
        assert_true(tide_gguf_kv(g, i, &key, &e));
        assert_int_equal(tide_gguf_find_key(g, key), i);
    }
    assert_false(tide_gguf_kv(g, tide_gguf_n_kv(g), NULL, &e));

    struct { const char *name; tide_dtype dt; uint64_t ne0, ne1, nbytes; } ts[] = {
        {"t.f32", TIDE_F32, 4, 3, 48},     {"t.f16", TIDE_F16, 8, 2, 32},      {"t.bf16", TIDE_BF16, 5, 1, 10},
        {"t.q8_0", TIDE_Q8_0, 32, 2, 68},  {"t.q4_0", TIDE_Q4_0, 32, 2, 36},   {"t.q4_k", TIDE_Q4_K, 256, 2, 288},
        {"t.q5_k", TIDE_Q5_K, 256, 2, 352}, {"t.q6_k", TIDE_Q6_K, 256, 2, 420}};
    assert_int_equal(tide_gguf_n_tensors(g), 8);
    for (size_t i = 0; i < 8; i++) {
        int64_t k = tide_gguf_find_tensor(g, ts[i].name);
        assert_true(k >= 0);
        const tide_gguf_tensor *t = tide_gguf_tensor_at(g, k);
        assert_int_equal(t->dtype, ts[i].dt);
        assert_int_equal(t->ne[0], ts[i].ne0);
        assert_int_equal(t->ne[1], ts[i].ne1);
        assert_int_equal(t->nbytes, ts[i].nbytes);
        assert_int_equal(t->offset % 64, 0);
        assert_int_equal(t->file_offset, tide_gguf_data_start(g) + t->offset);
    }
    assert_int_equal(tide_gguf_find_tensor(g, "t.none"), -1);
    assert_null(tide_gguf_tensor_at(g, 8));
    tide_gguf_close(g);
    tide_ctx_free(ctx);
}

/* Each kind of damage to the good file. */
static void test_damaged(void **state) {
    layout L;
    buf g0 = good_file(&L);
    buf b = {0};
#define FRESH() (b.n = 0, put(&b, g0.p, g0.n))
    FRESH();
    expect_open(&b, TIDE_OK, NULL);

    FRESH(), b.p[0] = 'X';
    expect_open(&b, TIDE_E_FORMAT, "not a GGUF file", NULL);
    FRESH(), set_u32(&b, L.version, 7);
    expect_open(&b, TIDE_E_FORMAT, "unknown GGUF version 7", NULL);
    FRESH(), set_u32(&b, L.version, 1);
    expect_open(&b, TIDE_E_UNSUPPORTED, "version 1", NULL);
    FRESH(), set_u32(&b, L.version, 0x03000000);
    expect_open(&b, TIDE_E_UNSUPPORTED, "big-endian", NULL);
    /* truncated: inside the fixed header, then inside the metadata */
    FRESH(), b.n = 20;
    expect_open(&b, TIDE_E_FORMAT, "truncated", NULL);
    FRESH(), b.n = 30;
    expect_open(&b, TIDE_E_FORMAT, "metadata count 6 cannot fit", NULL);
    FRESH(), b.n = L.str_len + 6;
    expect_open(&b, TIDE_E_FORMAT, "metadata count 6 cannot fit", "truncated", NULL);
    FRESH(), b.n = L.strs_len1 + 4;
    expect_open(&b, TIDE_E_FORMAT, "key 'test.strs'", "past the end", NULL);
    FRESH(), b.n = L.t_off[1] + 3;
    expect_open(&b, TIDE_E_FORMAT, "tensor 'b'", "truncated", NULL);
    /* lengths past the end */
    FRESH(), set_u64(&b, L.str_len, 1u << 20);
    expect_open(&b, TIDE_E_FORMAT, "key 'general.name'", "string length 1048576 past the end", NULL);
    FRESH(), set_u64(&b, L.str_len, UINT64_MAX);
    expect_open(&b, TIDE_E_FORMAT, "key 'general.name'", "past the end", NULL);
    FRESH(), set_u64(&b, L.key2, UINT64_MAX - 3);
    expect_open(&b, TIDE_E_FORMAT, "key 1", "name length", NULL);
    FRESH(), set_u64(&b, L.key2, 0);
    expect_open(&b, TIDE_E_FORMAT, "key 1 has an empty name", NULL);
    FRESH(), b.p[L.key2 + 8 + 3] = 0;
    expect_open(&b, TIDE_E_FORMAT, "NUL", NULL);
    FRESH(), set_u64(&b, L.arr_count, 1000);
    expect_open(&b, TIDE_E_FORMAT, "key 'test.ints'", "array of 1000 i32 elements past the end", NULL);
    FRESH(), set_u64(&b, L.arr_count, UINT64_MAX / 2);
    expect_open(&b, TIDE_E_FORMAT, "key 'test.ints'", "past the end", NULL);
    FRESH(), set_u64(&b, L.strs_len1, 1u << 30);
    expect_open(&b, TIDE_E_FORMAT, "key 'test.strs' (array element 1)", "string length", NULL);
    FRESH(), set_u32(&b, L.arr_count - 4, 13);
    expect_open(&b, TIDE_E_FORMAT, "key 'test.ints'", "unknown element type 13", NULL);
    FRESH(), set_u32(&b, L.str_len - 4, 99);
    expect_open(&b, TIDE_E_FORMAT, "key 'general.name'", "unknown value type 99", NULL);
    /* counts */
    FRESH(), set_u64(&b, L.n_kv, UINT64_MAX);
    expect_open(&b, TIDE_E_FORMAT, "metadata count", NULL);
    FRESH(), set_u64(&b, L.n_tensors, (uint64_t)1 << 62);
    expect_open(&b, TIDE_E_FORMAT, "tensor count", NULL);
    FRESH(), set_u64(&b, L.n_kv, 7);
    expect_open(&b, TIDE_E_FORMAT, NULL); /* reads the tensor table as a key */
    /* alignment */
    FRESH(), set_u32(&b, L.align_val, 48);
    expect_open(&b, TIDE_E_FORMAT, "general.alignment", "not a power of two", NULL);
    FRESH(), set_u32(&b, L.align_val - 4, TIDE_GGUF_I32);
    expect_open(&b, TIDE_E_FORMAT, "general.alignment", "expected u32", NULL);
    /* tensors */
    FRESH(), set_u64(&b, L.t_off[1], 4096);
    expect_open(&b, TIDE_E_FORMAT, "tensor 'b'", "past the end of the file", NULL);
    FRESH(), set_u64(&b, L.t_off[1], UINT64_MAX - 31);
    expect_open(&b, TIDE_E_FORMAT, "tensor 'b'", "past the end of the file", NULL);
    FRESH(), set_u64(&b, L.t_off[1], 48);
    expect_open(&b, TIDE_E_FORMAT, "tensor 'b'", "not a multiple of the alignment", NULL);
    FRESH(), set_u64(&b, L.t_off[1], 32);
    expect_open(&b, TIDE_E_FORMAT, "tensors 'a' and 'b' overlap", NULL);
    FRESH(), set_u32(&b, L.t_type[1], 3);
    expect_open(&b, TIDE_E_UNSUPPORTED, "tensor 'b'", "q4_1 (3)", NULL);
    FRESH(), set_u32(&b, L.t_type[0], 1234);
    expect_open(&b, TIDE_E_FORMAT, "tensor 'a'", "unknown ggml type 1234", NULL);
    FRESH(), set_u64(&b, L.t_ne0[1], 48);
    expect_open(&b, TIDE_E_FORMAT, "tensor 'b'", "not a whole number of q8_0 blocks", NULL);
    FRESH(), set_u64(&b, L.t_ne0[0], (uint64_t)1 << 40), set_u64(&b, L.t_ne1[0], (uint64_t)1 << 40);
    expect_open(&b, TIDE_E_FORMAT, "tensor 'a'", "overflow", NULL);
    FRESH(), set_u64(&b, L.t_ne0[0], 1u << 20);
    expect_open(&b, TIDE_E_FORMAT, "tensor 'a'", "past the end", NULL);
    FRESH(), set_u32(&b, L.t_ndims[0], 5);
    expect_open(&b, TIDE_E_FORMAT, "tensor 'a'", "5 dims", NULL);
    FRESH(), set_u32(&b, L.t_ndims[0], 0);
    expect_open(&b, TIDE_E_FORMAT, "tensor 'a'", "0 dims", NULL);
    FRESH(), b.p[L.t_name[1] + 8] = 'a';
    expect_open(&b, TIDE_E_FORMAT, "duplicate tensor name 'a'", NULL);
    {
        buf d = {0};
        put_u32(&d, TIDE_GGUF_MAGIC), put_u32(&d, 2), put_u64(&d, 0), put_u64(&d, 2);
        put_str(&d, "k"), put_u32(&d, TIDE_GGUF_U8), put(&d, "\x01", 1);
        put_str(&d, "k"), put_u32(&d, TIDE_GGUF_BOOL), put(&d, "\x01", 1);
        put(&d, "\0\0\0\0\0\0\0\0\0\0", 10);
        expect_open(&d, TIDE_E_FORMAT, "duplicate key 'k'", NULL);
        d.p[d.n - 11] = 2; /* the bool's value */
        expect_open(&d, TIDE_E_FORMAT, "key 'k'", "bool of value 2", NULL);
        /* arrays nested past the depth limit */
        d.n = 0;
        put_u32(&d, TIDE_GGUF_MAGIC), put_u32(&d, 3), put_u64(&d, 0), put_u64(&d, 1);
        put_str(&d, "deep"), put_u32(&d, TIDE_GGUF_ARRAY);
        for (int i = 0; i < TIDE_GGUF_MAX_DEPTH + 1; i++) put_u32(&d, TIDE_GGUF_ARRAY), put_u64(&d, 1);
        put_u32(&d, TIDE_GGUF_U8), put_u64(&d, 0);
        expect_open(&d, TIDE_E_FORMAT, "key 'deep'", "nested deeper", NULL);
        free(d.p);
    }
    /* every truncation of the good file fails cleanly */
    for (size_t n = 0; n < g0.n; n++) {
        FRESH(), b.n = n;
        write_file(tmp_path, &b);
        tide_ctx *ctx = tide_ctx_new();
        tide_gguf *g = NULL;
        tide_status st = tide_gguf_open(ctx, tmp_path, &g);
        if (st != TIDE_E_FORMAT) {
            print_error("cut at %zu: %s (%s)\n", n, tide_status_str(st), tide_ctx_last_error(ctx));
            fail();
        }
        tide_ctx_free(ctx);
    }
#undef FRESH
    free(b.p);
    free(g0.p);
}

/* ---------------------------------------------------------------- checkpoints */

#define REQUIRE(ctx, call)                                                                       \
    do {                                                                                         \
        tide_status st_ = (call);                                                                \
        if (st_ != TIDE_OK) {                                                                    \
            print_error("%s -> %s: %s\n", #call, tide_status_str(st_), tide_ctx_last_error(ctx)); \
            fail();                                                                              \
        }                                                                                        \
    } while (0)

/* The logits of every position of the reference prompt, and 8 greedy ids. */
static void run_model(tide_ctx *ctx, tide_checkpoint *ck, const int32_t *prompt, int n, float *logits, int32_t *gen) {
    tide_backend *be = NULL;
    REQUIRE(ctx, tide_backend_new(ctx, TIDE_BACKEND_CPU, &be));
    REQUIRE(ctx, tide_backend_set_matmul(be, TIDE_MATMUL_F32));
    tide_model_opts opts = {.max_batch = 1, .ctx_len = 0};
    tide_model *m = NULL;
    REQUIRE(ctx, tide_model_new(ctx, ck, be, &opts, &m));
    REQUIRE(ctx, tide_model_forward(m, prompt, 1, n, 0, logits));
    REQUIRE(ctx, tide_model_generate(m, prompt, n, 8, gen, NULL));
    tide_model_free(m);
    tide_backend_free(be);
}

/* The prompt of a fixture's reference.json ("prompt": [ids]). */
static int read_prompt(const char *dir, int32_t *ids, int max) {
    char path[4300];
    snprintf(path, sizeof path, "%s/reference.json", dir);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    char text[8192];
    size_t len = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[len] = 0;
    const char *p = strstr(text, "\"prompt\"");
    assert_non_null(p);
    p = strchr(p, '[');
    assert_non_null(p);
    int n = 0;
    for (p++; *p && *p != ']' && n < max;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p) {
            p++;
            continue;
        }
        ids[n++] = (int32_t)v;
        p = end;
    }
    return n;
}

/* A GGUF fixture against the safetensors checkpoint it was made from: the
 * same configuration (q/k rows in llama.cpp's order), the same tensors by
 * name, shape and dtype (the norms f32), and the same logits and greedy ids,
 * bit for bit. */
static void check_against_safetensors(const char *gguf_name, const char *st_name) {
    char gp[4200], sp[4200];
    fixture_path(gp, sizeof gp, gguf_name);
    fixture_path(sp, sizeof sp, st_name);
    tide_ctx *ctx = tide_ctx_new();
    tide_checkpoint *ck = NULL, *ref = NULL;
    REQUIRE(ctx, tide_checkpoint_open(ctx, gp, &ck));
    REQUIRE(ctx, tide_checkpoint_open(ctx, sp, &ref));
    const tide_llama_config *a = tide_checkpoint_config(ck), *b = tide_checkpoint_config(ref);
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
    /* llama.cpp permutes the q/k rows of "llama" files, not of "qwen2" ones */
    assert_true(a->qk_interleaved == !b->qkv_bias && !b->qk_interleaved);
    assert_int_equal(a->qkv_bias, b->qkv_bias);
    assert_true(a->wtypes_set);
    assert_int_equal(a->wtypes.norm, TIDE_F32);
    assert_int_equal(tide_checkpoint_n_tensors(ck), tide_checkpoint_n_tensors(ref));
    for (int i = 0; i < tide_checkpoint_n_tensors(ref); i++) {
        tide_tensor_info r, t;
        REQUIRE(ctx, tide_checkpoint_get_index(ref, i, &r));
        REQUIRE(ctx, tide_checkpoint_get(ck, r.name, &t));
        assert_int_equal(t.ndim, r.ndim);
        for (int d = 0; d < r.ndim; d++) assert_int_equal(t.shape[d], r.shape[d]);
        assert_int_equal(t.dtype, r.ndim == 1 ? TIDE_F32 : r.dtype);
        assert_int_equal(tide_llama_weight_dtype(a, r.name), t.dtype);
        assert_string_equal(t.file, gp);
        assert_ptr_equal((const unsigned char *)tide_checkpoint_tensor_file(ck, 0)->map + t.file_offset, t.data);
        /* weights other than permuted q/k are the same values (norms and biases widened) */
        if ((!a->qk_interleaved || (!strstr(r.name, "q_proj") && !strstr(r.name, "k_proj"))) && r.dtype == t.dtype)
            assert_memory_equal(t.data, r.data, r.nbytes);
    }
    char dir[4200];
    fixture_path(dir, sizeof dir, st_name);
    int32_t prompt[64], g1[8], g2[8];
    int n = read_prompt(dir, prompt, 64);
    assert_true(n > 0);
    size_t nl = (size_t)n * (size_t)a->vocab_size;
    float *l1 = calloc(nl, sizeof *l1), *l2 = calloc(nl, sizeof *l2);
    assert_non_null(l1);
    assert_non_null(l2);
    run_model(ctx, ck, prompt, n, l1, g1);
    run_model(ctx, ref, prompt, n, l2, g2);
    size_t diff = 0;
    for (size_t i = 0; i < nl; i++) diff += memcmp(&l1[i], &l2[i], sizeof *l1) != 0;
    printf("  %-28s %zu logits, %zu differ from %s's; greedy ids %s\n", gguf_name, nl, diff, st_name,
           memcmp(g1, g2, sizeof g1) ? "DIFFER" : "equal");
    assert_int_equal(diff, 0);
    assert_memory_equal(g1, g2, sizeof g1);
    free(l1);
    free(l2);
    tide_checkpoint_free(ck);
    tide_checkpoint_free(ref);
    tide_ctx_free(ctx);
}

static void test_f32_logits(void **state) { check_against_safetensors("gguf/tiny-f32-mha.gguf", "tiny-f32-mha"); }
static void test_f16_logits(void **state) {
    check_against_safetensors("gguf/tiny-f16-sharded.gguf", "tiny-f16-sharded");
}
/* Qwen2: bf16 matrices, f32 norms and q/k/v biases, rows in Hugging Face's order */
static void test_qwen2_logits(void **state) { check_against_safetensors("gguf/tiny-qwen2.gguf", "tiny-qwen2"); }

/* The Q8_0 file: the matrices q8_0, the norms f32, the config's dtype the
 * projections'; its logits near the f16 model's. */
static void test_q8_0_opens(void **state) {
    char gp[4200];
    fixture_path(gp, sizeof gp, "gguf/tiny-f16-sharded-q8_0.gguf");
    tide_ctx *ctx = tide_ctx_new();
    tide_checkpoint *ck = NULL;
    REQUIRE(ctx, tide_checkpoint_open(ctx, gp, &ck));
    const tide_llama_config *c = tide_checkpoint_config(ck);
    assert_int_equal(c->dtype, TIDE_Q8_0);
    assert_int_equal(c->wtypes.norm, TIDE_F32);
    assert_int_equal(c->wtypes.embed, TIDE_Q8_0);
    assert_int_equal(c->wtypes.head, TIDE_Q8_0);
    tide_tensor_info t;
    REQUIRE(ctx, tide_checkpoint_get(ck, "model.layers.1.mlp.down_proj.weight", &t));
    assert_int_equal(t.dtype, TIDE_Q8_0);
    assert_int_equal(t.shape[0], 64);
    assert_int_equal(t.shape[1], 128);
    assert_int_equal(t.nbytes, 64 * (128 / 32) * 34);
    REQUIRE(ctx, tide_checkpoint_get(ck, "model.layers.0.input_layernorm.weight", &t));
    assert_int_equal(t.dtype, TIDE_F32);
    assert_int_equal(tide_llama_weight_dtype(c, "model.layers.0.self_attn.k_proj.weight"), TIDE_Q8_0);

    /* its logits against the f16 model it was quantized from: within 0.4
     * of logits up to about 5 (Q8_0 keeps each weight to about 1/254 of its
     * block's largest, and the CPU rounds the activations to 8 bits per
     * block; measured 0.28), and the 8 greedy ids the same (the quantized
     * kernels' bits are the same on every path, so this cannot flake) */
    char sp[4200];
    fixture_path(sp, sizeof sp, "tiny-f16-sharded");
    tide_checkpoint *ref = NULL;
    REQUIRE(ctx, tide_checkpoint_open(ctx, sp, &ref));
    int32_t prompt[64], g1[8], g2[8];
    int n = read_prompt(sp, prompt, 64);
    assert_true(n > 0);
    size_t nl = (size_t)n * (size_t)c->vocab_size;
    float *l1 = calloc(nl, sizeof *l1), *l2 = calloc(nl, sizeof *l2);
    assert_non_null(l1);
    assert_non_null(l2);
    run_model(ctx, ck, prompt, n, l1, g1);
    run_model(ctx, ref, prompt, n, l2, g2);
    double worst = 0, amax = 0;
    for (size_t i = 0; i < nl; i++) {
        worst = fmax(worst, fabs((double)l1[i] - (double)l2[i]));
        amax = fmax(amax, fabs((double)l2[i]));
    }
    int same = 0;
    while (same < 8 && g1[same] == g2[same]) same++;
    printf("  q8_0 against f16: worst logit error %.4f (largest logit %.2f), first %d of 8 greedy ids equal\n",
           worst, amax, same);
    assert_true(worst <= 0.4);
    assert_int_equal(same, 8);
    free(l1);
    free(l2);
    tide_checkpoint_free(ref);
    tide_checkpoint_free(ck);
    tide_ctx_free(ctx);
}

/* A rewrite of a GGUF file (read with the reader, written again) with edits. */
typedef struct edits {
    const char *drop_key;
    const char *set_key; /* set to one of: */
    uint32_t set_type;   /* TIDE_GGUF_U32, _F32 or _STRING */
    uint32_t u32;
    float f32;
    const char *str;
    const char *arch_to; /* every "llama." key renamed to arch_to + "." */
    const char *rename_from, *rename_to;
    const char *drop_tensor;
    const char *dup_from, *dup_to; /* one more tensor: dup_from's data under another name */
    const char *src;               /* the fixture rewritten (default gguf/tiny-f32-mha.gguf) */
} edits;

static void put_value(buf *b, const tide_gguf_value *v) {
    const unsigned char *map = tide_gguf_map(v->g);
    if (v->type == TIDE_GGUF_STRING) {
        put_u64(b, v->n);
        put(b, map + v->off, (size_t)v->n);
    } else if (v->type == TIDE_GGUF_ARRAY) {
        put_u32(b, v->elem_type);
        put_u64(b, v->n);
        for (uint64_t i = 0; i < v->n; i++) {
            tide_gguf_value e;
            assert_true(tide_gguf_value_elem(v, i, &e));
            put_value(b, &e);
        }
    } else {
        static const int sz[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
        put(b, map + v->off, (size_t)sz[v->type]);
    }
}

static void put_set_value(buf *b, const edits *e) {
    put_u32(b, e->set_type);
    if (e->set_type == TIDE_GGUF_U32) put_u32(b, e->u32);
    else if (e->set_type == TIDE_GGUF_F32) {
        uint32_t u;
        memcpy(&u, &e->f32, 4);
        put_u32(b, u);
    } else put_str(b, e->str);
}

static buf rewrite(const char *src, const edits *e) {
    tide_ctx *ctx = tide_ctx_new();
    tide_gguf *g = NULL;
    REQUIRE(ctx, tide_gguf_open(ctx, src, &g));
    buf b = {0};
    put_u32(&b, TIDE_GGUF_MAGIC);
    put_u32(&b, 3);
    int64_t nt = tide_gguf_n_tensors(g), nk = tide_gguf_n_kv(g);
    bool set_new = e->set_key && tide_gguf_find_key(g, e->set_key) < 0;
    put_u64(&b, (uint64_t)(nt - (e->drop_tensor ? 1 : 0) + (e->dup_from ? 1 : 0)));
    put_u64(&b, (uint64_t)(nk - (e->drop_key ? 1 : 0) + (set_new ? 1 : 0)));
    for (int64_t i = 0; i < nk; i++) {
        const char *key;
        tide_gguf_value v;
        tide_gguf_kv(g, i, &key, &v);
        if (e->drop_key && !strcmp(key, e->drop_key)) continue;
        char name[256];
        if (e->arch_to && !strncmp(key, "llama.", 6)) snprintf(name, sizeof name, "%s.%s", e->arch_to, key + 6);
        else snprintf(name, sizeof name, "%s", key);
        put_str(&b, name);
        if (e->set_key && !strcmp(key, e->set_key)) {
            put_set_value(&b, e);
            continue;
        }
        put_u32(&b, v.type);
        put_value(&b, &v);
    }
    if (set_new) {
        put_str(&b, e->set_key);
        put_set_value(&b, e);
    }
    for (int64_t i = 0; i <= nt; i++) {
        const tide_gguf_tensor *t = tide_gguf_tensor_at(g, i < nt ? i : tide_gguf_find_tensor(g, e->dup_from));
        if (i == nt && !e->dup_from) break;
        if (e->drop_tensor && !strcmp(t->name, e->drop_tensor)) continue;
        put_str(&b, i == nt ? e->dup_to : e->rename_from && !strcmp(t->name, e->rename_from) ? e->rename_to : t->name);
        put_u32(&b, (uint32_t)t->n_dims);
        for (int d = 0; d < t->n_dims; d++) put_u64(&b, t->ne[d]);
        put_u32(&b, t->ggml_type);
        /* the duplicate's data: a copy after the data section */
        uint64_t a = tide_gguf_alignment(g), data_len = tide_gguf_size(g) - tide_gguf_data_start(g);
        put_u64(&b, i == nt ? (data_len + a - 1) / a * a : t->offset);
    }
    while (b.n % tide_gguf_alignment(g)) put(&b, "", 1);
    size_t data0 = b.n;
    put(&b, tide_gguf_map(g) + tide_gguf_data_start(g), (size_t)(tide_gguf_size(g) - tide_gguf_data_start(g)));
    if (e->dup_from) {
        const tide_gguf_tensor *t = tide_gguf_tensor_at(g, tide_gguf_find_tensor(g, e->dup_from));
        while ((b.n - data0) % tide_gguf_alignment(g)) put(&b, "", 1);
        put(&b, tide_gguf_tensor_data(g, t), (size_t)t->nbytes);
    }
    tide_gguf_close(g);
    tide_ctx_free(ctx);
    return b;
}

/* The rewritten fixture opened as a checkpoint: status want, a message with
 * the needles. */
static void expect_ck(const edits *e, tide_status want, const char *n1, const char *n2) {
    char src[4200];
    fixture_path(src, sizeof src, e->src ? e->src : "gguf/tiny-f32-mha.gguf");
    buf b = rewrite(src, e);
    write_file(tmp_path, &b);
    free(b.p);
    tide_ctx *ctx = tide_ctx_new();
    tide_checkpoint *ck = (tide_checkpoint *)1;
    tide_status st = tide_checkpoint_open(ctx, tmp_path, &ck);
    const char *msg = tide_ctx_last_error(ctx);
    if (st != want) {
        print_error("status %s, expected %s: %s\n", tide_status_str(st), tide_status_str(want), msg);
        fail();
    }
    if (!st) {
        tide_checkpoint_free(ck);
    } else {
        assert_null(ck);
        const char *need[3] = {tmp_path, n1, n2};
        for (int i = 0; i < 3; i++)
            if (need[i] && !strstr(msg, need[i])) {
                print_error("message \"%s\" lacks \"%s\"\n", msg, need[i]);
                fail();
            }
    }
    tide_ctx_free(ctx);
}

static void test_model_refusals(void **state) {
    edits none = {0};
    expect_ck(&none, TIDE_OK, NULL, NULL); /* the rewrite itself is faithful */
    edits e;
#define E(...) (e = (edits){__VA_ARGS__}, &e)
    expect_ck(E(.set_key = "llama.attention.head_count_kv", .set_type = TIDE_GGUF_U32, .u32 = 3), TIDE_E_FORMAT,
              "inconsistent head counts", "head_count_kv 3");
    expect_ck(E(.set_key = "llama.attention.head_count", .set_type = TIDE_GGUF_U32, .u32 = 5), TIDE_E_FORMAT,
              "inconsistent head counts", NULL);
    expect_ck(E(.set_key = "general.architecture", .set_type = TIDE_GGUF_STRING, .str = "phi3"),
              TIDE_E_UNSUPPORTED, "general.architecture", "'phi3'");
    expect_ck(E(.drop_key = "general.architecture"), TIDE_E_FORMAT, "no key 'general.architecture'", NULL);
    expect_ck(E(.rename_from = "blk.1.ffn_up.weight", .rename_to = "blk.01.ffn_up.weight"), TIDE_OK, NULL, NULL);
    expect_ck(E(.dup_from = "blk.1.ffn_up.weight", .dup_to = "blk.01.ffn_up.weight"), TIDE_E_FORMAT,
              "'blk.1.ffn_up.weight' and 'blk.01.ffn_up.weight' are the same weight", NULL);
    expect_ck(E(.drop_key = "llama.block_count"), TIDE_E_FORMAT, "no key 'llama.block_count'", NULL);
    expect_ck(E(.set_key = "llama.embedding_length", .set_type = TIDE_GGUF_STRING, .str = "64"), TIDE_E_FORMAT,
              "llama.embedding_length", "string");
    expect_ck(E(.set_key = "llama.block_count", .set_type = TIDE_GGUF_U32, .u32 = 1), TIDE_E_FORMAT,
              "'blk.1.", "block_count is 1");
    expect_ck(E(.set_key = "llama.block_count", .set_type = TIDE_GGUF_U32, .u32 = 3), TIDE_E_FORMAT,
              "'blk.2.attn_norm.weight' (model.layers.2.input_layernorm.weight) is missing", NULL);
    expect_ck(E(.drop_tensor = "blk.1.ffn_down.weight"), TIDE_E_FORMAT,
              "'blk.1.ffn_down.weight' (model.layers.1.mlp.down_proj.weight) is missing", NULL);
    expect_ck(E(.drop_tensor = "token_embd.weight"), TIDE_E_FORMAT, "token_embd.weight", "missing");
    expect_ck(E(.set_key = "llama.feed_forward_length", .set_type = TIDE_GGUF_U32, .u32 = 128), TIDE_E_FORMAT,
              "(model.layers.0.mlp.", "the metadata implies");
    expect_ck(E(.set_key = "llama.vocab_size", .set_type = TIDE_GGUF_U32, .u32 = 300), TIDE_E_FORMAT,
              "llama.vocab_size 300", NULL);
    expect_ck(E(.set_key = "llama.rope.dimension_count", .set_type = TIDE_GGUF_U32, .u32 = 8), TIDE_E_UNSUPPORTED,
              "llama.rope.dimension_count 8", NULL);
    expect_ck(E(.set_key = "llama.rope.scaling.type", .set_type = TIDE_GGUF_STRING, .str = "linear"),
              TIDE_E_UNSUPPORTED, "llama.rope.scaling.type", "rope scaling");
    expect_ck(E(.set_key = "llama.rope.scaling.type", .set_type = TIDE_GGUF_STRING, .str = "none"), TIDE_OK, NULL,
              NULL);
    expect_ck(E(.set_key = "llama.rope.scaling.factor", .set_type = TIDE_GGUF_F32, .f32 = 8.0f), TIDE_E_UNSUPPORTED,
              "llama.rope.scaling.factor", NULL);
    expect_ck(E(.set_key = "llama.rope.freq_base", .set_type = TIDE_GGUF_F32, .f32 = -1.0f), TIDE_E_FORMAT,
              "llama.rope.freq_base", NULL);
    expect_ck(E(.rename_from = "output_norm.weight", .rename_to = "rope_freqs.weight"), TIDE_E_UNSUPPORTED,
              "'rope_freqs.weight'", NULL);
    expect_ck(E(.rename_from = "blk.0.ffn_up.weight", .rename_to = "blk.0.ffn_upx.weight"), TIDE_E_UNSUPPORTED,
              "'blk.0.ffn_upx.weight'", NULL);
    /* a bias in a "llama" file; in a "qwen2" file (test_qwen2_logits opens a good one): its q, k and v biases
     * required, other biases refused by name */
    expect_ck(E(.rename_from = "blk.0.attn_norm.weight", .rename_to = "blk.0.attn_q.bias"), TIDE_E_UNSUPPORTED,
              "'blk.0.attn_q.bias'", "only qwen2 has q, k and v biases");
    expect_ck(E(.set_key = "general.architecture", .set_type = TIDE_GGUF_STRING, .str = "qwen2"), TIDE_E_FORMAT,
              "no key 'qwen2.", NULL);
    expect_ck(E(.set_key = "general.architecture", .set_type = TIDE_GGUF_STRING, .str = "qwen2", .arch_to = "qwen2"),
              TIDE_E_FORMAT, "'blk.0.attn_q.bias' (model.layers.0.self_attn.q_proj.bias) is missing", NULL);
    expect_ck(E(.src = "gguf/tiny-qwen2.gguf", .drop_tensor = "blk.1.attn_v.bias"), TIDE_E_FORMAT,
              "'blk.1.attn_v.bias' (model.layers.1.self_attn.v_proj.bias) is missing", NULL);
    expect_ck(E(.src = "gguf/tiny-qwen2.gguf", .rename_from = "blk.1.attn_v.bias", .rename_to = "blk.1.ffn_up.bias"),
              TIDE_E_UNSUPPORTED, "'blk.1.ffn_up.bias'", "only q, k and v");
    expect_ck(E(.src = "gguf/tiny-qwen2.gguf", .rename_from = "blk.0.attn_k.bias", .rename_to = "blk.0.attn_q.bias"),
              TIDE_E_FORMAT, "duplicate tensor name 'blk.0.attn_q.bias'", NULL);
    expect_ck(E(.src = "gguf/tiny-qwen2.gguf"), TIDE_OK, NULL, NULL);
#undef E
    tide_ctx *ctx = tide_ctx_new();
    tide_checkpoint *ck = NULL;
    /* a file that is not GGUF, and a directory as before */
    buf junk = {0};
    put(&junk, "not a model at all, just text\n", 30);
    write_file(tmp_path, &junk);
    free(junk.p);
    assert_int_equal(tide_checkpoint_open(ctx, tmp_path, &ck), TIDE_E_FORMAT);
    assert_non_null(strstr(tide_ctx_last_error(ctx), "not a GGUF file"));
    tide_ctx_free(ctx);
}

static void test_not_found(void **state) {
    tide_ctx *ctx = tide_ctx_new();
    tide_gguf *g = NULL;
    assert_int_equal(tide_gguf_open(ctx, "/nonexistent/x.gguf", &g), TIDE_E_NOT_FOUND);
    assert_null(g);
    assert_non_null(strstr(tide_ctx_last_error(ctx), "/nonexistent/x.gguf"));
    tide_ctx_free(ctx);
}

int main(void) {
    const char *fx = getenv("TIDE_FIXTURES");
    if (!fx) {
        fprintf(stderr, "test_gguf: TIDE_FIXTURES is not set (ctest sets it to tests/fixtures)\n");
        return 1;
    }
    snprintf(fixtures, sizeof fixtures, "%s", fx);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_good_built, setup_tmp, teardown_tmp),
        cmocka_unit_test(test_meta_fixture),
        cmocka_unit_test_setup_teardown(test_damaged, setup_tmp, teardown_tmp),
        cmocka_unit_test(test_not_found),
        cmocka_unit_test(test_f32_logits),
        cmocka_unit_test(test_f16_logits),
        cmocka_unit_test(test_qwen2_logits),
        cmocka_unit_test(test_q8_0_opens),
        cmocka_unit_test_setup_teardown(test_model_refusals, setup_tmp, teardown_tmp),
    };
    return cmocka_run_group_tests_name("gguf", tests, NULL, NULL);
}
