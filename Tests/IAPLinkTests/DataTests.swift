import ByteRing
import IAPLink
import IAPWire
import Testing
import TestThreads

/// Drives sessions through a pair: the device writes a pattern per session, the accessory reads
/// and checks every byte in order.
struct Transfer {
    var sessionIDs: [UInt16] = []
    var written: [UInt16: Int] = [:]
    var verified: [UInt16: Int] = [:]
    var mismatches = 0
    let total: Int
    let readChunk: Int

    init(total: Int, readChunk: Int = .max) {
        self.total = total
        self.readChunk = readChunk
    }

    var done: Bool { sessionIDs.allSatisfy { verified[$0, default: 0] >= total } }

    mutating func pump(_ pair: inout Pair, reading: Bool = true) {
        for (index, id) in sessionIDs.enumerated() {
            let offset = written[id, default: 0]
            if offset < total {
                let chunk = pattern(index, offset, min(256 * 1_024, total - offset))
                let taken = (try? pair.device.write(id, chunk, now: pair.now)) ?? 0
                written[id] = offset + taken
            }
            guard reading else { continue }
            while pair.accessory.bytesAvailable(id) > 0 {
                let bytes = pair.accessory.read(id, maxBytes: readChunk)
                let start = verified[id, default: 0]
                if bytes != pattern(index, start, bytes.count) { mismatches += 1 }
                verified[id] = start + bytes.count
                if readChunk != .max { break }
            }
        }
    }
}

/// Seconds of CPU each in a debug build (the 64 MiB transfer about 30 s, the long pause about
/// 18 s): each on a thread of its own (`.ownThread`), so that it does not hold one of the
/// cooperative pool's two threads, and every await of every other test behind it, for that long.
@Suite("iAP2 data transfer under loss, virtual time", .ownThread)
struct DataTests {
    static func openSessions(_ pair: inout Pair, _ names: [String]) throws -> [UInt16] {
        pair.start()
        #expect(pair.run { $0.identified })
        var ids: [UInt16] = []
        for name in names { ids.append(try pair.device.openSession(protocolName: name, now: pair.now)) }
        #expect(ids.allSatisfy { pair.device.sessionState($0) == .open }, "open once the start is sent")
        // The accessory has every start, and the device's link holds nothing of them.
        #expect(pair.run { pair in pair.accessory.sessions.count == ids.count && pair.device.link.inFlightCount == 0 })
        return ids
    }

    /// 64 MiB through four sessions at once over a channel that drops 5 % of the packets in
    /// each direction, duplicates, reorders and corrupts some: byte-exact and in order.
    @Test(.timeLimit(.minutes(5)))
    func sixtyFourMebibytesThroughFourSessionsAtFivePercentLoss() throws {
        var device = LinkConfiguration.device
        device.parameters.maxOutstandingPackets = 16
        var accessory = LinkConfiguration.accessory
        accessory.parameters.maxPacketLength = 65_535
        accessory.parameters.maxOutstandingPackets = 16
        accessory.parameters.retransmissionTimeout = 50
        accessory.parameters.cumulativeAckTimeout = 10
        var pair = Pair(device: device, accessory: accessory, seed: 2024, bufferLimit: 4 << 20)
        for channel in [\Pair.toAccessory, \Pair.toDevice] {
            pair[keyPath: channel].drop = 0.05
            pair[keyPath: channel].duplicate = 0.01
            pair[keyPath: channel].reorder = 0.02
            pair[keyPath: channel].corrupt = 0.005
        }
        var transfer = Transfer(total: 16 << 20)
        transfer.sessionIDs = try Self.openSessions(&pair, ["com.acme.fw", "com.acme.data", "com.acme.log", "com.acme.ctl"])
        let finished = pair.run(until: .seconds(3_600)) { pair in
            transfer.pump(&pair)
            return transfer.done
        }
        #expect(finished)
        #expect(transfer.mismatches == 0)
        #expect(transfer.sessionIDs.map { transfer.verified[$0] } == Array(repeating: 16 << 20, count: 4))
        #expect(pair.windowViolations == 0)
        let stats = pair.device.link.statistics
        #expect(stats.retransmissions > 0)     // the loss really happened…
        #expect(pair.device.link.state == .connected) // …and the link survived it
        // Sequence numbers wrapped many times: over a thousand packets were sent.
        #expect(stats.packetsSent > 1_000)
    }

