/*
 * tok_int.h - the tokenizer's internals, shared by the files of src/text/:
 * tok_load.c (tokenizer.json into this structure), tok_gguf.c (GGUF metadata
 * into a tokenizer.json tree), tok_config.c (the config
 * files beside it; the public queries), tok_regex.c (PCRE2), tok_map.c (hash
 * maps and the word cache's hash), tok_encode.c (text to ids), tok_decode.c (ids to text, whole
 * and streaming), utf8.c (UTF-8 and GPT-2's byte table).
 *
 * The structure mirrors a Hugging Face tokenizer's pipeline, reduced to what
 * tide supports; tok_load.c refuses every component outside it by name.
 */
#ifndef TIDE_TOK_INT_H
#define TIDE_TOK_INT_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "core/core.h"

#include <cjson/cJSON.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ------------------------------------------------------------ UTF-8 (utf8.c) */

/* Length of the valid UTF-8 sequence at s[0..n) (1..4; n >= 1), or 0 when
 * s does not start with one. Then *maximal is the length of the maximal
 * subpart of the ill-formed sequence (>= 1: what one U+FFFD replaces) and
 * *incomplete tells whether that subpart runs to the end of s, so that more
 * bytes could still complete it. */
int tok_utf8_next(const uint8_t *s, size_t n, size_t *maximal, bool *incomplete);
/* true when s[0..n) is valid UTF-8. */
bool tok_utf8_valid(const uint8_t *s, size_t n);
/* Writes the UTF-8 of code point c into out (4 bytes room); returns its length. */
int tok_utf8_put(uint32_t c, uint8_t *out);
/* Decodes the valid sequence at s (of length len from tok_utf8_next). */
uint32_t tok_utf8_decode(const uint8_t *s, int len);

/* ------------------------------------------------------------ maps (tok_map.c) */

/* bytes -> int32 (vocabulary, added tokens). Keys are copied. */
typedef struct tok_smap {
    struct tok_sslot { uint64_t hash; uint32_t off, len; int32_t val; } *slots;
    size_t cap, n; /* cap a power of two; slot empty when len == UINT32_MAX */
    char *keys;
    size_t keys_len, keys_cap;
} tok_smap;
int tok_smap_init(tok_smap *m, size_t expect);
void tok_smap_free(tok_smap *m);
/* Inserts or overwrites; returns 0, or -1 when memory is exhausted. */
int tok_smap_put(tok_smap *m, const void *key, size_t len, int32_t val);
/* The value, or -1 when absent. */
int32_t tok_smap_get(const tok_smap *m, const void *key, size_t len);

/* (left id, right id) -> (rank, merged id). */
typedef struct tok_mmap {
    struct tok_mslot { uint64_t key; int32_t rank, id; } *slots;
    size_t cap, n;
} tok_mmap;
int tok_mmap_init(tok_mmap *m, size_t expect);
void tok_mmap_free(tok_mmap *m);
/* Returns 0, 1 when the pair was already there (now overwritten: a repeated
 * merge's later rank holds, as in `tokenizers`), -1 when out of memory. */
int tok_mmap_put(tok_mmap *m, int32_t a, int32_t b, int32_t rank, int32_t id);
/* The slot, or NULL when the pair has no merge. */
const struct tok_mslot *tok_mmap_get(const tok_mmap *m, int32_t a, int32_t b);

/* Direct-mapped cache of word -> ids (the model's output for a word). */
#define TOK_CACHE_SLOTS 8192
#define TOK_CACHE_WORD 40 /* longest word cached, bytes */
#define TOK_CACHE_IDS 20  /* most ids of a cached word */
typedef struct tok_cache_slot {
    uint64_t hash;
    uint8_t len, n_ids; /* len 0: empty */
    uint8_t word[TOK_CACHE_WORD];
    int32_t ids[TOK_CACHE_IDS];
} tok_cache_slot;

uint64_t tok_hash(const void *p, size_t n);

/* ------------------------------------------------------------ pipeline parts */

