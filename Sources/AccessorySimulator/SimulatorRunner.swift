public import Dispatch
public import IAPTransport
public import IAPLink

extension SimulatedAccessory: DrivenMachine {}

/// Runs a ``SimulatedAccessory`` over a real transport on its own Dispatch queue, and plays its
/// reboots and disappearances.
///
/// Two ways to attach it:
/// - ``Attachment/memory(_:)``: an in-process accessory. Each start (and each reboot) makes a new
///   ``MemoryTransport`` pair and hands the host side to the closure (typically
///   `AccessoryManager.attach`), so a reboot looks to the host like an unplug and a replug.
/// - ``Attachment/transport(_:)``: a wire that stays, such as the master side of a
///   pseudo-terminal; a reboot restarts the accessory behind it (it sends the detect again).
///   Over a ``HostReconnectingWire`` (the USB gadget of `AccessoryGadget`) the accessory also
///   starts over each time a host configures the USB function (a plug, a bus reset, the UDC bound again), as a real accessory starts its link
///   over on every new USB connection: the new host hears a detect at once, instead of a link
///   that is still busy with the old host's session (which it would ignore until that link
///   gave up).
public final class SimulatorRunner: @unchecked Sendable {
    // Confinement: all stored `var`s are touched on `queue` only.

    /// How the simulator reaches the host.
    public enum Attachment: Sendable {
        /// In process: each start and each reboot makes a new ``MemoryTransport`` pair and hands its
        /// host side to the closure (for example `AccessoryManager.attach`); called on the runner's
        /// queue.
        case memory(@Sendable (MemoryTransport) -> Void)
        /// Over a wire that stays across reboots (a pseudo-terminal's master side, a USB gadget): the
        /// accessory restarts behind it and sends the detect again.
        case transport(any Transport)
    }

    /// The queue the accessory runs on (by default one of its own, so an in-process host and
    /// accessory use two cores); events are delivered there.
    public let queue: DispatchQueue
    /// The profile the accessory runs: the one it started with, then with the firmware version a
    /// completed firmware update installed. Read it on ``queue`` (or once the runner is stopped).
    public private(set) var profile: SimulatorProfile
    private let attachment: Attachment
    /// The time the accessory runs on (its detect repeats, link timers, habits).
    private let clock: any LinkClock
    private var driver: EndpointDriver<SimulatedAccessory>?
    private var handler: (@Sendable (SimulatorEvent) -> Void)?
    private var generation: UInt8 = 1
    /// The wire's host connection as last seen (``HostReconnectingWire`` attachments only).
    private var hostConnection: HostConnectionState?
    /// How many times a new USB host connection restarted the accessory.
    private var restartsForHost = 0
    /// The accessory's ends of the open native-transport sessions, by native session id.
    private var nativeChannels: [UInt16: any ByteChannel] = [:]
    /// Counts machines made, so a host still holding a rebooted accessory's transport cannot
    /// open native sessions on its successor.
    private var machineGeneration = 0

    /// A runner for `profile`, attached as `attachment`, on `queue`; nothing runs before
    /// ``start(events:)``. `clock` is the system's unless a test passes a ``ManualLinkClock``
    /// (the host's, so that both sides move together).
    ///
    /// - Throws: ``SimulatorProfileError`` when the profile has an invalid value.
    public init(profile: SimulatorProfile, attachment: Attachment,
                queue: DispatchQueue = DispatchQueue(label: "AccessorySimulator.runner"),
                clock: any LinkClock = SystemLinkClock()) throws(SimulatorProfileError) {
        try profile.validate()
        _ = try profile.signer() // a certificate or key that cannot be used is said now, not at start
        self.profile = profile
        self.attachment = attachment
        self.queue = queue
        self.clock = clock
    }

    /// Starts the accessory; `events` (optional) sees everything it reports, on the runner's queue.
    public func start(events: (@Sendable (SimulatorEvent) -> Void)? = nil) {
        queue.async {
            self.handler = events
            self.launch()
        }
    }

    /// Stops the accessory and closes its transport.
    public func stop() {
        queue.sync {
            closeNativeChannels()
            driver?.stop()
            driver = nil
        }
    }

