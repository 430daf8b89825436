/* fuzz_tok_gguf: a GGUF file's tokenizer metadata (src/text/tok_gguf.c, through
 * the GGUF reader) loaded, then exercised as fuzz_tok.h says. */
#include "fuzz_tok.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return fuzz_tokenizer_file("tokenizer.gguf", data, size); }
