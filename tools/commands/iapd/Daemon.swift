// iapd: the system service that owns accessories (USB by hotplug, the serial ports it is told
// of) and shares them with client processes over a Unix socket, one session per protocol per
// accessory system-wide. The client protocol is in docs/DAEMON.md.
//
// A library, so that one executable can be both tools: the package ships iapctl with iapd as a
// link to it (one copy of the Swift runtime), and iapctl runs `IAPDaemonCommand.main()` when it
// is started by that name. `tools/commands/iapd-main` is the `iapd` executable of the build.

import AccessoryHost
import AccessoryHostUSB
import AccessoryHostBluetooth
import AccessoryLogging
import AccessorySimulator
import BluetoothTransport
import CLIKit
import Dispatch
import Glibc
import IAPAuthentication
import IAPDaemon
import IAPDaemonProtocol
import IAPLink
import IAPTransport
import ProjectVersion
import SystemCalls
import USBHost

let iapd = CommandSpec(
    name: "iapd",
    abstract: "The accessory daemon: owns MFi accessories and shares them between processes over a Unix socket.",
    discussion: """
        Clients (the AccessoryHost library, iapctl) find it at the socket and go through it \
        unless told --direct. Options can also come from a configuration file: one \
        `name = value` (or bare `name` for a flag) per line, # for comments, the names of the \
        long options (serial may repeat); the command line wins. Under systemd the socket comes \
        from iapd.socket (socket activation). Logs go to standard error, in the journal's form \
        when that is not a terminal. SIGTERM or SIGINT stop it cleanly. With --metrics-dir it \
        exports its counters and gauges (accessories, sessions, bytes each way, retransmissions, \
        failures, clients) in Prometheus's text format for node_exporter's textfile collector; \
        `iapctl stats` prints the same figures.
        """,
    version: AccessoryHostVersion.string,
    options: [
        .value("socket", valueName: "path", help: "Where to listen (default: $IAPD_SOCKET, else /run/iapd/iapd.sock)."),
        .value("group", valueName: "name",
               help: "Only root and this group's members may connect; the socket gets the group and mode 0660 (default: iapd, when that group exists)."),
        .value("config", valueName: "file", help: "Read options from this file (default: /etc/iapd.conf when it exists)."),
        .value("serial", valueName: "device[:baud]", help: "Own an accessory on this serial port too (repeatable); a port that is missing or goes away is tried again every 2 s.", repeatable: true),
        .flag("no-usb", help: "Do not look for USB accessories."),
        .flag("bluetooth", help: "Also take accessories over Bluetooth: register the iAP2 service with BlueZ (tried again every 5 s until bluetoothd and a powered adapter are there)."),
        .value("bluetooth-connect", valueName: "address",
               help: "Keep connecting out to this paired Bluetooth accessory whenever it has no connection (repeatable; implies --bluetooth).", repeatable: true),
        .value("bluetooth-channel", valueName: "channel", help: "The RFCOMM channel of the iAP2 service (1-30; default 0: BlueZ picks a free one)."),
        .value("bluetooth-adapter", valueName: "name", help: "Only take Bluetooth connections through this adapter (e.g. hci0)."),
        .flag("bluetooth-agent", help: "Also be BlueZ's pairing agent, accepting Just Works pairing (for a machine without a desktop's agent)."),
        .optionalValue("simulate", valueName: "profile", help: "Serve a built-in simulated accessory too (for trying things out; default multi-sensor)."),
        .value("simulate-count", valueName: "n",
               help: "With --simulate: serve this many copies of the simulated accessory (1-256, default 1), e.g. to measure iapd with many accessories."),
        .value("metrics-dir", valueName: "dir",
               help: "Write metrics for Prometheus to dir/iapd.prom (node_exporter's textfile collector; Debian's prometheus-node-exporter reads /var/lib/prometheus/node-exporter), replaced atomically every --metrics-interval seconds."),
        .value("metrics-interval", valueName: "seconds", help: "How often --metrics-dir's file is replaced (0.1-3600, default 5)."),
        .value("auth", valueName: "policy", help: "Authentication: accept, record (the default) or require.",
               allowedValues: AuthenticationMode.allCases.map(\.rawValue)),
        .value("trust", valueName: "file|dir", help: "CA certificates accessories' certificates must chain to."),
        .flag("check-validity", help: "Count a certificate outside its validity period as a failure."),
        .value("max-clients", valueName: "n", help: "Clients served at once (default 1024)."),
        .flag("verbose", short: "v", help: "More detail (-v info, -vv debug).", repeatable: true),
    ]
)

