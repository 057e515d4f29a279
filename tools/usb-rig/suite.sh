#!/usr/bin/env bash
# The rig's CI suite, run in the guest by guest.sh (root): the in-guest Swift tests (release
# build of the test bundle: debug Swift is too slow under TCG to move 64 MiB), the udev rules
# applied by the real udevd, the firmware-upgrade example over USB (16 MiB through separate
# iapctl processes) and its fleet mode (8 gadgets at once through iapd, with the Python client),
# the Python client's tests on a gadget (python.sh), `iapctl report` on a gadget (report.sh), `iapbench usb` for the numbers (direct and through iapd), Bluetooth on
# virtual controllers (bluetooth.sh, with `iapbench bluetooth`), and iapd itself on the real
# USB stack (iapd.sh).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$here/../.." && pwd)
bundle=$REPO/.build/rig-tests/release/AccessoryHostPackageTests.xctest
[ -x "$bundle" ] || { echo "suite: $bundle is missing (swift build -c release --build-tests -Xswiftc -enable-testing --scratch-path .build/rig-tests)" >&2; exit 1; }
[ -x "$REPO/.build/release/iapbench" ] || { echo "suite: .build/release/iapbench is missing (swift build -c release)" >&2; exit 1; }

echo "suite: USBRigTests"
ACCESSORYHOST_USB_RIG=1 timeout 600 "$bundle" --testing-library swift-testing --filter USBRig 2>&1 | grep -vE "^.{0,12}(◇|↳)"
echo "suite: the ExternalAccessory facade over USB (after USBRigTests: both bind the first controller)"
ACCESSORYHOST_USB_RIG=1 timeout 300 "$bundle" --testing-library swift-testing --filter EAFacadeRig 2>&1 | grep -vE "^.{0,12}(◇|↳)"
echo "suite: udev rules"
timeout 120 "$here/rules.sh"
echo "suite: an accessory as in the field (supercamera layout, sticks until reset) through iapctl simulate and iapctl watch"
timeout 120 "$here/field.sh"
echo "suite: firmware-upgrade example over USB (16 MiB)"
timeout 300 "$REPO/tools/examples/firmware-upgrade-demo.sh" --usb --mib 16 --iapctl "$REPO/.build/release/iapctl"
echo "suite: the Python client's tests (tools/clients/python) against iapd with the accessory a USB gadget"
timeout 900 "$here/python.sh"
# The fleet's script uses the Python client from the environment tools/clients/python/check.sh made on
# the host (--via library); without it, iapctl processes.
[ -x "$REPO/.build/python-venv/bin/python" ] && export PYTHON=$REPO/.build/python-venv/bin/python
echo "suite: firmware upgrades of a fleet at once through iapd: 8 USB gadgets, one per controller; rounds of 1, 2, 4 and 8, then 4 with one unplugged mid-transfer"
timeout 900 "$REPO/tools/examples/firmware-fleet-demo.sh" --usb --counts "1 2 4 8" --mib 8
timeout 600 "$REPO/tools/examples/firmware-fleet-demo.sh" --usb --counts 4 --mib 4 --unplug
echo "suite: a usbmon capture of the host and the gadget, decoded by iapctl decode --pcap and by tshark"
timeout 300 "$here/usbmon.sh"
echo "suite: iapctl report on a gadget (every step, the USB descriptors, serials left out, the trace extracted and decoded)"
timeout 300 "$here/report.sh"
echo "suite: iapctl bench on a gadget (a sweep of write sizes with its SVG, intervals, through iapd; the counts against the accessory's)"
timeout 300 "$here/bench.sh"
echo "suite: iapbench usb (ceiling, EA over iAP2, EA on a native transport)"
status=0
timeout 900 "$REPO/.build/release/iapbench" usb --mib 16 --rounds 5 --native || status=$?
# 69: the native figure could not be measured (no GadgetFS in this kernel), and the line above
# says why; the rest stands.
[ "$status" = 0 ] || [ "$status" = 69 ] || exit "$status"
echo "suite: iapbench usb --daemon (1 EA session directly and through iapd, round by round)"
timeout 600 "$REPO/.build/release/iapbench" usb --daemon --mib 16 --rounds 3
echo "suite: Bluetooth on the guest's kernel stack (virtual controllers, bluetoothd; one process, then iapd; iapbench bluetooth)"
BLUETOOTH_BENCH_MIB=2 BLUETOOTH_BENCH_ROUNDS=3 timeout 900 "$here/bluetooth.sh" 4
# Last: iapd listens on the default /run/iapd/iapd.sock, which every iapctl above would have
# gone through; it removes the socket when it stops.
echo "suite: iapd on the real USB stack (started as without systemd; two clients, unplug/replug, the group)"
timeout 300 "$here/iapd.sh"
