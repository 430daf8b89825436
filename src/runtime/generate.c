/*
 * generate.c - the LLaMA client of the runtime: a forward pass and
 * generation (greedy through the graph's argmax, or drawn by a sampler from
 * the last logits; stop ids, a per-token callback, continuation from a
 * cache that holds a prefix) through the model's graphs, one graph per shape (batch, tokens,
 * which logits, fresh cache or not), two kept at a time (the prefill's and the
 * decode step's). The graph's inputs ("tokens", "pos", with a LoRA adapter
 * "lora_scale") and outputs ("logits",
 * "next_token") are bound by name; the engines know no model.
 */
#include "runtime/model_int.h"

#include <string.h>

/* A graph's shape: what tells one slot from another. */
typedef struct slot_key {
    int batch, seq;
    bool all_logits, fresh, row_pos;
    int cache_row;
} slot_key;

/* The slot of the graph of this shape, made when missing (the least
 * recently run slot goes). `fresh`: the run starts at position 0, so the
 * caches are written without being read (and never loaded when offloading). */
static tide_status get_slot_key(tide_model *m, const slot_key *k, graph_slot **out) {
    graph_slot *victim = &m->slots[0];
    for (int i = 0; i < MODEL_SLOTS; i++) {
        graph_slot *s = &m->slots[i];
        if (s->g && s->batch == k->batch && s->seq == k->seq && s->all_logits == k->all_logits &&
            s->fresh == k->fresh && s->row_pos == k->row_pos && s->cache_row == k->cache_row) {
            s->used = ++m->slot_clock;
            *out = s;
            return TIDE_OK;
        }
        if (!s->g ? victim->g != NULL : victim->g && s->used < victim->used) victim = s;
    }
    tide_llama_graph_opts go = {.batch = k->batch, .seq = k->seq, .ctx_len = m->ctx_len, .all_logits = k->all_logits,
                                .fresh_cache = k->fresh, .row_pos = k->row_pos, .cache_row = k->cache_row,
                                .cache_dtype = m->cache_dtype};
    tide_graph *g = NULL;
    tide_status st = tide_llama_build(m->ctx, &m->cfg, &go, &g);
    if (st) return st;
    graph_slot *s = victim;
    if (m->last_planned == s) m->last_planned = NULL;
    tide_model_slot_clear(s);
    *s = (graph_slot){.g = g, .batch = k->batch, .seq = k->seq, .all_logits = k->all_logits, .fresh = k->fresh,
                      .row_pos = k->row_pos, .cache_row = k->cache_row, .used = ++m->slot_clock};
    s->logits = tide_malloc(tide_graph_tensor_bytes(g, tide_graph_find(g, "logits")));
    s->next = tide_malloc(tide_graph_tensor_bytes(g, tide_graph_find(g, "next_token")));
    if (!s->logits || !s->next) {
        tide_model_slot_clear(s);
        return tide_err(m->ctx, TIDE_E_NOMEM, "out of memory for a graph's outputs");
    }
    *out = s;
    return TIDE_OK;
}

static tide_status get_slot(tide_model *m, int batch, int seq, bool all_logits, bool fresh, graph_slot **out) {
    slot_key k = {.batch = batch, .seq = seq, .all_logits = all_logits, .fresh = fresh};
    return get_slot_key(m, &k, out);
}

/* Runs slot s once on the model's engine and folds its logits into the
 * model's hash. Outputs the caller does not want (NULL) go to the slot's own
 * buffers. */
