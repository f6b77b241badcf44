// NF4 field placement within a parameter group (model/nf4_layout.h).
#include "model/nf4_layout.h"

namespace pv {

namespace {

long long align(long long x) { return (x + kNf4FieldAlignment - 1) / kNf4FieldAlignment * kNf4FieldAlignment; }

}  // namespace

std::vector<Nf4PartFields> nf4_part_fields(const TensorSpec& spec, bool double_quant) {
    std::vector<Nf4PartFields> out;
    long long at = 0;
    for (const TensorPart& p : spec.parts) {
        Nf4PartFields f;
        f.n = p.rows * spec.cols;
        f.row_begin = p.row_begin;
        const long long blocks = (f.n + 63) / 64, nested = (blocks + 255) / 256;
        f.codes = align(at);
        f.absmax = align(f.codes + (f.n + 1) / 2);
        if (double_quant) {
            f.nested = align(f.absmax + blocks);
            f.offset = align(f.nested + 4 * nested);
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

}  // namespace pv
