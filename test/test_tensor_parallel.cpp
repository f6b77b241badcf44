// Tensor parallelism's slices of the block tensors, the embedding and the head (model/
// tensor_parallel.h): the sizes that split a model and the refusals naming the rest; the heads and
// vocabulary rows each rank holds, worked by hand; and, for
// every size that fits, the T ranks' slices of each tensor tile the whole tensor — each element
// exactly once, a replicated kv head or tensor on every rank that holds it — with their Hugging
// Face parts naming the rows they hold. Checkpoints of slices: the ranks' groups join into the
// whole tensors' groups (join_tensor_slices), and each rank's slice reads back out of a file of
// whole tensors (read_group_ranges: rows from a part's hf_row_begin, a column slice row by row).
#include <catch2/catch.hpp>

#include "model/checkpoint.h"
#include "model/nf4_layout.h"
#include "model/tensor_parallel.h"
#include "test/error_of.h"
#include "test/temp_dir.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace tensor_parallel_test {

// 12 query heads of 4, 4 kv heads (groups of 3), ffn 24: T = 1, 2, 4 and 12 fit; 3 and 6 leave a
// rank's query heads across two groups; 5 divides nothing. A vocabulary of 23 that no T > 1
// divides: the last rank holds fewer rows (12 + 11, 6·3 + 5, 2·11 + 1).
pv::LlamaConfig gqa() {
    pv::LlamaConfig c;
    c.name = "gqa-test";
    c.vocab_size = 23, c.hidden_size = 8, c.num_layers = 2, c.num_heads = 12, c.num_kv_heads = 4, c.head_dim = 4;
    c.ffn_size = 24, c.max_seq_len = 8;
    return c;
}

const pv::TensorSpec& find(const std::vector<pv::UnitSpec>& units, const std::string& name) {
    for (const pv::UnitSpec& u : units)
        for (const pv::TensorSpec& t : u.tensors)
            if (t.name == name) return t;
    FAIL("no tensor " << name);
    throw;
}

}  // namespace tensor_parallel_test

using namespace tensor_parallel_test;
using pv::test::error_of;

TEST_CASE("tensor parallelism: the sizes that split a model, and the refusals", "[tensor_parallel]") {
    const pv::LlamaConfig c = gqa();
    for (int t : {1, 2, 4, 12}) CHECK(pv::tensor_parallel_fits(c, t));
    for (int t : {3, 5, 6, 8, 24}) CHECK_FALSE(pv::tensor_parallel_fits(c, t));
    CHECK(error_of<std::invalid_argument>([&] { pv::check_tensor_parallel(c, 5); }) ==
          "tensor parallelism over 5 ranks: 5 does not divide the 12 query heads of gqa-test; --tp can be 1, 2, 4, "
          "12");
    CHECK(error_of<std::invalid_argument>([&] { pv::check_tensor_parallel(c, 6); }) ==
          "tensor parallelism over 6 ranks: 6 divides neither the 4 key/value heads nor leaves each rank's 2 query "
          "heads within one key/value head's group of 3 of gqa-test; --tp can be 1, 2, 4, 12");
    pv::LlamaConfig odd_ffn = c;
    odd_ffn.ffn_size = 26;
    CHECK(error_of<std::invalid_argument>([&] { pv::check_tensor_parallel(odd_ffn, 4); }) ==
          "tensor parallelism over 4 ranks: 4 does not divide the ffn size 26 of gqa-test; --tp can be 1, 2");  // 26 = 2·13
    // 12 ranks of ⌈21/12⌉ = 2 rows leave the last none (22 ≥ 21).
    pv::LlamaConfig small_vocab = c;
    small_vocab.vocab_size = 21;
    CHECK(error_of<std::invalid_argument>([&] { pv::check_tensor_parallel(small_vocab, 12); }) ==
          "tensor parallelism over 12 ranks: 12 leaves the last rank none of the vocabulary's 21 rows (2 a rank) of "
          "gqa-test; --tp can be 1, 2, 4");
}

