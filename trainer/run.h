// One training run on this rank (the `train` command after its options are checked): set-up,
// resume, the step loop with its logging, evaluation and checkpoints, and the closing sample.
#pragma once

#include "optim/schedule.h"
#include "parallel/world.h"
#include "trainer/options.h"
#include "trainer/run_data.h"

#include <string>

namespace pv {

// Where a run's model comes from besides its options: a checkpoint to resume (`resume_dir`), or
// a Hugging Face model to start from (`init_dir`, --init-from); both empty: initialised here.
struct RunSources {
    std::string resume_dir;
    std::string init_dir;
    OptionSources options;  // where each option's value came from (for the run.yaml it writes)
};

// The learning-rate schedule of these options (optim/schedule.h): over --steps, or the schedule a
// resume kept (--keep-schedule); the warmup in steps, or from --warmup-ratio as Hugging Face
// counts it, ceil(ratio × steps). Throws std::invalid_argument naming the flags when it is unusable.
LrConfig lr_config_of(const TrainOptions& o);

// Trains with storage type T and gradient type G (T, or float with --fp32-grad-accumulation).
// `o` has the micro-batch resolved; `requested` is what the user asked for (saved in checkpoints,
// so an automatic micro-batch stays automatic). Returns the exit status.
template <class T, class G>
int run_training(const TrainOptions& o, const TrainOptions& requested, RunData data, const LlamaConfig& config,
                 const RunSources& from, World& world);

}  // namespace pv
