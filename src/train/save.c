/*
 * save.c - training checkpoints (save.h): the directory-level atomic save
 * and the optimizer-state reader for resume.
 *
 * Design note.
 *   Invariants kept by tide_train_save_dir:
 *   S1. dir holds, at every instant, either the checkpoint it held before
 *       the call or the whole new one: the new one is built and fsynced under
 *       a temporary sibling name and enters dir by one rename (or exchange).
 *   S2. Nothing is deleted that a save did not write: an existing dir is
 *       replaced only when every entry in it is a checkpoint file
 *       (ck_file_name), and the removal after an exchange or of a stale
 *       temporary unlinks only such files, then the directory.
 *   S3. A failure before publication leaves no temporary behind; after
 *       publication the save has succeeded, and a leftover of the old
 *       checkpoint that cannot be removed is cleaned by a later save (S2's
 *       stale rule).
 *   The states of dir and its sibling tmp = "<dir>.tmp-<pid>-<n>":
 *     (old | none)       --make_tmp-->        tmp empty
 *     tmp empty          --write_checkpoint-> tmp whole, fsynced
 *     tmp whole          --publish-->         dir new, tmp holds old (or nothing)
 *     tmp holds old      --remove_ck_dir-->   done (parent fsynced)
 *   and from any state before publish, remove_ck_dir(tmp) back to the start.
 *
 * The reader maps optimizer.safetensors through the one safetensors reader
 * (model/st_file.c, as the model loader does) and checks every extent it
 * hands out (dtype F32, the parameter's shape, inside the data section,
 * aligned); the files are written by the one writer there.
 */
#include "train/save.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---------------------------------------------------------------- conversion */

void tide_convert_from_f32(const float *src, tide_dtype dt, void *dst, size_t n) {
    uint16_t *h = dst;
    switch (dt) {
    case TIDE_BF16:
        for (size_t i = 0; i < n; i++) h[i] = tide_f32_to_bf16(src[i]);
        break;
    case TIDE_F16:
        for (size_t i = 0; i < n; i++) h[i] = tide_f32_to_f16(src[i]);
        break;
    default:
        memmove(dst, src, n * sizeof(float));
        break;
    }
}

/* ---------------------------------------------------------------- config */

/* The fields compared on resume and hashed into the fingerprint. */
typedef struct cfg_field {
    const char *name;
    char value[32];
} cfg_field;

enum { N_CFG_FIELDS = 9 };

static void cfg_fields(const tide_llama_config *c, cfg_field f[N_CFG_FIELDS]) {
    static const char *const names[N_CFG_FIELDS] = {
        "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
        "vocab_size", "rms_norm_eps", "rope_theta", "tie_word_embeddings"};
    const int ints[6] = {c->hidden_size, c->intermediate_size, c->num_hidden_layers, c->num_attention_heads,
                         c->num_key_value_heads, c->vocab_size};
    for (int i = 0; i < N_CFG_FIELDS; i++) f[i].name = names[i];
    for (int i = 0; i < 6; i++) snprintf(f[i].value, sizeof f[i].value, "%d", ints[i]);
    snprintf(f[6].value, sizeof f[6].value, "%.9g", (double)c->rms_norm_eps);
    snprintf(f[7].value, sizeof f[7].value, "%.9g", (double)c->rope_theta);
    snprintf(f[8].value, sizeof f[8].value, "%s", c->tie_word_embeddings ? "true" : "false");
}

