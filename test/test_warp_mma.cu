// The warp-level matrix instructions (platform/platform.h, host/warp_matrix.h): mma.m16n8k16
// (bf16, fp16), ldmatrix x1/x2/x4 with and without .trans, cp.async with commit/wait groups.
//
// The fragment layouts are written here a second time, independently of host/warp_matrix.cpp and
// in the other direction (lane and element -> row and column, as the PTX ISA's figures draw
// them), as a Layout the test kernels load and store with. Every output position is compared
// with an fp64 product of the same rounded inputs. A Layout can carry a planted bug (two lanes'
// fragments swapped, groupID off by one, the wrong .trans): the same checks must then report
// mismatches, which shows they can tell a wrong layout from the right one (on either side: the
// emulation's or a kernel's).
#include "kernels/mma.cuh"
#include "test/check.h"

#include <algorithm>

using namespace pv;
using namespace pv::test;

namespace warp_mma_test {

// Where each lane's fragment elements sit, per the PTX ISA (groupID g = lane / 4, t = lane % 4).
// Element e of a fragment is register e / 2, half e % 2 (low half first).
struct Layout {
    int swap_a = -1, swap_b = -1;  // planted: these two lanes take each other's fragments
    int group_shift = 0;           // planted: groupID off by this much (mod 8)
    bool flip_trans = false;       // planted: ldmatrix read in the other orientation

    __host__ __device__ unsigned lane_of(unsigned lane) const {
        if (int(lane) == swap_a) return unsigned(swap_b);
        if (int(lane) == swap_b) return unsigned(swap_a);
        return lane;
    }
    __host__ __device__ unsigned group(unsigned lane) const {
        return ((lane_of(lane) >> 2) + unsigned(group_shift)) % 8;
    }
    __host__ __device__ unsigned tid(unsigned lane) const { return lane_of(lane) % 4; }
    // A (16×16, row-major): registers 0-3 = (row g, cols 2t..), (row g+8), (cols +8), (both).
    __host__ __device__ unsigned a_row(unsigned lane, unsigned e) const { return group(lane) + 8 * ((e / 2) % 2); }
    __host__ __device__ unsigned a_col(unsigned lane, unsigned e) const { return 2 * tid(lane) + e % 2 + 8 * (e / 4); }
    // B (16×8, k × n): register 0 = (k 2t, 2t+1; n g), register 1 = (k 2t+8, 2t+9; n g).
    __host__ __device__ unsigned b_k(unsigned lane, unsigned e) const { return 2 * tid(lane) + e % 2 + 8 * (e / 2); }
    __host__ __device__ unsigned b_n(unsigned lane) const { return group(lane); }
    // C and D (16×8): c0, c1 = (row g, cols 2t, 2t+1), c2, c3 = (row g+8, same cols).
    __host__ __device__ unsigned c_row(unsigned lane, unsigned e) const { return group(lane) + 8 * (e / 2); }
    __host__ __device__ unsigned c_col(unsigned lane, unsigned e) const { return 2 * tid(lane) + e % 2; }
};

__device__ inline void store_d(const Layout& L, const float (&d)[4], float* out) {
    const unsigned lane = threadIdx.x;
    for (unsigned e = 0; e < 4; ++e) out[L.c_row(lane, e) * 8 + L.c_col(lane, e)] = d[e];
}

__device__ inline void load_c(const Layout& L, const float* c, float (&frag)[4]) {
    const unsigned lane = threadIdx.x;
    for (unsigned e = 0; e < 4; ++e) frag[e] = c[L.c_row(lane, e) * 8 + L.c_col(lane, e)];
}

template <bool Bf16>
__device__ inline void run_mma(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], const float (&c)[4]) {
    if constexpr (Bf16) {
        mma_m16n8k16_bf16(d, a, b, c);
    } else {
        mma_m16n8k16_f16(d, a, b, c);
    }
}

