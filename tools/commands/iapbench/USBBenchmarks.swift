import AccessoryHost
import AccessoryHostUSB
import AccessoryGadget
import AccessorySimulator
import CLIKit
import Dispatch
import Glibc
import IAPInspect
import IAPLink
import IAPTransport
import Synchronization
import USBHost
import USBTransport

/// `iapbench usb`: EA sessions through the whole stack over a real USB device (the simulator as
/// a FunctionFS gadget on a device controller of this machine, e.g. dummy_hcd in the rig),
/// beside the ceiling measured in the same run: a raw bulk echo through the same gadget and the
/// same USB pipes, without iAP2.
enum USBBenchmarks {
    static let gadgetName = "iapbench"

    nonisolated(unsafe) static var verbose = false
    /// Whether the FunctionFS gadget offers the native interface too (`--native`).
    nonisolated(unsafe) static var offersNative = false
    /// Transfers the FunctionFS gadget keeps queued per endpoint (`--gadget-requests`; nil: the
    /// gadget's default).
    nonisolated(unsafe) static var gadgetRequests: Int?
    nonisolated(unsafe) static var options = USBOptions()
    /// Each session's write buffer on the host (`--session-buffer`; the library's default).
    nonisolated(unsafe) static var sessionBufferLimit = AccessoryManager.Configuration().sessionBufferLimit