uint64_t tide_train_config_fingerprint(const tide_llama_config *cfg) {
    cfg_field f[N_CFG_FIELDS];
    cfg_fields(cfg, f);
    uint64_t h = 1469598103934665603ull; /* FNV-1a over "name=value;" */
    for (int i = 0; i < N_CFG_FIELDS; i++) {
        for (const char *s = f[i].name; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
        h = (h ^ '=') * 1099511628211ull;
        for (const char *s = f[i].value; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
        h = (h ^ ';') * 1099511628211ull;
    }
    return h;
}

/* ---------------------------------------------------------------- directories */

static const char *const ck_files[] = {"config.json", "model.safetensors", "optimizer.safetensors",
                                       "adapter_model.safetensors", "adapter_config.json"};

/* Whether name is a file a save writes, or the temporary of one that a crash
 * left (tide_file_begin's "<name>.tmp.<pid>.<n>"). */
static bool ck_file_name(const char *name) {
    for (size_t i = 0; i < sizeof ck_files / sizeof ck_files[0]; i++) {
        size_t n = strlen(ck_files[i]);
        if (strncmp(name, ck_files[i], n) == 0 && (name[n] == '\0' || strncmp(name + n, ".tmp.", 5) == 0))
            return true;
    }
    return false;
}

/* The first entry of dir that is not a checkpoint file, copied into bad
 * ("" when there is none). Returns 0 or the errno of reading dir. */
static int foreign_entry(const char *dir, char *bad, size_t n) {
    bad[0] = '\0';
    DIR *d = opendir(dir);
    if (!d) return errno;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..") || ck_file_name(de->d_name)) continue;
        snprintf(bad, n, "%s", de->d_name);
        break;
    }
    closedir(d);
    return 0;
}

/* Removes the checkpoint files of dir, then dir (S2). Returns 0 or an errno. */
static int remove_ck_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return errno;
    struct dirent *de;
    while ((de = readdir(d)) != NULL)
        if (ck_file_name(de->d_name)) (void)unlinkat(dirfd(d), de->d_name, 0);
    closedir(d);
    return rmdir(dir) == 0 ? 0 : errno;
}

/* Removes the siblings "<base>.tmp-<pid>-<n>" of a save that crashed (pid
 * not running) or an earlier save of this process, when they hold only
 * checkpoint files. Best effort. */
static void remove_stale(const char *parent, const char *base) {
    DIR *d = opendir(parent);
    if (!d) return;
    size_t bl = strlen(base);
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        const char *s = de->d_name;
        if (strncmp(s, base, bl) != 0 || strncmp(s + bl, ".tmp-", 5) != 0) continue;
        char *end;
        long pid = strtol(s + bl + 5, &end, 10);
        if (pid <= 0 || *end != '-' || !end[1] || strspn(end + 1, "0123456789") != strlen(end + 1)) continue;
        if (pid != (long)getpid() && !(kill((pid_t)pid, 0) != 0 && errno == ESRCH)) continue;
        char path[PATH_MAX], bad[256];
        if (snprintf(path, sizeof path, "%s/%s", parent, s) >= (int)sizeof path) continue;
        struct stat sb;
        if (lstat(path, &sb) != 0 || !S_ISDIR(sb.st_mode)) continue;
        if (foreign_entry(path, bad, sizeof bad) == 0 && !bad[0]) (void)remove_ck_dir(path);
    }
    closedir(d);
}

/* mkdir -p. Returns 0 or an errno (ENOTDIR: a component is not a directory). */
static int make_dirs(const char *dir) {
    char p[PATH_MAX];
    if (snprintf(p, sizeof p, "%s", dir) >= (int)sizeof p) return ENAMETOOLONG;
    for (char *s = p + 1;; s++) {
        if (*s != '/' && *s != '\0') continue;
        char c = *s;
        *s = '\0';
        if (mkdir(p, 0755) != 0 && errno != EEXIST) return errno;
        *s = c;
        if (!c) break;
    }
    struct stat st;
    if (stat(dir, &st) != 0) return errno;
    return S_ISDIR(st.st_mode) ? 0 : ENOTDIR;
}

/* dir + "/" + name into out; false when it does not fit. */
static bool path_in(char *out, size_t n, const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    if (a + b + 2 > n) return false;
    memcpy(out, dir, a);
    out[a] = '/';
    memcpy(out + a + 1, name, b + 1);
    return true;
}

