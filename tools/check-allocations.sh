#!/usr/bin/env bash
# Proves that the codec's steady state allocates nothing per frame: runs every `iapbench codec`
# body a few times and many times under valgrind and compares the heap allocation counts. Set-up
# allocates the same in both runs, so any difference is an allocation inside the loops.
#
# Usage: tools/check-allocations.sh [path/to/iapbench]   (default: .build/release/iapbench)
set -euo pipefail
bench=${1:-.build/release/iapbench}
command -v valgrind >/dev/null || { echo "check-allocations: valgrind is not installed (apt-get install -y valgrind)" >&2; exit 69; }
[ -x "$bench" ] || { echo "check-allocations: $bench not found; run: swift build -c release --product iapbench" >&2; exit 66; }

count_allocs() {
    valgrind --tool=memcheck --error-exitcode=3 "$bench" codec --stream-mib 1 --count "$1" 2>&1 \
        | sed -n 's/.*total heap usage: \([0-9,]*\) allocs.*/\1/p' | tr -d ,
}
few=$(count_allocs 2)
many=$(count_allocs 40)
frames_per_round=$(( 16 + 4096 * 3 + 16 * 2 ))
echo "heap allocations: $few with 2 rounds, $many with 40 rounds (each round decodes and encodes at least $frames_per_round frames)"
if [ -z "$few" ] || [ "$few" != "$many" ]; then
    echo "check-allocations: FAILED: the steady state allocates" >&2
    exit 1
fi
echo "check-allocations: ok, no allocation per frame"
