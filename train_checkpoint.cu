// Checkpoints of a training run (see train_checkpoint.h).
#include "train_checkpoint.h"

#include "model/checkpoint.h"
#include "model/config_json.h"
#include "model/safetensors.h"

#include <filesystem>
#include <stdexcept>

namespace pv {

namespace {

template <class T>
constexpr DType dtype_of() {
    if constexpr (std::is_same_v<T, __nv_bfloat16>) return DType::bf16;
    else if constexpr (std::is_same_v<T, float>) return DType::fp32;
    else return DType::fp64;
}

template <class T>
std::vector<GroupLayout> layouts_of(const Llama<T>& model) {
    std::vector<GroupLayout> out;
    for (int u = 0; u < model.num_units(); ++u) out.push_back(model.layout(u));
    return out;
}

const char* torch_dtype_name(DType d) { return d == DType::bf16 ? "bfloat16" : d == DType::fp32 ? "float32" : "float64"; }

template <class T>
void require_whole_groups(const AdamWState<T>& optimizer, const Llama<T>& model) {
    for (int u = 0; u < model.num_units(); ++u)
        if (optimizer.begin(u) != 0 || optimizer.end(u) != model.layout(u).padded)
            throw std::logic_error("checkpoint: the optimizer state of unit " + std::to_string(u) +
                                   " is sharded; gather it before saving or loading");
}

template <class T>
HostGroups download_params(Llama<T>& model) {
    HostGroups g{dtype_of<T>(), {}};
    for (int u = 0; u < model.num_units(); ++u) {
        std::vector<uint8_t> bytes(size_t(model.layout(u).padded) * sizeof(T));
        CUDA_CHECK(cudaMemcpy(bytes.data(), model.params(u), bytes.size(), cudaMemcpyDeviceToHost));
        g.units.push_back(std::move(bytes));
    }
    return g;
}

template <class T>
void upload_params(Llama<T>& model, const HostGroups& g) {
    for (int u = 0; u < model.num_units(); ++u)
        CUDA_CHECK(cudaMemcpy(model.params(u), g.units[size_t(u)].data(), g.units[size_t(u)].size(), cudaMemcpyHostToDevice));
}

}  // namespace

std::string checkpoint_path(const std::string& out_dir, long long step) {
    return (std::filesystem::path(out_dir) / ("step_" + std::to_string(step))).string();
}

std::string resolve_checkpoint(const std::string& path) {
    if (std::filesystem::is_regular_file(std::filesystem::path(path) / kTrainerStateFile)) return path;
    if (auto latest = latest_checkpoint(path, kTrainerStateFile)) return *latest;
    throw std::runtime_error("'" + path + "' is neither a checkpoint (a step_N directory with " + kTrainerStateFile +
                             ") nor an output directory containing one");
}

template <class T>
void save_checkpoint(const std::string& dir, Llama<T>& model, const AdamWState<T>& optimizer, const TrainerState& state,
                     const Tokenizer* tokenizer) {
    using A = acc_t<T>;
    require_whole_groups(optimizer, model);
    const std::vector<GroupLayout> layouts = layouts_of(model);
    const std::string tmp = begin_checkpoint_dir(dir);
    const std::map<std::string, std::string> metadata{{"format", "pt"}};
    write_group_tensors(tmp + "/model.safetensors", layouts, download_params(model), metadata);
    auto save_field = [&](const char* file, typename AdamWState<T>::Field f) {
        HostGroups g{dtype_of<A>(), {}};
        for (int u = 0; u < model.num_units(); ++u) g.units.push_back(optimizer.download(u, f));
        write_group_tensors(tmp + "/" + file, layouts, g, metadata);
    };
    if constexpr (AdamWState<T>::kHasMaster) save_field("master.safetensors", AdamWState<T>::Field::master);
    save_field("adam_m.safetensors", AdamWState<T>::Field::m);
    save_field("adam_v.safetensors", AdamWState<T>::Field::v);
    write_hf_config(tmp + "/config.json", model.config(), torch_dtype_name(dtype_of<T>()));
    if (tokenizer) tokenizer->save(tmp + "/tokenizer.json");
    write_trainer_state(tmp + "/" + kTrainerStateFile, state);  // last: the marker of a complete checkpoint
    commit_checkpoint_dir(dir);
}

template <class T>
TrainerState load_checkpoint(const std::string& dir, Llama<T>& model, AdamWState<T>& optimizer) {
    using A = acc_t<T>;
    require_whole_groups(optimizer, model);
    TrainerState state = read_trainer_state(dir + "/" + kTrainerStateFile);
    const std::vector<GroupLayout> layouts = layouts_of(model);
    upload_params(model, read_group_tensors(dir + "/model.safetensors", layouts, dtype_of<T>()));
    auto load_field = [&](const char* file, typename AdamWState<T>::Field f) {
        const HostGroups g = read_group_tensors(dir + "/" + file, layouts, dtype_of<A>());
        for (int u = 0; u < model.num_units(); ++u) optimizer.upload(u, f, g.units[size_t(u)]);
    };
    if constexpr (AdamWState<T>::kHasMaster) {
        if (std::filesystem::exists(dir + "/master.safetensors")) {
            load_field("master.safetensors", AdamWState<T>::Field::master);
        } else {  // a checkpoint of an fp32/fp64 run continued in bf16: the master from the weights
            for (int u = 0; u < model.num_units(); ++u) optimizer.init_master(u, model.params(u), model.stream());
        }
    }
    load_field("adam_m.safetensors", AdamWState<T>::Field::m);
    load_field("adam_v.safetensors", AdamWState<T>::Field::v);
    return state;
}

template <class T>
void load_weights(const std::string& dir, Llama<T>& model) {
    upload_params(model, read_group_tensors(dir + "/model.safetensors", layouts_of(model), dtype_of<T>()));
}

#define PV_INSTANTIATE(T)                                                                                              \
    template void save_checkpoint(const std::string&, Llama<T>&, const AdamWState<T>&, const TrainerState&,            \
                                  const Tokenizer*);                                                                   \
    template TrainerState load_checkpoint(const std::string&, Llama<T>&, AdamWState<T>&);                              \
    template void load_weights(const std::string&, Llama<T>&);
PV_INSTANTIATE(__nv_bfloat16)
PV_INSTANTIATE(float)
PV_INSTANTIATE(double)
#undef PV_INSTANTIATE

}  // namespace pv
