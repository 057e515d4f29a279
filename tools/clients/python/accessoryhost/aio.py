"""The asyncio form of the client: the same protocol, sessions and errors as
:mod:`accessoryhost.client`, awaiting instead of blocking.

::

    async with await accessoryhost.aio.connect() as client:
        accessory = await client.wait_for(protocol="com.example.echo", timeout=30)
        async with await client.open(accessory, "com.example.echo") as session:
            await session.write(b"ping"); print(await session.read_exactly(4))

Everything runs on the event loop's thread: the connection's and each session's sockets are
watched with ``loop.add_reader``; nothing blocks the loop (copies into and out of the rings are
memory copies).
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import time
from typing import Any, AsyncIterator, Callable, Dict, List, Optional, Tuple, Union

from . import _protocol
from ._rings import HEAL_SECONDS
from ._book import Book
from .client import describe_criteria, matches
from .errors import BadRequest, DaemonGone, IapdError, ProtocolError, SessionClosed, Timeout
from .records import Accessory, Event
from .session import Buffer, SessionBase, _bytes_view, session_from_reply

__all__ = ["AsyncClient", "AsyncSession", "connect"]


def _deadline(timeout: Optional[float]) -> Optional[float]:
    return None if timeout is None else time.monotonic() + timeout


def _left(deadline: Optional[float]) -> Optional[float]:
    return None if deadline is None else deadline - time.monotonic()


class _Readable:
    """Futures resolved when a descriptor turns readable (one reader callback per descriptor)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, fd: int) -> None:
        self._loop = loop
        self._fd = fd
        self._waiters: List["asyncio.Future[None]"] = []
        self._watching = False

    async def wait(self, timeout: Optional[float]) -> None:
        future: "asyncio.Future[None]" = self._loop.create_future()
        self._waiters.append(future)
        if not self._watching:
            self._loop.add_reader(self._fd, self._fire)
            self._watching = True
        try:
            await asyncio.wait_for(asyncio.shield(future), timeout)
        except asyncio.TimeoutError:
            pass
        finally:
            if future in self._waiters:
                self._waiters.remove(future)
            if not self._waiters and self._watching:
                self._loop.remove_reader(self._fd)
                self._watching = False

    def _fire(self) -> None:
        waiters, self._waiters = self._waiters, []
        for future in waiters:
            if not future.done():
                future.set_result(None)
        if self._watching:
            self._loop.remove_reader(self._fd)
            self._watching = False

    def close(self) -> None:
        if self._watching:
            self._loop.remove_reader(self._fd)
            self._watching = False
        self._fire()


