// The glue kernels against their fp64 references (bf16, fp32, fp64 where typed): casts (bitwise,
// including exact ties and a value fp32 would double-round), scaling, adds with aliasing,
// accumulation, fills, target counting, and the deterministic sum of squares (bitwise equal across
// runs, schedules and worker counts, and its accumulating form).
#include "kernels/glue.cuh"
#include "test/check.h"
#include "test/reference/glue.h"

#include <cinttypes>
#include <cstdio>
#include <cstring>

using namespace pv::test;

namespace glue_test {

const long long kLengths[] = {1, 7, 1000003};

// Significand bits of a storage type: what reference::cast rounds to.
template <class T>
constexpr int significand_bits() {
    if constexpr (std::is_same_v<T, double>)
        return 53;
    else if constexpr (std::is_same_v<T, float>)
        return 24;
    else
        return 8;
}

// Empty when got == ref element for element (NaN never equals), else the first difference.
inline std::string first_difference(const std::vector<double>& got, const std::vector<double>& ref) {
    if (got.size() != ref.size()) return "size mismatch";
    for (size_t i = 0; i < got.size(); ++i)
        if (!(got[i] == ref[i])) {
            char buf[160];
            std::snprintf(buf, sizeof buf, "element %zu of %zu: got %.17g, expected %.17g", i, got.size(), got[i],
                          ref[i]);
            return buf;
        }
    return {};
}

inline uint64_t bits_of(double v) {
    uint64_t b;
    std::memcpy(&b, &v, sizeof b);
    return b;
}

template <class T>
const char* type_name() {
    if constexpr (std::is_same_v<T, double>)
        return "double";
    else if constexpr (std::is_same_v<T, float>)
        return "float";
    else
        return "bf16";
}

// A cast is exactly specified: the result must equal the reference rounding bit for bit.
template <class From, class To>
void check_cast(const std::vector<From>& in) {
    DeviceArray<From> d_in(in);
    DeviceArray<To> d_out(in.size());
    pv::cast(d_in.get(), d_out.get(), (long long)in.size(), nullptr);
    const auto ref = pv::reference::cast(to_double(in), significand_bits<To>());
    const std::string err = first_difference(to_double(d_out.download()), ref);
    INFO(type_name<From>() << " -> " << type_name<To>() << ", n " << in.size() << ": " << err);
    REQUIRE(err.empty());
}

template <class From>
void check_cast_from(long long n, uint64_t seed) {
    const auto in = random_vector<From>(size_t(n), seed, -4.0, 4.0);
    check_cast<From, double>(in);
    check_cast<From, float>(in);
    check_cast<From, __nv_bfloat16>(in);
}

// Narrowing `values` (exactly representable in From) gives `expected` in To.
template <class From, class To>
void check_cast_values(const std::vector<double>& values, const std::vector<double>& expected) {
    std::vector<From> in;
    for (double v : values) {
        in.push_back(From(v));
        REQUIRE(double(in.back()) == v);  // the test value itself is exact in From
    }
    DeviceArray<From> d_in(in);
    DeviceArray<To> d_out(in.size());
    pv::cast(d_in.get(), d_out.get(), (long long)in.size(), nullptr);
    const auto got = to_double(d_out.download());
    const std::string err = first_difference(got, expected);
    INFO(type_name<From>() << " -> " << type_name<To>() << ": " << err);
    REQUIRE(err.empty());
    // The reference rounds the same way (it checks the other tests against itself).
    REQUIRE(first_difference(pv::reference::cast(values, significand_bits<To>()), expected).empty());
}

template <class T>
void check_scale(long long n, uint64_t seed) {
    const auto x = random_vector<T>(size_t(n), seed);
    const pv::acc_t<T> factor = pv::acc_t<T>(-0.37);
    DeviceArray<T> d_x(x);
    pv::scale_inplace(d_x.get(), factor, n, nullptr);
    const std::string err =
        compare(to_double(d_x.download()), pv::reference::scale(to_double(x), double(factor)), tolerance<T>());
    INFO(type_name<T>() << " n " << n << ": " << err);
    REQUIRE(err.empty());
}

// out separate, out == a, out == b.
template <class T>
void check_add(long long n, uint64_t seed) {
    const auto a = random_vector<T>(size_t(n), seed), b = random_vector<T>(size_t(n), seed + 1);
    const auto ref = pv::reference::add(to_double(a), to_double(b));
    DeviceArray<T> d_a(a), d_b(b), d_out{size_t(n)};
    pv::add(d_a.get(), d_b.get(), d_out.get(), n, nullptr);
    const std::string e1 = compare(to_double(d_out.download()), ref, tolerance<T>());
    pv::add(d_a.get(), d_b.get(), d_a.get(), n, nullptr);
    const std::string e2 = compare(to_double(d_a.download()), ref, tolerance<T>());
    d_a.upload(a);
    pv::add(d_a.get(), d_b.get(), d_b.get(), n, nullptr);
    const std::string e3 = compare(to_double(d_b.download()), ref, tolerance<T>());
    INFO(type_name<T>() << " n " << n << "\nseparate: " << e1 << "\nout = a: " << e2 << "\nout = b: " << e3);
    REQUIRE(e1.empty());
    REQUIRE(e2.empty());
    REQUIRE(e3.empty());
}

template <class T>
void check_accumulate(long long n, uint64_t seed) {
    const auto acc = random_vector<T>(size_t(n), seed), x = random_vector<T>(size_t(n), seed + 1);
    DeviceArray<T> d_acc(acc), d_x(x);
    pv::accumulate(d_acc.get(), d_x.get(), n, nullptr);
    const std::string err =
        compare(to_double(d_acc.download()), pv::reference::add(to_double(acc), to_double(x)), tolerance<T>());
    INFO(type_name<T>() << " n " << n << ": " << err);
    REQUIRE(err.empty());
}

// A float buffer accumulating bf16 values (the fp32 gradient-accumulation buffer): the sum of
// the exact bf16 value and the float, rounded once to float.
void check_accumulate_bf16_into_float(long long n, uint64_t seed) {
    const auto acc = random_vector<float>(size_t(n), seed);
    const auto x = random_vector<__nv_bfloat16>(size_t(n), seed + 1);
    DeviceArray<float> d_acc(acc);
    DeviceArray<__nv_bfloat16> d_x(x);
    pv::accumulate(d_acc.get(), d_x.get(), n, nullptr);
    const std::string err =
        compare(to_double(d_acc.download()), pv::reference::add(to_double(acc), to_double(x)), tolerance<float>());
    INFO("float += bf16, n " << n << ": " << err);
    REQUIRE(err.empty());
}

// Fills exactly n elements: the one past them keeps its poison.
template <class T>
void check_fill(long long n) {
    const T value = T(0.7);
    DeviceArray<T> d_x(size_t(n) + 1);
    pv::fill(d_x.get(), value, n, nullptr);
    const auto got = to_double(d_x.download());
    INFO(type_name<T>() << " n " << n);
    REQUIRE(
        first_difference(std::vector<double>(got.begin(), got.end() - 1), std::vector<double>(size_t(n), double(value)))
            .empty());
    REQUIRE(std::isnan(got.back()));
}

// Targets in [0, vocab) with about a quarter replaced by ignore_index.
inline std::vector<int> random_targets(size_t n, int ignore_index, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<int> t(n);
    for (auto& v : t) v = rng() % 4 == 0 ? ignore_index : int(rng() % 50257);
    return t;
}

inline int count_on_device(const std::vector<int>& targets, int ignore_index) {
    DeviceArray<int> d_t(targets.empty() ? std::vector<int>{0} : targets), d_count(1);
    pv::count_targets(d_t.get(), (long long)targets.size(), ignore_index, d_count.get(), nullptr);
    return d_count.download()[0];
}

// Σ x² on the device, as one double. With `offset`, x starts that many elements into its
// allocation (one element in: never 16-byte aligned, so the kernel reads it element by element).
template <class T>
double sum_of_squares_on_device(const std::vector<T>& x, size_t offset = 0) {
    const long long n = (long long)x.size();
    std::vector<T> placed(offset, T(3));  // values before x, which the sum must not include
    placed.insert(placed.end(), x.begin(), x.end());
    if (placed.empty()) placed.push_back(T(1));
    DeviceArray<T> d_x(placed);
    DeviceArray<unsigned char> scratch(pv::sum_of_squares_scratch_bytes<T>(n));
    DeviceArray<double> d_out(1);
    pv::sum_of_squares(d_x.get() + offset, n, d_out.get(), scratch.get(), nullptr);
    return d_out.download()[0];
}

// The 16-byte loads of an aligned x and the element reads of an unaligned one add the same
// squares in the same order: the same bits, for every length (whole groups of 16 bytes and a
// short last group), and both within the fp64 reference's tolerance.
template <class T>
void check_sum_of_squares_alignment(long long n, uint64_t seed) {
    const auto x = random_vector<T>(size_t(n), seed);
    const double aligned = sum_of_squares_on_device(x), unaligned = sum_of_squares_on_device(x, 1);
    INFO(type_name<T>() << " n " << n);
    REQUIRE(bits_of(unaligned) == bits_of(aligned));
    REQUIRE(compare({unaligned}, {pv::reference::sum_of_squares(to_double(x))}, tolerance<T>()).empty());
}

template <class T>
void check_sum_of_squares(long long n, uint64_t seed) {
    const auto x = random_vector<T>(size_t(n), seed);
    const double got = sum_of_squares_on_device(x);
    const std::string err = compare({got}, {pv::reference::sum_of_squares(to_double(x))}, tolerance<T>());
    INFO(type_name<T>() << " n " << n << ": " << err);
    REQUIRE(err.empty());
    REQUIRE(bits_of(sum_of_squares_on_device(x)) == bits_of(got));  // a second run: the same bits
}

// The inputs whose sums the child below prints and its parent recomputes.
template <class T>
std::vector<T> determinism_input() {
    return random_vector<T>(200003, 77, -2.0, 2.0);
}

template <class T>
std::string determinism_line() {
    char buf[80];
    std::snprintf(buf, sizeof buf, "sum-of-squares %s %016" PRIx64 "\n", type_name<T>(),
                  bits_of(sum_of_squares_on_device(determinism_input<T>())));
    return buf;
}

}  // namespace glue_test

