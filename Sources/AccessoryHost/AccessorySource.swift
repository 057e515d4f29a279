public import Dispatch
public import IAPTransport
internal import QueueConfinement
internal import Synchronization

/// Something that finds accessories on one kind of wire and hands their transports to an
/// ``AccessoryManager``: the plug-in form of a transport. AccessoryHostUSB's USB source (libusb
/// hotplug) and AccessoryHostBluetooth's (the iAP2 profile registered with BlueZ) are two; the
/// core knows neither, so a program that uses only serial ports links neither libusb nor
/// libdbus.
///
/// A source is added with ``AccessoryManager/addSource(_:)`` (or made there once with
/// ``AccessoryManager/source(_:orAdd:)``), attaches what it finds with
/// ``AccessoryManager/attach(_:)`` or, when opening a device takes a while, through an
/// ``AccessoryManager/Opening`` that keeps the manager unsettled meanwhile, and is stopped with
/// the manager.
public protocol AccessorySource: AnyObject, Sendable {
    /// Stops finding accessories and lets go of what the source holds. Called once, on the
    /// manager's queue, when the manager stops, after its connections were told to stop.
    func stop()
    /// Blocks the calling thread (never the manager's queue) until what ``stop()`` let go of is
    /// gone, or until `deadline`: what ``AccessoryManager/stop()`` waits for, so that a manager
    /// made next does not overlap this one's devices. Returns at once by default.
    func waitUntilReleased(deadline: DispatchTime)
}

extension AccessorySource {
    /// Nothing to wait for.
    public func waitUntilReleased(deadline: DispatchTime) {}
}

extension AccessoryManager {
    /// Adds `source`: it is stopped with the manager. Returns false, and adds nothing, when the
    /// manager has stopped already (the caller then stops the source itself).
    @discardableResult
    public func addSource(_ source: any AccessorySource) -> Bool {
        withState { state in
            guard !state.stopped else { return false }
            state.sources.append(source)
            return true
        }
    }

    /// The source of type `Source` added before, else the one `make` makes now, added: one of a
    /// kind per manager however many callers race. Nil when the manager has stopped. `make` runs
    /// with the manager's state locked: it must not call the manager.
    public func source<Source: AccessorySource>(_ type: Source.Type, orAdd make: () -> Source) -> Source? {
        withState { state -> Source? in
            guard !state.stopped else { return nil }
            if let found = state.sources.lazy.compactMap({ $0 as? Source }).first { return found }
            let made = make()
            state.sources.append(made)
            return made
        }
    }

    /// The source of type `Source` added before; nil when there is none.
    public func source<Source: AccessorySource>(_ type: Source.Type) -> Source? {
        withState { $0.sources.lazy.compactMap { $0 as? Source }.first }
    }

    /// What the transports of every connection open now (identified or not yet) give for
    /// `type`: their `Transport.capability(_:)` values (e.g. the Bluetooth peers).
    public func connectionCapabilities<Value>(_ type: Value.Type) -> [Value] {
        let transports = withState { state in state.connections.values.map(\.transport) }
        return transports.compactMap { $0.capability(type) }
    }

    /// Says that a source is opening an accessory: until the opening ends
    /// (``Opening/attach(_:)`` or ``Opening/fail(location:reason:)``) the manager is not settled
    /// (``waitUntilSettled(timeout:)`` waits for it).
    public func beginOpening() -> Opening {
        withState { $0.opening += 1 }
        return Opening(manager: self)
    }

    /// An accessory a source is opening: ends once, with its transport or with the reason it
    /// could not be opened.
    public final class Opening: Sendable {
        private weak let manager: AccessoryManager?
        private let ended = Atomic<Bool>(false)

        init(manager: AccessoryManager) { self.manager = manager }

        /// Runs the accessory on `transport`, as ``AccessoryManager/attach(_:)`` does, and ends
        /// the opening in the same turn of the manager's queue (no moment in between when the
        /// manager looks settled). From the manager's queue, at once.
        public func attach(_ transport: any Transport) {
            guard let manager, end() else { return transport.cancel() }
            QueueMark.runOrAsync(on: manager.queue) {
                manager.withState { $0.opening -= 1 }
                manager.attachOnQueue(transport)
            }
        }

        /// Ends the opening with ``AccessoryEvent/failed(location:reason:)``; once the manager
        /// has stopped, quietly (a source failing as it is stopped is no news to anyone).
        public func fail(location: String, reason: String) {
            guard let manager, end() else { return }
            QueueMark.runOrAsync(on: manager.queue) {
                let stopped = manager.withState { state -> Bool in
                    state.opening -= 1
                    return state.stopped
                }
                if !stopped { manager.publish(.failed(location: location, reason: reason)) }
            }
        }

        private func end() -> Bool { !ended.exchange(true, ordering: .acquiringAndReleasing) }

        deinit {
            // An opening dropped without an end (a source that stopped meanwhile) no longer
            // keeps the manager unsettled; nothing is published, so the waits are told.
            guard !ended.load(ordering: .acquiring), let manager else { return }
            manager.withState { $0.opening -= 1 }
            manager.queue.async { manager.wakeSettleWatchers() }
        }
    }
}

extension Accessory {
    /// What the accessory's transport gives for `type` now (`Transport.capability(_:)`): a
    /// plug-in's view of its own wire, of a type the plug-in and its transport share (USB's pipe
    /// statistics are ``AccessoryManager``'s `usbStatistics(of:)` in AccessoryHostUSB). Asked on
    /// the manager's queue; do not call it from a handler that blocks that queue.
    public func transportCapability<Value>(_ type: Value.Type) -> Value? {
        QueueMark.run(on: connection.queue) { connection.transport.capability(type) }
    }
}
