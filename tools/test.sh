#!/usr/bin/env bash
# Every test of the project, on a fresh machine: installs what is missing, builds with warnings
# treated as failures, runs the unit and integration tests (twice: the second time with Swift's
# cooperative pool narrowed to one thread, tools/checks/narrow-pool), checks that the codec allocates
# nothing per frame, installs the Python client into a virtual environment and runs its type
# check, tests and echo benchmark (tools/clients/python/check.sh), builds the Debian package and
# installs, runs and purges it (tools/deploy/package),
# runs the in-guest tests on a real kernel USB stack (tools/usb-rig), fuzzes each parser for
# FUZZ_SECONDS (default 30) seconds, and checks the documentation.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/ensure-deps.sh valgrind xxd python3 tshark openssl python3-jsonschema man-db dbus-daemon dpkg-dev lintian prometheus-node-exporter curl systemd \
    python3-venv python3-wheel python3-pytest mypy
fuzz_seconds=${FUZZ_SECONDS:-30}
log=$(mktemp)
trap 'rm -f "$log"' EXIT

step() { printf '\n== %s\n' "$*"; }

step "build (debug, tests included; warnings fail the build)"
swift build --build-tests 2>&1 | tee "$log" | grep -E "error|warning:|Compiling|Build complete" | grep -v "^\[" || true
if grep -q "warning:" "$log"; then echo "test: the build has warnings (see above)" >&2; exit 1; fi
grep -q "Build complete" "$log" || { echo "test: the build failed" >&2; cat "$log" >&2; exit 1; }
# The API boundary: the library products are the API; every other module declares package
# access only and no product re-exports one (tools/checks/public-boundary.py). The public API of
# each product is the one recorded at the release, or a break is said in CHANGELOG.md's
# Upgrading notes (tools/checks/api/api.py, on the symbol graphs of this build).
python3 tools/checks/public-boundary.py
python3 tools/checks/api/api.py
# Every dependency edge of Package.swift is imported somewhere in its target; and the module graph
# in docs/ARCHITECTURE.md (and its Layers table) is the one Package.swift declares: together the
# two make the document's graph the one that builds. module-graph.py fails with a diff when the
# document is behind (`python3 tools/checks/module-graph.py --write` brings it up to date).
python3 tools/checks/unused-dependencies.py
python3 tools/checks/test_module_graph.py
python3 tools/checks/module-graph.py --check
# tools/README.md names every entry of tools/ (a new script gets its line).
python3 tools/checks/tools-index.py

step "unit and integration tests"
# A hung test must fail the run, not eat CI's time: 30 minutes is many times what it takes.
timeout 1800 swift test --skip-build 2>&1 | tee "$log" | grep -vE "^(Test Case|Test Suite|◇|↳|✔ Test [a-zA-Z]|\s*$)" || true
summary=$(grep -E "Test run with [0-9]+ tests?" "$log" | tail -n 1)
echo "$summary"
grep -qE "✔ Test run with [0-9]+ tests? .*passed" "$log" || { echo "test: swift test failed" >&2; exit 1; }

step "unit and integration tests again: Swift's cooperative pool narrowed to one thread, two busy loops beside"
# Swift Testing runs every test, synchronous ones included, on the cooperative pool (one thread
# per core, none added for a thread that blocks). A test that blocks its thread instead of
# awaiting (or running with the .ownThread trait of Tests/TestThreads), or computes for seconds
# on it, holds up every other test's awaits and time-limit timers. One pool thread and two busy
# loops make that show on every run, not only on a busy machine.
yes > /dev/null & busy1=$!
yes > /dev/null & busy2=$!
trap 'kill "$busy1" "$busy2" 2>/dev/null; rm -f "$log"' EXIT
# One test module at a time (tools/checks/narrow-pool/by-module.sh): all of them at once on one pool
# thread beside two busy loops starve the pool of CPU rather than find a blocked thread. iapd's
# 100-client test is skipped here only: on one pool thread it builds up 100 client managers
# over seconds, which the heap-leak test beside it reads as growth (it ran in the pass above).
# The bundle runs directly, as `swift test` runs it for Swift Testing: through `swift test`,
# SwiftPM sees one processor too and its relayed output is not reliable then. NO_COLOR: run
# directly, Swift Testing colours its output when TERM names a terminal that can.
bundle="$(swift build --show-bin-path)/AccessoryHostPackageTests.xctest"
narrow_ok=1
tools/checks/narrow-pool/by-module.sh "$bundle" || narrow_ok=0
kill "$busy1" "$busy2"
trap 'rm -f "$log"' EXIT
[ "$narrow_ok" -eq 1 ] || { echo "test: swift test with a one-thread cooperative pool under load failed or hung (see above)" >&2; exit 1; }

