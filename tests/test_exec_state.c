/*
 * test_exec_state.c - STATE tensors homed on SSD: the executor reads them from
 * and writes them back to extents of a file the caller made, and after every
 * run the file holds the bytes the same runs leave in host-homed state, bit
 * for bit: for n_iter 1 plans run again and again and n_iter 2 plans, device
 * budgets tight enough that dirty state is stored home mid-run, host
 * addressable plans (host homes used in place, SSD homes still loaded and
 * stored), O_DIRECT and buffered descriptors, io_uring and the pread pool,
 * extents at 4 KiB offsets and packed at odd ones (the bytes between them
 * kept). A failed write fails the run with a message naming the instruction,
 * the tensor and the file. The store's file writes are checked on their own
 * first.
 *
 * The graph (GENERIC ops, f32 element counts; each state is read and
 * rewritten in place, s2 spans two of the store's 1 MiB requests):
 *   s0 = g(s0, x, w)         x (777) input, w (2000) weight
 *   s1 = g(s1, s0)           s0 (3001), s1 (70000)
 *   t  = g(s2, s1)           t (50000) temp, s2 (300007)
 *   s2 = g(s2, t)
 *   s3 = g(s3, s2, x)        s3 (1500)
 *   s0 = g(s0, s3)
 *   s1 = g(s1, s3, t)
 *   out = g(s0, s1, s2, s3)  out (999) output
 *
 * What it proves: persistent tensors homed in a file on SSD and written back
 * by the executor: the file's contents equal host-homed runs bit for bit over
 * budgets, iterations, host-addressable plans, direct and buffered
 * descriptors; injected write failures named.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "backend/backend.h"
#include "exec/executor.h"
#include "planner/planner.h"
#include "store/ssd.h"
#include "store/ssd_test.h"
#include "verify/verify.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { N_STATE = 4, MAX_RUNS = 6 };

static const int64_t state_elems[N_STATE] = {3001, 70000, 300007, 1500};
static char dir[256], spill_dir[300], state_path[300];
static tide_hw hw;

/* The graph's tensors by index. */
typedef struct ids {
    int s[N_STATE], x, w, t, out;
} ids;

/* A context whose CPU kernels run on one thread: the tensors are small, and
 * threads waiting for work would only take the cores the io stream needs. */
static tide_ctx *ctx_new(void) {
    tide_ctx *ctx = tide_ctx_new();
    assert_non_null(ctx);
    tide_ctx_set_threads(ctx, 1);
    return ctx;
}

static tide_graph *build(tide_ctx *ctx, ids *id) {
    tide_graph *g = tide_graph_new(ctx);
    assert_non_null(g);
    for (int k = 0; k < N_STATE; k++) {
        char name[8];
        snprintf(name, sizeof name, "s%d", k);
        assert_int_equal(tide_graph_add_tensor(g, name, TIDE_F32, TIDE_ROLE_STATE, 1, &state_elems[k], &id->s[k]),
                         TIDE_OK);
    }
    int64_t nx = 777, nw = 2000, nt = 50000, no = 999;
    assert_int_equal(tide_graph_add_tensor(g, "x", TIDE_F32, TIDE_ROLE_INPUT, 1, &nx, &id->x), TIDE_OK);
    assert_int_equal(tide_graph_add_tensor(g, "w", TIDE_F32, TIDE_ROLE_WEIGHT, 1, &nw, &id->w), TIDE_OK);
    assert_int_equal(tide_graph_add_tensor(g, "t", TIDE_F32, TIDE_ROLE_TEMP, 1, &nt, &id->t), TIDE_OK);
    assert_int_equal(tide_graph_add_tensor(g, "out", TIDE_F32, TIDE_ROLE_OUTPUT, 1, &no, &id->out), TIDE_OK);
    const int *s = id->s;
    struct { int n_in, in[4], out; } ops[] = {
        {3, {s[0], id->x, id->w}, s[0]}, {2, {s[1], s[0]}, s[1]},       {2, {s[2], s[1]}, id->t},
        {2, {s[2], id->t}, s[2]},        {3, {s[3], s[2], id->x}, s[3]}, {2, {s[0], s[3]}, s[0]},
        {3, {s[1], s[3], id->t}, s[1]},  {4, {s[0], s[1], s[2], s[3]}, id->out},
    };
    tide_op_args p = {.flops = 1e5};
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
        assert_int_equal(tide_graph_add_op_args(g, TIDE_OP_GENERIC, ops[i].n_in, ops[i].in, 1, &ops[i].out, &p, -1, NULL),
                         TIDE_OK);
    return g;
}