// D = A·B + C with every fragment gathered by plain indexing. a: 16×16 row-major, b: 16×8 (k × n)
// row-major, 16-bit patterns (bf16 or fp16); c, d: 16×8 fp32.
template <bool Bf16>
__global__ void mma_by_index(const uint16_t* a, const uint16_t* b, const float* c, float* d, Layout L) {
    const unsigned lane = threadIdx.x;
    uint32_t af[4], bf[2];
    float cf[4], df[4];
    for (unsigned r = 0; r < 4; ++r)
        af[r] = uint32_t(a[L.a_row(lane, 2 * r) * 16 + L.a_col(lane, 2 * r)]) |
                uint32_t(a[L.a_row(lane, 2 * r + 1) * 16 + L.a_col(lane, 2 * r + 1)]) << 16;
    for (unsigned r = 0; r < 2; ++r)
        bf[r] = uint32_t(b[L.b_k(lane, 2 * r) * 8 + L.b_n(lane)]) |
                uint32_t(b[L.b_k(lane, 2 * r + 1) * 8 + L.b_n(lane)]) << 16;
    load_c(L, c, cf);
    run_mma<Bf16>(df, af, bf, cf);
    store_d(L, df, d);
}

// The same product with A and B loaded from shared memory by ldmatrix: A (row-major) by x4;
// B either stored n-major ([8][16], as K rows are) and read by x2, or k-major ([16][8], as V rows
// are) and read by x2.trans. `trans_ok` false plants the wrong choice of .trans.
template <bool Bf16>
__global__ void mma_by_ldmatrix(const uint16_t* a, const uint16_t* b, const float* c, float* d, bool b_k_major,
                                bool trans_ok, Layout L) {
    __shared__ __align__(16) uint16_t sa[16 * 16];
    __shared__ __align__(16) uint16_t sb[16 * 8];
    const unsigned lane = threadIdx.x;
    for (unsigned i = lane; i < 256; i += 32) sa[i] = a[i];
    for (unsigned i = lane; i < 128; i += 32) {
        const unsigned k = i / 8, n = i % 8;
        if (b_k_major) {
            sb[k * 8 + n] = b[k * 8 + n];
        } else {
            sb[n * 16 + k] = b[k * 8 + n];
        }
    }
    __syncwarp();
    uint32_t af[4], bf[2];
    float cf[4], df[4];
    // Matrices 0-3 of x4: rows 0-7 / 8-15 of columns 0-7, then of columns 8-15 (= a[0..3]).
    ldmatrix_x4(af, &sa[(lane % 16) * 16 + (lane / 16) * 8]);
    const bool use_trans = b_k_major == trans_ok;
    if (b_k_major) {
        const uint16_t* row = &sb[(lane % 16) * 8];  // matrices 0, 1: k 0-7, k 8-15
        if (use_trans) {
            ldmatrix_x2_trans(bf, row);
        } else {
            ldmatrix_x2(bf, row);
        }
    } else {
        const uint16_t* row = &sb[(lane % 8) * 16 + ((lane / 8) % 2) * 8];  // n rows; k 0-7, k 8-15
        if (use_trans) {
            ldmatrix_x2_trans(bf, row);
        } else {
            ldmatrix_x2(bf, row);
        }
    }
    load_c(L, c, cf);
    run_mma<Bf16>(df, af, bf, cf);
    store_d(L, df, d);
}

// Random values rounded to bf16 or fp16: their bit patterns and their exact values.
struct Rounded {
    std::vector<uint16_t> bits;
    std::vector<double> values;
};
Rounded random_rounded(size_t n, uint64_t seed, bool bf16) {
    const auto v = random_vector<float>(n, seed, -2.0, 2.0);
    Rounded r;
    for (float x : v) {
        uint16_t bits;
        double exact;
        if (bf16) {
            const __nv_bfloat16 h = __float2bfloat16(x);
            std::memcpy(&bits, &h, 2);
            exact = double(__bfloat162float(h));
        } else {
            const __half h = __float2half_rn(x);
            std::memcpy(&bits, &h, 2);
            exact = double(__half2float(h));
        }
        r.bits.push_back(bits);
        r.values.push_back(exact);
    }
    return r;
}

