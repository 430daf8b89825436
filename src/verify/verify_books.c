/*
 * verify_books.c - the verifier's books (verify_int.h): messages naming
 * instructions, happens-before queries, the interval maps from bytes of each
 * tier to their latest occupant (V3), and the copies of every tensor with
 * their versions and accesses (V4). The design note is at the top of
 * verify.c.
 */
#include "verify/verify_int.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* ---------------------------------------------------------------- messages */

const char *vtname(const vstate *v, int t) {
    return t >= 0 && t < v->g->n_tensors ? v->g->tensors[t].name : "?";
}

/* "device offset 4096", "host home", "ssd spill offset 0" */
void vplace(char *b, size_t n, tide_tier tier, uint64_t off) {
    if (tier != TIDE_TIER_DEVICE && off == TIDE_HOME)
        snprintf(b, n, "%s home", tide_tier_name(tier));
    else
        snprintf(b, n, "%s %s %" PRIu64, tide_tier_name(tier),
                 tier == TIDE_TIER_DEVICE ? "offset" : "spill offset", off);
}

static void vdescribe(const vstate *v, int i, char *b, size_t n) {
    const tide_ins *in = &v->p->ins[i];
    char s1[64], s2[64];
    size_t k = 0;
    switch (in->kind) {
    case TIDE_INS_COMPUTE:
        if (in->op >= 0 && in->op < v->g->n_ops) {
            const tide_op *op = &v->g->ops[in->op];
            k = (size_t)snprintf(b, n, "compute %s op %d '%s'%s", tide_op_name(op->kind), in->op,
                                 op->n_out ? vtname(v, op->out[0]) : "",
                                 in->place == TIDE_PLACE_HOST ? " on the host" : "");
        } else
            k = (size_t)snprintf(b, n, "compute op %d", in->op);
        break;
    case TIDE_INS_LOAD:
        vplace(s1, sizeof s1, in->src, in->tier_off);
        k = (size_t)snprintf(b, n, "load '%s' %s -> device offset %" PRIu64, vtname(v, in->tensor),
                             s1, in->dev_off[0]);
        break;
    case TIDE_INS_STORE:
        vplace(s2, sizeof s2, in->dst, in->tier_off);
        k = (size_t)snprintf(b, n, "store '%s' device offset %" PRIu64 " -> %s",
                             vtname(v, in->tensor), in->dev_off[0], s2);
        break;
    case TIDE_INS_MOVE:
        vplace(s1, sizeof s1, in->src, in->src_off);
        vplace(s2, sizeof s2, in->dst, in->tier_off);
        k = (size_t)snprintf(b, n, "move '%s' %s -> %s", vtname(v, in->tensor), s1, s2);
        break;
    case TIDE_INS_DROP:
        vplace(s1, sizeof s1, in->src, in->src == TIDE_TIER_DEVICE ? in->dev_off[0] : in->tier_off);
        k = (size_t)snprintf(b, n, "drop '%s' %s", vtname(v, in->tensor), s1);
        break;
    case TIDE_INS_ALL_REDUCE:
    case TIDE_INS_REDUCE_SCATTER:
    case TIDE_INS_ALL_GATHER:
        if (in->op >= 0 && in->op < v->g->n_ops)
            k = (size_t)snprintf(b, n, "%s '%s' -> '%s'", tide_ins_name(in->kind), vtname(v, v->g->ops[in->op].in[0]),
                                 vtname(v, v->g->ops[in->op].out[0]));
        else
            k = (size_t)snprintf(b, n, "%s op %d", tide_ins_name(in->kind), in->op);
        break;
    default:
        k = (size_t)snprintf(b, n, "kind %d", (int)in->kind);
    }
    if (k < n) k += (size_t)snprintf(b + k, n - k, ", stream %s", tide_stream_name(in->stream));
    if (k < n && v->p->n_iter > 1) snprintf(b + k, n - k, ", iter %d", in->iter);
}

