// The parallel strategies against one rank (DESIGN.md §5 "Parity", "Counting"), in-process under
// `mpirun -np 2` and `-np 4`: every rank runs the strategy on the world communicator, and rank 0
// the single-rank reference, on the same global batches, which it sends every rank
// (train_single_once). The model is the awkward case: GQA (3 query heads per KV head), tied
// embeddings, odd sizes (hidden 33, attention width 3 × 10, ffn 35) and vocab 4N + 1 so no group divides by
// the world size without padding, accumulation 2, and ignored targets spread unevenly over ranks
// (some ranks' micro-batches are mostly ignored). Model parallelism (mp) runs the whole global
// batch through a pipeline of stages instead, with 1 or 4 micro-batches in flight. One case packs
// documents (positions restarting inside each sequence, attention within each document).
#include <catch2/catch.hpp>

#include "data/loader.h"
#include "platform/device_memory.h"
#include "model/llama.h"
#include "optim/optimizer.cuh"
#include "parallel/comm_cost.h"
#include "parallel/memory.h"
#include "parallel/stages.h"
#include "parallel/strategies.h"
#include "trainer/compute_stream.h"
#include "trainer/trainer.h"
#include "parallel/world.h"
#include "test/mpi/awkward_model.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <array>
#include <map>
#include <memory>
#include <set>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <tuple>
#include <vector>

