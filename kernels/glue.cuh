// Small kernels the training step needs between the big ones. All are deterministic.
//
// Elementwise (memory-bound, no reductions; 16-byte vectors through kernels/vec.cuh when the
// pointers are 16-byte aligned, element by element otherwise; the same arithmetic per element
// either way, so the results are bit-identical to a one-element-per-thread loop):
//   cast             out[i] = round_To(in[i])                 conversions between bf16, fp32, fp64:
//                    widening is exact; narrowing rounds to nearest even, once (fp64 -> bf16 goes
//                    directly, not through fp32, which would round twice)
//   scale_inplace    x[i] = x[i] · factor                      in acc_t<T>, rounded once
//   add              out[i] = a[i] + b[i]                      out may alias a or b (residual adds):
//                    each thread reads both inputs before writing its own element, and no thread
//                    touches another's element
//   accumulate       acc[i] += x[i]                            gradient accumulation, also into a
//                    wider buffer (float acc, bf16 x: the fp32 gradient-accumulation buffer); the
//                    sum is formed in acc's accumulator type and rounded once
//   fill             x[i] = value
// None has a backward of its own: they are linear glue whose adjoints are themselves (add's
// gradient flows to both inputs unchanged, scale's is scale, cast's is a cast back).
//
// Reductions:
//   count_targets    *count = #{ i : targets[i] != ignore_index }  (the loss normaliser, DESIGN.md §4)
//     One block of kCountBlock threads strides over the targets, each counting in an int, then a
//     block_sum. No atomics at all: one launch, a fixed order (and integer sums are exact anyway).
//     A step's token count is far below 2^31.
//   sum_of_squares   *out = Σ x[i]²   (squared gradient norms for clipping)
//   sum_of_squares_accumulate   *out += Σ x[i]²   (the same sum, added to *out)
//     Two launches on one stream. The partition of the elements is a function of n only (never of
//     the device's SM count, the host's worker count or the pointer's alignment): the elements
//     form groups of V = kVec<T> (16 bytes: 8 bf16, 4 float, 2 double), group k being elements
//     [kV, kV + V), the last one short when V does not divide n; P = min(ceil(n /
//     kSumSqMinPerBlock), kSumSqMaxBlocks) blocks of kSumSqBlock threads, thread t of block b taking
//     the groups k ≡ b·kSumSqBlock + t (mod P·kSumSqBlock) in increasing order, each group's
//     elements in increasing order. When x is 16-byte aligned a thread reads a group with one
//     16-byte load (kUnroll of them in flight); otherwise element by element, adding the same
//     squares in the same order, so both paths give the same bits. Each thread accumulates x² in
//     acc_t<T>; a block_sum (fixed butterfly, then warps in order) gives the block's partial in
//     acc_t<T>, stored as a double in `scratch[b]`. One block then sums the P partials in double:
//     thread t adds partials t, t + kSumSqBlock, ... in index order, then a block_sum. Every
//     addition therefore happens in an order fixed by n, so the result is bitwise reproducible
//     across runs, thread and block schedules and worker counts. No atomics.
//     The accumulate variant is how the norm of many tensors is formed: zero *out (or call
//     sum_of_squares for the first tensor), then sum_of_squares_accumulate each other tensor on the
//     same stream; the total is (((s0 + s1) + s2) + ...) in the call order, deterministic given
//     that order. `scratch` holds sum_of_squares_scratch_bytes<T>(n) bytes (at most
//     kSumSqMaxBlocks doubles, so one buffer of sum_of_squares_scratch_bytes<T>(largest n) serves
//     every call on the stream: stream order keeps successive calls from overlapping).
#pragma once

#include "kernels/common.cuh"
#include "kernels/vec.cuh"

