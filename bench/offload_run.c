/*
 * offload_run.c - the executor benchmark, every ratio measured in one process.
 *
 *   bench_offload_run [--seq N] [--budget PCT] [--policy P] [--ssd DIR] MODEL_DIR
 *
 * MODEL_DIR holds a checkpoint (generated as tinyllama-1.1b bf16 if empty).
 * 1. prefill of --seq tokens (default 512) unconstrained, then offloaded at
 *    --budget (default 25%) of the unconstrained peak with weights homed on
 *    host: wall-time ratio (target <= 1.10);
 * 2. the same with weights homed on SSD (read from the checkpoint file with
 *    O_DIRECT): the io stream's read bandwidth against a raw sequential
 *    O_DIRECT read of the same directory (target >= 0.9);
 * 3. predicted makespan (profile measured by tide_probe at the start) against
 *    the measured executor time of each offloaded prefill (target within 15%).
 * Offloaded outputs are checked bit for bit against the unconstrained run.
 */
#include "probe/probe.h"
#include "store/ssd.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static tide_ctx *ctx;

static void die(const char *what) {
    fprintf(stderr, "bench: %s: %s\n", what, tide_ctx_last_error(ctx));
    exit(1);
}

/* Raw baseline: a plain sequential O_DIRECT read of the same checkpoint file,
 * one 4 MiB request at a time (what a simple loader does). */
static double raw_read_bw(const tide_checkpoint *ck) {
    tide_tensor_info ti;
    if (tide_checkpoint_get_index(ck, 0, &ti)) die("checkpoint");
    int fd = -1;
    if (tide_ssd_open_direct(ti.file, &fd)) {
        fprintf(stderr, "bench: %s refuses O_DIRECT\n", ti.file);
        exit(1);
    }
    size_t chunk = 4u << 20;
    void *buf = NULL;
    if (posix_memalign(&buf, 4096, chunk)) exit(1);
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
    return dt > 0 ? total / dt : 0;
}

