// RoPE kernels (with their cos/sin table) against the fp64 reference (bf16, fp32, fp64) on a fused
// [q | k | v | pad] row, at odd and aligned row strides, positions outside the table,
// the inverse frequencies (plain and Llama-3 scaled) against values computed here in long double,
// a forward-backward round trip, and a central-difference check of the backward in fp64.
#include "kernels/rope.cuh"
#include "model/config.h"
#include "test/check.h"
#include "test/gradcheck.h"
#include "test/reference/rope.h"

#include <random>

using namespace pv::test;

namespace rope_test {

// Under ThreadSanitizer (make test-tsan) every emulated thread is a fresh fiber context and runs
// ~100 times slower; this barrier-free kernel has no shared memory to race on, so that build
// keeps only short sequences and samples the gradient check.
constexpr bool kTsanBuild = pv::kThreadSanitizer;

// The kernels' cos/sin table on the device for the frequencies `freqs` and positions [0, P). The
// reference gets `freqs` themselves (double): the table holds the angles' cos and sin, each
// rounded once to acc_t<T>.
template <class T>
class DeviceTable {
  public:
    using A = pv::acc_t<T>;
    DeviceTable(const std::vector<double>& freqs, int positions)
        : values_(pv::rope_table_values<A>(freqs, positions)),
          positions_(positions),
          head_dim_(int(2 * freqs.size())) {}
    pv::RopeTable<A> get() const { return {values_.get(), positions_, head_dim_}; }

  private:
    DeviceArray<A> values_;
    int positions_, head_dim_;
};

// The fused attention projection row: q (n_heads heads), k (n_kv_heads heads), v (n_kv_heads
// heads), then `pad` values. q is rotated by one call and k by a second call on x + q_width; v
// and the padding must come back bit for bit.
struct Layout {
    int n_heads = 3, n_kv_heads = 1, head_dim = 8, pad = 5;
    int q_width() const { return n_heads * head_dim; }
    int rotated() const { return (n_heads + n_kv_heads) * head_dim; }  // q and k are adjacent
    long long stride() const { return (n_heads + 2LL * n_kv_heads) * head_dim + pad; }
};

// Runs forward (sign +1) or backward (-1) on both q and k of the fused rows.
template <class T>
void rotate_q_and_k(T* x, const pv::RopeTable<pv::acc_t<T>>& inv_freq, long long rows, int seq_len, const Layout& l,
                    int sign) {
    if (sign > 0) {
        pv::rope_forward(x, inv_freq, nullptr, rows, seq_len, l.n_heads, l.head_dim, l.stride(), nullptr);
        pv::rope_forward(x + l.q_width(), inv_freq, nullptr, rows, seq_len, l.n_kv_heads, l.head_dim, l.stride(),
                         nullptr);
    } else {
        pv::rope_backward(x, inv_freq, nullptr, rows, seq_len, l.n_heads, l.head_dim, l.stride(), nullptr);
        pv::rope_backward(x + l.q_width(), inv_freq, nullptr, rows, seq_len, l.n_kv_heads, l.head_dim, l.stride(),
                          nullptr);
    }
}

// The number of elements outside q and k that changed (must be 0: compared bit for bit).
template <class T>
size_t changed_outside(const std::vector<T>& got, const std::vector<T>& in, long long rows, const Layout& l) {
    size_t changed = 0;
    for (long long r = 0; r < rows; ++r)
        for (long long c = l.rotated(); c < l.stride(); ++c) {
            const size_t k = size_t(r * l.stride() + c);
            if (std::memcmp(&got[k], &in[k], sizeof(T)) != 0) ++changed;
        }
    return changed;
}

template <class T>
void check_against_reference(int seq_len, int head_dim, const pv::RopeScaling& scaling, double theta, uint64_t seed,
                             int pad) {
    const long long batch = 2, rows = batch * seq_len;
    Layout l;
    l.head_dim = head_dim;
    l.pad = pad;
    const auto inv_freq = pv::rope_inverse_frequencies(head_dim, theta, scaling);
    const auto x = random_vector<T>(size_t(rows * l.stride()), seed);
    const auto dout = random_vector<T>(x.size(), seed + 1);
    const DeviceTable<T> table(inv_freq, seq_len);
    DeviceArray<T> d_x(x), d_dx(dout);

    rotate_q_and_k(d_x.get(), table.get(), rows, seq_len, l, +1);
    rotate_q_and_k(d_dx.get(), table.get(), rows, seq_len, l, -1);
    const auto got = d_x.download(), got_d = d_dx.download();

    const auto ref =
        pv::reference::rope_forward(to_double(x), inv_freq, size_t(rows), size_t(seq_len),
                                    size_t(l.n_heads + l.n_kv_heads), size_t(head_dim), size_t(l.stride()));
    const auto ref_d =
        pv::reference::rope_backward(to_double(dout), inv_freq, size_t(rows), size_t(seq_len),
                                     size_t(l.n_heads + l.n_kv_heads), size_t(head_dim), size_t(l.stride()));
    const std::string e1 = compare(to_double(got), ref, tolerance<T>());
    const std::string e2 = compare(to_double(got_d), ref_d, tolerance<T>());
    INFO("seq_len " << seq_len << " head_dim " << head_dim << " pad " << pad << " llama3 " << scaling.enabled()
                    << "\nforward: " << e1 << "\nbackward: " << e2);
    REQUIRE(e1.empty());
    REQUIRE(e2.empty());
    REQUIRE(changed_outside(got, x, rows, l) == 0);
    REQUIRE(changed_outside(got_d, dout, rows, l) == 0);
}

// Llama-3.2-1B's published config.json: rope_theta 500000, head_dim 64 (2048 / 32 heads),
// rope_scaling {rope_type "llama3", factor 32, low_freq_factor 1, high_freq_factor 4,
// original_max_position_embeddings 8192}.
pv::RopeScaling llama32_scaling() {
    pv::RopeScaling s;
    s.factor = 32;
    s.low_freq_factor = 1;
    s.high_freq_factor = 4;
    s.original_max_position_embeddings = 8192;
    return s;
}

}  // namespace rope_test

