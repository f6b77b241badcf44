// NF4 (kernels/nf4.cuh) against bitsandbytes and against the host oracle.
//
// Fixtures: test/data/nf4/, made by test/interop/make_nf4_fixtures.py with bitsandbytes 0.50.2 on
// the CPU (its CUDA kernels emulated where they decide differently). For every case, with and
// without double quantisation, the kernels' codes, absmaxes, nested codes and absmaxes and offset
// must equal polevault's rule bit for bit (= bitsandbytes' CPU result except where the fixture
// stores polevault's own), every element where bitsandbytes' CPU path (or its CUDA kernels)
// differs from polevault must be one the fixture lists under its reason, checked here against
// that reason; and the dequantisation kernel run on bitsandbytes' own fields must give
// bitsandbytes' dequantize_4bit output bit for bit. Then random inputs of awkward sizes in bf16,
// fp32 and fp64 against test/reference/nf4_reference.h, the round-trip error bound, all-zero
// blocks, and descriptors that cannot work. Every output buffer is poisoned before its kernel.
#include "formats/safetensors.h"
#include "kernels/nf4.cuh"
#include "test/check.h"
#include "test/nf4_values.h"
#include "test/reference/nf4_reference.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>

using namespace pv::test;
namespace fs = std::filesystem;
using bf16 = __nv_bfloat16;

namespace nf4_test {

const fs::path kFixtures = fs::path(__FILE__).parent_path() / "data/nf4";
const char* const kCases[] = {"short_tail", "odd",       "many_blocks", "zero_blocks",
                              "magnitudes", "dq_search", "ties_fp32"};

const pv::SafeTensorsFile& fixture(const std::string& name) {
    static std::map<std::string, pv::SafeTensorsFile> files;
    auto it = files.find(name);
    if (it == files.end())
        it = files.emplace(name, pv::read_safetensors((kFixtures / (name + ".safetensors")).string())).first;
    return it->second;
}

bool has(const pv::SafeTensorsFile& f, const std::string& name) {
    return std::any_of(f.tensors.begin(), f.tensors.end(), [&](const pv::SafeTensor& t) { return t.name == name; });
}

template <class T>
const char* dtype_name() {
    if constexpr (std::is_same_v<T, uint8_t>)
        return "U8";
    else if constexpr (std::is_same_v<T, int64_t>)
        return "I64";
    else if constexpr (std::is_same_v<T, float>)
        return "F32";
    else
        return "BF16";
}

template <class T>
std::vector<T> read(const pv::SafeTensorsFile& f, const std::string& name) {
    const pv::SafeTensor& t = f.at(name);
    INFO(f.path << ": " << name);
    REQUIRE(t.dtype == dtype_name<T>());
    std::vector<T> v(t.data.size() / sizeof(T));
    std::memcpy(v.data(), t.data.data(), t.data.size());
    return v;
}

// polevault's expected tensor: its own when the fixture stores one (where its rule differs from
// bitsandbytes' CPU result), else the CPU's.
template <class T>
std::vector<T> expected(const pv::SafeTensorsFile& f, const std::string& field, const std::string& cpu_prefix) {
    const std::string own = (cpu_prefix == "cpu" ? "polevault/" : "polevault_dq/") + field;
    return read<T>(f, has(f, own) ? own : cpu_prefix + "/" + field);
}

// Indices listed under the fixture's reasons (absent lists are empty), sorted.
std::vector<int64_t> listed(const pv::SafeTensorsFile& f, std::initializer_list<const char*> names) {
    std::vector<int64_t> all;
    for (const char* name : names)
        if (has(f, name)) {
            const auto v = read<int64_t>(f, name);
            all.insert(all.end(), v.begin(), v.end());
        }
    std::sort(all.begin(), all.end());
    return all;
}

template <class T>
uint64_t bits(T v) {
    uint64_t b = 0;
    std::memcpy(&b, &v, sizeof v);
    return b;
}

template <class T>
double as_double(T v) {
    if constexpr (std::is_same_v<T, bf16>)
        return double(__bfloat162float(v));
    else
        return double(v);
}

// Empty when got and want are equal bit for bit, else the first difference.
template <class T>
std::string bitwise_difference(const std::vector<T>& got, const std::vector<T>& want) {
    if (got.size() != want.size())
        return "size " + std::to_string(got.size()) + ", expected " + std::to_string(want.size());
    for (size_t i = 0; i < got.size(); ++i)
        if (bits(got[i]) != bits(want[i])) {
            char buf[200];
            std::snprintf(buf, sizeof buf,
                          "element %zu of %zu: got %.9g (bits %#" PRIx64 "), expected %.9g (bits %#" PRIx64 ")", i,
                          got.size(), as_double(got[i]), bits(got[i]), as_double(want[i]), bits(want[i]));
            return buf;
        }
    return {};
}

// The indices where a and b differ.
template <class T>
std::vector<int64_t> differing(const std::vector<T>& a, const std::vector<T>& b) {
    REQUIRE(a.size() == b.size());
    std::vector<int64_t> out;
    for (size_t i = 0; i < a.size(); ++i)
        if (bits(a[i]) != bits(b[i])) out.push_back(int64_t(i));
    return out;
}

std::vector<uint8_t> unpack(const std::vector<uint8_t>& packed) {
    std::vector<uint8_t> codes;
    for (uint8_t byte : packed) codes.push_back(byte >> 4), codes.push_back(byte & 15);
    return codes;
}

std::vector<uint8_t> pack(const std::vector<uint8_t>& codes) {
    std::vector<uint8_t> packed(codes.size() / 2);
    for (size_t i = 0; i < packed.size(); ++i) packed[i] = uint8_t(codes[2 * i] << 4 | codes[2 * i + 1]);
    return packed;
}

template <class T>
float to_float(T v) {
    if constexpr (std::is_same_v<T, bf16>)
        return __bfloat162float(v);
    else
        return float(v);  // fp64: rounded to nearest even, as the format converts it
}

template <class T>
T from_float(float v) {
    if constexpr (std::is_same_v<T, bf16>)
        return __float2bfloat16(v);
    else
        return T(v);
}

// A quantised tensor's buffers on the device, poisoned; `view()` describes them.
struct DeviceNf4 {
    long long n;
    bool double_quant;
    DeviceArray<uint8_t> codes, absmax_codes;
    DeviceArray<float> absmax, nested_absmax, offset;
    DeviceArray<unsigned char> scratch;  // lives as long as the tensor: the stream may run later

