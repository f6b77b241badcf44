// Text / JSON lines -> tokenizer + token shards, and loading them back; see data/prepare.h.
#include "data/prepare.h"

#include "data/tokenizer.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string_view>
#include <thread>

namespace pv {
namespace {

namespace fs = std::filesystem;

const std::string kEot = "<|endoftext|>";

// The documents, stored as the text the stream decodes to (each followed by kEot) so training
// can use it directly without a second copy; docs[i] is a view of document i inside it.
struct Corpus {
    std::string joined;
    std::vector<std::pair<size_t, size_t>> docs;  // (offset, length) in joined
    std::string_view doc(size_t i) const { return std::string_view(joined).substr(docs[i].first, docs[i].second); }
    void add(std::string_view text) {
        if (text.empty()) return;
        docs.push_back({joined.size(), text.size()});
        joined += text;
        joined += kEot;
    }
};

bool is_json_lines(const std::string& path) {
    std::string ext = fs::path(path).extension().string();
    std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return char(std::tolower(c)); });
    return ext == ".jsonl" || ext == ".ndjson";
}

// The whole file's bytes; throws naming the file when it is missing, a directory or unreadable.
std::string read_file(const std::string& path) {
    auto fail = [&](const std::string& what) { return std::runtime_error("input '" + path + "': " + what); };
    std::error_code ec;
    if (fs::is_directory(path, ec)) throw fail("is a directory; pass the files in it");
    std::FILE* f = std::fopen(path.c_str(), "rb");
    if (!f) throw fail("cannot open: " + std::string(std::strerror(errno)) + " (check the path and its permissions)");
    std::string out;
    char buf[1 << 16];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
    const bool failed = std::ferror(f);
    const int err = errno;
    std::fclose(f);
    if (failed) throw fail("read failed: " + std::string(std::strerror(err)));
    return out;
}

// Appends the documents of one JSON-lines file.
void read_json_lines(const std::string& path, const std::string& field, Corpus& corpus) {
    const std::string text = read_file(path);
    const std::string_view all(text);
    size_t line_no = 0;
    for (size_t begin = 0; begin < all.size();) {
        size_t end = all.find('\n', begin);
        if (end == std::string_view::npos) end = all.size();
        const std::string_view line = all.substr(begin, end - begin);
        begin = end + 1;
        ++line_no;
        if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;  // blank
        const std::string where = "input '" + path + "' line " + std::to_string(line_no) + ": ";
        nlohmann::json j;
        try {
            j = nlohmann::json::parse(line.begin(), line.end());
        } catch (const nlohmann::json::parse_error& e) {
            throw std::runtime_error(where + "not JSON (" + e.what() +
                                     "); a .jsonl file holds one JSON object per line");
        }
        if (!j.is_object())
            throw std::runtime_error(where + "a JSON " + j.type_name() +
                                     ", not an object; a .jsonl file holds one JSON object per line");
        auto it = j.find(field);
        if (it == j.end())
            throw std::runtime_error(where + "the object has no field \"" + field +
                                     "\"; name the field that holds the document text (text_field)");
        if (!it->is_string())
            throw std::runtime_error(where + "field \"" + field + "\" holds a JSON " + it->type_name() +
                                     ", not a string; name the field that holds the document text (text_field)");
        corpus.add(it->get_ref<const std::string&>());
    }
}

void check_options(const PrepareOptions& o) {
    if (o.inputs.empty()) throw std::invalid_argument("prepare: no input files; name at least one text or .jsonl file");
    if (o.out_dir.empty()) throw std::invalid_argument("prepare: no output directory; name one (out_dir)");
    if (o.tokenizer.empty() && o.vocab < 257)
        throw std::invalid_argument("prepare: vocab " + std::to_string(o.vocab) +
                                    " is below 257 (the 256 byte tokens and \"<|endoftext|>\"); choose a larger vocab");
    if (!(o.val_fraction > 0.0 && o.val_fraction <= 0.5))
        throw std::invalid_argument("prepare: val_fraction " + std::to_string(o.val_fraction) +
                                    " is not in (0, 0.5]; hold out a positive fraction of at most half the tokens");
    if (o.shard_tokens < 1)
        throw std::invalid_argument("prepare: shard_tokens " + std::to_string(o.shard_tokens) +
                                    " is not positive; choose the largest number of tokens per training shard");
    if (o.text_field.empty())
        throw std::invalid_argument("prepare: text_field is empty; name the JSONL field holding the text");
}

