// Shared memory between iapd and its clients: the few operations Swift cannot express on memory
// mapped by two processes. Swift's `Atomic` lives inside Swift-managed storage, not at an address
// in a mapping; these are the compiler's atomic builtins on such an address (lock-free for 64-bit
// words on every platform the project builds for, hence address-free across processes), and the
// memfd calls Glibc's Swift module does not show (it is built without _GNU_SOURCE).
//
// Header only, every function static inline: nothing is compiled for this module but what the
// Swift code that calls it inlines (a compiled C file would carry debug information in a DWARF
// form Debian's valgrind cannot read, which tools/checks/allocations.sh relies on).
#ifndef C_SHARED_MEMORY_H
#define C_SHARED_MEMORY_H

#include <stdint.h>
#include <fcntl.h>

/// glibc's memfd_create(2) (since 2.27), declared as <sys/mman.h> does under _GNU_SOURCE.
extern int memfd_create(const char *name, unsigned int flags);

/// Loads the 64-bit word at `word` (sequentially consistent).
static inline uint64_t iap_shared_load(const uint64_t *word) {
    return __atomic_load_n(word, __ATOMIC_SEQ_CST);
}

/// Stores `value` at `word` (sequentially consistent).
static inline void iap_shared_store(uint64_t *word, uint64_t value) {
    __atomic_store_n(word, value, __ATOMIC_SEQ_CST);
}

/// Stores `value` at `word` and returns what was there (sequentially consistent).
static inline uint64_t iap_shared_exchange(uint64_t *word, uint64_t value) {
    return __atomic_exchange_n(word, value, __ATOMIC_SEQ_CST);
}

/// `memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING)`: an anonymous file; -1 and errno on failure.
static inline int iap_memfd_create(const char *name) {
    return memfd_create(name, 0x0001U /* MFD_CLOEXEC */ | 0x0002U /* MFD_ALLOW_SEALING */);
}

/// Seals the size of a memfd (`F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL`): a process it is passed
/// to cannot shrink it under another's mapping (which would fault on the next access). 0, or -1
/// and errno.
static inline int iap_memfd_seal_size(int descriptor) {
    return fcntl(descriptor, 1024 + 9 /* F_ADD_SEALS */, 0x0002 /* F_SEAL_SHRINK */ | 0x0004 /* F_SEAL_GROW */ | 0x0001 /* F_SEAL_SEAL */);
}

#endif
