import TestSupport
import IAPLink
import IAPWire
import Testing

/// A host (the switching ``IAPEndpoint`` the manager runs) on a line that carried noise before a
/// correct accessory was powered on, on virtual time. The accessory hears nothing until it
/// starts; then everything each side sends reaches the other after the channel's latency.
struct NoisyLine {
    var host: IAPEndpoint
    var accessory: IAP2Endpoint
    var toAccessory = Channel(seed: 11)
    var toHost = Channel(seed: 12)
    var now: Duration = .zero
    /// When the accessory was powered on (its first byte leaves then).
    var accessoryStartedAt: Duration?
    /// The host's events, without the drops (counted in ``drops`` instead: noise makes many).
    var hostEvents: [EndpointEvent] = []
    /// Drop events the host reported, by reason.
    var drops: [ScanDropReason: Int] = [:]
    var droppedBytes = 0

    init(host configuration: LinkConfiguration = .device) {
        host = IAPEndpoint(device: configuration, initialSequence: 0x40, randomSeed: 21)
        accessory = IAP2Endpoint(accessory: .sample, initialSequence: 0x01, randomSeed: 22)
    }

    /// Starts the host (it announces itself with a detect nobody hears yet).
    mutating func startHost() {
        host.start(now: now)
        collect()
    }

    /// Feeds `bytes` to the host as a line delivers them: in pieces of `chunk` bytes, one piece
    /// every `interval` of link time (the host's timers run in between).
    mutating func noise(_ bytes: [UInt8], chunk: Int = 4_096, interval: Duration = .microseconds(20)) {
        var offset = 0
        while offset < bytes.count {
            let end = min(bytes.count, offset + chunk)
            host.receive(Array(bytes[offset..<end]), now: now)
            offset = end
            collect()
            now += interval
            if let deadline = host.nextDeadline, deadline <= now { host.advance(to: now) }
            collect()
        }
    }

    /// Powers the accessory on now.
    mutating func startAccessory() {
        accessoryStartedAt = now
        accessory.start(now: now)
    }

    mutating func collect() {
        for event in host.takeEvents() {
            if case let .link(.dropped(drop)) = event {
                drops[drop.reason, default: 0] += 1
                droppedBytes += drop.byteCount
            } else {
                hostEvents.append(event)
            }
        }
        _ = accessory.takeEvents()
        // What the host says before the accessory is on is lost.
        let fromHost = host.takeOutput()
        if accessoryStartedAt != nil { for packet in fromHost { toAccessory.send(packet, now: now) } }
        for packet in accessory.takeOutput() { toHost.send(packet, now: now) }
    }

    /// One step: delivers what is due, or moves time to the next delivery or deadline.
    mutating func step() -> Bool {
        collect()
        let forAccessory = toAccessory.due(now)
        let forHost = toHost.due(now)
        for packet in forAccessory { accessory.receive(packet, now: now) }
        for packet in forHost { host.receive(packet, now: now) }
        collect()
        if !forAccessory.isEmpty || !forHost.isEmpty { return true }
        let candidates = [toAccessory.nextDelivery, toHost.nextDelivery, host.nextDeadline, accessory.nextDeadline].compactMap { $0 }
        guard let next = candidates.min() else { return false }
        now = max(now, next)
        host.advance(to: now)
        accessory.advance(to: now)
        collect()
        return true
    }

    /// Runs until the host identified the accessory or `limit` of link time passed since the
    /// accessory was powered on; returns how long identification took, if it happened.
    mutating func identification(within limit: Duration) -> Duration? {
        let start = accessoryStartedAt ?? now
        while now <= start + limit {
            if host.identity != nil { return now - start }
            if !step() { break }
        }
        return host.identity != nil ? now - start : nil
    }

    /// Whether the host's iAP2 link failed for good at some point.
    var linkFailed: Bool {
        hostEvents.contains { if case .link(.stateChanged(.failed)) = $0 { return true } else { return false } }
    }
}

/// Noise of the kinds a hostile or freshly powered accessory leaves on a line, built
/// deterministically.
enum Noise {
    /// An iAP2 header whose checksum verifies and whose length field says `length`.
    static func iap2Header(length: Int, control: LinkControl = .ack, sessionID: UInt8 = 1) -> [UInt8] {
        var header: [UInt8] = [0xFF, 0x5A, UInt8(length >> 8), UInt8(length & 0xFF), control.rawValue, 0x33, 0x44, sessionID]
        header.append(Checksum.of(header))
        return header
    }

