/*
 * cmd_chat.c - `tide chat`: a conversation with a model in the terminal.
 *
 * Each turn formats the whole conversation with the model's chat template,
 * encodes it, and prefills only what the KV cache does not already hold:
 * the cache keeps the ids of the turns before (the prompt and the answer,
 * all but the answer's last id, which was drawn and never run), and the new
 * prompt's longest common prefix with them is skipped (tide_gen_opts.
 * start_pos). When re-encoding an answer gives other ids than those drawn,
 * the prefix simply ends earlier: correct either way.
 *
 * Ctrl-C stops the answer being written (the conversation keeps what was
 * written); at the prompt it clears the line. Ctrl-D (end of input) ends the
 * chat. Input that is not a terminal is read line by line, one user turn
 * per line, and only the answers are written, one per line.
 */
#include "cli.h"
#include "cli/textgen.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef TIDE_HAVE_LIBEDIT
#include <editline/readline.h>
#endif

static const char help[] =
    "Usage: tide chat [--model PATH] [--lora DIR] [--system TEXT] [--template NAME]\n"
    "                 [--new-tokens N]\n"
    "                 [--ctx N] [--cache-type T] [sampling options] [--stop STRING]...\n"
    "                 [--budget X] [--policy P] [--host-budget X] [--ssd DIRS]\n"
    "                 [--weights-on-ssd] [--hw PROFILE] [--backend B] [--matmul M]\n"
    "                 [--threads N] [--quiet]\n"
    "\n"
    "A conversation with the model in the terminal, formatted with the model's\n"
    "chat template (tokenizer_config.json's chat_template, or a GGUF file's\n"
    "tokenizer.chat_template, its family detected: llama2, llama3, chatml,\n"
    "mistral, zephyr or gemma; or --template). Answers are\n"
    "printed as they are generated. Each turn prefills only the part of the\n"
    "conversation the KV cache does not hold yet. Lines are edited with libedit\n"
    "where tide was built with it. Ctrl-C stops the current answer; Ctrl-D ends\n"
    "the chat; /clear starts a new conversation, /exit ends it. Without a\n"
    "terminal, each input line is one user turn and each answer one output line.\n"
    "Without --model, the built-in model (random weights: its text is noise)\n"
    "with its own tokenizer and the chatml template.\n"
    "\n"
    "  --model PATH        Hugging Face-layout LLaMA checkpoint directory with a\n"
    "                      tokenizer, or a GGUF file (its tokenizer and chat\n"
    "                      template read from its metadata)\n"
    CLI_LORA_HELP
    "  --new-tokens N      the longest answer in tokens (default 512)\n"
    "  --ctx N             the conversation's length in tokens, the KV cache's size\n"
    "                      (default: the model's positions, at most 4096)\n"
    CLI_CACHE_TYPE_HELP
    "  --budget X          offload under a device budget, as in tide run (bytes,\n"
    "                      PCT%, auto, min or none; default none)\n"
    "  --policy, --host-budget, --ssd, --weights-on-ssd, --hw  as in tide run\n"
    "  --backend B         auto, cpu or cuda\n"
    "  --matmul M          auto, f32 or fast (see tide run)\n"
    "  --threads N         CPU threads (default: all cores)\n"
    "  --quiet             no progress lines and no statistics at the end\n";

typedef struct chat_job {
    cli_text_opts text;
    const char *model_dir, *lora;
    long new_tokens, ctx, threads;
    tide_dtype cache_type;
    bool quiet, budget_given;
    tide_backend_kind backend;
    tide_matmul_mode matmul;
    tide_offload_opts off;
    uint64_t host_budget;

    tide_ctx *c;
    cli_progress_state ps;
    char dir[PATH_MAX];
    tide_backend *be;
    tide_checkpoint *ck;
    tide_tokenizer *tok;
    tide_chat_template *tmpl;
    tide_model *m;
    tide_sampler *sampler;
    int32_t *stop_ids;
    int n_stop_ids;
    tide_textgen *out;         /* the answer, printed as it comes */

    tide_chat_msg *msgs;       /* the conversation; contents malloc'd */
    int n_msgs, cap_msgs;
    int32_t *cached;           /* the ids whose keys and values the cache holds */
    int n_cached;
    int32_t *gen;
    /* statistics */
    int turns;
    long gen_tokens, prefill_tokens;
    double gen_s, prefill_s;
} chat_job;

