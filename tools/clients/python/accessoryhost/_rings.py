"""A session's two shared byte rings (docs/DAEMON.md, "Session rings"), the client's side.

The memfd iapd sends holds a header page and two rings: ring 0 carries the client's bytes to
the accessory, ring 1 the accessory's to the client. Each counter is a native-endian 64-bit
word on a cache line of its own. Here every word is read and written whole, through a
memoryview cast to unsigned 64-bit words (one aligned 8-byte load or store each; never
``struct`` with an explicit byte order, whose reads go byte by byte and could tear).

Ordering. iapd moves the words with sequentially consistent atomics; Python has none, so the
points that need a full barrier (data before the counter that publishes it; a waiting flag
stored before the other side's counter is read again) go through :func:`_fence`: an
uncontended lock taken and given back. POSIX makes lock operations synchronize memory, and on
x86-64 CPython's lock is a locked instruction, a full barrier. Where one swap of a waiting word
races with the other side's store, the byte written on the socket afterwards makes the other
side look again; and every blocking wait here wakes at least every :data:`HEAL_SECONDS` to
look at the counters and wake a side that waits with work to do, so a wake-up lost on a weaker
machine costs time, never a hang.

Nothing iapd writes is trusted: its counters are checked (ring 0's head neither moves back nor
passes this side's tail; ring 1's tail neither moves back nor runs more than a ring ahead of
this side's head) and every copy is bounded by the mapping. A check reads a counter, compares
it with the last value seen and keeps the new one, and any thread may make it (the one that
polls the wake socket heals for the others), so each check holds the rings' counter lock: a
value one thread read before another thread's fresher one is never compared with it.
"""

from __future__ import annotations

import mmap
import os
import socket
import threading

from .errors import ProtocolError

MAGIC = 0x31474E4952504149  # "IAPRING1"
LAYOUT_VERSION = 1
HEADER = 4096
#: The largest ring the layout allows (docs/DAEMON.md).
MAXIMUM_CAPACITY = 64 * 1024 * 1024
#: A blocked wait looks at the rings at least this often (a lost wake-up costs at most this).
HEAL_SECONDS = 0.1

# Word indices (byte offset / 8).
_CAPACITY = 2
_TAIL = (8, 8 + 32)          # 64 + 256 r
_HEAD = (16, 16 + 32)        # 128 + 256 r
_CONSUMER_WAITING = (24, 24 + 32)
_PRODUCER_WAITING = (32, 32 + 32)
_ACKNOWLEDGED = 72           # 576
_CLIENT_WAITS_ACKS = 80      # 640

_barrier = threading.Lock()


def _fence() -> None:
    """A full memory barrier (see the module's doc)."""
    _barrier.acquire()
    _barrier.release()


