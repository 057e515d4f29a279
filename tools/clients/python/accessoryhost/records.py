"""What iapd says about accessories: records and events, as immutable dataclasses.

An :class:`Accessory` carries every field of the Swift library's ``Accessory`` that iapd sends
(identity, transport, location, the USB device, the Bluetooth address); the whole identity as
iapd encoded it stays in :attr:`Accessory.identity` (messages, languages, transport components,
the authentication outcome).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional, Tuple, Union

from .errors import ProtocolError

__all__ = ["Accessory", "USBDevice", "Connected", "Disconnected", "AppLaunchRequested", "TransportFailed", "Event"]


@dataclass(frozen=True)
class USBDevice:
    """The USB device an accessory is (only for accessories on USB)."""

    #: Bus number.
    bus: int
    #: Address on the bus.
    address: int
    #: Hub ports from the root.
    port_path: Tuple[int, ...]
    #: idVendor.
    vendor_id: int
    #: idProduct.
    product_id: int
    #: bcdDevice.
    release: int
    #: The iManufacturer string, when the device has one.
    manufacturer: Optional[str]
    #: The iProduct string.
    product: Optional[str]
    #: The iSerialNumber string.
    serial_number: Optional[str]

    @property
    def usb_id(self) -> str:
        """``"vvvv:pppp"`` in hex, as ``lsusb`` and ``wait_for(usb_id=…)`` write it."""
        return f"{self.vendor_id:04x}:{self.product_id:04x}"


@dataclass(frozen=True)
class Accessory:
    """A connected accessory as iapd describes it (EAAccessory's fields and more).

    ``id`` is iapd's: unique while iapd runs, and new after every reconnection; the serial
    number is what tells an accessory apart across reconnections.
    """

    #: iapd's id for this connection of the accessory (the Swift ``connectionID``).
    id: int
    #: The accessory's name, as declared in identification.
    name: str
    #: Its manufacturer.
    manufacturer: str
    #: Its model (iAP2 ModelIdentifier; EAAccessory's ``modelNumber``).
    model_number: str
    #: Its serial number.
    serial_number: str
    #: Its firmware version: what a firmware upgrade changes.
    firmware_revision: str
    #: Its hardware version.
    hardware_revision: str
    #: The EA protocol strings, in the order declared.
    protocol_strings: Tuple[str, ...]
    #: ``"iAP2"`` or ``"iAP1"``.
    protocol_version: str
    #: The kind of wire: ``usb``, ``serial``, ``memory``, ``gadget``, ``bluetooth``.
    transport_kind: str
    #: Where it is attached, as iapd names it (``usb 1-1``, ``serial /dev/ttyUSB0 @ 115200``).
    location: str
    #: The USB device, for accessories on USB.
    usb_device: Optional[USBDevice]
    #: The Bluetooth address (``00:1A:7D:DA:71:13``), for accessories on Bluetooth.
    bluetooth_address: Optional[str]
    #: The authentication outcome: ``verified``, ``notVerified`` or ``notChecked``.
    authentication: str
    #: Everything the accessory declared, as iapd encoded it (the Swift ``AccessoryIdentity``).
    identity: Mapping[str, Any] = field(repr=False, compare=False)
    #: The record exactly as iapd sent it.
    raw: Mapping[str, Any] = field(repr=False, compare=False)

    #: EAAccessory's ``dockType``: always empty (no identification parameter carries it).
    dock_type: str = ""

    @property
    def connection_id(self) -> int:
        """The Swift library's name for :attr:`id`."""
        return self.id

    def speaks(self, protocol: str) -> bool:
        """Whether the accessory declares the protocol string."""
        return protocol in self.protocol_strings

    @classmethod
    def from_record(cls, record: Any) -> "Accessory":
        """Reads iapd's accessory record (docs/DAEMON.md); raises :class:`ProtocolError` when it
        lacks a field this library needs."""
        try:
            identity = record["identity"]
            usb = record.get("usb")
            device = None
            if isinstance(usb, dict):
                device = USBDevice(bus=int(usb["bus"]), address=int(usb["address"]),
                                   port_path=tuple(int(port) for port in usb.get("portPath", [])),
                                   vendor_id=int(usb["vendorID"]), product_id=int(usb["productID"]),
                                   release=int(usb.get("release", 0)), manufacturer=usb.get("manufacturer"),
                                   product=usb.get("product"), serial_number=usb.get("serialNumber"))
            protocols = tuple(str(entry["name"]) for entry in identity.get("protocols", []))
            return cls(id=int(record["id"]), name=str(identity["name"]), manufacturer=str(identity["manufacturer"]),
                       model_number=str(identity["modelIdentifier"]), serial_number=str(identity["serialNumber"]),
                       firmware_revision=str(identity["firmwareVersion"]),
                       hardware_revision=str(identity["hardwareVersion"]), protocol_strings=protocols,
                       protocol_version=_enum_name(identity.get("protocolVersion"), "iAP2"),
                       transport_kind=str(record["transportKind"]), location=str(record["location"]),
                       usb_device=device, bluetooth_address=record.get("bluetoothAddress"),
                       authentication=_authentication(identity.get("authentication")),
                       identity=identity, raw=record)
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise ProtocolError(f"iapd sent an accessory record this library cannot read ({error!r}); "
                                "update the library to iapd's release") from None


def _enum_name(value: Any, default: str) -> str:
    """A Swift enum as Codable writes it: a string, or an object whose one key is the case."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and len(value) == 1:
        return str(next(iter(value)))
    return default


def _authentication(value: Any) -> str:
    """The outcome's kind: ``verified``, ``notVerified`` or ``notChecked``."""
    if isinstance(value, dict) and "status" in value:
        return _enum_name(value["status"], "notChecked")
    return _enum_name(value, "notChecked")


@dataclass(frozen=True)
class Connected:
    """Event: an accessory was identified (connected, or back after a reconnection)."""

    #: The accessory.
    accessory: Accessory


@dataclass(frozen=True)
class Disconnected:
    """Event: an accessory went away; ``reason`` says how."""

    #: iapd's id of the accessory that went away.
    accessory_id: int
    #: Why, in a sentence.
    reason: str


@dataclass(frozen=True)
class AppLaunchRequested:
    """Event: an accessory asked for an application (RequestAppLaunch)."""

    #: iapd's id of the accessory.
    accessory_id: int
    #: The application's bundle identifier (empty when it named none).
    bundle_identifier: str


@dataclass(frozen=True)
class TransportFailed:
    """Event: something went wrong on a transport before its accessory was identified."""

    #: Which transport (``usb 1-1``).
    location: str
    #: What happened and what to do.
    reason: str


#: Any event iapd sends.
Event = Union[Connected, Disconnected, AppLaunchRequested, TransportFailed]


def event_from_reply(reply: Dict[str, Any]) -> Optional[Event]:
    """The event in a message without an id; None for an event this library does not know
    (a newer iapd's), which is skipped; raises :class:`ProtocolError` for one it cannot read."""
    try:
        return _event(reply)
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise ProtocolError(f"iapd sent an event this library cannot read ({error!r}); "
                            "update the library to iapd's release") from None


def _event(reply: Dict[str, Any]) -> Optional[Event]:
    if "connected" in reply:
        return Connected(Accessory.from_record(reply["connected"]["_0"]))
    if "disconnected" in reply:
        body = reply["disconnected"]
        return Disconnected(int(body["accessory"]), str(body.get("reason", "")))
    if "appLaunchRequested" in reply:
        body = reply["appLaunchRequested"]
        return AppLaunchRequested(int(body["accessory"]), str(body.get("bundleIdentifier", "")))
    if "transportFailed" in reply:
        body = reply["transportFailed"]
        return TransportFailed(str(body.get("location", "")), str(body.get("reason", "")))
    return None
