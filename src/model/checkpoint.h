/*
 * checkpoint.h - the internal layout of an open checkpoint, for the modules
 * that read weights (the model loader, the SSD tier): which file holds each
 * tensor and where, so that a tensor can be read through the mapping or with
 * pread/O_DIRECT from its file extent.
 *
 * An open checkpoint keeps every safetensors file open (fd) and mapped
 * read-only for its whole life; a GGUF checkpoint (model/gguf_model.c) is
 * one file, kept open and mapped by its tide_gguf, its tensors under
 * Hugging Face names and shapes. Tensors are sorted by name (strcmp order);
 * tide_checkpoint_get_index(i) is the i-th tensor in that order. Every tensor
 * has been checked at open: known dtype, shape of at most TIDE_MAX_DIMS
 * non-negative dims, nbytes == numel * dtype size, extent inside its file's
 * data section and aligned to the element size, no overlap with another
 * tensor of the same file.
 */
#ifndef TIDE_CHECKPOINT_H
#define TIDE_CHECKPOINT_H

#include "core/core.h"

/* One safetensors file. */
typedef struct tide_ck_file {
    char *path;          /* dir + "/" + name, as opened */
    char *name;          /* file name inside the checkpoint directory */
    int fd;              /* open O_RDONLY for the checkpoint's life */
    const unsigned char *map; /* whole file mapped read-only */
    uint64_t size;       /* file size in bytes */
    uint64_t data_start; /* absolute offset of the data section: 8 + header length */
    bool borrowed;       /* fd and map belong to the checkpoint's tide_gguf */
} tide_ck_file;

/* One tensor. */
typedef struct tide_ck_tensor {
    char *name;
    tide_dtype dtype;
    int ndim;
    int64_t shape[TIDE_MAX_DIMS];
    uint64_t nbytes;
    uint64_t offset; /* absolute byte offset in files[file] */
    int file;        /* index into tide_checkpoint.files */
} tide_ck_tensor;

struct tide_checkpoint {
    tide_ctx *ctx;          /* the context it was opened with: errors of match() */
    char *dir;
    tide_llama_config cfg;  /* from dir/config.json */
    tide_ck_file *files;
    int n_files, cap_files;
    tide_ck_tensor *tensors; /* sorted by name */
    int n_tensors, cap_tensors;
    struct tide_gguf *gguf;  /* a GGUF checkpoint's file (metadata for others: the tokenizer) */
};

/* Opens a GGUF file as a checkpoint (model/gguf_model.c): config from its
 * metadata, tensors renamed and reshaped as Hugging Face's. The statuses of
 * tide_checkpoint_open. */
tide_status tide_checkpoint_open_gguf(tide_ctx *ctx, const char *path, tide_checkpoint **out);
/* ck's GGUF file, or NULL for a safetensors directory. */
static inline const struct tide_gguf *tide_checkpoint_gguf(const tide_checkpoint *ck) { return ck->gguf; }

/* Index of the tensor with this name (binary search), or -1. */
int tide_checkpoint_find(const tide_checkpoint *ck, const char *name);

/* The file holding tensor i. */
static inline const tide_ck_file *tide_checkpoint_tensor_file(const tide_checkpoint *ck, int i) {
    return &ck->files[ck->tensors[i].file];
}

/* Mapped bytes of tensor i (read-only). */
static inline const void *tide_checkpoint_tensor_data(const tide_checkpoint *ck, int i) {
    return ck->files[ck->tensors[i].file].map + ck->tensors[i].offset;
}

/* Alignment of the data section start in files written by
 * tide_checkpoint_make_synthetic: the JSON header is padded with spaces so
 * that the data section starts on a 4 KiB boundary, which makes whole-tensor
 * O_DIRECT reads aligned whenever tensor sizes are multiples of 4 KiB. Tensors
 * are packed without gaps, as the safetensors reference implementation
 * requires; other writers' files may start their data section anywhere. */
#define TIDE_CK_DATA_ALIGN 4096

#endif
