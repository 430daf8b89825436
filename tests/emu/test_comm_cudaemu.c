/*
 * test_comm_cudaemu.c - a rank's step on the CUDA backend, its collectives
 * on device memory, run on the emulated GPU (tests/emu/backend_emu.cmake):
 * what NCCL's one-rank run (tests/cli_comm.sh --gpu) goes through, less
 * NCCL itself. The emulated GPU's library has no NCCL, so the communicator
 * of one rank (MPI's singleton) gets this file's device collectives: over
 * one rank each is a copy on the net stream's CUDA stream (cudaMemcpyAsync,
 * then waited for), with comm.h's contract (device pointers, the queue,
 * done when it returns). The trainer then plans the rank's step with its
 * collectives on the net stream, resident on the device, and the executor
 * runs them there between the computes' events.
 *
 * Checked: the fixture tests/fixtures/train/train-f32-gqa trained 3 steps
 * with --accum 2 as one process and as one rank under ZeRO 0 and 1, and
 * with --accum 1 under ZeRO 2, bit for bit: every step's loss and gradient
 * norm and every parameter, master weight and moment at the end; every
 * collective of the plan ran (the count of calls). ZeRO 2 with --accum 2
 * (each micro-batch's gradient reduce-scattered and added into the shard
 * on the device) within f32 summation order of the single process: losses
 * and norms 1e-5 relative, the state 1e-4 absolute. Exit 77 without MPI.
 */
#include "tide.h"
#include "backend/cuda/cuda_int.h"
#include "core/core.h"
#include "net/comm.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STEPS 3

static int fails, calls;
#define CHECK(cond, ...)                                                                                          \
    do {                                                                                                          \
        if (!(cond)) {                                                                                            \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                                  \
            fprintf(stderr, __VA_ARGS__);                                                                         \
            fprintf(stderr, "\n");                                                                                \
            fails++;                                                                                              \
        }                                                                                                         \
    } while (0)

/* ---------------------------------------------------------------- one rank's device collectives */

static tide_status copy_on(tide_ctx *ctx, void *q, void *dst, const void *src, size_t n, const char *what) {
    calls++;
    if (!q) return tide_err(ctx, TIDE_E_INVALID, "no queue");
    cudaStream_t s = ((cu_queue *)q)->stream;
    cudaError_t e = dst == src ? cudaSuccess : cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, s);
    if (e == cudaSuccess) e = cudaStreamSynchronize(s);
    return e == cudaSuccess ? TIDE_OK : tide_err(ctx, TIDE_E_BACKEND, "%s: %s", what, cudaGetErrorString(e));
}
static tide_status d_allreduce(void *st, tide_ctx *ctx, const float *src, float *dst, uint64_t n, void *q,
                               const char *what) {
    return copy_on(ctx, q, dst, src, n * sizeof(float), what);
}
static tide_status d_reduce_scatter(void *st, tide_ctx *ctx, const float *x, float *shard, int64_t rows,
                                    uint64_t row_elems, void *q, const char *what) {
    return copy_on(ctx, q, shard, x, (size_t)rows * row_elems * sizeof(float), what);
}
static tide_status d_allgather(void *st, tide_ctx *ctx, const void *shard, void *x, int64_t rows,
                               uint64_t row_bytes, void *q, const char *what) {
    return copy_on(ctx, q, x, shard, (size_t)rows * row_bytes, what);
}
static const tide_comm_dev one_dev = {.name = "one rank (test)", .allreduce_f32 = d_allreduce,
                                      .reduce_scatter_f32 = d_reduce_scatter, .allgather_rows = d_allgather};

/* ---------------------------------------------------------------- runs */

typedef struct run {
    double loss[STEPS], norm[STEPS];
} run;

static uint16_t *data;
static size_t n_data;

static void batch(const tide_trainer_opts *o, int s, int32_t *in, int32_t *tg) {
    const int B = o->step.batch, T = o->step.seq, A = o->step.accum;
    const size_t W = n_data - (size_t)T - 1;
    for (int m = 0; m < A; m++)
        for (int b = 0; b < B; b++) {
            size_t start = ((size_t)((s * A + m) * B + b) * (size_t)T) % W;
            for (int t = 0; t < T; t++) {
                size_t k = ((size_t)m * B + b) * T + (size_t)t;
                in[k] = data[start + t];
                tg[k] = data[start + t + 1];
            }
        }
}

static tide_trainer *train(tide_ctx *ctx, tide_checkpoint *ck, tide_backend *be, tide_trainer_opts o,
                           tide_comm *c, run *out, const char *what) {
    tide_trainer *t = NULL;
    if (tide_trainer_new(ctx, ck, be, &o, &t) || (c && tide_trainer_set_comm(t, c))) {
        CHECK(0, "%s: %s", what, tide_ctx_last_error(ctx));
        tide_trainer_free(t);
        return NULL;
    }
    size_t R = (size_t)o.step.batch * o.step.seq * o.step.accum;
    int32_t *in = malloc(R * 4), *tg = malloc(R * 4);
    for (int s = 0; s < STEPS && t; s++) {
        batch(&o, s, in, tg);
        tide_train_stats ts;
        if (tide_trainer_step(t, in, tg, &ts)) {
            CHECK(0, "%s, step %d: %s", what, s, tide_ctx_last_error(ctx));
            tide_trainer_free(t);
            t = NULL;
            break;
        }
        out->loss[s] = ts.loss;
        out->norm[s] = ts.grad_norm;
    }
    free(in);
    free(tg);
    return t;
}

