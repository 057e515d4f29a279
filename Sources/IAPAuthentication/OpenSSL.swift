internal import COpenSSL
internal import Glibc
internal import IAPLink

/// The one place that calls OpenSSL (libcrypto 3.0) and holds its pointers.
///
/// Every OpenSSL object lives in a final class of this namespace that frees it in `deinit`:
/// ``Certificate`` (X509), ``Key`` (EVP_PKEY), ``Store`` (X509_STORE). Each is created whole by
/// a static function that returns nil or throws on any failure, and is only read afterwards;
/// OpenSSL 3 makes concurrent reads of certificates, keys and stores safe, which is what their
/// `@unchecked Sendable` rests on. Byte arrays go in and out by copy: no pointer escapes a call.
/// Nothing here decides anything: which digest, padding and lengths apply is
/// ``SigningRule``'s, what passes is ``VerifyingAuthentication``'s.
///
/// Error queue: OpenSSL records failures on a per-thread queue; each entry point clears it first
/// and ``drainErrors()`` turns what a failure left into text.
enum OpenSSL {
    /// The most bytes of DER or PEM handed to the parser: far above any accessory certificate
    /// (about 1 KB; iAP1 collects at most 16 KiB) and trust file.
    static let maxInputLength = 1 << 20

    /// A digest algorithm a signature names.
    enum Digest {
        case sha1
        case sha256

        fileprivate var md: OpaquePointer? {
            switch self {
            case .sha1: return EVP_sha1()
            case .sha256: return EVP_sha256()
            }
        }
    }

    /// How a response is laid out on the wire.
    enum SignatureEncoding {
        /// The signature bytes as the algorithm makes them (RSA: the modulus' length).
        case native
        /// ECDSA as r‖s, each a big-endian integer of `width` bytes (OpenSSL wants DER).
        case rawRS(width: Int)
    }

    /// The reasons of the errors OpenSSL queued on this thread, oldest first and without
    /// repeats (e.g. `too long; bad object header`), emptying the queue.
    static func drainErrors() -> String {
        var reasons: [String] = []
        while true {
            let code = ERR_get_error()
            if code == 0 { break }
            let reason = ERR_reason_error_string(code).map { String(cString: $0) } ?? "error \(code)"
            if reasons.count < 3, !reasons.contains(reason) { reasons.append(reason) }
        }
        return reasons.joined(separator: "; ")
    }

    // MARK: Certificates

    /// An X.509 certificate.
    final class Certificate: @unchecked Sendable {
        fileprivate let x509: OpaquePointer

        fileprivate init(taking x509: OpaquePointer) { self.x509 = x509 }
        deinit { X509_free(x509) }

        /// Certificates from DER: a PKCS#7 SignedData (what accessories send; its certificates in
        /// order) or a bare X.509 certificate.
        static func fromDER(_ der: [UInt8]) throws(AuthenticationFailure) -> [Certificate] {
            guard !der.isEmpty else { throw .malformedCertificate("the accessory sent an empty certificate") }
            guard der.count <= maxInputLength else {
                throw .malformedCertificate("\(der.count) bytes, more than any certificate (at most \(maxInputLength))")
            }
            ERR_clear_error()
            let fromPKCS7: [Certificate]? = der.withUnsafeBufferPointer { buffer in
                var cursor = buffer.baseAddress
                guard let p7 = d2i_PKCS7(nil, &cursor, buffer.count) else { return nil }
                defer { PKCS7_free(p7) }
                guard let stack = accessoryhost_pkcs7_certificates(p7) else { return [] }
                var certificates: [Certificate] = []
                for index in 0..<max(0, accessoryhost_sk_X509_num(stack)) {
                    guard let x509 = accessoryhost_sk_X509_value(stack, index), X509_up_ref(x509) == 1 else { continue }
                    certificates.append(Certificate(taking: x509))
                }
                return certificates
            }
            if let fromPKCS7 {
                guard !fromPKCS7.isEmpty else {
                    throw .malformedCertificate("the PKCS#7 structure holds no certificate (it must be SignedData with the accessory's certificate)")
                }
                return fromPKCS7
            }
            let pkcs7Error = drainErrors()
            let bare: Certificate? = der.withUnsafeBufferPointer { buffer in
                var cursor = buffer.baseAddress
                return d2i_X509(nil, &cursor, buffer.count).map(Certificate.init(taking:))
            }
            if let bare { return [bare] }
            let x509Error = drainErrors()
            throw .malformedCertificate("neither PKCS#7 nor X.509 DER (\(pkcs7Error.isEmpty ? x509Error : pkcs7Error))")
        }

