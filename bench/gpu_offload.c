/*
 * gpu_offload.c - the GPU benchmark, every figure measured in one process on
 * the CUDA backend.
 *
 *   bench_gpu_offload [--quick] [--config NAME|FILE] [--layers N] [--seq N]
 *                     [--budgets 100,50,25,10] [--policies tide,static-layer,lru]
 *                     [--reps N] [--hw PROFILE] [--matmul auto|f32|fast]
 *                     [--f32-matmul] [--json FILE] [--cpu] MODEL_DIR
 *
 * MODEL_DIR holds a checkpoint; when it has no config.json a synthetic one is
 * generated there first: --config (default llama-7b, true shapes) cut to
 * --layers, bf16, max_position_embeddings raised to at least seq + 64 so the
 * same directory also serves a prompt of `seq` plus 32 generated tokens
 * (bench/hf_accelerate.py, `tide run --new-tokens 32`). llama-7b bf16 is
 * 12.6 GiB (13.5 GB) and takes about a minute to write; --quick means a 4-layer
 * model (1.9 GiB) and one timed run per row.
 *
 * (a) Prefill of --seq tokens (default 2048), batch 1:
 *     - unconstrained (TIDE_BUDGET_NONE: weights uploaded once, everything
 *       resident), if it fits;
 *     - offloaded at each --budgets percentage of the unconstrained peak (the
 *       planner's peak on the --hw profile; budgets are exact byte counts) with
 *       each policy: wall time, executor time, predicted makespan, ratio to the
 *       lower bound (tide_plan_bounds on the same graph, budget and profile:
 *       measured executor time / bound and predicted / bound), tide's speed-up
 *       over static-layer and lru, and a bit-for-bit check (logits_hash and the
 *       next token) against the unconstrained run, or against the first
 *       successful run (tide at 100% with the default lists) when the
 *       unconstrained run does not fit.
 *     Each configuration runs once untimed first (planning, executor set-up,
 *     weight upload), then --reps timed runs (default 2, 1 with --quick); the
 *     best is reported. Every run's outputs are checked, not just the best's.
 * (b) Copy bandwidth. tide's achieved h2d (d2h) bandwidth: bytes of the host
 *     LOADs (STOREs) of the reported run's plan divided by the time they were
 *     in flight (the union of their measured intervals from the executor's
 *     timeline, read from the model's internals: tide_gen_stats has the bytes
 *     but not the link busy time). Baseline: a plain pinned copy of the same
 *     sizes, the same number of times: the backend vtable's to_device/to_host
 *     on host memory from its host_alloc (cudaHostAlloc), which on the CUDA
 *     backend is exactly one cudaMemcpyAsync plus cudaStreamSynchronize per
 *     call. Ratio target >= 0.9. Also shown, to explain a gap: the part of
 *     tide's traffic that comes from the tensors' homes (weights are read from
 *     their pinned copies, tide_offload_opts.pin_weights' default on a GPU,
 *     or from the memory-mapped checkpoint where pinning was refused; the KV
 *     cache's home is ordinary host memory), and a plain copy of every
 *     checkpoint tensor from the mapping (what unpinned loads would get).
 *
 * Output: markdown tables on stdout and one JSON line per row (also to --json
 * FILE). Progress goes to stderr. Exit status: 0 when every run that ran was
 * bit-identical to the reference and none failed other than "infeasible";
 * 1 otherwise; 2 for a usage error; 77 when there is no CUDA backend or device
 * (the message says which).
 *
 * With TIDE_EXEC_SYNC=1 in the environment every run issues its device work
 * synchronously (each call waits for its stream) instead of queueing it ahead
 * with events: run both to see what asynchronous issue gains (the setup row
 * says which mode ran).
 *
 * --cpu runs everything on the CPU backend instead: only for testing this
 * benchmark on a machine without a GPU; its figures are not GPU figures.
 */
#include "runtime/model_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static tide_ctx *ctx;
static FILE *json_file;
#define GIB 1073741824.0
#define MAX_LIST 16

static void die(const char *what) {
    fprintf(stderr, "bench_gpu_offload: %s: %s\n", what, tide_ctx_last_error(ctx));
    exit(1);
}

static void *xcalloc(size_t n, size_t sz) {
    void *p = calloc(n ? n : 1, sz ? sz : 1);
    if (!p) {
        fprintf(stderr, "bench_gpu_offload: out of memory\n");
        exit(1);
    }
    return p;
}

/* Progress of the long phases only (generating, loading); per-layer reports
 * come from executor threads and are ignored. */
static void on_progress(void *user, const char *what, uint64_t done, uint64_t total) {
    (void)user;
    static int last_pct = -1;
    static char last_what[32];
    if (strcmp(what, "generating") && strcmp(what, "loading")) return;
    int pct = total ? (int)(100.0 * (double)done / (double)total) : 100;
    if (strcmp(last_what, what)) {
        snprintf(last_what, sizeof last_what, "%s", what);
        last_pct = -1;
    }
    if (done < total ? pct / 10 == last_pct / 10 : last_pct == 100) return;
    last_pct = done < total ? pct : 100;
    fprintf(stderr, "bench_gpu_offload:   %s %d%%\n", what, pct);
}

/* ---------------------------------------------------------------- transfer sizes */

typedef struct size_count {
    uint64_t size, count;
} size_count;

typedef struct hist {
    size_count *v;
    int n, cap;
} hist;

