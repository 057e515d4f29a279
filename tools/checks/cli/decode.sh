# iapctl decode: frames printed as they come, a mistake in hex, --json, the offline check of a
# captured authentication, options that do not apply.
# shellcheck shell=bash

check "decode prints a frame written to a pipe that stays open before the input ends" check_decode_streams
check_decode_streams() {
    python3 - "$IAPCTL" << 'PY'
import select, subprocess, sys
decoder = subprocess.Popen([sys.argv[1], "decode", "--format", "raw"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
decoder.stdin.write(bytes.fromhex("FF550200EE10"))
decoder.stdin.flush()
ready, _, _ = select.select([decoder.stdout], [], [], 20)
if not ready:
    decoder.kill()
    sys.exit("decode printed nothing while its input stayed open")
first = decoder.stdout.readline()
if not first.startswith(b"#1 detect"):
    sys.exit(f"decode's first line: {first!r}")
decoder.stdin.write(bytes.fromhex("FF5A0009400140001D"))
decoder.stdin.close()
rest = decoder.stdout.read()
if decoder.wait(timeout=20) != 0 or b"2 frames, 0 bytes dropped" not in rest:
    sys.exit(f"decode ended with {decoder.returncode}: {rest!r}")
PY
}

decode_mistake() { # once: hex with a mistake on its second line
    local hex=$WORK/mistake.hex
    printf 'FF 5A 00 09 40 01 40 00 1D\nFF 5A zz\n' > "$hex"
    once decode-mistake "$IAPCTL" decode "$hex"
}

check "decode stops at a mistake in hex (65) after printing the frames before it" check_decode_mistake_frames
check_decode_mistake_frames() {
    decode_mistake
    exit_was 65
    contains "$OUT" '#1 iAP2 ACK seq=0x01 ack=0x40'
}

check "decode names the file, line and column of a mistake in hex" check_decode_mistake_named
check_decode_mistake_named() {
    decode_mistake
    contains "$ERR" 'mistake.hex, line 2, column 7: '"'"'z'"'"' is not a hex digit'
}

check "decode --json prints one object per line, with schemaVersion, kind, offset, length and control" check_decode_json_lines
check_decode_json_lines() {
    exits 0 "$IAPCTL" decode --json "$SAMPLES/dji-syn.hex"
    contains "$OUT" '{"schemaVersion":1,"kind":"iap2","offset":0,"length":23,"control":"SYN"'
}

decode_pioneer() { # once: the real captured iAP1 authentication of the Pioneer receiver
    once decode-pioneer "$IAPCTL" decode --transaction-ids off "$SAMPLES/pioneer-auth.hex"
}

check "decode checks a captured iAP1 authentication (the Pioneer receiver) and finds its signature valid" check_decode_auth_valid
check_decode_auth_valid() {
    decode_pioneer
    exit_was 0
    contains "$OUT" 'authentication: 1 response checked, 1 valid: iAP1 valid (chain not checked)'
}

check "decode shows the steps of a signature check" check_decode_auth_steps
check_decode_auth_steps() {
    decode_pioneer
    contains "$OUT" 'signature: holds: valid: the 128-byte response is the certificate'"'"'s RSA 1024-bit key'"'"'s signature of the challenge'
}

check "decode of the Pioneer capture with one challenge byte changed names the failing step and the byte" check_decode_auth_changed
check_decode_auth_changed() {
    python3 - "$SAMPLES/pioneer-auth.hex" > "$T/pioneer-changed.hex" << 'PY'
import sys
for line in open(sys.argv[1]):
    if line.startswith("ff 55 17 00 17 "):  # the challenge: its first byte changed, the checksum again
        packet = bytearray.fromhex(line)
        packet[5] ^= 0x01
        packet[-1] = -sum(packet[2:-1]) & 0xFF
        line = packet.hex(" ") + "\n"
    sys.stdout.write(line)
PY
    exits 0 "$IAPCTL" decode --transaction-ids off "$T/pioneer-changed.hex"
    contains "$OUT" 'iAP1 signature fails: the response is a signature by the certificate'"'"'s key, but of other bytes than this challenge (they differ at byte 0)'
}

check "decode refuses --serial (64) and names the option that does not apply" check_decode_refuses_serial
check_decode_refuses_serial() {
    exits 64 "$IAPCTL" decode --serial /dev/nonexistent "$SAMPLES/dji-syn.hex"
    contains "$ERR" "option '--serial' does not apply to 'iapctl decode'"
}

check "decode refuses --serial given before the subcommand too (64)" check_decode_refuses_serial_before
check_decode_refuses_serial_before() {
    exits 64 "$IAPCTL" --serial /dev/nonexistent decode "$SAMPLES/dji-syn.hex"
}
