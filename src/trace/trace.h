/*
 * trace.h - timelines of a plan written for people: Perfetto trace JSON
 * (tide_trace_write) and an SVG picture of the device arena over time
 * (tide_trace_svg_write).
 *
 * The SVG shows a plan's device memory over time:
 * one panel per timeline (measured by the executor, predicted by the
 * simulator, ...) stacked vertically, so runs of one plan can be compared by
 * eye. The Perfetto trace (tide_trace_write) is for zooming into one run; this
 * picture is for seeing a whole run at once.
 */
#ifndef TIDE_TRACE_H
#define TIDE_TRACE_H

#include "ir/plan.h"

/* Perfetto / Chrome trace JSON: one track per stream (instruction slices named
 * "op name" / "load tensor" ...), a counter track "device bytes" of arena bytes
 * in use. `timeline` gives each instruction's start and end (from the simulator
 * or measured by the executor). Written via a temporary file and rename.
 * Returns TIDE_OK, TIDE_E_INVALID (a malformed timeline), TIDE_E_IO or
 * TIDE_E_NOMEM. */
tide_status tide_trace_write(const tide_plan *p, const tide_sim_event *timeline, int n,
                             const char *path);

/* Writes an SVG of p's device arena over time to path.
 *
 * timelines[k] (k < n_timelines) holds exactly p->n_ins events, one per
 * instruction, in any order (e.g. tide_sim_result.events, or the executor's
 * measurement); labels[k] names its panel ("measured", "predicted"); labels
 * or any labels[k] may be NULL ("timeline k").
 *
 * Each panel has a title line (label, makespan, peak device bytes), a filled
 * step area of arena bytes in use over time against a y axis 0..device_budget
 * (extended upward if the timeline's peak exceeds the budget, so a broken
 * plan shows above the dashed budget line), lanes under the plot with the
 * compute, h2d, d2h and io streams' instructions as bars, and a time axis in
 * seconds of its own (0..that timeline's makespan). A legend sits above the
 * panels.
 *
 * Bytes in use follow tide_trace_write's rule: a device copy (tensor, arena
 * offset) is in use from the start of the instruction that first writes it (a
 * LOAD into it or the COMPUTE producing it) to the end of the DROP that frees
 * it, or to the end of the timeline if never dropped; a COMPUTE's scratch is in
 * use while it runs; at one instant frees count before allocations. The area
 * is drawn with at most one point pair per pixel column: the line at that
 * column's maximum, so a peak is never hidden, and a darker fill up to its
 * minimum (they differ only where the level swings within a pixel); bars
 * closer than a pixel are merged. A panel takes well under a MiB whatever the
 * plan's size.
 *
 * Returns TIDE_OK; TIDE_E_INVALID (no plan or path, n_timelines < 1, a NULL
 * timeline, a plan without instructions, an event with a bad instruction
 * index, a repeated instruction, or a time that is not finite with
 * 0 <= start <= end); TIDE_E_NOMEM; TIDE_E_IO naming the path when the file
 * cannot be written. The file is written to a temporary name beside path and
 * renamed over it when complete, so path is never left half-written. The
 * message is recorded on p->ctx. */
tide_status tide_trace_svg_write(const tide_plan *p, const tide_sim_event *const *timelines,
                                 const char *const *labels, int n_timelines, const char *path);

#endif
