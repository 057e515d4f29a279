internal import IAPWire
internal import Synchronization

/// Encodes pcapng blocks (little-endian): a section header, interface descriptions and enhanced
/// packets, as the pcapng specification (IETF draft-ietf-opsawg-pcapng) lays them out.
public enum PcapngWriter {
    /// The section header block that starts a file.
    public static func sectionHeader(application: String) -> [UInt8] {
        var body: [UInt8] = []
        body.appendUInt32LE(0x1A2B_3C4D) // byte-order magic
        body.appendUInt16LE(1) // major version
        body.appendUInt16LE(0) // minor version
        body.appendUInt64LE(UInt64.max) // section length: not given (-1)
        var options: [UInt8] = []
        appendOption(4, Array(application.utf8), to: &options) // shb_userappl
        appendEndOfOptions(to: &options)
        return block(type: 0x0A0D_0D0A, body: body + options)
    }

    /// An interface description block: `linkType`, no snapshot limit, nanosecond timestamps,
    /// the interface's name and description.
    public static func interfaceDescription(linkType: UInt16, name: String, description: String) -> [UInt8] {
        var body: [UInt8] = []
        body.appendUInt16LE(linkType)
        body.appendUInt16LE(0) // reserved
        body.appendUInt32LE(0) // snaplen: no limit
        var options: [UInt8] = []
        appendOption(2, Array(name.utf8), to: &options) // if_name
        appendOption(3, Array(description.utf8), to: &options) // if_description
        appendOption(9, [9], to: &options) // if_tsresol: 10^-9 s
        appendEndOfOptions(to: &options)
        return block(type: 1, body: body + options)
    }

    /// An enhanced packet block on interface `interface`, stamped `nanoseconds` since the epoch,
    /// with the direction in `epb_flags` (inbound: from the accessory).
    public static func enhancedPacket(interface: UInt32, nanoseconds: UInt64, packet: [UInt8], originalLength: Int? = nil,
                                      inbound: Bool) -> [UInt8] {
        var body: [UInt8] = []
        body.appendUInt32LE(interface)
        body.appendUInt32LE(UInt32(truncatingIfNeeded: nanoseconds >> 32))
        body.appendUInt32LE(UInt32(truncatingIfNeeded: nanoseconds))
        body.appendUInt32LE(UInt32(packet.count))
        body.appendUInt32LE(UInt32(max(packet.count, originalLength ?? 0)))
        body += packet
        body += [UInt8](repeating: 0, count: (4 - packet.count % 4) % 4)
        var flags: [UInt8] = []
        flags.appendUInt32LE(inbound ? 1 : 2)
        appendOption(2, flags, to: &body) // epb_flags: direction
        appendEndOfOptions(to: &body)
        return block(type: 6, body: body)
    }

    private static func block(type: UInt32, body: [UInt8]) -> [UInt8] {
        let total = UInt32(12 + body.count)
        var out: [UInt8] = []
        out.reserveCapacity(Int(total))
        out.appendUInt32LE(type)
        out.appendUInt32LE(total)
        out += body
        out.appendUInt32LE(total)
        return out
    }

    private static func appendOption(_ code: UInt16, _ value: [UInt8], to out: inout [UInt8]) {
        let value = value.prefix(0xFFF0)
        out.appendUInt16LE(code)
        out.appendUInt16LE(UInt16(value.count))
        out += value
        out += [UInt8](repeating: 0, count: (4 - value.count % 4) % 4)
    }

    private static func appendEndOfOptions(to out: inout [UInt8]) {
        out += [0, 0, 0, 0]
    }
}

/// A trace in pcapng: every frame of every traced accessory, in both directions, with its time,
/// direction and wire, one pcapng interface per traced transport. What `--trace-file FILE.pcapng`
/// writes, for Wireshark with `tools/clients/wireshark/iap.lua`.
///
/// Bytes are handed over as they cross the wire (a received chunk may hold part of a frame or
/// several); each direction of each interface is scanned on its own so that every packet of the
/// file is one whole frame, and bytes the scanner drops are recorded as such (with the reason).
/// It holds at most one frame per direction per interface. Safe to use from any thread.
public final class PcapngTraceRecorder: Sendable {
    private struct Stream {
        var scanner = FrameScanner()
        /// The stream offset of the first byte of `recent`.
        var recentOffset = 0
        /// The bytes fed last and those still pending before them: where dropped bytes are taken from.
        var recent: [UInt8] = []
    }
    private struct State {
        var interfaces: [CaptureTransport] = []
        var streams: [Int: Stream] = [:]
    }

