#!/usr/bin/env bash
# Runs a command inside a qemu guest that has a real kernel USB stack (dummy_hcd + libcomposite +
# FunctionFS), with this repository visible at the same path. The host kernel may have no USB at
# all; the guest boots Debian's stock kernel under TCG through virtme-ng and shares the host root
# read-only over 9p, so binaries built here run there unchanged.
#
# Usage: tools/usb-rig/run.sh [--no-build] [-- guest-command [args...]]
#   With no guest command, guest.sh runs the in-guest Swift test suite (filter USBRig).
#   Relative guest commands are resolved from the repository root.
# Env: USB_RIG_CACHE    cache dir (default ${XDG_CACHE_HOME:-$HOME/.cache}/accessoryhost-usb-rig)
#      USB_RIG_TIMEOUT  seconds for the whole VM run (default 1800)
#      USB_RIG_UDCS     number of dummy UDCs in the guest (default 8: the fleet; passed through)
#      CI               when set, always refresh the apt package lists
# Exit status: the guest command's status; 124 if the VM timed out; 2 for usage errors; other
# non-zero statuses with a "usb-rig:" message for setup failures.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
cache=${USB_RIG_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/accessoryhost-usb-rig}
vm_timeout=${USB_RIG_TIMEOUT:-1800}
udcs=${USB_RIG_UDCS:-8}
# virtme-ng 1.42 is the version the rig was proven with (see README.md); newer ones may change flags.
vng_version=1.42
rig_dir=$repo/.build/usb-rig
results=$rig_dir/results

# apt packages the rig needs on the host. The guest has no packages of its own: it sees the host
# root, so udev (udevd in the guest, needed for libusb hotplug), libusb and the Swift runtime
# must all be installed here.
packages=(
    qemu-system-x86   # the VM
    busybox-static    # virtme-ng builds its initramfs with busybox
    kmod              # depmod, for the extracted kernel and inside vng
    udev              # systemd-udevd in the guest: libusb hotplug only listens to udevd
    file              # vng reads the kernel version from the image with file(1)
    python3-venv      # virtme-ng is not packaged in bookworm; it goes in a venv
    libusb-1.0-0-dev  # building the package (CLibUSB) and libusb in the guest
    pkg-config        # SwiftPM resolves CLibUSB through pkg-config
    tcpdump           # usbmon.sh captures the guest's USB traffic with it
    bluez             # bluetoothd in the guest (bluetooth.sh)
    bluez-test-tools  # btvirt: two virtual BR/EDR controllers on hci_vhci (bluetooth.sh)
    dbus-daemon       # the guest's system bus for bluetoothd
)

build=1
guest_args=()
while [ $# -gt 0 ]; do
    case "$1" in
        --no-build) build=0; shift ;;
        --) shift; guest_args=("$@"); break ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "usb-rig: unknown argument '$1' (usage: run.sh [--no-build] [-- command...])" >&2; exit 2 ;;
    esac
done
case "$vm_timeout" in ''|*[!0-9]*) echo "usb-rig: USB_RIG_TIMEOUT must be a number of seconds" >&2; exit 2 ;; esac
case "$udcs" in ''|*[!0-9]*) echo "usb-rig: USB_RIG_UDCS must be a number" >&2; exit 2 ;; esac

