// Checkpoints of a training run (see trainer/checkpoint.h).
#include "trainer/checkpoint.h"

#include "formats/config_json.h"
#include "formats/dtype_conversion.h"
#include "formats/peft_config.h"
#include "model/checkpoint.h"
#include "model/checkpoint_files.h"
#include "parallel/collective_watch.h"
#include "parallel/planner.h"

#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <type_traits>

#include <unistd.h>

namespace pv {

namespace fs = std::filesystem;

template <class T, class G>
void save_checkpoint(const std::string& dir, Strategy<T, G>& strategy, const AdamWState<T>& optimizer,
                     const TrainerState& state, const ModelFiles& files) {
    using A = acc_t<T>;
    using Field = typename AdamWState<T>::Field;
    Llama<T>& model = strategy.model();
    const bool writer = !strategy.comm() || strategy.comm()->rank() == 0;
    // Each group whole on the writer, the strategy gathering it from wherever it lives. A LoRA
    // run saves its adapters only: the base is referenced (trainer_state.json), never copied.
    const GroupSet saved = model.lora().enabled() ? GroupSet::trainable : GroupSet::all;
    // What this rank keeps in host memory (offloaded parameters or optimizer state) goes through
    // a device copy of its range, so the strategy gathers it exactly as device memory: the same
    // bytes either way.
    auto whole = [&](int u, int g, const auto* local, long long len, bool on_host, long long padded) {
        using X = std::remove_cv_t<std::remove_pointer_t<decltype(local)>>;
        DeviceBuffer<X> staged;
        if (on_host && len > 0) {
            staged = DeviceBuffer<X>(size_t(len), MemoryCategory::comm_buffers);
            CUDA_CHECK(cudaMemcpy(staged.get(), local, staged.bytes(), cudaMemcpyHostToDevice));
            local = staged.get();
        }
        return strategy.whole_on_writer(u, g, local, len, padded);
    };
    HostGroups params{dtype_of<T>(), {}};
    for (int u = 0; u < model.num_units(); ++u)
        for (int g = 0; g < model.num_groups(u); ++g)
            if (in_set(model, g, saved))
                params.units.push_back(whole(u, g, static_cast<const T*>(strategy.local_params(u, g)),
                                             strategy.local_len(u, g), strategy.params_on_host(),
                                             model.group(u, g).padded));
    auto gather = [&](Field f) {
        HostGroups h{dtype_of<A>(), {}};
        for (int u = 0; u < model.num_units(); ++u)
            h.units.push_back(whole(u, 0, static_cast<const A*>(optimizer.data(u, f)),
                                    optimizer.end(u) - optimizer.begin(u), optimizer.on_host(),
                                    model.trainable(u).padded));
        return h;
    };
    std::vector<std::pair<std::string, HostGroups>> fields;
    if constexpr (AdamWState<T>::kHasMaster) fields.emplace_back("master.safetensors", gather(Field::master));
    fields.emplace_back("adam_m.safetensors", gather(Field::m));
    fields.emplace_back("adam_v.safetensors", gather(Field::v));
    if (!writer) return;
    // The others wait in their next collective meanwhile: not a stall (parallel/collective_watch.h).
    const LongHostWork writing("writing checkpoint " + dir);
    // What the files need, about: the tensors (padded groups: a little more than the files hold).
    uint64_t bytes = 0;
    for (const auto& unit : params.units) bytes += unit.size();
    for (const auto& field : fields)
        for (const auto& unit : field.second.units) bytes += unit.size();
    write_checkpoint_dir(dir, bytes, [&](const std::string& tmp) {
        WriteRecorder written;  // each file's size and checksum, computed as it is written
        const std::map<std::string, std::string> metadata{{"format", "pt"}};
        // (whole tensors: a tensor-parallel rank's slices were joined on the way, whole_on_writer)
        write_group_tensors(tmp + "/" + weights_file(model), groups_of(model, saved, kWholeTensors), params, metadata);
        for (const auto& [file, groups] : fields)
            write_group_tensors(tmp + "/" + file, trainable_groups(model, kWholeTensors), groups, metadata);
        write_hf_config(tmp + "/config.json", model.config(), torch_dtype_name(dtype_of<T>()));
        if (model.lora().enabled())  // with adapter_model.safetensors: a PEFT adapter directory as it is
            write_peft_adapter_config(tmp + "/adapter_config.json", model.lora(), state.options.init_from);
        write_model_files(tmp, files);
        TrainerState complete = state;
        complete.model_config = hf_config_json(model.config(), torch_dtype_name(dtype_of<T>()));
        for (const WrittenFile& f : written.files()) {
            if (fs::path(f.path).parent_path() != fs::path(tmp))
                throw std::logic_error("save_checkpoint: " + f.path + " was written outside " + tmp);
            complete.files[fs::path(f.path).filename().string()] = f.digest;
        }
        write_trainer_state(tmp + "/" + kTrainerStateFile, complete);  // last: the marker of a complete checkpoint
    });
}

template <class T, class G>
TrainerState load_checkpoint(const std::string& dir, Strategy<T, G>& strategy, AdamWState<T>& optimizer,
                             LoadStats* stats, bool allow_inexact) {
    TrainerState state = read_trainer_state(dir + "/" + kTrainerStateFile);
    const std::vector<std::string> absent =
        missing_optimizer_files(dir, AdamWState<T>::kHasMaster, allow_inexact);  // refused unless allowed
    const int rank = strategy.comm() ? strategy.comm()->rank() : 0;
    const int ranks = strategy.comm() ? strategy.comm()->size() : 1;
    verify_checkpoint_files(dir, state.files, rank, ranks, absent);  // this rank's share; a bad file ends every rank
    if (rank == 0) {
        if (state.files.empty())
            std::printf("note: %s records no checksums (written by an older build): its files are not verified\n",
                        dir.c_str());
        for (const std::string& f : absent)
            std::printf("warning: %s has no %s; resuming without it (%s): the run does not continue bit for bit\n",
                        dir.c_str(), f.c_str(), kAllowInexactResumeFlag);
    }
    const LoadStats read = load_checkpoint_tensors(dir, strategy, optimizer, absent);
    if (stats) *stats = read;
    return state;
}

template <class T>
LoadStats load_weights(const std::string& dir, Llama<T>& model) {
    return load_model_weights(dir, model);
}

template <class T>
LoadStats load_model_dir(const ModelDir& m, Llama<T>& model) {
    if (!m.lora.enabled()) return load_model_weights(m.path, model);
    verify_model_dir_files(m.path);  // the adapters' checkpoint
    LoadStats stats;
    if (!m.base_dir.empty()) {
        verify_model_dir_files(m.base_dir);  // when the base is a polevault checkpoint
        HfCheckpoint base = HfCheckpoint::open_dir(m.base_dir);
        stats = load_model_weights(base, model, GroupSet::base);
    }
    HfCheckpoint adapters = HfCheckpoint::open_file(m.path + "/" + kAdapterFile);
    stats.add(load_model_weights(adapters, model, GroupSet::trainable, ExtraTensors::refuse));
    return stats;
}

ModelOptions inference_model(const ModelDir& m, int batch, int seq_len) {
    ModelOptions o = whole_model(batch, seq_len, m.seed, Gradients::none);
    o.lora = m.lora;
    o.nf4 = m.nf4, o.double_quant = m.double_quant;
    return o;
}

void check_model_fits(const ModelDir& m, const std::string& dtype) {
    const DType t = parse_dtype(dtype);
    const GroupOptions groups{{}, m.lora, m.nf4, m.double_quant};
    double bytes = 0;
    for (const std::vector<GroupLayout>& unit : model_layouts(m.config, t, 1, groups))
        for (const GroupLayout& g : unit) bytes += double(g.bytes());
    double budget = 0;
    std::string where;
    if (kHostBackend) {
        budget = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGE_SIZE)), where = "this machine's memory";
    } else {
        size_t free_bytes = 0, total = 0;
        CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
        budget = double(free_bytes), where = "this GPU's free memory";
    }
    if (bytes <= budget) return;
    throw std::runtime_error("'" + m.path + "': its config.json describes a model of " +
                             std::to_string(parameter_count(m.config)) + " parameters, whose weights alone take " +
                             format_bytes(bytes) + " in " + dtype + ", more than the " + format_bytes(budget) + " of " +
                             where + ": check config.json's sizes (hidden_size, intermediate_size, vocab_size, "
                             "num_hidden_layers), or use a smaller --dtype or a machine with more memory");
}

#define PV_INSTANTIATE(T, G)                                                                                      \
    template void save_checkpoint(const std::string&, Strategy<T, G>&, const AdamWState<T>&, const TrainerState&, \
                                  const ModelFiles&);                                                             \
    template TrainerState load_checkpoint(const std::string&, Strategy<T, G>&, AdamWState<T>&, LoadStats*, bool);
PV_INSTANTIATE(__nv_bfloat16, __nv_bfloat16)
PV_INSTANTIATE(__nv_bfloat16, float)
PV_INSTANTIATE(float, float)
PV_INSTANTIATE(double, double)
#undef PV_INSTANTIATE
template LoadStats load_weights(const std::string&, Llama<__nv_bfloat16>&);
template LoadStats load_weights(const std::string&, Llama<float>&);
template LoadStats load_weights(const std::string&, Llama<double>&);
template LoadStats load_model_dir(const ModelDir&, Llama<__nv_bfloat16>&);
template LoadStats load_model_dir(const ModelDir&, Llama<float>&);
template LoadStats load_model_dir(const ModelDir&, Llama<double>&);

}  // namespace pv
