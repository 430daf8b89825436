/*
 * verify_int.h - the verifier's internal layout, shared by its two files:
 * verify.c (the replay: structure, ops, data, ends) and verify_books.c (its
 * books: messages, happens-before, the interval maps of space, copies). The
 * design note is at the top of verify.c. Built with the verifier alone,
 * against ir/ and graph/: nothing of the planner.
 */
#ifndef TIDE_VERIFY_INT_H
#define TIDE_VERIFY_INT_H

#include "verify/verify.h"

#include <inttypes.h>

#define NS TIDE_STREAM_COUNT
#define NONE (-1)

/* Who holds (or last held) a byte range. */
typedef struct vocc {
    int copy;     /* live holder (index into cp), NONE when freed */
    int tensor;   /* tensor of the holder, NONE for op scratch */
    int freed_by; /* when freed: the DROP (or the COMPUTE using scratch) */
    int writer;   /* when freed: last writer of the bytes */
    int acc[NS];  /* when freed: last access per stream since that writer */
} vocc;

typedef struct vseg {
    uint64_t lo, hi; /* [lo, hi) */
    vocc o;
    int left, right; /* treap children; left links the free list */
    uint32_t prio;
} vseg;

typedef struct vcopy {
    int tensor;
    int next;        /* next live copy of the tensor; next free record */
    tide_tier tier;
    bool valid;      /* holds data (a home of an OUTPUT starts invalid) */
    uint64_t off;    /* device or spill offset; TIDE_HOME for a home */
    uint32_t ver;    /* version of the tensor it holds */
    int writer;      /* instruction that wrote it, NONE: before the plan */
    int acc[NS];     /* last access per stream since (and including) writer */
} vcopy;

typedef struct vstate {
    const tide_plan *p;
    const tide_graph *g;
    tide_ctx *ctx;
    int32_t (*vc)[NS];      /* per instruction vector clock */
    int last[NS];           /* last instruction seen per stream */
    vseg *seg;
    int n_seg, cap_seg, free_seg;
    int root[TIDE_TIER_COUNT]; /* interval map per tier (spill areas for host, ssd) */
    uint64_t rng;
    vcopy *cp;              /* cp[t] for t < n_tensors is t's home */
    int n_cp, cap_cp, free_cp;
    int *head;              /* per tensor: first live non-home copy */
    uint32_t *cur;          /* per tensor: current version = writes so far */
    int *n_cur;             /* per tensor: live copies holding the current version */
    int *lost;              /* per tensor: DROP that removed the last current copy */
    int *wrote;             /* per tensor: COMPUTE that wrote the current version */
    int exp_op, exp_iter;   /* next first COMPUTE expected (V2) */
    int *first_iter;        /* per op: iteration of its last first COMPUTE, -1 */
    uint32_t *op_ver;       /* per op: versions its first COMPUTE read (TIDE_OP_MAX_IN)
                               then wrote (TIDE_OP_MAX_OUT), for recomputations */
} vstate;

#define OPV (TIDE_OP_MAX_IN + TIDE_OP_MAX_OUT)

/* "instruction 12 (load 'w' host home -> device offset 0, stream h2d)" */
typedef struct vref { char s[256]; } vref;

/* ---------------------------------------------------------------- books (verify_books.c) */

const char *vtname(const vstate *v, int t);
/* "device offset 4096", "host home", "ssd spill offset 0" */
void vplace(char *b, size_t n, tide_tier tier, uint64_t off);
vref vref_of(const vstate *v, int j);
/* Records the violation of instruction x (x < 0: of the plan's end) on the
 * plan's context; returns TIDE_E_VERIFY. */
tide_status vfail(vstate *v, int x, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
tide_status vnomem(vstate *v);

/* a -> b: a completes before b starts (a == b counts: an op may read and
 * rewrite its own bytes). Needs vc[b] computed. */
static inline bool vhb(const vstate *v, int a, int b) {
    return v->vc[b][v->p->ins[a].stream] >= a;
}

/* The first access in acc[] not ordered before x, or NONE. */
int vunordered(const vstate *v, const int acc[NS], int x);

/* Instruction x starts writing [lo, hi) of tier's map for occupant o (a new
 * live copy, or op scratch freed by x itself). Checks V3 against every
 * segment it covers, then makes o their occupant. */
tide_status vseg_claim(vstate *v, int x, tide_tier tier, uint64_t lo, uint64_t hi, vocc o);

/* t's live copy at (tier, off), or NONE. */
int vcopy_find(const vstate *v, int t, tide_tier tier, uint64_t off);
/* Instruction x reads copy c (found live, current version checked). */
tide_status vcopy_read(vstate *v, int x, int c);
/* Instruction x rewrites existing copy c with version ver. */
tide_status vcopy_write(vstate *v, int x, int c, uint32_t ver);
/* Instruction x (NONE: the initial state) creates a copy of t at (tier, off)
 * holding ver: claims its bytes, then links it to t's live copies. */
tide_status vcopy_new(vstate *v, int x, int t, tide_tier tier, uint64_t off, uint32_t ver);
/* DROP x ends live copy c: its bytes become FREED by x in the interval map. */
tide_status vcopy_drop(vstate *v, int x, int c);

#endif
