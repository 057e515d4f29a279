#!/usr/bin/env bash
# Runs the ExternalAccessory example (tools/examples/EAEcho) the two ways a user would without
# hardware: against the simulator in process, and against `iapctl simulate` on a pseudo-terminal
# (a separate process, the path serial accessories take). Exits non-zero unless both echoes are
# byte-exact.
#
# Usage: tools/examples/ea-echo-demo.sh [--bin DIR] [--bytes N]   (default .build/release, 4 MiB)
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=.build/release
bytes=$((4 << 20))
while [ $# -gt 0 ]; do
    case "$1" in
        --bin) bin=$2; shift 2 ;;
        --bytes) bytes=$2; shift 2 ;;
        *) echo "usage: $0 [--bin DIR] [--bytes N]" >&2; exit 64 ;;
    esac
done
for tool in ea-echo iapctl; do
    [ -x "$bin/$tool" ] || { echo "ea-echo-demo: no $bin/$tool (swift build -c release)" >&2; exit 1; }
done

echo "ea-echo-demo: in process (--simulate)" >&2
timeout 120 "$bin/ea-echo" --simulate --bytes "$bytes"

work=$(mktemp -d)
simulator=""
# shellcheck disable=SC2317  # reached through the EXIT trap
cleanup() {
    if [ -n "$simulator" ]; then kill -TERM "$simulator" 2>/dev/null || true; wait "$simulator" 2>/dev/null || true; fi
    rm -rf "$work"
}
trap cleanup EXIT
# The simulator prints its pty on its first line (read through a FIFO, as firmware-upgrade-demo.sh does).
mkfifo "$work/simulator.out"
"$bin/iapctl" simulate > "$work/simulator.out" 2> "$work/simulator.log" &
simulator=$!
exec 3< "$work/simulator.out"
if ! read -r -t 30 -u 3 pty; then
    echo "ea-echo-demo: the simulator did not start: $(cat "$work/simulator.log")" >&2
    exit 1
fi
echo "ea-echo-demo: over a pseudo-terminal ($pty, iapctl simulate in another process)" >&2
timeout 120 "$bin/ea-echo" --serial "$pty" --bytes "$bytes"
