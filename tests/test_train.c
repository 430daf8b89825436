/*
 * test_train.c - training end to end through the public API (tide.h):
 *
 *   - the learning-rate schedule and the step graph's checks;
 *   - against PyTorch: the committed fixtures of scripts/make_train_fixtures.py
 *     (tests/fixtures/train/<name>: LlamaForCausalLM + torch.optim.AdamW for
 *     10 steps with warmup + cosine, clipping and accumulation) give per-step
 *     losses and gradient norms, the gradients of step 1 and the parameters,
 *     master weights and moments after the last step; tide's resident CPU
 *     trainer matches them within the tolerances below;
 *   - bit-identity: offloaded steps (every policy, checkpoint-layer's
 *     recomputed activations and zero-offload's host updates included; 50%, 25% and the minimum
 *     budget; training state homed on host and on SSD) against the
 *     unconstrained run, every step's loss and gradient norm and every
 *     persistent tensor at the end, bit for bit;
 *   - resume: saving after some steps and resuming in a new trainer continues
 *     bit for bit as the run that never stopped; the saved checkpoint loads as
 *     a model whose logits give the loss the trainer computes next.
 *
 * Tolerances against PyTorch (f32 both sides; they differ in summation order
 * and libm rounding only; tests/fixtures/train/README.md has the gaps PyTorch
 * itself shows between f32 and f64 runs of these fixtures):
 *   - losses and gradient norms: 1e-5 relative; whether a step clipped: the
 *     same (every fixture norm is at least 1% away from the limit);
 *   - step-1 gradients: |tide - torch| <= 1e-5 * max|torch| of the tensor,
 *     elementwise, and exactly 0 where torch's is (embedding rows of ids
 *     absent from the step);
 *   - after 10 steps: f32 parameters and masters within 1e-4 absolute, bf16
 *     parameters within one bf16 ulp (at most 1% of them a ulp apart),
 *     moments within 1e-3 of their tensor's largest; AdamW turns the sign of
 *     a gradient that is rounding noise into a full +-lr step, so up to 16
 *     elements per tensor may exceed these, none by more than twice the
 *     summed learning rates.
 *
 * What it proves: training against PyTorch on three committed fixtures
 * (`scripts/make_train_fixtures.py`: `LlamaForCausalLM` +
 * `torch.optim.AdamW`, 10 steps, warmup and cosine, clipping, 2
 * micro-batches; f32 GQA, bf16 GQA with f32 masters, f32 tied): per-step loss
 * and gradient norm within 1e-5 relative, the same steps clipped, step-1
 * gradients within 1e-5 of each tensor's largest (exact zeros kept), final
 * parameters within 1e-4 (bf16: one ulp on at most 1%), moments within 1e-3
 * of their largest; offloaded steps bit-identical to the unconstrained run
 * for every policy (checkpoint-layer's recomputed activations and
 * zero-offload's host updates included) at 50%, 25% and the minimum budget
 * with the training state homed on host and on SSD; tide steps that recompute
 * (a 20 MB/s link; more COMPUTEs in the step's trace than ops) bit-identical;
 * resume after save bit-identical to the uninterrupted run, and the saved
 * checkpoint's logits (through `tide_model_forward`) giving the loss the
 * trainer computes next; row tiles: the three fixtures trained in tiles of
 * one sequence still match PyTorch within the same tolerances, the tiled
 * graph's shapes (a tile's activations, a loss per micro-batch added over its
 * tiles, every persistent tensor at its untiled index), the tide policy
 * tiling by itself at its minimum (below the untiled one) and between the two
 * minimums (state on host and on SSD), `--tile none` refused there, the
 * baselines tiled only when a level is forced; every tiled run bit-identical
 * to the resident run of the same tiles; vocabulary blocks: the graph's
 * blocks (names, homes at their rows, the same bytes of state and gradients
 * as whole, the loss's op counts, a tied head sharing the embedding's
 * blocks), the three fixtures trained with the embedding and the head in 2 or
 * 3 uneven blocks (with row tiles or without) still matching PyTorch,
 * gradients gathered from the blocks; the minimum with vocabulary blocks
 * below the minimum of row tiles alone, bit for bit; save and resume of a run
 * whose blocks were chosen at its first step (after the resume) and of one in
 * 3 blocks, equal to the uninterrupted run, the checkpoint whole (it runs as
 * a model and resumes an unblocked trainer).
 */
#include "tide.h"
#include "graph/graph.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

/* ---------------------------------------------------------------- helpers */

static char *read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    if (b) b[n] = 0;
    fclose(f);
    return b;
}

/* A safetensors file mapped read-only (tensors by name). */
typedef struct stfile {
    unsigned char *map;
    size_t size;
    cJSON *hdr;
    uint64_t data;
} stfile;

