/*
 * ssd_test.h - the test build's fault injection of the SSD store (only in the
 * objects compiled with TIDE_TEST_HOOKS, which the tests link; the shipped
 * library has none of it: tests/cli_hooks.sh checks).
 *
 * Requests are counted per store since open: each request a read
 * (tide_ssd_read or tide_ssd_read_file) or a write is split into counts once,
 * retries excluded; a call of at most stripe_bytes inside one stripe unit is
 * one request.
 */
#ifndef TIDE_SSD_TEST_H
#define TIDE_SSD_TEST_H

#include <stdbool.h>

typedef struct tide_ssd_faults {
    long fail_read_nth;       /* the Nth read request completes with EIO (0: never) */
    long fail_write_nth;      /* the Nth write request completes with EIO (0: never) */
    long short_nth;           /* the Nth request (reads and writes together) is issued
                                 for half its length, so it completes short */
    long eagain_nth;          /* the Nth request (reads and writes together) is
                                 reported as EAGAIN once, after it ran */
    int fallocate_enospc_dir; /* 1-based index of the directory whose fallocate
                                 fails with ENOSPC (0: none) */
    bool refuse_direct;       /* behave as if every directory refused O_DIRECT */
} tide_ssd_faults;

/* Sets the faults of every store opened from now on (a copy; NULL: none),
 * the executor's spill store included. Not while another thread opens one. */
void tide_ssd_test_set_faults(const tide_ssd_faults *f);

#endif
