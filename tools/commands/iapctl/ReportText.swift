// iapctl report: the report's text, section by section, and its formatting helpers.

import AccessoryHost
import USBDescriptors
import AccessoryLogging
import CLIKit
import Dispatch
import Glibc
import IAPAuthentication
import IAPInspect
import IAPLink
import IAPWire
import ProjectVersion
import Synchronization
import USBHost

extension ReportRun {
    // MARK: The text

    func render(fileName: String) -> String {
        var out: [String] = []
        let steps = self.steps
        var name = utsname()
        uname(&name)
        func field<T>(_ value: inout T) -> String {
            withUnsafeBytes(of: &value) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
        }
        out.append("iapctl report")
        out.append("=============")
        out.append("written:  \(WallClock.iso8601(.nanoseconds(Int64(started)))) by iapctl \(toolVersion())")
        out.append("system:   \(field(&name.sysname)) \(field(&name.release)) \(field(&name.machine))")
        out.append("command:  iapctl " + CommandLine.arguments.dropFirst().map { ReportText.shellQuoted($0.escapedForTerminal) }.joined(separator: " "))
        out.append("privacy:  " + (full ? "--full: serial numbers and the certificate are included"
                                         : "serial numbers, the certificate's subject and serial and the certificate bytes are left out (--full includes them)"))
        out.append("")
        out.append("RESULT: \(verdict.escapedForTerminal)")
        out.append("")
        out.append("STEPS (times from the start of the report)")
        for step in steps {
            out.append("  \(step.mark) \(at(step.time))  \(step.name): \(step.summary)")
            if let failure = step.failure { out.append("      ✘ \(shown(failure))") }
            for detail in step.details { out.append("      \(detail)") }
        }
        if let stop = steps.first(where: { $0.failure != nil }) {
            let cause = self.cause(of: stop)
            out.append("")
            out.append("WHERE IT STOPPED")
            out.append("  \(stop.name): \(shown(stop.failure ?? ""))")
            out.append("  cause (\(cause.kind.rawValue)): \(cause.summary)") // escaped and scrubbed where it was made
            for line in cause.evidence { out.append("    \(line)") }
            if stop.name == "open", daemonSocket != nil {
                out.append("  next: Stop iapd (below), then run the report again.")
            } else {
                out.append("  next: " + cause.advice)
            }
        }
        out += findingsSection()
        if let daemonSocket {
            out.append("")
            out.append("IAPD")
            out.append("  " + Self.daemonAdvice(daemonSocket) + ".")
        }
        if failures.count > 1 || (failures.count == 1 && wireIndex.map({ !failures[0].hasPrefix(wires[$0].location) }) ?? true) {
            out.append("")
            out.append("OTHER FAILURES")
            for failure in failures { out.append("  \(shown(failure))") }
        }
        out += connectionSection()
        out += usbSection()
        out += linkSection()
        out += authenticationSection()
        out += identificationSection()
        out += logSection()
        out += framesSection()
        out += traceSection(fileName: fileName)
        return out.joined(separator: "\n") + "\n"
    }

    func connectionSection() -> [String] {
        guard let index = wireIndex else { return [] }
        let wire = wires[index]
        var out = ["", "CONNECTION", "  transport: \(wire.kind.rawValue)", "  location:  \(shown(wire.location))"]
        if let accessory {
            out.append("  connection id: \(accessory.connectionID), protocol \(accessory.protocolVersion.rawValue), "
                       + (connectedAtEnd ? "still connected after the sessions" : "gone before the sessions were done"))
            for (time, id, reason) in departures where id == accessory.connectionID {
                out.append("  \(at(time)) disconnected: \(shown(reason))")
            }
        }
        if wires.count > 1 {
            out.append("  other traced connections: " + wires.enumerated().filter { $0.offset != index }.map { shown($0.element.location) }.joined(separator: "; "))
        }
        return out
    }