static tide_status run_slot(tide_model *m, graph_slot *s, const int32_t *tokens, const int32_t *pos, float *logits,
                            int32_t *next) {
    if (!logits) logits = s->logits;
    if (!next) next = s->next;
    /* with a LoRA adapter, its scale (alpha / r) I is an input too */
    tide_binding in[3] = {{"tokens", (void *)tokens}, {"pos", (void *)pos}, {"lora_scale", m->lora_scale}};
    const int n_in = m->lora_scale ? 3 : 2;
    tide_binding out[2] = {{"logits", logits}, {"next_token", next}};
    tide_status st;
    if (m->engine == TIDE_ENGINE_PLAIN) {
        st = tide_plain_run(m, s->g, in, n_in, out, 2);
    } else {
        tide_binding io[5] = {out[0], out[1], in[0], in[1], in[2]};
        st = tide_planned_run(m, s, io, 2 + n_in);
    }
    if (!st)
        m->logits_hash = tide_hash_bytes(m->logits_hash, logits, tide_graph_tensor_bytes(s->g, tide_graph_find(s->g, "logits")));
    return st;
}

/* Every id of tokens[0..n) within the vocabulary; the cause on ctx. */
static tide_status check_tokens(const tide_model *m, tide_ctx *ctx, const int32_t *tokens, int n) {
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= m->cfg.vocab_size)
            return tide_err(ctx, TIDE_E_RANGE, "token id %d at position %d is outside the vocabulary "
                            "(0 to %d)", tokens[i], i, m->cfg.vocab_size - 1);
    return TIDE_OK;
}

/* The model's byte figures of a generation's statistics g: weights, cache,
 * and the peak (offloaded: theirs plus the plans' highest arena byte). */
static void model_bytes(const tide_model *m, tide_gen_stats *g) {
    g->peak_bytes = m->offload ? m->weight_bytes + m->state_bytes + g->peak_device_bytes : m->peak_bytes;
    g->weight_bytes = m->weight_bytes;
    g->state_bytes = m->state_bytes;
}

tide_status tide_model_forward(tide_model *m, const int32_t *tokens, int batch, int seq,
                               int start_pos, float *logits) {
    if (batch < 1 || seq < 1 || batch > m->max_batch)
        return tide_err(m->ctx, TIDE_E_INVALID, "batch %d (model holds %d) and seq %d must be >= 1",
                        batch, m->max_batch, seq);
    if (start_pos < 0 || (int64_t)start_pos + seq > m->ctx_len)
        return tide_err(m->ctx, TIDE_E_RANGE, "positions %d..%d exceed the cache length %d", start_pos,
                        start_pos + seq - 1, m->ctx_len);
    tide_status st = check_tokens(m, m->ctx, tokens, batch * seq);
    if (st) return st;
    graph_slot *s = NULL;
    if ((st = get_slot(m, batch, seq, true, start_pos == 0, &s))) return st;
    int32_t *pos = tide_malloc((size_t)seq * sizeof *pos);
    if (!pos) return tide_err(m->ctx, TIDE_E_NOMEM, "out of memory");
    for (int i = 0; i < seq; i++) pos[i] = start_pos + i;
    st = run_slot(m, s, tokens, pos, logits, NULL);
    tide_free(pos);
    return st;
}

/* The next id after a run of slot s: the graph's argmax, or the sampler's
 * draw from the logits the run left in the slot. */
static tide_status next_id(graph_slot *s, const tide_gen_opts *o, int32_t graph_next, int32_t *id) {
    if (!o->sampler) {
        *id = graph_next;
        return TIDE_OK;
    }
    /* the sampler records its errors on its own context */
    tide_status st = tide_sampler_sample(o->sampler, s->logits, id);
    return st ? st : tide_sampler_accept(o->sampler, *id);
}

/* true when id ends the generation (o->stop_ids). */
static bool is_stop(const tide_gen_opts *o, int32_t id) {
    for (int i = 0; i < o->n_stop_ids; i++)
        if (o->stop_ids[i] == id) return true;
    return false;
}

