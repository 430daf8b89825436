/*
 * data.c - training tokens (data.h): opening and checking a token file, the
 * window of each batch row, and the synthetic corpus.
 *
 * A file is mapped whole and read in place: ids are loaded with memcpy, so a
 * .npy whose data section is not aligned to its ids still reads correctly.
 * The open-time scan is parallel over chunks of SCAN_CHUNK ids; each chunk
 * first checks "any bad id" with a branch-free loop (which vectorizes) and
 * only a chunk that has one is searched for the first.
 */
#include "train/data.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define SCAN_CHUNK ((int64_t)1 << 20)
#define NPY_HEADER_MAX ((uint64_t)1 << 20)
#define GOLDEN 0x9e3779b97f4a7c15ull

/* How ids are stored: size and signedness. */
typedef enum id_type { ID_U8, ID_I8, ID_U16, ID_I16, ID_U32, ID_I32, ID_U64, ID_I64 } id_type;

static const int id_size[] = {1, 1, 2, 2, 4, 4, 8, 8};
static const char *const id_name[] = {"u8", "i8", "u16", "i16", "u32", "i32", "u64", "i64"};

struct tide_tokens {
    tide_ctx *ctx;
    char *path;
    const unsigned char *map; /* the whole file */
    uint64_t map_size;
    const unsigned char *ids; /* the first id: map + data offset */
    int64_t n;
    id_type type;
    char dtype_name[32];
    uint32_t *owned; /* ids held in memory (data_tokens_from_ids), else NULL */
};

typedef unsigned __int128 u128;

static inline uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* ---------------------------------------------------------------- ids */

/* Id i of ids stored as type t, widened. The value of a u64 id above
 * INT64_MAX wraps negative; the open-time check has refused such files. */
static inline int64_t load_id(const unsigned char *ids, id_type t, int64_t i) {
    switch (t) {
    case ID_U8: return ids[i];
    case ID_I8: return (int8_t)ids[i];
    case ID_U16: { uint16_t v; memcpy(&v, ids + 2 * i, 2); return v; }
    case ID_I16: { int16_t v; memcpy(&v, ids + 2 * i, 2); return v; }
    case ID_U32: { uint32_t v; memcpy(&v, ids + 4 * i, 4); return v; }
    case ID_I32: { int32_t v; memcpy(&v, ids + 4 * i, 4); return v; }
    case ID_U64: { uint64_t v; memcpy(&v, ids + 8 * i, 8); return (int64_t)v; }
    default: { int64_t v; memcpy(&v, ids + 8 * i, 8); return v; }
    }
}

/* Whether ids [i0, i1) hold one outside [0, vocab): a negative id widened
 * to int64 and read as unsigned is larger than any vocab. */
#define ANY_BAD(T, WIDE)                                                                            \
    static bool any_bad_##T(const unsigned char *ids, int64_t i0, int64_t i1, uint64_t vocab) {     \
        bool bad = false;                                                                           \
        for (int64_t i = i0; i < i1; i++) {                                                         \
            T v;                                                                                    \
            memcpy(&v, ids + (size_t)i * sizeof v, sizeof v);                                       \
            bad |= (uint64_t)(WIDE)v >= vocab;                                                      \
        }                                                                                           \
        return bad;                                                                                 \
    }
ANY_BAD(uint8_t, uint64_t)
ANY_BAD(int8_t, int64_t)
ANY_BAD(uint16_t, uint64_t)
ANY_BAD(int16_t, int64_t)
ANY_BAD(uint32_t, uint64_t)
ANY_BAD(int32_t, int64_t)
ANY_BAD(uint64_t, uint64_t)
ANY_BAD(int64_t, int64_t)

static bool any_bad(const unsigned char *ids, id_type t, int64_t i0, int64_t i1, uint64_t vocab) {
    switch (t) {
    case ID_U8: return any_bad_uint8_t(ids, i0, i1, vocab);
    case ID_I8: return any_bad_int8_t(ids, i0, i1, vocab);
    case ID_U16: return any_bad_uint16_t(ids, i0, i1, vocab);
    case ID_I16: return any_bad_int16_t(ids, i0, i1, vocab);
    case ID_U32: return any_bad_uint32_t(ids, i0, i1, vocab);
    case ID_I32: return any_bad_int32_t(ids, i0, i1, vocab);
    case ID_U64: return any_bad_uint64_t(ids, i0, i1, vocab);
    default: return any_bad_int64_t(ids, i0, i1, vocab);
    }
}

