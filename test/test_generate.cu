// `train sample` and `train eval` end to end (the train binary of this build flavour, run as a
// child process), checked against computations done here without the KV cache or the eval loop:
//   - greedy `train sample --print-ids` equals a greedy loop that recomputes the whole sequence
//     with the model's forward for every token (fp64 and fp32 weights converted on load);
//   - a Hugging Face directory (no trainer_state.json) samples, its torch_dtype is the default
//     dtype, and generation stops at an eos_token_id its generation_config.json lists;
//   - --max-tokens past max_position_embeddings and a model without tokenizer asked for text are
//     refused with the numbers and the fix;
//   - `train eval` gives the loss, perplexity, token and window counts of the windows evaluated
//     here one by one with the model's forward (fp64 to 1e-12; bf16 near it), and refuses data
//     shorter than one window, naming both numbers.
// The model is tiny (2 layers, GQA 6/2, untied, 48 positions), trained for two steps on random
// tokens without a tokenizer, so every run takes a fraction of a second.
#include "data/shard.h"
#include "formats/config_json.h"
#include "model/checkpoint.h"
#include "model/llama.h"
#include "model/sampling.h"
#include "model/unit_loop.h"
#include "test/check.h"
#include "test/temp_dir.h"

#include <sys/wait.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <string>
#include <vector>

using namespace pv::test;

namespace generate_test {

namespace fs = std::filesystem;

struct Run {
    int status = -1;
    std::string out, err;
};

fs::path build_dir() { return fs::read_symlink("/proc/self/exe").parent_path().parent_path(); }

std::string read_file(const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
}

// The train binary with these arguments; stdout and stderr apart.
Run run_train(const std::string& args, const TempDir& dir) {
    const std::string err_file = dir.file("stderr.txt");
    const std::string command = (build_dir() / "train").string() + " " + args + " 2>" + err_file;
    Run r;
    FILE* pipe = popen(command.c_str(), "r");
    REQUIRE(pipe != nullptr);
    std::array<char, 4096> buf;
    size_t n;
    while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) r.out.append(buf.data(), n);
    const int status = pclose(pipe);
    r.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
    r.err = read_file(err_file);
    return r;
}

// The ids of the JSON array on the last line of stdout.
std::vector<int> last_line_ids(const std::string& out) {
    const size_t end = out.find_last_not_of('\n');
    REQUIRE(end != std::string::npos);
    const size_t begin = out.rfind('\n', end);
    const std::string line = out.substr(begin == std::string::npos ? 0 : begin + 1, end + 1 - (begin + 1));
    REQUIRE(line.front() == '[');
    REQUIRE(line.back() == ']');
    std::vector<int> ids;
    const std::regex number("[0-9]+");
    for (auto it = std::sregex_iterator(line.begin(), line.end(), number); it != std::sregex_iterator(); ++it)
        ids.push_back(std::stoi(it->str()));
    return ids;
}

const char* kConfig = R"({"model_type": "llama", "vocab_size": 97, "hidden_size": 48, "intermediate_size": 40,
    "num_hidden_layers": 2, "num_attention_heads": 6, "num_key_value_heads": 2, "head_dim": 8,
    "max_position_embeddings": 48, "rms_norm_eps": 1e-5, "tie_word_embeddings": false})";

