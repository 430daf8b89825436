/*
 * train_ckpt.c - a trainer's checkpoints (tide.h: tide_trainer_save,
 * tide_trainer_resume), over the checkpoint files of save.h.
 *
 * The parameters are the graph's PARAM tensors in graph order (the
 * checkpoint's order: embedding, layers, norm, head). Saving streams each
 * tensor from wherever it lives now (its host or SSD home, or its warm copy
 * on the device): the trainer reads one whole tensor at a time into a buffer
 * and hands it out in the writer's chunks. model.safetensors holds the
 * parameters in their dtype, or the f32 master weights (--save-dtype f32);
 * optimizer.safetensors the f32 masters (an f32 parameter is its own) and
 * moments. Resuming reads them back: a parameter is its master rounded to
 * its dtype, which is what the step left it as. A LoRA trainer's parameters
 * are its adapters alone (f32, their own masters), saved as PEFT's
 * adapter_model.safetensors and adapter_config.json beside the base's
 * config.json and the same optimizer.safetensors.
 */
#include "model/st_file.h"
#include "train/save.h"
#include "train/trainer_int.h"

#include <stdio.h>
#include <string.h>

/* The graph tensors of a block of a parameter: the parameter, its master
 * (-1 when f32), its moments, and the block's elements [elem0, elem0 + n)
 * of the whole. A parameter is one block, or several (vocabulary blocks:
 * graph tensors homed at their rows of it, in order). */
typedef struct par_ids {
    int w, master, m, v;
    uint64_t elem0, n;
} par_ids;

typedef struct par_list {
    int n;               /* parameters */
    int *first, *count;  /* their blocks in id */
    par_ids *id;
    tide_train_param *tp;
    char **names;        /* tp's names (a retiled graph outlives none of its own) */
} par_list;

static void par_list_free(par_list *pl) {
    for (int k = 0; pl->names && k < pl->n; k++) tide_free(pl->names[k]);
    tide_free(pl->names);
    tide_free(pl->first);
    tide_free(pl->count);
    tide_free(pl->id);
    tide_free(pl->tp);
}

static tide_status par_list_make(tide_trainer *t, par_list *pl) {
    const tide_graph *g = t->g;
    *pl = (par_list){0};
    /* LoRA: the adapters (the frozen base is no trained parameter) */
    const bool lora = t->o.step.lora_r > 0;
    int nb = 0;
    for (int i = 0; i < g->n_tensors; i++)
        nb += tide_train_tensor_class(g, i) == TIDE_TRAIN_PARAM && (!lora || train_is_adapter(t, i));
    pl->id = tide_calloc((size_t)nb + 1, sizeof *pl->id);
    pl->tp = tide_calloc((size_t)nb + 1, sizeof *pl->tp);
    pl->first = tide_calloc((size_t)nb + 1, sizeof *pl->first);
    pl->count = tide_calloc((size_t)nb + 1, sizeof *pl->count);
    pl->names = tide_calloc((size_t)nb + 1, sizeof *pl->names);
    if (!pl->id || !pl->tp || !pl->first || !pl->count || !pl->names) {
        par_list_free(pl);
        return tide_err(t->ctx, TIDE_E_NOMEM, "out of memory");
    }
    int kb = 0;
    for (int i = 0; i < g->n_tensors; i++) {
        /* a rank's copy of its rows of a parameter is no parameter of its own */
        if (tide_train_tensor_class(g, i) != TIDE_TRAIN_PARAM || train_is_shard(t, i, NULL)) continue;
        if (lora && !train_is_adapter(t, i)) continue;
        const tide_tensor *T = &g->tensors[i];
        uint64_t off = 0;
        const char *home = tide_graph_tensor_home(g, i, &off);
        char nm[300];
        par_ids *p = &pl->id[kb];
        p->w = i;
        snprintf(nm, sizeof nm, "master.%s", T->name);
        p->master = tide_graph_find(g, nm);
        snprintf(nm, sizeof nm, "exp_avg.%s", T->name);
        p->m = tide_graph_find(g, nm);
        snprintf(nm, sizeof nm, "exp_avg_sq.%s", T->name);
        p->v = tide_graph_find(g, nm);
        p->elem0 = off / tide_dtype_size(T->dtype);
        p->n = (uint64_t)tide_tensor_numel(T);
        int k = pl->n - 1;
        if (k >= 0 && strcmp(pl->names[k], home) == 0 && off > 0) {
            /* the next block of parameter k: rows added */
            pl->count[k]++;
            pl->tp[k].shape[0] += T->shape[0];
        } else {
            k = pl->n++;
            if (!(pl->names[k] = tide_strdup(home))) {
                par_list_free(pl);
                return tide_err(t->ctx, TIDE_E_NOMEM, "out of memory");
            }
            pl->first[k] = kb;
            pl->count[k] = 1;
            pl->tp[k].name = pl->names[k];
            pl->tp[k].ndim = T->ndim;
            for (int d = 0; d < T->ndim; d++) pl->tp[k].shape[d] = T->shape[d];
        }
        kb++;
    }
    return TIDE_OK;
}

