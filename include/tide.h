/*
 * tide.h - the whole public API of libtide.
 *
 * tide runs models whose tensors do not fit in device memory. A model is
 * described as a graph (tensors with roles, ops in execution order); weights come
 * from Hugging Face-layout safetensors checkpoints; a backend (chosen at run
 * time) computes the ops.
 *
 * Conventions:
 *   - Handles are opaque. Every `_new`/`_open` has a `_free`; `_free(NULL)` is a
 *     no-op.
 *   - Functions that can fail return a tide_status. On failure the context that
 *     was passed in (or the one the handle was made from) holds a message naming
 *     the cause: tide_ctx_last_error(). The library never exits or aborts on a
 *     recoverable error.
 *   - Names are tide_<object>_<verb>.
 */
#ifndef TIDE_H
#define TIDE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Every function declared here is exported from libtide.so; the library is
 * built with hidden visibility, so nothing else is (tests/lib_symbols.sh). */
#if defined(__GNUC__)
#pragma GCC visibility push(default)
#endif

/* ---------------------------------------------------------------- version */

/* The version of this header, as SQLite's SQLITE_VERSION: CMakeLists.txt reads
 * the three numbers from here (its project version, the shared library's
 * SONAME libtide.so.MAJOR, tide.pc and the CMake package). MAJOR changes when
 * the ABI breaks, MINOR when the API grows, PATCH for fixes. */
#define TIDE_VERSION_MAJOR 0
#define TIDE_VERSION_MINOR 1
#define TIDE_VERSION_PATCH 0
#define TIDE_VERSION_STR_(a, b, c) #a "." #b "." #c
#define TIDE_VERSION_XSTR_(a, b, c) TIDE_VERSION_STR_(a, b, c)
/* "MAJOR.MINOR.PATCH" */
#define TIDE_VERSION TIDE_VERSION_XSTR_(TIDE_VERSION_MAJOR, TIDE_VERSION_MINOR, TIDE_VERSION_PATCH)
/* MAJOR * 1000000 + MINOR * 1000 + PATCH, for #if comparisons */
#define TIDE_VERSION_NUMBER (TIDE_VERSION_MAJOR * 1000000 + TIDE_VERSION_MINOR * 1000 + TIDE_VERSION_PATCH)

/* The version of the library linked (TIDE_VERSION when it was built), as
 * sqlite3_libversion(): a program compares it with the TIDE_VERSION it was
 * compiled against to detect a mismatched shared library. */
const char *tide_version(void);

/* ---------------------------------------------------------------- status */

typedef enum tide_status {
    TIDE_OK = 0,
    TIDE_E_INVALID,     /* invalid argument, shape or graph */
    TIDE_E_NOMEM,       /* an allocation failed */
    TIDE_E_IO,          /* a read, write, open or mmap failed */
    TIDE_E_FORMAT,      /* malformed file content (checkpoint, JSON, plan) */
    TIDE_E_NOT_FOUND,   /* named thing (file, tensor, config) does not exist */
    TIDE_E_UNSUPPORTED, /* valid but not supported (dtype, architecture) */
    TIDE_E_RANGE,       /* a value out of its range (token id >= vocab) */
    TIDE_E_INFEASIBLE,  /* no plan fits the budget */
    TIDE_E_NO_DEVICE,   /* the requested device is absent */
    TIDE_E_BACKEND,     /* a backend call failed */
    TIDE_E_VERIFY,      /* a plan failed verification */
    TIDE_E_BUSY,        /* what is asked for is held by others now: try again later */
} tide_status;

/* Returns a short constant English name for a status ("ok", "i/o error", ...). */
const char *tide_status_str(tide_status s);

/* ---------------------------------------------------------------- context */

typedef struct tide_ctx tide_ctx;

/* Returns a new context, or NULL if memory is exhausted. */
tide_ctx *tide_ctx_new(void);
void tide_ctx_free(tide_ctx *ctx);
/* The message of the last failure on this context ("" when none). Valid until
 * the next call that fails on the same context. */
const char *tide_ctx_last_error(const tide_ctx *ctx);
/* Status of the last failure (TIDE_OK when none). */
tide_status tide_ctx_last_status(const tide_ctx *ctx);
/* Threads used by CPU kernels; 0 = all online cores (the default). */
void tide_ctx_set_threads(tide_ctx *ctx, int n_threads);
int tide_ctx_threads(const tide_ctx *ctx);
/* Optional progress callback for long operations (checkpoint generation,
 * loading, running). `what` names the phase, done/total count its units. */
typedef void (*tide_progress_fn)(void *user, const char *what, uint64_t done, uint64_t total);
void tide_ctx_set_progress(tide_ctx *ctx, tide_progress_fn fn, void *user);

/* ---------------------------------------------------------------- memory */

/* The allocator behind the library's own host allocations: contexts, graphs,
 * plans, tables, weight and training-state copies. Not behind memory the
 * library maps from the system or a backend (the executor's host spill pool,
 * pinned memory, checkpoint mappings) nor behind cJSON's parse trees of the
 * JSON files it reads. Each function gets `user` first; alloc and resize
 * return NULL when they cannot, which the library reports as TIDE_E_NOMEM;
 * release(NULL) is never called. */
typedef struct tide_allocator {
    void *(*alloc)(void *user, size_t n);
    void *(*resize)(void *user, void *p, size_t n); /* as realloc: the contents kept */
    void (*release)(void *user, void *p);
    void *user;
} tide_allocator;

/* Makes *a the library's allocator (NULL: the C library's malloc, realloc and
 * free, the default). The library copies *a. Returns TIDE_OK, or
 * TIDE_E_INVALID when a function is missing or when blocks of the current
 * allocator are still live (free every handle first): set it before making
 * the first context. Not thread-safe against other tide calls. */
tide_status tide_set_allocator(const tide_allocator *a);

/* ---------------------------------------------------------------- tensors */

typedef enum tide_dtype {
    TIDE_F32 = 0,
    TIDE_F16,
    TIDE_BF16,
    TIDE_I32,
    /* Block-quantized weight types, byte for byte ggml's layouts (as in GGUF
     * files; docs/quantization.md): a row of n elements is n / block blocks. */
    TIDE_Q8_0, /* 32 elements in 34 bytes: f16 scale, 32 x int8 */
    TIDE_Q4_0, /* 32 in 18: f16 scale, 32 x 4 bits (offset 8) */
    TIDE_Q4_K, /* 256 in 144: f16 d, dmin; 8 x 6-bit scales and mins; 4 bits */
    TIDE_Q5_K, /* 256 in 176: as Q4_K with a fifth bit */
    TIDE_Q6_K, /* 256 in 210: 16 x int8 scales, f16 d; 6 bits */
} tide_dtype;

/* Bytes per element of the scalar types; 0 for a block type or an invalid
 * dtype (use tide_dtype_bytes for sizes). */
size_t tide_dtype_size(tide_dtype dt);
/* Elements per block: 1 for the scalar types, 32 or 256 for the block types;
 * 0 for an invalid dtype. */
int tide_dtype_block(tide_dtype dt);
/* Bytes per block (the element size for the scalar types); 0 if invalid. */
size_t tide_dtype_block_bytes(tide_dtype dt);
/* Bytes of n consecutive elements of a row: n / block blocks. 0 when n is
 * not a whole number of blocks or dt is invalid. */
uint64_t tide_dtype_bytes(tide_dtype dt, uint64_t n);
/* True for the block-quantized types. */
bool tide_dtype_is_quantized(tide_dtype dt);
/* "f32", "f16", "bf16", "i32", "q8_0", "q4_0", "q4_k", "q5_k", "q6_k". */
const char *tide_dtype_name(tide_dtype dt);
/* Parses those names (either case), and "float32", "float16", "bfloat16",
 * "int32". Returns 0 on success, -1 if the name is unknown. */
int tide_dtype_parse(const char *name, tide_dtype *out);

/* Tensor roles (docs/design.md section 3.1). */
typedef enum tide_role {
    TIDE_ROLE_WEIGHT = 0, /* persistent, read-only, clean copy at home */
    TIDE_ROLE_STATE,      /* persistent, read-write (KV cache, optimizer state) */
    TIDE_ROLE_INPUT,
    TIDE_ROLE_OUTPUT,
    TIDE_ROLE_TEMP,       /* activations, workspace */
} tide_role;
const char *tide_role_name(tide_role r);

#define TIDE_MAX_DIMS 4

/* ---------------------------------------------------------------- graph */

/* Op kinds. Activations are f32, row-major; a "row" is one token of one batch
 * element, rows ordered batch-major (row = b*T + t). Weights may be stored as
 * f32, f16 or bf16 and are converted to f32 where the CPU computes.
 * The tiled forms and pos_rows below are what the library's own tiler and
 * model builders make; their parameters (idx0, pos_rows, row0, col0, vocab0,
 * vocab) are not in tide_op_params, so an op added through tide_graph_add_op
 * is always the whole op with a position per step.
 *
 *   EMBED      in: table (V, D), tokens i32 (B, T)            out: (B*T, D)
 *              Tiled forms: the table may be rows [vocab0, vocab0 + V) of a
 *              vocabulary of `vocab` ids (0: V), and the op may take rows
 *              [idx0, idx0 + R) of a longer tokens tensor. The first chunk (2
 *              inputs) zeroes the rows whose id is not in its table; later
 *              chunks take the output as a third input and fill in their ids.
 *   RMSNORM    in: x (R, D), w (D)                            out: (R, D)   [eps]
 *   MATMUL     in: x (R, K), w (N, K)                         out: (R, N) = x . w^T
 *              Tiled form: the result is the block at (row0, col0) of a larger
 *              output; a third input naming the output keeps the rest of it
 *              (a read-modify-write, as the caches in ATTENTION).
 *              [no_transpose: w is (K, N) and out = x . w (the backward of the
 *              forward matmul: dx = dy . w); accumulate: out += the product,
 *              the output its third input]
 *   ROPE       in: x (R, H*hd), pos i32 (T)                   out: (R, H*hd)
 *              [n_heads, head_dim, rope_theta, batch]; HF rotate_half convention;
 *              T = R / batch positions from pos[idx0]. [pos_rows: one
 *              position per row instead, row r at pos[idx0 + r]]
 *   ATTENTION  in: q (R, H*hd), k (R, KV*hd), v (R, KV*hd), pos i32 (T),
 *                  kcache (B, C, KV*hd), vcache (B, C, KV*hd)
 *              out: o (R, H*hd), kcache, vcache
 *              writes k,v rows at cache position pos[t], then causal GQA
 *              attention of each query over cache positions 0..pos[t].
 *              With only the first 4 inputs the caches are written fresh: pos
 *              must be 0..T-1, so nothing but what this op writes is read, and
 *              the caches' old contents need not be loaded.
 *              [pos_rows (6 inputs only): one position per row, row r = b*T + t
 *              at pos[idx0 + r], so that each sequence of a batch is at its own
 *              position (a decode step of several generations at once)]
 *              With 4 inputs and o alone as output there is no cache (a
 *              training forward): each query attends over k and v rows 0..t
 *              of its own sequence.
 *              [n_heads, n_kv_heads, head_dim, batch]
 *   SILU_MUL   in: gate (R, I), up (R, I)                     out: silu(gate)*up
 *   ADD        in: a (R, D), b (R, D)                         out: a + b
 *   TAKE_LAST  in: x (B*T, D)                                 out: (B, D) [batch]
 *              Tiled form: rows [row0, row0 + B) of a larger output; a second
 *              input naming the output keeps its other rows.
 *   ARGMAX     in: x (R, V)                                   out: i32 (R)
 *
 * Training ops (the backward of each forward op, the loss, the optimizer).
 * Every gradient is f32. An op whose gradient output may be accumulated (dw,
 * dtable) takes that output as an extra last input to add into it, and
 * writes it fresh without. Reductions run in a fixed order: results do not
 * depend on the thread count.
 *   EMBED_BWD    in: dy (R, D), tokens i32 (B, T) [, dtable]  out: dtable (V, D)
 *                dtable[tokens[idx0 + r]] += dy[r] for every row r, rows in
 *                order; without the third input dtable is zeroed first [idx0]
 *                Vocabulary block: dtable holds rows [vocab0, vocab0 + V) of
 *                the gradient of a vocabulary of `vocab` ids; a token outside
 *                the block adds nothing there [vocab0, vocab]
 *   RMSNORM_BWD  in: x (R, D), w (D), dy (R, D) [, dw]        out: dx (R, D), dw (D)
 *                the gradients of y = x / sqrt(mean(x^2) + eps) * w [eps]
 *   MATMUL_GRADW in: dy (R, N), x (R, K) [, dw]               out: dw (N, K) = dy^T . x
 *   ROPE_BWD     in: dy (R, H*hd), pos i32 (T)                out: dx (R, H*hd)
 *                the gradient of ROPE (the rotation by minus its angle) [as ROPE]
 *   ATTENTION_BWD in: q, k, v, o, do (the rows of ATTENTION's q, k, v, its
 *                output and that output's gradient), pos i32 (T)
 *                out: dq (R, H*hd), dk (R, KV*hd), dv (R, KV*hd)
 *                the gradients of causal GQA attention of a fresh sequence
 *                (pos 0..T-1 for each of the batch's sequences), the softmax
 *                recomputed from q and k [n_heads, n_kv_heads, head_dim, batch]
 *   SILU_MUL_BWD in: gate (R, I), up (R, I), dy (R, I)        out: dgate, dup
 *   CROSS_ENTROPY in: h (R, D), w (V, D), targets i32 (R, or rows idx0..
 *                idx0+R of a longer one) [, dw [, loss]]
 *                out: loss (1), dh (R, D), dw (V, D); with dw among the
 *                inputs dw adds into it, with loss too the loss does (a row
 *                tile of a batch)
 *                logits = h . w^T, computed a chunk of rows at a time (never
 *                all R x V at once); loss = scale * sum over rows of
 *                (logsumexp(logits) - logits[target]); dh = scale * (softmax -
 *                onehot) . w; dw = scale * (softmax - onehot)^T . h. A
 *                negative target contributes nothing [scale]
 *   CE_STATS, CE_BLOCK: CROSS_ENTROPY over a head in vocabulary blocks, w
 *                (Vb, D) being rows [vocab0, vocab0 + Vb) of a head of
 *                `vocab` ids (targets must be below vocab), so that no op
 *                holds the whole head or its gradient. First every block's
 *                CE_STATS in vocabulary order, then every block's CE_BLOCK:
 *   CE_STATS     in: h (R, D), w (Vb, D), targets i32 [, stats (R, 3)] [, loss (1)]
 *                out: stats (R, 3) [, loss (1)]
 *                each row's running (max logit M, sum of exp(logit - M) S,
 *                the target's logit t) merged with this block's; the first
 *                block (vocab0 0) takes no stats. The last block (vocab0 + Vb
 *                = vocab) writes the loss too, scale times the sum over rows
 *                with a target >= 0 of M + log S - t (in double, row order),
 *                adding into its 5th input with `accumulate` [vocab0, vocab,
 *                idx0, scale, accumulate]
 *   CE_BLOCK     in: h (R, D), w (Vb, D), targets i32, stats (R, 3) [, dh] [, dw]
 *                out: dh (R, D), dw (Vb, D)
 *                g = scale * (exp(logit - M - log S) - onehot) (a zero row
 *                where the target < 0); dh = g . w, adding into its 5th input
 *                for every block past the first (vocab0 > 0); dw = g^T . h,
 *                adding into its last input with `accumulate` [vocab0, vocab,
 *                idx0, scale, accumulate]
 *   SUMSQ        in: g (any shape, f32) [, acc (1)]           out: acc (1) = acc + sum g^2
 *   ADAMW        in: param, [master (f32),] m, v, grad, hyper (4), sumsq (1)
 *                out: param, [master,] m, v
 *                one step of torch.optim.AdamW on the f32 master (or on param
 *                itself when it is f32, then without master), param then set
 *                to the master rounded to its dtype. The gradient is first
 *                scaled by min(1, max_norm / (sqrt(sumsq) + 1e-6)), the global
 *                clipping of torch.nn.utils.clip_grad_norm_ (max_norm 0: none).
 *                hyper = {lr, lr / (1 - beta1^t), sqrt(1 - beta2^t), gs},
 *                t the step from 1, the second (torch's step size) formed in
 *                double and rounded once; gs > 0 multiplies the gradient
 *                before the clipping (whose norm is then gs * sqrt(sumsq)),
 *                0 is 1, gs < 0 skips the update (nothing is written). [beta1, beta2, adam_eps,
 *                weight_decay, max_norm]
 */
typedef enum tide_op_kind {
    TIDE_OP_EMBED = 0,
    TIDE_OP_RMSNORM,
    TIDE_OP_MATMUL,
    TIDE_OP_ROPE,
    TIDE_OP_ATTENTION,
    TIDE_OP_SILU_MUL,
    TIDE_OP_ADD,
    TIDE_OP_TAKE_LAST,
    TIDE_OP_ARGMAX,
    /* 9 is the library's own synthetic op (planning tests, benchmarks) */
    TIDE_OP_EMBED_BWD = 10,
    TIDE_OP_RMSNORM_BWD,
    TIDE_OP_MATMUL_GRADW,
    TIDE_OP_ROPE_BWD,
    TIDE_OP_ATTENTION_BWD,
    TIDE_OP_SILU_MUL_BWD,
    TIDE_OP_CROSS_ENTROPY,
    TIDE_OP_SUMSQ,
    TIDE_OP_ADAMW,
    TIDE_OP_CE_STATS,
    TIDE_OP_CE_BLOCK,
    TIDE_OP_ADD_BIAS, /* out (R, N) = x (R, N) + b (N), b a WEIGHT (Qwen2's q/k/v biases) */
} tide_op_kind;
const char *tide_op_name(tide_op_kind k);

#define TIDE_OP_MAX_IN 8
#define TIDE_OP_MAX_OUT 4

typedef struct tide_op_params {
    float eps;        /* RMSNORM */
    float rope_theta; /* ROPE */
    int n_heads;      /* ROPE, ATTENTION */
    int n_kv_heads;   /* ATTENTION */
    int head_dim;     /* ROPE, ATTENTION */
    int batch;        /* ROPE, ATTENTION, TAKE_LAST: B (rows = B*T) */
    /* training */
    bool no_transpose; /* MATMUL: out = x . w, w (K, N) */
    bool accumulate;   /* MATMUL: out += the product (the output its third input);
                          CE_STATS: the loss adds; CE_BLOCK: dw adds */
    float scale;       /* CROSS_ENTROPY, CE_*: the factor of the loss and its gradients */
    float beta1, beta2, adam_eps, weight_decay, max_norm; /* ADAMW */
} tide_op_params;

typedef struct tide_graph tide_graph;