    static func run(_ command: ParsedCommand) throws -> ExitCode {
        verbose = command.flag("verbose")
        options.useDeviceMemory = !command.flag("heap")
        if let kibibytes = try command.integer("session-buffer", in: 64...65_536) { sessionBufferLimit = kibibytes << 10 }
        if let count = try command.integer("transmit-buffers", in: 0...1_024) { options.transmitBuffers = count }
        HostProfile.directory = command.value("perf")
        let megabytes = try command.integer("mib", in: 1...4_096) ?? 64
        let json = command.flag("json")
        if command.flag("daemon"), command.flag("native") {
            throw UsageError("--daemon and --native are measured in separate runs: give one of them",
                             usage: "iapbench usb --daemon [--mib N] [--rounds N]", commandPath: command.path)
        }
        #if DEBUG
        StandardError.write("warning: this is a debug build; its numbers mean nothing. Use: swift build -c release\n")
        #endif
        let udc: String
        do { udc = try command.value("udc") ?? USBGadget.defaultUDC() } catch {
            StandardError.write("iapbench usb: \(error)\n")
            return .unavailable
        }
        let rounds = try command.integer("rounds", in: 1...100) ?? 3
        /// One figure over the rounds: its rates, its ratios to the ceiling (each round's own),
        /// and the host's and the gadget's CPU per MiB, with the host's ratio to the ceiling's.
        func emit(_ name: String, _ figures: [EchoFigures], ceilings: [EchoFigures]?, extra: String = "", acks: Bool = false) {
            let rates = figures.map(\.rate)
            let rate = median(rates)
            let ratios = ceilings.map { zip(figures, $0).map { $1.rate > 0 ? $0.rate / $1.rate : 0 } }
            let cpuRatios = ceilings.map { zip(figures, $0).map { $1.hostCPUPerMiB > 0 ? $0.hostCPUPerMiB / $1.hostCPUPerMiB : 0 } }
            let hostCPU = median(figures.map(\.hostCPUPerMiB)), gadgetCPU = median(figures.map(\.gadgetCPUPerMiB))
            let systemShare = median(figures.map { $0.hostCPU > 0 ? $0.hostSystemCPU / $0.hostCPU : 0 })
            let hostAcks = figures.last?.hostAcks, gadgetAcks = figures.last?.gadgetAcks
            if json {
                var fields: [(String, JSONValue)] = [("name", .string(name)), ("bytesPerSecond", .int(Int(rate))),
                                                     ("rounds", .array(rates.map { .int(Int($0)) })),
                                                     ("hostCPUMicrosecondsPerMiB", .int(Int(hostCPU * 1e6))),
                                                     ("gadgetCPUMicrosecondsPerMiB", .int(Int(gadgetCPU * 1e6))),
                                                     ("hostSystemShare", .string(Report.format(systemShare, digits: 3)))]
                if let ratios {
                    fields.append(("ratioToCeiling", .string(Report.format(median(ratios), digits: 3))))
                    fields.append(("ratioRange", .array([.string(Report.format(ratios.min() ?? 0, digits: 3)),
                                                         .string(Report.format(ratios.max() ?? 0, digits: 3))])))
                }
                if let cpuRatios { fields.append(("hostCPURatioToCeiling", .string(Report.format(median(cpuRatios), digits: 3)))) }
                if acks, let hostAcks, let gadgetAcks {
                    fields.append(("bareAcksPerDataPacket", .object([("host", hostAcks.json), ("accessory", gadgetAcks.json)])))
                }
                StandardOutput.write(JSONValue.object(fields).serialized() + "\n")
            } else {
                let share = ratios.map { ratios in
                    "  (\(Report.format(median(ratios) * 100, digits: 1)) % of the ceiling; rounds "
                        + "\(Report.format((ratios.min() ?? 0) * 100, digits: 1))–\(Report.format((ratios.max() ?? 0) * 100, digits: 1)) %)"
                } ?? ""
                StandardOutput.write("\(name): \(Report.format(rate / 1e6, digits: 1)) MB/s each way\(share)\(extra)\n")
                let cpuShare = cpuRatios.map { ", \(Report.format(median($0), digits: 2))× the ceiling's (median of the rounds' ratios)" } ?? ""
                StandardOutput.write("  CPU per MiB each way: host \(Report.format(hostCPU * 1e3, digits: 2)) ms "
                    + "(\(Report.format(systemShare * 100, digits: 0)) % in the kernel)\(cpuShare); "
                    + "the gadget, in a process of its own, \(Report.format(gadgetCPU * 1e3, digits: 2)) ms\n")
                if acks, let hostAcks, let gadgetAcks {
                    StandardOutput.write("  bare ACKs per data packet received (last round): host \(hostAcks.text), accessory \(gadgetAcks.text)\n")
                }
            }
        }
        let native = command.flag("native")
        offersNative = native
        if let text = command.value("gadget-requests") {
            guard let count = Int(text), count >= 1 else { throw ToolFailure("--gadget-requests takes a number of 1 or more, not '\(text)'") }
            gadgetRequests = count
        }
        if command.flag("daemon") {
            return try DaemonBenchmarks.runUSB(command, udc: udc, megabytes: megabytes, rounds: rounds)
        }
        var ceilings: [EchoFigures] = []
        var sessionFigures: [Int: [EchoFigures]] = [:]
        var nativeFigures: [EchoFigures] = []
        var gadgetFSCeilings: [EchoFigures] = []
        var nativeUnavailable: String?
        var lastCopies: USBCopies?
        var rawRoundTrips: [Double] = [], sessionRoundTrips: [Double] = [], managerRoundTrips: [Double] = []
        var applicationFigures: [Application: [EchoFigures]] = [:]
        let roundTripCount = 300
        for round in 1...rounds {
            step("round \(round) of \(rounds)")
            step("raw echo")
            ceilings.append(try rawEcho(udc: udc, bytes: megabytes << 20))
            step("raw echo done")
            for sessions in [1, 3] {
                step("EA echo, \(sessions) session(s)")
                let (figures, copies) = try sessionEcho(udc: udc, sessions: sessions, bytes: megabytes << 20)
                step("EA echo, \(sessions) session(s) done")
                sessionFigures[sessions, default: []].append(figures)
                if sessions == 1 { lastCopies = copies }
            }
            for application in [Application.tasksOnManagerExecutor, .events] {
                applicationFigures[application, default: []].append(try sessionEcho(udc: udc, sessions: 1, bytes: megabytes << 20,
                                                                                    application: application).figures)
            }
            rawRoundTrips.append(try rawRoundTrip(udc: udc, count: roundTripCount))
            let (global, onManager) = try sessionRoundTrip(udc: udc, count: roundTripCount)
            sessionRoundTrips.append(global)
            managerRoundTrips.append(onManager)
            if native, nativeUnavailable == nil {
                // The native interface needs a GadgetFS gadget; its own ceiling goes beside it.
                switch try rawEchoGadgetFS(bytes: megabytes << 20) {
                case let .success(figures): gadgetFSCeilings.append(figures)
                case let .failure(reason):
                    nativeUnavailable = reason.description
                    continue
                }
                switch try nativeEcho(bytes: megabytes << 20) {
                case let .success(figures): nativeFigures.append(figures)
                case let .failure(reason): nativeUnavailable = reason.description
                }
            }
        }
        emit("ceiling: raw bulk echo through the same gadget and pipes (baseline, median of \(rounds))", ceilings, ceilings: nil)
        for sessions in [1, 3] {
            let figures = sessionFigures[sessions] ?? []
            emit("EA echo over iAP2, \(sessions) session\(sessions == 1 ? "" : "s") (total)", figures, ceilings: ceilings,
                 extra: sessions > 1 ? ", \(Report.format(median(figures.map(\.rate)) / Double(sessions) / 1e6, digits: 1)) MB/s per session" : "",
                 acks: true)
        }
        // The same session driven otherwise by the application.
        for application in [Application.tasksOnManagerExecutor, .events] {
            emit("EA echo over iAP2, 1 session, the application's \(application.rawValue)", applicationFigures[application] ?? [],
                 ceilings: ceilings, acks: true)
        }
        // Each EA round trip beside the raw one of its own round.
        let ratios = zip(sessionRoundTrips, rawRoundTrips).map { $1 > 0 ? $0 / $1 : 0 }
        let managerRatios = zip(managerRoundTrips, rawRoundTrips).map { $1 > 0 ? $0 / $1 : 0 }
        if json {
            StandardOutput.write(JSONValue.object([
                ("name", .string("round trip, 64-byte messages, raw bulk echo and EA over iAP2")),
                ("rawP50Nanoseconds", .int(Int(median(rawRoundTrips)))), ("eaP50Nanoseconds", .int(Int(median(sessionRoundTrips)))),
                ("eaOnManagerExecutorP50Nanoseconds", .int(Int(median(managerRoundTrips)))),
                ("ratio", .string(Report.format(median(ratios), digits: 3))), ("ratioOnManagerExecutor", .string(Report.format(median(managerRatios), digits: 3))),
            ]).serialized() + "\n")
        } else {
            StandardOutput.write("round trip of 64-byte messages (p50, median of \(rounds) rounds of \(roundTripCount)): raw bulk echo "
                + "\(Report.duration(nanoseconds: median(rawRoundTrips))) (baseline); EA over iAP2 \(Report.duration(nanoseconds: median(sessionRoundTrips))), "
                + "\(Report.format(median(ratios), digits: 2))× raw; on the manager's task executor \(Report.duration(nanoseconds: median(managerRoundTrips))), "
                + "\(Report.format(median(managerRatios), digits: 2))× raw\n")
        }
        if let copies = lastCopies {
            let (out, into) = (copies.outPerByte, copies.inPerByte)
            if json {
                StandardOutput.write(JSONValue.object([("name", .string("host copies per payload byte, EA over iAP2, 1 session")),
                                                       ("out", .string(Report.format(out, digits: 2))),
                                                       ("in", .string(Report.format(into, digits: 2)))]).serialized() + "\n")
            } else {
                StandardOutput.write("  host copies per payload byte (last round, 1 session): out \(Report.format(out, digits: 2)) "
                    + "(\(Report.format(copies.endpoint.copiesPerByteOut, digits: 2)) into link packets by the endpoint, "
                    + "\(Report.format(out - copies.endpoint.copiesPerByteOut, digits: 2)) of frame bytes into OUT slots; "
                    + "\(Report.format(copies.inPlacePerByte, digits: 2)) of frame bytes sent from transmit buffers in device memory "
                    + "as they were laid out), "
                    + "in \(Report.format(into, digits: 2)) (read()'s copy out of the lent IN slot, reassembly of frames split across "
                    + "transfers, and slots moved out for a lagging reader: \(Report.format(copies.evacuatedPerByte, digits: 2)); counted by the layers)\n")
            }
        }
        if native {
            let name = "EA echo on a native transport, 1 session"
            if let nativeUnavailable {
                // Said, not hidden: the figure is missing and why (and the run's exit code says it).
                if json {
                    StandardOutput.write(JSONValue.object([("name", .string(name)), ("measured", .bool(false)),
                                                           ("reason", .string(nativeUnavailable))]).serialized() + "\n")
                } else {
                    StandardOutput.write("\(name): not measured: \(nativeUnavailable)\n")
                }
                return .unavailable
            }
            emit("ceiling on GadgetFS: raw bulk echo through the GadgetFS gadget's iAP2 pipes (median of \(rounds))",
                 gadgetFSCeilings, ceilings: nil)
            emit(name + ", on GadgetFS", nativeFigures, ceilings: gadgetFSCeilings)
        }
        return .success
    }

