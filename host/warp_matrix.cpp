// What mma.sync m16n8k16 and ldmatrix compute from the 32 lanes' registers, with the PTX ISA's
// fragment layouts (host/warp_matrix.h says how they run as warp collectives).
//
// mma.m16n8k16 (groupID g = lane / 4, t = lane % 4; a register holds two 16-bit values, the
// lower column or k index in its low half):
//   A 16×16 row-major, 4 registers: a[0] (row g, cols 2t, 2t+1), a[1] (row g+8, same cols),
//     a[2] (row g, cols 2t+8, 2t+9), a[3] (row g+8, cols 2t+8, 2t+9);
//   B 16×8 (k × n), 2 registers: b[0] (k 2t, 2t+1; n g), b[1] (k 2t+8, 2t+9; n g);
//   C, D 16×8 fp32, 4 floats: c[0], c[1] (row g, cols 2t, 2t+1), c[2], c[3] (row g+8, same cols).
// Every product of two bf16 (or fp16) values is exact in double and the 16 of a dot product sum
// exactly unless their exponents differ widely, so D = C + Σ_k A·B is computed in double and
// rounded once to fp32: the tensor core's result up to its accumulation order and rounding.
//
// ldmatrix.m8n8.xN: lane l (l < 8N) names row l % 8 of matrix l / 8 (eight 16-bit values).
// Register j of lane l receives matrix j, row l / 4, elements 2(l % 4) and 2(l % 4) + 1; with
// .trans the same positions of the transposed matrix, i.e. column l / 4, rows 2(l % 4) and
// 2(l % 4) + 1 of the matrix as stored.
#include "host/warp_matrix.h"

#include <algorithm>
#include <bit>

namespace pv::host {
namespace {

// The 16-bit value `index` (0 = low half of word 0) of a lane's words.
uint16_t half_at(const LaneWords& lane, unsigned word_offset, unsigned index) {
    return uint16_t(lane.w[word_offset + index / 2] >> (16 * (index % 2)));
}
uint32_t pack(uint16_t lo, uint16_t hi) { return uint32_t(lo) | (uint32_t(hi) << 16); }

double bf16_value(uint16_t bits) { return double(std::bit_cast<float>(uint32_t(bits) << 16)); }
double f16_value(uint16_t bits) {
    __half_raw raw;
    raw.x = bits;
    return double(__half2float(__half(raw)));
}

template <double (*value)(uint16_t)>
void mma_m16n8k16(const LaneWords* in, LaneWords* out) {
    // Each lane's registers into the matrices, lane by lane (the layouts above; g = lane / 4,
    // t = lane % 4): A register r holds row g + 8·(r % 2), cols 2t + 8·(r / 2) and the next; B
    // register r holds k 2t + 8r and the next, column g.
    double a[16][16], b[16][8];
    for (unsigned l = 0; l < 32; ++l) {
        const unsigned g = l / 4, t = l % 4;
        for (unsigned r = 0; r < 4; ++r) {
            const unsigned row = g + 8 * (r % 2), col = 2 * t + 8 * (r / 2);
            a[row][col] = value(uint16_t(in[l].w[r])), a[row][col + 1] = value(uint16_t(in[l].w[r] >> 16));
        }
        for (unsigned r = 0; r < 2; ++r) {
            const unsigned k = 2 * t + 8 * r;
            b[k][g] = value(uint16_t(in[l].w[4 + r])), b[k + 1][g] = value(uint16_t(in[l].w[4 + r] >> 16));
        }
    }
    // D's element j of lane l: row g + 8·(j / 2), col 2t + j % 2, from C's element j of the lane.
    for (unsigned l = 0; l < 32; ++l) {
        const unsigned g = l / 4, t = l % 4;
        for (unsigned j = 0; j < 4; ++j) {
            const unsigned row = g + 8 * (j / 2), n = 2 * t + j % 2;
            double acc = double(std::bit_cast<float>(in[l].w[6 + j]));
            for (unsigned k = 0; k < 16; ++k) acc += a[row][k] * b[k][n];
            out[l].w[j] = std::bit_cast<uint32_t>(float(acc));
        }
    }
}

}  // namespace

void mma_m16n8k16_bf16_combine(const LaneWords* in, LaneWords* out) { mma_m16n8k16<&bf16_value>(in, out); }
void mma_m16n8k16_f16_combine(const LaneWords* in, LaneWords* out) { mma_m16n8k16<&f16_value>(in, out); }

// The shared-memory wavefronts beyond one per 8-row matrix that an ldmatrix takes: per matrix, the
// most distinct 4-byte words among its rows' 32 that fall on one of the 32 banks (word address
// mod 32), less one. Lane 8j + i's words 4 and 5 hold the address of row i of matrix j. The count
// is the same wherever the shared memory starts: a common offset only renames the banks.
template <int Count>
unsigned ldmatrix_extra_wavefronts(const LaneWords* in) {
    unsigned extra = 0;
    for (int j = 0; j < Count; ++j) {
        uint64_t words[32];
        for (int i = 0; i < 8; ++i) {
            const LaneWords& row = in[8 * j + i];
            const uint64_t address = uint64_t(row.w[4]) | uint64_t(row.w[5]) << 32;
            for (int k = 0; k < 4; ++k) words[4 * i + k] = address / 4 + uint64_t(k);
        }
        unsigned worst = 1;
        for (unsigned bank = 0; bank < 32; ++bank) {
            unsigned distinct = 0;
            for (int a = 0; a < 32; ++a) {
                if (words[a] % 32 != bank) continue;
                bool seen = false;
                for (int b = 0; b < a && !seen; ++b) seen = words[b] == words[a];
                distinct += !seen;
            }
            worst = std::max(worst, distinct);
        }
        extra += worst - 1;
    }
    return extra;
}

template <int Count, bool Trans>
void ldmatrix_combine(const LaneWords* in, LaneWords* out) {
    const unsigned extra = bank_conflict_check() ? ldmatrix_extra_wavefronts<Count>(in) : 0;
    for (unsigned l = 0; l < 32; ++l) out[l].w[4] = extra;
    for (unsigned l = 0; l < 32; ++l)
        for (unsigned j = 0; j < unsigned(Count); ++j) {
            const unsigned row = l / 4, col = 2 * (l % 4);  // of the matrix as the lane receives it
            const LaneWords* rows = in + 8 * j;             // lane 8j + i gave row i of matrix j
            out[l].w[j] = Trans ? pack(half_at(rows[col], 0, row), half_at(rows[col + 1], 0, row))
                                : pack(half_at(rows[row], 0, col), half_at(rows[row], 0, col + 1));
        }
}
template void ldmatrix_combine<1, false>(const LaneWords*, LaneWords*);
template void ldmatrix_combine<2, false>(const LaneWords*, LaneWords*);
template void ldmatrix_combine<4, false>(const LaneWords*, LaneWords*);
template void ldmatrix_combine<1, true>(const LaneWords*, LaneWords*);
template void ldmatrix_combine<2, true>(const LaneWords*, LaneWords*);
template void ldmatrix_combine<4, true>(const LaneWords*, LaneWords*);

}  // namespace pv::host
