#!/usr/bin/env bash
# Runs inside the usb-rig guest, as root (started by run.sh through vng --exec). Loads the USB
# gadget stack, records what the guest looks like, then runs a command with the repository root
# as the working directory and exits with its status.
#
# Usage: guest.sh [command [args...]]
#   With no command: tools/usb-rig/suite.sh (the in-guest Swift tests from the release test
#   bundle, the udev rules check, iapbench usb)
# Env: USB_RIG_UDCS     number of dummy UDC/HCD pairs (default 8): one gadget per UDC, so tests
#                       can run several devices at once
#      USB_RIG_RESULTS  writable directory shared with the host (run.sh passes its --rwdir)
# The command gets ACCESSORYHOST_USB_RIG=1, ACCESSORYHOST_REPO, USB_RIG_RESULTS and
# USB_RIG_GUEST_UPTIME (guest uptime in seconds when this script started).
#
# The guest sees the host root read-only, with tmpfs over /etc /usr /var /tmp and friends:
# anything that must survive the guest goes to $USB_RIG_RESULTS.
set -euo pipefail

start_uptime=$(cut -d' ' -f1 /proc/uptime)
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$here/../.." && pwd)
results=${USB_RIG_RESULTS:-$REPO/.build/usb-rig/results}
udcs=${USB_RIG_UDCS:-8}
export PATH=$PATH:/usr/sbin:/sbin

say() { printf 'guest: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

[ "$(id -u)" -eq 0 ] || die "must run as root in the guest (run.sh passes vng --user root)"
mkdir -p "$results" 2>/dev/null || true
[ -w "$results" ] || die "results directory $results is not writable (is it run.sh's --rwdir?)"

# No USB autosuspend in the guest: dummy_hcd suspends idle devices after 2 s, and FunctionFS
# gadgets then stopped moving data even once the host opened them (seen as SUSPEND with no RESUME).
timeout 60 modprobe usbcore autosuspend=-1 || die "modprobe usbcore failed"
echo -1 > /sys/module/usbcore/parameters/autosuspend || say "cannot turn USB autosuspend off"
# num= makes dummy_hcd create that many UDC/HCD pairs (dummy_udc.0 … dummy_udc.N-1).
timeout 60 modprobe dummy_hcd "num=$udcs" || die "modprobe dummy_hcd num=$udcs failed"
timeout 60 modprobe libcomposite || die "modprobe libcomposite failed"
timeout 60 modprobe usb_f_fs || die "modprobe usb_f_fs failed"
# GadgetFS serves the simulator's native-transport interfaces (FunctionFS on this kernel cannot
# accept their alternate setting 1); it binds a controller only when a program configures it.
timeout 60 modprobe gadgetfs || say "modprobe gadgetfs failed: native-transport figures will be missing"
if ! mountpoint -q /sys/kernel/config; then
    mount -t configfs none /sys/kernel/config || die "cannot mount configfs on /sys/kernel/config"
fi
# The dummy HCDs' root hubs are hotplugged now; let udevd finish with them before tests look.
if command -v udevadm >/dev/null; then
    timeout 60 udevadm settle -t 30 || say "udevadm settle did not finish in 30 s; continuing"
else
    say "no udevadm: udev is not installed on the host, so libusb hotplug will not work in the guest"
fi

# Names in a directory, space-separated (for the summary; these are kernel-made, plain names).
names() { local f; for f in "$1"/*; do [ -e "$f" ] && printf '%s ' "${f##*/}"; done; return 0; }
libusb_version() {
    # pkg-config reads one small file; dpkg-query parses the whole status database over 9p,
    # which takes a second under TCG. Either comes from the host root.
    pkg-config --modversion libusb-1.0 2>/dev/null && return
    dpkg-query -W -f='${Version}\n' libusb-1.0-0 2>/dev/null && return
    readlink -f /lib/x86_64-linux-gnu/libusb-1.0.so.0 2>/dev/null || echo unknown
}
setup_uptime=$(cut -d' ' -f1 /proc/uptime)
{
    echo "kernel:        $(uname -r)"
    echo "uptime:        ${start_uptime} s at guest.sh start, ${setup_uptime} s after modprobe + udev settle"
    echo "cpus:          $(nproc)"
    echo "memory:        $(awk '/MemTotal/ { print $2 " kB" }' /proc/meminfo)"
    echo "udcs:          $(names /sys/class/udc)"
    echo "libusb:        $(libusb_version)"
    echo "udevd:         $(grep -qsx systemd-udevd /proc/[0-9]*/comm && echo running || echo 'not running')"
    echo "usb buses:     $(names /dev/bus/usb)"
} > "$results/environment.txt"
sed 's/^/guest: /' "$results/environment.txt" >&2

if [ $# -eq 0 ]; then
    set -- "$REPO/tools/usb-rig/suite.sh"
fi
cd "$REPO"
# A relative command means a file in the repository (e.g. tools/usb-rig/smoke.sh); a bare name is
# looked up on PATH as usual.
case "$1" in
    */*) [ -x "$1" ] || die "$1 is missing or not executable (built on the host? run.sh builds unless --no-build)" ;;
    *) command -v "$1" >/dev/null || die "$1: command not found in the guest" ;;
esac

export ACCESSORYHOST_USB_RIG=1 ACCESSORYHOST_REPO=$REPO USB_RIG_RESULTS=$results USB_RIG_GUEST_UPTIME=$start_uptime
say "running: $*"
status=0
"$@" || status=$?
echo "$status" > "$results/status"
say "command exited with status $status"
exit "$status"