namespace parallel_test {

using pv::DataLoader;

using pv::test::awkward_model;

constexpr int kMicro = 2, kAccumulation = 2, kSeq = 8, kSteps = 5;

// Sample g of step s: random tokens; targets partly ignored, more on some samples than others, so
// ranks count different numbers of tokens. With `documents`, the same tokens and targets pack
// documents: a new one starts at each row with probability 1/3 (positions restart at 0).
DataLoader::MicroBatch sample(long long step, int g, int vocab, bool documents) {
    std::mt19937_64 rng(uint64_t(step) * 1000003u + uint64_t(g)), cuts(uint64_t(g) * 7919u + uint64_t(step));
    DataLoader::MicroBatch b;
    const double ignored = g % 3 == 0 ? 0.8 : g % 3 == 1 ? 0.1 : 0.0;
    for (int i = 0; i < kSeq; ++i) {
        b.inputs.push_back(int(rng() % uint64_t(vocab)));
        const bool skip = std::uniform_real_distribution<double>(0, 1)(rng) < ignored;
        b.targets.push_back(skip ? pv::kIgnoreIndex : int(rng() % uint64_t(vocab)));
        if (documents) b.positions.push_back(i == 0 || cuts() % 3 == 0 ? 0 : b.positions.back() + 1);
    }
    return b;
}

// Concatenates samples into micro-batches of kMicro sequences.
std::vector<DataLoader::MicroBatch> micro_batches(long long step, int first, int count, int vocab, bool documents) {
    std::vector<DataLoader::MicroBatch> out;
    for (int g = first; g < first + count; g += kMicro) {
        DataLoader::MicroBatch m;
        m.first_sample = g;  // keys LoRA's dropout by global row, as the loader does
        for (int k = 0; k < kMicro; ++k) {
            const auto s = sample(step, g + k, vocab, documents);
            m.inputs.insert(m.inputs.end(), s.inputs.begin(), s.inputs.end());
            m.targets.insert(m.targets.end(), s.targets.begin(), s.targets.end());
            m.positions.insert(m.positions.end(), s.positions.begin(), s.positions.end());
        }
        out.push_back(std::move(m));
    }
    return out;
}

struct RunResult {
    std::vector<double> losses;
    std::vector<std::string> schedule;                              // mp: per step, this rank's F/B order (see below)
    std::vector<int> stages;                                        // mp: the stage boundaries
    std::map<std::string, std::vector<double>> tensors;             // every tensor, unpadded, as double
    std::vector<pv::Comm::Totals> per_step;                         // collectives of each step
    std::vector<std::map<std::string, pv::Comm::Totals>> per_comm;  // and by communicator
    std::vector<std::vector<pv::CollectiveRecord>> logs;            // and their records
    long long psi = 0;                   // Σ padded trainable group elements (Ψ with padding)
    long long psi_frozen = 0;            // Σ padded frozen group elements
    std::vector<long long> padded;       // per unit, its trainable group
    std::vector<long long> unit_padded;  // per unit, all its groups
    std::vector<int> nonempty;           // per unit, groups with any element
    int units = 0;
    std::array<double, pv::kMemoryCategoryCount> peak{};  // peak bytes per category during the run
    long long captured = 0, launched = 0;                 // --cuda-graphs: graphs captured and launches
};

template <class T>
std::vector<double> download(const T* p, long long n) {
    std::vector<T> host(static_cast<size_t>(n));
    CUDA_CHECK(cudaMemcpy(host.data(), p, host.size() * sizeof(T), cudaMemcpyDeviceToHost));
    std::vector<double> out;
    for (const T& v : host) out.push_back(double(pv::to_acc(v)));
    return out;
}

// The order of a pipeline stage's forwards (F) and backwards (B) in a step, from the transfers
// it made: each micro-batch's forward is one send to the next stage (the last stage: one receive
// from the previous), its backward one send to the previous stage (the first: one receive from the
// next).
std::string pipeline_order(const std::vector<pv::CollectiveRecord>& log, int rank, int ranks) {
    std::string out;
    using K = pv::CollectiveKind;
    for (const pv::CollectiveRecord& c : log) {
        const bool forward =
            rank + 1 < ranks ? c.kind == K::send && c.peer == rank + 1 : c.kind == K::recv && c.peer == rank - 1;
        const bool backward =
            rank > 0 ? c.kind == K::send && c.peer == rank - 1 : c.kind == K::recv && c.peer == rank + 1;
        if (forward) out += 'F';
        if (backward) out += 'B';
    }
    return out;
}

struct Options {
    Options(int accumulation_ = kAccumulation, int microbatches_ = 1, bool tied_ = true,
            std::set<std::string> frozen_ = {}, bool documents_ = false)
        : accumulation(accumulation_),
          microbatches(microbatches_),
          tied(tied_),
          frozen(std::move(frozen_)),
          documents(documents_) {}
    int accumulation;
    int microbatches;  // mp: micro-batches in flight (0: the schedule's own)
    pv::PipelineScheduleKind pipeline = pv::PipelineScheduleKind::gpipe;  // mp
    bool tied;
    std::set<std::string> frozen;               // tensors in frozen groups (polevault names)
    bool documents;                             // packed documents (sample)
    pv::LoraConfig lora;                        // adapters on a frozen base (off by default)
    bool nf4 = false;                           // QLoRA: the base's block linears in NF4
    pv::ActivationCheckpointing checkpointing;  // off by default
    int shard_group = 0;                        // zero1-3: --shard-group (0: the whole world)
    int steps = kSteps;
    pv::Offload offload = pv::Offload::none;  // --offload
    int chunks = 1;  // mp: model chunks per rank (> 1: the interleaved schedule, over a model of p·V blocks)
    int stages = 0;  // ddp, zero1: --pipeline-stages (each stage replicated over ranks / stages)
    bool graphs = false;  // --cuda-graphs: every micro-step captured once, then launched as a graph
};

// The blocks of the model a run of `o` trains on `ranks` ranks: two, or a stage per chunk.
int layers_of(const Options& o, int ranks) { return o.chunks > 1 ? ranks * o.chunks : 2; }

// LoRA on most modules with dropout: rank 3 (so adapter groups need padding), k_proj and
// gate_proj left out (a fused linear with some parts adapted).
Options lora_options() {
    Options o;
    o.lora.rank = 3, o.lora.alpha = 6, o.lora.dropout = 0.2;
    o.lora.targets = {"q_proj", "v_proj", "o_proj", "up_proj", "down_proj"};
    return o;
}

// Frozen tensors that leave the tied embedding with nothing to train, split a block between a
// trainable and a frozen group, and freeze a fused matrix.
const std::set<std::string> kFrozen = {"wte", "layers.0.attn_norm", "layers.1.w_gate_up"};

// The activation slots stage r of p needs, from the schedules' definitions (parallel/schedule.h):
// GPipe holds its group of K (every micro-batch of the step without a cap), 1F1B at most p − r.
int pipeline_slots(const Options& o, int p, int r) {
    const int micro = o.accumulation * p, cap = o.microbatches > 0 ? o.microbatches : micro;
    if (o.pipeline == pv::PipelineScheduleKind::gpipe) return std::min(cap, micro);
    return std::min({p - r, micro, cap});
}

// Trains kSteps steps of the global batch (kMicro × accumulation × world_ranks sequences) with
// `strategy` ("single", "ddp", "zero1", "zero2", "zero3", "mp") on `comm` (null: single on one
// rank, all of the batch) on this rank. Data-parallel ranks take slice r of the batch; mp stages
// all of it.
template <class T, class G = T>
RunResult train_here(const std::string& strategy, pv::Comm* comm, int world_ranks, Options opt) {
    pv::Comm::keep_records(true);  // the per-call records this suite reads
    const pv::LlamaConfig config = awkward_model(world_ranks, opt.tied, layers_of(opt, world_ranks));
    const int ranks = comm ? comm->size() : 1, rank = comm ? comm->rank() : 0;
    const bool mp = strategy == "mp", piped = mp || opt.stages > 1;  // a pipeline (alone, or under ddp/zero1)
    const int stages = mp ? ranks : std::max(1, opt.stages), data_ranks = mp ? 1 : ranks / stages;
    int data_rank = 0;
    const pv::MemoryStats before = pv::memory_stats();
    pv::reset_memory_peaks();
    RunResult r;
    {
        pv::StrategyOptions so;
        so.kind = pv::strategy_kind(strategy), so.in_flight = piped ? opt.microbatches : 0, so.fp32_grad_accumulation = !std::is_same_v<G, T>;
        so.pipeline = opt.pipeline, so.micro_per_step = opt.accumulation * (piped ? world_ranks / data_ranks : 1);
        so.chunks = piped ? opt.chunks : 1;
        so.pipeline_stages = mp ? 0 : opt.stages;
        so.shard_group = opt.shard_group;
        so.offload = opt.offload;
        const pv::StrategyPlan plan = pv::plan_strategy(so, config, kSeq, rank, ranks);
        r.stages = plan.stage_bounds;
        data_rank = plan.data_rank;
        pv::ModelOptions mo;
        mo.batch = kMicro, mo.seq_len = kSeq, mo.seed = 42, mo.frozen = opt.frozen, mo.placement = plan.placement;
        mo.lora = opt.lora;
        mo.nf4 = opt.nf4;
        mo.checkpointing = opt.checkpointing;
        if (opt.graphs) mo.cublas_workspace_bytes = pv::kCublasGraphWorkspaceBytes;
        pv::ComputeStream stream;  // as train computes: not on the legacy default stream
        mo.stream = stream.get();
        pv::Llama<T> model(config, mo);
        std::unique_ptr<pv::Strategy<T, G>> s = pv::make_strategy<T, G>(plan, model, comm, 42);
        auto optimizer = pv::Trainer<T, G>::make_optimizer(*s, opt.offload != pv::Offload::none);
        pv::Trainer<T, G> trainer(*s, *optimizer);
        if (opt.graphs) trainer.use_graphs();
        pv::AdamWSettings adamw;
        adamw.weight_decay = 0.1;
        adamw.seed = 7;
        const int global = kMicro * opt.accumulation * world_ranks, per_rank = global / data_ranks;
        for (long long step = 0; step < opt.steps; ++step) {
            for (pv::Comm* c : s->comms()) c->clear_log();
            const auto micro = micro_batches(step, data_rank * per_rank, per_rank, config.vocab_size, opt.documents);
            const pv::StepResult res = trainer.step(micro, 3e-3, step + 1, 1.0, adamw);
            r.losses.push_back(res.loss);
            if (!comm) continue;
            pv::Comm::Totals all;  // over every communicator of the strategy
            r.per_comm.emplace_back();
            for (pv::Comm* c : s->comms()) {
                const pv::Comm::Totals t = c->totals();
                r.per_comm.back()[c->name()] = t;
                for (size_t k = 0; k < all.calls.size(); ++k) all.calls[k] += t.calls[k];
                all.wire_bytes += t.wire_bytes;
            }
            r.per_step.push_back(all), r.logs.push_back(comm->log());
            if (mp) r.schedule.push_back(pipeline_order(comm->log(), rank, ranks));
        }
        if (const auto* graphs = trainer.graphs())
            r.captured = (long long)graphs->captured(), r.launched = graphs->launches();
        s->settle_parameters();  // the last step's parameter all-gathers, before reading them here
        for (int u = 0; u < model.num_units(); ++u)
            for (int g = 0; g < model.num_groups(u); ++g) {
                if (model.group(u, g).kind == pv::GroupKind::nf4) continue;  // packed codes, not values
                // ZeRO-3 holds slices: gather the group whole first (within the stage holding it);
                // a pipeline: that stage's first data-parallel rank broadcasts it.
                const long long padded = model.group(u, g).padded;
                std::unique_ptr<pv::DeviceBuffer<T>> whole;
                const T* params = model.group_params(u, g);
                const bool sharded = strategy == "zero3";
                if ((sharded || piped) && padded > 0) {
                    whole = std::make_unique<pv::DeviceBuffer<T>>(size_t(padded), pv::MemoryCategory::workspace);
                    if (sharded && model.holds(u)) {  // over its shard group (the world without groups)
                        const T* slice = s->local_params(u, g);
                        pv::DeviceBuffer<T> staged;  // --offload params: the slice is host memory
                        if (s->params_on_host()) {
                            staged = pv::DeviceBuffer<T>(size_t(s->local_len(u, g)), pv::MemoryCategory::workspace);
                            CUDA_CHECK(cudaMemcpy(staged.get(), slice, staged.bytes(), cudaMemcpyHostToDevice));
                            slice = staged.get();
                        }
                        s->shard_comm()->all_gather(slice, whole->get(), size_t(s->local_len(u, g)));
                        CUDA_CHECK(cudaStreamSynchronize(s->shard_comm()->stream()));
                    } else if (model.holds(u)) {
                        CUDA_CHECK(cudaMemcpy(whole->get(), params, whole->bytes(), cudaMemcpyDeviceToDevice));
                    }
                    if (piped) {
                        // Stage s runs on pipeline rank s mod p, whose first data-parallel rank is world rank (s mod p)·dp.
                        const int owner = pv::unit_stages(r.stages)[size_t(u)] % stages * data_ranks;
                        comm->broadcast(whole->get(), whole->get(), whole->size(), owner);
                        CUDA_CHECK(cudaStreamSynchronize(comm->stream()));
                    }
                    params = whole->get();
                }
                for (const pv::TensorSlot& t : model.group(u, g).tensors)
                    r.tensors[t.spec.name] = download(params + t.offset, t.spec.numel());
            }
        for (int u = 0; u < model.num_units(); ++u) {
            r.psi += model.trainable(u).padded, r.padded.push_back(model.trainable(u).padded);
            long long all = 0;
            int nonempty = 0;
            for (int g = 0; g < model.num_groups(u); ++g)
                all += model.group(u, g).padded, nonempty += model.group(u, g).padded > 0;
            r.psi_frozen += all - model.trainable(u).padded;
            r.unit_padded.push_back(all), r.nonempty.push_back(nonempty);
        }
        r.units = model.num_units();
        const pv::MemoryStats after = pv::memory_stats();
        for (int c = 0; c < pv::kMemoryCategoryCount; ++c)
            r.peak[size_t(c)] = double(after.peak[size_t(c)]) - double(before.current[size_t(c)]);
    }
    return r;
}

// A RunResult of a single-rank run (no collectives: no per-step records, schedule or logs) as
// bytes, and back.
class Packer {
  public:
    template <class X>
    void put(const X& x) {
        static_assert(std::is_trivially_copyable_v<X>);
        const auto* p = reinterpret_cast<const char*>(&x);
        bytes.insert(bytes.end(), p, p + sizeof(X));
    }
    template <class X>
    void put(const std::vector<X>& v) {
        put(v.size());
        for (const X& x : v) put(x);
    }
    void put(const std::string& text) { put(std::vector<char>(text.begin(), text.end())); }
    template <class X>
    void get(X& x) {
        static_assert(std::is_trivially_copyable_v<X>);
        std::memcpy(&x, bytes.data() + at, sizeof(X));
        at += sizeof(X);
    }
    template <class X>
    void get(std::vector<X>& v) {
        size_t n = 0;
        get(n);
        v.resize(n);
        for (X& x : v) get(x);
    }
    void get(std::string& text) {
        std::vector<char> chars;
        get(chars);
        text.assign(chars.begin(), chars.end());
    }
    std::vector<char> bytes;
    size_t at = 0;
};

// The single-rank run, made once: world rank 0 trains and broadcasts what it got. Every rank would
// compute the same bits (the same batches, seeds and code), and the reference is all of the batch
// on one rank: most of a test case's work at 4 ranks, where each strategy's rank has a quarter.
template <class T, class G>
RunResult train_single_once(int world_ranks, const Options& opt) {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    RunResult r;
    Packer p;
    if (rank == 0) {
        r = train_here<T, G>("single", nullptr, world_ranks, opt);
        REQUIRE((r.per_step.empty() && r.per_comm.empty() && r.logs.empty() && r.schedule.empty()));
        p.put(r.losses), p.put(r.stages), p.put(r.psi), p.put(r.psi_frozen), p.put(r.padded);
        p.put(r.unit_padded), p.put(r.nonempty), p.put(r.units), p.put(r.peak), p.put(r.tensors.size());
        for (const auto& [name, values] : r.tensors) p.put(name), p.put(values);
    }
    CUDA_CHECK(cudaDeviceSynchronize());  // no NCCL work queued while the host blocks in MPI (host/nccl.cpp)
    // The other ranks wait while rank 0 trains: asleep between polls, so that the cores are rank
    // 0's (MPI_Bcast would spin, and at 4 ranks on 2 cores three spinning ranks slow it down).
    auto broadcast = [](void* data, size_t bytes) {
        MPI_Request request;
        MPI_Ibcast(data, int(bytes), MPI_BYTE, 0, MPI_COMM_WORLD, &request);
        for (int done = 0;;) {
            MPI_Test(&request, &done, MPI_STATUS_IGNORE);
            if (done) return;
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
    };
    size_t n = p.bytes.size();
    broadcast(&n, sizeof n);
    p.bytes.resize(n);
    broadcast(p.bytes.data(), n);
    if (rank == 0) return r;
    p.get(r.losses), p.get(r.stages), p.get(r.psi), p.get(r.psi_frozen), p.get(r.padded);
    p.get(r.unit_padded), p.get(r.nonempty), p.get(r.units), p.get(r.peak);
    size_t tensors = 0;
    p.get(tensors);
    for (size_t i = 0; i < tensors; ++i) {
        std::string name;
        p.get(name);
        p.get(r.tensors[name]);
    }
    REQUIRE(p.at == n);
    return r;
}

// train_here, with the single-rank run made once for every rank (train_single_once).
template <class T, class G = T>
RunResult train(const std::string& strategy, pv::Comm* comm, int world_ranks, Options opt = {}) {
    if (!comm && strategy == "single") return train_single_once<T, G>(world_ranks, opt);
    return train_here<T, G>(strategy, comm, world_ranks, opt);
}

double relative_norm_error(const std::vector<double>& x, const std::vector<double>& ref) {
    double d = 0, n = 0;
    for (size_t i = 0; i < x.size(); ++i) d += (x[i] - ref[i]) * (x[i] - ref[i]), n += ref[i] * ref[i];
    return std::sqrt(d) / std::max(std::sqrt(n), 1e-300);
}

// The single-rank reference on this rank's own communicator.
template <class T>
RunResult reference(pv::World& world, Options opt = {}) {
    return train<T>("single", nullptr, world.size(), opt);
}

// Frozen tensors of the untied model: the whole head (the last stage of a pipeline then has
// nothing to train) and one matrix of a block.
const std::set<std::string> kFrozenUntied = {"final_norm", "lm_head", "layers.0.w_o"};

// Every tensor of the model training starts from (frozen or not, the same values: initialisation
// is keyed by tensor and element, not by group), whole, as double.
std::map<std::string, std::vector<double>> initial_tensors(const pv::LlamaConfig& config) {
    pv::Llama<double> initial(config, pv::whole_model(kMicro, kSeq, 42, pv::Gradients::none));
    std::map<std::string, std::vector<double>> out;
    for (const pv::UnitSpec& unit : pv::model_units(config))
        for (const pv::TensorSpec& t : unit.tensors) out[t.name] = download(initial.tensor(t.name), t.numel());
    return out;
}

// After training: every frozen tensor bit-identical to its initial value, every other one moved
// (parity of untouched weights would prove nothing).
void check_frozen(const RunResult& r, const std::map<std::string, std::vector<double>>& initial,
                  const std::set<std::string>& frozen) {
    CHECK(r.tensors.size() == initial.size());
    for (const auto& [name, init] : initial) {
        INFO(name << (frozen.count(name) ? " (frozen)" : " (trainable)"));
        if (frozen.count(name))
            CHECK(r.tensors.at(name) == init);
        else
            CHECK(relative_norm_error(init, r.tensors.at(name)) > 1e-4);
    }
}

// ", frozen a + b + c (psi_frozen N)" (nothing without frozen tensors), for the figures printed
// for docs/parallel-training.md.
std::string frozen_label(const std::set<std::string>& frozen, long long psi_frozen) {
    if (frozen.empty()) return "";
    std::string names;
    for (const std::string& name : frozen) names += (names.empty() ? "" : " + ") + name;
    return ", frozen " + names + " (psi_frozen " + std::to_string(psi_frozen) + ")";
}

}  // namespace parallel_test

using namespace parallel_test;

namespace parallel_test {

// Every loss within `tol` (relative) of the reference's and every tensor within `tol` (relative,
// norm-wise); and the same bits.
void check_close(const RunResult& got, const RunResult& ref, double tol = 1e-10) {
    REQUIRE(got.losses.size() == ref.losses.size());
    for (size_t s = 0; s < ref.losses.size(); ++s) {
        INFO("step " << s + 1 << ": reference " << ref.losses[s] << ", got " << got.losses[s]);
        CHECK(std::abs(got.losses[s] - ref.losses[s]) <= tol * std::abs(ref.losses[s]));
    }
    for (const auto& [name, t] : ref.tensors) {
        INFO(name);
        CHECK(relative_norm_error(got.tensors.at(name), t) <= tol);
    }
}

void check_identical(const RunResult& got, const RunResult& ref) {
    CHECK(got.losses == ref.losses);
    for (const auto& [name, t] : ref.tensors) {
        INFO(name);
        CHECK(got.tensors.at(name) == t);
    }
}

// fp64 parity of the data-parallel strategies with single: losses and every tensor within 1e-10,
// zero1 bit-identical to ddp.
void check_data_parallel_parity(const RunResult& single, const RunResult& ddp, const RunResult& zero1,
                                const RunResult& zero2, const RunResult& zero3) {
    REQUIRE(single.losses.size() == size_t(kSteps));
    check_close(ddp, single);
    check_identical(zero1, ddp);
    check_close(zero2, single);
    check_close(zero3, single);
}

}  // namespace parallel_test

TEST_CASE("ddp and zero1-3 train the model single trains: fp64 within 1e-10, zero1 bit-identical to ddp",
          "[parallel][parity]") {
    pv::World world(nullptr, nullptr);  // the world communicator, per test case (MPI is already up)
    const RunResult single = reference<double>(world);
    const RunResult ddp = train<double>("ddp", &world.comm(), world.size());
    const RunResult zero1 = train<double>("zero1", &world.comm(), world.size());
    const RunResult zero2 = train<double>("zero2", &world.comm(), world.size());
    const RunResult zero3 = train<double>("zero3", &world.comm(), world.size());
    check_data_parallel_parity(single, ddp, zero1, zero2, zero3);
    // Training moved every tensor (parity of untouched weights would prove nothing).
    pv::Llama<double> initial(awkward_model(world.size()), pv::whole_model(kMicro, kSeq, 42, pv::Gradients::none));
    for (int u = 0; u < initial.num_units(); ++u)
        for (const pv::TensorSlot& t : initial.trainable(u).tensors) {
            INFO(t.spec.name);
            CHECK(relative_norm_error(download(initial.params(u) + t.offset, t.spec.numel()),
                                      single.tensors.at(t.spec.name)) > 1e-4);
        }
}

// Packed documents reach every strategy's units (the trainer uploads each slot's positions): ddp,
// zero2 and mp with two micro-batches in flight (two slots' positions at once) train what single
// trains, and the documents change the run on the same tokens (positions that never arrived
// would leave it causal).
TEST_CASE("with packed documents ddp, zero2 and mp train the model single trains: fp64 within 1e-10",
          "[parallel][parity][documents]") {
    pv::World world(nullptr, nullptr);
    const Options docs{kAccumulation, 1, true, {}, true};
    const RunResult causal = reference<double>(world);
    const RunResult single = reference<double>(world, docs);
    for (size_t s = 0; s < single.losses.size(); ++s) CHECK(single.losses[s] != causal.losses[s]);
    check_close(train<double>("ddp", &world.comm(), world.size(), docs), single);
    check_close(train<double>("zero2", &world.comm(), world.size(), docs), single);
    check_close(train<double>("mp", &world.comm(), world.size(), Options{kAccumulation, 2, true, {}, true}), single);
}

// With accumulation 1 ZeRO-2 and ZeRO-3 sum exactly DDP's terms (ZeRO-3's gathered parameters are
// DDP's, updated slice by slice) (one reduce-scatter of the same buffer
// per unit, nothing added to a zero slice changes it), so the bits must agree; with accumulation 2
// it reduces each micro-step before summing them, which DDP does the other way round.
TEST_CASE("zero2 and zero3 with accumulation 1 are bit-identical to ddp", "[parallel][parity]") {
    pv::World world(nullptr, nullptr);
    const Options once{1};
    const RunResult ddp = train<double>("ddp", &world.comm(), world.size(), once);
    const RunResult zero2 = train<double>("zero2", &world.comm(), world.size(), once);
    const RunResult zero3 = train<double>("zero3", &world.comm(), world.size(), once);
    check_identical(zero2, ddp);
    check_identical(zero3, ddp);
    const RunResult ddp16 = train<__nv_bfloat16>("ddp", &world.comm(), world.size(), once);
    const RunResult zero216 = train<__nv_bfloat16>("zero2", &world.comm(), world.size(), once);
    CHECK(zero216.losses == ddp16.losses);
}

TEST_CASE("bf16 ddp, zero1 and zero2 losses stay within 1e-2 of single, fp32 gradient accumulation too",
          "[parallel][parity]") {
    pv::World world(nullptr, nullptr);
    const RunResult single = reference<__nv_bfloat16>(world);
    const RunResult ddp = train<__nv_bfloat16>("ddp", &world.comm(), world.size());
    const RunResult zero1 = train<__nv_bfloat16, float>("zero1", &world.comm(), world.size());
    const RunResult ddp32 = train<__nv_bfloat16, float>("ddp", &world.comm(), world.size());
    const RunResult zero2 = train<__nv_bfloat16>("zero2", &world.comm(), world.size());
    const RunResult zero3 = train<__nv_bfloat16>("zero3", &world.comm(), world.size());
    for (int s = 0; s < kSteps; ++s) {
        INFO("step " << s + 1);
        CHECK(std::abs(ddp.losses[size_t(s)] - single.losses[size_t(s)]) <= 1e-2 * std::abs(single.losses[size_t(s)]));
        CHECK(std::abs(zero1.losses[size_t(s)] - single.losses[size_t(s)]) <=
              1e-2 * std::abs(single.losses[size_t(s)]));
        CHECK(zero1.losses[size_t(s)] == ddp32.losses[size_t(s)]);
        CHECK(std::abs(zero2.losses[size_t(s)] - single.losses[size_t(s)]) <=
              1e-2 * std::abs(single.losses[size_t(s)]));
        CHECK(std::abs(zero3.losses[size_t(s)] - single.losses[size_t(s)]) <=
              1e-2 * std::abs(single.losses[size_t(s)]));
    }
}

TEST_CASE(
    "mp trains the model single trains, with 1 and 4 micro-batches in flight: fp64 within 1e-10, untied "
    "bit-identical, bf16 within 1e-2",
    "[parallel][parity][mp]") {
    pv::World world(nullptr, nullptr);
    const RunResult single = reference<double>(world);
    const RunResult single_untied = reference<double>(world, Options{kAccumulation, 1, false});
    for (int m : {1, 4}) {
        INFO("micro-batches in flight: " << m);
        const RunResult mp = train<double>("mp", &world.comm(), world.size(), Options{kAccumulation, m});
        check_close(mp, single);
        // Untied, every stage computes what single computes, in the same order: the same bits.
        const RunResult untied = train<double>("mp", &world.comm(), world.size(), Options{kAccumulation, m, false});
        check_identical(untied, single_untied);
    }
    const RunResult single16 = reference<__nv_bfloat16>(world);
    const RunResult mp16 = train<__nv_bfloat16>("mp", &world.comm(), world.size(), Options{kAccumulation, 4});
    const RunResult mp16_32 = train<__nv_bfloat16, float>("mp", &world.comm(), world.size(), Options{kAccumulation, 4});
    for (int s = 0; s < kSteps; ++s) {
        INFO("step " << s + 1);
        CHECK(std::abs(mp16.losses[size_t(s)] - single16.losses[size_t(s)]) <=
              1e-2 * std::abs(single16.losses[size_t(s)]));
        CHECK(std::abs(mp16_32.losses[size_t(s)] - single16.losses[size_t(s)]) <=
              1e-2 * std::abs(single16.losses[size_t(s)]));
    }
}

// Frozen tensors (model/parameters.h: a unit's trainable group, then its frozen group) are never
// reduced or updated, so every strategy trains what single trains and leaves them at their
// initial values. kFrozen leaves the tied embedding with an empty trainable group: no bucket,
// reduce-scatter or all-gather for it (ZeRO-3 still gathers its frozen wte for the forward).
TEST_CASE(
    "ddp and zero1-3 with frozen tensors train the model single trains: fp64 within 1e-10, zero1 "
    "bit-identical to ddp, frozen tensors untouched",
    "[parallel][freeze]") {
    pv::World world(nullptr, nullptr);
    const Options opt{kAccumulation, 1, true, kFrozen};
    const RunResult single = reference<double>(world, opt);
    const RunResult ddp = train<double>("ddp", &world.comm(), world.size(), opt);
    const RunResult zero1 = train<double>("zero1", &world.comm(), world.size(), opt);
    const RunResult zero2 = train<double>("zero2", &world.comm(), world.size(), opt);
    const RunResult zero3 = train<double>("zero3", &world.comm(), world.size(), opt);
    // The layout kFrozen promises: the embedding has nothing to train, each block a trainable
    // and a frozen group, the head only a trainable one.
    REQUIRE(ddp.padded.front() == 0);
    REQUIRE(ddp.nonempty == std::vector<int>{1, 2, 2, 1});
    REQUIRE(ddp.psi_frozen > 0);
    check_data_parallel_parity(single, ddp, zero1, zero2, zero3);
    const auto initial = initial_tensors(awkward_model(world.size()));
    const std::vector<std::pair<std::string, const RunResult*>> runs = {
        {"single", &single}, {"ddp", &ddp}, {"zero1", &zero1}, {"zero2", &zero2}, {"zero3", &zero3}};
    for (const auto& [strategy, r] : runs) {
        INFO(strategy);
        check_frozen(*r, initial, kFrozen);
    }
}

// (Catch2 v2's console reporter aborts printing a failure under a test case name whose first ": "
// lies beyond its 79 columns: keep it early in these long names.)
TEST_CASE(
    "mp with frozen tensors trains the model single trains: 1 and 4 micro-batches in flight, fp64 within "
    "1e-10, untied (1 in flight) bit-identical, frozen tensors untouched",
    "[parallel][freeze][mp]") {
    pv::World world(nullptr, nullptr);
    const RunResult single = reference<double>(world, Options{kAccumulation, 1, true, kFrozen});
    const RunResult single_untied = reference<double>(world, Options{kAccumulation, 1, false, kFrozenUntied});
    const auto initial = initial_tensors(awkward_model(world.size()));
    const auto initial_untied = initial_tensors(awkward_model(world.size(), false));
    check_frozen(single, initial, kFrozen);
    check_frozen(single_untied, initial_untied, kFrozenUntied);
    for (int m : {1, 4}) {
        INFO("micro-batches in flight: " << m);
        const RunResult mp = train<double>("mp", &world.comm(), world.size(), Options{kAccumulation, m, true, kFrozen});
        check_close(mp, single);
        check_frozen(mp, initial, kFrozen);
    }
    // Untied, every stage computes what single computes, in the same order: the same bits (the
    // last stage, the head, has nothing to train).
    const RunResult untied =
        train<double>("mp", &world.comm(), world.size(), Options{kAccumulation, 1, false, kFrozenUntied});
    check_identical(untied, single_untied);
    check_frozen(untied, initial_untied, kFrozenUntied);
}

// GPipe (parallel/pp.h): each group of M micro-batches runs M forwards, then M backwards, on every
// stage; M = 1 alternates. The order is read from each stage's own transfers.
TEST_CASE("mp runs the GPipe schedule: M forwards then M backwards per group, on every stage", "[parallel][mp]") {
    pv::World world(nullptr, nullptr);
    const int micro = kAccumulation * world.size();  // micro-batches per step: the whole global batch
    for (int m : {1, 2, 4}) {
        INFO("micro-batches in flight: " << m << ", rank " << world.rank());
        std::string expected;
        for (int g = 0; g < micro / m; ++g) expected += std::string(size_t(m), 'F') + std::string(size_t(m), 'B');
        const RunResult mp = train<double>("mp", &world.comm(), world.size(), Options{kAccumulation, m});
        REQUIRE(mp.schedule.size() == size_t(kSteps));
        for (const std::string& order : mp.schedule) CHECK(order == expected);
    }
}

// A pipeline runs its row of the table in order, each entry once (parallel/pp.h), and refuses by
// name before any transfer — so on every rank alike, no peer left waiting — a backward outside a
// step, a step that skips an entry and an entry out of the table's order. A refused step leaves
// nothing behind: a backward outside a step is refused as such again after each (an evaluation's
// forward, outside a step too, then receives inline), and two steps after the refusals train what
// a run without them trains, bit for bit.
TEST_CASE("mp refuses a backward outside a step, a skipped entry and one out of order; nothing is left behind",
          "[parallel][mp]") {
    pv::World world(nullptr, nullptr);
    const int ranks = world.size();
    Options o;
    o.steps = 2;
    const RunResult expected = train<double>("mp", &world.comm(), ranks, o);
    const pv::LlamaConfig config = awkward_model(ranks, o.tied, layers_of(o, ranks));
    pv::StrategyOptions so;
    so.kind = pv::strategy_kind("mp"), so.in_flight = o.microbatches, so.pipeline = o.pipeline;
    so.micro_per_step = o.accumulation * ranks;
    const pv::StrategyPlan plan = pv::plan_strategy(so, config, kSeq, world.rank(), ranks);
    pv::ModelOptions mo;
    mo.batch = kMicro, mo.seq_len = kSeq, mo.seed = 42, mo.placement = plan.placement;
    pv::ComputeStream stream;
    mo.stream = stream.get();
    pv::Llama<double> model(config, mo);
    std::unique_ptr<pv::Strategy<double, double>> s = pv::make_strategy<double, double>(plan, model, &world.comm(), 42);
    auto optimizer = pv::Trainer<double, double>::make_optimizer(*s, false);
    pv::Trainer<double, double> trainer(*s, *optimizer);

    const int micro = o.accumulation * ranks;
    const auto outside_refused = [&] {
        REQUIRE_THROWS_WITH(s->backward(0, pv::DeviceBatch{}, 1.0, true),
                            Catch::Contains("Pipeline::backward outside a step's schedule"));
    };
    const DataLoader::MicroBatch held_out = micro_batches(100, 0, kMicro, config.vocab_size, false).front();
    const double evaluated = trainer.forward_loss(held_out);
    REQUIRE(std::isfinite(evaluated));
    outside_refused();
    CHECK_THROWS_WITH(s->run_micro_steps(micro, [](const pv::PipeStep&, bool) {}),
                      Catch::Contains("entry 0 of the row ran no forward or backward") &&
                          Catch::Contains("must run each entry once"));
    outside_refused();
    // Every rank's row opens with a forward (of micro-batch 0, slot 0): a backward there is out of order.
    CHECK_THROWS_WITH(s->run_micro_steps(micro, [&](const pv::PipeStep& e,
                                                    bool last) { s->backward(e.slot, pv::DeviceBatch{}, 1.0, last); }),
                      Catch::Contains("a backward in buffer 0 out of the schedule's order (entry 0 of"));
    outside_refused();
    CHECK(trainer.forward_loss(held_out) == evaluated);  // its transfers inline, as before any step

    pv::AdamWSettings adamw;
    adamw.weight_decay = 0.1;
    adamw.seed = 7;
    std::vector<double> losses;
    for (long long step = 0; step < o.steps; ++step)
        losses.push_back(
            trainer.step(micro_batches(step, 0, kMicro * micro, config.vocab_size, false), 3e-3, step + 1, 1.0, adamw)
                .loss);
    CHECK(losses == expected.losses);
}

// 1F1B (parallel/schedule.h): stage r runs min(p − r − 1, M) warm-up forwards, then one forward
// and one backward in turn, then the remaining backwards — read from its own transfers — and
// trains what single trains: untied bit for bit, tied within 1e-10 (fp64), with and without a cap
// on the micro-batches in flight, and with LoRA (dropout on) and QLoRA.
TEST_CASE("mp runs 1F1B: warm-up, one forward one backward, cool-down; the single run's weights, untied bit for bit",
          "[parallel][mp][parity]") {
    pv::World world(nullptr, nullptr);
    const int p = world.size(), r = world.rank(), micro = kAccumulation * p;
    const RunResult single = reference<double>(world);
    const RunResult single_untied = reference<double>(world, Options{kAccumulation, 1, false});
    for (int cap : {0, 2}) {
        INFO("1f1b, in flight at most " << cap << " (0: p - r), rank " << r);
        Options o{kAccumulation, cap}, untied{kAccumulation, cap, false};
        o.pipeline = untied.pipeline = pv::PipelineScheduleKind::one_f_one_b;
        const int warmup = std::min({p - r - 1, micro, cap > 0 ? cap - 1 : micro});
        std::string expected = std::string(size_t(warmup), 'F');
        for (int k = 0; k + warmup < micro; ++k) expected += "FB";
        expected += std::string(size_t(warmup), 'B');
        const RunResult mp = train<double>("mp", &world.comm(), p, o);
        REQUIRE(mp.schedule.size() == size_t(kSteps));
        for (const std::string& order : mp.schedule) CHECK(order == expected);
        check_close(mp, single);
        check_identical(train<double>("mp", &world.comm(), p, untied), single_untied);
    }
    Options lora = lora_options(), qlora = lora_options();
    qlora.nf4 = true;
    lora.pipeline = qlora.pipeline = pv::PipelineScheduleKind::one_f_one_b;
    lora.microbatches = qlora.microbatches = 0;
    check_close(train<double>("mp", &world.comm(), p, lora), reference<double>(world, lora_options()));
    Options qlora_single = lora_options();
    qlora_single.nf4 = true;
    check_close(train<double>("mp", &world.comm(), p, qlora), reference<double>(world, qlora_single));
}

// Interleaved 1F1B (parallel/schedule.h): each rank runs two chunks of a model of 2p blocks (stages
// r and r + p), and trains what single trains on that model — untied bit for bit, tied within
// 1e-10 (fp64), with LoRA (dropout on) and QLoRA (at 2 ranks: 4 run the same chunk code on a model
// twice the size) and activation checkpointing — and each rank holds only its chunks' units.
TEST_CASE("mp runs interleaved 1F1B over two chunks per rank: the single run's weights, untied bit for bit",
          "[parallel][mp][parity][interleaved]") {
    pv::World world(nullptr, nullptr);
    const int p = world.size();
    Options o, untied{kAccumulation, 0, false};
    o.microbatches = 0, o.chunks = untied.chunks = 2;
    o.pipeline = untied.pipeline = pv::PipelineScheduleKind::interleaved;
    const RunResult single = reference<double>(world, o), single_untied = reference<double>(world, untied);
    const RunResult interleaved = train<double>("mp", &world.comm(), p, o);
    REQUIRE(interleaved.stages.size() == size_t(2 * p + 1));
    check_close(interleaved, single);
    check_identical(train<double>("mp", &world.comm(), p, untied), single_untied);
    if (p == 2) {
        Options lora = lora_options(), qlora = lora_options();
        qlora.nf4 = true;
        for (Options* x : {&lora, &qlora})
            x->microbatches = 0, x->chunks = 2, x->pipeline = pv::PipelineScheduleKind::interleaved;
        check_close(train<double>("mp", &world.comm(), p, lora), reference<double>(world, lora));
        check_close(train<double>("mp", &world.comm(), p, qlora), reference<double>(world, qlora));
    }
    Options checkpointed = o;
    checkpointed.checkpointing = {true, 2};
    check_identical(train<double>("mp", &world.comm(), p, checkpointed), interleaved);
}

// Pipeline × data parallelism (parallel/mesh.h): two stages, each replicated over N/2 ranks under
// ddp, zero1, zero2, zero3 and hybrid zero1 and zero3 (shard groups of one, N/2 replicas). fp64:
// every run trains what single trains within 1e-10 — the tied embedding's two copies summed after
// each replica's data-parallel reduction, the count over the data axes, the norm over shard and
// pipeline — and zero1 is bit-identical to ddp, as without a pipeline; an untied model too, and
// LoRA under zero3. Each stage's replicas talk over their own
// group, the stages over the pipeline's. On 2 ranks two stages leave one rank per stage: refused.
TEST_CASE("pipeline x data parallelism: two stages under ddp, zero1-3 and hybrid zero1/zero3 train what single trains",
          "[parallel][mp][mesh][parity]") {
    pv::World world(nullptr, nullptr);
    const int n = world.size();
    Options o{kAccumulation, 0};
    o.stages = 2, o.pipeline = pv::PipelineScheduleKind::one_f_one_b;
    if (n % 4 != 0) {
        pv::StrategyOptions so;
        so.kind = pv::StrategyKind::ddp, so.pipeline_stages = n;
        CHECK_THROWS_WITH(pv::check_strategy(so, n), Catch::Contains("one rank per stage") &&
                                                          Catch::Contains("choose --parallel pp"));
        return;
    }
    const RunResult single = reference<double>(world);
    const RunResult ddp = train<double>("ddp", &world.comm(), n, o);
    check_close(ddp, single);
    check_identical(train<double>("zero1", &world.comm(), n, o), ddp);
    for (const char* name : {"zero2", "zero3"}) {
        INFO(name);
        check_close(train<double>(name, &world.comm(), n, o), single);
    }
    Options hybrid = o;
    hybrid.shard_group = 1;
    for (const char* name : {"zero1", "zero3"}) {
        INFO("hybrid " << name);
        check_close(train<double>(name, &world.comm(), n, hybrid), single);
    }
    Options untied{kAccumulation, 0, false};
    untied.stages = 2, untied.pipeline = o.pipeline;
    const RunResult single_untied = reference<double>(world, Options{kAccumulation, 1, false});
    check_close(train<double>("zero3", &world.comm(), n, untied), single_untied);
    check_close(train<double>("ddp", &world.comm(), n, untied), single_untied);
    Options lora = lora_options();
    lora.stages = 2, lora.pipeline = o.pipeline, lora.microbatches = 0;
    check_close(train<double>("zero3", &world.comm(), n, lora), reference<double>(world, lora_options()));
    // The communicators: the world (count and loss), each stage's replicas, the pipeline, and the
    // tied embedding's pair on the first and last stage.
    const auto& by = ddp.per_comm.front();
    CHECK(by.count("world") == 1);
    CHECK(by.count("shard") == 1);
    CHECK(by.count("pipeline") == 1);
    CHECK(by.count("tied-embedding") == 1);
    const pv::Comm::Totals& pipe = by.at("pipeline");
    const double micro = kAccumulation * 2;  // each replica's micro-batches: accumulation × stages
    CHECK(pipe.calls[size_t(pv::CollectiveKind::send)] == micro);  // one activation or gradient each way
    CHECK(pipe.calls[size_t(pv::CollectiveKind::recv)] == micro);
    CHECK(by.at("shard").calls[size_t(pv::CollectiveKind::all_reduce)] > 0);
}

namespace parallel_test {

double category(const RunResult& r, pv::MemoryCategory c) { return r.peak[size_t(c)]; }

// Model parallelism per step: the residual stream of every micro-batch forward to the next stage
// and its gradient back ([kMicro·kSeq][hidden] each), the loss (with the stop requests) and the per-unit squared norms
// all-reduced over every rank (no token count: every stage has the whole batch), and with tied
// embeddings the wte gradient all-reduced between the first and last stages — unless wte is
// frozen (it has no gradient: 2 all-reduces there instead of 3). Memory: each rank holds its
// stage's units (the last stage also the tied wte): parameters of all their groups, frozen ones
// included; gradients and optimizer state of their trainable groups only.
template <class T>
void check_mp_counts(pv::World& world, Options opt = {}) {
    const std::set<std::string>& frozen = opt.frozen;
    using pv::CollectiveKind;
    using C = pv::MemoryCategory;
    const int p = world.size(), r = world.rank(), m = 4;
    const double n = p, t = sizeof(T), a = sizeof(pv::acc_t<T>), master = std::is_same_v<T, __nv_bfloat16> ? 4 : 0;
    opt.microbatches = m;
    const RunResult mp = train<T>("mp", &world.comm(), world.size(), opt);
    const double micro = kAccumulation * p, stream = double(kMicro) * kSeq * awkward_model(p).hidden_size;
    const int first = mp.stages[size_t(r)], end = mp.stages[size_t(r) + 1];
    const bool tied_copy = r == p - 1 && p > 1;  // awkward_model is tied
    double held = 0, held_all = 0;               // trainable groups; all groups
    for (int u = first; u < end; ++u)
        held += double(mp.padded[size_t(u)]), held_all += double(mp.unit_padded[size_t(u)]);
    if (tied_copy) held += double(mp.padded[0]), held_all += double(mp.unit_padded[0]);
    const double sends = (r + 1 < p ? micro : 0) + (r > 0 ? micro : 0);
    const bool tied_reduce = (r == 0 || r == p - 1) && p > 1 && mp.padded[0] > 0;  // a frozen wte has no gradient
    const double tied_bytes = tied_reduce ? 2.0 * (2 - 1) / 2 * double(mp.padded[0]) * t : 0;
    if (frozen.count("wte")) REQUIRE(!tied_reduce);
    for (int s = 0; s < kSteps; ++s) {
        INFO("step " << s + 1 << ", rank " << r);
        const auto& c = mp.per_step[size_t(s)];
        CHECK(c.calls[size_t(CollectiveKind::all_reduce)] == 2 + (tied_reduce ? 1 : 0));
        CHECK(c.calls[size_t(CollectiveKind::send)] == sends);
        CHECK(c.calls[size_t(CollectiveKind::recv)] == sends);
        CHECK(c.calls[size_t(CollectiveKind::reduce_scatter)] == 0);
        CHECK(c.calls[size_t(CollectiveKind::all_gather)] == 0);
        CHECK(c.wire_bytes == Approx(2 * (n - 1) / n * (8.0 * pv::kLossAllReduceDoubles + 8.0 * mp.units) +
                                     sends * stream * t + tied_bytes)
                                  .epsilon(1e-12));
    }
    CHECK(category(mp, C::parameters) == held_all * t);
    CHECK(category(mp, C::gradients) == held * t);
    CHECK(category(mp, C::optimizer_state) == held * (master + 2 * a));
    CHECK(category(mp, C::comm_buffers) == 0);
    // The stages together hold the model once, plus the tied copy.
    pv::DeviceBuffer<double> sum(2, C::workspace);
    const double mine_held[2] = {held, held_all};
    double total[2] = {0, 0};
    CUDA_CHECK(cudaMemcpy(sum.get(), mine_held, sizeof mine_held, cudaMemcpyHostToDevice));
    world.comm().all_reduce(sum.get(), sum.get(), 2);
    CUDA_CHECK(cudaStreamSynchronize(world.comm().stream()));
    CUDA_CHECK(cudaMemcpy(total, sum.get(), sizeof total, cudaMemcpyDeviceToHost));
    CHECK(total[0] == double(mp.psi) + (p > 1 ? double(mp.padded[0]) : 0));
    CHECK(total[1] == double(mp.psi + mp.psi_frozen) + (p > 1 ? double(mp.unit_padded[0]) : 0));
    // Every stage's figures, gathered to rank 0 for the table of docs/parallel-training.md.
    const double memory = category(mp, C::parameters) + category(mp, C::gradients) + category(mp, C::optimizer_state);
    const auto& calls = mp.per_step[0].calls;
    const std::vector<double> mine{double(first),
                                   double(end - 1),
                                   memory,
                                   mp.per_step[0].wire_bytes,
                                   double(calls[size_t(CollectiveKind::send)]),
                                   double(calls[size_t(CollectiveKind::recv)]),
                                   double(calls[size_t(CollectiveKind::all_reduce)])};
    pv::DeviceBuffer<double> figures(mine.size() * size_t(p), C::workspace);
    CUDA_CHECK(cudaMemcpy(figures.get() + mine.size() * size_t(r), mine.data(), mine.size() * sizeof(double),
                          cudaMemcpyHostToDevice));
    world.comm().all_gather(figures.get() + mine.size() * size_t(r), figures.get(), mine.size());
    CUDA_CHECK(cudaStreamSynchronize(world.comm().stream()));
    std::vector<double> all(mine.size() * size_t(p));
    CUDA_CHECK(cudaMemcpy(all.data(), figures.get(), all.size() * sizeof(double), cudaMemcpyDeviceToHost));
    if (r == 0) {
        std::printf("counts, mp, N = %d, %s%s, psi %lld, per rank: ", p, std::is_same_v<T, double> ? "fp64" : "bf16",
                    (opt.lora.enabled() ? std::string(opt.nf4 ? ", QLoRA" : ", LoRA") + " (psi_frozen " +
                                              std::to_string(mp.psi_frozen) + ")"
                                        : frozen_label(frozen, mp.psi_frozen))
                        .c_str(),
                    mp.psi);
        for (int k = 0; k < p; ++k) {
            const double* f = all.data() + size_t(k) * mine.size();
            std::printf(
                "%srank %d units %.0f-%.0f: %.0f send + %.0f recv + %.0f all-reduce, %.0f bytes sent, memory "
                "(params + grads + optimizer) %.0f bytes",
                k ? "; " : "", k, f[0], f[1], f[4], f[5], f[6], f[3], f[2]);
        }
        std::printf("\n");
    }
}

// Every collective of a step, as designed: DDP all-reduces the token count (int64), one bucket
// per unit with a non-empty trainable group, the loss with the stop requests and the squared norm (doubles, one per
// unit); ZeRO-1 reduce-scatters and all-gathers each such unit instead of the buckets. Frozen
// groups are never communicated, except that ZeRO-3 shards them and gathers each non-empty group
// of a unit (one all-gather per group) wherever it gathers the unit. Bytes per rank by the ring
// formulas (parallel/comm.h) with the padded Ψ (trainable groups) and Ψall (all groups); memory
// per category from the allocator's accounting against DESIGN.md §4: parameters Ψall (ZeRO-3:
// Ψall/N), gradients and optimizer state from Ψ only. Without frozen tensors Ψall = Ψ, and
// parameters + gradients + optimizer state = 16Ψ (DDP) and 4Ψ + 12Ψ/N (ZeRO-1) bytes for bf16,
// 32Ψ and 16Ψ + 16Ψ/N for fp64; nothing else but activations and workspace.
template <class T>
void check_counts(pv::World& world, Options opt = {}) {
    using pv::CollectiveKind;
    const double n = world.size(), t = sizeof(T), a = sizeof(pv::acc_t<T>);
    const double master = std::is_same_v<T, __nv_bfloat16> ? 4 : 0;
    const std::set<std::string>& frozen = opt.frozen;
    const bool all_trained = frozen.empty() && !opt.lora.enabled();
    const RunResult ddp = train<T>("ddp", &world.comm(), world.size(), opt);
    const RunResult zero1 = train<T>("zero1", &world.comm(), world.size(), opt);
    const RunResult zero2 = train<T>("zero2", &world.comm(), world.size(), opt);
    const RunResult zero3 = train<T>("zero3", &world.comm(), world.size(), opt);
    // The count and the loss (one number each), the squared norm (one per unit).
    const double psi = double(ddp.psi), psi_all = double(ddp.psi + ddp.psi_frozen),
                 scalars = 8 + 8.0 * pv::kLossAllReduceDoubles + 8.0 * ddp.units;
    const double A = kAccumulation;
    for (const RunResult* r : {&zero1, &zero2, &zero3}) {
        REQUIRE(r->padded == ddp.padded);
        REQUIRE(r->unit_padded == ddp.unit_padded);
    }
    REQUIRE(ddp.psi % (world.size() * 64LL) == 0);
    REQUIRE(all_trained == (ddp.psi_frozen == 0));
    // Units with anything to train (the others have no bucket, reduce-scatter or all-gather), and
    // ZeRO-3's all-gathers per micro-step: every unit's non-empty groups for the forward, the
    // blocks' again for the backward (the head's are still there, the embedding needs none).
    long long trained = 0, gathers = 0;
    for (int u = 0; u < ddp.units; ++u) {
        trained += ddp.padded[size_t(u)] > 0;
        gathers += ddp.nonempty[size_t(u)] + (u >= 1 && u <= ddp.units - 2 ? ddp.nonempty[size_t(u)] : 0);
    }
    if (all_trained) REQUIRE((trained == ddp.units && gathers == 2 * ddp.units - 2));
    if (opt.lora.enabled()) REQUIRE(trained == ddp.units - 2);  // only the blocks have adapters
    const double all_first = double(zero3.unit_padded.front()), all_last = double(zero3.unit_padded.back());
    for (int s = 0; s < kSteps; ++s) {
        INFO("step " << s + 1);
        const auto& d = ddp.per_step[size_t(s)];
        CHECK(d.calls[size_t(CollectiveKind::all_reduce)] == trained + 3);
        CHECK(d.calls[size_t(CollectiveKind::reduce_scatter)] == 0);
        CHECK(d.calls[size_t(CollectiveKind::all_gather)] == 0);
        CHECK(d.wire_bytes == Approx(2 * (n - 1) / n * (psi * t + scalars)).epsilon(1e-12));
        const auto& z = zero1.per_step[size_t(s)];
        CHECK(z.calls[size_t(CollectiveKind::all_reduce)] == 3);
        CHECK(z.calls[size_t(CollectiveKind::reduce_scatter)] == trained);
        CHECK(z.calls[size_t(CollectiveKind::all_gather)] == trained);
        CHECK(z.wire_bytes == Approx(2 * (n - 1) / n * scalars + 2 * (n - 1) / n * psi * t).epsilon(1e-12));
        const auto& z2 = zero2.per_step[size_t(s)];
        CHECK(z2.calls[size_t(CollectiveKind::all_reduce)] == 3);
        CHECK(z2.calls[size_t(CollectiveKind::reduce_scatter)] == kAccumulation * trained);
        CHECK(z2.calls[size_t(CollectiveKind::all_gather)] == trained);
        CHECK(z2.wire_bytes == Approx(2 * (n - 1) / n * scalars + (A + 1) * (n - 1) / n * psi * t).epsilon(1e-12));
        // ZeRO-3 per micro-step: Ψall gathered for the forward, Ψall − Ψall_first − Ψall_last for
        // the backward, Ψ reduce-scattered; no all-gather after the update.
        const auto& z3 = zero3.per_step[size_t(s)];
        CHECK(z3.calls[size_t(CollectiveKind::all_reduce)] == 3);
        CHECK(z3.calls[size_t(CollectiveKind::reduce_scatter)] == kAccumulation * trained);
        CHECK(z3.calls[size_t(CollectiveKind::all_gather)] == kAccumulation * gathers);
        CHECK(z3.wire_bytes ==
              Approx(2 * (n - 1) / n * scalars + A * (n - 1) / n * (2 * psi_all - all_first - all_last + psi) * t)
                  .epsilon(1e-12));
        // The performance model's communication (parallel/comm_cost.h) is these counters' figure.
        const pv::LlamaConfig config = awkward_model(world.size(), opt.tied);
        const pv::GroupOptions groups{frozen, opt.lora, opt.nf4, true};
        for (const auto& [name, run] : {std::pair{"ddp", &d}, {"zero1", &z}, {"zero2", &z2}, {"zero3", &z3}})
            CHECK(run->wire_bytes ==
                  Approx(pv::step_wire_bytes(config, pv::dtype_of<T>(), groups, name, world.size(), opt.accumulation))
                      .epsilon(1e-12));
        // The count is an integer all-reduce and comes first, before any backward's bucket.
        CHECK(ddp.logs[size_t(s)].front().dtype == ncclInt64);
    }
    using C = pv::MemoryCategory;
    CHECK(category(ddp, C::parameters) == psi_all * t);
    CHECK(category(ddp, C::gradients) == psi * t);
    CHECK(category(ddp, C::optimizer_state) == psi * (master + 2 * a));
    CHECK(category(zero1, C::parameters) == psi_all * t);
    CHECK(category(zero1, C::gradients) == psi * t);
    CHECK(category(zero1, C::optimizer_state) == psi / n * (master + 2 * a));
    // ZeRO-2: the reduced slices, plus two rotating buffers of the largest block or head and the
    // tied embedding's own (DESIGN.md §3), trainable groups only.
    double largest = 0, largest_all = 0;
    for (size_t u = 1; u < zero2.padded.size(); ++u) {
        largest = std::max(largest, double(zero2.padded[u]));
        largest_all = std::max(largest_all, double(zero2.unit_padded[u]));
    }
    const double rotating = (2 * largest + double(zero2.padded[0])) * t;
    CHECK(category(zero2, C::parameters) == psi_all * t);
    CHECK(category(zero2, C::gradients) == psi / n * t + rotating);
    CHECK(category(zero2, C::optimizer_state) == psi / n * (master + 2 * a));
    CHECK(category(zero2, C::comm_buffers) == 0);
    const double zero2_total =
        category(zero2, C::parameters) + category(zero2, C::gradients) + category(zero2, C::optimizer_state);
    if constexpr (std::is_same_v<T, __nv_bfloat16>)
        CHECK(zero2_total == 2 * psi_all + 14 * psi / n + rotating);
    else
        CHECK(zero2_total == 8 * psi_all + 24 * psi / n + rotating);
    // ZeRO-3: slices of every group, the same rotating gradient buffers, and gather buffers (two
    // of the largest block or head, the tied embedding's, each of all its groups) in
    // communication buffers; without frozen tensors the same size as the rotating ones.
    const double gather_buffers = (2 * largest_all + double(zero3.unit_padded[0])) * t;
    if (all_trained) REQUIRE(gather_buffers == rotating);
    CHECK(category(zero3, C::parameters) == psi_all / n * t);
    CHECK(category(zero3, C::gradients) == psi / n * t + rotating);
    CHECK(category(zero3, C::optimizer_state) == psi / n * (master + 2 * a));
    CHECK(category(zero3, C::comm_buffers) == gather_buffers);
    const double zero3_total =
        category(zero3, C::parameters) + category(zero3, C::gradients) + category(zero3, C::optimizer_state);
    if constexpr (std::is_same_v<T, __nv_bfloat16>)
        CHECK(zero3_total == 2 * psi_all / n + 14 * psi / n + rotating);
    else
        CHECK(zero3_total == 8 * psi_all / n + 24 * psi / n + rotating);
    const double ddp_total =
        category(ddp, C::parameters) + category(ddp, C::gradients) + category(ddp, C::optimizer_state);
    const double zero1_total =
        category(zero1, C::parameters) + category(zero1, C::gradients) + category(zero1, C::optimizer_state);
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
        CHECK(ddp_total == 2 * psi_all + 14 * psi);
        CHECK(zero1_total == 2 * psi_all + 2 * psi + 12 * psi / n);
    } else {
        CHECK(ddp_total == 8 * psi_all + 24 * psi);
        CHECK(zero1_total == 8 * psi_all + 8 * psi + 16 * psi / n);
    }
    CHECK(category(ddp, C::comm_buffers) == 0);
    CHECK(category(zero1, C::comm_buffers) == 0);
    // The same figures from parallel/memory.h, which computes them before any allocation (the
    // docs/lora-qlora.md's table comes from it), for every strategy here and for single on one rank.
    const pv::GroupOptions groups{opt.frozen, opt.lora, opt.nf4, true};
    const pv::LlamaConfig config = awkward_model(world.size(), opt.tied);
    const RunResult single = reference<T>(world, opt);
    for (const auto& [name, r, ranks] :
         std::vector<std::tuple<std::string, const RunResult*, int>>{{"single", &single, 1},
                                                                     {"ddp", &ddp, world.size()},
                                                                     {"zero1", &zero1, world.size()},
                                                                     {"zero2", &zero2, world.size()},
                                                                     {"zero3", &zero3, world.size()}}) {
        const pv::ModelStateMemory m = pv::model_state_memory(config, pv::dtype_of<T>(), groups, name, ranks);
        INFO(name << " on " << ranks << " rank(s)");
        CHECK(category(*r, C::parameters) == m.parameters);
        CHECK(category(*r, C::gradients) == m.gradients);
        CHECK(category(*r, C::optimizer_state) == m.optimizer_state);
        CHECK(category(*r, C::comm_buffers) == m.comm_buffers);
        // Activations: one arena per unit (adapters' u included), the sizes the planner reads.
        double arenas = 0;
        for (const pv::UnitSpec& u : pv::model_units(config))
            arenas += double(
                pv::arena_bytes(pv::activation_layout(config, u.kind, kMicro, kSeq, pv::dtype_of<T>(), opt.lora)));
        CHECK(category(*r, C::activations) == arenas);
    }
    if (world.rank() == 0) {
        std::printf(
            "counts, N = %d, %s%s: psi %.0f; per step ddp %lld all-reduce, %.0f bytes; zero1 %lld reduce-scatter + "
            "%lld all-gather + %lld all-reduce, %.0f bytes; memory per rank (params + grads + optimizer): "
            "ddp %.0f, zero1 %.0f bytes; zero2 %lld reduce-scatter + %lld all-gather + %lld all-reduce, %.0f "
            "bytes, memory %.0f (rotating buffers %.0f); zero3 %lld reduce-scatter + %lld all-gather + %lld "
            "all-reduce, %.0f bytes, memory %.0f (+ gather buffers %.0f)\n",
            world.size(), std::is_same_v<T, double> ? "fp64" : "bf16",
            (opt.lora.enabled() ? ", LoRA rank " + std::to_string(opt.lora.rank) + " (psi_frozen " +
                                      std::to_string(ddp.psi_frozen) + ")"
                                : frozen_label(frozen, ddp.psi_frozen))
                .c_str(),
            psi, ddp.per_step[0].calls[size_t(CollectiveKind::all_reduce)], ddp.per_step[0].wire_bytes,
            zero1.per_step[0].calls[size_t(CollectiveKind::reduce_scatter)],
            zero1.per_step[0].calls[size_t(CollectiveKind::all_gather)],
            zero1.per_step[0].calls[size_t(CollectiveKind::all_reduce)], zero1.per_step[0].wire_bytes, ddp_total,
            zero1_total, zero2.per_step[0].calls[size_t(CollectiveKind::reduce_scatter)],
            zero2.per_step[0].calls[size_t(CollectiveKind::all_gather)],
            zero2.per_step[0].calls[size_t(CollectiveKind::all_reduce)], zero2.per_step[0].wire_bytes, zero2_total,
            rotating, zero3.per_step[0].calls[size_t(CollectiveKind::reduce_scatter)],
            zero3.per_step[0].calls[size_t(CollectiveKind::all_gather)],
            zero3.per_step[0].calls[size_t(CollectiveKind::all_reduce)], zero3.per_step[0].wire_bytes, zero3_total,
            category(zero3, C::comm_buffers));
    }
}

}  // namespace parallel_test

