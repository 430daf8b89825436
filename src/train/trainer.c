/*
 * trainer.c - training steps of a LLaMA-style model through the one engine
 * (tide.h, "training"): the step graph of train_graph.c, its verified plan,
 * the runner, and the homes of the persistent training tensors.
 *
 * Homes. Every STATE tensor of the step graph (parameters, master weights,
 * moments) has one home, chosen by the plan: host memory (pinned where the
 * backend offers it and the plan moves it, one block per tensor) or an
 * extent of the trainer's state file on SSD (4 KiB-aligned, in the first
 * spill directory, unlinked once the executor holds it open, so nothing is
 * left behind). The homes are made and filled when the first step is planned:
 * parameters from the checkpoint (or a resumed state), masters widened from
 * them, moments zero.
 *
 * Resident (no budget): an unconstrained plan. On the CPU (device memory is
 * host memory) every persistent tensor is used in place and the arena holds
 * the activations, gradients and workspace alone. On a GPU the persistent
 * tensors are warm: uploaded once to fixed ranges at the bottom of the arena
 * and kept there across steps; reads (tide_trainer_read, saving) copy them
 * out.
 *
 * Offloaded: the plan under the budget (bytes, a fraction of the
 * unconstrained peak, the minimum, or auto), n_iter 1: each step loads what it
 * needs from the homes and leaves every persistent tensor at home with its
 * latest version (docs/design.md section 5, V5), so steps chain with no state kept on the
 * device between them. The second offloaded step may refit the profile from
 * its measured instructions and replan, keeping the homes (train_refit.c).
 */
#include "train/trainer_int.h"
#include "train/train_plan.h"
#include "train/train_ranks.h"
#include "runtime/session.h"
#include "runtime/tiling.h"
#include "sim/sim.h"
#include "trace/trace.h"
#include "cost/cost.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

double tide_train_lr(const tide_trainer_opts *o, int64_t s) {
    if (s < 0) s = 0;
    if (o->warmup > 0 && s < o->warmup) return o->lr * (double)(s + 1) / (double)o->warmup;
    if (!o->cosine) return o->lr;
    int64_t span = o->total_steps - o->warmup;
    double prog = span > 0 ? (double)(s - o->warmup) / (double)span : 1.0;
    if (prog > 1) prog = 1;
    return o->min_lr + 0.5 * (o->lr - o->min_lr) * (1.0 + cos(M_PI * prog));
}

static tide_status retile(tide_trainer *t, int tile_seqs, int vocab_blocks);

/* ---------------------------------------------------------------- making */

static tide_status check_opts(tide_ctx *ctx, const tide_trainer_opts *o) {
    if (!(o->lr > 0) || !isfinite(o->lr)) return tide_err(ctx, TIDE_E_INVALID, "learning rate %g must be positive", o->lr);
    if (o->cosine && (!(o->min_lr >= 0) || o->min_lr > o->lr))
        return tide_err(ctx, TIDE_E_INVALID, "minimum learning rate %g must be in [0, lr = %g]", o->min_lr, o->lr);
    if (o->warmup < 0) return tide_err(ctx, TIDE_E_INVALID, "warmup %lld is negative", (long long)o->warmup);
    if (o->cosine && o->total_steps <= 0)
        return tide_err(ctx, TIDE_E_INVALID, "a cosine schedule needs the number of steps");
    return TIDE_OK;
}

tide_status tide_trainer_new(tide_ctx *ctx, tide_checkpoint *ck, tide_backend *be, const tide_trainer_opts *o,
                             tide_trainer **out) {
    *out = NULL;
    TIDE_OPTS_SIZE_CHECK(ctx, tide_trainer_opts, o);
    tide_status st = check_opts(ctx, o);
    if (st) return st;
    /* the training graph's RoPE (and its backward) reads Hugging Face's q/k
     * order, and a save writes the rows as they are; LoRA on a quantized or
     * GGUF base trains on tide_qlora_config's types (train_qlora.c) */
    const tide_llama_config *ckc = tide_checkpoint_config(ck);
    const bool qlora = o->step.lora_r > 0 && (o->lora_base_type || ckc->qk_interleaved || ckc->wtypes_set ||
                                              tide_dtype_is_quantized(ckc->dtype));
    if (o->lora_base_type && o->step.lora_r <= 0)
        return tide_err(ctx, TIDE_E_INVALID, "a base type (%s) quantizes a LoRA step's frozen base: it needs LoRA "
                        "(a rank)", o->lora_base_type);
    if (!qlora && ckc->qk_interleaved)
        return tide_err(ctx, TIDE_E_UNSUPPORTED, "training a checkpoint whose q/k rows are in llama.cpp's order (a "
                        "GGUF file) is not supported: train its Hugging Face checkpoint (LoRA trains on either)");
    if (o->step.precision == TIDE_PRECISION_BF16 && !be->vt->device_is_host)
        return tide_err(ctx, TIDE_E_UNSUPPORTED, "a bf16 training step (precision bf16) on the %s backend is not "
                        "built: the cpu backend runs it; train with precision f32 there", be->vt->name);
    tide_trainer *t = tide_calloc(1, sizeof *t);
    if (!t) return tide_err(ctx, TIDE_E_NOMEM, "out of memory making a trainer");
    t->ctx = ctx;
    t->ck = ck;
    t->be = be;
    t->cfg = *tide_checkpoint_config(ck);
    t->o = *o;
    t->state_fd = -1;
    if (qlora && (st = tide_qlora_config(ctx, ckc, o->lora_base_type, &t->cfg))) goto fail;
    /* the graph with whole parameters first (the checkpoint's), in vocabulary
     * blocks below when asked for */
    t->o.step.vocab_blocks = 0;
    if ((st = tide_llama_build_train(ctx, &t->cfg, &t->o.step, &t->g))) goto fail;
    if (qlora && (st = train_qlora_open(t))) goto fail;
    /* every parameter must be in the checkpoint with its shape and dtype */
    for (int i = 0; i < t->g->n_tensors; i++) {
        const tide_tensor *T = &t->g->tensors[i];
        if (tide_train_tensor_class(t->g, i) != TIDE_TRAIN_PARAM || train_is_adapter(t, i) ||
            train_is_shard(t, i, NULL) || train_qlora_data(t, T->name, NULL))
            continue;
        tide_tensor_info ti;
        if (tide_checkpoint_get(ck, T->name, &ti)) {
            st = tide_err(ctx, TIDE_E_FORMAT, "the checkpoint has no parameter '%s'", T->name);
            goto fail;
        }
        if (ti.dtype != T->dtype || ti.nbytes != T->nbytes) {
            st = tide_err(ctx, TIDE_E_FORMAT, "checkpoint tensor '%s' is %s of %llu bytes, the model needs %s of %llu",
                          T->name, tide_dtype_name(ti.dtype), (unsigned long long)ti.nbytes,
                          tide_dtype_name(T->dtype), (unsigned long long)T->nbytes);
            goto fail;
        }
    }
    size_t nt = (size_t)t->g->n_tensors;
    t->home = tide_calloc(nt, sizeof *t->home);
    const int A = o->step.accum;
    const size_t R = (size_t)o->step.batch * (size_t)o->step.seq;
    t->pos = tide_malloc((size_t)o->step.seq * sizeof *t->pos);
    t->loss = tide_calloc((size_t)A, sizeof *t->loss);
    t->in_tok = tide_calloc((size_t)A, sizeof *t->in_tok);
    t->in_tgt = tide_calloc((size_t)A, sizeof *t->in_tgt);
    (void)R;
    if (!t->home || !t->pos || !t->loss || !t->in_tok || !t->in_tgt) {
        st = tide_err(ctx, TIDE_E_NOMEM, "out of memory making a trainer");
        goto fail;
    }
    for (int i = 0; i < o->step.seq; i++) t->pos[i] = i;
    for (int m = 0; m < A; m++) {
        char nm[32];
        snprintf(nm, sizeof nm, "tokens.%d", m);
        t->in_tok[m] = tide_graph_find(t->g, nm);
        snprintf(nm, sizeof nm, "targets.%d", m);
        t->in_tgt[m] = tide_graph_find(t->g, nm);
    }
    if (o->step.lora_r > 0 && (st = train_lora_open(t))) goto fail;
    if (o->step.vocab_blocks > 1 && (st = retile(t, o->step.tile_seqs, o->step.vocab_blocks))) goto fail;
    *out = t;
    return TIDE_OK;
fail:
    tide_trainer_free(t);
    return st;
}

