#!/usr/bin/env bash
# Runs in the usb-rig guest (root): `iapctl bench` against a simulated accessory on a real kernel
# USB stack (a FunctionFS gadget on dummy_hcd, multi-sensor):
#   1. a sweep of write sizes on the iAP2 link, directly, with its SVG (bench-usb-write-sizes.svg);
#   2. one run with a line per interval and its SVG (bench-usb.svg);
#   3. the same protocol through iapd (a private one on a socket of this script's): bytes only;
#   4. what the runs counted against what the accessory counted: every byte each run wrote and
#      read (and the round trips'), summed, equals the simulator's own count of the sessions;
#   5. the iAP2 link against a native transport on iapbench's GadgetFS gadget (FunctionFS serves
#      native interfaces only from Linux 6.8, so `iapctl simulate --gadget` has none on this
#      kernel), with their SVGs (bench-usb-echo.svg, bench-usb-native.svg).
# The JSON and the pictures are kept in $USB_RIG_RESULTS. IAPCTL/IAPD pick the binaries.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$here/../.." && pwd)
iapctl=${IAPCTL:-$REPO/.build/release/iapctl}
iapd=${IAPD:-$REPO/.build/release/iapd}
results=${USB_RIG_RESULTS:-$REPO/.build/usb-rig/results}
say() { printf 'bench: %s\n' "$*" >&2; }
die() { say "FAILED: $*"; exit 1; }
[ -x "$iapctl" ] || die "$iapctl is missing (swift build -c release)"
mkdir -p "$results"

work=$(mktemp -d)
simulator="" daemon=""
cleanup() {
    [ -n "$daemon" ] && { kill -TERM "$daemon" 2>/dev/null || true; wait "$daemon" 2>/dev/null || true; }
    [ -n "$simulator" ] && { kill -TERM "$simulator" 2>/dev/null || true; wait "$simulator" 2>/dev/null || true; }
    rm -rf "$work"
}
trap cleanup EXIT
unset IAPD_SOCKET

mkfifo "$work/simulator.out"
"$iapctl" -v simulate --gadget --profile multi-sensor > "$work/simulator.out" 2> "$work/simulator.log" &
simulator=$!
exec 4< "$work/simulator.out"
read -r -t 30 -u 4 where || die "the simulator did not start: $(cat "$work/simulator.log")"
say "simulated accessory: $where"

check_runs() { # check_runs FILE WHAT ROWS LINK(yes|no)
    python3 - "$@" <<'PY'
import json, sys
path, what, rows, link = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
data = json.loads(open(path).readline())
runs = data["runs"]
assert len(runs) == rows, f"{what}: {len(runs)} runs, expected {rows}"
for run in runs:
    assert run["failure"] is None, f"{what} {run['label']}: {run['failure']}"
    assert run["verified"] is True, f"{what} {run['label']}: the echo was not verified"
    assert run["bytesIn"] > 0 and run["bytesOut"] > 0, f"{what} {run['label']}: nothing moved"
    if link == "native":  # the link is there, and carries none of the session's bytes
        assert run["link"] is not None and run["link"]["dataPacketsOut"] == 0, f"{what} {run['label']}: link {run['link']}"
    else:
        assert (run["link"] is not None) == (link == "yes"), f"{what} {run['label']}: link {run['link']}"
    assert run["transport"] == "usb", run["transport"]
    print(f"{what} {run['label']}: out {run['bytesPerSecondOut'] / 1e6:.2f} MB/s, in {run['bytesPerSecondIn'] / 1e6:.2f} MB/s, "
          f"p50 {run['latency']['p50Nanoseconds'] / 1e3:.0f} µs, bound by {(run['boundBy'] or {}).get('limit', '-')}")
PY
}

"$iapctl" --timeout 30 bench --write-sizes 64,512,2K,16K,64K -t 1 --warmup 0.3 --latency-count 100 --json \
    --plot "$results/bench-usb-write-sizes.svg" com.example.echo > "$results/bench-usb-write-sizes.json" 2> "$work/sweep.err" \
    || die "the write-size sweep exited $?: $(tail -3 "$work/sweep.err")"
check_runs "$results/bench-usb-write-sizes.json" "write size" 5 yes >&2 || die "the write-size sweep"
"$iapctl" --timeout 30 bench -t 3 -i 0.5 --latency-count 300 --plot "$results/bench-usb.svg" com.example.echo \
    > "$results/bench-usb.txt" 2> "$work/one.err" || die "the run with intervals exited $?: $(tail -3 "$work/one.err")"
