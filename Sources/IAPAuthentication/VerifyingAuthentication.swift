public import IAPLink

/// How strictly the host checks an accessory's authentication.
public enum AuthenticationMode: String, Hashable, Sendable, CaseIterable {
    /// Check nothing, accept whatever comes (what other hosts do).
    case accept
    /// Check everything, report it (``Accessory``'s `authentication`, `iapctl info`), and accept
    /// the accessory anyway: real accessories with expired certificates or an unknown issuer keep
    /// working. The default.
    case record
    /// Refuse an accessory whose certificate is malformed, whose key is unsupported, whose
    /// signature does not verify or whose certificate does not chain to a trust anchor (and, with
    /// `checkValidity`, that is outside its validity period). The reason is reported.
    case require
}

/// The authentication policy that checks for real, with OpenSSL: it reads the certificate (PKCS#7
/// or X.509 DER), verifies the response against the challenge with the certificate's key (the
/// scheme the key implies, by the one signing rule of `SigningRule.swift`), and checks the chain to the ``TrustAnchors`` given.
///
/// What it finds reaches ``AuthenticationOutcome`` (on the accessory's identity); under
/// ``AuthenticationMode/require`` a failure ends the connection with its reason (iAP2:
/// AuthenticationFailed; iAP1: the failure status of the acknowledgement).
public struct VerifyingAuthentication: AuthenticationPolicy {
    /// How strict it is.
    public var mode: AuthenticationMode
    /// The trust anchors the certificate must chain to (nil: none, so no chain verifies).
    public var trust: TrustAnchors?
    /// Whether a certificate outside its validity period fails (under ``AuthenticationMode/require``
    /// it is then refused). Off by default: the period is always reported, never a reason to fail.
    public var checkValidity: Bool
    /// The time validity is judged at, in seconds since 1970 (nil: the clock).
    public var validityTime: Int?

    /// Creates the policy.
    public init(mode: AuthenticationMode = .record, trust: TrustAnchors? = nil, checkValidity: Bool = false, validityTime: Int? = nil) {
        self.mode = mode
        self.trust = trust
        self.checkValidity = checkValidity
        self.validityTime = validityTime
    }

    /// An accessory that does not authenticate is refused under ``AuthenticationMode/require``.
    public var requiresAuthentication: Bool { mode == .require }

    /// Reads and checks the certificate; under ``AuthenticationMode/require`` a failure refuses
    /// it before any challenge.
    public func examine(certificate: [UInt8]) -> CertificateExamination {
        guard mode != .accept else { return CertificateExamination() }
        let check = CertificateCheck(certificate, trust: trust, checkValidity: checkValidity, at: validityTime)
        return CertificateExamination(summary: check.summary, scheme: check.scheme,
                                      refusal: mode == .require ? check.failure : nil)
    }

    /// Verifies the response, then gives the verdict: the first failure of certificate, key,
    /// signature, chain and (when checked) validity, in that order.
    public func outcome(certificate: [UInt8], challenge: [UInt8], response: [UInt8]) -> AuthenticationOutcome {
        guard mode != .accept else { return .notChecked }
        let check = CertificateCheck(certificate, trust: trust, checkValidity: checkValidity, at: validityTime)
        var signatureVerified = false
        var failure = check.readFailure
        if failure == nil, let key = check.key, let scheme = check.scheme {
            switch Self.verify(response: response, challenge: challenge, key: key, scheme: scheme) {
            case .success: signatureVerified = true
            case let .failure(reason): failure = reason
            }
        }
        failure = failure ?? check.chainFailure ?? check.validityFailure
        return AuthenticationOutcome(status: failure.map { .notVerified($0) } ?? .verified,
                                     accepted: mode == .record || failure == nil,
                                     signatureVerified: signatureVerified, chainVerified: check.chainVerified,
                                     certificate: check.summary)
    }

    /// Whether ``examine(certificate:)`` lets the certificate through.
    public func acceptsCertificate(_ certificate: [UInt8]) -> Bool { examine(certificate: certificate).refusal == nil }

    /// Whether ``outcome(certificate:challenge:response:)`` accepts the accessory.
    public func verifies(certificate: [UInt8], challenge: [UInt8], response: [UInt8]) -> Bool {
        outcome(certificate: certificate, challenge: challenge, response: response).accepted
    }

    /// Whether `response` is the signature of `challenge` by `key` under `scheme`'s rule.
    static func verify(response: [UInt8], challenge: [UInt8], key: OpenSSL.Key, scheme: AuthenticationScheme) -> Result<Void, AuthenticationFailure> {
        let rule = SigningRule(scheme)
        guard !response.isEmpty else { return .failure(.badSignature("the accessory sent an empty response")) }
        guard let digest = rule.digest(of: challenge) else {
            return .failure(.badSignature("the challenge has \(challenge.count) bytes; \(scheme) signs \(rule.digestLength)"))
        }
        guard key.verify(signature: response, digest: digest, digestAlgorithm: rule.digestAlgorithm, encoding: rule.encoding) else {
            return .failure(.badSignature("the \(response.count)-byte response is not a signature of the challenge by the certificate's \(key.kind.text) key (\(scheme))"))
        }
        return .success(())
    }
}

