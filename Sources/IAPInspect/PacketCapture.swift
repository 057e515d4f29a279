public import IAPWire

/// The link-layer types this project writes and reads in pcap and pcapng files.
///
/// Traces of our own (`--trace-file FILE.pcapng`) use ``iap``, a `LINKTYPE_USER0` value with the
/// header ``IAPCaptureHeader`` before each frame (documented in `tools/clients/wireshark/README.md`).
/// Linux usbmon captures (`tcpdump -i usbmonN`, Wireshark) use ``usbLinux`` or
/// ``usbLinuxMemoryMapped``.
public enum CaptureLinkType {
    /// `LINKTYPE_USER0` (147): one iAP frame per packet behind an ``IAPCaptureHeader``.
    public static let iap: UInt16 = 147
    /// `LINKTYPE_USB_LINUX` (189): a 48-byte usbmon header, then the transfer's data.
    public static let usbLinux: UInt16 = 189
    /// `LINKTYPE_USB_LINUX_MMAPPED` (220): a 64-byte usbmon header, then the transfer's data.
    public static let usbLinuxMemoryMapped: UInt16 = 220
}

/// Which way bytes went on an accessory's wire, as a capture records it.
public enum CaptureDirection: UInt8, Sendable, Hashable {
    /// From the host (this machine, the Apple-device role) to the accessory.
    case hostToAccessory = 0
    /// From the accessory to the host.
    case accessoryToHost = 1

    /// The word `iapctl decode --json` uses: "out" (host to accessory) or "in".
    public var word: String { self == .hostToAccessory ? "out" : "in" }
    /// An arrow for people: "host → acc" or "acc → host".
    public var arrow: String { self == .hostToAccessory ? "host → acc" : "acc → host" }
}

/// The wire a traced accessory is on, as the capture header records it.
public enum CaptureTransport: UInt8, Sendable, Hashable, CaseIterable {
    /// Not known.
    case unknown = 0
    /// Two endpoints in one process (the in-process simulator, tests).
    case memory = 1
    /// A serial line: a UART, a USB-serial adapter or a pseudo-terminal.
    case serial = 2
    /// The iAP2 bulk interface of a USB accessory.
    case usb = 3
    /// This machine as a USB gadget.
    case gadget = 4
    /// An EA native-transport USB interface (raw session bytes, no iAP framing).
    case nativePipe = 5
    /// An RFCOMM channel over Bluetooth.
    case bluetooth = 6

    /// The name shown for it ("USB", "serial", …).
    public var name: String {
        switch self {
        case .unknown: return "unknown"
        case .memory: return "memory"
        case .serial: return "serial"
        case .usb: return "USB"
        case .gadget: return "USB gadget"
        case .nativePipe: return "native pipe"
        case .bluetooth: return "Bluetooth"
        }
    }
}

/// What a packet of an ``CaptureLinkType/iap`` capture holds after its header.
public enum CaptureContent: UInt8, Sendable, Hashable {
    /// One complete iAP2 packet, iAP1 packet or detect sequence, as it was on the wire.
    case frame = 0
    /// Bytes the receiver dropped (garbage, a bad checksum, a lying length); the header's
    /// ``IAPCaptureHeader/dropReason`` says why.
    case dropped = 1
    /// Session bytes of an EA native transport (no framing).
    case nativeData = 2
}

/// The 8-byte header before each frame of an ``CaptureLinkType/iap`` capture.
///
/// | offset | size | field |
/// |---|---|---|
/// | 0 | 1 | version, 1 |
/// | 1 | 1 | direction: 0 host → accessory, 1 accessory → host |
/// | 2 | 1 | transport: ``CaptureTransport`` |
/// | 3 | 1 | content: ``CaptureContent`` |
/// | 4 | 1 | drop reason when content is 1 (``dropReasonNames``), else 0 |
/// | 5 | 3 | reserved, 0 |
public struct IAPCaptureHeader: Sendable, Hashable {
    /// The header's size in bytes.
    public static let size = 8
    /// The version this project writes and reads.
    public static let version: UInt8 = 1
    /// The names of the drop reason codes: code n is `dropReasonNames[n - 1]`; 0 is "none".
    public static let dropReasonNames: [String] = [
        "garbage", "bad iAP2 header checksum", "bad iAP2 payload checksum", "bad iAP1 checksum",
        "invalid length", "frame too long", "iAP1 packet while iAP1 is off", "partial frame abandoned",
    ]

