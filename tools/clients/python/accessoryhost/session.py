"""A session: one protocol's bidirectional byte stream with an accessory, through iapd's shared
rings (docs/DAEMON.md). :class:`Session` blocks (with timeouts); its ``*_nowait`` methods and
:meth:`Session.fileno` serve ``selectors``; :mod:`accessoryhost.aio` has the asyncio form.
"""

from __future__ import annotations

import os
import select
import socket
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Type, TypeVar, Union

from ._rings import HEAL_SECONDS, Rings
from . import _protocol
from .errors import ProtocolError, SessionClosed, Timeout, failure_from_reply
from .records import Accessory

if TYPE_CHECKING:
    from typing import Protocol

    from .client import Client

    class _Reasons(Protocol):
        def disconnect_reason(self, accessory_id: int) -> Optional[str]: ...

__all__ = ["Session", "SessionBase", "Buffer", "session_from_reply"]

#: What write accepts: anything with the buffer protocol, of bytes (bytes, bytearray, memoryview, mmap…).
Buffer = Union[bytes, bytearray, memoryview]

_READ_SIZE = 65536


def _bytes_view(data: object) -> memoryview:
    view = memoryview(data)  # type: ignore[arg-type]
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


class SessionBase:
    """What the blocking and the asyncio session share: the accessory, the protocol, the
    session's rings and wake socket, its state and counters."""

    def __init__(self, client: Optional["_Reasons"], accessory: Accessory, protocol: str, session_id: int,
                 wake: socket.socket, memfd: int) -> None:
        #: The accessory the session is with.
        self.accessory = accessory
        #: The protocol string.
        self.protocol = protocol
        #: iapd's number for the session.
        self.id = session_id
        self._client = client
        self._wake = wake
        self._rings = Rings(memfd, wake)
        self._closed = False

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    @property
    def ended(self) -> bool:
        """Whether the accessory's side ended (it closed the session or went away); bytes it
        sent before may still wait to be read."""
        return self._rings.peer_closed

    @property
    def bytes_written(self) -> int:
        """Bytes written so far (in the ring or beyond it)."""
        return self._rings.written

    @property
    def bytes_read(self) -> int:
        """Bytes read so far."""
        return self._rings.taken

    def fileno(self) -> int:
        """The session's wake socket, for ``selectors``/``select``: it turns readable when
        bytes came, room freed, acknowledgements came or the session ended, after a
        ``read_nowait`` that found nothing or a ``write_nowait`` that did not fit everything
        (those ask iapd for the wake-up). Call them again when it is readable."""
        return self._wake.fileno()

    def _check_open(self) -> None:
        if self._closed:
            raise SessionClosed(f"the session for '{self.protocol}' is closed (by this program); open it again")

    def _check_writable(self, done: int, total: int) -> None:
        self._check_open()
        if self._rings.peer_closed:
            raise SessionClosed(self._ended_message(f"{done} of {total} bytes written by this write, "
                                                    f"{self._rings.acknowledged} acknowledged in all"))

    def _ended_message(self, detail: str) -> str:
        reason = self._client.disconnect_reason(self.accessory.id) if self._client is not None else None
        why = f"the accessory disconnected: {reason}" if reason else "the accessory closed it or went away"
        return f"the session for '{self.protocol}' ended ({why}), {detail}"


_S = TypeVar("_S", bound=SessionBase)


def session_from_reply(kind: Type[_S], client: Any, record: Optional[Accessory], protocol: str,
                       reply: Dict[str, Any], descriptors: List[int]) -> _S:
    """The session iapd's reply to an open made (of ``kind``), or the error it reported; the
    descriptors are closed or owned by the session whatever happens."""
    if "failure" in reply:
        _protocol.close_all(descriptors)
        available = list(record.protocol_strings) if record is not None else None
        raise failure_from_reply(_protocol.field(reply, "failure"), protocol, available)
    if "opened" not in reply or len(descriptors) != 2 or record is None:
        _protocol.close_all(descriptors)
        raise ProtocolError(f"iapd answered the open with {sorted(reply)} and {len(descriptors)} descriptors "
                            "(an opened reply, 2 descriptors and an accessory it announced expected); "
                            "update the library to iapd's release")
    wake = socket.socket(fileno=descriptors[0])
    try:
        return kind(client, record, protocol, int(_protocol.field(reply, "opened", None).get("session", 0)), wake, descriptors[1])
    except BaseException:
        wake.close()
        raise
    finally:
        os.close(descriptors[1])


