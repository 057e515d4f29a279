import AccessoryHost
import AccessoryGadget
import AccessoryLogging
import AccessorySimulator
import BluetoothTransport
import CLIKit
import Dispatch
import Glibc
import IAPInspect
import IAPTransport
import Synchronization
import SystemCalls
import USBHost

enum SimulateCommand {
    static let gadgetUsage = "iapctl simulate --gadget [--udc NAME] [--usb-id VID:PID] [--usb-layout NAME] [--sticks-until-reset] [--profile NAME|PATH]"

    static func run(_ command: ParsedCommand) throws -> ExitCode {
        let profile = try loadProfile(command.value("profile") ?? "multi-sensor")
        if command.flag("gadget") {
            if command.value("port") != nil {
                throw UsageError("--gadget and --port exclude each other: the accessory is either a USB device or on a serial line",
                                 usage: gadgetUsage, commandPath: command.path)
            }
            return try runGadget(command, profile: profile)
        }
        for option in ["udc", "usb-id", "usb-layout", "sticks-until-reset"] where command.count(option) > 0 {
            throw UsageError("--\(option) needs --gadget", usage: gadgetUsage, commandPath: command.path)
        }
        if let channel = command.value("bluetooth-advertise") {
            for option in ["bluetooth", "bluetooth-from", "port"] where command.count(option) > 0 {
                throw UsageError("--bluetooth-advertise and --\(option) exclude each other: the accessory waits for the host to connect",
                                 usage: advertiseUsage, commandPath: command.path)
            }
            return try runBluetoothAdvertising(command, channel: channel, profile: profile)
        }
        if let target = command.value("bluetooth") {
            return try runBluetooth(command, target: target, profile: profile)
        }
        if command.value("bluetooth-from") != nil {
            throw UsageError("--bluetooth-from needs --bluetooth", usage: bluetoothUsage, commandPath: command.path)
        }
        let transport: any Transport
        var pty: PseudoTerminal?
        if let port = command.value("port") {
            do { transport = try SerialTransport(spec: try SerialPortSpec(parsing: port)) } catch {
                throw ToolError(description: "\(error)", exitCode: .unavailable)
            }
        } else {
            do {
                let terminal = try PseudoTerminal()
                transport = try terminal.makeMasterTransport()
                pty = terminal
            } catch {
                throw ToolError(description: "cannot create a pseudo-terminal: \(error)", exitCode: .osError)
            }
        }
        let runner: SimulatorRunner
        do { runner = try SimulatorRunner(profile: profile, attachment: .transport(transport)) } catch {
            throw ToolError(description: "\(error)", exitCode: .dataError)
        }
        runner.start(events: eventPrinter(command))
        if let pty {
            StandardOutput.write(pty.slavePath + "\n")
            StandardError.write("simulating '\(profile.identity().name.escapedForTerminal)' on \(pty.slavePath); connect with: iapctl --serial \(pty.slavePath) list\n"
                + "press Ctrl-C to stop\n")
        }
        let interrupt = Interrupt()
        interrupt.wait()
        runner.stop()
        withExtendedLifetime(pty) {}
        return .success
    }

    /// `--gadget`: the simulator as a USB device through configfs and FunctionFS, bound to a UDC,
    /// until SIGINT or SIGTERM; the gadget is removed again on the way out.
    static func runGadget(_ command: ParsedCommand, profile: SimulatorProfile) throws -> ExitCode {
        // Signals first: an interrupt while the gadget is being built must still remove it.
        let interrupt = Interrupt()
        var configuration = USBGadgetConfiguration(profile: profile)
        if let text = command.value("usb-id") {
            guard let id = USBID(parsing: text) else {
                throw UsageError("invalid value '\(text)' for --usb-id: expected VID:PID in hex, e.g. 1209:0001",
                                 usage: gadgetUsage, commandPath: command.path)
            }
            configuration.vendorID = id.vendorID
            configuration.productID = id.productID
        }
        if let name = command.value("usb-layout") {
            guard let layout = USBDescriptorLayout(named: name) else {
                throw UsageError("invalid value '\(name)' for --usb-layout: use one of \(USBDescriptorLayout.names.joined(separator: ", "))",
                                 usage: gadgetUsage, commandPath: command.path)
            }
            if let ids = layout.usbID, command.count("usb-id") > 0, let text = command.value("usb-id"),
               USBID(parsing: text) != USBID(vendorID: ids.vendorID, productID: ids.productID) {
                throw UsageError("--usb-layout \(name) presents the ids \(USBID(vendorID: ids.vendorID, productID: ids.productID)) of its own; "
                                 + "drop --usb-id \(text) or choose another layout", usage: gadgetUsage, commandPath: command.path)
            }
            configuration.layout = layout
        }
        let udc: String
        if let name = command.value("udc") {
            let known = USBGadget.availableUDCs()
            guard known.contains(name) else {
                throw ToolError(description: "no USB device controller named '\(name)'; "
                                    + (known.isEmpty ? "there is none: modprobe dummy_hcd for a virtual one"
                                                     : "available: \(known.joined(separator: ", "))"),
                                exitCode: .unavailable)
            }
            udc = name
            // One gadget per controller: several simulators at once (a fleet on dummy_hcd num=8)
            // each get a configfs directory and a FunctionFS instance of their own (instance
            // names are global to the kernel): iapsim-UDC and iap2-UDC.
            configuration.name = "iapsim-\(name)"
            configuration.functionInstance = "iap2-\(name)"
        } else {
            do { udc = try USBGadget.defaultUDC() } catch { throw gadgetFailure(error) }
        }
        let gadget: USBGadget
        do { gadget = try USBGadget(configuration: configuration) } catch { throw gadgetFailure(error) }
        let runner: SimulatorRunner
        let wire: any Transport = command.flag("sticks-until-reset") ? StickingWire(gadget.transport) : gadget.transport
        do { runner = try SimulatorRunner(profile: profile, attachment: .transport(wire)) } catch {
            try? gadget.remove()
            throw ToolError(description: "\(error)", exitCode: .dataError)
        }
        if command.count("verbose") > 0 {
            gadget.transport.onConnectionChange { StandardError.write("gadget: \($0.rawValue)\n") }
        }
        // The transport wrote the descriptors when the gadget was built, so the UDC can bind now.
        runner.start(events: eventPrinter(command))
        do {
            try gadget.bind(udc: udc)
        } catch {
            runner.stop()
            try? gadget.remove()
            throw gadgetFailure(error)
        }
        StandardOutput.write("usb gadget \(configuration.usbID) on \(udc)\n")
        StandardError.write("simulating '\(profile.identity().name.escapedForTerminal)' as USB device \(configuration.usbID) on \(udc); "
            + "connect with: iapctl list\npress Ctrl-C to stop\n")
        interrupt.wait()
        try? gadget.unbind()
        runner.stop()
        do { try gadget.remove() } catch {
            throw ToolError(description: "the gadget was not removed completely: \(error)", exitCode: gadgetFailure(error).exitCode)
        }
        return .success
    }