/// A failure with the exit status scripts and systemd can act on.
struct DaemonError: Error, ExitCodeProviding, CustomStringConvertible {
    var description: String
    var exitCode: ExitCode
}

/// The options after the configuration file: the command line's, else the file's.
struct Settings {
    var values: [String: [String]] = [:]
    var flags: Set<String> = []

    init(_ command: ParsedCommand) throws {
        let explicit = command.value("config")
        let path = explicit ?? "/etc/iapd.conf"
        if explicit != nil || access(path, R_OK) == 0 { try read(path) }
        for name in ["socket", "group", "auth", "trust", "max-clients", "bluetooth-channel", "bluetooth-adapter", "simulate-count", "metrics-dir",
                     "metrics-interval"] {
            if let value = command.value(name) { values[name] = [value] }
        }
        for name in ["serial", "bluetooth-connect"] {
            let given = command.values(name)
            if !given.isEmpty { values[name] = given }
        }
        for flag in ["no-usb", "check-validity", "bluetooth", "bluetooth-agent"] where command.flag(flag) { flags.insert(flag) }
        if command.flag("simulate") { values["simulate"] = [command.value("simulate") ?? "multi-sensor"] }
    }

    private mutating func read(_ path: String) throws {
        guard case .success(let descriptor) = SystemCall.open(path, O_RDONLY | O_CLOEXEC) else {
            throw DaemonError(description: "cannot read the configuration \(path): \(SystemError.last)", exitCode: .noInput)
        }
        defer { _ = close(descriptor) }
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 4096)
        while bytes.count < 1 << 20 {
            let count = chunk.withUnsafeMutableBytes { (try? SystemCall.read(descriptor, into: $0).get()) ?? 0 }
            if count == 0 { break }
            bytes += chunk.prefix(count)
        }
        let known: Set<String> = ["socket", "group", "auth", "trust", "max-clients", "serial", "no-usb", "check-validity", "simulate",
                                  "simulate-count", "bluetooth", "bluetooth-connect", "bluetooth-channel", "bluetooth-adapter", "bluetooth-agent",
                                  "metrics-dir", "metrics-interval"]
        for (number, raw) in String(decoding: bytes, as: UTF8.self).split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
            let line = raw.split(separator: "#", maxSplits: 1, omittingEmptySubsequences: false).first.map(String.init)?.trimmed ?? ""
            if line.isEmpty { continue }
            let parts = line.split(separator: "=", maxSplits: 1).map { String($0).trimmed }
            let name = parts[0]
            guard known.contains(name) else {
                throw DaemonError(description: "\(path):\(number + 1): unknown setting '\(name)' (known: \(known.sorted().joined(separator: ", ")))",
                                  exitCode: ExitCode(78))
            }
            if parts.count == 1 { flags.insert(name) } else { values[name, default: []].append(parts[1]) }
        }
    }

    func value(_ name: String) -> String? { values[name]?.last }
}

extension String {
    var trimmed: String {
        var text = Substring(self)
        while let first = text.first, first.isWhitespace { text.removeFirst() }
        while let last = text.last, last.isWhitespace { text.removeLast() }
        return String(text)
    }
}

/// The listening socket: from systemd (socket activation) or made here, with its group and mode.
func listeningSocket(path: String, group: UInt32?, logger: Logger) throws -> (descriptor: Int32, made: Bool) {
    if let pid = getenv("LISTEN_PID").flatMap({ Int32(String(cString: $0)) }), pid == getpid(),
       let count = getenv("LISTEN_FDS").flatMap({ Int(String(cString: $0)) }), count >= 1 {
        logger.info("listening on the socket systemd passed (socket activation)")
        unsetenv("LISTEN_PID")
        unsetenv("LISTEN_FDS")
        return (3, false)
    }
    let directory = path.split(separator: "/").dropLast().joined(separator: "/")
    if !directory.isEmpty { _ = mkdir("/" + directory, 0o755) }
    switch UnixSocket.listen(path: path) {
    case .success(let descriptor):
        let mode: mode_t = group == nil ? 0o600 : 0o660
        if let group, chown(path, uid_t.max, group) != 0 {
            logger.warning("cannot give \(path) to group \(group): \(SystemError.last)")
        }
        if chmod(path, mode) != 0 { logger.warning("cannot set the mode of \(path): \(SystemError.last)") }
        return (descriptor, true)
    case .failure(let error) where error.code == EADDRINUSE:
        throw DaemonError(description: "another iapd answers on \(path): stop it first (`sudo systemctl stop iapd`), or give --socket another path",
                          exitCode: .unavailable)
    case .failure(let error) where error.kind == .permission:
        throw DaemonError(description: "cannot listen on \(path): \(error); run iapd as root (or give --socket a path you may write)",
                          exitCode: .noPermission)
    case .failure(let error):
        throw DaemonError(description: "cannot listen on \(path): \(error)", exitCode: .unavailable)
    }
}

