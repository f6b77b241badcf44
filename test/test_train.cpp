// The `train` program end to end, run as a separate process (the binary of this build flavour,
// build/<flavour>/train): a tiny run learns and prints what it should; two runs with the same
// seed print the same losses bit for bit; a run interrupted and resumed from its checkpoint ends
// bit-identical to one that was not; `train sample` and `train prepare` (text, and chats trained
// with --document-mask) work from their files;
// a model trained on the built-in corpus beats the corpus's unigram entropy; bad input fails with
// a message naming the fix; --freeze keeps the tensors it names bit-identical on every strategy.
#include <catch2/catch.hpp>

#include "data/shard.h"
#include "data/tokenizer.h"
#include "formats/safetensors.h"
#include "test/temp_dir.h"
#include "test/train_runner.h"

#include <nlohmann/json.hpp>

#include <nlohmann/json.hpp>

#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

using namespace train_test;

TEST_CASE("train: a tiny run on the built-in corpus learns, evaluates, checkpoints and samples", "[train]") {
    TempDir dir("train");
    const Run r = run_train(kTiny + " --sample-tokens 6 --out-dir " + dir.path.string());
    INFO(r.output);
    REQUIRE(r.status == 0);
    const auto l = losses(r.output);
    REQUIRE(l.size() == 6);
    for (const auto& v : l) REQUIRE(v.size() >= 8);  // at least 7 significant digits: "d.ddddddd"
    REQUIRE(std::stod(l.back()) < std::stod(l.front()));
    REQUIRE(validation_losses(r.output).size() == 2);
    // The step line's elapsed time and ETA: unknown after the first step, none left after the last.
    const std::regex clock(R"(\| ([0-9]+):([0-9]{2}):([0-9]{2}) elapsed, ETA (\?|[0-9]+:[0-9]{2}:[0-9]{2}) \|)");
    std::vector<std::string> etas;
    double last_elapsed = 0;
    for (auto it = std::sregex_iterator(r.output.begin(), r.output.end(), clock); it != std::sregex_iterator(); ++it) {
        const double elapsed = std::stod((*it)[1]) * 3600 + std::stod((*it)[2]) * 60 + std::stod((*it)[3]);
        CHECK(elapsed >= last_elapsed);
        last_elapsed = elapsed;
        etas.push_back((*it)[4]);
    }
    REQUIRE(etas.size() == 6);
    CHECK(etas.front() == "?");
    CHECK(etas.back() == "0:00:00");
    // Evaluation prints the perplexity, e^loss, and metrics.jsonl records it beside the loss.
    const std::regex printed(R"(validation loss ([0-9.]+) \(perplexity ([0-9.]+)\))");
    std::smatch p;
    REQUIRE(std::regex_search(r.output, p, printed));
    CHECK(std::stod(p[2]) == Approx(std::exp(std::stod(p[1]))).epsilon(1e-4));
    const std::regex recorded(R"(\{"step": 6, "val_loss": ([-0-9.e+]+), "val_ppl": ([-0-9.e+]+)\})");
    const std::string metrics = read_file(dir.path / "metrics.jsonl");
    REQUIRE(std::regex_search(metrics, p, recorded));
    CHECK(std::stod(p[2]) == Approx(std::exp(std::stod(p[1]))).epsilon(1e-15));
    REQUIRE(r.output.find("sample (temperature") != std::string::npos);
    REQUIRE(fs::exists(dir.path / "metrics.jsonl"));
    for (const char* f : {"model.safetensors", "master.safetensors", "adam_m.safetensors", "adam_v.safetensors",
                          "config.json", "tokenizer.json", "trainer_state.json"})
        REQUIRE(fs::exists(dir.path / "step_6" / f));
    REQUIRE_FALSE(fs::exists(dir.path / "step_6.tmp"));
}

// Determinism, a property of the numerics: left out of the ASan build ([heavy]), where its three
// plain runs would repeat the code path the tiny run above checks.
TEST_CASE("train: two runs with the same seed print identical losses", "[train][heavy]") {
    TempDir dir("train_det");
    const Run a = run_train(kTiny + " --sample-tokens 0 --out-dir " + dir.path.string());
    const Run b = run_train(kTiny + " --sample-tokens 0 --overwrite --out-dir " + dir.path.string());
    INFO(a.output << "\n----\n" << b.output);
    REQUIRE(a.status == 0);
    REQUIRE(b.status == 0);
    REQUIRE(losses(a.output).size() == 6);
    REQUIRE(losses(a.output) == losses(b.output));
    const Run c = run_train(kTiny + " --sample-tokens 0 --seed 7 --overwrite --out-dir " + dir.path.string());
    REQUIRE(losses(c.output) != losses(a.output));
}

// A plain `train`, no launcher, is a world of one without MPI (parallel/world.h): it trains where
// Open MPI cannot start (a pml component that does not exist fails MPI_Init, as the old singleton
// start-up did here), with the losses of the same run under mpirun -np 1; under mpirun the rank
// starts MPI, and the same environment fails it.
TEST_CASE("train: alone it runs without MPI; under mpirun its rank starts MPI", "[train][mpi]") {
    TempDir dir("train_no_mpi");
    const std::string train = (build_dir() / "train").string();
    const std::string args =
        " --steps 2 --batch 4 --micro-batch 2 --seq-len 16 --vocab 300 --warmup 0 "
        "--eval-interval 0 --sample-tokens 0 --out-dir ";
    const Run alone = run_train_command("OMPI_MCA_pml=nonexistent " + train + args + dir.file("alone"));
    INFO(alone.output);
    REQUIRE(alone.status == 0);
    CHECK(alone.output.find("MPI_INIT") == std::string::npos);
    REQUIRE(losses(alone.output).size() == 2);
    const Run ranked = run_mpi(1, train + args + dir.file("ranked"));
    INFO(ranked.output);
    REQUIRE(ranked.status == 0);
    CHECK(losses(ranked.output) == losses(alone.output));
    const Run failing = run_mpi(1, "env OMPI_MCA_pml=nonexistent " + train + args + dir.file("failing"));
    INFO(failing.output);
    CHECK(failing.status != 0);  // (Open MPI's own report of the failure may be cut short by the abort)
    CHECK(failing.output.find("trained steps") == std::string::npos);
}

// Activation checkpointing end to end: the same metrics bit for bit as without it; the setting
// kept on resume, and turning it off on resume is allowed (the gradients are the same) and said.
TEST_CASE("train --checkpoint-activations: identical metrics, kept on resume, changeable on resume",
          "[train][checkpointing]") {
    TempDir dir("train_ckpt");
    const std::string plain = (dir.path / "plain").string(), ckpt = (dir.path / "ckpt").string();
    const Run a = run_train(kTiny + " --sample-tokens 0 --out-dir " + plain);
    INFO(a.output);
    REQUIRE(a.status == 0);
    REQUIRE(a.output.find("activation checkpointing") == std::string::npos);
    const Run b1 = run_train(kTiny + " --sample-tokens 0 --stop-after 2 --checkpoint-activations=2 --out-dir " + ckpt);
    INFO(b1.output);
    REQUIRE(b1.status == 0);
    REQUIRE(b1.output.find("activation checkpointing: 2 of 4 blocks recompute") != std::string::npos);
    const Run b2 = run_train("--resume " + ckpt + " --stop-after 2");
    INFO(b2.output);
    REQUIRE(b2.status == 0);
    REQUIRE(b2.output.find("activation checkpointing: 2 of 4 blocks recompute") != std::string::npos);
    const Run b3 = run_train("--resume " + ckpt + " --no-checkpoint-activations");
    INFO(b3.output);
    REQUIRE(b3.status == 0);
    REQUIRE(b3.output.find("resume: --checkpoint-activations: 2 -> -1 (from the command line; recomputing") !=
            std::string::npos);
    REQUIRE(b3.output.find("activation checkpointing:") == std::string::npos);
    REQUIRE(losses(b1.output).size() + losses(b2.output).size() + losses(b3.output).size() == 6);
    // Every number but the memory (device_bytes, device_peak_bytes: the activations are less).
    const std::regex memory(R"(, "device_bytes": [0-9]+, "device_peak_bytes": [0-9]+)");
    const auto numbers = [&](const std::string& run) {
        return std::regex_replace(metrics_without_timing(fs::path(run) / "metrics.jsonl"), memory, "");
    };
    REQUIRE(numbers(ckpt).find("grad_norm") != std::string::npos);
    REQUIRE(numbers(ckpt) == numbers(plain));
    const Run every = run_train(kTiny + " --sample-tokens 0 --checkpoint-activations --out-dir " + ckpt + "_every");
    REQUIRE(every.status == 0);
    REQUIRE(every.output.find("activation checkpointing: 4 of 4 blocks recompute") != std::string::npos);
    REQUIRE(losses(every.output) == losses(a.output));
    const Run one = run_train(kTiny + " --checkpoint-activations=1 --out-dir " + ckpt + "_one");
    REQUIRE(one.status != 0);
    REQUIRE(one.output.find("give no value (every block recomputes), N >= 2") != std::string::npos);
}

// DESIGN.md §3: a checkpoint holds everything the run depends on, so stopping and resuming changes
// nothing: every logged number and every saved tensor is bit-identical to an uninterrupted run.
TEST_CASE("train: a run stopped at a checkpoint and resumed ends bit-identical to one that never stopped",
          "[train][resume]") {
    TempDir dir("train_resume");
    const std::string run =
        "--steps 8 --batch 4 --micro-batch 2 --seq-len 16 --vocab 300 --warmup 2 --lr 3e-3 "
        "--eval-interval 2 --eval-batches 1 --sample-tokens 0 --checkpoint-interval 4";
    // Round to nearest; then stochastic rounding with the fp32 accumulation buffer, where the
    // bf16 weights are not a function of the master and must come from the checkpoint.
    for (const std::string variant : {"", " --stochastic-rounding --fp32-grad-accumulation"}) {
        INFO("variant:" << variant);
        const fs::path straight = dir.path / "straight", stopped = dir.path / "stopped";
        fs::remove_all(straight), fs::remove_all(stopped);
        const Run a = run_train(run + variant + " --out-dir " + straight.string());
        INFO(a.output);
        REQUIRE(a.status == 0);
        const Run b1 = run_train(run + variant + " --stop-after 4 --out-dir " + stopped.string());
        INFO(b1.output);
        REQUIRE(b1.status == 0);
        REQUIRE(fs::exists(stopped / "step_4" / "trainer_state.json"));
        REQUIRE_FALSE(fs::exists(stopped / "step_8"));
        // A crash while writing a later checkpoint leaves only a .tmp directory, which must be ignored.
        fs::create_directories(stopped / "step_6.tmp");
        std::ofstream(stopped / "step_6.tmp" / "model.safetensors") << "half written";
        // Resume from the output directory: no flags, everything comes from the checkpoint.
        const Run b2 = run_train("--resume " + stopped.string());
        INFO(b2.output);
        REQUIRE(b2.status == 0);
        REQUIRE(b2.output.find("resumed from " + (stopped / "step_4").string() + " at step 4") != std::string::npos);
        const auto la = losses(a.output), lb1 = losses(b1.output), lb2 = losses(b2.output);
        REQUIRE(la.size() == 8);
        REQUIRE(lb1.size() == 4);
        REQUIRE(lb2.size() == 4);
        for (size_t i = 0; i < 4; ++i) {
            REQUIRE(la[i] == lb1[i]);
            REQUIRE(la[4 + i] == lb2[i]);
        }
        // Every step's loss, learning rate, gradient norm and validation loss, at 17 digits, and
        // the resumed run's metrics file holds one history, not two.
        REQUIRE(metrics_without_timing(straight / "metrics.jsonl") ==
                metrics_without_timing(stopped / "metrics.jsonl"));
        for (const char* f : {"model.safetensors", "master.safetensors", "adam_m.safetensors", "adam_v.safetensors"}) {
            INFO(f);
            const std::string x = read_file(straight / "step_8" / f), y = read_file(stopped / "step_8" / f);
            REQUIRE(x.size() > 1000);
            REQUIRE(x == y);
        }
    }
}

// CPU offload end to end: the same numbers bit for bit as without it (the CPU update is the
// kernel's math) with less device memory; a checkpoint saved offloaded resumes without offload
// and the reverse, ending with the bytes of an unbroken run; --offload params refused off zero3.
TEST_CASE("train --offload optimizer: identical run, resumable across offload settings, params needs zero3",
          "[train][offload]") {
    TempDir dir("train_offload");
    const std::string run = kTiny + " --sample-tokens 0 --stochastic-rounding --checkpoint-interval 3";
    const fs::path plain = dir.path / "plain", off = dir.path / "off", to_off = dir.path / "to_off";
    const Run a = run_train(run + " --out-dir " + plain.string());
    INFO(a.output);
    REQUIRE(a.status == 0);
    const Run b = run_train(run + " --offload optimizer --out-dir " + off.string());
    INFO(b.output);
    REQUIRE(b.status == 0);
    REQUIRE(losses(a.output).size() == 6);
    REQUIRE(losses(b.output) == losses(a.output));
    // Every number but the memory, which is less: the optimizer state is in host memory.
    const std::regex memory(R"(, "device_bytes": [0-9]+, "device_peak_bytes": [0-9]+)");
    const auto numbers = [&](const fs::path& d) {
        return std::regex_replace(metrics_without_timing(d / "metrics.jsonl"), memory, "");
    };
    REQUIRE(numbers(off).find("grad_norm") != std::string::npos);
    REQUIRE(numbers(off) == numbers(plain));
    const std::regex peak(R"("device_peak_bytes": ([0-9]+))");
    std::smatch pa, pb;
    const std::string ma = metrics_without_timing(plain / "metrics.jsonl"),
                      mb = metrics_without_timing(off / "metrics.jsonl");
    REQUIRE(std::regex_search(ma, pa, peak));
    REQUIRE(std::regex_search(mb, pb, peak));
    REQUIRE(std::stoll(pb[1]) < std::stoll(pa[1]));
    // Offloaded → not (resume from step 3 of the offloaded run), and not → offloaded.
    const Run c1 = run_train(run + " --stop-after 3 --out-dir " + to_off.string());
    REQUIRE(c1.status == 0);
    const Run c2 = run_train("--resume " + to_off.string() + " --offload optimizer");
    INFO(c2.output);
    REQUIRE(c2.status == 0);
    REQUIRE(c2.output.find("resume: --offload: \"none\" -> \"optimizer\"") != std::string::npos);
    fs::remove_all(off / "step_6");
    const Run d = run_train("--resume " + (off / "step_3").string() + " --offload none");
    INFO(d.output);
    REQUIRE(d.status == 0);
    for (const char* f : {"model.safetensors", "master.safetensors", "adam_m.safetensors", "adam_v.safetensors"}) {
        INFO(f);
        const std::string x = read_file(plain / "step_6" / f);
        REQUIRE(x.size() > 1000);
        REQUIRE(read_file(to_off / "step_6" / f) == x);
        REQUIRE(read_file(off / "step_6" / f) == x);
    }
    // zero3's slices in host memory too (one rank: the slices are whole groups).
    const Run z = run_train(kTiny + " --sample-tokens 0 --parallel zero3 --out-dir " + (dir.path / "z").string());
    const Run zp = run_train(kTiny + " --sample-tokens 0 --parallel zero3 --offload params --out-dir " +
                             (dir.path / "zp").string());
    INFO(zp.output);
    REQUIRE(z.status == 0);
    REQUIRE(zp.status == 0);
    REQUIRE(losses(z.output).size() == 6);
    REQUIRE(losses(zp.output) == losses(z.output));
    REQUIRE(read_file(dir.path / "zp" / "step_6" / "model.safetensors") ==
            read_file(dir.path / "z" / "step_6" / "model.safetensors"));
    const Run e = run_train(kTiny + " --offload params --out-dir " + (dir.path / "params").string());
    REQUIRE(e.status != 0);
    REQUIRE(e.output.find("--offload params keeps zero3's parameter slices in host memory") != std::string::npos);
    REQUIRE(e.output.find("choose --parallel zero3, or --offload optimizer") != std::string::npos);
}

