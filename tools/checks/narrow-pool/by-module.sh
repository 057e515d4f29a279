#!/usr/bin/env bash
# The test bundle on a one-thread cooperative pool (run.sh), one test module at a time, the
# hundred-client daemon test skipped (tools/test.sh says why). Prints each module's failures
# and a summary line; exits 1 when a module failed or hung (600 s each).
#
#   tools/checks/narrow-pool/by-module.sh BUNDLE
set -euo pipefail
cd "$(dirname "$0")/../../.."
bundle="$1"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
failed=()
tests=0
for module in $(grep -o 'testTarget(name: "[A-Za-z]*"' Package.swift | sed 's/.*"\(.*\)"/\1/'); do
    NO_COLOR=1 timeout 600 tools/checks/narrow-pool/run.sh "$bundle" --testing-library swift-testing --filter "^$module\." --skip manyClientsAndCycles 2>&1 | tee "$log" \
        | grep -vE "^(Test Case|Test Suite|◇|↳|✔ Test [a-zA-Z]|✔ Suite|\s*$)" | grep -vE "^Test Suite|^Executed|passed after|^\[" || true
    line=$(grep -E "Test run with [0-9]+ tests?" "$log" | tail -n 1 || true)
    if grep -qE "✔ Test run with [0-9]+ tests? .*passed" "$log"; then
        tests=$((tests + $(sed -E 's/.*with ([0-9]+) tests?.*/\1/' <<<"$line")))
    else
        failed+=("$module")
        echo "$module: ${line:-no summary (hung or crashed)}"
    fi
done
echo "one-thread pool: $tests tests in all, module by module; failed: ${failed[*]:-none}"
[ "${#failed[@]}" -eq 0 ]
