/*
 * planner_net.c - collectives onto the network stream (plan.h: ALL_REDUCE,
 * REDUCE_SCATTER, ALL_GATHER). The engine plans a data-parallel rank's graph
 * like any other, its collective ops as device computes in graph order on
 * the compute stream (priced by the network, cost.c); this pass then moves
 * each onto the network stream, so that it overlaps the computes after it
 * (a gradient's reduce-scatter runs while the backward goes on), and puts
 * back by waits every ordering the compute stream's FIFO gave it:
 *
 *   before: the collective keeps its waits and waits on the compute-stream
 *           instruction before it (every earlier compute: their FIFO order);
 *   after:  on each stream, the first later instruction that touches the
 *           collective's device bytes in a conflicting way waits on it: one
 *           that reads bytes it writes (a reader of the shard or of the
 *           gathered parameter), or writes bytes it reads or writes (the next
 *           occupant of the gradient's range, a reload over it). Later
 *           instructions of that stream follow by FIFO. A range is no longer
 *           followed once a later write covers it whole: what comes after is
 *           the new occupant's, ordered after that write. DROPs do not
 *           count: a DROP needs no wait for the copy's accesses, the reuser
 *           carries them (plan.h).
 *
 * Nothing else changes (offsets, memory, the order of the list), so the
 * plan's memory is the engine's and the verifier checks the orderings as for
 * any compute on another stream.
 */
#include "planner/planner_int.h"

#include <string.h>

typedef struct rng {
    uint64_t lo, hi;
    bool write;   /* the collective writes it (its output) */
    bool covered; /* a later write covered it whole: no longer followed */
} rng;

/* Device accesses of instruction in of p: up to TIDE_INS_MAX_OFF + 1 ranges,
 * write flags in w. Returns how many. */
static int accesses(const tide_plan *p, const tide_ins *in, uint64_t *lo, uint64_t *hi, bool *w) {
    const tide_graph *g = p->g;
    int n = 0;
    if (tide_ins_runs_op(in->kind)) {
        if (in->place != TIDE_PLACE_DEVICE) return 0;
        const tide_op *op = &g->ops[in->op];
        for (int k = 0; k < op->n_in + op->n_out; k++) {
            if (tide_ins_host_opnd(in, k)) continue;
            int t = k < op->n_in ? op->in[k] : op->out[k - op->n_in];
            lo[n] = in->dev_off[k];
            hi[n] = in->dev_off[k] + g->tensors[t].nbytes;
            w[n++] = k >= op->n_in;
        }
        if (op->scratch_bytes) {
            lo[n] = in->scratch_off;
            hi[n] = in->scratch_off + op->scratch_bytes;
            w[n++] = true;
        }
    } else if (in->kind == TIDE_INS_LOAD || in->kind == TIDE_INS_STORE) {
        lo[n] = in->dev_off[0];
        hi[n] = in->dev_off[0] + g->tensors[in->tensor].nbytes;
        w[n++] = in->kind == TIDE_INS_LOAD;
    }
    return n;
}

static tide_ins_kind ins_kind_of(tide_op_kind k) {
    return k == TIDE_OP_ALL_REDUCE ? TIDE_INS_ALL_REDUCE
         : k == TIDE_OP_REDUCE_SCATTER ? TIDE_INS_REDUCE_SCATTER : TIDE_INS_ALL_GATHER;
}