/* Index of the first id outside [0, vocab), or -1. */
static int64_t first_bad(const unsigned char *ids, id_type t, int64_t n, int64_t vocab) {
    int64_t n_chunks = (n + SCAN_CHUNK - 1) / SCAN_CHUNK, bad_chunk = INT64_MAX;
#pragma omp parallel for schedule(dynamic, 4) reduction(min : bad_chunk) if (n_chunks > 1)
    for (int64_t c = 0; c < n_chunks; c++) {
        int64_t i0 = c * SCAN_CHUNK, i1 = TIDE_MIN(n, i0 + SCAN_CHUNK);
        if (c < bad_chunk && any_bad(ids, t, i0, i1, (uint64_t)vocab)) bad_chunk = c;
    }
    if (bad_chunk == INT64_MAX) return -1;
    int64_t i1 = TIDE_MIN(n, (bad_chunk + 1) * SCAN_CHUNK);
    for (int64_t i = bad_chunk * SCAN_CHUNK; i < i1; i++)
        if (any_bad(ids, t, i, i + 1, (uint64_t)vocab)) return i;
    return -1;
}

/* ---------------------------------------------------------------- .npy */

/* NumPy's format: "\x93NUMPY", major, minor, the header length (u16 LE in
 * 1.0, u32 LE in 2.0 and 3.0), then a Python dict literal
 *   {'descr': '<u2', 'fortran_order': False, 'shape': (N,), }
 * padded with spaces and ending in '\n'; the data follows. */
static const unsigned char npy_magic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};

typedef struct npy_parser {
    const char *p, *end;
} npy_parser;

static void npy_ws(npy_parser *ps) {
    while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r')) ps->p++;
}

static bool npy_char(npy_parser *ps, char c) {
    npy_ws(ps);
    if (ps->p < ps->end && *ps->p == c) {
        ps->p++;
        return true;
    }
    return false;
}

/* A quoted string ('...' or "...", no escapes) into buf. */
static bool npy_string(npy_parser *ps, char *buf, size_t n) {
    npy_ws(ps);
    if (ps->p >= ps->end || (*ps->p != '\'' && *ps->p != '"')) return false;
    char q = *ps->p++;
    size_t len = 0;
    while (ps->p < ps->end && *ps->p != q) {
        if (len + 1 >= n || *ps->p == '\\') return false;
        buf[len++] = *ps->p++;
    }
    if (ps->p >= ps->end) return false;
    ps->p++;
    buf[len] = '\0';
    return true;
}

static bool npy_word(npy_parser *ps, const char *w) {
    npy_ws(ps);
    size_t n = strlen(w);
    if ((size_t)(ps->end - ps->p) < n || memcmp(ps->p, w, n) != 0) return false;
    ps->p += n;
    return true;
}

/* "(d0, d1, ...)" with an optional trailing comma; at most 8 dims kept. */
static bool npy_shape(npy_parser *ps, int *ndim, uint64_t *dims) {
    if (!npy_char(ps, '(')) return false;
    *ndim = 0;
    for (;;) {
        if (npy_char(ps, ')')) return true;
        npy_ws(ps);
        if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9') return false;
        uint64_t v = 0;
        while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') {
            if (v > (UINT64_MAX - 9) / 10) return false;
            v = v * 10 + (uint64_t)(*ps->p++ - '0');
        }
        if (*ndim >= 8) return false;
        dims[(*ndim)++] = v;
        if (!npy_char(ps, ',')) return npy_char(ps, ')');
    }
}

/* Parses the header of the mapped .npy file; sets the id type, the data
 * offset and the count. */
