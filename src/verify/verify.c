/*
 * verify.c - the plan verifier: an independent replay of a plan's instruction
 * list proving that the plan is safe under EVERY interleaving its streams and
 * waits allow, not only the one the planner simulated (docs/design.md sections 5, 8).
 * It reads the plan and the graph and nothing of the planner, so a planner bug
 * cannot hide behind shared code (it is built as a library of its own, against
 * ir/ and graph/ alone). The first violation in list order is reported:
 * instruction index, kind, stream, tensor, and what is wrong. This file is the
 * replay; verify_books.c keeps its books (messages, happens-before, the
 * interval maps, the copies).
 *
 * What it proves:
 *   V1 Structure. Kinds, streams, tiers, iterations, op and tensor indices are
 *      valid: a COMPUTE placed on the device is on the compute stream, one
 *      placed on the host on the host stream; a LOAD (host|ssd -> device)
 *      on h2d or io; a STORE (device -> host|ssd) on d2h or io; a MOVE
 *      (host <-> ssd) on io; a DROP on any stream and never of a home. Every
 *      wait names an EARLIER instruction. Every device range (tensor copies
 *      and op scratch) lies inside device_budget; a collective (ALL_REDUCE,
 *      REDUCE_SCATTER, ALL_GATHER) runs its own kind of collective op over
 *      the plan's ranks on the net stream, on device copies, and is then
 *      replayed as a compute of its op (V2-V4: a read of its output before
 *      it completes is a RAW violation, a write to bytes it reads a WAR one), every spill range inside the
 *      plan's spill area of its tier. Homes match roles. A COMPUTE's host
 *      operands are allowed when it runs on the host (then all are) or the
 *      plan is host_addressable. Warm tensors are weights or state, their
 *      ranges inside the budget and apart. The warm region [0, warm_region)
 *      lies inside the budget, and no device range but a warm tensor's at
 *      its warm offset overlaps it: neither a copy elsewhere nor op scratch.
 *   V2 Ops. The first COMPUTE of each op in an iteration comes in graph order:
 *      ops 0..n-1 of iteration 0, then of iteration 1, ...: every op at least
 *      once per iteration. A later COMPUTE of an op already computed in its
 *      iteration is a recomputation: each input must hold the very version
 *      the first compute read, and each output's version that compute wrote
 *      must still be current, so the recomputation writes the same versions
 *      from the same inputs (an op that updates a tensor in place can never
 *      be recomputed: its input has moved on). Other instructions' iteration
 *      tags are only range-checked: a prefetch for iteration i+1 legitimately
 *      precedes the last ops of iteration i.
 *   V3 Space (invariant 1). A copy's bytes are live from the start of its
 *      first writer to the completion of its DROP; transfers in flight are
 *      live. A writer that claims bytes finds no live copy there, and it
 *      happens after the DROP that freed them and after every access of their
 *      previous occupant. Likewise for the host and ssd spill areas; an op's
 *      scratch is live during its op only. (A DROP itself need not wait for
 *      the copy's readers: nothing happens to bytes until they are reused, so
 *      the reuser carries both orderings.)
 *   V4 Data. Each COMPUTE that writes a tensor makes a new version of it; each
 *      copy records the version it holds. COMPUTE inputs and LOAD, STORE and
 *      MOVE sources must be live copies holding the CURRENT version (no stale
 *      read), and their writer must happen before the reader (RAW). A write to
 *      an existing copy happens after every earlier access of it (WAR, WAW).
 *   V5 Ends. At the start WEIGHT, STATE and INPUT tensors are valid (version
 *      0) at home, OUTPUT and TEMP tensors nowhere; a warm tensor is valid
 *      (version 0) at its warm offset on the device, and a warm STATE's home
 *      holds nothing usable. At the end every WEIGHT, STATE and OUTPUT home
 *      holds the latest version, except a warm tensor's, whose latest version
 *      is at its warm offset instead (a warm copy is never dropped); only
 *      resident and warm tensors still have device copies.
 *
 * Happens-before. a -> b means "a completes before b starts". Streams are FIFO
 * and an instruction starts after its waits complete, so -> is the transitive
 * closure of program order per stream plus wait edges. V1 makes every edge go
 * from a lower to a higher index, so list order is a topological order: the
 * plan cannot deadlock, and an executor issuing in list order never waits on
 * an event not yet recorded (a CUDA wait on such an event would be silently
 * ignored). One forward pass then gives each instruction b a vector clock,
 * vc[b][s] = the highest index on stream s with that instruction -> b (b
 * itself on its own stream). Since a stream is FIFO, knowing a later
 * instruction of a's stream implies knowing a, so
 *     a -> b  iff  vc[b][stream(a)] >= a          (O(1); vhb() below).
 * Hazards on one copy need only the last access per stream: the earlier ones
 * on that stream precede it.
 *
 * Copies. A copy is (tensor, tier, offset) or a tensor's home. States and the
 * function making each transition:
 *
 *     (none) --LOAD / STORE / MOVE / COMPUTE output (copy_new)--> LIVE(v, w)
 *     LIVE --COMPUTE input, LOAD/STORE/MOVE source (copy_read)--> LIVE
 *     LIVE --in-place COMPUTE, reload, re-store (copy_write)--> LIVE(v', w')
 *     LIVE --DROP (copy_drop)--> FREED bytes in the interval map
 *     FREED --claimed by a writer (seg_claim)--> LIVE of the new occupant
 *
 * LIVE(v, w) holds version v written by instruction w and the last access per
 * stream since w. Homes are LIVE from the start (or invalid until stored, for
 * OUTPUT) and never dropped. A copy is stale when v is older than the
 * tensor's current version. Versions are numbered in list order, which is not
 * by itself the order things run in: COMPUTEs run on two streams (compute and
 * host), and nothing but waits orders them. Soundness rests on the per-copy
 * checks instead: a reader must find the current version in a live copy whose
 * writer is ordered before it (RAW), and a writer must be ordered after every
 * earlier access of the copy it writes (WAR, WAW). So each version a copy
 * holds is what its producing chain actually wrote there, each link ordered,
 * whatever interleaving of the streams the waits allow.
 *
 * Space. The device arena and the two spill areas are each an interval map (a
 * treap of disjoint segments keyed by start offset) from bytes to their latest
 * occupant: a live copy, or a freed one with the DROP that freed it and its
 * accesses. Only the latest occupant of a byte matters: a claim is ordered
 * after the previous occupant's drop and accesses, which were ordered after
 * theirs. A claim costs O(log n + segments it covers), so the whole replay is
 * about O(n log n) over instructions.
 */
