/*
 * gguf_write.c - the GGUF v3 writer (gguf_write.h): metadata and tensor
 * descriptions gathered in memory, then streamed to an atomic file with the
 * tensors' data from the caller's callback.
 */
#include "model/gguf_write.h"

#include "model/quant_mix.h"

#include <errno.h>
#include <string.h>

typedef struct gguf_tensor {
    char *name;
    tide_dtype dt;
    int ndim;
    int64_t dims[4];
    uint64_t bytes, offset;
} gguf_tensor;

struct tide_gguf_out {
    tide_strbuf kv; /* the key-value pairs, encoded */
    uint64_t n_kv;
    gguf_tensor *t;
    int n, cap;
    tide_status err;  /* first failure of building (TIDE_OK: none) */
    char err_msg[256];
    uint64_t data_bytes;
};

struct tide_gguf_sink {
    tide_ctx *ctx;
    FILE *fp;
    const char *path;
    uint64_t written, want;
    int tensor;
    const char *name;
};

tide_gguf_out *tide_gguf_new(void) { return tide_calloc(1, sizeof(tide_gguf_out)); }

void tide_gguf_free(tide_gguf_out *g) {
    if (!g) return;
    for (int i = 0; i < g->n; i++) tide_free(g->t[i].name);
    tide_free(g->t);
    tide_free(g->kv.p);
    tide_free(g);
}

static void fail(tide_gguf_out *g, tide_status st, const char *msg) {
    if (g->err != TIDE_OK) return;
    g->err = st;
    snprintf(g->err_msg, sizeof g->err_msg, "%s", msg);
}

static void put_u32(tide_strbuf *b, uint32_t v) {
    uint8_t le[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    tide_strbuf_add(b, (const char *)le, 4);
}
static void put_u64(tide_strbuf *b, uint64_t v) {
    uint8_t le[8];
    for (int i = 0; i < 8; i++) le[i] = (uint8_t)(v >> (8 * i));
    tide_strbuf_add(b, (const char *)le, 8);
}
static void put_str(tide_strbuf *b, const char *s, size_t n) {
    put_u64(b, n);
    tide_strbuf_add(b, s, n);
}
static void key(tide_gguf_out *g, const char *k, uint32_t type) {
    put_str(&g->kv, k, strlen(k));
    put_u32(&g->kv, type);
    g->n_kv++;
    if (g->kv.oom) fail(g, TIDE_E_NOMEM, "out of memory building the GGUF metadata");
}

void tide_gguf_kv_str(tide_gguf_out *g, const char *k, const char *val) {
    key(g, k, TIDE_GGUF_STRING);
    put_str(&g->kv, val, strlen(val));
}
void tide_gguf_kv_u32(tide_gguf_out *g, const char *k, uint32_t val) {
    key(g, k, TIDE_GGUF_U32);
    put_u32(&g->kv, val);
}
void tide_gguf_kv_i32(tide_gguf_out *g, const char *k, int32_t val) {
    key(g, k, TIDE_GGUF_I32);
    put_u32(&g->kv, (uint32_t)val);
}
void tide_gguf_kv_f32(tide_gguf_out *g, const char *k, float val) {
    uint32_t u;
    memcpy(&u, &val, 4);
    key(g, k, TIDE_GGUF_F32);
    put_u32(&g->kv, u);
}
void tide_gguf_kv_bool(tide_gguf_out *g, const char *k, bool val) {
    key(g, k, TIDE_GGUF_BOOL);
    char c = val ? 1 : 0;
    tide_strbuf_add(&g->kv, &c, 1);
}
void tide_gguf_kv_str_array(tide_gguf_out *g, const char *k, const char *const *vals, const uint32_t *lens,
                            uint64_t n) {
    key(g, k, TIDE_GGUF_ARRAY);
    put_u32(&g->kv, TIDE_GGUF_STRING);
    put_u64(&g->kv, n);
    for (uint64_t i = 0; i < n; i++) put_str(&g->kv, vals[i], lens ? lens[i] : strlen(vals[i]));
    if (g->kv.oom) fail(g, TIDE_E_NOMEM, "out of memory building the GGUF metadata");
}
void tide_gguf_kv_f32_array(tide_gguf_out *g, const char *k, const float *vals, uint64_t n) {
    key(g, k, TIDE_GGUF_ARRAY);
    put_u32(&g->kv, TIDE_GGUF_F32);
    put_u64(&g->kv, n);
    for (uint64_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &vals[i], 4);
        put_u32(&g->kv, u);
    }
    if (g->kv.oom) fail(g, TIDE_E_NOMEM, "out of memory building the GGUF metadata");
}
void tide_gguf_kv_i32_array(tide_gguf_out *g, const char *k, const int32_t *vals, uint64_t n) {
    key(g, k, TIDE_GGUF_ARRAY);
    put_u32(&g->kv, TIDE_GGUF_I32);
    put_u64(&g->kv, n);
    for (uint64_t i = 0; i < n; i++) put_u32(&g->kv, (uint32_t)vals[i]);
    if (g->kv.oom) fail(g, TIDE_E_NOMEM, "out of memory building the GGUF metadata");
}

