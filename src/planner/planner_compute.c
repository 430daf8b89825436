/*
 * planner_compute.c - the engine's computes (planner_int.h): a COMPUTE on the
 * device with its waits and the bookkeeping after it (drops of what died,
 * final stores home), a COMPUTE placed on the host CPU (inputs brought into
 * host memory first, outputs in host homes or spill space), and the end of a
 * plan (everything home, the stats). It calls the engine's copies and the
 * space below them.
 */
#include "planner/planner_int.h"

#include <assert.h>
#include <string.h>

/* ---------------------------------------------------------------- compute */

/* Operand k of a COMPUTE is tensor t's host home, used in place: waits for
 * its last writer (a read) or every access since (a write). */
static void in_place_opnd(engine *e, tide_ins *in, waits *w, int k, int t, bool write) {
    engine_copy *c = &e->t[t].cp[TIDE_TIER_HOST];
    in->host_opnd |= (uint16_t)(1u << k);
    in->dev_off[k] = TIDE_HOME;
    waits_add(e, w, c->w_ins);
    if (write)
        for (int s = 0; s < TIDE_STREAM_COUNT; s++) waits_add(e, w, c->r_ins[s]);
}

/* After COMPUTE c (on stream s) wrote host copy cp of t: it holds the only
 * current version. */
static void host_written(engine *e, int t, engine_copy *cp, int c, tide_stream s) {
    engine_tensor *T = &e->t[t];
    T->cp[TIDE_TIER_HOST].valid = T->cp[TIDE_TIER_SSD].valid = false;
    cp->valid = true;
    cp->w_ins = c;
    for (int k = 0; k < TIDE_STREAM_COUNT; k++) cp->r_ins[k] = -1;
    cp->r_ins[s] = c;
}

/* A clean spill copy in host memory of a persistent tensor whose SSD copy
 * is valid (a weight homed on SSD, MOVEd in for a host step) goes after the
 * tensor's last use of the iteration, as a streamed device copy does: kept
 * until its last use of the last iteration, such copies would make the host
 * spill area grow with n_iter. The next iteration MOVEs it in again. */
static int drop_clean_host_spill(engine *e, int t, int step) {
    engine_tensor *T = &e->t[t];
    const engine_copy *h = &T->cp[TIDE_TIER_HOST];
    if (!role_persistent(T->role) || !h->exists || h->home || !T->cp[TIDE_TIER_SSD].valid ||
        engine_pos(e, step) != tide_lifetime_last_op(&e->lt, t))
        return 0;
    return engine_drop_tier(e, t, TIDE_TIER_HOST, step) < 0 ? -1 : 0;
}