#include "verify/verify_int.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- V1: structure */

static bool vin_area(uint64_t off, uint64_t n, uint64_t size) { return off <= size && n <= size - off; }

static tide_status check_dev(vstate *v, int x, const char *what, int t, uint64_t off, uint64_t n) {
    const tide_plan *p = v->p;
    const char *q = t == NONE ? "" : "'", *nm = t == NONE ? "op scratch" : vtname(v, t);
    if (!vin_area(off, n, p->device_budget))
        return vfail(v, x, "%s %s%s%s at device [%" PRIu64 ", %" PRIu64 "), past the device budget of "
                    "%" PRIu64 " bytes (budget overflow)", what, q, nm, q, off, off + n, p->device_budget);
    bool at_warm = t != NONE && p->warm_off && p->warm_off[t] == off;
    if (n && off < p->warm_region && !at_warm)
        return vfail(v, x, "%s %s%s%s at device [%" PRIu64 ", %" PRIu64 "), inside the warm region [0, "
                    "%" PRIu64 "), which holds warm tensors at their offsets alone", what, q, nm, q, off, off + n,
                    p->warm_region);
    return TIDE_OK;
}

static tide_status check_spill(vstate *v, int x, int t, tide_tier tier, uint64_t off) {
    uint64_t size = tier == TIDE_TIER_HOST ? v->p->host_spill_bytes : v->p->ssd_spill_bytes;
    uint64_t n = v->g->tensors[t].nbytes;
    if (off == TIDE_HOME || vin_area(off, n, size)) return TIDE_OK;
    return vfail(v, x, "places '%s' at %s spill [%" PRIu64 ", %" PRIu64 "), past the plan's %s spill "
                "area of %" PRIu64 " bytes", vtname(v, t), tide_tier_name(tier), off, off + n,
                tide_tier_name(tier), size);
}

static bool off_tier(tide_tier t) { return t == TIDE_TIER_HOST || t == TIDE_TIER_SSD; }