    private let state = Mutex(State())
    private let write: @Sendable ([UInt8]) -> Void
    private let clock: @Sendable () -> UInt64

    /// Starts a trace: writes the section header at once.
    ///
    /// - Parameters:
    ///   - application: the program named in the file's section header.
    ///   - clock: nanoseconds since the Unix epoch, for each packet's time stamp.
    ///   - write: takes each block's bytes in file order (called under a lock: keep it short).
    public init(application: String, clock: @escaping @Sendable () -> UInt64, write: @escaping @Sendable ([UInt8]) -> Void) {
        self.write = write
        self.clock = clock
        write(PcapngWriter.sectionHeader(application: application))
    }

    /// Declares a traced accessory's wire; returns its interface number for ``record(_:_:on:)``.
    public func addInterface(name: String, description: String, transport: CaptureTransport) -> Int {
        state.withLock { state in
            state.interfaces.append(transport)
            write(PcapngWriter.interfaceDescription(linkType: CaptureLinkType.iap, name: name, description: description))
            return state.interfaces.count - 1
        }
    }

    /// Records bytes that crossed interface `interface`'s wire going `direction`: each frame they
    /// complete becomes a packet, and so does each run of dropped bytes. Native-pipe interfaces'
    /// bytes are recorded as they come, unscanned.
    public func record(_ direction: CaptureDirection, _ bytes: [UInt8], on interface: Int) {
        guard !bytes.isEmpty else { return }
        let time = clock()
        state.withLock { state in
            guard interface >= 0, interface < state.interfaces.count else { return }
            let transport = state.interfaces[interface]
            if transport == .nativePipe {
                emit(IAPCaptureHeader(direction: direction, transport: transport, content: .nativeData), bytes, interface: interface, time: time)
                return
            }
            let key = interface * 2 + Int(direction.rawValue)
            var stream = state.streams[key] ?? Stream()
            // `recent` holds the scanner's partial frame (the tail of the stream so far): add the new bytes.
            stream.recent += bytes
            let recent = stream.recent, recentOffset = stream.recentOffset
            stream.scanner.scan(bytes.span.bytes, onFrame: { frame, span in
                let packet = span.withUnsafeBytes { Array($0[frame.range]) }
                emit(IAPCaptureHeader(direction: direction, transport: transport), packet, interface: interface, time: time)
            }, onDrop: { drop in
                let start = max(0, drop.streamOffset - recentOffset)
                let end = min(recent.count, drop.streamOffset + drop.byteCount - recentOffset)
                let kept = start < end ? Array(recent[start..<end]) : []
                emit(IAPCaptureHeader(direction: direction, transport: transport, content: .dropped,
                                      dropReason: IAPCaptureHeader.code(of: drop.reason.kind)),
                     kept, originalLength: IAPCaptureHeader.size + drop.byteCount, interface: interface, time: time)
            })
            // Forget what the scanner no longer holds.
            let still = stream.scanner.pendingByteCount
            stream.recentOffset += stream.recent.count - still
            stream.recent = Array(stream.recent.suffix(still))
            state.streams[key] = stream
        }
    }

    private func emit(_ header: IAPCaptureHeader, _ bytes: [UInt8], originalLength: Int? = nil, interface: Int, time: UInt64) {
        write(PcapngWriter.enhancedPacket(interface: UInt32(interface), nanoseconds: time, packet: header.bytes + bytes,
                                          originalLength: originalLength, inbound: header.direction == .accessoryToHost))
    }
}

extension Array where Element == UInt8 {
    mutating func appendUInt16LE(_ value: UInt16) {
        append(UInt8(truncatingIfNeeded: value))
        append(UInt8(truncatingIfNeeded: value >> 8))
    }

    mutating func appendUInt32LE(_ value: UInt32) {
        appendUInt16LE(UInt16(truncatingIfNeeded: value))
        appendUInt16LE(UInt16(truncatingIfNeeded: value >> 16))
    }

    mutating func appendUInt64LE(_ value: UInt64) {
        appendUInt32LE(UInt32(truncatingIfNeeded: value))
        appendUInt32LE(UInt32(truncatingIfNeeded: value >> 32))
    }
}