TEST_CASE("collectives, bytes on the wire and memory per category are exactly as designed", "[parallel][counting]") {
    pv::World world(nullptr, nullptr);
    check_counts<__nv_bfloat16>(world);
    check_counts<double>(world);
}

TEST_CASE("mp: transfers, bytes on the wire and memory per stage are exactly as designed", "[parallel][counting][mp]") {
    pv::World world(nullptr, nullptr);
    check_mp_counts<__nv_bfloat16>(world);
    check_mp_counts<double>(world);
}

TEST_CASE("with frozen tensors: collectives, bytes on the wire and memory per category are exactly as designed",
          "[parallel][freeze][counting]") {
    pv::World world(nullptr, nullptr);
    check_counts<__nv_bfloat16>(world, Options{kAccumulation, 1, true, kFrozen});
    check_counts<double>(world, Options{kAccumulation, 1, true, kFrozen});
}

// LoRA: only the adapters' gradients are communicated (Ψ = the adapters' padded elements), the
// frozen base is replicated and never sent (ddp, zero1, zero2) or gathered with its unit (zero3);
// memory per category as the same formulas give with Ψall = base + adapters.
TEST_CASE("with LoRA: collectives, bytes on the wire and memory per category are exactly as designed",
          "[parallel][lora][counting]") {
    pv::World world(nullptr, nullptr);
    check_counts<__nv_bfloat16>(world, lora_options());
    check_counts<double>(world, lora_options());
}

