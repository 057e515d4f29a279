import AccessoryHost
import AccessoryLogging
import AccessorySimulator
import Dispatch
import Foundation
@testable import IAPDaemon
import IAPDaemonProtocol
import IAPLink
import Synchronization
import SystemCalls
import Testing

/// Issue 35: iapd's counters and gauges for Prometheus (node_exporter's textfile collector) and
/// for `iapctl stats`.
@Suite("iapd's metrics: the text format, the file replaced whole, stats over the protocol", .timeLimit(.minutes(3)))
struct MetricsTests {
    // MARK: The text format

    @Test("every family has its HELP and TYPE lines first, counters end in _total, every name starts with iapd_")
    func familiesAreWellFormed() throws {
        var statistics = DaemonStatistics(daemon: "iapd 9.9.9", startTime: 1_800_000_000.25)
        statistics.transports[named: "usb"].identifiedNow = 2
        statistics.transports[named: "usb"].linkRetransmissionsTotal = 17
        statistics.bytesClientToAccessoryTotal = 123_456_789
        statistics.failures[named: "transport"] = 3
        let text = PrometheusText.render(statistics)
        let families = try Exposition.parse(text)
        #expect(families.count == 17)
        for family in families {
            #expect(family.name.hasPrefix("iapd_"))
            #expect(family.name.hasSuffix("_total") == (family.type == "counter"), "\(family.name) is a \(family.type)")
            #expect(!family.samples.isEmpty, "\(family.name) has no samples")
        }
        let samples = try Exposition.samples(text)
        #expect(samples[#"iapd_accessories{transport="usb",state="identified"}"#] == 2)
        #expect(samples[#"iapd_accessories{transport="simulated",state="connecting"}"#] == 0)
        #expect(samples[#"iapd_link_retransmissions_total{transport="usb"}"#] == 17)
        #expect(samples[#"iapd_session_bytes_total{direction="client-to-accessory"}"#] == 123_456_789)
        #expect(samples[#"iapd_failures_total{kind="transport"}"#] == 3)
        #expect(samples["iapd_start_time_seconds"] == 1_800_000_000.25)
        #expect(text.contains("\niapd_session_bytes_total{direction=\"client-to-accessory\"} 123456789\n"), "counts are written as integers")
        #expect(text.hasSuffix("\n"))
    }

    @Test("label values escape backslash, double quote and line feed; help texts backslash and line feed")
    func escaping() throws {
        #expect(PrometheusText.escapeLabelValue(#"plain ünïcode"#) == #"plain ünïcode"#)
        #expect(PrometheusText.escapeLabelValue("a\\b\"c\nd") == #"a\\b\"c\nd"#)
        #expect(PrometheusText.escapeHelp("one\\two\nthree \"quoted\"") == #"one\\two\nthree "quoted""#)
        let text = PrometheusText.render(DaemonStatistics(daemon: "iapd \"odd\"\nname\\", startTime: 0))
        #expect(text.contains("\niapd_info{daemon=\"iapd \\\"odd\\\"\\nname\\\\\",protocol=\"\(DaemonProtocol.version)\"} 1\n"))
        // Still one sample per line, and every label value reads back.
        let samples = try Exposition.samples(text)
        #expect(samples["iapd_info{daemon=\"iapd \\\"odd\\\"\\nname\\\\\",protocol=\"\(DaemonProtocol.version)\"}"] == 1)
    }

    @Test("the kinds the daemon counts are the labels it publishes")
    func kindsMatchTheLabels() {
        #expect(StatisticsBook.Failure.allCases.map(\.rawValue) == DaemonStatistics.failureKinds)
        #expect(StatisticsBook.Refusal.allCases.map(\.rawValue) == DaemonStatistics.clientRefusalReasons)
        #expect(DaemonStatistics.transportNames == ["usb", "serial", "bluetooth", "simulated"])
        #expect(StatisticsBook.label(.memory) == "simulated")
        #expect(StatisticsBook.label(.usb) == "usb")
    }

