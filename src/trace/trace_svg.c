/*
 * trace_svg.c - draws a plan's device arena over time as an SVG picture, one
 * panel per timeline (measured, predicted, ...), so that runs of one plan sit
 * side by side (docs/design.md section 2: "memory timeline picture"; invariant 5).
 * Written with fprintf; no library.
 *
 * Picture, top to bottom (all sizes in px, fixed width SVG_W):
 *   header   one line naming the plan (budget, instructions, iterations,
 *            policy) and a legend of every colour used below;
 *   panels   one per timeline, each:
 *              title  "label · makespan · peak (x% of budget)";
 *              plot   filled step area of arena bytes in use, y axis
 *                     0..max(budget, peak) with tick labels in B/KiB/MiB/GiB,
 *                     a dashed line at the budget, a dot at the peak;
 *              lanes  compute, h2d, d2h, io and host streams, each instruction a
 *                     bar (DROPs take no time and are not drawn);
 *              axis   time in seconds, 0..this timeline's makespan.
 *
 * Size: a plan may have millions of instructions; the picture has PLOT_W
 * pixel columns. Per column it keeps the maximum and the minimum of the bytes
 * in use over the column's time span: the line and a light band go up to the
 * maximum (an upper envelope, so no peak is ever hidden), the dark area up to
 * the minimum; where a column holds one level the two coincide, where a dense
 * plan swings within a pixel the band shows how far. Each is drawn as a step
 * path that emits points only where the level changes. Bars of one lane
 * closer than one pixel are merged; a merged bar's tooltip counts what it
 * holds. Every element's count is bounded by PLOT_W, so a panel takes well
 * under a MiB whatever the plan's size.
 *
 * Bytes in use (the same rule as trace.c's counter, computed independently):
 * device copy (tensor, arena offset) is in use from the start of its first
 * writer (a LOAD into it or the COMPUTE producing it) to the end of the DROP
 * that frees it, or to the end of the timeline if it is never dropped; a
 * COMPUTE's scratch is in use while it runs. Copies are paired with their DROP
 * by sorting (tensor, offset, instruction index): plan order is the logical
 * order of a copy's life, whatever the timeline's times. At one instant frees
 * are applied before allocations, so a verified plan never draws above its
 * budget.
 */
#include "trace/trace.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- layout */

enum {
    SVG_W = 1200,
    MARGIN_L = 100,                        /* y tick labels, lane names */
    MARGIN_R = 40,
    PLOT_W = SVG_W - MARGIN_L - MARGIN_R,  /* pixel columns of the area */
    HEADER_H = 62,
    TITLE_H = 30,                          /* panel title line */
    PLOT_H = 210,
    LANES_GAP = 10,                        /* plot bottom to first lane */
    LANE_H = 11,
    LANE_PITCH = 15,
    AXIS_H = 40,                           /* ticks, labels, axis title */
    PANEL_H = TITLE_H + PLOT_H + LANES_GAP + TIDE_STREAM_COUNT * LANE_PITCH + AXIS_H,
    PANEL_GAP = 16,
};

/* Lane colours, by stream; the area's and the budget's. */
static const char *const lane_fill[TIDE_STREAM_COUNT] = {"#7a7a7a", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
                                                          "#17becf"};
static const char *const lane_name[TIDE_STREAM_COUNT] = {"compute", "h2d load", "d2h store", "io (ssd)",
                                                          "host compute", "net (collectives)"};
#define AREA_FILL "#9ecae1"  /* bytes in use (the lower envelope where dense) */
#define BAND_FILL "#deebf7"  /* range of bytes in use within a pixel column */
#define AREA_LINE "#2166ac"
#define BUDGET_COLOR "#d62728"
#define FONT "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\""
#define DOT " &#183; "

/* ---------------------------------------------------------------- text */

/* Writes s as XML character data or attribute value. Characters XML 1.0
 * forbids (controls other than tab and newline) become '?'. */
static void put_xml(FILE *f, const char *s) {
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        switch (*c) {
        case '&': fputs("&amp;", f); break;
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '"': fputs("&quot;", f); break;
        case '\'': fputs("&apos;", f); break;
        default:
            if (*c < 0x20 && *c != '\t' && *c != '\n')
                fputc('?', f);
            else
                fputc(*c, f);
        }
    }
}