/* Initial bytes of tensor u (byte j). */
static unsigned char init_byte(int u, uint64_t j) { return (unsigned char)(j * 13u + (unsigned)u * 7u + 1u); }

static unsigned char *init_bytes(const tide_graph *g, int u) {
    uint64_t n = tide_graph_tensor_bytes(g, u);
    unsigned char *b = malloc(n);
    assert_non_null(b);
    for (uint64_t j = 0; j < n; j++) b[j] = init_byte(u, j);
    return b;
}

/* The reference: every home in host memory, an unconstrained plan run
 * MAX_RUNS times; state and out after run r (1-based) in ref_s[r - 1][k] and
 * ref_out[r - 1]. */
static unsigned char *ref_s[MAX_RUNS][N_STATE], *ref_out[MAX_RUNS];

static int setup(void **state) {
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/tide-exec-state-XXXXXX");
    if (!mkdtemp(dir)) return -1;
    snprintf(spill_dir, sizeof spill_dir, "%s/spill", dir);
    snprintf(state_path, sizeof state_path, "%s/state", dir);
    if (mkdir(spill_dir, 0700)) return -1;
    hw = (tide_hw){.name = "test", .device_mem_bytes = UINT64_C(1) << 34, .matmul_efficiency = 1,
                   .mem_bw = 1e10, .h2d_bw = 1e10, .d2h_bw = 1e10, .link_latency_s = 1e-6,
                   .launch_s = 1e-6, .host_mem_bytes = UINT64_C(1) << 34, .ssd_count = 1,
                   .ssd_read_bw = 1e9, .ssd_write_bw = 1e9, .ssd_latency_s = 1e-5};
    for (int d = 0; d < TIDE_DTYPE_COUNT; d++) hw.flops[d] = 1e10;

    tide_ctx *ctx = ctx_new();
    tide_backend *be = NULL;
    if (!ctx || tide_backend_new(ctx, TIDE_BACKEND_CPU, &be)) return -1;
    ids id;
    tide_graph *g = build(ctx, &id);
    tide_plan_opts po = {.policy = TIDE_POLICY_TIDE, .n_iter = 1, .hw = &hw};
    assert_int_equal(tide_plan_peak_unbounded(ctx, g, &po, &po.device_budget), TIDE_OK);
    tide_plan *p = NULL;
    assert_int_equal(tide_plan_make(ctx, g, &po, &p), TIDE_OK);
    assert_int_equal(tide_plan_verify(p), TIDE_OK);
    tide_exec *ex = NULL;
    assert_int_equal(tide_exec_new(ctx, be, p, NULL, &ex), TIDE_OK);
    unsigned char *home[N_STATE], *x = init_bytes(g, id.x), *w = init_bytes(g, id.w);
    unsigned char *out = malloc(tide_graph_tensor_bytes(g, id.out));
    for (int k = 0; k < N_STATE; k++) {
        home[k] = init_bytes(g, id.s[k]);
        assert_int_equal(tide_exec_bind_host(ex, id.s[k], home[k]), TIDE_OK);
    }
    assert_int_equal(tide_exec_bind_host(ex, id.x, x), TIDE_OK);
    assert_int_equal(tide_exec_bind_host(ex, id.w, w), TIDE_OK);
    assert_int_equal(tide_exec_bind_host(ex, id.out, out), TIDE_OK);
    for (int r = 0; r < MAX_RUNS; r++) {
        assert_int_equal(tide_exec_run(ex, NULL, NULL), TIDE_OK);
        for (int k = 0; k < N_STATE; k++) {
            uint64_t n = tide_graph_tensor_bytes(g, id.s[k]);
            ref_s[r][k] = malloc(n);
            memcpy(ref_s[r][k], home[k], n);
        }
        ref_out[r] = malloc(tide_graph_tensor_bytes(g, id.out));
        memcpy(ref_out[r], out, tide_graph_tensor_bytes(g, id.out));
    }
    /* the states change from run to run, or the test proves little */
    assert_memory_not_equal(ref_s[0][2], ref_s[1][2], tide_graph_tensor_bytes(g, id.s[2]));
    for (int k = 0; k < N_STATE; k++) free(home[k]);
    free(x);
    free(w);
    free(out);
    tide_exec_free(ex);
    tide_plan_free(p);
    tide_graph_free(g);
    tide_backend_free(be);
    tide_ctx_free(ctx);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    for (int r = 0; r < MAX_RUNS; r++) {
        for (int k = 0; k < N_STATE; k++) free(ref_s[r][k]);
        free(ref_out[r]);
    }
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* ---------------------------------------------------------------- the store */

static void read_back(int fd, uint64_t off, void *buf, size_t n) {
    assert_int_equal(pread(fd, buf, n, (off_t)off), (ssize_t)n);
}

/* tide_ssd_write_file: a direct descriptor in aligned requests split at the
 * stripe, a buffered one at any alignment; fault injection counts both. */
static void test_ssd_write_file(void **state) {
    (void)state;
    tide_ctx *ctx = tide_ctx_new();
    char path[320];
    snprintf(path, sizeof path, "%s/wf", dir);
    int mk = open(path, O_CREAT | O_RDWR | O_TRUNC | O_CLOEXEC, 0600);
    assert_true(mk >= 0);
    size_t n = 5 * 4096;
    unsigned char *buf = tide_malloc_aligned(n + 4096, 4096), *got = malloc(n + 4096);
    for (size_t j = 0; j < n + 4096; j++) buf[j] = (unsigned char)(j * 31 + 5);
    for (int io = 0; io < 2; io++) {
        tide_ssd_opts so = {.force_fallback = io, .stripe_bytes = 8192};
        tide_ssd *s = NULL;
        assert_int_equal(tide_ssd_open(ctx, NULL, 0, 0, &so, &s), TIDE_OK);
        int fd = -1;
        if (tide_ssd_open_direct_rw(path, &fd) == TIDE_OK) {
            assert_int_equal(tide_ssd_write_file(s, fd, 4096, buf, n), TIDE_OK);
            read_back(mk, 4096, got, n);
            assert_memory_equal(got, buf, n);
            assert_int_equal(tide_ssd_write_file(s, fd, 100, buf, 4096), TIDE_E_INVALID);
            assert_int_equal(tide_ssd_write_file(s, fd, 4096, buf + 1, 4096), TIDE_E_INVALID);
            close(fd);
        }
        fd = open(path, O_RDWR | O_CLOEXEC);
        assert_int_equal(tide_ssd_write_file(s, fd, 777, buf + 3, n - 5), TIDE_OK);
        read_back(mk, 777, got, n - 5);
        assert_memory_equal(got, buf + 3, n - 5);
        tide_ssd_stats ss;
        tide_ssd_get_stats(s, &ss);
        assert_true(ss.bytes_written >= n - 5);
        assert_int_equal(tide_ssd_write_file(s, -1, 0, buf, 10), TIDE_E_INVALID);
        close(fd);
        tide_ssd_close(s);
    }
    /* the second request of a buffered write fails: the file and the reason
     * are named */
    tide_ssd_opts so = {.stripe_bytes = 4096};
    tide_ssd *s = NULL;
    tide_ssd_test_set_faults(&(tide_ssd_faults){.fail_write_nth = 2});
    assert_int_equal(tide_ssd_open(ctx, NULL, 0, 0, &so, &s), TIDE_OK);
    tide_ssd_test_set_faults(NULL);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    assert_int_equal(tide_ssd_write_file(s, fd, 10, buf, 3 * 4096), TIDE_E_IO);
    assert_non_null(strstr(tide_ctx_last_error(ctx), path));
    assert_non_null(strstr(tide_ctx_last_error(ctx), "Input/output error"));
    close(fd);
    tide_ssd_close(s);
    close(mk);
    unlink(path);
    tide_free_aligned(buf);
    free(got);
    tide_ctx_free(ctx);
}

/* ---------------------------------------------------------------- the executor */

/* Where each persistent tensor lives in the state file: at 4 KiB offsets, or
 * packed at odd ones with gaps between; the rest of the file is a pattern
 * that must stay. */
typedef struct layout {
    uint64_t off_s[N_STATE], off_w, bytes;
    unsigned char *image; /* what the file must hold */
} layout;

static void make_file(const tide_graph *g, const ids *id, bool packed, layout *L) {
    uint64_t at = packed ? 100 : 0;
    int order[N_STATE + 1] = {id->s[0], id->w, id->s[1], id->s[2], id->s[3]};
    for (int i = 0; i < N_STATE + 1; i++) {
        int u = order[i];
        uint64_t *slot = u == id->w ? &L->off_w : &L->off_s[i == 0 ? 0 : i - 1];
        *slot = at;
        uint64_t n = tide_graph_tensor_bytes(g, u);
        at = packed ? at + n + 37 : tide_plan_align(at + n);
    }
    L->bytes = tide_plan_align(at + 50);
    L->image = malloc(L->bytes);
    for (uint64_t j = 0; j < L->bytes; j++) L->image[j] = (unsigned char)(0xA5 ^ (j >> 3));
    for (int k = 0; k < N_STATE; k++) {
        unsigned char *b = init_bytes(g, id->s[k]);
        memcpy(L->image + L->off_s[k], b, tide_graph_tensor_bytes(g, id->s[k]));
        free(b);
    }
    unsigned char *b = init_bytes(g, id->w);
    memcpy(L->image + L->off_w, b, tide_graph_tensor_bytes(g, id->w));
    free(b);
    int fd = open(state_path, O_CREAT | O_RDWR | O_TRUNC | O_CLOEXEC, 0600);
    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, L->image, L->bytes, 0), (ssize_t)L->bytes);
    close(fd);
}