    DeviceNf4(long long n_, bool dq)
        : n(n_),
          double_quant(dq),
          codes(size_t(pv::nf4_code_bytes(n_))),
          absmax_codes(dq ? size_t(pv::nf4_blocks(n_)) : 0),
          absmax(dq ? 0 : size_t(pv::nf4_blocks(n_))),
          nested_absmax(dq ? size_t(pv::nf4_nested_blocks(n_)) : 0),
          offset(dq ? 1 : 0),
          scratch(pv::nf4_quantize_scratch_bytes(n_, dq)) {}

    pv::Nf4Tensor view() const {
        pv::Nf4Tensor t;
        t.codes = codes.get(), t.n = n, t.double_quant = double_quant;
        if (double_quant)
            t.absmax_codes = absmax_codes.get(), t.nested_absmax = nested_absmax.get(), t.offset = offset.get();
        else
            t.absmax = absmax.get();
        return t;
    }
    void poison() { codes.poison(), absmax_codes.poison(), absmax.poison(), nested_absmax.poison(), offset.poison(); }
};

template <class T>
void quantize(const DeviceArray<T>& x, DeviceNf4& q) {
    q.poison();
    pv::nf4_quantize(x.get(), q.n, q.view(), q.double_quant ? q.scratch.get() : nullptr, nullptr);
}

template <class T>
std::vector<T> dequantize(const pv::Nf4ConstTensor& t) {
    DeviceArray<T> out(size_t(t.n));  // poisoned
    pv::nf4_dequantize(t, out.get(), t.n, nullptr);
    return out.download();
}

// bitsandbytes' tables, as the fixture script read them from bitsandbytes itself.
const pv::reference::Nf4Tables& bnb_tables() {
    static const pv::reference::Nf4Tables tables{read<float>(fixture("tables"), "nf4_levels"),
                                                 read<float>(fixture("tables"), "nf4_thresholds_cuda"),
                                                 read<float>(fixture("tables"), "dynamic_map")};
    return tables;
}

// The scaled value s = x · fl(1/absmax) of element i, from fixture numbers.
float scaled(const std::vector<float>& x, const std::vector<float>& absmax, size_t i) {
    return i < x.size() ? x[i] * (1.0f / absmax[i / 64]) : 0.0f;
}

// One fixture case, its input of storage type T (bf16 or fp32).
template <class T>
void check_fixture(const pv::SafeTensorsFile& f) {
    const auto input = read<T>(f, "input");
    const long long n = (long long)input.size();
    std::vector<float> x(input.size());
    std::transform(input.begin(), input.end(), x.begin(), to_float<T>);
    const DeviceArray<T> d_x(input);

    // Quantisation, plain and double-quantised, against polevault's rule.
    DeviceNf4 plain(n, false), dq(n, true);
    quantize(d_x, plain);
    quantize(d_x, dq);
    const auto want_codes = expected<uint8_t>(f, "codes", "cpu");
    const auto want_absmax = expected<float>(f, "absmax", "cpu");
    const auto want_absmax_codes = expected<uint8_t>(f, "absmax_codes", "cpu_dq");
    const auto want_nested = expected<float>(f, "nested_absmax", "cpu_dq");
    const auto want_offset = expected<float>(f, "offset", "cpu_dq");
    const auto codes = plain.codes.download();
    const auto absmax = plain.absmax.download();
    {
        INFO("plain codes: " << bitwise_difference(codes, want_codes));
        CHECK(bitwise_difference(codes, want_codes).empty());
        INFO("plain absmax: " << bitwise_difference(absmax, want_absmax));
        CHECK(bitwise_difference(absmax, want_absmax).empty());
        const auto dq_codes = dq.codes.download();
        INFO("double-quantised codes: " << bitwise_difference(dq_codes, want_codes));
        CHECK(bitwise_difference(dq_codes, want_codes).empty());
        const auto absmax_codes = dq.absmax_codes.download();
        const auto nested = dq.nested_absmax.download();
        const auto offset = dq.offset.download();
        INFO("absmax codes: " << bitwise_difference(absmax_codes, want_absmax_codes));
        CHECK(bitwise_difference(absmax_codes, want_absmax_codes).empty());
        INFO("nested absmax: " << bitwise_difference(nested, want_nested));
        CHECK(bitwise_difference(nested, want_nested).empty());
        INFO("offset: " << bitwise_difference(offset, want_offset));
        CHECK(bitwise_difference(offset, want_offset).empty());
    }

    // Every difference from bitsandbytes' CPU path is listed under its reason, and is that reason.
    const auto& tables = bnb_tables();
    const auto cpu_codes = unpack(read<uint8_t>(f, "cpu/codes")), pv_codes = unpack(want_codes);
    const auto cpu_thresholds = read<float>(fixture("tables"), "nf4_thresholds_cpu");
    const auto threshold_listed = listed(f, {"diff/cpu/codes_threshold"});
    const auto division_listed = listed(f, {"diff/cpu/codes_division"});
    CHECK(differing(cpu_codes, pv_codes) == listed(f, {"diff/cpu/codes_threshold", "diff/cpu/codes_division"}));
    for (int64_t i : threshold_listed) {  // 1: s is one of the floats where the paths' thresholds differ
        const float s = scaled(x, want_absmax, size_t(i));
        INFO("element " << i << ", s = " << s);
        const int k = pv::reference::nf4_reference_code(s, tables.thresholds);
        CHECK(std::abs(int(cpu_codes[size_t(i)]) - k) == 1);
        CHECK(pv_codes[size_t(i)] == k);
        bool at_a_differing_threshold = false;
        for (size_t t = 0; t < cpu_thresholds.size(); ++t)
            if (cpu_thresholds[t] != tables.thresholds[t] && (s == cpu_thresholds[t] || s == tables.thresholds[t]))
                at_a_differing_threshold = true;
        CHECK(at_a_differing_threshold);
    }
    for (int64_t i : division_listed) {  // 4: in the short last block, x / absmax differs from x · (1/absmax)
        const float a = want_absmax.back();
        INFO("element " << i);
        CHECK(n % 64 != 0);
        CHECK(i >= (n - 1) / 64 * 64);
        CHECK(x[size_t(i)] / a != x[size_t(i)] * (1.0f / a));
        CHECK(pv_codes[size_t(i)] ==
              pv::reference::nf4_reference_code(scaled(x, want_absmax, size_t(i)), tables.thresholds));
    }
    const auto cpu_absmax = read<float>(f, "cpu/absmax");
    CHECK(differing(cpu_absmax, want_absmax) == listed(f, {"diff/cpu/absmax_zero_tail"}));
    for (int64_t b : listed(f, {"diff/cpu/absmax_zero_tail"})) {  // 3: the CPU stores its clamp
        CHECK(b == int64_t(want_absmax.size()) - 1);
        CHECK(cpu_absmax[size_t(b)] == 1e-38f);
        CHECK(bits(want_absmax[size_t(b)]) == 0);
    }
    const auto cpu_absmax_codes = read<uint8_t>(f, "cpu_dq/absmax_codes");
    CHECK(differing(cpu_absmax_codes, want_absmax_codes) == listed(f, {"diff/cpu/absmax_codes_search"}));
    for (int64_t b : listed(f, {"diff/cpu/absmax_codes_search"})) {  // 5: CUDA's search is the nearer
        const float m = want_nested[size_t(b) / 256];
        const float s = (want_absmax[size_t(b)] - want_offset[0]) * (1.0f / m);
        const double to_cpu = std::fabs(double(s) - tables.dynamic_map[cpu_absmax_codes[size_t(b)]]);
        const double to_ours = std::fabs(double(s) - tables.dynamic_map[want_absmax_codes[size_t(b)]]);
        INFO("block " << b << ", s = " << s << ": CPU code " << int(cpu_absmax_codes[size_t(b)]) << ", ours "
                      << int(want_absmax_codes[size_t(b)]));
        CHECK(std::abs(int(cpu_absmax_codes[size_t(b)]) - int(want_absmax_codes[size_t(b)])) == 1);
        CHECK(to_ours < to_cpu);
    }
    // ... and from its CUDA kernels: all-zero blocks only (2), where CUDA writes code 0.
    const auto cuda_listed = listed(f, {"diff/cuda/codes_zero_block"});
    CHECK(has(f, "cuda/codes") == !cuda_listed.empty());
    if (has(f, "cuda/codes")) {
        const auto cuda_codes = unpack(read<uint8_t>(f, "cuda/codes"));
        CHECK(differing(cuda_codes, pv_codes) == cuda_listed);
        for (int64_t i : cuda_listed) {
            CHECK(want_absmax[size_t(i) / 64] == 0.0f);
            CHECK(cuda_codes[size_t(i)] == 0);
            CHECK(pv_codes[size_t(i)] == pv::kNf4CodeOfZero);
        }
    }

    // Dequantisation of bitsandbytes' own fields gives its dequantize_4bit output bit for bit.
    const DeviceArray<uint8_t> cpu_packed(read<uint8_t>(f, "cpu/codes")), d_cpu_absmax_codes(cpu_absmax_codes);
    const DeviceArray<float> d_cpu_absmax(cpu_absmax);
    const DeviceArray<float> d_cpu_nested(read<float>(f, "cpu_dq/nested_absmax")),
        d_cpu_offset(read<float>(f, "cpu_dq/offset"));
    pv::Nf4ConstTensor cpu_plain, cpu_dq;
    cpu_plain.codes = cpu_dq.codes = cpu_packed.get();
    cpu_plain.n = cpu_dq.n = n;
    cpu_plain.absmax = d_cpu_absmax.get();
    cpu_dq.double_quant = true;
    cpu_dq.absmax_codes = d_cpu_absmax_codes.get(), cpu_dq.nested_absmax = d_cpu_nested.get();
    cpu_dq.offset = d_cpu_offset.get();
    const auto cpu_out = dequantize<T>(cpu_plain), cpu_dq_out = dequantize<T>(cpu_dq);
    INFO("dequantised bitsandbytes fields: " << bitwise_difference(cpu_out, read<T>(f, "cpu/dequant")));
    CHECK(bitwise_difference(cpu_out, read<T>(f, "cpu/dequant")).empty());
    INFO("dequantised bitsandbytes double-quantised fields: " << bitwise_difference(cpu_dq_out,
                                                                                    read<T>(f, "cpu_dq/dequant")));
    CHECK(bitwise_difference(cpu_dq_out, read<T>(f, "cpu_dq/dequant")).empty());

    // ... and of polevault's own fields, bitsandbytes' dequantisation of them.
    const auto out = dequantize<T>(plain.view()), dq_out = dequantize<T>(dq.view());
    const auto want_out = expected<T>(f, "dequant", "cpu"), want_dq_out = expected<T>(f, "dequant", "cpu_dq");
    INFO("dequantised: " << bitwise_difference(out, want_out));
    CHECK(bitwise_difference(out, want_out).empty());
    INFO("dequantised, double quantisation: " << bitwise_difference(dq_out, want_dq_out));
    CHECK(bitwise_difference(dq_out, want_dq_out).empty());

    // CUDA's codes for an all-zero block dequantise, with double quantisation, to a non-zero
    // value; polevault's to exactly 0.
    if (has(f, "cuda/codes")) {
        const DeviceArray<uint8_t> cuda_packed(read<uint8_t>(f, "cuda/codes"));
        pv::Nf4ConstTensor cuda_dq = dq.view();
        cuda_dq.codes = cuda_packed.get();
        const auto cuda_out = dequantize<T>(cuda_dq);
        const auto want_cuda_out = read<T>(f, "cuda_dq/dequant");
        INFO("CUDA's fields: " << bitwise_difference(cuda_out, want_cuda_out));
        CHECK(bitwise_difference(cuda_out, want_cuda_out).empty());
        for (int64_t i : cuda_listed)
            if (i < n) {
                CHECK(as_double(want_cuda_out[size_t(i)]) != 0.0);
                CHECK(as_double(dq_out[size_t(i)]) == 0.0);
            }
    }
}

template <class T>
void check_against_oracle(long long n, uint64_t seed) {
    const auto input = nf4_awkward_values<T>(n, seed);
    std::vector<float> x(input.size());
    std::transform(input.begin(), input.end(), x.begin(), to_float<T>);
    const DeviceArray<T> d_x(input);
    for (bool double_quant : {false, true}) {
        INFO("n " << n << (double_quant ? ", double quantisation" : ""));
        const auto ref = pv::reference::nf4_reference_quantize(x, double_quant, bnb_tables());
        DeviceNf4 q(n, double_quant);
        quantize(d_x, q);
        CHECK(bitwise_difference(q.codes.download(), pack(ref.codes)).empty());
        if (double_quant) {
            CHECK(bitwise_difference(q.absmax_codes.download(), ref.absmax_codes).empty());
            CHECK(bitwise_difference(q.nested_absmax.download(), ref.nested_absmax).empty());
            CHECK(bitwise_difference(q.offset.download(), std::vector<float>{ref.offset}).empty());
        } else {
            CHECK(bitwise_difference(q.absmax.download(), ref.absmax).empty());
        }
        const auto values = pv::reference::nf4_reference_dequantize(ref, size_t(n), double_quant, bnb_tables());
        std::vector<T> want(values.size());
        std::transform(values.begin(), values.end(), want.begin(), from_float<T>);
        const auto got = dequantize<T>(q.view());
        INFO("dequantised: " << bitwise_difference(got, want));
        CHECK(bitwise_difference(got, want).empty());
    }
}

// Half the widest gap between neighbouring NF4 levels (bitsandbytes'): no scaled value is
// further than that from the level it is given.
double half_widest_gap() {
    const auto& levels = bnb_tables().levels;
    double gap = 0;
    for (size_t i = 0; i + 1 < levels.size(); ++i) gap = std::max(gap, double(levels[i + 1]) - levels[i]);
    return gap / 2;
}

}  // namespace nf4_test

