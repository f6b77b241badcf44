// Internal to host/nccl.cpp: NCCL's element types and the local reduction of the host NCCL.
//
// Every reduction combines the contributions of ranks 0..N-1 in rank order, element by element:
//
//     out[i] = ((x0[i] ⊕ x1[i]) ⊕ x2[i]) ⊕ ... ⊕ x{N-1}[i]
//
// and exactly one rank computes each output element (host/nccl.cpp), so every rank receives the
// same bits whatever MPI does underneath. Per element type:
//
// - fp64, fp32: in the element type. ncclAvg is NCCL's: each input is first multiplied by 1/N
//   (computed in the element type), then the products are summed: Σ (x_j · (1/N)).
// - bf16, fp16: converted to float (exactly), combined in float in rank order, and rounded to the
//   element type once, to nearest even. Real NCCL rounds after every step of its ring, so its bf16
//   sums can differ from ours in the last bit; ours are the more accurate, and identical on every
//   rank, which is all the product relies on. Avg: Σ (float(x_j) · (1/N in float)), rounded once.
// - integers: sum and product wrap around (computed in the unsigned type: no undefined behaviour);
//   ncclAvg sums (wrapping) and then divides by N (truncating, as C++ and NCCL do).
// - max/min on floating types are fmax/fmin (NCCL's device code uses fmaxf/fminf): a NaN input
//   is ignored unless every input is NaN.
//
// x86-64 without -mfma has no fused multiply-add, so `x * scale + acc` is two roundings here,
// as the formula says.
#pragma once

#include <nccl.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace pv::host::nccl {

// Bytes per element, or 0 for a type the host NCCL does not support (fp8, out-of-range values).
inline size_t element_size(ncclDataType_t type) {
    switch (type) {
        case ncclInt8:
        case ncclUint8: return 1;
        case ncclFloat16:
        case ncclBfloat16: return 2;
        case ncclInt32:
        case ncclUint32:
        case ncclFloat32: return 4;
        case ncclInt64:
        case ncclUint64:
        case ncclFloat64: return 8;
        default: return 0;
    }
}

inline const char* type_name(ncclDataType_t type) {
    switch (type) {
        case ncclInt8: return "ncclInt8";
        case ncclUint8: return "ncclUint8";
        case ncclInt32: return "ncclInt32";
        case ncclUint32: return "ncclUint32";
        case ncclInt64: return "ncclInt64";
        case ncclUint64: return "ncclUint64";
        case ncclFloat16: return "ncclFloat16";
        case ncclFloat32: return "ncclFloat32";
        case ncclFloat64: return "ncclFloat64";
        case ncclBfloat16: return "ncclBfloat16";
        case ncclFloat8e4m3: return "ncclFloat8e4m3";
        case ncclFloat8e5m2: return "ncclFloat8e5m2";
        default: return "an unknown ncclDataType_t";
    }
}

inline bool op_supported(ncclRedOp_t op) {
    return op == ncclSum || op == ncclProd || op == ncclMax || op == ncclMin || op == ncclAvg;
}

namespace detail {

// Element i of input j, as T (inputs are unaligned-safe: read through memcpy).
template <class T>
T load(const void* base, size_t i) {
    T x;
    std::memcpy(&x, static_cast<const unsigned char*>(base) + i * sizeof(T), sizeof(T));
    return x;
}
template <class T>
void store(void* base, size_t i, T x) {
    std::memcpy(static_cast<unsigned char*>(base) + i * sizeof(T), &x, sizeof(T));
}

// Floating types. Acc is the type the combination runs in (T itself for fp32/fp64, float for
// the 16-bit types); to_acc/from_acc convert (exactly / rounding to nearest even).
template <class T, class Acc, Acc (*to_acc)(T), T (*from_acc)(Acc)>
void reduce_floating(const void* const* inputs, int n, size_t count, ncclRedOp_t op, void* out) {
    const Acc scale = Acc(1) / Acc(n);
    for (size_t i = 0; i < count; ++i) {
        Acc acc = to_acc(load<T>(inputs[0], i));
        if (op == ncclAvg) acc = acc * scale;
        for (int j = 1; j < n; ++j) {
            const Acc x = to_acc(load<T>(inputs[j], i));
            switch (op) {
                case ncclSum: acc = acc + x; break;
                case ncclAvg: acc = acc + x * scale; break;
                case ncclProd: acc = acc * x; break;
                case ncclMax: acc = std::fmax(acc, x); break;
                case ncclMin: acc = std::fmin(acc, x); break;
                default: break;
            }
        }
        store<T>(out, i, from_acc(acc));  // after every load of element i: `out` may be an input
    }
}

template <class T>
T identity(T x) {
    return x;
}
inline float bf16_to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
inline __nv_bfloat16 float_to_bf16(float x) { return __float2bfloat16_rn(x); }
inline float half_to_float(__half x) { return __half2float(x); }
inline __half float_to_half(float x) { return __float2half_rn(x); }

template <class T>
void reduce_integer(const void* const* inputs, int n, size_t count, ncclRedOp_t op, void* out) {
    using U = std::make_unsigned_t<T>;
    for (size_t i = 0; i < count; ++i) {
        T acc = load<T>(inputs[0], i);
        for (int j = 1; j < n; ++j) {
            const T x = load<T>(inputs[j], i);
            switch (op) {
                case ncclSum:
                case ncclAvg: acc = T(U(U(acc) + U(x))); break;
                case ncclProd: acc = T(U(U(acc) * U(x))); break;
                case ncclMax: acc = x > acc ? x : acc; break;
                case ncclMin: acc = x < acc ? x : acc; break;
                default: break;
            }
        }
        if (op == ncclAvg) acc = T(acc / T(n));
        store<T>(out, i, acc);
    }
}

}  // namespace detail

// out[i] = inputs[0][i] ⊕ inputs[1][i] ⊕ ... in that order, for i < count. `out` may be one of
// the inputs (the in-place forms); it must not partially overlap any. Type and op must be
// supported (element_size(type) != 0, op_supported(op)).
inline void reduce_in_rank_order(const void* const* inputs, int n, size_t count, ncclDataType_t type, ncclRedOp_t op,
                                 void* out) {
    using namespace detail;
    switch (type) {
        case ncclFloat64:
            return reduce_floating<double, double, identity<double>, identity<double>>(inputs, n, count, op, out);
        case ncclFloat32:
            return reduce_floating<float, float, identity<float>, identity<float>>(inputs, n, count, op, out);
        case ncclBfloat16:
            return reduce_floating<__nv_bfloat16, float, bf16_to_float, float_to_bf16>(inputs, n, count, op, out);
        case ncclFloat16:
            return reduce_floating<__half, float, half_to_float, float_to_half>(inputs, n, count, op, out);
        case ncclInt8: return reduce_integer<int8_t>(inputs, n, count, op, out);
        case ncclUint8: return reduce_integer<uint8_t>(inputs, n, count, op, out);
        case ncclInt32: return reduce_integer<int32_t>(inputs, n, count, op, out);
        case ncclUint32: return reduce_integer<uint32_t>(inputs, n, count, op, out);
        case ncclInt64: return reduce_integer<int64_t>(inputs, n, count, op, out);
        case ncclUint64: return reduce_integer<uint64_t>(inputs, n, count, op, out);
        default: return;
    }
}

}  // namespace pv::host::nccl
