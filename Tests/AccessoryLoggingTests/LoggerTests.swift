import AccessoryLogging
import Glibc
import Testing

@Suite("Logger")
struct LoggerTests {
    @Test func levelsAreOrdered() {
        #expect(LogLevel.allCases == [.trace, .debug, .info, .notice, .warning, .error, .critical])
        for (lower, higher) in zip(LogLevel.allCases, LogLevel.allCases.dropFirst()) {
            #expect(lower < higher)
        }
    }

    @Test func levelParsing() {
        #expect(LogLevel("trace") == .trace)
        #expect(LogLevel("DEBUG") == .debug)
        #expect(LogLevel(" Info ") == .info)
        #expect(LogLevel("notice") == .notice)
        #expect(LogLevel("warn") == .warning)
        #expect(LogLevel("warning") == .warning)
        #expect(LogLevel("err") == .error)
        #expect(LogLevel("critical") == .critical)
        #expect(LogLevel("loud") == nil)
        #expect(LogLevel("") == nil)
        for level in LogLevel.allCases {
            #expect(LogLevel(level.description) == level)
        }
    }

    @Test func verbosityMapping() {
        #expect(Logger.verbosity(0) == .notice)
        #expect(Logger.verbosity(1) == .info)
        #expect(Logger.verbosity(2) == .debug)
        #expect(Logger.verbosity(3) == .trace)
        #expect(Logger.verbosity(7) == .trace)
        #expect(Logger.verbosity(-1) == .notice)
    }

    @Test("the in-memory handler keeps the newest records up to its limit and counts the rest")
    func inMemoryHandlerIsBounded() {
        let handler = InMemoryLogHandler(limit: 100)
        let logger = Logger(label: "flood", logLevel: .debug, handler: handler)
        for index in 0..<10_050 { logger.debug("malformed control message \(index)") }
        #expect(handler.records.count == 100)
        #expect(handler.messages.first == "malformed control message 9950")
        #expect(handler.messages.last == "malformed control message 10049")
        #expect(handler.droppedCount == 9_950)
        handler.clear()
        #expect(handler.records.isEmpty && handler.droppedCount == 0)
        logger.notice("after")
        #expect(handler.messages == ["after"])
        #expect(InMemoryLogHandler().limit == InMemoryLogHandler.defaultLimit)
    }

    @Test func filteredMessagesAreNotEvaluated() {
        let handler = InMemoryLogHandler()
        let logger = Logger(label: "test", logLevel: .warning, handler: handler)
        var evaluated: [String] = []
        func message(_ text: String) -> String {
            evaluated.append(text)
            return text
        }
        var metadataEvaluated = false
        func metadata() -> [String: String] {
            metadataEvaluated = true
            return ["k": "v"]
        }
        logger.trace(message("trace"), metadata: metadata())
        logger.debug(message("debug"), metadata: metadata())
        logger.info(message("info"), metadata: metadata())
        logger.notice(message("notice"), metadata: metadata())
        #expect(evaluated.isEmpty)
        #expect(!metadataEvaluated)
        #expect(handler.records.isEmpty)

        logger.warning(message("warning"))
        logger.error(message("error"))
        logger.critical(message("critical"))
        #expect(evaluated == ["warning", "error", "critical"])
        #expect(handler.messages == ["warning", "error", "critical"])
        #expect(handler.records.map(\.level) == [.warning, .error, .critical])
    }

    @Test func everyLevelAtTrace() {
        let handler = InMemoryLogHandler()
        let logger = Logger(label: "all", logLevel: .trace, handler: handler)
        logger.trace("1")
        logger.debug("2")
        logger.info("3")
        logger.notice("4")
        logger.warning("5")
        logger.error("6")
        logger.critical("7")
        logger.log(level: .info, "8")
        #expect(handler.records.map(\.level) == LogLevel.allCases + [.info])
        #expect(handler.messages == ["1", "2", "3", "4", "5", "6", "7", "8"])
        #expect(handler.records.allSatisfy { $0.label == "all" })
        handler.clear()
        #expect(handler.records.isEmpty)
    }

    @Test func metadataIsMergedAndCaptured() throws {
        let handler = InMemoryLogHandler()
        var logger = Logger(label: "iapctl", logLevel: .info, metadata: ["device": "001/004"], handler: handler)
        logger[metadataKey: "session"] = "7"
        #expect(logger[metadataKey: "session"] == "7")
        logger.info("opened", metadata: ["session": "8", "lingo": "general"])
        logger.notice("plain")
        let records = handler.records
        #expect(records.count == 2)
        let first = try #require(records.first)
        #expect(first.metadata == ["device": "001/004", "session": "8", "lingo": "general"])
        #expect(first.label == "iapctl")
        #expect(records.last?.metadata == ["device": "001/004", "session": "7"])
    }

    @Test func timestampsComeFromTheRealTimeClock() throws {
        let handler = InMemoryLogHandler()
        let logger = Logger(label: "t", handler: handler)
        var before = timespec()
        clock_gettime(CLOCK_REALTIME, &before)
        logger.notice("now")
        var after = timespec()
        clock_gettime(CLOCK_REALTIME, &after)
        let stamp = try #require(handler.records.first).timestamp
        #expect(stamp >= .seconds(Int64(before.tv_sec)) + .nanoseconds(Int64(before.tv_nsec)))
        #expect(stamp <= .seconds(Int64(after.tv_sec)) + .nanoseconds(Int64(after.tv_nsec)))
    }

