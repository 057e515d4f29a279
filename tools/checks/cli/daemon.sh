# iapd (beside iapctl) as iapctl meets it: found at $IAPD_SOCKET, said by -v, its counters, report
# beside it, stopped cleanly by SIGTERM; a send through it to an accessory that stops
# acknowledging; Bluetooth where no bus answers; a bad Bluetooth address.
# shellcheck shell=bash

need_iapd() { [ -x "$IAPD" ] || { echo "$IAPD is missing (swift build)"; return 1; }; }

fixture iapd start_iapd stop_iapd
start_iapd() { # iapd --simulate at $WORK/iapd.sock, its log $WORK/iapd.log
    need_iapd || return 1
    daemon_start iapd "$IAPD" --socket "$WORK/iapd.sock" --no-usb --simulate -v
    wait_for_socket "$WORK/iapd.sock" || { cat "$WORK/iapd.log"; return 1; }
}
stop_iapd() { daemon_stop iapd; }

check --with iapd "iapctl lists the accessory iapd serves at IAPD_SOCKET, and -v says it goes through iapd" check_iapctl_through_iapd
check_iapctl_through_iapd() {
    exits 0 env IAPD_SOCKET="$WORK/iapd.sock" "$IAPCTL" -v list
    contains "$ERR" "going through iapd at $WORK/iapd.sock"
    contains "$OUT" "Multi Sensor"
}

check --with iapd "iapctl stats --json (iapd's counters) validates against the schema" check_stats_json
check_stats_json() {
    run within 60 env IAPD_SOCKET="$WORK/iapd.sock" "$IAPCTL" stats --json
    exit_was 0
    json_valid stats "$OUT"
}

# report never goes through iapd: it says iapd holds the accessories and how to stop it.
report_beside_iapd() {
    REPORT=$WORK/report-iapd.txt
    once report-iapd env IAPD_SOCKET="$WORK/iapd.sock" "$IAPCTL" --no-usb report -o "$REPORT"
}

check --with iapd "report while iapd runs exits 0 and stops at open: no accessory found" check_report_beside_iapd
check_report_beside_iapd() {
    report_beside_iapd
    exit_was 0
    contains "$ERR" "stopped at open: no accessory found"
}

check --with iapd "report while iapd runs says iapd holds the accessories and how to stop it, as its next step" check_report_says_stop_iapd
check_report_says_stop_iapd() {
    report_beside_iapd
    contains "$REPORT" "iapd is running (it listens at $WORK/iapd.sock) and holds the machine's accessories: stop it with 'sudo systemctl stop iapd.socket iapd.service'"
    contains "$REPORT" "next: Stop iapd"
}

check --with iapd "iapd exits 0 on SIGTERM" check_iapd_sigterm_status
check_iapd_sigterm_status() {
    daemon_stop iapd
    [ "$(cat "$WORK/iapd.status")" -eq 0 ] || { echo "iapd exited with $(cat "$WORK/iapd.status") on SIGTERM:"; tail -n 20 "$WORK/iapd.log"; return 1; }
}

check --with iapd "iapd removes its socket on SIGTERM" check_iapd_sigterm_socket
check_iapd_sigterm_socket() {
    daemon_stop iapd
    [ ! -e "$WORK/iapd.sock" ] || { echo "iapd left its socket behind after SIGTERM"; return 1; }
}

check --with iapd "iapd logs its stop on SIGTERM" check_iapd_sigterm_logged
check_iapd_sigterm_logged() {
    daemon_stop iapd
    contains "$WORK/iapd.log" "stopping (signal 15)"
}

# Through iapd, acknowledged means the accessory has the bytes (protocol 3): the accessory that
# stops reading fails the send as it does directly (exit 74, what it acknowledged).
send_through_iapd_to_stuck_sink() { # once, with an iapd of its own (ended when the check ends)
    local profile data
    if [ ! -f "$WORK/once/send-stuck-iapd/status" ]; then
        need_iapd
        profile=$(stuck_sink)
        "$IAPD" --socket "$T/iapd-stuck.sock" --no-usb "--simulate=$profile" 2> "$T/iapd-stuck.log" &
        on_exit stop_process $!
        wait_for_socket "$T/iapd-stuck.sock"
    fi
    data=$(data_file stuck.bin 3000000)
    once send-stuck-iapd within 120 env IAPD_SOCKET="$T/iapd-stuck.sock" "$IAPCTL" send com.example.sink "$data" --stall-timeout 2 --json
}

