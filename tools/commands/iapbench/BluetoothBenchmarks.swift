import AccessoryHost
import AccessoryHostBluetooth
import AccessorySimulator
import BluetoothTransport
import CLIKit
import Dispatch
import Glibc
import IAPInspect
import IAPLink
import IAPTransport
import Synchronization
import SystemCalls

/// `iapbench bluetooth`: an EA echo session over iAP2 on RFCOMM (the host's iAP2 service
/// registered with BlueZ on one adapter, the simulated accessory connecting from another) beside
/// a raw RFCOMM echo between the same two adapters, round by round.
///
/// The accessory's side of both runs in a process of its own (`iapbench bluetooth-accessory`),
/// so that this process's CPU time is the host's alone.
///
/// The raw echo is the ceiling: a plain RFCOMM socket pair (no SDP, no iAP2), the accessory's
/// side reading and writing back at once (through a 1 MiB ring, as the
/// simulator's session buffers the EA echo), the host's side writing 65,000-byte
/// pieces and reading on another, each polling its non-blocking socket; the EA echo drives a session the way the USB bench does
/// (stream events, non-blocking writes of the same pieces, reads that only count).
enum BluetoothBenchmarks {
    static func run(_ command: ParsedCommand) throws -> ExitCode {
        let usage = "iapbench bluetooth --host ADDRESS --accessory ADDRESS [--mib N] [--rounds N]"
        guard let hostText = command.value("host"), let host = BluetoothAddress(hostText),
              let accessoryText = command.value("accessory"), let accessory = BluetoothAddress(accessoryText)
        else {
            throw UsageError("give the host's adapter and the accessory's adapter by address (bluetoothctl list shows them)",
                             usage: usage, commandPath: command.path)
        }
        guard host != accessory else {
            throw UsageError("the host and the accessory need two adapters (two addresses)", usage: usage, commandPath: command.path)
        }
        let megabytes = try command.integer("mib", in: 1...1_024) ?? 4
        let rounds = try command.integer("rounds", in: 1...100) ?? 3
        let iAP2Channel = UInt16(try command.integer("channel", in: 1...30) ?? 7)
        let rawChannel = UInt8(try command.integer("raw-channel", in: 1...30) ?? 9)
        guard Int(iAP2Channel) != Int(rawChannel) else {
            throw UsageError("--channel and --raw-channel must differ", usage: usage, commandPath: command.path)
        }
        let json = command.flag("json")
        verbose = command.flag("verbose")
        HostProfile.directory = command.value("perf")
        #if DEBUG
        StandardError.write("warning: this is a debug build; its numbers mean nothing. Use: swift build -c release\n")
        #endif
        let bytes = megabytes << 20
        // The simulated accessory's link, made in its own process (`bluetooth-accessory`).
        let packetLength = try command.integer("packet-length", in: 128...65_535) ?? 16_384
        let window = try command.integer("window", in: 1...127) ?? 8

        var configuration = AccessoryManager.Configuration(sessionBufferLimit: USBBenchmarks.sessionBufferLimit)
        configuration.daemon = .never
        let manager = AccessoryManager(configuration: configuration)
        defer { manager.stop() }
        do {
            try blockingAwait { try await manager.startBluetooth(options: BluetoothOptions(channel: iAP2Channel)) }
        } catch let error as BluetoothError {
            StandardError.write("iapbench bluetooth: \(error)\n")
            return error.kind == .permission ? .noPermission : .unavailable
        }

        var ceilings: [EchoFigures] = []
        var echoes: [EchoFigures] = []
        for round in 1...rounds {
            step("round \(round) of \(rounds): raw RFCOMM echo")
            let ceiling = try rawEcho(host: host, accessory: accessory, channel: rawChannel, bytes: bytes)
            ceilings.append(ceiling)
            step("round \(round) of \(rounds): EA echo")
            let echo = try sessionEcho(manager: manager, packetLength: packetLength, window: window, host: host, accessory: accessory, channel: UInt8(iAP2Channel), bytes: bytes)
            echoes.append(echo)
            if !json {
                StandardOutput.write("round \(round) of \(rounds): raw RFCOMM \(Report.format(ceiling.rate / 1e3, digits: 1)) kB/s, "
                    + "EA over iAP2 \(Report.format(echo.rate / 1e3, digits: 1)) kB/s each way: "
                    + "\(Report.format(echo.rate / ceiling.rate, digits: 2))× raw; host CPU per MiB \(Report.format(EchoFigures.perMiB(ceiling.hostCPU, bytes: bytes), digits: 1)) ms "
                    + "and \(Report.format(EchoFigures.perMiB(echo.hostCPU, bytes: bytes), digits: 1)) ms\n")
            }
        }
        let ratios = zip(echoes, ceilings).map { $0.rate / $1.rate }
        let cpuRatios = zip(echoes, ceilings).map { $1.hostCPU > 0 ? $0.hostCPU / $1.hostCPU : 0 }
        let (ceiling, rate, ratio) = (median(ceilings.map(\.rate)), median(echoes.map(\.rate)), median(ratios))
        let hostMiB = (raw: median(ceilings.map { EchoFigures.perMiB($0.hostCPU, bytes: bytes) }),
                       ea: median(echoes.map { EchoFigures.perMiB($0.hostCPU, bytes: bytes) }))
        let accessoryMiB = (raw: median(ceilings.map { EchoFigures.perMiB($0.accessory.cpuSeconds, bytes: bytes) }),
                            ea: median(echoes.map { EchoFigures.perMiB($0.accessory.cpuSeconds, bytes: bytes) }))
        let last = echoes.last
        let hostAcks = last?.hostAcks ?? BareAcks(acks: 0, dataPackets: 0)
        let accessoryAcks = BareAcks(acks: last?.accessory.acks ?? 0, dataPackets: last?.accessory.packets ?? 0)
        if json {
            StandardOutput.write(JSONValue.object([("name", .string("raw RFCOMM echo (baseline)")), ("bytesPerSecond", .int(Int(ceiling))),
                                                   ("rounds", .array(ceilings.map { .int(Int($0.rate)) })),
                                                   ("hostCPUMillisecondsPerMiB", .string(Report.format(hostMiB.raw, digits: 2))),
                                                   ("accessoryCPUMillisecondsPerMiB", .string(Report.format(accessoryMiB.raw, digits: 2)))]).serialized() + "\n")
            StandardOutput.write(JSONValue.object([
                ("name", .string("EA echo over iAP2 on RFCOMM, 1 session")), ("bytesPerSecond", .int(Int(rate))),
                ("rounds", .array(echoes.map { .int(Int($0.rate)) })), ("ratioToCeiling", .string(Report.format(ratio, digits: 3))),
                ("ratioRange", .array([.string(Report.format(ratios.min() ?? 0, digits: 3)), .string(Report.format(ratios.max() ?? 0, digits: 3))])),
                ("hostCPUMillisecondsPerMiB", .string(Report.format(hostMiB.ea, digits: 2))),
                ("hostCPURatioToCeiling", .string(Report.format(median(cpuRatios), digits: 3))),
                ("accessoryCPUMillisecondsPerMiB", .string(Report.format(accessoryMiB.ea, digits: 2))),
                ("hostBareAcks", hostAcks.json), ("accessoryBareAcks", accessoryAcks.json),
            ]).serialized() + "\n")
        } else {
            StandardOutput.write("ceiling: raw RFCOMM echo between the same adapters (baseline, median of \(rounds)): "
                + "\(Report.format(ceiling / 1e3, digits: 1)) kB/s each way\n")
            StandardOutput.write("EA echo over iAP2 on RFCOMM, 1 session: \(Report.format(rate / 1e3, digits: 1)) kB/s each way, "
                + "\(Report.format(ratio, digits: 2))× the raw echo (median of the rounds' ratios; lowest "
                + "\(Report.format(ratios.min() ?? 0, digits: 2)), highest \(Report.format(ratios.max() ?? 0, digits: 2)); goal ≥ 0.90×)\n")
            StandardOutput.write("  CPU per MiB moved each way (medians): the host process \(Report.format(hostMiB.raw, digits: 1)) ms raw, "
                + "\(Report.format(hostMiB.ea, digits: 1)) ms EA (\(Report.format(median(cpuRatios), digits: 2))× raw's, median of the rounds' ratios); "
                + "the accessory's process \(Report.format(accessoryMiB.raw, digits: 1)) ms raw, \(Report.format(accessoryMiB.ea, digits: 1)) ms EA\n")
            StandardOutput.write("  bare ACKs per data packet received (last round): host \(hostAcks.text), accessory \(accessoryAcks.text)\n")
        }
        return .success
    }

