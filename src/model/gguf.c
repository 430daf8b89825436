/*
 * gguf.c - the GGUF reader (model/gguf.h gives the format and what is
 * checked). The file is mapped read-only and parsed with a cursor that
 * checks every length against the bytes left before it moves; counts are
 * bounded by the bytes their smallest elements would need, so that a count
 * can neither overflow a product nor make us allocate beyond the file's size
 * times a small factor. Arrays of strings and of arrays get an index of their
 * elements at open, so element access is constant time.
 */
#include "model/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define NAME_MAX_BYTES 65535u /* the GGUF specification's limit for keys; names too */
#define SHOW 200              /* bytes of a key or name quoted in a message */

typedef struct kv_entry {
    char *key;
    tide_gguf_value v;
} kv_entry;

typedef struct name_ref {
    const char *name;
    int64_t i;
} name_ref;

struct tide_gguf {
    tide_ctx *ctx;
    char *path;
    int fd;
    const unsigned char *map;
    uint64_t size;
    uint32_t version;
    uint64_t alignment;
    uint64_t data_start;
    kv_entry *kv;
    int64_t n_kv, cap_kv;
    name_ref *kv_sorted;
    tide_gguf_tensor *tensors;
    int64_t n_tensors;
    name_ref *t_sorted;
    void **blocks; /* element indexes of arrays, freed at close */
    int64_t n_blocks, cap_blocks;
};

/* ---------------------------------------------------------------- names */

static const char *const value_type_names[TIDE_GGUF_TYPE_COUNT] = {
    "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64"};

const char *tide_gguf_type_name(uint32_t type) {
    return type < TIDE_GGUF_TYPE_COUNT ? value_type_names[type] : "?";
}

static const char *const ggml_names[] = {
    [0] = "f32",      [1] = "f16",     [2] = "q4_0",     [3] = "q4_1",    [6] = "q5_0",    [7] = "q5_1",
    [8] = "q8_0",     [9] = "q8_1",    [10] = "q2_k",    [11] = "q3_k",   [12] = "q4_k",   [13] = "q5_k",
    [14] = "q6_k",    [15] = "q8_k",   [16] = "iq2_xxs", [17] = "iq2_xs", [18] = "iq3_xxs", [19] = "iq1_s",
    [20] = "iq4_nl",  [21] = "iq3_s",  [22] = "iq2_s",   [23] = "iq4_xs", [24] = "i8",     [25] = "i16",
    [26] = "i32",     [27] = "i64",    [28] = "f64",     [29] = "iq1_m",  [30] = "bf16",   [34] = "tq1_0",
    [35] = "tq2_0",   [39] = "mxfp4",
};

const char *tide_gguf_ggml_type_name(uint32_t t) {
    return t < sizeof ggml_names / sizeof ggml_names[0] && ggml_names[t] ? ggml_names[t] : "?";
}

static bool ggml_to_dtype(uint32_t t, tide_dtype *dt) {
    switch (t) {
    case TIDE_GGML_F32: *dt = TIDE_F32; return true;
    case TIDE_GGML_F16: *dt = TIDE_F16; return true;
    case TIDE_GGML_BF16: *dt = TIDE_BF16; return true;
    case TIDE_GGML_Q8_0: *dt = TIDE_Q8_0; return true;
    case TIDE_GGML_Q4_0: *dt = TIDE_Q4_0; return true;
    case TIDE_GGML_Q4_K: *dt = TIDE_Q4_K; return true;
    case TIDE_GGML_Q5_K: *dt = TIDE_Q5_K; return true;
    case TIDE_GGML_Q6_K: *dt = TIDE_Q6_K; return true;
    default: return false;
    }
}

/* Bytes of a scalar value type; 0 for strings and arrays. */
static uint64_t scalar_size(uint32_t t) {
    switch (t) {
    case TIDE_GGUF_U8: case TIDE_GGUF_I8: case TIDE_GGUF_BOOL: return 1;
    case TIDE_GGUF_U16: case TIDE_GGUF_I16: return 2;
    case TIDE_GGUF_U32: case TIDE_GGUF_I32: case TIDE_GGUF_F32: return 4;
    case TIDE_GGUF_U64: case TIDE_GGUF_I64: case TIDE_GGUF_F64: return 8;
    default: return 0;
    }
}

/* The fewest bytes a value of type t takes in the file. */
static uint64_t min_size(uint32_t t) {
    if (t == TIDE_GGUF_STRING) return 8;     /* its length */
    if (t == TIDE_GGUF_ARRAY) return 12;     /* element type and count */
    return scalar_size(t);
}

/* ---------------------------------------------------------------- cursor */

