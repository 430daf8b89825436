/*
 * lora.c - a PEFT LoRA adapter applied to an open checkpoint at run time
 * (tide_checkpoint_add_lora, tide.h).
 *
 * The adapter directory holds adapter_config.json (r, lora_alpha,
 * target_modules: read and refused as --lora-init's are, by
 * tide_lora_read_config) and adapter_model.safetensors, whose tensors must be
 * exactly, for every layer L and every target T of the config,
 *   base_model.model.model.layers.L.self_attn.T.lora_A.weight  (r, K)
 *   base_model.model.model.layers.L.self_attn.T.lora_B.weight  (N, r)
 * (mlp.T for gate_proj, up_proj, down_proj), W (N, K) the projection, all of
 * one dtype: f32, f16 or bf16. The file is opened, mapped and kept like a
 * checkpoint file (checkpoint.h), and its tensors join the checkpoint's
 * sorted table, so that the runtime finds, pins, uploads, streams or reads
 * them from SSD as any weight; the config's lora_* fields tell the graph
 * builder (model/llama.c) to add each targeted matmul's branch
 *   t = x A^T;  ts = t . S;  out += ts B^T       S = (alpha / r) I
 * which is training's forward (train/train_graph.c) and PEFT's unmerged one
 * up to f32 rounding (PEFT scales after B).
 *
 * Everything is checked before the checkpoint changes: on failure it is as
 * it was.
 */
#include "model/checkpoint.h"
#include "model/st_file.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The module path of target i inside a layer. */
static const char *const lora_module_path[TIDE_LORA_N] = {"self_attn.q_proj", "self_attn.k_proj",
                                                          "self_attn.v_proj", "self_attn.o_proj",
                                                          "mlp.gate_proj",    "mlp.up_proj",
                                                          "mlp.down_proj"};

/* The (N, K) of target i's projection under cfg. */
static void proj_shape(const tide_llama_config *c, int i, int64_t *N, int64_t *K) {
    const int64_t D = c->hidden_size, hd = D / c->num_attention_heads, I = c->intermediate_size;
    const int64_t q = (int64_t)c->num_attention_heads * hd, kv = (int64_t)c->num_key_value_heads * hd;
    const int64_t n[TIDE_LORA_N] = {q, kv, kv, D, I, I, D}, k[TIDE_LORA_N] = {D, D, D, q, D, D, I};
    *N = n[i];
    *K = k[i];
}

/* Which tensor of the adapter name is: its layer, target and A (0) or B (1),
 * or false for a name that is none of the forms above. */
static bool parse_name(const char *name, int *layer, int *target, int *ab) {
    static const char pre[] = "base_model.model.model.layers.";
    if (strncmp(name, pre, sizeof pre - 1)) return false;
    const char *p = name + sizeof pre - 1;
    if (*p < '0' || *p > '9' || (p[0] == '0' && p[1] >= '0' && p[1] <= '9')) return false;
    long L = 0;
    while (*p >= '0' && *p <= '9' && L < 1000000) L = L * 10 + (*p++ - '0');
    if (*p++ != '.') return false;
    for (int i = 0; i < TIDE_LORA_N; i++) {
        size_t n = strlen(lora_module_path[i]);
        if (strncmp(p, lora_module_path[i], n)) continue;
        const char *q = p + n;
        int which = !strcmp(q, ".lora_A.weight") ? 0 : !strcmp(q, ".lora_B.weight") ? 1 : -1;
        if (which < 0) return false;
        *layer = (int)L;
        *target = i;
        *ab = which;
        return true;
    }
    return false;
}

static int cmp_name(const void *a, const void *b) {
    return strcmp(((const tide_ck_tensor *)a)->name, ((const tide_ck_tensor *)b)->name);
}