// ceil(fraction · n), with a product within a relative 1e-9 of an integer taken as that integer,
// so decimal fractions give what they say (0.07 × 100 = 7, although binary 0.07 is a little more).
long long held_out(double fraction, long long n) {
    const double v = fraction * double(n);
    const double nearest = std::round(v);
    if (std::fabs(v - nearest) <= 1e-9 * std::max(1.0, v)) return (long long)nearest;
    return (long long)std::ceil(v);
}

// The stream doc0 EOT doc1 EOT ...: documents are encoded on several threads, each a contiguous
// run of them of about equal bytes, and the runs concatenated in order (deterministic).
std::vector<uint32_t> encode_stream(const Tokenizer& tok, const Corpus& corpus) {
    const uint32_t eot = uint32_t(tok.eot_id());
    const size_t docs = corpus.docs.size();
    const size_t bytes = corpus.joined.size();
    const size_t min_bytes_per_thread = size_t(1) << 16;  // below this a thread costs more than it saves
    const size_t threads = std::max<size_t>(1, std::min({size_t(std::max(1u, std::thread::hardware_concurrency())),
                                                         docs, bytes / min_bytes_per_thread + 1}));
    // Run t covers documents [cut[t], cut[t + 1]): cut where the byte count passes t / threads.
    std::vector<size_t> cut(threads + 1, docs);
    cut[0] = 0;
    for (size_t t = 1, d = 0; t < threads; ++t) {
        const size_t target = bytes * t / threads;
        while (d < docs && corpus.docs[d].first < target) ++d;
        cut[t] = std::max(d, cut[t - 1]);
    }
    std::vector<std::vector<uint32_t>> parts(threads);
    auto work = [&](size_t t) {
        for (size_t d = cut[t]; d < cut[t + 1]; ++d) {
            for (int id : tok.encode(corpus.doc(d), /*allow_special=*/false)) parts[t].push_back(uint32_t(id));
            parts[t].push_back(eot);
        }
    };
    std::vector<std::thread> pool;
    for (size_t t = 1; t < threads; ++t) pool.emplace_back(work, t);
    work(0);
    for (auto& th : pool) th.join();
    size_t total = 0;
    for (const auto& p : parts) total += p.size();
    std::vector<uint32_t> stream;
    stream.reserve(total);
    for (auto& p : parts) {
        stream.insert(stream.end(), p.begin(), p.end());
        std::vector<uint32_t>().swap(p);
    }
    return stream;
}

bool is_train_shard_name(const std::string& name) {
    const std::string prefix = "train_", suffix = ".pvtokens";
    return name.size() > prefix.size() + suffix.size() && name.compare(0, prefix.size(), prefix) == 0 &&
           name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string train_shard_name(size_t i) {
    char name[32];
    std::snprintf(name, sizeof name, "train_%06zu.pvtokens", i);
    return name;
}

}  // namespace

