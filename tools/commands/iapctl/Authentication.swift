import AccessoryHost
import AccessoryLogging
import CLIKit
import IAPAuthentication
import IAPInspect
import IAPLink

/// `--auth`, `--trust` and `--check-validity`: the authentication policy the host runs.
enum AuthenticationOptions {
    static let options: [OptionSpec] = [
        .value("auth", valueName: "policy",
               help: "Authentication: accept (check nothing), record (verify and report, accept anyway) or require (refuse what fails).",
               defaultValue: "record", allowedValues: AuthenticationMode.allCases.map(\.rawValue), inherited: true),
        OptionSpec.value("trust", valueName: "file|dir", help: "CA certificates (PEM file, or a directory of them) accessories' certificates must chain to.",
                         inherited: true).completing(.files),
        .flag("check-validity", help: "Count a certificate outside its validity period as a failure (refused under --auth require).",
              inherited: true),
    ].map { $0.inGroup(OptionGroup.authentication) }

    /// The policy the options ask for.
    static func policy(_ command: ParsedCommand) throws -> any AuthenticationPolicy {
        let mode = AuthenticationMode(rawValue: command.value("auth") ?? "record") ?? .record
        var trust: TrustAnchors?
        if let path = command.value("trust") {
            do {
                trust = try TrustAnchors(path: path)
            } catch {
                throw ToolError(description: "--trust \(error)", exitCode: .noInput)
            }
        }
        return mode.policy(trust: trust, checkValidity: command.flag("check-validity"))
    }
}

/// The outcome as `info` prints it: the verdict, then the certificate (escaped).
func authenticationText(_ outcome: AuthenticationOutcome) -> String {
    var out = "  authentication:    \(outcome.description.escapedForTerminal)\n"
    if outcome.status != .notChecked {
        out += "    signature:       \(outcome.signatureVerified ? "verified" : "not verified")\n"
        out += "    chain:           \(outcome.chainVerified ? "to a trust anchor" : "not verified")\n"
    }
    if let certificate = outcome.certificate {
        out += "    subject:         \(certificate.subject.escapedForTerminal)\n"
        out += "    issuer:          \(certificate.issuer.escapedForTerminal)\n"
        out += "    serial:          \(certificate.serialNumber.escapedForTerminal)\n"
        out += "    valid:           \(certificate.notBefore) to \(certificate.notAfter) (\(certificate.validity.rawValue))\n"
        out += "    key:             \(certificate.key.escapedForTerminal)" + (certificate.scheme.map { ", \($0)" } ?? "") + "\n"
    }
    return out
}

/// The outcome as one line under `list`'s entry (nothing when not checked).
func authenticationListLine(_ outcome: AuthenticationOutcome) -> String {
    outcome.status == .notChecked ? "" : "    authentication: \(outcome.description.escapedForTerminal)\n"
}

/// The outcome in JSON (`list --json`, `info --json`, `wait --json`): strings exact.
func authenticationJSON(_ outcome: AuthenticationOutcome) -> JSONValue {
    .object([
        ("status", .string(outcome.statusName)),
        ("accepted", .bool(outcome.accepted)),
        ("reason", outcome.failure.map { .string($0.kind) } ?? .null),
        ("detail", outcome.failure.map { .string($0.detail) } ?? .null),
        ("signatureVerified", .bool(outcome.signatureVerified)),
        ("chainVerified", .bool(outcome.chainVerified)),
        ("certificate", outcome.certificate.map(certificateJSON) ?? .null),
    ])
}

func certificateJSON(_ certificate: CertificateSummary) -> JSONValue {
    .object([
        ("subject", .string(certificate.subject)), ("issuer", .string(certificate.issuer)),
        ("serialNumber", .string(certificate.serialNumber)), ("notBefore", .string(certificate.notBefore)),
        ("notAfter", .string(certificate.notAfter)), ("validity", .string(certificate.validity.rawValue)),
        ("key", .string(certificate.key)), ("scheme", certificate.scheme.map { .string($0.rawValue) } ?? .null),
        ("signatureAlgorithm", .string(certificate.signatureAlgorithm)),
    ])
}

/// Reads certificates in traces and `decode` with OpenSSL.
@Sendable func readCertificate(_ der: [UInt8]) -> CertificateReading {
    switch CertificateReader.summary(of: der) {
    case let .success(summary):
        return CertificateReading(fields: [
            ("subject", summary.subject), ("issuer", summary.issuer), ("serialNumber", summary.serialNumber),
            ("notBefore", summary.notBefore), ("notAfter", summary.notAfter), ("validity", summary.validity.rawValue),
            ("key", summary.key + (summary.scheme.map { ", \($0)" } ?? "")), ("signatureAlgorithm", summary.signatureAlgorithm),
        ])
    case let .failure(failure):
        return CertificateReading(error: failure.description)
    }
}