    @Test("seeded channels of every kind", arguments: [
        (0.0, 0.0, 0.0, 0.0), (0.2, 0.0, 0.0, 0.0), (0.0, 0.3, 0.0, 0.0), (0.0, 0.0, 0.3, 0.0), (0.0, 0.0, 0.0, 0.1),
        (0.1, 0.1, 0.1, 0.05),
    ])
    func channelKinds(drop: Double, duplicate: Double, reorder: Double, corrupt: Double) throws {
        var pair = Pair(seed: UInt64(drop * 100 + duplicate * 10 + reorder * 1_000 + corrupt * 7))
        for channel in [\Pair.toAccessory, \Pair.toDevice] {
            pair[keyPath: channel].drop = drop
            pair[keyPath: channel].duplicate = duplicate
            pair[keyPath: channel].reorder = reorder
            pair[keyPath: channel].corrupt = corrupt
        }
        var transfer = Transfer(total: 300_000)
        transfer.sessionIDs = try Self.openSessions(&pair, ["com.acme.fw", "com.acme.data"])
        #expect(pair.run(until: .seconds(3_600)) { pair in
            transfer.pump(&pair)
            return transfer.done
        })
        #expect(transfer.mismatches == 0)
        #expect(pair.windowViolations == 0)
        if duplicate > 0 { #expect(pair.accessory.link.statistics.duplicatesReceived > 0) }
        if reorder > 0 { #expect(pair.accessory.link.statistics.outOfOrderReceived > 0) }
    }

    @Test func theLinkFailsAfterTheMaximumRetransmissions() throws {
        var accessory = LinkConfiguration.accessory
        accessory.parameters.maxRetransmissions = 3
        accessory.parameters.retransmissionTimeout = 100
        var pair = Pair(accessory: accessory)
        var transfer = Transfer(total: 10_000)
        transfer.sessionIDs = try Self.openSessions(&pair, ["com.acme.data"])
        // The accessory goes silent: nothing reaches it and nothing comes back.
        pair.toAccessory.blackHole = true
        pair.toDevice.blackHole = true
        transfer.pump(&pair)
        let silentSince = pair.now
        let failed = pair.run(until: pair.now + .seconds(10)) { pair in
            if case .failed(.maxRetransmissionsExceeded(_, let count)) = pair.device.link.state { return count <= 4 }
            return false
        }
        #expect(failed)
        // Four timeouts of 100 ms (the first send and three resends), give or take the first one's age.
        #expect(pair.now - silentSince <= .milliseconds(500), "failed after \(pair.now - silentSince)")
        // Sessions end with a reason, and the device says what happened.
        #expect(pair.deviceEvents.contains { if case .sessionClosed(_, "the link went down") = $0 { return true } else { return false } })
        #expect(pair.device.link.state.description.contains("stopped answering"))
    }

    /// Only one direction breaks: the accessory hears nothing, gives up, falls silent, and then
    /// the device gives up too.
    @Test func aOneWayBreakAlsoEndsTheLink() throws {
        var accessory = LinkConfiguration.accessory
        accessory.parameters.maxRetransmissions = 3
        accessory.parameters.retransmissionTimeout = 100
        var pair = Pair(accessory: accessory)
        var transfer = Transfer(total: 10_000)
        transfer.sessionIDs = try Self.openSessions(&pair, ["com.acme.data"])
        pair.toAccessory.blackHole = true
        transfer.pump(&pair)
        #expect(pair.run(until: pair.now + .seconds(60)) { pair in
            if case .failed(.maxRetransmissionsExceeded) = pair.device.link.state { return true }
            return false
        })
    }

    @Test func resetRenegotiatesAndIdentifiesAgain() throws {
        var pair = Pair()
        var transfer = Transfer(total: 50_000)
        transfer.sessionIDs = try Self.openSessions(&pair, ["com.acme.data"])
        #expect(pair.run { pair in
            transfer.pump(&pair)
            return transfer.done
        })
        pair.deviceEvents.removeAll()
        pair.accessoryEvents.removeAll()
        #expect(pair.device.link.statistics.linkResets == 0)
        pair.device.resetLink(now: pair.now)
        #expect(pair.run(until: pair.now + .seconds(10)) { pair in
            pair.device.identity != nil && pair.deviceEvents.contains { if case .identified = $0 { return true } else { return false } }
        })
        #expect(pair.device.link.state == .connected)
        #expect(pair.deviceEvents.contains { if case .sessionClosed(_, "the link went down") = $0 { return true } else { return false } })
        #expect(pair.device.sessions.isEmpty)
        // Counted once (iapd's iapd_link_resets_total), the negotiation that follows not again.
        #expect(pair.device.link.statistics.linkResets == 1)
    }

    @Test func sleepAndWake() throws {
        var pair = Pair()
        pair.start()
        #expect(pair.run { $0.identified })
        pair.device.suspendLink(now: pair.now)
        #expect(pair.run { $0.accessory.link.state == .sleeping })
        #expect(pair.device.link.state == .sleeping)
        pair.deviceEvents.removeAll()
        pair.accessory.wake(now: pair.now)
        #expect(pair.run(until: pair.now + .seconds(10)) { pair in
            pair.deviceEvents.contains { if case .identified = $0 { return true } else { return false } }
        })
        #expect(pair.device.link.state == .connected)
        #expect(pair.device.link.statistics.linkResets == 0, "a wake after sleep is not a reset")
    }

    /// A reader that stops reading: the accessory-side buffer fills to its limit and no further,
    /// the link refuses (does not acknowledge) what does not fit, and the writer is held back.
    /// When reading resumes, every byte arrives.
    @Test func aSlowReaderSlowsTheWriterInsteadOfGrowingMemory() throws {
        var pair = Pair(bufferLimit: 64 * 1_024)
        var transfer = Transfer(total: 1 << 20)
        transfer.sessionIDs = try Self.openSessions(&pair, ["com.acme.data"])
        let id = transfer.sessionIDs[0]
        var peak = 0
        pair.run(until: pair.now + .seconds(2)) { pair in
            transfer.pump(&pair, reading: false)
            peak = max(peak, pair.accessory.bytesAvailable(id))
            return false
        }
        #expect(peak <= 64 * 1_024)
        #expect(pair.accessory.bytesAvailable(id) > 0)
        #expect(pair.device.bytesPending(id) <= 64 * 1_024) // the writer's side is bounded too
        #expect(transfer.written[id, default: 0] < 1 << 20)  // and the writer was held back
        #expect(pair.accessory.link.statistics.refusedByReceiver > 0)
        #expect(pair.run(until: pair.now + .seconds(600)) { pair in
            transfer.pump(&pair)
            return transfer.done
        })
        #expect(transfer.mismatches == 0)
    }

    /// A reader that pauses for two minutes (far longer than retransmissions × timeout): the
    /// link stays up because the receiver keeps answering, and every byte arrives afterwards.
    @Test func aLongPauseIsBackPressureNotALinkFailure() throws {
        var pair = Pair(bufferLimit: 32 * 1_024)
        var transfer = Transfer(total: 512 * 1_024)
        transfer.sessionIDs = try Self.openSessions(&pair, ["com.acme.data"])
        let pauseEnds = pair.now + .seconds(120)
        pair.run(until: pauseEnds) { pair in
            transfer.pump(&pair, reading: false)
            return false
        }
        #expect(pair.device.link.state == .connected)
        #expect(pair.accessory.link.state == .connected)
        #expect(pair.run(until: pair.now + .seconds(600)) { pair in
            transfer.pump(&pair)
            return transfer.done
        })
        #expect(transfer.mismatches == 0)
    }

    @Test func closeWhileDataIsInFlight() throws {
        var pair = Pair()
        var transfer = Transfer(total: 500_000)
        transfer.sessionIDs = try Self.openSessions(&pair, ["com.acme.data", "com.acme.fw"])
        transfer.pump(&pair, reading: false)
        pair.device.closeSession(transfer.sessionIDs[0], now: pair.now)
        #expect(pair.run { pair in
            transfer.pump(&pair)
            return pair.accessory.sessions.count == 1 && transfer.verified[transfer.sessionIDs[1], default: 0] == 500_000
        })
        #expect(transfer.mismatches == 0)
    }
}

