#!/usr/bin/env bash
# lib_symbols.sh - libtide.so ($1) exports the public API and nothing else:
# every defined dynamic symbol starts with tide_ (the library is compiled with
# hidden visibility and include/tide.h alone restores the default,
# cmake/library.cmake); a few public functions are there; internal functions
# (tide_err, tide_malloc: src/core/core.h) are not, though they carry the
# prefix; none of the test build's hooks is in it at all, exported or not
# (tests/cli_hooks.sh names them: CMakeLists.txt, tide_test_hooks); the
# SONAME is libtide.so.MAJOR ($2, the major version).
set -u
LIB=${1:?usage: $0 LIBTIDE_SO MAJOR}
MAJOR=${2:?usage: $0 LIBTIDE_SO MAJOR}
command -v nm >/dev/null && command -v readelf >/dev/null || { echo "skipped: nm or readelf not found"; exit 77; }
FAILS=0
fail() { echo "FAIL: $*"; FAILS=$((FAILS + 1)); }

syms=$(nm -D --defined-only "$LIB" | awk '{print $NF}') || { echo "FAIL: nm -D $LIB"; exit 1; }
n=$(printf '%s\n' "$syms" | grep -c .)
[ "$n" -gt 50 ] || fail "only $n symbols exported"
# the linker's own markers, where a linker still exports them, and what a
# sanitizer's instrumentation adds (TIDE_SANITIZE builds)
extra=$(printf '%s\n' "$syms" | grep -v '^tide_' | grep -vxE '_init|_fini|__bss_start|_edata|_end' |
        grep -vE '^_*(odr_)?(asan|ubsan|tsan)')
[ -z "$extra" ] || fail "exported symbols outside the API: $(echo $extra | head -c 600)"
for f in tide_version tide_ctx_new tide_ctx_last_error tide_status_str tide_checkpoint_open \
         tide_model_new tide_model_generate_ex tide_tokenizer_open tide_trainer_step; do
    printf '%s\n' "$syms" | grep -qx "$f" || fail "public $f not exported"
done
for f in tide_err tide_malloc tide_free; do
    printf '%s\n' "$syms" | grep -qx "$f" && fail "internal $f exported"
done
HOOKS='tide_alloc_fail_nth|tide_alloc_count|tide_alloc_live_bytes|tide_test_clock_|tide_exec_test_set_timing|tide_ssd_test_set_faults|tk_cpu_force_|tk_force_generic'
hooks=$( (nm "$LIB" 2>/dev/null; nm -D "$LIB") | awk '{print $NF}' | grep -E "$HOOKS" | sort -u)
[ -z "$hooks" ] || fail "test hooks in the library: $(echo $hooks | head -c 600)"
soname=$(readelf -d "$LIB" | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')
[ "$soname" = "libtide.so.$MAJOR" ] || fail "SONAME '$soname', wanted libtide.so.$MAJOR"
echo "$n symbols exported; $FAILS failed"
[ "$FAILS" -eq 0 ]
