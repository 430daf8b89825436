/*
 * file.c - whole files: reading a small one (configs, indexes, profiles,
 * plans), and writing one so that its path never holds a part of it (configs,
 * profiles, plans, traces, SVGs): through a temporary file beside it, renamed
 * over it when complete (see core.h).
 */
#include "core/core.h"

#include <errno.h>
#include <stdio.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

tide_status tide_read_text_file(tide_ctx *ctx, const char *path, uint64_t max_bytes, char **out,
                                size_t *len) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return tide_err(ctx, errno == ENOENT ? TIDE_E_NOT_FOUND : TIDE_E_IO, "%s: cannot open: %s", path,
                        strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return tide_err(ctx, TIDE_E_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return tide_err(ctx, TIDE_E_IO, "%s: not a regular file", path);
    }
    if (max_bytes && (uint64_t)st.st_size > max_bytes) {
        close(fd);
        return tide_err(ctx, TIDE_E_FORMAT, "%s: %lld bytes, too large (at most %llu)", path,
                        (long long)st.st_size, (unsigned long long)max_bytes);
    }
    size_t n = (size_t)st.st_size, got = 0;
    char *buf = tide_malloc(n + 1);
    if (!buf) {
        close(fd);
        return tide_err(ctx, TIDE_E_NOMEM, "%s: out of memory reading it", path);
    }
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            int e = r < 0 ? errno : 0;
            close(fd);
            tide_free(buf);
            return tide_err(ctx, TIDE_E_IO, "%s: read failed: %s", path,
                            e ? strerror(e) : "file shrank while reading");
        }
        got += (size_t)r;
    }
    close(fd);
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return TIDE_OK;
}

/* A buffer big enough that streams of millions of lines (plans, traces) cost
 * few write calls; optional: without it stdio uses its own. */
#define ATOMIC_FILE_BUF ((size_t)1 << 20)

static tide_status file_begin(tide_ctx *ctx, const char *what, const char *path, tide_atomic_file *f,
                              size_t bufsize) {
    static _Atomic unsigned counter;
    f->ctx = ctx;
    f->what = what ? what : "file";
    f->path = path;
    f->fp = NULL;
    f->buf = NULL;
    f->tmp[0] = '\0';
    if (!path || !*path) return tide_err(ctx, TIDE_E_INVALID, "%s: no path given", f->what);
    /* O_EXCL: a name left by a crashed run with the same pid is skipped, never
     * truncated under another writer. */
    int fd = -1, e = 0;
    for (int tries = 0; fd < 0 && tries < 16; tries++) {
        if (snprintf(f->tmp, sizeof f->tmp, "%s.tmp.%ld.%u", path, (long)getpid(), counter++) >=
            (int)sizeof f->tmp)
            return tide_err(ctx, TIDE_E_INVALID, "%s '%s': path too long", f->what, path);
        fd = open(f->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        e = fd < 0 ? errno : 0;
        if (fd < 0 && e != EEXIST) break;
    }
    if (fd < 0)
        return tide_err(ctx, TIDE_E_IO, "%s '%s': cannot create '%s': %s", f->what, path, f->tmp, strerror(e));
    f->fp = fdopen(fd, "w");
    if (!f->fp) {
        e = errno;
        close(fd);
        unlink(f->tmp);
        return tide_err(ctx, TIDE_E_IO, "%s '%s': cannot create '%s': %s", f->what, path, f->tmp, strerror(e));
    }
    if (bufsize && (f->buf = tide_malloc(bufsize))) setvbuf(f->fp, f->buf, _IOFBF, bufsize);
    return TIDE_OK;
}

tide_status tide_file_begin(tide_ctx *ctx, const char *what, const char *path, tide_atomic_file *f) {
    return file_begin(ctx, what, path, f, ATOMIC_FILE_BUF);
}

tide_status tide_file_commit(tide_atomic_file *f) {
    if (!f->fp) return tide_err(f->ctx, TIDE_E_INVALID, "%s '%s': not open for writing", f->what, f->path);
    FILE *fp = f->fp;
    f->fp = NULL;
    /* An error while streaming leaves ferror set and its errno behind; the
     * final flush usually fails again with the same cause. */
    int e = 0;
    if (fflush(fp) != 0 || ferror(fp)) e = errno ? errno : EIO;
    if (!e && fsync(fileno(fp)) != 0) e = errno;
    if (fclose(fp) != 0 && !e) e = errno;
    tide_free(f->buf);
    f->buf = NULL;
    if (e) {
        unlink(f->tmp);
        return tide_err(f->ctx, TIDE_E_IO, "%s '%s': write failed: %s", f->what, f->path, strerror(e));
    }
    if (rename(f->tmp, f->path) != 0) {
        e = errno;
        unlink(f->tmp);
        return tide_err(f->ctx, TIDE_E_IO, "%s '%s': cannot rename '%s' over it: %s", f->what, f->path,
                        f->tmp, strerror(e));
    }
    /* Make the rename durable. The temporary's name, cut at its last '/', is
     * the directory (it was made beside path). */
    char *slash = strrchr(f->tmp, '/');
    const char *dir = ".";
    if (slash == f->tmp) dir = "/";
    else if (slash) {
        *slash = '\0';
        dir = f->tmp;
    }
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        (void)fsync(dfd);
        close(dfd);
    }
    return TIDE_OK;
}

void tide_file_abort(tide_atomic_file *f) {
    if (!f->fp) return;
    int saved = errno;
    fclose(f->fp);
    f->fp = NULL;
    unlink(f->tmp);
    tide_free(f->buf);
    f->buf = NULL;
    errno = saved;
}

tide_status tide_write_file_atomic(tide_ctx *ctx, const char *what, const char *path, const void *buf,
                                   size_t n) {
    tide_atomic_file f;
    /* One fwrite of the whole buffer: stdio hands large writes straight to
     * write(2), so no buffer of our own. */
    tide_status st = file_begin(ctx, what, path, &f, 0);
    if (st) return st;
    if (n) fwrite(buf, 1, n, f.fp); /* a short write leaves ferror set: commit reports it */
    return tide_file_commit(&f);
}

uint64_t tide_host_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    unsigned long long kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
    if (f) fclose(f);
    if (kb) return (uint64_t)kb * 1024;
    long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
}
