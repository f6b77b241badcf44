// The memory planner (parallel/planner.h).
#include "parallel/planner.h"

#include "parallel/comm_cost.h"

#include "kernels/glue.cuh"
#include "kernels/rope.cuh"
#include "model/decoder.h"
#include "model/llama.h"
#include "model/tensor_parallel.h"
#include "optim/clip.cuh"
#include "optim/offload.h"
#include "optim/optimizer.cuh"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <stdexcept>

namespace pv {

namespace {

using C = MemoryCategory;

// One rank's lines, added to by name (a line named twice adds up).
struct Lines {
    std::vector<MemoryLine> lines;
    void add(const std::string& name, C category, double bytes) {
        if (bytes <= 0) return;
        for (MemoryLine& l : lines)
            if (l.name == name) {
                l.bytes += bytes;
                return;
            }
        lines.push_back({name, category, bytes});
    }
};

const char* group_line(GroupKind k, bool lora) {
    switch (k) {
        case GroupKind::trainable: return lora ? "adapters (LoRA)" : "parameters";
        case GroupKind::frozen: return lora ? "frozen base" : "frozen parameters";
        case GroupKind::nf4: return "NF4 base (codes + absmaxes)";
    }
    return "parameters";
}

}  // namespace

RankMemory plan_rank(const PlanRequest& q, int rank) {
    StrategyOptions so = q.strategy;
    so.micro_per_step = q.accumulation;  // a pipeline's slots depend on them (parallel/schedule.h)
    const StrategyPlan sp = plan_strategy(so, q.config, q.seq_len, rank, q.ranks);
    const Placement& place = sp.placement;
    GroupOptions groups = q.groups;
    groups.tensor = place.tensor;  // a tensor-parallel rank's slices (model/tensor_parallel.h)
    const auto layouts = model_layouts(q.config, q.dtype, place.shards, groups);
    const LlamaConfig shape = tensor_parallel_shape(q.config, place.tensor);  // what the rank computes with
    const int units = int(layouts.size());
    std::vector<StageUnits> chunks = place.chunks;  // ends resolved
    for (StageUnits& c : chunks) c.end = c.end < 0 ? units : c.end;
    const bool tied = q.config.tie_embeddings, lora = q.groups.lora.enabled();
    const double t = double(dtype_size(q.dtype)), a = q.dtype == DType::fp64 ? 8 : 4;
    const double rows = double(q.micro_batch) * q.seq_len, hidden = q.config.hidden_size;
    const double stream_rows = double(place.tensor.stream_rows((long long)rows));  // the residual stream's
    const std::vector<UnitSpec> specs = model_units(q.config, q.groups.lora);
    auto runs_here = [&](int u) {
        for (const StageUnits& c : chunks)
            if (u >= c.first && u < c.end) return true;
        return false;
    };
    auto held = [&](int u) { return runs_here(u) || (u == 0 && tied && chunks.back().end == units); };
    // The trainer's batch buffers: one per activation slot of every chunk.
    int buffer_slots = 0;
    for (const StageUnits& c : chunks) buffer_slots += c.slots;
    auto trainable = [&](int u) { return layouts[size_t(u)].front(); };
    auto unit_elements = [&](int u) {
        double n = 0;
        for (const GroupLayout& g : layouts[size_t(u)]) n += double(g.padded);
        return n;
    };
    const DataPolicy& policy = sp.info->policy;  // its parts (parallel/policy.h)
    const bool rotating = policy.rotating_gradients(), sharded_params = policy.sharded_parameters();
    const double shards = place.shards;
    Lines m;

    // The model (Llama's constructor): its groups where it owns them, gradients where it owns
    // them, an arena per unit it runs per slot, the RoPE table, the workspace, the two
    // residual-gradient buffers.
    for (int u = 0; u < units; ++u) {
        if (!held(u)) continue;
        if (place.parameters == Parameters::owned)
            for (const GroupLayout& g : layouts[size_t(u)])
                if (g.padded > 0) m.add(group_line(g.kind, lora), C::parameters, double(g.bytes()));
        if (place.gradients == Gradients::owned && trainable(u).padded > 0)
            m.add("gradients", C::gradients, double(trainable(u).bytes()));
    }
    // The activations: each unit's arena per slot (a recomputed block's output alone) and the
    // recompute arena, as the model allocates them (activation_arenas).
    const ActivationArenas arenas = activation_arenas(shape, q.micro_batch, q.seq_len, q.dtype, q.groups.lora,
                                                      q.checkpointing, chunks,
                                                      place.tensor.sequence ? place.tensor.size : 1);
    for (int u = 0; u < units; ++u)
        if (runs_here(u)) m.add(
            specs[size_t(u)].kind == UnitKind::head ? "head: normed rows, row losses and statistics" : "activations (saved for the backward)",
            C::activations, double(arenas.slots[size_t(u)]) * double(arenas.slot_bytes[size_t(u)]));
    m.add("recompute arena (checkpointing)", C::activations, double(arenas.recompute_bytes));
    m.add("workspace (one unit's transients)", C::workspace,
          double(arena_bytes(
              model_workspace_layout(q.config, q.micro_batch, q.seq_len, q.dtype, q.groups.lora, q.groups.nf4,
                                     place.tensor))) +
              2 * stream_rows * hidden * t);  // + the residual stream's two gradient buffers
    m.add("RoPE table", C::workspace, double(rope_inverse_frequencies(q.config).size()) * 2 * q.seq_len * a);
    if (q.strategy.cuda_graphs)
        m.add("cuBLAS workspace (--cuda-graphs)", C::workspace, double(kCublasGraphWorkspaceBytes));

    // The strategy (parallel/strategy.h and its subclass).
    const bool fp32_accumulation = q.strategy.fp32_grad_accumulation && q.dtype == DType::bf16;
    long long largest_trainable = 0;
    for (int u = 0; u < units; ++u) {
        largest_trainable = std::max(largest_trainable, trainable(u).padded);
        if (fp32_accumulation && held(u) && trainable(u).padded > 0)
            m.add("fp32 gradient accumulation", C::gradients, 4.0 * double(trainable(u).padded));
    }
    m.add("norm scratch", C::workspace,
          double(sum_of_squares_scratch_bytes<float>(largest_trainable)) + 2.0 * units * sizeof(double));
    if (rotating) {  // parallel/gradients_rotating.h: each held unit's slice, two rotating unit gradients, a tied embedding's own
        long long largest_rotating = 0;
        for (int u = tied ? 1 : 0; u < units; ++u)
            if (runs_here(u)) largest_rotating = std::max(largest_rotating, trainable(u).padded);
        for (int u = 0; u < units; ++u)
            if (held(u)) m.add("gradient slices", C::gradients, double(trainable(u).padded) / shards * t);
        m.add("rotating gradient buffers", C::gradients,
              (2 * double(largest_rotating) + (tied && held(0) ? double(trainable(0).padded) : 0)) * t);
    }
    if (sharded_params) {  // parallel/parameters_sharded.h: every group's slice, two gather buffers, a tied embedding's own
        // (--offload params: the slices in pinned host memory, each gather buffer's slice staged on the device)
        const bool host = q.strategy.offload == Offload::params;
        for (int u = 0; u < units; ++u)
            for (const GroupLayout& g : layouts[size_t(u)])
                if (held(u))
                    m.add(group_line(g.kind, lora) + std::string(host ? " (slice, host)" : " (slice)"),
                          host ? C::pinned_host : C::parameters, double(g.padded) / shards * t);
        std::vector<long long> elements;
        for (int u = 0; u < units; ++u) elements.push_back(held(u) ? (long long)unit_elements(u) : 0);
        double gathered = 0;
        for (long long n : zero3_gather_buffers(elements, tied)) gathered += double(n);
        m.add("gathered parameters", C::comm_buffers, gathered * t);
        if (host) m.add("parameter upload staging", C::comm_buffers, gathered / shards * t);
    }
    // The sample after the last step (trainer/run.cu finish), on a rank that holds the whole model:
    // a Decoder beside everything the run still holds (decoder_buffers).
    if (q.sample_rows > 0 && !sharded_params && place.tensor.size == 1 && chunks.size() == 1 && chunks[0].first == 0 &&
        chunks[0].end == units) {
        const std::vector<ActivationBuffer> b =
            decoder_buffers(q.config, q.dtype, q.groups.lora, q.sample_positions, q.sample_rows);
        double cache = 0, work = 0;
        for (size_t i = 0; i < b.size(); ++i) (int(i) < kDecoderCacheBuffers ? cache : work) += double(b[i].bytes());
        m.add("sample after training: KV cache", C::activations, cache);
        m.add("sample after training: workspace", C::workspace, work);
    }
    if (sp.pipelined()) {  // parallel/pp.h: each chunk's input per micro-batch in flight (not stage 0's)
        double inputs = 0;
        for (size_t c = 0; c < chunks.size(); ++c)
            if (chunks[c].first > 0) inputs += chunks[c].slots;
        m.add("pipeline stage inputs", C::activations, inputs * stream_rows * hidden * t);
    }

    // The optimizer (optim/optimizer.cuh AdamWState): the owned range of each held unit.
    // (ZeRO shards over its shard group: consecutive ranks, this rank's place in it.)
    const int opt_shards = policy.sharded_optimizer() ? place.shards : 1;
    const int opt_shard = opt_shards > 1 ? sp.data_rank % opt_shards : 0;
    // Offloaded (--offload, optim/offload.h): the same fields in pinned host memory, no device
    // table, and the CPU update's pinned staging (offload_staging_bytes).
    const bool offload = q.strategy.offload != Offload::none;
    const C state = offload ? C::pinned_host : C::optimizer_state;
    const std::string where = offload ? " (host)" : "";
    long long largest_owned = 0;
    for (int u = 0; u < units; ++u) {
        if (!held(u)) continue;
        const long long len = trainable(u).padded / opt_shards;
        if (len == 0) continue;
        largest_owned = std::max(largest_owned, len);
        if (q.dtype == DType::bf16) m.add("fp32 master weights" + where, state, double(len) * a);
        m.add("Adam m" + where, state, double(len) * a);
        m.add("Adam v" + where, state, double(len) * a);
        const long long begin = len * opt_shard;
        if (!offload)
            m.add("optimizer tables", C::workspace,
                  double(owned_pieces(trainable(u), begin, begin + len).size() * sizeof(AdamWSlot)));
    }
    if (offload)
        m.add("offload staging (pinned)", C::pinned_host,
              double(offload_staging_bytes(largest_owned, q.strategy.offload == Offload::params ? 0 : size_t(t),
                                           fp32_accumulation ? 4 : size_t(t))));

    // The trainer (trainer/trainer.h): a slot's token, target and position ids and dropout keys,
    // the micro-batches' loss sums (grown to the accumulation on the first step, the old array freed
    // after the new one exists), the loss all-reduce's terms and their sums, the counts, the loss
    // scale, the step's figures and each unit's update flag; pinned staging for the uploads (with
    // their keys) and read-backs.
    const double losses = buffer_slots + (q.accumulation > buffer_slots ? q.accumulation : 0);
    const double step_sums = 2.0 * kLossAllReduceDoubles * sizeof(double);
    const double update_flags = double(units) * sizeof(unsigned long long);
    const double keys = 2.0 * sizeof(long long);  // a micro-batch's dropout keys (DeviceBatch::dropout_keys)
    m.add("batch and loss buffers", C::workspace,
          3 * rows * buffer_slots * sizeof(int) + buffer_slots * keys + losses * a + buffer_slots * sizeof(int) +
              step_sums + 2 * sizeof(long long) + sizeof(double) + sizeof(StepFigures) + update_flags);
    m.add("upload staging (pinned)", C::pinned_host,
          2.0 * buffer_slots * (3 * rows * sizeof(int) + keys) + sizeof(StepFigures) + 2 * sizeof(long long) +
              sizeof(double) + step_sums + update_flags);
    // A step's micro-batches as the loader gives them (inputs, targets, positions), pageable.
    m.add("a step's micro-batches", C::pinned_host, 3.0 * q.accumulation * rows * sizeof(int));

    RankMemory r;
    r.rank = rank;
    r.lines = std::move(m.lines);
    if (sp.pipelined()) {
        const int per_stage = sp.mesh.ranks() / sp.mesh.pipeline, stage = mesh_coords(sp.mesh, rank).pipeline;
        r.role = "stage " + std::to_string(stage) +
                 (per_stage > 1 ? " (ranks " + std::to_string(rank) + "-" + std::to_string(rank + per_stage - 1) + ")"
                                : "") +
                 ": units";
        for (const StageUnits& c : chunks)
            r.role += (&c == &chunks.front() ? " " : ", ") + std::to_string(c.first) + "-" + std::to_string(c.end - 1);
    } else {
        r.role = q.ranks == 1 ? "the rank" : "every rank";
    }
    return r;
}

double RankMemory::category(MemoryCategory c) const {
    double s = 0;
    for (const MemoryLine& l : lines)
        if (l.category == c) s += l.bytes;
    return s;
}

double RankMemory::host_total() const { return category(C::pinned_host); }

double RankMemory::device_total() const {
    double s = 0;
    for (const MemoryLine& l : lines)
        if (l.category != C::pinned_host) s += l.bytes;
    return s;
}

const RankMemory& MemoryPlan::largest() const {
    size_t best = 0;
    for (size_t i = 1; i < ranks.size(); ++i)
        if (ranks[i].device_total() > ranks[best].device_total()) best = i;
    return ranks.at(best);
}

TensorWire plan_tensor_wire(const PlanRequest& q, int rank) {
    StrategyOptions so = q.strategy;
    so.micro_per_step = q.accumulation;
    const StrategyPlan sp = plan_strategy(so, q.config, q.seq_len, rank, q.ranks);
    const int units = q.config.num_layers + 2;  // the embedding, the blocks, the head
    int blocks = 0, recomputed = 0, trained_qkv = 0;
    bool embedding = false, head = false;
    TensorSequence sequence{q.strategy.sequence_parallel && q.strategy.tensor > 1};
    const bool lora = q.groups.lora.enabled();
    auto trains = [&](const std::string& name) { return !lora && !q.groups.frozen.count(name); };
    for (const StageUnits& c : sp.placement.chunks)
        for (int u = c.first; u < (c.end < 0 ? units : c.end); ++u) {
            if (u == 0 || u == units - 1) {
                (u == 0 ? embedding : head) = true;
                if (u == 0) sequence.embedding_trains = trains("wte");
                else sequence.trained_norms += trains("final_norm");
                continue;
            }
            const std::string b = "layers." + std::to_string(u - 1) + ".";
            ++blocks;
            recomputed += q.checkpointing.recomputes(u - 1);
            trained_qkv += trains(b + "w_qkv");
            sequence.trained_norms += trains(b + "attn_norm") + trains(b + "mlp_norm");
        }
    return tensor_parallel_wire(q.config, q.dtype, q.groups.lora, q.strategy.tensor,
                                (long long)q.micro_batch * q.seq_len, q.accumulation, blocks, recomputed, trained_qkv,
                                embedding, head, sequence);
}

MemoryPlan plan_memory(const PlanRequest& q) {
    if (q.micro_batch < 1 || q.seq_len < 1 || q.ranks < 1 || q.accumulation < 1)
        throw std::invalid_argument("plan_memory: micro-batch, seq-len, ranks and accumulation must be >= 1");
    if (q.strategy.sequence_parallel && q.strategy.tensor > 1 && (long long)q.micro_batch * q.seq_len % q.strategy.tensor)
        throw std::invalid_argument("plan_memory: sequence parallelism over " + std::to_string(q.strategy.tensor) +
                                    " ranks needs a micro-batch's tokens (micro-batch x seq-len) divisible by it");
    MemoryPlan p;
    p.request = q;
    // Data-parallel ranks are alike (equal slices); a pipeline's stages differ: each stage's first
    // rank. Of a tensor-parallel group the first holds the most (model/tensor_parallel.h: the last
    // may hold fewer vocabulary rows), so its plan bounds the others'.
    const MeshShape mesh = mesh_of(q.strategy, q.ranks);
    for (int s = 0; s < mesh.pipeline; ++s) p.ranks.push_back(plan_rank(q, s * (q.ranks / mesh.pipeline)));
    return p;
}

namespace {

// clang-format off
const std::vector<std::pair<std::string, double>> kGpus = {
    {"h100-80", 80.0 * (1ull << 30)}, {"a100-80", 80.0 * (1ull << 30)}, {"a100-40", 40.0 * (1ull << 30)},
    {"l4-24", 24.0 * (1ull << 30)},   {"rtx4090-24", 24.0 * (1ull << 30)}, {"rtx3090-24", 24.0 * (1ull << 30)},
    {"t4-16", 16.0 * (1ull << 30)},   {"rtx6000ada-48", 48.0 * (1ull << 30)},
};
// clang-format on

}  // namespace

std::vector<std::string> gpu_names() {
    std::vector<std::string> out;
    for (const auto& [name, bytes] : kGpus) out.push_back(name);
    return out;
}

GpuMemory parse_gpu_memory(const std::string& text) {
    for (const auto& [name, bytes] : kGpus)
        if (text == name) return {name, bytes};
    std::string names;
    for (const auto& [name, bytes] : kGpus) names += (names.empty() ? "" : ", ") + name;
    const std::string problem =
        "--gpu-memory '" + text + "' is neither a GPU (" + names + ") nor a number of bytes (like 80GiB, 24GB or 16e9)";
    size_t used = 0;
    double value = 0;
    try {
        value = std::stod(text, &used);
    } catch (const std::exception&) {
        throw std::invalid_argument(problem);
    }
    const std::string unit = text.substr(used);
    const std::map<std::string, double> units = {{"", 1},
                                                 {"B", 1},
                                                 {"KB", 1e3},
                                                 {"MB", 1e6},
                                                 {"GB", 1e9},
                                                 {"TB", 1e12},
                                                 {"KiB", 1 << 10},
                                                 {"MiB", 1 << 20},
                                                 {"GiB", double(1ull << 30)},
                                                 {"TiB", double(1ull << 40)}};
    const auto it = units.find(unit);
    if (it == units.end() || !std::isfinite(value) || value <= 0) throw std::invalid_argument(problem);
    return {"", value * it->second};
}

std::string format_bytes(double bytes) {
    char s[32];
    if (bytes >= double(1ull << 30))
        std::snprintf(s, sizeof s, "%.2f GiB", bytes / double(1ull << 30));
    else if (bytes >= double(1 << 20))
        std::snprintf(s, sizeof s, "%.1f MiB", bytes / double(1 << 20));
    else if (bytes >= 1024)
        std::snprintf(s, sizeof s, "%.1f KiB", bytes / 1024.0);
    else
        std::snprintf(s, sizeof s, "%.0f B", bytes);
    return s;
}

std::string format_plan(const MemoryPlan& plan, const GpuMemory* gpu) {
    // Rows: every line name any rank has, in first-seen order, grouped by category.
    std::vector<std::pair<std::string, MemoryCategory>> rows;
    for (int c = 0; c < kMemoryCategoryCount; ++c)
        for (const RankMemory& r : plan.ranks)
            for (const MemoryLine& l : r.lines)
                if (int(l.category) == c &&
                    std::none_of(rows.begin(), rows.end(), [&](const auto& x) { return x.first == l.name; }))
                    rows.emplace_back(l.name, l.category);
    std::string out;
    char line[256];
    const int w = 40;
    std::snprintf(line, sizeof line, "%-*s", w, "per rank");
    out += line;
    for (const RankMemory& r : plan.ranks) {
        std::snprintf(line, sizeof line, " %22s", r.role.c_str());
        out += line;
    }
    out += "\n";
    int last_category = -1;
    for (const auto& [name, category] : rows) {
        if (int(category) != last_category) {
            if (category == C::pinned_host) out += "host memory (not on the device)\n";
            last_category = int(category);
        }
        std::snprintf(line, sizeof line, "  %-*s", w - 2, name.c_str());
        out += line;
        for (const RankMemory& r : plan.ranks) {
            double b = 0;
            for (const MemoryLine& l : r.lines)
                if (l.name == name) b += l.bytes;
            std::snprintf(line, sizeof line, " %22s", b > 0 ? format_bytes(b).c_str() : "-");
            out += line;
        }
        out += "\n";
    }
    std::snprintf(line, sizeof line, "%-*s", w, "device total");
    out += line;
    for (const RankMemory& r : plan.ranks) {
        std::snprintf(line, sizeof line, " %22s", format_bytes(r.device_total()).c_str());
        out += line;
    }
    out += "\n";
    if (gpu) {
        const double peak = plan.peak();
        std::snprintf(line, sizeof line,
                      "%s on %s (%s; polevault may use %s of it: %s reserved for the CUDA context, cuBLAS and NCCL, "
                      "%.0f%% allocator slack): %s, %.0f%% of what it may use\n",
                      peak <= gpu->usable() ? "fits" : "DOES NOT FIT",
                      gpu->name.empty() ? "the GPU" : gpu->name.c_str(), format_bytes(gpu->bytes).c_str(),
                      format_bytes(gpu->usable()).c_str(), format_bytes(kReservedBytes).c_str(), 100 * kSlackFraction,
                      format_bytes(peak).c_str(), 100 * peak / gpu->usable());
        out += line;
    }
    return out;
}

}  // namespace pv

