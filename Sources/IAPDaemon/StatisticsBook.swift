internal import AccessoryHost
internal import IAPDaemonProtocol
internal import IAPLink
internal import IAPTransport

/// What iapd counts for its metrics and `stats`: the daemon's own events (clients, sessions,
/// failures, accessories coming and going) as they happen, and the accessories' link counters
/// whenever a reading is taken. Confined to the manager's queue (it lives in the server's core).
///
/// Counters never go back while the daemon runs. An accessory's link counters belong to its
/// transport connection, which outlives the accessory when its link restarts (the next
/// accessory identified on it goes on counting from there); so they are added up per connection,
/// as what it counted since the last reading (``LinkLedger``), and a connection that went away
/// leaves its last counts in the totals.
struct StatisticsBook {
    /// The counters so far; the gauges are filled in by ``reading(accessories:connecting:sessions:clients:)``.
    private(set) var counted: DaemonStatistics
    private var ledger = LinkLedger()
    /// Bytes of sessions that ended (those still open are read from their bridges).
    private var endedBytes: (toAccessory: Int, toClient: Int) = (0, 0)

    init(daemon: String, startTime: Double) {
        counted = DaemonStatistics(daemon: daemon, startTime: startTime)
    }

    /// The label of a transport kind: the in-memory transport is the built-in simulator's.
    static func label(_ kind: TransportKind) -> String {
        switch kind {
        case .usb: return "usb"
        case .serial: return "serial"
        case .bluetooth: return "bluetooth"
        case .memory, .gadget: return "simulated"
        }
    }

    // MARK: Events

    mutating func accessoryIdentified(_ accessory: Accessory) {
        let transport = Self.label(accessory.transportKind)
        counted.transports[named: transport].identifiedTotal += 1
        counted.authentications[named: accessory.authentication.statusName] += 1
    }

    /// An accessory went away: its connection's last counts go into the totals.
    mutating func accessoryDisconnected(_ accessory: Accessory, live: [Accessory]) {
        let transport = Self.label(accessory.transportKind)
        counted.transports[named: transport].disconnectedTotal += 1
        if let statistics = accessory.linkStatisticsOnQueue() {
            ledger.observe(connection: accessory.transportConnectionID, transport: transport, statistics, into: &counted)
        }
        ledger.departed(connection: accessory.transportConnectionID, live: Set(live.map(\.transportConnectionID)))
    }

    /// The kinds of ``DaemonStatistics/failures`` (their labels: ``DaemonStatistics/failureKinds``).
    enum Failure: String, CaseIterable {
        case transport
        case badRequest = "bad-request"
        case slowClient = "slow-client"
        case brokenRing = "broken-ring"
        case accept
    }

    /// Why a client was refused (``DaemonStatistics/clientRefusalReasons``).
    enum Refusal: String, CaseIterable {
        case permission
        case tooManyClients = "too-many-clients"
    }

    mutating func clientAccepted() { counted.clientsAcceptedTotal += 1 }
    mutating func clientRefused(_ reason: Refusal) { counted.clientsRefused[named: reason.rawValue] += 1 }
    mutating func failure(_ kind: Failure) { counted.failures[named: kind.rawValue] += 1 }
    mutating func openFailed(_ code: DaemonFailure.Code) { counted.openFailures[named: code.rawValue] += 1 }
    mutating func sessionOpened() { counted.sessionsOpenedTotal += 1 }

    /// A session ended having moved these bytes.
    mutating func sessionEnded(toAccessory: Int, toClient: Int) {
        endedBytes.toAccessory += toAccessory
        endedBytes.toClient += toClient
    }

    // MARK: Readings

    /// The statistics now: the counters, the accessories' link counters read now, and the gauges.
    /// `sessions` are the bridges open now.
    mutating func reading(accessories: [Accessory], connecting: [TransportKind], sessions: [SessionBridge], clients: Int) -> DaemonStatistics {
        for accessory in accessories {
            guard let statistics = accessory.linkStatisticsOnQueue() else { continue }
            ledger.observe(connection: accessory.transportConnectionID, transport: Self.label(accessory.transportKind), statistics, into: &counted)
        }
        var result = counted
        for accessory in accessories { result.transports[named: Self.label(accessory.transportKind)].identifiedNow += 1 }
        for kind in connecting { result.transports[named: Self.label(kind)].connectingNow += 1 }
        result.sessionsNow = sessions.count
        result.bytesClientToAccessoryTotal = endedBytes.toAccessory
        result.bytesAccessoryToClientTotal = endedBytes.toClient
        for bridge in sessions {
            result.bytesClientToAccessoryTotal += bridge.bytesToAccessory
            result.bytesAccessoryToClientTotal += bridge.bytesToClient
        }
        result.clientsNow = clients
        return result
    }
}

/// The link counters of each transport connection as last read, so that each reading adds only
/// what was counted since (``observe(connection:transport:_:into:)``).
///
/// A connection whose accessory went away is remembered (its accessory may be identified again
/// on it), the newest ``departedKept`` of them; one still live is never forgotten. Memory is
/// bounded by the connections live plus those.
struct LinkLedger {
    /// How many connections whose accessory went away are remembered.
    static let departedKept = 256

    private var seen: [Int: LinkStatistics] = [:]
    private var departedOrder: [Int] = []

    /// Adds what `connection` counted since it was last read to `statistics`' totals for `transport`.
    /// Counters lower than last time (a link that started from zero again) count from zero.
    mutating func observe(connection: Int, transport: String, _ now: LinkStatistics, into statistics: inout DaemonStatistics) {
        let last = seen[connection] ?? LinkStatistics()
        let restarted = now.packetsSent < last.packetsSent || now.packetsReceived < last.packetsReceived
            || now.retransmissions < last.retransmissions || now.linkResets < last.linkResets
        let base = restarted ? LinkStatistics() : last
        statistics.transports[named: transport].linkPacketsSentTotal += now.packetsSent - base.packetsSent
        statistics.transports[named: transport].linkPacketsReceivedTotal += now.packetsReceived - base.packetsReceived
        statistics.transports[named: transport].linkRetransmissionsTotal += now.retransmissions - base.retransmissions
        statistics.transports[named: transport].linkResetsTotal += now.linkResets - base.linkResets
        seen[connection] = now
    }

    /// `connection`'s accessory went away; `live` are the connections with an accessory now.
    mutating func departed(connection: Int, live: Set<Int>) {
        if let index = departedOrder.firstIndex(of: connection) { departedOrder.remove(at: index) }
        departedOrder.append(connection)
        while departedOrder.count > Self.departedKept {
            let oldest = departedOrder.removeFirst()
            if !live.contains(oldest) { seen[oldest] = nil }
        }
    }

    /// Connections remembered (tests: the bound holds).
    var count: Int { seen.count }
}