using namespace glue_test;

TEST_CASE("cast matches the reference rounding bit for bit", "[kernels][glue]") {
    for (long long n : kLengths) {
        check_cast_from<double>(n, 10);
        check_cast_from<float>(n, 11);
        check_cast_from<__nv_bfloat16>(n, 12);
    }
}

TEST_CASE("cast rounds exact ties to even, once", "[kernels][glue]") {
    const double u = std::ldexp(1.0, -8);  // half a bf16 ulp at 1
    // Ties go to the even neighbour: 1 + 2^-8 down to 1, 1 + 3·2^-8 up to 1 + 2^-6; signs mirror.
    const std::vector<double> ties = {1 + u,        1 + 3 * u, -(1 + u), -(1 + 3 * u), std::ldexp(1 + 3 * u, -16),
                                      256 + 256 * u};
    const std::vector<double> tie_results = {1, 1 + 4 * u, -1, -(1 + 4 * u), std::ldexp(1 + 4 * u, -16), 256};
    check_cast_values<float, __nv_bfloat16>(ties, tie_results);
    check_cast_values<double, __nv_bfloat16>(ties, tie_results);
    // Just above and below a tie. 1 + 2^-8 + 2^-30 rounds up in bf16, but through fp32 it would
    // first become the tie 1 + 2^-8 and then round down: fp64 -> bf16 must round once.
    const double tiny = std::ldexp(1.0, -30);
    check_cast_values<double, __nv_bfloat16>({1 + u + tiny, 1 + u - tiny, -(1 + u + tiny)},
                                             {1 + 2 * u, 1, -(1 + 2 * u)});
    // fp64 -> fp32 ties: half an fp32 ulp at 1 is 2^-24.
    const double f = std::ldexp(1.0, -24);
    check_cast_values<double, float>({1 + f, 1 + 3 * f, -(1 + 3 * f), 1 + f + std::ldexp(1.0, -40)},
                                     {1, 1 + 4 * f, -(1 + 4 * f), 1 + 2 * f});
}