    func usbSection() -> [String] {
        guard let device = (accessory?.usbDevice ?? wireIndex.flatMap({ wires[$0].usb }))?.info else { return [] }
        let d = device.descriptor
        var out = ["", "USB DEVICE"]
        out.append("  id:            \(d.idString) (vendor 0x\(ReportText.hex4(d.vendorID)), product 0x\(ReportText.hex4(d.productID)))")
        out.append("  where:         bus \(device.bus) address \(device.address), port \(device.location), \(device.devicePath)")
        out.append("  manufacturer:  " + (device.manufacturer.map { "\"\(shown($0))\"" } ?? "(none)"))
        out.append("  product:       " + (device.product.map { "\"\(shown($0))\"" } ?? "(none)"))
        out.append("  serial:        " + serial(device.serialNumber))
        out.append("  release:       0x\(ReportText.hex4(d.release)), device class 0x\(ReportText.hex2(d.deviceClass)), "
                   + "\(d.configurationCount) configuration\(d.configurationCount == 1 ? "" : "s"), "
                   + "active: \(device.activeConfiguration.map(String.init) ?? "none")")
        for configuration in device.configurations {
            out.append("  configuration \(configuration.value): attributes 0x\(ReportText.hex2(configuration.attributes)), "
                       + "max power \(Int(configuration.maxPower) * 2) mA")
            for interface in configuration.interfaces {
                var line = "    interface \(interface.number) alt \(interface.alternateSetting): class \(interface.classTriple)"
                if let name = device.nativeInterfaceNames[interface.number] {
                    line += ", name \"\(shown(name))\""
                } else if interface.nameIndex != 0 {
                    line += ", name string \(interface.nameIndex) (not read)"
                }
                out.append(line)
                for endpoint in interface.endpoints { out.append("      \(endpoint)") }
            }
        }
        if let function = device.function {
            out.append("  iAP2 interface: configuration \(function.configurationValue), interface \(function.interface.number), "
                       + "\(function.bulkIn) / \(function.bulkOut)")
            for native in function.nativeInterfaces {
                out.append("  native transport: interface \(native.number) alt \(native.alternateSetting), \(native.bulkIn) / \(native.bulkOut)")
            }
        }
        return out
    }

    func linkSection() -> [String] {
        guard let statistics = linkStatistics else { return [] }
        return ["", "LINK COUNTERS (at the end)",
                "  packets sent \(statistics.packetsSent), received \(statistics.packetsReceived), retransmissions \(statistics.retransmissions), "
                    + "duplicates \(statistics.duplicatesReceived), out of order \(statistics.outOfOrderReceived), EAKs sent \(statistics.eaksSent) "
                    + "received \(statistics.eaksReceived), malformed SYNs \(statistics.malformedSYNsDropped), partial frames abandoned "
                    + "\(statistics.partialFramesAbandoned)"]
    }

    func authenticationSection() -> [String] {
        guard wireIndex != nil else { return [] }
        var out = ["", "AUTHENTICATION"]
        out.append("  policy:      --auth \(command.value("auth") ?? "record")" + (command.value("trust").map { ", --trust \(shown($0))" } ?? ", no --trust")
                   + (command.flag("check-validity") ? ", --check-validity" : ""))
        if let outcome = accessory?.identity.authentication {
            out.append("  verdict:     \(shown(outcome.description))")
            if outcome.status != .notChecked {
                out.append("  signature:   \(outcome.signatureVerified ? "verified" : "not verified")")
                out.append("  chain:       \(outcome.chainVerified ? "to a trust anchor" : "not verified")")
            }
        } else if let line = records.last(where: { $0.message.hasPrefix("authentication: ") }) {
            out.append("  verdict:     \(shown(String(line.message.dropFirst("authentication: ".count))))")
        } else if let index = wireIndex, FirstMessages(analysis.frames(on: index))[.authenticationFailed, fromAccessory: false] != nil {
            out.append("  verdict:     refused: \(shown(failureReason ?? "AuthenticationFailed"))")
        } else {
            out.append("  verdict:     none recorded")
        }
        if let certificate {
            out.append("  certificate:")
            out.append("    subject:   " + (full ? "\"\(certificate.subject.escapedForTerminal)\"" : ReportCommand.leftOut))
            out.append("    issuer:    \"\(shown(certificate.issuer))\"")
            out.append("    serial:    " + serial(certificate.serialNumber))
            out.append("    valid:     \(certificate.notBefore) to \(certificate.notAfter) (\(certificate.validity.rawValue))")
            out.append("    key:       \(shown(certificate.key))" + (certificate.scheme.map { ", \($0)" } ?? ""))
            out.append("    signature: \(shown(certificate.signatureAlgorithm))")
        }
        if let index = wireIndex, let der = analysis.certificates[index] {
            if full {
                out.append("  certificate bytes (\(der.count), as sent, base64):")
                out += base64Lines(der).map { "    " + $0 }
            } else {
                out.append("  certificate bytes (\(der.count)): \(ReportCommand.leftOut)")
            }
        }
        return out
    }

