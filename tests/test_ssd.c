/*
 * test_ssd.c - the SSD tier store (src/store/ssd.h), on both engines.
 *
 * Every case runs in fresh directories under $TMPDIR (or /tmp), which must be
 * empty again when the case ends (spill files have no name, even while open)
 * and must leave the library's live allocation count where it found it. The
 * io_uring cases skip, saying why, only when the kernel refuses io_uring; the
 * same cases always run on the forced pread fallback.
 *
 * Covered: random round trips over several stripes and two directories; data
 * written earlier read back after other writes; the striping layout itself
 * (through the internal engine header: each spill file read with plain pread);
 * misaligned and out-of-range arguments; injected EIO on the Nth read or write,
 * injected short transfers and EAGAIN (data must still be right); ENOSPC, both
 * from the free-space check and from fallocate; missing and non-directory
 * paths; failed allocations during open; reads of a caller's file (end of file
 * reads zeros); registered buffers; use from a thread other than the opener's;
 * the raw bandwidth helpers.
 *
 * What it proves: the SSD store round-trips data through io_uring and through
 * the pread fallback; injected read/write errors, ENOSPC, bad directories;
 * nothing left behind.
 */
#include "core/alloc_test.h"
#include "store/ssd.h"
#include "store/ssd_engine.h"
#include "store/ssd_test.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cmocka.h>

#define KIB ((size_t)1024)
#define MIB ((size_t)1024 * 1024)
#define STRIPE (64 * KIB)

/* Per-case state: two spill directories inside one temporary root. */
struct env {
    bool fallback;          /* force the pread engine */
    char root[256];
    char dir[2][300];
    const char *dirs[2];
    tide_ctx *ctx;
    int64_t live0;
};

static struct env env_uring = {.fallback = false};
static struct env env_pread = {.fallback = true};

static int count_entries(const char *path) {
    DIR *d = opendir(path);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

static void assert_dirs_empty(const struct env *e) {
    for (int i = 0; i < 2; i++) assert_int_equal(count_entries(e->dir[i]), 0);
}

static int setup(void **state) {
    struct env *e = *state;
    const char *tmp = getenv("TMPDIR");
    if (!tmp || !tmp[0]) tmp = "/tmp";
    snprintf(e->root, sizeof e->root, "%s/tide-ssd-test-XXXXXX", tmp);
    if (!mkdtemp(e->root)) return -1;
    for (int i = 0; i < 2; i++) {
        snprintf(e->dir[i], sizeof e->dir[i], "%s/d%d", e->root, i);
        if (mkdir(e->dir[i], 0700) != 0) return -1;
        e->dirs[i] = e->dir[i];
    }
    e->ctx = tide_ctx_new();
    if (!e->ctx) return -1;
    e->live0 = tide_alloc_live_bytes();
    return 0;
}

static int teardown(void **state) {
    struct env *e = *state;
    int bad = 0;
    for (int i = 0; i < 2; i++) {
        if (count_entries(e->dir[i]) != 0) {
            fprintf(stderr, "left behind in %s\n", e->dir[i]);
            bad = 1;
        }
        rmdir(e->dir[i]);
    }
    if (tide_alloc_live_bytes() != e->live0) {
        fprintf(stderr, "leak: %lld bytes\n", (long long)(tide_alloc_live_bytes() - e->live0));
        bad = 1;
    }
    tide_ctx_free(e->ctx);
    rmdir(e->root);
    return bad ? -1 : 0;
}

static void *xalloc(size_t n) {
    void *p = aligned_alloc(4096, n ? n : 4096);
    assert_non_null(p);
    return p;
}

static void fill(unsigned char *p, size_t n, uint64_t seed) {
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        p[i] = (unsigned char)x;
    }
}

static tide_ssd_opts base_opts(const struct env *e) {
    return (tide_ssd_opts){.force_fallback = e->fallback, .queue_depth = 8, .stripe_bytes = STRIPE};
}

/* Opens a store on both directories; skips the case when io_uring was wanted
 * and the kernel refused it. */
