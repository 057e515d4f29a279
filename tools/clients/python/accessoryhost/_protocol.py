"""iapd's client protocol, version 3 (docs/DAEMON.md): framing, the hello, the socket's path.

Messages are a 4-byte big-endian length and that many bytes of one JSON object. Descriptors
(``SCM_RIGHTS``) come attached to the first byte of the reply they belong to.
"""

from __future__ import annotations

import grp
import json
import os
import socket
import struct
from typing import Any, Dict, List, Optional, Tuple

from .errors import DaemonNotRunning, IapdError, PermissionDenied, ProtocolError, VersionMismatch

#: The protocol version this library speaks.
PROTOCOL_VERSION = 3
#: Where iapd listens unless ``IAPD_SOCKET`` or the caller names another socket.
DEFAULT_SOCKET = "/run/iapd/iapd.sock"
#: The environment variable naming another socket (as for iapctl and the Swift library).
SOCKET_ENVIRONMENT = "IAPD_SOCKET"
#: The longest message iapd sends (a list of many accessories).
MAXIMUM_REPLY = 8 * 1024 * 1024
#: The longest request iapd reads.
MAXIMUM_REQUEST = 16 * 1024
#: Bytes asked of the kernel per receive.
RECEIVE_SIZE = 256 * 1024
#: Descriptors one receive may carry (an ``opened`` reply carries 2).
MAXIMUM_DESCRIPTORS = 8

#: Descriptors that may wait for their opened replies: two for each of the 64 sessions iapd
#: lets a client hold.
MAXIMUM_WAITING_DESCRIPTORS = 128

Message = Dict[str, Any]


def socket_path(path: Optional[str]) -> str:
    """The socket to connect to: ``path``, else ``$IAPD_SOCKET``, else /run/iapd/iapd.sock."""
    if path:
        return path
    return os.environ.get(SOCKET_ENVIRONMENT) or DEFAULT_SOCKET


def connect_error(path: str, error: OSError) -> IapdError:
    """The error for a failed connect to iapd's socket, worded as iapctl words it."""
    if isinstance(error, (FileNotFoundError, ConnectionRefusedError)):
        return DaemonNotRunning(f"iapd is not running (nothing listens on {path}): start it with "
                                "`sudo systemctl start iapd` (or `sudo iapd --group iapd`), then try again")
    if isinstance(error, PermissionError):
        group = "iapd"
        try:
            group = grp.getgrgid(os.stat(path).st_gid).gr_name
        except (OSError, KeyError):
            pass
        return PermissionDenied(f"permission denied on {path}: only root and members of the group '{group}' may use iapd; "
                                f"add yourself with `sudo usermod -aG {group} $USER`, then log in again")
    return DaemonNotRunning(f"cannot connect to iapd at {path}: {error}", code="failed")


def encode(message_id: int, request: Message) -> bytes:
    """One request, framed."""
    body = json.dumps({"id": message_id, "request": request}, separators=(",", ":")).encode()
    if len(body) > MAXIMUM_REQUEST:
        raise ValueError(f"the request is {len(body)} bytes; iapd reads at most {MAXIMUM_REQUEST}")
    return struct.pack(">I", len(body)) + body


def hello(client_name: str) -> Message:
    """The first request."""
    return {"hello": {"version": PROTOCOL_VERSION, "client": client_name[:256]}}


def check_welcome(reply: Message) -> Tuple[str, List[Any]]:
    """iapd's name and its accessories from the reply to hello; raises :class:`VersionMismatch`
    (both versions named) for a daemon of another protocol."""
    if "welcome" in reply:
        welcome = reply["welcome"]
        version = welcome.get("version")
        if version != PROTOCOL_VERSION:
            newer = isinstance(version, int) and version > PROTOCOL_VERSION
            advice = ("update this library (tools/clients/python) to iapd's release" if newer
                      else "update iapd to this library's release")
            raise VersionMismatch(f"this iapd speaks protocol {version}, the library protocol {PROTOCOL_VERSION}: {advice}")
        return str(welcome.get("daemon", "iapd")), list(welcome.get("accessories", []))
    failure = reply.get("failure", {}).get("_0", {}) if isinstance(reply.get("failure"), dict) else {}
    if failure.get("code") == "version":
        raise VersionMismatch(str(failure.get("message")))
    if failure.get("code") == "permission":
        raise PermissionDenied(str(failure.get("message")))
    raise ProtocolError(f"iapd answered hello with {_summary(reply)}; this library speaks protocol {PROTOCOL_VERSION}: "
                        "update iapd and the library to one release")