// QLoRA: the same with the base's linears in NF4 (each rank quantises what it keeps; ZeRO-3 slices
// the packed groups at block boundaries and gathers them with the unit).
TEST_CASE("with QLoRA: collectives, bytes on the wire and memory per category are exactly as designed",
          "[parallel][lora][nf4][counting]") {
    pv::World world(nullptr, nullptr);
    Options opt = lora_options();
    opt.nf4 = true;
    check_counts<__nv_bfloat16>(world, opt);
    check_counts<double>(world, opt);
}

TEST_CASE("every strategy with QLoRA trains what single trains: fp64 within 1e-10", "[parallel][lora][nf4]") {
    pv::World world(nullptr, nullptr);
    Options opt = lora_options();
    opt.nf4 = true;
    const RunResult single = reference<double>(world, opt);
    const RunResult ddp = train<double>("ddp", &world.comm(), world.size(), opt);
    const RunResult zero1 = train<double>("zero1", &world.comm(), world.size(), opt);
    const RunResult zero2 = train<double>("zero2", &world.comm(), world.size(), opt);
    const RunResult zero3 = train<double>("zero3", &world.comm(), world.size(), opt);
    check_data_parallel_parity(single, ddp, zero1, zero2, zero3);
    check_close(train<double>("mp", &world.comm(), world.size(), opt), single);
    // NF4 changed the model: the LoRA run on the unquantised base computes other losses.
    Options dense = opt;
    dense.nf4 = false;
    CHECK(reference<double>(world, dense).losses[0] != single.losses[0]);
}