static tide_ssd *open2(struct env *e, uint64_t cap, const tide_ssd_opts *o) {
    tide_ssd *s = NULL;
    tide_status st = tide_ssd_open(e->ctx, e->dirs, 2, cap, o, &s);
    if (st != TIDE_OK) fail_msg("open: %s", tide_ctx_last_error(e->ctx));
    if (e->fallback) {
        assert_string_equal(tide_ssd_backend_name(s), "pread");
        assert_string_equal(tide_ssd_fallback_reason(s), "forced");
    } else if (strcmp(tide_ssd_backend_name(s), "io_uring") != 0) {
        printf("io_uring refused here (%s): skipping the io_uring case\n",
               tide_ssd_fallback_reason(s));
        tide_ssd_close(s);
        skip();
    } else {
        assert_string_equal(tide_ssd_fallback_reason(s), "");
    }
    return s;
}

static bool contains(const char *hay, const char *needle) { return strstr(hay, needle) != NULL; }

/* ------------------------------------------------------------ round trips */

static void test_roundtrip(void **state) {
    struct env *e = *state;
    tide_ssd_opts o = base_opts(e);
    const uint64_t cap = 24 * MIB + 12 * KIB; /* last stripe unit partial */
    tide_ssd *s = open2(e, cap, &o);
    assert_true(tide_ssd_direct(s));
    assert_int_equal(tide_ssd_capacity(s), cap);
    assert_int_equal(count_entries(e->dir[0]), 0); /* nameless while open */

    /* A: 5 MiB + 12 KiB starting inside a stripe unit (many units, both files). */
    const size_t na = 5 * MIB + 12 * KIB;
    const uint64_t offa = 7 * 4096;
    unsigned char *a = xalloc(na), *back = xalloc(8 * MIB);
    fill(a, na, 1);
    assert_int_equal(tide_ssd_write(s, offa, a, na), TIDE_OK);

    /* B and C written after A, around it; C ends exactly at the capacity. */
    const size_t nb = 3 * MIB, nc = 2 * MIB + 12 * KIB;
    const uint64_t offb = 8 * MIB, offc = cap - nc;
    unsigned char *b = xalloc(nb), *c = xalloc(nc);
    fill(b, nb, 2);
    fill(c, nc, 3);
    assert_int_equal(tide_ssd_write(s, offb, b, nb), TIDE_OK);
    assert_int_equal(tide_ssd_write(s, offc, c, nc), TIDE_OK);

    memset(back, 0xAA, na);
    assert_int_equal(tide_ssd_read(s, offa, back, na), TIDE_OK);
    assert_memory_equal(back, a, na);
    assert_int_equal(tide_ssd_read(s, offc, back, nc), TIDE_OK);
    assert_memory_equal(back, c, nc);

    /* Overwrite the middle of A; its ends must be untouched. */
    unsigned char *m = xalloc(MIB);
    fill(m, MIB, 4);
    assert_int_equal(tide_ssd_write(s, offa + 2 * MIB, m, MIB), TIDE_OK);
    memcpy(a + 2 * MIB, m, MIB);
    assert_int_equal(tide_ssd_read(s, offa, back, na), TIDE_OK);
    assert_memory_equal(back, a, na);
    assert_int_equal(tide_ssd_read(s, offb, back, nb), TIDE_OK);
    assert_memory_equal(back, b, nb);

    /* One small request, and n == 0. */
    assert_int_equal(tide_ssd_read(s, offa + 4096, back, 4096), TIDE_OK);
    assert_memory_equal(back, a + 4096, 4096);
    assert_int_equal(tide_ssd_read(s, 0, back, 0), TIDE_OK);

    tide_ssd_stats st;
    tide_ssd_get_stats(s, &st);
    assert_true(st.bytes_written == na + nb + nc + MIB);
    assert_true(st.requests > 100); /* 64 KiB stripes: many requests */

    tide_ssd_close(s);
    assert_dirs_empty(e);
    free(a), free(b), free(c), free(m), free(back);
}

/* The layout of ssd.h: unit k in file k % 2 at (k / 2) * stripe. */
static void test_layout(void **state) {
    struct env *e = *state;
    tide_ssd_opts o = base_opts(e);
    tide_ssd *s = open2(e, 16 * STRIPE, &o);
    unsigned char *d = xalloc(16 * STRIPE), *back = xalloc(STRIPE);
    fill(d, 16 * STRIPE, 5);
    assert_int_equal(tide_ssd_write(s, 0, d, 16 * STRIPE), TIDE_OK);
    assert_int_equal(s->n_files, 2);
    for (int k = 0; k < 16; k++) {
        ssize_t r = pread(s->files[k % 2].fd, back, STRIPE, (off_t)(k / 2) * (off_t)STRIPE);
        assert_int_equal(r, (ssize_t)STRIPE);
        assert_memory_equal(back, d + (size_t)k * STRIPE, STRIPE);
    }
    assert_int_equal(s->files[0].size, 8 * STRIPE);
    assert_int_equal(s->files[1].size, 8 * STRIPE);
    tide_ssd_close(s);
    free(d), free(back);
}

