# The harness of the CLI checks (tools/checks/cli/run.sh sources it, then the check files).
# shellcheck shell=bash
#
# A check is a shell function registered with a sentence saying the behaviour it checks:
#     check "decode stops at a mistake in hex (65) after the frames before it" check_decode_mistake
# Each check runs alone in a fresh bash (set -Eeuo pipefail), bounded by CLI_CHECK_TIMEOUT seconds
# (default 120), in a directory of its own ($T), its standard output and error captured. The
# runner prints TAP: `ok N - NAME`, or `not ok N - NAME` and the last 40 lines the check printed,
# then `# C checks: P passed, F failed`; it exits 1 when one failed. A failing check fails alone.
#
# What several checks share:
# - `fixture NAME SETUP TEARDOWN` and `check --with NAME …`: a process several checks use (a
#   simulator on a pty, iapd). The runner runs SETUP before the first selected check that needs
#   it and TEARDOWN after the last one; SETUP hands values to the checks with `fixture_export`.
#   When SETUP fails, the checks that need it fail with its output.
# - `once KEY COMMAND…`: a command whose output several checks read runs once, in the first of
#   them that runs; the others read what it printed ($OUT, $ERR, $STATUS).
# - `data_file`, `write_file`: inputs made once under $WORK.
# A check's bash reads lib.sh, accessories.sh and its own file only (reading them all for each
# check added seconds to the run): a helper the checks of several files use goes in
# accessories.sh (or here).

# ---- The data the checks read: every file or folder outside the programs, in this one place ----
CLI_CHECKS=${CLI_CHECKS:-$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)} # run.sh sets it
case $CLI_CHECKS in
    */tools/checks/cli) ROOT=${CLI_CHECKS%/tools/checks/cli} ;; # the repository, without a cd per check
    *) ROOT=$(cd "$CLI_CHECKS/../../.." && pwd) ;;
esac
PROFILES=$ROOT/tools/data/profiles              # the simulator's profiles (faults/, bench/)
SAMPLES=$ROOT/tools/data/samples                # captured exchanges, in hex
CHECK_JSON=$ROOT/tools/checks/json-output.py       # --json output against docs/json-schema.json
INSTALL_SH=$ROOT/tools/install.sh
FIRMWARE_UPGRADE=$ROOT/tools/examples/firmware-upgrade.py
AUTH_FIXTURES=$ROOT/Tests/IAPAuthenticationTests/Fixtures # signed and forged simulators, a test CA
CHANGELOG=$ROOT/CHANGELOG.md

CLI_CHECK_TIMEOUT=${CLI_CHECK_TIMEOUT:-120}
SIM=(--no-usb --simulate) # the in-process simulator (Multi Sensor, serial SIM-MS-0001)

# ---- Registration ----
CHECK_NAMES=() CHECK_COMMANDS=() CHECK_FIXTURES=() CHECK_FILES=()
declare -A FIXTURE_SETUP=() FIXTURE_TEARDOWN=()

check() { # check [--with FIXTURE]... NAME FUNCTION [ARGUMENT...]
    local fixtures="" name command
    while [ "$1" = --with ]; do fixtures+=" $2"; shift 2; done
    name=$1
    shift
    printf -v command '%q ' "$@" # no command substitution: a fork per check adds up, each check sources this
    CHECK_NAMES+=("$name")
    CHECK_COMMANDS+=("$command")
    CHECK_FIXTURES+=("$fixtures")
    CHECK_FILES+=("${BASH_SOURCE[1]}")
}

fixture() { # fixture NAME SETUP TEARDOWN
    FIXTURE_SETUP[$1]=$2
    FIXTURE_TEARDOWN[$1]=$3
}

fixture_export() { # fixture_export VARIABLE...: hands the values to the checks that run after
    local variable
    for variable in "$@"; do printf '%s=%q\n' "$variable" "${!variable}" >> "$STATE"; done
}

# ---- What a check uses ----
RUNS=0 CLEANUP=()

