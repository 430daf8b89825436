/*
 * probe.c - measures the machine at hand into a hardware profile (probe.h):
 * matmul rate through OpenBLAS, memory and copy bandwidth, and the sequential
 * bandwidth and latency of the drive under a given directory.
 *
 * The wall-time budget is split: about 40% for the matmul, 15% for memory,
 * 45% for the drive. Each measurement keeps the best of its repetitions (the
 * machine's capability, not its noise) and stops early when its share is
 * spent, always after at least one full repetition.
 */
#include "probe/probe.h"
#include "store/ssd.h"

#include <cblas.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define PROBE_MAX_N 2048
#define PROBE_IO_CALL ((size_t)32 << 20) /* per engine call: a large tensor's read */
#define PROBE_IO_ALIGN 4096
#define PROBE_IO_MAX ((uint64_t)256 << 20)
#define PROBE_IO_MIN ((uint64_t)64 << 20)
#define PROBE_OVERHEAD_S 5e-6

static double at_least(double t) { return t > 1e-9 ? t : 1e-9; }

/* ---------------------------------------------------------------- matmul */

typedef struct mm_rates {
    double f32, f16, bf16;
} mm_rates;

static double time_sgemm(int n, const float *a, const float *b, float *c) {
    double t0 = tide_now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
    return at_least(tide_now() - t0);
}

static tide_status probe_matmul(tide_ctx *ctx, double budget, mm_rates *r) {
    size_t nn = (size_t)PROBE_MAX_N * PROBE_MAX_N;
    float *a = tide_malloc_aligned(nn * sizeof(float), 64);
    float *b = tide_malloc_aligned(nn * sizeof(float), 64);
    float *c = tide_malloc_aligned(nn * sizeof(float), 64);
    uint16_t *h = tide_malloc_aligned(nn * sizeof(uint16_t), 64);
    if (!a || !b || !c || !h) {
        tide_free_aligned(a);
        tide_free_aligned(b);
        tide_free_aligned(c);
        tide_free_aligned(h);
        return tide_err(ctx, TIDE_E_NOMEM, "probe: out of memory for the matmul test");
    }
    uint32_t x = 12345;
    for (size_t i = 0; i < nn; i++) {
        x = x * 1664525u + 1013904223u;
        a[i] = (float)((int)(x >> 9) % 2001 - 1000) * 1e-3f;
        b[i] = (float)((int)(x >> 13) % 2001 - 1000) * 1e-3f;
        h[i] = tide_f32_to_bf16(b[i]);
    }
    double deadline = tide_now() + budget;
    int n = 128;
    double best_t = time_sgemm(n, a, b, c); /* also warms up the BLAS threads */
    best_t = time_sgemm(n, a, b, c);
    /* grow while the next size (8x the work) fits twice in what is left */
    while (n < PROBE_MAX_N && tide_now() + 16 * best_t < deadline) {
        n *= 2;
        best_t = time_sgemm(n, a, b, c);
    }
    for (int rep = 0; rep < 3 && tide_now() + best_t < deadline; rep++) {
        double t = time_sgemm(n, a, b, c);
        if (t < best_t) best_t = t;
    }
    double work = 2.0 * n * (double)n * n;
    r->f32 = work / best_t;
    /* bf16 and f16 weights: the CPU backend converts them to f32 first */
    size_t m = (size_t)n * n;
    double t_bf = 1e30, t_f16 = 1e30;
    for (int rep = 0; rep < 2; rep++) {
        double t0 = tide_now();
        tide_convert_to_f32(h, TIDE_BF16, b, m);
        double t1 = tide_now();
        tide_convert_to_f32(h, TIDE_F16, c, m);
        double t2 = tide_now();
        if (t1 - t0 < t_bf) t_bf = t1 - t0;
        if (t2 - t1 < t_f16) t_f16 = t2 - t1;
    }
    r->bf16 = work / (best_t + t_bf);
    r->f16 = work / (best_t + t_f16);
    tide_free_aligned(a);
    tide_free_aligned(b);
    tide_free_aligned(c);
    tide_free_aligned(h);
    return TIDE_OK;
}

