/*
 * test_api_plan.c - the planning section of tide.h, as a program using the
 * library sees it: hardware profiles (by name, by path, unknown names and
 * bad files, the list of names), policies and optimizer modes by name, plans
 * of a small model's prefill (their figures, verification, timeline, trace
 * files, bounds, the minimum budget and the tiling search), a planned
 * training step (its tiling, optimizer placement and memory figures), and
 * the refusals of bad budgets and arguments, and every allocation of the
 * wrappers failed in turn (TIDE_E_NOMEM, nothing returned, nothing leaked).
 * Every figure the public
 * functions give is compared with the planner's own for the same inputs
 * (planner/planner.h, runtime/tiling.h, train/train_plan.h): the wrappers
 * must change nothing.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tide.h"

/* the references and fault injection only */
#include "core/alloc_test.h"
#include "planner/planner.h"
#include "runtime/tiling.h"
#include "train/train_plan.h"

typedef struct fixture {
    tide_ctx *ctx;
    tide_hw *hw;
    tide_llama_config cfg;
    tide_llama_graph_opts go;
    tide_graph *g;                /* tinyllama-mini's prefill of 1 x 256 tokens */
    tide_planner_opts po;
    tide_plan_opts ref;           /* the same options as the planner's */
} fixture;

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    f->ctx = tide_ctx_new();
    if (!f->ctx || tide_hw_open(f->ctx, "a100-80g", &f->hw) ||
        tide_llama_config_named(f->ctx, "tinyllama-mini", &f->cfg)) {
        fprintf(stderr, "%s\n", f->ctx ? tide_ctx_last_error(f->ctx) : "no context");
        return -1;
    }
    f->go = (tide_llama_graph_opts){.batch = 1, .seq = 256, .ctx_len = 256, .fresh_cache = true};
    if (tide_llama_build(f->ctx, &f->cfg, &f->go, &f->g)) return -1;
    f->po = tide_planner_opts_default();
    f->po.hw = f->hw;
    f->ref = (tide_plan_opts){.policy = TIDE_POLICY_TIDE, .n_iter = 1, .hw = f->hw};
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    tide_graph_free(f->g);
    tide_hw_free(f->hw);
    tide_ctx_free(f->ctx);
    free(f);
    return 0;
}

static void test_hw_profiles(void **state) {
    fixture *f = *state;
    tide_hw_info i;
    tide_hw_info_get(f->hw, &i);
    assert_string_equal(i.name, "a100-80g");
    assert_true(i.device_mem_bytes >= (uint64_t)79 << 30 && i.device_mem_bytes <= (uint64_t)81 << 30);
    assert_true(i.flops_bf16 > i.flops_f32 && i.h2d_bw > 0 && i.d2h_bw > 0 && i.mem_bw > i.h2d_bw);

    tide_hw *hw = (tide_hw *)1;
    assert_int_equal(tide_hw_open(f->ctx, "no-such-gpu", &hw), TIDE_E_NOT_FOUND);
    assert_null(hw);
    assert_non_null(strstr(tide_ctx_last_error(f->ctx), "no-such-gpu"));
    assert_non_null(strstr(tide_ctx_last_error(f->ctx), "h100-80g")); /* the known names */
    assert_int_equal(tide_hw_open(f->ctx, "bad name!", &hw), TIDE_E_INVALID);
    assert_int_equal(tide_hw_open(f->ctx, NULL, &hw), TIDE_E_INVALID);
    assert_int_equal(tide_hw_open(f->ctx, "/nonexistent/dir/p.json", &hw), TIDE_E_NOT_FOUND);
    assert_null(hw);

    /* a file with a bad field, then the same profile saved and read back */
    char dir[] = "/tmp/tide-api-plan-XXXXXX", path[128];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/bad.json", dir);
    FILE *fp = fopen(path, "w");
    assert_non_null(fp);
    fputs("{\"name\": \"bad\", \"device_mem_bytes\": -5}\n", fp);
    fclose(fp);
    assert_int_equal(tide_hw_open(f->ctx, path, &hw), TIDE_E_FORMAT);
    assert_null(hw);
    snprintf(path, sizeof path, "%s/copy.json", dir);
    assert_int_equal(tide_hw_save(f->ctx, f->hw, path), TIDE_OK);
    assert_int_equal(tide_hw_open(f->ctx, path, &hw), TIDE_OK);
    tide_hw_info j;
    tide_hw_info_get(hw, &j);
    assert_string_equal(j.name, i.name);
    assert_true(j.device_mem_bytes == i.device_mem_bytes && j.flops_bf16 == i.flops_bf16 && j.h2d_bw == i.h2d_bw &&
                j.ssd_count == i.ssd_count && j.ssd_read_bw == i.ssd_read_bw);
    tide_hw_free(hw);
    unlink(path);
    snprintf(path, sizeof path, "%s/bad.json", dir);
    unlink(path);
    rmdir(dir);
    tide_hw_free(NULL);

    char names[256], small[8];
    size_t n = tide_hw_names(names, sizeof names);
    assert_true(n > 0 && n < sizeof names && strlen(names) == n);
    assert_non_null(strstr(names, "a100-80g"));
    assert_non_null(strstr(names, "h100-80g"));
    assert_int_equal(tide_hw_names(small, sizeof small), n); /* cut, the whole length returned */
    assert_int_equal(strlen(small), sizeof small - 1);
    assert_memory_equal(small, names, sizeof small - 1);
}

