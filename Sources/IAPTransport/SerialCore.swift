internal import Dispatch
internal import Glibc
internal import IAPLink
internal import SystemCalls
internal import Synchronization

// MARK: - Core

/// The shared part of a ``SerialTransport``: state behind a lock, what the poller waits for,
/// and the read pass. The user's handler is never called with the lock held, so it may call back into
/// the transport.
final class SerialCore: Sendable {
    /// Bytes read per `read(2)` at most.
    static let readBufferSize = 64 * 1024

    let name: String
    private let state: Mutex<State>

    init(descriptor: Int32, ownsDescriptor: Bool, name: String) {
        self.name = name
        self.state = Mutex(State(descriptor: descriptor, ownsDescriptor: ownsDescriptor))
    }

    var pendingOutputBytes: Int {
        state.withLock { $0.waitingBytes }
    }

    var outputProgress: TransportOutputProgress {
        state.withLock { TransportOutputProgress(queuedBytes: $0.waitingBytes, writtenBytes: $0.written) }
    }

    func activate(queue: DispatchQueue, handler: @escaping @Sendable (TransportEvent) -> Void) {
        enum Outcome { case ignored, alreadyClosed(TransportError?), finish, watch }
        let outcome = state.withLock { state -> Outcome in
            guard !state.activated else { return .ignored }
            state.activated = true
            guard state.phase == .idle else { return .alreadyClosed(state.deliverClose ? state.closeReason : nil) }
            state.phase = .active
            state.queue = queue
            state.handler = handler
            guard SerialPoller.shared.isAvailable else {
                let code = SerialPoller.shared.setupError
                state.close(reason: TransportError(
                    "cannot watch \(name): \(SystemError(code).description)",
                    errno: code,
                    advice: "too many open files; close some (or raise ulimit -n) and open the port again"
                ), deliver: true)
                // Nothing watches the descriptor, so nothing else finishes the close.
                return .finish
            }
            state.readInterest = true
            state.readBuffer = [UInt8](repeating: 0, count: Self.readBufferSize)
            if state.waitingBytes > 0 {
                state.flushOutput(name: name)
            }
            return .watch
        }
        switch outcome {
        case .ignored:
            return
        case let .alreadyClosed(reason):
            queue.async { handler(.closed(reason)) }
        case .finish:
            finish()
        case .watch:
            // Watched by the one poller thread every serial transport shares.
            SerialPoller.shared.add(self)
        }
    }

    func send(_ frame: [UInt8]) {
        send(frame, ahead: false)
    }

    /// Sends `frame`; with `ahead`, before the frames already waiting (after the one being
    /// written, which is never split): see ``SerialTransport/sendAhead(_:)``.
    func send(_ frame: [UInt8], ahead: Bool) {
        guard !frame.isEmpty else { return }
        state.withLock { state in
            switch state.phase {
            case .closed:
                return
            case .idle:
                // Nothing is written before activation; what waits is bounded all the same.
                let waiting = state.waitingBytes
                guard waiting + frame.count <= SerialTransport.outputLimit else {
                    state.close(reason: SerialTransport.unactivatedError(name: name, waiting: waiting + frame.count), deliver: true)
                    return
                }
                state.queue(frame)
                return
            case .active:
                break
            }
            let waiting = state.waitingBytes
            guard waiting == 0 else {
                // Earlier output is still waiting; the watcher writes this after it (or, ahead,
                // at the next frame boundary), unless the peer has stopped reading for so long
                // that the backlog passed the bound.
                guard waiting + frame.count <= SerialTransport.outputLimit else {
                    state.close(reason: SerialTransport.stalledError(name: name, waiting: waiting), deliver: true)
                    return
                }
                if ahead, !state.barrierQueued {
                    state.urgent.append(contentsOf: frame)
                    state.flushOutput(name: name) // at a boundary it goes now
                } else {
                    state.queue(frame)
                }
                return
            }
            let descriptor = state.descriptor, isSocket = state.isSocket
            let result = frame.withUnsafeBytes { writeAvailableBytes(descriptor, $0, socket: isSocket) }
            state.written &+= UInt64(result.written)
            if let code = result.errorCode {
                state.close(reason: SerialTransport.writeError(name: name, errno: code), deliver: true)
            } else if result.written < frame.count {
                state.output.append(contentsOf: frame[result.written...])
                state.frameEnds.append(state.output.count)
                // Once the frame's start went out, its rest is no boundary to go ahead of.
                state.boundary = result.written > 0 ? -1 : 0
                if !LinkFrame.isDataPacket(frame) { state.barrierEnd = state.output.count }
                // The watcher now needs to watch for writability too.
                state.wake()
            }
        }
    }