tide_status tide_model_check_generate(const tide_model *m, tide_ctx *ctx, const int32_t *prompt, int n_prompt,
                                      int max_new, const tide_gen_opts *opts, const int32_t *out_tokens) {
    static const tide_gen_opts none;
    const tide_gen_opts *o = opts ? opts : &none;
    if (!ctx) ctx = m->ctx;
    TIDE_OPTS_SIZE_CHECK(ctx, tide_gen_opts, opts);
    int start = o->start_pos;
    if (n_prompt < 1 || !prompt || max_new < 0 || start < 0 || start >= n_prompt)
        return tide_err(ctx, TIDE_E_INVALID, "a prompt of at least one token past start_pos %d is needed "
                        "(%d tokens given)", start, n_prompt);
    if (o->n_stop_ids < 0 || (o->n_stop_ids && !o->stop_ids))
        return tide_err(ctx, TIDE_E_INVALID, "%d stop ids given without their array", o->n_stop_ids);
    if (max_new > 0 && !out_tokens) return tide_err(ctx, TIDE_E_INVALID, "no room for the generated tokens");
    if ((int64_t)n_prompt + max_new - 1 > m->ctx_len)
        return tide_err(ctx, TIDE_E_RANGE, "%d prompt + %d new tokens need %d positions; the cache "
                        "holds %d", n_prompt, max_new, n_prompt + max_new - 1, m->ctx_len);
    return check_tokens(m, ctx, prompt, n_prompt);
}

tide_status tide_model_generate_ex(tide_model *m, const int32_t *prompt, int n_prompt, int max_new,
                                   const tide_gen_opts *opts, int32_t *out_tokens, int *n_out,
                                   tide_gen_stats *stats) {
    static const tide_gen_opts none;
    const tide_gen_opts *o = opts ? opts : &none;
    if (n_out) *n_out = 0;
    int start = o->start_pos;
    tide_status st = tide_model_check_generate(m, m->ctx, prompt, n_prompt, max_new, o, out_tokens);
    if (st) return st;
    int n_pre = n_prompt - start;
    int32_t *pos = tide_malloc((size_t)n_pre * sizeof *pos);
    if (!pos) return tide_err(m->ctx, TIDE_E_NOMEM, "out of memory");
    for (int i = 0; i < n_pre; i++) pos[i] = start + i;
    memset(&m->acc, 0, sizeof m->acc);
    for (int i = 0; i < MODEL_SLOTS; i++) m->slots[i].gen_runs = 0;
    /* a warm region chosen by this generation weighs its own decode steps */
    m->warm_decode = TIDE_MIN(TIDE_MAX(max_new - 1, 0), MODEL_WARM_DECODE_STEPS);
    m->logits_hash = 0;
    graph_slot *s = NULL;
    int32_t next = 0, id = 0;
    int n = 0;
    bool stop = false;
    double t0 = tide_now(), pred0 = 0;
    if (max_new > 0) {
        st = get_slot(m, 1, n_pre, false, start == 0, &s);
        if (!st) st = run_slot(m, s, prompt + start, pos, NULL, &next);
        if (!st) st = next_id(s, o, next, &id);
        if (!st) {
            out_tokens[n++] = id;
            stop = is_stop(o, id) || (o->on_token && o->on_token(o->user, id));
        }
        pred0 = m->acc.predicted_s;
    }
    double t1 = tide_now();
    tide_free(pos);
    while (!st && !stop && n < max_new) {
        int32_t p = n_prompt + n - 1, tok = id;
        st = get_slot(m, 1, 1, false, false, &s);
        if (!st) st = run_slot(m, s, &tok, &p, NULL, &next);
        if (!st) st = next_id(s, o, next, &id);
        if (st) break;
        out_tokens[n++] = id;
        stop = is_stop(o, id) || (o->on_token && o->on_token(o->user, id));
        tide_progress(m->ctx, "token", (uint64_t)n, (uint64_t)max_new);
    }
    double t2 = tide_now();
    if (st) return st;
    tide_gen_stats r = m->acc;
    r.prefill_s = t1 - t0;
    r.decode_s = t2 - t1;
    r.prefill_tokens = max_new > 0 ? n_pre : 0;
    r.decode_tokens = n > 1 ? n - 1 : 0;
    r.prefill_tokens_per_s = r.prefill_s > 0 ? r.prefill_tokens / r.prefill_s : 0;
    r.decode_tokens_per_s = r.decode_s > 0 ? r.decode_tokens / r.decode_s : 0;
    model_bytes(m, &r);
    r.predicted_prefill_s = pred0;
    r.logits_hash = m->logits_hash;
    r.batch = 1;
    if (stats) *stats = r;
    if (n_out) *n_out = n;
    return TIDE_OK;
}

