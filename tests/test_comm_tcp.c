/*
 * test_comm_tcp.c - the ranks' collectives over TCP (src/net/comm_tcp.c),
 * joined torchrun-style (TIDE_WORLD_SIZE, TIDE_RANK, MASTER_ADDR and a
 * port): each case forks its ranks on this machine, 127.0.0.1.
 *
 * What it proves:
 *   - 2, 3 and 4 ranks meet (a stray connection that does not speak the
 *     protocol, made before the other ranks come, is ignored) and every collective gives the right numbers:
 *     all-reduce of f32 (exact integer sums; parts over several segments of
 *     the scratch; a size that does not divide) and f64, reduce-scatter of
 *     rows (uneven shards, an empty one, the padding rows zeroed),
 *     all-gather and gather of rows, broadcast (small and 10 MB), and the
 *     hash comparison (equal passes; a differing rank is named);
 *   - the sums are the ring's order on every rank, bit for bit: rank j's
 *     part is rank j+1's value plus j+2's ... plus j's (random f32 inputs,
 *     checked against that fold computed locally; with 2 ranks a + b);
 *   - the bytes counted are the ring formula's;
 *   - failures are named, none hangs: a rank that exits (its peer's
 *     collective fails naming it), a rank that stops answering
 *     (TIDE_NET_TIMEOUT: the collective times out naming it), the cancel
 *     flag, a rank that never comes (rank 0 says how many came), ranks
 *     started with different numbers of ranks (both sides say so), a rank
 *     number taken twice, the port in use, MASTER_ADDR or the port missing,
 *     a rank past the world size, a malformed TIDE_NET_TIMEOUT.
 * No timing decides a verdict: a stuck rank waits on a pipe, not a sleep.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "net/comm.h"

/* In a rank (a child process): a failed check ends it with status 1. */
#define CHECK(cond, ...)                                                                                         \
    do {                                                                                                         \
        if (!(cond)) {                                                                                           \
            fprintf(stderr, "rank %d: line %d: check failed: %s: ", g_rank, __LINE__, #cond);                  \
            fprintf(stderr, __VA_ARGS__);                                                                        \
            fputc('\n', stderr);                                                                                 \
            _exit(1);                                                                                            \
        }                                                                                                        \
    } while (0)

static int g_rank;
static int g_pipe[2] = {-1, -1}; /* a stuck rank reads [0] until rank 0, holding [1], ends */

static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    socklen_t n = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &n);
    close(fd);
    return ntohs(a.sin_port);
}

static void launch_env(int rank, int size, int port) {
    static const char *const other[] = {"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMI_SIZE",
                                        "PMI_RANK", "SLURM_STEP_NUM_TASKS", "PMIX_RANK",
                                        "SLURM_PROCID", "WORLD_SIZE", "RANK", "TORCHELASTIC_USE_AGENT_STORE",
                                        "MASTER_PORT"};
    for (size_t k = 0; k < sizeof other / sizeof other[0]; k++) unsetenv(other[k]);
    char v[32];
    snprintf(v, sizeof v, "%d", size);
    setenv("TIDE_WORLD_SIZE", v, 1);
    snprintf(v, sizeof v, "%d", rank);
    setenv("TIDE_RANK", v, 1);
    snprintf(v, sizeof v, "%d", port);
    setenv("TIDE_MASTER_PORT", v, 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("TIDE_NET_TIMEOUT", "60", 1); /* a hang's guard */
}

/* Forks ranks 0..n-1 (sizes[r] the world size rank r is told, NULL: n),
 * each running fn; true when every one exits 0. */
typedef int (*rank_fn)(int rank, int size, void *arg);
static bool run_ranks(int n, const int *sizes, rank_fn fn, void *arg) {
    int port = free_port();
    pid_t pid[8];
    fflush(NULL);
    for (int r = 0; r < n; r++) {
        pid[r] = fork();
        assert_true(pid[r] >= 0);
        if (pid[r] == 0) {
            g_rank = r;
            launch_env(r, sizes ? sizes[r] : n, port);
            int rc = fn(r, sizes ? sizes[r] : n, arg);
            fflush(NULL);
            _exit(rc);
        }
    }
    /* the ranks hold the pipe's ends now: a stuck rank's read ends with rank 0 */
    if (g_pipe[0] >= 0) {
        close(g_pipe[0]);
        close(g_pipe[1]);
        g_pipe[0] = g_pipe[1] = -1;
    }
    bool ok = true;
    for (int r = 0; r < n; r++) {
        int st = 0;
        waitpid(pid[r], &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st)) {
            fprintf(stderr, "rank %d of %d ended with status %d\n", r, n, WIFEXITED(st) ? WEXITSTATUS(st) : -1);
            ok = false;
        }
    }
    return ok;
}

