// The device mesh's shape (parallel/mesh.h): rank = ((pipeline·R + replicate)·S + shard)·T + tensor,
// tensor innermost; every rank's coordinates and back; the groups of a set of axes partition the
// ranks, each in rank order (its members differ only on those axes); the printed layout names
// every rank once; an axis meant to stay inside a node that crosses one is refused, a hybrid
// shard group that does is warned of; and the option checks build the mesh a run asks for.
#include <catch2/catch.hpp>

#include "parallel/mesh.h"
#include "parallel/plan.h"
#include "test/error_of.h"

#include <map>
#include <set>
#include <string>
#include <vector>

using pv::MeshAxis;
using pv::test::error_of;

TEST_CASE("mesh coordinates, groups and the rank order", "[mesh]") {
    for (const pv::MeshShape s : {pv::MeshShape{2, 1, 2, 1}, pv::MeshShape{2, 3, 2, 1}, pv::MeshShape{3, 2, 1, 2},
                                  pv::MeshShape{1, 1, 4, 1}, pv::MeshShape{4, 1, 1, 1}, pv::MeshShape{}}) {
        INFO(pv::describe_mesh(s));
        for (int r = 0; r < s.ranks(); ++r) {
            const pv::MeshCoords c = pv::mesh_coords(s, r);
            CHECK(pv::mesh_rank(s, c) == r);
            // The definition written out: tensor fastest, pipeline slowest.
            CHECK(c.tensor == r % s.tensor);
            CHECK(c.shard == r / s.tensor % s.shard);
            CHECK(c.replicate == r / (s.tensor * s.shard) % s.replicate);
            CHECK(c.pipeline == r / (s.tensor * s.shard * s.replicate));
            CHECK(pv::mesh_data_rank(s, r) == c.replicate * s.shard + c.shard);
        }
        const pv::MeshAxes sets[] = {pv::axes(MeshAxis::shard), pv::axes(MeshAxis::pipeline), pv::kDataAxes,
                                     MeshAxis::shard | MeshAxis::pipeline, pv::axes(MeshAxis::tensor)};
        for (pv::MeshAxes set : sets) {
            // Each group: size(set) ranks, numbered 0.. in rank order, agreeing on every other axis.
            std::map<int, std::vector<int>> groups;
            for (int r = 0; r < s.ranks(); ++r) groups[pv::mesh_group_index(s, set, r)].push_back(r);
            CHECK(int(groups.size()) * s.size(set) == s.ranks());
            for (const auto& [index, members] : groups) {
                REQUIRE(int(members.size()) == s.size(set));
                for (size_t i = 0; i < members.size(); ++i) {
                    CHECK(pv::mesh_group_rank(s, set, members[i]) == int(i));
                    const pv::MeshCoords a = pv::mesh_coords(s, members[0]), b = pv::mesh_coords(s, members[i]);
                    for (MeshAxis x : {MeshAxis::tensor, MeshAxis::shard, MeshAxis::replicate, MeshAxis::pipeline})
                        if (!(set & pv::axes(x))) CHECK(a.of(x) == b.of(x));
                }
            }
        }
    }
    CHECK_THROWS_AS(pv::mesh_coords(pv::MeshShape{2, 1, 2, 1}, 4), std::out_of_range);
}

TEST_CASE("the printed mesh names every rank once, a stage per line", "[mesh]") {
    const pv::MeshShape s{2, 2, 2, 1};  // 8 ranks: two stages of two replicas of two shards
    CHECK(pv::describe_mesh(s) ==
          "pipeline 2 × dp-replicate 2 × dp-shard 2 × tensor 1 = 8 ranks; rank = ((pipeline·2 + replicate)·2 + "
          "shard)·1 + tensor");
    const std::string picture = pv::draw_mesh(s);
    CHECK(picture.find("stage 0: [0 1] [2 3]\nstage 1: [4 5] [6 7]\n") == 0);
    const std::string tensor = pv::draw_mesh(pv::MeshShape{1, 1, 2, 2});
    CHECK(tensor.find("ranks: [(0 1) (2 3)]\n") == 0);
}