tide_status tide_checkpoint_add_lora(tide_checkpoint *ck, const char *dir) {
    if (!ck || !dir || !*dir) return tide_err(ck ? ck->ctx : NULL, TIDE_E_INVALID, "add_lora: no adapter directory");
    tide_ctx *ctx = ck->ctx;
    tide_llama_config *cfg = &ck->cfg;
    if (cfg->lora_r > 0)
        return tide_err(ctx, TIDE_E_UNSUPPORTED, "checkpoint %s has a LoRA adapter applied already: one adapter "
                        "at a time", ck->dir);
    int r = 0;
    float alpha = 0;
    unsigned bits = 0;
    tide_status st = tide_lora_read_config(ctx, dir, &r, &alpha, &bits);
    if (st) return st;
    if (cfg->qk_interleaved && (bits & (TIDE_LORA_Q | TIDE_LORA_K)))
        return tide_err(ctx, TIDE_E_UNSUPPORTED, "adapter %s targets q_proj or k_proj, whose rows checkpoint %s (a "
                        "GGUF file) holds in llama.cpp's rotary order: apply it to the safetensors checkpoint, or "
                        "use an adapter without q_proj and k_proj", dir, ck->dir);
    if (r > cfg->hidden_size)
        return tide_err(ctx, TIDE_E_FORMAT, "adapter %s: r %d is above the model's hidden size %d", dir, r,
                        cfg->hidden_size);
    const int NL = cfg->num_hidden_layers;
    int ntarget = 0;
    for (int i = 0; i < TIDE_LORA_N; i++) ntarget += (bits >> i) & 1u;
    const int want = 2 * ntarget * NL;

    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir) >= (int)sizeof path)
        return tide_err(ctx, TIDE_E_INVALID, "'%s': path too long", dir);
    tide_st_file sf;
    if ((st = tide_st_open(ctx, path, &sf))) return st;
    tide_ck_tensor *nt = tide_calloc((size_t)want + 1, sizeof *nt);
    unsigned char *seen = tide_calloc((size_t)want + 1, 1);
    char *fpath = tide_strdup(path), *fname = tide_strdup(path);
    if (!nt || !seen || !fpath || !fname) st = tide_err(ctx, TIDE_E_NOMEM, "out of memory reading adapter %s", dir);
    const int fi = ck->n_files; /* the file's index once it joins */
    int n = 0;
    tide_dtype dt = TIDE_F32;
    const cJSON *e;
    cJSON_ArrayForEach(e, sf.header) {
        if (st) break;
        if (!strcmp(e->string, "__metadata__")) continue;
        int L = 0, tg = 0, ab = 0;
        if (!parse_name(e->string, &L, &tg, &ab) || L >= NL || !(bits & (1u << tg))) {
            st = tide_err(ctx, TIDE_E_FORMAT, "%s: tensor '%s' is not a lora_A or lora_B weight of a layer (0 to %d) "
                          "and target_modules of %s/adapter_config.json", path, e->string, NL - 1, dir);
            break;
        }
        tide_st_tensor ti;
        if ((st = tide_st_tensor_read(ctx, path, &sf, e, &ti))) break;
        if (n == 0) dt = ti.dtype;
        int64_t N, K;
        proj_shape(cfg, tg, &N, &K);
        const int64_t d0 = ab ? N : r, d1 = ab ? r : K;
        if ((ti.dtype != TIDE_F32 && ti.dtype != TIDE_F16 && ti.dtype != TIDE_BF16) || ti.dtype != dt) {
            st = tide_err(ctx, TIDE_E_FORMAT, "%s: tensor '%s' is %s: an adapter's weights are all f32, all f16 or "
                          "all bf16", path, e->string, tide_dtype_name(ti.dtype));
            break;
        }
        if (ti.ndim != 2 || ti.shape[0] != d0 || ti.shape[1] != d1) {
            char a[96], b[96];
            const int64_t ws[2] = {d0, d1};
            st = tide_err(ctx, TIDE_E_FORMAT, "%s: tensor '%s' is %s; r %d on this model's %s (%lld, %lld) needs %s",
                          path, e->string, tide_st_shape_str(a, sizeof a, ti.ndim, ti.shape), r,
                          tide_lora_target_name(tg), (long long)N, (long long)K, tide_st_shape_str(b, sizeof b, 2, ws));
            break;
        }
        /* its slot: layer, then target in TIDE_LORA order, then A, B */
        int rank = 0;
        for (int i = 0; i < tg; i++) rank += (bits >> i) & 1u;
        const int slot = (L * ntarget + rank) * 2 + ab;
        if (seen[slot]) {
            st = tide_err(ctx, TIDE_E_FORMAT, "%s: tensor '%s' appears twice", path, e->string);
            break;
        }
        seen[slot] = 1;
        tide_ck_tensor *t = &nt[n];
        memset(t, 0, sizeof *t);
        if (!(t->name = tide_strdup(e->string))) {
            st = tide_err(ctx, TIDE_E_NOMEM, "out of memory reading adapter %s", dir);
            break;
        }
        n++;
        t->dtype = ti.dtype;
        t->ndim = 2;
        t->shape[0] = d0;
        t->shape[1] = d1;
        t->nbytes = ti.nbytes;
        t->offset = ti.offset;
        t->file = fi;
    }
    for (int s = 0; !st && s < want; s++) {
        if (seen[s]) continue;
        const int L = s / 2 / ntarget, rank = s / 2 % ntarget;
        int tg = 0;
        for (int k = -1; tg < TIDE_LORA_N; tg++)
            if (((bits >> tg) & 1u) && ++k == rank) break;
        st = tide_err(ctx, TIDE_E_FORMAT, "%s has no tensor 'base_model.model.model.layers.%d.%s.lora_%c.weight' "
                      "(its config targets %s on every layer)", path, L, lora_module_path[tg], s % 2 ? 'B' : 'A',
                      tide_lora_target_name(tg));
    }
    /* no overlap between the adapter's extents (the checkpoint's rule) */
    for (int i = 0; !st && i < n; i++)
        for (int j = i + 1; !st && j < n; j++)
            if (nt[i].offset < nt[j].offset + nt[j].nbytes && nt[j].offset < nt[i].offset + nt[i].nbytes)
                st = tide_err(ctx, TIDE_E_FORMAT, "%s: tensors '%s' and '%s' overlap", path, nt[i].name, nt[j].name);
    if (!st && (tide_grow((void **)&ck->files, &ck->cap_files, ck->n_files + 1, sizeof *ck->files) ||
                tide_grow((void **)&ck->tensors, &ck->cap_tensors, ck->n_tensors + n, sizeof *ck->tensors)))
        st = tide_err(ctx, TIDE_E_NOMEM, "out of memory applying adapter %s", dir);
    cJSON_Delete(sf.header);
    sf.header = NULL;
    if (st) {
        for (int i = 0; i < n; i++) tide_free(nt[i].name);
        tide_free(nt);
        tide_free(seen);
        tide_free(fpath);
        tide_free(fname);
        tide_st_close(&sf);
        return st;
    }
    /* from here nothing fails: the file and its tensors join */
    tide_ck_file *f = &ck->files[ck->n_files++];
    memset(f, 0, sizeof *f);
    f->path = fpath;
    f->name = fname;
    f->fd = sf.fd;
    f->map = sf.map;
    f->size = sf.size;
    f->data_start = sf.data_start;
    memcpy(ck->tensors + ck->n_tensors, nt, (size_t)n * sizeof *nt);
    ck->n_tensors += n;
    qsort(ck->tensors, (size_t)ck->n_tensors, sizeof *ck->tensors, cmp_name);
    tide_free(nt);
    tide_free(seen);
    cfg->lora_r = r;
    cfg->lora_alpha = alpha;
    cfg->lora_targets = bits;
    cfg->lora_dtype = dt;
    return TIDE_OK;
}

