/*
 * exec_test.h - the test build's run-timing hook of the executor (only in the
 * objects compiled with TIDE_TEST_HOOKS, which the tests link).
 *
 * With a hook set, every successful tide_exec_run of any executor calls it
 * once on the run's calling thread, after the run and after its timeline was
 * read: p the run's plan, timeline its measured timeline (one event per
 * instruction, in instruction order; NULL where the run was asked for none),
 * *wall_s its measured wall time. The hook may rewrite both; the run reports
 * what it leaves (tide_exec_stats.wall_s, the timeline). A test puts recorded
 * or injected timings there (the plan's simulated schedule on a profile the
 * test chose, say), and with the virtual clock (core/clock_test.h) advanced
 * by the same wall time, whatever measures the run around it measures that.
 */
#ifndef TIDE_EXEC_TEST_H
#define TIDE_EXEC_TEST_H

#include "ir/plan.h"

typedef void (*tide_exec_test_timing_fn)(void *user, const tide_plan *p, tide_sim_event *timeline, double *wall_s);

/* Sets the hook (NULL: none) and its user pointer; not while a run is in
 * progress. */
void tide_exec_test_set_timing(tide_exec_test_timing_fn fn, void *user);

#endif
