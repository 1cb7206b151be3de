#!/usr/bin/env bash
# The Debian packages of a build, installed on this machine and removed again:
#   1. builds outboxd and liboutbox-dev from <build dir> (cpack -G DEB, into a temporary directory;
#      the build must be configured with -DCMAKE_INSTALL_PREFIX=/usr and built);
#   2. checks their control data and contents (conffile, maintainer scripts, nothing of the tests)
#      and runs lintian (fails on any error);
#   3. installs both with dpkg -i: outboxd --version and outboxctl --version from /usr/bin, the
#      user outbox, /etc/outbox mode 0750 and its config 0640 root:outbox, which outboxd refuses
#      as it is (exit 2: no database yet); systemd-analyze verify on outboxd.service and on an
#      instance of outboxd@.service (offline: systemd need not be running), and its security
#      exposure; find_package(outbox 0.2) and pkg-config from /usr, a program built with each;
#   4. dpkg -r: only the edited conffile is left; installed again, the edit is kept;
#   5. dpkg --purge: /etc/outbox is gone, and no file of either package is left.
# Root only (exit 77, skipped, otherwise); refuses to run when either package is installed
# already. Whatever happens, both packages are purged at the end, and the user outbox removed if
# this test created it.
#
#   tests/package/deb_test.sh <build dir>
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: $0 <build dir>" >&2; exit 2; }
build=$(cd "$1" && pwd)
step() { printf '== %s\n' "$*"; }
fail() { echo "deb_test: FAIL: $*" >&2; exit 1; }
skip() { echo "deb_test: SKIP: $*" >&2; exit 77; }

[ "$(id -u)" -eq 0 ] || skip "needs root (dpkg -i)"
command -v dpkg-deb >/dev/null || skip "not a Debian system (no dpkg-deb)"
prefix=$(sed -n 's/^CMAKE_INSTALL_PREFIX:[A-Z]*=//p' "$build/CMakeCache.txt")
[ "$prefix" = /usr ] ||
  skip "$build is configured with CMAKE_INSTALL_PREFIX=$prefix; the packages need /usr"
[ -f "$build/CPackConfig.cmake" ] ||
  fail "$build has no CPackConfig.cmake (BUILD_SHARED_LIBS=ON builds no packages)"
for tool in lintian systemd-analyze pkg-config; do
  command -v "$tool" >/dev/null || fail "$tool is missing: scripts/install-deps"
done
packages=(outboxd liboutbox-dev)
for package in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Abbrev}' "$package" 2>/dev/null || true)
  case $status in
    "" | "un "*) ;;
    *) fail "$package is already on this machine (dpkg status '$status'): this test installs" \
      "and purges it; remove it first (dpkg --purge $package)" ;;
  esac
done

tmp=$(mktemp -d "${TMPDIR:-/tmp}/outbox-deb-test.XXXXXX")
user_existed=no
id outbox >/dev/null 2>&1 && user_existed=yes
cleanup() {
  dpkg --purge "${packages[@]}" >/dev/null 2>&1 || true
  if [ "$user_existed" = no ] && id outbox >/dev/null 2>&1; then
    deluser --system --quiet outbox >/dev/null 2>&1 || true
    ! getent group outbox >/dev/null || delgroup --system --quiet outbox >/dev/null 2>&1 || true
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT

step "cpack -G DEB ($build)"
cpack --config "$build/CPackConfig.cmake" -G DEB -B "$tmp/debs" >"$tmp/cpack.log" 2>&1 ||
  { cat "$tmp/cpack.log"; fail "cpack"; }
version=$(sed -n 's/^set(CPACK_PACKAGE_VERSION "\(.*\)")$/\1/p' "$build/CPackConfig.cmake")
arch=$(dpkg --print-architecture)
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch)
server=$tmp/debs/outboxd_${version}_$arch.deb
dev=$tmp/debs/liboutbox-dev_${version}_$arch.deb
for deb in "$server" "$dev"; do
  [ -f "$deb" ] || { ls -l "$tmp/debs"; fail "cpack did not make $(basename "$deb")"; }
  echo "$(basename "$deb"): $(du -k "$deb" | cut -f1) KiB"
