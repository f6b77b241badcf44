// Text / JSON lines -> tokenizer + token shards, and loading them back; see data/prepare.h.
#include "data/prepare.h"

#include "data/examples.h"
#include "data/tokenizer.h"
#include "io/checksum.h"
#include "io/durable_file.h"
#include "io/input_file.h"
#include "io/progress.h"
#include "optim/thread_pool.h"

#include <fcntl.h>
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

bool is_train_shard_name(const std::string& name) {
    const std::string prefix = "train_", suffix = ".pvtokens";
    return name.size() > prefix.size() + suffix.size() && name.compare(0, prefix.size(), prefix) == 0 &&
           name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string train_shard_name(size_t i) {
    char name[48];
    std::snprintf(name, sizeof name, "train_%06zu.pvtokens", i);
    return name;
}

// The token stream on disk while prepare runs: every token and flags byte in stream order, in two
// files in the output directory, so neither the stream nor a shard is ever held in memory. Read
// back by position; what the shards have taken is released (punched out) as they are written, so
// the disk holds about one copy of the stream at a time. Removed when prepare ends, however.
class Spill {
  public:
    explicit Spill(const fs::path& dir)
        : tokens_path_((dir / ".prepare-tokens.tmp").string()), flags_path_((dir / ".prepare-flags.tmp").string()) {
        tokens_fd_ = open_rw(tokens_path_);
        flags_fd_ = open_rw(flags_path_);
    }
    ~Spill() {
        ::close(tokens_fd_), ::close(flags_fd_);
        std::error_code ec;
        fs::remove(tokens_path_, ec), fs::remove(flags_path_, ec);
    }
    Spill(const Spill&) = delete;
    Spill& operator=(const Spill&) = delete;

    long long size() const { return count_; }
    void append(const std::vector<uint32_t>& tokens, const std::vector<uint8_t>& flags) {
        write_all(tokens_fd_, tokens_path_, tokens.data(), tokens.size() * sizeof(uint32_t),
                  uint64_t(count_) * sizeof(uint32_t));
        write_all(flags_fd_, flags_path_, flags.data(), flags.size(), uint64_t(count_));
        count_ += (long long)tokens.size();
    }
    void read(uint64_t begin, size_t n, uint32_t* tokens, uint8_t* flags) const {
        if (tokens) read_all(tokens_fd_, tokens_path_, tokens, n * sizeof(uint32_t), begin * sizeof(uint32_t));
        if (flags) read_all(flags_fd_, flags_path_, flags, n, begin);
    }
    uint8_t flags_at(long long i) const {
        uint8_t f = 0;
        read(uint64_t(i), 1, nullptr, &f);
        return f;
    }
    // Frees the disk blocks of tokens [0, end): no longer needed. Best effort: a file system
    // without hole punching keeps them until the files are removed.
    void release(long long end) const {
        (void)::fallocate(tokens_fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, off_t(end) * 4);
        (void)::fallocate(flags_fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, off_t(end));
    }

  private:
    static int open_rw(const std::string& path) {
        const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (fd < 0)
            throw std::runtime_error("output directory: cannot create the working file '" + path +
                                     "': " + std::strerror(errno) + "; check the directory's permissions");
        return fd;
    }
    static void write_all(int fd, const std::string& path, const void* data, size_t n, uint64_t at) {
        for (size_t done = 0; done < n;) {
            const ssize_t w = ::pwrite(fd, static_cast<const char*>(data) + done, n - done, off_t(at + done));
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0)
                throw std::runtime_error("output directory: cannot write the working file '" + path + "': " +
                                         std::strerror(w < 0 ? errno : ENOSPC) +
                                         "; prepare needs free space for about twice the output");
            done += size_t(w);
        }
    }
    static void read_all(int fd, const std::string& path, void* data, size_t n, uint64_t at) {
        for (size_t done = 0; done < n;) {
            const ssize_t r = ::pread(fd, static_cast<char*>(data) + done, n - done, off_t(at + done));
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0)
                throw std::runtime_error("output directory: cannot read back the working file '" + path +
                                         "': " + (r < 0 ? std::strerror(errno) : "it is shorter than written") +
                                         "; did something else change the output directory? Re-run prepare");
            done += size_t(r);
        }
    }
    std::string tokens_path_, flags_path_;
    int tokens_fd_ = -1, flags_fd_ = -1;
    long long count_ = 0;
};