static void fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
}

/* ---------------------------------------------------------------- saving */

typedef struct save_fill {
    const tide_train_save *s;
    bool optimizer; /* entry i is part 1 + i % 3 of parameter i / 3; else the model's parameter i */
} save_fill;

static tide_status fill_part(void *user, int i, uint64_t elem0, uint64_t n, void *dst) {
    const save_fill *f = user;
    if (!f->optimizer) return f->s->fill(f->s->user, TIDE_PART_MODEL, i, f->s->model_dtype, elem0, n, dst);
    return f->s->fill(f->s->user, (tide_train_part)(TIDE_PART_MASTER + i % 3), i / 3, TIDE_F32, elem0, n, dst);
}

static const char *const part_prefix[TIDE_PART_COUNT] = {"", "master.", "exp_avg.", "exp_avg_sq."};

enum { N_STD_META = 15 };

/* The standard metadata of optimizer.safetensors into m[0..N_STD_META). */
static void std_meta(const tide_train_save *s, char val[N_STD_META][32], tide_st_meta *m) {
    const tide_train_meta *t = &s->meta;
    static const char *const keys[N_STD_META] = {
        "format", "step", "tokens_seen", "batch", "seq", "accum", "shuffle", "seed", "lr", "beta1", "beta2",
        "adam_eps", "weight_decay", "max_norm", "config_fingerprint"};
    snprintf(val[0], 32, "%s", TIDE_TRAIN_FORMAT);
    snprintf(val[1], 32, "%lld", (long long)t->step);
    snprintf(val[2], 32, "%lld", (long long)t->tokens_seen);
    snprintf(val[3], 32, "%d", t->batch);
    snprintf(val[4], 32, "%d", t->seq);
    snprintf(val[5], 32, "%d", t->accum);
    snprintf(val[6], 32, "%s", t->shuffle ? "true" : "false");
    snprintf(val[7], 32, "%llu", (unsigned long long)t->seed);
    const float fl[6] = {t->lr, t->beta1, t->beta2, t->adam_eps, t->weight_decay, t->max_norm};
    for (int i = 0; i < 6; i++) snprintf(val[8 + i], 32, "%.9g", (double)fl[i]); /* f32 round-trips */
    snprintf(val[14], 32, "%016llx", (unsigned long long)tide_train_config_fingerprint(s->cfg));
    for (int i = 0; i < N_STD_META; i++) m[i] = (tide_st_meta){keys[i], val[i]};
}