static void test_bad_args(void **state) {
    struct env *e = *state;
    tide_ssd_opts o = base_opts(e);
    const uint64_t cap = MIB;
    tide_ssd *s = open2(e, cap, &o);
    unsigned char *buf = xalloc(2 * MIB);
    memset(buf, 1, 2 * MIB);

    assert_int_equal(tide_ssd_write(s, 100, buf, 4096), TIDE_E_INVALID);
    assert_true(contains(tide_ctx_last_error(e->ctx), "offset 100"));
    assert_int_equal(tide_ssd_read(s, 0, buf, 1000), TIDE_E_INVALID);
    assert_true(contains(tide_ctx_last_error(e->ctx), "length 1000"));
    assert_int_equal(tide_ssd_read(s, 0, buf + 512, 4096), TIDE_E_INVALID);
    assert_true(contains(tide_ctx_last_error(e->ctx), "buffer"));
    assert_int_equal(tide_ssd_write(s, cap, buf, 4096), TIDE_E_INVALID);
    assert_true(contains(tide_ctx_last_error(e->ctx), "capacity"));
    assert_int_equal(tide_ssd_read(s, cap - 4096, buf, 8192), TIDE_E_INVALID);
    assert_int_equal(tide_ssd_read(s, 0, buf, 2 * MIB), TIDE_E_INVALID);
    assert_int_equal(tide_ssd_read(s, UINT64_MAX - 4095, buf, 4096), TIDE_E_INVALID);
    assert_int_equal(tide_ssd_read_file(s, -1, 0, buf, 4096), TIDE_E_INVALID);
    assert_int_equal(tide_ssd_read_file(s, 0, 4097, buf, 4096), TIDE_E_INVALID);
    /* Nothing was issued, and the store still works. */
    tide_ssd_stats st;
    tide_ssd_get_stats(s, &st);
    assert_int_equal(st.requests, 0);
    assert_int_equal(tide_ssd_write(s, cap - 4096, buf, 4096), TIDE_OK);
    tide_ssd_close(s);

    /* Bad options. */
    tide_ssd *t = NULL;
    tide_ssd_opts bad = o;
    bad.stripe_bytes = 5000;
    assert_int_equal(tide_ssd_open(e->ctx, e->dirs, 2, MIB, &bad, &t), TIDE_E_INVALID);
    assert_true(contains(tide_ctx_last_error(e->ctx), "5000"));
    bad = o;
    bad.queue_depth = -1;
    assert_int_equal(tide_ssd_open(e->ctx, e->dirs, 2, MIB, &bad, &t), TIDE_E_INVALID);
    assert_int_equal(tide_ssd_open(e->ctx, e->dirs, 0, MIB, &o, &t), TIDE_E_INVALID);
    assert_null(t);
    assert_dirs_empty(e);
    free(buf);
}

/* ------------------------------------------------------------ faults */

static void test_fail_nth_read(void **state) {
    struct env *e = *state;
    tide_ssd_opts o = base_opts(e);
    tide_ssd_test_set_faults(&(tide_ssd_faults){.fail_read_nth = 5});
    tide_ssd *s = open2(e, 4 * MIB, &o);
    tide_ssd_test_set_faults(NULL);
    unsigned char *d = xalloc(2 * MIB), *back = xalloc(2 * MIB);
    fill(d, 2 * MIB, 6);
    assert_int_equal(tide_ssd_write(s, 0, d, 2 * MIB), TIDE_OK);
    tide_err_clear(e->ctx);
    assert_int_equal(tide_ssd_read(s, 0, back, 2 * MIB), TIDE_E_IO); /* 32 requests */
    const char *msg = tide_ctx_last_error(e->ctx);
    assert_true(contains(msg, "read of spill file in"));
    assert_true(contains(msg, e->root));
    assert_true(contains(msg, strerror(EIO)));
    /* The store is still usable; later reads are right. */
    assert_int_equal(tide_ssd_read(s, 0, back, 2 * MIB), TIDE_OK);
    assert_memory_equal(back, d, 2 * MIB);
    tide_ssd_close(s);
    assert_dirs_empty(e);
    free(d), free(back);
}

