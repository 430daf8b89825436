/*
 * plan_table.c - the planner benchmark: tide against the lower bound and the
 * static-layer and lru baselines, all planned and simulated in one run.
 *
 *   bench_plan_table [--quick] [--grid] [--json FILE]
 *
 * Table 1: reference workloads x hardware profiles x budgets (100%, 50%, 25%,
 *   10% of the unconstrained peak, capped at the profile's memory, and each
 *   policy's own minimum): predicted makespan as x of the lower bound, and tide's
 *   speed-up over each baseline.
 * Table 2: minimum feasible budgets, tide vs static-layer.
 * Table 3 (--grid): which batch x seq cells each policy can plan at all on the
 *   profile's whole memory (llama-7b on p100-16g, llama-65b on v100-32g).
 * Table 4: planning time of llama-65b prefill and of a 100k-op random graph.
 * Every plan is verified before it is counted.
 */
#include "runtime/tiling.h"
#include "sim/sim.h"
#include "verify/verify.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct workload {
    const char *name, *config;
    int batch, seq, decode; /* decode > 0: prompt seq, then `decode` new tokens */
} workload;

static const workload workloads[] = {
    {"llama-7b prefill b1 s2048", "llama-7b", 1, 2048, 0},
    {"llama-7b prefill b8 s2048", "llama-7b", 8, 2048, 0},
    {"llama-65b prefill b1 s2048", "llama-65b", 1, 2048, 0},
    {"llama-2-70b gen b32 p512+32", "llama-2-70b", 32, 512, 32},
};
static const char *const profiles[] = {"p100-16g", "v100-32g", "h100-80g"};

typedef struct result {
    bool ok;
    double makespan, lb, ideal, plan_s;
    uint64_t peak, h2d;
} result;

static tide_ctx *ctx;
static FILE *json;

/* Graphs of a workload: one (prefill) or two (prefill, then decode steps). */
static int workload_opts(const workload *w, tide_llama_config *cfg, tide_llama_graph_opts go[2], int n_iter[2]);

static int build(const workload *w, tide_graph **g, int *n_iter) {
    tide_llama_config cfg;
    tide_llama_graph_opts go[2];
    int ng = workload_opts(w, &cfg, go, n_iter);
    for (int k = 0; k < ng; k++) /* ng < 0: none */
        if (tide_llama_build(ctx, &cfg, &go[k], &g[k])) return -1;
    return ng;
}

static result run_policy(tide_graph **g, const int *n_iter, int ng, const tide_hw *hw, tide_policy pol,
                         uint64_t budget) {
    result r = {.ok = true};
    for (int k = 0; k < ng; k++) {
        tide_plan_opts po = {.policy = pol, .device_budget = budget, .n_iter = n_iter[k], .hw = hw};
        tide_plan *p = NULL;
        if (tide_plan_make(ctx, g[k], &po, &p)) {
            r.ok = false;
            return r;
        }
        if (tide_plan_verify(p)) {
            fprintf(stderr, "bench: plan failed verification: %s\n", tide_ctx_last_error(ctx));
            exit(1);
        }
        tide_bounds b;
        if (tide_plan_bounds(ctx, g[k], &po, &b)) {
            fprintf(stderr, "bench: bounds: %s\n", tide_ctx_last_error(ctx));
            exit(1);
        }
        r.makespan += p->stats.makespan_s;
        r.plan_s += p->stats.plan_seconds;
        r.peak = TIDE_MAX(r.peak, p->stats.peak_device_bytes);
        r.h2d += p->stats.bytes_h2d;
        r.lb += b.lower_bound_s;
        r.ideal += b.ideal_s;
        tide_plan_free(p);
    }
    return r;
}

static uint64_t min_budget(tide_graph **g, const int *n_iter, int ng, const tide_hw *hw, tide_policy pol) {
    uint64_t m = 0;
    for (int k = 0; k < ng; k++) {
        tide_plan_opts po = {.policy = pol, .n_iter = n_iter[k], .hw = hw};
        uint64_t b = 0;
        if (tide_plan_min_budget(ctx, g[k], &po, &b)) return 0;
        m = TIDE_MAX(m, b);
    }
    return m;
}

/* The graph options and iteration counts of a workload's graphs (prefill,
 * then the decode steps); returns how many graphs it has, -1 for an unknown
 * configuration. */
