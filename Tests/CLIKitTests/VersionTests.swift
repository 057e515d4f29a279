import Glibc
import ProjectVersion
import Testing

@Suite("The version, from one place")
struct VersionTests {
    /// CHANGELOG.md's newest release heading, `## [0.3.0] - 2026-12-07`, must be the version and
    /// date in Sources/ProjectVersion: a release changes the three together.
    @Test func changelogNamesTheVersionAndItsDate() throws {
        let root = String(#filePath).split(separator: "/", omittingEmptySubsequences: false).dropLast(3).joined(separator: "/")
        let changelog = try #require(readText(root + "/CHANGELOG.md"))
        let releases = changelog.split(separator: "\n").filter { $0.hasPrefix("## [") && !$0.hasPrefix("## [Unreleased]") }
        let newest = try #require(releases.first)
        #expect(newest == "## [\(AccessoryHostVersion.string)] - \(AccessoryHostVersion.releaseDate)")
    }

    @Test func versionIsSemantic() {
        let parts = AccessoryHostVersion.string.split(separator: ".")
        #expect(parts.count == 3 && parts.allSatisfy { Int($0) != nil })
        #expect(AccessoryHostVersion.releaseDate.count == 10)
    }

    private func readText(_ path: String) -> String? {
        guard let file = fopen(path, "r") else { return nil }
        defer { fclose(file) }
        var bytes: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 65_536)
        while true {
            let count = fread(&buffer, 1, buffer.count, file)
            if count == 0 { break }
            bytes += buffer[0..<count]
        }
        return String(decoding: bytes, as: UTF8.self)
    }
}