// --cuda-graphs: each micro-step captured once and launched as a graph; every logged number and
// every saved tensor is the eager run's, bit for bit — with the loss scale and, under LoRA dropout,
// each micro-batch's dropout keys read from device memory (a graph replays its arguments), with
// document positions, evaluation between steps, and two micro-steps per step (the first writes
// the gradients over, the second adds). Under it the model's cuBLAS handle has a 32 MiB workspace,
// which the plan counts (the plan-against-peak case below).
namespace train_test {

// A --cuda-graphs run's output folder against the eager run's: every logged number but the memory
// (the graphs' cuBLAS workspace) and the timing, evaluation included, and every checkpoint file bit
// for bit. Returns the number of checkpoint files compared.
int check_graphs_run_is_eager_run(const fs::path& eager, const fs::path& graphs) {
    const std::regex memory(R"(, "device_bytes": [0-9]+, "device_peak_bytes": [0-9]+)");
    const auto numbers = [&](const fs::path& d) {
        return std::regex_replace(metrics_without_timing(d / "metrics.jsonl"), memory, "");
    };
    REQUIRE(numbers(eager).find("val_loss") != std::string::npos);
    REQUIRE(numbers(graphs) == numbers(eager));
    int compared = 0;
    for (const auto& step : fs::directory_iterator(eager))
        for (const auto& f : !step.is_directory() ? fs::directory_iterator() : fs::directory_iterator(step.path()))
            if (f.path().extension() == ".safetensors") {
                INFO(f.path());
                REQUIRE(read_file(graphs / step.path().filename() / f.path().filename()) == read_file(f.path()));
                ++compared;
            }
    return compared;
}

}  // namespace train_test

TEST_CASE("train --cuda-graphs: the captured run's numbers and checkpoints are the eager run's, bit for bit",
          "[train][graphs]") {
    TempDir dir("train_graphs");
    std::ofstream(dir.file("chats.jsonl")) << [] {
        std::string chats;
        for (int i = 0; i < 40; ++i)
            chats += "{\"messages\": [{\"role\": \"user\", \"content\": \"Count to " + std::to_string(i) +
                     ".\"}, {\"role\": \"assistant\", \"content\": \"" + std::string(size_t(i % 7 + 1), 'x') +
                     " done.\"}]}\n";
        return chats;
    }();
    const Run p = run_train("prepare " + dir.file("chats.jsonl") + " --out " + dir.file("data") +
                            " --vocab 300 --chat-format llama3");
    INFO(p.output);
    REQUIRE(p.status == 0);
    const std::string lora_documents = "--data " + dir.file("data") +
                                       " --steps 4 --batch 4 --micro-batch 2 --seq-len 48 --warmup 1 "
                                       "--eval-interval 2 --eval-batches 1 --sample-tokens 0 --document-mask "
                                       "--lora-rank 4 --lora-dropout 0.2 --checkpoint-interval 2";
    const std::string full = kTiny + " --sample-tokens 0 --checkpoint-interval 3";
    for (const auto& [name, args] : {std::pair{std::string("full"), full}, {"lora", lora_documents}}) {
        const fs::path eager = dir.path / (name + "_eager"), graphs = dir.path / (name + "_graphs");
        const Run a = run_train(args + " --out-dir " + eager.string());
        const Run b = run_train(args + " --cuda-graphs --out-dir " + graphs.string());
        INFO(name << "\n" << a.output << "\n----\n" << b.output);
        REQUIRE(a.status == 0);
        REQUIRE(b.status == 0);
        REQUIRE(losses(a.output).size() >= 4);
        REQUIRE(losses(b.output) == losses(a.output));
        CHECK(a.output.find("cuda graphs:") == std::string::npos);
        const std::regex said(
            R"(cuda graphs: 2 micro-step\(s\) captured, ([0-9]+) nodes in the largest, launched ([0-9]+) times)");
        std::smatch m;
        REQUIRE(std::regex_search(b.output, m, said));
        CHECK(std::stoi(m[1]) > 50);                                 // a micro-step is many kernels
        CHECK(std::stoi(m[2]) == 2 * int(losses(b.output).size()));  // two a step, every step
        // two checkpoints of model or adapter, master, m and v
        CHECK(check_graphs_run_is_eager_run(eager, graphs) >= 8);
    }
    // A step with one micro-batch more (the divergence test hook, at one rank: it only trains on one
    // more) moves the micro-batches' loss array: every graph is captured again, and the run is still
    // the eager one's.
    const std::string diverge =
        "POLEVAULT_TEST_DIVERGE=step=2,rank=0 " + (build_dir() / "train").string() + " " + kTiny + " --sample-tokens 0";
    const Run longer_eager = run_train_command(diverge + " --out-dir " + dir.file("longer_eager"));
    const Run longer = run_train_command(diverge + " --cuda-graphs --out-dir " + dir.file("longer"));
    INFO(longer_eager.output << "\n----\n" << longer.output);
    REQUIRE(longer_eager.status == 0);
    REQUIRE(longer.status == 0);
    REQUIRE(losses(longer.output) == losses(longer_eager.output));
    REQUIRE(losses(longer.output) !=
            losses(run_train(kTiny + " --sample-tokens 0 --out-dir " + dir.file("plain")).output));
    // Captured: 2 at step 1, 3 at step 2 (3 micro-batches), then the last of 2 again; 6 x 2 + 1 launches.
    CHECK(longer.output.find("cuda graphs: 6 micro-step(s) captured") != std::string::npos);
    CHECK(longer.output.find("launched 13 times") != std::string::npos);
    // A resume keeps the checkpoint's --cuda-graphs, under another strategy too (zero3 on one rank:
    // its gathers and reduce-scatters are no-ops, its per-unit buffer bindings captured).
    const fs::path step_3 = dir.path / "full_graphs" / "step_3";
    const Run kept = run_train("--resume " + step_3.string() + " --out-dir " + dir.file("kept"));
    INFO(kept.output);
    REQUIRE(kept.status == 0);
    CHECK(kept.output.find("launched 6 times") != std::string::npos);  // steps 4 to 6
    const Run zero3 = run_train("--resume " + step_3.string() + " --parallel zero3 --out-dir " + dir.file("zero3"));
    INFO(zero3.output);
    REQUIRE(zero3.status == 0);
    CHECK(zero3.output.find("launched 6 times") != std::string::npos);
    // (the eager run's checkpoint is the captured run's, bit for bit: resumed eagerly under zero3)
    const Run zero3_eager = run_train("--resume " + (dir.path / "full_eager" / "step_3").string() +
                                      " --parallel zero3 --out-dir " + dir.file("zero3_eager"));
    REQUIRE(zero3_eager.status == 0);
    CHECK(zero3_eager.output.find("cuda graphs:") == std::string::npos);
    CHECK(losses(zero3.output) == losses(zero3_eager.output));
}

TEST_CASE(
    "train --cuda-graphs under ddp, zero1-3, --tp and pp: every micro-step or pipeline entry captured, collectives "
    "and transfers too; the eager run's numbers and checkpoints bit for bit",
    "[train][graphs][mpi]") {
    TempDir dir("train_graphs_ddp");
    const std::string train = (build_dir() / "train").string();
    // 4 rows a step a rank, 2 a micro-batch: 2 micro-steps a rank, each captured with its
    // collectives. Under ddp and zero1 the last all-reduces or reduce-scatters the gradients; hybrid
    // zero1 (4 ranks, shards within groups of 2) reduce-scatters within a group and all-reduces the
    // slices across the replicas; zero3 gathers each unit's parameters and reduce-scatters its
    // gradients out of rotating buffers bound per unit, in every micro-step; --tp 2 all-reduces and
    // gathers inside its layers (2 ranks: one data-parallel rank). pp (2 stages, 1F1B) captures each
    // entry of its row — 2 forwards and 2 backwards a step — with the transfers before it.
    struct Layout {
        std::string name, parallel;
        int ranks, data_ranks;
        int captured;  // graphs: one per micro-step (a pipeline's: per entry), all in the first step
        std::string what = "micro-step(s)";
    };
    for (const Layout& layout : {Layout{"ddp", "ddp", 2, 2, 2}, Layout{"zero1", "zero1", 2, 2, 2},
                                 Layout{"hybrid_zero1", "zero1 --shard-group 2", 4, 4, 2},
                                 Layout{"zero3", "zero3", 2, 2, 2}, Layout{"tp", "ddp --tp 2", 2, 1, 2},
                                 Layout{"pp", "pp", 2, 1, 4, "pipeline entries (a forward or a backward)"}}) {
        const std::string& strategy = layout.name;
        INFO(strategy);
        const std::string args = " --steps 4 --batch " + std::to_string(4 * layout.data_ranks) +
                                 " --micro-batch 2 --seq-len 16 --vocab 300 --warmup 1 --lr 3e-3 "
                                 "--eval-interval 2 --eval-batches 1 --sample-tokens 0 --checkpoint-interval 2 "
                                 "--parallel " +
                                 layout.parallel;
        const fs::path eager = dir.path / (strategy + "_eager"), graphs = dir.path / (strategy + "_graphs");
        const Run a = run_mpi(layout.ranks, train + args + " --out-dir " + eager.string());
        const Run b = run_mpi(layout.ranks, train + args + " --cuda-graphs --out-dir " + graphs.string());
        INFO(a.output << "\n----\n" << b.output);
        REQUIRE(a.status == 0);
        REQUIRE(b.status == 0);
        REQUIRE(losses(a.output).size() == 4);
        REQUIRE(losses(b.output) == losses(a.output));
        if (layout.ranks == 4)  // the layout asked for, not plain zero1 over 4
            CHECK(b.output.find("strategy zero1, sharded within groups of 2 rank(s), 2 replicas") != std::string::npos);
        CHECK(b.output.find("cuda graphs: " + std::to_string(layout.captured) + " " + layout.what + " captured") !=
              std::string::npos);
        const int launches = layout.name == "pp" ? 16 : 8;  // 2 micro-steps a step; pp: 4 entries a step
        CHECK(b.output.find("launched " + std::to_string(launches) + " times") != std::string::npos);
        CHECK(check_graphs_run_is_eager_run(eager, graphs) == 8);  // model, master, m and v at steps 2 and 4
        if (layout.ranks != 2 || layout.data_ranks != 2) continue;
        // A resume keeps --cuda-graphs.
        const Run kept = run_mpi(
            2, train + " --resume " + (graphs / "step_2").string() + " --out-dir " + dir.file(strategy + "_kept"));
        INFO(kept.output);
        REQUIRE(kept.status == 0);
        CHECK(kept.output.find("launched 4 times") != std::string::npos);  // steps 3 and 4
        const std::vector<std::string> all = losses(a.output);
        CHECK(losses(kept.output) == std::vector<std::string>(all.begin() + 2, all.end()));
        if (strategy != "ddp") continue;
        // Resumed as a pipeline: kept, its entries captured.
        const Run piped = run_mpi(
            2, train + " --resume " + (graphs / "step_2").string() + " --parallel pp --out-dir " + dir.file("piped"));
        INFO(piped.output);
        REQUIRE(piped.status == 0);
        CHECK(piped.output.find("resume: --cuda-graphs") == std::string::npos);
        CHECK(piped.output.find("cuda graphs: 8 pipeline entries (a forward or a backward) captured") !=
              std::string::npos);  // 4 micro-batches (the whole batch) a step: 8 entries
    }
}

namespace train_test {

// The output without the closing tokens/s line (timings differ run to run).
std::string without_timing(const std::string& output) {
    return std::regex_replace(output, std::regex("prefill: [^\n]*\n"), "");
}

}  // namespace train_test

TEST_CASE("train sample: generates from a checkpoint, reproducibly per seed", "[train][sample]") {
    TempDir dir("train_sample");
    const Run t = run_train(kTiny + " --sample-tokens 0 --out-dir " + dir.path.string());
    REQUIRE(t.status == 0);
    const std::string ckpt = (dir.path / "step_6").string();
    // The model has 16 positions (--seq-len 16): the prompt and 8 tokens fit.
    const Run a = run_train("sample " + ckpt + " --prompt 'The model' --max-tokens 8 --seed 5");
    const Run b = run_train("sample " + dir.path.string() + " --prompt 'The model' --max-tokens 8 --seed 5");
    const Run c = run_train("sample " + ckpt + " --prompt 'The model' --max-tokens 8 --seed 6");
    INFO(a.output << "\n----\n" << b.output << "\n----\n" << c.output);
    REQUIRE(a.status == 0);
    REQUIRE(b.status == 0);
    REQUIRE(c.status == 0);
    REQUIRE(a.output.find("sampling from " + ckpt) != std::string::npos);
    REQUIRE(a.output.find("The model") != std::string::npos);
    REQUIRE(a.output.find("tokens/s") != std::string::npos);
    REQUIRE(without_timing(a.output) ==
            without_timing(b.output));  // the output directory resolves to its latest checkpoint
    REQUIRE(without_timing(a.output) != without_timing(c.output));
    // Greedy decoding does not depend on the seed.
    const Run g1 = run_train("sample " + ckpt + " --temperature 0 --max-tokens 8 --seed 1");
    const Run g2 = run_train("sample " + ckpt + " --temperature 0 --max-tokens 8 --seed 2");
    REQUIRE(g1.status == 0);
    REQUIRE(without_timing(g1.output) == without_timing(g2.output));
    // Without its tokenizer a checkpoint cannot be sampled as text, and says why.
    fs::remove(dir.path / "step_6" / "tokenizer.json");
    const Run missing = run_train("sample " + ckpt);
    INFO(missing.output);
    REQUIRE(missing.status != 0);
    REQUIRE(missing.output.find("tokenizer.json") != std::string::npos);
}