/* A compiled pattern: a regex, or a literal string compiled as one. */
typedef struct tok_regex {
    pcre2_code *code;
    bool jit;
} tok_regex;

typedef enum { TOK_NORM_PREPEND, TOK_NORM_REPLACE, TOK_NORM_NFC } tok_norm_kind;
typedef struct tok_norm {
    tok_norm_kind kind;
    char *str;      /* PREPEND: the prefix; REPLACE: the replacement */
    tok_regex re;   /* REPLACE: the pattern */
} tok_norm;

typedef enum { TOK_SPLIT_REMOVED, TOK_SPLIT_ISOLATED, TOK_SPLIT_MERGED_PREV, TOK_SPLIT_MERGED_NEXT,
               TOK_SPLIT_CONTIGUOUS } tok_split_behavior;
typedef enum { TOK_PRE_SPLIT, TOK_PRE_BYTELEVEL, TOK_PRE_METASPACE } tok_pre_kind;
typedef enum { TOK_PREPEND_ALWAYS, TOK_PREPEND_FIRST, TOK_PREPEND_NEVER } tok_prepend_scheme;
typedef struct tok_pre {
    tok_pre_kind kind;
    tok_regex re;                 /* SPLIT; BYTELEVEL with use_regex: GPT-2's */
    tok_split_behavior behavior;  /* SPLIT (BYTELEVEL: isolated) */
    bool invert;                  /* SPLIT */
    bool use_regex;               /* BYTELEVEL */
    bool add_prefix_space;        /* BYTELEVEL */
    char rep[8];                  /* METASPACE: the replacement character, UTF-8 */
    tok_prepend_scheme scheme;    /* METASPACE */
    bool split;                   /* METASPACE */
} tok_pre;

typedef enum { TOK_DEC_REPLACE, TOK_DEC_BYTEFALLBACK, TOK_DEC_BYTELEVEL, TOK_DEC_METASPACE, TOK_DEC_FUSE,
               TOK_DEC_STRIP } tok_dec_kind;
typedef struct tok_dec {
    tok_dec_kind kind;
    char *from, *to;             /* REPLACE: literal pattern and content */
    char rep[8];                 /* METASPACE */
    tok_prepend_scheme scheme;   /* METASPACE */
    char strip[8];               /* STRIP: the character stripped */
    int strip_start;             /* STRIP: how many at most, from the start */
} tok_dec;

/* An added token (tokenizer.json's added_tokens). */
typedef struct tok_added {
    char *content;    /* as matched: normalized contents pass through the normalizer */
    size_t len;
    int32_t id;
    bool special, lstrip, rstrip, single_word, normalized;
} tok_added;

/* One pass of added-token matching (non-normalized tokens on the raw text,
 * normalized ones on normalized text): leftmost-longest. */
typedef struct tok_added_pass {
    int *order;        /* indexes into added[], by first byte then longest first */
    int first[257];    /* order[first[b] .. first[b+1]) start with byte b */
    int n;
} tok_added_pass;

/* A piece of text on its way through the pipeline. at_start: it begins at
 * the start of the whole input (Metaspace's prepend_scheme "first"). */
typedef struct tok_piece {
    const uint8_t *p;
    size_t n;
    bool at_start;
} tok_piece;

/* Memory for rewritten text during one encode: blocks never move, so pieces
 * may point into them; reset at the start of every encode. */
typedef struct tok_arena {
    uint8_t **blocks;
    size_t *sizes;
    int n, cap;
    size_t used; /* in the last block */
} tok_arena;

/* ------------------------------------------------------------ the tokenizer */

struct tide_tokenizer {
    tide_ctx *ctx;
    char json_path[4096];

    /* id -> piece (the vocabulary's string, or an added token's content) */
    int32_t n_vocab;
    char **pieces;
    uint32_t *piece_len;
    uint8_t *flags; /* TOK_F_* per id */