# The guest sees the host root over 9p, but virtme-ng mounts empty tmpfs over a few directories;
# a checkout under one of them would be invisible (and its binaries missing) in the guest.
case "$repo/" in
    /run/*|/dev/*|/var/tmp/*|/var/cache/*|/var/log/*|/var/lib/apt/*|/usr/lib/modules/*)
        echo "usb-rig: $repo is under a directory the guest replaces with an empty tmpfs; move the checkout (e.g. under /tmp, /home or /work)" >&2
        exit 2 ;;
esac

# depmod lives in /sbin; a non-login root shell may not have it on PATH.
export PATH=$PATH:/usr/sbin:/sbin
export DEBIAN_FRONTEND=noninteractive

sudo=()
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "usb-rig: run as root (apt-get, and the guest runs as root)" >&2; exit 77; }
    sudo=(sudo)
fi

log() { printf 'usb-rig: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }
now() { date +%s.%N; }

# Wall time per phase, printed at exit whatever the outcome, so a slow or failed CI run shows
# where the time went.
phase_names=()
phase_times=()
phase_start=""
current=""
begin() { current=$1; phase_start=$(now); log "== $1"; }
end() {
    phase_names+=("$current")
    phase_times+=("$(awk -v a="$phase_start" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }')")
    current=""
}
# shellcheck disable=SC2317  # reached through the EXIT trap, which shellcheck 0.9 does not follow
summary() {
    local status=$? i
    # A phase that was interrupted by a failure still gets its time, marked as failed.
    if [ -n "$current" ]; then end; phase_names[-1]="${phase_names[-1]} (failed)"; fi
    {
        echo "usb-rig: phase times (s):"
        for i in "${!phase_names[@]}"; do printf '  %-15s %7s\n' "${phase_names[$i]}" "${phase_times[$i]}"; done
        echo "usb-rig: exit status $status"
    } >&2
}
trap summary EXIT

# ---- apt ---------------------------------------------------------------------------------------
begin apt
# Refresh the lists when they are missing or over a day old (the kernel's ABI number moves with
# security updates and old .debs leave the mirror), and always on CI, which may start from an old
# image. Otherwise skip the network: a warm local run should not pay for it.
fresh_lists=$(find /var/lib/apt/lists -maxdepth 1 -name '*_Packages*' -mmin -1440 2>/dev/null | head -n 1 || true)
if [ -n "${CI:-}" ] || [ -z "$fresh_lists" ]; then
    log "apt-get update"
    timeout 300 "${sudo[@]}" apt-get update -q || die "apt-get update failed or timed out (300 s)"
fi
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    log "installing ${missing[*]} (log: $rig_dir/apt.log)"
    mkdir -p "$rig_dir"
    # dpkg's progress output is long and useless in a CI log; it is kept in a file and shown on failure.
    if ! timeout 600 "${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}" > "$rig_dir/apt.log" 2>&1; then
        tail -n 40 "$rig_dir/apt.log" >&2
        die "apt-get install ${missing[*]} failed or timed out (600 s)"
    fi
fi
command -v swift >/dev/null || [ "$build" -eq 0 ] || die "no 'swift' on PATH; install the Swift 6 toolchain (swift.org)"
end

# ---- kernel ------------------------------------------------------------------------------------
begin kernel
# Two runs sharing a cache (parallel CI jobs) must not extract the same kernel or build the same
# venv at once: hold a lock on the cache through the kernel and venv phases.
mkdir -p "$cache"
exec 8>"$cache/.lock"
flock -n 8 || { log "waiting for another run.sh to finish setting up $cache"; flock -w 1800 8 || die "timed out waiting for the lock on $cache"; }
# The generic flavour, resolved from the metapackage every run: the cloud flavour
# (linux-image-*-cloud-amd64) has no usbcore or gadget drivers at all.
kpkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ { print $2; exit }' || true)
case "$kpkg" in
    *cloud*|*rt-amd64) die "linux-image-amd64 resolved to '$kpkg', which is not the generic flavour" ;;
    linux-image-*-amd64) ;;
    "")
        # Offline, or lists without the metapackage: use a kernel cached earlier if there is one.
        cached=$(find "$cache/kernel" -mindepth 2 -maxdepth 2 -name .ready -printf '%h\n' 2>/dev/null | sort -V | tail -n 1 || true)
        [ -n "$cached" ] || die "cannot resolve linux-image-amd64 (apt-cache depends) and no kernel is cached in $cache/kernel"
        kpkg=$(basename "$cached")
        log "could not resolve linux-image-amd64; using the cached $kpkg"
        ;;
    *) die "unexpected kernel package '$kpkg' from apt-cache depends linux-image-amd64" ;;
esac
kver=${kpkg#linux-image-}
kdir=$cache/kernel/$kpkg
kroot=$kdir/root
if [ -e "$kdir/.ready" ] && [ -e "$kroot/boot/vmlinuz-$kver" ]; then
    log "kernel $kpkg cached in $kdir"
else
    log "fetching $kpkg"
    rm -rf "$kdir"
    mkdir -p "$kdir/dl"
    # As root, apt-get download drops to the _apt user, who cannot write to a cache under $HOME
    # and falls back with a warning; downloading as the caller is what we want anyway.
    apt_user_opt=()
    [ "$(id -u)" -eq 0 ] && apt_user_opt=(-o APT::Sandbox::User=root)
    (cd "$kdir/dl" && timeout 600 apt-get download -q "${apt_user_opt[@]}" "$kpkg") \
        || die "apt-get download $kpkg failed or timed out (600 s)"
    deb=$(find "$kdir/dl" -maxdepth 1 -name "${kpkg}_*.deb" | head -n 1)
    [ -n "$deb" ] || die "apt-get download $kpkg produced no .deb"
    # Extracted, never installed: the host keeps its own kernel.
    timeout 300 dpkg-deb -x "$deb" "$kroot" || die "dpkg-deb -x $deb failed or timed out"
    timeout 120 depmod -a -b "$kroot" "$kver" || die "depmod for $kver failed"
    [ -e "$kroot/boot/vmlinuz-$kver" ] || die "$deb has no boot/vmlinuz-$kver"
    rm -rf "$kdir/dl"
    # Mark complete only now, so an interrupted extraction is redone rather than half-used.
    touch "$kdir/.ready"
    # Each extracted kernel is ~400 MB; once the new ABI is ready the older ones are dead weight.
    for old in "$cache/kernel"/*; do
        [ "$old" = "$kdir" ] || { log "removing old kernel cache $old"; rm -rf "$old"; }
    done
fi
vmlinuz=$kroot/boot/vmlinuz-$kver
end

# ---- venv (virtme-ng) --------------------------------------------------------------------------
begin venv
venv=$cache/venv
# /usr/bin/python3, not whatever python3 is first on PATH: a pyenv or similar under $HOME may be
# unreadable to other users and moves independently of the system.
if [ -x "$venv/bin/vng" ] && [ -e "$venv/.ready" ] && timeout 60 "$venv/bin/vng" --version >/dev/null 2>&1; then
    log "virtme-ng cached in $venv ($(cat "$venv/.ready"))"
else
    rm -rf "$venv"
    timeout 120 /usr/bin/python3 -m venv "$venv" || die "/usr/bin/python3 -m venv $venv failed"
    if ! timeout 600 "$venv/bin/pip" install -q --disable-pip-version-check "virtme-ng==$vng_version"; then
        log "virtme-ng==$vng_version is not installable here; falling back to the newest virtme-ng (untested with the rig)"
        timeout 600 "$venv/bin/pip" install -q --disable-pip-version-check virtme-ng \
            || die "pip install virtme-ng failed or timed out (600 s)"
    fi
    timeout 60 "$venv/bin/vng" --version >/dev/null 2>&1 || die "virtme-ng installed but 'vng --version' fails"
    "$venv/bin/pip" show virtme-ng 2>/dev/null | awk '/^Version:/ { print "virtme-ng " $2 }' > "$venv/.ready"
    log "installed $(cat "$venv/.ready")"
fi
exec 8>&-
end

# ---- build -------------------------------------------------------------------------------------
if [ "$build" -eq 1 ]; then
    begin build
    # Always on the host: compiling under TCG would take many times longer. SwiftPM waits on its
    # own lock if another build uses .build. Two release builds: the shipping executables in
    # .build/release (tools/deploy/package/release-build.sh, the Swift runtime linked statically: the
    # numbers must come from what users run), and the test bundle in its own scratch path .build/rig-tests (debug Swift is too slow under TCG to move tens of MiB;
    # -enable-testing, which other test targets' @testable imports need, changes what the
    # optimizer may do, so it stays out of the shipping build).
    (
        cd "$repo"
        timeout 3600 tools/deploy/package/release-build.sh \
            || die "tools/deploy/package/release-build.sh (the shipping release build) failed or timed out"
        timeout 3600 swift build -c release --build-tests -Xswiftc -enable-testing --scratch-path .build/rig-tests \
            || die "swift build -c release --build-tests --scratch-path .build/rig-tests failed or timed out"
    )
    end
fi

# ---- VM ----------------------------------------------------------------------------------------
begin vm
# One VM per repository at a time: the results directory is shared, and two guests on 2 cores
# under TCG would both crawl. A second run waits for the first.
mkdir -p "$rig_dir"
exec 9>"$rig_dir/.lock"
flock -n 9 || { log "waiting for another run.sh using $rig_dir"; flock -w "$((vm_timeout + 60))" 9 || die "timed out waiting for the lock on $rig_dir"; }
# Results from an earlier run must not be mistaken for this one's.
rm -rf "$results"
mkdir -p "$results"
# vng --exec takes one shell string; quote every word so paths and arguments survive. The guest
# does not inherit this environment, so the settings it needs are passed explicitly.
exec_line=$(printf '%q ' env "USB_RIG_RESULTS=$results" "USB_RIG_UDCS=$udcs" "$here/guest.sh" "${guest_args[@]}")
log "booting $kpkg under TCG (timeout ${vm_timeout}s): guest.sh ${guest_args[*]:-(default: in-guest test suite)}"
set +e
# --disable-kvm: KVM on such hosts aborts qemu or hangs the guest; TCG works everywhere.
# --force-9p: skips the C virtiofsd from qemu-system-common, which fails and costs a retry.
# --user root: modprobe and configfs need root in the guest, whoever runs this.
# | tee (a pipe): qemu reopens /proc/self/fd/1 with its own offset, so a plain "> file" on the
# caller's side interleaves and truncates output. pipefail keeps vng's status.
# timeout signals its whole process group, so qemu goes down with vng on expiry.
(
    cd "$repo"
    PATH=$venv/bin:$PATH timeout --kill-after=15 "$vm_timeout" \
        vng --user root --disable-kvm --force-9p --memory 2G --cpus "$(nproc)" \
            --rwdir="$results" --run "$vmlinuz" --exec "$exec_line" </dev/null 2>&1
) | tee "$rig_dir/console.log"
status=${PIPESTATUS[0]}
set -e
end
case "$status" in
    0) log "guest command passed (console log: $rig_dir/console.log, results: $results)" ;;
    124|137) log "the VM did not finish within ${vm_timeout}s (USB_RIG_TIMEOUT); console log: $rig_dir/console.log" ;;
    *) log "guest command failed with status $status (console log: $rig_dir/console.log, results: $results)" ;;
esac
exit "$status"
