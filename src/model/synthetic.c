/*
 * synthetic.c - writes a deterministic synthetic LLaMA checkpoint in Hugging
 * Face layout (config.json, model.safetensors or shards plus
 * model.safetensors.index.json), so that every size of model can be run and
 * benchmarked without downloading one.
 *
 * Determinism: element j of a tensor is a pure function of (seed, tensor name,
 * j). Elements are grouped in blocks of BLOCK_ELEMS; a block's key is
 * splitmix64 of the tensor's key and the block number, and element i of the
 * block sums the four 16-bit lanes of two 32-bit hashes (lowbias32) of the
 * key halves plus i (Irwin-Hall of 4, close to normal), scaled by powers of
 * two. Every step is integer arithmetic or an exact float operation (the one
 * rounding add of the norms is correctly rounded everywhere), so the bytes do
 * not depend on the machine, the compiler, the thread count or how the work is
 * split.
 *   matrices: (sum - mean) * 9 * 2^-24      ~ N(0, 0.0203^2), |v| <= 0.071
 *   norms:    1 + (sum - mean) * 2^-22      ~ 1 + N(0, 0.009^2)
 * then rounded to the storage dtype (nearest even, as tide_f32_to_bf16 and
 * tide_f32_to_f16 do).
 *
 * Layout: tensors in model order (embeddings, layer 0 .. L-1, final norm,
 * output head), packed without gaps; the header is the one safetensors
 * writer's (model/st_file.c: padded with spaces so the data section starts
 * at a multiple of TIDE_ST_DATA_ALIGN, TIDE_CK_DATA_ALIGN). Shards are cut
 * greedily at tensor boundaries when the total exceeds shard_bytes.
 *
 * Writing: each file is a byte stream (header, then data) cut into CHUNK_BYTES
 * chunks. The calling thread fills chunks (OpenMP over blocks) into NBUF
 * buffers while NWRITERS writer threads pwrite full ones, so several writes
 * are in flight while the next chunk is generated; memory stays bounded at
 * NBUF * CHUNK_BYTES whatever the model size. Files are opened with O_DIRECT
 * where the file system allows it (the last chunk is padded to 4 KiB and the
 * file truncated to its size), else buffered with write-back started per
 * chunk.
 * A file is published only after fsync, by rename from NAME.tmp; files of an
 * earlier checkpoint of the other layout (or another shard count) in the same
 * directory are then removed.
 */
#include "model/checkpoint.h"
#include "model/st_file.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CHUNK_BYTES ((size_t)16 << 20) /* one write; a multiple of 4 KiB */
#define NBUF 4                         /* buffers: at most NBUF * CHUNK_BYTES held */
#define NWRITERS 3                     /* writes in flight: disks want a queue */
#define BLOCK_ELEMS 16384              /* generator block, unit of parallel work */
#define IO_ALIGN 4096

enum { KIND_MATRIX, KIND_NORM };

typedef struct syn_tensor {
    char name[96];
    int ndim;
    int64_t shape[2];
    uint64_t numel, nbytes;
    int kind;
    uint64_t key;   /* generator key: from seed and name */
    int shard;
    uint64_t begin; /* offset inside its shard's data section */
} syn_tensor;

typedef struct syn_shard {
    char name[64];
    char *path, *tmp;
    bool tmp_exists;
    int first, count; /* tensors [first, first+count) */
    uint64_t data_bytes;
} syn_shard;

/* ---------------------------------------------------------------- generator */

static inline uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline uint32_t hash32(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}

static uint64_t name_key(uint64_t seed, const char *name) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (const char *s = name; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return mix64(mix64(seed + 0x9e3779b97f4a7c15ull) ^ h);
}

/* How a block's integers become values: v = add + (s * mul) * scale. */
typedef struct gen_params {
    uint32_t k1, k2;
    int32_t mul;
    float add, scale;
} gen_params;

static gen_params block_params(const syn_tensor *t, uint64_t block) {
    uint64_t bk = mix64(t->key + (block + 1) * 0x9e3779b97f4a7c15ull);
    gen_params p = {(uint32_t)bk, (uint32_t)(bk >> 32), 9, 0.0f, 0x1p-24f};
    if (t->kind == KIND_NORM) {
        p.mul = 1;
        p.add = 1.0f;
        p.scale = 0x1p-22f;
    }
    return p;
}

