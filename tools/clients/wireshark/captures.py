#!/usr/bin/env python3
"""Writes the captures tools/clients/wireshark/check.sh feeds to tshark and `iapctl decode --pcap`:

  malformed.pcapng  an iapctl trace (LINKTYPE_USER0) of broken frames: bad checksums, lying
                    lengths, truncation, garbage, malformed messages, a bad capture header. Each
                    packet's comment-free number is listed in MALFORMED below.
  usbmon.pcap       a Linux usbmon capture (LINKTYPE_USB_LINUX_MMAPPED, as tcpdump writes it):
                    the configuration descriptor of a device with an iAP2 interface (FF/F0/00),
                    then iAP2 frames on its bulk endpoints, one split across two IN transfers.

Usage: captures.py OUTPUT-DIRECTORY
"""
import struct
import sys


def iap2(control, seq, ack, session, payload=b""):
    length = 9 if not payload else 10 + len(payload)
    header = bytes([0xFF, 0x5A, length >> 8, length & 0xFF, control, seq, ack, session])
    header += bytes([(-sum(header)) & 0xFF])
    if payload:
        return header + payload + bytes([(-sum(payload)) & 0xFF])
    return header


def message(msg_id, params=b""):
    return struct.pack(">HHH", 0x4040, 6 + len(params), msg_id) + params


def param(pid, data):
    return struct.pack(">HH", 4 + len(data), pid) + data


def iap1(lingo, command, payload=b"", sync=True):
    body = bytes([lingo, command]) + payload
    packet = bytes([len(body)]) + body
    packet += bytes([(-sum(packet)) & 0xFF])
    return (b"\xFF" if sync else b"") + b"\x55" + packet


SYN = iap2(0x80, 1, 0, 0, bytes([1, 8, 0x10, 0x00, 0x03, 0xE8, 0x00, 0x14, 30, 4, 1, 0, 1, 2, 2, 1]))


def corrupt(frame, index):
    frame = bytearray(frame)
    frame[index] ^= 0x01
    return bytes(frame)


# (description, capture header fields, frame bytes): every one must get expert info.
MALFORMED = [
    ("iAP2 header checksum wrong", (1, 1, 3, 0, 0), corrupt(iap2(0x40, 2, 1, 1, message(0x1D00)), 8)),
    ("iAP2 payload checksum wrong", (1, 1, 3, 0, 0), corrupt(iap2(0x40, 3, 1, 1, message(0x1D00)), 12)),
    ("iAP2 length longer than the frame", (1, 1, 3, 0, 0), iap2(0x40, 4, 1, 1, message(0x1D00))[:-3]),
    ("iAP2 length 10", (1, 1, 3, 0, 0), bytes([0xFF, 0x5A, 0, 10, 0x40, 5, 1, 1]) + bytes([(-(0xFF + 0x5A + 10 + 0x40 + 5 + 1 + 1)) & 0xFF])),
    ("iAP2 header cut short", (1, 1, 3, 0, 0), bytes([0xFF, 0x5A, 0, 9, 0x40])),
    ("control message with a lying length", (1, 1, 3, 0, 0), iap2(0x40, 6, 1, 1, struct.pack(">HHH", 0x4040, 40, 0x1D01) + b"\x00\x08\x00\x00ab")),
    ("parameter with a lying length", (1, 1, 3, 0, 0), iap2(0x40, 7, 1, 1, message(0x1D01, struct.pack(">HH", 200, 0) + b"Name\x00"))),
    ("uint16 parameter of three bytes", (1, 1, 3, 0, 0), iap2(0x40, 8, 1, 1, message(0xEA01, param(0, b"\x00\x01\x02")))),
    ("group nested too deep", (1, 1, 3, 0, 0), iap2(0x40, 9, 1, 1, message(0x1D01, param(10, param(0, param(0, param(0, param(0, param(0, b"x"))))))))),
    ("EA data without its session id", (1, 1, 3, 0, 0), iap2(0x40, 10, 1, 2, b"\x00")),
    ("SYN parameters of the wrong length", (1, 1, 3, 0, 0), iap2(0x80, 11, 0, 0, bytes([1, 8, 0x10, 0]))),
    ("iAP1 checksum wrong", (1, 1, 2, 0, 0), corrupt(iap1(0, 0x38, b"\x00\x01"), 6)),
    ("iAP1 length longer than the frame", (1, 1, 2, 0, 0), iap1(0, 0x13, b"\x00" * 12)[:-5]),
    ("iAP1 length 1", (1, 1, 2, 0, 0), bytes([0xFF, 0x55, 1, 0, 0xFF])),
    ("garbage", (1, 1, 3, 0, 0), bytes(range(0x20, 0x40))),
    ("dropped bytes recorded by iapctl", (1, 1, 3, 1, 2), bytes([0xFF, 0x5A, 0, 9, 0x40, 1, 2, 3, 0])),
    ("capture header of version 7", (7, 1, 3, 0, 0), SYN),
    ("capture header of 3 bytes", None, bytes([1, 1, 3])),
    ("capture header with content 9", (1, 1, 3, 9, 0), SYN),
    ("capture header and nothing after it", (1, 0, 3, 0, 0), b""),
]


