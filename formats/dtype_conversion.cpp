// Floating-point dtype conversion (formats/dtype_conversion.h).
#include "formats/dtype_conversion.h"

#include "formats/safetensors.h"

#include <bit>
#include <cmath>
#include <cstring>

namespace pv {
namespace {

template <typename T>
T load(const uint8_t* p) {
    T v;
    std::memcpy(&v, p, sizeof v);
    return v;
}

template <typename T>
void store(uint8_t* p, T v) {
    std::memcpy(p, &v, sizeof v);
}

// A file element of a 16- or 32-bit float dtype, as fp32 (exact).
float narrow_source_to_float(const uint8_t* p, const std::string& from) {
    if (from == "BF16") return bf16_to_float(load<uint16_t>(p));
    if (from == "F16") return f16_to_float(load<uint16_t>(p));
    return load<float>(p);  // F32
}

// A source element as fp32, counting a finite F64 that overflows fp32.
float source_to_float(const uint8_t* p, const std::string& from, uint64_t& overflows) {
    if (from != "F64") return narrow_source_to_float(p, from);
    const double d = load<double>(p);
    const float f = static_cast<float>(d);  // round to nearest even (the default FP environment)
    overflows += std::isfinite(d) && std::isinf(f);
    return f;
}

}  // namespace

const char* safetensors_dtype(DType t) {
    switch (t) {
        case DType::bf16: return "BF16";
        case DType::fp32: return "F32";
        case DType::fp64: return "F64";
    }
    return "?";
}

const char* torch_dtype_name(DType t) {
    switch (t) {
        case DType::bf16: return "bfloat16";
        case DType::fp32: return "float32";
        case DType::fp64: return "float64";
    }
    return "?";
}

bool is_float_dtype(const std::string& d) { return d == "BF16" || d == "F16" || d == "F32" || d == "F64"; }

// bf16 is the top half of an fp32 bit pattern. Adding 0x7FFF plus the lowest kept bit before
// truncating rounds to nearest with ties to even (a carry out of the mantissa bumps the exponent,
// which is right, up to Inf for values past bf16's largest finite). NaN is kept apart: its
// payload could lie entirely in the dropped bits, and truncating would turn it into Inf, so the
// quiet bit is set instead.
uint16_t float_to_bf16(float x) {
    const uint32_t bits = std::bit_cast<uint32_t>(x);
    if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
    return static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

float bf16_to_float(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

// IEEE binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits. Every value is exact in fp32:
// a normal one is the same sign and mantissa with the exponent rebiased (e − 15 + 127), a
// subnormal one mantissa · 2^-24 (at most 10 significant bits, far inside fp32's normal range).
float f16_to_float(uint16_t h) {
    const bool negative = (h & 0x8000u) != 0;
    const uint32_t exponent = (h >> 10) & 0x1Fu, mantissa = h & 0x3FFu;
    if (exponent == 0) {  // zero or subnormal: mantissa · 2^-24
        const float v = std::ldexp(static_cast<float>(mantissa), -24);
        return negative ? -v : v;
    }
    const uint32_t sign = negative ? 0x80000000u : 0u;
    if (exponent == 31) return std::bit_cast<float>(sign | 0x7F800000u | (mantissa << 13));  // Inf, NaN
    return std::bit_cast<float>(sign | ((exponent - 15 + 127) << 23) | (mantissa << 13));
}

uint64_t convert_elements(const uint8_t* src, const std::string& from, uint8_t* dst, DType to, size_t n) {
    const size_t in = safetensors_dtype_size(from), out = dtype_size(to);
    if (from == safetensors_dtype(to)) {
        std::memcpy(dst, src, n * out);
        return 0;
    }
    uint64_t overflows = 0;
    for (size_t i = 0; i < n; ++i, src += in, dst += out) {
        switch (to) {
            case DType::fp64:  // every source dtype is exact in fp64
                store<double>(dst, static_cast<double>(narrow_source_to_float(src, from)));
                break;
            case DType::fp32: store<float>(dst, source_to_float(src, from, overflows)); break;
            case DType::bf16: {
                const float f = source_to_float(src, from, overflows);
                const uint16_t h = float_to_bf16(f);
                overflows += std::isfinite(f) && (h & 0x7FFFu) == 0x7F80u;
                store<uint16_t>(dst, h);
                break;
            }
        }
    }
    return overflows;
}

}  // namespace pv
