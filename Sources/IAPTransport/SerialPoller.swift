internal import Dispatch
internal import Glibc
internal import SystemCalls
internal import Synchronization

/// A non-blocking, close-on-exec pipe: `(read end, write end)`; `nil` with `errno` set. What the
/// transports of this package that block in their own threads or sources wake up through.
package func makeWakePipe() -> (Int32, Int32)? {
    var ends: [Int32] = [-1, -1]
    let made = ends.withUnsafeMutableBufferPointer { pipe($0.baseAddress) }
    guard made == 0 else { return nil }
    for end in ends {
        let flags = fcntl(end, F_GETFL)
        guard flags >= 0,
              fcntl(end, F_SETFL, flags | O_NONBLOCK) == 0,
              fcntl(end, F_SETFD, FD_CLOEXEC) == 0
        else {
            let code = errno
            _ = Glibc.close(ends[0])
            _ = Glibc.close(ends[1])
            errno = code
            return nil
        }
    }
    return (ends[0], ends[1])
}

// MARK: - The poller

/// One thread that waits in `poll(2)` for every active serial transport of the process, so an
/// accessory costs no thread of its own (a thread per port would exhaust Dispatch's pool at 255
/// ports). It wakes through a pipe whenever a transport's interest changes (output queued, a read
/// pass finished, a close), rebuilds its list, and hands each ready descriptor to its transport,
/// which reads on its own queue. Started on the first activation; it runs for the life of the
/// process, parked in `poll(2)` when there is nothing to do.
final class SerialPoller: Sendable {
    static let shared = SerialPoller()

    private let members = Mutex<[SerialCore]>([])
    private let wakeReader: Int32
    private let wakeWriter: Int32
    /// The errno of a failed setup (no pipe), else 0.
    let setupError: Int32
    private let started = Mutex(false)

    private init() {
        if let (reader, writer) = makeWakePipe() {
            (wakeReader, wakeWriter, setupError) = (reader, writer, 0)
        } else {
            (wakeReader, wakeWriter, setupError) = (-1, -1, errno)
        }
    }

    /// Whether the poller can run (its wake-up pipe exists).
    var isAvailable: Bool { wakeWriter >= 0 }

    /// Starts watching `core` (its state is already active).
    func add(_ core: SerialCore) {
        members.withLock { $0.append(core) }
        let start = started.withLock { started -> Bool in
            defer { started = true }
            return !started
        }
        if start {
            DispatchQueue(label: "SerialTransport poller").async { [self] in run() }
        } else {
            wake()
        }
    }

    /// Makes the poller look at every transport again.
    func wake() {
        guard wakeWriter >= 0 else { return }
        var byte: UInt8 = 1
        // A full pipe already holds a wake-up, so a failed write loses nothing.
        _ = write(wakeWriter, &byte, 1)
    }

    private func run() {
        var drain = [UInt8](repeating: 0, count: 256)
        var watched: [pollfd] = []
        var polled: [SerialCore] = []
        while true {
            let current = members.withLock { $0 }
            watched.removeAll(keepingCapacity: true)
            polled.removeAll(keepingCapacity: true)
            watched.append(pollfd(fd: wakeReader, events: Int16(POLLIN), revents: 0))
            var finished: Set<ObjectIdentifier> = []
            for core in current {
                if let plan = core.pollPlan() {
                    watched.append(plan)
                    polled.append(core)
                } else {
                    finished.insert(ObjectIdentifier(core))
                }
            }
            if !finished.isEmpty {
                let gone = members.withLock { members -> [SerialCore] in
                    let gone = members.filter { finished.contains(ObjectIdentifier($0)) }
                    members.removeAll { finished.contains(ObjectIdentifier($0)) }
                    return gone
                }
                for core in gone { core.finish() }
            }
            if case .failure(let error) = SystemCall.poll(&watched) {
                if error.kind == .wouldBlock { continue }
                // Cannot happen with valid arguments; fail the transports rather than spin.
                for core in polled { core.pollFailed(error) }
                continue
            }
            if watched[0].revents != 0 {
                while drain.withUnsafeMutableBytes({ read(wakeReader, $0.baseAddress, $0.count) }) > 0 {}
            }
            for (index, core) in polled.enumerated() where watched[index + 1].revents != 0 {
                core.handle(Int32(watched[index + 1].revents))
            }
        }
    }
}