using namespace rope_test;

TEST_CASE("rope matches the fp64 reference on fused q|k|v rows", "[kernels][rope]") {
    const pv::RopeScaling none;  // factor 0: no scaling
    for (int seq_len : {1, 7, 33, 130})
        for (int head_dim : {8, 64, 128}) {
            if (kTsanBuild && (seq_len != 7 || head_dim != 8)) continue;
            // Llama-3 scaled frequencies at head_dim 64 (Llama-3.2-1B's), plain ones elsewhere.
            const bool llama3 = head_dim == 64;
            const pv::RopeScaling scaling = llama3 ? llama32_scaling() : none;
            const double theta = llama3 ? 500000.0 : 10000.0;
            const uint64_t seed = uint64_t(seq_len * 1000 + head_dim);
            // Padding 5 makes the row stride odd (one pair at a time); padding 0 gives aligned rows
            // (16-byte vectors where head_dim / 2 is a multiple of the width).
            for (int pad : {5, 0}) {
                check_against_reference<double>(seq_len, head_dim, scaling, theta, seed, pad);
                check_against_reference<float>(seq_len, head_dim, scaling, theta, seed + 2, pad);
                check_against_reference<__nv_bfloat16>(seq_len, head_dim, scaling, theta, seed + 4, pad);
            }
        }
}

// The table's angles are formed in double and only cos and sin rounded to float (see
// kernels/rope.cuh): positions far past the test sequences above still rotate to fp32 accuracy.
TEST_CASE("rope in fp32 stays accurate at long positions", "[kernels][rope]") {
    const int seq_len = kTsanBuild ? 64 : 8192, head_dim = 64;
    const auto inv_freq = pv::rope_inverse_frequencies(head_dim, 500000.0, llama32_scaling());
    const auto x = random_vector<float>(size_t(seq_len) * head_dim, 7);
    const DeviceTable<float> table(inv_freq, seq_len);
    DeviceArray<float> d_x(x);
    pv::rope_forward(d_x.get(), table.get(), nullptr, seq_len, seq_len, 1, head_dim, head_dim, nullptr);
    const auto ref = pv::reference::rope_forward(to_double(x), inv_freq, size_t(seq_len), size_t(seq_len), 1,
                                                 size_t(head_dim), size_t(head_dim));
    const std::string err = compare(to_double(d_x.download()), ref, tolerance<float>());
    INFO(err);
    REQUIRE(err.empty());
}

