#!/usr/bin/env bash
# The core alone: tools/examples/SerialOnly (serial-echo) links neither libusb, libdbus nor
# libcrypto (ldd says so), and echoes 1 MiB byte for byte through `iapctl simulate` on a
# pseudo-terminal (another process, the path serial accessories take).
#
# Usage: tools/examples/serial-only-demo.sh [--bin DIR]   (default .build/release)
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=.build/release
while [ $# -gt 0 ]; do
    case "$1" in
        --bin) bin=$2; shift 2 ;;
        *) echo "usage: $0 [--bin DIR]" >&2; exit 64 ;;
    esac
done
for tool in serial-echo iapctl; do
    [ -x "$bin/$tool" ] || { echo "serial-only-demo: no $bin/$tool (swift build -c release)" >&2; exit 1; }
done

libraries=$(ldd "$bin/serial-echo")
if grep -E "libusb|libdbus|libcrypto|libssl" <<< "$libraries"; then
    echo "serial-only-demo: serial-echo links the libraries above; the core must not" >&2
    exit 1
fi
echo "serial-only-demo: serial-echo links no libusb, libdbus or libcrypto ($(wc -l <<< "$libraries") libraries in all)" >&2

# shellcheck source=tools/examples/simulator.sh
. tools/examples/simulator.sh
start_simulator serial-only-demo "$bin/iapctl" simulate
timeout 120 "$bin/serial-echo" "$where" com.example.echo $((1 << 20))
