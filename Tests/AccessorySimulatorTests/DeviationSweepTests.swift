import AccessorySimulator
import Foundation
import IAPAuthentication
import IAPLink
import IAPWire
import Testing
import TestThreads

/// The catalogue of deviations (``SimulatorProfile/Deviation``), swept: every deviation alone and
/// every pair of them, each through the link, authentication, identification and an echo, on
/// virtual time, against the host's device endpoint as the host runs it (the `record` policy,
/// the receive limits of a serial line). Each must be served, or refused with the reason its row
/// of docs/LENIENCY.md gives.
@Suite("Deviations from the reference, alone and in pairs", .ownThread)
struct DeviationSweepTests {
    typealias Deviation = SimulatorProfile.Deviation

    /// What one run came to.
    struct Outcome: CustomStringConvertible {
        var identified = false
        var echoed = false
        /// Why the host refused or stopped, if it did.
        var refusal: String?
        var tolerated: [String] = []
        var virtualTime: Duration = .zero
        /// The echoed bytes lost on the way (an accessory that never retransmits loses one
        /// packet in the sweep), which the host must step over.
        var lost: Range<Int>?

        var description: String {
            "identified \(identified), echoed \(echoed), refusal \(refusal ?? "none"), after \(virtualTime)"
        }
    }

    /// The Bluetooth address every run's accessory is on (the device checks its component).
    static let address: [UInt8] = [0x00, 0x1A, 0x7D, 0xDA, 0x71, 0x13]

    static func profile(_ deviations: [Deviation]) -> SimulatorProfile {
        var profile = SimulatorProfile(
            accessory: .init(name: "Deviant", model: "SIM-DV1", manufacturer: "AccessoryHost Simulator", serialNumber: "DV-0001",
                             firmwareVersion: "1.0.0", hardwareVersion: "A"),
            protocols: [.init(name: "com.example.echo", behaviour: .echo)],
            deviations: deviations)
        if deviations.allSatisfy({ $0.protocolVersion == .iap2 }) { profile.bluetoothAddress = address }
        return profile
    }

