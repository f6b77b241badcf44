// Kernel benchmarks: every op of a Llama step at a named model shape, with the bytes it must
// move and the FLOPs it must do, its time, and what that achieves. On a GPU it also prints the
// fraction of the device's ceiling (H100 SXM: HBM3 3.35 TB/s; dense tensor-core 989 TFLOP/s in
// bf16, 495 in tf32/fp32-input, 67 in fp64). On the host backend the times are CPU times and
// are labelled so; they are for tracking the emulation, not for judging kernels.
//
//   kernels_bench [--shape NAME] [--tp N] [--dtype bf16|fp32|fp64] [--batch B] [--seq T] [--repeat R] [--dry-run]
//
// --tp N runs one rank's kernels under N-way tensor parallelism (model/tensor_parallel.h: a rank's
// query and KV heads, ffn and vocabulary rows): small attention grids, which the attention kernels
// split (e.g. --shape llama-3.1-8b --tp 8 --batch 1 --seq 4096).
//
// --dry-run prints each kernel's bytes and FLOPs at the shape without allocating or running
// anything (for shapes too large for the host).
//
// Default: --shape smollm2-135m --batch 1 --seq 256 --dtype bf16 (B·T ≤ 512 suits the host);
// on a GPU use e.g. --shape llama-3.2-1b --batch 4 --seq 2048.
//
// "Bytes" is the minimum traffic: every input read once and every output written once (the
// model's real traffic can only be higher); "FLOPs" counts multiply-adds as two.
#include "bench/timing.h"
#include "kernels/attention_instances.h"
#include "kernels/attention_decode.cuh"
#include "kernels/cross_entropy.cuh"
#include "platform/device_memory.h"
#include "kernels/embedding.cuh"
#include "kernels/glue.cuh"
#include "kernels/matmul.cuh"
#include "kernels/nf4.cuh"
#include "kernels/philox.cuh"
#include "kernels/rmsnorm.cuh"
#include "kernels/rope.cuh"
#include "kernels/swiglu.cuh"
#include "model/config.h"
#include "model/tensor_parallel.h"
#include "model/dtype.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace kernels_bench {

struct Options {
    std::string shape = "smollm2-135m";
    std::string dtype = "bf16";
    int batch = 1, seq = 256, repeat = 3, tp = 1;
    bool dry_run = false;
};

bool g_dry_run = false;

[[noreturn]] void usage(const char* problem) {
    std::fprintf(stderr,
                 "kernels_bench: %s\nusage: kernels_bench [--shape NAME] [--tp N] [--dtype bf16|fp32|fp64] [--batch B] "
                 "[--seq T] [--repeat R] [--dry-run]\nshapes:",
                 problem);
    for (const std::string& n : pv::preset_names()) std::fprintf(stderr, " %s", n.c_str());
    std::fprintf(stderr, "\n");
    std::exit(2);
}

Options parse(int argc, char** argv) {
    Options o;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--help" || a == "-h") usage("benchmarks each kernel at a model's shapes");
        if (a == "--dry-run") {
            o.dry_run = true;
            continue;
        }
        if (i + 1 >= argc) usage(("missing value after " + a).c_str());
        const std::string v = argv[++i];
        if (a == "--shape")
            o.shape = v;
        else if (a == "--dtype")
            o.dtype = v;
        else if (a == "--batch")
            o.batch = std::atoi(v.c_str());
        else if (a == "--seq")
            o.seq = std::atoi(v.c_str());
        else if (a == "--repeat")
            o.repeat = std::atoi(v.c_str());
        else if (a == "--tp")
            o.tp = std::atoi(v.c_str());
        else
            usage(("unknown option " + a).c_str());
    }
    if (o.batch < 1 || o.seq < 1 || o.repeat < 1 || o.tp < 1)
        usage("--batch, --seq, --repeat and --tp must be positive");
    try {
        (void)pv::parse_dtype(o.dtype);
    } catch (const std::invalid_argument& e) {
        usage(e.what());
    }
    return o;
}

// Seconds per call of `body` (nothing runs in a dry run).
double time_it(int repeats, const std::function<void()>& body) {
    return g_dry_run ? 0.0 : pv::bench::seconds_per_call(repeats, body);
}