/* "6.00 KiB", "1.50 GiB", "512 B". */
static void fmt_bytes(char *buf, size_t n, uint64_t v) {
    static const char *const unit[] = {"KiB", "MiB", "GiB", "TiB"};
    if (v < 1024) {
        snprintf(buf, n, "%llu B", (unsigned long long)v);
        return;
    }
    double x = (double)v / 1024;
    int u = 0;
    while (x >= 1024 && u < 3) x /= 1024, u++;
    snprintf(buf, n, "%.2f %s", x, unit[u]);
}

/* "1.234 s", "12.345 ms", "56.7 us" (micro sign). */
static void fmt_secs(char *buf, size_t n, double s) {
    if (s >= 1)
        snprintf(buf, n, "%.3f s", s);
    else if (s >= 1e-3)
        snprintf(buf, n, "%.3f ms", s * 1e3);
    else
        snprintf(buf, n, "%.1f &#181;s", s * 1e6);
}

/* A tick step near range/target of the form {1,2,5} x 10^k. */
static double nice_step(double range, int target) {
    double raw = range / target;
    if (!(raw > 0)) return 1;
    double mag = pow(10, floor(log10(raw)));
    double m = raw / mag;
    return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * mag;
}

/* Decimals that print multiples of step exactly (step = {1,2,5} x 10^k). */
static int step_decimals(double step) {
    int d = (int)-floor(log10(step) + 1e-9);
    return d > 0 ? d : 0;
}

/* "load w0", "store a", "generic b" (a COMPUTE: op kind and first output). */
static void put_ins_name(FILE *f, const tide_plan *p, int i) {
    const tide_ins *in = &p->ins[i];
    const tide_graph *g = p->g;
    if (tide_ins_runs_op(in->kind)) {
        const tide_op *op = &g->ops[in->op];
        fputs(tide_op_name(op->kind), f);
        if (op->n_out > 0) {
            fputc(' ', f);
            put_xml(f, g->tensors[op->out[0]].name);
        }
        return;
    }
    fprintf(f, "%s ", tide_ins_name(in->kind));
    put_xml(f, g->tensors[in->tensor].name);
}

/* ---------------------------------------------------------------- timeline */

/* Checks timeline tl (p->n_ins events) and fills by_ins (instruction -> event
 * index) and *t_end (latest end). Returns NULL or what is wrong; *bad receives
 * the offending event's index. */
static const char *timeline_check(const tide_plan *p, const tide_sim_event *tl, int *by_ins,
                                  double *t_end, int *bad) {
    const tide_graph *g = p->g;
    for (int i = 0; i < p->n_ins; i++) by_ins[i] = -1;
    *t_end = 0;
    for (int k = 0; k < p->n_ins; k++) {
        const tide_sim_event *e = &tl[k];
        *bad = k;
        if (e->ins < 0 || e->ins >= p->n_ins) return "instruction index out of range";
        if (by_ins[e->ins] >= 0) return "instruction appears twice";
        if (!isfinite(e->start_s) || !isfinite(e->end_s) || e->start_s < 0 || e->end_s < e->start_s)
            return "start and end must be finite with 0 <= start <= end";
        const tide_ins *in = &p->ins[e->ins];
        if ((unsigned)in->kind >= TIDE_INS_COUNT || (unsigned)in->stream >= TIDE_STREAM_COUNT)
            return "the instruction is malformed";
        if (tide_ins_runs_op(in->kind) ? (in->op < 0 || in->op >= g->n_ops)
                                         : (in->tensor < 0 || in->tensor >= g->n_tensors))
            return "the instruction names no op or tensor of the graph";
        by_ins[e->ins] = k;
        if (e->end_s > *t_end) *t_end = e->end_s;
    }
    return NULL;
}

/* ---------------------------------------------------------------- bytes in use */

/* One write (open) or DROP (close) of a device copy. */
typedef struct copy_ev {
    int tensor;
    int ins;       /* plan order within one copy */
    uint64_t off;
    double t;      /* open: writer's start; close: DROP's end */
    int open;
} copy_ev;

static int cmp_copy_ev(const void *a, const void *b) {
    const copy_ev *x = a, *y = b;
    if (x->tensor != y->tensor) return x->tensor < y->tensor ? -1 : 1;
    if (x->off != y->off) return x->off < y->off ? -1 : 1;
    return (x->ins > y->ins) - (x->ins < y->ins);
}

typedef struct delta {
    double t;
    int64_t b; /* > 0 allocation, < 0 free */
} delta;