/* "instruction 12 (load 'w' host home -> device offset 0, stream h2d)" */
vref vref_of(const vstate *v, int j) {
    vref r;
    char d[200];
    if (j < 0) {
        snprintf(r.s, sizeof r.s, "the initial state");
    } else {
        vdescribe(v, j, d, sizeof d);
        snprintf(r.s, sizeof r.s, "instruction %d (%s)", j, d);
    }
    return r;
}

/* Records the violation of instruction x (x < 0: of the plan's end) on the
 * plan's context; returns TIDE_E_VERIFY. */
tide_status vfail(vstate *v, int x, const char *fmt, ...) {
    char what[800];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (x < 0) return tide_err(v->ctx, TIDE_E_VERIFY, "at the end of the plan: %s", what);
    return tide_err(v->ctx, TIDE_E_VERIFY, "%s %s", vref_of(v, x).s, what);
}

tide_status vnomem(vstate *v) {
    return tide_err(v->ctx, TIDE_E_NOMEM, "out of memory verifying a plan of %d instructions",
                    v->p->n_ins);
}

/* ---------------------------------------------------------------- happens-before */


/* The first access in acc[] not ordered before x, or NONE. */
int vunordered(const vstate *v, const int acc[NS], int x) {
    for (int s = 0; s < NS; s++)
        if (acc[s] != NONE && v->vc[x][s] < acc[s]) return acc[s];
    return NONE;
}

/* ---------------------------------------------------------------- interval maps */

static int seg_new(vstate *v) {
    int s;
    if (v->free_seg != NONE) {
        s = v->free_seg;
        v->free_seg = v->seg[s].left;
    } else {
        if (tide_grow((void **)&v->seg, &v->cap_seg, v->n_seg + 1, sizeof *v->seg)) return NONE;
        s = v->n_seg++;
    }
    v->rng ^= v->rng << 13;
    v->rng ^= v->rng >> 7;
    v->rng ^= v->rng << 17;
    v->seg[s].left = v->seg[s].right = NONE;
    v->seg[s].prio = (uint32_t)(v->rng >> 32);
    return s;
}

static void seg_release(vstate *v, int s) {
    v->seg[s].left = v->free_seg;
    v->free_seg = s;
}

static void seg_release_tree(vstate *v, int t) {
    if (t == NONE) return;
    int l = v->seg[t].left, r = v->seg[t].right;
    seg_release_tree(v, l);
    seg_release_tree(v, r);
    seg_release(v, t);
}

/* Splits tree t into *l (segments starting below key) and *r (the rest). */
static void seg_split(vseg *sg, int t, uint64_t key, int *l, int *r) {
    if (t == NONE) {
        *l = *r = NONE;
    } else if (sg[t].lo < key) {
        *l = t;
        seg_split(sg, sg[t].right, key, &sg[t].right, r);
    } else {
        *r = t;
        seg_split(sg, sg[t].left, key, l, &sg[t].left);
    }
}

/* Joins a and b, every segment of a starting below every segment of b. */
static int seg_merge(vseg *sg, int a, int b) {
    if (a == NONE) return b;
    if (b == NONE) return a;
    if (sg[a].prio >= sg[b].prio) {
        sg[a].right = seg_merge(sg, sg[a].right, b);
        return a;
    }
    sg[b].left = seg_merge(sg, a, sg[b].left);
    return b;
}

static int seg_rightmost(const vseg *sg, int t) {
    while (sg[t].right != NONE) t = sg[t].right;
    return t;
}

