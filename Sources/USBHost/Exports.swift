// USBHost's API is made of the descriptor values of USBDescriptors (a module of plain values
// with no libusb in it, which the core and the accessory daemon's client use on their own):
// who imports USBHost has them too.
@_exported public import USBDescriptors
