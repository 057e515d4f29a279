# iapctl report: one file for a bug report (issue 31, part 6): the steps, what it leaves out
# without --full, its embedded trace, a refused and a vanishing accessory, a port where nothing
# answers, where it writes. The causes and findings it names: report-causes.sh.
# shellcheck shell=bash

report_trace() { # report_trace REPORT OUT: the embedded trace, extracted as the report says
    sed -n '/^-----BEGIN PCAPNG/,/^-----END PCAPNG/p' "$1" | sed '1d;$d' | base64 -d > "$2"
}

decoded_trace() { # decoded_trace KEY REPORT [DECODE-OPTION...]: once, decode --pcap of the report's trace
    local key=$1 report=$2
    shift 2
    report_trace "$report" "$WORK/$key.pcapng"
    once "$key" "$IAPCTL" decode "$@" --pcap "$WORK/$key.pcapng"
}

# ---- The simulator, without and with --full ----
report_simulator() { REPORT=$WORK/report.txt; once report "$IAPCTL" "${SIM[@]}" report -o "$REPORT"; }

check "report against the simulator exits 0 and says all steps passed, in its summary line and its RESULT, each step ✔" check_report_passes
check_report_passes() {
    report_simulator
    exit_was 0
    contains "$ERR" "report written to $REPORT: all steps passed"
    contains "$REPORT" "RESULT: all steps passed"
    contains "$REPORT" "✔ +"
}

check "report shows the link's parameters each way" check_report_link_parameters
check_report_link_parameters() {
    report_simulator
    contains "$REPORT" "acc → host  SYN v1, 8 packets of 4096 bytes"
}

check "report shows the session that echoed its probe" check_report_echo_session
check_report_echo_session() {
    report_simulator
    contains "$REPORT" "(the probe echoed)"
}

check "report shows the accessory's identification" check_report_identification
check_report_identification() {
    report_simulator
    contains "$REPORT" 'model:             "SIM-MS1"'
}

check "report names each message by its id and name" check_report_message_names
check_report_message_names() {
    report_simulator
    contains "$REPORT" "0xEA03 StatusExternalAccessoryProtocolSession"
}

check "report leaves the serial number out without --full and says --full includes it" check_report_no_serial
check_report_no_serial() {
    report_simulator
    contains "$REPORT" "serial number:     (left out; --full includes it)"
    lacks "$REPORT" "SIM-MS-0001"
}

check "report gives the command that extracts its trace into trace.pcapng" check_report_extraction_command
check_report_extraction_command() {
    report_simulator
    contains "$REPORT" "sed -n '/^-----BEGIN PCAPNG/,/^-----END PCAPNG/p' $REPORT | sed '1d;\$d' | base64 -d > trace.pcapng"
}

check "report's embedded trace decodes cleanly (decode --pcap)" check_report_trace_decodes
check_report_trace_decodes() {
    report_simulator
    decoded_trace report-trace "$REPORT"
    exit_was 0
}

check "report's trace holds the identification with the serial number overwritten" check_report_trace_serial_overwritten
check_report_trace_serial_overwritten() {
    report_simulator
    decoded_trace report-trace "$REPORT"
    contains "$OUT" "IdentificationInformation"
    contains "$OUT" 'SerialNumber: "XXXXXXXXXXX"'
    lacks "$OUT" "SIM-MS-0001"
}

report_full() { REPORT=$WORK/report-full.txt; once report-full "$IAPCTL" "${SIM[@]}" report --full -o "$REPORT"; }

check "report --full exits 0 and includes the serial number" check_report_full_serial
check_report_full_serial() {
    report_full
    exit_was 0
    contains "$REPORT" 'serial number:     "SIM-MS-0001"'
}

check "report --full's trace decodes and keeps the serial number" check_report_full_trace
check_report_full_trace() {
    report_full
    decoded_trace report-full-trace "$REPORT"
    exit_was 0
    contains "$OUT" 'SerialNumber: "SIM-MS-0001"'
}

