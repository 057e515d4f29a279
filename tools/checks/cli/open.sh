# iapctl open: an accessory that goes away, --socket (an echo through it, its mode, a second
# client, paths it refuses), a protocol typo and a selector that misses.
# shellcheck shell=bash

check "open ends (74) when the accessory goes while its input stays open, and says why" check_open_accessory_goes
check_open_accessory_goes() {
    local profile
    profile=$(write_file vanish-echo.json << 'JSON'
{ "identity": { "name": "Vanisher", "model": "V1", "manufacturer": "Test", "serialNumber": "V-2",
                "firmwareVersion": "1.0", "hardwareVersion": "A" },
  "protocols": [ { "name": "com.example.echo", "behaviour": "echo" } ],
  "faults": { "vanishAfterBytes": 1000 } }
JSON
)
    mkfifo "$T/held"
    exec 4<> "$T/held" # a writer that stays, as a terminal does: the input never ends
    head -c 5000 /dev/urandom > "$T/held"
    exits 74 within 60 bash -c 'exec 4>&-; exec "$0" --no-usb --simulate="$1" open com.example.echo < "$2"' \
        "$IAPCTL" "$profile" "$T/held"
    exec 4>&-
    contains "$ERR" "the accessory disconnected: "
}

check "open --socket echoes 1 MiB through the session and removes its socket" check_open_socket_echo
check_open_socket_echo() {
    local socket=$T/echo.sock
    # Python starts iapctl and reads its announcement line from the pipe, then connects.
    python3 - "$socket" "$IAPCTL" "${SIM[@]}" open com.example.echo --socket "$socket" << 'PY'
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
}

check "open --socket under umask 000 makes a 0600 socket, turns a second client away while the first is served, and logs the refusal" check_open_socket_private
check_open_socket_private() {
    local socket=$T/private.sock
    (umask 000 && python3 - "$socket" "$IAPCTL" "${SIM[@]}" open com.example.echo --socket "$socket" 2> "$T/private.err" << 'PY'
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
    ) || { echo "two clients under umask 000:"; cat "$T/private.err"; return 1; }
    contains "$T/private.err" "refused another client on $socket"
}

check "open --socket refuses a path that is not a socket (73)" check_open_socket_not_a_socket
check_open_socket_not_a_socket() {
    local image
    image=$(data_file image.bin 1000000)
    exits 73 "$IAPCTL" "${SIM[@]}" open com.example.echo --socket "$image"
}

check "open --socket refuses a socket another process listens on (73) and says so" check_open_socket_live
check_open_socket_live() {
    local holder
    mkfifo "$T/live.in" "$T/live.out"
    # Listens, says so, and holds the socket until its standard input ends (this check's fd 5).
    python3 -c 'import socket, sys; s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen(1); print("ready", flush=True); sys.stdin.read()' \
        "$T/live.sock" < "$T/live.in" > "$T/live.out" &
    holder=$!
    on_exit stop_process "$holder"
    exec 5> "$T/live.in" 4< "$T/live.out"
    read -r -t 10 -u 4 _ || true
    exits 73 "$IAPCTL" "${SIM[@]}" open com.example.echo --socket "$T/live.sock"
    contains "$ERR" "another process is listening on"
    exec 5>&- 4<&- # the holder reads the end of its input and exits
    wait "$holder" 2> /dev/null || true
}

check "a protocol typo is told at once (69), with 'did you mean'" check_open_protocol_typo
check_open_protocol_typo() {
    exits 69 within 10 "$IAPCTL" "${SIM[@]}" --timeout 30 open com.example.ech
    contains "$ERR" "did you mean 'com.example.echo'?"
}

check "a selector that matches no accessory is told at once (69), with no 'did you mean' for a protocol that is spoken" check_open_selector_misses
check_open_selector_misses() {
    exits 69 within 10 "$IAPCTL" "${SIM[@]}" --timeout 30 open com.example.echo -a 7
    lacks "$ERR" "did you mean 'com.example.echo'"
}