static volatile sig_atomic_t interrupted;

static void on_sigint(int sig) {
    (void)sig;
    interrupted = 1;
}

/* tide_gen_opts.on_token after each id's text: Ctrl-C stops the answer. */
static int on_token(void *user, int32_t id) {
    (void)user;
    (void)id;
    return interrupted != 0;
}

static const struct option chat_options[] = {
    {"model", required_argument, 0, 'm'},       {"new-tokens", required_argument, 0, 'n'},
    {"ctx", required_argument, 0, 'x'},         {"budget", required_argument, 0, 'B'},
    {"policy", required_argument, 0, 'P'},      {"host-budget", required_argument, 0, 'H'},
    {"ssd", required_argument, 0, 'S'},         {"weights-on-ssd", no_argument, 0, 'W'},
    {"hw", required_argument, 0, 'w'},          {"backend", required_argument, 0, 'b'},
    {"matmul", required_argument, 0, 'M'},      {"threads", required_argument, 0, 'T'},
    {"quiet", no_argument, 0, 'q'},             {"help", no_argument, 0, 'h'},
    {"cache-type", required_argument, 0, CLI_OPT_CACHE_TYPE}, {"lora", required_argument, 0, CLI_OPT_LORA},
    CLI_TEXT_OPTIONS,
    {0, 0, 0, 0},
};

static int parse_args(int argc, char **argv, chat_job *j) {
    j->new_tokens = 512;
    j->backend = TIDE_BACKEND_AUTO;
    j->off.policy = "tide";
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "h", chat_options, NULL)) != -1) {
        switch (c) {
        case 'm': j->model_dir = optarg; break;
        case CLI_OPT_LORA: j->lora = optarg; break;
        case 'n':
            if (cli_parse_int(optarg, 1, 1 << 20, &j->new_tokens)) return cli_usage_error("chat", "bad --new-tokens '%s'", optarg);
            break;
        case 'x':
            if (cli_parse_int(optarg, 2, 1 << 24, &j->ctx)) return cli_usage_error("chat", "bad --ctx '%s'", optarg);
            break;
        case CLI_OPT_CACHE_TYPE:
            if (cli_parse_cache_type(optarg, &j->cache_type)) return cli_usage_error("chat", CLI_CACHE_TYPE_ERROR, optarg);
            break;
        case 'B':
            if (cli_parse_budget(optarg, &j->off))
                return cli_usage_error("chat", "bad --budget '%s' (bytes such as 2G, a percentage such as 25%%, auto, min or none)", optarg);
            j->budget_given = true;
            break;
        case 'P':
            if (strcmp(optarg, "tide") && strcmp(optarg, "static-layer") && strcmp(optarg, "lru"))
                return cli_usage_error("chat", "unknown --policy '%s' (tide, static-layer or lru)", optarg);
            j->off.policy = optarg;
            break;
        case 'H':
            if (cli_parse_bytes(optarg, &j->host_budget) || !j->host_budget)
                return cli_usage_error("chat", "bad --host-budget '%s'", optarg);
            break;
        case 'S': j->off.ssd_dirs = optarg; break;
        case 'W': j->off.weights_on_ssd = true; break;
        case 'w': j->off.hw = optarg; break;
        case 'b':
            if (cli_parse_backend(optarg, &j->backend))
                return cli_usage_error("chat", "unknown --backend '%s' (auto, cpu or cuda)", optarg);
            break;
        case 'M':
            if (tide_matmul_parse(NULL, optarg, &j->matmul))
                return cli_usage_error("chat", "unknown --matmul '%s' (auto, f32 or fast)", optarg);
            break;
        case 'T':
            if (cli_parse_int(optarg, 1, 4096, &j->threads)) return cli_usage_error("chat", "bad --threads '%s'", optarg);
            break;
        case 'q': j->quiet = true; break;
        case 'h':
            fputs(help, stdout);
            fputs("\nSampling and text options:\n", stdout);
            fputs(cli_text_help, stdout);
            return 0;
        default: {
            int t = cli_text_option(c, optarg, "chat", &j->text);
            if (t < 0) return 2;
            if (t == 0) return cli_usage_error("chat", "unknown option");
        }
        }
    }
    if (optind != argc) return cli_usage_error("chat", "unexpected argument '%s'", argv[optind]);
    if (j->text.no_parse_special)
        return cli_usage_error("chat", "--no-parse-special does not combine with chat (the template's markers are "
                               "special tokens)");
    bool offload = j->off.budget_kind != TIDE_BUDGET_NONE;
    if (!offload && (j->off.ssd_dirs || j->off.weights_on_ssd || j->off.hw || j->host_budget || strcmp(j->off.policy, "tide")))
        return cli_usage_error("chat", "--ssd, --weights-on-ssd, --policy, --hw and --host-budget need a --budget");
    j->off.host_budget = j->host_budget;
    return -1;
}

