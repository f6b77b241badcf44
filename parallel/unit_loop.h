// The plain loop over a model's units (DESIGN.md §2), which every strategy runs.
//
// Forward: embedding -> blocks -> head, each unit reading the previous unit's output from that
// unit's arena. Backward: head -> blocks -> embedding, the residual stream's gradient passed
// between two buffers in turn, with optional hooks around each unit (where DDP starts a
// bucket's all-reduce). The caller zeroes the gradients at the start of an optimizer step and
// passes the loss scale 1 / (global count of counted tokens) (DESIGN.md §4).
#pragma once

#include "model/llama.h"

namespace pv {

// `before_unit(u)` runs before unit u's forward (where ZeRO-3 binds the unit's gathered
// parameters).
template <class T, class BeforeUnit>
void single_forward(Llama<T>& model, int slot, const int* tokens, const int* targets, acc_t<T>* loss_sum, int* count,
                    BeforeUnit&& before_unit) {
    const int units = model.num_units();
    for (int u = 0; u < units; ++u) {
        UnitIO<T> io;
        io.tokens = tokens;
        io.targets = targets;
        io.residual_in = u > 0 ? model.unit_output(u - 1, slot) : nullptr;
        io.residual_out = u + 1 < units ? model.unit_output(u, slot) : nullptr;
        io.loss_sum = loss_sum;
        io.count = count;
        before_unit(u);
        model.forward_unit(u, slot, io);
    }
}

template <class T>
void single_forward(Llama<T>& model, int slot, const int* tokens, const int* targets, acc_t<T>* loss_sum, int* count) {
    single_forward(model, slot, tokens, targets, loss_sum, count, [](int) {});
}

// `before_unit(u)` and `after_unit(u)` run around unit u's backward: the hooks strategies
// communicate in (and where ZeRO binds a gradient buffer to the unit).
template <class T, class BeforeUnit, class AfterUnit>
void single_backward(Llama<T>& model, int slot, const int* tokens, const int* targets, double loss_scale,
                     BeforeUnit&& before_unit, AfterUnit&& after_unit) {
    const int units = model.num_units();
    int current = 0;  // which residual-gradient buffer holds the gradient of the next unit's input
    for (int u = units - 1; u >= 0; --u) {
        UnitIO<T> io;
        io.tokens = tokens;
        io.targets = targets;
        io.loss_scale = loss_scale;
        io.residual_in = u > 0 ? model.unit_output(u - 1, slot) : nullptr;
        if (u + 1 < units) io.dresidual_out = model.residual_grad(current);
        if (u > 0) io.dresidual_in = model.residual_grad(u + 1 < units ? 1 - current : current);
        before_unit(u);
        model.backward_unit(u, slot, io);
        if (u > 0 && u + 1 < units) current = 1 - current;
        after_unit(u);
    }
}

template <class T>
void single_backward(Llama<T>& model, int slot, const int* tokens, const int* targets, double loss_scale) {
    single_backward(model, slot, tokens, targets, loss_scale, [](int) {}, [](int) {});
}

}  // namespace pv