    /// A native-transport echo session (`bench.native`) through AccessoryManager over a GadgetFS
    /// gadget (FunctionFS on kernels before 6.8 cannot accept alternate setting 1, and never says
    /// which setting the host chose; GadgetFS hands SET_INTERFACE to the simulator). A failure says
    /// why it could not be measured.
    static func nativeEcho(bytes: Int) throws -> Result<EchoFigures, ToolFailure> {
        let child: AccessoryChild
        do { child = try AccessoryChild(mode: .gadgetfsNative, udc: nil) } catch {
            // The one reason the figure is "not measured" (exit 69): no GadgetFS here. Anything
            // that fails once it exists is an error of the run.
            if error.unavailable { return .failure(ToolFailure(error.reason)) }
            throw ToolFailure(error.reason)
        }
        defer {
            step("stopping the GadgetFS gadget")
            child.stop()
        }
        let manager = AccessoryManager(configuration: .init(sessionBufferLimit: sessionBufferLimit))
        defer { manager.stop() }
        try manager.startUSB(options: options)
        let found = try blockingAwait {
            await manager.waitForAccessory(timeout: .seconds(30)) { $0.usbDevice?.productID == GadgetProcess.gadgetFSProductID }
        }
        guard let accessory = found else { throw ToolFailure("the simulated accessory on GadgetFS was not identified within 30 s") }
        do {
            return .success(try measured(child, bytes: bytes, label: "native") { try eventDrivenEcho(accessory, protocolName: "bench.native", bytes: bytes) })
        } catch {
            throw ToolFailure("the native echo failed: \(error)")
        }
    }