// Where the training set ends: N − ceil(fraction · N), moved back to the start of a document
// that must not be split when it falls inside one.
long long train_end(const Spill& spill, long long val) {
    const long long n = spill.size();
    long long cut = n - val;
    if (cut <= 0 || cut >= n) return cut;
    const uint8_t at = spill.flags_at(cut);
    if ((at & kTokenStartsDocument) || (at & kTokenSplittable)) return cut;
    std::vector<uint8_t> block(size_t(1) << 16);
    while (cut > 0) {  // back to the document's start, a block at a time
        const long long begin = std::max(0LL, cut - (long long)block.size());
        spill.read(uint64_t(begin), size_t(cut - begin), nullptr, block.data());
        for (long long i = cut; i > begin; --i)
            if (block[size_t(i - begin)] & kTokenStartsDocument) return i;
        if (block[0] & kTokenStartsDocument) return begin;
        cut = begin;
    }
    return 0;
}

// One piece of encoding work: whole examples, or a piece of one plain-text document (its first
// piece starts the document, only its last ends with EOS).
struct WorkItem {
    std::vector<Example> examples;
    bool first_piece = true, last_piece = true;
    size_t bytes = 0;  // the input text it holds
};

struct Encoded {
    std::vector<uint32_t> tokens;
    std::vector<uint8_t> flags;
    long long truncated = 0, dropped = 0;
};

// The item's tokens and flags, as encode_example gives them. With truncate > 0, an example that
// must stay whole (a chat, a prompt and completion) longer than truncate tokens keeps its first
// truncate tokens (counted in `truncated`), or goes (counted in `dropped`) when none of those
// counts. A piece of a document drops the EOS its document does not end with yet, and does not
// start a document unless it is the first.
Encoded encode_item(const Tokenizer& tok, const WorkItem& item, const ExampleEncoding& how, long long truncate) {
    Encoded r;
    for (const Example& e : item.examples) {
        const size_t first = r.tokens.size();
        encode_example(tok, e, how, r.tokens, r.flags);
        const size_t n = r.tokens.size() - first;
        if (n == 0) continue;
        if (!item.last_piece) r.tokens.pop_back(), r.flags.pop_back();
        if (!item.first_piece) r.flags[first] &= uint8_t(~kTokenStartsDocument);
        if (truncate <= 0 || n <= size_t(truncate) || (r.flags[first] & kTokenSplittable)) continue;
        const size_t keep = first + size_t(truncate);
        const bool counts = std::any_of(r.flags.begin() + long(first), r.flags.begin() + long(keep),
                                        [](uint8_t f) { return (f & kTokenCounted) != 0; });
        r.tokens.resize(counts ? keep : first);
        r.flags.resize(counts ? keep : first);
        ++(counts ? r.truncated : r.dropped);
    }
    return r;
}