extension LinkState {
    var description: String {
        if case let .failed(failure) = self { return failure.description }
        return "\(self)"
    }
}

@Suite("Session ends")
struct SessionEndTests {
    @Test func bytesReceivedBeforeTheLinkWentDownStayReadable() throws {
        var pair = Pair()
        pair.start()
        #expect(pair.run { $0.identified })
        let id = try pair.device.openSession(protocolName: "com.acme.data", now: pair.now)
        #expect(pair.run { !$0.accessory.sessions.isEmpty })
        let accessorySide = try #require(pair.accessory.sessions.first?.id)
        _ = try pair.accessory.write(accessorySide, Array(repeating: 7, count: 5_000), now: pair.now)
        #expect(pair.run { $0.device.bytesAvailable(id) == 5_000 })
        pair.device.resetLink(now: pair.now)
        #expect(pair.device.sessionState(id) == .closed("the link went down"))
        #expect(throws: EndpointError.sessionNotOpen(id)) { _ = try pair.device.write(id, [1], now: pair.now) }
        #expect(pair.device.read(id) == Array(repeating: 7, count: 5_000))
        // The protocol can be opened again once identified again.
        #expect(pair.run(until: pair.now + .seconds(10)) { $0.device.identity != nil && $0.device.link.state == .connected })
        pair.device.closeSession(id, now: pair.now)
        #expect(pair.device.sessionState(id) == nil)
    }
}