check "send through iapd to an accessory that stops acknowledging gives up (74) and is not ok" check_send_stuck_through_iapd
check_send_stuck_through_iapd() {
    send_through_iapd_to_stuck_sink
    exit_was 74
    contains "$OUT" '"ok":false'
}

check "through iapd, a stuck send reports what the accessory acknowledged, as directly (within 64 KiB)" check_send_stuck_through_iapd_acknowledged
check_send_stuck_through_iapd_acknowledged() {
    local through stuck
    send_through_iapd_to_stuck_sink
    through=$(json_number bytesAcknowledged "$OUT")
    send_to_stuck_sink
    stuck=$(json_number bytesAcknowledged "$OUT")
    [ -n "$stuck" ] || { echo "the direct send reported no bytesAcknowledged"; return 1; }
    if [ -z "$through" ] || [ "$through" -lt 100000 ] || [ "$through" -ge 3000000 ] \
        || [ $((through > stuck ? through - stuck : stuck - through)) -gt 65536 ]; then
        echo "through iapd '$through' bytes acknowledged, directly $stuck"
        return 1
    fi
}

# Bluetooth asked for where no bus (so no BlueZ) answers: iapd goes on serving, says once what
# stops Bluetooth (it tries again every 5 s), and a bad address is a usage error.
fixture iapd-bluetooth start_iapd_bluetooth stop_iapd_bluetooth
start_iapd_bluetooth() { # iapd --simulate --bluetooth -vv at $WORK/iapd-bt.sock, no bus; its log $WORK/iapd-bt.log
    need_iapd || return 1
    daemon_start iapd-bt env DBUS_SYSTEM_BUS_ADDRESS="unix:path=$WORK/no-such-bus" \
        "$IAPD" --socket "$WORK/iapd-bt.sock" --no-usb --simulate --bluetooth -vv
    # an external process: bounded polls
    for _ in $(seq 1 100); do grep -q "Bluetooth:" "$WORK/iapd-bt.log" 2> /dev/null && break; sleep 0.1; done
}
stop_iapd_bluetooth() { daemon_stop iapd-bt; }

check --with iapd-bluetooth "iapd asked for Bluetooth where no bus answers serves the accessory all the same" check_iapd_bluetooth_serves
check_iapd_bluetooth_serves() {
    exits 0 env IAPD_SOCKET="$WORK/iapd-bt.sock" "$IAPCTL" list
    contains "$OUT" "Multi Sensor"
}

check --with iapd-bluetooth "iapd says once why Bluetooth is not up, and again only at debug priority" check_iapd_bluetooth_said_once
check_iapd_bluetooth_said_once() {
    local log=$WORK/iapd-bt.log
    # The second try (5 s later) says it again at debug only: the journal's priority 7, not 3.
    for _ in $(seq 1 150); do [ "$(grep -c "Bluetooth:" "$log")" -ge 2 ] && break; sleep 0.1; done
    [ "$(grep -c "^<3>.*Bluetooth:" "$log")" = 1 ] && [ "$(grep -c "^<7>.*Bluetooth:" "$log")" -ge 1 ] && return 0
    echo "iapd should say once (then only at debug) why Bluetooth is not up:"
    cat "$log"
    return 1
}

check --with iapd-bluetooth "iapd asked for Bluetooth exits 0 on SIGTERM" check_iapd_bluetooth_sigterm
check_iapd_bluetooth_sigterm() {
    daemon_stop iapd-bt
    [ "$(cat "$WORK/iapd-bt.status")" -eq 0 ] || { echo "iapd exited with $(cat "$WORK/iapd-bt.status") on SIGTERM:"; tail -n 20 "$WORK/iapd-bt.log"; return 1; }
}

check "iapd refuses a --bluetooth-connect that is no address (64), says what one looks like and leaves no socket" check_iapd_bad_bluetooth_address
check_iapd_bad_bluetooth_address() {
    need_iapd
    exits 64 "$IAPD" --socket "$T/iapd-bad.sock" --no-usb --bluetooth-connect nonsense
    contains "$ERR" "is not a Bluetooth address (AA:BB:CC:DD:EE:FF"
    [ ! -e "$T/iapd-bad.sock" ] || { echo "iapd left a socket behind after a bad setting"; return 1; }
}
