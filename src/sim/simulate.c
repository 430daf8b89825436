/*
 * simulate.c - discrete-event replay of a plan on a hardware profile: predicts
 * when every instruction starts and ends, hence the makespan and how busy each
 * stream is. The planner calls it to fill its stats; the CLI uses it to run any
 * workload "on paper" on any profile.
 *
 * Model:
 *   - Streams are FIFO: an instruction starts no earlier than the end of the
 *     previous instruction of its stream, and no earlier than the end of every
 *     instruction in its wait list.
 *   - Each instruction also holds the shared resources it uses for its whole
 *     duration, and starts only when they are free:
 *         COMPUTE (device)   the compute engine
 *         COMPUTE (host)     the host CPU
 *         LOAD  host->dev    the H2D link
 *         STORE dev->host    the D2H link
 *         LOAD  ssd->dev     the SSDs and the H2D link (pipelined through bounce
 *                            buffers)
 *         STORE dev->ssd     the D2H link and the SSDs (likewise)
 *         MOVE  host<->ssd   the SSDs
 *         DROP               nothing; takes no time
 *     So two transfers on one link never overlap even when the plan puts them
 *     on different streams: they share its bandwidth, which for the total time
 *     is the same as running one after the other (as a GPU's copy engine does).
 *     The SSDs are one resource for reads and writes alike.
 *   - When several instructions could take a resource at the same instant, the
 *     one that became ready first wins, ties going to the lower instruction
 *     index. The replay is therefore deterministic.
 *   - Durations and resources come from the cost model (cost/cost.c), the
 *     same functions the planner's clock and the lower bound use. A pipelined
 *     SSD transfer takes the slower stage's time for all its bytes plus the
 *     faster stage's time for one chunk (the pipeline's fill).
 *
 * Cost: every stream runs one instruction at a time, so at most
 * TIDE_STREAM_COUNT instructions are in flight and each step of the replay
 * looks at TIDE_STREAM_COUNT stream heads: O(instructions + waits) time and
 * memory.
 */
#include "sim/sim.h"

#include <math.h>
#include <string.h>

/* Checks what the replay relies on: kinds, streams, op/tensor indices and
 * waits in range. Returns the index of the first bad instruction or -1. */
static int first_bad(const tide_plan *p, const char **why) {
    const tide_graph *g = p->g;
    for (int i = 0; i < p->n_ins; i++) {
        const tide_ins *in = &p->ins[i];
        if ((unsigned)in->kind >= TIDE_INS_COUNT) return *why = "unknown kind", i;
        if ((unsigned)in->stream >= TIDE_STREAM_COUNT) return *why = "unknown stream", i;
        if (tide_ins_runs_op(in->kind) ? (in->op < 0 || in->op >= g->n_ops)
                                         : (in->tensor < 0 || in->tensor >= g->n_tensors))
            return *why = "op or tensor index out of range", i;
        if (in->n_wait < 0 || in->wait_at < 0 || in->wait_at > p->n_waits - in->n_wait)
            return *why = "wait list out of range", i;
        for (int k = 0; k < in->n_wait; k++) {
            int w = p->waits[in->wait_at + k];
            if (w < 0 || w >= p->n_ins || w == i) return *why = "waits on an invalid instruction", i;
        }
    }
    return -1;
}

void tide_sim_result_free(tide_sim_result *r) {
    if (!r) return;
    tide_free(r->events);
    r->events = NULL;
    r->n_events = 0;
}

