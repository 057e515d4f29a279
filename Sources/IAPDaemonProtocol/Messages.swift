package import IAPLink

/// The client protocol of `iapd`, the daemon that owns accessories and shares them between
/// processes (docs/DAEMON.md describes it for people writing other clients).
///
/// A client connects to the daemon's Unix stream socket and exchanges messages: each is a
/// 4-byte big-endian length and that many bytes of one JSON object (``MessageFramer``). The
/// client says ``ClientRequest/hello(version:client:)`` first; the daemon answers
/// ``DaemonReply/welcome(version:daemon:accessories:)`` and from then on sends every connect and
/// disconnect as an event. An opened session is not carried on this connection: its reply
/// comes with two descriptors (`SCM_RIGHTS`): a Unix stream socket of its own, and a `memfd`
/// holding the session's two byte rings and their counters (docs/DAEMON.md, "Session rings";
/// `SharedRingMemory` lays it out). The rings carry the bytes; the socket carries wake-ups and
/// is the session's lifetime: closing it closes the session.
package enum DaemonProtocol {
    /// The version this build speaks. Version 2 added ``DaemonReply/appLaunchRequested(accessory:bundleIdentifier:)``
    /// and ``DaemonReply/transportFailed(location:reason:)``; version 3 carries sessions in
    /// shared rings, with the accessory's acknowledgements, instead of in the socket's bytes.
    package static let version = 3
    /// The oldest client version a daemon of this build serves. A daemon refuses a client
    /// outside ``oldestVersion`` … ``version``, naming both versions (a version 2 client would
    /// read its session from the socket, which carries none of its bytes now).
    package static let oldestVersion = 3

    /// The failure's message when a client's version is not served: both versions, and what to do.
    package static func versionMismatch(daemon: ClosedRange<Int>, client: Int) -> String {
        let served = daemon.count == 1 ? "protocol \(daemon.lowerBound)" : "protocol \(daemon.lowerBound) to \(daemon.upperBound)"
        let advice = client < daemon.lowerBound ? "update the client (its library) to the release of this iapd" : "update iapd to the client's release"
        return "this iapd speaks \(served), the client protocol \(client): \(advice)"
    }
    /// Where the daemon listens unless configured otherwise.
    package static let defaultSocketPath = "/run/iapd/iapd.sock"
    /// The environment variable that names another socket (for clients and the daemon).
    package static let socketEnvironmentVariable = "IAPD_SOCKET"
    /// The longest request the daemon reads (a request is small: hello, list, open, stats).
    package static let maximumRequestLength = 16 * 1024
    /// The longest message a client reads (a list of many accessories).
    package static let maximumReplyLength = 8 * 1024 * 1024
    /// The longest protocol string a request may name (iAP2 strings are short reverse-DNS names).
    package static let maximumProtocolStringLength = 255
    /// The longest client name a hello may carry.
    package static let maximumClientNameLength = 256
}

/// A request from a client, with the number the client gave it (echoed in the reply).
package struct ClientMessage: Codable, Sendable, Hashable {
    /// Chosen by the client; the reply carries it back.
    package var id: UInt32
    /// What the client asks for.
    package var request: ClientRequest

    /// A request numbered `id`.
    package init(id: UInt32, request: ClientRequest) {
        self.id = id
        self.request = request
    }
}

/// What a client can ask of the daemon.
package enum ClientRequest: Codable, Sendable, Hashable {
    /// The first message: the protocol version the client speaks and a name for the logs.
    case hello(version: Int, client: String)
    /// The accessories connected now.
    case list
    /// Opens a session for `protocolString` on accessory `accessory` (an id from the daemon's
    /// records). The reply carries the session's socket.
    case open(accessory: Int, protocolString: String)
    /// Answered at once with ``DaemonReply/pong``: a round trip through the daemon.
    case ping
    /// The daemon's counters and gauges (``DaemonReply/statistics(_:)``), after hello. Added
    /// within protocol 3: an iapd older than it cannot decode it and answers ``DaemonFailure/Code/badRequest``
    /// (without the request's id) and drops the client, which then says that iapd is too old.
    case stats

    /// Checks the request's fields against the protocol's limits; nil when they hold, else why not.
    package var invalidity: String? {
        switch self {
        case let .hello(version, client):
            if version < 1 { return "hello: version \(version) is not a protocol version" }
            if client.utf8.count > DaemonProtocol.maximumClientNameLength { return "hello: the client name is longer than \(DaemonProtocol.maximumClientNameLength) bytes" }
        case let .open(accessory, protocolString):
            if accessory <= 0 { return "open: \(accessory) is not an accessory id" }
            if protocolString.isEmpty { return "open: the protocol string is empty" }
            if protocolString.utf8.count > DaemonProtocol.maximumProtocolStringLength {
                return "open: the protocol string is longer than \(DaemonProtocol.maximumProtocolStringLength) bytes"
            }
            if protocolString.unicodeScalars.contains(where: { $0.value < 0x20 || $0.value == 0x7F }) {
                return "open: the protocol string holds control characters"
            }
        case .list, .ping, .stats:
            break
        }
        return nil
    }
}

/// A message from the daemon: a reply (with the request's id) or an event (id nil).
package struct DaemonMessage: Codable, Sendable, Hashable {
    /// The request this answers; nil for events.
    package var id: UInt32?
    /// The reply or event.
    package var reply: DaemonReply

    /// A reply to request `id`, or an event when `id` is nil.
    package init(id: UInt32?, reply: DaemonReply) {
        self.id = id
        self.reply = reply
    }
}