static int cmp_delta(const void *a, const void *b) {
    const delta *x = a, *y = b;
    if (x->t != y->t) return x->t < y->t ? -1 : 1;
    return (x->b >= 0) - (y->b >= 0); /* frees first */
}

/* What one panel draws. */
typedef struct bar {
    double x0, x1;    /* px, relative to the plot's left edge */
    double t0, t1;
    int n, first, last; /* instructions merged; first and last instruction */
    uint64_t bytes;   /* transferred (tensor bytes; 0 for compute) */
} bar;

typedef struct panel {
    double t_end;              /* makespan: the latest end */
    double t_axis;             /* time at the plot's right edge (t_end, or 1 if 0) */
    uint64_t peak;
    double t_peak;             /* first instant the peak is reached */
    uint64_t col[PLOT_W];      /* max bytes in use per pixel column */
    uint64_t lo[PLOT_W];       /* min bytes in use per pixel column */
    bar *bars[TIDE_STREAM_COUNT];
    int n_bars[TIDE_STREAM_COUNT];
} panel;

static int push_delta(delta **d, size_t *n, size_t *cap, double a, double b, uint64_t bytes) {
    if (bytes == 0) return 0;
    if (*n + 2 > *cap) {
        size_t c = *cap ? *cap * 2 : 1024;
        delta *nd = tide_realloc(*d, c * sizeof *nd);
        if (!nd) return -1;
        *d = nd;
        *cap = c;
    }
    if (b < a) b = a;
    (*d)[(*n)++] = (delta){a, (int64_t)bytes};
    (*d)[(*n)++] = (delta){b, -(int64_t)bytes};
    return 0;
}

static int col_of(const panel *pn, double t) {
    double c = t / pn->t_axis * PLOT_W;
    if (!(c >= 0)) return 0;
    return c >= PLOT_W ? PLOT_W - 1 : (int)c;
}

/* Fills pn->peak, t_peak, col and lo from timeline tl. Returns 0 or -1 (memory). */
static int usage_compute(const tide_plan *p, const tide_sim_event *tl, const int *by_ins, panel *pn) {
    const tide_graph *g = p->g;
    size_t n_ev = 0;
    for (int i = 0; i < p->n_ins; i++) {
        const tide_ins *in = &p->ins[i];
        if (tide_ins_runs_op(in->kind))
            n_ev += (size_t)g->ops[in->op].n_out;
        else if (in->kind == TIDE_INS_LOAD || (in->kind == TIDE_INS_DROP && in->src == TIDE_TIER_DEVICE))
            n_ev++;
    }
    for (int t = 0; t < g->n_tensors; t++) n_ev += p->warm_off && p->warm_off[t] != TIDE_HOME;
    copy_ev *ev = tide_malloc((n_ev ? n_ev : 1) * sizeof *ev);
    delta *d = NULL;
    size_t n_d = 0, cap_d = 0;
    if (!ev) return -1;
    int rc = 0;
    size_t k = 0;
    /* warm tensors hold their range from the start */
    for (int t = 0; t < g->n_tensors; t++)
        if (p->warm_off && p->warm_off[t] != TIDE_HOME) ev[k++] = (copy_ev){t, -1, p->warm_off[t], 0.0, 1};
    for (int i = 0; i < p->n_ins && rc == 0; i++) {
        const tide_ins *in = &p->ins[i];
        const tide_sim_event *e = &tl[by_ins[i]];
        if (tide_ins_runs_op(in->kind)) {
            const tide_op *op = &g->ops[in->op];
            for (int j = 0; j < op->n_out; j++) /* host operands hold no device bytes */
                if (!tide_ins_host_opnd(in, op->n_in + j))
                    ev[k++] = (copy_ev){op->out[j], i, in->dev_off[op->n_in + j], e->start_s, 1};
            if (in->place == TIDE_PLACE_DEVICE)
                rc = push_delta(&d, &n_d, &cap_d, e->start_s, e->end_s, op->scratch_bytes);
        } else if (in->kind == TIDE_INS_LOAD) {
            ev[k++] = (copy_ev){in->tensor, i, in->dev_off[0], e->start_s, 1};
        } else if (in->kind == TIDE_INS_DROP && in->src == TIDE_TIER_DEVICE) {
            ev[k++] = (copy_ev){in->tensor, i, in->dev_off[0], e->end_s, 0};
        }
    }
    n_ev = k;
    if (rc == 0) qsort(ev, n_ev, sizeof *ev, cmp_copy_ev);
    /* Pair each copy's first write with its DROP; a write into an open copy
     * (an in-place update) changes nothing. */
    for (size_t a = 0; a < n_ev && rc == 0;) {
        size_t b = a;
        while (b < n_ev && ev[b].tensor == ev[a].tensor && ev[b].off == ev[a].off) b++;
        uint64_t bytes = g->tensors[ev[a].tensor].nbytes;
        int open = 0;
        double start = 0;
        for (size_t c = a; c < b && rc == 0; c++) {
            if (ev[c].open && !open) {
                open = 1;
                start = ev[c].t;
            } else if (!ev[c].open && open) {
                open = 0;
                rc = push_delta(&d, &n_d, &cap_d, start, ev[c].t, bytes);
            }
        }
        if (open && rc == 0) rc = push_delta(&d, &n_d, &cap_d, start, pn->t_end, bytes);
        a = b;
    }
    tide_free(ev);
    if (rc) {
        tide_free(d);
        return -1;
    }
    if (n_d) qsort(d, n_d, sizeof *d, cmp_delta);

    /* Sweep: col[c] (lo[c]) = max (min) over column c's span of the bytes in
     * use, i.e. over the level carried into c and every level reached in it. */
    memset(pn->col, 0, sizeof pn->col);
    for (int x = 0; x < PLOT_W; x++) pn->lo[x] = UINT64_MAX;
    pn->peak = 0;
    pn->t_peak = 0;
    int64_t level = 0;
    uint64_t held = 0; /* bytes in use since the last instant swept */
    int cur = -1;      /* column of the last instant swept */
    for (size_t a = 0; a < n_d;) {
        double t = d[a].t;
        for (; a < n_d && d[a].t == t; a++) level += d[a].b;
        uint64_t v = level > 0 ? (uint64_t)level : 0;
        int c = col_of(pn, t);
        /* held lasts through columns cur+1..c-1 and into c unless t is c's start */
        int last = t > c * pn->t_axis / PLOT_W ? c : c - 1;
        for (int x = cur + 1; x <= last; x++) {
            if (held > pn->col[x]) pn->col[x] = held;
            if (held < pn->lo[x]) pn->lo[x] = held;
        }
        if (v > pn->col[c]) pn->col[c] = v;
        if (v < pn->lo[c]) pn->lo[c] = v;
        if (v > pn->peak) {
            pn->peak = v;
            pn->t_peak = t;
        }
        held = v;
        cur = c;
    }
    for (int x = cur + 1; x < PLOT_W; x++) {
        if (held > pn->col[x]) pn->col[x] = held;
        if (held < pn->lo[x]) pn->lo[x] = held;
    }
    tide_free(d);
    return 0;
}