// Positions of D (16×8) that differ from C + A·B in fp64 beyond fp32 accumulation error.
int mma_mismatches(const std::vector<float>& d, const Rounded& a, const Rounded& b, const std::vector<float>& c) {
    int bad = 0;
    for (int r = 0; r < 16; ++r)
        for (int n = 0; n < 8; ++n) {
            double ref = c[size_t(r * 8 + n)], scale = std::fabs(ref);
            for (int k = 0; k < 16; ++k) {
                const double p = a.values[size_t(r * 16 + k)] * b.values[size_t(k * 8 + n)];
                ref += p, scale += std::fabs(p);
            }
            const double got = d[size_t(r * 8 + n)];
            if (!(std::fabs(got - ref) <= 1e-6 * scale)) ++bad;  // NaN (never written) counts
        }
    return bad;
}

enum class Load { by_index, ldmatrix_n_major, ldmatrix_k_major };

// Runs one product and returns the number of mismatched output positions.
int run_product(bool bf16, Load load, const Layout& layout, uint64_t seed, bool trans_ok = true) {
    const Rounded a = random_rounded(256, seed, bf16), b = random_rounded(128, seed + 1, bf16);
    const auto c = random_vector<float>(128, seed + 2);
    DeviceArray<uint16_t> da(a.bits), db(b.bits);
    DeviceArray<float> dc(c), dd(128);
    if (load == Load::by_index) {
        launch(bf16 ? mma_by_index<true> : mma_by_index<false>, dim3(1), dim3(32), 0, nullptr, da.get(), db.get(),
               dc.get(), dd.get(), layout);
    } else {
        launch(bf16 ? mma_by_ldmatrix<true> : mma_by_ldmatrix<false>, dim3(1), dim3(32), 0, nullptr, da.get(), db.get(),
               dc.get(), dd.get(), load == Load::ldmatrix_k_major, trans_ok, layout);
    }
    CUDA_CHECK_LAUNCH();
    CUDA_CHECK(cudaDeviceSynchronize());
    return mma_mismatches(dd.download(), a, b, c);
}

TEST_CASE("mma.m16n8k16 bf16 and fp16: every output position against an fp64 product", "[kernels][mma]") {
    const Layout ptx;
    for (bool bf16 : {true, false}) {
        INFO((bf16 ? "bf16" : "fp16"));
        for (uint64_t seed : {11u, 12u, 13u}) {
            REQUIRE(run_product(bf16, Load::by_index, ptx, seed) == 0);
            REQUIRE(run_product(bf16, Load::ldmatrix_n_major, ptx, seed) == 0);
            REQUIRE(run_product(bf16, Load::ldmatrix_k_major, ptx, seed) == 0);
        }
    }
}

TEST_CASE("the mma checks catch planted layout bugs", "[kernels][mma]") {
    Layout swapped;  // lanes 5 (g 1, t 1) and 9 (g 2, t 1) trade fragments
    swapped.swap_a = 5, swapped.swap_b = 9;
    Layout shifted;  // groupID off by one
    shifted.group_shift = 1;
    for (bool bf16 : {true, false}) {
        INFO((bf16 ? "bf16" : "fp16"));
        for (Load load : {Load::by_index, Load::ldmatrix_n_major, Load::ldmatrix_k_major}) {
            CHECK(run_product(bf16, load, swapped, 21) > 0);
            CHECK(run_product(bf16, load, shifted, 22) > 0);
        }
        // B read with the wrong .trans, for both storage orders.
        CHECK(run_product(bf16, Load::ldmatrix_n_major, Layout{}, 23, /*trans_ok=*/false) > 0);
        CHECK(run_product(bf16, Load::ldmatrix_k_major, Layout{}, 24, /*trans_ok=*/false) > 0);
    }
}

// ---- ldmatrix alone --------------------------------------------------------------------------
// Four 8×8 matrices of 16-bit values in shared memory, rows kRowStride elements apart (48 bytes:
// rows need not be contiguous, only 16-byte aligned); lane l < 8·count names row l % 8 of
// matrix l / 8, the other lanes pass a null pointer (never read). out[lane][j] = register j.
constexpr int kRowStride = 24, kMatrixStride = 8 * kRowStride;