    /// Which way the frame went.
    public var direction: CaptureDirection
    /// The wire.
    public var transport: CaptureTransport
    /// What follows the header.
    public var content: CaptureContent
    /// For dropped bytes, the reason's code (see ``dropReasonNames``); 0 otherwise.
    public var dropReason: UInt8

    /// Creates a header.
    public init(direction: CaptureDirection, transport: CaptureTransport, content: CaptureContent = .frame, dropReason: UInt8 = 0) {
        self.direction = direction
        self.transport = transport
        self.content = content
        self.dropReason = dropReason
    }

    /// The header's bytes.
    public var bytes: [UInt8] {
        [Self.version, direction.rawValue, transport.rawValue, content.rawValue, dropReason, 0, 0, 0]
    }

    /// Reads the header at the start of a packet.
    public static func decode(_ packet: [UInt8]) throws(CaptureFormatError) -> IAPCaptureHeader {
        guard packet.count >= size else {
            throw CaptureFormatError(.truncated, offset: 0, "the packet holds \(packet.count) bytes, fewer than the \(size)-byte iAP capture header")
        }
        guard packet[0] == version else {
            throw CaptureFormatError(.unsupported, offset: 0, "iAP capture header version \(packet[0]); this iapctl reads version \(version)")
        }
        guard let direction = CaptureDirection(rawValue: packet[1]) else {
            throw CaptureFormatError(.badField, offset: 1, "direction \(packet[1]) is neither 0 (host → accessory) nor 1 (accessory → host)")
        }
        guard let content = CaptureContent(rawValue: packet[3]) else {
            throw CaptureFormatError(.badField, offset: 3, "content \(packet[3]) is not 0 (frame), 1 (dropped bytes) or 2 (native data)")
        }
        return IAPCaptureHeader(direction: direction, transport: CaptureTransport(rawValue: packet[2]) ?? .unknown,
                                content: content, dropReason: packet[4])
    }

    /// The code of a scanner's drop reason.
    public static func code(of reason: ScanDropReason.Kind) -> UInt8 {
        switch reason {
        case .garbage: return 1
        case .badHeaderChecksum: return 2
        case .badPayloadChecksum: return 3
        case .badIAP1Checksum: return 4
        case .invalidLength: return 5
        case .frameTooLong: return 6
        case .unexpectedIAP1: return 7
        case .partialFrameAbandoned: return 8
        }
    }
}


/// A capture file that cannot be read, with where and why.
public struct CaptureFormatError: Error, Sendable, Hashable, CustomStringConvertible {
    /// What kind of mistake.
    public enum Kind: Sendable, Hashable {
        /// Not a pcap or pcapng file (its first bytes are not a known magic number).
        case notACapture
        /// A version or link type this reader does not read.
        case unsupported
        /// A block or record longer than the reader accepts.
        case tooLong
        /// A length field that contradicts the lengths around it.
        case badLength
        /// A field with a value it may not have.
        case badField
        /// The file ends inside a block or record.
        case truncated
    }

    /// What kind of mistake.
    public var kind: Kind
    /// The byte offset in the file (or in the packet, for a packet's header) where it is.
    public var offset: Int
    /// What is wrong and what to do, for a person.
    public var message: String

    /// Creates an error.
    public init(_ kind: Kind, offset: Int, _ message: String) {
        self.kind = kind
        self.offset = offset
        self.message = message
    }

    /// The message with its offset.
    public var description: String { "at byte \(offset): \(message)" }
}