/// The Bluetooth part of the settings as a keeper, or nil when Bluetooth is not asked for.
func bluetoothKeeper(settings: Settings, manager: AccessoryManager, logger: Logger) throws -> BluetoothKeeper? {
    var targets: [BluetoothAddress] = []
    for text in settings.values["bluetooth-connect"] ?? [] {
        guard let address = BluetoothAddress(text) else {
            throw DaemonError(description: "bluetooth-connect: '\(text)' is not a Bluetooth address (AA:BB:CC:DD:EE:FF; bluetoothctl devices lists them)",
                              exitCode: .usage)
        }
        targets.append(address)
    }
    guard settings.flags.contains("bluetooth") || settings.flags.contains("bluetooth-agent") || !targets.isEmpty else { return nil }
    var channel: UInt16 = 0
    if let text = settings.value("bluetooth-channel") {
        guard let number = UInt16(text), number <= 30 else {
            throw DaemonError(description: "bluetooth-channel must be a number from 1 to 30 (or 0: BlueZ picks one)", exitCode: .usage)
        }
        channel = number
    }
    let options = BluetoothOptions(channel: channel, connectsOut: !targets.isEmpty, adapter: settings.value("bluetooth-adapter"),
                                   registersAgent: settings.flags.contains("bluetooth-agent"))
    return BluetoothKeeper(manager: manager, options: options, targets: targets, logger: logger)
}