static int st_open(stfile *s, const char *path) {
    memset(s, 0, sizeof *s);
    int fd = open(path, O_RDONLY);
    if (fd < 0) return -1;
    struct stat sb;
    fstat(fd, &sb);
    s->size = (size_t)sb.st_size;
    s->map = mmap(NULL, s->size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (s->map == MAP_FAILED) return -1;
    uint64_t hl;
    memcpy(&hl, s->map, 8);
    s->hdr = cJSON_ParseWithLength((const char *)s->map + 8, (size_t)hl);
    s->data = 8 + hl;
    return s->hdr ? 0 : -1;
}

static void st_close(stfile *s) {
    if (s->map && s->map != MAP_FAILED) munmap(s->map, s->size);
    cJSON_Delete(s->hdr);
}

/* Tensor `name` as f32 values (F32 or BF16 in the file), malloc'd; *n elements. */
static float *st_get(const stfile *s, const char *name, size_t *n) {
    cJSON *e = cJSON_GetObjectItemCaseSensitive(s->hdr, name);
    if (!e) return NULL;
    const char *dt = cJSON_GetObjectItem(e, "dtype")->valuestring;
    cJSON *off = cJSON_GetObjectItem(e, "data_offsets");
    uint64_t a = (uint64_t)cJSON_GetArrayItem(off, 0)->valuedouble, b = (uint64_t)cJSON_GetArrayItem(off, 1)->valuedouble;
    const unsigned char *p = s->map + s->data + a;
    size_t es = !strcmp(dt, "F32") ? 4 : 2;
    *n = (size_t)((b - a) / es);
    float *v = malloc(*n * sizeof *v + 1);
    for (size_t i = 0; i < *n; i++) {
        if (es == 4) memcpy(&v[i], p + 4 * i, 4);
        else {
            uint32_t u = (uint32_t)(p[2 * i] | (p[2 * i + 1] << 8)) << 16;
            memcpy(&v[i], &u, 4);
        }
    }
    return v;
}

static float bf16f(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* A trainer tensor as f32 values (f32 or bf16 in the trainer), malloc'd. */
/* The dtype and bytes of training state `name`, whole or in vocabulary
 * blocks ("NAME.vK", summed). */
static bool tr_size(tide_trainer *t, const char *name, tide_dtype *dt, uint64_t *nb) {
    int k = tide_trainer_n_tensors(t);
    size_t len = strlen(name);
    bool found = false;
    *nb = 0;
    for (int i = 0; i < k; i++) {
        uint64_t b = 0;
        tide_dtype d = TIDE_F32;
        const char *nm = tide_trainer_tensor(t, i, &d, &b);
        if (!strcmp(nm, name)) {
            *nb = b, *dt = d;
            return true;
        }
        if (!strncmp(nm, name, len) && !strncmp(nm + len, ".v", 2)) {
            *nb += b, *dt = d;
            found = true;
        }
    }
    return found;
}

static float *tr_get(tide_trainer *t, const char *name, size_t *n) {
    tide_dtype dt = TIDE_F32;
    uint64_t nb = 0;
    bool found = tr_size(t, name, &dt, &nb);
    if (!found) { /* a gradient (grads_out): f32 of the parameter's elements */
        found = !strncmp(name, "grad.", 5) && tr_size(t, name + strlen("grad."), &dt, &nb);
        if (!found) return NULL;
        nb = nb / tide_dtype_size(dt) * 4;
        dt = TIDE_F32;
    }
    void *raw = malloc(nb);
    assert_int_equal(tide_trainer_read(t, name, raw, nb), TIDE_OK);
    *n = nb / tide_dtype_size(dt);
    float *v = malloc(*n * sizeof *v + 1);
    for (size_t i = 0; i < *n; i++) v[i] = dt == TIDE_F32 ? ((float *)raw)[i] : bf16f(((uint16_t *)raw)[i]);
    free(raw);
    return v;
}

static const char *fixtures(void) {
    const char *f = getenv("TIDE_FIXTURES");
    return f ? f : "tests/fixtures";
}

/* ---------------------------------------------------------------- schedule and graph */

static void test_lr_schedule(void **state) {
    (void)state;
    tide_trainer_opts o = {.lr = 1e-3};
    assert_true(tide_train_lr(&o, 0) == 1e-3 && tide_train_lr(&o, 1000) == 1e-3);
    o.warmup = 4;
    assert_true(fabs(tide_train_lr(&o, 0) - 0.25e-3) < 1e-15);
    assert_true(fabs(tide_train_lr(&o, 3) - 1e-3) < 1e-15);
    assert_true(tide_train_lr(&o, 4) == 1e-3);
    o.cosine = true;
    o.min_lr = 1e-4;
    o.total_steps = 14;
    assert_true(fabs(tide_train_lr(&o, 4) - 1e-3) < 1e-15);                  /* decay starts at lr */
    assert_true(fabs(tide_train_lr(&o, 9) - 0.55e-3) < 1e-12);                /* half way */
    assert_true(fabs(tide_train_lr(&o, 14) - 1e-4) < 1e-15);                  /* ends at min_lr */
    assert_true(tide_train_lr(&o, 100) == tide_train_lr(&o, 14));
}

static tide_llama_config tiny_cfg(tide_dtype dt, bool tied, int kv) {
    tide_llama_config c = {.hidden_size = 64, .intermediate_size = 128, .num_hidden_layers = 2,
                           .num_attention_heads = 4, .num_key_value_heads = kv, .vocab_size = 96,
                           .max_position_embeddings = 32, .rms_norm_eps = 1e-5f, .rope_theta = 10000.f,
                           .tie_word_embeddings = tied, .dtype = dt};
    snprintf(c.name, sizeof c.name, "tiny");
    return c;
}

static tide_llama_train_opts step_opts(int B, int T, int A) {
    return (tide_llama_train_opts){.batch = B, .seq = T, .accum = A, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                                   .weight_decay = 0.1f, .grad_clip = 1.0f};
}

static void test_graph(void **state) {
    (void)state;
    tide_ctx *ctx = tide_ctx_new();
    for (int v = 0; v < 4; v++) {
        tide_llama_config c = tiny_cfg(v & 1 ? TIDE_BF16 : TIDE_F32, v & 2, v & 2 ? 4 : 2);
        tide_llama_train_opts o = step_opts(2, 8, 1 + v % 3);
        tide_graph *g = NULL;
        assert_int_equal(tide_llama_build_train(ctx, &c, &o, &g), TIDE_OK);
        /* per parameter: moments, a master when 16-bit; a head unless tied */
        assert_true(tide_graph_find(g, "exp_avg_sq.model.layers.1.mlp.down_proj.weight") >= 0);
        assert_int_equal(tide_graph_find(g, "master.model.norm.weight") >= 0, c.dtype == TIDE_BF16);
        assert_int_equal(tide_graph_find(g, "lm_head.weight") >= 0, !c.tie_word_embeddings);
        assert_true(tide_graph_find(g, "loss.0") >= 0 && tide_graph_find(g, "grad_sumsq") >= 0);
        uint64_t by[TIDE_TRAIN_CLASS_COUNT] = {0};
        for (int t = 0; t < tide_graph_n_tensors(g); t++) by[tide_train_tensor_class(g, t)] += tide_graph_tensor_bytes(g, t);
        /* two f32 moments per parameter element; a gradient per element */
        uint64_t n = tide_llama_config_params(&c);
        assert_int_equal(by[TIDE_TRAIN_MOMENT], 8 * n);
        assert_int_equal(by[TIDE_TRAIN_GRAD], 4 * n);
        assert_int_equal(by[TIDE_TRAIN_MASTER], c.dtype == TIDE_BF16 ? 4 * n : 0);
        tide_graph_free(g);
    }
    /* row tiles: levels halve the sequences per tile down to one, then
     * split the vocabulary in 2, 4, ... blocks, up to TIDE_TILE_LEVELS - 1 */
    {
        static const int want[][TIDE_TILE_LEVELS][2] = {
            {{8, 0}, {4, 0}, {2, 0}, {1, 0}, {1, 2}, {1, 4}, {1, 8}},
            {{5, 0}, {3, 0}, {2, 0}, {1, 0}, {1, 2}, {1, 4}, {1, 8}},
            {{2, 0}, {1, 0}, {1, 2}, {1, 4}, {1, 8}, {1, 16}, {1, 32}},
            {{1, 0}, {0, 2}, {0, 4}, {0, 8}, {0, 16}, {0, 32}, {0, 64}}};
        for (int i = 0; i < 4; i++) {
            tide_llama_train_opts o = step_opts(want[i][0][0], 8, 1);
            assert_true(tide_llama_train_tile_level(&o, 0));
            assert_int_equal(o.tile_seqs, 0);
            assert_int_equal(o.vocab_blocks, 0);
            for (int k = 1; k < TIDE_TILE_LEVELS; k++) {
                assert_true(tide_llama_train_tile_level(&o, k));
                assert_int_equal(o.tile_seqs, want[i][k][0]);
                assert_int_equal(o.vocab_blocks, want[i][k][1]);
            }
            assert_false(tide_llama_train_tile_level(&o, TIDE_TILE_LEVELS));
        }
        /* batch 4 in tiles of 3 and 1: every activation per tile, the loss
         * adding up over the tiles, the same parameters as untiled */
        tide_llama_config c = tiny_cfg(TIDE_BF16, false, 2);
        tide_llama_train_opts o = step_opts(4, 8, 2);
        tide_graph *g0 = NULL, *g = NULL;
        assert_int_equal(tide_llama_build_train(ctx, &c, &o, &g0), TIDE_OK);
        o.tile_seqs = 3;
        assert_int_equal(tide_llama_build_train(ctx, &c, &o, &g), TIDE_OK);
        assert_int_equal(tide_graph_tensor_bytes(g, tide_graph_find(g, "mb1.l1.g.t0")), 3 * 8 * 128 * 4);
        assert_int_equal(tide_graph_tensor_bytes(g, tide_graph_find(g, "mb1.l1.g.t1")), 1 * 8 * 128 * 4);
        assert_true(tide_graph_find(g, "mb0.l0.g") < 0 && tide_graph_find(g, "mb0.l0.g.t2") < 0);
        for (int t = 0; t < tide_graph_n_tensors(g0); t++)
            if (tide_train_tensor_class(g0, t) != TIDE_TRAIN_ACT && tide_train_tensor_class(g0, t) != TIDE_TRAIN_INPUT)
                assert_int_equal(tide_graph_find(g, tide_graph_tensor_name(g0, t)), t); /* same index */
        int n_ce = 0, n_five = 0;
        for (int i = 0; i < tide_graph_n_ops(g); i++) {
            const tide_op *op = &g->ops[i];
            if (op->kind != TIDE_OP_CROSS_ENTROPY) continue;
            n_ce++;
            n_five += op->n_in == 5;
        }
        assert_int_equal(n_ce, 4);   /* 2 tiles x 2 micro-batches */
        /* each op's micro-batch: the one whose "mbM." tensors it touches;
         * the optimizer's ops none */
        bool opt = false;
        int per_mb[2] = {0};
        for (int i = 0; i < tide_graph_n_ops(g); i++) {
            const tide_op *op = &g->ops[i];
            opt = opt || op->kind == TIDE_OP_SUMSQ;
            if (opt) {
                assert_int_equal(op->micro_batch, -1);
                continue;
            }
            assert_true(op->micro_batch == 0 || op->micro_batch == 1);
            per_mb[op->micro_batch]++;
            for (int j = 0; j < op->n_in + op->n_out; j++) {
                const char *nm = tide_graph_tensor_name(g, j < op->n_in ? op->in[j] : op->out[j - op->n_in]);
                if (!strncmp(nm, "mb", 2) && nm[2] >= '0' && nm[2] <= '9' && nm[3] == '.')
                    assert_int_equal(nm[2] - '0', op->micro_batch);
            }
        }
        assert_true(opt && per_mb[0] > 0 && per_mb[0] == per_mb[1]);
        assert_int_equal(n_five, 2); /* each micro-batch's second tile adds into its loss */
        tide_graph_free(g0);
        tide_graph_free(g);
        o.tile_seqs = -1;
        assert_int_equal(tide_llama_build_train(ctx, &c, &o, &g), TIDE_E_INVALID);
    }
    /* vocabulary blocks: 3 blocks of the embedding and the head (a tied head
     * shares the embedding's), each homed at its rows; per tile every
     * block's CE_STATS (the last writing the loss) then CE_BLOCK; the state
     * and gradients the same bytes as whole */
    for (int tied = 0; tied < 2; tied++) {
        tide_llama_config c = tiny_cfg(TIDE_BF16, tied, 2);
        tide_llama_train_opts o = step_opts(2, 8, 2);
        tide_graph *g0 = NULL, *g = NULL;
        assert_int_equal(tide_llama_build_train(ctx, &c, &o, &g0), TIDE_OK);
        o.tile_seqs = 1;
        o.vocab_blocks = 3;
        assert_int_equal(tide_llama_build_train(ctx, &c, &o, &g), TIDE_OK);
        const int64_t D = c.hidden_size, V = c.vocab_size;
        assert_true(tide_graph_find(g, "model.embed_tokens.weight") < 0);
        for (int k = 0; k < 3; k++) {
            char nm[96];
            uint64_t off = 1;
            int64_t v0 = V * k / 3, v1 = V * (k + 1) / 3;
            snprintf(nm, sizeof nm, "model.embed_tokens.weight.v%d", k);
            int t = tide_graph_find(g, nm);
            assert_true(t >= 0);
            assert_string_equal(tide_graph_tensor_home(g, t, &off), "model.embed_tokens.weight");
            assert_int_equal(off, (uint64_t)(v0 * D * 2));
            assert_int_equal(tide_graph_tensor_bytes(g, t), (uint64_t)((v1 - v0) * D * 2));
            snprintf(nm, sizeof nm, "exp_avg_sq.model.embed_tokens.weight.v%d", k);
            t = tide_graph_find(g, nm);
            assert_string_equal(tide_graph_tensor_home(g, t, &off), "exp_avg_sq.model.embed_tokens.weight");
            assert_int_equal(off, (uint64_t)(v0 * D * 4));
            snprintf(nm, sizeof nm, "lm_head.weight.v%d", k);
            assert_int_equal(tide_graph_find(g, nm) >= 0, !tied);
        }
        uint64_t by0[TIDE_TRAIN_CLASS_COUNT] = {0}, by[TIDE_TRAIN_CLASS_COUNT] = {0};
        for (int t = 0; t < tide_graph_n_tensors(g0); t++) by0[tide_train_tensor_class(g0, t)] += tide_graph_tensor_bytes(g0, t);
        for (int t = 0; t < tide_graph_n_tensors(g); t++) by[tide_train_tensor_class(g, t)] += tide_graph_tensor_bytes(g, t);
        for (int k = TIDE_TRAIN_PARAM; k <= TIDE_TRAIN_GRAD; k++) assert_int_equal(by[k], by0[k]);
        int n_stats = 0, n_loss = 0, n_block = 0, n_ce = 0, n_adamw = 0, n_adamw0 = 0;
        for (int i = 0; i < tide_graph_n_ops(g); i++) {
            const tide_op *op = &g->ops[i];
            n_stats += op->kind == TIDE_OP_CE_STATS;
            n_loss += op->kind == TIDE_OP_CE_STATS && op->n_out == 2;
            n_block += op->kind == TIDE_OP_CE_BLOCK;
            n_ce += op->kind == TIDE_OP_CROSS_ENTROPY;
            n_adamw += op->kind == TIDE_OP_ADAMW;
        }
        for (int i = 0; i < tide_graph_n_ops(g0); i++) n_adamw0 += g0->ops[i].kind == TIDE_OP_ADAMW;
        assert_int_equal(n_ce, 0);
        assert_int_equal(n_stats, 3 * 2 * 2); /* 3 blocks x 2 tiles x 2 micro-batches */
        assert_int_equal(n_loss, 2 * 2);
        assert_int_equal(n_block, 3 * 2 * 2);
        assert_int_equal(n_adamw, n_adamw0 + 2 * (tied ? 1 : 2)); /* a whole one becomes 3 */
        tide_graph_free(g0);
        tide_graph_free(g);
        o.vocab_blocks = TIDE_VOCAB_BLOCKS_MAX + 1;
        assert_int_equal(tide_llama_build_train(ctx, &c, &o, &g), TIDE_E_INVALID);
    }
    tide_llama_config c = tiny_cfg(TIDE_F32, false, 2);
    tide_graph *g = NULL;
    tide_llama_train_opts o = step_opts(2, 33, 1);
    assert_int_equal(tide_llama_build_train(ctx, &c, &o, &g), TIDE_E_INVALID);
    assert_non_null(strstr(tide_ctx_last_error(ctx), "max_position_embeddings"));
    o = step_opts(0, 8, 1);
    assert_int_equal(tide_llama_build_train(ctx, &c, &o, &g), TIDE_E_INVALID);
    o = step_opts(1, 8, 1);
    o.beta2 = 1.0f;
    assert_int_equal(tide_llama_build_train(ctx, &c, &o, &g), TIDE_E_INVALID);
    assert_null(g);
    /* LoRA: the head (and a tied embedding) frozen: no op writes its
     * gradient, the cross-entropy's frozen forms (no dw output), whole and
     * in vocabulary blocks, tied and not */
    for (int v = 0; v < 4; v++) {
        const bool tied = v & 1, blocks = v & 2;
        tide_llama_config cl = tiny_cfg(TIDE_F32, tied, 2);
        o = step_opts(2, 8, 1);
        o.lora_r = 2, o.lora_alpha = 4;
        o.vocab_blocks = blocks ? 3 : 0;
        assert_int_equal(tide_llama_build_train(ctx, &cl, &o, &g), TIDE_OK);
        int n_ce = 0;
        for (int i = 0; i < tide_graph_n_ops(g); i++) {
            const tide_op *op = &g->ops[i];
            for (int j = 0; j < op->n_out; j++) {
                const char *nm = tide_graph_tensor_name(g, op->out[j]);
                if (!strncmp(nm, "grad.lm_head", 12) || !strncmp(nm, "grad.model.embed_tokens", 23))
                    fail_msg("LoRA step (tied %d, blocks %d): %s writes '%s'", tied, blocks, tide_op_name(op->kind),
                             nm);
            }
            if (op->kind == TIDE_OP_CROSS_ENTROPY) n_ce++, assert_int_equal(op->n_out, 2);
            if (op->kind == TIDE_OP_CE_BLOCK) n_ce++, assert_int_equal(op->n_out, 1);
        }
        assert_int_equal(n_ce, blocks ? 3 : 1);
        tide_graph_free(g);
        g = NULL;
    }
    tide_ctx_free(ctx);
}

/* ---------------------------------------------------------------- against PyTorch */

typedef struct fixture {
    char dir[1024];
    cJSON *exp;
    tide_checkpoint *ck;
    tide_trainer_opts o;
    int steps;
    uint16_t *data;
    size_t n_data;
    char lora_init[1200];
} fixture;

static double jnum(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!v) fail_msg("expected.json has no '%s'", k);
    return v->valuedouble;
}

static void fixture_open(tide_ctx *ctx, fixture *f, const char *name) {
    memset(f, 0, sizeof *f);
    snprintf(f->dir, sizeof f->dir, "%s/train/%s", fixtures(), name);
    char path[1200];
    snprintf(path, sizeof path, "%s/expected.json", f->dir);
    char *txt = read_text(path);
    if (!txt) fail_msg("cannot read %s", path);
    f->exp = cJSON_Parse(txt);
    free(txt);
    assert_non_null(f->exp);
    /* a LoRA fixture trains the base of another fixture (base_dir) */
    const cJSON *bd = cJSON_GetObjectItem(f->exp, "base_dir");
    snprintf(path, sizeof path, "%s/%s", f->dir, cJSON_IsString(bd) ? bd->valuestring : ".");
    assert_int_equal(tide_checkpoint_open(ctx, path, &f->ck), TIDE_OK);
    const cJSON *hp = cJSON_GetObjectItem(f->exp, "hparams");
    assert_non_null(hp);
    f->steps = (int)jnum(hp, "steps");
    f->o = (tide_trainer_opts){
        .step = {.batch = (int)jnum(hp, "batch_size"), .seq = (int)jnum(hp, "seq_len"),
                 .accum = (int)jnum(hp, "grad_accum"), .beta1 = (float)jnum(hp, "beta1"),
                 .beta2 = (float)jnum(hp, "beta2"), .eps = (float)jnum(hp, "eps"),
                 .weight_decay = (float)jnum(hp, "weight_decay"), .grad_clip = (float)jnum(hp, "grad_clip")},
        .lr = jnum(hp, "lr"), .min_lr = jnum(hp, "min_lr"), .cosine = true,
        .warmup = (int64_t)jnum(hp, "warmup_steps"), .total_steps = f->steps};
    const cJSON *lo = cJSON_GetObjectItem(f->exp, "lora");
    if (lo) { /* r, alpha and targets; the adapters start from the fixture's */
        f->o.step.lora_r = (int)jnum(lo, "r");
        f->o.step.lora_alpha = (float)jnum(lo, "alpha");
        const cJSON *tg = cJSON_GetObjectItem(lo, "targets");
        for (const cJSON *e = tg ? tg->child : NULL; e; e = e->next) {
            unsigned b = 0;
            tide_ctx *c2 = tide_ctx_new();
            assert_int_equal(tide_lora_parse_targets(c2, e->valuestring, &b), TIDE_OK);
            tide_ctx_free(c2);
            f->o.step.lora_targets |= b;
        }
        snprintf(f->lora_init, sizeof f->lora_init, "%s/%s", f->dir, cJSON_GetObjectItem(lo, "init")->valuestring);
        f->o.lora_init = f->lora_init;
    }
    const cJSON *df = cJSON_GetObjectItem(f->exp, "data_file");
    snprintf(path, sizeof path, "%s/%s", f->dir, df && cJSON_IsString(df) ? df->valuestring : "data.u16");
    char *raw = NULL;
    FILE *fp = fopen(path, "rb");
    if (!fp) fail_msg("cannot open %s", path);
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    raw = malloc((size_t)n);
    assert_int_equal(fread(raw, 1, (size_t)n, fp), (size_t)n);
    fclose(fp);
    f->data = (uint16_t *)raw;
    f->n_data = (size_t)n / 2;
}

static void fixture_close(fixture *f) {
    cJSON_Delete(f->exp);
    tide_checkpoint_free(f->ck);
    free(f->data);
}

/* The batch of step s (the windows of tide train and of the fixture script). */
static void fixture_batch(const fixture *f, int64_t s, int32_t *in, int32_t *tg) {
    const int B = f->o.step.batch, T = f->o.step.seq, A = f->o.step.accum;
    int64_t W = (int64_t)f->n_data - T - 1;
    for (int m = 0; m < A; m++)
        for (int b = 0; b < B; b++) {
            int64_t start = ((((s * A) + m) * B + b) * T) % W;
            for (int t = 0; t < T; t++) {
                size_t k = ((size_t)m * B + b) * T + t;
                in[k] = f->data[start + t];
                tg[k] = f->data[start + t + 1];
            }
        }
}

static double rel(double a, double b) { return fabs(a - b) / fmax(fabs(b), 1e-30); }

/* Elementwise |x - y| <= abs_tol + frac * max|y| except on at most `allow`
 * elements, none beyond `hard`; an exact zero of y (a gradient no token
 * reached) must be an exact zero of x. Counts a failure into *fails. */
static void check_close(const char *what, const float *x, const float *y, size_t n, double abs_tol, double frac,
                        size_t allow, double hard, int *fails) {
    double mx = 0;
    for (size_t i = 0; i < n; i++) mx = fmax(mx, fabs(y[i]));
    size_t bad = 0, zeros = 0, wi = 0;
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)x[i] - (double)y[i]);
        if (d > abs_tol + frac * mx) bad++;
        if (y[i] == 0 && x[i] != 0 && frac > 0 && allow == 0) zeros++;
        if (d > worst) worst = d, wi = i;
    }
    if (bad > allow || worst > hard || zeros) {
        fprintf(stderr, "  %s: %zu of %zu beyond %.3g (allowed %zu), %zu nonzero where torch's is 0; worst |d| %.3g at "
                "%zu (tide %.9g, torch %.9g), max|torch| %.3g\n", what, bad, n, abs_tol + frac * mx, allow, zeros,
                worst, wi, x[wi], y[wi], mx);
        (*fails)++;
    }
}

