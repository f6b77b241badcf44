// AdamW (optim/adamw.cuh) against the fp64 reference over several steps, for fp64, fp32 and
// bf16-with-float-master parameters and T or float gradients; stochastic rounding: reproducible,
// shard-invariant, always a neighbour, unbiased. The CPU update (optim/adamw_cpu.h) bitwise
// against the device's multi-tensor kernel.
#include "optim/adamw.cuh"
#include "optim/adamw_cpu.h"
#include "test/check.h"
#include "test/reference/adamw.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <atomic>
#include <cstring>
#include <stdexcept>

using namespace pv::test;

namespace adamw_test {

using bf16 = __nv_bfloat16;

inline uint16_t bits_of(bf16 x) { return std::bit_cast<uint16_t>(x); }
inline uint32_t bits_of(float x) { return std::bit_cast<uint32_t>(x); }

// The bf16 neighbours of a finite float: its truncation toward zero and the next value away from
// zero (the same value twice when x is a bf16 value).
inline std::pair<uint16_t, uint16_t> bf16_neighbours(float x) {
    const uint32_t u = bits_of(x);
    const uint16_t down = uint16_t(u >> 16);
    return {down, (u & 0xFFFFu) ? uint16_t(down + 1) : down};
}

struct Case {
    long long n;
    double weight_decay;
    double grad_scale;
    bool zero_state;  // m = v = 0 before step 1, as torch starts; else a random mid-training state
};

// Five steps (t = 1..5) of the kernel and of the reference from the same state, with fresh
// gradients (rounded to G) each step; params (or the bf16 master), m and v compared after each.
template <class T, class G>
void check_against_reference(const Case& k, uint64_t seed) {
    using A = pv::acc_t<T>;
    constexpr bool bf = std::is_same_v<T, bf16>;
    const size_t n = size_t(k.n);
    const auto params = random_vector<T>(n, seed, -1.0, 1.0);
    const auto m0 = k.zero_state ? std::vector<A>(n, A(0)) : random_vector<A>(n, seed + 1, -0.1, 0.1);
    const auto v0 = k.zero_state ? std::vector<A>(n, A(0)) : random_vector<A>(n, seed + 2, 0.001, 0.05);
    DeviceArray<T> d_params(params);
    DeviceArray<A> d_m(m0), d_v(v0), d_master(bf ? n : 0);
    A* master = bf ? d_master.get() : nullptr;
    if (bf) pv::init_master(d_params.get(), master, k.n, nullptr);

    std::vector<double> ref_p = to_double(params), ref_m = to_double(m0), ref_v = to_double(v0);
    const double tol = bf ? tolerance<float>() : tolerance<T>();  // bf16: the float master
    for (long long t = 1; t <= 5; ++t) {
        const pv::AdamWStep step{.lr = 1e-2 * double(t),  // a changing lr, as a schedule gives
                                 .beta1 = 0.9,
                                 .beta2 = 0.95,
                                 .eps = 1e-8,
                                 .weight_decay = k.weight_decay,
                                 .t = t,
                                 .grad_scale = k.grad_scale};
        const auto grads = random_vector<G>(n, seed + 10 + uint64_t(t), -1.0, 1.0);
        DeviceArray<G> d_grads(grads);
        if (bf) d_params.poison();  // bf16 params are written from the master, never read
        pv::adamw_update(d_params.get(), master, d_grads.get(), d_m.get(), d_v.get(), k.n, step, false, 7, 3, 0,
                         nullptr);
        pv::reference::adamw_step(ref_p, ref_m, ref_v, to_double(grads),
                                  {step.lr, step.beta1, step.beta2, step.eps, step.weight_decay, t, step.grad_scale});

        const auto got_params = d_params.download();
        std::string ep;
        if constexpr (bf) {
            const auto got_master = d_master.download();
            ep = compare(to_double(got_master), ref_p, tol);
            size_t mismatches = 0;
            for (size_t i = 0; i < n; ++i)
                mismatches += bits_of(got_params[i]) != bits_of(__float2bfloat16(got_master[i]));
            INFO("params that are not RN(master): " << mismatches);
            REQUIRE(mismatches == 0);
        } else {
            ep = compare(to_double(got_params), ref_p, tol);
        }
        const std::string em = compare(to_double(d_m.download()), ref_m, tol);
        const std::string ev = compare(to_double(d_v.download()), ref_v, tol);
        INFO("n " << k.n << " wd " << k.weight_decay << " grad_scale " << k.grad_scale << " zero_state " << k.zero_state
                  << " t " << t << "\nparams: " << ep << "\nm: " << em << "\nv: " << ev);
        REQUIRE(ep.empty());
        REQUIRE(em.empty());
        REQUIRE(ev.empty());
    }
}

template <class T, class G>
void check_all_cases() {
    const Case cases[] = {{1, 0.0, 1.0, true}, {7, 0.1, 1.0, false}, {33, 0.0, 0.37, false}, {1000, 0.1, 0.5, true}};
    uint64_t seed = 100;
    for (const Case& k : cases) check_against_reference<T, G>(k, seed += 50);
}

// One bf16 update from the given master state (lr = 0 and no decay: the master stays exactly
// as given, so the parameters are its rounding), with stochastic rounding.
struct SrRun {
    std::vector<bf16> params;
    std::vector<float> master;
};
inline SrRun stochastic_round_once(const std::vector<float>& master, double lr, uint64_t seed, long long t,
                                   long long first_element = 0, bool stochastic = true) {
    const long long n = (long long)master.size();
    DeviceArray<bf16> d_params(master.size());
    DeviceArray<float> d_master(master);
    DeviceArray<float> d_m(random_vector<float>(master.size(), 5, -0.1, 0.1)),
        d_v(random_vector<float>(master.size(), 6, 0.01, 0.1));
    DeviceArray<float> d_grads(random_vector<float>(master.size(), 7));
    pv::AdamWStep step{.lr = lr, .weight_decay = 0.1, .t = t};
    pv::adamw_update(d_params.get(), d_master.get(), d_grads.get(), d_m.get(), d_v.get(), n, step, stochastic, seed, 11,
                     first_element, nullptr);
    return {d_params.download(), d_master.download()};
}

}  // namespace adamw_test

