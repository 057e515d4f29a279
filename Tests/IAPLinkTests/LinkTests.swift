import IAPLink
import IAPWire
import Testing

@Suite("iAP2 link and control session under virtual time")
struct LinkTests {
    @Test func handshakeIdentifiesTheAccessory() {
        var pair = Pair()
        pair.start()
        #expect(pair.run { $0.identified })
        let identity = pair.device.identity
        #expect(identity == AccessoryIdentity.sample)
        #expect(identity?.protocols.map(\.name) == ["com.acme.fw", "com.acme.data", "com.acme.log", "com.acme.ctl"])
        #expect(pair.device.link.state == .connected)
        #expect(pair.deviceEvents.contains { if case .authenticated = $0 { return true } else { return false } })
        // The device never sends the first SYN: its first SYN is a SYN|ACK.
        #expect(pair.windowViolations == 0)
    }

    @Test func theDeviceNeverSendsTheFirstSYN() {
        var device = IAP2Endpoint(initialSequence: 0x10, randomSeed: 1)
        device.start(now: .zero)
        device.advance(to: .seconds(30))
        // It announces itself with one detect, and sends nothing else until the accessory speaks.
        #expect(device.takeOutput() == [IAP2Detect.bytes])
        device.receive(IAP2Detect.bytes, now: .seconds(31))
        #expect(device.takeOutput() == [IAP2Detect.bytes])
    }

