/*
 * planner_space.c - the device space of the planner's engine (planner_int.h):
 * which instruction released which arena bytes (the exact record behind
 * every new occupant's waits), releases made ahead of execution and their
 * resolution, the candidate heap of resident tensors used furthest ahead,
 * dooming dead values ahead of execution, the scratch ring, and the waits an
 * instruction gathers. It owns the state in engine.sp and reads the clock; it
 * calls nothing above it (the engine calls it; allocation calls both).
 */
#include "planner/planner_int.h"

#include <assert.h>
#include <string.h>

/* ---------------------------------------------------------------- waits */

void waits_add(const engine *e, waits *w, int ins) {
    if (ins < 0) return;
    int s = e->plan->ins[ins].stream;
    if (ins > w->w[s]) w->w[s] = ins;
}

void waits_add_release(const engine *e, waits *w, const int rel[TIDE_STREAM_COUNT], int rel_step) {
    for (int s = 0; s < TIDE_STREAM_COUNT; s++) waits_add(e, w, rel[s]);
    /* A release ahead of execution is only usable by a later COMPUTE, which
     * the compute stream orders by itself. */
    if (rel_step >= 0 && rel_step <= e->clk.last_compute_step) waits_add(e, w, e->clk.cs_after[rel_step]);
}

/* ---------------------------------------------------------------- release records */

/* Records the release of device bytes [off, off+n) (see tide_relmap). */
void space_released(engine *e, uint64_t off, uint64_t n, int ins, int step) {
    if (tide_relmap_set(&e->sp.rel, off, off + n, ins, step) && !e->st)
        e->st = tide_err(e->ctx, TIDE_E_NOMEM, "out of memory planning");
}

typedef struct relq {
    const engine *e;
    waits w;
    int step;                     /* latest release step */
    double t;                     /* latest release time (resolved parts) */
} relq;

static void relq_fn(void *user, int ins, int step) {
    relq *q = user;
    if (ins >= 0) {
        waits_add(q->e, &q->w, ins);
        if (q->e->clk.ins_end[ins] > q->t) q->t = q->e->clk.ins_end[ins];
    }
    if (step > q->step) q->step = step;
    if (step >= 0 && step <= q->e->clk.last_compute_step) {
        int c = q->e->clk.cs_after[step];
        if (q->e->clk.ins_end[c] > q->t) q->t = q->e->clk.ins_end[c];
    }
}

/* What a new occupant of device bytes [off, off+n) must wait for. */
static relq devrel_query(engine *e, uint64_t off, uint64_t n) {
    relq q;
    q.e = e;
    waits_init(&q.w);
    q.step = -1;
    q.t = 0;
    tide_relmap_query(&e->sp.rel, off, off + n, relq_fn, &q);
    return q;
}

/* Gives block b (just taken for an occupant) its exact release record; the
 * pieces of the free block left beside it inherit its record: if pending,
 * they must be merged once it resolves too. */
static void pend_push(engine *e, tide_blk *b, int step);
void space_claim(engine *e, tide_blk *b) {
    tide_blk *side[2] = {b->prev, b->next};
    for (int k = 0; k < 2; k++)
        if (side[k] && side[k]->owner == TIDE_BLK_FREE && side[k]->rel_step > e->clk.last_compute_step)
            pend_push(e, side[k], side[k]->rel_step);
    relq q = devrel_query(e, b->off, b->size);
    memcpy(b->rel, q.w.w, sizeof b->rel);
    b->rel_step = q.step;
}


/* ---------------------------------------------------------------- heaps */

/* Remembers a block released ahead of execution at step. */
static void pend_push(engine *e, tide_blk *b, int step) {
    if (tide_grow((void **)&e->sp.pend, &e->sp.cap_pend, e->sp.n_pend + 1, sizeof *e->sp.pend)) {
        if (!e->st) e->st = tide_err(e->ctx, TIDE_E_NOMEM, "out of memory planning");
        return;
    }
    int i = e->sp.n_pend++;
    while (i > 0 && e->sp.pend[(i - 1) / 2].step > step) {
        e->sp.pend[i] = e->sp.pend[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    e->sp.pend[i] = (struct pending_release){step, b, b->off};
}

static struct pending_release pend_pop(engine *e) {
    struct pending_release top = e->sp.pend[0], x = e->sp.pend[--e->sp.n_pend];
    int i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= e->sp.n_pend) break;
        if (c + 1 < e->sp.n_pend && e->sp.pend[c + 1].step < e->sp.pend[c].step) c++;
        if (x.step <= e->sp.pend[c].step) break;
        e->sp.pend[i] = e->sp.pend[c];
        i = c;
    }
    if (e->sp.n_pend) e->sp.pend[i] = x;
    return top;
}

