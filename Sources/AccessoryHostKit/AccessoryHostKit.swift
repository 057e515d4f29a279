// Everything in one import: the core (AccessoryHost), its USB and Bluetooth sources, the serial
// and in-memory transports (IAPTransport) and verifying authentication (IAPAuthentication). A
// program that wants less imports the modules it uses: the core with IAPTransport links neither
// libusb, libdbus nor libcrypto.
@_exported public import AccessoryHost
@_exported public import AccessoryHostBluetooth
@_exported public import AccessoryHostUSB
@_exported public import IAPAuthentication
@_exported public import IAPTransport