TEST_CASE("train prepare: text and JSON lines become shards that train and sample", "[train][prepare]") {
    TempDir dir("train_prepare");
    std::string text;
    for (int i = 0; i < 300; ++i)
        text += "Line " + std::to_string(i) + " of a small document about kernels and tests.\n";
    std::ofstream(dir.file("a.txt")) << text;
    {
        std::ofstream b(dir.file("b.jsonl"));
        for (int i = 0; i < 50; ++i)
            b << "{\"text\": \"Record " << i << " says hello to the loader.\", \"id\": " << i << "}\n";
    }
    const std::string data = dir.file("data");
    const Run p = run_train("prepare " + dir.file("a.txt") + " " + dir.file("b.jsonl") + " --out " + data +
                            " --vocab 300 --val-fraction 0.1");
    INFO(p.output);
    REQUIRE(p.status == 0);
    REQUIRE(p.output.find("prepared 51 documents") != std::string::npos);
    REQUIRE(fs::exists(fs::path(data) / "val.pvtokens"));
    REQUIRE(fs::exists(fs::path(data) / "tokenizer.json"));
    const Run t = run_train("--data " + data +
                            " --steps 3 --batch 2 --micro-batch 2 --seq-len 16 --warmup 1 "
                            "--eval-interval 3 --eval-batches 1 --sample-tokens 4 --out-dir " +
                            dir.file("run"));
    INFO(t.output);
    REQUIRE(t.status == 0);
    REQUIRE(losses(t.output).size() == 3);
    REQUIRE(validation_losses(t.output).size() == 1);
    REQUIRE(t.output.find("sample (temperature") != std::string::npos);
    REQUIRE(fs::exists(fs::path(dir.file("run")) / "step_3" / "tokenizer.json"));
    // A JSON-lines record without the field is an error naming the file and the line.
    std::ofstream(dir.file("bad.jsonl")) << "{\"text\": \"fine\"}\n{\"body\": \"no text field\"}\n";
    const Run bad = run_train("prepare " + dir.file("bad.jsonl") + " --out " + dir.file("bad") + " --vocab 300");
    INFO(bad.output);
    REQUIRE(bad.status != 0);
    REQUIRE(bad.output.find("bad.jsonl") != std::string::npos);
    REQUIRE(bad.output.find("2") != std::string::npos);
}

TEST_CASE("train prepare of chats, then train --document-mask: packing counts printed, the mask fixed on resume",
          "[train][prepare]") {
    TempDir dir("train_chats");
    {
        std::ofstream c(dir.file("chats.jsonl"));
        for (int i = 0; i < 60; ++i) {
            std::string answer = "It is " + std::to_string(i) + ".";
            for (int k = 1; i % 10 == 0 && k <= 40; ++k) answer += " " + std::to_string(k * 37);  // too long
            c << "{\"messages\": [{\"role\": \"user\", \"content\": \"What is " << i
              << "?\"}, {\"role\": \"assistant\", \"content\": \"" << answer << "\"}]}\n";
        }
    }
    const std::string data = dir.file("data");
    const Run p =
        run_train("prepare " + dir.file("chats.jsonl") + " --out " + data + " --vocab 300 --chat-format llama3");
    INFO(p.output);
    REQUIRE(p.status == 0);
    REQUIRE(p.output.find("prepared 60 documents (0 text, 0 prompt/completion, 60 chat in format llama3)") !=
            std::string::npos);
    REQUIRE(p.output.find("count as targets") != std::string::npos);
    const std::string args = "--data " + data +
                             " --steps 3 --batch 2 --micro-batch 2 --seq-len 48 --warmup 1 --eval-interval 3 "
                             "--eval-batches 1 --sample-tokens 0 --out-dir " +
                             dir.file("run");
    const Run t = run_train(args + " --stop-after 2 --document-mask");
    INFO(t.output);
    REQUIRE(t.status == 0);
    REQUIRE(losses(t.output).size() == 2);
    REQUIRE(t.output.find("chats or prompts packed whole") != std::string::npos);
    REQUIRE(t.output.find("document mask on") != std::string::npos);
    REQUIRE(std::regex_search(t.output,
                              std::regex("training data: dropped [1-9][0-9]* chats or prompts longer than 49 tokens")));
    // The mask shapes the batches: resuming without it would be another run.
    const Run off = run_train("--resume " + dir.file("run") + " --document-mask=false");
    INFO(off.output);
    REQUIRE(off.status != 0);
    REQUIRE(off.output.find("cannot change --document-mask: true -> false") != std::string::npos);
    const Run on = run_train("--resume " + dir.file("run"));
    INFO(on.output);
    REQUIRE(on.status == 0);
    REQUIRE(losses(on.output).size() == 1);
    REQUIRE(on.output.find("document mask on") != std::string::npos);
    // `train eval` of the checkpoint takes the run's validation settings (its document mask, its
    // windows, its micro-batch): its loss is the run's last validation loss, to the 7 decimals
    // the run prints.
    const std::vector<double> validation = validation_losses(on.output);
    REQUIRE(validation.size() == 1);
    const Run e = run_train("eval " + dir.file("run") + " --data " + data);
    INFO(e.output);
    REQUIRE(e.status == 0);
    CHECK(e.output.find("document mask on, the first 2 (the run's validation windows") != std::string::npos);
    std::smatch loss;
    REQUIRE(std::regex_search(e.output, loss, std::regex(R"(\nloss ([0-9.]+) )")));
    CHECK(std::abs(std::stod(loss[1]) - validation[0]) <= 5e-8);
}

TEST_CASE("train: bad input fails with a message naming the problem and the fix", "[train]") {
    TempDir dir("train_bad");
    const Run batch = run_train("--steps 2 --batch 5 --micro-batch 2 --out-dir " + dir.file("batch"));
    REQUIRE(batch.status != 0);
    INFO(batch.output);
    REQUIRE(batch.output.find("batch 5") != std::string::npos);
    REQUIRE(batch.output.find("--batch") != std::string::npos);
    const Run data = run_train("--data /nonexistent/shard.bin");
    REQUIRE(data.status != 0);
    INFO(data.output);
    REQUIRE(data.output.find("/nonexistent/shard.bin") != std::string::npos);
    const Run flag = run_train("--dtype fp16");
    REQUIRE(flag.status != 0);
    REQUIRE(flag.output.find("fp16") != std::string::npos);
    const Run accumulate32 = run_train("--dtype fp32 --fp32-grad-accumulation --out-dir " + dir.file("acc"));
    INFO(accumulate32.output);
    REQUIRE(accumulate32.status != 0);
    REQUIRE(accumulate32.output.find("--fp32-grad-accumulation is for --dtype bf16") != std::string::npos);
    const Run rounding = run_train("--dtype fp64 --stochastic-rounding --out-dir " + dir.file("sr"));
    REQUIRE(rounding.status != 0);
    REQUIRE(rounding.output.find("--stochastic-rounding is for --dtype bf16") != std::string::npos);
    // Shard groups only with ZeRO, and only ones that tile the ranks; refused before any output.
    const Run group = run_train("--shard-group 2 --out-dir " + dir.file("group"));
    INFO(group.output);
    REQUIRE(group.status != 0);
    REQUIRE(group.output.find("--shard-group 2 shards a ZeRO stage: choose it with --parallel zero1, zero2 or zero3") !=
            std::string::npos);
    const Run large = run_train("--parallel zero3 --shard-group 2 --out-dir " + dir.file("group"));
    INFO(large.output);
    REQUIRE(large.status != 0);
    REQUIRE(large.output.find("--shard-group 2 is larger than the 1 rank(s)") != std::string::npos);
    REQUIRE(!fs::exists(dir.file("group")));
    // Pipelines: micro-batches in flight only with mp.
    const Run in_flight = run_train("--in-flight 2 --out-dir " + dir.file("inflight"));
    REQUIRE(in_flight.status != 0);
    REQUIRE(in_flight.output.find("--in-flight 2 is for a pipeline") != std::string::npos);
    const Run renamed = run_train("--parallel mp --microbatches 2 --out-dir " + dir.file("renamed"));
    REQUIRE(renamed.status != 0);
    REQUIRE(renamed.output.find("--microbatches 2: the micro-batches in flight per pipeline stage are now --in-flight 2") !=
            std::string::npos);
    REQUIRE(!fs::exists(dir.file("renamed")));
    const Run chunks = run_train("--parallel pp --pipeline-chunks 3 --out-dir " + dir.file("chunks"));
    REQUIRE(chunks.status != 0);
    REQUIRE(chunks.output.find("--pipeline-chunks 3 is for --pipeline-schedule interleaved") != std::string::npos);
    // Resuming: a directory without checkpoints, a change that would break the run, a finished
    // run, a damaged checkpoint.
    fs::create_directories(dir.path / "empty");
    const Run none = run_train("--resume " + dir.file("empty"));
    INFO(none.output);
    REQUIRE(none.status != 0);
    REQUIRE(none.output.find("neither a checkpoint") != std::string::npos);
    const std::string out = dir.file("run");
    REQUIRE(run_train("--steps 2 --warmup 1 --batch 4 --micro-batch 2 --seq-len 16 --vocab 300 --eval-interval 0 "
                      "--sample-tokens 0 --out-dir " +
                      out)
                .status == 0);
    const Run dtype = run_train("--resume " + out + " --dtype fp32");
    INFO(dtype.output);
    REQUIRE(dtype.status != 0);
    REQUIRE(dtype.output.find("cannot change --dtype") != std::string::npos);
    const Run done = run_train("--resume " + out);
    INFO(done.output);
    REQUIRE(done.status != 0);
    REQUIRE(done.output.find("raise --steps") != std::string::npos);
    const fs::path weights = fs::path(out) / "step_2" / "model.safetensors";
    fs::resize_file(weights, fs::file_size(weights) - 100);
    const Run damaged = run_train("--resume " + out + " --steps 4 --extend-schedule");
    INFO(damaged.output);
    REQUIRE(damaged.status != 0);
    REQUIRE(damaged.output.find(weights.string()) != std::string::npos);
}

namespace train_test {

// "17.5 MiB", "30.28 GiB", "824 B" as printed by the plan and the run, in MiB.
double mib_of(const std::string& figure) {
    std::smatch m;
    REQUIRE(std::regex_search(figure, m, std::regex(R"(([0-9.]+) (B|KiB|MiB|GiB))")));
    const double v = std::stod(m[1]);
    return m[2] == "B" ? v / 1048576 : m[2] == "KiB" ? v / 1024 : m[2] == "MiB" ? v : v * 1024;
}

}  // namespace train_test

TEST_CASE("train plan: the default run's plan is its measured peak; what cannot fit is refused before allocating",
          "[train][plan][heavy]") {
    TempDir dir("train_plan");
    // The plan of a run against the peak that run measures (the device accounting every step prints).
    for (const std::string flags : {"", "--checkpoint-activations --lora-rank 4", "--cuda-graphs"}) {
        // (The sample after training comes after the last step's figures: not in either.)
        const Run plan = run_train("plan --sample-tokens 0 " + flags);
        const Run run = run_train(flags + " --steps 2 --warmup 1 --sample-tokens 0 --eval-interval 0 --out-dir " +
                                  dir.file("run" + std::to_string(flags.size())));
        INFO(flags << "\n" << plan.output << "\n----\n" << run.output);
        REQUIRE(plan.status == 0);
        REQUIRE(run.status == 0);
        std::smatch total, peak;
        REQUIRE(std::regex_search(plan.output, total, std::regex(R"(device total +([0-9.]+ [KMG]?i?B))")));
        REQUIRE(std::regex_search(run.output, peak, std::regex(R"(\(peak ([0-9.]+ MiB)\))")));
        CHECK(std::abs(mib_of(total[1]) - mib_of(peak[1])) <= 0.02 * mib_of(peak[1]));
        CHECK(plan.output.find("fits on h100-80") != std::string::npos);
        CHECK(plan.output.find("largest micro-batch that fits:") != std::string::npos);
    }
    // Llama-2-7B's model states alone are 16 bytes per parameter, 100 GiB: never on one GPU. On a
    // 24 GB one the plan says so in words, exits 1, and offers what would fit: more ranks, and LoRA
    // and QLoRA with the activation savers they need. ZeRO-3 over 8 ranks divides the states to
    // 12.5 GiB.
    const Run seven = run_train("plan --preset llama-2-7b --batch 16 --micro-batch 4 --seq-len 1024 "
                                "--gpu-memory rtx4090-24");
    INFO(seven.output);
    REQUIRE(seven.status == 1);
    CHECK(seven.output.find("DOES NOT FIT on rtx4090-24") != std::string::npos);
    CHECK(seven.output.find("largest micro-batch that fits: none (micro-batch 1 does not fit either)") !=
          std::string::npos);
    CHECK(seven.output.find("does not fit: this run needs ") != std::string::npos);
    for (const char* change : {"would fit: --parallel zero3 on ", "would fit: LoRA: --lora-rank 16",
                               "would fit: QLoRA: --lora-rank 16 --quantize nf4"})
        CHECK(seven.output.find(change) != std::string::npos);
    const Run sharded = run_train(
        "plan --preset llama-2-7b --micro-batch 1 --seq-len 1024 --gpu-memory h100-80 --ranks 8 --parallel zero3 "
        "--compare");
    INFO(sharded.output);
    REQUIRE(sharded.status == 0);
    CHECK(sharded.output.find("fits on h100-80") != std::string::npos);
    for (const char* strategy : {"ddp", "zero1", "zero2", "zero3", "pp"})
        CHECK(sharded.output.find(std::string("  ") + strategy + " ") != std::string::npos);
    // --checkpoint-activations auto: the fewest blocks that fit (test_plan holds the count against a
    // scan of the plans), said in a line; none when the plan fits without.
    const std::string one_b = "plan --preset llama-3.2-1b --micro-batch 4 --batch 8 --seq-len 2048 --sample-tokens 0 "
                              "--checkpoint-activations auto --gpu-memory ";
    const Run roomy = run_train(one_b + "h100-80");
    INFO(roomy.output);
    CHECK(roomy.status == 0);
    CHECK(roomy.output.find("activation checkpointing: auto: no block recomputes (the plan fits the ") !=
          std::string::npos);
    CHECK(roomy.output.find("recompute arena (checkpointing)") == std::string::npos);  // none: no line
    const Run tight = run_train(one_b + "24GiB");
    INFO(tight.output);
    CHECK(tight.status == 0);
    CHECK(tight.output.find("activation checkpointing: auto: the first ") != std::string::npos);
    CHECK(tight.output.find(" of 16 blocks recompute, the fewest with which the plan fits the ") != std::string::npos);
    CHECK(tight.output.find("recompute arena (checkpointing)") != std::string::npos);
    CHECK(tight.output.find("fits on the GPU (24.00 GiB") != std::string::npos);
    // --search: the five fastest layouts of 4 ranks, the strategy given kept, and the flags of the
    // fastest, which plan as a run that fits.
    const std::string tiny = "plan --preset test-tiny --seq-len 32 --batch 8 --ranks 4 --sample-tokens 0";
    const Run search = run_train(tiny + " --parallel zero1 --search");
    INFO(search.output);
    REQUIRE(search.status == 0);
    CHECK(search.output.find("layouts of test-tiny on 4 GPU(s) sized") != std::string::npos);
    CHECK(search.output.find("| 5 | ") != std::string::npos);
    CHECK(search.output.find("| 6 | ") == std::string::npos);
    const size_t run_it = search.output.find("run it with: --parallel zero1 ");
    REQUIRE(run_it != std::string::npos);
    const std::string chosen = search.output.substr(run_it + 13, search.output.find('\n', run_it) - run_it - 13);
    const Run chosen_plan = run_train(tiny + " " + chosen);
    INFO(chosen_plan.output);
    CHECK(chosen_plan.status == 0);
    CHECK(chosen_plan.output.find(", zero1 on 4 rank(s)") != std::string::npos);
    // --parallel auto when no layout fits: it says so, plans the one of least memory, and exits 1
    // with what would fit.
    const Run none = run_train("plan --preset llama-2-70b --seq-len 1024 --batch 2 --ranks 2 --gpu-memory rtx4090-24");
    INFO(none.output);
    CHECK(none.status == 1);
    CHECK(none.output.find("--parallel auto: none of the ") != std::string::npos);
    CHECK(none.output.find(" layouts sized fits; the least memory: ") != std::string::npos);
    CHECK(none.output.find("does not fit: this run needs ") != std::string::npos);
    // train refuses what its plan says cannot fit, with the table and a way out, before allocating.
    const Run big = run_train("--preset llama-2-70b --gpu-memory rtx4090-24 --out-dir " + dir.file("big"));
    INFO(big.output);
    REQUIRE(big.status != 0);
    CHECK(big.output.find("DOES NOT FIT on rtx4090-24") != std::string::npos);
    CHECK(big.output.find("changes that fit") != std::string::npos);
    CHECK(big.output.find("--parallel zero3 on") != std::string::npos);
    CHECK(big.output.find("step ") == std::string::npos);
    CHECK(!fs::exists(dir.file("big")));
    const Run batch = run_train("--batch 2000000000 --micro-batch 1 --out-dir " + dir.file("batch"));
    INFO(batch.output);
    REQUIRE(batch.status != 0);
    CHECK(batch.output.find("of host memory per rank") != std::string::npos);
}

