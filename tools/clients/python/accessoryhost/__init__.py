"""A Python client for iapd, AccessoryHost's accessory daemon (docs/DAEMON.md, protocol 3).

Five lines that upgrade nothing but show everything a script needs::

    import accessoryhost
    with accessoryhost.connect() as client:
        accessory = client.wait_for(protocol="com.example.echo", timeout=30)
        with client.open(accessory, "com.example.echo") as session:
            session.write(b"ping"); print(session.read_exactly(4, timeout=10))

:func:`connect` returns a :class:`Client` (accessories, events, sessions); a :class:`Session`
moves bytes through iapd's shared rings, with back-pressure and the accessory's
acknowledgements (:meth:`Session.drain`). :mod:`accessoryhost.aio` is the asyncio form.
Errors are :class:`IapdError` subclasses whose message says what to do.
"""

from .client import Client, connect
from .errors import (BadRequest, DaemonFailure, DaemonGone, DaemonNotRunning, IapdError, NoSuchAccessory,
                     PermissionDenied, ProtocolError, ProtocolInUse, SessionClosed, SessionRefused, Timeout,
                     TooManySessions, UnsupportedProtocol, VersionMismatch)
from ._protocol import DEFAULT_SOCKET, PROTOCOL_VERSION
from .records import Accessory, AppLaunchRequested, Connected, Disconnected, Event, TransportFailed, USBDevice
from .session import Session

__version__ = "0.3.0"

__all__ = [
    "connect", "Client", "Session", "Accessory", "USBDevice", "Event", "Connected", "Disconnected",
    "AppLaunchRequested", "TransportFailed", "IapdError", "DaemonNotRunning", "PermissionDenied", "VersionMismatch",
    "DaemonGone", "ProtocolError", "BadRequest", "NoSuchAccessory", "UnsupportedProtocol", "ProtocolInUse",
    "SessionRefused", "TooManySessions", "DaemonFailure", "SessionClosed", "Timeout", "PROTOCOL_VERSION",
    "DEFAULT_SOCKET", "__version__",
]