TEST_CASE("tensor parallelism: each rank's vocabulary rows, by hand", "[tensor_parallel]") {
    const pv::LlamaConfig c = gqa();  // 23 tokens
    const auto rows = [&](int t, int r) {
        const pv::VocabSlice v = pv::tensor_parallel_vocab(c, {t, r});
        return std::pair<long long, long long>{v.first, v.count};
    };
    CHECK(rows(1, 0) == std::pair<long long, long long>{0, 23});
    CHECK(rows(2, 0) == std::pair<long long, long long>{0, 12});
    CHECK(rows(2, 1) == std::pair<long long, long long>{12, 11});
    CHECK(rows(4, 2) == std::pair<long long, long long>{12, 6});
    CHECK(rows(4, 3) == std::pair<long long, long long>{18, 5});
    CHECK(rows(12, 11) == std::pair<long long, long long>{22, 1});
    CHECK(pv::tensor_parallel_shape(c, {4, 3}).vocab_size == 5);
    // The embedding's slice names the Hugging Face rows it holds.
    const pv::TensorSpec& wte = find(pv::tensor_parallel_units(c, {}, {4, 3}), "wte");
    CHECK((wte.rows == 5 && wte.cols == 8 && wte.parts.size() == 1 && wte.parts[0].hf_row_begin == 18));
}

TEST_CASE("tensor parallelism: each rank's heads, by hand", "[tensor_parallel]") {
    const pv::LlamaConfig c = gqa();
    // T = 2: 6 query heads and 2 kv heads each.
    const pv::HeadSlice a = pv::tensor_parallel_heads(c, {2, 1});
    CHECK((a.q_first == 6 && a.q_count == 6 && a.kv_first == 2 && a.kv_count == 2));
    CHECK_FALSE(pv::kv_heads_replicated(c, 2));
    // T = 12: query head 7 alone, reading kv head 7 / 3 = 2, which ranks 6, 7 and 8 all hold.
    const pv::HeadSlice b = pv::tensor_parallel_heads(c, {12, 7});
    CHECK((b.q_first == 7 && b.q_count == 1 && b.kv_first == 2 && b.kv_count == 1));
    CHECK(pv::kv_heads_replicated(c, 12));
    CHECK_THROWS_AS(pv::tensor_parallel_heads(c, {2, 2}), std::invalid_argument);
}

TEST_CASE("tensor parallelism: the ranks' slices tile every whole tensor, LoRA's too", "[tensor_parallel]") {
    const pv::LlamaConfig c = gqa();
    pv::LoraConfig lora;
    lora.rank = 2, lora.alpha = 4;
    lora.targets = {"q_proj", "v_proj", "o_proj", "up_proj", "down_proj"};
    const std::vector<pv::UnitSpec> whole = pv::model_units(c, lora);
    for (int t : {1, 2, 4, 12}) {
        // Per whole tensor: how many ranks hold each element.
        std::map<std::string, std::vector<int>> held;
        for (int r = 0; r < t; ++r) {
            const std::vector<pv::UnitSpec> mine = pv::tensor_parallel_units(c, lora, {t, r});
            REQUIRE(mine.size() == whole.size());
            for (const pv::UnitSpec& u : mine)
                for (const pv::TensorSpec& s : u.tensors) {
                    INFO("T = " << t << ", rank " << r << ", " << s.name);
                    const pv::TensorSpec& w = find(whole, s.name);
                    CHECK(s.id == w.id);
                    std::vector<int>& count = held[s.name];
                    count.resize(size_t(w.numel()));
                    for (long long i = 0; i < s.numel(); ++i) ++count[size_t(s.whole_index(i))];
                    // The whole tensor a slice names is the whole model's (what NF4 quantises whole).
                    const pv::TensorSpec back = s.whole_tensor();
                    CHECK((back.name == w.name && back.rows == w.rows && back.cols == w.cols && back.id == w.id &&
                           back.slice.whole()));
                    REQUIRE(back.parts.size() == w.parts.size());
                    for (size_t k = 0; k < w.parts.size(); ++k)
                        CHECK((back.parts[k].hf_name == w.parts[k].hf_name &&
                               back.parts[k].row_begin == w.parts[k].row_begin && back.parts[k].rows == w.parts[k].rows &&
                               back.parts[k].hf_row_begin == 0 && back.parts[k].whole_rows() == w.parts[k].rows));
                    // Each part's rows are the Hugging Face tensor's rows the whole tensor has there.
                    for (const pv::TensorPart& p : s.parts) {
                        const pv::TensorPart* wp = nullptr;
                        for (const pv::TensorPart& x : w.parts)
                            if (x.hf_name == p.hf_name) wp = &x;
                        REQUIRE(wp != nullptr);
                        CHECK(p.hf_row_begin >= 0);
                        CHECK(p.hf_row_begin + p.rows <= wp->rows);
                        CHECK(s.whole_index(p.row_begin * s.cols) ==
                              (wp->row_begin + p.hf_row_begin) * w.cols + s.slice.col_begin);
                    }
                }
        }
        const int kv_copies = pv::kv_heads_replicated(c, t) ? t / c.num_kv_heads : 1;
        for (const auto& [name, count] : held) {
            INFO("T = " << t << ", " << name);
            const pv::TensorSpec& w = find(whole, name);
            const bool norm = name.find("norm") != std::string::npos;
            const bool replicated = t > 1 && (norm ||
                                              name.find("lora_a_qkv") != std::string::npos ||
                                              name.find("lora_a_gate_up") != std::string::npos ||
                                              name.find("lora_b_o") != std::string::npos ||
                                              name.find("lora_b_down") != std::string::npos);
            for (long long i = 0; i < w.numel(); ++i) {
                int expected = replicated ? t : 1;
                // A kv head's rows of w_qkv (and of the qkv adapter's B) on each rank that reads it.
                const long long row = i / w.cols, q = c.q_width();
                if (kv_copies > 1 && name.find("w_qkv") != std::string::npos && row >= q) expected = kv_copies;
                if (kv_copies > 1 && name.find("lora_b_qkv") != std::string::npos && row >= q) expected = kv_copies;
                if (count[size_t(i)] != expected) {
                    INFO("element " << i);
                    CHECK(count[size_t(i)] == expected);
                    break;
                }
            }
        }
    }
}