/* Element i of a block, as f32 (exact but for the rounding of add). */
static inline float gen_value(gen_params p, uint32_t i) {
    uint32_t a = hash32(p.k1 + i), b = hash32(p.k2 + i);
    int32_t s = (int32_t)(a & 0xffff) + (int32_t)(a >> 16) + (int32_t)(b & 0xffff) +
                (int32_t)(b >> 16) - 131070;
    return p.add + (float)(s * p.mul) * p.scale;
}

/* tide_f32_to_bf16 for values that are never NaN, inlined so that the block
 * loop vectorizes; the tests check it against tide_f32_to_bf16. */
static inline uint16_t bf16_rne(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* Whole blocks: a constant trip count lets -O2 vectorize these loops, and the
 * AVX2 clone runs where the CPU has it (same results: integer and exact
 * float operations only). Sanitizer builds take the default only: a clone's
 * resolver runs during relocation, before a sanitizer's runtime is up. */
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define TIDE_CLONES
#else
#define TIDE_CLONES __attribute__((target_clones("avx2", "default")))
#endif
TIDE_CLONES
static void block_bf16(uint16_t *restrict o, gen_params p) {
    for (uint32_t i = 0; i < BLOCK_ELEMS; i++) o[i] = bf16_rne(gen_value(p, i));
}

TIDE_CLONES
static void block_f32(float *restrict o, gen_params p) {
    for (uint32_t i = 0; i < BLOCK_ELEMS; i++) o[i] = gen_value(p, i);
}

/* Elements [i0, i1) of a block into out (dtype dt). */
static void gen_range(const syn_tensor *t, tide_dtype dt, uint64_t block, uint32_t i0, uint32_t i1,
                      void *out) {
    gen_params p = block_params(t, block);
    bool whole = i0 == 0 && i1 == BLOCK_ELEMS;
    switch (dt) {
    case TIDE_BF16:
        if (whole) block_bf16(out, p);
        else
            for (uint32_t i = i0; i < i1; i++) ((uint16_t *)out)[i - i0] = bf16_rne(gen_value(p, i));
        break;
    case TIDE_F16:
        for (uint32_t i = i0; i < i1; i++) ((uint16_t *)out)[i - i0] = tide_f32_to_f16(gen_value(p, i));
        break;
    default:
        if (whole) block_f32(out, p);
        else
            for (uint32_t i = i0; i < i1; i++) ((float *)out)[i - i0] = gen_value(p, i);
        break;
    }
}

/* ---------------------------------------------------------------- text */

/* The padded header of one shard (model/st_file.c): metadata format "pt",
 * its tensors packed from data offset 0 in model order. TIDE_OK or
 * TIDE_E_NOMEM / TIDE_E_INVALID naming the shard. */
static tide_status shard_header(tide_ctx *ctx, tide_strbuf *b, const syn_shard *sh, const syn_tensor *ts,
                                tide_dtype dt) {
    tide_st_entry *e = tide_calloc((size_t)(sh->count ? sh->count : 1), sizeof *e);
    uint64_t *nbytes = tide_calloc((size_t)(sh->count ? sh->count : 1), sizeof *nbytes);
    tide_status st = e && nbytes ? TIDE_OK : tide_err(ctx, TIDE_E_NOMEM, "%s: out of memory building its header",
                                                      sh->path);
    for (int i = 0; !st && i < sh->count; i++) {
        const syn_tensor *t = &ts[sh->first + i];
        e[i] = (tide_st_entry){.name = t->name, .dtype = dt, .ndim = t->ndim};
        memcpy(e[i].shape, t->shape, (size_t)t->ndim * sizeof t->shape[0]);
    }
    const tide_st_meta meta = {"format", "pt"};
    if (!st) st = tide_st_header(ctx, sh->path, e, sh->count, &meta, 1, b, nbytes);
    tide_free(e);
    tide_free(nbytes);
    return st;
}

/* ---------------------------------------------------------------- files */

/* mkdir -p. Returns 0, an errno, or -1 when memory is exhausted. */
static int make_dirs(const char *dir) {
    char *p = tide_strdup(dir);
    if (!p) return -1;
    int e = 0;
    for (char *s = p + 1;; s++) {
        if (*s == '/' || *s == '\0') {
            char c = *s;
            *s = '\0';
            if (mkdir(p, 0755) != 0 && errno != EEXIST) {
                e = errno;
                break;
            }
            *s = c;
            if (!c) break;
        }
    }
    tide_free(p);
    if (e) return e;
    struct stat st;
    if (stat(dir, &st) != 0) return errno;
    return S_ISDIR(st.st_mode) ? 0 : ENOTDIR;
}

static int write_all(int fd, const void *buf, size_t n) {
    const unsigned char *p = buf;
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return errno;
        if (w == 0) return EIO;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* One piece of generation work: elements [i0, i1) of block `block` of a
 * tensor, to be stored at out. */
typedef struct work_item {
    const syn_tensor *t;
    uint64_t block;
    uint32_t i0, i1;
    unsigned char *out;
} work_item;

/* The writer threads and the buffers. A buffer goes FREE -> (filled by the
 * generating thread) FULL -> (taken by a writer) WRITING -> FREE. */
enum { BUF_FREE, BUF_FULL, BUF_WRITING };
typedef struct pipeline {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    unsigned char *buf[NBUF];
    size_t len[NBUF];
    uint64_t off[NBUF];
    int state[NBUF];
    int fd;
    atomic_bool direct; /* fd has O_DIRECT */
    int err;       /* first errno of a write, 0 if none */
    bool quit;
} pipeline;

typedef struct writer {
    tide_ctx *ctx;
    const tide_llama_config *cfg;
    syn_tensor *ts;
    syn_shard *sh;
    int threads;
    work_item *items;
    size_t cap_items;
    pipeline pl;
    uint64_t done, total;
} writer;

static int pwrite_all(pipeline *pl, const unsigned char *p, size_t n, uint64_t off) {
    while (n) {
        ssize_t w = pwrite(pl->fd, p, n, (off_t)off);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && errno == EINVAL && atomic_load(&pl->direct)) {
            /* The file system took O_DIRECT at open but refuses the write:
             * go on buffered (any writer may do this; it is idempotent). */
            int fl = fcntl(pl->fd, F_GETFL);
            if (fl < 0 || fcntl(pl->fd, F_SETFL, fl & ~O_DIRECT) != 0) return EINVAL;
            atomic_store(&pl->direct, false);
            continue;
        }
        if (w < 0) return errno;
        if (w == 0) return EIO;
        p += w;
        n -= (size_t)w;
        off += (uint64_t)w;
    }
    return 0;
}

static void *writer_main(void *arg) {
    pipeline *pl = arg;
    pthread_mutex_lock(&pl->mu);
    for (;;) {
        int k = -1;
        for (int i = 0; i < NBUF && k < 0; i++)
            if (pl->state[i] == BUF_FULL) k = i;
        if (k < 0) {
            if (pl->quit) break;
            pthread_cond_wait(&pl->cv, &pl->mu);
            continue;
        }
        pl->state[k] = BUF_WRITING;
        bool skip = pl->err != 0;
        pthread_mutex_unlock(&pl->mu);
        int e = skip ? 0 : pwrite_all(pl, pl->buf[k], pl->len[k], pl->off[k]);
        /* Buffered: start write-back now so that the final fsync has little left. */
        if (!e && !skip && !atomic_load(&pl->direct))
            (void)sync_file_range(pl->fd, (off_t)pl->off[k], (off_t)pl->len[k],
                                  SYNC_FILE_RANGE_WRITE);
        pthread_mutex_lock(&pl->mu);
        if (e && !pl->err) pl->err = e;
        pl->state[k] = BUF_FREE;
        pthread_cond_broadcast(&pl->cv);
    }
    pthread_mutex_unlock(&pl->mu);
    return NULL;
}

/* Fills buf with bytes [pos, pos+len) of the shard's stream: the padded
 * header hdr (hlen bytes) followed by the tensors' data. */
static void fill_chunk(writer *w, const syn_shard *sh, const unsigned char *hdr, uint64_t hlen,
                       uint64_t pos, size_t len, unsigned char *buf) {
    size_t esz = tide_dtype_size(w->cfg->dtype);
    size_t o = 0;
    if (pos < hlen) {
        o = (size_t)TIDE_MIN((uint64_t)len, hlen - pos);
        memcpy(buf, hdr + pos, o);
    }
    /* The data range [d0, d1) of this chunk, cut into block pieces. */
    uint64_t d0 = pos + o - hlen, d1 = pos + len - hlen;
    size_t n = 0;
    for (int i = sh->first; o < len && i < sh->first + sh->count; i++) {
        const syn_tensor *t = &w->ts[i];
        uint64_t b = TIDE_MAX(d0, t->begin), e = TIDE_MIN(d1, t->begin + t->nbytes);
        if (b >= e) continue;
        uint64_t j0 = (b - t->begin) / esz, j1 = (e - t->begin) / esz;
        while (j0 < j1) {
            uint64_t blk = j0 / BLOCK_ELEMS;
            uint64_t end = TIDE_MIN(j1, (blk + 1) * BLOCK_ELEMS);
            w->items[n++] = (work_item){t, blk, (uint32_t)(j0 - blk * BLOCK_ELEMS),
                                        (uint32_t)(end - blk * BLOCK_ELEMS),
                                        buf + (t->begin + j0 * esz - d0) + o};
            j0 = end;
        }
    }
    tide_dtype dt = w->cfg->dtype;
    work_item *items = w->items;
#pragma omp parallel for schedule(dynamic, 8) num_threads(w->threads) if (n >= 8)
    for (size_t k = 0; k < n; k++)
        gen_range(items[k].t, dt, items[k].block, items[k].i0, items[k].i1, items[k].out);
}

/* Writes one shard to its temporary name and fsyncs it. Returns TIDE_OK or
 * TIDE_E_IO / TIDE_E_NOMEM naming the file. */
static tide_status write_shard(writer *w, syn_shard *sh) {
    tide_ctx *ctx = w->ctx;
    pipeline *pl = &w->pl;
    tide_strbuf hb = {0};
    tide_status hs = shard_header(ctx, &hb, sh, w->ts, w->cfg->dtype);
    if (hs) {
        tide_free(hb.p);
        return hs;
    }
    uint64_t hlen = hb.len, size = hlen + sh->data_bytes;

    int fd = open(sh->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_DIRECT, 0644);
    bool direct = fd >= 0;
    if (fd < 0 && errno == EINVAL) fd = open(sh->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        int e = errno;
        tide_free(hb.p);
        return tide_err(ctx, TIDE_E_IO, "%s: cannot create: %s", sh->tmp, strerror(e));
    }
    sh->tmp_exists = true;
    pl->fd = fd;
    atomic_store(&pl->direct, direct);
    pl->err = 0;
    pl->quit = false;
    for (int k = 0; k < NBUF; k++) pl->state[k] = BUF_FREE;
    pthread_t th[NWRITERS];
    int nth = 0, e = 0;
    for (; nth < NWRITERS; nth++)
        if ((e = pthread_create(&th[nth], NULL, writer_main, pl)) != 0) break;
    if (nth == 0) {
        close(fd);
        tide_free(hb.p);
        return tide_err(ctx, TIDE_E_NOMEM, "%s: cannot start a writer thread: %s", sh->tmp,
                        strerror(e));
    }
    int k = 0;
    for (uint64_t pos = 0; pos < size; pos += CHUNK_BYTES) {
        size_t len = (size_t)TIDE_MIN((uint64_t)CHUNK_BYTES, size - pos);
        pthread_mutex_lock(&pl->mu);
        while (pl->state[k] != BUF_FREE && !pl->err) pthread_cond_wait(&pl->cv, &pl->mu);
        bool failed = pl->err != 0;
        pthread_mutex_unlock(&pl->mu);
        if (failed) break;
        fill_chunk(w, sh, (const unsigned char *)hb.p, hlen, pos, len, pl->buf[k]);
        /* O_DIRECT writes whole 4 KiB blocks; the padding is cut off below. */
        size_t wlen = (len + IO_ALIGN - 1) / IO_ALIGN * IO_ALIGN;
        memset(pl->buf[k] + len, 0, wlen - len);
        pthread_mutex_lock(&pl->mu);
        pl->len[k] = wlen;
        pl->off[k] = pos;
        pl->state[k] = BUF_FULL;
        pthread_cond_broadcast(&pl->cv);
        pthread_mutex_unlock(&pl->mu);
        k = (k + 1) % NBUF;
        w->done += len;
        tide_progress(ctx, "generating", w->done, w->total);
    }
    pthread_mutex_lock(&pl->mu);
    pl->quit = true;
    pthread_cond_broadcast(&pl->cv);
    pthread_mutex_unlock(&pl->mu);
    for (int i = 0; i < nth; i++) pthread_join(th[i], NULL);
    tide_free(hb.p);
    e = pl->err;
    if (!e && ftruncate(fd, (off_t)size) != 0) e = errno;
    if (!e && fsync(fd) != 0) e = errno;
    if (close(fd) != 0 && !e) e = errno;
    if (e) return tide_err(ctx, TIDE_E_IO, "%s: write failed: %s", sh->tmp, strerror(e));
    return TIDE_OK;
}

/* Writes text to path (a temporary name) and fsyncs it. */
static tide_status write_text(tide_ctx *ctx, const char *path, const char *text, size_t len) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return tide_err(ctx, TIDE_E_IO, "%s: cannot create: %s", path, strerror(errno));
    int e = write_all(fd, text, len);
    if (!e && fsync(fd) != 0) e = errno;
    if (close(fd) != 0 && !e) e = errno;
    if (e) {
        unlink(path);
        return tide_err(ctx, TIDE_E_IO, "%s: write failed: %s", path, strerror(e));
    }
    return TIDE_OK;
}

