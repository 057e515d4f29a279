import AccessorySimulator

/// The host side of the firmware-update protocol, written from its documentation: framing
/// `type u8 | length u32 BE | body`, BEGIN 0x01, CHUNK 0x02, END 0x03 from the host; READY 0x81,
/// ACK 0x82, DONE 0x83, ERROR 0x8F from the accessory.
struct FirmwareClient {
    struct Message: Equatable {
        var type: UInt8
        var body: [UInt8]
        var value: UInt32 { body.count >= 4 ? be32(body, 0) : 0 }
    }

    private var inbound: [UInt8] = []
    private(set) var messages: [Message] = []

    /// Parses what the accessory sent, across any split.
    mutating func feed(_ bytes: [UInt8]) {
        inbound += bytes
        while inbound.count >= 5 {
            let length = Int(be32(inbound, 1))
            guard inbound.count >= 5 + length else { break }
            messages.append(Message(type: inbound[0], body: Array(inbound[5..<(5 + length)])))
            inbound.removeFirst(5 + length)
        }
    }

    func all(_ type: UInt8) -> [Message] { messages.filter { $0.type == type } }
    func first(_ type: UInt8) -> Message? { messages.first { $0.type == type } }

    static func frame(_ type: UInt8, _ body: [UInt8]) -> [UInt8] {
        [type] + u32(body.count) + body
    }

    static func begin(size: Int, crc: UInt32, version: String) -> [UInt8] {
        frame(0x01, u32(size) + u32(Int(crc)) + Array(version.utf8))
    }

    static func chunk(offset: Int, _ data: ArraySlice<UInt8>) -> [UInt8] {
        frame(0x02, u32(offset) + data)
    }

    static let end = frame(0x03, [])

    /// CHUNKs of `size` bytes covering `image`, then END.
    static func chunksAndEnd(_ image: [UInt8], chunkSize: Int) -> [UInt8] {
        var bytes: [UInt8] = []
        var offset = 0
        while offset < image.count {
            let upper = min(offset + chunkSize, image.count)
            bytes += chunk(offset: offset, image[offset..<upper])
            offset = upper
        }
        return bytes + end
    }

    static func u32(_ value: Int) -> [UInt8] {
        let v = UInt32(truncatingIfNeeded: value)
        return [UInt8(truncatingIfNeeded: v >> 24), UInt8(truncatingIfNeeded: v >> 16), UInt8(truncatingIfNeeded: v >> 8), UInt8(truncatingIfNeeded: v)]
    }
}

func be32(_ bytes: [UInt8], _ offset: Int) -> UInt32 {
    UInt32(bytes[offset]) << 24 | UInt32(bytes[offset + 1]) << 16 | UInt32(bytes[offset + 2]) << 8 | UInt32(bytes[offset + 3])
}

extension SimHarness {
    /// Writes `outgoing` as the device takes it and feeds what arrives to `client`, until
    /// `condition` holds for the client.
    @discardableResult
    mutating func exchange(_ session: UInt16, _ outgoing: [UInt8], client: inout FirmwareClient,
                           within: Duration = .seconds(60), until condition: (FirmwareClient) -> Bool) throws -> Bool {
        var sent = 0
        let limit = now + within
        return try run(until: limit) { harness in
            sent = try harness.write(session, outgoing, from: sent)
            client.feed(harness.device.read(session))
            return sent == outgoing.count && condition(client)
        }
    }
}
