/*
 * cmd_train.c - `tide train`: train a LLaMA-style model on a token file,
 * resident or offloaded under a budget, with checkpoints and resumption.
 */
#include "cli.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char help[] =
    "Usage: tide train [--model DIR] [--data FILE] [--data-dtype u16|u32] [--steps N]\n"
    "                  [--train-on completion|all] [--template NAME] [--eval FILE]\n"
    "                  [--eval-split X] [--eval-every N]\n"
    "                  [--batch B] [--seq T] [--accum N] [--lr X] [--min-lr X]\n"
    "                  [--warmup N] [--weight-decay X] [--beta1 X] [--beta2 X] [--eps X]\n"
    "                  [--grad-clip X] [--shuffle SEED]\n"
    "                  [--budget BYTES|PCT%|auto|min|none] [--policy P]\n"
    "                  [--optimizer auto|device|cpu] [--tile auto|none|LEVEL] [--no-refit]\n"
    "                  [--host-budget BYTES] [--ssd DIR[,DIR]] [--pread] [--hw PROFILE]\n"
    "                  [--check] [--out DIR] [--save-every N] [--save-dtype model|f32]\n"
    "                  [--resume DIR] [--trace FILE] [--trace-svg FILE]\n"
    "                  [--backend auto|cpu|cuda] [--matmul auto|f32|fast] [--threads N]\n"
    "                  [--precision f32|bf16|auto]\n"
    "                  [--json] [--quiet] [--ranks N] [--zero 0|1|2]\n"
    "                  [--comm mpi|tcp|nccl]\n"
    "                  [--lora-r R] [--lora-alpha A] [--lora-targets LIST] [--lora-init DIR]\n"
    "                  [--merge-out DIR] [--base-type q8_0|q4_0|q4_k|q5_k|q6_k]\n"
    "\n"
    "Trains a LLaMA-style model with AdamW on a flat file of token ids, or on text\n"
    "(documents, prompt/completion or chat examples; docs/training.md, section 6,\n"
    "Datasets). Each step runs --accum micro-batches of --batch rows of --seq\n"
    "tokens (forward, then backward, adding into the gradients), clips the\n"
    "gradients' global norm and updates every parameter; f32 master weights and\n"
    "moments are kept for 16-bit models. The step is one graph run through a\n"
    "verified plan: without a budget an unconstrained one; with --budget, one\n"
    "that pages parameters, optimizer state, gradients and activations between a\n"
    "device arena of that size, host memory and SSD, and computes exactly what\n"
    "the unconstrained step computes.\n"
    "\n"
    "With no --model and no --data it demonstrates training: the built-in\n"
    "tinyllama-mini model (tinyllama-1.1b's shape cut to 4 layers of width 256\n"
    "and a 2048-token vocabulary, synthetic bf16 weights) on a generated corpus\n"
    "(a Markov chain over 256 of its ids, learnable down to about 1.2 nats per\n"
    "token: the loss falls from about 7.6 to below 4 in the 40 steps), 40\n"
    "steps at lr 1e-3 with 5 warmup steps, offloaded at 25% of the step's\n"
    "unconstrained peak and checked bit for bit against the unconstrained run.\n"
    "\n"
    "  --model DIR         Hugging Face-layout LLaMA checkpoint (default with\n"
    "                      --resume: the resumed checkpoint)\n"
    "  --data FILE         token ids: raw little-endian uint16 (nanoGPT's\n"
    "                      train.bin), uint32 with --data-dtype u32, or a 1-D\n"
    "                      integer .npy. Micro-batch m of step s, row b reads the\n"
    "                      T+1 tokens at ((((s*accum)+m)*B + b)*T) mod (n - T - 1):\n"
    "                      inputs its first T, targets its last T.\n"
    "                      Or text through the model's tokenizer: FILE.jsonl\n"
    "                      (one JSON object a line: {\"text\": ...} documents,\n"
    "                      {\"prompt\": ..., \"completion\": ...} or {\"messages\":\n"
    "                      [{\"role\": \"system\"|\"user\"|\"assistant\", \"content\":\n"
    "                      ...}]} examples, chat rendered with the model's chat\n"
    "                      template) or FILE.txt (one document a line). Documents\n"
    "                      become the token stream a token file would hold (each:\n"
    "                      BOS where the tokenizer adds one, its ids, EOS), cut\n"
    "                      into windows as above. Examples are one per row,\n"
    "                      right-padded (causal attention keeps each inside\n"
    "                      itself; padding is not trained), truncated to T+1\n"
    "                      tokens (a warning counts them); row b of micro-batch m\n"
    "                      of step s holds example ((s*accum)+m)*B + b mod N. The\n"
    "                      loss is the mean over the step's trained targets (the\n"
    "                      sum over all its micro-batches over their count)\n"
    "  --train-on WHAT     examples: completion (default: the loss only on the\n"
    "                      completion and its EOS, or the assistant's messages) or\n"
    "                      all (every token)\n"
    "  --template NAME     the chat template family of \"messages\" rows (default:\n"
    "                      detected from the tokenizer's chat template)\n"
    "  --eval FILE         a validation set (any --data format): its loss, the mean\n"
    "                      over all its targets (windows at 0, T, 2T, ... of a\n"
    "                      stream; each example once), printed every --eval-every\n"
    "                      steps and after the last (the step graph run without\n"
    "                      the update; over ranks each rank evaluates its share,\n"
    "                      the losses and target counts all-reduced)\n"
    "  --eval-split X      keep the last fraction X (0 < X <= 0.5) of the rows\n"
    "                      (documents or examples) of a .jsonl/.txt --data apart\n"
    "                      as the validation set\n"
    "  --eval-every N      validate every N steps (default: only after the last)\n"
    "  --shuffle SEED      draw window starts (examples) from a generator seeded\n"
    "                      with SEED\n"
    "  --steps N           total optimizer steps (default 100; 40 in the\n"
    "                      demonstration); a resumed run continues to N\n"
    "  --batch B           rows per micro-batch (default 4)\n"
    "  --seq T             tokens per row (default 256, at most the model's\n"
    "                      max_position_embeddings)\n"
    "  --accum N           micro-batches per step (gradient accumulation, default 1)\n"
    "  --lr X              peak learning rate (default 3e-4, constant)\n"
    "  --min-lr X          cosine decay from --lr to X over the steps after warmup\n"
    "  --warmup N          linear warmup steps: lr * (s + 1) / N (default 0)\n"
    "  --weight-decay X    AdamW decoupled weight decay, on tensors of 2 or more\n"
    "                      dims only (default 0.1)\n"
    "  --beta1 X, --beta2 X, --eps X   AdamW (default 0.9, 0.95, 1e-8)\n"
    "  --grad-clip X       clip the global gradient norm to X (default 1.0; 0: off)\n"
    "  --budget X          device memory: bytes (2G), a percentage of the step's\n"
    "                      unconstrained peak (25%), auto, min or none (default:\n"
    "                      none, everything resident)\n"
    "  --policy P          tide (default), static-layer, lru, checkpoint-layer\n"
    "                      (activations recomputed per layer before its backward)\n"
    "                      or zero-offload (every AdamW update on the host CPU,\n"
    "                      gradients stored to host after each layer's backward,\n"
    "                      activations as checkpoint-layer)\n"
    "  --optimizer WHERE   where the AdamW updates of an offloaded step run: auto\n"
    "                      (default: each parameter's on the device or on the host\n"
    "                      CPU, whichever the plan predicts faster; a CPU update\n"
    "                      moves only the gradient down and the parameter up, not\n"
    "                      the master weights and moments; on the CPU backend the\n"
    "                      device, unless the budget cannot hold an update's\n"
    "                      operands), device, or cpu (all on the host CPU; tide\n"
    "                      policy)\n"
    "  --tile T            row tiles of an offloaded step: auto (default, policy\n"
    "                      tide: the step's ops run on tiles of whole sequences,\n"
    "                      from the coarsest tiling whose largest op fits the\n"
    "                      budget, finer ones while each is predicted faster; with\n"
    "                      --budget min the one with the smallest minimum), none,\n"
    "                      or a level 1-6 (tiles of batch/2^level sequences down\n"
    "                      to one; the levels past that keep tiles of one\n"
    "                      sequence and run the embedding and the head in 2, 4,\n"
    "                      8, ... vocabulary blocks: their loss, gradients and\n"
    "                      AdamW a block of rows at a time). Gradients and the\n"
    "                      loss add up over the tiles: the same step up to f32\n"
    "                      summation order (--check compares with a resident run\n"
    "                      of the same tiles)\n"
    "  --host-budget X     host memory for the training state and spills: state\n"
    "                      that does not fit is homed on SSD (default: the\n"
    "                      profile's host memory)\n"
    "  --ssd DIRS          spill and state directories, comma-separated (default\n"
    "                      $TMPDIR or /tmp); files are unlinked once open\n"
    "  --pread             SSD transfers with a pread/pwrite pool, not io_uring\n"
    "  --hw PROFILE        hardware profile for offloaded plans (default: a quick\n"
    "                      measurement of this machine)\n"
    "  --no-refit          keep the first plan: by default the second offloaded\n"
    "                      step is timed instruction by instruction and, when it is\n"
    "                      more than 15% off its prediction, the profile is\n"
    "                      refitted from it (per op kind and per link) and the\n"
    "                      step replanned under the same budget for the steps after\n"
    "                      it, with --optimizer auto on a GPU the AdamW placement\n"
    "                      chosen again on the refitted rates (a line says so; the\n"
    "                      summary gives the predictions before and after and the\n"
    "                      measured step time)\n"
    "  --check             also train the unconstrained (resident) run in step and\n"
    "                      compare every step's loss and, at the end, every\n"
    "                      parameter, master weight and moment bit for bit; exit\n"
    "                      status 1 when they differ (needs --budget)\n"
    "  --out DIR           save a checkpoint at the end: config.json and\n"
    "                      model.safetensors (loads in tide run and transformers)\n"
    "                      plus optimizer.safetensors (master weights, moments,\n"
    "                      step); written to a temporary directory and renamed\n"
    "  --save-every N      also save every N steps\n"
    "  --save-dtype D      model (default: the model's dtype) or f32 (the master\n"
    "                      weights)\n"
    "  --resume DIR        continue from a checkpoint saved by --out: bit for bit\n"
    "                      the run that never stopped (same --batch, --seq,\n"
    "                      --accum and --shuffle)\n"
    "  --trace FILE        Perfetto trace JSON of the last step, measured\n"
    "  --trace-svg FILE    device memory over the last step, measured and predicted\n"
    "  --backend B         auto (CUDA when a GPU is present, else CPU), cpu or cuda\n"
    "  --matmul M          how forward matmuls treat 16-bit weights: auto (default:\n"
    "                      fast on a GPU, f32 on the CPU), f32 (weights widened,\n"
    "                      f32 products) or fast (bf16 activations times the\n"
    "                      weights as stored, f32 sums)\n"
    "  --precision P       the step's arithmetic: auto (default: bf16 on the CPU\n"
    "                      backend where cpuid reports AVX512_BF16, else f32),\n"
    "                      f32 (everything f32: PyTorch's f32 step) or bf16\n"
    "                      (mixed precision as torch.autocast's bf16: every\n"
    "                      product on operands rounded to bf16 with f32 sums,\n"
    "                      the activations the backward keeps stored in bf16;\n"
    "                      norms, softmax, the loss, gradients, AdamW and the\n"
    "                      master weights f32; the CPU backend only;\n"
    "                      docs/training.md, section 13)\n"
    "  --threads N         CPU threads (default: all cores; with ranks on one\n"
    "                      machine, give each rank its share)\n"
    "  --ranks N           data-parallel ranks: checked against the launch's (the\n"
    "                      ranks are the processes mpirun -np N or torchrun\n"
    "                      --nproc-per-node N starts)\n"
    "  --zero Z            over ranks: 0 gradients all-reduced, every rank a whole\n"
    "                      optimizer state; 1 (default) master weights and moments\n"
    "                      sharded, gradients reduce-scattered after the backward;\n"
    "                      2 reduce-scattered during it, each micro-batch's\n"
    "                      summed into the shard\n"
    "  --comm C            the ranks' collectives: mpi (host memory, the CPU\n"
    "                      backend; the default under mpirun or srun), tcp (host\n"
    "                      memory, the CPU backend; the default and only carrier\n"
    "                      of a torchrun-style launch) or nccl (GPU memory,\n"
    "                      --backend cuda; its default). In one process with\n"
    "                      mpi or nccl: one rank, its collectives over itself\n"
    "                      (the step of one process)\n"
    "  --lora-r R          LoRA: freeze the base model and train rank-R adapters\n"
    "                      on the projections (y = x W^T + (alpha/R) x A^T B^T;\n"
    "                      A Kaiming-uniform as PEFT initialises it, from a\n"
    "                      generator seeded by --shuffle's seed (default 0), B\n"
    "                      zero; dropout 0). AdamW, clipping, schedules and\n"
    "                      accumulation run over the adapters alone; the base\n"
    "                      weights are read-only (no gradient, master or\n"
    "                      moments). --out writes the adapter in PEFT's format\n"
    "                      (adapter_model.safetensors, adapter_config.json)\n"
    "                      with its training state (optimizer.safetensors, the\n"
    "                      base's config.json), which --resume DIR (with --model\n"
    "                      BASE; r, alpha and targets from DIR) continues bit for\n"
    "                      bit. f32, f16 and bf16 bases, and quantized ones\n"
    "                      (QLoRA: a GGUF file, or --base-type). Over ranks\n"
    "                      (mpirun): the adapters' gradients reduced, --zero\n"
    "                      sharding their state, rank 0 writing --out\n"
    "  --lora-alpha A      LoRA's alpha (default 8, as PEFT's)\n"
    "  --lora-targets L    comma-separated q,k,v,o,gate,up,down (default all)\n"
    "  --lora-init DIR     start from the PEFT adapter in DIR (its r, alpha and\n"
    "                      targets from adapter_config.json)\n"
    "  --merge-out DIR     with --lora-r and --out: after the last step also write\n"
    "                      the base with the adapter merged (W + (alpha/r) B A per\n"
    "                      targeted projection, in the base's dtype; its config\n"
    "                      and tokenizer files copied) into the new directory DIR,\n"
    "                      which tide run and transformers load\n"
    "  --base-type T       QLoRA: quantize the base's seven projections of every\n"
    "                      layer to T (q8_0, q4_0, q4_k, q5_k, q6_k) at load,\n"
    "                      with tide's quantizer; the embedding, head and norms\n"
    "                      keep their type. The step reads the blocks as stored\n"
    "                      (dequantized inside the kernels); adapters stay f32.\n"
    "                      A GGUF base is used as stored (its quantized\n"
    "                      embedding or head widened to f32)\n"
    "  --json              one JSON object per step, then a summary object\n"
    "  --quiet             no progress lines\n"
    "\n"
    "Each step prints: step, loss, gradient norm (before clipping), learning rate,\n"
    "tokens/s and the bytes moved between tiers.\n"
    "\n"
    "Data-parallel ranks: `mpirun -np N tide train ... --accum A` (or srun with\n"
    "PMIx) runs N ranks on the CPU backend, Open MPI carrying the collectives;\n"
    "`torchrun --nproc-per-node N --no-python tide train ...` (or any launcher\n"
    "setting WORLD_SIZE, RANK, MASTER_ADDR and MASTER_PORT) runs them with the\n"
    "collectives on TCP sockets, meeting at rank 0\n"
    "(--backend cuda: on the GPUs, NCCL carrying them, one GPU per rank); rank\n"
    "r runs micro-batches r*A .. r*A+A-1 of the step one process with --accum N*A\n"
    "would run, so both train the same steps (equal up to f32 summation order).\n"
    "Rank 0 prints and saves (a save is whole: any N with the same N*A resumes\n"
    "it); --json prints every rank's lines. A failed rank ends every rank\n"
    "(docs/training.md, section 12).\n";

