@testable import IAPLink
import IAPWire
import Testing
import TestThreads

/// Sequence numbering and message framing of real accessories (PROTOCOL.md §7.6, §7.7), on
/// virtual time: the three numberings of bare ACKs, a gap no retransmission fills, a control
/// message over several link packets, strings with bytes after their NUL (docs/LENIENCY.md).
@Suite("Tolerance of accessories' numbering and framing", .ownThread)
struct SequenceToleranceTests {
    /// The accessory's link configuration with a numbering of its own.
    static func accessory(_ numbering: BareAckNumbering, sessionID: UInt8 = 0, retransmits: Bool = true) -> LinkConfiguration {
        var configuration = LinkConfiguration.accessory
        configuration.bareAckNumbering = numbering
        configuration.bareAckSessionID = sessionID
        configuration.retransmits = retransmits
        return configuration
    }

    /// Both ways through one session: `count` bytes the device writes and the accessory reads,
    /// and as many the other way. Returns what each side read.
    static func exchange(_ pair: inout Pair, count: Int, limit: Duration = .seconds(60)) throws -> (atAccessory: [UInt8], atDevice: [UInt8]) {
        let id = try pair.device.openSession(protocolName: "com.acme.data", now: pair.now)
        let out = pattern(1, 0, count)
        let back = pattern(2, 0, count)
        var written = (device: 0, accessory: 0)
        var read = (accessory: [UInt8](), device: [UInt8]())
        _ = pair.run(until: limit) { pair in
            if written.device < out.count {
                written.device += (try? pair.device.write(id, out[written.device...], now: pair.now)) ?? 0
            }
            if pair.accessory.sessionState(id) == .open, written.accessory < back.count {
                written.accessory += (try? pair.accessory.write(id, back[written.accessory...], now: pair.now)) ?? 0
            }
            read.accessory += pair.accessory.read(id)
            read.device += pair.device.read(id)
            return read.accessory.count >= count && read.device.count >= count
        }
        return (read.accessory, read.device)
    }

    static func said(_ pair: Pair, _ words: String) -> Int {
        pair.deviceEvents.count { if case let .tolerated(text) = $0 { text.contains(words) } else { false } }
    }

    @Test("the reference's numbering is recognised and needs no tolerance")
    func reference() throws {
        var pair = Pair(accessory: Self.accessory(.reference))
        pair.start()
        #expect(pair.run { $0.identified })
        let (atAccessory, atDevice) = try Self.exchange(&pair, count: 100_000)
        #expect(atAccessory == pattern(1, 0, 100_000) && atDevice == pattern(2, 0, 100_000))
        #expect(pair.device.link.peerBareAckNumbering == .reference)
        #expect(!pair.deviceEvents.contains { if case .tolerated = $0 { true } else { false } })
    }

    @Test("bare ACKs that carry the next number, as the Double 2's: served, said once, nothing stepped over")
    func nextNumber() throws {
        var pair = Pair(accessory: Self.accessory(.next))
        pair.start()
        #expect(pair.run { $0.identified })
        let (atAccessory, atDevice) = try Self.exchange(&pair, count: 100_000)
        #expect(atAccessory == pattern(1, 0, 100_000) && atDevice == pattern(2, 0, 100_000))
        #expect(pair.device.link.peerBareAckNumbering == .next)
        #expect(pair.device.link.statistics.sequenceNumbersUsedByBareAcks == 0)
        #expect(pair.device.link.statistics.sequenceGapsSkipped == 0)
        #expect(Self.said(pair, "carry the sequence number of its next data packet") == 1)
    }