    /// Runs an accessory with `deviations` against the host's device endpoint until the echo is
    /// done, the host refused it, or a minute of virtual time passed.
    static func run(_ deviations: [Deviation]) throws -> Outcome {
        // More than iAP1's window of four packets when its acknowledgements never come, so the
        // host has to stop waiting for them.
        // An accessory that never retransmits loses its second data packet on the way, so the
        // gap's bound is exercised: enough packets that more come after it.
        let echoBytes = deviations.contains(.iap1UnacknowledgedData) ? 96_000 : deviations.contains(.neverRetransmits) ? 30_000 : 6_000
        var eaPackets = 0
        var eaOffset = 0
        let profile = profile(deviations)
        var accessory = try SimulatedAccessory(profile: profile, sessionBufferLimit: 16_384)
        var configuration = LinkConfiguration.device
        configuration.parameters.maxPacketLength = 2_880 // a serial line's quarter second at 115,200 baud
        var device = IAPEndpoint(device: configuration, policy: VerifyingAuthentication(mode: .record), sessionBufferLimit: 1 << 20,
                                 initialSequence: 0x40, randomSeed: 7)
        if profile.bluetoothAddress != nil { device.peerBluetoothAddress = address }
        var toAccessory = Wire()
        var toDevice = Wire()
        var now: Duration = .zero
        var outcome = Outcome()
        let payload = (0..<echoBytes).map { UInt8(truncatingIfNeeded: $0 &* 7 &+ 3) }
        var session: UInt16?
        var written = 0
        var received: [UInt8] = []

        func note(_ events: [EndpointEvent]) {
            for event in events {
                switch event {
                case let .controlFailed(failure): outcome.refusal = outcome.refusal ?? failure.description
                case let .identificationRejected(rejection): outcome.refusal = outcome.refusal ?? rejection.description
                case let .sessionClosed(id, reason?) where id == session: outcome.refusal = outcome.refusal ?? reason
                case let .link(.stateChanged(.failed(failure))): outcome.refusal = outcome.refusal ?? failure.description
                case let .tolerated(text): outcome.tolerated.append(text)
                case let .link(.oversizedPacketTaken(length, advertised)):
                    outcome.tolerated.append("a packet of \(length) bytes, longer than the host advertised (\(advertised))")
                default: break
                }
            }
        }

        accessory.start(now: now)
        device.start(now: now)
        var steps = 0
        // Without a session to echo on, the run goes on this long after identification, for
        // what the accessory sends then.
        var settleUntil: Duration?
        // Bounded in steps too: a host that stood still at a deadline would otherwise hold the test.
        while now < .seconds(60), outcome.refusal == nil, steps < 200_000 {
            steps += 1
            if let settleUntil, now >= settleUntil { break }
            // The application: open the session once identified, write, read.
            var moved = false
            if let identity = device.identity, !outcome.identified {
                outcome.identified = true
                if deviations.contains(.iap1DeviceLingoes) {
                    // IdentifyDeviceLingoes declares no protocol: served once identified, there
                    // is nothing to echo.
                    outcome.echoed = identity.protocols.isEmpty
                    settleUntil = now + .seconds(2)
                    continue
                }
                if deviations.contains(.controlSessionOnly) {
                    // Its protocols travel on native transports, which this sweep has none of:
                    // served once identified with them bound to one.
                    outcome.echoed = !identity.protocols.isEmpty && identity.protocols.allSatisfy { $0.nativeTransportComponentIdentifier != nil }
                    settleUntil = now + .seconds(2)
                    continue
                }
                guard identity.protocols.contains(where: { $0.name == "com.example.echo" }) else {
                    outcome.refusal = "identified without its protocol (it declared \(identity.protocols.map(\.name)))"
                    break
                }
                session = try device.openSession(protocolName: "com.example.echo", now: now)
                moved = true
            }
            if let id = session {
                if written < payload.count, device.sessionState(id) == .open {
                    let taken = (try? device.write(id, payload[written...], now: now)) ?? 0
                    written += taken
                    moved = moved || taken > 0
                }
                let read = device.read(id)
                received += read
                moved = moved || !read.isEmpty
                var expected = payload
                if let lost = outcome.lost { expected.removeSubrange(lost) }
                if received.count >= expected.count {
                    outcome.echoed = received == expected
                    break
                }
            }
            for frame in device.takeOutput() { toAccessory.send(frame, now: now) }
            for frame in accessory.takeOutput() {
                if deviations.contains(.neverRetransmits), let ea = device.iap2?.link.negotiated?.session(ofType: .externalAccessory)?.id,
                   let header = try? LinkPacketHeader.decode(frame.span.bytes), header.sessionID == ea,
                   header.payloadLength > EASessionData.headerSize,
                   let id = session, UInt16(frame[LinkPacketHeader.size]) << 8 | UInt16(frame[LinkPacketHeader.size + 1]) == id {
                    let length = header.payloadLength - EASessionData.headerSize
                    eaPackets += 1
                    defer { eaOffset += length }
                    if eaPackets == 2 {
                        outcome.lost = eaOffset..<(eaOffset + length)
                        continue
                    }
                }
                toDevice.send(frame, now: now)
            }
            let forAccessory = toAccessory.due(now)
            let forDevice = toDevice.due(now)
            for frame in forAccessory { accessory.receive(frame, now: now) }
            for frame in forDevice { device.receive(frame, now: now) }
            note(device.takeEvents())
            if moved || !forAccessory.isEmpty || !forDevice.isEmpty || device.hasOutput || accessory.hasOutput { continue }
            guard let next = [toAccessory.nextDelivery, toDevice.nextDelivery, device.nextDeadline, accessory.nextDeadline].compactMap({ $0 }).min()
            else { break }
            now = max(now, next)
            device.advance(to: now)
            accessory.advance(to: now)
            note(device.takeEvents())
        }
        outcome.virtualTime = now
        return outcome
    }