/* ---------------------------------------------------------------- saving */

/* Rank 0 of data-parallel ranks, at the end of a save: frees the gathered
 * wholes and tells the other ranks the outcome st. */
static tide_status save_outcome(tide_trainer *t, void **whole, tide_status st) {
    if (!t->comm) return st;
    for (int i = 0; whole && i < t->g->n_tensors; i++) tide_free(whole[i]);
    tide_free(whole);
    tide_status r0 = st;
    tide_status b = tide_comm_bcast(t->comm, t->ctx, &r0, sizeof r0, "the save's outcome");
    return st ? st : b;
}

/* Data-parallel ranks: every rank's rows of each sharded master and moment,
 * gathered on rank 0 (*whole: per tensor, the whole, on rank 0 only), so that
 * the checkpoint is one process's, whole: any number of ranks resumes it. */
static tide_status gather_shards(tide_trainer *t, void ***whole) {
    const tide_graph *g = t->g;
    bool root = t->rank == 0;
    *whole = root ? tide_calloc((size_t)g->n_tensors, sizeof **whole) : NULL;
    if (root && !*whole) return tide_err(t->ctx, TIDE_E_NOMEM, "out of memory saving a checkpoint");
    tide_status st = TIDE_OK;
    for (int i = 0; !st && i < g->n_tensors; i++) {
        int w;
        if (!train_is_shard(t, i, &w) || tide_train_tensor_class(g, i) == TIDE_TRAIN_PARAM) continue;
        const tide_tensor *T = &g->tensors[i], *W = &g->tensors[w];
        int64_t rows = W->ndim ? W->shape[0] : 1, c = (rows + t->o.step.ranks - 1) / t->o.step.ranks;
        uint64_t row = T->nbytes / (uint64_t)(c ? c : 1);
        void *mine = tide_malloc_aligned((size_t)(T->nbytes ? T->nbytes : 1), 4096);
        uint64_t whole_bytes = (uint64_t)rows * row;
        void *all = root ? tide_malloc((size_t)(whole_bytes ? whole_bytes : 1)) : NULL;
        if (!mine || (root && !all)) st = tide_err(t->ctx, TIDE_E_NOMEM, "out of memory saving a checkpoint");
        if (!st) st = train_read_tensor(t, i, mine);
        if (!st) st = tide_comm_gather_rows(t->comm, t->ctx, mine, all, rows, row, T->name);
        tide_free_aligned(mine);
        if (root) (*whole)[i] = all;
    }
    return st;
}

typedef struct saver {
    tide_trainer *t;
    par_list pl;
    tide_dtype save_dtype;
    int cur;           /* graph tensor held in buf, -1: none */
    void *buf;
    void **whole;      /* data-parallel ranks, rank 0: per tensor of t->g, a
                          shard's whole (every rank's rows), or NULL */
} saver;

/* The graph tensor behind part `part` of block p of a parameter. */
static int part_tensor(const par_ids *p, tide_train_part part, tide_dtype dt) {
    switch (part) {
    case TIDE_PART_MODEL:
        /* f32 asked of a 16-bit parameter: its master */
        if (dt == TIDE_F32 && p->master >= 0) return p->master;
        return p->w;
    case TIDE_PART_MASTER: return p->master >= 0 ? p->master : p->w;
    case TIDE_PART_EXP_AVG: return p->m;
    case TIDE_PART_EXP_AVG_SQ: return p->v;
    default: return -1;
    }
}