/* Backend, checkpoint, tokenizer, template, model and sampler. Returns 0 or
 * the exit status. */
static int open_all(chat_job *j) {
    int rc;
    if (tide_backend_new(j->c, j->backend, &j->be)) return cli_fail(j->c, "backend");
    if (tide_backend_set_matmul(j->be, j->matmul)) return cli_fail(j->c, "--matmul");
    if (!j->model_dir) {
        if ((rc = cli_ensure_default_model(j->c, j->dir, sizeof j->dir, &j->ps))) return rc;
        j->model_dir = j->dir;
    }
    if (tide_checkpoint_open(j->c, j->model_dir, &j->ck)) return cli_fail(j->c, "loading the model");
    if (j->lora && tide_checkpoint_add_lora(j->ck, j->lora)) return cli_fail(j->c, "--lora");
    if (!j->off.weights_on_ssd && tide_checkpoint_prefetch(j->ck)) return cli_fail(j->c, "loading the model");
    cli_progress_end(&j->ps);
    const tide_llama_config *cfg = tide_checkpoint_config(j->ck);
    if (tide_tokenizer_open(j->c, j->model_dir, &j->tok)) return cli_fail(j->c, "the model's tokenizer");
    if (tide_tokenizer_n_vocab(j->tok) > cfg->vocab_size) {
        fprintf(stderr, "tide: chat: the tokenizer's %d ids exceed the model's vocabulary of %d (embedding rows): "
                "they do not belong together\n", tide_tokenizer_n_vocab(j->tok), cfg->vocab_size);
        return 1;
    }
    if (tide_chat_template_get(j->c, j->tok, j->text.template_name, &j->tmpl)) return cli_fail(j->c, "chat template");
    if (!j->ctx) j->ctx = cfg->max_position_embeddings < 4096 ? cfg->max_position_embeddings : 4096;
    if (j->ctx > cfg->max_position_embeddings) {
        fprintf(stderr, "tide: chat: --ctx %ld exceeds the model's %d positions\n", j->ctx, cfg->max_position_embeddings);
        return 1;
    }
    tide_model_opts mo = {.max_batch = 1, .ctx_len = (int)j->ctx, .cache_dtype = j->cache_type};
    if (tide_model_new(j->c, j->ck, j->be, &mo, &j->m)) return cli_fail(j->c, "preparing the model");
    if (j->off.budget_kind != TIDE_BUDGET_NONE && tide_model_set_offload(j->m, &j->off))
        return cli_fail(j->c, "offloading");
    if (j->text.so.temperature > 0 && !j->text.seed_given) j->text.so.seed = cli_random_seed();
    if (tide_sampler_new(j->c, &j->text.so, tide_tokenizer_n_vocab(j->tok), &j->sampler))
        return cli_fail(j->c, "sampling options");
    if (cli_stop_ids(j->tok, j->tmpl, &j->stop_ids, &j->n_stop_ids)) return 1;
    tide_textgen_opts to = tide_textgen_opts_default();
    to.stops = j->text.stops;
    to.n_stops = j->text.n_stops;
    to.emit = cli_print_piece;
    to.emit_user = stdout;
    if (tide_textgen_new(j->c, j->tok, &to, &j->out)) return cli_fail(j->c, "--stop");
    if (!(j->cached = malloc((size_t)j->ctx * sizeof *j->cached)) ||
        !(j->gen = malloc((size_t)j->new_tokens * sizeof *j->gen)))
        return fprintf(stderr, "tide: out of memory\n"), 1;
    return 0;
}

