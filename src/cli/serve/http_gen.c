/*
 * http_gen.c - `tide serve`'s generations: a request is prepared (its model
 * acquired from the pool and held loaded; the prompt rendered and encoded,
 * checked against the context, its sampler made) on the thread of its
 * connection, so that what is wrong with it is answered with a status before
 * any stream begins, and then run through the pool, its text made by a
 * tide_textgen (stop strings held back until they cannot match).
 *
 * The model is the pool's to load, keep or evict (src/serve/pool_models.c):
 * a request holds it loaded from its preparation to its end. The model's
 * text (tokenizer, chat template, stop ids) is opened on its first request.
 *
 * The prompt is encoded as `tide run` encodes it: a completion's prompt with
 * the tokenizer's special tokens added (the BOS), a chat rendered by the
 * template (which writes the BOS) without; special tokens' text is parsed as
 * the special token in both (the template's markers are special tokens).
 * Sampling is tide_sampler's; with temperature 0 (the default) greedy, so a
 * completion equals `tide run --prompt` on the same model, text for text.
 *
 * Threads: every request waits on its own thread; the pool runs a model's
 * requests that wait together as one batch (up to --max-batch), from
 * whichever of their threads leads it, so a request's token callback (its
 * text, its stream) may run on another request's thread while its own
 * waits: it touches only the request's own state (and the stream's, under
 * its lock). A failure's message comes back on the request's own context
 * (tide_pool_generate_on). A tokenizer encodes on one thread at a time
 * (serve_model.mu); decoding (one tide_detok per request) only reads it.
 */
#include "cli/serve/http_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Encodes text (m->mu held) into p->ids. */
static int encode(serve_model *m, const char *text, size_t len, unsigned flags, serve_prepared *p, serve_error *e) {
    tide_status st = tide_tokenizer_encode_prompt(m->tok, text, len, flags, &p->ids, &p->n_ids);
    if (st == TIDE_E_NOMEM) return serve_fail(e, 500, "server_error", "out of memory");
    if (st) return serve_fail(e, 400, "invalid_request_error", "%s", tide_ctx_last_error(m->ctx));
    return 0;
}

/* Opens m's text on its first request (m->mu held): the tokenizer, which
 * must belong to the checkpoint ck, the chat template, the stop ids. On
 * failure nothing is kept, so that a later request tries again. */
static int open_text(serve_server *s, serve_model *m, tide_checkpoint *ck, serve_error *e) {
    if (m->tok) return 0;
    if (!m->ctx && !(m->ctx = tide_ctx_new())) return serve_fail(e, 500, "server_error", "out of memory");
    const tide_llama_config *cfg = tide_checkpoint_config(ck);
    int rc = 0;
    if (tide_tokenizer_open(m->ctx, m->dir, &m->tok))
        rc = serve_fail(e, 500, "server_error", "the model '%s' has no usable tokenizer: %s", m->name,
                        tide_ctx_last_error(m->ctx));
    else if (tide_tokenizer_n_vocab(m->tok) > cfg->vocab_size)
        rc = serve_fail(e, 500, "server_error", "the model '%s': the tokenizer's %d ids exceed the model's "
                        "vocabulary of %d: they do not belong together", m->name, tide_tokenizer_n_vocab(m->tok),
                        cfg->vocab_size);
    if (!rc && tide_chat_template_get(m->ctx, m->tok, NULL, &m->tmpl)) {
        snprintf(m->tmpl_err, sizeof m->tmpl_err, "%s", tide_ctx_last_error(m->ctx));
        m->tmpl = NULL;
    }
    if (!rc && (cli_stop_ids(m->tok, NULL, &m->stop_ids, &m->n_stop_ids) ||
                cli_stop_ids(m->tok, m->tmpl, &m->chat_stop_ids, &m->n_chat_stop_ids)))
        rc = serve_fail(e, 500, "server_error", "out of memory");
    if (rc) {
        if (!s->o.quiet) fprintf(stderr, "tide serve: %s\n", e->msg);
        free(m->stop_ids);
        free(m->chat_stop_ids);
        m->stop_ids = m->chat_stop_ids = NULL;
        tide_chat_template_free(m->tmpl);
        tide_tokenizer_free(m->tok);
        m->tmpl = NULL;
        m->tok = NULL;
    }
    return rc;
}

