// The USB descriptor layouts of real accessories (PROTOCOL.md §7, "Field notes"), as a choice
// for the simulated accessory's gadget: a host must find the iAP2 interface and its native
// interfaces however an accessory lays them out.

/// How the simulated accessory lays out its USB descriptors: the project's own layout, or the
/// shape of an accessory seen in the field (PROTOCOL.md §7).
///
/// A ``GadgetFSDevice`` (``GadgetFSLayout``) presents every field exactly, endpoint addresses
/// included: GadgetFS takes the descriptors as written. A configfs/FunctionFS ``USBGadget``
/// presents the device class, the configuration value and bcdDevice, but not the endpoint
/// numbers: the kernel's endpoint autoconfiguration gives the function's endpoints, in the order
/// they are declared, the first free ones of the controller that fit (on `dummy_hcd`:
/// `ep1in-bulk`, then `ep6in-bulk`…; `ep2out-bulk`, then `ep7out-bulk`…), whatever numbers the
/// descriptors ask for; and FunctionFS cannot serve native interfaces on kernels before 6.8.
public enum USBDescriptorLayout: String, Sendable, Hashable, CaseIterable, Codable {
    /// The project's own: device class 0/0/0, configuration 1, the iAP2 interface 0 on IN 0x81
    /// and OUT 0x02, native interfaces after it on higher endpoints.
    case standard
    /// The Geek szitman "supercamera" endoscope (§7.3): device class EF/02/01 without an
    /// interface association descriptor, the iAP2 interface on endpoint 2 (IN 0x82, OUT 0x02)
    /// and the native interface on endpoint 1 (IN 0x81, OUT 0x01): the reverse of the DJI layout.
    case supercamera
    /// The FLIR ONE thermal camera (§7.1): bConfigurationValue 3, bcdDevice 0x0108, the iAP2
    /// interface 0 on IN 0x81 and OUT 0x02, native interfaces 1 and 2 (alternate setting 0
    /// empty, 1 a bulk pair) on IN 0x83 / OUT 0x04 and IN 0x85 / OUT 0x06.
    case flirOne = "flir-one"
    /// Only the supercamera's device class, EF/02/01 without an interface association
    /// descriptor; the rest as ``standard``.
    case miscellaneousClass = "misc-class"
    /// Only a configuration value other than 1 (3, as the FLIR ONE's); the rest as ``standard``.
    case configurationThree = "config-3"

    /// The layout called `name` (its raw value: `standard`, `supercamera`, `flir-one`,
    /// `misc-class`, `config-3`), or nil.
    public init?(named name: String) { self.init(rawValue: name) }

    /// Every layout's name, for a person choosing one.
    public static var names: [String] { allCases.map(\.rawValue) }

    /// bDeviceClass, bDeviceSubClass and bDeviceProtocol of the device descriptor.
    public var deviceClass: [UInt8] {
        switch self {
        case .supercamera, .miscellaneousClass: [0xEF, 0x02, 0x01]
        case .standard, .flirOne, .configurationThree: [0x00, 0x00, 0x00]
        }
    }

    /// bConfigurationValue of the one configuration (configfs names it `c.<value>`).
    public var configurationValue: UInt8 {
        switch self {
        case .flirOne, .configurationThree: 3
        case .standard, .supercamera, .miscellaneousClass: 1
        }
    }

    /// bcdDevice the layout's accessory reports, nil to keep the configuration's.
    public var deviceRelease: UInt16? { self == .flirOne ? 0x0108 : nil }

    /// The iAP2 interface's bulk IN and OUT endpoint addresses.
    public var iAP2Endpoints: (in: UInt8, out: UInt8) {
        self == .supercamera ? (0x82, 0x02) : (0x81, 0x02)
    }

    /// The bulk IN and OUT endpoint addresses of the `index`-th native interface (from 0);
    /// nil for the layout whose natives sit on the controller's fixed endpoints (``standard``
    /// and the layouts that only change a device field).
    public func nativeEndpoints(_ index: Int) -> (in: UInt8, out: UInt8)? {
        switch self {
        case .supercamera: (0x81 + UInt8(2 * index), 0x01 + UInt8(2 * index))
        case .flirOne: (0x83 + UInt8(2 * index), 0x04 + UInt8(2 * index))
        case .standard, .miscellaneousClass, .configurationThree: nil
        }
    }

    /// Whether the endpoint addresses differ from ``standard``'s (only GadgetFS can present them).
    public var placesEndpoints: Bool { self == .supercamera || self == .flirOne }
}