    static func median(_ values: [Double]) -> Double {
        let sorted = values.sorted()
        return sorted.count % 2 == 1 ? sorted[sorted.count / 2] : (sorted[sorted.count / 2 - 1] + sorted[sorted.count / 2]) / 2
    }

    /// A raw RFCOMM echo: the accessory's adapter connects to a plain listener on the host's and
    /// writes back whatever it reads; the host's side writes `bytes` and reads them back.
    /// Bytes per second each way, from the first write to the last byte read.
    nonisolated(unsafe) static var verbose = false
    /// The connection the last EA round measured, never taken for the next round's accessory.
    nonisolated(unsafe) static var previousConnection: Int?
    static func step(_ text: String) { if verbose { StandardError.write("iapbench: \(text)\n") } }

    static func rawEcho(host: BluetoothAddress, accessory: BluetoothAddress, channel: UInt8, bytes: Int) throws -> EchoFigures {
        let listener = try RFCOMMSocket.listen(on: host, channel: channel)
        step("listening on \(host) channel \(channel)")
        // Shut down first: close(2) alone does not wake an accept(2) still waiting.
        defer { _ = shutdown(listener, Int32(SHUT_RDWR)); _ = close(listener) }
        let acceptedSocket = Mutex<Result<Int32, BlueZError>?>(nil)
        let acceptedSignal = DispatchSemaphore(value: 0)
        DispatchQueue(label: "iapbench.rfcomm-accept").async {
            let result = Result { () throws(BlueZError) in try RFCOMMSocket.accept(listener).descriptor }
            acceptedSocket.withLock { $0 = result }
            acceptedSignal.signal()
        }
        // The accessory's side echoes in a process of its own (its CPU time is its own).
        let child: AccessoryChild
        do {
            child = try AccessoryChild(arguments: ["bluetooth-accessory", "--mode", "raw", "--host", "\(host)", "--accessory", "\(accessory)",
                                                "--channel", "\(channel)"])
        } catch {
            throw ToolFailure("the raw echo's accessory: \(error.reason)")
        }
        defer { child.stop() }
        step("connected from \(accessory)")
        guard acceptedSignal.wait(timeout: .now() + 60) == .success else {
            throw ToolFailure("the raw RFCOMM connection was not accepted within 60 s")
        }
        let hostSide = try acceptedSocket.withLock { $0! }.get()
        defer { _ = close(hostSide) }
        step("accepted")
        // Each side is one thread polling its non-blocking socket for both directions: a
        // blocking read in one thread beside a blocking write in another on the same RFCOMM
        // socket stalls for good on Linux 6.1 (seen in the rig, from Python too), while a
        // poller moves data as the library's transports do.
        setNonBlocking(hostSide)
        let childBefore = try child.figures()
        let hostBefore = ProcessFigures.now()
        let piece = CodecBenchmarks.pattern(65_000)
        var buffer = [UInt8](repeating: 0, count: 1 << 16)
        var sent = 0, pieceOffset = 0, received = 0
        var failure: String?
        let elapsed = try HostProfile.recording("bluetooth-raw") { () -> Duration in
            let start = ContinuousClock.now
            while received < bytes {
                var descriptor = pollfd(fd: hostSide, events: Int16(POLLIN) | (sent < bytes ? Int16(POLLOUT) : 0), revents: 0)
                let ready = poll(&descriptor, 1, 60_000)
                if ready < 0, errno == EINTR { continue }
                guard ready > 0 else {
                    failure = "nothing moved for 60 s"
                    break
                }
                if sent < bytes, descriptor.revents & Int16(POLLOUT) != 0 {
                    let count = min(piece.count - pieceOffset, bytes - sent)
                    let written = piece.withUnsafeBytes { send(hostSide, $0.baseAddress! + pieceOffset, count, Int32(MSG_NOSIGNAL)) }
                    if written > 0 {
                        sent += written
                        pieceOffset = (pieceOffset + written) % piece.count
                    } else if written < 0, errno != EAGAIN, errno != EINTR {
                        failure = "writing failed: \(SystemError.last.text)"
                        break
                    }
                }
                if descriptor.revents & Int16(POLLIN | POLLHUP | POLLERR) != 0 {
                    let count = buffer.withUnsafeMutableBytes { read(hostSide, $0.baseAddress, $0.count) }
                    if count > 0 {
                        received += count
                    } else if count == 0 || (errno != EAGAIN && errno != EINTR) {
                        failure = count == 0 ? "the echo side closed" : "reading failed: \(SystemError.last.text)"
                        break
                    }
                }
            }
            return ContinuousClock.now - start
        }
        let hostCPU = ProcessFigures.now().cpuSeconds - hostBefore.cpuSeconds
        let accessoryCPU = try child.figures() - childBefore
        step("received \(received) bytes back")
        _ = shutdown(hostSide, Int32(SHUT_RDWR))
        guard received == bytes else {
            throw ToolFailure("the raw RFCOMM echo ended after \(received) of \(bytes) bytes: \(failure ?? "?")")
        }
        return EchoFigures(rate: Double(bytes) / USBBenchmarks.seconds(elapsed), hostCPU: hostCPU, accessory: accessoryCPU)
    }