class Rings:
    """The mapped rings of one session and the wake socket; not thread-safe by itself (a
    session serializes its readers and its writers)."""

    def __init__(self, memfd: int, wake: socket.socket) -> None:
        size = os.fstat(memfd).st_size
        if size < HEADER + 2 * 4096:
            raise ProtocolError(f"the session's shared memory is {size} bytes, too small for its rings; "
                                "update the library to iapd's release")
        self._map = mmap.mmap(memfd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        view = memoryview(self._map)
        words = view[:HEADER].cast("Q")
        magic, version, capacity = words[0], words[1], words[_CAPACITY]
        if magic != MAGIC or version != LAYOUT_VERSION:
            words.release()
            view.release()
            self._map.close()
            raise ProtocolError(f"the session's shared memory has layout {version} (magic {magic:#x}); this library reads "
                                f"layout {LAYOUT_VERSION}: update it to iapd's release")
        if capacity < 4096 or capacity > MAXIMUM_CAPACITY or capacity & (capacity - 1) or size < HEADER + 2 * capacity:
            words.release()
            view.release()
            self._map.close()
            raise ProtocolError(f"the session's rings claim {capacity} bytes each in {size} bytes of memory; "
                                "iapd or the memory is broken")
        self.capacity = capacity
        self._mask = capacity - 1
        self._view = view
        self._words = words
        self._out = view[HEADER:HEADER + capacity]
        self._in = view[HEADER + capacity:HEADER + 2 * capacity]
        self._wake = wake
        # This side's own counters, kept privately and only published.
        self.written = int(words[_TAIL[0]])
        self.taken = int(words[_HEAD[1]])
        self._peer_head = int(words[_HEAD[0]])
        self._peer_tail = int(words[_TAIL[1]])
        self._acknowledged = int(words[_ACKNOWLEDGED])
        #: iapd closed its end of the wake socket: the session ended (its last bytes are in ring 1).
        self.peer_closed = False
        # Serializes each read-compare-keep of a counter iapd writes (see the module's doc).
        self._counters = threading.Lock()

    # ---- counters iapd writes, checked --------------------------------------------------

    def _head_out(self) -> int:
        with self._counters:
            # The head is read before ``written``: iapd's head never passes the published tail,
            # which ``written`` reaches first.
            head = int(self._words[_HEAD[0]])
            if head < self._peer_head or head > self.written:
                raise ProtocolError(f"iapd's head of the outgoing ring moved from {self._peer_head} to {head} "
                                    f"with {self.written} written: the session's shared ring is broken")
            self._peer_head = head
            return head

    def _tail_in(self) -> int:
        with self._counters:
            # The tail is read before ``taken``: iapd fills at most a ring past the published
            # head, which ``taken`` reaches first.
            tail = int(self._words[_TAIL[1]])
            if tail < self._peer_tail or tail - self.taken > self.capacity:
                raise ProtocolError(f"iapd's tail of the incoming ring moved from {self._peer_tail} to {tail} "
                                    f"with {self.taken} taken: the session's shared ring is broken")
            self._peer_tail = tail
            return tail

    @property
    def acknowledged(self) -> int:
        """Bytes of this side's the accessory acknowledged (checked: never back, never past written)."""
        with self._counters:
            value = int(self._words[_ACKNOWLEDGED])
            if value < self._acknowledged or value > self.written:
                raise ProtocolError(f"iapd's acknowledged count moved from {self._acknowledged} to {value} "
                                    f"with {self.written} written: the session's shared ring is broken")
            self._acknowledged = value
            return value

    # ---- moving bytes ---------------------------------------------------------------------

    def room(self) -> int:
        """Bytes that fit in the outgoing ring now."""
        return self.capacity - (self.written - self._head_out())

    def available(self) -> int:
        """Bytes waiting in the incoming ring now."""
        return self._tail_in() - self.taken

    def put(self, data: memoryview) -> int:
        """Copies as much of ``data`` as fits into the outgoing ring and publishes it; wakes
        iapd when it waits. Returns the bytes taken (0 when the ring is full)."""
        count = min(len(data), self.room())
        if count == 0:
            return 0
        start = self.written & self._mask
        first = min(count, self.capacity - start)
        self._out[start:start + first] = data[:first]
        if first < count:
            self._out[:count - first] = data[first:count]
        _fence()
        self.written += count
        self._words[_TAIL[0]] = self.written
        _fence()
        if self._words[_CONSUMER_WAITING[0]]:
            self._words[_CONSUMER_WAITING[0]] = 0
            self.wake()
        return count

    def take(self, into: memoryview) -> int:
        """Copies as many waiting bytes as fit into ``into`` and frees their room; wakes iapd
        when it waits for room and a quarter of the ring is free. Returns the bytes copied."""
        count = min(len(into), self.available())
        if count == 0:
            return 0
        start = self.taken & self._mask
        first = min(count, self.capacity - start)
        into[:first] = self._in[start:start + first]
        if first < count:
            into[first:count] = self._in[:count - first]
        _fence()
        self.taken += count
        self._words[_HEAD[1]] = self.taken
        _fence()
        self._wake_producer_if_room()
        return count

    def _wake_producer_if_room(self) -> None:
        if self._words[_PRODUCER_WAITING[1]] and self.capacity - (self._peer_tail - self.taken) >= self.capacity // 4:
            self._words[_PRODUCER_WAITING[1]] = 0
            self.wake()

    # ---- waiting --------------------------------------------------------------------------

    def arm_readable(self) -> bool:
        """Asks iapd for a wake-up when bytes come; True when some came meanwhile (do not sleep)."""
        self._words[_CONSUMER_WAITING[1]] = 1
        _fence()
        return self.available() > 0

    def arm_writable(self) -> bool:
        """Asks iapd for a wake-up when room frees; True when there is room already."""
        self._words[_PRODUCER_WAITING[0]] = 1
        _fence()
        return self.room() > 0

    def arm_acknowledged(self, target: int) -> bool:
        """Asks iapd for a wake-up as acknowledgements come; True when ``target`` bytes are
        acknowledged already."""
        self._words[_CLIENT_WAITS_ACKS] = 1
        _fence()
        return self.acknowledged >= target

    def heal(self) -> None:
        """Wakes iapd where it waits with work to do (after a wake-up that may have been lost)."""
        _fence()
        if self._words[_CONSUMER_WAITING[0]] and self.written > self._head_out():
            self._words[_CONSUMER_WAITING[0]] = 0
            self.wake()
        self._tail_in()
        self._wake_producer_if_room()

    def wake(self) -> None:
        """Writes one byte on the wake socket (a full socket means iapd has wake-ups pending)."""
        try:
            self._wake.send(b"\x01", socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL)
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            self.peer_closed = True

    def clear_wakes(self) -> None:
        """Reads and discards the wake-ups iapd sent; notes when it closed its end. At most 16
        reads: a peer that writes without pause cannot keep the caller here (what is left wakes
        the next poll, which looks again)."""
        for _ in range(16):
            if self.peer_closed:
                return
            try:
                data = self._wake.recv(4096, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self.peer_closed = True
                return
            if not data:
                self.peer_closed = True

    def close(self) -> None:
        """Unmaps the rings (the wake socket is the session's to close)."""
        for view in (self._out, self._in, self._words, self._view):
            view.release()
        self._map.close()
