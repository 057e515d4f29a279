import AccessoryGadget
import AccessorySimulator
import CLIKit
import Dispatch
import Foundation
import IAPTransport
import Synchronization
import SystemCalls

/// `iapbench usb`'s simulated accessory in a process of its own (`iapbench usb-gadget`), so that
/// the benchmark process's CPU time (`getrusage`) is the host's alone, and the accessory's is
/// measured apart, as a real accessory's controller would be.
///
/// The child makes the gadget, prints `ready` (or `unavailable: why` and exits 69), and then
/// answers each line it reads with one line of its figures: `cpu S acks N packets N` (its CPU
/// seconds so far, and its link's bare ACKs and data packets taken). End of input stops it:
/// the gadget is unbound and removed before it exits.
enum GadgetProcess {
    /// What the child runs behind the gadget.
    enum Mode: String, CaseIterable {
        /// FunctionFS gadget echoing raw bytes (the ceiling).
        case raw
        /// FunctionFS gadget running the simulated echo accessory (EA over iAP2).
        case simulator
        /// GadgetFS gadget echoing raw bytes on its iAP2 interface (the native figure's ceiling).
        case gadgetfsRaw = "gadgetfs-raw"
        /// GadgetFS gadget running the simulator, the native interface's bytes echoed raw.
        case gadgetfsNative = "gadgetfs-native"
    }

    /// The product IDs of the FunctionFS and GadgetFS gadgets.
    static let functionFSProductID: UInt16 = 0x00BE
    static let gadgetFSProductID: UInt16 = 0x00BF

    /// The child's side: runs until its input ends.
    static func serve(_ command: ParsedCommand) throws -> ExitCode {
        guard let mode = Mode(rawValue: command.value("mode") ?? "simulator") else { throw ExitCode.usage }
        let native = command.flag("native") || mode == .gadgetfsNative || mode == .gadgetfsRaw
        let profile = LoopbackBenchmarks.echoProfile(sessions: 3, maxPacketLength: 65_535, native: native)
        var runner: SimulatorRunner?
        var stop: () -> Void = {}
        let echoQueue = DispatchQueue(label: "iapbench.gadget-echo")
        switch mode {
        case .raw, .simulator:
            let udc = try command.value("udc") ?? USBGadget.defaultUDC()
            let gadget = try USBBenchmarks.makeGadget(profile, udc: udc, requests: command.value("requests").flatMap { Int($0) })
            // Removed whatever fails after this: a gadget left in configfs would make every
            // later run fail ("a gadget named iapbench exists already").
            stop = {
                try? gadget.unbind()
                try? gadget.remove()
            }
            do {
                if mode == .raw {
                    let device = gadget.transport
                    device.activate(queue: echoQueue) { event in
                        if case let .received(chunk) = event { device.send(chunk) }
                    }
                } else {
                    runner = try SimulatorRunner(profile: profile, attachment: .transport(gadget.transport))
                    runner?.start()
                }
                try gadget.bind(udc: udc)
            } catch {
                runner?.stop()
                stop()
                throw error
            }
        case .gadgetfsRaw, .gadgetfsNative:
            let device: GadgetFSDevice
            do {
                let layout = try GadgetFSLayout(vendorID: 0x1209, productID: gadgetFSProductID, manufacturer: "AccessoryHost Simulator",
                                                product: profile.accessory.name, serialNumber: profile.accessory.serialNumber,
                                                nativeProtocols: profile.nativeProtocolNames)
                device = try GadgetFSDevice(layout: layout)
            } catch {
                // The one reason a figure is "not measured": no GadgetFS here.
                StandardOutput.write("unavailable: cannot make a GadgetFS gadget: \(error)\n")
                return .unavailable
            }
            if mode == .gadgetfsRaw {
                let transport = device.transport
                transport.activate(queue: echoQueue) { event in
                    if case let .received(chunk) = event { transport.send(chunk) }
                }
            } else {
                // The simulator identifies the accessory on the iAP2 interface; the native
                // session's bytes are echoed raw, as the ceiling's are.
                device.onNativeOpen { _, channel in
                    echoQueue.async { USBBenchmarks.rawChannelEcho(channel, queue: echoQueue) }
                }
                runner = try SimulatorRunner(profile: profile, attachment: .transport(device.transport))
                runner?.start()
            }
            stop = { device.stop() }
        }
        StandardOutput.write("ready\n")
        while readLine() != nil {
            let links = runner?.linkStatistics
            StandardOutput.write("cpu \(ProcessFigures.now().cpuSeconds) acks \(links?.acksSent ?? 0) packets \(links?.dataPacketsDelivered ?? 0)\n")
        }
        runner?.stop()
        stop()
        return .success
    }

