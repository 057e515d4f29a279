# Made-up accessories (simulator profiles) and runs that checks of several areas share.
# shellcheck shell=bash

vanishing_sink() { # a sink that vanishes after 300000 bytes
    write_file vanish.json << 'JSON'
{ "identity": { "name": "Vanisher", "model": "V1", "manufacturer": "Test", "serialNumber": "V-1",
                "firmwareVersion": "1.0", "hardwareVersion": "A" },
  "protocols": [ { "name": "com.example.sink", "behaviour": "sink" } ],
  "faults": { "vanishAfterBytes": 300000 } }
JSON
}

stuck_sink() { # a sink that stops reading after 100000 bytes: its buffer fills, it sends bare ACKs
    write_file stuck.json << 'JSON'
{ "identity": { "name": "Stuck", "model": "S1", "manufacturer": "Test", "serialNumber": "S-1",
                "firmwareVersion": "1.0", "hardwareVersion": "A" },
  "protocols": [ { "name": "com.example.sink", "behaviour": "sink" } ],
  "faults": { "stopReadingAfterBytes": 100000 } }
JSON
}

hostile_accessory() { # strings that are terminal escapes: retitle, clear, colour, a forged line, a C1 CSI, a right-to-left override
    write_file hostile.json << 'JSON'
{ "identity": { "name": "Evil\u001b]0;pwned\u0007\u001b[2J\u001b[31m\nfake line", "model": "M\u009b2J",
                "manufacturer": "Acme\u202eevil", "serialNumber": "S\\1", "firmwareVersion": "1.0\r",
                "hardwareVersion": "Zürich 東京" },
  "protocols": [ { "name": "com.example.echo\u001b[2J", "behaviour": "echo" } ] }
JSON
}

send_to_vanishing_sink() { # once: send --json of 1000000 bytes to the sink that vanishes after 300000
    local profile image
    profile=$(vanishing_sink)
    image=$(data_file image.bin 1000000)
    once send-vanishing "$IAPCTL" --no-usb "--simulate=$profile" send com.example.sink "$image" --json
}

send_to_stuck_sink() { # once: send --json of 3000000 bytes directly to the sink that stops reading
    local profile data
    profile=$(stuck_sink)
    data=$(data_file stuck.bin 3000000)
    once send-stuck within 120 "$IAPCTL" --no-usb "--simulate=$profile" send com.example.sink "$data" --json
}
