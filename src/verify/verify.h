/*
 * verify.h - the plan verifier (docs/design.md section 5). It is built as a library
 * of its own that sees only the plan IR and the graph, so its independence
 * from the planner holds by construction.
 */
#ifndef TIDE_VERIFY_H
#define TIDE_VERIFY_H

#include "ir/plan.h"

/* Replays p against its graph and proves docs/design.md section 5's invariants: every
 * COMPUTE reads the current version of each input from device memory; live
 * device ranges never overlap (transfers in flight included); every
 * offset+size is inside the budget; every cross-stream RAW/WAR/WAW hazard on
 * device ranges and tier copies is ordered by waits; persistent tensors end at
 * home with their latest version and OUTPUT tensors end on HOST. Returns TIDE_OK
 * or TIDE_E_VERIFY with the first violation (instruction index, tensor, what).
 * Shares no logic with the planner. */
tide_status tide_plan_verify(const tide_plan *p);

#endif