/* Step's releases are resolved: merge those blocks with their neighbours. */
void space_resolve(engine *e, int step) {
    while (e->sp.n_pend && e->sp.pend[0].step <= step) {
        struct pending_release p = pend_pop(e);
        if (p.b->owner != TIDE_BLK_FREE || p.b->off != p.off) continue; /* taken or merged away */
        if (p.b->rel_step > step) pend_push(e, p.b, p.b->rel_step);  /* merged with a later release */
        else tide_arena_coalesce_at(&e->sp.dev, p.b);
    }
}

void space_cand_push(engine *e, int t, int key) {
    if (!e->sp.use_cand || (e->pinned && e->pinned[t])) return; /* residents are no candidates */
    if (tide_grow((void **)&e->sp.cand, &e->sp.cap_cand, e->sp.n_cand + 1, sizeof *e->sp.cand)) {
        if (!e->st) e->st = tide_err(e->ctx, TIDE_E_NOMEM, "out of memory planning");
        return;
    }
    int i = e->sp.n_cand++;
    while (i > 0 && e->sp.cand[(i - 1) / 2].key < key) {
        e->sp.cand[i] = e->sp.cand[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    e->sp.cand[i] = (struct victim_cand){key, t};
}

struct victim_cand space_cand_pop(engine *e) {
    struct victim_cand top = e->sp.cand[0], x = e->sp.cand[--e->sp.n_cand];
    int i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= e->sp.n_cand) break;
        if (c + 1 < e->sp.n_cand && e->sp.cand[c + 1].key > e->sp.cand[c].key) c++;
        if (x.key >= e->sp.cand[c].key) break;
        e->sp.cand[i] = e->sp.cand[c];
        i = c;
    }
    if (e->sp.n_cand) e->sp.cand[i] = x;
    return top;
}

bool space_can_doom(engine *e, int t, int step) {
    engine_tensor *T = &e->t[t];
    if (T->dev == DEV_NONE || !T->blk || T->doomed) return false;
    if (T->role == TIDE_ROLE_STATE || T->role == TIDE_ROLE_OUTPUT) return false;
    /* a streamed read-only tensor leaves after its last use of the iteration:
     * its home copy stays valid */
    if (e->stream && e->stream[t] && engine_pos(e, step) == tide_lifetime_last_op(&e->lt, t)) return true;
    return tide_lifetime_dead_after(&e->lt, t, step);
}

void space_doom(engine *e, int t, int step) {
    engine_tensor *T = &e->t[t];
    int rel[TIDE_STREAM_COUNT];
    release_one(rel, 0, -1);
    space_released(e, T->off, T->asize, -1, step);
    e->sp.last_freed = tide_arena_release(&e->sp.dev, T->blk, rel, step);
    pend_push(e, e->sp.last_freed, step);
    T->blk = NULL;
    T->doomed = true;
    T->doom_step = step;
}

/* ---------------------------------------------------------------- scratch */

void space_scratch_set(engine *e, int step, tide_blk *b) {
    scratch_slot *sl = &e->sp.scratch[step % e->sp.scratch_cap];
    assert(sl->step < 0 || sl->step == step);
    b->aux = step;
    sl->step = step;
    sl->blk = b;
    sl->off = b->off;
    memcpy(sl->pre, b->rel, sizeof sl->pre);
    sl->pre_step = b->rel_step;
}

void space_scratch_doom(engine *e, int step) {
    scratch_slot *sl = &e->sp.scratch[step % e->sp.scratch_cap];
    if (sl->step != step || !sl->blk) return;
    int rel[TIDE_STREAM_COUNT];
    release_one(rel, 0, -1);
    space_released(e, sl->off, sl->blk->size, -1, step);
    e->sp.last_freed = tide_arena_release(&e->sp.dev, sl->blk, rel, step);
    pend_push(e, e->sp.last_freed, step);
    sl->blk = NULL;
}