/* ---------------------------------------------------------------- batches */

/* The next id of a batch row b after a run of slot s: the graph's argmax,
 * or the sampler's draw from row b of the logits. */
static tide_status next_id_row(const tide_model *m, graph_slot *s, const tide_gen_opts *o, int b, int32_t *id) {
    if (!o->sampler) {
        *id = s->next[b];
        return TIDE_OK;
    }
    tide_status st = tide_sampler_sample(o->sampler, s->logits + (size_t)b * (size_t)m->cfg.vocab_size, id);
    return st ? st : tide_sampler_accept(o->sampler, *id);
}

/* A cache row of a batch while it runs: the request in it (NULL: free). */
typedef struct batch_seq {
    tide_gen_request *r;
    const tide_gen_opts *o;
    bool active;    /* has a next step to run */
    int32_t last;   /* the id its next step reads */
    uint64_t hash;  /* of its own logits */
    double t_dec;   /* when its decode steps could begin (its prefill's end) */
    double end;     /* when its last id came */
    tide_gen_stats acc0; /* the batch's counters when it was admitted */
} batch_seq;

typedef struct batch_run {
    tide_model *m;
    const tide_batch_hooks *h;
    batch_seq q[TIDE_MAX_BATCH]; /* by cache row */
    int rows;                    /* rows it may use */
    bool rows_alone;             /* the batch's decode graph could not be planned */
    bool prefill_alone;          /* nor a prefill of several prompts */
    tide_status first;           /* the first failure of a request */
    int n_run, batched, max_steps;
    double prefill_s;
    int prefill_tokens, decode_tokens;
} batch_run;

/* Request r has ended (its status set): its statistics, then the caller
 * told (after which r is not touched). */
static void batch_end(batch_run *br, tide_gen_request *r, const batch_seq *q) {
    if (r->status && !br->first) br->first = r->status;
    if (!r->status) {
        /* the counters of the forwards run while it was in the batch */
        tide_gen_stats g = br->m->acc;
        if (q) {
            g.bytes_h2d -= q->acc0.bytes_h2d;
            g.bytes_d2h -= q->acc0.bytes_d2h;
            g.bytes_ssd_read -= q->acc0.bytes_ssd_read;
            g.bytes_ssd_write -= q->acc0.bytes_ssd_write;
            g.predicted_s -= q->acc0.predicted_s;
            g.exec_s -= q->acc0.exec_s;
            g.ssd_read_s -= q->acc0.ssd_read_s;
        }
        g.batch = br->n_run;
        g.batch_steps = br->batched;
        g.prefill_s = r->stats.prefill_s;
        g.decode_s = q && r->n_out > 1 ? q->end - q->t_dec : 0;
        g.prefill_tokens = r->max_new > 0 ? r->n_prompt : 0;
        g.decode_tokens = r->n_out > 1 ? r->n_out - 1 : 0;
        g.prefill_tokens_per_s = g.prefill_s > 0 ? g.prefill_tokens / g.prefill_s : 0;
        g.decode_tokens_per_s = g.decode_s > 0 ? g.decode_tokens / g.decode_s : 0;
        model_bytes(br->m, &g);
        g.logits_hash = q ? q->hash : 0;
        r->stats = g;
        br->prefill_s += g.prefill_s;
        br->prefill_tokens += g.prefill_tokens;
        br->decode_tokens += g.decode_tokens;
    }
    if (br->h && br->h->done) br->h->done(br->h->user, r);
}

/* Takes the id row b of slot s gives for the request in row `row`; ends it
 * after a stop id, a callback's stop or its max_new. */
