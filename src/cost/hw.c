/*
 * hw.c - hardware profiles: JSON files under data/hw/ (shipped) or anywhere
 * (measured by `tide probe`), read and written here; cost.c turns them into
 * predicted seconds.
 *
 * A profile is a flat JSON object with one field per member of tide_hw (cost.h)
 * plus "notes" (ignored: where the figures come from, in words) and
 * "source" (optional, a string of 1 to 63 characters: "datasheet" for
 * figures taken from datasheets until the machine is probed, "probed" for
 * `tide probe`'s; `tide plan` prints it). Every field is required but
 * "notes", "source", "flops.i32" and the optional ones (attention_efficiency,
 * host_flops, host_mem_bw, matvec_bw_f32/_f16/_bf16/_q8_0/_q4_0/_q4_k/_q5_k/
 * _q6_k: absent means the cost model's default; net_intra_bw,
 * net_intra_latency_s, net_inter_bw, net_inter_latency_s, net_gpus_per_node:
 * the network of a multi-GPU profile, absent on a single device's), and every
 * value is checked: a malformed profile is TIDE_E_FORMAT with a message naming
 * the file and the field.
 *
 * Where shipped profiles are looked up, first hit wins:
 *   1. $TIDE_DATA/hw/NAME.json        (tests, a tree kept anywhere)
 *   2. PREFIX/share/tide/hw/NAME.json, PREFIX the directory above the running
 *      executable's (/proc/self/exe): an installed tide, even one moved
 *      elsewhere after `cmake --install`
 *   3. TIDE_INSTALL_DATADIR/hw/NAME.json   (compile time: the install prefix's
 *      share/tide, for a libtide linked into a program installed elsewhere)
 *   4. TIDE_DATA_DIR/hw/NAME.json     (compile time: the source tree's data/,
 *      for runs from a build tree; left out with -DTIDE_SOURCE_DATA=OFF)
 * A name found in none of them is TIDE_E_NOT_FOUND listing the known names
 * and the directories searched.
 */
#include "cost/cost.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef TIDE_DATA_DIR
#define TIDE_DATA_DIR ""
#endif
#ifndef TIDE_INSTALL_DATADIR
#define TIDE_INSTALL_DATADIR ""
#endif

/* Integers stored as JSON numbers must be exact doubles. */
#define TIDE_JSON_MAX_INT 9007199254740992.0 /* 2^53 */

static const char *const shipped_names[] = {"8x-h100-80g-nvlink", "a10-24g", "a100-80g", "h100-80g",
                                            "h100-80g-ndr-cluster", "h200-141g", "l4-24g", "p100-16g",
                                            "rtx-3090-24g", "rtx-4090-24g", "v100-32g"};

/* ---------------------------------------------------------------- fields */

typedef enum field_kind {
    F_POSITIVE,    /* finite double > 0 */
    F_NONNEG,      /* finite double >= 0 */
    F_FRACTION,    /* 0 < x <= 1 */
    F_BYTES,       /* integer 1 .. 2^53 stored as uint64_t */
    F_COUNT,       /* integer 1 .. 1024 stored as int */
} field_kind;

typedef struct field {
    const char *key;
    field_kind kind;
    size_t offset;
} field;