/* config.json, model.safetensors and optimizer.safetensors into dir. */
static tide_status write_checkpoint(tide_ctx *ctx, const char *dir, const tide_train_save *s) {
    int n = s->n_params;
    char path[PATH_MAX];
    tide_llama_config c = *s->cfg;
    if (!s->lora_config) c.dtype = s->model_dtype;
    /* The longest name first: the others fit when it does. */
    if (!path_in(path, sizeof path, dir, "adapter_model.safetensors") ||
        !path_in(path, sizeof path, dir, "config.json"))
        return tide_err(ctx, TIDE_E_INVALID, "'%s': path too long", dir);
    tide_status st = tide_llama_config_save(ctx, &c, path);
    if (st) return st;

    size_t names_len = 0;
    for (int i = 0; i < n; i++) names_len += 3 * (strlen(s->params[i].name) + 12);
    tide_st_entry *e = tide_malloc((size_t)(3 * n + 1) * sizeof *e);
    tide_st_meta *meta = tide_malloc((size_t)(N_STD_META + s->n_extra) * sizeof *meta);
    char *names = tide_malloc(names_len + 1);
    if (!e || !meta || !names) {
        st = tide_err(ctx, TIDE_E_NOMEM, "%s: out of memory", dir);
        goto done;
    }
    for (int i = 0; i < n; i++) {
        const tide_train_param *p = &s->params[i];
        e[i] = (tide_st_entry){p->name, s->model_dtype, p->ndim, {0}};
        memcpy(e[i].shape, p->shape, sizeof e[i].shape);
    }
    save_fill f = {s, false};
    const tide_st_meta pt = {"format", "pt"};
    path_in(path, sizeof path, dir, s->lora_config ? "adapter_model.safetensors" : "model.safetensors");
    if ((st = tide_safetensors_write(ctx, path, e, n, &pt, 1, fill_part, &f))) goto done;
    if (s->lora_config) {
        path_in(path, sizeof path, dir, "adapter_config.json");
        if ((st = tide_write_file_atomic(ctx, "adapter config", path, s->lora_config, strlen(s->lora_config))))
            goto done;
    }

    char *q = names;
    for (int i = 0; i < 3 * n; i++) {
        const tide_train_param *p = &s->params[i / 3];
        e[i] = (tide_st_entry){q, TIDE_F32, p->ndim, {0}};
        memcpy(e[i].shape, p->shape, sizeof e[i].shape);
        q += sprintf(q, "%s%s", part_prefix[TIDE_PART_MASTER + i % 3], p->name) + 1;
    }
    char val[N_STD_META][32];
    std_meta(s, val, meta);
    for (int i = 0; i < s->n_extra; i++) meta[N_STD_META + i] = s->extra[i];
    f.optimizer = true;
    path_in(path, sizeof path, dir, "optimizer.safetensors");
    st = tide_safetensors_write(ctx, path, e, 3 * n, meta, N_STD_META + s->n_extra, fill_part, &f);
done:
    tide_free(e);
    tide_free(meta);
    tide_free(names);
    return st;
}

static tide_status check_save(tide_ctx *ctx, const char *dir, const tide_train_save *s) {
    if (!s || !s->cfg || !s->fill || s->n_params < 1 || !s->params || s->n_extra < 0 || (s->n_extra && !s->extra))
        return tide_err(ctx, TIDE_E_INVALID, "checkpoint '%s': no config, fill or parameters given", dir);
    if (s->model_dtype != TIDE_F32 && s->model_dtype != TIDE_F16 && s->model_dtype != TIDE_BF16)
        return tide_err(ctx, TIDE_E_INVALID, "checkpoint '%s': model dtype %s is not f32, f16 or bf16", dir,
                        tide_dtype_name(s->model_dtype));
    for (int i = 0; i < s->n_params; i++)
        if (!s->params[i].name || !s->params[i].name[0])
            return tide_err(ctx, TIDE_E_INVALID, "checkpoint '%s': parameter %d has no name", dir, i);
    return tide_llama_config_check(ctx, s->cfg);
}

/* Moves the finished tmp to dir (S1); old gets the temporary name of what
 * dir held, "" when nothing. Returns 0 or an errno. */
static int publish(const char *tmp, const char *dir, bool exists, char *old, size_t n_old) {
    old[0] = '\0';
    if (!exists) return rename(tmp, dir) == 0 ? 0 : errno;
    if (renameat2(AT_FDCWD, tmp, AT_FDCWD, dir, RENAME_EXCHANGE) == 0) {
        snprintf(old, n_old, "%s", tmp);
        return 0;
    }
    if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP) return errno;
    /* No exchange here: dir aside first, under a name S3's rule cleans. */
    for (unsigned k = 1000;; k++) {
        if (snprintf(old, n_old, "%s.tmp-%ld-%u", dir, (long)getpid(), k) >= (int)n_old) return ENAMETOOLONG;
        if (access(old, F_OK) != 0) break;
    }
    if (rename(dir, old) != 0) return errno;
    if (rename(tmp, dir) != 0) {
        int e = errno;
        (void)rename(old, dir);
        old[0] = '\0';
        return e;
    }
    return 0;
}