def field(reply: Message, case: str, key: Optional[str] = "_0") -> Any:
    """The value of a reply's case (Swift's Codable puts an unlabelled value under ``_0``);
    raises :class:`ProtocolError` when the reply is not shaped so."""
    body = reply.get(case)
    if not isinstance(body, dict) or (key is not None and key not in body):
        raise ProtocolError(f"iapd sent a '{case}' reply this library cannot read ({_summary(reply)}); "
                            "update the library to iapd's release")
    return body if key is None else body[key]


def _summary(reply: Any) -> str:
    text = json.dumps(reply)
    return text if len(text) <= 200 else text[:200] + "…"


class Decoder:
    """Cuts the byte stream from iapd into messages and gives each ``opened`` reply its two
    descriptors. Descriptors nothing claims are closed.

    Only an ``opened`` reply carries descriptors, attached to its first byte, so they are here by
    the time its last byte is, and they come in the order of the replies: each ``opened`` reply
    takes the next two. (A receive may bring the bytes of messages before the reply with them,
    since the kernel joins data without descriptors ahead of data with them: the position of a
    receive says nothing about which message its descriptors belong to.)
    """

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._descriptors: List[int] = []

    def feed(self, data: bytes, descriptors: List[int]) -> None:
        """Adds what one receive brought; raises :class:`ProtocolError` when more descriptors
        wait than the sessions a client may hold could claim (they are closed)."""
        self._descriptors += descriptors
        self._buffer += data
        if len(self._descriptors) > MAXIMUM_WAITING_DESCRIPTORS:
            close_all(self._descriptors)
            self._descriptors.clear()
            raise ProtocolError(f"iapd sent more than {MAXIMUM_WAITING_DESCRIPTORS} descriptors that no opened reply claims; "
                                "is something else listening on the socket?")

    def next(self) -> Optional[Tuple[Message, List[int]]]:
        """The next whole message and its descriptors, or None until more bytes come; raises
        :class:`ProtocolError` for a length over the limit or bytes that are not JSON."""
        if len(self._buffer) < 4:
            return None
        length = struct.unpack_from(">I", self._buffer, 0)[0]
        if length > MAXIMUM_REPLY:
            raise ProtocolError(f"iapd sent a message of {length} bytes (the limit is {MAXIMUM_REPLY}); "
                                "is something else listening on the socket?")
        if len(self._buffer) < 4 + length:
            return None
        try:
            message = json.loads(bytes(self._buffer[4:4 + length]))
        except (ValueError, UnicodeDecodeError) as error:
            raise ProtocolError(f"iapd sent a message that is not JSON ({error}); is something else listening on the socket?") from None
        del self._buffer[:4 + length]
        if not isinstance(message, dict) or not isinstance(message.get("reply"), dict):
            raise ProtocolError(f"iapd sent {_summary(message)}, which is not a reply; update the library to iapd's release")
        mine: List[int] = []
        if "opened" in message["reply"]:
            mine, self._descriptors = self._descriptors[:2], self._descriptors[2:]
        return message, mine

    def close(self) -> None:
        """Closes the descriptors no message claimed."""
        close_all(self._descriptors)
        self._descriptors.clear()


def receive(sock: socket.socket) -> Tuple[bytes, List[int]]:
    """One receive: the bytes and the descriptors that came with them (b"" at the end)."""
    size = socket.CMSG_SPACE(MAXIMUM_DESCRIPTORS * 4)
    data, ancillary, flags, _ = sock.recvmsg(RECEIVE_SIZE, size, socket.MSG_CMSG_CLOEXEC)
    descriptors: List[int] = []
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            usable = len(payload) - len(payload) % 4
            descriptors += list(struct.unpack(f"{usable // 4}i", payload[:usable]))
    if flags & socket.MSG_CTRUNC:
        close_all(descriptors)
        raise ProtocolError("iapd sent more descriptors than a reply carries; update the library to iapd's release")
    return data, descriptors


def close_all(descriptors: List[int]) -> None:
    """Closes every descriptor, ignoring those already closed."""
    for descriptor in descriptors:
        try:
            os.close(descriptor)
        except OSError:
            pass
