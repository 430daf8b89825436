/*
 * st_file.c - the safetensors format read and written once (model/st_file.h).
 *
 * Reading maps the whole file and checks the header before anything is
 * handed out, so that callers can trust every extent. Writing streams each
 * tensor through one buffer of at most TIDE_ST_CHUNK bytes: the caller's
 * fill produces a chunk, the chunk goes to a stdio stream on the temporary
 * file (tide_file_begin), so memory stays bounded whatever the model's
 * size; a write error stops at the chunk that hit it, and the file appears
 * at its path only whole (tide_file_commit).
 */
#include "model/st_file.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define EXACT_INT_MAX 9007199254740992.0 /* 2^53: JSON numbers are doubles here */

/* ---------------------------------------------------------------- reading */

/* Reads a non-negative integer that a double holds exactly. */
bool tide_st_json_u64(const cJSON *it, uint64_t *v) {
    if (!cJSON_IsNumber(it)) return false;
    double d = it->valuedouble;
    if (!(d >= 0.0) || d > EXACT_INT_MAX || d != floor(d)) return false;
    *v = (uint64_t)d;
    return true;
}

/* Parses JSON that must be an object followed only by whitespace. Returns
 * NULL and a description of the problem in why. */
cJSON *tide_st_parse_object(const char *text, size_t len, char *why, size_t why_n) {
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, false);
    if (!root) {
        size_t off = end && end >= text ? (size_t)(end - text) : 0;
        snprintf(why, why_n, "is not valid JSON (error near byte %zu)", off);
        return NULL;
    }
    for (const char *q = end; q < text + len; q++) {
        if (*q != ' ' && *q != '\t' && *q != '\n' && *q != '\r') {
            snprintf(why, why_n, "is not valid JSON (trailing bytes at byte %zu)",
                     (size_t)(q - text));
            cJSON_Delete(root);
            return NULL;
        }
    }
    if (!cJSON_IsObject(root)) {
        snprintf(why, why_n, "is not a JSON object");
        cJSON_Delete(root);
        return NULL;
    }
    return root;
}

static int dtype_from_st(const char *s, tide_dtype *dt) {
    if (strcmp(s, "BF16") == 0) *dt = TIDE_BF16;
    else if (strcmp(s, "F16") == 0) *dt = TIDE_F16;
    else if (strcmp(s, "F32") == 0) *dt = TIDE_F32;
    else if (strcmp(s, "I32") == 0) *dt = TIDE_I32;
    else return -1;
    return 0;
}

