internal import IAPLink

/// A captured authentication (the certificate an accessory sent, the challenge the Apple device
/// sent it, the accessory's response) checked offline, step by step: what `iapctl decode` says
/// about the exchanges in a trace, for someone debugging "authentication failed".
///
/// The steps, in order: the certificate is read (PKCS#7 or X.509 DER), its key is one a
/// coprocessor has, the challenge has the length the key's scheme signs, the response is the
/// key's signature of the challenge (by the one signing rule of `SigningRule.swift`), the
/// certificate chains to the trust anchors given, and its validity period (information unless
/// asked to count). Each step holds, fails (with why) or is not checked (with why not); a step
/// after a failed one that needs it is not checked. For an RSA key a failed signature says which
/// side changed: a signature by this key of other bytes (the challenge, or a response to another
/// challenge), or no signature by this key at all (the response, or the certificate's key).
public struct CapturedAuthentication: Sendable, Hashable {
    /// One step of the check.
    public enum Step: String, Sendable, Hashable, CaseIterable {
        /// The certificate is read.
        case certificate
        /// Its key is one a coprocessor has.
        case key
        /// The challenge has the length the scheme signs.
        case challenge
        /// The response is the key's signature of the challenge.
        case signature
        /// The certificate chains to a trust anchor.
        case chain
        /// The certificate's validity period.
        case validity
    }

    /// How a step came out.
    public enum Result: String, Sendable, Hashable {
        /// It holds.
        case holds
        /// It fails (the detail says why).
        case fails
        /// It was not checked (the detail says why not).
        case notChecked = "not-checked"
        /// Information only (the validity period, unless asked to count).
        case information
    }

    /// One step's outcome.
    public struct Line: Sendable, Hashable {
        /// The step.
        public var step: Step
        /// How it came out.
        public var result: Result
        /// What was found, for a person (strings from the certificate are exact, not escaped).
        public var detail: String
    }

    /// The steps, in order.
    public private(set) var lines: [Line] = []

    /// Whether the response is a valid signature of the challenge by the certificate's key.
    public var signatureIsValid: Bool { lines.contains { $0.step == .signature && $0.result == .holds } }

    /// The first step that failed.
    public var firstFailure: Line? { lines.first { $0.result == .fails } }

    /// `valid` when no step failed, else the failing step and why, e.g.
    /// `signature fails: the 128-byte response is not a signature by the certificate's key …`.
    public var verdict: String {
        if let failure = firstFailure { return "\(failure.step.rawValue) fails: \(failure.detail)" }
        let unchecked = lines.filter { $0.result == .notChecked }.map(\.step.rawValue)
        return unchecked.isEmpty ? "valid" : "valid (\(unchecked.joined(separator: ", ")) not checked)"
    }

    /// Checks one captured exchange.
    ///
    /// - Parameters:
    ///   - certificate: the certificate as the accessory sent it.
    ///   - challenge: the challenge as the Apple device sent it (iAP1: without its retry counter).
    ///   - response: the accessory's response.
    ///   - trust: the trust anchors the chain is checked against (nil: the chain is not checked).
    ///   - checkValidity: whether a certificate outside its validity period fails.
    ///   - time: when validity is judged, in seconds since 1970 (nil: the clock).
    public init(certificate: [UInt8], challenge: [UInt8], response: [UInt8], trust: TrustAnchors? = nil,
                checkValidity: Bool = false, at time: Int? = nil) {
        func add(_ step: Step, _ result: Result, _ detail: String) { lines.append(Line(step: step, result: result, detail: detail)) }
        let check = CertificateCheck(certificate, trust: trust, checkValidity: checkValidity, at: time)
        guard let summary = check.summary else {
            let reason = check.readFailure?.detail ?? "it cannot be read"
            if !certificate.isEmpty, certificate.allSatisfy({ $0 == 0 }) {
                add(.certificate, .fails, "its \(certificate.count) bytes are all zero: a report made without --full leaves the "
                        + "certificate out; check a trace with the certificate in it (iapctl report --full, or --trace-file)")
            } else {
                add(.certificate, .fails, "\(certificate.count) bytes that are no certificate: \(reason)")
            }
            for step in [Step.key, .challenge, .signature, .chain, .validity] { add(step, .notChecked, "the certificate cannot be read") }
            return
        }
        add(.certificate, .holds, "\(certificate.count) bytes, subject \(summary.subject), issuer \(summary.issuer), serial \(summary.serialNumber)")
        guard let key = check.key, let scheme = check.scheme else {
            add(.key, .fails, check.readFailure?.detail ?? "the certificate's public key cannot be decoded")
            for step in [Step.challenge, .signature] { add(step, .notChecked, "the key cannot sign by any coprocessor's scheme") }
            Self.addChain(check, trust: trust, into: &lines)
            Self.addValidity(summary, checkValidity: checkValidity, into: &lines)
            return
        }
        add(.key, .holds, "\(summary.key): \(scheme.description)")
        let rule = SigningRule(scheme)
        if let digest = rule.digest(of: challenge) {
            add(.challenge, .holds, "\(challenge.count) bytes")
            let (result, detail) = Self.signature(response, of: digest, key: key, rule: rule)
            add(.signature, result, detail)
        } else {
            add(.challenge, .fails, "\(challenge.count) bytes; \(scheme.description) signs \(rule.digestLength)")
            add(.signature, .notChecked, "the challenge has not the length the scheme signs")
        }
        Self.addChain(check, trust: trust, into: &lines)
        Self.addValidity(summary, checkValidity: checkValidity, into: &lines)
    }

