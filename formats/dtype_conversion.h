// Floating-point conversion between the dtypes tensors are stored in (safetensors BF16, F16, F32,
// F64) and the storage types polevault computes in (bf16, fp32, fp64). One implementation serves
// every reader and writer: checkpoints, --init-from, `train export`, `train convert`.
//
// The formats (IEEE 754 binary16/32/64; bfloat16 is the top half of a binary32):
//   BF16  1 sign, 8 exponent (bias 127), 7 mantissa bits   largest finite 0x7F7F = 3.3895e38
//   F16   1 sign, 5 exponent (bias 15), 10 mantissa bits   largest finite 0x7BFF = 65504,
//         subnormals m·2^-24 (m < 1024) when the exponent field is 0
//   F32, F64  the C++ float and double.
// Widening is exact: every BF16 and F16 value (subnormals, ±0, ±Inf included) is an fp32 value,
// and every fp32 value an fp64 one. Narrowing rounds to nearest, ties to even; a finite value
// beyond the target's largest finite one (after rounding) becomes ±Inf and is counted as an
// overflow, so a loader can report that a checkpoint did not fit the run's type. NaN stays NaN
// (its payload is not preserved when narrowing; the quiet bit is set). F64 -> bf16 goes through
// fp32, rounding twice: a double just off a bf16 tie can round onto the tie in fp32 and then to
// even, one bf16 ulp from the direct rounding — harmless for weights (bf16's own error is 2^-9
// relative) and what torch's x.float().bfloat16() does too. Host code only.
#pragma once

#include "model/parameters.h"

#include <cstddef>
#include <cstdint>
#include <string>

namespace pv {

// The safetensors dtype of a storage type: "BF16", "F32", "F64".
const char* safetensors_dtype(DType t);

// The torch dtype name config.json's torch_dtype uses: "bfloat16", "float32", "float64".
const char* torch_dtype_name(DType t);

// Whether parameters can be read from this safetensors dtype: BF16, F16, F32 or F64.
bool is_float_dtype(const std::string& safetensors_dtype);

// Converts n elements of safetensors dtype `from` (one of is_float_dtype) at src to `to` at dst
// (both little-endian, unaligned allowed). Returns how many finite values became ±Inf.
uint64_t convert_elements(const uint8_t* src, const std::string& from, uint8_t* dst, DType to, size_t n);

// The scalar conversions the above is made of (exposed for tests and tools).
uint16_t float_to_bf16(float x);  // round to nearest even; NaN stays NaN
float bf16_to_float(uint16_t h);
float f16_to_float(uint16_t h);  // exact

}  // namespace pv
