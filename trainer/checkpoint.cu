// Checkpoints of a training run (see train_checkpoint.h).
#include "trainer/checkpoint.h"

#include "model/checkpoint.h"
#include "model/config_json.h"
#include "model/safetensors.h"

#include <filesystem>
#include <stdexcept>

namespace pv {

namespace {

// Every group of every unit (the model file), or every unit's trainable group (the optimizer's).
template <class T>
std::vector<GroupLayout> all_groups(const Llama<T>& model) {
    std::vector<GroupLayout> out;
    for (int u = 0; u < model.num_units(); ++u)
        for (int g = 0; g < model.num_groups(u); ++g) out.push_back(model.group(u, g));
    return out;
}
template <class T>
std::vector<GroupLayout> trainable_groups(const Llama<T>& model) {
    std::vector<GroupLayout> out;
    for (int u = 0; u < model.num_units(); ++u) out.push_back(model.trainable(u));
    return out;
}

const char* torch_dtype_name(DType d) {
    return d == DType::bf16 ? "bfloat16" : d == DType::fp32 ? "float32" : "float64";
}

// Elements [begin, begin + len) of a whole group's host bytes, to the device at dst.
void upload_range(void* dst, const std::vector<uint8_t>& whole, long long begin, long long len, size_t element) {
    if (len > 0)
        CUDA_CHECK(
            cudaMemcpy(dst, whole.data() + size_t(begin) * element, size_t(len) * element, cudaMemcpyHostToDevice));
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

template <class T, class G>
void save_checkpoint(const std::string& dir, Strategy<T, G>& strategy, const AdamWState<T>& optimizer,
                     const TrainerState& state, const Tokenizer* tokenizer) {
    using A = acc_t<T>;
    using Field = typename AdamWState<T>::Field;
    Llama<T>& model = strategy.model();
    const bool writer = !strategy.comm() || strategy.comm()->rank() == 0;
    // Each group whole on the writer, the strategy gathering it from wherever it lives.
    HostGroups params{dtype_of<T>(), {}};
    for (int u = 0; u < model.num_units(); ++u)
        for (int g = 0; g < model.num_groups(u); ++g)
            params.units.push_back(strategy.whole_on_writer(u, static_cast<const T*>(strategy.local_params(u, g)),
                                                            strategy.local_len(u, g), model.group(u, g).padded));
    auto gather = [&](Field f) {
        HostGroups h{dtype_of<A>(), {}};
        for (int u = 0; u < model.num_units(); ++u)
            h.units.push_back(strategy.whole_on_writer(u, static_cast<const A*>(optimizer.data(u, f)),
                                                       optimizer.end(u) - optimizer.begin(u),
                                                       model.trainable(u).padded));
        return h;
    };
    std::vector<std::pair<std::string, HostGroups>> fields;
    if constexpr (AdamWState<T>::kHasMaster) fields.emplace_back("master.safetensors", gather(Field::master));
    fields.emplace_back("adam_m.safetensors", gather(Field::m));
    fields.emplace_back("adam_v.safetensors", gather(Field::v));
    if (!writer) return;
    const std::string tmp = begin_checkpoint_dir(dir);
    const std::map<std::string, std::string> metadata{{"format", "pt"}};
    write_group_tensors(tmp + "/model.safetensors", all_groups(model), params, metadata);
    for (const auto& [file, groups] : fields)
        write_group_tensors(tmp + "/" + file, trainable_groups(model), groups, metadata);
    write_hf_config(tmp + "/config.json", model.config(), torch_dtype_name(dtype_of<T>()));
    if (tokenizer) tokenizer->save(tmp + "/tokenizer.json");
    write_trainer_state(tmp + "/" + kTrainerStateFile, state);  // last: the marker of a complete checkpoint
    commit_checkpoint_dir(dir);
}

template <class T, class G>
TrainerState load_checkpoint(const std::string& dir, Strategy<T, G>& strategy, AdamWState<T>& optimizer) {
    using A = acc_t<T>;
    using Field = typename AdamWState<T>::Field;
    Llama<T>& model = strategy.model();
    TrainerState state = read_trainer_state(dir + "/" + kTrainerStateFile);
    // Every rank reads the whole files and keeps what the strategy says it keeps.
    const HostGroups weights = read_group_tensors(dir + "/model.safetensors", all_groups(model), dtype_of<T>());
    size_t k = 0;
    for (int u = 0; u < model.num_units(); ++u)
        for (int g = 0; g < model.num_groups(u); ++g, ++k)
            upload_range(strategy.local_params(u, g), weights.units[k], strategy.local_begin(u, g),
                         strategy.local_len(u, g), sizeof(T));
    auto load_field = [&](const char* file, Field f) {
        const HostGroups h = read_group_tensors(dir + "/" + file, trainable_groups(model), dtype_of<A>());
        for (int u = 0; u < model.num_units(); ++u)
            upload_range(optimizer.data(u, f), h.units[size_t(u)], optimizer.begin(u),
                         optimizer.end(u) - optimizer.begin(u), sizeof(A));
    };
    if constexpr (AdamWState<T>::kHasMaster) {
        if (std::filesystem::exists(dir + "/master.safetensors")) {
            load_field("master.safetensors", Field::master);
        } else {  // a checkpoint of an fp32/fp64 run continued in bf16: the master from the weights
            for (int u = 0; u < model.num_units(); ++u)
                optimizer.init_master(u, strategy.owned_params(u), model.stream());
        }
    }
    load_field("adam_m.safetensors", Field::m);
    load_field("adam_v.safetensors", Field::v);
    return state;
}

template <class T>
void load_weights(const std::string& dir, Llama<T>& model) {
    const HostGroups weights = read_group_tensors(dir + "/model.safetensors", all_groups(model), dtype_of<T>());
    size_t k = 0;
    for (int u = 0; u < model.num_units(); ++u)
        for (int g = 0; g < model.num_groups(u); ++g, ++k)
            if (model.holds(u))
                upload_range(model.group_params(u, g), weights.units[k], 0, model.group(u, g).padded, sizeof(T));
}

#define PV_INSTANTIATE(T, G)                                                                                      \
    template void save_checkpoint(const std::string&, Strategy<T, G>&, const AdamWState<T>&, const TrainerState&, \
                                  const Tokenizer*);                                                              \
    template TrainerState load_checkpoint(const std::string&, Strategy<T, G>&, AdamWState<T>&);
PV_INSTANTIATE(__nv_bfloat16, __nv_bfloat16)
PV_INSTANTIATE(__nv_bfloat16, float)
PV_INSTANTIATE(float, float)
PV_INSTANTIATE(double, double)
#undef PV_INSTANTIATE
template void load_weights(const std::string&, Llama<__nv_bfloat16>&);
template void load_weights(const std::string&, Llama<float>&);
template void load_weights(const std::string&, Llama<double>&);

}  // namespace pv
