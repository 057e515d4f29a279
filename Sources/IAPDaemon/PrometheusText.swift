package import IAPDaemonProtocol

/// iapd's statistics in Prometheus's text exposition format (version 0.0.4): what
/// ``MetricsExporter`` writes for node_exporter's textfile collector.
///
/// Every family has its `# HELP` and `# TYPE` lines; counters end in `_total`; every name starts
/// with `iapd_`. Each family lists every value of its labels, zeros included, so the series are
/// the same from one file to the next and 64 accessories cost no more than one (no series is
/// per accessory). The families are in docs/DAEMON.md, "Metrics".
package enum PrometheusText {
    /// The content type node_exporter and Prometheus read this format as.
    package static let contentType = "text/plain; version=0.0.4"

    /// `statistics` as a complete exposition, ending in a newline.
    package static func render(_ statistics: DaemonStatistics) -> String {
        var out = Writer()
        out.family("iapd_info", .gauge, "The daemon's name and version, and the client protocol it speaks (always 1).",
                   [([("daemon", statistics.daemon), ("protocol", String(DaemonProtocol.version))], 1)])
        out.family("iapd_start_time_seconds", .gauge, "When the daemon started, seconds since the Unix epoch.",
                   [([], statistics.startTime)])
        let transports = statistics.transports
        out.family("iapd_accessories", .gauge,
                   "Accessories now, by transport and state (identified: clients see it; connecting: link, authentication or identification under way).",
                   transports.flatMap { transport in
                       [([("transport", transport.transport), ("state", "identified")], Double(transport.identifiedNow)),
                        ([("transport", transport.transport), ("state", "connecting")], Double(transport.connectingNow))]
                   })
        out.family("iapd_accessories_identified_total", .counter, "Accessories identified, by transport (each reconnection counts).",
                   transports.map { ([("transport", $0.transport)], Double($0.identifiedTotal)) })
        out.family("iapd_accessories_disconnected_total", .counter, "Accessories that went away, by transport.",
                   transports.map { ([("transport", $0.transport)], Double($0.disconnectedTotal)) })
        out.family("iapd_authentications_total", .counter,
                   "Accessories identified, by the outcome of their authentication (one a require policy refused counts as a transport failure).",
                   statistics.authentications.map { ([("outcome", $0.name)], Double($0.count)) })
        out.family("iapd_sessions_open", .gauge, "Sessions clients hold now.", [([], Double(statistics.sessionsNow))])
        out.family("iapd_sessions_opened_total", .counter, "Sessions opened.", [([], Double(statistics.sessionsOpenedTotal))])
        out.family("iapd_session_bytes_total", .counter,
                   "Session bytes moved, by direction (client-to-accessory: taken by the accessory's link; accessory-to-client: put in the client's ring).",
                   [([("direction", "client-to-accessory")], Double(statistics.bytesClientToAccessoryTotal)),
                    ([("direction", "accessory-to-client")], Double(statistics.bytesAccessoryToClientTotal))])
        out.family("iapd_link_packets_total", .counter, "iAP2 link packets, by transport and direction (sent: SYN and data, retransmissions included).",
                   transports.flatMap { transport in
                       [([("transport", transport.transport), ("direction", "sent")], Double(transport.linkPacketsSentTotal)),
                        ([("transport", transport.transport), ("direction", "received")], Double(transport.linkPacketsReceivedTotal))]
                   })
        out.family("iapd_link_retransmissions_total", .counter,
                   "iAP2 data packets the host sent again, by transport (on USB or Bluetooth: the host sends faster than the accessory acknowledges).",
                   transports.map { ([("transport", $0.transport)], Double($0.linkRetransmissionsTotal)) })
        out.family("iapd_link_resets_total", .counter,
                   "iAP2 links that started over after they were up (the accessory restarted, or the host reset it), by transport.",
                   transports.map { ([("transport", $0.transport)], Double($0.linkResetsTotal)) })
        out.family("iapd_clients_connected", .gauge, "Client processes connected now.", [([], Double(statistics.clientsNow))])
        out.family("iapd_clients_accepted_total", .counter, "Client connections served.", [([], Double(statistics.clientsAcceptedTotal))])
        out.family("iapd_clients_refused_total", .counter, "Client connections refused, by reason.",
                   statistics.clientsRefused.map { ([("reason", $0.name)], Double($0.count)) })
        out.family("iapd_open_failures_total", .counter, "Session opens that failed, by the failure code clients were sent.",
                   statistics.openFailures.map { ([("code", $0.name)], Double($0.count)) })
        out.family("iapd_failures_total", .counter,
                   "Failures by kind (transport: before an accessory was identified; bad-request, slow-client: clients dropped; broken-ring: a session closed because its client broke the ring; accept: a client not accepted).",
                   statistics.failures.map { ([("kind", $0.name)], Double($0.count)) })
        return out.text
    }

    /// The type of a metric family.
    package enum MetricType: String, Sendable {
        /// Only grows (a reset is the process starting again).
        case counter
        /// Goes up and down.
        case gauge
    }

    /// A label value as the format wants it between double quotes: backslash, double quote and
    /// line feed escaped (`\\`, `\"`, `\n`); everything else, UTF-8 included, as it is.
    package static func escapeLabelValue(_ value: String) -> String {
        guard value.utf8.contains(where: { $0 == UInt8(ascii: "\\") || $0 == UInt8(ascii: "\"") || $0 == UInt8(ascii: "\n") }) else {
            return value
        }
        var out = ""
        out.reserveCapacity(value.utf8.count + 8)
        for character in value.unicodeScalars {
            switch character {
            case "\\": out += "\\\\"
            case "\"": out += "\\\""
            case "\n": out += "\\n"
            default: out.unicodeScalars.append(character)
            }
        }
        return out
    }

    /// A help text as the format wants it: backslash and line feed escaped (`\\`, `\n`).
    package static func escapeHelp(_ text: String) -> String {
        var out = ""
        out.reserveCapacity(text.utf8.count)
        for character in text.unicodeScalars {
            switch character {
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            default: out.unicodeScalars.append(character)
            }
        }
        return out
    }

    /// A sample value: integers without a fraction (every count), others in Swift's shortest
    /// form that reads back the same (which Prometheus parses).
    static func format(_ value: Double) -> String {
        if value.isNaN { return "NaN" }
        if value.isInfinite { return value < 0 ? "-Inf" : "+Inf" }
        if value == value.rounded(), abs(value) < 9.0e15 { return String(Int64(value)) }
        return value.description
    }

    /// Builds an exposition family by family.
    struct Writer {
        var text = ""

        init() {
            text.reserveCapacity(8 * 1024)
        }

        mutating func family(_ name: String, _ type: MetricType, _ help: String, _ samples: [(labels: [(String, String)], value: Double)]) {
            text += "# HELP \(name) \(PrometheusText.escapeHelp(help))\n# TYPE \(name) \(type.rawValue)\n"
            for sample in samples {
                text += name
                if !sample.labels.isEmpty {
                    text += "{"
                    text += sample.labels.map { "\($0.0)=\"\(PrometheusText.escapeLabelValue($0.1))\"" }.joined(separator: ",")
                    text += "}"
                }
                text += " \(PrometheusText.format(sample.value))\n"
            }
        }
    }
}