static tide_status npy_header(tide_ctx *ctx, const char *path, const unsigned char *m, uint64_t size,
                              tide_tokens *tk) {
    if (size < 10 || memcmp(m, npy_magic, 6) != 0)
        return tide_err(ctx, TIDE_E_FORMAT, "%s: malformed .npy: no NumPy magic at the start", path);
    int major = m[6];
    if (major < 1 || major > 3)
        return tide_err(ctx, TIDE_E_FORMAT, "%s: malformed .npy: format version %d.%d is unknown", path, major,
                        m[7]);
    uint64_t pre = major == 1 ? 10 : 12, hlen;
    if (size < pre) return tide_err(ctx, TIDE_E_FORMAT, "%s: malformed .npy: truncated header", path);
    hlen = major == 1 ? (uint64_t)m[8] | (uint64_t)m[9] << 8
                      : (uint64_t)m[8] | (uint64_t)m[9] << 8 | (uint64_t)m[10] << 16 | (uint64_t)m[11] << 24;
    if (hlen > NPY_HEADER_MAX || pre + hlen > size)
        return tide_err(ctx, TIDE_E_FORMAT, "%s: malformed .npy: header of %llu bytes runs past the end of the file",
                        path, (unsigned long long)hlen);
    npy_parser ps = {(const char *)m + pre, (const char *)m + pre + hlen};
    char descr[32] = "", key[32];
    int have = 0, ndim = 0;
    bool fortran = false;
    uint64_t dims[8];
    if (!npy_char(&ps, '{')) goto bad;
    while (!npy_char(&ps, '}')) {
        if (!npy_string(&ps, key, sizeof key) || !npy_char(&ps, ':')) goto bad;
        if (strcmp(key, "descr") == 0) {
            if (!npy_string(&ps, descr, sizeof descr)) goto bad;
            have |= 1;
        } else if (strcmp(key, "fortran_order") == 0) {
            if (npy_word(&ps, "True")) fortran = true;
            else if (!npy_word(&ps, "False")) goto bad;
            have |= 2;
        } else if (strcmp(key, "shape") == 0) {
            if (!npy_shape(&ps, &ndim, dims)) goto bad;
            have |= 4;
        } else {
            return tide_err(ctx, TIDE_E_FORMAT, "%s: malformed .npy: unexpected key '%s' in the header", path, key);
        }
        if (!npy_char(&ps, ',')) {
            if (!npy_char(&ps, '}')) goto bad;
            break;
        }
    }
    npy_ws(&ps);
    if (ps.p != ps.end) goto bad;
    if (have != 7)
        return tide_err(ctx, TIDE_E_FORMAT, "%s: malformed .npy: the header lacks '%s'", path,
                        !(have & 1) ? "descr" : !(have & 2) ? "fortran_order" : "shape");

    /* descr: byte order, kind, item size ("<u2", "|i1"). */
    char order = descr[0], kind = descr[1];
    char *rest = descr + 2;
    long isz = (kind && *rest) ? strtol(rest, &rest, 10) : 0;
    if (!strchr("<>|=", order) || !order || !kind || *rest || isz <= 0)
        return tide_err(ctx, TIDE_E_FORMAT, "%s: malformed .npy: dtype '%s' cannot be read", path, descr);
    if ((kind != 'u' && kind != 'i') || (isz != 1 && isz != 2 && isz != 4 && isz != 8))
        return tide_err(ctx, TIDE_E_UNSUPPORTED,
                        "%s: .npy dtype '%s' is not an integer type of 1, 2, 4 or 8 bytes (token ids)", path, descr);
    if (order == '>' && isz > 1)
        return tide_err(ctx, TIDE_E_UNSUPPORTED, "%s: .npy dtype '%s' is big-endian; only little-endian is read",
                        path, descr);
    if (ndim != 1)
        return tide_err(ctx, TIDE_E_UNSUPPORTED, "%s: .npy array has %d dimensions; token ids must be 1-D", path,
                        ndim);
    /* A 1-D array has the same bytes in either order. */
    (void)fortran;
    int k = isz == 1 ? 0 : isz == 2 ? 1 : isz == 4 ? 2 : 3;
    tk->type = (id_type)(2 * k + (kind == 'i'));
    snprintf(tk->dtype_name, sizeof tk->dtype_name, "%s", descr);
    uint64_t data = size - pre - hlen;
    if (dims[0] > data / (uint64_t)isz || dims[0] * (uint64_t)isz != data)
        return tide_err(ctx, TIDE_E_FORMAT,
                        "%s: malformed .npy: the header says %llu ids (%llu bytes) but %llu bytes of data follow it",
                        path, (unsigned long long)dims[0],
                        dims[0] > UINT64_MAX / (uint64_t)isz ? 0ull : (unsigned long long)(dims[0] * (uint64_t)isz),
                        (unsigned long long)data);
    tk->ids = m + pre + hlen;
    tk->n = (int64_t)dims[0];
    return TIDE_OK;
bad:
    return tide_err(ctx, TIDE_E_FORMAT, "%s: malformed .npy: the header is not a dict of descr, fortran_order "
                    "and shape (near byte %lld)", path, (long long)(ps.p - (const char *)m));
}