/* The file holds L->image with the states homed there by p as reference
 * run r (1-based) left them. */
static void check_file(const tide_plan *p, const ids *id, layout *L, int r, const char *what) {
    const tide_graph *g = p->g;
    for (int k = 0; k < N_STATE; k++)
        if (r > 0 && p->home[id->s[k]] == TIDE_TIER_SSD)
            memcpy(L->image + L->off_s[k], ref_s[r - 1][k], tide_graph_tensor_bytes(g, id->s[k]));
    unsigned char *got = malloc(L->bytes);
    int fd = open(state_path, O_RDONLY | O_CLOEXEC);
    assert_true(fd >= 0);
    read_back(fd, 0, got, L->bytes);
    close(fd);
    for (uint64_t j = 0; j < L->bytes; j++)
        if (got[j] != L->image[j]) {
            const char *where = "between the extents";
            for (int k = 0; k < N_STATE; k++)
                if (j >= L->off_s[k] && j < L->off_s[k] + tide_graph_tensor_bytes(g, id->s[k])) where = "in a state";
            if (j >= L->off_w && j < L->off_w + tide_graph_tensor_bytes(g, id->w)) where = "in the weight";
            fail_msg("%s: after %d reference runs the state file differs at byte %llu (%s)", what, r,
                     (unsigned long long)j, where);
        }
    free(got);
}