static void hist_add(hist *h, uint64_t size, uint64_t count) {
    for (int i = 0; i < h->n; i++)
        if (h->v[i].size == size) {
            h->v[i].count += count;
            return;
        }
    if (h->n == h->cap) {
        h->cap = h->cap ? 2 * h->cap : 16;
        h->v = realloc(h->v, (size_t)h->cap * sizeof *h->v);
        if (!h->v) {
            fprintf(stderr, "bench_gpu_offload: out of memory\n");
            exit(1);
        }
    }
    h->v[h->n++] = (size_count){size, count};
}

typedef struct interval {
    double a, b;
} interval;

static int cmp_interval(const void *x, const void *y) {
    const interval *p = x, *q = y;
    return p->a < q->a ? -1 : p->a > q->a;
}

/* Total length of the union of n intervals (sorted in place). */
static double union_len(interval *iv, int n) {
    if (!n) return 0;
    qsort(iv, (size_t)n, sizeof *iv, cmp_interval);
    double total = 0, a = iv[0].a, b = iv[0].b;
    for (int i = 1; i < n; i++) {
        if (iv[i].a > b) {
            total += b - a;
            a = iv[i].a;
            b = iv[i].b;
        } else if (iv[i].b > b) {
            b = iv[i].b;
        }
    }
    return total + (b - a);
}

/* One direction of the host link during one run. */
typedef struct link_use {
    uint64_t bytes, home_bytes; /* every host<->device copy; those from/to a home */
    double busy_s, home_s;      /* union of their measured intervals */
    hist sizes;
    double plain_s;             /* the same copies done plainly from/to pinned memory */
} link_use;

static void link_free(link_use *l) {
    free(l->sizes.v);
    memset(l, 0, sizeof *l);
}

/* Reads the host copies of the most recent offloaded prefill from the model:
 * its plan (which instruction moves which tensor where) and the executor's
 * measured timeline of that run. */
static bool link_stats(const tide_model *m, link_use *h2d, link_use *d2h) {
    const tide_plan *p = NULL;
    const tide_sim_event *tl = NULL;
    link_free(h2d);
    link_free(d2h);
    if (tide_model_last_run(m, &p, &tl)) return false;
    interval *all[2], *home[2];
    int n_all[2] = {0, 0}, n_home[2] = {0, 0};
    for (int d = 0; d < 2; d++) {
        all[d] = xcalloc((size_t)p->n_ins, sizeof **all);
        home[d] = xcalloc((size_t)p->n_ins, sizeof **home);
    }
    for (int i = 0; i < p->n_ins; i++) {
        const tide_ins *in = &p->ins[i];
        int d;
        if (in->kind == TIDE_INS_LOAD && in->src == TIDE_TIER_HOST) d = 0;
        else if (in->kind == TIDE_INS_STORE && in->dst == TIDE_TIER_HOST) d = 1;
        else continue;
        link_use *l = d ? d2h : h2d;
        uint64_t nb = p->g->tensors[in->tensor].nbytes;
        interval iv = {tl[i].start_s, tl[i].end_s};
        l->bytes += nb;
        hist_add(&l->sizes, nb, 1);
        all[d][n_all[d]++] = iv;
        if (in->tier_off == TIDE_HOME) {
            l->home_bytes += nb;
            home[d][n_home[d]++] = iv;
        }
    }
    h2d->busy_s = union_len(all[0], n_all[0]);
    h2d->home_s = union_len(home[0], n_home[0]);
    d2h->busy_s = union_len(all[1], n_all[1]);
    d2h->home_s = union_len(home[1], n_home[1]);
    for (int d = 0; d < 2; d++) {
        free(all[d]);
        free(home[d]);
    }
    return true;
}

/* Plain copies: seconds per copy of each size, measured once. */
typedef struct plain_entry {
    uint64_t size;
    double h2d_s, d2h_s;
} plain_entry;

static plain_entry *plain;
static int n_plain, cap_plain;

static void plain_want(uint64_t size) {
    for (int i = 0; i < n_plain; i++)
        if (plain[i].size == size) return;
    if (n_plain == cap_plain) {
        cap_plain = cap_plain ? 2 * cap_plain : 32;
        plain = realloc(plain, (size_t)cap_plain * sizeof *plain);
        if (!plain) {
            fprintf(stderr, "bench_gpu_offload: out of memory\n");
            exit(1);
        }
    }
    plain[n_plain++] = (plain_entry){size, 0, 0};
}

static const plain_entry *plain_find(uint64_t size) {
    for (int i = 0; i < n_plain; i++)
        if (plain[i].size == size) return &plain[i];
    return NULL;
}

/* Seconds per copy of n bytes, host to device (to_dev) or back, on the
 * backend's default queue (synchronous): one untimed copy, then enough
 * back-to-back copies for about 512 MiB (3 to 200). */
static double time_copy(tide_backend *be, void *dev, void *host, uint64_t n, bool to_dev) {
    uint64_t reps = (512ull << 20) / (n ? n : 1);
    reps = reps < 3 ? 3 : reps > 200 ? 200 : reps;
    tide_status st = to_dev ? be->vt->to_device(be, NULL, dev, host, n) : be->vt->to_host(be, NULL, host, dev, n);
    if (st) die("plain copy");
    double t0 = tide_now();
    for (uint64_t r = 0; r < reps && !st; r++)
        st = to_dev ? be->vt->to_device(be, NULL, dev, host, n) : be->vt->to_host(be, NULL, host, dev, n);
    if (st) die("plain copy");
    return (tide_now() - t0) / (double)reps;
}