step "ThreadSanitizer: the ring under two threads"
# ByteRing's producer and consumer share memory ordered only by its atomics; its stress tests
# run here instrumented (own scratch path, so the normal build stays uninstrumented).
tsan_failed=0
timeout 1200 swift test --sanitize=thread --scratch-path .build/tsan --filter ByteRingTests 2>&1 | tee "$log" \
    | { grep -vE "^(Test Case|Test Suite|◇|↳|✔ Test [a-zA-Z]|\s*$)" || true; } || tsan_failed=1
grep -E "Test run with [0-9]+ tests?" "$log" | tail -n 1 || true
# Every TSan report has "ThreadSanitizer: " ("WARNING: ThreadSanitizer: data race", "FATAL: …").
if grep -q "ThreadSanitizer: " "$log"; then echo "test: ThreadSanitizer reported a problem in the ByteRing tests (see above)" >&2; exit 1; fi
if [ "$tsan_failed" -ne 0 ] || ! grep -qE "✔ Test run with [0-9]+ tests? .*passed" "$log"; then
    echo "test: swift test --sanitize=thread --filter ByteRingTests failed or timed out" >&2; exit 1
fi

step "Wireshark: tshark with tools/clients/wireshark/iap.lua against iapctl decode --pcap (a simulated trace, usbmon, malformed frames)"
timeout 300 tools/clients/wireshark/check.sh --iapctl .build/debug/iapctl

step "release build (the Swift runtime linked statically, as the Debian package ships it) and allocation check"
# The shipping build: the package, the allocation check, the examples and every benchmark
# number use it. Warnings fail it as in the debug build.
tools/deploy/package/release-build.sh
tools/checks/allocations.sh .build/release/iapbench

step "cost in instructions under cachegrind: each path per payload byte and per 64-byte round trip, against tools/checks/bench/cost.json"
# Instructions do not swing with the machine's load as seconds do: a figure past its recorded
# bound (15 %, the Python process's 35 %: several times the run-to-run spread of how threads
# take turns) is a change of the code path. About 40 s.
timeout 900 .build/release/iapbench cost --python-client tools/clients/python --check tools/checks/bench/cost.json

step "scale: 1,000 accessories on pseudo-terminals in one host process (issue 16's goal: all identified within 10 s)"
# Exits 69 when any is not identified within the timeout; the figures go into the log.
timeout 300 .build/release/iapbench ptys --accessories 1000 --timeout 10

step "soak: 1,000 connect/disconnect cycles, then 1 GiB through 4 sessions at 5 % loss (memory and descriptors flat)"
# One malloc arena: glibc otherwise keeps a cache per Dispatch worker thread, and which threads
# happen to allocate moves the resident size by tens of MiB with nothing leaked. Exits 70 when
# memory or descriptors grew.
MALLOC_ARENA_MAX=1 timeout 600 .build/release/iapbench soak --cycles 1000 --mib 1024 --loss 5

step "iapctl as scripts and people see it (exit codes, JSON against its schema, the socket, help, install, man page, completion)"
timeout 300 tools/checks/cli/run.sh .build/release/iapctl

step "the Python client (tools/clients/python): installed into a virtual environment, mypy --strict, pytest against a real iapd, the 16 MiB echo against iapctl send"
tools/clients/python/check.sh --bin .build/release

