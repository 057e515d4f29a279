// No imports: the descriptor fuzzer (tools/checks/fuzz) compiles this file in.

/// A vendor and product id pair: what lsusb writes as `vvvv:pppp`.
public struct USBID: Hashable, Sendable, CustomStringConvertible {
    /// The vendor id (idVendor).
    public var vendorID: UInt16
    /// The product id (idProduct).
    public var productID: UInt16

    /// The pair `vendorID:productID`.
    public init(vendorID: UInt16, productID: UInt16) {
        self.vendorID = vendorID
        self.productID = productID
    }

    /// Parses `VID:PID`: two hex numbers of 1 to 4 digits, each with an optional `0x`; nil
    /// for anything else.
    public init?(parsing text: String) {
        let parts = text.split(separator: ":", omittingEmptySubsequences: false)
        guard parts.count == 2 else { return nil }
        func number(_ part: Substring) -> UInt16? {
            let digits = part.hasPrefix("0x") || part.hasPrefix("0X") ? part.dropFirst(2) : part
            guard (1...4).contains(digits.count), digits.allSatisfy(\.isHexDigit) else { return nil }
            return UInt16(digits, radix: 16)
        }
        guard let vendor = number(parts[0]), let product = number(parts[1]) else { return nil }
        self.init(vendorID: vendor, productID: product)
    }

    /// `vvvv:pppp` in lower-case hex.
    public var description: String { Self.hex4(vendorID) + ":" + Self.hex4(productID) }

    private static func hex4(_ value: UInt16) -> String {
        let digits = String(value, radix: 16)
        return String(repeating: "0", count: 4 - digits.count) + digits
    }
}
