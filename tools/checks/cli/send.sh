# iapctl send (and info of a native transport): through a native transport, to accessories that
# vanish or stop acknowledging, interrupted, from disk in bounded memory, progress on a terminal.
# shellcheck shell=bash

check "info --json marks a protocol on a native transport as native" check_info_native
check_info_native() {
    exits 0 "$IAPCTL" --no-usb --simulate=native-streamer info --json
    contains "$OUT" '"name":"com.example.native.sink","matchAction":0,"native":true'
}

check "send --json moves 3 MB through a native transport" check_send_native
check_send_native() {
    local data
    data=$(data_file native.bin 3000000)
    exits 0 "$IAPCTL" --no-usb --simulate=native-streamer send com.example.native.sink "$data" --json
    contains "$OUT" '"ok":true,"protocol":"com.example.native.sink","accessory":{"connectionID":1,'
}

check "send to an accessory that vanishes mid-transfer exits 74" check_send_vanishing_exits_74
check_send_vanishing_exits_74() {
    send_to_vanishing_sink
    exit_was 74
}

check "send --json to an accessory that vanishes after 300000 bytes reports 200000 to 300000 acknowledged" check_send_vanishing_acknowledged
check_send_vanishing_acknowledged() {
    local acknowledged
    send_to_vanishing_sink
    acknowledged=$(json_number bytesAcknowledged "$OUT")
    if [ -z "$acknowledged" ] || [ "$acknowledged" -lt 200000 ] || [ "$acknowledged" -gt 300000 ]; then
        echo "bytesAcknowledged '$acknowledged', expected 200000…300000:"; cat "$OUT"; return 1
    fi
}

check "send to a vanishing accessory says how many of the bytes it acknowledged" check_send_vanishing_message
check_send_vanishing_message() {
    local acknowledged
    send_to_vanishing_sink
    acknowledged=$(json_number bytesAcknowledged "$OUT")
    contains "$ERR" "the accessory acknowledged $acknowledged of 1000000 bytes"
}

# A sink that stops reading keeps the link alive with bare ACKs and acknowledges no more data:
# send gives up after 10 s without progress instead of waiting forever.
check "send to an accessory that stops acknowledging gives up (74) and says it acknowledged nothing for 10 s" check_send_stuck_gives_up
check_send_stuck_gives_up() {
    send_to_stuck_sink
    exit_was 74
    contains "$ERR" "acknowledged nothing for 10"
}

check "send --json to an accessory that stops acknowledging never reports ok" check_send_stuck_not_ok
check_send_stuck_not_ok() {
    send_to_stuck_sink
    contains "$OUT" '"ok":false'
}

check "a stuck send reports what was acknowledged before the accessory stopped reading" check_send_stuck_acknowledged
check_send_stuck_acknowledged() {
    local stuck
    send_to_stuck_sink
    stuck=$(json_number bytesAcknowledged "$OUT")
    if [ -z "$stuck" ] || [ "$stuck" -lt 100000 ] || [ "$stuck" -ge 3000000 ]; then
        echo "bytesAcknowledged '$stuck', expected 100000 to under 3000000:"; cat "$OUT"; return 1
    fi
}

check "send of 5 MiB to an echo without --verify-echo finishes (the echo is drained)" check_send_drains_echo
check_send_drains_echo() {
    local five
    five=$(data_file five.bin $((5 << 20)))
    exits 0 within 60 "$IAPCTL" "${SIM[@]}" send com.example.echo "$five" --stall-timeout 5
}

check "--stall-timeout 1 ends a stuck send (74) and says after how long" check_send_stall_timeout
check_send_stall_timeout() {
    local profile data
    profile=$(stuck_sink)
    data=$(data_file stuck.bin 3000000)
    exits 74 within 60 "$IAPCTL" --no-usb "--simulate=$profile" send com.example.sink "$data" --stall-timeout 1
    contains "$ERR" "acknowledged nothing for 1.0 seconds"
}

check "send interrupted by Ctrl-C exits 130, says what the accessory acknowledged, and its --json is not ok" check_send_interrupted
check_send_interrupted() {
    local profile data sender status=0
    profile=$(stuck_sink)
    data=$(data_file stuck.bin 3000000)
    "$IAPCTL" -v --no-usb "--simulate=$profile" send com.example.sink "$data" --stall-timeout 60 --json > "$T/out" 2> "$T/err" &
    sender=$!
    on_exit stop_process "$sender"
    # -v logs "sending" once Ctrl-C is caught; then the transfer is stuck (the sink stopped reading).
    for _ in $(seq 300); do grep -q "sending" "$T/err" 2> /dev/null && break; sleep 0.1; done
    kill -INT "$sender"
    wait "$sender" || status=$?
    [ "$status" -eq 130 ] || { echo "send interrupted exits $status, not 130:"; cat "$T/err"; return 1; }
    contains "$T/err" "transfer interrupted: the accessory acknowledged"
    contains "$T/out" '"ok":false'
}

check "send streams 100 MB from disk in at most 64 MiB resident" check_send_bounded_memory
check_send_bounded_memory() {
    local big
    big=$T/big.bin
    head -c 100000000 /dev/zero > "$big"
    on_exit rm -f "$big"
    python3 - "$IAPCTL" "$big" << 'PY'
import resource, subprocess, sys
status = subprocess.run([sys.argv[1], "--no-usb", "--simulate", "send", "com.example.sink", sys.argv[2]], capture_output=True).returncode
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024
if status != 0 or peak > 64:
    sys.exit(f"send of 100 MB: exit {status}, {peak} MiB resident at most (limit 64)")
print(f"send of 100 MB: {peak} MiB resident at most", file=sys.stderr)
PY
}

check "send on a pipe draws no progress (nothing on standard error)" check_send_pipe_no_progress
check_send_pipe_no_progress() {
    local five
    five=$(data_file five.bin $((5 << 20)))
    exits 0 "$IAPCTL" "${SIM[@]}" send com.example.sink "$five"
    if [ -s "$ERR" ]; then echo "send on a pipe wrote to standard error:"; cat "$ERR"; return 1; fi
}

check "send on a terminal shows its progress in bytes of the total and the time elapsed" check_send_terminal_progress
check_send_terminal_progress() {
    local five
    command -v script > /dev/null || skip "no script(1) to give iapctl a terminal"
    five=$(data_file five.bin $((5 << 20)))
    script -qec "'$IAPCTL' --no-usb --simulate send com.example.sink '$five'" /dev/null > "$T/tty" 2>&1 || true
    contains "$T/tty" "of 5.24 MB"
    contains "$T/tty" "elapsed"
}

check "send --chunk 0 is a usage error (64)" check_send_chunk_zero
check_send_chunk_zero() {
    local five
    five=$(data_file five.bin $((5 << 20)))
    exits 64 "$IAPCTL" "${SIM[@]}" send com.example.sink "$five" --chunk 0
}