    func identificationSection() -> [String] {
        var out = ["", "IDENTIFICATION"]
        guard let identity = accessory?.identity else {
            if let index = wireIndex, let message = analysis.identifications[index] {
                out.append("  (not accepted; the IdentificationInformation as sent:)")
                var copy = message
                if !full {
                    copy.parameters = copy.parameters.map { parameter in
                        parameter.id == IdentificationParameter.serialNumber ? .string(parameter.id, ReportCommand.leftOut) : parameter
                    }
                }
                out += FrameInspector.describe(copy).map { "  " + shown($0) }
            } else {
                out.append("  not reached")
            }
            return out
        }
        func name(_ id: UInt16) -> String { "0x\(ReportText.hex4(id)) \(MessageID(id))" }
        out.append("  name:              \"\(shown(identity.name))\"")
        out.append("  model:             \"\(shown(identity.modelIdentifier))\"")
        out.append("  manufacturer:      \"\(shown(identity.manufacturer))\"")
        out.append("  serial number:     " + serial(identity.serialNumber))
        out.append("  firmware revision: \"\(shown(identity.firmwareVersion))\"")
        out.append("  hardware revision: \"\(shown(identity.hardwareVersion))\"")
        out.append("  protocol version:  \(identity.protocolVersion.rawValue)")
        out.append("  messages sent (\(identity.messagesSent.count)):")
        out += identity.messagesSent.map { "    " + name($0) }
        out.append("  messages received (\(identity.messagesReceived.count)):")
        out += identity.messagesReceived.map { "    " + name($0) }
        let power = ["none", "Lightning receptacle pass-through", "advanced"]
        out.append("  power:             provides \(identity.powerProvidingCapability < 3 ? power[Int(identity.powerProvidingCapability)] : "\(identity.powerProvidingCapability)"), "
                   + "draws up to \(identity.maximumCurrentDrawnFromDevice) mA from the device")
        out.append("  languages:         \(shown(identity.currentLanguage)) (supports \(identity.supportedLanguages.map(shown).joined(separator: ", ")))")
        if let team = identity.appMatchTeamID { out.append("  app match team id: \"\(shown(team))\"") }
        if let plan = identity.productPlanUID { out.append("  product plan UID:  \"\(shown(plan))\"") }
        out.append("  protocols (\(identity.protocols.count)):")
        for item in identity.protocols {
            let native = item.nativeTransportComponentIdentifier.map { component in
                ", native transport component \(component)"
                    + (accessory?.usbDevice?.nativeInterfaceNames.first { $0.value == item.name }.map { " (USB interface \($0.key))" } ?? "")
            } ?? ""
            out.append("    \(item.identifier)  \"\(shown(item.name))\"  match action \(item.matchAction)\(native)")
        }
        out.append("  transport components (\(identity.transportComponents.count)):")
        for component in identity.transportComponents {
            let address = component.bluetoothAddress.map { bytes in ", MAC " + bytes.map(ReportText.hex2).joined(separator: ":") } ?? ""
            out.append("    \(component.kindName) \(component.identifier) \"\(shown(component.name))\"\(component.supportsIAP2 ? ", iAP2" : "")\(address)")
        }
        return out
    }

    func logSection() -> [String] {
        var out = ["", "LOG (the host's lines at notice level and above, and the tolerated deviations)"]
        let notable = records.filter { $0.level >= .notice || $0.message.hasPrefix("tolerated") }
        if notable.isEmpty { out.append("  (none)") }
        for record in notable {
            let time = UInt64(max(0, record.timestamp.components.seconds)) * 1_000_000_000 + UInt64(record.timestamp.components.attoseconds / 1_000_000_000)
            var line = "  \(at(time)) \(record.level): \(shown(record.message))"
            for key in record.metadata.keys.sorted() { line += " \(key)=\(shown(record.metadata[key] ?? ""))" }
            out.append(line)
        }
        out.append("  (\(records.count - notable.count) lines at info and debug level not shown"
                   + (droppedRecords > 0 ? "; \(droppedRecords) older lines were not kept" : "") + ")")
        return out
    }

    func framesSection() -> [String] {
        guard let index = wireIndex else { return [] }
        let frames = analysis.frames(on: index)
        let limit = 200
        var out = ["", "FRAMES (\(frames.count) on this connection" + (frames.count > limit ? "; the first \(limit)" : "") + ")"]
        for (number, frame) in frames.prefix(limit).enumerated() {
            out.append("  #\(number + 1) \(at(frame.time)) \(frame.direction.arrow)  \(scrubbed(frame.summary))")
        }
        if frames.count > limit { out.append("  … \(frames.count - limit) more in the trace") }
        return out
    }