/* ---------------------------------------------------------------- memory */

static tide_status probe_memory(tide_ctx *ctx, double budget, uint64_t host_mem, double *mem_bw,
                                double *copy_bw) {
    size_t size = budget >= 1.0 ? (size_t)256 << 20 : (size_t)64 << 20;
    while (size > ((size_t)4 << 20) && (uint64_t)size * 8 > host_mem) size /= 2;
    char *src = tide_malloc_aligned(size, 4096);
    char *dst = tide_malloc_aligned(size, 4096);
    if (!src || !dst) {
        tide_free_aligned(src);
        tide_free_aligned(dst);
        return tide_err(ctx, TIDE_E_NOMEM, "probe: out of memory for the memory test");
    }
    memset(src, 1, size);
    memset(dst, 2, size); /* fault the pages in before timing */
    double deadline = tide_now() + budget;
    double best_copy = 1e30, best_par = 1e30;
    int threads = tide_ctx_threads(ctx);
    const size_t block = (size_t)1 << 20;
    const long n_blocks = (long)(size / block);
    for (int rep = 0; rep < 5; rep++) {
        double t0 = tide_now();
        memcpy(dst, src, size);
        double t1 = tide_now();
#pragma omp parallel for num_threads(threads) schedule(static)
        for (long k = 0; k < n_blocks; k++) memcpy(src + k * block, dst + k * block, block);
        double t2 = tide_now();
        if (t1 - t0 < best_copy) best_copy = t1 - t0;
        if (t2 - t1 < best_par) best_par = t2 - t1;
        if (rep >= 1 && tide_now() + (t2 - t0) > deadline) break;
    }
    *copy_bw = (double)size / at_least(best_copy);
    *mem_bw = 2.0 * (double)((size_t)n_blocks * block) / at_least(best_par); /* read + write */
    tide_free_aligned(src);
    tide_free_aligned(dst);
    return TIDE_OK;
}

/* ---------------------------------------------------------------- drive */

typedef struct io_rates {
    double read_bw, write_bw, latency_s;
} io_rates;

static int full_pio(int fd, char *buf, size_t n, uint64_t off, bool write_) {
    size_t done = 0;
    while (done < n) {
        ssize_t k = write_ ? pwrite(fd, buf + done, n - done, (off_t)(off + done))
                           : pread(fd, buf + done, n - done, (off_t)(off + done));
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            if (k == 0) errno = write_ ? ENOSPC : EIO;
            return -1;
        }
        done += (size_t)k;
    }
    return 0;
}

