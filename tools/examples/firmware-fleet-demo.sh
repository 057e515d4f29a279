#!/usr/bin/env bash
# A fleet of simulated firmware updaters upgraded at once through iapd by
# `firmware-upgrade.py --fleet`, round by round, with the outcome checked: every accessory
# upgraded and back with the new version (each image verified by the accessory's CRC-32), or,
# with --unplug, the second accessory unplugged as its transfer starts failing alone with its
# reason while the others are upgraded. Each accessory has a serial number of its own
# (SIM-FW-0001, …), on a pseudo-terminal (default) or as a USB gadget on a controller of its own
# (--usb: root, configfs and dummy_hcd loaded with num ≥ N, e.g. the tools/usb-rig guest). iapd
# runs on a socket of its own for each round (told of the pseudo-terminals; on USB it finds the
# gadgets by hotplug). tools/test.sh runs it on pseudo-terminals, the rig's suite on USB.
#
# Usage: tools/examples/firmware-fleet-demo.sh [--usb] [--counts "1 2 4 8"] [--mib N] [--unplug]
#                                              [--bin DIR] [--via library|iapctl]
#   --counts LIST  one round per count, that many accessories at once (default "3")
#   --mib N        image size in MiB, the same image for every accessory (default 4)
#   --unplug       in every round of 2 or more, unplug the second accessory mid-transfer
#   --bin DIR      where iapctl and iapd are (default .build/release)
#   --via WAY      the script's way to iapd: library (the Python client, tools/clients/python, in
#                  $PYTHON, default python3) or iapctl (one `iapctl open` per accessory);
#                  default: library when $PYTHON imports accessoryhost
# Prints per round the aggregate and per-accessory throughput and the host's CPU per MiB (iapd,
# and the script with its iapctl processes); the fleet's JSON lines are in the log.
# Exit status: 0 every round as expected, 1 otherwise (what and why on stderr).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
usb=0
counts="3"
mib=4
unplug=0
bin=$repo/.build/release
via=""
python=${PYTHON:-python3}
while [ $# -gt 0 ]; do
    case "$1" in
        --usb) usb=1; shift ;;
        --counts) counts=$2; shift 2 ;;
        --mib) mib=$2; shift 2 ;;
        --unplug) unplug=1; shift ;;
        --bin) bin=$2; shift 2 ;;
        --via) via=$2; shift 2 ;;
        *) echo "usage: $0 [--usb] [--counts LIST] [--mib N] [--unplug] [--bin DIR] [--via library|iapctl]" >&2; exit 64 ;;
    esac
done
if [ -z "$via" ]; then
    if "$python" -c 'import accessoryhost' 2> /dev/null; then via=library; else via=iapctl; fi
fi
case "$via" in library|iapctl) ;; *) echo "fleet: --via is library or iapctl" >&2; exit 64 ;; esac
iapctl=$bin/iapctl
iapd=$bin/iapd
for binary in "$iapctl" "$iapd"; do
    [ -x "$binary" ] || { echo "fleet: $binary is missing (tools/deploy/package/release-build.sh)" >&2; exit 1; }
done
say() { printf 'fleet: %s\n' "$*" >&2; }
work=$(mktemp -d)
chmod 755 "$work"
simulators=() daemon=""
stop_round() {
    local pid
    [ -z "$daemon" ] || { kill -TERM "$daemon" 2> /dev/null || true; wait "$daemon" 2> /dev/null || true; }
    daemon=""
    # SIGTERM: each gadget removes itself from configfs.
    for pid in "${simulators[@]}"; do kill -TERM "$pid" 2> /dev/null || true; done
    for pid in "${simulators[@]}"; do wait "$pid" 2> /dev/null || true; done
    simulators=()
}
cleanup() { stop_round; rm -rf "$work"; }
trap cleanup EXIT
fail() {
    say "FAILED: $*"
    local file
    for file in "$work"/iapd.log "$work"/fleet.err; do
        [ -s "$file" ] && { say "--- ${file##*/} (last lines) ---"; tail -n 30 "$file" | sed 's/^/    /' >&2; }
    done
    exit 1
}
# Waits (bounded) for a file to have a first line: the simulators are other processes.
wait_line() { local tenths=$1 file=$2; for _ in $(seq 1 "$tenths"); do [ -s "$file" ] && return 0; sleep 0.1; done; [ -s "$file" ]; }
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
ticks_per_second=$(getconf CLK_TCK)

