internal import Dispatch
internal import Glibc
internal import IAPTransport
internal import Synchronization
internal import SystemCalls

// The threads of a gadget transport: ep0's events, the reader (OUT endpoint) and the writer
// (IN endpoint).
extension GadgetCore {
    // MARK: ep0 thread

    func watchEndpointZero() {
        var buffer = [UInt8](repeating: 0, count: 4 * FunctionFSEvent.size)
        var pending: [UInt8] = []
        var drain = [UInt8](repeating: 0, count: 16)
        while !isClosing {
            var watched = [pollfd(fd: ep0, events: Int16(POLLIN), revents: 0),
                           pollfd(fd: wakeReader, events: Int16(POLLIN), revents: 0)]
            if case .failure(let error) = SystemCall.poll(&watched, retry: { !isClosing }) {
                if error.kind == .interrupted || error.kind == .wouldBlock { continue }
                let code = error.code
                fail(TransportError("cannot watch ep0 of \(name): \(SystemError(code).description)", errno: code,
                                    advice: "start the gadget again"))
                return
            }
            if watched[1].revents != 0 {
                while drain.withUnsafeMutableBytes({ read(wakeReader, $0.baseAddress, $0.count) }) > 0 {}
                continue
            }
            guard watched[0].revents != 0 else { continue }
            let result = buffer.withUnsafeMutableBytes { SystemCall.read(ep0, into: $0, retry: { !isClosing }) }
            if case .success(let count) = result, count > 0 {
                pending += buffer[..<count]
                var offset = 0
                while pending.count - offset >= FunctionFSEvent.size {
                    if let event = FunctionFSEvent(pending[offset..<(offset + FunctionFSEvent.size)]) {
                        handle(event)
                    }
                    offset += FunctionFSEvent.size
                }
                pending.removeFirst(offset)
                continue
            }
            let code: Int32? = if case .failure(let error) = result { error.code } else { nil }
            switch code {
            case EINTR?, EAGAIN?, EIDRM?:
                // EIDRM: the host abandoned a control request before it was answered.
                continue
            case nil:
                if isClosing { return }
                fail(TransportError("ep0 of \(name) was closed", advice: "start the gadget again"))
                return
            case let code?:
                if isClosing { return }
                fail(TransportError(
                    "reading the USB function's events from ep0 of \(name) failed: \(SystemError(code).description)", errno: code,
                    advice: "the FunctionFS instance went away (unmounted, or the gadget was removed); start the gadget again"))
                return
            }
        }
    }

    private func handle(_ event: FunctionFSEvent) {
        guard let kind = event.kind else {
            state.withLock { $0.statistics.events += 1 }
            return
        }
        if kind == .setup {
            answer(event.setup)
        }
        let change = state.withLock { state -> (GadgetConnection, [@Sendable (GadgetConnection) -> Void])? in
            state.statistics.events += 1
            let before = state.connection
            switch kind {
            case .bind:
                state.bound = true
            case .unbind:
                state.bound = false
                state.enabled = false
                state.suspended = false
                state.dropOutgoing()
            case .enable:
                state.bound = true
                state.enabled = true
                state.suspended = false
                state.enableGeneration &+= 1
            case .disable:
                state.enabled = false
                state.suspended = false
                state.dropOutgoing()
            case .suspend:
                state.suspended = state.bound
            case .resume:
                state.suspended = false
            case .setup:
                state.statistics.setupRequests += 1
            }
            let after = state.connection
            return after == before ? nil : (after, state.observers)
        }
        readerWake.signal()
        writerWake.signal()
        if let (connection, observers) = change {
            for observer in observers { observer(connection) }
        }
    }

    /// Answers a control request addressed to the function. Nothing here implements one, so
    /// host-to-device requests are acknowledged (their data is read and discarded) and
    /// device-to-host requests are stalled; with FunctionFS both are a `read()` of `ep0`.
    private func answer(_ setup: USBSetupRequest) {
        var data = [UInt8](repeating: 0, count: max(1, Int(setup.length)))
        _ = data.withUnsafeMutableBytes { SystemCall.read(ep0, into: $0, retry: { !isClosing }) }
    }

