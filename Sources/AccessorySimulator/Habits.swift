extension SimulatorProfile {
    /// Habits of real accessories the simulator can play (the JSON object `habits`), so that an
    /// application can be tried against an accessory's manners without the accessory
    /// (PROTOCOL.md §7 names which accessory does what). Every field is optional; the defaults
    /// are the polite accessory the simulator always was.
    ///
    /// ```json
    /// "habits": { "sessionStatus": false, "appLaunch": "com.flir.one",
    ///             "powerUpdates": true, "challengeResponseDelayMs": 100 }
    /// ```
    public struct Habits: Codable, Sendable, Equatable {
        /// Whether the accessory declares and sends StatusExternalAccessoryProtocolSession when a
        /// session starts (default true). False plays the FLIR ONE, which never sends it: the
        /// host must not wait for it.
        public var sessionStatus: Bool
        /// The application the accessory asks for with RequestAppLaunch right after
        /// identification (it then declares 0xEA02); nil (the default) asks for none.
        public var appLaunch: String?
        /// Whether the accessory asks for power updates (StartPowerUpdates) after identification
        /// (default true).
        public var powerUpdates: Bool
        /// Milliseconds the accessory's coprocessor takes to answer the challenge (default 0;
        /// the TD300 takes about 100), 0–5000.
        public var challengeResponseDelayMs: Int

        /// Creates habits; the defaults are those of a polite accessory.
        public init(sessionStatus: Bool = true, appLaunch: String? = nil, powerUpdates: Bool = true, challengeResponseDelayMs: Int = 0) {
            self.sessionStatus = sessionStatus
            self.appLaunch = appLaunch
            self.powerUpdates = powerUpdates
            self.challengeResponseDelayMs = challengeResponseDelayMs
        }

        enum CodingKeys: String, CodingKey, CaseIterable {
            case sessionStatus, appLaunch, powerUpdates, challengeResponseDelayMs
        }

        /// Decodes the habits, refusing unknown fields; missing fields take the defaults.
        public init(from decoder: any Decoder) throws {
            try rejectUnknownFields(in: decoder, known: CodingKeys.self)
            let container = try decoder.container(keyedBy: CodingKeys.self)
            sessionStatus = try container.decodeIfPresent(Bool.self, forKey: .sessionStatus) ?? true
            appLaunch = try container.decodeIfPresent(String.self, forKey: .appLaunch)
            powerUpdates = try container.decodeIfPresent(Bool.self, forKey: .powerUpdates) ?? true
            challengeResponseDelayMs = try container.decodeIfPresent(Int.self, forKey: .challengeResponseDelayMs) ?? 0
        }

        /// The longest coprocessor delay a profile may ask for, in milliseconds (well within the
        /// host's 10-second wait for an answer).
        public static let maxChallengeResponseDelayMs = 5_000

        /// The message ids the accessory declares it sends, by these habits: StartPowerUpdates,
        /// RequestAppLaunch and StatusExternalAccessoryProtocolSession, each when it sends it.
        var messagesSent: [UInt16] {
            (powerUpdates ? [0xAE00] : []) + (appLaunch != nil ? [0xEA02] : []) + (sessionStatus ? [0xEA03] : [])
        }
    }
}
