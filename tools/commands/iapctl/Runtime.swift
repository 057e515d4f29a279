import AccessoryHost
import AccessoryHostBluetooth
import AccessoryHostUSB
import AccessoryLogging
import AccessorySimulator
import BluetoothTransport
import CLIKit
import Dispatch
import Glibc
import IAPInspect
import IAPLink
import IAPTransport
import IAPWire
import Synchronization
import USBHost
import SystemCalls

/// The option groups of iapctl's command specs (see `CommandSpec.refusedGroups`): statics, so
/// that they are there before main.swift's top-level specs are built.
enum OptionGroup {
    /// The options that find accessories and trace them (--serial, --simulate, --timeout…).
    static let accessory = "accessory"
    /// --auth, --trust, --check-validity.
    static let authentication = "authentication"
}

/// A failure with the exit status scripts can act on.
struct ToolError: Error, ExitCodeProviding, CustomStringConvertible {
    var description: String
    var exitCode: ExitCode
}

/// The manager and the accessories the global options ask for: USB (unless `--no-usb`),
/// `--serial`, `--simulate`.
final class HostContext: Sendable {
    let manager: AccessoryManager
    let simulators: Mutex<[SimulatorRunner]> = Mutex([])
    let logger: Logger
    let traceSink: TraceSink?
    /// Whether accessories may still connect over Bluetooth of their own accord (`--bluetooth`):
    /// a command then waits (up to `--timeout`) for the first one before it settles.
    let awaitsBluetooth: Bool
    /// Transports that failed before an accessory was identified on them (a USB device that
    /// cannot be opened…), as "location: reason".
    let failures = FailureLog()
    private let subscription: EventSubscription
    /// The command's own subscription (``Hooks/events``), from before any source started.
    let commandSubscription: EventSubscription?

    /// What a command may change in how the context is built (`report`: its own logger and
    /// trace, and never through iapd).
    struct Hooks {
        /// The logger instead of one at the `-v` level on standard error.
        var logger: Logger?
        /// Wraps every transport (inside `--trace`'s own tap, so both see the same bytes).
        var transportTap: (@Sendable (any Transport) -> any Transport)?
        /// Open accessories in this process whatever `--direct` says.
        var direct = false
        /// Events delivered on the queue from before any source starts (`watch`): a simulated
        /// accessory is identified, and may ask for an app, before the context is built.
        var events: (queue: DispatchQueue, handler: @Sendable (AccessoryEvent) -> Void)?
        /// The host's link configuration instead of the library's (its advertised receive
        /// limits: `bench --host-limits`).
        var link: LinkConfiguration?
    }

