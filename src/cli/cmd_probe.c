/*
 * cmd_probe.c - `tide probe`: measure this machine into a hardware profile.
 */
#include "cli.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char help[] =
    "Usage: tide probe [--backend auto|cpu|cuda] [--matmul auto|f32|fast] [--base PROFILE]\n"
    "                  [--ssd DIR] [--seconds S] [--out FILE]\n"
    "\n"
    "Measures this machine as the chosen backend sees it and prints a hardware\n"
    "profile for `tide plan --hw FILE` and `tide run --hw FILE`.\n"
    "\n"
    "Everything through the backend's own kernels, as the executor uses them, so\n"
    "predictions follow the kernels: matmul ops of llama-7b's shape with f32, f16\n"
    "and bf16 weights in the --matmul mode, less the per-op overhead (measured on\n"
    "a tiny op); memory bandwidth of an ADD; copies of 64 MiB to and from host\n"
    "memory (pinned on a GPU; on the CPU, memcpy), and of 4 bytes for the\n"
    "latency; the device's memory. On the CPU also a decode step's\n"
    "matrix-vector product (one row by a 64 MiB weight of each dtype: the bytes\n"
    "per second it streams, matvec_bw_*). On a GPU each is queued 16 times and\n"
    "waited for once, as runs issue work there, so the overheads are a stream's\n"
    "between two items. Both: sequential write and read of a temporary file\n"
    "through tide's SSD engine (O_DIRECT, 32 MiB calls, many requests in\n"
    "flight), unlinked at once.\n"
    "\n"
    "  --backend B    auto (CUDA when a GPU is present, else CPU; default; a GPU that\n"
    "                 is present but unusable is an error), cpu, cuda\n"
    "  --matmul M     the matmul mode measured: auto (default: fast on CUDA), f32,\n"
    "                 fast (CUDA only); see `tide run --help`\n"
    "  --base PROFILE start from this profile (a name such as h100-80g, or a path)\n"
    "                 and replace what is measured: refines a datasheet profile\n"
    "                 with this machine's figures (GPU only; the CPU probe\n"
    "                 measures every field)\n"
    "  --ssd DIRS     directories on the drives to measure, comma-separated\n"
    "                 (default $TMPDIR or /tmp)\n"
    "  --seconds S    rough time to spend (default 10)\n"
    "  --out FILE     write the profile JSON to FILE instead of standard output\n";

int cmd_probe(int argc, char **argv) {
    static const struct option opts[] = {
        {"ssd", required_argument, 0, 's'},     {"seconds", required_argument, 0, 't'},
        {"out", required_argument, 0, 'o'},     {"backend", required_argument, 0, 'b'},
        {"base", required_argument, 0, 'B'},    {"matmul", required_argument, 0, 'm'},
        {"help", no_argument, 0, 'h'},          {0, 0, 0, 0},
    };
    const char *ssd = NULL, *out = NULL, *base = NULL;
    long seconds = 10;
    tide_backend_kind kind = TIDE_BACKEND_AUTO;
    tide_matmul_mode mm = TIDE_MATMUL_AUTO;
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 's': ssd = optarg; break;
        case 't':
            if (cli_parse_int(optarg, 1, 3600, &seconds)) return cli_usage_error("probe", "bad --seconds '%s'", optarg);
            break;
        case 'o': out = optarg; break;
        case 'B': base = optarg; break;
        case 'b':
            if (cli_parse_backend(optarg, &kind))
                return cli_usage_error("probe", "unknown --backend '%s' (auto, cpu or cuda)", optarg);
            break;
        case 'm':
            if (tide_matmul_parse(NULL, optarg, &mm))
                return cli_usage_error("probe", "unknown --matmul '%s' (auto, f32 or fast)", optarg);
            break;
        case 'h': fputs(help, stdout); return 0;
        default: return cli_usage_error("probe", "unknown option");
        }
    }
    if (optind != argc) return cli_usage_error("probe", "unexpected argument '%s'", argv[optind]);
    tide_ctx *ctx = tide_ctx_new();
    if (!ctx) return 1;
    int rc = 0;
    tide_backend *be = NULL;
    tide_hw *base_hw = NULL, *hw = NULL;
    if (tide_backend_new(ctx, kind, &be)) {
        rc = cli_fail(ctx, "backend");
    } else if (tide_backend_set_matmul(be, mm)) {
        rc = cli_fail(ctx, "--matmul");
    } else if (base && tide_hw_open(ctx, base, &base_hw)) {
        rc = cli_fail(ctx, "--base");
    }
    if (rc) {
        tide_backend_free(be);
        tide_ctx_free(ctx);
        return rc;
    }
    tide_hw_probe_opts po = tide_hw_probe_opts_default();
    po.ssd_dirs = ssd;
    po.seconds = (double)seconds;
    po.base = base_hw;
    if (base && !strcmp(tide_backend_name(be), "cpu"))
        fprintf(stderr, "tide: probe: --base is for GPUs; the CPU probe measures every field of its profile\n");
    fprintf(stderr, "tide: probing the %s backend (matmul %s) for about %ld s\n", tide_backend_name(be),
            tide_matmul_name(tide_backend_matmul(be)), seconds);
    if (tide_hw_probe(ctx, be, &po, &hw)) {
        rc = cli_fail(ctx, "probe");
    } else if (out) {
        tide_hw_info i;
        tide_hw_info_get(hw, &i);
        if (tide_hw_save(ctx, hw, out)) rc = cli_fail(ctx, "writing the profile");
        else
            fprintf(stderr, "tide: wrote %s: matmul f32 %.1f, bf16 %.1f GFLOP/s; h2d %.2f, d2h %.2f GB/s; "
                    "ssd read %.2f, write %.2f GB/s\n", out, i.flops_f32 / 1e9, i.flops_bf16 / 1e9,
                    i.h2d_bw / 1e9, i.d2h_bw / 1e9, i.ssd_read_bw / 1e9, i.ssd_write_bw / 1e9);
    } else {
        /* the profile writer goes through a file (temporary name + rename) */
        char tmp[] = "/tmp/tide-probe-XXXXXX";
        int fd = mkstemp(tmp);
        if (fd < 0) {
            perror("tide: probe: temporary file");
            rc = 1;
        } else {
            close(fd);
            if (tide_hw_save(ctx, hw, tmp)) {
                rc = cli_fail(ctx, "printing the profile");
            } else {
                FILE *f = fopen(tmp, "r");
                char buf[4096];
                size_t n;
                while (f && (n = fread(buf, 1, sizeof buf, f)) > 0) fwrite(buf, 1, n, stdout);
                if (f) fclose(f);
            }
            unlink(tmp);
        }
    }
    tide_hw_free(hw);
    tide_hw_free(base_hw);
    tide_backend_free(be);
    tide_ctx_free(ctx);
    return rc;
}