    @Test("link counters add up per connection: an accessory identified again on its connection, a new connection, a link counting from zero")
    func ledgerIsMonotonic() {
        var statistics = DaemonStatistics(daemon: "iapd", startTime: 0)
        var ledger = LinkLedger()
        func reading(sent: Int, retransmissions: Int = 0, resets: Int = 0) -> LinkStatistics {
            var counters = LinkStatistics()
            counters.packetsSent = sent
            counters.retransmissions = retransmissions
            counters.linkResets = resets
            return counters
        }
        ledger.observe(connection: 1, transport: "usb", reading(sent: 10, retransmissions: 1), into: &statistics)
        ledger.observe(connection: 1, transport: "usb", reading(sent: 25, retransmissions: 2), into: &statistics)
        #expect(statistics.transports[named: "usb"].linkPacketsSentTotal == 25)
        // Its accessory goes (the last reading is taken then); the link restarts on the same
        // connection and a new accessory is identified on it: counting goes on from there.
        ledger.departed(connection: 1, live: [])
        ledger.observe(connection: 1, transport: "usb", reading(sent: 40, retransmissions: 2, resets: 1), into: &statistics)
        #expect(statistics.transports[named: "usb"].linkPacketsSentTotal == 40)
        #expect(statistics.transports[named: "usb"].linkResetsTotal == 1)
        // Another connection (a replug) counts from its zero.
        ledger.observe(connection: 2, transport: "usb", reading(sent: 7), into: &statistics)
        #expect(statistics.transports[named: "usb"].linkPacketsSentTotal == 47)
        // Counters lower than last time: a link that started from zero; never subtracted.
        ledger.observe(connection: 2, transport: "usb", reading(sent: 3), into: &statistics)
        #expect(statistics.transports[named: "usb"].linkPacketsSentTotal == 50)
        #expect(statistics.transports[named: "usb"].linkRetransmissionsTotal == 2)
        #expect(statistics.transports[named: "serial"].linkPacketsSentTotal == 0)
        // Memory stays bounded however many connections come and go; a live one is kept.
        for connection in 3..<1_003 {
            ledger.observe(connection: connection, transport: "serial", reading(sent: 1), into: &statistics)
            ledger.departed(connection: connection, live: [2])
        }
        #expect(ledger.count <= LinkLedger.departedKept + 1)
        #expect(statistics.transports[named: "serial"].linkPacketsSentTotal == 1_000)
    }

    // MARK: The file

    @Test("the file is replaced whole: a reader never sees a part of it, and nothing else is left in the directory")
    func replacementIsAtomic() async throws {
        let directory = try temporaryDirectory("metrics-atomic")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        // Two texts of very different sizes: a reader that caught a write half done would see
        // neither of them.
        let small = "# small\n" + String(repeating: "a 1\n", count: 10)
        let large = "# large\n" + String(repeating: "b 2\n", count: 64 * 1024)
        try MetricsExporter.replace(fileName: "iapd.prom", in: directory, with: small).get()
        let path = directory + "/iapd.prom"
        let stop = Atomic<Bool>(false)
        let reads = Atomic<Int>(0)
        let torn = Mutex<[Int]>([])
        async let reader: Void = onOwnQueue("metrics reader") {
            while !stop.load(ordering: .acquiring) {
                guard let contents = FileManager.default.contents(atPath: path) else {
                    torn.withLock { $0.append(-1) } // the file was missing for a moment
                    continue
                }
                if contents.count != small.utf8.count || String(decoding: contents, as: UTF8.self) != small,
                   contents.count != large.utf8.count || String(decoding: contents, as: UTF8.self) != large {
                    torn.withLock { $0.append(contents.count) }
                }
                reads.wrappingAdd(1, ordering: .relaxed)
            }
        }
        try await onOwnQueue("metrics writer") {
            for round in 0..<400 {
                try MetricsExporter.replace(fileName: "iapd.prom", in: directory, with: round.isMultiple(of: 2) ? large : small).get()
            }
        }
        stop.store(true, ordering: .releasing)
        try await reader
        #expect(torn.withLock { $0 }.isEmpty, "torn or missing reads (sizes): \(torn.withLock { $0.prefix(10) })")
        #expect(reads.load(ordering: .relaxed) > 0)
        #expect(try FileManager.default.contentsOfDirectory(atPath: directory) == ["iapd.prom"])
        #expect(try FileManager.default.attributesOfItem(atPath: path)[.posixPermissions] as? Int == 0o644)
    }

