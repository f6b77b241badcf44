// Tests for the cuBLAS GEMMs polevault relies on: cublasGemmEx and cublasGemmStridedBatchedEx with
// fp64, fp32, bf16 -> bf16 and bf16 -> fp32, checked against a naive fp64 triple loop. On the host
// backend this exercises host/cublas.cpp; on a GPU the same checks hold for NVIDIA's cuBLAS (the few
// host-only expectations are marked).
//
// Every case uses shapes that are multiples of nothing, leading dimensions above the minimum whose
// padding must survive the call, and beta = 0 over a NaN-poisoned C (C is then not an input).

#include "test/check.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

namespace {

using pv::test::compare;
using pv::test::DeviceArray;
using pv::test::random_vector;
using pv::test::to_double;
using pv::test::tolerance;

// The supported storage/compute combinations: A and B are In, C is Out.
template <class In, class Out>
struct GemmTypes;
template <>
struct GemmTypes<double, double> {
    using Scalar = double;
    static constexpr cudaDataType in = CUDA_R_64F, out = CUDA_R_64F;
    static constexpr cublasComputeType_t compute = CUBLAS_COMPUTE_64F;
};
template <>
struct GemmTypes<float, float> {
    using Scalar = float;
    static constexpr cudaDataType in = CUDA_R_32F, out = CUDA_R_32F;
    static constexpr cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
};
template <>
struct GemmTypes<__nv_bfloat16, __nv_bfloat16> {
    using Scalar = float;
    static constexpr cudaDataType in = CUDA_R_16BF, out = CUDA_R_16BF;
    static constexpr cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
};
template <>
struct GemmTypes<__nv_bfloat16, float> {
    using Scalar = float;
    static constexpr cudaDataType in = CUDA_R_16BF, out = CUDA_R_32F;
    static constexpr cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
};

class Handle {
  public:
    Handle() { CUBLAS_CHECK(cublasCreate(&handle_)); }
    ~Handle() { cublasDestroy(handle_); }
    Handle(const Handle&) = delete;
    Handle& operator=(const Handle&) = delete;
    operator cublasHandle_t() const { return handle_; }

  private:
    cublasHandle_t handle_ = nullptr;
};

template <class T>
bool same_bits(const T& a, const T& b) {
    return std::memcmp(static_cast<const void*>(&a), static_cast<const void*>(&b), sizeof(T)) == 0;
}

struct GemmCase {
    cublasOperation_t op_a = CUBLAS_OP_N, op_b = CUBLAS_OP_N;
    int m = 37, n = 23, k = 19;
    int pad_a = 0, pad_b = 0, pad_c = 0;  // each leading dimension minus its minimum
    double alpha = 0.75, beta = -1.25;
    int batch = 0;             // 0: cublasGemmEx; otherwise cublasGemmStridedBatchedEx with this batchCount
    bool broadcast_a = false;  // batched: strideA = 0

