#!/usr/bin/env bash
# The unit and integration tests under load: two busy loops (one per core of a 2-core machine)
# beside each run, as on a CI machine that builds something else at the same time. Each run is
# the full-width pass of tools/test.sh (`swift test --skip-build`); with --narrow, also its
# one-thread-pool pass. Prints one line per run and a summary; exits 1 when any run failed.
#
#   tools/checks/under-load.sh [--runs N] [--narrow] [--whole]
#
# --whole runs the whole of tools/test.sh once under the same load instead (about 40 minutes).
set -euo pipefail
cd "$(dirname "$0")/../.."
runs=5
narrow=0
whole=0
while [ $# -gt 0 ]; do
    case "$1" in
        --runs) runs="$2"; shift 2 ;;
        --narrow) narrow=1; shift ;;
        --whole) whole=1; shift ;;
        -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "under-load: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done

# A failed pass's whole output is kept in .build/under-load/ (the summary shows only its tail).
keep() {
    mkdir -p .build/under-load
    cp "$log" ".build/under-load/run-$1.log"
    echo "  its whole output: .build/under-load/run-$1.log"
}

yes > /dev/null & busy1=$!
yes > /dev/null & busy2=$!
log=$(mktemp)
trap 'kill "$busy1" "$busy2" 2>/dev/null; rm -f "$log"' EXIT

if [ "$whole" -eq 1 ]; then
    start=$(date +%s)
    if tools/test.sh > "$log" 2>&1; then result=passed; else result=failed; fi
    echo "tools/test.sh under two busy loops: $result in $(( $(date +%s) - start )) s"
    [ "$result" = passed ] || { tail -n 40 "$log"; keep whole; exit 1; }
    exit 0
fi

swift build --build-tests 2>&1 | grep -E "error|warning:" && exit 1 || true
failed=0
for run in $(seq 1 "$runs"); do
    start=$(date +%s)
    # The same hang bound as tools/test.sh.
    timeout 1800 swift test --skip-build > "$log" 2>&1 || true
    line=$(grep -E "Test run with [0-9]+ tests?" "$log" | tail -n 1 || true)
    if grep -qE "✔ Test run with [0-9]+ tests? .*passed" "$log"; then
        echo "run $run: full width: passed in $(( $(date +%s) - start )) s (${line#*with })"
    else
        failed=$((failed + 1))
        echo "run $run: full width: FAILED after $(( $(date +%s) - start )) s: ${line:-no summary (hung or crashed)}"
        keep "$run-full-width"
        grep -E "✘" "$log" | head -n 20 || true
    fi
    if [ "$narrow" -eq 1 ]; then
        start=$(date +%s)
        bundle="$(swift build --show-bin-path)/AccessoryHostPackageTests.xctest"
        if tools/checks/narrow-pool/by-module.sh "$bundle" > "$log" 2>&1; then
            echo "run $run: one-thread pool, module by module: passed in $(( $(date +%s) - start )) s"
        else
            failed=$((failed + 1))
            echo "run $run: one-thread pool, module by module: FAILED after $(( $(date +%s) - start )) s"
            keep "$run-one-thread"
            grep -vE "passed" "$log" | tail -n 20 || true
        fi
    fi
done
echo "under two busy loops: $failed failed passes in $runs runs"
[ "$failed" -eq 0 ]
