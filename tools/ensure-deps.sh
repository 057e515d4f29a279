#!/usr/bin/env bash
# Installs the Debian packages AccessoryHost needs, when they are missing. Run as root (or with
# sudo available). Usage: tools/ensure-deps.sh [extra-package…]
set -euo pipefail
need=()
pkg-config --exists libusb-1.0 2>/dev/null || need+=(libusb-1.0-0-dev)
# OpenSSL 3 (libcrypto) for IAPAuthentication's certificate and signature checks.
pkg-config --exists openssl 2>/dev/null || need+=(libssl-dev)
# libdbus-1 for the DBus module (Bluetooth through BlueZ).
pkg-config --exists dbus-1 2>/dev/null || need+=(libdbus-1-dev)
command -v pkg-config >/dev/null || need+=(pkg-config)
for extra in "$@"; do
    case "$extra" in
        valgrind) command -v valgrind >/dev/null || need+=(valgrind) ;;
        xxd) command -v xxd >/dev/null || need+=(xxd) ;;
        python3) command -v python3 >/dev/null || need+=(python3) ;;
        openssl) command -v openssl >/dev/null || need+=(openssl) ;;
        tshark) command -v tshark >/dev/null || need+=(tshark) ;;
        # iapctl's --json output checked against docs/json-schema.json (tools/checks/json-output.py).
        python3-jsonschema) python3 -c 'import jsonschema' 2>/dev/null || need+=(python3-jsonschema) ;;
        # `man -l` renders the generated man pages (tools/checks/cli/installation.sh).
        man-db) command -v man >/dev/null || need+=(man-db) ;;
        # The D-Bus and Bluetooth tests start a private bus of their own (Tests/TestSupport/PrivateBus.swift).
        dbus-daemon) command -v dbus-daemon >/dev/null || need+=(dbus-daemon) ;;
        *) dpkg -s "$extra" >/dev/null 2>&1 || need+=("$extra") ;;
    esac
done
[ ${#need[@]} -eq 0 ] && exit 0
if ! command -v swift >/dev/null; then
    echo "ensure-deps: no 'swift' on PATH; install the Swift 6 toolchain first (swift.org)" >&2
    exit 69
fi
sudo=""
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "ensure-deps: missing ${need[*]}; run as root: apt-get install -y ${need[*]}" >&2; exit 77; }
    sudo=sudo
fi
echo "ensure-deps: installing ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
# tshark's wireshark-common asks whether non-root users may capture; answer no, without asking.
if [[ " ${need[*]} " == *" tshark "* ]]; then
    echo "wireshark-common wireshark-common/install-setuid boolean false" | $sudo debconf-set-selections
fi
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
