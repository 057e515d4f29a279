import IAPLink
import IAPWire
import TestSupport
import Testing

/// One direction of a lossy wire: drops, duplicates, reorders, corrupts and delays packets, by
/// a seeded model.
struct Channel {
    var drop = 0.0
    var duplicate = 0.0
    var corrupt = 0.0
    var reorder = 0.0
    var latency: Duration = .microseconds(100)
    var jitter: Duration = .zero
    var random: SplitMix64
    /// When set, every packet is dropped (a peer that stopped answering).
    var blackHole = false
    /// When set, the packets it returns true for are dropped (a loss chosen by a test).
    var filter: (([UInt8]) -> Bool)?
    private(set) var inFlight: [(at: Duration, order: Int, bytes: [UInt8])] = []
    private var order = 0
    private(set) var sent = 0

    init(seed: UInt64) { random = SplitMix64(seed: seed) }

    mutating func send(_ packet: [UInt8], now: Duration) {
        sent += 1
        if let filter, filter(packet) { return }
        if blackHole || Double.random(in: 0..<1, using: &random) < drop { return }
        var bytes = packet
        if Double.random(in: 0..<1, using: &random) < corrupt, !bytes.isEmpty {
            bytes[Int.random(in: 0..<bytes.count, using: &random)] ^= UInt8.random(in: 1...255, using: &random)
        }
        var at = now + latency
        if jitter > .zero { at += jitter * Double.random(in: 0..<1, using: &random) }
        if Double.random(in: 0..<1, using: &random) < reorder { at += latency * 3 }
        enqueue(bytes, at: at)
        if Double.random(in: 0..<1, using: &random) < duplicate { enqueue(bytes, at: at + latency) }
    }

    private mutating func enqueue(_ bytes: [UInt8], at: Duration) {
        order += 1
        inFlight.append((at, order, bytes))
    }

    var nextDelivery: Duration? { inFlight.map(\.at).min() }

    /// Packets due at `now`, in delivery order.
    mutating func due(_ now: Duration) -> [[UInt8]] {
        let ready = inFlight.filter { $0.at <= now }.sorted { ($0.at, $0.order) < ($1.at, $1.order) }
        inFlight.removeAll { $0.at <= now }
        return ready.map(\.bytes)
    }
}

/// A device and an accessory wired together through two channels, on virtual time.
struct Pair {
    var device: IAP2Endpoint
    var accessory: IAP2Endpoint
    var toAccessory: Channel
    var toDevice: Channel
    var now: Duration = .zero
    var deviceEvents: [EndpointEvent] = []
    var accessoryEvents: [EndpointEvent] = []
    /// Called after every step: the test's application logic (reading, echoing…).
    var windowViolations = 0

    init(identity: AccessoryIdentity = .sample, device: LinkConfiguration = .device, accessory: LinkConfiguration = .accessory,
         seed: UInt64 = 1, policy: any AuthenticationPolicy = AcceptingAuthentication(), bufferLimit: Int = 1 << 20) {
        self.device = IAP2Endpoint(device: device, policy: policy, sessionBufferLimit: bufferLimit, initialSequence: 0x40, randomSeed: seed)
        self.accessory = IAP2Endpoint(accessory: identity, configuration: accessory, sessionBufferLimit: bufferLimit,
                                      initialSequence: 0x01, randomSeed: seed &+ 1)
        toAccessory = Channel(seed: seed &* 31 &+ 7)
        toDevice = Channel(seed: seed &* 17 &+ 3)
    }

    mutating func start() {
        accessory.start(now: now)
        device.start(now: now)
    }

    /// Moves output, delivers what is due, advances time to the next event; one step.
    /// Returns false when nothing at all is pending.
    mutating func step() -> Bool {
        for packet in device.takeOutput() { toAccessory.send(packet, now: now) }
        for packet in accessory.takeOutput() { toDevice.send(packet, now: now) }
        checkWindows()
        let forAccessory = toAccessory.due(now)
        let forDevice = toDevice.due(now)
        for packet in forAccessory { accessory.receive(packet, now: now) }
        for packet in forDevice { device.receive(packet, now: now) }
        deviceEvents += device.takeEvents()
        accessoryEvents += accessory.takeEvents()
        if !forAccessory.isEmpty || !forDevice.isEmpty || device.hasOutput || accessory.hasOutput { return true }
        let candidates = [toAccessory.nextDelivery, toDevice.nextDelivery, device.nextDeadline, accessory.nextDeadline].compactMap { $0 }
        guard let next = candidates.min() else { return false }
        now = max(now, next)
        device.advance(to: now)
        accessory.advance(to: now)
        deviceEvents += device.takeEvents()
        accessoryEvents += accessory.takeEvents()
        return true
    }

    /// Steps until `condition` holds or virtual time passes `limit`.
    @discardableResult
    mutating func run(until limit: Duration = .seconds(60), _ condition: (inout Pair) -> Bool) -> Bool {
        while now <= limit {
            if condition(&self) { return true }
            if !step() { return condition(&self) }
        }
        return false
    }

    /// The invariant of the window: never more packets in flight than the peer accepts.
    mutating func checkWindows() {
        for link in [device.link, accessory.link] {
            if let window = link.peerLimits?.maxOutstandingPackets, link.inFlightCount > Int(window) { windowViolations += 1 }
        }
    }

    var identified: Bool { device.identity != nil && accessoryEvents.contains { if case .identified = $0 { return true } else { return false } } }
}

extension AccessoryIdentity {
    static let sample = AccessoryIdentity(
        name: "Test Sensor", modelIdentifier: "TS-1", manufacturer: "Acme", serialNumber: "SN0001", firmwareVersion: "1.2.3",
        hardwareVersion: "A", messagesSent: [0xAE00, 0xEA03], messagesReceived: [0xAE01, 0xEA00, 0xEA01],
        powerProvidingCapability: 0, maximumCurrentDrawnFromDevice: 100,
        protocols: [
            ExternalAccessoryProtocol(identifier: 1, name: "com.acme.fw"),
            ExternalAccessoryProtocol(identifier: 2, name: "com.acme.data"),
            ExternalAccessoryProtocol(identifier: 3, name: "com.acme.log"),
            ExternalAccessoryProtocol(identifier: 4, name: "com.acme.ctl"),
        ],
        supportedLanguages: ["en", "de"])
}

/// Bytes of a test stream: a position-dependent pattern, so a dropped, duplicated or reordered
/// byte shows.
func pattern(_ stream: Int, _ offset: Int, _ count: Int) -> [UInt8] {
    bytes(count, from: offset) { UInt8(truncatingIfNeeded: ($0 &* 131) ^ ($0 >> 8) &+ stream &* 29) }
}