/* V3: may writer x take [lo, hi) of tier from segment s's occupant? */
static tide_status seg_check(vstate *v, int s, int x, tide_tier tier, uint64_t lo, uint64_t hi) {
    const vseg *g = &v->seg[s];
    const char *area = tier == TIDE_TIER_DEVICE ? "device" : tier == TIDE_TIER_HOST ? "host spill" : "ssd spill";
    uint64_t a = TIDE_MAX(lo, g->lo), b = TIDE_MIN(hi, g->hi);
    if (g->o.copy != NONE) {
        const vcopy *c = &v->cp[g->o.copy];
        return vfail(v, x,
                    "writes %s bytes [%" PRIu64 ", %" PRIu64 ") while '%s' still lives at %s [%" PRIu64
                    ", %" PRIu64 ") (written by %s, not dropped): live ranges overlap",
                    area, lo, hi, vtname(v, c->tensor), area, c->off,
                    c->off + v->g->tensors[c->tensor].nbytes, vref_of(v, c->writer).s);
    }
    const char *who = g->o.tensor == NONE ? "op scratch" : vtname(v, g->o.tensor);
    if (!vhb(v, g->o.freed_by, x))
        return vfail(v, x,
                    "writes %s bytes [%" PRIu64 ", %" PRIu64 ") that held '%s' before %s, which frees "
                    "them, has completed: the two lives overlap (missing wait on the drop)",
                    area, a, b, who, vref_of(v, g->o.freed_by).s);
    int u = vunordered(v, g->o.acc, x);
    if (u != NONE) {
        bool w = u == g->o.writer;
        return vfail(v, x,
                    "writes %s bytes [%" PRIu64 ", %" PRIu64 ") that held '%s' while %s may still %s "
                    "them (missing wait: write-after-%s)",
                    area, a, b, who, vref_of(v, u).s, w ? "write" : "read", w ? "write" : "read");
    }
    return TIDE_OK;
}

static tide_status seg_check_tree(vstate *v, int t, int x, tide_tier tier, uint64_t lo, uint64_t hi) {
    if (t == NONE) return TIDE_OK;
    tide_status st = seg_check_tree(v, v->seg[t].left, x, tier, lo, hi);
    if (!st) st = seg_check(v, t, x, tier, lo, hi);
    if (!st) st = seg_check_tree(v, v->seg[t].right, x, tier, lo, hi);
    return st;
}

/* Instruction x starts writing [lo, hi) of tier's map for occupant o (a new
 * live copy, or op scratch freed by x itself). Checks V3 against every
 * segment it covers, then makes o their occupant. */
tide_status vseg_claim(vstate *v, int x, tide_tier tier, uint64_t lo, uint64_t hi, vocc o) {
    int nn = seg_new(v), tail = seg_new(v);
    if (nn == NONE || tail == NONE) return vnomem(v);
    vseg *sg = v->seg; /* no allocation below: the pointer stays valid */
    int l, m, r;
    bool tailed = false;
    tide_status st;
    seg_split(sg, v->root[tier], lo, &l, &r);
    seg_split(sg, r, hi, &m, &r);
    if (l != NONE) { /* the segment starting before lo may reach into it */
        int last = seg_rightmost(sg, l);
        if (sg[last].hi > lo) {
            if ((st = seg_check(v, last, x, tier, lo, hi))) return st;
            if (sg[last].hi > hi) {
                sg[tail].lo = hi, sg[tail].hi = sg[last].hi, sg[tail].o = sg[last].o;
                tailed = true;
            }
            sg[last].hi = lo;
        }
    }
    if (m != NONE) { /* every segment starting in [lo, hi) */
        if ((st = seg_check_tree(v, m, x, tier, lo, hi))) return st;
        int last = seg_rightmost(sg, m);
        if (sg[last].hi > hi) {
            sg[tail].lo = hi, sg[tail].hi = sg[last].hi, sg[tail].o = sg[last].o;
            tailed = true;
        }
        seg_release_tree(v, m);
    }
    sg[nn].lo = lo, sg[nn].hi = hi, sg[nn].o = o;
    if (tailed) r = seg_merge(sg, tail, r);
    else seg_release(v, tail);
    v->root[tier] = seg_merge(sg, seg_merge(sg, l, nn), r);
    return TIDE_OK;
}

/* ---------------------------------------------------------------- copies */

int vcopy_find(const vstate *v, int t, tide_tier tier, uint64_t off) {
    for (int c = v->head[t]; c != NONE; c = v->cp[c].next)
        if (v->cp[c].tier == tier && v->cp[c].off == off) return c;
    return NONE;
}