using namespace nf4_test;

TEST_CASE("nf4 tables are bitsandbytes' and its CUDA searches' decisions", "[kernels][nf4]") {
    const auto& t = fixture("tables");
    const auto levels = read<float>(t, "nf4_levels"), thresholds = read<float>(t, "nf4_thresholds_cuda");
    const auto map = read<float>(t, "dynamic_map"), cpu_thresholds = read<float>(t, "nf4_thresholds_cpu");
    CHECK(bitwise_difference(std::vector<float>(std::begin(pv::kNf4Levels), std::end(pv::kNf4Levels)), levels).empty());
    CHECK(
        bitwise_difference(std::vector<float>(std::begin(pv::kNf4Thresholds), std::end(pv::kNf4Thresholds)), thresholds)
            .empty());
    CHECK(bitwise_difference(std::vector<float>(std::begin(pv::kNf4DynamicMap), std::end(pv::kNf4DynamicMap)), map)
              .empty());
    // The header's decision 1: CUDA's and the CPU's thresholds differ at exactly these four.
    CHECK(differing(thresholds, cpu_thresholds) == std::vector<int64_t>{0, 8, 12, 14});

    // The searches at and next to every boundary give the CUDA kernels' codes (emulated from
    // their source by the fixture script); so does the oracle's other formulation.
    const auto nf4_probe = read<float>(t, "nf4_probe"), dynamic_probe = read<float>(t, "dynamic_probe");
    const auto nf4_want = read<uint8_t>(t, "nf4_probe_cuda_code"),
               dynamic_want = read<uint8_t>(t, "dynamic_probe_cuda_code");
    for (size_t i = 0; i < nf4_probe.size(); ++i) {
        INFO("s = " << nf4_probe[i] << " (bits " << std::hex << bits(nf4_probe[i]) << ")");
        CHECK(pv::nf4_code(nf4_probe[i], pv::kNf4Thresholds) == nf4_want[i]);
        CHECK(pv::reference::nf4_reference_code(nf4_probe[i], thresholds) == nf4_want[i]);
    }
    for (size_t i = 0; i < dynamic_probe.size(); ++i) {
        INFO("s = " << dynamic_probe[i] << " (bits " << std::hex << bits(dynamic_probe[i]) << ")");
        CHECK(pv::nf4_dynamic_code(dynamic_probe[i], pv::kNf4DynamicMap) == dynamic_want[i]);
        CHECK(pv::reference::nf4_reference_dynamic_code(dynamic_probe[i], map) == dynamic_want[i]);
    }

    // The kernels' own copies: every level (codes 0..15 at absmax 1) and every map entry (absmax
    // codes 0..255, nested absmax 1, offset 0, code 15 = level 1) dequantise to themselves.
    {
        const long long n = 32;
        std::vector<uint8_t> packed(16);
        for (int i = 0; i < 16; ++i) packed[size_t(i)] = uint8_t((2 * i % 16) << 4 | (2 * i + 1) % 16);
        const DeviceArray<uint8_t> codes(packed);
        const DeviceArray<float> absmax(std::vector<float>{1.0f});
        pv::Nf4ConstTensor v;
        v.codes = codes.get(), v.absmax = absmax.get(), v.n = n;
        const auto out = dequantize<float>(v);
        std::vector<float> want;
        for (int i = 0; i < 32; ++i) want.push_back(levels[size_t(i % 16)]);
        INFO(bitwise_difference(out, want));
        CHECK(bitwise_difference(out, want).empty());
    }
    {
        // Every entry (test-tsan: every 17th, 0 to 255), one block each.
        const int entries = pv::kThreadSanitizer ? 16 : 256;
        const long long n = 64LL * entries;
        std::vector<uint8_t> absmax_codes;
        std::vector<float> want;
        for (int b = 0; b < entries; ++b) {
            absmax_codes.push_back(uint8_t(b * 255 / (entries - 1)));
            want.push_back(map[absmax_codes.back()]);
        }
        const DeviceArray<uint8_t> codes(std::vector<uint8_t>(size_t(n / 2), 0xFF)), d_absmax_codes(absmax_codes);
        const DeviceArray<float> nested(std::vector<float>{1.0f}), offset(std::vector<float>{0.0f});
        pv::Nf4ConstTensor v;
        v.codes = codes.get(), v.absmax_codes = d_absmax_codes.get(), v.nested_absmax = nested.get();
        v.offset = offset.get(), v.n = n, v.double_quant = true;
        const auto out = dequantize<float>(v);
        std::vector<float> firsts;
        for (int b = 0; b < entries; ++b) firsts.push_back(out[size_t(64 * b)]);
        INFO(bitwise_difference(firsts, want));
        CHECK(bitwise_difference(firsts, want).empty());
    }
}

