/*
 * cpu_decode.c - CPU decode against the machine's memory bandwidth, and what
 * `tide run` costs in memory, measured side by side in one run.
 *
 *   bench_cpu_decode [--threads N] [--prompt N] [--new N] [--rounds N]
 *                    [--matmul auto|f32|fast] [--bw-mib N] [--tide PATH]
 *                    [--no-memory] [--json FILE] MODEL_DIR
 *
 * MODEL_DIR holds a checkpoint (a synthetic tinyllama-1.1b bf16 one is written
 * there if it has none).
 *
 * 1. Bandwidth, alternated --rounds times (default 5) with decode, so both see
 *    the same machine: (a) a streaming read (a sum) of a --bw-mib buffer
 *    (default 1024 MiB, far larger than the caches) split across --threads
 *    threads (default: all cores), the best of 3 passes right before and 3
 *    right after each decode (the higher bound of the two); (b) greedy generation
 *    through the library (resident, planned engine, weights read in place from
 *    the prefetched checkpoint), --prompt tokens (default 32) then --new
 *    (default 32). Bytes per decode step = every weight tensor of the
 *    checkpoint except the embedding table, of which a step reads one row
 *    (unless the head is tied to it); KV-cache and activation bytes are left
 *    out (under 1% here). Weight GB/s = bytes per step x decode tokens/s, and
 *    its fraction of the stream read (target >= 0.8). Medians over rounds.
 * 2. Memory: `tide run` as a child process (--json), its peak RSS from wait4()
 *    (ru_maxrss) beside the one it reports itself (run_peak_rss_bytes, which
 *    leaves out a --check reference run, else peak_rss_bytes), prefill and decode
 *    tokens/s: unconstrained; weights homed on host at 25%; weights on SSD at
 *    25% and 10%; and, when MODEL_DIR is the built-in model, `tide run` with no
 *    arguments (the demo). The SSD rows also run the same command with
 *    --new-tokens 1 (prefill only): its bytes_ssd_read, taken from the full
 *    run's, leave the decode's, whose rate over decode_s is set against a raw
 *    sequential O_DIRECT read of the checkpoint file (4 MiB requests, one at a
 *    time) made right before the row. Every row must generate the same tokens.
 *
 * Markdown tables and one JSON line per row (also appended to --json FILE).
 * Exit status 0; 1 when a run fails or tokens differ; 2 for a usage error.
 */
#include "core/core.h"
#include "store/ssd.h"
#include "tide.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static FILE *json_out;

