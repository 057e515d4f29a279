#!/usr/bin/env bash
# Bluetooth on a real kernel stack, in the usb-rig guest (root): hci_vhci and btvirt (Debian's
# bluez-test-tools) make two virtual BR/EDR controllers on one virtual air; a system bus and
# bluetoothd run in the guest. The host side (iapctl --bluetooth, with its NoInputNoOutput
# pairing agent) registers the iAP2 service on one controller; the simulator (iapctl simulate
# --bluetooth) connects from the other over RFCOMM; the two are paired first as a person would
# (discovery, Pair, Trust). Checks, each failing loudly:
#   0. an accessory as real ones are (PROTOCOL.md §7.11): the simulator advertises its iAP
#      service only under the accessory's UUID …caff (iapctl simulate --bluetooth-advertise,
#      started before the pairing so that the host's BlueZ reads that record), and the host
#      connects out to it (iapctl --bluetooth-connect): connected through …caff, identified with
#      every declared field, MIB MiB echoed byte-exact;
#   1. one process (iapctl --bluetooth): identified over Bluetooth with every declared field,
#      MIB MiB echoed byte-exact;
#   2. through iapd --bluetooth: the accessory seen by clients with transport bluetooth and its
#      address, two EA sessions at once from two iapctl processes, MIB MiB each, byte-exact;
#   3. the accessory's controller powered off in the middle of two transfers: both end with an
#      error, iapd goes on and no longer lists the accessory;
#   4. the controller back on, the accessory connecting again: identified again (a new
#      connection id), echoing; iapd stops cleanly on SIGTERM.
# With BLUETOOTH_BENCH_MIB set, then `iapbench bluetooth` (EA echo beside a raw RFCOMM echo;
# BLUETOOTH_BENCH_ROUNDS rounds, default 3); BLUETOOTH_SKIP_ROUNDS=1 skips rounds 1-4.
# BLUETOOTH_BENCH_PERF=DIR records the host process over each timed echo with perf (--perf DIR).
# BLUETOOTH_BENCH_IAPBENCH names the iapbench binaries to run (default the release build); with
# several (space-separated paths without spaces, e.g. a build before a change and one after) each
# runs in turn, twice, on the same pairing: an A/B on one guest.
#
# Usage (on the host): tools/usb-rig/run.sh [--no-build] -- tools/usb-rig/bluetooth.sh [MIB]
# Every step is logged to $USB_RIG_RESULTS/bluetooth.log, with bluetoothd's and btvirt's logs
# and each iapctl's output beside it.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$here/../.." && pwd)
mib=${1:-4}
results=${USB_RIG_RESULTS:-$REPO/.build/usb-rig/results}
mkdir -p "$results"
log=$results/bluetooth.log
: > "$log"
work=$(mktemp -d)
channel=7
pids=()
cleanup() {
    local pid
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null; done
    sleep 0.5
    for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null; done
    rm -rf "$work"
}
trap cleanup EXIT
say() { printf 'bluetooth: %s\n' "$*" | tee -a "$log" >&2; }
fail() {
    say "FAILED: $*"
    local file
    for file in "$results"/iapd.log "$results"/bt-*.err "$results"/bt-accessory-*.log; do
        [ -s "$file" ] || continue
        printf -- '--- %s (last 12 lines)\n' "${file##*/}" >&2
        tail -n 12 "$file" >&2
    done
    exit 1
}
# waitfor SECONDS WHAT COMMAND...: polls the command every 0.2 s (a script may sleep; tests may not).
waitfor() {
    local limit=$1 what=$2 end
    shift 2
    end=$((SECONDS + limit))
    until "$@" > /dev/null 2>&1; do
        [ "$SECONDS" -lt "$end" ] || fail "$what: not within ${limit} s"
        sleep 0.2
    done
    say "ok: $what"
}

# The iapctl with Bluetooth: the release build when it has it, else the debug one.
iapctl=$REPO/.build/release/iapctl
if ! { [ -x "$iapctl" ] && "$iapctl" --help 2>/dev/null | grep -q -- --bluetooth-agent; }; then
    iapctl=$REPO/.build/debug/iapctl
fi
[ -x "$iapctl" ] || fail "no iapctl built (swift build)"
say "iapctl: $iapctl; kernel $(uname -r)"

for module in bluetooth rfcomm hci_vhci; do
    timeout 60 modprobe "$module" || fail "modprobe $module"