tide_status planner_collectives_to_net(tide_ctx *ctx, tide_plan *p) {
    const tide_graph *g = p->g;
    int ranks = 1, n_coll = 0;
    for (int i = 0; i < g->n_ops; i++)
        if (tide_op_is_collective(g->ops[i].kind)) {
            n_coll++;
            if (g->ops[i].p.ranks > ranks) ranks = g->ops[i].p.ranks;
        }
    p->ranks = ranks;
    if (!n_coll) return TIDE_OK;
    /* extra[i]: collectives instruction i must also wait on (a list per
     * instruction, built before the waits are rewritten) */
    int *head = tide_malloc((size_t)p->n_ins * sizeof *head);
    int *nxt = NULL, *val = NULL, n_extra = 0, cap = 0;
    if (!head) return tide_err(ctx, TIDE_E_NOMEM, "out of memory placing collectives");
    for (int i = 0; i < p->n_ins; i++) head[i] = -1;
    tide_status st = TIDE_OK;
    int last_compute = -1;
#define ADD_WAIT(at, on)                                                                                          \
    do {                                                                                                          \
        if (n_extra >= cap) {                                                                                     \
            int nc = cap ? 2 * cap : 256;                                                                         \
            int *a = tide_realloc(nxt, (size_t)nc * sizeof *a), *b = a ? tide_realloc(val, (size_t)nc * sizeof *b) : NULL; \
            if (a) nxt = a;                                                                                       \
            if (!a || !b) { st = tide_err(ctx, TIDE_E_NOMEM, "out of memory placing collectives"); break; }     \
            val = b;                                                                                              \
            cap = nc;                                                                                             \
        }                                                                                                         \
        val[n_extra] = (on);                                                                                      \
        nxt[n_extra] = head[at];                                                                                  \
        head[at] = n_extra++;                                                                                     \
    } while (0)
    for (int i = 0; i < p->n_ins && !st; i++) {
        tide_ins *in = &p->ins[i];
        bool coll = in->kind == TIDE_INS_COMPUTE && in->place == TIDE_PLACE_DEVICE &&
                    tide_op_is_collective(g->ops[in->op].kind);
        if (!coll) {
            if (in->stream == TIDE_STREAM_COMPUTE) last_compute = i;
            continue;
        }
        if (in->host_opnd) {
            st = tide_err(ctx, TIDE_E_UNSUPPORTED, "plan: collective op %d (%s) has a host operand: collectives "
                          "run on device copies (a host-addressable backend is not planned with ranks)", in->op,
                          tide_op_name(g->ops[in->op].kind));
            break;
        }
        in->kind = ins_kind_of(g->ops[in->op].kind);
        in->stream = TIDE_STREAM_NET;
        if (last_compute >= 0) ADD_WAIT(i, last_compute);
        uint64_t lo[TIDE_INS_MAX_OFF + 1], hi[TIDE_INS_MAX_OFF + 1];
        bool w[TIDE_INS_MAX_OFF + 1];
        rng r[TIDE_INS_MAX_OFF + 1];
        int nr = accesses(p, in, lo, hi, w), live = nr;
        for (int k = 0; k < nr; k++) r[k] = (rng){lo[k], hi[k], w[k], false};
        bool found[TIDE_STREAM_COUNT] = {false};
        found[TIDE_STREAM_NET] = true; /* FIFO behind it */
        for (int j = i + 1; j < p->n_ins && live > 0 && !st; j++) {
            const tide_ins *x = &p->ins[j];
            uint64_t xl[TIDE_INS_MAX_OFF + 1], xh[TIDE_INS_MAX_OFF + 1];
            bool xw[TIDE_INS_MAX_OFF + 1];
            int nx = accesses(p, x, xl, xh, xw);
            bool conflict = false;
            for (int a = 0; a < nx; a++)
                for (int k = 0; k < nr; k++) {
                    if (r[k].covered || xl[a] >= r[k].hi || r[k].lo >= xh[a] || xl[a] == xh[a]) continue;
                    if (xw[a] || r[k].write) conflict = true;
                    if (xw[a] && xl[a] <= r[k].lo && xh[a] >= r[k].hi) r[k].covered = true, live--;
                }
            /* a later collective is not moved yet: it will be on the net stream */
            tide_stream xs = x->kind == TIDE_INS_COMPUTE && x->place == TIDE_PLACE_DEVICE &&
                             tide_op_is_collective(g->ops[x->op].kind) ? TIDE_STREAM_NET : x->stream;
            if (conflict && !found[xs]) {
                found[xs] = true;
                ADD_WAIT(j, i);
            }
        }
    }
#undef ADD_WAIT
    if (!st && n_extra) { /* rebuild the waits with the extra ones */
        int cap_w = p->n_waits + n_extra, n = 0;
        int *waits = tide_malloc((size_t)cap_w * sizeof *waits);
        if (!waits) {
            st = tide_err(ctx, TIDE_E_NOMEM, "out of memory placing collectives");
        } else {
            for (int i = 0; i < p->n_ins; i++) {
                tide_ins *in = &p->ins[i];
                int at = n;
                for (int k = 0; k < in->n_wait; k++) waits[n++] = p->waits[in->wait_at + k];
                for (int e = head[i]; e >= 0; e = nxt[e]) {
                    bool dup = false;
                    for (int k = at; k < n && !dup; k++) dup = waits[k] == val[e];
                    if (!dup) waits[n++] = val[e];
                }
                in->wait_at = at;
                in->n_wait = n - at;
            }
            tide_free(p->waits);
            p->waits = waits;
            p->n_waits = n;
            p->cap_waits = cap_w;
        }
    }
    tide_free(head);
    tide_free(nxt);
    tide_free(val);
    return st;
}