static void free_homes(tide_trainer *t) {
    if (!t->home) return;
    for (int i = 0; i < t->g->n_tensors; i++) {
        train_home *h = &t->home[i];
        if (h->host) {
            if (h->pinned) t->be->vt->host_free(t->be, h->host);
            else tide_free_aligned(h->host);
        }
        h->host = NULL;
    }
    if (t->state_fd >= 0) close(t->state_fd);
    t->state_fd = -1;
    if (t->state_path) {
        unlink(t->state_path); /* already gone once bound; a failure between makes it stale */
        tide_free(t->state_path);
        t->state_path = NULL;
    }
}

void tide_trainer_free(tide_trainer *t) {
    if (!t) return;
    tide_runner_free(t->run);
    if (t->arena) t->be->vt->dealloc(t->be, t->arena);
    free_homes(t);
    train_lora_close(t);
    tide_free(t->home);
    tide_free(t->warm);
    tide_free(t->pos);
    tide_free(t->loss);
    tide_free(t->in_tok);
    tide_free(t->in_tgt);
    tide_free(t->ssd_dirs);
    tide_free(t->host_ops);
    train_resume_close(t);
    tide_graph_free(t->g);
    tide_free(t);
}

tide_status tide_trainer_set_offload(tide_trainer *t, const tide_offload_opts *o) {
    TIDE_OPTS_SIZE_CHECK(t->ctx, tide_offload_opts, o);
    if (t->run) return tide_err(t->ctx, TIDE_E_INVALID, "offloading is set before the first step");
    bool on = o && o->budget_kind != TIDE_BUDGET_NONE;
    tide_policy pol = TIDE_POLICY_TIDE;
    if (on && o->policy && tide_policy_parse(o->policy, &pol))
        return tide_err(t->ctx, TIDE_E_INVALID, "unknown policy '%s' (tide, static-layer, lru, checkpoint-layer or "
                       "zero-offload)",
                       o->policy);
    tide_status st = on ? tide_session_check_offload(t->ctx, o) : TIDE_OK;
    if (st) return st;
    tide_free(t->ssd_dirs);
    t->ssd_dirs = NULL;
    t->offload = false;
    if (o && o->ssd_dirs && !(t->ssd_dirs = tide_strdup(o->ssd_dirs)))
        return tide_err(t->ctx, TIDE_E_NOMEM, "out of memory");
    if (!on) return TIDE_OK;
    t->off = *o;
    t->off.ssd_dirs = t->ssd_dirs;
    t->off.hw = NULL;
    t->policy = pol;
    t->optim = TRAIN_OPTIM_AUTO;
    if (o->optimizer && train_optim_parse(o->optimizer, &t->optim))
        return tide_err(t->ctx, TIDE_E_INVALID, "unknown optimizer placement '%s' (auto, device or cpu)", o->optimizer);
    if (t->optim == TRAIN_OPTIM_DEVICE && pol == TIDE_POLICY_ZERO_OFFLOAD)
        return tide_err(t->ctx, TIDE_E_INVALID, "the zero-offload policy runs every AdamW update on the host CPU: "
                        "no --optimizer device with it");
    if (t->optim == TRAIN_OPTIM_CPU && pol != TIDE_POLICY_TIDE && pol != TIDE_POLICY_ZERO_OFFLOAD)
        return tide_err(t->ctx, TIDE_E_INVALID, "AdamW on the CPU is planned by the tide policy only, not %s",
                        o->policy);
    t->off.optimizer = NULL;
    if ((st = tide_session_hw(t->ctx, t->be, o->hw, t->ssd_dirs, 0, &t->hw))) return st;
    t->offload = true;
    return TIDE_OK;
}

int64_t tide_trainer_steps(const tide_trainer *t) { return t->step; }

/* ---------------------------------------------------------------- ranks */

static bool ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

bool train_is_shard(const tide_trainer *t, int i, int *whole) {
    const tide_graph *g = t->g;
    const tide_tensor *T = &g->tensors[i];
    if (!train_is_rank_step(&t->o.step) || t->o.step.zero < 1 || T->role != TIDE_ROLE_STATE) return false;
    char base[300];
    tide_train_class c = tide_train_tensor_class(g, i);
    if (ends_with(T->name, ".shard")) {
        snprintf(base, sizeof base, "%.*s", (int)(strlen(T->name) - 6), T->name);
    } else if (c == TIDE_TRAIN_MASTER || c == TIDE_TRAIN_MOMENT) {
        const char *pre = c == TIDE_TRAIN_MASTER ? "master." : !strncmp(T->name, "exp_avg_sq.", 11) ? "exp_avg_sq."
                                                                                                       : "exp_avg.";
        snprintf(base, sizeof base, "%s", T->name + strlen(pre));
    } else {
        return false;
    }
    int w = tide_graph_find(g, base);
    if (w < 0 || w == i) return false;
    if (whole) *whole = w;
    return true;
}