// A device buffer of n elements holding small random values (so no kernel sees NaN or overflows).
template <class T>
T* random_buffer(long long n, uint32_t id) {
    if (g_dry_run) return nullptr;
    T* p = static_cast<T*>(pv::device_alloc(size_t(n) * sizeof(T), pv::MemoryCategory::workspace));
    pv::init_normal(p, n, 0.5, 1234, id, 0, nullptr);
    return p;
}

int* token_buffer(long long n, int vocab) {
    if (g_dry_run) return nullptr;
    std::vector<int> host(static_cast<size_t>(n));
    for (long long i = 0; i < n; ++i) host[size_t(i)] = int((i * 7919 + 13) % vocab);
    int* p = static_cast<int*>(pv::device_alloc(size_t(n) * sizeof(int), pv::MemoryCategory::workspace));
    CUDA_CHECK(cudaMemcpy(p, host.data(), size_t(n) * sizeof(int), cudaMemcpyHostToDevice));
    return p;
}

struct Ceiling {
    double bytes_per_s, flops_per_s;
};

template <class T>
Ceiling h100_ceiling() {
    if constexpr (std::is_same_v<T, double>)
        return {3.35e12, 67e12};
    else if constexpr (std::is_same_v<T, float>)
        return {3.35e12, 495e12};
    else
        return {3.35e12, 989e12};
}

template <class T>
void report(const char* name, double seconds, double bytes, double flops, bool on_gpu) {
    if (g_dry_run) {
        std::printf("  %-28s %12.4g bytes  %12.4g FLOPs  %8.2f FLOP/byte\n", name, bytes, flops, flops / bytes);
        return;
    }
    const double gbs = bytes / seconds * 1e-9, tflops = flops / seconds * 1e-12;
    std::printf("  %-28s %10.3f ms  %9.2f GB/s  %9.4f TFLOP/s", name, seconds * 1e3, gbs, tflops);
    if (on_gpu) {
        const Ceiling c = h100_ceiling<T>();
        // The bound that matters is whichever of memory and compute takes longer.
        const double bound = std::max(bytes / c.bytes_per_s, flops / c.flops_per_s);
        std::printf("  %5.1f%% of ceiling", 100.0 * bound / seconds);
    }
    std::printf("\n");
}

// NF4 (QLoRA's frozen base, kernels/nf4.cuh) at the model's q_proj (C x C) and gate_proj (F x C)
// weights (--shape llama-3.1-8b: 4096 x 4096 and 14336 x 4096): dequantisation to T, which runs
// before every GEMM with a quantised weight (bytes: the codes and absmax fields read, the values
// written), plain and double-quantised; and the one-off quantisation at load (bytes: the weight
// read, the stored bytes written). FLOPs: the scaling multiply per value (dequantisation), that
// and the absmax comparison (quantisation).
template <class T>
void run_nf4(const pv::LlamaConfig& c, const Options& o, bool on_gpu) {
    struct Shape {
        std::string name;
        long long rows, cols;
    };
    const long long C = c.hidden_size, F = c.ffn_size;
    for (const Shape& shape : {Shape{std::to_string(C) + "x" + std::to_string(C), C, C},
                               Shape{std::to_string(F) + "x" + std::to_string(C), F, C}}) {
        const long long n = shape.rows * shape.cols;
        T* w = random_buffer<T>(n, 30);
        void* scratch = g_dry_run
                            ? nullptr
                            : pv::device_alloc(pv::nf4_quantize_scratch_bytes(n, true), pv::MemoryCategory::workspace);
        for (bool double_quant : {false, true}) {
            pv::Nf4Tensor q;
            q.n = n, q.double_quant = double_quant;
            auto alloc = [](long long bytes) {
                return g_dry_run ? nullptr : pv::device_alloc(size_t(bytes), pv::MemoryCategory::workspace);
            };
            q.codes = static_cast<uint8_t*>(alloc(pv::nf4_code_bytes(n)));
            if (double_quant) {
                q.absmax_codes = static_cast<uint8_t*>(alloc(pv::nf4_blocks(n)));
                q.nested_absmax = static_cast<float*>(alloc(pv::nf4_nested_blocks(n) * 4));
                q.offset = static_cast<float*>(alloc(4));
            } else {
                q.absmax = static_cast<float*>(alloc(pv::nf4_blocks(n) * 4));
            }
            const double stored = double(pv::nf4_stored_bytes(n, double_quant)), values = double(n) * sizeof(T);
            const std::string suffix = shape.name + (double_quant ? " dq" : "");
            report<T>(("nf4 quantize " + suffix).c_str(),
                      time_it(o.repeat, [&] { pv::nf4_quantize(w, n, q, scratch, nullptr); }), values + stored, 2.0 * n,
                      on_gpu);
            report<T>(("nf4 dequantize " + suffix).c_str(),
                      time_it(o.repeat, [&] { pv::nf4_dequantize(q, w, n, nullptr); }), stored + values, 1.0 * n,
                      on_gpu);
            for (void* p : std::initializer_list<void*>{q.codes, q.absmax, q.absmax_codes, q.nested_absmax, q.offset})
                pv::memory_free(p);
        }
        pv::memory_free(scratch);
        pv::memory_free(w);
    }
}

