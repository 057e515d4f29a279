#!/usr/bin/env bash
# The main job, on a fresh machine: installs what is missing, builds iapctl and shows what it
# does. Today that is decoding a real iAP2 handshake capture; any iapctl arguments given are
# passed through instead (e.g. tools/demo.sh decode --json tools/samples/dji-syn.hex).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/ensure-deps.sh
swift build -c release --product iapctl 2>&1 | grep -E "error|warning:" >&2 || true
[ -x .build/release/iapctl ] || { echo "demo: the build failed; run: swift build -c release --product iapctl" >&2; exit 1; }
if [ $# -eq 0 ]; then
    set -- decode tools/samples/boya-handshake.hex
fi
exec .build/release/iapctl "$@"
