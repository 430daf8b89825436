/*
 * st_file.h - the safetensors format, read and written in one place: the
 * model loader (model/safetensors.c), the training checkpoint's optimizer
 * reader and writer (train/save.c) and the synthetic checkpoint writer
 * (model/synthetic.c) all go through it.
 *
 * A file: 8-byte little-endian header length N, N bytes of JSON
 *   {"NAME": {"dtype": "F32", "shape": [d0, ...], "data_offsets": [b, e]},
 *    ..., "__metadata__": {"KEY": "VALUE", ...}}
 * then the data section; a tensor's bytes are [b, e) of it. Written here:
 * the metadata first, the tensors packed in the order given, the JSON
 * padded with spaces so the data section starts at TIDE_ST_DATA_ALIGN.
 */
#ifndef TIDE_ST_FILE_H
#define TIDE_ST_FILE_H

#include "core/core.h"

#include <cjson/cJSON.h>
#include <stdint.h>

#define TIDE_ST_HEADER_MAX (100u << 20) /* the reference implementation's limit */
#define TIDE_ST_DATA_ALIGN 4096         /* where the written data sections start */

/* ---------------------------------------------------------------- reading */

/* An open safetensors file: mapped whole, its header parsed. */
typedef struct tide_st_file {
    int fd;                   /* O_RDONLY; -1 once the caller closed it */
    const unsigned char *map; /* the whole file, read-only */
    uint64_t size;            /* its bytes */
    uint64_t data_start;      /* the data section's offset: 8 + header length */
    cJSON *header;            /* the header's object (owned; NULL once dropped) */
} tide_st_file;

/* Opens, maps and parses path: a regular file, its header length inside
 * the file and within TIDE_ST_HEADER_MAX, its header one JSON object (and
 * whitespace), "__metadata__" an object where present. Returns TIDE_OK;
 * TIDE_E_NOT_FOUND (no file), TIDE_E_IO (open, stat, map), TIDE_E_FORMAT
 * (truncated, not a safetensors file), TIDE_E_NOMEM; each message names the
 * path. On failure *f holds nothing (fd -1). */
tide_status tide_st_open(tide_ctx *ctx, const char *path, tide_st_file *f);
/* Unmaps, closes and frees what f holds (a zeroed or failed f: nothing). */
void tide_st_close(tide_st_file *f);

/* One tensor of a header, checked. */
typedef struct tide_st_tensor {
    tide_dtype dtype;
    int ndim;
    int64_t shape[TIDE_MAX_DIMS];
    uint64_t offset;          /* in the file: data_start + b */
    uint64_t nbytes;          /* e - b = its elements x element size */
} tide_st_tensor;

/* Header entry e of f (path names it in errors): an object with a dtype
 * (BF16, F16, F32, I32), a shape of at most TIDE_MAX_DIMS non-negative
 * integers and data_offsets [b, e] inside the data section, e - b its
 * bytes, its data aligned to its element size. TIDE_OK or TIDE_E_FORMAT
 * naming the path, the tensor and the problem. */
tide_status tide_st_tensor_read(tide_ctx *ctx, const char *path, const tide_st_file *f, const cJSON *e,
                                tide_st_tensor *t);

/* Parses JSON that must be an object followed only by whitespace. Returns
 * NULL and a description of the problem in why. */
cJSON *tide_st_parse_object(const char *text, size_t len, char *why, size_t why_n);
/* A non-negative integer that a JSON number holds exactly, into *v. */
bool tide_st_json_u64(const cJSON *it, uint64_t *v);

/* "(a, b)" into buf. */
const char *tide_st_shape_str(char *buf, size_t n, int ndim, const int64_t *shape);

/* ---------------------------------------------------------------- writing */

typedef struct tide_st_entry {
    const char *name;  /* unique, not "__metadata__" */
    tide_dtype dtype;  /* written as F32, F16, BF16 or I32 */
    int ndim;          /* 0..TIDE_MAX_DIMS */
    int64_t shape[TIDE_MAX_DIMS];
} tide_st_entry;

/* One "__metadata__" pair (safetensors metadata values are strings). */
typedef struct tide_st_meta {
    const char *key, *value;
} tide_st_meta;

/* The header of a file of these entries and metadata pairs (for path, in
 * errors) into h: length, JSON, padding; nbytes[i] the bytes of entry i.
 * TIDE_OK; TIDE_E_INVALID (no name, duplicate, bad dtype or shape, NULL
 * metadata, a header over TIDE_ST_HEADER_MAX); TIDE_E_NOMEM. h is the
 * caller's to free either way. */
tide_status tide_st_header(tide_ctx *ctx, const char *path, const tide_st_entry *e, int n, const tide_st_meta *meta,
                           int n_meta, tide_strbuf *h, uint64_t *nbytes);

/* Produces elements [elem0, elem0 + n) of entry i, in the entry's dtype, at
 * dst. Called in file order: entries in order, each in increasing chunks of
 * at most TIDE_ST_CHUNK bytes. Returns TIDE_OK, or a status with its message
 * recorded on the writer's ctx (the writer adds the path and tensor). */
typedef tide_status (*tide_st_fill_fn)(void *user, int i, uint64_t elem0, uint64_t n, void *dst);

#define TIDE_ST_CHUNK ((uint64_t)4 << 20)

/* Writes a safetensors file at path, whole or not at all (tide_file_begin /
 * commit: a temporary beside it, fsynced, renamed over path). Returns TIDE_OK;
 * TIDE_E_INVALID (a bad entry: no name, duplicate, bad dtype or shape; a NULL
 * argument); the fill's status, prefixed with the path and the tensor; TIDE_E_IO
 * naming the path and the system's cause (ENOSPC, EFBIG, EIO ...); TIDE_E_NOMEM.
 * On failure the temporary is removed and path holds what it held before. */
tide_status tide_safetensors_write(tide_ctx *ctx, const char *path, const tide_st_entry *entries, int n_entries,
                                   const tide_st_meta *meta, int n_meta, tide_st_fill_fn fill, void *user);

#endif