TEST_CASE("scale_inplace matches the fp64 reference", "[kernels][glue]") {
    for (long long n : kLengths) {
        check_scale<double>(n, 20);
        check_scale<float>(n, 21);
        check_scale<__nv_bfloat16>(n, 22);
    }
}

TEST_CASE("add matches the fp64 reference, also in place", "[kernels][glue]") {
    for (long long n : kLengths) {
        check_add<double>(n, 30);
        check_add<float>(n, 31);
        check_add<__nv_bfloat16>(n, 32);
    }
}

TEST_CASE("accumulate matches the fp64 reference", "[kernels][glue]") {
    for (long long n : kLengths) {
        check_accumulate<double>(n, 40);
        check_accumulate<float>(n, 41);
        check_accumulate<__nv_bfloat16>(n, 42);
        check_accumulate_bf16_into_float(n, 43);
    }
}

TEST_CASE("fill writes the value to exactly n elements", "[kernels][glue]") {
    for (long long n : kLengths) {
        check_fill<double>(n);
        check_fill<float>(n);
        check_fill<__nv_bfloat16>(n);
    }
}

TEST_CASE("count_targets counts the targets that are not ignored", "[kernels][glue]") {
    for (long long n : kLengths) {
        const auto targets = random_targets(size_t(n), -100, 50 + uint64_t(n));
        CHECK(count_on_device(targets, -100) == pv::reference::count_targets(targets, -100));
        CHECK(count_on_device(targets, 7) == pv::reference::count_targets(targets, 7));  // another ignore value
    }
    CHECK(count_on_device({-100}, -100) == 0);
    CHECK(count_on_device({-100, 3, -100, -100, 0, -100, -100}, -100) == 2);
    CHECK(count_on_device({}, -100) == 0);
}