    func close(reason: TransportError?, deliver: Bool) {
        state.withLock { $0.close(reason: reason, deliver: deliver) }
    }

    func setReading(_ reading: Bool) {
        let readPass = state.withLock { state -> DispatchQueue? in
            guard state.readingPaused == reading else { return nil }
            state.readingPaused = !reading
            guard reading, state.phase == .active else { return nil }
            // A hang-up seen while stopped is no longer polled for: a read pass finds it now.
            if state.hangUpSeen, state.readInterest {
                state.readInterest = false
                return state.queue
            }
            // Otherwise the poller watches for input again.
            state.wake()
            return nil
        }
        readPass?.async { [self] in readAvailable() }
    }

    // MARK: Watched by the poller

    /// What the poller should wait for now: readable unless a read pass is under way, writable
    /// while output is pending. Nil once the transport closed (the poller then drops it and
    /// calls ``finish()``).
    func pollPlan() -> pollfd? {
        state.withLock { state -> pollfd? in
            guard state.phase == .active else { return nil }
            var events: Int16 = 0
            if state.readInterest, !state.readingPaused { events |= Int16(POLLIN) }
            if state.waitingBytes > 0 { events |= Int16(POLLOUT) }
            // After a hang-up poll(2) reports POLLHUP whatever was asked: ignore the
            // descriptor until the read pass under way sees the hang-up and closes.
            let watched = events != 0 && !state.hangUpSeen
            return pollfd(fd: watched ? state.descriptor : -1, events: events, revents: 0)
        }
    }

    /// The poller could not wait at all: close with why.
    func pollFailed(_ error: SystemError) {
        state.withLock { state in
            state.close(reason: TransportError("cannot watch \(name): \(error)", errno: error.code, advice: "open the port again"),
                        deliver: true)
        }
    }

    func handle(_ revents: Int32) {
        let readPass = state.withLock { state -> DispatchQueue? in
            guard state.phase == .active else { return nil }
            if revents & POLLNVAL != 0 {
                state.close(reason: TransportError(
                    "the descriptor of \(name) was closed behind the transport's back",
                    advice: "do not close a descriptor a transport owns; open the port again"
                ), deliver: true)
                return nil
            }
            if revents & POLLOUT != 0 {
                state.flushOutput(name: name)
            }
            guard state.phase == .active else { return nil }
            if revents & (POLLHUP | POLLERR) != 0 {
                state.hangUpSeen = true
            }
            guard revents & (POLLIN | POLLHUP | POLLERR) != 0, state.readInterest, !state.readingPaused else { return nil }
            state.readInterest = false
            return state.queue
        }
        readPass?.async { [self] in readAvailable() }
    }

    /// Closes the descriptor once the poller stopped polling it, then delivers the close.
    func finish() {
        let (queue, handler, reason) = state.withLock { state in
            state.releaseDescriptors()
            defer { state.handler = nil }
            return (state.queue, state.deliverClose ? state.handler : nil, state.closeReason)
        }
        guard let queue, let handler else { return }
        queue.async { handler(.closed(reason)) }
    }

    // MARK: Read pass (on the activation queue)

    private enum ReadStep {
        case delivered
        case stop
    }