/* bf16 values (held exactly in f32): at most 1% one ulp apart, at most 16
 * further apart, none beyond `hard`. */
static void check_bf16(const char *what, const float *x, const float *y, size_t n, double hard, int *fails) {
    size_t one = 0, more = 0;
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t a, b;
        memcpy(&a, &x[i], 4);
        memcpy(&b, &y[i], 4);
        /* bf16 bits in a monotonic order */
        int32_t ia = (int32_t)(a >> 16), ib = (int32_t)(b >> 16);
        ia = ia & 0x8000 ? 0x8000 - ia : ia;
        ib = ib & 0x8000 ? 0x8000 - ib : ib;
        int32_t d = ia > ib ? ia - ib : ib - ia;
        one += d == 1;
        more += d > 1;
        worst = fmax(worst, fabs((double)x[i] - (double)y[i]));
    }
    if (one > n / 100 || more > 16 || worst > hard) {
        fprintf(stderr, "  %s: %zu of %zu one bf16 ulp apart, %zu further, worst |d| %.3g\n", what, one, n, more, worst);
        (*fails)++;
    }
}

/* Trains fixture `name` (in row tiles of tile_seqs sequences when > 0) and
 * compares every step with PyTorch's. */
static void run_fixture_blocks(const char *name, int tile_seqs, int vocab_blocks) {
    tide_ctx *ctx = tide_ctx_new();
    fixture f;
    fixture_open(ctx, &f, name);
    f.o.step.tile_seqs = tile_seqs;
    f.o.step.vocab_blocks = vocab_blocks;
    tide_backend *be = NULL;
    assert_int_equal(tide_backend_new(ctx, TIDE_BACKEND_CPU, &be), TIDE_OK);
    assert_int_equal(tide_backend_set_matmul(be, TIDE_MATMUL_F32), TIDE_OK); /* PyTorch's f32 tolerances */
    f.o.step.grads_out = true;
    tide_trainer *t = NULL;
    if (tide_trainer_new(ctx, f.ck, be, &f.o, &t)) fail_msg("%s", tide_ctx_last_error(ctx));
    const size_t R = (size_t)f.o.step.batch * f.o.step.seq * f.o.step.accum;
    int32_t *in = malloc(R * 4), *tg = malloc(R * 4);
    const cJSON *losses = cJSON_GetObjectItem(f.exp, "loss"), *norms = cJSON_GetObjectItem(f.exp, "grad_norm");
    const cJSON *lrs = cJSON_GetObjectItem(f.exp, "lr");
    assert_int_equal(cJSON_GetArraySize(losses), f.steps);
    int fails = 0;
    double lr_sum = 0;
    char path[1200];
    for (int s = 0; s < f.steps; s++) {
        fixture_batch(&f, s, in, tg);
        tide_train_stats st;
        if (tide_trainer_step(t, in, tg, &st)) fail_msg("step %d: %s", s, tide_ctx_last_error(ctx));
        double el = cJSON_GetArrayItem(losses, s)->valuedouble, en = cJSON_GetArrayItem(norms, s)->valuedouble;
        double elr = cJSON_GetArrayItem(lrs, s)->valuedouble;
        bool clipped = cJSON_IsTrue(cJSON_GetArrayItem(cJSON_GetObjectItem(f.exp, "clipped"), s));
        if ((st.grad_norm > f.o.step.grad_clip) != clipped) {
            fprintf(stderr, "  %s step %d: clipping %s, torch's %s\n", name, s, clipped ? "not applied" : "applied",
                    clipped ? "was" : "was not");
            fails++;
        }
        lr_sum += elr;
        if (rel(st.loss, el) > 1e-5 || rel(st.grad_norm, en) > 1e-5 || rel((float)st.lr, elr) > 1e-7) {
            fprintf(stderr, "  %s step %d: loss %.9g (torch %.9g), grad norm %.9g (torch %.9g), lr %.9g (torch %.9g)\n",
                    name, s, st.loss, el, st.grad_norm, en, st.lr, elr);
            fails++;
        }
        if (s == 0) { /* the gradients of step 1 */
            stfile gs;
            snprintf(path, sizeof path, "%s/grads_step1.safetensors", f.dir);
            assert_int_equal(st_open(&gs, path), 0);
            for (cJSON *e = gs.hdr->child; e; e = e->next) {
                if (!strcmp(e->string, "__metadata__")) continue;
                char gn[300];
                snprintf(gn, sizeof gn, "grad.%s", e->string);
                size_t n1 = 0, n2 = 0;
                float *x = tr_get(t, gn, &n1), *y = st_get(&gs, e->string, &n2);
                if (!x) fail_msg("no gradient '%s'", gn);
                assert_int_equal(n1, n2);
                check_close(gn, x, y, n1, 0, 1e-5, 0, INFINITY, &fails);
                free(x);
                free(y);
            }
            st_close(&gs);
        }
    }
    /* the state after the last step */
    stfile fs;
    snprintf(path, sizeof path, "%s/final.safetensors", f.dir);
    assert_int_equal(st_open(&fs, path), 0);
    int n_checked = 0;
    for (cJSON *e = fs.hdr->child; e; e = e->next) {
        if (!strcmp(e->string, "__metadata__")) continue;
        size_t n1 = 0, n2 = 0;
        float *x = tr_get(t, e->string, &n1), *y = st_get(&fs, e->string, &n2);
        if (!x) fail_msg("tide has no training tensor '%s'", e->string);
        assert_int_equal(n1, n2);
        bool bf16 = !strcmp(cJSON_GetObjectItem(e, "dtype")->valuestring, "BF16");
        bool moment = !strncmp(e->string, "exp_avg", 7);
        /* moments: 1e-3 of the tensor's largest; parameters and masters:
         * 1e-4 absolute (a bf16 parameter: one ulp of its value), except
         * a few elements whose near-zero gradient AdamW turned into a full
         * +-lr step, never beyond twice the summed learning rates */
        if (moment) check_close(e->string, x, y, n1, 0, 1e-3, 16, INFINITY, &fails);
        else if (bf16) check_bf16(e->string, x, y, n1, 2 * lr_sum, &fails);
        else check_close(e->string, x, y, n1, 1e-4, 0, 16, 2 * lr_sum, &fails);
        free(x);
        free(y);
        n_checked++;
    }
    st_close(&fs);
    assert_true(n_checked > 0);
    if (fails) fail_msg("%s: %d comparisons with PyTorch out of tolerance", name, fails);
    tide_trainer_free(t);
    tide_backend_free(be);
    fixture_close(&f);
    tide_ctx_free(ctx);
    free(in);
    free(tg);
}