static tide_status probe_drive(tide_ctx *ctx, const char *dir, double budget, io_rates *r) {
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s/.tide-probe-XXXXXX", dir) >= (int)sizeof path)
        return tide_err(ctx, TIDE_E_INVALID, "probe: directory name '%s' is too long", dir);
    bool direct = true;
    char tmpl[PATH_MAX];
    strcpy(tmpl, path);
    int fd = mkostemp(tmpl, O_DIRECT | O_CLOEXEC);
    if (fd < 0 && errno == EINVAL) { /* the file system refuses O_DIRECT */
        direct = false;
        strcpy(tmpl, path);
        fd = mkostemp(tmpl, O_CLOEXEC);
    }
    if (fd < 0)
        return tide_err(ctx, TIDE_E_IO, "probe: cannot create a file in '%s': %s", dir, strerror(errno));
    unlink(tmpl); /* the data lives until close, the name is gone already */

    tide_status st = TIDE_OK;
    /* the bulk transfers go through the SSD store's engine, as the
     * executor's do: calls of PROBE_IO_CALL bytes, split into requests of
     * its stripe, many in flight */
    tide_ssd *ssd = NULL;
    char *buf = tide_malloc_aligned(PROBE_IO_CALL, PROBE_IO_ALIGN);
    if (!buf || tide_ssd_open(ctx, NULL, 0, 0, NULL, &ssd)) {
        tide_free_aligned(buf);
        close(fd);
        return buf ? tide_ctx_last_status(ctx) : tide_err(ctx, TIDE_E_NOMEM, "probe: out of memory for the drive test");
    }
    uint32_t x = 777;
    for (size_t i = 0; i < PROBE_IO_CALL; i++) {
        x = x * 1664525u + 1013904223u;
        buf[i] = (char)(x >> 24); /* incompressible */
    }
    double write_deadline = tide_now() + budget * 0.45;
    double t0 = tide_now();
    uint64_t written = 0;
    while (written < PROBE_IO_MAX && (written < PROBE_IO_MIN || tide_now() < write_deadline)) {
        if (tide_ssd_write_file(ssd, fd, written, buf, PROBE_IO_CALL)) goto engine_fail;
        written += PROBE_IO_CALL;
    }
    if (fdatasync(fd) != 0) goto io_fail;
    r->write_bw = (double)written / at_least(tide_now() - t0);
    if (!direct) posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);

    double read_deadline = tide_now() + budget * 0.45;
    t0 = tide_now();
    uint64_t read = 0;
    while (read < written && (read < PROBE_IO_MIN || tide_now() < read_deadline)) {
        if (tide_ssd_read_file(ssd, fd, read, buf, PROBE_IO_CALL)) goto engine_fail;
        read += PROBE_IO_CALL;
    }
    r->read_bw = (double)read / at_least(tide_now() - t0);

    /* latency: small reads spread over the file, away from what was just read */
    if (!direct) posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    uint64_t pages = written / PROBE_IO_ALIGN;
    double lat = 0;
    const int n_lat = 16;
    for (int k = 0; k < n_lat; k++) {
        x = x * 1664525u + 1013904223u;
        uint64_t off = (uint64_t)(x % pages) * PROBE_IO_ALIGN;
        double s = tide_now();
        if (full_pio(fd, buf, PROBE_IO_ALIGN, off, false)) goto io_fail;
        lat += tide_now() - s;
    }
    r->latency_s = lat / n_lat;
    goto done;
engine_fail: {
    char why[TIDE_ERRMSG_MAX];
    snprintf(why, sizeof why, "%s", tide_ctx_last_error(ctx)); /* the store's message, on ctx */
    st = tide_err(ctx, TIDE_E_IO, "probe: I/O on a temporary file in '%s' failed: %s", dir, why);
    goto done;
}
io_fail:
    st = tide_err(ctx, TIDE_E_IO, "probe: I/O on a temporary file in '%s' failed: %s", dir, strerror(errno));
done:
    tide_ssd_close(ssd);
    tide_free_aligned(buf);
    close(fd);
    return st;
}

/* Splits the comma-separated list in dirs and measures one directory per
 * distinct device (st_dev), averaging the per-drive figures; *count receives
 * the number of distinct devices. */
static tide_status probe_drives(tide_ctx *ctx, const char *dirs, double budget, io_rates *r, int *count) {
    enum { MAX_DIRS = 64 };
    char list[4096];
    if (strlen(dirs) >= sizeof list)
        return tide_err(ctx, TIDE_E_INVALID, "probe: directory list '%.64s...' is too long", dirs);
    strcpy(list, dirs);
    char *pick[MAX_DIRS];
    dev_t devs[MAX_DIRS];
    int n = 0;
    char *save = NULL;
    for (char *d = strtok_r(list, ",", &save); d; d = strtok_r(NULL, ",", &save)) {
        if (!*d) continue;
        struct stat st;
        if (stat(d, &st) != 0)
            return tide_err(ctx, TIDE_E_IO, "probe: directory '%s': %s", d, strerror(errno));
        if (!S_ISDIR(st.st_mode))
            return tide_err(ctx, TIDE_E_IO, "probe: '%s' is not a directory", d);
        bool seen = false;
        for (int k = 0; k < n; k++) seen |= devs[k] == st.st_dev;
        if (seen) continue;
        if (n == MAX_DIRS) break;
        devs[n] = st.st_dev;
        pick[n++] = d;
    }
    if (n == 0) return tide_err(ctx, TIDE_E_INVALID, "probe: no directory in '%s'", dirs);
    io_rates sum = {0};
    for (int k = 0; k < n; k++) {
        io_rates one = {0};
        tide_status st = probe_drive(ctx, pick[k], budget / n, &one);
        if (st) return st;
        sum.read_bw += one.read_bw;
        sum.write_bw += one.write_bw;
        sum.latency_s += one.latency_s;
    }
    r->read_bw = sum.read_bw / n;
    r->write_bw = sum.write_bw / n;
    r->latency_s = sum.latency_s / n;
    *count = n;
    return TIDE_OK;
}

