// libFuzzer target: the certificate path of IAPAuthentication, OpenSSL linked (uninstrumented:
// coverage guides through our Swift side, ASan watches every buffer we hand OpenSSL and get
// back). Arbitrary bytes as an accessory's certificate (DER: PKCS#7 or X.509) and response under
// record and require with the test CA as trust anchor, as a certificate for a person (iapctl
// decode), and as PEM trust anchors. Checks: no crash; record accepts everything; a certificate
// require refuses is never accepted; reading and verifying agree on whether it can be read.

import Glibc
import IAPAuthentication
import IAPLink

let trust: TrustAnchors? = {
    guard let path = getenv("CERTIFICATE_FUZZ_TRUST").map({ String(cString: $0) }) else { return nil }
    return try? TrustAnchors(path: path)
}()
let record = VerifyingAuthentication(mode: .record, trust: trust)
let require = VerifyingAuthentication(mode: .require, trust: trust, checkValidity: true)

@_cdecl("LLVMFuzzerTestOneInput")
public func certificateFuzz(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let input = Array(UnsafeBufferPointer(start: data, count: size))
    // The outer DER element (as far as its length says and the input holds) is the certificate,
    // what follows it the response: the seeds are whole certificates, and the fuzzer grows
    // responses behind them. The last 20 or 32 bytes of the certificate serve as the challenge.
    let certificateLength = min(size, outerElementLength(input) ?? size)
    let certificate = Array(input[..<certificateLength])
    let response = Array(input[certificateLength...])
    let challenge = Array(certificate.suffix(size % 2 == 0 ? 20 : 32))

    let recorded = record.outcome(certificate: certificate, challenge: challenge, response: response)
    precondition(recorded.accepted, "record refused an accessory")
    precondition(record.examine(certificate: certificate).refusal == nil, "record refused a certificate")
    _ = recorded.description

    let examination = require.examine(certificate: certificate)
    let required = require.outcome(certificate: certificate, challenge: challenge, response: response)
    if examination.refusal != nil { precondition(!required.accepted, "require accepted a certificate it refused") }
    precondition(required.accepted == (required.status == .verified), "require's verdict and acceptance differ")

    let read = CertificateReader.summary(of: certificate)
    if case .success = read { precondition(recorded.certificate != nil, "read for a person but not for the check") }

    _ = try? TrustAnchors(pem: input)
    return 0
}

/// The length of the DER element `bytes` starts with (tag, length, contents), when its length
/// field is readable.
func outerElementLength(_ bytes: [UInt8]) -> Int? {
    guard bytes.count >= 2 else { return nil }
    let first = Int(bytes[1])
    guard first & 0x80 != 0 else { return 2 + first }
    let count = first & 0x7F
    guard (1...3).contains(count), bytes.count >= 2 + count else { return nil }
    return bytes[2..<(2 + count)].reduce(0) { $0 << 8 | Int($1) } + 2 + count
}
