// Where a group's elements are in Hugging Face terms: the element range of every HF tensor a group
// holds, and the tensor (and index in it) of one element. A group's tensor slot may fuse several HF
// tensors ([Wq; Wk; Wv], [Wgate; Wup]): part p of slot s covers rows [row_begin, row_begin + rows)
// of the slot, so elements [offset + row_begin·cols, offset + (row_begin + rows)·cols) of the
// group (row-major). Padding and alignment gaps belong to no part.
//
// Used where a message must name a tensor from an element index: the non-finite reports of a
// training step (trainer/step_checks.h) and the finiteness checks of a checkpoint on resume
// (trainer/load.h).
#pragma once

#include "model/parameters.h"

#include <string>
#include <vector>

namespace pv {

// One HF tensor of a group: its name and its elements [begin, end) of the padded group.
struct GroupPart {
    std::string name;
    long long begin = 0, end = 0;
};

// Every HF tensor of `layout`, in group order.
inline std::vector<GroupPart> group_parts(const GroupLayout& layout) {
    std::vector<GroupPart> out;
    for (const TensorSlot& t : layout.tensors)
        for (const TensorPart& p : t.spec.parts)
            out.push_back(
                {p.hf_name, t.offset + p.row_begin * t.spec.cols, t.offset + (p.row_begin + p.rows) * t.spec.cols});
    return out;
}

// "model.layers.0.mlp.up_proj.weight element 17": the HF tensor holding element `element` of the
// group and the element's row-major index in it; "padding element E" outside every tensor.
inline std::string group_element_name(const GroupLayout& layout, long long element) {
    for (const GroupPart& p : group_parts(layout))
        if (element >= p.begin && element < p.end) return p.name + " element " + std::to_string(element - p.begin);
    return "padding element " + std::to_string(element);
}

}  // namespace pv
