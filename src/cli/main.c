/*
 * main.c - the tide command: dispatches to one subcommand per file.
 */
#include "cli.h"

#include <stdio.h>
#include <string.h>

static const char usage[] =
    "Usage: tide <command> [options]\n"
    "\n"
    "Run large models on devices with too little memory: tensors are paged between\n"
    "device memory, pinned host memory and SSD files by a plan made ahead of time.\n"
    "\n"
    "Commands:\n"
    "  run          prefill a prompt (text or token ids) and generate, greedily or\n"
    "               sampled (default: the built-in tinyllama-1.1b-shaped synthetic\n"
    "               model, offloaded and checked)\n"
    "  chat         a conversation with a model in the terminal, with its chat\n"
    "               template\n"
    "  serve        serve several models over HTTP with OpenAI's API, all under one\n"
    "               device budget\n"
    "  train        train a model on a token file with AdamW, resident or offloaded\n"
    "               (default: the built-in tinyllama-mini on a generated corpus)\n"
    "  plan         plan a model's run or training step under a device memory\n"
    "               budget and predict it\n"
    "  make-model   write a deterministic synthetic checkpoint in Hugging Face layout\n"
    "  quantize     quantize a checkpoint into a GGUF file (Q8_0, Q4_0, Q4_K_M,\n"
    "               Q5_K_M, Q6_K) that llama.cpp runs\n"
    "  probe        measure this machine into a hardware profile\n"
    "  tokenize     print the token ids and pieces of a text under a model's\n"
    "               tokenizer\n"
    "  help         show this help, or a command's: tide help run\n"
    "\n"
    "Options:\n"
    "  -h, --help     show this help\n"
    "  -V, --version  show the version\n"
    "\n"
    "Each command takes --help. Exit status: 0 success, 1 failure, 2 usage error.\n";

int main(int argc, char **argv) {
    char *help_args[3] = {NULL, "--help", NULL};
    if (argc < 2) {
        fputs(usage, stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help")) {
        fputs(usage, stdout);
        return 0;
    }
    if (!strcmp(cmd, "-V") || !strcmp(cmd, "--version")) {
        printf("tide %s\n", tide_version());
        return 0;
    }
    if (!strcmp(cmd, "help")) {
        if (argc < 3) {
            fputs(usage, stdout);
            return 0;
        }
        help_args[0] = argv[2];
        argv = help_args;
        argc = 2;
        cmd = argv[0];
    } else {
        argv++;
        argc--;
    }
    if (!strcmp(cmd, "run")) return cmd_run(argc, argv);
    if (!strcmp(cmd, "make-model")) return cmd_make_model(argc, argv);
    if (!strcmp(cmd, "plan")) return cmd_plan(argc, argv);
    if (!strcmp(cmd, "train")) return cmd_train(argc, argv);
    if (!strcmp(cmd, "probe")) return cmd_probe(argc, argv);
    if (!strcmp(cmd, "tokenize")) return cmd_tokenize(argc, argv);
    if (!strcmp(cmd, "chat")) return cmd_chat(argc, argv);
    if (!strcmp(cmd, "serve")) return cmd_serve(argc, argv);
    if (!strcmp(cmd, "quantize")) return cmd_quantize(argc, argv);
    fprintf(stderr, "tide: unknown command '%s'\n", cmd);
    fputs(usage, stderr);
    return 2;
}