/* The end (file offset) of a value's payload that starts at v->off. */
static uint64_t value_end(const tide_gguf_value *v) {
    static const uint8_t size[TIDE_GGUF_TYPE_COUNT] = {
        [TIDE_GGUF_U8] = 1, [TIDE_GGUF_I8] = 1, [TIDE_GGUF_U16] = 2, [TIDE_GGUF_I16] = 2, [TIDE_GGUF_U32] = 4,
        [TIDE_GGUF_I32] = 4, [TIDE_GGUF_F32] = 4, [TIDE_GGUF_BOOL] = 1, [TIDE_GGUF_U64] = 8, [TIDE_GGUF_I64] = 8,
        [TIDE_GGUF_F64] = 8};
    if (v->type == TIDE_GGUF_STRING) return v->off + v->n;
    if (v->type != TIDE_GGUF_ARRAY) return v->off + size[v->type];
    if (v->n == 0) return v->off;
    if (v->elem_type != TIDE_GGUF_STRING && v->elem_type != TIDE_GGUF_ARRAY)
        return v->off + v->n * size[v->elem_type];
    tide_gguf_value last;
    if (!tide_gguf_value_elem(v, v->n - 1, &last)) return v->off;
    return value_end(&last);
}

void tide_gguf_kv_copy(tide_gguf_out *g, const char *k, const tide_gguf_value *v) {
    /* the payload as the file holds it: a string's u64 length, an array's u32
     * element type and u64 count precede v->off */
    uint64_t start = v->off - (v->type == TIDE_GGUF_STRING ? 8 : v->type == TIDE_GGUF_ARRAY ? 12 : 0);
    uint64_t end = value_end(v);
    key(g, k, (uint32_t)v->type);
    tide_strbuf_add(&g->kv, (const char *)tide_gguf_map(v->g) + start, (size_t)(end - start));
    if (g->kv.oom) fail(g, TIDE_E_NOMEM, "out of memory building the GGUF metadata");
}

static uint64_t align_up(uint64_t v) { return (v + TIDE_GGUF_ALIGNMENT - 1) / TIDE_GGUF_ALIGNMENT * TIDE_GGUF_ALIGNMENT; }

int tide_gguf_add_tensor(tide_gguf_out *g, const char *name, tide_dtype dt, int ndim, const int64_t *dims) {
    char msg[200];
    if (tide_ggml_type(dt) < 0 || ndim < 1 || ndim > 4) {
        snprintf(msg, sizeof msg, "tensor %s: type %s or %d dimensions not writable to GGUF", name,
                 tide_dtype_name(dt), ndim);
        fail(g, TIDE_E_INVALID, msg);
        return -1;
    }
    uint64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= (uint64_t)dims[d];
    uint64_t bytes = tide_dtype_bytes(dt, n);
    if (dims[0] % tide_dtype_block(dt) != 0 || (n && !bytes)) {
        snprintf(msg, sizeof msg, "tensor %s: rows of %lld elements are not whole %s blocks", name,
                 (long long)dims[0], tide_dtype_name(dt));
        fail(g, TIDE_E_INVALID, msg);
        return -1;
    }
    if (tide_grow((void **)&g->t, &g->cap, g->n + 1, sizeof *g->t) != 0 || !(g->t[g->n].name = tide_strdup(name))) {
        fail(g, TIDE_E_NOMEM, "out of memory building the GGUF tensor list");
        return -1;
    }
    gguf_tensor *t = &g->t[g->n];
    t->dt = dt;
    t->ndim = ndim;
    memcpy(t->dims, dims, sizeof(int64_t) * (size_t)ndim);
    t->bytes = bytes;
    t->offset = g->data_bytes;
    g->data_bytes = align_up(g->data_bytes + bytes);
    return g->n++;
}