    std::string describe() const {
        return "op_a " + std::to_string(op_a) + " op_b " + std::to_string(op_b) + " m " + std::to_string(m) + " n " +
               std::to_string(n) + " k " + std::to_string(k) + " pads " + std::to_string(pad_a) + "/" +
               std::to_string(pad_b) + "/" + std::to_string(pad_c) + " alpha " + std::to_string(alpha) + " beta " +
               std::to_string(beta) + " batch " + std::to_string(batch) + (broadcast_a ? " (A broadcast)" : "");
    }
};

// The naive oracle: alpha*op(A)*op(B) + beta*C in fp64 for the column-major m x n matrix whose first
// element is c[c0] (C is not read when beta == 0). Returns the m x n result packed.
std::vector<double> reference_gemm(const GemmCase& g, double alpha, const std::vector<double>& a, size_t a0, int lda,
                                   const std::vector<double>& b, size_t b0, int ldb, double beta,
                                   const std::vector<double>& c, size_t c0, int ldc) {
    const bool ta = g.op_a != CUBLAS_OP_N, tb = g.op_b != CUBLAS_OP_N;
    std::vector<double> out(size_t(g.m) * g.n);
    for (int j = 0; j < g.n; ++j)
        for (int i = 0; i < g.m; ++i) {
            double sum = 0;
            for (int p = 0; p < g.k; ++p) {
                const double x = a[a0 + (ta ? size_t(i) * lda + p : size_t(p) * lda + i)];
                const double y = b[b0 + (tb ? size_t(p) * ldb + j : size_t(j) * ldb + p)];
                sum += x * y;
            }
            out[size_t(j) * g.m + i] = alpha * sum + (beta == 0 ? 0.0 : beta * c[c0 + size_t(j) * ldc + i]);
        }
    return out;
}

// Runs one case on the device and checks every output matrix against the oracle and every other
// element of the C buffer (padding rows, gaps between batch matrices) against its old bits.
template <class In, class Out>
void check_gemm(cublasHandle_t handle, const GemmCase& g, uint64_t seed) {
    using Types = GemmTypes<In, Out>;
    using Scalar = typename Types::Scalar;
    INFO(g.describe());

    const bool ta = g.op_a != CUBLAS_OP_N, tb = g.op_b != CUBLAS_OP_N;
    const int rows_a = ta ? g.k : g.m, cols_a = ta ? g.m : g.k;
    const int rows_b = tb ? g.n : g.k, cols_b = tb ? g.k : g.n;
    const int lda = std::max(1, rows_a) + g.pad_a, ldb = std::max(1, rows_b) + g.pad_b,
              ldc = std::max(1, g.m) + g.pad_c;
    const int batch = std::max(1, g.batch);
    // Gaps between consecutive batch matrices, so a wrong stride cannot go unnoticed.
    const long long stride_a = g.broadcast_a ? 0 : (long long)lda * cols_a + 7;
    const long long stride_b = (long long)ldb * cols_b + 5;
    const long long stride_c = (long long)ldc * g.n + 3;

    const auto a = random_vector<In>(size_t(stride_a) * (batch - 1) + size_t(lda) * cols_a, seed);
    const auto b = random_vector<In>(size_t(stride_b) * (batch - 1) + size_t(ldb) * cols_b, seed + 1);
    DeviceArray<In> d_a(a), d_b(b);
    DeviceArray<Out> d_c(size_t(stride_c) * (batch - 1) + size_t(ldc) * g.n);  // poisoned: NaN
    if (g.beta != 0) d_c.upload(random_vector<Out>(d_c.size(), seed + 2));
    const std::vector<Out> c_before = d_c.download();

    const Scalar alpha = Scalar(g.alpha), beta = Scalar(g.beta);
    if (g.batch == 0) {
        REQUIRE(cublasGemmEx(handle, g.op_a, g.op_b, g.m, g.n, g.k, &alpha, d_a.get(), Types::in, lda, d_b.get(),
                             Types::in, ldb, &beta, d_c.get(), Types::out, ldc, Types::compute,
                             CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS);
    } else {
        REQUIRE(cublasGemmStridedBatchedEx(handle, g.op_a, g.op_b, g.m, g.n, g.k, &alpha, d_a.get(), Types::in, lda,
                                           stride_a, d_b.get(), Types::in, ldb, stride_b, &beta, d_c.get(), Types::out,
                                           ldc, stride_c, g.batch, Types::compute,
                                           CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS);
    }
    CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<Out> c_after = d_c.download();

    // The oracle sees exactly what the GEMM saw: the stored (bf16-rounded) inputs and scalars.
    const auto a64 = to_double(a), b64 = to_double(b), c_before64 = to_double(c_before), c_after64 = to_double(c_after);
    std::vector<bool> written(c_after.size(), false);
    for (int q = 0; q < batch; ++q) {
        INFO("batch matrix " << q);
        const size_t c0 = size_t(stride_c) * q;
        const auto ref = reference_gemm(g, double(alpha), a64, size_t(stride_a) * q, lda, b64, size_t(stride_b) * q,
                                        ldb, double(beta), c_before64, c0, ldc);
        std::vector<double> got(ref.size());
        for (int j = 0; j < g.n; ++j)
            for (int i = 0; i < g.m; ++i) {
                got[size_t(j) * g.m + i] = c_after64[c0 + size_t(j) * ldc + i];
                written[c0 + size_t(j) * ldc + i] = true;
            }
        CHECK(compare(got, ref, tolerance<Out>()) == "");
    }
    size_t clobbered = 0;
    for (size_t i = 0; i < c_after.size(); ++i)
        if (!written[i] && !same_bits(c_after[i], c_before[i])) ++clobbered;
    CHECK(clobbered == 0);
}

// Every op combination, tight and padded leading dimensions, beta = 0 (NaN C) and beta != 0.
template <class In, class Out>
void check_all_ops(cublasHandle_t handle, GemmCase g, uint64_t seed) {
    for (auto op_a : {CUBLAS_OP_N, CUBLAS_OP_T})
        for (auto op_b : {CUBLAS_OP_N, CUBLAS_OP_T})
            for (double beta : {0.0, -1.25})
                for (bool padded : {false, true}) {
                    g.op_a = op_a, g.op_b = op_b, g.beta = beta;
                    g.pad_a = padded ? 3 : 0, g.pad_b = padded ? 5 : 0, g.pad_c = padded ? 2 : 0;
                    check_gemm<In, Out>(handle, g, seed += 10);
                }
}

}  // namespace

TEST_CASE("GemmEx matches an fp64 reference for every op, leading dimension and beta", "[gemm]") {
    Handle handle;
    const GemmCase odd{.m = 37, .n = 23, .k = 19};
    const GemmCase large{.m = 131, .n = 67, .k = 257};  // beyond one BLAS block in every dimension
    const GemmCase conj{.op_a = CUBLAS_OP_C, .op_b = CUBLAS_OP_C, .pad_a = 1, .pad_b = 2, .pad_c = 3};  // C == T
    SECTION("fp64") {
        check_all_ops<double, double>(handle, odd, 100);
        check_all_ops<double, double>(handle, large, 200);
        check_gemm<double, double>(handle, conj, 300);
    }
    SECTION("fp32") {
        check_all_ops<float, float>(handle, odd, 400);
        check_all_ops<float, float>(handle, large, 500);
        check_gemm<float, float>(handle, conj, 600);
    }
    SECTION("bf16 -> bf16") {
        check_all_ops<__nv_bfloat16, __nv_bfloat16>(handle, odd, 700);
        check_all_ops<__nv_bfloat16, __nv_bfloat16>(handle, large, 800);
        check_gemm<__nv_bfloat16, __nv_bfloat16>(handle, conj, 900);
    }
    SECTION("bf16 -> fp32") {
        check_all_ops<__nv_bfloat16, float>(handle, odd, 1000);
        check_all_ops<__nv_bfloat16, float>(handle, large, 1100);
        check_gemm<__nv_bfloat16, float>(handle, conj, 1200);
    }
}

TEST_CASE("GemmStridedBatchedEx: three matrices with gaps between them, and a broadcast A", "[gemm]") {
    Handle handle;
    for (bool broadcast : {false, true}) {
        const GemmCase g{.m = 29, .n = 17, .k = 13, .batch = 3, .broadcast_a = broadcast};
        check_all_ops<double, double>(handle, g, 2000);
        check_all_ops<float, float>(handle, g, 2100);
        check_all_ops<__nv_bfloat16, __nv_bfloat16>(handle, g, 2200);
        check_all_ops<__nv_bfloat16, float>(handle, g, 2300);
    }
}

TEST_CASE("k == 0 gives beta*C (zeros over a NaN C when beta == 0)", "[gemm]") {
    Handle handle;
    const GemmCase empty{.m = 37, .n = 23, .k = 0};
    check_all_ops<double, double>(handle, empty, 3000);
    check_all_ops<float, float>(handle, empty, 3100);
    check_all_ops<__nv_bfloat16, __nv_bfloat16>(handle, empty, 3200);
    check_all_ops<__nv_bfloat16, float>(handle, empty, 3300);
    check_gemm<float, float>(handle, GemmCase{.m = 37, .n = 23, .k = 0, .pad_c = 4, .batch = 3}, 3400);
}

TEST_CASE("bf16 output is rounded to nearest even", "[gemm]") {
    // 1*1 + beta*c is exact in fp32; only the final rounding to bf16 (8 significant bits) differs.
    Handle handle;
    const std::vector<__nv_bfloat16> one{__nv_bfloat16(1.0f)};
    DeviceArray<__nv_bfloat16> d_a(one), d_b(one);
    const float alpha = 1.0f;
    const auto result = [&](float beta) {
        DeviceArray<__nv_bfloat16> d_c(one);
        CUBLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &alpha, d_a.get(), CUDA_R_16BF, 1,
                                  d_b.get(), CUDA_R_16BF, 1, &beta, d_c.get(), CUDA_R_16BF, 1, CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT));
        return float(d_c.download()[0]);
    };
    CHECK(result(0.7f / 128) == 1.0078125f);  // 1.0054...: nearest, not truncated (1.0)
    CHECK(result(1.0f / 256) == 1.0f);        // 1.00390625: tie, to the even neighbour 1.0
    CHECK(result(3.0f / 256) == 1.015625f);   // 1.01171875: tie, to the even neighbour 1 + 2/128
}

