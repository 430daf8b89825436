/*
 * fuzz_util.h - what the libFuzzer targets (fuzz/fuzz_*.c) share: a scratch
 * directory of the process's own in /dev/shm (else $TMPDIR or /tmp) for the
 * parsers that take a path, and writing the input into a file there.
 */
#ifndef TIDE_FUZZ_UTIL_H
#define TIDE_FUZZ_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The process's scratch directory, made on first use (scripts/fuzz.sh
 * removes the whole run's tree). */
static const char *fuzz_dir(void) {
    static char dir[256];
    if (!dir[0]) {
        const char *base = getenv("TIDE_FUZZ_DIR") ? getenv("TIDE_FUZZ_DIR")
                           : access("/dev/shm", W_OK) == 0 ? "/dev/shm" : (getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
        snprintf(dir, sizeof dir, "%s/tide-fuzz-%d", base, (int)getpid());
        if (mkdir(dir, 0700) != 0 && access(dir, W_OK) != 0) abort();
    }
    return dir;
}

/* Writes data[0..n) to fuzz_dir()/name; returns the path (a static buffer
 * per call site is the caller's: copied into out). */
static void fuzz_write(const char *name, const uint8_t *data, size_t n, char *out, size_t cap) {
    snprintf(out, cap, "%s/%s", fuzz_dir(), name);
    FILE *f = fopen(out, "wb");
    if (!f) abort();
    if (n && fwrite(data, 1, n, f) != n) abort();
    if (fclose(f) != 0) abort();
}

#endif