static void test_fail_nth_write(void **state) {
    struct env *e = *state;
    tide_ssd_opts o = base_opts(e);
    tide_ssd_test_set_faults(&(tide_ssd_faults){.fail_write_nth = 3});
    tide_ssd *s = open2(e, 4 * MIB, &o);
    tide_ssd_test_set_faults(NULL);
    unsigned char *d = xalloc(MIB);
    fill(d, MIB, 7);
    assert_int_equal(tide_ssd_write(s, 0, d, STRIPE), TIDE_OK);     /* write 1 */
    assert_int_equal(tide_ssd_write(s, STRIPE, d, STRIPE), TIDE_OK); /* write 2 */
    assert_int_equal(tide_ssd_write(s, 0, d, MIB), TIDE_E_IO);       /* writes 3.. */
    const char *msg = tide_ctx_last_error(e->ctx);
    assert_true(contains(msg, "write of spill file in"));
    assert_true(contains(msg, strerror(EIO)));
    assert_int_equal(tide_ssd_write(s, 0, d, MIB), TIDE_OK);
    tide_ssd_close(s);
    assert_dirs_empty(e);
    free(d);
}

/* Short transfers and EAGAIN are retried for the remainder: data still right. */
static void test_short_and_eagain(void **state) {
    struct env *e = *state;
    for (int round = 0; round < 2; round++) {
        tide_ssd_opts o = base_opts(e);
        /* write: requests 1..16, read: 17..32; hit one of each */
        tide_ssd_faults f = {0};
        if (round == 0) f.short_nth = 3, f.eagain_nth = 20;
        else f.short_nth = 18, f.eagain_nth = 5;
        tide_ssd_test_set_faults(&f);
        tide_ssd *s = open2(e, 2 * MIB, &o);
        tide_ssd_test_set_faults(NULL);
        unsigned char *d = xalloc(MIB), *back = xalloc(MIB);
        fill(d, MIB, 8 + (uint64_t)round);
        assert_int_equal(tide_ssd_write(s, 0, d, MIB), TIDE_OK);
        memset(back, 0, MIB);
        assert_int_equal(tide_ssd_read(s, 0, back, MIB), TIDE_OK);
        assert_memory_equal(back, d, MIB);
        tide_ssd_stats st;
        tide_ssd_get_stats(s, &st);
        assert_int_equal(st.requests, 32);
        assert_int_equal(st.resubmits, 2);
        tide_ssd_close(s);
        free(d), free(back);
    }
    assert_dirs_empty(e);
}

static void test_enospc(void **state) {
    struct env *e = *state;
    tide_ssd_opts o = base_opts(e);
    tide_ssd *s = NULL;

    /* fallocate of the second directory fails. */
    tide_ssd_test_set_faults(&(tide_ssd_faults){.fallocate_enospc_dir = 2});
    tide_status st = tide_ssd_open(e->ctx, e->dirs, 2, 8 * MIB, &o, &s);
    tide_ssd_test_set_faults(NULL);
    assert_int_equal(st, TIDE_E_IO);
    assert_null(s);
    const char *msg = tide_ctx_last_error(e->ctx);
    assert_true(contains(msg, "no space for"));
    assert_true(contains(msg, e->dir[1]));
    assert_true(contains(msg, strerror(ENOSPC)));
    assert_dirs_empty(e);

    /* More than the filesystem holds, in one directory, and in two that each
     * fit alone: refused before any space is reserved (so the test never
     * fills the disk it runs on). */
    struct statvfs v;
    assert_int_equal(statvfs(e->dir[0], &v), 0);
    uint64_t avail = (uint64_t)v.f_bavail * v.f_frsize;
    o = base_opts(e);
    assert_int_equal(tide_ssd_open(e->ctx, e->dirs, 1, avail + 64 * MIB, &o, &s), TIDE_E_IO);
    msg = tide_ctx_last_error(e->ctx);
    assert_true(contains(msg, "no space for"));
    assert_true(contains(msg, e->dir[0]));
    assert_null(s);
    assert_int_equal(tide_ssd_open(e->ctx, e->dirs, 2, avail + avail / 2, &o, &s), TIDE_E_IO);
    msg = tide_ctx_last_error(e->ctx);
    assert_true(contains(msg, "no space for"));
    assert_true(contains(msg, e->dir[1]));
    assert_null(s);
    assert_dirs_empty(e);
}