void tide_probe_name(tide_hw *h, const char *suffix) {
    char host[256];
    if (gethostname(host, sizeof host) != 0) strcpy(host, "localhost");
    host[sizeof host - 1] = '\0';
    if (suffix) snprintf(h->name, sizeof h->name, "probed-%.40s-%.15s", host, suffix);
    else snprintf(h->name, sizeof h->name, "probed-%.56s", host);
    snprintf(h->source, sizeof h->source, "probed");
    for (char *c = h->name; *c; c++)
        if (!(*c == '-' || *c == '_' || *c == '.' || (*c >= '0' && *c <= '9') || (*c >= 'a' && *c <= 'z') ||
              (*c >= 'A' && *c <= 'Z')))
            *c = '-';
}

tide_status tide_probe_drives(tide_ctx *ctx, const char *ssd_dir, double seconds_budget, tide_hw *h) {
    const char *dir = ssd_dir;
    if (!dir || !*dir) dir = getenv("TMPDIR");
    if (!dir || !*dir) dir = "/tmp";
    io_rates io = {0};
    int n = 1;
    tide_status st = probe_drives(ctx, dir, seconds_budget > 0 ? seconds_budget : 4.5, &io, &n);
    if (st) return st;
    h->ssd_count = n;
    h->ssd_read_bw = io.read_bw;
    h->ssd_write_bw = io.write_bw;
    h->ssd_latency_s = io.latency_s;
    return TIDE_OK;
}

/* ---------------------------------------------------------------- probe */

tide_status tide_probe(tide_ctx *ctx, const char *ssd_dir, double seconds_budget, tide_hw *out) {
    if (!out) return tide_err(ctx, TIDE_E_INVALID, "probe: no profile to fill");
    double budget = seconds_budget > 0 ? seconds_budget : 10.0;
    const char *dir = ssd_dir;
    if (!dir || !*dir) dir = getenv("TMPDIR");
    if (!dir || !*dir) dir = "/tmp";

    tide_hw h;
    memset(&h, 0, sizeof h);
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    h.host_mem_bytes = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : (uint64_t)1 << 30;
    h.device_mem_bytes = h.host_mem_bytes;

    io_rates io = {0};
    int n_drives = 1;
    tide_status st = probe_drives(ctx, dir, budget * 0.45, &io, &n_drives); /* first: fails fast */
    if (st) return st;
    mm_rates mm = {0};
    st = probe_matmul(ctx, budget * 0.40, &mm);
    if (st) return st;
    double mem_bw = 0, copy_bw = 0;
    st = probe_memory(ctx, budget * 0.15, h.host_mem_bytes, &mem_bw, &copy_bw);
    if (st) return st;

    tide_probe_name(&h, NULL);
    h.flops[TIDE_F32] = mm.f32;
    h.flops[TIDE_BF16] = mm.bf16;
    h.flops[TIDE_F16] = mm.f16;
    h.flops[TIDE_I32] = mm.f32;
    h.matmul_efficiency = 1.0;
    h.mem_bw = mem_bw;
    h.host_flops = mm.f32; /* the "device" is this CPU */
    h.host_mem_bw = mem_bw;
    h.h2d_bw = h.d2h_bw = copy_bw;
    h.link_latency_s = PROBE_OVERHEAD_S;
    h.launch_s = PROBE_OVERHEAD_S;
    h.ssd_count = n_drives;
    h.ssd_read_bw = io.read_bw;
    h.ssd_write_bw = io.write_bw;
    h.ssd_latency_s = io.latency_s;
    *out = h;
    return TIDE_OK;
}
