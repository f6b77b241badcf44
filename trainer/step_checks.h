// The checks of a training step that keep a run from going wrong silently (trainer/trainer.h calls
// them; issue 17's "non-finite numbers" and "stalled ranks"):
//
// Consistency fingerprint. Every rank must run the same number of micro-batches and collectives in
// a step; a rank that runs one more micro-batch (a rank-dependent branch, a loader bug) would add
// its gradient to the others' silently under DDP, and a rank that runs one more collective is the
// usual cause of an NCCL hang. Each rank adds x and x² of its per-step figures (micro-batches,
// collectives of the world communicator since the previous check, parallel/comm.h) to the
// all-reduce that already sums the step's loss — no extra collective. Over N ranks Σx² · N = (Σx)²
// exactly when every x is equal (Cauchy–Schwarz, with equality only for equal terms); the values are
// small integers, so the doubles are exact. On a mismatch (the slow path, every rank takes it since
// the sums are global) the ranks all-gather their figures and the message names the first rank
// whose figures differ from rank 0's.
//
// Non-finite gradients. A step whose loss or gradient norm is NaN or infinite has been refused on
// the device (optim/clip.cuh, optim/adamw.cuh). Only then are the per-unit squared norms read back
// (they are global: summed over the ranks of the norm, parallel/strategy.h) and, for the first
// unit that is not finite, its HF tensors' squared norms formed and reduced the same way
// (Strategy::range_norms_sq) — a pass on the failure path only — to name the tensor.
//
// Non-finite updates. The AdamW update lowers a per-unit word to the first element whose new
// parameter, m or v is not finite (optim/adamw.cuh; the CPU update alike). The words are encoded
// here as unit·2⁴⁰ + element of the unit's trainable group, so that a minimum over the ranks names
// the first unit and element wherever it was found (sharded optimizers: each rank updates a slice).
//
// Test hooks (environment variables, read once per process; the hook lives in the trainer, not in
// a kernel), "key=value,..." with the keys step (1-based), rank (world rank) and tensor (HF name):
//   POLEVAULT_TEST_INJECT_NONFINITE="step=3,rank=1,tensor=model.layers.0.mlp.up_proj.weight"
//     writes +inf into that rank's first element of the tensor's reduced gradient that counts in the
//     norm (its slice), after the gradients are complete;
//   POLEVAULT_TEST_DIVERGE="step=2,rank=1": that rank runs its last micro-batch of the step twice.
#pragma once

#include "model/group_parts.h"
#include "parallel/comm_cost.h"
#include "parallel/strategy.h"

#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace pv {

// A test hook from the environment: unset, or the step and rank it fires at and its tensor.
struct TestHook {
    bool set = false;
    long long step = -1;
    int rank = -1;
    std::string tensor;
    bool fires(long long t, int r) const { return set && t == step && r == rank; }
};

// The hook in environment variable `variable` (header comment); a malformed one is an error.
inline TestHook read_test_hook(const char* variable) {
    TestHook h;
    const char* text = std::getenv(variable);
    if (!text || !*text) return h;
    h.set = true;
    std::stringstream in(text);
    std::string field;
    while (std::getline(in, field, ',')) {
        const size_t eq = field.find('=');
        const std::string key = field.substr(0, eq), value = eq == std::string::npos ? "" : field.substr(eq + 1);
        try {
            if (key == "step")
                h.step = std::stoll(value);
            else if (key == "rank")
                h.rank = std::stoi(value);
            else if (key == "tensor")
                h.tensor = value;
            else
                throw std::invalid_argument(key);
        } catch (const std::exception&) {
            throw std::invalid_argument(std::string(variable) + "=" + text + ": expected step=N,rank=R[,tensor=NAME]");
        }
    }
    if (h.step < 1 || h.rank < 0)
        throw std::invalid_argument(std::string(variable) + "=" + text + ": expected step=N,rank=R[,tensor=NAME]");
    return h;
}

// The per-step values added to the loss's all-reduce (trainer/trainer.h): the loss sum, then the
// fingerprint's terms, whether the previous step's update made anything non-finite here, and
// whether this rank was asked to stop after this step (a signal).
enum StepSum : int { kLossSum, kMicro, kMicroSq, kCollectives, kCollectivesSq, kBadUpdate, kStopRequests, kStepSums };
static_assert(kStepSums == kLossAllReduceDoubles, "the communication model counts the loss all-reduce's doubles");

// Whether every one of `ranks` values whose sum and sum of squares are given was equal (header).
inline bool all_equal(double sum, double sum_sq, int ranks) { return double(ranks) * sum_sq == sum * sum; }