tide_status tide_trainer_set_comm(tide_trainer *t, tide_comm *c) {
    if (t->run) return tide_err(t->ctx, TIDE_E_INVALID, "the ranks' communicator is set before the first step");
    if (!c) return tide_err(t->ctx, TIDE_E_INVALID, "no communicator");
    int n = tide_comm_size(c);
    if (n == 1 && !train_is_rank_step(&t->o.step))
        return tide_err(t->ctx, TIDE_E_INVALID, "a communicator of one rank needs a rank's step "
                        "(tide_llama_train_opts.one_rank)");
    if (t->o.step.ranks != n)
        return tide_err(t->ctx, TIDE_E_INVALID, "the step is one of %d ranks' (tide_llama_train_opts.ranks), the "
                        "launch has %d", t->o.step.ranks < 2 ? 1 : t->o.step.ranks, n);
    /* the collectives on the backend's device memory: NCCL on CUDA */
    tide_status st = tide_backend_comm_attach(t->be, c, t->ctx);
    if (st) return st;
    t->comm = c;
    t->rank = tide_comm_rank(c);
    return TIDE_OK;
}

/* A 64-bit FNV-1a hash of what makes a plan (its instructions, waits,
 * homes and sizes): the ranks compare it before the first step. */
static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t k = 0; k < n; k++) h = (h ^ b[k]) * UINT64_C(1099511628211);
    return h;
}

static uint64_t plan_hash(const tide_plan *p) {
    uint64_t h = UINT64_C(14695981039346656037);
    h = fnv(h, &p->n_ins, sizeof p->n_ins);
    h = fnv(h, &p->device_budget, sizeof p->device_budget);
    h = fnv(h, &p->host_spill_bytes, sizeof p->host_spill_bytes);
    h = fnv(h, &p->ssd_spill_bytes, sizeof p->ssd_spill_bytes);
    for (int i = 0; i < p->n_ins; i++) {
        const tide_ins *in = &p->ins[i];
        int f[8] = {(int)in->kind, (int)in->stream, in->iter, in->op, in->tensor, (int)in->place, (int)in->src,
                    (int)in->dst};
        h = fnv(h, f, sizeof f);
        h = fnv(h, &in->host_opnd, sizeof in->host_opnd);
        h = fnv(h, in->dev_off, sizeof in->dev_off);
        h = fnv(h, &in->scratch_off, sizeof in->scratch_off);
        h = fnv(h, &in->tier_off, sizeof in->tier_off);
        h = fnv(h, &in->src_off, sizeof in->src_off);
        h = fnv(h, &p->waits[in->wait_at], (size_t)in->n_wait * sizeof *p->waits);
    }
    for (int i = 0; i < p->g->n_tensors; i++) {
        int tier = (int)p->home[i];
        h = fnv(h, &tier, sizeof tier);
    }
    return h;
}

/* The ranks' network where the profile has none: the ranks of one machine
 * exchange through its memory (MPI's shared-memory transport). */
static void net_defaults(tide_hw *hw) {
    if (hw->net_intra_bw > 0) return;
    hw->net_intra_bw = hw->host_mem_bw > 0 ? hw->host_mem_bw / 4 : 5e9;
    hw->net_intra_latency_s = 5e-6;
    hw->net_gpus_per_node = 0;
}

/* Of the step's measured timeline: the net stream's busy time, and how much
 * of it the compute stream was busy too. */
static void net_overlap(const tide_plan *p, const tide_sim_event *tl, double *busy, double *overlap) {
    *busy = *overlap = 0;
    if (!tl) return;
    int c = 0;
    for (int i = 0; i < p->n_ins; i++) {
        if (p->ins[i].stream != TIDE_STREAM_NET) continue;
        double a = tl[i].start_s, b = tl[i].end_s;
        *busy += b - a;
        /* compute instructions run in list order, one after another */
        while (c < p->n_ins && (p->ins[c].stream != TIDE_STREAM_COMPUTE || tl[c].end_s <= a)) c++;
        for (int k = c; k < p->n_ins; k++) {
            if (p->ins[k].stream != TIDE_STREAM_COMPUTE) continue;
            if (tl[k].start_s >= b) break;
            double lo = TIDE_MAX(a, tl[k].start_s), hi = TIDE_MIN(b, tl[k].end_s);
            if (hi > lo) *overlap += hi - lo;
        }
    }
}
const tide_graph *tide_trainer_graph(const tide_trainer *t) { return t->g; }

int tide_trainer_n_tensors(const tide_trainer *t) {
    int n = 0;
    for (int i = 0; i < t->g->n_tensors; i++) n += t->g->tensors[i].role == TIDE_ROLE_STATE;
    return n;
}

const char *tide_trainer_tensor(const tide_trainer *t, int k, tide_dtype *dt, uint64_t *nbytes) {
    for (int i = 0; i < t->g->n_tensors; i++) {
        if (t->g->tensors[i].role != TIDE_ROLE_STATE) continue;
        if (k-- == 0) {
            if (dt) *dt = t->g->tensors[i].dtype;
            if (nbytes) *nbytes = t->g->tensors[i].nbytes;
            return t->g->tensors[i].name;
        }
    }
    return NULL;
}

/* ---------------------------------------------------------------- plans */

/* Resident on a device: every persistent tensor warm at the bottom of the arena. */
static tide_status warm_layout(tide_trainer *t) {
    size_t nt = (size_t)t->g->n_tensors;
    if (!(t->warm = tide_malloc(nt * sizeof *t->warm))) return tide_err(t->ctx, TIDE_E_NOMEM, "out of memory planning");
    uint64_t at = 0;
    for (size_t i = 0; i < nt; i++) {
        t->warm[i] = TIDE_HOME;
        if (t->g->tensors[i].role != TIDE_ROLE_STATE) continue;
        t->warm[i] = at;
        at += tide_plan_align(t->g->tensors[i].nbytes);
    }
    t->warm_bytes = at;
    return TIDE_OK;
}

/* A resident plan of the step (runtime/session.c): on a device with every
 * persistent tensor warm. */
static tide_status plan_resident(tide_trainer *t, tide_plan **out) {
    tide_status st;
    if (train_is_rank_step(&t->o.step)) {
        /* a rank's collectives run on device copies: every persistent tensor
         * warm in the arena, even where device memory is host memory */
        if ((st = warm_layout(t))) return st;
        tide_hw hw = *tide_session_resident_hw();
        net_defaults(&hw);
        tide_plan_opts po = {.policy = TIDE_POLICY_TIDE, .n_iter = 1, .hw = &hw, .shared_scratch = true,
                             .warm_off = t->warm, .warm_region = t->warm_bytes};
        uint64_t peak = 0;
        if ((st = tide_plan_peak_unbounded(t->ctx, t->g, &po, &peak))) return st;
        po.device_budget = po.warm_region + peak + TIDE_PLAN_ALIGN;
        if ((st = tide_plan_make(t->ctx, t->g, &po, out))) return st;
        uint64_t used = TIDE_MAX((*out)->stats.peak_device_bytes, po.warm_region);
        (*out)->device_budget = TIDE_MAX(used, (uint64_t)TIDE_PLAN_ALIGN);
        return TIDE_OK;
    }
    if (!t->be->vt->device_is_host && (st = warm_layout(t))) return st;
    return tide_session_plan_resident(t->ctx, t->be, t->g, t->warm, t->warm_bytes, out);
}