tide_status engine_compute(engine *e, int step) {
    if (engine_on_host(e, step)) return engine_compute_host(e, step);
    const tide_op *op = &e->g->ops[engine_op_index(e, step)];
    tide_ins in = engine_ins_new(e, TIDE_INS_COMPUTE, TIDE_STREAM_COMPUTE, step, -1);
    in.op = engine_op_index(e, step);
    waits w;
    waits_init(&w);
    for (int i = 0; i < op->n_in; i++) {
        engine_tensor *T = &e->t[op->in[i]];
        if (T->in_place) {
            in_place_opnd(e, &in, &w, i, op->in[i], false);
            continue;
        }
        if (T->dev != DEV_VALID)
            return e->st = tide_err(e->ctx, TIDE_E_INVALID, "plan: internal error: op %d input '%s' not on the device",
                                    in.op, e->g->tensors[op->in[i]].name);
        waits_add(e, &w, T->w_ins);
        in.dev_off[i] = T->off;
    }
    for (int j = 0; j < op->n_out; j++) {
        engine_tensor *T = &e->t[op->out[j]];
        if (T->in_place) {
            in_place_opnd(e, &in, &w, op->n_in + j, op->out[j], true);
            continue;
        }
        if (T->dev == DEV_NONE)
            return e->st = tide_err(e->ctx, TIDE_E_INVALID, "plan: internal error: op %d output '%s' not placed",
                                    in.op, e->g->tensors[op->out[j]].name);
        if (T->dev == DEV_PLACED) {
            waits_add_release(e, &w, T->pre, T->pre_step);
        } else {
            waits_add(e, &w, T->w_ins);
            for (int s = 0; s < TIDE_STREAM_COUNT; s++) waits_add(e, &w, T->r_ins[s]);
        }
        in.dev_off[op->n_in + j] = T->off;
    }
    scratch_slot *sl = &e->sp.scratch[step % e->sp.scratch_cap];
    bool own_scratch = op->scratch_bytes && !e->sp.shared; /* a range of its own, released after */
    if (op->scratch_bytes && e->sp.shared) in.scratch_off = e->sp.shared_off;
    if (own_scratch) {
        if (sl->step != step)
            return e->st = tide_err(e->ctx, TIDE_E_INVALID, "plan: internal error: op %d has no scratch", in.op);
        in.scratch_off = sl->off;
        waits_add_release(e, &w, sl->pre, sl->pre_step);
    }
    e->compute_step = step;
    int c = engine_emit(e, &in, &w);
    if (c < 0) return e->st;
    if (own_scratch) {
        if (sl->blk) {
            int rel[TIDE_STREAM_COUNT];
            release_one(rel, TIDE_STREAM_COMPUTE, c);
            space_released(e, sl->off, sl->blk->size, c, -1);
            tide_arena_release(&e->sp.dev, sl->blk, rel, -1);
        }
        sl->step = -1;
        sl->blk = NULL;
    }
    for (int i = 0; i < op->n_in; i++) {
        engine_tensor *T = &e->t[op->in[i]];
        if (T->in_place) T->cp[TIDE_TIER_HOST].r_ins[TIDE_STREAM_COMPUTE] = c;
        else T->r_ins[TIDE_STREAM_COMPUTE] = c;
        T->last_use = step;
    }
    for (int j = 0; j < op->n_out; j++) {
        engine_tensor *T = &e->t[op->out[j]];
        T->last_use = step;
        if (T->in_place) {
            host_written(e, op->out[j], &T->cp[TIDE_TIER_HOST], c, TIDE_STREAM_COMPUTE);
            continue;
        }
        T->dev = DEV_VALID;
        T->w_ins = c;
        for (int s = 0; s < TIDE_STREAM_COUNT; s++) T->r_ins[s] = -1;
        T->cp[TIDE_TIER_HOST].valid = T->cp[TIDE_TIER_SSD].valid = false;
    }
    /* After the op: drops of what died, final stores. */
    int ts[TIDE_OP_MAX_IN + TIDE_OP_MAX_OUT];
    bool is_in[TIDE_OP_MAX_IN + TIDE_OP_MAX_OUT];
    int n = op_distinct_tensors(op, ts, is_in);
    for (int i = 0; i < n; i++) {
        int t = ts[i];
        engine_tensor *T = &e->t[t];
        if (T->in_place || T->warm) continue; /* where they live for the whole plan */
        bool written = tide_op_writes(op, t);
        int nrw = 0;
        int next = tide_lifetime_next_use(&e->lt, t, step, &nrw);
        bool dead = next == TIDE_NEVER || nrw == TIDE_USE_WRITE;
        /* a streamed role_persistent tensor leaves after its last use of the
         * iteration (a dirty one through a STORE home) */
        bool leaves = e->stream && e->stream[t] && engine_pos(e, step) == tide_lifetime_last_op(&e->lt, t);
        if (T->doomed && T->doom_step == step) {
            if (engine_drop_dev(e, t, TIDE_STREAM_COMPUTE, step) < 0) return e->st;
            T->doomed = false;
            if (engine_drop_spills(e, t, step, true) < 0) return e->st;
            continue;
        }
        if (written && engine_drop_spills(e, t, step, false) < 0) return e->st;
        int sidx = -1;
        tide_tier home = e->plan->home[t];
        if (role_homebound(T->role) && !T->cp[home].valid &&
            ((written && step == tide_lifetime_last_write(&e->lt, t)) || next == TIDE_NEVER || leaves)) {
            /* the final version: write it home now, the link is idle */
            if ((sidx = engine_store(e, t, home, step)) < 0) return e->st;
        }
        /* A dead value whose next write is already prepared keeps its bytes:
         * that write reuses them in place. */
        if ((dead || leaves) && !(next != TIDE_NEVER && next < e->prepared)) {
            tide_stream ds = sidx >= 0 ? e->plan->ins[sidx].stream : TIDE_STREAM_COMPUTE;
            if (engine_drop_dev(e, t, ds, step) < 0) return e->st;
            if (engine_drop_spills(e, t, step, true) < 0) return e->st;
        }
        if (drop_clean_host_spill(e, t, step) < 0) return e->st;
        if (T->blk && T->dev == DEV_VALID) space_cand_push(e, t, next);
    }
    space_resolve(e, step);
    return e->st;
}

