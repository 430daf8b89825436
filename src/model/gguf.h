/*
 * gguf.h - the GGUF file format (llama.cpp's single-file checkpoints), read:
 * the header, every metadata value, the tensor table, each tensor's data in
 * the read-only mapping. Used by the checkpoint loader (model/gguf_model.c)
 * and by anything else that reads GGUF metadata (the tokenizer, the
 * quantizer's tests).
 *
 * A file, little-endian throughout (versions 2 and 3; version 1 had 32-bit
 * counts and is refused):
 *   u32 magic "GGUF"; u32 version; u64 n_tensors; u64 n_kv;
 *   n_kv x { string key; u32 type; value }
 *   n_tensors x { string name; u32 n_dims; u64 ne[n_dims]; u32 ggml_type; u64 offset }
 *   padding to general.alignment (a u32 key, default 32); the data section.
 * A string is u64 length + bytes (no terminator); an array is u32 element type
 * + u64 count + the elements (arrays of arrays nest). A tensor's ne[0] is its
 * innermost dimension (the row length); offset is relative to the data
 * section and a multiple of the alignment.
 *
 * tide_gguf_open checks everything before it returns: each length, count,
 * offset, type and shape against the file's size (no read outside the file;
 * arithmetic that cannot overflow), keys and tensor names non-empty, without
 * NUL bytes and unique, the alignment a power of two, every tensor of a type
 * tide maps (F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K), of 1 to 4 dims, its
 * row (ne[0]) whole blocks of its type, its data inside the file, aligned,
 * overlapping no other tensor's. After that every accessor below is a plain
 * read of checked bytes; the values' getters check only types.
 *
 * Failures are TIDE_E_NOT_FOUND (no file), TIDE_E_IO (open, stat, map),
 * TIDE_E_FORMAT (a damaged or non-GGUF file), TIDE_E_UNSUPPORTED (a valid file
 * with a tensor type tide does not map), TIDE_E_NOMEM, each with a message on
 * the context naming the path, the key or tensor and the problem.
 */
#ifndef TIDE_GGUF_H
#define TIDE_GGUF_H

#include "core/core.h"

#include <stdbool.h>
#include <stdint.h>

#define TIDE_GGUF_MAGIC 0x46554747u /* "GGUF" read as a little-endian u32 */
#define TIDE_GGUF_DEFAULT_ALIGNMENT 32
#define TIDE_GGUF_MAX_DIMS 4        /* ggml's limit */
#define TIDE_GGUF_MAX_DEPTH 8       /* arrays nested deeper are refused */

/* Metadata value types, as numbered in the file. */
typedef enum tide_gguf_type {
    TIDE_GGUF_U8 = 0,
    TIDE_GGUF_I8 = 1,
    TIDE_GGUF_U16 = 2,
    TIDE_GGUF_I16 = 3,
    TIDE_GGUF_U32 = 4,
    TIDE_GGUF_I32 = 5,
    TIDE_GGUF_F32 = 6,
    TIDE_GGUF_BOOL = 7,
    TIDE_GGUF_STRING = 8,
    TIDE_GGUF_ARRAY = 9,
    TIDE_GGUF_U64 = 10,
    TIDE_GGUF_I64 = 11,
    TIDE_GGUF_F64 = 12,
    TIDE_GGUF_TYPE_COUNT
} tide_gguf_type;

/* ggml tensor types tide maps to a tide_dtype. */
enum {
    TIDE_GGML_F32 = 0,
    TIDE_GGML_F16 = 1,
    TIDE_GGML_Q4_0 = 2,
    TIDE_GGML_Q8_0 = 8,
    TIDE_GGML_Q4_K = 12,
    TIDE_GGML_Q5_K = 13,
    TIDE_GGML_Q6_K = 14,
    TIDE_GGML_BF16 = 30,
};

typedef struct tide_gguf tide_gguf;

/* A metadata value: a key's, or an element of an array. Valid while its file
 * is open. Read it with the tide_gguf_value_* getters. */
typedef struct tide_gguf_value {
    const tide_gguf *g;
    tide_gguf_type type;
    tide_gguf_type elem_type; /* arrays: the elements' type */
    uint64_t n;               /* arrays: element count; strings: byte length */
    uint64_t off;             /* file offset of the payload: the scalar, the
                                 string's bytes, an array's first element */
    const void *elems;        /* internal: arrays of strings or of arrays index
                                 their elements here; else NULL */
} tide_gguf_value;