static void run_fixture(const char *name, int tile_seqs) { run_fixture_blocks(name, tile_seqs, 0); }

static void test_torch_f32_gqa(void **state) {
    (void)state;
    run_fixture("train-f32-gqa", 0);
}
static void test_torch_bf16_gqa(void **state) {
    (void)state;
    run_fixture("train-bf16-gqa", 0);
}
/* LoRA (scripts/make_lora_fixture.py: PEFT's adapters on train-f32-gqa's
 * frozen base, started from the fixture's adapter_init/): the same
 * tolerances, over the adapters' losses, norms, step-1 gradients, final
 * values and moments. */
static void test_torch_lora(void **state) {
    (void)state;
    run_fixture("lora-f32-gqa", 0);
}
static void test_torch_lora_tiled(void **state) {
    (void)state;
    run_fixture_blocks("lora-f32-gqa", 1, 2);
}

static void test_torch_f32_tied(void **state) {
    (void)state;
    run_fixture("train-f32-tied", 0);
}

/* Row tiles of one sequence (each micro-batch of 2 runs as 2 tiles: losses
 * and gradients added over tiles) still train as PyTorch does. */
static void test_torch_tiled(void **state) {
    (void)state;
    run_fixture("train-f32-gqa", 1);
    run_fixture("train-bf16-gqa", 1);
    run_fixture("train-f32-tied", 1);
}