@Suite("Bytes the peer acknowledged")
struct AcknowledgedBytesTests {
    /// What a sender can tell when a transfer breaks: how much of what it wrote the accessory's
    /// link acknowledged, exactly, in order, never more than it received.
    @Test func theCountFollowsTheAccessorysAcknowledgementsAndStopsWhenTheWireBreaks() throws {
        var accessory = LinkConfiguration.accessory
        accessory.parameters.maxRetransmissions = 3
        accessory.parameters.retransmissionTimeout = 100
        var pair = Pair(accessory: accessory)
        var transfer = Transfer(total: 200_000)
        transfer.sessionIDs = try DataTests.openSessions(&pair, ["com.acme.data", "com.acme.log"])
        let (data, log) = (transfer.sessionIDs[0], transfer.sessionIDs[1])
        #expect(pair.device.bytesAcknowledged(data) == 0)
        // Everything written on one session arrives: it is all acknowledged, and nothing is
        // credited to the other session.
        _ = try pair.device.write(data, pattern(1, 0, 100_000), now: pair.now)
        #expect(pair.run { $0.device.bytesAcknowledged(data) == 100_000 })
        #expect(pair.device.bytesAcknowledged(log) == 0)
        // The wire to the accessory breaks mid-transfer: the count stops at what got through.
        _ = try pair.device.write(data, pattern(1, 100_000, 100_000), now: pair.now)
        var received = 0
        _ = pair.run { pair in
            received += pair.accessory.read(data, maxBytes: 1 << 20).count
            if received >= 20_000 { pair.toAccessory.blackHole = true }
            return pair.toAccessory.blackHole
        }
        let before = pair.device.bytesAcknowledged(data)
        // Long enough for the accessory's delayed ACKs to come back, shorter than the 100 ms
        // after which the device retransmits into the void (and, 3 times later, gives up).
        _ = pair.run(until: pair.now + .milliseconds(60)) { _ in false }
        received += pair.accessory.read(data, maxBytes: 1 << 20).count
        let acknowledged = pair.device.bytesAcknowledged(data)
        #expect(pair.device.link.state == .connected)
        #expect(acknowledged >= before)
        #expect(acknowledged >= 100_000 && acknowledged < 200_000, "some but not all of the second write")
        #expect(acknowledged <= 100_000 + received, "never more than the accessory received")
    }
}

@Suite("Copies on the data plane")
struct CopyCountTests {
    /// Writes `total` bytes on one session and drains them at the accessory with `drain`.
    static func transfer(total: Int, drop: Double, transmitBuffers: PacketBufferPool? = nil,
                         drain: (inout IAP2Endpoint, UInt16) -> [UInt8]) throws
        -> (device: DataPlaneStatistics, accessory: DataPlaneStatistics, received: [UInt8], retransmissions: Int)
    {
        var accessory = LinkConfiguration.accessory
        accessory.parameters.maxPacketLength = 16_384
        accessory.parameters.retransmissionTimeout = 50
        var pair = Pair(device: .device, accessory: accessory, seed: 7, bufferLimit: 1 << 20)
        pair.device.transmitBuffers = transmitBuffers
        pair.toAccessory.drop = drop
        let id = try DataTests.openSessions(&pair, ["com.acme.fw"])[0]
        let data = pattern(0, 0, total)
        var written = 0
        var received: [UInt8] = []
        let finished = pair.run(until: .seconds(600)) { pair in
            if written < total {
                let rest = data[written...]
                written += (try? pair.device.write(id, span: rest.span.bytes, now: pair.now)) ?? 0
            }
            received += drain(&pair.accessory, id)
            return received.count >= total
        }
        #expect(finished)
        return (pair.device.dataPlane, pair.accessory.dataPlane, received, pair.device.link.statistics.retransmissions)
    }