/* ---------------------------------------------------------------- merging */

/* What the merged file's fill reads: per entry its checkpoint tensor and,
 * for a targeted projection, its adapter's A and B (f32 copies made when
 * the entry is first asked for). */
typedef struct merge_fill {
    const tide_checkpoint *ck;
    const int *src;      /* per entry: its checkpoint tensor */
    const int *target;   /* per entry: its LoRA target, -1 for none */
    const int *layer;
    int cur;             /* the entry A and B belong to (-1: none) */
    float *a, *b;        /* (r, K), (N, r) */
    double scale;        /* alpha / r */
} merge_fill;

static tide_status merge_adapter(merge_fill *m, int i) {
    const tide_llama_config *cfg = &m->ck->cfg;
    char name[192];
    for (int ab = 0; ab < 2; ab++) {
        snprintf(name, sizeof name, "base_model.model.model.layers.%d.%s.lora_%c.weight", m->layer[i],
                 lora_module_path[m->target[i]], ab ? 'B' : 'A');
        int t = tide_checkpoint_find(m->ck, name);
        if (t < 0) return tide_err(m->ck->ctx, TIDE_E_FORMAT, "the adapter has no tensor '%s'", name);
        const tide_ck_tensor *ct = &m->ck->tensors[t];
        const size_t n = (size_t)(ct->shape[0] * ct->shape[1]);
        float **dst = ab ? &m->b : &m->a;
        tide_free(*dst);
        if (!(*dst = tide_malloc(n * sizeof **dst + 1)))
            return tide_err(m->ck->ctx, TIDE_E_NOMEM, "out of memory merging the adapter");
        tide_convert_to_f32(tide_checkpoint_tensor_data(m->ck, t), cfg->lora_dtype, *dst, n);
    }
    m->cur = i;
    return TIDE_OK;
}

