// The layout search (parallel/layout_search.h) at the sizes users ask about: Llama-3.1-8B and
// Llama-2-70B full fine-tuning in bf16 on 8, 16 and 64 H100 80GB (8 per node), 4096-token rows,
// a batch of 4 rows per GPU (about 1M tokens a step at 64 GPUs, Llama's own training batch is 4M).
// The five fastest layouts that fit, with the planner's memory and the performance model's step.
// Predictions, not measurements.
//
//   build/<flavour>/bench/layout_search_table
#include "model/config.h"
#include "parallel/layout_search.h"

#include <cstdio>

int main() {
    using namespace pv;
    const GpuMemory gpu = parse_gpu_memory("h100-80");
    for (const char* model : {"llama-3.1-8b", "llama-2-70b"})
        for (int world : {8, 16, 64}) {
            SearchRequest r;
            r.run.config = preset(model);
            r.run.dtype = DType::bf16;
            r.run.seq_len = 4096;
            r.world = world;
            r.batch = 4 * world;
            r.budget = gpu.usable();
            const SearchResult result = search_layouts(r);
            std::printf("\n## %s, full fine-tuning, bf16, %d x H100 80GB, batch %d x 4096\n\n", model, world, r.batch);
            std::printf("%s", format_search(r, result).c_str());
            std::printf("\nchosen: %s\n", describe_choice(result).c_str());
        }
    return 0;
}
