/*
 * safetensors.c - opening a Hugging Face-layout checkpoint directory:
 * config.json plus either model.safetensors or the shards listed by
 * model.safetensors.index.json (a GGUF file is handed to gguf_model.c). Each file is mapped read-only and its header
 * validated completely before anything is returned, so that later readers can
 * trust every extent (checkpoint.h lists what holds). Also: matching a
 * checkpoint against the WEIGHT tensors of a graph.
 *
 * Each file is opened and its header checked by the one safetensors reader
 * (model/st_file.h, which gives the format); here, a checkpoint's tensors
 * may not overlap, and gaps between them are tolerated.
 *
 * Every failure names the file, the tensor where there is one, and the
 * problem. Name lookup is a binary search over the tensors sorted once at open.
 */
#include "model/checkpoint.h"
#include "graph/graph.h"
#include "model/gguf.h"
#include "model/st_file.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define INDEX_MAX (64u << 20)

/* ---------------------------------------------------------------- helpers */

static char *path_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = tide_malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    p[a] = '/';
    memcpy(p + a + 1, name, b + 1);
    return p;
}

static bool file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

static int cmp_tensor_name(const void *a, const void *b) {
    return strcmp(((const tide_ck_tensor *)a)->name, ((const tide_ck_tensor *)b)->name);
}

/* ---------------------------------------------------------------- one file */

typedef struct extent {
    uint64_t begin, end;
    int tensor;
} extent;

