// The platform's own kernel suite: the CUDA features polevault's kernels rely on, each checked
// against a plain loop on random inputs. Written for both backends (on a GPU it checks the same
// expectations on the device).
#include "test/check.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <numeric>

using namespace pv::test;

namespace platform_test {

// ---- a block reduction with shuffles and shared memory --------------------------------------
// Each block sums its chunk of x: a warp-shuffle tree, then warp 0 reduces the per-warp partials.
template <class T, class Acc>
__global__ void block_sum(const T* x, T* block_sums, int n, int chunk) {
    __shared__ Acc warp_partials[32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    const int begin = blockIdx.x * chunk, end = min(begin + chunk, n);
    Acc v = 0;
    for (int i = begin + threadIdx.x; i < end; i += blockDim.x) v += Acc(x[i]);
    for (int o = 16; o > 0; o /= 2) v += __shfl_down_sync(0xffffffffu, v, o);
    if (lane == 0) warp_partials[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < warps ? warp_partials[lane] : Acc(0);
        for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0) block_sums[blockIdx.x] = T(v);
    }
}

template <class T, class Acc>
void check_block_sum(int n, int threads, int chunk, uint64_t seed) {
    const auto host = random_vector<T>(size_t(n), seed);
    const int blocks = (n + chunk - 1) / chunk;
    DeviceArray<T> x(host), sums{size_t(blocks)};
    launch(block_sum<T, Acc>, dim3(blocks), dim3(threads), 0, nullptr, x.get(), sums.get(), n, chunk);
    CUDA_CHECK_LAUNCH();
    std::vector<double> ref(size_t(blocks), 0.0);
    for (int i = 0; i < n; ++i) ref[size_t(i / chunk)] += double(host[size_t(i)]);
    const std::string err = compare(to_double(sums.download()), ref, tolerance<T>());
    INFO(err);
    REQUIRE(err.empty());
}

TEST_CASE("block reduction with shuffles and shared memory", "[platform]") {
    check_block_sum<float, float>(100003, 256, 4099, 1);
    check_block_sum<double, double>(5000, 1024, 5000, 2);
    check_block_sum<double, double>(777, 96, 100, 3);  // three warps, a partial last chunk
    check_block_sum<__nv_bfloat16, float>(3001, 128, 301, 4);
}

// ---- a tiled shared-memory transpose ----------------------------------------------------------
// 32x32 tiles, blocks of 32x8 threads each moving four rows; the +1 column avoids bank conflicts.
__global__ void transpose(const float* in, float* out, int rows, int cols) {
    __shared__ float tile[32][33];
    const int c = blockIdx.x * 32 + threadIdx.x;
    for (int j = threadIdx.y; j < 32; j += 8) {
        const int r = blockIdx.y * 32 + j;
        if (r < rows && c < cols) tile[j][threadIdx.x] = in[size_t(r) * cols + c];
    }
    __syncthreads();
    const int oc = blockIdx.y * 32 + threadIdx.x;  // column of out = row of in
    for (int j = threadIdx.y; j < 32; j += 8) {
        const int orow = blockIdx.x * 32 + j;
        if (orow < cols && oc < rows) out[size_t(orow) * rows + oc] = tile[threadIdx.x][j];
    }
}

TEST_CASE("tiled shared-memory transpose", "[platform]") {
    for (auto [rows, cols] : {std::pair{100, 77}, std::pair{32, 32}, std::pair{1, 65}, std::pair{129, 3}}) {
        const auto host = random_vector<float>(size_t(rows) * cols, uint64_t(rows * 1000 + cols));
        DeviceArray<float> in(host), out(host.size());
        launch(transpose, dim3((cols + 31) / 32, (rows + 31) / 32), dim3(32, 8), 0, nullptr, in.get(), out.get(), rows,
               cols);
        CUDA_CHECK_LAUNCH();
        const auto got = out.download();
        for (int r = 0; r < rows; ++r)
            for (int c = 0; c < cols; ++c) REQUIRE(got[size_t(c) * rows + r] == host[size_t(r) * cols + c]);
    }
}

// ---- a multi-phase barrier kernel -----------------------------------------------------------
// Each phase every thread reads two neighbours' values written in the previous phase, so any
// barrier that released early would let a thread read a stale or half-updated buffer.
__global__ void phases(const unsigned* in, unsigned* out, int rounds) {
    __shared__ unsigned a[512], b[512];
    const unsigned n = blockDim.x, t = threadIdx.x;
    a[t] = in[blockIdx.x * n + t];
    __syncthreads();
    for (int r = 0; r < rounds; ++r) {
        unsigned* src = r % 2 ? b : a;
        unsigned* dst = r % 2 ? a : b;
        dst[t] = src[(t + 1) % n] * 2654435761u + src[(t + n - 3) % n] + unsigned(r);
        __syncthreads();
    }
    out[blockIdx.x * n + t] = (rounds % 2 ? b : a)[t];
}

TEST_CASE("multi-phase barrier kernel", "[platform]") {
    const int n = 384, blocks = 5, rounds = 9;
    std::vector<unsigned> host(size_t(n) * blocks);
    std::mt19937 rng(7);
    for (auto& v : host) v = rng();
    DeviceArray<unsigned> in(host), out(host.size());
    launch(phases, dim3(blocks), dim3(n), 0, nullptr, in.get(), out.get(), rounds);
    CUDA_CHECK_LAUNCH();
    const auto got = out.download();
    for (int blk = 0; blk < blocks; ++blk) {
        std::vector<unsigned> cur(host.begin() + blk * n, host.begin() + (blk + 1) * n), next(static_cast<size_t>(n));
        for (int r = 0; r < rounds; ++r) {
            for (int t = 0; t < n; ++t)
                next[size_t(t)] = cur[size_t((t + 1) % n)] * 2654435761u + cur[size_t((t + n - 3) % n)] + unsigned(r);
            cur.swap(next);
        }
        for (int t = 0; t < n; ++t) REQUIRE(got[size_t(blk * n + t)] == cur[size_t(t)]);
    }
}

// ---- barrier predicates and warp votes --------------------------------------------------------
__global__ void votes(const int* pred, int* out) {
    const int t = threadIdx.x, p = pred[t];
    const int count = __syncthreads_count(p);
    const int all = __syncthreads_and(p);
    const int any = __syncthreads_or(p);
    const unsigned ballot = __ballot_sync(0xffffffffu, p);
    const int warp_all = __all_sync(0xffffffffu, p), warp_any = __any_sync(0xffffffffu, p);
    // A vote among the even lanes only.
    unsigned even_ballot = 0;
    if (t % 2 == 0) even_ballot = __ballot_sync(0x55555555u, p);
    out[t * 7 + 0] = count;
    out[t * 7 + 1] = all;
    out[t * 7 + 2] = any;
    out[t * 7 + 3] = int(ballot);
    out[t * 7 + 4] = warp_all;
    out[t * 7 + 5] = warp_any;
    out[t * 7 + 6] = int(even_ballot);
}

TEST_CASE("barrier predicates and warp votes", "[platform]") {
    const int n = 128;
    std::mt19937 rng(11);
    std::vector<int> pred(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) pred[size_t(i)] = (rng() % 3 == 0) ? int(rng() % 100 + 1) : 0;
    for (int i = 64; i < 96; ++i) pred[size_t(i)] = 5;   // warp 2 all true
    for (int i = 96; i < 128; ++i) pred[size_t(i)] = 0;  // warp 3 all false
    DeviceArray<int> dpred(pred), out(size_t(n) * 7);
    launch(votes, dim3(1), dim3(n), 0, nullptr, dpred.get(), out.get());
    CUDA_CHECK_LAUNCH();
    const auto got = out.download();
    int count = 0;
    for (int p : pred) count += p != 0;
    for (int t = 0; t < n; ++t) {
        const int w = t / 32;
        unsigned ballot = 0, even = 0;
        for (int l = 0; l < 32; ++l) {
            if (pred[size_t(w * 32 + l)]) ballot |= 1u << l;
            if (pred[size_t(w * 32 + l)] && l % 2 == 0) even |= 1u << l;
        }
        const int* o = &got[size_t(t) * 7];
        REQUIRE(o[0] == count);
        REQUIRE(o[1] == (count == n));
        REQUIRE(o[2] == (count > 0));
        REQUIRE(unsigned(o[3]) == ballot);
        REQUIRE(o[4] == (ballot == 0xffffffffu));
        REQUIRE(o[5] == (ballot != 0));
        REQUIRE(unsigned(o[6]) == (t % 2 == 0 ? even : 0u));
    }
}

// ---- shuffles with widths ---------------------------------------------------------------------
__global__ void shuffles(const double* x, double* out, int width, int src, unsigned delta, int lane_mask) {
    const int t = threadIdx.x;
    const double v = x[t];
    out[t * 5 + 0] = __shfl_sync(0xffffffffu, v, src, width);
    out[t * 5 + 1] = __shfl_up_sync(0xffffffffu, v, delta, width);
    out[t * 5 + 2] = __shfl_down_sync(0xffffffffu, v, delta, width);
    out[t * 5 + 3] = __shfl_xor_sync(0xffffffffu, v, lane_mask, width);
    out[t * 5 + 4] = double(__reduce_add_sync(0xffffffffu, unsigned(t)));
}

TEST_CASE("shuffles: idx, up, down, xor with widths; warp reduce", "[platform]") {
    const int n = 64;
    const auto host = random_vector<double>(size_t(n), 5);
    DeviceArray<double> x(host), out(size_t(n) * 5);
    for (int width : {32, 16, 8, 1}) {
        for (auto [src, delta, lane_mask] : {std::tuple{3, 1u, 1}, std::tuple{37, 5u, 20}, std::tuple{0, 0u, 31}}) {
            out.poison();
            launch(shuffles, dim3(1), dim3(n), 0, nullptr, x.get(), out.get(), width, src, delta, lane_mask);
            CUDA_CHECK_LAUNCH();
            const auto got = out.download();
            for (int t = 0; t < n; ++t) {
                const int warp = t / 32, lane = t % 32, seg = lane / width * width, pos = lane - seg;
                auto at = [&](int l) { return host[size_t(warp * 32 + l)]; };
                INFO("width " << width << " thread " << t << " src " << src << " delta " << delta << " mask "
                              << lane_mask);
                REQUIRE(got[size_t(t) * 5 + 0] == at(seg + (src % width)));
                REQUIRE(got[size_t(t) * 5 + 1] == (pos >= int(delta) ? at(lane - int(delta)) : at(lane)));
                REQUIRE(got[size_t(t) * 5 + 2] == (pos + int(delta) < width ? at(lane + int(delta)) : at(lane)));
                const int x_lane = lane ^ lane_mask;
                REQUIRE(got[size_t(t) * 5 + 3] == (x_lane >= seg + width ? at(lane) : at(x_lane)));
                REQUIRE(got[size_t(t) * 5 + 4] == double(32 * 31 / 2 + warp * 32 * 32));
            }
        }
    }
}

// ---- __syncwarp and __activemask ------------------------------------------------------------
// Lanes exchange values through shared memory with only a warp barrier between write and read.
__global__ void warp_exchange(const int* in, int* out) {
    __shared__ int s[64];
    const int t = threadIdx.x;
    s[t] = in[t];
    __syncwarp();
    out[t] = s[(t & ~31) + ((t + 5) & 31)];
    out[64 + t] = int(__activemask());
    __syncwarp();      // every lane has read s before the first eight overwrite it
    if (t % 32 < 8) {  // a partial-mask warp barrier among the first eight lanes of each warp
        s[t] = -in[t];
        __syncwarp(0x000000ffu);
        out[128 + t] = s[(t & ~31) + ((t + 1) & 7)];
    }
}

TEST_CASE("__syncwarp (full and partial masks) and __activemask", "[platform]") {
    std::vector<int> host(64);
    std::mt19937 rng(9);
    for (auto& v : host) v = int(rng() % 1000) + 1;
    DeviceArray<int> in(host), out(192);
    launch(warp_exchange, dim3(1), dim3(64), 0, nullptr, in.get(), out.get());
    CUDA_CHECK_LAUNCH();
    const auto got = out.download();
    for (int t = 0; t < 64; ++t) {
        REQUIRE(got[size_t(t)] == host[size_t((t & ~31) + ((t + 5) & 31))]);
        REQUIRE(unsigned(got[size_t(64 + t)]) == 0xffffffffu);
        if (t % 32 < 8) REQUIRE(got[size_t(128 + t)] == -host[size_t((t & ~31) + ((t + 1) & 7))]);
    }
}

// ---- atomics from many blocks -----------------------------------------------------------------
__global__ void atomics(const int* values, int n, int* counter, float* fsum, double* dsum, int* imax, int* imin,
                        unsigned* wrap, unsigned long long* bits) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int v = values[i];
    atomicAdd(counter, 1);
    atomicAdd(fsum, float(v));  // small integers: every order gives the exact sum
    atomicAdd(dsum, double(v) * 0.5);
    atomicMax(imax, v);
    atomicMin(imin, v);
    atomicInc(wrap, 9u);
    atomicOr(bits, 1ull << (i % 64));
    // A CAS loop (the pattern behind atomics CUDA lacks) adding 2 to the counter's neighbour. The
    // first read is atomic too: a plain load racing with other threads' atomics is a data race.
    int old = atomicAdd(&counter[1], 0), assumed;
    do {
        assumed = old;
        old = atomicCAS(&counter[1], assumed, assumed + 2);
    } while (old != assumed);
}

