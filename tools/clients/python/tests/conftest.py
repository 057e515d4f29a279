"""Fixtures: a real iapd (the project's build) serving simulated accessories.

ACCESSORYHOST_BIN names the directory of iapd and iapctl (default: the repository's
.build/release, else .build/debug). ACCESSORYHOST_PY_TRANSPORT picks how the accessories are
attached: ``memory`` (default: iapd's in-process simulator, ``--simulate``; pseudo-terminals for
the unplug tests) or ``usb`` (``iapctl simulate --gadget`` on a USB device controller, iapd
finding it by hotplug: the USB rig, tools/usb-rig/python.sh).
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from pathlib import Path
from typing import IO, Iterator, List, Optional

import pytest

REPOSITORY = Path(__file__).resolve().parents[4]
TRANSPORT = os.environ.get("ACCESSORYHOST_PY_TRANSPORT", "memory")
ECHO = "com.example.echo"


def binaries() -> Path:
    named = os.environ.get("ACCESSORYHOST_BIN")
    if named:
        return Path(named)
    for kind in ("release", "debug"):
        if (REPOSITORY / ".build" / kind / "iapd").exists():
            return REPOSITORY / ".build" / kind
    pytest.exit("no iapd built: run `swift build` (or set ACCESSORYHOST_BIN)", returncode=4)


class Lines:
    """Copies a child's output to a log file line by line (a thread of its own) and lets a test
    wait for the line that says the child is ready: an event, not a poll."""

    def __init__(self, stream: IO[bytes], log: Path) -> None:
        self.lines: List[str] = []
        self._changed = threading.Condition()
        self._ended = False
        self._thread = threading.Thread(target=self._copy, args=(stream, log), daemon=True)
        self._thread.start()

    def _copy(self, stream: IO[bytes], log: Path) -> None:
        with open(log, "ab") as out:
            for raw in stream:
                out.write(raw)
                out.flush()
                with self._changed:
                    self.lines.append(raw.decode("utf-8", "replace").rstrip("\n"))
                    self._changed.notify_all()
        stream.close()
        with self._changed:
            self._ended = True
            self._changed.notify_all()

    def wait_for(self, text: str, seconds: float, what: str) -> str:
        """The first line containing ``text``, waiting for it (bounded: a generous limit)."""
        with self._changed:
            found = self._changed.wait_for(lambda: self._ended or any(text in line for line in self.lines), seconds)
            for line in self.lines:
                if text in line:
                    return line
        raise AssertionError(f"{what} within {seconds} s" + (" (it exited)" if found else "") + f": {self.lines[-5:]}")


class Daemon:
    """iapd on a socket of its own, started and stopped by the tests."""

    def __init__(self, directory: Path, arguments: List[str]) -> None:
        self.socket = str(directory / "iapd.sock")
        self.log = directory / "iapd.log"
        self.arguments = arguments
        self.process: Optional[subprocess.Popen[bytes]] = None

    def start(self) -> None:
        self.process = subprocess.Popen([str(binaries() / "iapd"), "--socket", self.socket] + self.arguments,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        assert self.process.stderr is not None
        # iapd logs "listening on PATH" once its socket accepts.
        Lines(self.process.stderr, self.log).wait_for(f"listening on {self.socket}", 60, "iapd did not listen")

    def stop(self) -> int:
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        status = self.process.wait(timeout=60)
        self.process = None
        return status

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid


class Gadget:
    """A simulated accessory as a USB device (configfs gadget on a UDC), for the rig."""

    def __init__(self, directory: Path, profile: str, udc: str) -> None:
        self.udc = udc
        self.bind_file = Path(f"/sys/kernel/config/usb_gadget/iapsim-{udc}/UDC")
        self.process = subprocess.Popen([str(binaries() / "iapctl"), "simulate", "--gadget", "--udc", udc, "--profile", profile],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        assert self.process.stderr is not None
        # It says "simulating … on UDC; connect with: iapctl list" once the gadget is bound.
        Lines(self.process.stderr, directory / f"gadget-{udc}.log").wait_for("connect with", 60, "the gadget was not bound")

    def unplug(self) -> None:
        self.bind_file.write_text("\n")

    def replug(self) -> None:
        self.bind_file.write_text(self.udc + "\n")

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=60)


class PtyAccessory:
    """A simulated accessory on a pseudo-terminal, reached by iapd through a symlink: killing
    the simulator unplugs it; a new simulator behind the same link plugs it in again."""

    def __init__(self, directory: Path, profile: str) -> None:
        self.directory = directory
        self.profile = profile
        self.link = directory / "accessory-port"
        self.process: Optional[subprocess.Popen[bytes]] = None
        self.replug()

    def replug(self) -> None:
        with open(self.directory / "simulator.log", "ab") as stderr:
            self.process = subprocess.Popen([str(binaries() / "iapctl"), "simulate", "--profile", self.profile],
                                            stdout=subprocess.PIPE, stderr=stderr)
        assert self.process.stdout is not None
        # Its first line is the pseudo-terminal's path.
        target = Lines(self.process.stdout, self.directory / "simulator.out").wait_for(
            "/dev/", 60, "the simulator did not print its pseudo-terminal").strip()
        temporary = self.directory / "accessory-port.new"
        if temporary.is_symlink():
            temporary.unlink()
        temporary.symlink_to(target)
        temporary.rename(self.link)

    def unplug(self) -> None:
        assert self.process is not None
        self.process.kill()
        self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.unplug()


def keep_logs(directory: Path, test: str) -> None:
    """In the rig, the test's logs go where the host can read them afterwards."""
    results = os.environ.get("USB_RIG_RESULTS")
    if not results:
        return
    for log in directory.glob("*.log"):
        target = Path(results) / f"python-{test}-{log.name}"
        target.write_bytes(log.read_bytes())


@pytest.fixture
def daemon(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Daemon]:
    """iapd serving the multi-sensor simulated accessory (its echo, sink, source and telemetry
    protocols): in process, or as a USB gadget in the rig."""
    gadget = None
    if TRANSPORT == "usb":
        udcs = sorted(os.listdir("/sys/class/udc"))
        gadget = Gadget(tmp_path, "multi-sensor", udcs[0])
        server = Daemon(tmp_path, [])
    else:
        server = Daemon(tmp_path, ["--no-usb", "--simulate"])
    server.start()
    yield server
    if server.process is not None:
        server.stop()
    if gadget is not None:
        gadget.stop()
    keep_logs(tmp_path, request.node.name)


@pytest.fixture
def pluggable(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple]:  # type: ignore[type-arg]
    """(iapd, accessory) where the accessory can be unplugged and plugged in again: a
    pseudo-terminal behind a symlink iapd keeps trying, or in the rig a USB gadget."""
    if TRANSPORT == "usb":
        udcs = sorted(os.listdir("/sys/class/udc"))
        accessory: object = Gadget(tmp_path, "multi-sensor", udcs[0])
        server = Daemon(tmp_path, [])
    else:
        accessory = PtyAccessory(tmp_path, "multi-sensor")
        server = Daemon(tmp_path, ["--no-usb", "--serial", str(tmp_path / "accessory-port")])
    server.start()
    yield server, accessory
    if server.process is not None:
        server.stop()
    accessory.stop()  # type: ignore[attr-defined]
    keep_logs(tmp_path, request.node.name)
