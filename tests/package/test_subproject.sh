#!/usr/bin/env bash
# test_subproject: brigade builds as a subproject. A parent project
# (subproject/) add_subdirectory()s this tree and builds the package consumer
# against brigade::brigade and brigade::brigade_static; both run (a tiny MLP
# for 2 steps). Also: brigade's build, the CLI included, lands under its own
# binary folder (the parent's build/brigade: PROJECT_BINARY_DIR, not
# CMAKE_BINARY_DIR), its tests are off there by default, and no CMake file of
# the tree names CMAKE_SOURCE_DIR or CMAKE_BINARY_DIR (the top-level build's).
# CUDA off and the parent's (empty) build type: this checks the CMake files,
# not the kernels, and compiles quickest so.
set -o pipefail
HARNESS_NO_BRIGADE=1
. "$(dirname "$0")/../lib/harness.sh"
src=${BRIGADE_SOURCE_DIR:?}
cc=${BG_CC:-cc}
tmp=$T
fail() { die "$@"; }

if grep -rn 'CMAKE_SOURCE_DIR\|CMAKE_BINARY_DIR' "$src" --include=CMakeLists.txt --include='*.cmake' \
        --exclude-dir='build*'; then
    fail "the CMake files above use the top-level build's folders: use PROJECT_SOURCE_DIR, PROJECT_BINARY_DIR or CMAKE_CURRENT_*"
fi
cmake -S "$src/tests/package/subproject" -B "$tmp/b" -DBRIGADE_TREE="$src" -DBG_CUDA=OFF \
      -DCMAKE_C_COMPILER="$cc" > "$tmp/cmake.log" 2>&1 || { cat "$tmp/cmake.log"; fail "parent project: configure"; }
[ -d "$tmp/b/brigade/bg_include" ] || fail "brigade's include links are not under its own binary folder (b/brigade)"
[ ! -e "$tmp/b/bg_include" ] || fail "brigade wrote bg_include into the parent's binary folder"
[ ! -d "$tmp/b/brigade/tests" ] || fail "brigade's tests are configured in a parent project (BG_TESTS should default to OFF)"
cmake --build "$tmp/b" --target consumer_shared consumer_static brigade_cli -j2 > "$tmp/build.log" 2>&1 \
    || { tail -50 "$tmp/build.log"; fail "parent project: build"; }
"$tmp/b/consumer_shared" || fail "consumer linked to brigade::brigade"
"$tmp/b/consumer_static" || fail "consumer linked to brigade::brigade_static"
if readelf -d "$tmp/b/consumer_static" | grep -q 'NEEDED.*libbrigade'; then
    fail "consumer_static needs libbrigade.so"
fi
[ -f "$tmp/b/brigade/libbrigade.so" ] || fail "libbrigade.so is not under brigade's binary folder"
"$tmp/b/brigade/brigade" --version > /dev/null || fail "the CLI is not under brigade's binary folder (b/brigade/brigade)"
ok "subproject: brigade built by add_subdirectory; consumer_shared and consumer_static ran"
finish
