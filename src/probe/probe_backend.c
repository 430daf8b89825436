/*
 * probe_backend.c - measuring a device backend into a hardware profile
 * (tide_probe_backend, declared in probe/probe.h). Everything is timed through
 * the backend vtable, the way the executor uses it: one-op graphs computed by
 * be->vt->compute, copies by to_device / to_host from host_alloc'ed (pinned)
 * memory. On a backend with events, as the executor does there, each is
 * queued PB_BATCH times back to back on an asynchronous queue of the
 * measurement's own (queue_new) and waited for once, so that per-op and
 * per-copy overheads are what a queue pays between two items, not a round
 * trip to the host; elsewhere each call waits for its work. So the figures
 * include what the executor pays per op and per transfer, and the plans
 * predicted from them are predictions of what tide's executor will do on this
 * machine (TIDE_EXEC_SYNC=1 runs pay more per op than predicted).
 *
 * Each measurement runs once untimed (cuBLAS picks and loads its kernels,
 * the driver maps the memory), then repeats while its share of the time
 * budget lasts, at least twice (at least one batch of PB_BATCH on a queue,
 * already an average of that many), and keeps the best time on a device, the
 * median on the CPU (pb_time). The CPU (device memory is host memory) is
 * measured the same way, through its kernels, with a decode step's
 * matrix-vector products besides (tide_probe_matvec).
 */
#include "backend/backend.h"
#include "probe/probe.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define PB_COPY_BYTES ((size_t)64 << 20)
#define PB_ADD_ELEMS ((int64_t)32 << 20) /* 128 MiB per f32 tensor */
#define PB_BATCH 16                      /* items queued per timing, with events */
#define PB_SAMPLES 256                   /* timings a median is taken over (the first) */
/* The matrix-vector product's weight: 64 MiB in every dtype, larger than a
 * server CPU's last-level cache, so it streams from memory as a decode
 * step's weights do; rows of 4096. */
#define PB_MATVEC_BYTES ((int64_t)64 << 20)
#define PB_MATVEC_K 4096

/* The block-quantized weight types, whose MATMUL rates are measured too. */
static const tide_dtype pb_block_types[] = {TIDE_Q8_0, TIDE_Q4_0, TIDE_Q4_K, TIDE_Q5_K, TIDE_Q6_K};
#define PB_N_BLOCK_TYPES ((int)(sizeof pb_block_types / sizeof pb_block_types[0]))

/* Queued timing (backends with events): the measurement issues on an
 * asynchronous queue of its own, errors on ctx, until pb_unqueue; elsewhere
 * on the default queue (*q NULL), synchronously. */
static tide_status pb_queue(tide_ctx *ctx, tide_backend *be, void **q) {
    *q = NULL;
    return tide_backend_has_events(be) ? be->vt->queue_new(be, ctx, true, q) : TIDE_OK;
}

/* The queue freed, nothing left queued (the caller frees what the queue may
 * still use); `st` is kept, with its message on ctx. */
static tide_status pb_unqueue(tide_ctx *ctx, tide_backend *be, void *q, tide_status st) {
    if (!q) return st;
    if (st) {
        char msg[TIDE_ERRMSG_MAX];
        snprintf(msg, sizeof msg, "%s", tide_ctx_last_error(ctx));
        if (tide_backend_queue_sync(be, q)) tide_err(ctx, st, "%s", msg); /* the first failure's message */
    }
    be->vt->queue_free(be, q);
    return st;
}

/* Waits for the queued items (queued timing); nothing to do otherwise. */
static tide_status pb_wait(tide_backend *be, void *q) { return q ? tide_backend_queue_sync(be, q) : TIDE_OK; }

/* The device buffers and the one-op graph of a measurement. */
typedef struct pb_op {
    tide_graph *g;
    int op;
    void *buf[8];   /* device data of tensors 0..n_t-1 */
    int n_t;
    void *scratch;
} pb_op;

static void pb_free(tide_backend *be, pb_op *p) {
    for (int i = 0; i < p->n_t; i++)
        if (p->buf[i]) be->vt->dealloc(be, p->buf[i]);
    if (p->scratch) be->vt->dealloc(be, p->scratch);
    tide_graph_free(p->g);
    memset(p, 0, sizeof *p);
}

/* Allocates every tensor of p->g on the device, filled with small values
 * (bytes 0x3c: 0.0117 as f32, 1.06 as f16, 0.0117 as bf16), and the op's
 * scratch. */