static void test_names(void **state) {
    fixture *f = *state;
    for (int p = TIDE_POLICY_TIDE; p <= TIDE_POLICY_ZERO_OFFLOAD; p++) {
        tide_policy q;
        assert_int_equal(tide_policy_parse(tide_policy_name((tide_policy)p), &q), 0);
        assert_int_equal(q, p);
    }
    tide_policy q;
    assert_int_equal(tide_policy_parse("fifo", &q), -1);
    assert_string_equal(tide_policy_name(TIDE_POLICY_STATIC_LAYER), "static-layer");
    tide_optim_mode m;
    assert_int_equal(tide_optim_mode_parse(f->ctx, "cpu", &m), TIDE_OK);
    assert_int_equal(m, TIDE_OPTIM_CPU);
    assert_string_equal(tide_optim_mode_name(TIDE_OPTIM_DEVICE), "device");
    assert_int_equal(tide_optim_mode_parse(f->ctx, "gpu", &m), TIDE_E_INVALID);
    assert_non_null(strstr(tide_ctx_last_error(f->ctx), "gpu"));
    int tile;
    assert_int_equal(tide_tile_parse(NULL, "3", &tile), TIDE_OK);
    assert_int_equal(tile, 3);
    assert_int_equal(tide_tile_parse(f->ctx, "9", &tile), TIDE_E_INVALID);

    assert_int_equal(tide_ctx_set_error(f->ctx, TIDE_E_RANGE, "token %d: %s", 7, "bad"), TIDE_E_RANGE);
    assert_string_equal(tide_ctx_last_error(f->ctx), "token 7: bad");
    assert_int_equal(tide_ctx_last_status(f->ctx), TIDE_E_RANGE);
    /* wrapping its own last message */
    tide_ctx_set_error(f->ctx, TIDE_E_IO, "outer: %s", tide_ctx_last_error(f->ctx));
    assert_string_equal(tide_ctx_last_error(f->ctx), "outer: token 7: bad");
    assert_int_equal(tide_ctx_set_error(NULL, TIDE_E_IO, "x"), TIDE_E_IO);
}

/* A plan's public figures against the planner's own plan of the same
 * graph under the same options. */
static void assert_same_plan(const tide_plan *p, const tide_plan *ref) {
    tide_plan_info i;
    tide_plan_info_get(p, &i);
    const tide_plan_stats *s = &ref->stats;
    tide_step_bytes sb = tide_plan_step_bytes(ref);
    assert_int_equal(i.policy, ref->policy);
    assert_int_equal(i.n_iter, ref->n_iter);
    assert_int_equal(i.n_instructions, ref->n_ins);
    assert_int_equal(i.device_budget, ref->device_budget);
    assert_int_equal(i.peak_device_bytes, s->peak_device_bytes);
    assert_int_equal(i.peak_host_bytes, s->peak_host_bytes);
    assert_int_equal(i.peak_ssd_bytes, s->peak_ssd_bytes);
    assert_int_equal(i.bytes_h2d, s->bytes_h2d);
    assert_int_equal(i.bytes_d2h, s->bytes_d2h);
    assert_int_equal(i.bytes_ssd_read, s->bytes_ssd_read);
    assert_int_equal(i.bytes_ssd_write, s->bytes_ssd_write);
    assert_int_equal(i.step_bytes_h2d, sb.h2d);
    assert_int_equal(i.step_bytes_ssd_read, sb.ssd_read);
    assert_true(i.compute_s == s->compute_s && i.makespan_s == s->makespan_s);
    assert_true(i.peak_device_bytes <= i.device_budget);
}

