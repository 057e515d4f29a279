"""The connection to iapd: accessories, events, and sessions (docs/DAEMON.md, protocol 3)."""

from __future__ import annotations

import os
import select
import socket
import sys
import threading
import time
from typing import Any, Dict, Set, Iterator, List, Optional, Tuple, Union

from . import _protocol
from .errors import BadRequest, DaemonGone, IapdError, ProtocolError, Timeout
from ._book import MAXIMUM_QUEUED_EVENTS, Book
from .records import Accessory, Event
from .session import Session, session_from_reply

__all__ = ["Client", "connect", "matches", "MAXIMUM_QUEUED_EVENTS"]



def matches(accessory: Accessory, protocol: Optional[str], serial: Optional[str], usb_id: Optional[str],
            firmware: Optional[str]) -> bool:
    """Whether the accessory is one ``wait_for`` with these criteria waits for (None matches anything)."""
    if protocol is not None and protocol not in accessory.protocol_strings:
        return False
    if serial is not None and accessory.serial_number != serial:
        return False
    if firmware is not None and accessory.firmware_revision != firmware:
        return False
    if usb_id is not None:
        device = accessory.usb_device
        if device is None or device.usb_id != usb_id.lower():
            return False
    return True


def describe_criteria(protocol: Optional[str], serial: Optional[str], usb_id: Optional[str], firmware: Optional[str]) -> str:
    """``wait_for``'s criteria in words."""
    parts = [f"speaking {protocol}" if protocol else "", f"with serial number {serial}" if serial else "",
             f"with USB id {usb_id}" if usb_id else "", f"with firmware {firmware}" if firmware else ""]
    return "an accessory " + " ".join(part for part in parts if part) if any(parts) else "an accessory"