static int cmp_extent(const void *a, const void *b) {
    const extent *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

/* Validates one header entry (st_file.c) and appends it to ck->tensors. */
static tide_status add_tensor(tide_checkpoint *ck, int fi, const tide_st_file *sf, const cJSON *e) {
    const tide_ck_file *f = &ck->files[fi];
    tide_st_tensor st;
    tide_status s = tide_st_tensor_read(ck->ctx, f->path, sf, e, &st);
    if (s) return s;
    tide_ck_tensor t;
    memset(&t, 0, sizeof t);
    t.file = fi;
    t.dtype = st.dtype;
    t.ndim = st.ndim;
    memcpy(t.shape, st.shape, sizeof t.shape);
    t.nbytes = st.nbytes;
    t.offset = st.offset;
    t.name = tide_strdup(e->string);
    if (!t.name) return tide_err(ck->ctx, TIDE_E_NOMEM, "%s: out of memory", f->path);
    ck->tensors[ck->n_tensors++] = t;
    return TIDE_OK;
}

/* Checks that the tensors [first, ck->n_tensors) of one file do not overlap. */
static tide_status check_overlap(tide_checkpoint *ck, int fi, int first) {
    int n = ck->n_tensors - first;
    if (n < 2) return TIDE_OK;
    extent *ex = tide_malloc((size_t)n * sizeof *ex);
    if (!ex) return tide_err(ck->ctx, TIDE_E_NOMEM, "%s: out of memory", ck->files[fi].path);
    for (int i = 0; i < n; i++) {
        const tide_ck_tensor *t = &ck->tensors[first + i];
        ex[i] = (extent){t->offset, t->offset + t->nbytes, first + i};
    }
    qsort(ex, (size_t)n, sizeof *ex, cmp_extent);
    tide_status st = TIDE_OK;
    uint64_t reach = ex[0].end;
    int reach_t = ex[0].tensor;
    for (int i = 1; i < n; i++) {
        /* Empty tensors occupy nothing and cannot overlap. */
        if (ex[i].begin == ex[i].end) continue;
        if (ex[i].begin < reach) {
            st = tide_err(ck->ctx, TIDE_E_FORMAT,
                          "%s: tensors '%s' and '%s' overlap (bytes %llu..%llu and %llu..%llu)",
                          ck->files[fi].path, ck->tensors[reach_t].name,
                          ck->tensors[ex[i].tensor].name,
                          (unsigned long long)(ck->tensors[reach_t].offset - ck->files[fi].data_start),
                          (unsigned long long)(reach - ck->files[fi].data_start),
                          (unsigned long long)(ex[i].begin - ck->files[fi].data_start),
                          (unsigned long long)(ex[i].end - ck->files[fi].data_start));
            break;
        }
        if (ex[i].end > reach) {
            reach = ex[i].end;
            reach_t = ex[i].tensor;
        }
    }
    tide_free(ex);
    return st;
}

/* Opens, maps and parses one safetensors file, appending its tensors. */
static tide_status open_file(tide_checkpoint *ck, const char *name) {
    tide_ctx *ctx = ck->ctx;
    if (tide_grow((void **)&ck->files, &ck->cap_files, ck->n_files + 1, sizeof *ck->files))
        return tide_err(ctx, TIDE_E_NOMEM, "out of memory opening %s", name);
    int fi = ck->n_files;
    tide_ck_file *f = &ck->files[fi];
    memset(f, 0, sizeof *f);
    f->fd = -1;
    f->name = tide_strdup(name);
    f->path = path_join(ck->dir, name);
    ck->n_files++; /* from here on tide_checkpoint_free releases it */
    if (!f->name || !f->path) return tide_err(ctx, TIDE_E_NOMEM, "out of memory opening %s", name);

    tide_st_file sf;
    tide_status s = tide_st_open(ctx, f->path, &sf);
    if (s) return s;
    /* the file stays open and mapped for the checkpoint's life */
    f->fd = sf.fd;
    f->map = sf.map;
    f->size = sf.size;
    f->data_start = sf.data_start;
    cJSON *root = sf.header;
    int n = cJSON_GetArraySize(root);
    if (tide_grow((void **)&ck->tensors, &ck->cap_tensors, ck->n_tensors + n, sizeof *ck->tensors)) {
        cJSON_Delete(root);
        return tide_err(ctx, TIDE_E_NOMEM, "%s: out of memory", f->path);
    }
    int first = ck->n_tensors;
    const cJSON *e;
    cJSON_ArrayForEach(e, root) {
        if (strcmp(e->string, "__metadata__") == 0) continue;
        if ((s = add_tensor(ck, fi, &sf, e))) break;
    }
    cJSON_Delete(root);
    if (s) return s;
    return check_overlap(ck, fi, first);
}

/* ---------------------------------------------------------------- index */


static int file_index(const tide_checkpoint *ck, const char *name) {
    for (int i = 0; i < ck->n_files; i++)
        if (strcmp(ck->files[i].name, name) == 0) return i;
    return -1;
}

/* Reads the index (kept in *weight_map_root for check_index) and opens every
 * shard it names, once each. */
static tide_status open_sharded(tide_checkpoint *ck, const char *index_path,
                                cJSON **weight_map_root) {
    tide_ctx *ctx = ck->ctx;
    char *text = NULL;
    size_t len = 0;
    tide_status st = tide_read_text_file(ctx, index_path, INDEX_MAX, &text, &len);
    if (st) return st;
    char why[128];
    cJSON *root = tide_st_parse_object(text, len, why, sizeof why);
    tide_free(text);
    if (!root) return tide_err(ctx, TIDE_E_FORMAT, "%s: %s", index_path, why);
    *weight_map_root = root;
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(wm))
        return tide_err(ctx, TIDE_E_FORMAT, "%s: missing or non-object 'weight_map'", index_path);
    const cJSON *e;
    cJSON_ArrayForEach(e, wm) {
        if (!cJSON_IsString(e))
            return tide_err(ctx, TIDE_E_FORMAT, "%s: weight_map entry '%s' is not a file name",
                            index_path, e->string);
        const char *fn = e->valuestring;
        if (!fn[0] || strchr(fn, '/') || strcmp(fn, ".") == 0 || strcmp(fn, "..") == 0)
            return tide_err(ctx, TIDE_E_FORMAT,
                            "%s: weight_map entry '%s' names '%s', not a file in the directory",
                            index_path, e->string, fn);
        if (file_index(ck, fn) >= 0) continue;
        if ((st = open_file(ck, fn))) {
            if (st == TIDE_E_NOT_FOUND) {
                char msg[TIDE_ERRMSG_MAX];
                snprintf(msg, sizeof msg, "%s", tide_ctx_last_error(ctx));
                return tide_err(ctx, st, "%s names shard '%s' for tensor '%s', but %s",
                                index_path, fn, e->string, msg);
            }
            return st;
        }
    }
    return TIDE_OK;
}

/* After sorting: every index entry's tensor is in the shard it names, and
 * every shard tensor is listed. */
