/*
 * tokenize.c - tide's tokenizer throughput: one text encoded whole, on one
 * thread, several times; the best and median MB/s and a hash of the ids, so
 * that bench/tokenizer_peer.py can check them against another tokenizer's.
 *
 *   bench_tokenize [--reps N] [--special] [--json] TOKENIZER TEXT_FILE
 *
 * TOKENIZER is a model directory or a tokenizer.json. --special adds what
 * the tokenizer adds around a text (add_special_tokens=True); the default
 * adds nothing. Prints the ids' count and their FNV-1a 64 hash (over the ids
 * as little-endian int32), the load time and the encode rate; with --json,
 * one JSON line. Exit 0, 1 on an error, 2 on a usage error.
 */
#include "tide.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static uint64_t fnv1a(const int32_t *ids, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        uint32_t v = (uint32_t)ids[i];
        for (int b = 0; b < 4; b++) {
            h ^= (v >> (8 * b)) & 0xffu;
            h *= 1099511628211ull;
        }
    }
    return h;
}

static char *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    size_t cap = 0, n = 0;
    for (;;) {
        if (n == cap) {
            size_t nc = cap ? 2 * cap : (size_t)1 << 20;
            char *nb = realloc(buf, nc);
            if (!nb) {
                free(buf);
                fclose(f);
                return NULL;
            }
            buf = nb;
            cap = nc;
        }
        size_t r = fread(buf + n, 1, cap - n, f);
        n += r;
        if (r == 0) break;
    }
    int err = ferror(f);
    fclose(f);
    if (err) {
        free(buf);
        return NULL;
    }
    *len = n;
    return buf;
}

static int usage(void) {
    fprintf(stderr, "usage: bench_tokenize [--reps N] [--special] [--json] TOKENIZER TEXT_FILE\n");
    return 2;
}

int main(int argc, char **argv) {
    int reps = 5, json = 0;
    unsigned flags = 0;
    const char *tok_path = NULL, *text_path = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
            reps = atoi(argv[++i]);
            if (reps < 1 || reps > 1000) return usage();
        } else if (!strcmp(argv[i], "--special")) {
            flags |= TIDE_TOKENIZE_ADD_SPECIAL;
        } else if (!strcmp(argv[i], "--json")) {
            json = 1;
        } else if (argv[i][0] == '-') {
            return usage();
        } else if (!tok_path) {
            tok_path = argv[i];
        } else if (!text_path) {
            text_path = argv[i];
        } else {
            return usage();
        }
    }
    if (!tok_path || !text_path) return usage();

    size_t len = 0;
    char *text = read_all(text_path, &len);
    if (!text) {
        fprintf(stderr, "bench_tokenize: cannot read %s\n", text_path);
        return 1;
    }
    tide_ctx *ctx = tide_ctx_new();
    if (!ctx) {
        free(text);
        fprintf(stderr, "bench_tokenize: out of memory\n");
        return 1;
    }
    tide_tokenizer *t = NULL;
    double t0 = now_s();
    if (tide_tokenizer_open(ctx, tok_path, &t)) {
        fprintf(stderr, "bench_tokenize: %s\n", tide_ctx_last_error(ctx));
        free(text);
        tide_ctx_free(ctx);
        return 1;
    }
    double load_s = now_s() - t0;

    size_t cap = len + 16, n = 0;
    int32_t *ids = malloc(cap * sizeof *ids);
    double *secs = malloc((size_t)reps * sizeof *secs);
    int rc = 0;
    uint64_t hash = 0;
    for (int r = 0; ids && secs && r < reps; r++) {
        double s0 = now_s();
        tide_status st = tide_tokenizer_encode(t, text, len, flags, ids, cap, &n);
        secs[r] = now_s() - s0;
        if (!st && n > cap) st = TIDE_E_INVALID; /* more ids than bytes + 16 cannot happen */
        if (st) {
            fprintf(stderr, "bench_tokenize: encoding: %s\n", tide_ctx_last_error(ctx));
            rc = 1;
            break;
        }
        uint64_t h = fnv1a(ids, n);
        if (r && h != hash) {
            fprintf(stderr, "bench_tokenize: rep %d gave other ids than rep 0\n", r);
            rc = 1;
            break;
        }
        hash = h;
    }
    if (!ids || !secs) {
        fprintf(stderr, "bench_tokenize: out of memory\n");
        rc = 1;
    }
    if (!rc) {
        qsort(secs, (size_t)reps, sizeof *secs, cmp_double);
        double best = secs[0], med = reps % 2 ? secs[reps / 2] : 0.5 * (secs[reps / 2 - 1] + secs[reps / 2]);
        double mb = (double)len / 1e6;
        if (json)
            printf("{\"bench\":\"tokenize\",\"engine\":\"tide\",\"bytes\":%zu,\"ids\":%zu,\"hash\":\"%016llx\","
                   "\"load_s\":%.6f,\"best_s\":%.6f,\"median_s\":%.6f,\"best_mb_per_s\":%.3f,"
                   "\"median_mb_per_s\":%.3f,\"reps\":%d}\n",
                   len, n, (unsigned long long)hash, load_s, best, med, mb / best, mb / med, reps);
        else
            printf("tide: %zu bytes -> %zu ids (fnv1a %016llx); load %.3f s; encode best %.3f s (%.2f MB/s), "
                   "median %.3f s (%.2f MB/s) over %d reps\n",
                   len, n, (unsigned long long)hash, load_s, best, mb / best, med, mb / med, reps);
    }
    free(secs);
    free(ids);
    free(text);
    tide_tokenizer_free(t);
    tide_ctx_free(ctx);
    return rc;
}
