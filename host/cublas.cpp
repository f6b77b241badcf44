// The cuBLAS subset polevault uses, implemented on the CPU with OpenBLAS (host backend).
//
// Product code calls cuBLAS exactly as on a GPU; these definitions carry NVIDIA's signatures from
// <cublas_v2.h>. Supported:
//   - handle management: create/destroy, stream, math mode, workspace (ignored), pointer mode
//     (CUBLAS_POINTER_MODE_HOST only: setting DEVICE returns CUBLAS_STATUS_NOT_SUPPORTED, so a
//     caller relying on device-side scalars fails loudly instead of reading them at the wrong time);
//   - cublasGemmEx / cublasGemmStridedBatchedEx, column-major, for
//       A,B,C fp64, compute 64F(_PEDANTIC)                         -> cblas_dgemm
//       A,B,C fp32, compute 32F(_PEDANTIC, _FAST_TF32/16BF/16F)    -> cblas_sgemm, always in fp32
//       A,B bf16, C bf16 or fp32, compute 32F(_PEDANTIC)           -> widened to fp32, cblas_sgemm,
//                                                                     bf16 C rounded to nearest even
//     Any other combination is CUBLAS_STATUS_NOT_SUPPORTED. The algo argument is ignored.
//
// Argument checks follow the cuBLAS documentation of cublas<t>gemm / cublasGemmEx (confirmed against
// the documented error table: INVALID_VALUE "if m, n, k < 0 or if transa, transb != CUBLAS_OP_N,
// CUBLAS_OP_C, CUBLAS_OP_T or if lda < max(1, m) if transa == CUBLAS_OP_N and lda < max(1, k)
// otherwise or if ldb < max(1, k) if transb == CUBLAS_OP_N and ldb < max(1, n) otherwise or if
// ldc < max(1, m) or if alpha, beta == NULL"; NOT_SUPPORTED for
// "the combination of the parameters Atype, Btype and Ctype"; and "if beta == 0, C does not have to
// be a valid input"). One exception to the documentation, measured: cuBLAS 13.0 on an H100 returns
// SUCCESS for a negative batchCount of the strided-batched form (documented as INVALID_VALUE), and
// so does this, computing nothing. They run synchronously, at the call; the arithmetic is queued on the handle's
// stream through pv::host::stream_submit, like a kernel launch.
//
// OpenBLAS's own thread count is left alone (tests pin it with OPENBLAS_NUM_THREADS).

#include <cblas.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include "host/stream.h"

#include <algorithm>
#include <cstdlib>
#include <cstddef>
#include <cstdint>
#include <vector>

// The handle: the header only forward-declares it.
struct cublasContext {
    cudaStream_t stream = nullptr;  // the legacy default stream, as after a real cublasCreate
    cublasMath_t math_mode = CUBLAS_DEFAULT_MATH;
};

