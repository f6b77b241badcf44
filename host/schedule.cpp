// Parsing the schedule variables (see schedule.h).
#include "host/schedule.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace pv::host {
namespace {

template <class E, size_t N>
E parse(const char* variable, const char* const (&names)[N], E fallback) {
    const char* value = std::getenv(variable);
    if (!value || !*value) return fallback;
    for (size_t i = 0; i < N; ++i)
        if (std::strcmp(value, names[i]) == 0) return E(i);
    std::string valid;
    for (size_t i = 0; i < N; ++i) valid += std::string(i ? ", " : "") + names[i];
    std::fprintf(stderr, "polevault host: %s=%s is not a schedule; use one of: %s\n", variable, value, valid.c_str());
    std::exit(2);
}

const char* const kThreadOrders[] = {"in-order", "reverse", "random", "warp-greedy"};
const char* const kBlockOrders[] = {"in-order", "reverse", "random"};

}  // namespace

const Schedule& schedule() {
    static const Schedule s = [] {
        Schedule r;
        r.threads = parse("POLEVAULT_HOST_THREAD_ORDER", kThreadOrders, ThreadOrder::in_order);
        r.blocks = parse("POLEVAULT_HOST_BLOCK_ORDER", kBlockOrders, BlockOrder::in_order);
        if (const char* seed = std::getenv("POLEVAULT_HOST_SEED")) {
            char* end = nullptr;
            r.seed = std::strtoull(seed, &end, 10);
            if (!*seed || *end) {
                std::fprintf(stderr, "polevault host: POLEVAULT_HOST_SEED=%s is not an unsigned integer\n", seed);
                std::exit(2);
            }
        }
        return r;
    }();
    return s;
}

std::string describe(const Schedule& s) {
    return std::string("threads ") + kThreadOrders[int(s.threads)] + ", blocks " + kBlockOrders[int(s.blocks)] +
           ", seed " + std::to_string(s.seed);
}

uint64_t mix_seed(uint64_t a, uint64_t b, uint64_t c) {
    uint64_t x = a;
    for (uint64_t v : {b, c, uint64_t(0x632BE59BD9B4E019ull)}) {
        x += 0x9E3779B97F4A7C15ull + v;
        x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
        x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
        x ^= x >> 31;
    }
    return x;
}

}  // namespace pv::host