    /// The captured handshakes of PROTOCOL.md §2.3: the device answers an acceptable SYN as an
    /// iPhone does (§2.4): the accessory's timing values and sessions, its own receive limits.
    @Test("device answers captured SYNs", arguments: [
        ("BOYA", "FF 5A 00 1A 80 01 10 00 FC 01 05 04 00 13 88 00 FF 1E 03 01 00 01 02 02 01 34"),
        ("DJI", "FF 5A 00 17 80 00 00 00 10 01 05 04 00 07 D0 00 14 1E 05 0A 00 01 DD"),
    ])
    func capturedSYNs(name: String, hex: String) throws {
        var device = IAP2Endpoint(initialSequence: 0x40, randomSeed: 1)
        device.receive(IAP2Detect.bytes, now: .zero)
        _ = device.takeOutput()
        let syn = bytesFromHex(hex)
        device.receive(syn, now: .milliseconds(1))
        let output = device.takeOutput()
        #expect(output.count == 1)
        let (header, payload) = try LinkPacket.decode(output[0])
        #expect(header.control == [.syn, .ack])
        #expect(header.sequence == 0x40)
        #expect(header.acknowledgement == syn[5])
        let offer = try LinkParameters.decode(Array(syn[9..<(syn.count - 1)]))
        let answer = try LinkParameters.decode(payload)
        #expect(answer.agreesApartFromReceiveLimits(with: offer), "\(name): timing and sessions are echoed")
        #expect(answer.maxOutstandingPackets == LinkConfiguration.device.parameters.maxOutstandingPackets)
        #expect(answer.maxPacketLength == 65_535, "\(name): the device's own receive limit, not the accessory's 1024")
        // The accessory's ACK brings the link up.
        let ack = try LinkPacket.encode(control: .ack, sequence: syn[5], acknowledgement: 0x40, sessionID: 0)
        device.receive(ack, now: .milliseconds(2))
        #expect(device.link.state == .connected)
        // …and the device asks for the certificate at once.
        let request = try LinkPacket.decode(try #require(device.takeOutput().first))
        #expect(try ControlMessage.decode(request.payload).id == .requestAuthenticationCertificate)
        #expect(request.header.sessionID == (name == "BOYA" ? 1 : 0x0A))
    }

    @Test func aSYNBeyondOurLimitsGetsACounterOffer() throws {
        var configuration = LinkConfiguration.device
        configuration.parameters.maxPacketLength = 2_048
        configuration.parameters.maxOutstandingPackets = 4
        var accessory = LinkConfiguration.accessory
        accessory.parameters.maxPacketLength = 65_535
        accessory.parameters.maxOutstandingPackets = 100
        var pair = Pair(device: configuration, accessory: accessory)
        pair.start()
        #expect(pair.run { $0.identified })
        #expect(pair.device.link.negotiated?.maxPacketLength == 2_048)
        #expect(pair.device.link.negotiated?.maxOutstandingPackets == 4)
        #expect(pair.accessory.link.negotiated == pair.device.link.negotiated)
    }

    @Test func anInvalidSYNIsCounteredWithAValidOne() {
        var device = IAP2Link(role: .device, configuration: .device, initialSequence: 0x20)
        var sink = NullSink()
        let bad = LinkParameters(version: 3, maxOutstandingPackets: 0, maxPacketLength: 10, retransmissionTimeout: 5,
                                 cumulativeAckTimeout: 40_000, maxRetransmissions: 99, maxCumulativeAcks: 200,
                                 sessions: [LinkSession(id: 0, type: .externalAccessory), LinkSession(id: 5, type: .externalAccessory)])
        let packet = try? LinkPacket.encode(control: .syn, sequence: 1, acknowledgement: 0, sessionID: 0, payload: bad.encoded)
        device.receive(packet ?? [], now: .zero, sink: &sink)
        let reply = device.takeOutput().first.flatMap { try? LinkPacket.decode($0) }
        let offer = reply.flatMap { try? LinkParameters.decode($0.payload) }
        #expect(offer?.violations() == [])
        #expect(offer?.sessions.contains { $0.type == .control } == true)
        #expect(offer?.maxRetransmissions == 30)
    }

    @Test func negotiationGivesUpAfterTenRounds() throws {
        var device = IAP2Link(role: .device, configuration: .device, initialSequence: 0x20)
        var sink = NullSink()
        for round in 0..<11 {
            // An accessory that proposes something new every time and never agrees.
            var parameters = LinkConfiguration.accessory.parameters
            parameters.retransmissionTimeout = UInt16(100 + round)
            let packet = try LinkPacket.encode(control: .syn, sequence: 1, acknowledgement: 0, sessionID: 0, payload: parameters.encoded)
            device.receive(packet, now: .milliseconds(round), sink: &sink)
        }
        #expect(device.state == .failed(.negotiationFailed(rounds: 10)))
    }

    @Test func anIAP1AnswerToTheDetectIsReported() {
        var accessory = IAP2Link(role: .accessory, configuration: .accessory, initialSequence: 0)
        var sink = NullSink()
        accessory.start(now: .zero)
        #expect(accessory.takeOutput() == [IAP2Detect.bytes])
        accessory.receive(IAP2Detect.iap1Reply, now: .milliseconds(5), sink: &sink)
        #expect(accessory.state == .failed(.peerSpeaksIAP1))
    }

    @Test func theAccessoryRepeatsTheDetectUntilAnswered() {
        var accessory = IAP2Link(role: .accessory, configuration: .accessory, initialSequence: 0)
        accessory.start(now: .zero)
        _ = accessory.takeOutput()
        #expect(accessory.nextDeadline == .seconds(1))
        accessory.advance(to: .seconds(1))
        #expect(accessory.takeOutput() == [IAP2Detect.bytes])
        accessory.advance(to: .milliseconds(1_500))
        #expect(accessory.takeOutput().isEmpty)
    }

    @Test func anAccessoryThatNeverSendsItsCertificateFailsClearly() {
        var pair = Pair()
        pair.device.answerTimeout = .seconds(5)
        pair.start()
        // Let the link come up, then silence the accessory's control answers by dropping
        // everything it sends after the link is up.
        #expect(pair.run { $0.device.link.state == .connected })
        pair.toDevice.blackHole = true
        let failed = pair.run(until: .seconds(20)) { pair in
            pair.deviceEvents.contains { $0 == .controlFailed(.noAnswer("the certificate request")) }
        }
        #expect(failed)
        #expect(pair.device.identity == nil)
    }

    @Test func aRejectingPolicyStopsAuthentication() {
        var pair = Pair(policy: RejectingAuthentication())
        pair.start()
        #expect(pair.run(until: .seconds(10)) { pair in
            pair.accessoryEvents.contains(.controlFailed(.authenticationRefusedByDevice))
        })
        #expect(pair.deviceEvents.contains(.controlFailed(.authenticationFailed("the certificate was refused"))))
        #expect(pair.device.identity == nil)
    }

    @Test func identificationIsRejectedWithTheOffendingParameters() {
        var identity = AccessoryIdentity.sample
        identity.protocols.append(ExternalAccessoryProtocol(identifier: 1, name: "com.acme.duplicate"))
        identity.messagesSent.append(0xEA00) // a device-originated message
        var pair = Pair(identity: identity)
        pair.start()
        #expect(pair.run(until: .seconds(10)) { pair in
            pair.accessoryEvents.contains { if case .controlFailed(.identificationRejected) = $0 { return true } else { return false } }
        })
        let rejection = pair.deviceEvents.compactMap { event -> IdentificationRejection? in
            if case let .identificationRejected(rejection) = event { return rejection } else { return nil }
        }.first
        // The duplicate protocol id leaves no choice (a session start names the protocol by it);
        // a message list naming a device-originated message is only noted (docs/LENIENCY.md).
        #expect(rejection?.parameterIDs == [10])
        #expect(pair.accessoryEvents.contains(.controlFailed(.identificationRejected([10]))))
    }

    @Test func missingRequiredParametersAreNamed() {
        let message = ControlMessage(id: .identificationInformation, parameters: [.string(0, "x"), .blob(1, [0xFF, 0x00])])
        guard case let .failure(rejection) = AccessoryIdentity.validate(message) else {
            Issue.record("accepted an identification without required parameters")
            return
        }
        #expect(rejection.parameterIDs == [1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13])
        #expect(rejection.reasons.contains("ModelIdentifier: parameter 1 is not a valid string: not valid UTF-8"))
        #expect(rejection.message.parameters.allSatisfy { $0.isFlag })
    }

    @Test("on a Bluetooth connection, a BluetoothTransportComponent must declare the connection's address")
    func bluetoothComponentIsCheckedAgainstTheConnection() {
        let connection: [UInt8] = [0x00, 0x1A, 0x7D, 0xDA, 0x71, 0x13]
        func identity(_ components: [TransportComponent]) -> ControlMessage {
            var identity = AccessoryIdentity.sample
            identity.transportComponents = components
            return identity.message
        }
        func bluetooth(_ address: [UInt8]?) -> TransportComponent {
            TransportComponent(kind: 17, identifier: 2, name: "Bluetooth", bluetoothAddress: address)
        }
        let usb = TransportComponent(kind: 16, identifier: 1, name: "iAP2")
        // Declared as written, or in bdaddr_t's reversed order: accepted, the address kept.
        for declared in [connection, connection.reversed()] {
            guard case let .success(accepted) = AccessoryIdentity.validate(identity([usb, bluetooth(declared)]), bluetoothAddress: connection) else {
                Issue.record("rejected \(declared)")
                continue
            }
            #expect(accepted.transportComponents.last?.bluetoothAddress == declared)
        }
        // Another address, no address, no Bluetooth component at all: parameter 17 rejected.
        for components in [[usb, bluetooth([0x00, 0x1A, 0x7D, 0xDA, 0x71, 0x14])], [usb, bluetooth(nil)], [usb]] {
            guard case let .failure(rejection) = AccessoryIdentity.validate(identity(components), bluetoothAddress: connection) else {
                Issue.record("accepted \(components)")
                continue
            }
            #expect(rejection.parameterIDs == [17])
            #expect(rejection.reasons.allSatisfy { $0.contains("00:1A:7D:DA:71:13") })
        }
        // Not on Bluetooth: nothing is required; a MAC address that is not six bytes is wrong anyway.
        #expect((try? AccessoryIdentity.validate(identity([usb]), bluetoothAddress: nil).get()) != nil)
        let short = ControlMessage(id: .identificationInformation, parameters: identity([usb]).parameters
            + [.group(17, [.uint16(0, 2), .string(1, "Bluetooth"), .flag(2), .blob(3, [1, 2, 3])])])
        guard case let .failure(rejection) = AccessoryIdentity.validate(short) else {
            Issue.record("accepted a 3-byte MAC address")
            return
        }
        #expect(rejection.parameterIDs == [17])
    }

    @Test("the device endpoint rejects an accessory on Bluetooth that declares another address")
    func endpointChecksTheBluetoothAddress() {
        var identity = AccessoryIdentity.sample
        identity.transportComponents = [TransportComponent(kind: 17, identifier: 2, name: "Bluetooth", bluetoothAddress: [1, 2, 3, 4, 5, 6])]
        var pair = Pair(identity: identity)
        pair.device.peerBluetoothAddress = [1, 2, 3, 4, 5, 7]
        pair.start()
        #expect(pair.run(until: .seconds(10)) { pair in
            pair.accessoryEvents.contains { if case .controlFailed(.identificationRejected([17])) = $0 { return true } else { return false } }
        })
        #expect(!pair.identified)
    }

    @Test func sessionsOpenOncePerProtocol() throws {
        var pair = Pair()
        pair.start()
        #expect(pair.run { $0.identified })
        let id = try pair.device.openSession(protocolName: "com.acme.fw", now: pair.now)
        #expect(throws: EndpointError.protocolInUse("com.acme.fw")) { _ = try pair.device.openSession(protocolName: "com.acme.fw", now: pair.now) }
        #expect(throws: EndpointError.unsupportedProtocol("com.other")) { _ = try pair.device.openSession(protocolName: "com.other", now: pair.now) }
        #expect(pair.device.sessionState(id) == .open)
        #expect(pair.run { $0.accessory.sessions.map(\.protocolName) == ["com.acme.fw"] })
        pair.device.closeSession(id, now: pair.now)
        #expect(pair.run { $0.accessory.sessions.isEmpty })
        let again = try pair.device.openSession(protocolName: "com.acme.fw", now: pair.now)
        #expect(again != id)
    }

    @Test func powerUpdatesAreAnswered() throws {
        var pair = Pair()
        pair.start()
        // The sample identity lists StartPowerUpdates among the messages it sends, and asks for
        // the maximum current, the charge flag and the battery level.
        #expect(pair.run { pair in pair.accessoryEvents.contains { if case .powerUpdate = $0 { return true } else { return false } } })
        let update = pair.accessoryEvents.compactMap { event -> [Parameter]? in
            if case let .powerUpdate(parameters) = event { return parameters } else { return nil }
        }.first
        #expect(update?.map(\.id) == [0, 1, 6])
        #expect(try update?.first { $0.id == 6 }?.uint16() == 100)
        #expect(pair.device.unhandledMessages == 0)
    }

    @Test func unknownAndMalformedMessagesAreCountedNotFatal() throws {
        var pair = Pair()
        pair.start()
        #expect(pair.run { $0.identified })
        pair.accessory.sendControlMessage(ControlMessage(id: MessageID(0x4C01), parameters: [.uint8(0, 1)]), now: pair.now)
        // A StatusExternalAccessoryProtocolSession for a session that does not exist.
        pair.accessory.sendControlMessage(ControlMessage(id: .statusExternalAccessoryProtocolSession,
                                                         parameters: [.uint16(0, 999), .uint8(1, 0)]), now: pair.now)
        #expect(pair.run { $0.device.unhandledMessages == 1 })
        #expect(pair.deviceEvents.contains(.unhandledMessage(MessageID(0x4C01))))
        #expect(pair.device.link.state == .connected)
        #expect(pair.device.identity == .sample)
    }
}

