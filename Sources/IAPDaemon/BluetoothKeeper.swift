package import AccessoryHost
package import AccessoryHostBluetooth
package import AccessoryLogging
internal import BluetoothTransport
internal import Dispatch
package import IAPTransport
internal import Synchronization

/// Keeps iapd's Bluetooth service up: registers the iAP2 profile with BlueZ at start, and
/// again every ``interval`` whenever it is not registered (bluetoothd not started yet or
/// restarted since, the adapter off or not plugged in, BlueZ having released the profile),
/// and keeps connecting out to the configured accessories that have no connection (switched
/// off, out of range, not paired yet), so neither a daemon started before BlueZ, nor a
/// bluetoothd restarted under it, nor an accessory that comes back needs iapd restarted.
///
/// Each distinct failure is logged once, at `error` the first time and `debug` after. Only one
/// try runs at a time: a tick that finds one still going (BlueZ pages a device for seconds)
/// does nothing.
///
/// Thread safety: the methods may be called from any thread.
package final class BluetoothKeeper: Sendable {
    private let manager: AccessoryManager
    private let options: BluetoothOptions
    private let targets: [BluetoothAddress]
    private let logger: Logger
    private let queue = DispatchQueue(label: "iapd.bluetooth")
    private let state = Mutex(State())
    private let timer: RepeatingTimer

    private struct State {
        var stopped = false
        var trying = false
        var registrations = 0
        var lastFailure: [String: String] = [:]
    }

    /// How often a registration or a connection that is missing is tried again.
    package let interval: Duration

    /// Keeps the iAP2 profile registered on `manager` with `options` and connects out to each
    /// of `targets` that is not connected (they need `options.connectsOut`), trying every
    /// `interval` (5 s for iapd).
    package init(manager: AccessoryManager, options: BluetoothOptions, targets: [BluetoothAddress] = [], interval: Duration = .seconds(5),
                logger: Logger) {
        var options = options
        if !targets.isEmpty { options.connectsOut = true }
        self.manager = manager
        self.options = options
        self.targets = targets
        self.interval = interval
        self.logger = logger
        timer = RepeatingTimer(queue: queue)
    }

    /// How many times the profile was registered so far.
    package var registrationCount: Int { state.withLock { $0.registrations } }

    /// Tries now and then every ``interval`` (once; later calls do nothing).
    package func start() {
        timer.start(every: interval) { [weak self] in self?.tick() }
    }

    /// Stops trying (the registration and connections stay with the manager, whose `stop()`
    /// ends them). Once stopped, a keeper does not start again.
    package func stop() {
        state.withLock { $0.stopped = true }
        timer.stop()
    }

    private func tick() {
        let go = state.withLock { state -> Bool in
            guard !state.trying, !state.stopped else { return false }
            state.trying = true
            return true
        }
        guard go else { return }
        Task { [self] in
            await tryOnce()
            state.withLock { $0.trying = false }
        }
    }

    private func tryOnce() async {
        if await !manager.isBluetoothRegistered(), !state.withLock({ $0.stopped }) {
            do throws(BluetoothError) {
                try await manager.startBluetooth(options: options)
                state.withLock {
                    $0.registrations += 1
                    $0.lastFailure["bluetooth"] = nil
                }
                logger.notice("Bluetooth: the iAP2 service is registered with BlueZ"
                    + (options.channel == 0 ? "" : " on RFCOMM channel \(options.channel)")
                    + (options.adapter.map { " (adapter \($0))" } ?? ""))
            } catch {
                noteFailure("bluetooth", "Bluetooth: \(error)")
                return
            }
        }
        let connected = Set(manager.bluetoothConnections)
        for target in targets where !connected.contains(target) {
            guard !state.withLock({ $0.stopped }) else { return }
            do throws(BluetoothError) {
                try await manager.connectBluetooth(to: target)
                state.withLock { $0.lastFailure[target.description] = nil }
                logger.info("Bluetooth: connected to \(target)")
            } catch {
                noteFailure(target.description, "Bluetooth \(target): \(error)")
            }
        }
    }

    /// Logs a failure once per distinct text for `key` (nothing once stopped: a try cut short by
    /// the shutdown is no failure).
    private func noteFailure(_ key: String, _ text: String) {
        let (new, stopped) = state.withLock { state -> (Bool, Bool) in
            defer { state.lastFailure[key] = text }
            return (state.lastFailure[key] != text, state.stopped)
        }
        guard !stopped else { return }
        if new { logger.error("\(text)") } else { logger.debug("\(text)") }
    }
}