done
[ -c /dev/vhci ] || fail "no /dev/vhci after modprobe hci_vhci"
say "ok: modules bluetooth, rfcomm, hci_vhci"

# A system bus of the rig's own: no user switch, no activation, every call allowed (the policy
# is not what is tested here).
cat > "$work/bus.conf" <<EOF
<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN" "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>system</type>
  <listen>unix:path=$work/system_bus_socket</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <allow own="*"/>
    <allow send_destination="*" eavesdrop="true"/>
    <allow eavesdrop="true"/>
  </policy>
</busconfig>
EOF
dbus-daemon --config-file="$work/bus.conf" --nofork --nopidfile > "$results/dbus-daemon.log" 2>&1 &
pids+=($!)
export DBUS_SYSTEM_BUS_ADDRESS=unix:path=$work/system_bus_socket
waitfor 20 "system bus up" test -S "$work/system_bus_socket"

btvirt -l2 -B > "$results/btvirt.log" 2>&1 &
pids+=($!)
waitfor 20 "two virtual BR/EDR controllers" test -e /sys/class/bluetooth/hci1

# bluetoothd keeps adapters' settings and pairings in /var/lib/bluetooth, read-only in the guest.
if [ -d /var/lib/bluetooth ] && ! touch /var/lib/bluetooth/.rig 2>/dev/null; then
    mount -t tmpfs tmpfs /var/lib/bluetooth || say "cannot mount a tmpfs on /var/lib/bluetooth: pairings will not be stored"
fi
/usr/libexec/bluetooth/bluetoothd -n -d > "$results/bluetoothd.log" 2>&1 &
pids+=($!)
property() { # property ADAPTER NAME
    dbus-send --system --print-reply --dest=org.bluez "/org/bluez/$1" org.freedesktop.DBus.Properties.Get \
        string:org.bluez.Adapter1 "string:$2" | sed -n 's/.*\(string\|boolean\) "\{0,1\}\([^"]*\)"\{0,1\}$/\2/p'
}
set_true() { # set_true ADAPTER NAME
    dbus-send --system --print-reply --dest=org.bluez "/org/bluez/$1" org.freedesktop.DBus.Properties.Set \
        string:org.bluez.Adapter1 "string:$2" variant:boolean:true > /dev/null
}
waitfor 30 "bluetoothd has both adapters" property hci1 Address
host=$(property hci0 Address)
accessory=$(property hci1 Address)
say "host adapter hci0 $host, accessory adapter hci1 $accessory"
for adapter in hci0 hci1; do
    set_true "$adapter" Powered || fail "power on $adapter"
    set_true "$adapter" Pairable || say "cannot make $adapter pairable"
done
set_true hci0 Discoverable || say "cannot make hci0 discoverable"
waitfor 10 "both adapters powered" sh -c "[ \"\$(dbus-send --system --print-reply --dest=org.bluez /org/bluez/hci1 org.freedesktop.DBus.Properties.Get string:org.bluez.Adapter1 string:Powered | grep -c 'boolean true')\" = 1 ]"

# The accessory as real ones are: its record names only …caff, on RFCOMM channel 9 of every
# adapter (one bluetoothd serves both), and it waits for the host. Started before the pairing,
# whose SDP browse is what tells the host's BlueZ which services the accessory has.
caff=00000000-deca-fade-deca-deafdecacaff
advertiser=""
if [ -z "${BLUETOOTH_SKIP_ROUNDS:-}" ]; then
    "$iapctl" simulate --bluetooth-advertise 9 -v > "$results/bt-accessory-caff.log" 2>&1 &
    advertiser=$!
    pids+=($advertiser)
    waitfor 30 "the simulated accessory advertises $caff only" grep -q "advertising $caff only" "$results/bt-accessory-caff.log"
fi