TEST_CASE("train under mpirun without --parallel: auto runs the layout train plan --search ranks fastest, as its "
          "flags would",
          "[train][mpi]") {
    TempDir dir("train_auto");
    const std::string args = kTiny + " --sample-tokens 0";
    const Run plan = run_train("plan " + args + " --ranks 2 --search");
    INFO(plan.output);
    REQUIRE(plan.status == 0);
    auto line_after = [](const std::string& text, const std::string& start) {
        const size_t at = text.find(start);
        REQUIRE(at != std::string::npos);
        const size_t from = at + start.size();
        return text.substr(from, text.find('\n', from) - from);
    };
    const std::string fastest = line_after(plan.output, "\nfastest: ");
    const std::string flags = line_after(plan.output, "\nrun it with: ");
    CHECK(fastest.find(", micro-batch 2 × ") != std::string::npos);  // kTiny's --micro-batch 2 stays
    const std::string train = (build_dir() / "train").string() + " " + args;
    const Run r = run_mpi(2, train + " --out-dir " + dir.file("auto"));
    INFO(r.output);
    REQUIRE(r.status == 0);
    CHECK(r.output.find("parallel: auto on 2 ranks: " + fastest + "; by hand: " + flags + "\n") != std::string::npos);
    const std::string strategy = flags.substr(11, flags.find(' ', 11) - 11);  // "--parallel NAME ..."
    CHECK(r.output.find(", strategy " + strategy) != std::string::npos);
    REQUIRE(losses(r.output).size() == 6);
    // The flags it printed train the same run (kTiny gives the micro-batch already).
    const std::string by_hand_flags = std::regex_replace(flags, std::regex(" --micro-batch [0-9]+"), "");
    const Run by_hand = run_mpi(2, train + " " + by_hand_flags + " --out-dir " + dir.file("by_hand"));
    INFO(by_hand.output);
    REQUIRE(by_hand.status == 0);
    CHECK(by_hand.output.find("parallel: auto") == std::string::npos);
    CHECK(losses(by_hand.output) == losses(r.output));
}

TEST_CASE("train under mpirun: zero1, zero2, zero3 and ddp train identically, and rank 0 alone reports",
          "[train][mpi]") {
    TempDir dir("train_mpi");
    const std::string run = (build_dir() / "train").string() + " " + kTiny + " --sample-tokens 0 ";
    const Run ddp = run_mpi(2, run + "--parallel ddp --out-dir " + dir.file("ddp"));
    const Run zero1 = run_mpi(2, run + "--parallel zero1 --out-dir " + dir.file("zero1"));
    const Run zero2 = run_mpi(2, run + "--parallel zero2 --out-dir " + dir.file("zero2"));
    const Run zero3 = run_mpi(2, run + "--parallel zero3 --out-dir " + dir.file("zero3"));
    INFO(ddp.output << "\n----\n" << zero1.output << "\n----\n" << zero2.output << "\n----\n" << zero3.output);
    REQUIRE(zero3.status == 0);
    REQUIRE(losses(zero3.output) == losses(ddp.output));
    REQUIRE(ddp.status == 0);
    REQUIRE(zero1.status == 0);
    REQUIRE(zero2.status == 0);
    REQUIRE(losses(ddp.output).size() == 6);  // one report, not one per rank
    REQUIRE(losses(zero1.output) == losses(ddp.output));
    REQUIRE(losses(zero2.output) == losses(ddp.output));  // accumulation 1: the same sums
    REQUIRE(zero1.output.find("x 2 rank(s), strategy zero1") != std::string::npos);
    // The sharded optimizer state was gathered into whole tensors: the checkpoints are identical.
    for (const char* f : {"model.safetensors", "master.safetensors", "adam_m.safetensors", "adam_v.safetensors"}) {
        INFO(f);
        REQUIRE(read_file(fs::path(dir.file("ddp")) / "step_6" / f) ==
                read_file(fs::path(dir.file("zero1")) / "step_6" / f));
        REQUIRE(read_file(fs::path(dir.file("ddp")) / "step_6" / f) ==
                read_file(fs::path(dir.file("zero2")) / "step_6" / f));
        REQUIRE(read_file(fs::path(dir.file("ddp")) / "step_6" / f) ==
                read_file(fs::path(dir.file("zero3")) / "step_6" / f));
    }
    // --parallel single cannot span ranks.
    const Run single = run_mpi(2, run + "--parallel single --out-dir " + dir.file("single"));
    REQUIRE(single.status != 0);
    REQUIRE(single.output.find("choose --parallel ddp, zero1, zero2, zero3 or pp") != std::string::npos);
}

TEST_CASE("train under mpirun: a failure on one rank ends every rank within 60 s with its message", "[train][mpi][timed]") {
    TempDir dir("train_mpi_fail");
    const std::string train = (build_dir() / "train").string();
    // Rank 1 is given a data file that does not exist; rank 0 goes ahead and would wait forever in
    // the first collective if rank 1's error did not end the job.
    const auto start = std::chrono::steady_clock::now();
    const Run r = run_mpi(2, "sh -c 'if [ \"$OMPI_COMM_WORLD_RANK\" = 1 ]; then exec " + train +
                                 " --parallel ddp --data /nonexistent/rank1.pvtokens; else exec " + train + " " +
                                 kTiny + " --parallel ddp --out-dir " + dir.file("run") + "; fi'");
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    INFO(r.output);
    REQUIRE(r.status != 0);
    REQUIRE(r.status != 124);  // not the timeout
    REQUIRE(seconds < 60);
    REQUIRE(r.output.find("rank 1/2") != std::string::npos);
    REQUIRE(r.output.find("/nonexistent/rank1.pvtokens") != std::string::npos);
}

// A collective that fails while it runs (injected on rank 1 by the host NCCL: its 12th piece of
// NCCL work reports ncclRemoteError through ncclCommGetAsyncError and moves no data, as a dead
// peer would leave it) is found by the polling wait, which aborts the communicator and ends the
// job with the rank and the communicator named, instead of leaving rank 0 waiting forever.
TEST_CASE("train under mpirun: an asynchronous NCCL error ends the job with a message naming the rank",
          "[train][mpi][timed]") {
    TempDir dir("train_mpi_async");
    const std::string run = (build_dir() / "train").string() + " " + kTiny + " --sample-tokens 0 ";
    for (const char* strategy : {"ddp", "zero1"}) {
        const auto start = std::chrono::steady_clock::now();
        const Run r = run_mpi(2, std::string("-x POLEVAULT_HOST_NCCL_ASYNC_ERROR=1:12 ") + run + "--parallel " +
                                     strategy + " --out-dir " + dir.file(strategy));
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        INFO(strategy << "\n" << r.output);
        REQUIRE(r.status != 0);
        REQUIRE(r.status != 124);  // not the timeout
        REQUIRE(seconds < 60);
        REQUIRE(r.output.find("rank 1/2: NCCL asynchronous error") != std::string::npos);
        REQUIRE(r.output.find("on communicator 'world' (rank 1 of 2)") != std::string::npos);
        REQUIRE(losses(r.output).size() < 6);  // it stopped during the run
    }
}

// Two ranks of one node with one GPU between them: refused at start-up, the fix named.
TEST_CASE("train under mpirun: more ranks on a node than GPUs is refused with the fix", "[train][mpi]") {
    TempDir dir("train_mpi_gpus");
    const Run r = run_mpi(2, "-x POLEVAULT_HOST_DEVICES=1 " + (build_dir() / "train").string() + " " + kTiny +
                                 " --parallel ddp --out-dir " + dir.file("run"));
    INFO(r.output);
    REQUIRE(r.status != 0);
    REQUIRE(r.status != 124);
    REQUIRE(r.output.find("2 ranks run on this node but it has 1 GPU(s) visible") != std::string::npos);
    REQUIRE(r.output.find("start at most 1 rank(s) per node") != std::string::npos);
    REQUIRE(losses(r.output).empty());
}

namespace train_test {

// Every step's loss from a metrics.jsonl, at its 17 digits.
std::map<long long, double> metric_losses(const fs::path& p) {
    std::map<long long, double> out;
    std::istringstream in(read_file(p));
    std::string line;
    const std::regex loss(R"(\{"step": ([0-9]+), "loss": ([-0-9.e+]+))");
    std::smatch m;
    while (std::getline(in, line))
        if (std::regex_search(line, m, loss)) out[std::stoll(m[1])] = std::stod(m[2]);
    return out;
}

// Checks that every F64 tensor of the safetensors file `got` is within `rel` of the same tensor
// of `want`, norm-wise (‖got − want‖ ≤ rel·‖want‖), and that both hold the same tensors.
void check_f64_tensors_close(const fs::path& got, const fs::path& want, double rel) {
    std::map<std::string, pv::SafeTensor> a, b;
    for (pv::SafeTensor& t : pv::read_safetensors(got.string()).tensors) a[t.name] = std::move(t);
    for (pv::SafeTensor& t : pv::read_safetensors(want.string()).tensors) b[t.name] = std::move(t);
    REQUIRE(a.size() == b.size());
    for (const auto& [name, w] : b) {
        INFO(got << ": " << name);
        REQUIRE(a.count(name));
        const pv::SafeTensor& g = a.at(name);
        REQUIRE(g.dtype == "F64");
        REQUIRE(g.shape == w.shape);
        std::vector<double> x(g.data.size() / 8), y(w.data.size() / 8);
        std::memcpy(x.data(), g.data.data(), g.data.size()), std::memcpy(y.data(), w.data.data(), w.data.size());
        double diff = 0, norm = 0;
        for (size_t i = 0; i < y.size(); ++i) diff += (x[i] - y[i]) * (x[i] - y[i]), norm += y[i] * y[i];
        CHECK(std::sqrt(diff) <= rel * std::sqrt(norm));
    }
}

}  // namespace train_test