typedef struct cfg {
    bool packed;             /* extents at odd offsets */
    bool addressable;        /* host_addressable plan */
    int n_iter;
    bool tight;              /* the policy's minimum budget, else the unconstrained peak */
    uint64_t host_budget;    /* 8192: every state on SSD; 16384: s3 stays on host */
    tide_exec_opts eo;
} cfg;

/* A plan of the graph under c, verified, with its executor and every home
 * bound: states homed on SSD in the state file (made afresh), the weight
 * too (bound first, read-only, sharing the file), the rest in host memory. */
typedef struct run {
    tide_graph *g;
    ids id;
    tide_plan *p;
    tide_exec *ex;
    layout L;
    unsigned char *host_s[N_STATE], *x, *w, *out;
} run;

static void run_free(run *R) {
    tide_exec_free(R->ex);
    tide_plan_free(R->p);
    tide_graph_free(R->g);
    for (int k = 0; k < N_STATE; k++) free(R->host_s[k]);
    free(R->x);
    free(R->w);
    free(R->out);
    free(R->L.image);
    memset(R, 0, sizeof *R);
}

static void run_make(tide_ctx *ctx, tide_backend *be, const cfg *c, run *R) {
    memset(R, 0, sizeof *R);
    R->g = build(ctx, &R->id);
    const tide_graph *g = R->g;
    const ids *id = &R->id;
    tide_plan_opts po = {.policy = TIDE_POLICY_TIDE, .n_iter = c->n_iter, .hw = &hw, .host_budget = c->host_budget,
                         .host_addressable = c->addressable};
    if (c->tight) assert_int_equal(tide_plan_min_budget(ctx, g, &po, &po.device_budget), TIDE_OK);
    else assert_int_equal(tide_plan_peak_unbounded(ctx, g, &po, &po.device_budget), TIDE_OK);
    tide_status st = tide_plan_make(ctx, g, &po, &R->p);
    if (st) fail_msg("%s", tide_ctx_last_error(ctx));
    st = tide_plan_verify(R->p);
    if (st) fail_msg("%s", tide_ctx_last_error(ctx));
    const tide_plan *p = R->p;
    int on_ssd = 0;
    for (int k = 0; k < N_STATE; k++) on_ssd += p->home[id->s[k]] == TIDE_TIER_SSD;
    assert_true(on_ssd >= N_STATE - 1);
    assert_int_equal(p->home[id->w], TIDE_TIER_SSD);
    make_file(g, id, c->packed, &R->L);
    tide_exec_opts eo = c->eo;
    eo.ssd_dirs = spill_dir;
    st = tide_exec_new(ctx, be, p, &eo, &R->ex);
    if (st) fail_msg("%s", tide_ctx_last_error(ctx));
    assert_int_equal(tide_exec_bind_file(R->ex, id->w, state_path, R->L.off_w), TIDE_OK);
    for (int k = 0; k < N_STATE; k++) {
        int u = id->s[k];
        if (p->home[u] == TIDE_TIER_SSD) {
            st = tide_exec_bind_file(R->ex, u, state_path, R->L.off_s[k]);
            if (st) fail_msg("%s", tide_ctx_last_error(ctx));
        } else {
            R->host_s[k] = init_bytes(g, u);
            assert_int_equal(tide_exec_bind_host(R->ex, u, R->host_s[k]), TIDE_OK);
        }
    }
    R->x = init_bytes(g, id->x);
    R->out = malloc(tide_graph_tensor_bytes(g, id->out));
    assert_int_equal(tide_exec_bind_host(R->ex, id->x, R->x), TIDE_OK);
    assert_int_equal(tide_exec_bind_host(R->ex, id->out, R->out), TIDE_OK);
}