// The start of the UTF-8 character at or before i.
size_t char_start(std::string_view s, size_t i) {
    while (i > 0 && i < s.size() && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
    return i;
}

// A place to cut a plain text: the first piece is text[0, end), the next starts at `next` (end, or
// end + 1 when the space between them is dropped).
struct Cut {
    size_t end = 0, next = 0;
};

// The kinds of candidate cut at a position p (data/prepare.h, "Where plain text is cut").
enum class CutKind { line_start, space_kept, space_dropped };
constexpr CutKind kCutKinds[] = {CutKind::line_start, CutKind::space_kept, CutKind::space_dropped};

bool is_visible(char c) { return static_cast<unsigned char>(c) > ' ' && c != '\x7f'; }

// The cut of this kind at p, if p is such a candidate: a line start before printable ASCII, or
// just after a single space between two non-whitespace characters.
std::optional<Cut> candidate(std::string_view text, size_t p, CutKind kind) {
    if (p == 0 || p >= text.size()) return std::nullopt;
    if (kind == CutKind::line_start) {
        if (text[p - 1] != '\n' || text[p] <= ' ' || text[p] > '~') return std::nullopt;
        return Cut{p, p};
    }
    if (p < 2 || text[p - 1] != ' ' || !is_visible(text[p - 2]) || !is_visible(text[p])) return std::nullopt;
    return kind == CutKind::space_kept ? Cut{p - 1, p - 1} : Cut{p - 1, p};
}

// Whether cutting text at `cut` leaves its encoding unchanged, checked on the lines around it (at
// most kCutWindow bytes either side): encoded whole they give the same tokens as their two parts
// encoded apart and joined.
constexpr size_t kCutWindow = 1024;
bool cut_keeps_tokens(const Tokenizer& tok, std::string_view text, Cut cut) {
    size_t begin = cut.end > kCutWindow ? char_start(text, cut.end - kCutWindow) : 0;
    if (cut.end >= 2)  // (the character before the cut, a line start's '\n', is left out of the search)
        if (const size_t nl = text.rfind('\n', cut.end - 2); nl != std::string_view::npos && nl + 1 > begin)
            begin = nl + 1;
    size_t end = std::min(text.size(), cut.next + kCutWindow);
    if (const size_t nl = text.find('\n', cut.next); nl != std::string_view::npos && nl < end) end = nl + 1;
    end = std::max(char_start(text, end), cut.next + 1);
    std::vector<int> parts = tok.encode(text.substr(begin, cut.end - begin), false);
    const std::vector<int> right = tok.encode(text.substr(cut.next, end - cut.next), false);
    parts.insert(parts.end(), right.begin(), right.end());
    return tok.encode(text.substr(begin, end - begin), false) == parts;
}

// "64 MiB", "300.5 MiB", or "4096 bytes" below a MiB (tests set small limits).
std::string size_text(size_t bytes) {
    const size_t mib = size_t(1) << 20;
    if (bytes < mib) return std::to_string(bytes) + " bytes";
    if (bytes % mib == 0) return std::to_string(bytes / mib) + " MiB";
    char text[32];
    std::snprintf(text, sizeof text, "%.1f MiB", double(bytes) / double(mib));
    return text;
}

// The inputs as work items of about chunk_bytes of text each, in order, read a block at a time:
// JSON lines as batches of whole examples, plain text as pieces cut where cut_keeps_tokens says.
// Nothing holds more than the item being filled (at most max_uncut bytes: a longer JSON line, or
// a text with no safe cut in that many bytes, is an error) and one block.
class InputStream {
  public:
    InputStream(const PrepareOptions& o, const Tokenizer& tok, size_t chunk_bytes)
        : o_(o),
          tok_(tok),
          chunk_(chunk_bytes),
          max_uncut_(o.max_uncut_bytes > 0 ? o.max_uncut_bytes : std::max<size_t>(16 * chunk_bytes, kPrepareRoundBytes)) {}

    // The next item; false at the end of the inputs.
    bool next(WorkItem& item) {
        item = WorkItem{};
        while (file_ < o_.inputs.size()) {
            if (!in_) open_next();
            if (is_json_lines(path_) ? fill_lines(item) : fill_text(item)) return true;
        }
        return false;
    }
    // The most input text held at once (the text read but not yet handed out, the item being
    // carved from it included) since the last call.
    size_t take_peak() {
        const size_t peak = peak_;
        peak_ = pending_.size();
        return peak;
    }

  private:
    void open_next() {
        path_ = o_.inputs[file_];
        std::error_code ec;
        if (fs::is_directory(path_, ec))
            throw std::runtime_error("input '" + path_ + "': is a directory; pass the files in it");
        in_.emplace(open_input_file(path_, "input", "check the path and its permissions"));
        pending_.clear(), line_ = 0, pieces_ = 0, eof_ = false;
    }
    // Appends the next block of the file to pending_; false at its end.
    bool read_block() {
        const size_t block = std::min<size_t>(chunk_, 1 << 16), at = pending_.size();
        pending_.resize(at + block);
        ssize_t r;
        do r = ::read(in_->fd(), pending_.data() + at, block);
        while (r < 0 && errno == EINTR);
        if (r < 0) throw std::runtime_error("input '" + path_ + "': read failed: " + std::strerror(errno));
        pending_.resize(at + size_t(r));
        peak_ = std::max(peak_, pending_.size());
        return r > 0;
    }
    void close_file() { in_.reset(), pending_.clear(), pending_.shrink_to_fit(), ++file_; }

    // The last cut in pending_ that keeps the tokens, looking back over at most 64 candidates
    // (cheap when none is accepted). The kind of the last accepted cut is tried first: a
    // SentencePiece tokenizer never takes a line start or a kept space, a byte-level one never
    // a dropped space.
    std::optional<Cut> last_safe_cut() {
        size_t tries = 0;
        for (size_t p = pending_.size() - 1; p > 0 && tries < 64; --p) {
            if (pending_[p - 1] != '\n' && pending_[p - 1] != ' ') continue;
            for (int k = 0; k < 4 && tries < 64; ++k) {
                const CutKind kind = k == 0 ? preferred_ : kCutKinds[k - 1];
                if (k > 0 && kind == preferred_) continue;
                const std::optional<Cut> cut = candidate(pending_, p, kind);
                if (!cut) continue;
                ++tries;
                if (cut_keeps_tokens(tok_, pending_, *cut)) {
                    preferred_ = kind;
                    return cut;
                }
            }
        }
        return std::nullopt;
    }

    // Plain text: a piece of at least chunk_ bytes ending at a safe cut, or the rest of the file.
    bool fill_text(WorkItem& item) {
        for (;;) {
            const bool more = read_block();
            std::optional<Cut> cut;
            if (more && pending_.size() >= chunk_) {
                cut = last_safe_cut();
                if (!cut && pending_.size() >= max_uncut_)
                    throw std::runtime_error(
                        "input '" + path_ + "': no place to cut the text in the " + size_text(max_uncut_) +
                        " after byte " + std::to_string(done_bytes_) +
                        " where the tokenizer's encoding stays the same (a line start, or a single space between "
                        "two words, where the tokenizer starts a new piece); prepare encodes plain text in pieces to "
                        "bound its memory: break the text into lines, split it into several files, or give it as "
                        "JSON lines");
            }
            if (more && !cut) continue;
            if (!more) cut = Cut{pending_.size(), pending_.size()};
            if (cut->end == 0) {  // an empty file, or nothing after the last cut (never: a cut leaves text)
                close_file();
                return false;
            }
            item.examples.push_back(
                {ExampleKind::text, pending_.substr(0, cut->end), {}, {}, {}, "input '" + path_ + "'"});
            item.first_piece = pieces_++ == 0;
            item.last_piece = !more;
            item.bytes = cut->next;
            done_bytes_ += cut->next;
            pending_.erase(0, cut->next);
            if (!more) close_file(), done_bytes_ = 0;
            return true;
        }
    }

    // JSON lines: whole examples up to about chunk_ bytes.
    bool fill_lines(WorkItem& item) {
        for (;;) {
            size_t begin = 0;
            for (size_t nl; (nl = pending_.find('\n', begin)) != std::string::npos; begin = nl + 1) {
                add_line(item, std::string_view(pending_).substr(begin, nl - begin));
                if (item.bytes >= chunk_) {
                    pending_.erase(0, nl + 1);
                    return true;
                }
            }
            pending_.erase(0, begin);
            if (pending_.size() > max_uncut_)
                throw std::runtime_error("input '" + path_ + "' line " + std::to_string(line_ + 1) + ": longer than " +
                                         size_text(max_uncut_) +
                                         "; prepare reads one example at a time and holds at most that "
                                         "much: split the example");
            if (read_block()) continue;
            if (!pending_.empty()) add_line(item, pending_);  // the last line, without its '\n'
            close_file();
            if (!item.examples.empty()) return true;
            return false;
        }
    }
    void add_line(WorkItem& item, std::string_view line) {
        std::optional<Example> e =
            parse_example_line(line, o_.text_field, "input '" + path_ + "' line " + std::to_string(++line_));
        if (!e || (e->kind == ExampleKind::text && e->text.empty())) return;
        item.bytes += line.size() + 1;
        item.examples.push_back(std::move(*e));
    }

    const PrepareOptions& o_;
    const Tokenizer& tok_;
    const size_t chunk_, max_uncut_;
    size_t file_ = 0, line_ = 0, pieces_ = 0, done_bytes_ = 0, peak_ = 0;
    bool eof_ = false;
    CutKind preferred_ = CutKind::line_start;
    std::string path_, pending_;
    std::optional<InputFile> in_;
};

std::runtime_error no_documents() {
    return std::runtime_error("prepare: the inputs hold no documents (every file is empty or has only blank lines"
                              " or empty texts); check the input files");
}

void check_eos(const PrepareOptions& o, const Tokenizer& tok) {
    if (tok.eos_id() < 0)
        throw std::runtime_error("tokenizer '" + o.tokenizer +
                                 "': has no end-of-sequence token to end documents with; use the model's own "
                                 "tokenizer.json (with its tokenizer_config.json), or pass no tokenizer to train one");
}

// The inputs' bytes (for progress; 0 for a file that cannot be sized, which reading reports).
double input_bytes(const PrepareOptions& o) {
    double total = 0;
    std::error_code ec;
    for (const auto& path : o.inputs) {
        const auto size = fs::file_size(path, ec);
        if (!ec) total += double(size);
    }
    return total;
}

// Training a tokenizer holds the whole text (several times over, in its piece counts): refused
// above max_training_bytes (default kPrepareMaxTrainingBytes), before anything is read.
void check_training_size(const PrepareOptions& o) {
    const double bytes = input_bytes(o);
    const size_t limit = o.max_training_bytes > 0 ? o.max_training_bytes : kPrepareMaxTrainingBytes;
    if (bytes > double(limit))
        throw std::invalid_argument(
            "prepare: the inputs hold " + size_text(size_t(bytes)) + ", more than the " + size_text(limit) +
            " a tokenizer is trained on here (training holds all of its text in memory); train one on a sample "
            "once (train prepare SAMPLE --vocab N --out TOK) and pass it: --tokenizer TOK/tokenizer.json");
}

// The output directory, created if missing; one this run created is removed again (when empty:
// nothing was written) unless keep() is called, so a run that fails leaves nothing behind.
class OutputDir {
  public:
    explicit OutputDir(const std::string& path) : path_(path) {
        std::error_code ec;
        created_ = !fs::exists(path, ec);
        fs::create_directories(path, ec);
        if (ec || !fs::is_directory(path))
            throw std::runtime_error("output directory '" + path + "': cannot create it" +
                                     (ec ? ": " + ec.message() : std::string(" (a file of that name exists)")));
    }
    ~OutputDir() {
        std::error_code ec;
        if (created_ && !kept_) fs::remove(path_, ec);
    }
    void keep() const { kept_ = true; }

  private:
    std::string path_;
    bool created_ = false;
    mutable bool kept_ = false;
};

}  // namespace

