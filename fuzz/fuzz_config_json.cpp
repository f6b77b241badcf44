// Fuzz target: a Hugging Face config.json (formats/config_json.h): parse_hf_config on the text, and
// the readers of the same file's other keys (torch_dtype; the token ids, which
// read_generation_config reads from a config.json as transformers falls back to). An accepted
// config must survive the round trip an export makes: written back (hf_config_json), it reads
// again and writes the same text — an exception or a difference there aborts (a finding). Then the
// same bytes as a checkpoint's config.json and generation_config.json, re-signed
// (write_signed_scratch), through the readers a model directory is opened with: the checksum
// verification, read_model_dir_config and the ids checked against a vocabulary.
#include "formats/config_json.h"
#include "fuzz/fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    pv::fuzz::begin_input(size);
    const std::string path = pv::fuzz::write_scratch("config.json", data, size);
    pv::fuzz::accepts([&] { pv::read_hf_torch_dtype(path); });
    pv::fuzz::accepts([&] { pv::read_generation_config(path); });
    {
        pv::fuzz::write_signed_scratch({"config.json", "generation_config.json"}, data, size);
        pv::fuzz::accepts([&] { pv::read_model_dir_config(pv::fuzz::scratch_dir().string()); });
        const std::string generation = (pv::fuzz::scratch_dir() / "generation_config.json").string();
        pv::fuzz::accepts([&] { pv::read_generation_config(generation, 300); });
        std::filesystem::remove(generation);
        std::filesystem::remove(pv::fuzz::scratch_dir() / "trainer_state.json");
    }
    pv::LlamaConfig c;
    const std::string text(reinterpret_cast<const char*>(data), size);
    if (!pv::fuzz::accepts([&] { c = pv::parse_hf_config(text, "fuzz/config.json"); })) return 0;
    const std::string written = pv::hf_config_json(c);
    if (pv::hf_config_json(pv::parse_hf_config(written, "fuzz/written")) != written) {
        std::fprintf(stderr, "fuzz finding: config.json does not round-trip:\n%s\n", written.c_str());
        std::abort();
    }
    return 0;
}
