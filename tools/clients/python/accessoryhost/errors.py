"""The errors of the iapd client, one class per kind, each with a message that says what to do.

Every error is an :class:`IapdError`; those that the standard library has a kind for are also
that kind (:class:`DaemonNotRunning` is a :class:`ConnectionError`, :class:`Timeout` a
:class:`TimeoutError`, :class:`PermissionDenied` a :class:`PermissionError`), so code that
catches ``OSError`` or ``TimeoutError`` keeps working. A failure iapd reports carries its
``code`` (``"protocol-in-use"``, ``"no-such-accessory"``, … as in docs/DAEMON.md).
"""

from __future__ import annotations

from typing import Dict, Optional, Type

__all__ = [
    "IapdError", "DaemonNotRunning", "PermissionDenied", "VersionMismatch", "DaemonGone", "ProtocolError",
    "BadRequest", "NoSuchAccessory", "UnsupportedProtocol", "ProtocolInUse", "SessionRefused",
    "TooManySessions", "DaemonFailure", "SessionClosed", "Timeout", "failure_from_reply",
]


class IapdError(Exception):
    """Anything that went wrong talking to iapd or on a session.

    ``code`` is the daemon's failure code when iapd reported it (``"refused"``, …), otherwise
    the client's own kind (``"not-running"``, ``"timeout"``, …); ``str(error)`` is a sentence
    that ends with what to do.
    """

    code: str = "failed"

    def __init__(self, message: str, code: Optional[str] = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code

    def __str__(self) -> str:
        return self.message


class DaemonNotRunning(IapdError, ConnectionError):
    """Nothing listens on iapd's socket."""

    code = "not-running"


class PermissionDenied(IapdError, PermissionError):
    """iapd's socket (or iapd itself) refused this user: not root, not in the socket's group."""

    code = "permission"


class VersionMismatch(IapdError):
    """iapd speaks another protocol version than this library; the message names both."""

    code = "version"


class DaemonGone(IapdError, ConnectionError):
    """The connection to iapd ended (iapd stopped or restarted, or dropped this client)."""

    code = "daemon-gone"


class ProtocolError(IapdError):
    """iapd sent something this library cannot read, or a session's shared ring is broken."""

    code = "protocol"


class BadRequest(IapdError):
    """iapd could not read a request and dropped the client (a daemon older than the request?)."""

    code = "bad-request"


class NoSuchAccessory(IapdError):
    """No accessory has that id now: it went away (a reconnection gets a new id)."""

    code = "no-such-accessory"


class UnsupportedProtocol(IapdError):
    """The accessory does not declare the protocol string."""

    code = "unsupported-protocol"


class ProtocolInUse(IapdError):
    """Another process holds the session for that protocol on that accessory.

    ``holder`` is what iapd said of it: ``{"pid": …, "uid": …, "command": …}`` (or None).
    """

    code = "protocol-in-use"

    def __init__(self, message: str, holder: Optional[Dict[str, object]] = None) -> None:
        super().__init__(message)
        self.holder = holder


class SessionRefused(IapdError):
    """The accessory refused the session or did not answer it."""

    code = "refused"


class TooManySessions(IapdError):
    """This client holds as many sessions as iapd allows one client (64)."""

    code = "too-many-sessions"


class DaemonFailure(IapdError):
    """iapd could not do what was asked (its message says why)."""

    code = "failed"


class SessionClosed(IapdError):
    """The session is closed: by this side, or the accessory ended it or went away."""

    code = "session-closed"


class Timeout(IapdError, TimeoutError):
    """A wait did not end in the time allowed; the message names the wait.

    A session's ``write`` that times out sets ``written`` (the bytes of that call that went);
    ``read_exactly`` sets ``partial`` (the bytes it had read): nothing is lost.
    """

    code = "timeout"
    #: For a ``write``: how many bytes of the call were written before the time ran out.
    written: int = 0
    #: For a ``read_exactly``: the bytes read before the time ran out.
    partial: bytes = b""


_BY_CODE: Dict[str, Type[IapdError]] = {
    "bad-request": BadRequest,
    "version": VersionMismatch,
    "permission": PermissionDenied,
    "no-such-accessory": NoSuchAccessory,
    "unsupported-protocol": UnsupportedProtocol,
    "protocol-in-use": ProtocolInUse,
    "refused": SessionRefused,
    "too-many-sessions": TooManySessions,
    "failed": DaemonFailure,
}


def failure_from_reply(failure: object, protocol: Optional[str] = None, available: Optional[list[str]] = None) -> IapdError:
    """The error for iapd's ``failure`` reply (its ``_0`` object), worded as iapctl words it."""
    if not isinstance(failure, dict):
        return ProtocolError(f"iapd sent a failure this library cannot read ({failure!r}); update the library to iapd's release")
    code = str(failure.get("code", "failed"))
    message = str(failure.get("message", "iapd gave no reason"))
    kind = _BY_CODE.get(code, DaemonFailure)
    if kind is ProtocolInUse:
        holder = failure.get("holder")
        holder_dict = holder if isinstance(holder, dict) else None
        who = "another process"
        if holder_dict is not None:
            command = str(holder_dict.get("command", ""))
            who = f"pid {holder_dict.get('pid')}" + (f" ({command})" if command else "")
        name = protocol if protocol is not None else "the protocol"
        return ProtocolInUse(f"a session for '{name}' is already open on this accessory in {who} "
                             "(one per protocol, system-wide); close it there first", holder_dict)
    if kind is UnsupportedProtocol and protocol is not None:
        declared = ", ".join(available) if available else "no protocols"
        return UnsupportedProtocol(f"the accessory does not declare '{protocol}'; it declares: {declared}")
    if kind is NoSuchAccessory:
        return NoSuchAccessory(f"the accessory disconnected: {message}")
    if kind is SessionRefused:
        return SessionRefused(f"the accessory refused the session: {message}")
    error = kind(message)
    error.code = code
    return error
