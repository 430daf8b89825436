/*
 * clock_test.h - the test build's virtual clock (core/clock.c; only in the
 * objects compiled with TIDE_TEST_HOOKS, which the tests link).
 *
 * While the virtual clock is on, tide_now() returns its time: it starts at 0
 * for the process and moves only by tide_test_clock_advance, from any
 * thread. A test that measures through the library (an executor's run, a
 * trainer's step, a pool's request) then measures what it advanced, which
 * with the executor's run-timing hook (exec/exec_test.h) is what the test
 * said each run took.
 */
#ifndef TIDE_CLOCK_TEST_H
#define TIDE_CLOCK_TEST_H

#include <stdbool.h>

/* Puts the virtual clock in place of the monotonic one (true) or back
 * (false); its time is kept across. */
void tide_test_clock_fake(bool on);
/* Moves the virtual clock on by seconds (> 0; rounded to nanoseconds). */
void tide_test_clock_advance(double seconds);
/* The virtual clock's time in seconds. */
double tide_test_clock_now(void);

#endif