    /// One echo's figures: bytes per second each way, and the CPU time each process spent on it.
    struct EchoFigures {
        var rate: Double
        /// Bytes echoed (each way).
        var bytes: Int
        /// This process's CPU seconds (user and system) over the echo: the host's alone.
        var hostCPU: Double
        /// The system (kernel) part of ``hostCPU``.
        var hostSystemCPU = 0.0
        /// The gadget's process over the same time.
        var gadget = GadgetProcess.Figures()
        var hostAcks = BareAcks(acks: 0, dataPackets: 0)
        /// Round trips of one message at a time, in nanoseconds (a ping-pong run only).
        var roundTrips: [Double] = []
        var hostCPUPerMiB: Double { bytes == 0 ? 0 : hostCPU / (Double(bytes) / 1_048_576) }
        var gadgetCPUPerMiB: Double { bytes == 0 ? 0 : gadget.cpuSeconds / (Double(bytes) / 1_048_576) }
        var gadgetAcks: BareAcks { BareAcks(acks: gadget.acks, dataPackets: gadget.packets) }
    }

    /// Runs `body` (which returns the rate), measuring this process's CPU time and the gadget
    /// process's over it.
    static func measured(_ child: AccessoryChild, bytes: Int, label: String, _ body: () throws -> Double) throws -> EchoFigures {
        let gadgetBefore = try child.figures()
        let cpuBefore = ProcessFigures.now()
        let rate = try HostProfile.recording(label, body)
        let cpuAfter = ProcessFigures.now()
        let gadget = try child.figures() - gadgetBefore
        return EchoFigures(rate: rate, bytes: bytes, hostCPU: cpuAfter.cpuSeconds - cpuBefore.cpuSeconds,
                           hostSystemCPU: cpuAfter.systemSeconds - cpuBefore.systemSeconds, gadget: gadget)
    }

