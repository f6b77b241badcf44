// Fuzz target: safetensors files (formats/safetensors.h), as a model directory's model.safetensors.
// The input is the whole file: the header is read and checked by SafeTensorsReader, then every
// tensor's bytes are read through it, and every float tensor is converted to fp32 through
// HfCheckpoint (the path weights take into a model): as a checkpoint's file, re-signed
// (write_signed_scratch) so that the checksum verification every checkpoint load starts with lets
// it through to the directory reader.
#include "formats/dtype_conversion.h"
#include "formats/hf_checkpoint.h"
#include "formats/safetensors.h"
#include "fuzz/fuzz_target.h"
#include "model/checkpoint_files.h"

#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    pv::fuzz::begin_input(size);
    const std::string path = pv::fuzz::write_scratch("model.safetensors", data, size);
    pv::fuzz::accepts([&] {
        pv::SafeTensorsReader reader(path);
        std::vector<uint8_t> bytes;
        for (const pv::SafeTensorInfo& t : reader.tensors()) {
            bytes.resize(t.bytes);
            reader.read(t, 0, t.bytes, bytes.data());
        }
    });
    pv::fuzz::write_signed_scratch({"model.safetensors"}, data, size);
    pv::fuzz::accepts([&] {
        const std::string dir = pv::fuzz::scratch_dir().string();
        pv::verify_model_dir_files(dir);
        pv::HfCheckpoint checkpoint = pv::HfCheckpoint::open_dir(dir);
        std::vector<float> values;
        for (const pv::SafeTensorInfo* t : checkpoint.tensors()) {
            if (!pv::is_float_dtype(t->dtype)) continue;
            values.resize(t->numel());
            checkpoint.read(t->name, 0, t->numel(), pv::DType::fp32, values.data());
        }
    });
    return 0;
}