static double plain_time(const hist *h, bool to_dev) {
    double s = 0;
    for (int i = 0; i < h->n; i++) {
        const plain_entry *e = plain_find(h->v[i].size);
        if (e) s += (double)h->v[i].count * (to_dev ? e->h2d_s : e->d2h_s);
    }
    return s;
}

/* ---------------------------------------------------------------- rows */

enum { ROW_OK = 0, ROW_INFEASIBLE, ROW_ERROR, ROW_SKIPPED };

typedef struct row {
    double pct;
    uint64_t budget;
    const char *policy;
    int status;
    char msg[512];
    tide_gen_stats best, first;
    int runs, identical_runs;
    link_use h2d, d2h;
    tide_bounds b;
    bool have_bounds;
} row;

/* A message as a JSON string body: quotes and backslashes become ', control
 * characters spaces. */
static const char *json_text(const char *in, char *out, size_t cap) {
    size_t k = 0;
    for (const char *c = in; *c && k + 1 < cap; c++)
        out[k++] = (*c == '"' || *c == '\\') ? '\'' : ((unsigned char)*c < 0x20 ? ' ' : *c);
    out[k] = 0;
    return out;
}

static double gbps(uint64_t bytes, double s) { return s > 0 ? (double)bytes / s / 1e9 : 0; }

static const char *row_status(const row *r) {
    static const char *const names[] = {"ok", "infeasible", "error", "skipped"};
    return names[r->status];
}

/* Parses "a,b,c" into at most MAX_LIST items; returns the count or -1. */
static int split_list(const char *s, char items[MAX_LIST][32]) {
    int n = 0;
    const char *p = s;
    while (*p) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (!len || len >= 32 || n == MAX_LIST) return -1;
        memcpy(items[n], p, len);
        items[n][len] = 0;
        n++;
        p += len;
        if (*p == ',') {
            p++;
            if (!*p) return -1;
        }
    }
    return n;
}

/* Row i's wall time over tide's at the same budget (tide's speed-up over this
 * policy); 0 when either did not run or row i is tide's own. */
static double tide_speedup(const row *rows, int n_pol, int i) {
    const row *R = &rows[i], *T = NULL;
    for (int k = 0; k < n_pol; k++)
        if (rows[(i / n_pol) * n_pol + k].policy && !strcmp(rows[(i / n_pol) * n_pol + k].policy, "tide"))
            T = &rows[(i / n_pol) * n_pol + k]; /* rows not measured yet have no policy */
    if (!T || T == R || T->status || R->status || !(T->best.prefill_s > 0)) return 0;
    return R->best.prefill_s / T->best.prefill_s;
}

/* A JSON line to stdout and, with --json, to the file (flushed: a run cut
 * short keeps every line printed so far). */
static void emit(const char *line) {
    puts(line);
    fflush(stdout);
    if (json_file) {
        fprintf(json_file, "%s\n", line);
        fflush(json_file);
    }
}

static void emit_row(const row *R, int seq, double unc_s, double speedup, const char *ref_label) {
    const tide_gen_stats *s = &R->best;
    const link_use *h = &R->h2d, *d = &R->d2h;
    double lb = R->have_bounds ? R->b.lower_bound_s : 0;
    char msg[512], line[4096];
    json_text(R->msg, msg, sizeof msg);
    snprintf(line, sizeof line,
             "{\"bench\":\"gpu_offload\",\"row\":\"offloaded\",\"seq\":%d,\"budget_pct\":%g,\"budget_bytes\":%llu,"
             "\"policy\":\"%s\",\"status\":\"%s\",\"wall_s\":%.4f,\"first_wall_s\":%.4f,\"tokens_per_s\":%.1f,"
             "\"exec_s\":%.4f,\"predicted_s\":%.4f,\"unconstrained_s\":%.4f,\"x_unconstrained\":%.4f,\"lb_s\":%.6f,"
             "\"lb_compute_s\":%.6f,\"lb_link_s\":%.6f,\"ideal_s\":%.6f,\"exec_x_lb\":%.4f,\"pred_x_lb\":%.4f,"
             "\"peak_device_bytes\":%llu,\"bytes_h2d\":%llu,\"h2d_busy_s\":%.6f,\"h2d_bw\":%.0f,\"h2d_plain_bw\":%.0f,"
             "\"h2d_ratio\":%.4f,\"h2d_home_bytes\":%llu,\"h2d_home_bw\":%.0f,\"bytes_d2h\":%llu,\"d2h_busy_s\":%.6f,"
             "\"d2h_bw\":%.0f,\"d2h_plain_bw\":%.0f,\"d2h_ratio\":%.4f,\"tide_speedup\":%.4f,\"runs\":%d,"
             "\"bit_identical\":%s,\"reference\":\"%s\",\"message\":\"%s\"}",
             seq, R->pct, (unsigned long long)R->budget, R->policy, row_status(R), s->prefill_s, R->first.prefill_s,
             s->prefill_s > 0 ? seq / s->prefill_s : 0, s->exec_s, s->predicted_prefill_s, unc_s,
             unc_s > 0 && s->prefill_s > 0 ? s->prefill_s / unc_s : 0, lb, R->b.compute_s, R->b.link_s, R->b.ideal_s,
             lb > 0 ? s->exec_s / lb : 0, lb > 0 ? s->predicted_prefill_s / lb : 0,
             (unsigned long long)s->peak_device_bytes, (unsigned long long)h->bytes, h->busy_s,
             gbps(h->bytes, h->busy_s) * 1e9, gbps(h->bytes, h->plain_s) * 1e9,
             h->plain_s > 0 && h->busy_s > 0 ? h->plain_s / h->busy_s : 0, (unsigned long long)h->home_bytes,
             gbps(h->home_bytes, h->home_s) * 1e9, (unsigned long long)d->bytes, d->busy_s,
             gbps(d->bytes, d->busy_s) * 1e9, gbps(d->bytes, d->plain_s) * 1e9,
             d->plain_s > 0 && d->busy_s > 0 ? d->plain_s / d->busy_s : 0, speedup, R->runs,
             !R->runs ? "null" : R->identical_runs == R->runs ? "true" : "false", ref_label, msg);
    emit(line);
}

