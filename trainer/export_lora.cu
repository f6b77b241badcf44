// `train export` of a LoRA checkpoint (trainer/export.h): its adapters as a PEFT adapter directory
// (--peft), or the base with the adapters folded in as a Hugging Face model (--merged).
//
// --peft copies what the checkpoint already holds in PEFT's layout — adapter_model.safetensors, whose
// keys are PEFT's (base_model.model.<module>.lora_A.weight, [r][in]; lora_B, [out][r]) — converted to
// --dtype, with an adapter_config.json naming the base. --merged loads the base and the adapters
// into a whole model on the device in the export dtype and writes each base tensor dense (NF4
// dequantised) with W + s·B·A folded into every adapted weight (model/llama.h merged_tensor: one
// GEMM per module): the whole model must fit on one device. With --quantized the merged block
// linears (those --quantize nf4 quantises) are quantised on the device, each HF module on its own
// as bitsandbytes' Linear4bit, and written in bitsandbytes' layout with a quantization_config
// (formats/bnb_checkpoint.h), so transformers' from_pretrained loads a 4-bit model.
#include "formats/bnb_checkpoint.h"
#include "formats/config_json.h"
#include "formats/dtype_conversion.h"
#include "model/checkpoint.h"
#include "model/llama.h"
#include "model/nf4_slot.cuh"
#include "trainer/checkpoint.h"
#include "trainer/export.h"

#include <cstdio>
#include <filesystem>
#include <set>
#include <stdexcept>

namespace pv {

namespace fs = std::filesystem;

namespace {

std::string export_dtype(const ExportOptions& o, const ModelDir& m) { return o.dtype.empty() ? m.dtype : o.dtype; }

// The block linears --quantize nf4 quantises (model_layouts' NF4 groups), by polevault name.
std::set<std::string> nf4_tensor_names(const ModelDir& m) {
    GroupOptions g;
    g.lora = m.lora, g.nf4 = true;
    std::set<std::string> out;
    for (const auto& unit : model_layouts(m.config, DType::fp32, 1, g))
        for (const GroupLayout& layout : unit)
            if (layout.kind == GroupKind::nf4)
                for (const TensorSlot& t : layout.tensors) out.insert(t.spec.name);
    return out;
}

// The parts of one merged tensor (`dense`, device) as output tensors: each part's rows as they
// are, or, for a tensor in `quantize`, quantised on the device part by part as bitsandbytes
// quantises each Linear4bit (model/nf4_slot.cuh) and written in its layout (formats/bnb_checkpoint.h).
template <class T>
void add_tensor(const TensorSpec& spec, const T* dense, bool quantize, bool double_quant, std::vector<TensorBytes>& out) {
    const std::string dtype = torch_dtype_name(dtype_of<T>());
    if (!quantize) {
        std::vector<uint8_t> host(size_t(spec.numel()) * sizeof(T));
        CUDA_CHECK(cudaMemcpy(host.data(), dense, host.size(), cudaMemcpyDeviceToHost));
        for (const TensorPart& p : spec.parts) {
            const uint8_t* rows = host.data() + size_t(p.row_begin * spec.cols) * sizeof(T);
            const std::vector<int64_t> shape =
                spec.cols == 1 ? std::vector<int64_t>{p.rows} : std::vector<int64_t>{p.rows, spec.cols};
            out.push_back({{p.hf_name, safetensors_dtype(dtype_of<T>()), shape, 0, 0},
                           std::vector<uint8_t>(rows, rows + size_t(p.rows * spec.cols) * sizeof(T))});
        }
        return;
    }
    const size_t slot_bytes = size_t(nf4_slot_bytes(spec, double_quant));
    DeviceBuffer<uint8_t> slot(slot_bytes, MemoryCategory::workspace);
    nf4_quantize_slot(spec, double_quant, dense, slot.get(), nullptr);
    std::vector<uint8_t> host(slot_bytes);
    CUDA_CHECK(cudaMemcpy(host.data(), slot.get(), host.size(), cudaMemcpyDeviceToHost));
    const std::vector<Nf4PartFields> fields = nf4_part_fields(spec, double_quant);
    for (size_t i = 0; i < fields.size(); ++i)
        for (TensorBytes& t : bnb_part_tensors(spec.parts[i].hf_name, spec.parts[i].rows, spec.cols, fields[i],
                                               host.data(), dtype, double_quant))
            out.push_back(std::move(t));
}

template <class T>
void merged_as(const ExportOptions& o, const ModelDir& m) {
    // bitsandbytes dequantises to the dtype the weights came from: bf16, fp16 or fp32.
    if (o.quantized && dtype_of<T>() == DType::fp64)
        throw std::invalid_argument(
            "export --quantized: bitsandbytes 4-bit models are quantised from bf16 or fp32 "
            "weights, not fp64: pass --dtype bf16 or --dtype fp32");
    const bool double_quant = m.nf4 ? m.double_quant : true;
    const std::set<std::string> quantize = o.quantized ? nf4_tensor_names(m) : std::set<std::string>{};
    check_model_fits(m, dtype_name(dtype_of<T>()));
    Llama<T> model(m.config, inference_model(m, 1, 1));
    load_model_dir(m, model);
    // The base's tensors, dense (dequantised when NF4), each adapted one with W + s·B·A.
    std::vector<TensorBytes> tensors;
    const std::vector<UnitSpec> units = model_units(m.config);
    for (size_t u = 0; u < units.size(); ++u)
        for (size_t i = 0; i < units[u].tensors.size(); ++i) {
            const TensorSpec& spec = units[u].tensors[i];
            DeviceBuffer<T> dense(size_t(spec.numel()), MemoryCategory::workspace);
            model.merged_tensor(int(u), int(i), dense.get());
            add_tensor(spec, dense.get(), quantize.count(spec.name) > 0, double_quant, tensors);
        }
    std::vector<SafeTensorInfo> infos;
    for (const TensorBytes& t : tensors) infos.push_back(t.info);
    const std::string tmp = begin_new_model_dir(o.merged_out);
    const std::string torch_dtype = torch_dtype_name(dtype_of<T>());
    try {
        write_safetensors_streamed(
            tmp + "/model.safetensors", infos, {{"format", "pt"}},
            [&](size_t k, const ByteSink& sink) { sink(tensors[k].bytes.data(), tensors[k].bytes.size()); });
        if (o.quantized)
            write_bnb_hf_config(tmp + "/config.json", m.config, torch_dtype, double_quant);
        else
            write_hf_config(tmp + "/config.json", m.config, torch_dtype);
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
    std::printf("exported %s merged (base %s + LoRA rank %d, scale %g) -> %s: %lld parameters as %s%s\n",
                m.path.c_str(), m.base_dir.empty() ? "initialised from the seed" : m.base_dir.c_str(), m.lora.rank,
                m.lora.scale(), o.merged_out.c_str(), parameter_count(m.config), dtype_name(dtype_of<T>()),
                o.quantized ? (", block linears as bitsandbytes NF4" +
                               std::string(double_quant ? " with double quantisation" : ""))
                                  .c_str()
                            : "");
}

}  // namespace

void export_merged(const ExportOptions& o, const ModelDir& m) {
    with_dtype(export_dtype(o, m), [&](auto tag) { merged_as<typename decltype(tag)::type>(o, m); });
}

}  // namespace pv
