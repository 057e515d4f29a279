# Accessories on pseudo-terminals (the UART path): a legacy iAP1 accessory, the choice between an
# accessory on a pty and the in-process simulator, simulate -v, a pty of another user.
# The simulator prints its pty's path as its first line.
# shellcheck shell=bash

fixture legacy-pty start_legacy_simulator stop_legacy_simulator
start_legacy_simulator() { # iapctl simulate --profile legacy-sensor: $LEGACY_PTY
    coproc LEGACY { exec "$IAPCTL" simulate --profile legacy-sensor 2> "$WORK/legacy.err"; }
    LEGACY_SIMULATOR=$LEGACY_PID
    if read -r -t 20 -u "${LEGACY[0]}" LEGACY_PTY && [ -n "$LEGACY_PTY" ]; then
        fixture_export LEGACY_PTY
        return 0
    fi
    echo "the iAP1 simulator did not announce its pty:"
    cat "$WORK/legacy.err"
    return 1
}
stop_legacy_simulator() { stop_process "$LEGACY_SIMULATOR"; }

legacy_list() { once legacy-list "$IAPCTL" --no-usb --serial "$LEGACY_PTY" list --json; }

check --with legacy-pty "list --json shows an iAP1 accessory on a pty with its name, manufacturer and model" check_legacy_listed
check_legacy_listed() {
    legacy_list
    exit_was 0
    contains "$OUT" '"name":"Legacy Sensor","manufacturer":"AccessoryHost Simulator","modelNumber":"SIM-LS1"'
}

check --with legacy-pty "list --json gives an accessory on a pty the protocol version iAP1 and its protocols" check_legacy_version
check_legacy_version() {
    legacy_list
    contains "$OUT" '"protocolVersion":"iAP1","protocolStrings":["com.example.echo","com.example.sink"]'
}

check --with legacy-pty "a 2 MB file goes through an iAP1 session on a pty and comes back intact (send --verify-echo)" check_legacy_send
check_legacy_send() {
    local data
    data=$(data_file legacy.bin 2000000)
    exits 0 "$IAPCTL" --no-usb --serial "$LEGACY_PTY" send com.example.echo "$data" --verify-echo --json
    contains "$OUT" '"ok":true,"protocol":"com.example.echo"'
}

# A choice waits until the sources have settled: accessory 2 on a pty beside the in-process
# simulator is found every time; an ambiguous selector is an error listing the candidates.
fixture pty-simulator start_pty_simulator stop_pty_simulator
start_pty_simulator() { # iapctl simulate -v (Multi Sensor, as the in-process one): $SIM_PTY, its log $WORK/pty-sim.err
    coproc PTYSIM { exec "$IAPCTL" simulate -v 2> "$WORK/pty-sim.err"; }
    PTY_SIMULATOR=$PTYSIM_PID
    if read -r -t 20 -u "${PTYSIM[0]}" SIM_PTY && [ -n "$SIM_PTY" ]; then
        fixture_export SIM_PTY
        return 0
    fi
    echo "the simulator on a pty did not start:"
    cat "$WORK/pty-sim.err"
    return 1
}
stop_pty_simulator() { stop_process "$PTY_SIMULATOR"; }

for attempt in 1 2 3; do
    check --with pty-simulator "open -a 2 picks the accessory on a pty beside the in-process simulator (try $attempt)" check_open_picks_pty
done
check_open_picks_pty() {
    exits 0 "$IAPCTL" --no-usb --serial "$SIM_PTY" --simulate open com.example.echo -a 2 --idle 0.2 < /dev/null
}

check --with pty-simulator "send -a 2 waits for the accessory on a pty too" check_send_picks_pty
check_send_picks_pty() {
    local image
    image=$(data_file image.bin 1000000)
    exits 0 "$IAPCTL" --no-usb --serial "$SIM_PTY" --simulate send com.example.sink "$image" -a 2
}

check --with pty-simulator "a serial number two accessories share is ambiguous (64) and both are listed" check_serial_number_ambiguous
check_serial_number_ambiguous() {
    exits 64 "$IAPCTL" --no-usb --serial "$SIM_PTY" --simulate open com.example.echo -a SIM-MS-0001 < /dev/null
    contains "$ERR" "1 Multi Sensor (serial SIM-MS-0001"
    contains "$ERR" "2 Multi Sensor (serial SIM-MS-0001"
}

check --with pty-simulator "open without -a between two candidates is ambiguous (64) and says how to pick one" check_no_selector_ambiguous
check_no_selector_ambiguous() {
    exits 64 "$IAPCTL" --no-usb --serial "$SIM_PTY" --simulate open com.example.echo < /dev/null
    contains "$ERR" "pick one by its connection id"
}

check --with pty-simulator "simulate -v tells what happens in words, without Swift dumps" check_simulate_verbose_words
check_simulate_verbose_words() {
    "$IAPCTL" --no-usb --serial "$SIM_PTY" list > /dev/null 2>&1 || true
    contains "$WORK/pty-sim.err" "simulator: identified as 'Multi Sensor'"
    lacks "$WORK/pty-sim.err" "IAPLink."
}

# Permission denied on a pty names its owner, not dialout (root only: iapctl runs as nobody).
check "a pty of another user is refused (77), naming its owner, not dialout" check_pty_of_another_user
check_pty_of_another_user() {
    local pty simulator
    [ "$(id -u)" -eq 0 ] || skip "not root: cannot run iapctl as another user"
    command -v setpriv > /dev/null || skip "no setpriv(1)"
    coproc PERM { exec "$IAPCTL" simulate 2> /dev/null; }
    simulator=$PERM_PID
    on_exit stop_process "$simulator"
    read -r -t 20 -u "${PERM[0]}" pty && [ -n "$pty" ] || { echo "the simulator did not announce its pty"; return 1; }
    exits 77 setpriv --reuid=nobody --regid=nogroup --clear-groups "$IAPCTL" --no-usb --serial "$pty" list
    contains "$ERR" "is root's alone"
    lacks "$ERR" "dialout"
}