    /// The start of an iAP1 packet in the large form claiming a body of `length` bytes.
    static func iap1Header(length: Int) -> [UInt8] {
        [0xFF, 0x55, 0x00, UInt8(length >> 8), UInt8(length & 0xFF), 0x00, 0x13]
    }

    /// A SYN with an empty payload: 9 bytes, checksums right.
    static var emptySYN: [UInt8] {
        (try? LinkPacket.encode(control: .syn, sequence: 0x07, acknowledgement: 0, sessionID: 0, payload: [])) ?? []
    }

    /// A SYN whose checksums verify but whose payload is not SYN parameters (too short, or a
    /// session table that is not a whole number of entries).
    static func malformedSYN(payload: [UInt8]) -> [UInt8] {
        (try? LinkPacket.encode(control: .syn, sequence: 0x07, acknowledgement: 0, sessionID: 0, payload: payload)) ?? []
    }

    /// `count` bytes full of `FF 5A` and `FF 55` candidates with lying lengths: iAP2 headers whose
    /// checksum verifies (any control bits, SYN included; lengths up to 65535), iAP2 headers that do
    /// not verify, iAP1 starts in both length forms, and random bytes between them.
    static func garbage(count: Int, seed: UInt64) -> [UInt8] {
        var random = SplitMix64(seed: seed)
        var bytes: [UInt8] = []
        bytes.reserveCapacity(count + 16)
        while bytes.count < count {
            switch UInt8.random(in: 0..<6, using: &random) {
            case 0, 1:
                var header: [UInt8] = [0xFF, 0x5A, UInt8.random(in: 0...255, using: &random), UInt8.random(in: 0...255, using: &random)]
                for _ in 0..<4 { header.append(UInt8.random(in: 0...255, using: &random)) }
                header.append(Checksum.of(header))
                bytes += header
            case 2:
                bytes += [0xFF, 0x5A, UInt8.random(in: 0...255, using: &random), UInt8.random(in: 0...255, using: &random)]
            case 3:
                bytes += [0xFF, 0x55, UInt8.random(in: 2...0xFC, using: &random), 0x00, UInt8.random(in: 0...255, using: &random)]
            case 4:
                bytes += [0xFF, 0x55, 0x00, UInt8.random(in: 0...255, using: &random), UInt8.random(in: 0...255, using: &random)]
            default:
                for _ in 0..<Int.random(in: 0...24, using: &random) { bytes.append(UInt8.random(in: 0...255, using: &random)) }
            }
        }
        return Array(bytes.prefix(count))
    }
}

@Suite("Recovery on a noisy line: noise before a correct accessory")
struct NoisyLineTests {
    /// The accessory powers on 100 µs after the noise: its first bytes arrive while the host
    /// still holds whatever partial frame the noise left.
    static func identifyAfter(_ noise: [UInt8], host: LinkConfiguration = .device, chunk: Int = 4_096) -> (NoisyLine, Duration?) {
        var line = NoisyLine(host: host)
        line.startHost()
        line.noise(noise, chunk: chunk)
        line.now += .microseconds(100)
        line.startAccessory()
        let took = line.identification(within: .seconds(30))
        return (line, took)
    }

    /// One bad frame each, by name (the names are the test cases).
    static let badFrames: [String: [UInt8]] = [
        "an iAP2 header claiming 65,535 bytes": Noise.iap2Header(length: 65_535),
        "an iAP2 header claiming 4,000 bytes": Noise.iap2Header(length: 4_000),
        "an iAP2 header claiming 29 bytes (as long as a SYN may be)": Noise.iap2Header(length: 29),
        "a long iAP1 packet": Noise.iap1Header(length: 0xFFF0) + [UInt8](repeating: 0x20, count: 300),
        "an iAP1 packet claiming 64 bytes": [0xFF, 0x55, 0x40, 0x00, 0x13, 0x01],
        "a SYN of length 9": Noise.emptySYN,
        "a SYN whose parameters are cut short": Noise.malformedSYN(payload: [0x01, 0x05, 0x04, 0x00]),
        "a SYN whose session table is not whole": Noise.malformedSYN(payload: LinkConfiguration.accessory.parameters.encoded + [0x03]),
    ]

