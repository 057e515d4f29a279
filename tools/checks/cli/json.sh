# --json: every command's output validates against docs/json-schema.json (tools/checks/json-output.py);
# numbers are numbers. Each command bounded (within 60 s), as the old script bounded them.
# shellcheck shell=bash

# check_json_valid DEF KEY ARGUMENT...: iapctl ARGUMENT... exits 0 and its output is the schema's DEF
check_json_valid() {
    local definition=$1 key=$2
    shift 2
    once "json-$key" within 60 "$IAPCTL" "$@"
    exit_was 0
    json_valid "$definition" "$OUT"
}

check "list --json validates against the schema" check_json_valid list list "${SIM[@]}" list --json
check "info --json validates against the schema" check_json_valid info info "${SIM[@]}" info --json
check "wait --json validates against the schema" check_json_valid wait wait "${SIM[@]}" wait --json --protocol com.example.echo
check "wait --gone --json validates against the schema" \
    check_json_valid wait gone "${SIM[@]}" wait --gone --json --serial-number NOPE
check "watch --json validates against the schema" check_json_valid watch watch "${SIM[@]}" watch --json --count 1
# An accessory that asks for an app after identification (issue 31): the second event.
check "watch --json of an accessory asking for its app validates against the schema" \
    check_json_valid watch applaunch --no-usb --simulate=thermal-camera watch --json --count 2

json_send() {
    local data
    data=$(data_file native.bin 3000000)
    once json-send within 60 "$IAPCTL" "${SIM[@]}" send com.example.echo "$data" --verify-echo --json
}

check "send --json validates against the schema" check_json_send
check_json_send() {
    json_send
    exit_was 0
    json_valid send "$OUT"
}

check "send --json of a failed send validates against the schema" check_json_send_failed
check_json_send_failed() {
    send_to_vanishing_sink # any status: the JSON is what counts here
    json_valid send "$OUT"
}

check "decode --json of iAP2, iAP1 and a checked authentication validates against the schema" check_json_decode
check_json_decode() {
    "$IAPCTL" decode --json "$SAMPLES/dji-syn.hex" > "$T/decode.json"
    "$IAPCTL" decode --json "$SAMPLES/iap1-idps.hex" >> "$T/decode.json" || true
    "$IAPCTL" decode --json --transaction-ids off "$SAMPLES/pioneer-auth.hex" >> "$T/decode.json"
    json_valid decode "$T/decode.json"
}

check "send --json gives its seconds as a number" check_json_send_seconds
check_json_send_seconds() {
    json_send
    grep -q '"seconds":[0-9]' "$OUT" || { echo "send --json seconds is not a number:"; cat "$OUT"; return 1; }
}

check "watch --json's connected event carries the accessory as an object" check_json_watch_accessory
check_json_watch_accessory() {
    once json-watch within 60 "$IAPCTL" "${SIM[@]}" watch --json --count 1
    contains "$OUT" '"event":"connected","accessory":{"connectionID"'
}

check "watch --json reports the thermal camera's request to launch its app" check_json_app_launch
check_json_app_launch() {
    once json-applaunch within 60 "$IAPCTL" --no-usb --simulate=thermal-camera watch --json --count 2
    grep -q '"event":"appLaunchRequested",.*"bundleIdentifier":"com.example.thermal"' "$OUT" \
        || { echo "watch --json did not report the thermal camera's app launch request:"; cat "$OUT"; return 1; }
}