static tide_comm *join(tide_ctx *ctx) {
    tide_comm *c = NULL;
    tide_status st = tide_comm_open(ctx, &c);
    CHECK(st == TIDE_OK && c, "tide_comm_open: %s", tide_ctx_last_error(ctx));
    return c;
}

static uint32_t mix(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7feb352d;
    x ^= x >> 15;
    x *= 0x846ca68b;
    return x ^ (x >> 16);
}
/* rank r's random input i: in [-1, 1) */
static float rnd(int r, uint64_t i) { return (float)(mix((uint32_t)(i * 7919 + (uint64_t)r * 104729 + 1)) >> 8) / 8388608.0f - 1.0f; }

static uint64_t hash_bytes(const void *p, size_t n) {
    const unsigned char *b = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

static int collectives(int rank, int size, void *arg) {
    (void)arg;
    tide_ctx *ctx = tide_ctx_new();
    tide_comm *c = join(ctx);
    CHECK(tide_comm_rank(c) == rank && tide_comm_size(c) == size, "rank %d of %d", tide_comm_rank(c),
          tide_comm_size(c));
    CHECK(!strcmp(tide_comm_carrier(c), "tcp"), "carrier %s", tide_comm_carrier(c));
    uint64_t sent0 = tide_comm_bytes_sent(c);

    /* all-reduce, exact: integers; several segments a part (4 MiB each) */
    uint64_t n = (uint64_t)size * 1500000 + 7;
    float *x = malloc(n * sizeof *x);
    for (uint64_t i = 0; i < n; i++) x[i] = (float)(rank * 1000 + (int)(i % 997));
    CHECK(!tide_comm_allreduce_f32(c, ctx, x, n, "integers"), "%s", tide_ctx_last_error(ctx));
    for (uint64_t i = 0; i < n; i++) {
        float want = (float)(1000 * size * (size - 1) / 2 + size * (int)(i % 997));
        CHECK(x[i] == want, "element %llu: %g, want %g", (unsigned long long)i, x[i], want);
    }
    uint64_t want_sent = 2 * n * sizeof(float) * (uint64_t)(size - 1) / (uint64_t)size;
    CHECK(tide_comm_bytes_sent(c) - sent0 == want_sent, "bytes %llu, want %llu",
          (unsigned long long)(tide_comm_bytes_sent(c) - sent0), (unsigned long long)want_sent);

    /* all-reduce, random: the ring's fold, the same bits on every rank */
    uint64_t m = 100003;
    for (uint64_t i = 0; i < m; i++) x[i] = rnd(rank, i);
    CHECK(!tide_comm_allreduce_f32(c, ctx, x, m, "random"), "%s", tide_ctx_last_error(ctx));
    for (int j = 0; j < size; j++) {
        int64_t i0, k;
        tide_comm_shard_rows((int64_t)m, size, j, &i0, &k);
        for (int64_t i = i0; i < i0 + k; i++) {
            float s = rnd((j + 1) % size, (uint64_t)i);
            for (int q = 2; q <= size; q++) s = s + rnd((j + q) % size, (uint64_t)i);
            CHECK(!memcmp(&s, &x[i], sizeof s), "element %lld of part %d: %.9g, the ring's fold %.9g", (long long)i,
                  j, x[i], s);
        }
    }
    CHECK(!tide_comm_same(c, ctx, hash_bytes(x, m * sizeof *x), "random sums"), "%s", tide_ctx_last_error(ctx));
    if (size == 2)
        for (uint64_t i = 0; i < m; i++) CHECK(x[i] == rnd(0, i) + rnd(1, i), "a + b at %llu", (unsigned long long)i);

    /* f64 */
    double d[3] = {rank + 0.5, -rank, 1e300};
    CHECK(!tide_comm_allreduce_f64(c, ctx, d, 2, "doubles"), "%s", tide_ctx_last_error(ctx));
    CHECK(d[0] == size * (size - 1) / 2.0 + 0.5 * size && d[1] == -(size * (size - 1) / 2.0) && d[2] == 1e300,
          "f64 %g %g", d[0], d[1]);

    /* reduce-scatter of rows: 7 rows of 5 (uneven), then 2 rows (a rank
     * with none); the padding rows zeroed */
    for (int64_t rows = 7; rows >= 2; rows -= 5) {
        const uint64_t re = 5;
        int64_t cr = (rows + size - 1) / size, r0, k;
        tide_comm_shard_rows(rows, size, rank, &r0, &k);
        float shard[64];
        for (int i = 0; i < 64; i++) shard[i] = 99;
        for (uint64_t i = 0; i < (uint64_t)rows * re; i++) x[i] = (float)(rank + 1) * (float)i;
        CHECK(!tide_comm_reduce_scatter_f32(c, ctx, x, shard, rows, re, "rows"), "%s", tide_ctx_last_error(ctx));
        for (int64_t i = 0; i < cr * (int64_t)re; i++) {
            float want = i < k * (int64_t)re ? (float)(size * (size + 1) / 2) * (float)(r0 * (int64_t)re + i) : 0;
            CHECK(shard[i] == want, "rows %lld: shard element %lld %g, want %g", (long long)rows, (long long)i,
                  shard[i], want);
        }
        CHECK(shard[cr * re] == 99, "past the shard");
    }

    /* all-gather and gather of rows: 7 rows of 12 bytes */
    {
        const int64_t rows = 7;
        const uint64_t rb = 12;
        int64_t r0, k, cr = (rows + size - 1) / size;
        tide_comm_shard_rows(rows, size, rank, &r0, &k);
        unsigned char mine[7 * 12], all[7 * 12 + 1], got[7 * 12 + 1];
        for (int64_t i = 0; i < cr * (int64_t)rb; i++) mine[i] = (unsigned char)(r0 * (int64_t)rb + i + 3);
        memset(all, 0xee, sizeof all);
        memset(got, 0xee, sizeof got);
        CHECK(!tide_comm_allgather_rows(c, ctx, mine, all, rows, rb, "rows"), "%s", tide_ctx_last_error(ctx));
        CHECK(!tide_comm_gather_rows(c, ctx, mine, got, rows, rb, "rows"), "%s", tide_ctx_last_error(ctx));
        for (int i = 0; i < rows * (int64_t)rb; i++) {
            CHECK(all[i] == (unsigned char)(i + 3), "all-gather byte %d", i);
            CHECK(rank > 0 || got[i] == (unsigned char)(i + 3), "gather byte %d", i);
        }
        CHECK(all[rows * rb] == 0xee && got[rows * rb] == 0xee, "past the rows");
    }

    /* broadcast: small and 10 MB */
    char hello[64] = "";
    if (rank == 0) snprintf(hello, sizeof hello, "from rank 0");
    CHECK(!tide_comm_bcast(c, ctx, hello, sizeof hello, "a string"), "%s", tide_ctx_last_error(ctx));
    CHECK(!strcmp(hello, "from rank 0"), "broadcast: '%s'", hello);
    size_t big = 10u << 20;
    unsigned char *b = malloc(big);
    for (size_t i = 0; i < big; i++) b[i] = rank == 0 ? (unsigned char)(i * 31 + 7) : 0;
    CHECK(!tide_comm_bcast(c, ctx, b, big, "10 MB"), "%s", tide_ctx_last_error(ctx));
    for (size_t i = 0; i < big; i++) CHECK(b[i] == (unsigned char)(i * 31 + 7), "broadcast byte %zu", i);

    /* the hash comparison: equal, then rank 1's differs */
    CHECK(!tide_comm_same(c, ctx, 42, "plan"), "%s", tide_ctx_last_error(ctx));
    tide_status st = tide_comm_same(c, ctx, rank == 1 ? 43 : 42, "plan");
    CHECK(st == TIDE_E_INVALID && strstr(tide_ctx_last_error(ctx), "rank 1's plan differs"), "same: %d %s", st,
          tide_ctx_last_error(ctx));
    free(b);
    free(x);
    tide_comm_close(c);
    tide_ctx_free(ctx);
    return 0;
}

/* A process that connects to rank 0's port and speaks another protocol;
 * ranks 1.. join once it has gone (its end of g_pipe closed: EOF), so rank
 * 0 meets it first, whatever the machine's load. */
static int stray_then_ranks(int rank, int size, void *arg) {
    (void)arg;
    if (rank == size - 1) { /* the stray: not a rank */
        const char *p = getenv("TIDE_MASTER_PORT");
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(p)),
                                .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        for (int tries = 0; tries < 600; tries++) {
            int fd = socket(AF_INET, SOCK_STREAM, 0);
            if (!connect(fd, (struct sockaddr *)&a, sizeof a)) {
                const char junk[] = "GET / HTTP/1.0\r\n\r\nand more bytes than a hello";
                if (write(fd, junk, sizeof junk)) {}
                close(fd);
                return 0; /* its exit closes g_pipe[1] */
            }
            close(fd);
            usleep(100000);
        }
        return 1;
    }
    /* the ranks: size - 1 of them; ranks 1.. join after the stray is gone */
    close(g_pipe[1]);
    int n = size - 1;
    char v[16];
    snprintf(v, sizeof v, "%d", n);
    setenv("TIDE_WORLD_SIZE", v, 1);
    char ch;
    if (rank > 0 && read(g_pipe[0], &ch, 1) != 0) return 1;
    tide_ctx *ctx = tide_ctx_new();
    tide_comm *c = join(ctx);
    float x[3] = {1, 2, 3};
    CHECK(!tide_comm_allreduce_f32(c, ctx, x, 3, "after a stray"), "%s", tide_ctx_last_error(ctx));
    CHECK(x[0] == n && x[2] == 3 * n, "sum %g", x[0]);
    tide_comm_close(c);
    tide_ctx_free(ctx);
    return 0;
}