    // MARK: Reader thread

    private enum ReadStep {
        case stop
        case wait(Duration?)
        case read(generation: UInt64)
    }

    func readLoop() {
        // FunctionFS: several reads queued at once (a controller's receive queue); elsewhere, or
        // without AIO, one blocking read at a time.
        let requests = queuedRequests > 1 ? EndpointRequests(descriptor: outEndpoint, writes: false, depth: queuedRequests,
                                                              slotSize: Self.readSize) : nil
        while true {
            let step = state.withLock { state -> ReadStep in
                guard state.phase == .active else { return .stop }
                guard state.enabled else { return .wait(nil) }
                if let failed = state.readerFailedGeneration {
                    if failed == state.enableGeneration { return .wait(retryInterval) }
                    state.readerFailedGeneration = nil
                }
                return .read(generation: state.enableGeneration)
            }
            switch step {
            case .stop:
                return
            case .wait(nil):
                readerWake.wait()
                continue
            case let .wait(interval?):
                if readerWake.wait(timeout: .now() + max(interval, .milliseconds(1)).dispatchInterval) == .timedOut {
                    // No ENABLE came: the endpoint may work again without one (a transient error).
                    state.withLock { $0.readerFailedGeneration = nil }
                }
                continue
            case let .read(generation):
                if let requests {
                    if !readQueued(requests, generation: generation) { return }
                    continue
                }
                var result: Result<Int, SystemError> = .success(0)
                var bytes = [UInt8](unsafeUninitializedCapacity: Self.readSize) { buffer, initialized in
                    result = SystemCall.read(outEndpoint, into: UnsafeMutableRawBufferPointer(buffer), retry: { !isClosing })
                    initialized = (try? result.get()) ?? 0
                }
                let count = (try? result.get()) ?? -1
                if count > 0 {
                    // (Through a buffer pointer: an Array made from a whole-array slice would
                    // keep the 64 KiB storage.)
                    if count < Self.compactBelow { bytes = bytes.withUnsafeBufferPointer { Array($0) } }
                    deliver(bytes)
                    continue
                }
                if count == 0 {
                    // FunctionFS: a zero-length packet ended a transfer that filled the last read.
                    if isFunctionFS { continue }
                    if !isClosing {
                        fail(TransportError("the OUT endpoint of \(name) reached its end (its other side closed)",
                                            advice: "start the gadget again"))
                    }
                    return
                }
                guard case .failure(let error) = result, error.kind != .interrupted else { continue }
                if !readFailed(error.code, generation: generation) { return }
            }
        }
    }

    /// Hands bytes read from the OUT endpoint to the handler on its queue.
    private func deliver(_ bytes: [UInt8]) {
        let delivery = state.withLock { state -> (DispatchQueue, @Sendable (TransportEvent) -> Void)? in
            guard state.phase == .active, let queue = state.queue, let handler = state.handler else { return nil }
            state.statistics.reads += 1
            state.statistics.bytesReceived += bytes.count
            return (queue, handler)
        }
        if let (queue, handler) = delivery {
            queue.async { handler(.received(bytes)) }
        }
    }

    /// Counts a failed read; the reader then waits for the next ENABLE. `false` when it must stop.
    private func readFailed(_ code: Int32, generation: UInt64) -> Bool {
        if !endpointFailed(code, generation: generation, direction: "reading the OUT endpoint") { return false }
        state.withLock { state in
            if state.readerFailedGeneration == nil { state.readerFailedGeneration = generation }
        }
        return true
    }