    init(_ command: ParsedCommand, supportedProtocols: [String] = [], hooks: Hooks = Hooks()) throws {
        logger = hooks.logger ?? Logger(label: "iapctl", logLevel: Logger.verbosity(command.count("verbose")))
        traceSink = try TraceSink(command)
        var configuration = AccessoryManager.Configuration(supportedProtocols: supportedProtocols, logger: logger)
        configuration.authentication = try AuthenticationOptions.policy(command)
        if let link = hooks.link { configuration.link = link }
        let extraTap = hooks.transportTap
        if let traceSink {
            configuration.transportTap = { transport in traceSink.tap(extraTap?(transport) ?? transport) }
        } else if let extraTap {
            configuration.transportTap = extraTap
        }
        configuration.daemon = .never // decided below
        let created = AccessoryManager(configuration: configuration)
        manager = created
        commandSubscription = hooks.events.map { created.onEvent(queue: $0.queue, $0.handler) }
        let failures = self.failures
        subscription = manager.onEvent(queue: manager.queue) { event in
            if case let .failed(location, reason) = event { failures.entries.withLock { $0.append("\(location): \(reason)") } }
        }
        // Through iapd when its socket exists, unless told --direct or given a source of this
        // process's own (--serial, --simulate): the daemon owns the accessories then.
        let daemonPath = configuration.daemonSocketPath
        let bluetoothTargets = command.values("bluetooth-connect")
        let wantsBluetooth = command.flag("bluetooth") || !bluetoothTargets.isEmpty || command.flag("bluetooth-agent")
        awaitsBluetooth = wantsBluetooth && bluetoothTargets.isEmpty
        let ownSources = !command.values("serial").isEmpty || command.flag("simulate") || wantsBluetooth
        var throughDaemon = false
        if !command.flag("direct"), !hooks.direct, !ownSources, !command.flag("no-usb"), access(daemonPath, F_OK) == 0 {
            do {
                try manager.connectToDaemon(socketPath: daemonPath)
                throughDaemon = true
                logger.info("going through iapd at \(daemonPath) (--direct to open accessories here instead)")
            } catch where error.kind == .notRunning {
                logger.info("\(error); opening accessories directly")
            } catch {
                throw ToolError(description: "\(error)", exitCode: error.kind == .permission ? .noPermission : .unavailable)
            }
        } else {
            logger.info("opening accessories directly" + (command.flag("direct") ? " (--direct)" : hooks.direct ? " (this command never goes through iapd)" : ownSources ? " (--serial/--simulate/--bluetooth)" : " (no iapd at \(daemonPath))"))
        }
        if !command.flag("no-usb"), !throughDaemon {
            var options = USBOptions()
            options.hotplug = !command.flag("no-hotplug")
            options.detachKernelDriver = !command.flag("no-detach")
            do {
                try manager.startUSB(options: options)
            } catch where error.kind == .unavailable {
                logger.info("\(error)")
            } catch {
                logger.warning("\(error)")
            }
        }
        for text in command.values("serial") {
            let spec: SerialPortSpec
            do { spec = try SerialPortSpec(parsing: text) } catch {
                throw UsageError("\(error)", usage: "iapctl --serial DEVICE[:BAUD] …", commandPath: command.path)
            }
            do {
                attach(try SerialTransport(spec: spec))
                logger.info("opened \(spec)")
            } catch {
                throw ToolError(description: "\(error)", exitCode: error.errno == EACCES ? .noPermission : .unavailable)
            }
        }
        if wantsBluetooth {
            var addresses: [BluetoothAddress] = []
            for text in bluetoothTargets {
                guard let address = BluetoothAddress(text) else {
                    throw UsageError("'\(text)' is not a Bluetooth address (AA:BB:CC:DD:EE:FF; bluetoothctl devices lists them)",
                                     usage: "iapctl --bluetooth-connect ADDRESS …", commandPath: command.path)
                }
                addresses.append(address)
            }
            let manager = self.manager
            let targets = addresses
            let channel = UInt16(command.value("bluetooth-channel") ?? "0") ?? 0
            let options = BluetoothOptions(channel: channel, connectsOut: !targets.isEmpty, registersAgent: command.flag("bluetooth-agent"))
            do {
                try blockingAwait {
                    try await manager.startBluetooth(options: options)
                    for address in targets { try await manager.connectBluetooth(to: address) }
                }
            } catch let error as BluetoothError {
                throw ToolError(description: "\(error)", exitCode: error.kind == .permission ? .noPermission : .unavailable)
            }
            logger.info("Bluetooth: the iAP2 service is registered with BlueZ" + (addresses.isEmpty ? "" : "; connecting to \(addresses.map(\.description).joined(separator: ", "))"))
        }
        if command.flag("simulate") {
            let name = command.value("simulate") ?? "multi-sensor"
            let profile = try loadProfile(name)
            let runner: SimulatorRunner
            do {
                runner = try SimulatorRunner(profile: profile, attachment: .memory { [weak self] host in self?.attach(host) })
            } catch {
                throw ToolError(description: "profile '\(name)': \(error)", exitCode: .dataError)
            }
            simulators.withLock { $0.append(runner) }
            runner.start()
            runner.queue.sync {} // the runner has attached its transport to the manager…
            logger.info("started the simulated accessory '\(profile.identity().name)'")
        }
        manager.queue.sync {} // …and the manager has taken every transport in.
    }

    func attach(_ transport: any Transport) {
        manager.attach(transport) // the manager's transport tap adds the tracing
    }

    var hasSources: Bool { true }