/* ---------------------------------------------------------------- host computes */

tide_status engine_compute_host(engine *e, int step) {
    const int o = engine_op_index(e, step);
    const tide_op *op = &e->g->ops[o];
    int ts[TIDE_OP_MAX_IN + TIDE_OP_MAX_OUT];
    bool is_in[TIDE_OP_MAX_IN + TIDE_OP_MAX_OUT];
    int n = op_distinct_tensors(op, ts, is_in);
    waits w;
    waits_init(&w);
    for (int i = 0; i < n; i++) {
        int t = ts[i];
        engine_tensor *T = &e->t[t];
        const char *nm = e->g->tensors[t].name;
        if (T->warm && tide_op_writes(op, t))
            return e->st = tide_err(e->ctx, TIDE_E_UNSUPPORTED, "plan: op %d, placed on the host, writes '%s', "
                                    "which is kept warm on the device", o, nm);
        if (tide_op_reads(op, t) && !T->cp[TIDE_TIER_HOST].valid) {
            /* its value into host memory: from the device, else from SSD */
            int r = T->dev == DEV_VALID    ? engine_store(e, t, TIDE_TIER_HOST, step)
                  : T->cp[TIDE_TIER_SSD].valid ? engine_move(e, t, TIDE_TIER_SSD, step)
                                               : (e->st = tide_err(e->ctx, TIDE_E_INVALID, "plan: internal error: "
                                                                   "'%s' has no valid copy for op %d", nm, o), -1);
            if (r < 0) return e->st;
        } else if (!T->cp[TIDE_TIER_HOST].exists && engine_spill_copy(e, t, TIDE_TIER_HOST, &w)) {
            return e->st;
        }
    }
    tide_ins in = engine_ins_new(e, TIDE_INS_COMPUTE, TIDE_STREAM_HOST, step, -1);
    in.op = o;
    in.place = TIDE_PLACE_HOST;
    for (int k = 0; k < op->n_in + op->n_out; k++) {
        bool out = k >= op->n_in;
        engine_copy *c = &e->t[out ? op->out[k - op->n_in] : op->in[k]].cp[TIDE_TIER_HOST];
        in.host_opnd |= (uint16_t)(1u << k);
        in.dev_off[k] = engine_copy_off(c);
        waits_add(e, &w, c->w_ins);
        if (out)
            for (int s = 0; s < TIDE_STREAM_COUNT; s++) waits_add(e, &w, c->r_ins[s]);
    }
    e->compute_step = step;
    int c = engine_emit(e, &in, &w);
    if (c < 0) return e->st;
    for (int i = 0; i < n; i++) {
        engine_tensor *T = &e->t[ts[i]];
        T->last_use = step;
        if (tide_op_writes(op, ts[i])) host_written(e, ts[i], &T->cp[TIDE_TIER_HOST], c, TIDE_STREAM_HOST);
        else T->cp[TIDE_TIER_HOST].r_ins[TIDE_STREAM_HOST] = c;
    }
    /* device copies of what it wrote are stale; what died here goes everywhere */
    for (int i = 0; i < n; i++) {
        int t = ts[i], nrw = 0;
        engine_tensor *T = &e->t[t];
        if (T->in_place || T->warm) continue;
        bool written = tide_op_writes(op, t);
        int next = tide_lifetime_next_use(&e->lt, t, step, &nrw);
        bool dead = next == TIDE_NEVER || nrw == TIDE_USE_WRITE;
        /* the final version of a tensor homed on SSD (a state the host
         * updated in a spill copy) goes home now, as a device copy's STORE;
         * where host memory is short (state went to SSD for it), every
         * version does, so that its spill copy leaves the staging room */
        tide_tier home = e->plan->home[t];
        if (written && home == TIDE_TIER_SSD && role_homebound(T->role) && !T->cp[home].valid &&
            (step == tide_lifetime_last_write(&e->lt, t) || next == TIDE_NEVER || e->stage_keep) &&
            engine_move(e, t, TIDE_TIER_HOST, step) < 0)
            return e->st;
        if (written || dead) {
            if (T->dev == DEV_PLACED) engine_unplace(e, t);
            else if (T->dev == DEV_VALID && engine_drop_dev(e, t, TIDE_STREAM_COMPUTE, step) < 0) return e->st;
            T->doomed = false;
        }
        if (engine_drop_spills(e, t, step, dead && !written) < 0) return e->st;
        if (dead && written && T->role == TIDE_ROLE_TEMP && engine_drop_spills(e, t, step, true) < 0) return e->st;
        if (drop_clean_host_spill(e, t, step) < 0) return e->st;
    }
    return e->st;
}