class Session(SessionBase):
    """An open session (an EASession): bytes to the accessory with :meth:`write`, from it with
    :meth:`read`; :meth:`drain` waits until the accessory acknowledged every byte written.

    Closing it (or leaving its ``with`` block, or the process ending) ends the session; what was
    written before is still delivered. One thread may read while another writes; two readers
    (or two writers) take turns. Timeouts are in seconds (None waits for ever, 0 not at all)
    and raise :class:`~accessoryhost.errors.Timeout`.
    """

    def __init__(self, client: Optional["Client"], accessory: Accessory, protocol: str, session_id: int,
                 wake: socket.socket, memfd: int) -> None:
        super().__init__(client, accessory, protocol, session_id, wake, memfd)
        self._reading = threading.Lock()
        self._writing = threading.Lock()
        self._wait = threading.Condition()
        self._polling = False
        self._poll = select.poll()
        self._poll.register(wake.fileno(), select.POLLIN)

    @property
    def bytes_acknowledged(self) -> int:
        """Bytes the accessory's link acknowledged: it has them (not merely iapd)."""
        with self._writing:
            self._check_open()
            return self._rings.acknowledged

    # ---- reading ----------------------------------------------------------------------------

    def readinto(self, buffer: Union[bytearray, memoryview], timeout: Optional[float] = None) -> int:
        """Reads at least one byte into ``buffer`` (waiting for it); returns how many, 0 at the
        end of the stream (the session ended and every byte was read)."""
        view = _bytes_view(buffer)
        if len(view) == 0:
            return 0
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._reading:
            while True:
                self._check_open()
                ended = self._rings.peer_closed
                count = self._rings.take(view)
                if count or ended:
                    return count
                self._block(self._rings.arm_readable, deadline, f"no bytes came from the accessory on {self.protocol} "
                                                                f"within {timeout} s")

    def read(self, size: int = _READ_SIZE, timeout: Optional[float] = None) -> bytes:
        """Reads up to ``size`` bytes, at least one (waiting for it); b"" at the end of the stream."""
        buffer = bytearray(size)
        count = self.readinto(buffer, timeout)
        del buffer[count:]
        return bytes(buffer)

    def read_exactly(self, size: int, timeout: Optional[float] = None) -> bytes:
        """Reads exactly ``size`` bytes; raises :class:`SessionClosed` when the stream ends first,
        :class:`Timeout` when ``timeout`` passes first (its ``partial`` holds the bytes read)."""
        buffer = bytearray(size)
        view = memoryview(buffer)
        deadline = None if timeout is None else time.monotonic() + timeout
        done = 0
        while done < size:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                count = self.readinto(view[done:], left)
            except Timeout as error:
                error.partial = bytes(buffer[:done])
                raise
            if count == 0:
                raise SessionClosed(self._ended_message(f"after {done} of the {size} bytes awaited"))
            done += count
        view.release()
        return bytes(buffer)

    def read_nowait(self, size: int = _READ_SIZE) -> Optional[bytes]:
        """The bytes waiting now (up to ``size``), b"" at the end of the stream, or None when
        none wait (:meth:`fileno` then turns readable when some come)."""
        buffer = bytearray(size)
        with self._reading:
            self._check_open()
            self._rings.clear_wakes()
            ended = self._rings.peer_closed
            count = self._rings.take(memoryview(buffer))
            if count == 0 and not ended:
                if not self._rings.arm_readable():
                    return None
                count = self._rings.take(memoryview(buffer))
        del buffer[count:]
        return bytes(buffer)

    # ---- writing ----------------------------------------------------------------------------

    def write(self, data: Buffer, timeout: Optional[float] = None) -> int:
        """Writes every byte of ``data``, waiting for room while the accessory is behind
        (back-pressure); returns ``len(data)``. Raises :class:`SessionClosed` when the session
        ended, :class:`Timeout` when ``timeout`` passed first (``error.written`` says how many
        bytes went)."""
        view = _bytes_view(data)
        deadline = None if timeout is None else time.monotonic() + timeout
        done = 0
        with self._writing:
            while done < len(view):
                self._check_writable(done, len(view))
                count = self._rings.put(view[done:])
                done += count
                if done < len(view) and count == 0:
                    try:
                        self._block(self._rings.arm_writable, deadline,
                                    f"the accessory took no bytes on {self.protocol} for {timeout} s "
                                    f"({done} of {len(view)} written)")
                    except Timeout as error:
                        error.written = done
                        raise
        return done

    def write_nowait(self, data: Buffer) -> int:
        """Writes what fits now and returns how many bytes that was (maybe 0); when not all fit,
        :meth:`fileno` turns readable as room frees."""
        view = _bytes_view(data)
        with self._writing:
            self._check_writable(0, len(view))
            self._rings.clear_wakes()
            count = self._rings.put(view)
            if count < len(view) and self._rings.arm_writable():
                count += self._rings.put(view[count:])
        return count

    def drain(self, timeout: Optional[float] = None) -> None:
        """Waits until the accessory acknowledged every byte written (its link has them); other
        writers wait meanwhile. Raises :class:`SessionClosed` when the session ends first, with
        the count acknowledged."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._writing:  # the bytes written before this call; close() waits for it
            target = self._rings.written
            while True:
                self._check_open()
                acknowledged = self._rings.acknowledged
                if acknowledged >= target:
                    return
                if self._rings.peer_closed:
                    raise SessionClosed(self._ended_message(f"with {acknowledged} of {target} bytes acknowledged"))
                self._block(lambda: self._rings.arm_acknowledged(target), deadline,
                            f"the accessory acknowledged {self._rings.acknowledged} of {target} bytes on {self.protocol} "
                            f"within {timeout} s")

    # ---- ending -----------------------------------------------------------------------------

    def close(self) -> None:
        """Ends the session (bytes written before are still delivered). Closing twice is allowed."""
        if self._closed:
            return
        self._closed = True
        with self._wait:
            self._wait.notify_all()
        try:
            self._poll.unregister(self._wake.fileno())
        except (KeyError, ValueError, OSError):
            pass
        self._wake.close()
        with self._reading, self._writing:
            self._rings.close()

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exception: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            if not self._closed:
                self._wake.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        state = "closed" if self._closed else "ended" if self._rings.peer_closed else "open"
        return f"<Session {self.protocol!r} on {self.accessory.name!r} ({self.accessory.serial_number}) {state}>"

    # ---- waiting ----------------------------------------------------------------------------

    def _block(self, arm: Callable[[], bool], deadline: Optional[float], what: str) -> None:
        """Returns once the condition ``arm`` asks iapd to wake for may hold (the caller looks
        again), or the session ended; raises :class:`Timeout` at the deadline. One thread polls
        the wake socket at a time; the others wait on it."""
        if arm() or self._rings.peer_closed:
            return
        timeout = HEAL_SECONDS
        if deadline is not None:
            timeout = min(timeout, deadline - time.monotonic())
            if timeout <= 0:
                raise Timeout(what)
        with self._wait:
            if self._polling:
                self._wait.wait(timeout)
                return
            self._polling = True
        try:
            if not self._closed:
                self._poll.poll(timeout * 1000)
                self._rings.clear_wakes()
                self._rings.heal()
        finally:
            with self._wait:
                self._polling = False
                self._wait.notify_all()
