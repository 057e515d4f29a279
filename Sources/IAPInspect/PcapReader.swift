/// Reads pcap and pcapng files as they come, in pieces of any size, into packets.
///
/// Classic pcap in either byte order with micro- or nanosecond stamps, and pcapng (several
/// sections, either byte order, interface descriptions with `if_tsresol` and `if_tsoffset`,
/// enhanced, simple and obsolete packet blocks; other blocks are skipped). Every length is checked
/// against the lengths around it and against ``maxBlockLength``, so a lying length, a file cut
/// short or garbage gives a ``CaptureFormatError``, never a crash or an allocation of what a
/// length field claims. It holds at most one block (or record) and the piece being fed.
///
/// Feed with ``append(_:)``, take packets with ``next()`` until it returns nil (it needs more
/// bytes), and end with ``finish()``, which says whether the file stopped inside a block.
public struct PcapReader: Sendable {
    /// The longest block or record accepted: more than any snapshot length tcpdump or dumpcap use.
    public static let maxBlockLength = 1 << 24
    /// The most interfaces a section may describe.
    public static let maxInterfaces = 1 << 12

    /// An interface of the capture: what link type its packets have.
    public struct Interface: Sendable, Hashable {
        /// The link-layer type (`LINKTYPE_*`).
        public var linkType: UInt16
        /// `if_name`, when given.
        public var name: String?
        /// `if_description`, when given.
        public var description: String?
        /// Time stamp units per second (10^6 unless `if_tsresol` says otherwise).
        public var unitsPerSecond: UInt64 = 1_000_000
        /// `if_tsoffset`: seconds added to every stamp.
        public var offsetSeconds: Int64 = 0
    }

    /// Which way a packet went, as pcapng's `epb_flags` say.
    public enum PacketDirection: Sendable, Hashable {
        /// Not recorded.
        case unknown
        /// Received by the capturing interface.
        case inbound
        /// Sent by it.
        case outbound
    }

    /// One captured packet.
    public struct Packet: Sendable {
        /// 1 for the first packet of the file (as Wireshark numbers frames).
        public var number: Int
        /// The interface (0 in classic pcap); an index into ``PcapReader/interfaces``.
        public var interface: Int
        /// The link-layer type.
        public var linkType: UInt16
        /// Seconds since the Unix epoch.
        public var seconds: Int64
        /// Nanoseconds within the second.
        public var nanoseconds: Int
        /// The captured bytes.
        public var data: [UInt8]
        /// The packet's length on the wire (at least `data.count`).
        public var originalLength: Int
        /// The direction, from `epb_flags`.
        public var direction: PacketDirection
        /// True when multi-byte fields inside the packet (a usbmon header) are big-endian: the
        /// byte order of the file, which is that of the machine that captured it.
        public var isBigEndian: Bool
    }

    private enum Format {
        case unknown
        case pcap(bigEndian: Bool, nanoseconds: Bool, linkType: UInt16)
        case pcapng(bigEndian: Bool)
    }

    private var buffer: [UInt8] = []
    private var start = 0
    /// File offset of `buffer[start]`.
    private var offset = 0
    private var format = Format.unknown
    private var packets = 0
    /// The interfaces of the current section (pcapng) or the one interface (pcap).
    public private(set) var interfaces: [Interface] = []

    /// Creates a reader at the start of a file.
    public init() {}

    /// Whether `prefix` (the first bytes of a file, at least 4 or 12) starts a pcap or pcapng file.
    public static func looksLikeCapture(_ prefix: [UInt8]) -> Bool {
        guard prefix.count >= 4 else { return false }
        let magic = Array(prefix.prefix(4))
        if [[0xD4, 0xC3, 0xB2, 0xA1], [0xA1, 0xB2, 0xC3, 0xD4], [0x4D, 0x3C, 0xB2, 0xA1], [0xA1, 0xB2, 0x3C, 0x4D]].contains(magic) {
            return true
        }
        guard magic == [0x0A, 0x0D, 0x0D, 0x0A], prefix.count >= 12 else { return false }
        let order = Array(prefix[8..<12])
        return order == [0x4D, 0x3C, 0x2B, 0x1A] || order == [0x1A, 0x2B, 0x3C, 0x4D]
    }

    /// Adds the next bytes of the file.
    public mutating func append(_ piece: RawSpan) {
        if start > 0, start >= buffer.count - start {
            buffer.removeSubrange(0..<start)
            start = 0
        }
        piece.withUnsafeBytes { buffer.append(contentsOf: $0) }
    }

    /// Bytes fed and not yet read into a packet.
    public var bufferedByteCount: Int { buffer.count - start }

