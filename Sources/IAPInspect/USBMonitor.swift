/// One record of a Linux usbmon capture: the kernel's `struct usbmon_packet` header (48 bytes for
/// `LINKTYPE_USB_LINUX`, 64 for `LINKTYPE_USB_LINUX_MMAPPED`) and the data captured with it.
///
/// The header's multi-byte fields are in the byte order of the machine that captured it, which
/// is the byte order of the file (libpcap and dumpcap write them as they come).
public struct USBMonRecord: Sendable, Hashable {
    /// The kind of event.
    public enum Event: Sendable, Hashable {
        /// 'S': the host submitted a transfer (OUT data travels with it).
        case submission
        /// 'C': the transfer completed (IN data travels with it).
        case completion
        /// 'E': the submission failed.
        case error
    }

    /// The transfer type of the endpoint.
    public enum TransferType: UInt8, Sendable, Hashable {
        /// Isochronous.
        case isochronous = 0
        /// Interrupt.
        case interrupt = 1
        /// Control.
        case control = 2
        /// Bulk.
        case bulk = 3
    }

    /// The URB's tag: a submission and its completion share it.
    public var urbID: UInt64
    /// Submission, completion or error.
    public var event: Event
    /// The endpoint's transfer type.
    public var transferType: TransferType
    /// The endpoint address, direction bit included (0x81 is IN endpoint 1).
    public var endpoint: UInt8
    /// The device's address on its bus.
    public var device: UInt8
    /// The bus number (`usbmon1` is bus 1).
    public var bus: UInt16
    /// The SETUP packet of a control submission.
    public var setup: [UInt8]?
    /// The URB's status (0, or a negative errno such as -2 for a cancelled transfer).
    public var status: Int32
    /// The transfer's length (requested on submission, actual on completion).
    public var urbLength: Int
    /// The data captured with the event.
    public var data: [UInt8]
    /// Bytes of the event's data that the capture left out (a snapshot length shorter than the transfer).
    public var missingByteCount: Int

    /// True for an IN endpoint (device to host).
    public var isIn: Bool { endpoint & 0x80 != 0 }

    /// Reads a record from a captured packet.
    public static func decode(_ packet: [UInt8], memoryMapped: Bool, bigEndian: Bool) throws(CaptureFormatError) -> USBMonRecord {
        let headerSize = memoryMapped ? 64 : 48
        guard packet.count >= headerSize else {
            throw CaptureFormatError(.truncated, offset: 0,
                                     "usbmon record of \(packet.count) bytes; its header alone is \(headerSize) (captured with too small a snapshot length?)")
        }
        func u16(_ at: Int) -> UInt16 {
            let a = UInt16(packet[at]), b = UInt16(packet[at + 1])
            return bigEndian ? a << 8 | b : b << 8 | a
        }
        func u32(_ at: Int) -> UInt32 {
            let a = UInt32(u16(at)), b = UInt32(u16(at + 2))
            return bigEndian ? a << 16 | b : b << 16 | a
        }
        func u64(_ at: Int) -> UInt64 {
            let a = UInt64(u32(at)), b = UInt64(u32(at + 4))
            return bigEndian ? a << 32 | b : b << 32 | a
        }
        let event: Event
        switch packet[8] {
        case UInt8(ascii: "S"): event = .submission
        case UInt8(ascii: "C"): event = .completion
        case UInt8(ascii: "E"): event = .error
        default:
            throw CaptureFormatError(.badField, offset: 8, "usbmon event type 0x\(hex(packet[8])) is not S, C or E: not a usbmon capture, or a damaged one")
        }
        guard let transferType = TransferType(rawValue: packet[9]) else {
            throw CaptureFormatError(.badField, offset: 9, "usbmon transfer type \(packet[9]) is not 0…3: not a usbmon capture, or a damaged one")
        }
        let dataLength = Int(u32(36))
        var dataStart = headerSize
        if memoryMapped, transferType == .isochronous {
            let descriptors = Int(u32(60))
            guard descriptors <= (packet.count - headerSize) / 16 else {
                throw CaptureFormatError(.badLength, offset: 60, "usbmon record claims \(descriptors) isochronous descriptors, more than it holds")
            }
            dataStart += descriptors * 16
        }
        let present = packet[15] == 0 ? min(dataLength, packet.count - dataStart) : 0
        return USBMonRecord(
            urbID: u64(0), event: event, transferType: transferType, endpoint: packet[10], device: packet[11], bus: u16(12),
            setup: packet[14] == 0 ? Array(packet[40..<48]) : nil, status: Int32(bitPattern: u32(28)), urbLength: Int(u32(32)),
            data: Array(packet[dataStart..<(dataStart + present)]),
            missingByteCount: packet[15] == 0 ? dataLength - present : 0)
    }
}

/// The iAP endpoints of USB devices, learned from the configuration descriptors a capture shows.
struct USBInterfaceMap {
    /// Where an endpoint belongs.
    enum Role: Hashable {
        /// The iAP2 interface (FF/F0/00): iAP frames.
        case iap
        /// An EA native-transport interface (FF/F0/01): raw session bytes.
        case native
        /// Another interface: not ours.
        case other
    }

    struct Key: Hashable {
        var bus: UInt16
        var device: UInt8
        var endpoint: UInt8
    }

    private(set) var roles: [Key: Role] = [:]
    /// Devices whose configuration was seen (their other endpoints are not ours).
    private(set) var described: Set<[UInt16]> = []
    private static let maxEntries = 4096

    /// Learns the endpoints of a configuration descriptor (a GET_DESCRIPTOR answer). Malformed
    /// descriptors end the walk; what came before stays learned.
    mutating func learn(configuration bytes: [UInt8], bus: UInt16, device: UInt8) {
        guard bytes.count >= 9, bytes[1] == 2, roles.count < Self.maxEntries else { return }
        described.insert([bus, UInt16(device)])
        var at = 0
        var role = Role.other
        while at + 2 <= bytes.count {
            let length = Int(bytes[at])
            guard length >= 2, at + length <= bytes.count else { return }
            switch bytes[at + 1] {
            case 4 where length >= 9:
                switch (bytes[at + 5], bytes[at + 6], bytes[at + 7]) {
                case (0xFF, 0xF0, 0x00): role = .iap
                case (0xFF, 0xF0, 0x01): role = .native
                default: role = .other
                }
            case 5 where length >= 7:
                if bytes[at + 3] & 3 == 2 {
                    let key = Key(bus: bus, device: device, endpoint: bytes[at + 2])
                    // An endpoint shared by alternate settings keeps the iAP role it had.
                    if roles[key] == nil || role != .other { roles[key] = role }
                }
            default: break
            }
            at += length
        }
    }

    /// What the descriptors say about an endpoint: nil when this device's configuration was not seen.
    func role(bus: UInt16, device: UInt8, endpoint: UInt8) -> Role? {
        if let role = roles[Key(bus: bus, device: device, endpoint: endpoint)] { return role }
        return described.contains([bus, UInt16(device)]) ? .other : nil
    }

    /// Forgets a device (its address is free again: a new device may take it).
    mutating func forget(bus: UInt16, device: UInt8) {
        described.remove([bus, UInt16(device)])
        roles = roles.filter { !($0.key.bus == bus && $0.key.device == device) }
    }
}
