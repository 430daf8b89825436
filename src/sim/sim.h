/*
 * sim.h - the simulator: a plan replayed on a hardware profile predicts its
 * timeline (docs/design.md sections 2, 6.2), with instruction costs from the cost model.
 */
#ifndef TIDE_SIM_H
#define TIDE_SIM_H

#include "cost/cost.h"

typedef struct tide_sim_result {
    double makespan_s;
    double busy_s[TIDE_STREAM_COUNT];
    tide_sim_event *events;       /* one per instruction, in instruction order */
    int n_events;
} tide_sim_result;

/* Discrete-event replay of p on hw: streams are FIFO queues, waits delay starts,
 * H2D and D2H are separate links, IO shares the SSDs' bandwidth. Returns TIDE_OK,
 * TIDE_E_NOMEM, or TIDE_E_INVALID (a malformed instruction, an out-of-range wait,
 * or a wait that can never be met; message on p->ctx). Free the result with
 * tide_sim_result_free. */
tide_status tide_simulate(const tide_plan *p, const tide_hw *hw, tide_sim_result *out);
void tide_sim_result_free(tide_sim_result *r);

#endif