TEST_CASE("sum_of_squares matches the fp64 reference, with the same bits every run", "[kernels][glue]") {
    for (long long n : kLengths) {
        check_sum_of_squares<double>(n, 60);
        check_sum_of_squares<float>(n, 61);
        check_sum_of_squares<__nv_bfloat16>(n, 62);
    }
    CHECK(sum_of_squares_on_device(std::vector<float>{}) == 0.0);
    // One scratch size serves every length up to the largest (the partition is capped).
    CHECK(pv::sum_of_squares_scratch_bytes<float>(1) == sizeof(double));
    CHECK(pv::sum_of_squares_scratch_bytes<float>(1LL << 40) == pv::sum_of_squares_scratch_bytes<float>(1LL << 30));
}

TEST_CASE("sum_of_squares gives the same bits whether or not x is 16-byte aligned", "[kernels][glue]") {
    // Around the group widths (2, 4, 8 elements), a partial block, and more groups than the grid
    // has threads (1024 blocks of 256: 2^18 groups), so that threads take several groups.
    for (long long n : {1LL, 3LL, 7LL, 8LL, 9LL, 17LL, 4099LL, 2500003LL}) {
        check_sum_of_squares_alignment<double>(n, 80 + uint64_t(n));
        check_sum_of_squares_alignment<float>(n, 81 + uint64_t(n));
        check_sum_of_squares_alignment<__nv_bfloat16>(n, 82 + uint64_t(n));
    }
}

TEST_CASE("sum_of_squares_accumulate adds the sums of many tensors in call order", "[kernels][glue]") {
    const auto a = random_vector<float>(1000003, 70), b = random_vector<float>(7, 71),
               c = random_vector<float>(4099, 72);
    const auto d = random_vector<__nv_bfloat16>(33, 73);
    const double start = 0.125;
    DeviceArray<float> d_a(a), d_b(b), d_c(c);
    DeviceArray<__nv_bfloat16> d_d(d);
    DeviceArray<unsigned char> scratch(pv::sum_of_squares_scratch_bytes<float>(1000003));  // the largest serves all
    DeviceArray<double> d_out(std::vector<double>{start});
    pv::sum_of_squares_accumulate(d_a.get(), 1000003, d_out.get(), scratch.get(), nullptr);
    pv::sum_of_squares_accumulate(d_b.get(), 7, d_out.get(), scratch.get(), nullptr);
    pv::sum_of_squares_accumulate(d_c.get(), 4099, d_out.get(), scratch.get(), nullptr);
    pv::sum_of_squares_accumulate(d_d.get(), 33, d_out.get(), scratch.get(), nullptr);
    const double got = d_out.download()[0];
    // Bit for bit the separate sums added in the same order.
    const double expected =
        (((start + sum_of_squares_on_device(a)) + sum_of_squares_on_device(b)) + sum_of_squares_on_device(c)) +
        sum_of_squares_on_device(d);
    CHECK(bits_of(got) == bits_of(expected));
    const double ref = start + pv::reference::sum_of_squares(to_double(a)) +
                       pv::reference::sum_of_squares(to_double(b)) + pv::reference::sum_of_squares(to_double(c)) +
                       pv::reference::sum_of_squares(to_double(d));
    const std::string err = compare({got}, {ref}, tolerance<float>());
    INFO(err);
    CHECK(err.empty());
}

// Run in children by the next test: prints the bits of the sums.
TEST_CASE("glue: print sum_of_squares bits", "[.][glue-child]") {
    std::printf("%s%s%s", determinism_line<double>().c_str(), determinism_line<float>().c_str(),
                determinism_line<__nv_bfloat16>().c_str());
    std::fflush(stdout);
}

TEST_CASE("sum_of_squares gives the same bits under every schedule and worker count", "[kernels][glue][schedules]") {
    const std::string expected =
        determinism_line<double>() + determinism_line<float>() + determinism_line<__nv_bfloat16>();
    const Environment schedules[] = {{{"POLEVAULT_HOST_WORKERS", "1"}, {"POLEVAULT_HOST_BLOCK_ORDER", "reverse"}},
                                     {{"POLEVAULT_HOST_WORKERS", "3"},
                                      {"POLEVAULT_HOST_THREAD_ORDER", "random"},
                                      {"POLEVAULT_HOST_BLOCK_ORDER", "random"},
                                      {"POLEVAULT_HOST_SEED", "5"},
                                      {"POLEVAULT_HOST_STREAMS", "deferred"}},
                                     {{"POLEVAULT_HOST_WORKERS", "2"}, {"POLEVAULT_HOST_THREAD_ORDER", "warp-greedy"}}};
    for (const Environment& env : schedules) {
        const ChildResult child = run_in_child("glue: print sum_of_squares bits", env);
        INFO("expected:\n" << expected << "child output:\n" << child.output);
        REQUIRE_FALSE(child.died);
        REQUIRE(child.output.find(expected) != std::string::npos);
    }
}
