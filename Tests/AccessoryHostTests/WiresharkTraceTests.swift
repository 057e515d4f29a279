import AccessoryHost
import AccessorySimulator
import Dispatch
import IAPInspect
import IAPTransport
import Synchronization
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// A pcapng trace of simulated sessions, as `--trace-file FILE.pcapng` writes it: an iAP2
/// accessory (detect, SYN, authentication, identification, two EA sessions, one frame lost on
/// the wire and sent again) and an iAP1 accessory, each an interface of its own. The test reads
/// the trace back with ``PcapDecoder``; `tools/clients/wireshark/check.sh` sets
/// `ACCESSORYHOST_TRACE_OUTPUT` to keep the file and compares Wireshark's dissection of it
/// (tools/clients/wireshark/iap.lua) with `iapctl decode --pcap --json`.
@Suite("pcapng trace of simulated sessions", .timeLimit(.minutes(2)))
struct WiresharkTraceTests {
    /// Loses the first EA data frame the host sends (after the tracing tap saw it), so the link
    /// sends it again: a retransmission in the trace.
    final class LoseOneEAFrame: Transport {
        let base: any Transport
        let lost = Atomic<Bool>(false)
        init(_ base: any Transport) { self.base = base }
        var description: String { base.description }
        var kind: TransportKind { base.kind }
        func activate(queue: DispatchQueue, handler: @escaping @Sendable (TransportEvent) -> Void) { base.activate(queue: queue, handler: handler) }
        func send(_ frame: [UInt8]) {
            // An iAP2 packet with a payload on link session 2 (the simulator's EA session).
            if frame.count > 9, frame[0] == 0xFF, frame[1] == 0x5A, frame[7] == 2, !lost.load(ordering: .relaxed) {
                lost.store(true, ordering: .relaxed)
                return
            }
            base.send(frame)
        }
        func cancel() { base.cancel() }
    }

    @Test("the trace holds both accessories' frames, both EA sessions and the retransmission, and reads back")
    func traceOfSimulatedSessions() async throws {
        let file = Mutex<[UInt8]>([])
        let tick = Atomic<UInt64>(0)
        let recorder = PcapngTraceRecorder(application: "AccessoryHostTests", clock: {
            1_700_000_000_000_000_000 + tick.add(1_000, ordering: .relaxed).newValue
        }, write: { bytes in file.withLock { $0 += bytes } })
        var configuration = AccessoryManager.Configuration()
        configuration.transportTap = { transport in
            let interface = recorder.addInterface(name: transport.description, description: "iAP accessory on memory: \(transport.description)",
                                                  transport: .memory)
            return TracingTransport(transport) { direction, bytes in
                recorder.record(direction == .out ? .hostToAccessory : .accessoryToHost, bytes, on: interface)
            }
        }
        let manager = AccessoryManager(configuration: configuration)
        defer { manager.stop() }

        // The iAP2 accessory: two EA sessions, one frame lost on the way.
        let modern = try SimulatorRunner(profile: try #require(SimulatorProfile.builtIn(named: "multi-sensor")),
                                         attachment: .memory { manager.attach(LoseOneEAFrame($0)) })
        modern.start()
        defer { modern.stop() }
        let accessory = try #require(await manager.waitForAccessory(timeout: .seconds(20)) { $0.protocolVersion == .iap2 })
        let echo = try await accessory.openSession(for: "com.example.echo")
        let telemetry = try await accessory.openSession(for: "com.example.telemetry")
        for (session, text) in [(echo, "hello over EA"), (telemetry, "telemetry")] {
            try await session.write(Array(text.utf8))
            var back: [UInt8] = []
            while back.count < text.utf8.count, let chunk = try await session.read() { back += chunk }
            #expect(back == Array(text.utf8))
        }
        echo.close()
        telemetry.close()

        // The iAP1 accessory, on an interface of its own.
        let legacy = try SimulatorRunner(profile: try #require(SimulatorProfile.builtIn(named: "legacy-sensor")),
                                         attachment: .memory { manager.attach($0) })
        legacy.start()
        defer { legacy.stop() }
        let old = try #require(await manager.waitForAccessory(timeout: .seconds(20)) { $0.protocolVersion == .iap1 })
        let session = try await old.openSession(for: "com.example.echo")
        try await session.write(Array("iAP1 data".utf8))
        var back: [UInt8] = []
        while back.count < 9, let chunk = try await session.read() { back += chunk }
        #expect(back == Array("iAP1 data".utf8))
        session.close()
        manager.stop()

        let bytes = file.withLock { $0 }
        if let path = getenv("ACCESSORYHOST_TRACE_OUTPUT").map({ String(cString: $0) }), let out = fopen(path, "wb") {
            _ = bytes.withUnsafeBytes { fwrite($0.baseAddress, 1, $0.count, out) }
            fclose(out)
        }

        var decoder = PcapDecoder()
        var reports: [FrameReport] = []
        try decoder.feed(bytes.span.bytes) { reports.append($0) }
        try decoder.finish { reports.append($0) }
        #expect(decoder.isClean)
        let messages = reports.flatMap { report -> [String] in
            guard case let .array(list)? = report.json["messages"] else { return [] }
            return list.compactMap { if case let .string(name)? = $0["name"] { return name } else { return nil } }
        }
        for name in ["AuthenticationCertificate", "AuthenticationResponse", "IdentificationInformation", "IdentificationAccepted",
                     "StartExternalAccessoryProtocolSession"] {
            #expect(messages.contains(name), "\(name) is missing from the trace")
        }
        let eaSessions = Set(reports.compactMap { report -> Int? in if case let .int(id)? = report.json["eaSession"] { return id } else { return nil } })
        #expect(eaSessions.count == 2)
        // The lost frame and its retransmission: the same sequence number with the same bytes twice.
        let sent = reports.filter { $0.json["direction"] == .string("out") && $0.json["eaSession"] != nil }
        let sequences = sent.compactMap { report -> Int? in if case let .int(seq)? = report.json["seq"] { return seq } else { return nil } }
        #expect(sequences.count > Set(sequences).count, "no retransmitted EA frame in the trace")
        let iap1 = reports.filter { $0.json["kind"] == .string("iap1") }
        #expect(iap1.contains { $0.json["commandName"] == .string("StartIDPS") } || iap1.contains { $0.json["commandName"] == .string("IdentifyDeviceLingoes") })
        #expect(Set(reports.compactMap { report -> Int? in if case let .int(i)? = report.json["interface"] { return i } else { return nil } }).count == 2)
    }
}
