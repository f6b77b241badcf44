// Pipeline parallelism (DESIGN.md §2): the units are cut into contiguous stages (parallel/
// stages.h); pipeline rank r (the mesh's pipeline coordinate, parallel/mesh.h) runs stage r — or,
// with the interleaved schedule's V chunks per rank, stages r, r + p, …, r + (V − 1)·p — and holds
// only their units' parameters, gradients, optimizer state and activations. Every rank of a
// pipeline reads the same micro-batches; stage 0 embeds the tokens, the last stage computes the loss.
//
// A pipeline is not a strategy of its own: it is applied to one (Strategy::apply_pipeline), whose
// data-parallel policy — DDP's all-reduces, ZeRO's reduce-scatters and gathers, or nothing at all for
// --parallel pp — runs over the ranks of the same stage (the mesh's data axes) in the unit hooks
// this class calls, exactly as without a pipeline. The gradient norm's sum runs over the shard
// and pipeline axes; the token count over the data axes; the loss, which only last stages have,
// over the world.
//
// Forward of a micro-batch through stage s: s > 0 receives the residual stream [rows][hidden]
// from stage s − 1's rank (ncclRecv into a buffer of its own per chunk and slot, kept for the
// backward), runs its units, and sends its last unit's output to stage s + 1's rank (ncclSend).
// Backward: a stage before the last receives the gradient of its output from the next stage,
// runs its units in reverse, and sends the gradient of its input to the previous one. Transfers
// run on the communication stream behind event fences; the compute stream waits for a send
// before it can overwrite what is being sent.
//
// Slots. The table's slot is per chunk, and each chunk has its own count (the interleaved
// schedule's first chunk holds more micro-batches than its last); the trainer's batch buffers and
// this class's `slot` argument number them over the chunks: chunk c's slot k is buffer
// S_0 + … + S_(c−1) + k (S_c: chunk c's slots; slots() = their sum), so two chunks never share a
// micro-batch's token buffers.
//
// Schedule (parallel/schedule.h). A step runs this rank's row of the pipeline's table: GPipe
// (K forwards, then their K backwards; K = 1 is naive model parallelism, one stage busy at a
// time), 1F1B (warm-up forwards, then one forward and one backward alternately, so stage r
// holds at most p − r micro-batches' activations instead of every one in flight) or interleaved
// 1F1B (the same over V chunks, the bubble about V times smaller). Between two rounds of the row
// the rank issues the first round's sends and the next round's receives as one NCCL group, the
// table's transfers exactly as the simulator checked them: 1F1B's neighbours would otherwise each
// wait in a send for the other's receive. Each entry issues the group before it as its first
// work (the row's last entry the one after it too), so an entry captured as a CUDA graph
// (--cuda-graphs, trainer/micro_step_graphs.h) holds its transfers; every step starts from the same
// host state (state()), so entry i's transfers are the same in every step. Every schedule runs the
// backwards in micro-batch order, so gradients accumulate in micro-batch order and an untied model
// trains bit for bit as on one rank. Evaluation (a forward alone, outside a step) receives and
// sends inline.
//
// Tied embeddings. The head multiplies by wte, so the last stage's rank holds a copy of the
// embedding's parameters and gradient (Llama's StageUnits). The head's part of that gradient goes
// through the strategy's data-parallel reduction like a unit's (after the head's backward), the
// embedding's on the first stage after its own; then the first and last stage of each pipeline
// sum their two reduced partial gradients over the mesh's pipeline-ends communicator (the range
// the optimizer owns: all of it, or ZeRO-1's slice), and both make the same update from the same
// optimizer state. The copy counts once in the gradient norm (the first stage's).
#pragma once

#include "model/llama.h"
#include "model/unit_loop.h"
#include "parallel/comm.h"
#include "parallel/schedule.h"
#include "parallel/stages.h"

#include <algorithm>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace pv {

template <class T>
class Pipeline {
  public:
    using UnitHook = std::function<void(int)>;