namespace {

using bf16 = __nv_bfloat16;

// The GEMMs this file can do; everything else is CUBLAS_STATUS_NOT_SUPPORTED.
enum class Flavour { unsupported, f64, f32, bf16_to_bf16, bf16_to_f32 };

Flavour flavour_of(cudaDataType a, cudaDataType b, cudaDataType c, cublasComputeType_t compute) {
    if (a != b) return Flavour::unsupported;
    switch (compute) {
        case CUBLAS_COMPUTE_64F:
        case CUBLAS_COMPUTE_64F_PEDANTIC:
            return a == CUDA_R_64F && c == CUDA_R_64F ? Flavour::f64 : Flavour::unsupported;
        case CUBLAS_COMPUTE_32F:
        case CUBLAS_COMPUTE_32F_PEDANTIC:
            if (a == CUDA_R_32F && c == CUDA_R_32F) return Flavour::f32;
            if (a == CUDA_R_16BF && c == CUDA_R_16BF) return Flavour::bf16_to_bf16;
            if (a == CUDA_R_16BF && c == CUDA_R_32F) return Flavour::bf16_to_f32;
            return Flavour::unsupported;
        // The "fast" modes only allow cuBLAS to lose precision; computing in full fp32 is a valid
        // (more accurate) implementation of them. cuBLAS accepts them for fp32 data only.
        case CUBLAS_COMPUTE_32F_FAST_TF32:
        case CUBLAS_COMPUTE_32F_FAST_16BF:
        case CUBLAS_COMPUTE_32F_FAST_16F:
            return a == CUDA_R_32F && c == CUDA_R_32F ? Flavour::f32 : Flavour::unsupported;
        default: return Flavour::unsupported;
    }
}

// One validated call, held by value: the stream work may run after the caller's locals are gone.
struct Gemm {
    Flavour flavour;
    bool trans_a, trans_b;  // CUBLAS_OP_C is CUBLAS_OP_T for real data
    int m, n, k;
    double alpha, beta;  // read at the call (pointer mode HOST); exact for fp32 scalars too
    const void* a;
    int lda;
    long long stride_a;
    const void* b;
    int ldb;
    long long stride_b;
    void* c;
    int ldc;
    long long stride_c;
    int batch_count;
};

void blas_gemm(bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda, const float* b, int ldb,
               float beta, float* c, int ldc) {
    cblas_sgemm(CblasColMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda,
                b, ldb, beta, c, ldc);
}

void blas_gemm(bool ta, bool tb, int m, int n, int k, double alpha, const double* a, int lda, const double* b, int ldb,
               double beta, double* c, int ldc) {
    cblas_dgemm(CblasColMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda,
                b, ldb, beta, c, ldc);
}

// C = alpha*op(A)*op(B) + beta*C for one m x n matrix C, with A, B, C all of type T.
template <class T>
void gemm_one(const Gemm& g, T alpha, T beta, const T* a, int lda, const T* b, int ldb, T* c, int ldc) {
    if (beta == T(0)) {
        // beta == 0 means C is not an input: it may hold NaN, and 0*NaN is NaN. Zero it ourselves
        // rather than trusting how the BLAS treats beta == 0.
        for (int j = 0; j < g.n; ++j) std::fill_n(c + std::ptrdiff_t(j) * ldc, g.m, T(0));
    }
    if (g.k == 0) {
        // op(A)*op(B) is an empty sum: C = beta*C (already done above when beta == 0).
        if (beta != T(0) && beta != T(1))
            for (int j = 0; j < g.n; ++j)
                for (int i = 0; i < g.m; ++i) c[std::ptrdiff_t(j) * ldc + i] *= beta;
        return;
    }
    blas_gemm(g.trans_a, g.trans_b, g.m, g.n, g.k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// The rows x cols bf16 matrix at p (leading dimension ld) as a packed fp32 matrix (leading dimension
// rows). bf16 -> fp32 is exact.
std::vector<float> widen(const bf16* p, int rows, int cols, int ld) {
    std::vector<float> out(std::size_t(rows) * std::size_t(cols));
    for (int j = 0; j < cols; ++j)
        for (int i = 0; i < rows; ++i) out[std::size_t(j) * rows + i] = __bfloat162float(p[std::ptrdiff_t(j) * ld + i]);
    return out;
}

// bf16 inputs: OpenBLAS has no bf16 GEMM we can rely on, so widen op's operands to fp32 and use sgemm.
void gemm_bf16(const Gemm& g, const bf16* a, const bf16* b, void* c) {
    const int a_rows = g.trans_a ? g.k : g.m, a_cols = g.trans_a ? g.m : g.k;
    const int b_rows = g.trans_b ? g.n : g.k, b_cols = g.trans_b ? g.k : g.n;
    const std::vector<float> a32 = widen(a, a_rows, a_cols, g.lda);
    const std::vector<float> b32 = widen(b, b_rows, b_cols, g.ldb);
    const int lda32 = std::max(1, a_rows), ldb32 = std::max(1, b_rows);
    const float alpha = float(g.alpha), beta = float(g.beta);

    if (g.flavour == Flavour::bf16_to_f32) {
        gemm_one<float>(g, alpha, beta, a32.data(), lda32, b32.data(), ldb32, static_cast<float*>(c), g.ldc);
        return;
    }
    // bf16 C: accumulate into an fp32 copy (zeros when beta == 0, so C is never read), round once.
    bf16* cb = static_cast<bf16*>(c);
    std::vector<float> c32 =
        beta == 0.0f ? std::vector<float>(std::size_t(g.m) * std::size_t(g.n)) : widen(cb, g.m, g.n, g.ldc);
    gemm_one<float>(g, alpha, beta, a32.data(), lda32, b32.data(), ldb32, c32.data(), g.m);
    for (int j = 0; j < g.n; ++j)
        for (int i = 0; i < g.m; ++i)
            cb[std::ptrdiff_t(j) * g.ldc + i] = __float2bfloat16(c32[std::size_t(j) * g.m + i]);
}

// Matrix `i` of a strided batch (strides are in elements and may be 0 or negative).
template <class T, class Void>
T* nth(Void* p, long long stride, int i) {
    return static_cast<T*>(p) + stride * i;
}

// The stream work: every matrix of the batch, in order.
void run(const Gemm& g) {
    for (int i = 0; i < g.batch_count; ++i) {
        switch (g.flavour) {
            case Flavour::f64:
                gemm_one<double>(g, g.alpha, g.beta, nth<const double>(g.a, g.stride_a, i), g.lda,
                                 nth<const double>(g.b, g.stride_b, i), g.ldb, nth<double>(g.c, g.stride_c, i), g.ldc);
                break;
            case Flavour::f32:
                gemm_one<float>(g, float(g.alpha), float(g.beta), nth<const float>(g.a, g.stride_a, i), g.lda,
                                nth<const float>(g.b, g.stride_b, i), g.ldb, nth<float>(g.c, g.stride_c, i), g.ldc);
                break;
            case Flavour::bf16_to_bf16:
                gemm_bf16(g, nth<const bf16>(g.a, g.stride_a, i), nth<const bf16>(g.b, g.stride_b, i),
                          nth<bf16>(g.c, g.stride_c, i));
                break;
            case Flavour::bf16_to_f32:
                gemm_bf16(g, nth<const bf16>(g.a, g.stride_a, i), nth<const bf16>(g.b, g.stride_b, i),
                          nth<float>(g.c, g.stride_c, i));
                break;
            case Flavour::unsupported: break;  // rejected at the call
        }
    }
}

bool valid_op(cublasOperation_t op) { return op == CUBLAS_OP_N || op == CUBLAS_OP_T || op == CUBLAS_OP_C; }

// Both public GEMMs: cublasGemmEx is the batch of one.
cublasStatus_t gemm(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
                    const void* alpha, const void* A, cudaDataType Atype, int lda, long long strideA, const void* B,
                    cudaDataType Btype, int ldb, long long strideB, const void* beta, void* C, cudaDataType Ctype,
                    int ldc, long long strideC, int batchCount, cublasComputeType_t computeType) {
    if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!valid_op(transa) || !valid_op(transb) || m < 0 || n < 0 || k < 0) return CUBLAS_STATUS_INVALID_VALUE;
    const bool ta = transa != CUBLAS_OP_N, tb = transb != CUBLAS_OP_N;
    // Checked even when a dimension is 0 (the max(1, ...) in the documented bounds), as BLAS does.
    if (lda < std::max(1, ta ? k : m) || ldb < std::max(1, tb ? n : k) || ldc < std::max(1, m))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (alpha == nullptr || beta == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    const Flavour flavour = flavour_of(Atype, Btype, Ctype, computeType);
    if (flavour == Flavour::unsupported) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (m == 0 || n == 0 || batchCount <= 0) return CUBLAS_STATUS_SUCCESS;  // nothing to compute or write
    // Stricter than cuBLAS, which would fault later on the device: a null matrix that will be
    // dereferenced is reported here instead of crashing the host inside the stream work.
    if (C == nullptr || (k > 0 && (A == nullptr || B == nullptr))) return CUBLAS_STATUS_INVALID_VALUE;

    Gemm g{flavour, ta, tb, m, n, k, 0.0, 0.0, A, lda, strideA, B, ldb, strideB, C, ldc, strideC, batchCount};
    // Pointer mode HOST: the scalars are read now, so the caller may reuse them once we return.
    if (flavour == Flavour::f64) {
        g.alpha = *static_cast<const double*>(alpha);
        g.beta = *static_cast<const double*>(beta);
    } else {
        g.alpha = *static_cast<const float*>(alpha);
        g.beta = *static_cast<const float*>(beta);
    }
    // (A capture's refusal: the legacy stream used while a blocking stream captures.)
    if (pv::host::stream_submit(handle->stream, [g] { run(g); }) != cudaSuccess) return CUBLAS_STATUS_EXECUTION_FAILED;
    return CUBLAS_STATUS_SUCCESS;
}

}  // namespace

extern "C" {

cublasStatus_t cublasCreate_v2(cublasHandle_t* handle) {
    if (handle == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    // OpenBLAS's own threads busy-wait (sched_yield) after every GEMM and steal the cores the
    // emulated kernels run on; the host's GEMMs are small, so one thread is faster overall.
    // OPENBLAS_NUM_THREADS, when set, still decides.
    static const bool single_threaded = [] {
        if (!std::getenv("OPENBLAS_NUM_THREADS")) openblas_set_num_threads(1);
        return true;
    }();
    (void)single_threaded;
    *handle = new cublasContext{};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
    if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
    // Queued GEMMs captured everything by value, so nothing pending refers to the handle.
    delete handle;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t streamId) {
    if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!pv::host::stream_is_valid(streamId)) return CUBLAS_STATUS_INVALID_VALUE;
    handle->stream = streamId;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetStream_v2(cublasHandle_t handle, cudaStream_t* streamId) {
    if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (streamId == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    *streamId = handle->stream;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
    if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
    // A base mode, optionally with the DISALLOW_REDUCED_PRECISION_REDUCTION flag. Stored for
    // cublasGetMathMode (the header's computeType migration reads it); the arithmetic ignores it.
    switch (mode & ~CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION) {
        case CUBLAS_DEFAULT_MATH:
        case CUBLAS_TENSOR_OP_MATH:
        case CUBLAS_PEDANTIC_MATH:
        case CUBLAS_TF32_TENSOR_OP_MATH:
        case CUBLAS_FP32_EMULATED_BF16X9_MATH:
        case CUBLAS_FP64_EMULATED_FIXEDPOINT_MATH: handle->math_mode = mode; return CUBLAS_STATUS_SUCCESS;
        default: return CUBLAS_STATUS_INVALID_VALUE;
    }
}

cublasStatus_t cublasGetMathMode(cublasHandle_t handle, cublasMath_t* mode) {
    if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (mode == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    *mode = handle->math_mode;
    return CUBLAS_STATUS_SUCCESS;
}

// The CPU GEMM allocates its own scratch, so a user workspace is accepted and not used; cuBLAS's
// requirement that it be 256-byte aligned is kept.
cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t handle, void* workspace, size_t /*workspaceSizeInBytes*/) {
    if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
    return reinterpret_cast<uintptr_t>(workspace) % 256 == 0 ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t cublasSetPointerMode_v2(cublasHandle_t handle, cublasPointerMode_t mode) {
    if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (mode == CUBLAS_POINTER_MODE_HOST) return CUBLAS_STATUS_SUCCESS;
    // Device-side scalars would have to be read when the stream work runs; not implemented.
    if (mode == CUBLAS_POINTER_MODE_DEVICE) return CUBLAS_STATUS_NOT_SUPPORTED;
    return CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t cublasGetPointerMode_v2(cublasHandle_t handle, cublasPointerMode_t* mode) {
    if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (mode == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    *mode = CUBLAS_POINTER_MODE_HOST;
    return CUBLAS_STATUS_SUCCESS;
}

const char* cublasGetStatusName(cublasStatus_t status) {
    switch (status) {
        case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
        case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
        case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
        case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
        case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
        case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
        case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
        case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
        case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
        case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    }
    return "CUBLAS_STATUS_UNKNOWN";
}

const char* cublasGetStatusString(cublasStatus_t status) {
    switch (status) {
        case CUBLAS_STATUS_SUCCESS: return "the operation completed successfully";
        case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
        case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
        case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
        case CUBLAS_STATUS_ARCH_MISMATCH: return "an absent device architectural feature is required";
        case CUBLAS_STATUS_MAPPING_ERROR: return "an access to GPU memory space failed";
        case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
        case CUBLAS_STATUS_INTERNAL_ERROR: return "an internal operation failed";
        case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
        case CUBLAS_STATUS_LICENSE_ERROR: return "error detected trying to check the license";
    }
    return "unknown cuBLAS status";
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                            int k, const void* alpha, const void* A, cudaDataType Atype, int lda, const void* B,
                            cudaDataType Btype, int ldb, const void* beta, void* C, cudaDataType Ctype, int ldc,
                            cublasComputeType_t computeType, cublasGemmAlgo_t /*algo*/) {
    return gemm(handle, transa, transb, m, n, k, alpha, A, Atype, lda, 0, B, Btype, ldb, 0, beta, C, Ctype, ldc, 0, 1,
                computeType);
}

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                          int m, int n, int k, const void* alpha, const void* A, cudaDataType Atype,
                                          int lda, long long int strideA, const void* B, cudaDataType Btype, int ldb,
                                          long long int strideB, const void* beta, void* C, cudaDataType Ctype, int ldc,
                                          long long int strideC, int batchCount, cublasComputeType_t computeType,
                                          cublasGemmAlgo_t /*algo*/) {
    return gemm(handle, transa, transb, m, n, k, alpha, A, Atype, lda, strideA, B, Btype, ldb, strideB, beta, C, Ctype,
                ldc, strideC, batchCount, computeType);
}

}  // extern "C"