void serve_models_free(serve_server *s) {
    for (int i = 0; i < s->n_models; i++) {
        serve_model *m = &s->models[i];
        free(m->stop_ids);
        free(m->chat_stop_ids);
        tide_chat_template_free(m->tmpl);
        tide_tokenizer_free(m->tok);
        tide_ctx_free(m->ctx);
        pthread_mutex_destroy(&m->mu);
    }
}

int serve_prepare(serve_server *s, const serve_request *r, serve_prepared *p, serve_error *e) {
    memset(p, 0, sizeof *p);
    serve_model *m = p->m = r->model;
    p->s = s;
    if (!(p->ctx = tide_ctx_new())) return serve_fail(e, 500, "server_error", "out of memory");
    tide_status st = tide_pool_acquire(s->o.pool, m->name, p->ctx, &p->w);
    if (st == TIDE_E_BUSY) return serve_fail(e, 503, "server_overloaded", "%s", tide_ctx_last_error(p->ctx));
    if (st) return serve_fail(e, 500, "server_error", "%s", tide_ctx_last_error(p->ctx));
    p->ctx_len = tide_pool_workload_ctx_len(p->w);
    pthread_mutex_lock(&m->mu);
    int trc = open_text(s, m, tide_pool_workload_checkpoint(p->w), e);
    pthread_mutex_unlock(&m->mu);
    if (trc) return -1;
    char *chat = NULL;
    size_t len = 0;
    if (r->chat) {
        if (!m->tmpl)
            return serve_fail(e, 400, "invalid_request_error", "the model '%s' has no chat template (%s): use "
                              "/v1/completions", m->name, m->tmpl_err);
        if (tide_chat_format(p->ctx, m->tmpl, r->msgs, r->n_msgs, true, &chat, &len))
            return serve_fail(e, 400, "invalid_request_error", "'messages': %s", tide_ctx_last_error(p->ctx));
    }
    const char *text = r->chat ? chat : r->prompt;
    if (!r->chat) len = strlen(text);
    int rc = 0;
    if (len == 0) {
        rc = serve_fail(e, 400, "invalid_request_error", "the prompt is empty");
    } else {
        pthread_mutex_lock(&m->mu);
        rc = encode(m, text, len, r->chat ? 0 : TIDE_TOKENIZE_ADD_SPECIAL, p, e);
        pthread_mutex_unlock(&m->mu);
    }
    tide_free_text(chat);
    if (rc) return -1;
    if (p->n_ids >= p->ctx_len)
        return serve_fail(e, 400, "invalid_request_error", "the prompt is %s%d tokens, longer than the model '%s' "
                          "takes: its context holds %d tokens, prompt and answer (at most %d for the prompt)",
                          p->n_ids > p->ctx_len ? "more than " : "", p->n_ids > p->ctx_len ? p->ctx_len : p->n_ids,
                          m->name, p->ctx_len, p->ctx_len - 1);
    /* n new ids need n_ids + n - 1 positions: the last id drawn is never run */
    int room = p->ctx_len - p->n_ids + 1;
    if (r->max_tokens > room)
        return serve_fail(e, 400, "invalid_request_error", "the prompt (%d tokens) and 'max_tokens' (%d) exceed the "
                          "model '%s''s context of %d tokens: at most %d new tokens fit", p->n_ids, r->max_tokens,
                          m->name, p->ctx_len, room);
    int def = r->chat ? SERVE_CHAT_MAX_TOKENS : SERVE_DEFAULT_MAX_TOKENS;
    p->max_new = r->max_tokens ? r->max_tokens : def < room ? def : room;
    tide_sampler_opts so = r->so;
    if (so.temperature > 0 && !r->seed_given) so.seed = cli_random_seed();
    if (tide_sampler_new(p->ctx, &so, tide_tokenizer_n_vocab(m->tok), &p->sampler))
        return serve_fail(e, 400, "invalid_request_error", "%s", tide_ctx_last_error(p->ctx));
    if (tide_sampler_start(p->sampler, so.seed, p->ids, p->n_ids))
        return serve_fail(e, 500, "server_error", "%s", tide_ctx_last_error(p->ctx));
    p->stop_ids = r->chat ? m->chat_stop_ids : m->stop_ids;
    p->n_stop_ids = r->chat ? m->n_chat_stop_ids : m->n_stop_ids;
    tide_textgen_opts to = tide_textgen_opts_default();
    to.stops = (const char *const *)r->stops;
    to.n_stops = r->n_stops;
    if (tide_textgen_new(p->ctx, m->tok, &to, &p->out))
        return serve_fail(e, tide_ctx_last_status(p->ctx) == TIDE_E_NOMEM ? 500 : 400,
                          tide_ctx_last_status(p->ctx) == TIDE_E_NOMEM ? "server_error" : "invalid_request_error",
                          "'stop': %s", tide_ctx_last_error(p->ctx));
    return 0;
}

