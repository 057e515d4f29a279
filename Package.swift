// swift-tools-version:6.0
//
// AccessoryHost: a userspace USB host driver for MFi-style accessories (iAP1 / iAP2) on Linux.
// The layers and the module graph: docs/ARCHITECTURE.md. The core (AccessoryHost) knows transports
// only as a protocol; USB (AccessoryHostUSB) and Bluetooth (AccessoryHostBluetooth) are sources
// that plug into it, and AccessoryHostKit imports them all at once.

import PackageDescription

let strict: [SwiftSetting] = [
    .enableUpcomingFeature("ExistentialAny"),
    .enableUpcomingFeature("InternalImportsByDefault"),
]

let package = Package(
    name: "AccessoryHost",
    // Products are the API meant for other packages: the core and its sources, the facade, the
    // transports and authentication to configure them, the protocol's codecs and state machines,
    // the logger and the simulator to test against. The rest (libusb, D-Bus and the daemon's
    // wrappers, the ring, command-line utilities) are the tools' and the products' insides.
    products: [
        .library(name: "AccessoryHostKit", targets: ["AccessoryHostKit"]),
        .library(name: "AccessoryHost", targets: ["AccessoryHost"]),
        .library(name: "AccessoryHostUSB", targets: ["AccessoryHostUSB"]),
        .library(name: "AccessoryHostBluetooth", targets: ["AccessoryHostBluetooth"]),
        .library(name: "ExternalAccessory", targets: ["ExternalAccessory"]),
        .library(name: "IAPTransport", targets: ["IAPTransport"]),
        .library(name: "IAPAuthentication", targets: ["IAPAuthentication"]),
        .library(name: "IAPLink", targets: ["IAPLink"]),
        .library(name: "IAPWire", targets: ["IAPWire"]),
        .library(name: "IAPInspect", targets: ["IAPInspect"]),
        .library(name: "AccessoryLogging", targets: ["AccessoryLogging"]),
        .library(name: "AccessorySimulator", targets: ["AccessorySimulator"]),
        .executable(name: "iapctl", targets: ["iapctl"]),
        .executable(name: "iapbench", targets: ["iapbench"]),
        .executable(name: "iapd", targets: ["iapd"]),
        .executable(name: "ea-echo", targets: ["ea-echo"]),
        .executable(name: "serial-echo", targets: ["serial-echo"]),
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
        // Queue confinement in one place: whether code runs on a given queue (QueueMark), and the
        // one box for a value carried to the queue it belongs to (QueueBound, checked in debug builds).
        .target(name: "QueueConfinement", swiftSettings: strict),
        // Swift over libdbus: a private bus connection driven by Dispatch sources on one queue,
        // method calls out, objects exported, typed values (file descriptors included).
        .target(name: "DBus", dependencies: ["CDBus", "QueueConfinement"], swiftSettings: strict),
        // iAP2 over Bluetooth RFCOMM through BlueZ: the iAP2 profile registered over D-Bus,
        // each connection's socket as a Transport, connecting out to paired accessories.
        .target(name: "BluetoothTransport", dependencies: ["DBus", "IAPTransport", "SystemCalls"], swiftSettings: strict),
        // Authentication that verifies: certificates, signatures and trust anchors through
        // OpenSSL (one wrapper type holds every call), the policies accept / record / require,
        // and the simulator's signing credentials.
        .target(name: "IAPAuthentication", dependencies: ["COpenSSL", "IAPLink"], swiftSettings: strict),
        // Atomic words and sealed memfds for memory two processes share (iapd's session rings):
        // what Swift's Atomic and Glibc's module do not reach. A header of static inline C with a
        // module map, so nothing is compiled of its own (valgrind cannot read a C file's DWARF 5).
        .systemLibrary(name: "CSharedMemory"),
        // The zero-copy slot ring between USB transfers and the frame scanner (SPSC, atomics), and
        // the shared memory of iapd's session rings.
        .target(name: "ByteRing", dependencies: ["CSharedMemory"], swiftSettings: strict),
        // Swift over libusb: the Dispatch event loop, descriptors and matching, bulk pipes over
        // ring slots, hotplug, and USB as a Transport.
        .target(name: "USBHost", dependencies: ["CLibUSB", "ByteRing", "USBDescriptors", "QueueConfinement"], swiftSettings: strict),
        // USB descriptors and devices as plain values (no libusb): what the core, the daemon's
        // client and the fuzzer need of USB.
        .target(name: "USBDescriptors", swiftSettings: strict),
        // The adapter between USBHost (which knows nothing of iAP) and IAPTransport: the iAP2
        // interface classes, Transport over the USB pipe, ByteChannel over a native pipe.
        .target(name: "USBTransport", dependencies: ["USBHost", "USBDescriptors", "IAPTransport", "IAPLink", "ByteRing"], swiftSettings: strict),
        // Pure value codecs for iAP1 / iAP2: no I/O, no Foundation, no Dispatch.
        .target(name: "IAPWire", swiftSettings: strict),
        // The iAP2 link, control session and EA session router as deterministic state machines
        // for both roles (no clocks, threads or Dispatch inside).
        .target(name: "IAPLink", dependencies: ["IAPWire", "ByteRing"], swiftSettings: strict),
        // Transports (in-memory, serial, pseudo-terminal) and the Dispatch driver that runs an
        // endpoint over one.
        .target(name: "IAPTransport", dependencies: ["IAPLink", "SystemCalls", "ByteRing"], swiftSettings: strict),
        // read/write/poll/open that retry EINTR and return typed errors: the one place the serial,
        // pty and gadget code makes its system calls.
        .target(name: "SystemCalls", swiftSettings: strict),
        // A virtual accessory on the same IAPLink, in the accessory role: profiles, behaviours,
        // the runner. Only the accessory role: how it reaches a host over USB is AccessoryGadget.
        .target(name: "AccessorySimulator", dependencies: ["IAPTransport", "IAPLink", "IAPWire", "IAPAuthentication"], swiftSettings: strict),
        // The simulator as a USB device: configfs gadgets, FunctionFS and GadgetFS, their
        // endpoint threads and signal handling.
        .target(name: "AccessoryGadget", dependencies: ["AccessorySimulator", "CKernelAIO", "IAPTransport", "SystemCalls"], swiftSettings: strict),
        // Linux's native AIO calls (io_setup, io_submit…), which glibc does not declare: static
        // inline C in a header, as CSharedMemory. How the gadget keeps several transfers queued.
        .systemLibrary(name: "CKernelAIO"),
        // The public API's core: AccessoryManager, Accessory, AccessorySession, the sources of
        // accessories as plug-ins (AccessorySource), the accessory daemon's client. No transport
        // of its own beyond IAPTransport's: links no libusb, libdbus or libcrypto.
        .target(name: "AccessoryHost", dependencies: ["ProjectVersion", "ByteRing", "IAPTransport", "IAPLink", "IAPWire", "AccessoryLogging", "IAPDaemonProtocol", "SystemCalls",
                                                      "USBDescriptors", "QueueConfinement"], swiftSettings: strict),
        // USB as a source of accessories (libusb): AccessoryManager.startUSB.
        .target(name: "AccessoryHostUSB", dependencies: ["AccessoryHost", "USBHost", "USBTransport", "QueueConfinement"], swiftSettings: strict),
        // Bluetooth as a source of accessories (BlueZ over libdbus): AccessoryManager.startBluetooth.
        .target(name: "AccessoryHostBluetooth", dependencies: ["AccessoryHost", "BluetoothTransport", "IAPTransport"], swiftSettings: strict),
        // Everything in one import: the core, its USB and Bluetooth sources, the serial
        // transports and verifying authentication.
        .target(name: "AccessoryHostKit", dependencies: ["AccessoryHost", "AccessoryHostUSB", "AccessoryHostBluetooth", "IAPAuthentication", "IAPTransport"],
                swiftSettings: strict),
        // The client protocol of iapd: messages and their framing (pure, fuzzed).
        .target(name: "IAPDaemonProtocol", dependencies: ["IAPLink"], swiftSettings: strict),
        // iapd's server: clients over Unix sockets, each session handed over as shared rings
        // (a memfd) and a socket for its wake-ups and its lifetime.
        .target(name: "IAPDaemon", dependencies: ["AccessoryHost", "AccessoryHostBluetooth", "AccessoryLogging", "BluetoothTransport", "ByteRing", "IAPDaemonProtocol", "IAPLink", "IAPTransport", "SystemCalls"],
                swiftSettings: strict),
        // iOS's ExternalAccessory framework on AccessoryHost: EAAccessoryManager, EAAccessory,
        // EASession with Foundation streams on run loops, the connect/disconnect notifications.
        .target(name: "ExternalAccessory", dependencies: ["AccessoryHost", "AccessoryHostBluetooth", "AccessoryHostUSB", "AccessoryLogging", "IAPAuthentication", "IAPTransport",
                                                          "QueueConfinement"], swiftSettings: strict),
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
        // The measurement `iapctl bench` makes of an accessory, shared with iapbench (which runs it
        // beside its own loop): package access only, not a product.
        .target(name: "AccessoryBench", dependencies: ["AccessoryHost", "IAPLink", "CLIKit"], swiftSettings: strict),
        .executableTarget(
            name: "iapctl",
            dependencies: ["AccessoryHost", "AccessoryHostUSB", "AccessoryHostBluetooth", "AccessorySimulator", "AccessoryGadget", "BluetoothTransport", "USBHost", "IAPTransport", "IAPLink", "IAPWire",
                           "IAPInspect", "CLIKit", "AccessoryLogging", "USBDescriptors", "SystemCalls", "IAPAuthentication", "ProjectVersion", "IAPDaemonProtocol",
                           "AccessoryBench", "IAPDaemonCommand"],
            path: "tools/commands/iapctl",
            swiftSettings: strict
        ),
        // iapd's command line as a library: the `iapd` executable below runs it, and so does
        // iapctl when started by the name iapd (the package ships one executable for both: one
        // copy of the Swift runtime).
        .target(
            name: "IAPDaemonCommand",
            dependencies: ["AccessoryHost", "AccessoryHostUSB", "AccessoryHostBluetooth", "AccessoryLogging", "AccessorySimulator", "BluetoothTransport", "CLIKit", "IAPAuthentication", "IAPDaemon", "IAPDaemonProtocol",
                           "IAPLink", "IAPTransport", "SystemCalls", "USBHost", "ProjectVersion"],
            path: "tools/commands/iapd",
            swiftSettings: strict
        ),
        .executableTarget(
            name: "iapd",
            dependencies: ["IAPDaemonCommand"],
            path: "tools/commands/iapd-main",
            swiftSettings: strict
        ),
        .executableTarget(
            name: "iapbench",
            dependencies: ["IAPDaemon", "SystemCalls", "AccessoryLogging", "AccessoryHost", "AccessoryHostUSB", "AccessoryHostBluetooth", "AccessorySimulator", "AccessoryGadget", "BluetoothTransport", "USBHost", "USBTransport", "IAPTransport", "IAPWire", "IAPLink", "IAPInspect", "CLIKit", "ProjectVersion", "AccessoryBench"],
            path: "tools/commands/iapbench",
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
        // The smallest program on the core: one serial accessory, an echo; links neither libusb,
        // libdbus nor libcrypto (tools/examples/serial-only-demo.sh checks it with ldd).
        .executableTarget(
            name: "serial-echo",
            dependencies: ["AccessoryHost", "IAPTransport"],
            path: "tools/examples/SerialOnly",
            swiftSettings: strict
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
        .testTarget(name: "IAPTransportTests", dependencies: ["TestSupport", "ByteRing", "SystemCalls", "IAPTransport", "IAPLink", "TestThreads"], swiftSettings: strict),
        .testTarget(name: "AccessorySimulatorTests", dependencies: ["AccessorySimulator", "IAPAuthentication", "IAPLink", "IAPWire", "TestThreads"],
                    swiftSettings: strict),
        .testTarget(name: "AccessoryGadgetTests", dependencies: ["TestSupport", "AccessoryGadget", "AccessorySimulator", "IAPTransport", "IAPWire", "TestThreads"], swiftSettings: strict),
        .testTarget(name: "DBusTests", dependencies: ["DBus", "TestSupport"], swiftSettings: strict),
        .testTarget(name: "BluetoothTransportTests", dependencies: ["BluetoothTransport", "DBus", "AccessoryHost", "AccessoryHostBluetooth", "AccessoryLogging", "AccessorySimulator", "IAPDaemon", "IAPTransport", "SystemCalls",
                                                                     "IAPLink", "TestSupport", "TestThreads"], swiftSettings: strict),
        .testTarget(name: "SystemCallsTests", dependencies: ["SystemCalls"], swiftSettings: strict),
        .testTarget(name: "AccessoryHostTests", dependencies: ["TestSupport", "TestThreads", "AccessoryHost", "QueueConfinement", "AccessorySimulator", "AccessoryLogging", "IAPTransport", "IAPLink", "IAPWire", "USBHost", "HeapStatistics", "IAPInspect", "AccessoryBench", "CLIKit"], swiftSettings: strict),
        // The OpenSSL verification, the policies over iAP2 and iAP1 with the simulator, hostile
        // certificates (fixtures generated by Tests/IAPAuthenticationTests/Fixtures/generate.sh).
        .testTarget(name: "IAPAuthenticationTests", dependencies: ["TestSupport", "TestThreads", "IAPAuthentication", "IAPLink", "IAPInspect",
                                                                   "AccessorySimulator", "AccessoryHost"],
                    exclude: ["Fixtures"], swiftSettings: strict),
        .testTarget(name: "IAPDaemonTests", dependencies: ["ByteRing", "IAPDaemon", "IAPDaemonProtocol", "AccessoryHost", "AccessorySimulator", "AccessoryLogging",
                                                           "IAPTransport", "SystemCalls", "TestSupport", "TestThreads"], swiftSettings: strict),
        .testTarget(name: "ExternalAccessoryTests", dependencies: ["TestSupport", "ExternalAccessory", "AccessoryHost", "AccessorySimulator", "AccessoryGadget", "IAPTransport"], swiftSettings: strict),
        .testTarget(name: "IAPInspectTests", dependencies: ["TestSupport", "IAPInspect", "IAPWire"], swiftSettings: strict),
        // Lints rules.d/ (guards, labels, numbering, the interface match).
        .testTarget(name: "RulesTests", swiftSettings: strict),
        .testTarget(name: "CLIKitTests", dependencies: ["CLIKit", "ProjectVersion"], swiftSettings: strict),
        .testTarget(name: "AccessoryLoggingTests", dependencies: ["AccessoryLogging"], swiftSettings: strict),
        // Also run under ThreadSanitizer by tools/test.sh.
        .testTarget(name: "ByteRingTests", dependencies: ["TestSupport", "ByteRing", "TestThreads"], swiftSettings: strict),
        // Runs in the qemu guest of tools/usb-rig (real kernel USB); skipped elsewhere.
        .testTarget(name: "USBRigTests", dependencies: ["TestSupport", "USBDescriptors", "AccessoryHost", "AccessoryHostUSB", "AccessorySimulator", "AccessoryGadget", "USBHost", "IAPLink"], swiftSettings: strict),
        .testTarget(name: "USBHostTests", dependencies: ["TestSupport", "USBHost", "USBDescriptors", "USBTransport", "ByteRing", "IAPTransport", "CLibUSB", "AccessoryHost", "AccessoryHostUSB", "AccessorySimulator", "AccessoryGadget", "IAPLink", "TestThreads", "QueueConfinement"], swiftSettings: strict),
    ],
    swiftLanguageModes: [.v6]
)