static void test_plan(void **state) {
    fixture *f = *state;
    uint64_t peak = tide_planner_peak(f->ctx, f->g, &f->po);
    assert_int_equal(peak, tide_plan_unconstrained_peak(f->ctx, f->g, f->hw, 1));
    assert_true(peak > 0);
    uint64_t min = 0, ref_min = 0;
    assert_int_equal(tide_planner_min_budget(f->ctx, f->g, &f->po, &min), TIDE_OK);
    assert_int_equal(tide_plan_min_budget(f->ctx, f->g, &f->ref, &ref_min), TIDE_OK);
    assert_int_equal(min, ref_min);
    assert_true(min > 0 && min <= peak);
    uint64_t ws = 0;
    assert_int_equal(tide_planner_max_working_set(f->ctx, f->g, &f->po, &ws), TIDE_OK);
    assert_int_equal(ws, tide_graph_max_working_set(f->g, NULL));
    assert_true(ws <= min);

    /* half way between the minimum and the peak: a plan that offloads */
    f->po.device_budget = f->ref.device_budget = tide_plan_align(min + (peak - min) / 2);
    tide_plan *p = NULL, *ref = NULL;
    assert_int_equal(tide_plan_new(f->ctx, f->g, &f->po, &p), TIDE_OK);
    assert_int_equal(tide_plan_make(f->ctx, f->g, &f->ref, &ref), TIDE_OK);
    assert_same_plan(p, ref);
    assert_int_equal(tide_plan_verify(p), TIDE_OK);
    tide_plan_info pi;
    tide_plan_info_get(p, &pi);
    assert_true(pi.bytes_h2d > 0 && pi.makespan_s > 0 && pi.plan_seconds >= 0);

    tide_bounds b, rb;
    assert_int_equal(tide_planner_bounds(f->ctx, f->g, &f->po, &b), TIDE_OK);
    assert_int_equal(tide_plan_bounds(f->ctx, f->g, &f->ref, &rb), TIDE_OK);
    assert_true(b.lower_bound_s == rb.lower_bound_s && b.ideal_s == rb.ideal_s && b.compute_s == rb.compute_s);
    assert_true(b.lower_bound_s > 0 && b.lower_bound_s <= pi.makespan_s * (1 + 1e-9));

    /* the timeline is the simulator's: its makespan is the plan's */
    tide_timeline *tl = NULL, *other = NULL;
    assert_int_equal(tide_plan_simulate(p, f->hw, &tl), TIDE_OK);
    assert_true(tide_timeline_makespan(tl) == pi.makespan_s);
    assert_true(tide_timeline_step(tl) == pi.makespan_s); /* one iteration */
    char dir[] = "/tmp/tide-api-plan-XXXXXX", json[128], svg[128], out[128];
    assert_non_null(mkdtemp(dir));
    snprintf(json, sizeof json, "%s/t.json", dir);
    snprintf(svg, sizeof svg, "%s/t.svg", dir);
    snprintf(out, sizeof out, "%s/plan.json", dir);
    assert_int_equal(tide_plan_write_trace(p, tl, json, svg), TIDE_OK);
    assert_int_equal(tide_plan_save_json(p, out), TIDE_OK);
    struct stat sb;
    assert_int_equal(stat(json, &sb), 0);
    assert_true(sb.st_size > 100);
    assert_int_equal(stat(svg, &sb), 0);
    assert_true(sb.st_size > 100);
    assert_int_equal(stat(out, &sb), 0);
    /* a timeline of another plan is refused, and nothing is written */
    assert_int_equal(tide_plan_simulate(ref, f->hw, &other), TIDE_OK);
    unlink(json);
    assert_int_equal(tide_plan_write_trace(p, other, json, NULL), TIDE_E_INVALID);
    assert_int_not_equal(stat(json, &sb), 0);
    unlink(svg);
    unlink(out);
    rmdir(dir);
    tide_timeline_free(other);
    tide_timeline_free(tl);
    tide_timeline_free(NULL);
    tide_plan_free(ref);
    tide_plan_free(p);
    tide_plan_free(NULL);

    /* below an op's working set: infeasible, with what it needs */
    f->po.device_budget = 4096;
    p = (tide_plan *)1;
    assert_int_equal(tide_plan_new(f->ctx, f->g, &f->po, &p), TIDE_E_INFEASIBLE);
    assert_null(p);
    assert_non_null(strstr(tide_ctx_last_error(f->ctx), "needs at least"));
    /* no profile */
    tide_planner_opts o = tide_planner_opts_default();
    assert_int_equal(tide_plan_new(f->ctx, f->g, &o, &p), TIDE_E_INVALID);
    assert_int_equal(tide_planner_min_budget(f->ctx, f->g, &o, &min), TIDE_E_INVALID);
    assert_int_equal(tide_planner_peak(f->ctx, f->g, &o), 0);
    assert_int_equal(tide_ctx_last_status(f->ctx), TIDE_E_INVALID);
    assert_int_equal(tide_plan_simulate(NULL, f->hw, &tl), TIDE_E_INVALID);
}

