// For the leak tests: bytes malloc has handed out and not had back, over every arena.
#ifndef HEAP_STATISTICS_H
#define HEAP_STATISTICS_H
#include <stddef.h>

/// glibc's mallinfo2(): in-use bytes of the ordinary chunks plus those mmapped on their own.
size_t heap_bytes_in_use(void);

#endif