static char *join(const char *dir, const char *name, const char *suffix) {
    size_t a = strlen(dir), b = strlen(name), c = strlen(suffix);
    char *p = tide_malloc(a + b + c + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    p[a] = '/';
    memcpy(p + a + 1, name, b);
    memcpy(p + a + 1 + b, suffix, c + 1);
    return p;
}

/* ---------------------------------------------------------------- plan */

static void add(syn_tensor *ts, int *n, uint64_t seed, tide_dtype dt, int kind, int64_t d0,
                int64_t d1, const char *fmt, int layer) {
    syn_tensor *t = &ts[(*n)++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, fmt, layer);
    t->kind = kind;
    t->ndim = d1 ? 2 : 1;
    t->shape[0] = d0;
    t->shape[1] = d1;
    t->numel = (uint64_t)d0 * (uint64_t)(d1 ? d1 : 1);
    t->nbytes = t->numel * tide_dtype_size(dt);
    t->key = name_key(seed, t->name);
}

/* The HF tensors of cfg in model order; returns the count. */
static int plan_tensors(const tide_llama_config *cfg, uint64_t seed, syn_tensor *ts) {
    int64_t D = cfg->hidden_size, I = cfg->intermediate_size, V = cfg->vocab_size;
    int64_t H = cfg->num_attention_heads, KV = cfg->num_key_value_heads, hd = D / H;
    tide_dtype dt = cfg->dtype;
    int n = 0;
    add(ts, &n, seed, dt, KIND_MATRIX, V, D, "model.embed_tokens.weight", 0);
    for (int l = 0; l < cfg->num_hidden_layers; l++) {
        add(ts, &n, seed, dt, KIND_NORM, D, 0, "model.layers.%d.input_layernorm.weight", l);
        add(ts, &n, seed, dt, KIND_MATRIX, H * hd, D, "model.layers.%d.self_attn.q_proj.weight", l);
        add(ts, &n, seed, dt, KIND_MATRIX, KV * hd, D, "model.layers.%d.self_attn.k_proj.weight", l);
        add(ts, &n, seed, dt, KIND_MATRIX, KV * hd, D, "model.layers.%d.self_attn.v_proj.weight", l);
        add(ts, &n, seed, dt, KIND_MATRIX, D, H * hd, "model.layers.%d.self_attn.o_proj.weight", l);
        add(ts, &n, seed, dt, KIND_NORM, D, 0, "model.layers.%d.post_attention_layernorm.weight", l);
        add(ts, &n, seed, dt, KIND_MATRIX, I, D, "model.layers.%d.mlp.gate_proj.weight", l);
        add(ts, &n, seed, dt, KIND_MATRIX, I, D, "model.layers.%d.mlp.up_proj.weight", l);
        add(ts, &n, seed, dt, KIND_MATRIX, D, I, "model.layers.%d.mlp.down_proj.weight", l);
    }
    add(ts, &n, seed, dt, KIND_NORM, D, 0, "model.norm.weight", 0);
    if (!cfg->tie_word_embeddings)
        add(ts, &n, seed, dt, KIND_MATRIX, V, D, "lm_head.weight", 0);
    return n;
}

/* Cuts shards greedily; returns their count (1 = a single model.safetensors). */
static int plan_shards(syn_tensor *ts, int nt, uint64_t shard_bytes, syn_shard *sh) {
    uint64_t total = 0;
    for (int i = 0; i < nt; i++) total += ts[i].nbytes;
    bool sharded = shard_bytes > 0 && total > shard_bytes;
    int ns = 0;
    for (int i = 0; i < nt; i++) {
        if (ns == 0 || (sharded && sh[ns - 1].data_bytes > 0 &&
                        sh[ns - 1].data_bytes + ts[i].nbytes > shard_bytes)) {
            memset(&sh[ns], 0, sizeof sh[ns]);
            sh[ns].first = i;
            ns++;
        }
        syn_shard *s = &sh[ns - 1];
        ts[i].shard = ns - 1;
        ts[i].begin = s->data_bytes;
        s->data_bytes += ts[i].nbytes;
        s->count++;
    }
    for (int s = 0; s < ns; s++) {
        if (sharded) snprintf(sh[s].name, sizeof sh[s].name, "model-%05d-of-%05d.safetensors", s + 1, ns);
        else snprintf(sh[s].name, sizeof sh[s].name, "model.safetensors");
    }
    return sharded ? -ns : ns; /* negative: sharded layout */
}

/* Removes shard files of an earlier checkpoint in dir that the new layout
 * does not have (a different shard count, or shards when the new checkpoint
 * is a single file), so that the directory holds one checkpoint only. */
static void remove_stale_shards(const char *dir, int n_shards) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        int a, b, used = 0;
        char canon[64];
        if (sscanf(de->d_name, "model-%5d-of-%5d.safetensors%n", &a, &b, &used) != 2) continue;
        snprintf(canon, sizeof canon, "model-%05d-of-%05d.safetensors", a, b);
        if (strcmp(canon, de->d_name) != 0 || (size_t)used != strlen(de->d_name)) continue;
        if (b == n_shards) continue;
        char *p = join(dir, de->d_name, "");
        if (p) (void)unlink(p);
        tide_free(p);
    }
    closedir(d);
}