static tide_status save_fill(void *user, tide_train_part part, int k, tide_dtype dt, uint64_t elem0, uint64_t n,
                             void *dst) {
    saver *s = user;
    tide_trainer *t = s->t;
    size_t es = tide_dtype_size(dt);
    /* the elements [elem0, elem0 + n) from each block they fall in */
    for (int b = 0; b < s->pl.count[k] && n > 0; b++) {
        const par_ids *p = &s->pl.id[s->pl.first[k] + b];
        if (elem0 >= p->elem0 + p->n) continue;
        int i = part_tensor(p, part, dt);
        if (i < 0) return tide_err(t->ctx, TIDE_E_INVALID, "no tensor for part %d of parameter %d", (int)part, k);
        const tide_tensor *T = &t->g->tensors[i];
        if (T->dtype != dt)
            return tide_err(t->ctx, TIDE_E_INVALID, "'%s' is %s, %s was asked for", T->name,
                            tide_dtype_name(T->dtype), tide_dtype_name(dt));
        if (s->whole && s->whole[i]) {
            uint64_t from = elem0 - p->elem0, cnt = TIDE_MIN(n, p->n - from);
            memcpy(dst, (char *)s->whole[i] + from * es, cnt * es);
            dst = (char *)dst + cnt * es;
            elem0 += cnt;
            n -= cnt;
            continue;
        }
        if (s->cur != i) {
            tide_status st = train_read_tensor(t, i, s->buf);
            if (st) return st;
            s->cur = i;
        }
        uint64_t from = elem0 - p->elem0, cnt = TIDE_MIN(n, p->n - from);
        memcpy(dst, (char *)s->buf + from * es, cnt * es);
        dst = (char *)dst + cnt * es;
        elem0 += cnt;
        n -= cnt;
    }
    if (n > 0) return tide_err(t->ctx, TIDE_E_INVALID, "parameter %d has no element %llu", k, (unsigned long long)elem0);
    return TIDE_OK;
}

tide_status tide_trainer_save(tide_trainer *t, const char *dir, tide_dtype save_dtype, const char *const *extra,
                              int n_extra) {
    if (t->o.step.lora_r > 0)
        return tide_err(t->ctx, TIDE_E_INVALID, "a LoRA trainer saves its adapter and state with "
                        "tide_trainer_save_lora");
    return train_save_state(t, dir, save_dtype, extra, n_extra, NULL);
}

tide_status train_save_state(tide_trainer *t, const char *dir, tide_dtype save_dtype, const char *const *extra,
                             int n_extra, const char *lora_config) {
    if (lora_config) save_dtype = TIDE_F32; /* the adapters */
    else if (save_dtype != t->cfg.dtype && save_dtype != TIDE_F32)
        return tide_err(t->ctx, TIDE_E_INVALID, "a checkpoint is saved in the model's dtype (%s) or f32, not %s",
                        tide_dtype_name(t->cfg.dtype), tide_dtype_name(save_dtype));
    if (n_extra < 0 || (n_extra && !extra)) return tide_err(t->ctx, TIDE_E_INVALID, "bad extra metadata");
    saver s = {.t = t, .save_dtype = save_dtype, .cur = -1};
    tide_status st = TIDE_OK;
    if (t->comm && (st = gather_shards(t, &s.whole))) return st;
    if (t->comm && t->rank != 0) { /* rank 0 writes; the others learn how it went */
        tide_status r0 = TIDE_OK;
        st = tide_comm_bcast(t->comm, t->ctx, &r0, sizeof r0, "the save's outcome");
        if (!st && r0) st = tide_err(t->ctx, r0, "rank 0 could not save the checkpoint to %s", dir);
        return st;
    }
    if ((st = par_list_make(t, &s.pl))) return save_outcome(t, s.whole, st);
    uint64_t biggest = 0;
    for (int i = 0; i < t->g->n_tensors; i++)
        if (t->g->tensors[i].role == TIDE_ROLE_STATE) biggest = TIDE_MAX(biggest, t->g->tensors[i].nbytes);
    tide_st_meta *em = tide_calloc((size_t)n_extra + 1, sizeof *em);
    s.buf = tide_malloc_aligned((size_t)(biggest ? biggest : 1), 4096);
    if (!em || !s.buf) {
        st = tide_err(t->ctx, TIDE_E_NOMEM, "out of memory saving a checkpoint");
        goto done;
    }
    for (int k = 0; k < n_extra; k++) em[k] = (tide_st_meta){extra[2 * k], extra[2 * k + 1]};
    const tide_llama_train_opts *so = &t->o.step;
    /* ranks: the whole step's micro-batches, as one process would count them */
    const int accum = so->accum * (t->comm ? tide_comm_size(t->comm) : 1);
    tide_train_save sv = {
        .cfg = &t->cfg, .model_dtype = save_dtype, .params = s.pl.tp, .n_params = s.pl.n, .fill = save_fill,
        .user = &s, .extra = em, .n_extra = n_extra, .lora_config = lora_config,
        .meta = {.step = t->step, .tokens_seen = t->step * accum * so->batch * so->seq, .batch = so->batch,
                 .seq = so->seq, .accum = accum, .shuffle = t->o.shuffle, .seed = t->o.seed,
                 .lr = (float)t->o.lr, .beta1 = so->beta1, .beta2 = so->beta2, .adam_eps = so->eps,
                 .weight_decay = so->weight_decay, .max_norm = so->grad_clip}};
    st = tide_train_save_dir(t->ctx, dir, &sv);
done:
    tide_free(em);
    tide_free_aligned(s.buf);
    par_list_free(&s.pl);
    return save_outcome(t, s.whole, st);
}

