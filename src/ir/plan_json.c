/*
 * plan_json.c - saving and loading plans as JSON, and the graph fingerprint
 * that ties a plan file to the graph it was made for.
 *
 * The file (version 2):
 *   {"format":"tide-plan", "version":2, "policy":"tide", "n_iter":N,
 *    "device_budget":B, "host_budget":H, "host_addressable":false,
 *    "warm_region":W,                          (optional, 0 when absent)
 *    "ranks":R,                                (optional, 1 when absent: the
 *                                               data-parallel ranks; a plan
 *                                               with collectives has R >= 2)
 *    "graph":{"n_tensors":..,"n_ops":..,"fingerprint":"16 hex digits"},
 *    "home":["host","ssd","device",...]      one tier name per tensor
 *    "resident":[0,1,...]                     one flag per tensor
 *    "warm_off":[-1,4096,...]                 one offset per tensor (-1: not warm)
 *    "host_spill_bytes":.., "ssd_spill_bytes":..,
 *    "stats":{ every member of tide_plan_stats },
 *    "ins_fields":[...names of the columns below, for readers...],
 *    "ins":[[kind, stream, iter, op, tensor, src, dst, [dev_off...],
 *            scratch_off, tier_off, src_off, [waits...], place, host_opnd], ...]}
 * kind, stream, src, dst and place are the enum values of plan.h; host_opnd
 * is the bit mask of a COMPUTE's host operands. dev_off holds n_in + n_out
 * offsets for a COMPUTE (-1: a host operand's home), one for any other
 * instruction. Version 1 files (no host_addressable, warm_off, place or
 * host_opnd: nothing on the host, nothing warm) load too.
 *
 * Integers: JSON numbers are doubles in most readers (cJSON included), exact
 * only below 2^53. A 64-bit value is written as a number when below 2^53 and
 * as a decimal string otherwise; the loader takes either, so every value
 * round-trips exactly. tier_off / src_off equal to TIDE_HOME are written -1.
 * Doubles are written with 17 significant digits (exact round trip); the
 * non-finite ones as the strings "inf", "-inf", "nan".
 *
 * The loader trusts nothing: every field must be present with its type, every
 * enum and index in range, every wait on an earlier instruction, every device
 * range inside the budget and every spill range inside its spill area, homes
 * consistent with roles, and the fingerprint equal to the given graph's. Any
 * failure is TIDE_E_FORMAT naming the file, the instruction and the field.
 * Whether the plan is *correct* (hazards, versions) is the verifier's job.
 *
 * Saving streams with fprintf (plans reach millions of instructions) into a
 * temporary file renamed over the path when complete (tide_file_begin). Loading parses the
 * whole file with cJSON: about 1 KB of memory per instruction while loading.
 */
#include "ir/plan.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define JSON_EXACT_LIMIT 9007199254740992.0 /* 2^53 */
#define N_INS_FIELDS_V1 12
#define N_INS_FIELDS 14

/* ---------------------------------------------------------------- fingerprint */

static uint64_t fnv_bytes(uint64_t h, const void *data, size_t n) {
    const unsigned char *b = data;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

static uint64_t fnv_u64(uint64_t h, uint64_t v) {
    unsigned char b[8];
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(v >> (8 * i));
    return fnv_bytes(h, b, 8);
}

uint64_t tide_graph_fingerprint(const tide_graph *g) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a 64 offset basis */
    h = fnv_u64(h, (uint64_t)g->n_tensors);
    h = fnv_u64(h, (uint64_t)g->n_ops);
    for (int t = 0; t < g->n_tensors; t++) {
        const tide_tensor *x = &g->tensors[t];
        h = fnv_bytes(h, x->name, strlen(x->name) + 1);
        h = fnv_u64(h, (uint64_t)x->dtype);
        h = fnv_u64(h, (uint64_t)x->role);
        h = fnv_u64(h, (uint64_t)x->ndim);
        for (int d = 0; d < x->ndim; d++) h = fnv_u64(h, (uint64_t)x->shape[d]);
    }
    for (int i = 0; i < g->n_ops; i++) {
        const tide_op *op = &g->ops[i];
        h = fnv_u64(h, (uint64_t)op->kind);
        h = fnv_u64(h, (uint64_t)op->n_in);
        h = fnv_u64(h, (uint64_t)op->n_out);
        for (int k = 0; k < op->n_in; k++) h = fnv_u64(h, (uint64_t)op->in[k]);
        for (int k = 0; k < op->n_out; k++) h = fnv_u64(h, (uint64_t)op->out[k]);
    }
    return h;
}