/* Returns a new empty graph, or NULL (message in ctx). */
tide_graph *tide_graph_new(tide_ctx *ctx);
void tide_graph_free(tide_graph *g);

/* Adds a tensor. `name` must be unique in the graph (persistent tensors are
 * matched to checkpoint and state by name). On success *id is its index.
 * Returns TIDE_OK, TIDE_E_INVALID (bad shape, dtype, role, duplicate name) or
 * TIDE_E_NOMEM. */
tide_status tide_graph_add_tensor(tide_graph *g, const char *name, tide_dtype dt,
                                  tide_role role, int ndim, const int64_t *shape,
                                  int *id);
/* Marks the decoder layer a tensor or op belongs to (-1: none); used by the
 * per-layer baseline policy and by progress reports. */
void tide_graph_set_tensor_layer(tide_graph *g, int tensor, int layer);

/* Appends an op (ops run in the order they are added). Arity, shapes and dtypes
 * are checked against the kind's contract above. On success *id (may be NULL)
 * is the op's index. Returns TIDE_OK, TIDE_E_INVALID or TIDE_E_NOMEM. */
tide_status tide_graph_add_op(tide_graph *g, tide_op_kind kind, int n_in, const int *in,
                              int n_out, const int *out, const tide_op_params *params,
                              int layer, int *id);

int tide_graph_n_tensors(const tide_graph *g);
int tide_graph_n_ops(const tide_graph *g);
/* Index of the tensor with this name, or -1. */
int tide_graph_find(const tide_graph *g, const char *name);
const char *tide_graph_tensor_name(const tide_graph *g, int id);
tide_role tide_graph_tensor_role(const tide_graph *g, int id);
tide_dtype tide_graph_tensor_dtype(const tide_graph *g, int id);
uint64_t tide_graph_tensor_bytes(const tide_graph *g, int id);
/* Fills shape[0..ndim-1]; returns ndim. */
int tide_graph_tensor_shape(const tide_graph *g, int id, int64_t shape[TIDE_MAX_DIMS]);
/* Total bytes of all tensors of a role. */
uint64_t tide_graph_role_bytes(const tide_graph *g, tide_role role);
/* Estimated floating-point operations of the whole graph. */
double tide_graph_flops(const tide_graph *g);

/* ---------------------------------------------------------------- LLaMA */

/* Per-weight storage types of a checkpoint that mixes them (GGUF files keep
 * the norms in f32 and some projections in Q6_K beside Q4_K). */
#define TIDE_LLAMA_MAX_LAYERS 256
typedef enum tide_llama_wrole {
    TIDE_W_Q = 0, TIDE_W_K, TIDE_W_V, TIDE_W_O, TIDE_W_GATE, TIDE_W_UP, TIDE_W_DOWN,
    TIDE_W_LAYER_ROLES
} tide_llama_wrole;
typedef struct tide_llama_wtypes {
    uint8_t embed, head, norm;                               /* tide_dtype values */
    uint8_t layer[TIDE_LLAMA_MAX_LAYERS][TIDE_W_LAYER_ROLES]; /* by tide_llama_wrole */
} tide_llama_wtypes;

typedef struct tide_llama_config {
    char name[64];
    int hidden_size;
    int intermediate_size;
    int num_hidden_layers;
    int num_attention_heads;
    int num_key_value_heads;
    int vocab_size;
    int max_position_embeddings;
    float rms_norm_eps;
    float rope_theta;
    bool tie_word_embeddings;
    tide_dtype dtype; /* storage dtype of the weights ("torch_dtype"); a block
                         type leaves the norms in f32 */
    bool wtypes_set;  /* each weight's type is in wtypes instead (at most
                         TIDE_LLAMA_MAX_LAYERS layers) */
    tide_llama_wtypes wtypes;
    bool qkv_bias;    /* q_proj, k_proj and v_proj have biases "...q_proj.bias" (Qwen2) */
    bool qk_interleaved; /* q_proj and k_proj rows in llama.cpp's GGUF order (each
                            head's rotary pairs adjacent): RoPE reads them so and
                            writes Hugging Face's order, so results are equal */
    /* A LoRA adapter applied at run time (tide_checkpoint_add_lora; lora_r 0:
     * none): every targeted projection W (N, K) of every layer adds
     * (lora_alpha / lora_r) (x A^T) B^T, A (lora_r, K) and B (N, lora_r)
     * WEIGHTs of lora_dtype (f32, f16 or bf16) named as PEFT saves them. */
    int lora_r;
    float lora_alpha;
    unsigned lora_targets; /* TIDE_LORA_* bits */
    tide_dtype lora_dtype;
} tide_llama_config;

/* The storage dtype of the weight of that Hugging Face name under cfg
 * ("model.layers.3.self_attn.v_proj.weight", "model.norm.weight", ...);
 * cfg->dtype for a name it does not know. */
tide_dtype tide_llama_weight_dtype(const tide_llama_config *cfg, const char *name);

/* Fills *cfg with a built-in configuration with true shapes: "tinyllama-1.1b",
 * "llama-7b", "llama-13b", "llama-65b", "llama-2-70b". Returns TIDE_OK or
 * TIDE_E_NOT_FOUND (message lists the known names). */
tide_status tide_llama_config_named(tide_ctx *ctx, const char *name, tide_llama_config *cfg);
/* Names of the built-in configurations, NULL-terminated. */
const char *const *tide_llama_config_names(void);
/* Reads a Hugging Face config.json. Returns TIDE_OK, TIDE_E_IO, TIDE_E_FORMAT
 * (malformed JSON, missing or invalid field: the message names it) or
 * TIDE_E_UNSUPPORTED (not a LLaMA-family architecture). */
tide_status tide_llama_config_load(tide_ctx *ctx, const char *path, tide_llama_config *cfg);
/* Writes a Hugging Face config.json for cfg. Written to a temporary name and
 * renamed, so a failure never leaves a partial file. */
tide_status tide_llama_config_save(tide_ctx *ctx, const tide_llama_config *cfg, const char *path);
/* Checks a configuration's values; TIDE_E_INVALID names the bad field. */
tide_status tide_llama_config_check(tide_ctx *ctx, const tide_llama_config *cfg);
/* Number of parameters. */
uint64_t tide_llama_config_params(const tide_llama_config *cfg);

/* The quantization mixes of llama.cpp's quantizer (docs/quantization.md):
 * "Q8_0", "Q4_0", "Q4_K_M", "Q5_K_M", "Q6_K" (either case). Fills cfg's
 * per-weight types (wtypes, wtypes_set) as llama.cpp's quantizer would store
 * them for that model: the mix's base type for every 2-D weight, norms f32,
 * the output head (the embedding when tied) in Q6_K, attn_v and ffn_down in
 * Q6_K on llama.cpp's "more bits" layers for the _M mixes, and its fallbacks
 * where rows are not whole blocks (to tide's nearest type with more bits).
 * cfg->dtype becomes the base type. Returns TIDE_OK, TIDE_E_NOT_FOUND (an
 * unknown mix; the message lists the known ones), TIDE_E_INVALID (more than
 * TIDE_LLAMA_MAX_LAYERS layers) or TIDE_E_UNSUPPORTED (rows that are not whole
 * 32-element blocks under a Q8_0 or Q4_0 mix, which llama.cpp refuses too). */
tide_status tide_quant_mix_apply(tide_ctx *ctx, const char *mix, tide_llama_config *cfg);
/* Names of the mixes, NULL-terminated. */
const char *const *tide_quant_mix_names(void);

/* What tide_quantize_checkpoint wrote: per storage type (indexed by
 * tide_dtype) the number of tensors, their elements and their bytes. */
#define TIDE_QUANT_STAT_TYPES 16
typedef struct tide_quantize_stats {
    int tensors[TIDE_QUANT_STAT_TYPES];
    uint64_t elements[TIDE_QUANT_STAT_TYPES], bytes[TIDE_QUANT_STAT_TYPES];
    int fallbacks;            /* weights stored in another type than the mix's rule gives
                                 because their rows are not whole blocks of it */
    uint64_t file_bytes;      /* size of the GGUF file */
    char tokenizer[16];       /* tokenizer.ggml.model written: "llama", "gpt2", or
                                 "none" (no tokenizer.json: a placeholder vocabulary) */
    int32_t n_vocab_tokens;   /* tokens from tokenizer.json (the rest of the vocabulary
                                 padded with unused placeholders) */
} tide_quantize_stats;

/* Quantizes a checkpoint (a Hugging Face-layout directory or a GGUF file, read
 * by tide_checkpoint_open; a GGUF's weights are dequantized first and its
 * tokenizer.* metadata copied) into a GGUF v3 file at out_path that llama.cpp reads:
 * llama.cpp's tensor names, q_proj/k_proj rows permuted to llama.cpp's rotary
 * order, types per tide_quant_mix_apply(mix), the llama.* metadata,
 * general.file_type, and the tokenizer of the directory's tokenizer.json (with
 * tokenizer_config.json's BOS/EOS and chat template). Written to a temporary
 * name and renamed. st may be NULL. Returns TIDE_OK; TIDE_E_NOT_FOUND (unknown
 * mix, no checkpoint), TIDE_E_FORMAT / TIDE_E_UNSUPPORTED (a checkpoint or
 * tokenizer it cannot convert, a non-finite weight: named), TIDE_E_IO (cannot
 * write: the cause named, e.g. no space left), TIDE_E_NOMEM. */
tide_status tide_quantize_checkpoint(tide_ctx *ctx, const char *in_dir, const char *out_path, const char *mix,
                                     tide_quantize_stats *st);

typedef struct tide_llama_graph_opts {
    int batch;        /* B >= 1 */
    int seq;          /* T >= 1: tokens processed by this graph */
    int ctx_len;      /* KV cache capacity C >= positions used (0: seq) */
    bool all_logits;  /* logits for every row (B*T, V) instead of the last (B, V) */
    bool fresh_cache; /* the run starts at position 0: attention writes the caches
                         without reading their old contents (pos must be 0..T-1) */
    bool row_pos;     /* "pos" is (B*T): a position per row (row b*T + t), so that each
                         sequence of the batch is at its own position (several
                         generations' decode steps as one forward); not with
                         fresh_cache */
    int cache_row;    /* batch row b uses row cache_row + b of the caches: the cache
                         tensors are byte ranges of "cache.L.k" / "cache.L.v" of
                         (cache_row + B) rows or more (0: rows 0..B-1) */
    /* Tiling, for budgets below the largest op's working set (0: none). The
     * rows become tiles of at most tile_rows tokens of one sequence, each op
     * run tile by tile (attention reading the cache written by the tiles
     * before it); weights larger than tile_weight_bytes are split into row
     * blocks (contiguous in the checkpoint), each matmul writing its block of
     * columns and the embedding filling in its ids. Results are bit-identical
     * to the untiled graph's on the CPU, and on CUDA for 16-bit and
     * block-quantized weights in the fast matmul mode (quantized: also in the
     * f32 mode below 16 rows, docs/cuda_quant.md); CUDA's f32 GEMM (f32 weights, or the f32 mode)
     * picks cuBLAS kernels by a call's rows, so row tiles there agree to f32
     * rounding. */
    int tile_rows;
    uint64_t tile_weight_bytes;
    /* The KV caches' type (tide_cache_dtype_ok): TIDE_F32 (0, the default),
     * TIDE_F16 or TIDE_BF16 (round to nearest even) or TIDE_Q8_0 (blocks of
     * 32 along a cache row, ggml's reference quantizer; head_dim a multiple
     * of 32). Attention writes the new rows rounded to it and reads every
     * position, the current ones too, back from the cache, so a prefill
     * followed by decode steps computes what one longer prefill does
     * (docs/quantization.md). */
    tide_dtype cache_dtype;
} tide_llama_graph_opts;

/* Whether dt can be a KV cache's type for a model of this configuration:
 * TIDE_OK, or TIDE_E_INVALID with a message naming the cause (ctx may be
 * NULL). */
tide_status tide_cache_dtype_ok(tide_ctx *ctx, const tide_llama_config *cfg, tide_dtype dt);

/* Builds the forward graph of a LLaMA-style decoder. Tensor names of weights
 * follow Hugging Face ("model.layers.3.mlp.up_proj.weight"); inputs are "tokens"
 * (B, T) and "pos" (T, or B*T with row_pos); state is "cache.L.k" / "cache.L.v"
 * (B, C, KV*hd, opts->cache_dtype; byte ranges of them named "cache.L.k.rN" with a
 * cache_row, "cache.L.k.bS" when tiled); outputs are "logits" and "next_token". */
tide_status tide_llama_build(tide_ctx *ctx, const tide_llama_config *cfg,
                             const tide_llama_graph_opts *opts, tide_graph **out);

/* A training step (TIDE_OP_* training ops): `accum` micro-batches of
 * (batch, seq) tokens, each a forward that keeps what its backward reads and
 * a backward in reverse order adding into the parameters' gradients, then the
 * global gradient norm and one AdamW update of every parameter. */
typedef struct tide_llama_train_opts {
    int batch, seq;    /* per micro-batch; seq <= max_position_embeddings */
    int accum;         /* micro-batches per step, >= 1 */
    float beta1, beta2, eps, weight_decay; /* AdamW (decay on tensors of >= 2 dims) */
    float grad_clip;   /* the global gradient norm's limit (0: no clipping) */
    bool grads_out;    /* the gradients are OUTPUTs (readable after a step, before
                          clipping: gradient checks) instead of TEMPs */
    int tile_seqs;     /* row tiles: each micro-batch runs as tiles of this many
                          whole sequences, every op once per tile (0, or >=
                          batch: one tile). A tile's ops hold a tile's rows, so
                          the largest op's working set shrinks with the tile;
                          the weight gradients, the loss and the head's gradient
                          add up over the tiles. The same step up to f32
                          summation order (bit for bit with the same tiles) */
    int vocab_blocks;  /* the embedding and the head (each a vocab x hidden
                          parameter) in this many blocks of rows (0 or 1:
                          whole; at most TIDE_VOCAB_BLOCKS_MAX): their forward,
                          loss (CE_STATS, CE_BLOCK), backward and AdamW run a
                          block at a time, so no op holds a whole one, its
                          gradient or its optimizer state. Block k of a
                          parameter NAME is the STATE "NAME.vK" (its master and
                          moments "master.NAME.vK", ...), homed at its rows of
                          NAME (tide_graph_tensor_home). The same step up to
                          f32 summation order in the loss */
    /* LoRA (lora_r > 0): the base weights are frozen WEIGHTs (no gradient,
     * master or moments) and each targeted projection W (N, K) of every
     * layer gets f32 STATE adapters A (r, K) and B (N, r), named as PEFT
     * saves them ("base_model.model.model.layers.L.self_attn.q_proj.lora_A.
     * weight", ...): y = x W^T + (alpha / r) (x A^T) B^T. The scale is the
     * INPUT "lora_scale" (r, r) = (alpha / r) I. AdamW runs over the
     * adapters alone. */
    int lora_r;
    float lora_alpha;
    unsigned lora_targets; /* TIDE_LORA_* bits; 0: all seven */
    int ranks;         /* data-parallel ranks (0 or 1: one device): the graph is
                          one rank's step over its own micro-batches, with the
                          collectives of `zero` (src/train/train_ranks.c). A
                          trainer runs it with a communicator
                          (tide_trainer_set_comm): MPI on the CPU backend,
                          NCCL on CUDA */
    int zero;          /* with ranks >= 2, the ZeRO stage: 0 every rank a full
                          copy (gradients all-reduced), 1 optimizer state
                          sharded, 2 state and gradients sharded */
    bool one_rank;     /* with ranks 1: the step of one rank all the same, its
                          collectives over a communicator of one (NCCL's check
                          on one GPU: tide train --ranks 1 --comm nccl) */
    int precision;     /* TIDE_PRECISION_F32 (0: everything f32) or
                          TIDE_PRECISION_BF16: the activations the backward
                          keeps stored in bf16 and every product of the step
                          on bf16-rounded operands with f32 accumulation, as
                          torch.autocast(bfloat16); norms, softmax, loss,
                          gradients and AdamW stay f32 (docs/training.md
                          section 13). The CPU backend runs it; the CUDA
                          backend refuses it (TIDE_E_UNSUPPORTED) */
} tide_llama_train_opts;
/* Training precision (tide_llama_train_opts.precision). */
#define TIDE_PRECISION_F32 0
#define TIDE_PRECISION_BF16 1
#define TIDE_PRECISION_AUTO 2 /* for tide_train_precision_resolve only */
/* "f32", "bf16", "auto"; NULL for another value. */
const char *tide_train_precision_name(int precision);
/* Parses "f32", "bf16" or "auto" into *precision; TIDE_E_INVALID otherwise. */
tide_status tide_train_precision_parse(tide_ctx *ctx, const char *s, int *precision);
/* The precision `auto` stands for: on a GPU (gpu true) f32 (bf16 training
 * is not implemented there yet); on this CPU bf16 when it has AVX512_BF16,
 * else f32. Any other value is returned as it is. */
int tide_train_precision_resolve(int precision, bool gpu);
/* The code path of a bf16 step's products on this CPU: "avx512_bf16
 * (vdpbf16ps)", or without AVX512_BF16 the bf16 pairs widened into f32 FMAs
 * ("avx512 ...", "avx2 ...", "portable ..."). */
const char *tide_train_bf16_path(void);
/* LoRA targets, in the order of --lora-targets' names q,k,v,o,gate,up,down */
#define TIDE_LORA_Q 1u
#define TIDE_LORA_K 2u
#define TIDE_LORA_V 4u
#define TIDE_LORA_O 8u
#define TIDE_LORA_GATE 16u
#define TIDE_LORA_UP 32u
#define TIDE_LORA_DOWN 64u
#define TIDE_LORA_ALL 127u
#define TIDE_LORA_N 7
/* The PEFT module name of target i (0..TIDE_LORA_N-1: "q_proj", ...,
 * "down_proj"), NULL past the last. */
const char *tide_lora_target_name(int i);
/* Parses a comma-separated list of q,k,v,o,gate,up,down (or their PEFT
 * names q_proj, ...) into *bits; TIDE_E_INVALID naming an unknown one. */
tide_status tide_lora_parse_targets(tide_ctx *ctx, const char *list, unsigned *bits);
#define TIDE_VOCAB_BLOCKS_MAX 64

/* Builds the graph of one training step. Tensors:
 *   parameters     Hugging Face names, the checkpoint's dtype         STATE
 *   "master.NAME"  f32 copy of a 16-bit parameter (none for f32 ones) STATE
 *   "exp_avg.NAME", "exp_avg_sq.NAME"  AdamW moments, f32             STATE
 *   "tokens.M" (B, T) i32, "targets.M" (B*T) i32, micro-batch M       INPUT
 *   "pos" (T) i32 = 0..T-1; "hyper" (4) f32 = {lr, lr / (1 - beta1^t),
 *   sqrt(1 - beta2^t), 0} for step t (from 1), as ADAMW takes it       INPUT
 *   "loss.M" (1) f32: micro-batch M's mean cross-entropy / accum       OUTPUT
 *   "grad_sumsq" (1) f32: the squared global norm of the gradients     OUTPUT
 *   "grad.NAME" f32 gradients (OUTPUT with grads_out)                  TEMP
 *   "mbM.*" activations and their gradients                            TEMP
 * A target < 0 is ignored (it adds nothing to the loss). */