static void emit(const char *line) {
    puts(line);
    fflush(stdout);
    if (json_out) {
        fprintf(json_out, "%s\n", line);
        fflush(json_out);
    }
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(const double *v, int n) {
    double *w = malloc((size_t)n * sizeof *w);
    memcpy(w, v, (size_t)n * sizeof *w);
    qsort(w, (size_t)n, sizeof *w, cmp_double);
    double m = n % 2 ? w[n / 2] : 0.5 * (w[n / 2 - 1] + w[n / 2]);
    free(w);
    return m;
}

/* ---------------------------------------------------------------- stream read */

static volatile uint64_t stream_sink; /* keeps the sums, so the reads happen */

typedef struct stream_job {
    const uint64_t *p;
    size_t n;
    uint64_t sum;
} stream_job;

static void *stream_worker(void *arg) {
    stream_job *j = arg;
    uint64_t s = 0;
    for (size_t i = 0; i < j->n; i++) s += j->p[i];
    j->sum = s;
    return NULL;
}

/* One pass: every thread sums its contiguous share of buf (n words); returns
 * bytes/s from the first thread's start to the last one's end (thread start-up,
 * tens of microseconds, included), 0 when a thread cannot be started. */
static double stream_pass(const uint64_t *buf, size_t n, int threads) {
    stream_job job[64];
    pthread_t th[64];
    if (threads > 64) threads = 64;
    size_t per = n / (size_t)threads;
    int started = 0;
    double t0 = tide_now();
    for (int t = 0; t < threads; t++) {
        job[t] = (stream_job){buf + per * (size_t)t, t == threads - 1 ? n - per * (size_t)t : per, 0};
        if (pthread_create(&th[t], NULL, stream_worker, &job[t])) break;
        started++;
    }
    for (int t = 0; t < started; t++) pthread_join(th[t], NULL);
    double dt = tide_now() - t0;
    for (int t = 0; t < started; t++) stream_sink += job[t].sum;
    return started == threads && dt > 0 ? (double)(n * sizeof *buf) / dt : 0;
}

/* ---------------------------------------------------------------- child runs */

typedef struct child_run {
    int rc;             /* exit status, or 128 + signal */
    uint64_t maxrss;    /* ru_maxrss of the child, bytes */
    char *out;          /* its stdout */
} child_run;

/* Runs argv with stdout captured, stderr passed through, killed after limit_s. */
static int run_child(char *const argv[], int limit_s, child_run *r) {
    memset(r, 0, sizeof *r);
    int pfd[2];
    if (pipe(pfd)) return -1;
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        dup2(pfd[1], 1);
        close(pfd[0]);
        close(pfd[1]);
        alarm((unsigned)limit_s); /* kept across exec: SIGALRM ends a hung run */
        execv(argv[0], argv);
        fprintf(stderr, "bench_cpu_decode: cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    close(pfd[1]);
    size_t cap = 1 << 16, len = 0;
    r->out = malloc(cap);
    for (;;) {
        if (len + 4096 > cap) r->out = realloc(r->out, cap *= 2);
        ssize_t k = read(pfd[0], r->out + len, cap - len - 1);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;
        len += (size_t)k;
    }
    r->out[len] = 0;
    close(pfd[0]);
    int st = 0;
    struct rusage ru;
    while (wait4(pid, &st, 0, &ru) < 0)
        if (errno != EINTR) return -1;
    r->rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    r->maxrss = (uint64_t)ru.ru_maxrss * 1024;
    return 0;
}

/* A number field of a flat JSON object ("key":value); NAN-free: 0 when absent. */
static double jnum(const char *js, const char *key) {
    char pat[128];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = js ? strstr(js, pat) : NULL;
    return p ? strtod(p + strlen(pat), NULL) : 0;
}

/* The "tokens" array as text ("1,2,3"), into buf; "" when absent. */
static void jtokens(const char *js, char *buf, size_t cap) {
    buf[0] = 0;
    const char *p = js ? strstr(js, "\"tokens\":[") : NULL;
    if (!p) return;
    p += 10;
    const char *e = strchr(p, ']');
    if (!e) return;
    size_t n = (size_t)(e - p) < cap - 1 ? (size_t)(e - p) : cap - 1;
    memcpy(buf, p, n);
    buf[n] = 0;
}

static int jbool(const char *js, const char *key) {
    char pat[128];
    snprintf(pat, sizeof pat, "\"%s\":true", key);
    return js && strstr(js, pat) != NULL;
}

/* Raw baseline: one sequential O_DIRECT pass over path in 4 MiB requests. */
static double raw_direct_read(const char *path, uint64_t *bytes) {
    int fd = -1;
    *bytes = 0;
    if (tide_ssd_open_direct(path, &fd)) return 0;
    size_t chunk = 4u << 20;
    void *buf = NULL;
    if (posix_memalign(&buf, 4096, chunk)) {
        close(fd);
        return 0;
    }
    double t0 = tide_now();
    uint64_t total = 0;
    for (;;) {
        ssize_t r = pread(fd, buf, chunk, (off_t)total);
        if (r <= 0) break;
        total += (uint64_t)r;
        if ((size_t)r < chunk) break;
    }
    double dt = tide_now() - t0;
    close(fd);
    free(buf);
    *bytes = total;
    return dt > 0 ? total / dt : 0;
}

static int usage(const char *argv0) {
    fprintf(stderr,
            "usage: %s [--threads N] [--prompt N] [--new N] [--rounds N] [--matmul auto|f32|fast]\n"
            "       [--bw-mib N] [--tide PATH] [--no-memory] [--json FILE] MODEL_DIR\n",
            argv0);
    return 2;
}

/* The directory `tide run` writes its built-in model to (see its --help). */
static void builtin_model_dir(char *buf, size_t cap) {
    const char *c = getenv("TIDE_CACHE"), *x = getenv("XDG_CACHE_HOME"), *h = getenv("HOME");
    if (c && *c) snprintf(buf, cap, "%s/models/tinyllama-1.1b-synthetic-s0", c);
    else if (x && *x) snprintf(buf, cap, "%s/tide/models/tinyllama-1.1b-synthetic-s0", x);
    else snprintf(buf, cap, "%s/.cache/tide/models/tinyllama-1.1b-synthetic-s0", h ? h : "");
}

static int same_dir(const char *a, const char *b) {
    char ra[PATH_MAX], rb[PATH_MAX];
    return realpath(a, ra) && realpath(b, rb) && !strcmp(ra, rb);
}

typedef struct mem_row {
    const char *name;
    const char *extra[6]; /* arguments after the common ones */
    bool ssd, demo;
} mem_row;

int main(int argc, char **argv) {
    const char *dir = NULL, *json_path = NULL, *matmul = "auto";
    char tide_path[PATH_MAX] = "";
    int threads = 0, n_prompt = 32, n_new = 32, rounds = 5, bw_mib = 1024, memory = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--prompt") && i + 1 < argc) n_prompt = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--new") && i + 1 < argc) n_new = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--matmul") && i + 1 < argc) matmul = argv[++i];
        else if (!strcmp(argv[i], "--bw-mib") && i + 1 < argc) bw_mib = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--tide") && i + 1 < argc) snprintf(tide_path, sizeof tide_path, "%s", argv[++i]);
        else if (!strcmp(argv[i], "--no-memory")) memory = 0;
        else if (!strcmp(argv[i], "--json") && i + 1 < argc) json_path = argv[++i];
        else if (argv[i][0] != '-' && !dir) dir = argv[i];
        else return usage(argv[0]);
    }
    if (!dir || n_prompt < 1 || n_new < 2 || rounds < 1 || bw_mib < 64 || threads < 0) return usage(argv[0]);
    if (json_path && !(json_out = fopen(json_path, "a"))) {
        fprintf(stderr, "bench_cpu_decode: cannot open %s: %s\n", json_path, strerror(errno));
        return 1;
    }
    if (!tide_path[0]) { /* the tide command built beside this program */
        char self[PATH_MAX - 16];
        ssize_t k = readlink("/proc/self/exe", self, sizeof self - 1);
        self[k > 0 ? k : 0] = 0;
        char *slash = strrchr(self, '/');
        if (slash) *slash = 0;
        snprintf(tide_path, sizeof tide_path, "%s/tide", k > 0 ? self : ".");
    }

    tide_ctx *ctx = tide_ctx_new();
    if (threads) tide_ctx_set_threads(ctx, threads);
    threads = tide_ctx_threads(ctx);
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/config.json", dir);
    struct stat sb;
    if (stat(path, &sb) != 0) {
        tide_llama_config cfg;
        if (tide_llama_config_named(ctx, "tinyllama-1.1b", &cfg) || tide_checkpoint_make_synthetic(ctx, &cfg, 0, 0, dir)) {
            fprintf(stderr, "bench_cpu_decode: %s\n", tide_ctx_last_error(ctx));
            return 1;
        }
    }
    tide_checkpoint *ck = NULL;
    tide_backend *be = NULL;
    tide_model *m = NULL;
    tide_matmul_mode mm;
    tide_model_opts mo = {.max_batch = 1, .ctx_len = n_prompt + n_new};
    if (tide_matmul_parse(ctx, matmul, &mm) || tide_checkpoint_open(ctx, dir, &ck) ||
        tide_backend_new(ctx, TIDE_BACKEND_CPU, &be) || tide_backend_set_matmul(be, mm) ||
        tide_checkpoint_prefetch(ck) || tide_model_new(ctx, ck, be, &mo, &m)) {
        fprintf(stderr, "bench_cpu_decode: %s\n", tide_ctx_last_error(ctx));
        return 1;
    }
    const tide_llama_config *cfg = tide_checkpoint_config(ck);

    /* Weight bytes one decode step reads. */
    uint64_t step_bytes = 0, all_bytes = 0;
    const char *ck_file = NULL;
    for (int i = 0; i < tide_checkpoint_n_tensors(ck); i++) {
        tide_tensor_info ti;
        if (tide_checkpoint_get_index(ck, i, &ti)) continue;
        if (!ck_file) ck_file = ti.file;
        all_bytes += ti.nbytes;
        if (!strcmp(ti.name, "model.embed_tokens.weight") && !cfg->tie_word_embeddings)
            step_bytes += ti.nbytes / (uint64_t)ti.shape[0]; /* one row */
        else step_bytes += ti.nbytes;
    }

    int32_t *prompt = malloc((size_t)n_prompt * sizeof *prompt), *tok = malloc((size_t)n_new * sizeof *tok);
    for (int i = 0; i < n_prompt; i++) prompt[i] = (int32_t)((1u + (uint32_t)i * 2654435761u) % (uint32_t)cfg->vocab_size);
    size_t nwords = (size_t)bw_mib << 17;
    uint64_t *buf = NULL;
    if (posix_memalign((void **)&buf, 4096, nwords * sizeof *buf)) {
        fprintf(stderr, "bench_cpu_decode: cannot allocate %d MiB\n", bw_mib);
        return 1;
    }
    for (size_t i = 0; i < nwords; i++) buf[i] = i;

    printf("# bench cpu decode: %s (%d layers, %s), %d threads, matmul %s, prompt %d, %d new tokens, %d rounds\n\n",
           cfg->name, cfg->num_hidden_layers, tide_dtype_name(cfg->dtype), threads,
           tide_matmul_name(tide_backend_matmul(be)), n_prompt, n_new, rounds);
    printf("kernels: %s\n\n", tide_backend_kernels(be));
    fflush(stdout);
    double t_start = tide_now();
    tide_gen_stats st;
    if (tide_model_generate(m, prompt, n_prompt, n_new, tok, &st)) { /* untimed: planning, first touch */
        fprintf(stderr, "bench_cpu_decode: generate: %s\n", tide_ctx_last_error(ctx));
        return 1;
    }
    double *bw = calloc((size_t)rounds, sizeof *bw), *dec = calloc((size_t)rounds, sizeof *dec);
    double *pre = calloc((size_t)rounds, sizeof *pre);
    int failed = 0;
    printf("## Decode against memory bandwidth\n\n");
    printf("| round | stream read GB/s (best of 3 before and 3 after) | decode tokens/s | weights GB/s | fraction of stream read |\n"
           "|---|---|---|---|---|\n");
    for (int r = 0; r < rounds; r++) {
        for (int p = 0; p < 3; p++) {
            double b = stream_pass(buf, nwords, threads);
            if (b > bw[r]) bw[r] = b;
        }
        if (tide_model_generate(m, prompt, n_prompt, n_new, tok, &st)) {
            fprintf(stderr, "bench_cpu_decode: generate: %s\n", tide_ctx_last_error(ctx));
            return 1;
        }
        for (int p = 0; p < 3; p++) { /* and after: the better of the two sides bounds the decode between */
            double b = stream_pass(buf, nwords, threads);
            if (b > bw[r]) bw[r] = b;
        }
        dec[r] = st.decode_tokens_per_s;
        pre[r] = st.prefill_tokens_per_s;
        double wbw = dec[r] * (double)step_bytes;
        printf("| %d | %.2f | %.2f | %.2f | %.3f |\n", r + 1, bw[r] / 1e9, dec[r], wbw / 1e9, bw[r] > 0 ? wbw / bw[r] : 0);
        fflush(stdout);
    }
    double mbw = median(bw, rounds), mdec = median(dec, rounds), mpre = median(pre, rounds);
    double frac = mbw > 0 ? mdec * (double)step_bytes / mbw : 0;
    printf("| median | %.2f | %.2f | %.2f | %.3f |\n\n", mbw / 1e9, mdec, mdec * step_bytes / 1e9, frac);
    printf("weights read per decode step: %.3f GB (checkpoint %.3f GB less the embedding table but one row); "
           "prefill %.2f tokens/s (median); target fraction >= 0.8: %s\n\n",
           step_bytes / 1e9, all_bytes / 1e9, mpre, frac >= 0.8 ? "met" : "NOT met");
    char line[2048];
    snprintf(line, sizeof line,
             "{\"bench\":\"cpu_decode\",\"part\":\"bandwidth\",\"config\":\"%s\",\"threads\":%d,\"matmul\":\"%s\","
             "\"prompt\":%d,\"new\":%d,\"rounds\":%d,\"stream_read_bw\":%.0f,\"decode_tps\":%.3f,\"prefill_tps\":%.3f,"
             "\"step_weight_bytes\":%llu,\"weights_bw\":%.0f,\"fraction\":%.4f,\"bw_buffer_mib\":%d}",
             cfg->name, threads, tide_matmul_name(tide_backend_matmul(be)), n_prompt, n_new, rounds, mbw, mdec, mpre,
             (unsigned long long)step_bytes, mdec * step_bytes, frac, bw_mib);
    emit(line);
    free(buf);
    tide_model_free(m); /* the child runs get the memory */
    m = NULL;
    double t_bw = tide_now() - t_start;

    if (memory) {
        char builtin[PATH_MAX];
        builtin_model_dir(builtin, sizeof builtin);
        bool demo = same_dir(builtin, dir);
        mem_row rows[] = {
            {"unconstrained (--budget none)", {"--budget", "none"}, false, false},
            {"weights on host, --budget 25%", {"--budget", "25%"}, false, false},
            {"--weights-on-ssd --budget 25%", {"--weights-on-ssd", "--budget", "25%"}, true, false},
            {"--weights-on-ssd --budget 10%", {"--weights-on-ssd", "--budget", "10%"}, true, false},
            {"demo: tide run (no arguments)", {NULL}, false, true},
        };
        int nrows = (int)(sizeof rows / sizeof rows[0]) - (demo ? 0 : 1);
        uint64_t raw_bytes = 0;
        double raw_bw = 0, raw_best = 0;
        char ref_tokens[8192] = "", toks[8192];
        char s_prompt[16], s_new[16], s_threads[16];
        snprintf(s_prompt, sizeof s_prompt, "%d", n_prompt);
        snprintf(s_new, sizeof s_new, "%d", n_new);
        snprintf(s_threads, sizeof s_threads, "%d", threads);
        printf("## Memory: tide run (a child process per row, peak RSS from wait4)\n\n");
        printf("| run | peak RSS (wait4) | run's peak RSS (--json) | x unconstrained | prefill tokens/s | decode tokens/s | "
               "SSD read while decoding | GB/s | raw O_DIRECT read GB/s | ratio | tokens |\n"
               "|---|---|---|---|---|---|---|---|---|---|---|\n");
        fflush(stdout);
        double rss0 = 0;
        char demo_note[256] = "";
        for (int k = 0; k < nrows; k++) {
            double pre_bytes = 0;
            child_run cr, cp;
            if (rows[k].ssd) { /* the raw read right before the row, so both see the same disk */
                raw_bw = ck_file ? raw_direct_read(ck_file, &raw_bytes) : 0;
                if (raw_bw > raw_best) raw_best = raw_bw;
            }
            for (int pass = rows[k].ssd ? 0 : 1; pass < 2; pass++) { /* pass 0: prefill only */
                char *av[32];
                int n = 0;
                av[n++] = tide_path;
                av[n++] = "run";
                if (!rows[k].demo) {
                    av[n++] = "--model";
                    av[n++] = (char *)dir;
                    av[n++] = "--prompt-len";
                    av[n++] = s_prompt;
                    av[n++] = "--new-tokens";
                    av[n++] = pass ? s_new : "1";
                    av[n++] = "--matmul";
                    av[n++] = (char *)matmul;
                    for (int e = 0; e < 6 && rows[k].extra[e]; e++) av[n++] = (char *)rows[k].extra[e];
                }
                av[n++] = "--threads";
                av[n++] = s_threads;
                av[n++] = "--json";
                av[n++] = "--quiet";
                av[n] = NULL;
                child_run *c = pass ? &cr : &cp;
                if (run_child(av, 900, c) || c->rc != 0) {
                    fprintf(stderr, "bench_cpu_decode: %s: tide run failed (exit %d)\n", rows[k].name, c->rc);
                    failed = 1;
                }
                if (!pass) pre_bytes = jnum(cp.out, "bytes_ssd_read");
            }
            const char *js = cr.out;
            if (rows[k].ssd) free(cp.out);
            if (failed && (!js || !strstr(js, "\"tokens\""))) {
                free(cr.out);
                continue;
            }
            jtokens(js, toks, sizeof toks);
            bool same = true;
            if (!rows[k].demo) { /* the demo has its own prompt and length */
                if (!ref_tokens[0]) snprintf(ref_tokens, sizeof ref_tokens, "%s", toks);
                same = !strcmp(ref_tokens, toks);
                if (!same) failed = 1;
            }
            /* the run's own peak where tide run reports it apart from a --check reference run's */
            double rss = (double)cr.maxrss, rep = jnum(js, "run_peak_rss_bytes");
            if (rep <= 0) rep = jnum(js, "peak_rss_bytes");
            double ref_rss = jnum(js, "reference_peak_rss_bytes");
            if (rows[k].demo && ref_rss > 0)
                snprintf(demo_note, sizeof demo_note,
                         "demo: it reports its offloaded run's peak RSS %.2f GB and its reference run's %.2f GB; "
                         "the process's peak (wait4) is the larger\n", rep / 1e9, ref_rss / 1e9);
            if (k == 0) rss0 = rss;
            double dec_s = jnum(js, "decode_s"), ssd_all = jnum(js, "bytes_ssd_read");
            double ssd_dec = rows[k].ssd ? ssd_all - pre_bytes : 0, ssd_bw = dec_s > 0 ? ssd_dec / dec_s : 0;
            char ssd_col[64] = "-", bw_col[32] = "-", raw_col[32] = "-", vs_col[32] = "-";
            if (rows[k].ssd) {
                snprintf(ssd_col, sizeof ssd_col, "%.2f GB in %.2f s", ssd_dec / 1e9, dec_s);
                snprintf(bw_col, sizeof bw_col, "%.2f", ssd_bw / 1e9);
                snprintf(raw_col, sizeof raw_col, "%.2f", raw_bw / 1e9);
                snprintf(vs_col, sizeof vs_col, "%.3f", raw_bw > 0 ? ssd_bw / raw_bw : 0);
            }
            printf("| %s | %.2f GB | %.2f GB | %.2f | %.2f | %.2f | %s | %s | %s | %s | %s |\n", rows[k].name,
                   rss / 1e9, rep / 1e9, rss0 > 0 ? rss / rss0 : 0, jnum(js, "prefill_tokens_per_s"),
                   jnum(js, "decode_tokens_per_s"), ssd_col, bw_col, raw_col, vs_col,
                   rows[k].demo ? "(own prompt)" : same ? "same" : "DIFFER");
            fflush(stdout);
            snprintf(line, sizeof line,
                     "{\"bench\":\"cpu_decode\",\"part\":\"memory\",\"run\":\"%s\",\"peak_rss\":%.0f,"
                     "\"reported_peak_rss\":%.0f,\"reference_peak_rss\":%.0f,\"rss_ratio\":%.4f,\"prefill_tps\":%.3f,\"decode_tps\":%.3f,"
                     "\"offloaded\":%s,\"budget_bytes\":%.0f,\"bytes_ssd_read\":%.0f,\"decode_ssd_bytes\":%.0f,"
                     "\"decode_s\":%.4f,\"decode_ssd_bw\":%.0f,\"raw_direct_bw\":%.0f,\"same_tokens\":%s}",
                     rows[k].name, rss, rep, ref_rss, rss0 > 0 ? rss / rss0 : 0, jnum(js, "prefill_tokens_per_s"),
                     jnum(js, "decode_tokens_per_s"), jbool(js, "offloaded") ? "true" : "false",
                     jnum(js, "budget_bytes"), ssd_all, ssd_dec, dec_s, ssd_bw, rows[k].ssd ? raw_bw : 0,
                     same ? "true" : "false");
            emit(line);
            free(cr.out);
        }
            if (demo_note[0]) printf("\n%s", demo_note);
        printf("\nraw read: one sequential pass over %s (%.2f GB) with O_DIRECT in 4 MiB requests, right before each "
               "SSD row (best %.2f GB/s)\n", ck_file ? ck_file : "?", raw_bytes / 1e9, raw_best / 1e9);
    }
    printf("\nbench_cpu_decode: bandwidth part %.0f s, whole run %.0f s\n", t_bw, tide_now() - t_start);
    free(bw);
    free(dec);
    free(pre);
    free(prompt);
    free(tok);
    tide_backend_free(be);
    tide_checkpoint_free(ck);
    tide_ctx_free(ctx);
    if (json_out) fclose(json_out);
    return failed ? 1 : 0;
}