struct NullSink: LinkSink {
    var delivered: [[UInt8]] = []
    mutating func accept(sessionID: UInt8, payload: RawSpan) -> Bool {
        delivered.append(payload.withUnsafeBytes { Array($0) })
        return true
    }
}

func bytesFromHex(_ hex: String) -> [UInt8] {
    let digits = Array(hex.filter(\.isHexDigit))
    return stride(from: 0, to: digits.count, by: 2).compactMap { UInt8(String(digits[$0...$0 + 1]), radix: 16) }
}

@Suite("Conformance with captured bytes")
struct ConformanceTests {
    /// The BOYA handshake of PROTOCOL.md §2.4, replayed: with the accessory's parameters and the
    /// same initial sequence numbers, our device's SYN|ACK, the accessory's ACK and the first
    /// control packet are the captured (and §2.7 computed) bytes, to the byte.
    @Test func boyaHandshakeBytes() throws {
        let boya = try LinkParameters.decode(bytesFromHex("01 05 04 00 13 88 00 FF 1E 03 01 00 01 02 02 01"))
        var accessoryLink = LinkConfiguration.accessory
        accessoryLink.parameters = boya
        // The captured host answers with the exact copy of the offer (BOYA's host does; the
        // iPhone-style answer with our own receive limits is tested apart).
        var deviceLink = LinkConfiguration.device
        deviceLink.advertisesReceiveLimits = false
        var device = IAP2Endpoint(device: deviceLink, initialSequence: 0x40, randomSeed: 1)
        var accessory = IAP2Endpoint(accessory: .sample, configuration: accessoryLink, initialSequence: 0x01, randomSeed: 2)

        accessory.start(now: .zero)
        #expect(accessory.takeOutput() == [IAP2Detect.bytes])
        device.receive(IAP2Detect.bytes, now: .zero)
        #expect(device.takeOutput() == [IAP2Detect.bytes])
        accessory.receive(IAP2Detect.bytes, now: .zero)
        let syn = accessory.takeOutput()
        #expect(syn == [bytesFromHex("FF 5A 00 1A 80 01 00 00 0C 01 05 04 00 13 88 00 FF 1E 03 01 00 01 02 02 01 34")])
        device.receive(syn[0], now: .zero)
        let synAck = device.takeOutput()
        #expect(synAck == [bytesFromHex("FF 5A 00 1A C0 40 01 00 8C 01 05 04 00 13 88 00 FF 1E 03 01 00 01 02 02 01 34")])
        accessory.receive(synAck[0], now: .zero)
        let ack = accessory.takeOutput()
        #expect(ack == [bytesFromHex("FF 5A 00 09 40 01 40 00 1D")])
        device.receive(ack[0], now: .zero)
        #expect(device.takeOutput() == [bytesFromHex("FF 5A 00 10 40 41 01 01 14 40 40 00 06 AA 00 D0")])
    }
}
