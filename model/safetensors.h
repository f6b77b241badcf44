// safetensors: the Hugging Face tensor file format, read and written on the host.
//
// Layout (the format's specification, github.com/huggingface/safetensors):
//
//   offset  size  field
//   0       8     N       u64 little-endian: the length of the JSON header in bytes
//   8       N     header  UTF-8 JSON object:
//                           {"__metadata__": {string: string},            (optional)
//                            "<name>": {"dtype": "F32", "shape": [2, 3],
//                                       "data_offsets": [begin, end]}, ...}
//   8 + N   ...   buffer  the tensors' bytes, row-major, little-endian
//
// data_offsets are relative to the start of the buffer. The tensors tile the buffer exactly:
// contiguous, non-overlapping, no gaps, nothing after the last one; each spans
// product(shape) · dtype size bytes (a scalar has shape [] and one element). The header is padded
// with trailing spaces so that the buffer starts 8-byte aligned (8 + N is a multiple of 8).
//
// write_safetensors stores the tensors in the order given, the header as compact JSON (keys
// sorted, as nlohmann::json orders them), writes `path.tmp`, fsyncs it and renames it over `path`,
// so a crash leaves either the old file or the complete new one. read_safetensors checks
// everything a truncated, corrupt or foreign file could get wrong and throws std::runtime_error
// naming the file, the problem and the fix; its tensors come back in buffer order, which for our
// own files is the written order. Tensor bytes are kept as they are on disk (little-endian, the
// host's order on every platform we run on); interpreting them is the caller's job.
// Host code only; the JSON library stays in safetensors.cpp so that this header compiles anywhere.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace pv {

struct SafeTensor {
    std::string name;
    std::string dtype;           // "F64", "F32", "BF16", "F16", "I64", "I32", "U8", ...
    std::vector<int64_t> shape;  // [] for a scalar
    std::vector<uint8_t> data;   // product(shape) · safetensors_dtype_size(dtype) bytes
};

// Bytes per element of a safetensors dtype: BOOL, U8, I8, F8_E5M2, F8_E4M3, I16, U16, F16, BF16,
// I32, U32, F32, I64, U64, F64. Throws std::invalid_argument for anything else.
size_t safetensors_dtype_size(const std::string& dtype);

// Throws std::invalid_argument (duplicate or empty name, name "__metadata__", unknown dtype,
// negative dimension, data size not product(shape) · dtype size) or std::runtime_error (I/O).
void write_safetensors(const std::string& path, const std::vector<SafeTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

struct SafeTensorsFile {
    std::string path;  // where it was read from, for error messages
    std::map<std::string, std::string> metadata;
    std::vector<SafeTensor> tensors;  // in buffer order

    // The tensor called `name`; throws std::runtime_error naming the tensor and the file.
    const SafeTensor& at(const std::string& name) const;
};

SafeTensorsFile read_safetensors(const std::string& path);

}  // namespace pv
