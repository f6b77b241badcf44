// `train prepare`: text or JSON-lines files -> a tokenizer, training token shards and one held-out
// validation shard, in a directory that `train --data DIR` loads (load_dataset). Host code only.
//
// Input. Each file named in `inputs` is read in the order given, as data/examples.h describes:
// *.jsonl / *.ndjson hold one example per line — {"text"} (the field `text_field`), {"prompt",
// "completion"} or {"messages": [{"role", "content"}, ...]} — and any other file is one plain
// text. Every bad line is an error naming the file and line.
//
// Chats are rendered by a chat template (data/chat.h) as transformers' apply_chat_template renders
// them: the .jinja file `chat_template` (--chat-template) if given, else the built-in
// `chat_format` (--chat-format) if given, else the tokenizer's own (chat_template.jinja or
// tokenizer_config.json's chat_template beside `tokenizer`); without any, chats are an error,
// before anything is written, saying what to pass (a tokenizer trained here has no template).
// Only inputs with chats need a template.
//
// Over-long examples. The loader packs a chat or a prompt and completion whole into a window of
// --seq-len + 1 tokens, and leaves out one that is longer (data/loader.h; `train` prints how
// many). With `truncate` N > 0 such an example longer than N tokens is cut here to its first N
// tokens instead (left out when none of those counts), and prepare_data reports how many it cut
// and left out; plain text is never cut (the loader splits it). The window is a training option,
// so N is given here: the --seq-len to train with, plus 1.
//
// The token stream. Each example is encoded as data/examples.h says — plain text "T(text) EOS",
// a prompt and completion "[BOS] T(prompt + completion) EOS", a chat its format's tokens — with
// special-token strings in the inputs kept as text, so no input can forge a document boundary or
// a chat turn. The examples' tokens are concatenated in input order, each token with its flags
// (data/shard.h): counted (everything in plain text; completions, assistant turns and their end
// tokens otherwise, and everything but an example's first token with `train_on_prompt`), starts
// a document (each example's first token), splittable (plain text only):
//
//     ex0 ex1 ... exD-1          (N tokens in all)
//
// A tokenizer without an end-of-sequence token (eos_id) is an error when plain text or prompts
// need one.
//
// The tokenizer. `tokenizer` names an existing tokenizer.json, used as is and copied byte for
// byte (with the tokenizer_config.json beside it, when there is one). Otherwise a byte-level
// BPE of `vocab` tokens (≥ 257 + the chat format's special tokens: the 256 bytes,
// "<|endoftext|>" and those) is trained on the examples' texts each followed by "<|endoftext|>"
// (a chat's text is its rendering): training cuts special tokens out before pre-splitting, so no
// piece — hence no merge — spans two documents, and the pair counts are the sums of each
// document's own (a "\n" separator would add newline pieces no document has; plain
// concatenation would learn merges across a boundary, such as the last word of one document
// glued to the first of the next). The one difference from the encoding: text "<|endoftext|>"
// inside a document also ends a piece for training. Training sees all documents, so for a corpus
// much larger than memory train a tokenizer on a sample once and pass it here.
//
// The split. The last V = ceil(val_fraction · N) tokens of the stream are the validation set, the
// first N − V the training set: the held-out text is the end of the last documents, never mixed
// into training. When the cut falls inside a document that must not be split (a chat, a prompt
// and completion), it moves back to that document's start, so the validation set holds more
// than V tokens and no example is cut in two. (A product within a relative 1e-9 of an integer
// counts as that integer, so 0.07 × 100 gives 7, not the 8 that binary 0.07, a little above
// 0.07, would.) val_fraction must be in (0, 0.5]; both sets need at least 2 tokens (one input
// and one target). The training set is cut into shards of shard_tokens tokens, the last one
// shorter (a document may continue in the next shard: the loader reads the shards as one
// stream); the validation set is one shard.
//
// On disk (out_dir, created if missing; file formats in data/shard.h and data/tokenizer.h):
//   tokenizer.json                    the tokenizer (a given one copied as it is)
//   tokenizer_config.json             a copy of the given tokenizer's, when it has one
//   chat_template.jinja               a copy of the one beside the given tokenizer, when it has one
//   train_000000.pvtokens, ...        the training stream in order: train_%06d, counting from 0
//   val.pvtokens                      the validation stream
// Each file is written atomically (tmp + fsync + rename). Rerunning over an older output
// overwrites its files and removes its train_*.pvtokens beyond the new count, so load_dataset
// never mixes two runs; a run that crashes midway may leave such a mix, and rerunning fixes it.
// The output is a function of the inputs and options only: the same inputs give byte-identical
// files (documents are encoded in parallel, but concatenated in input order).
//
// Errors: bad options throw std::invalid_argument, bad or unreadable input files and too little
// data std::runtime_error, each message naming the option or file (and line) and the fix.
#pragma once

#include "data/shard.h"

#include <optional>
#include <string>
#include <vector>