template <class T>
void run(const pv::LlamaConfig& c, const Options& o) {
    using A = pv::acc_t<T>;
    const bool on_gpu = !pv::kHostBackend;
    const int B = o.batch, Tn = o.seq, C = c.hidden_size, V = c.vocab_size, F = c.ffn_size;
    const int H = c.num_heads, Hkv = c.num_kv_heads, hd = c.head_dim_resolved();
    const long long N = (long long)B * Tn;
    const int qkv_w = c.qkv_width(), q_w = c.q_width();
    const double t = sizeof(T), a = sizeof(A);
    const std::string rank = o.tp > 1 ? ", one rank of --tp " + std::to_string(o.tp) : "";
    std::printf("%s%s, %s, batch %d x seq %d (N = %lld rows)%s\n", c.name.c_str(), rank.c_str(), o.dtype.c_str(), B, Tn,
                N, on_gpu ? "" : "  [host CPU emulation: times are CPU times, not GPU figures]");
    cublasHandle_t handle;
    CUBLAS_CHECK(cublasCreate(&handle));

    int* tokens = token_buffer(N, V);
    T* wte = random_buffer<T>((long long)V * C, 1);
    T* x = random_buffer<T>(N * C, 2);
    T* y = random_buffer<T>(N * C, 3);
    T* dx = random_buffer<T>(N * C, 4);
    T* w = random_buffer<T>(C, 5);
    T* dw = random_buffer<T>(C, 6);
    T* dwte = random_buffer<T>((long long)V * C, 7);
    // Device buffers (none in a dry run).
    auto alloc = [](size_t bytes) {
        return g_dry_run ? nullptr : pv::device_alloc(bytes, pv::MemoryCategory::workspace);
    };
    A* rstd = static_cast<A*>(alloc(size_t(N) * sizeof(A)));
    void* norm_scratch = alloc(pv::rmsnorm_backward_scratch_bytes<T>(N, C));
    void* embedding_scratch = alloc(pv::embedding_backward_scratch_bytes(N));
    const int R = o.repeat;

    report<T>("embedding forward", time_it(R, [&] { pv::embedding_forward(tokens, wte, x, N, C, V, nullptr); }),
              2.0 * N * C * t + N * 4.0, 0, on_gpu);
    report<T>("embedding backward",
              time_it(R, [&] { pv::embedding_backward(tokens, y, dwte, N, C, V, embedding_scratch, nullptr); }),
              3.0 * N * C * t + N * 4.0, N * C, on_gpu);
    report<T>("rmsnorm forward", time_it(R, [&] { pv::rmsnorm_forward(x, w, y, rstd, N, C, 1e-5, nullptr); }),
              2.0 * N * C * t + C * t + N * a, 4.0 * N * C, on_gpu);
    report<T>("rmsnorm backward",
              time_it(R, [&] { pv::rmsnorm_backward(x, w, rstd, y, dx, dx, dw, norm_scratch, N, C, nullptr); }),
              4.0 * N * C * t + N * a + 2.0 * C * t, 8.0 * N * C, on_gpu);

    // Attention block: QKV projection, RoPE, attention, output projection.
    T* qkv = random_buffer<T>(N * qkv_w, 8);
    T* wqkv = random_buffer<T>((long long)qkv_w * C, 9);
    T* att = random_buffer<T>(N * q_w, 10);
    T* datt = random_buffer<T>(N * q_w, 11);
    T* dqkv = random_buffer<T>(N * qkv_w, 12);
    T* dwqkv = random_buffer<T>((long long)qkv_w * C, 21);  // (not dwte: V < qkv_w at the test shapes)
    A* lse = static_cast<A*>(alloc(size_t(B) * H * Tn * sizeof(A)));
    void* att_scratch = alloc(pv::attention_scratch_bytes<T>(B, Tn, H, Hkv, hd));
    const std::vector<A> rope_values = pv::rope_table_values<A>(pv::rope_inverse_frequencies(c), Tn);
    A* rope_values_d = static_cast<A*>(alloc(rope_values.size() * sizeof(A)));
    if (rope_values_d)
        CUDA_CHECK(
            cudaMemcpy(rope_values_d, rope_values.data(), rope_values.size() * sizeof(A), cudaMemcpyHostToDevice));
    const pv::RopeTable<A> rope_table{rope_values_d, Tn, hd};

    const double gemm_qkv = 2.0 * N * C * qkv_w;
    report<T>("matmul qkv forward", time_it(R, [&] { pv::matmul_forward(handle, x, wqkv, qkv, N, C, qkv_w, nullptr); }),
              (double(N) * C + double(qkv_w) * C + double(N) * qkv_w) * t, gemm_qkv, on_gpu);
    report<T>("rope forward (q and k)",
              time_it(R,
                      [&] {
                          pv::rope_forward(qkv, rope_table, nullptr, N, Tn, H, hd, qkv_w, nullptr);
                          pv::rope_forward(qkv + q_w, rope_table, nullptr, N, Tn, Hkv, hd, qkv_w, nullptr);
                      }),
              2.0 * N * (H + Hkv) * hd * t + 2.0 * Tn * hd * a, 3.0 * N * (H + Hkv) * hd, on_gpu);
    // Causal attention: half of the T x T scores, two matmuls (QKᵀ, PV) forward, five backward.
    const double att_flops = 2.0 * 2.0 * B * H * (double(Tn) * (Tn + 1) / 2) * hd;
    const double att_bytes = (double(N) * qkv_w + double(N) * q_w) * t + double(B) * H * Tn * a;
    const double att_bytes_back = (2.0 * N * qkv_w + 2.0 * N * q_w) * t + double(B) * H * Tn * a;
    report<T>(
        "attention forward",
        time_it(R, [&] { pv::attention_forward(qkv, nullptr, att, lse, att_scratch, B, Tn, H, Hkv, hd, nullptr); }),
        att_bytes, att_flops, on_gpu);
    // bf16 at hd 64 and 128 runs on tensor cores (kernels/attention_mma_forward.cuh); the CUDA-core
    // kernel it replaced, timed alongside for comparison.
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
        if (hd == 64 || hd == 128)
            report<T>("attention fwd, CUDA cores",
                      time_it(R,
                              [&] {
                                  if (hd == 64)
                                      pv::attention_forward_launch<T, 64>(qkv, nullptr, att, lse, B, Tn, H, Hkv, hd,
                                                                          nullptr);
                                  else
                                      pv::attention_forward_launch<T, 128>(qkv, nullptr, att, lse, B, Tn, H, Hkv, hd,
                                                                           nullptr);
                              }),
                      att_bytes, att_flops, on_gpu);
        // Where this shape splits the forward's query tiles (a small grid), the kernel unsplit: what
        // the split saves.
        if (pv::attention_mma_forward_supported(qkv, att, hd) &&
            pv::attention_mma_query_segment_steps(B, Tn, H, hd) > 0)
            report<T>(
                "attention forward, unsplit",
                time_it(
                    R,
                    [&] { pv::attention_mma_forward(qkv, nullptr, att, lse, B, Tn, H, Hkv, hd, nullptr, 0, nullptr); }),
                att_bytes, att_flops, on_gpu);
    }
    report<T>("attention backward",
              time_it(R,
                      [&] {
                          pv::attention_backward(qkv, nullptr, att, datt, lse, dqkv, att_scratch, B, Tn, H, Hkv, hd,
                                                 nullptr);
                      }),
              att_bytes_back, 2.5 * att_flops, on_gpu);
    if constexpr (std::is_same_v<T, __nv_bfloat16>)  // bf16 runs on tensor cores; before, it ran these
        report<T>("attention backward, CUDA cores",
                  time_it(R,
                          [&] {
                              A* D = static_cast<A*>(att_scratch);
                              pv::attention_backward_dot(att, datt, D, B, Tn, H, hd, nullptr);
                              pv::attention_backward_cuda_cores(qkv, nullptr, datt, lse, D, dqkv, B, Tn, H, Hkv, hd,
                                                                nullptr);
                          }),
                  att_bytes_back, 2.5 * att_flops, on_gpu);
    if constexpr (std::is_same_v<T, __nv_bfloat16>)
        if (pv::attention_mma_backward_applies(qkv, datt, dqkv, hd)) {
            // The tensor-core backward with its dK/dV rows, splits and warps named: unsplit where this
            // shape's grids are split (what the splits save), with swizzled rows at the head dims that
            // have them (what sm_86/sm_89 run, timed on this GPU) where the device holds their block,
            // with dQ's warps of 16 rows where the device runs 32 (what those save), and with dK/dV's
            // warps of the other width where the device has warps of 32 keys (the shape chooses:
            // attention_mma_dkv_row_tiles; the other shows what the choice saves).
            const size_t shared = pv::device_shared_bytes_per_block();
            const pv::AttentionMmaSplit split = pv::attention_mma_backward_split(B, Tn, H, Hkv, hd);
            const pv::AttentionMmaRows rows = pv::attention_mma_dkv_rows(hd, shared);
            const int dq_row_tiles = pv::attention_mma_dq_row_tiles(hd, shared);
            const int dkv_row_tiles = pv::attention_mma_dkv_row_tiles(hd, shared, B, Tn, H, Hkv);
            const auto mma = [&](pv::AttentionMmaRows dkv_rows, pv::AttentionMmaSplit L, int dq_rows, int dkv_keys) {
                A* D = static_cast<A*>(att_scratch);
                pv::attention_backward_dot(att, datt, D, B, Tn, H, hd, nullptr);
                pv::attention_mma_backward(qkv, nullptr, datt, lse, D, dqkv, B, Tn, H, Hkv, hd, nullptr, dkv_rows, L,
                                           pv::attention_backward_partials<T>(att_scratch, B, Tn, H), dq_rows,
                                           dkv_keys);
            };
            if (split.dkv > 0 || split.dq > 0)
                report<T>("attention backward, unsplit",
                          time_it(R, [&] { mma(rows, {}, dq_row_tiles, dkv_row_tiles); }), att_bytes_back,
                          2.5 * att_flops, on_gpu);
            if (pv::attention_mma_dkv_has_swizzled(hd) && rows == pv::AttentionMmaRows::padded)
                report<T>("attention backward, dK/dV swizzled",
                          time_it(R, [&] { mma(pv::AttentionMmaRows::swizzled, split, dq_row_tiles, 1); }),
                          att_bytes_back, 2.5 * att_flops, on_gpu);
            if (dq_row_tiles > 1)
                report<T>("attention backward, dQ warps of 16 rows",
                          time_it(R, [&] { mma(rows, split, 1, dkv_row_tiles); }), att_bytes_back, 2.5 * att_flops,
                          on_gpu);
            if (pv::attention_mma_dkv_row_tiles(hd, shared) > 1)
                report<T>(dkv_row_tiles > 1 ? "attention backward, dK/dV warps of 16 keys"
                                            : "attention backward, dK/dV warps of 32 keys",
                          time_it(R, [&] { mma(rows, split, dq_row_tiles, 3 - dkv_row_tiles); }), att_bytes_back,
                          2.5 * att_flops, on_gpu);
        }
    // Packed documents of T/4 tokens (--document-mask): each row attends within its document only,
    // so the scores are those of four causal blocks of T/4 (plus the positions, read once).
    std::vector<int> doc_pos(static_cast<size_t>(N));
    const int doc_len = std::max(1, Tn / 4);
    for (long long n = 0; n < N; ++n) doc_pos[size_t(n)] = int(n % Tn) % doc_len;
    int* positions = static_cast<int*>(alloc(doc_pos.size() * sizeof(int)));
    if (positions)
        CUDA_CHECK(cudaMemcpy(positions, doc_pos.data(), doc_pos.size() * sizeof(int), cudaMemcpyHostToDevice));
    double doc_pairs = 0;  // (query, key) pairs over the documents of one sequence
    for (int start = 0; start < Tn; start += doc_len) {
        const double len = std::min(doc_len, Tn - start);
        doc_pairs += len * (len + 1) / 2;
    }
    const double doc_flops = 2.0 * 2.0 * B * H * doc_pairs * hd;
    report<T>(
        "attention forward, docs T/4",
        time_it(R, [&] { pv::attention_forward(qkv, positions, att, lse, att_scratch, B, Tn, H, Hkv, hd, nullptr); }),
        att_bytes + N * 4.0, doc_flops, on_gpu);
    report<T>("attention backward, docs T/4",
              time_it(R,
                      [&] {
                          pv::attention_backward(qkv, positions, att, datt, lse, dqkv, att_scratch, B, Tn, H, Hkv, hd,
                                                 nullptr);
                      }),
              att_bytes_back + N * 4.0, 2.5 * doc_flops, on_gpu);
    // Generation: one new row against a KV cache of T positions (kernels/attention_decode.cuh),
    // which reads every cached key and value once per head group.
    T* k_cache = random_buffer<T>((long long)Tn * Hkv * hd, 19);
    T* v_cache = random_buffer<T>((long long)Tn * Hkv * hd, 20);
    const size_t decode_scratch_bytes = pv::attention_decode_scratch_bytes<T>(1, Tn, H, Hkv, hd);
    void* decode_scratch = decode_scratch_bytes ? alloc(decode_scratch_bytes) : nullptr;
    report<T>("attention decode (1 row)",
              time_it(R,
                      [&] {
                          pv::attention_decode(qkv, qkv_w, k_cache, v_cache, att, 1, Tn - 1, H, Hkv, hd, decode_scratch,
                                               decode_scratch_bytes, nullptr);
                      }),
              2.0 * Tn * Hkv * hd * t + 2.0 * q_w * t, 2.0 * 2.0 * H * double(Tn) * hd, on_gpu);
    report<T>("matmul qkv backward",
              time_it(R, [&] { pv::matmul_backward(handle, dqkv, x, wqkv, dx, dwqkv, N, C, qkv_w, false, nullptr); }),
              (2.0 * N * C + 2.0 * qkv_w * C + double(N) * qkv_w) * t, 2.0 * gemm_qkv, on_gpu);

    // MLP: gate/up projection, SwiGLU, down projection.
    T* gate_up = random_buffer<T>(N * 2 * F, 13);
    T* act = random_buffer<T>(N * F, 14);
    T* dgate_up = random_buffer<T>(N * 2 * F, 15);
    T* wgu = random_buffer<T>(2LL * F * C, 16);
    T* dwgu = random_buffer<T>(2LL * F * C, 17);
    report<T>("matmul gate_up forward",
              time_it(R, [&] { pv::matmul_forward(handle, x, wgu, gate_up, N, C, 2 * F, nullptr); }),
              (double(N) * C + 2.0 * F * C + 2.0 * N * F) * t, 2.0 * N * C * 2.0 * F, on_gpu);
    report<T>("swiglu forward", time_it(R, [&] { pv::swiglu_forward(gate_up, act, N, F, nullptr); }), 3.0 * N * F * t,
              5.0 * N * F, on_gpu);
    report<T>("swiglu backward", time_it(R, [&] { pv::swiglu_backward(gate_up, act, dgate_up, N, F, nullptr); }),
              5.0 * N * F * t, 10.0 * N * F, on_gpu);
    report<T>("matmul gate_up backward",
              time_it(R, [&] { pv::matmul_backward(handle, dgate_up, x, wgu, dx, dwgu, N, C, 2 * F, false, nullptr); }),
              (2.0 * N * C + 4.0 * F * C + 2.0 * N * F) * t, 2.0 * 2.0 * N * C * 2.0 * F, on_gpu);

    // The gradient norm's squares over one weight gradient (gate_up's, 2F x C), as the optimizer
    // step forms them for every tensor: the partials kernel and the one-block sum (kernels/glue.cuh).
    const long long ngu = 2LL * F * C;
    void* sumsq_scratch = alloc(pv::sum_of_squares_scratch_bytes<T>(ngu));
    auto* sumsq = static_cast<double*>(alloc(sizeof(double)));
    const double partials = double(pv::sum_of_squares_scratch_bytes<T>(ngu) / sizeof(double));
    report<T>("gradient norm (gate_up)",
              time_it(R, [&] { pv::sum_of_squares(dwgu, ngu, sumsq, sumsq_scratch, nullptr); }),
              double(ngu) * t + 2.0 * partials * 8 + 8, 2.0 * double(ngu), on_gpu);

    // Head: logits and the fused softmax + cross-entropy.
    T* logits = random_buffer<T>(N * V, 18);
    A* row_loss = static_cast<A*>(alloc(size_t(N) * sizeof(A)));
    auto* row_stats = static_cast<pv::CrossEntropyStats<A>*>(alloc(size_t(N) * 2 * sizeof(A)));
    A* loss_sum = static_cast<A*>(alloc(sizeof(A)));
    int* count = static_cast<int*>(alloc(sizeof(int)));
    report<T>("matmul lm_head forward",
              time_it(R, [&] { pv::matmul_forward(handle, x, wte, logits, N, C, V, nullptr); }),
              (double(N) * C + double(V) * C + double(N) * V) * t, 2.0 * N * C * V, on_gpu);
    report<T>("cross-entropy forward",
              time_it(R,
                      [&] {
                          pv::cross_entropy_forward(logits, tokens, row_loss, row_stats, loss_sum, count, N, V, -100,
                                                    nullptr);
                      }),
              double(N) * V * t + N * 4.0 + 3.0 * N * a, 3.0 * N * V, on_gpu);
    report<T>("cross-entropy backward",
              time_it(R,
                      [&] {
                          pv::cross_entropy_backward(logits, tokens, row_stats, logits, N, V, -100, 1.0 / double(N),
                                                     nullptr);
                      }),
              2.0 * double(N) * V * t + N * 4.0 + 2.0 * N * a, 4.0 * N * V, on_gpu);
    // The fused linear cross-entropy's pass (the head runs it on a chunk of rows; here on all N):
    // the row read twice, the second time from L2, so its DRAM bytes are one read and one write.
    report<T>("cross-entropy loss and gradient (one pass)",
              time_it(R,
                      [&] {
                          pv::cross_entropy_loss_and_gradient(logits, tokens, row_loss, row_stats, N, V, -100,
                                                              1.0 / double(N), nullptr);
                      }),
              2.0 * double(N) * V * t + N * 4.0 + 3.0 * N * a, 7.0 * N * V, on_gpu);

    for (void* p : std::initializer_list<void*>{tokens,
                                                wte,
                                                x,
                                                y,
                                                dx,
                                                w,
                                                dw,
                                                dwte,
                                                rstd,
                                                norm_scratch,
                                                embedding_scratch,
                                                qkv,
                                                wqkv,
                                                dwqkv,
                                                att,
                                                datt,
                                                dqkv,
                                                lse,
                                                att_scratch,
                                                rope_values_d,
                                                gate_up,
                                                act,
                                                dgate_up,
                                                wgu,
                                                dwgu,
                                                sumsq_scratch,
                                                sumsq,
                                                logits,
                                                row_loss,
                                                row_stats,
                                                loss_sum,
                                                count,
                                                k_cache,
                                                v_cache,
                                                decode_scratch,
                                                positions})
        pv::memory_free(p);
    CUBLAS_CHECK(cublasDestroy(handle));
    run_nf4<T>(c, o, on_gpu);
}

}  // namespace kernels_bench

int main(int argc, char** argv) {
    using namespace kernels_bench;
    const Options o = parse(argc, argv);
    g_dry_run = o.dry_run;
    pv::LlamaConfig config;
    try {
        config = pv::preset(o.shape);
        if (o.tp > 1) config = pv::tensor_parallel_shape(config, pv::TensorParallel{.size = o.tp});
    } catch (const std::exception& e) {
        usage(e.what());
    }
    if (o.seq > config.max_seq_len) usage("--seq exceeds the model's max_seq_len");
    pv::with_dtype(o.dtype, [&](auto tag) { run<typename decltype(tag)::type>(config, o); });
    return 0;
}