typedef struct cursor {
    tide_gguf *g;
    uint64_t pos; /* always <= g->size */
} cursor;

static uint64_t left(const cursor *c) { return c->g->size - c->pos; }

static uint32_t le32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t le64(const unsigned char *p) { return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32; }

static tide_status truncated(const cursor *c, uint64_t need, const char *what) {
    return tide_err(c->g->ctx, TIDE_E_FORMAT,
                    "%s: truncated: %s needs %llu bytes at byte %llu, the file has %llu",
                    c->g->path, what, (unsigned long long)need, (unsigned long long)c->pos,
                    (unsigned long long)c->g->size);
}

static tide_status rd_u32(cursor *c, uint32_t *v, const char *what) {
    if (left(c) < 4) return truncated(c, 4, what);
    *v = le32(c->g->map + c->pos);
    c->pos += 4;
    return TIDE_OK;
}

static tide_status rd_u64(cursor *c, uint64_t *v, const char *what) {
    if (left(c) < 8) return truncated(c, 8, what);
    *v = le64(c->g->map + c->pos);
    c->pos += 8;
    return TIDE_OK;
}

/* A key or tensor name (what: "key 12", "tensor 3"): non-empty, at most
 * NAME_MAX_BYTES, no NUL; a NUL-terminated copy into *out. */
static tide_status rd_name(cursor *c, const char *what, char **out) {
    *out = NULL;
    uint64_t len = 0;
    char w[64];
    snprintf(w, sizeof w, "the name length of %s", what);
    tide_status st = rd_u64(c, &len, w);
    if (st) return st;
    tide_gguf *g = c->g;
    if (len > left(c))
        return tide_err(g->ctx, TIDE_E_FORMAT,
                        "%s: %s: name length %llu past the end of the file (%llu bytes left at byte %llu)",
                        g->path, what, (unsigned long long)len, (unsigned long long)left(c),
                        (unsigned long long)c->pos);
    if (len == 0) return tide_err(g->ctx, TIDE_E_FORMAT, "%s: %s has an empty name", g->path, what);
    if (len > NAME_MAX_BYTES)
        return tide_err(g->ctx, TIDE_E_FORMAT, "%s: %s: name of %llu bytes (at most %u)", g->path, what,
                        (unsigned long long)len, NAME_MAX_BYTES);
    const char *s = (const char *)g->map + c->pos;
    if (memchr(s, 0, (size_t)len))
        return tide_err(g->ctx, TIDE_E_FORMAT, "%s: %s: name '%.*s' holds a NUL byte", g->path, what,
                        (int)strnlen(s, SHOW), s);
    char *p = tide_malloc((size_t)len + 1);
    if (!p) return tide_err(g->ctx, TIDE_E_NOMEM, "%s: out of memory", g->path);
    memcpy(p, s, (size_t)len);
    p[len] = 0;
    c->pos += len;
    *out = p;
    return TIDE_OK;
}

static tide_status keep_block(tide_gguf *g, void *b) {
    if (g->n_blocks == g->cap_blocks) {
        int64_t cap = g->cap_blocks ? 2 * g->cap_blocks : 16;
        void **nb = tide_realloc(g->blocks, (size_t)cap * sizeof *nb);
        if (!nb) {
            tide_free(b);
            return tide_err(g->ctx, TIDE_E_NOMEM, "%s: out of memory", g->path);
        }
        g->blocks = nb;
        g->cap_blocks = cap;
    }
    g->blocks[g->n_blocks++] = b;
    return TIDE_OK;
}

/* One value of type `type` at the cursor into *v (key names it in errors;
 * elem >= 0: it is element elem of that key's array). */
