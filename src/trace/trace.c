/*
 * trace.c - writes a plan's timeline as Chrome / Perfetto trace-event JSON
 * (open it in ui.perfetto.dev or chrome://tracing). The timeline may come
 * from the simulator or be measured by the executor: this file only needs each
 * instruction's start and end, so predicted and measured runs look alike
 * (docs/design.md invariant 5).
 *
 * Layout of the file:
 *   {"displayTimeUnit":"ms","traceEvents":[
 *     metadata: process "tide" (pid 1), one thread per stream (tid = stream + 1)
 *               named compute / h2d / d2h / io / host, in that order;
 *     one "X" (complete) event per instruction of the timeline, on its
 *               stream's thread: ts and dur in microseconds, name
 *               "matmul model.layers.3.mlp.up_proj", "load <tensor>",
 *               "store <tensor>", "move <tensor>", "drop <tensor>"; args give
 *               the instruction index, iteration, tensor, bytes, device offset
 *               and tiers;
 *     "C" (counter) events "device bytes" with one series "used": arena
 *               bytes in use over time (Perfetto names the track
 *               "device bytes used").
 *   ]}
 *
 * Device bytes in use: a device copy (tensor, arena offset) is in use from the
 * start of its first writer (the LOAD or COMPUTE that fills it) to the end of
 * the DROP that frees it; a COMPUTE's scratch is in use while it runs. Copies
 * never dropped in the timeline count until its last end. At one instant,
 * frees are applied before allocations, so a valid plan's counter never
 * exceeds its budget.
 *
 * The file is streamed with fprintf (traces reach millions of events) into a
 * temporary file that is renamed over `path` only when complete
 * (tide_file_begin).
 */
#include "trace/trace.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Writes s as the body of a JSON string (no quotes). */
static void put_escaped(FILE *f, const char *s) {
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\') {
            fputc('\\', f);
            fputc(*c, f);
        } else if (*c < 0x20) {
            fprintf(f, "\\u%04x", *c);
        } else {
            fputc(*c, f);
        }
    }
}

/* The label of a COMPUTE: the weight for a matmul ("model.layers.3.mlp.up_proj"
 * from "....up_proj.weight"), otherwise the first output. */
static void put_op_label(FILE *f, const tide_graph *g, const tide_op *op) {
    const char *nm;
    size_t len;
    if (op->kind == TIDE_OP_MATMUL) {
        nm = g->tensors[op->in[1]].name;
        len = strlen(nm);
        if (len > 7 && strcmp(nm + len - 7, ".weight") == 0) len -= 7;
    } else if (op->n_out > 0) {
        nm = g->tensors[op->out[0]].name;
        len = strlen(nm);
    } else {
        return;
    }
    char buf[256];
    if (len >= sizeof buf) len = sizeof buf - 1;
    memcpy(buf, nm, len);
    buf[len] = '\0';
    fputc(' ', f);
    put_escaped(f, buf);
}

static void put_off(FILE *f, uint64_t v) {
    if (v == TIDE_HOME)
        fputs("\"home\"", f);
    else
        fprintf(f, "%llu", (unsigned long long)v);
}

/* ---------------------------------------------------------------- device counter */

typedef struct delta {
    double t;
    int64_t bytes; /* + allocation, - free */
} delta;

static int cmp_delta(const void *a, const void *b) {
    const delta *x = a, *y = b;
    if (x->t != y->t) return x->t < y->t ? -1 : 1;
    if ((x->bytes < 0) != (y->bytes < 0)) return x->bytes < 0 ? -1 : 1; /* frees first */
    return 0;
}

/* Open device copies, per tensor a short list (normally of one). */
typedef struct copies {
    int *head;      /* per tensor: first open copy or -1 */
    int *next;
    uint64_t *off;
    double *start;
    int n, cap;
    int free_list;
} copies;

static int copies_find(const copies *c, int t, uint64_t off) {
    for (int k = c->head[t]; k >= 0; k = c->next[k])
        if (c->off[k] == off) return k;
    return -1;
}

