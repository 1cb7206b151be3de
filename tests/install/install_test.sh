#!/usr/bin/env bash
# outbox used as an installed library, from outside the source tree:
#   1. installs <build dir> into a fresh temporary prefix (cmake --install);
#   2. checks that the prefix holds the programs, headers, CMake package and pkg-config files, and
#      nothing of the tests, benchmarks, examples or test tools;
#   3. configures and builds tests/install/consumer (find_package(outbox 0.2 COMPONENTS postgres))
#      in a temporary directory, with -DCMAKE_PREFIX_PATH=<prefix>, and runs it;
#   4. builds the same main.cpp with the compiler and `pkg-config outbox-postgres`, and runs it.
# Each run enqueues one message into the real PostgreSQL in a transaction, reads it back and drops
# its schema. Exits non-zero on any failure; removes its temporary files.
#
#   tests/install/install_test.sh <build dir> [conninfo]   (default: $OUTBOX_TEST_PG_URL)
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 <build dir> [conninfo]" >&2; exit 2; }
build=$(cd "$1" && pwd)
conninfo=${2:-${OUTBOX_TEST_PG_URL:-}}
[ -n "$conninfo" ] || { echo "install_test: no conninfo (argument or OUTBOX_TEST_PG_URL)" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)

# The build's own compiler, so that the consumer has the same standard library and ABI.
cxx=$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "$build/CMakeCache.txt")
cxx=${cxx:-c++}
shared=$(sed -n 's/^BUILD_SHARED_LIBS:[A-Z]*=//p' "$build/CMakeCache.txt")
libdir=$(sed -n 's/^CMAKE_INSTALL_LIBDIR:[A-Z]*=//p' "$build/CMakeCache.txt")
libdir=${libdir:-lib}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/outbox-install-test.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix
step() { printf '== %s\n' "$*"; }
fail() { echo "install_test: FAIL: $*" >&2; exit 1; }

step "cmake --install $build --prefix $prefix"
cmake --install "$build" --prefix "$prefix" >"$tmp/install.log" 2>&1 ||
  { cat "$tmp/install.log"; fail "cmake --install"; }

step "what is installed"
(cd "$prefix" && find . -type f -o -type l) | sed 's|^\./||' | sort >"$tmp/installed"
for expected in bin/outboxd bin/outboxctl include/outbox/store/postgres.h \
  include/outbox/core/version.h $libdir/cmake/outbox/outboxConfig.cmake \
  $libdir/cmake/outbox/outboxConfigVersion.cmake $libdir/cmake/outbox/outboxTargets.cmake \
  $libdir/pkgconfig/outbox-core.pc $libdir/pkgconfig/outbox-postgres.pc; do
  grep -qx "$expected" "$tmp/installed" || fail "$expected is not installed"
done
# Only outboxd and outboxctl are programs; no test, benchmark, example or fuzz target, no test
# tool, no test support library.
programs=$(grep '^bin/' "$tmp/installed" | tr '\n' ' ')
[ "$programs" = "bin/outboxctl bin/outboxd " ] || fail "programs installed: $programs"
if grep -Ei 'test|bench|fuzz|example|mock|quickstart|apps_common|outboxd_lib' "$tmp/installed"; then
  fail "the above should not be installed"
fi
echo "$(wc -l <"$tmp/installed") files: $(grep -c '^include/' "$tmp/installed") headers," \
  "$(grep -c "^$libdir/liboutbox_" "$tmp/installed") library files," \
  "$(grep -c "^$libdir/pkgconfig/" "$tmp/installed") pkg-config files, 2 programs"

step "consumer with CMake: find_package(outbox 0.2 REQUIRED COMPONENTS postgres)"
cp -r "$here/consumer" "$tmp/src"
cmake -S "$tmp/src" -B "$tmp/cmake-build" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_CXX_COMPILER="$cxx" >"$tmp/consumer.log" 2>&1 ||
  { cat "$tmp/consumer.log"; fail "configuring the consumer"; }
cmake --build "$tmp/cmake-build" >>"$tmp/consumer.log" 2>&1 ||
  { cat "$tmp/consumer.log"; fail "building the consumer"; }
# A shared build's libraries are not on the loader's path: the prefix is temporary.
if [[ "$shared" =~ ^(ON|on|1|TRUE|true|YES|yes)$ ]]; then
  export LD_LIBRARY_PATH=$prefix/$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
"$tmp/cmake-build/outbox_consumer" "$conninfo" || fail "the CMake consumer"

step "consumer with pkg-config: $cxx -std=c++20 main.cpp \$(pkg-config --cflags --libs outbox-postgres)"
flags=$(PKG_CONFIG_PATH=$prefix/$libdir/pkgconfig pkg-config --cflags --libs outbox-postgres) ||
  fail "pkg-config outbox-postgres"
echo "pkg-config: $flags"
# shellcheck disable=SC2086  # the flags are words
"$cxx" -std=c++20 -o "$tmp/pkg-config-consumer" "$tmp/src/main.cpp" $flags ||
  fail "building the consumer with pkg-config"
"$tmp/pkg-config-consumer" "$conninfo" || fail "the pkg-config consumer"

step "PASS"