const char *tide_st_shape_str(char *buf, size_t n, int ndim, const int64_t *shape) {
    size_t o = (size_t)snprintf(buf, n, "(");
    for (int i = 0; i < ndim && o < n; i++)
        o += (size_t)snprintf(buf + o, n - o, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (o < n) snprintf(buf + o, n - o, ")");
    return buf;
}

void tide_st_close(tide_st_file *f) {
    if (f->map) munmap((void *)f->map, (size_t)f->size);
    if (f->fd >= 0) close(f->fd);
    cJSON_Delete(f->header);
    memset(f, 0, sizeof *f);
    f->fd = -1;
}

static tide_status open_fail(tide_st_file *f, tide_status st) {
    tide_st_close(f);
    return st;
}

tide_status tide_st_open(tide_ctx *ctx, const char *path, tide_st_file *f) {
    memset(f, 0, sizeof *f);
    f->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (f->fd < 0)
        return tide_err(ctx, errno == ENOENT ? TIDE_E_NOT_FOUND : TIDE_E_IO, "%s: cannot open: %s", path,
                        strerror(errno));
    struct stat sb;
    if (fstat(f->fd, &sb) != 0)
        return open_fail(f, tide_err(ctx, TIDE_E_IO, "%s: cannot stat: %s", path, strerror(errno)));
    if (!S_ISREG(sb.st_mode)) return open_fail(f, tide_err(ctx, TIDE_E_IO, "%s: not a regular file", path));
    uint64_t size = (uint64_t)sb.st_size;
    if (size < 8)
        return open_fail(f, tide_err(ctx, TIDE_E_FORMAT,
                                     "%s: truncated: %llu bytes, shorter than the 8-byte header length", path,
                                     (unsigned long long)size));
    void *m = mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, f->fd, 0);
    if (m == MAP_FAILED) return open_fail(f, tide_err(ctx, TIDE_E_IO, "%s: mmap failed: %s", path, strerror(errno)));
    f->map = m;
    f->size = size;

    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | f->map[i];
    if (hlen > f->size - 8)
        return open_fail(f, tide_err(ctx, TIDE_E_FORMAT,
                                     "%s: header length %llu past the end of the file (%llu bytes): truncated "
                                     "or not a safetensors file",
                                     path, (unsigned long long)hlen, (unsigned long long)f->size));
    if (hlen > TIDE_ST_HEADER_MAX)
        return open_fail(f, tide_err(ctx, TIDE_E_FORMAT, "%s: header length %llu exceeds the %u-byte limit", path,
                                     (unsigned long long)hlen, TIDE_ST_HEADER_MAX));
    f->data_start = 8 + hlen;
    char why[128];
    if (!(f->header = tide_st_parse_object((const char *)f->map + 8, (size_t)hlen, why, sizeof why)))
        return open_fail(f, tide_err(ctx, TIDE_E_FORMAT, "%s: header %s", path, why));
    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(f->header, "__metadata__");
    if (meta && !cJSON_IsObject(meta))
        return open_fail(f, tide_err(ctx, TIDE_E_FORMAT, "%s: __metadata__ is not an object", path));
    return TIDE_OK;
}

tide_status tide_st_tensor_read(tide_ctx *ctx, const char *path, const tide_st_file *f, const cJSON *e,
                                tide_st_tensor *t) {
    const char *name = e->string;
    if (!cJSON_IsObject(e))
        return tide_err(ctx, TIDE_E_FORMAT, "%s: tensor '%s': header entry is not an object", path, name);
    const cJSON *jdt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *jshape = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *joff = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    memset(t, 0, sizeof *t);
    if (!cJSON_IsString(jdt))
        return tide_err(ctx, TIDE_E_FORMAT, "%s: tensor '%s': missing or non-string dtype", path, name);
    if (dtype_from_st(jdt->valuestring, &t->dtype) != 0)
        return tide_err(ctx, TIDE_E_FORMAT,
                        "%s: tensor '%s': unknown or unsupported dtype '%s' (BF16, F16, F32, I32)", path, name,
                        jdt->valuestring);
    if (!cJSON_IsArray(jshape))
        return tide_err(ctx, TIDE_E_FORMAT, "%s: tensor '%s': bad shape: not an array", path, name);
    int nd = cJSON_GetArraySize(jshape);
    if (nd > TIDE_MAX_DIMS)
        return tide_err(ctx, TIDE_E_FORMAT, "%s: tensor '%s': bad shape: %d dims (at most %d)", path, name, nd,
                        TIDE_MAX_DIMS);
    t->ndim = nd;
    uint64_t numel = 1;
    bool overflow = false;
    for (int i = 0; i < nd; i++) {
        uint64_t d;
        if (!tide_st_json_u64(cJSON_GetArrayItem(jshape, i), &d))
            return tide_err(ctx, TIDE_E_FORMAT, "%s: tensor '%s': bad shape: dim %d is not a non-negative integer",
                            path, name, i);
        t->shape[i] = (int64_t)d;
        if (d && numel > UINT64_MAX / 4 / d) overflow = true;
        else numel *= d;
    }
    uint64_t begin, end;
    if (!cJSON_IsArray(joff) || cJSON_GetArraySize(joff) != 2 || !tide_st_json_u64(cJSON_GetArrayItem(joff, 0), &begin) ||
        !tide_st_json_u64(cJSON_GetArrayItem(joff, 1), &end))
        return tide_err(ctx, TIDE_E_FORMAT, "%s: tensor '%s': data_offsets is not two non-negative integers", path,
                        name);
    if (begin > end)
        return tide_err(ctx, TIDE_E_FORMAT, "%s: tensor '%s': data_offsets begin %llu > end %llu", path, name,
                        (unsigned long long)begin, (unsigned long long)end);
    uint64_t data_len = f->size - f->data_start;
    if (end > data_len)
        return tide_err(ctx, TIDE_E_FORMAT,
                        "%s: tensor '%s': data_offsets end %llu past the end of the data section "
                        "(%llu bytes): file truncated?",
                        path, name, (unsigned long long)end, (unsigned long long)data_len);
    uint64_t esz = tide_dtype_size(t->dtype);
    char sb[128];
    if (overflow)
        return tide_err(ctx, TIDE_E_FORMAT, "%s: tensor '%s': shape %s has too many elements", path, name,
                        tide_st_shape_str(sb, sizeof sb, nd, t->shape));
    if (end - begin != numel * esz)
        return tide_err(ctx, TIDE_E_FORMAT,
                        "%s: tensor '%s': byte size %llu (data_offsets) != %llu expected for %s %s", path, name,
                        (unsigned long long)(end - begin), (unsigned long long)(numel * esz), jdt->valuestring,
                        tide_st_shape_str(sb, sizeof sb, nd, t->shape));
    t->nbytes = end - begin;
    t->offset = f->data_start + begin;
    if (t->nbytes && t->offset % esz != 0)
        return tide_err(ctx, TIDE_E_FORMAT,
                        "%s: tensor '%s': data at file offset %llu is not aligned to its %llu-byte elements", path,
                        name, (unsigned long long)t->offset, (unsigned long long)esz);
    return TIDE_OK;
}