static tide_status batch_take(batch_run *br, graph_slot *s, int row, int b) {
    tide_model *m = br->m;
    batch_seq *q = &br->q[row];
    const uint64_t V = (uint64_t)m->cfg.vocab_size;
    q->hash = tide_hash_bytes(q->hash, s->logits + (size_t)b * V, V * sizeof(float));
    int32_t id = 0;
    tide_status st = next_id_row(m, s, q->o, b, &id);
    if (st) return st;
    q->r->out_tokens[q->r->n_out++] = id;
    q->last = id;
    q->end = tide_now();
    if (is_stop(q->o, id) || (q->o->on_token && q->o->on_token(q->o->user, id)) || q->r->n_out >= q->r->max_new) {
        batch_seq ended = *q;
        *q = (batch_seq){0}; /* the row is free from here on */
        ended.r->status = TIDE_OK;
        batch_end(br, ended.r, &ended);
    }
    return TIDE_OK;
}

/* Takes request r into the batch: refused (and ended) when its arguments are
 * bad, ended at once with nothing to generate, else given the lowest free
 * row, to be prefilled (batch_prefill). Returns whether it took a row. */
static bool batch_admit(batch_run *br, tide_gen_request *r) {
    static const tide_gen_opts none;
    tide_model *m = br->m;
    const tide_gen_opts *o = r->opts ? r->opts : &none;
    r->n_out = 0;
    memset(&r->stats, 0, sizeof r->stats);
    r->status = tide_model_check_generate(m, m->ctx, r->prompt, r->n_prompt, r->max_new, o, r->out_tokens);
    if (!r->status && o->start_pos)
        r->status = tide_err(m->ctx, TIDE_E_INVALID, "a batch's generations start at position 0 (start_pos %d): "
                             "their cache rows are the batch's", o->start_pos);
    if (r->status || r->max_new == 0) { /* refused, or nothing to run (as tide_model_generate_ex) */
        batch_end(br, r, NULL);
        return false;
    }
    int row = 0;
    while (row < br->rows && br->q[row].r) row++;
    br->q[row] = (batch_seq){.r = r, .o = o, .acc0 = m->acc}; /* active once prefilled */
    br->n_run++;
    br->max_steps = TIDE_MAX(br->max_steps, r->max_new - 1);
    /* a warm region chosen now weighs the decode steps of the batch so far */
    m->warm_decode = TIDE_MIN(br->max_steps, MODEL_WARM_DECODE_STEPS);
    return true;
}

/* Prefills the rows taken but not yet prefilled: those of one prompt length
 * in consecutive rows as one forward (a batch of sequences at positions
 * 0..T-1, each row computing what it computes alone), the others alone, and
 * all alone from the first such forward the budget cannot plan.
 * A failing run is returned (its requests still in their rows, to fail
 * with the others). */
static tide_status batch_prefill(batch_run *br) {
    tide_model *m = br->m;
    tide_status st = TIDE_OK;
    for (int r0 = 0; r0 < br->rows && !st; r0++) {
        batch_seq *q0 = &br->q[r0];
        if (!q0->r || q0->active) continue;
        const int T = q0->r->n_prompt;
        int g = 1;
        while (!br->prefill_alone && r0 + g < br->rows && br->q[r0 + g].r && !br->q[r0 + g].active &&
               br->q[r0 + g].r->n_prompt == T)
            g++;
        int32_t *tok = tide_malloc((size_t)g * (size_t)T * sizeof *tok), *pos = tide_malloc((size_t)T * sizeof *pos);
        if (!tok || !pos) {
            tide_free(tok);
            tide_free(pos);
            return tide_err(m->ctx, TIDE_E_NOMEM, "out of memory");
        }
        for (int i = 0; i < g; i++) memcpy(tok + (size_t)i * T, br->q[r0 + i].r->prompt, (size_t)T * sizeof *tok);
        for (int t = 0; t < T; t++) pos[t] = t;
        double t0 = tide_now();
        slot_key k = {.batch = g, .seq = T, .fresh = true, .cache_row = r0};
        graph_slot *s = NULL;
        st = get_slot_key(m, &k, &s);
        if (!st) st = run_slot(m, s, tok, pos, NULL, NULL);
        tide_free(tok);
        tide_free(pos);
        if (st == TIDE_E_INFEASIBLE && g > 1) { /* the budget holds them one at a time */
            br->prefill_alone = true;
            tide_err_clear(m->ctx);
            st = TIDE_OK;
            r0--;
            continue;
        }
        double t1 = tide_now();
        for (int i = 0; i < g; i++) {
            batch_seq *q = &br->q[r0 + i];
            q->r->stats.prefill_s = t1 - t0;
            q->t_dec = t1;
            q->active = true;
        }
        if (g > 1 && !st) br->batched++;
        for (int i = 0; i < g && !st; i++) st = batch_take(br, s, r0 + i, i);
        r0 += g - 1;
    }
    return st;
}