static bool ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* ---------------------------------------------------------------- open */

void tide_tokens_free(tide_tokens *tk) {
    if (!tk) return;
    if (tk->map) munmap((void *)tk->map, (size_t)tk->map_size);
    tide_free(tk->owned);
    tide_free(tk->path);
    tide_free(tk);
}

static tide_status tokens_check(tide_ctx *ctx, const char *path, int64_t vocab, int64_t seq, tide_tokens *tk);

static tide_status tokens_open(tide_ctx *ctx, const char *path, tide_token_dtype dt, int64_t vocab, int64_t seq,
                               tide_tokens *tk) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return tide_err(ctx, errno == ENOENT ? TIDE_E_NOT_FOUND : TIDE_E_IO, "%s: cannot open the token file: %s",
                        path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return tide_err(ctx, TIDE_E_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return tide_err(ctx, TIDE_E_IO, "%s: not a regular file", path);
    }
    uint64_t size = (uint64_t)st.st_size;
    if (size > 0) {
        void *m = mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, fd, 0);
        if (m == MAP_FAILED) {
            int e = errno;
            close(fd);
            return tide_err(ctx, TIDE_E_IO, "%s: mmap failed: %s", path, strerror(e));
        }
        tk->map = m;
        tk->map_size = size;
    }
    close(fd); /* the mapping keeps the file */

    bool npy = ends_with(path, ".npy") || (size >= 6 && memcmp(tk->map, npy_magic, 6) == 0);
    tide_status s;
    if (npy) {
        if ((s = npy_header(ctx, path, tk->map, size, tk))) return s;
    } else {
        tk->type = dt == TIDE_TOKENS_U32 ? ID_U32 : ID_U16;
        snprintf(tk->dtype_name, sizeof tk->dtype_name, "%s", id_name[tk->type]);
        uint64_t isz = (uint64_t)id_size[tk->type];
        if (size % isz != 0)
            return tide_err(ctx, TIDE_E_FORMAT, "%s: odd size for %s: %llu bytes is not a whole number of %d-byte ids",
                            path, id_name[tk->type], (unsigned long long)size, (int)isz);
        tk->ids = tk->map;
        tk->n = (int64_t)(size / isz);
    }
    (void)madvise((void *)tk->map, (size_t)tk->map_size, MADV_SEQUENTIAL);
    s = tokens_check(ctx, path, vocab, seq, tk);
    (void)madvise((void *)tk->map, (size_t)tk->map_size, MADV_NORMAL);
    return s;
}

/* Refuses tk when it is too short for one window or holds an id outside
 * [0, vocab). */
static tide_status tokens_check(tide_ctx *ctx, const char *path, int64_t vocab, int64_t seq, tide_tokens *tk) {
    if (tk->n < seq + 2)
        return tide_err(ctx, TIDE_E_FORMAT,
                        "%s: too short for one window: %lld tokens, sequence length %lld needs at least %lld", path,
                        (long long)tk->n, (long long)seq, (long long)(seq + 2));
    int64_t bad = first_bad(tk->ids, tk->type, tk->n, vocab);
    if (bad >= 0) {
        char v[32];
        if (tk->type == ID_U64) {
            uint64_t u;
            memcpy(&u, tk->ids + 8 * bad, 8);
            snprintf(v, sizeof v, "%llu", (unsigned long long)u);
        } else {
            snprintf(v, sizeof v, "%lld", (long long)load_id(tk->ids, tk->type, bad));
        }
        return tide_err(ctx, TIDE_E_RANGE, "%s: token %s at index %lld is out of range: ids must be in [0, %lld) (vocab)",
                        path, v, (long long)bad, (long long)vocab);
    }
    return TIDE_OK;
}

