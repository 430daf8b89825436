# lib_cli.sh - helpers for the command-line tests (sourced, not run).
# Usage in a test: source "$(dirname "$0")/lib_cli.sh" "$1"
set -u
TIDE=${1:?usage: $0 PATH_TO_TIDE}
TMP=$(mktemp -d /tmp/tide-cli-XXXXXX)
export TIDE_CACHE=$TMP/cache   # never touch the user's cache
trap 'rm -rf "$TMP"' EXIT
FAILS=0
PASSES=0
SKIPS=0

# expect CODE DESCRIPTION -- command...: runs it, checks the exit status, keeps
# stdout in $TMP/out and stderr in $TMP/err.
expect() {
    local want=$1 what=$2
    shift 3
    local t0=${TIDE_CLI_TIMES:+$(date +%s.%N)}
    "$@" >"$TMP/out" 2>"$TMP/err"
    local got=$?
    # TIDE_CLI_TIMES=FILE: each case's seconds appended to FILE (to find the
    # cases that make a test slow; docs/testing.md)
    [ -n "${TIDE_CLI_TIMES:-}" ] &&
        echo "$(date +%s.%N) $t0 $(basename "$0") $what" | awk '{printf "%8.3f %s", $1 - $2, $3; for (i = 4; i <= NF; i++) printf " %s", $i; print ""}' >>"$TIDE_CLI_TIMES"
    if [ "$got" -ne "$want" ]; then
        echo "FAIL: $what: exit $got, wanted $want"
        echo "  command: $*"
        sed 's/^/  stderr: /' "$TMP/err" | head -5
        FAILS=$((FAILS + 1))
        return 1
    fi
    PASSES=$((PASSES + 1))
    return 0
}

# contains FILE TEXT DESCRIPTION: the file holds the text.
contains() {
    if grep -qF -- "$2" "$1"; then
        PASSES=$((PASSES + 1))
    else
        echo "FAIL: $3: '$2' not in $(basename "$1")"
        sed 's/^/  | /' "$1" | head -8
        FAILS=$((FAILS + 1))
    fi
}

# json_field FILE FIELD: the one-line JSON object in FILE has the field.
json_field() {
    contains "$1" "\"$2\":" "JSON field $2"
}

# llama7b_config DIR [VOCAB]: a config.json alone in DIR with llama-7b's
# layer shapes cut to 4 layers (plans need no weights), the vocabulary
# llama-7b's 32000 unless given: for the tests' minimum-budget searches,
# which plan many times (their largest ops, so their minimums, are llama-7b's)
llama7b_config() {
    mkdir -p "$1"
    cat >"$1/config.json" <<EOF_CONFIG
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
 "intermediate_size": 11008, "num_hidden_layers": 4, "num_attention_heads": 32,
 "num_key_value_heads": 32, "vocab_size": ${2:-32000}, "max_position_embeddings": 2048,
 "rms_norm_eps": 1e-06, "torch_dtype": "float16", "tie_word_embeddings": false}
EOF_CONFIG
}

# skip_check WHAT WHY: a check that cannot run here (a missing tool): the
# test then ends skipped (77), not passed, unless another check failed.
skip_check() {
    echo "skipped: $1: $2"
    SKIPS=$((SKIPS + 1))
}

# finish: the summary; status 1 on a failure, else 77 (skipped, ctest's
# SKIP_RETURN_CODE) when a check could not run, else 0. The script's last
# command, so that its status is the test's.
finish() {
    if [ "$SKIPS" -gt 0 ]; then echo "$PASSES passed, $FAILS failed, $SKIPS skipped"
    else echo "$PASSES passed, $FAILS failed"; fi
    [ "$FAILS" -eq 0 ] || return 1
    [ "$SKIPS" -eq 0 ] || return 77
    return 0
}

# train_compare DESCRIPTION MODE ARGS...: a check by tests/train_compare.py
# (steps, same, eval, torch, params: the losses, norms, validations or
# tensors of training runs), its first difference printed on a failure.
train_compare() {
    local what=$1
    shift
    if python3 "$(dirname "${BASH_SOURCE[0]}")/train_compare.py" "$@" >"$TMP/cmp" 2>&1; then PASSES=$((PASSES + 1))
    else echo "FAIL: $what: $(tail -1 "$TMP/cmp")"; FAILS=$((FAILS + 1)); fi
}

# summary_field FILE FIELD RANK: the field of that rank's `--json` summary.
summary_field() {
    grep '"summary":true' "$1" | grep "\"rank\":$3[,}]" | grep -o "\"$2\":[0-9.e+-]*" | head -1 | cut -d: -f2
}

# mpi_launcher: MPI, the mpirun of the tests that start ranks on this machine
# (shared memory, oversubscribed; append N to it, its last word is -np), and
# the environment its ranks get: Open MPI's own allocations kept until exit
# are not tide's leaks under a sanitizer build (tests/lsan_mpi.supp; their
# suppressions need ASAN_OPTIONS' fast_unwind_on_malloc=0, which the caller
# sets where it runs mpirun under AddressSanitizer).
mpi_launcher() {
    export LSAN_OPTIONS="suppressions=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lsan_mpi.supp:print_suppressions=0${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
    export OMPI_MCA_mca_base_component_disable_dlclose=1
    MPI=(mpirun --oversubscribe --allow-run-as-root --mca pml ob1 --mca btl self,vader
         --mca btl_vader_single_copy_mechanism none -x TIDE_CACHE -x OMP_NUM_THREADS=1 -x LSAN_OPTIONS -x ASAN_OPTIONS
         -x OMPI_MCA_mca_base_component_disable_dlclose -np)
}
