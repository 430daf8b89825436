/*
 * test_trace_svg.c - the device-memory picture (src/trace/trace_svg.c).
 *
 * A hand-built plan of 17 instructions on all four streams (a 3-op graph:
 * weights on host and ssd, an input, two temps, one spilled to host then ssd,
 * an output) is drawn with two hand-made timelines, "measured" and
 * "predicted", whose peaks differ (6 KiB and 4 KiB: in the measured one the
 * ssd load is prefetched early). The file is read back and checked: its shape
 * (<svg ... </svg>, balanced <g>), one panel per timeline with its label, the
 * peak in the title against the hand-computed one, and the drawn line never
 * above the budget line. Then the failures: bad arguments, a directory that
 * does not exist, every allocation failing in turn. Last, a chain plan of about
 * a million instructions, replayed by the simulator, drawn twice; its peak is
 * checked against a brute-force sweep and the file's size stays bounded.
 *
 * What it proves: profiles (and malformed ones), the cost model, simulated
 * makespans computed by hand, traces and plan JSON round trips; the backend
 * probe run through the CPU backend's vtable, and on the asynchronous test
 * backend in queued batches (counted), the matmul modes' rules.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/alloc_test.h"
#include "planner/planner.h"
#include "sim/sim.h"
#include "trace/trace.h"
#include "verify/verify.h"
#include "trace/trace.h"

#define KIB 1024u
#define W(...) (const int[]){__VA_ARGS__}, (int)(sizeof((int[]){__VA_ARGS__}) / sizeof(int))
#define NOW NULL, 0
#define PLOT_W_MAX 1200 /* no picture is wider than this */

/* ---------------------------------------------------------------- helpers */

typedef struct fx {
    tide_ctx *ctx;
    tide_graph *g;
    tide_plan *p;
    char dir[64];
} fx;

static fx *fx_new(void) {
    fx *f = calloc(1, sizeof *f);
    assert_non_null(f);
    f->ctx = tide_ctx_new();
    assert_non_null(f->ctx);
    f->g = tide_graph_new(f->ctx);
    assert_non_null(f->g);
    strcpy(f->dir, "/tmp/tide_svg_XXXXXX");
    assert_non_null(mkdtemp(f->dir));
    return f;
}

/* Removes the directory's files and the directory itself. */
static void fx_free(fx *f) {
    DIR *d = opendir(f->dir);
    if (d) {
        struct dirent *e;
        char path[512];
        while ((e = readdir(d)))
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
                snprintf(path, sizeof path, "%s/%s", f->dir, e->d_name);
                unlink(path);
            }
        closedir(d);
    }
    rmdir(f->dir);
    tide_plan_free(f->p);
    tide_graph_free(f->g);
    tide_ctx_free(f->ctx);
    free(f);
}