    @Test("a byte written is copied once, into its packet; retransmissions copy nothing")
    func writesCopyOnce() throws {
        let (device, _, received, retransmissions) = try Self.transfer(total: 1 << 20, drop: 0.1) { endpoint, id in
            endpoint.read(id)
        }
        #expect(received == pattern(0, 0, 1 << 20))
        #expect(retransmissions > 0)
        #expect(device.bytesWritten == 1 << 20)
        #expect(device.bytesCopiedOut == 1 << 20)
    }

    @Test("with transmit buffers, long packets are laid out in them (the one copy), retransmitted from them, and the buffers come back")
    func transmitBuffersCarryTheData() throws {
        let pool = PacketBufferPool(count: 8, capacity: 65_536, allocator: nil)
        let (device, _, received, retransmissions) = try Self.transfer(total: 1 << 20, drop: 0.1, transmitBuffers: pool) { endpoint, id in
            endpoint.read(id)
        }
        #expect(received == pattern(0, 0, 1 << 20), "finished in place, retransmitted with newer acknowledgements, intact")
        #expect(retransmissions > 0)
        #expect(pool.taken > 0)
        #expect(pool.buffersInUse == 0, "every buffer back once acknowledged")
        #expect(device.bytesCopiedOut == 1 << 20, "still one copy: into the buffer instead of an array")
    }

