#!/usr/bin/env bash
# C and C++ clients of the C ABI, run by `make test-c`:
#   1. the header compiles as C11 and as C++17 (-Werror), included twice, and matches the
#      contract's signatures (tests/c/header_c.c, tests/c/header_cpp.cc);
#   2. the C client test (tests/c/client.c and the client_*.c files it runs) runs under
#      AddressSanitizer with LeakSanitizer;
#   3. every function include/mlxkern.h declares is called by the client test.
# Environment: CC, CXX (compilers), LIBDIR (folder holding libmlxkern.so / .dylib), BUILD
# (output folder). Needs only gcc/g++ (or clang), sed and grep.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CC=${CC:-cc}
CXX=${CXX:-c++}
LIBDIR=${LIBDIR:-$ROOT/target/debug}
BUILD=${BUILD:-$ROOT/build}
OUT=$BUILD/c
SRC=$ROOT/tests/c
mkdir -p "$OUT"

case "$(uname -s)" in
  Darwin) LIB=$LIBDIR/libmlxkern.dylib ;;
  *) LIB=$LIBDIR/libmlxkern.so ;;
esac
if [ ! -f "$LIB" ]; then
  echo "tests/c: $LIB not found: build the library first (cargo build --lib)" >&2
  exit 1
fi

INCLUDE=(-I"$ROOT/include" -I"$ROOT/examples/common")
LINK=(-L"$LIBDIR" -lmlxkern -Wl,-rpath,"$LIBDIR")
WARN=(-Wall -Wextra -Werror -pedantic -Wredundant-decls)
CLIENT=("$SRC/client.c" "$SRC/client_util.c" "$SRC/client_arrays.c" "$SRC/client_gated_delta.c"
  "$SRC/client_pool.c" "$SRC/client_norms.c" "$SRC/client_host.c")

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

# 1. Header checks.
"$CC" -std=c11 "${WARN[@]}" -Wstrict-prototypes "${INCLUDE[@]}" "$SRC/header_c.c" "${LINK[@]}" \
  -o "$OUT/header_c" || fail "include/mlxkern.h as C11"
"$OUT/header_c" >/dev/null || fail "header_c run"
echo "PASS: include/mlxkern.h compiles as C11 (-Wall -Wextra -Werror -pedantic), twice included"

"$CXX" -std=c++17 "${WARN[@]}" -Wold-style-cast "${INCLUDE[@]}" "$SRC/header_cpp.cc" "${LINK[@]}" \
  -o "$OUT/header_cpp" || fail "include/mlxkern.h as C++17"
"$OUT/header_cpp" >/dev/null || fail "header_cpp run"
echo "PASS: include/mlxkern.h compiles as C++17 (-Wall -Wextra -Werror -pedantic -Wold-style-cast)," \
  "twice included; signatures match the contract"

# 2. The client under AddressSanitizer + LeakSanitizer.
"$CC" -std=c11 "${WARN[@]}" -g -O1 -fsanitize=address -fno-omit-frame-pointer -pthread \
  "${INCLUDE[@]}" "${CLIENT[@]}" "${LINK[@]}" -lm -o "$OUT/client" || fail "client build"

asan_options=detect_leaks=1:halt_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1
if [ "$(uname -s)" = Darwin ]; then
  asan_options=${asan_options/detect_leaks=1/detect_leaks=0}  # LeakSanitizer is Linux-only here
  echo "note: LeakSanitizer is not available on macOS; running under ASan only"
fi
lsan_options=${LSAN_OPTIONS:-}
if [ -f "$SRC/lsan.supp" ]; then
  lsan_options="suppressions=$SRC/lsan.supp:print_suppressions=1${lsan_options:+:$lsan_options}"
fi
log=$OUT/client.log
if ! ASAN_OPTIONS=$asan_options LSAN_OPTIONS=$lsan_options "$OUT/client" >"$log" 2>&1; then
  cat "$log" >&2
  fail "client under AddressSanitizer/LeakSanitizer"
fi
if grep -q "Sanitizer" "$log"; then
  cat "$log" >&2
  fail "sanitizer report in the client's output"
fi
echo "PASS: $(tail -n 1 "$log") under ASan + LSan (no errors, no leaks)"

# 3. Every function the header declares is called by the client.
functions=$(sed -n 's/^[A-Za-z_][A-Za-z0-9_ *]*[ *]\(mlxk_[a-z0-9_]*\)(.*/\1/p' \
  "$ROOT/include/mlxkern.h" | sort -u)
[ -n "$functions" ] || fail "no mlxk_ functions found in include/mlxkern.h"
missing=()
for function in $functions; do
  grep -q "\\b$function(" "${CLIENT[@]}" || missing+=("$function")
done
[ ${#missing[@]} -eq 0 ] || fail "declared in include/mlxkern.h but never called by the client test (tests/c/client*.c): ${missing[*]}"
echo "PASS: all $(echo "$functions" | wc -l | tr -d ' ') functions of include/mlxkern.h are called by the client"
