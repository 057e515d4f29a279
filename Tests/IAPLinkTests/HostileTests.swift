import IAPLink
import IAPWire
import Testing

/// A peer that misbehaves on purpose: each test asserts the bound or the outcome.
@Suite("A hostile or silent accessory: bounds and timeouts")
struct HostileLinkTests {
    /// Opens `names` on an identified pair (retransmission timeout 100 ms, 3 retransmissions).
    static func silentPair() throws -> (Pair, UInt16) {
        var accessory = LinkConfiguration.accessory
        accessory.parameters.maxRetransmissions = 3
        accessory.parameters.retransmissionTimeout = 100
        var pair = Pair(accessory: accessory)
        let ids = try DataTests.openSessions(&pair, ["com.acme.data"])
        return (pair, ids[0])
    }

    @Test("a window sent packet by packet is one retransmission round, not one per packet")
    func retransmissionRoundsNotTimerFirings() throws {
        var (pair, id) = try Self.silentPair()
        pair.toAccessory.blackHole = true
        pair.toDevice.blackHole = true
        // Eight packets 10 ms apart: their timers fire at eight different moments per round.
        let start = pair.now
        for index in 0..<8 {
            pair.now = start + .milliseconds(10 * index)
            pair.device.advance(to: pair.now)
            _ = try pair.device.write(id, [UInt8](repeating: UInt8(index), count: 100), now: pair.now)
            _ = pair.device.takeOutput()
        }
        var failedAt: Duration?
        _ = pair.run(until: start + .seconds(5)) { pair in
            if case .failed(.maxRetransmissionsExceeded) = pair.device.link.state { failedAt = pair.now; return true }
            return false
        }
        let failed = try #require(failedAt)
        // The first packet: sent at `start`, then 3 retransmissions 100 ms apart, given up at the
        // 4th timeout. Counting firings gave up after about 130 ms.
        #expect(failed - start >= .milliseconds(390), "gave up after \(failed - start)")
        #expect(failed - start <= .milliseconds(500), "gave up after \(failed - start)")
    }

    /// A silent pair (both ways black-holed) whose device has sent four data packets of 1,000
    /// bytes; returns their sequence numbers.
    static func fourPacketsInFlight() throws -> (Pair, [UInt8]) {
        var (pair, id) = try silentPair()
        pair.toAccessory.blackHole = true
        pair.toDevice.blackHole = true
        for index in 0..<4 {
            _ = try pair.device.write(id, [UInt8](repeating: UInt8(index), count: 1_000), now: pair.now)
        }
        let data = try pair.device.takeOutput().map { try LinkPacket.decode($0) }.filter { !$0.payload.isEmpty }
        try #require(data.count == 4)
        return (pair, data.map(\.header.sequence))
    }

    @Test("a flood of EAKs for the same packets sends each again once, not once per EAK")
    func eakFloodIsBounded() throws {
        var (pair, sequences) = try Self.fourPacketsInFlight()
        // The accessory says it has the last packet and not the ones before, 1,000 times over.
        let last = sequences[3]
        let acknowledged = sequences[0] &- 1
        let eak = try LinkPacket.encode(control: [.ack, .eak], sequence: 0x02, acknowledgement: acknowledged, sessionID: 0,
                                        payload: [last])
        let before = pair.device.link.statistics.retransmissions
        for _ in 0..<1_000 { pair.device.receive(eak, now: pair.now) }
        let resent = pair.device.link.statistics.retransmissions - before
        #expect(resent == sequences.count - 1, "resent \(resent) packets for 1,000 EAKs")
        #expect(pair.device.link.statistics.eakRetransmissionsSkipped >= 999)
        #expect(pair.device.takeOutput().count <= sequences.count + 2)
    }

