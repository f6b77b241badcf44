// Host oracle of NF4 quantisation (kernels/nf4.cuh's format), written from the format's
// definition with other formulations than the kernels': plain loops over the elements, the
// 4-bit code as a count over the thresholds, the 8-bit code as the nearest map entry by exact
// distance (with the one tie rule stated below), the mean as an exact double sum. Its tables
// are bitsandbytes' own, read by the test from test/data/nf4/tables.safetensors, not the
// kernels' copies. Every result is what the format specifies bit for bit, so tests compare the
// kernels with it exactly.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <vector>

namespace pv::reference {

struct Nf4Tables {
    std::vector<float> levels;       // 16, increasing
    std::vector<float> thresholds;   // 15: s > thresholds[i] moves past level i
    std::vector<float> dynamic_map;  // 256, increasing
};

struct Nf4Quantized {
    std::vector<uint8_t> codes;         // one per element (unpacked), plus a 0 pad for odd n
    std::vector<float> absmax;          // per block of 64
    std::vector<uint8_t> absmax_codes;  // double quantisation: per block of 64
    std::vector<float> nested_absmax;   // double quantisation: per 256 blocks
    float offset = 0;                   // double quantisation
};

// The 8-bit code of s: the nearer of the two map entries around s by exact distance; s equal to
// their fp32 midpoint fl(a + b) · 0.5 goes to the even-indexed one (where fp32 rounded the true
// midpoint, that is the one place this differs from the exact nearest). NaN: 0.
inline int nf4_reference_dynamic_code(float s, const std::vector<float>& map) {
    if (std::isnan(s) || s <= map.front()) return 0;
    if (s >= map.back()) return int(map.size()) - 1;
    const int i = int(std::upper_bound(map.begin(), map.end(), s) - map.begin()) - 1;  // map[i] <= s < map[i+1]
    const float a = map[size_t(i)], b = map[size_t(i) + 1];
    const float midpoint = (a + b) * 0.5f;
    if (s == midpoint) return i % 2 == 0 ? i : i + 1;
    // long double: exact for the values that can tie; far from a tie where it is not.
    const long double to_a = (long double)s - a, to_b = (long double)b - s;
    return to_b < to_a ? i + 1 : i;
}

// The NF4 code of s: the number of thresholds it exceeds.
inline int nf4_reference_code(float s, const std::vector<float>& thresholds) {
    int code = 0;
    for (float t : thresholds)
        if (s > t) ++code;
    return code;
}

// The mean of the absmaxes: the exact sum rounded once to fp32, divided by the count in fp32.
// The sum is formed in double and checked to be exact (the rounding error of every addition,
// by Knuth's two-sum, must be zero), which holds for the tests' inputs; anything else throws.
inline float nf4_reference_mean(const std::vector<float>& absmax) {
    double sum = 0;
    for (float a : absmax) {
        const double s = sum + a, v = s - sum;
        if ((sum - (s - v)) + (double(a) - v) != 0)
            throw std::runtime_error("nf4_reference_mean: the double sum is not exact for this input");
        sum = s;
    }
    return float(sum) / float(absmax.size());
}

// Quantises x (already fp32), with double quantisation when `double_quant`.
inline Nf4Quantized nf4_reference_quantize(const std::vector<float>& x, bool double_quant, const Nf4Tables& tables) {
    const size_t n = x.size(), blocks = (n + 63) / 64;
    Nf4Quantized q;
    q.codes.assign(n + n % 2, 7);  // the pad of odd n is a quantised 0: code 7
    q.absmax.assign(blocks, 0.0f);
    for (size_t b = 0; b < blocks; ++b) {
        const size_t end = std::min(n, 64 * b + 64);
        for (size_t i = 64 * b; i < end; ++i) q.absmax[b] = std::max(q.absmax[b], std::fabs(x[i]));
        if (q.absmax[b] == 0) continue;  // all zero: code 7 throughout
        const float r = 1.0f / q.absmax[b];
        for (size_t i = 64 * b; i < end; ++i) q.codes[i] = uint8_t(nf4_reference_code(x[i] * r, tables.thresholds));
    }
    if (!double_quant) return q;
    q.offset = nf4_reference_mean(q.absmax);
    q.absmax_codes.assign(blocks, 0);
    for (size_t k = 0; k * 256 < blocks; ++k) {
        const size_t end = std::min(blocks, 256 * k + 256);
        float m = 0;
        for (size_t b = 256 * k; b < end; ++b) m = std::max(m, std::fabs(q.absmax[b] - q.offset));
        q.nested_absmax.push_back(m);
        if (m == 0) continue;  // code 0 throughout
        const float r = 1.0f / m;
        for (size_t b = 256 * k; b < end; ++b) {
            const float v = q.absmax[b] - q.offset;
            q.absmax_codes[b] = uint8_t(nf4_reference_dynamic_code(v * r, tables.dynamic_map));
        }
    }
    return q;
}

// The block scale dequantisation uses: absmax, or fl(fl(map[code] · nested) + offset).
inline float nf4_reference_scale(const Nf4Quantized& q, bool double_quant, size_t block, const Nf4Tables& tables) {
    if (!double_quant) return q.absmax[block];
    const float scaled = tables.dynamic_map[q.absmax_codes[block]] * q.nested_absmax[block / 256];
    return scaled + q.offset;
}

// The fp32 values level[code] · scale of the first n elements.
inline std::vector<float> nf4_reference_dequantize(const Nf4Quantized& q, size_t n, bool double_quant,
                                                   const Nf4Tables& tables) {
    std::vector<float> out(n);
    for (size_t i = 0; i < n; ++i)
        out[i] = tables.levels[q.codes[i]] * nf4_reference_scale(q, double_quant, i / 64, tables);
    return out;
}

}  // namespace pv::reference
