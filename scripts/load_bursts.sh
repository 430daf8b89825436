#!/usr/bin/env bash
# load_bursts.sh - runs a command while bursts of busy loops come and go on
# the machine: the load under which no test's verdict may change (tests
# decide on injected timings, not on measured ones).
#
#   scripts/load_bursts.sh [-n LOOPS] [-t MAX_SECONDS] [-s SEED] -- COMMAND...
#
# LOOPS busy loops (default 2, one per core of a 2-core machine), each on for
# 1 s, then off for 1 or 2 s (random), over and over, until COMMAND ends or
# MAX_SECONDS pass (default 3600; the loops stop then, the command runs on).
# Exits with COMMAND's status. Example, the suite three times in a row:
#   for i in 1 2 3; do scripts/load_bursts.sh -- ctest --test-dir build -j2 || break; done
set -u
loops=2 max=3600 seed=$$
while getopts "n:t:s:" o; do
    case $o in
        n) loops=$OPTARG ;;
        t) max=$OPTARG ;;
        s) seed=$OPTARG ;;
        *) echo "usage: $0 [-n LOOPS] [-t MAX_SECONDS] [-s SEED] -- COMMAND..." >&2; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
[ "${1:-}" = "--" ] && shift
[ $# -gt 0 ] || { echo "usage: $0 [-n LOOPS] [-t MAX_SECONDS] [-s SEED] -- COMMAND..." >&2; exit 2; }

# one burst worker: busy for 1 s, idle 1-2 s, until its deadline
burst() {
    local end=$(( $(date +%s) + max )) stop
    RANDOM=$1
    while [ "$(date +%s)" -lt "$end" ]; do
        stop=$(( $(date +%s%N) + 1000000000 ))
        while [ "$(date +%s%N)" -lt "$stop" ]; do :; done
        sleep $((1 + RANDOM % 2))
    done
}

pids=()
for i in $(seq 1 "$loops"); do
    burst $((seed + i)) &
    pids+=($!)
done
"$@"
rc=$?
kill "${pids[@]}" 2>/dev/null
wait "${pids[@]}" 2>/dev/null
exit $rc