head -c "$((mib << 20))" /dev/urandom > "$work/image.bin"
udcs=()
if [ "$usb" -eq 1 ]; then
    mapfile -t udcs < <(ls /sys/class/udc 2> /dev/null | sort -V)
fi
results=()
for count in $counts; do
    if [ "$usb" -eq 1 ] && [ "${#udcs[@]}" -lt "$count" ]; then
        fail "$count accessories need $count USB device controllers; there are ${#udcs[@]} (modprobe dummy_hcd num=$count)"
    fi
    # The accessories: the firmware updater's profile with a serial number each.
    ports=() gadgets=()
    for index in $(seq 1 "$count"); do
        serial=$(printf 'SIM-FW-%04d' "$index")
        python3 -c 'import json, sys; profile = json.load(open(sys.argv[1])); profile["identity"]["serialNumber"] = sys.argv[2]; json.dump(profile, open(sys.argv[3], "w"))' \
            "$repo/tools/data/profiles/firmware-updater.json" "$serial" "$work/$serial.json"
        out=$work/$serial.out
        : > "$out"
        if [ "$usb" -eq 1 ]; then
            udc=${udcs[$((index - 1))]}
            "$iapctl" simulate --gadget --udc "$udc" --usb-id "1209:$(printf '%04x' $((0xf0 + index)))" --profile "$work/$serial.json" \
                > "$out" 2> "$work/$serial.log" &
            gadgets+=("/sys/kernel/config/usb_gadget/iapsim-$udc/UDC")
        else
            "$iapctl" simulate --profile "$work/$serial.json" > "$out" 2> "$work/$serial.log" &
        fi
        simulators+=($!)
        wait_line 300 "$out" || fail "the simulator $serial did not start within 30 s: $(cat "$work/$serial.log")"
        ports+=("$(head -n 1 "$out")")
    done
    # iapd on a socket of its own: the pseudo-terminals named, or USB by hotplug.
    socket=$work/iapd.sock
    if [ "$usb" -eq 1 ]; then
        "$iapd" --socket "$socket" > /dev/null 2> "$work/iapd.log" &
    else
        serial_options=()
        for port in "${ports[@]}"; do serial_options+=(--serial "$port"); done
        "$iapd" --socket "$socket" --no-usb "${serial_options[@]}" > /dev/null 2> "$work/iapd.log" &
    fi
    daemon=$!
    for _ in $(seq 1 300); do [ -S "$socket" ] && break; sleep 0.1; done
    [ -S "$socket" ] || fail "iapd did not make $socket within 30 s"

    victim="" expect_failure=0
    if [ "$unplug" -eq 1 ] && [ "$count" -ge 2 ]; then victim=SIM-FW-0002; expect_failure=1; fi
    # Unplugs the victim once the fleet says its transfer started: the simulator killed (its
    # pseudo-terminal hangs up), or its gadget's controller unbound (it leaves the bus).
    unplug_victim() {
        if [ "$usb" -eq 1 ]; then echo > "${gadgets[1]}"; else kill -KILL "${simulators[1]}"; fi
        say "unplugged $victim mid-transfer"
    }
    start_ticks=$(cpu_ticks "$daemon")
    accessory_start=0
    for pid in "${simulators[@]}"; do accessory_start=$((accessory_start + $(cpu_ticks "$pid"))); done
    status=0
    IAPD_SOCKET=$socket IAPCTL=$iapctl "$python" "$here/firmware-upgrade.py" --fleet --via "$via" --count "$count" --timeout 120 \
        "$work/image.bin" 2.0.0 > "$work/fleet.jsonl" \
        2> >(tee "$work/fleet.err" | while IFS= read -r line; do
                 printf '%s\n' "$line" >&2
                 if [ -n "$victim" ] && [[ $line == *"$victim: session "* ]]; then
                     unplug_victim || say "could not unplug $victim (the round's check will say what followed)"
                     victim=""
                 fi
             done) || status=$?
    [ -r "/proc/$daemon/stat" ] || fail "iapd exited during the round of $count"
    iapd_ms=$(( ($(cpu_ticks "$daemon") - start_ticks) * 1000 / ticks_per_second ))
    # The accessories' side (the simulators), for the breakdown: they share the machine's cores.
    # An unplugged simulator that was killed counts for nothing.
    accessory_end=0
    for pid in "${simulators[@]}"; do
        [ -r "/proc/$pid/stat" ] && accessory_end=$((accessory_end + $(cpu_ticks "$pid")))
    done
    accessory_ms=$(( (accessory_end - accessory_start) * 1000 / ticks_per_second ))
    (( accessory_ms >= 0 )) || accessory_ms=0
    sed 's/^/fleet: json: /' "$work/fleet.jsonl" >&2
    # The outcome, from the fleet's JSON lines.
    verdict=$(python3 - "$work/fleet.jsonl" "$count" "$expect_failure" "$iapd_ms" "$accessory_ms" <<'EOF'
import json, statistics, sys
lines = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
count, expect_failure, iapd_ms, accessory_ms = int(sys.argv[2]), sys.argv[3] == "1", int(sys.argv[4]), int(sys.argv[5])
rows = [line for line in lines if "serialNumber" in line]
summary = next((line["summary"] for line in lines if "summary" in line), None)
problems = []
if len(rows) != count or summary is None:
    problems.append(f"{len(rows)} accessory lines and {'a' if summary else 'no'} summary for {count} accessories")
for row in rows:
    unplugged = expect_failure and row["serialNumber"] == "SIM-FW-0002"
    if unplugged and (row["result"] != "failed" or not row.get("error")):
        problems.append(f"{row['serialNumber']} was unplugged but is {row['result']}")
    if not unplugged and (row["result"] != "upgraded" or row.get("firmwareAfter") != "2.0.0"):
        problems.append(f"{row['serialNumber']}: {row['result']} {row.get('error', '')}")
if problems:
    print("BAD " + "; ".join(problems))
    sys.exit()
upgraded = [row for row in rows if row["result"] == "upgraded"]
mib = summary["bytes"] / 1048576
print(f"OK {len(upgraded)} of {count} upgraded: {summary['megabytesPerSecond']:.2f} MB/s in all, "
      f"per accessory median {statistics.median(row['megabytesPerSecond'] for row in upgraded):.2f} MB/s; "
      f"host CPU per MiB: iapd {iapd_ms / mib:.1f} ms (whole round), script (via {summary.get('via', '?')}) and any iapctl {summary['clientCPUMillisecondsPerMiB']:.1f} ms "
      f"(script alone {summary['scriptCPUMillisecondsPerMiB']:.1f}); the accessories' {accessory_ms / mib:.1f} ms (whole round)"
      + ("; the unplugged one failed: " + next(row['error'] for row in rows if row['result'] == 'failed') if expect_failure else ""))
EOF
)
    stop_round
    case "$verdict" in
        OK*) ;;
        *) fail "round of $count: ${verdict#BAD }" ;;
    esac
    if [ "$expect_failure" -eq 1 ]; then
        [ "$status" -ne 0 ] || fail "round of $count: one accessory failed, yet firmware-upgrade.py --fleet exited 0"
    else
        [ "$status" -eq 0 ] || fail "round of $count: firmware-upgrade.py --fleet exited $status"
    fi
    results+=("$count accessories: ${verdict#OK }")
    say "round of $count: ${verdict#OK }"
done
say "results ($mib MiB per accessory$([ "$usb" -eq 1 ] && echo ', USB gadgets' || echo ', pseudo-terminals'), the script via $via):"
for line in "${results[@]}"; do say "  $line"; done
