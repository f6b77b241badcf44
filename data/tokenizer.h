// Tokenizers as Hugging Face `tokenizers` runs them, read from a tokenizer.json (or trained here
// as a byte-level BPE), giving the same ids. Host code only.
//
// What a tokenizer.json says, and what polevault reads of it (anything else is refused by name,
// with std::runtime_error naming the file, the component and what is supported):
//   added_tokens    strings cut out of the text first, each one id; flags special, lstrip, rstrip,
//                   normalized, single_word as HF applies them (data/tokenizer_parts.h)
//   normalizer      null, Prepend, Replace (String or Regex), Sequence
//   pre_tokenizer   null, Split (String or Regex; every behavior; invert), ByteLevel (GPT-2's regex
//                   or none, add_prefix_space; it must come last), Metaspace (prepend_scheme
//                   always/first/never, split), Digits, Sequence
//   model           BPE: vocab, merges ("a b" or ["a", "b"]), ignore_merges, byte_fallback with
//                   <0xNN> tokens, unk_token, fuse_unk (data/bpe.h). WordPiece, Unigram and
//                   WordLevel are refused, and so are dropout, continuing_subword_prefix and
//                   end_of_word_suffix.
//   decoder         null, ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace, Sequence
//   post_processor  null, TemplateProcessing (the single-sequence template), ByteLevel, Sequence
//   truncation, padding   must be null (polevault neither cuts nor pads what it encodes)
// The two families this covers: byte-level BPE (GPT-2, Llama 3: Split + ByteLevel pre-tokenizer,
// ByteLevel decoder) and SentencePiece-style BPE with byte fallback (Llama 2, TinyLlama, Mistral:
// Prepend + Replace normalizer or Metaspace pre-tokenizer, <0xNN> tokens, Replace / ByteFallback /
// Fuse / Strip decoder).
//
// Encoding (HF's TokenizerImpl::encode of one sequence):
//   1. Added tokens that are not `normalized` are cut out of the raw text; the rest is normalized
//      piece by piece (so Prepend acts after every added token), then `normalized` added tokens are
//      cut out of that.
//   2. Each remaining piece goes through the pre-tokenizer, and each of its pieces through BPE.
//   3. add_special: the post-processor's tokens go around the result (BOS for TemplateProcessing
//      "<s> $A"; nothing for a ByteLevel post-processor).
// Invalid UTF-8 (which HF cannot take: its encode takes str) is still encoded: regexes cannot match
// it, so its bytes form pieces of their own; byte-level BPE spells them as byte tokens, so
// decode(encode(x)) == x for EVERY byte string x with a byte-level tokenizer.
//
// Decoding (HF's decode): each id's string (an added token's content, else the vocabulary's), the
// special ones left out when skip_special, through the decoder; without a decoder the strings are
// joined with spaces. One difference, kept on purpose: where a ByteLevel decoder meets invalid
// UTF-8, HF writes U+FFFD per maximal invalid subpart and polevault returns the bytes, so that
// byte strings round-trip; utf8_lossy(decode(ids)) (data/utf8.h) is HF's string.
//
// Training (train): the text is pre-split by the Llama 3 regex (special tokens cut out, so they
// are never learned), unique pieces are counted, and byte-level merges learned (data/bpe.h). Ids:
// 0..255 the bytes, then one per merge result in merge order, then the special tokens. save()
// writes it as a Hugging Face byte-level tokenizer.json (Split + ByteLevel pre-tokenizer, ByteLevel
// decoder, the specials as added tokens) that load() and HF read back to the same ids.
//
// A Tokenizer is immutable after construction; copies share its tables, and encode/decode may be
// called concurrently from several threads.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace pv {

class Tokenizer {
  public:
    // vocab_size counts the 256 byte tokens, the merges and the special tokens. Throws
    // std::invalid_argument when vocab_size < 256 + special_tokens.size() or a special token is
    // empty or repeated. Stops early (a smaller vocabulary) when the text runs out of pairs.
    static Tokenizer train(std::string_view text, int vocab_size,
                           std::vector<std::string> special_tokens = {"<|endoftext|>"});
    // Reads a Hugging Face tokenizer.json, and tokenizer_config.json from the same directory when
    // there is one (its bos_token, eos_token and add_bos_token; the text is kept). Throws
    // std::runtime_error naming the file and the problem (missing, not JSON, an unsupported
    // component, a merge whose parts are not in the vocabulary, ...). Llama 3's 128k-token file
    // loads in about 0.25 s of CPU (bench/tokenizer_bench).
    static Tokenizer load(const std::string& tokenizer_json_path);
    // A loaded tokenizer writes the bytes it was read from, unchanged, and tokenizer_config.json
    // beside `path` when it had one; a trained one writes its tokenizer.json. Atomic
    // (io/durable_file.h: path.tmp, fsync, rename); throws std::runtime_error on I/O failure.
    void save(const std::string& path) const;

