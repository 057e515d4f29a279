#!/usr/bin/env bash
# Checks the Wireshark dissector (tools/clients/wireshark/iap.lua) against `iapctl decode --pcap --json`:
#   1. a pcapng trace of simulated sessions (the WiresharkTrace test of AccessoryHostTests writes
#      it: detect, SYN, authentication, identification, two EA sessions, a retransmission, an
#      iAP1 accessory): tshark with the dissector must decode every frame to the same kind,
#      length, message names, session ids, EA session ids and lengths, iAP1 command names and
#      transaction ids as iapctl;
#   2. a synthetic usbmon capture (captures.py): the same comparison, frames reassembled across
#      USB transfers on the iAP2 interface's endpoints, other endpoints left out;
#   3. a trace of malformed frames (captures.py): every one gets expert info, and no packet
#      raises a Lua error; iapctl reports them without crashing.
# Usage: tools/clients/wireshark/check.sh [--iapctl PATH] [--trace FILE.pcapng]
#   --trace: compare this trace instead of making one with `swift test` (which needs a debug
#   build with tests, as tools/test.sh makes).
set -euo pipefail
cd "$(dirname "$0")/../../.."
iapctl=.build/debug/iapctl
trace=""
while [ $# -gt 0 ]; do
    case "$1" in
        --iapctl) iapctl=$2; shift 2 ;;
        --trace) trace=$2; shift 2 ;;
        *) echo "check.sh: unknown argument '$1' (--iapctl PATH, --trace FILE)" >&2; exit 64 ;;
    esac
done
command -v tshark >/dev/null || { echo "check.sh: tshark is missing; install Debian's tshark (tools/ensure-deps.sh tshark)" >&2; exit 69; }
[ -x "$iapctl" ] || { echo "check.sh: $iapctl is missing; build it first (swift build)" >&2; exit 66; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
lua=tools/clients/wireshark/iap.lua
echo "check: $(tshark --version 2>/dev/null | head -n 1)"

if [ -z "$trace" ]; then
    trace=$work/simulated.pcapng
    ACCESSORYHOST_TRACE_OUTPUT=$trace swift test --skip-build --filter WiresharkTrace > "$work/test.log" 2>&1 \
        || { cat "$work/test.log" >&2; echo "check.sh: the WiresharkTrace test failed" >&2; exit 1; }
    [ -s "$trace" ] || { echo "check.sh: the WiresharkTrace test wrote no trace" >&2; exit 1; }
fi
python3 tools/clients/wireshark/captures.py "$work"

fields=(-e frame.number -e iapcap.kind -e iapcap.content -e iapcap.length -e iap2.session -e iap2.msg -e iap2.ea.session
        -e iap2.ea.len -e iap1.cmd_name -e iap1.trans -e _ws.expert.message)
dissect() { # capture → tshark's fields, one line per packet; fails on any Lua error
    tshark -n -X lua_script:"$lua" -r "$1" -V > "$work/verbose.txt" 2> "$work/tshark.err" || true
    if grep -qiE "lua error|\[Lua Error" "$work/verbose.txt" "$work/tshark.err"; then
        grep -iE -m 5 "lua error" "$work/verbose.txt" "$work/tshark.err" >&2
        echo "check.sh: the dissector raised a Lua error on $1" >&2
        exit 1
    fi
    tshark -n -X lua_script:"$lua" -r "$1" -T fields -E separator=/t -E occurrence=a -E aggregator=/s "${fields[@]}" 2>/dev/null
}

compare() { # name capture
    dissect "$2" > "$work/$1.tshark"
    "$iapctl" decode --pcap --json "$2" > "$work/$1.json" || true
    python3 - "$work/$1.tshark" "$work/$1.json" "$1" <<'EOF'
import json, sys
tshark_path, json_path, name = sys.argv[1:4]
ours = {}
for line in open(json_path):
    report = json.loads(line)
    if report.get("record") is None:
        continue
    ours.setdefault(report["record"], []).append(report)

def from_iapctl(reports):
    kinds, lengths, sessions, msgs, ea, ealen, cmds, tids = [], [], [], [], [], [], [], []
    for r in reports:
        kind = r["kind"]
        kinds.append(kind if kind in ("iap2", "iap1", "detect") else "other")
        lengths.append(r.get("length"))
        if kind == "iap2":
            sessions.append(r["session"])
            msgs += [m.get("name") or "?" for m in r.get("messages", [])]
            if "eaSession" in r:
                ea.append(r["eaSession"]); ealen.append(r["eaLength"])
        if kind == "iap1":
            cmds.append(r.get("commandName"))
            if r.get("transactionID") is not None:
                tids.append(r["transactionID"])
    return kinds, lengths, sessions, msgs, ea, ealen, cmds, tids

def split(text):
    return [t for t in text.split(" ") if t] if text else []

def from_tshark(cols):
    number, kind, content, length, session, msg, ea, ealen, cmd, trans, expert = (cols + [""] * 11)[:11]
    kinds = ["other" if k == "unknown" else k for k in split(kind)] or (["other"] if content else [])
    msgs = [m if not m.startswith("unknown") else "?" for m in msg.split(" ") if m] if msg else []
    return (kinds, [int(x) for x in split(length)], [int(x) for x in split(session)], msgs,
            [int(x) for x in split(ea)], [int(x) for x in split(ealen)], split(cmd), [int(x, 16) for x in split(trans)])

labels = ["kinds", "lengths", "sessions", "messages", "EA sessions", "EA lengths", "iAP1 commands", "transaction ids"]
failures = 0
frames = 0
for line in open(tshark_path):
    cols = line.rstrip("\n").split("\t")
    number = int(cols[0])
    theirs = from_tshark(cols)
    mine = from_iapctl(ours.get(number, []))
    if not theirs[0] and not mine[0]:
        continue  # a packet neither decodes (USB control, other endpoints)
    frames += 1
    # Packets iapctl reports as dropped or unreadable: only "something is wrong" is compared.
    if "other" in mine[0] or "other" in theirs[0]:
        continue
    for label, a, b in zip(labels, mine, theirs):
        if a != b:
            failures += 1
            print(f"check {name}: frame {number}: {label}: iapctl {a}, tshark {b}", file=sys.stderr)
if frames == 0:
    print(f"check {name}: no frames compared", file=sys.stderr)
    failures += 1
print(f"check {name}: {frames} packets compared, {failures} differences")
sys.exit(1 if failures else 0)
EOF
}

status=0
compare simulated "$trace" || status=1
compare usbmon "$work/usbmon.pcap" || status=1

# Malformed frames: every packet after the first (a valid SYN) carries expert info.
dissect "$work/malformed.pcapng" > "$work/malformed.tshark"
missing=$(awk -F'\t' 'NR > 1 && $11 == "" { print $1 }' "$work/malformed.tshark")
if [ -n "$missing" ]; then
    echo "check malformed: no expert info on packets $(echo $missing)" >&2
    status=1
fi
echo "check malformed: $(($(wc -l < "$work/malformed.tshark") - 1)) malformed packets, each with expert info, no Lua error"
set +e
"$iapctl" decode --pcap "$work/malformed.pcapng" > "$work/malformed.iapctl" 2>&1
code=$?
set -e
if [ "$code" -ne 65 ]; then
    echo "check malformed: iapctl decode --pcap exited $code (expected 65: bytes dropped)" >&2
    status=1
fi
[ "$status" -eq 0 ] && echo "check: the dissector agrees with iapctl decode" || echo "check: FAILED" >&2
exit "$status"