static int workload_opts(const workload *w, tide_llama_config *cfg, tide_llama_graph_opts go[2], int n_iter[2]) {
    if (tide_llama_config_named(ctx, w->config, cfg)) return -1;
    int ctx_len = w->seq + w->decode;
    go[0] = (tide_llama_graph_opts){.batch = w->batch, .seq = w->seq, .ctx_len = ctx_len, .fresh_cache = true};
    go[1] = (tide_llama_graph_opts){.batch = w->batch, .seq = 1, .ctx_len = ctx_len};
    n_iter[0] = 1;
    n_iter[1] = w->decode - 1; /* the prefill yields the first new token */
    return w->decode ? 2 : 1;
}

/* tide's makespan over the lower bound at budget b, each graph of the
 * workload tiled as tide run would (the coarsest level that fits); 0 when
 * nothing fits. */
static double tiled_xlb_at(const workload *w, const tide_hw *hw, uint64_t b, int *level) {
    tide_llama_config cfg;
    tide_llama_graph_opts go[2];
    int n_iter[2], ng = workload_opts(w, &cfg, go, n_iter);
    double mk = 0, lb = 0;
    *level = 0;
    for (int k = 0; k < ng; k++) {
        tide_plan_opts po = {.policy = TIDE_POLICY_TIDE, .device_budget = b, .n_iter = n_iter[k], .hw = hw};
        tide_graph *g = NULL, *g0 = NULL;
        int lv = 0;
        tide_plan *p = NULL;
        tide_bounds bd;
        bool ok = !tide_llama_plan_tiled(ctx, &cfg, &go[k], &po, TIDE_TILE_AUTO, &g, &lv, &p, NULL) &&
                  !tide_plan_verify(p) &&
                  !tide_llama_build(ctx, &cfg, &go[k], &g0) && !tide_plan_bounds(ctx, g0, &po, &bd);
        if (ok) {
            mk += p->stats.makespan_s;
            lb += bd.lower_bound_s;
            *level = TIDE_MAX(*level, lv);
        }
        tide_plan_free(p);
        tide_graph_free(g);
        tide_graph_free(g0);
        if (!ok) return 0;
    }
    return lb > 0 ? mk / lb : 0;
}