TEST_CASE("axes meant to stay inside a node are checked against the nodes", "[mesh]") {
    // Two nodes of four ranks.
    const std::vector<int> nodes = {0, 0, 0, 0, 1, 1, 1, 1};
    CHECK(pv::mesh_locality_problem(pv::MeshShape{2, 1, 1, 4}, nodes).empty());
    const std::string crossing = pv::mesh_locality_problem(pv::MeshShape{1, 1, 1, 8}, nodes);
    CHECK(crossing.find("tensor-parallel group of 8 ranks spans two nodes (ranks 0 and 4)") != std::string::npos);
    // Unequal nodes (three ranks, then five): a tensor group of two straddles them.
    CHECK(!pv::mesh_locality_problem(pv::MeshShape{1, 1, 4, 2}, {0, 0, 0, 1, 1, 1, 1, 1}).empty());
    // Hybrid sharding: shard groups of four inside the nodes, of eight across them (warned, not refused).
    CHECK(pv::mesh_locality_warning(pv::MeshShape{1, 2, 4, 1}, nodes).empty());
    CHECK(pv::mesh_locality_warning(pv::MeshShape{1, 1, 8, 1}, nodes).empty());  // not hybrid: nothing to say
    CHECK(pv::mesh_locality_warning(pv::MeshShape{1, 2, 4, 1}, {0, 0, 1, 1, 0, 0, 1, 1}).find("span nodes") !=
          std::string::npos);
}

TEST_CASE("the options make the mesh: pipeline stages outermost, shard groups within each stage", "[mesh][plan]") {
    pv::StrategyOptions o;
    o.kind = pv::StrategyKind::zero1, o.pipeline_stages = 2;
    CHECK(pv::mesh_of(o, 8) == pv::MeshShape{2, 1, 4, 1});
    o.shard_group = 2;
    CHECK(pv::mesh_of(o, 8) == pv::MeshShape{2, 2, 2, 1});
    CHECK(pv::data_ranks_of(o, 8) == 4);
    CHECK(pv::shards_of(o, 8) == 2);
    o.shard_group = 3;
    CHECK(error_of<std::invalid_argument>([&] { pv::mesh_of(o, 8); }).find("does not divide the 4 data-parallel ranks of each of the 2") !=
          std::string::npos);
    o.shard_group = 0, o.kind = pv::StrategyKind::pp, o.pipeline_stages = 0;
    CHECK(pv::mesh_of(o, 4) == pv::MeshShape{4, 1, 1, 1});  // pp: one stage per rank
    o.pipeline_stages = 4;
    CHECK(pv::mesh_of(o, 4) == pv::MeshShape{4, 1, 1, 1});
    o.pipeline_stages = 2;
    CHECK(error_of<std::invalid_argument>([&] { pv::mesh_of(o, 8); })
              .find("--parallel pp, which runs one stage on each of the 8") != std::string::npos);
    o.kind = pv::StrategyKind::ddp, o.pipeline_stages = 3;
    CHECK(error_of<std::invalid_argument>([&] { pv::mesh_of(o, 8); }).find("does not divide the 8 ranks") != std::string::npos);
    o.pipeline_stages = 4;
    CHECK(pv::mesh_of(o, 8) == pv::MeshShape{4, 1, 2, 1});
    CHECK(pv::has_pipeline(o));
    o.kind = pv::StrategyKind::zero3, o.pipeline_stages = 2, o.shard_group = 2;
    CHECK(pv::mesh_of(o, 8) == pv::MeshShape{2, 2, 2, 1});
    o.shard_group = 0, o.pipeline_stages = 8;
    CHECK(error_of<std::invalid_argument>([&] { pv::mesh_of(o, 8); }).find("leaves one rank per stage") !=
          std::string::npos);
    o.kind = pv::StrategyKind::ddp, o.pipeline_stages = 0, o.in_flight = 2;
    CHECK(error_of<std::invalid_argument>([&] { pv::mesh_of(o, 8); }).find("is for a pipeline") != std::string::npos);
}