/* ---------------------------------------------------------------- saving */

static void put_u64(FILE *f, uint64_t v) {
    if (v < (UINT64_C(1) << 53))
        fprintf(f, "%llu", (unsigned long long)v);
    else
        fprintf(f, "\"%llu\"", (unsigned long long)v);
}

static void put_off(FILE *f, uint64_t v) {
    if (v == TIDE_HOME)
        fputs("-1", f);
    else
        put_u64(f, v);
}

static void put_double(FILE *f, double v) {
    if (isnan(v))
        fputs("\"nan\"", f);
    else if (isinf(v))
        fputs(v > 0 ? "\"inf\"" : "\"-inf\"", f);
    else
        fprintf(f, "%.17g", v);
}

typedef struct stat_field {
    const char *key;
    size_t offset;
    bool is_double;
} stat_field;

static const stat_field stat_fields[] = {
    {"peak_device_bytes", offsetof(tide_plan_stats, peak_device_bytes), false},
    {"peak_host_bytes", offsetof(tide_plan_stats, peak_host_bytes), false},
    {"peak_ssd_bytes", offsetof(tide_plan_stats, peak_ssd_bytes), false},
    {"bytes_h2d", offsetof(tide_plan_stats, bytes_h2d), false},
    {"bytes_d2h", offsetof(tide_plan_stats, bytes_d2h), false},
    {"bytes_ssd_read", offsetof(tide_plan_stats, bytes_ssd_read), false},
    {"bytes_ssd_write", offsetof(tide_plan_stats, bytes_ssd_write), false},
    {"n_loads", offsetof(tide_plan_stats, n_loads), false},
    {"n_stores", offsetof(tide_plan_stats, n_stores), false},
    {"n_moves", offsetof(tide_plan_stats, n_moves), false},
    {"compute_s", offsetof(tide_plan_stats, compute_s), true},
    {"makespan_s", offsetof(tide_plan_stats, makespan_s), true},
    {"plan_seconds", offsetof(tide_plan_stats, plan_seconds), true},
};
#define N_STAT_FIELDS (sizeof stat_fields / sizeof stat_fields[0])

static int n_dev_off(const tide_plan *p, const tide_ins *in) {
    if (!tide_ins_runs_op(in->kind)) return 1;
    const tide_op *op = &p->g->ops[in->op];
    return op->n_in + op->n_out;
}