tide_status tide_train_save_dir(tide_ctx *ctx, const char *dir, const tide_train_save *s) {
    char d[PATH_MAX], parent[PATH_MAX], tmp[PATH_MAX], old[PATH_MAX], bad[256];
    if (!dir || !*dir) return tide_err(ctx, TIDE_E_INVALID, "checkpoint: no directory given");
    if (snprintf(d, sizeof d, "%s", dir) >= (int)sizeof d - 32)
        return tide_err(ctx, TIDE_E_INVALID, "checkpoint '%s': path too long", dir);
    for (size_t l = strlen(d); l > 1 && d[l - 1] == '/'; l--) d[l - 1] = '\0';
    char *slash = strrchr(d, '/');
    const char *base = slash ? slash + 1 : d;
    if (!*base || !strcmp(base, ".") || !strcmp(base, ".."))
        return tide_err(ctx, TIDE_E_INVALID, "checkpoint '%s': not a name a directory can be saved under", dir);
    if (!slash) snprintf(parent, sizeof parent, ".");
    else if (slash == d) snprintf(parent, sizeof parent, "/");
    else snprintf(parent, sizeof parent, "%.*s", (int)(slash - d), d);
    tide_status st = check_save(ctx, d, s);
    if (st) return st;

    int e = make_dirs(parent);
    if (e == ENOTDIR || e == EEXIST)
        return tide_err(ctx, TIDE_E_IO, "checkpoint '%s': parent '%s' is not a directory", d, parent);
    if (e) return tide_err(ctx, TIDE_E_IO, "checkpoint '%s': cannot create parent '%s': %s", d, parent, strerror(e));
    if (access(parent, W_OK | X_OK) != 0)
        return tide_err(ctx, TIDE_E_IO, "checkpoint '%s': cannot write in '%s': %s", d, parent, strerror(errno));
    struct stat sb;
    bool exists = lstat(d, &sb) == 0;
    if (!exists && errno != ENOENT)
        return tide_err(ctx, TIDE_E_IO, "checkpoint '%s': cannot stat: %s", d, strerror(errno));
    if (exists && S_ISLNK(sb.st_mode))
        return tide_err(ctx, TIDE_E_INVALID, "checkpoint '%s': is a symbolic link; give the directory itself", d);
    if (exists && !S_ISDIR(sb.st_mode))
        return tide_err(ctx, TIDE_E_INVALID, "checkpoint '%s': exists and is not a directory", d);
    if (exists && (e = foreign_entry(d, bad, sizeof bad)))
        return tide_err(ctx, TIDE_E_IO, "checkpoint '%s': cannot read: %s", d, strerror(e));
    if (exists && bad[0])
        return tide_err(ctx, TIDE_E_INVALID,
                        "checkpoint '%s': exists and holds '%s', which is not a checkpoint file: refusing to replace "
                        "it",
                        d, bad);
    remove_stale(parent, base);

    for (unsigned k = 0;; k++) {
        if (snprintf(tmp, sizeof tmp, "%s.tmp-%ld-%u", d, (long)getpid(), k) >= (int)sizeof tmp)
            return tide_err(ctx, TIDE_E_INVALID, "checkpoint '%s': path too long", d);
        if (mkdir(tmp, 0755) == 0) break;
        if (errno != EEXIST || k >= 999)
            return tide_err(ctx, TIDE_E_IO, "checkpoint '%s': cannot create '%s': %s", d, tmp, strerror(errno));
    }
    st = write_checkpoint(ctx, tmp, s);
    if (!st) {
        int fd = open(tmp, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0 || fsync(fd) != 0) st = tide_err(ctx, TIDE_E_IO, "'%s': fsync failed: %s", tmp, strerror(errno));
        if (fd >= 0) close(fd);
    }
    if (!st && (e = publish(tmp, d, exists, old, sizeof old)))
        st = tide_err(ctx, TIDE_E_IO, "'%s': cannot rename '%s' over it: %s", d, tmp, strerror(e));
    if (st) {
        char why[TIDE_ERRMSG_MAX];
        snprintf(why, sizeof why, "%s", tide_ctx_last_error(ctx));
        (void)remove_ck_dir(tmp);
        return tide_err(ctx, st, "checkpoint '%s' not saved: %s", d, why);
    }
    if (old[0]) (void)remove_ck_dir(old);
    fsync_dir(parent);
    return TIDE_OK;
}

