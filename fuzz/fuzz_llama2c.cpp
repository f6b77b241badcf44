// Fuzz target: llama2.c checkpoints (formats/llama2c.h): the header checked against the file, and an
// accepted file converted to a Hugging Face directory as `train convert --from llama2c` does.
#include "formats/llama2c.h"
#include "fuzz/fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    pv::fuzz::begin_input(size);
    const std::string path = pv::fuzz::write_scratch("model.bin", data, size);
    if (!pv::fuzz::accepts([&] { pv::read_llama2c_header(path); })) return 0;
    const std::filesystem::path out = pv::fuzz::scratch_dir() / "converted";
    std::filesystem::remove_all(out);
    pv::fuzz::accepts([&] { pv::convert_llama2c(path, out.string()); });
    return 0;
}
