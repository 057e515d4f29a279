import AccessoryHost
import AccessoryLogging
import CLIKit
import Glibc
import IAPDaemonProtocol
import IAPInspect
import ProjectVersion
import SystemCalls

let statsCommand = CommandSpec(
    name: "stats",
    abstract: "Print the running iapd's counters: accessories, sessions, bytes each way, retransmissions, failures, clients.",
    discussion: """
        Asks the iapd at $IAPD_SOCKET (else /run/iapd/iapd.sock) for the figures it writes for \
        Prometheus with --metrics-dir (docs/DAEMON.md, "Metrics") and prints them as a short \
        table, or with --json as one object (docs/json-schema.json). Counters count from iapd's \
        start and never go back while it runs: an accessory that goes away leaves its counts in \
        them. The clients connected include this one. Exit status: 0 done, 69 iapd is not \
        running, or too old to answer (the message says to update it), 77 not allowed to use it.
        """,
    options: [jsonOption],
    refusedGroups: [OptionGroup.accessory, OptionGroup.authentication],
    examples: [CommandExample("iapctl stats", "The figures as a table."),
               CommandExample("iapctl stats --json | jq '.bytes'", "Session bytes each way, for a script.")],
    exitStatuses: [ExitStatusDescription(.success, "done"),
                   ExitStatusDescription(.unavailable, "iapd is not running, or is too old to answer stats"),
                   ExitStatusDescription(.noPermission, "not allowed to use iapd (the message names the group)")]
)

enum StatsCommand {
    static func run(_ command: ParsedCommand) throws -> ExitCode {
        let logger = Logger(label: "iapctl", logLevel: Logger.verbosity(command.count("verbose")))
        let path = AccessoryManager.defaultDaemonSocketPath
        let descriptor: Int32
        do {
            descriptor = try DaemonConnectionError.connect(path: path)
        } catch where error.kind == .notRunning {
            throw ToolError(description: "iapd is not running (nothing listens on \(path)): start it with `sudo systemctl start iapd`, "
                                + "or name its socket with IAPD_SOCKET; the figures are iapd's own", exitCode: .unavailable)
        } catch {
            throw ToolError(description: "\(error)", exitCode: error.kind == .permission ? .noPermission : .unavailable)
        }
        var connection = BlockingDaemonConnection(descriptor: descriptor, path: path, logger: logger)
        defer { connection.close() }
        connection.send(.hello(version: DaemonProtocol.version, client: "iapctl stats"), id: 1)
        let daemon: String
        switch try connection.reply(to: 1) {
        case let .welcome(_, name, _):
            daemon = name
        case let .failure(failure):
            throw ToolError(description: "iapd at \(path) refused this client: \(failure.message)",
                            exitCode: failure.code == .permission ? .noPermission : .unavailable)
        default:
            throw ToolError(description: "iapd at \(path) did not answer hello; is it iapd that listens there?", exitCode: .unavailable)
        }
        logger.info("connected to \(daemon) at \(path)")
        connection.send(.stats, id: 2)
        let statistics: DaemonStatistics
        switch try connection.reply(to: 2) {
        case let .statistics(answer):
            statistics = answer
        case let .failure(failure) where failure.code == .badRequest:
            throw ToolError(description: "\(daemon) at \(path) is too old to answer stats (it dropped the request as unknown): update iapd to "
                                + "the release of this iapctl (\(AccessoryHostVersion.string)) and restart it (`sudo systemctl restart iapd`)",
                            exitCode: .unavailable)
        case let .failure(failure):
            throw ToolError(description: "iapd at \(path): \(failure.message)", exitCode: .unavailable)
        default:
            throw ToolError(description: "iapd at \(path) answered stats with something else; update iapd to the release of this iapctl",
                            exitCode: .unavailable)
        }
        StandardOutput.write(command.flag("json") ? JSONOutput.line(statsJSON(statistics)) : statsText(statistics, now: realTime()))
        return .success
    }

