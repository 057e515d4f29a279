# iapctl wait: an accessory found, waited for in vain, gone, a malformed USB id.
# shellcheck shell=bash

check "wait --json finds the simulator by name and protocol and prints its serial number" check_wait_finds
check_wait_finds() {
    exits 0 "$IAPCTL" "${SIM[@]}" wait --name "Multi Sensor" --protocol com.example.echo --json
    contains "$OUT" '"serialNumber":"SIM-MS-0001"'
}

check "wait exits 75 at --timeout and says what it waited for and what is connected" check_wait_times_out
check_wait_times_out() {
    exits 75 "$IAPCTL" "${SIM[@]}" wait --firmware 9.9.9 --timeout 2
    contains "$ERR" 'no accessory matching firmware "9.9.9" within 2 s; connected: 1 Multi Sensor'
}

check "wait --gone --json exits 0 for an absent accessory and says it is gone" check_wait_gone
check_wait_gone() {
    exits 0 "$IAPCTL" "${SIM[@]}" wait --gone --serial-number NOPE --json
    contains "$OUT" '"gone":true'
}

check "wait --gone exits 75 while the accessory stays connected and says which" check_wait_gone_times_out
check_wait_gone_times_out() {
    exits 75 "$IAPCTL" "${SIM[@]}" wait --gone --serial-number SIM-MS-0001 --timeout 2
    contains "$ERR" 'still connected after 2 s, matching serial number "SIM-MS-0001"'
}

check "wait --usb-id with a malformed id is a usage error (64)" check_wait_bad_usb_id
check_wait_bad_usb_id() {
    exits 64 "$IAPCTL" "${SIM[@]}" wait --usb-id 12345:1
}