tide_plan_opts train_offload_opts(const tide_trainer *t, uint64_t budget) {
    return (tide_plan_opts){.policy = t->policy, .device_budget = budget, .host_budget = t->off.host_budget,
                            .n_iter = 1, .hw = &t->hw};
}

/* The smallest budget of the step (TIDE_BUDGET_MIN); with the optimizer on
 * the CPU under the tide policy, with every update on the host
 * (zero-offload places them there itself). */
static tide_status min_budget(void *user, uint64_t *b) {
    tide_trainer *t = user;
    tide_plan_opts po = train_offload_opts(t, 0);
    bool *all = NULL;
    if (t->optim == TRAIN_OPTIM_CPU && t->policy == TIDE_POLICY_TIDE) {
        if (!(all = train_optim_all_host(t->ctx, t->g))) return TIDE_E_NOMEM;
        po.host_ops = all;
    }
    tide_status st = tide_plan_min_budget(t->ctx, t->g, &po, b);
    tide_free(all);
    return st;
}

/* The budget of the offloaded plan. */
static tide_status resolve_budget(tide_trainer *t, uint64_t *out) {
    return tide_session_budget(t->ctx, t->be, &t->off, &t->hw, t->g, "step", min_budget, t, out);
}

/* ---------------------------------------------------------------- homes */

/* Makes the state file for the SSD-homed tensors of p: one 4 KiB-aligned
 * extent each, in the first spill directory. */
static tide_status make_state_file(tide_trainer *t, const tide_plan *p) {
    uint64_t at = 0;
    for (int i = 0; i < t->g->n_tensors; i++) {
        if (t->g->tensors[i].role != TIDE_ROLE_STATE || p->home[i] != TIDE_TIER_SSD) continue;
        t->home[i].ssd = true;
        t->home[i].file_off = at;
        at += (t->g->tensors[i].nbytes + 4095) & ~(uint64_t)4095;
    }
    if (!at) return TIDE_OK;
    char dir[4096];
    const char *d = t->ssd_dirs && t->ssd_dirs[0] ? t->ssd_dirs : getenv("TMPDIR");
    if (!d || !d[0]) d = "/tmp";
    size_t n = strcspn(d, ",");
    snprintf(dir, sizeof dir, "%.*s", (int)n, d);
    size_t len = strlen(dir) + 32;
    if (!(t->state_path = tide_malloc(len))) return tide_err(t->ctx, TIDE_E_NOMEM, "out of memory");
    snprintf(t->state_path, len, "%s/tide-train-XXXXXX", dir);
    t->state_fd = mkostemp(t->state_path, O_CLOEXEC);
    if (t->state_fd < 0) {
        tide_status st = tide_err(t->ctx, TIDE_E_IO, "cannot create the training state file in %s: %s", dir,
                                  strerror(errno));
        tide_free(t->state_path);
        t->state_path = NULL;
        return st;
    }
    int rc = posix_fallocate(t->state_fd, 0, (off_t)at);
    if (rc)
        return tide_err(t->ctx, TIDE_E_IO, "no room for the %llu-byte training state in %s: %s",
                        (unsigned long long)at, dir, strerror(rc));
    t->state_bytes_ssd = at;
    return TIDE_OK;
}

static tide_status write_home(tide_trainer *t, int i, const void *src) {
    train_home *h = &t->home[i];
    uint64_t n = t->g->tensors[i].nbytes;
    if (!h->ssd) {
        memcpy(h->host, src, n);
        return TIDE_OK;
    }
    const char *p = src;
    for (uint64_t done = 0; done < n;) {
        ssize_t w = pwrite(t->state_fd, p + done, n - done, (off_t)(h->file_off + done));
        if (w <= 0)
            return tide_err(t->ctx, TIDE_E_IO, "writing '%s' to the training state file %s: %s",
                            t->g->tensors[i].name, t->state_path, w < 0 ? strerror(errno) : "no progress");
        done += (uint64_t)w;
    }
    return TIDE_OK;
}

/* Reads tensor i's home (not its warm copy) into dst. */
static tide_status read_home(tide_trainer *t, int i, void *dst) {
    train_home *h = &t->home[i];
    uint64_t n = t->g->tensors[i].nbytes;
    if (!h->ssd) {
        memcpy(dst, h->host, n);
        return TIDE_OK;
    }
    char *p = dst;
    for (uint64_t done = 0; done < n;) {
        ssize_t r = pread(t->state_fd, p + done, n - done, (off_t)(h->file_off + done));
        if (r <= 0)
            return tide_err(t->ctx, TIDE_E_IO, "reading '%s' from the training state file %s: %s",
                            t->g->tensors[i].name, t->state_path, r < 0 ? strerror(errno) : "unexpected end");
        done += (uint64_t)r;
    }
    return TIDE_OK;
}

/* The initial value of state tensor i into buf (its bytes): the parameter
 * from the checkpoint or the resumed state, a master widened from it, zero
 * moments. */
static tide_status shard_initial(tide_trainer *t, int i, int w, void *buf);

static tide_status initial_value(tide_trainer *t, int i, void *buf) {
    const tide_tensor *T = &t->g->tensors[i];
    tide_train_class c = tide_train_tensor_class(t->g, i);
    int whole;
    if (train_is_shard(t, i, &whole)) return shard_initial(t, i, whole, buf);
    if (t->resume_dir) return train_resume_value(t, i, buf);
    if (c == TIDE_TRAIN_MOMENT) {
        memset(buf, 0, T->nbytes);
        return TIDE_OK;
    }
    if (train_is_adapter(t, i)) return train_lora_initial(t, i, buf);
    /* a block of a parameter (vocabulary blocks) is a range of its home */
    uint64_t off = 0;
    const char *home = tide_graph_tensor_home(t->g, i, &off);
    const char *pname = c == TIDE_TRAIN_MASTER ? home + strlen("master.") : home;
    tide_tensor_info ti;
    if (tide_checkpoint_get(t->ck, pname, &ti))
        return tide_err(t->ctx, TIDE_E_FORMAT, "the checkpoint has no parameter '%s'", pname);
    size_t es = tide_dtype_size(ti.dtype), n = (size_t)tide_tensor_numel(T);
    uint64_t elem0 = off / tide_dtype_size(T->dtype);
    if ((elem0 + n) * es > ti.nbytes)
        return tide_err(t->ctx, TIDE_E_FORMAT, "'%s' runs past its checkpoint tensor '%s'", T->name, pname);
    const char *src = (const char *)ti.data + elem0 * es;
    if (c == TIDE_TRAIN_MASTER) tide_convert_to_f32(src, ti.dtype, buf, n);
    else memcpy(buf, src, T->nbytes);
    return TIDE_OK;
}

/* The initial value of a rank's shard i of parameter w (its rows of the
 * parameter, of the master widened from it, or zero moments); the rows a
 * short last shard lacks are zero. */