typedef struct train_args {
    const char *model, *data, *budget, *policy, *ssd, *hw, *out, *resume, *trace, *trace_svg, *optimizer;
    const char *eval, *chat_template;
    bool train_on_all;
    double eval_split;
    long eval_every;
    tide_token_dtype data_dtype;
    long steps, batch, seq, accum, warmup, save_every, threads;
    double lr, min_lr, wd, beta1, beta2, eps, clip;
    bool have_min_lr, have_steps, shuffle, check, json, quiet, pread, save_f32, no_refit, have_tile;
    int tile;                     /* --tile (tide_tile_parse) */
    uint64_t seed, host_budget;
    tide_backend_kind backend;
    tide_matmul_mode matmul;
    int precision;                /* --precision (TIDE_PRECISION_*) */
    bool demo;
    /* LoRA */
    long lora_r;
    double lora_alpha;
    bool have_lora_alpha;
    const char *lora_targets, *lora_init, *base_type;
    const char *merge_out;        /* --merge-out DIR: the trained adapter merged into the base */
    unsigned lora_bits, lora_init_targets;
    /* data-parallel ranks (getopt values 0x320..; --comm 0x420) */
    long ranks, zero;
    const char *comm; /* --comm: "mpi", "tcp", "nccl" or NULL (by the backend and the launch) */
} train_args;

typedef struct train_job {
    train_args a;
    tide_offload_opts off;
    bool offload;
    tide_ctx *ctx;
    cli_progress_state ps;
    tide_checkpoint *ck;
    tide_backend *be;
    tide_trainer *tr, *ref;       /* ref: the unconstrained run of --check */
    tide_dataset *data, *eval;
    tide_tokenizer *tokenizer;
    double eval_loss;             /* the last validation (eval_n > 0) */
    int64_t eval_n;
    int32_t *inputs, *targets;
    char model_dir[PATH_MAX], data_path[PATH_MAX];
    bool check_ok;
    double sum_wall, sum_pred;    /* over the steps after the first */
    int n_timed;
    tide_train_stats last;
    tide_train_stats refit;       /* the step after which the profile was refitted (replan != 0) */
    double sum_wall_after;        /* over the steps after the refit */
    int n_after;
    tide_comm *comm;              /* data-parallel ranks: the launch's, else NULL */
    int rank, world;              /* this process's rank of world (1: one process) */
    double sum_net_s, sum_overlap_s;
    uint64_t net_bytes;           /* the last step's */
} train_job;