using namespace adamw_test;

TEST_CASE("adamw matches the fp64 reference over five steps", "[kernels][adamw]") {
    SECTION("fp64, fp64 gradients") { check_all_cases<double, double>(); }
    SECTION("fp64, fp32 gradients") { check_all_cases<double, float>(); }
    SECTION("fp32, fp32 gradients") { check_all_cases<float, float>(); }
    SECTION("bf16 with float master, bf16 gradients") { check_all_cases<bf16, bf16>(); }
    SECTION("bf16 with float master, fp32 gradients") { check_all_cases<bf16, float>(); }
}

TEST_CASE("adamw init_master copies bf16 parameters up exactly", "[kernels][adamw]") {
    const auto params = random_vector<bf16>(130, 1);
    DeviceArray<bf16> d_params(params);
    DeviceArray<float> d_master(params.size());
    pv::init_master(d_params.get(), d_master.get(), (long long)params.size(), nullptr);
    const auto master = d_master.download();
    for (size_t i = 0; i < params.size(); ++i) REQUIRE(master[i] == __bfloat162float(params[i]));
}

TEST_CASE("adamw stochastic rounding is reproducible and independent of sharding", "[kernels][adamw]") {
    const long long n = 1000;
    const auto master0 = random_vector<float>(size_t(n), 40, -1.0, 1.0);
    const SrRun a = stochastic_round_once(master0, 1e-3, 1234, 3);
    const SrRun b = stochastic_round_once(master0, 1e-3, 1234, 3);
    const SrRun other_seed = stochastic_round_once(master0, 1e-3, 999, 3);
    const SrRun other_step = stochastic_round_once(master0, 1e-3, 1234, 4);
    const SrRun nearest = stochastic_round_once(master0, 1e-3, 1234, 3, 0, false);
    size_t seed_differs = 0, step_differs = 0, nearest_differs = 0;
    for (size_t i = 0; i < size_t(n); ++i) {
        REQUIRE(bits_of(a.params[i]) == bits_of(b.params[i]));        // same key, same bits
        REQUIRE(bits_of(a.master[i]) == bits_of(nearest.master[i]));  // rounding never touches the master
        const auto [down, up] = bf16_neighbours(a.master[i]);
        const uint16_t got = bits_of(a.params[i]);
        INFO("element " << i << " master " << a.master[i]);
        REQUIRE((got == down || got == up));  // always a neighbour
        seed_differs += got != bits_of(other_seed.params[i]);
        step_differs += got != bits_of(other_step.params[i]);
        nearest_differs += got != bits_of(nearest.params[i]);
    }
    // Each element with its master strictly between neighbours differs between two independent
    // keys with probability 2q(1−q); over 1000 random values that is hundreds.
    CHECK(seed_differs > 100);
    CHECK(step_differs > 100);
    CHECK(nearest_differs > 100);

    // Shards [0, 333), [333, 334), [334, 1000) with their first_element offsets reproduce the
    // whole tensor's bits.
    for (auto [first, count] : {std::pair{0LL, 333LL}, std::pair{333LL, 1LL}, std::pair{334LL, 666LL}}) {
        const std::vector<float> slice(master0.begin() + first, master0.begin() + first + count);
        // The shard's m, v and grads come from different random streams than the whole tensor's,
        // so give the update no effect (lr = 0) and compare against a whole-tensor run with lr = 0.
        const SrRun shard = stochastic_round_once(slice, 0.0, 1234, 3, first);
        const SrRun whole = stochastic_round_once(master0, 0.0, 1234, 3, 0);
        for (long long i = 0; i < count; ++i)
            REQUIRE(bits_of(shard.params[size_t(i)]) == bits_of(whole.params[size_t(first + i)]));
    }
}