done

step "contents"
# contents <deb> <out>: the paths of its files and symlinks, without the leading ".".
contents() { dpkg-deb --fsys-tarfile "$1" | tar -t | sed -n 's|^\./|/|; /[^/]$/p' | sort >"$2"; }
contents "$server" "$tmp/outboxd.files"
contents "$dev" "$tmp/dev.files"
cat >"$tmp/outboxd.expected" <<EOF
/etc/outbox/outboxd.toml
/usr/bin/outboxctl
/usr/bin/outboxd
/usr/lib/systemd/system/outboxd.service
/usr/lib/systemd/system/outboxd@.service
/usr/share/doc/outboxd/changelog.gz
/usr/share/doc/outboxd/copyright
/usr/share/doc/outboxd/examples/outbox.example.toml
/usr/share/man/man1/outboxctl.1.gz
/usr/share/man/man8/outboxd.8.gz
EOF
diff "$tmp/outboxd.expected" "$tmp/outboxd.files" ||
  fail "outboxd holds other files than expected (above: - missing, + unexpected)"
for expected in /usr/include/outbox/store/postgres.h /usr/include/outbox/core/version.h \
  "/usr/lib/$multiarch/liboutbox_core.a" "/usr/lib/$multiarch/cmake/outbox/outboxConfig.cmake" \
  "/usr/lib/$multiarch/pkgconfig/outbox-postgres.pc" /usr/share/doc/liboutbox-dev/copyright; do
  grep -qx "$expected" "$tmp/dev.files" || fail "liboutbox-dev lacks $expected"
done
dev_paths="^/usr/include/outbox/|^/usr/share/doc/liboutbox-dev/"
dev_paths+="|^/usr/lib/$multiarch/(liboutbox_[a-z0-9_]+\.a|cmake/outbox/|pkgconfig/outbox-[a-z0-9-]+\.pc)"
if grep -Ev "$dev_paths" "$tmp/dev.files"; then
  fail "liboutbox-dev holds the files above, which it should not"
fi
if grep -Ei 'test|bench|fuzz|mock|quickstart|apps_common|outboxd_lib' "$tmp/dev.files"; then
  fail "liboutbox-dev holds the files above, which it should not"
fi
dpkg-deb --ctrl-tarfile "$server" | tar -t | sed 's|^\./||' | grep -v '^$' | sort | tr '\n' ' ' \
  >"$tmp/control"
[ "$(cat "$tmp/control")" = "conffiles control md5sums postinst postrm prerm " ] ||
  fail "outboxd's control files: $(cat "$tmp/control")"
[ "$(dpkg-deb --ctrl-tarfile "$server" | tar -xO ./conffiles)" = /etc/outbox/outboxd.toml ] ||
  fail "/etc/outbox/outboxd.toml is not outboxd's only conffile"
depends=$(dpkg-deb --field "$server" Depends)
echo "outboxd Depends: $depends"
for needed in adduser libpq5 libsystemd0; do
  [[ ", $depends," == *", $needed "* || ", $depends," == *", $needed,"* ]] ||
    fail "outboxd does not depend on $needed"
done
echo "liboutbox-dev Depends: $(dpkg-deb --field "$dev" Depends)"
echo "$(wc -l <"$tmp/outboxd.files") files in outboxd, $(wc -l <"$tmp/dev.files") in liboutbox-dev"

step "lintian"
lintian_status=0
lintian --fail-on error "$server" "$dev" >"$tmp/lintian.log" 2>&1 || lintian_status=$?
grep -v '^running with root privileges' "$tmp/lintian.log" || true
[ "$lintian_status" -eq 0 ] || fail "lintian reports errors (E: above)"
echo "lintian: $(grep -c '^E:' "$tmp/lintian.log" || true) errors," \
  "$(grep -c '^W:' "$tmp/lintian.log" || true) warnings"