static const field fields[] = {
    {"device_mem_bytes", F_BYTES, offsetof(tide_hw, device_mem_bytes)},
    {"matmul_efficiency", F_FRACTION, offsetof(tide_hw, matmul_efficiency)},
    {"mem_bw", F_POSITIVE, offsetof(tide_hw, mem_bw)},
    {"h2d_bw", F_POSITIVE, offsetof(tide_hw, h2d_bw)},
    {"d2h_bw", F_POSITIVE, offsetof(tide_hw, d2h_bw)},
    {"link_latency_s", F_NONNEG, offsetof(tide_hw, link_latency_s)},
    {"launch_s", F_NONNEG, offsetof(tide_hw, launch_s)},
    {"host_mem_bytes", F_BYTES, offsetof(tide_hw, host_mem_bytes)},
    {"ssd_count", F_COUNT, offsetof(tide_hw, ssd_count)},
    {"ssd_read_bw", F_POSITIVE, offsetof(tide_hw, ssd_read_bw)},
    {"ssd_write_bw", F_POSITIVE, offsetof(tide_hw, ssd_write_bw)},
    {"ssd_latency_s", F_NONNEG, offsetof(tide_hw, ssd_latency_s)},
};
/* Fields a profile may leave out: 0 in tide_hw, the cost model's default. */
static const field optional_fields[] = {
    {"attention_efficiency", F_FRACTION, offsetof(tide_hw, attention_efficiency)},
    {"host_flops", F_POSITIVE, offsetof(tide_hw, host_flops)},
    {"host_mem_bw", F_POSITIVE, offsetof(tide_hw, host_mem_bw)},
    {"matvec_bw_f32", F_POSITIVE, offsetof(tide_hw, matvec_bw) + TIDE_F32 * sizeof(double)},
    {"matvec_bw_f16", F_POSITIVE, offsetof(tide_hw, matvec_bw) + TIDE_F16 * sizeof(double)},
    {"matvec_bw_bf16", F_POSITIVE, offsetof(tide_hw, matvec_bw) + TIDE_BF16 * sizeof(double)},
    {"matvec_bw_q8_0", F_POSITIVE, offsetof(tide_hw, matvec_bw) + TIDE_Q8_0 * sizeof(double)},
    {"matvec_bw_q4_0", F_POSITIVE, offsetof(tide_hw, matvec_bw) + TIDE_Q4_0 * sizeof(double)},
    {"matvec_bw_q4_k", F_POSITIVE, offsetof(tide_hw, matvec_bw) + TIDE_Q4_K * sizeof(double)},
    {"matvec_bw_q5_k", F_POSITIVE, offsetof(tide_hw, matvec_bw) + TIDE_Q5_K * sizeof(double)},
    {"matvec_bw_q6_k", F_POSITIVE, offsetof(tide_hw, matvec_bw) + TIDE_Q6_K * sizeof(double)},
    {"net_intra_bw", F_POSITIVE, offsetof(tide_hw, net_intra_bw)},
    {"net_intra_latency_s", F_POSITIVE, offsetof(tide_hw, net_intra_latency_s)},
    {"net_inter_bw", F_POSITIVE, offsetof(tide_hw, net_inter_bw)},
    {"net_inter_latency_s", F_POSITIVE, offsetof(tide_hw, net_inter_latency_s)},
    {"net_gpus_per_node", F_COUNT, offsetof(tide_hw, net_gpus_per_node)},
};
#define N_OPTIONAL (sizeof optional_fields / sizeof optional_fields[0])
#define N_FIELDS (sizeof fields / sizeof fields[0])

static const char *kind_rule(field_kind k) {
    switch (k) {
    case F_POSITIVE: return "must be a positive finite number";
    case F_NONNEG: return "must be a finite number >= 0";
    case F_FRACTION: return "must be a number in (0, 1]";
    case F_BYTES: return "must be an integer from 1 to 2^53";
    case F_COUNT: return "must be an integer from 1 to 1024";
    }
    return "is invalid";
}

/* True if v is acceptable for kind k. */
static bool value_ok(field_kind k, double v) {
    if (!isfinite(v)) return false;
    switch (k) {
    case F_POSITIVE: return v > 0;
    case F_NONNEG: return v >= 0;
    case F_FRACTION: return v > 0 && v <= 1;
    case F_BYTES: return v >= 1 && v <= TIDE_JSON_MAX_INT && v == floor(v);
    case F_COUNT: return v >= 1 && v <= 1024 && v == floor(v);
    }
    return false;
}

static double field_get(const tide_hw *hw, const field *f) {
    const char *base = (const char *)hw + f->offset;
    switch (f->kind) {
    case F_BYTES: return (double)*(const uint64_t *)base;
    case F_COUNT: return (double)*(const int *)base;
    default: return *(const double *)base;
    }
}

