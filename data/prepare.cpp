// Text / JSON lines -> tokenizer + token shards, and loading them back; see data/prepare.h.
#include "data/prepare.h"

#include "data/examples.h"
#include "data/tokenizer.h"
#include "io/checksum.h"
#include "io/durable_file.h"
#include "io/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <fstream>
#include <iterator>
#include <filesystem>
#include <stdexcept>
#include <thread>

namespace pv {
namespace {

namespace fs = std::filesystem;

const std::string kEot = "<|endoftext|>";

// 0.05, 1e-07: a fraction as the user would write it (std::to_string gives 0.000000).
std::string fraction_text(double v) {
    char text[32];
    std::snprintf(text, sizeof text, "%g", v);
    return text;
}

void check_options(const PrepareOptions& o) {
    if (o.inputs.empty()) throw std::invalid_argument("prepare: no input files; name at least one text or .jsonl file");
    if (o.out_dir.empty()) throw std::invalid_argument("prepare: no output directory; name one with --out DIR");
    if (o.tokenizer.empty() && o.vocab < 257)
        throw std::invalid_argument("prepare: --vocab " + std::to_string(o.vocab) +
                                    " is below 257 (the 256 byte tokens and \"<|endoftext|>\"); choose a larger --vocab");
    if (!(o.val_fraction > 0.0 && o.val_fraction <= 0.5))
        throw std::invalid_argument("prepare: --val-fraction " + fraction_text(o.val_fraction) +
                                    " is not in (0, 0.5]; hold out a positive fraction of at most half the tokens");
    if (o.shard_tokens < 1)
        throw std::invalid_argument("prepare: --shard-tokens " + std::to_string(o.shard_tokens) +
                                    " is not positive; choose the largest number of tokens per training shard");
    if (o.text_field.empty())
        throw std::invalid_argument("prepare: --field is empty; name the JSONL field holding the text");
    if (o.truncate < 0 || o.truncate == 1)
        throw std::invalid_argument("prepare: --truncate " + std::to_string(o.truncate) +
                                    " is neither 0 (off) nor at least 2 (an input and its target); give the --seq-len "
                                    "you will train with, plus 1");
}

// ceil(fraction · n), with a product within a relative 1e-9 of an integer taken as that integer,
// so decimal fractions give what they say (0.07 × 100 = 7, although binary 0.07 is a little more).
long long held_out(double fraction, long long n) {
    const double v = fraction * double(n);
    const double nearest = std::round(v);
    if (std::fabs(v - nearest) <= 1e-9 * std::max(1.0, v)) return (long long)nearest;
    return (long long)std::ceil(v);
}

// The examples' tokens and flags, concatenated in order: examples are encoded on several threads,
// each a contiguous run of them of about equal bytes, and the runs joined in order
// (deterministic). The first error, in input order, is rethrown. With truncate > 0, an example
// that must stay whole (a chat, a prompt and completion) longer than truncate tokens keeps its
// first truncate tokens (counted in `truncated`), or goes (counted in `dropped`) when none of
// those counts.
void encode_stream(const Tokenizer& tok, const std::vector<Example>& examples, const ExampleEncoding& how,
                   long long truncate, std::vector<uint32_t>& tokens, std::vector<uint8_t>& flags,
                   long long& truncated, long long& dropped) {
    const size_t n = examples.size();
    std::vector<size_t> end_bytes(n);  // cumulative input bytes after example i
    size_t bytes = 0;
    for (size_t i = 0; i < n; ++i) {
        const Example& e = examples[i];
        bytes += e.text.size() + e.prompt.size() + e.completion.size();
        for (const ChatMessage& m : e.messages) bytes += m.content.size();
        end_bytes[i] = bytes;
    }
    const size_t min_bytes_per_thread = size_t(1) << 16;  // below this a thread costs more than it saves
    const size_t threads = std::max<size_t>(
        1, std::min({size_t(std::max(1u, std::thread::hardware_concurrency())), n, bytes / min_bytes_per_thread + 1}));
    // Run t covers examples [cut[t], cut[t + 1]): cut where the byte count passes t / threads.
    std::vector<size_t> cut(threads + 1, n);
    cut[0] = 0;
    for (size_t t = 1, d = 0; t < threads; ++t) {
        const size_t target = bytes * t / threads;
        while (d < n && end_bytes[d] <= target) ++d;
        cut[t] = std::max(d, cut[t - 1]);
    }
    std::vector<std::vector<uint32_t>> part_tokens(threads);
    std::vector<std::vector<uint8_t>> part_flags(threads);
    std::vector<std::exception_ptr> errors(threads);
    std::vector<long long> part_truncated(threads), part_dropped(threads);
    Progress progress("encoding " + std::to_string(n) + " documents", double(bytes));  // io/progress.h
    auto work = [&](size_t t) {
        try {
            for (size_t d = cut[t]; d < cut[t + 1]; ++d) {
                const size_t first = part_tokens[t].size();
                encode_example(tok, examples[d], how, part_tokens[t], part_flags[t]);
                progress.advance(double(end_bytes[d] - (d > 0 ? end_bytes[d - 1] : 0)));
                const size_t n = part_tokens[t].size() - first;
                if (truncate <= 0 || n <= size_t(truncate) || (part_flags[t][first] & kTokenSplittable)) continue;
                const size_t keep = first + size_t(truncate);
                const bool counts = std::any_of(part_flags[t].begin() + long(first), part_flags[t].begin() + long(keep),
                                                [](uint8_t f) { return (f & kTokenCounted) != 0; });
                part_tokens[t].resize(counts ? keep : first);
                part_flags[t].resize(counts ? keep : first);
                ++(counts ? part_truncated[t] : part_dropped[t]);
            }
        } catch (...) {
            errors[t] = std::current_exception();
        }
    };
    std::vector<std::thread> pool;
    for (size_t t = 1; t < threads; ++t) pool.emplace_back(work, t);
    work(0);
    for (auto& th : pool) th.join();
    for (const auto& e : errors)
        if (e) std::rethrow_exception(e);
    for (size_t t = 0; t < threads; ++t) truncated += part_truncated[t], dropped += part_dropped[t];
    size_t total = 0;
    for (const auto& p : part_tokens) total += p.size();
    tokens.reserve(total);
    flags.reserve(total);
    for (size_t t = 0; t < threads; ++t) {
        tokens.insert(tokens.end(), part_tokens[t].begin(), part_tokens[t].end());
        flags.insert(flags.end(), part_flags[t].begin(), part_flags[t].end());
        std::vector<uint32_t>().swap(part_tokens[t]);
        std::vector<uint8_t>().swap(part_flags[t]);
    }
}

// The chat format for the examples' chats (none without chats), each chat checked against it.
std::optional<ChatFormat> chat_format_of(const PrepareOptions& o, const std::vector<Example>& examples) {
    const bool chats =
        std::any_of(examples.begin(), examples.end(), [](const Example& e) { return e.kind == ExampleKind::chat; });
    if (!chats) return std::nullopt;
    const std::string config = o.tokenizer.empty() ? "" : tokenizer_config_beside(o.tokenizer);
    const ChatFormat f = resolve_chat_format(o.chat_format, config, o.chat_template);
    for (const Example& e : examples) check_example(e, ExampleEncoding{f, o.train_on_prompt});
    return f;
}

// A tokenizer trained on the examples: each one's text followed by "<|endoftext|>", with the
// chat format's special tokens.
Tokenizer train_tokenizer(const PrepareOptions& o, const std::vector<Example>& examples,
                          const std::optional<ChatFormat>& format) {
    std::string joined;
    for (const Example& e : examples) joined += example_training_text(e, format) + kEot;
    std::vector<std::string> specials = {kEot};
    if (format)
        for (const std::string& s : chat_special_tokens(*format))
            if (s != kEot) specials.push_back(s);
    if (o.vocab < 256 + int(specials.size()))
        throw std::invalid_argument("prepare: vocab " + std::to_string(o.vocab) + " is below " +
                                    std::to_string(256 + specials.size()) + " (the 256 byte tokens and " +
                                    std::to_string(specials.size()) + " special tokens); choose a larger vocab");
    return Tokenizer::train(joined, o.vocab, specials);
}

// The tokenizer as `train --data` will load it from the output: what the file says, not what the
// freshly trained object assumed. They can differ in the end-of-sequence token: a trained one ends
// documents with "<|endoftext|>", but load() without a tokenizer_config.json prefers "</s>" when
// the chat format's special tokens include it (llama2), so the shards' eot_token would not match
// the tokenizer `train` reads back, and `train --data` would refuse the directory.
Tokenizer as_saved(const Tokenizer& trained) {
    std::error_code ec;
    const fs::path dir = fs::temp_directory_path(ec) / ("polevault-prepare-" + std::to_string(::getpid()));
    fs::create_directories(dir, ec);
    const std::string path = (dir / "tokenizer.json").string();
    trained.save(path);
    Tokenizer loaded = Tokenizer::load(path);
    fs::remove_all(dir, ec);
    return loaded;
}

// Where the training set ends: N − ceil(fraction · N), moved back to the start of a document
// that must not be split when it falls inside one.
long long train_end(const std::vector<uint8_t>& flags, long long val) {
    long long cut = (long long)flags.size() - val;
    if (cut <= 0 || cut >= (long long)flags.size() || (flags[size_t(cut)] & kTokenStartsDocument) ||
        (flags[size_t(cut)] & kTokenSplittable))
        return cut;
    while (cut > 0 && !(flags[size_t(cut)] & kTokenStartsDocument)) --cut;
    return cut;
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

    std::vector<Example> examples;
    for (const auto& path : o.inputs)
        for (Example& e : read_examples(path, o.text_field)) examples.push_back(std::move(e));
    if (examples.empty())
        throw std::runtime_error("prepare: the inputs hold no documents (every file is empty or has only blank lines" +
                                 std::string(" or empty texts); check the input files"));
    std::optional<ChatFormat> format = chat_format_of(o, examples);

    const Tokenizer tok =
        o.tokenizer.empty() ? as_saved(train_tokenizer(o, examples, format)) : Tokenizer::load(o.tokenizer);
    const bool needs_eos =
        std::any_of(examples.begin(), examples.end(), [](const Example& e) { return e.kind != ExampleKind::chat; });
    if (tok.eos_id() < 0 && needs_eos)
        throw std::runtime_error("tokenizer '" + o.tokenizer +
                                 "': has no end-of-sequence token to end documents with; use the model's own "
                                 "tokenizer.json (with its tokenizer_config.json), or pass no tokenizer to train one");
    if (format) {
        add_tokenizer_specials(*format, tok);
        check_chat_tokens(tok, *format);
    }

    PreparedData out;
    out.documents = (long long)examples.size();
    for (const Example& e : examples) {
        out.text_documents += e.kind == ExampleKind::text;
        out.prompt_completion_documents += e.kind == ExampleKind::prompt_completion;
        out.chat_documents += e.kind == ExampleKind::chat;
    }
    if (format) out.chat_format = chat_format_name(*format);

    std::vector<uint32_t> stream;
    std::vector<uint8_t> flags;
    encode_stream(tok, examples, ExampleEncoding{format, o.train_on_prompt}, o.truncate, stream, flags,
                  out.truncated_documents, out.dropped_documents);
    examples = {};  // the text is no longer needed
    const long long n = (long long)stream.size();
    const long long train = train_end(flags, held_out(o.val_fraction, n));
    const long long val = n - train;
    if (val < 2 || train < 2)
        throw std::runtime_error(
            "prepare: the inputs give only " + std::to_string(n) + " tokens (" + std::to_string(out.documents) +
            " documents), so --val-fraction " + fraction_text(o.val_fraction) + " leaves " + std::to_string(train) +
            " training and " + std::to_string(val) + " validation tokens" +
            (train != n - held_out(o.val_fraction, n) ? " (the cut moved back to the start of a chat or prompt)" : "") +
            "; both need at least 2: add data or " + (val < 2 ? "raise" : "lower") + " --val-fraction");
    const long long shards = (train + o.shard_tokens - 1) / o.shard_tokens;
    if (shards > 1'000'000)
        throw std::invalid_argument("prepare: --shard-tokens " + std::to_string(o.shard_tokens) + " would make " +
                                    std::to_string(shards) +
                                    " training shards (at most 1000000, the names have 6 digits); "
                                    "raise --shard-tokens");
    for (uint8_t f : flags) out.counted_tokens += (f & kTokenCounted) != 0;

    std::error_code ec;
    fs::create_directories(o.out_dir, ec);
    if (ec || !fs::is_directory(o.out_dir))
        throw std::runtime_error("output directory '" + o.out_dir + "': cannot create it" +
                                 (ec ? ": " + ec.message() : std::string(" (a file of that name exists)")));
    const fs::path dir(o.out_dir);

    out.train_tokens = train;
    out.val_tokens = val;
    out.vocab_size = tok.vocab_size();

    Progress writing("writing shards to " + o.out_dir, double(shards + 1), Progress::Unit::items);
    TokenShard shard;
    shard.vocab_size = uint32_t(tok.vocab_size());
    shard.eot_token = uint32_t(std::max(0, tok.eos_id()));
    shard.tokenizer = tok.id_fingerprint();
    const auto write = [&](long long begin, long long end, const std::string& path) {
        shard.tokens.assign(stream.begin() + begin, stream.begin() + end);
        shard.flags.assign(flags.begin() + begin, flags.begin() + end);
        write_shard(path, shard);
        writing.advance(1);
    };
    for (long long s = 0; s < shards; ++s) {
        out.train_shards.push_back((dir / train_shard_name(size_t(s))).string());
        write(s * o.shard_tokens, std::min(train, (s + 1) * o.shard_tokens), out.train_shards.back());
    }
    out.val_shard = (dir / "val.pvtokens").string();
    write(train, n, out.val_shard);
    out.tokenizer_path = (dir / "tokenizer.json").string();
    const std::string config_out = (dir / "tokenizer_config.json").string();
    const std::string config_in = o.tokenizer.empty() ? "" : tokenizer_config_beside(o.tokenizer);
    if (o.tokenizer.empty()) {
        tok.save(out.tokenizer_path);
    } else if (!fs::exists(out.tokenizer_path, ec) || !fs::equivalent(o.tokenizer, out.tokenizer_path, ec)) {
        copy_file_atomically(o.tokenizer, out.tokenizer_path, "tokenizer");
    }
    if (!config_in.empty() && fs::is_regular_file(config_in, ec)) {
        if (!fs::exists(config_out, ec) || !fs::equivalent(config_in, config_out, ec))
            copy_file_atomically(config_in, config_out, "tokenizer config");
    } else if (fs::exists(config_out, ec)) {
        fs::remove(config_out, ec);  // an earlier run's, for another tokenizer
        if (ec)
            throw std::runtime_error("output directory '" + o.out_dir + "': cannot remove the stale '" + config_out +
                                     "' of an earlier run: " + ec.message() + "; remove it by hand");
    }

    // The template transformers 5 saves beside the config travels with it (or an earlier run's goes).
    const std::string template_in = config_in.empty() ? "" : chat_template_file_beside(config_in);
    const std::string template_out = chat_template_file_beside(config_out);
    if (!template_in.empty() && fs::is_regular_file(template_in, ec)) {
        if (!fs::exists(template_out, ec) || !fs::equivalent(template_in, template_out, ec))
            copy_file_atomically(template_in, template_out, "chat template");
    } else if (fs::exists(template_out, ec)) {
        fs::remove(template_out, ec);
        if (ec)
            throw std::runtime_error("output directory '" + o.out_dir + "': cannot remove the stale '" + template_out +
                                     "' of an earlier run: " + ec.message() + "; remove it by hand");
    }

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
        ds.train_paths.push_back(path);
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
    // Every shard must come from the first one's tokenizer: the same vocabulary size, and the same
    // fingerprint where both record one.
    auto check_vocab = [&](const TokenShard& s, const std::string& file) {
        const TokenShard& s0 = ds.train.front();
        std::string differs;
        if (s.vocab_size != s0.vocab_size)
            differs = "has vocab_size " + std::to_string(s.vocab_size) + " but '" + first + "' has " +
                      std::to_string(s0.vocab_size);
        else if (s.tokenizer != 0 && s0.tokenizer != 0 && s.tokenizer != s0.tokenizer)
            differs = "was made with tokenizer " + checksum_hex(s.tokenizer) + " but '" + first + "' with " +
                      checksum_hex(s0.tokenizer);
        if (!differs.empty())
            throw std::runtime_error("data '" + path + "': shard '" + file + "' " + differs +
                                     ": the shards come from different runs or tokenizers; re-run `train prepare` "
                                     "into an empty directory");
    };
    for (const auto& name : names) {
        const std::string file = (dir / name).string();
        ds.train.push_back(read_shard(file));
        ds.train_paths.push_back(file);
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
