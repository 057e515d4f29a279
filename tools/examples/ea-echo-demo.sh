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

# shellcheck source=tools/examples/simulator.sh
. tools/examples/simulator.sh
start_simulator ea-echo-demo "$bin/iapctl" simulate
pty=$where
echo "ea-echo-demo: over a pseudo-terminal ($pty, iapctl simulate in another process)" >&2
timeout 120 "$bin/ea-echo" --serial "$pty" --bytes "$bytes"
