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
void upload_params(Llama<T>& model, const HostGroups& g) {
    for (int u = 0; u < model.num_units(); ++u)
        if (model.holds(u))
            CUDA_CHECK(cudaMemcpy(model.params(u), g.units[size_t(u)].data(), g.units[size_t(u)].size(), cudaMemcpyHostToDevice));
}

// The bytes of n device elements.
template <class X>
std::vector<uint8_t> download_bytes(const X* p, long long n) {
    std::vector<uint8_t> bytes(size_t(n) * sizeof(X));
    CUDA_CHECK(cudaMemcpy(bytes.data(), p, bytes.size(), cudaMemcpyDeviceToHost));
    return bytes;
}

// Unit u's array of which this rank holds [begin, begin + len) (all of it when len == padded),
// whole on the writing rank: gathered from every rank's slice through `comm`, or, under model
// parallelism (`owner` >= 0: the rank holding the unit), sent by its owner unless that is the writer.
template <class X, class T>
std::vector<uint8_t> whole_group(Llama<T>& model, Comm* comm, int u, const X* range, long long len, bool writer,
                                 int owner = -1) {
    const long long padded = model.layout(u).padded;
    if (owner > 0) {  // one rank holds it whole and sends it to the writer
        if (comm->rank() == owner) {
            comm->fence_from(model.stream());
            comm->send(range, size_t(padded), 0);
            CUDA_CHECK(cudaStreamSynchronize(comm->stream()));
            return {};
        }
        if (!writer) return {};
        DeviceBuffer<X> whole(size_t(padded), MemoryCategory::comm_buffers);
        comm->recv(whole.get(), size_t(padded), owner);
        CUDA_CHECK(cudaStreamSynchronize(comm->stream()));
        return download_bytes(whole.get(), padded);
    }
    if (len == padded || owner == 0) return writer ? download_bytes(range, padded) : std::vector<uint8_t>{};
    if (!comm || padded != len * comm->size())
        throw std::logic_error("checkpoint: unit " + std::to_string(u) + " is sharded but there is no communicator of "
                               "its shards to gather it");
    DeviceBuffer<X> whole(size_t(padded), MemoryCategory::comm_buffers);
    comm->fence_from(model.stream());
    comm->all_gather(range, whole.get(), size_t(len));
    CUDA_CHECK(cudaStreamSynchronize(comm->stream()));
    return writer ? download_bytes(whole.get(), padded) : std::vector<uint8_t>{};
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
                     const Tokenizer* tokenizer, Comm* comm, const std::vector<T*>* param_slices,
                     const std::vector<int>* unit_owner) {
    using A = acc_t<T>;
    using Field = typename AdamWState<T>::Field;
    const bool writer = !comm || comm->rank() == 0;
    const std::vector<GroupLayout> layouts = layouts_of(model);
    auto owner = [&](int u) { return unit_owner ? unit_owner->at(size_t(u)) : -1; };
    // Each field of each unit, whole: this rank's range, gathered from every rank's slice, or sent
    // by its owner.
    auto gather = [&](Field f) {
        HostGroups g{dtype_of<A>(), {}};
        for (int u = 0; u < model.num_units(); ++u)
            g.units.push_back(whole_group(model, comm, u, optimizer.data(u, f), optimizer.end(u) - optimizer.begin(u),
                                          writer, owner(u)));
        return g;
    };
    HostGroups params{dtype_of<T>(), {}};
    for (int u = 0; u < model.num_units(); ++u)
        params.units.push_back(param_slices ? whole_group(model, comm, u, (*param_slices)[size_t(u)],
                                                          optimizer.end(u) - optimizer.begin(u), writer)
                                            : whole_group(model, comm, u, model.params(u), model.layout(u).padded, writer,
                                                          owner(u)));
    std::vector<std::pair<std::string, HostGroups>> fields;
    if constexpr (AdamWState<T>::kHasMaster) fields.emplace_back("master.safetensors", gather(Field::master));
    fields.emplace_back("adam_m.safetensors", gather(Field::m));
    fields.emplace_back("adam_v.safetensors", gather(Field::v));
    if (!writer) return;
    const std::string tmp = begin_checkpoint_dir(dir);
    const std::map<std::string, std::string> metadata{{"format", "pt"}};
    write_group_tensors(tmp + "/model.safetensors", layouts, params, metadata);
    for (const auto& [file, groups] : fields) write_group_tensors(tmp + "/" + file, layouts, groups, metadata);
    write_hf_config(tmp + "/config.json", model.config(), torch_dtype_name(dtype_of<T>()));
    if (tokenizer) tokenizer->save(tmp + "/tokenizer.json");
    write_trainer_state(tmp + "/" + kTrainerStateFile, state);  // last: the marker of a complete checkpoint
    commit_checkpoint_dir(dir);
}

