// The `iapd` executable of the build: the daemon's command line is the library
// IAPDaemonCommand (tools/commands/iapd), which iapctl also runs when started as `iapd`.

import IAPDaemonCommand

IAPDaemonCommand.main()