step "dpkg -i"
dpkg -i "$server" "$dev" >"$tmp/dpkg.log" 2>&1 || { cat "$tmp/dpkg.log"; fail "dpkg -i"; }
/usr/bin/outboxd --version | grep -q "^outboxd $version\b" || fail "outboxd --version"
/usr/bin/outboxctl --version | grep -q "^outboxctl $version\b" || fail "outboxctl --version"
/usr/bin/outboxd --version
/usr/bin/outboxctl --version
id outbox || fail "no user outbox"
[ "$(stat -c '%a %U:%G' /etc/outbox)" = "750 root:outbox" ] ||
  fail "/etc/outbox is $(stat -c '%a %U:%G' /etc/outbox), not 750 root:outbox"
[ "$(stat -c '%a %U:%G' /etc/outbox/outboxd.toml)" = "640 root:outbox" ] ||
  fail "/etc/outbox/outboxd.toml is $(stat -c '%a %U:%G' /etc/outbox/outboxd.toml)"
echo "/etc/outbox 750 root:outbox, /etc/outbox/outboxd.toml 640 root:outbox"
# The default configuration names no database: the service would exit 2, which the unit does not
# restart (RestartPreventExitStatus=2). Read as the service's user.
check_status=0
runuser -u outbox -- /usr/bin/outboxd --config /etc/outbox/outboxd.toml --check-config \
  >"$tmp/check.log" 2>&1 || check_status=$?
cat "$tmp/check.log"
if [ "$check_status" -ne 2 ] || ! grep -q 'database.url: is required' "$tmp/check.log"; then
  fail "outboxd --check-config on the default configuration: exit $check_status, not 2"
fi

step "systemd-analyze verify (offline: systemd is not PID 1 here)"
# verify warns about unknown keys and the like without failing: any output fails the test. The
# template cannot be verified as such: an instance of it can (outboxd@verify.service).
mkdir "$tmp/units"
cp /usr/lib/systemd/system/outboxd@.service "$tmp/units/outboxd@verify.service"
for unit in /usr/lib/systemd/system/outboxd.service "$tmp/units/outboxd@verify.service"; do
  out=$(systemd-analyze verify "$unit" 2>&1) || fail "systemd-analyze verify $unit: $out"
  [ -z "$out" ] || fail "systemd-analyze verify $unit: $out"
  exposure=$(systemd-analyze security --offline=true "$unit" 2>&1 |
    sed -n 's/.*Overall exposure level for \([^:]*\): \([0-9.]*\).*/\1 \2/p')
  echo "verified $(basename "$unit"); exposure: $exposure"
  # systemd's scale: 0 (locked down) to 10; below 2 is "OK". A relay needs the network.
  awk -v e="${exposure##* }" 'BEGIN { exit !(e != "" && e < 2.0) }' ||
    fail "exposure of $(basename "$unit") is '${exposure##* }', not below 2.0"
done

step "liboutbox-dev: find_package(outbox 0.2) and pkg-config from /usr"
[ "$(pkg-config --modversion outbox-core)" = "$version" ] || fail "pkg-config outbox-core"
echo "pkg-config --modversion outbox-core: $(pkg-config --modversion outbox-core)"
mkdir "$tmp/consumer"
cat >"$tmp/consumer/CMakeLists.txt" <<'EOF'
cmake_minimum_required(VERSION 3.25)
project(outbox_deb_consumer LANGUAGES CXX)
find_package(outbox 0.2 REQUIRED COMPONENTS core)
message(STATUS "outbox ${outbox_VERSION} from ${outbox_DIR}")
add_executable(consumer main.cpp)
target_link_libraries(consumer PRIVATE outbox::core)
EOF
cat >"$tmp/consumer/main.cpp" <<'EOF'
#include <iostream>
#include "outbox/core/version.h"
int main() { std::cout << "outbox " << outbox::kVersion << "\n"; }
EOF
if ! cmake -S "$tmp/consumer" -B "$tmp/consumer/build" >"$tmp/consumer.log" 2>&1 ||
  ! cmake --build "$tmp/consumer/build" >>"$tmp/consumer.log" 2>&1; then
  cat "$tmp/consumer.log"
  fail "a project with find_package(outbox 0.2)"