static const struct option train_options[] = {
    {"model", required_argument, 0, 'm'},       {"data", required_argument, 0, 'd'},
    {"data-dtype", required_argument, 0, 'D'},  {"steps", required_argument, 0, 'n'},
    {"batch", required_argument, 0, 'B'},       {"seq", required_argument, 0, 'S'},
    {"accum", required_argument, 0, 'A'},       {"lr", required_argument, 0, 'l'},
    {"min-lr", required_argument, 0, 'L'},      {"warmup", required_argument, 0, 'W'},
    {"weight-decay", required_argument, 0, 'y'}, {"beta1", required_argument, 0, '1'},
    {"beta2", required_argument, 0, '2'},       {"eps", required_argument, 0, 'e'},
    {"grad-clip", required_argument, 0, 'g'},   {"shuffle", required_argument, 0, 'u'},
    {"budget", required_argument, 0, 'b'},      {"policy", required_argument, 0, 'P'},
    {"optimizer", required_argument, 0, 'O'},   {"no-refit", no_argument, 0, 'F'},
    {"tile", required_argument, 0, 'E'},
    {"host-budget", required_argument, 0, 'H'}, {"ssd", required_argument, 0, 's'},
    {"pread", no_argument, 0, 'R'},             {"hw", required_argument, 0, 'w'},
    {"check", no_argument, 0, 'c'},             {"out", required_argument, 0, 'o'},
    {"save-every", required_argument, 0, 'v'},  {"save-dtype", required_argument, 0, 'V'},
    {"resume", required_argument, 0, 'r'},      {"trace", required_argument, 0, 'x'},
    {"trace-svg", required_argument, 0, 'X'},   {"backend", required_argument, 0, 'k'},
    {"matmul", required_argument, 0, 'M'},      {"precision", required_argument, 0, 0x440},
    {"threads", required_argument, 0, 'T'},     {"json", no_argument, 0, 'j'},
    {"quiet", no_argument, 0, 'q'},             {"help", no_argument, 0, 'h'},
    {"train-on", required_argument, 0, 256},    {"template", required_argument, 0, 257},
    {"eval", required_argument, 0, 258},        {"eval-split", required_argument, 0, 259},
    {"eval-every", required_argument, 0, 260},
    {"lora-r", required_argument, 0, 0x200},    {"lora-alpha", required_argument, 0, 0x201},
    {"lora-targets", required_argument, 0, 0x202}, {"lora-init", required_argument, 0, 0x203},
    {"zero", required_argument, 0, 0x320},      {"ranks", required_argument, 0, 0x321},
    {"comm", required_argument, 0, 0x420},
    {"merge-out", required_argument, 0, 0x300},
    {"base-type", required_argument, 0, 0x310},
    {0, 0, 0, 0},
};

/* LoRA's options (getopt values 0x200..). */
static int parse_lora_option(int c, train_args *a) {
    switch (c) {
    case 0x200:
        if (cli_parse_int(optarg, 1, 65536, &a->lora_r))
            return cli_usage_error("train", "bad --lora-r '%s' (a rank from 1)", optarg);
        break;
    case 0x201:
        if (cli_parse_double(optarg, 1e-6, 1e6, &a->lora_alpha))
            return cli_usage_error("train", "bad --lora-alpha '%s' (positive)", optarg);
        a->have_lora_alpha = true;
        break;
    case 0x202: a->lora_targets = optarg; break;
    case 0x203: a->lora_init = optarg; break;
    case 0x300: a->merge_out = optarg; break;
    case 0x310: a->base_type = optarg; break; /* checked by the trainer (tide_qlora_config) */
    default: return cli_usage_error("train", "unknown option");
    }
    return -1;
}

#define BAD(opt) return cli_usage_error("train", "bad " opt " '%s'", optarg)

/* Data-parallel ranks' options (getopt values 0x320..). */
static int parse_rank_option(int c, train_args *a) {
    if (c == 0x320 && cli_parse_int(optarg, 0, 2, &a->zero)) BAD("--zero (0, 1 or 2)");
    if (c == 0x321 && cli_parse_int(optarg, 1, 1 << 20, &a->ranks)) BAD("--ranks");
    if (c == 0x420) {
        if (strcmp(optarg, "mpi") && strcmp(optarg, "tcp") && strcmp(optarg, "nccl")) BAD("--comm (mpi, tcp or nccl)");
        a->comm = optarg;
    }
    return -1;
}

/* The launch this process is a rank of: none (one process), one that MPI
 * joins (mpirun, srun), or a torchrun-style one (TCP). Returns -1 to go on,
 * else the exit status. */
static int join_ranks(train_job *j) {
    train_args *a = &j->a;
    const char *launcher = NULL;
    j->world = tide_comm_launch_env(&j->rank, &launcher);
    if (j->world < 0) {
        fprintf(stderr, "tide: train: the launcher's rank variables (%s) are malformed\n", launcher);
        return 1;
    }
    if (a->ranks > 1 && j->world == 1)
        return cli_usage_error("train", "--ranks %ld: each rank is a process of its own: start them with mpirun "
                               "-np %ld tide train ...%s, or torchrun --nproc-per-node %ld --no-python tide train "
                               "...", a->ranks, a->ranks,
                               tide_comm_mpi_available() ? "" : " (with a tide built with MPI: this one has none)",
                               a->ranks);
    if (a->ranks && j->world > 1 && a->ranks != j->world)
        return cli_usage_error("train", "--ranks %ld, but %s started %d ranks", a->ranks, launcher, j->world);
    if (j->world == 1 && !a->comm) {
        if (a->zero >= 0 && !a->ranks)
            return cli_usage_error("train", "--zero shards the state over data-parallel ranks: it needs a launch "
                                   "of several (mpirun -np N, or torchrun --nproc-per-node N)");
        return -1;
    }
    /* the collectives' carrier: MPI (mpirun, srun) or TCP (torchrun-style)
     * on the CPU backend, NCCL on CUDA (one process with --comm mpi or nccl:
     * one rank, its collectives over itself) */
    bool torchrun = !strcmp(launcher, "torchrun") && j->world > 1;
    if (a->comm && !strcmp(a->comm, "tcp") && !torchrun)
        return cli_usage_error("train", "--comm tcp carries a torchrun-style launch (WORLD_SIZE, RANK, MASTER_ADDR "
                               "and MASTER_PORT set for each rank)%s", j->world > 1 ? ", and this one is MPI's (--comm "
                               "mpi)" : ": start the ranks with torchrun --nproc-per-node N --no-python tide train ...");
    if (a->comm && !strcmp(a->comm, "mpi") && torchrun)
        return cli_usage_error("train", "--comm mpi: MPI joins the ranks of mpirun or srun, and these were started "
                               "torchrun-style: their collectives go over TCP (--comm tcp)");
    bool nccl = a->comm ? !strcmp(a->comm, "nccl") : a->backend == TIDE_BACKEND_CUDA;
    if (nccl && a->backend == TIDE_BACKEND_CPU)
        return cli_usage_error("train", "--comm nccl runs the collectives on GPU memory: it needs --backend cuda");
    if (!nccl && a->backend == TIDE_BACKEND_CUDA)
        return cli_usage_error("train", "--comm %s carries host memory: ranks on the CUDA backend use NCCL "
                               "(--comm nccl)", a->comm);
    if (nccl && !tide_comm_nccl_available())
        return cli_usage_error("train", "ranks on the CUDA backend run their collectives on NCCL, and this tide was "
                               "built without it (CMake found no nccl.h and libnccl with the CUDA toolkit): run "
                               "the ranks on the CPU backend (--backend cpu)");
    a->backend = nccl ? TIDE_BACKEND_CUDA : TIDE_BACKEND_CPU;
    if (a->zero < 0) a->zero = 1;
    tide_ctx *ctx = tide_ctx_new();
    if (!ctx) return 1;
    if (tide_comm_open(ctx, &j->comm)) {
        fprintf(stderr, "tide: train: rank %d of %d (%s): %s\n", j->rank, j->world, launcher, tide_ctx_last_error(ctx));
        tide_ctx_free(ctx);
        return 1;
    }
    tide_ctx_free(ctx);
    if (tide_comm_size(j->comm) != j->world) {
        fprintf(stderr, "tide: train: %s started %d ranks, but %s joined %d (srun needs --mpi=pmix or pmi2)\n",
                launcher, j->world, tide_comm_carrier(j->comm), tide_comm_size(j->comm));
        tide_comm_close(j->comm);
        j->comm = NULL;
        return 1;
    }
    j->rank = tide_comm_rank(j->comm);
    j->world = tide_comm_size(j->comm);
    /* one rank's lines: rank 0's (--json: every rank's, each naming it) */
    if (j->rank > 0 && !a->json) a->quiet = true;
    return -1;
}

/* The options whose defaults the demonstration changes, where given. */
typedef struct seen_opts {
    bool lr, warmup, batch, seq;
} seen_opts;

/* Option c (its argument in optarg) into j. Returns -1 to go on, else the
 * exit status (0 after --help, 2 on a usage error). */
