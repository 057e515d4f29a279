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
    // Confinement: `state` behind its lock.
    private struct State {
        var status: Stream.Status = .notOpen
        var openPending = false
        var bytesSignaled = false
        var endSignaled = false
        var error: (any Error)?
    }

    private let core: SessionCore?
    private let state = Locked(State())
    /// Posts the delegate's events to the run loops the stream is scheduled on.
    let pump = RunLoopPump()

    init(core: SessionCore) {
        self.core = core
        super.init(data: Data())
        pump.fire = { [weak self] in self?.deliverEvents() }
    }

    /// A stream that no session feeds (Foundation's initializer): it fails when opened.
    public override init(data: Data) {
        core = nil
        super.init(data: data)
    }

    deinit { pump.removeAll() }

    /// Opens the stream: the delegate hears `openCompleted`, then what is readable.
    public override func open() {
        state.withLock { state in
            guard state.status == .notOpen else { return }
            if core == nil {
                state.status = .error
                state.error = EAStreamError.notFromASession
            } else {
                state.status = .open
                state.openPending = true
            }
        }
        pump.poke()
    }

    /// Closes the stream: no more events or bytes. The session stays open until the
    /// ``EASession`` goes away.
    public override func close() {
        state.withLock { $0.status = .closed }
        pump.removeAll()
    }

    /// Where the stream stands: `notOpen`, `open`, `atEnd` (ended and every byte read),
    /// `closed` or `error`.
    public override var streamStatus: Stream.Status { state.withLock { $0.status } }

    /// Why the stream failed (status `error`), else nil.
    public override var streamError: (any Error)? { state.withLock { $0.error } }

    /// Whether bytes are readable now.
    public override var hasBytesAvailable: Bool {
        guard let core, state.withLock({ $0.status == .open }) else { return false }
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
            let status = state.withLock { $0.status }
            guard status == .open || status == .atEnd else { return -1 }
            let seen = core.changeCount
            let copied = ReceivedBytes.copy(from: core.session, into: buffer, maxLength: len)
            if copied > 0 {
                state.withLock { $0.bytesSignaled = false }
                pump.poke()
                return copied
            }
            let end = core.end
            if end.ended {
                pump.poke()
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
        pump.schedule(in: aRunLoop, forMode: mode)
    }

    /// Stops posting events to `aRunLoop` in `mode`.
    public override func remove(from aRunLoop: RunLoop, forMode mode: RunLoop.Mode) {
        pump.remove(from: aRunLoop, forMode: mode)
    }

    /// On the run loop: what happened since the last time, to the delegate.
    private func deliverEvents() {
        guard let core else { return }
        var events: [Stream.Event] = []
        let open = state.withLock { state -> Bool in
            if state.openPending, state.status == .open {
                state.openPending = false
                events.append(.openCompleted)
            }
            return state.status == .open
        }
        if open {
            let readable = core.session.hasBytesAvailable
            let end = core.end
            state.withLock { state in
                if readable {
                    if !state.bytesSignaled {
                        state.bytesSignaled = true
                        events.append(.hasBytesAvailable)
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
        }
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
    // Confinement: `state` behind its lock.
    private struct State {
        var status: Stream.Status = .notOpen
        var openPending = false
        var spaceSignaled = false
        var endSignaled = false
        var error: (any Error)?
    }

    private let core: SessionCore?
    private let state = Locked(State())
    /// Posts the delegate's events to the run loops the stream is scheduled on.
    let pump = RunLoopPump()

    init(core: SessionCore) {
        self.core = core
        super.init(toMemory: ())
        pump.fire = { [weak self] in self?.deliverEvents() }
    }

    /// A stream that no session feeds (Foundation's `toMemory()`): it fails when opened.
    public required init(toMemory: ()) {
        core = nil
        super.init(toMemory: ())
    }

    deinit { pump.removeAll() }

    /// Opens the stream: the delegate hears `openCompleted`, then `hasSpaceAvailable`.
    public override func open() {
        state.withLock { state in
            guard state.status == .notOpen else { return }
            if core == nil {
                state.status = .error
                state.error = EAStreamError.notFromASession
            } else {
                state.status = .open
                state.openPending = true
            }
        }
        pump.poke()
    }

    /// Closes the stream: no more events; bytes written before stay on their way. The session
    /// stays open until the ``EASession`` goes away.
    public override func close() {
        state.withLock { $0.status = .closed }
        pump.removeAll()
    }

    /// Where the stream stands: `notOpen`, `open`, `atEnd` (the session ended), `closed` or
    /// `error`.
    public override var streamStatus: Stream.Status { state.withLock { $0.status } }

    /// Why the stream failed (status `error`), else nil.
    public override var streamError: (any Error)? { state.withLock { $0.error } }

    /// Whether a write would take bytes now.
    public override var hasSpaceAvailable: Bool {
        guard let core, state.withLock({ $0.status == .open }), !core.end.ended else { return false }
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
            guard state.withLock({ $0.status == .open }) else { return -1 }
            let seen = core.changeCount
            let taken: Int
            do {
                taken = try core.session.writeAvailable(UnsafeBufferPointer(start: buffer, count: len))
            } catch {
                // The session ended (or is closing): the end event, with the status it sets,
                // follows from the session's own report of it.
                pump.poke()
                return -1
            }
            if taken > 0 {
                state.withLock { $0.spaceSignaled = false }
                pump.poke()
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
        pump.schedule(in: aRunLoop, forMode: mode)
    }

    /// Stops posting events to `aRunLoop` in `mode`.
    public override func remove(from aRunLoop: RunLoop, forMode mode: RunLoop.Mode) {
        pump.remove(from: aRunLoop, forMode: mode)
    }

    /// On the run loop: what happened since the last time, to the delegate.
    private func deliverEvents() {
        guard let core else { return }
        var events: [Stream.Event] = []
        let open = state.withLock { state -> Bool in
            if state.openPending, state.status == .open {
                state.openPending = false
                events.append(.openCompleted)
            }
            return state.status == .open
        }
        if open {
            let end = core.end
            let space = !end.ended && core.session.hasSpaceAvailable
            state.withLock { state in
                if end.ended {
                    guard !state.endSignaled else { return }
                    state.endSignaled = true
                    if let error = end.error {
                        state.status = .error
                        state.error = error
                        events.append(.errorOccurred)
                    } else {
                        state.status = .atEnd
                        events.append(.endEncountered)
                    }
                } else if space, !state.spaceSignaled {
                    state.spaceSignaled = true
                    events.append(.hasSpaceAvailable)
                }
            }
        }
        for event in events { delegate?.stream(self, handle: event) }
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
