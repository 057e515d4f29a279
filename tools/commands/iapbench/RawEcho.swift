// The raw echo's host side: the ceiling the EA figures of `iapbench usb` are measured against (a
// raw bulk echo through the same gadget and the same USB pipes, without iAP2), and its round trip.

import CLIKit
import Dispatch
import Synchronization
import USBHost
import USBTransport

extension USBBenchmarks {
    /// The ceiling: the gadget (in its own process) echoes raw bytes; the host keeps up to
    /// 512 KiB in flight through a `USBAccessoryTransport` (64 KiB frames, one per OUT transfer)
    /// and counts what returns.
    static func rawEcho(udc: String, bytes: Int) throws -> EchoFigures {
        let child = try gadgetChild(.raw, udc: udc)
        defer {
            step("removing the gadget")
            child.stop()
            step("gadget removed")
        }
        return try hostRawEcho(productID: GadgetProcess.functionFSProductID, bytes: bytes, child: child)
    }

    /// Round trips of 64-byte messages through the raw echo (the gadget in its own process), one
    /// at a time: the p50 in nanoseconds.
    static func rawRoundTrip(udc: String, count: Int) throws -> Double {
        let child = try gadgetChild(.raw, udc: udc)
        defer { child.stop() }
        let figures = try hostRawEcho(productID: GadgetProcess.functionFSProductID, bytes: 64 * count, child: child, pingPong: true)
        return median(figures.roundTrips)
    }

    /// The host's half of a raw echo: a `USBAccessoryTransport` on the device with `productID`
    /// (the child's gadget echoes), up to 512 KiB in flight; the figures of the timed part.
    ///
    /// With `pingPong`, one 64-byte frame at a time instead: each sent once the last came back,
    /// its round trip timed (``EchoFigures/roundTrips``).
    static func hostRawEcho(productID: UInt16, bytes: Int, child: AccessoryChild, pingPong: Bool = false, label: String = "raw") throws -> EchoFigures {
        let queue = DispatchQueue(label: "iapbench.usb")
        let context = try USBContext(queue: queue, function: .iAP2, options: options.context)
        defer {
            step("shutting the USB context down")
            queue.sync { context.shutdown() }
            _ = context.waitUntilExited(timeout: .now() + 5)
            step("USB context shut down")
        }
        let opened = DispatchSemaphore(value: 0)
        let found = Mutex<Result<USBAccessoryTransport, USBHostError>?>(nil)
        try queue.sync {
            try context.startMonitoring { event in
                guard case let .arrived(info) = event, info.descriptor.productID == productID, found.withLock({ $0 == nil }) else { return }
                found.withLock { $0 = .failure(USBHostError(.io, "opening")) }
                context.open(info) { result in
                    found.withLock { $0 = result }
                    opened.signal()
                }
            }
        }
        guard opened.wait(timeout: .now() + 30) == .success, let result = found.withLock({ $0 }) else {
            throw ToolFailure("the gadget did not appear on the host within 30 s")
        }
        let transport = try result.get()
        let counters = Counters()
        // (A Dispatch source must be resumed before it is released: only make it when used.)
        let progress = verbose ? DispatchSource.makeTimerSource(queue: DispatchQueue(label: "iapbench.progress")) : nil
        progress?.schedule(deadline: .now() + 1, repeating: 1)
        progress?.setEventHandler { StandardError.write("iapbench: \(counters.text)\n") }
        progress?.resume()
        defer { progress?.cancel() }
        let frame = [UInt8](repeating: 0xA5, count: pingPong ? 64 : 65_000) // not a multiple of the packet size
        let window = (pingPong ? 1 : 8) * frame.count
        let done = DispatchSemaphore(value: 0)
        let state = Mutex((sent: 0, received: 0, finished: false, sentAt: ContinuousClock.now, roundTrips: [Double]()))
        let start = Mutex(ContinuousClock.now)
        let gadgetBefore = try child.figures()
        let cpuBefore = ProcessFigures.now()
        @Sendable func pump() {
            while true {
                let send = state.withLock { state -> Bool in
                    guard state.sent < bytes, state.sent - state.received < window else { return false }
                    state.sent += frame.count
                    if pingPong { state.sentAt = .now }
                    return true
                }
                guard send else { return }
                transport.send(frame)
            }
        }
        let waited = try HostProfile.recording(pingPong ? "raw-round-trip" : label) { () -> DispatchTimeoutResult in
            queue.sync {
                transport.activate(queue: queue) { event in
                    switch event {
                    case let .borrowed(chunk):
                        state.withLock { $0.received += chunk.count }
                        counters.add(received: chunk.count)
                    case let .lent(lease): // not asked for: the raw echo never keeps the bytes
                        state.withLock { $0.received += lease.count }
                        counters.add(received: lease.count)
                    case let .received(chunk):
                        state.withLock { $0.received += chunk.count }
                        counters.add(received: chunk.count)
                    case .closed: done.signal()
                    }
                    let finished = state.withLock { state -> Bool in
                        if pingPong, state.received == state.sent, state.received > 0 {
                            let elapsed = ContinuousClock.now - state.sentAt
                            state.roundTrips.append(Double(elapsed.components.seconds) * 1e9 + Double(elapsed.components.attoseconds) / 1e9)
                        }
                        guard !state.finished, state.received >= bytes else { return false }
                        state.finished = true
                        return true
                    }
                    if finished { done.signal() } else { pump() }
                }
                start.withLock { $0 = .now }
                pump()
            }
            return done.wait(timeout: .now() + (verbose ? 45 : 120))
        }
        guard waited == .success else {
            let host = queue.sync { transport.statistics }
            throw ToolFailure("the raw echo stalled: \(state.withLock { $0 }); host pipes \(host)")
        }
        let elapsed = ContinuousClock.now - start.withLock { $0 }
        let cpuAfter = ProcessFigures.now()
        let gadget = try child.figures() - gadgetBefore
        let received = state.withLock { $0.received }
        step("raw echo done; closing the host side")
        transport.cancel()
        _ = done.wait(timeout: .now() + 5)
        return EchoFigures(rate: Double(received) / seconds(elapsed), bytes: bytes, hostCPU: cpuAfter.cpuSeconds - cpuBefore.cpuSeconds,
                           hostSystemCPU: cpuAfter.systemSeconds - cpuBefore.systemSeconds, gadget: gadget,
                           roundTrips: state.withLock { $0.roundTrips })
    }
}

/// What the raw echo has moved, for the progress lines.
final class Counters: Sendable {
    private let received = Atomic<Int>(0)
    private let chunks = Atomic<Int>(0)
    func add(received count: Int) {
        received.add(count, ordering: .relaxed)
        chunks.add(1, ordering: .relaxed)
    }
    var text: String { "received \(received.load(ordering: .relaxed)) bytes in \(chunks.load(ordering: .relaxed)) completions" }
}
