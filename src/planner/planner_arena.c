/*
 * planner_arena.c - the planner's range allocator (planner_arena.h): blocks in
 * address order, free blocks in a treap by (size, offset), release records.
 */
#include "planner/planner_arena.h"

#include <string.h>

#define CHUNK 1024

/* ---------------------------------------------------------------- nodes */

static tide_blk *node_new(tide_arena *a) {
    if (!a->pool) {
        if (tide_grow((void **)&a->chunks, &a->cap_chunks, a->n_chunks + 1, sizeof *a->chunks))
            return NULL;
        tide_blk *c = tide_malloc(CHUNK * sizeof *c);
        if (!c) return NULL;
        a->chunks[a->n_chunks++] = c;
        for (int i = 0; i < CHUNK; i++) {
            c[i].next = a->pool;
            a->pool = &c[i];
        }
    }
    tide_blk *b = a->pool;
    a->pool = b->next;
    memset(b, 0, sizeof *b);
    a->rng = a->rng * 1664525u + 1013904223u;
    b->prio = a->rng;
    return b;
}

static void node_put(tide_arena *a, tide_blk *b) {
    b->owner = TIDE_BLK_RECYCLED; /* stale references can tell */
    b->next = a->pool;
    a->pool = b;
}

/* ---------------------------------------------------------------- treap */

/* True when x's key is below (size, off). */
static bool key_lt(const tide_blk *x, uint64_t size, uint64_t off) {
    return x->size < size || (x->size == size && x->off < off);
}

/* Splits t into keys < (size, off) and keys >= (size, off). */
static void split(tide_blk *t, uint64_t size, uint64_t off, tide_blk **l, tide_blk **r) {
    if (!t) {
        *l = *r = NULL;
        return;
    }
    if (key_lt(t, size, off)) {
        split(t->tr, size, off, &t->tr, r);
        *l = t;
    } else {
        split(t->tl, size, off, l, &t->tl);
        *r = t;
    }
}

static tide_blk *merge(tide_blk *l, tide_blk *r) {
    if (!l) return r;
    if (!r) return l;
    if (l->prio > r->prio) {
        l->tr = merge(l->tr, r);
        return l;
    }
    r->tl = merge(l, r->tl);
    return r;
}

static void treap_insert(tide_arena *a, tide_blk *n) {
    tide_blk *l, *r;
    n->tl = n->tr = NULL;
    split(a->root, n->size, n->off, &l, &r);
    a->root = merge(merge(l, n), r);
    a->n_free++;
}

static void treap_erase(tide_arena *a, tide_blk *n) {
    tide_blk *l, *m, *r;
    split(a->root, n->size, n->off, &l, &r);
    split(r, n->size, n->off + 1, &m, &r);
    /* m is exactly n: keys are unique */
    a->root = merge(l, r);
    n->tl = n->tr = NULL;
    a->n_free--;
}

/* Smallest free block with key >= (size, off). */
static tide_blk *lower_bound(const tide_arena *a, uint64_t size, uint64_t off) {
    tide_blk *res = NULL, *t = a->root;
    while (t) {
        if (!key_lt(t, size, off)) {
            res = t;
            t = t->tl;
        } else {
            t = t->tr;
        }
    }
    return res;
}

/* ---------------------------------------------------------------- arena */

int tide_arena_init(tide_arena *a, uint64_t base, uint64_t size, uint64_t align) {
    memset(a, 0, sizeof *a);
    a->base = base;
    a->size = size;
    a->align = align ? align : 1;
    a->rng = 0x9e3779b9u;
    a->high = base;
    a->resolved = -1;
    tide_blk *b = node_new(a);
    if (!b) {
        tide_arena_free(a);
        return -1;
    }
    b->off = base;
    b->size = size;
    b->owner = TIDE_BLK_FREE;
    for (int s = 0; s < TIDE_STREAM_COUNT; s++) b->rel[s] = -1;
    b->rel_step = -1;
    a->head = b;
    a->n_blocks = 1;
    if (size) treap_insert(a, b);
    return 0;
}

void tide_arena_free(tide_arena *a) {
    if (!a) return;
    for (int i = 0; i < a->n_chunks; i++) tide_free(a->chunks[i]);
    tide_free(a->chunks);
    memset(a, 0, sizeof *a);
}