/* Bytes the plan moves from and to the SSD tier. */
static void plan_ssd_bytes(const tide_plan *p, uint64_t *rd, uint64_t *wr) {
    *rd = *wr = 0;
    for (int i = 0; i < p->n_ins; i++) {
        const tide_ins *in = &p->ins[i];
        uint64_t n = p->g->tensors[in->tensor < 0 ? 0 : in->tensor].nbytes;
        if ((in->kind == TIDE_INS_LOAD || in->kind == TIDE_INS_MOVE) && in->src == TIDE_TIER_SSD) *rd += n;
        if ((in->kind == TIDE_INS_STORE || in->kind == TIDE_INS_MOVE) && in->dst == TIDE_TIER_SSD) *wr += n;
    }
}

/* Whether a state is written to its SSD home and read back from it in one
 * iteration (stored mid-run, not only at the end). */
static bool stored_mid_run(const tide_plan *p) {
    for (int i = 0; i < p->n_ins; i++) {
        const tide_ins *a = &p->ins[i];
        bool home_write = (a->kind == TIDE_INS_STORE || a->kind == TIDE_INS_MOVE) && a->dst == TIDE_TIER_SSD &&
                          a->tier_off == TIDE_HOME && p->g->tensors[a->tensor].role == TIDE_ROLE_STATE;
        if (!home_write) continue;
        for (int j = i + 1; j < p->n_ins; j++) {
            const tide_ins *b = &p->ins[j];
            if (b->iter == a->iter && b->tensor == a->tensor && b->src == TIDE_TIER_SSD &&
                (b->kind == TIDE_INS_LOAD ? b->tier_off : b->kind == TIDE_INS_MOVE ? b->src_off : 0) == TIDE_HOME)
                return true;
        }
    }
    return false;
}

