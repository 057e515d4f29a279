# iapctl bench (issue 48): the simulator in process in each mode, JSON, sweeps, a comparison, a
# picture, a source started on request, a window of one; and on pseudo-terminals.
# shellcheck shell=bash

bench_both() { once bench-both "$IAPCTL" "${SIM[@]}" bench -t 0.5 --warmup 0.1 --latency-count 200 com.example.echo; }

check "bench (both ways) on the simulator exits 0 and shows the throughput each way" check_bench_throughput
check_bench_throughput() {
    bench_both
    exit_was 0
    contains "$OUT" "throughput: out "
}

check "bench verifies the echo byte for byte" check_bench_echo_verified
check_bench_echo_verified() {
    bench_both
    contains "$OUT" "echo: every byte that came back matches what was sent"
}

check "bench shows latency percentiles of its round trips" check_bench_latency
check_bench_latency() {
    bench_both
    contains "$OUT" "latency (200 round trips of 64 bytes): p50 "
}

check "bench shows the link's view and the host's CPU" check_bench_link_and_cpu
check_bench_link_and_cpu() {
    bench_both
    contains "$OUT" "link: out "
    contains "$OUT" "host CPU: "
}

check "bench -m echo -i 0.1 prints a line per interval" check_bench_intervals
check_bench_intervals() {
    exits 0 "$IAPCTL" "${SIM[@]}" bench -m echo -l 4K -t 0.4 -i 0.1 --warmup 0 --latency-size 0 com.example.echo
    contains "$OUT" "0.00–0.1"
}

check "bench -m sink moves bytes out only" check_bench_sink
check_bench_sink() {
    exits 0 "$IAPCTL" "${SIM[@]}" bench -m sink -n 1M --warmup 0 com.example.sink
    contains "$OUT" "throughput: out "
    lacks "$OUT" "; in "
}

check "bench -m sink --reverse (a source) moves bytes in" check_bench_source
check_bench_source() {
    exits 0 "$IAPCTL" "${SIM[@]}" bench -m sink --reverse -n 1M --warmup 0 com.example.source
    contains "$OUT" "throughput: in "
}

check "bench of two protocols at once names both" check_bench_two_protocols
check_bench_two_protocols() {
    exits 0 "$IAPCTL" "${SIM[@]}" bench -t 0.3 --warmup 0 --latency-size 0 com.example.echo com.example.telemetry
    contains "$OUT" "both on com.example.echo, com.example.telemetry"
}

check "bench --reverse of an echo is a usage error (64)" check_bench_reverse_echo
check_bench_reverse_echo() {
    exits 64 "$IAPCTL" "${SIM[@]}" bench --reverse com.example.echo
}

check "bench of a protocol the accessory lacks exits 69" check_bench_absent_protocol
check_bench_absent_protocol() {
    exits 69 "$IAPCTL" "${SIM[@]}" bench com.example.nowhere
}

check "bench --write-sizes 512,16K gives a row for each size" check_bench_write_sizes
check_bench_write_sizes() {
    exits 0 "$IAPCTL" "${SIM[@]}" bench --write-sizes 512,16K -t 0.3 --warmup 0 --latency-count 100 com.example.echo
    contains "$OUT" "16K "
}

bench_json() { once bench-json "$IAPCTL" "${SIM[@]}" bench -t 0.3 --warmup 0 --latency-count 100 --json --plot "$WORK/bench.svg" com.example.echo; }
bench_limits_json() {
    once bench-limits-json "$IAPCTL" "${SIM[@]}" bench --host-limits 1x4096,8x4096 -t 0.3 --warmup 0 --latency-size 0 --json com.example.echo
}

check "bench --json and bench --host-limits --json exit 0 and validate against the schema" check_bench_json_schema
check_bench_json_schema() {
    local run limits
    bench_json
    exit_was 0
    run=$OUT
    bench_limits_json
    exit_was 0
    limits=$OUT
    json_valid bench "$run" "$limits"
}

