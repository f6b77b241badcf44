// The tensors of a Hugging Face model directory (or of one safetensors file), found by name and
// read by element range, converted to a storage type on the way in. Host code only.
//
// A Hugging Face model directory holds config.json (formats/config_json.h) and its weights as
//   model.safetensors                              one file, or
//   model.safetensors.index.json                   {"metadata": {"total_size": N, ...},
//   model-00001-of-0000N.safetensors, ...           "weight_map": {"<tensor>": "<file>", ...}}
// sharded, the index naming the file of every tensor (how save_pretrained splits large models).
// Like transformers' from_pretrained we take model.safetensors when it exists, else the index.
// Every file is opened and its header read and checked (formats/safetensors.h) when the directory
// is opened; no tensor data is read until asked for. A sharded directory must be consistent: the
// index a JSON object whose weight_map maps names to files inside the directory, each named
// tensor present in its file, and no file holding a tensor the index does not list (a stale or
// mixed-up shard); anything else is refused, naming the file, the tensor and the fix. A
// directory with only PyTorch pickles (pytorch_model.bin) is refused with the fix (save it as
// safetensors).
//
// Reading: read(name, first, count, to, dst) converts elements [first, first + count) of the
// row-major tensor (element i of a [rows, cols] tensor is (i / cols, i % cols)) from the file's
// dtype (BF16, F16, F32, F64) to `to` (formats/dtype_conversion.h), reading only those bytes, with
// pread, in pieces of at most kReadChunkBytes so that host memory holds one piece at a time
// whatever the tensor's size. It returns how many finite values overflowed the target type.
// bytes_read() counts every byte read from the files: each file's header (8 + N bytes, read on
// opening) and the ranges read since — the figure a rank reports after loading.
#pragma once

#include "formats/safetensors.h"
#include "model/parameters.h"

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace pv {

inline constexpr const char* kSafetensorsFile = "model.safetensors";
inline constexpr const char* kSafetensorsIndexFile = "model.safetensors.index.json";

class HfCheckpoint {
  public:
    // A model directory: model.safetensors, or the index and its shards (above).
    static HfCheckpoint open_dir(const std::string& dir);
    // One safetensors file (a checkpoint's optimizer state, a single exported model file).
    static HfCheckpoint open_file(const std::string& path);

    // The directory or file opened, for messages.
    const std::string& origin() const { return origin_; }
    // The safetensors files, in the order opened (one unless sharded).
    std::vector<std::string> files() const;
    // Every tensor, file by file, each file's in buffer order.
    const std::vector<const SafeTensorInfo*>& tensors() const { return order_; }
    // The tensor called `name`, or null.
    const SafeTensorInfo* find(const std::string& name) const;
    // The file holding tensor `name` (which must exist).
    const std::string& file_of(const std::string& name) const;

    // Converts elements [first, first + count) of tensor `name` (one of is_float_dtype) to `to`,
    // writing count · dtype_size(to) bytes at dst; returns the finite values that became ±Inf.
    // Throws std::runtime_error naming the tensor for an unknown name, a non-float dtype or a
    // range outside the tensor.
    uint64_t read(const std::string& name, uint64_t first, uint64_t count, DType to, void* dst);

    // Copies `bytes` raw bytes from `offset` bytes into tensor `name` (any dtype) to dst: the
    // packed and integer tensors a quantised checkpoint holds. Throws as read() does. const: it
    // changes nothing of the checkpoint (it counts the bytes in bytes_read()), so the checks that
    // take a checkpoint read-only may read a quantised tensor's small fields.
    void read_bytes(const std::string& name, uint64_t offset, uint64_t bytes, void* dst) const;

    // Bytes read from the safetensors files so far: the headers and every read().
    uint64_t bytes_read() const;
    // The headers alone (8 + N per file).
    uint64_t header_bytes() const;

    static constexpr uint64_t kReadChunkBytes = uint64_t{16} << 20;

  private:
    std::string origin_;
    std::vector<std::unique_ptr<SafeTensorsReader>> readers_;
    std::map<std::string, std::pair<size_t, const SafeTensorInfo*>> by_name_;  // reader, entry
    std::vector<const SafeTensorInfo*> order_;
    std::vector<uint8_t> staging_;  // one chunk of source bytes
};

}  // namespace pv