fi
grep -- '-- outbox ' "$tmp/consumer.log"
[ "$("$tmp/consumer/build/consumer")" = "outbox $version" ] || fail "the consumer's output"
"$tmp/consumer/build/consumer"
cxx=$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "$build/CMakeCache.txt")
# shellcheck disable=SC2046  # the flags are words
"${cxx:-c++}" -std=c++20 -o "$tmp/consumer/pkg-config-consumer" "$tmp/consumer/main.cpp" \
  $(pkg-config --cflags --libs outbox-core) || fail "building with pkg-config outbox-core"
[ "$("$tmp/consumer/pkg-config-consumer")" = "outbox $version" ] ||
  fail "the pkg-config consumer's output"
echo "built and ran with \$(pkg-config --cflags --libs outbox-core) too"

# left <list>...: the files of the lists that exist on this machine.
left() {
  cat "$@" | while read -r file; do
    [ ! -e "$file" ] && [ ! -L "$file" ] || echo "$file"
  done
}

step "dpkg -r: the edited configuration stays, nothing else"
echo '# edited by deb_test' >>/etc/outbox/outboxd.toml
dpkg -r "${packages[@]}" >"$tmp/dpkg.log" 2>&1 || { cat "$tmp/dpkg.log"; fail "dpkg -r"; }
left "$tmp/outboxd.files" "$tmp/dev.files" >"$tmp/left"
[ "$(cat "$tmp/left")" = /etc/outbox/outboxd.toml ] ||
  fail "after dpkg -r, these are left: $(tr '\n' ' ' <"$tmp/left")"
for dir in /usr/include/outbox "/usr/lib/$multiarch/cmake/outbox" /usr/share/doc/outboxd \
  /usr/share/doc/liboutbox-dev; do
  [ ! -e "$dir" ] || fail "after dpkg -r, $dir is left"
done
dpkg-query -W -f='${Package} ${db:Status-Abbrev}\n' outboxd
echo "left: $(cat "$tmp/left")"

step "dpkg -i again: the edit is kept"
dpkg -i "$server" >"$tmp/dpkg.log" 2>&1 || { cat "$tmp/dpkg.log"; fail "dpkg -i again"; }
tail -n 1 /etc/outbox/outboxd.toml | grep -qx '# edited by deb_test' ||
  fail "the edit of /etc/outbox/outboxd.toml was lost"
[ "$(stat -c '%a %U:%G' /etc/outbox/outboxd.toml)" = "640 root:outbox" ] ||
  fail "/etc/outbox/outboxd.toml is $(stat -c '%a %U:%G' /etc/outbox/outboxd.toml) after reinstall"
echo "kept: $(tail -n 1 /etc/outbox/outboxd.toml)"

step "dpkg --purge: nothing is left"
dpkg --purge "${packages[@]}" >"$tmp/dpkg.log" 2>&1 || { cat "$tmp/dpkg.log"; fail "dpkg --purge"; }
[ ! -e /etc/outbox ] || fail "/etc/outbox is left after purge: $(ls -A /etc/outbox)"
left "$tmp/outboxd.files" "$tmp/dev.files" >"$tmp/left"
[ ! -s "$tmp/left" ] || fail "after purge, these are left: $(tr '\n' ' ' <"$tmp/left")"
for state in /var/lib/systemd/deb-systemd-helper-enabled/outboxd*; do
  [ ! -e "$state" ] || fail "deb-systemd-helper's state $state is left after purge"
done
for package in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Abbrev}' "$package" 2>/dev/null || true)
  case $status in "" | "un "*) ;; *) fail "$package is '$status' after purge" ;; esac
done
echo "no file of either package, no /etc/outbox; the user outbox stays (Debian leaves system" \
  "users; this test removes it at exit if it made it)"

step "PASS"