static int parse_option(int c, train_job *j, seen_opts *seen) {
    train_args *a = &j->a;
    switch (c) {
    case 'm': a->model = optarg; break;
    case 'd': a->data = optarg; break;
    case 'D':
        if (!strcmp(optarg, "u16")) a->data_dtype = TIDE_TOKENS_U16;
        else if (!strcmp(optarg, "u32")) a->data_dtype = TIDE_TOKENS_U32;
        else return cli_usage_error("train", "bad --data-dtype '%s' (u16 or u32)", optarg);
        break;
    case 'n':
        if (cli_parse_int(optarg, 1, 1L << 40, &a->steps)) BAD("--steps");
        a->have_steps = true;
        break;
    case 'B':
        if (cli_parse_int(optarg, 1, 1 << 16, &a->batch)) BAD("--batch");
        seen->batch = true;
        break;
    case 'S':
        if (cli_parse_int(optarg, 1, 1 << 22, &a->seq)) BAD("--seq");
        seen->seq = true;
        break;
    case 'A':
        if (cli_parse_int(optarg, 1, 4096, &a->accum)) BAD("--accum");
        break;
    case 'l':
        if (cli_parse_double(optarg, 1e-12, 10, &a->lr)) BAD("--lr");
        seen->lr = true;
        break;
    case 'L':
        if (cli_parse_double(optarg, 0, 10, &a->min_lr)) BAD("--min-lr");
        a->have_min_lr = true;
        break;
    case 'W':
        if (cli_parse_int(optarg, 0, 1L << 40, &a->warmup)) BAD("--warmup");
        seen->warmup = true;
        break;
    case 'y':
        if (cli_parse_double(optarg, 0, 10, &a->wd)) BAD("--weight-decay");
        break;
    case '1':
        if (cli_parse_double(optarg, 0, 0.999999999, &a->beta1)) BAD("--beta1");
        break;
    case '2':
        if (cli_parse_double(optarg, 0, 0.999999999, &a->beta2)) BAD("--beta2");
        break;
    case 'e':
        if (cli_parse_double(optarg, 1e-30, 1, &a->eps)) BAD("--eps");
        break;
    case 'g':
        if (cli_parse_double(optarg, 0, 1e30, &a->clip)) BAD("--grad-clip");
        break;
    case 'u':
        if (cli_parse_u64(optarg, &a->seed)) BAD("--shuffle");
        a->shuffle = true;
        break;
    case 'b':
        a->budget = optarg;
        if (cli_parse_budget(optarg, &j->off))
            return cli_usage_error("train", "bad --budget '%s' (bytes such as 2G, a percentage such as 25%%, "
                                   "auto, min or none)", optarg);
        break;
    case 'P':
        if (strcmp(optarg, "tide") && strcmp(optarg, "static-layer") && strcmp(optarg, "lru") &&
            strcmp(optarg, "checkpoint-layer") && strcmp(optarg, "zero-offload"))
            return cli_usage_error("train", "unknown --policy '%s' (tide, static-layer, lru, checkpoint-layer "
                                   "or zero-offload)", optarg);
        a->policy = optarg;
        break;
    case 'O':
        if (strcmp(optarg, "auto") && strcmp(optarg, "device") && strcmp(optarg, "cpu"))
            return cli_usage_error("train", "unknown --optimizer '%s' (auto, device or cpu)", optarg);
        a->optimizer = optarg;
        break;
    case 'E':
        if (tide_tile_parse(NULL, optarg, &a->tile))
            return cli_usage_error("train", "bad --tile '%s' (auto, none or a level 1 to %d)", optarg,
                                   TIDE_TILE_LEVELS - 1);
        a->have_tile = true;
        break;
    case 'H':
        if (cli_parse_bytes(optarg, &a->host_budget) || !a->host_budget) BAD("--host-budget");
        break;
    case 's': a->ssd = optarg; break;
    case 'R': a->pread = true; break;
    case 'w': a->hw = optarg; break;
    case 'c': a->check = true; break;
    case 'o': a->out = optarg; break;
    case 'v':
        if (cli_parse_int(optarg, 1, 1L << 40, &a->save_every)) BAD("--save-every");
        break;
    case 'V':
        if (!strcmp(optarg, "model")) a->save_f32 = false;
        else if (!strcmp(optarg, "f32")) a->save_f32 = true;
        else return cli_usage_error("train", "bad --save-dtype '%s' (model or f32)", optarg);
        break;
    case 'r': a->resume = optarg; break;
    case 'x': a->trace = optarg; break;
    case 'X': a->trace_svg = optarg; break;
    case 'k':
        if (cli_parse_backend(optarg, &a->backend))
            return cli_usage_error("train", "unknown --backend '%s' (auto, cpu or cuda)", optarg);
        break;
    case 'M':
        if (tide_matmul_parse(NULL, optarg, &a->matmul))
            return cli_usage_error("train", "unknown --matmul '%s' (auto, f32 or fast)", optarg);
        break;
    case 'T':
        if (cli_parse_int(optarg, 1, 4096, &a->threads)) BAD("--threads");
        break;
    case 0x440:
        if (tide_train_precision_parse(NULL, optarg, &a->precision))
            return cli_usage_error("train", "unknown --precision '%s' (f32, bf16 or auto)", optarg);
        break;
    case 'F': a->no_refit = true; break;
    case 256:
        if (!strcmp(optarg, "all")) a->train_on_all = true;
        else if (!strcmp(optarg, "completion")) a->train_on_all = false;
        else return cli_usage_error("train", "bad --train-on '%s' (completion or all)", optarg);
        break;
    case 257: a->chat_template = optarg; break;
    case 258: a->eval = optarg; break;
    case 259:
        if (cli_parse_double(optarg, 1e-9, 0.5, &a->eval_split)) BAD("--eval-split");
        break;
    case 260:
        if (cli_parse_int(optarg, 1, 1L << 40, &a->eval_every)) BAD("--eval-every");
        break;
    case 'j': a->json = true; break;
    case 'q': a->quiet = true; break;
    case 'h': fputs(help, stdout); return 0;
    default: return cli_usage_error("train", "unknown option");
    }
    return -1;
}

/* LoRA: --lora-init's config (or that of a LoRA state --resume continues)
 * gives r, alpha and targets (a given one must agree); the options'
 * consistency. */
static int check_lora_args(train_job *j) {
    train_args *a = &j->a;
    tide_ctx *ctx = NULL;
    char rp[PATH_MAX];
    struct stat rs;
    const bool lora_resume = a->resume && snprintf(rp, sizeof rp, "%s/adapter_config.json", a->resume) <
                                                      (int)sizeof rp && !stat(rp, &rs);
    if (lora_resume && a->lora_init)
        return cli_usage_error("train", "--resume %s continues a LoRA state: no --lora-init with it", a->resume);
    const char *from = lora_resume ? a->resume : a->lora_init;
    if (from) {
        int r;
        float al;
        unsigned tg;
        if (!(ctx = tide_ctx_new())) return 1;
        if (tide_lora_read_config(ctx, from, &r, &al, &tg)) {
            fprintf(stderr, "tide: train: %s: %s\n", lora_resume ? "--resume" : "--lora-init", tide_ctx_last_error(ctx));
            tide_ctx_free(ctx);
            return 1;
        }
        tide_ctx_free(ctx);
        if ((a->lora_r && a->lora_r != r) || (a->have_lora_alpha && (float)a->lora_alpha != al))
            return cli_usage_error("train", "--lora-r / --lora-alpha disagree with %s %s (r %d, alpha %g)",
                                   lora_resume ? "--resume" : "--lora-init", from, r, (double)al);
        a->lora_r = r;
        a->lora_alpha = al;
        a->have_lora_alpha = true;
        if (!a->lora_targets) a->lora_init_targets = tg;
    }
    if (a->merge_out && (!a->lora_r || !a->out))
        return cli_usage_error("train", "--merge-out merges the LoRA adapter saved to --out: it needs --lora-r (or "
                               "--lora-init) and --out");
    if (!a->lora_r) {
        if (a->have_lora_alpha || a->lora_targets)
            return cli_usage_error("train", "--lora-alpha and --lora-targets need --lora-r (or --lora-init)");
        return -1;
    }
    if (!a->have_lora_alpha) a->lora_alpha = 8;
    if (a->lora_targets) {
        if (!(ctx = tide_ctx_new())) return 1;
        tide_status st = tide_lora_parse_targets(ctx, a->lora_targets, &a->lora_bits);
        if (st) {
            int rc = cli_usage_error("train", "%s", tide_ctx_last_error(ctx));
            tide_ctx_free(ctx);
            return rc;
        }
        tide_ctx_free(ctx);
    } else {
        a->lora_bits = from ? a->lora_init_targets : TIDE_LORA_ALL;
    }
    if (a->resume && !lora_resume)
        return cli_usage_error("train", "--resume %s holds no LoRA state (no adapter_config.json): a LoRA run "
                               "resumes from its own --out", a->resume);
    if (lora_resume && !a->model)
        return cli_usage_error("train", "--resume of a LoRA state needs --model: the base it was trained on");
    return -1;
}

static int parse_args(int argc, char **argv, train_job *j) {
    train_args *a = &j->a;
    *a = (train_args){.policy = "tide", .steps = 100, .batch = 4, .seq = 256, .accum = 1, .lr = 3e-4, .wd = 0.1,
                      .zero = -1, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .clip = 1.0, .backend = TIDE_BACKEND_AUTO,
                      .precision = TIDE_PRECISION_AUTO};
    optind = 1;
    int c, rc_lora;
    seen_opts seen = {0};
    while ((c = getopt_long(argc, argv, "h", train_options, NULL)) != -1) {
        int rc = (c >= 0x320 && c <= 0x32f) || c == 0x420 ? parse_rank_option(c, a)
               : c >= 0x200 && c != 0x440 ? parse_lora_option(c, a) : parse_option(c, j, &seen);
        if (rc >= 0) return rc;
    }
    if ((rc_lora = check_lora_args(j)) >= 0) return rc_lora;
    if (optind != argc) return cli_usage_error("train", "unexpected argument '%s'", argv[optind]);
    a->demo = !a->model && !a->data && !a->resume;
    if (a->demo) {
        /* the demonstration: a small model learning a generated corpus */
        if (!a->have_steps) a->steps = 40;
        if (!seen.lr) a->lr = 1e-3;
        if (!seen.warmup) a->warmup = 5;
        if (!seen.batch) a->batch = 8;
        if (!seen.seq) a->seq = 128;
        if (!a->budget) {
            j->off.budget_kind = TIDE_BUDGET_FRACTION;
            j->off.fraction = 0.25;
            a->check = true;
        }
    }
    j->offload = j->off.budget_kind != TIDE_BUDGET_NONE;
    if (!a->data && !a->demo) return cli_usage_error("train", "--data is required with --model or --resume");
    if (a->have_tile && !j->offload)
        return cli_usage_error("train", "--tile tiles an offloaded step: it needs --budget");
    if (a->check && !j->offload)
        return cli_usage_error("train", "--check compares an offloaded run with the unconstrained one: it needs "
                               "--budget");
    if (!j->offload &&
        (a->ssd || a->hw || a->host_budget || a->pread || strcmp(a->policy, "tide") || a->optimizer || a->no_refit))
        return cli_usage_error("train", "--ssd, --hw, --host-budget, --pread, --policy, --optimizer and --no-refit "
                               "need a --budget");
    if (a->optimizer && !strcmp(a->optimizer, "cpu") && strcmp(a->policy, "tide") && strcmp(a->policy, "zero-offload"))
        return cli_usage_error("train", "--optimizer cpu is planned by the tide policy only");
    if (a->optimizer && !strcmp(a->optimizer, "device") && !strcmp(a->policy, "zero-offload"))
        return cli_usage_error("train", "--policy zero-offload runs every AdamW update on the host CPU: no "
                               "--optimizer device with it");
    if (a->save_every && !a->out) return cli_usage_error("train", "--save-every needs --out");
    if (a->eval && a->eval_split > 0) return cli_usage_error("train", "give --eval FILE or --eval-split X, not both");
    if (a->eval_every && !a->eval && !(a->eval_split > 0))
        return cli_usage_error("train", "--eval-every needs --eval FILE or --eval-split X");
    if (a->have_min_lr && a->min_lr > a->lr)
        return cli_usage_error("train", "--min-lr %g is above --lr %g", a->min_lr, a->lr);
    j->off.policy = a->policy;
    j->off.optimizer = a->optimizer;
    j->off.host_budget = a->host_budget;
    j->off.ssd_dirs = a->ssd;
    if (a->pread) setenv("TIDE_SSD_PREAD", "1", 1); /* src/store/ssd.c: the pread path */
    j->off.hw = a->hw;
    j->off.timeline = a->trace || a->trace_svg;
    j->off.no_refit = a->no_refit;
    j->off.tile = a->tile;
    return -1;
}