/* The embedding and the head in vocabulary blocks (3, uneven; a tied head
 * shares the embedding's blocks), row tiles or none: still PyTorch's
 * training, the gradients gathered from the blocks. */
static void test_torch_vocab_blocks(void **state) {
    (void)state;
    run_fixture_blocks("train-f32-gqa", 0, 3);
    run_fixture_blocks("train-bf16-gqa", 1, 2);
    run_fixture_blocks("train-f32-tied", 1, 3);
}

/* ---------------------------------------------------------------- bit-identity */

typedef struct run_out {
    double loss[8], norm[8];
    int tiles;   /* the trainer's sequences per row tile (0: untiled) */
    int vblocks; /* its vocabulary blocks (0: none) */
    uint64_t budget; /* the device budget of the last step */
    char **names;
    void **vals;
    uint64_t *bytes;
    int n;
} run_out;

static void run_out_free(run_out *r) {
    for (int i = 0; i < r->n; i++) {
        free(r->vals[i]);
        if (r->names) free(r->names[i]);
    }
    free(r->vals);
    free(r->bytes);
    free(r->names);
}

/* When set, train_run writes the last step's trace there. */
static const char *trace_path;

/* Runs `steps` steps of fixture f's model on be, offloaded as off says
 * (NULL: resident), resuming from `resume` when given and saving into
 * `save_dir` after step save_at (when > 0); collects every step's loss and
 * norm and the final state. Returns the status of the first failure. */
static tide_status train_run(tide_ctx *ctx, fixture *f, tide_backend *be, const tide_offload_opts *off, int steps,
                             const char *resume, const char *save_dir, int save_at, run_out *out) {
    memset(out, 0, sizeof *out);
    tide_trainer *t = NULL;
    tide_status st = tide_trainer_new(ctx, f->ck, be, &f->o, &t);
    if (!st && off) st = tide_trainer_set_offload(t, off);
    if (!st && resume) st = tide_trainer_resume(t, resume);
    const size_t R = (size_t)f->o.step.batch * f->o.step.seq * f->o.step.accum;
    int32_t *in = malloc(R * 4), *tg = malloc(R * 4);
    for (int64_t s = t ? tide_trainer_steps(t) : 0; !st && s < steps; s++) {
        fixture_batch(f, s, in, tg);
        tide_train_stats ts;
        if ((st = tide_trainer_step(t, in, tg, &ts))) break;
        out->loss[s] = ts.loss;
        out->norm[s] = ts.grad_norm;
        out->budget = ts.budget_bytes;
        if (save_dir && s + 1 == save_at) st = tide_trainer_save(t, save_dir, tide_checkpoint_config(f->ck)->dtype, NULL, 0);
    }
    if (!st) {
        out->n = tide_trainer_n_tensors(t);
        out->names = calloc((size_t)out->n, sizeof *out->names);
        out->vals = calloc((size_t)out->n, sizeof *out->vals);
        out->bytes = calloc((size_t)out->n, sizeof *out->bytes);
        for (int i = 0; !st && i < out->n; i++) {
            out->names[i] = (char *)tide_trainer_tensor(t, i, NULL, &out->bytes[i]);
            out->vals[i] = malloc(out->bytes[i]);
            st = tide_trainer_read(t, out->names[i], out->vals[i], out->bytes[i]);
            out->names[i] = strdup(out->names[i]);
        }
    }
    if (t) out->tiles = tide_trainer_tile_seqs(t), out->vblocks = tide_trainer_vocab_blocks(t);
    if (!st && trace_path) st = tide_trainer_write_trace(t, trace_path, NULL);
    free(in);
    free(tg);
    tide_trainer_free(t);
    return st;
}

/* The resident runs of f's first `steps` steps, untiled and in row tiles of
 * one sequence (the reference of a run that tiles), and the bytes of the
 * training state. */
static void resident_refs(tide_ctx *ctx, fixture *f, tide_backend *be, int steps, run_out *ref, run_out *ref_tiled,
                          uint64_t *state_bytes) {
    assert_int_equal(train_run(ctx, f, be, NULL, steps, NULL, NULL, 0, ref), TIDE_OK);
    f->o.step.tile_seqs = 1;
    assert_int_equal(train_run(ctx, f, be, NULL, steps, NULL, NULL, 0, ref_tiled), TIDE_OK);
    f->o.step.tile_seqs = 0;
    assert_int_equal(ref_tiled->tiles, 1);
    *state_bytes = 0;
    for (int i = 0; i < ref->n; i++) *state_bytes += ref->bytes[i];
}

/* Resident runs of a fixture's first steps by tiling (row tiles, vocabulary
 * blocks), made as asked for: the reference of an offloaded run that tiled. */
typedef struct ref_cache {
    tide_ctx *ctx;
    fixture *f;
    tide_backend *be;
    int steps, n, key[8][2];
    run_out r[8];
} ref_cache;