__global__ void ldmatrix_all(const uint16_t* m, uint32_t* out, int count, bool trans) {
    __shared__ __align__(16) uint16_t s[4 * kMatrixStride];
    const unsigned lane = threadIdx.x;
    for (unsigned i = lane; i < 4 * kMatrixStride; i += 32) s[i] = m[i];
    __syncwarp();
    const void* row = lane < 8u * unsigned(count) ? &s[(lane / 8) * kMatrixStride + (lane % 8) * kRowStride] : nullptr;
    uint32_t r[4] = {0xdeadbeefu, 0xdeadbeefu, 0xdeadbeefu, 0xdeadbeefu};
    if (count == 1) {
        uint32_t x[1];
        if (trans) {
            ldmatrix_x1_trans(x, row);
        } else {
            ldmatrix_x1(x, row);
        }
        r[0] = x[0];
    } else if (count == 2) {
        uint32_t x[2];
        if (trans) {
            ldmatrix_x2_trans(x, row);
        } else {
            ldmatrix_x2(x, row);
        }
        r[0] = x[0], r[1] = x[1];
    } else {
        if (trans) {
            ldmatrix_x4_trans(r, row);
        } else {
            ldmatrix_x4(r, row);
        }
    }
    for (int j = 0; j < 4; ++j) out[lane * 4 + unsigned(j)] = r[j];
}

// Elements that differ from what the layout says lane l, register j holds: matrix j, row l / 4,
// elements 2(l % 4) and 2(l % 4) + 1 (of the transposed matrix with .trans).
int ldmatrix_mismatches(const std::vector<uint32_t>& out, const std::vector<uint16_t>& m, int count, bool trans,
                        const Layout& L) {
    const bool t = trans != L.flip_trans;
    int bad = 0;
    for (unsigned lane = 0; lane < 32; ++lane)
        for (unsigned j = 0; j < 4; ++j)
            for (unsigned h = 0; h < 2; ++h) {
                const uint32_t reg = out[lane * 4 + j];
                if (j >= unsigned(count)) {
                    bad += reg != 0xdeadbeefu;  // registers beyond the count are not written
                    continue;
                }
                const unsigned row = L.group(lane), col = 2 * L.tid(lane) + h;
                const uint16_t expected =
                    t ? m[j * kMatrixStride + col * kRowStride + row] : m[j * kMatrixStride + row * kRowStride + col];
                bad += uint16_t(reg >> (16 * h)) != expected;
            }
    return bad;
}

TEST_CASE("ldmatrix x1, x2, x4 with and without .trans: every element", "[kernels][mma]") {
    std::vector<uint16_t> m(4 * kMatrixStride);
    std::mt19937 rng(31);
    for (auto& x : m) x = uint16_t(rng());  // distinct-enough patterns: a transposition shows
    DeviceArray<uint16_t> dm(m);
    DeviceArray<uint32_t> out(32 * 4);
    Layout swapped;
    swapped.swap_a = 5, swapped.swap_b = 9;
    Layout shifted;
    shifted.group_shift = 1;
    Layout flipped;
    flipped.flip_trans = true;
    for (int count : {1, 2, 4})
        for (bool trans : {false, true}) {
            INFO("x" << count << (trans ? ".trans" : ""));
            launch(ldmatrix_all, dim3(1), dim3(32), 0, nullptr, dm.get(), out.get(), count, trans);
            CUDA_CHECK_LAUNCH();
            const auto got = out.download();
            REQUIRE(ldmatrix_mismatches(got, m, count, trans, Layout{}) == 0);
            // The same check, given a wrong layout, must fail.
            CHECK(ldmatrix_mismatches(got, m, count, trans, swapped) > 0);
            CHECK(ldmatrix_mismatches(got, m, count, trans, shifted) > 0);
            CHECK(ldmatrix_mismatches(got, m, count, trans, flipped) > 0);
        }
}

// ---- cp.async ----------------------------------------------------------------------------------
// Each thread copies 16 bytes into each of four regions of dynamic shared memory: region 0 in
// group 0, region 1 in group 1, region 2 in group 2 with ignore-src set for every third thread
// (zeros; its source is far past the end of `src`, which must never be read), region 3 first
// without a commit. `seen` records what the thread's own regions held at each step (on the host,
// copies land only at the wait that retires their group); `landed` the neighbour thread's
// regions after every wait and a barrier.
constexpr int kSeen = 7;

__host__ __device__ inline bool ignores_src(unsigned thread) { return thread % 3 == 0; }