    /// The next packet, or nil when the bytes fed so far end before it.
    public mutating func next() throws(CaptureFormatError) -> Packet? {
        while true {
            switch format {
            case .unknown:
                guard try readFileHeader() else { return nil }
            case let .pcap(bigEndian, nanoseconds, linkType):
                return try nextRecord(bigEndian: bigEndian, nanoseconds: nanoseconds, linkType: linkType)
            case let .pcapng(bigEndian):
                guard available >= 8 else { return nil }
                // A new section may change the byte order; its magic is the same either way.
                if u32(0, bigEndian: false) == 0x0A0D_0D0A {
                    guard try readSectionHeader() else { return nil }
                    continue
                }
                let type = u32(0, bigEndian: bigEndian)
                let length = try blockLength(bigEndian: bigEndian)
                guard available >= length else { return nil }
                let trailer = u32(length - 4, bigEndian: bigEndian)
                guard trailer == UInt32(length) else {
                    throw CaptureFormatError(.badLength, offset: offset + length - 4,
                                             "block of type \(type) says \(length) bytes at its start and \(trailer) at its end: the file is damaged")
                }
                defer { consume(length) }
                if let packet = try block(type: type, length: length, bigEndian: bigEndian) { return packet }
            }
        }
    }

    /// Ends the file: throws when it stopped inside a header, block or record.
    public func finish() throws(CaptureFormatError) {
        if case .unknown = format, available == 0 {
            throw CaptureFormatError(.notACapture, offset: 0, "the file is empty; give a pcap or pcapng capture")
        }
        guard available == 0 else {
            throw CaptureFormatError(.truncated, offset: offset,
                                     "the file ends \(available) bytes into a block or record: it was cut short (a capture still being written, or copied partly)")
        }
    }

    // MARK: Headers

    private var available: Int { buffer.count - start }

    private mutating func consume(_ count: Int) {
        start += count
        offset += count
    }

    private func byte(_ at: Int) -> UInt8 { buffer[start + at] }

    private func u16(_ at: Int, bigEndian: Bool) -> UInt16 {
        let a = UInt16(byte(at)), b = UInt16(byte(at + 1))
        return bigEndian ? a << 8 | b : b << 8 | a
    }

    private func u32(_ at: Int, bigEndian: Bool) -> UInt32 {
        let a = UInt32(u16(at, bigEndian: bigEndian)), b = UInt32(u16(at + 2, bigEndian: bigEndian))
        return bigEndian ? a << 16 | b : b << 16 | a
    }

    private mutating func readFileHeader() throws(CaptureFormatError) -> Bool {
        guard available >= 4 else { return false }
        let magic = (byte(0), byte(1), byte(2), byte(3))
        switch magic {
        case (0xD4, 0xC3, 0xB2, 0xA1), (0xA1, 0xB2, 0xC3, 0xD4), (0x4D, 0x3C, 0xB2, 0xA1), (0xA1, 0xB2, 0x3C, 0x4D):
            guard available >= 24 else { return false }
            let bigEndian = magic.0 == 0xA1
            let nanoseconds = magic.2 == 0x3C || magic.1 == 0x3C
            let major = u16(4, bigEndian: bigEndian)
            guard major == 2 else {
                throw CaptureFormatError(.unsupported, offset: offset + 4, "pcap version \(major); this reader reads version 2 (what tcpdump and dumpcap write)")
            }
            let linkType = UInt16(truncatingIfNeeded: u32(20, bigEndian: bigEndian) & 0x0FFF_FFFF)
            interfaces = [Interface(linkType: linkType, unitsPerSecond: nanoseconds ? 1_000_000_000 : 1_000_000)]
            format = .pcap(bigEndian: bigEndian, nanoseconds: nanoseconds, linkType: linkType)
            consume(24)
            return true
        case (0x0A, 0x0D, 0x0D, 0x0A):
            return try readSectionHeader()
        default:
            throw CaptureFormatError(.notACapture, offset: offset,
                                     "not a pcap or pcapng capture (it starts \(HexInput.format([magic.0, magic.1, magic.2, magic.3]))); "
                                        + "for hex or raw bytes, leave out --pcap")
        }
    }