class AsyncSession(SessionBase):
    """:class:`accessoryhost.Session`'s asyncio form; its methods await where those block."""

    def __init__(self, client: Optional["AsyncClient"], accessory: Accessory, protocol: str, session_id: int,
                 wake: socket.socket, memfd: int) -> None:
        wake.setblocking(False)
        super().__init__(client, accessory, protocol, session_id, wake, memfd)
        self._readable = _Readable(asyncio.get_running_loop(), wake.fileno())

    @property
    def bytes_acknowledged(self) -> int:
        """Bytes the accessory's link acknowledged: it has them (not merely iapd)."""
        self._check_open()
        return self._rings.acknowledged

    async def readinto(self, buffer: Union[bytearray, memoryview], timeout: Optional[float] = None) -> int:
        """Reads at least one byte into ``buffer``; 0 at the end of the stream."""
        view = _bytes_view(buffer)
        deadline = _deadline(timeout)
        while len(view):
            self._check_open()
            ended = self._rings.peer_closed
            count = self._rings.take(view)
            if count or ended:
                return count
            await self._block(self._rings.arm_readable, deadline, f"no bytes came from the accessory on {self.protocol} within {timeout} s")
        return 0

    async def read(self, size: int = 65536, timeout: Optional[float] = None) -> bytes:
        """Reads up to ``size`` bytes, at least one; b"" at the end of the stream."""
        buffer = bytearray(size)
        count = await self.readinto(buffer, timeout)
        del buffer[count:]
        return bytes(buffer)

    async def read_exactly(self, size: int, timeout: Optional[float] = None) -> bytes:
        """Reads exactly ``size`` bytes; :class:`SessionClosed` when the stream ends first,
        :class:`Timeout` (with ``partial``, the bytes read) when ``timeout`` passes first."""
        buffer = bytearray(size)
        view = memoryview(buffer)
        deadline = _deadline(timeout)
        done = 0
        while done < size:
            left = _left(deadline)
            try:
                count = await self.readinto(view[done:], None if left is None else max(0.0, left))
            except Timeout as error:
                error.partial = bytes(buffer[:done])
                raise
            if count == 0:
                raise SessionClosed(self._ended_message(f"after {done} of the {size} bytes awaited"))
            done += count
        view.release()
        return bytes(buffer)

    async def write(self, data: Buffer, timeout: Optional[float] = None) -> int:
        """Writes every byte, awaiting room under back-pressure; returns ``len(data)``."""
        view = _bytes_view(data)
        deadline = _deadline(timeout)
        done = 0
        while done < len(view):
            self._check_writable(done, len(view))
            count = self._rings.put(view[done:])
            done += count
            if done < len(view) and count == 0:
                try:
                    await self._block(self._rings.arm_writable, deadline, f"the accessory took no bytes on {self.protocol} "
                                      f"for {timeout} s ({done} of {len(view)} written)")
                except Timeout as error:
                    error.written = done
                    raise
        return done

    async def drain(self, timeout: Optional[float] = None) -> None:
        """Waits until the accessory acknowledged every byte written."""
        target = self._rings.written
        deadline = _deadline(timeout)
        while True:
            self._check_open()
            acknowledged = self._rings.acknowledged
            if acknowledged >= target:
                return
            if self._rings.peer_closed:
                raise SessionClosed(self._ended_message(f"with {acknowledged} of {target} bytes acknowledged"))
            await self._block(lambda: self._rings.arm_acknowledged(target), deadline,
                              f"the accessory acknowledged {acknowledged} of {target} bytes within {timeout} s")

    def close(self) -> None:
        """Ends the session (bytes written before are still delivered)."""
        if self._closed:
            return
        self._closed = True
        self._readable.close()
        self._wake.close()
        self._rings.close()

    async def __aenter__(self) -> "AsyncSession":
        return self

    async def __aexit__(self, *exception: object) -> None:
        self.close()

    async def _block(self, arm: Callable[[], bool], deadline: Optional[float], what: str) -> None:
        if arm() or self._rings.peer_closed:
            return
        left = _left(deadline)
        if left is not None and left <= 0:
            raise Timeout(what)
        await self._readable.wait(HEAL_SECONDS if left is None else min(HEAL_SECONDS, left))
        if not self._closed:
            self._rings.clear_wakes()
            self._rings.heal()


