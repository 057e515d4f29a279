@testable import IAPLink
import IAPWire
import Testing
import TestThreads

/// The host takes accessories as they are, as an iPhone does (docs/LENIENCY.md): each test plays
/// one habit of a real accessory (PROTOCOL.md §7) on virtual time.
@Suite("Leniency towards real accessories", .ownThread)
struct LeniencyTests {
    /// The sample identity without StatusExternalAccessoryProtocolSession among the messages it
    /// sends: the FLIR ONE's way (PROTOCOL.md §7.1).
    static var silentAboutSessions: AccessoryIdentity {
        var identity = AccessoryIdentity.sample
        identity.messagesSent = [0xAE00]
        return identity
    }

    static func identifiedPair(identity: AccessoryIdentity = .sample, device: LinkConfiguration = .device,
                               accessory: LinkConfiguration = .accessory) -> Pair {
        var pair = Pair(identity: identity, device: device, accessory: accessory)
        pair.start()
        #expect(pair.run { $0.identified })
        return pair
    }

    @Test("a session is open once the start is sent: data flows both ways from an accessory that never sends a status")
    func sessionOpenWithoutStatus() throws {
        var pair = Self.identifiedPair(identity: Self.silentAboutSessions)
        let id = try pair.device.openSession(protocolName: "com.acme.data", now: pair.now)
        // Open before anything crossed the wire, and writable at once.
        #expect(pair.device.sessionState(id) == .open)
        let events = pair.device.takeEvents()
        #expect(events.contains(.sessionOpened(sessionID: id, protocolName: "com.acme.data")))
        #expect(events.contains(.spaceAvailable(sessionID: id)))
        let request = Array("{\"type\":\"getOptions\"}\0".utf8)
        #expect(try pair.device.write(id, request, now: pair.now) == request.count)
        // The accessory sees the start before the data, and answers on the session.
        #expect(pair.run { $0.accessory.bytesAvailable(id) == request.count })
        #expect(pair.accessory.read(id) == request)
        let answer = Array("{\"options\":[]}".utf8)
        _ = try pair.accessory.write(id, answer, now: pair.now)
        #expect(pair.run { $0.device.bytesAvailable(id) == answer.count })
        #expect(pair.device.read(id) == answer)
        // Nothing was waited for and nothing timed out: a minute later the session is still open.
        _ = pair.run(until: pair.now + .seconds(60)) { _ in false }
        #expect(pair.device.sessionState(id) == .open)
        #expect(!pair.deviceEvents.contains { if case .sessionConfirmed = $0 { return true } else { return false } })
        #expect(!pair.accessoryEvents.contains { if case .controlFailed = $0 { return true } else { return false } })
    }

    @Test("StatusExternalAccessoryProtocolSession 0 confirms an open session")
    func statusZeroConfirms() throws {
        var pair = Self.identifiedPair()
        let id = try pair.device.openSession(protocolName: "com.acme.fw", now: pair.now)
        #expect(pair.run { $0.deviceEvents.contains(.sessionConfirmed(sessionID: id)) })
        #expect(pair.device.sessionState(id) == .open)
    }