// Every strategy trains the LoRA model single trains, dropout included (its mask is keyed by the
// global row, so it does not depend on which rank holds a sample), the base stays bit-identical to
// its initial values and the adapters move.
TEST_CASE("every strategy with LoRA (dropout on) trains what single trains: fp64 within 1e-10, base untouched",
          "[parallel][lora]") {
    pv::World world(nullptr, nullptr);
    const Options opt = lora_options();
    const RunResult single = reference<double>(world, opt);
    const RunResult ddp = train<double>("ddp", &world.comm(), world.size(), opt);
    const RunResult zero1 = train<double>("zero1", &world.comm(), world.size(), opt);
    const RunResult zero2 = train<double>("zero2", &world.comm(), world.size(), opt);
    const RunResult zero3 = train<double>("zero3", &world.comm(), world.size(), opt);
    check_data_parallel_parity(single, ddp, zero1, zero2, zero3);
    for (int m : {1, 2}) {
        Options pipelined = opt;
        pipelined.microbatches = m;
        INFO("mp, micro-batches in flight: " << m);
        check_close(train<double>("mp", &world.comm(), world.size(), pipelined), single);
    }
    const auto initial = initial_tensors(awkward_model(world.size()));
    std::set<std::string> base;
    for (const auto& [name, v] : initial) base.insert(name);
    for (const auto& [name, v] : single.tensors) {
        INFO(name);
        if (base.count(name))
            CHECK(v == initial.at(name));
        else
            CHECK(name.find("lora_") != std::string::npos);
    }
    // The adapters moved (B from zero), and dropout mattered: without it the run differs.
    CHECK(single.tensors.at("layers.0.lora_b_qkv") !=
          std::vector<double>(single.tensors.at("layers.0.lora_b_qkv").size(), 0.0));
    Options no_dropout = opt;
    no_dropout.lora.dropout = 0;
    CHECK(reference<double>(world, no_dropout).losses[1] != single.losses[1]);
}