tide_status tide_llama_build_train(tide_ctx *ctx, const tide_llama_config *cfg,
                                   const tide_llama_train_opts *opts, tide_graph **out);

/* What a tensor of a training graph holds, for memory reports. */
typedef enum tide_train_class {
    TIDE_TRAIN_PARAM = 0, TIDE_TRAIN_MASTER, TIDE_TRAIN_MOMENT, TIDE_TRAIN_GRAD,
    TIDE_TRAIN_ACT,       /* activations, their gradients, loss, norm */
    TIDE_TRAIN_INPUT,     /* tokens, targets, positions, hyperparameters */
} tide_train_class;
tide_train_class tide_train_tensor_class(const tide_graph *g, int tensor);
const char *tide_train_class_name(tide_train_class c);

/* Tiling levels tried when a budget is below a graph's working set: level 0
 * is no tiling; each next level halves the tile rows (from the sequence
 * length, at least 16) and the largest weight block (from 64 MiB, at least
 * 1 MiB). Sets o's tile fields for level `level` of a graph of (batch, seq);
 * returns false past the last level. */
#define TIDE_TILE_LEVELS 7
/* How a graph is tiled (tide_offload_opts.tile): TIDE_TILE_AUTO picks a
 * level, TIDE_TILE_NONE never tiles, 1..TIDE_TILE_LEVELS-1 forces a level. */
#define TIDE_TILE_AUTO 0
#define TIDE_TILE_NONE (-1)
bool tide_llama_tile_level(tide_llama_graph_opts *o, int level);
/* The tiling levels of a training step: level 0 is no tiling, level k >= 1
 * tiles each micro-batch by ceil(batch / 2^k) sequences, down to one; the
 * levels after that keep tiles of one sequence and split the embedding and
 * the head into 2, 4, 8, ... vocabulary blocks (vocab_blocks). Sets
 * o->tile_seqs and o->vocab_blocks for `level` (below TIDE_TILE_LEVELS);
 * returns false past the last level. */
bool tide_llama_train_tile_level(tide_llama_train_opts *o, int level);

/* A persistent tensor may be a byte range of a larger one: a weight block of a
 * checkpoint tensor, a batch row of a KV cache. home names the whole tensor
 * (checkpoint or state name), offset its first byte; TIDE_OK or TIDE_E_NOMEM.
 * tide_graph_tensor_home returns the tensor's own name and offset 0 when it is
 * whole. */
tide_status tide_graph_set_tensor_home(tide_graph *g, int tensor, const char *home, uint64_t offset);
const char *tide_graph_tensor_home(const tide_graph *g, int tensor, uint64_t *offset);

/* ---------------------------------------------------------------- checkpoints */

/* A checkpoint: a Hugging Face-layout model directory (config.json plus
 * model.safetensors, or shards listed by model.safetensors.index.json), or a
 * GGUF file (llama.cpp's format, docs/gguf.md: the configuration from its
 * metadata, its tensors under Hugging Face names and shapes). Tensor data is
 * memory-mapped and validated when opened. */
typedef struct tide_checkpoint tide_checkpoint;

/* Opens dir (a directory, or the path of a .gguf file). Returns TIDE_OK;
 * TIDE_E_NOT_FOUND, TIDE_E_IO, TIDE_E_FORMAT (damaged) or TIDE_E_UNSUPPORTED
 * (valid, but a model tide does not run) with a message naming the file,
 * tensor or key and the problem. */
tide_status tide_checkpoint_open(tide_ctx *ctx, const char *dir, tide_checkpoint **out);
void tide_checkpoint_free(tide_checkpoint *ck);
const tide_llama_config *tide_checkpoint_config(const tide_checkpoint *ck);
int tide_checkpoint_n_tensors(const tide_checkpoint *ck);
/* Looks up a tensor by name: its dtype, shape, data (mapped, read-only), the file
 * it lives in and its byte offset there. Returns TIDE_OK or TIDE_E_NOT_FOUND. */
typedef struct tide_tensor_info {
    const char *name;
    tide_dtype dtype;
    int ndim;
    int64_t shape[TIDE_MAX_DIMS];
    uint64_t nbytes;
    const void *data;
    const char *file;
    uint64_t file_offset;
} tide_tensor_info;
tide_status tide_checkpoint_get(const tide_checkpoint *ck, const char *name, tide_tensor_info *info);
tide_status tide_checkpoint_get_index(const tide_checkpoint *ck, int i, tide_tensor_info *info);
/* Reads the whole mapped checkpoint into memory once (progress "loading"), so
 * that later runs are not slowed by page faults. Returns TIDE_OK or TIDE_E_IO. */
tide_status tide_checkpoint_prefetch(tide_checkpoint *ck);
/* Checks that every WEIGHT tensor of g is in the checkpoint with the same dtype
 * and shape, and that the checkpoint has no tensor the graph does not use.
 * Returns TIDE_OK or TIDE_E_FORMAT naming the first offending tensor. */
tide_status tide_checkpoint_match(const tide_checkpoint *ck, const tide_graph *g);
/* Applies a PEFT LoRA adapter directory to an open checkpoint, before any
 * model is made of it: adapter_config.json (as tide_lora_read_config reads
 * it) and adapter_model.safetensors, mapped like the checkpoint's own files,
 * whose lora_A / lora_B weights (all f32, f16 or bf16) must be exactly those
 * of the config's targets on every layer, each of its projection's shape.
 * The adapter's tensors join the checkpoint's, and its config's lora_*
 * fields are set, so every graph built from that config
 * (tide_llama_build) computes the adapter's branch beside the base matmul:
 * PEFT's unmerged forward, on any base dtype. TIDE_OK; TIDE_E_NOT_FOUND (a
 * file missing), TIDE_E_FORMAT (a bad config, tensor, dtype or shape, a
 * missing or extra tensor: named), TIDE_E_UNSUPPORTED (q_proj or k_proj on
 * a GGUF base, whose rows are in llama.cpp's rotary order; an adapter
 * applied already), TIDE_E_NOMEM. On failure ck is unchanged. */
tide_status tide_checkpoint_add_lora(tide_checkpoint *ck, const char *dir);
/* Writes the checkpoint with its applied adapter merged in, as PEFT's
 * merge_and_unload does, into the new directory dir: model.safetensors with
 * every base tensor in its own dtype, each targeted projection W replaced by
 * W + (alpha / r) B A (summed in double, rounded once to W's dtype), the
 * base's config.json and tokenizer files (tokenizer.json,
 * tokenizer_config.json, tokenizer.model, special_tokens_map.json,
 * generation_config.json, chat_template.jinja, where present) copied. Built
 * in "<dir>.tmp-merge-<pid>" and renamed to dir when whole; on failure
 * nothing is left. TIDE_OK; TIDE_E_INVALID (no adapter applied; dir exists);
 * TIDE_E_UNSUPPORTED (a GGUF or quantized base); TIDE_E_IO naming the path
 * and cause; TIDE_E_NOMEM. */
tide_status tide_checkpoint_save_merged(tide_checkpoint *ck, const char *dir);

/* Writes a deterministic synthetic checkpoint for cfg into dir (created if
 * needed): config.json and model.safetensors (sharded when larger than
 * shard_bytes, 0 = never), weights drawn from a seeded generator and stored in
 * cfg->dtype. Files are written under temporary names and renamed when
 * complete. */
tide_status tide_checkpoint_make_synthetic(tide_ctx *ctx, const tide_llama_config *cfg,
                                           uint64_t seed, uint64_t shard_bytes,
                                           const char *dir);

/* ---------------------------------------------------------------- backends */

typedef enum tide_backend_kind {
    TIDE_BACKEND_AUTO = 0, /* CUDA when a GPU is present, else CPU */
    TIDE_BACKEND_CPU,
    TIDE_BACKEND_CUDA,
} tide_backend_kind;

typedef struct tide_backend tide_backend;
/* Returns TIDE_OK, TIDE_E_NO_DEVICE (asked for CUDA, none present) or
 * TIDE_E_UNSUPPORTED (backend not built in). */
tide_status tide_backend_new(tide_ctx *ctx, tide_backend_kind kind, tide_backend **out);
void tide_backend_free(tide_backend *be);
const char *tide_backend_name(const tide_backend *be);
/* What the backend runs, in words, for summaries: on the CPU the matmul
 * kernels of its current mode, the instruction sets detected at run time
 * (cpuid) and the BLAS behind the training products, e.g. "matmul
 * avx512_bf16 gemm/gemv (...); ...; cpu: avx2 avx512f ...". The string is
 * valid until the calling thread's next call. */
const char *tide_backend_kernels(const tide_backend *be);

/* How MATMUL multiplies f16/bf16 weights (f32 weights are always multiplied
 * in f32, and every mode accumulates in f32 and writes f32 outputs). */
typedef enum tide_matmul_mode {
    TIDE_MATMUL_AUTO = 0, /* FAST on CUDA and on CPUs with AVX512_BF16, else F32 */
    TIDE_MATMUL_F32,      /* weights widened exactly to f32, activations kept in
                             f32: the CPU's results up to f32 summation order */
    TIDE_MATMUL_FAST,     /* weights multiplied as stored, activations rounded
                             to the weights' dtype once per matmul, f32 sums
                             (the precision of a bf16/f16 PyTorch model): CUDA
                             on tensor cores; the CPU for bf16 weights with
                             AVX512_BF16 (elsewhere its f32 kernels run) */
} tide_matmul_mode;

/* Sets the backend's matmul mode (AUTO resolves to the backend's default).
 * Takes effect on the next op;
 * results are bit-reproducible within one mode, not across modes. */
tide_status tide_backend_set_matmul(tide_backend *be, tide_matmul_mode mode);
/* The mode in effect (never AUTO). */
tide_matmul_mode tide_backend_matmul(const tide_backend *be);
/* The mode's name ("auto", "f32", "fast"; NULL for an unknown value), and
 * its parser (TIDE_E_INVALID naming the string; ctx may be NULL). */
const char *tide_matmul_name(tide_matmul_mode mode);
tide_status tide_matmul_parse(tide_ctx *ctx, const char *s, tide_matmul_mode *out);

/* ---------------------------------------------------------------- running */

/* A model ready to run: checkpoint weights bound to a backend, plus the state
 * (KV cache) that persists between graph runs.
 *
 * Every graph runs through a verified plan on the executor (the planned
 * engine): resident (the default, no budget) with an unconstrained plan, whose
 * weights and cache stay in device memory across runs (or, where device
 * memory is host memory, are used where they are), or offloaded under a
 * budget (tide_model_set_offload). The plain engine (tide_model_set_engine)
 * runs every op in order with no planner, verifier or executor: the
 * independent reference bit-identity is checked against. Several models may
 * share one backend instance and run interleaved, from one thread or several
 * (one context per thread). */
typedef struct tide_model tide_model;

typedef struct tide_model_opts {
    size_t size;      /* sizeof(tide_model_opts), as tide_model_opts_default()
                         sets it; 0 (a zeroed struct): this version's; another
                         size is refused (TIDE_E_INVALID) */
    int max_batch;    /* cache batch capacity (>= 1) */
    int ctx_len;      /* KV cache capacity in positions (0: config's max) */
    bool sync_issue;  /* issue every device call only once the previous one has
                         completed, even on a backend with events (slower; it names
                         the failing instruction of a device fault: the tide command
                         sets it for the environment variable TIDE_EXEC_SYNC=1) */
    tide_dtype cache_dtype; /* the KV cache's type (tide_llama_graph_opts.cache_dtype):
                         TIDE_F32 (0, the default), TIDE_F16, TIDE_BF16, TIDE_Q8_0 */
} tide_model_opts;

/* The defaults, filled in (size set): one sequence (max_batch 1), the
 * config's context length, asynchronous issue. Edit what differs. */
tide_model_opts tide_model_opts_default(void);

tide_status tide_model_new(tide_ctx *ctx, tide_checkpoint *ck, tide_backend *be,
                           const tide_model_opts *opts, tide_model **out);
void tide_model_free(tide_model *m);

typedef enum tide_engine {
    TIDE_ENGINE_PLANNED = 0, /* every graph through a verified plan (the default) */
    TIDE_ENGINE_PLAIN,       /* the reference: ops in order, all tensors in one
                                buffer; resident runs only */
} tide_engine;
/* Chooses the engine of later runs. TIDE_E_INVALID for the plain engine while
 * offloading. The cache's contents are not carried from one engine to the
 * other. */
tide_status tide_model_set_engine(tide_model *m, tide_engine engine);

/* Offloading: run the model's graphs through verified plans under a device
 * memory budget instead of keeping everything resident. */
typedef enum tide_budget_kind {
    TIDE_BUDGET_NONE = 0, /* no offloading: everything resident (the default) */
    TIDE_BUDGET_BYTES,    /* exactly `bytes` */
    TIDE_BUDGET_FRACTION, /* `fraction` of the unconstrained peak of the largest graph */
    TIDE_BUDGET_MIN,      /* the smallest budget the policy can plan */
    TIDE_BUDGET_AUTO,     /* on a GPU, its free memory less a margin (the larger of
                             512 MiB and 1/32 of its memory); on the CPU backend 90%
                             of the hardware profile's device memory; at most the
                             unconstrained peak either way */
} tide_budget_kind;

typedef struct tide_offload_opts {
    size_t size;      /* sizeof(tide_offload_opts), as tide_offload_opts_default()
                         sets it; 0 (a zeroed struct): this version's; another
                         size is refused (TIDE_E_INVALID) */
    tide_budget_kind budget_kind;
    uint64_t bytes;
    double fraction;
    const char *policy;       /* "tide" (default), "static-layer" or "lru"; for a
                                 trainer also "checkpoint-layer" and "zero-offload"
                                 (every AdamW update on the host CPU) */
    uint64_t host_budget;     /* bytes for spills on host (0: unlimited) */
    const char *ssd_dirs;     /* comma-separated spill directories (NULL: $TMPDIR or /tmp) */
    bool weights_on_ssd;      /* home the weights on SSD: read from the checkpoint file */
    bool direct_storage;      /* with weights_on_ssd on a GPU: read the weights straight
                                 into device memory with GPUDirect Storage (cuFile) where
                                 this build and machine have it; where not, through
                                 pinned host buffers, with a notice. No effect on the
                                 CPU backend, whose device memory is host memory */
    const char *hw;           /* profile for plans and predictions (name or path; NULL:
                                 a quick measurement of this machine through the
                                 model's backend, as `tide probe` makes for 1 s) */
    int tile;                 /* 0: auto (a graph whose largest op does not fit the budget
                                 is tiled, see tide_llama_graph_opts; with TIDE_BUDGET_MIN
                                 the tiling with the smallest minimum); -1: never;
                                 1..TIDE_TILE_LEVELS-1: that tiling level */
    int pin_weights;          /* weights homed in host memory are copied once into
                                 pinned (page-locked) memory, so that their loads run
                                 at the link's full rate without a driver bounce:
                                 0 auto (on a GPU), 1 also on the CPU backend, -1
                                 never (loads read the memory-mapped checkpoint).
                                 At most half the available host memory is pinned;
                                 the rest stays in the mapping (see the notice) */
    const char *optimizer;    /* training (tide_trainer_set_offload) only: where the AdamW
                                 updates run: "auto" (NULL; each parameter's update on
                                 the device or on the host CPU, whichever the plan
                                 predicts faster: on the host only the gradient goes
                                 down and the parameter comes up; where device memory
                                 is host memory, on the device), "device" or "cpu" (every
                                 update on the host CPU; the tide policy only) */
    bool timeline;            /* measure every instruction's start and end, for
                                 tide_model_write_trace: free on the CPU; on a GPU
                                 two timing events per instruction, read after each
                                 run (a measurable cost for short decode steps) */
    bool no_warm;             /* inference only: keep no weight warm in the arena across
                                 runs (every run streams every weight, as the baselines
                                 always do). By default the tide policy, on a device or
                                 with weights_on_ssd, keeps as many weights in the budget
                                 as its predictions of a prompt and 32 decode steps
                                 repay (tide_gen_stats.warm_weight_bytes) */
    bool no_refit;            /* training (tide_trainer_set_offload) only: keep the first
                                 plan whatever the measured steps say. By default the
                                 second step (the first without warm-up) is measured
                                 instruction by instruction, and when it differs from
                                 its plan's prediction by more than
                                 TIDE_TRAIN_REFIT_MARGIN the profile is refitted from
                                 it and the step replanned (tide_train_stats.replan);
                                 on a GPU the executor then records timing events
                                 until the refit is decided */
} tide_offload_opts;

/* The defaults, filled in (size set): no budget (resident), the tide policy,
 * automatic tiling, pinning and optimizer placement, the measured machine's
 * profile, warm weights and the refit on. Set budget_kind (and bytes or
 * fraction) to offload. */
tide_offload_opts tide_offload_opts_default(void);

/* Switches the model to offloaded runs (or back to resident ones, with
 * TIDE_BUDGET_NONE). Every plan is verified before it runs. Plans are made
 * lazily per graph. On a GPU, offloaded runs hold one arena of the budget and
 * no other device memory: the KV cache lives in host memory and the resident
 * runs' device copies are freed (the cache's contents are not carried from one
 * mode to the other; TIDE_BUDGET_NONE or NULL on a model already resident
 * changes nothing, its cache is kept). The backend's matmul mode (set before this call)
 * decides the 16-bit matmul rate the plans assume. Returns TIDE_OK,
 * TIDE_E_INVALID, TIDE_E_NOMEM, a failure of loading the profile (hw given:
 * TIDE_E_NOT_FOUND, TIDE_E_FORMAT) or of measuring the machine (no hw). */
tide_status tide_model_set_offload(tide_model *m, const tide_offload_opts *opts);

/* A one-line notice from the last offloaded run that the caller may show
 * once (the host pool could not be pinned and pageable memory is used), or "". */
const char *tide_model_notice(const tide_model *m);

/* Writes the timeline of the most recent offloaded prefill (the first graph
 * run through a plan) as Perfetto trace JSON (json_path, may be NULL) and as an
 * SVG of device memory over time with transfers marked, measured and predicted
 * side by side (svg_path, may be NULL). TIDE_E_INVALID when no offloaded run
 * has happened yet. */
tide_status tide_model_write_trace(tide_model *m, const char *json_path, const char *svg_path);