static void test_collectives(void **state) {
    (void)state;
    for (int n = 2; n <= 4; n++) {
        fprintf(stderr, "%d ranks\n", n);
        assert_true(run_ranks(n, NULL, collectives, NULL));
    }
    assert_int_equal(pipe(g_pipe), 0);
    assert_true(run_ranks(3, NULL, stray_then_ranks, NULL));
}

/* ---- failures ---- */

enum { F_EXIT, F_STUCK, F_CANCEL };

static int failing(int rank, int size, void *arg) {
    int kind = *(int *)arg;
    tide_ctx *ctx = tide_ctx_new();
    if (kind != F_EXIT) setenv("TIDE_NET_TIMEOUT", kind == F_STUCK ? "1" : "60", 1);
    tide_comm *c = join(ctx);
    (void)size;
    if (rank == 1) {
        close(g_pipe[1]);
        if (kind == F_EXIT) _exit(0); /* leaves without a word */
        char ch;
        if (read(g_pipe[0], &ch, 1) < 0) {} /* stuck until rank 0 ends */
        _exit(0);
    }
    close(g_pipe[0]);
    atomic_bool flag = true;
    if (kind == F_CANCEL) tide_comm_set_cancel(c, &flag);
    float x[1000] = {0};
    tide_status st = tide_comm_allreduce_f32(c, ctx, x, 1000, "gradients");
    const char *e = tide_ctx_last_error(ctx);
    CHECK(st == TIDE_E_IO, "status %d", st);
    CHECK(strstr(e, "rank 0 of 2: all-reduce of gradients"), "%s", e);
    if (kind == F_EXIT) CHECK(strstr(e, "rank 1") && strstr(e, "failed or died"), "%s", e);
    if (kind == F_STUCK) CHECK(strstr(e, "timed out") && strstr(e, "rank 1 stopped answering"), "%s", e);
    if (kind == F_CANCEL) CHECK(strstr(e, "abandoned"), "%s", e);
    fprintf(stderr, "rank 0: as expected: %s\n", e);
    tide_comm_close(c);
    tide_ctx_free(ctx);
    return 0;
}

