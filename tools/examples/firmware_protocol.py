"""The firmware-update protocol of AccessoryHost's simulator (its `firmware-update` behaviour;
the framing is documented in Sources/AccessorySimulator/FirmwareUpdate.swift), the host's side:
messages, their reader, and the transfer of an image with several chunks in flight. Used by
firmware-upgrade.py whichever way it reaches the accessory (a Unix socket from `iapctl open`,
or a session of the Python client).
"""
import socket
import struct
import sys
import time
import zlib

BEGIN, CHUNK, END = 0x01, 0x02, 0x03
READY, ACK, DONE, ERROR = 0x81, 0x82, 0x83, 0x8F
STATUS = {0: "ok", 1: "CRC mismatch", 2: "size mismatch", 3: "chunk out of order"}


EX_USAGE, EX_DATAERR, EX_NOINPUT, EX_UNAVAILABLE, EX_SOFTWARE, EX_IOERR, EX_TEMPFAIL = 64, 65, 66, 69, 70, 74, 75


class Failure(Exception):
    """The upgrade cannot go on; the message says why, the status is the exit status."""

    def __init__(self, message, status=EX_IOERR):
        super().__init__(message)
        self.status = status


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


def transfer(connection, image, version, window, progress, interval=None):
    """Sends the image through the session (a socket, or a SessionStream), whose reads time out;
    returns the accessory's CRC-32 and the seconds the transfer took. progress(acknowledged,
    total, rate, done) is called at most every interval seconds (0.1 on a terminal, else 2) and
    at the end."""
    crc = zlib.crc32(image) & 0xFFFFFFFF
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
    if interval is None:
        interval = 0.1 if sys.stderr.isatty() else 2.0
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
        if now - last >= interval or acknowledged == len(image):
            last = now
            progress(acknowledged, len(image), acknowledged / max(now - start, 1e-9), acknowledged == len(image))
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