/* ---------------------------------------------------------------- lanes */

typedef struct item {
    double s, e;
    int ins;
} item;

static int cmp_item(const void *a, const void *b) {
    const item *x = a, *y = b;
    if (x->s != y->s) return x->s < y->s ? -1 : 1;
    return (x->ins > y->ins) - (x->ins < y->ins);
}

/* Fills pn->bars: per stream, its instructions (DROPs left out) sorted by
 * start, runs closer than a pixel merged. Returns 0 or -1 (memory). */
static int lanes_compute(const tide_plan *p, const tide_sim_event *tl, const int *by_ins, panel *pn) {
    const tide_graph *g = p->g;
    size_t at[TIDE_STREAM_COUNT + 1] = {0};
    for (int i = 0; i < p->n_ins; i++)
        if (p->ins[i].kind != TIDE_INS_DROP) at[p->ins[i].stream + 1]++;
    for (int s = 0; s < TIDE_STREAM_COUNT; s++) at[s + 1] += at[s];
    size_t n_items = at[TIDE_STREAM_COUNT];
    item *it = tide_malloc((n_items ? n_items : 1) * sizeof *it);
    if (!it) return -1;
    size_t fill[TIDE_STREAM_COUNT];
    memcpy(fill, at, sizeof fill);
    for (int i = 0; i < p->n_ins; i++) {
        const tide_ins *in = &p->ins[i];
        if (in->kind == TIDE_INS_DROP) continue;
        const tide_sim_event *e = &tl[by_ins[i]];
        it[fill[in->stream]++] = (item){e->start_s, e->end_s, i};
    }
    const double px = PLOT_W / pn->t_axis;
    int rc = 0;
    for (int s = 0; s < TIDE_STREAM_COUNT && rc == 0; s++) {
        item *a = it + at[s];
        size_t n = at[s + 1] - at[s];
        bool sorted = true;
        for (size_t k = 1; k < n && sorted; k++) sorted = cmp_item(&a[k - 1], &a[k]) <= 0;
        if (!sorted) qsort(a, n, sizeof *a, cmp_item);
        bar *bars = NULL;
        int nb = 0, cap = 0;
        for (size_t k = 0; k < n; k++) {
            double x0 = a[k].s * px, x1 = a[k].e * px;
            const tide_ins *in = &p->ins[a[k].ins];
            uint64_t bytes = tide_ins_runs_op(in->kind) ? 0 : g->tensors[in->tensor].nbytes;
            if (nb > 0 && x0 - bars[nb - 1].x1 < 1.0) {
                bar *b = &bars[nb - 1];
                if (x1 > b->x1) b->x1 = x1;
                if (a[k].e > b->t1) b->t1 = a[k].e;
                b->n++;
                b->last = a[k].ins;
                b->bytes += bytes;
                continue;
            }
            if (tide_grow((void **)&bars, &cap, nb + 1, sizeof *bars)) {
                rc = -1;
                break;
            }
            bars[nb++] = (bar){x0, x1, a[k].s, a[k].e, 1, a[k].ins, a[k].ins, bytes};
        }
        pn->bars[s] = bars;
        pn->n_bars[s] = nb;
    }
    tide_free(it);
    return rc;
}

