#!/usr/bin/env bash
# Runs a command as if on a one-processor machine, so that Swift's cooperative pool has a single
# thread: a test that blocks its thread (instead of awaiting, or running with the .ownThread
# trait of Tests/TestThreads) then stalls or hangs the run at once (issue 16).
#   tools/checks/narrow-pool/run.sh swift test --skip-build
# Builds the preloaded library (one-cpu.c) into .build/narrow-pool with the toolchain's clang.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out="$here/../../../.build/narrow-pool"
library="$out/one-cpu.so"
if [ ! -f "$library" ] || [ "$here/one-cpu.c" -nt "$library" ]; then
    mkdir -p "$out"
    compiler=$(dirname "$(readlink -f "$(command -v swift)")")/clang
    [ -x "$compiler" ] || compiler=cc
    "$compiler" -shared -fPIC -O2 -o "$library" "$here/one-cpu.c" -ldl
fi
LD_PRELOAD="$library${LD_PRELOAD:+:$LD_PRELOAD}" exec "$@"
