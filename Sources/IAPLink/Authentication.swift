// What authentication concludes, in terms the endpoints, the host and a person share. The
// checking itself (certificates, signatures, trust) is IAPAuthentication's, over OpenSSL; this
// layer only carries its answers and asks the policy at the right steps.

/// How an accessory's coprocessor answers a challenge: which key it holds and how the challenge
/// becomes the signed digest.
public enum AuthenticationScheme: String, Hashable, Sendable, Codable, CustomStringConvertible {
    /// Coprocessor 2.0: an RSA key (1024-bit on real parts); the 20-byte challenge is the SHA-1
    /// digest of a PKCS#1 v1.5 signature (confirmed on a real capture, PROTOCOL.md §1.8).
    case rsaPKCS1SHA1 = "rsa-pkcs1-sha1"
    /// Coprocessor 3.0: an ECDSA P-256 key; the 32-byte challenge is the digest and the response
    /// is r‖s, 64 bytes (by analogy, not confirmed on a capture; PROTOCOL.md §3.2).
    case ecdsaP256 = "ecdsa-p256"

    /// Bytes of challenge the device draws for this scheme.
    public var challengeLength: Int {
        switch self {
        case .rsaPKCS1SHA1: return 20
        case .ecdsaP256: return 32
        }
    }

    /// The scheme for a person, e.g. `RSA PKCS#1 v1.5, challenge as SHA-1 digest (CP 2.0)`.
    public var description: String {
        switch self {
        case .rsaPKCS1SHA1: return "RSA PKCS#1 v1.5, challenge as SHA-1 digest (CP 2.0)"
        case .ecdsaP256: return "ECDSA P-256, challenge as digest (CP 3.0, unconfirmed)"
        }
    }
}

/// Why an accessory's authentication did not verify.
public enum AuthenticationFailure: Error, Hashable, Sendable, Codable, CustomStringConvertible {
    /// The certificate could not be read (not DER, truncated, lying lengths, no certificate in
    /// the PKCS#7, too long…); the text says what was wrong.
    case malformedCertificate(String)
    /// The certificate's key is of a kind or size no coprocessor has (not RSA or P-256, or an
    /// RSA key outside 1024–4096 bits).
    case unsupportedKey(String)
    /// The response is not a signature of the challenge by the certificate's key.
    case badSignature(String)
    /// The certificate does not chain to a trust anchor (or none was given).
    case unknownIssuer(String)
    /// The certificate is expired or not yet valid (a failure only when validity is checked).
    case outsideValidity(String)
    /// A policy refused without a finer reason (``RejectingAuthentication``, or a policy that
    /// answers only yes or no).
    case refused(String)

    /// The short name of the reason: `malformed certificate`, `bad signature`, `unknown issuer`…
    public var kind: String {
        switch self {
        case .malformedCertificate: return "malformed certificate"
        case .unsupportedKey: return "unsupported key"
        case .badSignature: return "bad signature"
        case .unknownIssuer: return "unknown issuer"
        case .outsideValidity: return "outside its validity period"
        case .refused: return "refused"
        }
    }

    /// What is wrong in detail.
    public var detail: String {
        switch self {
        case let .malformedCertificate(text), let .unsupportedKey(text), let .badSignature(text), let .unknownIssuer(text),
             let .outsideValidity(text), let .refused(text):
            return text
        }
    }

    /// The reason and its detail, e.g. `bad signature: the response does not verify with the
    /// certificate's RSA key`. A bare refusal is its text alone.
    public var description: String {
        if case let .refused(text) = self { return text }
        return "\(kind): \(detail)"
    }
}

/// Whether a certificate's validity period holds at the time it was checked.
public enum CertificateValidity: String, Hashable, Sendable, Codable {
    /// Within its period.
    case current
    /// Past its notAfter date (common: real accessories outlive their certificates).
    case expired
    /// Before its notBefore date.
    case notYetValid = "not-yet-valid"
}

/// What a certificate says, as a person reads it. Strings come from the accessory: escape them
/// before showing them on a terminal.
public struct CertificateSummary: Hashable, Sendable, Codable {
    /// The subject's distinguished name, e.g. `C=US, O=Apple Inc., OU=Apple iPod Accessories, CN=IPA_…`.
    public var subject: String
    /// The issuer's distinguished name.
    public var issuer: String
    /// The serial number in hexadecimal, most significant byte first.
    public var serialNumber: String
    /// The start of the validity period, ISO 8601 in UTC (e.g. `2012-09-27T00:40:35Z`).
    public var notBefore: String
    /// The end of the validity period, ISO 8601 in UTC.
    public var notAfter: String
    /// The validity period against the clock when it was checked.
    public var validity: CertificateValidity
    /// The public key, e.g. `RSA 1024-bit` or `EC P-256`.
    public var key: String
    /// The scheme the key implies (nil when the key fits no coprocessor's).
    public var scheme: AuthenticationScheme?
    /// The certificate's signature algorithm, e.g. `sha1WithRSAEncryption`.
    public var signatureAlgorithm: String

    /// Creates a summary.
    public init(subject: String, issuer: String, serialNumber: String, notBefore: String, notAfter: String,
                validity: CertificateValidity, key: String, scheme: AuthenticationScheme?, signatureAlgorithm: String) {
        self.subject = subject
        self.issuer = issuer
        self.serialNumber = serialNumber
        self.notBefore = notBefore
        self.notAfter = notAfter
        self.validity = validity
        self.key = key
        self.scheme = scheme
        self.signatureAlgorithm = signatureAlgorithm
    }
}

