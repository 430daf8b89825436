/*
 * planner_alloc.c - device space for the planner's engine (planner_int.h):
 * allocation by best fit, else by the eviction window of least cost (found
 * from the candidate heap of tensors used furthest ahead, or by a scan of
 * the arena), the exact release records of device bytes, releases made ahead
 * of execution and their resolution, scratch, the forced preparation of a
 * step and the fallback of a fresh layout.
 */
#include "planner/planner_int.h"

#include <assert.h>
#include <string.h>

/* Records the release of device bytes [off, off+n) (see tide_relmap). */
void pe_devrel(pe *e, uint64_t off, uint64_t n, int ins, int step) {
    if (tide_relmap_set(&e->rel, off, off + n, ins, step) && !e->st)
        e->st = tide_err(e->ctx, TIDE_E_NOMEM, "out of memory planning");
}

typedef struct relq {
    const pe *e;
    pe_waits w;
    int step;                     /* latest release step */
    double t;                     /* latest release time (resolved parts) */
} relq;

static void relq_fn(void *user, int ins, int step) {
    relq *q = user;
    if (ins >= 0) {
        pw_add(q->e, &q->w, ins);
        if (q->e->ins_end[ins] > q->t) q->t = q->e->ins_end[ins];
    }
    if (step > q->step) q->step = step;
    if (step >= 0 && step <= q->e->last_compute_step) {
        int c = q->e->cs_after[step];
        if (q->e->ins_end[c] > q->t) q->t = q->e->ins_end[c];
    }
}

/* What a new occupant of device bytes [off, off+n) must wait for. */
static relq devrel_query(pe *e, uint64_t off, uint64_t n) {
    relq q;
    q.e = e;
    pw_init(&q.w);
    q.step = -1;
    q.t = 0;
    tide_relmap_query(&e->rel, off, off + n, relq_fn, &q);
    return q;
}

/* Gives block b (just taken for an occupant) its exact release record; the
 * pieces of the free block left beside it inherit its record: if pending,
 * they must be merged once it resolves too. */
static void pend_push(pe *e, tide_blk *b, int step);
static void set_pre(pe *e, tide_blk *b) {
    tide_blk *side[2] = {b->prev, b->next};
    for (int k = 0; k < 2; k++)
        if (side[k] && side[k]->owner == TIDE_BLK_FREE && side[k]->rel_step > e->last_compute_step)
            pend_push(e, side[k], side[k]->rel_step);
    relq q = devrel_query(e, b->off, b->size);
    memcpy(b->rel, q.w.w, sizeof b->rel);
    b->rel_step = q.step;
}


/* ---------------------------------------------------------------- heaps */

/* Remembers a block released ahead of execution at step. */
static void pend_push(pe *e, tide_blk *b, int step) {
    if (tide_grow((void **)&e->pend, &e->cap_pend, e->n_pend + 1, sizeof *e->pend)) {
        if (!e->st) e->st = tide_err(e->ctx, TIDE_E_NOMEM, "out of memory planning");
        return;
    }
    int i = e->n_pend++;
    while (i > 0 && e->pend[(i - 1) / 2].step > step) {
        e->pend[i] = e->pend[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    e->pend[i] = (struct pe_pend){step, b, b->off};
}

static struct pe_pend pend_pop(pe *e) {
    struct pe_pend top = e->pend[0], x = e->pend[--e->n_pend];
    int i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= e->n_pend) break;
        if (c + 1 < e->n_pend && e->pend[c + 1].step < e->pend[c].step) c++;
        if (x.step <= e->pend[c].step) break;
        e->pend[i] = e->pend[c];
        i = c;
    }
    if (e->n_pend) e->pend[i] = x;
    return top;
}

/* Step's releases are resolved: merge those blocks with their neighbours. */
void pe_pend_resolve(pe *e, int step) {
    while (e->n_pend && e->pend[0].step <= step) {
        struct pe_pend p = pend_pop(e);
        if (p.b->owner != TIDE_BLK_FREE || p.b->off != p.off) continue; /* taken or merged away */
        if (p.b->rel_step > step) pend_push(e, p.b, p.b->rel_step);  /* merged with a later release */
        else tide_arena_coalesce_at(&e->dev, p.b);
    }
}