TEST_CASE("nf4 equals bitsandbytes on its fixtures, with every difference explained", "[kernels][nf4]") {
    // test-tsan (every emulated thread a fiber) takes the two smallest with differences, which
    // between them hold every reason for one but the 8-bit search's.
    const std::vector<const char*> small = {"zero_blocks", "ties_fp32"};
    for (const char* name :
         pv::kThreadSanitizer ? small : std::vector<const char*>(std::begin(kCases), std::end(kCases))) {
        INFO("fixture " << name);
        const auto& f = fixture(name);
        if (f.at("input").dtype == "BF16")
            check_fixture<bf16>(f);
        else
            check_fixture<float>(f);
    }
}

TEST_CASE("nf4 matches the host oracle on random inputs of awkward sizes (bf16, fp32, fp64)", "[kernels][nf4]") {
    // One block, sizes that are odd or leave a short block, more than 256 blocks with a short
    // nested block, multiples of 32 (the dequantisation's 16-byte path); test-tsan runs the small ones.
    const std::vector<long long> sizes =
        pv::kThreadSanitizer ? std::vector<long long>{63, 333, 128}
                             : std::vector<long long>{1, 2, 63, 65, 127, 1001, 64 * 300 + 33, 64 * 3, 64 * 300};
    uint64_t seed = 100;
    for (long long n : sizes) {
        check_against_oracle<bf16>(n, seed++);
        check_against_oracle<float>(n, seed++);
        check_against_oracle<double>(n, seed++);
    }
}