static void test_state_on_ssd(void **state) {
    (void)state;
    tide_ctx *ctx = ctx_new();
    tide_backend *be = NULL;
    assert_int_equal(tide_backend_new(ctx, TIDE_BACKEND_CPU, &be), TIDE_OK);
    int n_mid = 0;
    for (int mask = 0; mask < 16; mask++) {
        cfg c = {.packed = mask & 1, .addressable = mask >> 1 & 1, .n_iter = 1 + (mask >> 2 & 1),
                 .tight = !(mask >> 3 & 1), .host_budget = mask % 3 ? 8192 : 16384,
                 .eo = {.buffered_files = mask % 3 == 1, .force_pread = mask % 5 == 2}};
        char what[160];
        snprintf(what, sizeof what, "%s extents, %s, n_iter %d, %s budget, host budget %llu%s%s",
                 c.packed ? "packed" : "aligned", c.addressable ? "host addressable" : "loads and stores",
                 c.n_iter, c.tight ? "minimum" : "unconstrained", (unsigned long long)c.host_budget,
                 c.eo.buffered_files ? ", buffered" : "", c.eo.force_pread ? ", pread" : "");
        run R;
        run_make(ctx, be, &c, &R);
        n_mid += stored_mid_run(R.p);
        int runs = MAX_RUNS / c.n_iter;
        for (int r = 1; r <= runs; r++) {
            tide_exec_stats es = {0};
            tide_status st = tide_exec_run(R.ex, NULL, &es);
            if (st) fail_msg("%s, run %d: %s", what, r, tide_ctx_last_error(ctx));
            int ref = r * c.n_iter;
            check_file(R.p, &R.id, &R.L, ref, what);
            for (int k = 0; k < N_STATE; k++)
                if (R.host_s[k] && memcmp(R.host_s[k], ref_s[ref - 1][k], tide_graph_tensor_bytes(R.g, R.id.s[k])))
                    fail_msg("%s: the host-homed s%d differs after run %d", what, k, r);
            if (memcmp(R.out, ref_out[ref - 1], tide_graph_tensor_bytes(R.g, R.id.out)))
                fail_msg("%s: out differs after run %d", what, r);
            uint64_t rd, wr;
            plan_ssd_bytes(R.p, &rd, &wr);
            assert_int_equal(es.bytes_ssd_read, rd);
            assert_int_equal(es.bytes_ssd_write, wr);
            assert_true(wr > 0);
        }
        run_free(&R);
    }
    /* the minimum budgets evict dirty state to its home and read it back */
    assert_true(n_mid > 0);
    unlink(state_path);
    tide_backend_free(be);
    tide_ctx_free(ctx);
}

/* A failed write to a state's home fails the run, naming the instruction,
 * the tensor and the file, for each engine and descriptor kind. */