/* Records a write of (t, off) starting at time s. Returns 0 or -1 (memory). */
static int copies_write(copies *c, int t, uint64_t off, double s) {
    int k = copies_find(c, t, off);
    if (k >= 0) {
        if (s < c->start[k]) c->start[k] = s;
        return 0;
    }
    if (c->free_list >= 0) {
        k = c->free_list;
        c->free_list = c->next[k];
    } else {
        if (c->n == c->cap) {
            int cap = c->cap ? c->cap * 2 : 256;
            int *nx = tide_realloc(c->next, (size_t)cap * sizeof *nx);
            if (!nx) return -1;
            c->next = nx;
            uint64_t *of = tide_realloc(c->off, (size_t)cap * sizeof *of);
            if (!of) return -1;
            c->off = of;
            double *st = tide_realloc(c->start, (size_t)cap * sizeof *st);
            if (!st) return -1;
            c->start = st;
            c->cap = cap;
        }
        k = c->n++;
    }
    c->off[k] = off;
    c->start[k] = s;
    c->next[k] = c->head[t];
    c->head[t] = k;
    return 0;
}

/* Closes (t, off) if open; *start receives its start. Returns 1 if closed. */
static int copies_drop(copies *c, int t, uint64_t off, double *start) {
    int prev = -1;
    for (int k = c->head[t]; k >= 0; prev = k, k = c->next[k]) {
        if (c->off[k] != off) continue;
        *start = c->start[k];
        if (prev < 0)
            c->head[t] = c->next[k];
        else
            c->next[prev] = c->next[k];
        c->next[k] = c->free_list;
        c->free_list = k;
        return 1;
    }
    return 0;
}

typedef struct deltas {
    delta *d;
    size_t n, cap;
} deltas;

static int deltas_range(deltas *ds, double a, double b, uint64_t bytes) {
    if (bytes == 0) return 0;
    if (ds->n + 2 > ds->cap) {
        size_t cap = ds->cap ? ds->cap * 2 : 1024;
        delta *d = tide_realloc(ds->d, cap * sizeof *d);
        if (!d) return -1;
        ds->d = d;
        ds->cap = cap;
    }
    ds->d[ds->n++] = (delta){a, (int64_t)bytes};
    ds->d[ds->n++] = (delta){b, -(int64_t)bytes};
    return 0;
}

/* Builds the sorted allocation/free deltas of the device arena. by_ins maps an
 * instruction to its timeline entry (-1: not in the timeline). */
static int device_deltas(const tide_plan *p, const tide_sim_event *tl, const int *by_ins,
                         double t_end, deltas *ds) {
    const tide_graph *g = p->g;
    copies c = {0};
    c.free_list = -1;
    c.head = tide_malloc((size_t)(g->n_tensors > 0 ? g->n_tensors : 1) * sizeof *c.head);
    if (!c.head) return -1;
    for (int t = 0; t < g->n_tensors; t++) c.head[t] = -1;
    int rc = 0;
    for (int t = 0; t < g->n_tensors && rc == 0; t++) /* warm tensors hold their range from the start */
        if (p->warm_off && p->warm_off[t] != TIDE_HOME) rc = copies_write(&c, t, p->warm_off[t], 0.0);
    for (int i = 0; i < p->n_ins && rc == 0; i++) {
        if (by_ins[i] < 0) continue;
        const tide_ins *in = &p->ins[i];
        const tide_sim_event *e = &tl[by_ins[i]];
        switch (in->kind) {
        case TIDE_INS_LOAD:
            rc = copies_write(&c, in->tensor, in->dev_off[0], e->start_s);
            break;
        case TIDE_INS_COMPUTE:
        case TIDE_INS_ALL_REDUCE:
        case TIDE_INS_REDUCE_SCATTER:
        case TIDE_INS_ALL_GATHER: {
            const tide_op *op = &g->ops[in->op];
            for (int j = 0; j < op->n_out && rc == 0; j++) /* host operands hold no device bytes */
                if (!tide_ins_host_opnd(in, op->n_in + j))
                    rc = copies_write(&c, op->out[j], in->dev_off[op->n_in + j], e->start_s);
            if (rc == 0 && in->place == TIDE_PLACE_DEVICE)
                rc = deltas_range(ds, e->start_s, e->end_s, op->scratch_bytes);
            break;
        }
        case TIDE_INS_DROP: {
            double s;
            if (in->src == TIDE_TIER_DEVICE && copies_drop(&c, in->tensor, in->dev_off[0], &s))
                rc = deltas_range(ds, s, e->end_s, g->tensors[in->tensor].nbytes);
            break;
        }
        default:
            break;
        }
    }
    for (int t = 0; t < g->n_tensors && rc == 0; t++)
        for (int k = c.head[t]; k >= 0 && rc == 0; k = c.next[k])
            rc = deltas_range(ds, c.start[k], t_end, g->tensors[t].nbytes);
    tide_free(c.head);
    tide_free(c.next);
    tide_free(c.off);
    tide_free(c.start);
    if (rc == 0 && ds->n) qsort(ds->d, ds->n, sizeof *ds->d, cmp_delta);
    return rc;
}

