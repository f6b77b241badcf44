// The warp-level matrix instructions of sm_80+ for kernels compiled by g++ (BACKEND=host):
// mma.sync m16n8k16 (bf16, fp16), ldmatrix (x1/x2/x4, .trans) and cp.async with its commit and
// wait groups. The API is the one platform/platform.h gives nvcc as inline PTX; the fragment
// layouts are the PTX ISA's ("Matrix Fragments for mma.m16n8k16 with floating point type",
// "Warp-level matrix load instruction: ldmatrix"), implemented in host/warp_matrix.cpp.
//
// How they run here, strictly, so a kernel that would fail on a GPU fails its test on the CPU:
// - mma and ldmatrix are warp collectives (warp_exchange in host/block_runner.cpp): all 32
//   lanes at the same instruction, converged, or the block runner reports it. Each lane hands
//   over its fragments (ldmatrix: the 16-byte row its address names, read here, by the lane
//   itself, so ThreadSanitizer sees which thread read which shared memory); the last lane to
//   arrive computes every lane's result in host/ (uninstrumented). Like shuffles, they order no
//   memory: a kernel needs __syncwarp/__syncthreads between storing a tile and ldmatrix of it.
// - ldmatrix and cp.async check that addresses are 16-byte aligned and that shared-memory
//   operands are not global or local memory (when that can be known: dynamic shared memory,
//   device allocations and the thread's own stack are known; static __shared__ is assumed).
// - With POLEVAULT_HOST_BANK_CONFLICTS=1, an ldmatrix whose 8-row matrices do not each fit one
//   shared-memory wavefront (two of its rows' 4-byte words on one of the 32 banks at different
//   addresses: a bank conflict) is reported with its site. A tile layout's padding or swizzle
//   exists to avoid exactly that, and its results are right either way, so only this shows it.
// - cp.async is deferred: the source is read at issue, the destination is filled with 0xFF
//   bytes at issue (its contents are undefined until the wait), and the copy lands only when
//   cp_async_wait<N> retires its group (all committed groups but the N most recent). Copies not
//   yet committed never land at a wait (PTX's wait_group covers committed groups only), and a
//   thread that exits with copies pending is reported. The landing write is done here, by the
//   issuing thread at its wait, so ThreadSanitizer attributes it to that thread.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <source_location>

namespace pv::host {

// What one lane contributes to, or receives from, a warp exchange (mma: A 4, B 2, C 4 words).
struct LaneWords {
    uint32_t w[10];
};
// Computes all 32 lanes' results from all 32 lanes' contributions.
using WarpExchangeFn = void (*)(const LaneWords* in, LaneWords* out);
// A full-warp collective: every lane of the warp calls it with the same `combine` at the same
// site; each gets out[its lane]. `name` names the instruction in diagnostics.
LaneWords warp_exchange(WarpExchangeFn combine, const char* name, const LaneWords& mine, std::source_location site);

// The combine functions of the instructions (host/warp_matrix.cpp).
void mma_m16n8k16_bf16_combine(const LaneWords* in, LaneWords* out);
void mma_m16n8k16_f16_combine(const LaneWords* in, LaneWords* out);
template <int Count, bool Trans>
void ldmatrix_combine(const LaneWords* in, LaneWords* out);

// The calling emulated thread's lane (0-31).
unsigned current_lane();
// Whether POLEVAULT_HOST_BANK_CONFLICTS asks for ldmatrix's bank conflicts to be reported (read once).
bool bank_conflict_check();
// Reports (aborts) an ldmatrix whose matrices took `extra` wavefronts more than one each.
[[noreturn]] void report_bank_conflicts(unsigned extra, const char* what, std::source_location site);
// Aborts with a message naming `what` and `site` unless `p` is 16-byte aligned and may be
// shared memory (see the top of this file).
void check_shared_operand(const void* p, const char* what, std::source_location site);
void check_aligned_16(const void* p, const char* what, std::source_location site);

// One queued cp.async: the bytes read at issue and where they land.
struct CpAsyncCopy {
    void* dst;
    unsigned char bytes[16];
};
// The calling thread's cp.async queue (block_runner.cpp keeps one per emulated thread).
void cp_async_issue(void* dst, const unsigned char (&bytes)[16], std::source_location site);
void cp_async_commit_group();
// Pops the oldest copy whose committed group is older than the `pending` most recent ones;
// false when there is none.
bool cp_async_next_ready(int pending, CpAsyncCopy& copy);

}  // namespace pv::host