    @Test("a packet the transport is still sending from its buffer is not rewritten or sent again until it is done")
    func aPendingBufferDefersItsRetransmission() throws {
        var accessory = LinkConfiguration.accessory
        accessory.parameters.retransmissionTimeout = 50
        accessory.parameters.maxPacketLength = 16_384 // the write is one packet
        var pair = Pair(device: .device, accessory: accessory, seed: 11)
        let pool = PacketBufferPool(count: 4, capacity: 65_536, allocator: nil)
        pair.device.transmitBuffers = pool
        let id = try DataTests.openSessions(&pair, ["com.acme.fw"])[0]
        #expect(pair.run { $0.device.link.inFlightCount == 0 && !$0.device.hasOutput }, "the control traffic is acknowledged first")
        let data = pattern(1, 0, 10_000)
        #expect(try pair.device.write(id, span: data.span.bytes, now: pair.now) == 10_000)
        var frames: [LinkFrame] = []
        pair.device.takeFrames(into: &frames)
        let sent = try #require(frames.compactMap { frame -> PacketBuffer? in
            if case let .buffer(buffer) = frame { return buffer.packet } else { return nil }
        }.first, "a 10,000-byte write goes out in a transmit buffer")
        let firstBytes = sent.copiedBytes()
        sent.pendingTransmissions += 1 // a transport that has not sent it yet (the wire is busy)
        let before = pair.device.link.statistics
        pair.now += .milliseconds(60)
        pair.device.advance(to: pair.now)
        #expect(pair.device.link.statistics.retransmissionsDeferred == before.retransmissionsDeferred + 1)
        #expect(pair.device.link.statistics.retransmissions == before.retransmissions)
        #expect(sent.copiedBytes() == firstBytes, "not rewritten under the transport")
        frames.removeAll()
        pair.device.takeFrames(into: &frames)
        #expect(!frames.contains { if case .buffer = $0 { true } else { false } }, "no duplicate queued behind the first")

        sent.pendingTransmissions -= 1 // sent, and lost
        pair.now += .milliseconds(60)
        pair.device.advance(to: pair.now)
        #expect(pair.device.link.statistics.retransmissions == before.retransmissions + 1)
        pair.device.takeFrames(into: &frames)
        let resent = try #require(frames.compactMap { frame -> PacketBuffer? in
            if case let .buffer(buffer) = frame { return buffer.packet } else { return nil }
        }.first, "sent again from its buffer")
        #expect(resent === sent, "sent again from the same buffer: no copy")
        for frame in frames { pair.accessory.receive(frame.copiedBytes(), now: pair.now) }
        #expect(pair.accessory.read(id, maxBytes: 1 << 20) == data, "the rewritten header is valid")
    }

    @Test("a packet whose timer runs out while the transport's queue is still moving waits; a queue that stopped moving gets the retransmission")
    func aMovingQueueDefersTheRetransmission() throws {
        var accessory = LinkConfiguration.accessory
        accessory.parameters.retransmissionTimeout = 50
        var pair = Pair(device: .device, accessory: accessory, seed: 12)
        let id = try DataTests.openSessions(&pair, ["com.acme.fw"])[0]
        #expect(pair.run { $0.device.link.inFlightCount == 0 && !$0.device.hasOutput }, "the control traffic is acknowledged first")
        // A byte stream that has written 1,000 bytes and holds 70,000 more (a slow line).
        pair.device.noteOutputProgress(TransportOutputProgress(queuedBytes: 70_000, writtenBytes: 1_000))
        let data = pattern(1, 0, 2_000)
        #expect(try pair.device.write(id, span: data.span.bytes, now: pair.now) == 2_000)
        let first = pair.device.takeOutput()
        #expect(!first.isEmpty)
        let before = pair.device.link.statistics

        // The timer runs out; the transport has written more since, and still has more queued.
        pair.now += .milliseconds(60)
        pair.device.noteOutputProgress(TransportOutputProgress(queuedBytes: 40_000, writtenBytes: 31_000))
        pair.device.advance(to: pair.now)
        #expect(pair.device.link.statistics.retransmissions == before.retransmissions)
        #expect(pair.device.link.statistics.retransmissionsDeferred > before.retransmissionsDeferred)
        #expect(pair.device.takeOutput().isEmpty, "nothing sent again while the packet is most likely still queued")

        // Its timer runs out again with nothing written since (the peer stopped reading): sent again.
        pair.now += .milliseconds(60)
        pair.device.noteOutputProgress(TransportOutputProgress(queuedBytes: 40_000, writtenBytes: 31_000))
        pair.device.advance(to: pair.now)
        #expect(pair.device.link.statistics.retransmissions > before.retransmissions)
        let again = pair.device.takeOutput()
        #expect(!again.isEmpty)

        // Once the queue is empty, the ordinary timer applies at once.
        pair.now += .milliseconds(60)
        pair.device.noteOutputProgress(TransportOutputProgress(queuedBytes: 0, writtenBytes: 200_000))
        let counted = pair.device.link.statistics.retransmissions
        pair.device.advance(to: pair.now)
        #expect(pair.device.link.statistics.retransmissions > counted)
        for frame in again { pair.accessory.receive(frame, now: pair.now) }
        #expect(pair.accessory.read(id, maxBytes: 1 << 20) == data)
    }

    @Test("bytes that arrive in an array are copied once by read() and never by borrow")
    func readsCopyOnceBorrowsNever() throws {
        let read = try Self.transfer(total: 1 << 20, drop: 0) { endpoint, id in endpoint.read(id) }
        #expect(read.accessory.bytesRead == 1 << 20)
        #expect(read.accessory.bytesCopiedIn == 1 << 20)

        let borrowed = try Self.transfer(total: 1 << 20, drop: 0) { endpoint, id in
            var bytes: [UInt8] = []
            while let chunk = endpoint.borrow(id, { span in
                (span.byteCount, span.withUnsafeBytes { Array($0) })
            }) {
                bytes += chunk
            }
            return bytes
        }
        #expect(borrowed.received == pattern(0, 0, 1 << 20))
        #expect(borrowed.accessory.bytesRead == 1 << 20)
        #expect(borrowed.accessory.bytesCopiedIn == 0)
    }

    @Test("bytes handed over as a view (a USB slot) are copied on arrival, then kept")
    func viewsAreCopiedOnArrival() throws {
        var pair = Pair(device: .device, accessory: .accessory, seed: 9, bufferLimit: 1 << 20)
        let id = try DataTests.openSessions(&pair, ["com.acme.fw"])[0]
        let before = pair.device.dataPlane
        let bytes = [UInt8](repeating: 7, count: 1_000)
        _ = try pair.accessory.write(id, span: bytes.span.bytes, now: pair.now)
        // Deliver the accessory's packets to the device as views, not arrays.
        for frame in pair.accessory.takeOutput() {
            pair.device.receive(frame.span.bytes, now: pair.now)
        }
        let delivered = pair.device.bytesAvailable(id)
        #expect(delivered == 1_000)
        #expect(pair.device.dataPlane.bytesCopiedIn - before.bytesCopiedIn == 1_000)
        #expect(pair.device.read(id).count == 1_000)
        // The copy made on arrival is handed over as it is.
        #expect(pair.device.dataPlane.bytesCopiedIn - before.bytesCopiedIn == 1_000)
    }

    @Test("bytes lent by the transport (a USB slot) are kept in the slot: borrow copies nothing, read once, and they survive the slot going back")
    func lentBytesAreKeptInPlace() throws {
        var pair = Pair(device: .device, accessory: .accessory, seed: 9, bufferLimit: 1 << 20)
        let id = try DataTests.openSessions(&pair, ["com.acme.fw"])[0]
        let before = pair.device.dataPlane
        let sent = (0..<3_000).map { UInt8(truncatingIfNeeded: $0 * 7) }
        _ = try pair.accessory.write(id, span: sent.span.bytes, now: pair.now)
        // Each frame in a slot of its own, lent as a USB IN transfer's would be.
        var slots: [(memory: UnsafeMutableRawBufferPointer, lease: SlotLease)] = []
        defer { for slot in slots { slot.memory.deallocate() } }
        for frame in pair.accessory.takeOutput() {
            let memory = UnsafeMutableRawBufferPointer.allocate(byteCount: frame.count, alignment: 16)
            memory.copyMemory(from: UnsafeRawBufferPointer(start: frame.withUnsafeBytes(\.baseAddress), count: frame.count))
            let lease = SlotLease()
            lease.lend(UnsafeRawBufferPointer(memory))
            slots.append((memory, lease))
            pair.device.receive(lent: LentBytes(lease), now: pair.now)
        }
        #expect(pair.device.bytesAvailable(id) == sent.count)
        #expect(pair.device.dataPlane.bytesCopiedIn == before.bytesCopiedIn, "nothing copied on arrival")
        #expect(slots.indices.allSatisfy { !isKnownUniquelyReferenced(&slots[$0].lease) }, "the session holds every lease")

        // Borrowing reads the first slot itself.
        let address = try #require(pair.device.borrow(id) { span in (0, span.withUnsafeBytes { $0.baseAddress }) })
        let first = slots[0].memory
        #expect(address.map { $0 >= UnsafeRawPointer(first.baseAddress!) && $0 < UnsafeRawPointer(first.baseAddress!) + first.count } == true)

        // The transport takes the first slots back early (its reader lagged): their bytes move
        // out, and the slot memory is reused for something else.
        for slot in slots.prefix(2) {
            slot.lease.evacuate()
            slot.memory.initializeMemory(as: UInt8.self, repeating: 0xEE)
        }
        var received: [UInt8] = []
        while received.count < sent.count {
            let chunk = pair.device.read(id, maxBytes: 700)
            guard !chunk.isEmpty else { break }
            received += chunk
        }
        #expect(received == sent)
        #expect(pair.device.dataPlane.bytesCopiedIn - before.bytesCopiedIn == sent.count, "read() is the one copy")
        #expect(slots.indices.allSatisfy { isKnownUniquelyReferenced(&slots[$0].lease) }, "every lease ends once its bytes are read")
    }
}