    // The model must hold this pipeline rank's stages of `bounds` (the stage_bounds of
    // plan_strategy: p·V stages, pipeline rank r running r, r + p, …) and the slots of its row of
    // `schedule`; `pipe` is the communicator of this rank's pipeline (the mesh's pipeline axis).
    Pipeline(Llama<T>& model, Comm& pipe, const PipelineSchedule& schedule, const std::vector<int>& bounds)
        : model_(model), pipe_(pipe), schedule_(schedule), slots_(schedule.slots.at(size_t(pipe.rank()))) {
        const int r = pipe.rank(), p = pipe.size();
        std::vector<StageUnits> expected;
        for (int s = r; s + 1 < int(bounds.size()); s += p) expected.push_back({bounds[size_t(s)], bounds[size_t(s) + 1]});
        bool same = expected.size() == model.chunks().size() && int(expected.size()) == schedule.chunks &&
                    schedule.ranks == p;
        for (size_t c = 0; same && c < expected.size(); ++c)
            same = expected[c].first == model.chunks()[c].first && expected[c].end == model.chunks()[c].end &&
                   model.chunks()[c].slots >= slots_[c];
        if (!same)
            throw std::logic_error("Pipeline: pipeline rank " + std::to_string(r) +
                                   "'s model does not hold its stages of the pipeline in rank order, each with the "
                                   "schedule's activation slots");
        first_buffer_.push_back(0);
        for (int k : slots_) first_buffer_.push_back(first_buffer_.back() + k);
        for (int stage : unit_stages(bounds)) owner_.push_back(stage % p);
        const long long rows = model.stream_rows(), hidden = model.config().hidden_size;  // this rank's rows
        inputs_.resize(size_t(schedule.chunks));
        for (int c = 0; c < schedule.chunks; ++c)
            if (schedule.stage_of(r, c) > 0)
                for (int s = 0; s < slots_[size_t(c)]; ++s)
                    inputs_[size_t(c)].emplace_back(size_t(rows * hidden), MemoryCategory::activations);
    }

    Comm& comm() { return pipe_; }
    int slots() const { return first_buffer_.back(); }  // the trainer's buffers (header)
    // The pipeline rank holding unit u (the first stage's for the tied embedding).
    int owner(int u) const { return owner_[size_t(u)]; }

    void run_micro_steps(int micro, const std::function<void(const PipeStep&, bool)>& run) {
        if (micro != schedule_.micro) {  // another count (a test hook's extra micro-batch): within the slots
            PipelineSchedule other = make_pipeline_schedule(schedule_.kind, schedule_.ranks, micro, schedule_.chunks,
                                                            *std::max_element(slots_.begin(), slots_.end()));
            simulate_pipeline_schedule(other);
            for (int c = 0; c < schedule_.chunks; ++c)
                if (other.slots[size_t(pipe_.rank())][size_t(c)] > slots_[size_t(c)])
                    throw std::logic_error("Pipeline: " + std::to_string(micro) +
                                           " micro-batches need more activation slots than the model holds");
            schedule_ = std::move(other);
        }
        const std::vector<PipeStep>& row = this->row();
        std::vector<size_t> last(size_t(schedule_.chunks), row.size());  // per chunk, its last backward
        for (size_t i = 0; i < row.size(); ++i)
            if (row[i].backward) last[size_t(row[i].chunk)] = i;
        // Every step starts from the same host state, so that entry i's transfers are a function of
        // the table alone (a captured entry replays them: state()).
        next_ = 0, sent_grad_ = received_grad_ = nullptr;
        // Inside the row the transfers are the table's; after it, however it ends (a step that
        // throws too), an evaluation's forward receives inline again.
        struct Unscheduled {
            bool& flag;
            ~Unscheduled() { flag = false; }
        } unscheduled{scheduled_};
        scheduled_ = true;
        for (size_t i = 0; i < row.size(); ++i) {
            PipeStep e = row[i];
            e.slot = buffer(e.chunk, e.slot);
            run(e, i == last[size_t(e.chunk)]);
            if (next_ != i + 1)
                throw std::logic_error("Pipeline: entry " + std::to_string(i) +
                                       " of the row ran no forward or backward: the step must run each entry once");
        }
    }

    // The host state the scheduled entries carry from one to the next: the table (its
    // micro-batches), the next entry, and which residual-gradient buffer the last backward's input
    // gradient is in and the next one's output gradient was received into (-1: none). A captured
    // entry (trainer/micro_step_graphs.h) is keyed by it and sets it again after each launch.
    std::vector<int> state() const {
        return {schedule_.micro, int(next_), which_grad(sent_grad_), which_grad(received_grad_)};
    }
    void set_state(const std::vector<int>& s) {
        if (s.size() != 4 || s[0] != schedule_.micro)
            throw std::logic_error("Pipeline::set_state: the state of another table");
        next_ = size_t(s[1]), sent_grad_ = grad_buffer(s[2]), received_grad_ = grad_buffer(s[3]);
    }

    // Scheduled: one chunk's forward (the buffer names it), after the table's transfers before it
    // (scheduled_entry: they are part of whatever runs the entry, a captured graph too).
    // Evaluation: every chunk in turn, each receiving its input and sending its output inline.
    void forward(int slot, const DeviceBatch& batch, acc_t<T>* loss_sum, int* count, const UnitHook& before_unit) {
        if (scheduled_) {
            const int c = chunk_of(slot);
            return scheduled_entry(false, slot, [&] {
                forward_chunk(c, slot - first_buffer_[size_t(c)], batch, loss_sum, count, before_unit);
            });
        }
        for (int c = 0; c < schedule_.chunks; ++c)
            forward_chunk(c, slot % slots_[size_t(c)], batch, loss_sum, count, before_unit);
    }

