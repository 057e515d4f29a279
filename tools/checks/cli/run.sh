#!/usr/bin/env bash
# End-to-end checks of iapctl (and iapd beside it) as scripts and people see them, against the
# in-process simulator and simulators on pseudo-terminals: exit codes, JSON against
# docs/json-schema.json, the socket, help, install. One TAP line per check (`ok N - NAME`, or
# `not ok N - NAME` and what the check printed), a summary; exit 1 when one failed. Run by
# tools/test.sh. The harness is lib.sh; the checks are the other files here, by area.
# Usage: tools/checks/cli/run.sh [--list] [--filter REGEX] [path/to/iapctl]   (default .build/debug/iapctl)
set -uo pipefail
# Absolute when the runner runs a check (bash /…/run.sh --one …): no cd and pwd then, it adds up.
here=${BASH_SOURCE[0]%/*}
case $here in /*) ;; *) here=$(cd "${here:-.}" && pwd) ;; esac
CLI_CHECKS=$here
# shellcheck source=lib.sh
source "$here/lib.sh"
# What the checks of several areas use (the others see only their own file and these).
# shellcheck source=accessories.sh
source "$here/accessories.sh"
if [ "${1:-}" = --one ]; then # one check, in a bash of its own: its file alone is read
    shift
    _run_one "$@"
    exit
fi
# In this order: the order of the checks (and so of the fixtures' lives).
for area in wait simulate send open escape decode serial auth report report-causes bench usage json installation daemon; do
    # shellcheck source=/dev/null
    source "$here/$area.sh"
done
main "$@"
