import AccessoryHost
import Dispatch
import HeapStatistics
import IAPLink
import IAPTransport
import Synchronization
import Testing
import TestSupport
#if canImport(Glibc)
import Glibc
#endif

extension AccessoryIdentity {
    static let echoBox = AccessoryIdentity(
        name: "Echo Box", modelIdentifier: "EB-2", manufacturer: "Acme", serialNumber: "EB000042", firmwareVersion: "2.0.1",
        hardwareVersion: "B", messagesSent: [0xEA03], messagesReceived: [0xEA00, 0xEA01],
        protocols: [ExternalAccessoryProtocol(identifier: 1, name: "com.acme.echo"),
                    ExternalAccessoryProtocol(identifier: 2, name: "com.acme.other")])
}

/// An accessory that echoes every byte on every session, run by the real driver on its own
/// queue over a transport.
final class EchoAccessory: @unchecked Sendable {
    // Confined to `queue`.
    let queue = DispatchQueue(label: "test.echo-accessory")
    let driver: EndpointDriver<IAP2Endpoint>
    /// When false, the accessory stops reading (to test back-pressure).
    let reading = Atomic<Bool>(true)

    init(transport: any Transport, identity: AccessoryIdentity = .echoBox, configuration: LinkConfiguration = .accessory) {
        let endpoint = IAP2Endpoint(accessory: identity, configuration: configuration, initialSequence: 3, randomSeed: 9)
        driver = EndpointDriver(machine: endpoint, transport: transport, queue: queue)
    }

    func start() {
        queue.async {
            self.driver.start(update: { [self] machine, now in
                _ = machine.takeEvents()
                guard self.reading.load(ordering: .relaxed) else { return }
                for (id, _) in machine.sessions {
                    let room = machine.spaceAvailable(id)
                    guard room > 0, machine.bytesAvailable(id) > 0 else { continue }
                    let bytes = machine.read(id, maxBytes: room)
                    _ = try? machine.write(id, bytes, now: now)
                }
            }, closed: { _ in })
        }
    }

    func resumeReading() {
        reading.store(true, ordering: .relaxed)
        queue.async { self.driver.perform { _, _ in } }
    }

    func stop() { queue.sync { driver.stop() } }
}


/// Resident memory of this process in bytes (from /proc/self/statm).
func residentBytes() -> Int {
    guard let file = fopen("/proc/self/statm", "r") else { return -1 }
    defer { fclose(file) }
    var buffer = [CChar](repeating: 0, count: 128)
    guard fgets(&buffer, 128, file) != nil else { return -1 }
    let fields = String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self).split(separator: " ")
    guard fields.count > 1, let pages = Int(fields[1]) else { return -1 }
    return pages * Int(sysconf(Int32(_SC_PAGESIZE)))
}

/// Bytes malloc has handed out and not had back, over every arena (glibc's mallinfo2): what a
/// leak test measures. Not the resident size, which only ratchets up: a test running beside it
/// that peaks once (other suites run in parallel, many on threads of their own) raises it for
/// good, while its heap goes back down when that test frees.
func heapBytesInUse() -> Int {
    Int(heap_bytes_in_use())
}

/// What a leak test samples between rounds of its cycles. A leak grows in every round; a test
/// beside it (other suites run in parallel, many on threads of their own) takes descriptors and
/// memory for a while and gives them back, so it shows in some rounds only: the smallest growth
/// of a round decides.
struct LeakSamples {
    private var samples: [(descriptors: Int, heap: Int)] = []

    /// Takes a sample now (call before the first round and after each).
    mutating func sample() { samples.append((openDescriptorCount(), heapBytesInUse())) }

    /// Whether some round so far grew by less than both bounds: a leak grows in every round, so
    /// a test may stop at the first quiet one instead of hoping for one among a fixed few (a test
    /// beside it that builds up memory for seconds covers several rounds).
    func hasQuietRound(descriptors: Int, heap: Int) -> Bool {
        samples.count > 1 && growth.descriptors < descriptors && growth.heap < heap
    }

    /// The smallest growth of one round, of descriptors and of heap bytes.
    var growth: (descriptors: Int, heap: Int) {
        let rounds = zip(samples, samples.dropFirst())
        return (rounds.map { $1.descriptors - $0.descriptors }.min() ?? 0, rounds.map { $1.heap - $0.heap }.min() ?? 0)
    }
}



/// The wires the API suite runs over: the in-memory transport, and a real pseudo-terminal (the
/// tty path serial accessories use).
enum Wire: String, CaseIterable, Sendable, CustomTestStringConvertible {
    case memory
    case pty

    var testDescription: String { rawValue }

    /// `(host side, accessory side, what must stay alive with them)`.
    func make() throws -> (host: any Transport, accessory: any Transport, keepAlive: (any Sendable)?) {
        switch self {
        case .memory:
            let (host, device) = MemoryTransport.pair()
            return (host, device, nil)
        case .pty:
            let pty = try PseudoTerminal()
            let master = try pty.makeMasterTransport()
            let host = try SerialTransport(spec: try SerialPortSpec(parsing: pty.slavePath + ":3000000"))
            pty.closeSlave()
            return (host, master, pty)
        }
    }
}

/// A transport that can be muted: while muted it sends nothing (an accessory that stopped
/// answering without going away).
final class MuteableTransport: Transport {
    let base: any Transport
    let muted = Atomic<Bool>(false)
    init(_ base: any Transport) { self.base = base }
    var description: String { base.description }
    var kind: TransportKind { base.kind }
    func activate(queue: DispatchQueue, handler: @escaping @Sendable (TransportEvent) -> Void) { base.activate(queue: queue, handler: handler) }
    func send(_ frame: [UInt8]) { if !muted.load(ordering: .relaxed) { base.send(frame) } }
    func cancel() { base.cancel() }
}