static tide_status shard_initial(tide_trainer *t, int i, int w, void *buf) {
    const tide_tensor *T = &t->g->tensors[i], *W = &t->g->tensors[w];
    memset(buf, 0, T->nbytes);
    tide_train_class c = tide_train_tensor_class(t->g, i);
    /* a master or moment: its rows of the resumed state's whole */
    if (c != TIDE_TRAIN_PARAM && t->resume_dir) return train_resume_value(t, i, buf);
    if (c == TIDE_TRAIN_MOMENT) return TIDE_OK;
    int64_t rows = W->ndim ? W->shape[0] : 1, r0, n;
    tide_comm_shard_rows(rows, t->o.step.ranks, t->rank, &r0, &n);
    uint64_t row = W->nbytes / (uint64_t)(rows ? rows : 1);
    void *full = tide_malloc_aligned((size_t)(W->nbytes ? W->nbytes : 1), 4096);
    if (!full) return tide_err(t->ctx, TIDE_E_NOMEM, "out of memory for '%s'", W->name);
    tide_status st = initial_value(t, w, full);
    const char *src = (const char *)full + (uint64_t)r0 * row;
    if (!st && c == TIDE_TRAIN_MASTER)
        tide_convert_to_f32(src, W->dtype, buf, (size_t)((uint64_t)n * row / tide_dtype_size(W->dtype)));
    else if (!st)
        memcpy(buf, src, (size_t)((uint64_t)n * row));
    tide_free_aligned(full);
    return st;
}

/* Allocates the host homes of p and fills every home with its initial value. */
static tide_status make_homes(tide_trainer *t, const tide_plan *p) {
    tide_status st = make_state_file(t, p);
    if (st) return st;
    uint64_t biggest = 0;
    for (int i = 0; i < t->g->n_tensors; i++) {
        const tide_tensor *T = &t->g->tensors[i];
        if (T->role == TIDE_ROLE_OUTPUT && tide_train_tensor_class(t->g, i) == TIDE_TRAIN_GRAD) {
            /* grads_out: the gradients the caller reads after a step */
            if (!(t->home[i].host = tide_malloc_aligned((size_t)T->nbytes, 4096)))
                return tide_err(t->ctx, TIDE_E_NOMEM, "out of memory for '%s'", T->name);
            continue;
        }
        if (T->role != TIDE_ROLE_STATE) continue;
        train_home *h = &t->home[i];
        biggest = TIDE_MAX(biggest, T->nbytes);
        if (h->ssd) continue;
        /* pinned where transfers read it (a GPU), else page-aligned memory */
        if (!t->be->vt->device_is_host && t->be->vt->host_alloc &&
            t->be->vt->host_alloc(t->be, (size_t)T->nbytes, &h->host) == TIDE_OK)
            h->pinned = true;
        else if (!(h->host = tide_malloc_aligned((size_t)(T->nbytes ? T->nbytes : 1), 4096)))
            return tide_err(t->ctx, TIDE_E_NOMEM, "out of memory for the %llu-byte home of '%s'",
                            (unsigned long long)T->nbytes, T->name);
        t->state_bytes_host += T->nbytes;
    }
    void *buf = tide_malloc_aligned((size_t)(biggest ? biggest : 1), 4096);
    if (!buf) return tide_err(t->ctx, TIDE_E_NOMEM, "out of memory filling the training state");
    int n = tide_trainer_n_tensors(t), k = 0;
    for (int i = 0; !st && i < t->g->n_tensors; i++) {
        if (t->g->tensors[i].role != TIDE_ROLE_STATE) continue;
        train_home *h = &t->home[i];
        void *dst = h->ssd ? buf : h->host;
        if (!(st = initial_value(t, i, dst)) && h->ssd) st = write_home(t, i, dst);
        tide_progress(t->ctx, "preparing", (uint64_t)++k, (uint64_t)n);
    }
    tide_free_aligned(buf);
    return st;
}

/* Copies every warm tensor from its home into the arena. */
static tide_status upload_warm(tide_trainer *t) {
    tide_backend *be = t->be;
    for (int i = 0; i < t->g->n_tensors; i++) {
        if (!t->warm || t->warm[i] == TIDE_HOME) continue;
        tide_status st = be->vt->to_device(be, NULL, (char *)t->arena + t->warm[i], t->home[i].host,
                                           t->g->tensors[i].nbytes);
        if (st) return tide_err(t->ctx, st, "cannot upload the training state: %s", tide_ctx_last_error(be->ctx));
    }
    if (be->vt->synchronize) return be->vt->synchronize(be);
    return TIDE_OK;
}

tide_runner_opts train_runner_opts(const tide_trainer *t, bool timed) {
    bool async = tide_backend_has_events(t->be) && !t->o.sync_issue;
    return (tide_runner_opts){.exec = {.ssd_dirs = t->ssd_dirs, .arena = t->arena,
                                       .arena_bytes = t->arena_bytes, .sync_issue = t->o.sync_issue,
                                       .timed = timed || t->off.timeline || !async}};
}

tide_status train_bind_runner(tide_trainer *t, tide_runner *run, const char *state_path) {
    tide_status st = TIDE_OK;
    const tide_graph *rg = tide_runner_graph(run);
    for (int i = 0; !st && i < rg->n_tensors; i++) {
        if (rg->tensors[i].role == TIDE_ROLE_OUTPUT && t->home[i].host) {
            st = tide_runner_bind_tensor(run, i, t->home[i].host);
            continue;
        }
        if (rg->tensors[i].role != TIDE_ROLE_STATE) continue;
        train_home *h = &t->home[i];
        st = h->ssd ? tide_runner_bind_file(run, i, state_path, h->file_off) : tide_runner_bind_tensor(run, i, h->host);
    }
    if (!st && t->o.step.lora_r > 0) st = train_lora_bind(t, run);
    if (!st) st = tide_runner_bind(run, "pos", t->pos);
    if (!st) st = tide_runner_bind(run, "hyper", t->hyper);
    if (!st) st = tide_runner_bind(run, "grad_sumsq", &t->sumsq);
    for (int m = 0; !st && m < t->o.step.accum; m++) {
        char nm[32];
        snprintf(nm, sizeof nm, "loss.%d", m);
        st = tide_runner_bind(run, nm, &t->loss[m]);
    }
    return st;
}

/* ---------------------------------------------------------------- the first step */

/* Makes t->g the step graph of tiles of tile_seqs sequences and vocab_blocks
 * vocabulary blocks; before the first step (the homes are empty, and
 * t->home is made anew). Row tiles change only TEMP, INPUT and OUTPUT
 * tensors (every persistent tensor keeps its index: they are made first);
 * vocabulary blocks change the persistent tensors too, so a resumed state is
 * looked up again. */
