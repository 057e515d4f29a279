#!/usr/bin/env bash
# iapd's metrics as Prometheus gets them (issue 35): iapd with --simulate writes its metrics
# file, a known transfer goes through it with iapctl, Debian's prometheus-node-exporter reads
# the file with its textfile collector, and the scrape must show the transfer (bytes each way,
# the accessory, the session, the clients) with no textfile error. Also: `iapctl stats` says
# the same (and validates against docs/json-schema.json), iapctl names an iapd too old for
# stats, a missing metrics directory is logged once and written once it is there. Last, the
# export's cost: iapd with 64 simulated accessories, idle, with --metrics-interval 1 and then
# without metrics, its CPU time read from /proc/PID/stat; the difference is printed as a share
# of one core (the goal: under 1 %).
#
# Usage: tools/checks/metrics/check.sh [--bin DIR] [--cost-seconds N] [--enforce-cost]
#   --bin DIR          where the release executables are (default .build/release)
#   --cost-seconds N   how long each of the two cost runs lasts (default 15; 0 skips them)
#   --enforce-cost     fail when the export costs 1 % of a core or more (a loaded machine
#                      makes the figure noisy, so by default it is only printed)
# Needs root or sudo the first time: it installs prometheus-node-exporter, curl and python3
# with tools/ensure-deps.sh. Exit status: 0 every check passed, 1 one failed, 2 usage.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../../.." && pwd)
bin=$repo/.build/release
cost_seconds=15
enforce_cost=0
usage() { sed -n '12,18p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
while [ $# -gt 0 ]; do
    case "$1" in
        --bin) [ $# -ge 2 ] || usage; bin=$2; shift 2 ;;
        --cost-seconds) [ $# -ge 2 ] || usage; cost_seconds=$2; shift 2 ;;
        --enforce-cost) enforce_cost=1; shift ;;
        -h|--help) usage ;;
        *) echo "metrics-check: unknown argument '$1'" >&2; usage ;;
    esac
done
[[ "$cost_seconds" =~ ^[0-9]+$ ]] || { echo "metrics-check: --cost-seconds takes a whole number of seconds" >&2; exit 2; }
iapd=$bin/iapd
iapctl=$bin/iapctl
for tool in "$iapd" "$iapctl"; do
    [ -x "$tool" ] || { echo "metrics-check: no $tool: build it first (swift build -c release), or give --bin DIR" >&2; exit 1; }
done
"$repo/tools/ensure-deps.sh" prometheus-node-exporter curl python3
exporter=$(command -v prometheus-node-exporter || true)
[ -n "$exporter" ] || { echo "metrics-check: prometheus-node-exporter is not on PATH after installing it" >&2; exit 1; }

work=$(mktemp -d "${TMPDIR:-/tmp}/iapd-metrics.XXXXXX")
pids=()
cleanup() {
    local pid
    for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "metrics-check: FAIL: $*" >&2; exit 1; }
ok() { echo "metrics-check: ok $*"; }

