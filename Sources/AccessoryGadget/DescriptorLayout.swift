// The USB descriptor layouts of real accessories (PROTOCOL.md §7, "Field notes"), as a choice
// for the simulated accessory's gadget: a host must find the iAP2 interface and its native
// interfaces however an accessory lays them out.

internal import IAPTransport

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
package enum USBDescriptorLayout: String, Sendable, Hashable, CaseIterable, Codable {
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
    /// The head-unit template of QNX's usblauncher (§7.9): the iAP2 interface 0 with an
    /// interrupt IN endpoint first (bInterval 4 at full speed, 6 at high speed), then bulk IN
    /// and bulk OUT.
    case interruptFirst = "interrupt-first"
    /// The Traktor Kontrol S2 Mk2's iAP2 endpoints (§7.9) on interface 0: bulk OUT, bulk IN,
    /// then an interrupt IN endpoint (64 bytes) after the pair.
    case interruptAfter = "interrupt-after"
    /// The Traktor Kontrol S2 Mk2's interfaces (§7.9): the iAP2 interface is interface 5, after
    /// an audio control, two audio streaming, a HID (with an interrupt IN endpoint) and a DFU
    /// interface, with bulk OUT, bulk IN and an interrupt IN endpoint. The order and classes of
    /// interfaces 0–4 are assumed (§7.9 names audio, HID and DFU interfaces, not their order);
    /// they carry no class-specific descriptors (FunctionFS takes none for audio or DFU), so no
    /// kernel driver on the host takes them.
    case sixthInterface = "sixth-interface"
    /// The MobIR Air's speed (§7.9): the gadget runs at full speed only (configfs `max_speed`),
    /// so its bulk endpoints have 64-byte packets; the rest as ``standard``.
    case fullSpeed = "full-speed"
    /// The MobIR Air's generic ids (§7.9): the Linux gadget ids 0525:a4a0 (whatever the vendor
    /// and product ids asked for) and the configuration string "MFI Configure"; the rest as
    /// ``standard``.
    case genericIDs = "generic-ids"

    /// The layout called `name` (its raw value: `standard`, `supercamera`, `flir-one`,
    /// `misc-class`, `config-3`, `interrupt-first`, `interrupt-after`, `sixth-interface`,
    /// `full-speed`, `generic-ids`), or nil.
    package init?(named name: String) { self.init(rawValue: name) }

    /// Every layout's name, for a person choosing one.
    package static var names: [String] { allCases.map(\.rawValue) }

    /// bDeviceClass, bDeviceSubClass and bDeviceProtocol of the device descriptor.
    package var deviceClass: [UInt8] {
        switch self {
        case .supercamera, .miscellaneousClass: [0xEF, 0x02, 0x01]
        case .standard, .flirOne, .configurationThree, .interruptFirst, .interruptAfter, .sixthInterface, .fullSpeed, .genericIDs:
            [0x00, 0x00, 0x00]
        }
    }

    /// bConfigurationValue of the one configuration (configfs names it `c.<value>`).
    package var configurationValue: UInt8 {
        switch self {
        case .flirOne, .configurationThree: 3
        default: 1
        }
    }

    /// The vendor and product ids the layout's accessory reports, nil to keep the gadget's.
    package var usbID: (vendorID: UInt16, productID: UInt16)? { self == .genericIDs ? (0x0525, 0xA4A0) : nil }

    /// The configuration's string, nil to keep the gadget's.
    package var configurationName: String? { self == .genericIDs ? "MFI Configure" : nil }

    /// What the gadget writes to configfs `max_speed` (`full-speed`), nil to leave the
    /// controller's speed.
    package var maxSpeed: String? { self == .fullSpeed ? "full-speed" : nil }

    /// The number of the iAP2 interface: 5 in ``sixthInterface``, 0 in the others.
    package var iAP2InterfaceNumber: UInt8 { self == .sixthInterface ? 5 : 0 }

    /// Whether the iAP2 interface has an interrupt IN endpoint beside its bulk pair.
    package var hasInterruptEndpoint: Bool { self == .interruptFirst || self == .interruptAfter || self == .sixthInterface }

    /// Whether only the configfs/FunctionFS ``USBGadget`` presents the layout: the layouts with
    /// an interrupt endpoint, other interfaces, a speed or ids of their own. A
    /// ``GadgetFSDevice`` refuses them.
    package var needsFunctionFS: Bool { hasInterruptEndpoint || maxSpeed != nil || usbID != nil }

    /// bcdDevice the layout's accessory reports, nil to keep the configuration's.
    package var deviceRelease: UInt16? { self == .flirOne ? 0x0108 : nil }

    /// The iAP2 interface's bulk IN and OUT endpoint addresses.
    package var iAP2Endpoints: (in: UInt8, out: UInt8) {
        self == .supercamera ? (0x82, 0x02) : (0x81, 0x02)
    }

    /// The bulk IN and OUT endpoint addresses of the `index`-th native interface (from 0);
    /// nil for the layout whose natives sit on the controller's fixed endpoints (``standard``
    /// and the layouts that only change a device field).
    package func nativeEndpoints(_ index: Int) -> (in: UInt8, out: UInt8)? {
        switch self {
        case .supercamera: (0x81 + UInt8(2 * index), 0x01 + UInt8(2 * index))
        case .flirOne: (0x83 + UInt8(2 * index), 0x04 + UInt8(2 * index))
        default: nil
        }
    }

    /// Whether the endpoint addresses differ from ``standard``'s (only GadgetFS can present them).
    package var placesEndpoints: Bool { self == .supercamera || self == .flirOne }
}

extension USBDescriptorLayout {
    /// Why the GadgetFS gadget refuses this layout (``needsFunctionFS``), and what to do instead.
    var functionFSOnly: TransportError {
        TransportError("GadgetFS does not present the layout '\(rawValue)' (its interrupt endpoint, other "
                       + "interfaces, speed or ids are the FunctionFS gadget's)",
                       advice: "present it with the FunctionFS gadget (USBGadget, iapctl simulate --gadget), or choose "
                           + Self.allCases.filter { !$0.needsFunctionFS }.map(\.rawValue).joined(separator: ", "))
    }
}