static tide_status check_fields(vstate *v, int x) {
    const tide_plan *p = v->p;
    const tide_ins *in = &p->ins[x];
    tide_status st;
    if ((unsigned)in->kind >= TIDE_INS_COUNT) return vfail(v, x, "has an unknown kind %d", (int)in->kind);
    if ((unsigned)in->stream >= NS) return vfail(v, x, "is on an unknown stream %d", (int)in->stream);
    if (in->iter < 0 || in->iter >= p->n_iter)
        return vfail(v, x, "names iteration %d of a plan of %d", in->iter, p->n_iter);
    if (in->n_wait < 0 || in->wait_at < 0 || in->wait_at > p->n_waits - in->n_wait)
        return vfail(v, x, "has waits [%d, +%d) outside the plan's %d waits", in->wait_at, in->n_wait, p->n_waits);
    for (int k = 0; k < in->n_wait; k++) {
        int w = p->waits[in->wait_at + k];
        if (w < 0 || w >= p->n_ins) return vfail(v, x, "waits on %d, which is not an instruction", w);
        if (w >= x)
            return vfail(v, x, "waits on instruction %d, which is not earlier: a wait must name an "
                        "earlier instruction (a wait on a later one can deadlock, or be ignored by "
                        "an executor issuing in list order)", w);
    }
    if (tide_ins_is_collective(in->kind)) {
        if (in->stream != TIDE_STREAM_NET)
            return vfail(v, x, "runs a collective on the %s stream; collectives run on the net stream",
                        tide_stream_name(in->stream));
        if (in->op < 0 || in->op >= v->g->n_ops) return vfail(v, x, "names op %d of a graph of %d", in->op, v->g->n_ops);
        if (in->tensor != NONE) return vfail(v, x, "names tensor %d; a collective's tensor must be -1", in->tensor);
        const tide_op *op = &v->g->ops[in->op];
        bool match = (in->kind == TIDE_INS_ALL_REDUCE && op->kind == TIDE_OP_ALL_REDUCE) ||
                     (in->kind == TIDE_INS_REDUCE_SCATTER && op->kind == TIDE_OP_REDUCE_SCATTER) ||
                     (in->kind == TIDE_INS_ALL_GATHER && op->kind == TIDE_OP_ALL_GATHER);
        if (!match) return vfail(v, x, "runs op %d (%s) as a collective of another kind", in->op, tide_op_name(op->kind));
        if (op->p.ranks != v->p->ranks)
            return vfail(v, x, "runs a collective over %d ranks in a plan of %d", op->p.ranks, v->p->ranks);
        if (in->place != TIDE_PLACE_DEVICE || in->host_opnd)
            return vfail(v, x, "runs a collective on host copies; collectives read and write device copies");
        for (int k = 0; k < 2; k++) {
            int t = k ? op->out[0] : op->in[0];
            if ((st = check_dev(v, x, k ? "writes" : "reads", t, in->dev_off[k], v->g->tensors[t].nbytes))) return st;
        }
        return TIDE_OK;
    }
    if (in->kind == TIDE_INS_COMPUTE) {
        bool host = in->place == TIDE_PLACE_HOST;
        if (in->op >= 0 && in->op < v->g->n_ops && tide_op_is_collective(v->g->ops[in->op].kind))
            return vfail(v, x, "computes collective op %d (%s) as a COMPUTE; it runs as a collective on the net "
                        "stream", in->op, tide_op_name(v->g->ops[in->op].kind));
        if ((unsigned)in->place >= TIDE_PLACE_COUNT) return vfail(v, x, "has an unknown placement %d", (int)in->place);
        if (in->stream != (host ? TIDE_STREAM_HOST : TIDE_STREAM_COMPUTE))
            return vfail(v, x, "computes off the %s stream (on the %s stream): a compute placed on the %s runs on "
                        "the %s stream", host ? "host" : "compute", tide_stream_name(in->stream),
                        tide_place_name(in->place), host ? "host" : "compute");
        if (in->op < 0 || in->op >= v->g->n_ops) return vfail(v, x, "names op %d of a graph of %d", in->op, v->g->n_ops);
        if (in->tensor != NONE) return vfail(v, x, "names tensor %d; a COMPUTE's tensor must be -1", in->tensor);
        const tide_op *op = &v->g->ops[in->op];
        if (in->host_opnd >> (op->n_in + op->n_out))
            return vfail(v, x, "marks host operands beyond its op's %d", op->n_in + op->n_out);
        for (int k = 0; k < op->n_in + op->n_out; k++) {
            bool out = k >= op->n_in;
            int t = out ? op->out[k - op->n_in] : op->in[k];
            if (!tide_ins_host_opnd(in, k)) {
                if (host)
                    return vfail(v, x, "runs on the host but %s '%s' on the device: a host compute's operands "
                                "are host copies", out ? "writes" : "reads", vtname(v, t));
                if ((st = check_dev(v, x, out ? "writes" : "reads", t, in->dev_off[k], v->g->tensors[t].nbytes)))
                    return st;
                continue;
            }
            if (!host && !v->p->host_addressable)
                return vfail(v, x, "%s '%s' in host memory from the device, in a plan whose device cannot "
                            "address host memory (host_addressable is off)", out ? "writes" : "reads", vtname(v, t));
            if ((st = check_spill(v, x, t, TIDE_TIER_HOST, in->dev_off[k]))) return st;
        }
        if (!host && op->scratch_bytes && (st = check_dev(v, x, "uses", NONE, in->scratch_off, op->scratch_bytes)))
            return st;
        return TIDE_OK;
    }
    if (in->place != TIDE_PLACE_DEVICE || in->host_opnd)
        return vfail(v, x, "has a placement or host operands; only a COMPUTE has them");
    if (in->tensor < 0 || in->tensor >= v->g->n_tensors)
        return vfail(v, x, "names tensor %d of a graph of %d", in->tensor, v->g->n_tensors);
    if (in->op != NONE) return vfail(v, x, "names op %d; only a COMPUTE names an op (must be -1)", in->op);
    int t = in->tensor;
    uint64_t n = v->g->tensors[t].nbytes;
    switch (in->kind) {
    case TIDE_INS_LOAD:
        if (!off_tier(in->src) || in->dst != TIDE_TIER_DEVICE)
            return vfail(v, x, "loads from %s to %s; a LOAD goes host|ssd -> device", tide_tier_name(in->src),
                        tide_tier_name(in->dst));
        if (in->stream != TIDE_STREAM_H2D && in->stream != TIDE_STREAM_IO)
            return vfail(v, x, "loads on the %s stream; a LOAD runs on h2d or io", tide_stream_name(in->stream));
        if ((st = check_dev(v, x, "loads", t, in->dev_off[0], n))) return st;
        return check_spill(v, x, t, in->src, in->tier_off);
    case TIDE_INS_STORE:
        if (in->src != TIDE_TIER_DEVICE || !off_tier(in->dst))
            return vfail(v, x, "stores from %s to %s; a STORE goes device -> host|ssd", tide_tier_name(in->src),
                        tide_tier_name(in->dst));
        if (in->stream != TIDE_STREAM_D2H && in->stream != TIDE_STREAM_IO)
            return vfail(v, x, "stores on the %s stream; a STORE runs on d2h or io", tide_stream_name(in->stream));
        if ((st = check_dev(v, x, "stores", t, in->dev_off[0], n))) return st;
        return check_spill(v, x, t, in->dst, in->tier_off);
    case TIDE_INS_MOVE:
        if (!off_tier(in->src) || !off_tier(in->dst) || in->src == in->dst)
            return vfail(v, x, "moves from %s to %s; a MOVE goes host <-> ssd", tide_tier_name(in->src),
                        tide_tier_name(in->dst));
        if (in->stream != TIDE_STREAM_IO)
            return vfail(v, x, "moves on the %s stream; a MOVE runs on io", tide_stream_name(in->stream));
        if ((st = check_spill(v, x, t, in->src, in->src_off))) return st;
        return check_spill(v, x, t, in->dst, in->tier_off);
    case TIDE_INS_DROP:
        if ((unsigned)in->src >= TIDE_TIER_COUNT) return vfail(v, x, "drops from unknown tier %d", (int)in->src);
        if (in->src == TIDE_TIER_DEVICE) return check_dev(v, x, "drops", t, in->dev_off[0], n);
        if (in->tier_off == TIDE_HOME)
            return vfail(v, x, "drops the home copy of '%s'; a plan never drops a home", vtname(v, t));
        return check_spill(v, x, t, in->src, in->tier_off);
    default:
        return TIDE_OK;
    }
}