// The fingerprint's slow path (collective over `comm`, every rank): each rank's figures gathered,
// and the error naming the first rank whose figures differ from rank 0's.
inline std::runtime_error ranks_out_of_step(long long step, Comm& comm, double micro, double collectives) {
    const int n = comm.size();
    DeviceBuffer<double> all(2 * size_t(n), MemoryCategory::workspace);
    const double mine[2] = {micro, collectives};
    CUDA_CHECK(cudaMemcpy(all.get() + 2 * comm.rank(), mine, sizeof mine, cudaMemcpyHostToDevice));
    comm.all_gather(all.get() + 2 * comm.rank(), all.get(), 2);
    comm.synchronize();
    std::vector<double> figures(2 * size_t(n));
    CUDA_CHECK(cudaMemcpy(figures.data(), all.get(), all.bytes(), cudaMemcpyDeviceToHost));
    int first = 1;
    while (first < n && figures[2 * size_t(first)] == figures[0] && figures[2 * size_t(first) + 1] == figures[1])
        ++first;
    if (first == n) first = n - 1;  // (cannot happen: the sums differed)
    char line[400];
    std::snprintf(line, sizeof line,
                  "step %lld: the ranks are out of step: rank %d ran %.0f micro-batch(es) and %.0f collective(s) since "
                  "the previous step, rank 0 ran %.0f and %.0f; every rank must run the same (a rank-dependent branch "
                  "or data loader), or the collectives pair up wrongly and NCCL hangs or mixes data",
                  step, first, figures[2 * size_t(first)], figures[2 * size_t(first) + 1], figures[0], figures[1]);
    return std::runtime_error(line);
}

// Writes +inf into this rank's first element of HF tensor `tensor`'s reduced gradient that counts
// in the norm (POLEVAULT_TEST_INJECT_NONFINITE), on the compute stream after the gradients are
// complete.
template <class T, class G>
void inject_nonfinite_gradient(Strategy<T, G>& s, const std::string& tensor) {
    static const G inf = [] {  // outlives the asynchronous copy
        if constexpr (std::is_same_v<G, __nv_bfloat16>)
            return __float2bfloat16(std::numeric_limits<float>::infinity());
        else
            return G(std::numeric_limits<float>::infinity());
    }();
    Llama<T>& m = s.model();
    for (int u = 0; u < m.num_units(); ++u)
        for (const GroupPart& p : group_parts(m.trainable(u))) {
            if (p.name != tensor) continue;
            const long long lo = s.slice_begin(u), hi = lo + s.slice_len(u);
            const long long b = std::max(p.begin, lo), e = std::min(p.end, hi);
            if (!m.holds(u) || !s.counts_in_norm(u) || b >= e)
                throw std::invalid_argument("POLEVAULT_TEST_INJECT_NONFINITE: " + tensor +
                                            " has no gradient element in this rank's slice; name a tensor of it");
            CUDA_CHECK(cudaMemcpyAsync(const_cast<G*>(s.slice_grads(u)) + (b - lo), &inf, sizeof(G),
                                       cudaMemcpyHostToDevice, m.stream()));
            return;
        }
    throw std::invalid_argument("POLEVAULT_TEST_INJECT_NONFINITE: no trainable tensor " + tensor);
}

// Where a step's non-finite norm comes from (the failure path; collective over the norm's ranks,
// every rank calls it with the same global figures): "the first non-finite gradient is in unit U,
// tensor NAME", or that every gradient is finite (the loss alone is not).
template <class T, class G>
std::string nonfinite_gradient_source(Strategy<T, G>& s, const double* device_unit_norms_sq) {
    Llama<T>& m = s.model();
    std::vector<double> units(size_t(m.num_units()));
    CUDA_CHECK(cudaMemcpyAsync(units.data(), device_unit_norms_sq, units.size() * sizeof(double),
                               cudaMemcpyDeviceToHost, m.stream()));
    wait_polling(m.stream(), s.comms());
    for (int u = 0; u < m.num_units(); ++u) {
        if (std::isfinite(units[size_t(u)])) continue;
        const std::vector<GroupPart> parts = group_parts(m.trainable(u));
        std::vector<std::pair<long long, long long>> ranges;
        for (const GroupPart& p : parts) ranges.emplace_back(p.begin, p.end);
        const std::vector<double> norms = s.range_norms_sq(u, ranges);
        for (size_t k = 0; k < parts.size(); ++k)
            if (!std::isfinite(norms[k]))
                return "the first non-finite gradient is in unit " + std::to_string(u) + ", tensor " + parts[k].name;
        return "the first non-finite gradient is in unit " + std::to_string(u);
    }
    return "every gradient is finite";
}

// The encoding of a non-finite update's first element (header comment); kNoBadUpdate: none.
inline constexpr long long kNoBadUpdate = LLONG_MAX;
inline long long encode_bad_update(int unit, long long group_element) {
    return (static_cast<long long>(unit) << 40) + group_element;
}

// "unit U (NAME element I)" of an encoded first bad element.
template <class T, class G>
std::string bad_update_place(Strategy<T, G>& s, long long encoded) {
    const int u = int(encoded >> 40);
    const long long element = encoded & ((1LL << 40) - 1);
    return "unit " + std::to_string(u) + ", " + group_element_name(s.model().trainable(u), element);
}

// The minimum of `encoded` over the ranks of `comm` (collective; every rank calls it).
inline long long min_over_ranks(long long encoded, Comm& comm, cudaStream_t stream, const std::vector<Comm*>& comms) {
    DeviceBuffer<long long> v(2, MemoryCategory::workspace);
    long long out = encoded;
    CUDA_CHECK(cudaMemcpyAsync(v.get(), &out, sizeof out, cudaMemcpyHostToDevice, stream));
    comm.fence_from(stream);
    comm.all_reduce(v.get(), v.get() + 1, 1, ncclMin);
    comm.fence_to(stream);
    CUDA_CHECK(cudaMemcpyAsync(&out, v.get() + 1, sizeof out, cudaMemcpyDeviceToHost, stream));
    wait_polling(stream, comms);
    return out;
}

}  // namespace pv