static tide_tokens *tokens_new(tide_ctx *ctx, const char *path) {
    tide_tokens *tk = tide_calloc(1, sizeof *tk);
    if (!tk || !(tk->path = tide_strdup(path))) {
        tide_free(tk);
        return NULL;
    }
    tk->ctx = ctx;
    return tk;
}

tide_status data_tokens_from_ids(tide_ctx *ctx, const char *name, uint32_t *ids, int64_t n, int64_t vocab, int64_t seq,
                                 tide_tokens **out) {
    *out = NULL;
    tide_tokens *tk = tokens_new(ctx, name);
    if (!tk) {
        tide_free(ids);
        return tide_err(ctx, TIDE_E_NOMEM, "%s: out of memory", name);
    }
    tk->owned = ids;
    tk->ids = (const unsigned char *)ids;
    tk->n = n;
    tk->type = ID_U32;
    snprintf(tk->dtype_name, sizeof tk->dtype_name, "%s", id_name[ID_U32]);
    tide_status s = tokens_check(ctx, name, vocab, seq, tk);
    if (s) {
        tide_tokens_free(tk);
        return s;
    }
    *out = tk;
    return TIDE_OK;
}

tide_status tide_tokens_open(tide_ctx *ctx, const char *path, tide_token_dtype dt, int64_t vocab, int64_t seq,
                             tide_tokens **out) {
    if (!out) return tide_err(ctx, TIDE_E_INVALID, "tokens_open: NULL out");
    *out = NULL;
    if (!path || !*path) return tide_err(ctx, TIDE_E_INVALID, "tokens_open: no path");
    if (vocab < 1 || vocab > INT32_MAX)
        return tide_err(ctx, TIDE_E_INVALID, "%s: vocab %lld out of [1, 2^31)", path, (long long)vocab);
    if (seq < 1 || seq > INT32_MAX)
        return tide_err(ctx, TIDE_E_INVALID, "%s: sequence length %lld out of [1, 2^31)", path, (long long)seq);
    if (dt != TIDE_TOKENS_AUTO && dt != TIDE_TOKENS_U16 && dt != TIDE_TOKENS_U32)
        return tide_err(ctx, TIDE_E_INVALID, "%s: unknown token dtype %d", path, (int)dt);
    tide_tokens *tk = tokens_new(ctx, path);
    if (!tk) return tide_err(ctx, TIDE_E_NOMEM, "%s: out of memory opening the token file", path);
    tide_status s = tokens_open(ctx, path, dt, vocab, seq, tk);
    if (s) {
        tide_tokens_free(tk);
        return s;
    }
    *out = tk;
    return TIDE_OK;
}

int64_t tide_tokens_count(const tide_tokens *tk) { return tk ? tk->n : 0; }

int64_t tide_tokens_at(const tide_tokens *tk, int64_t i) {
    return i >= 0 && i < tk->n ? load_id(tk->ids, tk->type, i) : -1;
}

const char *tide_tokens_dtype_name(const tide_tokens *tk) { return tk->dtype_name; }

/* ---------------------------------------------------------------- windows */

/* Why spec or the indices are unusable for tk, or NULL. */
static const char *window_problem(const tide_tokens *tk, const tide_batch_spec *spec, int64_t step, int micro) {
    if (!spec) return "no batch spec";
    if (spec->batch < 1) return "batch < 1";
    if (spec->seq < 1) return "sequence length < 1";
    if (spec->accum < 1) return "accumulation < 1";
    if (step < 0) return "negative step";
    if (micro < 0 || micro >= spec->accum) return "micro-batch outside [0, accumulation)";
    if (tk->n < (int64_t)spec->seq + 2) return "file shorter than one window (sequence length + 2)";
    return NULL;
}

