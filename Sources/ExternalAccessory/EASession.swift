public import AccessoryHost
internal import AccessoryLogging
internal import Dispatch
public import Foundation
internal import Synchronization

/// A session with an accessory for one protocol, as iOS's `EASession`: its ``inputStream``
/// and ``outputStream`` carry the protocol's bytes (no framing of the app's data; iAP's is done
/// underneath). Schedule the streams on a run loop, give them a delegate and open them, as on
/// iOS; the session stays open as long as this object lives (it closes when it goes away).
///
/// One session per protocol per accessory, machine-wide in one process: a second
/// `EASession` for the same protocol and accessory is nil while the first lives.
///
/// Thread safety: the initializer waits for the accessory to open the session (at most about
/// a minute; usually milliseconds), blocking the calling thread as iOS's does; call it from the
/// main thread or a thread of your own, not from a Swift task (use AccessoryHost's
/// `Accessory.openSession(for:)` there).
open class EASession: NSObject, @unchecked Sendable {
    /// The accessory the session is with.
    public let accessory: EAAccessory?
    /// The protocol the session speaks.
    public let protocolString: String?
    /// The AccessoryHost session underneath (Linux only): its counters
    /// (`AccessorySession.bytesAcknowledged`) and async API.
    public let session: AccessorySession
    private let core: SessionCore
    private let input: EAInputStream
    private let output: EAOutputStream

    /// The bytes the accessory sends: an `InputStream` that works with `StreamDelegate` and
    /// run loops. See ``EAInputStream``.
    public var inputStream: InputStream? { input }
    /// The bytes to send to the accessory: an `OutputStream` that works with `StreamDelegate`
    /// and run loops. See ``EAOutputStream``.
    public var outputStream: OutputStream? { output }

    /// Opens a session with `accessory` for `protocolString`; nil when it cannot be opened:
    /// the app does not declare the protocol (``EAAccessoryManager/declaredProtocols``), the
    /// accessory does not declare it, a session for it is open already, the accessory refused
    /// or is gone. The reason is said on the manager's logger (standard error by default), as
    /// iOS says it on the console.
    public init?(accessory: EAAccessory, forProtocol protocolString: String) {
        guard accessory.declaredProtocols.contains(protocolString) else {
            accessory.logger.warning("EASession: the app does not declare '\(protocolString)'; add it to its declared protocols (UISupportedExternalAccessoryProtocols, EA_SUPPORTED_PROTOCOLS or EAHostOptions.supportedProtocols)")
            return nil
        }
        let done = DispatchSemaphore(value: 0)
        let outcome = Mutex<Result<AccessorySession, AccessoryError>?>(nil)
        accessory.accessory.openSession(for: protocolString, queue: DispatchQueue(label: "ExternalAccessory.open")) { result in
            outcome.withLock { $0 = result }
            done.signal()
        }
        guard done.wait(timeout: .now() + .seconds(60)) == .success, let result = outcome.withLock({ $0 }) else {
            accessory.logger.warning("EASession: '\(protocolString)' on \(accessory.name): the accessory did not answer within a minute")
            return nil
        }
        let session: AccessorySession
        switch result {
        case let .success(opened):
            session = opened
        case let .failure(error):
            accessory.logger.warning("EASession: '\(protocolString)' on \(accessory.name): \(error)")
            return nil
        }
        self.accessory = accessory
        self.protocolString = protocolString
        self.session = session
        core = SessionCore(session: session)
        input = EAInputStream(core: core)
        output = EAOutputStream(core: core)
        super.init()
        core.start(input: input, output: output)
    }

    deinit {
        core.close()
    }
}

/// What an ``EASession``'s two streams share: the AccessoryHost session, whether it ended and
/// why, and a change count that blocking reads and writes wait on.
final class SessionCore: @unchecked Sendable {
    // Confinement: `state` behind its lock; `condition` guards `generation` for the waiters.
    private struct State {
        var ended = false
        var error: AccessoryError?
        weak var input: EAInputStream?
        weak var output: EAOutputStream?
    }

    let session: AccessorySession
    private let state = Locked(State())
    private let condition = NSCondition()
    private var generation: UInt64 = 0
    private let queue = DispatchQueue(label: "ExternalAccessory.session")

    init(session: AccessorySession) {
        self.session = session
    }

    /// Starts hearing the session's events, for the two streams.
    func start(input: EAInputStream, output: EAOutputStream) {
        state.withLock { state in
            state.input = input
            state.output = output
        }
        session.setEventHandler(queue: queue) { [weak self] event in self?.handle(event) }
    }

    /// Whether the session ended, and the error it ended with (nil: closed, or the accessory
    /// went away, which the streams report as their end).
    var end: (ended: Bool, error: AccessoryError?) { state.withLock { ($0.ended, $0.error) } }

    /// The change count now: pass it to ``waitForChange(after:)``.
    var changeCount: UInt64 {
        condition.lock()
        defer { condition.unlock() }
        return generation
    }

    /// Blocks until something happened on the session after `count` was read.
    func waitForChange(after count: UInt64) {
        condition.lock()
        while generation == count { condition.wait() }
        condition.unlock()
    }

    /// Closes the session; the streams end.
    func close() {
        session.close()
        ended(error: nil)
    }

    private func handle(_ event: SessionStreamEvent) {
        switch event {
        case let .errorOccurred(error):
            if case .disconnected = error { ended(error: nil) } else { ended(error: error) }
        case .endEncountered:
            ended(error: nil)
        case .openCompleted, .hasBytesAvailable, .hasSpaceAvailable:
            changed()
        }
    }

    private func ended(error: AccessoryError?) {
        state.withLock { state in
            if !state.ended {
                state.ended = true
                state.error = error
            }
        }
        changed()
    }

    private func changed() {
        condition.lock()
        generation &+= 1
        condition.broadcast()
        condition.unlock()
        let (input, output) = state.withLock { ($0.input, $0.output) }
        input?.pump.poke()
        output?.pump.poke()
    }
}