// DESIGN.md §3: checkpoints hold whole, unpadded tensors, so a run saved by any strategy at N ranks
// resumes with any strategy at M ranks and continues the same training (fp64: to 1e-10 of a run
// that never stopped, on one rank). Each chain stops and resumes its 8 steps under each
// strategy in turn (every segment after the first loads what the one before it saved): zero3 at 4
// ranks, ddp at 2, the pipeline over 4 ranks (the default model's 6 units, 4 micro-batches in
// flight) and zero2 at 2; 4 interleaved stages over 2 ranks and GPipe; hybrid zero3 (2 groups of 2 ranks, its
// checkpoint gathered within rank 0's group), one rank, and two stages under hybrid zero3 (2
// replicas of 1 shard); two stages each under zero1 over 2 ranks, one rank, and zero3 over 4;
// tensor parallelism (--tp 2) with sequence parallelism at 2 ranks, one rank (which drops both),
// --tp 2 with sequence parallelism over a pipeline of 2 stages (1F1B),
// two stages under zero1 over 2 ranks (pp 2 x dp 2; --tp 1 said, since a resume keeps a --tp that
// divides the ranks), all three at 8 ranks with sequence parallelism (tp 2 x pp 2 x zero3 2),
// --tp 2 under zero3 over 2 data-parallel ranks without it, with its parameters offloaded, and under zero1
// with its optimizer offloaded (the checkpoint's --tp kept at 4 ranks). The vocabulary of 301 splits unevenly under --tp 2 (151 + 150 rows). The final weights
// too are those of the run that never stopped.
TEST_CASE(
    "train: a checkpoint saved by zero3 at 4 ranks resumes with ddp at 2, ddp's with pp at 4; pp (1F1B, GPipe, "
    "interleaved), zero2, hybrid zero3, pp 2 x zero1 2, pp 2 x hybrid zero3, tp 2 x dp 1-2, tp 2 x pp 2 and "
    "tp 2 x pp 2 x dp 2 (sequence-parallel) and tp 2 with offload too",
    "[train][mpi]") {
    TempDir dir("train_reshard");
    const std::string train = (build_dir() / "train").string();
    constexpr int kSteps = 8;
    const std::string run = " --dtype fp64 --steps " + std::to_string(kSteps) +
                            " --batch 8 --seq-len 16 --vocab 301 --warmup 2 --lr 3e-3 --eval-interval 0 "
                            "--sample-tokens 0 ";
    REQUIRE(run_train(run + "--out-dir " + dir.file("straight")).status == 0);
    const auto straight = metric_losses(fs::path(dir.file("straight")) / "metrics.jsonl");
    REQUIRE(straight.size() == size_t(kSteps));
    using Segment = std::pair<int, std::string>;  // ranks, --parallel and its flags
    for (const std::vector<Segment>& chain : std::vector<std::vector<Segment>>{
             {{4, "zero3"}, {2, "ddp"}, {4, "pp --in-flight 4"}, {2, "zero2"}},
             {{2, "pp --pipeline-schedule interleaved --pipeline-chunks 2 --micro-batch 2"},
              {2, "pp --pipeline-schedule gpipe"},
              {2, "pp --pipeline-schedule interleaved"}},
             {{4, "zero3 --shard-group 2"}, {1, "single"}, {4, "zero3 --pipeline-stages 2 --shard-group 1"}},
             {{4, "zero1 --pipeline-stages 2 --micro-batch 2"},
              {1, "single"},
              {4, "zero1 --pipeline-stages 2"},
              {4, "zero3"}},
             {{2, "ddp --tp 2 --sequence-parallel"},
              {1, "single"},
              {4, "pp --tp 2 --sequence-parallel"},
              {4, "zero1 --pipeline-stages 2 --tp 1"},
              {8, "zero3 --pipeline-stages 2 --tp 2 --sequence-parallel"},
              {4, "zero3 --tp 2 --sequence-parallel=false"},
              {4, "zero3 --tp 2 --offload params"},
              {4, "zero1 --offload optimizer"}}}) {
        std::string name = chain.front().second + "x" + std::to_string(chain.front().first);
        std::replace(name.begin(), name.end(), ' ', '_');
        const std::string out = dir.file(name);
        std::string path;  // the chain so far, for the messages
        int done = 0;      // steps run so far
        for (size_t i = 0; i < chain.size(); ++i) {
            const auto& [ranks, parallel] = chain[i];
            path += (i ? " -> " : "") + parallel + " x" + std::to_string(ranks);
            const int end = int((kSteps * (i + 1) + chain.size() / 2) / chain.size());  // this segment's last step
            const std::string stop = end < kSteps ? " --stop-after " + std::to_string(end - done) : "";
            const Run r = run_mpi(ranks, train + (i ? " --resume " + out + " --parallel " + parallel
                                                    : run + "--parallel " + parallel + " --out-dir " + out) +
                                             stop);
            INFO(path << "\n" << r.output);
            REQUIRE(r.status == 0);
            if (i) REQUIRE(r.output.find("resumed from") != std::string::npos);
            done = end;
        }
        const auto resumed = metric_losses(fs::path(out) / "metrics.jsonl");
        REQUIRE(resumed.size() == size_t(kSteps));
        for (const auto& [step, loss] : straight) {
            INFO(path << ", step " << step);
            CHECK(std::abs(resumed.at(step) - loss) <= 1e-10 * std::abs(loss));
        }
        INFO(path);
        const std::string last = "step_" + std::to_string(kSteps);
        for (const char* f : {"model.safetensors", "adam_m.safetensors", "adam_v.safetensors"})
            check_f64_tensors_close(fs::path(out) / last / f, fs::path(dir.file("straight")) / last / f, 1e-10);
    }
}

namespace train_test {

// --freeze's tests: the embedding (tied to lm_head in the default model) and every block's
// input_layernorm stay fixed.
const std::string kFreeze = "model.embed_tokens.*,*.input_layernorm.*";

// What kFreeze must freeze, by Hugging Face name, spelled out here rather than asked of
// model/freeze.h.
bool frozen_by_kfreeze(const std::string& hf_name) {
    static const std::regex frozen(
        R"(model\.embed_tokens\.weight|lm_head\.weight|model\.layers\.[0-9]+\.input_layernorm\.weight)");
    return std::regex_match(hf_name, frozen);
}

// `flags` with the value of `flag` replaced by `value` (train rejects a flag given twice).
std::string with_flag(const std::string& flags, const std::string& flag, const std::string& value) {
    const std::regex r("(^| )" + flag + " [^ ]+");
    REQUIRE(std::regex_search(flags, r));
    return std::regex_replace(flags, r, "$1" + flag + " " + value);
}

// Every tensor of a .safetensors file by name.
std::map<std::string, pv::SafeTensor> tensors_of(const fs::path& p) {
    std::map<std::string, pv::SafeTensor> out;
    for (pv::SafeTensor& t : pv::read_safetensors(p.string()).tensors) out[t.name] = std::move(t);
    return out;
}

std::set<std::string> names_of(const fs::path& p) {
    std::set<std::string> out;
    for (const auto& [name, t] : tensors_of(p)) out.insert(name);
    return out;
}

// A number in a checkpoint's config.json.
long long config_number(const std::string& config_json, const std::string& key) {
    std::smatch m;
    REQUIRE(std::regex_search(config_json, m, std::regex("\"" + key + "\": ([0-9]+)")));
    return std::stoll(m[1]);
}

// The line `train` prints for `trainable` and `frozen` parameters.
std::string parameters_line(long long trainable, long long frozen) {
    char line[200];
    std::snprintf(line, sizeof line, "parameters: %lld trainable (%.2f%%), %lld frozen (%.2f%%)", trainable,
                  100.0 * double(trainable) / double(trainable + frozen), frozen,
                  100.0 * double(frozen) / double(trainable + frozen));
    return line;
}

// Checks a checkpoint of a kFreeze run against `initial` (the model of the same seed before any
// step): the frozen tensors are byte-identical to it, the trainable ones changed (when
// `trained`), and the fp32 master (bf16 runs) and Adam's moments hold exactly the trainable tensors. Returns
// the number of frozen tensors seen.
int check_frozen_checkpoint(const fs::path& checkpoint, const std::map<std::string, pv::SafeTensor>& initial,
                            bool trained = true) {
    INFO("checkpoint " << checkpoint);
    const auto model = tensors_of(checkpoint / "model.safetensors");
    REQUIRE(model.size() == initial.size());
    std::set<std::string> trainable;
    int frozen = 0;
    for (const auto& [name, t] : model) {
        INFO(name);
        REQUIRE(initial.count(name));
        const pv::SafeTensor& before = initial.at(name);
        REQUIRE(t.dtype == before.dtype);
        REQUIRE(t.shape == before.shape);
        if (frozen_by_kfreeze(name)) {
            ++frozen;
            CHECK(t.data == before.data);
        } else {
            trainable.insert(name);
            if (trained) CHECK(t.data != before.data);
        }
    }
    // bf16 runs keep an fp32 master; fp32 and fp64 runs have none (model/checkpoint.h).
    const bool bf16 = model.begin()->second.dtype == "BF16";
    REQUIRE(fs::exists(checkpoint / "master.safetensors") == bf16);
    for (const char* f : {"master.safetensors", "adam_m.safetensors", "adam_v.safetensors"}) {
        INFO(f);
        if (bf16 || f != std::string("master.safetensors")) CHECK(names_of(checkpoint / f) == trainable);
    }
    return frozen;
}

}  // namespace train_test

// The embedding (tied: lm_head too) and the input norms stay bit-identical through training while
// everything else trains, and have no master or optimizer state. The model before any step comes
// from a run at learning rate 0 (AdamW's update, weight decay included, is scaled by it, so it
// changes nothing: its checkpoints after steps 1 and 2 are identical, and so the initial model).
TEST_CASE("train --freeze: frozen tensors keep their exact bits, have no optimizer state, and are counted",
          "[train][freeze]") {
    TempDir dir("train_freeze");
    const fs::path out = dir.path / "frozen", init = dir.path / "init";
    // Validation over 8 batches (256 tokens): whether the rest still learns is read there, against
    // the initial model's on the same batches, not from six training losses on six different batches
    // (which rose over the run with some versions of the built-in corpus).
    const std::string tiny = with_flag(kTiny, "--eval-batches", "8");
    const Run r = run_train(tiny + " --sample-tokens 0 --checkpoint-interval 3 --freeze '" + kFreeze + "' --out-dir " +
                            out.string());
    INFO(r.output);
    REQUIRE(r.status == 0);
    REQUIRE(losses(r.output).size() == 6);
    REQUIRE(r.output.find("freeze: model.embed_tokens.weight is tied to lm_head.weight: lm_head is frozen too\n") !=
            std::string::npos);
    REQUIRE(read_file(out / "step_6" / "trainer_state.json").find("\"freeze\": \"" + kFreeze + "\"") !=
            std::string::npos);

    // The counts, from the checkpoint's config.json: the embedding is vocab x hidden, each
    // input_layernorm hidden; the total is every tensor the checkpoint holds.
    const std::string config = read_file(out / "step_6" / "config.json");
    REQUIRE(config.find("\"tie_word_embeddings\": true") != std::string::npos);
    const long long vocab = config_number(config, "vocab_size"), hidden = config_number(config, "hidden_size"),
                    layers = config_number(config, "num_hidden_layers");
    const auto final_model = tensors_of(out / "step_6" / "model.safetensors");
    REQUIRE(final_model.count("lm_head.weight") == 0);  // tied: stored once, as the embedding
    long long total = 0;
    for (const auto& [name, t] : final_model) {
        long long n = 1;
        for (int64_t d : t.shape) n *= d;
        total += n;
    }
    const long long frozen = vocab * hidden + layers * hidden;
    REQUIRE(r.output.find(": " + std::to_string(total) + " parameters,") != std::string::npos);
    REQUIRE(r.output.find(parameters_line(total - frozen, frozen) + "\n") != std::string::npos);

    const Run zero = run_train(with_flag(with_flag(tiny, "--lr", "0"), "--steps", "2") +
                               " --sample-tokens 0 --checkpoint-interval 1 --out-dir " + init.string());
    INFO(zero.output);
    REQUIRE(zero.status == 0);
    // The rest still learns: after 6 steps, below the initial model's validation loss.
    REQUIRE(validation_losses(zero.output).size() == 1);
    REQUIRE(validation_losses(r.output).size() == 2);
    CHECK(validation_losses(r.output).back() < validation_losses(zero.output).back());
    REQUIRE(read_file(init / "step_1" / "model.safetensors") == read_file(init / "step_2" / "model.safetensors"));
    REQUIRE(losses(zero.output).at(0) == losses(r.output).at(0));  // the same model saw the same first batch
    const auto initial = tensors_of(init / "step_1" / "model.safetensors");
    CHECK(check_frozen_checkpoint(out / "step_3", initial) == 1 + layers);
    CHECK(check_frozen_checkpoint(out / "step_6", initial) == 1 + layers);
}

TEST_CASE(
    "train --freeze: a pattern matching nothing, part of a fused tensor, everything, or a change on resume is "
    "refused",
    "[train][freeze]") {
    TempDir dir("train_freeze_bad");
    const std::string run = kTiny + " --sample-tokens 0 --out-dir " + dir.file("refused") + " --freeze ";
    const Run none = run_train(run + "'model.embed_tokens.*,model.layers.9.*'");
    INFO(none.output);
    REQUIRE(none.status != 0);
    REQUIRE(losses(none.output).empty());
    REQUIRE(none.output.find("--freeze: the pattern 'model.layers.9.*' matches no tensor of this model") !=
            std::string::npos);
    REQUIRE(none.output.find("check its spelling") != std::string::npos);
    const Run part = run_train(run + "'*.k_proj.weight'");
    INFO(part.output);
    REQUIRE(part.status != 0);
    REQUIRE(part.output.find("model.layers.0.self_attn.k_proj.weight") != std::string::npos);
    REQUIRE(part.output.find("freeze all of them or none") != std::string::npos);
    const Run all = run_train(run + "'*'");
    INFO(all.output);
    REQUIRE(all.status != 0);
    REQUIRE(all.output.find("--freeze freezes every tensor of the model: nothing would train") != std::string::npos);

    // --freeze is part of the checkpoint's model: changing it, dropping it or adding it on resume is refused;
    // giving the same patterns again is not a change.
    const std::string two = with_flag(kTiny, "--steps", "2") + " --sample-tokens 0";
    const std::string frozen = dir.file("frozen"), plain = dir.file("plain");
    REQUIRE(run_train(two + " --freeze '" + kFreeze + "' --out-dir " + frozen).status == 0);
    REQUIRE(run_train(two + " --out-dir " + plain).status == 0);
    for (const auto& [checkpoint, flag, change] : std::vector<std::tuple<std::string, std::string, std::string>>{
             {frozen, "--freeze 'model.norm.weight'", "--freeze: \"" + kFreeze + "\" -> \"model.norm.weight\""},
             {frozen, "--freeze ''", "--freeze: \"" + kFreeze + "\" -> \"\""},
             {plain, "--freeze '" + kFreeze + "'", "--freeze: \"\" -> \"" + kFreeze + "\""}}) {
        const Run changed = run_train("--resume " + checkpoint + " --steps 3 --extend-schedule " + flag);
        INFO(changed.output);
        REQUIRE(changed.status != 0);
        REQUIRE(changed.output.find("cannot change " + change + " when resuming") != std::string::npos);
        REQUIRE(changed.output.find("start a new run instead") != std::string::npos);
    }
    const Run same = run_train("--resume " + frozen + " --steps 3 --extend-schedule --freeze '" + kFreeze + "'");
    INFO(same.output);
    REQUIRE(same.status == 0);
    REQUIRE(same.output.find("resumed from") != std::string::npos);
    REQUIRE(losses(same.output).size() == 1);
}