/* The tiling searches: the smallest minimum over the levels, then a budget
 * below the untiled minimum, which plans a tiled level; each the one the
 * runtime's search finds. */
static void test_tiling(void **state) {
    fixture *f = *state;
    /* a longer prompt, whose attention tiles cut the minimum */
    f->go.seq = f->go.ctx_len = 1024;
    tide_graph_free(f->g);
    assert_int_equal(tide_llama_build(f->ctx, &f->cfg, &f->go, &f->g), TIDE_OK);
    tide_graph *g = NULL, *rg = NULL;
    tide_plan *p = NULL, *rp = NULL;
    int level = -1, rlevel = -1;
    uint64_t min = 0, rmin = 0, untiled = 0;
    assert_int_equal(tide_llama_min_budget(f->ctx, &f->cfg, &f->go, &f->po, &g, &level, &min), TIDE_OK);
    assert_int_equal(tide_llama_plan_tiled(f->ctx, &f->cfg, &f->go, &f->ref, TIDE_TILE_AUTO, &rg, &rlevel, NULL, &rmin),
                     TIDE_OK);
    assert_int_equal(min, rmin);
    assert_int_equal(level, rlevel);
    assert_int_equal(tide_graph_n_ops(g), tide_graph_n_ops(rg));
    assert_int_equal(tide_planner_min_budget(f->ctx, f->g, &f->po, &untiled), TIDE_OK);
    assert_true(level > 0 && min < untiled);
    tide_graph_free(g);
    tide_graph_free(rg);

    f->po.device_budget = f->ref.device_budget = tide_plan_align(min + (untiled - min) / 2);
    assert_true(f->po.device_budget < untiled);
    assert_int_equal(tide_llama_plan(f->ctx, &f->cfg, &f->go, &f->po, &g, &level, &p), TIDE_OK);
    assert_int_equal(tide_llama_plan_tiled(f->ctx, &f->cfg, &f->go, &f->ref, TIDE_TILE_AUTO, &rg, &rlevel, &rp, NULL),
                     TIDE_OK);
    assert_true(level > 0);
    assert_int_equal(level, rlevel);
    assert_int_equal(tide_graph_n_ops(g), tide_graph_n_ops(rg));
    assert_true(tide_graph_n_ops(g) > tide_graph_n_ops(f->g)); /* tiles add ops */
    assert_same_plan(p, rp);
    assert_int_equal(tide_plan_verify(p), TIDE_OK);
    tide_plan_free(p);
    tide_plan_free(rp);
    tide_graph_free(g);
    tide_graph_free(rg);

    /* tiling forbidden: the untiled step does not fit */
    f->po.tile = TIDE_TILE_NONE;
    g = (tide_graph *)1;
    assert_int_equal(tide_llama_plan(f->ctx, &f->cfg, &f->go, &f->po, &g, &level, &p), TIDE_E_INFEASIBLE);
    assert_null(g);
    assert_null(p);
}