namespace tensor_parallel_test {

// A value for element e of the whole tensor with id `id`: distinct across tensors and elements,
// exact in fp64.
double value_of(uint32_t id, long long e) { return double(id) * 1e6 + double(e) + 0.25; }

// Group g of unit u filled as the layout places its tensors: each element's value keyed by its
// index in the whole tensor (so a slice and its whole tensor agree there); gaps and padding zero.
std::vector<uint8_t> filled(const pv::GroupLayout& l) {
    std::vector<double> v(size_t(l.padded), 0.0);
    for (const pv::TensorSlot& t : l.tensors)
        for (long long i = 0; i < t.spec.numel(); ++i) v[size_t(t.offset + i)] = value_of(t.spec.id, t.spec.whole_index(i));
    std::vector<uint8_t> bytes(v.size() * sizeof(double));
    std::memcpy(bytes.data(), v.data(), bytes.size());
    return bytes;
}

}  // namespace tensor_parallel_test

TEST_CASE("tensor parallelism: slices join into whole tensors, and read back out of a file of them",
          "[tensor_parallel][checkpoint]") {
    pv::test::TempDir dir("tp_join");
    for (bool tied : {true, false}) {
        pv::LlamaConfig c = gqa();
        c.tie_embeddings = tied;
        const auto whole = pv::model_layouts(c, pv::DType::fp64, 2, {});
        pv::HostGroups file{pv::DType::fp64, {}};
        std::vector<pv::GroupLayout> whole_groups;
        for (const auto& unit : whole) whole_groups.push_back(unit.front()), file.units.push_back(filled(unit.front()));
        const std::string path = dir.file(tied ? "tied.safetensors" : "untied.safetensors");
        pv::write_group_tensors(path, whole_groups, file);
        for (int t : {2, 4, 12}) {  // 12: each kv head on three ranks
            std::vector<std::vector<std::vector<pv::GroupLayout>>> ranks;
            for (int r = 0; r < t; ++r) ranks.push_back(pv::model_layouts(c, pv::DType::fp64, 2, {{}, {}, false, true, {t, r}}));
            for (size_t u = 0; u < whole.size(); ++u) {
                INFO("T = " << t << (tied ? ", tied" : ", untied") << ", unit " << u);
                std::vector<pv::GroupLayout> slices;
                std::vector<std::vector<uint8_t>> bytes;
                std::vector<const uint8_t*> at;
                for (int r = 0; r < t; ++r) slices.push_back(ranks[size_t(r)][u].front()), bytes.push_back(filled(slices.back()));
                for (const auto& b : bytes) at.push_back(b.data());
                CHECK(pv::join_tensor_slices(whole[u].front(), slices, at, sizeof(double)) == file.units[u]);
                // The ranges the ranks count (the gradient norm's) take each whole element once.
                std::map<std::string, std::vector<int>> counted;
                for (const pv::TensorSlot& w : whole[u].front().tensors) counted[w.spec.name].resize(size_t(w.spec.numel()));
                for (int r = 0; r < t; ++r)
                    for (const auto& [begin, end] : pv::counted_ranges(slices[size_t(r)], r))
                        for (const pv::TensorSlot& s : slices[size_t(r)].tensors)
                            for (long long i = std::max(begin, s.offset); i < std::min(end, s.offset + s.spec.numel()); ++i)
                                ++counted[s.spec.name][size_t(s.spec.whole_index(i - s.offset))];
                for (const auto& [name, count] : counted) {
                    INFO(name);
                    CHECK(std::all_of(count.begin(), count.end(), [](int n) { return n == 1; }));
                }
                // A rank short: an element of a whole block tensor, or of the embedding, unwritten.
                if (u <= size_t(c.num_layers)) {  // the embedding or a block
                    slices.pop_back(), at.pop_back();
                    CHECK_THROWS_WITH(pv::join_tensor_slices(whole[u].front(), slices, at, sizeof(double)),
                                      Catch::Contains("the slices hold"));
                }
            }
            // Each rank's slices, read from the whole tensors' file: the whole groups, and a
            // ZeRO-like range in the middle of each (a column slice's rows cut across).
            for (int r = 0; r < t; ++r) {
                std::vector<pv::GroupLayout> mine;
                for (const auto& unit : ranks[size_t(r)]) mine.push_back(unit.front());
                const pv::HostGroups read = pv::read_group_tensors(path, mine, pv::DType::fp64);
                pv::HfCheckpoint source = pv::HfCheckpoint::open_file(path);
                std::vector<pv::ElementRange> middle;
                for (const pv::GroupLayout& l : mine) middle.push_back({l.padded / 2 - 7, l.padded / 2});
                std::vector<std::vector<uint8_t>> part(mine.size());
                for (size_t u = 0; u < mine.size(); ++u) part[u].assign(size_t(middle[u].len) * sizeof(double), 0);
                pv::read_group_ranges(source, mine, middle, pv::DType::fp64,
                                      [&](size_t k, long long at, const uint8_t* data, long long n) {
                                          std::memcpy(part[k].data() + at * 8, data, size_t(n) * 8);
                                      });
                for (size_t u = 0; u < mine.size(); ++u) {
                    INFO("T = " << t << ", rank " << r << ", unit " << u);
                    const std::vector<uint8_t> expected = filled(mine[u]);
                    CHECK(read.units[u] == expected);
                    CHECK(std::equal(part[u].begin(), part[u].end(), expected.begin() + middle[u].begin * 8));
                }
            }
        }
        // A file holds whole tensors: a slice's layout is refused.
        std::vector<pv::GroupLayout> sliced;
        pv::HostGroups data{pv::DType::fp64, {}};
        for (const auto& unit : pv::model_layouts(c, pv::DType::fp64, 1, {{}, {}, false, true, {2, 0}}))
            sliced.push_back(unit.front()), data.units.push_back(filled(unit.front()));
        CHECK_THROWS_WITH(pv::write_group_tensors(dir.file("slice.safetensors"), sliced, data),
                          Catch::Contains("is a tensor-parallel slice"));
    }
}

