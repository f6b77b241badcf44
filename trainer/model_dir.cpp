// Model directories for sampling and evaluation (see model_dir.h).
#include "trainer/model_dir.h"

#include "trainer/options.h"

#include "formats/config_json.h"
#include "io/input_file.h"
#include "model/checkpoint.h"
#include "model/checkpoint_files.h"
#include "trainer/state.h"

#include <filesystem>
#include <stdexcept>

namespace pv {

namespace {

namespace fs = std::filesystem;

std::string dtype_of_torch(const std::string& config_path) {
    const std::string name = read_hf_torch_dtype(config_path);
    if (name.empty() || name == "float32" || name == "float16") return "fp32";
    if (name == "bfloat16") return "bf16";
    if (name == "float64") return "fp64";
    throw std::runtime_error("'" + config_path + "': torch_dtype is \"" + name +
                             "\", which polevault does not load; choose a storage type with --dtype bf16|fp32|fp64");
}

}  // namespace

ModelDir open_model_dir(const std::string& given) {
    ModelDir m;
    if (!fs::is_directory(given)) throw std::runtime_error("'" + given + "' is not a directory");
    if (fs::is_regular_file(fs::path(given) / kTrainerStateFile)) {
        m.path = given, m.checkpoint = true;
    } else if (auto latest = latest_checkpoint(given, kTrainerStateFile)) {
        m.path = *latest, m.checkpoint = true;
    } else if (fs::is_regular_file(fs::path(given) / "config.json")) {
        m.path = given;
    } else {
        throw std::runtime_error("'" + given + "' is neither a polevault checkpoint (a step_N directory with " +
                                 kTrainerStateFile +
                                 ", or an output directory holding one) nor a Hugging Face model directory "
                                 "(config.json with safetensors weights)");
    }
    // A checkpoint's small files are verified before any number in them sizes anything; its
    // weights are, before they are read (trainer/load.h).
    if (m.checkpoint) verify_model_dir_metadata(m.path);
    const std::string config_path = (fs::path(m.path) / "config.json").string();
    m.config = read_hf_config(config_path);
    if (m.checkpoint) {
        const TrainerState state = read_trainer_state((fs::path(m.path) / kTrainerStateFile).string());
        m.step = state.step, m.dtype = state.dtype, m.seq_len = state.options.seq_len;
        m.document_mask = state.options.document_mask;
        m.validation_windows = state.validation_windows;
        m.validation_micro_batch = state.validation_micro_batch;
        m.seed = state.seed;
        if (state.options.lora_rank > 0) {
            m.lora = lora_config(state.options);
            m.nf4 = state.options.quantize == "nf4", m.double_quant = state.options.double_quant;
            m.base_dir = state.options.init_from;
            if (!m.base_dir.empty() && model_files_fingerprint(m.base_dir) != state.base_fingerprint)
                throw std::runtime_error("'" + m.path + "' holds LoRA adapters trained on the base model " +
                                         m.base_dir +
                                         ", whose files have changed since (their fingerprint differs): the adapters "
                                         "belong to the original base; restore it");
        }
    } else {
        m.dtype = dtype_of_torch(config_path);
    }
    if (optional_input_file((fs::path(m.path) / "tokenizer.json").string(), "tokenizer.json"))
        m.tokenizer = (fs::path(m.path) / "tokenizer.json").string();
    const std::string generation_path = (fs::path(m.path) / "generation_config.json").string();
    const bool generation = optional_input_file(generation_path, "generation_config.json");
    const GenerationConfig ids = read_generation_config(generation ? generation_path : config_path, m.config.vocab_size);
    m.eos_ids = ids.eos_token_ids;
    m.bos_id = ids.bos_token_id;
    return m;
}

}  // namespace pv