static const run_out *ref_like(ref_cache *c, const run_out *run) {
    for (int i = 0; i < c->n; i++)
        if (c->key[i][0] == run->tiles && c->key[i][1] == run->vblocks) return &c->r[i];
    assert_true(c->n < 8);
    tide_llama_train_opts keep = c->f->o.step;
    c->f->o.step.tile_seqs = run->tiles, c->f->o.step.vocab_blocks = run->vblocks;
    run_out *r = &c->r[c->n];
    assert_int_equal(train_run(c->ctx, c->f, c->be, NULL, c->steps, NULL, NULL, 0, r), TIDE_OK);
    c->f->o.step = keep;
    assert_int_equal(r->tiles, run->tiles);
    assert_int_equal(r->vblocks, run->vblocks);
    c->key[c->n][0] = run->tiles, c->key[c->n][1] = run->vblocks;
    return &c->r[c->n++];
}

static void ref_cache_free(ref_cache *c) {
    for (int i = 0; i < c->n; i++) run_out_free(&c->r[i]);
}

static void assert_same(const run_out *a, const run_out *b, int from, int steps, const char *what) {
    for (int s = from; s < steps; s++)
        if (memcmp(&a->loss[s], &b->loss[s], sizeof a->loss[s]) || memcmp(&a->norm[s], &b->norm[s], sizeof a->norm[s]))
            fail_msg("%s: step %d's loss %.9g / norm %.9g differ from %.9g / %.9g", what, s, a->loss[s], a->norm[s],
                     b->loss[s], b->norm[s]);
    assert_int_equal(a->n, b->n);
    for (int i = 0; i < a->n; i++)
        if (a->bytes[i] != b->bytes[i] || memcmp(a->vals[i], b->vals[i], a->bytes[i]))
            fail_msg("%s: '%s' differs", what, a->names[i]);
}

static void test_offload_bit_identical(void **state) {
    (void)state;
    tide_ctx *ctx = tide_ctx_new();
    fixture f;
    fixture_open(ctx, &f, "train-bf16-gqa");
    tide_backend *be = NULL;
    assert_int_equal(tide_backend_new(ctx, TIDE_BACKEND_CPU, &be), TIDE_OK);
    assert_int_equal(tide_backend_set_matmul(be, TIDE_MATMUL_F32), TIDE_OK); /* PyTorch's f32 tolerances */
    const int steps = 3;
    run_out ref, ref_tiled;
    uint64_t state_bytes = 0;
    resident_refs(ctx, &f, be, steps, &ref, &ref_tiled, &state_bytes);
    ref_cache refs = {.ctx = ctx, .f = &f, .be = be, .steps = steps};
    /* the sixth: policy tide with every update on the host CPU, which with
     * the state on SSD stages each update's state in host memory (host
     * memory short: every version written home, the staging room kept
     * from other spills; test_optim_place's test_host_short is the case
     * that did not plan before) */
    static const char *const policies[] = {"tide", "static-layer", "lru", "checkpoint-layer", "zero-offload", "tide"};
    const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    int n_runs = 0, n_ckpt = 0, n_zero = 0, n_cpu = 0, n_tiled = 0;
    for (int pi = 0; pi < 6; pi++)
        for (int bi = 0; bi < 3; bi++)
            for (int ssd = 0; ssd < 2; ssd++) {
                tide_offload_opts off = {.policy = policies[pi], .hw = "h100-80g", .ssd_dirs = tmp,
                                         .optimizer = pi == 5 ? "cpu" : NULL};
                if (bi < 2) {
                    off.budget_kind = TIDE_BUDGET_FRACTION;
                    off.fraction = bi ? 0.25 : 0.5;
                } else {
                    off.budget_kind = TIDE_BUDGET_MIN;
                }
                /* a host budget below the training state homes it on SSD */
                if (ssd) off.host_budget = state_bytes / 3;
                char what[160];
                snprintf(what, sizeof what, "policy %s%s, budget %s, state on %s", policies[pi],
                         pi == 5 ? " (AdamW on the CPU)" : "", bi == 0 ? "50%" : bi == 1 ? "25%" : "min",
                         ssd ? "SSD" : "host");
                run_out r;
                tide_status st = train_run(ctx, &f, be, &off, steps, NULL, NULL, 0, &r);
                if (st == TIDE_E_INFEASIBLE && pi > 0 && pi < 5 && bi < 2) {
                    /* a baseline whose minimum is above this fraction: its
                     * minimum budget is tested below */
                    run_out_free(&r);
                    continue;
                }
                if (st) fail_msg("%s: %s", what, tide_ctx_last_error(ctx));
                /* only the tide policy tiles by itself */
                if (r.tiles || r.vblocks) assert_int_equal(pi == 0 || pi == 5, 1);
                assert_same(&r, r.tiles || r.vblocks ? ref_like(&refs, &r) : &ref, 0, steps, what);
                n_tiled += r.tiles != 0 || r.vblocks != 0;
                run_out_free(&r);
                n_runs++;
                n_ckpt += pi == 3;
                n_zero += pi == 4;
                n_cpu += pi == 5;
            }
    assert_true(n_runs >= 12);
    assert_int_equal(n_ckpt, 6); /* recomputed activations: every budget, state on host and SSD */
    assert_int_equal(n_zero, 6); /* every AdamW on the host CPU: every budget, state on host and SSD */
    assert_int_equal(n_cpu, 6);
    assert_true(n_tiled >= 1); /* a minimum below the untiled step's */
    ref_cache_free(&refs);
    run_out_free(&ref);
    run_out_free(&ref_tiled);
    tide_backend_free(be);
    fixture_close(&f);
    tide_ctx_free(ctx);
}

/* Tiles chosen for the budget: the tiled minimum is below the untiled one,
 * and with the vocabulary in blocks below the minimum of row tiles alone;
 * between the untiled and the tiled minimum, tide tiles by itself (a budget
 * the untiled step cannot plan under) and refuses with tiling off; forced
 * levels tile the baselines. Every tiled run is bit for bit the resident run
 * of the same tiles. */