static void field_set(tide_hw *hw, const field *f, double v) {
    char *base = (char *)hw + f->offset;
    switch (f->kind) {
    case F_BYTES: *(uint64_t *)base = (uint64_t)v; break;
    case F_COUNT: *(int *)base = (int)v; break;
    default: *(double *)base = v; break;
    }
}

/* Checks every member of hw against the rules a profile file must satisfy.
 * Returns NULL when valid, else the name of the first bad field. */
static const char *hw_check(const tide_hw *hw) {
    if (!hw->name[0] || memchr(hw->name, '\0', sizeof hw->name) == NULL) return "name";
    if (memchr(hw->source, '\0', sizeof hw->source) == NULL) return "source";
    for (size_t i = 0; i < N_FIELDS; i++)
        if (!value_ok(fields[i].kind, field_get(hw, &fields[i]))) return fields[i].key;
    static const char *const flops_keys[TIDE_DTYPE_COUNT] = {
        "flops.f32", "flops.f16", "flops.bf16", "flops.i32", "flops.q8_0",
        "flops.q4_0", "flops.q4_k", "flops.q5_k", "flops.q6_k"};
    for (int d = 0; d < TIDE_DTYPE_COUNT; d++)
        if (!value_ok(F_POSITIVE, hw->flops[d]) && !(tide_dtype_is_quantized((tide_dtype)d) && hw->flops[d] == 0))
            return flops_keys[d]; /* a block type's rate is optional (0: its compute dtype's) */
    for (size_t i = 0; i < N_OPTIONAL; i++) {
        double v = field_get(hw, &optional_fields[i]);
        if (v != 0 && !value_ok(optional_fields[i].kind, v)) return optional_fields[i].key;
    }
    return NULL;
}

/* ---------------------------------------------------------------- parsing */

static tide_status bad_field(tide_ctx *ctx, const char *path, const char *key, const char *rule) {
    return tide_err(ctx, TIDE_E_FORMAT, "hardware profile '%s': field '%s' %s", path, key, rule);
}

static tide_status parse_number(tide_ctx *ctx, const char *path, const cJSON *obj,
                                const char *key, const char *label, field_kind kind, double *v) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!it) return bad_field(ctx, path, label, "is missing");
    if (!cJSON_IsNumber(it)) return bad_field(ctx, path, label, "must be a number");
    if (!value_ok(kind, it->valuedouble)) return bad_field(ctx, path, label, kind_rule(kind));
    *v = it->valuedouble;
    return TIDE_OK;
}

/* Parses the JSON text of a profile (text[len] must be its terminating NUL)
 * into *hw, which is written only on success. `path` names it in messages. */
