#!/usr/bin/env bash
# test_install: install this build tree into a temporary prefix and use it
# from outside, the way a consumer would:
#   - the layout: versioned shared library with its SONAME, libbrigade.a,
#     every public header, the CLI (which must find the library by RPATH),
#     brigade.pc and the CMake package files;
#   - consumer/ built with find_package(brigade) against brigade::brigade and
#     brigade::brigade_static;
#   - the same program built with `pkg-config --cflags --libs brigade` (shared)
#     and `pkg-config --static --cflags --libs brigade` against libbrigade.a;
# each program is run (it trains a tiny MLP for 2 steps and checks the loss).
set -euo pipefail
HARNESS_NO_BRIGADE=1
. "$(dirname "$0")/../lib/harness.sh"
src=${BRIGADE_SOURCE_DIR:?}
bin=${BRIGADE_BINARY_DIR:?}
cc=${BG_CC:-cc}
tmp=$T
p=$tmp/prefix

cmake --install "$bin" --prefix "$p" > "$tmp/install.log" || { cat "$tmp/install.log"; die "cmake --install"; }

# layout
ver=$(sed -n 's/^#define BRIGADE_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\)$/\2/p' "$src/include/brigade/core.h" | paste -sd.)
major=${ver%%.*}
[ "$(readlink "$p/lib/libbrigade.so")" = "libbrigade.so.$major" ] || die "lib/libbrigade.so is not a link to libbrigade.so.$major"
[ "$(readlink "$p/lib/libbrigade.so.$major")" = "libbrigade.so.$ver" ] || die "lib/libbrigade.so.$major is not a link to libbrigade.so.$ver"
[ -f "$p/lib/libbrigade.so.$ver" ] || die "no lib/libbrigade.so.$ver"
soname=$(readelf -d "$p/lib/libbrigade.so.$ver" | sed -n 's/.*SONAME.*\[\(.*\)\]/\1/p')
[ "$soname" = "libbrigade.so.$major" ] || die "SONAME is '$soname', expected libbrigade.so.$major"
[ -f "$p/lib/libbrigade.a" ] || die "no lib/libbrigade.a"
for h in "$src"/include/brigade/*.h; do
    cmp -s "$h" "$p/include/brigade/$(basename "$h")" || die "include/brigade/$(basename "$h") not installed"
done
for f in lib/pkgconfig/brigade.pc lib/cmake/brigade/brigadeConfig.cmake \
         lib/cmake/brigade/brigadeConfigVersion.cmake lib/cmake/brigade/brigadeTargets.cmake; do
    [ -f "$p/$f" ] || die "no $f"
done
"$p/bin/brigade" --version | grep -qx "brigade $ver" || die "installed bin/brigade --version does not print 'brigade $ver'"

# CMake consumer
cmake -S "$src/tests/package/consumer" -B "$tmp/cmake" -DCMAKE_PREFIX_PATH="$p" \
      -DCMAKE_C_COMPILER="$cc" -DCMAKE_BUILD_TYPE=Release > "$tmp/cmake.log" 2>&1 \
    || { cat "$tmp/cmake.log"; die "find_package(brigade) consumer: configure"; }
cmake --build "$tmp/cmake" > "$tmp/build.log" 2>&1 || { cat "$tmp/build.log"; die "find_package(brigade) consumer: build"; }
"$tmp/cmake/consumer_shared" || die "consumer linked to brigade::brigade"
"$tmp/cmake/consumer_static" || die "consumer linked to brigade::brigade_static"
if readelf -d "$tmp/cmake/consumer_static" | grep -q 'NEEDED.*libbrigade'; then
    die "consumer_static needs libbrigade.so"
fi

# pkg-config consumer
export PKG_CONFIG_PATH=$p/lib/pkgconfig
pkg-config --exists brigade || die "pkg-config does not find brigade.pc"
[ "$(pkg-config --modversion brigade)" = "$ver" ] || die "brigade.pc says version $(pkg-config --modversion brigade)"
# shellcheck disable=SC2046  # word splitting of the flags is intended
"$cc" -o "$tmp/pc_shared" "$src/tests/package/consumer/consumer.c" $(pkg-config --cflags --libs brigade) -lm \
    || die "pkg-config --cflags --libs brigade: build"
LD_LIBRARY_PATH=$p/lib "$tmp/pc_shared" || die "consumer linked with pkg-config (shared)"
# README's recipe for a prefix outside the loader's paths: the rpath instead of LD_LIBRARY_PATH
# shellcheck disable=SC2046
"$cc" -o "$tmp/pc_rpath" "$src/tests/package/consumer/consumer.c" $(pkg-config --cflags --libs brigade) \
    -Wl,-rpath,"$p/lib" -lm || die "pkg-config --cflags --libs brigade -Wl,-rpath: build"
env -u LD_LIBRARY_PATH "$tmp/pc_rpath" || die "consumer linked with pkg-config and -Wl,-rpath, run without LD_LIBRARY_PATH"
# static: the same flags, with libbrigade.a named so the linker cannot pick the .so
static_flags=$(pkg-config --static --cflags --libs brigade | sed 's/-lbrigade\b/-l:libbrigade.a/')
# shellcheck disable=SC2086
"$cc" -o "$tmp/pc_static" "$src/tests/package/consumer/consumer.c" $static_flags -lm \
    || die "pkg-config --static --cflags --libs brigade: build against libbrigade.a"
if readelf -d "$tmp/pc_static" | grep -q 'NEEDED.*libbrigade'; then
    die "pc_static needs libbrigade.so"
fi
"$tmp/pc_static" || die "consumer linked with pkg-config --static"

# the bring-your-own-model example, built out of tree against the install and
# run on 2 pipeline stages with the installed launcher: bitwise one process's weights
cmake -S "$src/examples/byom" -B "$tmp/byom" -DCMAKE_PREFIX_PATH="$p" -DCMAKE_C_COMPILER="$cc" \
      -DCMAKE_BUILD_TYPE=Release > "$tmp/byom.log" 2>&1 || { cat "$tmp/byom.log"; die "examples/byom: configure"; }
cmake --build "$tmp/byom" > "$tmp/byom-build.log" 2>&1 || { cat "$tmp/byom-build.log"; die "examples/byom: build"; }
byom_args="--steps 20 --layers 1 --d-model 16 --heads 2 --seq 8 --vocab 32 --threads 1"
"$tmp/byom/train_byom" $byom_args --save "$tmp/byom1" > "$tmp/byom1.log" 2>&1 \
    || { cat "$tmp/byom1.log"; die "examples/byom: one process"; }
BRIGADE_TIMEOUT=60 timeout 120 "$p/bin/brigade" launch -n 2 -- "$tmp/byom/train_byom" $byom_args --pp 2 \
    --save "$tmp/byom2" > "$tmp/byom2.log" 2>&1 || { cat "$tmp/byom2.log"; die "examples/byom: 2 stages"; }
grep -q "^trained byom" "$tmp/byom2.log" || die "examples/byom: no summary line"
awk '/^trained byom/ { split($0, a, "loss "); split(a[2], b, " -> "); exit !(b[2] < b[1]) }' "$tmp/byom2.log" \
    || die "examples/byom: the loss did not fall: $(grep '^trained' "$tmp/byom2.log")"
verdict=$("$p/bin/brigade" compare "$tmp/byom1" "$tmp/byom2") || die "examples/byom: $verdict"
n=$(echo "$verdict" | sed -n 's/^\([0-9]*\) tensors compared: \([0-9]*\) bitwise identical.*/\1 \2/p')
[ -n "$n" ] && [ "${n% *}" = "${n#* }" ] || die "examples/byom: 2 stages differ from one process: $verdict"
echo "examples/byom out of tree: $(grep '^trained' "$tmp/byom2.log"); $verdict"
ok "install layout, find_package (shared, static) and pkg-config (shared, static) consumers, examples/byom"
finish