    /// What the child reports: its CPU seconds, and its link's bare ACKs and data packets taken.
    struct Figures {
        var cpuSeconds = 0.0
        var acks = 0
        var packets = 0

        static func - (after: Figures, before: Figures) -> Figures {
            Figures(cpuSeconds: after.cpuSeconds - before.cpuSeconds, acks: after.acks - before.acks, packets: after.packets - before.packets)
        }
    }
}

/// The parent's handle on the accessory's process (an `iapbench usb-gadget` or
/// `bluetooth-accessory` child): made when it is ready, asked for figures, stopped (and waited
/// for: the gadget is gone once ``stop()`` returns).
final class AccessoryChild {
    private let process = Process()
    private let toChild = Pipe()
    private let fromChild = Pipe()
    private var pending = ""
    private var stopped = false

    /// Starts an `iapbench usb-gadget` child and waits until its gadget is bound (or fails to be made).
    /// - Throws: `ChildFailure`; `unavailable` is set when the child said the gadget cannot exist here.
    convenience init(mode: GadgetProcess.Mode, udc: String?, native: Bool = false, requests: Int? = nil) throws(ChildFailure) {
        try self.init(arguments: ["usb-gadget", "--mode", mode.rawValue] + (udc.map { ["--udc", $0] } ?? []) + (native ? ["--native"] : [])
            + (requests.map { ["--requests", String($0)] } ?? []))
    }

    /// Starts this executable with `arguments` (a command that says `ready`, then answers each
    /// input line with its figures, as `usb-gadget` and `bluetooth-accessory` do) and waits
    /// until it is ready.
    init(arguments: [String]) throws(ChildFailure) {
        do {
            process.executableURL = URL(fileURLWithPath: try ScaleBenchmarks.executablePath())
        } catch {
            throw ChildFailure(reason: "cannot find this executable: \(error)", unavailable: false)
        }
        process.arguments = arguments
        process.standardInput = toChild
        process.standardOutput = fromChild
        // A child that died must make `figures()` fail, not kill this process with SIGPIPE.
        signal(SIGPIPE, SIG_IGN)
        do { try process.run() } catch { throw ChildFailure(reason: "cannot start the accessory's process: \(error)", unavailable: false) }
        guard let first = nextLine() else {
            stop()
            throw ChildFailure(reason: "the accessory's process (iapbench \(arguments.first ?? "")) ended before it was ready (exit \(process.terminationStatus))",
                               unavailable: false)
        }
        guard first == "ready" else {
            stop()
            let reason = first.hasPrefix("unavailable: ") ? String(first.dropFirst("unavailable: ".count)) : first
            throw ChildFailure(reason: reason, unavailable: first.hasPrefix("unavailable: "))
        }
    }

    /// The child's figures now.
    func figures() throws -> GadgetProcess.Figures {
        do { try toChild.fileHandleForWriting.write(contentsOf: Data("?\n".utf8)) } catch {
            throw ToolFailure("the accessory's process does not read its input any more: \(error)")
        }
        guard let line = nextLine() else { throw ToolFailure("the accessory's process ended") }
        let words = line.split(separator: " ")
        guard words.count == 6, let cpu = Double(words[1]), let acks = Int(words[3]), let packets = Int(words[5]) else {
            throw ToolFailure("the accessory's process answered: \(line)")
        }
        return GadgetProcess.Figures(cpuSeconds: cpu, acks: acks, packets: packets)
    }

    /// Ends the child's input and waits for it to remove its gadget and exit.
    func stop() {
        guard !stopped else { return }
        stopped = true
        try? toChild.fileHandleForWriting.close()
        process.waitUntilExit()
    }

    deinit { stop() }

    private func nextLine() -> String? {
        while true {
            if let end = pending.firstIndex(of: "\n") {
                let line = String(pending[..<end])
                pending = String(pending[pending.index(after: end)...])
                return line
            }
            let data = fromChild.fileHandleForReading.availableData
            guard !data.isEmpty else { return nil }
            pending += String(decoding: data, as: UTF8.self)
        }
    }
}

/// Why the accessory's process could not serve.
struct ChildFailure: Error, CustomStringConvertible {
    var reason: String
    /// The gadget cannot exist on this machine (no GadgetFS): a figure not measured, not an error.
    var unavailable: Bool
    var description: String { reason }
}

