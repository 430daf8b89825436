/*
 * plan_int.h - what `tide plan` (cmd_plan.c) shares with its training form
 * (plan_train.c).
 */
#ifndef TIDE_CLI_PLAN_INT_H
#define TIDE_CLI_PLAN_INT_H

#include "cli.h"

typedef struct plan_args {
    const char *model, *config, *hw_name, *budget, *trace, *out;
    const char *dtype;            /* --dtype: the weights' storage type, or NULL */
    long batch, seq, decode, accum;
    uint64_t host_budget;
    tide_policy policy;
    bool json, weights_on_ssd, train, have_accum;
    int tile;
    tide_optim_mode optim;        /* --optimizer (training) */
    bool have_optim;
    bool host_compute_off;        /* --host-compute off */
    /* --train with LoRA: --lora-r (0: full fine-tuning), --lora-targets bits */
    long lora_r;
    unsigned lora_targets;
    const char *lora;   /* --lora DIR: inference with that adapter's branch */
    const char *base_type;        /* --base-type: QLoRA's base quantized to it */
    long ranks, zero;             /* --ranks (1: one device), --zero */
    bool have_zero;
    tide_dtype cache_type;        /* --cache-type (inference) */
    bool have_cache_type;
    int precision;                /* --precision (training): TIDE_PRECISION_F32 or _BF16 */
    bool have_precision;
} plan_args;

/* `tide plan --train`: returns the exit status. */
int plan_train(const plan_args *a);

#endif