/* ---------------------------------------------------------------- resuming */

typedef struct resumed {
    tide_train_resume *r;
    par_list pl;
} resumed;

void train_resume_close(tide_trainer *t) {
    resumed *rs = t->resume;
    if (!rs) return;
    tide_train_resume_free(rs->r);
    par_list_free(&rs->pl);
    tide_free(rs);
    t->resume = NULL;
    tide_free(t->resume_dir);
    t->resume_dir = NULL;
}

tide_status tide_trainer_resume(tide_trainer *t, const char *dir) {
    if (t->run) return tide_err(t->ctx, TIDE_E_INVALID, "a trainer resumes before its first step");
    if (t->o.step.lora_r > 0) {
        /* the adapter's r, alpha and targets must be the step's (the
         * tensors' names and shapes are checked with the state) */
        int r = 0;
        float alpha = 0;
        unsigned tg = 0;
        tide_status st = tide_lora_read_config(t->ctx, dir, &r, &alpha, &tg);
        if (st) return st;
        const tide_llama_train_opts *so = &t->o.step;
        const unsigned want = so->lora_targets ? so->lora_targets : TIDE_LORA_ALL;
        if (r != so->lora_r || alpha != so->lora_alpha || tg != want)
            return tide_err(t->ctx, TIDE_E_INVALID, "%s: the LoRA state has r %d, alpha %g and targets 0x%x; this "
                            "run has r %d, alpha %g and targets 0x%x", dir, r, (double)alpha, tg, so->lora_r,
                            (double)so->lora_alpha, want);
        /* and the base's type (a state saved before it was recorded has none) */
        char path[4096];
        if (snprintf(path, sizeof path, "%s/optimizer.safetensors", dir) >= (int)sizeof path)
            return tide_err(t->ctx, TIDE_E_INVALID, "'%s': path too long", dir);
        tide_st_file f;
        if ((st = tide_st_open(t->ctx, path, &f))) return st;
        const cJSON *md = cJSON_GetObjectItemCaseSensitive(f.header, "__metadata__");
        const cJSON *b = md ? cJSON_GetObjectItemCaseSensitive(md, TIDE_LORA_BASE_KEY) : NULL;
        const char *want_base = train_lora_base_name(t);
        if (cJSON_IsString(b) && strcmp(b->valuestring, want_base) != 0)
            st = tide_err(t->ctx, TIDE_E_INVALID, "%s: the LoRA state trained on the base %s%s; this run has it %s%s",
                          dir, strcmp(b->valuestring, "as stored") ? "quantized to " : "", b->valuestring,
                          strcmp(want_base, "as stored") ? "quantized to " : "", want_base);
        tide_st_close(&f);
        if (st) return st;
    }
    train_resume_close(t);
    resumed *rs = tide_calloc(1, sizeof *rs);
    if (!rs || !(t->resume_dir = tide_strdup(dir))) {
        tide_free(rs);
        return tide_err(t->ctx, TIDE_E_NOMEM, "out of memory");
    }
    t->resume = rs;
    tide_status st = par_list_make(t, &rs->pl);
    if (!st) st = tide_train_resume_open(t->ctx, dir, &t->cfg, rs->pl.tp, rs->pl.n, &rs->r);
    if (st) {
        train_resume_close(t);
        return st;
    }
    const tide_train_meta *m = tide_train_resume_meta(rs->r);
    tide_llama_train_opts so_all = t->o.step, *so = &so_all;
    /* ranks: the whole step's micro-batches (any number of ranks resumes a
     * state whose step had as many) */
    so_all.accum *= so_all.ranks > 1 ? so_all.ranks : 1;
    const char *what = m->batch != so->batch ? "batch" : m->seq != so->seq ? "seq" : m->accum != so->accum ? "accum"
                     : m->shuffle != t->o.shuffle || (m->shuffle && m->seed != t->o.seed) ? "data order (shuffle seed)"
                     : NULL;
    if (what) {
        st = tide_err(t->ctx, TIDE_E_INVALID, "%s: the state was saved with batch %d, seq %d, accum %d, %s; this run "
                      "has batch %d, seq %d, accum %d, %s: its %s differs, so it cannot continue that run",
                      dir, m->batch, m->seq, m->accum, m->shuffle ? "shuffled" : "in order", so->batch, so->seq,
                      so->accum, t->o.shuffle ? "shuffled" : "in order", what);
        train_resume_close(t);
        return st;
    }
    if (m->step < 0) {
        st = tide_err(t->ctx, TIDE_E_FORMAT, "%s: negative step %lld", dir, (long long)m->step);
        train_resume_close(t);
        return st;
    }
    t->step = m->step;
    return TIDE_OK;
}

