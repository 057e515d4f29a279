#!/usr/bin/env python3
"""Upgrade an accessory's firmware with nothing but iapctl (and the Python standard library).

The accessory speaks the firmware-update protocol of AccessoryHost's simulator (its
`firmware-update` behaviour; the framing is documented in
Sources/AccessorySimulator/FirmwareUpdate.swift): BEGIN, READY, CHUNK/ACK, END, DONE, then it
reboots with the new version. The steps:

  1. `iapctl wait --protocol P` finds the accessory and its current firmware;
  2. `iapctl open P --socket PATH` opens the session and offers it on a Unix socket; this script
     connects and sends the image, several chunks in flight, printing progress, and checks the
     accessory's verdict (status and the CRC-32 it computed);
  3. `iapctl wait --firmware VERSION` waits for the accessory to come back with the new version.

Nothing is resumed or retried silently: when a transfer breaks, the script says how many bytes
the accessory acknowledged and exits non-zero.

Exit status, as iapctl's (sysexits.h): 0 upgraded (or already at that version), 64 usage
error, 65 the accessory refused the image or computed another CRC, 66 the image cannot be read,
69 no accessory speaks the protocol (or iapctl cannot be run), 74 the transfer broke (the
message says how many bytes the accessory acknowledged), 75 the accessory did not appear, answer
or come back in time; any other status of an iapctl it ran, passed on.

iapctl is looked for on PATH (tools/install.sh puts it there), or given with --iapctl or the
IAPCTL environment variable.

Examples:
  firmware-upgrade.py --serial /dev/pts/5 image.bin 2.0.0   # a serial accessory (or iapctl simulate's pty)
  firmware-upgrade.py image.bin 2.0.0                       # a USB accessory
"""
import argparse
import json
import os
import select
import socket
import struct
import subprocess
import sys
import tempfile
import time
import zlib

BEGIN, CHUNK, END = 0x01, 0x02, 0x03
READY, ACK, DONE, ERROR = 0x81, 0x82, 0x83, 0x8F
STATUS = {0: "ok", 1: "CRC mismatch", 2: "size mismatch", 3: "chunk out of order"}


EX_USAGE, EX_DATAERR, EX_NOINPUT, EX_UNAVAILABLE, EX_IOERR, EX_TEMPFAIL = 64, 65, 66, 69, 74, 75


class Failure(Exception):
    """The upgrade cannot go on; the message says why, the status is the exit status."""

    def __init__(self, message, status=EX_IOERR):
        super().__init__(message)
        self.status = status


def log(text):
    print(f"firmware-upgrade: {text}", file=sys.stderr, flush=True)


def run_iapctl(command, timeout):
    """Runs iapctl, returns its standard output; raises Failure with its message otherwise."""
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise Failure(f"cannot run {command[0]}: not found on PATH; install it (tools/install.sh) "
                      "or give its path with --iapctl or IAPCTL", EX_UNAVAILABLE)
    except subprocess.TimeoutExpired:
        raise Failure(f"{' '.join(command)} did not finish within {timeout:.0f} s", EX_TEMPFAIL)
    if result.returncode != 0:
        raise Failure(f"{' '.join(command[1:])} exited with {result.returncode}: {result.stderr.strip()}", result.returncode)
    return result.stdout


def send_message(connection, kind, body):
    connection.sendall(struct.pack(">BI", kind, len(body)) + body)


class Reader:
    """Reads whole messages (type u8, length u32, body) from the socket."""

    def __init__(self, connection):
        self.connection = connection
        self.buffer = b""

    def exactly(self, count):
        while len(self.buffer) < count:
            try:
                data = self.connection.recv(65536)
            except socket.timeout:
                raise Failure("the accessory did not answer in time", EX_TEMPFAIL)
            if not data:
                raise Failure("the session ended (the accessory or iapctl went away)")
            self.buffer += data
        taken, self.buffer = self.buffer[:count], self.buffer[count:]
        return taken

    def message(self):
        kind, length = struct.unpack(">BI", self.exactly(5))
        if length > 1 << 20:
            raise Failure(f"the accessory sent a message of {length} bytes; the protocol allows 1048576", EX_DATAERR)
        body = self.exactly(length)
        if kind == ERROR and len(body) >= 1:
            raise Failure(f"the accessory reported error 0x{body[0]:02x}: {body[1:].decode('utf-8', 'replace')}", EX_DATAERR)
        return kind, body