/* The demonstration's model and corpus, made once in the cache. */
static int ensure_demo(train_job *j) {
    char name[64];
    snprintf(name, sizeof name, "tinyllama-mini-synthetic-s%d", TIDE_DEFAULT_SEED);
    if (cli_default_model_dir(name, j->model_dir, sizeof j->model_dir)) {
        fprintf(stderr, "tide: the cache directory path is too long\n");
        return 1;
    }
    char path[PATH_MAX + 32];
    struct stat sb;
    tide_llama_config cfg;
    if (tide_llama_config_named(j->ctx, "tinyllama-mini", &cfg)) return cli_fail(j->ctx, "demonstration model");
    snprintf(path, sizeof path, "%s/model.safetensors", j->model_dir);
    if (stat(path, &sb) != 0) {
        if (!j->a.quiet && !j->a.json)
            fprintf(stderr, "tide: generating the built-in tinyllama-mini model (once) in %s\n", j->model_dir);
        if (tide_checkpoint_make_synthetic(j->ctx, &cfg, TIDE_DEFAULT_SEED, 0, j->model_dir))
            return cli_fail(j->ctx, "generating the demonstration model");
    }
    /* a Markov chain over the first 256 ids: the loss falls from ln(2048)
     * to ln(256) as the model learns which ids occur, then on towards the
     * chain's entropy as it learns the transitions */
    int n = snprintf(j->data_path, sizeof j->data_path, "%s/corpus-256.u16", j->model_dir);
    if (n < 0 || (size_t)n >= sizeof j->data_path) {
        fprintf(stderr, "tide: the cache directory path is too long\n");
        return 1;
    }
    if (stat(j->data_path, &sb) != 0 &&
        tide_tokens_write_synthetic(j->ctx, j->data_path, TIDE_TOKENS_U16,
                                    cfg.vocab_size < 256 ? cfg.vocab_size : 256, 1 << 20, 1))
        return cli_fail(j->ctx, "generating the demonstration corpus");
    return 0;
}

static tide_trainer_opts trainer_opts(const train_args *a) {
    tide_trainer_opts o = {
        .step = {.batch = (int)a->batch, .seq = (int)a->seq, .accum = (int)a->accum, .beta1 = (float)a->beta1,
                 .beta2 = (float)a->beta2, .eps = (float)a->eps, .weight_decay = (float)a->wd,
                 .grad_clip = (float)a->clip},
        .lr = a->lr, .min_lr = a->have_min_lr ? a->min_lr : a->lr, .cosine = a->have_min_lr, .warmup = a->warmup,
        .total_steps = a->steps, .shuffle = a->shuffle, .seed = a->seed};
    if (a->ranks > 1 || a->comm) {
        o.step.ranks = (int)a->ranks;
        o.step.zero = (int)a->zero;
        o.step.one_rank = a->ranks == 1;
    }
    if (a->lora_r) {
        o.step.lora_r = (int)a->lora_r;
        o.step.lora_alpha = (float)a->lora_alpha;
        o.step.lora_targets = a->lora_bits;
        o.lora_init = a->lora_init;
    }
    o.lora_base_type = a->base_type; /* without --lora-r: the trainer refuses it */
    o.step.precision = a->precision;
    const char *sync = getenv("TIDE_EXEC_SYNC"); /* read here, at the edge */
    o.sync_issue = sync && *sync && strcmp(sync, "0");
    return o;
}

/* Creates and removes a file in dir: whether a save could write there (a
 * read-only mount, a full disk's inode table or permissions refuse it; root
 * passes permission bits, so access() alone would not tell). */
static bool dir_takes_files(const char *dir) {
    char p[PATH_MAX];
    if (snprintf(p, sizeof p, "%s/.tide-write-probe-XXXXXX", dir) >= (int)sizeof p) return false;
    int fd = mkstemp(p);
    if (fd < 0) return false;
    close(fd);
    unlink(p);
    return true;
}

/* Refuses at once an --out that a save could not write (rather than after
 * the training). A save builds the checkpoint in a directory beside DIR and
 * renames it into place (src/train/save.c), so what must take files is DIR's
 * parent (the nearest existing ancestor for a new DIR), and DIR may not be a
 * mount point (a rename cannot replace one) nor a path that is not a
 * directory. --save-every saves there too. */
static int check_out(const char *out) {
    struct stat sb, pb;
    bool exists = stat(out, &sb) == 0;
    if (exists && !S_ISDIR(sb.st_mode)) {
        fprintf(stderr, "tide: train: --out %s exists and is not a directory\n", out);
        return 1;
    }
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s", out);
    size_t n = strlen(p);
    while (n > 1 && p[n - 1] == '/') p[--n] = 0; /* "ck/" is ck */
    for (;;) {
        char *slash = strrchr(p, '/');
        if (!slash) snprintf(p, sizeof p, ".");
        else if (slash == p) p[1] = 0;
        else *slash = 0;
        if (stat(p, &pb) == 0) break;
        if (!strcmp(p, ".") || !strcmp(p, "/")) break;
    }
    if (stat(p, &pb) != 0 || !S_ISDIR(pb.st_mode)) {
        fprintf(stderr, "tide: train: cannot write --out %s: %s is not a directory\n", out, p);
        return 1;
    }
    if (exists && (sb.st_dev != pb.st_dev || sb.st_ino == pb.st_ino)) {
        fprintf(stderr, "tide: train: cannot write --out %s: it is a mount point, and a checkpoint is built beside "
                "it and renamed into place: name a directory inside it\n", out);
        return 1;
    }
    if (!dir_takes_files(p)) {
        fprintf(stderr, "tide: train: cannot write --out %s: no file can be created in %s (%s)\n", out, p,
                strerror(errno));
        return 1;
    }
    return 0;
}

static bool is_text(const char *path) {
    size_t n = path ? strlen(path) : 0;
    return (n >= 6 && !strcmp(path + n - 6, ".jsonl")) || (n >= 4 && !strcmp(path + n - 4, ".txt"));
}

/* The training data and the validation set; text needs mdir's tokenizer. */
static int open_data(train_job *j, const char *mdir, const char *data) {
    const train_args *a = &j->a;
    const tide_llama_config *cfg = tide_checkpoint_config(j->ck);
    if ((is_text(data) || is_text(a->eval)) && tide_tokenizer_open(j->ctx, mdir, &j->tokenizer)) {
        fprintf(stderr, "tide: train: %s is text: it is encoded with the model's tokenizer, and %s has none that can "
                "be read (%s): give a token file (tide tokenize --out)\n", is_text(data) ? data : a->eval, mdir,
                tide_ctx_last_error(j->ctx));
        return 1;
    }
    tide_dataset_opts o = {.seq = (int)a->seq, .train_on_all = a->train_on_all, .chat_template = a->chat_template,
                           .eval_split = a->eval_split};
    if (tide_dataset_open(j->ctx, data, j->tokenizer, cfg->vocab_size, a->data_dtype, &o, &j->data, &j->eval))
        return cli_fail(j->ctx, "training data");
    o.eval_split = 0;
    if (a->eval && tide_dataset_open(j->ctx, a->eval, j->tokenizer, cfg->vocab_size, a->data_dtype, &o, &j->eval, NULL))
        return cli_fail(j->ctx, "validation data");
    const tide_dataset *sets[2] = {j->data, j->eval};
    for (int k = 0; k < 2; k++) {
        tide_dataset_info in;
        if (!sets[k]) continue;
        tide_dataset_info_get(sets[k], &in);
        if (in.truncated)
            fprintf(stderr, "tide: train: warning: %lld of the %s examples are longer than --seq %ld + 1 tokens: "
                    "truncated\n", (long long)in.truncated, k ? "validation" : "training", a->seq);
        if (in.dropped)
            fprintf(stderr, "tide: train: warning: %lld %s examples have no trained token within --seq %ld + 1 "
                    "tokens: left out\n", (long long)in.dropped, k ? "validation" : "training", a->seq);
    }
    return 0;
}