    /// The raw echo's accessory side: reads `socket` (a connected RFCOMM socket) and writes
    /// back what it read until the other side hangs up or nothing moves for 60 s.
    static func echoLoop(_ socket: Int32) {
        // Full duplex, as the simulator's echo is: it reads while earlier bytes wait to be
        // written, through a ring of 1 MiB (the EA session's buffer), so the kernel's
        // buffers and RFCOMM's credits are never what holds the ceiling back.
        var ring = [UInt8](repeating: 0, count: 1 << 20)
        var head = 0, used = 0 // bytes to echo: ring[head ..< head + used], wrapping
        while true {
            var events: Int32 = 0
            if used < ring.count { events |= POLLIN }
            if used > 0 { events |= POLLOUT }
            var descriptor = pollfd(fd: socket, events: Int16(events), revents: 0)
            let ready = poll(&descriptor, 1, 60_000)
            if ready < 0, errno == EINTR { continue }
            guard ready > 0 else { break }
            let before = (head, used)
            if used > 0, descriptor.revents & Int16(POLLOUT) != 0 {
                let length = min(used, ring.count - head)
                let written = ring.withUnsafeBytes { send(socket, $0.baseAddress! + head, length, Int32(MSG_NOSIGNAL)) }
                if written > 0 {
                    head = (head + written) % ring.count
                    used -= written
                } else if written == 0 || (errno != EAGAIN && errno != EINTR) {
                    break
                }
            }
            if used < ring.count, descriptor.revents & Int16(POLLIN | POLLHUP | POLLERR) != 0 {
                let tail = (head + used) % ring.count
                let length = min(ring.count - used, ring.count - tail)
                let count = ring.withUnsafeMutableBytes { read(socket, $0.baseAddress! + tail, length) }
                if count > 0 {
                    used += count
                } else if count == 0 || (errno != EAGAIN && errno != EINTR) {
                    break
                }
            }
            if used == 0 { head = 0 } // the next read gets the whole ring
            // Hung up or failed with nothing moved (the ring full, the socket not
            // writable): poll would report it again at once, for ever.
            if (head, used) == before, descriptor.revents & Int16(POLLHUP | POLLERR | POLLNVAL) != 0 { break }
        }
    }

