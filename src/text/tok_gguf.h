/*
 * tok_gguf.h - a tokenizer from GGUF metadata (llama.cpp's tokenizer.* keys),
 * described independently of the file: tok_gguf.c builds a tide_tokenizer
 * from a tok_gguf_desc (arrays as the keys hold them) and reads that
 * description from a GGUF file (tok_gguf_open, which tide_tokenizer_open
 * calls for a path ending in ".gguf").
 *
 * The keys, and what each becomes (every name below is prefixed by
 * "tokenizer.ggml." unless it starts with "tokenizer."):
 *   model            "llama": SentencePiece-style: the text's spaces become
 *                    U+2581 (with one in front of each piece of text when
 *                    add_space_prefix, as llama.cpp does: at the start and after
 *                    each special or user-defined token), symbols merge by the
 *                    scores (the adjacent pair whose joined text is a normal
 *                    token of the highest score, leftmost first), characters
 *                    not in the vocabulary fall back to <0xNN> byte tokens.
 *                    "gpt2": byte-level BPE with `merges` ("a b", rank = place).
 *                    Anything else is refused.
 *   pre              (gpt2) the pre-tokenizer, by llama.cpp's name, as the
 *                    Hugging Face tokenizer of that family splits (tok_gguf.c's
 *                    table: gpt-2; llama-bpe, llama3, llama-v3; qwen2; tekken);
 *                    unknown names are refused, naming the supported ones
 *   tokens, scores, token_type (1 normal, 2 unknown, 3 control, 4 user-defined,
 *                    5 unused, 6 byte; 0 read as normal), merges
 *   bos/eos/eot/unknown/padding_token_id, add_bos_token, add_eos_token,
 *   add_space_prefix, and tokenizer.chat_template.
 * Control and unknown tokens are special added tokens (matched in the text
 * unless special tokens are read as text, dropped by TIDE_DECODE_SKIP_SPECIAL),
 * user-defined ones non-special added tokens; both matched on the raw text.
 * EOS ids: eos_token_id, then eot_token_id.
 */
#ifndef TIDE_TOK_GGUF_H
#define TIDE_TOK_GGUF_H

#include "tide.h"

#include <stdint.h>

#define TOK_GGUF_ABSENT INT64_MIN

enum {
    TOK_GGUF_TYPE_UNDEFINED = 0,
    TOK_GGUF_TYPE_NORMAL = 1,
    TOK_GGUF_TYPE_UNKNOWN = 2,
    TOK_GGUF_TYPE_CONTROL = 3,
    TOK_GGUF_TYPE_USER_DEFINED = 4,
    TOK_GGUF_TYPE_UNUSED = 5,
    TOK_GGUF_TYPE_BYTE = 6,
};

/* Strings are bytes with a length (a GGUF string has no terminator); a NULL
 * length array means NUL-terminated strings. Arrays that are absent are NULL;
 * ids that are absent TOK_GGUF_ABSENT; flags that are absent -1. */
typedef struct tok_gguf_desc {
    const char *source;            /* the file, named in messages */
    const char *model;             /* NULL: absent */
    const char *pre;               /* NULL: absent */
    int64_t n_tokens;
    const char *const *tokens;
    const uint64_t *tokens_len;
    int64_t n_scores;
    const float *scores;
    int64_t n_types;
    const int32_t *types;
    int64_t n_merges;
    const char *const *merges;
    const uint64_t *merges_len;
    int64_t bos, eos, eot, unk, pad;
    int add_bos, add_eos, add_space_prefix;
    const char *chat_template;     /* NULL-terminated copy or NULL */
} tok_gguf_desc;

/* Builds *out from d; errors name d->source and the key. */
tide_status tok_gguf_build(tide_ctx *ctx, const tok_gguf_desc *d, tide_tokenizer **out);

#endif
