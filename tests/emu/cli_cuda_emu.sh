#!/usr/bin/env bash
# cli_cuda_emu.sh - `tide run` on the CUDA backend with an emulated GPU
# (tide-cudaemu, tests/emu/backend_emu.cmake): the GPU's paths end to end
# (asynchronous issue, pinned weights, the double-buffered SSD bounce buffer,
# timing events, --budget auto from the device's free memory), offloaded runs
# checked bit for bit, and the failures a GPU can have: no driver, no device,
# a device that answers but cannot be used, device memory refused, pinning
# refused, a kernel that faults.
#
# What it proves: (with `test_backends_cudaemu`, which is
# tests/test_backends.c built on the emulation, and
# `bench_gpu_offload_cudaemu`) the whole CUDA backend without a GPU:
# `cuda_backend.c` and `cuda_ops.c` built against the toolkit's headers and
# linked with an emulated CUDA runtime and cuBLAS
# (`tests/emu/cuda_rt_emu.cpp`) and the kernels on the emulation above. A
# device thread runs the queued work of every stream in a random order that
# respects stream order and event waits, lagging the host by random delays
# (or, with `TIDE_EMU_LAZY=1`, running nothing until the host waits for it);
# the host waits only where CUDA promises to (synchronize calls, `cudaFree`),
# so copies to host memory, pinned or not, land when the device gets to them;
# copy and GEMM operands or kernel pointer arguments outside device memory,
# writes past an allocation, overlapping copies, pinned memory released under
# a queued copy, a pinned copy source written by the host before its copy ran,
# and streams or events used after destroy stop the run. `test_backends` runs
# all its cases there on "cuda"; `cli_cuda_emu` runs `tide run` on the
# emulated GPU (every policy offloaded and checked bit for bit, SSD-homed
# weights through the bounce buffer, traces from timing events,
# `TIDE_EXEC_SYNC=1`, `--budget auto`, offloaded runs on a lazy device) and
# its failures (CUDA errors 35 and 100, a GPU present but unusable, device
# memory and pinning refused, a kernel fault issued ahead or not); the GPU
# benchmark runs there on a 4-layer tiny model, so its own code has run before
# a GPU session needs it. Shown to catch 15 of 16 bugs planted in
# `cuda_backend.c` (a missing event wait, an event on the wrong stream, a
# wrong leading dimension, transpose, dtype or chunk offset for cuBLAS, a
# wrong pitch, a range record not armed or not cleared, a host pointer handed
# to a kernel, ...; the one missed, `synchronize` waiting for the compute
# stream only, is masked by the executor's own event waits) and an executor
# that lets the SSD reader refill a bounce-buffer half before its queued copy
# ran. `build/tide-cudaemu` is the command-line tool on the emulated GPU;
# `TIDE_EMU_*` variables set its memory, schedule and injected failures (see
# `tests/emu/cuda_rt_emu.cpp`).
source "$(dirname "$0")/../lib_cli.sh" "$1"
: "${TIDE_FIXTURES:?TIDE_FIXTURES must point at tests/fixtures}"
FX=$TIDE_FIXTURES/tiny-bf16-gqa
# No probe of the emulated device (its llama-7b-sized matmuls would take
# minutes here): plans use a shipped profile.
HW=(--hw h100-80g)

expect 0 "make-model" -- "$TIDE" make-model --config "$FX/config.json" --layers 4 --seed 3 "$TMP/m"

expect 0 "resident run on the GPU" -- "$TIDE" run --model "$TMP/m" --new-tokens 3 --backend cuda --json
contains "$TMP/out" '"backend":"cuda"' "runs on cuda"
contains "$TMP/out" '"async_issue":true' "device work queued ahead, ordered by events"

mkdir -p "$TMP/spill"
# TIDE_CLI_QUICK (sanitizer builds): one policy
policies=(tide static-layer lru)
[ -n "${TIDE_CLI_QUICK:-}" ] && policies=(tide)
for p in "${policies[@]}"; do
    expect 0 "offloaded at 75%, $p, checked" -- "$TIDE" run --model "$TMP/m" --new-tokens 3 --budget 75% \
        --policy $p --check --json --ssd "$TMP/spill" "${HW[@]}"
    contains "$TMP/out" '"check_passed":true' "$p: bit-identical to the unconstrained run on the GPU"
    contains "$TMP/out" '"async_issue":true' "$p: asynchronous issue"
done
grep -o '"pinned_weight_bytes":[0-9]*' "$TMP/out" >"$TMP/pinned"
if grep -q '"pinned_weight_bytes":0$' "$TMP/pinned" || [ ! -s "$TMP/pinned" ]; then
    echo "FAIL: weights not pinned on the GPU by default: $(cat "$TMP/pinned")"; FAILS=$((FAILS + 1))