    @Test("a directory that is missing or not one: the failure is logged once with what to do, tried again, and the file written once it is there")
    func unwritableDirectory() async throws {
        let base = try temporaryDirectory("metrics-missing")
        defer { try? FileManager.default.removeItem(atPath: base) }
        let manager = AccessoryManager()
        defer { manager.stop() }
        let server = DaemonServer(manager: manager, logger: Logger(label: "iapd-test", handler: NullLogHandler()))
        defer { server.stop() }
        let logs = InMemoryLogHandler()
        let missing = base + "/not-yet"
        let exporter = MetricsExporter(server: server, options: MetricsExporter.Options(directory: missing),
                                       logger: Logger(label: "iapd", logLevel: .debug, handler: logs))
        for _ in 0..<3 {
            guard case let .failure(error) = await exporter.write() else {
                Issue.record("a write into a missing directory succeeded")
                return
            }
            #expect(error.kind == .noDirectory)
            #expect(error.description.contains("mkdir -p \(missing)"))
            #expect(error.description.contains(MetricsExporter.debianTextfileDirectory))
        }
        let errors = logs.records.filter { $0.level == .error }
        #expect(errors.count == 1, "logged: \(logs.messages)")
        #expect(errors.first?.message.contains("tried again every") == true)
        #expect(exporter.writeCount == 0)
        // It appears: the next write succeeds, and says so.
        try FileManager.default.createDirectory(atPath: missing, withIntermediateDirectories: false)
        try await exporter.write().get()
        #expect(exporter.writeCount == 1)
        #expect(logs.messages.contains { $0.contains("written again") })
        #expect(try FileManager.default.contentsOfDirectory(atPath: missing) == ["iapd.prom"])
        let text = try String(contentsOfFile: missing + "/iapd.prom", encoding: .utf8)
        #expect(text.contains("iapd_clients_connected 0\n"))
        // A path through a regular file: not a directory either.
        #expect(FileManager.default.createFile(atPath: base + "/file", contents: Data()))
        guard case let .failure(error) = MetricsExporter.replace(fileName: "iapd.prom", in: base + "/file", with: "x 1\n") else {
            Issue.record("a write under a regular file succeeded")
            return
        }
        #expect(error.kind == .noDirectory)
        // Stopped: the file is removed and nothing is written again.
        exporter.stop()
        #expect(try FileManager.default.contentsOfDirectory(atPath: missing).isEmpty)
        guard case let .failure(stopped) = await exporter.write() else {
            Issue.record("a stopped exporter wrote")
            return
        }
        #expect(stopped.kind == .stopped)
        #expect(try FileManager.default.contentsOfDirectory(atPath: missing).isEmpty)
    }

    // MARK: Over the daemon

    @Test("stats over the protocol after a known transfer: bytes each way exact, sessions, clients, the accessory; the file says the same")
    func statsAfterATransfer() async throws {
        let daemon = try await DaemonHarness.start()
        defer { daemon.stop() }
        let (client, accessory) = try await daemon.client()
        defer { client.stop() }
        let session = try await accessory.openSession(for: "com.example.echo")
        let payload = pattern(300_000, seed: 35)
        #expect(try await echo(payload, over: session) == payload)
        // A raw client asks; then opens what it cannot have (the protocol is held; one the
        // accessory does not declare), and asks again.
        let (statistics, later) = try await onOwnQueue("stats client") { () throws -> (DaemonStatistics?, DaemonStatistics?) in
            var raw = try RawClient(path: daemon.socketPath)
            raw.send(.hello(version: DaemonProtocol.version, client: "stats-test"))
            guard case let .welcome(_, _, records)? = try raw.reply(to: 1), let record = records.first else { return (nil, nil) }
            raw.send(.stats, id: 2)
            guard case let .statistics(first)? = try raw.reply(to: 2) else { return (nil, nil) }
            raw.send(.open(accessory: record.id, protocolString: "com.example.echo"), id: 3)
            guard case .failure(let held)? = try raw.reply(to: 3), held.code == .protocolInUse else { return (first, nil) }
            raw.send(.open(accessory: record.id, protocolString: "com.example.nope"), id: 4)
            guard case .failure(let unknown)? = try raw.reply(to: 4), unknown.code == .unsupportedProtocol else { return (first, nil) }
            raw.send(.stats, id: 5)
            guard case let .statistics(second)? = try raw.reply(to: 5) else { return (first, nil) }
            return (first, second)
        }
        let answer = try #require(statistics, "no statistics in the reply to stats")
        let after = try #require(later, "the opens did not fail as expected, or no second reply to stats")
        #expect(after.openFailures[named: "protocol-in-use"] == 1)
        #expect(after.openFailures[named: "unsupported-protocol"] == 1)
        #expect(after.openFailures.reduce(0) { $0 + $1.count } == 2)
        #expect(after.bytesClientToAccessoryTotal == payload.count)
        #expect(answer.bytesClientToAccessoryTotal == payload.count)
        #expect(answer.bytesAccessoryToClientTotal == payload.count)
        #expect(answer.sessionsNow == 1)
        #expect(answer.sessionsOpenedTotal == 1)
        #expect(answer.clientsNow == 2, "the client manager and the raw client")
        #expect(answer.clientsAcceptedTotal == 2)
        #expect(answer.accessoriesIdentifiedNow == 1)
        let simulated = try #require(answer.transport("simulated"))
        #expect(simulated.identifiedNow == 1)
        #expect(simulated.identifiedTotal == 1)
        #expect(simulated.linkPacketsSentTotal > 0)
        #expect(simulated.linkPacketsReceivedTotal > 0)
        #expect(answer.authentications[named: "not-verified"] + answer.authentications[named: "not-checked"]
                    + answer.authentications[named: "verified"] == 1)
        #expect(answer.failures.allSatisfy { $0.count == 0 }, "\(answer.failures)")

