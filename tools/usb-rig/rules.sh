#!/usr/bin/env bash
# Runs in the usb-rig guest (root): applies rules.d/ with the guest's real udevd and checks what
# they do to a simulated accessory's device node: the property and the uaccess tag of
# 70-mfi-accessory.rules, and, with 71-mfi-accessory-plugdev.rules, that a non-root user in
# group plugdev can open the accessory while one outside it gets the permission advice.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$here/../.." && pwd)
iapctl=$REPO/.build/release/iapctl
say() { printf 'rules: %s\n' "$*" >&2; }
fail() { say "FAILED: $*"; exit 1; }

install -m 644 "$REPO"/rules.d/*.rules /etc/udev/rules.d/ # /etc is a tmpfs overlay in the guest
udevadm control --reload-rules

"$iapctl" simulate --gadget --usb-id 1209:00a1 > /tmp/rules-sim.log 2>&1 &
simulator=$!
trap 'kill "$simulator" 2>/dev/null; wait "$simulator" 2>/dev/null || true' EXIT

node=""
for _ in $(seq 1 100); do
    udevadm settle -t 5 || true
    for device in /sys/bus/usb/devices/*; do
        [ -f "$device/idVendor" ] || continue
        if [ "$(cat "$device/idVendor")" = 1209 ] && [ "$(cat "$device/idProduct")" = 00a1 ]; then
            node=/dev/bus/usb/$(printf '%03d' "$(cat "$device/busnum")")/$(printf '%03d' "$(cat "$device/devnum")")
        fi
    done
    [ -n "$node" ] && [ -e "$node" ] && break
    kill -0 "$simulator" 2>/dev/null || fail "the simulated gadget exited: $(cat /tmp/rules-sim.log)"
    sleep 0.1 # waiting for an external process (udev, the gadget) with a bounded number of polls
done
[ -n "$node" ] || fail "the simulated accessory did not appear"
udevadm settle -t 10 || true
info=$(udevadm info "$node")
grep -q "ID_MFI_ACCESSORY=1" <<<"$info" || fail "ID_MFI_ACCESSORY is not set on $node: $info"
# CURRENT_TAGS, not TAGS: TAGS keeps every tag any earlier event set, so it would hide a rule that
# loses the tag on a later event (the "bind" that follows "add").
grep -qE "^Q: uaccess$|CURRENT_TAGS=.*:uaccess:" <<<"$info" || fail "the uaccess tag is missing on $node: $info"
say "70-mfi-accessory.rules: $node has ID_MFI_ACCESSORY=1 and the uaccess tag"
grep -q "SYSTEMD_WANTS=iapd.service" <<<"$info" || fail "72-mfi-accessory-iapd.rules did not ask systemd for iapd.service on $node: $info"
grep -qE "^Q: systemd$|CURRENT_TAGS=.*:systemd:" <<<"$info" || fail "the systemd tag is missing on $node: $info"
say "72-mfi-accessory-iapd.rules: $node wants iapd.service (tag systemd)"

[ "$(stat -c '%G %a' "$node")" = "plugdev 660" ] || fail "$node is $(stat -c '%G %a' "$node"), expected plugdev 660"
plugdev=$(getent group plugdev | cut -d: -f3)
# A copy the unprivileged user can surely execute (the checkout may not be readable to it).
install -m 755 "$iapctl" /tmp/iapctl-rules
as_user() { setpriv --reuid=65534 --regid=65534 "$@" --inh-caps=-all /tmp/iapctl-rules ${verbose:-} list --timeout 10; }
output=$(as_user --groups="$plugdev" 2>&1) || fail "a plugdev user could not list: $output"
grep -q "on usb" <<<"$output" || fail "a plugdev user does not see the accessory: $output"
say "71-mfi-accessory-plugdev.rules: a non-root user in plugdev lists it: $(head -n 1 <<<"$output")"
# -v: the steps with their times, so that a failure here shows what happened when.
output=$(verbose=-v as_user --clear-groups 2>&1) && fail "a user outside plugdev could open it: $output"
grep -q "udev rule" <<<"$output" || fail "no advice for a user outside plugdev: $output"
say "a user outside plugdev is told what to install: ok"
