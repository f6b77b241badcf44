// Pipeline parallelism (DESIGN.md §2): the units are cut into contiguous stages (parallel/
// stages.h); rank r runs stage r — or, with the interleaved schedule's V chunks per rank, stages
// r, r + p, …, r + (V − 1)·p — and holds only their units' parameters, gradients, optimizer state
// and activations. Every rank reads the whole batch; stage 0 embeds the tokens, the last stage
// computes the loss.
//
// Forward of a micro-batch through stage s: s > 0 receives the residual stream [rows][hidden]
// from stage s − 1's rank (ncclRecv into a buffer of its own per chunk and slot, kept for the
// backward), runs its units, and sends its last unit's output to stage s + 1's rank (ncclSend).
// Backward: a stage before the last receives the gradient of its output from the next stage,
// runs its units in reverse, and sends the gradient of its input to the previous one. Transfers
// run on the communication stream behind event fences; the compute stream waits for a send
// before it can overwrite what is being sent.
//
// Slots. The table's slot is per chunk; the trainer's batch buffers and this class's `slot`
// argument number them over the chunks: buffer chunk·S + slot (S: the slots per chunk, slots()
// = V·S), so two chunks never share a micro-batch's token buffers.
//
// Schedule (parallel/schedule.h). A step runs this rank's row of the pipeline's table: GPipe
// (K forwards, then their K backwards; K = 1 is naive model parallelism, one stage busy at a
// time), 1F1B (warm-up forwards, then one forward and one backward alternately, so stage r
// holds at most p − r micro-batches' activations instead of every one in flight) or interleaved
// 1F1B (the same over V chunks, the bubble about V times smaller). Between two rounds of the row
// the rank issues the first round's sends and the next round's receives as one NCCL group, the
// table's transfers exactly as the simulator checked them: 1F1B's neighbours would otherwise each
// wait in a send for the other's receive. Every schedule runs the backwards in
// micro-batch order, so gradients accumulate in micro-batch order and an untied model trains bit
// for bit as on one rank. Evaluation (a forward alone, outside a step) receives and sends inline.
//
// Tied embeddings. The head multiplies by wte, so the last stage's rank holds a copy of the
// embedding's parameters and gradient (Llama's StageUnits); after the last micro-batch ranks 0 and
// p − 1 sum their two partial wte gradients over a communicator of the two, and both make the same
// update from the same optimizer state. The copy counts once in the gradient norm (rank 0's).
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
    // The model must hold this rank's stages of `bounds` (the stage_bounds of plan_strategy: p·V
    // stages, rank r running r, r + p, …) and the slots of this rank's row of `schedule`;
    // collective over comm (the tied-embedding communicator is split off it).
    PipelineParallel(Llama<T>& model, Comm& comm, const PipelineSchedule& schedule, const std::vector<int>& bounds)
        : Strategy<T, G>(model, &comm), schedule_(schedule), slots_(schedule.slots.at(size_t(comm.rank()))) {
        const int r = comm.rank(), p = comm.size();
        std::vector<StageUnits> expected;
        for (int s = r; s + 1 < int(bounds.size()); s += p) expected.push_back({bounds[size_t(s)], bounds[size_t(s) + 1]});
        bool same = expected.size() == model.chunks().size() && int(expected.size()) == schedule.chunks;
        for (size_t c = 0; same && c < expected.size(); ++c)
            same = expected[c].first == model.chunks()[c].first && expected[c].end == model.chunks()[c].end;
        if (!same)
            throw std::logic_error("PipelineParallel: rank " + std::to_string(r) +
                                   "'s model does not hold its stages of the pipeline in rank order");
        for (int stage : unit_stages(bounds)) owner_.push_back(stage % p);
        const long long rows = model.rows(), hidden = model.config().hidden_size;
        inputs_.resize(size_t(schedule.chunks));
        for (int c = 0; c < schedule.chunks; ++c)
            if (schedule.stage_of(r, c) > 0)
                for (int s = 0; s < slots_; ++s) inputs_[size_t(c)].emplace_back(size_t(rows * hidden), MemoryCategory::activations);
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
    int slots() const override { return slots_ * schedule_.chunks; }  // the trainer's buffers (header)

    void run_micro_steps(int micro, const std::function<void(const PipeStep&, bool)>& run) override {
        if (micro != schedule_.micro) {  // another count (a test hook's extra micro-batch): within the slots
            schedule_ = make_pipeline_schedule(schedule_.kind, schedule_.ranks, micro, schedule_.chunks, slots_);
            simulate_pipeline_schedule(schedule_);
        }
        const std::vector<PipeStep>& row = schedule_.steps[size_t(this->comm_->rank())];
        std::vector<size_t> last(size_t(schedule_.chunks), row.size());  // per chunk, its last backward
        for (size_t i = 0; i < row.size(); ++i)
            if (row[i].backward) last[size_t(row[i].chunk)] = i;
        scheduled_ = true;
        for (size_t i = 0; i <= row.size(); ++i) {
            exchange(row, i);
            if (i == row.size()) break;
            PipeStep e = row[i];
            e.slot = buffer(e.chunk, e.slot);
            run(e, i == last[size_t(e.chunk)]);
        }
        scheduled_ = false;
    }
    std::vector<Comm*> comms() override {
        std::vector<Comm*> out{this->comm_};
        if (tied_) out.push_back(tied_.get());
        return out;
    }

    // Scheduled: one chunk's forward (the buffer names it). Evaluation: every chunk in turn, each
    // receiving its input and sending its output inline.
    void forward(int slot, const DeviceBatch& batch, acc_t<T>* loss_sum, int* count) override {
        if (scheduled_) return forward_chunk(slot / slots_, slot % slots_, batch, loss_sum, count);
        for (int c = 0; c < schedule_.chunks; ++c) forward_chunk(c, slot % slots_, batch, loss_sum, count);
    }

    void backward(int slot, const DeviceBatch& batch, double loss_scale, bool last) override {
        Llama<T>& m = this->model_;
        const int chunk = slot / slots_, s = slot % slots_, stage = schedule_.stage_of(this->comm_->rank(), chunk);
        const StageUnits units = m.chunks()[size_t(chunk)];
        if (!this->grad32_.empty()) m.zero_grads();
        T* grad_out = stage + 1 < schedule_.stages() ? received_grad_ : nullptr;  // received by the exchange before it
        const T* input = stage > 0 ? inputs_[size_t(chunk)][size_t(s)].get() : nullptr;
        T* grad_in = backward_units(
            m, s, units.first, units.end, input, grad_out, batch, loss_scale, [](int) {},
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
    int buffer(int chunk, int slot) const { return chunk * slots_ + slot; }
    int previous_rank(int stage) const { return (stage - 1) % schedule_.ranks; }
    int next_rank(int stage) const { return (stage + 1) % schedule_.ranks; }

    void forward_chunk(int chunk, int s, const DeviceBatch& batch, acc_t<T>* loss_sum, int* count) {
        Llama<T>& m = this->model_;
        Comm& c = *this->comm_;
        const int stage = schedule_.stage_of(c.rank(), chunk);
        const StageUnits units = m.chunks()[size_t(chunk)];
        const T* input = nullptr;
        if (stage > 0) {
            T* in = inputs_[size_t(chunk)][size_t(s)].get();
            if (!scheduled_) {  // evaluation: receive inline
                c.fence_from(m.stream());  // the slot's last backward has read the buffer
                c.recv(in, rows_hidden(), previous_rank(stage));
                c.fence_to(m.stream());
            }
            input = in;
        }
        forward_units(m, s, units.first, units.end, input, batch, loss_sum, count, [](int) {});
        if (!scheduled_ && stage + 1 < schedule_.stages()) {
            c.fence_from(m.stream());
            c.send(m.unit_output(units.end - 1, s), rows_hidden(), next_rank(stage));
            c.fence_to(m.stream());  // the buffer is not overwritten while it is read
        }
    }

    // The transfers of the table just before entry i of this rank's row (transfers_before): one
    // NCCL group, fenced both ways so the compute stream neither overwrites a buffer being sent
    // nor reads one being received before the group is done.
    void exchange(const std::vector<PipeStep>& row, size_t i) {
        Llama<T>& m = this->model_;
        Comm& c = *this->comm_;
        const std::vector<PipeTransfer> transfers = transfers_before(schedule_, c.rank(), i);
        if (transfers.empty()) return;
        const int p = schedule_.ranks;
        // The forward slot of (micro, chunk) on this rank.
        auto slot_of = [&](int micro, int chunk) {
            for (const PipeStep& e : row)
                if (!e.backward && e.micro == micro && e.chunk == chunk) return e.slot;
            throw std::logic_error("PipelineParallel: no forward of micro-batch " + std::to_string(micro) +
                                   " chunk " + std::to_string(chunk));
        };
        c.fence_from(m.stream());
        c.begin_group();
        for (const PipeTransfer& t : transfers) {
            if (t.send && !t.gradient) {  // the output of this rank's stage t.stage
                const int chunk = t.stage / p;
                c.send(m.unit_output(m.chunks()[size_t(chunk)].end - 1, slot_of(t.micro, chunk)), rows_hidden(),
                       t.peer);
            }
            if (t.send && t.gradient) c.send(sent_grad_, rows_hidden(), t.peer);
            if (!t.send && !t.gradient) {  // the input of stage t.stage + 1, this rank's
                const int chunk = (t.stage + 1) / p;
                c.recv(inputs_[size_t(chunk)][size_t(slot_of(t.micro, chunk))].get(), rows_hidden(), t.peer);
            }
            if (!t.send && t.gradient) {  // into the residual-gradient buffer not being sent
                received_grad_ = sent_grad_ == m.residual_grad(0) ? m.residual_grad(1) : m.residual_grad(0);
                c.recv(received_grad_, rows_hidden(), t.peer);
            }
        }
        c.end_group();
        c.fence_to(m.stream());
    }

    PipelineSchedule schedule_;
    int slots_;                         // activation slots per chunk
    bool scheduled_ = false;            // inside run_micro_steps: the transfers are exchange's
    T* sent_grad_ = nullptr;            // the last backward's input gradient, to send
    T* received_grad_ = nullptr;        // where the next backward's output gradient was received
    std::vector<int> owner_;            // per unit, the rank holding it
    std::vector<std::vector<DeviceBuffer<T>>> inputs_;  // per chunk, per slot: the stream received (not stage 0's)
    ncclComm_t tied_nccl_ = nullptr;
    std::unique_ptr<Comm> tied_;
};

}  // namespace pv