    private func makeMachine() -> SimulatedAccessory? {
        closeNativeChannels()
        machineGeneration += 1
        generation &+= 0x20
        // The profile was validated when the runner was made; a reboot changes only the version.
        return try? SimulatedAccessory(profile: profile, sessionBufferLimit: 1 << 20, initialSequence: generation)
    }

    private func launch() {
        guard let machine = makeMachine() else { return }
        let transport: any Transport
        switch attachment {
        case let .memory(attach):
            let (host, device) = MemoryTransport.pair(name: "simulated \(profile.identity().name)")
            if !profile.nativeProtocolNames.isEmpty {
                host.nativeTransports = SimulatedNativeTransports(runner: self, names: profile.nativeProtocolNames,
                                                                  generation: machineGeneration)
            }
            attach(host)
            transport = device
        case let .transport(wire):
            if let driver {
                driver.replaceMachine(machine)
                return
            }
            transport = wire
            if let gadget = wire as? any HostReconnectingWire {
                hostConnection = gadget.hostConnection
                gadget.onHostConnectionChange { [weak self] connection in
                    // On the wire's own thread: hop to the runner's queue, in order.
                    guard let self else { return }
                    self.queue.async { self.gadgetConnectionChanged(to: connection) }
                }
            }
        }
        let driver = EndpointDriver(machine: machine, transport: transport, queue: queue, clock: clock)
        self.driver = driver
        driver.start(update: { [weak self] machine, now in
            guard let self else { return }
            for event in machine.takeEvents() { self.handle(event) }
            self.pumpNative(&machine, now: now)
        }, closed: { _ in })
    }

    // MARK: Native transports

    /// A host opened `protocolName`'s native transport (selected alternate setting 1 of its
    /// interface): the accessory runs the protocol's behaviour on `channel`'s raw bytes until
    /// either side closes it. When the profile has no such native protocol, or the accessory is
    /// gone, the channel is closed at once. What a USB gadget (or a test's USB wire) calls.
    public func openNativeSession(for protocolName: String, over channel: any ByteChannel) {
        queue.async { [self] in
            if !attachNative(protocolName, channel: channel, generation: machineGeneration) { channel.close() }
        }
    }

    /// A host opened `name` on its native transport: starts the session on the accessory and
    /// serves it over `channel`. False when the accessory is gone or was replaced.
    func attachNative(_ name: String, channel: any ByteChannel, generation: Int) -> Bool {
        dispatchPrecondition(condition: .onQueue(queue))
        guard generation == machineGeneration, let driver,
              let id = driver.perform({ machine, now in machine.openNativeSession(protocolName: name, now: now) })
        else { return false }
        nativeChannels[id] = channel
        channel.activate(queue: queue) { [weak self] event in self?.nativeEvent(id, event) }
        // What the session's behaviour wrote when it opened (a source's first chunks) waited for
        // a channel that was not there yet: move it now, not at the machine's next event (which,
        // on an idle link, may never come).
        driver.perform { machine, now in pumpNative(&machine, now: now) }
        return true
    }

    private func nativeEvent(_ id: UInt16, _ event: ByteChannelEvent) {
        guard let driver, nativeChannels[id] != nil else { return }
        if case .closed = event {
            // What arrived before the close is still the session's: take it in first.
            driver.perform { machine, now in
                pumpNative(&machine, now: now)
                machine.closeNativeSession(id, now: now)
            }
            nativeChannels[id] = nil
            return
        }
        driver.perform { machine, now in pumpNative(&machine, now: now) }
    }

    /// Moves raw bytes between every native channel and the accessory until nothing moves: what
    /// the host sent, as far as the accessory has room, and what the accessory wrote, as far as
    /// the channel takes it. A side that stops reading stops the other.
    private func pumpNative(_ machine: inout SimulatedAccessory, now: LinkTime) {
        for (id, channel) in nativeChannels {
            var moved = true
            while moved {
                moved = false
                while machine.nativeRoom(id) > 0, channel.readableByteCount > 0 {
                    // Taken as a view of the channel's buffer where it has one (in process).
                    let chunk = channel.readChunk(maxBytes: machine.nativeRoom(id))
                    let taken = machine.receiveNative(id, chunk, now: now)
                    guard taken > 0 else { break }
                    moved = true
                }
                // Offered even when the channel looks full: a write that takes nothing is what
                // asks the channel for a `.writable` later.
                if machine.hasNativeOutput(id) {
                    var wrote = 0
                    machine.drainNativeOutput(id) { bytes in
                        wrote = channel.write(bytes)
                        return wrote
                    }
                    moved = moved || wrote > 0
                }
            }
        }
    }

