/*
 * clock.c - the library's one clock: every measured time of tide (an
 * executor's run and its timeline, a step's or a request's wall time, the
 * probe's deadlines, plan_seconds) is a difference of tide_now().
 *
 * A test build (TIDE_TEST_HOOKS, the objects the tests link; the shipped
 * library has none of it) can put a virtual clock in its place
 * (core/clock_test.h), as SQLite's test build fakes the current time: while
 * it is on, tide_now() returns a count of nanoseconds that moves only when a
 * test advances it, so that a test deciding on measured times decides on the
 * times it chose. Nanoseconds in an integer: advances from several threads
 * add up to the same sum in any order.
 */
#include "core/core.h"

#include <time.h>

#ifdef TIDE_TEST_HOOKS
#include "core/clock_test.h"

#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>

static atomic_bool fake_on;
static atomic_llong fake_ns;

void tide_test_clock_fake(bool on) { atomic_store(&fake_on, on); }

void tide_test_clock_advance(double seconds) {
    if (seconds > 0) atomic_fetch_add(&fake_ns, (long long)llround(seconds * 1e9));
}

double tide_test_clock_now(void) { return (double)atomic_load(&fake_ns) * 1e-9; }
#endif

double tide_now(void) {
#ifdef TIDE_TEST_HOOKS
    if (atomic_load(&fake_on)) return tide_test_clock_now();
#endif
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
