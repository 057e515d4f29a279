public import Foundation
internal import AccessoryHost

/// The bytes an accessory sends on an ``EASession``: a Foundation `InputStream`.
///
/// Use it as on iOS: set a `StreamDelegate`, `schedule(in:forMode:)` on a run loop, `open()`;
/// the delegate hears `openCompleted`, then `hasBytesAvailable` whenever bytes are readable and
/// it has read since the last one (a handler that reads only part hears it again), then
/// `endEncountered` once the session ended (closed, or the accessory went away) and every
/// byte was read, or `errorOccurred` for another failure (``streamError`` says which).
/// `read(_:maxLength:)` copies from where the bytes were received (the one copy of the way in);
/// with nothing readable it waits for bytes or the end, as a socket stream does.
///
/// Thread safety: read and the delegate on one thread (the run loop's), as on iOS; the events
/// come from any thread and are posted to the run loop.
public final class EAInputStream: InputStream {
    private let core: SessionCore?
    /// Status, the events owed and the run loops.
    let lifecycle: StreamLifecycle

    init(core: SessionCore) {
        self.core = core
        lifecycle = StreamLifecycle(fedBySession: true)
        super.init(data: Data())
        lifecycle.pump.fire = { [weak self] in self?.deliverEvents() }
    }

    /// A stream that no session feeds (Foundation's initializer): it fails when opened.
    public override init(data: Data) {
        core = nil
        lifecycle = StreamLifecycle(fedBySession: false)
        super.init(data: data)
    }

    deinit { lifecycle.pump.removeAll() }

    /// Opens the stream: the delegate hears `openCompleted`, then what is readable.
    public override func open() { lifecycle.open() }

    /// Closes the stream: no more events or bytes. The session stays open until the
    /// ``EASession`` goes away.
    public override func close() { lifecycle.close() }

    /// Where the stream stands: `notOpen`, `open`, `atEnd` (ended and every byte read),
    /// `closed` or `error`.
    public override var streamStatus: Stream.Status { lifecycle.status }

    /// Why the stream failed (status `error`), else nil.
    public override var streamError: (any Error)? { lifecycle.error }

    /// Whether bytes are readable now.
    public override var hasBytesAvailable: Bool {
        guard let core, lifecycle.status == .open else { return false }
        return core.session.hasBytesAvailable
    }

    /// Copies up to `len` received bytes into `buffer`; waits for some when none are readable.
    ///
    /// - Returns: the count copied; 0 at the end of the stream; -1 when the stream is not open
    ///   or failed (``streamError``).
    public override func read(_ buffer: UnsafeMutablePointer<UInt8>, maxLength len: Int) -> Int {
        guard len > 0 else { return 0 }
        guard let core else { return -1 }
        while true {
            let status = lifecycle.status
            guard status == .open || status == .atEnd else { return -1 }
            let seen = core.changeCount
            let copied = ReceivedBytes.copy(from: core.session, into: buffer, maxLength: len)
            if copied > 0 {
                lifecycle.levelTaken()
                return copied
            }
            let end = core.end
            if end.ended {
                lifecycle.pump.poke()
                return end.error == nil ? 0 : -1
            }
            core.waitForChange(after: seen)
        }
    }

    /// Not offered: the bytes are lent only inside a read.
    public override func getBuffer(_ buffer: UnsafeMutablePointer<UnsafeMutablePointer<UInt8>?>,
                                   length len: UnsafeMutablePointer<Int>) -> Bool { false }

    /// No properties: nil.
    public override func property(forKey key: Stream.PropertyKey) -> AnyObject? { nil }

    /// No properties: false.
    public override func setProperty(_ property: AnyObject?, forKey key: Stream.PropertyKey) -> Bool { false }

    /// Posts the delegate's events to `aRunLoop` in `mode` (and keeps that run loop running).
    public override func schedule(in aRunLoop: RunLoop, forMode mode: RunLoop.Mode) {
        lifecycle.pump.schedule(in: aRunLoop, forMode: mode)
    }

    /// Stops posting events to `aRunLoop` in `mode`.
    public override func remove(from aRunLoop: RunLoop, forMode mode: RunLoop.Mode) {
        lifecycle.pump.remove(from: aRunLoop, forMode: mode)
    }

