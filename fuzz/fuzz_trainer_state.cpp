// Fuzz target: a checkpoint's trainer_state.json (trainer/state.h), read as `train --resume` reads
// it, and its "options" object alone through train_options_from_json (trainer/options.h), the
// function every resume passes them to. An accepted options object must round-trip:
// train_options_json of what was read reads back to the same text — an exception or a
// difference there aborts (a finding).
#include "fuzz/fuzz_target.h"
#include "model/checkpoint_files.h"
#include "trainer/options.h"
#include "trainer/state.h"

#include <nlohmann/json.hpp>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    pv::fuzz::begin_input(size);
    // Re-signed: an input that parses and holds a "checksum" gets the right one, so mutations reach
    // the fields behind it; one in 16 keeps its bytes, so the mismatch path is fuzzed too.
    std::string input(reinterpret_cast<const char*>(data), size);
    if (size % 16 != 0) {
        nlohmann::json j = nlohmann::json::parse(input, nullptr, false);
        if (j.is_object() && j.contains("checksum")) {
            j["checksum"] = pv::checksum_hex(pv::trainer_state_checksum(j));
            input = j.dump();
        }
    }
    const std::string path = pv::fuzz::write_scratch(
        "trainer_state.json", reinterpret_cast<const uint8_t*>(input.data()), input.size());
    pv::fuzz::accepts([&] { pv::read_trainer_state(path); });
    // Its "files", as every load of a checkpoint directory reads them first.
    pv::fuzz::accepts([&] { pv::recorded_file_digests(pv::fuzz::scratch_dir().string()); });
    const std::string text(reinterpret_cast<const char*>(data), size);
    pv::TrainOptions o;
    if (!pv::fuzz::accepts([&] { o = pv::train_options_from_json(text); })) return 0;
    const std::string written = pv::train_options_json(o);
    if (pv::train_options_json(pv::train_options_from_json(written)) != written) {
        std::fprintf(stderr, "fuzz finding: the training options do not round-trip:\n%s\n", written.c_str());
        std::abort();
    }
    return 0;
}