typedef struct tide_gen_stats {
    double prefill_s;           /* wall time of the prefill graph */
    double decode_s;            /* wall time of all decode steps */
    int prefill_tokens;         /* batch * prompt tokens */
    int decode_tokens;          /* batch * generated tokens after the first */
    double prefill_tokens_per_s;
    double decode_tokens_per_s;
    uint64_t peak_bytes;        /* peak bytes of tensors held (weights, state,
                                   live activations, backend scratch) */
    uint64_t weight_bytes;
    uint64_t state_bytes;
    /* offloaded runs only (zero otherwise) */
    uint64_t budget_bytes;
    uint64_t peak_device_bytes; /* highest arena byte used by the plans */
    uint64_t bytes_h2d, bytes_d2h, bytes_ssd_read, bytes_ssd_write;
    double predicted_s;         /* simulated makespan of every plan run, summed */
    double predicted_prefill_s;
    double exec_s;              /* executor wall time, summed */
    double ssd_read_s;          /* time the io stream spent reading from SSD */
    uint64_t logits_hash;       /* FNV-1a of every logits output, in order: equal
                                   hashes of two runs mean bit-identical logits */
    int tile_level;             /* finest tiling level an offloaded graph used (0: none) */
    uint64_t pinned_weight_bytes; /* weight bytes held in pinned copies (the loads of
                                   these read pinned memory) */
    uint64_t warm_weight_bytes; /* offloaded: the arena's warm region, weights uploaded
                                   once and kept across runs (tide_offload_opts.no_warm) */
    bool async_issue;           /* device work was queued ahead and ordered by events
                                   (a backend with events, sync_issue unset) */
    int batch;                  /* generations run together (tide_model_generate_batch;
                                   1 alone) */
    int batch_steps;            /* forwards that advanced more than one of them (a decode
                                   step, or prompts of one length prefilled together) */
} tide_gen_stats;

/* Greedy generation for one sequence: prefill `prompt` (n_prompt tokens), then
 * n_new tokens, each the argmax of the last logits. out_tokens receives the
 * n_new generated ids. Returns TIDE_OK, TIDE_E_RANGE (a token id >= vocab or
 * more positions than the cache holds), or the failing step's status. */
tide_status tide_model_generate(tide_model *m, const int32_t *prompt, int n_prompt,
                                int n_new, int32_t *out_tokens, tide_gen_stats *stats);

/* Generation with a sampler, stop ids, continuation and a callback. */
typedef struct tide_gen_opts {
    size_t size;      /* sizeof(tide_gen_opts), as tide_gen_opts_default()
                         sets it; 0 (a zeroed struct): this version's; another
                         size is refused (TIDE_E_INVALID) */
    struct tide_sampler *sampler; /* NULL: greedy (the graph's own argmax, as
                                   tide_model_generate). Each generated id is
                                   accepted into it; the prompt's ids are the
                                   caller's to accept */
    const int32_t *stop_ids;    /* generation ends after one of these is drawn
                                   (it is the last id written and counted) */
    int n_stop_ids;
    int start_pos;              /* > 0: continue an earlier generation: the KV
                                   cache already holds prompt[0..start_pos) (the
                                   caller knows it does) and only the rest of the
                                   prompt is prefilled; < n_prompt */
    int (*on_token)(void *user, int32_t id); /* after each id is written and counted;
                                   non-zero stops */
    void *user;
} tide_gen_opts;

/* The defaults, filled in (size set): greedy, no stop ids, from position 0,
 * no callback. */
tide_gen_opts tide_gen_opts_default(void);

/* As tide_model_generate, for at most max_new ids: *n_out receives how many
 * were generated (fewer after a stop id or a callback's stop). o may be NULL.
 * TIDE_E_INVALID for start_pos outside [0, n_prompt), n_stop_ids < 0 or a
 * NULL stop_ids with n_stop_ids > 0, a NULL out_tokens with max_new > 0. */
tide_status tide_model_generate_ex(tide_model *m, const int32_t *prompt, int n_prompt, int max_new,
                                   const tide_gen_opts *o, int32_t *out_tokens, int *n_out,
                                   tide_gen_stats *stats);

/* The most generations one tide_model_generate_batch runs together. */
#define TIDE_MAX_BATCH 64

/* One generation of a batch (tide_model_generate_batch): its arguments as
 * tide_model_generate_ex's, and its results. */
typedef struct tide_gen_request {
    const int32_t *prompt;
    int n_prompt;
    int max_new;
    const tide_gen_opts *opts;  /* may be NULL; start_pos must be 0 */
    int32_t *out_tokens;        /* room for max_new ids */
    /* results */
    int n_out;                  /* ids generated */
    tide_status status;         /* TIDE_OK, its refusal, or the batch's failure */
    tide_gen_stats stats;       /* its own: prefill_s (its prompt), decode_s (from its
                                   prefill's end to its last id), tokens,
                                   logits_hash (its own logits: equal to the hash of the
                                   same request run alone when bit-identical); the
                                   offloaded counters (bytes, predicted_s, exec_s) are
                                   those of the forwards run while it was in the batch
                                   (shared with the requests beside it), batch and
                                   batch_steps the batch's up to its end */
} tide_gen_request;

/* Runs n generations together (1 <= n <= the model's max_batch): each
 * request's prompt is prefilled into cache row i (requests ordered by
 * max_new, longest first; prompts of one length in consecutive rows
 * together, as one batch of sequences, the others alone), then every
 * request still generating takes its next step in one forward, each row at
 * its own position (a graph with a position per row:
 * tide_llama_graph_opts.row_pos). The forward's batch is
 * the highest row still generating plus one: a row below it that has ended
 * is padding (position 0 of its own cache row, its output unused). Where
 * that graph cannot be planned under the budget (TIDE_E_INFEASIBLE), the
 * rows step one at a time instead. Each request's ids, and its logits, equal
 * those of the same request run alone with tide_model_generate_ex (bit for
 * bit wherever a matmul's row does not depend on the rows beside it: the CPU
 * backend, and CUDA's 16-bit fast mode). A request's refusal (its arguments,
 * as tide_model_generate_ex checks them) is its own, message on m's context; a
 * failing run fails every request not yet ended. Stats of the batch may be
 * NULL. Returns TIDE_OK when every request succeeded, else the first
 * failure. */
tide_status tide_model_generate_batch(tide_model *m, tide_gen_request *reqs, int n, tide_gen_stats *batch_stats);

/* What a batch tells its caller while it runs (tide_model_generate_batch_ex). */
typedef struct tide_batch_hooks {
    /* Before each decode step while a cache row is free: may set *req to a
     * further generation (the caller's, valid until its done) and return
     * non-zero; it is checked and prefilled into the lowest free row (with
     * those of its prompt length admitted before the same step), then steps
     * with the others. Returning 0 admits none before this step. */
    int (*admit)(void *user, tide_gen_request **req);
    /* Once per request, as soon as it has ended (its ids, n_out, status and
     * stats final, as tide_gen_request.stats says): a request's results may
     * be used before the batch ends. The batch does not touch the request
     * afterwards. */
    void (*done)(void *user, tide_gen_request *req);
    void *user;
} tide_batch_hooks;

/* tide_model_generate_batch with hooks (h may be NULL): requests join the
 * batch between steps (h->admit; a row ended frees its place; n may be 0
 * with an admit hook) and each is reported when it ends (h->done). The
 * batch ends when no row is generating and admit gives nothing. Its
 * outcome for each request, and what the return value says, are as there. */
tide_status tide_model_generate_batch_ex(tide_model *m, tide_gen_request *reqs, int n, const tide_batch_hooks *h,
                                         tide_gen_stats *batch_stats);

/* Runs the model on `tokens` (batch * seq ids, batch-major) at positions
 * start_pos.., with caches for each batch row, and copies all logits
 * (batch*seq, vocab) f32 into `logits` (may be NULL). */
tide_status tide_model_forward(tide_model *m, const int32_t *tokens, int batch, int seq,
                               int start_pos, float *logits);

/* ---------------------------------------------------------------- several workloads */

/* A pool: one device budget shared by several workloads on one backend
 * instance. Each workload (for now a model) runs offloaded within a share of
 * the budget; the shares are re-partitioned when a workload arrives, leaves
 * or changes its demand, and applied at safe points: between two requests of
 * a workload, never during one. The sum of the shares in use never exceeds
 * the budget, at any instant, across re-partitions included: a workload whose
 * share grows waits until the others have shrunk.
 *
 * Shares are never below a workload's minimum, the smallest budget its
 * longest request (a prefill of ctx_len tokens) and its decode step can be
 * planned at untiled, so a request computes exactly what the same request run
 * alone on a resident model computes (bit for bit on one backend). Every plan
 * is verified before it runs, as a model's are. */
typedef struct tide_pool tide_pool;
typedef struct tide_pool_workload tide_pool_workload;

typedef enum tide_pool_policy {
    TIDE_POOL_TIDE = 0, /* shares re-partitioned to minimise the predicted time of the
                           queued work (by the planner and simulator: each share
                           priced with the weights its model keeps warm there, a
                           changed share with loading them again); time-slicing
                           when the workloads' minimums do not fit together, or
                           when it is predicted faster than shares running at
                           once (logged with both predictions): one at a time as
                           SERIAL, but each turn at its knee (the least budget
                           predicted as fast as the whole), the others keeping
                           their warm weights until a turn needs the room */
    TIDE_POOL_EQUAL,    /* static equal shares among the workloads present */
    TIDE_POOL_SERIAL,   /* one workload holds the whole budget at a time, the others
                           wait their turn (first come, first served), as a loader
                           of whole models does */
} tide_pool_policy;

/* "tide", "equal", "serial"; NULL for an unknown value. */
const char *tide_pool_policy_name(tide_pool_policy p);
/* Parses a policy name; TIDE_E_INVALID naming the string (ctx may be NULL). */
tide_status tide_pool_policy_parse(tide_ctx *ctx, const char *s, tide_pool_policy *out);

typedef struct tide_pool_opts {
    size_t size;      /* sizeof(tide_pool_opts), as tide_pool_opts_default()
                         sets it; 0 (a zeroed struct): this version's; another
                         size is refused (TIDE_E_INVALID) */
    uint64_t budget_bytes;    /* the whole device budget shared by every workload (> 0) */
    tide_pool_policy policy;
    const char *hw;           /* profile the predictions and plans use (name or path, as
                                 tide_offload_opts.hw); NULL: this machine is measured
                                 once, when the pool is made (about 1 s), and the
                                 profile kept for the models in a temporary file
                                 ($TMPDIR or /tmp) removed with the pool */
    uint64_t host_budget;     /* per workload, as tide_offload_opts.host_budget */
    const char *ssd_dirs;     /* as tide_offload_opts.ssd_dirs */
    bool weights_on_ssd;      /* as tide_offload_opts.weights_on_ssd: every workload's
                                 weights homed on SSD and streamed through its share
                                 (on the CPU backend, where weights homed in host
                                 memory are read in place, this is what makes the
                                 shares bound the weights too) */
    bool no_refit;            /* keep the profile whatever the requests measure. By
                                 default a workload's request whose measured executor
                                 time is more than 30% away from its plans' prediction
                                 refits that workload's profile from the request's
                                 measured instructions (cost model refit, as a
                                 trainer's), plans its predictions again with it and
                                 re-partitions, at most once per 8 of its requests
                                 (the first may refit); its model's plans are made
                                 with the refitted profile from its next request on.
                                 Measuring every instruction is free on the CPU; on a
                                 GPU it costs two timing events per instruction, which
                                 no_refit also leaves out */
    /* Optional: one line per re-partition and per share change (when and why),
     * per refit (the workload, measured and predicted time, the new shares),
     * and, with no_refit, per workload whose measured time first drifts.
     * Called with the pool's lock held, from whichever thread caused it: it
     * must not call the pool. */
    void (*log)(void *user, const char *line);
    void *log_user;
} tide_pool_opts;

/* The defaults, filled in (size set): the tide policy, the measured machine's
 * profile, no host limit, refits on, no log. budget_bytes is 0: set it. */
tide_pool_opts tide_pool_opts_default(void);

/* Makes a pool on be (which must outlive it); its failures, and those of the
 * management calls below, are recorded on ctx, which should not be be's own
 * context (the workloads' runs write that one from their threads). Copies
 * what it needs of *o.
 * Returns TIDE_OK, TIDE_E_INVALID (no budget, unknown policy), a failure of
 * loading or measuring the profile, or TIDE_E_NOMEM. */
tide_status tide_pool_new(tide_ctx *ctx, tide_backend *be, const tide_pool_opts *o, tide_pool **out);
/* Frees the pool and every workload left in it. No request may be running. */
void tide_pool_free(tide_pool *p);

/* Adds a model workload named `name` (unique in the pool) of checkpoint ck
 * (which must outlive the workload) with options mo (may be NULL: batch 1,
 * the config's context length; mo->max_batch is how many of its waiting
 * requests one batch takes, tide_pool_generate). The pool makes and owns the tide_model, on a
 * context of its own (tide_pool_workload_ctx), finds its minimum and its
 * predicted request time at a few budgets (planning, not running), and
 * re-partitions. Safe while other workloads run requests. Returns TIDE_OK;
 * TIDE_E_INVALID (NULL or duplicate name, NULL ck); TIDE_E_INFEASIBLE when
 * the workload cannot run in the pool: its minimum exceeds the budget, or,
 * with TIDE_POOL_EQUAL, an equal share would be below some workload's
 * minimum (the message gives the numbers; the pool is unchanged); or the
 * failure of making the model or planning. */
tide_status tide_pool_add_model(tide_pool *p, const char *name, tide_checkpoint *ck, const tide_model_opts *mo,
                                tide_pool_workload **out);

/* Removes w and frees it with its model. A request of w already running is
 * waited for (it completes normally); requests of w still waiting for their
 * turn, and any made from then on, are refused with TIDE_E_INVALID. The
 * handle is invalid once this returns. Then re-partitions. Returns TIDE_OK,
 * or TIDE_E_INVALID when w is not in the pool (or is already being removed). */
tide_status tide_pool_remove(tide_pool *p, tide_pool_workload *w);

/* The workload named `name`, or NULL. */
tide_pool_workload *tide_pool_find(tide_pool *p, const char *name);
/* The workload's context: tide_pool_generate records w's failures there
 * (valid until w's next request), and its thread count and progress
 * callback apply to w's runs. */
tide_ctx *tide_pool_workload_ctx(tide_pool_workload *w);

/* Runs one request of w: tide_model_generate_ex on w's model (arguments,
 * results and errors as there) within w's current share. Thread-safe:
 * several threads may call it at once, for different workloads or the same
 * one. A workload's requests queue in arrival order; a thread of the
 * workload's own (started by tide_pool_add_model) runs them in batches
 * (tide_model_generate_batch_ex: prompts prefilled into free cache rows,
 * then one forward per decode step for all) of up to max_batch requests at
 * once (its model's tide_model_opts.max_batch): queued requests join a
 * running batch between its steps as rows free up, while its share is
 * unchanged and no other workload waits for room or a turn; each request
 * returns to its caller as soon as it ends. Its callbacks (on_token, the
 * sampler) are called from the workload's thread. Before running, a batch
 * takes the share w was
 * last given (waiting, when it grows, until the others' shares in use
 * leave room; with SERIAL, until its turn). A batch whose share differs
 * from the one w's plans were made at replans (lazily, as a model does).
 * Returns TIDE_OK; TIDE_E_INVALID when w is not in the pool or is being
 * removed (the message on the pool's context) or for bad arguments
 * (as tide_model_generate_ex checks them; start_pos must be 0); the failure of setting
 * the share or of the run (on w's context; a batch's failure is every
 * request's in it). stats: the request's own (tide_gen_request.stats). */
tide_status tide_pool_generate(tide_pool *p, tide_pool_workload *w, const int32_t *prompt, int n_prompt,
                               int max_new, const tide_gen_opts *g, int32_t *out_tokens, int *n_out,
                               tide_gen_stats *stats);
/* As tide_pool_generate, its failure recorded on ctx (the caller's, used by
 * no other thread meanwhile) instead of w's context, which the requests of
 * a batch share; a refusal because w is leaving is also on the pool's. */
tide_status tide_pool_generate_on(tide_pool *p, tide_pool_workload *w, tide_ctx *ctx, const int32_t *prompt,
                                  int n_prompt, int max_new, const tide_gen_opts *g, int32_t *out_tokens,
                                  int *n_out, tide_gen_stats *stats);

/* What the shares are partitioned for: w's typical request (prompt_tokens,
 * new_tokens; 0 keeps the current value; defaults 32 and 16, clamped to the
 * context) and how many of them are queued (weight > 0: the predicted total
 * is the sum over workloads of weight * the predicted request time; default
 * 1). Plans w's predictions again and re-partitions (policy tide). Returns
 * TIDE_OK, TIDE_E_INVALID (w not in the pool, a negative value), or the
 * failure of planning. */
tide_status tide_pool_set_demand(tide_pool *p, tide_pool_workload *w, int prompt_tokens, int new_tokens,
                                 double weight);

typedef struct tide_pool_stats {
    uint64_t budget_bytes;      /* the whole budget */
    int n_workloads;
    bool time_sliced;           /* one workload at a time now (SERIAL, or TIDE's fallback) */
    uint64_t shares_bytes;      /* sum of the shares assigned now (time-sliced: 0) */
    uint64_t held_bytes;        /* sum of the shares in use now (each model's arena is
                                   at most its share in use) */
    uint64_t peak_held_bytes;   /* the highest held_bytes at any instant: <= budget_bytes */
    int64_t partitions;         /* re-partitions (arrivals, departures, demand changes) */
    int64_t replans;            /* share changes applied to a model (its plans made again) */
    int64_t waits;              /* requests that waited for room or for their turn */
    int64_t requests;           /* requests completed */
    int64_t drifted;            /* of them, measured executor time more than 30% away
                                   from the plans' predicted time */
    int64_t refits;             /* cost model refits after a drifted request (see
                                   tide_pool_opts.no_refit), each followed by a
                                   re-partition counted in partitions */
    int64_t batches;            /* batches of several requests run together */
    int64_t batched_requests;   /* the requests in them */
    double predicted_s, measured_s; /* summed over completed requests */
    int64_t evictions;          /* models offered to the pool (tide_pool_offer_model)
                                   evicted to make room for another */
} tide_pool_stats;

/* Fills *s (under the pool's lock: a consistent snapshot). */
void tide_pool_stats_get(tide_pool *p, tide_pool_stats *s);