void pe_cand_push(pe *e, int t, int key) {
    if (!e->use_cand || (e->pinned && e->pinned[t])) return; /* residents are no candidates */
    if (tide_grow((void **)&e->cand, &e->cap_cand, e->n_cand + 1, sizeof *e->cand)) {
        if (!e->st) e->st = tide_err(e->ctx, TIDE_E_NOMEM, "out of memory planning");
        return;
    }
    int i = e->n_cand++;
    while (i > 0 && e->cand[(i - 1) / 2].key < key) {
        e->cand[i] = e->cand[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    e->cand[i] = (struct pe_cand){key, t};
}

static struct pe_cand cand_pop(pe *e) {
    struct pe_cand top = e->cand[0], x = e->cand[--e->n_cand];
    int i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= e->n_cand) break;
        if (c + 1 < e->n_cand && e->cand[c + 1].key > e->cand[c].key) c++;
        if (x.key >= e->cand[c].key) break;
        e->cand[i] = e->cand[c];
        i = c;
    }
    if (e->n_cand) e->cand[i] = x;
    return top;
}

bool pe_can_doom(pe *e, int t, int step) {
    pe_tensor *T = &e->t[t];
    if (T->dev == PE_DEV_NONE || !T->blk || T->doomed) return false;
    if (T->role == TIDE_ROLE_STATE || T->role == TIDE_ROLE_OUTPUT) return false;
    /* a streamed read-only tensor leaves after its last use of the iteration:
     * its home copy stays valid */
    if (e->stream && e->stream[t] && step % e->n_ops == tide_lifetime_last_op(&e->lt, t)) return true;
    return tide_lifetime_dead_after(&e->lt, t, step);
}

void pe_doom(pe *e, int t, int step) {
    pe_tensor *T = &e->t[t];
    int rel[TIDE_STREAM_COUNT];
    pe_rel_one(rel, 0, -1);
    pe_devrel(e, T->off, T->asize, -1, step);
    e->last_freed = tide_arena_release(&e->dev, T->blk, rel, step);
    pend_push(e, e->last_freed, step);
    T->blk = NULL;
    T->doomed = true;
    T->doom_step = step;
}

/* ---------------------------------------------------------------- allocation */

typedef struct alloc_ctx {
    pe *e;
    uint64_t size;
    bool for_load;
    int reloc_step;               /* >= 0: the working set of this step may move */
    double target;
    pe_cost_fn cost;
    void *user;
} alloc_ctx;

/* Window cost of moving a working-set tensor (seconds: beyond any other). */
#define RELOC_COST 1e6

/* Simulated time by which a free block's previous occupants are gone (from
 * its merged record: a preference only; waits come from the exact map). */
static double rel_time(const pe *e, const tide_blk *b) {
    double t = 0;
    for (int s = 0; s < TIDE_STREAM_COUNT; s++)
        if (b->rel[s] >= 0 && e->ins_end[b->rel[s]] > t) t = e->ins_end[b->rel[s]];
    if (b->rel_step >= 0 && b->rel_step <= e->last_compute_step && e->ins_end[e->cs_after[b->rel_step]] > t)
        t = e->ins_end[e->cs_after[b->rel_step]];
    return t;
}

/* A block released ahead of execution is pending as a whole (pending and
 * resolved blocks never merge), so its record decides for a LOAD. */
static int accept_blk(const tide_blk *b, void *user) {
    alloc_ctx *ac = user;
    if (ac->for_load && b->rel_step > ac->e->last_compute_step) return 0;
    return rel_time(ac->e, b) <= ac->target ? 2 : 1;
}

static double window_cost(tide_blk *b, void *user) {
    alloc_ctx *ac = user;
    if (b->owner == TIDE_BLK_FREE) return ac->for_load && b->rel_step > ac->e->last_compute_step ? -1 : 0;
    if (b->owner < 0) return -1;
    pe *e = ac->e;
    int t = b->owner;
    if (ac->reloc_step >= 0 && pe_next_use(e, t) == ac->reloc_step) {
        /* a last resort: moving a tensor the step itself uses costs its
         * store and reload, and more than any other eviction */
        if (e->t[t].dev != PE_DEV_VALID) return RELOC_COST;
        bool store, reread;
        int next;
        if (!pe_evict_info(e, t, &store, &reread, &next)) return -1;
        return RELOC_COST + pe_load_seconds(e, t) +
               (store ? pe_store_seconds(e, t, e->t[t].role == TIDE_ROLE_TEMP ? TIDE_TIER_HOST : e->plan->home[t]) : 0);
    }
    if (e->t[t].dev != PE_DEV_VALID) return -1;
    return ac->cost(e, t, ac->user);
}

