#!/usr/bin/env bash
# End-to-end checks of iapctl's scripting behaviour against the in-process simulator: what a
# script sees (exit codes, JSON fields, the socket). Run by tools/test.sh.
# Usage: tools/cli-checks.sh [path/to/iapctl]   (default .build/debug/iapctl)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
iapctl=${1:-$here/../.build/debug/iapctl}
[ -x "$iapctl" ] || { echo "cli-checks: $iapctl is missing (swift build)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# A command that fails outside a check (or runs out of its time) says which it was.
trap 'echo "cli-checks: FAILED at line $LINENO (exit $?): $BASH_COMMAND" >&2' ERR
failures=0
check() { # check NAME EXPECTED-STATUS COMMAND...
    local name=$1 expected=$2 status=0
    shift 2
    "$@" > "$work/out" 2> "$work/err" || status=$?
    if [ "$status" -ne "$expected" ]; then
        echo "cli-checks: FAILED $name: exit $status, expected $expected; stdout: $(cat "$work/out"); stderr: $(cat "$work/err")" >&2
        failures=$((failures + 1))
        return 0 # counted; the other checks still run
    fi
    echo "cli-checks: ok $name"
}
contains() { # contains NAME FILE TEXT
    if ! grep -qF -- "$3" "$work/$2"; then
        echo "cli-checks: FAILED $1: $2 lacks '$3': $(cat "$work/$2")" >&2
        failures=$((failures + 1))
    fi
}
sim=(--no-usb --simulate)

check "wait finds the simulator" 0 "$iapctl" "${sim[@]}" wait --name "Multi Sensor" --protocol com.example.echo --json
contains "wait --json" out '"serialNumber":"SIM-MS-0001"'
check "wait times out with 75" 75 "$iapctl" "${sim[@]}" wait --firmware 9.9.9 --timeout 2
contains "wait timeout message" err 'no accessory matching firmware "9.9.9" within 2 s; connected: 1 Multi Sensor'
check "wait --gone for an absent accessory" 0 "$iapctl" "${sim[@]}" wait --gone --serial-number NOPE --json
contains "wait --gone --json" out '"gone":true'
check "wait --gone times out while it is connected" 75 "$iapctl" "${sim[@]}" wait --gone --serial-number SIM-MS-0001 --timeout 2
contains "wait --gone timeout message" err 'still connected after 2 s, matching serial number "SIM-MS-0001"'
check "wait rejects a bad USB id" 64 "$iapctl" "${sim[@]}" wait --usb-id 12345:1

# A native-transport protocol: info says so, and send moves a file through it.
# Bluetooth without a bus (or BlueZ) says which service to start; a bad address is a usage error.
check "--bluetooth without a D-Bus system bus exits 69" 69 env DBUS_SYSTEM_BUS_ADDRESS=unix:path=/nonexistent/bus "$iapctl" --no-usb --bluetooth list
contains "--bluetooth names the fix" err "systemctl start dbus"
check "--bluetooth-connect with a bad address exits 64" 64 "$iapctl" --no-usb --bluetooth-connect 00:11:22 list
check "simulate --bluetooth without a channel exits 64" 64 "$iapctl" simulate --bluetooth 00:11:22:33:44:55
check "simulate --bluetooth-advertise out of 1-30 exits 64" 64 "$iapctl" simulate --bluetooth-advertise 31
contains "simulate --bluetooth-advertise 31" err "give one from 1 to 30"
check "simulate --bluetooth-advertise with --bluetooth exits 64" 64 "$iapctl" simulate --bluetooth-advertise 9 --bluetooth 00:11:22:33:44:55:3
check "simulate --bluetooth-advertise without a D-Bus system bus exits 69" 69 env DBUS_SYSTEM_BUS_ADDRESS=unix:path=/nonexistent/bus "$iapctl" simulate --bluetooth-advertise 9
contains "simulate --bluetooth-advertise names the fix" err "systemctl start dbus"
check "simulate --usb-layout needs --gadget (64)" 64 "$iapctl" simulate --usb-layout flir-one
contains "simulate --usb-layout without --gadget" err "--usb-layout needs --gadget"
check "simulate --gadget refuses an unknown layout before touching configfs (64)" 64 "$iapctl" simulate --gadget --usb-layout dji
contains "simulate --gadget --usb-layout dji" err "use one of standard, supercamera, flir-one, misc-class, config-3, interrupt-first, interrupt-after, sixth-interface, full-speed, generic-ids"
check "simulate --gadget refuses --usb-id against generic-ids' own ids (64)" 64 "$iapctl" simulate --gadget --usb-layout generic-ids --usb-id 1209:0001
contains "simulate --usb-layout generic-ids --usb-id" err "presents the ids 0525:a4a0 of its own; drop --usb-id 1209:0001"
check "simulate --sticks-until-reset needs --gadget (64)" 64 "$iapctl" simulate --sticks-until-reset
check "info shows native protocols" 0 "$iapctl" --no-usb --simulate=native-streamer info --json
contains "info --json native" out '"name":"com.example.native.sink","matchAction":0,"native":true'
head -c 3000000 /dev/urandom > "$work/native.bin"
check "send through a native transport" 0 "$iapctl" --no-usb --simulate=native-streamer send com.example.native.sink "$work/native.bin" --json
contains "send --json native" out '"ok":true,"protocol":"com.example.native.sink","accessory":{"connectionID":1,'

# open: an accessory that goes away ends the session and `open` (74, with the reason) even while
# open's input stays open, as a terminal does.
cat > "$work/vanish-echo.json" <<'JSON'
{ "identity": { "name": "Vanisher", "model": "V1", "manufacturer": "Test", "serialNumber": "V-2",
                "firmwareVersion": "1.0", "hardwareVersion": "A" },
  "protocols": [ { "name": "com.example.echo", "behaviour": "echo" } ],
  "faults": { "vanishAfterBytes": 1000 } }
JSON
mkfifo "$work/held"
exec 4<> "$work/held" # a writer that stays: the input never ends
head -c 5000 /dev/urandom > "$work/held"
check "open ends when the accessory goes, its input still open (74)" 74 timeout 60 bash -c \
    "exec 4>&-; exec \"\$0\" --no-usb --simulate=\"\$1\" open com.example.echo < \"\$2\"" "$iapctl" "$work/vanish-echo.json" "$work/held"
contains "open says why the accessory went" err "the accessory disconnected: "
exec 4>&-

# A sink that vanishes after 300000 bytes: send stops, says what was acknowledged, exits 74.
cat > "$work/vanish.json" <<'JSON'
{ "identity": { "name": "Vanisher", "model": "V1", "manufacturer": "Test", "serialNumber": "V-1",
                "firmwareVersion": "1.0", "hardwareVersion": "A" },
  "protocols": [ { "name": "com.example.sink", "behaviour": "sink" } ],
  "faults": { "vanishAfterBytes": 300000 } }
JSON
head -c 1000000 /dev/urandom > "$work/image.bin"
check "send to a vanishing accessory exits 74" 74 "$iapctl" --no-usb "--simulate=$work/vanish.json" send com.example.sink "$work/image.bin" --json
acknowledged=$(sed -n 's/.*"bytesAcknowledged":\([0-9]*\).*/\1/p' "$work/out")
if [ -z "$acknowledged" ] || [ "$acknowledged" -lt 200000 ] || [ "$acknowledged" -gt 300000 ]; then
    echo "cli-checks: FAILED send reports what was acknowledged: '$acknowledged' (expected 200000…300000): $(cat "$work/out")" >&2
    failures=$((failures + 1))
fi
contains "send's message" err "the accessory acknowledged $acknowledged of 1000000 bytes"

# A sink that stops reading: its buffer fills, it keeps the link alive with bare ACKs and
# acknowledges no more data. send gives up after 10 s without progress (exit 74) instead of
# waiting forever, and never reports ok for what was not acknowledged.
cat > "$work/stuck.json" <<'JSON'
{ "identity": { "name": "Stuck", "model": "S1", "manufacturer": "Test", "serialNumber": "S-1",
                "firmwareVersion": "1.0", "hardwareVersion": "A" },
  "protocols": [ { "name": "com.example.sink", "behaviour": "sink" } ],
  "faults": { "stopReadingAfterBytes": 100000 } }
JSON
head -c 3000000 /dev/urandom > "$work/stuck.bin"
check "send to an accessory that stops acknowledging gives up (exit 74)" 74 timeout 120 "$iapctl" --no-usb "--simulate=$work/stuck.json" send com.example.sink "$work/stuck.bin" --json
contains "send's no-progress message" err "acknowledged nothing for 10"
contains "send --json is not ok" out '"ok":false'
stuck=$(sed -n 's/.*"bytesAcknowledged":\([0-9]*\).*/\1/p' "$work/out")
if [ -z "$stuck" ] || [ "$stuck" -lt 100000 ] || [ "$stuck" -ge 3000000 ]; then
    echo "cli-checks: FAILED a stuck send reports what was acknowledged before it stopped: '$stuck': $(cat "$work/out")" >&2
    failures=$((failures + 1))
fi

# An accessory whose strings are terminal escapes (retitle, clear, colour, a forged line, a C1
# CSI, a right-to-left override): human output shows them escaped, JSON keeps them exact.
cat > "$work/hostile.json" <<'JSON'
{ "identity": { "name": "Evil\u001b]0;pwned\u0007\u001b[2J\u001b[31m\nfake line", "model": "M\u009b2J",
                "manufacturer": "Acme\u202eevil", "serialNumber": "S\\1", "firmwareVersion": "1.0\r",
                "hardwareVersion": "Zürich 東京" },
  "protocols": [ { "name": "com.example.echo\u001b[2J", "behaviour": "echo" } ] }
JSON
hostile=(--no-usb "--simulate=$work/hostile.json")
no_controls() { # no_controls NAME FILE: no ESC, BEL, CR, C1 CSI or override reached the file, no forged line
    if LC_ALL=C grep -q $'\x1b\\|\x07\\|\r\\|\xc2\x9b\\|\xe2\x80\xae\\|^fake line' "$work/$2"; then
        echo "cli-checks: FAILED $1: $2 holds raw controls: $(od -c "$work/$2" | head -8)" >&2
        failures=$((failures + 1))
    fi
}
check "list shows a hostile accessory escaped" 0 "$iapctl" "${hostile[@]}" list
no_controls "list" out
contains "list escapes" out 'Evil\u{1b}]0;pwned\u{7}\u{1b}[2J\u{1b}[31m\nfake line  Acme\u{202e}evil M\u{9b}2J  serial S\\1  firmware 1.0\r'
contains "list escapes protocols" out 'protocols: com.example.echo\u{1b}[2J'
check "info shows a hostile accessory escaped" 0 "$iapctl" "${hostile[@]}" info
no_controls "info" out
contains "info escapes" out 'name:              Evil\u{1b}]0;pwned\u{7}\u{1b}[2J\u{1b}[31m\nfake line'
contains "info keeps printable text" out 'hardware revision: Zürich 東京'
check "watch shows a hostile accessory escaped" 0 "$iapctl" "${hostile[@]}" watch --count 1
no_controls "watch" out
check "an error quoting a hostile accessory" 69 "$iapctl" "${hostile[@]}" open com.example.absent
no_controls "error" err
contains "error escapes" err 'connected: 1 Evil\u{1b}]0;pwned\u{7}\u{1b}[2J\u{1b}[31m\nfake line [com.example.echo\u{1b}[2J]'
check "log and trace of a hostile accessory" 0 "$iapctl" "${hostile[@]}" -vv --trace list
no_controls "log and trace" err
contains "trace escapes" err '[0] Name: "Evil\u{1b}]0;pwned\u{7}\u{1b}[2J\u{1b}[31m\nfake line"'
check "list --json keeps hostile strings exact" 0 "$iapctl" "${hostile[@]}" list --json
contains "list --json exact" out '"name":"Evil\u001b]0;pwned\u0007\u001b[2J\u001b[31m\nfake line","manufacturer":"Acme\u202eevil","modelNumber":"M\u009b2J","serialNumber":"S\\1","firmwareRevision":"1.0\r","hardwareRevision":"Zürich 東京"'

# decode streams: a frame written to a pipe that stays open is printed before the input ends;
# a mistake in hex comes after the frames before it; JSON is one object per line.
if python3 - "$iapctl" 2> "$work/decode.err" <<'PY'
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
then
    echo "cli-checks: ok decode prints frames as they come"
else
    echo "cli-checks: FAILED decode prints frames as they come: $(cat "$work/decode.err")" >&2
    failures=$((failures + 1))
fi
printf 'FF 5A 00 09 40 01 40 00 1D\nFF 5A zz\n' > "$work/mistake.hex"
check "decode stops at a mistake in hex" 65 "$iapctl" decode "$work/mistake.hex"
contains "decode shows the frames before a mistake" out '#1 iAP2 ACK seq=0x01 ack=0x40'
contains "decode names the mistake" err 'mistake.hex, line 2, column 7: '"'"'z'"'"' is not a hex digit'
check "decode --json" 0 "$iapctl" decode --json "$here/samples/dji-syn.hex"
contains "decode --json is one object per line" out '{"schemaVersion":1,"kind":"iap2","offset":0,"length":23,"control":"SYN"'
# The offline check of a real captured authentication (the Pioneer receiver, iAP1), then the same
# with one byte of the challenge changed.
check "decode checks a captured authentication" 0 "$iapctl" decode --transaction-ids off "$here/samples/pioneer-auth.hex"
contains "decode says the real signature is valid" out 'authentication: 1 response checked, 1 valid: iAP1 valid (chain not checked)'
contains "decode shows the steps" out 'signature: holds: valid: the 128-byte response is the certificate'"'"'s RSA 1024-bit key'"'"'s signature of the challenge'
python3 - "$here/samples/pioneer-auth.hex" > "$work/pioneer-changed.hex" <<'PY'
import sys
for line in open(sys.argv[1]):
    if line.startswith("ff 55 17 00 17 "):  # the challenge: its first byte changed, the checksum again
        packet = bytearray.fromhex(line)
        packet[5] ^= 0x01
        packet[-1] = -sum(packet[2:-1]) & 0xFF
        line = packet.hex(" ") + "\n"
    sys.stdout.write(line)
PY
check "decode checks a changed challenge" 0 "$iapctl" decode --transaction-ids off "$work/pioneer-changed.hex"
contains "decode names the failing step" out 'iAP1 signature fails: the response is a signature by the certificate'"'"'s key, but of other bytes than this challenge (they differ at byte 0)'

# open --socket: a client echoes 1 MiB through the session. Python starts iapctl and reads its
# announcement line from the pipe, then connects.
socket=$work/echo.sock
if python3 - "$socket" "$iapctl" "${sim[@]}" open com.example.echo --socket "$socket" 2> "$work/open.err" <<'PY'
import os, socket, subprocess, sys, threading
path, command = sys.argv[1], sys.argv[2:]
opener = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
line = opener.stdout.readline()
if line.strip() != f"listening on {path}":
    sys.exit(f"open --socket announced {line!r}, exit {opener.wait()}")
payload = os.urandom(1 << 20)
client = socket.socket(socket.AF_UNIX)
client.settimeout(30)
client.connect(path)
def send():  # while the main thread reads: the echo must not depend on buffer sizes
    client.sendall(payload)
    client.shutdown(socket.SHUT_WR)
sender = threading.Thread(target=send)
sender.start()
received = bytearray()
while len(received) < len(payload):
    data = client.recv(65536)
    if not data:
        break
    received += data
sender.join()
client.close()
status = opener.wait(timeout=30)
if bytes(received) != payload:
    sys.exit(f"the echo differs: {len(received)} bytes back")
if status != 0:
    sys.exit(f"iapctl open exited with {status}")
if os.path.exists(path):
    sys.exit("the socket was left behind")
PY
then
    echo "cli-checks: ok open --socket echoes 1 MiB and removes its socket"
else
    echo "cli-checks: FAILED open --socket: $(cat "$work/open.err")" >&2
    failures=$((failures + 1))
fi
# open --socket under umask 000: the socket is its owner's alone (0600), and a second client is
# told in one line that the session is taken, while the first one's echo goes on.
socket=$work/private.sock
if (umask 000 && python3 - "$socket" "$iapctl" "${sim[@]}" open com.example.echo --socket "$socket" 2> "$work/private.err" <<'PY'
import os, socket, stat, subprocess, sys
path, command = sys.argv[1], sys.argv[2:]
opener = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
line = opener.stdout.readline()
if line.strip() != f"listening on {path}":
    sys.exit(f"open --socket announced {line!r}, exit {opener.wait()}")
mode = stat.S_IMODE(os.lstat(path).st_mode)
if mode != 0o600:
    sys.exit(f"the socket was created with mode {oct(mode)} under umask 000, not 0o600")
def echo(client, data):
    client.sendall(data)
    back = b""
    while len(back) < len(data):
        chunk = client.recv(65536)
        if not chunk:
            break
        back += chunk
    if back != data:
        sys.exit(f"the echo of {data!r} came back as {back!r}")
first = socket.socket(socket.AF_UNIX)
first.settimeout(30)
first.connect(path)
echo(first, b"first client")
second = socket.socket(socket.AF_UNIX)
second.settimeout(30)
second.connect(path)
# The host may have answered and closed before these bytes go out: a broken pipe here is the
# refusal arriving first, not a failure. Its answer is still there to read.
try:
    second.sendall(b"are these bytes lost?")
except (BrokenPipeError, ConnectionResetError):
    pass
answer = b""
while not answer.endswith(b"\n"):
    try:
        chunk = second.recv(1024)
    except ConnectionResetError:
        break
    if not chunk:
        break
    answer += chunk
if b"already serves a client" not in answer:
    sys.exit(f"the second client was told {answer!r}")
second.close()
echo(first, b"still served")
first.shutdown(socket.SHUT_WR)
while first.recv(65536):
    pass
first.close()
status = opener.wait(timeout=30)
if status != 0:
    sys.exit(f"iapctl open exited with {status}")
PY
); then
    echo "cli-checks: ok open --socket is 0600 under umask 000 and turns a second client away"
    contains "open --socket logs the refused client" private.err "refused another client on $socket"
else
    echo "cli-checks: FAILED open --socket under umask 000 with two clients: $(cat "$work/private.err")" >&2
    failures=$((failures + 1))
fi
check "open --socket refuses a path that is not a socket" 73 "$iapctl" "${sim[@]}" open com.example.echo --socket "$work/image.bin"
# A socket another process listens on is not taken over.
mkfifo "$work/live.in" "$work/live.out"
# Listens, says so, and holds the socket until its standard input ends (this script's fd 5).
python3 -c 'import socket, sys; s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen(1); print("ready", flush=True); sys.stdin.read()' \
    "$work/live.sock" < "$work/live.in" > "$work/live.out" &
holder=$!
exec 5> "$work/live.in" 4< "$work/live.out"
read -r -t 10 -u 4 _ || true
check "open --socket refuses a live socket" 73 "$iapctl" "${sim[@]}" open com.example.echo --socket "$work/live.sock"
contains "live socket message" err "another process is listening on"
exec 5>&- 4<&- # the holder reads the end of its input and exits
wait "$holder" 2>/dev/null || true

# A legacy iAP1 accessory on a pseudo-terminal (the UART path): listed with its strings and
# protocols as iAP1, and a file goes through one of its protocols intact. The simulator prints
# its pty path as its first line.
coproc LEGACY { exec "$iapctl" simulate --profile legacy-sensor 2> "$work/legacy.err"; }
legacy_pid=$LEGACY_PID
if read -r -t 20 -u "${LEGACY[0]}" legacy_pty && [ -n "$legacy_pty" ]; then
    check "an iAP1 accessory on a pty is listed" 0 "$iapctl" --no-usb --serial "$legacy_pty" list --json
    contains "list --json iAP1" out '"name":"Legacy Sensor","manufacturer":"AccessoryHost Simulator","modelNumber":"SIM-LS1"'
    contains "list --json iAP1 version" out '"protocolVersion":"iAP1","protocolStrings":["com.example.echo","com.example.sink"]'
    head -c 2000000 /dev/urandom > "$work/legacy.bin"
    check "a file through an iAP1 session on a pty" 0 "$iapctl" --no-usb --serial "$legacy_pty" send com.example.echo "$work/legacy.bin" --verify-echo --json
    contains "send --json iAP1" out '"ok":true,"protocol":"com.example.echo"'
else
    echo "cli-checks: FAILED the iAP1 simulator did not announce its pty: $(cat "$work/legacy.err")" >&2
    failures=$((failures + 1))
fi
kill "$legacy_pid" 2>/dev/null || true
wait "$legacy_pid" 2>/dev/null || true

# Authentication (--auth, --trust): the test fixtures' signed and forged simulators.
fixtures=$here/../Tests/IAPAuthenticationTests/Fixtures
check "require lets a signed accessory in" 0 "$iapctl" --no-usb --simulate="$fixtures/rsa-sensor.json" --auth require --trust "$fixtures/test-ca.pem" info --json
contains "info --json authentication" out '"authentication":{"status":"verified","accepted":true,"reason":null'
contains "info --json certificate" out '"subject":"C=US, O=AccessoryHost Tests, OU=Test Accessories, CN=IPA_TEST_RSA_0001"'
check "require refuses a forged accessory" 69 "$iapctl" --no-usb --simulate="$fixtures/forged-sensor.json" --auth require --trust "$fixtures/test-ca.pem" info
contains "require names the reason" err 'authentication failed: bad signature: '
check "record lists a forged accessory and says so" 0 "$iapctl" --no-usb --simulate="$fixtures/forged-sensor.json" --trust "$fixtures/test-ca.pem" list
contains "record says which failed" out 'authentication: not verified (bad signature: '
check "require without --trust refuses (unknown issuer)" 69 "$iapctl" --no-usb --simulate="$fixtures/rsa-sensor.json" --auth require list
contains "unknown issuer named" err "unknown issuer: AccessoryHost Test CA; no trust anchors were given: give that CA's certificate with --trust"
check "an unreadable --trust is said" 66 "$iapctl" "${sim[@]}" --trust "$work/none.pem" list
# The built-in simulator presents its test credentials: a real chain to tools/profiles/test-ca.pem,
# over iAP2 and iAP1.
for profile in multi-sensor legacy-sensor; do
    check "$profile without --trust: recorded, its CA named" 0 "$iapctl" --no-usb --simulate=$profile list
    contains "$profile names its CA" out "authentication: not verified (unknown issuer: AccessoryHost Test CA; no trust anchors were given: "
    check "$profile with the test CA: verified under require" 0 "$iapctl" --no-usb --simulate=$profile --auth require --trust "$here/profiles/test-ca.pem" info --json
    contains "$profile verified" out '"authentication":{"status":"verified","accepted":true,"reason":null'
    contains "$profile's test certificate" out '"subject":"O=AccessoryHost, OU=Simulator (test only), CN=IPA_SIMULATOR_TEST_0001"'
done

# ---- Issue 20: iapctl for people. Each case below failed before the fix. ----
fail() { echo "cli-checks: FAILED $1" >&2; failures=$((failures + 1)); }
lacks() { # lacks NAME FILE TEXT
    if grep -qF -- "$3" "$work/$2"; then fail "$1: $2 has '$3': $(cat "$work/$2")"; fi
}

# ---- iapctl report (issue 31, part 6): one file for a bug report ----
report_trace() { # report_trace REPORT OUT: the embedded trace, extracted as the report says
    sed -n '/^-----BEGIN PCAPNG/,/^-----END PCAPNG/p' "$1" | sed '1d;$d' | base64 -d > "$2"
}
check "report against the simulator" 0 "$iapctl" "${sim[@]}" report -o "$work/report.txt"
contains "report's summary line" err "report written to $work/report.txt: all steps passed"
cp "$work/report.txt" "$work/r"
contains "report: all steps passed" r "RESULT: all steps passed"
contains "report: the link step" r "✔ +"
contains "report: the link parameters" r "acc → host  SYN v1, 8 packets of 4096 bytes"
contains "report: the echo session" r "(the probe echoed)"
contains "report: the identification" r 'model:             "SIM-MS1"'
contains "report: message names" r "0xEA03 StatusExternalAccessoryProtocolSession"
contains "report: the serial is left out" r "serial number:     (left out; --full includes it)"
contains "report: the extraction command" r "sed -n '/^-----BEGIN PCAPNG/,/^-----END PCAPNG/p' $work/report.txt | sed '1d;\$d' | base64 -d > trace.pcapng"
lacks "report: no serial number" r "SIM-MS-0001"
report_trace "$work/report.txt" "$work/trace.pcapng"
check "report: its trace decodes cleanly" 0 "$iapctl" decode --pcap "$work/trace.pcapng"
contains "report: the trace holds the identification" out "IdentificationInformation"
contains "report: the trace's serial is overwritten" out 'SerialNumber: "XXXXXXXXXXX"'
lacks "report: no serial in the trace" out "SIM-MS-0001"
check "report --full" 0 "$iapctl" "${sim[@]}" report --full -o "$work/report-full.txt"
cp "$work/report-full.txt" "$work/r"
contains "report --full has the serial" r 'serial number:     "SIM-MS-0001"'
report_trace "$work/report-full.txt" "$work/trace-full.pcapng"
check "report --full: its trace decodes" 0 "$iapctl" decode --pcap "$work/trace-full.pcapng"
contains "report --full: the trace has the serial" out 'SerialNumber: "SIM-MS-0001"'
# A forged accessory under --auth require: the report names the step and the host's reason.
check "report of a refused accessory is written (0)" 0 "$iapctl" --no-usb --simulate="$fixtures/forged-sensor.json" --auth require \
    --trust "$fixtures/test-ca.pem" report -o "$work/report-forged.txt"
contains "report's summary names the step" err "report written to $work/report-forged.txt: stopped at authentication: the host refused the accessory's authentication: authentication failed: bad signature: "
cp "$work/report-forged.txt" "$work/r"
contains "report: stopped at authentication" r "RESULT: stopped at authentication: the host refused the accessory's authentication: authentication failed: bad signature: "
contains "report: authentication marked failed" r "authentication: certificate 695 bytes, challenge 20 bytes, response 128 bytes, policy require: refused"
contains "report: the host refused" r "host → acc  AuthenticationFailed"
contains "report: identification not reached" r "identification: not reached"
contains "report: what to do next" r "next: Under --auth require"
lacks "report: no serial of the refused accessory" r "SIM-FS-0001"
lacks "report: no certificate subject" r "IPA_TEST_RSA"
report_trace "$work/report-forged.txt" "$work/trace-forged.pcapng"
check "report: the refused accessory's trace decodes" 0 "$iapctl" decode --pcap "$work/trace-forged.pcapng"
contains "report: the certificate's bytes are zeros" out "AuthenticationCertificate: 695 bytes: 00 00 00 00 00 00 00 00"
lacks "report: no certificate in the trace" out "IPA_TEST_RSA"
check "report --full of the refused accessory" 0 "$iapctl" --no-usb --simulate="$fixtures/forged-sensor.json" --auth require \
    --trust "$fixtures/test-ca.pem" report --full --no-write -o "$work/report-forged-full.txt"
contains "report --full has the certificate's subject" "report-forged-full.txt" 'subject:   "C=US, O=AccessoryHost Tests, OU=Test Accessories, CN=IPA_TEST_RSA_0001"'
# An accessory that vanishes during the first session: the session step fails, the report says why.
cat > "$work/vanish-early.json" <<'JSON'
{ "identity": { "name": "Vanisher", "model": "V1", "manufacturer": "Test", "serialNumber": "V-0001",
                "firmwareVersion": "1.0", "hardwareVersion": "A" },
  "protocols": [ { "name": "com.example.echo", "behaviour": "echo" }, { "name": "com.example.sink", "behaviour": "sink" } ],
  "faults": { "vanishAfterBytes": 8 } }
JSON
check "report of a vanishing accessory" 0 "$iapctl" --no-usb --simulate="$work/vanish-early.json" report -o "$work/report-vanish.txt"
contains "report's summary names the session" err "sessions failed, the first at session com.example.echo: "
cp "$work/report-vanish.txt" "$work/r"
contains "report: the session failed" r "✘ the session ended: the accessory disconnected"
contains "report: the second was not opened" r "✘ the accessory had gone before the session could be opened"
# Each fault profile (tools/profiles/faults): the report names the fault's own cause (issue 47).
for pair in "sequence-gap:sequence-gap:the accessory's packet " \
            "certificate-never-sent:message-never-sent:the accessory acknowledged the host's RequestAuthenticationCertificate and never sent AuthenticationCertificate" \
            "identification-refused:identification-refused:the host refused the accessory's IdentificationInformation: HardwareVersion is missing" \
            "session-never-answered:session-never-answered:the accessory never answered the session: it declares StatusExternalAccessoryProtocolSession but sent none" \
            "leaves-the-bus:accessory-left:the accessory went away during session com.example.echo"; do
    profile=${pair%%:*} rest=${pair#*:}
    kind=${rest%%:*} summary=${rest#*:}
    check "report of the $profile fault" 0 "$iapctl" --no-usb "--simulate=$here/profiles/faults/$profile.json" report -o "$work/report-$profile.txt"
    contains "report of $profile: the cause's kind" "report-$profile.txt" "cause ($kind): "
    contains "report of $profile: the cause" "report-$profile.txt" "$summary"
done
cp "$work/report-sequence-gap.txt" "$work/r"
contains "report of the gap: the packets behind it and the EAKs" r "came after and waited behind the gap; the host sent "
contains "report of the gap: the split certificate never whole" r "so AuthenticationCertificate, spread over "
contains "report of the gap: decoded with the negotiated sessions" r "AuthenticationCertificate part 1: 138 of "
lacks "report of the gap: no control message taken for EA data" r "EA data, session 16448"
lacks "report of the certificate never sent: advice of its own" "report-certificate-never-sent.txt" "--auth require"
# Findings: the keyboard case (several deviations), in text and JSON.
check "report of the keyboard case" 0 "$iapctl" --no-usb --simulate=keyboard-case report -o "$work/report-keyboard.txt"
cp "$work/report-keyboard.txt" "$work/r"
contains "report: findings" r "FINDINGS (deviations from the reference the host tolerated on this accessory"
contains "report: a finding placed in the trace" r ". split-control-messages, frame #"
contains "report: what an iPhone does" r "iPhone: served, as far as known: the Clicks keyboard works with iPhones"
contains "report: the source" r "source: PROTOCOL.md §7.7 (Clicks keyboard)"
# (Its length is the built-in test certificate's, which tools/profiles/generate-test-credentials.sh may change.)
grep -qE 'AuthenticationCertificate \([0-9]+ bytes; the last of [0-9]+ packets\)' "$work/r" \
    || fail "report: the certificate joined from its parts: $(grep -F AuthenticationCertificate "$work/r")"
check "report --json of the keyboard case" 0 "$iapctl" --no-usb --simulate=keyboard-case report --json -o "$work/report-keyboard.json"
"$iapctl" --no-usb "--simulate=$here/profiles/faults/sequence-gap.json" report --json -o "$work/report-gap.json" 2> /dev/null
if python3 "$here/check-json.py" report "$work/report-keyboard.json" "$work/report-gap.json" 2> "$work/schema.err"; then
    echo "cli-checks: ok report --json validates against docs/json-schema.json"
else
    fail "report --json against the schema: $(cat "$work/schema.err")"
fi
grep -q '"deviation":"bare-acks-use-up-numbers"' "$work/report-keyboard.json" || fail "report --json lacks the keyboard's findings: $(head -c 600 "$work/report-keyboard.json")"
grep -q '"cause":{"kind":"sequence-gap"' "$work/report-gap.json" || fail "report --json lacks the gap's cause: $(head -c 600 "$work/report-gap.json")"
# ---- iapctl bench (issue 48): the simulator in process, each mode, JSON, sweeps, a comparison, a picture ----
check "bench both on the simulator" 0 "$iapctl" "${sim[@]}" bench -t 0.5 --warmup 0.1 --latency-count 200 com.example.echo
contains "bench: throughput each way" out "throughput: out "
contains "bench: the echo verified" out "echo: every byte that came back matches what was sent"
contains "bench: latency percentiles" out "latency (200 round trips of 64 bytes): p50 "
contains "bench: the link's view" out "link: out "
contains "bench: the host's CPU" out "host CPU: "
check "bench echo with intervals" 0 "$iapctl" "${sim[@]}" bench -m echo -l 4K -t 0.4 -i 0.1 --warmup 0 --latency-size 0 com.example.echo
contains "bench: interval lines" out "0.00–0.1"
check "bench sink" 0 "$iapctl" "${sim[@]}" bench -m sink -n 1M --warmup 0 com.example.sink
contains "bench sink: out only" out "throughput: out "
lacks "bench sink: nothing in" out "; in "
check "bench source (--reverse of a sink run)" 0 "$iapctl" "${sim[@]}" bench -m sink --reverse -n 1M --warmup 0 com.example.source
contains "bench source: in" out "throughput: in "
check "bench two protocols at once" 0 "$iapctl" "${sim[@]}" bench -t 0.3 --warmup 0 --latency-size 0 com.example.echo com.example.telemetry
contains "bench: both protocols named" out "both on com.example.echo, com.example.telemetry"
check "bench --reverse of an echo is refused (64)" 64 "$iapctl" "${sim[@]}" bench --reverse com.example.echo
check "bench of a protocol the accessory lacks (69)" 69 "$iapctl" "${sim[@]}" bench com.example.nowhere
check "bench --write-sizes" 0 "$iapctl" "${sim[@]}" bench --write-sizes 512,16K -t 0.3 --warmup 0 --latency-count 100 com.example.echo
contains "bench --write-sizes: a row each" out "16K "
check "bench --json" 0 "$iapctl" "${sim[@]}" bench -t 0.3 --warmup 0 --latency-count 100 --json --plot "$work/bench.svg" com.example.echo
cp "$work/out" "$work/bench.json"
check "bench --host-limits --json" 0 "$iapctl" "${sim[@]}" bench --host-limits 1x4096,8x4096 -t 0.3 --warmup 0 --latency-size 0 --json com.example.echo
cp "$work/out" "$work/bench-limits.json"
if python3 "$here/check-json.py" bench "$work/bench.json" "$work/bench-limits.json" 2> "$work/schema.err"; then
    echo "cli-checks: ok bench --json validates against docs/json-schema.json"
else
    fail "bench --json against the schema: $(cat "$work/schema.err")"
fi
grep -q '"sweep":"host-limits"' "$work/bench-limits.json" || fail "bench --host-limits --json is no sweep: $(head -c 400 "$work/bench-limits.json")"
check "bench --compare" 0 "$iapctl" "${sim[@]}" bench -t 0.3 --warmup 0 --latency-count 100 --compare "$work/bench.json" com.example.echo
contains "bench --compare: ratios" out "beside the earlier run (ratio now / then):"
python3 - "$work/bench.svg" <<'PY' || fail "bench --plot did not draw a picture"
import sys, xml.etree.ElementTree as tree
root = tree.parse(sys.argv[1]).getroot()
text = " ".join(t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}text"))
assert root.tag == "{http://www.w3.org/2000/svg}svg", root.tag
for words in ("Throughput over time", "Send window in use", "the accessory's limit", "Round trips of 64 bytes", "MB/s", "packets in flight"):
    assert words in text, words
PY
# A source that starts on request: with --start it sends; the bytes are counted as the accessory sent them.
check "bench a source started on request" 0 "$iapctl" --no-usb "--simulate=$here/profiles/bench/requested-source.json" bench -m source \
    --start "01 02" -n 4M --warmup 0 com.example.stream
contains "bench source: 4 MiB in" out "throughput: in "
# A window of one packet (the borescope's link, PROTOCOL.md §7.2): the summary names the window.
check "bench of a window of one" 0 "$iapctl" --no-usb --simulate=borescope bench -t 1 --warmup 0.2 --latency-count 20 com.example.borescope.control
contains "bench: the window bound it" out "bound by the accessory's window: packets waited behind a full window"
contains "bench: the window's size" out "1 packet in flight at most, of "

# On a pseudo-terminal (the UART path): a window of one 4,096-byte packet (the borescope), and a
# source that starts on request; the figures name the serial line.
for pair in "borescope:both:com.example.borescope.control:" "$here/profiles/bench/requested-source.json:source:com.example.stream:--start 01 -n 4M"; do
    profile=${pair%%:*} rest=${pair#*:}
    mode=${rest%%:*} rest=${rest#*:}
    protocol=${rest%%:*} extra=${rest#*:}
    coproc BENCHPTY { exec "$iapctl" simulate --profile "$profile" 2> "$work/benchpty.err"; }
    bench_pid=$BENCHPTY_PID
    if read -r -t 20 -u "${BENCHPTY[0]}" bench_pty && [ -n "$bench_pty" ]; then
        # shellcheck disable=SC2086 # $extra is words on purpose
        check "bench $mode on a pty ($(basename "$profile" .json))" 0 "$iapctl" --no-usb --serial "$bench_pty:3000000" bench -m "$mode" -t 1 \
            --warmup 0.2 --latency-count 50 $extra --json "$protocol"
        grep -q '"transport":"serial"' "$work/out" || fail "bench on a pty: not over serial: $(head -c 300 "$work/out")"
        python3 - "$work/out" <<'PY' || fail "bench on a pty moved nothing: $(head -c 400 "$work/out")"
import json, sys
run = json.loads(open(sys.argv[1]).readline())["runs"][0]
assert run["bytesIn"] > 0 and run["failure"] is None, run
assert run["link"] is not None and run["link"]["sendPacketLength"] > 0, run["link"]
PY
    else
        fail "the simulator for bench did not announce its pty: $(cat "$work/benchpty.err")"
    fi
    kill "$bench_pid" 2>/dev/null || true
    wait "$bench_pid" 2>/dev/null || true
done

# A report made with --full keeps the certificate: its trace's authentication checks offline.
check "report --full of a signed accessory" 0 "$iapctl" --no-usb --simulate="$fixtures/rsa-sensor.json" report --full --no-write -o "$work/report-signed.txt"
report_trace "$work/report-signed.txt" "$work/trace-signed.pcapng"
check "decode checks the report's authentication" 0 "$iapctl" decode --trust "$fixtures/test-ca.pem" --pcap "$work/trace-signed.pcapng"
contains "decode: the report's signature is valid, chain and all" out "authentication: 1 response checked, 1 valid: iAP2 valid"
# A port where nothing answers (a pty whose other end stays silent): the report stops at detect.
coproc SILENT { exec python3 -c 'import os, sys; m, s = os.openpty(); print(os.ttyname(s), flush=True); sys.stdin.read()'; }
silent_pid=$SILENT_PID
if read -r -t 10 -u "${SILENT[0]}" silent_pty && [ -n "$silent_pty" ]; then
    check "report where nothing answers" 0 "$iapctl" --no-usb --serial "$silent_pty" --timeout 1 report -o "$work/report-silent.txt"
    contains "report: stopped at detect" err "stopped at detect: the accessory sent nothing in "
    contains "report: what to check" "report-silent.txt" "next: The accessory did not answer."
else
    fail "report: no silent pseudo-terminal"
fi
kill "$silent_pid" 2>/dev/null || true
wait "$silent_pid" 2>/dev/null || true
for profile in thermal-camera borescope; do
    check "report --simulate=$profile" 0 "$iapctl" --no-usb --simulate=$profile report -o "$work/report-$profile.txt"
    contains "report --simulate=$profile passes" err "all steps passed"
done
contains "report: a native transport" "report-borescope.txt" "native transport"
check "report -o - writes to standard output" 0 "$iapctl" "${sim[@]}" report -o - --no-write --read-timeout 0.1
contains "report -o -: the report" out "RESULT: all steps passed"
contains "report -o -: the command names a file" out "p' REPORT.txt | sed"
contains "report -o -: the summary" err "report written to standard output: all steps passed"
mkdir -p "$work/report-dir"
iapctl_path=$(cd "$(dirname "$iapctl")" && pwd)/$(basename "$iapctl") # env -C runs it from elsewhere
check "report's default file name" 0 env -C "$work/report-dir" "$iapctl_path" "${sim[@]}" report --read-timeout 0.1
ls "$work/report-dir" > "$work/r"
if ! grep -qE '^iapctl-report-[0-9]{8}-[0-9]{6}\.txt$' "$work/r"; then fail "report's default name: $(cat "$work/r")"; fi
check "report to a file that cannot be written: 73" 73 "$iapctl" "${sim[@]}" report -o "$work/no-such-dir/report.txt"
contains "report: 73 says what to do" err "choose another place with -o FILE"
check "report: an unknown option is a usage error" 64 "$iapctl" "${sim[@]}" report --bogus
check "report: no positional arguments" 64 "$iapctl" "${sim[@]}" report extra
check "report of a hostile accessory" 0 "$iapctl" "${hostile[@]}" report -o "$work/report-hostile.txt" --read-timeout 0.1
no_controls "report" "report-hostile.txt"
contains "report escapes" "report-hostile.txt" 'name:              "Evil\u{1b}]0;pwned\u{7}\u{1b}[2J\u{1b}[31m\nfake line"'

# 1. A choice waits until the sources have settled: accessory 2 on a pty beside the in-process
# simulator is found every time; an ambiguous selector is an error listing the candidates.
coproc PTY { exec "$iapctl" simulate -v 2> "$work/pty-sim.err"; }
pty_pid=$PTY_PID
if read -r -t 20 -u "${PTY[0]}" pty && [ -n "$pty" ]; then
    for attempt in 1 2 3; do
        check "open -a 2 picks the pty accessory (try $attempt)" 0 \
            "$iapctl" --no-usb --serial "$pty" --simulate open com.example.echo -a 2 --idle 0.2 < /dev/null
    done
    check "send -a 2 waits for it too" 0 "$iapctl" --no-usb --serial "$pty" --simulate send com.example.sink "$work/image.bin" -a 2
    check "a serial number two accessories share is ambiguous (64)" 64 \
        "$iapctl" --no-usb --serial "$pty" --simulate open com.example.echo -a SIM-MS-0001 < /dev/null
    contains "ambiguity lists both" err "1 Multi Sensor (serial SIM-MS-0001"
    contains "ambiguity lists both (2)" err "2 Multi Sensor (serial SIM-MS-0001"
    check "no -a with two candidates is ambiguous (64)" 64 "$iapctl" --no-usb --serial "$pty" --simulate open com.example.echo < /dev/null
    contains "ambiguity says how to pick" err "pick one by its connection id"
    # 6. simulate -v tells what happens in words, not Swift dumps.
    "$iapctl" --no-usb --serial "$pty" list > /dev/null 2>&1 || true
else
    fail "the simulator on a pty did not start: $(cat "$work/pty-sim.err")"
fi
kill "$pty_pid" 2>/dev/null || true
wait "$pty_pid" 2>/dev/null || true
contains "simulate -v in words" pty-sim.err "simulator: identified as 'Multi Sensor'"
lacks "simulate -v has no Swift dumps" pty-sim.err "IAPLink."

# 2. send without --verify-echo drains the echo: 5 MiB through an echo finishes (it stalled).
head -c $((5 << 20)) /dev/urandom > "$work/five.bin"
check "send 5 MiB to an echo without --verify-echo" 0 timeout 60 "$iapctl" "${sim[@]}" send com.example.echo "$work/five.bin" --stall-timeout 5
check "--stall-timeout ends a stuck send (74)" 74 timeout 60 "$iapctl" --no-usb "--simulate=$work/stuck.json" send com.example.sink "$work/stuck.bin" --stall-timeout 1
contains "stall message" err "acknowledged nothing for 1.0 seconds"
# Ctrl-C: a summary and 130.
"$iapctl" -v --no-usb "--simulate=$work/stuck.json" send com.example.sink "$work/stuck.bin" --stall-timeout 60 --json > "$work/out" 2> "$work/err" &
sender=$!
# -v logs "sending" once Ctrl-C is caught; then the transfer is stuck (the sink stopped reading).
for _ in $(seq 300); do grep -q "sending" "$work/err" 2>/dev/null && break; sleep 0.1; done
kill -INT "$sender"
status=0; wait "$sender" || status=$?
[ "$status" -eq 130 ] || fail "send interrupted exits 130, not $status: $(cat "$work/err")"
contains "interrupted summary" err "transfer interrupted: the accessory acknowledged"
contains "interrupted --json" out '"ok":false'

# 3. send streams from disk: 100 MB in bounded memory; progress with bytes, rate, times on a
# terminal only.
head -c 100000000 /dev/zero > "$work/big.bin"
if python3 - "$iapctl" "$work/big.bin" 2> "$work/rss.err" <<'PY'
import resource, subprocess, sys
status = subprocess.run([sys.argv[1], "--no-usb", "--simulate", "send", "com.example.sink", sys.argv[2]], capture_output=True).returncode
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024
if status != 0 or peak > 64:
    sys.exit(f"send of 100 MB: exit {status}, {peak} MiB resident at most (limit 64)")
print(f"send of 100 MB: {peak} MiB resident at most", file=sys.stderr)
PY
then echo "cli-checks: ok send streams 100 MB in bounded memory ($(cat "$work/rss.err"))"; else fail "bounded memory: $(cat "$work/rss.err")"; fi
rm -f "$work/big.bin"
check "send on a pipe draws no progress" 0 "$iapctl" "${sim[@]}" send com.example.sink "$work/five.bin"
[ -s "$work/err" ] && fail "send on a pipe wrote to standard error: $(cat "$work/err")"
if command -v script > /dev/null; then
    script -qec "'$iapctl' --no-usb --simulate send com.example.sink '$work/five.bin'" /dev/null > "$work/tty" 2>&1 || true
    contains "progress on a terminal" tty "of 5.24 MB"
    contains "progress shows the time" tty "elapsed"
    # 5. Help wrapped to the terminal's width, between words.
    script -qec "stty cols 60; '$iapctl' help open" /dev/null | tr -d '\r' > "$work/help60" || true
    if awk 'length > 60 { bad = 1 } END { exit !bad }' "$work/help60"; then fail "help is wider than a 60-column terminal: $(cat "$work/help60")"; fi
    contains "help wrapped between words" help60 "Unix"
fi

# 4. Numbers, values and options a subcommand ignores.
check "--simulate PROFILE without '=' says how" 64 "$iapctl" --no-usb --simulate legacy-sensor list
contains "the '=' hint" err "to give --simulate a value, write '--simulate=legacy-sensor'"
check "--simulate= is a usage error" 64 "$iapctl" --no-usb --simulate= list
lacks "no raw Swift error" err "CocoaError"
check "--simulate=nosuch names the profiles once" 66 "$iapctl" --no-usb --simulate=nosuch list
[ "$(grep -o 'multi-sensor' "$work/err" | wc -l)" -eq 1 ] || fail "the profile names are listed more than once: $(cat "$work/err")"
check "--simulate=DIRECTORY" 66 "$iapctl" --no-usb "--simulate=$work" list
lacks "no raw Swift error for a directory" err "CocoaError"
check "--timeout abc is a usage error" 64 "$iapctl" "${sim[@]}" --timeout abc list
check "--timeout -1 is a usage error" 64 "$iapctl" "${sim[@]}" --timeout -1 list
check "--chunk 0 is a usage error" 64 "$iapctl" "${sim[@]}" send com.example.sink "$work/five.bin" --chunk 0
check "decode refuses --serial" 64 "$iapctl" decode --serial /dev/nonexistent "$here/samples/dji-syn.hex"
contains "decode names the option" err "option '--serial' does not apply to 'iapctl decode'"
check "--serial before decode too" 64 "$iapctl" --serial /dev/nonexistent decode "$here/samples/dji-syn.hex"
check "simulate refuses --timeout" 64 "$iapctl" simulate --timeout 3

# 5. Help: the help subcommand listed, examples, exit codes, usage lines that fit.
check "top-level help" 0 "$iapctl" --help
contains "help lists help" out "  help                    Show the help of a subcommand."
contains "help has examples" out "EXAMPLES:"
contains "help has exit codes" out "  73    an output file or socket cannot be created"
awk '/^USAGE:/ && length > 100 { bad = 1 } END { exit bad }' "$work/out" || fail "a usage line is longer than 100 columns"
check "send's help" 0 "$iapctl" help send
awk '/^USAGE:/ && length > 100 { bad = 1 } END { exit bad }' "$work/out" || fail "send's usage line is longer than 100 columns: $(grep USAGE "$work/out")"

# 6. A protocol typo: at once, with "did you mean".
check "a protocol typo is told at once" 69 timeout 10 "$iapctl" "${sim[@]}" --timeout 30 open com.example.ech
contains "did you mean" err "did you mean 'com.example.echo'?"
check "a selector that misses" 69 timeout 10 "$iapctl" "${sim[@]}" --timeout 30 open com.example.echo -a 7
lacks "no 'did you mean' for a protocol that is spoken" err "did you mean 'com.example.echo'"
# Permission denied on a pty names its owner, not dialout (root only: as nobody).
if [ "$(id -u)" -eq 0 ] && command -v setpriv > /dev/null; then
    coproc PERM { exec "$iapctl" simulate 2> /dev/null; }
    perm_pid=$PERM_PID
    if read -r -t 20 -u "${PERM[0]}" perm_pty && [ -n "$perm_pty" ]; then
        check "a pty of another user: 77" 77 setpriv --reuid=nobody --regid=nogroup --clear-groups "$iapctl" --no-usb --serial "$perm_pty" list
        contains "the pty's owner named" err "is root's alone"
        lacks "not dialout for a pty" err "dialout"
    fi
    kill "$perm_pid" 2>/dev/null || true
    wait "$perm_pid" 2>/dev/null || true
fi

# 7. Exit codes as sysexits says: an uncreatable trace file is 73 like a socket, a bad profile 65.
check "an uncreatable --trace-file is 73" 73 "$iapctl" "${sim[@]}" --trace-file "$work/no/such/dir/trace.txt" list
printf '{ "identity": ' > "$work/broken.json"
check "a malformed profile is 65" 65 "$iapctl" --no-usb "--simulate=$work/broken.json" list

# 9. JSON: every command's output validates against docs/json-schema.json; numbers are numbers.
# Each bounded, so that a hang names its command (the ERR trap) instead of using up the script's time.
timeout 60 "$iapctl" "${sim[@]}" list --json > "$work/list.json"
timeout 60 "$iapctl" "${sim[@]}" info --json > "$work/info.json"
timeout 60 "$iapctl" "${sim[@]}" wait --json --protocol com.example.echo > "$work/wait.json"
timeout 60 "$iapctl" "${sim[@]}" wait --gone --json --serial-number NOPE > "$work/gone.json"
timeout 60 "$iapctl" "${sim[@]}" watch --json --count 1 > "$work/watch.json"
# An accessory that asks for an app after identification (issue 31): the second event.
timeout 60 "$iapctl" --no-usb --simulate=thermal-camera watch --json --count 2 > "$work/applaunch.json"
timeout 60 "$iapctl" "${sim[@]}" send com.example.echo "$work/native.bin" --verify-echo --json > "$work/send.json"
timeout 60 "$iapctl" --no-usb "--simulate=$work/vanish.json" send com.example.sink "$work/image.bin" --json > "$work/sendfail.json" 2> /dev/null || true
"$iapctl" decode --json "$here/samples/dji-syn.hex" > "$work/decode.json"
"$iapctl" decode --json "$here/samples/iap1-idps.hex" >> "$work/decode.json" || true
"$iapctl" decode --json --transaction-ids off "$here/samples/pioneer-auth.hex" >> "$work/decode.json"
for pair in list:list info:info wait:wait wait:gone watch:watch watch:applaunch send:send send:sendfail decode:decode; do
    if python3 "$here/check-json.py" "${pair%%:*}" "$work/${pair#*:}.json" 2> "$work/schema.err"; then
        echo "cli-checks: ok ${pair#*:} --json validates against docs/json-schema.json"
    else
        fail "${pair#*:} --json against the schema: $(cat "$work/schema.err")"
    fi
done
grep -q '"seconds":[0-9]' "$work/send.json" || fail "send --json seconds is not a number: $(cat "$work/send.json")"
grep -q '"event":"connected","accessory":{"connectionID"' "$work/watch.json" || fail "watch --json accessory is not the object: $(cat "$work/watch.json")"
grep -q '"event":"appLaunchRequested",.*"bundleIdentifier":"com.example.thermal"' "$work/applaunch.json" \
    || fail "watch --json did not report the thermal camera's app launch request: $(cat "$work/applaunch.json")"

# 8. Install under a prefix (DESTDIR), man pages that render, completion that completes, the
# example that finds iapctl on PATH, and an uninstall that leaves nothing.
stage=$work/stage
if DESTDIR=$stage "$here/install.sh" --no-build --bin "$(cd "$(dirname "$iapctl")" && pwd)" --prefix /usr/local > "$work/install.out" 2>&1; then
    for file in bin/iapctl share/man/man1/iapctl.1 share/bash-completion/completions/iapctl share/zsh/site-functions/_iapctl \
                share/fish/vendor_completions.d/iapctl.fish; do
        [ -f "$stage/usr/local/$file" ] || fail "install did not put $file under the prefix: $(cat "$work/install.out")"
    done
    [ -f "$stage/etc/udev/rules.d/70-mfi-accessory.rules" ] || fail "install did not put the udev rule in place"
    if command -v man > /dev/null; then
        MANWIDTH=80 man -l "$stage/usr/local/share/man/man1/iapctl.1" > "$work/man.txt" 2> "$work/man.err" || fail "man -l iapctl.1 failed: $(cat "$work/man.err")"
        [ -s "$work/man.err" ] && fail "man -l iapctl.1 warned: $(cat "$work/man.err")"
        contains "the man page renders its subcommands" man.txt "iapctl send"
        contains "the man page has the exit status" man.txt "EXIT STATUS"
    fi
    completed=$(bash -c 'source "$1"; COMP_WORDS=(iapctl se); COMP_CWORD=1; _iapctl; echo "${COMPREPLY[*]}"' _ "$stage/usr/local/share/bash-completion/completions/iapctl")
    [ "$completed" = "send" ] || fail "bash completion of 'iapctl se' gave '$completed', not 'send'"
    completed=$(bash -c 'source "$1"; COMP_WORDS=(iapctl --simulate send --verify); COMP_CWORD=3; _iapctl; echo "${COMPREPLY[*]}"' _ "$stage/usr/local/share/bash-completion/completions/iapctl")
    [ "$completed" = "--verify-echo" ] || fail "bash completion of 'iapctl send --verify' gave '$completed'"
    if command -v zsh > /dev/null; then # compsys stubbed: what the function offers
        completed=$(zsh -c '_describe() { local name=$4; print -l -- ${(P)name} | cut -d: -f1; }; compadd() { shift; print -l -- "$@"; }
                            _files() { :; }; compset() { :; }; source "$1" > /dev/null; words=(iapctl se); CURRENT=2; _iapctl | grep "^se"' \
                        _ "$stage/usr/local/share/zsh/site-functions/_iapctl" 2>&1)
        [ "$completed" = "send" ] || fail "zsh completion of 'iapctl se' gave '$completed', not 'send'"
    fi
    if command -v fish > /dev/null; then
        completed=$(fish -c 'source $argv[1]; complete -C "iapctl se"' "$stage/usr/local/share/fish/vendor_completions.d/iapctl.fish" 2>&1 | cut -f1)
        [ "$completed" = "send" ] || fail "fish completion of 'iapctl se' gave '$completed', not 'send'"
    fi
    # The example finds iapctl on PATH (no IAPCTL): an upgrade of the simulator's firmware updater.
    coproc FW { exec "$iapctl" simulate --profile firmware-updater 2> /dev/null; }
    fw_pid=$FW_PID
    if read -r -t 20 -u "${FW[0]}" fw_pty && [ -n "$fw_pty" ]; then
        head -c 300000 /dev/urandom > "$work/fw.bin"
        check "firmware-upgrade.py finds iapctl on PATH" 0 env -u IAPCTL PATH="$stage/usr/local/bin:$PATH" \
            python3 "$here/examples/firmware-upgrade.py" --serial "$fw_pty" --timeout 30 "$work/fw.bin" 3.0.0
    fi
    kill "$fw_pid" 2>/dev/null || true
    wait "$fw_pid" 2>/dev/null || true
    check "firmware-upgrade.py without iapctl: 69" 69 env -u IAPCTL PATH=/usr/bin:/bin python3 "$here/examples/firmware-upgrade.py" "$work/fw.bin" 3.0.0
    check "firmware-upgrade.py usage error: 64" 64 python3 "$here/examples/firmware-upgrade.py" --window 0 "$work/fw.bin" 3.0.0
    DESTDIR=$stage "$here/install.sh" --uninstall --prefix /usr/local > "$work/uninstall.out" 2>&1 || fail "uninstall failed: $(cat "$work/uninstall.out")"
    left=$(find "$stage" -type f | head -5)
    [ -z "$left" ] || fail "uninstall left files behind: $left"
else
    fail "install.sh: $(cat "$work/install.out")"
fi
# A user's prefix keeps to itself: nothing outside it (no /etc, no /usr/lib), and it says what it
# left out; --system-files puts the system files in place all the same (issue 35).
userstage=$work/userstage
bindir_built=$(cd "$(dirname "$iapctl")" && pwd)
if DESTDIR=$userstage "$here/install.sh" --no-build --bin "$bindir_built" --prefix /home/someone/.local > "$work/userinstall.out" 2>&1; then
    outside=$(find "$userstage" -type f -not -path "$userstage/home/someone/.local/*" | head -5 || true)
    [ -z "$outside" ] || fail "install.sh --prefix ~/.local wrote outside its prefix: $outside"
    [ -f "$userstage/home/someone/.local/bin/iapctl" ] || fail "install.sh --prefix ~/.local did not install iapctl: $(cat "$work/userinstall.out")"
    contains "a user prefix says what it left out" userinstall.out "--system-files"
    DESTDIR=$userstage "$here/install.sh" --uninstall --prefix /home/someone/.local > "$work/useruninstall.out" 2>&1 \
        || fail "uninstall of a user prefix failed: $(cat "$work/useruninstall.out")"
    left=$(find "$userstage" -type f | head -5 || true)
    [ -z "$left" ] || fail "uninstall of a user prefix left files behind: $left"
else
    fail "install.sh --prefix ~/.local: $(cat "$work/userinstall.out")"
fi
if DESTDIR=$userstage "$here/install.sh" --no-build --bin "$bindir_built" --prefix /opt/accessoryhost --system-files > "$work/sysinstall.out" 2>&1; then
    [ -f "$userstage/etc/udev/rules.d/70-mfi-accessory.rules" ] || fail "install.sh --system-files did not put the udev rule in place"
    [ -f "$userstage/etc/systemd/system/iapd.service" ] || fail "install.sh --system-files did not put iapd.service in place"
    grep -q "/opt/accessoryhost/bin/iapd" "$userstage/etc/systemd/system/iapd.service" || fail "iapd.service does not run the prefix's iapd"
    DESTDIR=$userstage "$here/install.sh" --uninstall --system-files --prefix /opt/accessoryhost > /dev/null 2>&1 || fail "uninstall --system-files failed"
    left=$(find "$userstage" -type f | head -5 || true)
    [ -z "$left" ] || fail "uninstall --system-files left files behind: $left"
else
    fail "install.sh --system-files: $(cat "$work/sysinstall.out")"
fi
if git -C "$here/.." ls-files --error-unmatch '*.pyc' > /dev/null 2>&1; then fail "a .pyc file is committed"; fi

# 10. One version: iapctl --version and the CHANGELOG's newest release agree.
check "iapctl --version" 0 "$iapctl" --version
version=$(cut -d' ' -f1 "$work/out")
grep -q "^## \[$version\] - [0-9]\{4\}-[0-9]\{2\}-[0-9]\{2\}$" "$here/../CHANGELOG.md" || fail "CHANGELOG.md has no '## [$version] - DATE' section"

# 11. iapd (beside iapctl) as iapctl meets it: found at $IAPD_SOCKET, said by -v, and stopped
# cleanly by SIGTERM (exit 0, its socket removed).
iapd=$(dirname "$iapctl")/iapd
if [ -x "$iapd" ]; then
    "$iapd" --socket "$work/iapd.sock" --no-usb --simulate -v 2> "$work/iapd.log" &
    iapd_pid=$!
    for _ in $(seq 1 100); do [ -S "$work/iapd.sock" ] && break; sleep 0.1; done # an external process: bounded polls
    check "iapctl goes through iapd" 0 env IAPD_SOCKET="$work/iapd.sock" "$iapctl" -v list
    contains "iapctl -v says iapd" err "going through iapd at $work/iapd.sock"
    contains "the accessory iapd serves" out "Multi Sensor"
    # iapd's counters, as iapctl stats --json gives them, against the schema.
    timeout 60 env IAPD_SOCKET="$work/iapd.sock" "$iapctl" stats --json > "$work/stats.json"
    python3 "$here/check-json.py" stats "$work/stats.json" 2> "$work/schema.err" || fail "stats --json against the schema: $(cat "$work/schema.err")"
    # report never goes through iapd: it says iapd holds the accessories and how to stop it.
    check "report while iapd runs" 0 env IAPD_SOCKET="$work/iapd.sock" "$iapctl" --no-usb report -o "$work/report-iapd.txt"
    contains "report names iapd" err "stopped at open: no accessory found"
    cp "$work/report-iapd.txt" "$work/r"
    contains "report says how to stop iapd" r "iapd is running (it listens at $work/iapd.sock) and holds the machine's accessories: stop it with 'sudo systemctl stop iapd.socket iapd.service'"
    contains "report's next step is iapd's" r "next: Stop iapd"
    kill -TERM "$iapd_pid"
    for _ in $(seq 1 100); do # until it exited (gone, or a zombie not yet waited for)
        state=$(sed 's/.*) //' "/proc/$iapd_pid/stat" 2>/dev/null | cut -c1 || true)
        { [ -z "$state" ] || [ "$state" = Z ]; } && break
        sleep 0.1
    done
    kill -KILL "$iapd_pid" 2>/dev/null || true # only if it did not stop: the check below fails then
    iapd_status=0; wait "$iapd_pid" || iapd_status=$?
    [ "$iapd_status" -eq 0 ] || fail "iapd exited with $iapd_status on SIGTERM: $(tail -n 20 "$work/iapd.log")"
    [ ! -e "$work/iapd.sock" ] || fail "iapd left its socket behind after SIGTERM"
    grep -q "stopping (signal 15)" "$work/iapd.log" || fail "iapd did not log its stop: $(cat "$work/iapd.log")"
    # Through iapd, acknowledged means the accessory has the bytes (protocol 3): the accessory
    # that stops reading fails the send as it does directly (exit 74, what it acknowledged).
    "$iapd" --socket "$work/iapd-stuck.sock" --no-usb "--simulate=$work/stuck.json" 2> "$work/iapd-stuck.log" &
    stuck_pid=$!
    for _ in $(seq 1 100); do [ -S "$work/iapd-stuck.sock" ] && break; sleep 0.1; done # an external process: bounded polls
    check "send through iapd to an accessory that stops acknowledging gives up (exit 74)" 74 \
        timeout 120 env IAPD_SOCKET="$work/iapd-stuck.sock" "$iapctl" send com.example.sink "$work/stuck.bin" --stall-timeout 2 --json
    contains "send through iapd is not ok" out '"ok":false'
    through=$(sed -n 's/.*"bytesAcknowledged":\([0-9]*\).*/\1/p' "$work/out")
    if [ -z "$through" ] || [ "$through" -lt 100000 ] || [ "$through" -ge 3000000 ] \
        || [ $((through > stuck ? through - stuck : stuck - through)) -gt 65536 ]; then
        fail "through iapd, a stuck send reports what the accessory acknowledged, as directly ($stuck): '$through': $(cat "$work/out")"
    fi
    kill -TERM "$stuck_pid" 2>/dev/null || true
    wait "$stuck_pid" 2>/dev/null || true
    # Bluetooth asked for where no bus (so no BlueZ) answers: iapd goes on serving, says once
    # what stops Bluetooth (it tries again every 5 s), and a bad address is a usage error.
    env DBUS_SYSTEM_BUS_ADDRESS="unix:path=$work/no-such-bus" "$iapd" --socket "$work/iapd-bt.sock" --no-usb --simulate --bluetooth -vv \
        2> "$work/iapd-bt.log" &
    bt_pid=$!
    for _ in $(seq 1 100); do grep -q "Bluetooth:" "$work/iapd-bt.log" 2>/dev/null && break; sleep 0.1; done # an external process: bounded polls
    check "iapd with Bluetooth but no BlueZ serves all the same" 0 env IAPD_SOCKET="$work/iapd-bt.sock" "$iapctl" list
    contains "the accessory it serves" out "Multi Sensor"
    # The second try (5 s later) says it again at debug only: the journal's priority 7, not 3.
    for _ in $(seq 1 150); do [ "$(grep -c "Bluetooth:" "$work/iapd-bt.log")" -ge 2 ] && break; sleep 0.1; done
    [ "$(grep -c "^<3>.*Bluetooth:" "$work/iapd-bt.log")" = 1 ] && [ "$(grep -c "^<7>.*Bluetooth:" "$work/iapd-bt.log")" -ge 1 ] \
        || fail "iapd should say once (then only at debug) why Bluetooth is not up: $(cat "$work/iapd-bt.log")"
    kill -TERM "$bt_pid" 2>/dev/null || true
    bt_status=0; wait "$bt_pid" || bt_status=$?
    [ "$bt_status" -eq 0 ] || fail "iapd with Bluetooth exited with $bt_status on SIGTERM: $(tail -n 20 "$work/iapd-bt.log")"
    check "iapd refuses a bluetooth-connect that is no address" 64 "$iapd" --socket "$work/iapd-bad.sock" --no-usb --bluetooth-connect nonsense
    contains "and says what one looks like" err "is not a Bluetooth address (AA:BB:CC:DD:EE:FF"
    [ ! -e "$work/iapd-bad.sock" ] || fail "iapd left a socket behind after a bad setting"
else
    fail "$iapd is missing (swift build)"
fi

[ "$failures" -eq 0 ] || { echo "cli-checks: $failures failed" >&2; exit 1; }
echo "cli-checks: all passed"
