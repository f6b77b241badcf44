// Model parallelism, naive and pipelined (DESIGN.md §2): the units are cut into contiguous stages
// (parallel/stages.h), rank r runs stage r and holds only its units' parameters, gradients,
// optimizer state and activations. Every rank reads the whole batch; the first stage embeds the
// tokens, the last computes the loss.
//
// Forward of a micro-batch: stage r > 0 receives the residual stream [rows][hidden] from r − 1
// (ncclRecv into a buffer of its own per slot, kept for the backward), runs its units, and sends
// its last unit's output to r + 1 (ncclSend). Backward: stage r < p − 1 receives the gradient of
// its output from r + 1, runs its units in reverse, and sends the gradient of its input to r − 1.
// Transfers run on the communication stream behind event fences; the compute stream waits for a
// send before it can overwrite what is being sent.
//
// Schedule. With M micro-batches in flight (--microbatches M, M activation slots) the trainer
// runs each group of M micro-batches as M forwards then M backwards, in micro-batch order
// (GPipe's schedule, all-forward-all-backward): while stage r works on micro-batch k, stage r + 1
// works on k − 1. A stage idles (p − 1) of every (M + p − 1) time slots — the bubble. M = 1 is
// naive model parallelism: one stage busy at a time. Gradients accumulate in micro-batch order,
// so an untied model trains bit for bit as on one rank.
//
// Tied embeddings. The head multiplies by wte, so the last stage holds a copy of the embedding's
// parameters and gradient (Llama's StageUnits); after the last micro-batch the first and last
// stages sum their two partial wte gradients over a communicator of the two, and both make the
// same update from the same optimizer state. The copy counts once in the gradient norm (the
// first stage's).
#pragma once

#include "parallel/stages.h"
#include "parallel/strategy.h"

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace pv {

// The theoretical idle fraction of a GPipe pipeline of p stages and m micro-batches.
inline double pipeline_bubble(int stages, int microbatches) {
    return double(stages - 1) / double(microbatches + stages - 1);
}

template <class T, class G>
class ModelParallel : public Strategy<T, G> {
  public:
    // The model must hold stage comm.rank() of `bounds` (balance_stages) and have `microbatches`
    // slots; collective over comm (the tied-embedding communicator is split off it).
    ModelParallel(Llama<T>& model, Comm& comm, int microbatches, const std::vector<int>& bounds)
        : Strategy<T, G>(model, &comm), microbatches_(microbatches), owner_(unit_stages(bounds)) {
        const int r = comm.rank(), p = comm.size();
        if ((model.first_unit() == 0) != (r == 0) || (model.end_unit() == model.num_units()) != (r == p - 1))
            throw std::logic_error("ModelParallel: rank " + std::to_string(r) + "'s model holds units [" +
                                   std::to_string(model.first_unit()) + ", " + std::to_string(model.end_unit()) +
                                   "), not a stage in rank order");
        const long long rows = model.rows(), hidden = model.config().hidden_size;
        if (r > 0)
            for (int s = 0; s < microbatches; ++s)
                inputs_.emplace_back(size_t(rows * hidden), MemoryCategory::activations);
        if (model.config().tie_embeddings && p > 1) {
            ncclComm_t tied = nullptr;
            NCCL_CHECK(ncclCommSplit(comm.nccl(), r == 0 || r == p - 1 ? 0 : NCCL_SPLIT_NOCOLOR, r, &tied, nullptr));
            if (tied) tied_nccl_ = tied, tied_ = std::make_unique<Comm>(tied, "tied-embedding");
        }
    }
    ~ModelParallel() override {
        tied_.reset();
        if (tied_nccl_) ncclCommDestroy(tied_nccl_);
    }

    const char* name() const override { return "mp"; }
    bool sharded_optimizer() const override { return false; }
    Comm* data_comm() override { return nullptr; }  // every stage sees the whole batch
    int slots() const override { return microbatches_; }
    std::vector<Comm*> comms() override {
        std::vector<Comm*> out{this->comm_};
        if (tied_) out.push_back(tied_.get());
        return out;
    }

    void forward(int slot, const DeviceBatch& batch, acc_t<T>* loss_sum, int* count) override {
        Llama<T>& m = this->model_;
        Comm& c = *this->comm_;
        const T* input = nullptr;
        if (c.rank() > 0) {
            T* in = inputs_[size_t(slot)].get();
            c.fence_from(m.stream());  // the slot's last backward has read the buffer
            c.recv(in, inputs_[size_t(slot)].size(), c.rank() - 1);
            c.fence_to(m.stream());
            input = in;
        }
        forward_units(m, slot, m.first_unit(), m.end_unit(), input, batch, loss_sum, count, [](int) {});
        if (c.rank() + 1 < c.size()) send(m.unit_output(m.end_unit() - 1, slot), c.rank() + 1);
    }

    void backward(int slot, const DeviceBatch& batch, double loss_scale, bool last) override {
        Llama<T>& m = this->model_;
        Comm& c = *this->comm_;
        if (!this->grad32_.empty()) m.zero_grads();
        T* grad_out = nullptr;
        if (c.rank() + 1 < c.size()) {
            grad_out = m.residual_grad(0);
            c.fence_from(m.stream());  // the previous backward is done with the buffer
            c.recv(grad_out, size_t(m.rows() * m.config().hidden_size), c.rank() + 1);
            c.fence_to(m.stream());
        }
        const T* input = c.rank() > 0 ? inputs_[size_t(slot)].get() : nullptr;
        T* grad_in = backward_units(
            m, slot, m.first_unit(), m.end_unit(), input, grad_out, batch, loss_scale, [](int) {},
            [&](int u) {
                this->unit_backward_done(u, last);
                if (u == m.num_units() - 1 && !m.runs(0) && m.holds(0))
                    this->accumulate32(0);  // the head's part of wte
            });
        if (c.rank() > 0) send(grad_in, c.rank() - 1);
    }

    // The two partial gradients of a tied embedding, summed on the first and last stages.
    void finish_gradients() override {
        Llama<T>& m = this->model_;
        if (tied_ && m.trainable(0).padded > 0) {  // (a frozen embedding has no gradient)
            tied_->fence_from(m.stream());
            G* g = this->grads(0);
            tied_->all_reduce(g, g, size_t(m.trainable(0).padded));
            tied_->fence_to(m.stream());
        }
        this->comm_->fence_to(m.stream());
    }

  protected:
    int unit_owner(int u) const override { return owner_[size_t(u)]; }
    bool in_norm(int u) const override { return this->model_.runs(u); }  // the tied copy counts on the first stage

  private:
    // Sends the residual stream (or its gradient) and makes the compute stream wait until the send
    // has finished, so the buffer is not overwritten while it is read.
    void send(const T* buf, int peer) {
        Llama<T>& m = this->model_;
        Comm& c = *this->comm_;
        c.fence_from(m.stream());
        c.send(buf, size_t(m.rows() * m.config().hidden_size), peer);
        c.fence_to(m.stream());
    }

    int microbatches_;
    std::vector<int> owner_;               // per unit, the rank (stage) holding it
    std::vector<DeviceBuffer<T>> inputs_;  // per slot: the residual stream received from the previous stage
    ncclComm_t tied_nccl_ = nullptr;
    std::unique_ptr<Comm> tied_;
};

}  // namespace pv
