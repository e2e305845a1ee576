#!/usr/bin/env bash
# test_headers: every public header compiles on its own, twice in a row
# (include guard), as strict C11 and as C++17:
#   $CC  -std=c11   -pedantic -Wall -Wextra -Werror
#   $CXX -std=c++17 -pedantic -Wall -Wextra -Werror -x c++
# Exits 77 (skipped) after the C checks when there is no C++ compiler.
set -uo pipefail
src=${BRIGADE_SOURCE_DIR:?}
cc=${BG_CC:-cc}
cxx=${BG_CXX:-}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

fail=0 n=0
for h in "$src"/include/brigade/*.h; do
    name=$(basename "$h")
    printf '#include <brigade/%s>\n#include <brigade/%s>\n' "$name" "$name" > "$tmp/t.c"
    n=$((n + 1))
    if ! out=$("$cc" -std=c11 -pedantic -Wall -Wextra -Werror -I"$src/include" -c "$tmp/t.c" -o "$tmp/t.o" 2>&1); then
        echo "FAIL (C11): brigade/$name"; echo "$out"; fail=1
    fi
    if [ -n "$cxx" ] && ! out=$("$cxx" -std=c++17 -pedantic -Wall -Wextra -Werror -I"$src/include" -x c++ -c "$tmp/t.c" -o "$tmp/t.o" 2>&1); then
        echo "FAIL (C++17): brigade/$name"; echo "$out"; fail=1
    fi
done
if [ "$n" -eq 0 ]; then
    echo "no headers found under $src/include/brigade"; exit 1
fi
[ "$fail" -eq 0 ] || exit 1
if [ -z "$cxx" ]; then
    echo "$n headers compile alone as C11; no C++ compiler, C++17 check skipped"; exit 77
fi
echo "$n headers compile alone as C11 and as C++17"
