public import IAPWire

/// The state of an EA session on an ``IAP2Endpoint``.
public enum EASessionState: Hashable, Sendable {
    /// iAP1 device: OpenDataSessionForProtocol sent, not yet acknowledged. (An iAP2 session is
    /// never in this state: it is open once StartExternalAccessoryProtocolSession is queued.)
    case opening
    /// Open: bytes flow both ways (iAP2 device: from the moment StartExternalAccessoryProtocolSession
    /// is sent, as on an iPhone; accessory: on StartExternalAccessoryProtocolSession).
    case open
    /// Closed, with the reason (nil for a normal close).
    case closed(String?)
}

/// Why the control session stopped the connection.
public enum ControlFailure: Hashable, Sendable, CustomStringConvertible {
    /// The accessory did not answer a request in time (the step is named).
    case noAnswer(String)
    /// The authentication policy refused the certificate or the response.
    case authenticationFailed(String)
    /// The device rejected identification (accessory role sees this).
    case identificationRejected([UInt16])
    /// The device said authentication failed (accessory role sees this).
    case authenticationRefusedByDevice
    /// The peer made this side queue more control replies than ``IAP2Endpoint/controlQueueLimit``
    /// without acknowledging them (a flood of requests on a link that does not move).
    case overwhelmed(queued: Int)

    public var description: String {
        switch self {
        case let .noAnswer(step): return "the accessory did not answer \(step) in time"
        case let .authenticationFailed(why): return "authentication failed: \(why)"
        case let .identificationRejected(ids): return "identification rejected (parameters \(ids.map(String.init).joined(separator: ", ")))"
        case .authenticationRefusedByDevice: return "the device refused the accessory's authentication"
        case let .overwhelmed(queued):
            return "the accessory sent requests faster than it acknowledged the \(queued) replies waiting for it; disconnected to bound memory"
        }
    }
}

/// What an ``IAP2Endpoint`` tells its owner.
public enum EndpointEvent: Hashable, Sendable {
    /// Something the link reported (state changes, negotiation, drops, protocol violations), passed on
    /// as it came.
    case link(LinkEvent)
    /// Device: the accessory passed authentication, or the policy let it in although it did
    /// not (its certificate is kept; the outcome says which).
    case authenticated(certificate: [UInt8], outcome: AuthenticationOutcome)
    /// Device: identification accepted. Accessory: the device accepted ours.
    case identified(AccessoryIdentity)
    /// Device: identification rejected, with the reasons; the accessory may try again.
    case identificationRejected(IdentificationRejection)
    /// The control session ended the connection (no answer in time, authentication refused, a flood
    /// of requests): the owner should close the transport.
    case controlFailed(ControlFailure)
    /// A control message nobody handles (counted, never fatal).
    case unhandledMessage(MessageID)
    /// A control message that could not be decoded.
    case malformedMessage(String)
    /// An EA session is open: iAP2 device, StartExternalAccessoryProtocolSession was queued (the
    /// accessory's StatusExternalAccessoryProtocolSession is not waited for: many accessories never
    /// send it); iAP1 device, the accessory acknowledged the open; accessory, the device started it.
    case sessionOpened(sessionID: UInt16, protocolName: String)
    /// Device (iAP2): the accessory confirmed an open session with StatusExternalAccessoryProtocolSession
    /// status 0. Informational: the session was usable before.
    case sessionConfirmed(sessionID: UInt16)
    /// Device: the accessory asked for an application to be launched (RequestAppLaunch, 0xEA02),
    /// as accessories do after identification.
    case appLaunchRequested(AppLaunchRequest)
    /// Device: something the accessory did that the host tolerated rather than refused, as an
    /// iPhone does (a message it did not declare, a session id that is not open, an identification
    /// detail). Said once per kind on a connection, for the log; nothing depends on it.
    case tolerated(String)
    /// An EA session ended: closed by either side (`reason` nil) or refused or broken (`reason` says
    /// how). Bytes it received stay readable.
    case sessionClosed(sessionID: UInt16, reason: String?)
    /// Device (iAP2): the accessory's link acknowledged the StopExternalAccessoryProtocolSession
    /// sent when the owner closed the session: the accessory has the news that it is over.
    case sessionStopAcknowledged(sessionID: UInt16)
    /// Device (iAP2): the StopExternalAccessoryProtocolSession sent when the owner closed the
    /// session was not acknowledged within ``IAP2Endpoint/answerTimeout``. The session is closed
    /// on this side all the same.
    case sessionStopTimedOut(sessionID: UInt16, protocolName: String, after: Duration)
    /// New bytes are readable on a session.
    case bytesAvailable(sessionID: UInt16)
    /// A session that was full can take writes again.
    case spaceAvailable(sessionID: UInt16)
    /// Accessory: the device's PowerUpdate (its parameters).
    case powerUpdate([Parameter])
    /// iAP1: a packet of a lingo or command this side does not handle (the device answered it
    /// with iPodAck BadParameter).
    case unhandledIAP1Command(lingo: UInt8, command: UInt16)
    /// Device: the identified accessory started identifying again: the accessory known so far
    /// is gone, and the next ``identified(_:)`` announces it anew.
    case accessoryRestarted(reason: String)
    /// Device: the connection now speaks this protocol (the accessory showed it speaks iAP1, or
    /// an iAP1 accessory started over with the iAP2 detect).
    case protocolSwitched(IAPProtocolVersion)
}

/// Errors of the session calls.
public enum EndpointError: Error, Hashable, Sendable, CustomStringConvertible {
    /// A session was asked for before the accessory was identified (or on the accessory side, which
    /// does not open sessions).
    case notIdentified
    /// The accessory does not declare the protocol.
    case unsupportedProtocol(String)
    /// A session for the protocol is already open or opening: one per protocol.
    case protocolInUse(String)
    /// No session has this id (never opened, or forgotten after it closed).
    case unknownSession(UInt16)
    /// The session exists but is not open (still opening, or closed).
    case sessionNotOpen(UInt16)
    /// The accessory's SYN declared no External Accessory link session, so no EA data can travel.
    case noExternalAccessoryLinkSession

    public var description: String {
        switch self {
        case .notIdentified: return "the accessory is not identified yet"
        case let .unsupportedProtocol(name): return "the accessory does not declare the protocol '\(name)'"
        case let .protocolInUse(name): return "a session for '\(name)' is already open on this accessory; close it first"
        case let .unknownSession(id): return "no session \(id)"
        case let .sessionNotOpen(id): return "session \(id) is not open"
        case .noExternalAccessoryLinkSession: return "the link has no External Accessory session (the accessory's SYN declared none)"
        }
    }
}