namespace parallel_test {

// Activation checkpointing (model/llama.h) under `strategy`, two steps: bitwise the run without
// it, and this rank's activations exactly activation_arenas's figure for its units and slots (mp:
// plus the residual streams it receives, one per slot), less than without.
template <class T>
void check_checkpointing(pv::World& world, const std::string& strategy, Options opt,
                         pv::ActivationCheckpointing checkpointing = {true, 0}) {
    opt.steps = 2;
    pv::Comm* comm = strategy == "single" ? nullptr : &world.comm();
    const RunResult plain = train<T>(strategy, comm, world.size(), opt);
    opt.checkpointing = checkpointing;
    const RunResult ckpt = train<T>(strategy, comm, world.size(), opt);
    INFO(strategy << ", " << pv::dtype_name(pv::dtype_of<T>()) << ", keep_every " << checkpointing.keep_every
                  << (opt.lora.enabled() ? ", LoRA" : "") << (opt.nf4 ? ", NF4" : ""));
    check_identical(ckpt, plain);
    const bool mp = strategy == "mp";
    const int rank = comm ? comm->rank() : 0;
    const pv::LlamaConfig config = awkward_model(world.size(), opt.tied);
    const int slots = mp ? pipeline_slots(opt, world.size(), rank) : 1;
    const pv::StageUnits stage =
        mp ? pv::StageUnits{ckpt.stages[size_t(rank)], ckpt.stages[size_t(rank) + 1], slots} : pv::StageUnits{};
    const double received = mp && rank > 0 ? double(slots) * kMicro * kSeq * config.hidden_size * sizeof(T) : 0;
    const auto arenas = [&](const pv::ActivationCheckpointing& c) {
        return double(
            pv::activation_arenas(config, kMicro, kSeq, pv::dtype_of<T>(), opt.lora, c, stage).total());
    };
    using C = pv::MemoryCategory;
    CHECK(plain.peak[size_t(C::activations)] == arenas({}) + received);
    CHECK(ckpt.peak[size_t(C::activations)] == arenas(checkpointing) + received);
    bool recomputes = false;  // a block of this rank's units recomputes (not so on a stage of the embedding or head)
    const int end = stage.end < 0 ? config.num_layers + 2 : stage.end;
    for (int u = std::max(stage.first, 1); u < std::min(end, config.num_layers + 1); ++u)
        recomputes |= checkpointing.recomputes(u - 1);
    if (recomputes)
        CHECK(ckpt.peak[size_t(C::activations)] < plain.peak[size_t(C::activations)]);
    else
        CHECK(ckpt.peak[size_t(C::activations)] == plain.peak[size_t(C::activations)]);
}

}  // namespace parallel_test

