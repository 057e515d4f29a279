package import AccessoryLogging
internal import Dispatch
internal import Glibc
internal import IAPDaemonProtocol
internal import Synchronization
internal import SystemCalls

/// Writes iapd's statistics (``DaemonServer/statistics(_:)``) for Prometheus through
/// node_exporter's textfile collector: `iapd.prom` in a directory node_exporter reads
/// (`--collector.textfile.directory`; Debian's prometheus-node-exporter reads
/// ``debianTextfileDirectory``), replaced every ``Options/interval``.
///
/// Each write reads the statistics on the manager's queue (counters in memory, no I/O), then
/// renders (``PrometheusText``) and writes on a queue of its own, so a slow or failing disk never
/// holds up clients or accessories. The file is replaced atomically: the text goes to a hidden
/// temporary file in the same directory (`.iapd.prom.tmp`, a name the collector skips), which is
/// then renamed over `iapd.prom`; a reader sees the old file or the new one, never a part. Not
/// synced: after a crash the next write replaces whatever is there.
///
/// A write that fails (no such directory, not writable, disk full) is logged once, with what to
/// do, and tried again at the next interval; once one succeeds again that is logged too. A tick
/// that finds the last write still going does nothing. ``stop()`` removes the file, so a stopped
/// iapd does not leave figures behind that look current (node_exporter's
/// `node_textfile_mtime_seconds` tells the age of a file that stays).
///
/// Thread safety: the methods may be called from any thread.
package final class MetricsExporter: Sendable {
    /// Where and how often.
    package struct Options: Sendable {
        /// The directory node_exporter's textfile collector reads.
        package var directory: String
        /// The file's name in it (it must end in `.prom` for the collector to read it).
        package var fileName: String = "iapd.prom"
        /// How often the file is replaced (at least 10 ms).
        package var interval: Duration

        /// Options writing `iapd.prom` in `directory` every `interval` (5 s by default).
        package init(directory: String, interval: Duration = .seconds(5)) {
            self.directory = directory
            self.interval = interval
        }
    }

    /// The directory Debian's prometheus-node-exporter package reads `.prom` files from.
    package static let debianTextfileDirectory = "/var/lib/prometheus/node-exporter"

    /// Where and how often.
    package let options: Options
    private let server: DaemonServer
    private let logger: Logger
    private let queue = DispatchQueue(label: "iapd.metrics", qos: .utility)
    private let timer: RepeatingTimer
    private let state = Mutex(State())

    private struct State {
        var stopped = false
        /// Writes asked for and not done yet.
        var pending = 0
        var written = 0
        /// The last failure logged (nil after a success): each distinct one is logged once.
        var lastFailure: String?
    }

    /// An exporter of `server`'s statistics; it writes nothing until ``start()`` or ``writeNow(completion:)``.
    package init(server: DaemonServer, options: Options, logger: Logger) {
        self.server = server
        self.options = options
        self.logger = logger
        timer = RepeatingTimer(queue: queue)
    }

    /// The file written: ``Options/directory`` and ``Options/fileName``.
    package var path: String { Self.join(options.directory, options.fileName) }

    /// How many writes succeeded so far.
    package var writeCount: Int { state.withLock { $0.written } }

    /// Writes now and then every ``Options/interval`` (once; later calls do nothing).
    package func start() {
        timer.start(every: max(options.interval, .milliseconds(10))) { [weak self] in
            guard let self, state.withLock({ $0.pending == 0 }) else { return }
            writeNow()
        }
    }

    /// Stops writing for good and removes the file (a write under way finishes first). Not from
    /// a completion of ``writeNow(completion:)``: it waits for the queue those run on.
    package func stop() {
        timer.stop()
        state.withLock { $0.stopped = true }
        let path = self.path
        queue.sync { _ = unlink(path) }
    }

    /// Reads the statistics and writes the file now, then calls `completion` (on the exporter's
    /// queue) with the outcome; failures are logged as the periodic writes' are. After
    /// ``stop()`` nothing is written and the outcome is a failure of kind ``MetricsWriteError/Kind/stopped``.
    package func writeNow(completion: (@Sendable (Result<Void, MetricsWriteError>) -> Void)? = nil) {
        state.withLock { $0.pending += 1 }
        let queue = self.queue
        server.statistics { statistics in
            queue.async {
                let result = self.replaceFile(PrometheusText.render(statistics))
                self.state.withLock { $0.pending -= 1 }
                completion?(result)
            }
        }
    }

    /// ``writeNow(completion:)`` for a Swift task: suspends until the file is written (no thread waits).
    package func write() async -> Result<Void, MetricsWriteError> {
        await withCheckedContinuation { continuation in writeNow { continuation.resume(returning: $0) } }
    }

    /// On the queue: the file replaced, and the outcome logged when it changed.
    private func replaceFile(_ text: String) -> Result<Void, MetricsWriteError> {
        guard !state.withLock({ $0.stopped }) else { return .failure(MetricsWriteError(kind: .stopped, path: path, detail: "the exporter was stopped")) }
        let result = Self.replace(fileName: options.fileName, in: options.directory, with: text)
        let (logNew, recovered) = state.withLock { state -> (String?, Bool) in
            switch result {
            case .success:
                state.written += 1
                defer { state.lastFailure = nil }
                return (nil, state.lastFailure != nil)
            case let .failure(error):
                let text = error.description
                defer { state.lastFailure = text }
                return (state.lastFailure == text ? nil : text, false)
            }
        }
        if let logNew {
            logger.error("metrics: \(logNew); tried again every \(options.interval)")
        } else if case let .failure(error) = result {
            logger.debug("metrics: \(error)")
        }
        if recovered { logger.notice("metrics: \(path) written again") }
        return result
    }

    /// Replaces `fileName` in `directory` with `text` atomically: the text is written to the
    /// hidden `.NAME.tmp` beside it (mode 0644, so node_exporter's user reads it), which is
    /// then renamed over the file. On a failure the temporary file is removed and the old file,
    /// if any, is left as it was.
    package static func replace(fileName: String, in directory: String, with text: String) -> Result<Void, MetricsWriteError> {
        let path = join(directory, fileName)
        let temporary = join(directory, "." + fileName + ".tmp")
        let descriptor: Int32
        switch SystemCall.open(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, mode: 0o644) {
        case .success(let opened): descriptor = opened
        case .failure(let error): return .failure(MetricsWriteError(error, path: path, directory: directory))
        }
        _ = fchmod(descriptor, 0o644) // whatever the umask
        var bytes = Array(text.utf8)
        let written = bytes.withUnsafeMutableBytes { SystemCall.writeAll(descriptor, UnsafeRawBufferPointer($0)) }
        _ = close(descriptor)
        if case let .failure(error) = written {
            _ = unlink(temporary)
            return .failure(MetricsWriteError(error, path: path, directory: directory))
        }
        guard rename(temporary, path) == 0 else {
            let error = SystemError.last
            _ = unlink(temporary)
            return .failure(MetricsWriteError(error, path: path, directory: directory))
        }
        return .success(())
    }

    private static func join(_ directory: String, _ name: String) -> String {
        directory.hasSuffix("/") ? directory + name : directory + "/" + name
    }
}