TEST_CASE("nf4 round trips within half the widest level gap; all-zero blocks give exactly 0", "[kernels][nf4]") {
    const long long n = 64 * 9 + 21;  // blocks 4 and the short last one all zero
    auto input = random_vector<float>(size_t(n), 7, -3.0, 3.0);
    for (long long i = 4 * 64; i < 5 * 64; ++i) input[size_t(i)] = 0.0f;
    for (long long i = 9 * 64; i < n; ++i) input[size_t(i)] = 0.0f;
    std::vector<float> absmax(size_t(pv::nf4_blocks(n)), 0.0f);
    for (long long i = 0; i < n; ++i)
        absmax[size_t(i / 64)] = std::max(absmax[size_t(i / 64)], std::fabs(input[size_t(i)]));
    const DeviceArray<float> d_x(input);
    const double half_gap = half_widest_gap();
    for (bool double_quant : {false, true}) {
        INFO((double_quant ? "double quantisation" : "plain"));
        DeviceNf4 q(n, double_quant);
        quantize(d_x, q);
        const auto codes = unpack(q.codes.download());
        for (long long b : {4LL, 9LL})
            for (long long i = 64 * b; i < std::min(n, 64 * b + 64); ++i) CHECK(codes[size_t(i)] == pv::kNf4CodeOfZero);
        // The scale dequantisation uses: absmax, or absmax' = map[code] · nested + offset.
        std::vector<float> scale = absmax;
        if (double_quant) {
            const auto map_codes = q.absmax_codes.download();
            const float nested = q.nested_absmax.download()[0], offset = q.offset.download()[0];
            for (size_t b = 0; b < scale.size(); ++b) scale[b] = pv::kNf4DynamicMap[map_codes[b]] * nested + offset;
        }
        const auto as_f32 = dequantize<float>(q.view());
        const auto as_f64 = dequantize<double>(q.view());
        const auto as_bf16 = dequantize<bf16>(q.view());
        for (long long i = 0; i < n; ++i) {
            const size_t b = size_t(i / 64);
            const double x = input[size_t(i)], v = as_f32[size_t(i)];
            // |level·absmax' − x| ≤ |level·absmax − x| + |absmax' − absmax| (|level| ≤ 1), with
            // 1e-6·absmax of slack for the fp32 product and thresholds an ulp off the midpoints.
            const double bound = (half_gap + 1e-6) * absmax[b] + std::fabs(double(scale[b]) - absmax[b]);
            INFO("element " << i << ": x " << x << ", dequantised " << v << ", bound " << bound);
            CHECK(std::fabs(v - x) <= bound);
            CHECK(as_f64[size_t(i)] == v);                                        // widened exactly
            CHECK(bits(as_bf16[size_t(i)]) == bits(__float2bfloat16(float(v))));  // rounded once
            if (absmax[b] == 0) {
                CHECK(v == 0.0);
                CHECK(as_double(as_bf16[size_t(i)]) == 0.0);
            }
        }
    }
}

