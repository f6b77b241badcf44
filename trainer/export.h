// Model directories for Hugging Face: what a checkpoint carries besides its weights so that
// transformers loads it as it is, and `train export`, which writes a checkpoint (or any Llama
// model directory) as such a directory without the optimizer state. Host C++ only.
//
//   HF_DIR/model.safetensors        every weight under its Hugging Face name, one file, in the
//                                   checkpoint's dtype or --dtype's (bf16, fp32, fp64; rounding to
//                                   nearest even, overflows counted: formats/dtype_conversion.h)
//   HF_DIR/config.json              the model's config with torch_dtype set to the file's dtype
//   HF_DIR/tokenizer.json           with tokenizer_config.json and special_tokens_map.json when the
//                                   source has them, copied as they are
//   HF_DIR/generation_config.json   the source's, else the tokenizer's BOS/EOS ids
//
// The weights are read tensor by tensor in bounded pieces and written as they come
// (formats/safetensors.h write_safetensors_streamed): exporting never holds a whole model in
// memory. The directory is built as HF_DIR.tmp and renamed into place; HF_DIR must be new or
// empty.
#pragma once

#include "data/tokenizer.h"
#include "trainer/options.h"

#include <string>

namespace pv {

// What a model directory carries besides its weights and config.json (write_model_files).
struct ModelFiles {
    const Tokenizer* tokenizer = nullptr;  // the run's tokenizer, null when none is known
    std::string tokenizer_dir;             // the directory its tokenizer.json came from (copied as it is, with
                                           // tokenizer_config.json and special_tokens_map.json); empty: saved
    std::string model_dir;                 // the model the run started from (--init-from, --resume): its
                                           // generation_config.json is copied when it has one
    int data_eos = -1;                     // the data's end-of-sequence id: the EOS of a run with no tokenizer
};

// Writes into `dir` the tokenizer files and generation_config.json (model_dir's, else the
// tokenizer's BOS and EOS ids, else the data's EOS; none when no id is known).
void write_model_files(const std::string& dir, const ModelFiles& files);

// `train export`: the checkpoint (resolved as `train sample` does) or model directory in
// o.checkpoint written to o.out_dir (above); prints what it wrote. Throws std::runtime_error
// naming the problem and the fix.
void export_model(const ExportOptions& o);

// A LoRA checkpoint with the adapters folded into the base, as a Hugging Face directory (--merged;
// trainer/export_lora.cu).
struct ModelDir;
void export_merged(const ExportOptions& o, const ModelDir& m);

}  // namespace pv