int main(int argc, char **argv) {
    const char *dir = NULL, *policy = "tide", *ssd = NULL;
    int seq = 512;
    double pct = 25;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--seq") && i + 1 < argc) seq = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--budget") && i + 1 < argc) pct = atof(argv[++i]);
        else if (!strcmp(argv[i], "--policy") && i + 1 < argc) policy = argv[++i];
        else if (!strcmp(argv[i], "--ssd") && i + 1 < argc) ssd = argv[++i];
        else if (argv[i][0] != '-') dir = argv[i];
        else dir = NULL, i = argc;
    }
    if (!dir || seq < 1 || !(pct > 0 && pct <= 100)) {
        fprintf(stderr, "usage: %s [--seq N] [--budget PCT] [--policy P] [--ssd DIR] MODEL_DIR\n", argv[0]);
        return 2;
    }
    ctx = tide_ctx_new();
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    struct stat sb;
    if (stat(path, &sb) != 0) {
        tide_llama_config cfg;
        if (tide_llama_config_named(ctx, "tinyllama-1.1b", &cfg) || tide_checkpoint_make_synthetic(ctx, &cfg, 0, 0, dir))
            die("generating the model");
    }
    /* the machine's profile, measured now, for the predictions */
    tide_hw hw;
    if (tide_probe(ctx, dir, 8.0, &hw)) die("probe");
    char hw_path[] = "/tmp/tide-bench-hw-XXXXXX";
    int fd = mkstemp(hw_path);
    close(fd);
    if (tide_hw_save(ctx, &hw, hw_path)) die("saving the profile");

    tide_checkpoint *ck = NULL;
    tide_backend *be = NULL;
    tide_model *m = NULL;
    tide_model_opts mo = {.max_batch = 1, .ctx_len = seq};
    if (tide_checkpoint_open(ctx, dir, &ck) || tide_backend_new(ctx, TIDE_BACKEND_CPU, &be) ||
        tide_model_new(ctx, ck, be, &mo, &m))
        die("loading");
    const tide_llama_config *cfg = tide_checkpoint_config(ck);
    int32_t *prompt = malloc((size_t)seq * sizeof *prompt), next[3];
    for (int i = 0; i < seq; i++) prompt[i] = (int32_t)((1u + (uint32_t)i * 2654435761u) % (uint32_t)cfg->vocab_size);

    /* 1. unconstrained and offloaded, interleaved, best of two each (the
     * weights are read into memory first, so no run is timed on faults) */
    if (tide_checkpoint_prefetch(ck)) die("loading");
    tide_offload_opts o = {.budget_kind = TIDE_BUDGET_FRACTION, .fraction = pct / 100.0, .policy = policy,
                           .ssd_dirs = ssd ? ssd : dir, .hw = hw_path};
    tide_offload_opts none = {.budget_kind = TIDE_BUDGET_NONE};
    tide_gen_stats ref = {.prefill_s = 1e30}, s = {.prefill_s = 1e30}, t;
    int32_t ref_tok = -1;
    bool same_host = true;
    for (int rep = 0; rep < 2; rep++) {
        if (tide_model_set_offload(m, &none) || tide_model_generate(m, prompt, seq, 1, next, &t))
            die("unconstrained run");
        if (t.prefill_s < ref.prefill_s) ref = t;
        ref_tok = next[0];
        if (tide_model_set_offload(m, &o) || tide_model_generate(m, prompt, seq, 1, next, &t))
            die("offloaded run (weights on host)");
        if (t.prefill_s < s.prefill_s) s = t;
        same_host = same_host && next[0] == ref_tok && t.logits_hash == ref.logits_hash;
    }
    double host_ratio = s.prefill_s / ref.prefill_s;
    double host_pred = s.predicted_prefill_s, host_meas = s.exec_s;
    uint64_t budget = s.budget_bytes;

    /* 2. weights homed on SSD, read from the checkpoint file */
    o.weights_on_ssd = true;
    if (tide_model_set_offload(m, &o)) die("offload (ssd)");
    tide_gen_stats d;
    if (tide_model_generate(m, prompt, seq, 1, next, &d)) die("offloaded run (weights on ssd)");
    bool same_ssd = next[0] == ref_tok && d.logits_hash == ref.logits_hash;
    double run_bw = d.ssd_read_s > 0 ? d.bytes_ssd_read / d.ssd_read_s : 0;
    double raw_bw = raw_read_bw(ck);

    printf("bench offload_run: %s, %s weights, prefill %d tokens, policy %s, budget %.0f%% = %.2f GiB, %d threads\n",
           cfg->name, tide_dtype_name(cfg->dtype), seq, policy, pct, budget / 1073741824.0, tide_ctx_threads(ctx));
    printf("  unconstrained prefill           %8.3f s\n", ref.prefill_s);
    printf("  offloaded, weights on host      %8.3f s  = %.3fx unconstrained (target <= 1.10), %s\n", s.prefill_s,
           host_ratio, same_host ? "bit-identical" : "OUTPUTS DIFFER");
    printf("     h2d %.2f GiB, d2h %.2f GiB; predicted %.3f s vs measured %.3f s (%+.1f%%)\n",
           s.bytes_h2d / 1073741824.0, s.bytes_d2h / 1073741824.0, host_pred, host_meas,
           100 * (host_meas - host_pred) / host_pred);
    printf("  offloaded, weights on ssd       %8.3f s  = %.3fx unconstrained, %s\n", d.prefill_s,
           d.prefill_s / ref.prefill_s, same_ssd ? "bit-identical" : "OUTPUTS DIFFER");
    printf("     ssd read %.2f GiB in %.3f s of io time = %.2f GB/s; raw O_DIRECT sequential read of the same file %.2f GB/s; "
           "ratio %.3f (target >= 0.9)\n",
           d.bytes_ssd_read / 1073741824.0, d.ssd_read_s, run_bw / 1e9, raw_bw / 1e9, raw_bw > 0 ? run_bw / raw_bw : 0);
    printf("     predicted %.3f s vs measured %.3f s (%+.1f%%)\n", d.predicted_prefill_s, d.exec_s,
           100 * (d.exec_s - d.predicted_prefill_s) / d.predicted_prefill_s);
    printf("  probe: sgemm %.1f GFLOP/s (bf16 path %.1f), memcpy %.2f GB/s, ssd read %.2f GB/s\n",
           hw.flops[TIDE_F32] / 1e9, hw.flops[TIDE_BF16] / 1e9, hw.h2d_bw / 1e9, hw.ssd_read_bw / 1e9);
    printf("{\"bench\":\"offload_run\",\"seq\":%d,\"budget_pct\":%.1f,\"unconstrained_s\":%.4f,\"host_s\":%.4f,"
           "\"host_ratio\":%.4f,\"host_pred_s\":%.4f,\"host_meas_s\":%.4f,\"ssd_s\":%.4f,\"ssd_run_bw\":%.0f,"
           "\"ssd_raw_bw\":%.0f,\"ssd_pred_s\":%.4f,\"ssd_meas_s\":%.4f,\"bit_identical\":%s}\n",
           seq, pct, ref.prefill_s, s.prefill_s, host_ratio, host_pred, host_meas, d.prefill_s, run_bw, raw_bw,
           d.predicted_prefill_s, d.exec_s, same_host && same_ssd ? "true" : "false");
    unlink(hw_path);
    free(prompt);
    tide_model_free(m);
    tide_backend_free(be);
    tide_checkpoint_free(ck);
    tide_ctx_free(ctx);
    return same_host && same_ssd ? 0 : 1;
}