    /// Prints the failures to standard error; true when there were any.
    func reportFailures() -> Bool {
        // A failure is recorded by a handler the manager's queue runs after publishing it: one
        // published before the wait ended may still be queued, so let the queue run it first.
        manager.queue.sync {}
        let all = failures.entries.withLock { $0 }
        for failure in all { StandardError.write("iapctl: \(failure.escapedForTerminal)\n") }
        return !all.isEmpty
    }

    func shutdown() {
        subscription.cancel()
        commandSubscription?.cancel()
        manager.stop()
        for runner in simulators.withLock({ $0 }) { runner.stop() }
        traceSink?.finish()
    }
}

/// What failed, shared with the event handler.
final class FailureLog: Sendable {
    let entries = Mutex<[String]>([])
}

/// Loads a simulator profile by built-in name or JSON path: 66 when there is no such profile
/// or file (or it cannot be read), 65 when the file is not a valid profile (sysexits' EX_DATAERR).
func loadProfile(_ name: String) throws -> SimulatorProfile {
    if let builtIn = SimulatorProfile.builtIn(named: name) { return builtIn }
    let names = SimulatorProfile.builtInNames
    var status = stat()
    guard stat(name, &status) == 0 else {
        let code = errno
        if code == ENOENT, !name.contains("/") {
            let guess = Suggestion.closest(to: name, among: names).map { "did you mean '\($0)'? " } ?? ""
            throw ToolError(description: "no simulator profile named '\(name)': \(guess)the built-in profiles are \(names.joined(separator: ", ")); "
                                + "a JSON profile is given by its path (tools/data/profiles/ has examples)", exitCode: .noInput)
        }
        throw ToolError(description: "cannot read the simulator profile '\(name)': \(SystemError(code).text); "
                            + "give a built-in name (\(names.joined(separator: ", "))) or the path of a JSON profile", exitCode: .noInput)
    }
    if status.st_mode & S_IFMT == S_IFDIR {
        throw ToolError(description: "'\(name)' is a directory, not a simulator profile; give a JSON file in it "
                            + "or a built-in name (\(names.joined(separator: ", ")))", exitCode: .noInput)
    }
    guard access(name, R_OK) == 0 else {
        throw ToolError(description: "cannot read the simulator profile '\(name)': \(SystemError.last.text)", exitCode: .noInput)
    }
    do {
        return try SimulatorProfile.load(path: name)
    } catch {
        throw ToolError(description: "\(error)", exitCode: .dataError)
    }
}

/// `--trace` and `--trace-file`: every frame in both directions, decoded and timestamped.
///
/// Each transport's bytes are scanned on their own (``TraceStream``): a frame split across reads
/// of one accessory is not mixed with another's bytes, and what is held for it (at most one
/// frame, `FrameScanner.maxFrameLength`, per direction) goes away with the transport.
final class TraceSink: Sendable {
    private let file: Mutex<UnsafeMutablePointer<FILE>?>
    private let start = ContinuousClock.now
    /// The pcapng trace instead of text, when asked for (PcapTrace.swift).
    private let pcap: PcapTraceFile?

    init?(_ command: ParsedCommand) throws {
        let path = command.value("trace-file")
        guard command.flag("trace") || path != nil || command.value("trace-format") != nil else { return nil }
        if try PcapTraceFile.wanted(command), let path {
            pcap = try PcapTraceFile(path: path)
            file = Mutex(nil)
            return
        }
        pcap = nil
        var opened: UnsafeMutablePointer<FILE>?
        if let path {
            guard let handle = fopen(path, "w") else {
                throw ToolError(description: "cannot create the trace file '\(path)': \(SystemError.last.text)", exitCode: .cannotCreate)
            }
            opened = handle
        }
        file = Mutex(opened)
    }

    /// `transport`, traced: its frames are decoded on a stream of their own.
    func tap(_ transport: any Transport) -> any Transport {
        if let pcap { return pcap.tap(transport) }
        let stream = TraceStream()
        return TracingTransport(transport) { [self] direction, bytes in
            write(stream.lines(direction, bytes, stamp: stamp(), arrow: direction == .out ? "host → acc" : "acc → host"))
        }
    }