namespace pv {

struct PrepareOptions {
    std::vector<std::string> inputs;       // files: *.jsonl / *.ndjson JSON lines, anything else plain text
    std::string chat_format;               // --chat-format: llama3, llama3.1, llama2; empty: the tokenizer's template
    std::string chat_template;             // --chat-template: a .jinja file; overrides chat_format and the tokenizer's
    bool train_on_prompt = false;          // --train-on-prompt: prompts, system and user turns count too
    std::string text_field = "text";       // the JSONL field holding a document
    std::string tokenizer;                 // an existing tokenizer.json; empty: train one of `vocab` tokens
    int vocab = 4096;                      // the trained tokenizer's size (ignored with `tokenizer`)
    std::string out_dir;                   // created if missing
    double val_fraction = 0.1;             // of the tokens, held out at the end for validation: (0, 0.5]
    long long shard_tokens = 100'000'000;  // max tokens per training shard
    // --truncate N: a chat or prompt/completion longer than N tokens keeps its first N (one whose
    // first N hold no counted token is left out). 0: kept whole; the loader then leaves out those
    // longer than a window (--seq-len + 1 tokens) and `train` prints how many. Give N = the
    // --seq-len you will train with, plus 1.
    long long truncate = 0;
    // How the work is cut (the output does not depend on either): input text per encoding item
    // (0: kPrepareChunkBytes) and threads (0: every core, cpu_threads_per_rank()). Small values
    // are for tests.
    size_t chunk_bytes = 0;
    int threads = 0;
    // The memory bounds' refusals (0: the defaults below; small values are for tests): the most
    // plain text held without a safe cut, which is also the longest JSON line (0: max(16 chunks,
    // kPrepareRoundBytes)), and the most input a tokenizer is trained on (0: kPrepareMaxTrainingBytes).
    size_t max_uncut_bytes = 0;
    size_t max_training_bytes = 0;
};

// Memory. prepare streams: it reads the inputs a block at a time into items of about chunk_bytes
// of text (JSON lines: whole examples; plain text: pieces cut only where the tokenizer's encoding
// is the same whole or cut, see below), encodes two items per thread at a time, and appends their tokens to
// a working copy of the stream on disk, from which the shards are written a piece at a time; no
// more than one round of items, their tokens and the piece of a shard being written is ever held,
// whatever the size of the inputs. Text in a round: at most kPrepareRoundBytes (the chunk shrinks
// with many threads). Peak resident memory stays under 1 GiB (measured: docs/training-and-data.md).
// A plain text with no safe cut in max(16 chunks, 64 MiB), and a JSON line longer than that, are
// errors. Training a tokenizer (no `tokenizer`) holds all of its text: refused above
// kPrepareMaxTrainingBytes of input.
//
// Where plain text is cut. A candidate cut is
//   - a line start followed by a printable ASCII character: the pieces are text[0, p) and
//     text[p, ...) (byte-level BPE such as GPT-2's and Llama 3's: their pre-tokenizers start a
//     new piece there);
//   - a single space between two non-whitespace characters, kept at the start of the next piece
//     (the same pre-tokenizers start a new piece at " word"), or dropped: the pieces are the text
//     before the space and the text after it. The second is for SentencePiece-style tokenizers
//     (Llama 2, TinyLlama, Mistral): their normalizer puts "▁" in front of every text and turns
//     each " " into "▁", so normalize(A + " " + B) = normalize(A) + normalize(B) exactly, and the
//     "▁" the second piece is given stands for the dropped space. Without a pre-tokenizer BPE then
//     merges the whole text as one word, and the joined encodings equal the whole one unless a
//     merge joins A's last character to that "▁": such a merge would make a token holding a
//     non-space character followed by "▁", which a SentencePiece vocabulary does not have (its
//     pieces hold "▁" only at their start; data/bpe.h cuts long words on the same argument).
// Every candidate is checked before it is used: the lines around it (at most 1 KiB either side)
// are encoded whole and as the two pieces, and a candidate whose tokens differ is passed over. So
// a tokenizer the reasoning above does not fit costs at most a rejected candidate, never a
// different token; a text with no accepted cut within the bound is refused.
inline constexpr size_t kPrepareChunkBytes = size_t(4) << 20;
inline constexpr size_t kPrepareRoundBytes = size_t(64) << 20;
inline constexpr int kPrepareMaxThreads = 64;
inline constexpr size_t kPrepareMaxTrainingBytes = size_t(256) << 20;

struct PreparedData {
    std::string tokenizer_path;             // out_dir/tokenizer.json
    std::vector<std::string> train_shards;  // out_dir/train_000000.pvtokens, ...
    std::string val_shard;                  // out_dir/val.pvtokens
    long long documents = 0;                // non-empty examples read, and by kind:
    long long text_documents = 0, prompt_completion_documents = 0, chat_documents = 0;
    std::string chat_format;  // the format chats were rendered in; empty: no chats
    long long train_tokens = 0, val_tokens = 0;
    long long counted_tokens = 0;  // of train + val tokens, those that count as targets
    int vocab_size = 0;            // the tokenizer's (a trained one may stop short of `vocab`)
    long long truncated_documents = 0;  // cut to `truncate` tokens
    long long dropped_documents = 0;    // longer than `truncate` with nothing counted in the first `truncate`
    // What was held at once, at most (the memory bound's test): input text read and not yet
    // encoded, and tokens encoded and not yet on disk.
    size_t peak_buffered_bytes = 0, peak_buffered_tokens = 0;
};

PreparedData prepare_data(const PrepareOptions& o);

// What `train --data PATH` loads. PATH is either
//   - a directory written by prepare_data: every regular file named train_*.pvtokens, in name
//     order, then val.pvtokens if present and tokenizer.json's path if present (its
//     tokenizer_config.json is beside it when there is one); or
//   - a single .pvtokens shard: train = {it}, no validation shard, no tokenizer.
// Throws std::runtime_error when PATH does not exist, a directory holds no train_*.pvtokens, the
// shards disagree on vocab_size (two runs mixed), or a shard fails read_shard's checks.
struct DataSet {
    std::vector<TokenShard> train;
    std::optional<TokenShard> val;
    std::string tokenizer_path;            // empty if none
    std::vector<std::string> train_paths;  // the file of each train shard
};
DataSet load_dataset(const std::string& path);

}  // namespace pv
