// NF4 field placement within a parameter group (model/nf4_layout.h).
#include "model/nf4_layout.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

namespace pv {

namespace {

constexpr long long kBlock = 64, kNestedBlock = 256;  // kernels/nf4.cuh kNf4BlockSize, kNf4NestedBlockSize

long long align(long long x) { return (x + kNf4FieldAlignment - 1) / kNf4FieldAlignment * kNf4FieldAlignment; }
long long blocks_of(long long n) { return (n + kBlock - 1) / kBlock; }

// Where part p of `spec` sits in its whole module's blocks (Nf4PartFields' block map), or a
// refusal when the slice cuts a block.
void map_blocks(const TensorSpec& spec, const TensorPart& p, Nf4PartFields& f) {
    const long long whole_cols = spec.whole_cols(), whole_n = p.whole_rows() * whole_cols;
    f.nested_blocks = (blocks_of(whole_n) + kNestedBlock - 1) / kNestedBlock;
    const long long col_begin = spec.slice.whole() ? 0 : spec.slice.col_begin;
    if (f.n == 0 || (p.hf_row_begin == 0 && p.rows == p.whole_rows() && spec.cols == whole_cols)) return;  // whole
    const std::string where = "NF4 under tensor parallelism: " + spec.name + "'s slice of " + p.hf_name + " (";
    const std::string why = ") would cut the module's 64-element quantisation blocks (bitsandbytes quantises each "
                            "module whole, in blocks of 64 consecutive elements of its rows)";
    if (spec.cols == whole_cols) {  // a block of rows: elements [e0, e1) of the flattened module
        const long long e0 = p.hf_row_begin * whole_cols, e1 = e0 + f.n;
        if (e0 % kBlock != 0 || (e1 % kBlock != 0 && e1 != whole_n))
            throw std::invalid_argument(where + "rows [" + std::to_string(p.hf_row_begin) + ", " +
                                        std::to_string(p.hf_row_begin + p.rows) + ") of " +
                                        std::to_string(p.whole_rows()) + ", " + std::to_string(whole_cols) +
                                        " columns each" + why);
        f.block_first = e0 / kBlock, f.block_run = blocks_of(f.n), f.block_stride = 0;
        return;
    }
    if (whole_cols % kBlock != 0 || col_begin % kBlock != 0 || spec.cols % kBlock != 0)  // a block of columns
        throw std::invalid_argument(where + "columns [" + std::to_string(col_begin) + ", " +
                                    std::to_string(col_begin + spec.cols) + ") of " + std::to_string(whole_cols) +
                                    why);
    f.block_first = (p.hf_row_begin * whole_cols + col_begin) / kBlock;
    f.block_run = spec.cols / kBlock, f.block_stride = whole_cols / kBlock;
}

}  // namespace

std::vector<Nf4PartFields> nf4_part_fields(const TensorSpec& spec, bool double_quant) {
    std::vector<Nf4PartFields> out;
    long long at = 0;
    for (const TensorPart& p : spec.parts) {
        Nf4PartFields f;
        f.n = p.rows * spec.cols;
        f.row_begin = p.row_begin;
        map_blocks(spec, p, f);
        const long long blocks = blocks_of(f.n);
        f.codes = align(at);
        f.absmax = align(f.codes + (f.n + 1) / 2);
        if (double_quant) {
            f.nested = align(f.absmax + blocks);
            f.offset = align(f.nested + 4 * f.nested_blocks);
            f.end = f.offset + 4;
        } else {
            f.end = f.absmax + 4 * blocks;
        }
        at = f.end;
        out.push_back(f);
    }
    return out;
}

long long nf4_slot_bytes(const TensorSpec& spec, bool double_quant) {
    const auto fields = nf4_part_fields(spec, double_quant);
    return fields.empty() ? 0 : fields.back().end;
}

void nf4_slice_fields(const TensorSpec& whole, const TensorSpec& slice, bool double_quant, const uint8_t* whole_slot,
                      uint8_t* out) {
    const std::vector<Nf4PartFields> from = nf4_part_fields(whole, double_quant), to = nf4_part_fields(slice, double_quant);
    if (from.size() != to.size())
        throw std::logic_error("nf4_slice_fields: " + slice.name + " has " + std::to_string(to.size()) +
                               " parts, the whole tensor " + std::to_string(from.size()));
    const long long absmax_bytes = double_quant ? 1 : 4;  // an absmax code or an fp32 absmax per block
    for (size_t p = 0; p < to.size(); ++p) {
        const Nf4PartFields &w = from[p], &s = to[p];
        const long long blocks = blocks_of(s.n), run = s.block_run > 0 ? s.block_run : std::max(blocks, 1LL);
        const long long code_bytes = (s.n + 1) / 2, whole_code_bytes = (w.n + 1) / 2;
        for (long long j = 0; j < blocks; j += run) {
            const long long g = s.block_first + (j / run) * s.block_stride, k = std::min(run, blocks - j);
            const long long codes = std::min(k * kBlock / 2, code_bytes - j * kBlock / 2);
            if (g + k > blocks_of(w.n) || g * kBlock / 2 + codes > whole_code_bytes)
                throw std::logic_error("nf4_slice_fields: " + slice.name + "'s blocks leave the whole tensor's");
            std::memcpy(out + s.codes + j * kBlock / 2, whole_slot + w.codes + g * kBlock / 2, size_t(codes));
            std::memcpy(out + s.absmax + j * absmax_bytes, whole_slot + w.absmax + g * absmax_bytes,
                        size_t(k * absmax_bytes));
        }
        if (!double_quant) continue;
        std::memcpy(out + s.nested, whole_slot + w.nested, size_t(4 * s.nested_blocks));
        std::memcpy(out + s.offset, whole_slot + w.offset, 4);
    }
}

}  // namespace pv