TEST_CASE("fp32 GEMM accepts the fast compute types", "[gemm]") {
    // cuBLAS may down-convert inputs in these modes (to bf16 at worst), so check at bf16 tolerance.
    Handle handle;
    const int m = 37, n = 23, k = 19;
    const auto a = random_vector<float>(size_t(m) * k, 4000), b = random_vector<float>(size_t(k) * n, 4001);
    DeviceArray<float> d_a(a), d_b(b), d_c(size_t(m) * n);
    const float alpha = 0.75f, beta = 0.0f;
    const GemmCase g{.m = m, .n = n, .k = k};
    const auto ref = reference_gemm(g, alpha, to_double(a), 0, m, to_double(b), 0, k, 0.0, {}, 0, m);
    for (auto compute : {CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_COMPUTE_32F_FAST_16BF,
                         CUBLAS_COMPUTE_32F_FAST_16F}) {
        INFO("compute type " << compute);
        d_c.poison();
        REQUIRE(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &alpha, d_a.get(), CUDA_R_32F, m, d_b.get(),
                             CUDA_R_32F, k, &beta, d_c.get(), CUDA_R_32F, m, compute,
                             CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS);
        CHECK(compare(to_double(d_c.download()), ref, tolerance<__nv_bfloat16>()) == "");
    }
}