TEST_CASE("nf4's offset is the correctly rounded sum over the count, in any order", "[kernels][nf4]") {
    // Absmaxes 1, 2^-24 and 298 of 2^-90 (more blocks than the mean's kernel has threads): the
    // exact sum lies just above 1 + 2^-24, halfway between the floats 1 and 1 + 2^-23, so it
    // rounds up; a sum that drops the small terms (fp32, or double, where 1 + 2^-24 + 2^-90 is
    // 1 + 2^-24, a tie rounded to even) gives 1.
    const int blocks = pv::kThreadSanitizer ? 40 : 300;  // test-tsan: fewer fibers, the same partials logic
    for (bool reversed : {false, true}) {
        std::vector<float> x(size_t(blocks) * 64, 0.0f);
        for (int b = 0; b < blocks; ++b) {
            const float a = b == 0 ? 1.0f : b == 1 ? std::ldexp(1.0f, -24) : std::ldexp(1.0f, -90);
            x[size_t(reversed ? blocks - 1 - b : b) * 64 + 5] = b % 2 ? -a : a;
        }
        const DeviceArray<float> d_x(x);
        DeviceNf4 q(blocks * 64LL, true);
        quantize(d_x, q);
        const float want = std::nextafter(1.0f, 2.0f) / float(blocks);
        INFO((reversed ? "reversed" : "in order") << ": offset " << q.offset.download()[0] << ", expected " << want);
        CHECK(bits(q.offset.download()[0]) == bits(want));
    }
}

