// The storage type at run time (DType, model/parameters.h) and in code (the element type T of
// Llama<T>, the kernels, the optimizer): bf16 is __nv_bfloat16, fp32 float, fp64 double. The one
// place either becomes the other: dtype_of<T>() one way, with_dtype the other. A name becomes a
// DType through parse_dtype (model/parameters.h), whose error names the value and the choices.
#pragma once

#include "model/parameters.h"
#include "platform/platform.h"

#include <string>
#include <type_traits>

namespace pv {

// A type as a value, for generic lambdas: decltype(tag)::type is T.
template <class T>
struct TypeTag {
    using type = T;
};

// The DType of a compute/storage type.
template <class T>
constexpr DType dtype_of() {
    if constexpr (std::is_same_v<T, double>)
        return DType::fp64;
    else if constexpr (std::is_same_v<T, float>)
        return DType::fp32;
    else
        return DType::bf16;
}

// Calls f(TypeTag<T>{}) with T the element type of `dtype` and returns what it returns (the same
// type for every T):
//   with_dtype(dtype, [&](auto tag) { using T = typename decltype(tag)::type; return run<T>(...); });
template <class F>
auto with_dtype(DType dtype, F&& f) {
    switch (dtype) {
        case DType::fp32: return f(TypeTag<float>{});
        case DType::fp64: return f(TypeTag<double>{});
        case DType::bf16: break;
    }
    return f(TypeTag<__nv_bfloat16>{});
}

// The same for a name (parse_dtype: bf16, fp32 or fp64; any other throws std::invalid_argument).
template <class F>
auto with_dtype(const std::string& name, F&& f) {
    return with_dtype(parse_dtype(name), std::forward<F>(f));
}

}  // namespace pv
