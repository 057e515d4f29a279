#!/usr/bin/env bash
# Runs firmware-upgrade.py against the simulator's firmware-updater accessory, end to end
# through separate iapctl processes as a script in the field would: on a pseudo-terminal
# (default), or as a USB gadget (--usb: root, configfs and a device controller, e.g. in the
# tools/usb-rig guest). tools/test.sh runs the first, the rig's suite the second.
#
# Usage: tools/examples/firmware-upgrade-demo.sh [--usb] [--mib N] [--iapctl PATH]
#   --mib N       image size in MiB (default 4; the image is random, so every run differs)
#   --iapctl PATH the iapctl to use (default .build/release/iapctl, else .build/debug/iapctl)
# Exit status: that of firmware-upgrade.py (0 upgraded), or 1 when the simulator did not start.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
usb=0
mib=4
iapctl=""
while [ $# -gt 0 ]; do
    case "$1" in
        --usb) usb=1; shift ;;
        --mib) mib=$2; shift 2 ;;
        --iapctl) iapctl=$2; shift 2 ;;
        *) echo "usage: $0 [--usb] [--mib N] [--iapctl PATH]" >&2; exit 2 ;;
    esac
done
if [ -z "$iapctl" ]; then
    for candidate in "$repo/.build/release/iapctl" "$repo/.build/debug/iapctl"; do
        [ -x "$candidate" ] && { iapctl=$candidate; break; }
    done
fi
[ -x "$iapctl" ] || { echo "firmware-upgrade-demo: no iapctl built (swift build -c release)" >&2; exit 1; }

# shellcheck source=tools/examples/simulator.sh
. "$here/simulator.sh"
head -c "$((mib << 20))" /dev/urandom > "$work/image.bin"

if [ "$usb" -eq 1 ]; then
    start_simulator firmware-upgrade-demo "$iapctl" simulate --gadget --profile firmware-updater --usb-id 1209:00f1
else
    start_simulator firmware-upgrade-demo "$iapctl" simulate --profile firmware-updater
fi
echo "firmware-upgrade-demo: simulated firmware updater: $where" >&2

target=()
[ "$usb" -eq 1 ] || target=(--serial "$where")
status=0
IAPCTL=$iapctl python3 "$here/firmware-upgrade.py" "${target[@]}" "$work/image.bin" 2.0.0 || status=$?
echo "firmware-upgrade-demo: firmware-upgrade.py exited with $status" >&2
exit "$status"
