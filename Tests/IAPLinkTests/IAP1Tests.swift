import IAPLink
import IAPWire
import Testing

/// A device-role ``IAPEndpoint`` and an accessory-role ``IAP1Endpoint`` wired back to back on
/// virtual time; everything one side outputs reaches the other in the next step, whole or cut
/// into small chunks (a UART delivers what it has).
struct IAP1Pair {
    var device: IAPEndpoint
    var accessory: IAP1Endpoint
    var now: Duration = .zero
    var deviceEvents: [EndpointEvent] = []
    var accessoryEvents: [EndpointEvent] = []
    /// What the device sent, packet by packet (to check its answers).
    var deviceSent: [[UInt8]] = []
    /// Cut every stream into chunks of this many bytes (nil: whole packets).
    var chunk: Int?

    init(identity: AccessoryIdentity = .sample, style: IAP1IdentificationStyle = .idps, waitsForDevice: Bool = false,
         policy: any AuthenticationPolicy = AcceptingAuthentication(), bufferLimit: Int = 1 << 20) {
        device = IAPEndpoint(device: .device, policy: policy, sessionBufferLimit: bufferLimit, initialSequence: 0x40, randomSeed: 5)
        accessory = IAP1Endpoint(accessory: identity, style: style, waitsForDevice: waitsForDevice, sessionBufferLimit: bufferLimit,
                                 maxIncomingPayload: 1_000, randomSeed: 6)
    }

    mutating func start() {
        accessory.start(now: now)
        device.start(now: now)
    }

    private func pieces(_ bytes: [UInt8]) -> [[UInt8]] {
        guard let chunk else { return [bytes] }
        return stride(from: 0, to: bytes.count, by: chunk).map { Array(bytes[$0..<min(bytes.count, $0 + chunk)]) }
    }

    /// Delivers one round of output both ways; when nothing moved, advances time to the next
    /// deadline. Returns false when nothing is pending at all.
    mutating func step() -> Bool {
        let toAccessory = device.takeOutput()
        let toDevice = accessory.takeOutput()
        deviceSent += toAccessory
        for packet in toAccessory { for piece in pieces(packet) { accessory.receive(piece, now: now) } }
        for packet in toDevice { for piece in pieces(packet) { device.receive(piece, now: now) } }
        deviceEvents += device.takeEvents()
        accessoryEvents += accessory.takeEvents()
        if !toAccessory.isEmpty || !toDevice.isEmpty || device.hasOutput || accessory.hasOutput { return true }
        guard let next = [device.nextDeadline, accessory.nextDeadline].compactMap({ $0 }).min() else { return false }
        now = max(now, next)
        device.advance(to: now)
        accessory.advance(to: now)
        deviceEvents += device.takeEvents()
        accessoryEvents += accessory.takeEvents()
        return true
    }

    @discardableResult
    mutating func run(until limit: Duration = .seconds(60), _ condition: (inout IAP1Pair) -> Bool) -> Bool {
        while now <= limit {
            if condition(&self) { return true }
            if !step() { return condition(&self) }
        }
        return false
    }

    /// Feeds the device raw bytes as if the accessory had sent them, and returns what the device
    /// answered (decoded with the transaction-id mode in force).
    mutating func deviceAnswers(to bytes: [UInt8], transactionIDs: Bool) -> [IAP1Packet] {
        device.receive(bytes, now: now)
        deviceEvents += device.takeEvents()
        return device.takeOutput().compactMap { try? IAP1Packet.decode($0, transactionIDs: transactionIDs) }
    }

    /// Identified, and every packet of the exchange delivered.
    var identified: Bool { device.identity != nil && !device.hasOutput && !accessory.hasOutput }

    /// A pair whose accessory has identified (and authenticated), every packet delivered.
    static func identified(bufferLimit: Int = 1 << 20, sourceLocation: SourceLocation = #_sourceLocation) -> IAP1Pair {
        var pair = IAP1Pair(bufferLimit: bufferLimit)
        pair.start()
        #expect(pair.run { $0.identified }, sourceLocation: sourceLocation)
        return pair
    }
}