/// iapd's command line: what the `iapd` executable runs, and iapctl when started as `iapd`.
package enum IAPDaemonCommand {
    /// Parses the process's arguments, runs the daemon until SIGTERM or SIGINT (or prints help,
    /// the version, a man page) and exits with its status.
    package static func main() -> Never {
        CommandLineTool.run(iapd, manPageDate: AccessoryHostVersion.releaseDate) { command in
            let settings = try Settings(command)
            let level = Logger.verbosity(command.count("verbose"))
            let handler: any LogHandler = isatty(2) == 1 ? StderrLogHandler() : JournalLogHandler()
            let logger = Logger(label: "iapd", logLevel: level, handler: handler)

            var groupID: UInt32?
            if let name = settings.value("group") {
                guard let id = UserDatabase.groupID(named: name) else {
                    throw DaemonError(description: "there is no group '\(name)': create it (`sudo groupadd --system \(name)`) or name another with --group",
                                      exitCode: ExitCode(78))
                }
                groupID = id
            } else {
                groupID = UserDatabase.groupID(named: "iapd")
            }
            let path = settings.value("socket") ?? AccessoryManager.defaultDaemonSocketPath
            let maxClients = Int(settings.value("max-clients") ?? "1024") ?? -1
            guard (1...65_536).contains(maxClients) else {
                throw DaemonError(description: "max-clients must be a number from 1 to 65536", exitCode: .usage)
            }
            let simulateCount = Int(settings.value("simulate-count") ?? "1") ?? -1
            guard (1...256).contains(simulateCount) else {
                throw DaemonError(description: "simulate-count must be a number from 1 to 256", exitCode: .usage)
            }
            guard simulateCount == 1 || settings.value("simulate") != nil else {
                throw DaemonError(description: "simulate-count copies the simulated accessory of --simulate: give --simulate too", exitCode: .usage)
            }
            let metricsInterval = Double(settings.value("metrics-interval") ?? "5") ?? -1
            guard (0.1...3_600).contains(metricsInterval) else {
                throw DaemonError(description: "metrics-interval must be a number of seconds from 0.1 to 3600", exitCode: .usage)
            }

            var configuration = AccessoryManager.Configuration(logger: logger)
            configuration.daemon = .never
            let mode = AuthenticationMode(rawValue: settings.value("auth") ?? "record") ?? .record
            var trust: TrustAnchors?
            if let trustPath = settings.value("trust") {
                do { trust = try TrustAnchors(path: trustPath) } catch {
                    throw DaemonError(description: "trust: \(error)", exitCode: .noInput)
                }
            }
            configuration.authentication = mode.policy(trust: trust, checkValidity: settings.flags.contains("check-validity"))
            let manager = AccessoryManager(configuration: configuration)

            // Checked before the socket is made, so a bad setting leaves nothing behind.
            let bluetoothKeeper = try bluetoothKeeper(settings: settings, manager: manager, logger: logger)
            let (descriptor, made) = try listeningSocket(path: path, group: groupID, logger: logger)
            var options = DaemonServer.Options(group: groupID)
            options.maximumClients = maxClients
            options.name = "iapd \(iapd.version ?? "")"
            let server = DaemonServer(manager: manager, options: options, logger: logger)
            server.listen(descriptor: descriptor)
            logger.notice("listening on \(path)" + (groupID.map { " for root and group \(UserDatabase.groupName(of: $0) ?? "\($0)")" } ?? " for root only"))

            if !settings.flags.contains("no-usb") {
                var usb = USBOptions()
                usb.hotplug = true
                do throws(USBError) { try manager.startUSB(options: usb) } catch where error.kind == .unavailable {
                    logger.notice("no USB on this machine: \(error)")
                } catch {
                    logger.error("USB: \(error)")
                }
            }
            // Configured serial ports are kept open: opened now, and again whenever they are not (an
            // adapter unplugged and back, a port that appears later, a link that ended).
            var specs: [SerialPortSpec] = []
            for text in settings.values["serial"] ?? [] {
                do { specs.append(try SerialPortSpec(parsing: text)) } catch {
                    logger.error("serial \(text): \(error)")
                }
            }
            let serialPorts = SerialPortKeeper(manager: manager, specs: specs, logger: logger)
            serialPorts.start()
            // Bluetooth: the iAP2 profile registered with BlueZ, and again whenever it is not (bluetoothd
            // not up yet or restarted, the adapter off), and the configured accessories connected out to.
            bluetoothKeeper?.start()
            var simulators: [SimulatorRunner] = []
            if let name = settings.value("simulate") {
                let profile: SimulatorProfile
                if let builtIn = SimulatorProfile.builtIn(named: name) { profile = builtIn } else {
                    do { profile = try SimulatorProfile.load(path: name) } catch {
                        throw DaemonError(description: "\(error) (built-in profiles: \(SimulatorProfile.builtInNames.joined(separator: ", ")))", exitCode: .noInput)
                    }
                }
                for _ in 0..<simulateCount {
                    let runner = try SimulatorRunner(profile: profile, attachment: .memory { host in manager.attach(host) })
                    runner.start()
                    simulators.append(runner)
                }
                logger.info("serving the simulated accessory '\(profile.identity().name)'" + (simulateCount > 1 ? " \(simulateCount) times" : ""))
            }
            // Metrics for Prometheus (node_exporter's textfile collector): written off the manager's
            // queue; a directory that is missing or not writable is said once and tried again.
            var metrics: MetricsExporter?
            if let directory = settings.value("metrics-dir") {
                let exporter = MetricsExporter(server: server, options: MetricsExporter.Options(directory: directory, interval: .seconds(metricsInterval)),
                                               logger: logger)
                exporter.start()
                metrics = exporter
                logger.info("writing metrics to \(exporter.path) every \(metricsInterval) s")
            }
            let exporter = metrics

            // Stop cleanly on SIGTERM and SIGINT: clients hear the accessories go, USB is released.
            // The handler runs on its own queue: @Sendable, so that it is not taken for main-actor
            // code (Swift 6 checks that at run time, and the check stops the program).
            let stopping = DispatchQueue(label: "iapd.signals")
            var sources: [any DispatchSourceSignal] = []
            let runners = simulators
            for number in [SIGTERM, SIGINT] {
                signal(number, SIG_IGN)
                let source = DispatchSource.makeSignalSource(signal: number, queue: stopping)
                source.setEventHandler { @Sendable in
                    logger.notice("stopping (signal \(number))")
                    serialPorts.stop()
                    bluetoothKeeper?.stop()
                    exporter?.stop()
                    server.stop()
                    manager.stop()
                    for runner in runners { runner.stop() }
                    if made { unlink(path) }
                    exit(0)
                }
                source.resume()
                sources.append(source)
            }
            withExtendedLifetime(sources) { dispatchMain() }
        }
    }
}