    /// Ends every native session because the accessory went away (stopped, vanished, rebooted):
    /// the host's side hears an error, as it would from a USB device that disappeared.
    private func closeNativeChannels() {
        for channel in nativeChannels.values {
            if let memory = channel as? MemoryByteChannel {
                memory.close(error: TransportError("the simulated accessory went away"))
            } else {
                channel.close()
            }
        }
        nativeChannels.removeAll()
    }

    private func handle(_ event: SimulatorEvent) {
        handler?(event)
        switch event {
        case let .reboot(version):
            profile = profile.withFirmwareVersion(version)
            queue.async { self.reboot() }
        case .vanish:
            queue.async {
                self.closeNativeChannels()
                self.driver?.stop()
                self.driver = nil
            }
        default:
            break
        }
    }

    /// A host configured the function anew (not a resume from suspend): start the accessory
    /// over behind the same transport, so it sends the detect now.
    private func gadgetConnectionChanged(to connection: HostConnectionState) {
        let before = hostConnection
        hostConnection = connection
        guard connection == .configured, before != .suspended, before != .configured,
              let driver, let machine = makeMachine() else { return }
        restartsForHost += 1
        driver.replaceMachine(machine)
    }

    /// The accessory's link counters (its bare ACKs, retransmissions…), nil before its link
    /// exists. For benchmarks: `iapbench` reports the bare ACKs each side sent per data packet.
    public var linkStatistics: LinkStatistics? { queue.sync { driver?.inspect { $0.endpoint.linkStatistics } } }

    /// How many times the accessory started over for a new USB host connection.
    public var hostConnectionRestarts: Int { queue.sync { restartsForHost } }

    private func reboot() {
        if case .memory = attachment {
            driver?.stop()
            driver = nil
        }
        launch()
    }
}

/// Where a wire's host stands, for a wire whose host can come and go under it.
public enum HostConnectionState: Sendable, Hashable {
    /// No host, or a host that has not configured the device (or reset it).
    case absent
    /// A host configured the device: the wire carries data.
    case configured
    /// The bus is suspended; the host that configured the device is still there.
    case suspended
}

/// A wire whose host can come and go under it, as a USB gadget's does (a plug, a bus reset, the
/// device controller bound again). A ``SimulatorRunner`` over one starts the accessory over each
/// time a new host configures it, as a real accessory restarts its link on every USB connection.
public protocol HostReconnectingWire: Transport {
    /// The host connection now.
    var hostConnection: HostConnectionState { get }
    /// Calls `handler` with every change of ``hostConnection``, on the wire's own thread: it must
    /// return quickly and must not wait for the queue the wire was activated on.
    func onHostConnectionChange(_ handler: @escaping @Sendable (HostConnectionState) -> Void)
}

/// The native-transport interfaces of an in-process simulated accessory, as the host side of its
/// memory transport offers them: each open makes a ``MemoryByteChannel`` pair and starts the
/// session on the accessory.
final class SimulatedNativeTransports: NativeTransportProvider {
    private let runner: SimulatorRunner
    let nativeProtocolNames: [String]
    private let generation: Int

    init(runner: SimulatorRunner, names: [String], generation: Int) {
        self.runner = runner
        self.nativeProtocolNames = names
        self.generation = generation
    }

    func openNativeChannel(for protocolName: String, queue: DispatchQueue,
                           completion: @escaping @Sendable (Result<any ByteChannel, TransportError>) -> Void) {
        guard nativeProtocolNames.contains(protocolName) else {
            queue.async { completion(.failure(TransportError("the simulated accessory has no native transport for '\(protocolName)'"))) }
            return
        }
        let (host, accessory) = MemoryByteChannel.pair(name: "simulated native \(protocolName)")
        let runner = self.runner, generation = self.generation
        runner.queue.async {
            let attached = runner.attachNative(protocolName, channel: accessory, generation: generation)
            queue.async {
                completion(attached ? .success(host) : .failure(TransportError("the simulated accessory went away")))
            }
        }
    }
}
