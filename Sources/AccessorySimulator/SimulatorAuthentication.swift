import IAPAuthentication
public import IAPLink
import IAPWire

extension SimulatorProfile {
    /// The accessory's coprocessor (the JSON object `authentication`): PEM files of its
    /// certificate (the accessory's first, then any issuers to send along) and of its private key
    /// (RSA for coprocessor 2.0, P-256 for 3.0). Paths are relative to the profile's directory
    /// when the profile is loaded from a file, to the working directory otherwise.
    public struct Authentication: Codable, Sendable, Equatable {
        /// The certificate PEM file.
        public var certificate: String
        /// The private key PEM file (unencrypted).
        public var key: String

        /// Creates the section.
        public init(certificate: String, key: String) {
            self.certificate = certificate
            self.key = key
        }

        enum CodingKeys: String, CodingKey, CaseIterable {
            case certificate, key
        }

        /// Decodes the section, refusing unknown fields.
        public init(from decoder: any Decoder) throws {
            try rejectUnknownFields(in: decoder, known: CodingKeys.self)
            let container = try decoder.container(keyedBy: CodingKeys.self)
            certificate = try container.decode(String.self, forKey: .certificate)
            key = try container.decode(String.self, forKey: .key)
        }
    }

    /// The profile with the authentication files' relative paths made relative to the directory
    /// of `profilePath`.
    func resolvingFiles(relativeTo profilePath: String) -> SimulatorProfile {
        guard var files = authentication, let slash = profilePath.lastIndex(of: "/") else { return self }
        let directory = String(profilePath[...slash])
        if !files.certificate.hasPrefix("/") { files.certificate = directory + files.certificate }
        if !files.key.hasPrefix("/") { files.key = directory + files.key }
        var profile = self
        profile.authentication = files
        return profile
    }

    /// The accessory's signer: the profile's credentials (with a wrong key under the `forged`
    /// fault), or nil for the stand-in.
    ///
    /// - Throws: ``SimulatorProfileError`` naming `authentication` when the files cannot be used.
    public func signer() throws(SimulatorProfileError) -> (any AuthenticationSigner)? {
        guard let files = authentication else { return nil }
        let signer: any AuthenticationSigner
        do {
            let credentials = try AccessoryCredentials.load(certificatePath: files.certificate, keyPath: files.key)
            signer = faults.forged ? try credentials.forged() : credentials
        } catch {
            throw SimulatorProfileError(field: "authentication", problem: "\(error)")
        }
        // Over iAP2 the certificate travels in one control message, in one link packet.
        let needed = ControlMessage.headerSize + Parameter.headerSize + signer.certificate.count + LinkPacketHeader.overhead
        guard iap1 != nil || needed <= Int(linkConfiguration().parameters.maxPacketLength) else {
            throw SimulatorProfileError(field: "authentication.certificate",
                                        problem: "makes an AuthenticationCertificate of \(needed) bytes, more than link.maxPacketLength; raise it or use a shorter certificate")
        }
        return signer
    }
}
