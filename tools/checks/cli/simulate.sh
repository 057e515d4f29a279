# Bluetooth where no bus answers, and iapctl simulate's options that do not go together.
# shellcheck shell=bash

NO_BUS=unix:path=/nonexistent/bus

check "--bluetooth without a D-Bus system bus exits 69 and says to start dbus" check_bluetooth_no_bus
check_bluetooth_no_bus() {
    exits 69 env DBUS_SYSTEM_BUS_ADDRESS=$NO_BUS "$IAPCTL" --no-usb --bluetooth list
    contains "$ERR" "systemctl start dbus"
}

check "--bluetooth-connect with a malformed address is a usage error (64)" check_bluetooth_connect_bad_address
check_bluetooth_connect_bad_address() {
    exits 64 "$IAPCTL" --no-usb --bluetooth-connect 00:11:22 list
}

check "simulate --bluetooth without an RFCOMM channel is a usage error (64)" check_simulate_bluetooth_no_channel
check_simulate_bluetooth_no_channel() {
    exits 64 "$IAPCTL" simulate --bluetooth 00:11:22:33:44:55
}

check "simulate --bluetooth-advertise 31 is a usage error (64) that gives the range 1 to 30" check_simulate_advertise_range
check_simulate_advertise_range() {
    exits 64 "$IAPCTL" simulate --bluetooth-advertise 31
    contains "$ERR" "give one from 1 to 30"
}

check "simulate --bluetooth-advertise with --bluetooth is a usage error (64)" check_simulate_advertise_and_connect
check_simulate_advertise_and_connect() {
    exits 64 "$IAPCTL" simulate --bluetooth-advertise 9 --bluetooth 00:11:22:33:44:55:3
}

check "simulate --bluetooth-advertise without a D-Bus system bus exits 69 and says to start dbus" check_simulate_advertise_no_bus
check_simulate_advertise_no_bus() {
    exits 69 env DBUS_SYSTEM_BUS_ADDRESS=$NO_BUS "$IAPCTL" simulate --bluetooth-advertise 9
    contains "$ERR" "systemctl start dbus"
}

check "simulate --usb-layout without --gadget is a usage error (64) that says it needs --gadget" check_simulate_layout_needs_gadget
check_simulate_layout_needs_gadget() {
    exits 64 "$IAPCTL" simulate --usb-layout flir-one
    contains "$ERR" "--usb-layout needs --gadget"
}

check "simulate --gadget refuses an unknown --usb-layout (64) before touching configfs and lists the layouts" check_simulate_unknown_layout
check_simulate_unknown_layout() {
    exits 64 "$IAPCTL" simulate --gadget --usb-layout dji
    contains "$ERR" "use one of standard, supercamera, flir-one, misc-class, config-3, interrupt-first, interrupt-after, sixth-interface, full-speed, generic-ids"
}

check "simulate --gadget refuses --usb-id with generic-ids (64) and names the ids that layout presents" check_simulate_generic_ids_usb_id
check_simulate_generic_ids_usb_id() {
    exits 64 "$IAPCTL" simulate --gadget --usb-layout generic-ids --usb-id 1209:0001
    contains "$ERR" "presents the ids 0525:a4a0 of its own; drop --usb-id 1209:0001"
}

check "simulate --sticks-until-reset without --gadget is a usage error (64)" check_simulate_sticks_needs_gadget
check_simulate_sticks_needs_gadget() {
    exits 64 "$IAPCTL" simulate --sticks-until-reset
}

check "simulate refuses --timeout (64)" check_simulate_refuses_timeout
check_simulate_refuses_timeout() {
    exits 64 "$IAPCTL" simulate --timeout 3
}