/* Candidates tried per allocation: the resident tensors used furthest ahead. */
#define PE_CAND_K 8

/* Evaluates the windows that start or end at block v (covering ac->size
 * bytes); keeps the cheapest in *best, *first, *last. Returns false when v's
 * cost says no candidate used sooner can qualify either (PE_COST_STOP). */
static bool window_at(pe *e, alloc_ctx *ac, tide_blk *v, double *best, tide_blk **first, tide_blk **last) {
    double cv = window_cost(v, ac);
    if (cv < 0) return cv > PE_COST_STOP;
    for (int dir = 0; dir < 2; dir++) {
        tide_blk *lo = v, *hi = v;
        double sum = cv;
        bool ok = true;
        while (ok && hi->off + hi->size - lo->off < ac->size) {
            tide_blk *x = dir ? lo->prev : hi->next;
            double c = x ? window_cost(x, ac) : -1;
            if (c < 0) {
                ok = false;
                break;
            }
            sum += c;
            if (dir) lo = x;
            else hi = x;
        }
        if (ok && (*best < 0 || sum < *best)) {
            *best = sum;
            *first = lo;
            *last = hi;
        }
    }
    return true;
}

/* Window search from the candidate heap: the PE_CAND_K evictable tensors
 * (half as many ahead of execution) used furthest after step, each with its
 * neighbours. O(K log n + window). Returns true with *first, *last set when
 * one qualifies. */
static bool cand_window(pe *e, alloc_ctx *ac, int step, tide_blk **first, tide_blk **last) {
    struct pe_cand keep[PE_CAND_K + 1];
    int got = 0, k = step > e->exec ? PE_CAND_K / 2 : PE_CAND_K; /* ahead: a prefetch may wait */
    double best = -1;
    while (e->n_cand && got < k) {
        struct pe_cand c = cand_pop(e);
        pe_tensor *T = &e->t[c.t];
        if (!T->blk || T->doomed || T->dev != PE_DEV_VALID || pe_next_use(e, c.t) != c.key) continue; /* stale */
        bool dup = false;
        for (int i = 0; i < got && !dup; i++) dup = keep[i].t == c.t;
        if (dup) continue;
        keep[got++] = c;
        if (c.key <= step) break; /* this and the rest are needed first */
        if (!window_at(e, ac, T->blk, &best, first, last)) break;
    }
    for (int i = 0; i < got; i++) pe_cand_push(e, keep[i].t, keep[i].key);
    return best >= 0;
}

tide_blk *pe_alloc(pe *e, uint64_t size, int owner, bool for_load, tide_stream stream, int step,
                   pe_cost_fn cost, void *user, bool relocate) {
    alloc_ctx ac = {e, size, for_load, relocate ? step : -1, 0, cost, user};
    ac.target = e->stream_end[stream];
    if (for_load && e->res_free[PE_RES_H2D] > ac.target) ac.target = e->res_free[PE_RES_H2D];
    /* With candidates at hand (tide), blocks are merged as their releases
     * resolve (pend_resolve); the baselines and the fresh layout merge now. */
    bool ahead = e->use_cand && step > e->exec && !relocate;
    tide_blk *b = tide_arena_best_fit(&e->dev, size, accept_blk, &ac, 8);
    if (!b && (!e->use_cand || !cost) && e->dev.n_free > 1) {
        tide_arena_coalesce(&e->dev);
        b = tide_arena_best_fit(&e->dev, size, accept_blk, &ac, 8);
    }
    if (b) {
        b = tide_arena_take(&e->dev, b, b->off, size, owner);
        if (!b) e->st = tide_err(e->ctx, TIDE_E_NOMEM, "out of memory planning");
        else set_pre(e, b);
        return b;
    }
    if (!cost) return NULL;
    tide_blk *first = NULL, *last = NULL;
    if (!(e->use_cand && !relocate && cand_window(e, &ac, step, &first, &last))) {
        if (ahead) return NULL; /* no victim worth it: the prefetch waits */
        if (tide_arena_window(&e->dev, size, window_cost, &ac, &first, &last)) return NULL;
    }
    uint64_t off = first->off;
    /* Collect the victims first: evicting merges blocks under the walk. The
     * new block's release record is exactly the window's (its free parts and
     * the victims' DROPs): merging may join neighbours the window excluded. */
    int nv = 0;
    for (tide_blk *x = first;; x = x->next) {
        if (x->owner >= 0) {
            if (tide_grow((void **)&e->vict, &e->cap_vict, nv + 1, sizeof *e->vict)) {
                e->st = tide_err(e->ctx, TIDE_E_NOMEM, "out of memory planning");
                return NULL;
            }
            e->vict[nv++] = x->owner;
        }
        if (x == last) break;
    }
    tide_blk *f = first;
    for (int i = 0; i < nv; i++) {
        if (e->t[e->vict[i]].dev == PE_DEV_ALLOC) pe_unplace(e, e->vict[i]);
        else if (pe_evict(e, e->vict[i], stream, step) < 0) return NULL;
        f = e->last_freed;
    }
    /* The window is now free, maybe in several blocks: join them. */
    while (f->off > off) f = f->prev;
    tide_blk *l = f;
    while (l->off + l->size < off + size) l = l->next;
    f = tide_arena_merge_run(&e->dev, f, l);
    assert(f->owner == TIDE_BLK_FREE && f->off <= off && off + size <= f->off + f->size);
    b = tide_arena_take(&e->dev, f, off, size, owner);
    if (!b) {
        e->st = tide_err(e->ctx, TIDE_E_NOMEM, "out of memory planning");
        return NULL;
    }
    set_pre(e, b);
    return b;
}