    /// The gadget's process in `mode`, ready.
    static func gadgetChild(_ mode: GadgetProcess.Mode, udc: String?) throws -> AccessoryChild {
        do { return try AccessoryChild(mode: mode, udc: udc, native: offersNative, requests: gadgetRequests) } catch { throw ToolFailure(error.reason) }
    }

    /// An echo through one session the way a throughput-minded application drives it: stream
    /// events on a queue, non-blocking writes of 65000-byte pieces, zero-copy reads that only count
    /// (as the ceiling's host side only counts). Returns bytes per second each way.
    static func eventDrivenEcho(_ accessory: Accessory, protocolName: String, bytes: Int) throws -> Double {
        let session = try blockingAwait { try await accessory.openSession(for: protocolName) }
        defer { session.close() }
        // 65000-byte pieces, as the ceiling's frames: not a multiple of the packet size.
        let piece = CodecBenchmarks.pattern(65_000)
        let queue = DispatchQueue(label: "iapbench.session-events")
        let done = DispatchSemaphore(value: 0)
        let state = Mutex((sent: 0, received: 0, failed: nil as String?, finished: false))
        let start = Mutex(ContinuousClock.now)
        @Sendable func finish(_ failure: String? = nil) {
            let first = state.withLock { state -> Bool in
                guard !state.finished else { return false }
                state.finished = true
                state.failed = failure
                return true
            }
            if first { done.signal() }
        }
        session.setEventHandler(queue: queue) { event in
            switch event {
            case .openCompleted, .hasSpaceAvailable:
                while true {
                    let sent = state.withLock { $0.sent }
                    guard sent < bytes else { break }
                    let taken = (try? session.writeAvailable(piece[..<min(piece.count, bytes - sent)])) ?? 0
                    guard taken > 0 else { break }
                    state.withLock { $0.sent += taken }
                }
            case .hasBytesAvailable:
                var got = 0
                while let count = session.withNextChunk({ span in (span.byteCount, span.byteCount) }), count > 0 { got += count }
                let received = state.withLock { state -> Int in
                    state.received += got
                    return state.received
                }
                if received >= bytes { finish() }
            case let .errorOccurred(error):
                finish("\(error)")
            case .endEncountered:
                finish("the session ended")
            }
        }
        guard done.wait(timeout: .now() + 300) == .success else { throw ToolFailure("the echo stalled: \(state.withLock { $0 })") }
        let elapsed = ContinuousClock.now - start.withLock { $0 }
        if let failure = state.withLock({ $0.failed }) { throw ToolFailure(failure) }
        return Double(bytes) / seconds(elapsed)
    }

    /// Echoes everything `channel` reads back into it, as far as it takes (on `queue`).
    static func rawChannelEcho(_ channel: any ByteChannel, queue: DispatchQueue) {
        let pending = Mutex<[UInt8]>([])
        @Sendable func pump() {
            while true {
                var backlog = pending.withLock { $0 }
                if !backlog.isEmpty {
                    let taken = channel.write(backlog[...])
                    backlog.removeFirst(taken)
                    pending.withLock { $0 = backlog }
                    if !backlog.isEmpty { return } // held off: .writable comes
                }
                // Read only what can go straight back (the channel holds the rest: back-pressure).
                guard channel.isWritable, let chunk = channel.withReadableBytes({ span in
                    (span.byteCount, span.withUnsafeBytes { Array($0) })
                }) else { return }
                pending.withLock { $0 = chunk }
            }
        }
        channel.activate(queue: queue) { event in
            if case .closed = event { return }
            pump()
        }
    }

    /// Says what the run does, on standard error with `--verbose`, stamped with the monotonic
    /// clock's seconds (what `perf record -k CLOCK_MONOTONIC` stamps its samples with, so that a
    /// profile can be cut to one phase with `perf report --time`).
    static func step(_ text: String) {
        guard verbose else { return }
        var time = timespec()
        clock_gettime(CLOCK_MONOTONIC, &time)
        let micro = String(time.tv_nsec / 1_000)
        StandardError.write("iapbench: [\(time.tv_sec).\(String(repeating: "0", count: 6 - micro.count) + micro)] \(text)\n")
    }