# Pair first, as a person would (bluetoothctl scan on, pair, trust): the first rig run showed
# bluetoothd 5.66 dropping an RFCOMM connection from a device it has no object for yet
# ("profile.c:create_conn() iAP2 device … not found"), even though the link and Just Works
# pairing came up right after. The host's adapter discovers the accessory's and pairs; Just
# Works needs no agent answer (the kernel confirms it when neither side has input or output).
device=/org/bluez/hci0/dev_${accessory//:/_}
set_true hci1 Discoverable || say "cannot make hci1 discoverable"
# BlueZ ties a discovery to the D-Bus client that started it and stops it when that client
# leaves (a one-shot dbus-send's discovery ends at once), so a bluetoothctl stays on the bus
# scanning until the device object appears.
bluetoothctl --timeout 60 scan on > "$results/bluetoothctl-scan.log" 2>&1 &
scanner=$!
pids+=($scanner)
waitfor 60 "hci0 discovered the accessory's adapter" dbus-send --system --print-reply --dest=org.bluez "$device" \
    org.freedesktop.DBus.Properties.Get string:org.bluez.Device1 string:Address
kill "$scanner" 2>/dev/null
dbus-send --system --print-reply --reply-timeout=60000 --dest=org.bluez "$device" org.bluez.Device1.Pair >> "$log" 2>&1 \
    || say "Pair failed (see above)"
dbus-send --system --print-reply --dest=org.bluez "$device" org.freedesktop.DBus.Properties.Set \
    string:org.bluez.Device1 string:Trusted variant:boolean:true > /dev/null || say "cannot trust the accessory"
waitfor 10 "the accessory is paired" sh -c "dbus-send --system --print-reply --dest=org.bluez $device org.freedesktop.DBus.Properties.Get string:org.bluez.Device1 string:Paired | grep -q 'boolean true'"
dbus-send --system --print-reply --dest=org.bluez "$device" org.bluez.Device1.Disconnect > /dev/null 2>&1 || true

head -c $((mib << 20)) /dev/urandom > "$work/payload"
head -c $((mib << 20)) /dev/urandom > "$work/payload2"
# Round 0 shows the way to the accessory; the rounds after it carry the payload's weight.
head -c $((256 << 10)) /dev/urandom > "$work/payload0"
# Long enough to be cut off: the accessory's controller goes off a few seconds into it.
head -c $((64 << 20)) /dev/zero > "$work/long"
simulator=""
start_simulator() { # start_simulator NAME: the simulated accessory connects from hci1 to the host's iAP2 channel
    "$iapctl" simulate --bluetooth "$host:$channel" --bluetooth-from "$accessory" -v > "$results/bt-accessory-$1.log" 2>&1 &
    simulator=$!
    pids+=($simulator)
}
stop_simulator() {
    [ -n "$simulator" ] || return 0
    kill "$simulator" 2>/dev/null; wait "$simulator" 2>/dev/null
    simulator=""
}
# check_identity FILE: the JSON (a send's or a list's) names every field the simulator declares.
check_identity() {
    python3 - "$1" "$accessory" <<'PY'
import json, sys
document = json.load(open(sys.argv[1]))
accessory = document["accessory"] if "accessory" in document else document["accessories"][0]
expected = {"name": "Multi Sensor", "manufacturer": "AccessoryHost Simulator", "modelNumber": "SIM-MS1",
            "serialNumber": "SIM-MS-0001", "firmwareRevision": "2.1.0", "hardwareRevision": "B",
            "protocolVersion": "iAP2", "transport": "bluetooth", "bluetoothAddress": sys.argv[2]}
wrong = {key: accessory.get(key) for key, value in expected.items() if accessory.get(key) != value}
protocols = accessory.get("protocolStrings", [])
for name in ("com.example.echo", "com.example.telemetry"):
    if name not in protocols:
        wrong["protocolStrings"] = protocols
if wrong:
    print(f"fields not as declared: {wrong}")
    sys.exit(1)
print(f"connectionID {accessory['connectionID']}, {accessory['name']} {accessory['modelNumber']} serial {accessory['serialNumber']} "
      f"firmware {accessory['firmwareRevision']} hardware {accessory['hardwareRevision']} on {accessory['location']}, {len(protocols)} protocols")
PY
}
connection_id() { # connection_id FILE: the accessory's connectionID in a list's or a send's JSON
    python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); print((d.get("accessory") or d["accessories"][0])["connectionID"])' "$1"
}
alive() { [ -r "/proc/$1/stat" ] && [ "$(sed 's/.*) //' "/proc/$1/stat" | cut -c1)" != Z ]; }
power() { # power ADAPTER true|false
    dbus-send --system --print-reply --dest=org.bluez "/org/bluez/$1" org.freedesktop.DBus.Properties.Set \
        string:org.bluez.Adapter1 string:Powered "variant:boolean:$2" > /dev/null
}

