/*
 * cmd_probe.c - `tide probe`: measure this machine into a hardware profile.
 */
#include "cli.h"
#include "plan/probe.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char help[] =
    "Usage: tide probe [--ssd DIR] [--seconds S] [--out FILE]\n"
    "\n"
    "Measures this machine as the CPU backend sees it (sgemm rate, with bf16 and\n"
    "f16 weights converted as the backend does; memory copy bandwidth; O_DIRECT\n"
    "sequential write and read of a temporary file, unlinked at once) and prints\n"
    "a hardware profile for `tide plan --hw FILE` and `tide run --hw FILE`.\n"
    "\n"
    "  --ssd DIRS     directories on the drives to measure, comma-separated\n"
    "                 (default $TMPDIR or /tmp)\n"
    "  --seconds S    rough time to spend (default 10)\n"
    "  --out FILE     write the profile JSON to FILE instead of standard output\n";

int cmd_probe(int argc, char **argv) {
    static const struct option opts[] = {
        {"ssd", required_argument, 0, 's'}, {"seconds", required_argument, 0, 't'},
        {"out", required_argument, 0, 'o'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0},
    };
    const char *ssd = NULL, *out = NULL;
    long seconds = 10;
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 's': ssd = optarg; break;
        case 't':
            if (cli_parse_int(optarg, 1, 3600, &seconds)) return cli_usage_error("probe", "bad --seconds '%s'", optarg);
            break;
        case 'o': out = optarg; break;
        case 'h': fputs(help, stdout); return 0;
        default: return cli_usage_error("probe", "unknown option");
        }
    }
    if (optind != argc) return cli_usage_error("probe", "unexpected argument '%s'", argv[optind]);
    tide_ctx *ctx = tide_ctx_new();
    if (!ctx) return 1;
    int rc = 0;
    tide_hw hw;
    if (tide_probe(ctx, ssd, (double)seconds, &hw)) {
        rc = cli_fail(ctx, "probe");
    } else if (out) {
        if (tide_hw_save(ctx, &hw, out)) rc = cli_fail(ctx, "writing the profile");
        else
            fprintf(stderr, "tide: wrote %s: sgemm %.1f GFLOP/s, memcpy %.2f GB/s, ssd read %.2f GB/s, write %.2f GB/s\n",
                    out, hw.flops[TIDE_F32] / 1e9, hw.h2d_bw / 1e9, hw.ssd_read_bw / 1e9, hw.ssd_write_bw / 1e9);
    } else {
        /* the profile writer goes through a file (temporary name + rename) */
        char tmp[] = "/tmp/tide-probe-XXXXXX";
        int fd = mkstemp(tmp);
        if (fd < 0) {
            perror("tide: probe: temporary file");
            rc = 1;
        } else {
            close(fd);
            if (tide_hw_save(ctx, &hw, tmp)) {
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
    tide_ctx_free(ctx);
    return rc;
}