/* ---------------------------------------------------------------- writing */

/* s as a JSON string, quotes included. */
static void text_json(tide_strbuf *t, const char *s) {
    tide_strbuf_add(t, "\"", 1);
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\') {
            char e[2] = {'\\', (char)*c};
            tide_strbuf_add(t, e, 2);
        } else if (*c < 0x20) {
            tide_strbuf_printf(t, "\\u%04x", *c);
        } else {
            tide_strbuf_add(t, (const char *)c, 1);
        }
    }
    tide_strbuf_add(t, "\"", 1);
}


static const char *st_dtype_name(tide_dtype dt) {
    switch (dt) {
    case TIDE_F32: return "F32";
    case TIDE_F16: return "F16";
    case TIDE_BF16: return "BF16";
    case TIDE_I32: return "I32";
    default: return NULL;
    }
}

static int cmp_name_ptr(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Checks the entries and meta pairs; fills nbytes[i]. */
static tide_status check_entries(tide_ctx *ctx, const char *path, const tide_st_entry *e, int n,
                                 const tide_st_meta *meta, int n_meta, uint64_t *nbytes) {
    for (int i = 0; i < n; i++) {
        if (!e[i].name || !e[i].name[0] || strcmp(e[i].name, "__metadata__") == 0)
            return tide_err(ctx, TIDE_E_INVALID, "%s: tensor %d has no usable name", path, i);
        if (!st_dtype_name(e[i].dtype))
            return tide_err(ctx, TIDE_E_INVALID, "%s: tensor '%s': bad dtype %d", path, e[i].name, (int)e[i].dtype);
        if (e[i].ndim < 0 || e[i].ndim > TIDE_MAX_DIMS)
            return tide_err(ctx, TIDE_E_INVALID, "%s: tensor '%s': %d dims", path, e[i].name, e[i].ndim);
        uint64_t b = tide_dtype_size(e[i].dtype);
        for (int d = 0; d < e[i].ndim; d++) {
            int64_t x = e[i].shape[d];
            if (x < 0 || (x && b > ((uint64_t)1 << 52) / (uint64_t)x))
                return tide_err(ctx, TIDE_E_INVALID, "%s: tensor '%s': bad dim %d (%lld)", path, e[i].name, d,
                                (long long)x);
            b *= (uint64_t)x;
        }
        nbytes[i] = b;
    }
    for (int i = 0; i < n_meta; i++)
        if (!meta[i].key || !meta[i].value)
            return tide_err(ctx, TIDE_E_INVALID, "%s: metadata pair %d has a NULL key or value", path, i);
    int total = n + n_meta;
    const char **names = tide_malloc((size_t)(total ? total : 1) * sizeof *names);
    if (!names) return tide_err(ctx, TIDE_E_NOMEM, "%s: out of memory", path);
    for (int i = 0; i < n; i++) names[i] = e[i].name;
    for (int i = 0; i < n_meta; i++) names[n + i] = meta[i].key;
    /* Tensor names and metadata keys live in different objects: check each. */
    tide_status st = TIDE_OK;
    const int lo[2] = {0, n}, cnt[2] = {n, n_meta};
    for (int g = 0; g < 2 && !st; g++) {
        qsort(names + lo[g], (size_t)cnt[g], sizeof *names, cmp_name_ptr);
        for (int i = lo[g] + 1; i < lo[g] + cnt[g] && !st; i++)
            if (strcmp(names[i - 1], names[i]) == 0)
                st = tide_err(ctx, TIDE_E_INVALID, "%s: duplicate %s '%s'", path, g ? "metadata key" : "tensor",
                              names[i]);
    }
    tide_free(names);
    return st;
}

/* The header: 8-byte length, JSON, spaces up to the data alignment. */
static void build_header(tide_strbuf *t, const tide_st_entry *e, int n, const tide_st_meta *meta, int n_meta,
                         const uint64_t *nbytes) {
    tide_strbuf_add(t, "\0\0\0\0\0\0\0\0{", 9);
    bool first = true;
    if (n_meta) {
        tide_strbuf_add(t, "\"__metadata__\":{", 16);
        for (int i = 0; i < n_meta; i++) {
            if (i) tide_strbuf_add(t, ",", 1);
            text_json(t, meta[i].key);
            tide_strbuf_add(t, ":", 1);
            text_json(t, meta[i].value);
        }
        tide_strbuf_add(t, "}", 1);
        first = false;
    }
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        if (!first) tide_strbuf_add(t, ",", 1);
        first = false;
        text_json(t, e[i].name);
        tide_strbuf_printf(t, ":{\"dtype\":\"%s\",\"shape\":[", st_dtype_name(e[i].dtype));
        for (int d = 0; d < e[i].ndim; d++) tide_strbuf_printf(t, "%s%lld", d ? "," : "", (long long)e[i].shape[d]);
        tide_strbuf_printf(t, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
                    (unsigned long long)(off + nbytes[i]));
        off += nbytes[i];
    }
    tide_strbuf_add(t, "}", 1);
    while (!t->oom && t->len % TIDE_ST_DATA_ALIGN) tide_strbuf_add(t, " ", 1);
    if (t->oom) return;
    uint64_t hlen = t->len - 8;
    for (int i = 0; i < 8; i++) t->p[i] = (char)((hlen >> (8 * i)) & 0xff);
}