static int n_files(const char *dir) {
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

static int ten(fx *f, const char *name, tide_role role, int64_t elems) {
    int id;
    assert_int_equal(tide_graph_add_tensor(f->g, name, TIDE_F32, role, 1, &elems, &id), TIDE_OK);
    return id;
}

static int gop(fx *f, const int *in, int n_in, const int *out, int n_out, double flops) {
    tide_op_args pr = {.flops = flops};
    int id;
    assert_int_equal(tide_graph_add_op_args(f->g, TIDE_OP_GENERIC, n_in, in, n_out, out, &pr, -1, &id), TIDE_OK);
    return id;
}

static tide_ins ins(tide_ins_kind kind, tide_stream s) {
    tide_ins in;
    memset(&in, 0, sizeof in);
    in.kind = kind, in.stream = s, in.op = -1, in.tensor = -1;
    return in;
}

static int push(tide_plan *p, const tide_ins *in, const int *w, int n) {
    int r = tide_plan_push(p, in, w, n);
    assert_true(r >= 0);
    return r;
}

static int load(tide_plan *p, tide_stream s, int t, tide_tier src, uint64_t toff, uint64_t dev, const int *w,
                int n) {
    tide_ins in = ins(TIDE_INS_LOAD, s);
    in.tensor = t, in.src = src, in.dst = TIDE_TIER_DEVICE, in.tier_off = toff, in.dev_off[0] = dev;
    return push(p, &in, w, n);
}

static int store(tide_plan *p, int t, uint64_t dev, tide_tier dst, uint64_t toff, const int *w, int n) {
    tide_ins in = ins(TIDE_INS_STORE, TIDE_STREAM_D2H);
    in.tensor = t, in.src = TIDE_TIER_DEVICE, in.dst = dst, in.tier_off = toff, in.dev_off[0] = dev;
    return push(p, &in, w, n);
}

static int move(tide_plan *p, int t, tide_tier src, uint64_t soff, tide_tier dst, uint64_t toff, const int *w,
                int n) {
    tide_ins in = ins(TIDE_INS_MOVE, TIDE_STREAM_IO);
    in.tensor = t, in.src = src, in.dst = dst, in.src_off = soff, in.tier_off = toff;
    return push(p, &in, w, n);
}

static int drop_dev(tide_plan *p, tide_stream s, int t, uint64_t dev, const int *w, int n) {
    tide_ins in = ins(TIDE_INS_DROP, s);
    in.tensor = t, in.src = TIDE_TIER_DEVICE, in.dev_off[0] = dev;
    return push(p, &in, w, n);
}

static int drop_tier(tide_plan *p, tide_stream s, int t, tide_tier tier, uint64_t toff, const int *w, int n) {
    tide_ins in = ins(TIDE_INS_DROP, s);
    in.tensor = t, in.src = tier, in.tier_off = toff;
    return push(p, &in, w, n);
}

/* offs: the op's inputs then outputs. */
static int compute(tide_plan *p, int op, const uint64_t *offs, const int *w, int n) {
    tide_ins in = ins(TIDE_INS_COMPUTE, TIDE_STREAM_COMPUTE);
    in.op = op;
    const tide_op *o = &p->g->ops[op];
    for (int i = 0; i < o->n_in + o->n_out; i++) in.dev_off[i] = offs[i];
    return push(p, &in, w, n);
}
#define OFFS(...) (const uint64_t[]){__VA_ARGS__}

static void expect_verified(fx *f) {
    tide_status st = tide_plan_verify(f->p);
    if (st != TIDE_OK) fail_msg("verify: %s: %s", tide_status_str(st), tide_ctx_last_error(f->ctx));
}

static char *slurp(const char *path, size_t *len) {
    FILE *fp = fopen(path, "rb");
    if (!fp) fail_msg("cannot open %s", path);
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    assert_non_null(s);
    assert_int_equal(fread(s, 1, (size_t)n, fp), (size_t)n);
    s[n] = '\0';
    fclose(fp);
    if (len) *len = (size_t)n;
    return s;
}

static int count(const char *s, const char *needle) {
    int n = 0;
    for (const char *q = s; (q = strstr(q, needle)); q += strlen(needle)) n++;
    return n;
}

/* ---------------------------------------------------------------- reading the SVG */

/* Shape: opens with <svg, closes with </svg>, <g> tags nest and balance. */
static void check_shape(const char *s) {
    assert_true(strncmp(s, "<svg", 4) == 0);
    size_t n = strlen(s);
    while (n > 0 && (s[n - 1] == '\n' || s[n - 1] == ' ')) n--;
    assert_true(n >= 6 && strncmp(s + n - 6, "</svg>", 6) == 0);
    assert_int_equal(count(s, "<svg"), 1);
    int depth = 0, opened = 0;
    for (const char *q = s; *q; q++) {
        if (q[0] == '<' && q[1] == 'g' && (q[2] == ' ' || q[2] == '>')) depth++, opened++;
        if (strncmp(q, "</g>", 4) == 0) depth--;
        assert_true(depth >= 0);
    }
    assert_int_equal(depth, 0);
    assert_true(opened > 0);
    assert_int_equal(count(s, "<text"), count(s, "</text>"));
    assert_int_equal(count(s, "<title>"), count(s, "</title>"));
}

typedef struct panel_info {
    char label[128];       /* as written (escaped) */
    uint64_t peak;         /* data-peak-bytes */
    char title[512];       /* the title line's text, tags stripped */
    double budget_y;       /* NAN when no budget line */
    double plot_top, plot_bottom;
    double min_y;          /* smallest (highest on screen) y of the areas and line */
    int n_points;          /* points of the usage polyline */
    int n_rects;
} panel_info;

/* Value of attribute name="..." in the first tag at or after s, before end. */
static const char *attr(const char *s, const char *end, const char *name, char *out, size_t n) {
    char key[64];
    snprintf(key, sizeof key, " %s=\"", name);
    const char *q = strstr(s, key);
    if (!q || q >= end) return NULL;
    q += strlen(key);
    const char *e = strchr(q, '"');
    size_t len = (size_t)(e - q);
    if (len >= n) len = n - 1;
    memcpy(out, q, len);
    out[len] = '\0';
    return out;
}

/* Scans coordinate pairs "x,y" (separated by spaces or the path letters M, L,
 * Z) in [q, up to the closing quote): updates *min_y, checks x within the plot
 * columns, returns the number of pairs. */
static int scan_pairs(const char *q, double x_lo, double x_hi, double *min_y) {
    int n = 0;
    for (;;) {
        while (*q == ' ' || *q == 'M' || *q == 'L' || *q == 'Z') q++;
        if (*q == '"' || *q == '\0') break;
        char *e;
        double x = strtod(q, &e);
        assert_true(e != q && *e == ',');
        double y = strtod(e + 1, &e);
        assert_true(x >= x_lo - 0.01 && x <= x_hi + 0.01);
        if (y < *min_y) *min_y = y;
        q = e;
        n++;
    }
    return n;
}

/* Reads the panels of an SVG in order; returns how many (at most max). */
static int read_panels(const char *s, panel_info *out, int max) {
    int n = 0;
    const char *q = s;
    while ((q = strstr(q, "<g class=\"panel\"")) && n < max) {
        const char *end = strstr(q + 1, "<g class=\"panel\"");
        if (!end) end = s + strlen(s);
        panel_info *pi = &out[n++];
        memset(pi, 0, sizeof *pi);
        char v[128];
        assert_non_null(attr(q, end, "data-label", pi->label, sizeof pi->label));
        assert_non_null(attr(q, end, "data-peak-bytes", v, sizeof v));
        pi->peak = strtoull(v, NULL, 10);

        const char *t = strstr(q, "<text class=\"title\"");
        assert_true(t && t < end);
        t = strchr(t, '>') + 1;
        size_t k = 0;
        for (int in_tag = 0; strncmp(t, "</text>", 7) != 0 && k + 1 < sizeof pi->title; t++) {
            if (*t == '<') in_tag = 1;
            else if (*t == '>') in_tag = 0;
            else if (!in_tag) pi->title[k++] = *t;
        }
        pi->title[k] = '\0';

        const char *r = strstr(q, "<rect class=\"plot\"");
        assert_true(r && r < end);
        double x0 = atof(attr(r, end, "x", v, sizeof v)), w = atof(attr(r, end, "width", v, sizeof v));
        pi->plot_top = atof(attr(r, end, "y", v, sizeof v));
        pi->plot_bottom = pi->plot_top + atof(attr(r, end, "height", v, sizeof v));

        pi->budget_y = NAN;
        const char *b = strstr(q, "<line class=\"budget\"");
        if (b && b < end) pi->budget_y = atof(attr(b, end, "y1", v, sizeof v));

        pi->min_y = INFINITY;
        /* the band (max per column), the area under the min per column */
        static const char *const areas[] = {"<path class=\"band\"", "<path class=\"area-min\""};
        for (int k = 0; k < 2; k++) {
            const char *a = strstr(q, areas[k]);
            assert_true(a && a < end);
            a = strstr(a, " d=\"") + 4;
            scan_pairs(a, x0, x0 + w, &pi->min_y);
        }
        const char *u = strstr(q, "<polyline class=\"usage\"");
        assert_true(u && u < end);
        u = strstr(u, " points=\"") + 9;
        pi->n_points = scan_pairs(u, x0, x0 + w, &pi->min_y);
        for (const char *c = q; (c = strstr(c, "<rect ")) && c < end; c++) pi->n_rects++;
        q = end;
    }
    return n;
}

/* ---------------------------------------------------------------- the small plan */

typedef struct small {
    int w0, w1, x, a, b, y;
    tide_sim_event measured[17], predicted[17];
} small;

/* Tensors (KiB): w0 2 (host), w1 2 (ssd), x 1 (input), a 1, b 1 (temps), y 1
 * (output). op0 a = f(x, w0); op1 b = f(a, w1); op2 y = f(b). Arena 8 KiB:
 * x@0, w0@1K, a@3K, w1@4K, then b@0 (x's range), y@1K (w0's). a is spilled to
 * host then moved to ssd. w1's load waits on nothing: it may run early. */
static void build_small(fx *f, small *s, uint64_t budget) {
    s->w0 = ten(f, "w<0>&\"q\"", TIDE_ROLE_WEIGHT, 512);
    s->w1 = ten(f, "w1", TIDE_ROLE_WEIGHT, 512);
    s->x = ten(f, "x", TIDE_ROLE_INPUT, 256);
    s->a = ten(f, "a", TIDE_ROLE_TEMP, 256);
    s->b = ten(f, "b", TIDE_ROLE_TEMP, 256);
    s->y = ten(f, "y", TIDE_ROLE_OUTPUT, 256);
    gop(f, W(s->x, s->w0), W(s->a), 1000);
    gop(f, W(s->a, s->w1), W(s->b), 1000);
    gop(f, W(s->b), W(s->y), 1000);
    tide_plan *p = f->p = tide_plan_alloc(f->ctx, f->g, 1);
    assert_non_null(p);
    p->device_budget = budget;
    p->host_spill_bytes = p->ssd_spill_bytes = 1 * KIB;
    p->home[s->w1] = TIDE_TIER_SSD;
    const tide_tier HOST = TIDE_TIER_HOST, SSD = TIDE_TIER_SSD;
    const tide_stream C = TIDE_STREAM_COMPUTE, H2D = TIDE_STREAM_H2D;
    int i0 = load(p, H2D, s->x, HOST, TIDE_HOME, 0, NOW);                     /* 0 */
    int i1 = load(p, H2D, s->w0, HOST, TIDE_HOME, 1 * KIB, NOW);              /* 1 */
    int i2 = compute(p, 0, OFFS(0, 1 * KIB, 3 * KIB), W(i0, i1));             /* 2 */
    int i3 = load(p, TIDE_STREAM_IO, s->w1, SSD, TIDE_HOME, 4 * KIB, NOW);    /* 3 */
    drop_dev(p, C, s->x, 0, NOW);                                             /* 4 */
    drop_dev(p, C, s->w0, 1 * KIB, NOW);                                      /* 5 */
    int i6 = store(p, s->a, 3 * KIB, HOST, 0, W(i2));                         /* 6 spill a */
    compute(p, 1, OFFS(3 * KIB, 4 * KIB, 0), W(i3));                          /* 7 */
    drop_dev(p, C, s->a, 3 * KIB, W(i6));                                     /* 8 */
    drop_dev(p, C, s->w1, 4 * KIB, NOW);                                      /* 9 */
    int i10 = compute(p, 2, OFFS(0, 1 * KIB), NOW);                           /* 10 */
    store(p, s->y, 1 * KIB, HOST, TIDE_HOME, W(i10));                         /* 11 */
    drop_dev(p, C, s->b, 0, NOW);                                             /* 12 */
    drop_dev(p, TIDE_STREAM_D2H, s->y, 1 * KIB, NOW);                         /* 13 */
    move(p, s->a, HOST, 0, SSD, 0, W(i6));                                    /* 14 */
    drop_tier(p, TIDE_STREAM_IO, s->a, HOST, 0, NOW);                         /* 15 */
    drop_tier(p, TIDE_STREAM_IO, s->a, SSD, 0, NOW);                          /* 16 */
    assert_int_equal(p->n_ins, 17);

    /* Milliseconds; each instruction's (start, end). */
    static const double meas[17][2] = {
        {0.0, 1.0}, {1.0, 3.0}, {3.0, 5.0}, {0.5, 4.0}, {5.0, 5.0}, {5.0, 5.1}, {5.0, 6.0}, {5.1, 7.0}, {7.0, 7.1},
        {7.1, 7.2}, {7.2, 8.0}, {8.0, 9.0}, {8.0, 8.1}, {9.0, 9.1}, {6.0, 6.5}, {6.5, 6.5}, {6.5, 6.6},
    };
    static const double pred[17][2] = {
        {0.0, 0.5}, {0.5, 1.5}, {1.5, 2.5}, {2.6, 3.6}, {2.5, 2.5}, {2.5, 2.6}, {2.5, 3.0}, {3.6, 4.6}, {4.6, 4.6},
        {4.6, 4.7}, {4.7, 5.2}, {5.2, 5.7}, {5.2, 5.2}, {5.7, 5.7}, {3.6, 4.1}, {4.1, 4.1}, {4.1, 4.2},
    };
    /* measured: events in reverse instruction order (any order is allowed) */
    for (int i = 0; i < 17; i++) {
        s->measured[16 - i] = (tide_sim_event){i, meas[i][0] * 1e-3, meas[i][1] * 1e-3};
        s->predicted[i] = (tide_sim_event){i, pred[i][0] * 1e-3, pred[i][1] * 1e-3};
    }
}

/* Hand-computed peaks. Measured (ms: KiB in use): 0:1 0.5:3 1.0:5 3.0:6
 * 5.0:5 5.1:4 7.1:3 7.2:2 8.1:1 9.1:0, peak 6 KiB. Predicted: 0:1 0.5:3 1.5:4
 * 2.5:3 2.6:3 3.6:4 4.6:3 4.7:2 5.2:1 5.7:0, peak 4 KiB. */
#define PEAK_MEASURED (6 * KIB)
#define PEAK_PREDICTED (4 * KIB)

static void test_two_panels(void **state) {
    fx *f = fx_new();
    small s;
    build_small(f, &s, 8 * KIB);
    expect_verified(f);
    const tide_sim_event *tl[2] = {s.measured, s.predicted};
    const char *labels[2] = {"measured <cpu & co>", "predicted"};
    char path[128];
    snprintf(path, sizeof path, "%s/mem.svg", f->dir);
    tide_status st = tide_trace_svg_write(f->p, tl, labels, 2, path);
    if (st != TIDE_OK) fail_msg("%s: %s", tide_status_str(st), tide_ctx_last_error(f->ctx));
    assert_int_equal(n_files(f->dir), 1); /* no temporary left */

    char *svg = slurp(path, NULL);
    check_shape(svg);
    panel_info pi[3];
    assert_int_equal(read_panels(svg, pi, 3), 2);
    assert_string_equal(pi[0].label, "measured &lt;cpu &amp; co&gt;");
    assert_string_equal(pi[1].label, "predicted");
    assert_non_null(strstr(pi[0].title, "measured &lt;cpu &amp; co&gt;"));
    assert_null(strstr(svg, "<cpu")); /* every name printed escaped */
    assert_null(strstr(svg, "w<0>"));
    assert_non_null(strstr(svg, "load w&lt;0&gt;&amp;&quot;q&quot;"));

    assert_int_equal(pi[0].peak, PEAK_MEASURED);
    assert_int_equal(pi[1].peak, PEAK_PREDICTED);
    assert_non_null(strstr(pi[0].title, "peak 6.00 KiB (75% of budget 8.00 KiB)"));
    assert_non_null(strstr(pi[1].title, "peak 4.00 KiB (50% of budget 8.00 KiB)"));
    assert_non_null(strstr(pi[0].title, "makespan 9.100 ms"));
    assert_non_null(strstr(pi[1].title, "makespan 5.700 ms"));
    for (int k = 0; k < 2; k++) {
        /* y axis 0..budget: the budget line at the plot's top, nothing above */
        assert_true(isfinite(pi[k].budget_y));
        assert_true(fabs(pi[k].budget_y - pi[k].plot_top) < 0.05);
        assert_true(pi[k].min_y >= pi[k].budget_y - 1e-9);
        /* the highest point is the peak: 6/8 and 4/8 of the plot's height */
        double h = pi[k].plot_bottom - pi[k].plot_top;
        double want = pi[k].plot_bottom - h * (double)pi[k].peak / (8 * KIB);
        assert_true(fabs(pi[k].min_y - want) < 0.06);
        /* 4 lane backgrounds, the plot frame, and some bars */
        assert_true(pi[k].n_rects > 5);
    }
    assert_non_null(strstr(svg, "data-stream=\"io\""));
    free(svg);
    fx_free(f);
}

/* A timeline that goes over the budget (the budget set below the plan's
 * needs): drawn above the dashed line, y axis extended, title says so. */
static void test_over_budget(void **state) {
    fx *f = fx_new();
    small s;
    build_small(f, &s, 5 * KIB);
    const tide_sim_event *tl[1] = {s.measured};
    char path[128];
    snprintf(path, sizeof path, "%s/over.svg", f->dir);
    assert_int_equal(tide_trace_svg_write(f->p, tl, NULL, 1, path), TIDE_OK);
    char *svg = slurp(path, NULL);
    check_shape(svg);
    panel_info pi[2];
    assert_int_equal(read_panels(svg, pi, 2), 1);
    assert_string_equal(pi[0].label, "timeline 0");
    assert_int_equal(pi[0].peak, PEAK_MEASURED);
    assert_non_null(strstr(pi[0].title, "OVER BUDGET"));
    assert_true(pi[0].budget_y > pi[0].plot_top + 1);
    assert_true(pi[0].min_y < pi[0].budget_y - 1);
    assert_true(fabs(pi[0].min_y - pi[0].plot_top) < 0.06);
    free(svg);
    fx_free(f);
}

static void expect_status(fx *f, tide_status got, tide_status want, const char *needle) {
    if (got != want)
        fail_msg("expected %s, got %s: %s", tide_status_str(want), tide_status_str(got), tide_ctx_last_error(f->ctx));
    if (needle && !strstr(tide_ctx_last_error(f->ctx), needle))
        fail_msg("message lacks '%s': %s", needle, tide_ctx_last_error(f->ctx));
}

static void test_invalid(void **state) {
    fx *f = fx_new();
    small s;
    build_small(f, &s, 8 * KIB);
    char path[128];
    snprintf(path, sizeof path, "%s/bad.svg", f->dir);
    const tide_sim_event *tl[2] = {s.measured, NULL};
    assert_int_equal(tide_trace_svg_write(NULL, tl, NULL, 1, path), TIDE_E_INVALID);
    expect_status(f, tide_trace_svg_write(f->p, tl, NULL, 1, ""), TIDE_E_INVALID, NULL);
    expect_status(f, tide_trace_svg_write(f->p, tl, NULL, 1, NULL), TIDE_E_INVALID, NULL);
    expect_status(f, tide_trace_svg_write(f->p, tl, NULL, 0, path), TIDE_E_INVALID, "no timeline");
    expect_status(f, tide_trace_svg_write(f->p, NULL, NULL, 1, path), TIDE_E_INVALID, "no timeline");
    expect_status(f, tide_trace_svg_write(f->p, tl, NULL, 2, path), TIDE_E_INVALID, "timeline 1 is NULL");

    tide_sim_event ev[17];
    memcpy(ev, s.predicted, sizeof ev);
    const tide_sim_event *one[1] = {ev};
    ev[5].ins = 4;
    expect_status(f, tide_trace_svg_write(f->p, one, NULL, 1, path), TIDE_E_INVALID, "appears twice");
    ev[5].ins = 17;
    expect_status(f, tide_trace_svg_write(f->p, one, NULL, 1, path), TIDE_E_INVALID, "out of range");
    ev[5].ins = 5;
    ev[5].end_s = ev[5].start_s - 1e-3;
    expect_status(f, tide_trace_svg_write(f->p, one, NULL, 1, path), TIDE_E_INVALID, "start and end");
    ev[5].end_s = NAN;
    expect_status(f, tide_trace_svg_write(f->p, one, NULL, 1, path), TIDE_E_INVALID, "start and end");

    /* An empty plan: its timelines are empty. */
    tide_plan *empty = tide_plan_alloc(f->ctx, f->g, 1);
    assert_non_null(empty);
    assert_int_equal(tide_trace_svg_write(empty, one, NULL, 1, path), TIDE_E_INVALID);
    assert_non_null(strstr(tide_ctx_last_error(f->ctx), "no instructions"));
    tide_plan_free(empty);
    assert_int_equal(n_files(f->dir), 0);
    fx_free(f);
}

/* A path in a directory that does not exist: TIDE_E_IO naming the path. An
 * existing file is left as it was when writing fails. */
static void test_io_error(void **state) {
    fx *f = fx_new();
    small s;
    build_small(f, &s, 8 * KIB);
    const tide_sim_event *tl[1] = {s.predicted};
    char path[160];
    snprintf(path, sizeof path, "%s/no/such/dir/mem.svg", f->dir);
    expect_status(f, tide_trace_svg_write(f->p, tl, NULL, 1, path), TIDE_E_IO, path);
    snprintf(path, sizeof path, "/proc/tide-svg-test.svg");
    expect_status(f, tide_trace_svg_write(f->p, tl, NULL, 1, path), TIDE_E_IO, path);

    /* A directory as the target: the temporary is written, the rename fails
     * and the temporary is removed. */
    snprintf(path, sizeof path, "%s/adir", f->dir);
    assert_int_equal(mkdir(path, 0777), 0);
    expect_status(f, tide_trace_svg_write(f->p, tl, NULL, 1, path), TIDE_E_IO, path);
    assert_int_equal(n_files(f->dir), 1);
    assert_int_equal(rmdir(path), 0);
    fx_free(f);
}

/* Every allocation failing in turn: TIDE_E_NOMEM, no file, no temporary, no
 * leak; then success. */
static void test_alloc_failures(void **state) {
    fx *f = fx_new();
    small s;
    build_small(f, &s, 8 * KIB);
    const tide_sim_event *tl[2] = {s.measured, s.predicted};
    char path[128];
    snprintf(path, sizeof path, "%s/nomem.svg", f->dir);
    long before = tide_alloc_count();
    assert_int_equal(tide_trace_svg_write(f->p, tl, NULL, 2, path), TIDE_OK);
    long n_alloc = tide_alloc_count() - before;
    assert_int_equal(unlink(path), 0);
    int n_fail = 0;
    for (long nth = 1; nth <= n_alloc; nth++) {
        int64_t live = tide_alloc_live_bytes();
        tide_alloc_fail_nth(nth);
        tide_status st = tide_trace_svg_write(f->p, tl, NULL, 2, path);
        tide_alloc_fail_nth(0);
        assert_int_equal(tide_alloc_live_bytes(), live);
        if (st == TIDE_OK) { /* only the optional stdio buffer may fail unnoticed */
            assert_int_equal(unlink(path), 0);
            continue;
        }
        expect_status(f, st, TIDE_E_NOMEM, path);
        assert_int_equal(n_files(f->dir), 0);
        n_fail++;
    }
    assert_true(n_fail >= (int)n_alloc - 1);
    assert_int_equal(tide_trace_svg_write(f->p, tl, NULL, 2, path), TIDE_OK);
    assert_int_equal(n_files(f->dir), 1);
    fx_free(f);
}

/* ---------------------------------------------------------------- a large plan */

/* A chain of n ops h_i = f(h_{i-1}, w_i) over 4 KiB weights and 1 KiB
 * activations, double-buffered: weights in two slots, activations in two;
 * every 16th activation spilled to host and moved to ssd. About 4.25
 * instructions per op. Budget 10 KiB, which the plan fills. */
static void build_chain(fx *f, int n) {
    char name[32];
    int x = ten(f, "x", TIDE_ROLE_INPUT, 256);
    int *w = malloc((size_t)n * sizeof *w), *h = malloc((size_t)n * sizeof *h);
    assert_true(w && h);
    for (int i = 0; i < n; i++) {
        snprintf(name, sizeof name, "w%d", i);
        w[i] = ten(f, name, TIDE_ROLE_WEIGHT, 1024);
        snprintf(name, sizeof name, "h%d", i);
        h[i] = ten(f, name, i == n - 1 ? TIDE_ROLE_OUTPUT : TIDE_ROLE_TEMP, 256);
        gop(f, W(i ? h[i - 1] : x, w[i]), W(h[i]), 3000);
    }
    tide_plan *p = f->p = tide_plan_alloc(f->ctx, f->g, 1);
    assert_non_null(p);
    p->device_budget = 10 * KIB;
    p->host_spill_bytes = p->ssd_spill_bytes = 1 * KIB;
    const tide_tier HOST = TIDE_TIER_HOST, SSD = TIDE_TIER_SSD;
#define WSLOT(i) ((uint64_t)((i) % 2) * 4 * KIB)
#define ASLOT(i) (8 * KIB + (uint64_t)(((i) + 2) % 2) * KIB)
    int drop_w[2] = {-1, -1};   /* last DROP of each weight slot */
    int spill_free = -1;        /* DROP of the host spill copy, before reuse */
    int pending_store = -1;     /* STORE of h_{i-1}, its DROP must wait on it */
    int prev_in = load(p, TIDE_STREAM_H2D, x, HOST, TIDE_HOME, ASLOT(-1), NOW);
    for (int i = 0; i < n; i++) {
        int ld = drop_w[i % 2] >= 0 ? load(p, TIDE_STREAM_H2D, w[i], HOST, TIDE_HOME, WSLOT(i), W(drop_w[i % 2]))
                                    : load(p, TIDE_STREAM_H2D, w[i], HOST, TIDE_HOME, WSLOT(i), NOW);
        int c = compute(p, i, OFFS(ASLOT(i - 1), WSLOT(i), ASLOT(i)), W(ld, prev_in));
        prev_in = c;
        drop_w[i % 2] = drop_dev(p, TIDE_STREAM_COMPUTE, w[i], WSLOT(i), NOW);
        int in_t = i ? h[i - 1] : x;
        if (pending_store >= 0)
            drop_dev(p, TIDE_STREAM_COMPUTE, in_t, ASLOT(i - 1), W(pending_store));
        else
            drop_dev(p, TIDE_STREAM_COMPUTE, in_t, ASLOT(i - 1), NOW);
        pending_store = -1;
        if (i == n - 1) {
            int st = store(p, h[i], ASLOT(i), HOST, TIDE_HOME, W(c));
            drop_dev(p, TIDE_STREAM_D2H, h[i], ASLOT(i), W(st));
        } else if (i % 16 == 15) {
            int st = spill_free >= 0 ? store(p, h[i], ASLOT(i), HOST, 0, W(c, spill_free))
                                     : store(p, h[i], ASLOT(i), HOST, 0, W(c));
            move(p, h[i], HOST, 0, SSD, 0, W(st));
            spill_free = drop_tier(p, TIDE_STREAM_IO, h[i], HOST, 0, NOW);
            drop_tier(p, TIDE_STREAM_IO, h[i], SSD, 0, NOW);
            pending_store = st;
        }
    }
#undef WSLOT
#undef ASLOT
    free(w);
    free(h);
}

/* The bytes-in-use peak of a timeline by a plain sweep, written apart from
 * trace_svg.c: every device copy's [first write start, drop end). */
typedef struct edge {
    double t;
    int64_t b;
} edge;
static int cmp_edge(const void *a, const void *b) {
    const edge *x = a, *y = b;
    if (x->t != y->t) return x->t < y->t ? -1 : 1;
    return (x->b > 0) - (y->b > 0);
}
static uint64_t brute_peak(const tide_plan *p, const tide_sim_event *ev) {
    const tide_graph *g = p->g;
    double *start = malloc((size_t)g->n_tensors * sizeof *start);
    edge *e = malloc((size_t)p->n_ins * 2 * sizeof *e);
    double *s_of = malloc((size_t)p->n_ins * sizeof *s_of), *e_of = malloc((size_t)p->n_ins * sizeof *e_of);
    assert_true(start && e && s_of && e_of);
    for (int k = 0; k < p->n_ins; k++) s_of[ev[k].ins] = ev[k].start_s, e_of[ev[k].ins] = ev[k].end_s;
    /* in this plan every device tensor has one copy at a time */
    size_t n = 0;
    for (int i = 0; i < p->n_ins; i++) {
        const tide_ins *in = &p->ins[i];
        if (in->kind == TIDE_INS_LOAD) start[in->tensor] = s_of[i];
        if (in->kind == TIDE_INS_COMPUTE) start[g->ops[in->op].out[0]] = s_of[i];
        if (in->kind == TIDE_INS_DROP && in->src == TIDE_TIER_DEVICE) {
            int64_t b = (int64_t)g->tensors[in->tensor].nbytes;
            e[n++] = (edge){start[in->tensor], b};
            e[n++] = (edge){e_of[i], -b};
        }
    }
    qsort(e, n, sizeof *e, cmp_edge);
    int64_t cur = 0, peak = 0;
    for (size_t k = 0; k < n;) {
        double t = e[k].t;
        for (; k < n && e[k].t == t; k++) cur += e[k].b;
        if (cur > peak) peak = cur;
    }
    free(start);
    free(e);
    free(s_of);
    free(e_of);
    return (uint64_t)peak;
}

static void test_large(void **state) {
    fx *f = fx_new();
    const int n_ops = 236000;
    build_chain(f, n_ops);
    print_message("    chain plan: %d instructions\n", f->p->n_ins);
    assert_true(f->p->n_ins > 1000000);
    double t0 = (double)clock() / CLOCKS_PER_SEC;
    expect_verified(f);
    double t1 = (double)clock() / CLOCKS_PER_SEC;

    tide_hw hw;
    memset(&hw, 0, sizeof hw);
    strcpy(hw.name, "svg-test");
    hw.device_mem_bytes = UINT64_C(1) << 30;
    for (int d = 0; d < TIDE_DTYPE_COUNT; d++) hw.flops[d] = 1e9;
    hw.matmul_efficiency = 1;
    hw.mem_bw = 1e12;
    hw.h2d_bw = 1e9;
    hw.d2h_bw = 1e9;
    hw.link_latency_s = 2e-6;
    hw.launch_s = 1e-6;
    hw.host_mem_bytes = UINT64_C(1) << 34;
    hw.ssd_count = 1;
    hw.ssd_read_bw = 2e9;
    hw.ssd_write_bw = 1e9;
    hw.ssd_latency_s = 20e-6;
    tide_sim_result sim;
    assert_int_equal(tide_simulate(f->p, &hw, &sim), TIDE_OK);
    assert_int_equal(sim.n_events, f->p->n_ins);
    /* "measured": 30% slower, events shuffled (k -> k*7919 mod n is a
     * permutation: 7919 is prime and does not divide n) */
    assert_true(sim.n_events % 7919 != 0);
    tide_sim_event *meas = malloc((size_t)sim.n_events * sizeof *meas);
    assert_non_null(meas);
    for (int k = 0; k < sim.n_events; k++) {
        int j = (int)(((uint64_t)k * 7919) % (uint64_t)sim.n_events);
        meas[j] = sim.events[k];
        meas[j].start_s *= 1.3;
        meas[j].end_s *= 1.3;
    }

    const tide_sim_event *tl[2] = {meas, sim.events};
    const char *labels[2] = {"measured (simulated x1.3)", "predicted"};
    char path[128];
    snprintf(path, sizeof path, "%s/large.svg", f->dir);
    double t2 = (double)clock() / CLOCKS_PER_SEC;
    tide_status st = tide_trace_svg_write(f->p, tl, labels, 2, path);
    double t3 = (double)clock() / CLOCKS_PER_SEC;
    if (st != TIDE_OK) fail_msg("%s: %s", tide_status_str(st), tide_ctx_last_error(f->ctx));
    size_t len;
    char *svg = slurp(path, &len);
    print_message("    verify %.2f s, svg %.2f s, %zu bytes, makespan %.4f s\n", t1 - t0, t3 - t2, len,
                  sim.makespan_s);
    check_shape(svg);
    assert_true(len < 2000000);
    panel_info pi[3];
    assert_int_equal(read_panels(svg, pi, 3), 2);
    uint64_t want[2] = {brute_peak(f->p, meas), brute_peak(f->p, sim.events)};
    for (int k = 0; k < 2; k++) {
        assert_int_equal(pi[k].peak, want[k]);
        assert_true(pi[k].peak <= 10 * KIB);
        assert_true(pi[k].min_y >= pi[k].budget_y - 1e-9);
        assert_true(pi[k].n_points <= 2 * PLOT_W_MAX + 2);
        assert_true(pi[k].n_rects <= 4 * (PLOT_W_MAX + 2) + 1);
    }
    free(svg);
    free(meas);
    tide_sim_result_free(&sim);
    fx_free(f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_two_panels),
        cmocka_unit_test(test_over_budget),
        cmocka_unit_test(test_invalid),
        cmocka_unit_test(test_io_error),
        cmocka_unit_test(test_alloc_failures),
        cmocka_unit_test(test_large),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
