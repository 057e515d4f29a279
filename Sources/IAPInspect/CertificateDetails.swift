internal import AccessoryLogging
internal import IAPWire

/// What a certificate reader made of an accessory's certificate, for a trace: named fields
/// (subject, issuer, serial…), or why it could not be read.
///
/// IAPInspect reads no certificates itself (it links no cryptography); a tool that does hands a
/// reader to ``FrameInspector/certificateReader`` (iapctl uses IAPAuthentication's).
public struct CertificateReading: Sendable {
    /// The fields in the order shown, e.g. `("subject", "C=US, O=Apple Inc., …")`.
    public var fields: [(name: String, value: String)]
    /// Why the certificate could not be read, when it could not.
    public var error: String?

    /// Creates a reading.
    public init(fields: [(name: String, value: String)] = [], error: String? = nil) {
        self.fields = fields
        self.error = error
    }
}

extension FrameInspector {
    /// The longest iAP1 certificate collected from RetAccessoryAuthenticationInfo sections (what
    /// the device side collects at most).
    static let maxIAP1Certificate = 16 * 1024

    /// Adds what the reader makes of `certificate` to a report's details and JSON fields.
    func describeCertificate(_ certificate: [UInt8], details: inout [String], fields: inout [(String, JSONValue)]) {
        guard let certificateReader else { return }
        let reading = certificateReader(certificate)
        if let error = reading.error {
            details.append("certificate (\(certificate.count) bytes): cannot be read: \(error.escapedForTerminal)")
            fields.append(("certificate", .object([("length", .int(certificate.count)), ("error", .string(error))])))
            return
        }
        details.append("certificate (\(certificate.count) bytes):")
        for field in reading.fields { details.append("  \(field.name): \(field.value.escapedForTerminal)") }
        fields.append(("certificate", .object([("length", .int(certificate.count))] + reading.fields.map { ($0.name, .string($0.value)) })))
    }

    /// iAP2: the certificate of an AuthenticationCertificate message.
    func noteCertificate(in message: ControlMessage, details: inout [String], fields: inout [(String, JSONValue)]) {
        guard message.id == .authenticationCertificate, let certificate = message.parameter(0)?.data else { return }
        describeCertificate(certificate, details: &details, fields: &fields)
    }

    /// iAP1: collects RetAccessoryAuthenticationInfo sections (authentication 2.0: major, minor,
    /// section, last section, data) and, with its last section, reads the certificate and keeps
    /// it for the check of the response.
    mutating func noteCertificateSection(_ packet: IAP1Packet, offset: Int, details: inout [String], fields: inout [(String, JSONValue)]) {
        guard certificateReader != nil || authenticationChecker != nil, packet.lingo == 0x00,
              packet.command == UInt16(IAP1Command.retAccessoryAuthenticationInfo), packet.payload.count >= 4 else { return }
        let payload = packet.payload
        let (section, last) = (payload[payload.startIndex + 2], payload[payload.startIndex + 3])
        if section == 0 {
            iap1CertificateSections = []
            iap1CertificateOffset = offset
            // A new certificate is coming: a response before it is whole is not checked against the old one.
            authenticationTrail.certificate = nil
        }
        guard iap1CertificateSections.count + payload.count - 4 <= Self.maxIAP1Certificate else {
            iap1CertificateSections = []
            authenticationTrail.certificate = nil
            return
        }
        iap1CertificateSections += payload.dropFirst(4)
        if section == last {
            describeCertificate(iap1CertificateSections, details: &details, fields: &fields)
            authenticationTrail.certificate = (iap1CertificateSections, iap1CertificateOffset)
            authenticationTrail.challenge = nil
            iap1CertificateSections = []
        }
    }
}

extension CaptureDecoder {
    /// Checks each authentication response against the challenge and certificate before it
    /// (see ``FrameInspector/authenticationChecker``); nil checks nothing.
    public var authenticationChecker: (@Sendable (AuthenticationEvidence) -> AuthenticationChecking)? {
        get { inspector.authenticationChecker }
        set { inspector.authenticationChecker = newValue }
    }

    /// Reads the certificates accessories send (iAP2 AuthenticationCertificate, iAP1
    /// RetAccessoryAuthenticationInfo sections) into the reports; nil leaves them as bytes.
    public var certificateReader: (@Sendable ([UInt8]) -> CertificateReading)? {
        get { inspector.certificateReader }
        set { inspector.certificateReader = newValue }
    }
}
