import TestSupport
import AccessoryHost
import AccessorySimulator
import Dispatch
@testable import ExternalAccessory
import Foundation
import IAPTransport
import Synchronization

/// A thread running its own run loop, as an app's main thread does: the streams are scheduled
/// on it and the session opened from it (EASession's initializer blocks its caller, which must
/// not be one of Swift's cooperative threads).
final class RunLoopThread: @unchecked Sendable {
    // Confinement: `runLoop` is set once before `init` returns; `stopping` is atomic.
    private(set) var runLoop: RunLoop!
    private let stopping = Atomic<Bool>(false)
    private let finished = DispatchSemaphore(value: 0)

    init() {
        let started = DispatchSemaphore(value: 0)
        let thread = Thread { [self] in
            runLoop = RunLoop.current
            let keepAlive = Timer(fire: .distantFuture, interval: 0, repeats: false) { _ in }
            RunLoop.current.add(keepAlive, forMode: .default)
            started.signal()
            // Each turn returns at the latest after the tick, to see `stopping`.
            while !stopping.load(ordering: .acquiring) {
                _ = RunLoop.current.run(mode: .default, before: Date(timeIntervalSinceNow: 0.05))
            }
            keepAlive.invalidate()
            finished.signal()
        }
        thread.start()
        started.wait()
    }

    /// Runs `body` on the thread, in the run loop.
    func perform(_ body: @escaping @Sendable () -> Void) {
        runLoop.add(Timer(timeInterval: 0, repeats: false) { _ in body() }, forMode: .default)
    }

    /// Runs `body` on the thread and returns its result.
    func run<Result: Sendable>(_ body: @escaping @Sendable () -> Result) async -> Result {
        await withCheckedContinuation { continuation in
            perform { continuation.resume(returning: body()) }
        }
    }

    func stop() {
        stopping.store(true, ordering: .releasing)
        finished.wait()
    }
}

/// An app's session controller in the iOS style, reduced to what the tests watch: it opens
/// the session, schedules both streams on the current run loop, writes its queue whenever the
/// output has space, and collects what the input delivers and every event, in order.
final class StreamRecorder: NSObject, StreamDelegate, @unchecked Sendable {
    // Confinement: everything but `done` is touched on the run loop's thread only; the tests
    // read it there (RunLoopThread.run).
    var session: EASession?
    var events: [(input: Bool, event: Stream.Event)] = []
    var received: [UInt8] = []
    var pending: [UInt8] = []
    var expected = 0
    /// hasBytesAvailable events with nothing readable.
    var spurious = 0
    /// While true, hasBytesAvailable is only noted (`firstBytes`), not read: the accessory's
    /// echo backs up, and so does the transfer.
    var paused = false
    /// Yields when `expected` bytes were received, or the input ended.
    let done = AsyncStream<Void>.makeStream()
    /// Yields when the first bytes arrived.
    let firstBytes = AsyncStream<Void>.makeStream()
    /// Yields when the output ended.
    let outputEnded = AsyncStream<Void>.makeStream()

    func open(_ accessory: EAAccessory, _ protocolString: String) -> Bool {
        guard let session = EASession(accessory: accessory, forProtocol: protocolString) else { return false }
        self.session = session
        for stream in [session.inputStream!, session.outputStream!] as [Stream] {
            stream.delegate = self
            stream.schedule(in: .current, forMode: .default)
            stream.open()
        }
        return true
    }

    func send(_ bytes: [UInt8]) {
        pending += bytes
        expected += bytes.count
        writePending()
    }

    func close() {
        guard let session else { return }
        for stream in [session.inputStream!, session.outputStream!] as [Stream] {
            stream.close()
            stream.remove(from: .current, forMode: .default)
            stream.delegate = nil
        }
        self.session = nil
    }

    private func writePending() {
        guard let output = session?.outputStream else { return }
        while output.hasSpaceAvailable, !pending.isEmpty {
            let written = pending.withUnsafeBufferPointer { output.write($0.baseAddress!, maxLength: $0.count) }
            guard written > 0 else { break }
            pending.removeFirst(written)
        }
    }

    func stream(_ aStream: Stream, handle eventCode: Stream.Event) {
        let isInput = aStream === session?.inputStream
        events.append((isInput, eventCode))
        switch eventCode {
        case .hasBytesAvailable:
            guard let input = session?.inputStream else { return }
            guard input.hasBytesAvailable else {
                spurious += 1 // announced bytes that were not there
                return
            }
            if paused {
                firstBytes.continuation.yield()
                return
            }
            readOnce(input)
        case .hasSpaceAvailable:
            writePending()
        case .endEncountered, .errorOccurred:
            if isInput { done.continuation.yield() } else { outputEnded.continuation.yield() }
        default:
            break
        }
    }

