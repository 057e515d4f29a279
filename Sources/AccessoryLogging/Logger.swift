/// The severity of a log message, from the most verbose (``trace``) to the most severe
/// (``critical``).
public enum LogLevel: Int, Comparable, Sendable, CaseIterable, LosslessStringConvertible {
    /// Step-by-step detail, such as every frame on the wire.
    case trace
    /// Information useful when debugging.
    case debug
    /// Ordinary progress information.
    case info
    /// Normal but significant events; the default level of a tool without `-v`.
    case notice
    /// Something unexpected that the program worked around.
    case warning
    /// An operation failed.
    case error
    /// The program cannot go on.
    case critical

    /// Orders levels by severity.
    public static func < (lhs: LogLevel, rhs: LogLevel) -> Bool {
        lhs.rawValue < rhs.rawValue
    }

    /// Reads a level name, ignoring case and surrounding spaces (`"Debug"`, `" warn"`);
    /// `warn`, `err` and `crit` are accepted as short forms. `nil` for anything else.
    public init?(_ description: String) {
        var text = Substring(description)
        while text.first == " " || text.first == "\t" { text = text.dropFirst() }
        while text.last == " " || text.last == "\t" { text = text.dropLast() }
        switch text.lowercased() {
        case "trace": self = .trace
        case "debug": self = .debug
        case "info": self = .info
        case "notice": self = .notice
        case "warning", "warn": self = .warning
        case "error", "err": self = .error
        case "critical", "crit": self = .critical
        default: return nil
        }
    }

    /// The lower-case name (`"notice"`), as written in log lines.
    public var description: String {
        switch self {
        case .trace: return "trace"
        case .debug: return "debug"
        case .info: return "info"
        case .notice: return "notice"
        case .warning: return "warning"
        case .error: return "error"
        case .critical: return "critical"
        }
    }
}

/// One log message as handed to a ``LogHandler``.
public struct LogRecord: Sendable, Equatable {
    /// The message's severity.
    public var level: LogLevel
    /// The label of the ``Logger`` that logged it.
    public var label: String
    /// The message text.
    public var message: String
    /// The logger's metadata merged with the message's (the message's win).
    public var metadata: [String: String]
    /// When it was logged: time since the Unix epoch on the real-time clock.
    public var timestamp: Duration

    /// Makes a record.
    public init(level: LogLevel, label: String, message: String, metadata: [String: String], timestamp: Duration) {
        self.level = level
        self.label = label
        self.message = message
        self.metadata = metadata
        self.timestamp = timestamp
    }
}

/// Where log records go. Implementations must be safe to call from any thread.
public protocol LogHandler: Sendable {
    /// Outputs or stores one record; called only for records at or above the logger's level.
    func log(_ record: LogRecord)
}

/// A logger in the shape of swift-log's: a label, a level below which messages are dropped
/// without being built, metadata attached to every message, and a handler.
///
/// Libraries take a `Logger` instead of printing; tools make one from their `-v` count with
/// ``verbosity(_:)``.
public struct Logger: Sendable {
    /// Names the component that logs (the tool or library name), written in every line.
    public let label: String
    /// The least severe level that is logged; less severe messages are not even evaluated.
    public var logLevel: LogLevel
    /// Key-value pairs attached to every message of this logger.
    public var metadata: [String: String]
    /// Where the records go.
    public var handler: any LogHandler

    /// Makes a logger; by default it logs `notice` and above to standard error.
    public init(
        label: String,
        logLevel: LogLevel = .notice,
        metadata: [String: String] = [:],
        handler: any LogHandler = StderrLogHandler()
    ) {
        self.label = label
        self.logLevel = logLevel
        self.metadata = metadata
        self.handler = handler
    }

    /// A logger whose records go nowhere, for tests and for callers that want no logs. Its level
    /// is `trace`, so messages are still built (which exercises the code that builds them).
    public static var silent: Logger {
        Logger(label: "silent", logLevel: .trace, handler: NullLogHandler())
    }

    /// The level for a count of `-v` flags: 0 → `notice`, 1 → `info`, 2 → `debug`, 3 or more →
    /// `trace`.
    public static func verbosity(_ count: Int) -> LogLevel {
        switch count {
        case ...0: return .notice
        case 1: return .info
        case 2: return .debug
        default: return .trace
        }
    }

    /// One metadata value of this logger.
    public subscript(metadataKey key: String) -> String? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    /// Whether a message at `level` would be logged.
    public func isEnabled(_ level: LogLevel) -> Bool {
        level >= logLevel
    }

    /// Logs `message` at `level` when `level` is at least ``logLevel``; otherwise neither
    /// `message` nor `metadata` is evaluated.
    public func log(
        level: LogLevel,
        _ message: @autoclosure () -> String,
        metadata: @autoclosure () -> [String: String]? = nil
    ) {
        guard isEnabled(level) else { return }
        var merged = self.metadata
        if let extra = metadata() {
            merged.merge(extra) { _, new in new }
        }
        handler.log(
            LogRecord(level: level, label: label, message: message(), metadata: merged, timestamp: WallClock.now())
        )
    }

    /// Logs at ``LogLevel/trace``; the message is not evaluated when that level is filtered out.
    public func trace(_ message: @autoclosure () -> String, metadata: @autoclosure () -> [String: String]? = nil) {
        log(level: .trace, message(), metadata: metadata())
    }

    /// Logs at ``LogLevel/debug``; the message is not evaluated when that level is filtered out.
    public func debug(_ message: @autoclosure () -> String, metadata: @autoclosure () -> [String: String]? = nil) {
        log(level: .debug, message(), metadata: metadata())
    }

    /// Logs at ``LogLevel/info``; the message is not evaluated when that level is filtered out.
    public func info(_ message: @autoclosure () -> String, metadata: @autoclosure () -> [String: String]? = nil) {
        log(level: .info, message(), metadata: metadata())
    }

    /// Logs at ``LogLevel/notice``; the message is not evaluated when that level is filtered out.
    public func notice(_ message: @autoclosure () -> String, metadata: @autoclosure () -> [String: String]? = nil) {
        log(level: .notice, message(), metadata: metadata())
    }

    /// Logs at ``LogLevel/warning``; the message is not evaluated when that level is filtered out.
    public func warning(_ message: @autoclosure () -> String, metadata: @autoclosure () -> [String: String]? = nil) {
        log(level: .warning, message(), metadata: metadata())
    }

    /// Logs at ``LogLevel/error``; the message is not evaluated when that level is filtered out.
    public func error(_ message: @autoclosure () -> String, metadata: @autoclosure () -> [String: String]? = nil) {
        log(level: .error, message(), metadata: metadata())
    }

    /// Logs at ``LogLevel/critical``.
    public func critical(_ message: @autoclosure () -> String, metadata: @autoclosure () -> [String: String]? = nil) {
        log(level: .critical, message(), metadata: metadata())
    }
}

/// A handler that drops every record.
public struct NullLogHandler: LogHandler {
    /// Makes the handler.
    public init() {}

    /// Does nothing.
    public func log(_ record: LogRecord) {}
}