tide_status train_resume_rebind(tide_trainer *t) {
    resumed *rs = t->resume;
    par_list pl;
    tide_status st = par_list_make(t, &pl);
    if (st) return st;
    if (pl.n != rs->pl.n) {
        par_list_free(&pl);
        return tide_err(t->ctx, TIDE_E_INVALID, "the retiled graph has %d parameters, the resumed state %d", pl.n,
                        rs->pl.n);
    }
    /* the new blocks, the names and shapes the resumed state was opened with */
    tide_free(rs->pl.first), tide_free(rs->pl.count), tide_free(rs->pl.id);
    rs->pl.first = pl.first, rs->pl.count = pl.count, rs->pl.id = pl.id;
    pl.first = pl.count = NULL;
    pl.id = NULL;
    par_list_free(&pl);
    return TIDE_OK;
}

tide_status train_resume_value(tide_trainer *t, int i, void *dst) {
    resumed *rs = t->resume;
    const tide_tensor *T = &t->g->tensors[i];
    for (int k = 0; k < rs->pl.n; k++)
    for (int b = 0; b < rs->pl.count[k]; b++) {
        const par_ids *p = &rs->pl.id[rs->pl.first[k] + b];
        tide_train_part part;
        if (i == p->w || i == p->master) part = TIDE_PART_MASTER;
        else if (i == p->m) part = TIDE_PART_EXP_AVG;
        else if (i == p->v) part = TIDE_PART_EXP_AVG_SQ;
        else continue;
        const float *src = tide_train_resume_tensor(rs->r, part, k, NULL);
        if (!src) return tide_err(t->ctx, TIDE_E_FORMAT, "%s: no saved value for '%s'", t->resume_dir, T->name);
        src += p->elem0;
        size_t n = (size_t)tide_tensor_numel(T);
        int w;
        if (train_is_shard(t, i, &w)) { /* this rank's rows of the whole */
            const tide_tensor *W = &t->g->tensors[w];
            int64_t rows = W->ndim ? W->shape[0] : 1, r0, nr;
            tide_comm_shard_rows(rows, t->o.step.ranks, t->rank, &r0, &nr);
            uint64_t row = (uint64_t)tide_tensor_numel(W) / (uint64_t)(rows ? rows : 1);
            memset(dst, 0, T->nbytes);
            src += (uint64_t)r0 * row;
            n = (size_t)((uint64_t)nr * row);
        }
        /* a parameter is its master rounded to its dtype */
        if (T->dtype == TIDE_F32) memcpy(dst, src, n * sizeof(float));
        else tide_convert_from_f32(src, T->dtype, dst, n);
        return TIDE_OK;
    }
    return tide_err(t->ctx, TIDE_E_INVALID, "'%s' is not a training tensor", T->name);
}
