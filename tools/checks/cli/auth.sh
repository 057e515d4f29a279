# Authentication policies (--auth, --trust) against the test fixtures' signed and forged simulators.
# shellcheck shell=bash

signed_info() { # once: info --json of the signed accessory under --auth require
    once auth-signed-info "$IAPCTL" --no-usb --simulate="$AUTH_FIXTURES/rsa-sensor.json" --auth require \
        --trust "$AUTH_FIXTURES/test-ca.pem" info --json
}

check "--auth require lets a signed accessory in: info --json says verified and accepted" check_auth_require_signed
check_auth_require_signed() {
    signed_info
    exit_was 0
    contains "$OUT" '"authentication":{"status":"verified","accepted":true,"reason":null'
}

check "info --json shows the certificate's subject of a signed accessory" check_auth_certificate_subject
check_auth_certificate_subject() {
    signed_info
    contains "$OUT" '"subject":"C=US, O=AccessoryHost Tests, OU=Test Accessories, CN=IPA_TEST_RSA_0001"'
}

check "--auth require refuses a forged accessory (69) and names the bad signature" check_auth_require_forged
check_auth_require_forged() {
    exits 69 "$IAPCTL" --no-usb --simulate="$AUTH_FIXTURES/forged-sensor.json" --auth require --trust "$AUTH_FIXTURES/test-ca.pem" info
    contains "$ERR" 'authentication failed: bad signature: '
}

check "the record policy (the default) lists a forged accessory and says it is not verified, and why" check_auth_record_forged
check_auth_record_forged() {
    exits 0 "$IAPCTL" --no-usb --simulate="$AUTH_FIXTURES/forged-sensor.json" --trust "$AUTH_FIXTURES/test-ca.pem" list
    contains "$OUT" 'authentication: not verified (bad signature: '
}

check "--auth require without --trust refuses (69): an unknown issuer, no trust anchors given" check_auth_require_no_trust
check_auth_require_no_trust() {
    exits 69 "$IAPCTL" --no-usb --simulate="$AUTH_FIXTURES/rsa-sensor.json" --auth require list
    contains "$ERR" "unknown issuer: AccessoryHost Test CA; no trust anchors were given: give that CA's certificate with --trust"
}

# The built-in simulator presents its test credentials: a real chain to
# tools/data/profiles/test-ca.pem, over iAP2 (multi-sensor) and iAP1 (legacy-sensor).
check "the built-in simulator without --trust: accepted and recorded, its CA named (iAP2 and iAP1)" check_auth_builtin_untrusted
check_auth_builtin_untrusted() {
    local profile
    for profile in multi-sensor legacy-sensor; do
        exits 0 "$IAPCTL" --no-usb --simulate=$profile list
        contains "$OUT" "authentication: not verified (unknown issuer: AccessoryHost Test CA; no trust anchors were given: "
    done
}

check "the built-in simulator with the test CA: verified under --auth require, its test certificate named (iAP2 and iAP1)" check_auth_builtin_trusted
check_auth_builtin_trusted() {
    local profile
    for profile in multi-sensor legacy-sensor; do
        exits 0 "$IAPCTL" --no-usb --simulate=$profile --auth require --trust "$PROFILES/test-ca.pem" info --json
        contains "$OUT" '"authentication":{"status":"verified","accepted":true,"reason":null'
        contains "$OUT" '"subject":"O=AccessoryHost, OU=Simulator (test only), CN=IPA_SIMULATOR_TEST_0001"'
    done
}

check "an unreadable --trust file is refused (66)" check_auth_unreadable_trust
check_auth_unreadable_trust() {
    exits 66 "$IAPCTL" "${SIM[@]}" --trust "$T/none.pem" list
}
