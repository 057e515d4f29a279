#!/usr/bin/env bash
# Runs in the usb-rig guest (root), at the end of suite.sh: iapd on a real kernel USB stack,
# started the way docs/DAEMON.md says for a machine without systemd (the guest has none as
# init): the group made with groupadd, then `iapd --group iapd` as root, which makes
# /run/iapd/iapd.sock (mode 0660, group iapd). One simulated accessory (the multi-sensor
# profile: two echo protocols, com.example.echo and com.example.telemetry) is a FunctionFS gadget.
# Checks, each failing loudly with the reason (and iapd's log):
#   - two iapctl processes at once, one per echo protocol, byte-exact, both through iapd;
#   - two `iapctl watch --json` see the unplug (the gadget's UDC unbound) and the replug;
#   - a user outside the group is refused with the group named, a member is served;
#   - iapd stops cleanly on SIGTERM (exit 0, socket removed).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$here/../.." && pwd)
iapctl=$REPO/.build/release/iapctl
iapd=$REPO/.build/release/iapd
usb_id=1209:00d1
mib=8
say() { printf 'iapd: %s\n' "$*" >&2; }
for binary in "$iapctl" "$iapd"; do
    [ -x "$binary" ] || { say "FAILED: $binary is missing (swift build -c release)"; exit 1; }
done
unset IAPD_SOCKET # the documented default path, as a client finds it
socket=/run/iapd/iapd.sock
work=$(mktemp -d /tmp/iapd-rig.XXXXXX)
chmod 755 "$work"

daemon="" simulator="" watchers=()
show_logs() {
    local file
    for file in "$work"/*.log "$work"/*.err "$work"/*.out; do
        [ -s "$file" ] || continue
        say "--- ${file##*/} ---"
        sed 's/^/    /' "$file" >&2
    done
}
# Alive and not a zombie (a child that exited answers kill -0 until it is waited for).
alive() { [ -r "/proc/$1/stat" ] && [ "$(sed 's/.*) //' "/proc/$1/stat" | cut -c1)" != Z ]; }
cleanup() {
    local status=$?
    trap - EXIT
    for pid in "${watchers[@]}"; do kill -INT "$pid" 2>/dev/null || true; done
    if [ -n "$daemon" ]; then kill -TERM "$daemon" 2>/dev/null || true; fi
    if [ -n "$simulator" ]; then kill -TERM "$simulator" 2>/dev/null || true; fi # it removes its gadget
    wait 2>/dev/null || true
    # A failure that set -e caught rather than fail(): show what iapd logged all the same.
    if [ "$status" != 0 ] && [ ! -e "$work/.reported" ]; then show_logs; fi
    rm -rf "$work"
    exit "$status"
}
trap cleanup EXIT
fail() { say "FAILED: $*"; show_logs; touch "$work/.reported"; exit 1; }

# Waits up to $1 tenths of a second for the command after it to succeed; the processes it
# watches are external (udev, the gadget, other processes), so this polls a bounded number of times.
poll() {
    local tenths=$1
    shift
    for _ in $(seq 1 "$tenths"); do
        "$@" && return 0
        [ -z "$daemon" ] || alive "$daemon" || fail "iapd exited"
        [ -z "$simulator" ] || alive "$simulator" || fail "the simulated gadget exited"
        sleep 0.1
    done
    "$@"
}

# 1. iapd as docs/DAEMON.md runs it without systemd: the group, then iapd as root.
getent group iapd >/dev/null || groupadd --system iapd || fail "groupadd --system iapd failed" # /etc is a tmpfs overlay
gid=$(getent group iapd | cut -d: -f3)
"$iapd" --group iapd -vv 2> "$work/iapd.log" &
daemon=$!
poll 300 test -S "$socket" || fail "iapd did not make $socket within 30 s"
[ "$(stat -c '%G %a' "$socket")" = "iapd 660" ] || fail "$socket is $(stat -c '%G %a' "$socket"), expected group iapd, mode 660"
say "iapd (pid $daemon) listens on $socket, group iapd, mode 660"