/* Streams the data of every entry into af. */
static tide_status write_data(tide_atomic_file *af, const tide_st_entry *e, int n, const uint64_t *nbytes,
                              tide_st_fill_fn fill, void *user) {
    tide_ctx *ctx = af->ctx;
    uint64_t total = 0, done = 0, most = 0;
    for (int i = 0; i < n; i++) {
        total += nbytes[i];
        most = TIDE_MAX(most, nbytes[i]);
    }
    size_t cap = (size_t)TIDE_MIN(most, TIDE_ST_CHUNK);
    unsigned char *buf = tide_malloc_aligned(cap ? cap : 64, 64);
    if (!buf) return tide_err(ctx, TIDE_E_NOMEM, "%s '%s': out of memory for a write buffer", af->what, af->path);
    tide_status st = TIDE_OK;
    for (int i = 0; i < n && !st; i++) {
        uint64_t esz = tide_dtype_size(e[i].dtype), numel = nbytes[i] / esz, per = cap / esz;
        for (uint64_t j = 0; j < numel && !st; j += per) {
            uint64_t m = TIDE_MIN(per, numel - j);
            tide_err_clear(ctx);
            if ((st = fill(user, i, j, m, buf))) {
                char why[TIDE_ERRMSG_MAX];
                snprintf(why, sizeof why, "%s", tide_ctx_last_error(ctx));
                st = tide_err(ctx, st, "%s '%s': tensor '%s': %s", af->what, af->path, e[i].name,
                              why[0] ? why : tide_status_str(st));
                break;
            }
            errno = 0;
            if (fwrite(buf, 1, (size_t)(m * esz), af->fp) != (size_t)(m * esz)) {
                int err = errno ? errno : EIO;
                st = tide_err(ctx, TIDE_E_IO, "%s '%s': write failed: %s", af->what, af->path, strerror(err));
                break;
            }
            done += m * esz;
            tide_progress(ctx, "saving", done, total);
        }
    }
    tide_free_aligned(buf);
    return st;
}