static tide_status merge_fill_fn(void *user, int i, uint64_t e0, uint64_t n, void *dst) {
    merge_fill *m = user;
    const tide_ck_tensor *t = &m->ck->tensors[m->src[i]];
    const unsigned char *data = tide_checkpoint_tensor_data(m->ck, m->src[i]);
    const uint64_t es = tide_dtype_bytes(t->dtype, 1);
    if (m->target[i] < 0) {
        memcpy(dst, data + e0 * es, (size_t)(n * es));
        return TIDE_OK;
    }
    tide_status st = m->cur == i ? TIDE_OK : merge_adapter(m, i);
    if (st) return st;
    const int64_t K = t->shape[1], r = m->ck->cfg.lora_r;
    for (uint64_t k = 0; k < n; k++) {
        const uint64_t e = e0 + k;
        const int64_t row = (int64_t)(e / (uint64_t)K), col = (int64_t)(e % (uint64_t)K);
        float w;
        tide_convert_to_f32(data + e * es, t->dtype, &w, 1);
        double d = 0;
        for (int64_t j = 0; j < r; j++) d += (double)m->b[row * r + j] * (double)m->a[j * K + col];
        const float v = (float)((double)w + m->scale * d);
        if (t->dtype == TIDE_F32) ((float *)dst)[k] = v;
        else if (t->dtype == TIDE_BF16) ((uint16_t *)dst)[k] = tide_f32_to_bf16(v);
        else ((uint16_t *)dst)[k] = tide_f32_to_f16(v);
    }
    return TIDE_OK;
}

/* Copies dir_from/name to dir_to/name where it exists; TIDE_OK or the
 * failure of reading or writing it. */
static tide_status copy_if_there(tide_ctx *ctx, const char *from, const char *to, const char *name) {
    char src[PATH_MAX], dst[PATH_MAX];
    if (snprintf(src, sizeof src, "%s/%s", from, name) >= (int)sizeof src ||
        snprintf(dst, sizeof dst, "%s/%s", to, name) >= (int)sizeof dst)
        return tide_err(ctx, TIDE_E_INVALID, "'%s': path too long", from);
    if (access(src, F_OK)) return TIDE_OK;
    char *text = NULL;
    size_t len = 0;
    tide_status st = tide_read_text_file(ctx, src, (uint64_t)1 << 30, &text, &len);
    if (!st) st = tide_write_file_atomic(ctx, name, dst, text, len);
    tide_free(text);
    return st;
}

/* Removes the files of a merged checkpoint being built in tmp, then tmp. */
static void remove_tmp(const char *tmp, const char *const *names, int n) {
    char p[PATH_MAX];
    for (int i = 0; i < n; i++)
        if (snprintf(p, sizeof p, "%s/%s", tmp, names[i]) < (int)sizeof p) unlink(p);
    rmdir(tmp);
}