static tide_status retile(tide_trainer *t, int tile_seqs, int vocab_blocks) {
    if (vocab_blocks == 1) vocab_blocks = 0;
    if (tile_seqs == t->o.step.tile_seqs && vocab_blocks == t->o.step.vocab_blocks) return TIDE_OK;
    tide_llama_train_opts o = t->o.step;
    o.tile_seqs = tile_seqs;
    o.vocab_blocks = vocab_blocks;
    tide_graph *g = NULL;
    tide_status st = tide_llama_build_train(t->ctx, &t->cfg, &o, &g);
    if (st) return st;
    train_home *home = tide_calloc((size_t)g->n_tensors, sizeof *home);
    if (!home) {
        tide_graph_free(g);
        return tide_err(t->ctx, TIDE_E_NOMEM, "out of memory");
    }
    tide_free(t->home); /* empty before the first step */
    t->home = home;
    tide_graph_free(t->g);
    t->g = g;
    t->o.step = o;
    for (int m = 0; m < o.accum; m++) {
        char nm[32];
        snprintf(nm, sizeof nm, "tokens.%d", m);
        t->in_tok[m] = tide_graph_find(g, nm);
        snprintf(nm, sizeof nm, "targets.%d", m);
        t->in_tgt[m] = tide_graph_find(g, nm);
    }
    /* vocabulary blocks change the persistent tensors: a resumed state is
     * looked up in the new graph */
    return t->resume ? train_resume_rebind(t) : TIDE_OK;
}

tide_status tide_trainer_set_tiling(tide_trainer *t, int tile_seqs) {
    if (t->run) return tide_err(t->ctx, TIDE_E_INVALID, "the tiling is set before the first step");
    if (tile_seqs < 0) return tide_err(t->ctx, TIDE_E_INVALID, "tiles of %d sequences: negative", tile_seqs);
    return retile(t, tile_seqs >= t->o.step.batch ? 0 : tile_seqs, t->o.step.vocab_blocks);
}

tide_status tide_trainer_set_vocab_blocks(tide_trainer *t, int vocab_blocks) {
    if (t->run) return tide_err(t->ctx, TIDE_E_INVALID, "the vocabulary blocks are set before the first step");
    if (vocab_blocks < 0 || vocab_blocks > TIDE_VOCAB_BLOCKS_MAX)
        return tide_err(t->ctx, TIDE_E_INVALID, "%d vocabulary blocks: from 0 to %d", vocab_blocks,
                        TIDE_VOCAB_BLOCKS_MAX);
    return retile(t, t->o.step.tile_seqs, vocab_blocks);
}

int tide_trainer_tile_seqs(const tide_trainer *t) { return t->o.step.tile_seqs; }
int tide_trainer_vocab_blocks(const tide_trainer *t) { return t->o.step.vocab_blocks; }

/* The offloaded plan of a step: the budget, the tiling (t->g is rebuilt when
 * it changes), where the updates run, and the plan of *g (the runner's own
 * copy of t->g). */
static tide_status plan_offloaded(tide_trainer *t, tide_graph **gout, tide_plan **pout) {
    tide_ctx *ctx = t->ctx;
    tide_status st = TIDE_OK;
    /* the baselines run the graph as it is unless a level is forced */
    int tile = t->off.tile;
    if (tile == TIDE_TILE_AUTO && t->policy != TIDE_POLICY_TIDE) tile = TIDE_TILE_NONE;
    tide_llama_train_opts so = t->o.step;
    uint64_t b = 0;
    if (t->off.budget_kind != TIDE_BUDGET_MIN || tile == TIDE_TILE_NONE) { /* a fraction is of the graph as given */
        if ((st = resolve_budget(t, &b))) return st;
    } else {
        /* the level whose minimum is smallest, planned at that minimum */
        tide_plan_opts po = train_offload_opts(t, 0);
        tide_graph *g = NULL;
        int level = -1;
        uint64_t m = 0;
        bool all = t->optim == TRAIN_OPTIM_CPU && t->policy == TIDE_POLICY_TIDE;
        if ((st = tide_train_tiling(ctx, &t->cfg, &so, &po, all, tile, 0, &g, &level, &m))) return st;
        tide_graph_free(g);
        b = (m + 255) & ~(uint64_t)255;
        tile = level > 0 ? level : TIDE_TILE_NONE;
    }
    t->budget = b;
    tide_plan_opts po = train_offload_opts(t, b);
    /* where device memory is host memory, a host update is the same work in
     * the same place: on the device, unless the budget cannot hold it */
    train_optim_mode mode = t->be->vt->device_is_host && t->optim == TRAIN_OPTIM_AUTO &&
                            t->policy != TIDE_POLICY_ZERO_OFFLOAD ? TRAIN_OPTIM_DEVICE : t->optim;
    tide_train_planned r;
    if ((st = tide_train_plan_tiled(ctx, &t->cfg, &so, &po, mode, t->optim, tile, &r))) return st;
    if ((st = retile(t, so.tile_seqs, so.vocab_blocks))) {
        tide_train_planned_free(&r);
        return st;
    }
    tide_free(t->host_ops);
    t->host_ops = r.host_ops;
    t->optim_choice = r.oc;
    *gout = r.g;
    *pout = r.p;
    return TIDE_OK;
}