        let directory = try temporaryDirectory("metrics-daemon")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let exporter = MetricsExporter(server: daemon.current, options: MetricsExporter.Options(directory: directory),
                                       logger: Logger(label: "iapd-test", handler: NullLogHandler()))
        defer { exporter.stop() }
        try await exporter.write().get()
        let samples = try Exposition.samples(try String(contentsOfFile: exporter.path, encoding: .utf8))
        #expect(samples[#"iapd_session_bytes_total{direction="client-to-accessory"}"#] == Double(payload.count))
        #expect(samples[#"iapd_session_bytes_total{direction="accessory-to-client"}"#] == Double(payload.count))
        #expect(samples[#"iapd_accessories{transport="simulated",state="identified"}"#] == 1)
        #expect(samples["iapd_sessions_opened_total"] == 1)
        session.close()
    }

    @Test("counters never go back across a reconnection: the departing accessory's counts stay in the totals")
    func countersSurviveAReconnection() async throws {
        let daemon = try await DaemonHarness.start()
        defer { daemon.stop() }
        let (client, accessory) = try await daemon.client()
        defer { client.stop() }
        let session = try await accessory.openSession(for: "com.example.echo")
        let payload = pattern(200_000, seed: 36)
        #expect(try await echo(payload, over: session) == payload)
        session.close()
        let before = await daemon.current.currentStatistics()
        let first = try #require(daemon.manager.connectedAccessories.first)

        // Unplugged, and a new accessory on a new transport.
        daemon.runner.stop()
        #expect(await daemon.manager.waitUntilNoAccessory(timeout: .seconds(30)) { $0.connectionID == first.connectionID })
        let runner = try SimulatorRunner(profile: try #require(SimulatorProfile.builtIn(named: "multi-sensor")),
                                         attachment: .memory { [manager = daemon.manager] host in manager.attach(host) })
        runner.start()
        defer { runner.stop() }
        _ = try #require(await daemon.manager.waitForAccessory(timeout: .seconds(30)) { $0.connectionID != first.connectionID })
        let after = await daemon.current.currentStatistics()

        let simulatedBefore = try #require(before.transport("simulated"))
        let simulatedAfter = try #require(after.transport("simulated"))
        #expect(simulatedAfter.identifiedTotal == 2)
        #expect(simulatedAfter.disconnectedTotal == 1)
        #expect(simulatedAfter.identifiedNow == 1)
        // The new link's handshake adds to what the first one counted.
        #expect(simulatedAfter.linkPacketsSentTotal > simulatedBefore.linkPacketsSentTotal)
        #expect(simulatedAfter.linkPacketsReceivedTotal > simulatedBefore.linkPacketsReceivedTotal)
        #expect(after.bytesClientToAccessoryTotal == payload.count)
        #expect(after.bytesAccessoryToClientTotal == payload.count)
        // Every counter of the exposition, one by one.
        let old = try Exposition.samples(PrometheusText.render(before))
        let new = try Exposition.samples(PrometheusText.render(after))
        for (series, value) in old where series.contains("_total") {
            let now = try #require(new[series], "\(series) disappeared")
            #expect(now >= value, "\(series) went back from \(value) to \(now)")
        }
    }
}

// MARK: Helpers

extension RawClient {
    /// The reply to request `id` (events are skipped); nil when the daemon closed the connection.
    mutating func reply(to id: UInt32) throws -> DaemonReply? {
        while let (message, passed) = try next() {
            for descriptor in passed { _ = close(descriptor) }
            if message.id == id { return message.reply }
        }
        return nil
    }
}