tide_blk *tide_arena_best_fit(tide_arena *a, uint64_t size, tide_arena_accept_fn accept, void *user,
                              int max_scan) {
    tide_blk *first_ok = NULL;
    int scanned = 0;
    /* In-order walk from the lower bound with a stack of the ancestors still
     * to visit (the treap is O(log n) deep). */
    tide_blk *stack[128];
    int sp = 0;
    for (tide_blk *t = a->root; t;) {
        if (!key_lt(t, size, 0)) {
            if (sp == 128) break; /* cannot happen with a sane treap; the walk just ends early */
            stack[sp++] = t;
            t = t->tl;
        } else {
            t = t->tr;
        }
    }
    while (sp > 0) {
        tide_blk *b = stack[--sp];
        for (tide_blk *t = b->tr; t && sp < 128; t = t->tl) stack[sp++] = t;
        int r = accept ? accept(b, user) : 2;
        if (r == 2) return b;
        if (r == 1 && !first_ok) first_ok = b;
        if (++scanned >= max_scan && (first_ok || scanned >= 8 * max_scan)) break;
    }
    return first_ok;
}

tide_blk *tide_arena_take(tide_arena *a, tide_blk *f, uint64_t off, uint64_t size, int owner) {
    uint64_t end = f->off + f->size;
    bool left = off > f->off, right = off + size < end;
    tide_blk *l = NULL, *r = NULL;
    if (left && !(l = node_new(a))) return NULL;
    if (right && !(r = node_new(a))) {
        if (l) node_put(a, l);
        return NULL;
    }
    treap_erase(a, f);
    if (l) {
        l->off = f->off;
        l->size = off - f->off;
        l->owner = TIDE_BLK_FREE;
        memcpy(l->rel, f->rel, sizeof l->rel);
        l->rel_step = f->rel_step;
        l->prev = f->prev;
        l->next = f;
        if (f->prev) f->prev->next = l;
        else a->head = l;
        f->prev = l;
        treap_insert(a, l);
        a->n_blocks++;
    }
    if (r) {
        r->off = off + size;
        r->size = end - (off + size);
        r->owner = TIDE_BLK_FREE;
        memcpy(r->rel, f->rel, sizeof r->rel);
        r->rel_step = f->rel_step;
        r->prev = f;
        r->next = f->next;
        if (f->next) f->next->prev = r;
        f->next = r;
        treap_insert(a, r);
        a->n_blocks++;
    }
    f->off = off;
    f->size = size;
    f->owner = owner;
    f->aux = 0;
    if (off + size > a->high) a->high = off + size;
    return f;
}

/* Absorbs free block n (right neighbour of b) into b. */
static void absorb(tide_arena *a, tide_blk *b, tide_blk *n) {
    b->size += n->size;
    for (int s = 0; s < TIDE_STREAM_COUNT; s++)
        if (n->rel[s] > b->rel[s]) b->rel[s] = n->rel[s];
    if (n->rel_step > b->rel_step) b->rel_step = n->rel_step;
    b->next = n->next;
    if (n->next) n->next->prev = b;
    node_put(a, n);
    a->n_blocks--;
}

static bool pending(const tide_arena *a, const tide_blk *b) { return b->rel_step > a->resolved; }

/* May free blocks x and y (adjacent) merge on release? */
static bool mergeable(const tide_arena *a, const tide_blk *x, const tide_blk *y) {
    return x && y && x->owner == TIDE_BLK_FREE && y->owner == TIDE_BLK_FREE && pending(a, x) == pending(a, y);
}

tide_blk *tide_arena_release(tide_arena *a, tide_blk *b, const int rel[TIDE_STREAM_COUNT], int rel_step) {
    b->owner = TIDE_BLK_FREE;
    memcpy(b->rel, rel, sizeof b->rel);
    b->rel_step = rel_step;
    if (mergeable(a, b->prev, b)) {
        tide_blk *p = b->prev;
        treap_erase(a, p);
        absorb(a, p, b);
        b = p;
    }
    if (mergeable(a, b, b->next)) {
        treap_erase(a, b->next);
        absorb(a, b, b->next);
    }
    treap_insert(a, b);
    return b;
}

