#define _GNU_SOURCE
#include "CSharedMemory.h"
#include <fcntl.h>
#include <sys/mman.h>

int iap_memfd_create(const char *name) {
    return memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
}

int iap_memfd_seal_size(int descriptor) {
    return fcntl(descriptor, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
}