    /// One turn of the reader with reads queued (FunctionFS): fills the queue, waits for at least
    /// one read to complete and delivers what completed, in order, each read's bytes copied into
    /// an array of their size. The first failure of a turn counts as a failed read (when the host
    /// disables the function, every queued read fails at once). `false` when the reader must stop.
    private func readQueued(_ requests: EndpointRequests, generation: UInt64) -> Bool {
        var refused: Int32?
        while requests.hasRoom, refused == nil {
            refused = requests.queueRead(tag: generation)
        }
        if requests.inFlight == 0 {
            let code = refused ?? EAGAIN
            return code == EINTR || readFailed(code, generation: generation)
        }
        if let code = requests.collect(wait: true) {
            if code == EINTR { return true } // a signal: closing, or nothing
            if !isClosing {
                fail(TransportError("waiting for reads of the OUT endpoint of \(name) failed: \(SystemError(code).description)",
                                    errno: code, advice: "start the gadget again"))
            }
            return false
        }
        var failed: Int32?
        requests.takeCompleted { completion in
            switch completion {
            case let .moved(bytes, _):
                // A zero-length packet ended a transfer that filled the last read: nothing.
                if !bytes.isEmpty { deliver(Array(bytes)) }
            case let .failed(code, tag):
                // A read queued before the last ENABLE failed with its generation (the kernel
                // dequeued it at DISABLE): nothing to wait for, the endpoint works again.
                if failed == nil, tag == generation { failed = code }
            }
        }
        guard let failed, failed != EINTR else { return true }
        return readFailed(failed, generation: generation)
    }

    /// Counts an endpoint error; `false` (after closing the transport) when it cannot be waited
    /// out: a descriptor that is not usable at all, or no ep0 to say when it works again.
    private func endpointFailed(_ code: Int32, generation: UInt64, direction: String) -> Bool {
        let recoverable = ep0 >= 0 && code != EBADF && code != EFAULT && code != EINVAL
        let observer = state.withLock { state in
            state.statistics.endpointErrors += 1
            return state.endpointErrorObserver
        }
        observer?()
        if recoverable { return true }
        if !isClosing {
            fail(TransportError("\(direction) of \(name) failed: \(SystemError(code).description)", errno: code,
                                advice: "start the gadget again"))
        }
        return false
    }

    // MARK: Writer thread

    private enum WriteStep {
        case stop
        case wait
        case again
        case frame([UInt8], generation: UInt64, maxPacket: Int, knownSize: Bool)
        case stall
    }

    func writeLoop() {
        // FunctionFS: several writes queued at once; elsewhere, or without AIO, one blocking
        // write at a time (which returns when the host took the frame).
        let requests = queuedRequests > 1 ? EndpointRequests(descriptor: inEndpoint, writes: true, depth: queuedRequests,
                                                              slotSize: Self.writeSlotSize) : nil
        while true {
            let step = state.withLock { state -> WriteStep in
                guard state.phase == .active else { return .stop }
                guard let item = state.popOutgoing() else { return .wait }
                guard state.enabled else {
                    if case .frame = item { state.statistics.framesDropped += 1 }
                    return .again
                }
                switch item {
                case let .frame(bytes):
                    return .frame(bytes, generation: state.enableGeneration, maxPacket: state.maxPacket,
                                  knownSize: !isFunctionFS || state.maxPacketGeneration == state.enableGeneration)
                case .stall:
                    return .stall
                }
            }
            switch step {
            case .stop:
                if let requests {
                    // Counted before io_destroy cancels what is still queued: those are dropped.
                    _ = finishWrites(requests, wait: false)
                    let cancelled = requests.inFlight
                    state.withLock { $0.statistics.framesDropped += cancelled }
                }
                return
            case .wait:
                if let requests, !finishWrites(requests, wait: false) { return }
                writerWake.wait()
            case .again:
                continue
            case .stall:
                // Most controllers refuse to halt an IN endpoint with a transfer queued.
                if let requests, !finishWrites(requests, wait: true) { return }
                halt()
            case .frame(let frame, let generation, var maxPacket, let knownSize):
                if !knownSize {
                    // A new ENABLE: ask the kernel which packet size the host connected at.
                    maxPacket = activeMaxPacketSize(inEndpoint) ?? 64
                    state.withLock { state in
                        state.maxPacket = maxPacket
                        state.maxPacketGeneration = generation
                    }
                }
                if let requests {
                    if frame.count <= requests.slotSize {
                        if !writeQueued(frame, requests, maxPacket: maxPacket, generation: generation) { return }
                        continue
                    }
                    // Too long for a slot: written directly, after what is queued.
                    if !finishWrites(requests, wait: true) { return }
                }
                if !writeFrame(frame, maxPacket: maxPacket, generation: generation) { return }
            }
        }
    }