TEST_CASE("adamw stochastic rounding is unbiased", "[kernels][adamw]") {
    // N copies of one value x strictly between bf16 neighbours d < u (ulp = u − d), rounded with
    // lr = 0 so the master stays x. Each rounding is d + ulp·B with B ~ Bernoulli(q),
    // q = (x − d)/ulp, independent across elements (distinct Philox counters), so the mean has
    // expectation x exactly and standard deviation σ = ulp·sqrt(q(1 − q)/N). We require
    // |mean − x| ≤ 6σ: a false failure has probability below 2e-9 (and the seed is fixed, so the
    // test is deterministic).
    const size_t N = 100000;
    const uint32_t cases[][2] = {{0x3F80u, 0x199Au},   // 1.0 + 0.1 ulp
                                 {0x3E4Cu, 0x8000u},   // a tie: q = 0.5
                                 {0xBF21u, 0xE666u},   // negative, q = 0.9
                                 {0x3C23u, 0x0042u}};  // q ≈ 0.001: rarely up
    for (const auto& c : cases) {
        const float x = std::bit_cast<float>((c[0] << 16) | c[1]);
        const double q = double(c[1]) / 65536.0;
        const double d = double(std::bit_cast<float>(c[0] << 16)), u = double(std::bit_cast<float>((c[0] + 1) << 16));
        const double ulp = std::fabs(u - d);
        const SrRun r = stochastic_round_once(std::vector<float>(N, x), 0.0, 77, 1);
        double sum = 0;
        size_t ups = 0;
        for (size_t i = 0; i < N; ++i) {
            REQUIRE(r.master[i] == x);
            const uint16_t got = bits_of(r.params[i]);
            REQUIRE((got == c[0] || got == c[0] + 1));
            ups += got == c[0] + 1;
            sum += double(__bfloat162float(r.params[i]));
        }
        const double mean = sum / double(N), sigma = ulp * std::sqrt(q * (1 - q) / double(N));
        INFO("x " << x << " q " << q << " mean " << mean << " ups " << ups << " sigma " << sigma);
        CHECK(std::fabs(mean - double(x)) <= 6 * sigma);
    }
}

TEST_CASE("adamw: bf16 without a master", "[.][adamw-child]") {
    DeviceArray<bf16> p(4);
    DeviceArray<float> m(4), v(4), g(4);
    pv::adamw_update<bf16, float>(p.get(), nullptr, g.get(), m.get(), v.get(), 4, pv::AdamWStep{.lr = 1e-3}, false, 0,
                                  0, 0, nullptr);
}

TEST_CASE("adamw: fp32 with a master", "[.][adamw-child]") {
    DeviceArray<float> p(4), master(4), m(4), v(4), g(4);
    pv::adamw_update<float, float>(p.get(), master.get(), g.get(), m.get(), v.get(), 4, pv::AdamWStep{.lr = 1e-3},
                                   false, 0, 0, 0, nullptr);
}

TEST_CASE("adamw refuses a master copy that does not match the parameter type", "[kernels][adamw]") {
    REQUIRE_DIES_WITH("adamw: bf16 without a master", "bf16 parameters need a float master copy");
    REQUIRE_DIES_WITH("adamw: fp32 with a master", "master must be null");
}

