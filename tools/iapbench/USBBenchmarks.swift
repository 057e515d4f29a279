import AccessoryHost
import AccessoryHostUSB
import AccessoryGadget
import AccessorySimulator
import CLIKit
import Dispatch
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
    nonisolated(unsafe) static var options = USBOptions()
    /// Each session's write buffer on the host (`--session-buffer`; the library's default).
    nonisolated(unsafe) static var sessionBufferLimit = AccessoryManager.Configuration().sessionBufferLimit

    static func run(_ command: ParsedCommand) throws -> ExitCode {
        verbose = command.flag("verbose")
        options.useDeviceMemory = !command.flag("heap")
        if let kibibytes = try command.integer("session-buffer", in: 64...65_536) { sessionBufferLimit = kibibytes << 10 }
        if let count = try command.integer("transmit-buffers", in: 0...1_024) { options.transmitBuffers = count }
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
        func median(_ values: [Double]) -> Double {
            let sorted = values.sorted()
            return sorted.count % 2 == 1 ? sorted[sorted.count / 2] : (sorted[sorted.count / 2 - 1] + sorted[sorted.count / 2]) / 2
        }
        func emit(_ name: String, _ rates: [Double], ratios: [Double]?, extra: String = "") {
            let rate = median(rates)
            if json {
                var fields: [(String, JSONValue)] = [("name", .string(name)), ("bytesPerSecond", .int(Int(rate))),
                                                     ("rounds", .array(rates.map { .int(Int($0)) }))]
                if let ratios {
                    fields.append(("ratioToCeiling", .string(Report.format(median(ratios), digits: 3))))
                    fields.append(("ratioRange", .array([.string(Report.format(ratios.min() ?? 0, digits: 3)),
                                                         .string(Report.format(ratios.max() ?? 0, digits: 3))])))
                }
                StandardOutput.write(JSONValue.object(fields).serialized() + "\n")
            } else {
                let share = ratios.map { ratios in
                    "  (\(Report.format(median(ratios) * 100, digits: 1)) % of the ceiling; rounds "
                        + "\(Report.format((ratios.min() ?? 0) * 100, digits: 1))–\(Report.format((ratios.max() ?? 0) * 100, digits: 1)) %)"
                } ?? ""
                StandardOutput.write("\(name): \(Report.format(rate / 1e6, digits: 1)) MB/s each way\(share)\(extra)\n")
            }
        }
        let native = command.flag("native")
        let profile = LoopbackBenchmarks.echoProfile(sessions: 3, maxPacketLength: 65_535, native: native)
        if command.flag("daemon") {
            return try DaemonBenchmarks.runUSB(command, profile: profile, udc: udc, megabytes: megabytes, rounds: rounds)
        }
        var ceilings: [Double] = []
        var sessionRates: [Int: [Double]] = [:]
        var nativeRates: [Double] = []
        var gadgetFSCeilings: [Double] = []
        var nativeUnavailable: String?
        var lastCopies: USBCopies?
        for round in 1...rounds {
            step("round \(round) of \(rounds)")
            ceilings.append(try rawEcho(profile: profile, udc: udc, bytes: megabytes << 20))
            for sessions in [1, 3] {
                let (rate, copies) = try sessionEcho(profile: profile, udc: udc, sessions: sessions, bytes: megabytes << 20)
                sessionRates[sessions, default: []].append(rate)
                if sessions == 1 { lastCopies = copies }
            }
            if native, nativeUnavailable == nil {
                // The native interface needs a GadgetFS gadget; its own ceiling goes beside it.
                switch try rawEchoGadgetFS(profile: profile, bytes: megabytes << 20) {
                case let .success(rate): gadgetFSCeilings.append(rate)
                case let .failure(reason):
                    nativeUnavailable = reason.description
                    continue
                }
                switch try nativeEcho(profile: profile, bytes: megabytes << 20) {
                case let .success(rate): nativeRates.append(rate)
                case let .failure(reason): nativeUnavailable = reason.description
                }
            }
        }
        emit("ceiling: raw bulk echo through the same gadget and pipes (baseline, median of \(rounds))", ceilings, ratios: nil)
        for sessions in [1, 3] {
            let rates = sessionRates[sessions] ?? []
            let ratios = zip(rates, ceilings).map { $0 / $1 }
            emit("EA echo over iAP2, \(sessions) session\(sessions == 1 ? "" : "s") (total)", rates, ratios: ratios,
                 extra: sessions > 1 ? ", \(Report.format(median(rates) / Double(sessions) / 1e6, digits: 1)) MB/s per session" : "")
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
                 gadgetFSCeilings, ratios: nil)
            emit(name + ", on GadgetFS", nativeRates, ratios: zip(nativeRates, gadgetFSCeilings).map { $0 / $1 })
        }
        return .success
    }

    /// A native-transport echo session (`bench.native`) through AccessoryManager over a GadgetFS
    /// gadget (FunctionFS on kernels before 6.8 cannot accept alternate setting 1, and never says
    /// which setting the host chose; GadgetFS hands SET_INTERFACE to the simulator). A failure says
    /// why it could not be measured.
    static func nativeEcho(profile: SimulatorProfile, bytes: Int) throws -> Result<Double, ToolFailure> {
        let device: GadgetFSDevice
        do {
            let layout = try GadgetFSLayout(vendorID: 0x1209, productID: 0x00BF, manufacturer: "AccessoryHost Simulator",
                                            product: profile.accessory.name, serialNumber: profile.accessory.serialNumber,
                                            nativeProtocols: profile.nativeProtocolNames)
            device = try GadgetFSDevice(layout: layout)
            if verbose { device.onTrace { StandardError.write("iapbench: GadgetFS: \($0)\n") } }
        } catch {
            // The one reason the figure is "not measured" (exit 69): no GadgetFS here. Anything
            // that fails once it exists is an error of the run.
            return .failure(ToolFailure("cannot make a GadgetFS gadget: \(error)"))
        }
        defer {
            step("stopping the GadgetFS gadget")
            device.stop()
            if verbose { StandardError.write("iapbench: GadgetFS ep0: \(device.log.joined(separator: "; "))\n") }
        }
        let runner = try SimulatorRunner(profile: profile, attachment: .transport(device.transport))
        // The simulator identifies the accessory on the iAP2 interface; the native session's bytes
        // are echoed by the gadget itself, as the ceiling's are, so that the ratio measures the
        // host (AccessorySession over USBNativePipe against USBAccessoryTransport's raw pipes).
        let echoQueue = DispatchQueue(label: "iapbench.native-echo")
        device.onNativeOpen { _, channel in
            echoQueue.async { rawChannelEcho(channel, queue: echoQueue) }
        }
        runner.start()
        defer { runner.stop() }
        let manager = AccessoryManager(configuration: .init(sessionBufferLimit: sessionBufferLimit))
        defer { manager.stop() }
        try manager.startUSB(options: options)
        let found = try blockingAwait {
            await manager.waitForAccessory(timeout: .seconds(30)) { $0.usbDevice?.descriptor.productID == 0x00BF }
        }
        guard let accessory = found else {
            throw ToolFailure("the simulated accessory on GadgetFS was not identified within 30 s (ep0: \(device.log.joined(separator: "; ")))")
        }
        do {
            return .success(try eventDrivenEcho(accessory, protocolName: "bench.native", bytes: bytes))
        } catch {
            throw ToolFailure("the native echo failed: \(error) (ep0: \(device.log.joined(separator: "; ")))")
        }
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

    static func step(_ text: String) {
        if verbose { StandardError.write("iapbench: \(text)\n") }
    }

    static func makeGadget(_ profile: SimulatorProfile, udc: String) throws -> USBGadget {
        var configuration = USBGadgetConfiguration(profile: profile)
        configuration.nativeTransportProtocols = profile.nativeProtocolNames // offered, to measure the host's half
        configuration.name = gadgetName
        configuration.functionInstance = gadgetName
        configuration.productID = 0x00BE
        return try USBGadget(configuration: configuration)
    }

    /// The ceiling: the gadget echoes raw bytes; the host keeps up to 512 KiB in flight through
    /// a `USBAccessoryTransport` (64 KiB frames, one per OUT transfer) and counts what returns.
    static func rawEcho(profile: SimulatorProfile, udc: String, bytes: Int) throws -> Double {
        let gadget = try makeGadget(profile, udc: udc)
        defer {
            step("removing the gadget")
            try? gadget.unbind()
            try? gadget.remove()
            step("gadget removed")
        }
        let device = gadget.transport
        if verbose { device.onConnectionChange { StandardError.write("iapbench: gadget \($0)\n") } }
        return try rawEcho(device: device, productID: 0x00BE, bytes: bytes, bind: { try gadget.bind(udc: udc) },
                           statistics: { "\(device.statistics)" })
    }

    /// The raw echo through the iAP2 interface of a GadgetFS gadget: the ceiling of the pipes the
    /// native figure runs on.
    static func rawEchoGadgetFS(profile: SimulatorProfile, bytes: Int) throws -> Result<Double, ToolFailure> {
        let layout = try GadgetFSLayout(vendorID: 0x1209, productID: 0x00BF, manufacturer: "AccessoryHost Simulator",
                                        product: profile.accessory.name, serialNumber: profile.accessory.serialNumber,
                                        nativeProtocols: profile.nativeProtocolNames)
        // Writing the descriptors binds the gadget: the host may configure it before the echo
        // starts, which the relay transport keeps for its activation.
        let device: GadgetFSDevice
        do { device = try GadgetFSDevice(layout: layout) } catch {
            return .failure(ToolFailure("cannot make a GadgetFS gadget: \(error)"))
        }
        if verbose { device.onTrace { StandardError.write("iapbench: GadgetFS: \($0)\n") } }
        defer { device.stop() }
        return .success(try rawEcho(device: device.transport, productID: 0x00BF, bytes: bytes, bind: {}, statistics: { "GadgetFS" }))
    }

    /// A raw echo through `device` (the gadget side, echoing what it reads) and the host's
    /// `USBAccessoryTransport` on the device with `productID`; `bind` makes it appear.
    static func rawEcho(device: any Transport, productID: UInt16, bytes: Int, bind: () throws -> Void,
                        statistics: @escaping @Sendable () -> String) throws -> Double {
        let deviceQueue = DispatchQueue(label: "iapbench.gadget")
        device.activate(queue: deviceQueue) { event in
            if case let .received(chunk) = event { device.send(chunk) }
        }
        try bind()

        let queue = DispatchQueue(label: "iapbench.usb")
        let context = try USBContext(queue: queue, function: .iAP2, options: options)
        defer {
            step("shutting the USB context down")
            queue.sync { context.shutdown() }
            _ = context.waitUntilExited(timeout: .now() + 5)
            step("USB context shut down")
        }
        let opened = DispatchSemaphore(value: 0)
        let found = Mutex<Result<USBAccessoryTransport, USBError>?>(nil)
        try queue.sync {
            try context.startMonitoring { event in
                guard case let .arrived(info) = event, info.descriptor.productID == productID, found.withLock({ $0 == nil }) else { return }
                found.withLock { $0 = .failure(USBError(.io, "opening")) }
                context.open(info) { result in
                    found.withLock { $0 = result }
                    opened.signal()
                }
            }
        }
        guard opened.wait(timeout: .now() + 30) == .success, let result = found.withLock({ $0 }) else {
            throw ToolFailure("the gadget did not appear on the host within 30 s")
        }
        let transport = try result.get()
        let counters = Counters()
        // (A Dispatch source must be resumed before it is released: only make it when used.)
        let progress = verbose ? DispatchSource.makeTimerSource(queue: DispatchQueue(label: "iapbench.progress")) : nil
        progress?.schedule(deadline: .now() + 1, repeating: 1)
        progress?.setEventHandler { StandardError.write("iapbench: \(counters.text); gadget \(statistics())\n") }
        progress?.resume()
        defer { progress?.cancel() }
        let frame = [UInt8](repeating: 0xA5, count: 65_000) // not a multiple of the packet size
        let window = 8 * frame.count
        let done = DispatchSemaphore(value: 0)
        let state = Mutex((sent: 0, received: 0, finished: false))
        let start = Mutex(ContinuousClock.now)
        @Sendable func pump() {
            while true {
                let send = state.withLock { state -> Bool in
                    guard state.sent < bytes, state.sent - state.received < window else { return false }
                    state.sent += frame.count
                    return true
                }
                guard send else { return }
                transport.send(frame)
            }
        }
        queue.sync {
            transport.activate(queue: queue) { event in
                switch event {
                case let .borrowed(chunk):
                    state.withLock { $0.received += chunk.count }
                    counters.add(received: chunk.count)
                case let .lent(lease): // not asked for: the raw echo never keeps the bytes
                    state.withLock { $0.received += lease.count }
                    counters.add(received: lease.count)
                case let .received(chunk):
                    state.withLock { $0.received += chunk.count }
                    counters.add(received: chunk.count)
                case .closed: done.signal()
                }
                let finished = state.withLock { state -> Bool in
                    guard !state.finished, state.received >= bytes else { return false }
                    state.finished = true
                    return true
                }
                if finished { done.signal() } else { pump() }
            }
            start.withLock { $0 = .now }
            pump()
        }
        guard done.wait(timeout: .now() + (verbose ? 45 : 120)) == .success else {
            let host = queue.sync { transport.statistics }
            throw ToolFailure("the raw echo stalled: \(state.withLock { $0 }); host pipes \(host); gadget \(statistics())")
        }
        let elapsed = ContinuousClock.now - start.withLock { $0 }
        let received = state.withLock { $0.received }
        step("raw echo done; closing the host side")
        transport.cancel()
        _ = done.wait(timeout: .now() + 5)
        step("closing the gadget side")
        device.cancel()
        step("gadget closed")
        return Double(received) / seconds(elapsed)
    }

    /// Runs `body` with the simulated accessory behind a gadget, identified by an
    /// AccessoryManager over USB; everything is taken down afterwards.
    static func withAccessory<Result>(profile: SimulatorProfile, udc: String,
                                      _ body: (LoopbackBenchmarks.Rig, USBGadget) throws -> Result) throws -> Result {
        let gadget = try makeGadget(profile, udc: udc)
        defer { try? gadget.unbind(); try? gadget.remove() }
        let runner = try SimulatorRunner(profile: profile, attachment: .transport(gadget.transport))
        runner.start()
        defer { runner.stop() }
        try gadget.bind(udc: udc)
        let manager = AccessoryManager(configuration: .init(sessionBufferLimit: sessionBufferLimit))
        defer { manager.stop() }
        try manager.startUSB(options: options)
        let found = try blockingAwait { await manager.waitForAccessory(timeout: .seconds(30)) { $0.transportKind == .usb } }
        guard let accessory = found else { throw ToolFailure("the simulated accessory was not identified within 30 s") }
        return try body(LoopbackBenchmarks.Rig(manager: manager, runner: runner, accessory: accessory), gadget)
    }

    /// EA echo sessions through AccessoryManager over the same gadget running the simulator.
    static func sessionEcho(profile: SimulatorProfile, udc: String, sessions: Int, bytes: Int) throws -> (rate: Double, copies: USBCopies) {
        try withAccessory(profile: profile, udc: udc) { rig, gadget in
            let before = (rig.accessory.dataPlaneStatistics, rig.manager.usbStatistics(of: rig.accessory))
            let rate = try LoopbackBenchmarks.throughput(rig, sessions: sessions, bytesPerSession: bytes / sessions).bytesPerSecond
            let after = (rig.accessory.dataPlaneStatistics, rig.manager.usbStatistics(of: rig.accessory))
            if verbose, let host = after.1 {
                step("host pipes \(host); gadget \(gadget.transport.statistics)")
            }
            let endpoint = after.0 - before.0
            return (rate, USBCopies(endpoint: endpoint, slotBytesOut: (after.1?.bytesCopiedOut ?? 0) - (before.1?.bytesCopiedOut ?? 0),
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

/// What the raw echo has moved, for the progress lines.
final class Counters: Sendable {
    private let received = Atomic<Int>(0)
    private let chunks = Atomic<Int>(0)
    func add(received count: Int) {
        received.add(count, ordering: .relaxed)
        chunks.add(1, ordering: .relaxed)
    }
    var text: String { "received \(received.load(ordering: .relaxed)) bytes in \(chunks.load(ordering: .relaxed)) completions" }
}

/// A benchmark that could not run, with the reason.
struct ToolFailure: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}