tide_status tide_simulate(const tide_plan *p, const tide_hw *hw, tide_sim_result *out) {
    memset(out, 0, sizeof *out);
    tide_ctx *ctx = p->ctx;
    const char *why = NULL;
    int bad = first_bad(p, &why);
    if (bad >= 0) return tide_err(ctx, TIDE_E_INVALID, "simulate: instruction %d: %s", bad, why);

    const int n = p->n_ins;
    size_t nn = (size_t)(n > 0 ? n : 1);
    tide_sim_event *ev = tide_malloc(nn * sizeof *ev);
    double *dur = tide_malloc(nn * sizeof *dur);
    double *wait_ready = tide_calloc(nn, sizeof *wait_ready);
    unsigned char *res = tide_malloc(nn);
    int *pending = tide_malloc(nn * sizeof *pending);
    int *order = tide_malloc(nn * sizeof *order);           /* instructions grouped by stream */
    int *wstart = tide_calloc(nn + 1, sizeof *wstart);      /* waiters of j: wlist[wstart[j]..] */
    int *wlist = tide_malloc((size_t)(p->n_waits > 0 ? p->n_waits : 1) * sizeof *wlist);
    if (!ev || !dur || !wait_ready || !res || !pending || !order || !wstart || !wlist) {
        tide_free(ev);
        tide_free(dur);
        tide_free(wait_ready);
        tide_free(res);
        tide_free(pending);
        tide_free(order);
        tide_free(wstart);
        tide_free(wlist);
        return tide_err(ctx, TIDE_E_NOMEM, "out of memory simulating a plan of %d instructions", n);
    }

    int s_len[TIDE_STREAM_COUNT] = {0}, s_at[TIDE_STREAM_COUNT], s_pos[TIDE_STREAM_COUNT];
    for (int i = 0; i < n; i++) {
        const tide_ins *in = &p->ins[i];
        unsigned r = 0;
        dur[i] = tide_cost_ins(hw, p->g, in, p->host_addressable, &r);
        res[i] = (unsigned char)r;
        pending[i] = in->n_wait;
        ev[i].ins = i;
        ev[i].start_s = ev[i].end_s = 0;
        s_len[in->stream]++;
        for (int k = 0; k < in->n_wait; k++) wstart[p->waits[in->wait_at + k] + 1]++;
    }
    for (int j = 0; j < n; j++) wstart[j + 1] += wstart[j];
    {
        int *fill = pending; /* reuse as a cursor, then restore */
        for (int j = 0; j < n; j++) fill[j] = wstart[j];
        for (int i = 0; i < n; i++) {
            const tide_ins *in = &p->ins[i];
            for (int k = 0; k < in->n_wait; k++) {
                int w = p->waits[in->wait_at + k];
                wlist[fill[w]++] = i;
            }
        }
        for (int i = 0; i < n; i++) pending[i] = p->ins[i].n_wait;
    }
    s_at[0] = 0;
    for (int s = 1; s < TIDE_STREAM_COUNT; s++) s_at[s] = s_at[s - 1] + s_len[s - 1];
    for (int s = 0; s < TIDE_STREAM_COUNT; s++) s_pos[s] = 0;
    {
        int cur[TIDE_STREAM_COUNT];
        memcpy(cur, s_at, sizeof cur);
        for (int i = 0; i < n; i++) order[cur[p->ins[i].stream]++] = i;
    }

    double now = 0, makespan = 0;
    double s_free_at[TIDE_STREAM_COUNT] = {0};
    int s_running[TIDE_STREAM_COUNT]; /* instruction in flight on the stream, or -1 */
    for (int s = 0; s < TIDE_STREAM_COUNT; s++) s_running[s] = -1;
    unsigned busy = 0; /* resources held */
    int remaining = n;
    tide_status st = TIDE_OK;

    while (remaining > 0) {
        /* Start every instruction that can start now, best first. */
        for (;;) {
            int best = -1;
            double best_ready = 0;
            for (int s = 0; s < TIDE_STREAM_COUNT; s++) {
                if (s_running[s] >= 0 || s_pos[s] == s_len[s]) continue;
                int i = order[s_at[s] + s_pos[s]];
                if (pending[i] > 0 || (res[i] & busy)) continue;
                double ready = s_free_at[s] > wait_ready[i] ? s_free_at[s] : wait_ready[i];
                if (best < 0 || ready < best_ready || (ready == best_ready && i < best)) {
                    best = i;
                    best_ready = ready;
                }
            }
            if (best < 0) break;
            int s = p->ins[best].stream;
            ev[best].start_s = now;
            ev[best].end_s = now + dur[best];
            busy |= res[best];
            s_running[s] = best;
            s_pos[s]++;
        }
        /* Complete the earliest-ending instructions in flight. */
        double t = INFINITY;
        for (int s = 0; s < TIDE_STREAM_COUNT; s++)
            if (s_running[s] >= 0 && ev[s_running[s]].end_s < t) t = ev[s_running[s]].end_s;
        if (t == INFINITY) {
            /* Nothing runs and nothing can start: some wait is never satisfied. */
            for (int s = 0; s < TIDE_STREAM_COUNT; s++) {
                if (s_pos[s] == s_len[s]) continue;
                int i = order[s_at[s] + s_pos[s]];
                st = tide_err(ctx, TIDE_E_INVALID,
                              "simulate: deadlock: instruction %d (%s stream) waits on an "
                              "instruction that can never complete (a wait on a later "
                              "instruction of a stream, or a cycle)",
                              i, tide_stream_name((tide_stream)s));
                break;
            }
            goto done;
        }
        now = t;
        if (now > makespan) makespan = now;
        for (int s = 0; s < TIDE_STREAM_COUNT; s++) {
            int i = s_running[s];
            if (i < 0 || ev[i].end_s != t) continue;
            s_running[s] = -1;
            s_free_at[s] = t;
            busy &= ~(unsigned)res[i];
            out->busy_s[s] += dur[i];
            remaining--;
            for (int k = wstart[i]; k < wstart[i + 1]; k++) {
                int d = wlist[k];
                pending[d]--;
                if (t > wait_ready[d]) wait_ready[d] = t;
            }
        }
    }
    out->makespan_s = makespan;
    out->events = ev;
    out->n_events = n;
    ev = NULL;
done:
    if (st) memset(out, 0, sizeof *out);
    tide_free(ev);
    tide_free(dur);
    tide_free(wait_ready);
    tide_free(res);
    tide_free(pending);
    tide_free(order);
    tide_free(wstart);
    tide_free(wlist);
    return st;
}
