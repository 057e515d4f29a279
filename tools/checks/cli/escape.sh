# An accessory whose strings are terminal escapes (accessories.sh: hostile_accessory): human
# output (list, info, watch, errors, the log and trace, report) shows them escaped and lets no raw
# control reach the terminal; JSON keeps them exact.
# shellcheck shell=bash

hostile() { # hostile KEY ARGUMENT...: once, iapctl against the hostile accessory
    local key=$1 profile
    shift
    profile=$(hostile_accessory)
    once "hostile-$key" "$IAPCTL" --no-usb "--simulate=$profile" "$@"
}

check "list of a hostile accessory exits 0 and lets no raw control through" check_hostile_list_no_controls
check_hostile_list_no_controls() {
    hostile list list
    exit_was 0
    no_controls "$OUT"
}

check "list shows a hostile accessory's name, manufacturer, model, serial, firmware and protocols escaped" check_hostile_list_escapes
check_hostile_list_escapes() {
    hostile list list
    contains "$OUT" 'Evil\u{1b}]0;pwned\u{7}\u{1b}[2J\u{1b}[31m\nfake line  Acme\u{202e}evil M\u{9b}2J  serial S\\1  firmware 1.0\r'
    contains "$OUT" 'protocols: com.example.echo\u{1b}[2J'
}

check "info of a hostile accessory exits 0 and lets no raw control through" check_hostile_info_no_controls
check_hostile_info_no_controls() {
    hostile info info
    exit_was 0
    no_controls "$OUT"
}

check "info shows a hostile name escaped and keeps printable non-ASCII text as it is" check_hostile_info_escapes
check_hostile_info_escapes() {
    hostile info info
    contains "$OUT" 'name:              Evil\u{1b}]0;pwned\u{7}\u{1b}[2J\u{1b}[31m\nfake line'
    contains "$OUT" 'hardware revision: Zürich 東京'
}

check "watch of a hostile accessory exits 0 and lets no raw control through" check_hostile_watch
check_hostile_watch() {
    hostile watch watch --count 1
    exit_was 0
    no_controls "$OUT"
}

check "an error quoting a hostile accessory (69) lets no raw control through" check_hostile_error_no_controls
check_hostile_error_no_controls() {
    hostile error open com.example.absent
    exit_was 69
    no_controls "$ERR"
}

check "an error quoting a hostile accessory shows its name and protocols escaped" check_hostile_error_escapes
check_hostile_error_escapes() {
    hostile error open com.example.absent
    contains "$ERR" 'connected: 1 Evil\u{1b}]0;pwned\u{7}\u{1b}[2J\u{1b}[31m\nfake line [com.example.echo\u{1b}[2J]'
}

check "-vv --trace of a hostile accessory exits 0 and lets no raw control into the log" check_hostile_trace_no_controls
check_hostile_trace_no_controls() {
    hostile trace -vv --trace list
    exit_was 0
    no_controls "$ERR"
}

check "the trace shows a hostile accessory's name escaped" check_hostile_trace_escapes
check_hostile_trace_escapes() {
    hostile trace -vv --trace list
    contains "$ERR" '[0] Name: "Evil\u{1b}]0;pwned\u{7}\u{1b}[2J\u{1b}[31m\nfake line"'
}

check "list --json keeps a hostile accessory's strings exact" check_hostile_list_json
check_hostile_list_json() {
    hostile list-json list --json
    exit_was 0
    contains "$OUT" '"name":"Evil\u001b]0;pwned\u0007\u001b[2J\u001b[31m\nfake line","manufacturer":"Acme\u202eevil","modelNumber":"M\u009b2J","serialNumber":"S\\1","firmwareRevision":"1.0\r","hardwareRevision":"Zürich 東京"'
}

check "report of a hostile accessory exits 0 and lets no raw control into the file" check_hostile_report_no_controls
check_hostile_report_no_controls() {
    hostile report report -o "$WORK/report-hostile.txt" --read-timeout 0.1
    exit_was 0
    no_controls "$WORK/report-hostile.txt"
}

check "report of a hostile accessory shows its name escaped" check_hostile_report_escapes
check_hostile_report_escapes() {
    hostile report report -o "$WORK/report-hostile.txt" --read-timeout 0.1
    contains "$WORK/report-hostile.txt" 'name:              "Evil\u{1b}]0;pwned\u{7}\u{1b}[2J\u{1b}[31m\nfake line"'
}