// A random token shard (no tokenizer) and a checkpoint trained on it for two steps.
struct Fixture {
    TempDir dir{"generate"};
    std::vector<uint32_t> tokens;
    std::string checkpoint;
    Fixture() {
        std::ofstream(dir.file("config.json")) << kConfig;
        std::mt19937_64 rng(7);
        pv::TokenShard shard{97, 0, {}, {}};
        for (int i = 0; i < 400; ++i) shard.tokens.push_back(uint32_t(rng() % 97));
        // One plain-text document: every token counts, the first starts it, all may be split.
        shard.flags.assign(shard.tokens.size(), pv::kTokenCounted | pv::kTokenSplittable);
        shard.flags[0] |= pv::kTokenStartsDocument;
        tokens = shard.tokens;
        pv::write_shard(dir.file("data.pvtokens"), shard);
        const Run t = run_train("--config " + dir.file("config.json") + " --data " + dir.file("data.pvtokens") +
                                    " --steps 2 --batch 2 --micro-batch 2 --seq-len 16 --warmup 1 --lr 1e-2 "
                                    "--eval-interval 0 --sample-tokens 0 --out-dir " +
                                    dir.file("run"),
                                dir);
        INFO(t.out << t.err);
        REQUIRE(t.status == 0);
        checkpoint = (fs::path(dir.file("run")) / "step_2").string();
    }
};

// One fixture for the whole suite (training it is most of the suite's time); removed at exit.
Fixture& fixture() {
    static Fixture f;
    return f;
}

// The checkpoint's weights in a model of storage type T, `seq_len` rows per forward.
template <class T>
std::unique_ptr<pv::Llama<T>> load(const std::string& checkpoint, int batch, int seq_len) {
    const pv::LlamaConfig c = pv::read_hf_config(checkpoint + "/config.json");
    auto m = std::make_unique<pv::Llama<T>>(c, pv::whole_model(batch, seq_len, 1, pv::Gradients::none));
    std::vector<pv::GroupLayout> layouts;
    for (int u = 0; u < m->num_units(); ++u)
        for (int g = 0; g < m->num_groups(u); ++g) layouts.push_back(m->group(u, g));
    const pv::HostGroups w = pv::read_group_tensors(checkpoint + "/model.safetensors", layouts, pv::dtype_of<T>());
    size_t k = 0;
    for (int u = 0; u < m->num_units(); ++u)
        for (int g = 0; g < m->num_groups(u); ++g, ++k)
            CUDA_CHECK(cudaMemcpy(m->group_params(u, g), w.units[k].data(), w.units[k].size(), cudaMemcpyHostToDevice));
    return m;
}

// Greedy decoding by recomputation: each token is the argmax of the last position of one forward
// over the whole sequence so far (one window of `total` rows; the rows after the sequence hold
// token 0 and, attention being causal, do not change the earlier rows).
template <class T>
std::vector<int> greedy_by_recomputation(const std::string& checkpoint, std::vector<int> seq, int new_tokens) {
    const int total = int(seq.size()) + new_tokens;
    auto m = load<T>(checkpoint, 1, total);
    const size_t V = size_t(m->config().vocab_size);
    std::vector<int> out;
    DeviceArray<int> tokens(static_cast<size_t>(total));
    std::vector<T> row(V);
    for (int i = 0; i < new_tokens; ++i) {
        std::vector<int> window = seq;
        window.resize(size_t(total), 0);
        tokens.upload(window);
        pv::single_forward<T>(*m, 0, pv::DeviceBatch{tokens.get()}, nullptr, nullptr);
        const std::vector<T> all = download_logits(*m, 0);
        std::copy(all.begin() + long((seq.size() - 1) * V), all.begin() + long(seq.size() * V), row.begin());
        const int next = pv::sample_token(to_double(row), 0.0, 1.0, 0.0);
        out.push_back(next);
        seq.push_back(next);
    }
    return out;
}