namespace pv {

// The conversion of one value: widening exactly, narrowing with one round to nearest even.
template <class From, class To>
__host__ __device__ inline To cast_value(From v) {
    if constexpr (std::is_same_v<From, To>) {
        return v;
    } else if constexpr (std::is_same_v<To, __nv_bfloat16>) {
        if constexpr (std::is_same_v<From, double>)
            return __double2bfloat16(v);  // one rounding
        else
            return __float2bfloat16(v);  // From is float
    } else if constexpr (std::is_same_v<From, __nv_bfloat16>) {
        return To(__bfloat162float(v));  // exact into float, then exact into double
    } else {
        return To(v);  // float <-> double: exact widening or one round to nearest even
    }
}

// The elementwise operations (kernels/vec.cuh): 16-byte vectors of the widest type involved.
template <class From, class To>
struct CastOp {
    static constexpr int kWidth = kVec<std::conditional_t<(sizeof(From) > sizeof(To)), From, To>>;
    const From* in;
    To* out;
    template <int W>
    struct In {
        Vec<From, W> x;
    };
    template <int W, class I>
    __device__ In<W> load(I i) const {
        return {load_vec<W>(in + i)};
    }
    template <int W, class I>
    __device__ void store(I i, const In<W>& x) const {
        Vec<To, W> y;
        for (int k = 0; k < W; ++k) y.v[k] = cast_value<From, To>(x.x.v[k]);
        store_vec<W>(out + i, y);
    }
};

template <class T>
struct ScaleOp {
    static constexpr int kWidth = kVec<T>;
    T* x;
    acc_t<T> factor;
    template <int W>
    struct In {
        Vec<T, W> x;
    };
    template <int W, class I>
    __device__ In<W> load(I i) const {
        return {load_vec<W>(x + i)};
    }
    template <int W, class I>
    __device__ void store(I i, const In<W>& in) const {
        Vec<T, W> y;
        for (int k = 0; k < W; ++k) y.v[k] = from_acc<T>(to_acc(in.x.v[k]) * factor);
        store_vec<W>(x + i, y);
    }
};

// out may be a or b: each chunk is read whole before it is written, by the thread that writes it.
template <class T>
struct AddOp {
    static constexpr int kWidth = kVec<T>;
    const T* a;
    const T* b;
    T* out;
    template <int W>
    struct In {
        Vec<T, W> a, b;
    };
    template <int W, class I>
    __device__ In<W> load(I i) const {
        return {load_vec<W>(a + i), load_vec<W>(b + i)};
    }
    template <int W, class I>
    __device__ void store(I i, const In<W>& in) const {
        Vec<T, W> y;
        for (int k = 0; k < W; ++k) y.v[k] = from_acc<T>(to_acc(in.a.v[k]) + to_acc(in.b.v[k]));
        store_vec<W>(out + i, y);
    }
};

template <class Acc, class X>
struct AccumulateOp {
    static constexpr int kWidth = kVec<Acc>;  // Acc is at least as wide as X
    Acc* acc;
    const X* x;
    template <int W>
    struct In {
        Vec<Acc, W> acc;
        Vec<X, W> x;
    };
    template <int W, class I>
    __device__ In<W> load(I i) const {
        return {load_vec<W>(acc + i), load_vec<W>(x + i)};
    }
    template <int W, class I>
    __device__ void store(I i, const In<W>& in) const {
        Vec<Acc, W> y;
        for (int k = 0; k < W; ++k) y.v[k] = from_acc<Acc>(to_acc(in.acc.v[k]) + acc_t<Acc>(to_acc(in.x.v[k])));
        store_vec<W>(acc + i, y);
    }
};

template <class T>
struct FillOp {
    static constexpr int kWidth = kVec<T>;
    T* x;
    T value;
    template <int W>
    struct In {};
    template <int W, class I>
    __device__ In<W> load(I) const {
        return {};
    }
    template <int W, class I>
    __device__ void store(I i, const In<W>&) const {
        Vec<T, W> y;
        for (int k = 0; k < W; ++k) y.v[k] = value;
        store_vec<W>(x + i, y);
    }
};

// One block: every thread counts a strided share, then the block sums the counts.
inline constexpr int kCountBlock = 512;

__global__ inline void count_targets_kernel(const int* targets, long long n, int ignore_index, int* count) {
    __shared__ int scratch[32];
    int c = 0;
    for (long long i = threadIdx.x; i < n; i += blockDim.x) c += targets[i] != ignore_index ? 1 : 0;
    c = block_sum(c, scratch);  // every thread reaches it: no early exit above
    if (threadIdx.x == 0) *count = c;
}

// The fixed partition of sum_of_squares (see the header comment).
inline constexpr int kSumSqBlock = 256;
inline constexpr long long kSumSqMinPerBlock = 8LL * kSumSqBlock;  // no block with fewer than 8 per thread
inline constexpr int kSumSqMaxBlocks = 1024;                       // about one wave on an H100

inline int sum_of_squares_blocks(long long n) {
    const long long blocks = (n + kSumSqMinPerBlock - 1) / kSumSqMinPerBlock;
    return int(blocks < kSumSqMaxBlocks ? blocks : kSumSqMaxBlocks);
}

// partials[b] = the sum of x² over block b's groups (see the header comment), in acc_t<T>, then
// widened to double. Vector: x is 16-byte aligned, so a whole group is one 16-byte load.
template <class T, bool Vector>
__global__ void sum_of_squares_partials_kernel(const T* x, long long n, double* partials) {
    using A = acc_t<T>;
    constexpr int V = kVec<T>;
    __shared__ A scratch[32];
    const long long whole = n / V;  // whole groups; group `whole` is the short one (n mod V elements)
    const long long stride = (long long)gridDim.x * blockDim.x;
    const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    A s = 0;
    for (long long k = first; k < whole; k += kUnroll * stride) {
        Vec<T, V> in[kUnroll] = {};  // (initialised only to quiet g++: every one read is loaded)
        for (int u = 0; u < kUnroll; ++u) {
            if (k + u * stride >= whole) break;
            const T* group = x + (k + u * stride) * V;
            if constexpr (Vector) {
                in[u] = load_vec<V>(group);
            } else {
                for (int e = 0; e < V; ++e) in[u].v[e] = group[e];
            }
        }
        for (int u = 0; u < kUnroll; ++u) {
            if (k + u * stride >= whole) break;
            for (int e = 0; e < V; ++e) {
                const A v = to_acc(in[u].v[e]);
                s += v * v;
            }
        }
    }
    // The short group, last in the order of the thread whose groups it continues.
    if (whole * V < n && whole >= first && (whole - first) % stride == 0)
        for (long long i = whole * V; i < n; ++i) {
            const A v = to_acc(x[i]);
            s += v * v;
        }
    s = block_sum(s, scratch);
    if (threadIdx.x == 0) partials[blockIdx.x] = double(s);
}

// One block: *out = (accumulate ? *out : 0) + Σ partials, in double, in a fixed order.
__global__ inline void sum_of_squares_final_kernel(const double* partials, int count, double* out, bool accumulate) {
    __shared__ double scratch[32];
    double s = 0;
    for (int i = threadIdx.x; i < count; i += blockDim.x) s += partials[i];
    s = block_sum(s, scratch);
    if (threadIdx.x == 0) *out = accumulate ? *out + s : s;
}

// ---- launchers --------------------------------------------------------------------------------

inline constexpr int kGlueBlock = 256;

// out[n] = in[n] converted to To (round to nearest even when narrowing).
template <class From, class To>
void cast(const From* in, To* out, long long n, cudaStream_t stream) {
    launch_elementwise(CastOp<From, To>{in, out}, n, vec_aligned({in, out}), stream);
}

// x[n] *= factor.
template <class T>
void scale_inplace(T* x, acc_t<T> factor, long long n, cudaStream_t stream) {
    launch_elementwise(ScaleOp<T>{x, factor}, n, vec_aligned({x}), stream);
}

// out[n] = a[n] + b[n]; out may be a or b.
template <class T>
void add(const T* a, const T* b, T* out, long long n, cudaStream_t stream) {
    launch_elementwise(AddOp<T>{a, b, out}, n, vec_aligned({a, b, out}), stream);
}

// acc[n] += x[n]; x may be narrower than acc (bf16 gradients into a float buffer).
template <class Acc, class X>
void accumulate(Acc* acc, const X* x, long long n, cudaStream_t stream) {
    static_assert(sizeof(X) <= sizeof(Acc), "accumulate into a buffer at least as wide as the input");
    launch_elementwise(AccumulateOp<Acc, X>{acc, x}, n, vec_aligned({acc, x}), stream);
}

// A weight gradient's share from scratch: grad[n] += x[n], or grad[n] = x[n] (a copy) when the
// step's first writer overwrites (kernels/common.cuh GradWrite).
template <class T>
void write_grad(T* grad, const T* x, long long n, GradWrite mode, cudaStream_t stream) {
    if (mode == GradWrite::add) return accumulate(grad, x, n, stream);
    CUDA_CHECK(cudaMemcpyAsync(grad, x, size_t(n) * sizeof(T), cudaMemcpyDeviceToDevice, stream));
}

// x[n] = value.
template <class T>
void fill(T* x, T value, long long n, cudaStream_t stream) {
    launch_elementwise(FillOp<T>{x, value}, n, vec_aligned({x}), stream);
}

// *count (one device int) = the number of targets[n] different from ignore_index. No atomics.
inline void count_targets(const int* targets, long long n, int ignore_index, int* count, cudaStream_t stream) {
    launch(count_targets_kernel, dim3(1), dim3(kCountBlock), 0, stream, targets, n, ignore_index, count);
    CUDA_CHECK_LAUNCH();
}

// Bytes of device scratch sum_of_squares(_accumulate) needs for n elements (0 when n == 0).
template <class T>
size_t sum_of_squares_scratch_bytes(long long n) {
    return size_t(n > 0 ? sum_of_squares_blocks(n) : 0) * sizeof(double);
}

// *out (one device double) = Σ x[n]², or += with accumulate; the common body of the two below.
template <class T>
void sum_of_squares_launch(const T* x, long long n, double* out, void* scratch, bool accumulate, cudaStream_t stream) {
    const int blocks = n > 0 ? sum_of_squares_blocks(n) : 0;
    double* partials = static_cast<double*>(scratch);
    if (blocks > 0) {
        auto* partials_kernel = vec_aligned({x}) ? sum_of_squares_partials_kernel<T, true>
                                                 : sum_of_squares_partials_kernel<T, false>;
        launch(partials_kernel, dim3(blocks), dim3(kSumSqBlock), 0, stream, x, n, partials);
        CUDA_CHECK_LAUNCH();
    }
    launch(sum_of_squares_final_kernel, dim3(1), dim3(kSumSqBlock), 0, stream, partials, blocks, out, accumulate);
    CUDA_CHECK_LAUNCH();
}

// *out (one device double) = Σ x[n]²; scratch: sum_of_squares_scratch_bytes<T>(n) device bytes.
template <class T>
void sum_of_squares(const T* x, long long n, double* out, void* scratch, cudaStream_t stream) {
    sum_of_squares_launch(x, n, out, scratch, false, stream);
}

// *out += Σ x[n]², for the norm of many tensors (deterministic given the call order).
template <class T>
void sum_of_squares_accumulate(const T* x, long long n, double* out, void* scratch, cudaStream_t stream) {
    sum_of_squares_launch(x, n, out, scratch, true, stream);
}

}  // namespace pv