/* Distinct tensors of op: inputs first, then outputs not read. */
int pe_op_tensors(const tide_op *op, int *ts, bool *is_in) {
    int n = 0;
    for (int k = 0; k < op->n_in + op->n_out; k++) {
        int t = k < op->n_in ? op->in[k] : op->out[k - op->n_in];
        bool seen = false;
        for (int j = 0; j < n && !seen; j++) seen = ts[j] == t;
        if (seen) continue;
        is_in[n] = k < op->n_in;
        ts[n++] = t;
    }
    return n;
}

void pe_scratch_set(pe *e, int step, tide_blk *b) {
    pe_scratch *sl = &e->scratch[step % e->scratch_cap];
    assert(sl->step < 0 || sl->step == step);
    b->aux = step;
    sl->step = step;
    sl->blk = b;
    sl->off = b->off;
    memcpy(sl->pre, b->rel, sizeof sl->pre);
    sl->pre_step = b->rel_step;
}

void pe_scratch_doom(pe *e, int step) {
    pe_scratch *sl = &e->scratch[step % e->scratch_cap];
    if (sl->step != step || !sl->blk) return;
    int rel[TIDE_STREAM_COUNT];
    pe_rel_one(rel, 0, -1);
    pe_devrel(e, sl->off, sl->blk->size, -1, step);
    e->last_freed = tide_arena_release(&e->dev, sl->blk, rel, step);
    pend_push(e, e->last_freed, step);
    sl->blk = NULL;
}

static tide_stream load_stream(const pe *e, int t) {
    return e->t[t].cp[TIDE_TIER_HOST].valid ? TIDE_STREAM_H2D : TIDE_STREAM_IO;
}

tide_status pe_prepare_forced(pe *e, int step, pe_cost_fn cost, void *user) {
    const tide_op *op = &e->g->ops[pe_op_index(e, step)];
    int ts[TIDE_OP_MAX_IN + TIDE_OP_MAX_OUT];
    bool is_in[TIDE_OP_MAX_IN + TIDE_OP_MAX_OUT];
    int n = pe_op_tensors(op, ts, is_in);
    /* Up to three passes: making room for one item by moving another one of
     * the step (when fragmentation leaves no other window) needs another
     * pass for the moved one. Then the fallback of a fresh layout. */
    for (int pass = 0; pass < 3; pass++) {
        bool done = true;
        for (int i = 0; i <= n; i++) {
            bool scratch = i == n;
            if (scratch ? !op->scratch_bytes || e->scratch[step % e->scratch_cap].step == step
                        : e->t[ts[i]].dev != PE_DEV_NONE || e->t[ts[i]].in_place)
                continue;
            int t = scratch ? TIDE_BLK_SCRATCH : ts[i];
            bool ld = !scratch && is_in[i];
            if (!scratch && pe_place_pinned(e, t)) {
                if (ld && pe_load(e, t, step, e->lru_loads ? e->last_compute : -1) < 0) return e->st;
                continue;
            }
            uint64_t size = scratch ? tide_plan_align(op->scratch_bytes) : e->t[t].asize;
            tide_stream s = ld ? load_stream(e, t) : TIDE_STREAM_COMPUTE;
            tide_blk *b = pe_alloc(e, size, t, ld, s, step, cost, user, false);
            if (!b && !e->st) b = pe_alloc(e, size, t, ld, s, step, cost, user, true);
            if (!b) return e->st ? e->st : pe_compact(e, step);
            if (scratch) {
                pe_scratch_set(e, step, b);
                continue;
            }
            pe_place(e, t, b);
            if (ld && pe_load(e, t, step, e->lru_loads ? e->last_compute : -1) < 0) return e->st;
        }
        for (int i = 0; i < n; i++) done = done && (e->t[ts[i]].dev != PE_DEV_NONE || e->t[ts[i]].in_place);
        if (op->scratch_bytes) done = done && e->scratch[step % e->scratch_cap].step == step;
        if (done) return TIDE_OK;
    }
    return pe_compact(e, step);
}