    /// Reads again after a pause (the next events follow from the read).
    func resume() {
        paused = false
        if let input = session?.inputStream, input.hasBytesAvailable { readOnce(input) }
    }

    private func readOnce(_ input: InputStream) {
            var buffer = [UInt8](repeating: 0, count: 4_096)
            let count = buffer.withUnsafeMutableBufferPointer { input.read($0.baseAddress!, maxLength: $0.count) }
            if count > 0 {
                if received.isEmpty { firstBytes.continuation.yield() }
                received += buffer[0..<count]
            }
            if expected > 0, received.count >= expected { done.continuation.yield() }
    }

    /// The events of one stream, in order.
    func eventsOf(input: Bool) -> [Stream.Event] { events.filter { $0.input == input }.map(\.event) }
}

/// Waits for the next value of an async stream of signals.
func next(_ stream: AsyncStream<Void>) async {
    var iterator = stream.makeAsyncIterator()
    _ = await iterator.next()
}

/// Notifications of one manager, as an async sequence of (name, accessory), and all of them.
final class NotificationRecorder: @unchecked Sendable {
    let stream: AsyncStream<(Notification.Name, EAAccessory)>
    let seen = Locked<[Notification.Name]>([])
    private var observers: [any NSObjectProtocol] = []

    init(_ manager: EAAccessoryManager) {
        let (stream, continuation) = AsyncStream<(Notification.Name, EAAccessory)>.makeStream()
        self.stream = stream
        let seen = self.seen
        for name in [Notification.Name.EAAccessoryDidConnect, .EAAccessoryDidDisconnect] {
            observers.append(NotificationCenter.default.addObserver(forName: name, object: manager, queue: nil) { note in
                guard let accessory = note.userInfo?[EAAccessoryKey] as? EAAccessory else { return }
                // The main queue: drained by the main thread in an app running its main run loop
                // (here, by a worker thread: the test runner parked its main thread in dispatchMain).
                dispatchPrecondition(condition: .onQueue(.main))
                seen.withLock { $0.append(note.name) }
                continuation.yield((note.name, accessory))
            })
        }
    }

    deinit { for observer in observers { NotificationCenter.default.removeObserver(observer) } }
}

/// Records the delegate's disconnect call.
final class DisconnectDelegate: EAAccessoryDelegate, @unchecked Sendable {
    let calls = Mutex<[Int]>([])
    func accessoryDidDisconnect(_ accessory: EAAccessory) {
        dispatchPrecondition(condition: .onQueue(.main))
        calls.withLock { $0.append(accessory.connectionID) }
    }
}

/// The built-in multi-sensor profile run by the simulator, reaching `manager` over `wire`.
enum SimulatedWire: String, CaseIterable, Sendable {
    case memory
    case pty

    func start(_ profile: SimulatorProfile, on manager: EAAccessoryManager) throws -> SimulatorRunner {
        switch self {
        case .memory:
            let host = manager.host
            let runner = try SimulatorRunner(profile: profile, attachment: .memory { host.attach($0) })
            runner.start()
            return runner
        case .pty:
            let pty = try PseudoTerminal()
            let master = try pty.makeMasterTransport()
            manager.host.attach(try SerialTransport(spec: try SerialPortSpec(parsing: pty.slavePath + ":3000000")))
            pty.closeSlave()
            let runner = try SimulatorRunner(profile: profile, attachment: .transport(master))
            runner.start()
            return runner
        }
    }
}

/// A manager of its own for a test: the simulator's protocols declared (or `declared`), no USB.
func makeManager(declaring declared: [String] = ["com.example.echo", "com.example.sink"]) -> EAAccessoryManager {
    EAAccessoryManager(options: EAHostOptions(supportedProtocols: declared, usb: false))
}

func testBytes(_ count: Int, seed: UInt8 = 0) -> [UInt8] {
    bytes(count) { UInt8(truncatingIfNeeded: ($0 &* 13) ^ ($0 >> 8)) &+ seed }
}

/// Returns once the facade handled every event the host published before the call, and the
/// main queue ran what that posted.
func settled(_ manager: EAAccessoryManager) async {
    await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
        manager.host.queue.async { manager.eventQueue.async { DispatchQueue.main.async { continuation.resume() } } }
    }
}

/// The first accessory the facade lists (once the host identified it), within 20 s.
func waitForListed(_ manager: EAAccessoryManager) async -> EAAccessory? {
    guard await manager.host.waitForAccessory(timeout: .seconds(20)) != nil else { return nil }
    await settled(manager)
    return manager.connectedAccessories.first
}