static tide_status prepare(tide_trainer *t) {
    tide_ctx *ctx = t->ctx;
    tide_plan *p = NULL;
    tide_graph *g = NULL;
    tide_status st;
    double t0 = tide_now();
    if (train_is_rank_step(&t->o.step) && !t->comm)
        return tide_err(ctx, TIDE_E_INVALID, "the step is one of %d data-parallel ranks': it needs the ranks' "
                        "communicator (tide_trainer_set_comm)", t->o.step.ranks);
    if (t->comm && t->offload) {
        /* every rank plans on rank 0's profile, with a network; refits would
         * replan each rank on its own measurements: none */
        net_defaults(&t->hw);
        if ((st = tide_comm_bcast(t->comm, ctx, &t->hw, sizeof t->hw, "the hardware profile"))) return st;
        t->off.no_refit = true;
    }
    if (t->offload) {
        st = plan_offloaded(t, &g, &p);
        if (!st && (st = t->be->vt->alloc(t->be, p->device_budget, &t->arena)))
            st = tide_err(ctx, st, "cannot allocate the device arena of %llu bytes: %s",
                          (unsigned long long)p->device_budget, tide_ctx_last_error(t->be->ctx));
    } else {
        /* the runner owns its graph: a second copy of the step graph */
        if ((st = tide_llama_build_train(ctx, &t->cfg, &t->o.step, &g))) return st;
        if (!(st = plan_resident(t, &p)) && (st = t->be->vt->alloc(t->be, (p->device_budget + 255) & ~(uint64_t)255, &t->arena)))
            st = tide_err(ctx, st, "cannot allocate the device arena of %llu bytes: %s",
                          (unsigned long long)p->device_budget, tide_ctx_last_error(t->be->ctx));
    }
    if (st) {
        tide_plan_free(p);
        tide_graph_free(g);
        return st;
    }
    if (!st && t->comm) st = tide_comm_same(t->comm, ctx, plan_hash(p), "plan of the step");
    if (st) {
        tide_plan_free(p);
        tide_graph_free(g);
        return st;
    }
    t->arena_bytes = p->device_budget;
    t->state_bytes_rank = 0;
    for (int i = 0; i < g->n_tensors; i++) {
        tide_train_class c = tide_train_tensor_class(g, i);
        if (g->tensors[i].role == TIDE_ROLE_STATE && (c == TIDE_TRAIN_MASTER || c == TIDE_TRAIN_MOMENT))
            t->state_bytes_rank += g->tensors[i].nbytes;
    }
    t->optim_choice.n_groups = 0;
    for (int i = 0; i < g->n_ops; i++) t->optim_choice.n_groups += g->ops[i].kind == TIDE_OP_ADAMW;
    /* the updates the plan runs on the host (the planner may have taken
     * zero-offload's plan: all of them) */
    train_optim_sync(g, p, &t->optim_choice);
    t->plan_s = tide_now() - t0;
    t->predicted_s = p->stats.makespan_s;
    t->peak_device = p->stats.peak_device_bytes;
    if ((st = make_homes(t, p))) {
        tide_plan_free(p);
        tide_graph_free(g);
        return st;
    }
    train_resume_close(t); /* the homes hold the resumed state now */
    /* measured where it costs nothing (synchronous issue: host clocks), or
     * where asked for (timing events on a GPU, the refit's first steps) */
    bool refit = t->offload && !t->off.no_refit;
    tide_runner_opts ro = train_runner_opts(t, refit || t->comm);
    ro.exec.comm = t->comm;
    if ((st = tide_runner_new(ctx, t->be, g, p, &ro, &t->run))) return st;
    st = train_bind_runner(t, t->run, t->state_path);
    /* the executor holds the state file open: its name is no longer needed */
    if (t->state_path) unlink(t->state_path);
    if (!st && t->warm) st = upload_warm(t);
    if (st) {
        tide_runner_free(t->run);
        t->run = NULL;
    }
    return st;
}

/* ---------------------------------------------------------------- steps */

/* Binds a step's batch and runs the step graph once. The loss is normalised
 * over the targets that are not ignored (< 0): the graph's cross-entropy is
 * scaled by 1 / (B*T*accum*N) (N ranks, 1 without), so the trainer
 * multiplies the loss, and through hyper[3] the gradients the update uses,
 * by B*T*accum*N / n, n the whole step's targets (exactly 1 when no target
 * is ignored). measure_only: hyper[3] < 0, no update (an evaluation). */
static tide_status run_graph(tide_trainer *t, const int32_t *tokens, const int32_t *targets, bool measure_only,
                             double *loss_out, int64_t *n_out, double *wall_out, tide_exec_stats *es) {
    tide_status st;
    if (t->failed)
        return tide_err(t->ctx, TIDE_E_INVALID, "an earlier step failed: the training state is not consistent");
    if (!t->run && (st = prepare(t))) {
        t->failed = true;
        return st;
    }
    const tide_llama_train_opts *so = &t->o.step;
    const size_t R = (size_t)so->batch * (size_t)so->seq;
    const int64_t V = t->cfg.vocab_size;
    int64_t n_valid = 0;
    for (size_t i = 0; i < R * (size_t)so->accum; i++) {
        if (tokens[i] < 0 || tokens[i] >= V)
            return tide_err(t->ctx, TIDE_E_RANGE, "token %d at index %zu is outside the vocabulary of %lld", tokens[i],
                            i, (long long)V);
        if (targets[i] >= V)
            return tide_err(t->ctx, TIDE_E_RANGE, "target %d at index %zu is outside the vocabulary of %lld",
                            targets[i], i, (long long)V);
        n_valid += targets[i] >= 0;
    }
    if (t->comm) { /* the whole step's targets, over every rank */
        double v = (double)n_valid;
        if ((st = tide_comm_allreduce_f64(t->comm, t->ctx, &v, 1, "the step's target count"))) {
            t->failed = true;
            return st;
        }
        n_valid = (int64_t)v;
    }
    if (!n_valid && !measure_only)
        return tide_err(t->ctx, TIDE_E_INVALID, "every target of the step is ignored (< 0): nothing to learn from");
    for (int m = 0; m < so->accum; m++) {
        if ((st = tide_runner_bind_tensor(t->run, t->in_tok[m], (void *)(tokens + (size_t)m * R))) ||
            (st = tide_runner_bind_tensor(t->run, t->in_tgt[m], (void *)(targets + (size_t)m * R))))
            return st;
    }
    double lr = tide_train_lr(&t->o, t->step);
    double k = (double)(t->step + 1);
    const size_t nr = so->ranks > 1 ? (size_t)so->ranks : 1;
    double factor = n_valid ? (double)(R * (size_t)so->accum * nr) / (double)n_valid : 0.0;
    t->hyper[0] = (float)lr;
    /* torch's step size: the f32 rate over the bias correction, in double */
    t->hyper[1] = (float)((double)t->hyper[0] / (1.0 - pow((double)so->beta1, k)));
    t->hyper[2] = (float)sqrt(1.0 - pow((double)so->beta2, k));
    t->hyper[3] = measure_only ? -1.0f : (float)factor;
    double t0 = tide_now();
    st = tide_runner_run(t->run, es);
    *wall_out = tide_now() - t0;
    if (st) {
        t->failed = true;
        return st;
    }
    t->grad_scale = measure_only ? 0.0f : t->hyper[3];
    float loss = 0;
    for (int m = 0; m < so->accum; m++) loss += t->loss[m];
    *loss_out = factor == 1.0 ? (double)loss : (double)loss * factor;
    if (t->comm) { /* the ranks' parts of the step's mean */
        double l = (double)loss * factor;
        if ((st = tide_comm_allreduce_f64(t->comm, t->ctx, &l, 1, "the step's loss"))) {
            t->failed = true;
            return st;
        }
        *loss_out = l;
    }
    *n_out = n_valid;
    return TIDE_OK;
}