/* ---------------------------------------------------------------- V2-V4: replay */

/* Finds the copy instruction x reads from (tier, off): live, valid, current. */
static tide_status source(vstate *v, int x, int t, tide_tier tier, uint64_t off, int *out) {
    const tide_tensor *tt = &v->g->tensors[t];
    const char *verb = tide_ins_runs_op(v->p->ins[x].kind) ? "reads" :
                       v->p->ins[x].kind == TIDE_INS_LOAD ? "loads" :
                       v->p->ins[x].kind == TIDE_INS_STORE ? "stores" : "moves";
    char pl[64];
    vplace(pl, sizeof pl, tier, off);
    int c;
    if (tier != TIDE_TIER_DEVICE && off == TIDE_HOME) {
        if (tt->role == TIDE_ROLE_TEMP) return vfail(v, x, "%s '%s' from %s, but a temp has no home", verb, tt->name, pl);
        if (tier != v->p->home[t])
            return vfail(v, x, "%s '%s' from %s, but its home is %s", verb, tt->name, pl, tide_tier_name(v->p->home[t]));
        c = t;
        if (!v->cp[c].valid)
            return vfail(v, x, "%s '%s' from its %s, which holds no valid copy (an output is valid "
                        "there only once stored)", verb, tt->name, pl);
    } else {
        c = vcopy_find(v, t, tier, off);
        if (c == NONE) {
            if (v->cur[t] == 0 && (tt->role == TIDE_ROLE_TEMP || tt->role == TIDE_ROLE_OUTPUT))
                return vfail(v, x, "%s '%s', a %s tensor no instruction has written yet (read of a %s "
                            "never written)", verb, tt->name, tide_role_name(tt->role), tide_role_name(tt->role));
            char why[320] = "";
            int other = NONE;
            for (int d = v->head[t]; d != NONE && other == NONE; d = v->cp[d].next)
                if (v->cp[d].tier == tier) other = d;
            if (v->n_cur[t] == 0 && v->lost[t] != NONE)
                snprintf(why, sizeof why, "; its current version was lost when %s dropped its last copy",
                         vref_of(v, v->lost[t]).s);
            else if (other != NONE)
                snprintf(why, sizeof why, "; its live %s copy is at offset %" PRIu64, tide_tier_name(tier),
                         v->cp[other].off);
            return vfail(v, x, "%s '%s' from %s where no copy of it is live (never %s there, or dropped)%s",
                        verb, tt->name, pl, tier == TIDE_TIER_DEVICE ? "loaded or computed" : "stored", why);
        }
    }
    if (v->cp[c].ver != v->cur[t])
        return vfail(v, x, "%s '%s' from %s that holds version %u, current is %u (stale read)", verb,
                    tt->name, pl, v->cp[c].ver, v->cur[t]);
    *out = c;
    return vcopy_read(v, x, c);
}