class AsyncClient:
    """:class:`accessoryhost.Client`'s asyncio form. Make it with :func:`connect`."""

    def __init__(self, sock: socket.socket, path: str) -> None:
        #: The socket connected to.
        self.path = path
        #: iapd's name and version.
        self.daemon = "iapd"
        self._socket = sock
        self._loop = asyncio.get_running_loop()
        self._decoder = _protocol.Decoder()
        self._replies: Dict[int, "asyncio.Future[Tuple[Dict[str, Any], List[int]]]"] = {}
        self._changed = asyncio.Condition()
        self._book = Book()
        self._gone: Optional[IapdError] = None
        self._next_id = 1
        self._closed = False
        self._loop.add_reader(sock.fileno(), self._on_readable)

    # ---- receiving (on the loop, from add_reader) ----------------------------------------------

    def _on_readable(self) -> None:
        try:
            data, descriptors = _protocol.receive(self._socket)
        except (BlockingIOError, InterruptedError):
            return
        except IapdError as error:
            self._lose(error)
            return
        except OSError as error:
            self._lose(DaemonGone(f"the connection to iapd failed ({error}); connect again"))
            return
        if not data:
            self._lose(DaemonGone("iapd closed the connection: it stopped or restarted; connect again"))
            return
        try:
            self._decoder.feed(data, descriptors)
            while (decoded := self._decoder.next()) is not None:
                self._dispatch(*decoded)
        except IapdError as error:
            self._lose(error)
            return
        self._loop.create_task(self._notify())

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    def _lose(self, error: IapdError) -> None:
        if self._gone is None:
            self._gone = error
        if not self._closed:
            self._loop.remove_reader(self._socket.fileno())
        for future in self._replies.values():
            if not future.done():
                future.set_exception(type(error)(error.message, error.code))
        self._replies.clear()
        self._loop.create_task(self._notify())

    def _dispatch(self, message: Dict[str, Any], descriptors: List[int]) -> None:
        reply = self._book.receive(message, descriptors)
        if reply is None:
            return
        future = self._replies.pop(reply[0], None)
        if future is None or future.done():
            _protocol.close_all(reply[2])
        else:
            future.set_result((reply[1], reply[2]))

    def _raise_if_unusable(self) -> None:
        if self._closed:
            raise DaemonGone("this connection to iapd is closed; connect again")
        if self._gone is not None:
            raise type(self._gone)(self._gone.message, self._gone.code)

    async def _request(self, request: Dict[str, Any], timeout: Optional[float], what: str) -> Tuple[Dict[str, Any], List[int]]:
        self._raise_if_unusable()
        message_id = self._next_id
        self._next_id = self._next_id % 0xFFFFFFFF + 1
        future: "asyncio.Future[Tuple[Dict[str, Any], List[int]]]" = self._loop.create_future()
        self._replies[message_id] = future
        try:
            await self._loop.sock_sendall(self._socket, _protocol.encode(message_id, request))
        except OSError as error:
            self._replies.pop(message_id, None)
            self._lose(DaemonGone(f"iapd went away ({error}): it stopped or restarted; connect again"))
            self._raise_if_unusable()
        try:
            return await asyncio.wait_for(future, timeout)
        except asyncio.TimeoutError:
            self._replies.pop(message_id, None)
            raise Timeout(f"{what} within {timeout} s; is it stuck? (journalctl -u iapd)") from None

    async def _hello(self, name: str, timeout: Optional[float]) -> None:
        reply, descriptors = await self._request(_protocol.hello(name), timeout, "iapd did not answer hello")
        _protocol.close_all(descriptors)
        self.daemon, records = _protocol.check_welcome(reply)
        for record in records:
            Accessory.from_record(record)  # raises ProtocolError for one it cannot read

    # ---- the API -------------------------------------------------------------------------------

    async def accessories(self, timeout: Optional[float] = 30.0) -> List[Accessory]:
        """The accessories connected now (asked of iapd)."""
        reply, descriptors = await self._request({"list": {}}, timeout, "iapd did not answer list")
        _protocol.close_all(descriptors)
        if "accessories" not in reply:
            raise ProtocolError(f"iapd answered list with {sorted(reply)}; update the library to iapd's release")
        return [Accessory.from_record(record) for record in _protocol.field(reply, "accessories")]

    @property
    def known_accessories(self) -> List[Accessory]:
        """The accessories connected as of the last message from iapd."""
        return self._book.sorted()

    async def wait_for(self, protocol: Optional[str] = None, serial: Optional[str] = None, usb_id: Optional[str] = None,
                       firmware: Optional[str] = None, timeout: Optional[float] = None) -> Accessory:
        """As :meth:`accessoryhost.Client.wait_for`."""
        deadline = _deadline(timeout)
        # What iapd knows now (the events not read yet may be behind it): the list's reply
        # replaces the accessories known where it comes in the stream.
        try:
            await self.accessories(timeout)
        except Timeout:
            pass  # the accessories known from events; the wait goes on
        async with self._changed:
            while True:
                for accessory in self.known_accessories:
                    if matches(accessory, protocol, serial, usb_id, firmware):
                        return accessory
                self._raise_if_unusable()
                left = _left(deadline)
                if left is not None and left <= 0:
                    raise Timeout(f"no {describe_criteria(protocol, serial, usb_id, firmware)[3:]} connected within {timeout} s; "
                                  "is it plugged in and identified (iapctl list)?")
                try:
                    await asyncio.wait_for(self._changed.wait(), left)
                except asyncio.TimeoutError:
                    pass

    async def next_event(self, timeout: Optional[float] = None) -> Event:
        """The next event, awaiting it; raises :class:`Timeout`."""
        deadline = _deadline(timeout)
        async with self._changed:
            while not self._book.events:
                self._raise_if_unusable()
                left = _left(deadline)
                if left is not None and left <= 0:
                    raise Timeout(f"no accessory connected or disconnected within {timeout} s")
                try:
                    await asyncio.wait_for(self._changed.wait(), left)
                except asyncio.TimeoutError:
                    pass
            return self._book.events.popleft()

    async def events(self, timeout: Optional[float] = None) -> AsyncIterator[Event]:
        """Every event as it comes; ends after ``timeout`` seconds in all (never, with None)."""
        deadline = _deadline(timeout)
        while True:
            left = _left(deadline)
            if left is not None and left <= 0:
                return
            try:
                yield await self.next_event(left)
            except Timeout:
                return

    def disconnect_reason(self, accessory_id: int) -> Optional[str]:
        """Why the accessory with that id went away, once iapd said so."""
        return self._book.reasons.get(accessory_id)

    async def ping(self, timeout: Optional[float] = 30.0) -> float:
        """A round trip through iapd; returns its seconds."""
        start = time.monotonic()
        _, descriptors = await self._request({"ping": {}}, timeout, "iapd did not answer ping")
        _protocol.close_all(descriptors)
        return time.monotonic() - start

    async def stats(self, timeout: Optional[float] = 30.0) -> Dict[str, Any]:
        """iapd's counters and gauges."""
        try:
            reply, descriptors = await self._request({"stats": {}}, timeout, "iapd did not answer stats")
        except BadRequest as error:
            raise BadRequest(f"this iapd is too old to answer stats ({error}); update iapd") from None
        _protocol.close_all(descriptors)
        statistics: Dict[str, Any] = _protocol.field(reply, "statistics")
        return statistics

    async def open(self, accessory: Union[Accessory, int], protocol: str, timeout: Optional[float] = 60.0) -> AsyncSession:
        """As :meth:`accessoryhost.Client.open`."""
        accessory_id = accessory.id if isinstance(accessory, Accessory) else int(accessory)
        record = accessory if isinstance(accessory, Accessory) else self._book.accessories.get(accessory_id)
        reply, descriptors = await self._request({"open": {"accessory": accessory_id, "protocolString": protocol}}, timeout,
                                                 f"iapd did not answer the open of {protocol}")
        return session_from_reply(AsyncSession, self, record, protocol, reply, descriptors)

    @property
    def dropped_events(self) -> int:
        """Events dropped because more than MAXIMUM_QUEUED_EVENTS waited unread."""
        return self._book.dropped_events

    def fileno(self) -> int:
        """The connection's socket."""
        return self._socket.fileno()

    def close(self) -> None:
        """Closes the connection (sessions stay open until closed themselves)."""
        if self._closed:
            return
        if self._gone is None:
            self._loop.remove_reader(self._socket.fileno())
        self._closed = True
        for future in self._replies.values():
            if not future.done():
                future.cancel()
        self._replies.clear()
        self._socket.close()
        self._decoder.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exception: object) -> None:
        self.close()


async def connect(path: Optional[str] = None, *, name: Optional[str] = None, timeout: Optional[float] = 30.0) -> AsyncClient:
    """Connects to iapd and says hello: :class:`AsyncClient` (errors as :func:`accessoryhost.connect`)."""
    where = _protocol.socket_path(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    sock.setblocking(False)
    try:
        await asyncio.get_running_loop().sock_connect(sock, where)
    except OSError as error:
        sock.close()
        raise _protocol.connect_error(where, error) from None
    client = AsyncClient(sock, where)
    try:
        await client._hello(name if name is not None else f"python-asyncio {os.path.basename(sys.argv[0]) if sys.argv else ''}".strip(), timeout)
    except BaseException:
        client.close()
        raise
    return client