# ---- A forged accessory under --auth require: the report names the step and the host's reason ----
report_forged() {
    REPORT=$WORK/report-forged.txt
    once report-forged "$IAPCTL" --no-usb --simulate="$AUTH_FIXTURES/forged-sensor.json" --auth require \
        --trust "$AUTH_FIXTURES/test-ca.pem" report -o "$REPORT"
}

check "report of an accessory refused under --auth require is written (0), its summary naming the step and the reason" check_report_forged_written
check_report_forged_written() {
    report_forged
    exit_was 0
    contains "$ERR" "report written to $REPORT: stopped at authentication: the host refused the accessory's authentication: authentication failed: bad signature: "
}

check "report of a refused accessory says RESULT: stopped at authentication, with the host's reason" check_report_forged_result
check_report_forged_result() {
    report_forged
    contains "$REPORT" "RESULT: stopped at authentication: the host refused the accessory's authentication: authentication failed: bad signature: "
}

check "report of a refused accessory shows the authentication step refused, its sizes, and the host's AuthenticationFailed" check_report_forged_step
check_report_forged_step() {
    report_forged
    contains "$REPORT" "authentication: certificate 695 bytes, challenge 20 bytes, response 128 bytes, policy require: refused"
    contains "$REPORT" "host → acc  AuthenticationFailed"
}

check "report of a refused accessory says identification was not reached and what to do next" check_report_forged_next
check_report_forged_next() {
    report_forged
    contains "$REPORT" "identification: not reached"
    contains "$REPORT" "next: Under --auth require"
}

check "report of a refused accessory leaves out its serial number and its certificate's subject" check_report_forged_left_out
check_report_forged_left_out() {
    report_forged
    lacks "$REPORT" "SIM-FS-0001"
    lacks "$REPORT" "IPA_TEST_RSA"
}

check "the refused accessory's trace decodes, the certificate's bytes zeros" check_report_forged_trace
check_report_forged_trace() {
    report_forged
    decoded_trace report-forged-trace "$REPORT"
    exit_was 0
    contains "$OUT" "AuthenticationCertificate: 695 bytes: 00 00 00 00 00 00 00 00"
    lacks "$OUT" "IPA_TEST_RSA"
}

check "report --full of a refused accessory shows the certificate's subject" check_report_forged_full
check_report_forged_full() {
    exits 0 "$IAPCTL" --no-usb --simulate="$AUTH_FIXTURES/forged-sensor.json" --auth require \
        --trust "$AUTH_FIXTURES/test-ca.pem" report --full --no-write -o "$T/report-forged-full.txt"
    contains "$T/report-forged-full.txt" 'subject:   "C=US, O=AccessoryHost Tests, OU=Test Accessories, CN=IPA_TEST_RSA_0001"'
}

# A report made with --full keeps the certificate: its trace's authentication checks offline.
check "decode --trust checks the authentication in the trace of a --full report, chain and all" check_report_signed_trace_checks
check_report_signed_trace_checks() {
    exits 0 "$IAPCTL" --no-usb --simulate="$AUTH_FIXTURES/rsa-sensor.json" report --full --no-write -o "$T/report-signed.txt"
    report_trace "$T/report-signed.txt" "$T/trace-signed.pcapng"
    exits 0 "$IAPCTL" decode --trust "$AUTH_FIXTURES/test-ca.pem" --pcap "$T/trace-signed.pcapng"
    contains "$OUT" "authentication: 1 response checked, 1 valid: iAP2 valid"
}

# ---- An accessory that vanishes during the first session: the session step fails, the report says why ----
report_vanishing() {
    local profile
    profile=$(write_file vanish-early.json << 'JSON'
{ "identity": { "name": "Vanisher", "model": "V1", "manufacturer": "Test", "serialNumber": "V-0001",
                "firmwareVersion": "1.0", "hardwareVersion": "A" },
  "protocols": [ { "name": "com.example.echo", "behaviour": "echo" }, { "name": "com.example.sink", "behaviour": "sink" } ],
  "faults": { "vanishAfterBytes": 8 } }
JSON
)
    REPORT=$WORK/report-vanish.txt
    once report-vanish "$IAPCTL" --no-usb --simulate="$profile" report -o "$REPORT"
}

