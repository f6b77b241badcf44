// Loading a Hugging Face model under every strategy (trainer/load.h), in-process under `mpirun -np
// 2` and `-np 4`: each rank reads only what it keeps, and keeps exactly the file's values.
//
// Rank 0 writes a model directory by hand (test/hf_model_dir.h: two shards with an index, BF16,
// F16 and F32 mixed) into a directory every rank sees; every rank then loads it with
// load_pretrained into its strategy's placement. Per rank:
//   - bytes read = every file's header (its 8 + N bytes, read here from the file) + for each group
//     range the strategy says the rank keeps (local_begin/local_len), the elements of each tensor
//     part inside it × that tensor's dtype size in the file — the figure computed from the layouts
//     and the file's own dtypes, independently of the reader;
//   - summed over the ranks, with no layout at all: ZeRO-3 reads the model's tensor bytes exactly
//     once; model parallelism exactly once plus the tied embedding's copy on the last stage; DDP
//     the whole model on every rank;
//   - the range kept holds exactly the file's values (decoded independently), padding zero.
// The awkward model of the parity tests (GQA, odd sizes, vocab 4N + 1) so that no group splits
// without padding and ZeRO-3's slices cut tensors mid-row.
#include <catch2/catch.hpp>

#include "model/llama.h"
#include "parallel/stages.h"
#include "parallel/strategies.h"
#include "parallel/world.h"
#include "test/hf_model_dir.h"
#include "trainer/load.h"

#include "test/mpi/awkward_model.h"

#include <mpi.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace load_test {

namespace fs = std::filesystem;

using pv::test::awkward_model;

// A directory every rank sees (rank 0's pid names it), written by rank 0, removed on scope exit.
struct SharedModelDir {
    fs::path path;
    std::map<std::string, std::vector<double>> values;
    std::map<std::string, std::string> dtypes;
    uint64_t headers = 0;       // Σ over the files of 8 + N
    uint64_t tensor_bytes = 0;  // Σ over the model's tensors of their bytes in the file
    int rank = 0;

    explicit SharedModelDir(const pv::LlamaConfig& c) {
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
        int pid = rank == 0 ? int(::getpid()) : 0;
        MPI_Bcast(&pid, 1, MPI_INT, 0, MPI_COMM_WORLD);
        path = fs::temp_directory_path() / ("polevault_test_mpi_load_" + std::to_string(pid));
        if (rank == 0) fs::remove_all(path);
        values = pv::test::write_model_dir(path, c, 2, {}, nullptr, &dtypes, rank == 0);  // rank 0 writes
        MPI_Barrier(MPI_COMM_WORLD);
        for (const auto& e : fs::directory_iterator(path)) {
            if (e.path().extension() != ".safetensors") continue;
            std::ifstream in(e.path(), std::ios::binary);
            uint8_t prefix[8];
            in.read(reinterpret_cast<char*>(prefix), 8);
            uint64_t n = 0;
            for (int i = 7; i >= 0; --i) n = (n << 8) | prefix[i];
            headers += 8 + n;
        }
        for (const pv::test::HfTensor& t : pv::test::hf_tensors(c))
            tensor_bytes += uint64_t(t.numel()) * pv::safetensors_dtype_size(dtypes.at(t.name));
    }
    ~SharedModelDir() {
        MPI_Barrier(MPI_COMM_WORLD);
        std::error_code ignore;
        if (rank == 0) fs::remove_all(path, ignore);
    }
};