namespace pv {

namespace {

bool fits(const PlanRequest& q, double budget, double* peak = nullptr) {
    try {
        const double p = plan_memory(q).peak();
        if (peak) *peak = p;
        return p <= budget;
    } catch (const std::invalid_argument&) {  // the strategy cannot run on these ranks
        return false;
    }
}

}  // namespace

int largest_micro_batch(PlanRequest q, double budget, int limit) {
    // Memory grows with the micro-batch: the largest that fits by bisection.
    int lo = 1, hi = std::max(1, limit);
    q.micro_batch = 1;
    if (!fits(q, budget)) return 0;
    while (lo < hi) {
        const int mid = lo + (hi - lo + 1) / 2;
        q.micro_batch = mid;
        if (fits(q, budget))
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

int smallest_world(PlanRequest q, const std::string& strategy, double budget) {
    q.strategy = with_strategy(q.strategy, strategy_kind(strategy));
    bool runs = false;  // the strategy accepted the request at some world size
    for (int n : {1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 2048, 4096}) {
        if (strategy_info(strategy).one_rank && n > 1) break;
        if (!strategy_info(strategy).one_rank && n == 1) continue;
        q.ranks = n;
        double peak = -1;
        if (fits(q, budget, &peak)) return n;
        runs = runs || peak >= 0;
    }
    return runs ? 0 : -1;
}

ActivationCheckpointing fewest_recomputing_blocks(PlanRequest q, double budget) {
    const int blocks = q.config.num_layers;
    const auto fits_with = [&](int k) {
        q.checkpointing = ActivationCheckpointing{k > 0, 0, k};
        return plan_memory(q).peak() <= budget;
    };
    if (fits_with(0)) return ActivationCheckpointing{false, 0, 0};
    if (!fits_with(blocks)) return ActivationCheckpointing{true, 0, blocks};
    int lo = 0, hi = blocks;  // lo does not fit, hi does
    while (hi - lo > 1) {
        const int mid = lo + (hi - lo) / 2;
        (fits_with(mid) ? hi : lo) = mid;
    }
    return ActivationCheckpointing{true, 0, hi};
}

std::vector<std::string> changes_that_fit(const PlanRequest& request, double budget) {
    std::vector<std::string> out;
    auto line = [&](const std::string& change, const PlanRequest& q) {
        out.push_back(change + " (" + format_bytes(plan_memory(q).peak()) + " per rank)");
    };
    // A change that saves model state (LoRA, QLoRA, offload) may fit only once the activations
    // shrink too: q with activation checkpointing, then the largest micro-batch that fits, added
    // as needed; true (and the flags appended to `change`) when q then fits.
    auto fits_with_activation_savers = [&](PlanRequest& q, std::string& change) {
        if (fits(q, budget)) return true;
        if (!q.checkpointing.enabled || q.checkpointing.keep_every > 0) {
            q.checkpointing = ActivationCheckpointing{true, 0};
            change += " --checkpoint-activations";
            if (fits(q, budget)) return true;
        }
        const int m = q.micro_batch > 1 ? largest_micro_batch(q, budget, q.micro_batch - 1) : 0;
        if (m <= 0) return false;
        q.micro_batch = m;
        change += " --micro-batch " + std::to_string(m);
        return true;
    };
    if (request.micro_batch > 1)
        if (const int m = largest_micro_batch(request, budget, request.micro_batch - 1); m > 0) {
            PlanRequest q = request;
            q.micro_batch = m;
            line("--micro-batch " + std::to_string(m), q);
        }
    if (!request.checkpointing.enabled || request.checkpointing.keep_every > 0) {
        PlanRequest q = request;
        q.checkpointing = ActivationCheckpointing{true, 0};
        if (fits(q, budget)) line("--checkpoint-activations", q);
    }
    if (request.ranks > 1)
        for (const StrategyInfo& info : strategy_registry()) {  // those that save memory on these ranks
            const std::string s = info.name;
            if (info.one_rank || !(info.policy.shards() || info.stages) || info.kind == request.strategy.kind) continue;
            PlanRequest q = request;
            q.strategy = with_strategy(q.strategy, strategy_kind(s));
            if (fits(q, budget)) {
                line("--parallel " + s, q);
                break;
            }
        }
    if (request.strategy.offload == Offload::none && !has_pipeline(request.strategy)) {
        // The optimizer state to the host, then (zero3) the parameter slices too.
        PlanRequest q = request;
        q.strategy.offload = Offload::optimizer;
        std::string change = "--offload optimizer";
        if (fits_with_activation_savers(q, change)) {
            line(change, q);
        } else if (strategy_info(request.strategy.kind).policy.sharded_parameters() && !request.groups.nf4) {
            q = request;
            q.strategy.offload = Offload::params;
            change = "--offload params";
            if (fits_with_activation_savers(q, change)) line(change, q);
        }
    }
    // Tensor parallelism over these ranks (parallel/plan.h StrategyOptions::tensor): the smallest
    // --tp, up to a node's 8 GPUs, that splits the model and fits (under ddp when it takes every
    // rank: nothing is left for ZeRO to shard).
    if (request.ranks > 1 && request.strategy.tensor == 1 && !request.groups.nf4 && !has_pipeline(request.strategy) &&
        request.strategy.offload == Offload::none && !strategy_info(request.strategy.kind).stages)
        for (int t = 2; t <= std::min(8, request.ranks); t *= 2) {
            if (request.ranks % t != 0 || !tensor_parallel_fits(request.config, t) ||
                kv_heads_replicated(request.config, t))
                continue;
            PlanRequest q = request;
            q.strategy.tensor = t;
            const bool whole_world = t == request.ranks && q.strategy.kind != StrategyKind::ddp;
            if (whole_world) q.strategy = with_strategy(q.strategy, StrategyKind::ddp);
            if (fits(q, budget)) {
                line("--tp " + std::to_string(t) + (whole_world ? " --parallel ddp" : ""), q);
                break;
            }
        }
    for (const StrategyInfo& info : strategy_registry()) {  // those whose per-rank memory shrinks with more ranks
        const std::string s = info.name;
        if (!info.policy.sharded_parameters() && !info.stages) continue;
        if (const int n = smallest_world(request, s, budget); n > request.ranks) {
            PlanRequest q = request;
            q.strategy = with_strategy(q.strategy, strategy_kind(s)), q.ranks = n;
            line("--parallel " + s + " on " + std::to_string(n) + " ranks", q);
            break;
        }
    }
    if (!request.groups.lora.enabled()) {
        PlanRequest q = request;
        q.groups.lora.rank = 16, q.groups.lora.alpha = 32, q.groups.frozen.clear();
        std::string change = "LoRA: --lora-rank 16";
        if (fits_with_activation_savers(q, change)) line(change, q);
        q = request;
        q.groups.lora.rank = 16, q.groups.lora.alpha = 32, q.groups.frozen.clear(), q.groups.nf4 = true;
        change = "QLoRA: --lora-rank 16 --quantize nf4";
        if (q.dtype == DType::bf16 && q.strategy.tensor == 1 && fits_with_activation_savers(q, change)) line(change, q);
    } else if (!request.groups.nf4 && request.dtype == DType::bf16 && request.strategy.tensor == 1) {  // (not under --tp yet)
        PlanRequest q = request;
        q.groups.nf4 = true;
        std::string change = "QLoRA: --quantize nf4";
        if (fits_with_activation_savers(q, change)) line(change, q);
    }
    return out;
}

}  // namespace pv