/* Instruction x writes t's copy at (tier, off) with version ver. */
static tide_status dest(vstate *v, int x, int t, tide_tier tier, uint64_t off, uint32_t ver) {
    const tide_tensor *tt = &v->g->tensors[t];
    if (tier != TIDE_TIER_DEVICE && off == TIDE_HOME) {
        if (tt->role != TIDE_ROLE_STATE && tt->role != TIDE_ROLE_OUTPUT)
            return vfail(v, x, "writes the home of %s '%s'; only state and output homes are written "
                        "(%s)", tide_role_name(tt->role), tt->name,
                        tt->role == TIDE_ROLE_TEMP ? "a temp has no home" : "it is read-only");
        if (tier != v->p->home[t])
            return vfail(v, x, "writes '%s' to a %s home, but its home is %s", tt->name,
                        tide_tier_name(tier), tide_tier_name(v->p->home[t]));
        return vcopy_write(v, x, t, ver);
    }
    int c = vcopy_find(v, t, tier, off);
    return c != NONE ? vcopy_write(v, x, c, ver) : vcopy_new(v, x, t, tier, off, ver);
}

/* V2: is COMPUTE x the first of its op in its iteration (in graph order), or
 * a recomputation whose inputs and outputs are at the versions of the first?
 * Sets *recompute. */
static tide_status check_order(vstate *v, int x, bool *recompute) {
    const tide_ins *in = &v->p->ins[x];
    const tide_op *op = &v->g->ops[in->op];
    *recompute = false;
    if (in->iter == v->exp_iter && in->op == v->exp_op) {
        if (++v->exp_op == v->g->n_ops) v->exp_op = 0, v->exp_iter++;
        v->first_iter[in->op] = in->iter;
        return TIDE_OK;
    }
    if (v->first_iter[in->op] != in->iter) {
        const tide_op *want = &v->g->ops[v->exp_op % (v->g->n_ops ? v->g->n_ops : 1)];
        if (v->exp_iter >= v->p->n_iter)
            return vfail(v, x, "computes op %d of iteration %d after every iteration is complete", in->op,
                        in->iter);
        return vfail(v, x, "computes op %d of iteration %d, but op %d ('%s') of iteration %d comes "
                    "next: every op is first computed once per iteration, in graph order (op missing or "
                    "out of order)", in->op, in->iter, v->exp_op, vtname(v, want->out[0]), v->exp_iter);
    }
    const uint32_t *ver = &v->op_ver[(size_t)in->op * OPV];
    for (int i = 0; i < op->n_in; i++)
        if (v->cur[op->in[i]] != ver[i])
            return vfail(v, x, "recomputes op %d, but its input '%s' is at version %u, not version %u that its "
                        "first compute read (recomputation from a stale input)", in->op,
                        vtname(v, op->in[i]), v->cur[op->in[i]], ver[i]);
    for (int j = 0; j < op->n_out; j++)
        if (v->cur[op->out[j]] != ver[TIDE_OP_MAX_IN + j])
            return vfail(v, x, "recomputes op %d, whose output '%s' has moved on to version %u since its "
                        "first compute wrote version %u (recomputation of a stale value)", in->op,
                        vtname(v, op->out[j]), v->cur[op->out[j]], ver[TIDE_OP_MAX_IN + j]);
    *recompute = true;
    return TIDE_OK;
}

/* Where operand k of COMPUTE in lives. */
static tide_tier opnd_tier(const tide_ins *in, int k) {
    return tide_ins_host_opnd(in, k) ? TIDE_TIER_HOST : TIDE_TIER_DEVICE;
}