@Suite("Receive limits, each side its own")
struct ReceiveLimitTests {
    /// The DJI goggles' SYN (PROTOCOL.md §2.3): 5 packets of 1024 bytes, RTO 2000 ms, 20 ms
    /// cumulative-ACK timeout, 5 cumulative ACKs; with an EA session.
    static var goggles: LinkConfiguration {
        var configuration = LinkConfiguration.accessory
        configuration.parameters.maxOutstandingPackets = 5
        configuration.parameters.maxPacketLength = 1_024
        configuration.parameters.retransmissionTimeout = 2_000
        configuration.parameters.cumulativeAckTimeout = 20
        configuration.parameters.maxCumulativeAcks = 5
        return configuration
    }

    /// Moves `total` bytes each way on one session; returns the data packets each side sent to
    /// the other (link statistics count data packets as sent, bare ACKs apart).
    static func exchange(_ pair: inout Pair, total: Int) throws -> (toDevice: Int, toAccessory: Int) {
        let id = try DataTests.openSessions(&pair, ["com.acme.fw"])[0]
        let data = pattern(3, 0, total)
        let deviceBefore = pair.device.link.statistics.packetsSent
        let accessoryBefore = pair.accessory.link.statistics.packetsSent
        var sentByDevice = 0, sentByAccessory = 0
        var atDevice: [UInt8] = [], atAccessory: [UInt8] = []
        let finished = pair.run(until: .seconds(600)) { pair in
            if sentByDevice < total {
                let rest = data[sentByDevice...]
                sentByDevice += (try? pair.device.write(id, span: rest.span.bytes, now: pair.now)) ?? 0
            }
            if sentByAccessory < total {
                let rest = data[sentByAccessory...]
                sentByAccessory += (try? pair.accessory.write(id, span: rest.span.bytes, now: pair.now)) ?? 0
            }
            atDevice += pair.device.read(id)
            atAccessory += pair.accessory.read(id)
            return atDevice.count >= total && atAccessory.count >= total
        }
        #expect(finished)
        #expect(atDevice == data)
        #expect(atAccessory == data)
        return (pair.accessory.link.statistics.packetsSent - accessoryBefore,
                pair.device.link.statistics.packetsSent - deviceBefore)
    }

