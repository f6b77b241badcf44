// `train export` of a LoRA checkpoint (trainer/export.h): its adapters as a PEFT adapter directory
// (--peft), or the base with the adapters folded in as a Hugging Face model (--merged).
//
// --peft copies what the checkpoint already holds in PEFT's layout — adapter_model.safetensors, whose
// keys are PEFT's (base_model.model.<module>.lora_A.weight, [r][in]; lora_B, [out][r]) — converted to
// --dtype, with an adapter_config.json naming the base. --merged loads the base and the adapters
// into a whole model on the device in the export dtype and writes each base tensor dense (NF4
// dequantised) with W + s·B·A folded into every adapted weight (model/llama.h merged_tensor: one
// GEMM per module): the whole model must fit on one device.
#include "model/checkpoint.h"
#include "model/config_json.h"
#include "model/dtype_conversion.h"
#include "model/llama.h"
#include "trainer/checkpoint.h"
#include "trainer/export.h"

#include <cstdio>
#include <filesystem>
#include <stdexcept>

namespace pv {

namespace fs = std::filesystem;

namespace {

std::string export_dtype(const ExportOptions& o, const ModelDir& m) { return o.dtype.empty() ? m.dtype : o.dtype; }

template <class T>
void merged_as(const ExportOptions& o, const ModelDir& m) {
    Llama<T> model(m.config, inference_model(m, 1, 1));
    load_model_dir(m, model);
    // The base's tensors, dense (dequantised when NF4), each adapted one with W + s·B·A.
    std::vector<GroupLayout> layouts;
    HostGroups params{dtype_of<T>(), {}};
    const std::vector<UnitSpec> units = model_units(m.config);
    for (size_t u = 0; u < units.size(); ++u) {
        layouts.push_back(layout_group(GroupKind::frozen, dtype_of<T>(), units[u].tensors, 1));
        const GroupLayout& layout = layouts.back();
        std::vector<uint8_t> bytes(layout.bytes(), 0);
        for (size_t i = 0; i < layout.tensors.size(); ++i) {
            const TensorSlot& t = layout.tensors[i];
            DeviceBuffer<T> dense(size_t(t.spec.numel()), MemoryCategory::workspace);
            model.merged_tensor(int(u), int(i), dense.get());
            CUDA_CHECK(cudaMemcpy(bytes.data() + size_t(t.offset) * sizeof(T), dense.get(), dense.bytes(),
                                  cudaMemcpyDeviceToHost));
        }
        params.units.push_back(std::move(bytes));
    }
    const std::string tmp = begin_new_model_dir(o.merged_out);
    try {
        write_group_tensors(tmp + "/model.safetensors", layouts, params, {{"format", "pt"}});
        write_hf_config(tmp + "/config.json", m.config, torch_dtype_name(dtype_of<T>()));
        std::optional<Tokenizer> tokenizer;
        if (!fs::exists(fs::path(m.path) / "generation_config.json") && !m.tokenizer.empty())
            tokenizer = Tokenizer::load(m.tokenizer);
        write_model_files(tmp, ModelFiles{tokenizer ? &*tokenizer : nullptr, m.path, m.path});
    } catch (...) {
        std::error_code ignore;
        fs::remove_all(tmp, ignore);
        throw;
    }
    commit_checkpoint_dir(o.merged_out);
    std::printf("exported %s merged (base %s + LoRA rank %d, scale %g) -> %s: %lld parameters as %s\n", m.path.c_str(),
                m.base_dir.empty() ? "initialised from the seed" : m.base_dir.c_str(), m.lora.rank, m.lora.scale(),
                o.merged_out.c_str(), parameter_count(m.config), dtype_name(dtype_of<T>()));
}

}  // namespace

void export_merged(const ExportOptions& o, const ModelDir& m) {
    const std::string dtype = export_dtype(o, m);
    if (dtype == "bf16") return merged_as<__nv_bfloat16>(o, m);
    if (dtype == "fp32") return merged_as<float>(o, m);
    return merged_as<double>(o, m);
}

}  // namespace pv