static tide_status pb_alloc(tide_ctx *ctx, tide_backend *be, pb_op *p) {
    int nt = tide_graph_n_tensors(p->g);
    if (nt > (int)(sizeof p->buf / sizeof p->buf[0]))
        return tide_err(ctx, TIDE_E_INVALID, "probe: a test op with %d tensors", nt);
    p->n_t = nt;
    uint64_t most = 0;
    for (int t = 0; t < p->n_t; t++) most = TIDE_MAX(most, tide_graph_tensor_bytes(p->g, t));
    void *fill = tide_malloc((size_t)TIDE_MIN(most, (uint64_t)16 << 20));
    if (!fill) return tide_err(ctx, TIDE_E_NOMEM, "probe: out of memory");
    memset(fill, 0x3c, (size_t)TIDE_MIN(most, (uint64_t)16 << 20));
    tide_status st = TIDE_OK;
    for (int t = 0; t < p->n_t && !st; t++) {
        uint64_t n = tide_graph_tensor_bytes(p->g, t);
        st = be->vt->alloc(be, n, &p->buf[t]);
        for (uint64_t off = 0; !st && off < n; off += (uint64_t)16 << 20)
            st = be->vt->to_device(be, NULL, (char *)p->buf[t] + off, fill, TIDE_MIN(n - off, (uint64_t)16 << 20));
    }
    tide_free(fill);
    const tide_op *op = &p->g->ops[p->op];
    if (!st && op->scratch_bytes) st = be->vt->alloc(be, op->scratch_bytes, &p->scratch);
    return st;
}