static void table1(bool quick) {
    printf("\n## Table 1: predicted makespan, x of lower bound (tide's speed-up over each baseline)\n\n");
    printf("| workload | hw | budget | GiB | tide xLB | static-layer xLB | lru xLB | tide vs static | tide vs lru |\n");
    printf("|---|---|---|---|---|---|---|---|---|\n");
    int nw = quick ? 2 : (int)(sizeof workloads / sizeof workloads[0]);
    double worst_lb = 0;
    int slower = 0, rows = 0, tiled_rows = 0;
    for (int wi = 0; wi < nw; wi++) {
        const workload *w = &workloads[wi];
        tide_graph *g[2] = {0};
        int n_iter[2], ng = build(w, g, n_iter);
        if (ng < 0) {
            fprintf(stderr, "bench: %s\n", tide_ctx_last_error(ctx));
            exit(1);
        }
        for (int pi = 0; pi < 3; pi++) {
            tide_hw hw;
            if (tide_hw_load(ctx, profiles[pi], &hw)) {
                fprintf(stderr, "bench: %s\n", tide_ctx_last_error(ctx));
                exit(1);
            }
            uint64_t peak = 0;
            for (int k = 0; k < ng; k++) peak = TIDE_MAX(peak, tide_plan_unconstrained_peak(ctx, g[k], &hw, n_iter[k]));
            uint64_t cap = TIDE_MIN(peak, hw.device_mem_bytes);
            const double fr[] = {1.0, 0.5, 0.25, 0.10, 0};
            for (int fi = 0; fi < 5; fi++) {
                result r[TIDE_POLICY_INFERENCE_COUNT];
                uint64_t budget[TIDE_POLICY_INFERENCE_COUNT];
                char label[32];
                /* every policy at the same budget; "min" is tide's minimum */
                uint64_t b = fr[fi] > 0 ? (uint64_t)(cap * fr[fi]) : min_budget(g, n_iter, ng, &hw, TIDE_POLICY_TIDE);
                for (int pol = 0; pol < TIDE_POLICY_INFERENCE_COUNT; pol++) {
                    budget[pol] = b;
                    r[pol] = b ? run_policy(g, n_iter, ng, &hw, pol, b) : (result){0};
                }
                if (fr[fi] > 0) snprintf(label, sizeof label, "%.0f%%", fr[fi] * 100);
                else snprintf(label, sizeof label, "min");
                char cells[3][32], vs[2][32];
                for (int pol = 0; pol < 3; pol++) {
                    if (r[pol].ok && r[pol].lb > 0) snprintf(cells[pol], 32, "%.3f", r[pol].makespan / r[pol].lb);
                    else snprintf(cells[pol], 32, "infeasible");
                }
                int tiled_lv = 0;
                double tiled_x = !r[0].ok && fr[fi] > 0 ? tiled_xlb_at(w, &hw, b, &tiled_lv) : 0;
                if (tiled_x > 0) {
                    snprintf(cells[0], 32, "%.3f (tiled, level %d)", tiled_x, tiled_lv);
                    tiled_rows++;
                }
                for (int k = 1; k <= 2; k++) {
                    if (r[0].ok && r[k].ok) snprintf(vs[k - 1], 32, "%.2fx", r[k].makespan / r[0].makespan);
                    else snprintf(vs[k - 1], 32, "-");
                }
                printf("| %s | %s | %s | %.1f | %s | %s | %s | %s | %s |\n", w->name, profiles[pi], label,
                       budget[0] / 1073741824.0, cells[0], cells[1], cells[2], vs[0], vs[1]);
                if (r[0].ok && r[0].lb > 0 && fr[fi] > 0) worst_lb = TIDE_MAX(worst_lb, r[0].makespan / r[0].lb);
                for (int k = 1; k <= 2; k++)
                    if (r[0].ok && r[k].ok && r[0].makespan > r[k].makespan * 1.0005) slower++;
                rows++;
                if (json)
                    fprintf(json, "{\"table\":1,\"workload\":\"%s\",\"hw\":\"%s\",\"budget\":\"%s\",\"budget_bytes\":%llu,"
                            "\"tide_s\":%.6f,\"lb_s\":%.6f,\"ideal_s\":%.6f,\"static_s\":%.6f,\"lru_s\":%.6f,"
                            "\"tide_ok\":%d,\"static_ok\":%d,\"lru_ok\":%d,\"plan_s\":%.4f}\n",
                            w->name, profiles[pi], label, (unsigned long long)budget[0], r[0].makespan, r[0].lb,
                            r[0].ideal, r[1].makespan, r[2].makespan, r[0].ok, r[1].ok, r[2].ok, r[0].plan_s);
                fflush(stdout);
            }
        }
        for (int k = 0; k < ng; k++) tide_graph_free(g[k]);
    }
    printf("\nsummary: %d rows; worst tide x lower bound %.3f over the percentage rows planned untiled (target <= 1.10; min rows spill by necessity and the bound counts no spills); rows where tide is slower "
           "than a baseline at the same budget: %d (target 0); percentage rows no policy can plan untiled that tide plans tiled: %d\n",
           rows, worst_lb, slower, tiled_rows);
}

/* tide's minimum budget for a workload when its graphs may be tiled: the
 * largest over its graphs of each graph's smallest minimum over the tiling
 * levels; *level gets the finest level used and *xlb the makespan at that
 * budget (each graph re-tiled for it, as tide run does) over the lower bound
 * of the untiled graphs. */
static uint64_t tiled_min(const workload *w, const tide_hw *hw, int *level, double *xlb) {
    tide_llama_config cfg;
    tide_llama_graph_opts go[2];
    int n_iter[2], ng = workload_opts(w, &cfg, go, n_iter);
    uint64_t m = 0;
    *level = 0;
    for (int k = 0; k < ng; k++) {
        tide_plan_opts po = {.policy = TIDE_POLICY_TIDE, .n_iter = n_iter[k], .hw = hw};
        tide_graph *g = NULL;
        uint64_t b = 0;
        int lv = 0;
        if (tide_llama_plan_tiled(ctx, &cfg, &go[k], &po, TIDE_TILE_AUTO, &g, &lv, NULL, &b)) return 0;
        tide_graph_free(g);
        m = TIDE_MAX(m, b);
    }
    /* at that budget each graph is tiled again as tide run does */
    double x = tiled_xlb_at(w, hw, m, level);
    if (!(x > 0)) {
        fprintf(stderr, "bench: tiled plan at the minimum: %s\n", tide_ctx_last_error(ctx));
        exit(1);
    }
    *xlb = x;
    return m;
}

