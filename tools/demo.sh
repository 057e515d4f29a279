#!/usr/bin/env bash
# The main job, on a fresh machine: installs what is missing, builds iapctl, and talks to an
# accessory: lists it (the simulated one twice, without and with its test CA as trust anchor: its
# issuer unknown, then verified), opens a session, sends a file through it and verifies the echo
# byte for byte. It uses a USB accessory when one is attached and IAPCTL_PROTOCOL names an echo protocol
# it speaks, a serial one given in IAPCTL_SERIAL (e.g. IAPCTL_SERIAL=/dev/ttyUSB0:115200), and
# otherwise the built-in simulated accessory. With arguments, runs iapctl with them (e.g.
# tools/demo.sh decode tools/data/samples/boya-handshake.hex).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/ensure-deps.sh
# The first release build takes minutes: say so, and show its progress on a terminal.
echo "== building iapctl (swift build -c release; the first build takes a few minutes)" >&2
if [ -t 2 ]; then
    swift build -c release --product iapctl 2>&1 | awk '
        /^\[[0-9]+\/[0-9]+\]/ { printf "\r   %s\033[K", substr($0, 1, 70) > "/dev/stderr"; fflush("/dev/stderr"); next }
        /error|warning:/ { print > "/dev/stderr" }
        END { printf "\r\033[K" > "/dev/stderr" }' || true
else
    swift build -c release --product iapctl 2>&1 | grep -E "error|warning:|Build complete" >&2 || true
fi
iapctl=.build/release/iapctl
[ -x "$iapctl" ] || { echo "demo: the build failed; run: swift build -c release --product iapctl" >&2; exit 1; }
if [ $# -gt 0 ]; then exec "$iapctl" "$@"; fi

source=(--simulate)
protocol=com.example.echo
# The simulator's test CA (tools/data/profiles/generate-test-credentials.sh): trusted, the simulated
# accessory's authentication verifies; without it, its issuer is unknown.
test_ca=tools/data/profiles/test-ca.pem
if [ -n "${IAPCTL_SERIAL:-}" ]; then
    source=(--serial "$IAPCTL_SERIAL")
    protocol=${IAPCTL_PROTOCOL:?set IAPCTL_PROTOCOL to an echo protocol of your accessory}
elif "$iapctl" list --json --timeout 3 2>/dev/null | grep -q '"transport":"usb"'; then
    echo "== USB accessories attached:"
    "$iapctl" list
    if [ -n "${IAPCTL_PROTOCOL:-}" ]; then
        source=()
        protocol=$IAPCTL_PROTOCOL
    else
        echo "(set IAPCTL_PROTOCOL to an echo protocol of yours to exercise it; using the simulated accessory)"
        source=(--simulate --no-usb)
    fi
    echo
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "== iapctl ${source[*]} list"
"$iapctl" "${source[@]}" list
echo
if [ "${source[0]:-}" = --simulate ]; then
    echo "== iapctl ${source[*]} --trust $test_ca list   (the simulator's test CA, which proves nothing)"
    "$iapctl" "${source[@]}" --trust "$test_ca" list
    echo
fi
echo "== echo hello | iapctl ${source[*]} open $protocol"
echo "hello from $(uname -n)" | "$iapctl" "${source[@]}" open "$protocol" --idle 0.3
echo
echo "== iapctl ${source[*]} send $protocol <16 MiB of random bytes> --verify-echo"
head -c $((16 << 20)) /dev/urandom > "$work/payload.bin"
"$iapctl" "${source[@]}" send "$protocol" "$work/payload.bin" --verify-echo