static void put_plan(FILE *f, const tide_plan *p) {
    const tide_graph *g = p->g;
    fprintf(f, "{\"format\":\"tide-plan\",\"version\":2,\"policy\":\"%s\",\"n_iter\":%d,\n",
            tide_policy_name(p->policy), p->n_iter);
    fputs("\"device_budget\":", f);
    put_u64(f, p->device_budget);
    fputs(",\"host_budget\":", f);
    put_u64(f, p->host_budget);
    fprintf(f, ",\"host_addressable\":%s", p->host_addressable ? "true" : "false");
    fputs(",\"warm_region\":", f);
    put_u64(f, p->warm_region);
    if (p->ranks > 1) fprintf(f, ",\"ranks\":%d", p->ranks);
    fprintf(f, ",\n\"graph\":{\"n_tensors\":%d,\"n_ops\":%d,\"fingerprint\":\"%016llx\"},\n\"home\":[",
            g->n_tensors, g->n_ops, (unsigned long long)tide_graph_fingerprint(g));
    for (int t = 0; t < g->n_tensors; t++)
        fprintf(f, "%s\"%s\"", t ? "," : "", tide_tier_name(p->home[t]));
    fputs("],\n\"resident\":[", f);
    for (int t = 0; t < g->n_tensors; t++) fprintf(f, "%s%d", t ? "," : "", p->resident[t] ? 1 : 0);
    fputs("],\n\"warm_off\":[", f);
    for (int t = 0; t < g->n_tensors; t++) {
        if (t) fputc(',', f);
        put_off(f, p->warm_off[t]);
    }
    fputs("],\n\"host_spill_bytes\":", f);
    put_u64(f, p->host_spill_bytes);
    fputs(",\"ssd_spill_bytes\":", f);
    put_u64(f, p->ssd_spill_bytes);
    fputs(",\n\"stats\":{", f);
    for (size_t k = 0; k < N_STAT_FIELDS; k++) {
        const char *base = (const char *)&p->stats + stat_fields[k].offset;
        fprintf(f, "%s\"%s\":", k ? "," : "", stat_fields[k].key);
        if (stat_fields[k].is_double)
            put_double(f, *(const double *)base);
        else
            put_u64(f, *(const uint64_t *)base);
    }
    fputs("},\n\"ins_fields\":[\"kind\",\"stream\",\"iter\",\"op\",\"tensor\",\"src\",\"dst\","
          "\"dev_off\",\"scratch_off\",\"tier_off\",\"src_off\",\"waits\",\"place\",\"host_opnd\"],\n\"ins\":[",
          f);
    for (int i = 0; i < p->n_ins; i++) {
        const tide_ins *in = &p->ins[i];
        fprintf(f, "%s\n[%d,%d,%d,%d,%d,%d,%d,[", i ? "," : "", (int)in->kind, (int)in->stream,
                in->iter, in->op, in->tensor, (int)in->src, (int)in->dst);
        int nd = n_dev_off(p, in);
        for (int k = 0; k < nd; k++) {
            if (k) fputc(',', f);
            if (in->kind == TIDE_INS_COMPUTE && tide_ins_host_opnd(in, k)) put_off(f, in->dev_off[k]);
            else put_u64(f, in->dev_off[k]);
        }
        fputs("],", f);
        put_u64(f, in->scratch_off);
        fputc(',', f);
        put_off(f, in->tier_off);
        fputc(',', f);
        put_off(f, in->src_off);
        fputs(",[", f);
        for (int k = 0; k < in->n_wait; k++) fprintf(f, "%s%d", k ? "," : "", p->waits[in->wait_at + k]);
        fprintf(f, "],%d,%u]", (int)in->place, (unsigned)in->host_opnd);
    }
    fputs("\n]}\n", f);
}

tide_status tide_plan_save_json(const tide_plan *p, const char *path) {
    tide_ctx *ctx = p ? p->ctx : NULL;
    if (!p || !p->g || !path || !*path) return tide_err(ctx, TIDE_E_INVALID, "plan save: no plan or path");
    for (int i = 0; i < p->n_ins; i++) {
        const tide_ins *in = &p->ins[i];
        if ((tide_ins_runs_op(in->kind) && (in->op < 0 || in->op >= p->g->n_ops)) ||
            (unsigned)in->kind >= TIDE_INS_COUNT || in->n_wait < 0 ||
            in->wait_at < 0 || in->wait_at > p->n_waits - in->n_wait)
            return tide_err(ctx, TIDE_E_INVALID, "plan save '%s': instruction %d is malformed", path, i);
    }
    tide_atomic_file af;
    tide_status st = tide_file_begin(ctx, "plan file", path, &af);
    if (st) return st;
    put_plan(af.fp, p);
    return tide_file_commit(&af);
}

/* ---------------------------------------------------------------- loading */

typedef struct reader {
    tide_ctx *ctx;
    const char *path;
} reader;

#define BAD(...) (tide_err(r->ctx, TIDE_E_FORMAT, __VA_ARGS__))

/* Value of an exact integer number item in [lo, hi], or a failure. */
static bool get_int(const cJSON *it, long long lo, long long hi, long long *v) {
    if (!cJSON_IsNumber(it)) return false;
    double d = it->valuedouble;
    if (!isfinite(d) || d != floor(d) || d < (double)lo || d > (double)hi) return false;
    *v = (long long)d;
    return true;
}

/* A 64-bit unsigned value: a number below 2^53 or a decimal string; -1 gives
 * TIDE_HOME when allow_home. */
static bool get_u64(const cJSON *it, bool allow_home, uint64_t *v) {
    if (cJSON_IsNumber(it)) {
        double d = it->valuedouble;
        if (!isfinite(d) || d != floor(d)) return false;
        if (allow_home && d == -1) {
            *v = TIDE_HOME;
            return true;
        }
        if (d < 0 || d >= JSON_EXACT_LIMIT) return false;
        *v = (uint64_t)d;
        return true;
    }
    if (cJSON_IsString(it)) {
        const char *s = it->valuestring;
        size_t l = strlen(s);
        if (l == 0 || l > 20) return false;
        for (size_t i = 0; i < l; i++)
            if (s[i] < '0' || s[i] > '9') return false;
        errno = 0;
        unsigned long long x = strtoull(s, NULL, 10);
        if (errno == ERANGE) return false;
        *v = (uint64_t)x;
        return true;
    }
    return false;
}