    @Test("a non-zero status or the accessory's StopExternalAccessoryProtocolSession ends the session with the reason")
    func accessoryEndsSessions() throws {
        var pair = Self.identifiedPair(identity: Self.silentAboutSessions)
        let refused = try pair.device.openSession(protocolName: "com.acme.fw", now: pair.now)
        let stopped = try pair.device.openSession(protocolName: "com.acme.data", now: pair.now)
        #expect(pair.run { $0.accessory.sessions.count == 2 })
        pair.accessory.sendControlMessage(ControlMessage(id: .statusExternalAccessoryProtocolSession,
                                                         parameters: [.uint16(0, refused), .uint8(1, 3)]), now: pair.now)
        pair.accessory.sendControlMessage(ControlMessage(id: .stopExternalAccessoryProtocolSession, parameters: [.uint16(0, stopped)]),
                                          now: pair.now)
        #expect(pair.run { pair in
            pair.device.sessionState(refused) != .open && pair.device.sessionState(stopped) != .open
        })
        #expect(pair.deviceEvents.contains(.sessionClosed(sessionID: refused, reason: "the accessory refused the session for 'com.acme.fw' (status 3)")))
        #expect(pair.deviceEvents.contains(.sessionClosed(sessionID: stopped, reason: "the accessory ended the session for 'com.acme.data'")))
        #expect(pair.device.link.state == .connected)
        // Both protocols can be opened again.
        #expect(throws: Never.self) { _ = try pair.device.openSession(protocolName: "com.acme.fw", now: pair.now) }
    }

    @Test("RequestAppLaunch after identification reaches the owner with the application named")
    func appLaunchRequest() throws {
        var identity = AccessoryIdentity.sample
        identity.messagesSent.append(0xEA02)
        var pair = Pair(identity: identity)
        pair.accessory.appLaunchRequest = AppLaunchRequest(bundleIdentifier: "com.acme.viewer", launchAlert: 0)
        pair.start()
        #expect(pair.run { pair in pair.deviceEvents.contains { if case .appLaunchRequested = $0 { return true } else { return false } } })
        let request = pair.deviceEvents.compactMap { event -> AppLaunchRequest? in
            if case let .appLaunchRequested(request) = event { return request } else { return nil }
        }.first
        #expect(request?.bundleIdentifier == "com.acme.viewer")
        #expect(request?.launchAlert == 0)
        #expect(pair.device.identity != nil)
        #expect(pair.device.unhandledMessages == 0)
    }

    @Test("a message the accessory did not declare is handled and said once; unknown ones are ignored, never fatal")
    func undeclaredMessagesAreTolerated() throws {
        var pair = Self.identifiedPair()
        // The sample does not list RequestAppLaunch: sent twice, handled twice, said once.
        for _ in 0..<2 {
            pair.accessory.sendControlMessage(AppLaunchRequest(bundleIdentifier: "com.acme.viewer").message, now: pair.now)
        }
        pair.accessory.sendControlMessage(ControlMessage(id: MessageID(0x4C01), parameters: [.uint8(0, 1)]), now: pair.now)
        #expect(pair.run { $0.device.unhandledMessages == 1 })
        let launches = pair.deviceEvents.filter { if case .appLaunchRequested = $0 { return true } else { return false } }
        #expect(launches.count == 2)
        let notes = pair.deviceEvents.compactMap { event -> String? in if case let .tolerated(what) = event { return what } else { return nil } }
        #expect(notes.filter { $0.contains("RequestAppLaunch") }.count == 1, "\(notes)")
        #expect(pair.device.link.state == .connected)
    }

    @Test("message lists that name the other side's messages are accepted and noted once")
    func wronglyDirectedMessageListsAreAccepted() throws {
        var identity = AccessoryIdentity.sample
        identity.messagesSent.append(0xEA00) // the device sends StartExternalAccessoryProtocolSession
        let pair = Self.identifiedPair(identity: identity)
        #expect(pair.device.identity?.messagesSent.contains(0xEA00) == true)
        let notes = pair.deviceEvents.compactMap { event -> String? in if case let .tolerated(what) = event { return what } else { return nil } }
        #expect(notes.count == 1)
        #expect(notes.first?.contains("MessagesSentByAccessory lists messages the device sends") == true, "\(notes)")
    }

    @Test("unknown identification parameters and power fields are ignored and noted once")
    func unknownParametersAreNoted() throws {
        var pair = Self.identifiedPair()
        pair.accessory.sendControlMessage(ControlMessage(id: .startPowerUpdates, parameters: [.flag(0), .flag(3), .flag(9), .flag(6)]),
                                          now: pair.now)
        #expect(pair.run { pair in pair.accessoryEvents.filter { if case .powerUpdate = $0 { return true } else { return false } }.count == 2 })
        let update = pair.accessoryEvents.compactMap { event -> [Parameter]? in
            if case let .powerUpdate(parameters) = event { return parameters } else { return nil }
        }.last
        #expect(update?.map(\.id) == [0, 6])
        let notes = pair.deviceEvents.compactMap { event -> String? in if case let .tolerated(what) = event { return what } else { return nil } }
        #expect(notes == ["StartPowerUpdates asks for field 3, which the host does not report; left out"])

        // Identification sent again with a parameter no source names: accepted, noted.
        let before = pair.deviceEvents.count
        pair.accessory.sendControlMessage(ControlMessage(id: .identificationInformation,
                                                         parameters: AccessoryIdentity.sample.message.parameters + [.string(0x4242, "from the future")]),
                                          now: pair.now)
        #expect(pair.run { pair in pair.deviceEvents.dropFirst(before).contains { if case .identified = $0 { return true } else { return false } } })
        let later = pair.deviceEvents.dropFirst(before).compactMap { event -> String? in if case let .tolerated(what) = event { return what } else { return nil } }
        #expect(later == ["IdentificationInformation carries parameters the host does not know (16962); ignored"])
    }

    @Test("a file-transfer session in the accessory's SYN is accepted and left idle; its packets are acknowledged")
    func fileTransferSessionLeftIdle() throws {
        // The Hyundai head unit's table: control (version 2) and file transfer (PROTOCOL.md §7.4),
        // with an EA session beside them here so that data can be checked to still flow.
        var accessory = LinkConfiguration.accessory
        accessory.parameters.sessions = [LinkSession(id: 1, type: .control, version: 2), LinkSession(id: 2, type: .fileTransfer),
                                         LinkSession(id: 3, type: .externalAccessory)]
        var pair = Self.identifiedPair(accessory: accessory)
        #expect(pair.device.link.negotiated?.sessions == accessory.parameters.sessions)
        for _ in 0..<3 {
            let taken = pair.accessory.sendLinkPayload(sessionID: 2, payload: [0x01, 0x02, 0x03], now: pair.now)
            #expect(taken)
        }
        #expect(pair.run { $0.accessory.link.inFlightCount == 0 && $0.accessory.link.queuedCount == 0 })
        let notes = pair.deviceEvents.compactMap { event -> String? in if case let .tolerated(what) = event { return what } else { return nil } }
        #expect(notes == ["packets on link session 2, which the host does not use, are acknowledged and ignored"])
        let id = try pair.device.openSession(protocolName: "com.acme.data", now: pair.now)
        _ = try pair.device.write(id, [1, 2, 3], now: pair.now)
        #expect(pair.run { $0.accessory.bytesAvailable(id) == 3 })
    }

    @Test("packets longer than the host advertised, up to 65,535 bytes, are taken and said once")
    func oversizedPacketsAreTaken() throws {
        // A host on a slow serial line advertises 2,880 bytes; an accessory tuned on iPhones
        // sends 65,535-byte packets all the same.
        var device = LinkConfiguration.device
        device.parameters.maxPacketLength = 2_880
        var accessory = LinkConfiguration.accessory
        accessory.parameters.maxPacketLength = 65_535
        accessory.sendsPacketLength = 65_535
        var pair = Self.identifiedPair(device: device, accessory: accessory)
        #expect(pair.device.link.receiveLimits?.maxPacketLength == 2_880)
        let id = try pair.device.openSession(protocolName: "com.acme.data", now: pair.now)
        #expect(pair.run { $0.accessory.sessions.count == 1 })
        let data = (0..<(3 * 65_523)).map { UInt8(truncatingIfNeeded: $0 &* 7) }
        var written = 0
        var received: [UInt8] = []
        #expect(pair.run { pair in
            if written < data.count { written += (try? pair.accessory.write(id, data[written...], now: pair.now)) ?? 0 }
            received += pair.device.read(id)
            return received.count == data.count
        })
        #expect(received == data)
        let notes = pair.deviceEvents.filter { if case .link(.oversizedPacketTaken) = $0 { return true } else { return false } }
        #expect(notes.count == 1)
        if case let .link(.oversizedPacketTaken(length, advertised))? = notes.first {
            #expect(length == 65_535)
            #expect(advertised == 2_880)
        }
        #expect(pair.device.link.statistics.retransmissions == 0)
    }

    @Test("a coprocessor that takes 100 ms to answer is waited for")
    func slowCoprocessor() throws {
        var pair = Pair()
        pair.accessory.challengeResponseDelay = .milliseconds(100)
        pair.start()
        var challengedAt: Duration?
        #expect(pair.run { pair in
            if challengedAt == nil, pair.accessory.link.state == .connected { challengedAt = pair.now }
            return pair.identified
        })
        let authenticatedAt = pair.now
        if let challengedAt { #expect(authenticatedAt - challengedAt >= .milliseconds(100)) }
    }
}
