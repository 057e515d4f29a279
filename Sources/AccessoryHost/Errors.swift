/// What went wrong with an accessory or a session, with what a person can do about it.
public enum AccessoryError: Error, Hashable, Sendable, CustomStringConvertible {
    /// The accessory does not declare the protocol.
    case unsupportedProtocol(String, available: [String])
    /// A session for the protocol is already open on this accessory.
    case protocolInUse(String)
    /// A session for the protocol is open on this accessory in another process (through
    /// `iapd`); `holder` names it (pid and command line).
    case protocolHeldElsewhere(String, holder: String)
    /// The accessory is gone (unplugged, link failed); the reason says which.
    case disconnected(String)
    /// The session was closed (by this side or by the accessory).
    case sessionClosed
    /// The accessory did not confirm the session.
    case sessionRefused(String)
    /// A step did not finish in the time allowed; the message names the step.
    case timedOut(String)

    /// The error in a sentence. It quotes the accessory's strings (its protocols, a reason it
    /// gave) exactly, as data: escape it (`escapedForTerminal` of AccessoryLogging) before
    /// showing it on a terminal; `CommandLineTool` and the stderr log handler do.
    public var description: String {
        switch self {
        case let .unsupportedProtocol(name, available):
            return "the accessory does not declare '\(name)'; it declares: " + (available.isEmpty ? "no protocols" : available.joined(separator: ", "))
        case let .protocolInUse(name):
            return "a session for '\(name)' is already open on this accessory (one per protocol); close it first"
        case let .protocolHeldElsewhere(name, holder):
            return "a session for '\(name)' is already open on this accessory in \(holder) (one per protocol, system-wide); close it there first"
        case let .disconnected(reason):
            return "the accessory disconnected: \(reason)"
        case .sessionClosed:
            return "the session is closed"
        case let .sessionRefused(reason):
            return "the accessory refused the session: \(reason)"
        case let .timedOut(step):
            return "\(step); check that the accessory is running and answering (iapctl --trace shows its traffic), then try again"
        }
    }
}
