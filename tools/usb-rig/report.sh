#!/usr/bin/env bash
# Runs in the usb-rig guest (root): `iapctl report` against a simulated accessory on a real
# kernel USB stack (a FunctionFS gadget on dummy_hcd).
#   1. starts `iapctl simulate --gadget` (multi-sensor) and waits for its line;
#   2. runs `iapctl report` and checks the file: every step passed, the USB DEVICE section with
#      the gadget's ids and its FF/F0/00 interface and endpoints, the serial numbers (the
#      identity's and the USB iSerial) left out, the extraction command;
#   3. extracts the embedded trace as the report says and checks that `iapctl decode --pcap`
#      reads it cleanly.
# The report is kept in $USB_RIG_RESULTS/report.txt. IAPCTL picks the binary (default: release).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$here/../.." && pwd)
iapctl=${IAPCTL:-$REPO/.build/release/iapctl}
results=${USB_RIG_RESULTS:-$REPO/.build/usb-rig/results}
report=$results/report.txt
say() { printf 'report: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }
[ -x "$iapctl" ] || die "$iapctl is missing (swift build -c release)"

work=$(mktemp -d)
simulator=""
cleanup() {
    [ -n "$simulator" ] && { kill -TERM "$simulator" 2>/dev/null || true; wait "$simulator" 2>/dev/null || true; }
    rm -rf "$work"
}
trap cleanup EXIT

mkfifo "$work/simulator.out"
"$iapctl" simulate --gadget --profile multi-sensor > "$work/simulator.out" 2> "$work/simulator.log" &
simulator=$!
exec 4< "$work/simulator.out"
read -r -t 30 -u 4 where || die "the simulator did not start: $(cat "$work/simulator.log")"
say "simulated accessory: $where"

# The gadget is bound to the UDC before the host side has enumerated it: wait for the accessory
# first, or the report may settle on no device at all.
"$iapctl" --timeout 30 wait > /dev/null 2> "$work/wait.err" || die "no accessory within 30 s: $(tail -2 "$work/wait.err")"
status=0
"$iapctl" --timeout 30 report -o "$report" 2> "$work/report.err" || status=$?
cat "$work/report.err" >&2
[ "$status" -eq 0 ] || die "iapctl report exited $status"
grep -qF "report written to $report: all steps passed" "$work/report.err" || die "the summary line is not 'all steps passed'"
failures=0
need() { grep -qF -- "$1" "$report" || { say "FAILED: the report lacks '$1'"; failures=$((failures + 1)); }; }
need "RESULT: all steps passed"
need "USB DEVICE"
need "id:            1209:0001"
need "class FF/F0/00"
need "EP 0x"
need "serial:        (left out; --full includes it)"
need "serial number:     (left out; --full includes it)"
need "(the probe echoed)"
if grep -qF "SIM-MS-0001" "$report"; then say "FAILED: the report holds the serial number"; failures=$((failures + 1)); fi
sed -n '/^-----BEGIN PCAPNG/,/^-----END PCAPNG/p' "$report" | sed '1d;$d' | base64 -d > "$work/trace.pcapng"
"$iapctl" decode --pcap "$work/trace.pcapng" > "$work/decoded.txt" || { say "FAILED: decode --pcap exited $?"; failures=$((failures + 1)); }
grep -qF "IdentificationInformation" "$work/decoded.txt" || { say "FAILED: the trace lacks IdentificationInformation"; failures=$((failures + 1)); }
if grep -qF "SIM-MS-0001" "$work/decoded.txt"; then say "FAILED: the trace holds the serial number"; failures=$((failures + 1)); fi
[ "$failures" -eq 0 ] || die "$failures checks failed (the report is in $report)"
say "all passed ($(wc -c < "$report") bytes)"
