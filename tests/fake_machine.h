/*
 * fake_machine.h - a machine whose timings a test chooses (tests only: the
 * test build's virtual clock, core/clock_test.h, and the executor's
 * run-timing hook, exec/exec_test.h).
 *
 * While a fake machine is on, every executor run "measures" the plan's
 * simulated schedule on the fake machine's profile (tide_simulate): each
 * instruction's start and end are the simulator's, the run's wall time is the
 * simulated makespan, and the virtual clock advances by it, so that a step's
 * or a request's measured time around the run (tide_now differences) is that
 * makespan too. What a refit, a drift or a replan decides on is then a
 * function of the profiles the test chose, not of the machine's load; the
 * computation itself still runs for real (its results are checked as ever).
 *
 * Each run's simulated makespan is recorded (the first FAKE_MAX_RUNS), so a
 * test can compare what the library measured with what it was given.
 */
#ifndef TIDE_TEST_FAKE_MACHINE_H
#define TIDE_TEST_FAKE_MACHINE_H

#include "core/clock_test.h"
#include "exec/exec_test.h"
#include "sim/sim.h"

#include <pthread.h>
#include <string.h>

#define FAKE_MAX_RUNS 256

typedef struct fake_machine {
    tide_hw hw;              /* the profile the runs take their timings from */
    pthread_mutex_t mu;
    int runs;                /* runs timed so far */
    int failed;              /* runs the simulator refused (their measured timings stand) */
    double wall[FAKE_MAX_RUNS];
} fake_machine;

static void fake_machine_timing(void *user, const tide_plan *p, tide_sim_event *timeline, double *wall_s) {
    fake_machine *m = user;
    tide_sim_result r;
    if (tide_simulate(p, &m->hw, &r) || r.n_events != p->n_ins) {
        pthread_mutex_lock(&m->mu);
        m->failed++;
        pthread_mutex_unlock(&m->mu);
        return;
    }
    if (timeline) memcpy(timeline, r.events, (size_t)p->n_ins * sizeof *timeline);
    *wall_s = r.makespan_s;
    tide_test_clock_advance(r.makespan_s);
    pthread_mutex_lock(&m->mu);
    if (m->runs < FAKE_MAX_RUNS) m->wall[m->runs] = r.makespan_s;
    m->runs++;
    pthread_mutex_unlock(&m->mu);
    tide_sim_result_free(&r);
}

/* Every run from now on timed on hw (copied), the virtual clock on. */
static void fake_machine_on(fake_machine *m, const tide_hw *hw) {
    memset(m, 0, sizeof *m);
    m->hw = *hw;
    pthread_mutex_init(&m->mu, NULL);
    tide_test_clock_fake(true);
    tide_exec_test_set_timing(fake_machine_timing, m);
}

/* Measured timings and the monotonic clock again. */
static void fake_machine_off(fake_machine *m) {
    tide_exec_test_set_timing(NULL, NULL);
    tide_test_clock_fake(false);
    pthread_mutex_destroy(&m->mu);
}

#endif