/* The window start of global row g (the formula of data.h); W >= 1 starts. */
static int64_t window_start(const tide_batch_spec *spec, uint64_t W, u128 g) {
    if (!spec->shuffle) return (int64_t)((u128)(uint64_t)(g % W) * (uint64_t)spec->seq % W);
    uint64_t x = mix64(mix64(mix64(spec->seed + GOLDEN) ^ (uint64_t)g) ^ (uint64_t)(g >> 64));
    /* Uniform in [0, W): the high word of x * W, rejecting the 2^64 mod W
     * lowest products (Lemire), redrawn from the same counter. */
    uint64_t thresh = (0 - W) % W;
    for (;;) {
        u128 m = (u128)x * W;
        if ((uint64_t)m >= thresh) return (int64_t)(m >> 64);
        x = mix64(x + GOLDEN);
    }
}

static u128 global_row(const tide_batch_spec *spec, int64_t step, int micro, int b) {
    return ((u128)(uint64_t)step * (uint64_t)spec->accum + (uint64_t)micro) * (uint64_t)spec->batch + (uint64_t)b;
}

int64_t tide_tokens_window(const tide_tokens *tk, const tide_batch_spec *spec, int64_t step, int micro, int b) {
    if (!tk || window_problem(tk, spec, step, micro) || b < 0 || b >= spec->batch) return -1;
    uint64_t W = (uint64_t)(tk->n - spec->seq - 1);
    return window_start(spec, W, global_row(spec, step, micro, b));
}

tide_status tide_tokens_batch(const tide_tokens *tk, const tide_batch_spec *spec, int64_t step, int micro,
                              int32_t *inputs, int32_t *targets) {
    if (!tk) return tide_err(NULL, TIDE_E_INVALID, "tokens_batch: no tokens");
    const char *why = window_problem(tk, spec, step, micro);
    if (!why && (!inputs || !targets)) why = "NULL inputs or targets";
    if (why)
        return tide_err(tk->ctx, TIDE_E_INVALID, "%s: batch of step %lld, micro-batch %d: %s", tk->path,
                        (long long)step, micro, why);
    int64_t T = spec->seq;
    uint64_t W = (uint64_t)(tk->n - T - 1);
    for (int b = 0; b < spec->batch; b++) {
        int64_t s = window_start(spec, W, global_row(spec, step, micro, b));
        int32_t *in = inputs + (size_t)b * (size_t)T, *tg = targets + (size_t)b * (size_t)T;
        /* Ids were checked at open: each fits int32 (vocab < 2^31). */
        switch (tk->type) {
        case ID_U16:
            for (int64_t t = 0; t <= T; t++) {
                uint16_t v;
                memcpy(&v, tk->ids + 2 * (s + t), 2);
                if (t < T) in[t] = v;
                if (t > 0) tg[t - 1] = v;
            }
            break;
        default:
            for (int64_t t = 0; t <= T; t++) {
                int32_t v = (int32_t)load_id(tk->ids, tk->type, s + t);
                if (t < T) in[t] = v;
                if (t > 0) tg[t - 1] = v;
            }
            break;
        }
    }
    return TIDE_OK;
}

/* A .npy 1.0 header of n ids, '<u4' (wide) or '<u2'. */
static void npy_write_header(FILE *fp, bool wide, int64_t n_ids) {
    char h[128];
    int n = snprintf(h, sizeof h, "{'descr': '%s', 'fortran_order': False, 'shape': (%lld,), }", wide ? "<u4" : "<u2",
                     (long long)n_ids);
    int total = (10 + n + 1 + 63) / 64 * 64; /* magic, version, length, dict, '\n' */
    unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)((total - 10) & 0xff),
                             (unsigned char)((total - 10) >> 8)};
    fwrite(pre, 1, sizeof pre, fp);
    fwrite(h, 1, (size_t)n, fp);
    for (int i = 10 + n; i < total - 1; i++) fputc(' ', fp);
    fputc('\n', fp);
}

/* ---------------------------------------------------------------- synthetic */