    @Test("one bad frame before a correct accessory: identified within 2 s of its first byte", arguments: [
        "an iAP2 header claiming 65,535 bytes", "an iAP2 header claiming 4,000 bytes",
        "an iAP2 header claiming 29 bytes (as long as a SYN may be)", "a long iAP1 packet", "an iAP1 packet claiming 64 bytes",
        "a SYN of length 9", "a SYN whose parameters are cut short", "a SYN whose session table is not whole",
    ])
    func oneBadFrame(name: String) throws {
        let noise = try #require(Self.badFrames[name])
        let (line, took) = Self.identifyAfter(noise)
        let time = try #require(took, "\(name): not identified within 30 s")
        #expect(time <= .seconds(2), "\(name): identified after \(time)")
        #expect(!line.linkFailed, "\(name): the link failed on the way")
        // How each was got rid of.
        let malformedSYNs = line.hostEvents.filter { if case .link(.malformedSYNDropped) = $0 { return true } else { return false } }
        switch name {
        case "an iAP2 header claiming 65,535 bytes":
            #expect(line.drops[.frameTooLong(65_535)] == 1, "dropped at once: \(line.drops)")
        case "an iAP2 header claiming 4,000 bytes":
            #expect(line.drops[.frameTooLong(4_000)] == 1, "dropped at once: \(line.drops)")
        case "a long iAP1 packet":
            #expect(line.drops[.frameTooLong(0xFFF0 + 6)] == 1, "dropped at once: \(line.drops)")
        case "an iAP2 header claiming 29 bytes (as long as a SYN may be)", "an iAP1 packet claiming 64 bytes":
            // No longer than may be right: given up on when the line fell silent.
            #expect(line.drops[.partialFrameAbandoned, default: 0] >= 1, "\(line.drops)")
            #expect(time >= LinkConfiguration.defaultInterByteGap)
        default:
            #expect(malformedSYNs.count == 1, "\(name): \(malformedSYNs)")
        }
        if !name.contains("SYN") { #expect(malformedSYNs.isEmpty) }
    }

    @Test("3 MB of FF 5A / FF 55 garbage with lying lengths, then a correct accessory: identified within 2 s")
    func garbageThenAccessory() throws {
        let garbage = Noise.garbage(count: 3 << 20, seed: 0x5EED)
        let (line, took) = Self.identifyAfter(garbage)
        let time = try #require(took, "not identified within 30 s; drops \(line.drops)")
        #expect(time <= .seconds(2), "identified after \(time)")
        // Lengths that could not be right were dropped at once, not waited for.
        let tooLong = line.drops.filter { if case .frameTooLong = $0.key { return true } else { return false } }.values.reduce(0, +)
        #expect(tooLong > 1_000, "\(line.drops)")
        #expect(line.droppedBytes > garbage.count / 2, "the garbage is dropped (\(line.droppedBytes) bytes)")
    }

    @Test("garbage that arrives slowly, with silences inside it, then a correct accessory: identified within 2 s")
    func slowGarbageThenAccessory() throws {
        // 64 KiB in pieces of 100 bytes, 60 ms apart: every partial frame the garbage leaves
        // is given up on before the next piece.
        var line = NoisyLine()
        line.startHost()
        line.noise(Noise.garbage(count: 64 << 10, seed: 0xBAD), chunk: 100, interval: .milliseconds(60))
        line.now += .microseconds(100)
        line.startAccessory()
        let took = line.identification(within: .seconds(30))
        let time = try #require(took, "not identified; drops \(line.drops)")
        #expect(time <= .seconds(2), "identified after \(time)")
        #expect(line.drops[.partialFrameAbandoned, default: 0] > 10, "\(line.drops)")
    }
}

@Suite("The link judges frame lengths by its state, gives up on stalled frames, and outlives malformed SYNs")
struct NoisyLinkTests {
    static let accessorySYN = (try? LinkPacket.encode(control: .syn, sequence: 0x01, acknowledgement: 0, sessionID: 0,
                                                      payload: LinkConfiguration.accessory.parameters.encoded)) ?? []