/// What became of an accessory's authentication: whether it verified (and if not, why), whether
/// the host let the accessory in anyway, and what its certificate says.
public struct AuthenticationOutcome: Hashable, Sendable, Codable, CustomStringConvertible {
    /// The verdict.
    public enum Status: Hashable, Sendable, Codable {
        /// The certificate chains to a trust anchor and the response is its key's signature of
        /// the challenge (and, when asked, the certificate is within its validity period).
        case verified
        /// Checked, and it failed for this reason.
        case notVerified(AuthenticationFailure)
        /// Not checked: the policy accepts whatever comes (``AcceptingAuthentication``), or the
        /// accessory did not authenticate.
        case notChecked
    }

    /// The verdict.
    public var status: Status
    /// Whether the host went on with the accessory (a recording policy accepts what fails).
    public var accepted: Bool
    /// Whether the response was checked and is the certificate key's signature of the challenge
    /// (true even when the chain failed: the accessory holds the key of its certificate).
    public var signatureVerified: Bool
    /// Whether the certificate chains to a trust anchor the user gave.
    public var chainVerified: Bool
    /// What the certificate says (nil when it was not read or could not be).
    public var certificate: CertificateSummary?

    /// Creates an outcome.
    public init(status: Status, accepted: Bool, signatureVerified: Bool = false, chainVerified: Bool = false,
                certificate: CertificateSummary? = nil) {
        self.status = status
        self.accepted = accepted
        self.signatureVerified = signatureVerified
        self.chainVerified = chainVerified
        self.certificate = certificate
    }

    /// Nothing was checked and the accessory was let in (also the value before authentication).
    public static let notChecked = AuthenticationOutcome(status: .notChecked, accepted: true)

    /// Whether the status is ``Status/verified``.
    public var isVerified: Bool { status == .verified }

    /// Why it did not verify (nil when it did, or was not checked).
    public var failure: AuthenticationFailure? {
        if case let .notVerified(failure) = status { return failure }
        return nil
    }

    /// The status as one word for scripts: `verified`, `not-verified` or `not-checked`.
    public var statusName: String {
        switch status {
        case .verified: return "verified"
        case .notVerified: return "not-verified"
        case .notChecked: return "not-checked"
        }
    }

    /// The outcome in a line, e.g. `not verified (bad signature: …), accepted anyway`. Expiry is
    /// mentioned whenever the certificate is outside its period.
    public var description: String {
        var text: String
        switch status {
        case .verified: text = "verified"
        case let .notVerified(failure): text = "not verified (\(failure))" + (accepted ? ", accepted anyway" : ", refused")
        case .notChecked: text = "not checked"
        }
        if let certificate, certificate.validity != .current {
            text += certificate.validity == .expired ? "; certificate expired \(certificate.notAfter)"
                : "; certificate not valid before \(certificate.notBefore)"
        }
        return text
    }
}

/// What a policy makes of a certificate before the challenge is drawn.
public struct CertificateExamination: Hashable, Sendable {
    /// What the certificate says, when it could be read.
    public var summary: CertificateSummary?
    /// The scheme its key implies: it decides the challenge's length.
    public var scheme: AuthenticationScheme?
    /// Set when the policy refuses the accessory already (no challenge is sent).
    public var refusal: AuthenticationFailure?

    /// Creates an examination.
    public init(summary: CertificateSummary? = nil, scheme: AuthenticationScheme? = nil, refusal: AuthenticationFailure? = nil) {
        self.summary = summary
        self.scheme = scheme
        self.refusal = refusal
    }
}

/// The accessory role's coprocessor: the certificate it sends and the signatures it makes. The
/// simulator's comes from IAPAuthentication (a real key); without one, the endpoints send a
/// stand-in that no verifying host accepts.
public protocol AuthenticationSigner: Sendable {
    /// The certificate the accessory sends (DER: PKCS#7 SignedData holding the X.509 certificate).
    var certificate: [UInt8] { get }
    /// The response to `challenge`.
    func sign(challenge: [UInt8]) -> [UInt8]
}

extension AuthenticationPolicy {
    /// Accessories that do not authenticate are let in unless a policy says otherwise.
    public var requiresAuthentication: Bool { false }

    /// A yes-or-no policy's examination: go on unless ``acceptsCertificate(_:)`` says no.
    public func examine(certificate: [UInt8]) -> CertificateExamination {
        acceptsCertificate(certificate) ? CertificateExamination() : CertificateExamination(refusal: .refused("the certificate was refused"))
    }

    /// A yes-or-no policy's outcome: verified when ``verifies(certificate:challenge:response:)``
    /// says yes, refused otherwise.
    public func outcome(certificate: [UInt8], challenge: [UInt8], response: [UInt8]) -> AuthenticationOutcome {
        verifies(certificate: certificate, challenge: challenge, response: response)
            ? AuthenticationOutcome(status: .verified, accepted: true, signatureVerified: true)
            : AuthenticationOutcome(status: .notVerified(.refused("the challenge response did not verify")), accepted: false)
    }
}

extension AcceptingAuthentication {
    /// Accepts any non-empty response without looking at it: not checked.
    public func outcome(certificate: [UInt8], challenge: [UInt8], response: [UInt8]) -> AuthenticationOutcome {
        verifies(certificate: certificate, challenge: challenge, response: response)
            ? .notChecked
            : AuthenticationOutcome(status: .notVerified(.refused("the challenge response did not verify")), accepted: false)
    }
}

/// The stand-in response of an accessory without a signer: bytes derived from the challenge, of
/// the length the challenge's scheme would give (128 for a 20-byte challenge, 64 otherwise).
func standInResponse(to challenge: [UInt8]) -> [UInt8] {
    let length = challenge.count == 20 ? 128 : 64
    var response = [UInt8](repeating: 0, count: length)
    for index in response.indices { response[index] = challenge.isEmpty ? 0 : challenge[index % challenge.count] ^ UInt8(index & 0xFF) }
    return response
}
