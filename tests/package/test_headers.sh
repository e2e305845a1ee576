#!/usr/bin/env bash
# test_headers: every public header compiles on its own, twice in a row
# (include guard), as strict C11 and as C++17:
#   $CC  -std=c11   -pedantic -Wall -Wextra -Werror
#   $CXX -std=c++17 -pedantic -Wall -Wextra -Werror -x c++
# and every *_INIT default initialises its struct, as C11 and as C++20.
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

# Every *_INIT default initialises its struct (named by the sizeof() inside it)
# with every field designated: C11 and C++20 (designated initializers; -Wextra
# reports a field left out), so a field added to a struct without its default
# fails here.
awk '/^#define BG_[A-Z0-9_]*_INIT[ \\]/ { name = $2; text = ""; on = 1 }
     on { text = text $0; if ($0 !~ /\\$/) { on = 0; if (match(text, /sizeof\([a-z0-9_]+\)/))
          print name, substr(text, RSTART + 7, RLENGTH - 8) } }' "$src"/include/brigade/*.h > "$tmp/inits"
ninit=$(wc -l < "$tmp/inits")
[ "$ninit" -ge 10 ] || die "found only $ninit *_INIT macros in the headers (the awk reading them is broken?)"
{
    echo '#include <brigade/brigade.h>'
    while read -r name type; do echo "$type v_$name = $name;"; done < "$tmp/inits"
    echo 'int bgt_inits(void);'
    echo 'int bgt_inits(void) { return 0; }'
} > "$tmp/inits.c"
if ! out=$("$cc" -std=c11 -pedantic -Wall -Wextra -Werror -Wmissing-field-initializers -I"$src/include" -c "$tmp/inits.c" -o "$tmp/i.o" 2>&1); then
    bad "(C11) the *_INIT defaults"; echo "$out"
fi
if [ -n "$cxx" ] && ! out=$("$cxx" -std=c++20 -pedantic -Wall -Wextra -Werror -I"$src/include" -x c++ -c "$tmp/inits.c" -o "$tmp/i.o" 2>&1); then
    bad "(C++20) the *_INIT defaults"; echo "$out"
fi
[ "$fails" -eq 0 ] || finish
[ -n "$cxx" ] || skip "$n headers compile alone as C11, $ninit *_INIT defaults; no C++ compiler, C++ checks skipped"
ok "$n headers compile alone as C11 and as C++17; $ninit *_INIT defaults initialise their structs in C11 and C++20"
finish
