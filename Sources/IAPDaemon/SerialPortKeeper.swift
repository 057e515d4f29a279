package import AccessoryHost
package import AccessoryLogging
internal import Dispatch
package import IAPTransport
internal import Synchronization

/// Keeps the serial ports of iapd's configuration open: each is opened at start and opened again
/// whenever it is not (the adapter was unplugged and comes back, the port did not exist yet, the
/// accessory's link ended and its transport was closed), by trying every ``interval``.
///
/// A port this process still has open is found busy by its own exclusive lock
/// (``SerialTransport`` locks every port it opens), so a try costs one `open(2)` and changes
/// nothing on the line. Each distinct failure of a port is logged once, at `error` the first
/// time and `debug` after, so a port that stays away does not fill the journal.
///
/// Thread safety: the methods may be called from any thread.
package final class SerialPortKeeper: Sendable {
    private let manager: AccessoryManager
    private let specs: [SerialPortSpec]
    private let logger: Logger
    private let queue = DispatchQueue(label: "iapd.serial-ports")
    private let state = Mutex<(lastFailure: [String: String], opened: [String: Int])>(([:], [:]))
    private let timer: RepeatingTimer

    /// How often a port that is not open is tried again.
    package let interval: Duration

    /// Keeps `specs` open on `manager`, trying every `interval` (2 s for iapd).
    package init(manager: AccessoryManager, specs: [SerialPortSpec], interval: Duration = .seconds(2), logger: Logger) {
        self.manager = manager
        self.specs = specs
        self.interval = interval
        self.logger = logger
        timer = RepeatingTimer(queue: queue)
    }

    /// How many times a port was opened so far (each open is one new transport on the manager).
    package var openCount: Int { state.withLock { $0.opened.values.reduce(0, +) } }

    /// Opens the ports now and starts trying again every ``interval`` (once; later calls do nothing).
    package func start() {
        guard !specs.isEmpty else { return }
        timer.start(every: interval) { [weak self] in self?.tryAll() }
    }

    /// Stops trying (ports already open stay with the manager). Once stopped, a keeper does not
    /// start again.
    package func stop() {
        timer.stop()
    }

    private func tryAll() {
        for spec in specs {
            let key = spec.path
            do {
                let transport = try SerialTransport(spec: spec)
                // Counted before the manager has it: an accessory identified on this transport
                // is never seen with the open not yet counted.
                state.withLock {
                    $0.opened[key, default: 0] += 1
                    $0.lastFailure[key] = nil
                }
                manager.attach(transport)
                logger.info("opened \(spec)")
            } catch where error.kind == .busy {
                // Still ours (quiet), or another program's (said once).
                noteFailure(key, "\(error)", quietly: state.withLock { $0.opened[key] != nil })
            } catch {
                noteFailure(key, "\(error)", quietly: false)
            }
        }
    }

    /// Logs a port's failure once per distinct text.
    private func noteFailure(_ key: String, _ text: String, quietly: Bool) {
        let new = state.withLock { state -> Bool in
            defer { state.lastFailure[key] = text }
            return state.lastFailure[key] != text
        }
        if new, !quietly {
            logger.error("serial \(key): \(text)")
        } else {
            logger.debug("serial \(key): \(text)")
        }
    }
}
