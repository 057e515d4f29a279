// Preloaded by tools/checks/narrow-pool/run.sh: the process sees one processor, so libdispatch gives
// Swift's cooperative pool one thread (on Linux it sizes the pool with sysconf at start; neither
// taskset nor an environment variable of this toolchain changes that). With one thread, a test
// that blocks it while waiting for anything that needs a task hangs the run every time, instead
// of now and then on a loaded two-core machine (issue 16).
#define _GNU_SOURCE
#include <dlfcn.h>
#include <unistd.h>

long sysconf(int name) {
    static long (*real)(int);
    if (name == _SC_NPROCESSORS_ONLN || name == _SC_NPROCESSORS_CONF) return 1;
    if (!real) real = (long (*)(int))dlsym(RTLD_NEXT, "sysconf");
    return real(name);
}