def transfer(path, image, version, window, timeout):
    """Sends the image through the session offered at path; returns the accessory's CRC-32."""
    crc = zlib.crc32(image) & 0xFFFFFFFF
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    connection.settimeout(timeout)  # an accessory that stops answering fails the upgrade, it does not hang it
    connection.connect(path)
    reader = Reader(connection)
    send_message(connection, BEGIN, struct.pack(">II", len(image), crc) + version.encode())
    kind, body = reader.message()
    if kind != READY or len(body) != 4:
        raise Failure(f"expected READY after BEGIN, got message 0x{kind:02x}", EX_DATAERR)
    # A CHUNK body is the offset (4 bytes) and the data, at most 1048576 bytes in all.
    chunk = min(struct.unpack(">I", body)[0], (1 << 20) - 4)
    if chunk == 0:
        raise Failure("the accessory announced a maximum chunk size of 0", EX_DATAERR)
    sent = acknowledged = 0
    in_flight = []  # offsets after each CHUNK sent and not yet acknowledged
    start = last = time.monotonic()
    interactive = sys.stderr.isatty()
    while acknowledged < len(image):
        while sent < len(image) and len(in_flight) < window:
            end = min(len(image), sent + chunk)
            send_message(connection, CHUNK, struct.pack(">I", sent) + image[sent:end])
            sent = end
            in_flight.append(sent)
        kind, body = reader.message()
        if kind != ACK or len(body) != 4:
            raise Failure(f"expected ACK after CHUNK, got message 0x{kind:02x} ({acknowledged} bytes acknowledged)", EX_DATAERR)
        offset = struct.unpack(">I", body)[0]
        expected = in_flight.pop(0)
        if offset != expected:
            raise Failure(f"the accessory acknowledged {offset} bytes where {expected} were expected; "
                          f"{acknowledged} bytes were acknowledged in order before that", EX_DATAERR)
        acknowledged = offset
        now = time.monotonic()
        if now - last >= (0.1 if interactive else 2.0) or acknowledged == len(image):
            last = now
            rate = acknowledged / max(now - start, 1e-9) / 1e6
            line = f"{acknowledged * 100 // len(image):3d}%  {acknowledged} of {len(image)} bytes  {rate:.2f} MB/s"
            print(("\r" if interactive else "") + "firmware-upgrade: " + line, end="" if interactive else "\n",
                  file=sys.stderr, flush=True)
    if interactive:
        print(file=sys.stderr)
    seconds = time.monotonic() - start
    send_message(connection, END, b"")
    kind, body = reader.message()
    if kind != DONE or len(body) != 5:
        raise Failure(f"expected DONE after END, got message 0x{kind:02x}", EX_DATAERR)
    status, computed = struct.unpack(">BI", body)
    connection.close()
    if status != 0:
        raise Failure(f"the accessory refused the image: {STATUS.get(status, f'status {status}')} "
                      f"(its CRC-32 0x{computed:08x}, ours 0x{crc:08x})", EX_DATAERR)
    if computed != crc:
        raise Failure(f"the accessory said ok but computed CRC-32 0x{computed:08x}, ours is 0x{crc:08x}", EX_DATAERR)
    return computed, seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    parser.add_argument("image", help="the firmware image file")
    parser.add_argument("version", help="the version the accessory must report afterwards")
    parser.add_argument("--iapctl", default=os.environ.get("IAPCTL", "iapctl"), help="the iapctl binary (default: $IAPCTL or iapctl)")
    parser.add_argument("--serial", metavar="DEVICE[:BAUD]", help="the accessory is on this serial port (default: USB)")
    parser.add_argument("--protocol", default="com.example.firmware", help="the firmware-update protocol string")
    parser.add_argument("--serial-number", help="which accessory, when several speak the protocol")
    parser.add_argument("--window", type=int, default=8, help="CHUNKs in flight (default 8)")
    parser.add_argument("--timeout", type=float, default=60, help="seconds for each wait (default 60)")
    parser.add_argument("--force", action="store_true", help="upgrade even when the accessory already reports the version")
    try:
        args = parser.parse_args()
    except SystemExit as exit:
        return EX_USAGE if exit.code else 0  # argparse exits 2 on a usage error, 0 after --help
    if args.window < 1:
        log("usage error: --window must be at least 1")
        return EX_USAGE
    try:
        with open(args.image, "rb") as file:
            image = file.read()
    except OSError as error:
        log(f"cannot read the image: {error}")
        return EX_NOINPUT
    if not image:
        log(f"the image {args.image} is empty")
        return EX_NOINPUT

    base = [args.iapctl] + (["--no-usb", "--serial", args.serial] if args.serial else [])
    match = ["--protocol", args.protocol] + (["--serial-number", args.serial_number] if args.serial_number else [])
    timeout = ["--timeout", str(args.timeout)]
    try:
        # iapctl's JSON (docs/JSON.md): the accessory is under "accessory" on every line.
        before = json.loads(run_iapctl(base + ["wait", "--json"] + timeout + match, args.timeout + 30).splitlines()[0])["accessory"]
        serial = before["serialNumber"]
        log(f"found {before['name']} (serial {serial}) with firmware {before['firmwareRevision']} on {before['location']}")
        if before["firmwareRevision"] == args.version and not args.force:
            log(f"it already runs {args.version}; nothing to do (--force upgrades anyway)")
            return 0

        with tempfile.TemporaryDirectory(prefix="firmware-upgrade-") as directory:
            path = os.path.join(directory, "session.sock")
            # iapctl's messages go to a file: a pipe nobody reads during the transfer could fill.
            errors = open(os.path.join(directory, "open.err"), "w+")
            opener = subprocess.Popen(base + ["open", args.protocol, "--accessory", serial, "--socket", path] + timeout,
                                      stdout=subprocess.PIPE, stderr=errors, text=True)

            def opener_errors():
                errors.seek(0)
                return errors.read().strip()

            try:
                # "listening on PATH" once the session is open (bounded: iapctl may hang on a
                # silent accessory).
                if not select.select([opener.stdout], [], [], args.timeout + 30)[0]:
                    raise Failure(f"iapctl open did not open the session within {args.timeout + 30:.0f} s", EX_TEMPFAIL)
                line = opener.stdout.readline()
                if not line.startswith("listening on "):
                    opener.wait(timeout=30)
                    raise Failure(f"iapctl open exited with {opener.returncode}: {opener_errors()}", opener.returncode or EX_IOERR)
                log(f"session {args.protocol} open; sending {len(image)} bytes as version {args.version}")
                crc, seconds = transfer(path, image, args.version, args.window, args.timeout)
                log(f"the accessory verified the image (CRC-32 0x{crc:08x}) after {seconds:.2f} s, "
                    f"{len(image) / max(seconds, 1e-9) / 1e6:.2f} MB/s; it reboots now")
                # The accessory reboots right after DONE: iapctl open may see it go (exit 74).
                try:
                    status = opener.wait(timeout=args.timeout)
                except subprocess.TimeoutExpired:
                    raise Failure(f"iapctl open did not end within {args.timeout:.0f} s after the transfer", EX_TEMPFAIL)
                if status not in (0, 74):
                    raise Failure(f"iapctl open exited with {status}: {opener_errors()}", status)
            finally:
                if opener.poll() is None:
                    opener.kill()
                    opener.wait()
                errors.close()

        after = json.loads(run_iapctl(base + ["wait", "--json", "--serial-number", serial, "--firmware", args.version] + timeout
                                      + ["--protocol", args.protocol], args.timeout + 30).splitlines()[0])["accessory"]
        log(f"{after['name']} (serial {serial}) is back with firmware {after['firmwareRevision']} "
            f"(was {before['firmwareRevision']})")
        return 0
    except Failure as error:
        log(f"FAILED: {error}")
        return error.status
    except OSError as error:
        log(f"FAILED: {error}")
        return EX_IOERR


if __name__ == "__main__":
    sys.exit(main())
