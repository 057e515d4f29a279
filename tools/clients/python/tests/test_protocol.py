"""The client against a fake iapd (a socket this test answers): versions, lying lengths, bad
rings, a daemon that vanishes; and the parsers fuzzed."""

from __future__ import annotations

import array
import json
import mmap
import os
import random
import socket
import struct
import threading
from pathlib import Path
from typing import Callable, Iterator, List

import pytest

import accessoryhost
from accessoryhost import _protocol
from accessoryhost._rings import HEADER, MAGIC, Rings
from accessoryhost.records import Accessory, event_from_reply

RECORD = {"id": 7, "transportKind": "usb", "location": "usb 1-1",
          "usb": {"bus": 1, "address": 2, "portPath": [1], "vendorID": 0x1209, "productID": 0x0001, "release": 0x100,
                  "manufacturer": "M", "product": "P", "serialNumber": "S"},
          "identity": {"name": "Fake", "manufacturer": "M", "modelIdentifier": "F1", "serialNumber": "F-1",
                       "firmwareVersion": "1.0", "hardwareVersion": "A", "protocolVersion": "iAP2",
                       "protocols": [{"identifier": 1, "matchAction": 0, "name": "com.example.echo"}],
                       "authentication": {"accepted": True, "status": {"verified": {}}}}}


def frame(message: object) -> bytes:
    body = json.dumps(message).encode()
    return struct.pack(">I", len(body)) + body


class FakeDaemon:
    """Listens on a socket; each connection is answered by ``script(connection, requests)``."""

    def __init__(self, path: Path, script: Callable[[socket.socket, Iterator[dict]], None]) -> None:
        self.path = str(path)
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(self.path)
        self.server.listen(4)
        self.script = script
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        connection, _ = self.server.accept()

        def requests() -> Iterator[dict]:
            buffer = b""
            while True:
                while len(buffer) < 4 or len(buffer) < 4 + struct.unpack(">I", buffer[:4])[0]:
                    data = connection.recv(65536)
                    if not data:
                        return
                    buffer += data
                length = struct.unpack(">I", buffer[:4])[0]
                yield json.loads(buffer[4:4 + length])
                buffer = buffer[4 + length:]
        try:
            self.script(connection, requests())
        finally:
            connection.close()

    def close(self) -> None:
        self.server.close()
        self.thread.join(10)


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[Callable[[Callable[[socket.socket, Iterator[dict]], None]], FakeDaemon]]:
    made: List[FakeDaemon] = []

    def make(script: Callable[[socket.socket, Iterator[dict]], None]) -> FakeDaemon:
        daemon = FakeDaemon(tmp_path / f"fake{len(made)}.sock", script)
        made.append(daemon)
        return daemon
    yield make
    for daemon in made:
        daemon.close()


def welcome(connection: socket.socket, requests: Iterator[dict], version: int = 3) -> None:
    hello = next(requests)
    assert hello["request"]["hello"]["version"] == 3
    connection.sendall(frame({"id": hello["id"], "reply": {"welcome": {"version": version, "daemon": "fake 1", "accessories": [RECORD]}}}))


def test_a_newer_daemon_is_refused_naming_both_versions(fake) -> None:  # type: ignore[no-untyped-def]
    daemon = fake(lambda connection, requests: welcome(connection, requests, version=4))
    with pytest.raises(accessoryhost.VersionMismatch, match="this iapd speaks protocol 4, the library protocol 3: update this library"):
        accessoryhost.connect(daemon.path)


def test_a_daemon_refusing_the_version_is_reported_in_its_words(fake) -> None:  # type: ignore[no-untyped-def]
    def refuse(connection: socket.socket, requests: Iterator[dict]) -> None:
        hello = next(requests)
        connection.sendall(frame({"id": hello["id"], "reply": {"failure": {"_0": {
            "code": "version", "message": "this iapd speaks protocol 1 to 2, the client 3: update iapd to the client's release"}}}}))
    with pytest.raises(accessoryhost.VersionMismatch, match="protocol 1 to 2, the client 3"):
        accessoryhost.connect(fake(refuse).path)