long long sum_over_ranks(long long x) {
    long long total = 0;
    MPI_Allreduce(&x, &total, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    return total;
}

// Loads the directory under `strategy` and checks this rank's bytes and values; returns the data
// bytes (without headers) this rank read.
template <class T>
uint64_t check_strategy_load(pv::World& world, const std::string& strategy, const pv::LlamaConfig& c,
                             const SharedModelDir& dir, const std::set<std::string>& frozen = {}) {
    pv::StrategyOptions so;
    so.kind = pv::strategy_kind(strategy);
    const pv::StrategyPlan plan = pv::plan_strategy(so, c, 8, world.rank(), world.size());
    pv::ModelOptions mo;
    mo.batch = 1, mo.seq_len = 8, mo.seed = 42, mo.frozen = frozen, mo.placement = plan.placement;
    pv::Llama<T> model(c, mo);
    std::unique_ptr<pv::Strategy<T, T>> s = pv::make_strategy<T, T>(plan, model, &world.comm(), 42);
    const pv::LoadStats stats = pv::load_pretrained(dir.path.string(), *s);

    uint64_t expected = dir.headers;
    for (int u = 0; u < model.num_units(); ++u)
        for (int g = 0; g < model.num_groups(u); ++g) {
            const pv::GroupLayout& layout = model.group(u, g);
            const long long begin = s->local_begin(u, g), len = s->local_len(u, g);
            std::vector<double> want(size_t(layout.padded), 0.0);  // the group as the file says, padding 0
            for (const pv::TensorSlot& slot : layout.tensors)
                for (const pv::TensorPart& part : slot.spec.parts) {
                    const long long first = slot.offset + part.row_begin * slot.spec.cols;
                    const std::vector<double>& v = dir.values.at(part.hf_name);
                    for (size_t i = 0; i < v.size(); ++i) want[size_t(first) + i] = v[i];
                    const long long lo = std::max(first, begin);
                    const long long hi = std::min(first + (long long)v.size(), begin + len);
                    if (hi > lo)
                        expected += uint64_t(hi - lo) * pv::safetensors_dtype_size(dir.dtypes.at(part.hf_name));
                }
            if (len == 0) continue;
            std::vector<T> got(static_cast<size_t>(len));
            CUDA_CHECK(cudaMemcpy(got.data(), s->local_params(u, g), got.size() * sizeof(T), cudaMemcpyDeviceToHost));
            for (long long i = 0; i < len; ++i) {
                double w = want[size_t(begin + i)];
                if (std::is_same_v<T, __nv_bfloat16>) w = pv::test::bf16_round(w);
                INFO(strategy << ", rank " << world.rank() << ", unit " << u << ", group " << g << ", element "
                              << begin + i);
                REQUIRE(double(pv::to_acc(got[size_t(i)])) == w);
            }
        }
    INFO(strategy << ", rank " << world.rank());
    CHECK(stats.bytes_read == expected);
    CHECK(stats.overflows == 0);
    CHECK(stats.files == 2);
    return stats.bytes_read - dir.headers;
}

// rank 0 prints every rank's figure, for the report.
void print_figures(const std::string& label, pv::World& world, uint64_t data, const SharedModelDir& dir) {
    std::vector<long long> all(size_t(world.size()));
    const long long mine = (long long)data;
    MPI_Gather(&mine, 1, MPI_LONG_LONG, all.data(), 1, MPI_LONG_LONG, 0, MPI_COMM_WORLD);
    if (world.rank() != 0) return;
    std::printf("load bytes, %s, N = %d: model tensors %llu bytes, headers %llu bytes; per rank (data + headers):",
                label.c_str(), world.size(), (unsigned long long)dir.tensor_bytes, (unsigned long long)dir.headers);
    for (int r = 0; r < world.size(); ++r)
        std::printf(" %d: %lld + %llu", r, all[size_t(r)], (unsigned long long)dir.headers);
    std::printf("\n");
}

}  // namespace load_test

using namespace load_test;

TEST_CASE("load: zero3 ranks each read only their slices, together the model once; exact values", "[load][zero3]") {
    pv::World world(nullptr, nullptr);
    for (bool tied : {true, false}) {
        const pv::LlamaConfig c = awkward_model(world.size(), tied);
        const SharedModelDir dir(c);
        const uint64_t data = check_strategy_load<double>(world, "zero3", c, dir);
        CHECK(sum_over_ranks((long long)data) == (long long)dir.tensor_bytes);
        CHECK(data < dir.tensor_bytes);  // a slice, not the model
        print_figures(std::string("zero3, ") + (tied ? "tied" : "untied"), world, data, dir);
        // bf16: the same bytes, values rounded. Frozen groups are sliced and loaded too (the slices
        // fall elsewhere: each group is cut into N).
        CHECK(check_strategy_load<__nv_bfloat16>(world, "zero3", c, dir) == data);
        const uint64_t frozen = check_strategy_load<double>(world, "zero3", c, dir, {"layers.0.w_qkv", "final_norm"});
        CHECK(sum_over_ranks((long long)frozen) == (long long)dir.tensor_bytes);
    }
}

TEST_CASE("load: mp stages read only their units (the last also the tied embedding); exact values", "[load][mp]") {
    pv::World world(nullptr, nullptr);
    for (bool tied : {true, false}) {
        const pv::LlamaConfig c = awkward_model(world.size(), tied);
        const SharedModelDir dir(c);
        const uint64_t data = check_strategy_load<double>(world, "mp", c, dir);
        uint64_t embedding = 0;
        for (const pv::test::HfTensor& t : pv::test::hf_tensors(c))
            if (t.name == "model.embed_tokens.weight")
                embedding = uint64_t(t.numel()) * pv::safetensors_dtype_size(dir.dtypes.at(t.name));
        const long long copies = tied && world.size() > 1 ? (long long)embedding : 0;
        CHECK(sum_over_ranks((long long)data) == (long long)dir.tensor_bytes + copies);
        print_figures(std::string("mp, ") + (tied ? "tied" : "untied"), world, data, dir);
    }
}

TEST_CASE("load: ddp and zero1 ranks each read the whole model; exact values", "[load][ddp]") {
    pv::World world(nullptr, nullptr);
    const pv::LlamaConfig c = awkward_model(world.size(), true);
    const SharedModelDir dir(c);
    for (const char* strategy : {"ddp", "zero1"}) {
        INFO(strategy);
        CHECK(check_strategy_load<double>(world, strategy, c, dir) == dir.tensor_bytes);
    }
}