namespace pv {

namespace host {
template <class T>
inline void fragment_to_words(const T& from, uint32_t* words) {
    std::memcpy(words, &from, sizeof(T));
}
inline LaneWords mma_operands(const uint32_t (&a)[4], const uint32_t (&b)[2], const float (&c)[4]) {
    LaneWords mine;
    fragment_to_words(a, mine.w);
    fragment_to_words(b, mine.w + 4);
    fragment_to_words(c, mine.w + 6);
    return mine;
}
template <int Count, bool Trans>
inline void ldmatrix(uint32_t (&r)[Count], const void* smem_row, const char* name, std::source_location site) {
    LaneWords mine{};
    if (current_lane() < 8u * Count) {  // only these lanes' addresses are read
        check_shared_operand(smem_row, name, site);
        std::memcpy(mine.w, smem_row, 16);
        const auto address = uint64_t(reinterpret_cast<uintptr_t>(smem_row));  // for the bank check
        mine.w[4] = uint32_t(address), mine.w[5] = uint32_t(address >> 32);
    }
    const LaneWords got = warp_exchange(&ldmatrix_combine<Count, Trans>, name, mine, site);
    for (int j = 0; j < Count; ++j) r[j] = got.w[j];
    if (got.w[4] != 0 && current_lane() == 0) report_bank_conflicts(got.w[4], name, site);
}
}  // namespace host

// D = A·B + C, mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 (fragment layouts: mma-api).
inline void mma_m16n8k16_bf16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], const float (&c)[4],
                              std::source_location site = std::source_location::current()) {
    const host::LaneWords got =
        host::warp_exchange(&host::mma_m16n8k16_bf16_combine, "mma.m16n8k16.bf16", host::mma_operands(a, b, c), site);
    std::memcpy(d, got.w, sizeof d);
}
// The same with fp16 A and B.
inline void mma_m16n8k16_f16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], const float (&c)[4],
                             std::source_location site = std::source_location::current()) {
    const host::LaneWords got =
        host::warp_exchange(&host::mma_m16n8k16_f16_combine, "mma.m16n8k16.f16", host::mma_operands(a, b, c), site);
    std::memcpy(d, got.w, sizeof d);
}

// ldmatrix.sync.aligned.m8n8.{x1,x2,x4}{,.trans}.shared.b16.
inline void ldmatrix_x1(uint32_t (&r)[1], const void* smem_row,
                        std::source_location site = std::source_location::current()) {
    host::ldmatrix<1, false>(r, smem_row, "ldmatrix.x1", site);
}
inline void ldmatrix_x2(uint32_t (&r)[2], const void* smem_row,
                        std::source_location site = std::source_location::current()) {
    host::ldmatrix<2, false>(r, smem_row, "ldmatrix.x2", site);
}
inline void ldmatrix_x4(uint32_t (&r)[4], const void* smem_row,
                        std::source_location site = std::source_location::current()) {
    host::ldmatrix<4, false>(r, smem_row, "ldmatrix.x4", site);
}
inline void ldmatrix_x1_trans(uint32_t (&r)[1], const void* smem_row,
                              std::source_location site = std::source_location::current()) {
    host::ldmatrix<1, true>(r, smem_row, "ldmatrix.x1.trans", site);
}
inline void ldmatrix_x2_trans(uint32_t (&r)[2], const void* smem_row,
                              std::source_location site = std::source_location::current()) {
    host::ldmatrix<2, true>(r, smem_row, "ldmatrix.x2.trans", site);
}
inline void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem_row,
                              std::source_location site = std::source_location::current()) {
    host::ldmatrix<4, true>(r, smem_row, "ldmatrix.x4.trans", site);
}

// cp.async.cg.shared.global, 16 bytes; with ignore_src (PTX's ignore-src predicate) the bytes are
// zeros and global_src is never read, nor checked: it may lie outside any allocation.
inline void cp_async_16_ignore_src(void* smem_dst, const void* global_src, bool ignore_src,
                                   std::source_location site = std::source_location::current()) {
    host::check_shared_operand(smem_dst, "cp.async destination", site);
    unsigned char bytes[16] = {};
    if (!ignore_src) {  // two fixed-size loads: the traffic meter's instrumentation sees them
        host::check_aligned_16(global_src, "cp.async source", site);
        uint64_t half[2];
        std::memcpy(&half[0], global_src, 8);
        std::memcpy(&half[1], static_cast<const unsigned char*>(global_src) + 8, 8);
        std::memcpy(bytes, half, 16);
    }
    // Undefined until the wait retires the copy. A copy, not memset: GCC folds a 16-byte memcpy
    // into stores ThreadSanitizer instruments, but expands memset after its instrumentation pass,
    // which would hide a write-after-read hazard on the buffer (another thread still reading it).
    static constexpr unsigned char poison[16] = {0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF,
                                                 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF};
    std::memcpy(smem_dst, poison, 16);
    host::cp_async_issue(smem_dst, bytes, site);
}
inline void cp_async_16(void* smem_dst, const void* global_src,
                        std::source_location site = std::source_location::current()) {
    cp_async_16_ignore_src(smem_dst, global_src, false, site);
}
// cp.async.commit_group: the copies issued since the last commit become one group.
inline void cp_async_commit() { host::cp_async_commit_group(); }
// cp.async.wait_group N: every committed group but the N most recent has landed.
template <int N>
inline void cp_async_wait() {
    static_assert(N >= 0, "cp_async_wait: N counts pending groups");
    host::CpAsyncCopy copy;
    while (host::cp_async_next_ready(N, copy)) std::memcpy(copy.dst, copy.bytes, 16);
}

}  // namespace pv