    @Test("bare ACKs that use numbers up, on the control session, from a sender that never retransmits (the Clicks keyboard): served at once")
    func keyboard() throws {
        var configuration = Self.accessory(.usesUp, sessionID: 1, retransmits: false)
        configuration.parameters.maxCumulativeAcks = 1
        var pair = Pair(accessory: configuration)
        pair.start()
        #expect(pair.run { $0.identified })
        let (atAccessory, atDevice) = try Self.exchange(&pair, count: 100_000)
        #expect(atAccessory == pattern(1, 0, 100_000) && atDevice == pattern(2, 0, 100_000))
        #expect(pair.device.link.peerBareAckNumbering == .usesUp)
        #expect(pair.device.link.statistics.sequenceNumbersUsedByBareAcks > 0)
        // Decided from the numbering, not caught by the gap's bound (three timeouts of 1 s).
        #expect(pair.device.link.statistics.sequenceGapsSkipped == 0)
        #expect(pair.now < .seconds(2), "served at the link's own pace, no timeout waited for (virtual time \(pair.now))")
        #expect(Self.said(pair, "use sequence numbers up") == 1)
        #expect(pair.device.link.state == .connected)
    }

    @Test("a data packet lost from a sender that never retransmits: three EAKs a timeout apart, then its position is taken, said once")
    func gapNeverFilled() throws {
        var pair = Pair(accessory: Self.accessory(.reference, retransmits: false))
        pair.start()
        #expect(pair.run { $0.identified })
        let id = try pair.device.openSession(protocolName: "com.acme.data", now: pair.now)
        #expect(pair.run { $0.accessory.sessionState(id) == .open })
        // The third of eight packets the accessory sends is lost on the wire.
        let chunk = pair.accessory.link.maxPayloadLength - EASessionData.headerSize
        var lost: Range<Int>?
        var packets = 0
        var offset = 0
        let eaSession = pair.accessory.link.negotiated?.session(ofType: .externalAccessory)?.id
        pair.toDevice.filter = { packet in
            guard let header = try? LinkPacketHeader.decode(packet.span.bytes), header.payloadLength > 0,
                  header.sessionID == eaSession else { return false }
            packets += 1
            let length = header.payloadLength - EASessionData.headerSize
            defer { offset += length }
            guard packets == 3 else { return false }
            lost = offset..<(offset + length)
            return true
        }
        let sent = pattern(3, 0, 8 * chunk)
        var written = 0
        var received: [UInt8] = []
        let start = pair.now
        #expect(pair.run(until: pair.now + .seconds(30)) { pair in
            if written < sent.count { written += (try? pair.accessory.write(id, sent[written...], now: pair.now)) ?? 0 }
            received += pair.device.read(id)
            return received.count == sent.count - (lost?.count ?? 0) && lost != nil
        })
        let missing = try #require(lost)
        var expected = sent
        expected.removeSubrange(missing)
        #expect(received == expected, "everything but the lost packet, in order")
        let statistics = pair.device.link.statistics
        #expect(statistics.sequenceGapsSkipped == 1 && statistics.sequenceNumbersSkipped == 1)
        // Three EAKs, a retransmission timeout (1 s) apart: about three seconds.
        #expect(pair.now - start >= .seconds(3) && pair.now - start < .seconds(5), "\(pair.now - start)")
        #expect(Self.said(pair, "never sent packet") == 1)
        #expect(pair.device.link.state == .connected)
    }

    @Test("a sender by the reference at 10 % loss each way never has a gap stepped over: every byte arrives", arguments: [UInt64(1), 2, 3])
    func lossyReferenceIsNeverSkipped(seed: UInt64) throws {
        var pair = Pair(seed: seed)
        pair.toDevice.drop = 0.1
        pair.toAccessory.drop = 0.1
        pair.start()
        #expect(pair.run(until: .seconds(120)) { $0.identified })
        let (atAccessory, atDevice) = try Self.exchange(&pair, count: 200_000, limit: pair.now + .seconds(600))
        #expect(atAccessory == pattern(1, 0, 200_000) && atDevice == pattern(2, 0, 200_000))
        #expect(pair.device.link.statistics.sequenceGapsSkipped == 0)
        #expect(pair.device.link.statistics.retransmissions + pair.accessory.link.statistics.retransmissions > 0)
    }

    @Test("a certificate spread over link packets of 128 bytes is joined: authenticated and identified, said once")
    func splitCertificate() throws {
        var pair = Pair()
        pair.accessory.controlMessageSplit = 128
        pair.start()
        #expect(pair.run { $0.identified })
        let certificate = pair.deviceEvents.compactMap { event -> [UInt8]? in
            if case let .authenticated(certificate, _) = event { return certificate }
            return nil
        }
        #expect(certificate == [[UInt8](repeating: 0x30, count: 608)])
        #expect(Self.said(pair, "spreads control messages over several link packets") == 1)
        #expect(!pair.deviceEvents.contains { if case .malformedMessage = $0 { true } else { false } })
    }

    @Test("a control message whose rest never comes is dropped after the answer timeout, named; the link stays up")
    func splitMessageThatStops() throws {
        let zeroLength: [UInt8] = [0x40, 0x40, 0x03, 0x84, 0xAE, 0x03, 0x00, 0x00, 0x00, 0x00]
        let joined = Upper.startsLongMessage(zeroLength.span.bytes)
        #expect(!joined, "a parameter of length 0 is no part of a message: malformed")
        var pair = Pair()
        pair.start()
        #expect(pair.run { $0.identified })
        let control = try #require(pair.accessory.link.negotiated?.session(ofType: .control)?.id)
        // Declares 900 bytes, brings 100: a parameter of 894 bytes begun.
        let start: [UInt8] = [0x40, 0x40, 0x03, 0x84, 0xAE, 0x03, 0x03, 0x7E, 0x00, 0x00] + [UInt8](repeating: 0, count: 90)
        let queued = pair.accessory.sendLinkPayload(sessionID: control, payload: start, now: pair.now)
        #expect(queued)
        let sent = pair.now
        #expect(pair.run(until: pair.now + .seconds(30)) { pair in
            pair.deviceEvents.contains { if case let .malformedMessage(text) = $0 { text.contains("900 bytes stopped after 100") } else { false } }
        })
        #expect(pair.now - sent >= .seconds(10))
        #expect(pair.device.link.state == .connected)
        #expect(pair.device.identity != nil)
    }

    @Test("strings with bytes after their NUL are read up to it; AppMatchTeamID's trailing bytes ignored, said once")
    func bytesAfterNUL() throws {
        var pair = Pair()
        var parameters = AccessoryIdentity.sample.message.parameters
        parameters.removeAll { $0.id == IdentificationParameter.name || $0.id == IdentificationParameter.appMatchTeamID }
        parameters.append(.blob(IdentificationParameter.name, Array("Test Sensor".utf8) + [0, 0xFF, 0xFE]))
        parameters.append(.blob(IdentificationParameter.appMatchTeamID, Array("79Q5CGN6JK".utf8) + [0, 1, 2, 3, 4, 5, 6]))
        pair.accessory.identificationOverride = ControlMessage(id: .identificationInformation, parameters: parameters)
        pair.start()
        #expect(pair.run { $0.identified })
        #expect(pair.device.identity?.name == "Test Sensor")
        #expect(pair.device.identity?.appMatchTeamID == "79Q5CGN6JK")
        #expect(Self.said(pair, "0, 11 carry bytes after their string's NUL") == 1)
    }

    @Test("stringUpToNUL reads up to the first NUL and hasBytesAfterNUL tells what follows")
    func stringUpToNUL() throws {
        #expect(try Parameter.blob(1, Array("abc".utf8) + [0, 9, 9]).stringUpToNUL() == "abc")
        #expect(try Parameter.blob(1, Array("abc".utf8)).stringUpToNUL() == "abc")
        #expect(try Parameter.blob(1, Array("abc".utf8) + [0]).stringUpToNUL() == "abc")
        #expect(Parameter.blob(1, Array("abc".utf8) + [0, 9]).hasBytesAfterNUL)
        #expect(!Parameter.blob(1, Array("abc".utf8) + [0]).hasBytesAfterNUL)
        #expect(throws: WireError.self) { try Parameter.blob(1, [0xFF, 0xFE, 0]).stringUpToNUL() }
    }
}