    /// Reads until the kernel has nothing more (`EAGAIN`), delivering each read, then asks the
    /// watcher to wait for the next bytes.
    private func readAvailable() {
        while true {
            // Read under the lock, deliver outside it.
            let (step, bytes, handler) = state.withLock { state -> (ReadStep, [UInt8], (@Sendable (TransportEvent) -> Void)?) in
                guard state.phase == .active else { return (.stop, [], nil) }
                guard !state.readingPaused else {
                    // Stopped by setReading(false): the poller waits for input again once resumed.
                    state.readInterest = true
                    return (.stop, [], nil)
                }
                let descriptor = state.descriptor
                let result = state.readBuffer.withUnsafeMutableBytes { SystemCall.read(descriptor, into: $0) }
                if case .success(let count) = result, count > 0 {
                    return (.delivered, Array(state.readBuffer[..<count]), state.handler)
                }
                let code: Int32? = if case .failure(let error) = result { error.code } else { nil }
                switch code {
                case EAGAIN?, EWOULDBLOCK?:
                    if state.hangUpSeen {
                        // poll(2) said hang-up or error, yet there is nothing to read: the
                        // line will not recover.
                        state.close(reason: SerialTransport.hangUpError(name: name, errno: nil), deliver: true)
                    } else {
                        state.readInterest = true
                        state.wake()
                    }
                    return (.stop, [], nil)
                case nil, EIO?:
                    // read() returns 0 (a tty after hang-up, a socket whose peer closed) or EIO
                    // (a pty master whose slave closed) once the other end is gone.
                    state.close(reason: SerialTransport.hangUpError(name: name, errno: code), deliver: true)
                    return (.stop, [], nil)
                case let code?:
                    state.close(reason: SerialTransport.readError(name: name, errno: code), deliver: true)
                    return (.stop, [], nil)
                }
            }
            switch step {
            case .delivered: handler?(.received(bytes))
            case .stop: return
            }
        }
    }
}

// MARK: - State

private enum Phase {
    /// Open, not yet activated: output is queued.
    case idle
    /// Being watched.
    case active
    /// No more events; the descriptor is closed, or is about to be by the watcher.
    case closed
}

private struct State {
    var phase = Phase.idle
    /// Whether activate(queue:handler:) was called (it takes effect once).
    var activated = false
    var descriptor: Int32
    let ownsDescriptor: Bool
    /// Whether the descriptor is a socket (an RFCOMM channel, a socket pair): written with
    /// `send(MSG_NOSIGNAL)`, so a peer that went away is `EPIPE`, not a SIGPIPE that kills the
    /// process.
    let isSocket: Bool
    var queue: DispatchQueue?
    var handler: (@Sendable (TransportEvent) -> Void)?
    /// Whether the watcher should wait for readability (false while a read pass is scheduled).
    var readInterest = false
    /// poll(2) reported a hang-up or an error condition.
    var hangUpSeen = false
    /// Reading stopped by ``SerialTransport/setReading(_:)``.
    var readingPaused = false
    /// Output not yet written: `output[outputStart...]`.
    var output: [UInt8] = []
    var outputStart = 0
    /// Where each frame waiting in `output` ends (offsets into `output`, ascending, all past
    /// `outputStart`): the boundaries at which urgent frames may go ahead.
    var frameEnds: [Int] = []
    var frameEndsHead = 0
    /// Where in `output` the frame being written began: `outputStart == boundary` when no frame
    /// is half written (-1 when one began before the array's start).
    var boundary = 0
    /// Frames to write before the rest of `output` at its next frame boundary (bare
    /// acknowledgements, which must not wait behind a window of data): `urgent[urgentStart...]`.
    var urgent: [UInt8] = []
    var urgentStart = 0
    /// The end of the last frame in `output` that urgent frames must not overtake (anything but
    /// a data packet: a SYN going ahead of its ACK would make the peer renegotiate), or 0.
    var barrierEnd = 0
    /// Whether such a frame waits beyond the one being written: urgent frames then queue in order.
    var barrierQueued: Bool {
        barrierEnd > (frameEndsHead < frameEnds.count ? frameEnds[frameEndsHead] : output.count)
    }
    /// Bytes handed to the kernel since the transport opened.
    var written: UInt64 = 0
    /// Reused for every read; allocated on activation.
    var readBuffer: [UInt8] = []
    /// Why it closed, and whether the handler is told.
    var closeReason: TransportError?
    var deliverClose = false

    init(descriptor: Int32, ownsDescriptor: Bool) {
        self.descriptor = descriptor
        self.ownsDescriptor = ownsDescriptor
        var status = stat()
        isSocket = fstat(descriptor, &status) == 0 && status.st_mode & S_IFMT == S_IFSOCK
    }

    /// Makes the poller look at the state again.
    func wake() {
        SerialPoller.shared.wake()
    }

    /// Bytes sent and not yet written, urgent ones included.
    var waitingBytes: Int { output.count - outputStart + urgent.count - urgentStart }

    /// Appends a whole frame to the output that waits.
    mutating func queue(_ frame: [UInt8]) {
        output.append(contentsOf: frame)
        frameEnds.append(output.count)
        if !LinkFrame.isDataPacket(frame) { barrierEnd = output.count }
    }