    @Test("an EAK's spacing counts from the packet's last sending, not from a timer that started again without sending")
    func eakSpacingCountsFromTheLastSending() throws {
        var (pair, sequences) = try Self.fourPacketsInFlight()
        // A byte stream with output queued and moving (written 1,000 bytes so far).
        pair.device.noteOutputProgress(TransportOutputProgress(queuedBytes: 50_000, writtenBytes: 1_000))
        // The accessory has the last packet only: the three before are sent again.
        let eak = try LinkPacket.encode(control: [.ack, .eak], sequence: 0x02, acknowledgement: sequences[0] &- 1,
                                        sessionID: 0, payload: [sequences[3]])
        pair.device.receive(eak, now: pair.now)
        let once = pair.device.link.statistics.retransmissions
        #expect(once == 3)
        #expect(pair.device.takeOutput().count == 3)
        // Their timers (100 ms here) run out while the queue is still moving: they start again,
        // and nothing is sent.
        pair.now += .milliseconds(100)
        pair.device.noteOutputProgress(TransportOutputProgress(queuedBytes: 40_000, writtenBytes: 11_000))
        pair.device.advance(to: pair.now)
        #expect(pair.device.link.statistics.retransmissions == once)
        #expect(pair.device.link.statistics.retransmissionsDeferred >= 3)
        #expect(pair.device.takeOutput().count == 0)
        // The same EAK 10 ms later: 110 ms since the three were last sent, past the spacing of
        // half a timeout, so they go again (counted from the restarted timers, it would be 10 ms).
        pair.now += .milliseconds(10)
        pair.device.receive(eak, now: pair.now)
        #expect(pair.device.link.statistics.retransmissions == once + 3)
    }

    @Test("an accessory asking for power updates over and over while acknowledging nothing is disconnected, not queued for")
    func controlRepliesAreBounded() throws {
        var pair = Pair()
        pair.start()
        #expect(pair.run { $0.identified })
        pair.toDevice.blackHole = true // what the device sends is never acknowledged
        pair.toAccessory.blackHole = true
        // The accessory's next packet gives its sequence number; the flood continues from it.
        pair.accessory.sendControlMessage(ControlMessage(id: .startPowerUpdates, parameters: [.flag(0), .flag(6)]), now: pair.now)
        let first = try #require(pair.accessory.takeOutput().last)
        let header = try LinkPacket.decode(first).header
        let request = try ControlMessage(id: .startPowerUpdates, parameters: [.flag(0), .flag(6)]).encoded()
        pair.device.receive(first, now: pair.now)
        var sequence = header.sequence &+ 1
        var failure: ControlFailure?
        for _ in 0..<2_000 {
            let packet = try LinkPacket.encode(control: [.ack], sequence: sequence, acknowledgement: header.acknowledgement,
                                               sessionID: header.sessionID, payload: request)
            sequence &+= 1
            pair.device.receive(packet, now: pair.now)
            _ = pair.device.takeOutput() // the wire takes it; nothing comes back
            for event in pair.device.takeEvents() {
                if case let .controlFailed(found) = event { failure = found }
            }
            if failure != nil { break }
        }
        guard case let .overwhelmed(queued) = failure else {
            Issue.record("no overwhelmed failure: \(String(describing: failure))")
            return
        }
        #expect(queued == IAP2Endpoint.controlQueueLimit)
    }

    @Test("the stop of a closed session is followed: acknowledged by a live accessory, given up on after answerTimeout by a silent one")
    func closedSessionStopIsFollowed() throws {
        var (pair, id) = try Self.silentPair()
        pair.device.closeSession(id, now: pair.now)
        #expect(pair.device.isStopPending(id))
        #expect(pair.run(until: pair.now + .seconds(5)) { $0.deviceEvents.contains(.sessionStopAcknowledged(sessionID: id)) })
        #expect(!pair.device.isStopPending(id))
        // Another session; this time the accessory hears nothing after the open.
        let again = try pair.device.openSession(protocolName: "com.acme.log", now: pair.now)
        #expect(pair.run(until: pair.now + .seconds(5)) { $0.device.sessionState(again) == .open })
        pair.device.answerTimeout = .milliseconds(200) // before the link's 3 silent rounds of 100 ms
        pair.toAccessory.blackHole = true
        let closedAt = pair.now
        pair.device.closeSession(again, now: pair.now)
        #expect(pair.device.isStopPending(again))
        var timedOutAt: Duration?
        #expect(pair.run(until: pair.now + .seconds(5)) { pair in
            guard pair.deviceEvents.contains(.sessionStopTimedOut(sessionID: again, protocolName: "com.acme.log", after: .milliseconds(200)))
            else { return false }
            timedOutAt = pair.now
            return true
        })
        if let timedOutAt {
            #expect(timedOutAt - closedAt >= .milliseconds(200), "gave up early")
            #expect(timedOutAt - closedAt < .milliseconds(300), "gave up after \(timedOutAt - closedAt)")
        }
        #expect(!pair.device.isStopPending(again))
        #expect(!pair.deviceEvents.contains(.sessionStopAcknowledged(sessionID: again)))
    }
}