// Frozen tensors under the strategies: with accumulation 1 the sharded zero3 and the replicated
// ddp compute the same sums (bit-identical losses and checkpoints, as for unfrozen runs); a frozen
// checkpoint saved by a 2-rank pipeline resumes with zero2 at 2 ranks and with single at 1 rank,
// keeps the frozen tensors' bits and continues the run (fp64: to 1e-10 of one that never stopped).
TEST_CASE("train --freeze under mpirun: zero3 and ddp agree; a frozen mp checkpoint resumes with zero2 and single",
          "[train][freeze][mpi]") {
    TempDir dir("train_freeze_mpi");
    const std::string train = (build_dir() / "train").string(), freeze = "--freeze '" + kFreeze + "' ";
    const std::string run = train + " " + kTiny + " --sample-tokens 0 " + freeze;
    const Run ddp = run_mpi(2, run + "--parallel ddp --out-dir " + dir.file("ddp"));
    const Run zero3 = run_mpi(2, run + "--parallel zero3 --out-dir " + dir.file("zero3"));
    INFO(ddp.output << "\n----\n" << zero3.output);
    REQUIRE(ddp.status == 0);
    REQUIRE(zero3.status == 0);
    REQUIRE(zero3.output.find("x 2 rank(s), strategy zero3") != std::string::npos);
    REQUIRE(zero3.output.find(" frozen (") != std::string::npos);
    REQUIRE(losses(ddp.output).size() == 6);
    REQUIRE(losses(zero3.output) == losses(ddp.output));
    for (const char* f : {"model.safetensors", "master.safetensors", "adam_m.safetensors", "adam_v.safetensors"}) {
        INFO(f);
        REQUIRE(read_file(fs::path(dir.file("ddp")) / "step_6" / f) ==
                read_file(fs::path(dir.file("zero3")) / "step_6" / f));
    }

    const std::string fp64 = " --dtype fp64 --batch 4 --seq-len 16 --vocab 300 --eval-interval 0 --sample-tokens 0 ";
    const Run zero =
        run_train(fp64 + "--steps 1 --warmup 1 --lr 0 --out-dir " + dir.file("init"));  // the initial model
    INFO(zero.output);
    REQUIRE(zero.status == 0);
    const auto initial = tensors_of(fs::path(dir.file("init")) / "step_1" / "model.safetensors");
    const std::string frozen_run = fp64 + "--steps 6 --warmup 2 --lr 3e-3 " + freeze;
    const Run s = run_train(frozen_run + "--out-dir " + dir.file("straight"));
    INFO(s.output);
    REQUIRE(s.status == 0);
    const auto straight = metric_losses(fs::path(dir.file("straight")) / "metrics.jsonl");
    REQUIRE(straight.size() == 6);
    std::smatch counts;
    REQUIRE(std::regex_search(s.output, counts, std::regex("parameters: [^\n]*")));
    const fs::path mp = dir.file("mp2"), single = dir.file("single1");
    const Run a =
        run_mpi(2, train + frozen_run + "--parallel mp --in-flight 2 --stop-after 3 --out-dir " + mp.string());
    INFO(a.output);
    REQUIRE(a.status == 0);
    REQUIRE(a.output.find(counts[0].str()) != std::string::npos);
    check_frozen_checkpoint(mp / "step_3", initial);
    fs::copy(mp, single, fs::copy_options::recursive);
    for (const auto& [ranks, strategy, out] :
         std::vector<std::tuple<int, std::string, fs::path>>{{2, "zero2", mp}, {1, "single", single}}) {
        INFO("mp x2 -> " << strategy << " x" << ranks);
        // A copied output directory still names the original as its out_dir: name it.
        const std::string resume =
            train + " --resume " + out.string() + " --parallel " + strategy + " --out-dir " + out.string();
        const Run b = ranks > 1 ? run_mpi(ranks, resume) : run_train_command(resume);
        INFO(b.output);
        REQUIRE(b.status == 0);
        REQUIRE(b.output.find("resumed from") != std::string::npos);
        REQUIRE(b.output.find(counts[0].str()) != std::string::npos);  // still frozen: the checkpoint's --freeze
        check_frozen_checkpoint(out / "step_6", initial);
        const auto resumed = metric_losses(out / "metrics.jsonl");
        REQUIRE(resumed.size() == 6);
        for (const auto& [step, loss] : straight) {
            INFO("step " << step);
            CHECK(std::abs(resumed.at(step) - loss) <= 1e-10 * std::abs(loss));
        }
    }
}

namespace train_test {

// Every tensor of a safetensors file: name -> (dtype, bytes).
std::map<std::string, std::pair<std::string, std::vector<uint8_t>>> dtype_and_bytes(const fs::path& p) {
    std::map<std::string, std::pair<std::string, std::vector<uint8_t>>> out;
    for (pv::SafeTensor& t : pv::read_safetensors(p.string()).tensors) out[t.name] = {t.dtype, std::move(t.data)};
    return out;
}

// A tiny fp32 run exported as a Hugging Face directory, for the export and --init-from tests: the
// run's directory and the export's. Made once per process and shared (read only: a test that
// changes a model directory copies it first).
struct Exported {
    fs::path run, hf;
};

const Exported& tiny_export() {
    static const TempDir dir("train_exported");
    static const Exported e = [] {
        Exported x{dir.path / "source", dir.path / "hf"};
        const Run t = run_train(kTiny + " --dtype fp32 --sample-tokens 0 --out-dir " + x.run.string());
        INFO(t.output);
        REQUIRE(t.status == 0);
        const Run r = run_train("export " + x.run.string() + " --out " + x.hf.string());
        INFO(r.output);
        REQUIRE(r.status == 0);
        return x;
    }();
    return e;
}

// One step; with --lr 0 (kInit) AdamW leaves the weights as they were loaded.
const std::string kInitShape =
    " --steps 1 --batch 4 --micro-batch 2 --seq-len 16 --warmup 0 --eval-interval 0 --sample-tokens 0 ";
const std::string kInit = kInitShape + "--lr 0 ";

}  // namespace train_test

TEST_CASE("train export: a checkpoint as a Hugging Face directory, weights and tokenizer as they were, no optimizer",
          "[train][export]") {
    TempDir dir("train_export");
    const Exported& e = tiny_export();
    const fs::path step = e.run / "step_6";
    for (const char* f : {"model.safetensors", "config.json", "tokenizer.json", "generation_config.json"})
        CHECK(fs::exists(e.hf / f));
    for (const char* f : {"adam_m.safetensors", "adam_v.safetensors", "master.safetensors", "trainer_state.json"})
        CHECK_FALSE(fs::exists(e.hf / f));
    CHECK(dtype_and_bytes(e.hf / "model.safetensors") == dtype_and_bytes(step / "model.safetensors"));
    CHECK(read_file(e.hf / "tokenizer.json") == read_file(step / "tokenizer.json"));
    CHECK(read_file(e.hf / "config.json").find("\"torch_dtype\": \"float32\"") != std::string::npos);
    // The tokenizer's end-of-text id is the model's EOS (no BOS: the built-in tokenizer has none).
    const pv::Tokenizer tok = pv::Tokenizer::load((step / "tokenizer.json").string());
    CHECK(read_file(e.hf / "generation_config.json") ==
          "{\n  \"eos_token_id\": " + std::to_string(tok.eos_id()) + "\n}\n");
    CHECK(read_file(step / "generation_config.json") == read_file(e.hf / "generation_config.json"));
    // --dtype converts (round to nearest even); the config says so.
    const Run b = run_train("export " + e.run.string() + " --dtype bf16 --out " + dir.file("hf16"));
    INFO(b.output);
    REQUIRE(b.status == 0);
    CHECK(b.output.find("as bf16 (0 values overflowed)") != std::string::npos);
    for (const auto& [name, t] : dtype_and_bytes(fs::path(dir.file("hf16")) / "model.safetensors"))
        CHECK(t.first == "BF16");
    CHECK(read_file(fs::path(dir.file("hf16")) / "config.json").find("\"torch_dtype\": \"bfloat16\"") !=
          std::string::npos);
    // Nothing of the user's is overwritten.
    const Run again = run_train("export " + e.run.string() + " --out " + e.hf.string());
    CHECK(again.status != 0);
    CHECK(again.output.find("not an empty directory") != std::string::npos);
}

TEST_CASE("train --init-from: a Hugging Face directory's weights, config and tokenizer; lr 0 keeps its bits",
          "[train][init]") {
    TempDir dir("train_init");
    const Exported& e = tiny_export();
    const Run fresh = run_train(kInitShape + "--lr 3e-3 --vocab 300 --dtype fp32 --out-dir " + dir.file("fresh"));
    const Run init = run_train("--init-from " + e.hf.string() + kInit + "--dtype fp32 --out-dir " + dir.file("init"));
    INFO(fresh.output << "\n----\n" << init.output);
    REQUIRE(fresh.status == 0);
    REQUIRE(init.status == 0);
    CHECK(init.output.find("init from " + e.hf.string() + ": 1 file (F32) -> fp32; rank 0 read ") != std::string::npos);
    // The trained weights predict the corpus better than a fresh model's: a fresh model's first loss
    // is within ~0.01 of ln(vocab), and the source's six steps lower it by 0.25-0.35 depending on the
    // corpus (the project's own documentation and headers, which every change edits), so 0.1.
    REQUIRE(losses(init.output).size() == 1);
    CHECK(std::stod(losses(init.output)[0]) < std::stod(losses(fresh.output)[0]) - 0.1);
    // lr 0: AdamW changes nothing, so the checkpoint holds the source's weights bit for bit; the
    // model files travel with it.
    const fs::path step = fs::path(dir.file("init")) / "step_1";
    CHECK(dtype_and_bytes(step / "model.safetensors") == dtype_and_bytes(e.hf / "model.safetensors"));
    CHECK(read_file(step / "tokenizer.json") == read_file(e.hf / "tokenizer.json"));
    CHECK(read_file(step / "generation_config.json") == read_file(e.hf / "generation_config.json"));
    CHECK(read_file(step / "config.json") == read_file(e.hf / "config.json"));
    // bf16 from the fp32 file; and the run resumes like any other (the checkpoint is the model now).
    const Run b = run_train("--init-from " + e.hf.string() + kInit + "--out-dir " + dir.file("init16"));
    INFO(b.output);
    REQUIRE(b.status == 0);
    CHECK(b.output.find("1 file (F32) -> bf16") != std::string::npos);
    // With --freeze the frozen tensors keep the file's bits while the others train.
    const Run frozen =
        run_train("--init-from " + e.hf.string() + kInitShape +
                  "--lr 3e-3 --dtype fp32 --freeze 'model.embed_tokens.*' --out-dir " + dir.file("frozen"));
    INFO(frozen.output);
    REQUIRE(frozen.status == 0);
    const auto trained = dtype_and_bytes(fs::path(dir.file("frozen")) / "step_1" / "model.safetensors");
    const auto source = dtype_and_bytes(e.hf / "model.safetensors");
    CHECK(trained.at("model.embed_tokens.weight") == source.at("model.embed_tokens.weight"));
    CHECK(trained.at("model.norm.weight") != source.at("model.norm.weight"));
    const Run resumed = run_train("--resume " + dir.file("init") + " --steps 2 --extend-schedule");
    INFO(resumed.output);
    REQUIRE(resumed.status == 0);
    CHECK(resumed.output.find("resumed from " + step.string() + " at step 1") != std::string::npos);
    CHECK(resumed.output.find("init from") == std::string::npos);
}

TEST_CASE("train --init-from under mpirun: zero3 slices and mp stages load the same model; every rank reports",
          "[train][init][mpi]") {
    TempDir dir("train_init_mpi");
    const Exported& e = tiny_export();
    const std::string train =
        (build_dir() / "train").string() + " --init-from " + e.hf.string() + kInit + "--dtype fp32 ";
    for (const char* strategy : {"zero3", "mp"}) {
        const Run r = run_mpi(2, train + "--parallel " + strategy + " --out-dir " + dir.file(strategy));
        INFO(r.output);
        REQUIRE(r.status == 0);
        CHECK(r.output.find("  rank 0 read ") != std::string::npos);
        CHECK(r.output.find("  rank 1 read ") != std::string::npos);
        CHECK(dtype_and_bytes(fs::path(dir.file(strategy)) / "step_1" / "model.safetensors") ==
              dtype_and_bytes(e.hf / "model.safetensors"));
    }
}

TEST_CASE("train --init-from: what cannot work is refused, naming the problem and the fix", "[train][init]") {
    TempDir dir("train_init_bad");
    const Exported& e = tiny_export();
    const std::string init = "--init-from " + e.hf.string() + kInit + "--out-dir " + dir.file("out");
    auto refused = [&](const std::string& args, const std::vector<std::string>& says) {
        const Run r = run_train(args);
        INFO(r.output);
        CHECK(r.status != 0);
        for (const std::string& s : says) CHECK(r.output.find(s) != std::string::npos);
    };
    refused(init + " --resume " + (e.run / "step_6").string(), {"--init-from", "--resume", "pass one"});
    refused(init + " --preset test-tiny", {"config.json", "drop --preset test-tiny"});
    refused(init + " --config " + (e.hf / "config.json").string(), {"drop --config"});
    // Not a Llama model.
    fs::copy(e.hf, dir.path / "mistral", fs::copy_options::recursive);
    std::string config = read_file(dir.path / "mistral" / "config.json");
    config.replace(config.find("\"llama\""), 7, "\"mistral\"");
    config.replace(config.find("LlamaForCausalLM"), 16, "MistralForCausalLM");
    std::ofstream(dir.path / "mistral" / "config.json") << config;
    refused("--init-from " + (dir.path / "mistral").string() + kInit, {"not a Llama model"});
    // A config.json the weights contradict, and a vocabulary the tokenizer does not fit.
    fs::copy(e.hf, dir.path / "wide", fs::copy_options::recursive);
    config = read_file(dir.path / "wide" / "config.json");
    config.replace(config.find("\"intermediate_size\": 352"), 24, "\"intermediate_size\": 360");
    std::ofstream(dir.path / "wide" / "config.json") << config;
    refused("--init-from " + (dir.path / "wide").string() + kInit + "--out-dir " + dir.file("wide_out"),
            {"gate_proj.weight' has shape [352, 128], expected [360, 128]"});
    config.replace(config.find("\"vocab_size\": 300"), 17, "\"vocab_size\": 290");
    std::ofstream(dir.path / "wide" / "config.json") << config;
    refused("--init-from " + (dir.path / "wide").string() + kInit,
            {"generation_config.json", "eos_token_id = 299 is not a token of this model"});
    fs::remove(dir.path / "wide" / "generation_config.json");  // then the tokenizer is what does not fit
    refused("--init-from " + (dir.path / "wide").string() + kInit,
            {"has 300 tokens, more than the model's vocab_size 290"});
    // Data prepared with another tokenizer.
    std::string text;
    for (int i = 0; i < 200; ++i) text += "Line " + std::to_string(i) + " of a small document about kernels.\n";
    std::ofstream(dir.file("a.txt")) << text;
    REQUIRE(run_train("prepare " + dir.file("a.txt") + " --out " + dir.file("data") + " --vocab 280").status == 0);
    refused(init + " --data " + dir.file("data"),
            {dir.file("data") + "/tokenizer.json", (e.hf / "tokenizer.json").string(), "train prepare --tokenizer"});
    // The same data without its tokenizer.json: the shards still say which tokenizer made them.
    fs::remove(fs::path(dir.file("data")) / "tokenizer.json");
    refused(init + " --data " + dir.file("data"), {dir.file("data") + "/train_000000.pvtokens was made with tokenizer",
                                                   (e.hf / "tokenizer.json").string(), "train prepare --tokenizer"});
    // No tokenizer in the model directory and no data to train on.
    fs::copy(e.hf, dir.path / "untokenized", fs::copy_options::recursive);
    fs::remove(dir.path / "untokenized" / "tokenizer.json");
    refused("--init-from " + (dir.path / "untokenized").string() + kInit, {"has no tokenizer.json", "--data"});
}