void tide_arena_coalesce(tide_arena *a) {
    for (tide_blk *b = a->head; b; b = b->next) {
        if (!mergeable(a, b, b->next)) continue;
        treap_erase(a, b);
        while (mergeable(a, b, b->next)) {
            treap_erase(a, b->next);
            absorb(a, b, b->next);
        }
        treap_insert(a, b);
    }
}

tide_blk *tide_arena_coalesce_at(tide_arena *a, tide_blk *b) {
    if (b->owner != TIDE_BLK_FREE || !(mergeable(a, b->prev, b) || mergeable(a, b, b->next))) return b;
    treap_erase(a, b);
    if (mergeable(a, b->prev, b)) {
        tide_blk *p = b->prev;
        treap_erase(a, p);
        absorb(a, p, b);
        b = p;
    }
    while (mergeable(a, b, b->next)) {
        treap_erase(a, b->next);
        absorb(a, b, b->next);
    }
    treap_insert(a, b);
    return b;
}

tide_blk *tide_arena_merge_run(tide_arena *a, tide_blk *first, tide_blk *last) {
    if (first == last) return first;
    treap_erase(a, first);
    while (first->next != last) {
        treap_erase(a, first->next);
        absorb(a, first, first->next);
    }
    treap_erase(a, last);
    absorb(a, first, last);
    treap_insert(a, first);
    return first;
}

int tide_arena_window(tide_arena *a, uint64_t size, tide_arena_cost_fn cost, void *user,
                      tide_blk **first, tide_blk **last) {
    double best = -1, sum = 0;
    tide_blk *L = NULL;
    for (tide_blk *R = a->head; R; R = R->next) {
        double c = cost(R, user);
        if (c < 0) {
            L = NULL;
            sum = 0;
            continue;
        }
        R->wcost = c;
        if (!L) L = R;
        sum += c;
        uint64_t end = R->off + R->size;
        if (end - L->off < size) continue;
        /* Shrink from the left while the rest still covers size: costs are
         * non-negative, so the shortest run ending at R is the cheapest. */
        while (L != R && end - L->next->off >= size) {
            sum -= L->wcost;
            L = L->next;
        }
        if (sum < 0) sum = 0; /* rounding */
        if (best < 0 || sum < best) {
            best = sum;
            *first = L;
            *last = R;
            if (best == 0) break;
        }
    }
    return best < 0 ? -1 : 0;
}

/* ---------------------------------------------------------------- checks */

static int count_treap(const tide_blk *t, const tide_blk *lo, const tide_blk *hi, bool *ok) {
    if (!t) return 0;
    if (t->owner != TIDE_BLK_FREE) *ok = false;
    if (lo && key_lt(t, lo->size, lo->off + 1)) *ok = false;
    if (hi && !key_lt(t, hi->size, hi->off)) *ok = false;
    if ((t->tl && t->tl->prio > t->prio) || (t->tr && t->tr->prio > t->prio)) *ok = false;
    return 1 + count_treap(t->tl, lo, t, ok) + count_treap(t->tr, t, hi, ok);
}

bool tide_arena_check(const tide_arena *a) {
    uint64_t at = a->base;
    int n = 0, nf = 0;
    for (const tide_blk *b = a->head; b; b = b->next) {
        if (b->off != at || (b->next && b->next->prev != b)) return false;
        if (b->size == 0 && a->size != 0) return false;
        if (b->owner == TIDE_BLK_FREE) {
            nf++;
            if (a->size && lower_bound(a, b->size, b->off) != b) return false;
        }
        at += b->size;
        n++;
    }
    if (at != a->base + a->size || n != a->n_blocks || (a->size && nf != a->n_free)) return false;
    bool ok = true;
    int nt = count_treap(a->root, NULL, NULL, &ok);
    return ok && (a->size == 0 || nt == nf);
}

/* ---------------------------------------------------------------- release map */

#define RNONE (-1)

void tide_relmap_init(tide_relmap *m) {
    memset(m, 0, sizeof *m);
    m->free_seg = m->root = RNONE;
    m->rng = 0x2545f491u;
}

void tide_relmap_free(tide_relmap *m) {
    tide_free(m->seg);
    tide_relmap_init(m);
}