template <class T>
TrainerState load_checkpoint(const std::string& dir, Llama<T>& model, AdamWState<T>& optimizer,
                             const std::vector<T*>* param_slices) {
    using A = acc_t<T>;
    using Field = typename AdamWState<T>::Field;
    TrainerState state = read_trainer_state(dir + "/" + kTrainerStateFile);
    const std::vector<GroupLayout> layouts = layouts_of(model);
    const HostGroups weights = read_group_tensors(dir + "/model.safetensors", layouts, dtype_of<T>());
    if (!param_slices) upload_params(model, weights);
    else
        for (int u = 0; u < model.num_units(); ++u)  // this rank's slice (the optimizer's range)
            CUDA_CHECK(cudaMemcpy((*param_slices)[size_t(u)],
                                  weights.units[size_t(u)].data() + size_t(optimizer.begin(u)) * sizeof(T),
                                  size_t(optimizer.end(u) - optimizer.begin(u)) * sizeof(T), cudaMemcpyHostToDevice));
    auto load_field = [&](const char* file, Field f) {
        const HostGroups g = read_group_tensors(dir + "/" + file, layouts, dtype_of<A>());
        for (int u = 0; u < model.num_units(); ++u) {
            const auto& whole = g.units[size_t(u)];
            const auto first = whole.begin() + long(size_t(optimizer.begin(u)) * sizeof(A));
            optimizer.upload(u, f, std::vector<uint8_t>(first, first + long(size_t(optimizer.end(u) - optimizer.begin(u)) * sizeof(A))));
        }
    };
    if constexpr (AdamWState<T>::kHasMaster) {
        if (std::filesystem::exists(dir + "/master.safetensors")) {
            load_field("master.safetensors", Field::master);
        } else {  // a checkpoint of an fp32/fp64 run continued in bf16: the master from the weights
            for (int u = 0; u < model.num_units(); ++u)
                optimizer.init_master(u, param_slices ? (*param_slices)[size_t(u)] : model.params(u) + optimizer.begin(u),
                                      model.stream());
        }
    }
    load_field("adam_m.safetensors", Field::m);
    load_field("adam_v.safetensors", Field::v);
    return state;
}

template <class T>
void load_weights(const std::string& dir, Llama<T>& model) {
    upload_params(model, read_group_tensors(dir + "/model.safetensors", layouts_of(model), dtype_of<T>()));
}

#define PV_INSTANTIATE(T)                                                                                              \
    template void save_checkpoint(const std::string&, Llama<T>&, const AdamWState<T>&, const TrainerState&,            \
                                  const Tokenizer*, Comm*, const std::vector<T*>*, const std::vector<int>*);           \
    template TrainerState load_checkpoint(const std::string&, Llama<T>&, AdamWState<T>&, const std::vector<T*>*);      \
    template void load_weights(const std::string&, Llama<T>&);
PV_INSTANTIATE(__nv_bfloat16)
PV_INSTANTIATE(float)
PV_INSTANTIATE(double)
#undef PV_INSTANTIATE

}  // namespace pv