static void test_write_failure(void **state) {
    (void)state;
    tide_ctx *ctx = ctx_new();
    tide_backend *be = NULL;
    assert_int_equal(tide_backend_new(ctx, TIDE_BACKEND_CPU, &be), TIDE_OK);
    for (int v = 0; v < 3; v++) {
        cfg c = {.packed = v == 1, .n_iter = 1, .tight = true, .host_budget = 8192,
                 .eo = {.buffered_files = v == 2, .force_pread = v == 1}};
        run R;
        tide_ssd_test_set_faults(&(tide_ssd_faults){.fail_write_nth = 1});
        run_make(ctx, be, &c, &R);
        tide_ssd_test_set_faults(NULL);
        /* the first write on the io stream (which runs them in list order)
         * is a state's home: the failure is that one's */
        int first = -1;
        for (int i = 0; i < R.p->n_ins && first < 0; i++) {
            const tide_ins *in = &R.p->ins[i];
            if ((in->kind == TIDE_INS_STORE || in->kind == TIDE_INS_MOVE) && in->dst == TIDE_TIER_SSD) first = i;
        }
        assert_true(first >= 0);
        if (R.p->ins[first].tier_off != TIDE_HOME) fail_msg("variant %d: the first SSD write is a spill", v);
        assert_int_equal(tide_exec_run(R.ex, NULL, NULL), TIDE_E_IO);
        const char *msg = tide_ctx_last_error(ctx);
        char want[64];
        snprintf(want, sizeof want, "instruction %d (", first);
        if (!strstr(msg, want) || !strstr(msg, state_path) || !strstr(msg, "Input/output error") ||
            !strstr(msg, "SSD home"))
            fail_msg("variant %d: the message does not name the instruction, the file and the reason: %s", v, msg);
        snprintf(want, sizeof want, "'%s'", tide_graph_tensor_name(R.g, R.p->ins[first].tensor));
        if (!strstr(msg, want)) fail_msg("variant %d: the message does not name the tensor: %s", v, msg);
        run_free(&R);
    }
    unlink(state_path);
    tide_backend_free(be);
    tide_ctx_free(ctx);
}

/* Binding: a state's extent must lie in the file; only weights and state
 * live in files; a missing file is named. */
static void test_bind_errors(void **state) {
    (void)state;
    tide_ctx *ctx = ctx_new();
    tide_backend *be = NULL;
    assert_int_equal(tide_backend_new(ctx, TIDE_BACKEND_CPU, &be), TIDE_OK);
    cfg c = {.n_iter = 1, .host_budget = 8192};
    run R;
    run_make(ctx, be, &c, &R);
    int s2 = R.id.s[2];
    assert_int_equal(tide_exec_bind_file(R.ex, s2, state_path, R.L.bytes - 4096), TIDE_E_INVALID);
    assert_non_null(strstr(tide_ctx_last_error(ctx), "past its end"));
    assert_int_equal(tide_exec_bind_file(R.ex, R.id.x, state_path, 0), TIDE_E_UNSUPPORTED);
    char missing[320];
    snprintf(missing, sizeof missing, "%s/missing", dir);
    assert_int_equal(tide_exec_bind_file(R.ex, s2, missing, 0), TIDE_E_IO);
    assert_non_null(strstr(tide_ctx_last_error(ctx), missing));
    /* bound again where it belongs, the run goes on */
    assert_int_equal(tide_exec_bind_file(R.ex, s2, state_path, R.L.off_s[2]), TIDE_OK);
    assert_int_equal(tide_exec_run(R.ex, NULL, NULL), TIDE_OK);
    check_file(R.p, &R.id, &R.L, 1, "bound again");
    run_free(&R);
    unlink(state_path);
    tide_backend_free(be);
    tide_ctx_free(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ssd_write_file),
        cmocka_unit_test(test_state_on_ssd),
        cmocka_unit_test(test_write_failure),
        cmocka_unit_test(test_bind_errors),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
