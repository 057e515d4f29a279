import Testing
#if canImport(Glibc)
import Glibc
#endif

/// The repository's rules.d folder, found from this file's path.
let rulesDirectory: String = {
    var parts = #filePath.split(separator: "/", omittingEmptySubsequences: false)
    parts.removeLast(3) // Tests/RulesTests/RulesTests.swift
    return parts.joined(separator: "/") + "/rules.d"
}()

func ruleFiles() -> [String] {
    guard let directory = opendir(rulesDirectory) else { return [] }
    defer { closedir(directory) }
    var names: [String] = []
    while let entry = readdir(directory) {
        let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
            String(decoding: raw.prefix { $0 != 0 }, as: UTF8.self)
        }
        if name.hasSuffix(".rules") { names.append(name) }
    }
    return names.sorted()
}

func contents(_ name: String) -> String {
    guard let file = fopen(rulesDirectory + "/" + name, "r") else { return "" }
    defer { fclose(file) }
    var bytes: [UInt8] = []
    var buffer = [UInt8](repeating: 0, count: 4_096)
    while true {
        let count = buffer.withUnsafeMutableBytes { fread($0.baseAddress, 1, $0.count, file) }
        if count == 0 { break }
        bytes += buffer[0..<count]
    }
    return String(decoding: bytes, as: UTF8.self)
}

/// Rule lines without comments and blank lines.
func ruleLines(_ text: String) -> [String] {
    text.split(separator: "\n").map { $0.trimmingCharacters(in: " \t") }.filter { !$0.isEmpty && !$0.hasPrefix("#") }
}

extension Substring {
    func trimmingCharacters(in set: String) -> String {
        var slice = self[...]
        while let first = slice.first, set.contains(first) { slice = slice.dropFirst() }
        while let last = slice.last, set.contains(last) { slice = slice.dropLast() }
        return String(slice)
    }
}

/// Whether udev's glob `pattern` matches `value` (udev uses fnmatch for `==` on ENV values).
func globMatches(_ pattern: String, _ value: String) -> Bool {
    fnmatch(pattern, value, 0) == 0
}

@Suite("udev rules")
struct RulesTests {
    @Test func theRulesShipAndAreNumberedBetween51And72() {
        let files = ruleFiles()
        #expect(files == ["70-mfi-accessory.rules", "71-mfi-accessory-plugdev.rules", "72-mfi-accessory-iapd.rules"])
        for name in files {
            let number = Int(name.prefix { $0.isNumber }) ?? 0
            #expect((51...72).contains(number), "\(name) must sort after 50-udev-default and before 73-seat-late")
        }
    }

    @Test(arguments: ["70-mfi-accessory.rules", "71-mfi-accessory-plugdev.rules", "72-mfi-accessory-iapd.rules"])
    func guardsAndLabelsPair(name: String) {
        let lines = ruleLines(contents(name))
        // Only remove is skipped: a rule that also skipped bind/unbind (e.g. ACTION!="add|change")
        // loses its property and tag on the bind event that follows add (seen with the real udevd).
        #expect(lines.first?.hasPrefix("ACTION==\"remove\", GOTO=\"") == true, "\(name) starts with the action guard")
        #expect(lines.contains { $0.hasPrefix("SUBSYSTEM!=\"usb\", GOTO=\"") })
        let gotos = Set(lines.compactMap { line -> String? in
            guard let range = line.firstRange(of: "GOTO=\"") else { return nil }
            return String(line[range.upperBound...].prefix { $0 != "\"" })
        })
        let labels = lines.compactMap { line -> String? in
            guard line.hasPrefix("LABEL=\"") else { return nil }
            return String(line.dropFirst(7).prefix { $0 != "\"" })
        }
        #expect(gotos.count == 1, "one label to jump to")
        #expect(labels == Array(gotos), "every GOTO has its LABEL, and it is the last line")
        #expect(lines.last?.hasPrefix("LABEL=") == true)
        // Every line is key-operator-value pairs: no stray text udev would reject.
        for line in lines where !line.hasPrefix("LABEL=") {
            for pair in line.split(separator: ",") {
                #expect(pair.contains("="), "'\(pair)' in \(name) is not a key-operator-value pair")
            }
        }
    }

    @Test func theMatchIsTheIAP2InterfaceOnly() throws {
        let lines = ruleLines(contents("70-mfi-accessory.rules"))
        let matchLine = try #require(lines.first { $0.contains("ID_USB_INTERFACES") })
        let pattern = try #require(matchLine.components(between: "ENV{ID_USB_INTERFACES}==\"", and: "\""))
        // ID_USB_INTERFACES lists every interface as :CCSSPP: in lower-case hex.
        #expect(globMatches(pattern, ":fff000:"))
        #expect(globMatches(pattern, ":010100:010200:fff000:fff001:"))  // audio + iAP2 + native transport
        #expect(!globMatches(pattern, ":fff001:"))                      // EA native transport alone
        #expect(!globMatches(pattern, ":fffe02:"))                      // usbmux
        #expect(!globMatches(pattern, ":ff4201:"))                      // adb
        #expect(lines.contains("ENV{ID_MFI_ACCESSORY}==\"1\", TAG+=\"uaccess\""))
    }

    @Test func thePlugdevVariantNeedsTheTag() {
        let lines = ruleLines(contents("71-mfi-accessory-plugdev.rules"))
        #expect(lines.contains("ENV{ID_MFI_ACCESSORY}==\"1\", GROUP=\"plugdev\", MODE=\"0660\""))
    }
}

extension String {
    func components(between start: String, and end: String) -> String? {
        guard let a = firstRange(of: start) else { return nil }
        let rest = self[a.upperBound...]
        guard let b = rest.firstRange(of: end) else { return nil }
        return String(rest[..<b.lowerBound])
    }
}
