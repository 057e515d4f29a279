/// A D-Bus failure: the error a peer replied with (its name, e.g.
/// `org.freedesktop.DBus.Error.ServiceUnknown`, and message), or one of this side (no bus at
/// that address, disconnected, a value that cannot be sent).
///
/// Decide on ``name`` (the D-Bus error name, stable) or the well-known names below, never on the
/// message.
package struct BusError: Error, Hashable, Sendable, CustomStringConvertible {
    /// The D-Bus error name.
    package var name: String
    /// What the peer (or this side) said, for people.
    package var message: String

    /// An error named `name` saying `message`.
    package init(name: String, message: String) {
        self.name = name
        self.message = message
    }

    /// `name: message`.
    package var description: String { message.isEmpty ? name : "\(name): \(message)" }

    /// No program owns the destination name (a service that is not running).
    package static let serviceUnknown = "org.freedesktop.DBus.Error.ServiceUnknown"
    /// The bus's policy refuses the call (a missing group or configuration).
    package static let accessDenied = "org.freedesktop.DBus.Error.AccessDenied"
    /// No answer within the call's timeout.
    package static let noReply = "org.freedesktop.DBus.Error.NoReply"
    /// The connection to the bus is gone.
    package static let disconnected = "org.freedesktop.DBus.Error.Disconnected"
    /// Nothing listens at the bus address.
    package static let noServer = "org.freedesktop.DBus.Error.NoServer"
    /// The bus address's socket file does not exist.
    package static let fileNotFound = "org.freedesktop.DBus.Error.FileNotFound"
    /// A value or name this side refused to send (not valid for D-Bus).
    package static let invalidArgs = "org.freedesktop.DBus.Error.InvalidArgs"
    /// The object or method does not exist at the destination.
    package static let unknownMethod = "org.freedesktop.DBus.Error.UnknownMethod"
    /// The object does not exist at the destination.
    package static let unknownObject = "org.freedesktop.DBus.Error.UnknownObject"
    /// Something failed; see the message.
    package static let failed = "org.freedesktop.DBus.Error.Failed"
}

/// A method call that arrived for an object exported with
/// ``BusConnection/export(path:handler:)``.
package struct BusMethodCall: Sendable {
    /// The object path it was sent to.
    package var path: String
    /// The interface named, e.g. `org.bluez.Profile1` (empty when the caller named none).
    package var interface: String
    /// The method, e.g. `NewConnection`.
    package var member: String
    /// The unique bus name of the caller (e.g. `:1.42`).
    package var sender: String
    /// The arguments, in order.
    package var arguments: [BusValue]
}

/// What a handler answers a method call with.
package enum BusReply: Sendable {
    /// A method return with these values (none for a `void` method).
    case values([BusValue])
    /// An error reply: a D-Bus error name (e.g. `org.bluez.Error.Rejected`) and a message.
    case error(name: String, message: String)

    /// An empty method return.
    package static var empty: BusReply { .values([]) }
}
