import FoundationEssentials

/// Why trust anchors or an accessory's credentials could not be loaded: the file and what to do.
public struct AuthenticationSetupError: Error, Hashable, Sendable, CustomStringConvertible {
    /// The file or directory concerned, when there is one.
    public var path: String?
    /// What is wrong and how to fix it.
    public var problem: String

    /// Creates an error.
    public init(path: String? = nil, problem: String) {
        self.path = path
        self.problem = problem
    }

    /// `path: problem`, or the problem alone.
    public var description: String { path.map { "\($0): \(problem)" } ?? problem }
}

/// The certificates an accessory's certificate must chain to: the accessories' CA (Apple's
/// "Apple iPod Accessories Certification Authority" for real ones, a test CA for the
/// simulator's), from a PEM file or a directory of PEM files.
///
/// Every certificate given is an anchor as it is: a chain may end at an intermediate CA, and
/// Apple's root need not be given. Validity periods are not part of the chain check (see
/// ``VerifyingAuthentication/checkValidity``).
public final class TrustAnchors: Sendable {
    let store: OpenSSL.Store
    /// How many certificates it holds.
    public var count: Int { store.count }
    /// Where they came from (a path, or "PEM").
    public let source: String

    /// The certificates in PEM text (one or more `-----BEGIN CERTIFICATE-----` blocks).
    ///
    /// - Throws: ``AuthenticationSetupError`` when the text holds no certificate.
    public init(pem: [UInt8], source: String = "PEM") throws(AuthenticationSetupError) {
        let certificates: [OpenSSL.Certificate]
        do {
            certificates = try OpenSSL.Certificate.fromPEM(pem)
        } catch {
            throw AuthenticationSetupError(path: source, problem: "\(error)")
        }
        guard !certificates.isEmpty else {
            throw AuthenticationSetupError(path: source, problem: "holds no PEM certificate (-----BEGIN CERTIFICATE-----); give the CA's certificate in PEM form")
        }
        do {
            store = try OpenSSL.Store(anchors: certificates)
        } catch {
            throw AuthenticationSetupError(path: source, problem: "\(error)")
        }
        self.source = source
    }

    /// The certificates of a PEM file, or of every `.pem`, `.crt` and `.cer` file in a directory.
    ///
    /// - Throws: ``AuthenticationSetupError`` naming the path when it cannot be read or holds no
    ///   certificate.
    public convenience init(path: String) throws(AuthenticationSetupError) {
        var isDirectory = false
        guard FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory) else {
            throw AuthenticationSetupError(path: path, problem: "no such file or directory; give a PEM file of CA certificates or a directory of them")
        }
        var pem: [UInt8] = []
        if isDirectory {
            let names: [String]
            do {
                names = try FileManager.default.contentsOfDirectory(atPath: path).sorted()
            } catch {
                throw AuthenticationSetupError(path: path, problem: "cannot be listed (\(error)); check its permissions")
            }
            for name in names where [".pem", ".crt", ".cer"].contains(where: { name.lowercased().hasSuffix($0) }) {
                pem += try Self.read(path + "/" + name) + [0x0A]
            }
        } else {
            pem = try Self.read(path)
        }
        try self.init(pem: pem, source: path)
    }

    static func read(_ path: String) throws(AuthenticationSetupError) -> [UInt8] {
        let data: Data
        do {
            data = try Data(contentsOf: URL(filePath: path))
        } catch {
            throw AuthenticationSetupError(path: path, problem: "cannot be read (\(error)); check the path and its permissions")
        }
        guard data.count <= OpenSSL.maxInputLength else {
            throw AuthenticationSetupError(path: path, problem: "is \(data.count) bytes, too large for PEM certificates or keys")
        }
        return [UInt8](data)
    }
}