static void test_bad_dirs(void **state) {
    struct env *e = *state;
    tide_ssd_opts o = base_opts(e);
    tide_ssd *s = NULL;
    char missing[400], file[400], under[500];
    snprintf(missing, sizeof missing, "%s/no-such-dir", e->root);
    snprintf(file, sizeof file, "%s/a-file", e->root);
    snprintf(under, sizeof under, "%s/sub", file);
    FILE *f = fopen(file, "w");
    assert_non_null(f);
    fclose(f);

    const char *d1[2] = {e->dir[0], missing};
    assert_int_equal(tide_ssd_open(e->ctx, d1, 2, MIB, &o, &s), TIDE_E_IO);
    assert_true(contains(tide_ctx_last_error(e->ctx), missing));
    assert_true(contains(tide_ctx_last_error(e->ctx), strerror(ENOENT)));
    const char *d2[1] = {under};
    assert_int_equal(tide_ssd_open(e->ctx, d2, 1, MIB, &o, &s), TIDE_E_IO);
    assert_true(contains(tide_ctx_last_error(e->ctx), under));
    assert_true(contains(tide_ctx_last_error(e->ctx), strerror(ENOTDIR)));
    assert_null(s);
    unlink(file);
    assert_dirs_empty(e);
}

/* Every allocation of open fails in turn: NOMEM, nothing leaked or left. */
static void test_alloc_faults(void **state) {
    struct env *e = *state;
    tide_ssd_opts o = base_opts(e);
    int nomem = 0;
    for (long k = 1; k < 100; k++) {
        tide_ssd *s = NULL;
        tide_alloc_fail_nth(k);
        tide_status st = tide_ssd_open(e->ctx, e->dirs, 2, MIB, &o, &s);
        tide_alloc_fail_nth(0);
        if (st == TIDE_OK) {
            assert_non_null(s);
            /* never a quiet fallback taken for lack of memory */
            assert_false(contains(tide_ssd_fallback_reason(s), "out of memory"));
            tide_ssd_close(s);
            break;
        }
        assert_int_equal(st, TIDE_E_NOMEM);
        assert_null(s);
        nomem++;
        assert_int_equal(tide_alloc_live_bytes(), e->live0);
        assert_dirs_empty(e);
    }
    assert_true(nomem >= 5);
}

/* ------------------------------------------------------------ files */

static void test_read_file(void **state) {
    struct env *e = *state;
    tide_ssd_opts o = base_opts(e);
    tide_ssd *s = NULL;
    /* A store with no spill serves file reads. */
    assert_int_equal(tide_ssd_open(e->ctx, NULL, 0, 0, &o, &s), TIDE_OK);
    if (!e->fallback && strcmp(tide_ssd_backend_name(s), "io_uring") != 0) {
        tide_ssd_close(s);
        skip();
    }
    unsigned char tiny[4096] __attribute__((aligned(4096)));
    assert_int_equal(tide_ssd_write(s, 0, tiny, 4096), TIDE_E_INVALID);

    const size_t n = 3 * STRIPE + 1000; /* a tail that is not a whole block */
    unsigned char *d = xalloc(4 * STRIPE), *back = xalloc(4 * STRIPE);
    fill(d, n, 9);
    char path[400];
    snprintf(path, sizeof path, "%s/ckpt.bin", e->root);
    int wfd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(wfd >= 0);
    assert_int_equal(write(wfd, d, n), (ssize_t)n);
    close(wfd);

    int fd = -1;
    assert_int_equal(tide_ssd_open_direct(path, &fd), TIDE_OK);
    memset(back, 0xAA, 4 * STRIPE);
    assert_int_equal(tide_ssd_read_file(s, fd, 0, back, 4 * STRIPE), TIDE_OK);
    assert_memory_equal(back, d, n);
    for (size_t i = n; i < 4 * STRIPE; i++) assert_int_equal(back[i], 0);
    /* From the middle, and wholly past the end. */
    assert_int_equal(tide_ssd_read_file(s, fd, STRIPE + 8192, back, 8192), TIDE_OK);
    assert_memory_equal(back, d + STRIPE + 8192, 8192);
    memset(back, 0xAA, 8192);
    assert_int_equal(tide_ssd_read_file(s, fd, 8 * STRIPE, back, 8192), TIDE_OK);
    for (size_t i = 0; i < 8192; i++) assert_int_equal(back[i], 0);
    close(fd);

    char missing[420];
    snprintf(missing, sizeof missing, "%s/none.bin", e->root);
    assert_int_equal(tide_ssd_open_direct(missing, &fd), TIDE_E_NOT_FOUND);
    assert_int_equal(fd, -1);

    /* A read error names the file. */
    tide_ssd_close(s);
    tide_ssd_test_set_faults(&(tide_ssd_faults){.fail_read_nth = 2});
    tide_status fst = tide_ssd_open(e->ctx, NULL, 0, 0, &o, &s);
    tide_ssd_test_set_faults(NULL);
    assert_int_equal(fst, TIDE_OK);
    assert_int_equal(tide_ssd_open_direct(path, &fd), TIDE_OK);
    assert_int_equal(tide_ssd_read_file(s, fd, 0, back, 4 * STRIPE), TIDE_E_IO);
    assert_true(contains(tide_ctx_last_error(e->ctx), path));
    close(fd);
    tide_ssd_close(s);
    unlink(path);
    free(d), free(back);
}