    /// The signature step: valid, or which side changed.
    private static func signature(_ response: [UInt8], of digest: [UInt8], key: OpenSSL.Key, rule: SigningRule) -> (Result, String) {
        let kind = key.kind.text
        if response.isEmpty { return (.fails, "the response is empty") }
        if key.verify(signature: response, digest: digest, digestAlgorithm: rule.digestAlgorithm, encoding: rule.encoding) {
            return (.holds, "valid: the \(response.count)-byte response is the certificate's \(kind) key's signature of the challenge")
        }
        guard case .rsa = key.kind else {
            return (.fails, "the \(response.count)-byte response is not the certificate's \(kind) key's signature of the challenge: "
                        + "the challenge, the response or the certificate's key changed")
        }
        let expected = key.maximumSignatureLength
        if response.count != expected {
            return (.fails, "the response has \(response.count) bytes; signatures by the certificate's \(kind) key have \(expected)")
        }
        if let signed = key.recoverDigest(signature: response, digestAlgorithm: rule.digestAlgorithm) {
            let differing = zip(signed, digest).enumerated().filter { $0.element.0 != $0.element.1 }.map(\.offset)
            let place = signed.count == digest.count && !differing.isEmpty
                ? " (they differ at byte\(differing.count == 1 ? "" : "s") \(differing.prefix(4).map(String.init).joined(separator: ", "))\(differing.count > 4 ? " …" : ""))"
                : ""
            return (.fails, "the response is a signature by the certificate's key, but of other bytes than this challenge\(place): "
                        + "the challenge changed, or the response answers another challenge")
        }
        return (.fails, "the \(response.count)-byte response is no signature by the certificate's \(kind) key: "
                    + "the response changed, or another key signed it (a forged response, or the certificate's key changed)")
    }

    private static func addChain(_ check: CertificateCheck, trust: TrustAnchors?, into lines: inout [Line]) {
        if check.chainVerified {
            lines.append(Line(step: .chain, result: .holds, detail: "chains to a trust anchor of \(trust?.source ?? "--trust")"))
        } else if let trust, trust.count > 0, let failure = check.chainFailure {
            lines.append(Line(step: .chain, result: .fails, detail: failure.detail))
        } else {
            lines.append(Line(step: .chain, result: .notChecked,
                              detail: "no trust anchors were given: the issuer (\(check.issuerName ?? "unknown")) and the certificate's own signature are not checked "
                                  + "(a changed byte there shows only against its CA); give the CA certificate with --trust FILE|DIR"))
        }
    }

    private static func addValidity(_ summary: CertificateSummary, checkValidity: Bool, into lines: inout [Line]) {
        let period = "\(summary.notBefore) to \(summary.notAfter)"
        switch summary.validity {
        case .current:
            lines.append(Line(step: .validity, result: checkValidity ? .holds : .information, detail: "\(period), current"))
        case .expired, .notYetValid:
            let state = summary.validity == .expired ? "expired" : "not yet valid"
            lines.append(Line(step: .validity, result: checkValidity ? .fails : .information,
                              detail: "\(period), \(state)" + (checkValidity ? "" : " (information: real accessories in use carry expired certificates; --check-validity counts it)")))
        }
    }
}