    /// A device link that answered the accessory's SYN and got its ACK.
    static func connectedDevice(_ configuration: LinkConfiguration = .device) throws -> IAP2Link {
        var device = IAP2Link(role: .device, configuration: configuration, initialSequence: 0x40)
        var sink = NullSink()
        device.receive(IAP2Detect.bytes + accessorySYN, now: .zero, sink: &sink)
        device.receive(try LinkPacket.encode(control: .ack, sequence: 0x01, acknowledgement: 0x40, sessionID: 0), now: .zero, sink: &sink)
        try #require(device.state == .connected)
        _ = device.takeOutput()
        _ = device.takeEvents()
        return device
    }

    /// The lengths of the frames dropped as too long, in order.
    static func tooLongLengths(_ events: [LinkEvent]) -> [Int] {
        events.compactMap { event -> Int? in
            guard case let .dropped(drop) = event, case let .frameTooLong(length) = drop.reason else { return nil }
            return length
        }
    }

    /// An accessory link brought up against a device link, with nothing left to take.
    static func connectedAccessory(_ configuration: LinkConfiguration) throws -> IAP2Link {
        var accessory = IAP2Link(role: .accessory, configuration: configuration, initialSequence: 0x01)
        var device = IAP2Link(role: .device, configuration: .device, initialSequence: 0x40)
        var sink = NullSink()
        accessory.start(now: .zero)
        for _ in 0..<6 {
            for frame in accessory.takeOutput() { device.receive(frame, now: .zero, sink: &sink) }
            for frame in device.takeOutput() { accessory.receive(frame, now: .zero, sink: &sink) }
        }
        try #require(accessory.state == .connected)
        _ = accessory.takeOutput()
        _ = accessory.takeEvents()
        return accessory
    }

    @Test func theLongestSYNFollowsFromTheParametersEncoding() {
        var full = LinkConfiguration.accessory.parameters
        full.sessions = [LinkSession(id: 1, type: .control), LinkSession(id: 2, type: .fileTransfer), LinkSession(id: 3, type: .externalAccessory)]
        #expect(full.violations().isEmpty)
        #expect(full.encoded.count == LinkParameters.maxEncodedLength)
        let syn = try? LinkPacket.encode(control: .syn, sequence: 1, acknowledgement: 0, sessionID: 0, payload: full.encoded)
        #expect(syn?.count == LinkParameters.maxSYNPacketLength)
        #expect(LinkParameters.maxSYNPacketLength == 29)
        // A fourth session repeats a type: no valid SYN is longer.
        full.sessions.append(LinkSession(id: 4, type: .externalAccessory))
        #expect(!full.violations().isEmpty)
    }