    @Test("the device answers with its own limits: the goggles send it 64 KiB packets and get 1 KiB ones")
    func eachSideSendsByThePeersLimits() throws {
        var pair = Pair(device: .device, accessory: Self.goggles, seed: 11, bufferLimit: 1 << 20)
        let (toDevice, toAccessory) = try Self.exchange(&pair, total: 1 << 20)
        #expect(pair.device.link.peerLimits?.maxPacketLength == 1_024)
        #expect(pair.device.link.peerLimits?.maxOutstandingPackets == 5)
        #expect(pair.accessory.link.peerLimits?.maxPacketLength == 65_535)
        #expect(pair.accessory.link.peerLimits?.maxOutstandingPackets == LinkConfiguration.device.parameters.maxOutstandingPackets)
        #expect(pair.accessory.link.receiveLimits?.maxPacketLength == 1_024)
        #expect(pair.device.link.receiveLimits?.maxPacketLength == 65_535)
        // 1 MiB in packets of up to 65525 payload bytes one way, 1014 the other (plus acks).
        #expect(toDevice < 100)
        #expect(toAccessory > 1_000)
        #expect(pair.windowViolations == 0)
    }

    @Test("an accessory that insists on its own offer gets the exact copy")
    func aRefusedAnswerFallsBackToTheExactCopy() throws {
        var goggles = Self.goggles
        goggles.acceptsPeerReceiveLimits = false
        var pair = Pair(device: .device, accessory: goggles, seed: 12, bufferLimit: 1 << 20)
        let (toDevice, _) = try Self.exchange(&pair, total: 256 << 10)
        #expect(pair.device.link.negotiated?.maxPacketLength == 1_024)
        #expect(pair.accessory.link.peerLimits?.maxPacketLength == 1_024)
        #expect(pair.device.link.peerLimits?.maxPacketLength == 1_024)
        #expect(toDevice > 200)
    }

    @Test("after a reset the device answers with its own limits again (no fallback carried over)")
    func aResetNegotiatesAfresh() throws {
        var pair = Pair(device: .device, accessory: Self.goggles, seed: 14, bufferLimit: 1 << 20)
        pair.start()
        #expect(pair.run { $0.identified })
        #expect(pair.accessory.link.peerLimits?.maxPacketLength == 65_535)
        pair.device.resetLink(now: pair.now)
        #expect(pair.run { $0.device.link.state == .connected && $0.accessory.link.state == .connected })
        #expect(pair.accessory.link.peerLimits?.maxPacketLength == 65_535)
        #expect(pair.device.link.peerLimits?.maxPacketLength == 1_024)
    }

    @Test("a host configured like BOYA's echoes the offer")
    func theExactCopyByConfiguration() throws {
        var device = LinkConfiguration.device
        device.advertisesReceiveLimits = false
        var pair = Pair(device: device, accessory: Self.goggles, seed: 13, bufferLimit: 1 << 20)
        pair.start()
        #expect(pair.run { $0.identified })
        #expect(pair.accessory.link.peerLimits?.maxPacketLength == 1_024)
        #expect(pair.device.link.negotiated == pair.accessory.link.negotiated)
    }
}