static void panel_clear(panel *pn) {
    for (int s = 0; s < TIDE_STREAM_COUNT; s++) {
        tide_free(pn->bars[s]);
        pn->bars[s] = NULL;
        pn->n_bars[s] = 0;
    }
}

/* ---------------------------------------------------------------- drawing */

/* Rough width in px of s at font size 12 (for laying out the legend). */
static double text_w(const char *s) { return 6.8 * (double)strlen(s); }

static void write_header(FILE *f, const tide_plan *p, int height) {
    char bud[32];
    fmt_bytes(bud, sizeof bud, p->device_budget);
    fprintf(f,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
            FONT " font-size=\"12\">\n"
            "<rect class=\"background\" width=\"%d\" height=\"%d\" fill=\"#ffffff\"/>\n",
            SVG_W, height, SVG_W, height, SVG_W, height);
    fprintf(f, "<text x=\"%d\" y=\"24\" font-size=\"15\" fill=\"#555\"><tspan font-weight=\"bold\" fill=\"#000\">"
               "device memory over time</tspan>" DOT "budget %s" DOT "%d instructions" DOT "%d iteration%s" DOT "policy ",
            MARGIN_L, bud, p->n_ins, p->n_iter, p->n_iter == 1 ? "" : "s");
    put_xml(f, tide_policy_name(p->policy));
    fputs("</text>\n", f);

    /* Legend: swatch then name, left to right. */
    fprintf(f, "<g class=\"legend\" transform=\"translate(%d,46)\">\n", MARGIN_L);
    double x = 0;
    fprintf(f, "<rect x=\"0\" y=\"-9\" width=\"18\" height=\"10\" fill=\"" AREA_FILL "\"/>"
               "<path d=\"M0,-9h18\" stroke=\"" AREA_LINE "\" stroke-width=\"1.2\"/>"
               "<text x=\"24\" y=\"0\">device bytes in use</text>\n");
    x += 24 + text_w("device bytes in use") + 20;
    fprintf(f, "<rect x=\"%.1f\" y=\"-9\" width=\"18\" height=\"10\" fill=\"" BAND_FILL "\"/>"
               "<text x=\"%.1f\" y=\"0\">range within a pixel</text>\n", x, x + 24);
    x += 24 + text_w("range within a pixel") + 20;
    fprintf(f, "<line x1=\"%.1f\" y1=\"-4\" x2=\"%.1f\" y2=\"-4\" stroke=\"" BUDGET_COLOR
               "\" stroke-width=\"1.5\" stroke-dasharray=\"5,3\"/><text x=\"%.1f\" y=\"0\">budget</text>\n",
            x, x + 18, x + 24);
    x += 24 + text_w("budget") + 20;
    fprintf(f, "<circle cx=\"%.1f\" cy=\"-4\" r=\"3.5\" fill=\"" AREA_LINE "\" stroke=\"#fff\"/>"
               "<text x=\"%.1f\" y=\"0\">peak</text>\n", x + 9, x + 24);
    x += 24 + text_w("peak") + 20;
    for (int s = 0; s < TIDE_STREAM_COUNT; s++) {
        fprintf(f, "<rect x=\"%.1f\" y=\"-9\" width=\"18\" height=\"10\" fill=\"%s\"/>"
                   "<text x=\"%.1f\" y=\"0\">%s</text>\n", x, lane_fill[s], x + 24, lane_name[s]);
        x += 24 + text_w(lane_name[s]) + 20;
    }
    fputs("</g>\n", f);
}

