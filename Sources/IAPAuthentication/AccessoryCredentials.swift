public import IAPLink

/// An accessory's coprocessor for the simulator: its certificate (sent as PKCS#7 SignedData, as
/// Apple's coprocessors hand it out) and its private key, which signs the device's challenges by
/// the signing rule of `SigningRule.swift` (RSA for coprocessor 2.0, P-256 for 3.0). Made from PEM
/// files (a profile's `authentication` section), from DER (the simulator's built-in test
/// credentials) or generated for tests.
public struct AccessoryCredentials: AuthenticationSigner {
    /// The certificate as the accessory sends it: DER PKCS#7 with the leaf first.
    public let certificate: [UInt8]
    /// The scheme the key signs with.
    public let scheme: AuthenticationScheme
    private let key: OpenSSL.Key

    /// Credentials from PEM: `certificatePEM` holds the accessory's certificate (and optionally
    /// its issuers after it), `privateKeyPEM` the unencrypted key that belongs to it.
    ///
    /// - Throws: ``AuthenticationSetupError`` when either cannot be read, the key is not one a
    ///   coprocessor has, or the key does not belong to the certificate.
    public init(certificatePEM: [UInt8], privateKeyPEM: [UInt8]) throws(AuthenticationSetupError) {
        let certificates: [OpenSSL.Certificate]
        let key: OpenSSL.Key
        do {
            certificates = try OpenSSL.Certificate.fromPEM(certificatePEM)
            guard !certificates.isEmpty else {
                throw AuthenticationSetupError(problem: "the certificate file holds no PEM certificate (-----BEGIN CERTIFICATE-----)")
            }
            key = try OpenSSL.Key.privateKey(pem: privateKeyPEM)
        } catch let error as AuthenticationSetupError {
            throw error
        } catch {
            throw AuthenticationSetupError(problem: "\(error)")
        }
        try self.init(certificates: certificates, key: key)
    }

    /// Credentials from DER: `certificateDER` is the accessory's X.509 certificate (or a PKCS#7
    /// SignedData with it first), `privateKeyDER` the unencrypted key that belongs to it
    /// (PKCS#8, or a traditional RSA or EC key).
    ///
    /// - Throws: ``AuthenticationSetupError`` when either cannot be read, the key is not one a
    ///   coprocessor has, or the key does not belong to the certificate.
    public init(certificateDER: [UInt8], privateKeyDER: [UInt8]) throws(AuthenticationSetupError) {
        let certificates: [OpenSSL.Certificate]
        let key: OpenSSL.Key
        do {
            certificates = try OpenSSL.Certificate.fromDER(certificateDER)
        } catch {
            throw AuthenticationSetupError(problem: "the certificate cannot be read: \(error)")
        }
        do {
            key = try OpenSSL.Key.privateKey(der: privateKeyDER)
        } catch {
            throw AuthenticationSetupError(problem: "the private key cannot be read: \(error)")
        }
        try self.init(certificates: certificates, key: key)
    }

    /// Credentials from certificates read (the accessory's first) and its key: the key checked
    /// against the certificate, the certificates made the PKCS#7 the accessory sends.
    private init(certificates: [OpenSSL.Certificate], key: OpenSSL.Key) throws(AuthenticationSetupError) {
        guard let leaf = certificates.first else {
            throw AuthenticationSetupError(problem: "no certificate was given; give the accessory's certificate")
        }
        switch key.kind.scheme {
        case let .success(scheme): self.scheme = scheme
        case let .failure(failure): throw AuthenticationSetupError(problem: "the private key is \(failure.detail)")
        }
        guard let certified = leaf.publicKey(), certified.matches(key) else {
            throw AuthenticationSetupError(problem: "the private key does not belong to the certificate (\(leaf.subject)); give the key the certificate was made for")
        }
        self.key = key
        do {
            certificate = try OpenSSL.Certificate.pkcs7(certificates)
        } catch {
            throw AuthenticationSetupError(problem: "\(error)")
        }
    }

    /// Credentials from two PEM files.
    public static func load(certificatePath: String, keyPath: String) throws(AuthenticationSetupError) -> AccessoryCredentials {
        let certificate = try TrustAnchors.read(certificatePath)
        let key = try TrustAnchors.read(keyPath)
        do {
            return try AccessoryCredentials(certificatePEM: certificate, privateKeyPEM: key)
        } catch {
            throw AuthenticationSetupError(path: certificatePath, problem: error.problem)
        }
    }

    private init(certificate: [UInt8], scheme: AuthenticationScheme, key: OpenSSL.Key) {
        self.certificate = certificate
        self.scheme = scheme
        self.key = key
    }

    /// The same certificate with a freshly generated key of the same kind: every signature is
    /// forged (the simulator's `forged` fault).
    public func forged() throws(AuthenticationSetupError) -> AccessoryCredentials {
        do {
            let other = switch scheme {
            case .rsaPKCS1SHA1: try OpenSSL.Key.generateRSA(bits: 1024)
            case .ecdsaP256: try OpenSSL.Key.generateEC(curve: "P-256")
            }
            return AccessoryCredentials(certificate: certificate, scheme: scheme, key: other)
        } catch {
            throw AuthenticationSetupError(problem: "\(error)")
        }
    }

    /// The response to `challenge`: its signature by the key, laid out as the signing rule says.
    /// Empty when the challenge has not the length the scheme signs (the device then sees a
    /// bad signature).
    public func sign(challenge: [UInt8]) -> [UInt8] {
        let rule = SigningRule(scheme)
        guard let digest = rule.digest(of: challenge) else { return [] }
        return (try? key.sign(digest: digest, digestAlgorithm: rule.digestAlgorithm, encoding: rule.encoding)) ?? []
    }
}
