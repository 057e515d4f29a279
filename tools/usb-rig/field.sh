#!/usr/bin/env bash
# Runs in the usb-rig guest (root): accessories as they are in the field (PROTOCOL.md §7) through
# the command line. `iapctl simulate --gadget --usb-layout supercamera --sticks-until-reset`
# plays a supercamera-shaped accessory that sticks after its first handshake (as the Teslong
# TD300 does) until it sees a USB reset; `iapctl watch --json` must show the host's reset (a
# "failed" event saying so) and then the accessory connected, without a re-plug; `iapctl list`
# then shows it. Then an accessory that leaves the bus in the middle of an `iapctl open`
# session (its gadget unbound, as the FLIR ONE leaves by itself): `iapctl open` ends with 74 and
# says the accessory left the bus.
# Last, two descriptor layouts of PROTOCOL.md §7.9 through the command line (FieldRigTests
# runs all of them through the library): for `--usb-layout sixth-interface` (the iAP2 interface 5
# after audio, HID and DFU, an interrupt IN endpoint after the bulk pair) and `generic-ids`
# (0525:a4a0), `iapctl wait` finds the accessory and `iapctl send --verify-echo` echoes 256 KiB.
#
# Usage: field.sh            Env: IAPCTL (default .build/release/iapctl)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$here/../.." && pwd)
iapctl=${IAPCTL:-$REPO/.build/release/iapctl}
results=${USB_RIG_RESULTS:-$REPO/.build/usb-rig/results}
work=$(mktemp -d)
pids=()
cleanup() {
    local pid
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    cp "$work"/*.out "$work"/*.err "$results"/ 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
# poll TENTHS COMMAND...: runs COMMAND every 0.1 s until it succeeds, at most TENTHS times.
poll() {
    local tenths=$1
    shift
    for _ in $(seq 1 "$tenths"); do
        "$@" && return 0
        sleep 0.1
    done
    "$@"
}
fail() {
    echo "field: FAILED: $*" >&2
    for f in "$work"/*.out "$work"/*.err; do [ -s "$f" ] && { echo "--- $(basename "$f")" >&2; tail -n 20 "$f" >&2; }; done
    exit 1
}
[ -x "$iapctl" ] || fail "$iapctl is missing (swift build -c release)"

# The watcher first (it waits for events), then the accessory; two events: the reset, then
# connected. The watcher ends by itself after them; 30 s bounds a failure.
timeout 30 "$iapctl" watch --direct --json --count 2 > "$work/watch.out" 2> "$work/watch.err" &
watcher=$!
pids+=("$watcher")
start=$(date +%s%N)
"$iapctl" simulate --gadget --usb-layout supercamera --sticks-until-reset --usb-id 1209:00e5 -v \
    > "$work/simulate.out" 2> "$work/simulate.err" &
sticking=$!
pids+=("$sticking")
wait "$watcher" || fail "iapctl watch did not see two events within 30 s (exit $?)"
end=$(date +%s%N)
first=$(sed -n 1p "$work/watch.out")
second=$(sed -n 2p "$work/watch.out")
case "$first" in *'"event":"failed"'*'resetting the USB device once'*) ;; *) fail "the first event should say the host resets the device: $first" ;; esac
case "$second" in *'"event":"connected"'*) ;; *) fail "the second event should be the accessory connected: $second" ;; esac
"$iapctl" list --direct > "$work/list.out" 2> "$work/list.err" || fail "iapctl list failed"
grep -q "1209:00e5" "$work/list.out" || fail "iapctl list does not show the accessory: $(cat "$work/list.out")"
echo "field: iapctl watch saw the reset, then the accessory: $first"
echo "field: $second"
echo "field: from starting the sticking simulator to the watcher's second event: $(( (end - start) / 1000000 )) ms"
echo "field: iapctl list: $(head -n 1 "$work/list.out")"

# An accessory that leaves the bus mid-session. The sticking one goes first (one gadget at a time).
kill "$sticking"
wait "$sticking" || true
"$iapctl" simulate --gadget --usb-id 1209:00e6 > "$work/simulate2.out" 2> "$work/simulate2.err" &
pids+=("$!")
timeout 60 "$iapctl" wait --direct --usb-id 1209:00e6 --timeout 30 > "$work/wait.out" 2> "$work/wait.err" \
    || fail "the second simulated accessory was not identified within 30 s"
mkfifo "$work/input"
exec 3<> "$work/input" # a writer that stays: open's input does not end until it is closed
timeout 60 "$iapctl" open --direct -v com.example.echo < "$work/input" > "$work/open.out" 2> "$work/open.err" 3>&- &
opener=$!
pids+=("$opener")
poll 300 grep -q "opened com.example.echo" "$work/open.err" || fail "iapctl open did not open the session within 30 s"
gadget=$(grep -l "1209" /sys/kernel/config/usb_gadget/*/idVendor | head -n 1)
echo "" > "$(dirname "$gadget")/UDC" # the accessory leaves the bus
exec 3>&- # then the input ends, and open reports what happened
status=0
wait "$opener" || status=$?
[ "$status" = 74 ] || fail "iapctl open should end with 74 when the accessory leaves, not $status"
grep -q "left the bus" "$work/open.err" || fail "iapctl open should say the accessory left the bus: $(tail -n 3 "$work/open.err")"
echo "field: iapctl open, the accessory leaving mid-session (exit $status): $(grep -i "error" "$work/open.err" | tail -n 1)"

# The §7.9 layouts, one gadget at a time (the leaver's gadget is left unbound: stop it first).
for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
pids=()
head -c $((256 << 10)) /dev/urandom > "$work/payload"
for layout in sixth-interface generic-ids; do
    id=1209:00e7
    [ "$layout" = generic-ids ] && id=0525:a4a0
    args=(--usb-layout "$layout")
    [ "$layout" = generic-ids ] || args+=(--usb-id "$id")
    "$iapctl" simulate --gadget "${args[@]}" > "$work/simulate-$layout.out" 2> "$work/simulate-$layout.err" &
    simulator=$!
    pids+=("$simulator")
    timeout 60 "$iapctl" wait --direct --usb-id "$id" --timeout 30 > "$work/wait-$layout.out" 2> "$work/wait-$layout.err" \
        || fail "layout $layout: the accessory was not identified within 30 s"
    timeout 120 "$iapctl" send --direct com.example.echo "$work/payload" --verify-echo --json > "$work/send-$layout.out" 2> "$work/send-$layout.err" \
        || fail "layout $layout: iapctl send --verify-echo failed"
    grep -q '"verified":true' "$work/send-$layout.out" || fail "layout $layout: the echo was not verified"
    device=$(grep -l "$(cut -d: -f2 <<<"$id")" /sys/bus/usb/devices/*/idProduct 2>/dev/null | head -n 1 || true)
    interfaces=$(cat "$(dirname "$device")"/*:*/bInterfaceClass 2>/dev/null | tr '\n' ' ' || true)
    echo "field: layout $layout ($id): identified and 256 KiB echoed byte-exact; interface classes: $interfaces"
    kill "$simulator"
    wait "$simulator" || true
done