// Cheap cases (2 steps of the awkward model): every dtype under single, zero3 and mp with two
// micro-batches in flight (the slots share the recompute arena); ddp, zero1 and zero2 in bf16;
// keep-every-2 under zero3 and mp; LoRA with dropout (the recompute draws the same mask) and
// QLoRA under zero3 and mp.
TEST_CASE("activation checkpointing trains bit for bit as without it: every dtype and strategy, LoRA, QLoRA",
          "[parallel][checkpointing]") {
    pv::World world(nullptr, nullptr);
    Options gpipe;
    gpipe.microbatches = 2;
    for (const char* strategy : {"single", "zero3", "mp"}) {
        const Options opt = std::string(strategy) == "mp" ? gpipe : Options{};
        check_checkpointing<double>(world, strategy, opt);
        check_checkpointing<float>(world, strategy, opt);
        check_checkpointing<__nv_bfloat16>(world, strategy, opt);
    }
    for (const char* strategy : {"ddp", "zero1", "zero2"}) check_checkpointing<__nv_bfloat16>(world, strategy, {});
    check_checkpointing<double>(world, "zero3", {}, {true, 2});
    check_checkpointing<double>(world, "mp", gpipe, {true, 2});
    Options lora = lora_options(), qlora = lora_options();
    qlora.nf4 = true;
    for (const Options& o : {lora, qlora}) {
        check_checkpointing<__nv_bfloat16>(world, "zero3", o);
        Options pipelined = o;
        pipelined.microbatches = 2;
        check_checkpointing<double>(world, "mp", pipelined);
    }
    Options one_f_one_b;  // each stage's own slots (p - r)
    one_f_one_b.microbatches = 0, one_f_one_b.pipeline = pv::PipelineScheduleKind::one_f_one_b;
    check_checkpointing<double>(world, "mp", one_f_one_b);
    check_checkpointing<__nv_bfloat16>(world, "mp", one_f_one_b, {true, 2});
}

TEST_CASE("mp with frozen tensors: transfers, bytes on the wire and memory per stage are exactly as designed",
          "[parallel][freeze][counting][mp]") {
    pv::World world(nullptr, nullptr);
    check_mp_counts<__nv_bfloat16>(world, Options{kAccumulation, 1, true, kFrozen});
    check_mp_counts<double>(world, Options{kAccumulation, 1, true, kFrozen});
}

// mp with LoRA and QLoRA: each stage holds its units' base (dense or NF4) and adapters; only the
// adapters have gradients and optimizer state, and the tied embedding (frozen) needs no all-reduce.
TEST_CASE("mp with LoRA and QLoRA: transfers, bytes on the wire and memory per stage are exactly as designed",
          "[parallel][lora][counting][mp]") {
    pv::World world(nullptr, nullptr);
    Options opt = lora_options();
    check_mp_counts<__nv_bfloat16>(world, opt);
    check_mp_counts<double>(world, opt);
    opt.nf4 = true;
    check_mp_counts<__nv_bfloat16>(world, opt);
    check_mp_counts<double>(world, opt);
}

namespace parallel_test {

// Every parameter and every optimizer field this rank keeps, as bytes.
template <class T>
std::vector<std::vector<uint8_t>> snapshot(pv::Llama<T>& model, pv::AdamWState<T>& opt) {
    std::vector<std::vector<uint8_t>> out;
    auto add = [&](const void* p, size_t bytes, bool on_host = false) {
        std::vector<uint8_t> host(bytes);
        if (bytes > 0 && on_host) std::memcpy(host.data(), p, bytes);
        if (bytes > 0 && !on_host) CUDA_CHECK(cudaMemcpy(host.data(), p, bytes, cudaMemcpyDeviceToHost));
        out.push_back(std::move(host));
    };
    CUDA_CHECK(cudaDeviceSynchronize());
    using F = typename pv::AdamWState<T>::Field;
    for (int u = 0; u < model.num_units(); ++u) {
        if (model.holds(u)) add(model.params(u), model.trainable(u).bytes());
        const size_t owned = size_t(opt.end(u) - opt.begin(u)) * sizeof(pv::acc_t<T>);
        for (F f : {F::master, F::m, F::v})
            if (f != F::master || pv::AdamWState<T>::kHasMaster) add(opt.data(u, f), owned, opt.on_host());
    }
    return out;
}

// A step whose loss is not finite stops with the clear message, on every rank, and leaves the
// parameters and the optimizer state bit for bit as they were: step 1 with an absurd learning
// rate pushes the weights to ~1e30, so step 2's forward overflows.
template <class T>
void check_refused_step(const std::string& strategy, pv::Comm* comm, int world_ranks,
                        pv::Offload offload = pv::Offload::none) {
    const pv::LlamaConfig config = awkward_model(world_ranks, true);
    const int ranks = comm ? comm->size() : 1, rank = comm ? comm->rank() : 0;
    pv::StrategyOptions so;
    so.kind = pv::strategy_kind(strategy);
    so.offload = offload;
    const pv::StrategyPlan plan = pv::plan_strategy(so, config, kSeq, rank, ranks);
    pv::ModelOptions mo;
    mo.batch = kMicro, mo.seq_len = kSeq, mo.seed = 42, mo.placement = plan.placement;
    pv::ComputeStream stream;
    mo.stream = stream.get();
    pv::Llama<T> model(config, mo);
    std::unique_ptr<pv::Strategy<T, T>> s = pv::make_strategy<T, T>(plan, model, comm, 42);
    auto optimizer = pv::Trainer<T, T>::make_optimizer(*s, offload != pv::Offload::none);
    pv::Trainer<T, T> trainer(*s, *optimizer);
    const pv::AdamWSettings adamw;
    const int per_rank = kMicro * kAccumulation * world_ranks / ranks;
    const pv::StepResult first =
        trainer.step(micro_batches(0, rank * per_rank, per_rank, config.vocab_size, false), 1e30, 1, 0.0, adamw);
    REQUIRE(std::isfinite(first.loss));
    s->settle_parameters();
    const auto before = snapshot(model, *optimizer);
    std::string message;
    try {
        trainer.step(micro_batches(1, rank * per_rank, per_rank, config.vocab_size, false), 1e-3, 2, 1.0, adamw);
    } catch (const std::runtime_error& e) {
        message = e.what();
    }
    INFO(strategy << " rank " << rank);
    REQUIRE(message.find("step 2: the loss or gradient norm is not finite") != std::string::npos);
    REQUIRE(message.find("Lower --lr or pass over such steps with --skip-nonfinite N") != std::string::npos);
    REQUIRE(message.find("enable --clip") == std::string::npos);  // clipping is on (1.0)
    s->settle_parameters();
    const auto after = snapshot(model, *optimizer);
    REQUIRE(after.size() == before.size());
    for (size_t i = 0; i < after.size(); ++i) REQUIRE(after[i] == before[i]);
}

}  // namespace parallel_test

TEST_CASE("a step whose loss is not finite is refused on the device and reported: nothing changes",
          "[parallel][nonfinite]") {
    pv::World world(nullptr, nullptr);
    parallel_test::check_refused_step<float>("single", nullptr, world.size());
    parallel_test::check_refused_step<float>("ddp", &world.comm(), world.size());
    parallel_test::check_refused_step<float>("zero1", &world.comm(), world.size());
    parallel_test::check_refused_step<__nv_bfloat16>("zero2", &world.comm(), world.size());
    parallel_test::check_refused_step<__nv_bfloat16>("single", nullptr, world.size(), pv::Offload::optimizer);
    parallel_test::check_refused_step<float>("zero2", &world.comm(), world.size(), pv::Offload::optimizer);
}

namespace parallel_test {

// CPU offload (optim/offload.h) under `strategy`, two steps: bitwise the run without it (the CPU
// update is the kernel's math); no optimizer state on the device, and host memory grown by exactly
// the state the device no longer holds plus the staging (offload_staging_bytes).
// With --offload params (zero3): the parameter slices leave the device too, for host memory, and
// the device gains the upload staging (a slice of each gather buffer).
template <class T, class G = T>
void check_offload(pv::World& world, const std::string& strategy, Options opt = {},
                   pv::Offload mode = pv::Offload::optimizer) {
    opt.steps = 2;
    pv::Comm* comm = strategy == "single" ? nullptr : &world.comm();
    const RunResult plain = train<T, G>(strategy, comm, world.size(), opt);
    opt.offload = mode;
    const RunResult offloaded = train<T, G>(strategy, comm, world.size(), opt);
    INFO(strategy << ", " << pv::dtype_name(pv::dtype_of<T>()) << (std::is_same_v<G, T> ? "" : ", fp32 accumulation")
                  << (opt.lora.enabled() ? ", LoRA" : "") << ", offload " << pv::offload_name(mode));
    REQUIRE(plain.losses.size() == 2);
    check_identical(offloaded, plain);
    using C = pv::MemoryCategory;
    const bool sharded = strategy != "single" && strategy != "ddp", params = mode == pv::Offload::params;
    long long largest = 0;
    for (long long padded : plain.padded) largest = std::max(largest, sharded ? padded / world.size() : padded);
    const auto peak = [](const RunResult& r, C k) { return r.peak[size_t(k)]; };
    CHECK(peak(plain, C::optimizer_state) > 0);
    CHECK(peak(offloaded, C::optimizer_state) == 0);
    const double moved = peak(plain, C::optimizer_state) + (params ? peak(plain, C::parameters) : 0);
    CHECK(peak(offloaded, C::pinned_host) - peak(plain, C::pinned_host) ==
          moved + double(pv::offload_staging_bytes(largest, params ? 0 : sizeof(T), sizeof(G))));
    if (params) {
        CHECK(peak(plain, C::parameters) > 0);
        CHECK(peak(offloaded, C::parameters) == 0);
        double staging = 0;
        for (long long n : pv::zero3_gather_buffers(plain.unit_padded, opt.tied)) staging += double(n);
        staging = staging / world.size() * sizeof(T);
        CHECK(peak(offloaded, C::comm_buffers) - peak(plain, C::comm_buffers) == staging);
    }
    for (C k : {C::parameters, C::gradients, C::comm_buffers, C::activations}) {
        if (params && (k == C::parameters || k == C::comm_buffers)) continue;  // checked above
        INFO(pv::category_name(k));
        CHECK(peak(offloaded, k) == peak(plain, k));
    }
}

}  // namespace parallel_test

// Cheap cases (2 steps of the awkward model): single, ddp, zero1-3 in fp64 and bf16, fp32
// gradient accumulation, LoRA under zero3; --offload params under zero3, tied and untied, LoRA.
TEST_CASE("--offload optimizer and params train bit for bit as without, the state and slices in host memory",
          "[parallel][offload]") {
    using parallel_test::check_offload;
    pv::World world(nullptr, nullptr);
    for (const char* strategy : {"single", "ddp", "zero1", "zero2", "zero3"}) {
        check_offload<double>(world, strategy);
        check_offload<__nv_bfloat16>(world, strategy);
    }
    check_offload<__nv_bfloat16, float>(world, "zero1");
    check_offload<float>(world, "zero3", lora_options());
    for (bool tied : {true, false}) {
        Options o;
        o.tied = tied;
        check_offload<double>(world, "zero3", o, pv::Offload::params);
        check_offload<__nv_bfloat16>(world, "zero3", o, pv::Offload::params);
    }
    check_offload<__nv_bfloat16>(world, "zero3", lora_options(), pv::Offload::params);  // the base's slices too
}