TEST_CASE("atomics from many blocks", "[platform]") {
    const int n = 10000;
    std::mt19937 rng(3);
    std::vector<int> values(static_cast<size_t>(n));
    for (auto& v : values) v = int(rng() % 2001) - 1000;
    DeviceArray<int> dv(values), counter(std::vector<int>{0, 0}), imax(std::vector<int>{INT32_MIN}),
        imin(std::vector<int>{INT32_MAX});
    DeviceArray<float> fsum(std::vector<float>{0.0f});
    DeviceArray<double> dsum(std::vector<double>{0.0});
    DeviceArray<unsigned> wrap(std::vector<unsigned>{0});
    DeviceArray<unsigned long long> bits(std::vector<unsigned long long>{0});
    launch(atomics, dim3((n + 127) / 128), dim3(128), 0, nullptr, dv.get(), n, counter.get(), fsum.get(), dsum.get(),
           imax.get(), imin.get(), wrap.get(), bits.get());
    CUDA_CHECK_LAUNCH();
    long long sum = 0;
    for (int v : values) sum += v;
    REQUIRE(counter.download() == std::vector<int>{n, 2 * n});
    REQUIRE(fsum.download()[0] == float(sum));
    REQUIRE(dsum.download()[0] == double(sum) * 0.5);
    REQUIRE(imax.download()[0] == *std::max_element(values.begin(), values.end()));
    REQUIRE(imin.download()[0] == *std::min_element(values.begin(), values.end()));
    REQUIRE(wrap.download()[0] == unsigned(n % 10));  // atomicInc wraps to 0 after 9
    REQUIRE(bits.download()[0] == ~0ull);
}