shown() { # shown WORD...: $SHOWN, the words as a line, the long paths shortened (no subshell: every run says its command)
    SHOWN="$*"
    SHOWN=${SHOWN//"$IAPCTL"/iapctl}
    SHOWN=${SHOWN//"$IAPD"/iapd}
    SHOWN=${SHOWN//"$WORK"/\$WORK}
    SHOWN=${SHOWN//"$ROOT/"/}
}

run() { # run COMMAND...: its standard output in $OUT, its standard error in $ERR, its status in $STATUS
    RUNS=$((RUNS + 1))
    OUT=$T/out.$RUNS ERR=$T/err.$RUNS STATUS=0
    shown "$@"
    echo "\$ $SHOWN"
    "$@" > "$OUT" 2> "$ERR" || STATUS=$?
}

once() { # once KEY COMMAND...: as run, but the first check that asks runs it; the others read its output
    # (a KEY names one command: the checks that share it call one helper that gives it, as report_simulator)
    local dir=$WORK/once/$1
    shift
    shown "$@"
    if [ -f "$dir/status" ]; then
        read -r STATUS < "$dir/status"
        echo "\$ $SHOWN   (run once, by an earlier check: exit $STATUS)"
    else
        mkdir -p "$dir"
        echo "\$ $SHOWN   (run once for the checks that read it)"
        STATUS=0
        "$@" > "$dir/out" 2> "$dir/err" || STATUS=$?
        echo "$STATUS" > "$dir/status"
    fi
    OUT=$dir/out ERR=$dir/err
}

exit_was() { # exit_was N: the last command's status was N; shows its output otherwise
    [ "$STATUS" -eq "$1" ] && return 0
    echo "exit $STATUS, expected $1"
    echo "-- stdout:"; tail -n 15 "$OUT"
    echo "-- stderr:"; tail -n 15 "$ERR"
    return 1
}

within() { # within SECONDS COMMAND...: COMMAND, ended after SECONDS (then exit 124)
    # --foreground: timeout stays in the check's process group, which the runner ends with all in
    # it when the check runs out of its own time (a plain timeout makes a group of its own).
    timeout --foreground "$@"
}

exits() { # exits N COMMAND...: runs it and expects status N
    local expected=$1
    shift
    run "$@"
    exit_was "$expected"
}

contains() { # contains FILE TEXT
    [ -f "$1" ] || { echo "${1/#"$WORK"/\$WORK} does not exist (its command failed before it)"; return 1; }
    grep -qF -- "$2" "$1" && return 0
    local start=${2:0:12}
    start=${start#"${start%%[![:space:]]*}"}
    if [ -n "$start" ] && grep -qF -- "$start" "$1"; then
        echo "${1/#"$WORK"/\$WORK} lacks '$2'; its lines with '$start':"
        grep -nF -- "$start" "$1" | head -n 10 | cut -c1-300
    else
        echo "${1/#"$WORK"/\$WORK} lacks '$2'; it begins:"
        head -n 25 "$1" | cut -c1-300
    fi
    return 1
}

lacks() { # lacks FILE TEXT
    [ -f "$1" ] || { echo "${1/#"$WORK"/\$WORK} does not exist (its command failed before it)"; return 1; }
    grep -qF -- "$2" "$1" || return 0
    echo "${1/#"$WORK"/\$WORK} has '$2':"
    grep -nF -- "$2" "$1" | head -n 10
    return 1
}

no_controls() { # no_controls FILE: no ESC, BEL, CR, C1 CSI or override reached the file, no forged line
    [ -f "$1" ] || { echo "${1/#"$WORK"/\$WORK} does not exist"; return 1; }
    if LC_ALL=C grep -q $'\x1b\\|\x07\\|\r\\|\xc2\x9b\\|\xe2\x80\xae\\|^fake line' "$1"; then
        echo "${1/#"$WORK"/\$WORK} holds raw controls:"
        od -c "$1" | head -n 8
        return 1
    fi
}

json_valid() { # json_valid DEF FILE...: every line of every file is the schema's DEF
    python3 "$CHECK_JSON" "$@"
}

json_number() { # json_number FIELD FILE: the whole number of "FIELD":N in the file (empty if none)
    sed -n "s/.*\"$1\":\([0-9]*\).*/\1/p" "$2"
}

data_file() { # data_file NAME BYTES [SOURCE]: prints $WORK/NAME, BYTES from SOURCE (/dev/urandom), made once
    local path=$WORK/$1
    if [ ! -f "$path" ]; then
        head -c "$2" "${3:-/dev/urandom}" > "$path.part.$$"
        mv "$path.part.$$" "$path"
    fi
    echo "$path"
}

write_file() { # write_file NAME < TEXT: prints $WORK/NAME, the text written once
    local path=$WORK/$1
    if [ ! -f "$path" ]; then
        cat > "$path.part.$$"
        mv "$path.part.$$" "$path"
    else
        cat > /dev/null
    fi
    echo "$path"
}

on_exit() { # on_exit COMMAND...: run when the check ends, however it ends
    local command
    printf -v command '%q ' "$@"
    CLEANUP+=("$command")
}

stop_process() { # stop_process PID: ends a process the check started, and waits for it
    kill "$1" 2> /dev/null || true
    wait "$1" 2> /dev/null || true
}

skip() { # skip REASON: the check does not apply on this machine
    echo "$*" > "$T/skip"
    exit 0
}

# Waits for a background process the runner started (a fixture) by its status file: a fixture is
# not a child of the check. daemon_start and daemon_stop.
daemon_start() { # daemon_start NAME COMMAND...: in the background; $WORK/NAME.pid, .status when it ends, .log its stderr
    local name=$1 pid
    shift
    rm -f "$WORK/$name.pid" "$WORK/$name.status"
    exec {pipe}< <("$@" > "$WORK/$name.out" 2> "$WORK/$name.log" < /dev/null &
                   echo $!
                   status=0
                   wait $! || status=$?
                   echo "$status" > "$WORK/$name.status.part"
                   mv "$WORK/$name.status.part" "$WORK/$name.status")
    read -r pid <&"$pipe"
    exec {pipe}<&-
    echo "$pid" > "$WORK/$name.pid"
}

daemon_stop() { # daemon_stop NAME: SIGTERM, up to 10 s to end (SIGKILL then); its status in $WORK/NAME.status
    local name=$1 pid
    [ -f "$WORK/$name.status" ] && return 0
    pid=$(cat "$WORK/$name.pid")
    kill -TERM "$pid" 2> /dev/null || true
    for _ in $(seq 1 100); do [ -f "$WORK/$name.status" ] && return 0; sleep 0.1; done # an external process: bounded polls
    kill -KILL "$pid" 2> /dev/null || true # only if it did not stop: its status says so
    for _ in $(seq 1 50); do [ -f "$WORK/$name.status" ] && return 0; sleep 0.1; done
    echo "$name ($pid) did not end even after SIGKILL"
    return 1
}

wait_for_socket() { # wait_for_socket PATH: a socket an external process makes, bounded polls
    for _ in $(seq 1 100); do [ -S "$1" ] && return 0; sleep 0.1; done
    echo "no socket at $1 after 10 s"
    return 1
}

# ---- The runner ----
usage() {
    cat << 'EOF'
Usage: tools/checks/cli/run.sh [--list] [--filter REGEX] [path/to/iapctl]
  End-to-end checks of iapctl and iapd (beside it) as scripts and people see them: exit codes,
  JSON against docs/json-schema.json, the socket, ptys, help, install. One TAP line per check.
  path/to/iapctl   the iapctl to check (default .build/debug/iapctl); iapd is the one beside it
  --list           print the names of the checks (those --filter selects) and exit
  --filter REGEX   run only the checks whose name matches REGEX (bash extended regex)
  CLI_CHECK_TIMEOUT=SECONDS   a check taking longer fails (default 120)
  CLI_CHECK_TIMES=FILE        append "SECONDS NAME" to FILE for each check run
EOF
}

main() {
    local list=0 filter="" iapctl=$ROOT/.build/debug/iapctl
    while [ $# -gt 0 ]; do
        case $1 in
            --list) list=1; shift ;;
            --filter) [ $# -ge 2 ] || { usage >&2; exit 64; }; filter=$2; shift 2 ;;
            --filter=*) filter=${1#--filter=}; shift ;;
            -h | --help) usage; exit 0 ;;
            -*) echo "checks: unknown option '$1'" >&2; usage >&2; exit 64 ;;
            *) iapctl=$1; shift ;;
        esac
    done
    local i selected=()
    for i in "${!CHECK_NAMES[@]}"; do
        if [ -z "$filter" ] || [[ ${CHECK_NAMES[i]} =~ $filter ]]; then selected+=("$i"); fi
    done
    if [ ${#selected[@]} -eq 0 ]; then echo "checks: no check's name matches '$filter' (--list names them)" >&2; exit 64; fi
    if [ "$list" -eq 1 ]; then
        for i in "${selected[@]}"; do echo "${CHECK_NAMES[i]}"; done
        return 0
    fi
    _lint_registrations || exit 70
    [ -x "$iapctl" ] || { echo "checks: $iapctl is missing (swift build)" >&2; exit 1; }
    IAPCTL=$(cd "$(dirname "$iapctl")" && pwd)/$(basename "$iapctl")
    IAPD=$(dirname "$IAPCTL")/iapd
    _run_all "${selected[@]}"
}

_lint_registrations() { # every check names a function that exists, every fixture is declared, no name twice
    local i fn fixture ok=0
    declare -A seen=()
    for i in "${!CHECK_NAMES[@]}"; do
        fn=${CHECK_COMMANDS[i]%% *}
        declare -F "$fn" > /dev/null || { echo "checks: '${CHECK_NAMES[i]}': no function $fn" >&2; ok=1; }
        for fixture in ${CHECK_FIXTURES[i]}; do
            [ -n "${FIXTURE_SETUP[$fixture]:-}" ] || { echo "checks: '${CHECK_NAMES[i]}': no fixture $fixture" >&2; ok=1; }
        done
        [ -z "${seen[${CHECK_NAMES[i]}]:-}" ] || { echo "checks: two checks named '${CHECK_NAMES[i]}'" >&2; ok=1; }
        seen[${CHECK_NAMES[i]}]=1
    done
    return "$ok"
}

declare -A FIXTURE_STATE=() FIXTURE_LAST=()
CURRENT=""

_teardown() { # _teardown FIXTURE
    [ "${FIXTURE_STATE[$1]:-}" = up ] || [ "${FIXTURE_STATE[$1]:-}" = failed ] || return 0
    "${FIXTURE_TEARDOWN[$1]}" >> "$WORK/fixture-$1.log" 2>&1 || true
    FIXTURE_STATE[$1]=down
}

_teardown_all() {
    local fixture
    for fixture in "${!FIXTURE_STATE[@]}"; do _teardown "$fixture"; done
}

_interrupted() {
    [ -n "$CURRENT" ] && kill -TERM "$CURRENT" 2> /dev/null
    echo "# interrupted"
    exit 130
}

_run_all() {
    WORK=$(mktemp -d "${TMPDIR:-/tmp}/cli-checks.XXXXXX")
    STATE=$WORK/state
    local i fixture directories=()
    for i in "$@"; do directories+=("$WORK/checks/$i"); done
    mkdir -p "$WORK/checks" "${directories[@]}" # one mkdir for all
    trap '_teardown_all; rm -rf "$WORK"' EXIT
    trap _interrupted INT TERM
    local variable
    for variable in IAPCTL IAPD WORK; do printf '%s=%q\n' "$variable" "${!variable}" >> "$STATE"; done
    for i in "$@"; do
        for fixture in ${CHECK_FIXTURES[i]}; do FIXTURE_LAST[$fixture]=$i; done
    done
    local number=0 passed=0 failed=0 skipped=0 started=$SECONDS status log broken started_check elapsed
    echo "1..$#"
    for i in "$@"; do
        number=$((number + 1))
        log=$WORK/checks/$i.log
        broken=""
        started_check=${EPOCHREALTIME//[!0-9]/}
        for fixture in ${CHECK_FIXTURES[i]}; do
            if [ -z "${FIXTURE_STATE[$fixture]:-}" ] || [ "${FIXTURE_STATE[$fixture]}" = down ]; then
                if "${FIXTURE_SETUP[$fixture]}" > "$WORK/fixture-$fixture.log" 2>&1; then
                    FIXTURE_STATE[$fixture]=up
                else
                    FIXTURE_STATE[$fixture]=failed
                fi
            fi
            [ "${FIXTURE_STATE[$fixture]}" = up ] || broken=$fixture
        done
        if [ -n "$broken" ]; then
            { echo "the fixture '$broken' did not set up:"; cat "$WORK/fixture-$broken.log"; } > "$log"
            status=1
        else
            timeout -k 10 "$CLI_CHECK_TIMEOUT" bash "$CLI_CHECKS/run.sh" --one "$STATE" "$i" "${CHECK_FILES[i]}" "${CHECK_COMMANDS[i]}" \
                < /dev/null > "$log" 2>&1 &
            CURRENT=$!
            status=0
            wait "$CURRENT" || status=$?
            CURRENT=""
            [ "$status" -ne 124 ] || echo "timed out after $CLI_CHECK_TIMEOUT s (CLI_CHECK_TIMEOUT)" >> "$log"
        fi
        if [ "$status" -eq 0 ] && [ -f "$WORK/checks/$i/skip" ]; then
            echo "ok $number - ${CHECK_NAMES[i]} # SKIP $(cat "$WORK/checks/$i/skip")"
            skipped=$((skipped + 1))
        elif [ "$status" -eq 0 ]; then
            echo "ok $number - ${CHECK_NAMES[i]}"
            passed=$((passed + 1))
        else
            echo "not ok $number - ${CHECK_NAMES[i]}"
            tail -n 40 "$log" | sed 's/^/    /'
            failed=$((failed + 1))
        fi
        for fixture in ${CHECK_FIXTURES[i]}; do
            [ "${FIXTURE_LAST[$fixture]}" != "$i" ] || _teardown "$fixture"
        done
        elapsed=$((${EPOCHREALTIME//[!0-9]/} - started_check))
        [ -z "${CLI_CHECK_TIMES:-}" ] || printf '%d.%03d %s\n' $((elapsed / 1000000)) $((elapsed / 1000 % 1000)) "${CHECK_NAMES[i]}" >> "$CLI_CHECK_TIMES"
    done
    local summary="# $number checks: $passed passed, $failed failed"
    [ "$number" -ne 1 ] || summary="# 1 check: $passed passed, $failed failed"
    [ "$skipped" -eq 0 ] || summary+=", $skipped skipped"
    echo "$summary ($((SECONDS - started)) s)"
    [ "$failed" -eq 0 ]
}

_run_one() { # _run_one STATE INDEX FILE COMMAND, in a fresh bash: the runner's state, the check's file, the check
    local index=$2 file=$3 command=$4
    STATE=$1
    # shellcheck source=/dev/null
    source "$STATE"
    # shellcheck source=/dev/null
    source "$file"
    T=$WORK/checks/$index
    [ -d "$T" ] || mkdir -p "$T"
    cd "$T"
    set -Eeuo pipefail
    shopt -s inherit_errexit
    trap _failed_at ERR
    trap _cleanup EXIT
    eval "$command"
}

_failed_at() { # from the ERR trap: the check's line that failed, as written (an assertion said why above it)
    # No `local` nor `return` here: bash 5.2 then complains of its variable contexts ("pop_var_context")
    # as errexit ends the check.
    for ((_frame = 1; _frame < ${#BASH_SOURCE[@]}; _frame++)); do
        [ "${BASH_SOURCE[_frame]}" != "${BASH_SOURCE[0]}" ] || continue # lib.sh's own lines: the caller's says more
        _line=${BASH_LINENO[_frame - 1]}
        echo "failed at ${BASH_SOURCE[_frame]##*/} line $_line: $(sed -n "${_line}s/^ *//p" "${BASH_SOURCE[_frame]}")"
        break
    done
}

_cleanup() {
    local command
    for command in ${CLEANUP[@]+"${CLEANUP[@]}"}; do eval "$command" > /dev/null 2>&1 || true; done
}
