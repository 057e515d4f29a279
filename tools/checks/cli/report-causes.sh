# iapctl report names the cause the trace shows (issue 47), for each fault profile
# (tools/data/profiles/faults), and the findings of the keyboard case, in text and JSON.
# shellcheck shell=bash

report_fault() { REPORT=$WORK/report-$1.txt; once "report-$1" "$IAPCTL" --no-usb "--simulate=$PROFILES/faults/$1.json" report -o "$REPORT"; }

# check_report_fault PROFILE KIND SUMMARY: the report exits 0 and names the cause's kind and the cause
check_report_fault() {
    report_fault "$1"
    exit_was 0
    contains "$REPORT" "cause ($2): "
    contains "$REPORT" "$3"
}
check "report of the sequence-gap fault names its cause: sequence-gap, the accessory's packet" \
    check_report_fault sequence-gap sequence-gap "the accessory's packet "
check "report of the certificate-never-sent fault names its cause: message-never-sent, AuthenticationCertificate" \
    check_report_fault certificate-never-sent message-never-sent \
    "the accessory acknowledged the host's RequestAuthenticationCertificate and never sent AuthenticationCertificate"
check "report of the identification-refused fault names its cause: identification-refused, HardwareVersion missing" \
    check_report_fault identification-refused identification-refused \
    "the host refused the accessory's IdentificationInformation: HardwareVersion is missing"
check "report of the session-never-answered fault names its cause: session-never-answered, though it declares the message" \
    check_report_fault session-never-answered session-never-answered \
    "the accessory never answered the session: it declares StatusExternalAccessoryProtocolSession but sent none"
check "report of the leaves-the-bus fault names its cause: accessory-left, during the session" \
    check_report_fault leaves-the-bus accessory-left "the accessory went away during session com.example.echo"

check "report of the sequence gap shows the packets that waited behind it and the EAKs the host sent" check_report_gap_waiting
check_report_gap_waiting() {
    report_fault sequence-gap
    contains "$REPORT" "came after and waited behind the gap; the host sent "
}

check "report of the sequence gap says the certificate split over packets was never whole" check_report_gap_certificate
check_report_gap_certificate() {
    report_fault sequence-gap
    contains "$REPORT" "so AuthenticationCertificate, spread over "
}

check "report of the sequence gap decodes with the negotiated sessions: certificate parts, no control message taken for EA data" check_report_gap_sessions
check_report_gap_sessions() {
    report_fault sequence-gap
    contains "$REPORT" "AuthenticationCertificate part 1: 138 of "
    lacks "$REPORT" "EA data, session 16448"
}

check "report of the certificate never sent gives advice of its own, not about --auth require" check_report_never_sent_advice
check_report_never_sent_advice() {
    report_fault certificate-never-sent
    lacks "$REPORT" "--auth require"
}

# ---- Findings: the keyboard case (several deviations), in text and JSON ----
report_keyboard() { REPORT=$WORK/report-keyboard.txt; once report-keyboard "$IAPCTL" --no-usb --simulate=keyboard-case report -o "$REPORT"; }

check "report of the keyboard case exits 0 and lists its findings, each placed at a frame of the trace" check_report_findings
check_report_findings() {
    report_keyboard
    exit_was 0
    contains "$REPORT" "FINDINGS (deviations from the reference the host tolerated on this accessory"
    contains "$REPORT" ". split-control-messages, frame #"
}

check "report's findings say what an iPhone does and give their source" check_report_findings_iphone
check_report_findings_iphone() {
    report_keyboard
    contains "$REPORT" "iPhone: served, as far as known: the Clicks keyboard works with iPhones"
    contains "$REPORT" "source: PROTOCOL.md §7.7 (Clicks keyboard)"
}

check "report joins the keyboard's certificate from its parts" check_report_certificate_joined
check_report_certificate_joined() {
    report_keyboard
    # Its length is the built-in test certificate's (tools/data/profiles/generate-test-credentials.sh).
    grep -qE 'AuthenticationCertificate \([0-9]+ bytes; the last of [0-9]+ packets\)' "$REPORT" \
        || { echo "no joined AuthenticationCertificate in the report:"; grep -F AuthenticationCertificate "$REPORT"; return 1; }
}

report_keyboard_json() { once report-keyboard-json "$IAPCTL" --no-usb --simulate=keyboard-case report --json -o "$WORK/report-keyboard.json"; }
report_gap_json() { once report-gap-json "$IAPCTL" --no-usb "--simulate=$PROFILES/faults/sequence-gap.json" report --json -o "$WORK/report-gap.json"; }

check "report --json of the keyboard case and of the sequence gap exit 0 and validate against the schema" check_report_json_schema
check_report_json_schema() {
    report_keyboard_json
    exit_was 0
    report_gap_json
    exit_was 0
    json_valid report "$WORK/report-keyboard.json" "$WORK/report-gap.json"
}

check "report --json of the keyboard case lists its deviations" check_report_json_findings
check_report_json_findings() {
    report_keyboard_json
    contains "$WORK/report-keyboard.json" '"deviation":"bare-acks-use-up-numbers"'
}

check "report --json of the sequence gap gives its cause's kind" check_report_json_cause
check_report_json_cause() {
    report_gap_json
    contains "$WORK/report-gap.json" '"cause":{"kind":"sequence-gap"'
}
