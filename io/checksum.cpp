// Xxh3 and digest_file (io/checksum.h).
#include "io/checksum.h"

#include "io/input_file.h"
#include "io/progress.h"

#include <xxhash.h>

#include <algorithm>
#include <cstdio>
#include <new>
#include <stdexcept>
#include <vector>

namespace pv {

Xxh3::Xxh3() : state_(XXH3_createState()) {
    if (!state_) throw std::bad_alloc();
    XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_));
}

Xxh3::~Xxh3() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }

void Xxh3::update(const void* data, size_t bytes) {
    if (bytes > 0) XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), data, bytes);
}

uint64_t Xxh3::digest() const { return XXH3_64bits_digest(static_cast<const XXH3_state_t*>(state_)); }

std::string checksum_hex(uint64_t checksum) {
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(checksum));
    return buf;
}

uint64_t parse_checksum_hex(const std::string& text, const std::string& field) {
    if (text.size() != 16 || text.find_first_not_of("0123456789abcdef") != std::string::npos)
        throw std::runtime_error(field + " \"" + text +
                                 "\" is not 16 lowercase hexadecimal digits (an XXH3-64 checksum)");
    return std::stoull(text, nullptr, 16);
}

FileDigest digest_file(const std::string& path, const std::string& kind) {
    const InputFile file = open_input_file(path, kind);
    Xxh3 h;
    // A piece of at most 4 MiB, no larger than the file (a config.json is verified before it is read).
    std::vector<unsigned char> buf(size_t(std::clamp<uint64_t>(file.size(), 1, uint64_t(4) << 20)));
    uint64_t done = 0;
    while (done < file.size()) {
        const size_t n = size_t(std::min<uint64_t>(buf.size(), file.size() - done));
        file.pread_exact(buf.data(), n, done);
        h.update(buf.data(), n);
        done += n;
        Progress::report_to_current(double(n));  // a checkpoint's verification (io/progress.h)
    }
    return {file.size(), h.digest()};
}

}  // namespace pv
