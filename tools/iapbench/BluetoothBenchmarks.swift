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
/// The raw echo is the ceiling: a plain RFCOMM socket pair (no SDP, no iAP2), the accessory's
/// side reading and writing back at once on a thread of its own (through a 1 MiB ring, as the
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
        #if DEBUG
        StandardError.write("warning: this is a debug build; its numbers mean nothing. Use: swift build -c release\n")
        #endif
        let bytes = megabytes << 20
        var profile = LoopbackBenchmarks.echoProfile(sessions: 1, maxPacketLength: 65_535)
        profile.link.maxPacketLength = try command.integer("packet-length", in: 128...65_535) ?? 16_384
        profile.link.maxOutstandingPackets = try command.integer("window", in: 1...127) ?? 8

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

        var ceilings: [Double] = []
        var rates: [Double] = []
        for round in 1...rounds {
            step("round \(round) of \(rounds): raw RFCOMM echo")
            var before = CPUSample.now()
            ceilings.append(try rawEcho(host: host, accessory: accessory, channel: rawChannel, bytes: bytes))
            step("raw: \(CPUSample.now().since(before, seconds: Double(bytes) / ceilings[round - 1]))")
            step("round \(round) of \(rounds): EA echo")
            before = CPUSample.now()
            rates.append(try sessionEcho(manager: manager, profile: profile, host: host, accessory: accessory, channel: UInt8(iAP2Channel),
                                         bytes: bytes) { before = CPUSample.now() })
            step("EA: \(CPUSample.now().since(before, seconds: Double(bytes) / rates[round - 1]))")
            if !json {
                StandardOutput.write("round \(round) of \(rounds): raw RFCOMM \(Report.format(ceilings[round - 1] / 1e3, digits: 1)) kB/s, "
                    + "EA over iAP2 \(Report.format(rates[round - 1] / 1e3, digits: 1)) kB/s each way: "
                    + "\(Report.format(rates[round - 1] / ceilings[round - 1], digits: 2))× raw\n")
            }
        }
        let ratios = zip(rates, ceilings).map { $0 / $1 }
        let (ceiling, rate, ratio) = (median(ceilings), median(rates), median(ratios))
        if json {
            StandardOutput.write(JSONValue.object([("name", .string("raw RFCOMM echo (baseline)")), ("bytesPerSecond", .int(Int(ceiling))),
                                                   ("rounds", .array(ceilings.map { .int(Int($0)) }))]).serialized() + "\n")
            StandardOutput.write(JSONValue.object([
                ("name", .string("EA echo over iAP2 on RFCOMM, 1 session")), ("bytesPerSecond", .int(Int(rate))),
                ("rounds", .array(rates.map { .int(Int($0)) })), ("ratioToCeiling", .string(Report.format(ratio, digits: 3))),
                ("ratioRange", .array([.string(Report.format(ratios.min() ?? 0, digits: 3)), .string(Report.format(ratios.max() ?? 0, digits: 3))])),
            ]).serialized() + "\n")
        } else {
            StandardOutput.write("ceiling: raw RFCOMM echo between the same adapters (baseline, median of \(rounds)): "
                + "\(Report.format(ceiling / 1e3, digits: 1)) kB/s each way\n")
            StandardOutput.write("EA echo over iAP2 on RFCOMM, 1 session: \(Report.format(rate / 1e3, digits: 1)) kB/s each way, "
                + "\(Report.format(ratio, digits: 2))× the raw echo (median of the rounds' ratios; lowest "
                + "\(Report.format(ratios.min() ?? 0, digits: 2)), highest \(Report.format(ratios.max() ?? 0, digits: 2)); goal ≥ 0.90×)\n")
        }
        return .success
    }

    /// The process's CPU time (user + system) and the machine's busy and total jiffies, to
    /// tell a CPU-bound echo (an emulated machine) from one bound by the link.
    struct CPUSample {
        var process: Double
        var busy: Int
        var total: Int

        static func now() -> CPUSample {
            var usage = rusage()
            getrusage(RUSAGE_SELF.rawValue, &usage)
            let process = Double(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) + Double(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6
            var busy = 0, total = 0
            if let file = fopen("/proc/stat", "r") {
                defer { fclose(file) }
                var line = [CChar](repeating: 0, count: 512)
                if fgets(&line, Int32(line.count), file) != nil {
                    let text = String(decoding: line.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
                    let fields = text.split(whereSeparator: { $0 == " " || $0 == "\n" }).dropFirst().compactMap { Int($0) }
                    total = fields.reduce(0, +)
                    busy = total - (fields.count > 4 ? fields[3] + fields[4] : 0) // less idle and iowait
                }
            }
            return CPUSample(process: process, busy: busy, total: total)
        }

        /// "process 1.23 s of CPU, machine 97 % busy" over the span since `earlier`.
        func since(_ earlier: CPUSample, seconds: Double) -> String {
            let share = total > earlier.total ? Double(busy - earlier.busy) / Double(total - earlier.total) * 100 : 0
            return "this process \(Report.format(process - earlier.process, digits: 2)) s of CPU in \(Report.format(seconds, digits: 2)) s, "
                + "the machine \(Report.format(share, digits: 0)) % busy"
        }
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

    static func rawEcho(host: BluetoothAddress, accessory: BluetoothAddress, channel: UInt8, bytes: Int) throws -> Double {
        let listener = try RFCOMMSocket.listen(on: host, channel: channel)
        step("listening on \(host) channel \(channel)")
        // Shut down first: close(2) alone does not wake an accept(2) still waiting.
        defer { _ = shutdown(listener, Int32(SHUT_RDWR)); _ = close(listener) }
        let acceptedSocket = Mutex<Result<Int32, BluetoothError>?>(nil)
        let acceptedSignal = DispatchSemaphore(value: 0)
        DispatchQueue(label: "iapbench.rfcomm-accept").async {
            let result = Result { () throws(BluetoothError) in try RFCOMMSocket.accept(listener).descriptor }
            acceptedSocket.withLock { $0 = result }
            acceptedSignal.signal()
        }
        let accessorySide = try connect(to: host, channel: channel, from: accessory).descriptor
        step("connected from \(accessory)")
        guard acceptedSignal.wait(timeout: .now() + 60) == .success else {
            _ = close(accessorySide)
            throw ToolFailure("the raw RFCOMM connection was not accepted within 60 s")
        }
        let hostSide: Int32
        do { hostSide = try acceptedSocket.withLock { $0! }.get() } catch {
            _ = close(accessorySide)
            throw error
        }
        step("accepted")
        // Each side is one thread polling its non-blocking socket for both directions: a
        // blocking read in one thread beside a blocking write in another on the same RFCOMM
        // socket stalls for good on Linux 6.1 (seen in the rig, from Python too), while a
        // poller moves data as the library's transports do.
        setNonBlocking(hostSide)
        let echoed = DispatchSemaphore(value: 0)
        DispatchQueue(label: "iapbench.rfcomm-echo").async {
            // Full duplex, as the simulator's echo is: it reads while earlier bytes wait to be
            // written, through a ring of 1 MiB (the EA session's buffer), so the kernel's
            // buffers and RFCOMM's credits are never what holds the ceiling back.
            var ring = [UInt8](repeating: 0, count: 1 << 20)
            var head = 0, used = 0 // bytes to echo: ring[head ..< head + used], wrapping
            while true {
                var events: Int32 = 0
                if used < ring.count { events |= POLLIN }
                if used > 0 { events |= POLLOUT }
                var descriptor = pollfd(fd: accessorySide, events: Int16(events), revents: 0)
                let ready = poll(&descriptor, 1, 60_000)
                if ready < 0, errno == EINTR { continue }
                guard ready > 0 else { break }
                let before = (head, used)
                if used > 0, descriptor.revents & Int16(POLLOUT) != 0 {
                    let length = min(used, ring.count - head)
                    let written = ring.withUnsafeBytes { send(accessorySide, $0.baseAddress! + head, length, Int32(MSG_NOSIGNAL)) }
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
                    let count = ring.withUnsafeMutableBytes { read(accessorySide, $0.baseAddress! + tail, length) }
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
            _ = close(accessorySide)
            echoed.signal()
        }
        let piece = CodecBenchmarks.pattern(65_000)
        var buffer = [UInt8](repeating: 0, count: 1 << 16)
        var sent = 0, pieceOffset = 0, received = 0
        var failure: String?
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
        let elapsed = ContinuousClock.now - start
        step("received \(received) bytes back")
        _ = shutdown(hostSide, Int32(SHUT_RDWR))
        _ = close(hostSide)
        _ = echoed.wait(timeout: .now() + 30)
        guard received == bytes else {
            throw ToolFailure("the raw RFCOMM echo ended after \(received) of \(bytes) bytes: \(failure ?? "?")")
        }
        return Double(bytes) / USBBenchmarks.seconds(elapsed)
    }

    /// The simulated accessory connects from its adapter to the host's iAP2 channel; once the
    /// manager has identified it, one EA echo session. Bytes per second each way. The
    /// accessory disconnects afterwards.
    static func sessionEcho(manager: AccessoryManager, profile: SimulatorProfile, host: BluetoothAddress, accessory: BluetoothAddress,
                            channel: UInt8, bytes: Int, started: () -> Void = {}) throws -> Double {
        let connected = try connect(to: host, channel: channel, from: accessory)
        var declared = profile
        declared.bluetoothAddress = connected.local.bytes
        // (The transport owns the descriptor from here, and closes it when it cannot be made.)
        let transport = try BluetoothTransport(descriptor: connected.descriptor, peer: BluetoothPeer(address: host, devicePath: ""))
        let runner = try SimulatorRunner(profile: declared, attachment: .transport(transport))
        runner.start()
        defer { runner.stop() }
        let found = try blockingAwait {
            await manager.waitForAccessory(timeout: .seconds(60)) { [previousConnection] in
                $0.transportKind == .bluetooth && $0.isConnected && $0.connectionID != previousConnection
            }
        }
        guard let identified = found else { throw ToolFailure("the simulated accessory was not identified over Bluetooth within 60 s") }
        defer { previousConnection = identified.connectionID }
        started()
        let before = identified.linkStatistics ?? LinkStatistics()
        let rate = try USBBenchmarks.eventDrivenEcho(identified, protocolName: "bench.echo.1", bytes: bytes)
        if verbose, let after = identified.linkStatistics {
            step("host link: \(after.packetsSent - before.packetsSent) packets sent, \(after.retransmissions - before.retransmissions) "
                + "retransmitted (\(after.retransmissionsDeferred - before.retransmissionsDeferred) held back), "
                + "\(after.packetsReceived - before.packetsReceived) received, \(after.duplicatesReceived - before.duplicatesReceived) duplicates, "
                + "\(after.acksSent - before.acksSent) bare ACKs, \(after.eaksSent - before.eaksSent) EAKs sent")
        }
        runner.stop()
        let gone = try blockingAwait {
            await manager.waitUntilNoAccessory(timeout: .seconds(30)) { $0.connectionID == identified.connectionID }
        }
        guard gone else { throw ToolFailure("the accessory's connection did not end within 30 s of its stop") }
        return rate
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
