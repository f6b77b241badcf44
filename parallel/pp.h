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
// Schedule (parallel/schedule.h). A step runs this rank's row of the pipeline's table: GPipe
// (K forwards, then their K backwards; K = 1 is naive model parallelism, one stage busy at a
// time) or 1F1B (warm-up forwards, then one forward and one backward alternately, so stage r
// holds at most p − r micro-batches' activations instead of every one in flight). Between two
// entries the rank issues the previous entry's send and the next entry's receive as one NCCL
// group, the table's transfers exactly as the simulator checked them: 1F1B's neighbours would
// otherwise each wait in a send for the other's receive. Every schedule runs the backwards in
// micro-batch order, so gradients accumulate in micro-batch order and an untied model trains bit
// for bit as on one rank. Evaluation (a forward alone, outside a step) receives and sends inline.
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

template <class T, class G>
class PipelineParallel : public Strategy<T, G> {
  public:
    // The model must hold stage comm.rank() of `bounds` (balance_stages) and have the slots of
    // this rank's row of `schedule` (plan_strategy); collective over comm (the tied-embedding
    // communicator is split off it).
    PipelineParallel(Llama<T>& model, Comm& comm, const PipelineSchedule& schedule, const std::vector<int>& bounds)
        : Strategy<T, G>(model, &comm), schedule_(schedule), slots_(schedule.slots.at(size_t(comm.rank()))),
          owner_(unit_stages(bounds)) {
        const int r = comm.rank(), p = comm.size();
        if ((model.first_unit() == 0) != (r == 0) || (model.end_unit() == model.num_units()) != (r == p - 1))
            throw std::logic_error("PipelineParallel: rank " + std::to_string(r) + "'s model holds units [" +
                                   std::to_string(model.first_unit()) + ", " + std::to_string(model.end_unit()) +
                                   "), not a stage in rank order");
        const long long rows = model.rows(), hidden = model.config().hidden_size;
        if (r > 0)
            for (int s = 0; s < slots_; ++s)
                inputs_.emplace_back(size_t(rows * hidden), MemoryCategory::activations);
        if (model.config().tie_embeddings && p > 1) {
            ncclComm_t tied = nullptr;
            NCCL_CHECK(ncclCommSplit(comm.nccl(), r == 0 || r == p - 1 ? 0 : NCCL_SPLIT_NOCOLOR, r, &tied, nullptr));
            if (tied) tied_nccl_ = tied, tied_ = std::make_unique<Comm>(tied, "tied-embedding");
        }
    }
    ~PipelineParallel() override {
        tied_.reset();
        if (tied_nccl_) ncclCommDestroy(tied_nccl_);
    }

    const char* name() const override { return "pp"; }
    bool sharded_optimizer() const override { return false; }
    Comm* data_comm() override { return nullptr; }  // every stage sees the whole batch
    int slots() const override { return slots_; }