def test_a_lying_length_is_a_protocol_error_not_a_hang(fake) -> None:  # type: ignore[no-untyped-def]
    def lie(connection: socket.socket, requests: Iterator[dict]) -> None:
        next(requests)
        connection.sendall(struct.pack(">I", 0x7FFFFFFF) + b"{")
        next(requests, None)
    with pytest.raises(accessoryhost.ProtocolError, match="2147483647 bytes"):
        accessoryhost.connect(fake(lie).path, timeout=30)


def test_a_daemon_that_vanishes_mid_message(fake) -> None:  # type: ignore[no-untyped-def]
    def vanish(connection: socket.socket, requests: Iterator[dict]) -> None:
        welcome(connection, requests)
        request = next(requests)
        connection.sendall(frame({"id": request["id"], "reply": {"pong": {}}})[:7])
    with accessoryhost.connect(fake(vanish).path) as client:
        assert client.known_accessories[0].usb_device is not None
        with pytest.raises(accessoryhost.DaemonGone, match="closed the connection"):
            client.ping(timeout=30)
        with pytest.raises(accessoryhost.DaemonGone):
            client.accessories()


def test_an_event_that_comes_with_a_list_reply_is_not_lost(fake) -> None:  # type: ignore[no-untyped-def]
    """The list's reply and a connection right after it, in one read: the connection stands."""
    def racing(connection: socket.socket, requests: Iterator[dict]) -> None:
        hello = next(requests)
        connection.sendall(frame({"id": hello["id"], "reply": {"welcome": {"version": 3, "daemon": "fake 1", "accessories": []}}}))
        listing = next(requests)
        connection.sendall(frame({"id": listing["id"], "reply": {"accessories": {"_0": []}}})
                           + frame({"reply": {"connected": {"_0": RECORD}}}))
        next(requests, None)
    with accessoryhost.connect(fake(racing).path) as client:
        assert client.wait_for(protocol="com.example.echo", timeout=30).id == 7


def test_a_session_opened_after_its_open_timed_out_is_closed_at_once(fake) -> None:  # type: ignore[no-untyped-def]
    closed: List[bytes] = []

    def late(connection: socket.socket, requests: Iterator[dict]) -> None:
        welcome(connection, requests)
        opening = next(requests)
        ping = next(requests)  # sent after the open timed out
        ours, theirs = socket.socketpair()
        descriptor = memfd({0: MAGIC, 1: 1, 2: 4096})
        body = frame({"id": opening["id"], "reply": {"opened": {"accessory": 7, "protocolString": "com.example.echo", "session": 1}}})
        connection.sendmsg([body], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [theirs.fileno(), descriptor]).tobytes())])
        theirs.close()
        os.close(descriptor)
        connection.sendall(frame({"id": ping["id"], "reply": {"pong": {}}}))
        ours.settimeout(30)
        try:
            closed.append(ours.recv(1))  # b"": the client closed the session's socket
        except socket.timeout:
            pass
        ours.close()
    daemon = fake(late)
    with accessoryhost.connect(daemon.path) as client:
        with pytest.raises(accessoryhost.Timeout, match="did not answer the open"):
            client.open(7, "com.example.echo", timeout=0.2)
        client.ping(timeout=30)
        daemon.thread.join(30)  # while the client is still open
        assert closed == [b""]


def test_wait_for_outlives_a_list_that_is_not_answered(fake) -> None:  # type: ignore[no-untyped-def]
    """A slow daemon (a loaded machine): the wait still answers from what the welcome said, and
    its timeout still names the criteria."""
    def silent(connection: socket.socket, requests: Iterator[dict]) -> None:
        welcome(connection, requests)
        for _ in requests:
            pass  # never answers
    with accessoryhost.connect(fake(silent).path) as client:
        assert client.wait_for(protocol="com.example.echo", timeout=0.3).id == 7
        with pytest.raises(accessoryhost.Timeout, match="with serial number NOT-THERE .*connected: Fake"):
            client.wait_for(serial="NOT-THERE", timeout=0.3)


def test_a_peer_that_floods_the_wake_socket_does_not_hold_the_reader() -> None:
    """A wake socket that never runs dry (a hostile peer writing without pause): clearing the
    wake-ups returns after a bounded number of reads."""
    class Endless:
        reads = 0

        def recv(self, size: int, flags: int = 0) -> bytes:
            Endless.reads += 1
            if Endless.reads > 1000:
                raise RuntimeError("clear_wakes kept reading")
            return b"\x01" * size

    descriptor = memfd({0: MAGIC, 1: 1, 2: 4096})
    rings = Rings(descriptor, Endless())  # type: ignore[arg-type]
    os.close(descriptor)
    rings.clear_wakes()
    assert 0 < Endless.reads <= 16 and not rings.peer_closed
    rings.close()