    func traceSection(fileName: String) -> [String] {
        var out = ["", "TRACE"]
        let withheld = !full && !analysis.iap1Interfaces.isEmpty
        if withheld {
            out.append("  Not embedded: the accessory spoke iAP1, and its serial number and certificate are not taken out of iAP1 frames.")
            out.append("  Run the report again with --full to embed it (it then holds them), or send the report as it is.")
            return out
        }
        let bytes = analysis.embeddedTrace
        out.append("  The whole exchange in pcapng (iapctl's trace format, \(bytes.count) bytes, \(analysis.frames.count) frames"
                   + (full ? "" : "; the serial numbers and certificate bytes overwritten in \(analysis.redactedFrames) frame\(analysis.redactedFrames == 1 ? "" : "s"), checksums recomputed") + ").")
        if analysis.cutPackets > 0 {
            out.append("  Session data is cut to its first \(TraceAnalysis.keptDataBytes) bytes per packet (\(analysis.cutPackets) packets, "
                       + "\(analysis.cutBytes) bytes left out; the packets encoded again with their checksums): for every byte, "
                       + "run the report with --trace-file FILE.pcapng.")
        }
        out.append("  Extract it, then read it with iapctl decode or Wireshark (tools/clients/wireshark/iap.lua):")
        out.append("    sed -n '/^-----BEGIN PCAPNG/,/^-----END PCAPNG/p' \(ReportText.shellQuoted(fileName)) | sed '1d;$d' | base64 -d > trace.pcapng")
        out.append("    iapctl decode --pcap trace.pcapng")
        out.append("-----BEGIN PCAPNG TRACE-----")
        out += base64Lines(bytes)
        out.append("-----END PCAPNG TRACE-----")
        return out
    }
}

/// The first frame of each control message, by id and sender: when, which way, and the length
/// of its parameter 0 (the certificate, the challenge, the response). Plain values, read once.
struct FirstMessages {
    /// One message's first frame.
    struct Entry {
        var time: UInt64
        var arrow: String
        var length: Int?
    }
    private var entries: [UInt32: Entry] = [:]

    @inline(never)
    init(_ frames: [TracedFrame]) {
        for frame in frames {
            guard let message = frame.message else { continue }
            let key = Self.key(message.id, frame.fromAccessory)
            if entries[key] == nil {
                entries[key] = Entry(time: frame.time, arrow: frame.direction.arrow, length: message.parameter(0).map { $0.data.count })
            }
        }
    }

    /// The first `id` sent by the accessory (or by the host).
    subscript(_ id: MessageID, fromAccessory fromAccessory: Bool) -> Entry? { entries[Self.key(id, fromAccessory)] }

    private static func key(_ id: MessageID, _ fromAccessory: Bool) -> UInt32 { UInt32(id.rawValue) << 1 | (fromAccessory ? 1 : 0) }
}

/// Small formatting helpers of the report.
enum ReportText {
    static func hex2(_ value: UInt8) -> String { value < 16 ? "0" + String(value, radix: 16, uppercase: true) : String(value, radix: 16, uppercase: true) }
    static func hex4(_ value: UInt16) -> String { hex2(UInt8(value >> 8)) + hex2(UInt8(value & 0xFF)) }

    /// Seconds with milliseconds, e.g. `0.012 s`.
    static func seconds(_ value: Double) -> String {
        let milliseconds = Int((value * 1000).rounded())
        let fraction = String(milliseconds % 1000)
        return "\(milliseconds / 1000)." + String(repeating: "0", count: 3 - fraction.count) + fraction + " s"
    }

    /// A duration in nanoseconds as milliseconds with one decimal, e.g. `1.3 ms`.
    static func milliseconds(_ nanoseconds: UInt64) -> String {
        let tenths = (nanoseconds + 50_000) / 100_000
        return "\(tenths / 10).\(tenths % 10) ms"
    }

    /// Bytes as hex and, where printable, as text: `69 61 70 … "iap…"`.
    static func preview(_ bytes: [UInt8]) -> String {
        let shown = bytes.prefix(32)
        let hex = shown.map(hex2).joined(separator: " ")
        let text = String(shown.map { $0 >= 0x20 && $0 < 0x7F ? Character(Unicode.Scalar($0)) : "." })
        return hex + (bytes.count > shown.count ? " …" : "") + "  \"\(text)\""
    }

    /// A word as a shell reads it back: as it is when it is plain, else in single quotes.
    static func shellQuoted(_ word: String) -> String {
        let plain = !word.isEmpty && word.unicodeScalars.allSatisfy { scalar in
            (scalar >= "a" && scalar <= "z") || (scalar >= "A" && scalar <= "Z") || (scalar >= "0" && scalar <= "9")
                || "-_./=:,+@%".unicodeScalars.contains(scalar)
        }
        return plain ? word : "'" + word.replacing("'", with: "'\\''") + "'"
    }

    /// SYN parameters in a line.
    static func parameters(_ p: LinkParameters) -> String {
        "v\(p.version), \(p.maxOutstandingPackets) packets of \(p.maxPacketLength) bytes, retransmission \(p.retransmissionTimeout) ms, "
            + "cumulative ACK \(p.cumulativeAckTimeout) ms, \(p.maxRetransmissions) retransmissions, \(p.maxCumulativeAcks) cumulative ACKs; "
            + "sessions " + p.sessions.map { "\($0.id) \($0.type) v\($0.version)" }.joined(separator: ", ")
    }
}
