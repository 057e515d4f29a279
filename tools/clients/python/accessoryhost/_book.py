"""What a connection learns from iapd's messages, shared by the blocking and the asyncio client."""

from __future__ import annotations

import collections
from typing import Any, Deque, Dict, Iterable, List, Optional, Tuple

from . import _protocol
from .errors import DaemonGone, ProtocolError, failure_from_reply
from .records import Accessory, Connected, Disconnected, Event, event_from_reply

#: Events kept for ``events()`` when nobody reads them; the oldest go first (counted in
#: ``dropped_events``), so a client that never asks costs bounded memory. Also the number of
#: disconnection reasons kept.
MAXIMUM_QUEUED_EVENTS = 10000


class Book:
    """The accessories connected now, why those that went went, and the events not read yet."""

    def __init__(self) -> None:
        self.accessories: Dict[int, Accessory] = {}
        self.reasons: Dict[int, str] = {}
        self.events: Deque[Event] = collections.deque()
        self.dropped_events = 0

    def reset(self, accessories: Iterable[Accessory]) -> None:
        """The accessories as a list from iapd has them (newer than every event before it)."""
        self.accessories = {accessory.id: accessory for accessory in accessories}

    def _book_list(self, reply: Dict[str, Any]) -> None:
        """A welcome or a list replaces the accessories known here as it comes in the stream:
        it is newer than every event before it and older than every event after it (the
        caller reads the same reply again and raises if it cannot)."""
        records: Any = None
        if isinstance(reply.get("welcome"), dict):
            records = reply["welcome"].get("accessories")
        elif isinstance(reply.get("accessories"), dict):
            records = reply["accessories"].get("_0")
        if isinstance(records, list):
            try:
                self.reset(Accessory.from_record(record) for record in records)
            except ProtocolError:
                pass

    def sorted(self) -> List[Accessory]:
        """The accessories connected now, oldest first."""
        return sorted(self.accessories.values(), key=lambda record: record.id)

    def receive(self, message: Dict[str, Any], descriptors: List[int]) -> Optional[Tuple[int, Dict[str, Any], List[int]]]:
        """A reply, (its id, its body, its descriptors), for the caller to hand to its request;
        None for an event, which is booked (its descriptors closed). Raises
        :class:`DaemonGone` when iapd says it drops the client, :class:`ProtocolError` for a
        message it cannot read."""
        reply = message["reply"]
        message_id = message.get("id")
        if message_id is not None:
            if not isinstance(message_id, int):
                _protocol.close_all(descriptors)
                raise ProtocolError(f"iapd sent a reply with the id {message_id!r}; update the library to iapd's release")
            self._book_list(reply)
            return message_id, reply, descriptors
        _protocol.close_all(descriptors)
        if "failure" in reply:
            failure = failure_from_reply(_protocol.field(reply, "failure"))
            raise DaemonGone(f"iapd dropped this client: {failure} (an iapd older than this library answers so "
                             "a request it cannot read: update iapd)", code=failure.code)
        event = event_from_reply(reply)
        if event is None:
            return None
        if isinstance(event, Connected):
            self.accessories[event.accessory.id] = event.accessory
        elif isinstance(event, Disconnected):
            self.accessories.pop(event.accessory_id, None)
            self.reasons[event.accessory_id] = event.reason
            if len(self.reasons) > MAXIMUM_QUEUED_EVENTS:
                self.reasons.pop(next(iter(self.reasons)))
        if len(self.events) >= MAXIMUM_QUEUED_EVENTS:
            self.events.popleft()
            self.dropped_events += 1
        self.events.append(event)
        return None