static int add_msg(chat_job *j, const char *role, const char *content) {
    if (j->n_msgs == j->cap_msgs) {
        int cap = j->cap_msgs ? 2 * j->cap_msgs : 8;
        tide_chat_msg *m = realloc(j->msgs, (size_t)cap * sizeof *m);
        if (!m) return -1;
        j->msgs = m;
        j->cap_msgs = cap;
    }
    char *c = strdup(content);
    if (!c) return -1;
    j->msgs[j->n_msgs++] = (tide_chat_msg){role, c};
    return 0;
}

/* Forgets the conversation but its system message. */
static void clear_conversation(chat_job *j) {
    int keep = j->text.system ? 1 : 0;
    for (int i = keep; i < j->n_msgs; i++) free((char *)j->msgs[i].content);
    j->n_msgs = keep;
    j->n_cached = 0;
}

/* One turn: the user's line in, the answer out. Returns 0, or 1 on an error
 * that ends the chat (a turn that does not fit is reported and dropped). */
static int turn(chat_job *j, const char *line) {
    if (add_msg(j, "user", line)) return fprintf(stderr, "tide: out of memory\n"), 1;
    char *text = NULL;
    size_t len = 0;
    int32_t *ids = NULL;
    int n = 0;
    if (tide_chat_format(j->c, j->tmpl, j->msgs, j->n_msgs, true, &text, &len)) {
        fprintf(stderr, "tide: chat: %s\n", tide_ctx_last_error(j->c));
        free((char *)j->msgs[--j->n_msgs].content);
        return 0;
    }
    int rc = cli_encode(j->c, j->tok, text, len, 0, &ids, &n);
    tide_free_text(text);
    if (rc) return 1;
    if (n >= j->ctx) {
        fprintf(stderr, "tide: chat: the conversation (%d tokens) has reached the context of %ld tokens: /clear "
                "starts a new one (or give a larger --ctx)\n", n, j->ctx);
        free(ids);
        free((char *)j->msgs[--j->n_msgs].content);
        return 0;
    }
    int start = 0;
    while (start < j->n_cached && start < n - 1 && ids[start] == j->cached[start]) start++;
    long room = j->ctx - n + 1;
    int max_new = (int)(j->new_tokens < room ? j->new_tokens : room);
    tide_sampler_start(j->sampler, j->text.so.seed + (uint64_t)j->turns, ids, n);
    interrupted = 0;
    tide_gen_opts go = {.sampler = j->sampler, .stop_ids = j->stop_ids, .n_stop_ids = j->n_stop_ids,
                        .start_pos = start, .on_token = on_token};
    tide_gen_stats st;
    int n_gen = 0;
    if (tide_textgen_generate(j->out, j->m, ids, n, max_new, &go, j->gen, &n_gen, &st)) {
        free(ids);
        return cli_fail(j->c, "generating");
    }
    fputc('\n', stdout);
    fflush(stdout);
    /* the cache now holds the prompt and all but the last id drawn */
    memcpy(j->cached, ids, (size_t)n * sizeof *ids);
    int keep = n_gen > 0 ? n_gen - 1 : 0;
    memcpy(j->cached + n, j->gen, (size_t)keep * sizeof *j->gen);
    j->n_cached = n + keep;
    free(ids);
    j->turns++;
    j->gen_tokens += st.decode_tokens;
    j->gen_s += st.decode_s;
    j->prefill_tokens += st.prefill_tokens;
    j->prefill_s += st.prefill_s;
    if (interrupted && isatty(STDERR_FILENO)) fprintf(stderr, "[stopped]\n");
    interrupted = 0;
    return add_msg(j, "assistant", tide_textgen_text(j->out, NULL)) ? (fprintf(stderr, "tide: out of memory\n"), 1) : 0;
}