check "bench --host-limits --json is a sweep of host limits" check_bench_host_limits_sweep
check_bench_host_limits_sweep() {
    bench_limits_json
    contains "$OUT" '"sweep":"host-limits"'
}

check "bench --compare RUN.json shows the ratios beside the earlier run" check_bench_compare
check_bench_compare() {
    local earlier
    bench_json
    exit_was 0
    earlier=$OUT
    exits 0 "$IAPCTL" "${SIM[@]}" bench -t 0.3 --warmup 0 --latency-count 100 --compare "$earlier" com.example.echo
    contains "$OUT" "beside the earlier run (ratio now / then):"
}

check "bench --plot draws an SVG of the throughput over time, the send window in use and the round trips" check_bench_plot
check_bench_plot() {
    bench_json
    exit_was 0
    python3 - "$WORK/bench.svg" << 'PY'
import sys, xml.etree.ElementTree as tree
root = tree.parse(sys.argv[1]).getroot()
text = " ".join(t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}text"))
assert root.tag == "{http://www.w3.org/2000/svg}svg", root.tag
for words in ("Throughput over time", "Send window in use", "the accessory's limit", "Round trips of 64 bytes", "MB/s", "packets in flight"):
    assert words in text, words
PY
}

# A source that starts on request: with --start it sends; the bytes are counted as the accessory sent them.
check "bench -m source --start sends the bytes that start a source on request, and the bytes come in" check_bench_requested_source
check_bench_requested_source() {
    exits 0 "$IAPCTL" --no-usb "--simulate=$PROFILES/bench/requested-source.json" bench -m source \
        --start "01 02" -n 4M --warmup 0 com.example.stream
    contains "$OUT" "throughput: in "
}

# A window of one packet (the borescope's link, PROTOCOL.md §7.2): the summary names the window.
check "bench of a window of one packet says the accessory's window bound it, and its size" check_bench_window_of_one
check_bench_window_of_one() {
    exits 0 "$IAPCTL" --no-usb --simulate=borescope bench -t 1 --warmup 0.2 --latency-count 20 com.example.borescope.control
    contains "$OUT" "bound by the accessory's window: packets waited behind a full window"
    contains "$OUT" "1 packet in flight at most, of "
}

# On a pseudo-terminal (the UART path): the figures name the serial line.
# check_bench_on_pty PROFILE MODE PROTOCOL [OPTION...]
check_bench_on_pty() {
    local profile=$1 mode=$2 protocol=$3 pty simulator
    shift 3
    coproc BENCHPTY { exec "$IAPCTL" simulate --profile "$profile" 2> "$T/benchpty.err"; }
    simulator=$BENCHPTY_PID
    on_exit stop_process "$simulator"
    read -r -t 20 -u "${BENCHPTY[0]}" pty && [ -n "$pty" ] || { echo "the simulator did not announce its pty:"; cat "$T/benchpty.err"; return 1; }
    exits 0 "$IAPCTL" --no-usb --serial "$pty:3000000" bench -m "$mode" -t 1 --warmup 0.2 --latency-count 50 "$@" --json "$protocol"
    contains "$OUT" '"transport":"serial"'
    python3 - "$OUT" << 'PY'
import json, sys
run = json.loads(open(sys.argv[1]).readline())["runs"][0]
assert run["bytesIn"] > 0 and run["failure"] is None, run
assert run["link"] is not None and run["link"]["sendPacketLength"] > 0, run["link"]
PY
}
check "bench both on a pty (the borescope's window of one) goes over the serial line and moves bytes" \
    check_bench_on_pty borescope both com.example.borescope.control
check "bench source on a pty (a source started on request) goes over the serial line and moves bytes" \
    check_bench_on_pty "$PROFILES/bench/requested-source.json" source com.example.stream --start 01 -n 4M