tide_status pe_compact(pe *e, int step) {
    const tide_op *op = &e->g->ops[pe_op_index(e, step)];
    int ts[TIDE_OP_MAX_IN + TIDE_OP_MAX_OUT];
    bool is_in[TIDE_OP_MAX_IN + TIDE_OP_MAX_OUT];
    int n = pe_op_tensors(op, ts, is_in);
    /* Everything out, the working set included (fragmentation is what put us
     * here); its inputs come straight back. */
    for (;;) {
        tide_blk *b = e->dev.head;
        while (b && !(b->owner >= 0 || b->owner == TIDE_BLK_SCRATCH)) b = b->next;
        if (!b) break;
        if (b->owner == TIDE_BLK_SCRATCH) {
            /* only this step's scratch can be held here: never written yet */
            pe_scratch *sl = &e->scratch[b->aux % e->scratch_cap];
            assert(sl->step == b->aux && sl->blk == b);
            e->last_freed = tide_arena_release(&e->dev, b, sl->pre, sl->pre_step);
            sl->step = -1;
            sl->blk = NULL;
            continue;
        }
        int t = b->owner;
        if (e->t[t].dev == PE_DEV_ALLOC) pe_unplace(e, t);
        else if (pe_evict(e, t, TIDE_STREAM_H2D, step) < 0) return e->st;
    }
    tide_arena_coalesce(&e->dev);
    /* Largest first into the empty arena: they fit, the budget covers the
     * working set. */
    int order[TIDE_OP_MAX_IN + TIDE_OP_MAX_OUT + 1], m = 0;
    for (int i = 0; i < n; i++) order[m++] = i;
    if (op->scratch_bytes) order[m++] = -1;
    for (int i = 1; i < m; i++)
        for (int j = i; j > 0; j--) {
            uint64_t a = order[j] < 0 ? tide_plan_align(op->scratch_bytes) : e->t[ts[order[j]]].asize;
            uint64_t b = order[j - 1] < 0 ? tide_plan_align(op->scratch_bytes) : e->t[ts[order[j - 1]]].asize;
            if (a <= b) break;
            int x = order[j];
            order[j] = order[j - 1];
            order[j - 1] = x;
        }
    for (int k = 0; k < m; k++) {
        int i = order[k];
        bool scratch = i < 0;
        int t = scratch ? TIDE_BLK_SCRATCH : ts[i];
        if (!scratch && (e->t[t].dev != PE_DEV_NONE || e->t[t].in_place)) continue; /* placed already, or
                                                                                       used in place */
        if (!scratch && pe_place_pinned(e, t)) {
            if (is_in[i] && pe_load(e, t, step, e->lru_loads ? e->last_compute : -1) < 0) return e->st;
            continue;
        }
        uint64_t sz = scratch ? tide_plan_align(op->scratch_bytes) : e->t[t].asize;
        tide_blk *b = pe_alloc(e, sz, t, !scratch && is_in[i],
                               !scratch && is_in[i] ? load_stream(e, t) : TIDE_STREAM_COMPUTE, step, NULL, NULL,
                               false);
        if (!b) {
            if (e->st) return e->st;
            return e->st = tide_err(e->ctx, TIDE_E_INFEASIBLE,
                                    "plan: the working set of op %d does not fit the device budget of %llu bytes",
                                    pe_op_index(e, step), (unsigned long long)e->plan->device_budget);
        }
        if (scratch) {
            pe_scratch_set(e, step, b);
            continue;
        }
        pe_place(e, t, b);
        if (is_in[i] && pe_load(e, t, step, e->lru_loads ? e->last_compute : -1) < 0) return e->st;
    }
    return TIDE_OK;
}
