// The libusb-1.0 API as Debian 12 ships it (1.0.26). Swift code reaches libusb only through
// this module; the USBHost layer wraps every call behind one internal type.
#pragma once
#include <libusb.h>