if [ -z "${BLUETOOTH_SKIP_ROUNDS:-}" ]; then
# Round 0, connecting out: the host's BlueZ lists the accessory with …caff and without …cafe;
# iapctl --bluetooth-connect finds the accessory's service by that UUID, connects to it, and
# the accessory is identified and echoes.
uuids=$(dbus-send --system --print-reply --dest=org.bluez "$device" org.freedesktop.DBus.Properties.Get \
    string:org.bluez.Device1 string:UUIDs 2>&1 | tr -d '\n ')
grep -qi "$caff" <<<"$uuids" || fail "round 0: BlueZ does not list $caff for the accessory: $uuids"
grep -qi "deafdecacafe" <<<"$uuids" && fail "round 0: the accessory should not advertise …cafe: $uuids"
say "ok: round 0: the host's BlueZ lists the accessory with $caff and without …cafe"
start=$SECONDS
"$iapctl" --no-usb --bluetooth-connect "$accessory" --bluetooth-agent --bluetooth-channel "$channel" --timeout 180 -v \
    send com.example.echo "$work/payload0" --verify-echo --json > "$results/bt-host-0.json" 2> "$results/bt-host-0.err"
status=$?
took=$((SECONDS - start))
[ "$status" = 0 ] || { say "host stderr: $(tail -5 "$results/bt-host-0.err" | tr '\n' ' ')"; say "accessory: $(tail -5 "$results/bt-accessory-caff.log" | tr '\n' ' ')"; fail "round 0: the host exited $status"; }
grep -q "through its iAP2 service $caff" "$results/bt-host-0.err" || fail "round 0: the host did not connect through $caff: $(grep -i bluetooth "$results/bt-host-0.err" | tail -3 | tr '\n' ' ')"
grep -q "connected through hci1" "$results/bt-accessory-caff.log" || fail "round 0: the accessory saw no host connect on hci1"
identity=$(check_identity "$results/bt-host-0.json") || fail "round 0: $identity"
grep -q '"verified":true' "$results/bt-host-0.json" || fail "round 0: the echo was not verified"
say "ok: round 0 (connecting out to $caff): identified: $identity; 256 KiB echoed byte-exact in ${took} s (connection included)"
kill "$advertiser" 2>/dev/null; wait "$advertiser" 2>/dev/null

# Round 1, one process: the host (iapctl --bluetooth) waits for an accessory, sends the payload
# through com.example.echo and checks the echo; the simulator connects from the other controller.
"$iapctl" --no-usb --bluetooth --bluetooth-agent --bluetooth-channel "$channel" --timeout 180 -v \
    send com.example.echo "$work/payload" --verify-echo --json > "$results/bt-host-1.json" 2> "$results/bt-host-1.err" &
hostpid=$!
pids+=($hostpid)
waitfor 60 "the host registered the iAP2 profile" grep -q "registered with BlueZ" "$results/bt-host-1.err"
start=$SECONDS
start_simulator 1
status=0
wait "$hostpid" || status=$?
took=$((SECONDS - start))
[ "$status" = 0 ] || { say "host stderr: $(tail -5 "$results/bt-host-1.err" | tr '\n' ' ')"; say "accessory: $(tail -5 "$results/bt-accessory-1.log" | tr '\n' ' ')"; fail "round 1: the host exited $status"; }
identity=$(check_identity "$results/bt-host-1.json") || fail "round 1: $identity"
say "ok: round 1 (one process): identified over Bluetooth: $identity"
grep -q '"verified":true' "$results/bt-host-1.json" || fail "round 1: the echo was not verified"
say "ok: round 1: $mib MiB echoed byte-exact over RFCOMM through com.example.echo in ${took} s (connection and identification included)"
stop_simulator

# Round 2, through iapd (as a system would run it): iapd takes Bluetooth, clients go through it.
iapd=$REPO/.build/release/iapd
[ -x "$iapd" ] || fail "$iapd is missing (swift build -c release)"
export IAPD_SOCKET=$work/iapd.sock
"$iapd" --no-usb --bluetooth --bluetooth-channel "$channel" --socket "$IAPD_SOCKET" -v > "$results/iapd.log" 2>&1 &
iapdpid=$!
pids+=($iapdpid)
waitfor 60 "iapd registered the iAP2 profile" grep -q "registered with BlueZ" "$results/iapd.log"
start_simulator 2
"$iapctl" wait --protocol com.example.echo --timeout 120 --json > "$results/bt-wait-2.json" 2> "$results/bt-wait-2.err" \
    || fail "round 2: no accessory through iapd ($(tail -3 "$results/bt-wait-2.err" | tr '\n' ' '))"