tide_status tide_trainer_step(tide_trainer *t, const int32_t *tokens, const int32_t *targets, tide_train_stats *out) {
    bool first = !t->run;
    double loss, wall;
    int64_t n_valid;
    tide_exec_stats es;
    uint64_t sent0 = tide_comm_bytes_sent(t->comm);
    tide_status st = run_graph(t, tokens, targets, false, &loss, &n_valid, &wall, &es);
    if (st) return st;
    uint64_t sent = tide_comm_bytes_sent(t->comm) - sent0;
    const tide_llama_train_opts *so = &t->o.step;
    const size_t R = (size_t)so->batch * (size_t)so->seq;
    t->runs++;
    if (out) {
        double gn = sqrt((double)t->sumsq);
        *out = (tide_train_stats){
            .step = t->step, .loss = loss, .grad_norm = t->hyper[3] == 1.0f ? gn : gn * (double)t->hyper[3],
            .lr = tide_train_lr(&t->o, t->step),
            .wall_s = wall, .tokens_per_s = wall > 0 ? (double)(R * (size_t)so->accum) / wall : 0,
            .bytes_h2d = es.bytes_h2d,
            .bytes_d2h = es.bytes_d2h, .bytes_ssd_read = es.bytes_ssd_read, .bytes_ssd_write = es.bytes_ssd_write,
            .peak_device_bytes = t->peak_device, .budget_bytes = t->arena_bytes, .predicted_s = t->predicted_s,
            .plan_s = first ? t->plan_s : 0, .optimizer_groups = t->optim_choice.n_groups,
            .optimizer_host_groups = t->optim_choice.n_host,
            .predicted_device_optimizer_s = t->optim_choice.n_host ? t->optim_choice.device_makespan_s : 0,
            .refit_host_groups_before = -1, .n_targets = n_valid, .ranks = t->comm ? tide_comm_size(t->comm) : 1,
            .rank = t->rank, .net_bytes = sent, .state_bytes_this_rank = t->state_bytes_rank};
        if (t->comm) {
            out->tokens_per_s *= (double)out->ranks;
            net_overlap(tide_runner_plan(t->run), tide_runner_timeline(t->run), &out->net_s, &out->net_overlap_s);
        }
    }
    train_refit_after_step(t, wall, out);
    t->step++;
    return TIDE_OK;
}

tide_status tide_trainer_eval(tide_trainer *t, const int32_t *tokens, const int32_t *targets, double *loss,
                              int64_t *n_targets) {
    double l = 0, wall;
    int64_t n = 0;
    tide_exec_stats es;
    tide_status st = run_graph(t, tokens, targets, true, &l, &n, &wall, &es);
    if (st) return st;
    if (loss) *loss = n ? l : 0.0;
    if (n_targets) *n_targets = n;
    return TIDE_OK;
}

/* ---------------------------------------------------------------- reading */

tide_status train_read_tensor(tide_trainer *t, int i, void *dst) {
    if (t->run && t->warm && t->warm[i] != TIDE_HOME) {
        tide_status st = t->be->vt->to_host(t->be, NULL, dst, (char *)t->arena + t->warm[i], t->g->tensors[i].nbytes);
        if (!st && t->be->vt->synchronize) st = t->be->vt->synchronize(t->be);
        if (st) return tide_err(t->ctx, st, "cannot copy '%s' out of the device: %s", t->g->tensors[i].name,
                                tide_ctx_last_error(t->be->ctx));
        return TIDE_OK;
    }
    if (!t->run) return initial_value(t, i, dst);
    return read_home(t, i, dst);
}

/* A gradient as the last step's update used it: the graph's, of the loss
 * over B*T*accum*N rows, times the step's factor (1 when no target was
 * ignored). */
static void scale_grad(const tide_trainer *t, int i, void *dst) {
    const tide_tensor *x = &t->g->tensors[i];
    if (x->role != TIDE_ROLE_OUTPUT || x->dtype != TIDE_F32 || t->grad_scale == 0.0f || t->grad_scale == 1.0f ||
        tide_train_tensor_class(t->g, i) != TIDE_TRAIN_GRAD)
        return;
    float *f = dst;
    for (uint64_t k = 0; k < x->nbytes / sizeof *f; k++) f[k] *= t->grad_scale;
}

tide_status tide_trainer_read(tide_trainer *t, const char *name, void *dst, uint64_t nbytes) {
    int i = tide_graph_find(t->g, name);
    if (i < 0) {
        /* a parameter, its state or its gradient in vocabulary blocks: the
         * blocks "NAME.v0", "NAME.v1", ... in order */
        char bn[300];
        uint64_t at = 0;
        int k = 0;
        for (;; k++) {
            snprintf(bn, sizeof bn, "%s.v%d", name, k);
            int j = tide_graph_find(t->g, bn);
            if (j < 0) break;
            const tide_tensor *B = &t->g->tensors[j];
            bool bgrad = B->role == TIDE_ROLE_OUTPUT && tide_train_tensor_class(t->g, j) == TIDE_TRAIN_GRAD;
            if (B->role != TIDE_ROLE_STATE && !bgrad) break;
            if (bgrad && !t->run) return tide_err(t->ctx, TIDE_E_INVALID, "'%s': no step has been taken", name);
            if (at + B->nbytes > nbytes)
                return tide_err(t->ctx, TIDE_E_INVALID, "'%s' has more than %llu bytes", name,
                                (unsigned long long)nbytes);
            tide_status st = train_read_tensor(t, j, (char *)dst + at);
            if (st) return st;
            scale_grad(t, j, (char *)dst + at);
            at += B->nbytes;
        }
        if (k > 0 && at != nbytes)
            return tide_err(t->ctx, TIDE_E_INVALID, "'%s' has %llu bytes, not %llu", name, (unsigned long long)at,
                            (unsigned long long)nbytes);
        if (k > 0) return TIDE_OK;
    }
    bool grad = i >= 0 && t->g->tensors[i].role == TIDE_ROLE_OUTPUT && tide_train_tensor_class(t->g, i) == TIDE_TRAIN_GRAD;
    if (i < 0 || (t->g->tensors[i].role != TIDE_ROLE_STATE && !grad))
        return tide_err(t->ctx, TIDE_E_NOT_FOUND, "no training tensor '%s'", name);
    if (grad && !t->run) return tide_err(t->ctx, TIDE_E_INVALID, "'%s': no step has been taken", name);
    if (nbytes != t->g->tensors[i].nbytes)
        return tide_err(t->ctx, TIDE_E_INVALID, "'%s' has %llu bytes, not %llu", name,
                        (unsigned long long)t->g->tensors[i].nbytes, (unsigned long long)nbytes);
    tide_status st = train_read_tensor(t, i, dst);
    if (!st) scale_grad(t, i, dst);
    return st;
}

tide_status tide_trainer_write_trace(tide_trainer *t, const char *json_path, const char *svg_path) {
    const tide_sim_event *tl = t->run ? tide_runner_timeline(t->run) : NULL;
    if (!tl)
        return tide_err(t->ctx, TIDE_E_INVALID, "no measured step to trace (on a GPU it is measured only when "
                        "asked for: tide_offload_opts.timeline)");
    const tide_plan *p = tide_runner_plan(t->run);
    tide_status st = TIDE_OK;
    if (json_path && (st = tide_trace_write(p, tl, p->n_ins, json_path))) return st;
    if (svg_path) {
        tide_sim_result sim;
        if ((st = tide_simulate(p, t->offload ? &t->hw : tide_session_resident_hw(), &sim))) return st;
        const tide_sim_event *tls[2] = {tl, sim.events};
        const char *labels[2] = {"measured", "predicted"};
        st = tide_trace_svg_write(p, tls, labels, 2, svg_path);
        tide_sim_result_free(&sim);
    }
    return st;
}
