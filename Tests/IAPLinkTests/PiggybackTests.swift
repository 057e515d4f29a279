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
