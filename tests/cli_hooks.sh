#!/usr/bin/env bash
# cli_hooks.sh - the shipped `tide` and the static library hold none of the
# test build's hooks (CMakeLists.txt, tide_test_hooks): no allocation counters
# or fault injection (src/core/alloc_test.h), no SSD store fault injection
# (src/store/ssd_test.h), no virtual clock
# (src/core/clock_test.h), no executor run-timing hook (src/exec/exec_test.h),
# no CPU kernel path switches (src/backend/cpu/cpu_features.h). A test
# executable of the same build holds them (so the names searched for are the
# right ones).
source "$(dirname "$0")/lib_cli.sh" "$1"
command -v nm >/dev/null || { echo "skipped: nm not found"; exit 77; }
BUILD=$(dirname "$TIDE")
HOOKS='tide_alloc_fail_nth|tide_ssd_test_set_faults|tide_alloc_count|tide_alloc_live_bytes|tide_test_clock_|tide_exec_test_set_timing|tk_cpu_force_|tk_force_generic'
for f in "$TIDE" "$BUILD/libtide.a"; do
    [ -e "$f" ] || continue
    if nm "$f" 2>/dev/null | grep -Eq "$HOOKS"; then
        echo "FAIL: $(basename "$f") holds test hooks:"
        nm "$f" | grep -E "$HOOKS" | sed 's/^/  /' | head -8
        FAILS=$((FAILS + 1))
    else
        PASSES=$((PASSES + 1))
    fi
done
if [ -e "$BUILD/test_alloc" ]; then
    n=$(nm "$BUILD/test_alloc" | grep -Ec "$HOOKS")
    if [ "$n" -ge 3 ]; then PASSES=$((PASSES + 1)); else
        echo "FAIL: test_alloc holds $n of the hooks' symbols, wanted at least 3"; FAILS=$((FAILS + 1)); fi
fi
finish