step "firmware-upgrade example over a pseudo-terminal (separate iapctl processes)"
timeout 300 tools/examples/firmware-upgrade-demo.sh --iapctl .build/release/iapctl --mib 4

step "firmware upgrades of a fleet at once through iapd (pseudo-terminals, the Python client): rounds of 1, 2, 4 and 8, then 4 with one unplugged mid-transfer, then 2 through iapctl processes"
export PYTHON=$PWD/.build/python-venv/bin/python
timeout 300 tools/examples/firmware-fleet-demo.sh --bin .build/release --counts "1 2 4 8" --mib 4 --via library
timeout 300 tools/examples/firmware-fleet-demo.sh --bin .build/release --counts 4 --mib 4 --unplug --via library
timeout 300 tools/examples/firmware-fleet-demo.sh --bin .build/release --counts 2 --mib 4 --via iapctl

step "the ExternalAccessory example ported from iOS (tools/examples/EAEcho): in process and over a pseudo-terminal"
tools/examples/ea-echo-demo.sh --bin .build/release

step "the core alone (tools/examples/SerialOnly): links no libusb, libdbus or libcrypto, and echoes over a pseudo-terminal"
tools/examples/serial-only-demo.sh --bin .build/release

step "iapd's metrics: the textfile for Prometheus scraped by Debian's node_exporter after a known transfer, iapctl stats, the export's cost with 64 accessories"
timeout 600 tools/checks/metrics/check.sh --bin .build/release

step "Debian packages (accessoryhost, accessoryhost-bench): dpkg-deb and lintian, the size bounds, apt-get install, run with the toolchain out of reach, systemd-analyze verify, purge"
# tools/deploy/package/deb.sh packages the release build above (no second build); check-deb.sh installs
# it on this machine and purges it again (it refuses where the package is installed already).
# deb.sh prints the two packages' paths last: accessoryhost's, then accessoryhost-bench's.
tools/deploy/package/deb.sh --no-build | tee "$log"
mapfile -t debs < <(tail -n 2 "$log")
tools/deploy/package/check-deb.sh "${debs[@]}"

step "real kernel USB stack: the USB rig (qemu guest with dummy_hcd and FunctionFS)"
# tools/usb-rig/README.md: installs qemu and friends, fetches Debian's kernel package, boots it
# under TCG and runs tools/usb-rig/suite.sh in the guest (USBRigTests, the udev rules, iapbench
# usb). ACCESSORYHOST_SKIP_USB_RIG=1 skips it on a machine that cannot run it; CI never sets it.
if [ -n "${ACCESSORYHOST_SKIP_USB_RIG:-}" ]; then
    echo "skipped: ACCESSORYHOST_SKIP_USB_RIG is set"
else
    # The in-guest suite's release test bundle, in its own scratch path (-enable-testing, which
    # the bundle's @testable imports need, stays out of the shipping build above).
    swift build -c release --build-tests -Xswiftc -enable-testing --scratch-path .build/rig-tests 2>&1 | tee "$log" \
        | grep -E "error|warning:" && exit 1 || true
    grep -q "Build complete" "$log" || { echo "test: the rig's test bundle did not build" >&2; cat "$log" >&2; exit 1; }
    tools/usb-rig/run.sh --no-build
fi

step "fuzzing, ${fuzz_seconds}s per target"
tools/checks/fuzz/run.sh "$fuzz_seconds"

step "documentation: every public declaration documented, DocC (the toolchain's docc) without warnings"
# tools/checks/docs/check.py reads the debug build above (no compiling): symbol graphs of every library
# product's modules (swift-symbolgraph-extract), each public or open declaration without a doc
# comment listed; then `docc convert` of each of those modules, with its catalogue
# (Sources/<Module>/<Module>.docc, found by itself) where it has one, warnings failing. About 10 s.
# `swift package generate-documentation` would need the swift-docc-plugin package, which is
# not a dependency. The archives are left in .build/docs/archives. test_check.py tests its
# rules on made-up symbol graphs first.
python3 tools/checks/docs/test_check.py
timeout 300 tools/checks/docs/check.py

step "done"
echo "all tests passed"
echo "$summary"