else PASSES=$((PASSES + 1)); fi

expect 0 "minimum budget, weights on SSD through the bounce buffer, traced" -- "$TIDE" run --model "$TMP/m" \
    --new-tokens 2 --budget min --weights-on-ssd --check --ssd "$TMP/spill" --trace "$TMP/t.json" "${HW[@]}"
contains "$TMP/out" "check      passed" "SSD-homed weights: check passes"
contains "$TMP/t.json" '"device bytes"' "trace from the GPU's timing events"
expect 0 "the same with the pread pool and --direct-storage (no cuFile here: a notice)" -- "$TIDE" run \
    --model "$TMP/m" --new-tokens 2 --budget min --weights-on-ssd --pread --direct-storage --check \
    --ssd "$TMP/spill" "${HW[@]}"
contains "$TMP/out" "check      passed" "pread pool: check passes"
if [ -z "$(ls -A "$TMP/spill")" ]; then PASSES=$((PASSES + 1)); else
    echo "FAIL: spill directory not empty: $(ls "$TMP/spill")"; FAILS=$((FAILS + 1)); fi

# a device that runs nothing until the host waits for it: whatever the host
# reads or rewrites too early is wrong every time, not by chance
TIDE_EMU_LAZY=1 expect 0 "offloaded on a lazy device, checked" -- "$TIDE" run --model "$TMP/m" --new-tokens 2 \
    --budget 50% --check "${HW[@]}"
contains "$TMP/out" "check      passed" "lazy device: check passes"
TIDE_EMU_LAZY=1 expect 0 "SSD-homed weights on a lazy device, checked" -- "$TIDE" run --model "$TMP/m" \
    --new-tokens 2 --budget min --weights-on-ssd --check --ssd "$TMP/spill" "${HW[@]}"
contains "$TMP/out" "check      passed" "lazy device, SSD: check passes"

TIDE_EXEC_SYNC=1 expect 0 "synchronous issue (TIDE_EXEC_SYNC=1), checked" -- "$TIDE" run --model "$TMP/m" \
    --new-tokens 2 --budget 25% --check "${HW[@]}"
contains "$TMP/out" "synchronous issue" "summary says synchronous"
contains "$TMP/out" "check      passed" "synchronous issue: check passes"
expect 0 "exact f32 matmul mode, checked" -- "$TIDE" run --model "$TMP/m" --new-tokens 2 --budget 25% \
    --matmul f32 --check "${HW[@]}"
contains "$TMP/out" "matmul f32" "summary names the matmul mode"
expect 0 "--budget auto from the device's free memory" -- "$TIDE" run --model "$TMP/m" --new-tokens 2 \
    --budget auto --json "${HW[@]}"
json_field "$TMP/out" budget_bytes
TIDE_EMU_MEM=$((64 << 20)) expect 1 "--budget auto on a device with less free memory than the margin" -- \
    "$TIDE" run --model "$TMP/m" --new-tokens 2 --budget auto "${HW[@]}"
contains "$TMP/err" "margin" "message names the margin"

# a device whose largest 2-D copy pitch is below a sequence's rows: take_last
# copies sequence by sequence, to the same tokens
expect 0 "take_last with the device's usual pitch limit" -- "$TIDE" run --model "$TMP/m" --new-tokens 2 \
    --backend cuda --json
grep -o '"tokens":\[[0-9,]*\]' "$TMP/out" >"$TMP/tokens.want"
TIDE_EMU_MEM_PITCH=1024 expect 0 "take_last past the device's pitch limit" -- "$TIDE" run --model "$TMP/m" \
    --new-tokens 2 --backend cuda --json
grep -o '"tokens":\[[0-9,]*\]' "$TMP/out" >"$TMP/tokens.got"
expect 0 "same tokens either way" -- cmp "$TMP/tokens.want" "$TMP/tokens.got"

# no GPU: auto takes the CPU, cuda is an error naming the cause
for e in 35 100; do
    TIDE_EMU_GPU=$e expect 0 "no GPU (error $e): auto runs on the CPU" -- "$TIDE" run --model "$TMP/m" \
        --new-tokens 2 --json
    contains "$TMP/out" '"backend":"cpu"' "error $e: cpu backend"
    TIDE_EMU_GPU=$e expect 1 "no GPU (error $e): --backend cuda fails" -- "$TIDE" run --model "$TMP/m" \
        --new-tokens 2 --backend cuda
    contains "$TMP/err" "no CUDA device" "error $e: message names the cause"
    contains "$TMP/err" "error $e" "error $e: message has the error number"