    static func makeGadget(_ profile: SimulatorProfile, udc: String, requests: Int? = nil) throws -> USBGadget {
        var configuration = USBGadgetConfiguration(profile: profile)
        if let requests { configuration.queuedRequests = requests }
        configuration.nativeTransportProtocols = profile.nativeProtocolNames // offered, to measure the host's half
        configuration.name = gadgetName
        configuration.functionInstance = gadgetName
        configuration.productID = 0x00BE
        return try USBGadget(configuration: configuration)
    }

    /// Round trips of 64-byte messages through one EA echo session (the gadget in its own
    /// process): the p50 in nanoseconds on the default executor and on the manager's.
    static func sessionRoundTrip(udc: String, count: Int) throws -> (global: Double, manager: Double) {
        try withAccessory(udc: udc) { rig, _ in
            (try LoopbackBenchmarks.roundTrips(rig, size: 64, count: count).p50,
             try LoopbackBenchmarks.roundTrips(rig, size: 64, count: count, onManagerExecutor: true).p50)
        }
    }

    static func median(_ values: [Double]) -> Double {
        let sorted = values.sorted()
        guard !sorted.isEmpty else { return 0 }
        return sorted.count % 2 == 1 ? sorted[sorted.count / 2] : (sorted[sorted.count / 2 - 1] + sorted[sorted.count / 2]) / 2
    }

    /// The raw echo through the iAP2 interface of a GadgetFS gadget: the ceiling of the pipes the
    /// native figure runs on.
    static func rawEchoGadgetFS(bytes: Int) throws -> Result<EchoFigures, ToolFailure> {
        let child: AccessoryChild
        do { child = try AccessoryChild(mode: .gadgetfsRaw, udc: nil) } catch {
            if error.unavailable { return .failure(ToolFailure(error.reason)) }
            throw ToolFailure(error.reason)
        }
        defer { child.stop() }
        return .success(try hostRawEcho(productID: GadgetProcess.gadgetFSProductID, bytes: bytes, child: child, label: "raw-gadgetfs"))
    }

    /// Runs `body` with the simulated accessory behind a gadget in a process of its own,
    /// identified by an AccessoryManager over USB; everything is taken down afterwards.
    static func withAccessory<Result>(udc: String, _ body: (LoopbackBenchmarks.Rig, AccessoryChild) throws -> Result) throws -> Result {
        let child = try gadgetChild(.simulator, udc: udc)
        defer { child.stop() }
        let manager = AccessoryManager(configuration: .init(sessionBufferLimit: sessionBufferLimit))
        defer { manager.stop() }
        try manager.startUSB(options: options)
        let found = try blockingAwait { await manager.waitForAccessory(timeout: .seconds(30)) { $0.transportKind == .usb } }
        guard let accessory = found else { throw ToolFailure("the simulated accessory was not identified within 30 s") }
        return try body(LoopbackBenchmarks.Rig(manager: manager, runner: nil, accessory: accessory), child)
    }

    /// EA echo sessions through AccessoryManager over the gadget running the simulator.
    /// How the benchmark's application drives an echo session.
    enum Application: String {
        /// A writer task and a reader task (`write`, `read(into:)`) on the default executor.
        case tasks
        /// The same tasks on the manager's task executor.
        case tasksOnManagerExecutor = "tasks on the manager's executor"
        /// Stream events on a queue, `writeAvailable` and `withNextChunk` (the native figure's way).
        case events = "stream events"
    }

