#!/usr/bin/env bash
# Bluetooth on a real kernel stack, in the usb-rig guest (root): hci_vhci and btvirt (Debian's
# bluez-test-tools) make two virtual BR/EDR controllers on one virtual air; a system bus and
# bluetoothd run in the guest. The host side (iapctl --bluetooth, with its NoInputNoOutput
# pairing agent) registers the iAP2 service on one controller; the simulator (iapctl simulate
# --bluetooth) connects from the other over RFCOMM, pairing by Just Works on the way. Checks:
# identified over Bluetooth, a session echoed byte-exact, the accessory's controller powered
# off mid-transfer ends the transfer with an error, a new connection identifies again.
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
fail() { say "FAILED: $*"; exit 1; }
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

# Round 1: the host waits for an accessory, sends the payload through com.example.echo and
# checks the echo; the simulator connects from the other controller.
"$iapctl" --no-usb --bluetooth --bluetooth-agent --bluetooth-channel "$channel" --timeout 180 -v \
    send com.example.echo "$work/payload" --verify-echo --json > "$results/bt-host-1.json" 2> "$results/bt-host-1.err" &
hostpid=$!
pids+=($hostpid)
waitfor 60 "the host registered the iAP2 profile" grep -q "registered with BlueZ" "$results/bt-host-1.err"
start=$SECONDS
"$iapctl" simulate --bluetooth "$host:$channel" --bluetooth-from "$accessory" -v > "$results/bt-accessory-1.log" 2>&1 &
accessorypid=$!
pids+=($accessorypid)
status=0
wait "$hostpid" || status=$?
took=$((SECONDS - start))
say "round 1: host exit $status after ${took} s: $(tr -d '\n' < "$results/bt-host-1.json" | cut -c1-400)"
[ "$status" = 0 ] || { say "host stderr: $(tail -5 "$results/bt-host-1.err" | tr '\n' ' ')"; say "accessory: $(tail -5 "$results/bt-accessory-1.log" | tr '\n' ' ')"; fail "round 1"; }
grep -q '"bluetooth"' "$results/bt-host-1.json" || say "note: the JSON does not say transport bluetooth"
kill "$accessorypid" 2>/dev/null; wait "$accessorypid" 2>/dev/null
say "ok: round 1, $mib MiB echoed byte-exact over RFCOMM in ${took} s (pairing included)"
dbus-send --system --print-reply --dest=org.bluez "/org/bluez/hci0/dev_${accessory//:/_}" org.freedesktop.DBus.Properties.Get \
    string:org.bluez.Device1 string:Paired >> "$log" 2>&1 || say "note: hci0 has no device object for the accessory"

# Round 2: the accessory's controller powered off in the middle of a transfer: the host's send
# ends with an error (74), not a hang.
"$iapctl" --no-usb --bluetooth --bluetooth-agent --bluetooth-channel "$channel" --timeout 180 -v \
    send com.example.echo "$work/payload" --verify-echo --json > "$results/bt-host-2.json" 2> "$results/bt-host-2.err" &
hostpid=$!
pids+=($hostpid)
waitfor 60 "the host registered again" grep -q "registered with BlueZ" "$results/bt-host-2.err"
"$iapctl" simulate --bluetooth "$host:$channel" --bluetooth-from "$accessory" -v > "$results/bt-accessory-2.log" 2>&1 &
accessorypid=$!
pids+=($accessorypid)
waitfor 120 "the accessory identified again" grep -q "identified" "$results/bt-host-2.err"
sleep 1
dbus-send --system --print-reply --dest=org.bluez /org/bluez/hci1 org.freedesktop.DBus.Properties.Set \
    string:org.bluez.Adapter1 string:Powered variant:boolean:false > /dev/null || say "cannot power hci1 off"
status=0
timeout 120 tail --pid="$hostpid" -f /dev/null || say "the host did not end within 120 s of the power-off"
wait "$hostpid" || status=$?
say "round 2: host exit $status after the accessory's controller went off: $(tr -d '\n' < "$results/bt-host-2.json" | cut -c1-300) $(tail -2 "$results/bt-host-2.err" | tr '\n' ' ')"
[ "$status" != 0 ] || say "note: the transfer finished before the controller went off"
say "done"
