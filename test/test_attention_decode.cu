// Decode attention against a KV cache (kernels/attention_decode.cuh) against the fp64 reference of
// the whole causal problem (test/reference/attention.h): for a random sequence of L rows of qkv,
// the cache holds the keys and values of rows 0..p0+n−1 and the n new rows p0.. must give rows
// p0.. of the full causal attention. bf16, fp32 and fp64; decode (n = 1) at positions on and off
// the tile and chunk boundaries, a whole prefill (p0 = 0, n = L) and a prefill continuing a cache;
// head dims 64 and 128 (specialised) and 8, 48, 96 (generic); GQA groups of 1, 2, 3, 12 and 16
// query heads (more than 8 heads per KV head take several blocks); the automatic split and forced
// small chunks (many chunks merged, empty chunks for the early rows of a prefill).
//
// The cache rows past p0+n−1 and every output and scratch buffer are poisoned (NaN) before the
// launch: a kernel that reads a future key or leaves an output unwritten fails.
#include "kernels/attention_decode.cuh"
#include "test/check.h"
#include "test/reference/attention.h"

#include <cstring>

using namespace pv::test;

namespace attention_decode_test {

using pv::reference::AttentionShape;

constexpr bool kTsanBuild = pv::kThreadSanitizer;

struct Case {
    size_t L;      // rows of the whole sequence (the cache's capacity)
    size_t p0, n;  // the new rows
    size_t H, Hkv, hd;
    int chunk = 0;  // 0: the automatic split
};

std::string describe(const Case& c) {
    return "L " + std::to_string(c.L) + " p0 " + std::to_string(c.p0) + " n " + std::to_string(c.n) + " H " +
           std::to_string(c.H) + " Hkv " + std::to_string(c.Hkv) + " hd " + std::to_string(c.hd) + " chunk " +
           std::to_string(c.chunk);
}

// Rows p0..p0+n−1 of the kernel's output for the case (the cache filled from qkv as a decoder
// would: rows before p0 already there, the new rows stored by attention_decode_store_kv).
template <class T>
std::vector<T> run(const std::vector<T>& qkv, const Case& c) {
    const size_t width = (c.H + 2 * c.Hkv) * c.hd, kv = c.Hkv * c.hd;
    // The cache as the earlier steps left it: rows < p0 written, the rest poison.
    std::vector<T> k_host(c.L * kv), v_host(c.L * kv);
    DeviceArray<T> k_cache(c.L * kv), v_cache(c.L * kv);
    std::vector<T> poison = k_cache.download();  // NaN bytes
    for (size_t r = 0; r < c.L; ++r)
        for (size_t d = 0; d < kv; ++d) {
            const bool written = r < c.p0;
            k_host[r * kv + d] = written ? qkv[r * width + c.H * c.hd + d] : poison[r * kv + d];
            v_host[r * kv + d] = written ? qkv[r * width + (c.H + c.Hkv) * c.hd + d] : poison[r * kv + d];
        }
    k_cache.upload(k_host);
    v_cache.upload(v_host);
    // The new rows' qkv, as the decoder's projection leaves them.
    const std::vector<T> rows(qkv.begin() + long(c.p0 * width), qkv.begin() + long((c.p0 + c.n) * width));
    DeviceArray<T> d_rows(rows), out(c.n * c.H * c.hd);
    const size_t scratch_bytes =
        pv::attention_decode_scratch_bytes<T>(int(c.n), int(c.p0 + c.n), int(c.H), int(c.Hkv), int(c.hd), c.chunk);
    DeviceArray<unsigned char> scratch(std::max<size_t>(scratch_bytes, 1));
    pv::attention_decode_store_kv(d_rows.get() + c.H * c.hd, d_rows.get() + (c.H + c.Hkv) * c.hd, (long long)width,
                                  k_cache.get(), v_cache.get(), int(c.n), int(c.p0), int(kv), nullptr);
    pv::attention_decode(d_rows.get(), (long long)width, k_cache.get(), v_cache.get(), out.get(), int(c.n), int(c.p0),
                         int(c.H), int(c.Hkv), int(c.hd), scratch_bytes ? scratch.get() : nullptr, scratch_bytes,
                         nullptr, c.chunk);
    // The store wrote the new rows' keys and values, exactly, and nothing else.
    const std::vector<T> k_after = k_cache.download(), v_after = v_cache.download();
    size_t wrong = 0;
    for (size_t r = 0; r < c.L; ++r) {
        const bool stored = r >= c.p0 && r < c.p0 + c.n;
        for (size_t d = 0; d < kv; ++d) {
            const T k_expected = stored ? qkv[r * width + c.H * c.hd + d] : k_host[r * kv + d];
            const T v_expected = stored ? qkv[r * width + (c.H + c.Hkv) * c.hd + d] : v_host[r * kv + d];
            wrong += std::memcmp(&k_after[r * kv + d], &k_expected, sizeof(T)) != 0;
            wrong += std::memcmp(&v_after[r * kv + d], &v_expected, sizeof(T)) != 0;
        }
    }
    INFO(describe(c) << ": cache elements other than expected after the store");
    REQUIRE(wrong == 0);
    return out.download();
}

// q and k in [-2, 2]: peaked rows, so the online softmax and the merge rescale for real.
template <class T>
void check(const Case& c, uint64_t seed) {
    const AttentionShape s{1, c.L, c.H, c.Hkv, c.hd};
    const auto qkv = random_vector<T>(c.L * s.width(), seed, -2.0, 2.0);
    const std::vector<T> got = run(qkv, c);
    std::vector<double> ref_out, ref_lse;
    pv::reference::attention_forward(to_double(qkv), s, ref_out, ref_lse);
    const size_t row = c.H * c.hd;
    const std::vector<double> expected(ref_out.begin() + long(c.p0 * row), ref_out.begin() + long((c.p0 + c.n) * row));
    const std::string err = compare(to_double(got), expected, tolerance<T>());
    INFO(describe(c) << " " << (sizeof(T) == 2 ? "bf16" : sizeof(T) == 4 ? "fp32" : "fp64") << "\n" << err);
    REQUIRE(err.empty());
}

void check_all_types(const Case& c, uint64_t seed) {
    check<double>(c, seed);
    check<float>(c, seed + 1);
    check<__nv_bfloat16>(c, seed + 2);
}

}  // namespace attention_decode_test