static void table2(bool quick) {
    printf("\n## Table 2: minimum feasible budget, tide vs static-layer (double-buffered)\n\n");
    printf("| workload | hw | tide min GiB (tiled) | tiling level | tide x LB there | tide min GiB (untiled) | static-layer min GiB | lru min GiB | static / tide | tide x LB at static/5 (level) |\n|---|---|---|---|---|---|---|---|---|---|\n");
    int nw = quick ? 2 : (int)(sizeof workloads / sizeof workloads[0]);
    for (int wi = 0; wi < nw; wi++) {
        tide_graph *g[2] = {0};
        int n_iter[2], ng = build(&workloads[wi], g, n_iter);
        tide_hw hw;
        tide_hw_load(ctx, "h100-80g", &hw);
        uint64_t m[3];
        for (int pol = 0; pol < 3; pol++) m[pol] = min_budget(g, n_iter, ng, &hw, pol);
        int level = 0;
        double xlb = 0, t0 = tide_now();
        uint64_t mt = tiled_min(&workloads[wi], &hw, &level, &xlb);
        double secs = tide_now() - t0;
        int lv5 = 0;
        double x5 = tiled_xlb_at(&workloads[wi], &hw, m[1] / 5, &lv5);
        printf("| %s | h100-80g | %.3f | %d | %.2f | %.3f | %.3f | %.3f | %.1fx | %.2f (%d) |\n", workloads[wi].name,
               mt / 1073741824.0, level, xlb, m[0] / 1073741824.0, m[1] / 1073741824.0, m[2] / 1073741824.0,
               mt ? (double)m[1] / mt : 0, x5, lv5);
        if (json)
            fprintf(json, "{\"table\":2,\"workload\":\"%s\",\"tide_min\":%llu,\"tide_min_untiled\":%llu,"
                    "\"tile_level\":%d,\"x_lb\":%.4f,\"search_s\":%.3f,\"static_min\":%llu,\"lru_min\":%llu}\n",
                    workloads[wi].name, (unsigned long long)mt, (unsigned long long)m[0], level, xlb, secs,
                    (unsigned long long)m[1], (unsigned long long)m[2]);
        for (int k = 0; k < ng; k++) tide_graph_free(g[k]);
        fflush(stdout);
    }
}

static void table3(void) {
    const struct { const char *config, *hw; } cases[] = {{"llama-7b", "p100-16g"}, {"llama-65b", "v100-32g"}};
    const int batches[] = {1, 2, 4, 8, 16}, seqs[] = {512, 1024, 2048, 4096, 8192};
    for (int c = 0; c < 2; c++) {
        tide_hw hw;
        tide_hw_load(ctx, cases[c].hw, &hw);
        tide_llama_config cfg;
        tide_llama_config_named(ctx, cases[c].config, &cfg);
        printf("\n## Table 3: %s on %s (whole device memory): policies that can plan each cell (T tide, Tk tide tiled at level k, S static-layer, L lru)\n\n",
               cases[c].config, cases[c].hw);
        printf("| batch \\ seq |");
        for (int s = 0; s < 5; s++) printf(" %d |", seqs[s]);
        printf("\n|---|---|---|---|---|---|\n");
        for (int b = 0; b < 5; b++) {
            printf("| %d |", batches[b]);
            for (int s = 0; s < 5; s++) {
                tide_llama_graph_opts go = {.batch = batches[b], .seq = seqs[s], .ctx_len = seqs[s], .fresh_cache = true};
                tide_graph *g = NULL;
                char cell[8] = "";
                if (tide_llama_build(ctx, &cfg, &go, &g) == TIDE_OK) {
                    int one = 1;
                    static const char *const letter[3] = {"T", "S", "L"};
                    for (int pol = 0; pol < 3; pol++)
                        if (run_policy(&g, &one, 1, &hw, pol, hw.device_mem_bytes).ok) strcat(cell, letter[pol]);
                    tide_graph_free(g);
                    if (!strchr(cell, 'T')) { /* tide tiles what does not fit */
                        tide_plan_opts po = {.policy = TIDE_POLICY_TIDE, .device_budget = hw.device_mem_bytes,
                                             .n_iter = 1, .hw = &hw};
                        tide_graph *tg = NULL;
                        int lv = 0;
                        tide_plan *p = NULL;
                        if (tide_llama_plan_tiled(ctx, &cfg, &go, &po, TIDE_TILE_AUTO, &tg, &lv, &p, NULL) == TIDE_OK) {
                            if (!tide_plan_verify(p)) {
                                char t[8];
                                snprintf(t, sizeof t, "T%d", lv);
                                memmove(cell + strlen(t), cell, strlen(cell) + 1);
                                memcpy(cell, t, strlen(t));
                            }
                            tide_plan_free(p);
                        }
                        tide_graph_free(tg);
                    }
                }
                printf(" %s |", cell[0] ? cell : "-");
                fflush(stdout);
            }
            printf("\n");
        }
    }
}