    /// One echo's figures: bytes per second each way, the host process's CPU seconds over it, and
    /// the accessory's process's figures over it.
    struct EchoFigures {
        var rate: Double
        var hostCPU: Double
        var accessory: GadgetProcess.Figures
        /// The host link's bare ACKs and data packets taken (EA only).
        var hostAcks: BareAcks?

        /// CPU milliseconds per MiB moved each way, of `seconds` over `bytes`.
        static func perMiB(_ seconds: Double, bytes: Int) -> Double { seconds * 1e3 / (Double(bytes) / 1_048_576) }
    }

    /// The simulated accessory, in a process of its own (`iapbench bluetooth-accessory`),
    /// connects from its adapter to the host's iAP2 channel; once the manager has identified it,
    /// one EA echo session. The accessory disconnects afterwards.
    static func sessionEcho(manager: AccessoryManager, packetLength: Int, window: Int, host: BluetoothAddress, accessory: BluetoothAddress,
                            channel: UInt8, bytes: Int) throws -> EchoFigures {
        let child: AccessoryChild
        do {
            child = try AccessoryChild(arguments: ["bluetooth-accessory", "--mode", "simulator", "--host", "\(host)", "--accessory", "\(accessory)",
                                                "--channel", "\(channel)", "--packet-length", "\(packetLength)", "--window", "\(window)"])
        } catch {
            throw ToolFailure("the simulated accessory: \(error.reason)")
        }
        defer { child.stop() }
        let found = try blockingAwait {
            await manager.waitForAccessory(timeout: .seconds(60)) { [previousConnection] in
                $0.transportKind == .bluetooth && $0.isConnected && $0.connectionID != previousConnection
            }
        }
        guard let identified = found else { throw ToolFailure("the simulated accessory was not identified over Bluetooth within 60 s") }
        defer { previousConnection = identified.connectionID }
        let childBefore = try child.figures()
        let hostBefore = ProcessFigures.now()
        let before = identified.linkStatistics ?? LinkStatistics()
        let rate = try HostProfile.recording("bluetooth-ea") {
            try USBBenchmarks.eventDrivenEcho(identified, protocolName: "bench.echo.1", bytes: bytes)
        }
        let hostCPU = ProcessFigures.now().cpuSeconds - hostBefore.cpuSeconds
        let accessoryFigures = try child.figures() - childBefore
        let after = identified.linkStatistics
        if verbose, let after {
            step("host link: \(after.packetsSent - before.packetsSent) packets sent, \(after.retransmissions - before.retransmissions) "
                + "retransmitted (\(after.retransmissionsDeferred - before.retransmissionsDeferred) held back), "
                + "\(after.packetsReceived - before.packetsReceived) received, \(after.duplicatesReceived - before.duplicatesReceived) duplicates, "
                + "\(after.acksSent - before.acksSent) bare ACKs, \(after.eaksSent - before.eaksSent) EAKs sent")
        }
        child.stop()
        let gone = try blockingAwait {
            await manager.waitUntilNoAccessory(timeout: .seconds(30)) { $0.connectionID == identified.connectionID }
        }
        guard gone else { throw ToolFailure("the accessory's connection did not end within 30 s of its stop") }
        return EchoFigures(rate: rate, hostCPU: hostCPU, accessory: accessoryFigures, hostAcks: BareAcks(before: before, after: after))
    }