    /// On the run loop: what happened since the last time, to the delegate. Bytes still
    /// readable come before the end.
    private func deliverEvents() {
        guard let core else { return }
        let events = lifecycle.owedEvents(level: .hasBytesAvailable) { (core.session.hasBytesAvailable, core.end) }
        for event in events { delegate?.stream(self, handle: event) }
    }
}

/// The bytes to send on an ``EASession``: a Foundation `OutputStream`.
///
/// Use it as on iOS: set a `StreamDelegate`, `schedule(in:forMode:)`, `open()`; the delegate
/// hears `openCompleted`, `hasSpaceAvailable` whenever a write would take bytes and it has
/// written since the last one, and `endEncountered` (the session was closed or the accessory
/// went away) or `errorOccurred`. `write(_:maxLength:)` takes what fits now (the session's
/// buffer is 1 MiB by default: the back-pressure of a slow accessory); with no room at all it
/// waits for some, as a socket stream does.
///
/// Thread safety: write and the delegate on one thread (the run loop's), as on iOS.
public final class EAOutputStream: OutputStream {
    private let core: SessionCore?
    /// Status, the events owed and the run loops.
    let lifecycle: StreamLifecycle

    init(core: SessionCore) {
        self.core = core
        lifecycle = StreamLifecycle(fedBySession: true)
        super.init(toMemory: ())
        lifecycle.pump.fire = { [weak self] in self?.deliverEvents() }
    }

    /// A stream that no session feeds (Foundation's `toMemory()`): it fails when opened.
    public required init(toMemory: ()) {
        core = nil
        lifecycle = StreamLifecycle(fedBySession: false)
        super.init(toMemory: ())
    }

    deinit { lifecycle.pump.removeAll() }

    /// Opens the stream: the delegate hears `openCompleted`, then `hasSpaceAvailable`.
    public override func open() { lifecycle.open() }

    /// Closes the stream: no more events; bytes written before stay on their way. The session
    /// stays open until the ``EASession`` goes away.
    public override func close() { lifecycle.close() }

    /// Where the stream stands: `notOpen`, `open`, `atEnd` (the session ended), `closed` or
    /// `error`.
    public override var streamStatus: Stream.Status { lifecycle.status }

    /// Why the stream failed (status `error`), else nil.
    public override var streamError: (any Error)? { lifecycle.error }

    /// Whether a write would take bytes now.
    public override var hasSpaceAvailable: Bool {
        guard let core, lifecycle.status == .open, !core.end.ended else { return false }
        return core.session.hasSpaceAvailable
    }

    /// Takes what fits of `len` bytes at `buffer`; waits for room when there is none.
    ///
    /// - Returns: the count taken (at least 1 when `len` > 0); -1 when the stream is not open
    ///   or the session ended (``streamError``, or status `atEnd`).
    public override func write(_ buffer: UnsafePointer<UInt8>, maxLength len: Int) -> Int {
        guard len > 0 else { return 0 }
        guard let core else { return -1 }
        while true {
            guard lifecycle.status == .open else { return -1 }
            let seen = core.changeCount
            let taken: Int
            do {
                taken = try core.session.writeAvailable(UnsafeBufferPointer(start: buffer, count: len))
            } catch {
                // The session ended (or is closing): the end event, with the status it sets,
                // follows from the session's own report of it.
                lifecycle.pump.poke()
                return -1
            }
            if taken > 0 {
                lifecycle.levelTaken()
                return taken
            }
            if core.end.ended { return -1 }
            core.waitForChange(after: seen)
        }
    }

    /// No properties: nil.
    public override func property(forKey key: Stream.PropertyKey) -> AnyObject? { nil }

    /// No properties: false.
    public override func setProperty(_ property: AnyObject?, forKey key: Stream.PropertyKey) -> Bool { false }

    /// Posts the delegate's events to `aRunLoop` in `mode` (and keeps that run loop running).
    public override func schedule(in aRunLoop: RunLoop, forMode mode: RunLoop.Mode) {
        lifecycle.pump.schedule(in: aRunLoop, forMode: mode)
    }

