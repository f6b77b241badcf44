// A LoRA adapter on a (possibly fused) frozen linear, forward and backward (model/lora.h has the
// layout and why it is fused this way). With P targeted parts of the base weight's output rows,
// A [P·r][in] stacked, B [out_P][r] stacked by rows, s the scale, d = drop(x):
//
// Forward (after the base GEMM wrote y = x·Wᵀ):
//   u = d·Aᵀ                                   [N][P·r], saved for the backward
//   y[:, part p] += s·u[:, p]·B_pᵀ             p = 0..P−1, into the part's columns of y
// Backward, with dy the gradient of y (after the base GEMM wrote dx = dy·W):
//   du[:, p] = s·dy[:, part p]·B_p             [N][P·r]
//   dB_p    += s·dy[:, part p]ᵀ·u[:, p]
//   dA      += duᵀ·d                           (d regenerated: the mask is a function of its key)
//   dx      += drop'(du·A)                     (the same mask and 1/(1 − p) scale)
//
// Dropout (PEFT's nn.Dropout on the adapter's input): element (n, i) is kept with probability
// 1 − p and scaled by 1/(1 − p), by a Philox draw keyed by (seed, dropout, tensor, (first_row + n)·in
// + i, step) — the token's global row, not its place in this rank's micro-batch, so every strategy
// and world size draws the same mask. A tensor-parallel rank's input of a row-parallel linear is
// columns [col_begin, col_begin + in) of the whole input's key_in: its element (n, i) is keyed as
// the whole input's (n, col_begin + i), so every tensor-parallel layout draws the same mask too.
#pragma once

#include "kernels/common.cuh"
#include "kernels/vec.cuh"
#include "kernels/matmul.cuh"
#include "kernels/philox.cuh"