static tide_status hw_parse(tide_ctx *ctx, const char *path, const char *text, size_t len,
                            tide_hw *hw) {
    const char *end = NULL;
    /* len + 1 takes in the terminating NUL, so trailing garbage is an error */
    cJSON *root = cJSON_ParseWithLengthOpts(text, len + 1, &end, true);
    if (!root) {
        int line = 1;
        size_t at = end && end >= text ? (size_t)(end - text) : 0;
        for (size_t i = 0; i < at && i < len; i++) line += text[i] == '\n';
        return tide_err(ctx, TIDE_E_FORMAT, "hardware profile '%s': invalid JSON near line %d",
                        path, line);
    }
    tide_status st = TIDE_OK;
    tide_hw h;
    memset(&h, 0, sizeof h);
    if (!cJSON_IsObject(root)) {
        st = tide_err(ctx, TIDE_E_FORMAT, "hardware profile '%s': not a JSON object", path);
        goto done;
    }
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(root, "name");
    if (!name) {
        st = bad_field(ctx, path, "name", "is missing");
        goto done;
    }
    if (!cJSON_IsString(name) || !name->valuestring[0] ||
        strlen(name->valuestring) >= sizeof h.name) {
        st = bad_field(ctx, path, "name", "must be a string of 1 to 63 characters");
        goto done;
    }
    strcpy(h.name, name->valuestring);
    const cJSON *source = cJSON_GetObjectItemCaseSensitive(root, "source");
    if (source) {
        if (!cJSON_IsString(source) || !source->valuestring[0] || strlen(source->valuestring) >= sizeof h.source) {
            st = bad_field(ctx, path, "source", "must be a string of 1 to 63 characters");
            goto done;
        }
        strcpy(h.source, source->valuestring);
    }
    for (size_t i = 0; i < N_FIELDS; i++) {
        double v;
        st = parse_number(ctx, path, root, fields[i].key, fields[i].key, fields[i].kind, &v);
        if (st) goto done;
        field_set(&h, &fields[i], v);
    }
    for (size_t i = 0; i < N_OPTIONAL; i++) { /* absent: 0, the cost model's default */
        const field *f = &optional_fields[i];
        double v = 0;
        if (cJSON_GetObjectItemCaseSensitive(root, f->key) &&
            (st = parse_number(ctx, path, root, f->key, f->key, f->kind, &v)))
            goto done;
        field_set(&h, f, v);
    }
    const cJSON *fl = cJSON_GetObjectItemCaseSensitive(root, "flops");
    if (!fl) {
        st = bad_field(ctx, path, "flops", "is missing");
        goto done;
    }
    if (!cJSON_IsObject(fl)) {
        st = bad_field(ctx, path, "flops", "must be an object of FLOP/s by dtype (f32, f16, bf16)");
        goto done;
    }
    for (int d = 0; d < TIDE_DTYPE_COUNT; d++) {
        char label[32];
        snprintf(label, sizeof label, "flops.%s", tide_dtype_name((tide_dtype)d));
        if (d == TIDE_I32 && !cJSON_GetObjectItemCaseSensitive(fl, "i32")) {
            h.flops[d] = h.flops[TIDE_F32]; /* optional: never a matmul dtype */
            continue;
        }
        if (tide_dtype_is_quantized((tide_dtype)d) && !cJSON_GetObjectItemCaseSensitive(fl, tide_dtype_name(d))) {
            h.flops[d] = 0; /* optional: the cost model uses the compute dtype's */
            continue;
        }
        st = parse_number(ctx, path, fl, tide_dtype_name((tide_dtype)d), label, F_POSITIVE,
                          &h.flops[d]);
        if (st) goto done;
    }
    *hw = h;
done:
    cJSON_Delete(root);
    return st;
}

/* ---------------------------------------------------------------- lookup */

enum { MAX_DATA_DIRS = 4 };

/* Adds dir to dirs unless it is empty, too long or already there. */
static void add_dir(char dirs[MAX_DATA_DIRS][PATH_MAX], int *n, const char *dir) {
    if (!dir[0] || strlen(dir) >= PATH_MAX || *n >= MAX_DATA_DIRS) return;
    for (int i = 0; i < *n; i++)
        if (strcmp(dirs[i], dir) == 0) return;
    strcpy(dirs[(*n)++], dir);
}

/* Fills dirs with the data directories to search, in the order of the note at
 * the top; returns how many. */
static int data_dirs(char dirs[MAX_DATA_DIRS][PATH_MAX]) {
    int n = 0;
    const char *env = getenv("TIDE_DATA");
    if (env) add_dir(dirs, &n, env);
    /* /proc/self/exe has no symbolic links left in it, so cutting two
     * components ("/tide", "/bin") gives the real prefix. */
    char exe[PATH_MAX], dir[PATH_MAX];
    ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (k > 0) {
        exe[k] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash) *slash = '\0';
        slash = strrchr(exe, '/');
        if (slash) {
            *slash = '\0';
            if (snprintf(dir, sizeof dir, "%s/share/tide", exe) < (int)sizeof dir) add_dir(dirs, &n, dir);
        }
    }
    add_dir(dirs, &n, TIDE_INSTALL_DATADIR);
    add_dir(dirs, &n, TIDE_DATA_DIR);
    return n;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Writes "a, b, c" — the profile names found in the data directories, or the
 * names shipped with tide when none is readable — into buf. */
