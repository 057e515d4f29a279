"""The client against a real iapd: accessories, events, sessions, failures."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import accessoryhost
from accessoryhost import Connected, Disconnected

from conftest import ECHO, TRANSPORT, Daemon

LONG = 60.0  # generous: the machine may be loaded (and the rig runs under TCG)


def pattern(size: int, seed: int = 1) -> bytes:
    """Bytes that are not periodic within a ring (a misplaced chunk shows)."""
    out = bytearray()
    counter = 0
    while len(out) < size:
        out += hashlib.sha256(f"{seed}-{counter}".encode()).digest() * 64
        counter += 1
    return bytes(out[:size])


def test_lists_every_field(daemon: Daemon) -> None:
    with accessoryhost.connect(daemon.socket, name="pytest") as client:
        assert client.daemon.startswith("iapd ")
        accessory = client.wait_for(protocol=ECHO, timeout=LONG)
        listed = client.accessories()
        assert [record.id for record in listed] == [accessory.id]
        record = listed[0]
        assert record.name == "Multi Sensor" and record.manufacturer == "AccessoryHost Simulator"
        assert record.model_number == "SIM-MS1" and record.serial_number == "SIM-MS-0001"
        assert record.firmware_revision == "2.1.0" and record.hardware_revision == "B"
        assert record.protocol_strings == ("com.example.echo", "com.example.sink", "com.example.source", "com.example.telemetry")
        assert record.protocol_version == "iAP2"
        assert record.authentication in ("verified", "notVerified", "notChecked")
        assert record.identity["currentLanguage"] == "en" and record.raw["id"] == record.id == record.connection_id
        assert record.dock_type == ""
        if TRANSPORT == "usb":
            assert record.transport_kind == "usb" and record.usb_device is not None
            assert record.usb_device.usb_id == "1209:0001"
            assert client.wait_for(usb_id="1209:0001", timeout=LONG).id == record.id
        else:
            assert record.transport_kind == "memory" and record.usb_device is None
        assert record.bluetooth_address is None
        assert client.ping() >= 0
        assert client.stats()["clientsNow"] >= 1


def test_wait_for_matches_every_criterion_and_times_out_naming_them(daemon: Daemon) -> None:
    with accessoryhost.connect(daemon.socket) as client:
        found = client.wait_for(protocol=ECHO, serial="SIM-MS-0001", firmware="2.1.0", timeout=LONG)
        assert found.serial_number == "SIM-MS-0001"
        with pytest.raises(accessoryhost.Timeout) as raised:
            client.wait_for(protocol=ECHO, serial="NOT-THERE", timeout=0.3)
        assert "with serial number NOT-THERE" in str(raised.value) and "SIM-MS-0001" in str(raised.value)
        assert isinstance(raised.value, TimeoutError)


def test_echo_of_16_mib_is_byte_exact_and_acknowledged(daemon: Daemon) -> None:
    data = pattern(16 << 20)
    with accessoryhost.connect(daemon.socket) as client:
        accessory = client.wait_for(protocol=ECHO, timeout=LONG)
        with client.open(accessory, ECHO) as session:
            received = bytearray()
            failures = []

            def writer() -> None:
                try:
                    session.write(data, timeout=LONG)
                    session.drain(timeout=LONG)
                except Exception as error:  # reported below
                    failures.append(error)
            thread = threading.Thread(target=writer)
            thread.start()
            buffer = bytearray(1 << 20)
            while len(received) < len(data):
                count = session.readinto(buffer, timeout=LONG)
                assert count > 0, "the session ended before the echo came back"
                received += buffer[:count]
            thread.join(LONG)
            assert not failures and not thread.is_alive()
            assert received == data
            assert session.bytes_acknowledged == session.bytes_written == len(data) == session.bytes_read


def test_back_pressure_holds_a_writer_whose_reader_stopped_and_loses_nothing(daemon: Daemon) -> None:
    with accessoryhost.connect(daemon.socket) as client:
        accessory = client.wait_for(protocol=ECHO, timeout=LONG)
        with client.open(accessory, ECHO) as session:
            data = pattern(256 << 20, seed=2)
            # Nobody reads the echo: the rings and the link fill, and the write waits (then times out).
            with pytest.raises(accessoryhost.Timeout) as raised:
                session.write(data, timeout=3)
            written = raised.value.written
            assert 0 < written < len(data)
            assert "took no bytes" in str(raised.value)
            # Reading again releases the accessory: every byte written comes back, in order.
            assert session.read_exactly(written, timeout=LONG) == data[:written]
            session.write(data[written:written + 1000], timeout=LONG)
            assert session.read_exactly(1000, timeout=LONG) == data[written:written + 1000]
            # A read_exactly that times out keeps what it read (the echo of one small write comes
            # back in one packet: once its first byte is here, all are).
            session.write(b"0123456789", timeout=LONG)
            assert session.read_exactly(1, timeout=LONG) == b"0"
            with pytest.raises(accessoryhost.Timeout) as short:
                session.read_exactly(20, timeout=0.5)
            assert short.value.partial == b"123456789"


def test_a_closed_session_refuses_use_and_its_protocol_opens_again(daemon: Daemon) -> None:
    with accessoryhost.connect(daemon.socket) as client:
        accessory = client.wait_for(protocol=ECHO, timeout=LONG)
        session = client.open(accessory, ECHO)
        session.write(b"before close")
        session.close()
        session.close()
        assert session.closed
        for use in (lambda: session.write(b"x"), lambda: session.read(1), lambda: session.drain()):
            with pytest.raises(accessoryhost.SessionClosed, match="closed \\(by this program\\)"):
                use()
        # iapd released the protocol: it opens again (an open waits for the old session's end).
        with client.open(accessory, ECHO) as again:
            again.write(b"after")
            assert again.read_exactly(5, timeout=LONG) == b"after"


def test_closing_a_session_wakes_a_reader_blocked_on_it(daemon: Daemon) -> None:
    with accessoryhost.connect(daemon.socket) as client:
        accessory = client.wait_for(protocol=ECHO, timeout=LONG)
        session = client.open(accessory, ECHO)
        outcome = []
        started = threading.Event()

        def reader() -> None:
            started.set()
            try:
                session.read(16, timeout=LONG)
                outcome.append("read")
            except accessoryhost.SessionClosed:
                outcome.append("closed")
        thread = threading.Thread(target=reader)
        thread.start()
        started.wait(LONG)
        session.close()
        thread.join(LONG)
        assert not thread.is_alive() and outcome == ["closed"]


def test_failures_are_typed_and_say_what_to_do(daemon: Daemon, tmp_path: Path) -> None:
    with pytest.raises(accessoryhost.DaemonNotRunning, match="iapd is not running .*systemctl start iapd"):
        accessoryhost.connect(str(tmp_path / "nothing.sock"))
    with accessoryhost.connect(daemon.socket) as client, accessoryhost.connect(daemon.socket) as other:
        accessory = client.wait_for(protocol=ECHO, timeout=LONG)
        with pytest.raises(accessoryhost.UnsupportedProtocol, match="does not declare 'com.example.none'; it declares: com.example.echo"):
            client.open(accessory, "com.example.none")
        with pytest.raises(accessoryhost.NoSuchAccessory):
            client.open(accessory.id + 1000, ECHO)
        with client.open(accessory, ECHO):
            with pytest.raises(accessoryhost.ProtocolInUse) as raised:
                other.open(accessory, ECHO, timeout=LONG)
            assert raised.value.holder is not None and raised.value.holder["pid"] == os.getpid()
            assert f"pid {os.getpid()}" in str(raised.value) and "close it there first" in str(raised.value)
        assert raised.value.code == "protocol-in-use"


def test_events_and_sessions_across_an_unplug(pluggable: tuple) -> None:  # type: ignore[type-arg]
    server, accessory = pluggable
    with accessoryhost.connect(server.socket) as client, accessoryhost.connect(server.socket) as watcher:
        first = client.wait_for(protocol=ECHO, timeout=LONG)
        session = client.open(first, ECHO)
        session.write(b"ping")
        assert session.read_exactly(4, timeout=LONG) == b"ping"
        accessory.unplug()
        # The session ends: reading finds the end, writing says why.
        assert session.read(16, timeout=LONG) == b""
        with pytest.raises(accessoryhost.SessionClosed, match="ended"):
            session.write(b"more", timeout=LONG)
        session.close()
        # Why, once iapd's event says so.
        assert client.disconnect_reason(first.id, timeout=LONG)
        accessory.replug()
        again = client.wait_for(protocol=ECHO, timeout=LONG * 2)
        assert again.id != first.id and again.serial_number == first.serial_number
        # The watcher saw it connect (first, if it was not there at hello), go, and come back.
        seen = []
        for event in watcher.events(timeout=LONG):
            seen.append(event)
            if isinstance(event, Connected) and event.accessory.id == again.id:
                break
        gone = [event for event in seen if isinstance(event, Disconnected)]
        assert [event.accessory_id for event in gone] == [first.id] and gone[0].reason
        with client.open(again, ECHO) as session:
            session.write(b"pong")
            assert session.read_exactly(4, timeout=LONG) == b"pong"


def test_a_daemon_that_restarts(daemon: Daemon) -> None:
    client = accessoryhost.connect(daemon.socket)
    accessory = client.wait_for(protocol=ECHO, timeout=LONG)
    session = client.open(accessory, ECHO)
    daemon.stop()
    assert session.read(16, timeout=LONG) == b""
    with pytest.raises(accessoryhost.SessionClosed):
        session.write(b"x")
    session.close()
    with pytest.raises(accessoryhost.DaemonGone, match="connect again"):
        client.accessories()
    with pytest.raises(accessoryhost.DaemonGone):
        client.wait_for(protocol=ECHO, timeout=1)
    client.close()
    daemon.start()
    with accessoryhost.connect(daemon.socket) as client:
        accessory = client.wait_for(protocol=ECHO, timeout=LONG)
        with client.open(accessory, ECHO) as session:
            session.write(b"back")
            assert session.read_exactly(4, timeout=LONG) == b"back"


CHILD = """
import accessoryhost, sys
client = accessoryhost.connect(sys.argv[1])
session = client.open(client.wait_for(protocol=sys.argv[2], timeout=60), sys.argv[2])
block = bytes(1 << 20)
session.write(block)
print("writing", flush=True)
while True:
    session.write(block)
"""


def test_a_client_killed_mid_transfer_leaves_iapd_serving(daemon: Daemon) -> None:
    package = str(Path(accessoryhost.__file__).resolve().parents[1])
    environment = dict(os.environ, PYTHONPATH=package + os.pathsep + os.environ.get("PYTHONPATH", ""))
    child = subprocess.Popen([sys.executable, "-c", CHILD, daemon.socket, ECHO], stdout=subprocess.PIPE, env=environment)
    assert child.stdout is not None
    # "writing" once its first MiB is in its ring: it is mid-transfer from then on.
    assert child.stdout.readline() == b"writing\n"
    with accessoryhost.connect(daemon.socket) as client:
        accessory = client.wait_for(protocol=ECHO, timeout=LONG)
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
        # Its session is released (the open waits for its end), and the echo works for this one.
        with client.open(accessory, ECHO, timeout=LONG) as session:
            session.write(b"still here")
            assert session.read_exactly(10, timeout=LONG) == b"still here"
        assert daemon.process is not None and daemon.process.poll() is None