/* Tooltip of a bar: what it holds, bytes moved, when. */
static void put_bar_title(FILE *f, const tide_plan *p, const bar *b) {
    char t0[32], t1[32], by[32];
    fputs("<title>", f);
    if (b->n == 1) {
        put_ins_name(f, p, b->first);
    } else {
        fprintf(f, "%d instructions: ", b->n);
        put_ins_name(f, p, b->first);
        fputs(" &#8230; ", f);
        put_ins_name(f, p, b->last);
    }
    if (b->bytes) {
        fmt_bytes(by, sizeof by, b->bytes);
        fprintf(f, DOT "%s", by);
    }
    fmt_secs(t0, sizeof t0, b->t0);
    fmt_secs(t1, sizeof t1, b->t1);
    fprintf(f, DOT "%s to %s</title>", t0, t1);
}

/* A filled step area under level[0..PLOT_W) with baseline y = bottom. */
static void put_step_area(FILE *f, const char *cls, const char *fill, const uint64_t *level, int bottom,
                          double ymax) {
#define YL(v) (bottom - (double)PLOT_H * (double)(v) / ymax)
    fprintf(f, "<path class=\"%s\" fill=\"%s\" stroke=\"none\" d=\"M%d,%dL%d,%.1f", cls, fill, MARGIN_L, bottom,
            MARGIN_L, YL(level[0]));
    for (int x = 1; x < PLOT_W; x++)
        if (level[x] != level[x - 1])
            fprintf(f, "L%d,%.1fL%d,%.1f", MARGIN_L + x, YL(level[x - 1]), MARGIN_L + x, YL(level[x]));
    fprintf(f, "L%d,%.1fL%d,%dZ\"/>\n", MARGIN_L + PLOT_W, YL(level[PLOT_W - 1]), MARGIN_L + PLOT_W, bottom);
#undef YL
}

