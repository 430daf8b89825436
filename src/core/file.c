/*
 * file.c - reading a whole small file (configs, indexes, profiles, plans).
 */
#include "core/core.h"

#include <errno.h>
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