/* One decode step of every active row: one forward of the rows up to the
 * highest active one (the ended rows below it padding: position 0 of their
 * own row), or, where that graph cannot be planned, each row alone. */
static tide_status batch_step(batch_run *br) {
    tide_model *m = br->m;
    int hi = -1, n_active = 0;
    for (int i = 0; i < br->rows; i++)
        if (br->q[i].active) hi = i, n_active++;
    tide_status st = TIDE_OK;
    if (hi > 0 && !br->rows_alone) {
        int B = hi + 1;
        int32_t tok[TIDE_MAX_BATCH], pos[TIDE_MAX_BATCH];
        for (int b = 0; b < B; b++) {
            const batch_seq *q = &br->q[b];
            tok[b] = q->active ? q->last : 0;
            pos[b] = q->active ? q->r->n_prompt + q->r->n_out - 1 : 0;
        }
        slot_key k = {.batch = B, .seq = 1, .row_pos = true};
        graph_slot *s = NULL;
        if (!(st = get_slot_key(m, &k, &s))) st = run_slot(m, s, tok, pos, NULL, NULL);
        if (st != TIDE_E_INFEASIBLE) {
            if (st) return st;
            if (n_active > 1) br->batched++;
            for (int b = 0; b < B && !st; b++)
                if (br->q[b].active) st = batch_take(br, s, b, b);
            return st;
        }
        br->rows_alone = true; /* below: one at a time, from now on */
        tide_err_clear(m->ctx);
        st = TIDE_OK;
    }
    for (int i = 0; i < br->rows && !st; i++) {
        batch_seq *q = &br->q[i];
        if (!q->active) continue;
        slot_key k = {.batch = 1, .seq = 1, .cache_row = i};
        int32_t tok = q->last, p = q->r->n_prompt + q->r->n_out - 1;
        graph_slot *s = NULL;
        if (!(st = get_slot_key(m, &k, &s)) && !(st = run_slot(m, s, &tok, &p, NULL, NULL)))
            st = batch_take(br, s, i, 0);
    }
    return st;
}

