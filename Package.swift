// swift-tools-version:6.0
//
// AccessoryHost: a userspace USB host driver for MFi-style accessories (iAP1 / iAP2) on Linux.
// Layers, bottom up: CLibUSB (system library) → IAPWire (pure codecs) → IAPInspect (human and
// JSON views of frames) → tools. See README.md and CHANGELOG.md.

import PackageDescription

let strict: [SwiftSetting] = [
    .enableUpcomingFeature("ExistentialAny"),
    .enableUpcomingFeature("InternalImportsByDefault"),
]

let package = Package(
    name: "AccessoryHost",
    products: [
        .library(name: "IAPWire", targets: ["IAPWire"]),
        .library(name: "IAPLink", targets: ["IAPLink"]),
        .library(name: "IAPInspect", targets: ["IAPInspect"]),
        .library(name: "AccessoryHost", targets: ["AccessoryHost"]),
        .library(name: "IAPAuthentication", targets: ["IAPAuthentication"]),
        .library(name: "ExternalAccessory", targets: ["ExternalAccessory"]),
        .library(name: "IAPDaemon", targets: ["IAPDaemon"]),
        .library(name: "IAPDaemonProtocol", targets: ["IAPDaemonProtocol"]),
        .library(name: "CLIKit", targets: ["CLIKit"]),
        .library(name: "AccessoryLogging", targets: ["AccessoryLogging"]),
        .library(name: "ByteRing", targets: ["ByteRing"]),
        .library(name: "USBHost", targets: ["USBHost"]),
        .library(name: "USBTransport", targets: ["USBTransport"]),
        .library(name: "IAPTransport", targets: ["IAPTransport"]),
        .library(name: "AccessorySimulator", targets: ["AccessorySimulator"]),
        .library(name: "AccessoryGadget", targets: ["AccessoryGadget"]),
        .library(name: "DBus", targets: ["DBus"]),
        .library(name: "BluetoothTransport", targets: ["BluetoothTransport"]),
        .executable(name: "iapctl", targets: ["iapctl"]),
        .executable(name: "iapbench", targets: ["iapbench"]),
        .executable(name: "iapd", targets: ["iapd"]),
        .executable(name: "ea-echo", targets: ["ea-echo"]),
    ],
    targets: [
        // libusb-1.0 as Debian ships it (1.0.26): `apt-get install libusb-1.0-0-dev pkg-config`.
        .systemLibrary(
            name: "CLibUSB",
            pkgConfig: "libusb-1.0",
            providers: [.apt(["libusb-1.0-0-dev", "pkg-config"])]
        ),
        // OpenSSL 3 (libcrypto) as Debian ships it (3.0): `apt-get install libssl-dev pkg-config`.
        .systemLibrary(
            name: "COpenSSL",
            pkgConfig: "openssl",
            providers: [.apt(["libssl-dev", "pkg-config"])]
        ),
        // libdbus-1 as Debian ships it (1.14): `apt-get install libdbus-1-dev pkg-config`.
        .systemLibrary(
            name: "CDBus",
            pkgConfig: "dbus-1",
            providers: [.apt(["libdbus-1-dev", "pkg-config"])]
        ),
        // Swift over libdbus: a private bus connection driven by Dispatch sources on one queue,
        // method calls out, objects exported, typed values (file descriptors included).
        .target(name: "DBus", dependencies: ["CDBus"], swiftSettings: strict),
        // iAP2 over Bluetooth RFCOMM through BlueZ: the iAP2 profile registered over D-Bus,
        // each connection's socket as a Transport, connecting out to paired accessories.
        .target(name: "BluetoothTransport", dependencies: ["DBus", "IAPTransport", "IAPLink", "SystemCalls"], swiftSettings: strict),
        // Authentication that verifies: certificates, signatures and trust anchors through
        // OpenSSL (one wrapper type holds every call), the policies accept / record / require,
        // and the simulator's signing credentials.
        .target(name: "IAPAuthentication", dependencies: ["COpenSSL", "IAPLink"], swiftSettings: strict),
        // The zero-copy slot ring between USB transfers and the frame scanner (SPSC, atomics).
        .target(name: "ByteRing", swiftSettings: strict),
        // Swift over libusb: the Dispatch event loop, descriptors and matching, bulk pipes over
        // ring slots, hotplug, and USB as a Transport.
        .target(name: "USBHost", dependencies: ["CLibUSB", "ByteRing"], swiftSettings: strict),
        // The adapter between USBHost (which knows nothing of iAP) and IAPTransport: the iAP2
        // interface classes, Transport over the USB pipe, ByteChannel over a native pipe.
        .target(name: "USBTransport", dependencies: ["USBHost", "IAPTransport", "IAPLink", "ByteRing"], swiftSettings: strict),
        // Pure value codecs for iAP1 / iAP2: no I/O, no Foundation, no Dispatch.
        .target(name: "IAPWire", swiftSettings: strict),
        // The iAP2 link, control session and EA session router as deterministic state machines
        // for both roles (no clocks, threads or Dispatch inside).
        .target(name: "IAPLink", dependencies: ["IAPWire", "ByteRing"], swiftSettings: strict),
        // Transports (in-memory, serial, pseudo-terminal) and the Dispatch driver that runs an
        // endpoint over one.
        .target(name: "IAPTransport", dependencies: ["IAPLink", "IAPWire", "SystemCalls", "ByteRing"], swiftSettings: strict),
        // read/write/poll/open that retry EINTR and return typed errors: the one place the serial,
        // pty and gadget code makes its system calls.
        .target(name: "SystemCalls", swiftSettings: strict),
        // A virtual accessory on the same IAPLink, in the accessory role: profiles, behaviours,
        // the runner. Only the accessory role: how it reaches a host over USB is AccessoryGadget.
        .target(name: "AccessorySimulator", dependencies: ["IAPTransport", "IAPLink", "IAPWire", "IAPAuthentication"], swiftSettings: strict),
        // The simulator as a USB device: configfs gadgets, FunctionFS and GadgetFS, their
        // endpoint threads and signal handling.
        .target(name: "AccessoryGadget", dependencies: ["AccessorySimulator", "IAPTransport", "SystemCalls"], swiftSettings: strict),
        // The public API: AccessoryManager, Accessory, AccessorySession.
        .target(name: "AccessoryHost", dependencies: ["ProjectVersion", "BluetoothTransport", "USBHost", "USBTransport", "IAPTransport", "IAPLink", "IAPWire", "AccessoryLogging", "IAPAuthentication",
                                                      "IAPDaemonProtocol", "SystemCalls"], swiftSettings: strict),
        // The client protocol of iapd: messages and their framing (pure, fuzzed).
        .target(name: "IAPDaemonProtocol", dependencies: ["IAPLink"], swiftSettings: strict),
        // iapd's server: clients over Unix sockets, sessions handed over as sockets of their own.
        .target(name: "IAPDaemon", dependencies: ["AccessoryHost", "AccessoryLogging", "BluetoothTransport", "IAPDaemonProtocol", "IAPLink", "IAPTransport", "SystemCalls"],
                swiftSettings: strict),
        // iOS's ExternalAccessory framework on AccessoryHost: EAAccessoryManager, EAAccessory,
        // EASession with Foundation streams on run loops, the connect/disconnect notifications.
        .target(name: "ExternalAccessory", dependencies: ["AccessoryHost", "AccessoryLogging", "IAPTransport"], swiftSettings: strict),
        // Frames in human terms and as JSON (used by `iapctl decode` and by tracing).
        // Strings from frames are escaped for people with AccessoryLogging's `escapedForTerminal`.
        .target(name: "IAPInspect", dependencies: ["IAPWire", "AccessoryLogging"], swiftSettings: strict),
        // A small logger in the shape of swift-log's (levels, metadata, handlers): the library
        // logs through it without depending on anything of the command line.
        .target(name: "AccessoryLogging", dependencies: ["SystemCalls"], swiftSettings: strict),
        // The project's version, in one place: the library and every tool read it (issue 20).
        .target(name: "ProjectVersion", swiftSettings: strict),
        // Small command-line utilities: argument parsing, help, usage errors, terminal output.
        .target(name: "CLIKit", dependencies: ["AccessoryLogging"], swiftSettings: strict),
        .executableTarget(
            name: "iapctl",
            dependencies: ["AccessoryHost", "AccessorySimulator", "AccessoryGadget", "BluetoothTransport", "USBHost", "USBTransport", "IAPTransport", "IAPLink", "IAPWire",
                           "IAPInspect", "CLIKit", "AccessoryLogging", "CLibUSB", "SystemCalls", "IAPAuthentication", "ProjectVersion"],
            path: "tools/iapctl",
            swiftSettings: strict
        ),
        .executableTarget(
            name: "iapd",
            dependencies: ["AccessoryHost", "AccessoryLogging", "AccessorySimulator", "BluetoothTransport", "CLIKit", "IAPAuthentication", "IAPDaemon", "IAPDaemonProtocol",
                           "IAPLink", "IAPTransport", "SystemCalls", "USBHost", "ProjectVersion"],
            path: "tools/iapd",
            swiftSettings: strict
        ),
        .executableTarget(
            name: "iapbench",
            dependencies: ["IAPDaemon", "SystemCalls", "AccessoryLogging", "AccessoryHost", "AccessorySimulator", "AccessoryGadget", "BluetoothTransport", "USBHost", "USBTransport", "IAPTransport", "IAPWire", "IAPLink", "IAPInspect", "CLIKit", "ProjectVersion"],
            path: "tools/iapbench",
            swiftSettings: strict
        ),
        // A typical ExternalAccessory app ported from iOS (issue 17): only main.swift differs.
        .executableTarget(
            name: "ea-echo",
            dependencies: ["ExternalAccessory", "AccessorySimulator"],
            path: "tools/examples/EAEcho",
            exclude: ["README.md"],
            swiftSettings: [.enableUpcomingFeature("ExistentialAny")]
        ),
        // Shared by the test targets: the .ownThread trait, which runs tests that block their
        // thread (or run for seconds of CPU) off Swift's cooperative pool (issue 16).
        .target(name: "TestThreads", path: "Tests/TestThreads", swiftSettings: strict),
        // What every test target shares: the deterministic generator its seeded tests use, and test
        // data built in one pass (Tests/TestSupport/Bytes.swift says why).
        .target(name: "TestSupport", path: "Tests/TestSupport", swiftSettings: strict),
        // For the leak tests: the heap in use (glibc's mallinfo2), which Glibc's module lacks.
        .target(name: "HeapStatistics", path: "Tests/HeapStatistics"),
        .testTarget(name: "IAPWireTests", dependencies: ["TestSupport", "IAPWire"], swiftSettings: strict),
        .testTarget(name: "IAPLinkTests", dependencies: ["TestSupport", "IAPLink", "IAPWire", "ByteRing", "TestThreads"], swiftSettings: strict),
        .testTarget(name: "IAPTransportTests", dependencies: ["TestSupport", "IAPTransport", "IAPLink", "IAPWire", "TestThreads"], swiftSettings: strict),
        .testTarget(name: "AccessorySimulatorTests", dependencies: ["AccessorySimulator", "IAPLink", "IAPWire"], swiftSettings: strict),
        .testTarget(name: "AccessoryGadgetTests", dependencies: ["TestSupport", "AccessoryGadget", "AccessorySimulator", "IAPTransport", "IAPWire", "TestThreads"], swiftSettings: strict),
        .testTarget(name: "DBusTests", dependencies: ["DBus", "TestSupport", "TestThreads"], swiftSettings: strict),
        .testTarget(name: "BluetoothTransportTests", dependencies: ["BluetoothTransport", "DBus", "AccessoryHost", "AccessoryLogging", "AccessorySimulator", "IAPDaemon", "IAPTransport", "SystemCalls",
                                                                     "IAPLink", "TestSupport", "TestThreads"], swiftSettings: strict),
        .testTarget(name: "SystemCallsTests", dependencies: ["SystemCalls"], swiftSettings: strict),
        .testTarget(name: "AccessoryHostTests", dependencies: ["TestSupport", "AccessoryHost", "AccessorySimulator", "AccessoryLogging", "IAPTransport", "IAPLink", "IAPWire", "USBHost", "HeapStatistics", "IAPInspect"], swiftSettings: strict),
        // The OpenSSL verification, the policies over iAP2 and iAP1 with the simulator, hostile
        // certificates (fixtures generated by Tests/IAPAuthenticationTests/Fixtures/generate.sh).
        .testTarget(name: "IAPAuthenticationTests", dependencies: ["TestSupport", "TestThreads", "IAPAuthentication", "IAPLink", "IAPWire", "IAPInspect",
                                                                   "AccessorySimulator", "AccessoryHost", "IAPTransport"],
                    exclude: ["Fixtures"], swiftSettings: strict),
        .testTarget(name: "IAPDaemonTests", dependencies: ["IAPDaemon", "IAPDaemonProtocol", "AccessoryHost", "AccessorySimulator", "AccessoryLogging",
                                                           "IAPTransport", "SystemCalls", "TestSupport", "TestThreads"], swiftSettings: strict),
        .testTarget(name: "ExternalAccessoryTests", dependencies: ["TestSupport", "ExternalAccessory", "AccessoryHost", "AccessorySimulator", "AccessoryGadget", "IAPTransport"], swiftSettings: strict),
        .testTarget(name: "IAPInspectTests", dependencies: ["TestSupport", "IAPInspect", "IAPWire"], swiftSettings: strict),
        // Lints rules.d/ (guards, labels, numbering, the interface match).
        .testTarget(name: "RulesTests", swiftSettings: strict),
        .testTarget(name: "CLIKitTests", dependencies: ["CLIKit", "AccessoryLogging", "ProjectVersion"], swiftSettings: strict),
        .testTarget(name: "AccessoryLoggingTests", dependencies: ["AccessoryLogging"], swiftSettings: strict),
        // Also run under ThreadSanitizer by tools/test.sh.
        .testTarget(name: "ByteRingTests", dependencies: ["TestSupport", "ByteRing", "TestThreads"], swiftSettings: strict),
        // Runs in the qemu guest of tools/usb-rig (real kernel USB); skipped elsewhere.
        .testTarget(name: "USBRigTests", dependencies: ["TestSupport", "AccessoryHost", "AccessorySimulator", "AccessoryGadget", "USBHost", "USBTransport", "IAPLink"], swiftSettings: strict),
        .testTarget(name: "USBHostTests", dependencies: ["TestSupport", "USBHost", "USBTransport", "ByteRing", "IAPTransport", "CLibUSB", "AccessoryHost", "AccessorySimulator", "AccessoryGadget", "IAPLink", "TestThreads"], swiftSettings: strict),
    ],
    swiftLanguageModes: [.v6]
)
