// A model's loss on every window of a dataset (see evaluate.h).
#include "trainer/evaluate.h"

#include "io/progress.h"
#include "model/unit_loop.h"
#include "platform/device_memory.h"

#include <algorithm>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace pv {

template <class T>
EvalResult evaluate_windows(Llama<T>& model, const DataLoader& data, long long max_windows) {
    if (model.seq_len() != data.seq_len())
        throw std::invalid_argument("evaluate_windows: the model's window (" + std::to_string(model.seq_len()) +
                                    ") is not the data's (" + std::to_string(data.seq_len()) + ")");
    const int B = model.batch(), Tn = model.seq_len();
    const long long windows = max_windows > 0 ? std::min(max_windows, data.windows()) : data.windows();
    DeviceBuffer<int> tokens(size_t(B) * size_t(Tn), MemoryCategory::workspace);
    DeviceBuffer<int> targets(size_t(B) * size_t(Tn), MemoryCategory::workspace);
    // With the document mask each row's positions within its documents (else none: 0 .. T-1).
    std::optional<DeviceBuffer<int>> positions;
    if (data.document_mask()) positions.emplace(size_t(B) * size_t(Tn), MemoryCategory::workspace);
    std::vector<int> host_positions(positions ? size_t(B) * size_t(Tn) : 0);
    DeviceBuffer<acc_t<T>> loss_sum(1, MemoryCategory::workspace);
    DeviceBuffer<int> count(1, MemoryCategory::workspace);
    std::vector<int> inputs(size_t(B) * size_t(Tn)), outputs(size_t(B) * size_t(Tn));
    EvalResult r;
    Progress progress("evaluating " + std::to_string(windows) + " windows", double(windows), Progress::Unit::items);
    for (long long first = 0; first < windows; first += B) {
        const long long rows = std::min<long long>(B, windows - first);
        std::fill(inputs.begin(), inputs.end(), 0);  // padding rows: token 0, nothing counted
        std::fill(outputs.begin(), outputs.end(), kIgnoreIndex);
        for (size_t i = 0; i < host_positions.size(); ++i) host_positions[i] = int(i % size_t(Tn));
        for (long long b = 0; b < rows; ++b)
            data.window(first + b, inputs.data() + b * Tn, outputs.data() + b * Tn,
                        positions ? host_positions.data() + b * Tn : nullptr);
        CUDA_CHECK(cudaMemcpy(tokens.get(), inputs.data(), tokens.bytes(), cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(targets.get(), outputs.data(), targets.bytes(), cudaMemcpyHostToDevice));
        if (positions)
            CUDA_CHECK(cudaMemcpy(positions->get(), host_positions.data(), positions->bytes(), cudaMemcpyHostToDevice));
        single_forward<T>(model, 0, DeviceBatch{tokens.get(), targets.get(), positions ? positions->get() : nullptr},
                          loss_sum.get(), count.get());
        acc_t<T> sum = 0;
        int counted = 0;
        CUDA_CHECK(cudaMemcpyAsync(&sum, loss_sum.get(), sizeof sum, cudaMemcpyDeviceToHost, model.stream()));
        CUDA_CHECK(cudaMemcpyAsync(&counted, count.get(), sizeof counted, cudaMemcpyDeviceToHost, model.stream()));
        CUDA_CHECK(cudaStreamSynchronize(model.stream()));
        r.loss_sum += double(sum);
        r.tokens += counted;
        r.windows += rows;
        progress.advance(double(rows));
    }
    if (r.tokens == 0)
        throw std::runtime_error("evaluation: none of the " + std::to_string(r.windows) +
                                 " windows has a counted target (every target is -100)");
    return r;
}

template EvalResult evaluate_windows(Llama<__nv_bfloat16>&, const DataLoader&, long long);
template EvalResult evaluate_windows(Llama<float>&, const DataLoader&, long long);
template EvalResult evaluate_windows(Llama<double>&, const DataLoader&, long long);

}  // namespace pv
