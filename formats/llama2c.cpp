// llama2.c checkpoint -> Hugging Face directory (formats/llama2c.h).
#include "formats/llama2c.h"

#include "formats/config_json.h"
#include "formats/hf_checkpoint.h"
#include "formats/safetensors.h"
#include "io/input_file.h"
#include "model/checkpoint.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <stdexcept>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace pv {
namespace {

[[noreturn]] void fail(const std::string& path, const std::string& what) {
    throw std::runtime_error("llama2.c checkpoint '" + path + "': " + what);
}

// export.py's version 1 and 2 files start with this uint32 ("ak42" read little-endian).
constexpr uint32_t kVersionedMagic = 0x616b3432;

// A file opened for pread, closed on scope exit.
struct File {
    InputFile in;  // a regular file only (io/input_file.h)
    int fd;
    explicit File(const std::string& path)
        : in(open_input_file(path, "llama2.c checkpoint", "check the path")), fd(in.fd()) {}
};

void read_at(const File& f, const std::string& path, void* dst, uint64_t bytes, uint64_t offset) {
    auto* out = static_cast<uint8_t*>(dst);
    while (bytes > 0) {
        const ssize_t got = ::pread(f.fd, out, bytes, static_cast<off_t>(offset));
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) fail(path, "read failed: " + std::string(std::strerror(errno)));
        if (got == 0)
            fail(path, "ended early at byte " + std::to_string(offset) + " (was it changed while converting?)");
        out += got, bytes -= uint64_t(got), offset += uint64_t(got);
    }
}

// a · b, refusing products past 2^62 (no real model is near; a corrupt header can be).
uint64_t times(uint64_t a, uint64_t b, const std::string& path) {
    if (a != 0 && b > (uint64_t{1} << 62) / a)
        fail(path, "the header's sizes multiply past 2^62 elements (a corrupt header, or not a llama2.c checkpoint)");
    return a * b;
}

// Where each array starts, in floats after the header (formats/llama2c.h lists them in file order).
struct Offsets {
    uint64_t embedding, rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3, rms_final, wcls, end;
};

Offsets offsets_of(const Llama2cHeader& h, const std::string& path) {
    const uint64_t V = uint64_t(h.vocab_size), D = uint64_t(h.dim), F = uint64_t(h.hidden_dim),
                   L = uint64_t(h.n_layers), hs = uint64_t(h.head_size()), q = uint64_t(h.n_heads) * hs,
                   kv = uint64_t(h.n_kv_heads) * hs, T = uint64_t(h.seq_len);
    Offsets o{};
    uint64_t at = 0;
    auto next = [&](uint64_t floats) {
        const uint64_t start = at;
        at += floats;
        if (at < start) fail(path, "the header's sizes overflow (a corrupt header)");
        return start;
    };
    o.embedding = next(times(V, D, path));
    o.rms_att = next(times(L, D, path));
    o.wq = next(times(L, times(q, D, path), path));
    o.wk = next(times(L, times(kv, D, path), path));
    o.wv = next(times(L, times(kv, D, path), path));
    o.wo = next(times(L, times(D, q, path), path));
    o.rms_ffn = next(times(L, D, path));
    o.w1 = next(times(L, times(F, D, path), path));
    o.w2 = next(times(L, times(D, F, path), path));
    o.w3 = next(times(L, times(F, D, path), path));
    o.rms_final = next(D);
    next(times(T, hs / 2, path));  // freq_cis_real
    next(times(T, hs / 2, path));  // freq_cis_imag
    o.wcls = next(h.shared_classifier ? 0 : times(V, D, path));
    o.end = at;
    return o;
}

constexpr uint64_t kHeaderBytes = 7 * sizeof(int32_t);

// One tensor of the output: its HF name and shape, where its rows lie in the file, and the heads
// whose rows go to rotate_half order (0: none).
struct Source {
    std::string name;
    long long rows, cols;
    uint64_t offset;  // floats after the header
    int permute_heads;
};

