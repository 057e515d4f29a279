internal import IAPLink

extension SimulatorProfile {
    /// The names ``builtIn(named:)`` knows.
    public static let builtInNames = ["borescope", "firmware-updater", "keyboard-case", "legacy-sensor", "multi-sensor", "native-streamer",
                                      "photo-printer", "telepresence-robot", "thermal-camera"]

    /// A built-in profile: "firmware-updater" (one firmware-update protocol,
    /// `com.example.firmware`, on a link with 64 KiB packets and a window of 16) or "multi-sensor" (echo, sink, a 1 MiB source and a telemetry
    /// echo) or "native-streamer" (an echo on the iAP2 link, and an echo and a sink on native
    /// transports of their own) or "legacy-sensor" (an iAP1 accessory identifying by IDPS, with an
    /// echo and a sink). Two play habits of real accessories (PROTOCOL.md §7): "thermal-camera"
    /// (as the FLIR ONE: no StatusExternalAccessoryProtocolSession, RequestAppLaunch after
    /// identification, a window of 127 packets of 65,535 bytes) and "borescope" (as the TD300:
    /// a window of one 4,096-byte packet, slow acknowledgements, a coprocessor that takes 100 ms,
    /// its video on a native transport). Three play the accessories of PROTOCOL.md §7.6–7.8 with
    /// their deviations (``Deviation``): "keyboard-case" (the Clicks keyboard: one control
    /// session with id 10, bare ACKs that use sequence numbers up, on that session, no
    /// retransmissions, its certificate spread over link packets, bytes after a NUL, its protocol
    /// on a native transport), "telepresence-robot" (the Double 2: a window of one 255-byte
    /// packet and longer packets of its own, a 0 ms cumulative-ACK timeout, bare ACKs that carry
    /// the next number) and "photo-printer" (the Canon Ivy: acknowledgements slower than its
    /// retransmissions, session ids 10 and 11). The same profiles ship as JSON in `tools/data/profiles/`.
    ///
    /// - Returns: nil for any other name (see ``builtInNames``).
    public static func builtIn(named name: String) -> SimulatorProfile? {
        switch name {
        case "firmware-updater":
            return SimulatorProfile(
                accessory: Identity(name: "Firmware Updater", model: "SIM-FW1", manufacturer: "AccessoryHost Simulator",
                                   serialNumber: "SIM-FW-0001", firmwareVersion: "1.0.0", hardwareVersion: "A"),
                protocols: [ProtocolSpec(name: "com.example.firmware", behaviour: .firmwareUpdate)],
                // Built for images: large packets, a deep window, prompt ACKs.
                link: LinkOverrides(maxPacketLength: 65_535, maxOutstandingPackets: 16, cumulativeAckTimeoutMs: 10))
        case "multi-sensor":
            return SimulatorProfile(
                accessory: Identity(name: "Multi Sensor", model: "SIM-MS1", manufacturer: "AccessoryHost Simulator",
                                   serialNumber: "SIM-MS-0001", firmwareVersion: "2.1.0", hardwareVersion: "B"),
                protocols: [
                    ProtocolSpec(name: "com.example.echo", behaviour: .echo),
                    ProtocolSpec(name: "com.example.sink", behaviour: .sink),
                    ProtocolSpec(name: "com.example.source", behaviour: .source, sourceBytes: 1 << 20),
                    ProtocolSpec(name: "com.example.telemetry", behaviour: .echo),
                ])
        case "legacy-sensor":
            return SimulatorProfile(
                accessory: Identity(name: "Legacy Sensor", model: "SIM-LS1", manufacturer: "AccessoryHost Simulator",
                                   serialNumber: "SIM-LS-0001", firmwareVersion: "1.4.2", hardwareVersion: "2.0.0"),
                protocols: [
                    ProtocolSpec(name: "com.example.echo", behaviour: .echo),
                    ProtocolSpec(name: "com.example.sink", behaviour: .sink),
                ],
                iap1: IAP1Settings())
        case "native-streamer":
            return SimulatorProfile(
                accessory: Identity(name: "Native Streamer", model: "SIM-NS1", manufacturer: "AccessoryHost Simulator",
                                   serialNumber: "SIM-NS-0001", firmwareVersion: "1.0.0", hardwareVersion: "A"),
                protocols: [
                    ProtocolSpec(name: "com.example.echo", behaviour: .echo),
                    ProtocolSpec(name: "com.example.native.echo", behaviour: .echo, native: true),
                    ProtocolSpec(name: "com.example.native.sink", behaviour: .sink, native: true),
                ])
        case "thermal-camera":
            return SimulatorProfile(
                accessory: Identity(name: "Thermal Camera", model: "SIM-TC1", manufacturer: "AccessoryHost Simulator",
                                   serialNumber: "SIM-TC-0001", firmwareVersion: "1.0.8", hardwareVersion: "A"),
                protocols: [
                    ProtocolSpec(name: "com.example.thermal.config", behaviour: .echo),
                    ProtocolSpec(name: "com.example.thermal.frame", behaviour: .source, sourceBytes: 1 << 20),
                    ProtocolSpec(name: "com.example.thermal.fileio", behaviour: .echo, native: true),
                ],
                link: LinkOverrides(maxPacketLength: 65_535, maxOutstandingPackets: 127, retransmissionTimeoutMs: 2_000,
                                    cumulativeAckTimeoutMs: 50),
                habits: Habits(sessionStatus: false, appLaunch: "com.example.thermal"))
        case "borescope":
            return SimulatorProfile(
                accessory: Identity(name: "Borescope", model: "SIM-BS1", manufacturer: "AccessoryHost Simulator",
                                   serialNumber: "SIM-BS-0001", firmwareVersion: "2.0.3", hardwareVersion: "A"),
                protocols: [
                    ProtocolSpec(name: "com.example.borescope.control", behaviour: .echo),
                    ProtocolSpec(name: "com.example.borescope.video", behaviour: .source, sourceBytes: 1 << 20, native: true),
                ],
                link: LinkOverrides(maxPacketLength: 4_096, maxOutstandingPackets: 1, retransmissionTimeoutMs: 3_000,
                                    cumulativeAckTimeoutMs: 1_500, maxCumulativeAcks: 1, maxRetransmissions: 4),
                habits: Habits(challengeResponseDelayMs: 100))
        case "keyboard-case":
            return SimulatorProfile(
                accessory: Identity(name: "Keyboard Case", model: "SIM-KC1", manufacturer: "AccessoryHost Simulator",
                                   serialNumber: "SIM-KC-0001", firmwareVersion: "1.2.0", hardwareVersion: "A"),
                protocols: [ProtocolSpec(name: "com.example.keyboard", behaviour: .echo, native: true)],
                link: LinkOverrides(maxPacketLength: 4_096, maxOutstandingPackets: 5, retransmissionTimeoutMs: 2_000, cumulativeAckTimeoutMs: 500,
                                    maxCumulativeAcks: 3, maxRetransmissions: 30),
                habits: Habits(appLaunch: "com.example.keyboard"),
                deviations: [.controlSessionOnly, .bareAcksUseUpNumbers, .bareAcksOnControlSession, .neverRetransmits, .splitControlMessages,
                             .bytesAfterNUL, .unknownIdentificationParameters, .powerChatter])
        case "telepresence-robot":
            return SimulatorProfile(
                accessory: Identity(name: "Telepresence Robot", model: "SIM-TR1", manufacturer: "AccessoryHost Simulator",
                                   serialNumber: "SIM-TR-0001", firmwareVersion: "3.1.0", hardwareVersion: "D1"),
                protocols: [ProtocolSpec(name: "com.example.robot", behaviour: .echo)],
                link: LinkOverrides(retransmissionTimeoutMs: 1_500, maxCumulativeAcks: 1, maxRetransmissions: 30),
                habits: Habits(appLaunch: "com.example.robot"),
                deviations: [.windowOfOne, .smallPackets, .outOfRangeTimers, .bareAcksCarryNextNumber, .slowCoprocessor])
        case "photo-printer":
            return SimulatorProfile(
                accessory: Identity(name: "Photo Printer", model: "SIM-PP1", manufacturer: "AccessoryHost Simulator",
                                   serialNumber: "SIM-PP-0001", firmwareVersion: "1.0.4", hardwareVersion: "A"),
                protocols: [ProtocolSpec(name: "com.example.printer", behaviour: .sink)],
                link: LinkOverrides(maxPacketLength: 1_007, maxOutstandingPackets: 5),
                deviations: [.slowAcknowledgements, .sessionIDsTenAndEleven])
        default:
            return nil
        }
    }
}
