#!/usr/bin/env bash
# usb-rig smoke check, run in the guest by guest.sh: tools/usb-rig/run.sh -- tools/usb-rig/smoke.sh
# Proves the rig end to end without any project gadget code: a configfs gadget with a function that
# needs no userspace (CDC ACM: usb_f_acm, built as a module in Debian's generic kernel), bound to the
# first dummy UDC, must enumerate on the guest's USB host side (sysfs + /dev/bus/usb node through
# devtmpfs/udev), and the release iapctl must run against it, find no iAP interface, print
# "no accessories found" and exit 0. That covers kernel, modules, configfs, udev, libusb and the
# Swift runtime in the guest.
set -euo pipefail

smoke_uptime=$(cut -d' ' -f1 /proc/uptime)
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=${ACCESSORYHOST_REPO:-$(cd "$here/../.." && pwd)}
results=${USB_RIG_RESULTS:-$REPO/.build/usb-rig/results}
iapctl=$REPO/.build/release/iapctl
export PATH=$PATH:/usr/sbin:/sbin

# pid.codes test VID/PID; the serial number identifies this gadget among any others.
vid=1209 pid=0002 serial=usbrig-smoke
G=/sys/kernel/config/usb_gadget/usbrig-smoke

say() { printf 'smoke: %s\n' "$*" >&2; }
fail() { say "FAIL: $*"; echo "FAIL: $*" >> "$results/smoke.txt"; exit 1; }

: > "$results/smoke.txt"
report() { echo "$*" >> "$results/smoke.txt"; say "$*"; }
report "boot to guest.sh: ${USB_RIG_GUEST_UPTIME:-?} s; boot to smoke.sh: ${smoke_uptime} s (guest /proc/uptime)"

[ -d /sys/kernel/config/usb_gadget ] || fail "no /sys/kernel/config/usb_gadget (libcomposite not loaded or configfs not mounted; run through guest.sh)"
udcs=(/sys/class/udc/*)
udc=${udcs[0]##*/}
[ -e "${udcs[0]}" ] || fail "no UDC in /sys/class/udc (dummy_hcd not loaded?)"

# ACM first; ECM as a fallback in case a future kernel drops one of them. Both run entirely in
# the kernel once bound.
function=""
for candidate in acm:usb_f_acm ecm:usb_f_ecm; do
    if timeout 30 modprobe "${candidate#*:}" 2>/dev/null; then function=${candidate%%:*}.usb0; break; fi
done
[ -n "$function" ] || fail "neither usb_f_acm nor usb_f_ecm can be loaded"
report "gadget function: $function on $udc"

# Undo the gadget on exit so a later command in the same guest finds the UDC free.
cleanup() {
    [ -d "$G" ] || return 0
    echo "" > "$G/UDC" 2>/dev/null || true
    rm -f "$G/configs/c.1/$function"
    rmdir "$G/configs/c.1/strings/0x409" "$G/configs/c.1" "$G/functions/$function" "$G/strings/0x409" "$G" 2>/dev/null || true
}
trap cleanup EXIT

mkdir "$G" || fail "cannot create $G"
echo "0x$vid" > "$G/idVendor"
echo "0x$pid" > "$G/idProduct"
echo 0x0200 > "$G/bcdUSB"
mkdir "$G/strings/0x409"
echo "$serial" > "$G/strings/0x409/serialnumber"
echo "AccessoryHost usb-rig" > "$G/strings/0x409/manufacturer"
echo "usb-rig smoke ($function)" > "$G/strings/0x409/product"
mkdir -p "$G/configs/c.1/strings/0x409"
echo smoke > "$G/configs/c.1/strings/0x409/configuration"
echo 100 > "$G/configs/c.1/MaxPower"
mkdir "$G/functions/$function" || fail "cannot create function $function"
ln -s "$G/functions/$function" "$G/configs/c.1/"
bind_uptime=$(cut -d' ' -f1 /proc/uptime)
echo "$udc" > "$G/UDC" || fail "cannot bind the gadget to $udc"

# Enumeration is asynchronous: wait (up to 15 s) for the device in sysfs, matched by serial number.
dev=""
for _ in $(seq 1 150); do
    for d in /sys/bus/usb/devices/*; do
        [ -r "$d/serial" ] && [ "$(cat "$d/serial")" = "$serial" ] && [ "$(cat "$d/idVendor")" = "$vid" ] && dev=$d && break
    done
    [ -n "$dev" ] && break
    sleep 0.1
done
[ -n "$dev" ] || fail "the gadget did not enumerate on the host side within 15 s (no $vid:$pid serial $serial in /sys/bus/usb/devices)"
timeout 60 udevadm settle -t 30 || say "udevadm settle did not finish in 30 s; continuing"
settled_uptime=$(cut -d' ' -f1 /proc/uptime)
busnum=$(cat "$dev/busnum") devnum=$(cat "$dev/devnum")
node=$(printf '/dev/bus/usb/%03d/%03d' "$busnum" "$devnum")
[ -c "$node" ] || fail "$dev enumerated but $node is not a character device"
report "device: $vid:$pid at $node ($(basename "$dev"), speed $(cat "$dev/speed") Mb/s), enumerated and settled in $(awk -v a="$bind_uptime" -v b="$settled_uptime" 'BEGIN { printf "%.2f", b - a }') s"
drivers=$(for i in "$dev"/*:*; do [ -e "$i/driver" ] && basename "$(readlink "$i/driver")"; done | sort -u | tr '\n' ' ')
report "host-side interface drivers: ${drivers:-none}"

[ -x "$iapctl" ] || fail "$iapctl is missing (run.sh builds it unless --no-build)"
set +e
out=$(timeout 60 "$iapctl" -vv list 2>&1)
rc=$?
set -e
printf '%s\n' "$out" | sed 's/^/smoke: iapctl: /' >&2
printf '%s\n' "$out" > "$results/iapctl-list.txt"
[ "$rc" -eq 0 ] || fail "iapctl -vv list exited with $rc"
grep -qx "no accessories found" <<<"$out" || fail "iapctl -vv list did not print 'no accessories found'"
report "iapctl -vv list: exit 0, no accessories found"
report "PASS"