    /// A gadget error as the tool reports it: 77 permission, 69 missing support or in use, 71
    /// anything else.
    static func gadgetFailure(_ error: USBGadgetError) -> ToolError {
        let exitCode: ExitCode
        switch error.category {
        case .permission: exitCode = .noPermission
        case .missingSupport, .busy: exitCode = .unavailable
        case .failed: exitCode = .osError
        }
        return ToolError(description: "\(error)", exitCode: exitCode)
    }

    /// Prints the simulator's events with -v (all but the endpoint's own chatter).
    static func eventPrinter(_ command: ParsedCommand) -> @Sendable (SimulatorEvent) -> Void {
        let verbose = command.count("verbose") > 0
        return { event in
            guard verbose else { return }
            if let line = describe(event) { StandardError.write("simulator: \(line.escapedForTerminal)\n") }
        }
    }

    /// A simulator event in words (nil for the endpoint's own chatter).
    static func describe(_ event: SimulatorEvent) -> String? {
        func counts(_ statistics: SessionStatistics) -> String {
            "\(statistics.bytesIn) bytes in, \(statistics.bytesOut) out"
        }
        switch event {
        case let .identified(identity):
            return "identified as '\(identity.name)' (serial \(identity.serialNumber), firmware \(identity.firmwareVersion))"
        case let .sessionOpened(id, name): return "session \(id) opened: \(name)"
        case let .sessionClosed(id, name, reason, statistics):
            return "session \(id) closed: \(name), \(counts(statistics))" + (reason.map { " (\($0))" } ?? "")
        case let .nativeSessionOpened(id, name): return "native session \(id) opened: \(name)"
        case let .nativeSessionClosed(id, name, statistics): return "native session \(id) closed: \(name), \(counts(statistics))"
        case let .sourceFinished(id, bytes): return "session \(id) sent its last byte (\(bytes) bytes)"
        case let .firmwareUpdateBegan(id, version, size): return "session \(id): firmware update to \(version) began (\(size) bytes)"
        case let .firmwareUpdateFinished(id, status, crc):
            return "session \(id): firmware update finished: \(status) (CRC-32 0x\(String(crc, radix: 16)))"
        case let .firmwareUpdateError(id, code, message): return "session \(id): firmware update error \(code): \(message)"
        case let .readingStopped(bytes): return "stopped reading after \(bytes) bytes (fault)"
        case let .reboot(version): return "rebooting with firmware \(version)"
        case .vanish: return "vanished (fault)"
        case .endpoint: return nil
        }
    }

    /// SIGINT and SIGTERM, caught from creation on (they no longer end the process).
    final class Interrupt {
        private let stop = DispatchSemaphore(value: 0)
        private var sources: [any DispatchSourceSignal] = []

        init() {
            Glibc.signal(SIGINT, SIG_IGN)
            Glibc.signal(SIGTERM, SIG_IGN)
            let stop = self.stop
            sources = [SIGINT, SIGTERM].map { number -> any DispatchSourceSignal in
                let source = DispatchSource.makeSignalSource(signal: number, queue: .global())
                source.setEventHandler { stop.signal() }
                source.resume()
                return source
            }
        }

        /// Waits for the first signal.
        func wait() {
            stop.wait()
            for source in sources { source.cancel() }
        }
    }
}