static void write_panel(FILE *f, const tide_plan *p, const panel *pn, const char *label, int y0) {
    const uint64_t budget = p->device_budget;
    const double ymax = (double)(TIDE_MAX(budget, pn->peak) > 0 ? TIDE_MAX(budget, pn->peak) : 1);
    const int top = TITLE_H, bottom = TITLE_H + PLOT_H;
#define YPX(v) (bottom - (double)PLOT_H * (double)(v) / ymax)
#define XPX(t) (MARGIN_L + (double)PLOT_W * (t) / pn->t_axis)
    char a[48], b[48], c[48];

    fprintf(f, "<g class=\"panel\" data-label=\"");
    put_xml(f, label);
    fprintf(f, "\" data-peak-bytes=\"%llu\" data-makespan-s=\"%.9g\" transform=\"translate(0,%d)\">\n",
            (unsigned long long)pn->peak, pn->t_end, y0);

    /* Title line. */
    fmt_secs(a, sizeof a, pn->t_end);
    fmt_bytes(b, sizeof b, pn->peak);
    fprintf(f, "<text class=\"title\" x=\"%d\" y=\"20\" font-size=\"14\"><tspan font-weight=\"bold\">", MARGIN_L);
    put_xml(f, label);
    fprintf(f, "</tspan>" DOT "makespan %s" DOT "peak %s", a, b);
    if (budget > 0) {
        fmt_bytes(c, sizeof c, budget);
        fprintf(f, " (%.0f%% of budget %s%s)", 100.0 * (double)pn->peak / (double)budget, c,
                pn->peak > budget ? ": OVER BUDGET" : "");
    }
    fputs("</text>\n", f);

    /* Plot frame, y grid and tick labels in the unit of the axis' top. */
    fprintf(f, "<rect class=\"plot\" x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"#fbfbfb\" stroke=\"#bbb\"/>\n",
            MARGIN_L, top, PLOT_W, PLOT_H);
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    double unit = 1;
    while (u < 4 && ymax >= unit * 1024) unit *= 1024, u++;
    double ystep = nice_step(ymax / unit, 5);
    int ydec = step_decimals(ystep);
    fputs("<g class=\"yaxis\" font-size=\"11\" text-anchor=\"end\" fill=\"#333\">\n", f);
    for (int j = 0;; j++) {
        double v = j * ystep * unit;
        if (v > ymax * (1 + 1e-9)) break;
        double y = YPX(v);
        if (j > 0)
            fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#e4e4e4\"/>\n", MARGIN_L, y,
                    MARGIN_L + PLOT_W, y);
        if (j == 0)
            fprintf(f, "<text x=\"%d\" y=\"%.1f\">0</text>\n", MARGIN_L - 6, y + 4);
        else
            fprintf(f, "<text x=\"%d\" y=\"%.1f\">%.*f %s</text>\n", MARGIN_L - 6, y + 4, ydec, j * ystep, units[u]);
    }
    fprintf(f, "<text x=\"18\" y=\"%d\" text-anchor=\"middle\" transform=\"rotate(-90 18 %d)\" font-size=\"12\">"
               "device bytes</text>\n</g>\n", top + PLOT_H / 2, top + PLOT_H / 2);

    /* Time grid through the plot (labels come with the axis below the lanes). */
    double tstep = nice_step(pn->t_axis, 8);
    int tdec = step_decimals(tstep);
    fputs("<g class=\"tgrid\" stroke=\"#ececec\">\n", f);
    for (int j = 1;; j++) {
        double t = j * tstep;
        if (t > pn->t_axis * (1 + 1e-9)) break;
        fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\"/>\n", XPX(t), top + 1, XPX(t), bottom - 1);
    }
    fputs("</g>\n", f);

    /* Areas: per column its maximum (the band, light) and its minimum (dark);
     * points only where a level changes. Where a column holds one level the
     * two coincide. */
    put_step_area(f, "band", BAND_FILL, pn->col, bottom, ymax);
    put_step_area(f, "area-min", AREA_FILL, pn->lo, bottom, ymax);
    fprintf(f, "<polyline class=\"usage\" fill=\"none\" stroke=\"" AREA_LINE "\" stroke-width=\"1.2\" "
               "stroke-linejoin=\"round\" points=\"%d,%.1f", MARGIN_L, YPX(pn->col[0]));
    for (int x = 1; x < PLOT_W; x++)
        if (pn->col[x] != pn->col[x - 1])
            fprintf(f, " %d,%.1f %d,%.1f", MARGIN_L + x, YPX(pn->col[x - 1]), MARGIN_L + x, YPX(pn->col[x]));
    fprintf(f, " %d,%.1f\"/>\n", MARGIN_L + PLOT_W, YPX(pn->col[PLOT_W - 1]));

    /* Budget line and its label just under it, at the right. */
    if (budget > 0) {
        double yb = YPX(budget);
        fmt_bytes(c, sizeof c, budget);
        fprintf(f, "<line class=\"budget\" x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"" BUDGET_COLOR
                   "\" stroke-width=\"1.5\" stroke-dasharray=\"6,4\"/>\n", MARGIN_L, yb, MARGIN_L + PLOT_W, yb);
        fprintf(f, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\" font-size=\"11\" fill=\"" BUDGET_COLOR
                   "\" stroke=\"#fff\" stroke-width=\"3\" paint-order=\"stroke\">budget %s</text>\n",
                MARGIN_L + PLOT_W - 6, yb + 13, c);
    }

    /* Peak marker. */
    fmt_bytes(b, sizeof b, pn->peak);
    fmt_secs(a, sizeof a, pn->t_peak);
    fprintf(f, "<circle class=\"peak\" cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"" AREA_LINE "\" stroke=\"#fff\">"
               "<title>peak %s at %s</title></circle>\n", XPX(pn->t_peak), YPX(pn->peak), b, a);

    /* Lanes. */
    const int lane_top = bottom + LANES_GAP;
    for (int s = 0; s < TIDE_STREAM_COUNT; s++) {
        int y = lane_top + s * LANE_PITCH;
        fprintf(f, "<g class=\"lane\" data-stream=\"%s\" fill=\"%s\">\n"
                   "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"#f2f2f2\"/>\n"
                   "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\" font-size=\"10.5\" fill=\"#333\">%s</text>\n",
                tide_stream_name((tide_stream)s), lane_fill[s], MARGIN_L, y, PLOT_W, LANE_H, MARGIN_L - 6,
                y + LANE_H - 1.5, tide_stream_name((tide_stream)s));
        for (int k = 0; k < pn->n_bars[s]; k++) {
            const bar *br = &pn->bars[s][k];
            double w = br->x1 - br->x0;
            if (w < 0.8) w = 0.8;
            fprintf(f, "<rect x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"%d\">", MARGIN_L + br->x0, y, w, LANE_H);
            put_bar_title(f, p, br);
            fputs("</rect>\n", f);
        }
        fputs("</g>\n", f);
    }

    /* Time axis. */
    const int ya = lane_top + TIDE_STREAM_COUNT * LANE_PITCH + 2;
    fprintf(f, "<g class=\"xaxis\" font-size=\"11\" text-anchor=\"middle\" fill=\"#333\">\n"
               "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#666\"/>\n",
            MARGIN_L, ya, MARGIN_L + PLOT_W, ya);
    for (int j = 0;; j++) {
        double t = j * tstep;
        if (t > pn->t_axis * (1 + 1e-9)) break;
        fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#666\"/>"
                   "<text x=\"%.1f\" y=\"%d\">%.*f</text>\n", XPX(t), ya, XPX(t), ya + 4, XPX(t), ya + 16, tdec, t);
    }
    fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"12\">time (s)</text>\n</g>\n</g>\n",
            MARGIN_L + PLOT_W / 2, ya + 32);