namespace tensor_parallel_test {

// QLoRA's sizes (test_mpi_tensor_parallel's): hidden 128, 8 query heads of 32 (W_o 256 columns), 4 kv
// heads, ffn 512; every block linear spans several nested blocks of 256 absmaxes.
pv::LlamaConfig qlora() {
    pv::LlamaConfig c;
    c.name = "qlora-test";
    c.vocab_size = 37, c.hidden_size = 128, c.num_layers = 1, c.num_heads = 8, c.num_kv_heads = 4;
    c.head_dim = 32, c.ffn_size = 512, c.max_seq_len = 16;
    return c;
}

// Element e's 4-bit code in packed codes (the first element in the high nibble).
int nibble(const uint8_t* codes, long long e) { return e % 2 == 0 ? codes[e / 2] >> 4 : codes[e / 2] & 15; }

}  // namespace tensor_parallel_test

// A slice's NF4 fields are its modules' fields at its elements: every code is the whole module's
// code of the element the slice holds there (TensorSpec::whole_index, which knows nothing of NF4),
// every absmax (or absmax code) the one of the whole block holding its 64 elements, the nested
// scales and offset the module's. The whole slot is a byte pattern, so a code or absmax taken from
// the wrong place shows.
TEST_CASE("tensor parallelism: QLoRA's NF4 slices hold their modules' blocks, or are refused naming the T that works",
          "[tensor_parallel][nf4]") {
    const pv::LlamaConfig c = qlora();
    pv::LoraConfig lora;
    lora.rank = 2, lora.alpha = 4;
    const std::vector<pv::UnitSpec> whole = pv::model_units(c, lora);
    for (bool dq : {true, false})
        for (int t : {1, 2, 4}) {
            CHECK_NOTHROW(pv::check_nf4_tensor_parallel(c, lora, t));
            for (int r = 0; r < t; ++r) {
                const std::vector<pv::UnitSpec> units = pv::tensor_parallel_units(c, lora, {t, r});
                for (const pv::TensorSpec& s : units.at(1).tensors) {
                    if (s.name.find("lora") != std::string::npos || s.name.find("norm") != std::string::npos) continue;
                    INFO("T = " << t << ", rank " << r << ", " << s.name << (dq ? ", double quantisation" : ""));
                    const pv::TensorSpec& w = find(whole, s.name);
                    std::vector<uint8_t> from(size_t(pv::nf4_slot_bytes(w, dq))), to(size_t(pv::nf4_slot_bytes(s, dq)), 0);
                    for (size_t i = 0; i < from.size(); ++i) from[i] = uint8_t((i * 2654435761u) >> 13);
                    pv::nf4_slice_fields(w, s, dq, from.data(), to.data());
                    const auto wf = pv::nf4_part_fields(w, dq), sf = pv::nf4_part_fields(s, dq);
                    REQUIRE(wf.size() == sf.size());
                    const long long absmax_bytes = dq ? 1 : 4;
                    for (size_t p = 0; p < sf.size(); ++p) {
                        // Local element i of part p is element e of the whole module.
                        const long long module_begin = w.parts[p].row_begin * w.cols;
                        const auto element = [&](long long i) {
                            return s.whole_index(s.parts[p].row_begin * s.cols + i) - module_begin;
                        };
                        long long bad = -1;
                        for (long long i = 0; i < sf[p].n && bad < 0; ++i)
                            if (nibble(to.data() + sf[p].codes, i) != nibble(from.data() + wf[p].codes, element(i))) bad = i;
                        CHECK(bad == -1);
                        for (long long j = 0; j * 64 < sf[p].n && bad < 0; ++j) {
                            const long long b = element(64 * j) / 64;
                            if (std::memcmp(to.data() + sf[p].absmax + j * absmax_bytes,
                                            from.data() + wf[p].absmax + b * absmax_bytes, size_t(absmax_bytes)) != 0)
                                bad = j;
                        }
                        CHECK(bad == -1);
                        if (!dq) continue;
                        CHECK(sf[p].nested_blocks == wf[p].nested_blocks);
                        CHECK(std::memcmp(to.data() + sf[p].nested, from.data() + wf[p].nested,
                                          size_t(4 * sf[p].nested_blocks)) == 0);
                        CHECK(std::memcmp(to.data() + sf[p].offset, from.data() + wf[p].offset, 4) == 0);
                    }
                }
            }
        }
    // down_proj spans 1,024 blocks, 4 nested blocks: a row-parallel slice's blocks read several.
    CHECK(pv::nf4_part_fields(find(whole, "layers.0.w_down"), true).at(0).nested_blocks == 4);

    // hidden 64, 4 heads of 32 (W_o 128 columns), ffn 256: 2 ranks hold 64 columns of o_proj and 128
    // of down_proj; 4 would hold 32 of o_proj, half a block a row.
    pv::LlamaConfig small = c;
    small.name = "qlora-split-test", small.hidden_size = 64, small.num_heads = 4, small.num_kv_heads = 2,
    small.ffn_size = 256;
    CHECK_NOTHROW(pv::check_nf4_tensor_parallel(small, lora, 2));
    const std::string refused = error_of<std::invalid_argument>([&] { pv::check_nf4_tensor_parallel(small, lora, 4); });
    CHECK_THAT(refused, Catch::Contains("layers.0.w_o's slice of model.layers.0.self_attn.o_proj.weight (columns [0, "
                                        "32) of 128) would cut the module's 64-element quantisation blocks") &&
                            Catch::Contains("QLoRA (--quantize nf4) over 4 tensor-parallel ranks cannot split "
                                            "qlora-split-test; --tp can be 1, 2 with --quantize nf4"));
    // The layouts the model and the planner build refuse it the same way.
    pv::GroupOptions g;
    g.lora = lora, g.nf4 = true, g.tensor = {4, 1};
    CHECK_THAT(error_of<std::invalid_argument>([&] { pv::model_layouts(small, pv::DType::bf16, 1, g); }),
               Catch::Equals(refused));
}