/// An iAP1 packet on the General lingo, with the UART sync byte.
func iap1(_ command: UInt8, _ payload: [UInt8] = [], transaction: UInt16? = nil) -> [UInt8] {
    (try? IAP1Packet(lingo: 0, command: UInt16(command), transactionID: transaction, payload: payload).encoded()) ?? []
}

extension EndpointEvent {
    var malformedText: String? {
        if case let .malformedMessage(text) = self { return text }
        return nil
    }
}

@Suite("iAP1 device role, virtual time")
struct IAP1Tests {
    @Test("IDPS, authentication 2.0 and identification: the identity is what the tokens said")
    func idpsIdentifiesWithStringsAndProtocols() throws {
        let pair = IAP1Pair.identified()
        let identity = try #require(pair.device.identity)
        #expect(pair.device.protocolVersion == .iap1)
        #expect(identity.protocolVersion == .iap1)
        #expect(identity.name == "Test Sensor")
        #expect(identity.manufacturer == "Acme")
        #expect(identity.modelIdentifier == "TS-1")
        #expect(identity.serialNumber == "SN0001")
        #expect(identity.firmwareVersion == "1.2.3")
        #expect(identity.hardwareVersion == "0.0.0") // "A" is not a number: iAP1 carries 3 bytes
        #expect(identity.protocols.map(\.name) == ["com.acme.fw", "com.acme.data", "com.acme.log", "com.acme.ctl"])
        #expect(identity.protocols.map(\.identifier) == [1, 2, 3, 4])
        #expect(pair.deviceEvents.contains { if case .authenticated = $0 { true } else { false } })
        #expect(pair.deviceEvents.contains(.protocolSwitched(.iap1)))
        // The device's first iAP1 answer is the iPodAck for StartIDPS with its transaction id.
        let answers = pair.deviceSent.compactMap { try? IAP1Packet.decode($0, transactionIDs: true) }
        #expect(answers.first == IAP1Packet(lingo: 0, command: 0x02, transactionID: 0, payload: [0x00, 0x38]))
        // Authentication: every certificate section but the last acked, then the 20-byte challenge.
        let signatureRequest = try #require(answers.first { $0.command == 0x17 })
        #expect(signatureRequest.payload.count == 21)
        #expect(answers.filter { $0.command == 0x02 && $0.payload == [0x00, 0x15] }.count == 4) // 608 bytes: 5 sections
        #expect(answers.contains { $0.command == 0x19 && $0.payload == [0x00] })
    }

    @Test("the same flow with the stream cut into 3-byte pieces")
    func identifiesFromAStreamInSmallPieces() {
        var pair = IAP1Pair()
        pair.chunk = 3
        pair.start()
        #expect(pair.run { $0.identified })
    }

    @Test("an accessory that answers the detect the iAP1 way is asked to identify, and is")
    func detectAnsweredTheIAP1Way() throws {
        var pair = IAP1Pair(waitsForDevice: true)
        pair.start()
        #expect(pair.run { $0.identified })
        #expect(pair.deviceSent.first == IAP2Detect.bytes)
        #expect(pair.deviceSent.contains(iap1(0x00))) // RequestIdentify, no transaction id
        #expect(pair.device.identity?.name == "Test Sensor")
    }

