/*
 * core.h - internals shared by every part of libtide: the context, error
 * reporting, allocation hooks and small utilities.
 *
 * Errors: a failing function records its cause with tide_err() on the context
 * it was given and returns the status; callers pass the status up unchanged, so
 * the first (most specific) message survives. tide_err() returns its status so
 * that `return tide_err(ctx, TIDE_E_IO, "...")` reads as one statement.
 *
 * Allocation: every allocation of the library goes through tide_malloc /
 * tide_calloc / tide_realloc / tide_free, which count bytes and can be told to
 * fail the Nth call (fault-injection tests).
 */
#ifndef TIDE_CORE_H
#define TIDE_CORE_H

#include "tide.h"

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>

#define TIDE_ERRMSG_MAX 1024

/* How many members the public enums have: include/tide.h leaves these out,
 * since they grow with each member added (an array sized by them in a
 * program would change size with the library). */
#define TIDE_DTYPE_COUNT (TIDE_Q6_K + 1)
#define TIDE_ROLE_COUNT (TIDE_ROLE_TEMP + 1)
#define TIDE_TRAIN_CLASS_COUNT (TIDE_TRAIN_INPUT + 1)

struct tide_ctx {
    tide_status last_status;
    char last_error[TIDE_ERRMSG_MAX];
    int n_threads;   /* tide_ctx_set_threads (0: the default) */
    int default_threads; /* TIDE_THREADS, else the online cores: read once, by tide_ctx_new */
    tide_progress_fn progress;
    void *progress_user;
};

/* Records status and a printf-style message on ctx (ctx may be NULL); returns
 * status. */
tide_status tide_err(tide_ctx *ctx, tide_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The check of an option struct's size field (src/core/opts.c): TIDE_OK for
 * 0 or `want` (sizeof the struct), else TIDE_E_INVALID naming `type`. */
tide_status tide_opts_size(tide_ctx *ctx, const char *type, size_t got, size_t want);
#define TIDE_OPTS_SIZE(ctx, type, o) ((o) ? tide_opts_size((ctx), #type, (o)->size, sizeof(type)) : TIDE_OK)
/* Returns the refusal from the enclosing function (o may be NULL). */
#define TIDE_OPTS_SIZE_CHECK(ctx, type, o)                  \
    do {                                                    \
        tide_status size_st_ = TIDE_OPTS_SIZE(ctx, type, o); \
        if (size_st_) return size_st_;                      \
    } while (0)
/* Clears the last error. */
void tide_err_clear(tide_ctx *ctx);
void tide_progress(tide_ctx *ctx, const char *what, uint64_t done, uint64_t total);

/* Allocation hooks. tide_malloc(0) returns a unique non-NULL pointer. */
void *tide_malloc(size_t n);
void *tide_calloc(size_t count, size_t size);
void *tide_realloc(void *p, size_t n);
void tide_free(void *p);
char *tide_strdup(const char *s);
/* 64-byte aligned allocation (free with tide_free_aligned). alignment must be a
 * power of two >= sizeof(void*). */
void *tide_malloc_aligned(size_t n, size_t alignment);
void tide_free_aligned(void *p);

/* Reads the whole regular file at path into a NUL-terminated buffer (free it
 * with tide_free); max_bytes (0: no limit) bounds its size. Messages start
 * with the path. Returns TIDE_OK, TIDE_E_NOT_FOUND, TIDE_E_IO, TIDE_E_FORMAT
 * (larger than max_bytes) or TIDE_E_NOMEM. */
tide_status tide_read_text_file(tide_ctx *ctx, const char *path, uint64_t max_bytes, char **out,
                                size_t *len);

/* Writing a whole file so that its path holds either the old file or the
 * whole new one, never a part: the bytes go to a temporary file beside path
 * (same directory, so the rename cannot cross file systems), which is flushed
 * to disk and renamed over path only when complete; a failure on any step
 * removes the temporary. Messages read "<what> '<path>': <cause>".
 *
 *   tide_atomic_file af;
 *   if ((st = tide_file_begin(ctx, "trace", path, &af))) return st;
 *   fprintf(af.fp, ...);                  // any stdio output into af.fp
 *   if (failed) { tide_file_abort(&af); return ...; }
 *   return tide_file_commit(&af);
 */
typedef struct tide_atomic_file {
    tide_ctx *ctx;
    const char *what; /* "plan file", "trace", ...: names the file in messages */
    const char *path; /* the caller's string; must outlive the commit */
    FILE *fp;         /* stream into this; NULL once committed or aborted */
    char *buf;        /* the stream's buffer (NULL: stdio's default) */
    char tmp[PATH_MAX];
} tide_atomic_file;

/* Creates the temporary file "<path>.tmp.<pid>.<n>" (O_EXCL, mode 0644 less
 * the umask) and opens f->fp on it with a 1 MiB buffer when one can be had.
 * Returns TIDE_OK, TIDE_E_INVALID (no path, or too long) or TIDE_E_IO
 * ("cannot create" with the cause); on failure nothing is left on disk and
 * f->fp is NULL, so tide_file_abort(f) is a no-op. */
tide_status tide_file_begin(tide_ctx *ctx, const char *what, const char *path, tide_atomic_file *f);
/* Flushes f->fp, checks it for earlier write errors, fsyncs and closes the
 * temporary, renames it over the path and fsyncs the directory (best effort:
 * the file is whole either way). Returns TIDE_OK or TIDE_E_IO ("write failed"
 * or "cannot rename", with the cause); on failure the temporary is removed and
 * the path keeps what it held before. f->fp is NULL afterwards either way. */
tide_status tide_file_commit(tide_atomic_file *f);
/* Closes and removes the temporary; records no error (the caller reports its
 * own cause). A no-op when f->fp is NULL. */
void tide_file_abort(tide_atomic_file *f);
/* The whole of buf[0..n) written to path through tide_file_begin/commit.
 * Returns what they return. */
tide_status tide_write_file_atomic(tide_ctx *ctx, const char *what, const char *path, const void *buf,
                                   size_t n);

/* Monotonic wall clock in seconds. */
double tide_now(void);
/* Bytes of host memory available now (MemAvailable, else the free pages),
 * 0 when unknown. */
uint64_t tide_host_available(void);

/* Allocation of the graph arrays: grows *arr (elements of size elem) to hold at
 * least need elements; returns 0 or -1 when memory is exhausted. */
int tide_grow(void **arr, int *cap, int need, size_t elem);

/* Conversions between storage dtypes and f32. */
float tide_bf16_to_f32(uint16_t h);
uint16_t tide_f32_to_bf16(float f); /* round to nearest even; NaN kept NaN */
float tide_f16_to_f32(uint16_t h);
uint16_t tide_f32_to_f16(float f);  /* round to nearest even */
/* dst[i] = (float)src[i] for n elements of dtype dt (f32, f16, bf16). */
void tide_convert_to_f32(const void *src, tide_dtype dt, float *dst, size_t n);

/* A text buffer grown by tide_strbuf_add / tide_strbuf_printf
 * (tide_realloc; free p with tide_free), p[len] always NUL once anything was
 * added. A failed allocation or format sets oom and stops appending, the
 * text so far kept; start from {0}. */
typedef struct tide_strbuf {
    char *p;
    size_t len, cap;
    bool oom;
} tide_strbuf;
void tide_strbuf_add(tide_strbuf *b, const char *s, size_t n);
void tide_strbuf_printf(tide_strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define TIDE_MIN(a, b) ((a) < (b) ? (a) : (b))
#define TIDE_MAX(a, b) ((a) > (b) ? (a) : (b))

#endif