    @Test func beforeTheLinkIsUpNothingLongerThanASYNIsWaitedFor() throws {
        var device = IAP2Link(role: .device, configuration: .device, initialSequence: 0x40)
        var sink = NullSink()
        // One byte longer than the longest SYN, then the accessory's detect and SYN in the same read.
        device.receive(Noise.iap2Header(length: LinkParameters.maxSYNPacketLength + 1) + IAP2Detect.bytes + Self.accessorySYN,
                       now: .zero, sink: &sink)
        #expect(device.scanStatistics.dropsByKind[.frameTooLong] == 1)
        let answer = try LinkPacket.decode(try #require(device.takeOutput().last))
        #expect(answer.header.control == [.syn, .ack])
        #expect(device.takeEvents().contains(.dropped(ScanDrop(reason: .frameTooLong(30), byteCount: 1, streamOffset: 0))))
    }

    @Test func theAccessorysACKAndItsFirstPacketInOneReadAreBothTaken() throws {
        var device = IAP2Link(role: .device, configuration: .device, initialSequence: 0x40)
        var sink = NullSink()
        device.receive(IAP2Detect.bytes + Self.accessorySYN, now: .zero, sink: &sink)
        let ack = try LinkPacket.encode(control: .ack, sequence: 0x01, acknowledgement: 0x40, sessionID: 0)
        let first = try LinkPacket.encode(control: .ack, sequence: 0x02, acknowledgement: 0x40, sessionID: 1,
                                          payload: [UInt8](repeating: 0x42, count: 200))
        device.receive(ack + first, now: .milliseconds(1), sink: &sink)
        #expect(device.state == .connected)
        #expect(sink.delivered == [[UInt8](repeating: 0x42, count: 200)])
    }

    @Test func onceUpNothingLongerThanThisSideTakesIsWaitedFor() throws {
        // The accessory role takes what it offered; the device takes anything up to 65,535
        // bytes whatever it advertised (docs/LENIENCY.md), so only iAP1 noise is refused there.
        var configuration = LinkConfiguration.accessory
        configuration.parameters.maxPacketLength = 1_024
        var accessory = try Self.connectedAccessory(configuration)
        var sink = NullSink()
        let fits = try LinkPacket.encode(control: .ack, sequence: 0x41, acknowledgement: 0x01, sessionID: 1,
                                         payload: [UInt8](repeating: 7, count: 1_024 - LinkPacketHeader.overhead))
        accessory.receive(Noise.iap2Header(length: 1_025) + Noise.iap1Header(length: 300) + fits, now: .milliseconds(5), sink: &sink)
        let tooLong = Self.tooLongLengths(accessory.takeEvents())
        // The iAP1 start is refused twice: from its FF, and from its 55.
        #expect(tooLong == [1_025, 306, 305], "iAP1 packets other than the detect are not waited for either")
        #expect(accessory.scanStatistics.dropsByKind[.frameTooLong] == 3)
        #expect(sink.delivered.map(\.count) == [1_024 - LinkPacketHeader.overhead])
    }

    @Test func onceUpTheDeviceWaitsForAnyLengthButRefusesIAP1Noise() throws {
        var configuration = LinkConfiguration.device
        configuration.parameters.maxPacketLength = 1_024
        var device = try Self.connectedDevice(configuration)
        var sink = NullSink()
        let long = try LinkPacket.encode(control: .ack, sequence: 0x02, acknowledgement: 0x40, sessionID: 1,
                                         payload: [UInt8](repeating: 7, count: 4_000))
        device.receive(Noise.iap1Header(length: 300) + long, now: .milliseconds(5), sink: &sink)
        let tooLong = Self.tooLongLengths(device.takeEvents())
        #expect(tooLong == [306, 305])
        #expect(sink.delivered.map(\.count) == [4_000])
    }

    @Test func aPartialFrameIsAbandonedOnceTheLineFallsSilentForTheGap() throws {
        var configuration = LinkConfiguration.device
        configuration.interByteGap = .milliseconds(30)
        var device = try Self.connectedDevice(configuration)
        var sink = NullSink()
        let data = try LinkPacket.encode(control: .ack, sequence: 0x02, acknowledgement: 0x40, sessionID: 1, payload: [1, 2, 3, 4])
        // A liar that swallows a whole data packet, and nothing more comes.
        device.receive(Noise.iap2Header(length: 500) + data, now: .milliseconds(100), sink: &sink)
        #expect(sink.delivered.isEmpty)
        #expect(device.nextDeadline == .milliseconds(130))
        device.advance(to: .milliseconds(129), sink: &sink)
        #expect(device.statistics.partialFramesAbandoned == 0)
        device.advance(to: .milliseconds(130), sink: &sink)
        #expect(device.statistics.partialFramesAbandoned == 1)
        #expect(device.scanStatistics.dropsByKind[.partialFrameAbandoned] == 1)
        #expect(sink.delivered == [[1, 2, 3, 4]], "the swallowed packet is found and delivered")
        #expect(device.nextDeadline.map { $0 > .milliseconds(130) } ?? true, "no gap deadline once nothing is held")
    }

    @Test func bytesThatKeepComingKeepTheFrameAlive() throws {
        var configuration = LinkConfiguration.device
        configuration.interByteGap = .milliseconds(30)
        var device = try Self.connectedDevice(configuration)
        var sink = NullSink()
        let data = try LinkPacket.encode(control: .ack, sequence: 0x02, acknowledgement: 0x40, sessionID: 1,
                                         payload: [UInt8](repeating: 9, count: 100))
        // A slow line: ten bytes every 20 ms, each piece within the gap of the one before.
        var now = Duration.milliseconds(100)
        for start in stride(from: 0, to: data.count, by: 10) {
            device.advance(to: now, sink: &sink)
            device.receive(Array(data[start..<min(data.count, start + 10)]), now: now, sink: &sink)
            now += .milliseconds(20)
        }
        #expect(device.statistics.partialFramesAbandoned == 0)
        #expect(sink.delivered == [[UInt8](repeating: 9, count: 100)])
    }

    @Test("the device drops a malformed SYN, counts it, and keeps listening", arguments: [
        [UInt8](), [0x01, 0x05, 0x04], LinkConfiguration.accessory.parameters.encoded + [0x03, 0x02],
    ])
    func deviceOutlivesAMalformedSYN(payload: [UInt8]) throws {
        var device = IAP2Link(role: .device, configuration: .device, initialSequence: 0x40)
        var sink = NullSink()
        device.receive(IAP2Detect.bytes, now: .zero, sink: &sink)
        _ = device.takeOutput()
        device.receive(Noise.malformedSYN(payload: payload), now: .milliseconds(1), sink: &sink)
        #expect(device.state == .negotiating)
        #expect(device.statistics.malformedSYNsDropped == 1)
        #expect(device.takeEvents().contains { if case .malformedSYNDropped = $0 { return true } else { return false } })
        #expect(device.takeOutput().isEmpty, "nothing is answered to it")
        // The accessory's good SYN is answered.
        device.receive(Self.accessorySYN, now: .milliseconds(2), sink: &sink)
        let answer = try LinkPacket.decode(try #require(device.takeOutput().first))
        #expect(answer.header.control == [.syn, .ack])
        device.receive(try LinkPacket.encode(control: .ack, sequence: 0x01, acknowledgement: 0x40, sessionID: 0), now: .milliseconds(3), sink: &sink)
        #expect(device.state == .connected)
    }

    @Test func aSYNNobodyFollowsUpLeavesTheDeviceListeningNotFailed() throws {
        var device = IAP2Link(role: .device, configuration: .device, initialSequence: 0x40)
        var sink = NullSink()
        // A SYN that decodes (noise, or an accessory that went quiet): 3 retransmissions of 100 ms.
        var parameters = LinkConfiguration.accessory.parameters
        parameters.maxRetransmissions = 3
        parameters.retransmissionTimeout = 100
        let ghost = try LinkPacket.encode(control: .syn, sequence: 0x09, acknowledgement: 0, sessionID: 0, payload: parameters.encoded)
        device.receive(ghost, now: .zero, sink: &sink)
        var now = Duration.zero
        while let deadline = device.nextDeadline, deadline <= .seconds(5) {
            now = deadline
            device.advance(to: now, sink: &sink)
        }
        #expect(device.state == .negotiating)
        #expect(device.statistics.unansweredNegotiations == 1)
        #expect(device.nextDeadline == nil, "nothing more is sent: the device waits")
        // The real accessory's SYN is answered and the link comes up.
        device.receive(Self.accessorySYN, now: now + .seconds(1), sink: &sink)
        device.receive(try LinkPacket.encode(control: .ack, sequence: 0x01, acknowledgement: 0x40, sessionID: 0), now: now + .seconds(1),
                       sink: &sink)
        #expect(device.state == .connected)
    }

    @Test func theAccessoryDropsAMalformedSYNACKAndAsksAgain() throws {
        var accessory = IAP2Link(role: .accessory, configuration: .accessory, initialSequence: 0x01)
        var sink = NullSink()
        accessory.start(now: .zero)
        accessory.receive(IAP2Detect.bytes, now: .milliseconds(1), sink: &sink)
        let syn = try LinkPacket.decode(try #require(accessory.takeOutput().last))
        #expect(syn.header.control == [.syn])
        let bad = try LinkPacket.encode(control: [.syn, .ack], sequence: 0x40, acknowledgement: 0x01, sessionID: 0, payload: [0x01])
        accessory.receive(bad, now: .milliseconds(2), sink: &sink)
        #expect(accessory.state == .negotiating)
        #expect(accessory.statistics.malformedSYNsDropped == 1)
        // Its SYN goes again when the timer says so.
        accessory.advance(to: .seconds(2), sink: &sink)
        #expect(try accessory.takeOutput().map { try LinkPacket.decode($0).header.control } == [[.syn]])
    }

    @Test func theGapOfASerialLineFollowsItsBaudRate() {
        #expect(LinkConfiguration.interByteGap(baudRate: 115_200) == LinkConfiguration.defaultInterByteGap)
        #expect(LinkConfiguration.interByteGap(baudRate: 0) == LinkConfiguration.defaultInterByteGap)
        // 32 characters of 10 bits at 1200 baud: 266 ms; at 300 baud: 1.066 s.
        #expect(LinkConfiguration.interByteGap(baudRate: 1_200) == .microseconds(266_666))
        #expect(LinkConfiguration.interByteGap(baudRate: 300) == .microseconds(1_066_666))
    }
}

@Suite("iAP1 on a noisy line")
struct NoisyIAP1Tests {
    /// IdentifyDeviceLingoes with options 0 (no authentication): identifies at once when believed.
    static func identifyDeviceLingoes() throws -> [UInt8] {
        var packet: [UInt8] = []
        try IAP1Packet(lingo: 0, command: UInt16(IAP1Command.identifyDeviceLingoes),
                       payload: [0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0]).encode(into: &packet)
        return packet
    }

    static func asksToIdentify(_ frames: [[UInt8]]) -> Bool {
        frames.contains { $0.count >= 5 && $0[0] == 0xFF && $0[1] == 0x55 && $0[3] == 0x00 && $0[4] == IAP1Command.requestIdentify }
    }

    @Test("an iAP1 identification found among noise is not believed: no accessory is announced, and it is asked to identify again")
    func anIdentificationAmidNoiseIsNotBelieved() throws {
        var host = IAPEndpoint(device: .device, initialSequence: 0x40, randomSeed: 21)
        host.start(now: .zero)
        _ = host.takeOutput()
        host.receive([0x13, 0x37, 0xFF, 0x00, 0x42] + (try Self.identifyDeviceLingoes()), now: .milliseconds(1))
        let events = host.takeEvents()
        #expect(events.contains { if case .protocolSwitched(.iap1) = $0 { true } else { false } })
        #expect(!events.contains { if case .identified = $0 { true } else { false } }, "noise is not an accessory")
        #expect(host.identity == nil)
        #expect(Self.asksToIdentify(host.takeOutput()))

        // A real iAP1 accessory answers the request: now it is identified.
        host.receive(try Self.identifyDeviceLingoes(), now: .milliseconds(20))
        #expect(host.takeEvents().contains { if case .identified = $0 { true } else { false } })
        #expect(host.identity?.protocolVersion == .iap1)
    }

    @Test("on a clean line the same identification is believed at once")
    func aCleanIdentificationIsBelieved() throws {
        var host = IAPEndpoint(device: .device, initialSequence: 0x40, randomSeed: 21)
        host.start(now: .zero)
        _ = host.takeOutput()
        host.receive(try Self.identifyDeviceLingoes(), now: .milliseconds(1))
        #expect(host.takeEvents().contains { if case .identified = $0 { true } else { false } })
        #expect(!Self.asksToIdentify(host.takeOutput()))
    }

    @Test func aLyingIAP1LengthDoesNotHideTheDetectOfAnAccessoryThatStartsOver() {
        var device = IAP1Endpoint(device: AcceptingAuthentication(), interByteGap: .milliseconds(40), randomSeed: 3)
        device.start(now: .zero)
        // Claims 64 bytes; the iAP2 detect that follows disappears into it.
        device.receive([0xFF, 0x55, 0x40, 0x00, 0x13] + IAP2Detect.bytes, now: .milliseconds(10))
        #expect(!device.sawIAP2Detect)
        #expect(device.nextDeadline == .milliseconds(50))
        device.advance(to: .milliseconds(50))
        #expect(device.sawIAP2Detect)
        #expect(device.partialPacketsAbandoned == 1)
    }

    @Test func packetsLongerThanTheDeviceTakesAreNotWaitedFor() {
        var device = IAP1Endpoint(device: AcceptingAuthentication(), maxIncomingPayload: 1_000, randomSeed: 3)
        device.start(now: .zero)
        device.receive(Noise.iap1Header(length: 2_000) + IAP2Detect.bytes, now: .milliseconds(10))
        #expect(device.sawIAP2Detect, "the detect behind a length the device never takes is found at once")
    }
}
