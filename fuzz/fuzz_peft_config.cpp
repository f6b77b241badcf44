// Fuzz target: PEFT's adapter_config.json (formats/peft_config.h), parsed from its text. An accepted
// file must also survive the round trip an export makes: its LoRA configuration written back
// (peft_adapter_config_json) reads again, and writing that gives the same text — an exception or
// a difference there aborts (a finding).
#include "formats/peft_config.h"
#include "fuzz/fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    pv::fuzz::begin_input(size);
    const std::string text(reinterpret_cast<const char*>(data), size);
    pv::PeftAdapterConfig c;
    if (!pv::fuzz::accepts([&] { c = pv::parse_peft_adapter_config(text, "fuzz/adapter_config.json"); })) return 0;
    const std::string written = pv::peft_adapter_config_json(c.lora, c.base_model_name_or_path);
    const pv::PeftAdapterConfig again = pv::parse_peft_adapter_config(written, "fuzz/written");
    if (pv::peft_adapter_config_json(again.lora, again.base_model_name_or_path) != written) {
        std::fprintf(stderr, "fuzz finding: adapter_config.json does not round-trip:\n%s\n", written.c_str());
        std::abort();
    }
    return 0;
}
