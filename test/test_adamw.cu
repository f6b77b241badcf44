// AdamW (optim/adamw.cuh) against the fp64 reference over several steps, for fp64, fp32 and
// bf16-with-float-master parameters and T or float gradients; stochastic rounding: reproducible,
// shard-invariant, always a neighbour, unbiased.
#include "optim/adamw.cuh"
#include "test/check.h"
#include "test/reference/adamw.h"

#include <bit>

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