def test_a_counter_read_by_two_threads_is_not_taken_for_one_that_moved_back() -> None:
    """The thread that polls heals for the others, so two threads check iapd's tail at once.
    Here the reader reads the tail, iapd then moves it, and the polling thread reads and keeps
    the fresher value before the reader compares its own: the reader must not see the tail
    move back (the 16 MiB echo once failed so, a writer polling while the reader waited)."""
    descriptor = memfd({0: MAGIC, 1: 1, 2: 4096})
    wake, other = socket.socketpair()
    rings = Rings(descriptor, wake)
    os.close(descriptor)
    words = rings._words
    errors: List[BaseException] = []

    def heal() -> None:
        try:
            rings.available()
        except BaseException as error:  # reported below
            errors.append(error)
    healer = threading.Thread(target=heal)

    class Interleaved:
        """The ring's words, where the reader's first read of the tail lets iapd move it and
        the other thread run before the reader goes on."""
        def __init__(self) -> None:
            self.first = True

        def __getitem__(self, index: int) -> int:
            value = int(words[index])
            if index == 8 + 32 and self.first:
                self.first = False
                words[index] = value + 100
                healer.start()
                healer.join(timeout=0.5)  # with the counter lock it waits for the reader
            return value

        def __setitem__(self, index: int, value: int) -> None:
            words[index] = value

    rings._words = Interleaved()  # type: ignore[assignment]
    assert rings.available() == 0
    healer.join()
    assert not errors
    rings._words = words
    assert rings.available() == 100
    rings.close()
    wake.close()
    other.close()


def test_an_old_daemon_that_drops_the_client_for_stats(fake) -> None:  # type: ignore[no-untyped-def]
    def old(connection: socket.socket, requests: Iterator[dict]) -> None:
        welcome(connection, requests)
        next(requests)
        connection.sendall(frame({"reply": {"failure": {"_0": {"code": "bad-request", "message": "cannot read the request"}}}}))
    with accessoryhost.connect(fake(old).path) as client:
        with pytest.raises(accessoryhost.DaemonGone, match="dropped this client: cannot read the request .*update iapd"):
            client.stats(timeout=30)


def send_session(connection: socket.socket, request: dict, memory: int) -> None:
    ours, theirs = socket.socketpair()
    descriptors = array.array("i", [theirs.fileno(), memory])
    body = frame({"id": request["id"], "reply": {"opened": {"accessory": 7, "protocolString": "com.example.echo", "session": 1}}})
    connection.sendmsg([body], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, descriptors.tobytes())])
    theirs.close()
    ours.close()


def memfd(words: dict, capacity: int = 4096, size: int = 0) -> int:
    descriptor = os.memfd_create("rings")
    os.ftruncate(descriptor, size or HEADER + 2 * capacity)
    with mmap.mmap(descriptor, HEADER) as header:
        for index, value in words.items():
            struct.pack_into("=Q", header, index * 8, value)
    return descriptor


@pytest.mark.parametrize("words, message", [
    ({0: 0x1234, 1: 1, 2: 4096}, "layout 1 \\(magic 0x1234\\)"),
    ({0: MAGIC, 1: 2, 2: 4096}, "layout 2"),
    ({0: MAGIC, 1: 1, 2: 3000}, "claim 3000 bytes"),
    ({0: MAGIC, 1: 1, 2: 1 << 20}, "claim 1048576 bytes"),
    ({0: MAGIC, 1: 1, 2: 1 << 27}, "claim 134217728 bytes"),
])
def test_shared_memory_that_is_not_rings_is_refused(fake, words: dict, message: str) -> None:  # type: ignore[no-untyped-def]
    def opens(connection: socket.socket, requests: Iterator[dict]) -> None:
        welcome(connection, requests)
        descriptor = memfd(words)
        send_session(connection, next(requests), descriptor)
        os.close(descriptor)
        next(requests, None)
    with accessoryhost.connect(fake(opens).path) as client:
        with pytest.raises(accessoryhost.ProtocolError, match=message):
            client.open(7, "com.example.echo")