static tide_status rd_value(cursor *c, uint32_t type, int depth, const char *key, int64_t elem,
                            tide_gguf_value *v) {
    tide_gguf *g = c->g;
    char where[SHOW + 64];
    if (elem >= 0) snprintf(where, sizeof where, "key '%.*s' (array element %lld)", SHOW, key, (long long)elem);
    else snprintf(where, sizeof where, "key '%.*s'", SHOW, key);
    memset(v, 0, sizeof *v);
    v->g = g;
    v->type = (tide_gguf_type)type;
    if (type >= TIDE_GGUF_TYPE_COUNT)
        return tide_err(g->ctx, TIDE_E_FORMAT, "%s: %s: unknown value type %u", g->path, where, type);
    uint64_t sz = scalar_size(type);
    tide_status st;
    if (sz) {
        if (left(c) < sz) return truncated(c, sz, where);
        v->off = c->pos;
        if (type == TIDE_GGUF_BOOL && g->map[c->pos] > 1)
            return tide_err(g->ctx, TIDE_E_FORMAT, "%s: %s: bool of value %u (0 or 1)", g->path, where,
                            g->map[c->pos]);
        c->pos += sz;
        return TIDE_OK;
    }
    if (type == TIDE_GGUF_STRING) {
        uint64_t len = 0;
        if ((st = rd_u64(c, &len, where))) return st;
        if (len > left(c))
            return tide_err(g->ctx, TIDE_E_FORMAT,
                            "%s: %s: string length %llu past the end of the file (%llu bytes left at byte %llu)",
                            g->path, where, (unsigned long long)len, (unsigned long long)left(c),
                            (unsigned long long)c->pos);
        v->n = len;
        v->off = c->pos;
        c->pos += len;
        return TIDE_OK;
    }
    /* an array */
    uint32_t et = 0;
    uint64_t n = 0;
    if ((st = rd_u32(c, &et, where)) || (st = rd_u64(c, &n, where))) return st;
    if (et >= TIDE_GGUF_TYPE_COUNT)
        return tide_err(g->ctx, TIDE_E_FORMAT, "%s: %s: array of unknown element type %u", g->path, where, et);
    if (et == TIDE_GGUF_ARRAY && depth + 1 >= TIDE_GGUF_MAX_DEPTH)
        return tide_err(g->ctx, TIDE_E_FORMAT, "%s: %s: arrays nested deeper than %d", g->path, where,
                        TIDE_GGUF_MAX_DEPTH);
    uint64_t ms = min_size(et);
    if (n > left(c) / ms)
        return tide_err(g->ctx, TIDE_E_FORMAT,
                        "%s: %s: array of %llu %s elements past the end of the file (%llu bytes left at byte %llu)",
                        g->path, where, (unsigned long long)n, tide_gguf_type_name(et),
                        (unsigned long long)left(c), (unsigned long long)c->pos);
    v->elem_type = (tide_gguf_type)et;
    v->n = n;
    v->off = c->pos;
    if (scalar_size(et)) {
        if (et == TIDE_GGUF_BOOL)
            for (uint64_t i = 0; i < n; i++)
                if (g->map[c->pos + i] > 1)
                    return tide_err(g->ctx, TIDE_E_FORMAT, "%s: %s: element %llu is a bool of value %u (0 or 1)",
                                    g->path, where, (unsigned long long)i, g->map[c->pos + i]);
        c->pos += n * ms;
        return TIDE_OK;
    }
    if (n == 0) return TIDE_OK;
    if (et == TIDE_GGUF_STRING) {
        uint64_t *offs = tide_malloc((size_t)n * sizeof *offs);
        if (!offs || (st = keep_block(g, offs)))
            return offs ? st : tide_err(g->ctx, TIDE_E_NOMEM, "%s: out of memory", g->path);
        v->elems = offs;
        for (uint64_t i = 0; i < n; i++) {
            tide_gguf_value e;
            offs[i] = c->pos;
            if ((st = rd_value(c, TIDE_GGUF_STRING, depth + 1, key, (int64_t)i, &e))) return st;
        }
        return TIDE_OK;
    }
    tide_gguf_value *kids = tide_malloc((size_t)n * sizeof *kids);
    if (!kids || (st = keep_block(g, kids)))
        return kids ? st : tide_err(g->ctx, TIDE_E_NOMEM, "%s: out of memory", g->path);
    v->elems = kids;
    for (uint64_t i = 0; i < n; i++)
        if ((st = rd_value(c, TIDE_GGUF_ARRAY, depth + 1, key, (int64_t)i, &kids[i]))) return st;
    return TIDE_OK;
}

/* ---------------------------------------------------------------- checks */

static int cmp_name_ref(const void *a, const void *b) {
    return strcmp(((const name_ref *)a)->name, ((const name_ref *)b)->name);
}

typedef struct extent {
    uint64_t begin, end;
    int64_t t;
} extent;