    // One chunk's backward (scheduled only), after the table's transfers before it; `unit_done(u)`
    // after each unit's, and after the head's on a last stage holding the tied embedding's copy,
    // `unit_done(0)` too (the head's part of wte is complete).
    void backward(int slot, const DeviceBatch& batch, DeviceScalar<double> loss_scale, const UnitHook& before_unit,
                  const UnitHook& unit_done) {
        if (!scheduled_) throw std::logic_error("Pipeline::backward outside a step's schedule");
        scheduled_entry(true, slot, [&] {
            const int chunk = chunk_of(slot), s = slot - first_buffer_[size_t(chunk)];
            const int stage = schedule_.stage_of(pipe_.rank(), chunk);
            const StageUnits units = model_.chunks()[size_t(chunk)];
            T* grad_out = stage + 1 < schedule_.stages() ? received_grad_ : nullptr;  // received just before
            const T* input = stage > 0 ? inputs_[size_t(chunk)][size_t(s)].get() : nullptr;
            // The gradient of the chunk's input: sent by the transfers after the entry.
            sent_grad_ = backward_units(model_, s, units.first, units.end, input, grad_out, batch, loss_scale,
                                        before_unit, [&](int u) {
                                            unit_done(u);
                                            if (u == model_.num_units() - 1 && !model_.runs(0) && model_.holds(0))
                                                unit_done(0);  // the head's part of wte
                                        });
        });
    }

  private:
    size_t rows_hidden() const { return size_t(model_.stream_rows() * model_.config().hidden_size); }
    const std::vector<PipeStep>& row() const { return schedule_.steps[size_t(pipe_.rank())]; }
    int which_grad(const T* p) const {
        return p == model_.residual_grad(0) ? 0 : p == model_.residual_grad(1) ? 1 : -1;
    }
    T* grad_buffer(int which) const { return which < 0 ? nullptr : model_.residual_grad(which); }

    // Entry next_ of the row (a forward or backward in `buffer`): the transfers before it, its work,
    // and after the row's last entry the transfers after it.
    template <class Work>
    void scheduled_entry(bool backward, int buffer, Work&& work) {
        const std::vector<PipeStep>& row = this->row();
        if (next_ >= row.size() || row[next_].backward != backward ||
            this->buffer(row[next_].chunk, row[next_].slot) != buffer)
            throw std::logic_error("Pipeline: a " + std::string(backward ? "backward" : "forward") + " in buffer " +
                                   std::to_string(buffer) + " out of the schedule's order (entry " +
                                   std::to_string(next_) + " of " + std::to_string(row.size()) + ")");
        exchange(row, next_);
        work();
        if (++next_ == row.size()) exchange(row, next_);
    }
    int buffer(int chunk, int slot) const { return first_buffer_[size_t(chunk)] + slot; }
    int chunk_of(int buffer) const {
        return int(std::upper_bound(first_buffer_.begin(), first_buffer_.end(), buffer) - first_buffer_.begin()) - 1;
    }
    int previous_rank(int stage) const { return (stage - 1) % schedule_.ranks; }
    int next_rank(int stage) const { return (stage + 1) % schedule_.ranks; }

    void forward_chunk(int chunk, int s, const DeviceBatch& batch, acc_t<T>* loss_sum, int* count,
                       const UnitHook& before_unit) {
        Llama<T>& m = model_;
        Comm& c = pipe_;
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
        forward_units(m, s, units.first, units.end, input, batch, loss_sum, count, before_unit);
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
        Llama<T>& m = model_;
        Comm& c = pipe_;
        const std::vector<PipeTransfer> transfers = transfers_before(schedule_, c.rank(), i);
        if (transfers.empty()) return;
        const int p = schedule_.ranks;
        // The forward slot of (micro, chunk) on this rank.
        auto slot_of = [&](int micro, int chunk) {
            for (const PipeStep& e : row)
                if (!e.backward && e.micro == micro && e.chunk == chunk) return e.slot;
            throw std::logic_error("Pipeline: no forward of micro-batch " + std::to_string(micro) +
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

    Llama<T>& model_;
    Comm& pipe_;
    PipelineSchedule schedule_;
    std::vector<int> slots_;            // per chunk: its activation slots
    std::vector<int> first_buffer_;     // per chunk: its first buffer; then the total
    bool scheduled_ = false;            // inside run_micro_steps: the transfers are exchange's
    size_t next_ = 0;                   // then: the row's next entry
    T* sent_grad_ = nullptr;            // the last backward's input gradient, to send
    T* received_grad_ = nullptr;        // where the next backward's output gradient was received
    std::vector<int> owner_;            // per unit, the rank holding it
    std::vector<std::vector<DeviceBuffer<T>>> inputs_;  // per chunk, per slot: the stream received (not stage 0's)
};

}  // namespace pv