static int open_all(train_job *j) {
    const train_args *a = &j->a;
    int rc;
    if (a->precision == TIDE_PRECISION_BF16 && a->backend == TIDE_BACKEND_CUDA)
        return cli_usage_error("train", "--precision bf16 on --backend cuda is not built (the cpu backend runs it; "
                               "train there with --precision f32)");
    if (a->out && (rc = check_out(a->out))) return rc;
    struct stat ms;
    if (a->merge_out && !stat(a->merge_out, &ms)) {
        fprintf(stderr, "tide: train: --merge-out %s exists: the merged checkpoint goes to a new directory\n",
                a->merge_out);
        return 1;
    }
    if (a->demo && (rc = ensure_demo(j))) return rc;
    const char *mdir = a->demo ? j->model_dir : a->model ? a->model : a->resume;
    const char *data = a->demo ? j->data_path : a->data;
    if (tide_checkpoint_open(j->ctx, mdir, &j->ck)) return cli_fail(j->ctx, "loading the model");
    const tide_llama_config *cfg = tide_checkpoint_config(j->ck);
    if (a->merge_out && (cli_is_gguf(mdir) || tide_dtype_is_quantized(cfg->dtype) || cfg->wtypes_set)) {
        fprintf(stderr, "tide: train: --merge-out writes a merged checkpoint from an f32, f16 or bf16 safetensors "
                "base, not from %s\n", mdir);
        return 1;
    }
    if (a->seq > cfg->max_position_embeddings) {
        fprintf(stderr, "tide: train: --seq %ld is beyond the model's %d positions (max_position_embeddings in "
                "%s%s)\n", a->seq, cfg->max_position_embeddings, mdir, cli_is_gguf(mdir) ? "" : "/config.json");
        return 1;
    }
    if (tide_backend_new(j->ctx, a->backend, &j->be)) return cli_fail(j->ctx, "backend");
    /* auto: the backend's default on a GPU; on the CPU training keeps f32
     * products (the gradients PyTorch's f32 step computes) unless asked */
    tide_matmul_mode mm = a->matmul;
    if (mm == TIDE_MATMUL_AUTO && !strcmp(tide_backend_name(j->be), "cpu")) mm = TIDE_MATMUL_F32;
    if (tide_backend_set_matmul(j->be, mm)) return cli_fail(j->ctx, "--matmul");
    /* --precision: auto by the backend and the CPU; bf16 steps run on the CPU backend only */
    const bool on_cpu = !strcmp(tide_backend_name(j->be), "cpu");
    j->a.precision = tide_train_precision_resolve(a->precision, !on_cpu);
    if (a->precision == TIDE_PRECISION_BF16 && !on_cpu)
        return cli_usage_error("train", "--precision bf16 on --backend %s is not built (the cpu backend runs it; "
                               "train there with --precision f32)", tide_backend_name(j->be));
    tide_trainer_opts o = trainer_opts(a);
    if (tide_trainer_new(j->ctx, j->ck, j->be, &o, &j->tr)) return cli_fail(j->ctx, "preparing training");
    if (j->comm && tide_trainer_set_comm(j->tr, j->comm)) return cli_fail(j->ctx, "joining the ranks");
    if (j->offload && tide_trainer_set_offload(j->tr, &j->off)) return cli_fail(j->ctx, "offloading");
    if (a->resume && tide_trainer_resume(j->tr, a->resume)) return cli_fail(j->ctx, "resuming");
    if (a->check) {
        if (tide_trainer_new(j->ctx, j->ck, j->be, &o, &j->ref)) return cli_fail(j->ctx, "preparing the reference");
        if (j->comm && tide_trainer_set_comm(j->ref, j->comm)) return cli_fail(j->ctx, "joining the ranks");
        if (a->resume && tide_trainer_resume(j->ref, a->resume)) return cli_fail(j->ctx, "resuming");
    }
    /* the data last: a state that does not belong to the model is named first */
    if ((rc = open_data(j, mdir, data))) return rc;
    size_t n = (size_t)a->accum * (size_t)a->batch * (size_t)a->seq;
    j->inputs = malloc(n * sizeof *j->inputs);
    j->targets = malloc(n * sizeof *j->targets);
    if (!j->inputs || !j->targets) {
        fprintf(stderr, "tide: train: out of memory for the batch\n");
        return 1;
    }
    return 0;
}

static void print_data(const char *label, const char *path, const tide_dataset *d, bool shuffle) {
    tide_dataset_info in;
    tide_dataset_info_get(d, &in);
    const tide_tokens *tk = tide_dataset_tokens(d);
    if (!in.examples)
        printf("%-10s %s (%lld tokens, %s%s%s)\n", label, path, (long long)tide_tokens_count(tk),
               tide_tokens_dtype_name(tk), in.rows > 1 || in.skipped_lines ? ", from text" : "",
               shuffle ? ", shuffled" : ", in order");
    else
        printf("%-10s %s (%lld examples, %lld tokens, %lld trained; %lld truncated, %lld left out; padding %.1f%% "
               "of the row positions%s)\n", label, path, (long long)in.rows - in.dropped, (long long)in.tokens,
               (long long)in.targets, (long long)in.truncated, (long long)in.dropped, 100 * in.pad_fraction,
               shuffle ? ", shuffled" : "");
}

static void print_header(const train_job *j) {
    const train_args *a = &j->a;
    const tide_llama_config *cfg = tide_checkpoint_config(j->ck);
    char b1[32];
    printf("model      %s (%s, %d layers, %s, %.1fM parameters)\n",
           a->demo ? j->model_dir : a->model ? a->model : a->resume, cfg->name, cfg->num_hidden_layers,
           tide_dtype_name(cfg->dtype), (double)tide_llama_config_params(cfg) / 1e6);
    print_data("data", a->demo ? j->data_path : a->data, j->data, a->shuffle);
    if (j->eval) print_data("eval", a->eval ? a->eval : "the last rows of the data", j->eval, false);
    printf("step       batch %ld x seq %ld x accum %ld = %ld tokens; AdamW lr %g%s, betas %g/%g, eps %g, "
           "weight decay %g, clip %g\n", a->batch, a->seq, a->accum, a->batch * a->seq * a->accum, a->lr,
           a->have_min_lr ? " cosine" : "", a->beta1, a->beta2, a->eps, a->wd, a->clip);
    if (j->comm)
        printf("ranks      %d data-parallel ranks, each the above: the step of one process with accum %ld; "
               "ZeRO-%ld; collectives on %s%s\n", j->world, a->accum * j->world, a->zero,
               tide_comm_carrier(j->comm), a->backend == TIDE_BACKEND_CUDA ? " (host values) and NCCL" : "");
    printf("backend    %s, matmul %s, %d threads; %s\n", tide_backend_name(j->be),
           tide_matmul_name(tide_backend_matmul(j->be)), tide_ctx_threads(j->ctx), j->offload ? "offloaded" : "resident");
    if (a->precision == TIDE_PRECISION_BF16)
        printf("precision  bf16: products of bf16 operands (%s), f32 sums; kept activations bf16; norms, softmax, "
               "loss, AdamW and master weights f32\n", tide_train_bf16_path());
    else
        printf("precision  f32: every product, activation, gradient and update in f32\n");
    (void)b1;
}

static void print_step(const train_job *j, const tide_train_stats *s) {
    char b1[32], b2[32], b3[32];
    if (j->a.json) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "step", (double)s->step);
        cJSON_AddNumberToObject(o, "loss", s->loss);
        cJSON_AddNumberToObject(o, "targets", (double)s->n_targets);
        cJSON_AddNumberToObject(o, "grad_norm", s->grad_norm);
        cJSON_AddNumberToObject(o, "lr", s->lr);
        cJSON_AddNumberToObject(o, "tokens_per_s", s->tokens_per_s);
        cJSON_AddNumberToObject(o, "wall_s", s->wall_s);
        cJSON_AddNumberToObject(o, "bytes_h2d", (double)s->bytes_h2d);
        cJSON_AddNumberToObject(o, "bytes_d2h", (double)s->bytes_d2h);
        cJSON_AddNumberToObject(o, "bytes_ssd_read", (double)s->bytes_ssd_read);
        cJSON_AddNumberToObject(o, "bytes_ssd_write", (double)s->bytes_ssd_write);
        cJSON_AddNumberToObject(o, "peak_device_bytes", (double)s->peak_device_bytes);
        if (s->ranks > 1) {
            cJSON_AddNumberToObject(o, "rank", s->rank);
            cJSON_AddNumberToObject(o, "net_bytes", (double)s->net_bytes);
            cJSON_AddNumberToObject(o, "net_s", s->net_s);
            cJSON_AddNumberToObject(o, "net_overlap_s", s->net_overlap_s);
        }
        if (s->replan) {
            cJSON_AddBoolToObject(o, "replanned", s->replan > 0);
            cJSON_AddNumberToObject(o, "refit_measured_s", s->refit_measured_s);
            cJSON_AddNumberToObject(o, "refit_predicted_s", s->refit_predicted_s);
            cJSON_AddNumberToObject(o, "refit_new_predicted_s", s->refit_new_predicted_s);
            if (s->refit_host_groups_before >= 0)
                cJSON_AddNumberToObject(o, "refit_host_groups_before", s->refit_host_groups_before);
        }
        char *js = cJSON_PrintUnformatted(o);
        if (js) puts(js);
        free(js);
        cJSON_Delete(o);
        fflush(stdout);
        return;
    }
    if (j->comm && j->rank > 0) return;
    printf("step %5lld  loss %.4f  grad norm %.4f  lr %.3e  %8.0f tokens/s  %.3f s", (long long)s->step + 1,
           s->loss, s->grad_norm, s->lr, s->tokens_per_s, s->wall_s);
    if (s->ranks > 1) printf("  net %s", cli_fmt_bytes(s->net_bytes, b1, sizeof b1));
    if (j->offload)
        printf("  moved h2d %s d2h %s ssd %s", cli_fmt_bytes(s->bytes_h2d, b1, sizeof b1),
               cli_fmt_bytes(s->bytes_d2h, b2, sizeof b2),
               cli_fmt_bytes(s->bytes_ssd_read + s->bytes_ssd_write, b3, sizeof b3));
    printf("\n");
    if (s->replan)
        printf("%s after step %lld: measured %.3f s, predicted %.3f s (%+.0f%%); refitted prediction %.3f s%s\n",
               s->replan > 0 ? "replanned" : "refitted", (long long)s->step + 1, s->refit_measured_s,
               s->refit_predicted_s, 100.0 * (s->refit_measured_s / s->refit_predicted_s - 1),
               s->refit_new_predicted_s, s->replan > 0 ? "" : " for the plan kept");
    if (s->replan < 0) printf("  (not replanned: %s)\n", tide_ctx_last_error(j->ctx));
    if (s->replan > 0 && s->refit_host_groups_before >= 0)
        printf("  AdamW placement chosen again on the refitted rates (was %d of %d updates on the host CPU)\n",
               s->refit_host_groups_before, s->optimizer_groups);
    fflush(stdout);
}

