#!/usr/bin/env bash
# Installs AccessoryHost's tools for people: the executables (release build), their man pages and
# shell completions (generated from the same command specs as their help), and the udev rules;
# or removes exactly what it installed.
#
# Usage: tools/install.sh [--prefix DIR] [--uninstall] [--no-build] [--no-udev] [--system-files]
#   --prefix DIR  where to install (default /usr/local): DIR/bin, DIR/share/man/man1,
#                 DIR/share/bash-completion/completions, DIR/share/zsh/site-functions,
#                 DIR/share/fish/vendor_completions.d
#   --system-files  also the files that belong to the whole system, outside the prefix: the
#                 udev rules, iapd's systemd units, sysusers and tmpfiles entries and
#                 /etc/iapd.conf. The default with a system prefix (/usr, /usr/local); any
#                 other prefix (e.g. ~/.local) gets nothing outside it unless asked for
#   --no-system-files  none of them, whatever the prefix
#   --uninstall   remove what an install with the same prefix (and DESTDIR) put there
#   --no-build    install what .build/release holds (built before)
#   --bin DIR     with --no-build: take the executables from DIR instead of .build/release
#   --no-udev     leave the udev rules out (they go to /etc/udev/rules.d, outside the prefix)
#                 while installing the other system files
#   --plugdev     also install the plugdev rule (machines without a seat: servers, SSH)
# DESTDIR (environment) is prepended to every path, for packaging: DESTDIR=/tmp/stage.
# Exit status: 0 done, 64 usage error, 1 the build or a copy failed.
set -euo pipefail
cd "$(dirname "$0")/.."

# Every executable installed; one that is not built (yet) is skipped with a note.
EXECUTABLES=(iapctl iapbench iapd)
# Files shipped beside them when they exist in the checkout.
UDEV_RULES_DIR=rules.d          # *.rules → /etc/udev/rules.d, but for the optional ones:
UDEV_OPTIONAL=(71-mfi-accessory-plugdev.rules)   # only with --plugdev
UDEV_WITH_IAPD=(72-mfi-accessory-iapd.rules)     # only when iapd is installed
# The daemon's files (docs/DAEMON.md), when iapd is installed: *.service and *.socket →
# /etc/systemd/system (@BINDIR@ → PREFIX/bin), NAME.sysusers → /usr/lib/sysusers.d/NAME.conf,
# NAME.tmpfiles → /usr/lib/tmpfiles.d/NAME.conf, NAME.conf.example → /etc/NAME.conf (never over
# one that is there).
SYSTEMD_DIR=tools/deploy/systemd

prefix=/usr/local
bin=.build/release
uninstall=0
build=1
udev=1
plugdev=0
system_files=auto
while [ $# -gt 0 ]; do
    case "$1" in
        --prefix) [ $# -ge 2 ] || { echo "install: --prefix needs a directory" >&2; exit 64; }; prefix=$2; shift 2 ;;
        --prefix=*) prefix=${1#--prefix=}; shift ;;
        --uninstall) uninstall=1; shift ;;
        --no-build) build=0; shift ;;
        --no-udev) udev=0; shift ;;
        --plugdev) plugdev=1; shift ;;
        --bin) [ $# -ge 2 ] || { echo "install: --bin needs a directory" >&2; exit 64; }; bin=$2; shift 2 ;;
        --system-files) system_files=1; shift ;;
        --no-system-files) system_files=0; shift ;;
        -h|--help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "install: unknown argument '$1'; see tools/install.sh --help" >&2; exit 64 ;;
    esac