TEST_CASE("train convert: stories260K becomes a directory --init-from fine-tunes on data with a smaller vocabulary",
          "[train][init][llama2c]") {
    TempDir dir("train_convert");
    const fs::path bin = fs::path(__FILE__).parent_path() / "../../shared/models/stories260K.bin";
    INFO("the real llama2.c checkpoint " << bin << " must exist (the shared models directory beside the repository)");
    REQUIRE(fs::exists(bin));
    const Run c = run_train("convert --from llama2c " + bin.string() + " --out " + dir.file("st"));
    INFO(c.output);
    REQUIRE(c.status == 0);
    CHECK(c.output.find("260032 parameters, 5 layers, hidden 64, 8 heads (4 KV), vocab 512, tied") !=
          std::string::npos);
    // 300 tokens of data for a 512-row embedding: the rows past 300 are padding, which is fine.
    std::string text;
    for (int i = 0; i < 300; ++i)
        text += "Once upon a time there was a little model number " + std::to_string(i) + ".\n";
    std::ofstream(dir.file("a.txt")) << text;
    REQUIRE(run_train("prepare " + dir.file("a.txt") + " --out " + dir.file("data") + " --vocab 300").status == 0);
    const Run t = run_train("--init-from " + dir.file("st") + " --data " + dir.file("data") +
                            " --steps 2 --batch 4 --micro-batch 2 --seq-len 32 --warmup 0 --eval-interval 0 "
                            "--sample-tokens 0 --out-dir " +
                            dir.file("run"));
    INFO(t.output);
    REQUIRE(t.status == 0);
    CHECK(t.output.find("has no tokenizer.json; the data's token ids") != std::string::npos);
    CHECK(t.output.find("vocab 512") != std::string::npos);
    const fs::path step = fs::path(dir.file("run")) / "step_2";
    CHECK(read_file(step / "tokenizer.json") == read_file(fs::path(dir.file("data")) / "tokenizer.json"));
    CHECK(read_file(step / "generation_config.json") == read_file(fs::path(dir.file("st")) / "generation_config.json"));
    // A malformed file is refused with the reason.
    std::ofstream(dir.file("short.bin")) << "not a model";
    const Run bad = run_train("convert --from llama2c " + dir.file("short.bin") + " --out " + dir.file("bad"));
    CHECK(bad.status != 0);
    CHECK(bad.output.find("shorter than the 28-byte header") != std::string::npos);
    CHECK_FALSE(fs::exists(dir.file("bad")));
}

// The fine-tuning path end to end, as docs/fine-tuning-and-chat.md tells it: a published llama2.c model converted
// to a Hugging Face directory, a chat JSON-lines file prepared with masked prompts, the model
// fine-tuned from it under ddp at 2 ranks with --document-mask, then asked a question with --chat.
// `train eval` on the same data before and after shows the fine-tuning lowered the loss.
TEST_CASE("train end to end: convert stories260K, prepare chats, fine-tune under ddp at 2 ranks, sample with --chat",
          "[train][init][mpi][chat]") {
    TempDir dir("train_e2e");
    const fs::path bin = fs::path(__FILE__).parent_path() / "../../shared/models/stories260K.bin";
    INFO("the real llama2.c checkpoint " << bin << " must exist (the shared models directory beside the repository)");
    REQUIRE(fs::exists(bin));
    REQUIRE(run_train("convert --from llama2c " + bin.string() + " --out " + dir.file("st")).status == 0);
    {
        std::ofstream c(dir.file("chats.jsonl"));
        for (int i = 0; i < 48; ++i)
            c << "{\"messages\": [{\"role\": \"system\", \"content\": \"Answer briefly.\"}, {\"role\": \"user\", "
                 "\"content\": \"What comes after "
              << i << "?\"}, {\"role\": \"assistant\", \"content\": \"" << i + 1 << " comes after " << i << ".\"}]}\n";
    }
    const std::string data = dir.file("data");
    const Run p = run_train("prepare " + dir.file("chats.jsonl") + " --out " + data +
                            " --vocab 400 --chat-format llama3 --val-fraction 0.25");
    INFO(p.output);
    REQUIRE(p.status == 0);
    const std::regex eval_line(R"(loss ([0-9.eE+-]+) perplexity [0-9.eE+-]+ tokens ([0-9]+) windows ([0-9]+))");
    auto eval_loss = [&](const std::string& model) {
        const Run e = run_train("eval " + model + " --data " + data + " --seq-len 48 --dtype fp32");
        INFO(e.output);
        REQUIRE(e.status == 0);
        std::smatch m;
        REQUIRE(std::regex_search(e.output, m, eval_line));
        CHECK(std::stoll(m[2]) > 0);
        return std::stod(m[1]);
    };
    const double before = eval_loss(dir.file("st"));
    const Run t = run_mpi(2, (build_dir() / "train").string() + " --init-from " + dir.file("st") + " --data " + data +
                                 " --parallel ddp --steps 12 --batch 8 --seq-len 48 --lr 3e-3 --warmup 2 "
                                 "--document-mask --eval-interval 0 --sample-tokens 0 --out-dir " +
                                 dir.file("run"));
    INFO(t.output);
    REQUIRE(t.status == 0);
    REQUIRE(t.output.find("x 2 rank(s), strategy ddp") != std::string::npos);
    REQUIRE(t.output.find("document mask on") != std::string::npos);
    const double after = eval_loss(dir.file("run"));
    INFO("validation loss of the chats before " << before << ", after 12 steps " << after);
    CHECK(after < before - 0.5);
    // The question rendered in the chat format: the system-free user turn, then the assistant's header.
    const Run s = run_train("sample " + dir.file("run") +
                            " --chat --chat-format llama3 --prompt 'What comes after 7?' --max-tokens 12 "
                            "--temperature 0 --print-ids");
    INFO(s.output);
    REQUIRE(s.status == 0);
    CHECK(s.output.find("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nWhat comes after "
                        "7?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n") != std::string::npos);
    CHECK(std::regex_search(s.output, std::regex(R"(\n\[[0-9]+(, [0-9]+)*\]\n)")));
    // Without a format it is refused, naming the formats there are (the trained tokenizer has no template).
    const Run no_format = run_train("sample " + dir.file("run") + " --chat --prompt hi --max-tokens 2");
    CHECK(no_format.status != 0);
    CHECK(no_format.output.find("llama3") != std::string::npos);
}

// stories260K's greedy continuation of BOS: fp64 and fp32 give exactly the ids of an independent
// NumPy float64 transcription of llama2.c's run.c (test/interop/stories260k_greedy.py, which wrote
// the fixture); bf16 weights diverge where the model's top two logits are close, and the test
// reports where.
TEST_CASE("train sample: stories260K greedy from BOS equals llama2.c's forward in fp64 and fp32; bf16 reported",
          "[train][sample][llama2c]") {
    TempDir dir("train_stories");
    const fs::path here = fs::path(__FILE__).parent_path();
    const fs::path bin = here / "../../shared/models/stories260K.bin";
    INFO("the real llama2.c checkpoint " << bin << " must exist (the shared models directory beside the repository)");
    REQUIRE(fs::exists(bin));
    REQUIRE(run_train("convert --from llama2c " + bin.string() + " --out " + dir.file("st")).status == 0);
    const std::string fixture = read_file(here / "data/stories260k_greedy.json");
    std::smatch m;
    REQUIRE(std::regex_search(fixture, m, std::regex(R"("greedy_ids": (\[[0-9, ]+\]))")));
    const std::string expected = m[1];
    const int steps = int(std::count(expected.begin(), expected.end(), ',')) + 1;
    auto greedy = [&](const std::string& dtype) {
        const Run s =
            run_train("sample " + dir.file("st") + " --prompt-ids 1 --temperature 0 --print-ids --max-tokens " +
                      std::to_string(steps) + " --dtype " + dtype);
        INFO(s.output);
        REQUIRE(s.status == 0);
        std::smatch ids;
        REQUIRE(std::regex_search(s.output, ids, std::regex(R"((\[[0-9, ]+\])\n)")));
        return std::string(ids[1]);
    };
    CHECK(greedy("fp64") == expected);
    CHECK(greedy("fp32") == expected);
    const std::string bf16 = greedy("bf16");
    size_t same = 0;  // ids in common before the first difference
    for (size_t i = 0; i < std::min(bf16.size(), expected.size()) && bf16[i] == expected[i]; ++i)
        if (bf16[i] == ',') ++same;
    WARN("stories260K greedy in bf16 " << (bf16 == expected ? "equals fp64's"
                                                            : "first differs from fp64's at generated token " +
                                                                  std::to_string(same)));
}

namespace train_test {

// stories260K converted into `base`, and 48 chat examples prepared into `data` with a new
// 400-token tokenizer (the LoRA and QLoRA end-to-end tests fine-tune the one on the other).
void stories_with_chats(TempDir& dir, const std::string& base, const std::string& data) {
    const fs::path bin = fs::path(__FILE__).parent_path() / "../../shared/models/stories260K.bin";
    REQUIRE(fs::exists(bin));
    REQUIRE(run_train("convert --from llama2c " + bin.string() + " --out " + base).status == 0);
    {
        std::ofstream c(dir.file("chats.jsonl"));
        for (int i = 0; i < 48; ++i)
            c << "{\"messages\": [{\"role\": \"user\", \"content\": \"What comes after " << i
              << "?\"}, {\"role\": \"assistant\", \"content\": \"" << i + 1 << " comes after " << i << ".\"}]}\n";
    }
    REQUIRE(run_train("prepare " + dir.file("chats.jsonl") + " --out " + data +
                      " --vocab 400 --chat-format llama3 --val-fraction 0.25")
                .status == 0);
}

// `train eval MODEL --data DATA` in fp32, every window without the document mask (a checkpoint's
// run may have had it: the same computation for checkpoints and exported directories): its loss.
double eval_fp32(const std::string& model, const std::string& data) {
    const Run e = run_train("eval " + model + " --data " + data +
                            " --seq-len 48 --dtype fp32 --no-document-mask --max-windows 0");
    INFO(e.output);
    REQUIRE(e.status == 0);
    std::smatch m;
    REQUIRE(std::regex_search(e.output, m, std::regex(R"(loss ([0-9.eE+-]+) perplexity)")));
    return std::stod(m[1]);
}

}  // namespace train_test

// A fine-tuning run (--init-from) takes fine-tuning's defaults for the flags not given — the
// learning rate by method, a warmup ratio, the window from the data's longest example, the
// document mask, no closing sample — and says so; a flag given wins. `train plan` takes them too.
// [heavy]: left out of the ASan build, whose time budget the whole-program runs fill; what it
// checks is the options' arithmetic, plain host C++ with no kernel of its own.
TEST_CASE("train --init-from: fine-tuning defaults for the flags not given, the window from the data",
          "[train][init][heavy]") {
    TempDir dir("train_finetune_defaults");
    const std::string base = dir.file("st"), data = dir.file("data");
    stories_with_chats(dir, base, data);
    const Run lora = run_train("plan --init-from " + base + " --data " + data + " --lora-rank 4");
    INFO(lora.output);
    REQUIRE(lora.status == 0);
    CHECK(lora.output.find("fine-tuning defaults (--init-from): --lr 0.0002 (LoRA), --warmup-ratio 0.03, --seq-len "
                           "from the data, --document-mask, no closing sample") != std::string::npos);
    // The longest chat ("What comes after 47?" and its answer in the llama3 format) decides the
    // window: the longest example's tokens, less one, rounded up to a multiple of 64.
    std::smatch longest;
    REQUIRE(std::regex_search(lora.output, longest,
                              std::regex(R"(--seq-len ([0-9]+) from the data: its longest example is ([0-9]+) tokens)")));
    const int window = std::stoi(longest[1]), tokens = std::stoi(longest[2]);
    CHECK(tokens > 10);
    CHECK(window == (tokens - 1 + 63) / 64 * 64);
    CHECK(lora.output.find("micro-batch 8 x " + std::to_string(window) + " tokens") != std::string::npos);
    const Run full = run_train("plan --init-from " + base + " --data " + data + " --lr 1e-3 --seq-len 32");
    INFO(full.output);
    REQUIRE(full.status == 0);
    CHECK(full.output.find("fine-tuning defaults (--init-from): --warmup-ratio 0.03, --document-mask, no closing "
                           "sample") != std::string::npos);
    CHECK(full.output.find("from the data") == std::string::npos);
    const Run demo = run_train("plan");
    CHECK(demo.output.find("fine-tuning defaults") == std::string::npos);
}

