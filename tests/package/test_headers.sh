#!/usr/bin/env bash
# test_headers: every public header compiles on its own, twice in a row
# (include guard), as strict C11 and as C++17:
#   $CC  -std=c11   -pedantic -Wall -Wextra -Werror
#   $CXX -std=c++17 -pedantic -Wall -Wextra -Werror -x c++
# Exits 77 (skipped) after the C checks when there is no C++ compiler.
set -o pipefail
HARNESS_NO_BRIGADE=1
. "$(dirname "$0")/../lib/harness.sh"
src=${BRIGADE_SOURCE_DIR:?}
cc=${BG_CC:-cc}
cxx=${BG_CXX:-}
tmp=$T

n=0
for h in "$src"/include/brigade/*.h; do
    name=$(basename "$h")
    printf '#include <brigade/%s>\n#include <brigade/%s>\n' "$name" "$name" > "$tmp/t.c"
    n=$((n + 1))
    if ! out=$("$cc" -std=c11 -pedantic -Wall -Wextra -Werror -I"$src/include" -c "$tmp/t.c" -o "$tmp/t.o" 2>&1); then
        bad "(C11) brigade/$name"; echo "$out"
    fi
    if [ -n "$cxx" ] && ! out=$("$cxx" -std=c++17 -pedantic -Wall -Wextra -Werror -I"$src/include" -x c++ -c "$tmp/t.c" -o "$tmp/t.o" 2>&1); then
        bad "(C++17) brigade/$name"; echo "$out"
    fi
done
[ "$n" -gt 0 ] || die "no headers found under $src/include/brigade"
[ "$fails" -eq 0 ] || finish
[ -n "$cxx" ] || skip "$n headers compile alone as C11; no C++ compiler, C++17 check skipped"
ok "$n headers compile alone as C11 and as C++17"
finish