done
case "$prefix" in /*) ;; *) echo "install: --prefix must be an absolute path (got '$prefix')" >&2; exit 64 ;; esac
# Files outside the prefix only for a system prefix, or when asked: a user's prefix
# (~/.local) must not write to /etc or /usr/lib.
if [ "$system_files" = auto ]; then
    case "${prefix%/}" in /usr|/usr/local) system_files=1 ;; *) system_files=0 ;; esac
fi
[ "$system_files" -eq 1 ] || udev=0
root=${DESTDIR:-}
bindir=$root$prefix/bin
mandir=$root$prefix/share/man/man1
bashdir=$root$prefix/share/bash-completion/completions
zshdir=$root$prefix/share/zsh/site-functions
fishdir=$root$prefix/share/fish/vendor_completions.d
udevdir=$root/etc/udev/rules.d
systemddir=$root/etc/systemd/system
sysusersdir=$root/usr/lib/sysusers.d
tmpfilesdir=$root/usr/lib/tmpfiles.d
etcdir=$root/etc

# The daemon's files: one "source target" per line.
daemon_files() {
    [ -d "$SYSTEMD_DIR" ] || return 0
    local file base
    for file in "$SYSTEMD_DIR"/*; do
        base=$(basename "$file")
        case "$base" in
            *.service|*.socket) echo "$file $systemddir/$base" ;;
            *.sysusers) echo "$file $sysusersdir/${base%.sysusers}.conf" ;;
            *.tmpfiles) echo "$file $tmpfilesdir/${base%.tmpfiles}.conf" ;;
            *.conf.example) echo "$file $etcdir/${base%.example}" ;;
        esac
    done
}

# The files each executable gets, relative to the directories above.
files_of() { # files_of NAME: one "directory file" per line
    echo "$bindir $1"
    echo "$mandir $1.1"
    echo "$bashdir $1"
    echo "$zshdir _$1"
    echo "$fishdir $1.fish"
}

if [ "$uninstall" -eq 1 ]; then
    for name in "${EXECUTABLES[@]}"; do
        while read -r dir file; do
            if [ -e "$dir/$file" ]; then rm -f "$dir/$file"; echo "removed $dir/$file"; fi
        done < <(files_of "$name")
    done
    if [ "$udev" -eq 1 ] && [ -d "$UDEV_RULES_DIR" ]; then
        for rule in "$UDEV_RULES_DIR"/*.rules; do
            target=$udevdir/$(basename "$rule")
            if [ -e "$target" ]; then rm -f "$target"; echo "removed $target"; fi
        done
    fi
    [ "$system_files" -eq 1 ] || exit 0
    while read -r source target; do
        [ -e "$target" ] || continue
        # A configuration someone changed stays.
        if [[ $source == *.conf.example ]] && ! cmp -s "$source" "$target"; then echo "kept $target (changed)"; continue; fi
        rm -f "$target"
        echo "removed $target"
    done < <(daemon_files)
    exit 0
fi

if [ "$build" -eq 1 ]; then
    tools/ensure-deps.sh
    # The Swift runtime linked in statically: what is installed keeps working without the
    # toolchain (or with another version of it) on PATH.
    echo "install: building (tools/deploy/package/release-build.sh, a release build; the first takes a few minutes)" >&2
    if ! tools/deploy/package/release-build.sh "${EXECUTABLES[@]}" > /dev/null; then
        echo "install: the release build failed (above)" >&2
        exit 1
    fi
fi
installed=0
for name in "${EXECUTABLES[@]}"; do
    if [ ! -x "$bin/$name" ]; then
        echo "install: $name is not built; skipped" >&2
        continue
    fi
    install -d "$bindir" "$mandir" "$bashdir" "$zshdir" "$fishdir"
    install -m 755 "$bin/$name" "$bindir/$name"
    # Generated by the binary from its command specs: the same text as its --help.
    "$bin/$name" --generate-man-page > "$mandir/$name.1"
    "$bin/$name" --generate-completion-script bash > "$bashdir/$name"
    "$bin/$name" --generate-completion-script zsh > "$zshdir/_$name"
    "$bin/$name" --generate-completion-script fish > "$fishdir/$name.fish"
    chmod 644 "$mandir/$name.1" "$bashdir/$name" "$zshdir/_$name" "$fishdir/$name.fish"
    echo "installed $name: $bindir/$name, $mandir/$name.1, completions for bash, zsh and fish"
    installed=$((installed + 1))
done
[ "$installed" -gt 0 ] || { echo "install: nothing was built in $bin; run without --no-build" >&2; exit 1; }
with_iapd=0
[ -x "$bindir/iapd" ] && [ -x "$bin/iapd" ] && with_iapd=1
if [ "$udev" -eq 1 ] && [ -d "$UDEV_RULES_DIR" ]; then
    install -d "$udevdir"
    for rule in "$UDEV_RULES_DIR"/*.rules; do
        name=$(basename "$rule")
        if [ "$plugdev" -eq 0 ] && [[ " ${UDEV_OPTIONAL[*]} " == *" $name "* ]]; then continue; fi
        if [ "$with_iapd" -eq 0 ] && [[ " ${UDEV_WITH_IAPD[*]} " == *" $name "* ]]; then continue; fi
        install -m 644 "$rule" "$udevdir/"
        echo "installed $udevdir/$name"
    done
    if [ -z "$root" ] && command -v udevadm > /dev/null && [ -d /run/udev ]; then
        udevadm control --reload-rules && udevadm trigger --subsystem-match=usb || true
    fi
fi
if [ "$with_iapd" -eq 1 ] && [ "$system_files" -eq 1 ]; then
    while read -r source target; do
        install -d "$(dirname "$target")"
        if [[ $source == *.conf.example ]] && [ -e "$target" ]; then echo "kept $target (already there)"; continue; fi
        sed "s|@BINDIR@|$prefix/bin|g" "$source" > "$target"
        chmod 644 "$target"
        echo "installed $target"
    done < <(daemon_files)
    if [ -z "$root" ] && [ -d /run/systemd/system ]; then
        systemctl daemon-reload || true
        systemd-sysusers || true
        systemd-tmpfiles --create iapd.conf 2> /dev/null || true
        echo "install: start iapd with: sudo systemctl enable --now iapd.socket (docs/DAEMON.md)"
    fi
fi
if [ "$system_files" -eq 0 ]; then
    echo "install: nothing was written outside $prefix (not a system prefix, or --no-system-files). Left out: the udev rules (without" \
         "them only root opens the accessories) and iapd's systemd units, sysusers and tmpfiles entries and" \
         "/etc/iapd.conf. Install those too with --system-files (as root), or run the daemon by hand:" \
         "sudo groupadd --system iapd; sudo $prefix/bin/iapd --group iapd (docs/DAEMON.md, 'Without systemd')." >&2
fi
case ":$PATH:" in
    *":$prefix/bin:"*) ;;
    *) echo "install: $prefix/bin is not on your PATH; add it: export PATH=\"$prefix/bin:\$PATH\"" >&2 ;;
esac