TEST_CASE("bad GEMM arguments are rejected as cuBLAS rejects them, leaving C unchanged", "[gemm]") {
    Handle handle;
    const int m = 5, n = 4, k = 3;
    const auto N = CUBLAS_OP_N, T = CUBLAS_OP_T;
    const auto F32 = CUDA_R_32F, F64 = CUDA_R_64F, BF16 = CUDA_R_16BF;
    const auto C32 = CUBLAS_COMPUTE_32F, C64 = CUBLAS_COMPUTE_64F;
    struct Bad {
        const char* what;
        cublasOperation_t op_a, op_b;
        int m, n, k, lda, ldb, ldc, batch;
        cudaDataType a_type, b_type, c_type;
        cublasComputeType_t compute;
        cublasStatus_t expected;
    };
    const auto IV = CUBLAS_STATUS_INVALID_VALUE, NS = CUBLAS_STATUS_NOT_SUPPORTED;
    const Bad cases[] = {
        {"m < 0", N, N, -1, n, k, m, k, m, 1, F32, F32, F32, C32, IV},
        {"n < 0", N, N, m, -1, k, m, k, m, 1, F32, F32, F32, C32, IV},
        {"k < 0", N, N, m, n, -1, m, k, m, 1, F32, F32, F32, C32, IV},
        {"lda < m (op N)", N, N, m, n, k, m - 1, k, m, 1, F32, F32, F32, C32, IV},
        {"lda < k (op T)", T, N, m, n, k, k - 1, k, m, 1, F32, F32, F32, C32, IV},
        {"ldb < k (op N)", N, N, m, n, k, m, k - 1, m, 1, F32, F32, F32, C32, IV},
        {"ldb < n (op T)", N, T, m, n, k, m, n - 1, m, 1, F32, F32, F32, C32, IV},
        {"ldc < m", N, N, m, n, k, m, k, m - 1, 1, F32, F32, F32, C32, IV},
        {"transa CONJG (only N, T, C are valid)", CUBLAS_OP_CONJG, N, m, n, k, k, k, m, 1, F32, F32, F32, C32, IV},
        {"transb CONJG (only N, T, C are valid)", N, CUBLAS_OP_CONJG, m, n, k, m, n, m, 1, F32, F32, F32, C32, IV},
        {"batchCount < 0 (SUCCESS on cuBLAS 13.0, measured on an H100)", N, N, m, n, k, m, k, m, -1, F32, F32, F32, C32,
         CUBLAS_STATUS_SUCCESS},
        {"A and B of different types", N, N, m, n, k, m, k, m, 1, F32, F64, F32, C32, NS},
        {"fp32 data, 64F compute", N, N, m, n, k, m, k, m, 1, F32, F32, F32, C64, NS},
        {"fp64 data, 32F compute", N, N, m, n, k, m, k, m, 1, F64, F64, F64, C32, NS},
        {"bf16 inputs, fp64 output", N, N, m, n, k, m, k, m, 1, BF16, BF16, F64, C32, NS},
    };
    // Buffers big enough for every case (as fp64), so a wrongly accepted call cannot fault.
    DeviceArray<double> d_a(random_vector<double>(64, 5000)), d_b(random_vector<double>(64, 5001));
    const auto c_init = random_vector<double>(64, 5002);
    DeviceArray<double> d_c(c_init);
    const double alpha = 1.5, beta = 0.5;  // only read by accepted calls; wide enough for any scalar type

    for (const Bad& bad : cases) {
        for (bool batched : {false, true}) {
            if (!batched && bad.batch != 1) continue;
            INFO(bad.what << (batched ? " (strided batched)" : ""));
            const cublasStatus_t status =
                batched ? cublasGemmStridedBatchedEx(handle, bad.op_a, bad.op_b, bad.m, bad.n, bad.k, &alpha, d_a.get(),
                                                     bad.a_type, bad.lda, 0, d_b.get(), bad.b_type, bad.ldb, 0, &beta,
                                                     d_c.get(), bad.c_type, bad.ldc, 0, bad.batch, bad.compute,
                                                     CUBLAS_GEMM_DEFAULT)
                        : cublasGemmEx(handle, bad.op_a, bad.op_b, bad.m, bad.n, bad.k, &alpha, d_a.get(), bad.a_type,
                                       bad.lda, d_b.get(), bad.b_type, bad.ldb, &beta, d_c.get(), bad.c_type, bad.ldc,
                                       bad.compute, CUBLAS_GEMM_DEFAULT);
            CHECK(std::string(cublasGetStatusName(status)) == cublasGetStatusName(bad.expected));
            CUDA_CHECK(cudaDeviceSynchronize());
            CHECK(d_c.download() == c_init);
        }
    }

    SECTION("a null handle") {
        const float alpha32 = 1.0f, beta32 = 0.0f;
        CHECK(cublasGemmEx(nullptr, N, N, m, n, k, &alpha32, d_a.get(), F32, m, d_b.get(), F32, k, &beta32, d_c.get(),
                           F32, m, C32, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_NOT_INITIALIZED);
        CUDA_CHECK(cudaDeviceSynchronize());
        CHECK(d_c.download() == c_init);
    }
}

TEST_CASE("empty GEMMs succeed without touching C", "[gemm]") {
    Handle handle;
    DeviceArray<float> d_a(random_vector<float>(64, 6000)), d_b(random_vector<float>(64, 6001));
    const auto c_init = random_vector<float>(64, 6002);
    DeviceArray<float> d_c(c_init);
    const float alpha = 1.5f, beta = 0.0f;  // beta == 0 would zero C if anything were computed
    CHECK(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, 0, 4, 3, &alpha, d_a.get(), CUDA_R_32F, 1, d_b.get(),
                       CUDA_R_32F, 3, &beta, d_c.get(), CUDA_R_32F, 1, CUBLAS_COMPUTE_32F,
                       CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS);
    CHECK(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, 5, 0, 3, &alpha, d_a.get(), CUDA_R_32F, 5, d_b.get(),
                       CUDA_R_32F, 3, &beta, d_c.get(), CUDA_R_32F, 5, CUBLAS_COMPUTE_32F,
                       CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS);
    CHECK(cublasGemmStridedBatchedEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, 5, 4, 3, &alpha, d_a.get(), CUDA_R_32F, 5, 0,
                                     d_b.get(), CUDA_R_32F, 3, 0, &beta, d_c.get(), CUDA_R_32F, 5, 0, 0,
                                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS);
    CUDA_CHECK(cudaDeviceSynchronize());
    CHECK(d_c.download() == c_init);
}

TEST_CASE("the cuBLAS handle keeps its stream and modes, and GEMMs run in stream order", "[gemm]") {
    Handle handle;
    cudaStream_t stream = nullptr, got = reinterpret_cast<cudaStream_t>(1);
    CUDA_CHECK(cudaStreamCreate(&stream));
    CHECK(cublasGetStream(handle, &got) == CUBLAS_STATUS_SUCCESS);
    CHECK(got == nullptr);  // a new handle uses the default stream
    REQUIRE(cublasSetStream(handle, stream) == CUBLAS_STATUS_SUCCESS);
    CHECK(cublasGetStream(handle, &got) == CUBLAS_STATUS_SUCCESS);
    CHECK(got == stream);

    cublasMath_t math = CUBLAS_TENSOR_OP_MATH;
    CHECK(cublasGetMathMode(handle, &math) == CUBLAS_STATUS_SUCCESS);
    CHECK(math == CUBLAS_DEFAULT_MATH);
    CHECK(cublasSetMathMode(handle, CUBLAS_PEDANTIC_MATH) == CUBLAS_STATUS_SUCCESS);
    CHECK(cublasGetMathMode(handle, &math) == CUBLAS_STATUS_SUCCESS);
    CHECK(math == CUBLAS_PEDANTIC_MATH);
    cublasPointerMode_t pointer_mode = CUBLAS_POINTER_MODE_DEVICE;
    CHECK(cublasGetPointerMode(handle, &pointer_mode) == CUBLAS_STATUS_SUCCESS);
    CHECK(pointer_mode == CUBLAS_POINTER_MODE_HOST);
    CHECK(cublasSetPointerMode(handle, CUBLAS_POINTER_MODE_HOST) == CUBLAS_STATUS_SUCCESS);
    // A user workspace (what --cuda-graphs sets): 256-byte aligned, as cuBLAS requires; the GEMMs
    // below run with it.
    DeviceArray<char> workspace(size_t(1) << 20);
    CHECK(cublasSetWorkspace(handle, workspace.get() + 16, workspace.bytes() - 256) == CUBLAS_STATUS_INVALID_VALUE);
    REQUIRE(cublasSetWorkspace(handle, workspace.get(), workspace.bytes()) == CUBLAS_STATUS_SUCCESS);

    // Upload, multiply and download all on `stream`, synchronizing only at the end: the GEMM must see
    // the uploaded inputs and the download must see its result.
    const int m = 37, n = 23, k = 19;
    const auto a = random_vector<float>(size_t(m) * k, 7000), b = random_vector<float>(size_t(k) * n, 7001);
    DeviceArray<float> d_a(a.size()), d_b(b.size()), d_c(size_t(m) * n);
    std::vector<float> c(size_t(m) * n);
    const float alpha = 0.75f, beta = 0.0f;
    CUDA_CHECK(cudaMemcpyAsync(d_a.get(), a.data(), d_a.bytes(), cudaMemcpyHostToDevice, stream));
    CUDA_CHECK(cudaMemcpyAsync(d_b.get(), b.data(), d_b.bytes(), cudaMemcpyHostToDevice, stream));
    REQUIRE(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &alpha, d_a.get(), CUDA_R_32F, m, d_b.get(),
                         CUDA_R_32F, k, &beta, d_c.get(), CUDA_R_32F, m, CUBLAS_COMPUTE_32F,
                         CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS);
    CUDA_CHECK(cudaMemcpyAsync(c.data(), d_c.get(), d_c.bytes(), cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    const GemmCase g{.m = m, .n = n, .k = k};
    CHECK(compare(to_double(c), reference_gemm(g, alpha, to_double(a), 0, m, to_double(b), 0, k, 0.0, {}, 0, m),
                  tolerance<float>()) == "");

    if (pv::kHostBackend) {
        // Host-only limitations and diagnostics: device-side scalars are not implemented, and a
        // destroyed stream is recognised (on a GPU, using it is undefined behaviour).
        CHECK(cublasSetPointerMode(handle, CUBLAS_POINTER_MODE_DEVICE) == CUBLAS_STATUS_NOT_SUPPORTED);
        cudaStream_t dead = nullptr;
        CUDA_CHECK(cudaStreamCreate(&dead));
        CUDA_CHECK(cudaStreamDestroy(dead));
        CHECK(cublasSetStream(handle, dead) == CUBLAS_STATUS_INVALID_VALUE);
        CHECK(cublasGetStream(handle, &got) == CUBLAS_STATUS_SUCCESS);
        CHECK(got == stream);
    }
    CHECK(cublasSetStream(handle, nullptr) == CUBLAS_STATUS_SUCCESS);
    CUDA_CHECK(cudaStreamDestroy(stream));
}