typedef struct run_state {
    serve_server *s;
    serve_prepared *p;
    const atomic_bool *cancel;
    bool cancelled;
} run_state;

static int on_token(void *user, int32_t id) {
    run_state *rs = user;
    if (tide_textgen_on_token(rs->p->out, id)) return 1;
    if (atomic_load(&rs->s->stopping) || (rs->cancel && atomic_load(rs->cancel))) {
        rs->cancelled = true;
        return 1;
    }
    return 0;
}

int serve_run(serve_server *s, serve_prepared *p, void (*emit)(void *user, const char *piece, size_t n), void *user,
              const atomic_bool *cancel, serve_result *res, serve_error *e) {
    serve_model *m = p->m;
    memset(res, 0, sizeof *res);
    int32_t *gen = malloc((size_t)p->max_new * sizeof *gen);
    if (!gen) return serve_fail(e, 500, "server_error", "out of memory");
    tide_textgen_set_emit(p->out, emit, user);
    run_state rs = {.s = s, .p = p, .cancel = cancel};
    tide_gen_opts go = {.sampler = p->sampler, .stop_ids = p->stop_ids, .n_stop_ids = p->n_stop_ids,
                        .on_token = on_token, .user = &rs};
    tide_gen_stats st;
    int n_out = 0;
    tide_status ts = TIDE_OK;
    char msg[400] = "";
    if (atomic_load(&s->stopping)) rs.cancelled = true; /* not started: nothing to cancel mid-way */
    else ts = tide_pool_generate_on(s->o.pool, p->w, p->ctx, p->ids, p->n_ids, p->max_new, &go, gen, &n_out, &st);
    if (ts) snprintf(msg, sizeof msg, "%s", tide_ctx_last_error(p->ctx));
    free(gen);
    if (!ts && tide_textgen_status(p->out)) {
        ts = tide_textgen_status(p->out);
        snprintf(msg, sizeof msg, "decoding the generated tokens into text failed");
    }
    if (ts) return serve_fail(e, 500, "server_error", "generation failed (%s): %s", tide_status_str(ts), msg);
    if ((ts = tide_textgen_finish(p->out)))
        return serve_fail(e, 500, "server_error", "generation failed (%s): decoding the generated tokens into text "
                          "failed", tide_status_str(ts));
    res->text = tide_textgen_text(p->out, NULL);
    res->cancelled = rs.cancelled;
    res->finish = tide_textgen_stopped(p->out) || (n_out < p->max_new && !rs.cancelled) ? "stop" : "length";
    res->n_prompt = p->n_ids;
    res->n_gen = n_out;
    atomic_fetch_add(&m->requests, 1);
    atomic_fetch_add(&m->prompt_tokens, p->n_ids);
    atomic_fetch_add(&m->gen_tokens, n_out);
    return 0;
}

void serve_prepared_free(serve_prepared *p) {
    if (p->w) tide_pool_release(p->s->o.pool, p->w);
    tide_textgen_free(p->out);
    tide_sampler_free(p->sampler);
    tide_ctx_free(p->ctx);
    tide_free_ids(p->ids);
    memset(p, 0, sizeof *p);
}