    /// Checks one run against the expectations of its deviations.
    static func check(_ deviations: [Deviation], sourceLocation: SourceLocation = #_sourceLocation) throws {
        let outcome = try run(deviations)
        let refusals = deviations.compactMap { deviation -> String? in
            if case let .refused(reason) = deviation.expectation { return reason }
            return nil
        }
        let names = deviations.map(\.rawValue).joined(separator: " + ")
        if refusals.isEmpty {
            #expect(outcome.identified && outcome.echoed && outcome.refusal == nil, "\(names): not served: \(outcome)",
                    sourceLocation: sourceLocation)
            if deviations.contains(.neverRetransmits), !deviations.contains(.controlSessionOnly), !deviations.contains(where: { $0.expectation != .served }) {
                #expect(outcome.lost != nil && outcome.tolerated.contains { $0.contains("never sent packet") },
                        "\(names): the lost packet was not stepped over and said (\(outcome.tolerated))", sourceLocation: sourceLocation)
            }
            // Served and said: the host's log names what it put up with.
            for deviation in deviations {
                guard let words = deviation.hostSays else { continue }
                #expect(outcome.tolerated.contains { $0.contains(words) }, "\(names): the host never said '\(words)' (it said \(outcome.tolerated))",
                        sourceLocation: sourceLocation)
            }
        } else {
            let reason = outcome.refusal ?? ""
            #expect(!outcome.echoed && refusals.contains { reason.contains($0) },
                    "\(names): expected a refusal naming one of \(refusals), got \(outcome)", sourceLocation: sourceLocation)
        }
    }

    @Test("the reference accessory is served (the baseline every deviation is measured against)")
    func reference() throws {
        let outcome = try Self.run([])
        #expect(outcome.identified && outcome.echoed && outcome.refusal == nil, "\(outcome)")
        #expect(outcome.tolerated.isEmpty, "the reference needs no tolerance: \(outcome.tolerated)")
    }

    @Test("every deviation alone: served, or refused with the reason the table gives", arguments: Deviation.allCases)
    func alone(_ deviation: Deviation) throws {
        try Self.check([deviation])
    }

    @Test("every pair of deviations that can meet on one accessory")
    func pairs() throws {
        var count = 0
        for (index, first) in Deviation.allCases.enumerated() {
            for second in Deviation.allCases[(index + 1)...] where first.combines(with: second) {
                try Self.check([first, second])
                count += 1
            }
        }
        // Keeps the count honest in the log (the closing note quotes it).
        print("deviation sweep: \(Deviation.allCases.count) deviations alone, \(count) pairs")
        #expect(count > Deviation.allCases.count)
    }

    @Test("every row of docs/LENIENCY.md's tolerance tables names deviations of the catalogue, and every deviation is named by a row")
    func leniencyTableAndCatalogueAgree() throws {
        let url = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("../../docs/LENIENCY.md")
        let text = try String(contentsOf: url, encoding: .utf8)
        var named = Set<String>()
        var column: Int?
        var heading = ""
        for line in text.split(separator: "\n", omittingEmptySubsequences: false) {
            if line.hasPrefix("## ") { heading = String(line.dropFirst(3)) }
            guard line.hasPrefix("|") else {
                column = nil
                continue
            }
            // An escaped pipe (`SYN\|ACK`) is text, not a cell's end.
            let cells = line.replacingOccurrences(of: "\\|", with: "/").split(separator: "|", omittingEmptySubsequences: false)
                .dropFirst().dropLast().map { $0.trimmingCharacters(in: .whitespaces) }
            if column == nil {
                column = cells.firstIndex(of: "deviation") ?? -1
                // Every table of tolerances has the column, but the transports' (played as USB
                // layouts and Bluetooth records, outside the sweep).
                if column == -1, cells.contains("it tolerates") {
                    #expect(["USB", "Bluetooth"].contains(heading), "the table under '\(heading)' tolerates things and has no deviation column")
                }
                continue
            }
            guard let index = column, index >= 0, !cells.allSatisfy({ $0.allSatisfy { "-: ".contains($0) } }) else { continue }
            let cell = index < cells.count ? cells[index] : ""
            let names = cell.split(separator: "`", omittingEmptySubsequences: false).enumerated().filter { $0.offset % 2 == 1 }.map { String($0.element) }
            #expect(!names.isEmpty, "a row of docs/LENIENCY.md names no deviation: \(line)")
            for name in names {
                #expect(Deviation(rawValue: name) != nil, "docs/LENIENCY.md names '\(name)', which is no deviation of the catalogue")
                named.insert(name)
            }
        }
        for deviation in Deviation.allCases {
            #expect(named.contains(deviation.rawValue), "no row of docs/LENIENCY.md names the deviation \(deviation.rawValue)")
        }
    }
}
