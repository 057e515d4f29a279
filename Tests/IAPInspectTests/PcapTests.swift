import IAPInspect
import IAPWire
import Synchronization
import TestSupport
import Testing

/// pcapng traces written by ``PcapngTraceRecorder``, read by ``PcapReader`` and decoded by
/// ``PcapDecoder``; classic pcap and usbmon records; damaged files give typed errors.
@Suite("pcap and pcapng")
struct PcapTests {
    static func syn() throws -> [UInt8] {
        try LinkPacket.encode(control: .syn, sequence: 1, acknowledgement: 0, sessionID: 0,
                              payload: bytes("01 08 10 00 03 E8 00 14 1E 04 01 00 01 02 02 01"))
    }

    static func identification() throws -> [UInt8] {
        let message = ControlMessage(id: .identificationInformation, parameters: [.string(0, "Trace Box"), .string(3, "TB-1")])
        return try LinkPacket.encode(control: .ack, sequence: 2, acknowledgement: 1, sessionID: 1, payload: try message.encoded())
    }

    /// A trace: the recorder fed in awkward chunks (a frame split in two, two frames in one chunk, garbage).
    static func trace() throws -> [UInt8] {
        let file = Mutex<[UInt8]>([])
        let tick = Atomic<UInt64>(0)
        let recorder = PcapngTraceRecorder(application: "tests", clock: { tick.add(1_000, ordering: .relaxed).newValue },
                                           write: { bytes in file.withLock { $0 += bytes } })
        let usb = recorder.addInterface(name: "usb 1-1", description: "iAP accessory on USB", transport: .usb)
        let serial = recorder.addInterface(name: "/dev/ttyUSB0", description: "iAP accessory on serial", transport: .serial)
        let syn = try syn(), ident = try identification()
        recorder.record(.accessoryToHost, IAP2Detect.bytes, on: usb)
        recorder.record(.accessoryToHost, Array(syn[0..<5]), on: usb)
        recorder.record(.accessoryToHost, Array(syn[5...]) + ident, on: usb)
        recorder.record(.hostToAccessory, [0x00, 0x01, 0x02], on: usb)
        recorder.record(.hostToAccessory, syn, on: usb)
        recorder.record(.accessoryToHost, try IAP1Packet(lingo: 0, command: 0x38, transactionID: 0, payload: []).encoded(), on: serial)
        return file.withLock { $0 }
    }

    static func decodeAll(_ file: [UInt8], pieceSize: Int) throws -> [FrameReport] {
        var decoder = PcapDecoder()
        var reports: [FrameReport] = []
        var offset = 0
        while offset < file.count {
            let end = min(file.count, offset + pieceSize)
            let piece = Array(file[offset..<end])
            try decoder.feed(piece.span.bytes) { reports.append($0) }
            offset = end
        }
        try decoder.finish { reports.append($0) }
        return reports
    }

    @Test("a trace reads back frame by frame, with direction, interface and transport, in pieces of any size")
    func traceReadsBack() throws {
        let file = try Self.trace()
        let whole = try Self.decodeAll(file, pieceSize: file.count)
        #expect(whole.map { $0.json["kind"] } == ["detect", "iap2", "iap2", "dropped", "iap2", "iap1"].map { JSONValue.string($0) })
        #expect(whole.map { $0.json["record"] } == (1...6).map { JSONValue.int($0) })
        #expect(whole[0].json["direction"] == .string("in"))
        #expect(whole[3].json["direction"] == .string("out"))
        #expect(whole[3].json["reason"] == .string("garbage"))
        #expect(whole[3].json["length"] == .int(3))
        #expect(whole[5].json["interface"] == .int(1))
        #expect(whole[5].json["transport"] == .string("serial"))
        #expect(whole[5].json["interfaceName"] == .string("/dev/ttyUSB0"))
        #expect(whole[2].text().contains("IdentificationInformation"))
        #expect(whole[0].json["timestamp"] == .string("0.000001000"))
        for size in [1, 3, 7, 64] {
            let pieces = try Self.decodeAll(file, pieceSize: size)
            #expect(pieces.map { $0.json.serialized() } == whole.map { $0.json.serialized() }, "pieces of \(size) bytes")
        }
    }

    @Test("the reader takes both byte orders of classic pcap and nanosecond stamps")
    func classicPcap() throws {
        for bigEndian in [false, true] {
            var file: [UInt8] = []
            func u32(_ v: UInt32) { file += bigEndian ? [UInt8(v >> 24), UInt8(v >> 16 & 0xFF), UInt8(v >> 8 & 0xFF), UInt8(v & 0xFF)]
                : [UInt8(v & 0xFF), UInt8(v >> 8 & 0xFF), UInt8(v >> 16 & 0xFF), UInt8(v >> 24)] }
            func u16(_ v: UInt16) { file += bigEndian ? [UInt8(v >> 8), UInt8(v & 0xFF)] : [UInt8(v & 0xFF), UInt8(v >> 8)] }
            u32(0xA1B2_3C4D); u16(2); u16(4); u32(0); u32(0); u32(65535); u32(147)
            let packet = IAPCaptureHeader(direction: .accessoryToHost, transport: .serial).bytes + IAP2Detect.bytes
            u32(12); u32(345); u32(UInt32(packet.count)); u32(UInt32(packet.count))
            file += packet
            var reader = PcapReader()
            reader.append(file.span.bytes)
            let read = try #require(try reader.next())
            #expect(read.seconds == 12 && read.nanoseconds == 345 && read.linkType == 147 && read.data == packet && read.isBigEndian == bigEndian)
            #expect(try reader.next() == nil)
            try reader.finish()
        }
    }

