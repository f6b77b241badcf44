// One training run on this rank (the `train` command after its options are checked): set-up,
// resume, the step loop with its logging, evaluation and checkpoints, and the closing sample.
#pragma once

#include "parallel/world.h"
#include "trainer/options.h"
#include "trainer/run_data.h"

#include <string>

namespace pv {

// Trains with storage type T and gradient type G (T, or float with --fp32-grad-accumulation).
// `o` has the micro-batch resolved; `requested` is what the user asked for (saved in checkpoints,
// so an automatic micro-batch stays automatic). Returns the exit status.
template <class T, class G>
int run_training(const TrainOptions& o, const TrainOptions& requested, RunData data, const LlamaConfig& config,
                 const std::string& resume_dir, World& world);

}  // namespace pv