__global__ void cp_async_groups(const uint32_t* src, uint32_t* seen, uint32_t* landed, int src_words) {
    PV_DYNAMIC_SHARED(uint32_t, smem);
    const unsigned t = threadIdx.x, n = blockDim.x;
    auto region = [&](unsigned r, unsigned thread) { return smem + (r * n + thread) * 4; };
    auto source = [&](unsigned r) { return src + (r * n + t) * 4; };
    uint32_t* s = seen + t * kSeen;
    cp_async_16(region(0, t), source(0));
    cp_async_commit();
    cp_async_16(region(1, t), source(1));
    cp_async_commit();
    const bool ignore = ignores_src(t);
    cp_async_16_ignore_src(region(2, t), ignore ? src + src_words + 4096 * (t + 1) : source(2), ignore);
    cp_async_commit();
    s[0] = region(0, t)[0];  // before any wait
    cp_async_wait<2>();      // group 0 has landed
    s[1] = region(0, t)[0];
    s[2] = region(1, t)[0];
    cp_async_wait<1>();  // groups 0 and 1
    s[3] = region(1, t)[0];
    s[4] = region(2, t)[2];
    cp_async_wait<0>();  // all three
    s[5] = region(2, t)[2];
    cp_async_16(region(3, t), source(3));  // not committed: a wait does not cover it
    cp_async_wait<0>();
    s[6] = region(3, t)[0];
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    const unsigned other = (t + 1) % n;
    for (unsigned r = 0; r < 4; ++r)
        for (unsigned w = 0; w < 4; ++w) landed[(t * 4 + r) * 4 + w] = region(r, other)[w];
}

TEST_CASE("cp.async: groups land at their wait, ignore-src, uncommitted copies wait for a commit", "[kernels][mma]") {
    const unsigned n = 64;
    std::vector<uint32_t> src(4 * n * 4);
    std::mt19937 rng(41);
    for (auto& x : src) x = rng() & 0x7fffffffu;  // never the 0xFFFFFFFF poison
    DeviceArray<uint32_t> dsrc(src), seen(n * kSeen), landed(n * 16);
    launch(cp_async_groups, dim3(1), dim3(n), size_t(4 * n * 16), nullptr, dsrc.get(), seen.get(), landed.get(),
           int(src.size()));
    CUDA_CHECK_LAUNCH();
    const auto s = seen.download(), l = landed.download();
    auto expected = [&](unsigned r, unsigned thread, unsigned w) -> uint32_t {
        if (r == 2 && ignores_src(thread)) return 0;  // zeros, the source ignored
        return src[(r * n + thread) * 4 + w];
    };
    for (unsigned t = 0; t < n; ++t) {
        INFO("thread " << t);
        const unsigned other = (t + 1) % n;
        for (unsigned r = 0; r < 4; ++r)
            for (unsigned w = 0; w < 4; ++w) REQUIRE(l[(t * 4 + r) * 4 + w] == expected(r, other, w));
        REQUIRE(s[t * kSeen + 1] == expected(0, t, 0));
        REQUIRE(s[t * kSeen + 3] == expected(1, t, 0));
        REQUIRE(s[t * kSeen + 5] == expected(2, t, 2));
        if constexpr (kHostBackend) {
            // The deferred semantics (a GPU may land a copy early; the host never does).
            REQUIRE(s[t * kSeen + 0] == 0xFFFFFFFFu);  // nothing before the wait
            REQUIRE(s[t * kSeen + 2] == 0xFFFFFFFFu);  // group 1 still in flight after wait_group 2
            REQUIRE(s[t * kSeen + 4] == 0xFFFFFFFFu);  // group 2 still in flight after wait_group 1
            REQUIRE(s[t * kSeen + 6] == 0xFFFFFFFFu);  // an uncommitted copy is not waited for
        }
    }
}