/// Why the metrics file could not be written, with what to do about it.
package struct MetricsWriteError: Error, Sendable, Hashable, CustomStringConvertible {
    /// What kind of problem.
    package enum Kind: Sendable, Hashable {
        /// The directory does not exist (or a part of its path is not a directory).
        case noDirectory
        /// iapd may not write in the directory (or the file system is read-only).
        case permission
        /// Anything else (the disk is full…).
        case failed
        /// The exporter was stopped.
        case stopped
    }

    /// What kind of problem.
    package var kind: Kind
    /// The file that was to be written.
    package var path: String
    /// The problem in a sentence, with what to do.
    package var detail: String

    /// A failure of `kind` writing `path`.
    package init(kind: Kind, path: String, detail: String) {
        self.kind = kind
        self.path = path
        self.detail = detail
    }

    init(_ error: SystemError, path: String, directory: String) {
        self.path = path
        switch error.code {
        case ENOENT, ENOTDIR:
            kind = .noDirectory
            detail = "cannot write \(path): \(error): create the directory (`sudo mkdir -p \(directory)`; Debian's prometheus-node-exporter "
                + "reads \(MetricsExporter.debianTextfileDirectory)) or give --metrics-dir another"
        case EROFS:
            kind = .permission
            detail = "cannot write \(path): \(error): under systemd, iapd.service's ProtectSystem=strict makes the file system read-only for iapd "
                + "but for /var/lib/prometheus/node-exporter (when it was there as iapd started); allow this directory with "
                + "`sudo systemctl edit iapd` ([Service] ReadWritePaths=\(directory)), then restart iapd"
        case EACCES, EPERM:
            kind = .permission
            detail = "cannot write \(path): \(error): let iapd's user write in \(directory) (iapd runs as root under systemd), or give --metrics-dir another directory"
        default:
            kind = .failed
            detail = "cannot write \(path): \(error)"
        }
    }

    /// The detail.
    package var description: String { detail }
}