tide_status tide_checkpoint_save_merged(tide_checkpoint *ck, const char *dir) {
    if (!ck || !dir || !*dir) return tide_err(ck ? ck->ctx : NULL, TIDE_E_INVALID, "save_merged: no directory");
    tide_ctx *ctx = ck->ctx;
    const tide_llama_config *cfg = &ck->cfg;
    if (cfg->lora_r <= 0)
        return tide_err(ctx, TIDE_E_INVALID, "checkpoint %s has no LoRA adapter to merge", ck->dir);
    if (ck->gguf)
        return tide_err(ctx, TIDE_E_UNSUPPORTED, "checkpoint %s is a GGUF file: a merged checkpoint is written "
                        "from a safetensors base", ck->dir);
    static const char *const names[] = {"model.safetensors", "config.json", "tokenizer.json",
                                        "tokenizer_config.json", "tokenizer.model", "special_tokens_map.json",
                                        "generation_config.json", "chat_template.jinja"};
    const int n_names = (int)(sizeof names / sizeof names[0]);
    struct stat sd;
    if (!stat(dir, &sd))
        return tide_err(ctx, TIDE_E_INVALID, "'%s' exists: the merged checkpoint goes to a new directory", dir);
    char d[PATH_MAX], tmp[PATH_MAX], path[PATH_MAX];
    if (snprintf(d, sizeof d, "%s", dir) >= (int)sizeof d) return tide_err(ctx, TIDE_E_INVALID, "'%s': path too long", dir);
    for (size_t l = strlen(d); l > 1 && d[l - 1] == '/'; l--) d[l - 1] = '\0'; /* "out/" is "out" */
    dir = d;
    if (snprintf(tmp, sizeof tmp, "%s.tmp-merge-%ld", dir, (long)getpid()) >= (int)sizeof tmp ||
        snprintf(path, sizeof path, "%s/model.safetensors", tmp) >= (int)sizeof path)
        return tide_err(ctx, TIDE_E_INVALID, "'%s': path too long", dir);
    int n = 0;
    for (int i = 0; i < ck->n_tensors; i++) {
        const tide_ck_tensor *t = &ck->tensors[i];
        if (!strncmp(t->name, "base_model.", 11)) continue;
        if (t->dtype != TIDE_F32 && t->dtype != TIDE_F16 && t->dtype != TIDE_BF16)
            return tide_err(ctx, TIDE_E_UNSUPPORTED, "checkpoint %s: tensor '%s' is %s; a merged checkpoint is "
                            "written from an f32, f16 or bf16 base", ck->dir, t->name, tide_dtype_name(t->dtype));
        n++;
    }
    tide_st_entry *e = tide_calloc((size_t)n + 1, sizeof *e);
    int *src = tide_calloc((size_t)n + 1, sizeof *src), *tg = tide_calloc((size_t)n + 1, sizeof *tg),
        *ly = tide_calloc((size_t)n + 1, sizeof *ly);
    tide_status st = e && src && tg && ly ? TIDE_OK : tide_err(ctx, TIDE_E_NOMEM, "out of memory merging");
    for (int i = 0, k = 0; !st && i < ck->n_tensors; i++) {
        const tide_ck_tensor *t = &ck->tensors[i];
        if (!strncmp(t->name, "base_model.", 11)) continue;
        e[k] = (tide_st_entry){t->name, t->dtype, t->ndim, {0}};
        memcpy(e[k].shape, t->shape, sizeof t->shape);
        src[k] = i;
        tg[k] = -1;
        int L = -1, c = 0;
        for (int j = 0; j < TIDE_LORA_N && L < 0; j++) {
            if (!(cfg->lora_targets & (1u << j))) continue;
            char pat[96];
            snprintf(pat, sizeof pat, "model.layers.%%d.%s.weight%%n", lora_module_path[j]);
            int l = -1;
            c = 0;
            if (sscanf(t->name, pat, &l, &c) == 1 && c > 0 && t->name[c] == '\0' && l >= 0 &&
                l < cfg->num_hidden_layers)
                L = l, tg[k] = j;
        }
        ly[k++] = L;
    }
    merge_fill m = {.ck = ck, .src = src, .target = tg, .layer = ly, .cur = -1,
                    .scale = (double)cfg->lora_alpha / (double)cfg->lora_r};
    bool made = false;
    if (!st && mkdir(tmp, 0755))
        st = tide_err(ctx, TIDE_E_IO, "cannot make '%s': %s", tmp, strerror(errno));
    made = !st;
    const tide_st_meta meta = {"format", "pt"};
    if (!st) st = tide_safetensors_write(ctx, path, e, n, &meta, 1, merge_fill_fn, &m);
    for (int i = 1; !st && i < n_names; i++) st = copy_if_there(ctx, ck->dir, tmp, names[i]);
    if (!st && rename(tmp, dir))
        st = tide_err(ctx, TIDE_E_IO, "cannot rename '%s' to '%s': %s", tmp, dir, strerror(errno));
    if (st && made) remove_tmp(tmp, names, n_names);
    tide_free(m.a);
    tide_free(m.b);
    tide_free(e);
    tide_free(src);
    tide_free(tg);
    tide_free(ly);
    return st;
}