typedef struct tide_pool_workload_stats {
    uint64_t share_bytes;       /* assigned by the last partition (time-sliced: the
                                   budget while it runs, else 0) */
    uint64_t held_bytes;        /* in use now (0: holds nothing) */
    uint64_t min_bytes;         /* its minimum (longest request, untiled) */
    uint64_t need_bytes;        /* the budget beyond which its plans gain nothing (where
                                   offloaded runs keep weights warm: its unconstrained
                                   peak plus every weight) */
    double predicted_request_s; /* of its typical request at share_bytes (0: unknown) */
    int waiting;                /* requests waiting for the workload, room or a turn */
    int64_t requests, drifted, replans;
    int64_t refits;             /* its profile refitted from its measured requests: at
                                   most one per 8 of its requests */
    int64_t batches, batched_requests; /* as tide_pool_stats, its own */
    int max_batch;              /* requests a batch of it takes */
    double predicted_s, measured_s; /* summed over its completed requests */
    uint64_t peak_device_bytes; /* highest arena byte its plans used */
} tide_pool_workload_stats;

/* Fills *s for w. TIDE_OK, or TIDE_E_INVALID when w is not in the pool. */
tide_status tide_pool_workload_stats_get(tide_pool *p, tide_pool_workload *w, tide_pool_workload_stats *s);

/* ---------------------------------------------------------------- planning
 *
 * Planning without running: hardware profiles, plans of a graph under a
 * device budget and a policy (their figures, JSON, verification and predicted
 * timeline), the minimum-budget and tiling searches, the planning of a whole
 * training step, probing this machine into a profile, and the token files a
 * training run reads. This is what `tide plan`, `tide probe` and `tide train`
 * use; a plan never needs weights, only a graph's shapes. Errors are recorded
 * on the context given (a plan's: the one it was made with). */

/* Records status and a printf-style message as ctx's last error, for code that
 * reports a failure of its own through a context (a generation callback that
 * stopped it); returns status. ctx NULL: only returns status. */