    /// Writes pending output until the kernel stops taking it: urgent frames first whenever no
    /// frame of `output` is half written.
    mutating func flushOutput(name: String) {
        let descriptor = self.descriptor, isSocket = self.isSocket
        while true {
            if urgentStart < urgent.count, urgentStart > 0 || outputStart == boundary || outputStart == output.count {
                let start = urgentStart
                let result = urgent.withUnsafeBytes { writeAvailableBytes(descriptor, UnsafeRawBufferPointer(rebasing: $0[start...]), socket: isSocket) }
                urgentStart += result.written
                written &+= UInt64(result.written)
                if let code = result.errorCode { return close(reason: SerialTransport.writeError(name: name, errno: code), deliver: true) }
                guard urgentStart == urgent.count else { return } // the kernel is full
                urgent.removeAll(keepingCapacity: true)
                urgentStart = 0
                continue
            }
            guard outputStart < output.count else { break }
            // With urgent frames waiting, only the rest of the frame under way.
            let limit = urgentStart < urgent.count ? (frameEndsHead < frameEnds.count ? frameEnds[frameEndsHead] : output.count) : output.count
            let start = outputStart
            let result = output.withUnsafeBytes { writeAvailableBytes(descriptor, UnsafeRawBufferPointer(rebasing: $0[start..<limit]), socket: isSocket) }
            outputStart += result.written
            written &+= UInt64(result.written)
            while frameEndsHead < frameEnds.count, frameEnds[frameEndsHead] <= outputStart {
                boundary = frameEnds[frameEndsHead]
                frameEndsHead += 1
            }
            if let code = result.errorCode { return close(reason: SerialTransport.writeError(name: name, errno: code), deliver: true) }
            guard outputStart == limit else { break } // the kernel is full
        }
        if outputStart == output.count {
            // Keep a modest buffer for the next burst; give back a big one.
            if output.capacity > 256 * 1024 {
                output = []
            } else {
                output.removeAll(keepingCapacity: true)
            }
            outputStart = 0
            boundary = 0
            barrierEnd = 0
            frameEnds.removeAll(keepingCapacity: true)
            frameEndsHead = 0
        } else if outputStart >= 64 * 1024, outputStart * 2 >= output.count {
            output.removeSubrange(0..<outputStart)
            frameEnds.removeSubrange(0..<frameEndsHead)
            frameEndsHead = 0
            for index in frameEnds.indices { frameEnds[index] -= outputStart }
            boundary -= outputStart
            barrierEnd = max(0, barrierEnd - outputStart)
            outputStart = 0
        }
    }

    /// Stops everything once. An active transport's watcher then closes the descriptors and
    /// delivers `.closed(reason)` (when `deliver` is set); one never activated closes at once.
    mutating func close(reason: TransportError?, deliver: Bool) {
        guard phase != .closed else { return }
        let wasActive = phase == .active
        phase = .closed
        closeReason = reason
        deliverClose = deliver
        output = []
        outputStart = 0
        frameEnds = []
        frameEndsHead = 0
        barrierEnd = 0
        urgent = []
        urgentStart = 0
        readBuffer = []
        if wasActive {
            wake()
        } else {
            releaseDescriptors()
            handler = nil
        }
    }

    /// Closes the descriptor (when owned).
    mutating func releaseDescriptors() {
        if ownsDescriptor, descriptor >= 0 { _ = Glibc.close(descriptor) }
        descriptor = -1
    }
}

/// How far one non-blocking write burst got.
private struct WriteResult {
    var written: Int
    /// Set when the write failed for another reason than a full kernel buffer.
    var errorCode: Int32?
}

/// Writes `bytes` to a non-blocking descriptor until done or the kernel buffer is full.
private func writeAvailableBytes(_ descriptor: Int32, _ bytes: UnsafeRawBufferPointer, socket: Bool) -> WriteResult {
    var written = 0
    while written < bytes.count {
        let rest = UnsafeRawBufferPointer(rebasing: bytes[written...])
        switch socket ? UnixSocket.send(descriptor, rest) : SystemCall.write(descriptor, rest) {
        case .success(0):
            return WriteResult(written: written, errorCode: nil)
        case .success(let count):
            written += count
        case .failure(let error) where error.kind == .wouldBlock:
            return WriteResult(written: written, errorCode: nil)
        case .failure(let error):
            return WriteResult(written: written, errorCode: error.code)
        }
    }
    return WriteResult(written: written, errorCode: nil)
}