// Writes model.safetensors into tmp: each source's rows read, permuted where it says, written.
void write_model(const std::string& bin, const std::string& tmp, const std::vector<Source>& sources,
                 const std::vector<SafeTensorInfo>& infos, long long hs) {
    const File f(bin);
    std::vector<float> rows, permuted;
    write_safetensors_streamed(tmp + "/" + kSafetensorsFile, infos, {{"format", "pt"}},
                               [&](size_t i, const ByteSink& sink) {
                                   const Source& s = sources[i];
                                   rows.resize(size_t(s.rows * s.cols));
                                   read_at(f, bin, rows.data(), rows.size() * 4, kHeaderBytes + 4 * s.offset);
                                   if (s.permute_heads == 0) return sink(rows.data(), rows.size() * 4);
                                   permuted.resize(rows.size());
                                   const std::vector<long long> order = rotate_half_row_order(s.permute_heads, hs);
                                   for (size_t r = 0; r < order.size(); ++r)
                                       std::memcpy(permuted.data() + r * size_t(s.cols),
                                                   rows.data() + size_t(order[r] * s.cols), size_t(s.cols) * 4);
                                   sink(permuted.data(), permuted.size() * 4);
                               });
}

}  // namespace

Llama2cHeader read_llama2c_header(const std::string& path) {
    const File f(path);
    const uint64_t size = f.in.size();
    if (size < kHeaderBytes)
        fail(path, "is " + std::to_string(size) +
                       " bytes, shorter than the 28-byte header (7 int32: dim, hidden_dim, n_layers, n_heads, "
                       "n_kv_heads, vocab_size, seq_len); is it a llama2.c checkpoint?");
    int32_t fields[7];
    read_at(f, path, fields, kHeaderBytes, 0);
    if (uint32_t(fields[0]) == kVersionedMagic)
        fail(path,
             "starts with the magic \"ak42\" of llama2.c's versioned exports (export.py --version 1 or 2), not the "
             "legacy format run.c reads: export it again with `python export.py --version 0`");
    Llama2cHeader h;
    h.dim = fields[0], h.hidden_dim = fields[1], h.n_layers = fields[2], h.n_heads = fields[3];
    h.n_kv_heads = fields[4], h.vocab_size = fields[5], h.seq_len = fields[6];
    h.shared_classifier = h.vocab_size > 0;
    if (h.vocab_size == std::numeric_limits<int32_t>::min()) h.vocab_size = 0;  // −INT_MIN overflows: refused below
    h.vocab_size = h.vocab_size < 0 ? -h.vocab_size : h.vocab_size;
    const std::pair<const char*, int> named[] = {
        {"dim", h.dim},         {"hidden_dim", h.hidden_dim}, {"n_layers", h.n_layers},
        {"n_heads", h.n_heads}, {"n_kv_heads", h.n_kv_heads}, {"vocab_size", h.vocab_size},
        {"seq_len", h.seq_len}};
    for (const auto& [name, value] : named)
        if (value <= 0)
            fail(path, std::string("header field ") + name + " = " + std::to_string(value) +
                           " must be positive (a corrupt header, or not a llama2.c checkpoint)");
    if (h.dim % h.n_heads != 0)
        fail(path, "header: dim " + std::to_string(h.dim) + " is not a multiple of n_heads " +
                       std::to_string(h.n_heads) + " (a corrupt header, or not a llama2.c checkpoint)");
    if (h.n_heads % h.n_kv_heads != 0)
        fail(path, "header: n_heads " + std::to_string(h.n_heads) + " is not a multiple of n_kv_heads " +
                       std::to_string(h.n_kv_heads) + " (a corrupt header, or not a llama2.c checkpoint)");
    if (h.head_size() % 2 != 0)
        fail(path, "header: the head size dim / n_heads = " + std::to_string(h.head_size()) +
                       " is odd, but RoPE rotates pairs (a corrupt header, or not a llama2.c checkpoint)");
    const Offsets o = offsets_of(h, path);
    const uint64_t expected = kHeaderBytes + times(o.end, 4, path);
    if (size != expected)
        fail(path, "is " + std::to_string(size) + " bytes, but its header (dim " + std::to_string(h.dim) +
                       ", hidden_dim " + std::to_string(h.hidden_dim) + ", " + std::to_string(h.n_layers) +
                       " layers, " + std::to_string(h.n_heads) + " heads, " + std::to_string(h.n_kv_heads) +
                       " KV heads, vocab " + std::to_string(h.vocab_size) + ", seq_len " + std::to_string(h.seq_len) +
                       (h.shared_classifier ? ", shared classifier" : ", separate classifier") + ") implies " +
                       std::to_string(expected) + " = 28 + 4 × " + std::to_string(o.end) +
                       " fp32 weights: the file is truncated or padded, or not a llama2.c checkpoint");
    return h;
}