static tide_status do_compute(vstate *v, int x) {
    const tide_ins *in = &v->p->ins[x];
    const tide_op *op = &v->g->ops[in->op];
    uint32_t *ver = &v->op_ver[(size_t)in->op * OPV];
    bool again;
    tide_status st = check_order(v, x, &again);
    if (st) return st;
    for (int i = 0; i < op->n_in; i++) {
        int c;
        if (!again) ver[i] = v->cur[op->in[i]];
        if ((st = source(v, x, op->in[i], opnd_tier(in, i), in->dev_off[i], &c))) return st;
    }
    for (int j = 0; j < op->n_out; j++) {
        int t = op->out[j];
        bool first = !again;
        for (int k = 0; k < j; k++) first = first && op->out[k] != t;
        if (first) { /* one new version per tensor per op */
            v->cur[t]++;
            v->n_cur[t] = 0;
            v->lost[t] = NONE;
            v->wrote[t] = x;
        }
        if (!again) ver[TIDE_OP_MAX_IN + j] = v->cur[t];
        if ((st = dest(v, x, t, opnd_tier(in, op->n_in + j), in->dev_off[op->n_in + j], v->cur[t]))) return st;
    }
    if (op->scratch_bytes && in->place == TIDE_PLACE_DEVICE) {
        vocc o = {.copy = NONE, .tensor = NONE, .freed_by = x, .writer = x};
        for (int s = 0; s < NS; s++) o.acc[s] = NONE;
        o.acc[TIDE_STREAM_COMPUTE] = x;
        if ((st = vseg_claim(v, x, TIDE_TIER_DEVICE, in->scratch_off, in->scratch_off + op->scratch_bytes, o)))
            return st;
    }
    return TIDE_OK;
}

static tide_status step(vstate *v, int x) {
    const tide_plan *p = v->p;
    const tide_ins *in = &p->ins[x];
    tide_status st = check_fields(v, x);
    if (st) return st;
    int32_t *c = v->vc[x];
    int prev = v->last[in->stream];
    for (int s = 0; s < NS; s++) c[s] = prev != NONE ? v->vc[prev][s] : NONE;
    for (int k = 0; k < in->n_wait; k++) {
        const int32_t *w = v->vc[p->waits[in->wait_at + k]];
        for (int s = 0; s < NS; s++) c[s] = TIDE_MAX(c[s], w[s]);
    }
    c[in->stream] = x;
    v->last[in->stream] = x;
    int t = in->tensor, src;
    switch (in->kind) {
    case TIDE_INS_COMPUTE:
    case TIDE_INS_ALL_REDUCE:
    case TIDE_INS_REDUCE_SCATTER:
    case TIDE_INS_ALL_GATHER:
        return do_compute(v, x);
    case TIDE_INS_LOAD:
        if ((st = source(v, x, t, in->src, in->tier_off, &src))) return st;
        return dest(v, x, t, TIDE_TIER_DEVICE, in->dev_off[0], v->cp[src].ver);
    case TIDE_INS_STORE:
        if ((st = source(v, x, t, TIDE_TIER_DEVICE, in->dev_off[0], &src))) return st;
        return dest(v, x, t, in->dst, in->tier_off, v->cp[src].ver);
    case TIDE_INS_MOVE:
        if ((st = source(v, x, t, in->src, in->src_off, &src))) return st;
        return dest(v, x, t, in->dst, in->tier_off, v->cp[src].ver);
    case TIDE_INS_DROP: {
        uint64_t off = in->src == TIDE_TIER_DEVICE ? in->dev_off[0] : in->tier_off;
        int d = vcopy_find(v, t, in->src, off);
        if (d != NONE && in->src == TIDE_TIER_DEVICE && v->p->warm_off && v->p->warm_off[t] == off)
            return vfail(v, x, "drops warm '%s' at its offset %" PRIu64 "; a warm tensor stays on the device "
                        "across runs", vtname(v, t), off);
        if (d == NONE) {
            char pl[64];
            vplace(pl, sizeof pl, in->src, off);
            return vfail(v, x, "drops '%s' at %s where no copy of it is live (never written there, or "
                        "already dropped)", vtname(v, t), pl);
        }
        return vcopy_drop(v, x, d);
    }
    default:
        return TIDE_OK;
    }
}

/* ---------------------------------------------------------------- V5: ends */

static bool warm(const vstate *v, int t) { return v->p->warm_off && v->p->warm_off[t] != TIDE_HOME; }