class Client:
    """A connection to iapd.

    >>> with accessoryhost.connect() as client:
    ...     accessory = client.wait_for(protocol="com.example.echo", timeout=30)
    ...     with client.open(accessory, "com.example.echo") as session:
    ...         session.write(b"hello"); print(session.read(5))

    ``path`` is iapd's socket (default ``$IAPD_SOCKET``, else /run/iapd/iapd.sock). A client
    may be shared by threads. When iapd goes away (stops, restarts), every call raises
    :class:`~accessoryhost.errors.DaemonGone`: connect again.
    """

    def __init__(self, path: Optional[str] = None, *, name: Optional[str] = None, timeout: Optional[float] = 30.0) -> None:
        #: The socket connected to.
        self.path = _protocol.socket_path(path)
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            self._socket.connect(self.path)
        except OSError as error:
            self._socket.close()
            raise _protocol.connect_error(self.path, error) from None
        self._decoder = _protocol.Decoder()
        self._state = threading.Condition()
        self._sending = threading.Lock()
        self._polling = False
        self._replies: Dict[int, Tuple[Dict[str, Any], List[int]]] = {}
        self._abandoned: Set[int] = set()
        self._book = Book()
        self._gone: Optional[IapdError] = None
        self._next_id = 1
        self._closed = False
        client_name = name if name is not None else f"python {os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ''}".strip()
        try:
            reply, descriptors = self._request(_protocol.hello(client_name), timeout, "iapd did not answer hello")
            _protocol.close_all(descriptors)
            #: iapd's name and version (``"iapd 0.3.0"``).
            self.daemon: str
            self.daemon, records = _protocol.check_welcome(reply)
            for record in records:
                Accessory.from_record(record)  # raises ProtocolError for one it cannot read
        except BaseException:
            self.close()
            raise

    # ---- what iapd knows ---------------------------------------------------------------------

    def accessories(self, timeout: Optional[float] = 30.0) -> List[Accessory]:
        """The accessories connected now (asked of iapd)."""
        reply, descriptors = self._request({"list": {}}, timeout, "iapd did not answer list")
        _protocol.close_all(descriptors)
        if "accessories" not in reply:
            raise ProtocolError(f"iapd answered list with {sorted(reply)}; update the library to iapd's release")
        return [Accessory.from_record(record) for record in _protocol.field(reply, "accessories")]

    def wait_for(self, protocol: Optional[str] = None, serial: Optional[str] = None, usb_id: Optional[str] = None,
                 firmware: Optional[str] = None, timeout: Optional[float] = None) -> Accessory:
        """The first accessory connected now, or once one connects, that matches every
        criterion given: speaks ``protocol``, has serial number ``serial``, is the USB device
        ``usb_id`` (``"vvvv:pppp"``), runs ``firmware``. Raises :class:`Timeout` after ``timeout``
        seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        # What iapd knows now (the events this client has not read yet may be behind it): the
        # list's reply replaces the accessories known where it comes in the stream. A list not
        # answered in time leaves the accessories known from events, and the wait goes on.
        try:
            self.accessories(timeout)
        except Timeout:
            pass
        with self._state:
            while True:
                for accessory in self._book.sorted():
                    if matches(accessory, protocol, serial, usb_id, firmware):
                        return accessory
                if deadline is not None and time.monotonic() >= deadline:
                    seen = ", ".join(f"{record.name} ({record.serial_number}, firmware {record.firmware_revision}, "
                                     f"protocols {', '.join(record.protocol_strings) or 'none'})"
                                     for record in self._book.sorted()) or "none"
                    raise Timeout(f"no {describe_criteria(protocol, serial, usb_id, firmware)[3:]} connected within "
                                  f"{timeout} s (connected: {seen}); is it plugged in and identified (iapctl list)?")
                self._pump(deadline)

    @property
    def known_accessories(self) -> List[Accessory]:
        """The accessories connected as of the last message from iapd (no request)."""
        with self._state:
            return self._book.sorted()

    def disconnect_reason(self, accessory_id: int, timeout: float = 0.0) -> Optional[str]:
        """Why the accessory with that id went away, once iapd said so; None when it has not
        said so within ``timeout`` seconds (a session may end a moment before the event that
        says why arrives)."""
        deadline = time.monotonic() + timeout
        with self._state:
            while accessory_id not in self._book.reasons and not self._closed and self._gone is None:
                if self._polling and time.monotonic() >= deadline:
                    break
                try:
                    self._pump(deadline)
                except IapdError:
                    break
                if time.monotonic() >= deadline:
                    break
            return self._book.reasons.get(accessory_id)

    def next_event(self, timeout: Optional[float] = None) -> Event:
        """The next event (connected, disconnected, …), waiting for it; raises :class:`Timeout`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._state:
            while not self._book.events:
                if deadline is not None and time.monotonic() >= deadline:
                    raise Timeout(f"no accessory connected or disconnected within {timeout} s")
                self._pump(deadline)
            return self._book.events.popleft()

    def events(self, timeout: Optional[float] = None) -> Iterator[Event]:
        """Every event from now (and those not yet read), as they come: :class:`Connected`,
        :class:`Disconnected`, :class:`AppLaunchRequested`, :class:`TransportFailed`. The
        iteration ends after ``timeout`` seconds in all (never, with None)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return
            try:
                yield self.next_event(left)
            except Timeout:
                return

    def ping(self, timeout: Optional[float] = 30.0) -> float:
        """A round trip through iapd; returns its seconds."""
        start = time.monotonic()
        _, descriptors = self._request({"ping": {}}, timeout, "iapd did not answer ping")
        _protocol.close_all(descriptors)
        return time.monotonic() - start

    def stats(self, timeout: Optional[float] = 30.0) -> Dict[str, Any]:
        """iapd's counters and gauges (the figures of ``iapctl stats --json``)."""
        try:
            reply, descriptors = self._request({"stats": {}}, timeout, "iapd did not answer stats")
        except BadRequest as error:
            raise BadRequest(f"this iapd is too old to answer stats ({error}); update iapd") from None
        _protocol.close_all(descriptors)
        if "statistics" not in reply:
            raise ProtocolError(f"iapd answered stats with {sorted(reply)}; update the library to iapd's release")
        statistics: Dict[str, Any] = _protocol.field(reply, "statistics")
        return statistics

    # ---- sessions -----------------------------------------------------------------------------

    def open(self, accessory: Union[Accessory, int], protocol: str, timeout: Optional[float] = 60.0) -> Session:
        """Opens the session for ``protocol`` on the accessory (one per protocol per accessory,
        system-wide). Raises :class:`UnsupportedProtocol`, :class:`ProtocolInUse` (with the
        holder), :class:`NoSuchAccessory` (it went away), :class:`SessionRefused`,
        :class:`TooManySessions`, :class:`Timeout`."""
        record = accessory if isinstance(accessory, Accessory) else self._known(accessory)
        accessory_id = accessory.id if isinstance(accessory, Accessory) else int(accessory)
        reply, descriptors = self._request({"open": {"accessory": accessory_id, "protocolString": protocol}}, timeout,
                                           f"iapd did not answer the open of {protocol}")
        if record is None:
            record = self._known(accessory_id)
        return session_from_reply(Session, self, record, protocol, reply, descriptors)

    def _known(self, accessory_id: int) -> Optional[Accessory]:
        with self._state:
            return self._book.accessories.get(accessory_id)

    # ---- the connection ---------------------------------------------------------------------

    @property
    def dropped_events(self) -> int:
        """Events dropped because more than :data:`MAXIMUM_QUEUED_EVENTS` waited unread."""
        return self._book.dropped_events

    def fileno(self) -> int:
        """The connection's socket (readable when iapd sent something)."""
        return self._socket.fileno()

    def close(self) -> None:
        """Closes the connection. Sessions opened on it stay open until closed themselves."""
        with self._state:
            if self._closed:
                return
            self._closed = True
            self._state.notify_all()
        self._socket.close()
        self._decoder.close()
        for _, descriptors in self._replies.values():
            _protocol.close_all(descriptors)
        self._replies.clear()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exception: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Client {self.path} {'closed' if self._closed else getattr(self, 'daemon', 'connecting')}>"

    def _request(self, request: Dict[str, Any], timeout: Optional[float], what: str) -> Tuple[Dict[str, Any], List[int]]:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._state:
            self._raise_if_unusable()
            message_id = self._next_id
            self._next_id = self._next_id % 0xFFFFFFFF + 1
        frame = _protocol.encode(message_id, request)
        with self._sending:
            try:
                self._socket.sendall(frame)
            except OSError as error:
                self._lost(DaemonGone(f"iapd went away ({error}): it stopped or restarted; connect again"))
                raise self._gone_error() from None
        with self._state:
            while message_id not in self._replies:
                if deadline is not None and time.monotonic() >= deadline:
                    # A reply that comes later is dropped, its descriptors closed (a session
                    # opened after all is closed at once).
                    self._abandoned.add(message_id)
                    raise Timeout(f"{what} within {timeout} s; is it stuck? (journalctl -u iapd)")
                self._pump(deadline)
            return self._replies.pop(message_id)

    def _raise_if_unusable(self) -> None:
        if self._closed:
            raise DaemonGone("this connection to iapd is closed; connect again")
        if self._gone is not None:
            raise self._gone_error()

    def _gone_error(self) -> IapdError:
        gone = self._gone or DaemonGone("iapd went away; connect again")
        return type(gone)(gone.message, gone.code)

    def _lost(self, error: IapdError) -> None:
        with self._state:
            if self._gone is None:
                self._gone = error
            self._state.notify_all()

    def _pump(self, deadline: Optional[float]) -> None:
        """With the state lock held: reads what iapd sent (one thread at a time; the others wait
        for it) until the deadline or a message; returns so the caller looks again."""
        self._raise_if_unusable()
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        if self._polling:
            self._state.wait(timeout)
            return
        self._polling = True
        self._state.release()
        data: bytes = b""
        descriptors: List[int] = []
        failure: Optional[IapdError] = None
        try:
            ready, _, _ = select.select([self._socket], [], [], timeout)
            if ready:
                data, descriptors = _protocol.receive(self._socket)
                if not data:
                    failure = DaemonGone("iapd closed the connection: it stopped or restarted; connect again")
        except IapdError as error:
            failure = error
        except (OSError, ValueError) as error:
            failure = DaemonGone(f"the connection to iapd failed ({error}); connect again")
        finally:
            self._state.acquire()
            self._polling = False
            self._state.notify_all()
        if failure is None and data:
            try:
                self._decoder.feed(data, descriptors)
                while (decoded := self._decoder.next()) is not None:
                    self._dispatch(*decoded)
            except IapdError as error:
                failure = error
        if failure is not None:
            if self._gone is None:
                self._gone = failure
            raise self._gone_error()

    def _dispatch(self, message: Dict[str, Any], descriptors: List[int]) -> None:
        reply = self._book.receive(message, descriptors)
        if reply is None:
            return
        if reply[0] in self._abandoned:
            self._abandoned.discard(reply[0])
            _protocol.close_all(reply[2])
        else:
            self._replies[reply[0]] = (reply[1], reply[2])

def connect(path: Optional[str] = None, *, name: Optional[str] = None, timeout: Optional[float] = 30.0) -> Client:
    """Connects to iapd (``path``, else ``$IAPD_SOCKET``, else /run/iapd/iapd.sock) and says
    hello: :class:`Client`. Raises :class:`DaemonNotRunning`, :class:`PermissionDenied`,
    :class:`VersionMismatch` (both versions named)."""
    return Client(path, name=name, timeout=timeout)