tide_status tide_model_generate_batch_ex(tide_model *m, tide_gen_request *reqs, int n, const tide_batch_hooks *h,
                                         tide_gen_stats *batch_stats) {
    if (batch_stats) memset(batch_stats, 0, sizeof *batch_stats);
    const int rows = TIDE_MIN(m->max_batch, TIDE_MAX_BATCH);
    if (n < 0 || (n > 0 && !reqs) || n > rows || (n == 0 && !(h && h->admit)))
        return tide_err(m->ctx, TIDE_E_INVALID, "a batch of %d generations (the model holds %d sequences)", n,
                        m->max_batch);
    batch_run *br = tide_calloc(1, sizeof *br);
    if (!br) return tide_err(m->ctx, TIDE_E_NOMEM, "out of memory");
    br->m = m;
    br->h = h;
    br->rows = rows;
    /* the given requests longest first: rows end from the highest down, and
     * the forward shrinks */
    tide_gen_request *order[TIDE_MAX_BATCH];
    for (int i = 0; i < n; i++) {
        int j = i;
        for (; j > 0 && order[j - 1]->max_new < reqs[i].max_new; j--) order[j] = order[j - 1];
        order[j] = &reqs[i];
    }
    for (int i = 0; i < n; i++)
        br->max_steps = TIDE_MAX(br->max_steps, reqs[i].max_new - 1);
    memset(&m->acc, 0, sizeof m->acc);
    for (int i = 0; i < MODEL_SLOTS; i++) m->slots[i].gen_runs = 0;
    m->warm_decode = TIDE_MIN(TIDE_MAX(br->max_steps, 0), MODEL_WARM_DECODE_STEPS);
    m->logits_hash = 0;
    tide_status st = TIDE_OK;
    for (int i = 0; i < n; i++) batch_admit(br, order[i]);
    double t1 = 0, pred0 = 0; /* when the first prompts were prefilled, and their prediction */
    int steps = 0;
    while (!st) {
        /* requests joining between steps, into free rows; then the new
         * rows' prompts */
        for (;;) {
            int free_rows = 0;
            for (int i = 0; i < rows; i++) free_rows += !br->q[i].r;
            tide_gen_request *nr = NULL;
            if (!free_rows || !h || !h->admit || !h->admit(h->user, &nr) || !nr) break;
            batch_admit(br, nr);
        }
        st = batch_prefill(br);
        if (steps == 0) pred0 = m->acc.predicted_s, t1 = tide_now();
        bool any = false;
        for (int i = 0; i < rows; i++) any |= br->q[i].active;
        if (st || !any) break;
        st = batch_step(br);
        tide_progress(m->ctx, "token", (uint64_t)++steps, (uint64_t)br->max_steps);
    }
    /* a failing run fails every request not yet ended; so do those given
     * but never reached */
    for (int i = 0; st && i < rows; i++)
        if (br->q[i].r) {
            tide_gen_request *r = br->q[i].r;
            br->q[i] = (batch_seq){0};
            r->status = st;
            batch_end(br, r, NULL);
        }
    tide_gen_stats acc = m->acc;
    acc.batch = br->n_run;
    acc.batch_steps = br->batched;
    acc.predicted_prefill_s = pred0;
    model_bytes(m, &acc);
    acc.prefill_s = br->prefill_s;
    acc.decode_s = tide_now() - t1;
    acc.prefill_tokens = br->prefill_tokens;
    acc.decode_tokens = br->decode_tokens;
    acc.logits_hash = m->logits_hash;
    if (batch_stats) *batch_stats = acc;
    tide_status first = br->first ? br->first : st;
    tide_free(br);
    return first;
}

tide_status tide_model_generate_batch(tide_model *m, tide_gen_request *reqs, int n, tide_gen_stats *batch_stats) {
    if (!reqs || n < 1) return tide_err(m->ctx, TIDE_E_INVALID, "a batch of %d generations", n);
    return tide_model_generate_batch_ex(m, reqs, n, NULL, batch_stats);
}

tide_status tide_model_generate(tide_model *m, const int32_t *prompt, int n_prompt, int n_new,
                                int32_t *out_tokens, tide_gen_stats *stats) {
    return tide_model_generate_ex(m, prompt, n_prompt, n_new, NULL, out_tokens, NULL, stats);
}

tide_status tide_model_write_trace(tide_model *m, const char *json_path, const char *svg_path) {
    const tide_plan *p = NULL;
    const tide_sim_event *tl = NULL;
    tide_status st = tide_model_last_run(m, &p, &tl);
    if (st) return st;
    if (json_path && (st = tide_trace_write(p, tl, p->n_ins, json_path))) return st;
    if (svg_path) {
        tide_sim_result sim;
        if ((st = tide_simulate(p, &m->hw, &sim))) return st;
        const tide_sim_event *tls[2] = {tl, sim.events};
        const char *labels[2] = {"measured", "predicted"};
        st = tide_trace_svg_write(p, tls, labels, 2, svg_path);
        tide_sim_result_free(&sim);
    }
    return st;
}