typedef struct warm_rng { uint64_t lo, hi; int t; } warm_rng;
static int cmp_warm(const void *a, const void *b) {
    const warm_rng *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* V1 and V5 for warm tensors: persistent, inside the budget, apart; then
 * their device copies are live at the start. */
static tide_status check_warm(vstate *v) {
    const tide_graph *g = v->g;
    if (v->p->warm_region > v->p->device_budget)
        return tide_err(v->ctx, TIDE_E_VERIFY, "the warm region [0, %" PRIu64 ") is past the device budget of "
                        "%" PRIu64 " bytes", v->p->warm_region, v->p->device_budget);
    int n = 0;
    for (int t = 0; t < g->n_tensors; t++) n += warm(v, t);
    if (!n) return TIDE_OK;
    warm_rng *r = tide_malloc((size_t)n * sizeof *r);
    if (!r) return vnomem(v);
    n = 0;
    tide_status st = TIDE_OK;
    for (int t = 0; t < g->n_tensors && !st; t++) {
        if (!warm(v, t)) continue;
        tide_role role = g->tensors[t].role;
        uint64_t off = v->p->warm_off[t], nb = g->tensors[t].nbytes;
        if (role != TIDE_ROLE_WEIGHT && role != TIDE_ROLE_STATE)
            st = tide_err(v->ctx, TIDE_E_VERIFY, "the plan keeps %s '%s' warm on the device; only weights and "
                          "state persist across runs", tide_role_name(role), vtname(v, t));
        else if (!vin_area(off, nb, v->p->device_budget))
            st = tide_err(v->ctx, TIDE_E_VERIFY, "warm '%s' at device [%" PRIu64 ", %" PRIu64 ") is past the "
                          "device budget of %" PRIu64 " bytes", vtname(v, t), off, off + nb, v->p->device_budget);
        r[n++] = (warm_rng){off, off + nb, t};
    }
    if (!st) qsort(r, (size_t)n, sizeof *r, cmp_warm);
    for (int k = 1; k < n && !st; k++)
        if (r[k].lo < r[k - 1].hi)
            st = tide_err(v->ctx, TIDE_E_VERIFY, "warm '%s' and '%s' overlap on the device at [%" PRIu64
                          ", %" PRIu64 ")", vtname(v, r[k - 1].t), vtname(v, r[k].t), r[k].lo,
                          TIDE_MIN(r[k].hi, r[k - 1].hi));
    for (int k = 0; k < n && !st; k++) {
        int t = r[k].t;
        if (g->tensors[t].role == TIDE_ROLE_STATE) { /* its home may be stale: never read */
            v->cp[t].valid = false;
            v->n_cur[t] = 0;
        }
        st = vcopy_new(v, NONE, t, TIDE_TIER_DEVICE, r[k].lo, 0);
    }
    tide_free(r);
    return st;
}

static tide_status check_homes(vstate *v) {
    for (int t = 0; t < v->g->n_tensors; t++) {
        tide_role r = v->g->tensors[t].role;
        tide_tier h = v->p->home[t];
        bool ok = r == TIDE_ROLE_TEMP ? h == TIDE_TIER_DEVICE
                : r == TIDE_ROLE_WEIGHT || r == TIDE_ROLE_STATE ? off_tier(h)
                : h == TIDE_TIER_HOST;
        if (!ok)
            return tide_err(v->ctx, TIDE_E_VERIFY, "the plan gives %s '%s' home tier %d (%s); a weight "
                            "or state lives on host or ssd, an input or output on host, a temp has "
                            "none (device)", tide_role_name(r), vtname(v, t), (int)h, tide_tier_name(h));
    }
    return TIDE_OK;
}

static tide_status check_end(vstate *v) {
    const tide_graph *g = v->g;
    if (v->exp_iter < v->p->n_iter && g->n_ops > 0)
        return vfail(v, NONE, "op %d ('%s') of iteration %d is never computed (op missing)", v->exp_op,
                    vtname(v, g->ops[v->exp_op].out[0]), v->exp_iter);
    for (int t = 0; t < g->n_tensors; t++) {
        tide_role r = g->tensors[t].role;
        const vcopy *h = &v->cp[t];
        if (r != TIDE_ROLE_WEIGHT && r != TIDE_ROLE_STATE && r != TIDE_ROLE_OUTPUT) continue;
        if (warm(v, t)) {
            int c = vcopy_find(v, t, TIDE_TIER_DEVICE, v->p->warm_off[t]);
            if (c == NONE || v->cp[c].ver != v->cur[t])
                return vfail(v, NONE, "warm '%s' does not end at its offset %" PRIu64 " with its latest version "
                            "%u (written by %s)", vtname(v, t), v->p->warm_off[t], v->cur[t], vref_of(v, v->wrote[t]).s);
            continue;
        }
        if (h->valid && h->ver == v->cur[t]) continue;
        if (!h->valid)
            return vfail(v, NONE, "%s '%s' (version %u, written by %s) is never stored to its %s home "
                        "(output never stored)", tide_role_name(r), vtname(v, t), v->cur[t],
                        vref_of(v, v->wrote[t]).s, tide_tier_name(v->p->home[t]));
        if (v->n_cur[t] == 0 && v->lost[t] != NONE)
            return vfail(v, NONE, "%s '%s' ends with version %u at its %s home, but its latest version "
                        "%u (written by %s) was lost when %s dropped its last copy without a STORE "
                        "home (lost dirty state)", tide_role_name(r), vtname(v, t), h->ver,
                        tide_tier_name(v->p->home[t]), v->cur[t], vref_of(v, v->wrote[t]).s,
                        vref_of(v, v->lost[t]).s);
        return vfail(v, NONE, "%s '%s' ends with version %u at its %s home, but its latest version %u "
                    "(written by %s) is never stored home (missing STORE)", tide_role_name(r),
                    vtname(v, t), h->ver, tide_tier_name(v->p->home[t]), v->cur[t], vref_of(v, v->wrote[t]).s);
    }
    for (int t = 0; t < g->n_tensors; t++) {
        if (v->p->resident && v->p->resident[t]) continue;
        for (int c = v->head[t]; c != NONE; c = v->cp[c].next)
            if (v->cp[c].tier == TIDE_TIER_DEVICE && !(warm(v, t) && v->cp[c].off == v->p->warm_off[t]))
                return vfail(v, NONE, "'%s' still lives at device offset %" PRIu64 " (written by %s); "
                            "only resident tensors stay on the device, and warm ones at their offsets (missing DROP)", vtname(v, t),
                            v->cp[c].off, vref_of(v, v->cp[c].writer).s);
    }
    return TIDE_OK;
}

/* ---------------------------------------------------------------- entry */

static tide_status vstate_init(vstate *v) {
    int nt = v->g->n_tensors;
    size_t n = (size_t)(nt ? nt : 1);
    v->vc = tide_malloc((size_t)(v->p->n_ins ? v->p->n_ins : 1) * sizeof *v->vc);
    v->head = tide_malloc(n * sizeof *v->head);
    v->cur = tide_calloc(n, sizeof *v->cur);
    v->n_cur = tide_malloc(n * sizeof *v->n_cur);
    v->lost = tide_malloc(n * sizeof *v->lost);
    v->wrote = tide_malloc(n * sizeof *v->wrote);
    size_t no = (size_t)(v->g->n_ops ? v->g->n_ops : 1);
    v->first_iter = tide_malloc(no * sizeof *v->first_iter);
    v->op_ver = tide_malloc(no * OPV * sizeof *v->op_ver);
    if (!v->vc || !v->head || !v->cur || !v->n_cur || !v->lost || !v->wrote || !v->first_iter || !v->op_ver ||
        tide_grow((void **)&v->cp, &v->cap_cp, nt + 64, sizeof *v->cp))
        return vnomem(v);
    for (int s = 0; s < NS; s++) v->last[s] = NONE;
    for (int k = 0; k < TIDE_TIER_COUNT; k++) v->root[k] = NONE;
    v->free_seg = v->free_cp = NONE;
    v->rng = 0x9e3779b97f4a7c15ull;
    for (int t = 0; t < nt; t++) { /* V5, start: homes of weights, state, inputs hold version 0 */
        tide_role r = v->g->tensors[t].role;
        vcopy *h = &v->cp[t];
        memset(h, 0, sizeof *h);
        h->tensor = t;
        h->next = NONE;
        h->tier = v->p->home[t];
        h->off = TIDE_HOME;
        h->valid = r == TIDE_ROLE_WEIGHT || r == TIDE_ROLE_STATE || r == TIDE_ROLE_INPUT;
        h->writer = NONE;
        for (int s = 0; s < NS; s++) h->acc[s] = NONE;
        v->head[t] = NONE;
        v->n_cur[t] = h->valid ? 1 : 0;
        v->lost[t] = NONE;
        v->wrote[t] = NONE;
    }
    v->n_cp = nt;
    for (int i = 0; i < v->g->n_ops; i++) v->first_iter[i] = -1;
    return check_warm(v);
}

static void vstate_free(vstate *v) {
    tide_free(v->vc);
    tide_free(v->seg);
    tide_free(v->cp);
    tide_free(v->head);
    tide_free(v->cur);
    tide_free(v->n_cur);
    tide_free(v->lost);
    tide_free(v->wrote);
    tide_free(v->first_iter);
    tide_free(v->op_ver);
}

tide_status tide_plan_verify(const tide_plan *p) {
    if (!p) return TIDE_E_INVALID;
    if (!p->g || !p->home || (p->n_ins > 0 && !p->ins) || (p->n_waits > 0 && !p->waits))
        return tide_err(p->ctx, TIDE_E_INVALID, "plan verification: the plan is incomplete (no graph, "
                        "homes or instructions)");
    if (p->n_iter < 1)
        return tide_err(p->ctx, TIDE_E_VERIFY, "the plan runs %d iterations; at least 1 is needed", p->n_iter);
    vstate v = {.p = p, .g = p->g, .ctx = p->ctx};
    tide_status st = check_homes(&v);
    if (!st) st = vstate_init(&v);
    for (int x = 0; !st && x < p->n_ins; x++) st = step(&v, x);
    if (!st) st = check_end(&v);
    vstate_free(&v);
    return st;
}