static tide_status check_index(tide_checkpoint *ck, const char *index_path, const cJSON *root) {
    tide_ctx *ctx = ck->ctx;
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    unsigned char *seen = tide_calloc((size_t)ck->n_tensors + 1, 1);
    if (!seen) return tide_err(ctx, TIDE_E_NOMEM, "%s: out of memory", index_path);
    tide_status st = TIDE_OK;
    const cJSON *e;
    cJSON_ArrayForEach(e, wm) {
        int t = tide_checkpoint_find(ck, e->string);
        if (t < 0) {
            st = tide_err(ctx, TIDE_E_FORMAT,
                          "%s: tensor '%s' is listed for shard '%s' but absent from it",
                          index_path, e->string, e->valuestring);
            break;
        }
        const tide_ck_file *f = tide_checkpoint_tensor_file(ck, t);
        if (strcmp(f->name, e->valuestring) != 0) {
            st = tide_err(ctx, TIDE_E_FORMAT,
                          "%s: tensor '%s' is listed for shard '%s' but absent from it (found in "
                          "'%s')",
                          index_path, e->string, e->valuestring, f->name);
            break;
        }
        if (seen[t]) {
            st = tide_err(ctx, TIDE_E_FORMAT, "%s: tensor '%s' is listed twice in weight_map",
                          index_path, e->string);
            break;
        }
        seen[t] = 1;
    }
    for (int t = 0; !st && t < ck->n_tensors; t++)
        if (!seen[t])
            st = tide_err(ctx, TIDE_E_FORMAT, "%s: tensor '%s' is in shard '%s' but not in %s",
                          tide_checkpoint_tensor_file(ck, t)->path, ck->tensors[t].name,
                          tide_checkpoint_tensor_file(ck, t)->name, index_path);
    tide_free(seen);
    return st;
}

/* ---------------------------------------------------------------- open/free */

int tide_checkpoint_find(const tide_checkpoint *ck, const char *name) {
    int lo = 0, hi = ck->n_tensors - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(ck->tensors[mid].name, name);
        if (c == 0) return mid;
        if (c < 0) lo = mid + 1;
        else hi = mid - 1;
    }
    return -1;
}

void tide_checkpoint_free(tide_checkpoint *ck) {
    if (!ck) return;
    for (int i = 0; i < ck->n_files; i++) {
        tide_ck_file *f = &ck->files[i];
        if (f->map && !f->borrowed) munmap((void *)f->map, (size_t)f->size);
        if (f->fd >= 0 && !f->borrowed) close(f->fd);
        tide_free(f->path);
        tide_free(f->name);
    }
    for (int i = 0; i < ck->n_tensors; i++) tide_free(ck->tensors[i].name);
    tide_free(ck->files);
    tide_free(ck->tensors);
    tide_free(ck->dir);
    tide_gguf_close(ck->gguf);
    tide_free(ck);
}

/* dir: a checkpoint directory, or a GGUF file (model/gguf_model.c). Returns
 * TIDE_OK with *out set; TIDE_E_NOT_FOUND (no directory, config.json, model
 * file or listed shard), TIDE_E_IO, TIDE_E_FORMAT or TIDE_E_UNSUPPORTED (from
 * config.json or the GGUF metadata) with a message naming the file, tensor
 * and problem; TIDE_E_NOMEM. *out is NULL on failure. */