// Windows [0, windows) of the token stream (window k: tokens k·T .. k·T + T), each through the
// model's forward with its targets; the summed cross-entropy and the count.
template <class T>
std::pair<double, long long> loss_of_windows(const std::string& checkpoint, const std::vector<uint32_t>& stream,
                                             int seq_len, int windows) {
    auto m = load<T>(checkpoint, 1, seq_len);
    const size_t rows = static_cast<size_t>(seq_len);
    DeviceArray<int> inputs(rows), targets(rows);
    DeviceArray<pv::acc_t<T>> loss(1);
    DeviceArray<int> count(1);
    double sum = 0;
    long long counted = 0;
    for (int k = 0; k < windows; ++k) {
        std::vector<int> in(rows), tg(rows);
        for (int i = 0; i < seq_len; ++i) {
            in[size_t(i)] = int(stream[size_t(k * seq_len + i)]);
            tg[size_t(i)] = int(stream[size_t(k * seq_len + i + 1)]);
        }
        inputs.upload(in);
        targets.upload(tg);
        pv::single_forward<T>(*m, 0, pv::DeviceBatch{inputs.get(), targets.get()}, loss.get(), count.get());
        CUDA_CHECK(cudaDeviceSynchronize());
        sum += double(loss.download()[0]);
        counted += count.download()[0];
    }
    return {sum, counted};
}

}  // namespace generate_test

using namespace generate_test;

TEST_CASE("train sample --print-ids: greedy ids equal a greedy loop over full recomputation", "[generate]") {
    Fixture& f = fixture();
    const std::vector<int> prompt = {5, 17, 3, 88, 41};
    for (const char* dtype : {"fp64", "fp32"}) {
        const Run r = run_train("sample " + f.checkpoint + " --prompt-ids 5,17,3,88,41 --temperature 0 --print-ids " +
                                    "--max-tokens 30 --dtype " + dtype,
                                f.dir);
        INFO(dtype << "\n" << r.out << r.err);
        REQUIRE(r.status == 0);
        const std::vector<int> got = last_line_ids(r.out);
        const std::vector<int> expected = std::string(dtype) == "fp64"
                                              ? greedy_by_recomputation<double>(f.checkpoint, prompt, 30)
                                              : greedy_by_recomputation<float>(f.checkpoint, prompt, 30);
        REQUIRE(got == expected);
        REQUIRE(r.err.find("prefill: 5 tokens") != std::string::npos);
        REQUIRE(r.err.find("decode: 29 tokens") != std::string::npos);
        REQUIRE(r.err.find("tokens/s") != std::string::npos);
    }
    // prompt + max tokens = 48 positions fit; 49 do not, and the message names both numbers.
    REQUIRE(run_train("sample " + f.checkpoint + " --prompt-ids 5,17,3 --print-ids --max-tokens 45", f.dir).status ==
            0);
    const Run past = run_train("sample " + f.checkpoint + " --prompt-ids 5,17,3 --print-ids --max-tokens 46", f.dir);
    INFO(past.err);
    REQUIRE(past.status != 0);
    REQUIRE(past.err.find("--max-tokens 46") != std::string::npos);
    REQUIRE(past.err.find("max_position_embeddings of 48") != std::string::npos);
    // No tokenizer: text cannot be read or printed, and the message says what to do instead.
    const Run text = run_train("sample " + f.checkpoint + " --prompt hello", f.dir);
    REQUIRE(text.status != 0);
    REQUIRE(text.err.find("no tokenizer.json") != std::string::npos);
    REQUIRE(text.err.find("--prompt-ids") != std::string::npos);
}

