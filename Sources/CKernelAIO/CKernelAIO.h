// Linux's native asynchronous I/O (io_setup(2), io_submit(2), io_getevents(2), io_destroy(2)):
// how a USB gadget keeps several transfers queued on a FunctionFS endpoint file, as a device's
// controller does. glibc declares none of these calls and Swift cannot call the variadic
// syscall(2), so each is a static inline wrapper here; the structures are the kernel's own
// (<linux/aio_abi.h>).
//
// Header only, every function static inline, like CSharedMemory: nothing is compiled for this
// module (valgrind cannot read a compiled C file's debug information).
#ifndef C_KERNEL_AIO_H
#define C_KERNEL_AIO_H

#include <linux/aio_abi.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

/// io_setup(2): a context for up to `depth` requests in flight. 0, or -1 and errno.
static inline int iap_aio_setup(unsigned depth, aio_context_t *context) {
    *context = 0;
    return (int)syscall(SYS_io_setup, depth, context);
}

/// io_destroy(2): cancels the requests still in flight, waits for them, frees the context.
static inline int iap_aio_destroy(aio_context_t context) {
    return (int)syscall(SYS_io_destroy, context);
}

/// Lays out `request` to read (`writes` 0) or write `length` bytes at `buffer` on `descriptor`,
/// tagged with `tag` (returned in its completion's `data`).
static inline void iap_aio_prepare(struct iocb *request, int descriptor, int writes, void *buffer, size_t length,
                                   uint64_t tag) {
    memset(request, 0, sizeof *request);
    request->aio_data = tag;
    request->aio_lio_opcode = writes ? IOCB_CMD_PWRITE : IOCB_CMD_PREAD;
    request->aio_fildes = (uint32_t)descriptor;
    request->aio_buf = (uint64_t)(uintptr_t)buffer;
    request->aio_nbytes = length;
}

/// io_submit(2): queues `count` requests in order. How many were queued (the rest were not), or
/// -1 and errno when none was.
static inline int iap_aio_submit(aio_context_t context, long count, struct iocb **requests) {
    return (int)syscall(SYS_io_submit, context, count, requests);
}

/// io_getevents(2) without a timeout: waits for at least `minimum` completions (0: does not
/// wait) and takes up to `maximum`. How many were taken, or -1 and errno (EINTR when a signal
/// interrupted the wait).
static inline int iap_aio_getevents(aio_context_t context, long minimum, long maximum, struct io_event *events) {
    return (int)syscall(SYS_io_getevents, context, minimum, maximum, events, NULL);
}

#endif