/// What the daemon says.
package enum DaemonReply: Codable, Sendable, Hashable {
    /// Answers hello: the daemon's protocol version, its build, and the accessories now.
    case welcome(version: Int, daemon: String, accessories: [AccessoryRecord])
    /// Answers list.
    case accessories([AccessoryRecord])
    /// Answers open: the session's socket and shared memory come with this message, in that order.
    case opened(accessory: Int, protocolString: String, session: Int)
    /// Answers ping.
    case pong
    /// Answers stats: the daemon's counters and gauges now.
    case statistics(DaemonStatistics)
    /// A request failed (or, with id nil, the daemon is dropping the client and says why).
    case failure(DaemonFailure)
    /// Event: an accessory was identified.
    case connected(AccessoryRecord)
    /// Event: an accessory went away.
    case disconnected(accessory: Int, reason: String)
    /// Event (protocol 2): an accessory asked for an application to be launched
    /// (RequestAppLaunch); `bundleIdentifier` is empty when it named none.
    case appLaunchRequested(accessory: Int, bundleIdentifier: String)
    /// Event (protocol 2): something went wrong on a transport before its accessory was
    /// identified (a failed handshake, a USB device reset because its link did not come up);
    /// `location` names the transport, `reason` says what happened and what to do.
    case transportFailed(location: String, reason: String)
}

/// Why a request failed, in a form a client can act on and a person can read.
package struct DaemonFailure: Codable, Sendable, Hashable, Error, CustomStringConvertible {
    /// What kind of failure.
    package enum Code: String, Codable, Sendable, Hashable {
        /// The request was malformed or broke a limit; the client is dropped.
        case badRequest = "bad-request"
        /// The client speaks another protocol version.
        case version
        /// The client is not allowed (not root, not in the socket's group).
        case permission
        /// No accessory has that id (it went away).
        case noSuchAccessory = "no-such-accessory"
        /// The accessory does not declare the protocol.
        case unsupportedProtocol = "unsupported-protocol"
        /// Another client holds a session for the protocol on that accessory.
        case protocolInUse = "protocol-in-use"
        /// The accessory refused or did not answer the session.
        case refused
        /// The client holds as many sessions as the daemon allows one client.
        case tooManySessions = "too-many-sessions"
        /// Anything else (the daemon could not make a socket…).
        case failed
    }

    /// What kind of failure.
    package var code: Code
    /// The failure in a sentence, with what to do.
    package var message: String
    /// For ``Code/protocolInUse``: who holds the session (pid and command line).
    package var holder: SessionHolder?

    /// A failure.
    package init(_ code: Code, _ message: String, holder: SessionHolder? = nil) {
        self.code = code
        self.message = message
        self.holder = holder
    }

    /// The message.
    package var description: String { message }
}

/// The process that holds a session, as the kernel identified it when it connected.
package struct SessionHolder: Codable, Sendable, Hashable, CustomStringConvertible {
    /// Its process id.
    package var pid: Int32
    /// Its user id.
    package var uid: UInt32
    /// Its command line (arguments joined by spaces), or empty when it could not be read.
    package var command: String

    /// A holder.
    package init(pid: Int32, uid: UInt32, command: String) {
        self.pid = pid
        self.uid = uid
        self.command = command
    }

    /// `pid 1234 (iapctl open com.example.echo)`.
    package var description: String { command.isEmpty ? "pid \(pid)" : "pid \(pid) (\(command))" }
}

/// An accessory as the daemon describes it to clients.
package struct AccessoryRecord: Codable, Sendable, Hashable {
    /// The daemon's id for it (unique while the daemon runs; a reconnection gets a new one).
    package var id: Int
    /// Everything it declared in identification, and its authentication outcome.
    package var identity: AccessoryIdentity
    /// The kind of wire (`usb`, `serial`, `memory`, `gadget`, `bluetooth`).
    package var transportKind: String
    /// Where it is attached, as the daemon names it.
    package var location: String
    /// The USB device, for accessories on USB.
    package var usb: USBDeviceRecord?
    /// The accessory's Bluetooth address (`00:1A:7D:DA:71:13`), for accessories on Bluetooth;
    /// absent from older daemons' records.
    package var bluetoothAddress: String?

    /// A record.
    package init(id: Int, identity: AccessoryIdentity, transportKind: String, location: String, usb: USBDeviceRecord? = nil,
                bluetoothAddress: String? = nil) {
        self.id = id
        self.identity = identity
        self.transportKind = transportKind
        self.location = location
        self.usb = usb
        self.bluetoothAddress = bluetoothAddress
    }
}

/// The USB facts of an accessory a client may want (to follow a device that re-enumerates).
package struct USBDeviceRecord: Codable, Sendable, Hashable {
    /// Bus number.
    package var bus: UInt8
    /// Address on the bus.
    package var address: UInt8
    /// Hub ports from the root.
    package var portPath: [UInt8]
    /// idVendor.
    package var vendorID: UInt16
    /// idProduct.
    package var productID: UInt16
    /// bcdDevice.
    package var release: UInt16
    /// The iManufacturer string.
    package var manufacturer: String?
    /// The iProduct string.
    package var product: String?
    /// The iSerialNumber string.
    package var serialNumber: String?

    /// A record of the given facts.
    package init(bus: UInt8, address: UInt8, portPath: [UInt8], vendorID: UInt16, productID: UInt16, release: UInt16,
                manufacturer: String?, product: String?, serialNumber: String?) {
        self.bus = bus
        self.address = address
        self.portPath = portPath
        self.vendorID = vendorID
        self.productID = productID
        self.release = release
        self.manufacturer = manufacturer
        self.product = product
        self.serialNumber = serialNumber
    }
}