/* ---------------------------------------------------------------- resuming */

struct tide_train_resume {
    tide_ctx *ctx;
    char *path; /* dir/optimizer.safetensors */
    tide_st_file f; /* mapped, its header parsed (st_file.c); the descriptor closed */
    cJSON *root;    /* f's header */
    const cJSON *meta_obj;
    tide_train_meta meta;
    int n_params;
    uint64_t *offset; /* [3 * param + part - 1]: absolute offset in the file */
};

void tide_train_resume_free(tide_train_resume *r) {
    if (!r) return;
    tide_st_close(&r->f);
    tide_free(r->offset);
    tide_free(r->path);
    tide_free(r);
}

/* config.json of dir against cfg. */
static tide_status check_config(tide_ctx *ctx, const char *dir, const tide_llama_config *cfg, uint64_t *fp) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (access(path, F_OK) != 0) return tide_err(ctx, TIDE_E_NOT_FOUND, "checkpoint %s: no config.json", dir);
    tide_llama_config saved;
    tide_status st = tide_llama_config_load(ctx, path, &saved);
    if (st) return st;
    cfg_field a[N_CFG_FIELDS], b[N_CFG_FIELDS];
    cfg_fields(&saved, a);
    cfg_fields(cfg, b);
    for (int i = 0; i < N_CFG_FIELDS; i++)
        if (strcmp(a[i].value, b[i].value) != 0)
            return tide_err(ctx, TIDE_E_FORMAT,
                            "checkpoint %s: not a checkpoint of the model being trained: %s is %s in its "
                            "config.json, %s in the model",
                            dir, a[i].name, a[i].value, b[i].value);
    *fp = tide_train_config_fingerprint(&saved);
    return TIDE_OK;
}