# 2. The accessory: the simulator as a USB gadget, found by iapd through hotplug.
"$iapctl" simulate --gadget --usb-id "$usb_id" --profile multi-sensor > "$work/simulator.out" 2> "$work/simulator.log" &
simulator=$!
poll 300 grep -q "^usb gadget" "$work/simulator.out" || fail "the simulated gadget did not bind within 30 s"
udc=$(sed -n 's/^usb gadget .* on //p' "$work/simulator.out")
udc_file=/sys/kernel/config/usb_gadget/iapsim/UDC
[ "$(cat "$udc_file")" = "$udc" ] || fail "$udc_file holds '$(cat "$udc_file")', expected $udc"
timeout 90 "$iapctl" -v wait --usb-id "$usb_id" --timeout 60 > "$work/wait.out" 2> "$work/wait.err" \
    || fail "iapd did not serve the gadget $usb_id within 60 s"
grep -q "going through iapd at $socket" "$work/wait.err" || fail "iapctl wait did not go through iapd"
say "the gadget ($usb_id on $udc) is identified, seen through iapd: $(head -n 1 "$work/wait.out")"

# 3. Two iapctl processes at once, one per echo protocol of the one accessory.
head -c $((mib << 20)) /dev/urandom > "$work/echo.bin"
head -c $((mib << 20)) /dev/urandom > "$work/telemetry.bin"
timeout 180 "$iapctl" -v send com.example.echo "$work/echo.bin" --verify-echo > "$work/send-echo.out" 2> "$work/send-echo.err" &
first=$!
timeout 180 "$iapctl" -v send com.example.telemetry "$work/telemetry.bin" --verify-echo > "$work/send-telemetry.out" 2> "$work/send-telemetry.err" &
second=$!
status=0; wait "$first" || status=$?
[ "$status" = 0 ] || fail "iapctl send com.example.echo exited with $status"
status=0; wait "$second" || status=$?
[ "$status" = 0 ] || fail "iapctl send com.example.telemetry exited with $status"
for protocol in echo telemetry; do
    grep -q "going through iapd at $socket" "$work/send-$protocol.err" || fail "iapctl send com.example.$protocol did not go through iapd (-v)"
    grep -q "the echo matches byte for byte" "$work/send-$protocol.out" || fail "com.example.$protocol: the echo was not verified"
done
# At once: iapd opened both sessions before either ended.
opened=$(grep -n "opened 'com.example.\(echo\|telemetry\)'" "$work/iapd.log" | sed -n 2p | cut -d: -f1 || true)
ended=$(grep -n "'com.example.\(echo\|telemetry\)' ended" "$work/iapd.log" | sed -n 1p | cut -d: -f1 || true)
[ -n "$opened" ] && [ -n "$ended" ] || fail "iapd's log does not show both sessions opened and ended"
[ "$opened" -lt "$ended" ] || fail "the two sessions did not overlap in iapd (the second opened after the first ended)"
say "two iapctl processes through iapd at once, $mib MiB each, byte-exact: $(cat "$work/send-echo.out"); $(cat "$work/send-telemetry.out")"

# 4. Two watchers see the unplug and the replug.
for n in 1 2; do
    "$iapctl" -v watch --json > "$work/watch-$n.out" 2> "$work/watch-$n.err" &
    watchers+=($!)
done
events() { grep -c "\"event\":\"$2\"" "$work/watch-$1.out" || true; }
for n in 1 2; do
    poll 300 grep -q "going through iapd at $socket" "$work/watch-$n.err" || fail "watcher $n did not connect to iapd within 30 s"