    static func sessionEcho(udc: String, sessions: Int, bytes: Int, application: Application = .tasks) throws -> (figures: EchoFigures, copies: USBCopies) {
        try withAccessory(udc: udc) { rig, child in
            if application == .events {
                let before = rig.accessory.linkStatistics
                var figures = try measured(child, bytes: bytes, label: "ea-events") {
                    try eventDrivenEcho(rig.accessory, protocolName: "bench.echo.1", bytes: bytes)
                }
                figures.hostAcks = BareAcks(before: before, after: rig.accessory.linkStatistics)
                return (figures, USBCopies(endpoint: DataPlaneStatistics(), slotBytesOut: 0, inPlaceBytesOut: 0, slotBytesEvacuated: 0))
            }
            let before = (rig.accessory.dataPlaneStatistics, rig.manager.usbStatistics(of: rig.accessory), rig.accessory.linkStatistics)
            // The host's CPU over the timed echo alone (making the payload and opening the
            // sessions are not the echo's cost); the gadget's over the same call.
            var run = (bytesPerSecond: 0.0, seconds: 0.0, cpuSeconds: 0.0, systemSeconds: 0.0)
            let payload = CodecBenchmarks.pattern(bytes / sessions)
            var figures = try measured(child, bytes: bytes, label: "ea-\(sessions)") {
                run = try LoopbackBenchmarks.throughput(rig, sessions: sessions, bytesPerSession: bytes / sessions, payload: payload,
                                                        onManagerExecutor: application == .tasksOnManagerExecutor)
                return run.bytesPerSecond
            }
            figures.hostCPU = run.cpuSeconds
            figures.hostSystemCPU = run.systemSeconds
            let after = (rig.accessory.dataPlaneStatistics, rig.manager.usbStatistics(of: rig.accessory), rig.accessory.linkStatistics)
            figures.hostAcks = BareAcks(before: before.2, after: after.2)
            if verbose, let host = after.1 { step("host pipes \(host)") }
            if verbose, let link = after.2, let earlier = before.2 {
                step("EA \(sessions) session(s): \(Report.format(run.bytesPerSecond / 1e6, digits: 1)) MB/s; host link "
                    + "\(link.retransmissions - earlier.retransmissions) retransmitted, \(link.duplicatesReceived - earlier.duplicatesReceived) duplicates, "
                    + "\(link.eaksSent - earlier.eaksSent) EAKs sent")
            }
            let endpoint = after.0 - before.0
            return (figures, USBCopies(endpoint: endpoint, slotBytesOut: (after.1?.bytesCopiedOut ?? 0) - (before.1?.bytesCopiedOut ?? 0),
                                       inPlaceBytesOut: (after.1?.bytesSentInPlace ?? 0) - (before.1?.bytesSentInPlace ?? 0),
                                       slotBytesEvacuated: (after.1?.bytesEvacuated ?? 0) - (before.1?.bytesEvacuated ?? 0)))
        }
    }

    static func seconds(_ duration: Duration) -> Double {
        Double(duration.components.seconds) + Double(duration.components.attoseconds) / 1e18
    }
}

/// The host's copies of session bytes over USB: the endpoint's count (into link packets out;
/// reassembly of frames split across IN transfers and the reader's `read()` in) plus the frame
/// bytes the USB transport copied into its OUT slots (link headers included, so slightly over the
/// payload's share) and the bytes it moved out of IN slots a lagging reader held too long.
struct USBCopies {
    var endpoint: DataPlaneStatistics
    var slotBytesOut: Int
    /// Frame bytes sent from transmit buffers where the endpoint laid them out (no copy).
    var inPlaceBytesOut: Int
    var slotBytesEvacuated: Int
    var outPerByte: Double {
        endpoint.bytesWritten == 0 ? 0 : Double(endpoint.bytesCopiedOut + slotBytesOut) / Double(endpoint.bytesWritten)
    }
    var inPerByte: Double {
        endpoint.bytesRead == 0 ? 0 : Double(endpoint.bytesCopiedIn + slotBytesEvacuated) / Double(endpoint.bytesRead)
    }
    var inPlacePerByte: Double { endpoint.bytesWritten == 0 ? 0 : Double(inPlaceBytesOut) / Double(endpoint.bytesWritten) }
    var evacuatedPerByte: Double { endpoint.bytesRead == 0 ? 0 : Double(slotBytesEvacuated) / Double(endpoint.bytesRead) }
}

/// A benchmark that could not run, with the reason.
struct ToolFailure: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}