// --warmup as long as the run is warned about (it never trains at --lr); longer is refused naming
// the flags; --warmup-ratio counts as Hugging Face does; --epochs derives the steps from the data.
// A resume with another --steps says what it does to the schedule and needs the choice made.
TEST_CASE("train: the warmup warning, --warmup-ratio, --epochs, and a resume that changes --steps",
          "[train][schedule][heavy]") {  // [heavy] as the case above
    TempDir dir("train_schedule_flags");
    const std::string tiny = "--batch 2 --micro-batch 2 --seq-len 8 --vocab 257 --sample-tokens 0 --eval-interval 0 ";
    const Run all_warmup = run_train(tiny + "--steps 3 --warmup 3 --out-dir " + dir.file("a"));
    INFO(all_warmup.output);
    REQUIRE(all_warmup.status == 0);
    CHECK(all_warmup.output.find("warning: --warmup 3 is the whole run's 3 steps") != std::string::npos);
    const Run longer = run_train(tiny + "--steps 3 --warmup 4 --out-dir " + dir.file("b"));
    CHECK(longer.status != 0);
    CHECK(longer.output.find("--warmup 4 is more than the run's 3 steps") != std::string::npos);
    CHECK(!fs::exists(dir.file("b")));
    // ceil(0.25 x 6) = 2 warmup steps: the first step's learning rate is half the peak.
    const Run ratio = run_train(tiny + "--steps 6 --warmup-ratio 0.25 --lr 1e-3 --out-dir " + dir.file("c"));
    INFO(ratio.output);
    REQUIRE(ratio.status == 0);
    CHECK(ratio.output.find("step     1/6 | loss") != std::string::npos);
    CHECK(ratio.output.find("| lr 5.000e-04 |") != std::string::npos);
    CHECK(ratio.output.find("warning") == std::string::npos);
    // --epochs 0.0001 of the built-in corpus's windows at --batch 2.
    const Run epochs = run_train(tiny + "--epochs 0.0001 --warmup 0 --out-dir " + dir.file("d"));
    INFO(epochs.output);
    REQUIRE(epochs.status == 0);
    std::smatch windows, steps;
    REQUIRE(std::regex_search(epochs.output, windows, std::regex(R"(([0-9]+) training windows of 8 tokens)")));
    REQUIRE(std::regex_search(epochs.output, steps, std::regex(R"(--epochs 0.0001: ([0-9]+) steps)")));
    const long long expected = (long long)std::ceil(0.0001 * std::stod(windows[1]) / 2 - 1e-9);
    CHECK(std::stoll(steps[1]) == expected);
    CHECK(losses(epochs.output).size() == size_t(expected));
    // Resuming run `a` (3 steps) to 5: the choice is the user's.
    const Run refused = run_train("--resume " + dir.file("a") + " --steps 5");
    INFO(refused.output);
    CHECK(refused.status != 0);
    CHECK(refused.output.find("the checkpoint's learning-rate schedule spans 3 steps") != std::string::npos);
    CHECK(refused.output.find("--extend-schedule stretches it over 5 steps") != std::string::npos);
    CHECK(refused.output.find("--keep-schedule keeps it") != std::string::npos);
    const Run kept = run_train("--resume " + dir.file("a") + " --steps 5 --keep-schedule");
    INFO(kept.output);
    REQUIRE(kept.status == 0);
    // The 3-step schedule's final learning rate, --lr x --final-lr-fraction (2e-3 x 0.1), held.
    CHECK(kept.output.find("step     4/5 | loss") != std::string::npos);
    CHECK(kept.output.find("| lr 2.000e-04 |") != std::string::npos);
}

// LoRA end to end on a real pretrained model: stories260K converted, adapters trained on chats
// (stopped and resumed: the base is reloaded from the directory the checkpoint references), the
// validation loss lowered; the checkpoint holds adapters only; the merged export and a run
// continued from the exported PEFT adapter compute the checkpoint's loss; a base whose files
// changed is refused.
TEST_CASE("train LoRA end to end: stories260K base, adapters learn, resume, export --merged/--peft, --adapter",
          "[train][lora]") {
    TempDir dir("train_lora");
    const std::string base = dir.file("st"), data = dir.file("data");
    stories_with_chats(dir, base, data);
    auto eval_loss = [&](const std::string& model) { return eval_fp32(model, data); };
    const double before = eval_loss(base);
    const std::string args = "--init-from " + base + " --data " + data +
                             " --lora-rank 8 --lora-alpha 16 --lora-dropout 0.05 --dtype fp32 --steps 12 --batch 8 "
                             "--seq-len 48 --lr 1e-2 --warmup 2 --eval-interval 0 --sample-tokens 0 --out-dir " +
                             dir.file("run");
    const Run t1 = run_train(args + " --stop-after 6");
    INFO(t1.output);
    REQUIRE(t1.status == 0);
    REQUIRE(t1.output.find("LoRA: rank 8, alpha 16, scale 2") != std::string::npos);
    REQUIRE(std::regex_search(t1.output, std::regex(R"(parameters: [0-9]+ trainable \([0-9.]+%\), 260032 frozen)")));
    const Run t2 = run_train("--resume " + dir.file("run"));
    INFO(t2.output);
    REQUIRE(t2.status == 0);
    REQUIRE(t2.output.find("base from " + base) != std::string::npos);
    const fs::path ckpt = dir.path / "run" / "step_12";
    CHECK(fs::exists(ckpt / "adapter_model.safetensors"));
    CHECK(fs::exists(ckpt / "adapter_config.json"));
    CHECK(!fs::exists(ckpt / "model.safetensors"));  // the base is referenced, not copied
    const double after = eval_loss(ckpt.string());
    INFO("validation loss before " << before << ", after 12 LoRA steps " << after);
    CHECK(after < before - 0.3);

    // The merged model computes the adapted model's loss (fp32: to rounding).
    const Run merged = run_train("export " + ckpt.string() + " --merged " + dir.file("merged"));
    INFO(merged.output);
    REQUIRE(merged.status == 0);
    CHECK(std::fabs(eval_loss(dir.file("merged")) - after) <= 1e-5 * after);
    // The PEFT adapter, continued with lr 0, is the same model.
    const Run peft = run_train("export " + ckpt.string() + " --peft " + dir.file("peft"));
    INFO(peft.output);
    REQUIRE(peft.status == 0);
    const Run cont = run_train("--init-from " + base + " --adapter " + dir.file("peft") + " --data " + data +
                               " --dtype fp32 --steps 1 --batch 8 --seq-len 48 --lr 0 --warmup 0 --eval-interval 0 "
                               "--sample-tokens 0 --out-dir " +
                               dir.file("cont"));
    INFO(cont.output);
    REQUIRE(cont.status == 0);
    CHECK(cont.output.find("LoRA: rank 8, alpha 16") != std::string::npos);
    CHECK(eval_loss(dir.file("cont")) == after);
    // Wrong use is refused with the fix.
    const Run out = run_train("export " + ckpt.string() + " --out " + dir.file("plain"));
    CHECK(out.status != 0);
    CHECK(out.output.find("--merged") != std::string::npos);
    const Run freeze = run_train("--lora-rank 4 --freeze 'model.norm.*' --out-dir " + dir.file("f"));
    CHECK(freeze.status != 0);
    CHECK(freeze.output.find("drop --freeze") != std::string::npos);
    // The base changed under the adapters: refused by eval and by resume.
    { std::ofstream(base + "/config.json", std::ios::app) << "\n"; }
    const Run changed = run_train("eval " + ckpt.string() + " --data " + data + " --seq-len 48");
    CHECK(changed.status != 0);
    CHECK(changed.output.find("fingerprint differs") != std::string::npos);
}

// QLoRA end to end: the same fine-tune with the base's linears in NF4 (quantised as they load, so
// no dense copy of the base stays on the device), under zero3 at 2 ranks (the packed base sliced
// and gathered per unit); it learns, reports the NF4 base, and its merged export — the dequantised
// base with the adapters folded in — computes the checkpoint's loss.
TEST_CASE("train QLoRA end to end: stories260K base in NF4 under zero3, adapters learn, export --merged",
          "[train][lora][nf4][mpi]") {
    TempDir dir("train_qlora");
    const std::string base = dir.file("st"), data = dir.file("data");
    stories_with_chats(dir, base, data);
    auto eval_loss = [&](const std::string& model) { return eval_fp32(model, data); };
    const double before = eval_loss(base);
    const Run t = run_mpi(2, (build_dir() / "train").string() + " --init-from " + base + " --data " + data +
                                 " --parallel zero3 --lora-rank 8 --lora-alpha 16 --quantize nf4 --dtype fp32 "
                                 "--steps 12 --batch 8 --seq-len 48 --lr 1e-2 --warmup 2 --eval-interval 0 "
                                 "--sample-tokens 0 --out-dir " +
                                 dir.file("run"));
    INFO(t.output);
    REQUIRE(t.status == 0);
    // stories260K's block linears: 5 layers × (qkv 128×64 + o 64×64 + gate/up/down 3 × 172×64).
    const int quantized = 5 * (128 * 64 + 64 * 64 + 3 * 172 * 64);
    CHECK(t.output.find("NF4 (QLoRA): " + std::to_string(quantized) +
                        " base weights in 4-bit NF4 with double-quantised absmaxes") != std::string::npos);
    const double after = eval_loss(dir.file("run"));
    INFO("validation loss before " << before << ", after 12 QLoRA steps " << after);
    CHECK(after < before - 0.3);
    const Run merged = run_train("export " + dir.file("run") + " --merged " + dir.file("merged"));
    INFO(merged.output);
    REQUIRE(merged.status == 0);
    CHECK(std::fabs(eval_loss(dir.file("merged")) - after) <= 1e-5 * after);
    const Run no_lora = run_train("--quantize nf4 --out-dir " + dir.file("x"));
    CHECK(no_lora.status != 0);
    CHECK(no_lora.output.find("add --lora-rank") != std::string::npos);
}

// LoRA and QLoRA checkpoints move between strategies and world sizes like any other: a zero3 run at
// 2 ranks stopped at step 3 resumes with ddp at 2, mp at 2, single at 1, tp 2 at 2 and tp 2 x zero3 2
// at 4 (QLoRA: each rank holding its slice of every module's NF4 blocks), a QLoRA run stopped
// under tp 2 resumes as zero3 at 2, and every continuation computes the losses of a single-rank run
// that never stopped (fp64: 1e-10).
TEST_CASE("train LoRA and QLoRA checkpoints resume across strategies and world sizes", "[train][lora][mpi]") {
    TempDir dir("train_lora_resume");
    const std::string train = (build_dir() / "train").string();
    // QLoRA under --tp 2 needs slices of whole NF4 blocks: hidden 64, 4 heads of 32 (o_proj's 128
    // columns, 64 a rank), ffn 256 (down_proj's, 128 a rank).
    std::ofstream(dir.file("qlora.json"))
        << R"({"model_type": "llama", "vocab_size": 300, "hidden_size": 64, "intermediate_size": 256,
               "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
               "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "tie_word_embeddings": false})";
    const std::string qlora = "--lora-rank 4 --lora-dropout 0.1 --quantize nf4 --config " + dir.file("qlora.json") + " ";
    for (const std::string& variant : {std::string("--lora-rank 4 --lora-dropout 0.1 "), qlora}) {
        INFO(variant);
        const std::string name = variant.find("nf4") != std::string::npos ? "q" : "l";
        const std::string run = std::string(
                                    " --dtype fp64 --steps 6 --batch 4 --seq-len 16 --vocab 300 --warmup 2 "
                                    "--lr 3e-3 --eval-interval 0 --sample-tokens 0 ") +
                                variant;
        const Run s = run_train(run + "--out-dir " + dir.file(name + "straight"));
        INFO(s.output);
        REQUIRE(s.status == 0);
        const auto straight = metric_losses(fs::path(dir.file(name + "straight")) / "metrics.jsonl");
        REQUIRE(straight.size() == 6);
        // Stopped at step 3 under zero3 x2, resumed as each of the others; under QLoRA also the other
        // way, stopped under tp 2 and resumed as zero3 x2.
        struct Resume {
            std::string first, then;
            int ranks;
        };
        std::vector<Resume> resumes = {{"zero3", "ddp", 2}, {"zero3", "mp", 2}, {"zero3", "single", 1},
                                       {"zero3", "ddp --tp 2", 2}, {"zero3", "zero3 --tp 2", 4}};
        if (name == "q") resumes.push_back({"ddp --tp 2", "zero3 --tp 1", 2});
        for (const std::string& start : {std::string("zero3"), std::string("ddp --tp 2")}) {
            if (std::none_of(resumes.begin(), resumes.end(), [&](const Resume& x) { return x.first == start; })) continue;
            std::string folder = name + "first_" + start;
            std::replace(folder.begin(), folder.end(), ' ', '_');
            const Run a = run_mpi(2, train + run + "--parallel " + start + " --stop-after 3 --out-dir " + dir.file(folder));
            INFO(a.output);
            REQUIRE(a.status == 0);
            REQUIRE(fs::exists(fs::path(dir.file(folder)) / "step_3" / "adapter_model.safetensors"));
        }
        for (const auto& [start, strategy, ranks] : resumes) {
            INFO(start << " x2 -> " << strategy << " x" << ranks);
            std::string first = name + "first_" + start, folder = name + start + "_to_" + strategy;
            std::replace(first.begin(), first.end(), ' ', '_');
            std::replace(folder.begin(), folder.end(), ' ', '_');
            const fs::path out = dir.file(folder);
            fs::copy(dir.file(first), out, fs::copy_options::recursive);
            const std::string resume =
                train + " --resume " + out.string() + " --parallel " + strategy + " --out-dir " + out.string();
            const Run b = ranks > 1 ? run_mpi(ranks, resume) : run_train_command(resume);
            INFO(b.output);
            REQUIRE(b.status == 0);
            const auto resumed = metric_losses(out / "metrics.jsonl");
            REQUIRE(resumed.size() == 6);
            for (const auto& [step, loss] : straight) {
                INFO("step " << step);
                CHECK(std::abs(resumed.at(step) - loss) <= 1e-10 * std::abs(loss));
            }
        }
    }
    // A pre-quantised base (bitsandbytes' 4-bit layout: the QLoRA run's merged export) loads under
    // tp 2 as each rank's slice of its modules' fields: QLoRA from it computes one rank's losses.
    const Run exported = run_train("export " + dir.file("qfirst_zero3") + " --merged " + dir.file("qbnb") + " --quantized --dtype fp32");
    INFO(exported.output);
    REQUIRE(exported.status == 0);
    const std::string from = " --init-from " + dir.file("qbnb") +
                             " --lora-rank 4 --quantize nf4 --dtype fp64 --steps 3 --batch 4 --seq-len 16 --warmup 0 "
                             "--lr 3e-3 --eval-interval 0 --sample-tokens 0 --out-dir ";
    const Run one = run_train(from + dir.file("qbnb_one"));
    INFO(one.output);
    REQUIRE(one.status == 0);
    const Run tp = run_mpi(2, train + from + dir.file("qbnb_tp") + " --parallel ddp --tp 2");
    INFO(tp.output);
    REQUIRE(tp.status == 0);
    const auto want = metric_losses(fs::path(dir.file("qbnb_one")) / "metrics.jsonl");
    const auto got = metric_losses(fs::path(dir.file("qbnb_tp")) / "metrics.jsonl");
    REQUIRE(want.size() == 3);
    REQUIRE(got.size() == 3);
    for (const auto& [step, loss] : want) CHECK(std::abs(got.at(step) - loss) <= 1e-10 * std::abs(loss));
}

// The README's fine-tuning quickstart, its block taken from README.md and run as written
// (test/quickstart.sh) on a stand-in for the model it names: prepare, tokenize --render, plan,
// LoRA under mpirun at 2 ranks with --epochs and the fine-tuning defaults, eval, sample --chat,
// export --peft and --merged. Every command exits 0.
TEST_CASE("README: the fine-tuning quickstart runs as written", "[train][mpi][readme]") {
    const fs::path script = fs::path(__FILE__).parent_path() / "quickstart.sh";
    const Run r = run_train_command("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 300 " +
                                    script.string() + " " + (build_dir() / "train").string());
    INFO(r.output);
    REQUIRE(r.status == 0);
    CHECK(r.output.find("quickstart: 8 commands ran") != std::string::npos);
}
