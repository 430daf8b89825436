/*
 * planner_arena.h - the planner's range allocator (docs/design.md section 4.3): one
 * instance lays out the device arena, others the host and SSD spill areas.
 *
 * The range [base, base + size) is cut into blocks kept in address order
 * (a doubly-linked list); every byte is in exactly one block. A block is free,
 * owned by a tensor, a step's scratch, or reserved by a policy. Free blocks are
 * also kept in a treap ordered by (size, offset), so best fit is O(log n);
 * adjacent free blocks are always merged.
 *
 * Release tracking: a free block remembers what a new occupant must wait for
 * before writing it: per stream the last instruction that released (part of)
 * it, and rel_step, the last compute step after which a virtually freed
 * tensor's DROP is emitted (the planner frees dying tensors ahead of the
 * execution horizon). Merging keeps the per-stream maximum, which is
 * conservative: an occupant may wait on the release of a neighbour's bytes.
 * Same-stream order is FIFO, so the last instruction per stream is enough.
 *
 * A block whose rel_step is beyond `resolved` (the last step computed) is
 * pending: only a later COMPUTE may use it. Pending and resolved free blocks
 * are not merged on release, so pendency never spreads to bytes that are
 * already usable by a LOAD; tide_arena_coalesce merges them once resolved.
 * Adjacent free blocks may therefore exist.
 */
#ifndef TIDE_PLANNER_ARENA_H
#define TIDE_PLANNER_ARENA_H

#include "ir/plan.h"

enum { TIDE_BLK_FREE = -1, TIDE_BLK_SCRATCH = -2, TIDE_BLK_RESERVED = -3, TIDE_BLK_RECYCLED = -4 };

typedef struct tide_blk {
    uint64_t off, size;
    int owner;                     /* tensor index >= 0, or TIDE_BLK_* */
    int aux;                       /* scratch: its step */
    int rel[TIDE_STREAM_COUNT];    /* release instruction per stream, -1: none */
    int rel_step;                  /* compute step whose post-compute drops free it, -1 */
    double wcost;                  /* window search scratch */
    struct tide_blk *prev, *next;  /* address order */
    struct tide_blk *tl, *tr;      /* treap children (free blocks only) */
    uint32_t prio;
} tide_blk;

typedef struct tide_arena {
    uint64_t base, size;
    uint64_t align;                /* offsets and sizes are multiples of it */
    tide_blk *head;                /* lowest address */
    tide_blk *root;                /* free blocks by (size, off) */
    tide_blk *pool;                /* recycled nodes (linked through next) */
    tide_blk **chunks;
    int n_chunks, cap_chunks;
    uint32_t rng;
    uint64_t high;                 /* highest end offset ever allocated */
    int resolved;                  /* steps <= resolved are computed (see above) */
    int n_blocks, n_free;
} tide_arena;

/* Makes an arena of one free block [base, base+size). Returns 0 or -1 (no
 * memory). */
int tide_arena_init(tide_arena *a, uint64_t base, uint64_t size, uint64_t align);
void tide_arena_free(tide_arena *a);

/* Acceptance of a free block for an allocation: 0 reject, 1 acceptable, 2
 * preferred. */
typedef int (*tide_arena_accept_fn)(const tide_blk *b, void *user);
/* Best fit: the smallest free block of at least size bytes that accept (NULL:
 * any) rates 2; scanning at most max_scan candidates in size order, else the
 * first rated 1 (looking at 8 * max_scan at most for one). NULL if none. */
tide_blk *tide_arena_best_fit(tide_arena *a, uint64_t size, tide_arena_accept_fn accept, void *user,
                              int max_scan);
/* Carves [off, off+size) out of free block f (which must contain it) and
 * gives it to owner; the new block inherits f's release record (what its
 * first writer must wait for). Returns the block, or NULL (no memory). */
tide_blk *tide_arena_take(tide_arena *a, tide_blk *f, uint64_t off, uint64_t size, int owner);
/* Frees block b. Its release record becomes rel (per stream, -1 none) and
 * rel_step; it is merged with free neighbours. Returns the merged free block. */
tide_blk *tide_arena_release(tide_arena *a, tide_blk *b, const int rel[TIDE_STREAM_COUNT], int rel_step);
/* Merges every run of adjacent free blocks of one class (pending or not).
 * O(blocks). */
void tide_arena_coalesce(tide_arena *a);
/* Merges free block b with its free neighbours of its class (once b's
 * release has been resolved). Returns the merged block. O(log n). */
tide_blk *tide_arena_coalesce_at(tide_arena *a, tide_blk *b);
/* Merges the adjacent free blocks first..last (any class) into one; returns
 * it. */
tide_blk *tide_arena_merge_run(tide_arena *a, tide_blk *first, tide_blk *last);

/* Cost of a block as part of an eviction window: < 0 blocked, else >= 0. */
typedef double (*tide_arena_cost_fn)(tide_blk *b, void *user);
/* Finds the contiguous run of blocks covering at least size bytes with the
 * least total cost (no blocked block in it). Returns 0 with *first and *last set,
 * or -1 when no run qualifies. O(blocks). */
int tide_arena_window(tide_arena *a, uint64_t size, tide_arena_cost_fn cost, void *user,
                      tide_blk **first, tide_blk **last);

/* Whole-structure consistency (debug asserts): returns true when sound. */
bool tide_arena_check(const tide_arena *a);

/* ---------------------------------------------------------------- release map
 *
 * The exact release record of every byte range of an area, kept beside the
 * arena: disjoint segments (a treap keyed by start) mapping bytes to the
 * instruction that last released them (a DROP, or the COMPUTE whose scratch
 * they were) and the compute step of a release made ahead of execution. A new
 * occupant of [lo, hi) waits for exactly what those bytes need, whatever the
 * arena merged around them. Bytes never released are absent (free from the
 * start). */
typedef struct tide_relseg {
    uint64_t lo, hi;
    int ins;                       /* releasing instruction, -1 */
    int step;                      /* release ahead of execution: its step, -1 */
    int left, right;
    uint32_t prio;
} tide_relseg;

typedef struct tide_relmap {
    tide_relseg *seg;
    int n, cap, free_seg, root;
    uint32_t rng;
} tide_relmap;

void tide_relmap_init(tide_relmap *m);
void tide_relmap_free(tide_relmap *m);
/* Records that [lo, hi) was released by ins (or ahead of execution at step).
 * Returns 0 or -1 (no memory). */
int tide_relmap_set(tide_relmap *m, uint64_t lo, uint64_t hi, int ins, int step);
/* Calls fn for the release of every segment overlapping [lo, hi). */
void tide_relmap_query(tide_relmap *m, uint64_t lo, uint64_t hi, void (*fn)(void *user, int ins, int step),
                       void *user);

#endif