static int cmp_extent(const void *a, const void *b) {
    const extent *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

/* Alignment a tensor's bytes need in memory: the element's, or for the
 * block types their f16 scales'. */
static uint64_t elem_align(tide_dtype dt) {
    return tide_dtype_is_quantized(dt) ? 2 : (uint64_t)tide_dtype_size(dt);
}

/* Type, shape, size and extent of tensor i. */
static tide_status check_tensor(tide_gguf *g, tide_gguf_tensor *t) {
    tide_ctx *ctx = g->ctx;
    if (!ggml_to_dtype(t->ggml_type, &t->dtype)) {
        const char *nm = tide_gguf_ggml_type_name(t->ggml_type);
        if (strcmp(nm, "?") == 0)
            return tide_err(ctx, TIDE_E_FORMAT, "%s: tensor '%.*s': unknown ggml type %u", g->path, SHOW, t->name,
                            t->ggml_type);
        return tide_err(ctx, TIDE_E_UNSUPPORTED,
                        "%s: tensor '%.*s': ggml type %s (%u) is not supported (f32, f16, bf16, q8_0, q4_0, q4_k, "
                        "q5_k, q6_k)",
                        g->path, SHOW, t->name, nm, t->ggml_type);
    }
    uint64_t block = (uint64_t)tide_dtype_block(t->dtype);
    if (t->ne[0] % block)
        return tide_err(ctx, TIDE_E_FORMAT,
                        "%s: tensor '%.*s': a row (ne[0]) of %llu elements is not a whole number of %s blocks of %llu",
                        g->path, SHOW, t->name, (unsigned long long)t->ne[0], tide_dtype_name(t->dtype),
                        (unsigned long long)block);
    uint64_t numel = 1, rows = 1;
    for (int d = 0; d < t->n_dims; d++) {
        if (t->ne[d] > (uint64_t)INT64_MAX || __builtin_mul_overflow(numel, t->ne[d], &numel) ||
            numel > (uint64_t)INT64_MAX)
            return tide_err(ctx, TIDE_E_FORMAT, "%s: tensor '%.*s': its dims overflow 63 bits", g->path, SHOW,
                            t->name);
        if (d > 0) rows *= t->ne[d];
    }
    uint64_t row_bytes = tide_dtype_bytes(t->dtype, t->ne[0]);
    if ((t->ne[0] && !row_bytes) || __builtin_mul_overflow(row_bytes, rows, &t->nbytes))
        return tide_err(ctx, TIDE_E_FORMAT, "%s: tensor '%.*s': its size overflows 64 bits", g->path, SHOW, t->name);
    if (t->offset % g->alignment)
        return tide_err(ctx, TIDE_E_FORMAT,
                        "%s: tensor '%.*s': data offset %llu is not a multiple of the alignment %llu", g->path, SHOW,
                        t->name, (unsigned long long)t->offset, (unsigned long long)g->alignment);
    uint64_t end;
    if (__builtin_add_overflow(g->data_start, t->offset, &t->file_offset) ||
        __builtin_add_overflow(t->file_offset, t->nbytes, &end) || end > g->size)
        return tide_err(ctx, TIDE_E_FORMAT,
                        "%s: tensor '%.*s': data at offset %llu, %llu bytes, past the end of the file (the data "
                        "section holds %llu bytes)",
                        g->path, SHOW, t->name, (unsigned long long)t->offset, (unsigned long long)t->nbytes,
                        (unsigned long long)(g->size > g->data_start ? g->size - g->data_start : 0));
    if (t->file_offset % elem_align(t->dtype))
        return tide_err(ctx, TIDE_E_FORMAT, "%s: tensor '%.*s': data at byte %llu is not aligned to %llu bytes",
                        g->path, SHOW, t->name, (unsigned long long)t->file_offset,
                        (unsigned long long)elem_align(t->dtype));
    return TIDE_OK;
}

static tide_status check_overlap(tide_gguf *g) {
    int64_t n = g->n_tensors;
    if (n < 2) return TIDE_OK;
    extent *ex = tide_malloc((size_t)n * sizeof *ex);
    if (!ex) return tide_err(g->ctx, TIDE_E_NOMEM, "%s: out of memory", g->path);
    for (int64_t i = 0; i < n; i++)
        ex[i] = (extent){g->tensors[i].file_offset, g->tensors[i].file_offset + g->tensors[i].nbytes, i};
    qsort(ex, (size_t)n, sizeof *ex, cmp_extent);
    tide_status st = TIDE_OK;
    uint64_t reach = ex[0].end;
    int64_t reach_t = ex[0].t;
    for (int64_t i = 1; i < n && !st; i++) {
        if (ex[i].begin == ex[i].end) continue;
        if (ex[i].begin < reach)
            st = tide_err(g->ctx, TIDE_E_FORMAT, "%s: tensors '%.*s' and '%.*s' overlap in the data section",
                          g->path, SHOW, g->tensors[reach_t].name, SHOW, g->tensors[ex[i].t].name);
        if (ex[i].end > reach) {
            reach = ex[i].end;
            reach_t = ex[i].t;
        }
    }
    tide_free(ex);
    return st;
}

/* Sorted name index over n entries; a duplicate is TIDE_E_FORMAT. */
static tide_status sort_names(tide_gguf *g, name_ref *r, int64_t n, const char *what) {
    if (n > 1) qsort(r, (size_t)n, sizeof *r, cmp_name_ref);
    for (int64_t i = 1; i < n; i++)
        if (strcmp(r[i - 1].name, r[i].name) == 0)
            return tide_err(g->ctx, TIDE_E_FORMAT, "%s: duplicate %s '%.*s'", g->path, what, SHOW, r[i].name);
    return TIDE_OK;
}

static int64_t find_name(const name_ref *r, int64_t n, const char *name) {
    int64_t lo = 0, hi = n - 1;
    while (lo <= hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int c = strcmp(r[mid].name, name);
        if (c == 0) return r[mid].i;
        if (c < 0) lo = mid + 1;
        else hi = mid - 1;
    }
    return -1;
}

/* ---------------------------------------------------------------- open */

static tide_status parse(tide_gguf *g) {
    tide_ctx *ctx = g->ctx;
    cursor c = {g, 0};
    uint32_t magic = 0, version = 0;
    uint64_t n_tensors = 0, n_kv = 0;
    tide_status st;
    if (g->size < 4 || le32(g->map) != TIDE_GGUF_MAGIC)
        return tide_err(ctx, TIDE_E_FORMAT, "%s: not a GGUF file (no \"GGUF\" magic at its start)", g->path);
    if ((st = rd_u32(&c, &magic, "the magic")) || (st = rd_u32(&c, &version, "the version"))) return st;
    if (version == 1)
        return tide_err(ctx, TIDE_E_UNSUPPORTED, "%s: GGUF version 1 is not supported (versions 2 and 3)", g->path);
    if (version != 2 && version != 3) {
        if ((version & 0xffff) == 0 && (version >> 24 == 2 || version >> 24 == 3))
            return tide_err(ctx, TIDE_E_UNSUPPORTED, "%s: a big-endian GGUF file (little-endian only)", g->path);
        return tide_err(ctx, TIDE_E_FORMAT, "%s: unknown GGUF version %u (2 and 3 are read)", g->path, version);
    }
    g->version = version;
    if ((st = rd_u64(&c, &n_tensors, "the tensor count")) || (st = rd_u64(&c, &n_kv, "the metadata count")))
        return st;
    /* a key takes at least 8 + 1 + 4 + 1 bytes, a tensor 8 + 1 + 4 + 8 + 4 + 8 */
    if (n_kv > left(&c) / 14)
        return tide_err(ctx, TIDE_E_FORMAT, "%s: metadata count %llu cannot fit in the file's %llu bytes (truncated, or a damaged count)", g->path,
                        (unsigned long long)n_kv, (unsigned long long)g->size);
    if (n_tensors > left(&c) / 33 || n_tensors > (uint64_t)INT32_MAX)
        return tide_err(ctx, TIDE_E_FORMAT, "%s: tensor count %llu cannot fit in the file's %llu bytes (truncated, or a damaged count)", g->path,
                        (unsigned long long)n_tensors, (unsigned long long)g->size);

    if (n_kv && !(g->kv = tide_calloc((size_t)n_kv, sizeof *g->kv)))
        return tide_err(ctx, TIDE_E_NOMEM, "%s: out of memory", g->path);
    g->cap_kv = (int64_t)n_kv;
    for (uint64_t i = 0; i < n_kv; i++) {
        char what[48];
        snprintf(what, sizeof what, "key %llu", (unsigned long long)i);
        kv_entry *e = &g->kv[i];
        if ((st = rd_name(&c, what, &e->key))) return st;
        g->n_kv++;
        uint32_t type = 0;
        char w2[SHOW + 32];
        snprintf(w2, sizeof w2, "the type of key '%.*s'", SHOW, e->key);
        if ((st = rd_u32(&c, &type, w2)) || (st = rd_value(&c, type, 0, e->key, -1, &e->v))) return st;
    }
    if (n_kv && !(g->kv_sorted = tide_malloc((size_t)n_kv * sizeof *g->kv_sorted)))
        return tide_err(ctx, TIDE_E_NOMEM, "%s: out of memory", g->path);
    for (int64_t i = 0; i < g->n_kv; i++) g->kv_sorted[i] = (name_ref){g->kv[i].key, i};
    if ((st = sort_names(g, g->kv_sorted, g->n_kv, "key"))) return st;

    g->alignment = TIDE_GGUF_DEFAULT_ALIGNMENT;
    tide_gguf_value av;
    if (tide_gguf_get(g, "general.alignment", &av)) {
        if (av.type != TIDE_GGUF_U32)
            return tide_err(ctx, TIDE_E_FORMAT, "%s: key 'general.alignment' is %s, expected u32", g->path,
                            tide_gguf_type_name(av.type));
        uint32_t a = le32(g->map + av.off);
        if (a == 0 || (a & (a - 1)))
            return tide_err(ctx, TIDE_E_FORMAT, "%s: key 'general.alignment' is %u, not a power of two", g->path, a);
        g->alignment = a;
    }

    if (n_tensors && !(g->tensors = tide_calloc((size_t)n_tensors, sizeof *g->tensors)))
        return tide_err(ctx, TIDE_E_NOMEM, "%s: out of memory", g->path);
    for (uint64_t i = 0; i < n_tensors; i++) {
        char what[48];
        snprintf(what, sizeof what, "tensor %llu", (unsigned long long)i);
        tide_gguf_tensor *t = &g->tensors[i];
        char *name;
        if ((st = rd_name(&c, what, &name))) return st;
        t->name = name;
        g->n_tensors++;
        char w2[SHOW + 48];
        snprintf(w2, sizeof w2, "tensor '%.*s'", SHOW, name);
        uint32_t nd = 0;
        if ((st = rd_u32(&c, &nd, w2))) return st;
        if (nd < 1 || nd > TIDE_GGUF_MAX_DIMS)
            return tide_err(ctx, TIDE_E_FORMAT, "%s: tensor '%.*s': %u dims (1 to %d)", g->path, SHOW, name, nd,
                            TIDE_GGUF_MAX_DIMS);
        t->n_dims = (int)nd;
        for (int d = 0; d < TIDE_GGUF_MAX_DIMS; d++) t->ne[d] = 1;
        for (uint32_t d = 0; d < nd; d++)
            if ((st = rd_u64(&c, &t->ne[d], w2))) return st;
        if ((st = rd_u32(&c, &t->ggml_type, w2)) || (st = rd_u64(&c, &t->offset, w2))) return st;
    }
    if (n_tensors && !(g->t_sorted = tide_malloc((size_t)n_tensors * sizeof *g->t_sorted)))
        return tide_err(ctx, TIDE_E_NOMEM, "%s: out of memory", g->path);
    for (int64_t i = 0; i < g->n_tensors; i++) g->t_sorted[i] = (name_ref){g->tensors[i].name, i};
    if ((st = sort_names(g, g->t_sorted, g->n_tensors, "tensor name"))) return st;

    uint64_t pad = (g->alignment - c.pos % g->alignment) % g->alignment;
    g->data_start = c.pos + pad; /* c.pos <= size < 2^63: no overflow */
    if (n_tensors && g->data_start > g->size)
        return tide_err(ctx, TIDE_E_FORMAT, "%s: truncated: the data section would start at byte %llu, the file has %llu",
                        g->path, (unsigned long long)g->data_start, (unsigned long long)g->size);
    for (int64_t i = 0; i < g->n_tensors; i++)
        if ((st = check_tensor(g, &g->tensors[i]))) return st;
    return check_overlap(g);
}

tide_status tide_gguf_open(tide_ctx *ctx, const char *path, tide_gguf **out) {
    if (!out) return tide_err(ctx, TIDE_E_INVALID, "gguf_open: NULL out");
    *out = NULL;
    if (!path) return tide_err(ctx, TIDE_E_INVALID, "gguf_open: NULL path");
    tide_gguf *g = tide_calloc(1, sizeof *g);
    if (!g || !(g->path = tide_strdup(path))) {
        tide_free(g);
        return tide_err(ctx, TIDE_E_NOMEM, "out of memory opening %s", path);
    }
    g->ctx = ctx;
    g->fd = open(path, O_RDONLY | O_CLOEXEC);
    tide_status st = TIDE_OK;
    struct stat sb;
    if (g->fd < 0) {
        st = tide_err(ctx, errno == ENOENT ? TIDE_E_NOT_FOUND : TIDE_E_IO, "%s: cannot open: %s", path,
                      strerror(errno));
    } else if (fstat(g->fd, &sb) != 0) {
        st = tide_err(ctx, TIDE_E_IO, "%s: cannot stat: %s", path, strerror(errno));
    } else if (!S_ISREG(sb.st_mode)) {
        st = tide_err(ctx, TIDE_E_IO, "%s: not a regular file", path);
    } else if (sb.st_size < 24) {
        st = tide_err(ctx, TIDE_E_FORMAT, "%s: truncated: %lld bytes, shorter than a GGUF header (24)", path,
                      (long long)sb.st_size);
    } else {
        void *m = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_SHARED, g->fd, 0);
        if (m == MAP_FAILED) {
            st = tide_err(ctx, TIDE_E_IO, "%s: mmap failed: %s", path, strerror(errno));
        } else {
            g->map = m;
            g->size = (uint64_t)sb.st_size;
            st = parse(g);
        }
    }
    if (st) {
        tide_gguf_close(g);
        return st;
    }
    *out = g;
    return TIDE_OK;
}

