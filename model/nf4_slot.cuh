// A whole tensor to and from its NF4 slot (model/nf4_layout.h), part by part: what the model runs
// before a GEMM with a quantised weight, and what initialisation and loading run once per tensor.
#pragma once

#include "kernels/nf4.cuh"
#include "model/nf4_layout.h"
#include "platform/device_memory.h"

#include <algorithm>
#include <vector>

namespace pv {

// The fields of one part in a slot at `slot`.
inline Nf4Tensor nf4_part(void* slot, const Nf4PartFields& f, bool double_quant) {
    uint8_t* b = static_cast<uint8_t*>(slot);
    Nf4Tensor t;
    t.codes = b + f.codes;
    t.n = f.n;
    t.double_quant = double_quant;
    t.blocks = Nf4BlockMap{f.block_first, f.block_run, f.block_stride};
    if (double_quant) {
        t.absmax_codes = b + f.absmax;
        t.nested_absmax = reinterpret_cast<float*>(b + f.nested);
        t.offset = reinterpret_cast<float*>(b + f.offset);
    } else {
        t.absmax = reinterpret_cast<float*>(b + f.absmax);
    }
    return t;
}

inline Nf4ConstTensor nf4_part(const void* slot, const Nf4PartFields& f, bool double_quant) {
    return Nf4ConstTensor(nf4_part(const_cast<void*>(slot), f, double_quant));
}

// values [rows][cols] (the whole fused tensor, device) -> its slot (nf4_slot_bytes bytes, device;
// bytes between fields are zeroed). Allocates its scratch (a load-time step, never in a step).
template <class T>
void nf4_quantize_slot(const TensorSpec& spec, bool double_quant, const T* values, void* slot, cudaStream_t stream) {
    const auto fields = nf4_part_fields(spec, double_quant);
    CUDA_CHECK(cudaMemsetAsync(slot, 0, size_t(nf4_slot_bytes(spec, double_quant)), stream));
    size_t scratch_bytes = 0;
    for (const Nf4PartFields& f : fields)
        scratch_bytes = std::max(scratch_bytes, nf4_quantize_scratch_bytes(f.n, double_quant));
    DeviceBuffer<uint8_t> scratch(std::max<size_t>(scratch_bytes, 1), MemoryCategory::workspace);
    for (const Nf4PartFields& f : fields)
        nf4_quantize(values + f.row_begin * spec.cols, f.n, nf4_part(slot, f, double_quant), scratch.get(), stream);
    CUDA_CHECK(cudaStreamSynchronize(stream));  // the scratch is freed on return
}

// `whole_values` [rows][cols] of spec.whole_tensor() (device) -> the slot of `spec` (device), which
// may be a tensor-parallel slice: the whole tensor quantised on the device (each module's
// statistics span the module), then the slice's fields cut out on the host (nf4_slice_fields).
// A load-time step: allocates, and returns with the slot written.
template <class T>
void nf4_quantize_slice_slot(const TensorSpec& spec, bool double_quant, const T* whole_values, void* slot,
                             cudaStream_t stream) {
    if (spec.slice.whole()) return nf4_quantize_slot(spec, double_quant, whole_values, slot, stream);
    const TensorSpec whole = spec.whole_tensor();
    const size_t whole_bytes = size_t(nf4_slot_bytes(whole, double_quant)), bytes = size_t(nf4_slot_bytes(spec, double_quant));
    DeviceBuffer<uint8_t> whole_slot(whole_bytes, MemoryCategory::workspace);
    nf4_quantize_slot(whole, double_quant, whole_values, whole_slot.get(), stream);
    std::vector<uint8_t> host_whole(whole_bytes), host_slice(bytes, 0);
    CUDA_CHECK(cudaMemcpy(host_whole.data(), whole_slot.get(), whole_bytes, cudaMemcpyDeviceToHost));
    nf4_slice_fields(whole, spec, double_quant, host_whole.data(), host_slice.data());
    CUDA_CHECK(cudaMemcpy(slot, host_slice.data(), bytes, cudaMemcpyHostToDevice));
}

// The slot -> the whole tensor's dequantised values [rows][cols] (device).
template <class T>
void nf4_dequantize_slot(const std::vector<Nf4PartFields>& fields, bool double_quant, long long cols, const void* slot,
                         T* values, cudaStream_t stream) {
    for (const Nf4PartFields& f : fields)
        nf4_dequantize(nf4_part(slot, f, double_quant), values + f.row_begin * cols, f.n, stream);
}

}  // namespace pv