// ---- a cp.async double buffer, and the race of reusing a buffer too early ------------------------
// n tiles of 8×8 16-bit values stream through two shared buffers: tile k + 1 is copied while
// every warp reads tile k with ldmatrix. Without the trailing barrier a fast thread's copy of tile
// k + 2 overwrites the buffer of tile k while slower warps may still read it: the write-after-read
// hazard that ThreadSanitizer must report (the copy's destination is written at issue).
template <bool trailing_barrier>
__global__ void pipelined_tile_sums(const uint16_t* tiles, int n, uint32_t* out) {
    PV_DYNAMIC_SHARED(uint16_t, s);  // [2][8 rows][8]
    const unsigned t = threadIdx.x, lane = t % 32;
    auto issue = [&](int k) {
        if (t < 8) cp_async_16(s + (k % 2) * 64 + t * 8, tiles + k * 64 + t * 8);
        cp_async_commit();  // (an empty group for the other threads)
    };
    issue(0);
    uint32_t acc = 0;
    for (int k = 0; k < n; ++k) {
        if (k + 1 < n) {
            issue(k + 1);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        uint32_t r[1];
        ldmatrix_x1(r, s + (k % 2) * 64 + (lane % 8) * 8);
        acc += r[0];
        if (trailing_barrier) __syncthreads();
    }
    out[t] = acc;
}

template <bool trailing_barrier>
void check_pipeline() {
    const int n = 5;
    std::vector<uint16_t> tiles(size_t(n) * 64);
    std::mt19937 rng(51);
    for (auto& x : tiles) x = uint16_t(rng());
    DeviceArray<uint16_t> d_tiles(tiles);
    DeviceArray<uint32_t> out(128);
    launch(pipelined_tile_sums<trailing_barrier>, dim3(1), dim3(128), 2 * 64 * sizeof(uint16_t), nullptr, d_tiles.get(),
           n, out.get());
    CUDA_CHECK_LAUNCH();
    const auto got = out.download();
    for (unsigned t = 0; t < 128; ++t) {
        const unsigned l = t % 32, row = l / 4, col = 2 * (l % 4);
        uint32_t expected = 0;
        for (int k = 0; k < n; ++k)
            expected += uint32_t(tiles[size_t(k * 64) + row * 8 + col]) |
                        uint32_t(tiles[size_t(k * 64) + row * 8 + col + 1]) << 16;
        REQUIRE(got[t] == expected);
    }
}

TEST_CASE("a cp.async double buffer streams tiles that every warp reads by ldmatrix", "[kernels][mma]") {
    check_pipeline<true>();
}
TEST_CASE("planted: cp.async into a buffer still being read", "[.planted]") { check_pipeline<false>(); }

TEST_CASE("ThreadSanitizer reports a cp.async overwriting a buffer other warps still read",
          "[host-only][tsan][planted][mma]") {
    const Environment env = {{"POLEVAULT_HOST_THREAD_ORDER", "in-order"},
                             {"POLEVAULT_HOST_STREAMS", "sync"},
                             {"TSAN_OPTIONS", "halt_on_error=0 exitcode=66 history_size=4"}};
    const ChildResult bug = run_in_child("planted: cp.async into a buffer still being read", env);
    INFO(bug.output);
    REQUIRE(bug.died);
    REQUIRE(bug.output.find("ThreadSanitizer: data race") != std::string::npos);
    REQUIRE(bug.output.find("cp_async_16") != std::string::npos);
    REQUIRE(bug.output.find("pipelined_tile_sums<false>") != std::string::npos);
}

// ---- dynamic shared memory: the opt-in limit ---------------------------------------------------
__global__ void touch_smem_ends(uint32_t* out, int words) {
    PV_DYNAMIC_SHARED(uint32_t, smem);
    if (threadIdx.x == 0) smem[0] = 1u, smem[words - 1] = 2u;
    __syncthreads();
    if (threadIdx.x == 0) out[0] = smem[0] + smem[words - 1];
}

TEST_CASE("dynamic shared memory above 48 KiB needs the opt-in, up to 227 KiB", "[kernels][mma]") {
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    REQUIRE(prop.sharedMemPerBlockOptin == 227 * 1024);
    DeviceArray<uint32_t> out(1);
    const size_t over = 48 * 1024 + 16, full = prop.sharedMemPerBlockOptin;
    launch(touch_smem_ends, dim3(1), dim3(32), over, nullptr, out.get(), int(over / 4));
    REQUIRE(cudaGetLastError() == cudaErrorInvalidValue);  // no opt-in: refused
    CUDA_CHECK(cudaFuncSetAttribute(touch_smem_ends, cudaFuncAttributeMaxDynamicSharedMemorySize, int(full)));
    for (size_t bytes : {over, full}) {
        out.poison();
        launch(touch_smem_ends, dim3(1), dim3(32), bytes, nullptr, out.get(), int(bytes / 4));
        CUDA_CHECK_LAUNCH();
        REQUIRE(out.download()[0] == 3u);
    }
    launch(touch_smem_ends, dim3(1), dim3(32), full + 16, nullptr, out.get(), int((full + 16) / 4));
    REQUIRE(cudaGetLastError() == cudaErrorInvalidValue);  // past the opt-in limit itself
    REQUIRE(cudaFuncSetAttribute(touch_smem_ends, cudaFuncAttributeMaxDynamicSharedMemorySize, int(full) + 1) ==
            cudaErrorInvalidValue);
    REQUIRE(cudaGetLastError() == cudaErrorInvalidValue);
}

// ---- misuse the host reports -------------------------------------------------------------------
__global__ void ldmatrix_unaligned(const uint16_t* m, uint32_t* out) {
    __shared__ __align__(16) uint16_t s[8 * 16];
    for (unsigned i = threadIdx.x; i < 8 * 16; i += 32) s[i] = m[i];
    __syncwarp();
    uint32_t r[1];
    ldmatrix_x1(r, &s[(threadIdx.x % 8) * 16 + 1]);  // 2 bytes past a 16-byte boundary
    out[threadIdx.x] = r[0];
}

__global__ void ldmatrix_from_global(const uint16_t* m, uint32_t* out) {
    uint32_t r[1];
    ldmatrix_x1(r, m + (threadIdx.x % 8) * 8);  // global memory, not shared
    out[threadIdx.x] = r[0];
}

__global__ void mma_half_warp(const uint32_t* in, float* out) {
    if (threadIdx.x >= 16) return;  // half the warp leaves: mma needs all 32 lanes
    const uint32_t a[4] = {in[0], in[1], in[2], in[3]}, b[2] = {in[4], in[5]};
    const float c[4] = {1, 2, 3, 4};
    float d[4];
    mma_m16n8k16_bf16(d, a, b, c);
    out[threadIdx.x] = d[0];
}

__global__ void cp_async_never_waited(const uint32_t* src, uint32_t* out) {
    __shared__ __align__(16) uint32_t s[32 * 4];
    cp_async_16(&s[threadIdx.x * 4], src + threadIdx.x * 4);
    cp_async_commit();
    out[threadIdx.x] = 1u;  // exits with the copy in flight
}

TEST_CASE("planted: ldmatrix unaligned", "[.planted]") {
    DeviceArray<uint16_t> m(std::vector<uint16_t>(128, 1));
    DeviceArray<uint32_t> out(32);
    launch(ldmatrix_unaligned, dim3(1), dim3(32), 0, nullptr, m.get(), out.get());
    CUDA_CHECK(cudaDeviceSynchronize());
}
TEST_CASE("planted: ldmatrix from global memory", "[.planted]") {
    DeviceArray<uint16_t> m(std::vector<uint16_t>(128, 1));
    DeviceArray<uint32_t> out(32);
    launch(ldmatrix_from_global, dim3(1), dim3(32), 0, nullptr, m.get(), out.get());
    CUDA_CHECK(cudaDeviceSynchronize());
}
TEST_CASE("planted: mma on half a warp", "[.planted]") {
    DeviceArray<uint32_t> in(std::vector<uint32_t>(8, 0x3f803f80u));
    DeviceArray<float> out(32);
    launch(mma_half_warp, dim3(1), dim3(32), 0, nullptr, in.get(), out.get());
    CUDA_CHECK(cudaDeviceSynchronize());
}
TEST_CASE("planted: cp.async never waited for", "[.planted]") {
    DeviceArray<uint32_t> src(std::vector<uint32_t>(128, 7u)), out(32);
    launch(cp_async_never_waited, dim3(1), dim3(32), 0, nullptr, src.get(), out.get());
    CUDA_CHECK(cudaDeviceSynchronize());
}

// Matrix j's rows `stride` 16-bit elements apart in shared memory (lane 8j + i names row i of
// matrix j, ldmatrix.x4): 64 (128 bytes) puts all 8 rows of a matrix on the same 4 banks, an
// 8-way conflict; 72 (144 bytes, a row padded by 16 bytes) puts them on all 32 banks, as do 64
// with the rows' 16-byte pieces swizzled (row i's piece c at c ^ i, kernels/mma.cuh shared_piece).
__global__ void ldmatrix_rows_apart(const uint16_t* m, uint32_t* out, int stride, bool swizzled) {
    __shared__ __align__(16) uint16_t s[32 * 72];
    for (unsigned i = threadIdx.x; i < 32 * 72; i += 32) s[i] = m[i];
    __syncwarp();
    const unsigned row = threadIdx.x;  // 0-31: matrix row / 8, its row row % 8; piece 1 of the row
    const unsigned piece = swizzled ? 1u ^ (row % 8) : 1u;
    uint32_t r[4];
    ldmatrix_x4(r, &s[row * unsigned(stride) + 8 * piece]);
    for (int j = 0; j < 4; ++j) out[4 * threadIdx.x + unsigned(j)] = r[j];
}

void run_ldmatrix_rows_apart(int stride, bool swizzled) {
    std::vector<uint16_t> bits(32 * 72);
    std::mt19937 rng(5150);
    for (auto& x : bits) x = uint16_t(rng());
    DeviceArray<uint16_t> m(bits);
    DeviceArray<uint32_t> out(128);
    launch(ldmatrix_rows_apart, dim3(1), dim3(32), 0, nullptr, m.get(), out.get(), stride, swizzled);
    CUDA_CHECK(cudaDeviceSynchronize());
}
TEST_CASE("planted: ldmatrix rows on the same banks", "[.planted]") { run_ldmatrix_rows_apart(64, false); }
TEST_CASE("ldmatrix rows padded or swizzled onto every bank", "[.bank-check]") {
    run_ldmatrix_rows_apart(72, false);
    run_ldmatrix_rows_apart(64, true);
}

TEST_CASE("ldmatrix's bank conflicts are reported under POLEVAULT_HOST_BANK_CONFLICTS, and only there",
          "[host-only][planted][mma]") {
    const Environment check = {{"POLEVAULT_HOST_BANK_CONFLICTS", "1"}};
    const ChildResult bug = run_in_child("planted: ldmatrix rows on the same banks", check);
    INFO(bug.output);
    REQUIRE_FALSE(bug.timed_out);
    REQUIRE(bug.died);
    CHECK(bug.output.find("ldmatrix.x4 at") != std::string::npos);
    CHECK(bug.output.find("test_warp_mma.cu:") != std::string::npos);
    CHECK(bug.output.find("bank conflicts: its 8-row matrices take 28 wavefront(s) more") != std::string::npos);
    CHECK(bug.output.find("ldmatrix_rows_apart") != std::string::npos);
    const ChildResult padded = run_in_child("ldmatrix rows padded or swizzled onto every bank", check);
    INFO(padded.output);
    CHECK_FALSE(padded.died);
    const ChildResult unchecked = run_in_child("planted: ldmatrix rows on the same banks");
    INFO(unchecked.output);
    CHECK_FALSE(unchecked.died);
}

TEST_CASE("misused warp matrix instructions are reported with the kernel's line", "[host-only][planted][mma]") {
    const std::pair<const char*, std::vector<const char*>> cases[] = {
        {"planted: ldmatrix unaligned", {"ldmatrix.x1 address", "is not 16-byte aligned", "test_warp_mma.cu:"}},
        {"planted: ldmatrix from global memory", {"is in global memory", "test_warp_mma.cu:"}},
        {"planted: mma on half a warp",
         {"mma.m16n8k16.bf16 (mask 0xffffffff) at", "can never complete", "which exited"}},
        {"planted: cp.async never waited for", {"cp.async copies that never landed", "test_warp_mma.cu:"}},
    };
    for (const auto& [name, expected] : cases) {
        const auto child = run_in_child(name);
        INFO(name << ":\n" << child.output);
        REQUIRE_FALSE(child.timed_out);
        REQUIRE(child.died);
        for (const char* text : expected) CHECK(child.output.find(text) != std::string::npos);
    }
}

}  // namespace warp_mma_test