namespace pv {

inline constexpr int kLoraMaxParts = 3;

// One linear's adapter: the base weight's shape, the targeted parts' output rows and their rows
// in the stacked B, the rank and the scale.
struct LoraShape {
    int in = 0, out = 0, rank = 0, parts = 0;
    struct Part {
        int out_begin = 0, rows = 0, b_begin = 0;
    } part[kLoraMaxParts];
    double scale = 1;
    int a_rows() const { return parts * rank; }
};

// The dropout of one micro-batch: off when p == 0 (evaluation, inference, or none asked for).
struct LoraDropout {
    double p = 0;
    uint64_t seed = 0;
    uint32_t step = 0;
    long long first_row = 0;  // the global row (sample · seq_len) of the micro-batch's first token
    int key_in = 0;           // the whole input's columns (0: the input is whole)
    int col_begin = 0;        // where this input's columns start in the whole input
    // Where set, device memory holding {first_row, step}, read by the kernel in place of the two
    // (DeviceBatch::dropout_keys); lora_keep takes the values, resolved().
    const long long* keys = nullptr;
    bool on() const { return p > 0; }
    __device__ LoraDropout resolved() const {
        LoraDropout d = *this;
        if (keys) d.first_row = keys[0], d.step = uint32_t(keys[1]), d.keys = nullptr;
        return d;
    }
};

__host__ __device__ inline bool lora_keep(const LoraDropout& d, uint32_t tensor, long long row, int col, int in) {
    const long long cols = d.key_in > 0 ? d.key_in : in;
    return philox_uniform(d.seed, RandomPurpose::dropout, tensor,
                          uint64_t((d.first_row + row) * cols + d.col_begin + col), d.step) >= d.p;
}

// out[n][i] = x[n][i]·keep/(1 − p)   (accumulate: out += instead of =), as an elementwise
// operation (kernels/vec.cuh) over the N·in elements: 16-byte vectors of x (and out) when `in` is
// a multiple of the width, the mask drawn per element as before; bit for bit the same results.
template <class T>
struct LoraDropoutOp {
    static constexpr int kWidth = kVec<T>;
    const T* x;
    T* out;
    int in;
    LoraDropout d;
    uint32_t tensor;
    bool accumulate;
    template <int W>
    struct In {
        Vec<T, W> x, out;
    };
    template <int W, class I>
    __device__ In<W> load(I i) const {
        In<W> v;
        v.x = load_vec<W>(x + i);
        if (accumulate) v.out = load_vec<W>(out + i);
        return v;
    }
    template <int W, class I>
    __device__ void store(I i, const In<W>& v) const {
        using A = acc_t<T>;
        const I row = i / in;
        const int col = int(i - row * in);
        const LoraDropout key = d.resolved();
        Vec<T, W> y;
        for (int k = 0; k < W; ++k) {
            const A kept = lora_keep(key, tensor, row, col + k, in) ? to_acc(v.x.v[k]) / A(1 - d.p) : A(0);
            y.v[k] = from_acc<T>(accumulate ? to_acc(v.out.v[k]) + kept : kept);
        }
        store_vec<W>(out + i, y);
    }
};

template <class T>
void lora_dropout(const T* x, T* out, long long N, int in, const LoraDropout& d, uint32_t tensor, bool accumulate,
                  cudaStream_t stream) {
    const bool vector = in % kVec<T> == 0 && vec_aligned({x, out});
    launch_elementwise(LoraDropoutOp<T>{x, out, in, d, tensor, accumulate}, N * in, vector, stream);
}

// The first half of the adapter's forward: u = drop(x)·Aᵀ [N][a_rows], what the backward keeps;
// `dropped` [N][in] workspace used when dropout is on. `tensor`: A's tensor id (keys the mask).
// Alone it is what activation checkpointing recomputes of a linear whose output is not needed.
template <class T>
void lora_project_input(cublasHandle_t h, const T* x, const T* a, T* u, T* dropped, long long N, const LoraShape& s,
                        const LoraDropout& d, uint32_t tensor, cudaStream_t stream) {
    const T* in = x;
    if (d.on()) lora_dropout(x, dropped, N, s.in, d, tensor, false, stream), in = dropped;
    const int pr = s.a_rows();
    gemm_x_wt(h, in, s.in, a, s.in, u, pr, N, s.in, pr, 1.0, 0.0, stream);
}

// The adapter's forward on top of y = x·Wᵀ: u saved (lora_project_input), then y += s·u·Bᵀ.
template <class T>
void lora_forward(cublasHandle_t h, const T* x, const T* a, const T* b, T* y, T* u, T* dropped, long long N,
                  const LoraShape& s, const LoraDropout& d, uint32_t tensor, cudaStream_t stream) {
    lora_project_input(h, x, a, u, dropped, N, s, d, tensor, stream);
    const int pr = s.a_rows();
    for (int p = 0; p < s.parts; ++p)
        gemm_x_wt(h, u + p * s.rank, pr, b + (long long)s.part[p].b_begin * s.rank, s.rank, y + s.part[p].out_begin,
                  s.out, N, s.rank, s.part[p].rows, s.scale, 1.0, stream);
}

// The adapter's backward on top of dx = dy·W: dA and dB accumulate, or are written over when
// `grad_write` says so (null: skipped); dx gets the adapter's share added. Workspace: du
// [N][a_rows], and with dropout `dropped` [N][in] (the input's mask regenerated, then reused for
// du·A).
template <class T>
void lora_backward(cublasHandle_t h, const T* dy, const T* x, const T* a, const T* b, const T* u, T* dx, T* da, T* db,
                   T* du, T* dropped, long long N, const LoraShape& s, const LoraDropout& d, uint32_t tensor,
                   cudaStream_t stream, GradWrite grad_write = GradWrite::add) {
    const double beta = beta_of(grad_write);
    const int pr = s.a_rows();
    for (int p = 0; p < s.parts; ++p) {
        const T* dy_p = dy + s.part[p].out_begin;
        const T* b_p = b + (long long)s.part[p].b_begin * s.rank;
        gemm_dy_w(h, dy_p, s.out, b_p, s.rank, du + p * s.rank, pr, N, s.rank, s.part[p].rows, s.scale, 0.0, stream);
        if (db)
            gemm_dyt_x(h, dy_p, s.out, u + p * s.rank, pr, db + (long long)s.part[p].b_begin * s.rank, s.rank, N,
                       s.rank, s.part[p].rows, s.scale, beta, stream);
    }
    if (da) {
        const T* in = x;
        if (d.on()) lora_dropout(x, dropped, N, s.in, d, tensor, false, stream), in = dropped;
        gemm_dyt_x(h, du, pr, in, s.in, da, s.in, N, s.in, pr, 1.0, beta, stream);
    }
    if (!dx) return;
    if (d.on()) {
        gemm_dy_w(h, du, pr, a, s.in, dropped, s.in, N, s.in, pr, 1.0, 0.0, stream);
        lora_dropout(dropped, dx, N, s.in, d, tensor, true, stream);
    } else {
        gemm_dy_w(h, du, pr, a, s.in, dx, s.in, N, s.in, pr, 1.0, 1.0, stream);
    }
}

}  // namespace pv
