internal import IAPLink

// The behaviours of the simulator's sessions (echo, sink, source, firmware update), run after
// every input on EA sessions of the link and on native-transport sessions alike.
extension SimulatedAccessory {
    /// Runs every session's behaviour; true when any byte moved.
    mutating func runBehaviours() -> Bool {
        var moved = false
        for id in runtimeIDs {
            // Taken out of the dictionary while it runs, so its buffers are not copied.
            guard var runtime = runtimes.removeValue(forKey: id) else { continue }
            moved = runBehaviour(.link(id), &runtime) || moved
            runtimes[id] = runtime
        }
        for id in nativeRuntimes.keys.sorted() {
            guard var runtime = nativeRuntimes.removeValue(forKey: id) else { continue }
            moved = runBehaviour(.native(id), &runtime) || moved
            nativeRuntimes[id] = runtime
        }
        return moved
    }

    private mutating func runBehaviour(_ id: SessionRoute, _ runtime: inout SessionRuntime) -> Bool {
        switch runtime.statistics.behaviour {
        case .echo: runEcho(id, &runtime)
        case .sink: runSink(id, &runtime)
        case .source: runSource(id, &runtime)
        case .firmwareUpdate: runFirmwareUpdate(id, &runtime)
        }
    }

    /// Echo holds what it read as a view of the array the bytes arrived in (at most
    /// ``pendingLimit`` bytes) and writes from that view: the bytes are copied once, into the
    /// packets going back.
    private mutating func runEcho(_ id: SessionRoute, _ runtime: inout SessionRuntime) -> Bool {
        var moved = false
        while true {
            if !runtime.held.isEmpty {
                let taken = write(id, runtime.held)
                runtime.held = runtime.held.dropFirst(taken)
                runtime.statistics.bytesOut += taken
                if taken > 0 { moved = true }
                guard runtime.held.isEmpty else { return moved }
            }
            let bytes = readChunk(id, maxBytes: Self.pendingLimit, into: &runtime)
            guard !bytes.isEmpty else { return moved }
            runtime.held = bytes
            moved = true
        }
    }

    private mutating func runSink(_ id: SessionRoute, _ runtime: inout SessionRuntime) -> Bool {
        var moved = false
        while !readChunk(id, maxBytes: 65_536, into: &runtime).isEmpty { moved = true }
        return moved
    }

    private mutating func runSource(_ id: SessionRoute, _ runtime: inout SessionRuntime) -> Bool {
        var moved = runSink(id, &runtime)
        // A source that starts on request waits for the host's first byte.
        guard !runtime.startsOnRequest || runtime.statistics.bytesIn > 0 else { return moved }
        while runtime.statistics.bytesOut < runtime.sourceBytes {
            let count = min(spaceAvailable(id), runtime.sourceBytes - runtime.statistics.bytesOut, 16_384)
            guard count > 0 else { break }
            let start = runtime.statistics.bytesOut
            let chunk = Self.sourcePattern(from: start, count: count)
            let taken = write(id, chunk[...])
            guard taken > 0 else { break }
            runtime.statistics.bytesOut += taken
            moved = true
        }
        if runtime.statistics.bytesOut >= runtime.sourceBytes, !runtime.sourceFinished {
            runtime.sourceFinished = true
            events.append(.sourceFinished(sessionID: id.number, bytes: runtime.statistics.bytesOut))
        }
        return moved
    }

    private mutating func runFirmwareUpdate(_ id: SessionRoute, _ runtime: inout SessionRuntime) -> Bool {
        guard var receiver = runtime.firmware else { return false }
        runtime.firmware = nil // one owner while it runs, so its buffers are not copied
        defer { runtime.firmware = receiver }
        var moved = false
        while true {
            let flushed = flush(id, &runtime)
            var bytes: [UInt8] = []
            if runtime.pending.count < Self.pendingLimit {
                bytes = read(id, maxBytes: Self.firmwareReadSize, into: &runtime)
                var responses: [UInt8] = []
                var updates: [FirmwareUpdateReceiver.Event] = []
                receiver.consume(bytes, responses: &responses, events: &updates)
                runtime.pending.append(responses)
                for update in updates { report(update, session: id) }
            }
            guard flushed || !bytes.isEmpty else { return moved }
            moved = true
        }
    }

    private mutating func report(_ update: FirmwareUpdateReceiver.Event, session route: SessionRoute) {
        let id = route.number
        switch update {
        case let .began(version, size):
            events.append(.firmwareUpdateBegan(sessionID: id, version: version, imageSize: size))
        case let .finished(status, crc, version):
            events.append(.firmwareUpdateFinished(sessionID: id, status: status, computedCRC: crc))
            if status == .ok, reboot == nil {
                reboot = (now + .milliseconds(profile.rebootDelayMs), version)
            }
        case let .error(code, message):
            events.append(.firmwareUpdateError(sessionID: id, code: code, message: message))
        }
    }

