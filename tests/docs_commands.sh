#!/usr/bin/env bash
# docs_commands.sh - docs/commands.md is in step with the binary's help: it
# regenerates the command reference with scripts/gen_command_docs.sh from the
# built tide (`tide --help`, `tide CMD --help` for every command listed) into
# the build tree and compares it with the committed docs/commands.md. Fails
# (exit 1) with the diff when they differ: change the help text, then run
# `scripts/gen_command_docs.sh build/tide` and commit the page.
#
# Usage: bash tests/docs_commands.sh TIDE OUT  (TIDE the tide binary, OUT the
# regenerated page; ctest passes the build tree's docs/commands.md)
set -u
src=$(cd "$(dirname "$0")/.." && pwd)
tide=${1:?usage: docs_commands.sh TIDE OUT}
out=${2:?usage: docs_commands.sh TIDE OUT}
bash "$src/scripts/gen_command_docs.sh" "$tide" "$out" || { echo "FAIL: the generator failed"; exit 1; }
if ! diff -u "$src/docs/commands.md" "$out"; then
    echo "FAIL: docs/commands.md differs from the help of $tide (above: - committed, + generated);"
    echo "      run scripts/gen_command_docs.sh $tide and commit docs/commands.md"
    exit 1
fi
echo "docs/commands.md matches the help of every command"