/* A random layered DAG of n GENERIC ops over persistent weights and temps. */
static tide_graph *random_graph(int n_ops, unsigned seed) {
    tide_graph *g = tide_graph_new(ctx);
    srand(seed);
    int n_w = n_ops / 4;
    int *w = malloc(sizeof *w * n_w), *t = malloc(sizeof *t * n_ops);
    char name[32];
    for (int i = 0; i < n_w; i++) {
        int64_t sz = 1024 * (1 + rand() % 4096);
        snprintf(name, sizeof name, "w%d", i);
        tide_graph_add_tensor(g, name, TIDE_F32, TIDE_ROLE_WEIGHT, 1, &sz, &w[i]);
    }
    for (int i = 0; i < n_ops; i++) {
        int64_t sz = 256 * (1 + rand() % 4096);
        snprintf(name, sizeof name, "t%d", i);
        tide_graph_add_tensor(g, name, TIDE_F32, i == n_ops - 1 ? TIDE_ROLE_OUTPUT : TIDE_ROLE_TEMP, 1, &sz, &t[i]);
        int in[3], k = 0;
        in[k++] = w[rand() % n_w];
        if (i > 0) in[k++] = t[i - 1];
        if (i > 8) in[k++] = t[i - 2 - rand() % TIDE_MIN(i - 2, 64)];
        tide_op_args p = {.flops = 1e7 * (1 + rand() % 100)};
        tide_graph_add_op_args(g, TIDE_OP_GENERIC, k, in, 1, &t[i], &p, -1, NULL);
    }
    free(w);
    free(t);
    return g;
}

static void table4(void) {
    printf("\n## Table 4: planning time on this machine\n\n| graph | ops | instructions | plan s | verify s |\n|---|---|---|---|---|\n");
    tide_hw hw;
    tide_hw_load(ctx, "v100-32g", &hw);
    tide_llama_config cfg;
    tide_llama_config_named(ctx, "llama-65b", &cfg);
    tide_llama_graph_opts go = {.batch = 1, .seq = 2048, .ctx_len = 2048, .fresh_cache = true};
    tide_graph *g = NULL;
    tide_llama_build(ctx, &cfg, &go, &g);
    tide_graph *rg = random_graph(100000, 1);
    struct { const char *name; tide_graph *g; uint64_t budget; } rows[] = {
        {"llama-65b prefill s2048, 20% of v100-32g", g, (uint64_t)(hw.device_mem_bytes * 0.2)},
        {"random DAG", rg, 0},
    };
    uint64_t rpeak = tide_plan_unconstrained_peak(ctx, rg, &hw, 1);
    rows[1].budget = rpeak / 4;
    for (int i = 0; i < 2; i++) {
        tide_plan_opts po = {.policy = TIDE_POLICY_TIDE, .device_budget = rows[i].budget, .n_iter = 1, .hw = &hw};
        tide_plan *p = NULL;
        double t0 = tide_now();
        if (tide_plan_make(ctx, rows[i].g, &po, &p)) {
            printf("| %s | %d | infeasible: %s | | |\n", rows[i].name, rows[i].g->n_ops, tide_ctx_last_error(ctx));
            continue;
        }
        double t1 = tide_now();
        tide_status vs = tide_plan_verify(p);
        double t2 = tide_now();
        printf("| %s | %d | %d | %.3f | %.3f%s |\n", rows[i].name, rows[i].g->n_ops, p->n_ins, t1 - t0, t2 - t1,
               vs ? " (FAILED)" : "");
        if (json) fprintf(json, "{\"table\":4,\"graph\":\"%s\",\"ops\":%d,\"plan_s\":%.4f}\n", rows[i].name, rows[i].g->n_ops, t1 - t0);
        tide_plan_free(p);
    }
    tide_graph_free(g);
    tide_graph_free(rg);
}

int main(int argc, char **argv) {
    bool quick = false, grid = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = true;
        else if (!strcmp(argv[i], "--grid")) grid = true;
        else if (!strcmp(argv[i], "--json") && i + 1 < argc) json = fopen(argv[++i], "w");
        else {
            fprintf(stderr, "usage: %s [--quick] [--grid] [--json FILE]\n", argv[0]);
            return 2;
        }
    }
    ctx = tide_ctx_new();
    printf("# tide planner benchmark (predicted by the simulator on each profile; every plan verified)\n");
    table4();
    table2(quick);
    table1(quick);
    if (grid) table3();
    if (json) fclose(json);
    tide_ctx_free(ctx);
    return 0;
}