/// `iapbench usb --perf DIR` and `iapbench bluetooth --perf DIR`: a `perf record` of this process
/// alone (the host; the accessory runs in a process of its own) over each timed echo, into
/// `DIR/LABEL.data`, for `perf report -i`.
enum HostProfile {
    nonisolated(unsafe) static var directory: String?

    /// Runs `body` under `perf record -p` of this process when a directory was given. perf
    /// starts with its events off and is switched on through its control FIFO, whose
    /// acknowledgement says it is recording: the profile covers `body`, not perf's start.
    static func recording<Result>(_ label: String, _ body: () throws -> Result) throws -> Result {
        guard let directory else { return try body() }
        let base = "\(directory)/\(label)"
        let (control, acknowledgement) = (base + ".ctl", base + ".ack")
        for fifo in [control, acknowledgement] {
            unlink(fifo)
            guard mkfifo(fifo, 0o600) == 0 else { throw ToolFailure("cannot make the FIFO \(fifo) for perf: \(String(cString: strerror(errno)))") }
        }
        defer { for fifo in [control, acknowledgement] { unlink(fifo) } }
        // Both FIFOs are opened here first, read-write: on Linux such an open never waits for the
        // other end (perf opens them the same way, O_RDWR | O_NONBLOCK), and each FIFO lives while
        // a descriptor holds it. So "enable" waits in the control FIFO until perf reads it, nothing
        // here blocks in open(2) whether perf is there or not, and the wait for perf's answer is
        // one blocking read(2) on a thread of its own, raced against perf's end: whichever comes
        // first decides and signals `decided`. The reader is then woken with a byte written into
        // the acknowledgement FIFO through its own read-write descriptor (no wake pipe needed),
        // and waited for before the descriptors close. (Close-on-exec: perf inherits neither.)
        let writer = open(control, O_RDWR | O_NONBLOCK | O_CLOEXEC)
        guard writer >= 0 else { throw ToolFailure("cannot open the FIFO \(control) for perf: \(String(cString: strerror(errno)))") }
        defer { close(writer) }
        let reader = open(acknowledgement, O_RDWR | O_CLOEXEC)
        guard reader >= 0 else { throw ToolFailure("cannot open the FIFO \(acknowledgement) for perf: \(String(cString: strerror(errno)))") }
        defer { close(reader) }
        let outcome = Mutex<Start?>(nil)
        let decided = DispatchSemaphore(value: 0)
        @Sendable func decide(_ start: Start) {
            let first = outcome.withLock { outcome -> Bool in
                guard outcome == nil else { return false }
                outcome = start
                return true
            }
            if first { decided.signal() }
        }
        let perf = Process()
        perf.executableURL = URL(fileURLWithPath: "/usr/bin/perf")
        perf.arguments = ["record", "-F", "999", "-g", "-D", "-1", "--control", "fifo:\(control),\(acknowledgement)",
                          "-p", "\(getpid())", "-o", base + ".data"]
        perf.standardOutput = FileHandle.nullDevice
        // What perf says goes beside its data (DIR/LABEL.log).
        _ = FileManager.default.createFile(atPath: base + ".log", contents: nil)
        perf.standardError = FileHandle(forWritingAtPath: base + ".log") ?? FileHandle.nullDevice
        perf.terminationHandler = { _ in decide(.ended) }
        try perf.run()
        defer {
            perf.interrupt()
            perf.waitUntilExit()
        }
        let finished = DispatchSemaphore(value: 0)
        Thread {
            var answer = [UInt8](repeating: 0, count: 16)
            _ = answer.withUnsafeMutableBytes { SystemCall.read(reader, into: $0) }
            decide(.acknowledged)
            finished.signal()
        }.start()
        _ = "enable\n".utf8CString.withUnsafeBytes { write(writer, $0.baseAddress, $0.count - 1) }
        // No time limit, as before (the polling loop this replaces had none): perf's end bounds it.
        decided.wait()
        _ = [UInt8(ascii: "\n")].withUnsafeBytes { write(reader, $0.baseAddress, $0.count) }
        finished.wait()
        guard outcome.withLock({ $0 }) == .acknowledged else { throw ToolFailure("perf record ended before it recorded (see \(base).log)") }
        return try body()
    }

    /// What came first while perf started: its acknowledgement of "enable", or its end.
    private enum Start {
        case acknowledged
        case ended
    }
}