TEST_CASE("nf4 refuses descriptors that cannot hold the tensor", "[kernels][nf4]") {
    const long long n = 100;
    const DeviceArray<float> x(random_vector<float>(size_t(n), 3));
    DeviceNf4 plain(n, false), dq(n, true);
    DeviceArray<float> out{size_t(n)};
    auto message = [](auto&& call) {
        try {
            call();
        } catch (const std::invalid_argument& e) {
            return std::string(e.what());
        }
        return std::string("no exception");
    };
    CHECK_THAT(message([&] { pv::nf4_quantize(x.get(), n - 1, plain.view(), nullptr, nullptr); }),
               Catch::Matchers::Contains("describes 100 elements, not 99"));
    CHECK_THAT(message([&] { pv::nf4_dequantize(pv::Nf4ConstTensor(plain.view()), out.get(), n + 1, nullptr); }),
               Catch::Matchers::Contains("describes 100 elements, not 101"));
    CHECK_THAT(message([&] { pv::nf4_quantize(x.get(), n, dq.view(), nullptr, nullptr); }),
               Catch::Matchers::Contains("nf4_quantize_scratch_bytes"));
    pv::Nf4Tensor no_nested = dq.view();
    no_nested.nested_absmax = nullptr;
    CHECK_THAT(message([&] { pv::nf4_dequantize(pv::Nf4ConstTensor(no_nested), out.get(), n, nullptr); }),
               Catch::Matchers::Contains("needs absmax_codes, nested_absmax and offset"));
    pv::Nf4Tensor no_absmax = plain.view();
    no_absmax.absmax = nullptr;
    CHECK_THAT(message([&] { pv::nf4_quantize(x.get(), n, no_absmax, nullptr, nullptr); }),
               Catch::Matchers::Contains("no absmax buffer"));
    // The layout arithmetic: 4.5 and ~4.127 bits per parameter.
    CHECK(pv::nf4_stored_bytes(4096LL * 4096, false) == 4096LL * 4096 / 2 + 4096LL * 4096 / 64 * 4);
    const long long big = 4096LL * 14336;
    CHECK(pv::nf4_stored_bytes(big, true) == big / 2 + big / 64 + big / 64 / 256 * 4 + 4);
    CHECK(std::fabs(8.0 * double(pv::nf4_stored_bytes(big, true)) / double(big) - 4.127) < 0.001);
    CHECK(pv::nf4_code_bytes(7) == 4);
    CHECK(pv::nf4_blocks(65) == 2);
    CHECK(pv::nf4_nested_blocks(64 * 257) == 2);
}