// ---- dynamic shared memory ----------------------------------------------------------------------
// Reverses each block's slice of x through dynamic shared memory of `n` doubles.
__global__ void reverse_in_smem(const double* x, double* y, int n) {
    PV_DYNAMIC_SHARED(double, buffer);
    const double* in = x + size_t(blockIdx.x) * n;
    for (int i = threadIdx.x; i < n; i += blockDim.x) buffer[i] = in[i];
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) y[size_t(blockIdx.x) * n + i] = buffer[n - 1 - i];
}

TEST_CASE("dynamic shared memory, with the opt-in limit", "[platform]") {
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    const int small = 1000, large = 12000;  // 8 KB, and 96 KB (above the 48 KB default)
    REQUIRE(size_t(large) * sizeof(double) > prop.sharedMemPerBlock);
    REQUIRE(size_t(large) * sizeof(double) <= prop.sharedMemPerBlockOptin);
    for (int n : {small, large}) {
        const auto host = random_vector<double>(size_t(n) * 3, uint64_t(n));
        DeviceArray<double> x(host), y(host.size());
        const size_t smem = size_t(n) * sizeof(double);
        if (smem > prop.sharedMemPerBlock) {
            // Without the opt-in the launch is refused, as on the device, and nothing runs.
            launch(reverse_in_smem, dim3(3), dim3(256), smem, nullptr, x.get(), y.get(), n);
            REQUIRE(cudaGetLastError() == cudaErrorInvalidValue);
            REQUIRE(std::isnan(y.download()[0]));
            CUDA_CHECK(cudaFuncSetAttribute(reverse_in_smem, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
        }
        launch(reverse_in_smem, dim3(3), dim3(256), smem, nullptr, x.get(), y.get(), n);
        CUDA_CHECK_LAUNCH();
        const auto got = y.download();
        for (int b = 0; b < 3; ++b)
            for (int i = 0; i < n; ++i) REQUIRE(got[size_t(b * n + i)] == host[size_t(b * n + n - 1 - i)]);
    }
    REQUIRE(cudaFuncSetAttribute(reverse_in_smem, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 int(prop.sharedMemPerBlockOptin) + 1) == cudaErrorInvalidValue);
    REQUIRE(cudaGetLastError() == cudaErrorInvalidValue);
}

TEST_CASE("the host platform as a GPU with less shared memory a block (POLEVAULT_HOST_SHARED_OPTIN)",
          "[host-only][platform]") {
    // Host-only (a real GPU reports its own limit whatever the environment says; the CUDA build's
    // filter leaves this case out). Under the variable the host reports the limit (sm_89's 99 KiB
    // here) and refuses more, also to a kernel whose attribute was raised past it before; unset, it
    // is an H100 again.
    const int ada = 99 * 1024, h100 = 227 * 1024, raised = 100 * 1024 + 512;
    CUDA_CHECK(cudaFuncSetAttribute(reverse_in_smem, cudaFuncAttributeMaxDynamicSharedMemorySize, raised));
    ::setenv("POLEVAULT_HOST_SHARED_OPTIN", std::to_string(ada).c_str(), 1);
    struct Restore {
        ~Restore() { ::unsetenv("POLEVAULT_HOST_SHARED_OPTIN"); }
    } restore;
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    int optin = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
    REQUIRE(prop.sharedMemPerBlockOptin == size_t(ada));
    REQUIRE(optin == ada);
    const int n = raised / int(sizeof(double));
    const auto host = random_vector<double>(size_t(n), 77);
    DeviceArray<double> x(host), y(host.size());
    launch(reverse_in_smem, dim3(1), dim3(256), size_t(raised), nullptr, x.get(), y.get(), n);
    REQUIRE(cudaGetLastError() == cudaErrorInvalidValue);
    REQUIRE(std::isnan(y.download()[0]));
    REQUIRE(cudaFuncSetAttribute(reverse_in_smem, cudaFuncAttributeMaxDynamicSharedMemorySize, ada + 1) ==
            cudaErrorInvalidValue);
    REQUIRE(cudaGetLastError() == cudaErrorInvalidValue);
    CUDA_CHECK(cudaFuncSetAttribute(reverse_in_smem, cudaFuncAttributeMaxDynamicSharedMemorySize, ada));
    ::unsetenv("POLEVAULT_HOST_SHARED_OPTIN");
    CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
    REQUIRE(optin == h100);
}

// ---- 3D grids and blocks --------------------------------------------------------------------------
__global__ void mark_3d(int* hits, int* coords) {
    const unsigned bx = blockIdx.x, by = blockIdx.y, bz = blockIdx.z;
    const unsigned block = (bz * gridDim.y + by) * gridDim.x + bx;
    const unsigned thread = (threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x;
    const unsigned id = block * (blockDim.x * blockDim.y * blockDim.z) + thread;
    atomicAdd(&hits[id], 1);
    coords[id * 2 + 0] = int(bx + 10 * by + 100 * bz);
    coords[id * 2 + 1] = int(threadIdx.x + 10 * threadIdx.y + 100 * threadIdx.z);
}

TEST_CASE("3D grids and blocks: every index once", "[platform]") {
    const dim3 grid(3, 2, 2), block(5, 3, 2);
    const int total = 3 * 2 * 2 * 5 * 3 * 2;
    DeviceArray<int> hits(std::vector<int>(size_t(total), 0)), coords(size_t(total) * 2);
    launch(mark_3d, grid, block, 0, nullptr, hits.get(), coords.get());
    CUDA_CHECK_LAUNCH();
    const auto h = hits.download(), c = coords.download();
    int id = 0;
    for (int bz = 0; bz < 2; ++bz)
        for (int by = 0; by < 2; ++by)
            for (int bx = 0; bx < 3; ++bx)
                for (int tz = 0; tz < 2; ++tz)
                    for (int ty = 0; ty < 3; ++ty)
                        for (int tx = 0; tx < 5; ++tx, ++id) {
                            REQUIRE(h[size_t(id)] == 1);
                            REQUIRE(c[size_t(id) * 2] == bx + 10 * by + 100 * bz);
                            REQUIRE(c[size_t(id) * 2 + 1] == tx + 10 * ty + 100 * tz);
                        }
}

// ---- launch-configuration errors --------------------------------------------------------------
__global__ void write_one(float* out) { out[threadIdx.x] = 1.0f; }

// The codes a GPU gives (measured on an H100, CUDA 13.0): cudaErrorInvalidValue for every case,
// not the cudaErrorInvalidConfiguration the host platform first assumed for a bad grid or block.
TEST_CASE("bad launch configurations fail as on a GPU", "[platform]") {
    DeviceArray<float> out(2048);
    REQUIRE(cudaGetLastError() == cudaSuccess);
    struct Case {
        dim3 grid, block;
        size_t smem;
        cudaError_t expected;
    };
    const Case cases[] = {
        {dim3(1), dim3(1025), 0, cudaErrorInvalidValue},            // > 1024 threads
        {dim3(1), dim3(32, 32, 2), 0, cudaErrorInvalidValue},       // 2048 threads
        {dim3(1), dim3(1, 1, 65), 0, cudaErrorInvalidValue},        // z > 64
        {dim3(0), dim3(32), 0, cudaErrorInvalidValue},              // empty grid
        {dim3(1, 65536), dim3(32), 0, cudaErrorInvalidValue},       // grid y > 65535
        {dim3(1), dim3(32), 48 * 1024 + 1, cudaErrorInvalidValue},  // smem over the default
    };
    for (const Case& c : cases) {
        INFO("grid " << c.grid.x << "x" << c.grid.y << "x" << c.grid.z << ", block " << c.block.x << "x" << c.block.y
                     << "x" << c.block.z << ", smem " << c.smem);
        launch(write_one, c.grid, c.block, c.smem, nullptr, out.get());
        CHECK(cudaPeekAtLastError() == c.expected);
        CHECK(cudaGetLastError() == c.expected);
        REQUIRE(cudaGetLastError() == cudaSuccess);  // not sticky
    }
    REQUIRE(std::isnan(out.download()[0]));                                 // nothing ran
    launch(write_one, dim3(1), dim3(1024), 48 * 1024, nullptr, out.get());  // the limits themselves are fine
    CUDA_CHECK_LAUNCH();
    REQUIRE(out.download()[1023] == 1.0f);
}

}  // namespace platform_test