    @Test func silentLoggerDropsEverything() {
        let logger = Logger.silent
        var evaluated = false
        logger.trace({ evaluated = true; return "x" }())
        #expect(evaluated, "the silent logger still builds messages")
        #expect(logger.logLevel == .trace)
    }

    @Test func inMemoryHandlerIsThreadSafe() async {
        let handler = InMemoryLogHandler()
        let logger = Logger(label: "threads", logLevel: .debug, handler: handler)
        await withTaskGroup(of: Void.self) { group in
            for task in 0..<8 {
                group.addTask {
                    for line in 0..<250 {
                        logger.debug("\(task)-\(line)")
                    }
                }
            }
        }
        let messages = handler.messages
        #expect(messages.count == 2000)
        #expect(Set(messages).count == 2000)
    }
}

@Suite("Log line format")
struct LogLineTests {
    @Test func iso8601OnFixedInstants() {
        #expect(WallClock.iso8601(.zero) == "1970-01-01T00:00:00.000000Z")
        // 2024-02-29 12:34:56 UTC (leap day) and a microsecond part, with nanoseconds truncated.
        #expect(WallClock.iso8601(.seconds(1_709_210_096) + .nanoseconds(123_456_789)) == "2024-02-29T12:34:56.123456Z")
        // 2000-12-31 23:59:59.999999 UTC: day 366 of a leap year divisible by 400.
        #expect(WallClock.iso8601(.seconds(978_307_199) + .microseconds(999_999)) == "2000-12-31T23:59:59.999999Z")
        #expect(WallClock.iso8601(.seconds(1_796_016_011) + .milliseconds(123)) == "2026-11-30T05:20:11.123000Z")
        // Before the epoch, rounding down to the earlier microsecond.
        #expect(WallClock.iso8601(.nanoseconds(-1)) == "1969-12-31T23:59:59.999999Z")
        #expect(WallClock.iso8601(.seconds(-86_400)) == "1969-12-31T00:00:00.000000Z")
    }

    @Test func lineFormat() {
        let record = LogRecord(
            level: .notice, label: "iapctl", message: "accessory attached",
            metadata: ["vid": "05ac", "name": "Dock Speaker", "empty": ""],
            timestamp: .seconds(1_796_016_011) + .microseconds(123_456)
        )
        #expect(
            StderrLogHandler.line(for: record)
                == "2026-11-30T05:20:11.123456Z notice iapctl: accessory attached empty=\"\" name=\"Dock Speaker\" vid=05ac\n"
        )
        let escaped = LogRecord(
            level: .warning, label: "x", message: "m", metadata: ["k": "a\"b\\c\nd"], timestamp: .zero
        )
        #expect(StderrLogHandler.line(for: escaped) == "1970-01-01T00:00:00.000000Z warning x: m k=\"a\\\"b\\\\c\\nd\"\n")
    }

    @Test func stderrHandlerWritesOneLinePerRecord() throws {
        var fds: [Int32] = [-1, -1]
        #expect(pipe(&fds) == 0)
        defer { close(fds[0]) }
        let logger = Logger(label: "pipe", logLevel: .info, handler: StderrLogHandler(fileDescriptor: fds[1]))
        logger.info("first", metadata: ["n": "1"])
        logger.debug("filtered")
        logger.error("second")
        close(fds[1])
        let text = readAll(fds[0])
        let lines = text.split(separator: "\n", omittingEmptySubsequences: false)
        #expect(lines.count == 3)
        #expect(lines.last == "")
        #expect(lines.first?.hasSuffix(" info pipe: first n=1") == true)
        #expect(lines.dropFirst().first?.hasSuffix(" error pipe: second") == true)
        #expect(lines.first?.count == "2026-11-30T05:20:11.123456Z info pipe: first n=1".count)
    }
}

/// Reads `fd` to its end.
func readAll(_ fd: Int32) -> String {
    var bytes: [UInt8] = []
    var buffer = [UInt8](repeating: 0, count: 4096)
    while true {
        let count = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
        if count < 0, errno == EINTR { continue }
        if count <= 0 { break }
        bytes += buffer[..<count]
    }
    return String(decoding: bytes, as: UTF8.self)
}

@Suite("Writing to file descriptors")
struct FileDescriptorWriterTests {
    @Test func writerWritesEverything() {
        var fds: [Int32] = [-1, -1]
        #expect(pipe(&fds) == 0)
        // More than PIPE_BUF (4 KiB), less than the 64 KiB pipe buffer, so the write cannot block.
        let text = String(repeating: "0123456789abcdef", count: 2048) + "é\n"
        #expect(FileDescriptorWriter.writeAll(text, to: fds[1]))
        #expect(FileDescriptorWriter.writeAll("", to: fds[1]))
        close(fds[1])
        #expect(readAll(fds[0]) == text)
        close(fds[0])
    }

    @Test func writeToABadDescriptorFailsWithoutTrapping() {
        #expect(!FileDescriptorWriter.writeAll("x", to: -1))
        let logger = Logger(label: "x", handler: StderrLogHandler(fileDescriptor: -1))
        logger.error("goes nowhere")
    }
}