/* Ranks told different numbers of ranks, or the same rank twice: rank 0
 * and the refused rank both fail, naming why. */
static int mismatched(int rank, int size, void *arg) {
    bool twice = *(bool *)arg;
    if (twice && rank == 2) setenv("TIDE_RANK", "1", 1);
    setenv("TIDE_NET_TIMEOUT", "20", 1);
    tide_ctx *ctx = tide_ctx_new();
    tide_comm *c = NULL;
    tide_status st = tide_comm_open(ctx, &c);
    const char *e = tide_ctx_last_error(ctx);
    if (!twice) {
        CHECK(st == TIDE_E_INVALID && !c, "status %d", st);
        if (rank == 0) CHECK(strstr(e, "rank 1 was started with 3 ranks, rank 0 with 2"), "%s", e);
        else CHECK(strstr(e, "rank 0 refused this rank"), "%s", e);
    } else if (rank == 0) {
        CHECK(st == TIDE_E_INVALID && !c, "status %d %s", st, e);
        CHECK(strstr(e, "two processes said they are rank 1"), "%s", e);
    } else {
        /* of the two rank 1s, the later is refused, naming why; the
         * earlier's wait fails when rank 0 gives up */
        CHECK(!c && ((st == TIDE_E_INVALID && strstr(e, "rank 0 refused this rank: two processes said they are "
              "rank 1")) || (st == TIDE_E_IO && strstr(e, "closed its connection"))), "status %d %s", st, e);
    }
    fprintf(stderr, "rank %d: as expected: %s\n", rank, e);
    tide_ctx_free(ctx);
    (void)size;
    return 0;
}

