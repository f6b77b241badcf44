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
// so a crash leaves either the old file or the complete new one. write_safetensors_streamed does
// the same from the tensors' names, dtypes and shapes alone, asking for each tensor's bytes in
// turn, so a writer never needs more than one tensor in memory (`train convert`, `train export`,
// checkpoints).
//
// Reading. SafeTensorsReader opens a file and reads only its header (8 + N bytes), checking
// everything a truncated, corrupt or foreign file could get wrong (the tiling above, against the
// file's size) and throwing std::runtime_error naming the file, the problem and the fix; the
// tensors' bytes are then read on demand, any byte range of any tensor, with pread(2) — so a rank
// that needs a slice of a tensor reads only that slice, and a reader never holds a whole file.
// It counts the bytes it has read (the header included), which the loaders report.
// read_safetensors reads a whole file into memory through it (tests, small files); its tensors come
// back in buffer order, which for our own files is the written order. Tensor bytes are kept as
// they are on disk (little-endian, the host's order on every platform we run on); interpreting
// them is the caller's job (formats/dtype_conversion.h).
// Host code only; the JSON library stays in safetensors.cpp so that this header compiles anywhere.
#pragma once

#include "io/durable_file.h"

#include <cstddef>
#include <cstdint>
#include <functional>
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

// A tensor as the header describes it, without its bytes.
struct SafeTensorInfo {
    std::string name;
    std::string dtype;
    std::vector<int64_t> shape;
    uint64_t offset = 0;  // of its first byte in the file: 8 + N + data_offsets[0]
    uint64_t bytes = 0;   // data_offsets[1] - data_offsets[0]
    uint64_t numel() const;
};

// Writes a file of tensors described by `tensors` (name, dtype, shape; offset and bytes are
// ignored), calling write_tensor(i, sink) for each in order, which must pass exactly
// product(shape) · dtype size bytes to the sink. Throws as write_safetensors does, and
// std::logic_error when a callback writes another number of bytes (nothing is left at `path`).
void write_safetensors_streamed(const std::string& path, const std::vector<SafeTensorInfo>& tensors,
                                const std::map<std::string, std::string>& metadata,
                                const std::function<void(size_t index, const ByteSink& sink)>& write_tensor);

// A safetensors file opened for ranged reads (see the top of this file). Not copyable; movable.
class SafeTensorsReader {
  public:
    explicit SafeTensorsReader(const std::string& path);  // reads and checks the header
    ~SafeTensorsReader();
    SafeTensorsReader(SafeTensorsReader&& other) noexcept;
    SafeTensorsReader& operator=(SafeTensorsReader&& other) noexcept;
    SafeTensorsReader(const SafeTensorsReader&) = delete;
    SafeTensorsReader& operator=(const SafeTensorsReader&) = delete;

    const std::string& path() const { return path_; }
    const std::map<std::string, std::string>& metadata() const { return metadata_; }
    const std::vector<SafeTensorInfo>& tensors() const { return tensors_; }  // in buffer order
    const SafeTensorInfo* find(const std::string& name) const;               // null when absent
    uint64_t header_bytes() const { return header_bytes_; }                  // 8 + N
    // Reads `bytes` bytes starting `offset` bytes into tensor t's data (t from tensors()) into dst.
    // Throws std::out_of_range for a range outside the tensor, std::runtime_error naming the file
    // on an I/O error or a file that shrank since it was opened.
    void read(const SafeTensorInfo& t, uint64_t offset, uint64_t bytes, void* dst);
    // Bytes read from the file so far: the header and every read().
    uint64_t bytes_read() const { return bytes_read_; }

  private:
    void parse_header(const std::string& text, uint64_t file_size);

    std::string path_;
    int fd_ = -1;
    std::map<std::string, std::string> metadata_;
    std::vector<SafeTensorInfo> tensors_;
    std::map<std::string, size_t> by_name_;
    uint64_t header_bytes_ = 0;
    uint64_t bytes_read_ = 0;
};

}  // namespace pv