    private func stamp() -> String {
        let (seconds, attoseconds) = (ContinuousClock.now - start).components
        return "\(seconds).\(String(Int(attoseconds / 1_000_000_000_000) + 1_000_000).dropFirst())"
    }

    private func write(_ lines: [String]) {
        guard !lines.isEmpty else { return }
        let text = lines.map { $0 + "\n" }.joined()
        file.withLock { file in
            if let file {
                fputs(text, file)
                fflush(file)
            } else {
                StandardError.write(text)
            }
        }
    }

    func finish() {
        pcap?.finish()
        file.withLock { file in
            if let file { fclose(file) }
            file = nil
        }
    }
}

/// One traced transport's scanners (one per direction) and inspector.
final class TraceStream: Sendable {
    private struct State {
        var scanners: [TracingTransport.Direction: FrameScanner] = [.in: FrameScanner(), .out: FrameScanner()]
        var inspector: FrameInspector = {
            var inspector = FrameInspector()
            inspector.certificateReader = readCertificate // certificates shown parsed
            return inspector
        }()
    }
    private let state = Mutex(State())

    /// The trace lines for `bytes` going `direction`: a frame completed by them, each drop.
    func lines(_ direction: TracingTransport.Direction, _ bytes: [UInt8], stamp: String, arrow: String) -> [String] {
        state.withLock { state in
            var lines: [String] = []
            var scanner = state.scanners[direction] ?? FrameScanner()
            var inspector = state.inspector
            scanner.scan(bytes.span.bytes, onFrame: { frame, span in
                lines.append("\(stamp) \(arrow) " + inspector.inspect(frame, in: span).text(indent: "        "))
            }, onDrop: { drop in
                lines.append("\(stamp) \(arrow) " + inspector.inspect(drop).summary)
            })
            state.scanners[direction] = scanner
            state.inspector = inspector
            return lines
        }
    }
}

/// The first of several waits to finish, for a thread that blocks until one does.
final class FirstOutcome: Sendable {
    let value = Mutex<Bool?>(nil)
    let done = DispatchSemaphore(value: 0)

    func report(_ outcome: Bool) {
        value.withLock { $0 = $0 ?? outcome }
        done.signal()
    }
}

/// The `--timeout` in seconds (checked by the parser: a number from 0 to 86400).
func timeoutSeconds(_ command: ParsedCommand) -> Double {
    Double(command.value("timeout") ?? "3") ?? 3
}

/// Waits until every source has settled (each transport has an identified accessory or has
/// failed), at most `--timeout`, and returns the accessories connected then.
func discover(_ session: HostContext, command: ParsedCommand) throws -> [Accessory] {
    let manager = session.manager
    let timeout = Duration.milliseconds(Int(timeoutSeconds(command) * 1_000))
    if session.awaitsBluetooth { _ = try blockingAwait { await manager.waitForAccessory(timeout: timeout) } }
    _ = try blockingAwait { await manager.waitUntilSettled(timeout: timeout) }
    return manager.connectedAccessories
}