/* Every persistent tensor of a (the single process) equals b's of that name
 * (tol > 0: its f32 elements within tol of them). */
static void same_state(tide_trainer *a, tide_trainer *b, const char *what, double tol) {
    int n = tide_trainer_n_tensors(a);
    CHECK(n > 0, "%s: no tensors", what);
    for (int i = 0; i < n; i++) {
        tide_dtype dt;
        uint64_t nb = 0;
        const char *nm = tide_trainer_tensor(a, i, &dt, &nb);
        void *x = malloc(nb), *y = malloc(nb);
        CHECK(!tide_trainer_read(a, nm, x, nb), "%s: reading '%s'", what, nm);
        CHECK(!tide_trainer_read(b, nm, y, nb), "%s: reading the rank's '%s'", what, nm);
        if (tol > 0 && dt == TIDE_F32) {
            double d = 0;
            for (uint64_t k = 0; k < nb / 4; k++) {
                double e = (double)((float *)x)[k] - (double)((float *)y)[k];
                d = e > d ? e : -e > d ? -e : d;
            }
            CHECK(d <= tol, "%s: '%s' differs by %g", what, nm, d);
        } else {
            CHECK(!memcmp(x, y, nb), "%s: '%s' differs", what, nm);
        }
        free(x);
        free(y);
    }
}

int main(void) {
    if (!tide_comm_mpi_available()) {
        printf("skipped: this tide has no MPI (one process's rank is MPI's singleton)\n");
        return 77;
    }
    const char *root = getenv("TIDE_FIXTURES");
    char dir[1024], path[1100];
    snprintf(dir, sizeof dir, "%s/train/train-f32-gqa", root ? root : "tests/fixtures");
    snprintf(path, sizeof path, "%s/data.u16", dir);
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "FAIL: %s\n", path);
        return 1;
    }
    fseek(f, 0, SEEK_END);
    n_data = (size_t)ftell(f) / 2;
    rewind(f);
    data = malloc(n_data * 2);
    if (fread(data, 2, n_data, f) != n_data) return 1;
    fclose(f);

    tide_ctx *ctx = tide_ctx_new();
    tide_ctx_set_threads(ctx, 1);
    tide_checkpoint *ck = NULL;
    tide_backend *be = NULL;
    tide_comm *c = NULL;
    if (tide_checkpoint_open(ctx, dir, &ck) || tide_backend_new(ctx, TIDE_BACKEND_CUDA, &be) ||
        tide_comm_open(ctx, &c)) {
        fprintf(stderr, "FAIL: %s\n", tide_ctx_last_error(ctx));
        return 1;
    }
    tide_comm_set_dev(c, &one_dev, NULL);
    for (int k = 0; k <= 3; k++) {
        /* ZeRO 0 and 1 with --accum 2, 2 with 1, then 2 with 2 */
        const int z = k < 3 ? k : 2;
        const bool near = k == 3;
        tide_trainer_opts o = {.step = {.batch = 2, .seq = 16, .accum = k == 2 ? 1 : 2, .beta1 = 0.9f,
                                        .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .grad_clip = 1.0f},
                               .lr = 1e-3, .min_lr = 1e-4, .cosine = true, .warmup = 1, .total_steps = STEPS};
        char what[64];
        snprintf(what, sizeof what, "ZeRO-%d, accum %d", z, o.step.accum);
        run a, b;
        tide_trainer *ta = train(ctx, ck, be, o, NULL, &a, what);
        o.step.ranks = 1;
        o.step.zero = z;
        o.step.one_rank = true;
        calls = 0;
        tide_trainer *tb = train(ctx, ck, be, o, c, &b, what);
        CHECK(calls > 0, "%s: no collective ran", what);
        if (ta && tb) {
            for (int s = 0; s < STEPS; s++) {
                bool eq = near ? fabs(a.loss[s] - b.loss[s]) <= 1e-5 * fabs(a.loss[s]) &&
                                     fabs(a.norm[s] - b.norm[s]) <= 1e-5 * fabs(a.norm[s])
                               : a.loss[s] == b.loss[s] && a.norm[s] == b.norm[s];
                CHECK(eq, "%s, step %d: loss %.9g vs %.9g, norm %.9g vs %.9g", what, s, a.loss[s], b.loss[s],
                      a.norm[s], b.norm[s]);
            }
            same_state(ta, tb, what, near ? 1e-4 : 0);
        }
        printf("%s: %d collectives in %d steps%s\n", what, calls, STEPS,
               fails ? "" : near ? ", within f32 summation order" : ", bit for bit");
        tide_trainer_free(ta);
        tide_trainer_free(tb);
    }
    tide_comm_close(c);
    tide_backend_free(be);
    tide_checkpoint_free(ck);
    tide_ctx_free(ctx);
    free(data);
    return fails ? 1 : 0;
}
