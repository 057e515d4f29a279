internal import IAPLink

/// How a challenge becomes what a coprocessor signs, per scheme: the one place to change when a
/// capture shows otherwise. Verifying (``VerifyingAuthentication``) and signing
/// (``AccessoryCredentials``) both go through it.
///
/// Coprocessor 2.0 (confirmed on a real capture, PROTOCOL.md §1.8): RSA PKCS#1 v1.5 whose
/// DigestInfo names SHA-1 and carries the 20-byte challenge itself: the challenge is the digest,
/// not hashed again. Coprocessor 3.0 (by analogy, unconfirmed, PROTOCOL.md §3.2): ECDSA P-256
/// over the 32-byte challenge as the digest, the response r‖s in 64 bytes.
struct SigningRule {
    /// The digest algorithm the signature names (and the length the digest must have).
    let digestAlgorithm: OpenSSL.Digest
    /// How many bytes that digest has.
    let digestLength: Int
    /// How the response is laid out.
    let encoding: OpenSSL.SignatureEncoding

    /// The rule of `scheme`.
    init(_ scheme: AuthenticationScheme) {
        switch scheme {
        case .rsaPKCS1SHA1: self.init(digestAlgorithm: .sha1, digestLength: 20, encoding: .native)
        case .ecdsaP256: self.init(digestAlgorithm: .sha256, digestLength: 32, encoding: .rawRS(width: 32))
        }
    }

    private init(digestAlgorithm: OpenSSL.Digest, digestLength: Int, encoding: OpenSSL.SignatureEncoding) {
        self.digestAlgorithm = digestAlgorithm
        self.digestLength = digestLength
        self.encoding = encoding
    }

    /// The digest that is signed for `challenge`: the challenge itself. Nil when it has not the
    /// digest's length (a device of this project always draws the right length).
    func digest(of challenge: [UInt8]) -> [UInt8]? {
        challenge.count == digestLength ? challenge : nil
    }
}

/// The key sizes a coprocessor's RSA key may have: real ones are 1024-bit; larger keys are
/// taken up to 4096 bits, anything beyond is refused before any arithmetic.
let acceptedRSABits = 1024...4096

extension OpenSSL.Key.Kind {
    /// The key for a person, e.g. `RSA 1024-bit`, `EC P-256`.
    var text: String {
        switch self {
        case let .rsa(bits): return "RSA \(bits)-bit"
        case let .ec(group): return "EC " + (group == "prime256v1" ? "P-256" : group)
        case let .other(name): return name
        }
    }

    /// The scheme this key signs with, or why no coprocessor has such a key.
    var scheme: Result<AuthenticationScheme, AuthenticationFailure> {
        switch self {
        case let .rsa(bits) where acceptedRSABits.contains(bits): return .success(.rsaPKCS1SHA1)
        case let .rsa(bits):
            return .failure(.unsupportedKey("an RSA \(bits)-bit key; coprocessors use 1024-bit keys and keys of \(acceptedRSABits.lowerBound)–\(acceptedRSABits.upperBound) bits are taken"))
        case .ec(group: "prime256v1"): return .success(.ecdsaP256)
        case let .ec(group):
            return .failure(.unsupportedKey("an EC key on \(group); coprocessor 3.0 keys are P-256 (prime256v1)"))
        case let .other(name):
            return .failure(.unsupportedKey("a \(name) key; coprocessors use RSA (2.0) or EC P-256 (3.0) keys"))
        }
    }
}