namespace adamw_group_test {

// A group of tensors with padding between them, as a layout places them, but at offsets that are
// not all multiples of 4 (so the kernel's element-by-element path runs as well as its vector
// path). Tensor k is elements [offset, offset + size) of the group.
struct Tensor {
    long long offset, size;
    uint32_t id;
    bool decay;
};
const std::vector<Tensor> kTensors = {{0, 1, 40, false},      {4, 1030, 41, true},  {1040, 7, 42, false},
                                      {1051, 2053, 43, true}, {3200, 64, 44, true}, {3267, 5, 45, false}};
constexpr long long kGroup = 3300;  // elements, padding included

// The group's arrays, random everywhere (padding too, so that a write into it shows).
template <class T, class G>
struct GroupArrays {
    using A = pv::acc_t<T>;
    DeviceArray<T> params;
    DeviceArray<A> master, m, v;
    DeviceArray<G> grads;
    explicit GroupArrays(uint64_t seed)
        : params(random_vector<T>(size_t(kGroup), seed, -1.0, 1.0)),
          master(std::is_same_v<T, bf16> ? random_vector<A>(size_t(kGroup), seed + 1, -1.0, 1.0) : std::vector<A>{}),
          m(random_vector<A>(size_t(kGroup), seed + 2, -0.1, 0.1)),
          v(random_vector<A>(size_t(kGroup), seed + 3, 0.001, 0.05)),
          grads(random_vector<G>(size_t(kGroup), seed + 4, -1.0, 1.0)) {}
    A* master_at(long long i) const { return std::is_same_v<T, bf16> ? master.get() + i : nullptr; }
};

template <class X>
bool same_bits(const DeviceArray<X>& a, const DeviceArray<X>& b) {
    const auto x = a.download(), y = b.download();
    return x.size() == y.size() && (x.empty() || std::memcmp(x.data(), y.data(), x.size() * sizeof(X)) == 0);
}

template <class T, class G>
void require_same(const GroupArrays<T, G>& a, const GroupArrays<T, G>& b) {
    REQUIRE(same_bits(a.params, b.params));
    REQUIRE(same_bits(a.master, b.master));
    REQUIRE(same_bits(a.m, b.m));
    REQUIRE(same_bits(a.v, b.v));
}

// The owned range [begin, end) updated by one adamw_update per tensor piece (the reference) and
// by one adamw_update_group: every array, padding and elements outside the range included, must
// come out with the same bits.
template <class T, class G>
void check_range(long long begin, long long end, bool stochastic, bool decay_norm_weights, bool scale_on_device) {
    const uint64_t seed = 500 + uint64_t(begin);
    GroupArrays<T, G> ref(seed), got(seed);
    const pv::AdamWStep step{.lr = 3e-2, .weight_decay = 0.1, .t = 3, .grad_scale = 0.37};
    std::vector<pv::AdamWPiece> pieces;
    for (const Tensor& k : kTensors) {
        const long long lo = std::max(k.offset, begin), hi = std::min(k.offset + k.size, end);
        if (lo >= hi) continue;
        pieces.push_back({lo - begin, hi - begin, lo - k.offset, k.id, k.decay});
        pv::AdamWStep piece = step;
        piece.weight_decay = k.decay || decay_norm_weights ? step.weight_decay : 0.0;
        pv::adamw_update(ref.params.get() + lo, ref.master_at(lo), ref.grads.get() + lo, ref.m.get() + lo,
                         ref.v.get() + lo, hi - lo, piece, stochastic, 99, k.id, lo - k.offset, nullptr);
    }
    const pv::AdamWTable table(pieces);
    DeviceArray<double> scale(std::vector<double>{step.grad_scale});
    pv::AdamWStep group_step = step;
    if (scale_on_device) group_step.grad_scale = 1e30;  // must be ignored
    pv::adamw_update_group(got.params.get() + begin, got.master_at(begin), got.grads.get() + begin, got.m.get() + begin,
                           got.v.get() + begin, table, group_step, decay_norm_weights,
                           scale_on_device ? scale.get() : nullptr, stochastic, 99, nullptr);
    INFO("range [" << begin << ", " << end << ") stochastic " << stochastic << " decay_norm_weights "
                   << decay_norm_weights << " scale on device " << scale_on_device);
    require_same(ref, got);
}

template <class T, class G>
void check_ranges(bool stochastic) {
    // The whole group; three shards whose bounds cut tensors (1100 is inside the 4th tensor, an
    // odd start misaligns every pointer); a shard holding padding and a sliver of one tensor.
    const std::pair<long long, long long> ranges[] = {
        {0, kGroup}, {0, 1100}, {1100, 2201}, {2201, kGroup}, {3230, 3270}};
    for (auto [begin, end] : ranges)
        for (bool dnw : {false, true}) check_range<T, G>(begin, end, stochastic, dnw, begin == 1100);
}

}  // namespace adamw_group_test