/* Compares every persistent tensor of the two trainers bit for bit; prints
 * the first difference. Returns 1 when all are equal, 0 when not, -1 on an
 * error. */
static int compare_state(train_job *j) {
    int n = tide_trainer_n_tensors(j->tr);
    uint64_t biggest = 0;
    for (int i = 0; i < n; i++) {
        uint64_t nb = 0;
        tide_trainer_tensor(j->tr, i, NULL, &nb);
        biggest = nb > biggest ? nb : biggest;
    }
    char *x = malloc(biggest ? biggest : 1), *y = malloc(biggest ? biggest : 1);
    int rc = x && y ? 1 : -1;
    for (int i = 0; rc == 1 && i < n; i++) {
        uint64_t nb = 0;
        const char *name = tide_trainer_tensor(j->tr, i, NULL, &nb);
        if (tide_trainer_read(j->tr, name, x, nb) || tide_trainer_read(j->ref, name, y, nb)) rc = -1;
        else if (memcmp(x, y, nb)) {
            fprintf(stderr, "tide: train: --check: '%s' differs from the unconstrained run's\n", name);
            rc = 0;
        }
    }
    free(x);
    free(y);
    return rc;
}

static int save(train_job *j, const char *what) {
    const train_args *a = &j->a;
    char seed[32];
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)a->seed);
    const char *extra[] = {"data_file", a->demo ? j->data_path : a->data, "lr_schedule",
                           a->have_min_lr ? "cosine" : "constant"};
    const tide_llama_config *cfg = tide_checkpoint_config(j->ck);
    tide_dtype dt = a->save_f32 ? TIDE_F32 : cfg->dtype;
    if (a->lora_r) {
        if (tide_trainer_save_lora(j->tr, a->out)) return cli_fail(j->ctx, what);
    } else if (tide_trainer_save(j->tr, a->out, dt, extra, 2)) {
        return cli_fail(j->ctx, what);
    }
    if (!a->quiet && !a->json)
        fprintf(stderr, "tide: saved step %lld to %s\n", (long long)tide_trainer_steps(j->tr), a->out);
    return 0;
}

/* The validation loss after step: the mean over every target of the
 * validation set, batch by batch through the step graph without the update.
 * Ranks: batches of accum x world micro-batches, as one process with that
 * accum batches them, rank r evaluating r*accum .. r*accum+accum-1 of each;
 * the trainer all-reduces the batch's loss and target count, so every rank
 * sums the same whole batches. */
static int validate(train_job *j, int64_t step) {
    const train_args *a = &j->a;
    tide_batch_spec spec = {.batch = (int)a->batch, .seq = (int)a->seq, .accum = (int)(a->accum * j->world)};
    const int m0 = (int)(j->rank * a->accum);
    size_t per = (size_t)a->batch * (size_t)a->seq;
    double sum = 0;
    int64_t n = 0, nb = tide_dataset_eval_batches(j->eval, &spec);
    for (int64_t i = 0; i < nb; i++) {
        for (int m = 0; m < a->accum; m++)
            if (tide_dataset_eval_batch(j->eval, &spec, i, m0 + m, j->inputs + m * per, j->targets + m * per))
                return cli_fail(j->ctx, "reading a validation batch");
        double l;
        int64_t k;
        if (tide_trainer_eval(j->tr, j->inputs, j->targets, &l, &k)) return cli_fail(j->ctx, "validation");
        sum += l * (double)k;
        n += k;
    }
    j->eval_loss = n ? sum / (double)n : 0;
    j->eval_n = n;
    if (a->json) {
        char rank[32] = ""; /* ranks: every rank's line, naming it, as the steps' */
        if (j->comm) snprintf(rank, sizeof rank, ",\"rank\":%d", j->rank);
        printf("{\"eval\":true,\"step\":%lld,\"eval_loss\":%.9g,\"eval_targets\":%lld%s}\n", (long long)step,
               j->eval_loss, (long long)n, rank);
    } else if (!a->quiet) {
        printf("eval  %5lld  loss %.4f  (%lld targets)\n", (long long)step, j->eval_loss, (long long)n);
    }
    fflush(stdout);
    return 0;
}

/* --merge-out: the adapter just saved to --out merged into the base, as a
 * checkpoint of the base's dtype. */
static int merge(train_job *j) {
    const train_args *a = &j->a;
    if (j->comm && j->rank > 0) return 0; /* ranks: rank 0 wrote --out, and merges it */
    tide_checkpoint *ck = NULL;
    tide_status st = tide_checkpoint_open(j->ctx, a->demo ? j->model_dir : a->model, &ck);
    if (!st) st = tide_checkpoint_add_lora(ck, a->out);
    if (!st) st = tide_checkpoint_save_merged(ck, a->merge_out);
    tide_checkpoint_free(ck);
    if (st) return cli_fail(j->ctx, "--merge-out");
    if (!a->quiet && !a->json) fprintf(stderr, "tide: merged the adapter into %s\n", a->merge_out);
    return 0;
}

static int train_loop(train_job *j) {
    const train_args *a = &j->a;
    /* ranks: the step's micro-batches numbered as one process with accum x
     * world of them numbers them; rank r reads r*accum .. r*accum+accum-1 */
    tide_batch_spec spec = {.batch = (int)a->batch, .seq = (int)a->seq, .accum = (int)(a->accum * j->world),
                            .shuffle = a->shuffle, .seed = a->seed};
    const int m0 = (int)(j->rank * a->accum);
    size_t per = (size_t)a->batch * (size_t)a->seq;
    j->check_ok = true;
    int64_t s0 = tide_trainer_steps(j->tr);
    if (s0 >= a->steps && !a->quiet && !a->json)
        fprintf(stderr, "tide: train: the resumed state is at step %lld, not before --steps %ld: nothing to do\n",
                (long long)s0, a->steps);
    for (int64_t s = s0; s < a->steps; s++) {
        for (int m = 0; m < a->accum; m++)
            if (tide_dataset_batch(j->data, &spec, s, m0 + m, j->inputs + m * per, j->targets + m * per))
                return cli_fail(j->ctx, "reading a batch");
        tide_train_stats st, rs;
        tide_status e = tide_trainer_step(j->tr, j->inputs, j->targets, &st);
        cli_progress_end(&j->ps);
        if (e) return cli_fail(j->ctx, "training step");
        if (j->ref && s == s0 &&
            (tide_trainer_set_tiling(j->ref, tide_trainer_tile_seqs(j->tr)) ||
             tide_trainer_set_vocab_blocks(j->ref, tide_trainer_vocab_blocks(j->tr))))
            return cli_fail(j->ctx, "preparing the reference"); /* the same tiles, bit for bit */
        if (j->ref) {
            if (tide_trainer_step(j->ref, j->inputs, j->targets, &rs)) return cli_fail(j->ctx, "reference step");
            float x = (float)st.loss, y = (float)rs.loss;
            if (memcmp(&x, &y, sizeof x) || st.grad_norm != rs.grad_norm) {
                if (j->check_ok)
                    fprintf(stderr, "tide: train: --check: step %lld's loss %.9g differs from the unconstrained "
                            "run's %.9g\n", (long long)s + 1, st.loss, rs.loss);
                j->check_ok = false;
            }
        }
        print_step(j, &st);
        if (s > s0) {
            j->sum_wall += st.wall_s;
            j->sum_pred += st.predicted_s;
            j->sum_net_s += st.net_s;
            j->sum_overlap_s += st.net_overlap_s;
            j->n_timed++;
        }
        j->net_bytes = st.net_bytes;
        if (j->refit.replan) {
            j->sum_wall_after += st.wall_s;
            j->n_after++;
        }
        if (st.replan) j->refit = st;
        j->last = st;
        if (j->eval && a->eval_every && (s + 1) % a->eval_every == 0 && s + 1 < a->steps) {
            int rc = validate(j, s + 1);
            if (rc) return rc;
        }
        if (a->save_every && (s + 1) % a->save_every == 0 && s + 1 < a->steps) {
            int rc = save(j, "saving a checkpoint");
            if (rc) return rc;
        }
    }
    if (j->ref && tide_trainer_steps(j->tr) > s0) {
        int c = compare_state(j);
        if (c < 0) return cli_fail(j->ctx, "--check");
        if (!c) j->check_ok = false;
    }
    if ((a->trace || a->trace_svg) && tide_trainer_steps(j->tr) > s0 &&
        tide_trainer_write_trace(j->tr, a->trace, a->trace_svg))
        return cli_fail(j->ctx, "writing the trace");
    /* after the trace: it is of the last step, not of a validation */
    if (j->eval && tide_trainer_steps(j->tr) > s0) {
        int rc = validate(j, tide_trainer_steps(j->tr));
        if (rc) return rc;
    }
    if (a->out) {
        int rc = save(j, "saving the checkpoint");
        if (rc) return rc;
    }
    return a->merge_out ? merge(j) : 0;
}