tide_status tide_st_header(tide_ctx *ctx, const char *path, const tide_st_entry *e, int n, const tide_st_meta *meta,
                           int n_meta, tide_strbuf *h, uint64_t *nbytes) {
    tide_status st = check_entries(ctx, path, e, n, meta, n_meta, nbytes);
    if (st) return st;
    build_header(h, e, n, meta, n_meta, nbytes);
    if (h->oom || h->len - 8 > TIDE_ST_HEADER_MAX)
        return tide_err(ctx, h->oom ? TIDE_E_NOMEM : TIDE_E_INVALID, "%s: %s", path,
                        h->oom ? "out of memory building the header" : "header larger than 100 MiB");
    return TIDE_OK;
}

tide_status tide_safetensors_write(tide_ctx *ctx, const char *path, const tide_st_entry *entries, int n_entries,
                                   const tide_st_meta *meta, int n_meta, tide_st_fill_fn fill, void *user) {
    if (!path || !*path) return tide_err(ctx, TIDE_E_INVALID, "safetensors_write: no path");
    if (n_entries < 0 || n_meta < 0 || (n_entries && (!entries || !fill)) || (n_meta && !meta))
        return tide_err(ctx, TIDE_E_INVALID, "%s: bad tensor or metadata list", path);
    uint64_t *nbytes = tide_malloc((size_t)(n_entries ? n_entries : 1) * sizeof *nbytes);
    if (!nbytes) return tide_err(ctx, TIDE_E_NOMEM, "%s: out of memory", path);
    tide_strbuf h = {0};
    tide_status st = tide_st_header(ctx, path, entries, n_entries, meta, n_meta, &h, nbytes);
    tide_atomic_file af;
    if (!st && !(st = tide_file_begin(ctx, "safetensors file", path, &af))) {
        errno = 0;
        if (fwrite(h.p, 1, h.len, af.fp) != h.len)
            st = tide_err(ctx, TIDE_E_IO, "safetensors file '%s': write failed: %s", path,
                          strerror(errno ? errno : EIO));
        if (!st) st = write_data(&af, entries, n_entries, nbytes, fill, user);
        if (st) tide_file_abort(&af);
        else st = tide_file_commit(&af);
    }
    tide_free(h.p);
    tide_free(nbytes);
    return st;
}
