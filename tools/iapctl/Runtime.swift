import AccessoryHost
import AccessoryLogging
import AccessorySimulator
import CLIKit
import Dispatch
import Glibc
import IAPInspect
import IAPTransport
import IAPWire
import Synchronization
import USBHost

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
    /// Transports that failed before an accessory was identified on them (a USB device that
    /// cannot be opened…), as "location: reason".
    let failures = FailureLog()
    private let subscription: EventSubscription

    init(_ command: ParsedCommand, supportedProtocols: [String] = []) throws {
        logger = Logger(label: "iapctl", logLevel: Logger.verbosity(command.count("verbose")))
        traceSink = try TraceSink(command)
        var configuration = AccessoryManager.Configuration(supportedProtocols: supportedProtocols, logger: logger)
        configuration.authentication = try AuthenticationOptions.policy(command)
        if let traceSink {
            configuration.transportTap = { transport in traceSink.tap(transport) }
        }
        configuration.daemon = .never // decided below
        manager = AccessoryManager(configuration: configuration)
        let failures = self.failures
        subscription = manager.onEvent(queue: manager.queue) { event in
            if case let .failed(location, reason) = event { failures.entries.withLock { $0.append("\(location): \(reason)") } }
        }
        // Through iapd when its socket exists, unless told --direct or given a source of this
        // process's own (--serial, --simulate): the daemon owns the accessories then.
        let daemonPath = configuration.daemonSocketPath
        let ownSources = !command.values("serial").isEmpty || command.flag("simulate")
        var throughDaemon = false
        if !command.flag("direct"), !ownSources, !command.flag("no-usb"), access(daemonPath, F_OK) == 0 {
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
            logger.info("opening accessories directly" + (command.flag("direct") ? " (--direct)" : ownSources ? " (--serial/--simulate)" : " (no iapd at \(daemonPath))"))
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
        let all = failures.entries.withLock { $0 }
        for failure in all { StandardError.write("iapctl: \(failure.escapedForTerminal)\n") }
        return !all.isEmpty
    }

    func shutdown() {
        subscription.cancel()
        manager.stop()
        for runner in simulators.withLock({ $0 }) { runner.stop() }
        traceSink?.finish()
    }
}

/// What failed, shared with the event handler.
final class FailureLog: Sendable {
    let entries = Mutex<[String]>([])
}

/// Loads a simulator profile by built-in name or JSON path.
func loadProfile(_ name: String) throws -> SimulatorProfile {
    if let builtIn = SimulatorProfile.builtIn(named: name) { return builtIn }
    do {
        return try SimulatorProfile.load(path: name)
    } catch {
        throw ToolError(description: "\(error) (built-in profiles: \(SimulatorProfile.builtInNames.joined(separator: ", ")))",
                        exitCode: .noInput)
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
                throw ToolError(description: "cannot write the trace file '\(path)': \(String(cString: strerror(errno)))", exitCode: .ioError)
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

/// Picks an accessory by connection id, serial number or name (or the only one there is).
func select(_ accessories: [Accessory], _ selector: String?, protocolString: String? = nil) throws -> Accessory {
    var candidates = accessories
    if let protocolString { candidates = candidates.filter { $0.protocolStrings.contains(protocolString) } }
    if let selector {
        candidates = candidates.filter {
            String($0.connectionID) == selector || $0.serialNumber == selector || $0.name == selector
        }
    }
    guard let first = candidates.first else {
        let what = [selector.map { "matching '\($0)'" }, protocolString.map { "speaking '\($0)'" }].compactMap { $0 }.joined(separator: " ")
        let seen = accessories.isEmpty ? "no accessories found (connect one, or try --simulate)" :
            "connected: " + accessories.map { "\($0.connectionID) \($0.name) [\($0.protocolStrings.joined(separator: ", "))]" }.joined(separator: "; ")
        throw ToolError(description: "no accessory \(what.isEmpty ? "" : what + " ")available; \(seen)", exitCode: .unavailable)
    }
    if candidates.count > 1, selector == nil {
        throw ToolError(description: "several accessories match; pick one with --accessory ID|SERIAL|NAME: "
            + candidates.map { "\($0.connectionID) \($0.name) (\($0.serialNumber))" }.joined(separator: "; "), exitCode: .usage)
    }
    return first
}

/// Waits up to the `--timeout` for accessories to identify, then returns those connected.
func discover(_ session: HostContext, command: ParsedCommand, until predicate: (@Sendable (Accessory) -> Bool)? = nil) throws -> [Accessory] {
    let seconds = Double(command.value("timeout") ?? "3") ?? 3
    let manager = session.manager
    let wanted = predicate
    let timeout = Duration.milliseconds(Int(seconds * 1_000))
    _ = try blockingAwait {
        if let wanted {
            _ = await manager.waitForAccessory(timeout: timeout, where: wanted)
        } else {
            _ = await manager.waitUntilSettled(timeout: timeout)
        }
    }
    return manager.connectedAccessories
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
        ("usb", accessory.usbDevice.map { device in
            .object([("id", .string(device.descriptor.usbID.description)), ("bus", .int(Int(device.bus))),
                     ("address", .int(Int(device.address))), ("port", .string(device.location)),
                     ("devicePath", .string(device.devicePath))])
        } ?? .null),
    ])
}