static void fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
}

/* Returns TIDE_OK; TIDE_E_INVALID (bad cfg or arguments), TIDE_E_NOMEM, or
 * TIDE_E_IO naming the file and the system's reason. On failure no temporary
 * file is left behind and no file of dir is replaced by a partial one. */
tide_status tide_checkpoint_make_synthetic(tide_ctx *ctx, const tide_llama_config *cfg,
                                           uint64_t seed, uint64_t shard_bytes, const char *dir) {
    if (!dir || !*dir) return tide_err(ctx, TIDE_E_INVALID, "make_synthetic: no directory");
    tide_status st = tide_llama_config_check(ctx, cfg);
    if (st) return st;
    int e = make_dirs(dir);
    if (e < 0) return tide_err(ctx, TIDE_E_NOMEM, "make_synthetic %s: out of memory", dir);
    if (e) return tide_err(ctx, TIDE_E_IO, "%s: cannot create directory: %s", dir, strerror(e));

    int cap = 3 + 9 * cfg->num_hidden_layers;
    syn_tensor *ts = tide_calloc((size_t)cap, sizeof *ts);
    syn_shard *sh = tide_calloc((size_t)cap, sizeof *sh);
    writer w = {.ctx = ctx, .cfg = cfg, .threads = tide_ctx_threads(ctx)};
    bool sync_init = false;
    char *index_path = join(dir, "model.safetensors.index.json", "");
    char *index_tmp = join(dir, "model.safetensors.index.json", ".tmp");
    char *single_path = join(dir, "model.safetensors", "");
    char *config_path = join(dir, "config.json", "");
    bool index_tmp_exists = false;
    int ns = 0;
    tide_strbuf ib = {0};
    if (!ts || !sh || !index_path || !index_tmp || !single_path || !config_path) {
        st = tide_err(ctx, TIDE_E_NOMEM, "make_synthetic %s: out of memory", dir);
        goto done;
    }
    int nt = plan_tensors(cfg, seed, ts);
    int r = plan_shards(ts, nt, shard_bytes, sh);
    bool sharded = r < 0;
    ns = r < 0 ? -r : r;
    for (int s = 0; s < ns; s++) {
        sh[s].path = join(dir, sh[s].name, "");
        sh[s].tmp = join(dir, sh[s].name, ".tmp");
        if (!sh[s].path || !sh[s].tmp) {
            st = tide_err(ctx, TIDE_E_NOMEM, "make_synthetic %s: out of memory", dir);
            goto done;
        }
    }

    w.ts = ts;
    w.sh = sh;
    /* Pieces of one chunk: its blocks plus two partial ones per tensor. */
    w.cap_items = CHUNK_BYTES / tide_dtype_size(cfg->dtype) / BLOCK_ELEMS + 2 * (size_t)nt + 2;
    w.items = tide_malloc(w.cap_items * sizeof *w.items);
    for (int k = 0; k < NBUF; k++) w.pl.buf[k] = tide_malloc_aligned(CHUNK_BYTES, IO_ALIGN);
    bool bufs = true;
    for (int k = 0; k < NBUF; k++) bufs = bufs && w.pl.buf[k];
    if (!w.items || !bufs) {
        st = tide_err(ctx, TIDE_E_NOMEM, "make_synthetic %s: out of memory for buffers", dir);
        goto done;
    }
    if (pthread_mutex_init(&w.pl.mu, NULL) != 0 || pthread_cond_init(&w.pl.cv, NULL) != 0) {
        st = tide_err(ctx, TIDE_E_NOMEM, "make_synthetic %s: cannot create a mutex", dir);
        goto done;
    }
    sync_init = true;
    for (int s = 0; s < ns; s++) {
        tide_strbuf hb = {0};
        if ((st = shard_header(ctx, &hb, &sh[s], ts, cfg->dtype))) {
            tide_free(hb.p);
            goto done;
        }
        w.total += hb.len + sh[s].data_bytes;
        tide_free(hb.p);
    }
    tide_progress(ctx, "generating", 0, w.total);
    for (int s = 0; s < ns; s++)
        if ((st = write_shard(&w, &sh[s]))) goto done;

    if (sharded) {
        uint64_t total = 0;
        for (int s = 0; s < ns; s++) total += sh[s].data_bytes;
        tide_strbuf_printf(&ib, "{\n  \"metadata\": {\n    \"total_size\": %llu\n  },\n  \"weight_map\": {",
                  (unsigned long long)total);
        for (int i = 0; i < nt; i++)
            tide_strbuf_printf(&ib, "%s\n    \"%s\": \"%s\"", i ? "," : "", ts[i].name, sh[ts[i].shard].name);
        tide_strbuf_printf(&ib, "\n  }\n}\n");
        if (ib.oom) {
            st = tide_err(ctx, TIDE_E_NOMEM, "make_synthetic %s: out of memory", dir);
            goto done;
        }
        index_tmp_exists = true;
        if ((st = write_text(ctx, index_tmp, ib.p, ib.len))) {
            index_tmp_exists = false;
            goto done;
        }
    }

    /* Publish: shards, then the index that names them, then the config. A
     * stale file of the other layout would shadow or confuse the new one. */
    for (int s = 0; s < ns; s++) {
        if (rename(sh[s].tmp, sh[s].path) != 0) {
            st = tide_err(ctx, TIDE_E_IO, "%s: cannot rename into place: %s", sh[s].path,
                          strerror(errno));
            goto done;
        }
        sh[s].tmp_exists = false;
    }
    if (sharded) {
        if (rename(index_tmp, index_path) != 0) {
            st = tide_err(ctx, TIDE_E_IO, "%s: cannot rename into place: %s", index_path,
                          strerror(errno));
            goto done;
        }
        index_tmp_exists = false;
        (void)unlink(single_path);
    } else {
        (void)unlink(index_path);
    }
    remove_stale_shards(dir, sharded ? ns : 0);
    if ((st = tide_llama_config_save(ctx, cfg, config_path))) goto done;
    fsync_dir(dir);
    tide_progress(ctx, "generating", w.total, w.total);

done:
    for (int s = 0; s < ns; s++) {
        if (sh[s].tmp_exists) unlink(sh[s].tmp);
        tide_free(sh[s].path);
        tide_free(sh[s].tmp);
    }
    if (index_tmp_exists) unlink(index_tmp);
    tide_free(ib.p);
    tide_free(ts);
    tide_free(sh);
    for (int k = 0; k < NBUF; k++) tide_free_aligned(w.pl.buf[k]);
    tide_free(w.items);
    if (sync_init) {
        pthread_mutex_destroy(&w.pl.mu);
        pthread_cond_destroy(&w.pl.cv);
    }
    tide_free(index_path);
    tide_free(index_tmp);
    tide_free(single_path);
    tide_free(config_path);
    return st;
}