// Explicit positions (packed documents restart at 0; a KV-cache row sits at its true position):
// random, repeated and far past the row count, against the reference at the same positions.
TEST_CASE("rope at explicit positions matches the fp64 reference", "[kernels][rope]") {
    const long long rows = kTsanBuild ? 9 : 97;
    Layout l;
    l.head_dim = 64;
    const auto freqs = pv::rope_inverse_frequencies(l.head_dim, 500000.0, llama32_scaling());
    std::mt19937_64 rng(11);
    std::vector<int> positions(static_cast<size_t>(rows));
    for (int& p : positions) p = int(rng() % 20000);
    positions[0] = 0;
    DeviceArray<int> d_pos(positions);
    auto check = [&]<class T>(T, uint64_t seed) {
        const auto x = random_vector<T>(size_t(rows * l.stride()), seed);
        const DeviceTable<T> table(freqs, 20000);
        DeviceArray<T> d_x(x), d_dx(x);
        pv::rope_forward(d_x.get(), table.get(), d_pos.get(), rows, 5, l.n_heads + l.n_kv_heads, l.head_dim, l.stride(),
                         nullptr);
        pv::rope_backward(d_dx.get(), table.get(), d_pos.get(), rows, 5, l.n_heads + l.n_kv_heads, l.head_dim,
                          l.stride(), nullptr);
        const size_t heads = size_t(l.n_heads + l.n_kv_heads);
        const auto ref = pv::reference::rope_forward(to_double(x), freqs, size_t(rows), 5, heads, size_t(l.head_dim),
                                                     size_t(l.stride()), &positions);
        const auto ref_d = pv::reference::rope_backward(to_double(x), freqs, size_t(rows), 5, heads, size_t(l.head_dim),
                                                        size_t(l.stride()), &positions);
        const std::string e1 = compare(to_double(d_x.download()), ref, tolerance<T>());
        const std::string e2 = compare(to_double(d_dx.download()), ref_d, tolerance<T>());
        INFO("forward: " << e1 << "\nbackward: " << e2);
        REQUIRE(e1.empty());
        REQUIRE(e2.empty());
    };
    check(double{}, 21);
    check(float{}, 22);
    check(__nv_bfloat16{}, 23);
}

// A position outside the table (a bad document mask) turns that row's q and k pairs into NaN
// instead of reading outside the table; other rows, v and the padding are untouched.
TEST_CASE("rope at a position outside its table gives NaN, not an out-of-bounds read", "[kernels][rope]") {
    Layout l;
    l.head_dim = 16, l.pad = 0;
    const std::vector<int> positions = {0, -1, 3, 4, 2};  // the table has positions [0, 4)
    const long long rows = (long long)positions.size();
    DeviceArray<int> d_pos(positions);
    const DeviceTable<float> table(pv::rope_inverse_frequencies(l.head_dim, 10000.0, pv::RopeScaling{}), 4);
    const auto x = random_vector<float>(size_t(rows * l.stride()), 50);
    DeviceArray<float> d_x(x);
    pv::rope_forward(d_x.get(), table.get(), d_pos.get(), rows, 4, l.n_heads + l.n_kv_heads, l.head_dim, l.stride(),
                     nullptr);
    const auto got = d_x.download();
    for (long long r = 0; r < rows; ++r) {
        const bool bad = positions[size_t(r)] < 0 || positions[size_t(r)] >= 4;
        for (int c = 0; c < l.rotated(); ++c) {
            INFO("row " << r << " element " << c);
            CHECK(std::isnan(got[size_t(r * l.stride() + c)]) == bad);
        }
    }
    CHECK(changed_outside(got, x, rows, l) == 0);
}