void tide_gguf_close(tide_gguf *g) {
    if (!g) return;
    if (g->map) munmap((void *)g->map, (size_t)g->size);
    if (g->fd >= 0) close(g->fd);
    for (int64_t i = 0; i < g->n_kv; i++) tide_free(g->kv[i].key);
    for (int64_t i = 0; i < g->n_tensors; i++) tide_free((char *)g->tensors[i].name);
    for (int64_t i = 0; i < g->n_blocks; i++) tide_free(g->blocks[i]);
    tide_free(g->blocks);
    tide_free(g->kv);
    tide_free(g->kv_sorted);
    tide_free(g->tensors);
    tide_free(g->t_sorted);
    tide_free(g->path);
    tide_free(g);
}

/* ---------------------------------------------------------------- queries */

const char *tide_gguf_path(const tide_gguf *g) { return g->path; }
uint32_t tide_gguf_version(const tide_gguf *g) { return g->version; }
uint64_t tide_gguf_alignment(const tide_gguf *g) { return g->alignment; }
uint64_t tide_gguf_data_start(const tide_gguf *g) { return g->data_start; }
uint64_t tide_gguf_size(const tide_gguf *g) { return g->size; }
const unsigned char *tide_gguf_map(const tide_gguf *g) { return g->map; }
int tide_gguf_fd(const tide_gguf *g) { return g->fd; }