def block(block_type, body):
    total = 12 + len(body)
    return struct.pack("<II", block_type, total) + body + struct.pack("<I", total)


def pad(data):
    return data + b"\x00" * ((4 - len(data) % 4) % 4)


def pcapng(packets, linktype=147):
    out = block(0x0A0D0D0A, struct.pack("<IHHq", 0x1A2B3C4D, 1, 0, -1) + b"\x00\x00\x00\x00")
    name = b"malformed frames"
    options = struct.pack("<HH", 2, len(name)) + pad(name) + struct.pack("<HH", 9, 1) + pad(b"\x09") + b"\x00\x00\x00\x00"
    out += block(1, struct.pack("<HHI", linktype, 0, 0) + options)
    for index, data in enumerate(packets):
        stamp = 1_700_000_000_000_000_000 + index * 1000
        out += block(6, struct.pack("<IIIII", 0, stamp >> 32, stamp & 0xFFFFFFFF, len(data), len(data)) + pad(data) + b"\x00\x00\x00\x00")
    return out


def malformed():
    packets = [bytes([1, 1, 3, 0, 0, 0, 0, 0]) + SYN]  # the SYN first: session 2 is EA
    for _, header, frame in MALFORMED:
        packets.append(bytes(header) + b"\x00\x00\x00" + frame if header is not None else frame)
    return pcapng(packets)


# usbmon ---------------------------------------------------------------------------------------

def usbmon(urb, event, transfer, endpoint, device, data=b"", setup=None, status=0, bus=1):
    header = struct.pack("<QBBBBHbb", urb, ord(event), transfer, endpoint, device, bus, 0 if setup else ord("-"),
                         0 if data else ord("<" if event == "S" else ">"))
    header += struct.pack("<qiiII", 1_700_000_000, 0, status, len(data), len(data))
    header += setup if setup else b"\x00" * 8
    header += struct.pack("<iiII", 0, 0, 0, 0)
    return header + data


def configuration():
    interface = bytes([9, 4, 0, 0, 2, 0xFF, 0xF0, 0x00, 0])
    ep_in = bytes([7, 5, 0x81, 2, 0x00, 0x02, 0])
    ep_out = bytes([7, 5, 0x01, 2, 0x00, 0x02, 0])
    other = bytes([9, 4, 1, 0, 1, 0x08, 0x06, 0x50, 0]) + bytes([7, 5, 0x82, 2, 0x00, 0x02, 0])
    body = interface + ep_in + ep_out + other
    total = 9 + len(body)
    return bytes([9, 2, total & 0xFF, total >> 8, 2, 1, 0, 0x80, 50]) + body


IDENTIFICATION = message(0x1D01, param(0, b"Rig Accessory\x00") + param(1, b"RIG-1\x00") + param(2, b"Acme\x00")
                         + param(10, param(0, b"\x01") + param(1, b"com.acme.rig\x00") + param(2, b"\x00")))


def usb_capture():
    config = configuration()
    get_config = struct.pack("<BBHHH", 0x80, 6, 0x0200, 0, len(config))
    detect = bytes([0xFF, 0x55, 0x02, 0x00, 0xEE, 0x10])
    ident = iap2(0x40, 3, 1, 1, IDENTIFICATION)
    ea = iap2(0x40, 4, 1, 2, b"\x00\x01hello")
    records = [
        usbmon(1, "S", 2, 0x80, 5, setup=get_config),
        usbmon(1, "C", 2, 0x80, 5, data=config),
        usbmon(2, "S", 3, 0x01, 5, data=detect),
        usbmon(3, "C", 3, 0x81, 5, data=detect),
        usbmon(4, "C", 3, 0x81, 5, data=SYN),
        usbmon(5, "S", 3, 0x01, 5, data=iap2(0xC0, 1, 1, 0, SYN[9:-1])),
        usbmon(6, "C", 3, 0x81, 5, data=ident[:100]),
        usbmon(7, "C", 3, 0x81, 5, data=ident[100:] + ea),
        usbmon(8, "S", 3, 0x82, 5, data=b"not ours"),
        usbmon(9, "S", 3, 0x01, 5, data=iap2(0x40, 2, 4, 1, message(0x1D02))),
    ]
    out = struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 262144, 220)
    for index, record in enumerate(records):
        out += struct.pack("<IIII", 1_700_000_000, index, len(record), len(record)) + record
    return out


def main():
    directory = sys.argv[1] if len(sys.argv) > 1 else "."
    with open(directory + "/malformed.pcapng", "wb") as f:
        f.write(malformed())
    with open(directory + "/usbmon.pcap", "wb") as f:
        f.write(usb_capture())


if __name__ == "__main__":
    main()
