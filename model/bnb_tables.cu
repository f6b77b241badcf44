// kernels/nf4.cuh's tables for host code that cannot include a CUDA header (formats/bnb_checkpoint.h).
#include "formats/bnb_checkpoint.h"
#include "kernels/nf4.cuh"

namespace pv {

const float* nf4_levels_table() { return kNf4Levels; }
const float* nf4_dynamic_map_table() { return kNf4DynamicMap; }

}  // namespace pv