static void test_tiled_budgets(void **state) {
    (void)state;
    tide_ctx *ctx = tide_ctx_new();
    fixture f;
    fixture_open(ctx, &f, "train-bf16-gqa");
    tide_backend *be = NULL;
    assert_int_equal(tide_backend_new(ctx, TIDE_BACKEND_CPU, &be), TIDE_OK);
    const int steps = 2;
    run_out ref, ref_tiled, r;
    uint64_t state_bytes = 0;
    resident_refs(ctx, &f, be, steps, &ref, &ref_tiled, &state_bytes);
    ref_cache refs = {.ctx = ctx, .f = &f, .be = be, .steps = steps};
    const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    tide_offload_opts off = {.policy = "tide", .hw = "h100-80g", .ssd_dirs = tmp, .optimizer = "cpu",
                             .budget_kind = TIDE_BUDGET_MIN, .tile = TIDE_TILE_NONE};
    /* the minimum untiled, in row tiles of one sequence (level 1 of a batch
     * of 2), and at the level of the smallest minimum */
    assert_int_equal(train_run(ctx, &f, be, &off, steps, NULL, NULL, 0, &r), TIDE_OK);
    assert_int_equal(r.tiles, 0);
    assert_int_equal(r.vblocks, 0);
    assert_same(&r, &ref, 0, steps, "untiled minimum");
    const uint64_t untiled_min = r.budget;
    run_out_free(&r);
    off.tile = 1;
    assert_int_equal(train_run(ctx, &f, be, &off, steps, NULL, NULL, 0, &r), TIDE_OK);
    assert_int_equal(r.tiles, 1);
    assert_int_equal(r.vblocks, 0);
    assert_same(&r, &ref_tiled, 0, steps, "row tiles' minimum");
    const uint64_t rows_min = r.budget;
    run_out_free(&r);
    off.tile = TIDE_TILE_AUTO;
    assert_int_equal(train_run(ctx, &f, be, &off, steps, NULL, NULL, 0, &r), TIDE_OK);
    assert_int_equal(r.tiles, 1);
    assert_true(r.vblocks >= 2);
    assert_same(&r, ref_like(&refs, &r), 0, steps, "tiled minimum");
    const uint64_t tiled_min = r.budget;
    print_message("  minimum budget: untiled %llu bytes, row tiles of one sequence %llu, with %d vocabulary "
                  "blocks %llu\n", (unsigned long long)untiled_min, (unsigned long long)rows_min, r.vblocks,
                  (unsigned long long)tiled_min);
    run_out_free(&r);
    assert_true(rows_min + 4096 < untiled_min);
    assert_true(tiled_min + 4096 < rows_min);
    /* between the two: tiles by itself (state on host and on SSD), none refused */
    off.budget_kind = TIDE_BUDGET_BYTES;
    off.bytes = (tiled_min + untiled_min) / 2;
    for (int ssd = 0; ssd < 2; ssd++) {
        off.host_budget = ssd ? state_bytes / 3 : 0;
        assert_int_equal(train_run(ctx, &f, be, &off, steps, NULL, NULL, 0, &r), TIDE_OK);
        assert_true(r.tiles || r.vblocks);
        assert_same(&r, ref_like(&refs, &r), 0, steps,
                    ssd ? "between the minimums, state on SSD" : "between the minimums");
        run_out_free(&r);
    }
    off.host_budget = 0;
    off.tile = TIDE_TILE_NONE;
    assert_int_equal(train_run(ctx, &f, be, &off, steps, NULL, NULL, 0, &r), TIDE_E_INFEASIBLE);
    run_out_free(&r);
    /* the baselines tile only when a level is forced; the tiled graph's
     * recomputations and host updates still compute the resident bits */
    static const char *const base[] = {"zero-offload", "checkpoint-layer", "lru"};
    for (int k = 0; k < 3; k++) {
        tide_offload_opts o2 = {.policy = base[k], .hw = "h100-80g", .ssd_dirs = tmp,
                                .budget_kind = TIDE_BUDGET_MIN, .tile = k == 0 ? 2 : 1};
        assert_int_equal(train_run(ctx, &f, be, &o2, steps, NULL, NULL, 0, &r), TIDE_OK);
        assert_int_equal(r.tiles, 1);
        assert_int_equal(r.vblocks, k == 0 ? 2 : 0);
        assert_same(&r, ref_like(&refs, &r), 0, steps, base[k]);
        run_out_free(&r);
        o2.tile = TIDE_TILE_AUTO;
        assert_int_equal(train_run(ctx, &f, be, &o2, steps, NULL, NULL, 0, &r), TIDE_OK);
        assert_int_equal(r.tiles, 0);
        assert_same(&r, &ref, 0, steps, base[k]);
        run_out_free(&r);
    }
    ref_cache_free(&refs);
    run_out_free(&ref);
    run_out_free(&ref_tiled);
    tide_backend_free(be);
    fixture_close(&f);
    tide_ctx_free(ctx);
}

/* Recomputation chosen by the tide policy: on a profile whose host link is
 * slow (20 MB/s), re-running an activation's producer costs less than its
 * round trip, and the plan that recomputes finishes first (the trace of the
 * step shows more COMPUTEs than the graph has ops); its steps are bit for
 * bit the resident ones. */
/* LoRA offloaded: the persistent state is the adapters and their moments
 * alone (no base weight, master or gradient among them; 3 x the adapters'
 * bytes), and offloaded steps (every policy, 25% and the minimum budget,
 * state on host and on SSD) are bit-identical to the unconstrained run.
 * On the f32 fixture from its PEFT adapter, and on the bf16 base from
 * tide's own initialisation (B zero); QLoRA (base_type: the projections
 * quantized at load) the same, and in forced row tiles of one sequence. */
static void lora_offload(const char *name, const char *base_type) {
    tide_ctx *ctx = tide_ctx_new();
    fixture f;
    fixture_open(ctx, &f, name);
    if (f.o.step.lora_r == 0) f.o.step.lora_r = 4, f.o.step.lora_alpha = 8;
    f.o.lora_base_type = base_type;
    tide_backend *be = NULL;
    assert_int_equal(tide_backend_new(ctx, TIDE_BACKEND_CPU, &be), TIDE_OK);
    assert_int_equal(tide_backend_set_matmul(be, TIDE_MATMUL_F32), TIDE_OK);
    const int steps = 3;
    run_out ref, ref_tiled;
    uint64_t state_bytes = 0;
    resident_refs(ctx, &f, be, steps, &ref, &ref_tiled, &state_bytes);
    const tide_llama_config *c = tide_checkpoint_config(f.ck);
    const int64_t D = c->hidden_size, I = c->intermediate_size, hd = D / c->num_attention_heads;
    const int64_t qd = c->num_attention_heads * hd, kd = c->num_key_value_heads * hd, r = f.o.step.lora_r;
    /* r (K + N) per target: q, k, v, o, gate, up, down */
    const int64_t per_layer = r * ((D + qd) + 2 * (D + kd) + (qd + D) + 3 * (D + I));
    assert_int_equal(state_bytes, (uint64_t)(3 * 4 * per_layer * c->num_hidden_layers));
    for (int i = 0; i < ref.n; i++) {
        const char *n = ref.names[i];
        if (strncmp(n, "base_model.model.", 17) && strncmp(n, "exp_avg.base_model.model.", 25) &&
            strncmp(n, "exp_avg_sq.base_model.model.", 28))
            fail_msg("%s: persistent tensor '%s' is not an adapter or its moment", name, n);
    }
    ref_cache refs = {.ctx = ctx, .f = &f, .be = be, .steps = steps};
    static const char *const policies[] = {"tide", "static-layer", "checkpoint-layer", "zero-offload"};
    const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    int n_runs = 0;
    for (int pi = 0; pi < 4; pi++)
        for (int bi = 0; bi < 2; bi++)
            for (int ssd = 0; ssd < 2; ssd++) {
                tide_offload_opts off = {.policy = policies[pi], .hw = "h100-80g", .ssd_dirs = tmp};
                off.budget_kind = bi ? TIDE_BUDGET_MIN : TIDE_BUDGET_FRACTION;
                off.fraction = 0.25;
                if (ssd) off.host_budget = state_bytes / 3;
                char what[160];
                snprintf(what, sizeof what, "%s LoRA: policy %s, budget %s, state on %s", name, policies[pi],
                         bi ? "min" : "25%", ssd ? "SSD" : "host");
                run_out o;
                tide_status st = train_run(ctx, &f, be, &off, steps, NULL, NULL, 0, &o);
                if (st == TIDE_E_INFEASIBLE && pi > 0 && !bi) {
                    run_out_free(&o);
                    continue;
                }
                if (st) fail_msg("%s: %s", what, tide_ctx_last_error(ctx));
                assert_same(&o, o.tiles || o.vblocks ? ref_like(&refs, &o) : &ref, 0, steps, what);
                run_out_free(&o);
                n_runs++;
            }
    assert_true(n_runs >= 10);
    if (base_type) { /* forced row tiles of one sequence, state on host and SSD */
        for (int ssd = 0; ssd < 2; ssd++) {
            tide_offload_opts off = {.policy = "tide", .hw = "h100-80g", .ssd_dirs = tmp,
                                     .budget_kind = TIDE_BUDGET_MIN, .tile = 1,
                                     .host_budget = ssd ? state_bytes / 3 : 0};
            run_out o;
            if (train_run(ctx, &f, be, &off, steps, NULL, NULL, 0, &o))
                fail_msg("%s QLoRA %s tiled: %s", name, base_type, tide_ctx_last_error(ctx));
            assert_int_equal(o.tiles, 1);
            assert_same(&o, ref_like(&refs, &o), 0, steps, ssd ? "QLoRA tiled, state on SSD" : "QLoRA tiled");
            run_out_free(&o);
        }
    }
    ref_cache_free(&refs);
    run_out_free(&ref);
    run_out_free(&ref_tiled);
    tide_backend_free(be);
    fixture_close(&f);
    tide_ctx_free(ctx);
}

static void test_lora_offload_bit_identical(void **state) {
    (void)state;
    lora_offload("lora-f32-gqa", NULL);
    lora_offload("train-bf16-gqa", NULL);
    /* QLoRA: the projections in Q8_0 and in Q4_0 blocks */
    lora_offload("train-bf16-gqa", "q8_0");
    lora_offload("lora-f32-gqa", "q4_0");
}