static int summary(train_job *j) {
    const train_args *a = &j->a;
    const tide_train_stats *s = &j->last;
    double measured = j->n_timed ? j->sum_wall / j->n_timed : s->wall_s;
    double predicted = j->n_timed ? j->sum_pred / j->n_timed : s->predicted_s;
    char b1[32], b2[32];
    if (a->json) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddBoolToObject(o, "summary", 1);
        cJSON_AddNumberToObject(o, "steps", (double)tide_trainer_steps(j->tr));
        cJSON_AddNumberToObject(o, "final_loss", s->loss);
        cJSON_AddStringToObject(o, "backend", tide_backend_name(j->be));
        cJSON_AddStringToObject(o, "matmul", tide_matmul_name(tide_backend_matmul(j->be)));
        cJSON_AddStringToObject(o, "precision", tide_train_precision_name(a->precision));
        cJSON_AddNumberToObject(o, "threads", tide_ctx_threads(j->ctx));
        cJSON_AddBoolToObject(o, "offloaded", j->offload);
        cJSON_AddNumberToObject(o, "budget_bytes", (double)s->budget_bytes);
        cJSON_AddStringToObject(o, "policy", j->offload ? a->policy : "none");
        cJSON_AddNumberToObject(o, "peak_device_bytes", (double)s->peak_device_bytes);
        cJSON_AddNumberToObject(o, "tile_seqs", tide_trainer_tile_seqs(j->tr) ? tide_trainer_tile_seqs(j->tr)
                                                                                : (double)a->batch);
        cJSON_AddNumberToObject(o, "vocab_blocks", tide_trainer_vocab_blocks(j->tr) > 1 ? tide_trainer_vocab_blocks(j->tr) : 1);
        /* a resident plan is not priced on a profile of this machine */
        cJSON_AddNumberToObject(o, "optimizer_groups", s->optimizer_groups);
        cJSON_AddNumberToObject(o, "optimizer_host_groups", s->optimizer_host_groups);
        if (s->optimizer_host_groups)
            cJSON_AddNumberToObject(o, "predicted_device_optimizer_s", s->predicted_device_optimizer_s);
        if (j->offload) cJSON_AddNumberToObject(o, "predicted_step_s", predicted);
        else cJSON_AddNullToObject(o, "predicted_step_s");
        cJSON_AddNumberToObject(o, "measured_step_s", measured);
        const tide_train_stats *r = &j->refit;
        if (r->replan) {
            cJSON *f = cJSON_AddObjectToObject(o, "refit");
            cJSON_AddNumberToObject(f, "after_step", (double)r->step + 1);
            cJSON_AddBoolToObject(f, "replanned", r->replan > 0);
            cJSON_AddNumberToObject(f, "measured_s", r->refit_measured_s);
            cJSON_AddNumberToObject(f, "predicted_before_s", r->refit_predicted_s);
            cJSON_AddNumberToObject(f, "predicted_after_s", r->refit_new_predicted_s);
            if (r->refit_host_groups_before >= 0)
                cJSON_AddNumberToObject(f, "host_groups_before", r->refit_host_groups_before);
            if (j->n_after) cJSON_AddNumberToObject(f, "measured_after_s", j->sum_wall_after / j->n_after);
            else cJSON_AddNullToObject(f, "measured_after_s");
        } else {
            cJSON_AddNullToObject(o, "refit");
        }
        if (a->check) cJSON_AddBoolToObject(o, "check_passed", j->check_ok);
        cJSON_AddNumberToObject(o, "ranks", j->world);
        if (j->comm) {
            cJSON_AddNumberToObject(o, "rank", j->rank);
            cJSON_AddNumberToObject(o, "zero", (double)a->zero);
            cJSON_AddNumberToObject(o, "state_bytes_this_rank", (double)s->state_bytes_this_rank);
            cJSON_AddNumberToObject(o, "net_bytes_per_step", (double)j->net_bytes);
            cJSON_AddNumberToObject(o, "net_s_per_step", j->n_timed ? j->sum_net_s / j->n_timed : s->net_s);
            cJSON_AddNumberToObject(o, "net_overlap_s_per_step",
                                    j->n_timed ? j->sum_overlap_s / j->n_timed : s->net_overlap_s);
        }
        if (j->eval_n) {
            cJSON_AddNumberToObject(o, "eval_loss", j->eval_loss);
            cJSON_AddNumberToObject(o, "eval_targets", (double)j->eval_n);
        }
        char *js = cJSON_PrintUnformatted(o);
        if (js) puts(js);
        free(js);
        cJSON_Delete(o);
    } else if (tide_trainer_steps(j->tr) && !(j->comm && j->rank > 0)) {
        printf("summary    %lld steps, final loss %.4f; step %.3f s measured", (long long)tide_trainer_steps(j->tr),
               s->loss, measured);
        if (j->offload) printf(", %.3f s predicted", predicted);
        printf("\n");
        if (j->offload) {
            printf("offload    policy %s, device budget %s, peak device %s; AdamW: %d of %d updates on the host "
                   "CPU", a->policy, cli_fmt_bytes(s->budget_bytes, b1, sizeof b1),
                   cli_fmt_bytes(s->peak_device_bytes, b2, sizeof b2), s->optimizer_host_groups, s->optimizer_groups);
            int ts = tide_trainer_tile_seqs(j->tr);
            if (ts) printf("; row tiles of %d of the %ld sequences", ts, a->batch);
            if (tide_trainer_vocab_blocks(j->tr) > 1)
                printf("; embedding and head in %d vocabulary blocks", tide_trainer_vocab_blocks(j->tr));
            printf("\n");
        }
        const tide_train_stats *r = &j->refit;
        if (r->replan) {
            printf("refit      after step %lld: measured %.3f s, predicted %.3f s before the refit, %.3f s after%s",
                   (long long)r->step + 1, r->refit_measured_s, r->refit_predicted_s, r->refit_new_predicted_s,
                   r->replan > 0 ? " (replanned)" : " (plan kept)");
            if (r->replan > 0 && r->refit_host_groups_before >= 0)
                printf("; AdamW placed again: %d updates on the host before", r->refit_host_groups_before);
            if (j->n_after) printf("; later steps measured %.3f s", j->sum_wall_after / j->n_after);
            printf("\n");
        } else if (j->offload && !a->no_refit && j->n_timed >= 1) {
            printf("refit      none: the second step was within %.0f%% of its prediction\n",
                   100 * TIDE_TRAIN_REFIT_MARGIN);
        }
        if (j->comm) {
            double ns = j->n_timed ? j->sum_net_s / j->n_timed : s->net_s;
            double ov = j->n_timed ? j->sum_overlap_s / j->n_timed : s->net_overlap_s;
            printf("ranks      %d data-parallel ranks, ZeRO-%ld; rank 0 holds %s of master weights and moments, "
                   "sends %s a step; collectives %.3f s a step, %.0f%% of it overlapping computes\n", j->world,
                   a->zero, cli_fmt_bytes(s->state_bytes_this_rank, b1, sizeof b1),
                   cli_fmt_bytes(j->net_bytes, b2, sizeof b2), ns, ns > 0 ? 100 * ov / ns : 0);
        }
        if (j->eval_n) printf("eval       final validation loss %.4f over %lld targets\n", j->eval_loss, (long long)j->eval_n);
        if (a->check)
            printf("check      %s\n", j->check_ok ? "passed: every loss and the final parameters, master weights and "
                                                    "moments bit-identical to the unconstrained run"
                                                  : "FAILED: the offloaded run differs from the unconstrained one");
    }
    if (a->check && !j->check_ok) return 1;
    return 0;
}

int cmd_train(int argc, char **argv) {
    train_job j;
    memset(&j, 0, sizeof j);
    int rc = parse_args(argc, argv, &j);
    if (rc >= 0) return rc;
    if ((rc = join_ranks(&j)) >= 0) return rc;
    if (j.comm) j.a.ranks = j.world;
    if (!(j.ctx = tide_ctx_new())) return 1;
    tide_ctx_set_threads(j.ctx, (int)j.a.threads);
    cli_progress_init(&j.ps, j.a.quiet || j.a.json);
    tide_ctx_set_progress(j.ctx, cli_progress, &j.ps);
    if (!(rc = open_all(&j))) {
        if (!j.a.json && !(j.comm && j.rank > 0)) print_header(&j);
        if (!(rc = train_loop(&j))) rc = summary(&j);
    }
    tide_trainer_free(j.tr);
    tide_trainer_free(j.ref);
    tide_dataset_free(j.data);
    tide_dataset_free(j.eval);
    tide_tokenizer_free(j.tokenizer);
    tide_backend_free(j.be);
    tide_checkpoint_free(j.ck);
    tide_ctx_free(j.ctx);
    free(j.inputs);
    free(j.targets);
    if (j.comm && rc && j.world > 1) {
        /* the other ranks wait on this one's collectives: end them all */
        fprintf(stderr, "tide: train: rank %d of %d failed (exit status %d): ending every rank\n", j.rank, j.world, rc);
        fflush(stderr);
        tide_comm_abort(j.comm, rc);
    }
    tide_comm_close(j.comm);
    return rc;
}