static void test_train_plan(void **state) {
    fixture *f = *state;
    tide_llama_train_opts to = {.batch = 2, .seq = 64, .accum = 1, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                                .weight_decay = 0.1f, .grad_clip = 1.0f};
    tide_graph *g = NULL;
    assert_int_equal(tide_llama_build_train(f->ctx, &f->cfg, &to, &g), TIDE_OK);
    tide_planner_opts o = f->po;
    o.n_iter = 2;
    uint64_t peak = tide_planner_peak(f->ctx, g, &o);
    double ideal = 0, ref_ideal = 0;
    assert_int_equal(tide_planner_ideal_step(f->ctx, g, &o, &ideal), TIDE_OK);
    assert_int_equal(tide_plan_ideal_step(f->ctx, g, f->hw, &ref_ideal), TIDE_OK);
    assert_true(ideal == ref_ideal && ideal > 0);
    /* with every update on the host the device needs less at once */
    uint64_t ws_dev = 0, ws_host = 0;
    assert_int_equal(tide_planner_max_working_set(f->ctx, g, &o, &ws_dev), TIDE_OK);
    o.host_updates = true;
    assert_int_equal(tide_planner_max_working_set(f->ctx, g, &o, &ws_host), TIDE_OK);
    assert_true(ws_host <= ws_dev);
    o.host_updates = false;

    o.device_budget = tide_plan_align(peak / 2);
    tide_plan_opts ref_o = {.policy = TIDE_POLICY_TIDE, .device_budget = o.device_budget, .n_iter = 2, .hw = f->hw};
    tide_llama_train_opts rto = to;
    tide_train_plan *tp = NULL;
    tide_train_planned ref = {0};
    assert_int_equal(tide_train_plan_new(f->ctx, &f->cfg, &to, &o, &tp), TIDE_OK);
    assert_int_equal(tide_train_plan_tiled(f->ctx, &f->cfg, &rto, &ref_o, TRAIN_OPTIM_AUTO, TRAIN_OPTIM_AUTO,
                                           TIDE_TILE_AUTO, &ref), TIDE_OK);
    const tide_plan *p = tide_train_plan_get_plan(tp);
    const tide_graph *tg = tide_train_plan_graph(tp);
    assert_same_plan(p, ref.p);
    assert_int_equal(tide_plan_verify(p), TIDE_OK);
    assert_int_equal(tide_graph_n_ops(tg), tide_graph_n_ops(ref.g));
    assert_int_equal(to.tile_seqs, rto.tile_seqs);
    assert_int_equal(to.vocab_blocks, rto.vocab_blocks);
    tide_train_plan_info ti;
    tide_train_plan_info_get(tp, &ti);
    assert_int_equal(ti.tile_level, ref.level);
    assert_int_equal(ti.optimizer_groups, ref.oc.n_groups);
    assert_int_equal(ti.optimizer_host_groups, ref.oc.n_host);
    assert_int_equal(ti.optimizer_state_bytes, ref.oc.state_bytes);
    assert_int_equal(ti.plans_tried, ref.oc.plans_tried);
    assert_true(ti.optimizer_groups > 0 && ti.plan_seconds >= 0);
    /* the memory figures are the graph's tensors by class */
    uint64_t cls[TIDE_TRAIN_INPUT + 1] = {0};
    for (int t = 0; t < tide_graph_n_tensors(tg); t++)
        cls[tide_train_tensor_class(tg, t)] += tide_graph_tensor_bytes(tg, t);
    assert_int_equal(ti.weight_bytes, cls[TIDE_TRAIN_PARAM]);
    assert_int_equal(ti.master_bytes, cls[TIDE_TRAIN_MASTER]);
    assert_int_equal(ti.moment_bytes, cls[TIDE_TRAIN_MOMENT]);
    assert_int_equal(ti.gradient_bytes, cls[TIDE_TRAIN_GRAD]);
    assert_true(ti.moment_bytes > 0 && ti.kept_activation_bytes > 0 && ti.kept_activation_bytes < cls[TIDE_TRAIN_ACT]);

    /* the steady step and the bounds under the step's own placement */
    tide_timeline *tl = NULL;
    double ref_step = 0;
    assert_int_equal(tide_plan_simulate(p, f->hw, &tl), TIDE_OK);
    assert_int_equal(tide_plan_steady_step(ref.p, f->hw, &ref_step, NULL), TIDE_OK);
    assert_true(tide_timeline_step(tl) == ref_step);
    assert_true(ref_step > 0 && ref_step < tide_timeline_makespan(tl));
    tide_bounds b;
    uint64_t ws = 0;
    assert_int_equal(tide_train_plan_bounds(tp, &b), TIDE_OK);
    assert_int_equal(tide_train_plan_max_working_set(tp, &ws), TIDE_OK);
    assert_true(b.lower_bound_s > 0 && ws > 0 && ws <= o.device_budget);
    tide_timeline_free(tl);
    tide_train_planned_free(&ref);
    tide_train_plan_free(tp);
    tide_train_plan_free(NULL);

    /* the minimum over the row tilings, then a budget below it */
    int level = -1, rlevel = -1;
    uint64_t min = 0, rmin = 0;
    tide_graph *rg = NULL;
    rto = to;
    assert_int_equal(tide_train_min_budget(f->ctx, &f->cfg, &to, &o, &level, &min), TIDE_OK);
    assert_int_equal(tide_train_tiling(f->ctx, &f->cfg, &rto, &ref_o, false, TIDE_TILE_AUTO, 0, &rg, &rlevel, &rmin),
                     TIDE_OK);
    assert_int_equal(min, rmin);
    assert_int_equal(level, rlevel);
    tide_graph_free(rg);
    o.device_budget = min / 4 / 4096 * 4096;
    o.tile = TIDE_TILE_NONE;
    tp = (tide_train_plan *)1;
    assert_int_equal(tide_train_plan_new(f->ctx, &f->cfg, &to, &o, &tp), TIDE_E_INFEASIBLE);
    assert_null(tp);
    /* host updates under a baseline */
    o.device_budget = tide_plan_align(peak / 2);
    o.policy = TIDE_POLICY_LRU;
    o.optimizer = TIDE_OPTIM_CPU;
    assert_int_not_equal(tide_train_plan_new(f->ctx, &f->cfg, &to, &o, &tp), TIDE_OK);
    assert_null(tp);
    tide_graph_free(g);
}