    /* the BPE model */
    tok_smap vocab;        /* symbol string -> id; byte-level: the raw bytes */
    tok_mmap merges;
    bool byte_level;       /* symbols are bytes (ByteLevel pre-tokenizer) */
    bool byte_fallback, fuse_unk, ignore_merges;
    bool sp_cut;           /* words may be cut before each run of U+2581 (tok_load.c) */
    int32_t unk_id;        /* -1: none */
    int32_t byte_id[256];  /* byte-level: each byte's symbol; byte_fallback: <0xNN> */

    tok_norm *norm;
    int n_norm;
    tok_pre *pre;
    int n_pre;
    tok_dec *dec;
    int n_dec;
    bool dec_join_space;   /* no decoder: pieces joined by spaces */

    tok_added *added;
    int n_added;
    tok_added_pass pass_raw, pass_norm;
    tok_regex word_re;     /* \w, for single_word tokens */

    int32_t *prefix, *suffix; /* the post-processor's single template */
    int n_prefix, n_suffix;

    int32_t bos, eos;
    int32_t *eos_ids;
    int n_eos;
    char *chat_template;   /* NULL: none (tok_config.c) */

    /* scratch of encode (a tokenizer encodes on one thread at a time) */
    pcre2_match_data *md;
    tok_cache_slot *cache;
    tok_arena arena;
    int32_t *out;
    size_t n_out, cap_out;
    struct tok_sym { int32_t id; int32_t prev, next; uint32_t len; } *syms;
    struct tok_heap_ent { int32_t rank, pos, id; } *heap;
    size_t cap_syms, cap_heap;
};

#define TOK_F_ADDED 1
#define TOK_F_SPECIAL 2

/* tok_regex.c: compiles pattern (a regex, or a literal string); messages
 * name the file and `what`. */
tide_status tok_regex_compile(tide_tokenizer *t, const char *what, const char *pattern, bool literal,
                              tok_regex *re);
void tok_regex_free(tok_regex *re);
/* Finds the first match in s[0..n) at or after `from`; returns 1 with
 * [*ms, *me), 0 when none, < 0 on a matching error. */
int tok_regex_find(tide_tokenizer *t, const tok_regex *re, const uint8_t *s, size_t n, size_t from, size_t *ms,
                   size_t *me);

/* tok_encode.c */
void *tok_arena_alloc(tok_arena *a, size_t n);
void tok_arena_reset(tok_arena *a);
void tok_arena_free(tok_arena *a);
/* Runs the normalizer steps over s; *out may be s itself when nothing changed. */
tide_status tok_normalize(tide_tokenizer *t, const uint8_t *s, size_t n, const uint8_t **out, size_t *out_n);
/* Builds pass's index over the added tokens that belong to it. */
int tok_added_pass_build(tide_tokenizer *t, tok_added_pass *pass, bool normalized);

/* The byte <-> character table of byte-level BPE (GPT-2's): the code point
 * standing for each byte. */
uint32_t tok_byte_char(uint8_t b);
/* The byte a code point stands for, or -1. */
int tok_char_byte(uint32_t c);
/* The bytes a byte-level vocabulary entry s spells, into out (room for
 * strlen(s)); returns their count, or -1 when a character is not in the table. */
long tok_bytelevel_bytes(const char *s, uint8_t *out);

/* tok_load.c: a tokenizer with its scratch and nothing loaded (path: the
 * file messages name); a tokenizer.json tree into t (explicit_ids: added
 * tokens keep the ids the tree gives them, as tok_gguf.c's trees need). */
tide_status tok_new(tide_ctx *ctx, const char *path, tide_tokenizer **out);
tide_status tok_load_tree(tide_tokenizer *t, const cJSON *root, bool explicit_ids);

/* tok_gguf.c: the tokenizer of a .gguf file's metadata (tok_gguf.h). */
tide_status tok_gguf_open(tide_ctx *ctx, const char *path, tide_tokenizer **out);

/* tok_config.c: a JSON object file into *out (optional: a missing file gives
 * TIDE_OK and NULL); messages name the path. */
tide_status tok_read_json(tide_ctx *ctx, const char *path, uint64_t max, bool optional, cJSON **out);
/* BOS, EOS and stop ids from the config files in dir. */
tide_status tok_read_configs(tide_tokenizer *t, const char *dir);

#endif
