import AccessorySimulator
import IAPLink
import IAPWire
import Testing

/// The host the manager runs (the switching ``IAPEndpoint``) on a line that carried noise before
/// a simulated accessory was powered on, on virtual time.
struct NoisySimLine {
    var host = IAPEndpoint(device: .device, initialSequence: 0x40, randomSeed: 31)
    var accessory: SimulatedAccessory
    var toAccessory = Wire()
    var toHost = Wire()
    var now: Duration = .zero
    var poweredOn = false
    var dropped: [ScanDropReason: Int] = [:]

    init(profile: SimulatorProfile) throws {
        accessory = try SimulatedAccessory(profile: profile)
    }

    mutating func collect() {
        for event in host.takeEvents() {
            if case let .link(.dropped(drop)) = event { dropped[drop.reason, default: 0] += 1 }
        }
        _ = accessory.takeEvents()
        let fromHost = host.takeOutput()
        // Nobody hears the host before the accessory is on.
        if poweredOn { for frame in fromHost { toAccessory.send(frame, now: now) } }
        for frame in accessory.takeOutput() { toHost.send(frame, now: now) }
    }

    /// Noise reaches the host in pieces of 4 KiB, 20 µs apart.
    mutating func noise(_ bytes: [UInt8]) {
        host.start(now: now)
        collect()
        for start in stride(from: 0, to: bytes.count, by: 4_096) {
            host.receive(Array(bytes[start..<min(bytes.count, start + 4_096)]), now: now)
            now += .microseconds(20)
            if let deadline = host.nextDeadline, deadline <= now { host.advance(to: now) }
            collect()
        }
    }

    /// Powers the accessory on 100 µs after the noise and runs until the host identified it;
    /// returns how long that took from the accessory's first byte.
    mutating func identification(within limit: Duration) -> Duration? {
        now += .microseconds(100)
        let start = now
        poweredOn = true
        accessory.start(now: now)
        collect()
        while now <= start + limit, host.identity == nil {
            let forAccessory = toAccessory.due(now)
            let forHost = toHost.due(now)
            for frame in forAccessory { accessory.receive(frame, now: now) }
            for frame in forHost { host.receive(frame, now: now) }
            collect()
            if !forAccessory.isEmpty || !forHost.isEmpty { continue }
            let next = [toAccessory.nextDelivery, toHost.nextDelivery, host.nextDeadline, accessory.nextDeadline].compactMap { $0 }.min()
            guard let next else { break }
            now = max(now, next)
            host.advance(to: now)
            accessory.advance(to: now)
            collect()
        }
        return host.identity.map { _ in now - start }
    }
}

@Suite("Power-on noise, then a simulated accessory")
struct NoisyLineSimulatorTests {
    /// An iAP2 header whose checksum verifies and whose length field lies.
    static func liar(_ length: Int) -> [UInt8] {
        var header: [UInt8] = [0xFF, 0x5A, UInt8(length >> 8), UInt8(length & 0xFF), 0x40, 0x11, 0x22, 0x01]
        header.append(Checksum.of(header))
        return header
    }

    /// 2 MiB of `FF 5A` headers (checksums right, lengths lying, any control bits) and `FF 55`
    /// starts in both length forms, among random bytes; a fixed seed.
    static func garbage() -> [UInt8] {
        var state: UInt64 = 0x0DDB_A115
        func next() -> UInt8 {
            state = state &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
            return UInt8(truncatingIfNeeded: state >> 33)
        }
        var bytes: [UInt8] = []
        while bytes.count < 2 << 20 {
            switch next() % 4 {
            case 0:
                var header: [UInt8] = [0xFF, 0x5A, next(), next(), next(), next(), next(), next()]
                header.append(Checksum.of(header))
                bytes += header
            case 1: bytes += [0xFF, 0x55, next(), next(), next()]
            case 2: bytes += [0xFF, 0x55, 0x00, next(), next()]
            default: for _ in 0..<Int(next() % 16) { bytes.append(next()) }
            }
        }
        return bytes
    }

    static let noises: [String: [UInt8]] = [
        "a header claiming 65,535 bytes": liar(65_535),
        "a long iAP1 packet": [0xFF, 0x55, 0x00, 0xFF, 0xF0, 0x00, 0x13] + [UInt8](repeating: 0x41, count: 500),
        "a SYN of length 9": (try? LinkPacket.encode(control: .syn, sequence: 3, acknowledgement: 0, sessionID: 0, payload: [])) ?? [],
        "a malformed SYN": (try? LinkPacket.encode(control: .syn, sequence: 3, acknowledgement: 0, sessionID: 0,
                                                   payload: [0x01, 0x05, 0x04, 0x00, 0x13, 0x88, 0x00])) ?? [],
        "2 MiB of garbage with lying lengths": garbage(),
    ]

    @Test("identified within 2 s of the accessory's first byte", arguments: [
        "a header claiming 65,535 bytes", "a long iAP1 packet", "a SYN of length 9", "a malformed SYN",
        "2 MiB of garbage with lying lengths",
    ], ["multi-sensor", "legacy-sensor"])
    func identifiedAfterNoise(noise name: String, profile: String) throws {
        var line = try NoisySimLine(profile: try .named(profile))
        line.noise(try #require(Self.noises[name]))
        let took = line.identification(within: .seconds(30))
        let time = try #require(took, "\(profile) after \(name): not identified within 30 s (drops \(line.dropped))")
        #expect(time <= .seconds(2), "\(profile) after \(name): identified after \(time)")
        #expect(line.host.protocolVersion == (profile == "legacy-sensor" ? .iap1 : .iap2))
        if name == "a header claiming 65,535 bytes" { #expect(line.dropped[.frameTooLong(65_535)] == 1) }
    }
}