static void list_names(char dirs[MAX_DATA_DIRS][PATH_MAX], int n_dirs, char *buf, size_t cap) {
    enum { MAX_NAMES = 64 };
    char *names[MAX_NAMES];
    int n = 0;
    for (int d = 0; d < n_dirs && n == 0; d++) {
        char hwdir[PATH_MAX];
        if (snprintf(hwdir, sizeof hwdir, "%s/hw", dirs[d]) >= (int)sizeof hwdir) continue;
        DIR *dp = opendir(hwdir);
        if (!dp) continue;
        struct dirent *e;
        while ((e = readdir(dp)) && n < MAX_NAMES) {
            size_t l = strlen(e->d_name);
            if (l <= 5 || strcmp(e->d_name + l - 5, ".json") != 0) continue;
            char *s = tide_malloc(l - 4);
            if (!s) break;
            memcpy(s, e->d_name, l - 5);
            s[l - 5] = '\0';
            names[n++] = s;
        }
        closedir(dp);
    }
    buf[0] = '\0';
    size_t used = 0;
    if (n == 0) {
        for (size_t i = 0; i < sizeof shipped_names / sizeof shipped_names[0]; i++)
            used += (size_t)snprintf(buf + used, used < cap ? cap - used : 0, "%s%s", i ? ", " : "",
                                     shipped_names[i]);
        return;
    }
    qsort(names, (size_t)n, sizeof names[0], cmp_str);
    for (int i = 0; i < n; i++) {
        if (used < cap)
            used += (size_t)snprintf(buf + used, cap - used, "%s%s", i ? ", " : "", names[i]);
        tide_free(names[i]);
    }
}

size_t tide_hw_names(char *buf, size_t cap) {
    char dirs[MAX_DATA_DIRS][PATH_MAX], all[4096];
    list_names(dirs, data_dirs(dirs), all, sizeof all);
    size_t n = strlen(all);
    if (cap) {
        size_t k = n < cap - 1 ? n : cap - 1;
        memcpy(buf, all, k);
        buf[k] = '\0';
    }
    return n;
}

static bool looks_like_path(const char *s) {
    size_t l = strlen(s);
    return strchr(s, '/') != NULL || (l >= 5 && strcmp(s + l - 5, ".json") == 0);
}

static tide_status load_path(tide_ctx *ctx, const char *path, tide_hw *hw) {
    char *text = NULL;
    size_t len = 0;
    tide_status st = tide_read_text_file(ctx, path, 0, &text, &len);
    if (st) return st;
    st = hw_parse(ctx, path, text, len, hw);
    tide_free(text);
    return st;
}

