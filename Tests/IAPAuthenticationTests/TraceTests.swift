import IAPAuthentication
import IAPInspect
import IAPLink
import Testing

/// `iapctl decode` and `--trace` show the certificate an accessory sends, parsed.
@Suite struct TraceTests {
    static func reader(_ der: [UInt8]) -> CertificateReading {
        switch CertificateReader.summary(of: der) {
        case let .success(summary): return CertificateReading(fields: [("subject", summary.subject), ("serialNumber", summary.serialNumber)])
        case let .failure(failure): return CertificateReading(error: failure.description)
        }
    }

    @Test("the certificate in a trace of the accessory's side, iAP2 and iAP1 (reassembled from its sections)", arguments: [false, true])
    func certificateInTrace(iap1: Bool) throws {
        var exchange = try Exchange(profile: Fixtures.profile("accessory-rsa", iap1: iap1), policy: VerifyingAuthentication(mode: .record))
        exchange.run()
        #expect(exchange.identity != nil)
        var decoder = CaptureDecoder()
        decoder.certificateReader = { Self.reader($0) }
        var text: [String] = []
        var json: [String] = []
        decoder.feed(exchange.accessoryBytes.span.bytes) { report in
            text.append(report.text())
            json.append(report.json.serialized())
        }
        decoder.finish { text.append($0.text()) }
        let certificate = try #require(text.first { $0.contains("certificate (") })
        #expect(certificate.contains("subject: C=US, O=AccessoryHost Tests, OU=Test Accessories, CN=IPA_TEST_RSA_0001"))
        #expect(json.contains { $0.contains("\"certificate\":{\"length\":") && $0.contains("IPA_TEST_RSA_0001") })
        // Without a reader, no certificate is read.
        var plain = CaptureDecoder()
        var plainText: [String] = []
        plain.feed(exchange.accessoryBytes.span.bytes) { plainText.append($0.text()) }
        #expect(!plainText.contains { $0.contains("subject:") })
    }

    @Test func unreadableCertificateSaysWhy() throws {
        var profile = Fixtures.profile("accessory-rsa")
        profile.deviations = [.unverifiableCertificate]
        var exchange = try Exchange(profile: profile, policy: VerifyingAuthentication(mode: .record))
        exchange.run()
        var decoder = CaptureDecoder()
        decoder.certificateReader = { Self.reader($0) }
        var text: [String] = []
        decoder.feed(exchange.accessoryBytes.span.bytes) { text.append($0.text()) }
        #expect(text.contains { $0.contains("certificate (608 bytes): cannot be read: malformed certificate: ") })
    }
}