/// The one accessory a command works on: the one `--accessory` names (connection id, serial
/// number or name) that speaks `protocolString` when one is given, or the only one there is.
///
/// The choice waits until the sources have settled (at most `--timeout`): choosing as soon as
/// any accessory is up picked the wrong one, or none, while another was still identifying. A
/// selector or a protocol that matches several accessories is an error listing them (64); none
/// is an error listing what is connected (69), with a "did you mean" for a near miss.
func chooseAccessory(_ session: HostContext, command: ParsedCommand, protocolString: String? = nil) throws -> Accessory {
    let manager = session.manager
    let seconds = timeoutSeconds(command)
    let selector = command.value("accessory")
    let requestedID = selector.flatMap { Int($0) }
    let byID: (@Sendable (Accessory) -> Bool)? = requestedID.map { id -> @Sendable (Accessory) -> Bool in
        { accessory in accessory.connectionID == id }
    }
    let timeout = Duration.milliseconds(Int(seconds * 1_000))
    // Over Bluetooth an accessory connects when it likes: wait for one that fits first.
    if session.awaitsBluetooth {
        let wanted = protocolString
        _ = try blockingAwait { await manager.waitForAccessory(timeout: timeout) { wanted.map($0.protocolStrings.contains) ?? true } }
    }
    // Whichever comes first: every source settled, or the accessory asked for by connection id.
    let first = FirstOutcome()
    Task { first.report(await manager.waitUntilSettled(timeout: timeout)) }
    if let byID {
        Task { if await manager.waitForAccessory(timeout: timeout, where: byID) != nil { first.report(true) } }
    }
    first.done.wait()
    let settled = first.value.withLock { $0 } ?? false
    let accessories = manager.connectedAccessories
    var candidates = accessories
    if let protocolString { candidates = candidates.filter { $0.protocolStrings.contains(protocolString) } }
    if let selector {
        if let byID, let exact = candidates.first(where: byID) {
            candidates = [exact]
        } else {
            candidates = candidates.filter { $0.serialNumber == selector || $0.name == selector }
        }
    }
    func describe(_ accessory: Accessory) -> String {
        "\(accessory.connectionID) \(accessory.name) (serial \(accessory.serialNumber), on \(accessory.location))"
    }
    if candidates.count > 1 {
        let what = selector.map { "'\($0)' matches" } ?? (protocolString.map { "several accessories speak '\($0)'" } ?? "several accessories are connected")
        throw ToolError(description: (selector == nil ? what : "\(what) several accessories") + "; pick one by its connection id "
                            + "(--accessory \(candidates[0].connectionID)): " + candidates.map(describe).joined(separator: "; "),
                        exitCode: .usage)
    }
    if let only = candidates.first { return only }

    var what: [String] = []
    if let selector { what.append("matching '\(selector)'") }
    if let protocolString { what.append("speaking '\(protocolString)'") }
    var message = "no accessory " + (what.isEmpty ? "found" : what.joined(separator: " "))
    if !settled { message += " within \(WaitCommand.format(seconds)) s (some were still being identified; a longer --timeout may help)" }
    if accessories.isEmpty {
        message += "; none is connected (connect one, or try --simulate)"
    } else {
        message += "; connected: " + accessories.map { "\($0.connectionID) \($0.name) [\($0.protocolStrings.joined(separator: ", "))]" }
            .joined(separator: "; ")
        let spoken = Set(accessories.flatMap(\.protocolStrings))
        // A protocol some accessory speaks is not a typo: then the selector is what missed.
        if let protocolString, !spoken.contains(protocolString),
           let guess = Suggestion.closest(to: protocolString, among: spoken.sorted()) {
            message += "; did you mean '\(guess)'?"
        } else if let selector, byID == nil,
                  let guess = Suggestion.closest(to: selector, among: accessories.flatMap { [$0.serialNumber, $0.name] }) {
            message += "; did you mean '\(guess)'?"
        }
    }
    throw ToolError(description: message, exitCode: .unavailable)
}

func json(_ accessory: Accessory) -> JSONValue {
    .object([
        ("connectionID", .int(accessory.connectionID)), ("name", .string(accessory.name)),
        ("manufacturer", .string(accessory.manufacturer)), ("modelNumber", .string(accessory.modelNumber)),
        ("serialNumber", .string(accessory.serialNumber)), ("firmwareRevision", .string(accessory.firmwareRevision)),
        ("hardwareRevision", .string(accessory.hardwareRevision)),
        ("protocolVersion", .string(accessory.protocolVersion.rawValue)),
        ("protocolStrings", .array(accessory.protocolStrings.map { .string($0) })),
        ("supportsConfiguredProtocols", .bool(accessory.supportsConfiguredProtocols)),
        ("transport", .string(accessory.transportKind.rawValue)), ("location", .string(accessory.location)),
        ("authentication", authenticationJSON(accessory.authentication)),
        ("bluetoothAddress", accessory.bluetoothAddress.map { .string($0.description) } ?? .null),
        ("usb", accessory.usbDevice.map { device in
            .object([("id", .string(device.usbID.description)), ("bus", .int(Int(device.bus))),
                     ("address", .int(Int(device.address))), ("port", .string(device.location)),
                     ("devicePath", .string(device.devicePath))])
        } ?? .null),
    ])
}