/// A directory of its own under the temporary directory.
func temporaryDirectory(_ prefix: String) throws -> String {
    let directory = FileManager.default.temporaryDirectory.appendingPathComponent("\(prefix)-\(UUID().uuidString.prefix(8))").path
    try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
    return directory
}

/// Runs `body`, which may block, on a Dispatch queue of its own (never on a thread of Swift's
/// cooperative pool) and returns what it returns.
func onOwnQueue<Value: Sendable>(_ label: String, _ body: @escaping @Sendable () throws -> Value) async throws -> Value {
    try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Value, any Error>) in
        DispatchQueue(label: label).async { continuation.resume(with: Result { try body() }) }
    }
}

/// A reader of the text exposition format strict enough to catch what Prometheus would refuse:
/// HELP then TYPE before a family's samples, one family per name, label values quoted with only
/// the format's escapes.
enum Exposition {
    struct Family {
        var name: String
        var type: String
        var samples: [String] = []
    }

    struct Malformed: Error, CustomStringConvertible {
        var description: String
    }

    static func parse(_ text: String) throws -> [Family] {
        var families: [Family] = []
        var pendingHelp: String?
        for line in text.split(separator: "\n", omittingEmptySubsequences: false).dropLast().map(String.init) {
            if line.hasPrefix("# HELP ") {
                let name = String(line.dropFirst(7).prefix { $0 != " " })
                guard !families.contains(where: { $0.name == name }) else { throw Malformed(description: "\(name) twice") }
                pendingHelp = name
            } else if line.hasPrefix("# TYPE ") {
                let parts = line.dropFirst(7).split(separator: " ").map(String.init)
                guard parts.count == 2, parts[0] == pendingHelp, ["counter", "gauge"].contains(parts[1]) else {
                    throw Malformed(description: "TYPE without its HELP first: \(line)")
                }
                families.append(Family(name: parts[0], type: parts[1]))
                pendingHelp = nil
            } else {
                let (series, _) = try sample(line)
                let name = String(series.prefix { $0 != "{" })
                guard let last = families.last, last.name == name else { throw Malformed(description: "a sample outside its family: \(line)") }
                families[families.count - 1].samples.append(series)
            }
        }
        guard text.hasSuffix("\n") else { throw Malformed(description: "no line feed at the end") }
        return families
    }

    /// Every sample, by its series (name and labels as written).
    static func samples(_ text: String) throws -> [String: Double] {
        var result: [String: Double] = [:]
        _ = try parse(text)
        for line in text.split(separator: "\n").map(String.init) where !line.hasPrefix("#") {
            let (series, value) = try sample(line)
            result[series] = value
        }
        return result
    }

    /// One sample line: its series and value, with its label values checked.
    static func sample(_ line: String) throws -> (String, Double) {
        let characters = Array(line)
        var index = 0
        while index < characters.count, characters[index].isLetter || characters[index].isNumber || characters[index] == "_" { index += 1 }
        guard index > 0 else { throw Malformed(description: "no metric name: \(line)") }
        if index < characters.count, characters[index] == "{" {
            index += 1
            while true {
                let nameStart = index
                while index < characters.count, characters[index].isLetter || characters[index] == "_" { index += 1 }
                guard index > nameStart, index + 1 < characters.count, characters[index] == "=", characters[index + 1] == "\"" else {
                    throw Malformed(description: "a label without name=\"value\": \(line)")
                }
                index += 2
                while index < characters.count, characters[index] != "\"" {
                    if characters[index] == "\\" {
                        guard index + 1 < characters.count, ["\\", "\"", "n"].contains(characters[index + 1]) else {
                            throw Malformed(description: "an escape the format does not have: \(line)")
                        }
                        index += 1
                    }
                    index += 1
                }
                guard index < characters.count else { throw Malformed(description: "an unterminated label value: \(line)") }
                index += 1
                if index < characters.count, characters[index] == "," { index += 1; continue }
                guard index < characters.count, characters[index] == "}" else { throw Malformed(description: "labels not closed: \(line)") }
                index += 1
                break
            }
        }
        guard index < characters.count, characters[index] == " ", let value = Double(String(characters[(index + 1)...])) else {
            throw Malformed(description: "no value: \(line)")
        }
        return (String(characters[..<index]), value)
    }
}