int64_t tide_gguf_n_kv(const tide_gguf *g) { return g->n_kv; }

bool tide_gguf_kv(const tide_gguf *g, int64_t i, const char **key, tide_gguf_value *v) {
    if (i < 0 || i >= g->n_kv) return false;
    if (key) *key = g->kv[i].key;
    if (v) *v = g->kv[i].v;
    return true;
}

int64_t tide_gguf_find_key(const tide_gguf *g, const char *key) {
    return key ? find_name(g->kv_sorted, g->n_kv, key) : -1;
}

bool tide_gguf_get(const tide_gguf *g, const char *key, tide_gguf_value *v) {
    int64_t i = tide_gguf_find_key(g, key);
    if (i < 0) return false;
    *v = g->kv[i].v;
    return true;
}

bool tide_gguf_value_int(const tide_gguf_value *v, int64_t *out) {
    const unsigned char *p = v->g->map + v->off;
    uint64_t u;
    switch (v->type) {
    case TIDE_GGUF_U8: *out = p[0]; return true;
    case TIDE_GGUF_I8: *out = (int8_t)p[0]; return true;
    case TIDE_GGUF_U16: *out = (uint16_t)(p[0] | p[1] << 8); return true;
    case TIDE_GGUF_I16: *out = (int16_t)(uint16_t)(p[0] | p[1] << 8); return true;
    case TIDE_GGUF_U32: *out = le32(p); return true;
    case TIDE_GGUF_I32: *out = (int32_t)le32(p); return true;
    case TIDE_GGUF_U64:
        u = le64(p);
        if (u > (uint64_t)INT64_MAX) return false;
        *out = (int64_t)u;
        return true;
    case TIDE_GGUF_I64: *out = (int64_t)le64(p); return true;
    default: return false;
    }
}

