#!/usr/bin/env bash
# Runs in the usb-rig guest (root): a real usbmon capture of the host talking to a simulated
# accessory gadget, decoded two ways.
#   1. loads usbmon and starts `tcpdump -i usbmon0` (every bus) before the gadget exists, so the
#      capture holds the enumeration (the configuration descriptor naming the FF/F0/00 interface);
#   2. starts `iapctl simulate --gadget` (multi-sensor) and lets `iapctl info --json` identify it;
#   3. stops the capture, then checks that `iapctl decode --pcap` finds IdentificationInformation
#      with the name, model and serial number the host reported, and that tshark with
#      tools/clients/wireshark/iap.lua shows the same message and parameters, without a Lua error.
# The capture is kept in $USB_RIG_RESULTS/usbmon.pcap for a person to open in Wireshark.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$here/../.." && pwd)
iapctl=$REPO/.build/release/iapctl
results=${USB_RIG_RESULTS:-$REPO/.build/usb-rig/results}
capture=$results/usbmon.pcap
say() { printf 'usbmon: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

[ -x "$iapctl" ] || die "$iapctl is missing (swift build -c release)"
command -v tcpdump >/dev/null || die "tcpdump is missing on the host (tools/usb-rig/run.sh installs it)"
timeout 60 modprobe usbmon || die "modprobe usbmon failed: this kernel has no usbmon"
for _ in $(seq 50); do [ -e /dev/usbmon0 ] && break; sleep 0.1; done
[ -e /dev/usbmon0 ] || die "/dev/usbmon0 did not appear after loading usbmon"

work=$(mktemp -d)
tcpdump_pid="" simulator=""
cleanup() {
    [ -n "$simulator" ] && { kill -TERM "$simulator" 2>/dev/null || true; wait "$simulator" 2>/dev/null || true; }
    [ -n "$tcpdump_pid" ] && { kill -INT "$tcpdump_pid" 2>/dev/null || true; wait "$tcpdump_pid" 2>/dev/null || true; }
    rm -rf "$work"
}
trap cleanup EXIT

# tcpdump says "listening on usbmon0" once it captures; wait for that line.
mkfifo "$work/tcpdump.err"
tcpdump -i usbmon0 -U -w "$capture" 2> "$work/tcpdump.err" &
tcpdump_pid=$!
exec 3< "$work/tcpdump.err"
read -r -t 30 -u 3 line || die "tcpdump did not start"
say "tcpdump: $line"
cat <&3 > "$work/tcpdump.log" &

mkfifo "$work/simulator.out"
"$iapctl" simulate --gadget --profile multi-sensor > "$work/simulator.out" 2> "$work/simulator.log" &
simulator=$!
exec 4< "$work/simulator.out"
read -r -t 30 -u 4 where || die "the simulator did not start: $(cat "$work/simulator.log")"
say "simulated accessory: $where"
# `wait`, not `info`: the gadget is bound to the UDC before the host side has enumerated it, and
# `info` settles at once when no device is there yet (a race CI lost once under load).
"$iapctl" --timeout 30 wait --json > "$work/info.json" || die "iapctl wait found no accessory within 30 s"
kill -TERM "$simulator"; wait "$simulator" 2>/dev/null || true; simulator=""
sleep 1 # the last completions reach the capture
kill -INT "$tcpdump_pid"; wait "$tcpdump_pid" 2>/dev/null || true; tcpdump_pid=""
say "capture: $(stat -c %s "$capture") bytes"

"$iapctl" decode --pcap --json "$capture" > "$work/decoded.json" || say "iapctl decode --pcap exited $? (bytes dropped or incomplete)"
"$iapctl" decode --pcap "$capture" > "$results/usbmon-decoded.txt" || true
python3 - "$work/info.json" "$work/decoded.json" <<'EOF'
import json, sys
info = json.loads(open(sys.argv[1]).read().splitlines()[0])["accessory"]
found = None
for line in open(sys.argv[2]):
    report = json.loads(line)
    for message in report.get("messages", []):
        if message.get("name") == "IdentificationInformation":
            found = {p["name"]: p.get("value") for p in message["parameters"]}
            where = report.get("usb")
if not found:
    sys.exit("usbmon: iapctl decode --pcap found no IdentificationInformation in the capture")
for key, param in [("name", "Name"), ("modelNumber", "ModelIdentifier"), ("serialNumber", "SerialNumber"),
                   ("firmwareRevision", "FirmwareVersion")]:
    if found.get(param) != info[key]:
        sys.exit(f"usbmon: {param} in the capture is {found.get(param)!r}; the host reported {info[key]!r}")
print(f"usbmon: iapctl decode --pcap: IdentificationInformation of {info['name']!r} ({info['serialNumber']}) "
      f"on bus {where['bus']} device {where['device']} endpoint 0x{where['endpoint']:02x}, as the host reported")
EOF

if command -v tshark >/dev/null; then
    name=$(python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["accessory"]["name"])' "$work/info.json")
    tshark -n -X lua_script:"$REPO/tools/clients/wireshark/iap.lua" -r "$capture" -V > "$work/tshark.txt" 2>&1 || true
    if grep -qi "lua error" "$work/tshark.txt"; then die "tshark: the dissector raised a Lua error on the capture"; fi
    count=$(tshark -n -X lua_script:"$REPO/tools/clients/wireshark/iap.lua" -r "$capture" -Y 'iap2.msg == "IdentificationInformation"' \
        -T fields -e iap2.param.value 2>/dev/null | grep -cF "$name" || true)
    [ "$count" -ge 1 ] || die "tshark with iap.lua: no IdentificationInformation naming '$name' in the capture"
    say "tshark with iap.lua: IdentificationInformation naming '$name' ($count frame(s)), no Lua error"
else
    say "tshark is not installed: the dissector half is skipped (tools/ensure-deps.sh tshark)"
fi