PreparedData prepare_data(const PrepareOptions& o) {
    check_options(o);
    const int threads = std::clamp(o.threads > 0 ? o.threads : cpu_threads_per_rank(), 1, kPrepareMaxThreads);
    // A round encodes 2 items per thread; its text stays within kPrepareRoundBytes whatever the core count.
    const size_t chunk = std::max<size_t>(
        1, std::min(o.chunk_bytes > 0 ? o.chunk_bytes : kPrepareChunkBytes, kPrepareRoundBytes / (2 * size_t(threads))));

    // A tokenizer trained here sees every document at once, so the inputs are read whole for it
    // (then streamed again to encode): bounded by kPrepareMaxTrainingBytes.
    std::optional<ChatFormat> format;
    std::optional<Tokenizer> trained;
    if (o.tokenizer.empty()) {
        check_training_size(o);
        std::vector<Example> examples;
        for (const auto& path : o.inputs)
            for (Example& e : read_examples(path, o.text_field)) examples.push_back(std::move(e));
        if (examples.empty()) throw no_documents();
        format = chat_format_of(o, examples);
        trained = as_saved(train_tokenizer(o, examples, format));
    }
    const Tokenizer tok = trained ? *trained : Tokenizer::load(o.tokenizer);
    if (format) {
        add_tokenizer_specials(*format, tok);
        check_chat_tokens(tok, *format);
    }

    const OutputDir out_dir(o.out_dir);
    const fs::path dir(o.out_dir);
    PreparedData out;
    std::optional<Spill> spill(std::in_place, dir);
    {
        InputStream input(o, tok, chunk);
        ThreadPool pool(threads);
        Progress progress("encoding " + std::to_string(o.inputs.size()) + " input files", input_bytes(o));
        std::vector<WorkItem> round;
        size_t round_bytes = 0;
        bool eos_checked = false;
        // Encodes the round on every thread and appends it to the spill in input order; the
        // first error in input order is rethrown (the same one whatever the thread count).
        const auto flush = [&] {
            std::vector<Encoded> done(round.size());
            std::vector<std::exception_ptr> errors(round.size());
            const ExampleEncoding how{format, o.train_on_prompt};
            pool.run(round.size(), [&](size_t i) {
                try {
                    done[i] = encode_item(tok, round[i], how, o.truncate);
                } catch (...) {
                    errors[i] = std::current_exception();
                }
            });
            size_t tokens = 0;
            for (size_t i = 0; i < round.size(); ++i) {
                if (errors[i]) std::rethrow_exception(errors[i]);
                tokens += done[i].tokens.size();
            }
            out.peak_buffered_tokens = std::max(out.peak_buffered_tokens, tokens);
            for (size_t i = 0; i < round.size(); ++i) {
                spill->append(done[i].tokens, done[i].flags);
                for (uint8_t f : done[i].flags) out.counted_tokens += (f & kTokenCounted) != 0;
                out.truncated_documents += done[i].truncated, out.dropped_documents += done[i].dropped;
                progress.advance(double(round[i].bytes));
            }
            round.clear(), round_bytes = 0;
        };
        for (WorkItem item; input.next(item);) {
            for (const Example& e : item.examples) {
                if (e.kind != ExampleKind::chat && !eos_checked) {
                    check_eos(o, tok);
                    eos_checked = true;
                }
                if (e.kind == ExampleKind::chat && !format) {  // the first chat: its template, checked
                    format = resolve_chat_format(
                        o.chat_format, o.tokenizer.empty() ? "" : tokenizer_config_beside(o.tokenizer),
                        o.chat_template);
                    add_tokenizer_specials(*format, tok);
                    check_chat_tokens(tok, *format);
                }
                if (!item.first_piece) continue;  // the rest of a document already counted
                ++out.documents;
                out.text_documents += e.kind == ExampleKind::text;
                out.prompt_completion_documents += e.kind == ExampleKind::prompt_completion;
                out.chat_documents += e.kind == ExampleKind::chat;
            }
            out.peak_buffered_bytes = std::max(out.peak_buffered_bytes, round_bytes + input.take_peak());
            round_bytes += item.bytes;
            round.push_back(std::move(item));
            if (round.size() >= 2 * size_t(threads)) flush();
        }
        flush();
    }
    if (out.documents == 0) throw no_documents();
    if (format) out.chat_format = chat_format_name(*format);

    const long long n = spill->size();
    const long long train = train_end(*spill, held_out(o.val_fraction, n));
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

    out.train_tokens = train;
    out.val_tokens = val;
    out.vocab_size = tok.vocab_size();

    Progress writing("writing shards to " + o.out_dir, double(shards + 1), Progress::Unit::items);
    const auto write = [&](long long begin, long long end, const std::string& path) {
        write_shard_streamed(path, uint32_t(tok.vocab_size()), uint32_t(std::max(0, tok.eos_id())),
                             tok.id_fingerprint(), uint64_t(end - begin),
                             [&](uint64_t at, size_t k, uint32_t* tokens, uint8_t* flags) {
                                 spill->read(uint64_t(begin) + at, k, tokens, flags);
                             });
        spill->release(end);
        writing.advance(1);
    };
    for (long long s = 0; s < shards; ++s) {
        out.train_shards.push_back((dir / train_shard_name(size_t(s))).string());
        write(s * o.shard_tokens, std::min(train, (s + 1) * o.shard_tokens), out.train_shards.back());
    }
    out.val_shard = (dir / "val.pvtokens").string();
    write(train, n, out.val_shard);
    spill.reset();
    out_dir.keep();
    std::error_code ec;
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
    // prepare numbers the shards from 0 without gaps: a missing one is data lost, not a smaller set.
    for (size_t i = 0; i < names.size(); ++i)
        if (names[i] != train_shard_name(i))
            throw std::runtime_error("data '" + path + "': training shard '" + (dir / train_shard_name(i)).string() +
                                     "' is missing (the directory has " + std::to_string(names.size()) +
                                     " train_*.pvtokens files, but '" + names[i] +
                                     "' where it should be; prepare numbers them from train_000000 without gaps): "
                                     "a shard was removed or renamed; re-run `train prepare` into this directory");
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