        /// Every certificate in PEM text (`-----BEGIN CERTIFICATE-----` blocks; `PKCS7` blocks
        /// give their certificates). Empty when there is none.
        static func fromPEM(_ pem: [UInt8]) throws(OpenSSLError) -> [Certificate] {
            guard pem.count <= maxInputLength else { throw OpenSSLError("\(pem.count) bytes, too large for a PEM file of certificates") }
            ERR_clear_error()
            var certificates: [Certificate] = []
            try withMemoryBIO(pem) { bio throws(OpenSSLError) in
                while let x509 = PEM_read_bio_X509(bio, nil, nil, nil) { certificates.append(Certificate(taking: x509)) }
            }
            ERR_clear_error() // the read that found no more
            if certificates.isEmpty {
                let fromPKCS7: [Certificate] = try withMemoryBIO(pem) { bio throws(OpenSSLError) in
                    guard let p7 = PEM_read_bio_PKCS7(bio, nil, nil, nil) else { return [] }
                    defer { PKCS7_free(p7) }
                    guard let stack = accessoryhost_pkcs7_certificates(p7) else { return [] }
                    var found: [Certificate] = []
                    for index in 0..<max(0, accessoryhost_sk_X509_num(stack)) {
                        guard let x509 = accessoryhost_sk_X509_value(stack, index), X509_up_ref(x509) == 1 else { continue }
                        found.append(Certificate(taking: x509))
                    }
                    return found
                }
                ERR_clear_error()
                certificates = fromPKCS7
            }
            return certificates
        }

        /// The certificates as a PKCS#7 SignedData with no content and no signers (the form
        /// Apple's coprocessors hand out), DER.
        static func pkcs7(_ certificates: [Certificate]) throws(OpenSSLError) -> [UInt8] {
            ERR_clear_error()
            guard let p7 = PKCS7_new() else { throw OpenSSLError("PKCS7_new: \(drainErrors())") }
            defer { PKCS7_free(p7) }
            guard PKCS7_set_type(p7, NID_pkcs7_signed) == 1, PKCS7_content_new(p7, NID_pkcs7_data) == 1 else {
                throw OpenSSLError("cannot make a PKCS#7 SignedData: \(drainErrors())")
            }
            for certificate in certificates where PKCS7_add_certificate(p7, certificate.x509) != 1 {
                throw OpenSSLError("cannot add a certificate to the PKCS#7: \(drainErrors())")
            }
            let length = i2d_PKCS7(p7, nil)
            guard length > 0 else { throw OpenSSLError("cannot encode the PKCS#7: \(drainErrors())") }
            var der = [UInt8](repeating: 0, count: Int(length))
            let written = der.withUnsafeMutableBufferPointer { buffer in
                var cursor = buffer.baseAddress
                return i2d_PKCS7(p7, &cursor)
            }
            guard written == length else { throw OpenSSLError("cannot encode the PKCS#7: \(drainErrors())") }
            return der
        }

        /// The subject's distinguished name.
        var subject: String { Self.name(X509_get_subject_name(x509)) }
        /// The issuer's distinguished name.
        var issuer: String { Self.name(X509_get_issuer_name(x509)) }

