#!/usr/bin/env bash
# The Python client's checks, as tools/test.sh runs them: installs the package (tools/clients/python)
# into a virtual environment the way a user would (pip, from a copy of the directory, so the
# checkout stays clean), type-checks it with mypy --strict, runs its pytest suite against a real
# iapd (the release build) serving simulated accessories, and measures the 16 MiB echo from
# Python against `iapctl send --verify-echo` through the same iapd (issue 36's goal: >= 0.8x).
#
# Usage: tools/clients/python/check.sh [--bin DIR] [--rounds N]
#   --bin DIR    where iapd and iapctl are (default .build/release)
#   --rounds N   rounds of the echo benchmark (default 5; 0 skips it)
# The environment is .build/python-venv (Debian's python3 with its site packages, for pytest and
# mypy from Debian: python3-venv python3-wheel python3-pytest mypy). The USB rig's guest runs
# the same suite against a USB gadget (tools/usb-rig/python.sh) with this environment.
set -euo pipefail
cd "$(dirname "$0")/../../.."
bin=.build/release
rounds=5
while [ $# -gt 0 ]; do
    case "$1" in
        --bin) bin=$2; shift 2 ;;
        --rounds) rounds=$2; shift 2 ;;
        *) echo "usage: $0 [--bin DIR] [--rounds N]" >&2; exit 64 ;;
    esac
done
say() { printf 'python: %s\n' "$*" >&2; }
for binary in "$bin/iapd" "$bin/iapctl"; do
    [ -x "$binary" ] || { say "$binary is missing (tools/deploy/package/release-build.sh)"; exit 1; }
done
# Debian's interpreter, not whatever python3 is first on PATH (a pyenv has none of Debian's
# pytest and mypy); the guest of the USB rig has the same one.
python=/usr/bin/python3
venv=.build/python-venv
rm -rf "$venv"
"$python" -m venv --system-site-packages "$venv"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
cp -r tools/clients/python "$stage/accessoryhost-src"
rm -rf "$stage/accessoryhost-src/tests"
# No index and no build isolation: setuptools and wheel are Debian's (a user on the network
# can simply `pip install tools/clients/python`).
"$venv/bin/pip" install -q --disable-pip-version-check --no-index --no-build-isolation "$stage/accessoryhost-src"
installed=$("$venv/bin/python" -c 'import accessoryhost; print(accessoryhost.__file__)')
case "$installed" in
    "$PWD/$venv"/*) say "installed: $installed" ;;
    *) say "the package imports from $installed, not from the environment"; exit 1 ;;
esac
export PYTHONDONTWRITEBYTECODE=1

say "mypy --strict"
(cd tools/clients/python && "$PWD/../../../$venv/bin/python" -m mypy --strict --cache-dir=/dev/null accessoryhost examples/echo_bench.py)

say "pytest against iapd ($bin)"
ACCESSORYHOST_BIN=$PWD/$bin timeout 900 "$venv/bin/python" -m pytest -q -p no:cacheprovider tools/clients/python/tests

if [ "$rounds" -gt 0 ]; then
    say "a 16 MiB echo through iapd: Python against iapctl send --verify-echo, $rounds rounds in turn"
    timeout 600 "$venv/bin/python" tools/clients/python/examples/echo_bench.py --bin "$bin" --rounds "$rounds"
fi