    /// Stops posting events to `aRunLoop` in `mode`.
    public override func remove(from aRunLoop: RunLoop, forMode mode: RunLoop.Mode) {
        lifecycle.pump.remove(from: aRunLoop, forMode: mode)
    }

    /// On the run loop: what happened since the last time, to the delegate. Once the session
    /// ended there is no space to announce, only the end.
    private func deliverEvents() {
        guard let core else { return }
        let events = lifecycle.owedEvents(level: .hasSpaceAvailable) {
            let end = core.end
            return (!end.ended && core.session.hasSpaceAvailable, end)
        }
        for event in events { delegate?.stream(self, handle: event) }
    }
}

/// What an ``EASession``'s two streams share in how they behave: their status, the events
/// they owe their delegate (`openCompleted` once, a level event again only after the
/// delegate read or wrote, the end once), and the run loops they post to.
final class StreamLifecycle {
    // Confinement: `state` behind its lock.
    private struct State {
        var status: Stream.Status = .notOpen
        var openPending = false
        var levelSignaled = false
        var endSignaled = false
        var error: (any Error)?
    }

    private let state = Locked(State())
    private let fedBySession: Bool
    /// Posts the delegate's events to the run loops the stream is scheduled on.
    let pump = RunLoopPump()

    init(fedBySession: Bool) { self.fedBySession = fedBySession }

    var status: Stream.Status { state.withLock { $0.status } }
    var error: (any Error)? { state.withLock { $0.error } }

    func open() {
        state.withLock { state in
            guard state.status == .notOpen else { return }
            if fedBySession {
                state.status = .open
                state.openPending = true
            } else {
                state.status = .error
                state.error = EAStreamError.notFromASession
            }
        }
        pump.poke()
    }

    func close() {
        state.withLock { $0.status = .closed }
        pump.removeAll()
    }

    /// The delegate read (or wrote): the level event may be owed again.
    func levelTaken() {
        state.withLock { $0.levelSignaled = false }
        pump.poke()
    }

    /// The events owed now, in order: `openCompleted` once; then `level` when `now()` says it
    /// holds and it was not announced since the delegate last acted, else the end (once) when
    /// the session ended. `now` runs only while the stream is open.
    func owedEvents(level: Stream.Event, now: () -> (holds: Bool, end: (ended: Bool, error: AccessoryError?))) -> [Stream.Event] {
        var events: [Stream.Event] = []
        let open = state.withLock { state -> Bool in
            if state.openPending, state.status == .open {
                state.openPending = false
                events.append(.openCompleted)
            }
            return state.status == .open
        }
        guard open else { return events }
        let (holds, end) = now()
        state.withLock { state in
            if holds {
                if !state.levelSignaled {
                    state.levelSignaled = true
                    events.append(level)
                }
            } else if end.ended, !state.endSignaled {
                state.endSignaled = true
                if let error = end.error {
                    state.status = .error
                    state.error = error
                    events.append(.errorOccurred)
                } else {
                    state.status = .atEnd
                    events.append(.endEncountered)
                }
            }
        }
        return events
    }
}

/// Why a stream failed that no session feeds.
public enum EAStreamError: Error, CustomStringConvertible, Sendable {
    /// The stream was made with Foundation's initializer, not by an ``EASession``.
    case notFromASession

    /// What happened and what to do.
    public var description: String {
        "this stream was not made by an EASession: take the session's inputStream and outputStream"
    }
}

/// The one copy of the way in: received bytes, lent in place by the session, copied into the
/// caller's buffer. The only unsafe pointer of the module besides the stream signatures.
enum ReceivedBytes {
    static func copy(from session: AccessorySession, into buffer: UnsafeMutablePointer<UInt8>, maxLength: Int) -> Int {
        session.withNextChunk { span in
            let count = min(span.byteCount, maxLength)
            span.withUnsafeBytes { bytes in
                UnsafeMutableRawBufferPointer(start: buffer, count: count).copyMemory(from: UnsafeRawBufferPointer(rebasing: bytes[0..<count]))
            }
            return (count, count)
        } ?? 0
    }
}