/* The chain: successor k (0..3) of id c, and the choice at position i. */
static inline uint64_t chain_next(uint64_t k1, uint64_t k2, uint64_t c, int64_t i, uint64_t vocab) {
    uint64_t r = mix64(k2 + (uint64_t)i * GOLDEN) & 7; /* 0-3: k 0, 4-5: k 1, 6: k 2, 7: k 3 */
    uint64_t k = r < 4 ? 0 : r < 6 ? 1 : r - 4;
    return mix64(k1 ^ (c * 4 + k)) % vocab;
}

tide_status tide_tokens_write_synthetic(tide_ctx *ctx, const char *path, tide_token_dtype dt, int64_t vocab,
                                        int64_t n_tokens, uint64_t seed) {
    if (!path || !*path) return tide_err(ctx, TIDE_E_INVALID, "synthetic tokens: no path");
    if (vocab < 1 || vocab > INT32_MAX)
        return tide_err(ctx, TIDE_E_INVALID, "%s: vocab %lld out of [1, 2^31)", path, (long long)vocab);
    if (n_tokens < 1) return tide_err(ctx, TIDE_E_INVALID, "%s: %lld tokens asked for", path, (long long)n_tokens);
    bool npy = ends_with(path, ".npy");
    bool wide = npy ? vocab > 65536 : dt == TIDE_TOKENS_U32 || (dt == TIDE_TOKENS_AUTO && vocab > 65536);
    if (!npy && dt == TIDE_TOKENS_U16 && vocab > 65536)
        return tide_err(ctx, TIDE_E_INVALID, "%s: vocab %lld does not fit u16 ids", path, (long long)vocab);
    tide_atomic_file af;
    tide_status st = tide_file_begin(ctx, "token file", path, &af);
    if (st) return st;
    if (npy) npy_write_header(af.fp, wide, n_tokens);
    enum { CHUNK = 1 << 15 };
    size_t isz = wide ? 4 : 2;
    unsigned char *buf = tide_malloc(CHUNK * isz);
    if (!buf) {
        tide_file_abort(&af);
        return tide_err(ctx, TIDE_E_NOMEM, "%s: out of memory", path);
    }
    uint64_t k1 = mix64(seed ^ 0x5ca1ab1e0ddba11ull), k2 = mix64(seed + GOLDEN);
    uint64_t c = mix64(k1 + k2) % (uint64_t)vocab;
    for (int64_t i0 = 0; i0 < n_tokens && !ferror(af.fp); i0 += CHUNK) {
        int64_t n = TIDE_MIN((int64_t)CHUNK, n_tokens - i0);
        for (int64_t j = 0; j < n; j++) {
            if (i0 + j > 0) c = chain_next(k1, k2, c, i0 + j, (uint64_t)vocab);
            uint32_t v32 = (uint32_t)c;
            uint16_t v16 = (uint16_t)c;
            memcpy(buf + (size_t)j * isz, wide ? (const void *)&v32 : (const void *)&v16, isz);
        }
        fwrite(buf, isz, (size_t)n, af.fp); /* a short write leaves ferror set: commit reports it */
    }
    tide_free(buf);
    return tide_file_commit(&af);
}

/* ---------------------------------------------------------------- data sets (data.h) */

int64_t data_row_draw(const tide_batch_spec *spec, uint64_t n, int64_t step, int micro, int b) {
    u128 g = global_row(spec, step, micro, b);
    if (!spec->shuffle) return (int64_t)(uint64_t)(g % n);
    tide_batch_spec in_order = *spec;
    in_order.seq = 1; /* window_start's shuffled draw, uniform in [0, n) */
    return window_start(&in_order, n, g);
}

tide_status data_write_ids(tide_ctx *ctx, const char *path, const int32_t *ids, int64_t n, bool wide) {
    tide_atomic_file af;
    tide_status st = tide_file_begin(ctx, "token file", path, &af);
    if (st) return st;
    if (ends_with(path, ".npy")) npy_write_header(af.fp, wide, n);
    for (int64_t i = 0; i < n; i++) {
        uint32_t v32 = (uint32_t)ids[i];
        uint16_t v16 = (uint16_t)ids[i];
        fwrite(wide ? (const void *)&v32 : (const void *)&v16, wide ? 4 : 2, 1, af.fp);
    }
    return tide_file_commit(&af);
}