using namespace attention_decode_test;

TEST_CASE("decode attention of one new row equals the last row of full causal attention", "[kernels][decode]") {
    if (kTsanBuild) {  // races need a few tiles and a merge, not many shapes
        check_all_types({70, 69, 1, 4, 2, 64, 32}, 1);
        check_all_types({40, 39, 1, 3, 1, 8, 0}, 2);
        return;
    }
    // Positions 0 (one key), on and around the 32-key tile and the 64-key minimum chunk, past
    // several chunks; every head dim and grouping rotates through them.
    const size_t positions[] = {0, 1, 31, 32, 33, 64, 130, 300};
    const std::pair<size_t, size_t> heads[] = {{1, 1}, {4, 2}, {9, 3}, {12, 1}, {16, 1}};
    const size_t dims[] = {8, 64, 128, 48};
    size_t k = 0;
    for (size_t t : positions) {
        const auto [H, Hkv] = heads[k % 5];
        check_all_types({t + 3, t, 1, H, Hkv, dims[k % 4]}, 10 + 3 * k);
        ++k;
    }
}

TEST_CASE("decode attention merges forced small chunks, of any length, exactly like one pass", "[kernels][decode]") {
    if (kTsanBuild) return;
    // Chunks of 20 keys (not a multiple of the tile: tiles start mid-chunk), 33, and 1 key each.
    check_all_types({101, 100, 1, 4, 2, 64, 20}, 100);
    check_all_types({90, 77, 1, 9, 3, 96, 33}, 110);
    check_all_types({20, 17, 1, 2, 1, 128, 1}, 120);
}

TEST_CASE("prefill: many new rows at once, from an empty cache and continuing one", "[kernels][decode]") {
    if (kTsanBuild) return;
    check_all_types({37, 0, 37, 4, 2, 64, 0}, 200);    // a whole prompt in one pass
    check_all_types({45, 20, 13, 6, 2, 8, 0}, 210);    // a second pass after 20 cached rows
    check_all_types({45, 0, 45, 4, 1, 128, 16}, 220);  // forced chunks: rows 0..15 leave two chunks empty
    check_all_types({50, 9, 41, 16, 1, 48, 24}, 230);  // two head slices per KV head, chunked
}

TEST_CASE("decode attention: the automatic split gives one chunk to a long prefill and many to one row",
          "[kernels][decode]") {
    // One decode row at 4096 keys with 8 KV heads: 8 blocks alone, so the keys split into many
    // chunks (flash-decoding); a 512-row prefill already has 4096 blocks and takes one chunk.
    const auto decode = pv::attention_decode_split(1, 4096, 32, 8);
    REQUIRE(decode.chunks > 16);
    REQUIRE(decode.chunk % 32 == 0);
    REQUIRE(decode.chunk * decode.chunks >= 4096);
    REQUIRE(pv::attention_decode_split(512, 4096, 32, 8).chunks == 1);
    REQUIRE(pv::attention_decode_split(1, 10, 32, 8).chunks == 1);  // below the minimum chunk
    // The bound covers every call within it.
    const size_t bound = pv::attention_decode_scratch_bound<float>(300, 2000, 9, 3, 64);
    for (int n : {1, 2, 3, 7, 50, 300})
        for (int kv = n; kv <= 2000; kv += 37)
            REQUIRE(pv::attention_decode_scratch_bytes<float>(n, kv, 9, 3, 64) <= bound);
}
