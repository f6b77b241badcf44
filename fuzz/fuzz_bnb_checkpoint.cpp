// Fuzz target: bitsandbytes 4-bit tensors in a model.safetensors (formats/bnb_checkpoint.h). For
// every quantised linear in the file (a tensor named W.quant_state.bitsandbytes__nf4), its shape
// is taken from its own quant_state when that holds two positive dimensions (the loader takes it
// from config.json: the check compares the two), the linear is checked as a run with and one
// without double quantisation would check it, and an accepted one has its fields read into a
// slot as the loader reads them, in small pieces.
#include "formats/bnb_checkpoint.h"
#include "fuzz/fuzz_target.h"

#include <nlohmann/json.hpp>

#include <cstring>
#include <string>
#include <vector>

namespace {

// [rows, cols] of the quant_state's "shape", or false. Bounded so that rows · cols cannot
// overflow: the loader's come from a validated config.json.
bool state_shape(pv::HfCheckpoint& source, const pv::SafeTensorInfo& state, long long& rows, long long& cols) {
    if (state.bytes > (1u << 16)) return false;
    std::string text(state.bytes, '\0');
    source.read_bytes(state.name, 0, state.bytes, text.data());
    const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    if (!j.is_object() || !j.contains("shape")) return false;
    const nlohmann::json& s = j["shape"];
    if (!s.is_array() || s.size() != 2 || !s[0].is_number_integer() || !s[1].is_number_integer()) return false;
    rows = s[0].get<long long>(), cols = s[1].get<long long>();
    return rows > 0 && cols > 0 && rows < (1ll << 30) && cols < (1ll << 30);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    pv::fuzz::begin_input(size);
    const std::string path = pv::fuzz::write_scratch("model.safetensors", data, size);
    pv::fuzz::accepts([&] {
        pv::HfCheckpoint source = pv::HfCheckpoint::open_file(path);
        const std::string suffix = pv::kBnbQuantStateSuffix;
        for (const pv::SafeTensorInfo* t : source.tensors()) {
            if (t->name.size() <= suffix.size() || !t->name.ends_with(suffix)) continue;
            const std::string weight = t->name.substr(0, t->name.size() - suffix.size());
            if (!pv::is_bnb_quantized(source, weight)) std::abort();
            long long rows = 0, cols = 0;
            if (!state_shape(source, *t, rows, cols)) rows = cols = 64;
            for (const bool double_quant : {false, true}) {
                pv::BnbTensor b;
                if (!pv::fuzz::accepts([&] { b = pv::check_bnb_tensor(source, weight, rows, cols, double_quant); }))
                    continue;
                // One part's fields laid out one after another, as a slot holds them.
                pv::Nf4PartFields f;
                f.n = rows * cols;
                const long long blocks = (f.n + 63) / 64;
                f.codes = 0;
                f.absmax = (f.n + 1) / 2;
                f.nested = f.absmax + (double_quant ? blocks : 4 * blocks);
                f.offset = f.nested + (double_quant ? 4 * ((blocks + 255) / 256) : 0);
                f.end = f.offset + (double_quant ? 4 : 0);
                std::vector<uint8_t> slot(size_t(f.end), 0);
                pv::read_bnb_fields(source, b, f, 0, f.end, 4096, [&](long long at, const uint8_t* p, size_t n) {
                    if (at < 0 || at + (long long)n > f.end) std::abort();
                    std::memcpy(slot.data() + at, p, n);
                });
            }
        }
    });
    return 0;
}
