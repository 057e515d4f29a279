/// The daemon's counters and gauges at one moment: what ``ClientRequest/stats`` answers
/// (``DaemonReply/statistics(_:)``), what `iapctl stats` prints and what iapd's metrics file
/// carries (docs/DAEMON.md, "Metrics").
///
/// Counters (named `…Total`, or a dictionary of counts) only grow while the daemon runs: what
/// an accessory counted is kept after it goes away, and a reconnection adds to it. Gauges
/// (`…Now`, ``accessories``) are the state at the moment. Every list holds every kind it is
/// keyed by, zeros included, in a fixed order, so that a reader sees the same series each time.
package struct DaemonStatistics: Codable, Sendable, Hashable {
    /// The daemon's name and version (`iapd 0.3.0`).
    package var daemon: String
    /// When the daemon started, seconds since the Unix epoch.
    package var startTime: Double
    /// Per kind of transport (``TransportStatistics/transports``, in that order).
    package var transports: [TransportStatistics]
    /// Accessories identified, by the verdict of their authentication (``authenticationOutcomes``,
    /// in that order): `verified`, `not-verified` (let in by a recording policy), `not-checked`.
    /// One a `require` policy refused is never identified: it counts as a transport failure.
    package var authentications: [Count]
    /// Sessions open now.
    package var sessionsNow: Int
    /// Sessions opened since the daemon started.
    package var sessionsOpenedTotal: Int
    /// Session bytes the accessories took from clients (handed to their links).
    package var bytesClientToAccessoryTotal: Int
    /// Session bytes the accessories sent that went into clients' rings.
    package var bytesAccessoryToClientTotal: Int
    /// Clients connected now.
    package var clientsNow: Int
    /// Clients served since the daemon started (refused ones not included).
    package var clientsAcceptedTotal: Int
    /// Clients refused, by reason (``clientRefusalReasons``): `permission` (not root, not in the
    /// group), `too-many-clients`.
    package var clientsRefused: [Count]
    /// Opens that failed, by ``DaemonFailure/Code`` (``openFailureCodes``, in that order).
    package var openFailures: [Count]
    /// Other failures, by kind (``failureKinds``, in that order): `transport` (a transport failed
    /// before its accessory was identified: a failed handshake, a USB device reset, a refused
    /// authentication), `bad-request` (a client dropped for breaking the protocol),
    /// `slow-client` (one dropped for leaving its events unread), `broken-ring` (a session
    /// closed because its client broke the shared ring), `accept` (a client could not be
    /// accepted: out of descriptors…).
    package var failures: [Count]

    /// The transport labels, in the order of ``transports``: `usb`, `serial`, `bluetooth`,
    /// `simulated` (the built-in simulator, whose transport is `memory`).
    package static let transportNames = ["usb", "serial", "bluetooth", "simulated"]
    /// The states an accessory is counted in: `identified` (authenticated and identified: what
    /// clients see) and `connecting` (its transport is attached; link, authentication or
    /// identification under way).
    package static let accessoryStates = ["identified", "connecting"]
    /// The outcomes of ``authentications``.
    package static let authenticationOutcomes = ["verified", "not-verified", "not-checked"]
    /// The reasons of ``clientsRefused``.
    package static let clientRefusalReasons = ["permission", "too-many-clients"]
    /// The codes of ``openFailures``: those an open can fail with.
    package static let openFailureCodes: [DaemonFailure.Code] = [.noSuchAccessory, .unsupportedProtocol, .protocolInUse, .refused,
                                                                .tooManySessions, .failed]
    /// The kinds of ``failures``.
    package static let failureKinds = ["transport", "bad-request", "slow-client", "broken-ring", "accept"]

    /// Statistics of a daemon that started at `startTime` and has counted nothing yet.
    package init(daemon: String, startTime: Double) {
        self.daemon = daemon
        self.startTime = startTime
        transports = Self.transportNames.map { TransportStatistics(transport: $0) }
        authentications = Self.authenticationOutcomes.map { Count($0) }
        sessionsNow = 0
        sessionsOpenedTotal = 0
        bytesClientToAccessoryTotal = 0
        bytesAccessoryToClientTotal = 0
        clientsNow = 0
        clientsAcceptedTotal = 0
        clientsRefused = Self.clientRefusalReasons.map { Count($0) }
        openFailures = Self.openFailureCodes.map { Count($0.rawValue) }
        failures = Self.failureKinds.map { Count($0) }
    }

    /// The transport's statistics, by its label.
    package func transport(_ name: String) -> TransportStatistics? { transports.first { $0.transport == name } }

    /// Accessories identified now, on every transport.
    package var accessoriesIdentifiedNow: Int { transports.reduce(0) { $0 + $1.identifiedNow } }
}

/// A count under a name (a label value: a transport, an outcome, a failure code or kind).
package struct Count: Codable, Sendable, Hashable {
    /// What is counted.
    package var name: String
    /// How many.
    package var count: Int

    /// `count` of `name`.
    package init(_ name: String, _ count: Int = 0) {
        self.name = name
        self.count = count
    }
}

extension [Count] {
    /// The count named `name` (0 when it is not listed).
    package subscript(named name: String) -> Int {
        get { first { $0.name == name }?.count ?? 0 }
        set {
            if let index = firstIndex(where: { $0.name == name }) { self[index].count = newValue } else { append(Count(name, newValue)) }
        }
    }
}

extension [TransportStatistics] {
    /// The statistics of the transport labelled `name` (a new one at zero when it is not listed).
    package subscript(named name: String) -> TransportStatistics {
        get { first { $0.transport == name } ?? TransportStatistics(transport: name) }
        set {
            if let index = firstIndex(where: { $0.transport == name }) { self[index] = newValue } else { append(newValue) }
        }
    }
}

/// The accessories and link counters of one kind of transport.
package struct TransportStatistics: Codable, Sendable, Hashable {
    /// `usb`, `serial`, `bluetooth` or `simulated` (``DaemonStatistics/transportNames``).
    package var transport: String
    /// Accessories identified now.
    package var identifiedNow = 0
    /// Transports attached now whose accessory is not identified yet.
    package var connectingNow = 0
    /// Accessories identified since the daemon started (each reconnection counts).
    package var identifiedTotal = 0
    /// Accessories that went away since the daemon started.
    package var disconnectedTotal = 0
    /// iAP2 link packets sent (SYN and data, retransmissions included).
    package var linkPacketsSentTotal = 0
    /// iAP2 link packets received whose checksums verified.
    package var linkPacketsReceivedTotal = 0
    /// Data packets the host sent again (the accessory did not acknowledge them in time, or
    /// asked for them again). On a reliable wire (USB, RFCOMM) they mean the host sends faster
    /// than the accessory acknowledges.
    package var linkRetransmissionsTotal = 0
    /// Times a link started over after it was up (the accessory restarted it, or the host
    /// reset it); the accessory is identified again after each.
    package var linkResetsTotal = 0

    /// A transport that counted nothing yet.
    package init(transport: String) {
        self.transport = transport
    }
}