TEST_CASE("train sample on a Hugging Face directory: its dtype, and it stops at a declared eos_token_id",
          "[generate]") {
    Fixture& f = fixture();
    const fs::path hf = f.dir.path / "hf";
    fs::remove_all(hf);
    fs::create_directories(hf);
    fs::copy_file(fs::path(f.checkpoint) / "config.json", hf / "config.json");  // torch_dtype "bfloat16"
    fs::copy_file(fs::path(f.checkpoint) / "model.safetensors", hf / "model.safetensors");
    const std::string args = " --prompt-ids 9,9,2 --temperature 0 --print-ids --max-tokens 12";
    const Run free = run_train("sample " + hf.string() + args, f.dir);
    INFO(free.out << free.err);
    REQUIRE(free.status == 0);
    REQUIRE(free.err.find("Hugging Face model, bf16") != std::string::npos);
    const std::vector<int> ids = last_line_ids(free.out);
    REQUIRE(ids.size() == 12);
    // Declare the fourth generated token an end-of-sequence token (a list, as Llama 3 does).
    std::ofstream(hf / "generation_config.json") << "{\"eos_token_id\": [96, " << ids[3] << "]}";
    const Run stopped = run_train("sample " + hf.string() + args, f.dir);
    INFO(stopped.out << stopped.err);
    REQUIRE(stopped.status == 0);
    const std::vector<int> until = last_line_ids(stopped.out);
    size_t first = 0;  // the first declared token ends generation (it is returned)
    while (ids[first] != ids[3] && ids[first] != 96) ++first;
    REQUIRE(until == std::vector<int>(ids.begin(), ids.begin() + long(first) + 1));
    REQUIRE(stopped.err.find("stopped at an end-of-sequence token") != std::string::npos);
    // Neither kind of directory.
    fs::create_directories(f.dir.path / "empty");  // (idempotent)
    const Run neither = run_train("sample " + f.dir.file("empty") + " --print-ids", f.dir);
    REQUIRE(neither.status != 0);
    REQUIRE(neither.err.find("neither a polevault checkpoint") != std::string::npos);
}

TEST_CASE("train eval: the loss of every window equals the model's forward over the same windows", "[generate]") {
    Fixture& f = fixture();
    // 400 tokens in windows of 16 + 1: 24 windows; the first 7, three per pass (the last pass partial).
    const Run r = run_train(
        "eval " + f.checkpoint + " --data " + f.dir.file("data.pvtokens") + " --dtype fp64 --batch 3 --max-windows 7",
        f.dir);
    INFO(r.out << r.err);
    REQUIRE(r.status == 0);
    std::smatch m;
    const std::regex line(R"(loss (\S+) perplexity (\S+) tokens (\d+) windows (\d+)\n$)");
    REQUIRE(std::regex_search(r.out, m, line));
    const double loss = std::stod(m[1]), perplexity = std::stod(m[2]);
    const auto [sum, counted] = loss_of_windows<double>(f.checkpoint, f.tokens, 16, 7);
    REQUIRE(std::stoll(m[3]) == counted);
    REQUIRE(counted == 7 * 16);
    REQUIRE(std::stoll(m[4]) == 7);
    REQUIRE(std::fabs(loss - sum / double(counted)) <= 1e-12 * loss);
    REQUIRE(std::fabs(perplexity - std::exp(loss)) <= 1e-12 * perplexity);
    // Every window by default; the checkpoint's window (16) and dtype (bf16) by default.
    const Run all = run_train("eval " + f.checkpoint + " --data " + f.dir.file("data.pvtokens"), f.dir);
    INFO(all.out << all.err);
    REQUIRE(all.status == 0);
    REQUIRE(std::regex_search(all.out, m, line));
    REQUIRE(std::stoll(m[4]) == 24);
    const auto [sum_all, counted_all] = loss_of_windows<double>(f.checkpoint, f.tokens, 16, 24);
    REQUIRE(std::stoll(m[3]) == counted_all);
    REQUIRE(std::fabs(std::stod(m[1]) - sum_all / double(counted_all)) <= 1e-2 * sum_all / double(counted_all));
    // Data shorter than one window: an error naming both numbers.
    pv::write_shard(f.dir.file("short.pvtokens"),
                    pv::TokenShard{97,
                                   0,
                                   {1, 2, 3, 4, 5, 6, 7, 8, 9, 10},
                                   std::vector<uint8_t>(10, pv::kTokenCounted | pv::kTokenSplittable)});
    const Run short_data = run_train("eval " + f.checkpoint + " --data " + f.dir.file("short.pvtokens"), f.dir);
    REQUIRE(short_data.status != 0);
    INFO(short_data.err);
    REQUIRE(short_data.err.find("10 tokens") != std::string::npos);
    REQUIRE(short_data.err.find("16 + 1 = 17") != std::string::npos);
}