bool tide_gguf_value_float(const tide_gguf_value *v, double *out) {
    const unsigned char *p = v->g->map + v->off;
    if (v->type == TIDE_GGUF_F32) {
        uint32_t u = le32(p);
        float f;
        memcpy(&f, &u, sizeof f);
        *out = f;
        return true;
    }
    if (v->type == TIDE_GGUF_F64) {
        uint64_t u = le64(p);
        memcpy(out, &u, sizeof *out);
        return true;
    }
    return false;
}

bool tide_gguf_value_bool(const tide_gguf_value *v, bool *out) {
    if (v->type != TIDE_GGUF_BOOL) return false;
    *out = v->g->map[v->off] != 0;
    return true;
}

bool tide_gguf_value_str(const tide_gguf_value *v, const char **s, uint64_t *len) {
    if (v->type != TIDE_GGUF_STRING) return false;
    *s = (const char *)v->g->map + v->off;
    *len = v->n;
    return true;
}

bool tide_gguf_value_array(const tide_gguf_value *v, uint64_t *n, tide_gguf_type *elem_type) {
    if (v->type != TIDE_GGUF_ARRAY) return false;
    if (n) *n = v->n;
    if (elem_type) *elem_type = v->elem_type;
    return true;
}

bool tide_gguf_value_elem(const tide_gguf_value *v, uint64_t i, tide_gguf_value *out) {
    if (v->type != TIDE_GGUF_ARRAY || i >= v->n) return false;
    if (v->elem_type == TIDE_GGUF_ARRAY) {
        *out = ((const tide_gguf_value *)v->elems)[i];
        return true;
    }
    memset(out, 0, sizeof *out);
    out->g = v->g;
    out->type = v->elem_type;
    if (v->elem_type == TIDE_GGUF_STRING) {
        uint64_t at = ((const uint64_t *)v->elems)[i];
        out->n = le64(v->g->map + at);
        out->off = at + 8;
    } else {
        out->off = v->off + i * scalar_size(v->elem_type);
    }
    return true;
}

