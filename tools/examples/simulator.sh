# Sourced by the example demos: a scratch directory ($work, removed at exit) and
# `start_simulator NAME COMMAND...`, which starts an `iapctl simulate …` in the background
# ($simulator, stopped at exit) and sets $where to the first line it prints (the pty's path, or
# "usb gadget VID:PID on UDC"). The line is read through a FIFO this shell keeps open (fd 3), so
# it is read as soon as it is written, and a simulator that fails at once ends the read with EOF.
work=$(mktemp -d)
simulator=""
# shellcheck disable=SC2317  # reached through the EXIT trap
cleanup() {
    if [ -n "$simulator" ]; then kill -TERM "$simulator" 2>/dev/null || true; wait "$simulator" 2>/dev/null || true; fi
    rm -rf "$work"
}
trap cleanup EXIT

start_simulator() {
    local name=$1
    shift
    mkfifo "$work/simulator.out"
    "$@" > "$work/simulator.out" 2> "$work/simulator.log" &
    simulator=$!
    exec 3< "$work/simulator.out"
    if ! read -r -t 30 -u 3 where; then
        echo "$name: the simulator did not start: $(cat "$work/simulator.log")" >&2
        exit 1
    fi
}