/* ---------------------------------------------------------------- events */

static void put_event(FILE *f, const tide_plan *p, const tide_sim_event *e) {
    const tide_graph *g = p->g;
    const tide_ins *in = &p->ins[e->ins];
    fprintf(f, ",\n{\"ph\":\"X\",\"pid\":1,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f,\"cat\":\"%s\",\"name\":\"",
            (int)in->stream + 1, e->start_s * 1e6, (e->end_s - e->start_s) * 1e6,
            tide_ins_name(in->kind));
    if (tide_ins_runs_op(in->kind)) {
        const tide_op *op = &g->ops[in->op];
        fputs(tide_op_name(op->kind), f);
        put_op_label(f, g, op);
        fprintf(f, "\",\"args\":{\"ins\":%d,\"iter\":%d,\"op\":%d,\"place\":\"%s\",\"flops\":%.17g", e->ins,
                in->iter, in->op, tide_place_name(in->place), op->flops);
        if (op->n_out > 0) {
            fputs(",\"tensor\":\"", f);
            put_escaped(f, g->tensors[op->out[0]].name);
            fprintf(f, "\",\"bytes\":%llu,\"dev_off\":%llu",
                    (unsigned long long)g->tensors[op->out[0]].nbytes,
                    (unsigned long long)in->dev_off[op->n_in]);
        }
        fputs("}}", f);
        return;
    }
    const tide_tensor *t = &g->tensors[in->tensor];
    fprintf(f, "%s ", tide_ins_name(in->kind));
    put_escaped(f, t->name);
    fprintf(f, "\",\"args\":{\"ins\":%d,\"iter\":%d,\"tensor\":\"", e->ins, in->iter);
    put_escaped(f, t->name);
    fprintf(f, "\",\"bytes\":%llu", (unsigned long long)t->nbytes);
    switch (in->kind) {
    case TIDE_INS_LOAD:
    case TIDE_INS_STORE:
        fprintf(f, ",\"src\":\"%s\",\"dst\":\"%s\",\"dev_off\":%llu,\"tier_off\":",
                tide_tier_name(in->src), tide_tier_name(in->dst),
                (unsigned long long)in->dev_off[0]);
        put_off(f, in->tier_off);
        break;
    case TIDE_INS_MOVE:
        fprintf(f, ",\"src\":\"%s\",\"dst\":\"%s\",\"src_off\":", tide_tier_name(in->src),
                tide_tier_name(in->dst));
        put_off(f, in->src_off);
        fputs(",\"tier_off\":", f);
        put_off(f, in->tier_off);
        break;
    case TIDE_INS_DROP:
        fprintf(f, ",\"tier\":\"%s\",", tide_tier_name(in->src));
        if (in->src == TIDE_TIER_DEVICE)
            fprintf(f, "\"dev_off\":%llu", (unsigned long long)in->dev_off[0]);
        else {
            fputs("\"tier_off\":", f);
            put_off(f, in->tier_off);
        }
        break;
    default:
        break;
    }
    fputs("}}", f);
}