    @Test("IdentifyDeviceLingoes: identified and authenticated, with no strings and no protocols")
    func legacyIdentification() throws {
        var pair = IAP1Pair(style: .deviceLingoes)
        pair.start()
        #expect(pair.run { $0.identified })
        let identity = try #require(pair.device.identity)
        #expect(identity.protocolVersion == .iap1)
        #expect(identity.protocols.isEmpty)
        #expect(pair.device.iap1?.transactionIDs == false)
        #expect(pair.deviceEvents.contains { if case .authenticated = $0 { true } else { false } })
        #expect(throws: EndpointError.unsupportedProtocol("com.acme.fw")) {
            _ = try pair.device.openSession(protocolName: "com.acme.fw", now: pair.now)
        }
    }

    @Test("two data sessions at once, byte-exact both ways, acknowledged, then closed")
    func twoSessionsAtOnce() throws {
        var pair = IAP1Pair.identified()
        let a = try pair.device.openSession(protocolName: "com.acme.fw", now: pair.now)
        let b = try pair.device.openSession(protocolName: "com.acme.data", now: pair.now)
        #expect(throws: EndpointError.protocolInUse("com.acme.fw")) {
            _ = try pair.device.openSession(protocolName: "com.acme.fw", now: pair.now)
        }
        #expect(pair.run { p in p.device.sessionState(a) == .open && p.device.sessionState(b) == .open })
        let total = 300_000
        var written = [a: 0, b: 0], received = [a: [UInt8](), b: [UInt8]()], echoedBack = [a: [UInt8](), b: [UInt8]()]
        let done = pair.run { p in
            for (index, id) in [a, b].enumerated() {
                if written[id]! < total {
                    let chunk = pattern(index, written[id]!, min(40_000, total - written[id]!))
                    written[id]! += (try? p.device.write(id, chunk, now: p.now)) ?? 0
                }
                let bytes = p.accessory.read(id)
                received[id]! += bytes
                // The accessory writes everything back (its buffer is large enough here).
                if !bytes.isEmpty { #expect((try? p.accessory.write(id, bytes, now: p.now)) == bytes.count) }
                echoedBack[id]! += p.device.read(id)
            }
            return echoedBack[a]!.count == total && echoedBack[b]!.count == total && p.accessory.bytesAcknowledged(b) == total
        }
        #expect(done)
        #expect(received[a] == pattern(0, 0, total))
        #expect(received[b] == pattern(1, 0, total))
        #expect(echoedBack[a] == pattern(0, 0, total))
        #expect(echoedBack[b] == pattern(1, 0, total))
        #expect(pair.device.bytesAcknowledged(a) == total)
        #expect(pair.accessory.bytesAcknowledged(b) == total)
        // Packets of the declared maximum payload (1000 bytes less the session id): large form.
        #expect(pair.deviceSent.contains { $0.count > 256 && $0[2] == 0x00 })
        pair.device.closeSession(a, now: pair.now)
        #expect(pair.run { p in p.accessoryEvents.contains(.sessionClosed(sessionID: a, reason: nil)) })
        #expect(pair.device.sessionState(b) == .open)
    }

    @Test("a reader that stops reading holds the sender off; reading later gets every byte")
    func backPressureHoldsTheSender() throws {
        var pair = IAP1Pair.identified(bufferLimit: 20_000)
        let id = try pair.device.openSession(protocolName: "com.acme.data", now: pair.now)
        #expect(pair.run { $0.device.sessionState(id) == .open })
        // The accessory offers 1 MB; the device does not read.
        let total = 1_000_000
        var offered = 0
        pair.run(until: pair.now + .seconds(5)) { p in
            offered += (try? p.accessory.write(id, pattern(3, offered, min(50_000, total - offered)), now: p.now)) ?? 0
            return false
        }
        let heldAtDevice = pair.device.bytesAvailable(id)
        #expect(heldAtDevice <= 20_000 + 1_000)
        #expect(offered < 20_000 + 20_000 + IAP1Endpoint.maxHeldPackets * 1_000 + 50_000)
        #expect(!pair.accessoryEvents.contains { $0.malformedText != nil })
        // Now read everything.
        var received: [UInt8] = []
        #expect(pair.run { p in
            if offered < total { offered += (try? p.accessory.write(id, pattern(3, offered, min(50_000, total - offered)), now: p.now)) ?? 0 }
            received += p.device.read(id)
            return received.count == total
        })
        #expect(received == pattern(3, 0, total))
    }

    @Test("a wrong checksum is dropped and reported; the accessory goes on")
    func badChecksum() {
        var pair = IAP1Pair.identified()
        var bad = iap1(0x42, [0x00, 0x01, 0xAA], transaction: 9)
        bad[bad.count - 1] ^= 0xFF
        #expect(pair.deviceAnswers(to: bad, transactionIDs: true).isEmpty)
        #expect(pair.deviceEvents.contains { if case .link(.dropped) = $0 { true } else { false } })
        #expect(pair.device.identity != nil)
    }

    @Test("unknown lingoes and commands get iPodAck BadParameter with their transaction id")
    func unknownCommands() throws {
        var pair = IAP1Pair.identified()
        let unknownLingo = try IAP1Packet(lingo: 0x0C, command: 0x01, transactionID: 0x0077, payload: [1, 2]).encoded()
        #expect(pair.deviceAnswers(to: unknownLingo, transactionIDs: true)
            == [IAP1Packet(lingo: 0, command: 0x02, transactionID: 0x0077, payload: [0x04, 0x01])])
        #expect(pair.deviceAnswers(to: iap1(0x6E, [], transaction: 0x0078), transactionIDs: true)
            == [IAP1Packet(lingo: 0, command: 0x02, transactionID: 0x0078, payload: [0x04, 0x6E])])
        #expect(pair.deviceEvents.contains(.unhandledIAP1Command(lingo: 0x0C, command: 0x01)))
        #expect(pair.deviceEvents.contains(.unhandledIAP1Command(lingo: 0x00, command: 0x6E)))
        // Data for a session that does not exist.
        #expect(pair.deviceAnswers(to: iap1(0x42, [0x00, 0x63, 1, 2, 3], transaction: 0x0079), transactionIDs: true)
            == [IAP1Packet(lingo: 0, command: 0x02, transactionID: 0x0079, payload: [0x01, 0x42])])
        // A truncated AccessoryAck: BadParameter and a clear event.
        #expect(pair.deviceAnswers(to: iap1(0x41, [0x00], transaction: 0x007A), transactionIDs: true)
            == [IAP1Packet(lingo: 0, command: 0x02, transactionID: 0x007A, payload: [0x04, 0x41])])
        #expect(pair.deviceEvents.contains { $0.malformedText?.contains("AccessoryAck") == true })
    }

    @Test("data before authentication is refused with NotAuthenticated")
    func dataBeforeAuthentication() {
        var pair = IAP1Pair()
        // StartIDPS by hand, then data at once.
        _ = pair.deviceAnswers(to: iap1(0x38, [], transaction: 0), transactionIDs: true)
        #expect(pair.device.protocolVersion == .iap1)
        #expect(pair.deviceAnswers(to: iap1(0x42, [0x00, 0x01, 0xAA], transaction: 1), transactionIDs: true)
            == [IAP1Packet(lingo: 0, command: 0x02, transactionID: 1, payload: [0x07, 0x42])])
    }

    @Test("FID tokens with lying lengths get BadParameter; a bad required token fails IDPS with status 1")
    func lyingTokens() throws {
        var pair = IAP1Pair()
        _ = pair.deviceAnswers(to: iap1(0x38, [], transaction: 0), transactionIDs: true)
        // Two tokens announced, one present; then a token whose length runs past the end.
        #expect(pair.deviceAnswers(to: iap1(0x39, [2, 0x03, 0x00, 0x01, 0x00], transaction: 1), transactionIDs: true)
            == [IAP1Packet(lingo: 0, command: 0x02, transactionID: 1, payload: [0x04, 0x39])])
        #expect(pair.deviceAnswers(to: iap1(0x39, [1, 0x40, 0x00, 0x02, 0x01], transaction: 2), transactionIDs: true)
            == [IAP1Packet(lingo: 0, command: 0x02, transactionID: 2, payload: [0x04, 0x39])])
        // An EAProtocolToken without its NUL, and an unknown token.
        let tokens = try FIDToken.encodeList([
            FIDToken(type: 0, subtype: 0, data: [1, 0, 0, 0, 0, 2, 0, 0, 2, 0]),
            FIDToken(type: 0, subtype: 4, data: [1] + Array("com.acme.x".utf8)),
            FIDToken(type: 0x7F, subtype: 0x01, data: [9]),
        ])
        let ack = pair.deviceAnswers(to: iap1(0x39, tokens, transaction: 3), transactionIDs: true)
        #expect(ack.first?.command == 0x3A)
        let acks = try FIDTokenAck.decodeList(try #require(ack.first).payload)
        #expect(acks.map(\.status) == [FIDTokenAck.accepted, FIDTokenAck.requiredFailed, FIDTokenAck.notSupported])
        #expect(pair.deviceAnswers(to: iap1(0x3B, [0], transaction: 4), transactionIDs: true)
            == [IAP1Packet(lingo: 0, command: 0x3C, transactionID: 4, payload: [1])])
        #expect(pair.deviceEvents.contains { if case .identificationRejected = $0 { true } else { false } })
        #expect(pair.device.identity == nil)
    }

    @Test("IDPS without an IdentifyToken ends with status 2 (required token missing)")
    func missingIdentifyToken() {
        var pair = IAP1Pair()
        _ = pair.deviceAnswers(to: iap1(0x38, [], transaction: 0), transactionIDs: true)
        #expect(pair.deviceAnswers(to: iap1(0x3B, [0], transaction: 1), transactionIDs: true)
            == [IAP1Packet(lingo: 0, command: 0x3C, transactionID: 1, payload: [2])])
    }

    @Test("an answer with the wrong transaction id is ignored and reported")
    func transactionIDMismatch() throws {
        var pair = IAP1Pair()
        _ = pair.deviceAnswers(to: iap1(0x38, [], transaction: 0), transactionIDs: true)
        let tokens = try FIDToken.encodeList([FIDToken(type: 0, subtype: 0, data: [1, 0, 0, 0, 0, 2, 0, 0, 2, 0])])
        _ = pair.deviceAnswers(to: iap1(0x39, tokens, transaction: 1), transactionIDs: true)
        let answers = pair.deviceAnswers(to: iap1(0x3B, [0], transaction: 2), transactionIDs: true)
        let request = try #require(answers.first { $0.command == 0x14 }) // GetAccessoryAuthenticationInfo
        let wrong = (request.transactionID ?? 0) &+ 5
        #expect(pair.deviceAnswers(to: iap1(0x15, [2, 0, 0, 0] + [UInt8](repeating: 0x30, count: 50), transaction: wrong),
                                   transactionIDs: true).isEmpty)
        #expect(pair.deviceEvents.contains { $0.malformedText?.contains("transaction id") == true })
        // The right one is taken: the single section is final, so the challenge follows.
        let next = pair.deviceAnswers(to: iap1(0x15, [2, 0, 0, 0] + [UInt8](repeating: 0x30, count: 50), transaction: request.transactionID),
                                      transactionIDs: true)
        #expect(next.map(\.command) == [0x16, 0x17])
    }

    @Test("the accessory refuses a session for a protocol it did not declare")
    func undeclaredProtocolIndex() throws {
        var pair = IAP1Pair.identified()
        pair.accessory.receive(iap1(0x3F, [0x00, 0x09, 0x63], transaction: 0x0100), now: pair.now)
        let answer = try #require(pair.accessory.takeOutput().first)
        #expect(try IAP1Packet.decode(answer, transactionIDs: true)
            == IAP1Packet(lingo: 0, command: 0x41, transactionID: 0x0100, payload: [0x04, 0x3F]))
        #expect(throws: EndpointError.unsupportedProtocol("com.acme.nothing")) {
            _ = try pair.device.openSession(protocolName: "com.acme.nothing", now: pair.now)
        }
    }

    @Test("a refused open ends the session with the accessory's status")
    func refusedOpen() throws {
        var pair = IAP1Pair.identified()
        let id = try pair.device.openSession(protocolName: "com.acme.log", now: pair.now)
        let open = try #require(pair.device.takeOutput().first)
        let request = try IAP1Packet.decode(open, transactionIDs: true)
        _ = pair.deviceAnswers(to: iap1(0x41, [0x04, 0x3F], transaction: request.transactionID), transactionIDs: true)
        guard case let .closed(reason?) = pair.device.sessionState(id) else {
            Issue.record("the session is not closed with a reason")
            return
        }
        #expect(reason.contains("BadParameter"))
    }

    @Test("an accessory that does not answer authentication fails with the step named")
    func silentAuthentication() {
        var pair = IAP1Pair()
        pair.device.answerTimeout = .seconds(2)
        _ = pair.deviceAnswers(to: iap1(0x38, [], transaction: 0), transactionIDs: true)
        let tokens = (try? FIDToken.encodeList([FIDToken(type: 0, subtype: 0, data: [1, 0, 0, 0, 0, 2, 0, 0, 2, 0])])) ?? []
        _ = pair.deviceAnswers(to: iap1(0x39, tokens, transaction: 1), transactionIDs: true)
        _ = pair.deviceAnswers(to: iap1(0x3B, [0], transaction: 2), transactionIDs: true)
        pair.now += .seconds(3)
        pair.device.advance(to: pair.now)
        #expect(pair.device.takeEvents().contains(.controlFailed(.noAnswer("GetAccessoryAuthenticationInfo"))))
    }

    @Test("an identified iAP1 accessory that starts IDPS again is announced as restarted")
    func reidentification() {
        var pair = IAP1Pair.identified()
        _ = pair.deviceAnswers(to: iap1(0x38, [], transaction: 0x0200), transactionIDs: true)
        #expect(pair.deviceEvents.contains { if case .accessoryRestarted = $0 { true } else { false } })
        #expect(pair.device.identity == nil)
    }

    @Test("an iAP1 accessory that sends the iAP2 detect gets an iAP2 device again")
    func backToIAP2() {
        var pair = IAP1Pair.identified()
        pair.device.receive(IAP2Detect.bytes, now: pair.now)
        #expect(pair.device.protocolVersion == .iap2)
        #expect(pair.device.takeEvents().contains(.protocolSwitched(.iap2)))
        #expect(pair.device.takeOutput() == [IAP2Detect.bytes])
    }

    @Test("a partial packet and several whole ones in the chunk that causes the switch all reach iAP1")
    func switchKeepsEveryByte() throws {
        var pair = IAP1Pair()
        let start = iap1(0x38, [], transaction: 0)
        let ask = iap1(0x11, [], transaction: 1) // RequestTransportMaxPayloadSize
        let version = iap1(0x0F, [0x00], transaction: 2) // RequestLingoProtocolVersion
        // One chunk: StartIDPS, the whole version request and the first 3 bytes of the size request.
        let first = pair.deviceAnswers(to: start + version + Array(ask.prefix(3)), transactionIDs: true)
        #expect(first.map(\.command) == [0x02, 0x10])
        #expect(first.last?.payload == [0x00, 1, 9])
        let second = pair.deviceAnswers(to: Array(ask.dropFirst(3)), transactionIDs: true)
        #expect(second == [IAP1Packet(lingo: 0, command: 0x12, transactionID: 1, payload: [0x40, 0x00])])
    }

    @Test("after any iAP1 packet that is not identification, the device asks the accessory to identify")
    func strayPacketLeadsToRequestIdentify() {
        var pair = IAP1Pair()
        pair.device.start(now: pair.now)
        _ = pair.device.takeOutput() // the detect
        let answers = pair.deviceAnswers(to: iap1(0x41, [0x04, 0xEE]), transactionIDs: false)
        #expect(pair.device.protocolVersion == .iap1)
        #expect(answers.contains(IAP1Packet(lingo: 0, command: 0x00)))
        // Nobody identifies: the deadline reports it.
        pair.now += .seconds(11)
        pair.device.advance(to: pair.now)
        #expect(pair.device.takeEvents().contains { if case .controlFailed(.noAnswer) = $0 { true } else { false } })
    }

    @Test("the iAP2 packets pipelined behind the detect reach the iAP2 endpoint that takes over")
    func backToIAP2KeepsTheSYN() throws {
        var pair = IAP1Pair.identified()
        let syn = try LinkPacket.encode(control: .syn, sequence: 1, acknowledgement: 0, sessionID: 0,
                                        payload: LinkConfiguration.accessory.parameters.encoded)
        pair.device.receive(IAP2Detect.bytes + syn, now: pair.now)
        #expect(pair.device.protocolVersion == .iap2)
        let output = pair.device.takeOutput()
        #expect(output.first == IAP2Detect.bytes)
        // The SYN was seen: the device answers it with its own SYN (SYN|ACK).
        #expect(output.dropFirst().contains { (try? LinkPacket.decode($0))?.header.control.contains(.syn) == true })
    }

    @Test("the window is per session: a session nobody reads does not stop another")
    func oneStalledSessionDoesNotStopAnother() throws {
        var pair = IAP1Pair.identified(bufferLimit: 4_000)
        let stalled = try pair.device.openSession(protocolName: "com.acme.fw", now: pair.now)
        let flowing = try pair.device.openSession(protocolName: "com.acme.data", now: pair.now)
        #expect(pair.run { p in p.device.sessionState(stalled) == .open && p.device.sessionState(flowing) == .open })
        // The accessory never reads `stalled`; the device offers it plenty.
        var stalledOffered = 0
        var received: [UInt8] = []
        var offered = 0
        let total = 200_000
        #expect(pair.run { p in
            stalledOffered += (try? p.device.write(stalled, [UInt8](repeating: 7, count: 3_000), now: p.now)) ?? 0
            if offered < total { offered += (try? p.device.write(flowing, pattern(5, offered, min(3_000, total - offered)), now: p.now)) ?? 0 }
            received += p.accessory.read(flowing)
            return received.count == total
        })
        #expect(received == pattern(5, 0, total))
        #expect(pair.accessory.bytesAvailable(stalled) + pair.accessory.bytesHeld(stalled) <= 4_000 + IAP1Endpoint.maxHeldPackets * 1_000)
        #expect(pair.accessory.bytesHeld(stalled) > 0)
    }

    @Test("a peer that sends more than the held packets without waiting ends the session, with CloseDataSession")
    func floodWithoutWaitingEndsTheSession() throws {
        var pair = IAP1Pair.identified(bufferLimit: 2_000)
        let id = try pair.device.openSession(protocolName: "com.acme.data", now: pair.now)
        #expect(pair.run { $0.device.sessionState(id) == .open })
        var answers: [IAP1Packet] = []
        for index in 0..<(IAP1Endpoint.maxHeldPackets + 3) {
            var payload: [UInt8] = [UInt8(id >> 8), UInt8(id & 0xFF)]
            payload += [UInt8](repeating: UInt8(index), count: 1_500)
            answers += pair.deviceAnswers(to: iap1(0x42, payload, transaction: UInt16(0x300 + index)), transactionIDs: true)
        }
        guard case let .closed(reason?) = pair.device.sessionState(id) else {
            Issue.record("the session did not end")
            return
        }
        #expect(reason.contains("without waiting"))
        #expect(answers.contains { $0.command == 0x02 && $0.payload.first == IAP1AckStatus.droppedData })
        #expect(answers.contains { $0.command == 0x40 }) // CloseDataSession
        // What arrived before the overflow is still readable, in order.
        let readable = pair.device.read(id)
        #expect(readable.prefix(1_500) == ArraySlice([UInt8](repeating: 0, count: 1_500)))
    }

    @Test("Extended Interface commands get that lingo's iPodAck with a two-byte command id")
    func extendedInterfaceAck() throws {
        var pair = IAP1Pair.identified()
        let packet = try IAP1Packet(lingo: 0x04, command: 0x0012, transactionID: 0x0055, payload: []).encoded()
        pair.device.receive(packet, now: pair.now)
        let answer = try #require(pair.device.takeOutput().first)
        #expect(try IAP1Packet.decode(answer, transactionIDs: true)
            == IAP1Packet(lingo: 0x04, command: 0x0001, transactionID: 0x0055, payload: [0x04, 0x00, 0x12]))
    }

    @Test("the authentication acks echo the transaction id of the packet they answer")
    func authenticationAcksEchoTransactionIDs() throws {
        let pair = IAP1Pair.identified()
        let answers = pair.deviceSent.compactMap { try? IAP1Packet.decode($0, transactionIDs: true) }
        let infoRequest = try #require(answers.first { $0.command == 0x14 })
        let infoAck = try #require(answers.first { $0.command == 0x16 })
        #expect(infoAck.transactionID == infoRequest.transactionID) // the sections echo the request's id
        let signatureRequest = try #require(answers.first { $0.command == 0x17 })
        let statusAck = try #require(answers.first { $0.command == 0x19 })
        #expect(statusAck.transactionID == signatureRequest.transactionID)
        #expect(signatureRequest.transactionID != infoRequest.transactionID)
    }

    @Test("each switch to iAP1 draws a new challenge")
    func challengesDiffer() throws {
        func challenge(after restarts: Int) throws -> [UInt8] {
            var pair = IAP1Pair()
            pair.start()
            for _ in 0..<restarts {
                #expect(pair.run { $0.identified })
                pair.device.receive(IAP2Detect.bytes, now: pair.now)
                _ = pair.device.takeOutput()
                pair.accessory.receive(iap1(0x00), now: pair.now) // the accessory identifies again
            }
            #expect(pair.run { $0.identified })
            let requests = pair.deviceSent.compactMap { try? IAP1Packet.decode($0, transactionIDs: true) }.filter { $0.command == 0x17 }
            return try #require(requests.last).payload
        }
        #expect(try challenge(after: 0) != challenge(after: 1))
    }

    @Test("a RequestIdentify that crosses the accessory's own StartIDPS: stale answers are ignored and it identifies")
    func requestIdentifyCrossesStartIDPS() {
        var pair = IAP1Pair()
        // The device hears the iAP1 "no" first, switches and asks the accessory to identify, while
        // the accessory starts IDPS on its own: the two cross on the wire.
        pair.device.receive(IAP2Detect.iap1Reply, now: pair.now)
        #expect(pair.device.protocolVersion == .iap1)
        pair.accessory.start(now: pair.now)
        #expect(pair.run { $0.identified })
        #expect(!pair.accessoryEvents.contains { if case .controlFailed = $0 { true } else { false } })
        #expect(!pair.deviceEvents.contains { if case .identificationRejected = $0 { true } else { false } })
    }

    @Test("a host that comes after the accessory's own StartIDPS was lost still gets it identified")
    func lateHostOnASerialLine() {
        var pair = IAP1Pair()
        pair.accessory.start(now: pair.now)
        _ = pair.accessory.takeOutput() // StartIDPS into a line nobody listened to
        pair.now += .seconds(5)
        pair.device.start(now: pair.now) // the host's detect; the accessory answers the iAP1 way
        #expect(pair.run { $0.identified })
        #expect(pair.deviceSent.contains(iap1(0x00))) // RequestIdentify
    }
}
