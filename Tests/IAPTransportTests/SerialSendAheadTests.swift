import Testing
import TestSupport
import TestThreads

/// `sendAhead`: a bare ACK goes out at the next frame boundary, ahead of data packets waiting
/// behind it, and never ahead of anything else. Pty pairs and their helpers are the ones of
/// SerialTransportTests.swift; the tests wait on queues and the pty, each on a thread of its own.
@Suite("SerialTransport: bare ACKs sent ahead", .serialized, .ownThread)
struct SerialSendAheadTests {
    /// An iAP2-shaped packet of `payload` bytes on link session `session` (0 with `syn`: a
    /// control packet); checksums are not looked at by the transport.
    private static func packet(_ number: Int, payload: Int, session: UInt8 = 10, syn: Bool = false) -> [UInt8] {
        let length = 9 + payload + (payload > 0 ? 1 : 0)
        return [0xFF, 0x5A, UInt8(length >> 8), UInt8(length & 0xFF), syn ? 0x80 : 0x40, UInt8(number), 0, syn ? 0 : session, 0]
            + bytes(length - 9, from: number * 65_536) { patternByte($0, seed: 5) }
    }

    static let bareAck: [UInt8] = [0xFF, 0x5A, 0x00, 0x09, 0x40, 0x2B, 0x07, 0x00, 0x00]

    /// Where `ack` must land: right after the frame the kernel cut short (`written` bytes of
    /// `frames` went out at once), or right there when it stopped at a boundary.
    private static func expected(_ frames: [[UInt8]], written: Int, ack: [UInt8]) -> [UInt8] {
        var result: [UInt8] = []
        var inserted = false
        for frame in frames {
            if !inserted, result.count >= written {
                result += ack
                inserted = true
            }
            result += frame
        }
        return inserted ? result : result + ack
    }

    /// A bare ACK sent while a window of data waits goes out right after the frame being
    /// written, not behind the window (issue 34): the peer hears it long before the data.
    @Test func aBareAckGoesAheadOfWaitingDataAtTheNextFrameBoundary() throws {
        let (_, writer, reader) = try makePair()
        writer.activate()
        let frames = (0..<8).map { Self.packet($0, payload: 60_000) }
        let total = frames.reduce(0) { $0 + $1.count }
        // The reader is not reading: the kernel takes a little, the rest waits.
        writer.send(frames)
        let written = total - writer.pendingOutputBytes
        try #require(written < total - 2 * frames[0].count, "the pty holds far less than 8 packets")
        _ = writer.run { $0.sendAhead(Self.bareAck) }
        reader.activate()
        #expect(reader.recorder.wait { $0.bytes.count >= total + Self.bareAck.count })
        let expected = Self.expected(frames, written: written, ack: Self.bareAck)
        #expect(difference(reader.recorder.snapshot.bytes, expected) == nil, "the ACK right after the frame under way (\(written) bytes went at once)")
        // With nothing waiting, it goes out in order.
        _ = writer.run { $0.sendAhead(Self.bareAck) }
        #expect(reader.recorder.wait { $0.bytes.count >= total + 2 * Self.bareAck.count })
        #expect(Array(reader.recorder.snapshot.bytes.suffix(Self.bareAck.count)) == Self.bareAck)
        cancelBoth(writer, reader)
    }

    /// A bare ACK never overtakes anything but data: with a SYN (or any frame that is not a data
    /// packet) waiting, it keeps its place, or the peer would see the ACK before the SYN it
    /// answers and start the link over.
    @Test func aBareAckDoesNotOvertakeAWaitingSYN() throws {
        let (_, writer, reader) = try makePair()
        writer.activate()
        var frames = (0..<6).map { Self.packet($0, payload: 60_000) }
        frames.insert(Self.packet(99, payload: 10, syn: true), at: 3)
        let total = frames.reduce(0) { $0 + $1.count }
        writer.send(frames)
        let written = total - writer.pendingOutputBytes
        try #require(written < frames[0].count + frames[1].count + frames[2].count, "the SYN must still be waiting")
        _ = writer.run { $0.sendAhead(Self.bareAck) }
        reader.activate()
        #expect(reader.recorder.wait { $0.bytes.count >= total + Self.bareAck.count })
        #expect(difference(reader.recorder.snapshot.bytes, Array(frames.joined()) + Self.bareAck) == nil, "in order, behind the SYN")
        cancelBoth(writer, reader)
    }
}