static int rs_new(tide_relmap *m) {
    int s;
    if (m->free_seg != RNONE) {
        s = m->free_seg;
        m->free_seg = m->seg[s].left;
    } else {
        if (tide_grow((void **)&m->seg, &m->cap, m->n + 1, sizeof *m->seg)) return RNONE;
        s = m->n++;
    }
    m->rng = m->rng * 1664525u + 1013904223u;
    m->seg[s].left = m->seg[s].right = RNONE;
    m->seg[s].prio = m->rng;
    return s;
}

static void rs_put(tide_relmap *m, int s) {
    m->seg[s].left = m->free_seg;
    m->free_seg = s;
}

static void rs_put_tree(tide_relmap *m, int t) {
    if (t == RNONE) return;
    rs_put_tree(m, m->seg[t].left);
    rs_put_tree(m, m->seg[t].right);
    rs_put(m, t);
}

/* Splits t into segments starting below key and the rest. */
static void rs_split(tide_relseg *sg, int t, uint64_t key, int *l, int *r) {
    if (t == RNONE) {
        *l = *r = RNONE;
    } else if (sg[t].lo < key) {
        *l = t;
        rs_split(sg, sg[t].right, key, &sg[t].right, r);
    } else {
        *r = t;
        rs_split(sg, sg[t].left, key, l, &sg[t].left);
    }
}

static int rs_merge(tide_relseg *sg, int a, int b) {
    if (a == RNONE) return b;
    if (b == RNONE) return a;
    if (sg[a].prio >= sg[b].prio) {
        sg[a].right = rs_merge(sg, sg[a].right, b);
        return a;
    }
    sg[b].left = rs_merge(sg, a, sg[b].left);
    return b;
}

static int rs_rightmost(const tide_relseg *sg, int t) {
    while (sg[t].right != RNONE) t = sg[t].right;
    return t;
}

int tide_relmap_set(tide_relmap *m, uint64_t lo, uint64_t hi, int ins, int step) {
    if (lo >= hi) return 0;
    int nn = rs_new(m), tail = rs_new(m);
    if (nn == RNONE || tail == RNONE) {
        if (nn != RNONE) rs_put(m, nn);
        return -1;
    }
    tide_relseg *sg = m->seg; /* no allocation below */
    int l, mid, r;
    bool tailed = false;
    rs_split(sg, m->root, lo, &l, &r);
    rs_split(sg, r, hi, &mid, &r);
    if (l != RNONE) { /* a segment starting before lo may reach into [lo, hi) */
        int last = rs_rightmost(sg, l);
        if (sg[last].hi > lo) {
            if (sg[last].hi > hi) {
                sg[tail] = sg[last];
                sg[tail].lo = hi;
                sg[tail].left = sg[tail].right = RNONE;
                tailed = true;
            }
            sg[last].hi = lo;
        }
    }
    if (mid != RNONE) {
        int last = rs_rightmost(sg, mid);
        if (sg[last].hi > hi) {
            uint32_t pr = sg[tail].prio;
            sg[tail] = sg[last];
            sg[tail].lo = hi;
            sg[tail].prio = pr;
            sg[tail].left = sg[tail].right = RNONE;
            tailed = true;
        }
        rs_put_tree(m, mid);
    }
    sg[nn].lo = lo, sg[nn].hi = hi, sg[nn].ins = ins, sg[nn].step = step;
    if (tailed) r = rs_merge(sg, tail, r);
    else rs_put(m, tail);
    m->root = rs_merge(sg, rs_merge(sg, l, nn), r);
    return 0;
}

static void rs_visit(tide_relmap *m, int t, void (*fn)(void *, int, int), void *user) {
    if (t == RNONE) return;
    rs_visit(m, m->seg[t].left, fn, user);
    fn(user, m->seg[t].ins, m->seg[t].step);
    rs_visit(m, m->seg[t].right, fn, user);
}

void tide_relmap_query(tide_relmap *m, uint64_t lo, uint64_t hi, void (*fn)(void *user, int ins, int step),
                       void *user) {
    if (lo >= hi) return;
    tide_relseg *sg = m->seg;
    int l, mid, r;
    rs_split(sg, m->root, lo, &l, &r);
    rs_split(sg, r, hi, &mid, &r);
    if (l != RNONE) {
        int last = rs_rightmost(sg, l);
        if (sg[last].hi > lo) fn(user, sg[last].ins, sg[last].step);
    }
    rs_visit(m, mid, fn, user);
    m->root = rs_merge(sg, rs_merge(sg, l, mid), r);
}