static int alone(int rank, int size, void *arg) {
    (void)rank;
    (void)size;
    (void)arg;
    setenv("TIDE_NET_TIMEOUT", "1", 1);
    tide_ctx *ctx = tide_ctx_new();
    tide_comm *c = NULL;
    tide_status st = tide_comm_open(ctx, &c);
    CHECK(st == TIDE_E_IO && !c && strstr(tide_ctx_last_error(ctx), "1 of the 2 ranks joined"), "%d %s", st,
          tide_ctx_last_error(ctx));
    tide_ctx_free(ctx);
    return 0;
}

static void expect_open_error(tide_status want, const char *text) {
    tide_ctx *ctx = tide_ctx_new();
    tide_comm *c = (tide_comm *)ctx;
    assert_int_equal(tide_comm_open(ctx, &c), want);
    assert_null(c);
    if (!strstr(tide_ctx_last_error(ctx), text)) fail_msg("'%s' not in '%s'", text, tide_ctx_last_error(ctx));
    tide_ctx_free(ctx);
}

static void test_failures(void **state) {
    (void)state;
    for (int kind = F_EXIT; kind <= F_CANCEL; kind++) {
        assert_int_equal(pipe(g_pipe), 0);
        assert_true(run_ranks(2, NULL, failing, &kind));
    }
    const int sizes[2] = {2, 3};
    bool twice = false;
    assert_true(run_ranks(2, sizes, mismatched, &twice));
    twice = true;
    assert_true(run_ranks(3, NULL, mismatched, &twice));
    /* rank 0 alone of 2: says how many came */
    assert_true(run_ranks(1, (const int[]){2}, alone, NULL));

    /* the environment's mistakes, in this process */
    int port = free_port();
    launch_env(0, 2, port);
    unsetenv("MASTER_ADDR");
    expect_open_error(TIDE_E_INVALID, "needs MASTER_ADDR");
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    unsetenv("TIDE_MASTER_PORT");
    expect_open_error(TIDE_E_INVALID, "needs MASTER_PORT");
    setenv("MASTER_PORT", "70000", 1);
    expect_open_error(TIDE_E_INVALID, "MASTER_PORT '70000' is not a port");
    setenv("TIDE_RANK", "2", 1);
    expect_open_error(TIDE_E_INVALID, "rank 2 of 2 ranks");
    setenv("TIDE_RANK", "0", 1);
    setenv("TIDE_NET_TIMEOUT", "soon", 1);
    expect_open_error(TIDE_E_INVALID, "TIDE_NET_TIMEOUT 'soon'");
    setenv("TIDE_NET_TIMEOUT", "1", 1);
    /* the port in use */
    int busy = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_ANY)};
    assert_int_equal(bind(busy, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(busy, 1), 0);
    socklen_t al = sizeof a;
    getsockname(busy, (struct sockaddr *)&a, &al);
    char v[16];
    snprintf(v, sizeof v, "%d", ntohs(a.sin_port));
    setenv("TIDE_MASTER_PORT", v, 1);
    expect_open_error(TIDE_E_IO, "in use");
    close(busy);
    /* torchrun's agent holds MASTER_PORT: tide takes the next one */
    unsetenv("TIDE_MASTER_PORT");
    setenv("MASTER_PORT", "65535", 1);
    setenv("TORCHELASTIC_USE_AGENT_STORE", "True", 1);
    expect_open_error(TIDE_E_INVALID, "MASTER_PORT '65535' is not a port");
    unsetenv("TORCHELASTIC_USE_AGENT_STORE");
    /* one rank: no connection, every collective its own values */
    setenv("TIDE_WORLD_SIZE", "1", 1);
    unsetenv("MASTER_ADDR");
    tide_ctx *ctx = tide_ctx_new();
    tide_comm *c = NULL;
    assert_int_equal(tide_comm_open(ctx, &c), TIDE_OK);
    assert_string_equal(tide_comm_carrier(c), "tcp");
    float x[3] = {1, 2, 3}, sh[3];
    assert_int_equal(tide_comm_allreduce_f32(c, ctx, x, 3, "x"), TIDE_OK);
    assert_int_equal(tide_comm_reduce_scatter_f32(c, ctx, x, sh, 3, 1, "x"), TIDE_OK);
    assert_true(x[2] == 3 && sh[2] == 3);
    tide_comm_close(c);
    tide_ctx_free(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_collectives),
        cmocka_unit_test(test_failures),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
