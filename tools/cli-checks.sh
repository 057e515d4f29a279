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
check "info shows native protocols" 0 "$iapctl" --no-usb --simulate=native-streamer info --json
contains "info --json native" out '"name":"com.example.native.sink","matchAction":0,"native":true'
head -c 3000000 /dev/urandom > "$work/native.bin"
check "send through a native transport" 0 "$iapctl" --no-usb --simulate=native-streamer send com.example.native.sink "$work/native.bin" --json
contains "send --json native" out '"ok":true,"protocol":"com.example.native.sink","accessory":1,"bytes":3000000'

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
contains "decode --json is one object per line" out '{"kind":"iap2","offset":0,"length":23,"control":"SYN"'

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
contains "unknown issuer named" err 'unknown issuer: no trust anchors were given'
check "an unreadable --trust is said" 66 "$iapctl" "${sim[@]}" --trust "$work/none.pem" list

[ "$failures" -eq 0 ] || { echo "cli-checks: $failures failed" >&2; exit 1; }
echo "cli-checks: all passed"