tide_status tide_checkpoint_open(tide_ctx *ctx, const char *dir, tide_checkpoint **out) {
    if (!out) return tide_err(ctx, TIDE_E_INVALID, "checkpoint_open: NULL out");
    *out = NULL;
    if (!dir || !*dir) return tide_err(ctx, TIDE_E_INVALID, "checkpoint_open: no directory");
    struct stat sd;
    if (stat(dir, &sd) != 0)
        return tide_err(ctx, errno == ENOENT ? TIDE_E_NOT_FOUND : TIDE_E_IO,
                        "checkpoint %s: %s", dir, strerror(errno));
    if (S_ISREG(sd.st_mode)) return tide_checkpoint_open_gguf(ctx, dir, out);
    if (!S_ISDIR(sd.st_mode))
        return tide_err(ctx, TIDE_E_NOT_FOUND, "checkpoint %s: neither a directory nor a GGUF file", dir);

    tide_checkpoint *ck = tide_calloc(1, sizeof *ck);
    if (!ck) return tide_err(ctx, TIDE_E_NOMEM, "out of memory opening checkpoint %s", dir);
    ck->ctx = ctx;
    ck->dir = tide_strdup(dir);
    char *cfg_path = NULL, *index_path = NULL, *single_path = NULL;
    cJSON *index_root = NULL;
    tide_status st = TIDE_OK;
    if (!ck->dir) {
        st = tide_err(ctx, TIDE_E_NOMEM, "out of memory opening checkpoint %s", dir);
        goto done;
    }
    /* "dir/" and "dir" name the same checkpoint; keep messages free of "//". */
    for (size_t l = strlen(ck->dir); l > 1 && ck->dir[l - 1] == '/'; l--) ck->dir[l - 1] = '\0';
    cfg_path = path_join(ck->dir, "config.json");
    index_path = path_join(ck->dir, "model.safetensors.index.json");
    single_path = path_join(ck->dir, "model.safetensors");
    if (!cfg_path || !index_path || !single_path) {
        st = tide_err(ctx, TIDE_E_NOMEM, "out of memory opening checkpoint %s", dir);
        goto done;
    }
    if (!file_exists(cfg_path)) {
        st = tide_err(ctx, TIDE_E_NOT_FOUND, "checkpoint %s: no config.json", ck->dir);
        goto done;
    }
    if ((st = tide_llama_config_load(ctx, cfg_path, &ck->cfg))) goto done;

    if (file_exists(index_path)) {
        if ((st = open_sharded(ck, index_path, &index_root))) goto done;
    } else if (file_exists(single_path)) {
        if ((st = open_file(ck, "model.safetensors"))) goto done;
    } else {
        st = tide_err(ctx, TIDE_E_NOT_FOUND,
                      "checkpoint %s: no model.safetensors or model.safetensors.index.json",
                      ck->dir);
        goto done;
    }

    if (ck->n_tensors > 1)
        qsort(ck->tensors, (size_t)ck->n_tensors, sizeof *ck->tensors, cmp_tensor_name);
    for (int i = 1; i < ck->n_tensors; i++) {
        const tide_ck_tensor *a = &ck->tensors[i - 1], *b = &ck->tensors[i];
        if (strcmp(a->name, b->name) != 0) continue;
        if (a->file == b->file)
            st = tide_err(ctx, TIDE_E_FORMAT, "%s: tensor '%s' appears twice in the header",
                          ck->files[a->file].path, a->name);
        else
            st = tide_err(ctx, TIDE_E_FORMAT, "checkpoint %s: duplicate tensor '%s' in shards '%s' and '%s'",
                          ck->dir, a->name, ck->files[a->file].name, ck->files[b->file].name);
        goto done;
    }
    if (index_root && (st = check_index(ck, index_path, index_root))) goto done;

done:
    cJSON_Delete(index_root);
    tide_free(cfg_path);
    tide_free(index_path);
    tide_free(single_path);
    if (st) {
        tide_checkpoint_free(ck);
        return st;
    }
    *out = ck;
    return TIDE_OK;
}

/* ---------------------------------------------------------------- queries */

const tide_llama_config *tide_checkpoint_config(const tide_checkpoint *ck) { return &ck->cfg; }

int tide_checkpoint_n_tensors(const tide_checkpoint *ck) { return ck ? ck->n_tensors : 0; }

static void fill_info(const tide_checkpoint *ck, int i, tide_tensor_info *info) {
    const tide_ck_tensor *t = &ck->tensors[i];
    const tide_ck_file *f = &ck->files[t->file];
    memset(info, 0, sizeof *info);
    info->name = t->name;
    info->dtype = t->dtype;
    info->ndim = t->ndim;
    memcpy(info->shape, t->shape, sizeof info->shape);
    info->nbytes = t->nbytes;
    info->data = f->map + t->offset;
    info->file = f->path;
    info->file_offset = t->offset;
}

/* Returns TIDE_OK with *info filled (pointers valid while ck is open), or
 * TIDE_E_NOT_FOUND. */
tide_status tide_checkpoint_get(const tide_checkpoint *ck, const char *name, tide_tensor_info *info) {
    int i = name ? tide_checkpoint_find(ck, name) : -1;
    if (i < 0)
        return tide_err(ck->ctx, TIDE_E_NOT_FOUND, "checkpoint %s: no tensor '%s'", ck->dir,
                        name ? name : "(null)");
    fill_info(ck, i, info);
    return TIDE_OK;
}

/* Returns TIDE_OK for 0 <= i < n_tensors (tensors in name order), else
 * TIDE_E_NOT_FOUND. */
