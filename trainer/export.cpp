// Model directories for Hugging Face and `train export` (trainer/export.h).
#include "trainer/export.h"

#include "formats/config_json.h"
#include "formats/dtype_conversion.h"
#include "formats/hf_checkpoint.h"
#include "formats/peft_config.h"
#include "io/durable_file.h"
#include "io/progress.h"
#include "model/checkpoint.h"
#include "model/checkpoint_files.h"
#include "trainer/model_dir.h"

#include <cstdio>
#include <filesystem>
#include <optional>
#include <stdexcept>

namespace pv {
namespace {

namespace fs = std::filesystem;

// The storage type whose safetensors dtype is `stored` ("BF16", "F32", "F64"), if there is one.
std::optional<DType> dtype_of_safetensors(const std::string& stored) {
    for (DType t : {DType::bf16, DType::fp32, DType::fp64})
        if (stored == safetensors_dtype(t)) return t;
    return std::nullopt;
}

// The adapters as PEFT's directory: the checkpoint's adapter_model.safetensors (PEFT's keys
// already) converted to --dtype, and adapter_config.json.
void export_peft(const ExportOptions& o, const ModelDir& m) {
    HfCheckpoint source = HfCheckpoint::open_file(m.path + "/adapter_model.safetensors");
    const DType dtype = parse_dtype(o.dtype.empty() ? m.dtype : o.dtype);
    std::vector<SafeTensorInfo> tensors;
    for (const SafeTensorInfo* t : source.tensors()) {
        SafeTensorInfo out = *t;
        out.dtype = safetensors_dtype(dtype);
        tensors.push_back(out);
    }
    const std::string tmp = begin_new_model_dir(o.peft_out);
    uint64_t overflows = 0;
    try {
        const size_t element = dtype_size(dtype);
        std::vector<uint8_t> piece;
        write_safetensors_streamed(tmp + "/adapter_model.safetensors", tensors, {{"format", "pt"}},
                                   [&](size_t i, const ByteSink& sink) {
                                       const uint64_t numel = source.find(tensors[i].name)->numel();
                                       piece.resize(size_t(numel) * element);
                                       overflows += source.read(tensors[i].name, 0, numel, dtype, piece.data());
                                       sink(piece.data(), piece.size());
                                   });
        write_peft_adapter_config(tmp + "/adapter_config.json", m.lora, m.base_dir);
    } catch (...) {
        std::error_code ignore;
        fs::remove_all(tmp, ignore);
        throw;
    }
    commit_checkpoint_dir(o.peft_out);
    std::printf("exported %s's LoRA adapters (rank %d, %zu tensors, %s) -> %s as a PEFT adapter of %s\n",
                m.path.c_str(), m.lora.rank, tensors.size(), dtype_name(dtype), o.peft_out.c_str(),
                m.base_dir.empty() ? "a base initialised from the seed" : m.base_dir.c_str());
}

}  // namespace

void write_model_files(const std::string& dir, const ModelFiles& files) {
    const auto copy = [&](const fs::path& from) {
        // Through write_file_atomically, so a checkpoint's WriteRecorder checksums the copy too.
        copy_file_atomically(from.string(), (fs::path(dir) / from.filename()).string(), "model file");
    };
    const fs::path tokenizer_dir(files.tokenizer_dir);
    if (!files.tokenizer_dir.empty() && fs::is_regular_file(tokenizer_dir / "tokenizer.json")) {
        // chat_template.jinja: where transformers 5 saves the chat template (`sample --chat` reads it).
        for (const char* f :
             {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json"})
            if (fs::is_regular_file(tokenizer_dir / f)) copy(tokenizer_dir / f);
    } else if (files.tokenizer) {
        files.tokenizer->save(dir + "/tokenizer.json");
    }
    const fs::path generation = fs::path(files.model_dir) / "generation_config.json";
    if (!files.model_dir.empty() && fs::is_regular_file(generation)) {
        copy(generation);
    } else if (files.tokenizer && (files.tokenizer->bos_id() >= 0 || files.tokenizer->eos_id() >= 0)) {
        GenerationConfig g;
        g.bos_token_id = files.tokenizer->bos_id();
        if (files.tokenizer->eos_id() >= 0) g.eos_token_ids.push_back(files.tokenizer->eos_id());
        write_generation_config(dir + "/generation_config.json", g);
    } else if (!files.tokenizer && files.data_eos >= 0) {
        GenerationConfig g;
        g.eos_token_ids.push_back(files.data_eos);
        write_generation_config(dir + "/generation_config.json", g);
    }
}

void export_model(const ExportOptions& o) {
    const ModelDir model = open_model_dir(o.checkpoint);  // a checkpoint (resolved) or a model directory
    // Loading (its own progress) and the files written, which report their bytes here.
    const Progress progress("export of " + model.path, 0);
    const std::string& src = model.path;
    if (!model.lora.enabled() && !(o.peft_out.empty() && o.merged_out.empty()))
        throw std::invalid_argument("export: '" + src +
                                    "' is not a LoRA checkpoint (it has no adapters): --peft and "
                                    "--merged are for LoRA runs; use --out");
    if (model.lora.enabled() && !o.out_dir.empty())
        throw std::invalid_argument("export: '" + src +
                                    "' is a LoRA checkpoint (adapters on a base it references): export "
                                    "the adapters with --peft DIR, or the merged model with --merged DIR");
    if (!o.merged_out.empty()) return export_merged(o, model);
    if (!o.peft_out.empty()) return export_peft(o, model);
    const LlamaConfig& config = model.config;
    verify_model_dir_files(src);  // a checkpoint's weights, before any header in them is read
    HfCheckpoint source = HfCheckpoint::open_dir(src);
    std::vector<GroupLayout> layouts;
    for (const UnitSpec& unit : model_units(config))
        layouts.push_back(layout_group(GroupKind::trainable, DType::fp32, unit.tensors, 1));
    const std::vector<std::string> skipped = check_group_tensors(source, layouts, ExtraTensors::hugging_face);

    // The output dtype: --dtype, else the one every weight is stored in.
    std::optional<DType> dtype = o.dtype.empty() ? std::nullopt : std::optional(parse_dtype(o.dtype));
    if (!dtype) {
        std::string stored;
        for (const SafeTensorInfo& t : group_tensor_infos(layouts, DType::fp32)) {
            const std::string& d = source.find(t.name)->dtype;
            if (!stored.empty() && d != stored)
                throw std::runtime_error("export: '" + src + "' stores its weights in several dtypes (" + stored +
                                         ", " + d + "): pass --dtype bf16, fp32 or fp64");
            stored = d;
        }
        dtype = dtype_of_safetensors(stored);
        if (!dtype)
            throw std::runtime_error("export: '" + src + "' stores its weights as " + stored +
                                     ", which polevault does not write: pass --dtype bf16, fp32 or fp64");
    }

    const std::vector<SafeTensorInfo> tensors = group_tensor_infos(layouts, *dtype);
    const std::string tmp = begin_new_model_dir(o.out_dir);
    uint64_t overflows = 0;
    try {
        const size_t element = dtype_size(*dtype);
        std::vector<uint8_t> piece;
        write_safetensors_streamed(tmp + "/" + kSafetensorsFile, tensors, {{"format", "pt"}},
                                   [&](size_t i, const ByteSink& sink) {
                                       const uint64_t numel = source.find(tensors[i].name)->numel();
                                       const uint64_t step = kGroupReadPieceBytes / element;
                                       for (uint64_t at = 0; at < numel; at += step) {
                                           const uint64_t n = std::min(step, numel - at);
                                           piece.resize(size_t(n) * element);
                                           overflows += source.read(tensors[i].name, at, n, *dtype, piece.data());
                                           sink(piece.data(), piece.size());
                                       }
                                   });
        write_hf_config(tmp + "/config.json", config, torch_dtype_name(*dtype));
        std::optional<Tokenizer> tokenizer;  // for the BOS/EOS ids when src has no generation_config.json
        if (!fs::exists(fs::path(src) / "generation_config.json") && fs::exists(fs::path(src) / "tokenizer.json"))
            tokenizer = Tokenizer::load(src + "/tokenizer.json");
        write_model_files(tmp, ModelFiles{tokenizer ? &*tokenizer : nullptr, src, src});
    } catch (...) {
        std::error_code ignore;
        fs::remove_all(tmp, ignore);  // never leave half a model behind
        throw;
    }
    commit_checkpoint_dir(o.out_dir);
    std::printf("exported %s -> %s: %zu tensors, %lld parameters as %s (%llu values overflowed)%s\n", src.c_str(),
                o.out_dir.c_str(), tensors.size(), parameter_count(config), dtype_name(*dtype),
                static_cast<unsigned long long>(overflows),
                skipped.empty()
                    ? ""
                    : (", skipped " + std::to_string(skipped.size()) + " tensor(s) Hugging Face ignores").c_str());
    for (const char* f : {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"})
        if (fs::exists(fs::path(o.out_dir) / f)) std::printf("  with %s\n", f);
}

}  // namespace pv