LlamaConfig llama2c_config(const Llama2cHeader& h, const std::string& name) {
    LlamaConfig c;
    c.name = name;
    c.vocab_size = h.vocab_size;
    c.hidden_size = h.dim;
    c.num_layers = h.n_layers;
    c.num_heads = h.n_heads;
    c.num_kv_heads = h.n_kv_heads;
    c.head_dim = int(h.head_size());
    c.ffn_size = h.hidden_dim;
    c.rms_norm_eps = 1e-5;   // llama2.c's rmsnorm
    c.rope_theta = 10000.0;  // llama2.c's RoPE base
    c.max_seq_len = h.seq_len;
    c.tie_embeddings = h.shared_classifier;
    validate_or_throw(c);
    return c;
}

std::vector<long long> rotate_half_row_order(int heads, long long head_size) {
    std::vector<long long> order;
    const long long half = head_size / 2;
    for (long long h = 0; h < heads; ++h)
        for (long long p = 0; p < 2; ++p)
            for (long long j = 0; j < half; ++j) order.push_back(h * head_size + 2 * j + p);  // row p·half + j
    return order;
}

LlamaConfig convert_llama2c(const std::string& bin, const std::string& out_dir) {
    const Llama2cHeader h = read_llama2c_header(bin);
    const LlamaConfig config = llama2c_config(h, bin);
    const Offsets o = offsets_of(h, bin);
    const long long V = h.vocab_size, D = h.dim, F = h.hidden_dim, hs = h.head_size();
    const long long q = h.n_heads * hs, kv = h.n_kv_heads * hs;

    // The tensors in Hugging Face's order (unit, tensor), each from its rows of the file.
    std::vector<Source> sources = {{"model.embed_tokens.weight", V, D, o.embedding, 0}};
    for (long long l = 0; l < h.n_layers; ++l) {
        const std::string p = "model.layers." + std::to_string(l) + ".";
        sources.insert(sources.end(),
                       {
                           {p + "input_layernorm.weight", D, 1, o.rms_att + uint64_t(l * D), 0},
                           {p + "self_attn.q_proj.weight", q, D, o.wq + uint64_t(l * q * D), h.n_heads},
                           {p + "self_attn.k_proj.weight", kv, D, o.wk + uint64_t(l * kv * D), h.n_kv_heads},
                           {p + "self_attn.v_proj.weight", kv, D, o.wv + uint64_t(l * kv * D), 0},
                           {p + "self_attn.o_proj.weight", D, q, o.wo + uint64_t(l * D * q), 0},
                           {p + "post_attention_layernorm.weight", D, 1, o.rms_ffn + uint64_t(l * D), 0},
                           {p + "mlp.gate_proj.weight", F, D, o.w1 + uint64_t(l * F * D), 0},
                           {p + "mlp.up_proj.weight", F, D, o.w3 + uint64_t(l * F * D), 0},
                           {p + "mlp.down_proj.weight", D, F, o.w2 + uint64_t(l * D * F), 0},
                       });
    }
    sources.push_back({"model.norm.weight", D, 1, o.rms_final, 0});
    if (!h.shared_classifier) sources.push_back({"lm_head.weight", V, D, o.wcls, 0});

    std::vector<SafeTensorInfo> infos;
    for (const Source& s : sources)
        infos.push_back(
            {s.name, "F32", s.cols == 1 ? std::vector<int64_t>{s.rows} : std::vector<int64_t>{s.rows, s.cols}, 0, 0});
    const std::string tmp = begin_new_model_dir(out_dir);
    try {
        write_model(bin, tmp, sources, infos, hs);
        write_hf_config(tmp + "/config.json", config, "float32");
        write_generation_config(tmp + "/generation_config.json", GenerationConfig{1, {2}});
    } catch (...) {
        std::error_code ignore;
        std::filesystem::remove_all(tmp, ignore);  // never leave half a model behind
        throw;
    }
    commit_checkpoint_dir(out_dir);
    return config;
}

}  // namespace pv
