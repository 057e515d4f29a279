import AccessorySimulator
import IAPLink
import Testing

/// One direction of an in-memory wire with a fixed latency; frames arrive in order.
struct Wire {
    var latency: Duration = .microseconds(100)
    private(set) var inFlight: [(at: Duration, bytes: [UInt8])] = []
    /// When set, everything is lost (the transport was cut).
    var cut = false

    mutating func send(_ frame: [UInt8], now: Duration) {
        guard !cut else { return }
        inFlight.append((now + latency, frame))
    }

    var nextDelivery: Duration? { inFlight.first?.at }

    mutating func due(_ now: Duration) -> [[UInt8]] {
        let count = inFlight.prefix { $0.at <= now }.count
        defer { inFlight.removeFirst(count) }
        return inFlight.prefix(count).map(\.bytes)
    }
}

/// A device-role endpoint and a simulated accessory wired together, on virtual time.
struct SimHarness {
    var device: IAP2Endpoint
    var accessory: SimulatedAccessory
    var toAccessory = Wire()
    var toDevice = Wire()
    var now: Duration = .zero
    var deviceEvents: [EndpointEvent] = []
    var accessoryEvents: [SimulatorEvent] = []

    init(profile: SimulatorProfile, deviceBufferLimit: Int = 1 << 20, accessoryBufferLimit: Int = 65_536) throws {
        device = IAP2Endpoint(device: .device, sessionBufferLimit: deviceBufferLimit, initialSequence: 0x40, randomSeed: 7)
        accessory = try SimulatedAccessory(profile: profile, sessionBufferLimit: accessoryBufferLimit)
    }

    mutating func start() {
        accessory.start(now: now)
        device.start(now: now)
    }

    /// Cuts the transport both ways (what an owner does after vanish or reboot).
    mutating func cut() {
        toAccessory.cut = true
        toDevice.cut = true
    }

    /// Moves output, delivers what is due, or advances time to the next thing scheduled.
    /// Returns false when nothing at all is pending.
    mutating func step() -> Bool {
        for frame in device.takeOutput() { toAccessory.send(frame, now: now) }
        for frame in accessory.takeOutput() { toDevice.send(frame, now: now) }
        let forAccessory = toAccessory.due(now)
        let forDevice = toDevice.due(now)
        for frame in forAccessory { accessory.receive(frame, now: now) }
        for frame in forDevice { device.receive(frame, now: now) }
        collect()
        if !forAccessory.isEmpty || !forDevice.isEmpty || device.hasOutput || accessory.hasOutput { return true }
        let next = [toAccessory.nextDelivery, toDevice.nextDelivery, device.nextDeadline, accessory.nextDeadline]
            .compactMap { $0 }.min()
        guard let next else { return false }
        now = max(now, next)
        device.advance(to: now)
        accessory.advance(to: now)
        collect()
        return true
    }

    private mutating func collect() {
        deviceEvents += device.takeEvents()
        accessoryEvents += accessory.takeEvents()
    }

    /// Steps until `condition` holds (it may read and write: it is the host application) or
    /// virtual time passes `limit`.
    @discardableResult
    mutating func run(until limit: Duration = .seconds(60), _ condition: (inout SimHarness) throws -> Bool) rethrows -> Bool {
        while now <= limit {
            if try condition(&self) { return true }
            if !step() { return try condition(&self) }
        }
        return false
    }

    /// Runs the handshake to the end: the device has identified the accessory.
    mutating func connect() -> Bool {
        start()
        return run(until: now + .seconds(10)) { harness in
            harness.device.identity != nil && harness.accessoryEvents.contains { if case .identified = $0 { true } else { false } }
        }
    }

    /// Opens a session for `protocolName` and runs until both sides have it open.
    mutating func open(_ protocolName: String) throws -> UInt16 {
        let id = try device.openSession(protocolName: protocolName, now: now)
        let opened = run(until: now + .seconds(5)) { harness in
            harness.device.sessionState(id) == .open && harness.accessory.statistics(for: id) != nil
        }
        #expect(opened, "session for \(protocolName) did not open")
        return id
    }

    /// Writes as much of `data[offset...]` as the device takes; returns the new offset.
    mutating func write(_ session: UInt16, _ data: [UInt8], from offset: Int) throws -> Int {
        guard offset < data.count else { return offset }
        return offset + (try device.write(session, data[offset...], now: now))
    }

    func events<T>(_ pick: (SimulatorEvent) -> T?) -> [T] { accessoryEvents.compactMap(pick) }
}

/// A deterministic pseudo-random test stream.
func testBytes(_ count: Int, seed: UInt64) -> [UInt8] {
    var state = seed | 1
    var bytes = [UInt8](repeating: 0, count: count)
    for index in bytes.indices {
        state ^= state << 13
        state ^= state >> 7
        state ^= state << 17
        bytes[index] = UInt8(truncatingIfNeeded: state >> 24)
    }
    return bytes
}

extension SimulatorProfile {
    /// A built-in profile, or a failed expectation.
    static func named(_ name: String) throws -> SimulatorProfile {
        try #require(SimulatorProfile.builtIn(named: name))
    }
}