/* ------------------------------------------------------------ regions */

static void test_register(void **state) {
    struct env *e = *state;
    tide_ssd_opts o = base_opts(e);
    tide_ssd *s = open2(e, 8 * MIB, &o);
    const size_t rn = 4 * MIB;
    unsigned char *region = xalloc(rn), *other = xalloc(2 * MIB);
    assert_int_equal(tide_ssd_register(s, region, rn), TIDE_OK);
    assert_int_equal(tide_ssd_register(s, region + MIB, MIB), TIDE_E_INVALID); /* overlap */
    assert_int_equal(tide_ssd_register(s, region + 100, MIB), TIDE_E_INVALID);
    assert_int_equal(tide_ssd_register(s, other, 1000), TIDE_E_INVALID);

    fill(region, rn, 10);
    assert_int_equal(tide_ssd_write(s, MIB, region, rn), TIDE_OK);
    tide_ssd_stats st;
    tide_ssd_get_stats(s, &st);
    if (!e->fallback) assert_int_equal(st.fixed_requests, st.requests);
    else assert_int_equal(st.fixed_requests, 0);

    /* Read into a buffer half inside the region, half outside (other). */
    assert_int_equal(tide_ssd_register(s, other, 2 * MIB), TIDE_OK);
    assert_int_equal(tide_ssd_read(s, MIB, other, 2 * MIB), TIDE_OK);
    assert_memory_equal(other, region, 2 * MIB);
    assert_int_equal(tide_ssd_unregister(s, other), TIDE_OK);
    unsigned char *copy = xalloc(rn);
    memcpy(copy, region, rn);
    memset(region, 0, rn);
    assert_int_equal(tide_ssd_read(s, MIB, region, rn), TIDE_OK);
    assert_memory_equal(region, copy, rn);
    assert_int_equal(tide_ssd_read(s, MIB, other, 2 * MIB), TIDE_OK); /* plain again */
    assert_memory_equal(other, copy, 2 * MIB);

    assert_int_equal(tide_ssd_unregister(s, region), TIDE_OK);
    assert_int_equal(tide_ssd_unregister(s, region), TIDE_E_INVALID);
    tide_ssd_get_stats(s, &st);
    uint64_t fixed = st.fixed_requests;
    assert_int_equal(tide_ssd_read(s, MIB, region, rn), TIDE_OK);
    tide_ssd_get_stats(s, &st);
    assert_int_equal(st.fixed_requests, fixed);
    tide_ssd_close(s);
    free(region), free(other), free(copy);
}

/* ------------------------------------------------------------ threads */

struct thread_job {
    tide_ssd *s;
    unsigned char *d, *back;
    size_t n;
    tide_status st[2];
};

static void *thread_main(void *arg) {
    struct thread_job *j = arg;
    j->st[0] = tide_ssd_write(j->s, 4096, j->d, j->n);
    j->st[1] = tide_ssd_read(j->s, 4096, j->back, j->n);
    return NULL;
}