extension AuthenticationMode {
    /// The policy of this mode: ``VerifyingAuthentication`` for record and require, and
    /// `AcceptingAuthentication` (IAPLink's, which reads nothing) for accept.
    public func policy(trust: TrustAnchors? = nil, checkValidity: Bool = false) -> any AuthenticationPolicy {
        switch self {
        case .accept: return AcceptingAuthentication()
        case .record, .require: return VerifyingAuthentication(mode: self, trust: trust, checkValidity: checkValidity)
        }
    }
}

/// Reads an accessory's certificate (PKCS#7 or X.509 DER) for a person or a trace, without
/// checking anything.
public enum CertificateReader {
    /// What `certificate` says, or why it cannot be read.
    ///
    /// - Parameters:
    ///   - certificate: the certificate as an accessory sends it (PKCS#7 or X.509 DER).
    ///   - time: when validity is judged, in seconds since 1970 (nil: the clock).
    public static func summary(of certificate: [UInt8], at time: Int? = nil) -> Result<CertificateSummary, AuthenticationFailure> {
        let check = CertificateCheck(certificate, trust: nil, checkValidity: false, at: time)
        if let summary = check.summary { return .success(summary) }
        return .failure(check.readFailure ?? .malformedCertificate("no certificate"))
    }
}

/// One certificate read and checked as far as it goes without the response: its leaf, key and
/// scheme, its chain and its validity.
struct CertificateCheck {
    var summary: CertificateSummary?
    var key: OpenSSL.Key?
    var scheme: AuthenticationScheme?
    /// The certificate or its key could not be used.
    var readFailure: AuthenticationFailure?
    var chainFailure: AuthenticationFailure?
    var validityFailure: AuthenticationFailure?
    var chainVerified = false
    /// Who issued the leaf, for a person: its common name, else its whole name (nil when the
    /// certificate could not be read).
    var issuerName: String?

    /// The first failure, in the order the verdict takes them (the signature aside).
    var failure: AuthenticationFailure? { readFailure ?? chainFailure ?? validityFailure }

    init(_ der: [UInt8], trust: TrustAnchors?, checkValidity: Bool, at time: Int?) {
        let certificates: [OpenSSL.Certificate]
        do {
            certificates = try OpenSSL.Certificate.fromDER(der)
        } catch {
            readFailure = error
            return
        }
        // The leaf is the certificate that issued none of the others (the first when several
        // qualify); the others may complete the chain.
        let leafIndex = certificates.indices.first { index in
            !certificates.indices.contains { $0 != index && certificates[$0].isIssued(by: certificates[index]) }
        } ?? 0
        let leaf = certificates[leafIndex]
        let intermediates = certificates.indices.filter { $0 != leafIndex }.map { certificates[$0] }
        let key = leaf.publicKey()
        let kind = key?.kind
        let validity = leaf.validity(at: time)
        switch kind?.scheme {
        case let .success(found)?: scheme = found
        case let .failure(failure)?: readFailure = failure
        case nil: readFailure = .malformedCertificate("its public key cannot be decoded")
        }
        summary = CertificateSummary(subject: leaf.subject, issuer: leaf.issuer, serialNumber: leaf.serialNumber,
                                     notBefore: leaf.notBefore, notAfter: leaf.notAfter, validity: validity,
                                     key: kind?.text ?? "undecodable", scheme: scheme, signatureAlgorithm: leaf.signatureAlgorithm)
        self.key = readFailure == nil ? key : nil
        // The issuer by its common name first (what a person looks for among CA files), then
        // what to do: an unknown issuer is the one failure a user fixes on the host's side.
        let issuer = leaf.issuerCommonName ?? (leaf.issuer.isEmpty ? "an issuer without a name" : leaf.issuer)
        issuerName = issuer
        if let trust, trust.count > 0 {
            if let reason = trust.store.verify(leaf, intermediates: intermediates, checkTime: false) {
                chainFailure = .unknownIssuer("\(issuer); the chain to the trust anchors given fails: \(reason) (issuer \(leaf.issuer)); "
                                                + "give that CA's certificate with --trust, or check that it is the right one")
            } else {
                chainVerified = true
            }
        } else {
            chainFailure = .unknownIssuer("\(issuer); no trust anchors were given: give that CA's certificate with --trust FILE|DIR")
        }
        if checkValidity, validity != .current {
            validityFailure = .outsideValidity(validity == .expired ? "the certificate expired \(leaf.notAfter)"
                : "the certificate is not valid before \(leaf.notBefore)")
        }
    }
}