grep -q "throughput: out " "$results/bench-usb.txt" || die "the run with intervals printed no throughput: $(cat "$results/bench-usb.txt")"
grep -q "bound by" "$results/bench-usb.txt" || die "the run with intervals named no limit"
sed 's/^/bench:   /' "$results/bench-usb.txt" >&2
"$iapctl" --timeout 30 bench -t 3 --latency-count 300 --json com.example.echo > "$results/bench-usb.json" 2> "$work/one.err" \
    || die "the JSON run exited $?"

# Through iapd: the bytes, not the link (iapd has the accessory).
export IAPD_SOCKET=$work/iapd.sock
"$iapd" > "$work/iapd.log" 2>&1 &
daemon=$!
for _ in $(seq 1 100); do [ -S "$IAPD_SOCKET" ] && break; sleep 0.2; done
[ -S "$IAPD_SOCKET" ] || die "iapd did not listen: $(tail -3 "$work/iapd.log")"
"$iapctl" --timeout 30 wait --protocol com.example.echo > /dev/null 2> "$work/wait.err" || die "no accessory through iapd: $(tail -2 "$work/wait.err")"
"$iapctl" --timeout 30 bench -t 2 --latency-count 100 --json com.example.echo > "$results/bench-usb-iapd.json" 2> "$work/iapd-bench.err" \
    || die "the run through iapd exited $?: $(tail -3 "$work/iapd-bench.err")"
check_runs "$results/bench-usb-iapd.json" "through iapd" 1 no >&2 || die "the run through iapd"
kill -TERM "$daemon"; wait "$daemon" 2>/dev/null || true; daemon=""
unset IAPD_SOCKET

# The accessory's own count: the simulator says each session's bytes when it closes.
kill -TERM "$simulator"; wait "$simulator" 2>/dev/null || true; simulator=""
python3 - "$work/simulator.log" "$results/bench-usb-write-sizes.json" "$results/bench-usb.json" "$results/bench-usb-iapd.json" <<'PY' >&2 || die "the counts differ"
import json, re, sys
log, files = sys.argv[1], sys.argv[2:]
accessory_in = accessory_out = 0
for line in open(log):
    found = re.search(r"session \d+ closed: com\.example\.echo, (\d+) bytes in, (\d+) out", line)
    if found:
        accessory_in += int(found.group(1)); accessory_out += int(found.group(2))
written = read = 0
for path in files:
    for run in json.loads(open(path).readline())["runs"]:
        trips = run["latency"]["count"] * run["latency"]["size"] if run["latency"] else 0
        written += run["bytesWrittenTotal"] + trips
        read += run["bytesReadTotal"] + trips
# The text run (bench-usb.txt) is not in JSON: its bytes are the difference, and must be positive.
assert accessory_in >= written and accessory_out >= read, (accessory_in, written, accessory_out, read)
assert accessory_in - written == accessory_out - read, "the text run's echo differs from what it wrote"
print(f"bench: the accessory counted {accessory_in} bytes in and {accessory_out} out on com.example.echo; the JSON runs "
      f"{written} written and {read} read, the text run the rest ({accessory_in - written}), both ways alike")
PY
# The iAP2 link against a native transport on one accessory: iapbench's GadgetFS gadget (the
# simulator's echo on the link, bench.echo.1, and on a native interface of its own, bench.native).
iapbench=${IAPBENCH:-$REPO/.build/release/iapbench}
mkfifo "$work/gadget.in" "$work/gadget.out"
"$iapbench" usb-gadget --mode gadgetfs-native < "$work/gadget.in" > "$work/gadget.out" 2> "$work/gadget.log" &
gadget=$!
exec 5> "$work/gadget.in" 6< "$work/gadget.out"
read -r -t 60 -u 6 answer || answer="no answer: $(tail -2 "$work/gadget.log")"
case "$answer" in
ready)
    for protocol in bench.echo.1 bench.native; do
        name=${protocol#bench.}
        "$iapctl" --timeout 30 bench -t 3 --latency-count 200 --json --plot "$results/bench-usb-${name%.1}.svg" "$protocol" \
            > "$results/bench-usb-${name%.1}.json" 2> "$work/native.err" || die "the run on $protocol exited $?: $(tail -3 "$work/native.err")"
        check_runs "$results/bench-usb-${name%.1}.json" "$protocol" 1 "$([ "$protocol" = bench.native ] && echo native || echo yes)" >&2 \
            || die "the run on $protocol"
    done ;;
unavailable*) say "the native transport is not measured here: ${answer#unavailable: }" ;;
*) die "iapbench's GadgetFS gadget did not start: $answer" ;;
esac
exec 5>&-
wait "$gadget" 2>/dev/null || true
say "all passed"