/* The next input line without its newline (malloc'd), or NULL at the end of
 * input. A Ctrl-C at the prompt gives an empty line. */
static char *read_line(bool tty) {
#ifdef TIDE_HAVE_LIBEDIT
    if (tty) {
        interrupted = 0;
        char *l = readline("> ");
        if (!l && interrupted) {
            fputc('\n', stdout);
            return strdup("");
        }
        if (l && *l) add_history(l);
        return l;
    }
#endif
    if (tty) {
        fputs("> ", stdout);
        fflush(stdout);
    }
    char *l = NULL;
    size_t cap = 0;
    errno = 0;
    ssize_t n = getline(&l, &cap, stdin);
    if (n < 0) {
        free(l);
        if (tty && interrupted && errno == EINTR) {
            interrupted = 0;
            clearerr(stdin);
            fputc('\n', stdout);
            return strdup("");
        }
        return NULL;
    }
    if (n > 0 && l[n - 1] == '\n') l[--n] = '\0';
    return l;
}

static int chat_loop(chat_job *j) {
    bool tty = isatty(STDIN_FILENO) && isatty(STDOUT_FILENO);
    if (j->text.system && add_msg(j, "system", j->text.system)) return 1;
    struct sigaction sa = {.sa_handler = on_sigint};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL); /* no SA_RESTART: a read at the prompt returns */
    if (tty && !j->quiet)
        fprintf(stderr, "tide: chat with %s (template %s); Ctrl-C stops an answer, Ctrl-D or /exit ends, /clear "
                "starts over\n", j->model_dir, tide_chat_template_name(j->tmpl));
    if (!j->quiet && j->text.so.temperature > 0)
        fprintf(stderr, "tide: sampling with seed %llu (turn k draws with seed + k)\n",
                (unsigned long long)j->text.so.seed);
    int rc = 0;
    for (;;) {
        char *line = read_line(tty);
        if (!line) break;
        if (!strcmp(line, "/exit") || !strcmp(line, "/quit")) {
            free(line);
            break;
        }
        if (!strcmp(line, "/clear")) {
            clear_conversation(j);
        } else if (line[strspn(line, " \t\r")] && (rc = turn(j, line))) {
            free(line);
            break;
        }
        free(line);
    }
    if (tty) fputc('\n', stdout);
    if (!j->quiet && j->turns)
        fprintf(stderr, "tide: %d turns; prefill %.2f tokens/s (%ld tokens), decode %.2f tokens/s (%ld tokens)\n",
                j->turns, j->prefill_s > 0 ? j->prefill_tokens / j->prefill_s : 0, j->prefill_tokens,
                j->gen_s > 0 ? j->gen_tokens / j->gen_s : 0, j->gen_tokens);
    return rc;
}

int cmd_chat(int argc, char **argv) {
    chat_job j;
    memset(&j, 0, sizeof j);
    int rc = parse_args(argc, argv, &j);
    if (rc >= 0) return rc;
    if (!(j.c = tide_ctx_new())) return 1;
    tide_ctx_set_threads(j.c, (int)j.threads);
    cli_progress_init(&j.ps, j.quiet);
    tide_ctx_set_progress(j.c, cli_progress, &j.ps);
    if (!(rc = open_all(&j))) {
        tide_ctx_set_progress(j.c, NULL, NULL); /* per-token progress would break the answers' lines */
        rc = chat_loop(&j);
    }
    clear_conversation(&j);
    if (j.n_msgs) free((char *)j.msgs[0].content);
    free(j.msgs);
    free(j.cached);
    free(j.gen);
    free(j.stop_ids);
    tide_textgen_free(j.out);
    tide_sampler_free(j.sampler);
    tide_model_free(j.m);
    tide_chat_template_free(j.tmpl);
    tide_tokenizer_free(j.tok);
    tide_backend_free(j.be);
    tide_checkpoint_free(j.ck);
    tide_ctx_free(j.c);
    return rc;
}