static bool get_double(const cJSON *it, double *v) {
    if (cJSON_IsNumber(it)) {
        *v = it->valuedouble;
        return true;
    }
    if (cJSON_IsString(it)) {
        if (strcmp(it->valuestring, "inf") == 0) *v = INFINITY;
        else if (strcmp(it->valuestring, "-inf") == 0) *v = -INFINITY;
        else if (strcmp(it->valuestring, "nan") == 0) *v = NAN;
        else return false;
        return true;
    }
    return false;
}

static const cJSON *member(const cJSON *obj, const char *key) {
    return cJSON_GetObjectItemCaseSensitive(obj, key);
}

static tide_status need_u64(reader *r, const cJSON *obj, const char *key, uint64_t *v) {
    const cJSON *it = member(obj, key);
    if (!it) return BAD("plan file '%s': field '%s' is missing", r->path, key);
    if (!get_u64(it, false, v))
        return BAD("plan file '%s': field '%s' must be an unsigned 64-bit integer", r->path, key);
    return TIDE_OK;
}

/* Checks [off, off + n) lies inside [0, limit). */
static bool inside(uint64_t off, uint64_t n, uint64_t limit) {
    return off <= limit && n <= limit - off;
}

/* Parses and checks one instruction array into *in and its waits. */
static tide_status parse_ins(reader *r, const tide_plan *p, int version, int i, const cJSON *a, tide_ins *in,
                             int **waits, int *cap_waits, int *n_wait) {
    const tide_graph *g = p->g;
    int nf = version == 1 ? N_INS_FIELDS_V1 : N_INS_FIELDS;
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != nf)
        return BAD("plan file '%s': instruction %d must be an array of %d fields", r->path, i, nf);
    const cJSON *it[N_INS_FIELDS];
    int k = 0;
    for (const cJSON *c = a->child; c && k < nf; c = c->next) it[k++] = c;
    long long v[7];
    static const char *const names[7] = {"kind", "stream", "iter", "op", "tensor", "src", "dst"};
    const long long lo[7] = {0, 0, 0, -1, -1, 0, 0};
    const long long hi[7] = {TIDE_INS_COUNT - 1, TIDE_STREAM_COUNT - 1, p->n_iter - 1, g->n_ops - 1,
                             g->n_tensors - 1, TIDE_TIER_COUNT - 1, TIDE_TIER_COUNT - 1};
    for (k = 0; k < 7; k++)
        if (!get_int(it[k], lo[k], hi[k], &v[k]))
            return BAD("plan file '%s': instruction %d: field '%s' must be an integer in [%lld, %lld]",
                       r->path, i, names[k], lo[k], hi[k]);
    memset(in, 0, sizeof *in);
    in->kind = (tide_ins_kind)v[0];
    in->stream = (tide_stream)v[1];
    in->iter = (int)v[2];
    in->op = (int)v[3];
    in->tensor = (int)v[4];
    in->src = (tide_tier)v[5];
    in->dst = (tide_tier)v[6];
    bool runs_op = tide_ins_runs_op(in->kind);
    if (runs_op ? (in->op < 0 || in->tensor != -1) : (in->tensor < 0 || in->op != -1))
        return BAD("plan file '%s': instruction %d: a %s needs %s", r->path, i, tide_ins_name(in->kind),
                   runs_op ? "an op and tensor -1" : "a tensor and op -1");
    if (tide_ins_is_collective(in->kind) && !tide_op_is_collective(g->ops[in->op].kind))
        return BAD("plan file '%s': instruction %d: a %s must name a collective op (op %d is %s)", r->path, i,
                   tide_ins_name(in->kind), in->op, tide_op_name(g->ops[in->op].kind));
    if (nf > N_INS_FIELDS_V1) {
        long long pl, mask;
        int n_opnd = runs_op ? g->ops[in->op].n_in + g->ops[in->op].n_out : 0;
        if (!get_int(it[12], 0, in->kind == TIDE_INS_COMPUTE ? TIDE_PLACE_COUNT - 1 : 0, &pl))
            return BAD("plan file '%s': instruction %d: field 'place' must be %s", r->path, i,
                       in->kind == TIDE_INS_COMPUTE ? "0 (device) or 1 (host)" : "0 (device)");
        if (!get_int(it[13], 0, (1ll << n_opnd) - 1, &mask))
            return BAD("plan file '%s': instruction %d: field 'host_opnd' must be a mask of its %d operands",
                       r->path, i, n_opnd);
        in->place = (tide_place)pl;
        in->host_opnd = (uint16_t)mask;
    }
    bool host_or_ssd_src = in->src == TIDE_TIER_HOST || in->src == TIDE_TIER_SSD;
    bool host_or_ssd_dst = in->dst == TIDE_TIER_HOST || in->dst == TIDE_TIER_SSD;
    if ((in->kind == TIDE_INS_LOAD && !(host_or_ssd_src && in->dst == TIDE_TIER_DEVICE)) ||
        (in->kind == TIDE_INS_STORE && !(in->src == TIDE_TIER_DEVICE && host_or_ssd_dst)) ||
        (in->kind == TIDE_INS_MOVE && !(host_or_ssd_src && host_or_ssd_dst && in->src != in->dst)))
        return BAD("plan file '%s': instruction %d: a %s from %s to %s is not allowed", r->path, i,
                   tide_ins_name(in->kind), tide_tier_name(in->src), tide_tier_name(in->dst));

    /* device offsets */
    int nd = n_dev_off(p, in);
    if (!cJSON_IsArray(it[7]) || cJSON_GetArraySize(it[7]) != nd)
        return BAD("plan file '%s': instruction %d: field 'dev_off' must be an array of %d offsets",
                   r->path, i, nd);
    k = 0;
    for (const cJSON *c = it[7]->child; c; c = c->next, k++) {
        bool host = in->kind == TIDE_INS_COMPUTE && tide_ins_host_opnd(in, k);
        if (!get_u64(c, host, &in->dev_off[k]))
            return BAD("plan file '%s': instruction %d: dev_off[%d] must be an unsigned 64-bit integer%s",
                       r->path, i, k, host ? " or -1 (home)" : "");
    }
    if (!get_u64(it[8], false, &in->scratch_off))
        return BAD("plan file '%s': instruction %d: field 'scratch_off' must be an unsigned 64-bit "
                   "integer", r->path, i);
    if (!get_u64(it[9], true, &in->tier_off) || !get_u64(it[10], true, &in->src_off))
        return BAD("plan file '%s': instruction %d: fields 'tier_off' and 'src_off' must be unsigned "
                   "64-bit integers or -1 (home)", r->path, i);

    /* device ranges inside the arena */
    if (runs_op) {
        const tide_op *op = &g->ops[in->op];
        for (k = 0; k < nd; k++) {
            int t = k < op->n_in ? op->in[k] : op->out[k - op->n_in];
            if (tide_ins_host_opnd(in, k)) {
                bool ok = in->dev_off[k] == TIDE_HOME ? p->home[t] == TIDE_TIER_HOST
                                                      : inside(in->dev_off[k], g->tensors[t].nbytes, p->host_spill_bytes);
                if (!ok)
                    return BAD("plan file '%s': instruction %d: host operand %d of '%s' is neither its host home "
                               "nor inside the host spill area of %llu bytes", r->path, i, k, g->tensors[t].name,
                               (unsigned long long)p->host_spill_bytes);
                continue;
            }
            if (!inside(in->dev_off[k], g->tensors[t].nbytes, p->device_budget))
                return BAD("plan file '%s': instruction %d: dev_off[%d] = %llu puts '%s' outside the "
                           "device budget of %llu bytes", r->path, i, k,
                           (unsigned long long)in->dev_off[k], g->tensors[t].name,
                           (unsigned long long)p->device_budget);
        }
        if (op->scratch_bytes && in->place == TIDE_PLACE_DEVICE &&
            !inside(in->scratch_off, op->scratch_bytes, p->device_budget))
            return BAD("plan file '%s': instruction %d: scratch_off %llu is outside the device budget",
                       r->path, i, (unsigned long long)in->scratch_off);
    } else {
        const tide_tensor *t = &g->tensors[in->tensor];
        bool on_device = in->kind == TIDE_INS_LOAD || in->kind == TIDE_INS_STORE ||
                         (in->kind == TIDE_INS_DROP && in->src == TIDE_TIER_DEVICE);
        if (on_device && !inside(in->dev_off[0], t->nbytes, p->device_budget))
            return BAD("plan file '%s': instruction %d: dev_off %llu puts '%s' outside the device "
                       "budget of %llu bytes", r->path, i, (unsigned long long)in->dev_off[0],
                       t->name, (unsigned long long)p->device_budget);
        /* the host/ssd copies it touches: (tier, offset) pairs */
        tide_tier tiers[2];
        uint64_t offs[2];
        const char *fname[2];
        int nt = 0;
        switch (in->kind) {
        case TIDE_INS_LOAD: tiers[nt] = in->src, offs[nt] = in->tier_off, fname[nt++] = "tier_off"; break;
        case TIDE_INS_STORE: tiers[nt] = in->dst, offs[nt] = in->tier_off, fname[nt++] = "tier_off"; break;
        case TIDE_INS_MOVE:
            tiers[nt] = in->dst, offs[nt] = in->tier_off, fname[nt++] = "tier_off";
            tiers[nt] = in->src, offs[nt] = in->src_off, fname[nt++] = "src_off";
            break;
        case TIDE_INS_DROP:
            if (in->src != TIDE_TIER_DEVICE) tiers[nt] = in->src, offs[nt] = in->tier_off, fname[nt++] = "tier_off";
            break;
        default: break;
        }
        for (k = 0; k < nt; k++) {
            if (offs[k] == TIDE_HOME) {
                if (p->home[in->tensor] != tiers[k])
                    return BAD("plan file '%s': instruction %d: %s is 'home' but '%s' has no home on %s",
                               r->path, i, fname[k], t->name, tide_tier_name(tiers[k]));
                continue;
            }
            uint64_t area = tiers[k] == TIDE_TIER_HOST ? p->host_spill_bytes : p->ssd_spill_bytes;
            if (!inside(offs[k], t->nbytes, area))
                return BAD("plan file '%s': instruction %d: %s %llu puts '%s' outside the %s spill area "
                           "of %llu bytes", r->path, i, fname[k], (unsigned long long)offs[k], t->name,
                           tide_tier_name(tiers[k]), (unsigned long long)area);
        }
    }

    /* waits */
    if (!cJSON_IsArray(it[11]))
        return BAD("plan file '%s': instruction %d: field 'waits' must be an array", r->path, i);
    int nw = cJSON_GetArraySize(it[11]);
    if (nw > *cap_waits) {
        int cap = nw > 2 * *cap_waits ? nw : 2 * *cap_waits;
        int *w = tide_realloc(*waits, (size_t)cap * sizeof *w);
        if (!w) return tide_err(r->ctx, TIDE_E_NOMEM, "out of memory loading plan '%s'", r->path);
        *waits = w;
        *cap_waits = cap;
    }
    k = 0;
    for (const cJSON *c = it[11]->child; c; c = c->next, k++) {
        long long w;
        if (!get_int(c, 0, i - 1, &w))
            return BAD("plan file '%s': instruction %d: wait %d must be an earlier instruction "
                       "(0 to %d)", r->path, i, k, i - 1);
        (*waits)[k] = (int)w;
    }
    *n_wait = nw;
    return TIDE_OK;
}

