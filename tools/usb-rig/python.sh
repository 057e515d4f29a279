#!/usr/bin/env bash
# Runs in the usb-rig guest (root): the Python client's pytest suite (tools/clients/python/tests) with
# its accessory a USB gadget on the guest's real USB stack (`iapctl simulate --gadget` on the
# first controller, iapd finding it by hotplug; the unplug test unbinds and binds the gadget's
# controller). It uses the environment tools/clients/python/check.sh made on the host
# (.build/python-venv, Debian's python3 with the package installed): the guest shares the host's
# root read-only. (The echo benchmark against iapctl send serves iapd's in-process accessory;
# it runs on the host, in check.sh.)
#
# Usage: python.sh
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$here/../.." && pwd)
venv=$REPO/.build/python-venv
[ -x "$venv/bin/python" ] || { echo "python: $venv is missing (tools/clients/python/check.sh makes it on the host)" >&2; exit 1; }
[ -d /sys/class/udc ] && [ -n "$(ls /sys/class/udc)" ] || { echo "python: no USB device controller (modprobe dummy_hcd)" >&2; exit 1; }
export PYTHONDONTWRITEBYTECODE=1 ACCESSORYHOST_PY_TRANSPORT=usb ACCESSORYHOST_BIN=$REPO/.build/release
cd "$(mktemp -d)"   # the checkout is read-only here
timeout 900 "$venv/bin/python" -m pytest -q -p no:cacheprovider -o "cache_dir=$PWD" "$REPO/tools/clients/python/tests"