def test_counters_that_lie_break_the_session_not_the_client(fake) -> None:  # type: ignore[no-untyped-def]
    memory: List[int] = []

    def opens(connection: socket.socket, requests: Iterator[dict]) -> None:
        welcome(connection, requests)
        descriptor = memfd({0: MAGIC, 1: 1, 2: 4096})
        memory.append(descriptor)
        send_session(connection, next(requests), descriptor)
        next(requests, None)
    with accessoryhost.connect(fake(opens).path) as client:
        with client.open(7, "com.example.echo") as session:
            with mmap.mmap(memory[0], HEADER) as header:
                struct.pack_into("=Q", header, 64 + 256, 1 << 40)  # ring 1's tail far beyond a ring
                with pytest.raises(accessoryhost.ProtocolError, match="tail of the incoming ring .* broken"):
                    session.read(16, timeout=5)
                struct.pack_into("=Q", header, 128, 99)  # ring 0's head beyond anything written
                with pytest.raises(accessoryhost.ProtocolError, match="head of the outgoing ring .* broken"):
                    session.write(b"x", timeout=5)
    os.close(memory[0])


def test_descriptors_go_to_the_opened_reply_whatever_came_before_in_the_same_receive() -> None:
    """The kernel joins bytes without descriptors ahead of the reply that carries them, so one
    receive brings an event and the opened reply, with the reply's descriptors."""
    first, second = os.memfd_create("a"), os.memfd_create("b")
    decoder = _protocol.Decoder()
    event = frame({"reply": {"connected": {"_0": RECORD}}})
    opened = frame({"id": 3, "reply": {"opened": {"accessory": 7, "protocolString": "com.example.echo", "session": 1}}})
    decoder.feed(event + opened[:10], [first, second])
    decoded = decoder.next()
    assert decoded is not None and "connected" in decoded[0]["reply"] and decoded[1] == []
    assert decoder.next() is None
    decoder.feed(opened[10:], [])
    decoded = decoder.next()
    assert decoded is not None and decoded[0]["id"] == 3 and decoded[1] == [first, second]
    _protocol.close_all(decoded[1])


def test_descriptors_nobody_claims_are_bounded() -> None:
    decoder = _protocol.Decoder()
    descriptors = [os.memfd_create("x") for _ in range(_protocol.MAXIMUM_WAITING_DESCRIPTORS + 1)]
    with pytest.raises(accessoryhost.ProtocolError, match="no opened reply claims"):
        decoder.feed(b"", descriptors)
    for descriptor in descriptors:
        with pytest.raises(OSError):
            os.fstat(descriptor)  # closed


def test_the_decoder_and_records_survive_random_input() -> None:
    """A bounded fuzz run (seeded, so a failure repeats): random and mutated messages give
    messages or ProtocolError, nothing else, and never hold more than they were given."""
    generator = random.Random(20261204)
    valid = [frame({"id": 1, "reply": {"welcome": {"version": 3, "daemon": "d", "accessories": [RECORD]}}}),
             frame({"reply": {"connected": {"_0": RECORD}}}),
             frame({"reply": {"disconnected": {"accessory": 7, "reason": "gone"}}}),
             frame({"reply": {"transportFailed": {"location": "usb 1-1", "reason": "r"}}})]
    for _ in range(3000):
        data = bytearray(generator.choice(valid) * generator.randint(1, 3))
        for _ in range(generator.randint(0, 6)):
            position = generator.randrange(len(data))
            kind = generator.randrange(3)
            if kind == 0:
                data[position] = generator.randrange(256)
            elif kind == 1:
                del data[position:position + generator.randint(1, 16)]
            else:
                data[position:position] = os.urandom(generator.randint(1, 16))
            if not data:
                break
        decoder = _protocol.Decoder()
        cut = generator.randint(0, len(data))
        try:
            for piece in (bytes(data[:cut]), bytes(data[cut:])):
                decoder.feed(piece, [])
                while (decoded := decoder.next()) is not None:
                    message, descriptors = decoded
                    assert descriptors == []
                    reply = message["reply"]
                    try:
                        if "welcome" in reply:
                            for record in reply["welcome"].get("accessories", []):
                                Accessory.from_record(record)
                        else:
                            event_from_reply(reply)
                    except accessoryhost.ProtocolError:
                        pass
        except accessoryhost.ProtocolError:
            pass