        /// The issuer's common name (its last CN), e.g. `Apple iPod Accessories Certification
        /// Authority`, as UTF-8 of at most `maxNameLength` bytes; nil when the name has none or
        /// it cannot be read.
        var issuerCommonName: String? {
            guard let name = X509_get_issuer_name(x509) else { return nil }
            ERR_clear_error()
            defer { ERR_clear_error() }
            var index: Int32 = -1
            var last: Int32 = -1
            while true {
                index = X509_NAME_get_index_by_NID(name, NID_commonName, index)
                if index < 0 { break }
                last = index
            }
            guard last >= 0, let entry = X509_NAME_get_entry(name, last), let data = X509_NAME_ENTRY_get_data(entry) else { return nil }
            var utf8: UnsafeMutablePointer<UInt8>?
            let length = ASN1_STRING_to_UTF8(&utf8, data)
            guard length >= 0, let utf8 else { return nil }
            defer { CRYPTO_free(utf8, #fileID, #line) }
            let text = String(decoding: UnsafeBufferPointer(start: utf8, count: min(Int(length), Self.maxNameLength)), as: UTF8.self)
            return text.isEmpty ? nil : text
        }

        /// The most bytes of a common name ``issuerCommonName`` keeps (a name longer than any CA's
        /// is cut there).
        static let maxNameLength = 128

        /// The serial number in hexadecimal.
        var serialNumber: String {
            guard let integer = X509_get_serialNumber(x509), let number = ASN1_INTEGER_to_BN(integer, nil) else { return "?" }
            defer { BN_free(number) }
            guard let hex = BN_bn2hex(number) else { return "?" }
            defer { CRYPTO_free(hex, #fileID, #line) }
            return String(cString: hex)
        }

        /// The validity period's ends as ISO 8601 text in UTC.
        var notBefore: String { Self.iso8601(X509_get0_notBefore(x509)) }
        var notAfter: String { Self.iso8601(X509_get0_notAfter(x509)) }

        /// The validity period against `now` (seconds since 1970; nil: the clock).
        func validity(at now: Int?) -> CertificateValidity {
            var time = time_t(now ?? Int(Glibc.time(nil)))
            if let end = X509_get0_notAfter(x509), X509_cmp_time(end, &time) < 0 { return .expired }
            if let start = X509_get0_notBefore(x509), X509_cmp_time(start, &time) > 0 { return .notYetValid }
            return .current
        }

        /// The certificate's signature algorithm's name, e.g. `sha1WithRSAEncryption`.
        var signatureAlgorithm: String {
            let nid = X509_get_signature_nid(x509)
            guard nid != NID_undef, let name = OBJ_nid2ln(nid) else { return "unknown" }
            return String(cString: name)
        }

        /// The public key (nil when it cannot be decoded).
        func publicKey() -> Key? {
            ERR_clear_error()
            guard let key = X509_get0_pubkey(x509), EVP_PKEY_up_ref(key) == 1 else {
                ERR_clear_error()
                return nil
            }
            return Key(taking: key)
        }

        /// Whether `other` issued this certificate (names only: the chain check verifies).
        func isIssued(by other: Certificate) -> Bool { X509_check_issued(other.x509, x509) == X509_V_OK }

        private static func name(_ name: OpaquePointer?) -> String {
            guard let name else { return "" }
            return (try? withMemoryBIO([]) { bio throws(OpenSSLError) in
                guard X509_NAME_print_ex(bio, name, 0, accessoryhost_name_flags()) >= 0 else { return "" }
                return readAll(bio)
            }) ?? ""
        }

        private static func iso8601(_ time: UnsafePointer<ASN1_TIME>?) -> String {
            guard let time else { return "?" }
            var parts = tm()
            guard ASN1_TIME_to_tm(time, &parts) == 1 else { return "?" }
            func two(_ value: Int32) -> String { value < 10 ? "0\(value)" : "\(value)" }
            return "\(parts.tm_year + 1900)-\(two(parts.tm_mon + 1))-\(two(parts.tm_mday))T"
                + "\(two(parts.tm_hour)):\(two(parts.tm_min)):\(two(parts.tm_sec))Z"
        }
    }

    // MARK: Keys

    /// A public or private key.
    final class Key: @unchecked Sendable {
        fileprivate let pkey: OpaquePointer

        fileprivate init(taking pkey: OpaquePointer) { self.pkey = pkey }
        deinit { EVP_PKEY_free(pkey) }

        /// The kind of key.
        enum Kind: Equatable {
            case rsa(bits: Int)
            /// An EC key on the named group (e.g. `prime256v1`).
            case ec(group: String)
            /// Another algorithm (its OpenSSL name).
            case other(String)
        }

        var kind: Kind {
            switch EVP_PKEY_get_base_id(pkey) {
            case EVP_PKEY_RSA: return .rsa(bits: Int(EVP_PKEY_get_bits(pkey)))
            case EVP_PKEY_EC:
                var buffer = [CChar](repeating: 0, count: 64)
                var length = 0
                guard EVP_PKEY_get_group_name(pkey, &buffer, buffer.count, &length) == 1 else {
                    ERR_clear_error()
                    return .ec(group: "unknown")
                }
                return .ec(group: String(decoding: buffer.prefix(min(length, buffer.count)).map { UInt8(bitPattern: $0) }, as: UTF8.self))
            case let id:
                guard let name = OBJ_nid2sn(id) else { return .other("algorithm \(id)") }
                return .other(String(cString: name))
            }
        }

        /// The most bytes a signature by this key has (an RSA key's modulus length).
        var maximumSignatureLength: Int { Int(EVP_PKEY_get_size(pkey)) }

        /// Whether both are the same key (a private key matches its public half).
        func matches(_ other: Key) -> Bool {
            defer { ERR_clear_error() }
            return EVP_PKEY_eq(pkey, other.pkey) == 1
        }

        /// A private key from PEM (PKCS#8 or traditional, unencrypted).
        static func privateKey(pem: [UInt8]) throws(OpenSSLError) -> Key {
            guard pem.count <= maxInputLength else { throw OpenSSLError("\(pem.count) bytes, too large for a PEM key") }
            ERR_clear_error()
            return try withMemoryBIO(pem) { bio throws(OpenSSLError) in
                guard let key = PEM_read_bio_PrivateKey(bio, nil, nil, nil) else {
                    throw OpenSSLError("no unencrypted private key in PEM form (\(drainErrors()))")
                }
                return Key(taking: key)
            }
        }

        /// A private key from DER (PKCS#8 PrivateKeyInfo, or a traditional RSA or EC key),
        /// unencrypted.
        static func privateKey(der: [UInt8]) throws(OpenSSLError) -> Key {
            guard !der.isEmpty, der.count <= maxInputLength else { throw OpenSSLError("\(der.count) bytes: no DER private key") }
            ERR_clear_error()
            let key: OpaquePointer? = der.withUnsafeBufferPointer { buffer in
                var cursor = buffer.baseAddress
                return d2i_AutoPrivateKey(nil, &cursor, buffer.count)
            }
            guard let key else { throw OpenSSLError("no unencrypted private key in DER form (\(drainErrors()))") }
            return Key(taking: key)
        }

        /// A new RSA key of `bits` bits.
        static func generateRSA(bits: Int) throws(OpenSSLError) -> Key {
            ERR_clear_error()
            guard let key = accessoryhost_rsa_generate(UInt32(bits)) else { throw OpenSSLError("RSA key generation: \(drainErrors())") }
            return Key(taking: key)
        }

        /// A new EC key on the named curve (`P-256`).
        static func generateEC(curve: String) throws(OpenSSLError) -> Key {
            ERR_clear_error()
            guard let key = accessoryhost_ec_generate(curve) else { throw OpenSSLError("EC key generation: \(drainErrors())") }
            return Key(taking: key)
        }

        /// Whether `signature` (laid out as `encoding`) signs `digest` as a `digestAlgorithm`
        /// digest, with PKCS#1 v1.5 padding for RSA keys.
        func verify(signature: [UInt8], digest: [UInt8], digestAlgorithm: Digest, encoding: SignatureEncoding) -> Bool {
            ERR_clear_error()
            defer { ERR_clear_error() }
            let encoded: [UInt8]
            switch encoding {
            case .native: encoded = signature
            case let .rawRS(width):
                guard signature.count == 2 * width, let der = Self.derSignature(r: Array(signature[..<width]), s: Array(signature[width...])) else {
                    return false
                }
                encoded = der
            }
            guard let context = EVP_PKEY_CTX_new(pkey, nil) else { return false }
            defer { EVP_PKEY_CTX_free(context) }
            guard EVP_PKEY_verify_init(context) == 1, configure(context, digestAlgorithm) else { return false }
            return EVP_PKEY_verify(context, encoded, encoded.count, digest, digest.count) == 1
        }

        /// RSA only: the digest `signature` carries when it is a PKCS#1 v1.5 signature by this
        /// key whose DigestInfo names `digestAlgorithm` (OpenSSL's verify-recover); nil when it is
        /// not one (another key signed it, or its bytes changed). What a failed check uses to
        /// tell a changed challenge (a signature by this key, of other bytes) from a changed
        /// response or key (no signature by this key at all).
        func recoverDigest(signature: [UInt8], digestAlgorithm: Digest) -> [UInt8]? {
            ERR_clear_error()
            defer { ERR_clear_error() }
            guard EVP_PKEY_get_base_id(pkey) == EVP_PKEY_RSA, !signature.isEmpty,
                  let context = EVP_PKEY_CTX_new(pkey, nil) else { return nil }
            defer { EVP_PKEY_CTX_free(context) }
            guard EVP_PKEY_verify_recover_init(context) == 1, configure(context, digestAlgorithm) else { return nil }
            var length = 0
            guard EVP_PKEY_verify_recover(context, nil, &length, signature, signature.count) == 1, length > 0, length <= 512 else { return nil }
            var digest = [UInt8](repeating: 0, count: length)
            guard EVP_PKEY_verify_recover(context, &digest, &length, signature, signature.count) == 1 else { return nil }
            return Array(digest.prefix(length))
        }

        /// The signature of `digest` as a `digestAlgorithm` digest, laid out as `encoding`.
        func sign(digest: [UInt8], digestAlgorithm: Digest, encoding: SignatureEncoding) throws(OpenSSLError) -> [UInt8] {
            ERR_clear_error()
            guard let context = EVP_PKEY_CTX_new(pkey, nil) else { throw OpenSSLError("EVP_PKEY_CTX_new: \(drainErrors())") }
            defer { EVP_PKEY_CTX_free(context) }
            guard EVP_PKEY_sign_init(context) == 1, configure(context, digestAlgorithm) else {
                throw OpenSSLError("cannot sign with this key: \(drainErrors())")
            }
            var length = 0
            guard EVP_PKEY_sign(context, nil, &length, digest, digest.count) == 1, length > 0 else {
                throw OpenSSLError("cannot sign: \(drainErrors())")
            }
            var signature = [UInt8](repeating: 0, count: length)
            guard EVP_PKEY_sign(context, &signature, &length, digest, digest.count) == 1 else {
                throw OpenSSLError("cannot sign: \(drainErrors())")
            }
            signature.removeSubrange(min(length, signature.count)...)
            switch encoding {
            case .native: return signature
            case let .rawRS(width):
                guard let raw = Self.rawSignature(der: signature, width: width) else { throw OpenSSLError("cannot read the ECDSA signature back") }
                return raw
            }
        }

        private func configure(_ context: OpaquePointer, _ digest: Digest) -> Bool {
            if EVP_PKEY_get_base_id(pkey) == EVP_PKEY_RSA, EVP_PKEY_CTX_set_rsa_padding(context, RSA_PKCS1_PADDING) != 1 { return false }
            return EVP_PKEY_CTX_set_signature_md(context, digest.md) == 1
        }

        private static func derSignature(r: [UInt8], s: [UInt8]) -> [UInt8]? {
            guard let signature = ECDSA_SIG_new() else { return nil }
            defer { ECDSA_SIG_free(signature) }
            guard let rNumber = BN_bin2bn(r, Int32(r.count), nil) else { return nil }
            guard let sNumber = BN_bin2bn(s, Int32(s.count), nil) else {
                BN_free(rNumber)
                return nil
            }
            guard ECDSA_SIG_set0(signature, rNumber, sNumber) == 1 else {
                BN_free(rNumber)
                BN_free(sNumber)
                return nil
            }
            let length = i2d_ECDSA_SIG(signature, nil)
            guard length > 0 else { return nil }
            var der = [UInt8](repeating: 0, count: Int(length))
            let written = der.withUnsafeMutableBufferPointer { buffer in
                var cursor = buffer.baseAddress
                return i2d_ECDSA_SIG(signature, &cursor)
            }
            return written == length ? der : nil
        }

        private static func rawSignature(der: [UInt8], width: Int) -> [UInt8]? {
            let signature: OpaquePointer? = der.withUnsafeBufferPointer { buffer in
                var cursor = buffer.baseAddress
                return d2i_ECDSA_SIG(nil, &cursor, buffer.count)
            }
            guard let signature else { return nil }
            defer { ECDSA_SIG_free(signature) }
            var r: OpaquePointer?
            var s: OpaquePointer?
            ECDSA_SIG_get0(signature, &r, &s)
            guard let r, let s else { return nil }
            var raw = [UInt8](repeating: 0, count: 2 * width)
            let ok = raw.withUnsafeMutableBufferPointer { buffer in
                BN_bn2binpad(r, buffer.baseAddress, Int32(width)) == Int32(width)
                    && BN_bn2binpad(s, buffer.baseAddress.map { $0 + width }, Int32(width)) == Int32(width)
            }
            return ok ? raw : nil
        }
    }

    // MARK: Trust

    /// Trust anchors, and the chain check against them.
    final class Store: @unchecked Sendable {
        private let store: OpaquePointer
        /// How many certificates it holds.
        let count: Int

        /// A store of `anchors` (each one trusted as it is, root or intermediate).
        init(anchors: [Certificate]) throws(OpenSSLError) {
            ERR_clear_error()
            guard let store = X509_STORE_new() else { throw OpenSSLError("X509_STORE_new: \(drainErrors())") }
            self.store = store
            var added = 0
            for anchor in anchors {
                if X509_STORE_add_cert(store, anchor.x509) == 1 { added += 1 } else { ERR_clear_error() } // a duplicate
            }
            count = added
        }

        deinit { X509_STORE_free(store) }

        /// Checks that `leaf` chains to an anchor through `intermediates`; nil when it does, or
        /// OpenSSL's reason. The validity periods are checked only when `checkTime` is set.
        func verify(_ leaf: Certificate, intermediates: [Certificate], checkTime: Bool) -> String? {
            ERR_clear_error()
            defer { ERR_clear_error() }
            guard let context = X509_STORE_CTX_new() else { return "X509_STORE_CTX_new failed" }
            defer { X509_STORE_CTX_free(context) }
            guard let untrusted = accessoryhost_sk_X509_new_null() else { return "out of memory" }
            defer { accessoryhost_sk_X509_free(untrusted) } // the certificates stay owned by their classes
            for certificate in intermediates { _ = accessoryhost_sk_X509_push(untrusted, certificate.x509) }
            return withExtendedLifetime(intermediates) {
                guard X509_STORE_CTX_init(context, store, leaf.x509, untrusted) == 1 else { return "cannot start the chain check: \(drainErrors())" }
                // Any anchor may end the chain (a user gives the accessories' CA, not Apple's root).
                var flags = UInt(X509_V_FLAG_PARTIAL_CHAIN)
                if !checkTime { flags |= UInt(X509_V_FLAG_NO_CHECK_TIME) }
                X509_STORE_CTX_set_flags(context, flags)
                if X509_verify_cert(context) == 1 { return nil }
                let code = X509_STORE_CTX_get_error(context)
                return X509_verify_cert_error_string(Int(code)).map { String(cString: $0) } ?? "error \(code)"
            }
        }
    }

    // MARK: Memory BIOs

    /// Runs `body` with a memory BIO over `bytes` (read in place, so only while `body` runs), or
    /// an empty writable one when `bytes` is empty.
    private static func withMemoryBIO<Result>(_ bytes: [UInt8], _ body: (OpaquePointer) throws(OpenSSLError) -> Result) throws(OpenSSLError) -> Result {
        let outcome: Swift.Result<Result, OpenSSLError> = bytes.withUnsafeBytes { raw in
            let created: OpaquePointer? = raw.isEmpty ? BIO_new(BIO_s_mem()) : BIO_new_mem_buf(raw.baseAddress, Int32(raw.count))
            guard let bio = created else { return .failure(OpenSSLError("BIO_new: \(drainErrors())")) }
            defer { BIO_free(bio) }
            do throws(OpenSSLError) { return .success(try body(bio)) } catch { return .failure(error) }
        }
        return try outcome.get()
    }

    private static func readAll(_ bio: OpaquePointer) -> String {
        var bytes: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 512)
        while bytes.count < 64 * 1024 {
            let count = BIO_read(bio, &buffer, Int32(buffer.count))
            if count <= 0 { break }
            bytes += buffer[0..<Int(count)]
        }
        return String(decoding: bytes, as: UTF8.self)
    }
}

/// A failure of OpenSSL outside an accessory's authentication (reading keys and trust files,
/// signing), with OpenSSL's own words.
struct OpenSSLError: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}