PreparedData prepare_data(const PrepareOptions& o) {
    check_options(o);

    Corpus corpus;
    for (const auto& path : o.inputs) {
        if (is_json_lines(path)) {
            read_json_lines(path, o.text_field, corpus);
        } else {
            corpus.add(read_file(path));
        }
    }
    if (corpus.docs.empty())
        throw std::runtime_error("prepare: the inputs hold no documents (every file is empty or has only blank lines" +
                                 std::string(" or empty texts); check the input files"));

    const Tokenizer tok =
        o.tokenizer.empty() ? Tokenizer::train(corpus.joined, o.vocab, {kEot}) : Tokenizer::load(o.tokenizer);
    if (tok.eot_id() < 0)
        throw std::runtime_error("tokenizer '" + o.tokenizer +
                                 "': has no \"<|endoftext|>\" token to separate documents; "
                                 "add it to the file's added_tokens, or pass no tokenizer to train one");

    std::vector<uint32_t> stream = encode_stream(tok, corpus);
    const long long n = (long long)stream.size();
    const long long val = held_out(o.val_fraction, n);
    const long long train = n - val;
    if (val < 2 || train < 2)
        throw std::runtime_error(
            "prepare: the inputs give only " + std::to_string(n) + " tokens (" + std::to_string(corpus.docs.size()) +
            " documents), so val_fraction " + std::to_string(o.val_fraction) + " leaves " + std::to_string(train) +
            " training and " + std::to_string(val) + " validation tokens; both need at least 2: add data or " +
            (val < 2 ? "raise" : "lower") + " val_fraction");
    const long long shards = (train + o.shard_tokens - 1) / o.shard_tokens;
    if (shards > 1'000'000)
        throw std::invalid_argument("prepare: shard_tokens " + std::to_string(o.shard_tokens) + " would make " +
                                    std::to_string(shards) +
                                    " training shards (at most 1000000, the names have 6 digits); "
                                    "raise shard_tokens");
    const long long documents = (long long)corpus.docs.size();
    corpus = Corpus{};  // the text is no longer needed

    std::error_code ec;
    fs::create_directories(o.out_dir, ec);
    if (ec || !fs::is_directory(o.out_dir))
        throw std::runtime_error("output directory '" + o.out_dir + "': cannot create it" +
                                 (ec ? ": " + ec.message() : std::string(" (a file of that name exists)")));
    const fs::path dir(o.out_dir);

    PreparedData out;
    out.documents = documents;
    out.train_tokens = train;
    out.val_tokens = val;
    out.vocab_size = tok.vocab_size();

    TokenShard shard;
    shard.vocab_size = uint32_t(tok.vocab_size());
    shard.eot_token = uint32_t(tok.eot_id());
    for (long long s = 0; s < shards; ++s) {
        const long long begin = s * o.shard_tokens, end = std::min(train, begin + o.shard_tokens);
        shard.tokens.assign(stream.begin() + begin, stream.begin() + end);
        out.train_shards.push_back((dir / train_shard_name(size_t(s))).string());
        write_shard(out.train_shards.back(), shard);
    }
    shard.tokens.assign(stream.begin() + train, stream.end());
    out.val_shard = (dir / "val.pvtokens").string();
    write_shard(out.val_shard, shard);
    out.tokenizer_path = (dir / "tokenizer.json").string();
    tok.save(out.tokenizer_path);

    // Remove an earlier run's training shards beyond this run's count, so load_dataset, which
    // takes every train_*.pvtokens, sees only this run's.
    std::vector<std::string> keep;
    for (long long s = 0; s < shards; ++s) keep.push_back(train_shard_name(size_t(s)));
    for (const auto& entry : fs::directory_iterator(dir)) {
        const std::string name = entry.path().filename().string();
        if (!is_train_shard_name(name) || std::find(keep.begin(), keep.end(), name) != keep.end()) continue;
        fs::remove(entry.path(), ec);
        if (ec)
            throw std::runtime_error("output directory '" + o.out_dir + "': cannot remove the stale shard '" +
                                     entry.path().string() + "' of an earlier run: " + ec.message() +
                                     "; remove it by hand, or `train --data` will load it");
    }
    return out;
}

DataSet load_dataset(const std::string& path) {
    std::error_code ec;
    const fs::file_status st = fs::status(path, ec);
    if (!fs::exists(st))
        throw std::runtime_error("data '" + path +
                                 "': does not exist; pass a directory made by `train prepare` or a "
                                 ".pvtokens token shard");
    DataSet ds;
    if (!fs::is_directory(st)) {
        ds.train.push_back(read_shard(path));
        return ds;
    }
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(path)) {
        const std::string name = entry.path().filename().string();
        if (is_train_shard_name(name)) names.push_back(name);
    }
    if (names.empty())
        throw std::runtime_error("data '" + path +
                                 "': the directory holds no train_*.pvtokens shards; make them with "
                                 "`train prepare` into this directory, or pass a .pvtokens file");
    std::sort(names.begin(), names.end());
    const fs::path dir(path);
    const std::string first = (dir / names.front()).string();
    auto check_vocab = [&](const TokenShard& s, const std::string& file) {
        const uint32_t v0 = ds.train.front().vocab_size;
        if (s.vocab_size != v0)
            throw std::runtime_error("data '" + path + "': shard '" + file + "' has vocab_size " +
                                     std::to_string(s.vocab_size) + " but '" + first + "' has " + std::to_string(v0) +
                                     ": the shards come from different runs or tokenizers; re-run `train prepare` "
                                     "into an empty directory");
    };
    for (const auto& name : names) {
        const std::string file = (dir / name).string();
        ds.train.push_back(read_shard(file));
        check_vocab(ds.train.back(), file);
    }
    const fs::path val = dir / "val.pvtokens";
    if (fs::exists(val, ec)) {
        ds.val = read_shard(val.string());
        check_vocab(*ds.val, val.string());
    }
    const fs::path tokenizer = dir / "tokenizer.json";
    if (fs::exists(tokenizer, ec)) ds.tokenizer_path = tokenizer.string();
    return ds;
}

}  // namespace pv