TEST_CASE("adamw multi-tensor group update is bit-identical to per-tensor updates", "[kernels][adamw]") {
    using namespace adamw_group_test;
    SECTION("bf16, bf16 gradients, round to nearest") { check_ranges<bf16, bf16>(false); }
    SECTION("bf16, bf16 gradients, stochastic rounding") { check_ranges<bf16, bf16>(true); }
    SECTION("bf16, fp32 gradients, stochastic rounding") { check_ranges<bf16, float>(true); }
    SECTION("fp32") { check_ranges<float, float>(false); }
    SECTION("fp64") { check_ranges<double, double>(false); }
}

TEST_CASE("adamw group update leaves everything untouched when the device scale is not finite", "[kernels][adamw]") {
    using namespace adamw_group_test;
    for (double bad : {std::nan(""), double(INFINITY), -double(INFINITY)}) {
        GroupArrays<bf16, bf16> before(7), after(7);
        std::vector<pv::AdamWPiece> pieces;
        for (const Tensor& k : kTensors) pieces.push_back({k.offset, k.offset + k.size, 0, k.id, k.decay});
        const pv::AdamWTable table(pieces);
        DeviceArray<double> scale(std::vector<double>{bad});
        pv::adamw_update_group(after.params.get(), after.master.get(), after.grads.get(), after.m.get(), after.v.get(),
                               table, pv::AdamWStep{.lr = 1e-2, .weight_decay = 0.1}, false, scale.get(), true, 1,
                               nullptr);
        INFO("scale " << bad);
        require_same(before, after);
    }
}

