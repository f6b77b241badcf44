// docs/lora-qlora.md's table of model-state memory per GPU for fine-tuning published checkpoints: full
// fine-tuning, LoRA and QLoRA under each data-parallel strategy at 1, 2, 4 and 8 ranks, in bf16
// (mixed precision: fp32 master and Adam state), from parallel/memory.h — the figures the
// multi-rank tests check against measured peaks. Activations, workspace and the CUDA context come
// on top. Prints a Markdown table.
#include "model/config.h"
#include "model/lora.h"
#include "parallel/memory.h"

#include <cstdio>
#include <string>
#include <vector>

int main() {
    using namespace pv;
    constexpr double GiB = 1024.0 * 1024.0 * 1024.0;
    struct Mode {
        const char* name;
        GroupOptions groups;
    };
    LoraConfig lora;
    lora.rank = 16, lora.alpha = 32;  // every one of the seven projections
    const std::vector<Mode> modes = {{"full", {}},
                                     {"LoRA r=16", {{}, lora, false, true}},
                                     {"QLoRA r=16 (NF4, double quant)", {{}, lora, true, true}}};
    std::printf("| model | fine-tuning | strategy | 1 GPU | 2 GPUs | 4 GPUs | 8 GPUs |\n");
    std::printf("|---|---|---|---:|---:|---:|---:|\n");
    for (const char* name : {"llama-2-7b", "codellama-34b", "llama-2-70b"}) {
        const LlamaConfig& c = preset(name);
        for (const Mode& m : modes)
            for (const char* strategy : {"ddp", "zero1", "zero2", "zero3"}) {
                std::printf("| %s | %s | %s |", name, m.name, strategy);
                for (int ranks : {1, 2, 4, 8}) {
                    const std::string s = ranks == 1 ? "single" : strategy;
                    const ModelStateMemory mem = model_state_memory(c, DType::bf16, m.groups, s, ranks);
                    std::printf(" %.1f |", mem.total() / GiB);
                }
                std::printf("\n");
            }
    }
    return 0;
}