done
# A watcher that subscribed before iapd's welcome came in prints the accessory as connected:
# then it surely listens. One that subscribed after prints nothing, and it listened long before
# the 3 s this waits at most.
for n in 1 2; do poll 30 grep -q '"event":"connected"' "$work/watch-$n.out" || true; done
connected_before=("$(events 1 connected)" "$(events 2 connected)")
both_saw() { [ "$(events 1 "$1")" -ge "$2" ] && [ "$(events 2 "$1")" -ge "$3" ]; }
echo > "$udc_file" # unplug: the gadget leaves the bus, the simulator keeps running
poll 300 both_saw disconnected 1 1 || fail "both watchers should see the unplug within 30 s (watcher 1: $(events 1 disconnected), watcher 2: $(events 2 disconnected))"
say "unplugged ($udc unbound): both watchers saw the accessory disconnect"
echo "$udc" > "$udc_file" # replug
poll 600 both_saw connected $((connected_before[0] + 1)) $((connected_before[1] + 1)) \
    || fail "both watchers should see the replug within 60 s (connected events before the unplug: ${connected_before[*]}; now: $(events 1 connected) $(events 2 connected))"
for n in 1 2; do
    # The last disconnect, then the accessory back after it (under a new id, on USB).
    gone=$(grep -n '"event":"disconnected"' "$work/watch-$n.out" | tail -n 1 || true)
    back=$(grep -n '"event":"connected"' "$work/watch-$n.out" | tail -n 1 || true)
    [ -n "$gone" ] && [ -n "$back" ] && [ "${gone%%:*}" -lt "${back%%:*}" ] || fail "watcher $n: no disconnect before the replug: $(cat "$work/watch-$n.out")"
    grep -q '"transport":"usb"' <<<"$back" || fail "watcher $n: the replugged accessory is not on usb: $back"
    before=$(grep -o '"connectionID":[0-9]*' <<<"$gone" || true)
    after=$(grep -o '"connectionID":[0-9]*' <<<"$back" || true)
    [ -n "$before" ] && [ "$before" != "$after" ] || fail "watcher $n: the replugged accessory kept its id ($after)"
done
for n in 1 2; do
    kill -INT "${watchers[$((n - 1))]}"
    status=0; wait "${watchers[$((n - 1))]}" || status=$?
    [ "$status" = 0 ] || fail "watcher $n exited with $status after SIGINT"
done
watchers=()
say "replugged: both watchers saw it come back ($after after $before)"

# 5. Who may connect: a user outside the group is refused and told the group; a member is served.
install -m 755 "$iapctl" "$work/iapctl" # a copy the unprivileged user can surely execute
as_nobody() { setpriv --reuid=65534 "$@" --inh-caps=-all "$work/iapctl" -v list --timeout 10; }
status=0; output=$(as_nobody --regid=65534 --clear-groups 2>&1) || status=$?
[ "$status" != 0 ] || fail "a user outside the group iapd was served: $output"
grep -q "group 'iapd'" <<<"$output" || fail "the refusal does not name the group iapd: $output"
say "a user outside the group is refused (exit $status): $(grep "group 'iapd'" <<<"$output" | head -n 1)"
status=0; output=$(as_nobody --regid="$gid" --clear-groups 2>&1) || status=$?
[ "$status" = 0 ] || fail "a member of the group iapd was not served (exit $status): $output"
grep -q "going through iapd at $socket" <<<"$output" || fail "the member did not go through iapd: $output"
grep -q "on usb" <<<"$output" || fail "the member does not see the accessory: $output"
say "a member (primary group iapd) is served: $(grep "on usb" <<<"$output" | head -n 1)"

# 6. iapd stops cleanly on SIGTERM.
kill -TERM "$daemon"
for _ in $(seq 1 100); do alive "$daemon" || break; sleep 0.1; done
if alive "$daemon"; then fail "iapd still runs 10 s after SIGTERM"; fi
status=0; wait "$daemon" || status=$?
pid=$daemon; daemon=""
[ "$status" = 0 ] || fail "iapd exited with $status on SIGTERM"
[ ! -e "$socket" ] || fail "iapd left $socket behind"
grep -q "stopping (signal 15)" "$work/iapd.log" || fail "iapd did not log its stop"
say "iapd (pid $pid) stopped cleanly on SIGTERM (exit 0, socket removed); it logged $(wc -l < "$work/iapd.log") lines"