    private mutating func readSectionHeader() throws(CaptureFormatError) -> Bool {
        guard available >= 12 else { return false }
        let bigEndian: Bool
        switch (byte(8), byte(9), byte(10), byte(11)) {
        case (0x4D, 0x3C, 0x2B, 0x1A): bigEndian = false
        case (0x1A, 0x2B, 0x3C, 0x4D): bigEndian = true
        default:
            throw CaptureFormatError(.notACapture, offset: offset + 8, "a pcapng section header without its byte-order magic: not a pcapng file, or a damaged one")
        }
        let length = try blockLength(bigEndian: bigEndian)
        guard length >= 28 else {
            throw CaptureFormatError(.badLength, offset: offset + 4, "section header block of \(length) bytes; it needs at least 28")
        }
        guard available >= length else { return false }
        let major = u16(12, bigEndian: bigEndian)
        guard major == 1 else {
            throw CaptureFormatError(.unsupported, offset: offset + 12, "pcapng version \(major); this reader reads version 1")
        }
        guard u32(length - 4, bigEndian: bigEndian) == UInt32(length) else {
            throw CaptureFormatError(.badLength, offset: offset + length - 4, "the section header's two lengths differ: the file is damaged")
        }
        interfaces = []
        format = .pcapng(bigEndian: bigEndian)
        consume(length)
        return true
    }

    /// The length of the block at the start of the buffer (at least 8 bytes there), checked.
    private func blockLength(bigEndian: Bool) throws(CaptureFormatError) -> Int {
        let length = Int(u32(4, bigEndian: bigEndian))
        guard length >= 12, length % 4 == 0 else {
            throw CaptureFormatError(.badLength, offset: offset + 4, "block length \(length): pcapng blocks are at least 12 bytes and a multiple of 4")
        }
        guard length <= Self.maxBlockLength else {
            throw CaptureFormatError(.tooLong, offset: offset + 4,
                                     "block of \(length) bytes; this reader takes at most \(Self.maxBlockLength) (the length is wrong, or capture with a smaller snapshot length)")
        }
        return length
    }

    // MARK: Classic pcap

    private mutating func nextRecord(bigEndian: Bool, nanoseconds: Bool, linkType: UInt16) throws(CaptureFormatError) -> Packet? {
        guard available >= 16 else { return nil }
        let captured = Int(u32(8, bigEndian: bigEndian))
        let original = Int(u32(12, bigEndian: bigEndian))
        guard captured <= Self.maxBlockLength else {
            throw CaptureFormatError(.tooLong, offset: offset + 8,
                                     "record of \(captured) bytes; this reader takes at most \(Self.maxBlockLength) (the length is wrong, or the file is not pcap)")
        }
        guard available >= 16 + captured else { return nil }
        let fraction = Int(u32(4, bigEndian: bigEndian))
        guard fraction < (nanoseconds ? 1_000_000_000 : 1_000_000) else {
            throw CaptureFormatError(.badField, offset: offset + 4, "record time stamp with \(fraction) \(nanoseconds ? "nano" : "micro")seconds: the file is damaged")
        }
        packets += 1
        let packet = Packet(number: packets, interface: 0, linkType: linkType, seconds: Int64(u32(0, bigEndian: bigEndian)),
                            nanoseconds: nanoseconds ? fraction : fraction * 1_000, data: Array(buffer[(start + 16)..<(start + 16 + captured)]),
                            originalLength: max(original, captured), direction: .unknown, isBigEndian: bigEndian)
        consume(16 + captured)
        return packet
    }

    // MARK: pcapng blocks

