internal import IAPLink
internal import IAPWire

extension SimulatorProfile {
    /// Bytes of the AuthenticationCertificate message the simulator sends without an
    /// `authentication` section: its test certificate (``testCredentials()``), or the endpoint's
    /// 608-byte stand-in, whichever is longer.
    static let certificateMessageLength = ControlMessage.headerSize + Parameter.headerSize
        + max(608, (try? testCredentials().certificate.count) ?? 0)

    /// Checks every value, naming the first field that is wrong and what to do about it.
    public func validate() throws(SimulatorProfileError) {
        func fail(_ field: String, _ problem: String) -> SimulatorProfileError {
            SimulatorProfileError(field: field, problem: problem)
        }
        let strings: [(String, String)] = [
            ("name", accessory.name), ("model", accessory.model), ("manufacturer", accessory.manufacturer),
            ("serialNumber", accessory.serialNumber), ("firmwareVersion", accessory.firmwareVersion),
            ("hardwareVersion", accessory.hardwareVersion),
        ]
        for (key, value) in strings where value.isEmpty {
            throw fail("identity.\(key)", "is empty; give it a value (any non-empty text)")
        }
        if protocols.isEmpty {
            throw fail("protocols", "lists no protocol; declare at least one, e.g. { \"name\": \"com.example.echo\", \"behaviour\": \"echo\" }")
        }
        if protocols.count > 255 {
            throw fail("protocols", "lists \(protocols.count) protocols; iAP2 identifies them with one byte, so at most 255")
        }
        var names = Set<String>()
        for (index, spec) in protocols.enumerated() {
            let path = "protocols[\(index)]"
            if spec.name.isEmpty { throw fail("\(path).name", "is empty; give the reverse-DNS protocol string, e.g. com.example.echo") }
            if !names.insert(spec.name).inserted {
                throw fail("\(path).name", "'\(spec.name)' is declared twice; give each protocol a different name")
            }
            switch (spec.behaviour, spec.sourceBytes) {
            case (.source, nil):
                throw fail("\(path).sourceBytes", "is missing; a source protocol needs the number of bytes it sends, e.g. 1048576")
            case let (.source, bytes?) where bytes < 0:
                throw fail("\(path).sourceBytes", "is \(bytes); give a byte count of 0 or more")
            case (.source, _), (_, nil):
                break
            case (_, _?):
                throw fail("\(path).sourceBytes", "only a source protocol sends bytes on its own; remove sourceBytes or set behaviour to \"source\"")
            }
            if spec.startsOnRequest == true, spec.behaviour != .source {
                throw fail("\(path).startsOnRequest", "only a source starts on request; remove it or set behaviour to \"source\"")
            }
        }
        let native = protocols.filter(\.isNative).count
        if iap1 != nil, let index = protocols.firstIndex(where: \.isNative) {
            throw fail("protocols[\(index)].native", "iAP1 has no native transport; remove \"native\" or the \"iap1\" section")
        }
        if iap1 != nil, faults.dropRate > 0 || faults.corruptRate > 0 {
            throw fail(faults.dropRate > 0 ? "faults.dropRate" : "faults.corruptRate",
                       "iAP1 has no retransmission, so a dropped or corrupted packet would stall its session for good; leave it at 0 with \"iap1\"")
        }
        if let index = faults.losesFrames.firstIndex(where: { $0 < 1 }) {
            throw fail("faults.losesFrames[\(index)]", "frames are numbered from 1 (the accessory's first frame); use 1 or more")
        }
        if iap1 != nil, !faults.ignoresMessages.isEmpty || !faults.losesFrames.isEmpty {
            throw fail(faults.ignoresMessages.isEmpty ? "faults.losesFrames" : "faults.ignoresMessages",
                       "plays an iAP2 accessory; remove it or the \"iap1\" section")
        }
        if iap1 != nil, let index = protocols.firstIndex(where: { $0.name.utf8.count > 200 }) {
            throw fail("protocols[\(index)].name", "is longer than the 200 bytes an iAP1 EAProtocolToken carries; shorten it")
        }
        if native > SimulatorProfile.maxNativeTransports {
            throw fail("protocols", "marks \(native) protocols native; a simulated USB accessory has room for \(SimulatorProfile.maxNativeTransports) native-transport interfaces, so mark fewer")
        }
        let overrides: [(String, Int?, LinkParameters.Field)] = [
            ("maxPacketLength", link.maxPacketLength, .maxPacketLength),
            ("maxOutstandingPackets", link.maxOutstandingPackets, .maxOutstandingPackets),
            ("retransmissionTimeoutMs", link.retransmissionTimeoutMs, .retransmissionTimeout),
            ("cumulativeAckTimeoutMs", link.cumulativeAckTimeoutMs, .cumulativeAckTimeout),
            ("maxCumulativeAcks", link.maxCumulativeAcks, .maxCumulativeAcks),
            ("maxRetransmissions", link.maxRetransmissions, .maxRetransmissions),
            ("sendsPacketLength", link.sendsPacketLength, .maxPacketLength),
        ]
        for case let (key, value?, field) in overrides where !field.validRange.contains(value) {
            throw fail("link.\(key)", "is \(value); the link allows \(field.validRange.lowerBound)…\(field.validRange.upperBound)")
        }
        // Control messages travel one per link packet: the largest must fit.
        let largest = max(identity().message.encodedLength, Self.certificateMessageLength)
        let needed = largest + LinkPacketHeader.overhead
        if needed > LinkParameters.Field.maxPacketLength.validRange.upperBound {
            throw fail("protocols", "make the identification \(largest) bytes long, more than one iAP2 packet carries; use fewer or shorter names")
        }
        // What bounds its packets is the length it sends, when it sets one; an accessory that
        // spreads messages over packets needs no packet to hold one whole.
        let packetLength = link.sendsPacketLength.map { UInt16(clamping: $0) } ?? linkConfiguration().parameters.maxPacketLength
        if Int(packetLength) < needed, !deviations.contains(.splitControlMessages) {
            throw fail("link.maxPacketLength", "is \(packetLength); the accessory's largest control message needs packets of at least \(needed) bytes")
        }
        if !(0...Habits.maxChallengeResponseDelayMs).contains(habits.challengeResponseDelayMs) {
            throw fail("habits.challengeResponseDelayMs", "is \(habits.challengeResponseDelayMs); use 0…\(Habits.maxChallengeResponseDelayMs) milliseconds")
        }
        if let app = habits.appLaunch, app.isEmpty || app.utf8.count > 255 {
            throw fail("habits.appLaunch", "must name an application (a bundle identifier of 1 to 255 bytes, like com.example.app)")
        }
        if !(0...3_600_000).contains(rebootDelayMs) {
            throw fail("rebootDelayMs", "is \(rebootDelayMs); give milliseconds between 0 and 3600000")
        }
        for (key, rate) in [("dropRate", faults.dropRate), ("corruptRate", faults.corruptRate)] where !(0...1).contains(rate) {
            throw fail("faults.\(key)", "is \(rate); give a fraction between 0.0 (never) and 1.0 (always)")
        }
        if !(0...3_600_000).contains(faults.delayMs) {
            throw fail("faults.delayMs", "is \(faults.delayMs); give milliseconds between 0 and 3600000")
        }
        for (key, value) in [("stopReadingAfterBytes", faults.stopReadingAfterBytes), ("vanishAfterBytes", faults.vanishAfterBytes)] {
            if let value, value < 0 { throw fail("faults.\(key)", "is \(value); give a byte count of 0 or more, or leave it out") }
        }
    }
}