static void test_tide_recompute_bit_identical(void **state) {
    (void)state;
    tide_ctx *ctx = tide_ctx_new();
    fixture f;
    fixture_open(ctx, &f, "train-bf16-gqa");
    tide_backend *be = NULL;
    assert_int_equal(tide_backend_new(ctx, TIDE_BACKEND_CPU, &be), TIDE_OK);
    assert_int_equal(tide_backend_set_matmul(be, TIDE_MATMUL_F32), TIDE_OK);
    const int steps = 2;
    run_out ref;
    assert_int_equal(train_run(ctx, &f, be, NULL, steps, NULL, NULL, 0, &ref), TIDE_OK);
    const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    char hw[512], trace[512];
    snprintf(hw, sizeof hw, "%s/tide_test_slow_link_%d.json", tmp, (int)getpid());
    snprintf(trace, sizeof trace, "%s/tide_test_recompute_%d.json", tmp, (int)getpid());
    FILE *h = fopen(hw, "w");
    assert_non_null(h);
    fputs("{\"name\": \"slow-link\", \"device_mem_bytes\": 85899345920,\n"
          " \"flops\": {\"f32\": 67e12, \"f16\": 989e12, \"bf16\": 989e12, \"i32\": 67e12},\n"
          " \"matmul_efficiency\": 0.75, \"mem_bw\": 3350e9, \"h2d_bw\": 2e7, \"d2h_bw\": 2e7,\n"
          " \"link_latency_s\": 1e-5, \"launch_s\": 5e-6, \"host_mem_bytes\": 549755813888, \"ssd_count\": 1,\n"
          " \"ssd_read_bw\": 6.5e9, \"ssd_write_bw\": 3.5e9, \"ssd_latency_s\": 1e-4, \"host_flops\": 8e12,\n"
          " \"host_mem_bw\": 5e11}\n", h);
    fclose(h);
    int recomputed = 0;
    for (int bi = 0; bi < 2; bi++) {
        tide_offload_opts off = {.policy = "tide", .hw = hw, .optimizer = "device", .timeline = true,
                                 .no_refit = true}; /* a refit to the CPU's measured rates would not recompute */
        if (bi == 0) {
            off.budget_kind = TIDE_BUDGET_FRACTION;
            off.fraction = 0.25;
        } else {
            off.budget_kind = TIDE_BUDGET_MIN;
        }
        run_out r;
        trace_path = trace;
        tide_status st = train_run(ctx, &f, be, &off, steps, NULL, NULL, 0, &r);
        trace_path = NULL;
        if (st) fail_msg("tide on a slow link, budget %s: %s", bi ? "min" : "25%", tide_ctx_last_error(ctx));
        assert_same(&r, &ref, 0, steps, bi ? "tide recomputing, budget min" : "tide recomputing, budget 25%");
        run_out_free(&r);
        char *text = read_text(trace);
        assert_non_null(text);
        int n_compute = 0;
        for (const char *p = text; (p = strstr(p, "\"cat\":\"compute\"")); p++) n_compute++;
        free(text);
        tide_trainer *t = NULL;
        assert_int_equal(tide_trainer_new(ctx, f.ck, be, &f.o, &t), TIDE_OK);
        int n_ops = tide_graph_n_ops(tide_trainer_graph(t));
        tide_trainer_free(t);
        recomputed += n_compute > n_ops;
    }
    assert_true(recomputed > 0); /* at one budget at least (each keeps the faster plan) */
    remove(hw);
    remove(trace);
    run_out_free(&ref);
    tide_backend_free(be);
    fixture_close(&f);
    tide_ctx_free(ctx);
}

/* ---------------------------------------------------------------- resume */

static void rm_rf(const char *dir) {
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd)) {
    }
}

static void test_resume(void **state) {
    (void)state;
    tide_ctx *ctx = tide_ctx_new();
    fixture f;
    fixture_open(ctx, &f, "train-bf16-gqa");
    tide_backend *be = NULL;
    assert_int_equal(tide_backend_new(ctx, TIDE_BACKEND_CPU, &be), TIDE_OK);
    assert_int_equal(tide_backend_set_matmul(be, TIDE_MATMUL_F32), TIDE_OK); /* PyTorch's f32 tolerances */
    char dir[256];
    snprintf(dir, sizeof dir, "%s/tide-test-resume-%d", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid());
    rm_rf(dir);
    const int steps = 5, at = 2;
    /* resident, offloaded at 25%, offloaded at the minimum (the embedding and
     * the head in vocabulary blocks, chosen at the first step, after the
     * resume), resident in 3 uneven vocabulary blocks: the checkpoint holds
     * whole tensors whatever the blocks */
    for (int var = 0; var < 4; var++) {
        const bool offl = var == 1 || var == 2;
        tide_offload_opts off = {.budget_kind = var == 2 ? TIDE_BUDGET_MIN : TIDE_BUDGET_FRACTION, .fraction = 0.25,
                                 .hw = "h100-80g", .optimizer = var == 2 ? "cpu" : NULL};
        const tide_offload_opts *po = offl ? &off : NULL;
        f.o.step.vocab_blocks = var == 3 ? 3 : 0;
        run_out whole, first, rest;
        assert_int_equal(train_run(ctx, &f, be, po, steps, NULL, dir, at, &whole), TIDE_OK);
        if (var >= 2) assert_int_equal(whole.vblocks, var == 3 ? 3 : whole.vblocks > 1 ? whole.vblocks : -1);
        /* the run interrupted after saving: a new trainer from the save */
        assert_int_equal(train_run(ctx, &f, be, po, at, NULL, NULL, 0, &first), TIDE_OK);
        if (train_run(ctx, &f, be, po, steps, dir, NULL, 0, &rest)) fail_msg("resume: %s", tide_ctx_last_error(ctx));
        assert_same(&rest, &whole, at, steps, "resumed run");
        for (int s = 0; s < at; s++) assert_true(first.loss[s] == whole.loss[s]);
        run_out_free(&whole);
        run_out_free(&first);
        run_out_free(&rest);

        /* the saved checkpoint runs as a model: its logits on step `at`'s
         * batch give the loss the trainer reported for that step */
        tide_checkpoint *ck = NULL;
        assert_int_equal(tide_checkpoint_open(ctx, dir, &ck), TIDE_OK);
        const tide_llama_config *cfg = tide_checkpoint_config(ck);
        tide_model_opts mo = {.max_batch = f.o.step.batch, .ctx_len = f.o.step.seq};
        tide_model *m = NULL;
        assert_int_equal(tide_model_new(ctx, ck, be, &mo, &m), TIDE_OK);
        const int B = f.o.step.batch, T = f.o.step.seq, A = f.o.step.accum, V = cfg->vocab_size;
        int32_t *in = malloc((size_t)B * T * A * 4), *tg = malloc((size_t)B * T * A * 4);
        float *logits = malloc((size_t)B * T * V * 4);
        fixture_batch(&f, at, in, tg);
        double loss = 0;
        for (int mb = 0; mb < A; mb++) {
            assert_int_equal(tide_model_forward(m, in + (size_t)mb * B * T, B, T, 0, logits), TIDE_OK);
            for (int r = 0; r < B * T; r++) {
                const float *l = logits + (size_t)r * V;
                double mx = l[0], se = 0;
                for (int v = 1; v < V; v++) mx = fmax(mx, l[v]);
                for (int v = 0; v < V; v++) se += exp(l[v] - mx);
                loss += (mx + log(se) - l[tg[(size_t)mb * B * T + r]]) / ((double)B * T * A);
            }
        }
        run_out again;
        f.o.step.vocab_blocks = 0; /* a whole trainer from the blocks' save */
        assert_int_equal(train_run(ctx, &f, be, NULL, at + 1, dir, NULL, 0, &again), TIDE_OK);
        if (rel(loss, again.loss[at]) > 1e-5)
            fail_msg("the saved model's loss %.9g differs from the trainer's %.9g", loss, again.loss[at]);
        run_out_free(&again);
        free(in);
        free(tg);
        free(logits);
        tide_model_free(m);
        tide_checkpoint_free(ck);
        rm_rf(dir);
    }
    tide_backend_free(be);
    fixture_close(&f);
    tide_ctx_free(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lr_schedule),
        cmocka_unit_test(test_graph),
        cmocka_unit_test(test_torch_f32_gqa),
        cmocka_unit_test(test_torch_bf16_gqa),
        cmocka_unit_test(test_torch_f32_tied),
        cmocka_unit_test(test_torch_lora), cmocka_unit_test(test_torch_lora_tiled),
        cmocka_unit_test(test_torch_tiled), cmocka_unit_test(test_torch_vocab_blocks),
        cmocka_unit_test(test_offload_bit_identical),
        cmocka_unit_test(test_tide_recompute_bit_identical),
        cmocka_unit_test(test_lora_offload_bit_identical),
        cmocka_unit_test(test_tiled_budgets),
        cmocka_unit_test(test_resume),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