static void usage(const char *argv0) {
    fprintf(stderr,
            "usage: %s [--quick] [--config NAME|FILE] [--layers N] [--seq N] [--budgets 100,50,25,10]\n"
            "          [--policies tide,static-layer,lru] [--reps N] [--hw PROFILE]\n"
            "          [--matmul auto|f32|fast] [--f32-matmul] [--json FILE] [--cpu] MODEL_DIR\n",
            argv0);
}

int main(int argc, char **argv) {
    const char *dir = NULL, *config = "llama-7b", *hw_name = "h100-80g", *json_path = NULL;
    const char *budgets_arg = "100,50,25,10", *policies_arg = "tide,static-layer,lru";
    int seq = 2048, layers = 0, reps = -1;
    bool quick = false, f32_matmul = false, use_cpu = false, bad = false;
    tide_matmul_mode mm = TIDE_MATMUL_AUTO;
    for (int i = 1; i < argc && !bad; i++) {
        const char *a = argv[i];
        bool has = i + 1 < argc;
        if (!strcmp(a, "--quick")) quick = true;
        else if (!strcmp(a, "--f32-matmul")) mm = TIDE_MATMUL_F32;
        else if (!strcmp(a, "--matmul") && has) bad = tide_matmul_parse(NULL, argv[++i], &mm) != TIDE_OK;
        else if (!strcmp(a, "--cpu")) use_cpu = true;
        else if (!strcmp(a, "--config") && has) config = argv[++i];
        else if (!strcmp(a, "--layers") && has) layers = atoi(argv[++i]), bad = layers < 1;
        else if (!strcmp(a, "--seq") && has) seq = atoi(argv[++i]), bad = seq < 1;
        else if (!strcmp(a, "--reps") && has) reps = atoi(argv[++i]), bad = reps < 1;
        else if (!strcmp(a, "--budgets") && has) budgets_arg = argv[++i];
        else if (!strcmp(a, "--policies") && has) policies_arg = argv[++i];
        else if (!strcmp(a, "--hw") && has) hw_name = argv[++i];
        else if (!strcmp(a, "--json") && has) json_path = argv[++i];
        else if (a[0] != '-' && !dir) dir = a;
        else bad = true;
    }
    char bud_s[MAX_LIST][32], pol_s[MAX_LIST][32];
    int n_bud = split_list(budgets_arg, bud_s), n_pol = split_list(policies_arg, pol_s);
    double pcts[MAX_LIST];
    for (int i = 0; i < n_bud && !bad; i++) {
        char *end;
        pcts[i] = strtod(bud_s[i], &end);
        if (end == bud_s[i] || (*end && strcmp(end, "%")) || !(pcts[i] > 0 && pcts[i] <= 100)) bad = true;
    }
    for (int i = 0; i < n_pol && !bad; i++) {
        tide_policy pp;
        if (tide_policy_parse(pol_s[i], &pp)) bad = true;
    }
    if (bad || !dir || n_bud < 1 || n_pol < 1) {
        usage(argv[0]);
        return 2;
    }
    if (quick && !layers) layers = 4;
    if (reps < 0) reps = quick ? 1 : 2;
    setvbuf(stdout, NULL, _IOLBF, 0);

    ctx = tide_ctx_new();
    if (!ctx) return 1;
    tide_ctx_set_progress(ctx, on_progress, NULL);

    /* 1. the backend first: without a GPU nothing else is done (no model is
     * generated) */
    tide_backend *be = NULL;
    tide_status bst = tide_backend_new(ctx, use_cpu ? TIDE_BACKEND_CPU : TIDE_BACKEND_CUDA, &be);
    if (bst == TIDE_E_NO_DEVICE || bst == TIDE_E_UNSUPPORTED) {
        fprintf(stderr, "bench_gpu_offload: skipped, no CUDA backend to measure: %s (%s)\n", tide_ctx_last_error(ctx),
                tide_status_str(bst));
        tide_ctx_free(ctx);
        exit(77);
    }
    if (bst) die("opening the CUDA backend");
    if (tide_backend_set_matmul(be, mm)) die("--matmul");
    /* the profile's f16/bf16 rates are tensor-core rates: in the f32 mode the
     * GPU multiplies those weights at its f32 rate */
    f32_matmul = !use_cpu && tide_backend_matmul(be) == TIDE_MATMUL_F32;
    if (use_cpu)
        fprintf(stderr, "bench_gpu_offload: --cpu: running on the CPU backend to test the benchmark; these are "
                        "not GPU figures\n");

    /* 2. the hardware profile the plans and bounds are made for */
    tide_hw hw;
    if (tide_hw_load(ctx, hw_name, &hw)) die("hardware profile");
    if (f32_matmul) {
        /* in the f32 mode the CUDA backend converts f16/bf16 weights to f32
         * and multiplies in true f32 (no TF32, no tensor cores): the bounds
         * here use that rate, as the model's plans do (tide_model_set_offload
         * lowers the same rates for a backend in the f32 mode) */
        hw.flops[TIDE_F16] = hw.flops[TIDE_BF16] = hw.flops[TIDE_F32];
        size_t nl = strlen(hw.name);
        if (nl + sizeof "-f32matmul" <= sizeof hw.name) memcpy(hw.name + nl, "-f32matmul", sizeof "-f32matmul");
    }

    /* 3. the checkpoint, generated when the directory has none */
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    struct stat sb;
    if (stat(path, &sb) != 0) {
        tide_llama_config gc;
        bool is_file = strchr(config, '/') || (strlen(config) > 5 && !strcmp(config + strlen(config) - 5, ".json"));
        if (is_file ? tide_llama_config_load(ctx, config, &gc) : tide_llama_config_named(ctx, config, &gc))
            die("configuration");
        if (layers) gc.num_hidden_layers = layers;
        if (gc.max_position_embeddings < seq + 64) gc.max_position_embeddings = seq + 64;
        gc.dtype = TIDE_BF16;
        fprintf(stderr, "bench_gpu_offload: generating a synthetic %s checkpoint (%d layers, bf16, %.2f GiB) in %s\n",
                gc.name, gc.num_hidden_layers, (double)tide_llama_config_params(&gc) * 2 / GIB, dir);
        double t0 = tide_now();
        if (tide_checkpoint_make_synthetic(ctx, &gc, 0, 0, dir)) die("generating the model");
        fprintf(stderr, "bench_gpu_offload: generated in %.1f s\n", tide_now() - t0);
    }
    tide_checkpoint *ck = NULL;
    if (tide_checkpoint_open(ctx, dir, &ck)) die("opening the checkpoint");
    const tide_llama_config *cfg = tide_checkpoint_config(ck);
    if (layers && cfg->num_hidden_layers != layers)
        fprintf(stderr, "bench_gpu_offload: note: %s already holds a %d-layer %s checkpoint; --layers/--quick/--config "
                        "apply only when generating one\n", dir, cfg->num_hidden_layers, cfg->name);
    if (seq > cfg->max_position_embeddings) {
        fprintf(stderr, "bench_gpu_offload: --seq %d exceeds the checkpoint's max_position_embeddings %d\n", seq,
                cfg->max_position_embeddings);
        return 2;
    }
    double t_load = tide_now();
    if (tide_checkpoint_prefetch(ck)) die("reading the checkpoint");
    t_load = tide_now() - t_load;
    uint64_t max_tensor = 0, ck_bytes = 0;
    for (int i = 0; i < tide_checkpoint_n_tensors(ck); i++) {
        tide_tensor_info ti;
        if (tide_checkpoint_get_index(ck, i, &ti)) die("checkpoint");
        max_tensor = TIDE_MAX(max_tensor, ti.nbytes);
        ck_bytes += ti.nbytes;
    }

    int32_t *prompt = xcalloc((size_t)seq, sizeof *prompt);
    for (int i = 0; i < seq; i++) prompt[i] = (int32_t)((1u + (uint32_t)i * 2654435761u) % (uint32_t)cfg->vocab_size);

    /* 4. the graph the model will plan (same options as the model's prefill),
     * its unconstrained peak on the profile, the budgets */
    tide_graph *g = NULL;
    tide_llama_graph_opts go = {.batch = 1, .seq = seq, .ctx_len = seq, .fresh_cache = true};
    if (tide_llama_build(ctx, cfg, &go, &g)) die("building the graph");
    uint64_t peak = tide_plan_unconstrained_peak(ctx, g, &hw, 1);
    if (!peak) die("unconstrained peak");
    uint64_t cap = TIDE_MIN(peak, hw.device_mem_bytes);
    /* every host copy moves one whole tensor of the graph */
    uint64_t max_copy = TIDE_MAX(max_tensor, (uint64_t)256 << 20);
    for (int t = 0; t < g->n_tensors; t++) max_copy = TIDE_MAX(max_copy, g->tensors[t].nbytes);

    /* 5. buffers for the plain copies (kept for the whole run, outside every
     * budget), and the plain figures that need no run */
    void *dev = NULL, *host = NULL;
    bool pinned = false;
    if (be->vt->alloc(be, max_copy, &dev)) die("device buffer for the plain copies");
    if (be->vt->host_alloc && be->vt->host_alloc(be, max_copy, &host) == TIDE_OK) {
        pinned = true;
    } else {
        tide_err_clear(ctx);
        host = aligned_alloc(4096, (max_copy + 4095) & ~(uint64_t)4095);
        if (!host) die("host buffer for the plain copies");
    }
    memset(host, 1, max_copy);
    const uint64_t big = 256ull << 20;
    double big_h2d = gbps(big, time_copy(be, dev, host, big, true));
    double big_d2h = gbps(big, time_copy(be, dev, host, big, false));
    /* every checkpoint tensor once, from the memory-mapped checkpoint
     * (pageable memory: what tide's weight LOADs would read unpinned) */
    double tp = tide_now();
    for (int i = 0; i < tide_checkpoint_n_tensors(ck); i++) {
        tide_tensor_info ti;
        if (tide_checkpoint_get_index(ck, i, &ti) || be->vt->to_device(be, NULL, dev, ti.data, ti.nbytes))
            die("copy from the checkpoint mapping");
    }
    double pageable_bw = gbps(ck_bytes, tide_now() - tp);

    if (json_path && !(json_file = fopen(json_path, "w"))) {
        perror(json_path);
        return 1;
    }
    printf("# bench gpu_offload: %s, %d layers, %s weights (%.2f GiB), prefill %d tokens, batch 1\n\n", cfg->name,
           cfg->num_hidden_layers, tide_dtype_name(cfg->dtype), (double)ck_bytes / GIB, seq);
    const char *sync_env = getenv("TIDE_EXEC_SYNC");
    bool sync_issue = sync_env && *sync_env && strcmp(sync_env, "0");
    bool async_issue = tide_backend_has_events(be) && !sync_issue;
    printf("backend %s, matmul %s, %s issue; profile %s%s; unconstrained peak on the profile %.2f GiB; %d timed run(s) per row after "
           "one untimed; checkpoint read in %.1f s\n",
           tide_backend_name(be), tide_matmul_name(tide_backend_matmul(be)),
           async_issue ? "asynchronous (events)" : "synchronous (TIDE_EXEC_SYNC or no events)", hw.name, f32_matmul ? " (f16/bf16 matmul rate set to the f32 rate)" : "",
           (double)peak / GIB, reps, t_load);
    printf("plain %s copies of 256 MiB: h2d %.2f GB/s, d2h %.2f GB/s; every checkpoint tensor from the "
           "memory-mapped checkpoint (pageable, as unpinned weight loads read it): h2d %.2f GB/s\n",
           pinned ? "pinned" : "PAGEABLE (no host_alloc)", big_h2d, big_d2h, pageable_bw);
    char line[4096], umsg[512];
    snprintf(line, sizeof line,
             "{\"bench\":\"gpu_offload\",\"row\":\"setup\",\"backend\":\"%s\",\"matmul\":\"%s\",\"async_issue\":%s,\"config\":\"%s\",\"layers\":%d,"
             "\"seq\":%d,\"hw\":\"%s\",\"weight_bytes\":%llu,\"unconstrained_peak_bytes\":%llu,\"reps\":%d,"
             "\"plain_pinned\":%s,\"plain_h2d_256m_bw\":%.0f,\"plain_d2h_256m_bw\":%.0f,\"pageable_ckpt_h2d_bw\":%.0f}",
             tide_backend_name(be), tide_matmul_name(tide_backend_matmul(be)), async_issue ? "true" : "false", cfg->name,
             cfg->num_hidden_layers, seq,
             hw.name, (unsigned long long)ck_bytes,
             (unsigned long long)peak, reps, pinned ? "true" : "false", big_h2d * 1e9, big_d2h * 1e9,
             pageable_bw * 1e9);
    emit(line);

    /* 6. unconstrained: its own model, freed afterwards so its resident
     * weights do not sit beside the offloaded runs' arena */
    tide_model_opts mo = {.max_batch = 1, .ctx_len = seq, .sync_issue = sync_issue};
    tide_gen_stats ref = {.prefill_s = 1e30};
    bool have_unc = false, have_ref = false;
    char unc_msg[512] = "";
    int32_t ref_tok = -1, tok;
    uint64_t ref_hash = 0;
    const char *ref_label = "unconstrained";
    static char ref_label_buf[64];
    int unc_identical = 0, unc_runs = 0;
    double unc_first_s = 0;
    int rc = 0;
    {
        tide_model *m = NULL;
        if (tide_model_new(ctx, ck, be, &mo, &m)) die("preparing the model");
        fprintf(stderr, "bench_gpu_offload: unconstrained prefill (the first run uploads the weights)\n");
        for (int r = 0; r <= reps; r++) {
            tide_gen_stats t;
            tide_status st = tide_model_generate(m, prompt, seq, 1, &tok, &t);
            if (st) {
                snprintf(unc_msg, sizeof unc_msg, "%s: %s", tide_status_str(st), tide_ctx_last_error(ctx));
                fprintf(stderr, "bench_gpu_offload: unconstrained run failed (%s); offloaded runs are checked "
                                "against the first successful offloaded run instead\n", unc_msg);
                if (st != TIDE_E_NOMEM) rc = 1;
                have_unc = false;
                break;
            }
            if (!have_ref) {
                have_ref = true;
                ref_hash = t.logits_hash;
                ref_tok = tok;
            }
            unc_runs++;
            unc_identical += t.logits_hash == ref_hash && tok == ref_tok;
            if (r == 0) {
                unc_first_s = t.prefill_s;
                continue;
            }
            have_unc = true;
            if (t.prefill_s < ref.prefill_s) ref = t;
        }
        if (!have_unc) {
            have_ref = false;
            ref = (tide_gen_stats){0};
        }
        tide_model_free(m);
    }
    if (have_unc && unc_identical != unc_runs) rc = 1;
    if (have_unc)
        printf("unconstrained prefill: %.3f s (%.0f tokens/s; first run, with the weight upload, %.3f s)%s\n",
               ref.prefill_s, seq / ref.prefill_s, unc_first_s,
               unc_identical == unc_runs ? "" : "; RUNS DIFFER FROM EACH OTHER");
    else
        printf("unconstrained prefill: did not run (%s)\n", unc_msg);
    snprintf(line, sizeof line,
             "{\"bench\":\"gpu_offload\",\"row\":\"unconstrained\",\"status\":\"%s\",\"seq\":%d,\"wall_s\":%.4f,"
             "\"first_wall_s\":%.4f,\"tokens_per_s\":%.1f,\"next_token\":%d,\"bit_identical\":%s,\"message\":\"%s\"}",
             have_unc ? "ok" : "error", seq, have_unc ? ref.prefill_s : 0, unc_first_s,
             have_unc ? seq / ref.prefill_s : 0, have_unc ? (int)ref_tok : -1,
             !unc_runs ? "null" : unc_identical == unc_runs ? "true" : "false", json_text(unc_msg, umsg, sizeof umsg));
    emit(line);

    /* 7. offloaded: one model for every budget and policy; each row's JSON
     * line is printed as soon as it is measured */
    int n_rows = n_bud * n_pol;
    row *rows = xcalloc((size_t)n_rows, sizeof *rows);
    tide_model *m = NULL;
    if (tide_model_new(ctx, ck, be, &mo, &m)) die("preparing the model");
    for (int bi = 0; bi < n_bud; bi++) {
        uint64_t budget = (uint64_t)((double)cap * pcts[bi] / 100.0) & ~(uint64_t)255;
        for (int pi = 0; pi < n_pol; pi++) {
            int ri = bi * n_pol + pi;
            row *R = &rows[ri];
            R->pct = pcts[bi];
            R->budget = budget;
            R->policy = pol_s[pi];
            tide_plan_opts po = {.device_budget = budget, .n_iter = 1, .hw = &hw};
            tide_policy_parse(R->policy, &po.policy);
            R->have_bounds = budget && tide_plan_bounds(ctx, g, &po, &R->b) == TIDE_OK;
            tide_status st = TIDE_OK;
            if (!budget) {
                R->status = ROW_SKIPPED;
                snprintf(R->msg, sizeof R->msg, "budget rounds to 0 bytes");
            } else {
                fprintf(stderr, "bench_gpu_offload: %s at %g%% (%.3f GiB)\n", R->policy, R->pct, (double)budget / GIB);
                tide_offload_opts o = {.budget_kind = TIDE_BUDGET_BYTES, .bytes = budget, .policy = R->policy,
                                       .hw = hw_name, .timeline = true};
                st = tide_model_set_offload(m, &o);
            }
            R->best.prefill_s = 1e30;
            for (int r = 0; r <= reps && !st && !R->status; r++) {
                tide_gen_stats t;
                st = tide_model_generate(m, prompt, seq, 1, &tok, &t);
                if (st) break;
                if (!have_ref) {
                    have_ref = true;
                    ref_hash = t.logits_hash;
                    ref_tok = tok;
                    snprintf(ref_label_buf, sizeof ref_label_buf, "%s at %g%%", R->policy, R->pct);
                    ref_label = ref_label_buf;
                }
                R->runs++;
                R->identical_runs += t.logits_hash == ref_hash && tok == ref_tok;
                if (r == 0) {
                    R->first = t;
                    continue; /* untimed: plans and sets up the executor */
                }
                if (t.prefill_s < R->best.prefill_s) {
                    R->best = t;
                    link_stats(m, &R->h2d, &R->d2h);
                }
            }
            if (st) {
                R->status = st == TIDE_E_INFEASIBLE ? ROW_INFEASIBLE : ROW_ERROR;
                snprintf(R->msg, sizeof R->msg, "%s", tide_ctx_last_error(ctx));
                fprintf(stderr, "bench_gpu_offload:   %s: %s\n", row_status(R), R->msg);
                if (R->status == ROW_ERROR) rc = 1;
            }
            if (R->status) R->best = (tide_gen_stats){0};
            if (R->runs && R->identical_runs != R->runs) rc = 1;
            if (!R->status && tide_model_notice(m)[0])
                snprintf(R->msg, sizeof R->msg, "note: %s", tide_model_notice(m));
            /* the plain copies of the same sizes, now, while nothing else runs */
            for (int k = 0; k < R->h2d.sizes.n; k++) plain_want(R->h2d.sizes.v[k].size);
            for (int k = 0; k < R->d2h.sizes.n; k++) plain_want(R->d2h.sizes.v[k].size);
            for (int k = 0; k < n_plain; k++)
                if (!plain[k].h2d_s) {
                    plain[k].h2d_s = time_copy(be, dev, host, plain[k].size, true);
                    plain[k].d2h_s = time_copy(be, dev, host, plain[k].size, false);
                }
            R->h2d.plain_s = plain_time(&R->h2d.sizes, true);
            R->d2h.plain_s = plain_time(&R->d2h.sizes, false);
            if (!R->status)
                fprintf(stderr, "bench_gpu_offload:   %.3f s%s; h2d %.2f GB/s vs plain %.2f; %s\n",
                        R->best.prefill_s, have_unc ? "" : " (no unconstrained run)",
                        gbps(R->h2d.bytes, R->h2d.busy_s), gbps(R->h2d.bytes, R->h2d.plain_s),
                        R->identical_runs == R->runs ? "bit-identical" : "OUTPUTS DIFFER");
            emit_row(R, seq, have_unc ? ref.prefill_s : 0, tide_speedup(rows, n_pol, ri), ref_label);
        }
    }
    tide_model_free(m);
    tide_graph_free(g);
    if (pinned) be->vt->host_free(be, host);
    else free(host);
    be->vt->dealloc(be, dev);

    /* 8. the tables */
    printf("\nreference for the bit-for-bit check: %s\n", have_ref ? ref_label : "none (no run succeeded)");
    printf("\n## Prefill %d tokens: time, x of the lower bound, check\n\n", seq);
    printf("| budget | GiB | policy | wall s | x unconstrained | exec s | predicted s | exec/pred | exec x LB | "
           "pred x LB | tide speed-up | first run s | bit-identical |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    if (have_unc)
        printf("| none | - | unconstrained | %.3f | 1.000 | - | - | - | - | - | - | %.3f | %s |\n", ref.prefill_s,
               unc_first_s, unc_identical == unc_runs ? "reference" : "NO (runs differ)");
    for (int i = 0; i < n_rows; i++) {
        const row *R = &rows[i];
        double sp = tide_speedup(rows, n_pol, i);
        if (R->status) {
            printf("| %g%% | %.3f | %s | %s | | | | | | | | | %s |\n", R->pct, (double)R->budget / GIB, R->policy,
                   row_status(R), R->runs ? (R->identical_runs == R->runs ? "yes" : "NO") : "-");
            continue;
        }
        const tide_gen_stats *s = &R->best;
        double lb = R->have_bounds ? R->b.lower_bound_s : 0;
        char unc[32] = "-", xlb[32] = "-", plb[32] = "-", vs[32] = "-";
        if (have_unc) snprintf(unc, sizeof unc, "%.3f", s->prefill_s / ref.prefill_s);
        if (lb > 0) {
            snprintf(xlb, sizeof xlb, "%.3f", s->exec_s / lb);
            snprintf(plb, sizeof plb, "%.3f", s->predicted_prefill_s / lb);
        }
        if (sp > 0) snprintf(vs, sizeof vs, "%.2fx", sp);
        printf("| %g%% | %.3f | %s | %.3f | %s | %.3f | %.3f | %.3f | %s | %s | %s | %.3f | %s |\n", R->pct,
               (double)R->budget / GIB, R->policy, s->prefill_s, unc, s->exec_s, s->predicted_prefill_s,
               s->predicted_prefill_s > 0 ? s->exec_s / s->predicted_prefill_s : 0, xlb, plb, vs,
               R->first.prefill_s, R->identical_runs == R->runs ? "yes" : "NO");
    }
    printf("\nexec: the executor's wall time; LB: tide_plan_bounds on the profile (max of total compute and the "
           "minimum bytes per link / bandwidth); tide speed-up: this policy's wall time / tide's at the same budget; "
           "first run: the untimed run, which also plans and sets up the executor\n");

    printf("\n## Host link: tide's achieved copy bandwidth vs plain %s copies of the same sizes (target >= 0.9)\n\n",
           pinned ? "pinned" : "pageable");
    printf("| budget | policy | h2d GiB | h2d busy s | tide h2d GB/s | plain GB/s | ratio | from homes GB/s | "
           "d2h GiB | d2h busy s | tide d2h GB/s | plain GB/s | ratio |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (int i = 0; i < n_rows; i++) {
        const row *R = &rows[i];
        if (R->status) continue;
        const link_use *h = &R->h2d, *d = &R->d2h;
        double th = gbps(h->bytes, h->busy_s), ph = gbps(h->bytes, h->plain_s);
        double td = gbps(d->bytes, d->busy_s), pd = gbps(d->bytes, d->plain_s);
        printf("| %g%% | %s | %.2f | %.3f | %.2f | %.2f | %.3f | %.2f | %.2f | %.3f | %.2f | %.2f | %.3f |\n", R->pct,
               R->policy, (double)h->bytes / GIB, h->busy_s, th, ph, ph > 0 ? th / ph : 0,
               gbps(h->home_bytes, h->home_s), (double)d->bytes / GIB, d->busy_s, td, pd, pd > 0 ? td / pd : 0);
    }
    printf("\nbusy: the union of the measured intervals of the run's host LOADs (STOREs); plain: the same copies, "
           "one call each, back to back; from homes: the part read from the tensors' homes (weights: their "
           "pinned copies, see the notes of the rows for any left in the pageable checkpoint mapping)\n");

    printf("\n## Summary per budget (wall time, exec x LB)\n\n| budget | GiB |");
    for (int k = 0; k < n_pol; k++) printf(" %s s | %s xLB |", pol_s[k], pol_s[k]);
    printf(" all bit-identical |\n|---|---|");
    for (int k = 0; k < n_pol; k++) printf("---|---|");
    printf("---|\n");
    for (int bi = 0; bi < n_bud; bi++) {
        printf("| %g%% | %.3f |", pcts[bi], (double)rows[bi * n_pol].budget / GIB);
        bool all_same = true;
        int n_runs = 0;
        for (int k = 0; k < n_pol; k++) {
            const row *R = &rows[bi * n_pol + k];
            all_same = all_same && R->identical_runs == R->runs;
            n_runs += R->runs;
            if (R->status) printf(" %s | - |", row_status(R));
            else if (R->have_bounds && R->b.lower_bound_s > 0)
                printf(" %.3f | %.3f |", R->best.prefill_s, R->best.exec_s / R->b.lower_bound_s);
            else printf(" %.3f | - |", R->best.prefill_s);
        }
        printf(" %s |\n", !n_runs ? "-" : all_same ? "yes" : "NO");
    }

    printf("\nfor bench/hf_accelerate.py at the same GPU budgets:");
    for (int bi = 0; bi < n_bud; bi++) printf(" %g%% = --budget %llu", pcts[bi], (unsigned long long)rows[bi * n_pol].budget);
    printf("\nresult: %s\n", rc ? "FAILED (a run failed or outputs differ; see above)" : "ok, every run bit-identical");

    if (json_file) fclose(json_file);
    for (int i = 0; i < n_rows; i++) {
        link_free(&rows[i].h2d);
        link_free(&rows[i].d2h);
    }
    free(rows);
    free(plain);
    free(prompt);
    tide_checkpoint_free(ck);
    tide_backend_free(be);
    tide_ctx_free(ctx);
    return rc;
}