check "report of an accessory that vanishes in its first session exits 0, its summary naming the session" check_report_vanishing_summary
check_report_vanishing_summary() {
    report_vanishing
    exit_was 0
    contains "$ERR" "sessions failed, the first at session com.example.echo: "
}

check "report of a vanishing accessory says why the session ended and that the second could not be opened" check_report_vanishing_sessions
check_report_vanishing_sessions() {
    report_vanishing
    contains "$REPORT" "✘ the session ended: the accessory disconnected"
    contains "$REPORT" "✘ the accessory had gone before the session could be opened"
}

# ---- A port where nothing answers (a pty whose other end stays silent): the report stops at detect ----
check "report where nothing answers on the port stops at detect and says what to check" check_report_silent_port
check_report_silent_port() {
    local pty silent
    coproc SILENT { exec python3 -c 'import os, sys; m, s = os.openpty(); print(os.ttyname(s), flush=True); sys.stdin.read()'; }
    silent=$SILENT_PID
    on_exit stop_process "$silent"
    read -r -t 10 -u "${SILENT[0]}" pty && [ -n "$pty" ] || { echo "no silent pseudo-terminal"; return 1; }
    exits 0 "$IAPCTL" --no-usb --serial "$pty" --timeout 1 report -o "$T/report-silent.txt"
    contains "$ERR" "stopped at detect: the accessory sent nothing in "
    contains "$T/report-silent.txt" "next: The accessory did not answer."
}

# ---- Other profiles, and where the report goes ----
report_profile() { REPORT=$WORK/report-$1.txt; once "report-$1" "$IAPCTL" --no-usb "--simulate=$1" report -o "$REPORT"; }

check "report --simulate=thermal-camera exits 0 and all steps pass" check_report_profile_passes thermal-camera
check "report --simulate=borescope exits 0 and all steps pass" check_report_profile_passes borescope
check_report_profile_passes() {
    report_profile "$1"
    exit_was 0
    contains "$ERR" "all steps passed"
}

check "report of the borescope says its protocol is on a native transport" check_report_native_transport
check_report_native_transport() {
    report_profile borescope
    contains "$REPORT" "native transport"
}

check "report -o - writes the report to standard output, its extraction command naming REPORT.txt" check_report_to_stdout
check_report_to_stdout() {
    exits 0 "$IAPCTL" "${SIM[@]}" report -o - --no-write --read-timeout 0.1
    contains "$OUT" "RESULT: all steps passed"
    contains "$OUT" "p' REPORT.txt | sed"
    contains "$ERR" "report written to standard output: all steps passed"
}

check "report without -o writes iapctl-report-DATE-TIME.txt in the current directory" check_report_default_name
check_report_default_name() {
    mkdir -p "$T/report-dir"
    exits 0 env -C "$T/report-dir" "$IAPCTL" "${SIM[@]}" report --read-timeout 0.1
    ls "$T/report-dir" > "$T/listing"
    grep -qE '^iapctl-report-[0-9]{8}-[0-9]{6}\.txt$' "$T/listing" || { echo "report's default name:"; cat "$T/listing"; return 1; }
}

check "report to a file that cannot be written exits 73 and says to choose another place with -o" check_report_unwritable
check_report_unwritable() {
    exits 73 "$IAPCTL" "${SIM[@]}" report -o "$T/no-such-dir/report.txt"
    contains "$ERR" "choose another place with -o FILE"
}

check "report with an unknown option is a usage error (64)" check_report_unknown_option
check_report_unknown_option() {
    exits 64 "$IAPCTL" "${SIM[@]}" report --bogus
}

check "report with a positional argument is a usage error (64)" check_report_positional
check_report_positional() {
    exits 64 "$IAPCTL" "${SIM[@]}" report extra
}