/* The key's value, or TIDE_E_NOT_FOUND naming it. */
static tide_status key_value(const tide_gguf *g, const char *key, tide_gguf_value *v) {
    if (!key) return tide_err(g->ctx, TIDE_E_INVALID, "%s: NULL key", g->path);
    if (!tide_gguf_get(g, key, v)) return tide_err(g->ctx, TIDE_E_NOT_FOUND, "%s: no key '%s'", g->path, key);
    return TIDE_OK;
}

static tide_status wrong_type(const tide_gguf *g, const char *key, const tide_gguf_value *v, const char *want) {
    return tide_err(g->ctx, TIDE_E_FORMAT, "%s: key '%s' is %s, expected %s", g->path, key,
                    tide_gguf_type_name(v->type), want);
}

tide_status tide_gguf_get_int(const tide_gguf *g, const char *key, int64_t *out) {
    tide_gguf_value v;
    tide_status st = key_value(g, key, &v);
    if (st) return st;
    if (v.type == TIDE_GGUF_U64 && !tide_gguf_value_int(&v, out))
        return tide_err(g->ctx, TIDE_E_FORMAT, "%s: key '%s' is %llu, out of range", g->path, key,
                        (unsigned long long)le64(g->map + v.off));
    return tide_gguf_value_int(&v, out) ? TIDE_OK : wrong_type(g, key, &v, "an integer");
}

tide_status tide_gguf_get_float(const tide_gguf *g, const char *key, double *out) {
    tide_gguf_value v;
    tide_status st = key_value(g, key, &v);
    if (st) return st;
    return tide_gguf_value_float(&v, out) ? TIDE_OK : wrong_type(g, key, &v, "f32 or f64");
}

tide_status tide_gguf_get_bool(const tide_gguf *g, const char *key, bool *out) {
    tide_gguf_value v;
    tide_status st = key_value(g, key, &v);
    if (st) return st;
    return tide_gguf_value_bool(&v, out) ? TIDE_OK : wrong_type(g, key, &v, "bool");
}

tide_status tide_gguf_get_str(const tide_gguf *g, const char *key, const char **s, uint64_t *len) {
    tide_gguf_value v;
    tide_status st = key_value(g, key, &v);
    if (st) return st;
    return tide_gguf_value_str(&v, s, len) ? TIDE_OK : wrong_type(g, key, &v, "string");
}

tide_status tide_gguf_get_str_dup(const tide_gguf *g, const char *key, char **out) {
    const char *s = NULL;
    uint64_t len = 0;
    *out = NULL;
    tide_status st = tide_gguf_get_str(g, key, &s, &len);
    if (st) return st;
    if (memchr(s, 0, (size_t)len))
        return tide_err(g->ctx, TIDE_E_FORMAT, "%s: key '%s': the string holds a NUL byte", g->path, key);
    char *p = tide_malloc((size_t)len + 1);
    if (!p) return tide_err(g->ctx, TIDE_E_NOMEM, "%s: out of memory", g->path);
    memcpy(p, s, (size_t)len);
    p[len] = 0;
    *out = p;
    return TIDE_OK;
}

tide_status tide_gguf_get_array(const tide_gguf *g, const char *key, tide_gguf_value *arr) {
    tide_status st = key_value(g, key, arr);
    if (st) return st;
    return arr->type == TIDE_GGUF_ARRAY ? TIDE_OK : wrong_type(g, key, arr, "array");
}

int64_t tide_gguf_n_tensors(const tide_gguf *g) { return g->n_tensors; }

const tide_gguf_tensor *tide_gguf_tensor_at(const tide_gguf *g, int64_t i) {
    return i >= 0 && i < g->n_tensors ? &g->tensors[i] : NULL;
}

int64_t tide_gguf_find_tensor(const tide_gguf *g, const char *name) {
    return name ? find_name(g->t_sorted, g->n_tensors, name) : -1;
}

const void *tide_gguf_tensor_data(const tide_gguf *g, const tide_gguf_tensor *t) { return g->map + t->file_offset; }