tide_status tide_hw_load(tide_ctx *ctx, const char *name_or_path, tide_hw *hw) {
    if (!name_or_path || !*name_or_path || !hw)
        return tide_err(ctx, TIDE_E_INVALID, "tide_hw_load: no profile name given");
    if (looks_like_path(name_or_path)) return load_path(ctx, name_or_path, hw);
    for (const char *c = name_or_path; *c; c++)
        if (!(*c == '-' || *c == '_' || *c == '.' || (*c >= '0' && *c <= '9') ||
              (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z')))
            return tide_err(ctx, TIDE_E_INVALID, "hardware profile name '%s' has a character other "
                            "than letters, digits, '-', '_' and '.'", name_or_path);
    char dirs[MAX_DATA_DIRS][PATH_MAX];
    int n_dirs = data_dirs(dirs);
    for (int d = 0; d < n_dirs; d++) {
        char path[PATH_MAX];
        if (snprintf(path, sizeof path, "%s/hw/%s.json", dirs[d], name_or_path) >= (int)sizeof path)
            continue;
        if (access(path, F_OK) == 0) return load_path(ctx, path, hw);
    }
    char names[512], searched[512];
    list_names(dirs, n_dirs, names, sizeof names);
    size_t used = 0;
    searched[0] = '\0';
    for (int d = 0; d < n_dirs && used < sizeof searched; d++)
        used += (size_t)snprintf(searched + used, sizeof searched - used, "%s%s/hw", d ? ", " : "", dirs[d]);
    return tide_err(ctx, TIDE_E_NOT_FOUND,
                    "unknown hardware profile '%s' (known: %s; or give a path to a .json file; "
                    "searched: %s)",
                    name_or_path, names, n_dirs ? searched : "no data directory");
}

/* printf-style append to buf[cap] at *n; output past cap is dropped but
 * counted, so *n >= cap afterwards means it did not fit. */
static void append(char *buf, size_t cap, size_t *n, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void append(char *buf, size_t cap, size_t *n, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(*n < cap ? buf + *n : NULL, *n < cap ? cap - *n : 0, fmt, ap);
    va_end(ap);
    if (k > 0) *n += (size_t)k;
}

/* Appends s as the body of a JSON string. */
static void append_string(char *buf, size_t cap, size_t *n, const char *s) {
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\')
            append(buf, cap, n, "\\%c", *c);
        else if (*c < 0x20)
            append(buf, cap, n, "\\u%04x", *c);
        else
            append(buf, cap, n, "%c", *c);
    }
}

/* Appends v in the shortest form that reads back as exactly v (cJSON's own
 * printer checks its round trip only approximately, losing the last bit). */
static void append_number(char *buf, size_t cap, size_t *n, double v) {
    char tmp[40];
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*g", prec, v);
        if (strtod(tmp, NULL) == v) break;
    }
    append(buf, cap, n, "%s", tmp);
}

tide_status tide_hw_save(tide_ctx *ctx, const tide_hw *hw, const char *path) {
    if (!hw || !path || !*path) return tide_err(ctx, TIDE_E_INVALID, "tide_hw_save: no profile or path");
    const char *bad = hw_check(hw);
    if (bad)
        return tide_err(ctx, TIDE_E_INVALID, "hardware profile '%.63s': field '%s' is invalid",
                        hw->name, bad);
    char buf[4096];
    size_t n = 0, cap = sizeof buf;
    append(buf, cap, &n, "{\n  \"name\": \"");
    append_string(buf, cap, &n, hw->name);
    append(buf, cap, &n, "\",\n");
    if (hw->source[0]) {
        append(buf, cap, &n, "  \"source\": \"");
        append_string(buf, cap, &n, hw->source);
        append(buf, cap, &n, "\",\n");
    }
    for (size_t i = 0; i < N_FIELDS; i++) {
        append(buf, cap, &n, "  \"%s\": ", fields[i].key);
        append_number(buf, cap, &n, field_get(hw, &fields[i]));
        append(buf, cap, &n, ",\n");
    }
    for (size_t i = 0; i < N_OPTIONAL; i++) {
        double v = field_get(hw, &optional_fields[i]);
        if (v <= 0) continue;
        append(buf, cap, &n, "  \"%s\": ", optional_fields[i].key);
        append_number(buf, cap, &n, v);
        append(buf, cap, &n, ",\n");
    }
    append(buf, cap, &n, "  \"flops\": {");
    for (int d = 0; d < TIDE_DTYPE_COUNT; d++) {
        if (tide_dtype_is_quantized((tide_dtype)d) && hw->flops[d] == 0) continue;
        append(buf, cap, &n, "%s\"%s\": ", d ? ", " : " ", tide_dtype_name((tide_dtype)d));
        append_number(buf, cap, &n, hw->flops[d]);
    }
    append(buf, cap, &n, " }\n}\n");
    if (n >= cap) return tide_err(ctx, TIDE_E_INVALID, "hardware profile '%s' is too long to write", path);
    return tide_write_file_atomic(ctx, "hardware profile", path, buf, n);
}
