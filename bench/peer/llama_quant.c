/*
 * llama_quant.c - llama.cpp's own quantizer for bench/peer_llamacpp.sh: the
 * library call (llama_model_quantize) that llama.cpp's quantize tool makes,
 * so the quantized files both programs run are the ones llama.cpp's users
 * download or make.
 *
 *   llama_quant IN.gguf OUT.gguf TYPE [THREADS]
 *
 * TYPE: Q8_0, Q4_0, Q4_K_M, Q5_K_M or Q6_K (llama.cpp's mixes: the _M ones
 * keep some tensors at higher precision by its own rules). Exit 0 on
 * success, 1 when llama.cpp fails, 2 on usage.
 */
#include "llama.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    static const struct {
        const char *name;
        enum llama_ftype ftype;
    } types[] = {{"Q8_0", LLAMA_FTYPE_MOSTLY_Q8_0},     {"Q4_0", LLAMA_FTYPE_MOSTLY_Q4_0},
                 {"Q4_K_M", LLAMA_FTYPE_MOSTLY_Q4_K_M}, {"Q5_K_M", LLAMA_FTYPE_MOSTLY_Q5_K_M},
                 {"Q6_K", LLAMA_FTYPE_MOSTLY_Q6_K}};
    if (argc < 4 || argc > 5) {
        fprintf(stderr, "usage: llama_quant IN.gguf OUT.gguf Q8_0|Q4_0|Q4_K_M|Q5_K_M|Q6_K [THREADS]\n");
        return 2;
    }
    llama_model_quantize_params p = llama_model_quantize_default_params();
    size_t i = 0;
    while (i < sizeof types / sizeof types[0] && strcmp(types[i].name, argv[3]) != 0) i++;
    if (i == sizeof types / sizeof types[0]) {
        fprintf(stderr, "llama_quant: unknown type '%s'\n", argv[3]);
        return 2;
    }
    p.ftype = types[i].ftype;
    p.nthread = argc == 5 ? atoi(argv[4]) : 0;
    llama_backend_init();
    uint32_t rc = llama_model_quantize(argv[1], argv[2], &p);
    llama_backend_free();
    if (rc) {
        fprintf(stderr, "llama_quant: llama_model_quantize failed (%u)\n", rc);
        return 1;
    }
    return 0;
}