// --cuda-graphs under every strategy: each micro-step (a pipeline's: each entry of its row, with
// the transfers before it) is captured once (its collectives with its kernels) and launched as a
// graph from then on, yet the run is the eager one's bit for bit, and every step's record holds the
// same collectives and bytes on the wire as the eager step's — a launch adds its capture's calls to
// the record again (Comm::repeat) — and a pipeline stage runs its schedule in the same order.
TEST_CASE(
    "captured micro-steps under ddp, zero1-3, pipelines, hybrid and LoRA too: the eager run bit for bit, every "
    "collective counted",
    "[parallel][graphs]") {
    pv::World world(nullptr, nullptr);
    const auto check = [&](const std::string& strategy, Options o) {
        INFO(strategy << ", shard group " << o.shard_group << ", accumulation " << o.accumulation
                      << (o.lora.rank ? ", LoRA" : "") << ", stages " << o.stages << ", schedule "
                      << pv::pipeline_schedule_name(o.pipeline) << " in flight " << o.microbatches << " chunks "
                      << o.chunks << (o.documents ? ", documents" : "") << (o.tied ? "" : ", untied"));
        const RunResult eager = train<__nv_bfloat16>(strategy, &world.comm(), world.size(), o);
        o.graphs = true;
        const RunResult graphs = train<__nv_bfloat16>(strategy, &world.comm(), world.size(), o);
        check_identical(graphs, eager);
        REQUIRE(graphs.per_step.size() == eager.per_step.size());
        for (size_t step = 0; step < eager.per_step.size(); ++step) {
            INFO("step " << step + 1);
            CHECK(graphs.per_step[step].calls == eager.per_step[step].calls);
            CHECK(graphs.per_step[step].wire_bytes == eager.per_step[step].wire_bytes);
            // The same calls; not in the same order: a captured micro-step's forward is queued with
            // its backward, after the step's target count is all-reduced, not before it.
            const auto calls = [](const std::vector<pv::CollectiveRecord>& log) {
                std::vector<std::tuple<int, size_t, int, int, std::string>> out;
                for (const pv::CollectiveRecord& c : log)
                    out.emplace_back(int(c.kind), c.count, int(c.dtype), c.peer, c.comm);
                std::sort(out.begin(), out.end());
                return out;
            };
            CHECK(calls(graphs.logs[step]) == calls(eager.logs[step]));
        }
        CHECK(graphs.schedule == eager.schedule);  // (mp: each stage's forwards and backwards)
        // A launch per micro-batch, or per entry of a pipeline's row: a forward and a backward of each
        // micro-batch (accumulation × stages of them) through each of the rank's chunks.
        const bool mp = strategy == "mp", piped = mp || o.stages > 1;
        const long long per_step =
            piped ? 2LL * o.accumulation * (mp ? world.size() : o.stages) * o.chunks : o.accumulation;
        CHECK(graphs.launched == per_step * o.steps);
        // Each captured in the first step only, on every rank (as NCCL requires of captured collectives):
        // every step starts from the same host state.
        CHECK(graphs.captured == per_step);
    };
    for (const char* strategy : {"ddp", "zero1", "zero2", "zero3"}) check(strategy, Options{});
    check("zero3", Options{1});  // one micro-step a step: every one a step's last
    check("zero2", lora_options());
    // Pipelines: each schedule; LoRA with dropout; packed documents; an untied head.
    Options gpipe{kAccumulation, 2}, one_f_one_b{kAccumulation, 0}, interleaved{kAccumulation, 0};
    one_f_one_b.pipeline = pv::PipelineScheduleKind::one_f_one_b;
    interleaved.pipeline = pv::PipelineScheduleKind::interleaved, interleaved.chunks = 2;
    Options lora = lora_options(), documents{kAccumulation, 0, false, {}, true};
    lora.pipeline = documents.pipeline = pv::PipelineScheduleKind::one_f_one_b, lora.microbatches = 0;
    for (const Options& o : {gpipe, one_f_one_b, interleaved, lora, documents}) check("mp", o);
    if (world.size() % 4 == 0) {  // two stages, each replicated: the data-parallel policies under a pipeline
        Options staged = one_f_one_b;
        staged.stages = 2;
        for (const char* strategy : {"ddp", "zero2", "zero3"}) check(strategy, staged);
    }
    if (world.size() % 2 == 0 && world.size() > 2) {  // hybrid: shards within groups of 2, replicas all-reduce
        Options hybrid;
        hybrid.shard_group = 2;
        check("zero2", hybrid);
        check("zero3", hybrid);
    }
}

TEST_CASE("the communication stream runs at the device's greatest priority, above the compute stream",
          "[parallel][streams]") {
    pv::World world(nullptr, nullptr);
    int least = 0, greatest = 0, comm = 1, compute = 1;
    CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    REQUIRE(greatest < least);  // lower numbers are higher priorities
    pv::ComputeStream stream;
    CUDA_CHECK(cudaStreamGetPriority(world.comm().stream(), &comm));
    CUDA_CHECK(cudaStreamGetPriority(stream.get(), &compute));
    CHECK(comm == greatest);
    CHECK(compute == least);
}

TEST_CASE("a node with fewer GPUs than ranks is refused, naming the fix", "[parallel][world]") {
    CHECK(pv::gpu_sharing_problem(1, 1).empty());
    CHECK(pv::gpu_sharing_problem(4, 8).empty());
    CHECK(pv::gpu_sharing_problem(8, 8).empty());
    const std::string two_on_one = pv::gpu_sharing_problem(2, 1);
    CHECK(two_on_one.find("2 ranks run on this node but it has 1 GPU(s) visible") != std::string::npos);
    CHECK(two_on_one.find("start at most 1 rank(s) per node") != std::string::npos);
    CHECK(pv::gpu_sharing_problem(9, 8).find("start at most 8 rank(s) per node") != std::string::npos);
    CHECK(pv::gpu_sharing_problem(1, 0).find("no CUDA device visible") != std::string::npos);
}

namespace parallel_test {

// Hybrid sharding (parallel/mesh.h) with shard groups of K = N/2 ranks: at N = 4 two
// groups of two (ranks 0-1 and 2-3), at N = 2 groups of one (ZeRO's code, DDP's replication).
// fp64: parity with single for zero1-3. Per step the world carries only the token count and the
// loss, the shard group ZeRO's collectives over K ranks (and the norms), the replicas one
// all-reduce of each rank's slice per trained unit — bytes by the ring formulas with K and N/K
// written out here, and the same as parallel/comm_cost.h's step_wire. Memory per category: the
// slices are 1/K (the formulas written out, and parallel/memory.h with the shard group).
template <class T>
void check_hybrid(pv::World& world) {
    using pv::CollectiveKind;
    using C = pv::MemoryCategory;
    const int n = world.size(), k = n / 2;
    REQUIRE(k >= 1);
    const RunResult single = reference<T>(world);
    Options opt;
    opt.shard_group = k;
    const pv::LlamaConfig config = awkward_model(n);
    const pv::GroupOptions groups{{}, {}, false, true};
    const double t = sizeof(T), a = sizeof(pv::acc_t<T>), master = std::is_same_v<T, __nv_bfloat16> ? 4 : 0;
    const double A = kAccumulation, kk = k, replicas = double(n) / k;
    auto calls = [](const pv::Comm::Totals& c, CollectiveKind kind) { return c.calls[size_t(kind)]; };
    for (const char* name : {"zero1", "zero2", "zero3"}) {
        INFO(name << ", N = " << n << ", K = " << k << (std::is_same_v<T, double> ? ", fp64" : ", bf16"));
        const RunResult r = train<T>(name, &world.comm(), n, opt);
        if constexpr (std::is_same_v<T, double>) check_close(r, single);
        // Groups padded for K shards (each a multiple of K·64 elements, not necessarily of N·64).
        for (long long p : r.padded) CHECK(p % (k * 64LL) == 0);
        const double psi = double(r.psi), units = r.units;
        const double all_first = double(r.unit_padded.front()), all_last = double(r.unit_padded.back());
        long long gathers = 0;  // zero3's per micro-step (check_counts)
        for (int u = 0; u < r.units; ++u)
            gathers += r.nonempty[size_t(u)] + (u >= 1 && u <= r.units - 2 ? r.nonempty[size_t(u)] : 0);
        const std::string s = name;
        for (int step = 0; step < kSteps; ++step) {
            INFO("step " << step + 1);
            const auto& by = r.per_comm[size_t(step)];
            REQUIRE(by.size() == 3);
            const pv::Comm::Totals &w = by.at("world"), &g = by.at("shard"), &rep = by.at("replica");
            CHECK(calls(w, CollectiveKind::all_reduce) == 2);  // the count and the loss
            CHECK(calls(w, CollectiveKind::reduce_scatter) + calls(w, CollectiveKind::all_gather) == 0);
            CHECK(w.wire_bytes == Approx(2.0 * (n - 1) / n * (8 + 8.0 * pv::kLossAllReduceDoubles)).epsilon(1e-12));
            // Within the group: the norms, the reduce-scatters and the gathers over K ranks.
            const long long rs = s == "zero1" ? r.units : kAccumulation * r.units;
            const long long ag = s == "zero3" ? kAccumulation * gathers : r.units;
            CHECK(calls(g, CollectiveKind::all_reduce) == 1);
            CHECK(calls(g, CollectiveKind::reduce_scatter) == rs);
            CHECK(calls(g, CollectiveKind::all_gather) == ag);
            const double ring = (kk - 1) / kk, norms = 8 * units;
            const double within = s == "zero1" ? 2 * ring * (norms + psi * t)
                                  : s == "zero2"
                                      ? 2 * ring * norms + (A + 1) * ring * psi * t
                                      : 2 * ring * norms + A * ring * (2 * psi - all_first - all_last + psi) * t;
            CHECK(g.wire_bytes == Approx(within).epsilon(1e-12));
            // Across groups: each rank's reduced slice (Ψ/K) all-reduced once per step, per unit.
            CHECK(calls(rep, CollectiveKind::all_reduce) == r.units);
            CHECK(calls(rep, CollectiveKind::reduce_scatter) + calls(rep, CollectiveKind::all_gather) == 0);
            CHECK(rep.wire_bytes == Approx(2 * (replicas - 1) / replicas * psi / kk * t).epsilon(1e-12));
            const pv::StepWire model = pv::step_wire(config, pv::dtype_of<T>(), groups, s, n, kAccumulation, k);
            CHECK(w.wire_bytes == Approx(model.world).epsilon(1e-12));
            CHECK(g.wire_bytes == Approx(model.shard).epsilon(1e-12));
            CHECK(rep.wire_bytes == Approx(model.replica).epsilon(1e-12));
        }
        // The optimizer state of the slice; zero2/3 add the rotating gradient buffers (two of the
        // largest block or head, the tied embedding's own); zero3 the gather buffers of the same
        // size (no frozen groups).
        double largest = 0;
        for (size_t u = 1; u < r.padded.size(); ++u) largest = std::max(largest, double(r.padded[u]));
        const double rotating = (2 * largest + double(r.padded[0])) * t;
        CHECK(category(r, C::optimizer_state) == psi / kk * (master + 2 * a));
        CHECK(category(r, C::parameters) == (s == "zero3" ? psi / kk : psi) * t);
        CHECK(category(r, C::gradients) == (s == "zero1" ? psi * t : psi / kk * t + rotating));
        CHECK(category(r, C::comm_buffers) == (s == "zero3" ? rotating : 0));
        const pv::ModelStateMemory m = pv::model_state_memory(config, pv::dtype_of<T>(), groups, s, n, k);
        CHECK(category(r, C::parameters) == m.parameters);
        CHECK(category(r, C::gradients) == m.gradients);
        CHECK(category(r, C::optimizer_state) == m.optimizer_state);
        CHECK(category(r, C::comm_buffers) == m.comm_buffers);
        if (world.rank() == 0) {
            const auto& first = r.per_comm[0];
            auto list = [&](const char* comm) {
                const pv::Comm::Totals& c = first.at(comm);
                return std::to_string(calls(c, CollectiveKind::reduce_scatter)) + " rs + " +
                       std::to_string(calls(c, CollectiveKind::all_gather)) + " ag + " +
                       std::to_string(calls(c, CollectiveKind::all_reduce)) + " ar";
            };
            std::printf(
                "hybrid %s, N = %d, K = %d, %s: psi %.0f; per step world %s %.0f, shard group %s %.0f, replicas %s "
                "%.0f bytes; memory params + grads + optimizer %.0f (+ comm buffers %.0f) bytes\n",
                name, n, k, std::is_same_v<T, double> ? "fp64" : "bf16", psi, list("world").c_str(),
                first.at("world").wire_bytes, list("shard").c_str(), first.at("shard").wire_bytes,
                list("replica").c_str(), first.at("replica").wire_bytes,
                category(r, C::parameters) + category(r, C::gradients) + category(r, C::optimizer_state),
                category(r, C::comm_buffers));
        }
    }
}

}  // namespace parallel_test

TEST_CASE(
    "hybrid sharding: zero1-3 over shard groups of N/2 ranks train what single trains; collectives within and "
    "across groups and memory are exactly as designed",
    "[parallel][hybrid][counting]") {
    pv::World world(nullptr, nullptr);
    check_hybrid<double>(world);
    check_hybrid<__nv_bfloat16>(world);
}
