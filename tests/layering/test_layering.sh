#!/usr/bin/env bash
# test_layering: the layering of cmake/modules.cmake is enforced by the build.
#   1. every allowed probe (a module's source including a header of a module
#      it may use) compiles;
#   2. every forbidden probe (e.g. a kernels/ source including a runtime/
#      header) fails, on that very include ("No such file" / "not found");
#   3. runtime's link check with one more source that calls the planner fails
#      on that call (undefined reference), while runtime's own check builds;
#   4. no module source reaches another folder by a relative "../" include
#      (which include paths cannot stop), and kernels/ includes nothing of tests/.
# $1: the probe table "<target> <allowed 0|1> <header>" (tests/layering/CMakeLists.txt).
set -uo pipefail
table=${1:?probe table}
src=${BRIGADE_SOURCE_DIR:?}
bin=${BRIGADE_BINARY_DIR:?}
keep_going=-k
case "${BG_GENERATOR:-}" in *Ninja*) keep_going="-k 0" ;; esac
HARNESS_NO_BRIGADE=1
. "$(dirname "$0")/../lib/harness.sh"
tmp=$T

allowed=() forbidden=()
while read -r target ok header; do
    if [ "$ok" = 1 ]; then allowed+=("$target"); else forbidden+=("$target:$header"); fi
done < "$table"
[ ${#allowed[@]} -gt 0 ] && [ ${#forbidden[@]} -gt 0 ] || die "empty probe table $table"

# 1. allowed: one build, which must succeed
if ! cmake --build "$bin" --target "${allowed[@]}" > "$tmp/allowed.log" 2>&1; then
    cat "$tmp/allowed.log"; bad "an allowed include does not compile (above)"
fi

# 2. forbidden: one build going on past errors (serial, so that lines do not mix); each probe's
# file must fail on its header, and nothing else may fail
targets=()
for f in "${forbidden[@]}"; do targets+=("${f%%:*}"); done
# shellcheck disable=SC2086  # keep_going is one or two words
if cmake --build "$bin" --target "${targets[@]}" -- $keep_going > "$tmp/forbidden.log" 2>&1; then
    bad "the forbidden includes all compiled"
fi
for f in "${forbidden[@]}"; do
    target=${f%%:*} header=${f#*:}
    probe=${target#bg_layering_probe_}     # <module>_<other>
    file="${probe%%_*}_includes_${probe#*_}.c"
    if ! grep -E "${file}:[0-9]+:[0-9]+: fatal error: '?${header}'?: (No such file or directory|file not found)|${file}:[0-9]+:[0-9]+: fatal error: '${header}' file not found" \
            "$tmp/forbidden.log" > /dev/null; then
        bad "$target: ${file} including ${header} did not fail on that include"
    fi
done
n_err=$(grep -c 'fatal error\|error:' "$tmp/forbidden.log" || true)
if [ "$n_err" -ne ${#forbidden[@]} ]; then
    grep 'error' "$tmp/forbidden.log"
    bad "$n_err errors for ${#forbidden[@]} forbidden includes: something else failed (above)"
fi

# 3. a call the other way fails to link
if ! cmake --build "$bin" --target bg_layering_link_runtime > "$tmp/link.log" 2>&1; then
    cat "$tmp/link.log"; bad "runtime's link check does not build"
fi
if cmake --build "$bin" --target bg_layering_wrong_call > "$tmp/wrong.log" 2>&1; then
    bad "runtime calling the planner (tests/layering/wrong_call.c) linked"
elif ! grep -q "undefined reference to .bg_part_shortfall" "$tmp/wrong.log"; then
    cat "$tmp/wrong.log"; bad "bg_layering_wrong_call failed, but not on the undefined bg_part_shortfall"
fi

# 4. relative includes across folders; kernels/ and tests/
mods=(core kernels models transport schedule partitioner runtime tools)
if grep -rnE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"[^"]*\.\./' "${mods[@]/#/$src/}" \
        --include='*.c' --include='*.h' --include='*.cu'; then
    bad "a relative \"../\" include (above) escapes the layering"
fi
if grep -rnE '^[[:space:]]*#[[:space:]]*include[[:space:]]*["<](tests/|bg_test|bg_cuda_emu)' "$src/kernels"; then
    bad "kernels/ includes a header of tests/ (above)"
fi

[ "$fails" -eq 0 ] && ok "layering: ${#allowed[@]} allowed includes compile, ${#forbidden[@]} forbidden ones fail on" \
     "the include, a call from runtime into the planner fails to link"
finish