"$iapctl" list --json > "$results/bt-list-2.json" 2> "$results/bt-list-2.err" || fail "round 2: iapctl list through iapd failed"
identity=$(check_identity "$results/bt-list-2.json") || fail "round 2: $identity"
say "ok: round 2 (iapd): the accessory is seen through iapd: $identity"
# A watcher through iapd for the rest: it sees the accessory go in round 3 and come back in 4.
"$iapctl" -v watch --json > "$results/bt-watch.out" 2> "$results/bt-watch.err" &
watcher=$!
pids+=($watcher)
waitfor 30 "a watcher is connected to iapd" grep -q '"event":"connected"' "$results/bt-watch.out"
start=$SECONDS
"$iapctl" send com.example.echo "$work/payload" --verify-echo --json > "$results/bt-send-echo.json" 2> "$results/bt-send-echo.err" &
echo_pid=$!
"$iapctl" send com.example.telemetry "$work/payload2" --verify-echo --json > "$results/bt-send-telemetry.json" 2> "$results/bt-send-telemetry.err" &
telemetry_pid=$!
pids+=($echo_pid $telemetry_pid)
wait "$echo_pid" || fail "round 2: the send on com.example.echo failed: $(tail -2 "$results/bt-send-echo.err" | tr '\n' ' ')"
wait "$telemetry_pid" || fail "round 2: the send on com.example.telemetry failed: $(tail -2 "$results/bt-send-telemetry.err" | tr '\n' ' ')"
took=$((SECONDS - start))
for file in bt-send-echo bt-send-telemetry; do
    grep -q '"verified":true' "$results/$file.json" || fail "round 2: $file was not verified"
done
say "ok: round 2: two EA sessions at once through iapd (two iapctl processes), $mib MiB each, byte-exact, in ${took} s"
# iapctl bench over Bluetooth, through iapd: the bytes each way and the round trips (the link is iapd's).
"$iapctl" bench -t 2 --warmup 0.5 --latency-count 50 --json com.example.echo > "$results/bt-bench.json" 2> "$results/bt-bench.err" \
    || fail "round 2: iapctl bench exited $?: $(tail -2 "$results/bt-bench.err" | tr '\n' ' ')"
python3 - "$results/bt-bench.json" <<'PY' || fail "round 2: iapctl bench: $(head -c 400 "$results/bt-bench.json")"
import json, sys
run = json.loads(open(sys.argv[1]).readline())["runs"][0]
assert run["failure"] is None and run["verified"] is True and run["bytesIn"] > 0 and run["latency"]["count"] == 50, run
print(f"bluetooth: ok: round 2: iapctl bench through iapd: out {run['bytesPerSecondOut'] / 1e3:.1f} kB/s, in {run['bytesPerSecondIn'] / 1e3:.1f} kB/s, "
      f"round trip p50 {run['latency']['p50Nanoseconds'] / 1e6:.1f} ms", file=sys.stderr)
PY

# Round 3: the accessory's controller goes off in the middle of two transfers: both sends end
# with an error, iapd goes on (and answers), the accessory is gone from it.
"$iapctl" send com.example.echo "$work/long" --verify-echo --json > "$results/bt-cut-echo.json" 2> "$results/bt-cut-echo.err" &
echo_pid=$!
"$iapctl" send com.example.telemetry "$work/long" --verify-echo --json > "$results/bt-cut-telemetry.json" 2> "$results/bt-cut-telemetry.err" &
telemetry_pid=$!
pids+=($echo_pid $telemetry_pid)
sleep 3 # a script may sleep: let both transfers get going
alive "$echo_pid" && alive "$telemetry_pid" || fail "round 3: a transfer of 64 MiB ended within 3 s"
power hci1 false || fail "cannot power hci1 off"
cut=$SECONDS
for pid in "$echo_pid" "$telemetry_pid"; do
    timeout 120 tail --pid="$pid" -f /dev/null || fail "round 3: a send did not end within 120 s of the power-off"
done
status_echo=0; wait "$echo_pid" || status_echo=$?
status_telemetry=0; wait "$telemetry_pid" || status_telemetry=$?
[ "$status_echo" != 0 ] && [ "$status_telemetry" != 0 ] || fail "round 3: a send succeeded though the accessory went away (exits $status_echo, $status_telemetry)"
say "ok: round 3: the accessory's controller powered off mid-transfer: both sends ended with an error within $((SECONDS - cut)) s (exits $status_echo and $status_telemetry): $(tail -1 "$results/bt-cut-echo.err" | cut -c1-240)"
alive "$iapdpid" || fail "round 3: iapd died ($(tail -5 "$results/iapd.log" | tr '\n' ' '))"
"$iapctl" wait --gone --timeout 60 > /dev/null 2>&1 || fail "round 3: iapd still lists the accessory"
say "ok: round 3: iapd keeps running and no longer lists the accessory"
stop_simulator