    /// Seconds since the Unix epoch, now.
    static func realTime() -> Double {
        var now = timespec()
        clock_gettime(CLOCK_REALTIME, &now)
        return Double(now.tv_sec) + Double(now.tv_nsec) / 1e9
    }
}

/// `iapctl stats`: the figures as a short table for people.
func statsText(_ statistics: DaemonStatistics, now: Double) -> String {
    func pad(_ text: String, _ width: Int) -> String { String(repeating: " ", count: max(0, width - text.count)) + text }
    func counts(_ list: [Count]) -> String {
        let nonzero = list.filter { $0.count > 0 }
        return nonzero.isEmpty ? "none" : nonzero.map { "\($0.name) \($0.count)" }.joined(separator: ", ")
    }
    var out = "\(statistics.daemon.escapedForTerminal), up \(uptime(now - statistics.startTime))\n"
    let headers = ["now", "connecting", "identified", "gone", "packets out", "packets in", "retransmitted", "link resets"]
    out += "accessories" + headers.map { "  " + $0 }.joined() + "\n"
    for transport in statistics.transports {
        let values = [transport.identifiedNow, transport.connectingNow, transport.identifiedTotal, transport.disconnectedTotal,
                      transport.linkPacketsSentTotal, transport.linkPacketsReceivedTotal, transport.linkRetransmissionsTotal,
                      transport.linkResetsTotal]
        out += "  " + transport.transport + String(repeating: " ", count: max(0, 9 - transport.transport.count))
            + zip(headers, values).map { "  " + pad(String($1), $0.count) }.joined() + "\n"
    }
    out += "authentication  \(statistics.authentications.map { "\($0.name) \($0.count)" }.joined(separator: ", "))\n"
    out += "sessions        \(statistics.sessionsNow) open, \(statistics.sessionsOpenedTotal) opened\n"
    out += "bytes           client → accessory \(statistics.bytesClientToAccessoryTotal), accessory → client \(statistics.bytesAccessoryToClientTotal)\n"
    out += "clients         \(statistics.clientsNow) connected (this one included), \(statistics.clientsAcceptedTotal) served, refused: \(counts(statistics.clientsRefused))\n"
    out += "open failures   \(counts(statistics.openFailures))\n"
    out += "failures        \(counts(statistics.failures))\n"
    return out
}

/// `2 d 3 h`, `1 h 05 min`, `4 min 10 s`, `12 s`.
func uptime(_ seconds: Double) -> String {
    let total = max(0, Int(seconds))
    let (days, hours, minutes, rest) = (total / 86_400, total / 3_600 % 24, total / 60 % 60, total % 60)
    if days > 0 { return "\(days) d \(hours) h" }
    if hours > 0 { return "\(hours) h \(minutes < 10 ? "0" : "")\(minutes) min" }
    if minutes > 0 { return "\(minutes) min \(rest) s" }
    return "\(rest) s"
}

/// `iapctl stats --json`: the members after `schemaVersion` (docs/json-schema.json, `stats`).
func statsJSON(_ statistics: DaemonStatistics) -> [(String, JSONValue)] {
    func object(_ list: [Count]) -> JSONValue { .object(list.map { ($0.name, .int($0.count)) }) }
    return [
        ("daemon", .string(statistics.daemon)),
        ("startTime", .number(statistics.startTime)),
        ("transports", .array(statistics.transports.map { transport in
            .object([("transport", .string(transport.transport)), ("identifiedNow", .int(transport.identifiedNow)),
                     ("connectingNow", .int(transport.connectingNow)), ("identifiedTotal", .int(transport.identifiedTotal)),
                     ("disconnectedTotal", .int(transport.disconnectedTotal)), ("linkPacketsSentTotal", .int(transport.linkPacketsSentTotal)),
                     ("linkPacketsReceivedTotal", .int(transport.linkPacketsReceivedTotal)),
                     ("linkRetransmissionsTotal", .int(transport.linkRetransmissionsTotal)), ("linkResetsTotal", .int(transport.linkResetsTotal))])
        })),
        ("authentications", object(statistics.authentications)),
        ("sessions", .object([("open", .int(statistics.sessionsNow)), ("openedTotal", .int(statistics.sessionsOpenedTotal))])),
        ("bytes", .object([("clientToAccessoryTotal", .int(statistics.bytesClientToAccessoryTotal)),
                           ("accessoryToClientTotal", .int(statistics.bytesAccessoryToClientTotal))])),
        ("clients", .object([("connected", .int(statistics.clientsNow)), ("acceptedTotal", .int(statistics.clientsAcceptedTotal)),
                             ("refused", object(statistics.clientsRefused))])),
        ("openFailures", object(statistics.openFailures)),
        ("failures", object(statistics.failures)),
    ]
}