/* A metadata string, or NULL. */
static const char *meta_str(const cJSON *m, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(m, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* The standard metadata into r->meta. */
static tide_status read_meta(tide_train_resume *r) {
    tide_train_meta *t = &r->meta;
    static const char *const ints[] = {"step", "tokens_seen", "batch", "seq", "accum", "seed"};
    static const char *const floats[] = {"lr", "beta1", "beta2", "adam_eps", "weight_decay", "max_norm"};
    float *fv[6] = {&t->lr, &t->beta1, &t->beta2, &t->adam_eps, &t->weight_decay, &t->max_norm};
    for (int i = 0; i < 6; i++) {
        const char *s = meta_str(r->meta_obj, ints[i]);
        char *end = NULL;
        errno = 0;
        unsigned long long u = s && *s && *s != '-' ? strtoull(s, &end, 10) : 0;
        bool ok = s && end && !*end && !errno && (i == 5 || u <= (i < 2 ? (unsigned long long)INT64_MAX : INT32_MAX));
        if (!ok)
            return tide_err(r->ctx, TIDE_E_FORMAT, "%s: metadata '%s' is %s%s%s, not a non-negative integer", r->path,
                            ints[i], s ? "'" : "missing", s ? s : "", s ? "'" : "");
        if (i == 0) t->step = (int64_t)u;
        else if (i == 1) t->tokens_seen = (int64_t)u;
        else if (i == 2) t->batch = (int)u;
        else if (i == 3) t->seq = (int)u;
        else if (i == 4) t->accum = (int)u;
        else t->seed = u;
    }
    for (int i = 0; i < 6; i++) {
        const char *s = meta_str(r->meta_obj, floats[i]);
        char *end = NULL;
        float v = s ? strtof(s, &end) : 0.0f;
        if (!s || !*s || *end)
            return tide_err(r->ctx, TIDE_E_FORMAT, "%s: metadata '%s' is %s%s%s, not a number", r->path, floats[i],
                            s ? "'" : "missing", s ? s : "", s ? "'" : "");
        *fv[i] = v;
    }
    const char *sh = meta_str(r->meta_obj, "shuffle");
    if (!sh || (strcmp(sh, "true") != 0 && strcmp(sh, "false") != 0))
        return tide_err(r->ctx, TIDE_E_FORMAT, "%s: metadata 'shuffle' is not 'true' or 'false'", r->path);
    t->shuffle = strcmp(sh, "true") == 0;
    return TIDE_OK;
}

/* Tensor name (part, parameter) of the file: checked (st_file.c, then F32
 * of the parameter's shape) and located. */
static tide_status read_tensor(tide_train_resume *r, const char *name, const tide_train_param *p, uint64_t *offset) {
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(r->root, name);
    if (!e) return tide_err(r->ctx, TIDE_E_NOT_FOUND, "%s: tensor '%s' is missing", r->path, name);
    tide_st_tensor t;
    tide_status st = tide_st_tensor_read(r->ctx, r->path, &r->f, e, &t);
    if (st) return st;
    if (t.dtype != TIDE_F32)
        return tide_err(r->ctx, TIDE_E_FORMAT, "%s: tensor '%s': dtype %s, expected F32", r->path, name,
                        cJSON_GetObjectItemCaseSensitive(e, "dtype")->valuestring);
    bool same = t.ndim == p->ndim;
    for (int i = 0; i < t.ndim && same; i++) same = t.shape[i] == p->shape[i];
    if (!same) {
        char a[128], b[128];
        return tide_err(r->ctx, TIDE_E_FORMAT, "%s: tensor '%s': shape %s, expected %s", r->path, name,
                        tide_st_shape_str(a, sizeof a, t.ndim, t.shape),
                        tide_st_shape_str(b, sizeof b, p->ndim, p->shape));
    }
    *offset = t.offset;
    return TIDE_OK;
}

/* Maps and checks dir/optimizer.safetensors. */
static tide_status open_optimizer(tide_train_resume *r, const tide_train_param *params, int n, uint64_t fingerprint) {
    tide_ctx *ctx = r->ctx;
    tide_status st = tide_st_open(ctx, r->path, &r->f);
    if (st) return st;
    close(r->f.fd); /* mapped: the descriptor is not needed */
    r->f.fd = -1;
    r->root = r->f.header;
    r->meta_obj = cJSON_GetObjectItemCaseSensitive(r->root, "__metadata__");
    const char *fmt = cJSON_IsObject(r->meta_obj) ? meta_str(r->meta_obj, "format") : NULL;
    if (!fmt || strcmp(fmt, TIDE_TRAIN_FORMAT) != 0)
        return tide_err(ctx, TIDE_E_FORMAT, "%s: not a tide training checkpoint: format '%s', expected '%s'", r->path,
                        fmt ? fmt : "(none)", TIDE_TRAIN_FORMAT);
    if ((st = read_meta(r))) return st;
    char want[32];
    snprintf(want, sizeof want, "%016llx", (unsigned long long)fingerprint);
    const char *got = meta_str(r->meta_obj, "config_fingerprint");
    if (!got || strcmp(got, want) != 0)
        return tide_err(ctx, TIDE_E_FORMAT, "%s: config_fingerprint %s does not match config.json's %s", r->path,
                        got ? got : "(none)", want);

    char name[512];
    for (int i = 0; i < n; i++)
        for (int k = 0; k < 3; k++) {
            snprintf(name, sizeof name, "%s%s", part_prefix[TIDE_PART_MASTER + k], params[i].name);
            if ((st = read_tensor(r, name, &params[i], &r->offset[3 * i + k]))) return st;
        }
    if (cJSON_GetArraySize(r->root) != 3 * n + 1) {
        /* Something besides the expected tensors: name it. */
        const cJSON *x;
        cJSON_ArrayForEach(x, r->root) {
            if (strcmp(x->string, "__metadata__") == 0) continue;
            bool known = false;
            for (int i = 0; i < n && !known; i++)
                for (int k = 0; k < 3 && !known; k++) {
                    snprintf(name, sizeof name, "%s%s", part_prefix[TIDE_PART_MASTER + k], params[i].name);
                    known = strcmp(name, x->string) == 0;
                }
            if (!known)
                return tide_err(ctx, TIDE_E_FORMAT, "%s: extra tensor '%s' that the model being trained does not have",
                                r->path, x->string);
        }
        return tide_err(ctx, TIDE_E_FORMAT, "%s: a tensor appears twice in the header", r->path);
    }
    return TIDE_OK;
}

tide_status tide_train_resume_open(tide_ctx *ctx, const char *dir, const tide_llama_config *cfg,
                                   const tide_train_param *params, int n_params, tide_train_resume **out) {
    if (!out) return tide_err(ctx, TIDE_E_INVALID, "train_resume_open: NULL out");
    *out = NULL;
    if (!dir || !*dir || !cfg || n_params < 1 || !params)
        return tide_err(ctx, TIDE_E_INVALID, "train_resume_open: no directory, config or parameters");
    for (int i = 0; i < n_params; i++)
        if (!params[i].name || params[i].ndim < 0 || params[i].ndim > TIDE_MAX_DIMS)
            return tide_err(ctx, TIDE_E_INVALID, "train_resume_open: parameter %d is malformed", i);
    struct stat sb;
    if (stat(dir, &sb) != 0)
        return tide_err(ctx, errno == ENOENT ? TIDE_E_NOT_FOUND : TIDE_E_IO, "checkpoint %s: %s", dir, strerror(errno));
    if (!S_ISDIR(sb.st_mode)) return tide_err(ctx, TIDE_E_NOT_FOUND, "checkpoint %s: not a directory", dir);
    uint64_t fp = 0;
    tide_status st = check_config(ctx, dir, cfg, &fp);
    if (st) return st;
    tide_train_resume *r = tide_calloc(1, sizeof *r);
    if (r) r->f.fd = -1; /* nothing open yet */
    size_t plen = strlen(dir) + sizeof "/optimizer.safetensors";
    if (!r || !(r->path = tide_malloc(plen)) || !(r->offset = tide_calloc((size_t)n_params * 3, sizeof *r->offset))) {
        tide_train_resume_free(r);
        return tide_err(ctx, TIDE_E_NOMEM, "checkpoint %s: out of memory", dir);
    }
    snprintf(r->path, plen, "%s/optimizer.safetensors", dir);
    r->ctx = ctx;
    r->n_params = n_params;
    if ((st = open_optimizer(r, params, n_params, fp))) {
        tide_train_resume_free(r);
        return st;
    }
    *out = r;
    return TIDE_OK;
}

const tide_train_meta *tide_train_resume_meta(const tide_train_resume *r) { return &r->meta; }

const char *tide_train_resume_get(const tide_train_resume *r, const char *key) {
    return key ? meta_str(r->meta_obj, key) : NULL;
}

const float *tide_train_resume_tensor(const tide_train_resume *r, tide_train_part part, int param,
                                      uint64_t *file_offset) {
    if (!r || param < 0 || param >= r->n_params || part < TIDE_PART_MASTER || part >= TIDE_PART_COUNT) return NULL;
    uint64_t off = r->offset[3 * param + (part - TIDE_PART_MASTER)];
    if (file_offset) *file_offset = off;
    return (const float *)(r->f.map + off);
}

const char *tide_train_resume_path(const tide_train_resume *r) { return r->path; }