/* ---------------------------------------------------------------- end */

tide_status engine_finish(engine *e, bool simulate, double t0) {
    tide_plan *p = e->plan;
    int end = e->n_steps;
    e->exec = end;
    /* Resident: role_persistent tensors that stayed on the device from their one
     * load (or first write) to the end of a multi-iteration plan. They stay
     * there; their homes get the final version. */
    for (int t = 0; t < e->g->n_tensors; t++) {
        engine_tensor *T = &e->t[t];
        p->resident[t] = e->n_iter > 1 && role_persistent(T->role) && T->dev == DEV_VALID && !T->evicted &&
                         T->n_loads <= 1 && !T->warm;
        if (T->warm) p->warm_off[t] = T->off;
    }
    for (int t = 0; t < e->g->n_tensors; t++) {
        engine_tensor *T = &e->t[t];
        if (T->warm) continue; /* stays, with its latest version */
        if (T->dev == DEV_PLACED) engine_unplace(e, t);
        if (T->dev != DEV_VALID) continue;
        int sidx = -1;
        tide_tier home = p->home[t];
        if (role_homebound(T->role) && !T->cp[home].valid && (sidx = engine_store(e, t, home, end - 1)) < 0) return e->st;
        if (p->resident[t]) continue;
        if (engine_drop_dev(e, t, sidx >= 0 ? p->ins[sidx].stream : TIDE_STREAM_COMPUTE, end - 1) < 0) return e->st;
    }
    for (int t = 0; t < e->g->n_tensors; t++)
        if (engine_drop_spills(e, t, end - 1, true) < 0) return e->st;

    tide_plan_stats *ps = &p->stats;
    ps->peak_device_bytes = e->sp.dev.high;
    ps->peak_host_bytes = e->host.high;
    ps->peak_ssd_bytes = e->ssd.high;
    p->host_spill_bytes = e->host.high;
    p->ssd_spill_bytes = e->ssd.high;
    double ms = 0;
    for (int s = 0; s < TIDE_STREAM_COUNT; s++)
        if (e->clk.stream_end[s] > ms) ms = e->clk.stream_end[s];
    ps->makespan_s = ms;
    tide_status nst = planner_collectives_to_net(e->ctx, p);
    if (nst) return e->st = nst;
    if (simulate) {
        tide_sim_result r;
        tide_status st = tide_simulate(p, e->hw, &r);
        if (st) return e->st = st;
        ps->makespan_s = r.makespan_s;
        tide_sim_result_free(&r);
    }
    ps->plan_seconds = tide_now() - t0;
    return TIDE_OK;
}