# Round 4: the accessory comes back (its controller on, the simulator connecting again): iapd
# identifies it again, as a new connection.
power hci1 true || fail "cannot power hci1 on"
waitfor 20 "hci1 powered again" sh -c "dbus-send --system --print-reply --dest=org.bluez /org/bluez/hci1 org.freedesktop.DBus.Properties.Get string:org.bluez.Adapter1 string:Powered | grep -q 'boolean true'"
start_simulator 4
"$iapctl" wait --protocol com.example.echo --timeout 120 > /dev/null 2> "$results/bt-wait-4.err" \
    || fail "round 4: the accessory was not identified again through iapd ($(tail -3 "$results/bt-wait-4.err" | tr '\n' ' '))"
"$iapctl" list --json > "$results/bt-list-4.json" 2>&1 || fail "round 4: iapctl list through iapd failed"
identity=$(check_identity "$results/bt-list-4.json") || fail "round 4: $identity"
waitfor 30 "the watcher saw the accessory come back" sh -c "[ \$(grep -c '\"event\":\"connected\"' '$results/bt-watch.out') -ge 2 ]"
gone=$(grep -n '"event":"disconnected"' "$results/bt-watch.out" | tail -n 1 || true)
back=$(grep -n '"event":"connected"' "$results/bt-watch.out" | tail -n 1 || true)
[ -n "$gone" ] && [ "${gone%%:*}" -lt "${back%%:*}" ] || fail "round 4: the watcher saw no disconnect before the accessory came back: $(cat "$results/bt-watch.out")"
before=$(grep -o '"connectionID":[0-9]*' <<<"$gone" | head -n 1)
after=$(grep -o '"connectionID":[0-9]*' <<<"$back" | head -n 1)
[ -n "$after" ] && [ "$before" != "$after" ] || fail "round 4: the same connection after a reconnection ($before, $after)"
grep -q '"transport":"bluetooth"' <<<"$back" || fail "round 4: the watcher's accessory is not on bluetooth: $back"
kill -INT "$watcher" 2>/dev/null; wait "$watcher" 2>/dev/null
printf 'hello over bluetooth\n' > "$work/small"
"$iapctl" send com.example.echo "$work/small" --verify-echo > /dev/null 2>&1 || fail "round 4: an echo after the reconnection failed"
say "ok: round 4: identified again through iapd (the watcher saw it go, then ${after#*:} after ${before#*:}) and echoing: $identity"
stop_simulator
kill -TERM "$iapdpid"
status=0; wait "$iapdpid" || status=$?
[ "$status" = 0 ] || fail "iapd exited $status on SIGTERM"
say "ok: iapd stopped cleanly on SIGTERM ($(grep -c . "$results/iapd.log") log lines)"
unset IAPD_SOCKET
fi

# The numbers: an EA echo over iAP2 on RFCOMM beside a raw RFCOMM echo between the same adapters.
if [ -n "${BLUETOOTH_BENCH_MIB:-}" ]; then
    read -r -a benches <<<"${BLUETOOTH_BENCH_IAPBENCH:-$REPO/.build/release/iapbench}"
    [ "${#benches[@]}" -gt 0 ] || fail "BLUETOOTH_BENCH_IAPBENCH names no iapbench binary"
    turns=("${benches[@]}")
    [ "${#benches[@]}" -eq 1 ] || turns=("${benches[@]}" "${benches[@]}")
    for bench in "${turns[@]}"; do
        [ "${#benches[@]}" -eq 1 ] || say "iapbench: $bench"
        timeout 500 "$bench" bluetooth --host "$host" --accessory "$accessory" --mib "$BLUETOOTH_BENCH_MIB" \
            --rounds "${BLUETOOTH_BENCH_ROUNDS:-3}" ${BLUETOOTH_BENCH_VERBOSE:+--verbose} \
            ${BLUETOOTH_BENCH_PERF:+--perf "$BLUETOOTH_BENCH_PERF"} 2>&1 | tee -a "$log" || fail "iapbench bluetooth failed"
    done
fi
say "done"
