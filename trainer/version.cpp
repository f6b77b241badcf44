// `train --version`: the commit this program was built from and its backend, baked in by the
// Makefile (POLEVAULT_VERSION: `git describe --always --dirty` in a git checkout, else "unknown",
// e.g. a build from a tarball; POLEVAULT_BACKEND: host or cuda).
#include <string>  // (trainer/options.h declares version_text; not included: this file recompiles at every commit)

#ifndef POLEVAULT_VERSION
#define POLEVAULT_VERSION "unknown"
#endif
#ifndef POLEVAULT_BACKEND
#define POLEVAULT_BACKEND "unknown"
#endif

namespace pv {

std::string version_text() { return std::string("polevault ") + POLEVAULT_VERSION + " (" + POLEVAULT_BACKEND + " backend)"; }

}  // namespace pv