done

# a GPU that answers but cannot be used: an error under auto too
TIDE_EMU_FAIL=malloc:1 expect 1 "GPU present, backend set-up fails" -- "$TIDE" run --model "$TMP/m" --new-tokens 2
contains "$TMP/err" "out of memory" "set-up failure names the cause"
contains "$TMP/err" "present but unusable" "set-up failure says the GPU is there"
# the device arena refused (the backend makes 2 allocations, its default
# queue's flag and record; cuBLAS gets no workspace; the arena is the 3rd)
TIDE_EMU_FAIL=malloc:3 expect 1 "device arena refused" -- "$TIDE" run --model "$TMP/m" --new-tokens 2 \
    --budget 50% "${HW[@]}"
contains "$TMP/err" "device arena" "arena failure names the arena"
contains "$TMP/err" "out of device memory" "arena failure names the cause"
# pinning refused: the weights stay pageable, the run goes on and says so
# (the KV cache's 8 buffers, 2 per layer, are pinned first, at load)
TIDE_EMU_FAIL=hostreg:9 expect 0 "pinning refused" -- "$TIDE" run --model "$TMP/m" --new-tokens 2 --budget 50% \
    --check "${HW[@]}"
contains "$TMP/err" "weight bytes pinned (the pinned allocation was refused)" "notice says pinning was refused"
contains "$TMP/out" "check      passed" "pinning refused: check passes"
# the KV cache's pinning refused: that buffer stays pageable, the run goes on and says so
TIDE_EMU_FAIL=hostreg:1 expect 0 "KV cache pinning refused" -- "$TIDE" run --model "$TMP/m" --new-tokens 2 \
    --budget 50% --check "${HW[@]}"
contains "$TMP/err" "KV cache's pinned allocation was refused (cache.0.k)" "notice names the cache buffer"
contains "$TMP/out" "check      passed" "KV cache pinning refused: check passes"
# training on chat examples (masked targets: the loss on the assistant's
# tokens, tests/fixtures/dataset): resident on the GPU within 1e-4 of the
# CPU's losses, offloaded bit for bit the resident GPU run
DX=$TIDE_FIXTURES/dataset
train=(train --model "$DX/model" --data "$DX/chat.jsonl" --batch 2 --seq 48 --steps 2 --json)
expect 0 "masked training on the CPU" -- "$TIDE" "${train[@]}" --backend cpu
grep '"step"' "$TMP/out" | sed -e 's/.*"loss":\([^,]*\),.*/\1/' >"$TMP/cpu.loss"
expect 0 "masked training on the GPU" -- "$TIDE" "${train[@]}" --backend cuda --matmul f32
grep '"step"' "$TMP/out" | sed -e 's/.*"loss":\([^,]*\),.*/\1/' >"$TMP/gpu.loss"
if [ -s "$TMP/cpu.loss" ] && paste "$TMP/cpu.loss" "$TMP/gpu.loss" |
    awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > 1e-4 * $1 || NF != 2) bad = 1 } END { exit bad }'; then
    PASSES=$((PASSES + 1)); else
    echo "FAIL: masked losses on the GPU $(tr '\n' ' ' <"$TMP/gpu.loss") vs the CPU's $(tr '\n' ' ' <"$TMP/cpu.loss")"
    FAILS=$((FAILS + 1)); fi
expect 0 "masked training offloaded on the GPU, checked" -- "$TIDE" "${train[@]}" --backend cuda --budget 40% \
    --check "${HW[@]}"
contains "$TMP/out" '"check_passed":true' "masked offloaded training bit-identical on the GPU"

# a kernel faults mid-run: a clear error, no crash, whether issued ahead or not
TIDE_EMU_FAIL=kernel:40 expect 1 "kernel fault, asynchronous issue" -- "$TIDE" run --model "$TMP/m" \
    --new-tokens 2 --budget 50% "${HW[@]}"
contains "$TMP/err" "unspecified launch failure" "fault named"
contains "$TMP/err" "TIDE_EXEC_SYNC=1" "asynchronous failure says how to name the instruction"
TIDE_EXEC_SYNC=1 TIDE_EMU_FAIL=kernel:40 expect 1 "kernel fault, synchronous issue" -- "$TIDE" run \
    --model "$TMP/m" --new-tokens 2 --budget 50% "${HW[@]}"
contains "$TMP/err" "unspecified launch failure" "fault named (synchronous)"
TIDE_EMU_FAIL=kernel:40 expect 1 "kernel fault, resident run" -- "$TIDE" run --model "$TMP/m" --new-tokens 2 \
    --backend cuda
contains "$TMP/err" "unspecified launch failure" "fault named (resident)"

finish
