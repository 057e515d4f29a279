// libdbus-1 as Debian 12 ships it (1.14): `apt-get install libdbus-1-dev pkg-config`. Swift code
// reaches libdbus only through this module, and only in the DBus module's wrapper types.
#pragma once
#include <dbus/dbus.h>