    private mutating func block(type: UInt32, length: Int, bigEndian: Bool) throws(CaptureFormatError) -> Packet? {
        switch type {
        case 1: // interface description
            guard length >= 20 else { throw CaptureFormatError(.badLength, offset: offset + 4, "interface description block of \(length) bytes; it needs at least 20") }
            guard interfaces.count < Self.maxInterfaces else {
                throw CaptureFormatError(.tooLong, offset: offset, "more than \(Self.maxInterfaces) interfaces in one section")
            }
            var interface = Interface(linkType: u16(8, bigEndian: bigEndian))
            let buffer = self.buffer, offset = self.offset
            try Self.options(buffer, start: start, offset: offset, from: 16, to: length - 4, bigEndian: bigEndian) { code, range throws(CaptureFormatError) in
                switch code {
                case 2: interface.name = String(decoding: buffer[range].prefix { $0 != 0 }, as: UTF8.self)
                case 3: interface.description = String(decoding: buffer[range].prefix { $0 != 0 }, as: UTF8.self)
                case 9 where range.count >= 1:
                    let value = buffer[range.lowerBound]
                    let exponent = Int(value & 0x7F)
                    if value & 0x80 == 0 {
                        guard exponent <= 18 else { throw CaptureFormatError(.badField, offset: offset, "if_tsresol 10^-\(exponent) is finer than this reader takes") }
                        interface.unitsPerSecond = (0..<exponent).reduce(1) { value, _ in value * 10 }
                    } else {
                        guard exponent <= 62 else { throw CaptureFormatError(.badField, offset: offset, "if_tsresol 2^-\(exponent) is finer than this reader takes") }
                        interface.unitsPerSecond = 1 << UInt64(exponent)
                    }
                case 14 where range.count >= 8:
                    var value: UInt64 = 0
                    for index in 0..<8 {
                        let shift = bigEndian ? UInt64(56 - 8 * index) : UInt64(8 * index)
                        value |= UInt64(buffer[range.lowerBound + index]) << shift
                    }
                    interface.offsetSeconds = Int64(bitPattern: value)
                default: break
                }
            }
            interfaces.append(interface)
            return nil
        case 6, 2: // enhanced packet, obsolete packet
            guard length >= 32 else { throw CaptureFormatError(.badLength, offset: offset + 4, "packet block of \(length) bytes; it needs at least 32") }
            let interface = type == 6 ? Int(u32(8, bigEndian: bigEndian)) : Int(u16(8, bigEndian: bigEndian))
            guard interface < interfaces.count else {
                throw CaptureFormatError(.badField, offset: offset + 8, "a packet on interface \(interface), which no interface description block declared before it")
            }
            let captured = Int(u32(20, bigEndian: bigEndian)), original = Int(u32(24, bigEndian: bigEndian))
            let padded = captured + (4 - captured % 4) % 4
            guard captured <= length - 32, padded <= length - 32 else {
                throw CaptureFormatError(.badLength, offset: offset + 20, "a packet of \(captured) captured bytes in a block of \(length): the lengths disagree")
            }
            var direction = PacketDirection.unknown
            let buffer = self.buffer
            try Self.options(buffer, start: start, offset: offset, from: 28 + padded, to: length - 4, bigEndian: bigEndian) { code, range throws(CaptureFormatError) in
                guard code == 2, range.count >= 4 else { return }
                let flags = bigEndian ? UInt32(buffer[range.upperBound - 1]) : UInt32(buffer[range.lowerBound])
                switch flags & 3 {
                case 1: direction = .inbound
                case 2: direction = .outbound
                default: break
                }
            }
            let stamp = UInt64(u32(12, bigEndian: bigEndian)) << 32 | UInt64(u32(16, bigEndian: bigEndian))
            let units = interfaces[interface].unitsPerSecond
            let fraction = stamp % units
            let nanoseconds = units >= 1_000_000_000 ? fraction / (units / 1_000_000_000) : fraction * (1_000_000_000 / units)
            packets += 1
            return Packet(number: packets, interface: interface, linkType: interfaces[interface].linkType,
                          seconds: Int64(truncatingIfNeeded: stamp / units) &+ interfaces[interface].offsetSeconds,
                          nanoseconds: Int(nanoseconds), data: Array(buffer[(start + 28)..<(start + 28 + captured)]),
                          originalLength: max(original, captured), direction: direction, isBigEndian: bigEndian)
        case 3: // simple packet
            guard length >= 16 else { throw CaptureFormatError(.badLength, offset: offset + 4, "simple packet block of \(length) bytes; it needs at least 16") }
            guard !interfaces.isEmpty else {
                throw CaptureFormatError(.badField, offset: offset, "a simple packet block before any interface description block")
            }
            let original = Int(u32(8, bigEndian: bigEndian))
            let captured = min(original, length - 16)
            packets += 1
            return Packet(number: packets, interface: 0, linkType: interfaces[0].linkType, seconds: 0, nanoseconds: 0,
                          data: Array(buffer[(start + 12)..<(start + 12 + captured)]), originalLength: max(original, captured),
                          direction: .unknown, isBigEndian: bigEndian)
        default:
            return nil
        }
    }

    /// Walks the options between `from` and `to` (offsets in the block), each checked to lie inside.
    private static func options(_ buffer: [UInt8], start: Int, offset: Int, from: Int, to end: Int, bigEndian: Bool,
                                _ body: (UInt16, Range<Int>) throws(CaptureFormatError) -> Void) throws(CaptureFormatError) {
        func u16(_ at: Int) -> UInt16 {
            let a = UInt16(buffer[start + at]), b = UInt16(buffer[start + at + 1])
            return bigEndian ? a << 8 | b : b << 8 | a
        }
        var at = from
        while at + 4 <= end {
            let code = u16(at), length = Int(u16(at + 2))
            if code == 0 { return }
            let padded = length + (4 - length % 4) % 4
            guard at + 4 + padded <= end else {
                throw CaptureFormatError(.badLength, offset: offset + at + 2, "option \(code) of \(length) bytes runs past the end of its block: the file is damaged")
            }
            try body(code, (start + at + 4)..<(start + at + 4 + length))
            at += 4 + padded
        }
    }
}