/* Fails each allocation of opening a profile, planning, simulating and
 * planning a training step in turn: each call either succeeds or returns
 * TIDE_E_NOMEM with nothing in *out, and the bytes held come back to where
 * they were once the results are freed. */
static void test_nomem(void **state) {
    fixture *f = *state;
    f->po.device_budget = tide_plan_align(tide_planner_peak(f->ctx, f->g, &f->po) / 2);
    tide_llama_train_opts to = {.batch = 1, .seq = 32, .accum = 1, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                                .weight_decay = 0.1f, .grad_clip = 1.0f};
    tide_planner_opts to_o = f->po;
    to_o.n_iter = 2;
    to_o.device_budget = (uint64_t)1 << 30;
    to_o.tile = TIDE_TILE_NONE;
    to_o.optimizer = TIDE_OPTIM_DEVICE;
    int failed = 0;
    for (long nth = 1;; nth++) {
        int64_t live = tide_alloc_live_bytes();
        tide_hw *hw = (tide_hw *)1;
        tide_plan *p = (tide_plan *)1;
        tide_timeline *tl = (tide_timeline *)1;
        tide_train_plan *tp = (tide_train_plan *)1;
        tide_llama_train_opts o = to;
        tide_alloc_fail_nth(nth);
        tide_status s1 = tide_hw_open(f->ctx, "h100-80g", &hw);
        tide_status s2 = tide_plan_new(f->ctx, f->g, &f->po, &p);
        tide_status s3 = s2 ? s2 : tide_plan_simulate(p, f->hw, &tl);
        tide_status s4 = tide_train_plan_new(f->ctx, &f->cfg, &o, &to_o, &tp);
        tide_alloc_fail_nth(0);
        tide_status all[4] = {s1, s2, s3, s4};
        for (int k = 0; k < 4; k++)
            if (all[k] != TIDE_OK && all[k] != TIDE_E_NOMEM)
                fail_msg("allocation %ld, call %d: %s: %s", nth, k, tide_status_str(all[k]),
                         tide_ctx_last_error(f->ctx));
        if (s1) assert_null(hw);
        if (s2) assert_null(p);
        if (s3 && !s2) assert_null(tl);
        if (s4) assert_null(tp);
        failed += s1 || s2 || s3 || s4;
        bool done = !s1 && !s2 && !s3 && !s4;
        tide_hw_free(s1 ? NULL : hw);
        tide_timeline_free(s3 ? NULL : tl);
        tide_plan_free(s2 ? NULL : p);
        tide_train_plan_free(s4 ? NULL : tp);
        assert_int_equal(tide_alloc_live_bytes(), live);
        if (done) break;
    }
    assert_true(failed > 10);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_hw_profiles, setup, teardown),
        cmocka_unit_test_setup_teardown(test_names, setup, teardown),
        cmocka_unit_test_setup_teardown(test_plan, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tiling, setup, teardown),
        cmocka_unit_test_setup_teardown(test_train_plan, setup, teardown),
        cmocka_unit_test_setup_teardown(test_nomem, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