tide_status tide_trace_write(const tide_plan *p, const tide_sim_event *timeline, int n,
                             const char *path) {
    tide_ctx *ctx = p ? p->ctx : NULL;
    if (!p || !path || !*path || n < 0 || (n > 0 && !timeline))
        return tide_err(ctx, TIDE_E_INVALID, "trace: no plan, timeline or path");
    const tide_graph *g = p->g;

    /* Check the timeline and index it by instruction. */
    int *by_ins = tide_malloc((size_t)(p->n_ins > 0 ? p->n_ins : 1) * sizeof *by_ins);
    if (!by_ins) return tide_err(ctx, TIDE_E_NOMEM, "out of memory writing trace '%s'", path);
    for (int i = 0; i < p->n_ins; i++) by_ins[i] = -1;
    double t_end = 0;
    for (int k = 0; k < n; k++) {
        const tide_sim_event *e = &timeline[k];
        const char *why = NULL;
        if (e->ins < 0 || e->ins >= p->n_ins)
            why = "instruction index out of range";
        else if (by_ins[e->ins] >= 0)
            why = "instruction appears twice";
        else if (!isfinite(e->start_s) || !isfinite(e->end_s) || e->start_s < 0 || e->end_s < e->start_s)
            why = "start and end must be finite with 0 <= start <= end";
        else {
            const tide_ins *in = &p->ins[e->ins];
            if ((unsigned)in->kind >= TIDE_INS_COUNT || (unsigned)in->stream >= TIDE_STREAM_COUNT ||
                (tide_ins_runs_op(in->kind) ? (in->op < 0 || in->op >= g->n_ops)
                                              : (in->tensor < 0 || in->tensor >= g->n_tensors)))
                why = "the instruction is malformed";
        }
        if (why) {
            tide_free(by_ins);
            return tide_err(ctx, TIDE_E_INVALID, "trace '%s': timeline entry %d (instruction %d): %s",
                            path, k, e->ins, why);
        }
        by_ins[e->ins] = k;
        if (e->end_s > t_end) t_end = e->end_s;
    }
    deltas ds = {0};
    if (device_deltas(p, timeline, by_ins, t_end, &ds)) {
        tide_free(by_ins);
        tide_free(ds.d);
        return tide_err(ctx, TIDE_E_NOMEM, "out of memory writing trace '%s'", path);
    }
    tide_free(by_ins);

    tide_atomic_file af;
    tide_status st = tide_file_begin(ctx, "trace", path, &af);
    if (st) {
        tide_free(ds.d);
        return st;
    }
    FILE *f = af.fp;
    fputs("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n"
          "{\"ph\":\"M\",\"pid\":1,\"name\":\"process_name\",\"args\":{\"name\":\"tide\"}}", f);
    for (int s = 0; s < TIDE_STREAM_COUNT; s++)
        fprintf(f,
                ",\n{\"ph\":\"M\",\"pid\":1,\"tid\":%d,\"name\":\"thread_name\",\"args\":{\"name\":\"%s\"}}"
                ",\n{\"ph\":\"M\",\"pid\":1,\"tid\":%d,\"name\":\"thread_sort_index\",\"args\":{\"sort_index\":%d}}",
                s + 1, tide_stream_name((tide_stream)s), s + 1, s);
    for (int k = 0; k < n; k++) put_event(f, p, &timeline[k]);
    fputs(",\n{\"ph\":\"C\",\"pid\":1,\"name\":\"device bytes\",\"ts\":0.000,\"args\":{\"used\":0}}", f);
    int64_t in_use = 0;
    for (size_t k = 0; k < ds.n;) {
        double t = ds.d[k].t;
        for (; k < ds.n && ds.d[k].t == t; k++) in_use += ds.d[k].bytes;
        fprintf(f, ",\n{\"ph\":\"C\",\"pid\":1,\"name\":\"device bytes\",\"ts\":%.3f,\"args\":{\"used\":%lld}}",
                t * 1e6, (long long)in_use);
    }
    fputs("\n]}\n", f);
    tide_free(ds.d);
    return tide_file_commit(&af);
}