namespace adamw_cpu_test {

using namespace adamw_group_test;

// The owned range [begin, end) updated by the device's adamw_update_group and by adamw_update_cpu
// on host copies of the same random arrays (the params the CPU writes poisoned first for bf16,
// which must not read them): every array must come out with the same bits. `scale` is the clip
// scale, on the device for the kernel and as a number for the CPU. `bad`: group elements whose
// gradient is made +inf first; both updates must flag the first of them (its index in the range) as
// the first element they made non-finite, and flag nothing without them or when the step is refused.
template <class T, class G>
void check_cpu_range(long long begin, long long end, bool stochastic, bool decay_norm_weights, double scale,
                     pv::ThreadPool& pool, const std::vector<long long>& bad = {}) {
    using A = pv::acc_t<T>;
    constexpr bool bf = std::is_same_v<T, bf16>;
    const uint64_t seed = 900 + uint64_t(begin);
    GroupArrays<T, G> dev(seed);
    const long long n = end - begin;
    auto host_of = [&](const auto& array) {
        auto all = array.download();
        using X = typename decltype(all)::value_type;
        return all.empty() ? std::vector<X>{} : std::vector<X>(all.begin() + begin, all.begin() + end);
    };
    std::vector<T> params = host_of(dev.params);
    std::vector<A> master = host_of(dev.master), m = host_of(dev.m), v = host_of(dev.v);
    std::vector<G> grads = host_of(dev.grads);
    G inf;
    if constexpr (std::is_same_v<G, bf16>)
        inf = __float2bfloat16(INFINITY);
    else
        inf = G(INFINITY);
    for (long long i : bad) {
        grads[size_t(i - begin)] = inf;
        CUDA_CHECK(cudaMemcpy(dev.grads.get() + i, &inf, sizeof(G), cudaMemcpyHostToDevice));
    }
    DeviceArray<unsigned long long> device_flag(std::vector<unsigned long long>{pv::kAdamWAllFinite});
    unsigned long long cpu_flag = pv::kAdamWAllFinite;
    const pv::AdamWStep step{.lr = 3e-2, .weight_decay = 0.1, .t = 4, .grad_scale = 1e30};  // scale: ignored
    std::vector<pv::AdamWPiece> pieces;
    for (const Tensor& k : kTensors) {
        const long long lo = std::max(k.offset, begin), hi = std::min(k.offset + k.size, end);
        if (lo < hi) pieces.push_back({lo - begin, hi - begin, lo - k.offset, k.id, k.decay});
    }
    if (bf)  // the pieces' params (padding stays as it was: neither update touches it)
        for (const pv::AdamWPiece& p : pieces)
            std::memset(static_cast<void*>(params.data() + p.begin), 0xFF, size_t(p.end - p.begin) * sizeof(T));
    const pv::AdamWTable table(pieces);
    DeviceArray<double> d_scale(std::vector<double>{scale});
    pv::adamw_update_group(dev.params.get() + begin, dev.master_at(begin), dev.grads.get() + begin, dev.m.get() + begin,
                           dev.v.get() + begin, table, step, decay_norm_weights, d_scale.get(), stochastic, 99, nullptr,
                           device_flag.get());
    const bool updated =
        pv::adamw_update_cpu<T, G>(params.data(), bf ? master.data() : nullptr, grads.data(), m.data(), v.data(),
                                   pieces, step, decay_norm_weights, scale, stochastic, 99, pool, &cpu_flag);
    INFO("range [" << begin << ", " << end << ") stochastic " << stochastic << " decay_norm_weights "
                   << decay_norm_weights << " scale " << scale << " threads " << pool.threads());
    REQUIRE(updated == std::isfinite(scale));
    const unsigned long long first_bad = bad.empty() || !updated
                                             ? pv::kAdamWAllFinite
                                             : (unsigned long long)(*std::min_element(bad.begin(), bad.end()) - begin);
    CHECK(device_flag.download()[0] == first_bad);
    CHECK(cpu_flag == first_bad);
    auto same = [&](const auto& device, const auto& host) {
        const auto all = device.download();
        return all.size() == 0 ? host.empty()
                               : std::memcmp(all.data() + begin, host.data(), size_t(n) * sizeof(host[0])) == 0;
    };
    if (updated || !bf) REQUIRE(same(dev.params, params));  // a refused bf16 step leaves the poison
    REQUIRE(same(dev.master, master));
    REQUIRE(same(dev.m, m));
    REQUIRE(same(dev.v, v));
}

template <class T, class G>
void check_cpu_ranges(bool stochastic) {
    pv::ThreadPool one(1), three(3);
    const std::pair<long long, long long> ranges[] = {{0, kGroup}, {0, 1100}, {1100, 2201}, {3230, 3270}};
    for (auto [begin, end] : ranges)
        for (bool dnw : {false, true}) check_cpu_range<T, G>(begin, end, stochastic, dnw, 0.37, begin ? one : three);
    for (double bad : {std::nan(""), double(INFINITY)}) check_cpu_range<T, G>(0, kGroup, stochastic, false, bad, three);
    // Infinite gradients: the first element made non-finite is flagged (the later one listed first),
    // in a vectorised chunk and at a ragged piece end, by both; a refused step flags nothing.
    check_cpu_range<T, G>(1100, 2201, stochastic, false, 0.37, three, {2100, 1500});
    check_cpu_range<T, G>(0, kGroup, stochastic, false, 0.37, one, {3270, 3269});
    check_cpu_range<T, G>(0, kGroup, stochastic, false, std::nan(""), three, {1500});
}

}  // namespace adamw_cpu_test

TEST_CASE("adamw on the CPU is bit-identical to the device kernel", "[kernels][adamw]") {
    using namespace adamw_cpu_test;
    SECTION("bf16, bf16 gradients, round to nearest") { check_cpu_ranges<bf16, bf16>(false); }
    SECTION("bf16, bf16 gradients, stochastic rounding") { check_cpu_ranges<bf16, bf16>(true); }
    SECTION("bf16, fp32 gradients, stochastic rounding") { check_cpu_ranges<bf16, float>(true); }
    SECTION("fp32") { check_cpu_ranges<float, float>(false); }
    SECTION("fp64") { check_cpu_ranges<double, double>(false); }
}

TEST_CASE("the thread pool runs every index once and passes exceptions on", "[adamw]") {
    pv::ThreadPool pool(3);
    for (int round = 0; round < 20; ++round) {  // jobs back to back: a late worker must not take a new job's index
        std::vector<std::atomic<int>> hits(257);
        pool.run(hits.size(), [&](size_t i) { hits[i]++; });
        for (auto& h : hits) REQUIRE(h.load() == 1);
    }
    REQUIRE_THROWS_WITH(pool.run(10,
                                 [](size_t i) {
                                     if (i == 7) throw std::runtime_error("seven");
                                 }),
                        "seven");
}