    /// Hands pending bytes to the endpoint; true when it took any.
    private mutating func flush(_ id: SessionRoute, _ runtime: inout SessionRuntime) -> Bool {
        guard !runtime.pending.isEmpty else { return false }
        let taken = write(id, runtime.pending.bytes)
        runtime.pending.removeFirst(taken)
        runtime.statistics.bytesOut += taken
        return taken > 0
    }

    private mutating func write(_ route: SessionRoute, _ bytes: ArraySlice<UInt8>) -> Int {
        let taken: Int
        switch route {
        case let .link(id):
            taken = (try? endpoint.write(id, span: bytes.span.bytes, now: now)) ?? 0
        case let .native(id):
            guard let queued = nativeBuffers[id]?.outbound.byteCount else { return 0 }
            taken = min(bytes.count, max(0, sessionBufferLimit - queued))
            // Kept as a view: an echo's bytes are not copied again here.
            if taken > 0 { nativeBuffers[id]!.outbound.append(bytes.prefix(taken), owned: false) }
        }
        bytesMoved += taken
        return taken
    }

    private func spaceAvailable(_ route: SessionRoute) -> Int {
        switch route {
        case let .link(id): endpoint.spaceAvailable(id)
        case let .native(id): max(0, sessionBufferLimit - (nativeBuffers[id]?.outbound.byteCount ?? sessionBufferLimit))
        }
    }

    private func bytesAvailable(_ route: SessionRoute) -> Int {
        switch route {
        case let .link(id): endpoint.bytesAvailable(id)
        case let .native(id): nativeBuffers[id]?.inbound.byteCount ?? 0
        }
    }

    private mutating func take(_ route: SessionRoute, maxBytes: Int) -> ArraySlice<UInt8> {
        switch route {
        case let .link(id):
            return endpoint.readChunk(id, maxBytes: maxBytes)
        case let .native(id):
            guard nativeBuffers[id] != nil else { return [] }
            return nativeBuffers[id]!.inbound.takeChunk(maxBytes).bytes
        }
    }

    /// Reads session data, honouring the stop-reading fault, and counts it.
    private mutating func read(_ id: SessionRoute, maxBytes: Int, into runtime: inout SessionRuntime) -> [UInt8] {
        Array(readChunk(id, maxBytes: maxBytes, into: &runtime))
    }

    /// Reads session data as a view of the array it lies in, honouring the stop-reading fault,
    /// and counts it.
    private mutating func readChunk(_ id: SessionRoute, maxBytes: Int, into runtime: inout SessionRuntime) -> ArraySlice<UInt8> {
        var limit = maxBytes
        if let stop = profile.faults.stopReadingAfterBytes {
            limit = min(limit, stop - bytesRead)
            if limit <= 0 {
                if !readingStopped, bytesAvailable(id) > 0 {
                    readingStopped = true
                    events.append(.readingStopped(afterBytes: bytesRead))
                }
                return []
            }
        }
        let bytes = take(id, maxBytes: limit)
        guard !bytes.isEmpty else { return [] }
        bytesRead += bytes.count
        bytesMoved += bytes.count
        runtime.statistics.bytesIn += bytes.count
        if profile.checksumsSessionData { runtime.crc.update(bytes) }
        return bytes
    }
}

/// Where a behaviour's bytes go: an EA session on the link, or a native-transport session.
enum SessionRoute {
    case link(UInt16)
    case native(UInt16)

    /// The id events report.
    var number: UInt16 {
        switch self {
        case let .link(id), let .native(id): id
        }
    }
}

/// The raw bytes of a native session, each way.
struct NativeBuffers: Sendable {
    /// What the host sent: one copy of each read off the channel.
    var inbound = ChunkQueue()
    /// What the behaviour wrote: views of what it read (an echo) or of arrays it made.
    var outbound = ChunkQueue()
}

/// The behaviour state of one open session.
struct SessionRuntime: Sendable {
    var statistics: SessionStatistics
    var crc = CRC32()
    var pending = PendingBytes()
    /// Echo: bytes read and not yet written back, as a view of the array they arrived in.
    var held: ArraySlice<UInt8> = []
    var sourceBytes = 0
    var sourceFinished = false
    /// A source that waits for the host's first byte.
    var startsOnRequest = false
    var firmware: FirmwareUpdateReceiver?

    init(id: UInt16, name: String, spec: SimulatorProfile.ProtocolSpec?) {
        // A session for a protocol the profile does not declare cannot be opened; a sink is the
        // harmless choice should it ever happen.
        let behaviour = spec?.behaviour ?? .sink
        statistics = SessionStatistics(sessionID: id, protocolName: name, behaviour: behaviour)
        if behaviour == .source {
            sourceBytes = spec?.sourceBytes ?? 0
            startsOnRequest = spec?.startsOnRequest ?? false
        }
        if behaviour == .firmwareUpdate { firmware = FirmwareUpdateReceiver() }
    }
}
