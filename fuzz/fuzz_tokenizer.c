/* fuzz_tokenizer: a tokenizer.json (src/text/tok_load.c, tok_config.c) loaded,
 * then encoded (src/text/tok_encode.c) and decoded (src/text/tok_decode.c) as
 * fuzz_tok.h says. */
#include "fuzz_tok.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return fuzz_tokenizer_file("tokenizer.json", data, size); }