tide_status tide_ctx_set_error(tide_ctx *ctx, tide_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* A hardware profile: what the cost model and the simulator know of a machine
 * (peak FLOP/s by dtype, device and host memory, link and SSD bandwidths,
 * latencies). Shipped profiles live in data/hw/NAME.json; `tide probe`
 * measures one (tide_hw_probe). */
typedef struct tide_hw tide_hw;

/* Loads a profile by name (a shipped one: data/hw/NAME.json in the data
 * directories) or from a path (a name containing '/' or ending in .json) into
 * a new handle *out. Returns TIDE_OK; TIDE_E_NOT_FOUND listing the known names
 * and the directories searched; TIDE_E_INVALID (no name, a name with other
 * characters than letters, digits, '-', '_' and '.'); TIDE_E_FORMAT naming the
 * bad field; TIDE_E_IO; TIDE_E_NOMEM. *out is NULL on failure. */
tide_status tide_hw_open(tide_ctx *ctx, const char *name_or_path, tide_hw **out);
/* Frees a profile; NULL is a no-op. A tide_train_plan planned on it refers to
 * it: free that first. */
void tide_hw_free(tide_hw *hw);
/* Writes the names tide_hw_open finds ("a100-80g, h100-80g, ..."; those shipped
 * with tide when no data directory is readable) into buf, NUL-terminated and
 * cut to cap bytes (cap 0: nothing written). Returns the length of the whole
 * list, so a return >= cap means it was cut. */
size_t tide_hw_names(char *buf, size_t cap);
/* The fields of a profile a report prints. */
typedef struct tide_hw_info {
    const char *name;             /* valid while the profile lives */
    uint64_t device_mem_bytes, host_mem_bytes;
    double flops_f32, flops_f16, flops_bf16; /* peak dense matmul FLOP/s by dtype */
    double matmul_efficiency;     /* fraction of the peak large matmuls reach */
    double mem_bw;                /* device memory, bytes/s */
    double h2d_bw, d2h_bw;        /* host <-> device link, bytes/s each way */
    int ssd_count;
    double ssd_read_bw, ssd_write_bw; /* per drive, bytes/s */
    const char *source;           /* the profile's "source": "datasheet" (figures not yet
                                     measured), "probed", ...; "" when it has none */
    double host_flops, host_mem_bw; /* the host CPU's rates the cost model uses for
                                     computes placed on it (its defaults where the
                                     profile has none) */
    double net_intra_bw, net_inter_bw; /* the network between data-parallel ranks,
                                     bytes/s per GPU each way, inside a node and
                                     between nodes (0: none) */
    int net_gpus_per_node;        /* GPUs a node (0: the profile is one node) */
} tide_hw_info;
/* Fills *out from hw (both non-NULL). */
void tide_hw_info_get(const tide_hw *hw, tide_hw_info *out);
/* Writes hw as profile JSON to path (a temporary name renamed over it, never
 * half-written). Returns TIDE_OK, TIDE_E_IO naming the path, or TIDE_E_NOMEM. */
tide_status tide_hw_save(tide_ctx *ctx, const tide_hw *hw, const char *path);

typedef struct tide_hw_probe_opts {
    const char *ssd_dirs;         /* directories on the drives to measure, comma-separated
                                     (NULL or "": $TMPDIR or /tmp) */
    double seconds;               /* rough wall time to spend (<= 0: 10 s) */
    const tide_hw *base;          /* device backends: start from this profile and replace
                                     what is measured (NULL: every field measured); the CPU
                                     probe measures every field and ignores it */
} tide_hw_probe_opts;
/* No base, the default directories, 10 seconds. */
tide_hw_probe_opts tide_hw_probe_opts_default(void);
/* Measures this machine as backend be sees it into a new profile *out, every
 * rate through the backend's own kernels in its current matmul mode: matmuls
 * of llama-7b's shape with f32, f16 and bf16 weights, memory bandwidth, the
 * per-op overhead, host <-> device copies and their latency, the device's
 * memory, on the CPU a decode step's matrix-vector rates, and sequential
 * O_DIRECT writes and reads of a temporary file (unlinked at once) on each
 * drive of ssd_dirs. Named "probed-<hostname>[-<backend>]". Returns TIDE_OK,
 * TIDE_E_IO (a directory missing or not writable, an I/O failure),
 * TIDE_E_INVALID (an empty directory list), TIDE_E_NOMEM (also when the
 * device cannot hold the test tensors) or the backend's failure; *out is NULL
 * on failure. o NULL: the defaults. */
tide_status tide_hw_probe(tide_ctx *ctx, tide_backend *be, const tide_hw_probe_opts *o, tide_hw **out);

/* How a plan decides what stays on the device. */
typedef enum tide_policy {
    TIDE_POLICY_TIDE = 0,         /* tide's planner: prefetch and evict by simulation */
    TIDE_POLICY_STATIC_LAYER,     /* whole layers resident, the rest double-buffered */
    TIDE_POLICY_LRU,              /* load on demand, least recently used evicted */
    TIDE_POLICY_CHECKPOINT_LAYER, /* training: layer inputs kept, the rest recomputed */
    TIDE_POLICY_ZERO_OFFLOAD,     /* training: every AdamW update on the host CPU */
} tide_policy;
/* "tide", "static-layer", "lru", "checkpoint-layer", "zero-offload"; "?" for
 * anything else. */
const char *tide_policy_name(tide_policy p);
/* The policy named s into *out: 0, or -1 for an unknown name. */
int tide_policy_parse(const char *s, tide_policy *out);

/* Where a training step's AdamW updates run. */
typedef enum tide_optim_mode {
    TIDE_OPTIM_AUTO = 0,          /* each update where the plan's predicted step is shortest */
    TIDE_OPTIM_DEVICE,            /* every update on the device */
    TIDE_OPTIM_CPU,               /* every update on the host CPU */
} tide_optim_mode;
/* "auto", "device", "cpu". */
const char *tide_optim_mode_name(tide_optim_mode m);
/* The mode named s into *out: TIDE_OK, or TIDE_E_INVALID (message on ctx,
 * which may be NULL). */
tide_status tide_optim_mode_parse(tide_ctx *ctx, const char *s, tide_optim_mode *out);

/* Co-offload of inference: whether decode MATMULs whose weights live in host
 * memory may run on the host CPU (their activations crossing the link
 * instead of their weights), chosen per op by planning. */
typedef enum tide_host_compute {
    TIDE_HOST_COMPUTE_OFF = 0,    /* every op on the device */
    TIDE_HOST_COMPUTE_AUTO,       /* where the plan is predicted faster, on a profile
                                     with a host side (host_flops and host_mem_bw) */
} tide_host_compute;

/* What a plan is made under. */
typedef struct tide_planner_opts {
    tide_policy policy;
    uint64_t device_budget;       /* bytes of the device arena (searches for a minimum
                                     ignore it) */
    uint64_t host_budget;         /* host memory for homes and spills; 0: the profile's */
    int n_iter;                   /* iterations of the graph in one plan, >= 1 (a training
                                     step is planned as a steady state of 2) */
    const tide_hw *hw;            /* the cost model; required */
    bool weights_on_ssd;          /* home the weights on SSD instead of host memory */
    bool host_updates;            /* every ADAMW op of the graph runs on the host CPU
                                     (tide policy; graphs without ADAMW: no effect) */
    int tile;                     /* searches that build graphs: TIDE_TILE_AUTO,
                                     TIDE_TILE_NONE or a level; the rest ignore it */
    tide_optim_mode optimizer;    /* tide_train_plan_new: where the updates run
                                     (host_updates is then ignored) */
    tide_host_compute host_compute; /* inference plans (tide policy): co-offload of
                                     MATMULs to the host CPU; graphs with ADAMW, other
                                     policies and weights on SSD: no effect. Plans,
                                     bounds and budgets of a graph use the same
                                     placement (the search is deterministic) */
} tide_planner_opts;
/* Policy tide, no budget, the profile's host memory, one iteration, no
 * profile (set hw), weights on host, tile auto, optimizer auto, host compute
 * off. */
tide_planner_opts tide_planner_opts_default(void);

/* The unconstrained peak of g: the device bytes the tide policy's plan of
 * o->n_iter iterations on o->hw uses with no limit (persistent tensors
 * resident, temporaries freed after their last use). Where that cannot be
 * planned, the bytes of every tensor of g (an upper bound); 0 for a graph
 * without tensors or a NULL argument (TIDE_E_INVALID on ctx). */
uint64_t tide_planner_peak(tide_ctx *ctx, const tide_graph *g, const tide_planner_opts *o);
/* The smallest device budget for which o->policy plans g under o (a binary
 * search from the largest op working set to the unconstrained peak) into
 * *min_budget. Returns TIDE_OK, TIDE_E_INFEASIBLE (host memory cannot hold
 * what lives there), TIDE_E_UNSUPPORTED, TIDE_E_NOMEM. */
tide_status tide_planner_min_budget(tide_ctx *ctx, const tide_graph *g, const tide_planner_opts *o,
                                    uint64_t *min_budget);
/* The largest device working set of g's ops under o (what device computes
 * need at once; ops placed on the host need none) into *ws: no plan fits a
 * smaller budget. Returns TIDE_OK, or the failure of setting up a plan
 * (TIDE_E_INVALID, TIDE_E_INFEASIBLE: host memory, TIDE_E_NOMEM). */
tide_status tide_planner_max_working_set(tide_ctx *ctx, const tide_graph *g, const tide_planner_opts *o,
                                         uint64_t *ws);
/* The largest working set over g's ops, every op on the device: each
 * distinct input and output plus its scratch (*which: that op, may be NULL). */
uint64_t tide_graph_max_working_set(const tide_graph *g, int *which);

/* The bounds a plan of g is measured against. */
typedef struct tide_bounds {
    double compute_s;             /* sum of op costs */
    double link_s;                /* minimum bytes per link / bandwidth, max over links */
    double lower_bound_s;         /* max(compute_s, link_s) */
    double ideal_s;               /* simulated makespan with an unlimited budget */
} tide_bounds;
/* The bounds of g under o (its budget, policy, placement) into *out. Returns
 * TIDE_OK or the failure of planning the ideal. */
tide_status tide_planner_bounds(tide_ctx *ctx, const tide_graph *g, const tide_planner_opts *o, tide_bounds *out);
/* The ideal step of a training graph g on o->hw into *step: the steady step
 * (tide policy, 2 iterations) with every weight and state resident on the
 * device, warm at fixed offsets, and no budget: only the batch moves. Returns
 * TIDE_OK, TIDE_E_NOMEM, or the failure of planning or simulating. */
tide_status tide_planner_ideal_step(tide_ctx *ctx, const tide_graph *g, const tide_planner_opts *o, double *step);

/* A plan: every tensor move and compute of a graph's o->n_iter iterations
 * under a device budget, with its arena offsets and stream order. It refers
 * to its graph, which must outlive it. */
typedef struct tide_plan tide_plan;

/* Plans g under o into *out. Returns TIDE_OK; TIDE_E_INFEASIBLE with "needs
 * at least N bytes" when the budget is below an op's working set or host
 * memory cannot hold what must live there; TIDE_E_UNSUPPORTED (an option the
 * policy does not plan); TIDE_E_INVALID; TIDE_E_NOMEM. The plan's figures
 * (tide_plan_info_get) are filled in, its makespan simulated on o->hw. */
tide_status tide_plan_new(tide_ctx *ctx, const tide_graph *g, const tide_planner_opts *o, tide_plan **out);
/* Frees a plan; NULL is a no-op. */
void tide_plan_free(tide_plan *p);
/* Proves p with the independent verifier: every compute reads the current
 * version of its inputs on the device, live device ranges never overlap, all
 * within the budget, every cross-stream hazard ordered, persistent tensors end
 * at home. Returns TIDE_OK, or TIDE_E_VERIFY naming the first violation. */
tide_status tide_plan_verify(const tide_plan *p);
/* Writes p as JSON to path (loading it needs the same graph). Returns
 * TIDE_OK, TIDE_E_IO, TIDE_E_NOMEM. */
tide_status tide_plan_save_json(const tide_plan *p, const char *path);

/* A plan's figures. Bytes per link count the whole plan; step_* its second
 * iteration (its only one when n_iter is 1). */
typedef struct tide_plan_info {
    tide_policy policy;           /* the plan's own (a training step's search may keep the
                                     zero-offload baseline's plan, labelled tide) */
    int n_iter, n_instructions;
    uint64_t device_budget;
    uint64_t peak_device_bytes;   /* highest arena byte in use at any instant */
    uint64_t peak_host_bytes, peak_ssd_bytes; /* spill areas' high water (homes excluded) */
    uint64_t bytes_h2d, bytes_d2h, bytes_ssd_read, bytes_ssd_write;
    uint64_t step_bytes_h2d, step_bytes_d2h, step_bytes_ssd_read, step_bytes_ssd_write;
    double compute_s;             /* sum of op costs */
    double makespan_s;            /* simulated on the planning profile */
    double plan_seconds;          /* wall time planning took */
    int host_computes;            /* computes placed on the host CPU in the first iteration */
    uint64_t host_compute_weight_bytes; /* the weights they read (MATMULs'), first iteration */
    int ranks;                    /* data-parallel ranks (1: one device) */
    int step_collectives;         /* collectives of a step (the second iteration's) */
} tide_plan_info;
/* Bytes one rank sends per step (the second iteration's collectives) over
 * hw's network inside a node (*intra) and between nodes (*inter): the ring
 * algorithms' (src/cost/cost.c). Both 0 for a plan of one device. */
void tide_plan_net_bytes(const tide_plan *p, const tide_hw *hw, uint64_t *intra, uint64_t *inter);
/* Fills *out from p (both non-NULL). */
void tide_plan_info_get(const tide_plan *p, tide_plan_info *out);

/* A predicted timeline: a plan replayed on a profile, each instruction's
 * start and end. */
typedef struct tide_timeline tide_timeline;
/* Replays p on hw (streams FIFO, waits delay starts, each link and the SSDs
 * shared) into *out. Returns TIDE_OK, TIDE_E_NOMEM, or TIDE_E_INVALID (a
 * malformed plan; message on p's context). */
tide_status tide_plan_simulate(const tide_plan *p, const tide_hw *hw, tide_timeline **out);
/* Frees a timeline; NULL is a no-op. */
void tide_timeline_free(tide_timeline *t);
/* Seconds from the start to the end of the last instruction. */
double tide_timeline_makespan(const tide_timeline *t);
/* The steady step: with 2 or more iterations, the end of the second
 * iteration's last instruction minus the end of the first's; else the
 * makespan. */
double tide_timeline_step(const tide_timeline *t);
/* Writes t, a timeline of p, as Perfetto trace JSON to json_path (one track
 * per stream, a counter of device bytes in use) and as an SVG of the device
 * arena over time to svg_path; either may be NULL. Each file is written to a
 * temporary name and renamed. Returns TIDE_OK, TIDE_E_INVALID (t not of p),
 * TIDE_E_IO naming the path, TIDE_E_NOMEM. */
tide_status tide_plan_write_trace(const tide_plan *p, const tide_timeline *t, const char *json_path,
                                  const char *svg_path);

/* The graph of (cfg, base) at the coarsest tiling level from none, within
 * o->tile, whose plan under o fits o->device_budget: that graph into *g and
 * its level into *level, and, with plan non-NULL, its plan into *plan (of *g;
 * the caller frees both). Graphs of more than 150000 ops are not tried by
 * tile auto. Returns TIDE_OK, TIDE_E_INFEASIBLE when no level fits (the
 * message gives what the finest level tried needs), or the failure of
 * building or planning; *g and *plan NULL on failure. */
tide_status tide_llama_plan(tide_ctx *ctx, const tide_llama_config *cfg, const tide_llama_graph_opts *base,
                            const tide_planner_opts *o, tide_graph **g, int *level, tide_plan **plan);
/* The tiling level of (cfg, base), within o->tile, whose minimum budget under
 * o is smallest (coarsest on ties): its graph into *g (the caller frees it),
 * its level into *level, that minimum into *min_budget. Errors as
 * tide_llama_plan. */
tide_status tide_llama_min_budget(tide_ctx *ctx, const tide_llama_config *cfg, const tide_llama_graph_opts *base,
                                  const tide_planner_opts *o, tide_graph **g, int *level, uint64_t *min_budget);
/* Parses "auto", "none" or a level 1 .. TIDE_TILE_LEVELS-1 into *tile;
 * TIDE_E_INVALID otherwise (message on ctx, which may be NULL). */
tide_status tide_tile_parse(tide_ctx *ctx, const char *s, int *tile);

/* The row tiling of a training step (tide_llama_train_tile_level) whose
 * minimum budget under o is smallest (coarsest on ties), within o->tile:
 * its level into *level, that minimum into *min_budget, its tiles into
 * to->tile_seqs. o->host_updates: every update on the host in each level's
 * graph. Returns TIDE_OK, TIDE_E_INFEASIBLE when no level fits, or the
 * failure of building or planning. */
tide_status tide_train_min_budget(tide_ctx *ctx, const tide_llama_config *cfg, tide_llama_train_opts *to,
                                  const tide_planner_opts *o, int *level, uint64_t *min_budget);

/* A planned training step: its graph (row tiles and vocabulary blocks as
 * chosen), its plan and where its AdamW updates run. */
typedef struct tide_train_plan tide_train_plan;
/* Plans a training step of (cfg, *to) under o (policy, budget, host budget,
 * n_iter, profile; o->optimizer places the updates) with its tiling searched
 * within o->tile: TIDE_TILE_NONE plans the step to describes; a level plans
 * that level; auto starts at the coarsest level whose largest op fits and
 * plans finer ones while each is predicted faster, keeping the fastest. With
 * optimizer auto, each update is placed where the predicted step is
 * shortest; the plan may be the zero-offload baseline's when that is faster.
 * On success *out holds the step and to->tile_seqs and to->vocab_blocks its
 * tiling; it refers to o->hw, which must outlive it. Returns TIDE_OK;
 * TIDE_E_INFEASIBLE naming what the last level tried needs;
 * TIDE_E_UNSUPPORTED (host updates under a baseline); the failure of
 * building; TIDE_E_NOMEM. *out NULL on failure. */
tide_status tide_train_plan_new(tide_ctx *ctx, const tide_llama_config *cfg, tide_llama_train_opts *to,
                                const tide_planner_opts *o, tide_train_plan **out);
/* Frees a planned step, its graph and its plan; NULL is a no-op. */
void tide_train_plan_free(tide_train_plan *t);
/* The step's graph and plan, owned by t. */
const tide_graph *tide_train_plan_graph(const tide_train_plan *t);
const tide_plan *tide_train_plan_get_plan(const tide_train_plan *t);
/* The largest device working set of the step's graph under its own placement
 * into *ws. Errors as tide_planner_max_working_set. */
tide_status tide_train_plan_max_working_set(const tide_train_plan *t, uint64_t *ws);
/* The bounds of the step's graph under its budget and placement. Errors as
 * tide_planner_bounds. */
tide_status tide_train_plan_bounds(const tide_train_plan *t, tide_bounds *out);
/* A planned step's figures. */
typedef struct tide_train_plan_info {
    int tile_level;               /* 0: untiled */
    int optimizer_groups;         /* AdamW updates in the step (one per parameter) */
    int optimizer_host_groups;    /* of them on the host CPU */
    uint64_t optimizer_host_state_bytes, optimizer_state_bytes; /* parameter, master and
                                     moment bytes of those updates, and of all */
    double device_optimizer_makespan_s; /* the step with every update on the device (0:
                                     not planned or infeasible) */
    int plans_tried;              /* plans the placement search made */
    double plan_seconds;          /* wall time of the whole search */
    uint64_t weight_bytes, master_bytes, moment_bytes, gradient_bytes; /* of the graph */
    uint64_t kept_activation_bytes; /* activations a micro-batch keeps from its forward
                                     for its backward (the first micro-batch's, written
                                     before its loss and read after it) */
} tide_train_plan_info;
/* Fills *out from t (both non-NULL). */
void tide_train_plan_info_get(const tide_train_plan *t, tide_train_plan_info *out);

/* Training tokens: a flat file of token ids, mapped read-only, cut
 * into the (inputs, targets) windows of each micro-batch; and a generator of
 * a synthetic corpus for runs without a data set.
 *
 * Files: raw little-endian uint16 (nanoGPT's train.bin, the default), raw
 * little-endian uint32, or a 1-D integer .npy array (NumPy format 1.0, 2.0 or
 * 3.0; dtype u1/i1/u2/i2/u4/i4/u8/i8, little-endian or single-byte; the
 * header's dtype is used whatever the caller asked for). Every id is checked
 * once at open (0 <= id < vocab), so a batch never reads a bad id.
 *
 * Windows (the nanoGPT convention): with W = n_tokens - T - 1 window starts,
 * row b of micro-batch m of step s reads the T+1 tokens at
 *     start = (((s * accum + m) * B + b) * T) mod W               (in order)
 *     start = uniform(splitmix64(seed, (s * accum + m) * B + b)) in [0, W)
 *                                                                  (shuffled)
 * inputs are its first T tokens, targets its last T (shifted by one). Both are
 * pure functions of (step, micro-batch, row): a resumed run needs only the
 * step to continue the same sequence of batches, and no generator state. The
 * arithmetic is exact (128-bit) for any step a run can reach.
 *
 * A tide_tokens is read-only after open and may be shared by threads.
 */
/* How the file's bytes hold the ids. A file whose name ends in ".npy", or
 * whose bytes start with NumPy's magic, is read as .npy whatever is given. */
typedef enum tide_token_dtype {
    TIDE_TOKENS_AUTO = 0, /* .npy as above, else raw u16 */
    TIDE_TOKENS_U16,      /* raw little-endian uint16 */
    TIDE_TOKENS_U32,      /* raw little-endian uint32 */
} tide_token_dtype;

typedef struct tide_tokens tide_tokens;

/* Opens path and checks it: its size (a whole number of ids, at least
 * seq + 2 of them: one window and one more start), the .npy header, and every
 * id against vocab. Returns TIDE_OK with *out set, or, with *out NULL and a
 * message naming the file and the problem:
 *   TIDE_E_NOT_FOUND  no such file;
 *   TIDE_E_IO         cannot open, stat or map it; not a regular file;
 *   TIDE_E_FORMAT     odd size ("odd size for u16"), too short for one window,
 *                     malformed .npy (magic, header, size);
 *   TIDE_E_UNSUPPORTED a valid .npy of another kind (float, big-endian, not 1-D);
 *   TIDE_E_RANGE      an id < 0 or >= vocab: the first one, its index and value;
 *   TIDE_E_INVALID    vocab or seq < 1, a NULL argument;
 *   TIDE_E_NOMEM.
 * ctx receives the errors of later calls on the handle too. */
tide_status tide_tokens_open(tide_ctx *ctx, const char *path, tide_token_dtype dt, int64_t vocab, int64_t seq,
                             tide_tokens **out);
void tide_tokens_free(tide_tokens *tk);
/* Number of ids in the file. */
int64_t tide_tokens_count(const tide_tokens *tk);
/* Id i (0 <= i < count), widened. */
int64_t tide_tokens_at(const tide_tokens *tk, int64_t i);
/* "u16", "u32", or the .npy's dtype ("<i4", "|u1", ...). */
const char *tide_tokens_dtype_name(const tide_tokens *tk);

/* The shape of the batches of a run. */
typedef struct tide_batch_spec {
    int batch;     /* B >= 1: rows of a micro-batch */
    int seq;       /* T >= 1: tokens of a row; n_tokens >= T + 2 */
    int accum;     /* micro-batches per step >= 1 */
    bool shuffle;  /* draw window starts from seed instead of walking the file */
    uint64_t seed;
} tide_batch_spec;

/* The start of row b's window in micro-batch micro of step (the formula
 * above); -1 when an argument is out of range (no error recorded). */
int64_t tide_tokens_window(const tide_tokens *tk, const tide_batch_spec *spec, int64_t step, int micro, int b);

/* Fills inputs and targets, each (B, T) int32 row-major, for micro-batch micro
 * (0 <= micro < accum) of step (>= 0). Returns TIDE_OK, or TIDE_E_INVALID
 * naming the bad argument (also when the file is shorter than T + 2 ids). */
tide_status tide_tokens_batch(const tide_tokens *tk, const tide_batch_spec *spec, int64_t step, int micro,
                              int32_t *inputs, int32_t *targets);

/* Writes a synthetic corpus of n_tokens ids in [0, vocab) to path, whole or
 * not at all (tide_file_begin/commit). The ids follow a Markov chain drawn
 * from seed: each id has 4 successors (pseudo-random ids), taken with
 * probabilities 1/2, 1/4, 1/8, 1/8, so a model can learn it down to an
 * entropy of 1.75 bits (1.21 nats) per token, less where successors collide.
 * The bytes depend only on (vocab, n_tokens, seed). A path ending in ".npy"
 * gets a .npy file ('<u2' when vocab <= 65536, else '<u4'), which
 * tide_tokens_open reads back with TIDE_TOKENS_AUTO; otherwise raw ids of
 * dtype dt (AUTO: u16 when vocab <= 65536, else u32). Returns TIDE_OK,
 * TIDE_E_INVALID (vocab < 1, n_tokens < 1, u16 for vocab > 65536) or
 * TIDE_E_IO naming the path and the cause. */
tide_status tide_tokens_write_synthetic(tide_ctx *ctx, const char *path, tide_token_dtype dt, int64_t vocab,
                                        int64_t n_tokens, uint64_t seed);

/* Training data sets: a token file (above), or text through the model's
 * tokenizer: JSON Lines (a name ending in ".jsonl") or plain text (".txt",
 * one document a line). A JSON line is an object with
 *   "text": a plain document;
 *   "prompt" and "completion": one example, the completion its answer;
 *   "messages": [{"role": "system"|"user"|"assistant", "content": ...}, ...],
 *               one chat example rendered with the model's chat template
 *               (tide_chat_format; family named or detected).
 * Lines with only white space are skipped. Plain documents and examples do
 * not mix in one file.
 *
 * Plain documents become exactly the token stream a token file would hold:
 * for each in file order, encode(text, TIDE_TOKENIZE_ADD_SPECIAL) (the BOS
 * where the tokenizer adds one), then the EOS where the tokenizer names one
 * (unless its template already appends it), concatenated; batches are that
 * stream's windows (tide_tokens_batch), so a .jsonl and a .bin of the same
 * ids train the same steps.
 *
 * Examples are one per row, right-padded: row b of micro-batch m of step s
 * holds example g mod N in order, g = (s * accum + m) * B + b, or a uniform
 * draw from the seed as the window sampler makes (shuffled). Its first
 * min(L, T + 1) ids e give inputs e[0..L'-1) and targets e[1..L'), the rest of
 * the row padding (inputs: the EOS id, or 0; targets -1, ignored). Causal
 * attention keeps each example's attention inside itself exactly, so no mask
 * is needed. Targets are ignored (-1) outside the completion: a
 * prompt/completion example is encode(prompt, ADD_SPECIAL) + encode(completion)
 * + EOS, trained on the completion and the EOS; a chat example is its
 * rendering cut where each message begins, each piece encoded on its own
 * (no ADD_SPECIAL: the template writes the BOS), trained on each assistant
 * message as the template renders it after the assistant header (its end of
 * turn included). With train_on_all every target is trained. An example longer
 * than T + 1 ids is truncated (counted); one left with no trained target is
 * dropped (counted). */
typedef struct tide_dataset tide_dataset;
typedef struct tide_tokenizer tide_tokenizer; /* the text section's */

typedef struct tide_dataset_opts {
    int seq;                    /* T >= 1, the rows' tokens; 0 (text only): read to be
                                   written (tide_dataset_write_tokens), never batched:
                                   nothing truncated or left out */
    bool train_on_all;          /* examples: a target on every token, not only on the
                                   completion or the assistant's messages */
    const char *chat_template;  /* a family name (tide_chat_template_names), NULL:
                                   detected from the tokenizer */
    double eval_split;          /* [0, 0.5]: that fraction of the rows (documents or
                                   examples, at least one when > 0), the last in the
                                   file, kept apart as the evaluation set */
} tide_dataset_opts;

typedef struct tide_dataset_info {
    bool examples;              /* rows are examples (else a token stream) */
    int64_t rows;               /* documents or examples */
    int64_t tokens;             /* ids in the stream, or in the examples as kept */
    int64_t targets;            /* examples: the targets trained on (not ignored) */
    int64_t truncated;          /* examples cut to T + 1 ids */
    int64_t dropped;            /* examples left with no trained target */
    int64_t skipped_lines;      /* blank lines */
    double pad_fraction;        /* examples: of the row positions, the share that
                                   is padding (each example taken once) */
} tide_dataset_info;

/* Opens a data set for rows of o->seq tokens. A path ending in ".jsonl" or
 * ".txt" is text: tok (its tokenizer; NULL is TIDE_E_INVALID "needs the
 * model's tokenizer") encodes it and every id must be below vocab; anything
 * else is a token file (tide_tokens_open with dt; tok unused; no eval_split).
 * With eval_split > 0, *eval receives the evaluation set (else NULL; eval may
 * be NULL when eval_split is 0). Errors name the file and, for a bad line,
 * its number: malformed JSON, not an object, no known field, a field of the
 * wrong type, an unknown role, the chat template refusing the conversation;
 * an empty file or set (TIDE_E_FORMAT); a stream too short for one window;
 * the tokenizer's failures. Nothing is returned on failure. */
tide_status tide_dataset_open(tide_ctx *ctx, const char *path, tide_tokenizer *tok, int64_t vocab,
                              tide_token_dtype dt, const tide_dataset_opts *o, tide_dataset **out,
                              tide_dataset **eval);
void tide_dataset_free(tide_dataset *d);
void tide_dataset_info_get(const tide_dataset *d, tide_dataset_info *out);
/* The token stream of a data set of documents or of a token file (NULL for
 * examples), valid while d lives. */
const tide_tokens *tide_dataset_tokens(const tide_dataset *d);
/* Fills inputs and targets (B, T) for micro-batch micro of step, as
 * tide_tokens_batch for a stream, the rows above for examples; spec->seq must
 * be the data set's T. */
tide_status tide_dataset_batch(const tide_dataset *d, const tide_batch_spec *spec, int64_t step, int micro,
                               int32_t *inputs, int32_t *targets);
/* Evaluation: every row once, in order, batch * accum rows a batch: a
 * stream's windows at 0, T, 2T, ... (floor((n - 1) / T) of them), or the
 * examples; rows past the last padded with ignored targets. The number of
 * batches, and batch i's micro-batch micro. */
int64_t tide_dataset_eval_batches(const tide_dataset *d, const tide_batch_spec *spec);
tide_status tide_dataset_eval_batch(const tide_dataset *d, const tide_batch_spec *spec, int64_t i, int micro,
                                    int32_t *inputs, int32_t *targets);
/* Writes a stream's ids to path as a token file tide_tokens_open reads (raw
 * u16, u32 when dt is TIDE_TOKENS_U32 or AUTO with an id above 65535, or .npy
 * when path ends in ".npy"), whole or not at all. TIDE_E_INVALID for a data
 * set of examples (a token file holds no masks) or u16 with a larger id. */
tide_status tide_dataset_write_tokens(const tide_dataset *d, const char *path, tide_token_dtype dt);

typedef struct tide_trainer tide_trainer;
/* Runs the step graph on a batch as tide_trainer_step does, with no update
 * (parameters, master weights, moments and the step count are left as they
 * are; the gradients are computed and dropped): *loss the mean cross-entropy
 * over the batch's targets that are not ignored (0 when none), *n_targets
 * their count. For validation losses. The measured timeline of the last
 * run (tide_trainer_write_trace) is then the evaluation's. */
tide_status tide_trainer_eval(tide_trainer *t, const int32_t *tokens, const int32_t *targets, double *loss,
                              int64_t *n_targets);

/* ---------------------------------------------------------------- training */

/* A trainer: the training-step graph of a checkpoint's model (see
 * tide_llama_build_train) run step after step through a verified plan on a
 * backend. Parameters, f32 master weights (16-bit models) and AdamW moments
 * are persistent tensors homed in host memory, or on SSD where an offloaded
 * plan's host budget cannot hold them; they start from the checkpoint (or a
 * saved training state, tide_trainer_resume) when the first step is planned.
 * Resident (the default) the plan is unconstrained: on the CPU every
 * persistent tensor is used where it lives; on a GPU they are uploaded once
 * and stay in device memory. Offloaded (tide_trainer_set_offload, the same
 * options as a model's), the step is planned under the budget. Every plan is
 * verified before it runs; an offloaded step computes exactly what the
 * resident step computes, bit for bit. */
typedef struct tide_trainer tide_trainer;

typedef struct tide_trainer_opts {
    size_t size;      /* sizeof(tide_trainer_opts), as tide_trainer_opts_default()
                         sets it; 0 (a zeroed struct): this version's; another
                         size is refused (TIDE_E_INVALID) */
    tide_llama_train_opts step;  /* batch, seq, accum, AdamW and clipping */
    double lr;                   /* peak learning rate */
    double min_lr;               /* with cosine: the rate the decay ends at */
    bool cosine;                 /* decay from lr to min_lr over total_steps
                                    (after the warmup); else constant lr */
    int64_t warmup;              /* linear warmup steps: lr * (s + 1) / warmup */
    int64_t total_steps;         /* the schedule's length (cosine) */
    bool shuffle;                /* the data order the caller feeds (recorded in
                                    saved states; a resume must feed the same) */
    uint64_t seed;
    bool sync_issue;             /* as tide_model_opts.sync_issue */
    /* LoRA (step.lora_r > 0): the adapters start as PEFT initialises them,
     * A Kaiming-uniform (bound 1/sqrt(K)) from a splitmix64 generator seeded
     * by `seed` and the tensor's name, B zero; or from the PEFT adapter
     * directory lora_init (adapter_model.safetensors; its r, alpha and
     * targets must be step's: tide_lora_read_config reads them). */
    const char *lora_init;
    /* QLoRA (step.lora_r > 0): NULL, the base's projections as stored (a
     * GGUF file's quantized ones read in place); or "q8_0", "q4_0", "q4_k",
     * "q5_k", "q6_k": the seven projections of every layer quantized to it
     * at load with tide's quantizer (tide_qlora_config says which weights
     * keep their type) */
    const char *lora_base_type;
} tide_trainer_opts;

/* The defaults, filled in (size set), those of `tide train`: micro-batches of
 * 4 sequences of 256 tokens, no accumulation, AdamW with betas 0.9 and 0.95,
 * eps 1e-8, weight decay 0.1, the gradient norm clipped to 1, a constant
 * learning rate of 3e-4 (a cosine schedule would run over 100 steps), no
 * warmup, seed 0. */
tide_trainer_opts tide_trainer_opts_default(void);

/* The learning rate of step s (from 0): s < warmup: lr * (s + 1) / warmup;
 * then, with cosine, min_lr + (lr - min_lr) * (1 + cos(pi * (s - warmup) /
 * (total_steps - warmup))) / 2; else lr. */
double tide_train_lr(const tide_trainer_opts *o, int64_t s);

/* Makes a trainer of ck's model (ck must outlive it) on be. Checks the
 * options (TIDE_E_INVALID naming the bad one) and builds the step graph;
 * nothing is planned or copied yet. */
tide_status tide_trainer_new(tide_ctx *ctx, tide_checkpoint *ck, tide_backend *be, const tide_trainer_opts *o,
                             tide_trainer **out);
void tide_trainer_free(tide_trainer *t);
/* Offloads later steps under a budget (TIDE_BUDGET_NONE: resident). Only
 * before the first step. pin_weights is ignored. tile: the tiling of the step
 * (tide_llama_train_tile_level: row tiles, then vocabulary blocks): auto
 * (policy tide only; the baselines run the graph as made) starts from the
 * coarsest level whose largest op fits the budget and takes finer levels
 * while each is predicted faster;
 * with TIDE_BUDGET_MIN, the level whose minimum is smallest; TIDE_TILE_NONE
 * never tiles; a level forces it. */
tide_status tide_trainer_set_offload(tide_trainer *t, const tide_offload_opts *o);
/* Runs steps in row tiles of tile_seqs sequences (0: none), as
 * tide_llama_train_opts.tile_seqs: for a resident run to compare bit for bit
 * with an offloaded run that tiled. Only before the first step. */
tide_status tide_trainer_set_tiling(tide_trainer *t, int tile_seqs);
/* The sequences per row tile of the steps (0: untiled); an offloaded
 * trainer's tiling is chosen at its first step. */
int tide_trainer_tile_seqs(const tide_trainer *t);
/* Runs steps with the embedding and the head in vocab_blocks blocks of rows
 * (0: whole), as tide_llama_train_opts.vocab_blocks; before the first step.
 * An offloaded trainer whose tiling is searched sets its own at its first
 * step. The blocks are state tensors of their own ("NAME.vK", listed by
 * tide_trainer_tensor); tide_trainer_read of NAME gathers them. */
tide_status tide_trainer_set_vocab_blocks(tide_trainer *t, int vocab_blocks);
int tide_trainer_vocab_blocks(const tide_trainer *t);
/* Continues from the training state saved in dir (tide_trainer_save; a
 * LoRA trainer's, tide_trainer_save_lora, whose adapter_config.json must
 * have the step's r, alpha and targets): its parameters, master weights,
 * moments and step. Only before the first step.
 * TIDE_E_FORMAT / TIDE_E_NOT_FOUND naming the file and tensor when the state
 * does not belong to this model and these options. */
tide_status tide_trainer_resume(tide_trainer *t, const char *dir);

/* Data-parallel ranks. A communicator joins the processes a launcher started
 * (docs/training.md section 12): Open MPI's mpirun or mpiexec, or srun with
 * PMIx or PMI-2, whose ranks MPI joins and carries (a build with MPI:
 * tide_comm_mpi_available); or torchrun, or any launcher setting WORLD_SIZE
 * and RANK (or TIDE_WORLD_SIZE and TIDE_RANK) with MASTER_ADDR and
 * MASTER_PORT, whose ranks meet over TCP at rank 0 and run their collectives
 * on TCP sockets (any build). A trainer on the CUDA backend attaches NCCL to
 * it for the collectives on device memory (tide_comm_nccl_available).
 * Without a launcher it is one rank alone. */
typedef struct tide_comm tide_comm;
/* Whether this build can run data-parallel ranks at all (always: over TCP
 * where it has no MPI). */
bool tide_comm_available(void);
/* Whether this build has MPI (CMake found it): the carrier of launches by
 * mpirun and srun. */
bool tide_comm_mpi_available(void);
/* Whether this build runs the collectives of ranks on the CUDA backend
 * (NCCL, src/net/comm_nccl.c): CMake found NCCL and CUDA. */
bool tide_comm_nccl_available(void);
/* The ranks the environment's launcher variables describe (1: none, one
 * process; -1: malformed), this process's rank in *rank, and the kind of
 * launch in *launcher ("mpirun", "pmi", "srun", "torchrun" or "none");
 * either may be NULL. Reads the environment only. */
int tide_comm_launch_env(int *rank, const char **launcher);
/* Joins the launch: MPI (MPI_Init_thread where MPI is not initialised yet)
 * for mpirun, srun or no launcher, TIDE_E_UNSUPPORTED in a build without
 * MPI; TCP for a torchrun-style launch: rank 0 listens at MASTER_PORT
 * (TIDE_MASTER_PORT overrides it; under torchrun, whose agent holds
 * MASTER_PORT, the port after it), the others connect to MASTER_ADDR, and
 * the ranks form a ring (TIDE_E_INVALID for missing or malformed variables,
 * a WORLD_SIZE that differs between ranks, a rank taken twice; TIDE_E_IO
 * when a rank does not come within the timeout or the port is taken). A
 * collective waits at most TIDE_NET_TIMEOUT seconds (default 300) for the
 * other ranks, then fails naming the rank and the collective. */
tide_status tide_comm_open(tide_ctx *ctx, tide_comm **out);
/* The carrier of c's host collectives: "mpi" or "tcp". */
const char *tide_comm_carrier(const tide_comm *c);
int tide_comm_rank(const tide_comm *c);
int tide_comm_size(const tide_comm *c);
/* Bytes this process has sent in collectives so far (the ring algorithms'
 * count: what the formula of docs/training.md section 12 gives). */
uint64_t tide_comm_bytes_sent(const tide_comm *c);
/* Ends every rank's process with exit status code (MPI_Abort; on TCP this
 * process's connections closed, which fails the other ranks' collectives at
 * once, and its exit): for a program's failure path, so that the other
 * ranks do not wait on this one.
 * The library itself never calls it. */
void tide_comm_abort(tide_comm *c, int code);
/* Leaves the launch (MPI_Finalize where tide_comm_open initialised MPI; the
 * TCP connections closed). */
void tide_comm_close(tide_comm *c);
/* Makes t one of tide_comm_size(c) data-parallel ranks, before the first
 * step: t's step options must have ranks equal to the communicator's size
 * (tide_llama_train_opts.ranks, zero; one rank: one_rank set). On the CUDA
 * backend this joins NCCL on the backend's GPU (every rank at once:
 * TIDE_E_UNSUPPORTED in a build without NCCL). Every rank is given the same
 * options, model and data. Each rank runs its own micro-batches; the plan,
 * its hardware profile and the offloaded budget are rank 0's (broadcast),
 * and the ranks compare their plans' hashes before the first step. c must
 * outlive t. */
tide_status tide_trainer_set_comm(tide_trainer *t, tide_comm *c);

typedef struct tide_train_stats {
    int64_t step;                /* the step just taken, from 0 */
    double loss;                 /* mean cross-entropy over its tokens */
    double grad_norm;            /* the global gradient norm before clipping */
    double lr;
    double wall_s;               /* the step's wall time */
    double tokens_per_s;
    uint64_t bytes_h2d, bytes_d2h, bytes_ssd_read, bytes_ssd_write;
    uint64_t peak_device_bytes;  /* the plan's peak (resident on the CPU: the
                                    arena of activations; tensors used in place
                                    are not counted) */
    uint64_t budget_bytes;       /* offloaded: the budget; resident: the arena */
    double predicted_s;          /* the plan's simulated step time */
    double plan_s;               /* planning time of the first step (0 later) */
    int optimizer_groups;        /* AdamW updates per step (one per parameter) */
    int optimizer_host_groups;   /* of them run on the host CPU (offloaded plans) */
    double predicted_device_optimizer_s; /* offloaded, with updates on the host: the step
                                    predicted with every update on the device (0:
                                    not plannable so) */
    /* The refit (offloaded steps, tide_offload_opts.no_refit unset): decided once,
     * after the trainer's second step. */
    int replan;                  /* after this step: 0 nothing; 1 the profile was
                                    refitted from this step's measured instructions
                                    and the step replanned on it, the next step runs
                                    the new plan; -1 refitted, but the plan kept (the
                                    new one would home training state elsewhere, or
                                    could not be made; later predictions are the kept
                                    plan's on the refitted profile) */
    double refit_measured_s;     /* replan != 0: this step's measured time (wall_s) */
    double refit_predicted_s;    /* replan != 0: its prediction before the refit */
    double refit_new_predicted_s;/* replan != 0: the prediction of the plan later steps
                                    run, on the refitted profile (their predicted_s) */
    int refit_host_groups_before;/* replan > 0: where the AdamW placement was chosen
                                    again on the refitted profile (policy tide,
                                    optimizer auto, device memory apart from the
                                    host's), the updates on the host before the refit
                                    (optimizer_host_groups: after it); -1: the first
                                    placement kept */
    int64_t n_targets;           /* the step's targets that are not ignored (the
                                    loss is their mean) */
    /* Data-parallel ranks (tide_trainer_set_comm; ranks 1 otherwise): loss,
     * grad_norm and n_targets are the whole step's, over every rank. */
    int ranks, rank;
    uint64_t net_bytes;          /* bytes this rank sent in the step's collectives
                                    (ring algorithms' count, docs/training.md
                                    section 12) */
    double net_s;                /* the net stream's busy time in the step */
    double net_overlap_s;        /* of it, while the compute stream was busy too */
    uint64_t state_bytes_this_rank; /* master weights and moments this rank holds */
} tide_train_stats;

/* How far a measured offloaded step may be from its plan's prediction,
 * |measured / predicted - 1|, before the profile is refitted and the step
 * replanned: the 15% the refitted predictions are held to. */
#define TIDE_TRAIN_REFIT_MARGIN 0.15

/* Takes one step on accum micro-batches of (batch, seq) tokens: tokens and
 * targets hold accum * batch * seq ids each, micro-batch by micro-batch,
 * batch-major. A target < 0 is ignored: the step's loss is the sum of the
 * cross-entropies of the n targets that are not, over the whole step (every
 * micro-batch), divided by n (torch's cross_entropy(ignore_index=-100,
 * reduction="sum") / n), and the gradients (clipped on their norm) are those of
 * that loss; n = 0 is TIDE_E_INVALID. The first step plans and verifies.
 * Returns TIDE_OK, TIDE_E_RANGE (an id outside the vocabulary), or the
 * failure of planning or running (the parameters are then not updated
 * consistently: discard the trainer). */
tide_status tide_trainer_step(tide_trainer *t, const int32_t *tokens, const int32_t *targets, tide_train_stats *st);
/* Steps taken, counting those of a resumed state. */
int64_t tide_trainer_steps(const tide_trainer *t);
/* Copies the current value of the training tensor named `name` (a parameter
 * by its checkpoint name, "master.NAME", "exp_avg.NAME", "exp_avg_sq.NAME";
 * with step.grads_out, "grad.NAME": the last step's gradient before
 * clipping) into dst (its dtype, nbytes bytes). TIDE_E_NOT_FOUND or
 * TIDE_E_INVALID. */
tide_status tide_trainer_read(tide_trainer *t, const char *name, void *dst, uint64_t nbytes);
/* Names of the persistent training tensors, in graph order (n_out set). */
int tide_trainer_n_tensors(const tide_trainer *t);
const char *tide_trainer_tensor(const tide_trainer *t, int i, tide_dtype *dt, uint64_t *nbytes);
/* Saves a Hugging Face checkpoint of the current parameters (config.json and
 * model.safetensors, in save_dtype: the model's dtype, or TIDE_F32 for the f32
 * master weights) and the training state (optimizer.safetensors: master
 * weights, moments, the step and `extra` key/value metadata, may be NULL) into
 * dir. Built in a temporary directory beside dir and renamed into place, so an
 * interrupted save never leaves a checkpoint that looks whole; a failed one
 * leaves an existing dir as it was. */
tide_status tide_trainer_save(tide_trainer *t, const char *dir, tide_dtype save_dtype, const char *const *extra,
                              int n_extra);
/* LoRA: writes the adapters as PEFT saves them into dir:
 * adapter_model.safetensors (f32 lora_A / lora_B weights) and
 * adapter_config.json (peft_type LORA, r, lora_alpha, target_modules,
 * lora_dropout 0, bias none, task_type CAUSAL_LM), with the training state
 * tide_trainer_resume continues from: optimizer.safetensors (the adapters,
 * their AdamW moments, the step) and the base's config.json. The whole
 * directory is built beside dir and renamed into place, as tide_trainer_save
 * does. TIDE_E_INVALID when t trains no adapters (tide_trainer_save refuses
 * a LoRA trainer). */
tide_status tide_trainer_save_lora(tide_trainer *t, const char *dir);
/* Reads a PEFT adapter's adapter_config.json in dir: r, lora_alpha and
 * target_modules (bits as tide_lora_parse_targets). TIDE_E_NOT_FOUND (no
 * file), TIDE_E_FORMAT naming the bad field (not LORA, r <= 0, an unknown
 * module, use_dora, a bias other than none, dropout != 0 is accepted: it is a
 * training-time setting and steps here run without it). */
tide_status tide_lora_read_config(tide_ctx *ctx, const char *dir, int *r, float *alpha, unsigned *targets);
/* QLoRA: the configuration a LoRA step trains on, from a checkpoint's base:
 * base_type NULL keeps the projections' stored types (a GGUF file's); a
 * block type name ("q8_0", "q4_0", "q4_k", "q5_k", "q6_k") gives the seven
 * projections of every layer that type (TIDE_E_INVALID for another name, or
 * where a projection's rows are not whole blocks of it, naming the weight;
 * TIDE_E_UNSUPPORTED for a base already quantized). The embedding and the
 * head stay as stored, or f32 where they are block-quantized (dequantized
 * at load); the norms stay as stored; the q/k rows in Hugging Face's order
 * (qk_interleaved false: a GGUF file's are put back at load). */
tide_status tide_qlora_config(tide_ctx *ctx, const tide_llama_config *base, const char *base_type,
                              tide_llama_config *out);
/* The step graph (for reports). The first step may replace it by its row
 * tiled form (tide_trainer_set_offload's tile): take it after that step. */
const tide_graph *tide_trainer_graph(const tide_trainer *t);
/* Writes the measured timeline of the last step as Perfetto trace JSON
 * (json_path) and as an SVG of device memory over time, measured and
 * predicted (svg_path); either may be NULL. On a GPU the timeline is
 * measured only with tide_offload_opts.timeline set. TIDE_E_INVALID when
 * there is none. */
tide_status tide_trainer_write_trace(tide_trainer *t, const char *json_path, const char *svg_path);

/* ---------------------------------------------------------------- text */

/* A tokenizer read from a Hugging Face model directory: tokenizer.json (the
 * pipeline: added tokens, normalizer, pre-tokenizer, BPE model, post-processor,
 * decoder) with tokenizer_config.json, special_tokens_map.json and
 * generation_config.json for BOS, EOS and stop ids when present.
 *
 * Supported: BPE models with a byte-level pre-tokenizer and decoder (GPT-2,
 * Llama 3, Qwen2 style: Split and Digits pre-tokenizers, their regexes run
 * with PCRE2's Unicode support; the NFC normalizer) and
 * SentencePiece-style BPE (Llama 2, TinyLlama, Mistral: the "\u2581" space
 * marker through Prepend/Replace normalizers or the Metaspace pre-tokenizer,
 * <0xNN> byte fallback, the Replace/ByteFallback/Fuse/Strip decoders).
 * Anything else tokenizer.json asks for (another model type, normalizer,
 * pre-tokenizer, decoder or post-processor) is refused by name with
 * TIDE_E_UNSUPPORTED: never a silently different encoding.
 *
 * Encoding follows Hugging Face `tokenizers` id for id. Input that is not
 * valid UTF-8 is read with each maximal invalid subpart replaced by U+FFFD
 * (Python's errors="replace"). A tokenizer encodes on one thread at a time
 * (it keeps a cache of words); decoding only reads it.
 *
 * Or read from a GGUF file's metadata (llama.cpp's tokenizer.ggml.* keys and
 * tokenizer.chat_template; src/text/tok_gguf.h says what each becomes): the
 * "llama" model (SentencePiece-style: merges by the tokens' scores, <0xNN>
 * byte fallback, add_space_prefix) and the "gpt2" model (byte-level BPE with
 * its merges; tokenizer.ggml.pre one of gpt-2, llama-bpe, llama3, llama-v3,
 * qwen2, tekken, each split as the Hugging Face tokenizer of that family
 * does). Control and unknown tokens are special, user-defined ones added
 * non-special tokens; EOS ids are eos_token_id and eot_token_id. GGUF keeps
 * no per-token lstrip/rstrip and no Metaspace prepend scheme: a tokenizer
 * that uses them in tokenizer.json encodes as llama.cpp reads the GGUF. */
typedef struct tide_tokenizer tide_tokenizer;

/* Opens `path`: a model directory, a tokenizer.json file (the config files
 * are then looked for beside it), or a file whose name ends in ".gguf" (its
 * metadata). Errors are recorded on ctx, which must outlive the tokenizer.
 * Returns TIDE_OK; TIDE_E_NOT_FOUND (no tokenizer.json or .gguf file),
 * TIDE_E_IO, TIDE_E_FORMAT (malformed JSON or GGUF, a field or key of the
 * wrong kind, a GGUF key inconsistent with the others) or TIDE_E_UNSUPPORTED,
 * with a message naming the file, the field or key and the problem;
 * TIDE_E_NOMEM. */
tide_status tide_tokenizer_open(tide_ctx *ctx, const char *path, tide_tokenizer **out);
void tide_tokenizer_free(tide_tokenizer *t);

/* Ids run from 0 to tide_tokenizer_n_vocab() - 1 (the model's vocabulary and
 * the added tokens; an id may be a hole with no piece). */
int32_t tide_tokenizer_n_vocab(const tide_tokenizer *t);
/* The BOS id and the main EOS id (tokenizer_config.json, special_tokens_map.json,
 * else generation_config.json; a GGUF file's bos_token_id and eos_token_id), -1
 * when the tokenizer names none. */
int32_t tide_tokenizer_bos(const tide_tokenizer *t);
int32_t tide_tokenizer_eos(const tide_tokenizer *t);
/* Every id that ends generation: the EOS token and generation_config.json's
 * eos_token_id (one id or a list); from a GGUF file, eos_token_id and
 * eot_token_id. Returns their count; *ids (may be NULL)
 * points at them, valid while t lives. */
int tide_tokenizer_eos_ids(const tide_tokenizer *t, const int32_t **ids);
bool tide_tokenizer_is_eos(const tide_tokenizer *t, int32_t id);
/* The piece of an id as tokenizer.json spells it ("\u0120the" in byte-level
 * vocabularies, "\u2581the" in SentencePiece ones, an added token's content),
 * NUL-terminated, valid while t lives; NULL for an id out of range or a hole. */
const char *tide_tokenizer_piece(const tide_tokenizer *t, int32_t id);
/* true for an added token marked special (<s>, <|eot_id|>, ...). */
bool tide_tokenizer_is_special(const tide_tokenizer *t, int32_t id);
/* The id whose piece is exactly `piece` (an added token's content or a
 * vocabulary entry), or -1. */
int32_t tide_tokenizer_find(const tide_tokenizer *t, const char *piece);

/* The model's chat template (a Jinja source, as tokenizer_config.json's
 * chat_template, a chat_template.jinja file or a GGUF file's
 * tokenizer.chat_template holds it), or NULL. */
const char *tide_tokenizer_chat_template(const tide_tokenizer *t);

/* Encoding flags. */
enum {
    /* Add what the tokenizer adds around a text, as add_special_tokens=True
     * does in `tokenizers` and transformers: tokenizer.json's TemplateProcessing
     * (or Roberta/Bert) single template. Usually the BOS; nothing for a
     * tokenizer without one (tokenizer_config.json's add_bos_token is not read,
     * as transformers 5 does not read it). From a GGUF file: BOS when
     * tokenizer.ggml.add_bos_token (default: on for "llama", the Llama 3
     * pre-tokenizers and tekken), EOS when add_eos_token. */
    TIDE_TOKENIZE_ADD_SPECIAL = 1u << 0,
    /* Special tokens' text in the input ("<|eot_id|>") is not the special
     * token but ordinary text (transformers' split_special_tokens=True), as
     * untrusted input should be read. Non-special added tokens still match. */
    TIDE_TOKENIZE_SPECIAL_AS_TEXT = 1u << 1,
};

/* Encodes text[0..len) (bytes; NUL is ordinary text). Writes the first
 * min(total, cap) ids into ids (may be NULL with cap 0) and the total into
 * *n_ids: when *n_ids > cap, call again with room for *n_ids. Returns TIDE_OK,
 * TIDE_E_INVALID (NULL arguments, unknown flags) or TIDE_E_NOMEM; a
 * pre-tokenizer regex failing on the input (PCRE2's match limits) is
 * TIDE_E_INVALID naming the pattern. */
tide_status tide_tokenizer_encode(tide_tokenizer *t, const char *text, size_t len, unsigned flags,
                                  int32_t *ids, size_t cap, size_t *n_ids);

/* Decoding flags. */
enum {
    TIDE_DECODE_SKIP_SPECIAL = 1u << 0, /* special tokens decode to nothing */
};

/* Decodes ids[0..n) to UTF-8 text, as tokenizer.json's decoder does, with
 * every maximal invalid subpart of the bytes replaced by U+FFFD. Writes the
 * first min(total, cap - 1) bytes and a NUL into buf (cap > 0) and the total
 * length into *len: when *len >= cap, call again with room for *len + 1.
 * Equals the concatenation of a tide_detok's output over the same ids. Returns
 * TIDE_OK, TIDE_E_RANGE (an id out of range or a hole: the message names it)
 * or TIDE_E_NOMEM. */
tide_status tide_tokenizer_decode(const tide_tokenizer *t, const int32_t *ids, size_t n, unsigned flags,
                                  char *buf, size_t cap, size_t *len);

/* Streaming decode, for printing tokens as they are generated: each id gives
 * the text it completes. A token that ends inside a UTF-8 sequence gives
 * nothing until the sequence completes; bytes that cannot complete one give
 * U+FFFD. Decoder rules that depend on the position (the first token's space
 * marker, Strip of leading spaces) apply to the stream as to one decode.
 *
 * One difference from `tokenizers`: its ByteFallback decoder turns a whole run
 * of <0xNN> tokens that is not valid UTF-8 into one U+FFFD per token, valid
 * characters in the run included, which cannot be printed as it streams; tide
 * replaces each maximal invalid subpart instead (the same for valid text). */
typedef struct tide_detok tide_detok;

/* flags: TIDE_DECODE_*. The tokenizer must outlive the stream. Returns TIDE_OK
 * or TIDE_E_NOMEM. */
tide_status tide_detok_new(const tide_tokenizer *t, unsigned flags, tide_detok **out);
void tide_detok_free(tide_detok *d);
/* Feeds one id. *text receives the newly printable text (NUL-terminated, valid
 * until the next call on d), *len its length (0 when nothing completes).
 * Returns TIDE_OK, TIDE_E_RANGE (an id out of range or a hole; the stream is
 * unchanged) or TIDE_E_NOMEM. */
tide_status tide_detok_push(tide_detok *d, int32_t id, const char **text, size_t *len);
/* Ends the stream: bytes of an unfinished sequence give U+FFFD. The stream is
 * then empty again, as after tide_detok_reset. */
tide_status tide_detok_finish(tide_detok *d, const char **text, size_t *len);
/* Starts a new stream (the next id is the first again). */
void tide_detok_reset(tide_detok *d);

/* ---------------------------------------------------------------- sampling */

/* How the next token is drawn from a logits vector. The steps, in this order
 * (transformers' order): the penalties over the ids seen (tide_sampler_accept),
 * temperature, top-k, top-p, min-p, then one draw from the renormalised
 * softmax of what is left. A zero-initialised struct is greedy decoding. */
typedef struct tide_sampler_opts {
    size_t size;      /* sizeof(tide_sampler_opts), as tide_sampler_opts_default()
                         sets it; 0 (a zeroed struct): this version's; another
                         size is refused (TIDE_E_INVALID) */
    double temperature;         /* <= 0: greedy (the argmax, the lowest id on a tie);
                                   else logits are divided by it */
    int32_t top_k;              /* keep the k highest logits (0: all) */
    double top_p;               /* keep the most likely ids whose probabilities sum to at
                                   least top_p, in descending order (0 or >= 1: all) */
    double min_p;               /* drop ids whose probability is below min_p times the
                                   most likely one's (0: none) */
    double repetition_penalty;  /* an id seen has its logit divided by it when positive,
                                   multiplied when negative (transformers, CTRL); 0 or 1: off */
    double frequency_penalty;   /* logit -= count * f (OpenAI's); 0: off */
    double presence_penalty;    /* logit -= p when seen at all (OpenAI's); 0: off */
    int32_t penalty_last_n;     /* the penalties see the last n ids accepted (0: all) */
    uint64_t seed;              /* seeds the generator (xoshiro256** seeded by splitmix64):
                                   the same seed and logits give the same ids on every
                                   machine */
} tide_sampler_opts;

/* The defaults, filled in (size set): greedy (temperature 0), no
 * truncation, no penalties, seed 0. */
tide_sampler_opts tide_sampler_opts_default(void);

typedef struct tide_sampler tide_sampler;

/* A sampler over ids 0..n_vocab-1 (logits beyond n_vocab are never drawn).
 * TIDE_E_INVALID naming a bad option (negative temperature, top_p or min_p
 * outside [0, 1], ...). */
tide_status tide_sampler_new(tide_ctx *ctx, const tide_sampler_opts *o, int32_t n_vocab, tide_sampler **out);
void tide_sampler_free(tide_sampler *s);
/* Records an id as seen (the prompt's ids, then each one generated), for the
 * penalties. TIDE_E_RANGE for an id outside the vocabulary. */
tide_status tide_sampler_accept(tide_sampler *s, int32_t id);
/* Draws the next id from logits[0..n_vocab). Does not accept it. */
tide_status tide_sampler_sample(tide_sampler *s, const float *logits, int32_t *id);
/* The distribution the next draw would use: probs[0..n_vocab) (0 for the ids
 * cut away), summing to 1; greedy puts 1 on the argmax. Draws nothing. */
tide_status tide_sampler_probs(tide_sampler *s, const float *logits, double *probs);
/* Forgets the ids seen and reseeds the generator. */
void tide_sampler_reset(tide_sampler *s, uint64_t seed);

/* ---------------------------------------------------------------- chat */

/* Chat templates: the common families of tokenizer_config.json's
 * chat_template, recognised by their markers and formatted in C exactly as
 * transformers' apply_chat_template renders them (no Jinja engine). */
typedef struct tide_chat_template tide_chat_template;

typedef struct tide_chat_msg {
    const char *role;    /* "system", "user" or "assistant" */
    const char *content;
} tide_chat_msg;

/* The template of a family by name (llama2, llama3, chatml, mistral, zephyr,
 * gemma) when `name` is given, else the one detected in t's chat template.
 * TIDE_E_NOT_FOUND for an unknown name or when t has no chat template;
 * TIDE_E_UNSUPPORTED when its template is of no known family (the message
 * names --template NAME and the families). t must outlive the template. */
tide_status tide_chat_template_get(tide_ctx *ctx, const tide_tokenizer *t, const char *name,
                                   tide_chat_template **out);
void tide_chat_template_free(tide_chat_template *c);
/* The family's name ("llama3", ...). */
const char *tide_chat_template_name(const tide_chat_template *c);
/* The comma-separated family names, for messages and --help. */
const char *tide_chat_template_names(void);
/* The text that ends an assistant turn in this family ("<|eot_id|>",
 * "<|im_end|>", "</s>", "<end_of_turn>"): generation stops on it. */
const char *tide_chat_template_end_of_turn(const tide_chat_template *c);
/* Formats a conversation as a prompt: *out (free with tide_free_text) holds
 * the text, BOS included where the template writes it (encode it without
 * TIDE_TOKENIZE_ADD_SPECIAL); add_generation_prompt appends the assistant's
 * header. TIDE_E_INVALID for a role the family does not take (a system
 * message where it has none, roles out of the order it requires: the message
 * says which), TIDE_E_NOMEM. */
tide_status tide_chat_format(tide_ctx *ctx, const tide_chat_template *c, const tide_chat_msg *msgs, int n,
                             bool add_generation_prompt, char **out, size_t *len);
void tide_free_text(char *text);

/* ---------------------------------------------------------------- text generation */

/* Generated ids to text, as a program that prints or streams a model's answer
 * needs it: the text of each id handed out as it comes, in pieces that never
 * split a UTF-8 character, and the generation stopped at the first stop
 * string, of which nothing is handed out (a stop string split across tokens
 * included: the text that might begin one is held back until it cannot).
 * The pieces handed out, joined, are always a prefix of the text, and equal
 * it once tide_textgen_finish has run. Special tokens give no text by
 * default. One text generation is used by one thread at a time. */
typedef struct tide_textgen tide_textgen;

typedef struct tide_textgen_opts {
    const char *const *stops;   /* stop strings (non-empty, valid UTF-8), copied */
    int n_stops;
    unsigned decode_flags;      /* TIDE_DECODE_*: the default skips special tokens */
    /* Optional: each piece of text as soon as it can no longer be part of a
     * stop string (not NUL-terminated, valid during the call). */
    void (*emit)(void *user, const char *piece, size_t len);
    void *emit_user;
} tide_textgen_opts;

/* The defaults: no stop strings, special tokens skipped, no emit. */
tide_textgen_opts tide_textgen_opts_default(void);
/* A text generation decoding with tok (which must outlive it); o NULL is the
 * defaults. Failures are recorded on ctx. Returns TIDE_OK, TIDE_E_INVALID
 * (an empty or invalid UTF-8 stop string, unknown flags: the message says
 * which) or TIDE_E_NOMEM. */
tide_status tide_textgen_new(tide_ctx *ctx, const tide_tokenizer *tok, const tide_textgen_opts *o,
                             tide_textgen **out);
void tide_textgen_free(tide_textgen *tg);
/* Replaces the emit callback (NULL: none) for the pieces from now on. */
void tide_textgen_set_emit(tide_textgen *tg, void (*emit)(void *user, const char *piece, size_t len), void *user);
/* Starts a new text: empty, not stopped, no failure kept. */
void tide_textgen_reset(tide_textgen *tg);
/* Adds the text of generated id `id`; *stop (may be NULL) is set when the
 * text has met a stop string (it is cut where that begins; the ids after it
 * add nothing). Returns TIDE_OK, or the failure (an id out of the
 * tokenizer's range: TIDE_E_RANGE; TIDE_E_NOMEM), which leaves the text as
 * it was and is returned again by every later call until the reset. */
tide_status tide_textgen_push(tide_textgen *tg, int32_t id, bool *stop);
/* tide_gen_opts.on_token for a text generation (user: the tide_textgen):
 * pushes the id and returns non-zero to stop the generation at a stop
 * string or a failure (tide_textgen_status tells which). */
int tide_textgen_on_token(void *user, int32_t id);
/* Ends the text: what was held back for a stop string that never came, and
 * the decoder's tail (U+FFFD for an unfinished character), are added and
 * handed out. Returns TIDE_OK or the kept failure. */
tide_status tide_textgen_finish(tide_textgen *tg);
/* The text so far (NUL-terminated, *len its length; valid until the next call
 * that changes tg), without any stop string. */
const char *tide_textgen_text(const tide_textgen *tg, size_t *len);
/* Whether a stop string ended the text. */
bool tide_textgen_stopped(const tide_textgen *tg);
/* The first failure since the reset (TIDE_OK when none). */
tide_status tide_textgen_status(const tide_textgen *tg);

/* One text generation on m: tg reset, then tide_model_generate_ex with g
 * (may be NULL; its sampler, stop ids and start position used as given),
 * each id pushed into tg before g->on_token (when set) is called, then
 * tg finished. The sampler is the caller's to start (tide_sampler_start).
 * Returns what tide_model_generate_ex returns (its message on m's context),
 * else tg's failure (on tg's context, "decoding the generated tokens: ..."). */
tide_status tide_textgen_generate(tide_textgen *tg, tide_model *m, const int32_t *prompt, int n_prompt,
                                  int max_new, const tide_gen_opts *g, int32_t *out_tokens, int *n_out,
                                  tide_gen_stats *stats);

/* Starts a generation's sampling: s reset to seed, then the prompt's ids
 * accepted (the penalties see them). TIDE_OK, TIDE_E_INVALID (NULL
 * arguments) or TIDE_E_RANGE (an id outside s's vocabulary). */
tide_status tide_sampler_start(tide_sampler *s, uint64_t seed, const int32_t *prompt, int n_prompt);

/* The ids a generation of text stops on: tok's EOS ids, then c's end-of-turn
 * token when c is given and tok has it (and it is not one of them already).
 * Writes the first min(count, cap) into ids (may be NULL with cap 0) and
 * returns the count (at most tide_tokenizer_eos_ids' + 1). */
int tide_tokenizer_stop_ids(const tide_tokenizer *tok, const tide_chat_template *c, int32_t *ids, int cap);

/* Encodes a prompt into *ids (free with tide_free_ids), *n_ids of them, as
 * tide_tokenizer_encode with flags (a chat prompt from tide_chat_format
 * without TIDE_TOKENIZE_ADD_SPECIAL: the template writes the BOS). Failures
 * are recorded on the tokenizer's context: TIDE_E_INVALID for "the prompt is
 * empty" (no text or no ids) or a failure of encoding ("cannot encode the
 * prompt: ..."), TIDE_E_RANGE for more than 2^30 ids, TIDE_E_NOMEM. */
tide_status tide_tokenizer_encode_prompt(tide_tokenizer *tok, const char *text, size_t len, unsigned flags,
                                         int32_t **ids, int *n_ids);
void tide_free_ids(int32_t *ids);

/* ---------------------------------------------------------------- several workloads: models a pool loads */

/* The budget "auto" means for a pool on be (tide_pool_opts.budget_bytes): a
 * GPU's free memory now less the margin TIDE_BUDGET_AUTO keeps (the larger
 * of 512 MiB and 1/32 of its memory), in whole 256-byte units. Returns
 * TIDE_OK; TIDE_E_UNSUPPORTED for a backend that has no free memory to read
 * (the CPU's: give bytes); TIDE_E_INFEASIBLE when the free memory is no
 * more than the margin (the message gives both); the backend's failure of
 * reading it. Messages on ctx. */
tide_status tide_pool_auto_budget(tide_ctx *ctx, tide_backend *be, uint64_t *out);

/* A pool may load models itself. Offered a model (a name and a Hugging Face
 * model directory), it loads it on its first tide_pool_acquire (checkpoint,
 * then tide_pool_add_model) and keeps it while there is room; when an
 * acquire needs a model that is not loaded and there is no room, the least
 * recently used loaded model that nobody holds is evicted (tide_pool_remove,
 * logged with its reason through tide_pool_opts.log) and the load goes on.
 * Room runs out when the pool's max_loaded models are loaded; when, under
 * policy equal, the pool refuses the model beside the others; and, under
 * policy tide, when the loaded models' minimums with the new one's exceed the
 * budget (the new model is loaded, then idle ones evicted until the minimums
 * fit; with none idle the pool time-slices). Offer every model before the
 * first acquire. */
typedef struct tide_pool_model_opts {
    int ctx_len;      /* its KV cache's positions (0: the model's, at most 4096) */
    int max_batch;    /* its requests one batch takes (0: 4, fewer where its KV
                         cache, in host memory, would take over a quarter of the
                         host memory available when it loads) */
    int threads;      /* CPU threads of its runs (0: all) */
    tide_dtype cache_dtype; /* its KV cache's type (tide_model_opts.cache_dtype; 0: f32) */
    const char *lora;       /* a PEFT LoRA adapter directory applied to it when it
                               loads (tide_checkpoint_add_lora; NULL: none) */
} tide_pool_model_opts;

/* The defaults above (all 0). */
tide_pool_model_opts tide_pool_model_opts_default(void);
/* Offers the model in directory dir as `name` (o may be NULL: the defaults).
 * Nothing is read yet. TIDE_OK; TIDE_E_INVALID (no name or directory, a name
 * offered before, a bad option); TIDE_E_NOMEM. Messages on the pool's context. */
tide_status tide_pool_offer_model(tide_pool *p, const char *name, const char *dir, const tide_pool_model_opts *o);
/* At most n offered models loaded at once (0, the default: as many as the
 * budget holds). TIDE_OK or TIDE_E_INVALID (n < 0). */
tide_status tide_pool_set_max_loaded(tide_pool *p, int n);
/* The workload of offered model `name`, loaded first when it is not (evicting
 * as said above), and held loaded until tide_pool_release: a held model is
 * never evicted. Thread-safe; a thread that finds the model being loaded or
 * evicted waits for that. Returns TIDE_OK; TIDE_E_NOT_FOUND (never offered);
 * TIDE_E_BUSY when there is no room and every model that would have to go is
 * held (the message names the limit or the budget and the models holding it:
 * try again later); or the failure of loading it ("cannot load the model ...",
 * "cannot add the model ... to the pool: ..."). Messages on ctx (NULL: the
 * model's own context). */
tide_status tide_pool_acquire(tide_pool *p, const char *name, tide_ctx *ctx, tide_pool_workload **out);
/* Ends one hold of tide_pool_acquire on w. */
void tide_pool_release(tide_pool *p, tide_pool_workload *w);
/* The checkpoint w runs (valid while w is in the pool), and the positions
 * of its KV cache. */
tide_checkpoint *tide_pool_workload_checkpoint(tide_pool_workload *w);
int tide_pool_workload_ctx_len(const tide_pool_workload *w);

typedef struct tide_pool_model_info {
    bool loaded;                /* loaded now */
    int holders;                /* tide_pool_acquire holds on it now */
    int64_t evictions;          /* times it was evicted */
    int ctx_len;                /* its KV cache's positions (loaded: else 0) */
    tide_pool_workload_stats stats; /* its workload's (loaded: else zero) */
} tide_pool_model_info;

/* A consistent snapshot of offered model `name`. TIDE_OK or TIDE_E_NOT_FOUND. */
tide_status tide_pool_model_info_get(tide_pool *p, const char *name, tide_pool_model_info *out);

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif

#ifdef __cplusplus
}
#endif
#endif /* TIDE_H */