uint64_t tide_gguf_out_tensor_bytes(const tide_gguf_out *g, int i) { return g->t[i].bytes; }
int tide_gguf_out_n_tensors(const tide_gguf_out *g) { return g->n; }

tide_status tide_gguf_put(tide_gguf_sink *s, const void *data, size_t n) {
    if (s->written + n > s->want)
        return tide_err(s->ctx, TIDE_E_INVALID, "GGUF '%s': tensor %s: more than its %llu bytes written", s->path,
                        s->name, (unsigned long long)s->want);
    if (n && fwrite(data, 1, n, s->fp) != n)
        return tide_err(s->ctx, TIDE_E_IO, "GGUF '%s': write failed in tensor %s: %s", s->path, s->name,
                        strerror(errno ? errno : EIO));
    s->written += n;
    return TIDE_OK;
}

static tide_status pad(tide_gguf_sink *s, uint64_t pos) {
    static const char zeros[TIDE_GGUF_ALIGNMENT];
    uint64_t n = align_up(pos) - pos;
    if (n && fwrite(zeros, 1, n, s->fp) != n)
        return tide_err(s->ctx, TIDE_E_IO, "GGUF '%s': write failed: %s", s->path, strerror(errno ? errno : EIO));
    return TIDE_OK;
}

tide_status tide_gguf_write(tide_ctx *ctx, tide_gguf_out *g, const char *path, tide_gguf_data_fn data, void *user) {
    if (g->err != TIDE_OK) return tide_err(ctx, g->err, "GGUF '%s': %s", path, g->err_msg);
    tide_strbuf h = {0};
    tide_strbuf_add(&h, "GGUF", 4);
    put_u32(&h, 3);
    put_u64(&h, (uint64_t)g->n);
    put_u64(&h, g->n_kv);
    tide_strbuf_add(&h, g->kv.p ? g->kv.p : "", g->kv.len);
    for (int i = 0; i < g->n; i++) {
        const gguf_tensor *t = &g->t[i];
        put_str(&h, t->name, strlen(t->name));
        put_u32(&h, (uint32_t)t->ndim);
        for (int d = 0; d < t->ndim; d++) put_u64(&h, (uint64_t)t->dims[d]);
        put_u32(&h, (uint32_t)tide_ggml_type(t->dt));
        put_u64(&h, t->offset);
    }
    if (h.oom) {
        tide_free(h.p);
        return tide_err(ctx, TIDE_E_NOMEM, "GGUF '%s': out of memory building the header", path);
    }
    tide_atomic_file af;
    tide_status st = tide_file_begin(ctx, "GGUF file", path, &af);
    if (st != TIDE_OK) {
        tide_free(h.p);
        return st;
    }
    tide_gguf_sink s = {.ctx = ctx, .fp = af.fp, .path = path};
    errno = 0;
    if (fwrite(h.p, 1, h.len, af.fp) != h.len)
        st = tide_err(ctx, TIDE_E_IO, "GGUF '%s': write failed in the header: %s", path, strerror(errno ? errno : EIO));
    if (st == TIDE_OK) st = pad(&s, h.len);
    tide_free(h.p);
    for (int i = 0; i < g->n && st == TIDE_OK; i++) {
        s.written = 0;
        s.want = g->t[i].bytes;
        s.tensor = i;
        s.name = g->t[i].name;
        st = data(user, i, &s);
        if (st == TIDE_OK && s.written != s.want)
            st = tide_err(ctx, TIDE_E_INVALID, "GGUF '%s': tensor %s: %llu of its %llu bytes written", path, s.name,
                          (unsigned long long)s.written, (unsigned long long)s.want);
        if (st == TIDE_OK) st = pad(&s, g->t[i].offset + s.want);
    }
    if (st != TIDE_OK) {
        tide_file_abort(&af);
        return st;
    }
    return tide_file_commit(&af);
}