/* Opened on this thread, used on another (run under TSan to mean much). */
static void test_other_thread(void **state) {
    struct env *e = *state;
    tide_ssd_opts o = base_opts(e);
    tide_ssd *s = open2(e, 4 * MIB, &o);
    struct thread_job j = {.s = s, .n = 3 * MIB};
    j.d = xalloc(j.n);
    j.back = xalloc(j.n);
    fill(j.d, j.n, 11);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, thread_main, &j), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_int_equal(j.st[0], TIDE_OK);
    assert_int_equal(j.st[1], TIDE_OK);
    assert_memory_equal(j.back, j.d, j.n);
    tide_ssd_close(s);
    free(j.d), free(j.back);
}

/* Buffered fallback when a filesystem refuses O_DIRECT. */
static void test_refuse_direct(void **state) {
    struct env *e = *state;
    tide_ssd_opts o = base_opts(e);
    tide_ssd_test_set_faults(&(tide_ssd_faults){.refuse_direct = true});
    tide_ssd *s = open2(e, MIB, &o);
    tide_ssd_test_set_faults(NULL);
    assert_false(tide_ssd_direct(s));
    unsigned char *d = xalloc(MIB), *back = xalloc(MIB);
    fill(d, MIB, 12);
    assert_int_equal(tide_ssd_write(s, 0, d, MIB), TIDE_OK);
    assert_int_equal(tide_ssd_read(s, 0, back, MIB), TIDE_OK);
    assert_memory_equal(back, d, MIB);
    tide_ssd_close(s);
    free(d), free(back);
}

static void test_raw_bw(void **state) {
    struct env *e = *state;
    double r = 0, w = 0;
    assert_int_equal(tide_ssd_raw_read_bw(e->ctx, e->dir[0], 8 * MIB, &r), TIDE_OK);
    assert_int_equal(tide_ssd_raw_write_bw(e->ctx, e->dir[0], 8 * MIB, &w), TIDE_OK);
    assert_true(r > 0 && w > 0);
    assert_int_equal(tide_ssd_raw_read_bw(e->ctx, e->dir[0], 0, &r), TIDE_E_INVALID);
    char missing[400];
    snprintf(missing, sizeof missing, "%s/no-such-dir", e->root);
    assert_int_equal(tide_ssd_raw_read_bw(e->ctx, missing, MIB, &r), TIDE_E_IO);
    assert_true(contains(tide_ctx_last_error(e->ctx), missing));
    assert_dirs_empty(e);
}

/* TIDE_SSD_PREAD picks the pread engine for a store whose options leave the
 * choice to io_uring (the route `tide run --pread` takes), and "0" does not. */
static void test_env_pread(void **state) {
    struct env *e = *state;
    tide_ssd_opts o = base_opts(e);
    setenv("TIDE_SSD_PREAD", "1", 1);
    tide_ssd *s = NULL;
    tide_status st = tide_ssd_open(e->ctx, e->dirs, 2, 4 * MIB, &o, &s);
    unsetenv("TIDE_SSD_PREAD");
    if (st != TIDE_OK) fail_msg("open: %s", tide_ctx_last_error(e->ctx));
    assert_string_equal(tide_ssd_backend_name(s), "pread");
    assert_string_equal(tide_ssd_fallback_reason(s), "forced by TIDE_SSD_PREAD");
    tide_ssd_close(s);
    setenv("TIDE_SSD_PREAD", "0", 1);
    s = open2(e, 4 * MIB, &o); /* io_uring where the kernel allows it (else skipped) */
    unsetenv("TIDE_SSD_PREAD");
    tide_ssd_close(s);
    assert_dirs_empty(e);
}

/* A case on one engine, named for it. */
#define ON(fn, engine, env) {#fn "/" engine, fn, setup, teardown, env}
#define BOTH(fn) ON(fn, "io_uring", &env_uring), ON(fn, "pread", &env_pread)

int main(void) {
    const struct CMUnitTest tests[] = {
        BOTH(test_roundtrip),
        BOTH(test_layout),
        BOTH(test_bad_args),
        BOTH(test_fail_nth_read),
        BOTH(test_fail_nth_write),
        BOTH(test_short_and_eagain),
        BOTH(test_read_file),
        BOTH(test_register),
        BOTH(test_other_thread),
        BOTH(test_refuse_direct),
        ON(test_enospc, "pread", &env_pread),
        ON(test_bad_dirs, "pread", &env_pread),
        ON(test_env_pread, "io_uring", &env_uring),
        BOTH(test_alloc_faults),
        ON(test_raw_bw, "raw", &env_pread),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
