import IAPLink
import IAPWire
import Testing

/// A sink that takes nothing (a reader whose buffer is full).
private struct FullSink: LinkSink {
    mutating func accept(sessionID: UInt8, payload: RawSpan) -> Bool { false }
}

/// Acknowledgements ride on data: where data goes out before the output is taken, a due ACK goes
/// with it; a bare ACK goes only when nothing carries it (issue 34).
@Suite("Acknowledgements ride on data")
struct PiggybackTests {
    /// The accessory's link session for data (the first of its SYN's table).
    static let session = LinkConfiguration.accessory.parameters.sessions.first?.id ?? 1

    /// `count` data packets from the accessory, from sequence 0x02 on (its SYN was 0x01).
    static func accessoryData(count: Int) throws -> [UInt8] {
        var bytes: [UInt8] = []
        for index in 0..<count {
            bytes += try LinkPacket.encode(control: .ack, sequence: UInt8(2 + index), acknowledgement: 0x40, sessionID: session,
                                           payload: [UInt8](repeating: UInt8(index), count: 100))
        }
        return bytes
    }

    static func headers(_ frames: [[UInt8]]) throws -> [LinkPacketHeader] {
        try frames.map { try LinkPacketHeader.decode($0.span.bytes) }
    }

    @Test func anAckDueWhenDataGoesOutRidesOnIt() throws {
        var device = try NoisyLinkTests.connectedDevice()
        let limit = Int(try #require(device.negotiated).maxCumulativeAcks)
        var sink = NullSink()
        // As many packets as the accessory allows to go unacknowledged: an ACK is due.
        device.receive(try Self.accessoryData(count: limit), now: .zero, sink: &sink)
        #expect(sink.delivered.count == limit)
        #expect(device.hasOutput, "an ACK is owed")
        // The device answers with data before its output is taken (an echo's answer).
        let queued = device.send(sessionID: Self.session, payload: [1, 2, 3], now: .zero)
        #expect(queued)
        let frames = device.takeOutput()
        #expect(!frames.contains(where: LinkFrame.isBareAcknowledgement))
        let headers = try Self.headers(frames)
        #expect(headers.count == 1, "the data packet alone: \(headers)")
        #expect(headers.first?.payloadLength == 3)
        #expect(headers.first?.acknowledgement == UInt8(1 + limit), "it acknowledges every packet received")
        #expect(device.statistics.acksSent == 0)
        #expect(device.statistics.dataPacketsDelivered == limit)
        #expect(!device.hasOutput)
    }

    @Test func withNoDataTheAckGoesBareOnce() throws {
        var device = try NoisyLinkTests.connectedDevice()
        let limit = Int(try #require(device.negotiated).maxCumulativeAcks)
        var sink = NullSink()
        // Twice the limit in one receive: one ACK for the batch, not one per limit's worth.
        device.receive(try Self.accessoryData(count: 2 * limit), now: .zero, sink: &sink)
        let frames = device.takeOutput()
        #expect(frames.allSatisfy(LinkFrame.isBareAcknowledgement), "a byte stream may send it ahead of waiting data")
        let headers = try Self.headers(frames)
        #expect(headers.count == 1)
        #expect(headers.first?.payloadLength == 0)
        #expect(headers.first?.acknowledgement == UInt8(1 + 2 * limit))
        #expect(device.statistics.acksSent == 1)
        let rest = device.takeOutput()
        #expect(rest.isEmpty)
    }

    /// An echo in virtual time, each side answering in the turn it receives: every ACK rides on
    /// data but for the last few, on both sides (goal ≤ 0.1 bare ACKs per data packet).
    @Test func anEchoNeedsAlmostNoBareAcks() throws {
        var accessory = LinkConfiguration.accessory
        accessory.parameters.maxPacketLength = 4_096
        accessory.parameters.maxOutstandingPackets = 16
        accessory.parameters.maxCumulativeAcks = 4
        var pair = Pair(accessory: accessory)
        let id = try #require(try DataTests.openSessions(&pair, ["com.acme.data"]).first)
        let accessorySide = try #require(pair.accessory.sessions.first?.id)
        let before = (pair.device.link.statistics, pair.accessory.link.statistics)
        let total = 2 << 20
        var written = 0, echoed = 0, received = 0
        #expect(pair.run { pair in
            if written < total, let taken = try? pair.device.write(id, pattern(1, written, min(64 * 1_024, total - written)), now: pair.now) {
                written += taken
            }
            // The accessory echoes what it can send back at once.
            let chunk = pair.accessory.read(accessorySide, maxBytes: pair.accessory.spaceAvailable(accessorySide))
            if !chunk.isEmpty {
                _ = try? pair.accessory.write(accessorySide, chunk, now: pair.now)
                echoed += chunk.count
            }
            received += pair.device.read(id).count
            return received == total
        })
        let device = pair.device.link.statistics, accessorySide2 = pair.accessory.link.statistics
        let deviceAcks = device.acksSent - before.0.acksSent, devicePackets = device.dataPacketsDelivered - before.0.dataPacketsDelivered
        let accessoryAcks = accessorySide2.acksSent - before.1.acksSent
        let accessoryPackets = accessorySide2.dataPacketsDelivered - before.1.dataPacketsDelivered
        #expect(devicePackets > 20 && accessoryPackets > 400, "\(devicePackets) and \(accessoryPackets) data packets")
        #expect(Double(deviceAcks) <= 0.1 * Double(devicePackets), "device: \(deviceAcks) bare ACKs for \(devicePackets) packets")
        #expect(Double(accessoryAcks) <= 0.1 * Double(accessoryPackets), "accessory: \(accessoryAcks) bare ACKs for \(accessoryPackets) packets")
    }

    @Test func aRefusedPacketIsAcknowledgedOnlyWhenSentAgain() throws {
        var device = try NoisyLinkTests.connectedDevice()
        var full = FullSink()
        let packet = try Self.accessoryData(count: 1)
        device.receive(packet, now: .zero, sink: &full)
        #expect(device.statistics.refusedByReceiver == 1)
        let first = device.takeOutput()
        #expect(first.isEmpty, "the first refusal sends nothing")
        // The accessory's retransmission: now an ACK of what was taken tells it the host is alive.
        device.receive(packet, now: .milliseconds(1_000), sink: &full)
        let headers = try Self.headers(device.takeOutput())
        #expect(headers.map(\.payloadLength) == [0])
        #expect(headers.first?.acknowledgement == 0x01, "nothing new acknowledged")
        // The reader makes room: the parked packet is delivered and acknowledged.
        var sink = NullSink()
        device.redeliver(now: .milliseconds(1_001), sink: &sink)
        #expect(sink.delivered.count == 1)
        let after = try Self.headers(device.takeOutput())
        #expect(after.map(\.acknowledgement) == [0x02])
    }
}