    /// Connects from `local` to `address` on `channel`, trying up to five times: a connection
    /// made while the previous one's RFCOMM session between the same two adapters is still
    /// being torn down is reset by the kernel (seen in the rig between rounds), and the next
    /// try, a moment later, goes through.
    static func connect(to address: BluetoothAddress, channel: UInt8, from local: BluetoothAddress) throws
        -> (descriptor: Int32, local: BluetoothAddress) {
        try blockingAwait {
            var attempt = 1
            while true {
                do {
                    return try await RFCOMMSocket.connect(to: address, channel: channel, from: local)
                } catch where attempt < 5 {
                    step("connecting to \(address) channel \(channel), try \(attempt): \(error); trying again in 0.5 s")
                    attempt += 1
                    // The teardown is the kernel's and has no event to wait for: a Dispatch
                    // timer resumes the next try (no thread waits meanwhile).
                    await withCheckedContinuation { (resumed: CheckedContinuation<Void, Never>) in
                        DispatchQueue.global().asyncAfter(deadline: .now() + .milliseconds(500)) { resumed.resume() }
                    }
                }
            }
        }
    }

    static func setNonBlocking(_ descriptor: Int32) {
        let flags = fcntl(descriptor, F_GETFL)
        _ = fcntl(descriptor, F_SETFL, flags | O_NONBLOCK)
    }
}
