internal import AccessoryLogging
internal import IAPWire

/// One authentication exchange found in a trace: the certificate the accessory sent, the
/// challenge the Apple device sent after it, and the accessory's response to that challenge.
/// What ``FrameInspector/authenticationChecker`` checks.
public struct AuthenticationEvidence: Sendable, Hashable {
    /// `iAP2` or `iAP1`.
    public var protocolName: String
    /// The certificate, as sent (iAP1: its sections joined).
    public var certificate: [UInt8]
    /// The challenge, as sent (iAP1: without its retry counter).
    public var challenge: [UInt8]
    /// The response, as sent.
    public var response: [UInt8]
    /// Where the certificate's frame starts in its stream (a byte offset).
    public var certificateOffset: Int
    /// Where the challenge's frame starts in its stream (a byte offset).
    public var challengeOffset: Int

    /// Creates evidence.
    public init(protocolName: String, certificate: [UInt8], challenge: [UInt8], response: [UInt8],
                certificateOffset: Int = 0, challengeOffset: Int = 0) {
        self.protocolName = protocolName
        self.certificate = certificate
        self.challenge = challenge
        self.response = response
        self.certificateOffset = certificateOffset
        self.challengeOffset = challengeOffset
    }
}

/// What a checker made of an ``AuthenticationEvidence``: a verdict and its steps.
///
/// IAPInspect checks no signatures itself (it links no cryptography); a tool that does hands a
/// checker to ``FrameInspector/authenticationChecker`` (iapctl uses IAPAuthentication's
/// `CapturedAuthentication`).
public struct AuthenticationChecking: Sendable, Hashable {
    /// One step: its name, how it came out (`holds`, `fails`, `not-checked`, `information`) and why.
    public struct Step: Sendable, Hashable {
        /// e.g. `signature`.
        public var name: String
        /// e.g. `holds`.
        public var result: String
        /// What was found.
        public var detail: String

        /// Creates a step.
        public init(name: String, result: String, detail: String) {
            self.name = name
            self.result = result
            self.detail = detail
        }
    }

    /// `valid`, or the step that failed and why.
    public var verdict: String
    /// Whether no step failed.
    public var isValid: Bool
    /// The steps, in order.
    public var steps: [Step]

    /// Creates a checking.
    public init(verdict: String, isValid: Bool, steps: [Step]) {
        self.verdict = verdict
        self.isValid = isValid
        self.steps = steps
    }
}

/// What an inspector keeps of the authentication it has seen, to check each response.
struct AuthenticationTrail: Sendable {
    var certificate: (bytes: [UInt8], offset: Int)?
    var challenge: (bytes: [UInt8], offset: Int)?
}

extension FrameInspector {
    /// The check of a response against the challenge before it and the certificate before
    /// that, added to a report (nothing without a checker).
    func checkResponse(_ response: [UInt8], protocolName: String, details: inout [String], fields: inout [(String, JSONValue)]) {
        guard let authenticationChecker else { return }
        guard let certificate = authenticationTrail.certificate else {
            details.append("authentication: not checked: no certificate came before this response in the trace")
            fields.append(("authenticationCheck", .object([("verdict", .string("not checked: no certificate before the response"))])))
            return
        }
        guard let challenge = authenticationTrail.challenge else {
            details.append("authentication: not checked: no challenge came before this response in the trace")
            fields.append(("authenticationCheck", .object([("verdict", .string("not checked: no challenge before the response"))])))
            return
        }
        let evidence = AuthenticationEvidence(protocolName: protocolName, certificate: certificate.bytes, challenge: challenge.bytes,
                                              response: response, certificateOffset: certificate.offset, challengeOffset: challenge.offset)
        let checking = authenticationChecker(evidence)
        details.append("authentication: \(checking.verdict.escapedForTerminal) (the \(response.count)-byte response, the "
                       + "\(challenge.bytes.count)-byte challenge at offset \(challenge.offset), the certificate at offset \(certificate.offset))")
        for step in checking.steps {
            details.append("  \(step.name): \(step.result): \(step.detail.escapedForTerminal)")
        }
        fields.append(("authenticationCheck", .object([
            ("verdict", .string(checking.verdict)), ("valid", .bool(checking.isValid)),
            ("certificateOffset", .int(certificate.offset)), ("challengeOffset", .int(challenge.offset)),
            ("steps", .array(checking.steps.map { .object([("step", .string($0.name)), ("result", .string($0.result)), ("detail", .string($0.detail))]) })),
        ])))
    }

    /// iAP2: keeps the certificate and the challenge, checks a response.
    mutating func noteAuthentication(_ message: ControlMessage, at offset: Int, details: inout [String], fields: inout [(String, JSONValue)]) {
        switch message.id {
        case .authenticationCertificate:
            if let certificate = message.parameter(0)?.data { authenticationTrail.certificate = (certificate, offset) }
            authenticationTrail.challenge = nil
        case .requestAuthenticationChallengeResponse:
            if let challenge = message.parameter(0)?.data { authenticationTrail.challenge = (challenge, offset) }
        case .authenticationResponse:
            if let response = message.parameter(0)?.data { checkResponse(response, protocolName: "iAP2", details: &details, fields: &fields) }
        default:
            break
        }
    }

    /// iAP1: keeps the challenge (GetAccessoryAuthenticationSignature: the challenge, then a
    /// retry counter), checks a RetAccessoryAuthenticationSignature. The certificate is kept by
    /// ``noteCertificateSection(_:offset:details:fields:)``.
    mutating func noteAuthentication(iap1 packet: IAP1Packet, at offset: Int, details: inout [String], fields: inout [(String, JSONValue)]) {
        guard packet.lingo == 0x00 else { return }
        switch packet.command {
        case UInt16(IAP1Command.getAccessoryAuthenticationSignature) where packet.payload.count >= 2:
            authenticationTrail.challenge = (Array(packet.payload.dropLast()), offset)
        case UInt16(IAP1Command.retAccessoryAuthenticationSignature):
            checkResponse(packet.payload, protocolName: "iAP1", details: &details, fields: &fields)
        default:
            break
        }
    }
}
