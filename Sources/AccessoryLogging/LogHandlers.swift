internal import Glibc
internal import Synchronization

/// Writes each record as one line to a file descriptor (standard error by default):
///
///     2026-11-30T05:20:11.123456Z notice iapctl: message key=value
///
/// The timestamp is UTC; metadata follows sorted by key. Each line goes out in one `write(2)`
/// call, so lines logged from several threads do not interleave.
public struct StderrLogHandler: LogHandler {
    /// The descriptor the lines are written to.
    public let fileDescriptor: Int32

    /// Makes a handler writing to `fileDescriptor` (2, standard error, unless told otherwise).
    public init(fileDescriptor: Int32 = 2) {
        self.fileDescriptor = fileDescriptor
    }

    /// Writes the record's line; a failed write is ignored (there is nowhere to report it).
    public func log(_ record: LogRecord) {
        _ = FileDescriptorWriter.writeAll(Self.line(for: record), to: fileDescriptor)
    }

    /// The line written for `record`, newline included. The message is escaped for a terminal
    /// (``Swift/StringProtocol/escapedForTerminal``: a message that quotes an accessory's text
    /// stays one line and sends the terminal no controls). Metadata values that are empty or hold
    /// spaces, quotes, `=`, backslashes or anything else that needs escaping are quoted, with the
    /// same escapes and `\"` for a quote.
    public static func line(for record: LogRecord) -> String {
        var text = WallClock.iso8601(record.timestamp)
        text += " \(record.level) \(record.label): \(record.message.escapedForTerminal)"
        for key in record.metadata.keys.sorted() {
            text += " \(key)=\(quoted(record.metadata[key] ?? ""))"
        }
        text += "\n"
        return text
    }

    static func quoted(_ value: String) -> String {
        let needsQuotes = value.isEmpty || value.unicodeScalars.contains { scalar in
            scalar == " " || scalar == "\"" || scalar == "=" || TerminalText.needsEscape(scalar)
        }
        guard needsQuotes else { return value }
        var result = "\""
        for scalar in value.unicodeScalars {
            if scalar == "\"" {
                result += "\\\""
            } else {
                TerminalText.append(scalar, to: &result)
            }
        }
        return result + "\""
    }
}

/// Keeps the newest records in memory, for tests and for showing recent history. Safe to use
/// from several threads.
///
/// At most ``limit`` records are kept: past it the oldest is forgotten (and counted in
/// ``droppedCount``), so a flood of messages (an accessory sending malformed messages by the
/// thousand while debug logging is on) cannot grow the process.
public final class InMemoryLogHandler: LogHandler {
    /// The records kept, as a ring once full: the oldest is at `next`.
    private struct Storage {
        var ring: [LogRecord] = []
        var next = 0
        var dropped = 0
    }
    private let storage = Mutex(Storage())

    /// Most records kept.
    public let limit: Int

    /// The number of records kept when none is given: enough for any test's whole run.
    public static let defaultLimit = 10_000

    /// Makes an empty handler that keeps the newest `limit` records (at least 1).
    public init(limit: Int = InMemoryLogHandler.defaultLimit) {
        self.limit = max(1, limit)
    }

    /// Stores the record, forgetting the oldest one when ``limit`` are kept.
    public func log(_ record: LogRecord) {
        let limit = self.limit
        storage.withLock { storage in
            guard storage.ring.count == limit else { return storage.ring.append(record) }
            storage.ring[storage.next] = record
            storage.next = (storage.next + 1) % limit
            storage.dropped += 1
        }
    }

    /// The records kept, oldest first.
    public var records: [LogRecord] {
        storage.withLock { Array($0.ring[$0.next...] + $0.ring[..<$0.next]) }
    }

    /// The messages of the records kept, oldest first.
    public var messages: [String] {
        records.map(\.message)
    }

    /// How many records were forgotten to keep within ``limit`` (since the last ``clear()``).
    public var droppedCount: Int {
        storage.withLock { $0.dropped }
    }

    /// Forgets every record.
    public func clear() {
        storage.withLock { $0 = Storage() }
    }
}

/// The real-time clock, as log timestamps use it.
public enum WallClock {
    /// The time since the Unix epoch (`clock_gettime(CLOCK_REALTIME)`).
    public static func now() -> Duration {
        var spec = timespec()
        guard clock_gettime(CLOCK_REALTIME, &spec) == 0 else { return .zero }
        return .seconds(Int64(spec.tv_sec)) + .nanoseconds(Int64(spec.tv_nsec))
    }

    /// Formats a time since the Unix epoch as UTC ISO-8601 with microseconds
    /// (`2026-11-30T05:20:11.123456Z`); sub-microsecond parts are truncated, and times before
    /// the epoch are rounded down to the earlier microsecond.
    public static func iso8601(_ sinceEpoch: Duration) -> String {
        var (seconds, attoseconds) = sinceEpoch.components
        if attoseconds < 0 {
            seconds -= 1
            attoseconds += 1_000_000_000_000_000_000
        }
        let microseconds = attoseconds / 1_000_000_000_000
        var time = time_t(seconds)
        var parts = tm()
        guard gmtime_r(&time, &parts) != nil else {
            return "\(seconds).\(padded(microseconds, width: 6))s"
        }
        return padded(Int64(parts.tm_year) + 1900, width: 4) + "-" + padded(Int64(parts.tm_mon) + 1, width: 2)
            + "-" + padded(Int64(parts.tm_mday), width: 2) + "T" + padded(Int64(parts.tm_hour), width: 2)
            + ":" + padded(Int64(parts.tm_min), width: 2) + ":" + padded(Int64(parts.tm_sec), width: 2)
            + "." + padded(microseconds, width: 6) + "Z"
    }

    /// Decimal digits of `value`, zero-padded on the left to `width` (sign first when negative).
    static func padded(_ value: Int64, width: Int) -> String {
        let digits = String(value.magnitude)
        let zeros = String(repeating: "0", count: max(0, width - digits.count))
        return (value < 0 ? "-" : "") + zeros + digits
    }
}

/// Writes each record as one line for the systemd journal: the priority as a `<N>` prefix
/// (sd-daemon(3): 7 debug … 2 critical), no timestamp (the journal adds its own), the message
/// escaped for a terminal, metadata as `key=value`. What a service logs on standard error when
/// it is not a terminal.
public struct JournalLogHandler: LogHandler {
    /// The descriptor the lines are written to.
    public let fileDescriptor: Int32

    /// Makes a handler writing to `fileDescriptor` (2, standard error, unless told otherwise).
    public init(fileDescriptor: Int32 = 2) {
        self.fileDescriptor = fileDescriptor
    }

    /// Writes the record's line; a failed write is ignored (there is nowhere to report it).
    public func log(_ record: LogRecord) {
        _ = FileDescriptorWriter.writeAll(Self.line(for: record), to: fileDescriptor)
    }

    /// The line written for `record`, newline included, e.g. `<4>iapd: message key=value`.
    public static func line(for record: LogRecord) -> String {
        var text = "<\(priority(record.level))>\(record.label): \(record.message.escapedForTerminal)"
        for key in record.metadata.keys.sorted() {
            text += " \(key)=\(StderrLogHandler.quoted(record.metadata[key] ?? ""))"
        }
        return text + "\n"
    }

    /// The syslog priority of a level.
    static func priority(_ level: LogLevel) -> Int {
        switch level {
        case .trace, .debug: return 7
        case .info: return 6
        case .notice: return 5
        case .warning: return 4
        case .error: return 3
        case .critical: return 2
        }
    }
}
