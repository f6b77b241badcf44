// The plain loop over a model's units (DESIGN.md §2), which every strategy runs.
//
// Forward: embedding -> blocks -> head, each unit reading the previous unit's output from that
// unit's arena. Backward: head -> blocks -> embedding, the residual stream's gradient passed
// between the model's two buffers in turn, with optional hooks around each unit (where DDP starts
// a bucket's all-reduce). The caller zeroes the gradients at the start of an optimizer step and
// passes the loss scale 1 / (global count of counted tokens) (DESIGN.md §4).
//
// The loops run a contiguous range of units [first, end): the whole model, or one pipeline stage
// (parallel/pp.h), whose first unit reads its input from `stage_input` (the residual stream
// received from the previous stage) and whose last unit's output gradient arrives in `grad_out`.
//
// A micro-batch reaches the units as a DeviceBatch: its per-row device arrays, each handed to the
// units that read it (UnitIO), so a new per-row field is added here and in the trainer's upload,
// not to every strategy's signature.
#pragma once

#include "model/llama.h"

namespace pv {

// One micro-batch's device arrays, [N] = [batch][seq_len] each.
struct DeviceBatch {
    const int* tokens = nullptr;     // the embedding's input ids
    const int* targets = nullptr;    // the head's next-token ids (kIgnoreIndex: skipped); null: no loss
    const int* positions = nullptr;  // each row's position within its document; null: row % seq_len
    long long first_row = 0;         // the global row (global sample index · seq_len) of row 0
    long long step = -1;             // the training step (keys LoRA's dropout); −1: evaluation, no dropout
    // The head's loss written by the backward, with the gradient (the trainer's steps: one pass over
    // the logits); false: by the forward, for a caller that reads it before any backward.
    bool loss_in_backward = false;
    // Where set, device memory holding {first_row, step}, which LoRA's dropout then reads as it runs
    // instead of first_row and step (which must still say whether dropout is on): a captured
    // micro-step (trainer/micro_step_graphs.h) is launched again for other micro-batches and steps.
    const long long* dropout_keys = nullptr;
};

// A unit call's buffers with the batch's arrays filled in (the other fields at their defaults).
template <class T>
UnitIO<T> batch_io(const DeviceBatch& batch) {
    UnitIO<T> io;
    io.tokens = batch.tokens;
    io.targets = batch.targets;
    io.positions = batch.positions;
    io.first_row = batch.first_row;
    io.step = batch.step;
    io.dropout_keys = batch.dropout_keys;
    io.loss_in_backward = batch.loss_in_backward;
    return io;
}

// Units [first, end) forward. `before_unit(u)` runs before unit u's forward (where ZeRO-3 binds
// the unit's gathered parameters). `stage_input`: unit first's input when first > 0.
template <class T, class BeforeUnit>
void forward_units(Llama<T>& model, int slot, int first, int end, const T* stage_input, const DeviceBatch& batch,
                   acc_t<T>* loss_sum, int* count, BeforeUnit&& before_unit) {
    const int units = model.num_units();
    for (int u = first; u < end; ++u) {
        UnitIO<T> io = batch_io<T>(batch);
        io.residual_in = u == 0 ? nullptr : u == first ? stage_input : model.unit_output(u - 1, slot);
        io.residual_out = u + 1 < units ? model.unit_output(u, slot) : nullptr;
        io.loss_sum = loss_sum;
        io.count = count;
        before_unit(u);
        model.forward_unit(u, slot, io);
    }
}

// Units [first, end) backward, in reverse. `grad_out`: the gradient of unit end − 1's output (null
// when that unit is the head); it must be one of the model's residual_grad buffers. Returns the
// buffer holding the gradient of unit first's input (null when first is the embedding).
// `before_unit(u)` and `after_unit(u)` run around unit u's backward: the hooks strategies
// communicate in (and where ZeRO binds a gradient buffer to the unit).
template <class T, class BeforeUnit, class AfterUnit>
T* backward_units(Llama<T>& model, int slot, int first, int end, const T* stage_input, T* grad_out,
                  const DeviceBatch& batch, DeviceScalar<double> loss_scale, BeforeUnit&& before_unit,
                  AfterUnit&& after_unit) {
    T* dout = grad_out;                                     // the gradient of the current unit's output
    int next = grad_out == model.residual_grad(0) ? 1 : 0;  // the other buffer: where its input's goes
    for (int u = end - 1; u >= first; --u) {
        UnitIO<T> io = batch_io<T>(batch);
        io.loss_scale = loss_scale;
        io.residual_in = u == 0 ? nullptr : u == first ? stage_input : model.unit_output(u - 1, slot);
        io.dresidual_out = dout;
        if (u > 0) io.dresidual_in = model.residual_grad(next);
        before_unit(u);
        model.backward_unit(u, slot, io);
        if (u > 0)
            dout = model.residual_grad(next), next = 1 - next;
        else
            dout = nullptr;
        after_unit(u);
    }
    return dout;
}

// The whole model on one rank.
template <class T, class BeforeUnit>
void single_forward(Llama<T>& model, int slot, const DeviceBatch& batch, acc_t<T>* loss_sum, int* count,
                    BeforeUnit&& before_unit) {
    forward_units(model, slot, 0, model.num_units(), static_cast<const T*>(nullptr), batch, loss_sum, count,
                  before_unit);
}

template <class T>
void single_forward(Llama<T>& model, int slot, const DeviceBatch& batch, acc_t<T>* loss_sum, int* count) {
    single_forward(model, slot, batch, loss_sum, count, [](int) {});
}

template <class T, class BeforeUnit, class AfterUnit>
void single_backward(Llama<T>& model, int slot, const DeviceBatch& batch, DeviceScalar<double> loss_scale,
                     BeforeUnit&& before_unit, AfterUnit&& after_unit) {
    backward_units(model, slot, 0, model.num_units(), static_cast<const T*>(nullptr), static_cast<T*>(nullptr), batch,
                   loss_scale, before_unit, after_unit);
}

template <class T>
void single_backward(Llama<T>& model, int slot, const DeviceBatch& batch, DeviceScalar<double> loss_scale) {
    single_backward(
        model, slot, batch, loss_scale, [](int) {}, [](int) {});
}

}  // namespace pv