/* One tensor as the file describes it. */
typedef struct tide_gguf_tensor {
    const char *name;      /* NUL-terminated copy */
    int n_dims;            /* 1..TIDE_GGUF_MAX_DIMS */
    uint64_t ne[TIDE_GGUF_MAX_DIMS]; /* ggml order: ne[0] the row length; 1 past n_dims */
    uint32_t ggml_type;
    tide_dtype dtype;      /* ggml_type as a tide dtype */
    uint64_t offset;       /* as in the file: from the data section's start */
    uint64_t file_offset;  /* absolute: data_start + offset */
    uint64_t nbytes;
} tide_gguf_tensor;

/* Opens, maps and checks path (see the top of this file). *out is NULL on
 * failure. ctx receives later getters' errors too. */
tide_status tide_gguf_open(tide_ctx *ctx, const char *path, tide_gguf **out);
/* Unmaps and frees (NULL: nothing). Values and tensors of g die with it. */
void tide_gguf_close(tide_gguf *g);

const char *tide_gguf_path(const tide_gguf *g);
uint32_t tide_gguf_version(const tide_gguf *g);
uint64_t tide_gguf_alignment(const tide_gguf *g);
uint64_t tide_gguf_data_start(const tide_gguf *g); /* absolute offset of the data section */
uint64_t tide_gguf_size(const tide_gguf *g);       /* file bytes */
const unsigned char *tide_gguf_map(const tide_gguf *g); /* the whole file, read-only */
int tide_gguf_fd(const tide_gguf *g);              /* O_RDONLY, open while g is */

/* "u8", "i8", ..., "string", "array", "u64", "i64", "f64"; "?" otherwise. */
const char *tide_gguf_type_name(uint32_t type);
/* ggml's name of a tensor type ("f32", "q4_1", "iq2_xs", ...); "?" if unknown. */
const char *tide_gguf_ggml_type_name(uint32_t ggml_type);

/* ---------------------------------------------------------------- metadata */

int64_t tide_gguf_n_kv(const tide_gguf *g);
/* The i-th key in file order (NUL-terminated) and its value; false if i is
 * out of range. */
bool tide_gguf_kv(const tide_gguf *g, int64_t i, const char **key, tide_gguf_value *v);
/* The key's index, or -1. */
int64_t tide_gguf_find_key(const tide_gguf *g, const char *key);
/* The key's value into *v; false (nothing recorded) when absent. */
bool tide_gguf_get(const tide_gguf *g, const char *key, tide_gguf_value *v);

/* Value getters: false when the value is not of a fitting type (or, for the
 * integers, out of range of the result). */
/* Any integer type (u8..u64, i8..i64); a u64 above INT64_MAX is false. */
bool tide_gguf_value_int(const tide_gguf_value *v, int64_t *out);
/* f32 or f64. */
bool tide_gguf_value_float(const tide_gguf_value *v, double *out);
bool tide_gguf_value_bool(const tide_gguf_value *v, bool *out);
/* A string's bytes in the mapping (not NUL-terminated; may hold NULs). */
bool tide_gguf_value_str(const tide_gguf_value *v, const char **s, uint64_t *len);
/* An array's length and element type. */
bool tide_gguf_value_array(const tide_gguf_value *v, uint64_t *n, tide_gguf_type *elem_type);
/* Element i of an array (any element type, arrays included). */
bool tide_gguf_value_elem(const tide_gguf_value *v, uint64_t i, tide_gguf_value *out);

/* Getters by key, recording an error on the context when they fail:
 * TIDE_E_NOT_FOUND "PATH: no key 'K'" when absent, TIDE_E_FORMAT
 * "PATH: key 'K' is TYPE, expected ..." when of another type or out of range.
 * str_dup returns a NUL-terminated copy (tide_free it); a string holding a
 * NUL byte is TIDE_E_FORMAT there. */
tide_status tide_gguf_get_int(const tide_gguf *g, const char *key, int64_t *out);
tide_status tide_gguf_get_float(const tide_gguf *g, const char *key, double *out);
tide_status tide_gguf_get_bool(const tide_gguf *g, const char *key, bool *out);
tide_status tide_gguf_get_str(const tide_gguf *g, const char *key, const char **s, uint64_t *len);
tide_status tide_gguf_get_str_dup(const tide_gguf *g, const char *key, char **out);
/* An array: its value (for tide_gguf_value_elem), length and element type. */
tide_status tide_gguf_get_array(const tide_gguf *g, const char *key, tide_gguf_value *arr);

/* ---------------------------------------------------------------- tensors */

int64_t tide_gguf_n_tensors(const tide_gguf *g);
/* The i-th tensor in file order; NULL when out of range. */
const tide_gguf_tensor *tide_gguf_tensor_at(const tide_gguf *g, int64_t i);
/* The tensor's index, or -1. */
int64_t tide_gguf_find_tensor(const tide_gguf *g, const char *name);
/* A tensor's bytes in the mapping. */
const void *tide_gguf_tensor_data(const tide_gguf *g, const tide_gguf_tensor *t);

#endif