    void run_micro_steps(int micro, const std::function<void(const PipeStep&, bool)>& run) override {
        if (micro != schedule_.micro) {  // another count (a test hook's extra micro-batch): within the slots
            schedule_ = make_pipeline_schedule(schedule_.kind, schedule_.ranks, micro, 1, slots_);
            simulate_pipeline_schedule(schedule_);
        }
        const int r = this->comm_->rank();
        const std::vector<PipeStep>& row = schedule_.steps[size_t(r)];
        size_t last = row.size();  // the last backward
        for (size_t i = 0; i < row.size(); ++i)
            if (row[i].backward) last = i;
        scheduled_ = true;
        for (size_t i = 0; i <= row.size(); ++i) {
            exchange(row, i);
            if (i < row.size()) run(row[i], i == last);
        }
        scheduled_ = false;
    }
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
            if (!scheduled_) {  // evaluation: receive inline
                c.fence_from(m.stream());  // the slot's last backward has read the buffer
                c.recv(in, inputs_[size_t(slot)].size(), c.rank() - 1);
                c.fence_to(m.stream());
            }
            input = in;
        }
        forward_units(m, slot, m.first_unit(), m.end_unit(), input, batch, loss_sum, count, [](int) {});
        if (!scheduled_ && c.rank() + 1 < c.size()) {
            c.fence_from(m.stream());
            c.send(m.unit_output(m.end_unit() - 1, slot), rows_hidden(), c.rank() + 1);
            c.fence_to(m.stream());  // the buffer is not overwritten while it is read
        }
    }

    void backward(int slot, const DeviceBatch& batch, double loss_scale, bool last) override {
        Llama<T>& m = this->model_;
        Comm& c = *this->comm_;
        if (!this->grad32_.empty()) m.zero_grads();
        T* grad_out = c.rank() + 1 < c.size() ? received_grad_ : nullptr;  // the exchange before it received it
        const T* input = c.rank() > 0 ? inputs_[size_t(slot)].get() : nullptr;
        T* grad_in = backward_units(
            m, slot, m.first_unit(), m.end_unit(), input, grad_out, batch, loss_scale, [](int) {},
            [&](int u) {
                this->unit_backward_done(u, last);
                if (u == m.num_units() - 1 && !m.runs(0) && m.holds(0))
                    this->accumulate32(0);  // the head's part of wte
            });
        sent_grad_ = grad_in;  // sent by the exchange after it
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
    size_t rows_hidden() const { return size_t(this->model_.rows() * this->model_.config().hidden_size); }

    // The transfers of the table just before entry i of this rank's row (transfers_before): one
    // NCCL group, fenced both ways so the compute stream neither overwrites a buffer being sent
    // nor reads one being received before the group is done.
    void exchange(const std::vector<PipeStep>& row, size_t i) {
        Llama<T>& m = this->model_;
        Comm& c = *this->comm_;
        const std::vector<PipeTransfer> transfers = transfers_before(schedule_, c.rank(), i);
        if (transfers.empty()) return;
        // The entry a transfer belongs to: a send's in the round before i, a receive's from i on.
        auto slot_of = [&](const PipeTransfer& t) {
            const bool backward = t.gradient;
            for (size_t k = 0; k < row.size(); ++k)
                if (row[k].backward == backward && row[k].micro == t.micro) return row[k].slot;
            throw std::logic_error("PipelineParallel: no entry for a transfer of micro-batch " + std::to_string(t.micro));
        };
        c.fence_from(m.stream());
        c.begin_group();
        for (const PipeTransfer& t : transfers) {
            if (t.send && !t.gradient) c.send(m.unit_output(m.end_unit() - 1, slot_of(t)), rows_hidden(), t.peer);
            if (t.send && t.gradient) c.send(sent_grad_, rows_hidden(), t.peer);
            if (!t.send && !t.gradient) c.recv(inputs_[size_t(slot_of(t))].get(), rows_hidden(), t.peer);
            if (!t.send && t.gradient) {  // into the residual-gradient buffer not being sent
                received_grad_ = sent_grad_ == m.residual_grad(0) ? m.residual_grad(1) : m.residual_grad(0);
                c.recv(received_grad_, rows_hidden(), t.peer);
            }
        }
        c.end_group();
        c.fence_to(m.stream());
    }

    PipelineSchedule schedule_;
    int slots_;
    bool scheduled_ = false;           // inside run_micro_steps: the transfers are exchange's
    T* sent_grad_ = nullptr;           // the last backward's input gradient, to send
    T* received_grad_ = nullptr;       // where the next backward's output gradient was received
    std::vector<int> owner_;               // per unit, the rank (stage) holding it
    std::vector<DeviceBuffer<T>> inputs_;  // per slot: the residual stream received from the previous stage
    ncclComm_t tied_nccl_ = nullptr;
    std::unique_ptr<Comm> tied_;
};

}  // namespace pv