    /// Queues one frame written with the short-packet rule (FunctionFS), first waiting for a
    /// free request when all are queued; `false` when the writer must stop.
    private func writeQueued(_ frame: [UInt8], _ requests: EndpointRequests, maxPacket: Int, generation: UInt64) -> Bool {
        guard !frame.isEmpty else { return true }
        while !requests.hasRoom {
            if !finishWrites(requests, wait: true, untilRoom: true) { return false }
        }
        let split = frame.count % maxPacket == 0
        guard let code = frame.withUnsafeBytes({ requests.queueWrite($0, splitBeforeLast: split) }) else { return true }
        if code == EINTR {
            state.withLock { $0.statistics.framesDropped += 1 }
            return !isClosing
        }
        if !endpointFailed(code, generation: generation, direction: "writing the IN endpoint") { return false }
        state.withLock { $0.statistics.framesDropped += 1 }
        return true
    }

    /// Counts the queued writes that completed: with `wait`, waits until none is left queued (or,
    /// with `untilRoom`, until one request is free). `false` when the writer must stop.
    private func finishWrites(_ requests: EndpointRequests, wait: Bool, untilRoom: Bool = false) -> Bool {
        repeat {
            if let code = requests.collect(wait: wait) {
                if code == EINTR, !isClosing { continue }
                if !isClosing {
                    fail(TransportError("waiting for writes of the IN endpoint of \(name) failed: \(SystemError(code).description)",
                                        errno: code, advice: "start the gadget again"))
                }
                return false
            }
            var failures: [Int32] = []
            requests.takeCompleted { completion in
                switch completion {
                case let .moved(bytes, writes):
                    state.withLock { state in
                        state.statistics.framesSent += 1
                        state.statistics.bytesSent += bytes.count
                        if writes > 1 { state.statistics.shortPacketSplits += 1 }
                    }
                case let .failed(code, _):
                    failures.append(code)
                }
            }
            for code in failures {
                let generation = state.withLock { state in
                    state.statistics.framesDropped += 1
                    return state.enableGeneration
                }
                if !endpointFailed(code, generation: generation, direction: "writing the IN endpoint") { return false }
            }
        } while wait && requests.inFlight > 0 && !(untilRoom && requests.hasRoom)
        return true
    }

    /// Writes one frame with the short-packet rule; `false` when the writer must stop.
    private func writeFrame(_ frame: [UInt8], maxPacket: Int, generation: UInt64) -> Bool {
        guard !frame.isEmpty else { return true } // nothing to send (and no split of nothing)
        let split = frame.count % maxPacket == 0
        let pieces = split ? [0..<(frame.count - 1), (frame.count - 1)..<frame.count] : [0..<frame.count]
        for piece in pieces {
            let result = frame.withUnsafeBytes {
                SystemCall.writeAll(inEndpoint, UnsafeRawBufferPointer(rebasing: $0[piece]), retry: { !isClosing })
            }
            if case .failure(let error) = result {
                if error.kind == .interrupted { return false }
                if !endpointFailed(error.code, generation: generation, direction: "writing the IN endpoint") { return false }
                state.withLock { $0.statistics.framesDropped += 1 }
                return true
            }
        }
        state.withLock { state in
            state.statistics.framesSent += 1
            state.statistics.bytesSent += frame.count
            if split { state.statistics.shortPacketSplits += 1 }
        }
        return true
    }

    /// Halts the IN endpoint: FunctionFS sets the halt when its IN file is read.
    private func halt() {
        var byte: UInt8 = 0
        let result = read(inEndpoint, &byte, 1)
        let code = result < 0 ? errno : 0
        state.withLock { state in
            state.statistics.inHaltRequests += 1
            if code == EBADMSG { state.statistics.inHalts += 1 }
        }
    }
}