    @Test("lying lengths, truncation and garbage give typed errors")
    func damagedFiles() throws {
        let file = try Self.trace()
        func error(_ bytes: [UInt8]) -> CaptureFormatError? {
            var reader = PcapReader()
            reader.append(bytes.span.bytes)
            do {
                while try reader.next() != nil {}
                try reader.finish()
                return nil
            } catch {
                return error
            }
        }
        #expect(error(Array("not a capture at all".utf8))?.kind == .notACapture)
        #expect(error([])?.kind == .notACapture)
        #expect(error(Array(file.dropLast(5)))?.kind == .truncated)
        let shb = Int(file[4]) | Int(file[5]) << 8 // the section header's length: the interface block follows
        var lying = file
        lying[shb + 4] = 0xFF // the interface block's length
        #expect(error(lying)?.kind == .badLength || error(lying)?.kind == .tooLong)
        var huge = file
        huge[shb + 4 ..< shb + 8] = [0x00, 0x00, 0x00, 0x7F] // 2 GiB
        #expect(error(huge)?.kind == .tooLong)
        var odd = file
        odd[shb + 4] = 0x15 // not a multiple of 4
        #expect(error(odd)?.kind == .badLength)
        // A packet on an interface nobody declared.
        var stray = file
        let first = shb + (Int(file[shb + 4]) | Int(file[shb + 5]) << 8)
        let second = first + (Int(file[first + 4]) | Int(file[first + 5]) << 8)
        stray[second + 8] = 9
        #expect(error(stray)?.kind == .badField)
        // Random damage never crashes: every outcome is packets or a typed error.
        var random = SplitMix64(seed: 21)
        for _ in 0..<500 {
            var damaged = file
            for _ in 0..<Int.random(in: 1...4, using: &random) {
                damaged[Int.random(in: 0..<damaged.count, using: &random)] = UInt8.random(in: 0...255, using: &random)
            }
            var decoder = PcapDecoder()
            _ = try? decoder.feed(damaged.span.bytes) { _ in }
            _ = try? decoder.finish { _ in }
        }
    }

    @Test("usbmon: iAP endpoints learned from the configuration descriptor, frames reassembled across transfers")
    func usbmon() throws {
        func record(_ urb: UInt64, _ event: Character, _ type: UInt8, _ endpoint: UInt8, data: [UInt8] = [], setup: [UInt8]? = nil) -> [UInt8] {
            var r: [UInt8] = []
            for i in 0..<8 { r.append(UInt8(truncatingIfNeeded: urb >> (8 * UInt64(i)))) }
            r += [UInt8(ascii: Unicode.Scalar(String(event))!), type, endpoint, 7, 1, 0, setup == nil ? 0x2D : 0, data.isEmpty ? 0x3C : 0]
            r += [UInt8](repeating: 0, count: 8 + 4 + 4) // seconds, microseconds, status
            for value in [UInt32(data.count), UInt32(data.count)] { r += [UInt8(value & 0xFF), UInt8(value >> 8 & 0xFF), UInt8(value >> 16 & 0xFF), UInt8(value >> 24)] }
            r += setup ?? [UInt8](repeating: 0, count: 8)
            return r + data
        }
        let config: [UInt8] = [9, 2, 32, 0, 1, 1, 0, 0x80, 50, 9, 4, 0, 0, 2, 0xFF, 0xF0, 0x00, 0, 7, 5, 0x81, 2, 0, 2, 0, 7, 5, 0x01, 2, 0, 2, 0]
        let ident = try Self.identification()
        let records = [
            record(1, "S", 2, 0x80, setup: [0x80, 6, 0, 2, 0, 0, 32, 0]),
            record(1, "C", 2, 0x80, data: config),
            record(2, "C", 3, 0x81, data: Array(ident[0..<30])),
            record(3, "C", 3, 0x81, data: Array(ident[30...])),
            record(4, "S", 3, 0x02, data: [0xFF, 0x5A, 0x00]), // an endpoint of no iAP interface
        ]
        var file: [UInt8] = [0xD4, 0xC3, 0xB2, 0xA1, 2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4, 0, 189, 0, 0, 0]
        for r in records {
            file += [0, 0, 0, 0, 0, 0, 0, 0]
            let n = UInt32(r.count)
            for _ in 0..<2 { file += [UInt8(n & 0xFF), UInt8(n >> 8 & 0xFF), UInt8(n >> 16 & 0xFF), UInt8(n >> 24)] }
            file += r
        }
        var decoder = PcapDecoder()
        var reports: [FrameReport] = []
        try decoder.feed(file.span.bytes) { reports.append($0) }
        try decoder.finish { reports.append($0) }
        #expect(reports.count == 1)
        #expect(reports.first?.json["record"] == .int(4))
        #expect(reports.first?.text().contains("\"Trace Box\"") == true)
        #expect(reports.first?.json["usb"]?["endpoint"] == .int(0x81))
        #expect(decoder.statistics.otherTransfers == 1)
        #expect(decoder.isClean)
        // A record shorter than its usbmon header is reported, and the rest goes on.
        #expect(throws: CaptureFormatError.self) { _ = try USBMonRecord.decode([1, 2, 3], memoryMapped: false, bigEndian: false) }
    }
}