/* The median of n samples (n >= 1; reorders them). */
static double pb_median(double *v, int n) {
    for (int i = 1; i < n; i++) /* insertion sort: a few dozen samples */
        for (int j = i; j > 0 && v[j - 1] > v[j]; j--) {
            double x = v[j];
            v[j] = v[j - 1];
            v[j - 1] = x;
        }
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Wall time of one compute of p's op over at least two timed runs and until
 * `seconds` are spent: the best on a device, which the run has to itself;
 * the median where device memory is host memory (the CPU), whose cores the
 * run shares with whatever else the machine runs, as the measurement does:
 * the median is what a run meets, the best what it would meet alone. */
static tide_status pb_time(tide_ctx *ctx, tide_backend *be, pb_op *p, double seconds, double *best) {
    const tide_op *op = &p->g->ops[p->op];
    void *in[TIDE_OP_MAX_IN], *out[TIDE_OP_MAX_OUT];
    for (int i = 0; i < op->n_in; i++) in[i] = p->buf[op->in[i]];
    for (int i = 0; i < op->n_out; i++) out[i] = p->buf[op->out[i]];
    void *q = NULL;
    tide_status st = pb_queue(ctx, be, &q);
    int batch = q ? PB_BATCH : 1;
    if (!st) st = be->vt->compute(be, q, p->g, op, in, out, p->scratch); /* untimed */
    if (!st) st = pb_wait(be, q);
    double deadline = tide_now() + seconds;
    double samples[PB_SAMPLES];
    int n = 0;
    *best = 1e30;
    int min_reps = batch > 1 ? 1 : 2;
    for (int rep = 0; !st && (rep < min_reps || tide_now() < deadline); rep++) {
        double t0 = tide_now();
        for (int b = 0; b < batch && !st; b++) st = be->vt->compute(be, q, p->g, op, in, out, p->scratch);
        if (!st) st = pb_wait(be, q);
        double t = (tide_now() - t0) / batch;
        if (t < *best) *best = t;
        if (!st && n < PB_SAMPLES) samples[n++] = t;
    }
    if (!st && be->vt->device_is_host && n > 0) *best = pb_median(samples, n);
    return pb_unqueue(ctx, be, q, st);
}

static tide_status pb_tensor(tide_graph *g, const char *name, tide_dtype dt, tide_role role, int64_t d0, int64_t d1,
                             int *id) {
    int64_t shape[2] = {d0, d1};
    return tide_graph_add_tensor(g, name, dt, role, d1 ? 2 : 1, shape, id);
}

/* MATMUL out (R, N) = x (R, K) . w (N, K)^T with w of dtype dt: its best
 * time less the per-op overhead, *busy, and the bytes it moves (tide_op_bytes),
 * *bytes. */
static tide_status pb_matmul_time(tide_ctx *ctx, tide_backend *be, tide_dtype dt, int64_t R, int64_t K, int64_t N,
                                  double seconds, double launch_s, double *busy, double *bytes) {
    pb_op p = {.g = tide_graph_new(ctx)};
    if (!p.g) return tide_err(ctx, TIDE_E_NOMEM, "probe: out of memory");
    int x = -1, w = -1, o = -1;
    tide_status st = pb_tensor(p.g, "x", TIDE_F32, TIDE_ROLE_INPUT, R, K, &x);
    if (!st) st = pb_tensor(p.g, "w", dt, TIDE_ROLE_WEIGHT, N, K, &w);
    if (!st) st = pb_tensor(p.g, "out", TIDE_F32, TIDE_ROLE_TEMP, R, N, &o);
    if (!st) st = tide_graph_add_op(p.g, TIDE_OP_MATMUL, 2, (int[]){x, w}, 1, &o, &(tide_op_params){0}, -1, &p.op);
    if (!st) st = pb_alloc(ctx, be, &p);
    double t = 0;
    if (!st) st = pb_time(ctx, be, &p, seconds, &t);
    if (!st) *bytes = tide_op_bytes(p.g, &p.g->ops[p.op]);
    pb_free(be, &p);
    if (st) return st;
    *busy = t - launch_s > t * 0.05 ? t - launch_s : t * 0.05;
    return TIDE_OK;
}

/* The same MATMUL's achieved FLOP/s. */
static tide_status pb_matmul(tide_ctx *ctx, tide_backend *be, tide_dtype dt, int64_t R, int64_t K, int64_t N,
                             double seconds, double launch_s, double *rate) {
    double busy = 0, bytes = 0;
    tide_status st = pb_matmul_time(ctx, be, dt, R, K, N, seconds, launch_s, &busy, &bytes);
    if (st) return st;
    *rate = 2.0 * (double)R * (double)K * (double)N / busy;
    return TIDE_OK;
}

/* ADD of n f32 elements (n = 1 or a multiple of 1024): the op's best time. */
static tide_status pb_add(tide_ctx *ctx, tide_backend *be, int64_t n, double seconds, double *t) {
    pb_op p = {.g = tide_graph_new(ctx)};
    if (!p.g) return tide_err(ctx, TIDE_E_NOMEM, "probe: out of memory");
    int a = -1, b = -1, o = -1;
    int64_t cols = n >= 1024 ? 1024 : 1, rows = n / cols; /* ADD takes 2-D tensors */
    tide_status st = pb_tensor(p.g, "a", TIDE_F32, TIDE_ROLE_INPUT, rows, cols, &a);
    if (!st) st = pb_tensor(p.g, "b", TIDE_F32, TIDE_ROLE_INPUT, rows, cols, &b);
    if (!st) st = pb_tensor(p.g, "out", TIDE_F32, TIDE_ROLE_TEMP, rows, cols, &o);
    if (!st) st = tide_graph_add_op(p.g, TIDE_OP_ADD, 2, (int[]){a, b}, 1, &o, &(tide_op_params){0}, -1, &p.op);
    if (!st) st = pb_alloc(ctx, be, &p);
    if (!st) st = pb_time(ctx, be, &p, seconds, t);
    pb_free(be, &p);
    return st;
}

/* ATTENTION of a fresh prefill of T tokens, llama-7b's heads (32 x 128):
 * achieved FLOP/s, the per-op overhead subtracted. */
static tide_status pb_attention(tide_ctx *ctx, tide_backend *be, int64_t T, double seconds, double launch_s,
                                double *rate) {
    const int H = 32, hd = 128;
    pb_op p = {.g = tide_graph_new(ctx)};
    if (!p.g) return tide_err(ctx, TIDE_E_NOMEM, "probe: out of memory");
    int q = -1, k = -1, v = -1, pos = -1, o = -1, kc = -1, vc = -1;
    int64_t cshape[3] = {1, T, (int64_t)H * hd};
    tide_status st = pb_tensor(p.g, "q", TIDE_F32, TIDE_ROLE_INPUT, T, (int64_t)H * hd, &q);
    if (!st) st = pb_tensor(p.g, "k", TIDE_F32, TIDE_ROLE_INPUT, T, (int64_t)H * hd, &k);
    if (!st) st = pb_tensor(p.g, "v", TIDE_F32, TIDE_ROLE_INPUT, T, (int64_t)H * hd, &v);
    if (!st) st = pb_tensor(p.g, "pos", TIDE_I32, TIDE_ROLE_INPUT, T, 0, &pos);
    if (!st) st = pb_tensor(p.g, "o", TIDE_F32, TIDE_ROLE_TEMP, T, (int64_t)H * hd, &o);
    if (!st) st = tide_graph_add_tensor(p.g, "cache.k", TIDE_F32, TIDE_ROLE_STATE, 3, cshape, &kc);
    if (!st) st = tide_graph_add_tensor(p.g, "cache.v", TIDE_F32, TIDE_ROLE_STATE, 3, cshape, &vc);
    tide_op_params prm = {.n_heads = H, .n_kv_heads = H, .head_dim = hd, .batch = 1};
    if (!st) st = tide_graph_add_op(p.g, TIDE_OP_ATTENTION, 4, (int[]){q, k, v, pos}, 3, (int[]){o, kc, vc}, &prm, -1,
                                    &p.op);
    if (!st) st = pb_alloc(ctx, be, &p);
    int32_t *ids = st ? NULL : tide_malloc((size_t)T * sizeof *ids);
    if (!st && !ids) st = tide_err(ctx, TIDE_E_NOMEM, "probe: out of memory");
    for (int64_t i = 0; ids && i < T; i++) ids[i] = (int32_t)i; /* positions 0..T-1 */
    if (!st) st = be->vt->to_device(be, NULL, p.buf[pos], ids, (size_t)T * sizeof *ids);
    tide_free(ids);
    double t = 0;
    if (!st) st = pb_time(ctx, be, &p, seconds, &t);
    double flops = st ? 0 : p.g->ops[p.op].flops;
    pb_free(be, &p);
    if (st) return st;
    double busy = t - launch_s > t * 0.05 ? t - launch_s : t * 0.05;
    *rate = flops / busy;
    return TIDE_OK;
}

/* Best times of copies of n bytes each way between host memory and the
 * device, until `seconds` are spent. */
static tide_status pb_copies(tide_ctx *ctx, tide_backend *be, size_t n, double seconds, double *h2d, double *d2h) {
    void *host = NULL, *dev = NULL;
    bool pinned = be->vt->host_alloc && be->vt->host_alloc(be, n, &host) == TIDE_OK;
    if (!pinned) {
        tide_err_clear(ctx);
        host = tide_malloc_aligned(n, 4096);
        if (!host) return tide_err(ctx, TIDE_E_NOMEM, "probe: out of memory for the copy test");
    }
    memset(host, 0x3c, n);
    void *q = NULL;
    tide_status st = be->vt->alloc(be, n, &dev);
    if (!st) st = pb_queue(ctx, be, &q);
    int batch = q ? PB_BATCH : 1;
    if (!st) st = be->vt->to_device(be, q, dev, host, n); /* untimed */
    if (!st) st = be->vt->to_host(be, q, host, dev, n);
    if (!st) st = pb_wait(be, q);
    double deadline = tide_now() + seconds;
    *h2d = *d2h = 1e30;
    int min_reps = batch > 1 ? 1 : 2;
    for (int rep = 0; !st && (rep < min_reps || tide_now() < deadline); rep++) {
        double t0 = tide_now();
        for (int b = 0; b < batch && !st; b++) st = be->vt->to_device(be, q, dev, host, n);
        if (!st) st = pb_wait(be, q);
        double t1 = tide_now();
        for (int b = 0; b < batch && !st; b++) st = be->vt->to_host(be, q, host, dev, n);
        if (!st) st = pb_wait(be, q);
        double t2 = tide_now();
        if ((t1 - t0) / batch < *h2d) *h2d = (t1 - t0) / batch;
        if ((t2 - t1) / batch < *d2h) *d2h = (t2 - t1) / batch;
    }
    st = pb_unqueue(ctx, be, q, st);
    if (dev) be->vt->dealloc(be, dev);
    if (pinned) be->vt->host_free(be, host);
    else tide_free_aligned(host);
    return st;
}

/* tide_probe_ops, with the MATMUL rates of the block types in `blocks` (bit
 * d: dtype d) measured too. */
static tide_status probe_ops(tide_ctx *ctx, tide_backend *be, double seconds_budget, uint32_t blocks, tide_hw *h) {
    double budget = seconds_budget > 0 ? seconds_budget : 6.5;
    int n_blocks = 0;
    for (int i = 0; i < PB_N_BLOCK_TYPES; i++) n_blocks += (blocks >> pb_block_types[i]) & 1;
    /* the shapes shrink with the budget: below 1.3 s an eighth of the rows,
     * below 0.4 s (shorter than any probe the commands take) a thirty-second */
    bool big = budget >= 1.3, tiny = budget < 0.4;
    /* per-op and per-copy overheads first: the rates subtract them */
    double t_tiny = 0, t_big = 0, t_h2d = 0, t_d2h = 0, t_lat_h2d = 0, t_lat_d2h = 0;
    tide_status st = pb_add(ctx, be, 1, budget * 0.03, &t_tiny);
    int64_t n_add = big ? PB_ADD_ELEMS : PB_ADD_ELEMS / 8;
    if (!st) st = pb_add(ctx, be, n_add, budget * 0.08, &t_big);
    if (!st) st = pb_copies(ctx, be, 4, budget * 0.03, &t_lat_h2d, &t_lat_d2h);
    size_t n_copy = big ? PB_COPY_BYTES : PB_COPY_BYTES / 8;
    if (!st) st = pb_copies(ctx, be, n_copy, budget * 0.16, &t_h2d, &t_d2h);
    /* llama-7b's projection shape, fewer rows when time is short */
    int64_t R = big ? 2048 : tiny ? 64 : 256, K = 4096, N = 4096;
    double r32 = 0, r16 = 0, rbf = 0, ratt = 0, share = budget * (n_blocks ? 0.45 : 0.60) / 3;
    if (!st) st = pb_matmul(ctx, be, TIDE_F32, R, K, N, share, t_tiny, &r32);
    if (!st) st = pb_matmul(ctx, be, TIDE_F16, R, K, N, share, t_tiny, &r16);
    if (!st) st = pb_matmul(ctx, be, TIDE_BF16, R, K, N, share, t_tiny, &rbf);
    /* the block types' own kernels (the fill's bytes make valid blocks: every
     * scale 0x3c3c, 1.06 as f16), at an eighth of the rows and at least 32
     * (fewer take the decode kernel): they need not run at the 16-bit GEMM's
     * rate, which the cost model assumes without */
    double rq[PB_N_BLOCK_TYPES] = {0};
    int64_t rows_q = TIDE_MAX(R / 8, 32);
    for (int i = 0; i < PB_N_BLOCK_TYPES && !st; i++)
        if ((blocks >> pb_block_types[i]) & 1)
            st = pb_matmul(ctx, be, pb_block_types[i], rows_q, K, N, budget * 0.15 / n_blocks, t_tiny, &rq[i]);
    if (!st) st = pb_attention(ctx, be, big ? 1024 : 128, budget * 0.10, t_tiny, &ratt);
    if (st) return st;
    for (int i = 0; i < PB_N_BLOCK_TYPES; i++)
        if ((blocks >> pb_block_types[i]) & 1) h->flops[pb_block_types[i]] = rq[i];
    h->attention_efficiency = TIDE_MIN(1.0, ratt / r32);

    h->flops[TIDE_F32] = r32;
    h->flops[TIDE_F16] = r16;
    h->flops[TIDE_BF16] = rbf;
    h->flops[TIDE_I32] = r32;
    h->matmul_efficiency = 1.0;
    h->launch_s = t_tiny;
    double busy = t_big - t_tiny > t_big * 0.05 ? t_big - t_tiny : t_big * 0.05;
    h->mem_bw = 3.0 * (double)n_add * sizeof(float) / busy;
    h->link_latency_s = (t_lat_h2d + t_lat_d2h) / 2;
    double lat = h->link_latency_s < t_h2d * 0.5 ? h->link_latency_s : 0;
    h->h2d_bw = (double)n_copy / (t_h2d - lat);
    lat = h->link_latency_s < t_d2h * 0.5 ? h->link_latency_s : 0;
    h->d2h_bw = (double)n_copy / (t_d2h - lat);
    return TIDE_OK;
}

tide_status tide_probe_ops(tide_ctx *ctx, tide_backend *be, double seconds_budget, tide_hw *h) {
    return probe_ops(ctx, be, seconds_budget, 0, h);
}

/* tide_probe_matvec, with the block types in `blocks` too. */
static tide_status probe_matvec(tide_ctx *ctx, tide_backend *be, double seconds_budget, uint32_t blocks, tide_hw *h) {
    double budget = seconds_budget > 0 ? seconds_budget : 1.5;
    enum { N_MV = 3 + PB_N_BLOCK_TYPES };
    tide_dtype dts[N_MV] = {TIDE_F32, TIDE_F16, TIDE_BF16};
    int n_mv = 3;
    for (int i = 0; i < PB_N_BLOCK_TYPES; i++)
        if ((blocks >> pb_block_types[i]) & 1) dts[n_mv++] = pb_block_types[i];
    double bw[N_MV] = {0};
    for (int i = 0; i < n_mv; i++) {
        double busy = 0, bytes = 0;
        int64_t n = PB_MATVEC_BYTES / (int64_t)tide_dtype_bytes(dts[i], PB_MATVEC_K); /* 64 MiB of weight */
        tide_status st = pb_matmul_time(ctx, be, dts[i], 1, PB_MATVEC_K, n, budget / n_mv, h->launch_s, &busy, &bytes);
        if (st) return st;
        bw[i] = bytes / busy;
    }
    for (int i = 0; i < n_mv; i++) h->matvec_bw[dts[i]] = bw[i];
    return TIDE_OK;
}

tide_status tide_probe_matvec(tide_ctx *ctx, tide_backend *be, double seconds_budget, tide_hw *h) {
    return probe_matvec(ctx, be, seconds_budget, 0, h);
}

/* The CPU backend (device memory is host memory): every rate through the
 * backend's kernels as tide_probe_backend describes, the host's the same. */
static tide_status probe_host_backend(tide_ctx *ctx, tide_backend *be, const char *ssd_dir, double budget,
                                      uint32_t blocks, tide_hw *out) {
    tide_hw h;
    memset(&h, 0, sizeof h);
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    h.host_mem_bytes = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : (uint64_t)1 << 30;
    h.device_mem_bytes = h.host_mem_bytes;
    /* the drive first: it fails fast on a bad directory */
    tide_status st = tide_probe_drives(ctx, ssd_dir, budget * 0.35, &h);
    if (!st) st = probe_ops(ctx, be, budget * 0.45, blocks, &h);
    if (!st) st = probe_matvec(ctx, be, budget * 0.20, blocks, &h);
    if (st) return st;
    h.host_flops = h.flops[TIDE_F32]; /* computes placed on the host run on this same CPU */
    h.host_mem_bw = h.mem_bw;
    tide_probe_name(&h, be->vt->name);
    *out = h;
    return TIDE_OK;
}

tide_status tide_probe_backend_blocks(tide_ctx *ctx, tide_backend *be, const char *ssd_dir, double seconds_budget,
                                      const tide_hw *base, uint32_t blocks, tide_hw *out) {
    if (!out || !be) return tide_err(ctx, TIDE_E_INVALID, "probe: no backend or no profile to fill");
    double budget = seconds_budget > 0 ? seconds_budget : 10.0;
    if (be->vt->device_is_host) return probe_host_backend(ctx, be, ssd_dir, budget, blocks, out);
    tide_hw h;
    if (base) h = *base;
    else memset(&h, 0, sizeof h);
    /* the drive first: it fails fast on a bad directory */
    tide_status st = tide_probe_drives(ctx, ssd_dir, budget * 0.35, &h);
    if (!st) st = probe_ops(ctx, be, budget * 0.65, blocks, &h);
    uint64_t fr = 0, tot = 0;
    if (!st && be->vt->mem_info && !(st = be->vt->mem_info(be, &fr, &tot))) h.device_mem_bytes = tot;
    if (st) return st;
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0) h.host_mem_bytes = (uint64_t)pages * (uint64_t)page;
    if (!h.device_mem_bytes) h.device_mem_bytes = h.host_mem_bytes;

    tide_probe_name(&h, be->vt->name);
    *out = h;
    return TIDE_OK;
}

tide_status tide_probe_backend(tide_ctx *ctx, tide_backend *be, const char *ssd_dir, double seconds_budget,
                               const tide_hw *base, tide_hw *out) {
    uint32_t all = 0;
    for (int i = 0; i < PB_N_BLOCK_TYPES; i++) all |= UINT32_C(1) << pb_block_types[i];
    return tide_probe_backend_blocks(ctx, be, ssd_dir, seconds_budget, base, all, out);
}