static tide_status parse_plan(reader *r, const tide_graph *g, const cJSON *root, tide_plan **out) {
    tide_status st;
    if (!cJSON_IsObject(root)) return BAD("plan file '%s': not a JSON object", r->path);
    const cJSON *it = member(root, "format");
    if (!cJSON_IsString(it) || strcmp(it->valuestring, "tide-plan") != 0)
        return BAD("plan file '%s': field 'format' must be \"tide-plan\"", r->path);
    long long v;
    if (!get_int(member(root, "version"), 1, 2, &v))
        return BAD("plan file '%s': field 'version' must be 1 or 2", r->path);
    int version = (int)v;
    tide_policy policy;
    it = member(root, "policy");
    if (!cJSON_IsString(it) || tide_policy_parse(it->valuestring, &policy) != 0)
        return BAD("plan file '%s': field 'policy' must name a policy (tide, static-layer, lru)", r->path);
    long long n_iter;
    if (!get_int(member(root, "n_iter"), 1, INT_MAX, &n_iter))
        return BAD("plan file '%s': field 'n_iter' must be a positive integer", r->path);

    const cJSON *gr = member(root, "graph");
    if (!cJSON_IsObject(gr)) return BAD("plan file '%s': field 'graph' must be an object", r->path);
    long long nt, no;
    if (!get_int(member(gr, "n_tensors"), 0, INT_MAX, &nt) || !get_int(member(gr, "n_ops"), 0, INT_MAX, &no))
        return BAD("plan file '%s': fields 'graph.n_tensors' and 'graph.n_ops' must be integers", r->path);
    if (nt != g->n_tensors || no != g->n_ops)
        return BAD("plan file '%s': made for a graph of %lld tensors and %lld ops, not this one of %d "
                   "and %d", r->path, nt, no, g->n_tensors, g->n_ops);
    it = member(gr, "fingerprint");
    char fp[32];
    snprintf(fp, sizeof fp, "%016llx", (unsigned long long)tide_graph_fingerprint(g));
    if (!cJSON_IsString(it)) return BAD("plan file '%s': field 'graph.fingerprint' must be a string", r->path);
    if (strcmp(it->valuestring, fp) != 0)
        return BAD("plan file '%s': graph fingerprint %.20s does not match this graph's %s (the plan "
                   "was made for another graph)", r->path, it->valuestring, fp);

    tide_plan *p = tide_plan_alloc(r->ctx, g, (int)n_iter);
    if (!p) return tide_err(r->ctx, TIDE_E_NOMEM, "out of memory loading plan '%s'", r->path);
    int *waits = NULL, cap_waits = 0;
    p->policy = policy;
    if ((st = need_u64(r, root, "device_budget", &p->device_budget)) ||
        (st = need_u64(r, root, "host_budget", &p->host_budget)) ||
        (st = need_u64(r, root, "host_spill_bytes", &p->host_spill_bytes)) ||
        (st = need_u64(r, root, "ssd_spill_bytes", &p->ssd_spill_bytes)))
        goto fail;
    if (version >= 2) {
        const cJSON *ha = member(root, "host_addressable"), *wo = member(root, "warm_off");
        if (!cJSON_IsBool(ha)) {
            st = BAD("plan file '%s': field 'host_addressable' must be true or false", r->path);
            goto fail;
        }
        p->host_addressable = cJSON_IsTrue(ha);
        const cJSON *rk = member(root, "ranks");
        long long ranks = 1;
        if (rk && !get_int(rk, 1, 1 << 20, &ranks)) {
            st = BAD("plan file '%s': field 'ranks' must be an integer from 1 to %d", r->path, 1 << 20);
            goto fail;
        }
        p->ranks = (int)ranks;
        const cJSON *wr = member(root, "warm_region");
        if (wr && (!get_u64(wr, false, &p->warm_region) || p->warm_region % TIDE_PLAN_ALIGN ||
                   p->warm_region > p->device_budget)) {
            st = BAD("plan file '%s': field 'warm_region' must be a multiple of %u within the device budget",
                     r->path, TIDE_PLAN_ALIGN);
            goto fail;
        }
        if (!cJSON_IsArray(wo) || cJSON_GetArraySize(wo) != g->n_tensors) {
            st = BAD("plan file '%s': field 'warm_off' must be an array of %d offsets", r->path, g->n_tensors);
            goto fail;
        }
        int t = 0;
        for (const cJSON *c = wo->child; c; c = c->next, t++)
            if (!get_u64(c, true, &p->warm_off[t]) ||
                (p->warm_off[t] != TIDE_HOME && !inside(p->warm_off[t], g->tensors[t].nbytes, p->device_budget))) {
                st = BAD("plan file '%s': warm_off[%d] must be -1 or an offset of '%s' inside the device budget",
                         r->path, t, g->tensors[t].name);
                goto fail;
            }
    }

    const cJSON *home = member(root, "home"), *res = member(root, "resident");
    if (!cJSON_IsArray(home) || cJSON_GetArraySize(home) != g->n_tensors) {
        st = BAD("plan file '%s': field 'home' must be an array of %d tier names", r->path, g->n_tensors);
        goto fail;
    }
    if (!cJSON_IsArray(res) || cJSON_GetArraySize(res) != g->n_tensors) {
        st = BAD("plan file '%s': field 'resident' must be an array of %d flags", r->path, g->n_tensors);
        goto fail;
    }
    int t = 0;
    for (const cJSON *c = home->child; c; c = c->next, t++) {
        int tier = -1;
        for (int k = 0; k < TIDE_TIER_COUNT && cJSON_IsString(c); k++)
            if (strcmp(c->valuestring, tide_tier_name((tide_tier)k)) == 0) tier = k;
        tide_role role = g->tensors[t].role;
        bool ok = tier >= 0 &&
                  (role == TIDE_ROLE_TEMP ? tier == TIDE_TIER_DEVICE
                   : role == TIDE_ROLE_INPUT || role == TIDE_ROLE_OUTPUT ? tier == TIDE_TIER_HOST
                                                                          : tier != TIDE_TIER_DEVICE);
        if (!ok) {
            st = BAD("plan file '%s': home[%d] of %s tensor '%s' must be %s", r->path, t,
                     tide_role_name(role), g->tensors[t].name,
                     role == TIDE_ROLE_TEMP ? "\"device\" (no home)"
                     : role == TIDE_ROLE_INPUT || role == TIDE_ROLE_OUTPUT ? "\"host\""
                                                                            : "\"host\" or \"ssd\"");
            goto fail;
        }
        p->home[t] = (tide_tier)tier;
    }
    t = 0;
    for (const cJSON *c = res->child; c; c = c->next, t++) {
        long long f;
        if (cJSON_IsBool(c))
            p->resident[t] = cJSON_IsTrue(c);
        else if (get_int(c, 0, 1, &f))
            p->resident[t] = f != 0;
        else {
            st = BAD("plan file '%s': resident[%d] must be 0 or 1", r->path, t);
            goto fail;
        }
    }

    const cJSON *stats = member(root, "stats");
    if (!cJSON_IsObject(stats)) {
        st = BAD("plan file '%s': field 'stats' must be an object", r->path);
        goto fail;
    }
    for (size_t k = 0; k < N_STAT_FIELDS; k++) {
        char *base = (char *)&p->stats + stat_fields[k].offset;
        const cJSON *s = member(stats, stat_fields[k].key);
        bool ok = s && (stat_fields[k].is_double ? get_double(s, (double *)base)
                                                 : get_u64(s, false, (uint64_t *)base));
        if (!ok) {
            st = BAD("plan file '%s': field 'stats.%s' is missing or not a%s", r->path,
                     stat_fields[k].key, stat_fields[k].is_double ? " number" : "n unsigned integer");
            goto fail;
        }
    }

    const cJSON *ins = member(root, "ins");
    if (!cJSON_IsArray(ins)) {
        st = BAD("plan file '%s': field 'ins' must be an array", r->path);
        goto fail;
    }
    int i = 0;
    for (const cJSON *c = ins->child; c; c = c->next, i++) {
        if (i == INT_MAX) {
            st = BAD("plan file '%s': too many instructions", r->path);
            goto fail;
        }
        tide_ins in;
        int nw = 0;
        if ((st = parse_ins(r, p, version, i, c, &in, &waits, &cap_waits, &nw))) goto fail;
        if (tide_plan_push(p, &in, waits, nw) < 0) {
            st = tide_err(r->ctx, TIDE_E_NOMEM, "out of memory loading plan '%s'", r->path);
            goto fail;
        }
    }
    tide_free(waits);
    *out = p;
    return TIDE_OK;
fail:
    tide_free(waits);
    tide_plan_free(p);
    return st;
}

tide_status tide_plan_load_json(tide_ctx *ctx, const tide_graph *g, const char *path, tide_plan **out) {
    *out = NULL;
    if (!g || !path || !*path) return tide_err(ctx, TIDE_E_INVALID, "plan load: no graph or path");
    char *text = NULL;
    size_t n = 0;
    tide_status rst = tide_read_text_file(ctx, path, 0, &text, &n);
    if (rst) return rst;
    const char *end = NULL;
    /* the length includes the terminating NUL: cJSON then rejects trailing garbage */
    cJSON *root = cJSON_ParseWithLengthOpts(text, n + 1, &end, true);
    if (!root) {
        int line = 1;
        size_t at = end && end >= text ? (size_t)(end - text) : n;
        for (size_t i = 0; i < at && i < n; i++) line += text[i] == '\n';
        tide_free(text);
        return tide_err(ctx, TIDE_E_FORMAT, "plan file '%s': invalid or truncated JSON near line %d",
                        path, line);
    }
    tide_free(text);
    reader r = {ctx, path};
    tide_status st = parse_plan(&r, g, root, out);
    cJSON_Delete(root);
    return st;
}