tide_status tide_checkpoint_get_index(const tide_checkpoint *ck, int i, tide_tensor_info *info) {
    if (i < 0 || i >= ck->n_tensors)
        return tide_err(ck->ctx, TIDE_E_NOT_FOUND, "checkpoint %s: tensor index %d out of 0..%d",
                        ck->dir, i, ck->n_tensors - 1);
    fill_info(ck, i, info);
    return TIDE_OK;
}

/* ---------------------------------------------------------------- match */

static bool ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* Returns TIDE_OK, or TIDE_E_FORMAT naming the first offending tensor: a graph
 * WEIGHT missing from the checkpoint or stored with another dtype or shape, or
 * a checkpoint tensor the graph does not use. With tied embeddings
 * lm_head.weight may be absent (the embedding table stands for it) or present
 * unused; HF's rotary_emb.inv_freq buffers are ignored. */
tide_status tide_checkpoint_match(const tide_checkpoint *ck, const tide_graph *g) {
    tide_ctx *ctx = ck->ctx;
    bool tied = ck->cfg.tie_word_embeddings;
    for (int i = 0; i < g->n_tensors; i++) {
        const tide_tensor *gt = &g->tensors[i];
        if (gt->role != TIDE_ROLE_WEIGHT) continue;
        int c = tide_checkpoint_find(ck, gt->name);
        if (c < 0) {
            if (tied && strcmp(gt->name, "lm_head.weight") == 0) continue;
            return tide_err(ctx, TIDE_E_FORMAT, "checkpoint %s: tensor '%s' the model needs is missing",
                            ck->dir, gt->name);
        }
        const tide_ck_tensor *ct = &ck->tensors[c];
        bool same = ct->dtype == gt->dtype && ct->ndim == gt->ndim;
        for (int d = 0; same && d < gt->ndim; d++) same = ct->shape[d] == gt->shape[d];
        if (!same) {
            char a[128], b[128];
            return tide_err(ctx, TIDE_E_FORMAT,
                            "%s: tensor '%s': expected %s %s, found %s %s",
                            tide_checkpoint_tensor_file(ck, c)->path, gt->name,
                            tide_dtype_name(gt->dtype), tide_st_shape_str(a, sizeof a, gt->ndim, gt->shape),
                            tide_dtype_name(ct->dtype), tide_st_shape_str(b, sizeof b, ct->ndim, ct->shape));
        }
    }
    for (int c = 0; c < ck->n_tensors; c++) {
        const char *name = ck->tensors[c].name;
        int i = tide_graph_find(g, name);
        if (i >= 0 && g->tensors[i].role == TIDE_ROLE_WEIGHT) continue;
        if (ends_with(name, "rotary_emb.inv_freq")) continue;
        if (tied && strcmp(name, "lm_head.weight") == 0) continue;
        return tide_err(ctx, TIDE_E_FORMAT, "%s: extra tensor '%s' that the model does not use",
                        tide_checkpoint_tensor_file(ck, c)->path, name);
    }
    return TIDE_OK;
}

/* Reads every mapped page once (with a readahead hint first) so that the first
 * run is not timed on page faults. Returns TIDE_OK or TIDE_E_IO. */
tide_status tide_checkpoint_prefetch(tide_checkpoint *ck) {
    uint64_t total = 0, done = 0;
    for (int f = 0; f < ck->n_files; f++) total += ck->files[f].size;
    long page = sysconf(_SC_PAGESIZE);
    if (page <= 0) page = 4096;
    volatile unsigned char sink = 0;
    for (int f = 0; f < ck->n_files; f++) {
        const tide_ck_file *fl = &ck->files[f];
        if (!fl->map || !fl->size) continue;
        if (madvise((void *)fl->map, fl->size, MADV_WILLNEED) != 0 && errno != EINVAL)
            return tide_err(ck->ctx, TIDE_E_IO, "%s: madvise: %s", fl->path, strerror(errno));
        for (uint64_t off = 0; off < fl->size; off += (uint64_t)page) {
            sink ^= fl->map[off];
            if ((off & ((UINT64_C(64) << 20) - 1)) == 0) tide_progress(ck->ctx, "loading", done + off, total);
        }
        done += fl->size;
    }
    tide_progress(ck->ctx, "loading", total, total);
    (void)sink;
    return TIDE_OK;
}