    // The ids of text. parse_special: special-token strings in the text become their ids (HF's
    // encode(text, add_special_tokens=False)); false treats them as plain text (HF's
    // split_special_tokens=True; added tokens that are not special are still matched).
    // add_special: the post-processor's tokens are added (HF's add_special_tokens=True).
    std::vector<int> encode(std::string_view text, bool parse_special = true, bool add_special = false) const;
    // The text of ids, through the file's decoder (see the top of this file); skip_special leaves
    // special tokens out. Throws std::out_of_range on an id that is not a token.
    std::string decode(const std::vector<int>& ids, bool skip_special = false) const;

    // One past the largest id.
    int vocab_size() const;
    // The id of the added token with this content, else of the vocabulary entry spelled so in the
    // file (HF's token_to_id), else, for byte-level vocabularies, of the token standing for these
    // bytes (token_id(" the") finds "Ġthe"); -1 when none.
    int token_id(std::string_view token_text) const;
    // The contents of the added tokens, in the file's order: the strings encode(text, true) cuts
    // out of a text as one token each.
    std::vector<std::string> added_token_texts() const;
    // Whether id is an added token marked special (decode(ids, true) leaves those out, except one
    // with the `normalized` flag whose normalized string differs from its content, as in HF).
    bool is_special(int id) const;
    // The beginning-of-sequence token: tokenizer_config.json's bos_token, else the token the
    // post-processor puts first, else "<|begin_of_text|>" or "<s>" among the added tokens; -1 none.
    int bos_id() const;
    // The end-of-sequence token, which separates documents: tokenizer_config.json's eos_token,
    // else the token the post-processor puts last, else "<|end_of_text|>", "</s>" or
    // "<|endoftext|>" among the added tokens; -1 none.
    int eos_id() const;
    // Whether sequences start with bos_id(): tokenizer_config.json's add_bos_token when it says,
    // else whether the post-processor puts bos_id() first.
    bool add_bos_token() const;
    // tokenizer_config.json as read ("" when there was none), for its chat_template.
    const std::string& config_json() const;
    // What every id means, as a number: XXH3-64 of each id's vocabulary string (or its absence)
    // and of the added tokens' ids and contents. Two tokenizers with the same fingerprint give
    // every id the same token, however their files are laid out; merges, normalizer and
    // pre-tokenizer do not count (they change how a text is cut, not what an id stands for).
    // Never 0, which token shards use for "not recorded" (data/shard.h).
    uint64_t id_fingerprint() const;

    struct Impl;

  private:
    explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
    std::shared_ptr<const Impl> impl_;
};

// Decodes ids one at a time as a generator produces them, giving only text that later ids cannot
// change: a UTF-8 character split over byte tokens, or a byte-fallback run, is held back until it
// is complete. Concatenating every push() and finish() gives decode(all ids), minus what the
// context decodes to. The method is HF's DecodeStream: decode a short window of recent ids and
// return what it adds to the text of the window's first ids, so decoders that treat the first
// token of a text differently (Strip, Metaspace) see the new ids in their true position. One case
// cannot be undone: with byte fallback, a run of byte tokens that forms a valid character and then
// continues with bytes that make the run invalid (which HF's decode writes as U+FFFD per byte, the
// character included) keeps the character already returned.
//
//   TokenStreamDecoder stream(tokenizer, prompt_ids);
//   for (int id : generated) std::fputs(stream.push(id).c_str(), stdout);
//   std::fputs(stream.finish().c_str(), stdout);
class TokenStreamDecoder {
  public:
    // context: ids that come before the first pushed one (the prompt); they are not returned. Its
    // text should end where a character ends (a prompt encoded from text does).
    explicit TokenStreamDecoder(Tokenizer tokenizer, const std::vector<int>& context = {}, bool skip_special = false);
    // Adds one id and returns the text that is now final (often empty while a character is
    // incomplete). Throws std::out_of_range on an id that is not a token.
    std::string push(int id);
    // The text still held back (an incomplete character at the very end); the stream then starts
    // afresh with no context.
    std::string finish();

  private:
    Tokenizer tokenizer_;
    bool skip_special_;
    std::vector<int> window_;  // the ids of the last returned step, then the ids not yet returned
    size_t settled_ = 0;       // how many of window_ belong to the last returned step
    std::string prefix_;       // decode of those settled ids: the text already accounted for
};

}  // namespace pv