# The value of the one sample of NAME whose labels include every LABEL=VALUE given, as an
# integer (node_exporter writes 1e+06 for 1000000; label order is its own): metric FILE NAME [LABEL=VALUE…].
metric() {
    local file=$1 name=$2
    shift 2
    awk -v name="$name" -v want="$*" '
        BEGIN { wanted = split(want, pairs, " ") }
        /^#/ { next }
        {
            series = $1; base = series; sub(/\{.*/, "", base)
            if (base != name) next
            for (i = 1; i <= wanted; i++) {
                split(pairs[i], kv, "=")
                if (index(series, kv[1] "=\"" kv[2] "\"") == 0) next
            }
            printf "%.0f\n", $2; found++
        }
        END { exit found == 1 ? 0 : 1 }' "$file"
}
# expect FILE NAME VALUE [LABEL=VALUE…]: the sample is there and has VALUE.
expect() {
    local file=$1 name=$2 want=$3 got
    shift 3
    got=$(metric "$file" "$name" "$@") || fail "no single sample $name{$*} in $(basename "$file"): $(grep "^$name" "$file" || echo none)"
    [ "$got" = "$want" ] || fail "$name{$*} is $got, not $want"
}
# Waits (bounded polls of another process's output) until COMMAND succeeds: wait_for WHAT TRIES COMMAND…
wait_for() {
    local what=$1 tries=$2
    shift 2
    for _ in $(seq 1 "$tries"); do "$@" && return 0; sleep 0.1; done
    fail "$what (after $tries tries)"
}
# start_iapd NAME ARGS…: iapd on $work/NAME.sock, logging to $work/NAME.log; sets $iapd_pid.
start_iapd() {
    local name=$1
    shift
    "$iapd" --socket "$work/$name.sock" --no-usb "$@" 2> "$work/$name.log" &
    iapd_pid=$!
    pids+=("$iapd_pid")
    wait_for "iapd ($name) did not make its socket: $(cat "$work/$name.log")" 200 test -S "$work/$name.sock"
}
stop_pid() { kill -TERM "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; }

# 1. A known transfer through iapd, its metrics file replaced every second.
textfile=$work/textfile
mkdir -p "$textfile"
start_iapd main --simulate --metrics-dir "$textfile" --metrics-interval 1 -v
size=1000000
head -c "$size" /dev/urandom > "$work/payload.bin"
IAPD_SOCKET=$work/main.sock timeout 120 "$iapctl" send com.example.echo "$work/payload.bin" --verify-echo --json > "$work/send.json" \
    || fail "iapctl send through iapd: $(cat "$work/send.json")"
grep -q '"ok":true' "$work/send.json" && grep -q '"verified":true' "$work/send.json" || fail "the transfer did not verify: $(cat "$work/send.json")"
ok "sent $size bytes through iapd, echo verified"

# 2. iapctl stats: the same figures from the running iapd, and its JSON as the schema says.
IAPD_SOCKET=$work/main.sock "$iapctl" stats > "$work/stats.txt" || fail "iapctl stats: $(cat "$work/stats.txt")"
grep -q "client → accessory $size, accessory → client $size" "$work/stats.txt" || fail "iapctl stats does not show the transfer: $(cat "$work/stats.txt")"
IAPD_SOCKET=$work/main.sock "$iapctl" stats --json > "$work/stats.json"
python3 - "$work/stats.json" "$size" <<'EOF' || fail "iapctl stats --json: $(cat "$work/stats.json")"
import json, sys
stats = json.loads(open(sys.argv[1]).read())
size = int(sys.argv[2])
simulated = [t for t in stats["transports"] if t["transport"] == "simulated"][0]
assert stats["bytes"] == {"clientToAccessoryTotal": size, "accessoryToClientTotal": size}, stats["bytes"]
assert simulated["identifiedNow"] == 1 and simulated["identifiedTotal"] == 1, simulated
assert stats["sessions"]["openedTotal"] == 1, stats["sessions"]
assert stats["clients"]["connected"] == 1 and stats["clients"]["acceptedTotal"] == 3, stats["clients"]
EOF
if python3 -c 'import jsonschema' 2> /dev/null; then
    python3 "$repo/tools/checks/json-output.py" stats "$work/stats.json" || fail "iapctl stats --json does not validate against docs/json-schema.json"
    ok "iapctl stats --json validates against docs/json-schema.json"
fi
ok "iapctl stats shows the transfer"

# 3. The file, once it shows the transfer done (the session closed, no client left).
prom=$textfile/iapd.prom
file_shows_transfer() {
    [ -f "$prom" ] && cp "$prom" "$work/seen.prom" &&
        [ "$(metric "$work/seen.prom" iapd_session_bytes_total direction=accessory-to-client)" = "$size" ] &&
        [ "$(metric "$work/seen.prom" iapd_sessions_open)" = 0 ] && [ "$(metric "$work/seen.prom" iapd_clients_connected)" = 0 ]
}
wait_for "$prom never showed the transfer: $(cat "$prom" 2>/dev/null || echo missing)" 150 file_shows_transfer
[ "$(find "$textfile" -mindepth 1 | wc -l)" = 1 ] || fail "the metrics directory holds more than iapd.prom: $(ls -A "$textfile")"
ok "iapd.prom shows the transfer, alone in its directory"

# 4. node_exporter's textfile collector reads it; the scrape carries iapd's figures.
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$exporter" --collector.disable-defaults --collector.textfile --collector.textfile.directory="$textfile" \
    --web.listen-address="127.0.0.1:$port" 2> "$work/node-exporter.log" &
pids+=("$!")
wait_for "node_exporter did not answer on 127.0.0.1:$port: $(tail -n 5 "$work/node-exporter.log")" 100 \
    curl -fsS -o /dev/null "http://127.0.0.1:$port/metrics"
curl -fsS "http://127.0.0.1:$port/metrics" > "$work/scrape.txt"
scrape=$work/scrape.txt
expect "$scrape" node_textfile_scrape_error 0
grep -q "^node_textfile_mtime_seconds{file=\"$prom\"}" "$scrape" || grep -q '^node_textfile_mtime_seconds{file="iapd.prom"}' "$scrape" \
    || fail "node_exporter did not read iapd.prom: $(grep node_textfile "$scrape")"
expect "$scrape" iapd_session_bytes_total "$size" direction=client-to-accessory
expect "$scrape" iapd_session_bytes_total "$size" direction=accessory-to-client
expect "$scrape" iapd_accessories 1 transport=simulated state=identified
expect "$scrape" iapd_accessories 0 transport=usb state=identified
expect "$scrape" iapd_accessories_identified_total 1 transport=simulated
expect "$scrape" iapd_sessions_opened_total 1
expect "$scrape" iapd_sessions_open 0
expect "$scrape" iapd_clients_connected 0
expect "$scrape" iapd_clients_accepted_total 3
expect "$scrape" iapd_failures_total 0 kind=transport
expect "$scrape" iapd_open_failures_total 0 code=protocol-in-use
packets=$(metric "$scrape" iapd_link_packets_total transport=simulated direction=sent) || fail "no link packets in the scrape"
[ "$packets" -gt 0 ] || fail "no link packets counted for the simulated accessory"
grep -q '^# TYPE iapd_session_bytes_total counter' "$scrape" || fail "the scrape lost iapd's TYPE lines"
grep -q '^iapd_info{daemon="iapd ' "$scrape" || fail "no iapd_info in the scrape"
ok "node_exporter $("$exporter" --version 2>&1 | head -n 1 | awk '{print $3}') scrapes iapd's metrics: $size bytes each way, 1 accessory, 1 session, 3 clients, no textfile error"
stop_pid "$iapd_pid"
[ ! -e "$prom" ] || fail "iapd left $prom behind when it stopped"
ok "iapd removes its file when it stops"

# 5. An iapd older than stats: it drops the request as unknown; iapctl says to update it.
python3 - "$work/old.sock" > "$work/old.log" 2>&1 <<'EOF' &
import json, socket, struct, sys
def receive(connection):
    header = connection.recv(4, socket.MSG_WAITALL)
    return json.loads(connection.recv(struct.unpack(">I", header)[0], socket.MSG_WAITALL))
def send(connection, message):
    payload = json.dumps(message).encode()
    connection.sendall(struct.pack(">I", len(payload)) + payload)
server = socket.socket(socket.AF_UNIX)
server.bind(sys.argv[1])
server.listen(1)
connection, _ = server.accept()
hello = receive(connection)
send(connection, {"id": hello["id"], "reply": {"welcome": {"version": 3, "daemon": "iapd 0.1.9", "accessories": []}}})
receive(connection)  # stats, which this iapd cannot decode: it answers as iapd 0.2.0 and older do
send(connection, {"reply": {"failure": {"_0": {"code": "bad-request", "message": "iapd dropped this client: the data couldn't be read"}}}})
connection.close()
EOF
pids+=("$!")
wait_for "the stand-in for an old iapd did not listen: $(cat "$work/old.log")" 100 test -S "$work/old.sock"
status=0
IAPD_SOCKET=$work/old.sock "$iapctl" stats > /dev/null 2> "$work/old-stats.err" || status=$?
[ "$status" = 69 ] || fail "iapctl stats against an old iapd exited $status, not 69: $(cat "$work/old-stats.err")"
grep -q "iapd 0.1.9 at $work/old.sock is too old to answer stats" "$work/old-stats.err" && grep -q "update iapd" "$work/old-stats.err" \
    || fail "iapctl does not say the iapd is too old: $(cat "$work/old-stats.err")"
ok "iapctl stats names an iapd too old for it (exit 69)"

# 6. A metrics directory that is not there: said once (with what to do), tried again, written once it is.
missing=$work/not-yet
start_iapd missing --simulate --metrics-dir "$missing" --metrics-interval 0.1 -vv
debug_retries() { [ "$(grep -c '^<7>.*metrics: cannot write' "$work/missing.log")" -ge 2 ]; }
wait_for "iapd did not try the missing directory again: $(grep metrics "$work/missing.log")" 100 debug_retries
[ "$(grep -c '^<3>.*metrics: cannot write' "$work/missing.log")" = 1 ] || fail "the failure is not logged once at error level: $(grep metrics "$work/missing.log")"
grep -q "mkdir -p $missing" "$work/missing.log" || fail "the failure does not say what to do: $(grep metrics "$work/missing.log")"
kill -0 "$iapd_pid" || fail "iapd stopped when it could not write its metrics"
mkdir "$missing"
wait_for "iapd did not write $missing/iapd.prom once the directory was there" 100 test -f "$missing/iapd.prom"
wait_for "iapd did not say it writes its metrics again" 50 grep -q "metrics: $missing/iapd.prom written again" "$work/missing.log"
stop_pid "$iapd_pid"
ok "a missing directory: logged once with the fix, retried, written once it is there"

# 7. The cost: 64 simulated accessories, idle, with metrics every second and without.
[ "$cost_seconds" -gt 0 ] || { echo "metrics-check: all checks passed (cost not measured: --cost-seconds 0)"; exit 0; }
accessories=64
ticks=$(getconf CLK_TCK)
# cpu_run NAME ARGS…: iapd's CPU over $cost_seconds once its accessories are identified, in
# run_ticks (utime+stime of all its threads, from /proc/PID/stat).
cpu_run() {
    local name=$1 before after
    shift
    start_iapd "$name" --simulate --simulate-count "$accessories" "$@"
    all_identified() {
        IAPD_SOCKET=$work/$name.sock "$iapctl" stats --json > "$work/$name.stats" 2> /dev/null &&
            python3 -c 'import json, sys; s = json.load(open(sys.argv[1])); sys.exit(0 if [t for t in s["transports"] if t["transport"] == "simulated"][0]["identifiedNow"] == int(sys.argv[2]) else 1)' \
                "$work/$name.stats" "$accessories"
    }
    wait_for "iapd ($name) did not identify $accessories accessories" 300 all_identified
    before=$(awk '{print $14 + $15}' "/proc/$iapd_pid/stat")
    sleep "$cost_seconds" # the measurement's window, not a wait for anything
    after=$(awk '{print $14 + $15}' "/proc/$iapd_pid/stat")
    stop_pid "$iapd_pid"
    run_ticks=$((after - before))
}
mkdir -p "$work/cost-textfile"
cpu_run cost-metrics --metrics-dir "$work/cost-textfile" --metrics-interval 1
with_ticks=$run_ticks
cpu_run cost-plain
without_ticks=$run_ticks
python3 - "$with_ticks" "$without_ticks" "$ticks" "$cost_seconds" "$accessories" "$enforce_cost" <<'EOF'
import sys
with_ticks, without_ticks, hz, seconds, accessories, enforce = map(int, sys.argv[1:])
share = lambda ticks: 100.0 * ticks / hz / seconds
cost = share(with_ticks) - share(without_ticks)
print(f"metrics-check: {accessories} simulated accessories, idle, {seconds} s each: iapd with --metrics-interval 1 used "
      f"{with_ticks} ticks ({share(with_ticks):.2f} % of a core), without metrics {without_ticks} ({share(without_ticks):.2f} %) "
      f"(utime+stime from /proc/PID/stat at {hz} ticks/s: each figure ±{100.0 / hz / seconds:.2f} %)")
verdict = "met" if cost < 1.0 else "NOT met"
print(f"metrics-check: the export costs {cost:.2f} % of a core; the goal, under 1 %: {verdict}")
sys.exit(1 if enforce and cost >= 1.0 else 0)
EOF
echo "metrics-check: all checks passed"
