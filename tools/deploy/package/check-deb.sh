#!/usr/bin/env bash
# Installs AccessoryHost's Debian packages on this machine as a user would (`apt-get install
# ./….deb`, Depends from Debian's archive), checks what they put where and accessoryhost's size,
# runs the executables with the Swift toolchain out of reach, verifies iapd's units with
# systemd-analyze, then removes and purges the packages and finds nothing of them left. Run as
# root, on a machine where the packages are not installed (the check removes them).
#
# Usage: tools/deploy/package/check-deb.sh ACCESSORYHOST.deb [ACCESSORYHOST-BENCH.deb]
#   (the paths tools/deploy/package/deb.sh prints last)
# Exit status: 0 passed, 1 a check failed (what and why on stderr), 64 usage error, 77 not root.
set -euo pipefail
PACKAGE=accessoryhost
BENCH_PACKAGE=accessoryhost-bench
# accessoryhost's bounds (issue 50): what a user adding it to an embedded image or a station on
# a production line pays. Its one executable carries the Swift runtime; the bench's Foundation
# and ICU's data are in accessoryhost-bench.
MAX_INSTALLED_KIB=$((30 * 1024))
MAX_DEB_BYTES=10000000

[ $# -eq 1 ] || [ $# -eq 2 ] || { echo "usage: tools/deploy/package/check-deb.sh ACCESSORYHOST.deb [ACCESSORYHOST-BENCH.deb]" >&2; exit 64; }
deb=$(readlink -f "$1")   # before the cd below: a path relative to where it was run
[ -f "$deb" ] || { echo "check-deb: no such file: $1 (build it with tools/deploy/package/deb.sh)" >&2; exit 64; }
bench_deb=""
if [ $# -eq 2 ]; then
    bench_deb=$(readlink -f "$2")
    [ -f "$bench_deb" ] || { echo "check-deb: no such file: $2 (build it with tools/deploy/package/deb.sh)" >&2; exit 64; }
fi
packages=("$PACKAGE")
[ -z "$bench_deb" ] || packages+=("$BENCH_PACKAGE")
cd "$(dirname "$0")/../../.."
[ "$(id -u)" -eq 0 ] || { echo "check-deb: installing a package needs root; run it as root" >&2; exit 77; }
for package in "${packages[@]}"; do
    if dpkg-query -W -f='${Status}' "$package" 2> /dev/null | grep -qv "not-installed"; then
        echo "check-deb: $package is installed on this machine; this check would remove it (apt-get purge $package first)" >&2
        exit 1
    fi
done

fail() { echo "check-deb: $*" >&2; exit 1; }
ok() { echo "check-deb: ok: $*"; }
work=$(mktemp -d)
installed=0
cleanup() {
    [ "$installed" -eq 0 ] || apt-get purge -y -qq "${packages[@]}" > /dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT

# The toolchain's runtime libraries (libswiftCore, Foundation, Dispatch: usr/lib/swift beside
# its bin), to put out of reach below.
runtime=""
if swift_path=$(command -v swift 2> /dev/null); then
    runtime=$(readlink -f "$(dirname "$(readlink -f "$swift_path")")/../lib/swift")
    [ -d "$runtime" ] && [ "$runtime" != / ] || runtime=""
fi
# Names that would be the package's anywhere, before it is installed: what the purge must not
# leave beyond these.
leftovers() { find /etc /usr /var/lib -xdev \( -name "*$PACKAGE*" -o -name "iapd*" -o -name "*iapctl*" -o -name "*iapbench*" \) 2> /dev/null | sort; }
leftovers > "$work/before"

export DEBIAN_FRONTEND=noninteractive
installed=1   # from here on, a failure purges whatever got installed
debs=("$deb")
[ -z "$bench_deb" ] || debs+=("$bench_deb")
apt-get install -y -qq "${debs[@]}" > "$work/install.log" 2>&1 || { cat "$work/install.log" >&2; fail "apt-get install ${debs[*]} failed (above)"; }
ok "apt-get install $(for d in "${debs[@]}"; do basename "$d"; done | tr '\n' ' ')"

# accessoryhost's size, installed and as a file.
installed_kib=$(dpkg-query -W -f='${Installed-Size}' "$PACKAGE")
deb_bytes=$(stat -c %s "$deb")
[ "$installed_kib" -le "$MAX_INSTALLED_KIB" ] || fail "$PACKAGE installs $((installed_kib / 1024)) MiB, more than its bound of $((MAX_INSTALLED_KIB / 1024)) MiB"
[ "$deb_bytes" -le "$MAX_DEB_BYTES" ] || fail "$(basename "$deb") is $deb_bytes bytes, more than its bound of $MAX_DEB_BYTES"
ok "$PACKAGE installs $installed_kib KiB (bound $MAX_INSTALLED_KIB), its .deb is $deb_bytes bytes (bound $MAX_DEB_BYTES)"

# Every file in its place; the conffile and the group.
[ "$(readlink /usr/bin/iapd)" = iapctl ] || fail "/usr/bin/iapd is not a link to iapctl (it is $(ls -l /usr/bin/iapd))"
for path in /usr/bin/iapctl /usr/bin/iapd \
    /usr/share/man/man1/iapctl.1.gz /usr/share/man/man1/iapd.1.gz \
    /usr/share/bash-completion/completions/iapctl /usr/share/zsh/vendor-completions/_iapctl \
    /usr/share/fish/vendor_completions.d/iapctl.fish \
    /usr/lib/udev/rules.d/70-mfi-accessory.rules /usr/lib/udev/rules.d/72-mfi-accessory-iapd.rules \
    /usr/lib/systemd/system/iapd.service /usr/lib/systemd/system/iapd.socket \
    /usr/lib/sysusers.d/iapd.conf /usr/lib/tmpfiles.d/iapd.conf /etc/iapd.conf \
    /usr/share/doc/$PACKAGE/copyright /usr/share/doc/$PACKAGE/changelog.gz; do
    [ -e "$path" ] || fail "the package installed no $path"
done
if [ -n "$bench_deb" ]; then
    for path in /usr/bin/iapbench /usr/share/man/man1/iapbench.1.gz /usr/share/bash-completion/completions/iapbench \
        /usr/share/doc/$BENCH_PACKAGE/copyright /usr/share/doc/$BENCH_PACKAGE/changelog.gz; do
        [ -e "$path" ] || fail "$BENCH_PACKAGE installed no $path"
    done
fi
[ -z "$(dpkg-query -L "$PACKAGE" | grep iapbench)" ] || fail "$PACKAGE holds iapbench's files: $(dpkg-query -L "$PACKAGE" | grep iapbench | tr '\n' ' ')"
grep -q "ExecStart=/usr/bin/iapd " /usr/lib/systemd/system/iapd.service || fail "iapd.service does not start /usr/bin/iapd"
dpkg-query -W -f='${Conffiles}\n' "$PACKAGE" | grep -q "^ /etc/iapd.conf " || fail "/etc/iapd.conf is not a conffile"
getent group iapd > /dev/null || fail "the postinst made no group iapd"
ok "files in place, /etc/iapd.conf a conffile, the group iapd"

# The Swift runtime linked in: nothing from the toolchain in the executables' libraries.
executables=(iapctl)
[ -z "$bench_deb" ] || executables+=(iapbench)
for name in "${executables[@]}"; do
    if ldd "/usr/bin/$name" | grep -qE 'libswift|libFoundation|libdispatch|libBlocksRuntime'; then
        ldd "/usr/bin/$name" >&2
        fail "/usr/bin/$name needs the Swift toolchain's libraries (ldd above)"
    fi
done
ok "ldd /usr/bin/iapctl: $(ldd /usr/bin/iapctl | awk '{ print $1 }' | tr '\n' ' ')"

# Run with the toolchain out of PATH and LD_LIBRARY_PATH, and (where a private mount namespace
# can be made) its runtime libraries hidden under an empty tmpfs, so that nothing can load them.
clean=(env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME="$work" LANG=C.UTF-8)
hide=0
[ -n "$runtime" ] && unshare -m true 2> /dev/null && hide=1
run_without_toolchain() { # run_without_toolchain COMMAND…: standard output kept in $work/out
    if [ "$hide" -eq 1 ]; then
        unshare -m sh -c 'mount -t tmpfs none "$0" && exec "$@"' "$runtime" "${clean[@]}" "$@" > "$work/out"
    else
        "${clean[@]}" "$@" > "$work/out"
    fi
}
hidden="out of LD_LIBRARY_PATH"
if "${clean[@]}" sh -c 'command -v swift' > /dev/null; then
    hidden="$hidden (swift itself is in /usr/bin)"
else
    hidden="$hidden and PATH"
fi
[ "$hide" -eq 1 ] && hidden="$hidden, its runtime $runtime hidden"
[ "$hide" -eq 1 ] || [ -z "$runtime" ] || echo "check-deb: cannot make a private mount namespace here; the runtime in $runtime stays visible (ldd above shows it is not used)" >&2
run_without_toolchain /usr/bin/iapd --version || fail "/usr/bin/iapd --version failed without the toolchain"
grep -qE '^[0-9]+\.[0-9]+\.[0-9]+' "$work/out" || fail "/usr/bin/iapd --version printed '$(cat "$work/out")'"
ok "/usr/bin/iapd --version: $(cat "$work/out") (toolchain $hidden)"
run_without_toolchain /usr/bin/iapd --help || fail "/usr/bin/iapd --help failed without the toolchain"
grep -q "accessory daemon" "$work/out" || fail "/usr/bin/iapd (a link to iapctl) is not the daemon: its --help says $(head -n 1 "$work/out")"
ok "/usr/bin/iapd, a link to iapctl, is the daemon"
if [ -n "$bench_deb" ]; then
    run_without_toolchain /usr/bin/iapbench --version || fail "/usr/bin/iapbench --version failed without the toolchain"
    ok "/usr/bin/iapbench --version: $(cat "$work/out")"
fi
run_without_toolchain /usr/bin/iapctl --direct --simulate list || fail "/usr/bin/iapctl --simulate list failed without the toolchain"
grep -q "Multi Sensor" "$work/out" || fail "/usr/bin/iapctl --simulate list did not list the simulated accessory: $(cat "$work/out")"
ok "/usr/bin/iapctl --simulate list: $(head -n 1 "$work/out" | tr -s ' ')"
head -c 1048576 /dev/urandom > "$work/image"
run_without_toolchain /usr/bin/iapctl --direct --simulate send com.example.echo "$work/image" --verify-echo \
    || fail "/usr/bin/iapctl --simulate send --verify-echo failed without the toolchain"
ok "/usr/bin/iapctl --simulate send --verify-echo: 1 MiB echoed byte for byte"
MANPAGER=cat man -P cat iapctl 2> /dev/null | grep -q "iapctl" || fail "man iapctl shows nothing"
ok "man iapctl"

# iapd's units as systemd reads them (offline: no running systemd needed).
systemd-analyze verify /usr/lib/systemd/system/iapd.socket /usr/lib/systemd/system/iapd.service > "$work/verify.log" 2>&1 \
    || { cat "$work/verify.log" >&2; fail "systemd-analyze verify found problems in iapd's units (above)"; }
if [ -s "$work/verify.log" ]; then cat "$work/verify.log" >&2; fail "systemd-analyze verify warned about iapd's units (above)"; fi
ok "systemd-analyze verify iapd.socket iapd.service"

# Remove: the executables go, the changed conffile stays; purge: nothing of the package is left.
for package in "${packages[@]}"; do dpkg-query -L "$package"; done > "$work/files"
echo "# changed by the check" >> /etc/iapd.conf
apt-get remove -y -qq "${packages[@]}" > "$work/remove.log" 2>&1 || { cat "$work/remove.log" >&2; fail "apt-get remove failed (above)"; }
{ [ ! -e /usr/bin/iapd ] && [ ! -L /usr/bin/iapd ]; } || fail "apt-get remove left /usr/bin/iapd"
[ -e /etc/iapd.conf ] || fail "apt-get remove took the changed /etc/iapd.conf (a conffile stays until purge)"
ok "apt-get remove: executables gone, /etc/iapd.conf kept"
apt-get purge -y -qq "${packages[@]}" > "$work/purge.log" 2>&1 || { cat "$work/purge.log" >&2; fail "apt-get purge failed (above)"; }
installed=0
left=()
while read -r path; do
    [ -d "$path" ] && continue          # shared directories (/usr/bin) stay
    [ -e "$path" ] || [ -L "$path" ] && left+=("$path")
done < "$work/files"
for path in /etc/iapd.conf /etc/systemd/system/sockets.target.wants/iapd.socket /usr/share/doc/$PACKAGE /usr/share/doc/$BENCH_PACKAGE \
    /var/lib/systemd/deb-systemd-helper-enabled/iapd.socket.dsh-also /run/iapd; do
    [ -e "$path" ] || [ -L "$path" ] && left+=("$path")
done
while read -r path; do left+=("$path"); done < <(leftovers | comm -13 "$work/before" -)
[ ${#left[@]} -eq 0 ] || fail "apt-get purge left: ${left[*]}"
for package in "${packages[@]}"; do
    ! dpkg-query -W -f='${Status}' "$package" 2> /dev/null | grep -q "config-files\|installed" || fail "dpkg still knows $package after purge"
done
ok "apt-get purge: nothing of the package left (the group iapd stays, as Debian leaves system groups)"
echo "check-deb: passed"