#undef YPX
#undef XPX
}

/* ---------------------------------------------------------------- entry */

tide_status tide_trace_svg_write(const tide_plan *p, const tide_sim_event *const *timelines,
                                 const char *const *labels, int n_timelines, const char *path) {
    tide_ctx *ctx = p ? p->ctx : NULL;
    if (!p || !p->g || !path || !*path) return tide_err(ctx, TIDE_E_INVALID, "trace svg: no plan or path");
    if (n_timelines < 1 || !timelines)
        return tide_err(ctx, TIDE_E_INVALID, "trace svg '%s': no timeline to draw", path);
    if (p->n_ins < 1)
        return tide_err(ctx, TIDE_E_INVALID, "trace svg '%s': the plan has no instructions, so its timelines are empty",
                        path);
    for (int k = 0; k < n_timelines; k++)
        if (!timelines[k]) return tide_err(ctx, TIDE_E_INVALID, "trace svg '%s': timeline %d is NULL", path, k);

    int *by_ins = tide_malloc((size_t)p->n_ins * sizeof *by_ins);
    panel *pn = tide_calloc(1, sizeof *pn);
    if (!by_ins || !pn) {
        tide_free(by_ins);
        tide_free(pn);
        return tide_err(ctx, TIDE_E_NOMEM, "out of memory drawing '%s'", path);
    }
    /* Every timeline is checked before the file is created. */
    for (int k = 0; k < n_timelines; k++) {
        int bad = 0;
        const char *why = timeline_check(p, timelines[k], by_ins, &pn->t_end, &bad);
        if (why) {
            tide_free(by_ins);
            tide_free(pn);
            return tide_err(ctx, TIDE_E_INVALID, "trace svg '%s': timeline %d, event %d (instruction %d): %s", path, k,
                            bad, timelines[k][bad].ins, why);
        }
    }

    tide_atomic_file af;
    tide_status st = tide_file_begin(ctx, "SVG", path, &af);
    if (st) goto out;
    FILE *f = af.fp;

    write_header(f, p, HEADER_H + n_timelines * PANEL_H + (n_timelines - 1) * PANEL_GAP + 8);
    for (int k = 0; k < n_timelines && st == TIDE_OK; k++) {
        int bad;
        const tide_sim_event *tl = timelines[k];
        timeline_check(p, tl, by_ins, &pn->t_end, &bad); /* passed above; refills by_ins */
        pn->t_axis = pn->t_end > 0 ? pn->t_end : 1;
        char def[32];
        const char *label = labels && labels[k] ? labels[k] : (snprintf(def, sizeof def, "timeline %d", k), def);
        if (usage_compute(p, tl, by_ins, pn) || lanes_compute(p, tl, by_ins, pn))
            st = tide_err(ctx, TIDE_E_NOMEM, "out of memory drawing '%s'", path);
        else
            write_panel(f, p, pn, label, HEADER_H + k * (PANEL_H + PANEL_GAP));
        panel_clear(pn);
    }
    fputs("</svg>\n", f);

    if (st == TIDE_OK) st = tide_file_commit(&af);
    else tide_file_abort(&af);
out:
    tide_free(by_ins);
    tide_free(pn);
    return st;
}
