// Open MPI under LeakSanitizer (the asan flavour), for every program that starts MPI: `train`,
// the multi-rank test suites. Open MPI loses some allocations of its own, many inside plugins it
// opens and closes during MPI_Init; LeakSanitizer cannot attribute what a closed plugin lost. So
// in the asan flavour dlclose does nothing (every library stays loaded), and the leaks are
// suppressed by library name. Our own leaks are still reported.
#include <cstddef>

#if defined(__SANITIZE_ADDRESS__)
extern "C" int dlclose(void*) { return 0; }
#endif

extern "C" const char* __lsan_default_suppressions() {
    return "leak:libmpi.so\nleak:libopen-pal.so\nleak:libopen-rte.so\nleak:libpmix.so\nleak:libhwloc.so\n"
           "leak:libevent\nleak:/openmpi/lib/openmpi3/\nleak:/pmix2/lib/\n"
           // Strings Open MPI builds with asprintf: the fast unwinder stops inside libc (no frame
           // pointers), so only the libc function is known. Our code never calls asprintf.
           "leak:__vasprintf_internal\n";
}
