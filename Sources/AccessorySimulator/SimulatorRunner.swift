public import Dispatch
public import IAPTransport
internal import IAPLink

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
///   Over a ``GadgetTransport`` the accessory also starts over each time a host configures the
///   USB function (a plug, a bus reset, the UDC bound again), as a real accessory starts its link
///   over on every new USB connection: the new host hears a detect at once, instead of a link
///   that is still busy with the old host's session (which it would ignore until that link
///   gave up).
public final class SimulatorRunner: @unchecked Sendable {
    // Confinement: all stored `var`s are touched on `queue` only.

    /// How the simulator reaches the host.
    public enum Attachment: Sendable {
        case memory(@Sendable (MemoryTransport) -> Void)
        case transport(any Transport)
    }

    public let queue: DispatchQueue
    public private(set) var profile: SimulatorProfile
    private let attachment: Attachment
    private var driver: EndpointDriver<SimulatedAccessory>?
    private var handler: (@Sendable (SimulatorEvent) -> Void)?
    private var generation: UInt8 = 1
    /// The gadget's connection as last seen (gadget attachments only).
    private var hostConnection: GadgetConnection?
    /// How many times a new USB host connection restarted the accessory.
    private var restartsForHost = 0

    /// - Throws: ``SimulatorProfileError`` when the profile has an invalid value.
    public init(profile: SimulatorProfile, attachment: Attachment,
                queue: DispatchQueue = DispatchQueue(label: "AccessorySimulator.runner")) throws(SimulatorProfileError) {
        try profile.validate()
        self.profile = profile
        self.attachment = attachment
        self.queue = queue
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
            driver?.stop()
            driver = nil
        }
    }

    private func makeMachine() -> SimulatedAccessory? {
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
            attach(host)
            transport = device
        case let .transport(wire):
            if let driver {
                driver.replaceMachine(machine)
                return
            }
            transport = wire
            if let gadget = wire as? GadgetTransport {
                hostConnection = gadget.connection
                gadget.onConnectionChange { [weak self] connection in
                    // On the gadget's ep0 thread: hop to the runner's queue, in order.
                    guard let self else { return }
                    self.queue.async { self.gadgetConnectionChanged(to: connection) }
                }
            }
        }
        let driver = EndpointDriver(machine: machine, transport: transport, queue: queue)
        self.driver = driver
        driver.start(update: { [weak self] machine, _ in
            guard let self else { return }
            for event in machine.takeEvents() { self.handle(event) }
        }, closed: { _ in })
    }

    private func handle(_ event: SimulatorEvent) {
        handler?(event)
        switch event {
        case let .reboot(version):
            profile = profile.withFirmwareVersion(version)
            queue.async { self.reboot() }
        case .vanish:
            queue.async {
                self.driver?.stop()
                self.driver = nil
            }
        default:
            break
        }
    }

    /// A host configured the function anew (not a resume from suspend): start the accessory
    /// over behind the same transport, so it sends the detect now.
    private func gadgetConnectionChanged(to connection: GadgetConnection) {
        let before = hostConnection
        hostConnection = connection
        guard connection == .enabled, before != .suspended, before != .enabled,
              let driver, let machine = makeMachine() else { return }
        restartsForHost += 1
        driver.replaceMachine(machine)
    }

    /// How many times the accessory started over for a new USB host connection (test hook).
    var hostConnectionRestarts: Int { queue.sync { restartsForHost } }

    private func reboot() {
        if case .memory = attachment {
            driver?.stop()
            driver = nil
        }
        launch()
    }
}