/* Instruction x reads copy c (found live, current version checked). */
tide_status vcopy_read(vstate *v, int x, int c) {
    vcopy *cp = &v->cp[c];
    if (cp->writer != NONE && !vhb(v, cp->writer, x)) {
        char pl[64];
        vplace(pl, sizeof pl, cp->tier, cp->off);
        return vfail(v, x, "reads '%s' from %s, written by %s, without waiting on it (missing wait: "
                    "read-after-write)", vtname(v, cp->tensor), pl, vref_of(v, cp->writer).s);
    }
    cp->acc[v->p->ins[x].stream] = x;
    return TIDE_OK;
}

/* Instruction x rewrites existing copy c with version ver. */
tide_status vcopy_write(vstate *v, int x, int c, uint32_t ver) {
    vcopy *cp = &v->cp[c];
    int u = vunordered(v, cp->acc, x);
    if (u != NONE) {
        char pl[64];
        bool w = u == cp->writer;
        vplace(pl, sizeof pl, cp->tier, cp->off);
        return vfail(v, x, "overwrites '%s' at %s while %s may still %s it (missing wait: "
                    "write-after-%s)", vtname(v, cp->tensor), pl, vref_of(v, u).s,
                    w ? "write" : "read", w ? "write" : "read");
    }
    int t = cp->tensor;
    bool was = cp->valid && cp->ver == v->cur[t];
    cp->valid = true;
    cp->ver = ver;
    cp->writer = x;
    for (int s = 0; s < NS; s++) cp->acc[s] = NONE;
    cp->acc[v->p->ins[x].stream] = x;
    v->n_cur[t] += (int)(ver == v->cur[t]) - (int)was;
    return TIDE_OK;
}

/* Instruction x creates a copy of t at (tier, off) holding ver: claims its
 * bytes, then links it to t's live copies. */
tide_status vcopy_new(vstate *v, int x, int t, tide_tier tier, uint64_t off, uint32_t ver) {
    int c;
    if (v->free_cp != NONE) {
        c = v->free_cp;
        v->free_cp = v->cp[c].next;
    } else {
        if (tide_grow((void **)&v->cp, &v->cap_cp, v->n_cp + 1, sizeof *v->cp)) return vnomem(v);
        c = v->n_cp++;
    }
    vcopy *cp = &v->cp[c];
    cp->tensor = t, cp->tier = tier, cp->valid = true, cp->off = off, cp->ver = ver, cp->writer = x;
    for (int s = 0; s < NS; s++) cp->acc[s] = NONE;
    if (x != NONE) cp->acc[v->p->ins[x].stream] = x;
    cp->next = v->head[t];
    v->head[t] = c;
    vocc o = {.copy = c, .tensor = t, .freed_by = NONE, .writer = NONE};
    tide_status st = vseg_claim(v, x, tier, off, off + v->g->tensors[t].nbytes, o);
    if (st) return st;
    if (ver == v->cur[t]) v->n_cur[t]++;
    return TIDE_OK;
}

/* DROP x ends live copy c: its bytes become FREED by x in the interval map. */
tide_status vcopy_drop(vstate *v, int x, int c) {
    vcopy *cp = &v->cp[c];
    int t = cp->tensor;
    int s = v->root[cp->tier];
    while (s != NONE && v->seg[s].lo != cp->off) s = cp->off < v->seg[s].lo ? v->seg[s].left : v->seg[s].right;
    if (s == NONE || v->seg[s].o.copy != c)
        return vfail(v, x, "finds the verifier's map of '%s' inconsistent (internal error)", vtname(v, t));
    vocc *o = &v->seg[s].o;
    o->copy = NONE;
    o->freed_by = x;
    o->writer = cp->writer;
    memcpy(o->acc, cp->acc, sizeof o->acc);
    int *pp = &v->head[t];
    while (*pp != c) pp = &v->cp[*pp].next;
    *pp = cp->next;
    if (cp->ver == v->cur[t] && --v->n_cur[t] == 0) v->lost[t] = x;
    cp->next = v->free_cp;
    v->free_cp = c;
    return TIDE_OK;
}