/// A connection to iapd for one request at a time, blocking with a bound: `iapctl stats` has
/// nothing else to do meanwhile.
struct BlockingDaemonConnection {
    private let descriptor: Int32
    private let path: String
    private let logger: Logger
    private var framer = MessageFramer(limit: DaemonProtocol.maximumReplyLength)
    private var descriptors: [Int32] = []
    /// How long a reply may take.
    static let timeoutMilliseconds: Int32 = 10_000

    init(descriptor: Int32, path: String, logger: Logger) {
        self.descriptor = descriptor
        self.path = path
        self.logger = logger
    }

    func close() { _ = Glibc.close(descriptor) }

    /// Sends `request` (a request is small: the socket takes it at once).
    func send(_ request: ClientRequest, id: UInt32) {
        let bytes = MessageFramer.encode(ClientMessage(id: id, request: request))
        var offset = 0
        while offset < bytes.count {
            var poll = [pollfd(fd: descriptor, events: Int16(POLLOUT), revents: 0)]
            _ = SystemCall.poll(&poll, timeout: Self.timeoutMilliseconds)
            let sent = bytes[offset...].withUnsafeBytes { UnixSocket.send(descriptor, $0) }
            guard case .success(let count) = sent else { return } // the reply's read says what went wrong
            offset += count
        }
    }

    /// The reply to request `id`, skipping events; a failure without an id (the daemon dropping
    /// this client, as an iapd that does not know the request does) is the answer too.
    mutating func reply(to id: UInt32) throws -> DaemonReply {
        var scratch = [UInt8](repeating: 0, count: 64 * 1024)
        while true {
            while let payload = try nextPayload() {
                let message: DaemonMessage
                do { message = try MessageFramer.decode(DaemonMessage.self, from: payload) } catch {
                    logger.debug("iapd sent a message this iapctl does not know (\(error)); skipped")
                    continue
                }
                if message.id == id { return message.reply }
                if message.id == nil, case .failure = message.reply { return message.reply }
            }
            var poll = [pollfd(fd: descriptor, events: Int16(POLLIN), revents: 0)]
            guard case .success(let ready) = SystemCall.poll(&poll, timeout: Self.timeoutMilliseconds), ready > 0 else {
                throw ToolError(description: "iapd at \(path) did not answer within \(Self.timeoutMilliseconds / 1000) s; is it stuck? (`journalctl -u iapd`)",
                                exitCode: .unavailable)
            }
            let received = scratch.withUnsafeMutableBytes { UnixSocket.receive(descriptor, into: $0, descriptors: &descriptors) }
            for passed in descriptors { _ = Glibc.close(passed) }
            descriptors.removeAll()
            switch received {
            case .success(0):
                throw ToolError(description: "iapd at \(path) closed the connection without answering; see its log (`journalctl -u iapd`)",
                                exitCode: .unavailable)
            case .success(let count):
                framer.append(scratch.prefix(count))
            case .failure(let error) where error.kind == .wouldBlock:
                continue
            case .failure(let error):
                throw ToolError(description: "reading from iapd at \(path) failed: \(error)", exitCode: .unavailable)
            }
        }
    }

    private mutating func nextPayload() throws -> [UInt8]? {
        do { return try framer.nextPayload() } catch {
            throw ToolError(description: "iapd at \(path) sent \(error); update iapd and iapctl to the same release", exitCode: .unavailable)
        }
    }
}