// Expected values from the published formula (transformers, src/transformers/modeling_rope_utils.py,
// _compute_llama3_parameters, the same as Meta's llama-models apply_scaling), in long double.
TEST_CASE("rope inverse frequencies, plain and Llama-3 scaled (Llama-3.2-1B)", "[kernels][rope]") {
    const int head_dim = 64;
    const long double theta = 500000.0L, factor = 32, low = 1, high = 4, original = 8192;
    const long double pi = 3.141592653589793238462643383279502884L;

    std::vector<double> plain_expected, scaled_expected;
    int unchanged = 0, interpolated = 0, divided = 0;
    for (int i = 0; i < head_dim / 2; ++i) {
        const long double f = 1.0L / std::pow(theta, (long double)(2 * i) / head_dim);
        plain_expected.push_back(double(f));
        const long double wavelen = 2 * pi / f;
        long double scaled;
        if (wavelen < original / high) {
            scaled = f, ++unchanged;
        } else if (wavelen > original / low) {
            scaled = f / factor, ++divided;
        } else {
            const long double smooth = (original / wavelen - low) / (high - low);
            scaled = (1 - smooth) * f / factor + smooth * f, ++interpolated;
        }
        scaled_expected.push_back(double(scaled));
    }
    // The config exercises all three regimes: pairs 0-14 keep their frequency, 15-17 are
    // interpolated, 18-31 are divided by 32.
    REQUIRE(unchanged == 15);
    REQUIRE(interpolated == 3);
    REQUIRE(divided == 14);

    const auto plain = pv::rope_inverse_frequencies(head_dim, 500000.0, pv::RopeScaling{});
    const auto scaled = pv::rope_inverse_frequencies(head_dim, 500000.0, llama32_scaling());
    // A few ulps of double: pow, then the interpolation's handful of operations.
    const std::string e1 = compare(plain, plain_expected, 1e-14);
    const std::string e2 = compare(scaled, scaled_expected, 1e-14);
    INFO("plain: " << e1 << "\nscaled: " << e2);
    REQUIRE(e1.empty());
    REQUIRE(e2.empty());
    REQUIRE(plain[0] == 1.0);
    REQUIRE(scaled[0] == 1.0);
    // The model's overload reads the same numbers from the preset: the same values, bit for bit.
    REQUIRE(pv::rope_inverse_frequencies(pv::preset("llama-3.2-1b")) == scaled);

    // Another head size and base without scaling (Llama 2 / SmolLM2 style).
    const auto other = pv::rope_inverse_frequencies(128, 10000.0, pv::RopeScaling{});
    std::vector<double> other_expected;
    for (int i = 0; i < 64; ++i) other_expected.push_back(double(std::pow(10000.0L, -(long double)(2 * i) / 128)));
    const std::string e3 = compare(other, other_expected, 1e-14);
    INFO(e3);
    REQUIRE(e3.empty());
}

TEST_CASE("rope backward undoes the forward (fp64)", "[kernels][rope]") {
    Layout l;
    l.head_dim = 64;
    const int seq_len = kTsanBuild ? 7 : 130;
    const long long rows = 2LL * seq_len;
    const DeviceTable<double> table(pv::rope_inverse_frequencies(l.head_dim, 500000.0, llama32_scaling()), seq_len);
    const auto x = random_vector<double>(size_t(rows * l.stride()), 30);
    DeviceArray<double> d_x(x);
    rotate_q_and_k(d_x.get(), table.get(), rows, seq_len, l, +1);
    rotate_q_and_k(d_x.get(), table.get(), rows, seq_len, l, -1);
    const auto got = d_x.download();
    const std::string err = compare(got, x, 1e-12);
    INFO(err);
    REQUIRE(err.empty());
    REQUIRE(changed_outside(got, x, rows, l) == 0);
}

TEST_CASE("rope backward equals central differences of its forward (fp64)", "[kernels][rope][gradcheck]") {
    Layout l;
    l.n_heads = 2, l.n_kv_heads = 1, l.head_dim = 8, l.pad = 3;
    const int seq_len = 3;
    const long long rows = 2LL * seq_len;
    const DeviceTable<double> table(pv::rope_inverse_frequencies(l.head_dim, 10000.0, pv::RopeScaling{}), seq_len);
    auto x = random_vector<double>(size_t(rows * l.stride()), 40);
    const auto g = random_vector<double>(x.size(), 41);
    DeviceArray<double> d_x(x.size()), d_g(g);
    // L = <g, rope(x)> over whole rows: v and the padding pass through, so their gradient is g.
    auto loss = [&] {
        d_x.upload(x);
        rotate_q_and_k(d_x.get(), table.get(), rows, seq_len, l, +1);
        return dot(d_x.download(), g);
    };
    // Every coordinate, or under TSan every 8th (each forward there costs ~0.1 s).
    std::vector<size_t> indices;
    for (size_t i = 0; i < x.size(); i += kTsanBuild ? 8 : 1) indices.push_back(i);
    const auto numeric = numerical_gradient(x, loss, indices);
    rotate_q_and_k(d_g.get(), table.get(), rows, seq_len, l, -1);  // in place: g becomes dL/dx
    const std::string err = compare(gather(d_g.download(), indices), gather(numeric, indices), kGradTolerance);
    INFO(err);
    REQUIRE(err.empty());
}
