/*
 * gguf_write.h - writes GGUF version 3 files (ggml's model format, the one
 * llama.cpp reads): a header of key-value metadata and tensor descriptions,
 * then the tensor data, each tensor's data at a multiple of the alignment
 * (general.alignment, 32) from the start of the data section.
 *
 * Layout (all little-endian): "GGUF", u32 version 3, u64 tensor count, u64
 * key-value count; each pair a string key, a u32 value type and the value
 * (strings are a u64 length and the bytes, arrays a u32 element type, a u64
 * count and the elements); each tensor its name, u32 dimension count, u64
 * dimensions (innermost first: a row's length is dims[0]), u32 GGML type and
 * u64 offset into the data section; zero padding to the alignment; the data.
 *
 * Use: tide_gguf_new, the kv_* setters and tide_gguf_add_tensor in file order,
 * then tide_gguf_write with a callback that writes each tensor's bytes through
 * tide_gguf_put. The file is written to a temporary name and renamed when
 * whole (core.h's tide_atomic_file), so no partial file is left at the path.
 */
#ifndef TIDE_GGUF_WRITE_H
#define TIDE_GGUF_WRITE_H

#include "core/core.h"
#include "model/gguf.h" /* tide_gguf_type, and the reader copy_kv takes values from */

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#define TIDE_GGUF_ALIGNMENT 32

typedef struct tide_gguf_out tide_gguf_out;

/* NULL when memory is exhausted. */
tide_gguf_out *tide_gguf_new(void);
void tide_gguf_free(tide_gguf_out *g);

/* Metadata, in the order added. A failed allocation is remembered and
 * reported by tide_gguf_write (TIDE_E_NOMEM). */
void tide_gguf_kv_str(tide_gguf_out *g, const char *key, const char *val);
void tide_gguf_kv_u32(tide_gguf_out *g, const char *key, uint32_t val);
void tide_gguf_kv_i32(tide_gguf_out *g, const char *key, int32_t val);
void tide_gguf_kv_f32(tide_gguf_out *g, const char *key, float val);
void tide_gguf_kv_bool(tide_gguf_out *g, const char *key, bool val);
void tide_gguf_kv_str_array(tide_gguf_out *g, const char *key, const char *const *vals, const uint32_t *lens,
                            uint64_t n); /* lens NULL: strlen */
void tide_gguf_kv_f32_array(tide_gguf_out *g, const char *key, const float *vals, uint64_t n);
void tide_gguf_kv_i32_array(tide_gguf_out *g, const char *key, const int32_t *vals, uint64_t n);
/* A value of an open GGUF file (tide_gguf_kv, model/gguf.h), copied byte for
 * byte under key (arrays of any depth included). */
void tide_gguf_kv_copy(tide_gguf_out *g, const char *key, const tide_gguf_value *v);

/* Describes the next tensor: name, type, ndim dimensions innermost first
 * (GGUF's order: {row length, rows}). Returns its index, or -1 (remembered
 * as TIDE_E_INVALID / TIDE_E_NOMEM) for a type GGUF has no number for, rows
 * that are not whole blocks, or no memory. */
int tide_gguf_add_tensor(tide_gguf_out *g, const char *name, tide_dtype dt, int ndim, const int64_t *dims);
/* Bytes of tensor i's data. */
uint64_t tide_gguf_out_tensor_bytes(const tide_gguf_out *g, int i);
int tide_gguf_out_n_tensors(const tide_gguf_out *g);

/* Where a tensor's data goes: tide_gguf_put appends to the current tensor. */
typedef struct tide_gguf_sink tide_gguf_sink;
tide_status tide_gguf_put(tide_gguf_sink *s, const void *data, size_t n);

/* Writes tensor i's bytes (exactly tide_gguf_out_tensor_bytes(g, i)) through
 * tide_gguf_put; returns TIDE_OK or the error it recorded. */
typedef tide_status (*tide_gguf_data_fn)(void *user, int i, tide_gguf_sink *s);

/* Writes the file at path: header, then every tensor's data by data(user, i,
 * sink) in order. Returns TIDE_OK; TIDE_E_NOMEM, TIDE_E_INVALID (a tensor's
 * callback wrote more or fewer bytes than its size: named), TIDE_E_IO (the
 * file could not be created or written, e.g. a full disk: the cause named),
 * or the callback's error. On failure nothing is left at path (a file already
 * there keeps its contents). */
tide_status tide_gguf_write(tide_ctx *ctx, tide_gguf_out *g, const char *path, tide_gguf_data_fn data, void *user);

#endif
