public import IAPLink

/// What a ``SimulatedAccessory`` tells its owner.
public enum SimulatorEvent: Hashable, Sendable {
    /// The device accepted the accessory's identification.
    case identified(AccessoryIdentity)
    /// The device opened a session; its behaviour runs from now on.
    case sessionOpened(sessionID: UInt16, protocolName: String)
    /// A session ended (the device closed it, or the link went down), with its final counts.
    case sessionClosed(sessionID: UInt16, protocolName: String, reason: String?, statistics: SessionStatistics)
    /// The host opened a protocol's native transport (alternate setting 1 of its interface); the
    /// behaviour runs on its raw bytes from now on. Native session ids are numbered on their own.
    case nativeSessionOpened(sessionID: UInt16, protocolName: String)
    /// A native-transport session ended (alternate setting 0, or the host went away).
    case nativeSessionClosed(sessionID: UInt16, protocolName: String, statistics: SessionStatistics)
    /// A source session handed its last byte to the endpoint.
    case sourceFinished(sessionID: UInt16, bytes: Int)
    /// A firmware-update session received BEGIN (READY is on its way).
    case firmwareUpdateBegan(sessionID: UInt16, version: String, imageSize: Int)
    /// A firmware-update session received END and answered DONE with this status.
    case firmwareUpdateFinished(sessionID: UInt16, status: FirmwareUpdateProtocol.Status, computedCRC: UInt32)
    /// A firmware-update session answered a message with ERROR.
    case firmwareUpdateError(sessionID: UInt16, code: FirmwareUpdateProtocol.ErrorCode, message: String)
    /// The `stopReadingAfterBytes` fault struck: no session data is read any more.
    case readingStopped(afterBytes: Int)
    /// `rebootDelayMs` after a successful firmware update: the accessory is gone. Disconnect it and
    /// start a new one from `profile.withFirmwareVersion(newFirmwareVersion)`.
    case reboot(newFirmwareVersion: String)
    /// The `vanishAfterBytes` fault struck: the accessory is gone. Cut its transport.
    case vanish
    /// Anything else the endpoint reported (link state, negotiation, control failures, power
    /// updates…); `bytesAvailable` and `spaceAvailable` are consumed by the behaviours.
    case endpoint(EndpointEvent)
}

/// Counters of one session.
public struct SessionStatistics: Hashable, Sendable {
    /// The EA session id the device chose.
    public var sessionID: UInt16
    /// The protocol the session speaks.
    public var protocolName: String
    /// What the simulator does on it.
    public var behaviour: SimulatorProfile.Behaviour
    /// Bytes read from the host.
    public var bytesIn = 0
    /// Bytes handed to the endpoint for the host.
    public var bytesOut = 0
    /// CRC-32 (``CRC32``) of every byte read from the host, in order.
    public var crc32In: UInt32 = 0
    /// Bytes the behaviour holds that the endpoint has not taken yet (echo data, firmware-update
    /// answers).
    public var pendingBytes = 0

    /// Creates empty counters for a session.
    public init(sessionID: UInt16, protocolName: String, behaviour: SimulatorProfile.Behaviour) {
        self.sessionID = sessionID
        self.protocolName = protocolName
        self.behaviour = behaviour
    }
}

/// What the fault injection did to outgoing frames.
public struct FaultCounters: Hashable, Sendable {
    /// Frames the endpoint produced.
    public var framesProduced = 0
    /// Frames dropped by `dropRate`.
    public var framesDropped = 0
    /// Frames with a byte changed by `corruptRate`.
    public var framesCorrupted = 0

    /// Creates zero counters.
    public init() {}
}
