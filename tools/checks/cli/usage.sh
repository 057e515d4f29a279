# iapctl for people (issue 20): numbers and values it refuses, help, exit codes as sysexits says,
# one version.
# shellcheck shell=bash

check "--simulate PROFILE without '=' is a usage error (64) that says to write --simulate=PROFILE" check_simulate_without_equals
check_simulate_without_equals() {
    exits 64 "$IAPCTL" --no-usb --simulate legacy-sensor list
    contains "$ERR" "to give --simulate a value, write '--simulate=legacy-sensor'"
}

check "--simulate= (empty) is a usage error (64), without a raw Swift error" check_simulate_empty
check_simulate_empty() {
    exits 64 "$IAPCTL" --no-usb --simulate= list
    lacks "$ERR" "CocoaError"
}

check "--simulate=nosuch exits 66 and lists the profiles once" check_simulate_unknown_profile
check_simulate_unknown_profile() {
    local times
    exits 66 "$IAPCTL" --no-usb --simulate=nosuch list
    times=$(grep -o 'multi-sensor' "$ERR" | wc -l)
    [ "$times" -eq 1 ] || { echo "the profile names are listed $times times:"; cat "$ERR"; return 1; }
}

check "--simulate=DIRECTORY exits 66, without a raw Swift error" check_simulate_directory
check_simulate_directory() {
    exits 66 "$IAPCTL" --no-usb "--simulate=$T" list
    lacks "$ERR" "CocoaError"
}

check "--timeout abc is a usage error (64)" check_timeout_not_a_number
check_timeout_not_a_number() {
    exits 64 "$IAPCTL" "${SIM[@]}" --timeout abc list
}

check "--timeout -1 is a usage error (64)" check_timeout_negative
check_timeout_negative() {
    exits 64 "$IAPCTL" "${SIM[@]}" --timeout -1 list
}

check "help on a 60-column terminal is wrapped to it, between words" check_help_wrapped
check_help_wrapped() {
    command -v script > /dev/null || skip "no script(1) to give iapctl a terminal"
    script -qec "stty cols 60; '$IAPCTL' help open" /dev/null | tr -d '\r' > "$T/help60" || true
    if awk 'length > 60 { bad = 1 } END { exit !bad }' "$T/help60"; then
        echo "help is wider than a 60-column terminal:"; cat "$T/help60"; return 1
    fi
    contains "$T/help60" "Unix"
}

top_help() { once help "$IAPCTL" --help; }

check "--help exits 0 and lists the help subcommand" check_help_lists_help
check_help_lists_help() {
    top_help
    exit_was 0
    contains "$OUT" "  help                    Show the help of a subcommand."
}

check "--help has examples and the exit codes" check_help_examples_exit_codes
check_help_examples_exit_codes() {
    top_help
    contains "$OUT" "EXAMPLES:"
    contains "$OUT" "  73    an output file or socket cannot be created"
}

usage_lines_fit() { # usage_lines_fit FILE: no USAGE: line longer than 100 columns
    awk '/^USAGE:/ && length > 100 { bad = 1 } END { exit bad }' "$1" && return 0
    echo "a usage line is longer than 100 columns:"
    grep '^USAGE:' "$1"
    return 1
}

check "--help's usage lines fit in 100 columns" check_help_usage_width
check_help_usage_width() {
    top_help
    usage_lines_fit "$OUT"
}

check "help send exits 0 and its usage line fits in 100 columns" check_help_send_usage_width
check_help_send_usage_width() {
    exits 0 "$IAPCTL" help send
    usage_lines_fit "$OUT"
}

# Exit codes as sysexits says: an uncreatable trace file is 73 like a socket, a bad profile 65.
check "an uncreatable --trace-file exits 73" check_trace_file_uncreatable
check_trace_file_uncreatable() {
    exits 73 "$IAPCTL" "${SIM[@]}" --trace-file "$T/no/such/dir/trace.txt" list
}

check "a malformed profile exits 65" check_malformed_profile
check_malformed_profile() {
    printf '{ "identity": ' > "$T/broken.json"
    exits 65 "$IAPCTL" --no-usb "--simulate=$T/broken.json" list
}

# One version: iapctl --version and the CHANGELOG's newest release agree.
check "iapctl --version names a release CHANGELOG.md has, with its date" check_version_in_changelog
check_version_in_changelog() {
    local version
    exits 0 "$IAPCTL" --version
    version=$(cut -d' ' -f1 "$OUT")
    grep -q "^## \[$version\] - [0-9]\{4\}-[0-9]\{2\}-[0-9]\{2\}$" "$CHANGELOG" \
        || { echo "CHANGELOG.md has no '## [$version] - DATE' section"; return 1; }
}
