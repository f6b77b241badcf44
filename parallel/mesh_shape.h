// The device mesh's shape (see mesh.h): axes, coordinates, groups, the printed layout and the
// node checks. Plain C++ without NCCL, so that the option checks and the planner (parallel/plan.h)
// use it anywhere; mesh.h builds the communicators.
#pragma once

#include <string>
#include <vector>

namespace pv {

enum class MeshAxis : unsigned { tensor = 1, shard = 2, replicate = 4, pipeline = 8 };
// A set of axes (bits of MeshAxis).
using MeshAxes = unsigned;
constexpr MeshAxes axes(MeshAxis a) { return MeshAxes(a); }
constexpr MeshAxes operator|(MeshAxis a, MeshAxis b) { return MeshAxes(a) | MeshAxes(b); }
constexpr MeshAxes operator|(MeshAxes a, MeshAxis b) { return a | MeshAxes(b); }
inline constexpr MeshAxes kDataAxes = MeshAxis::shard | MeshAxis::replicate;
inline constexpr MeshAxes kAllAxes = MeshAxis::tensor | MeshAxis::shard | MeshAxis::replicate | MeshAxis::pipeline;
// Added to a set: its own communicator even when its group is one rank or the whole world (ZeRO's
// shard and replica groups under hybrid sharding issue their collectives whatever their size).
inline constexpr MeshAxes kOwnComm = 16;

struct MeshShape {
    int pipeline = 1, replicate = 1, shard = 1, tensor = 1;
    int ranks() const { return pipeline * replicate * shard * tensor; }
    int size(MeshAxis a) const;
    int size(MeshAxes set) const;  // the product of the axes' sizes
    int data() const { return replicate * shard; }  // the ranks splitting the batch
    bool operator==(const MeshShape&) const = default;
};

struct MeshCoords {
    int pipeline = 0, replicate = 0, shard = 0, tensor = 0;
    int of(MeshAxis a) const;
};

// This rank's coordinates, and back.
MeshCoords mesh_coords(const MeshShape& shape, int rank);
int mesh_rank(const MeshShape& shape, const MeshCoords& c);
// The index of `rank` within its group of `set` (its rank in comm(set)), and the group's number
// among the groups of `set` (the colour of its split).
int mesh_group_rank(const MeshShape& shape, MeshAxes set, int rank);
int mesh_group_index(const MeshShape& shape, MeshAxes set, int rank);
// The rank's place among the data-parallel ranks (replicate·S + shard): which slice of the batch it reads.
inline int mesh_data_rank(const MeshShape& shape, int rank) { return mesh_group_rank(shape, kDataAxes, rank); }

// "pipeline 2 × dp-replicate 1 × dp-shard 2 × tensor 1 = 4 ranks; rank = ((pipeline·1 + replicate)·2 + shard)·1 + tensor".
std::string describe_mesh(const MeshShape& shape);
// A text picture, one line per pipeline stage: replicas side by side, each shard group in
// brackets, tensor groups in parentheses.
std::string draw_mesh(const MeshShape& shape);

// Empty when the axes meant to stay inside a node do, for `node_of_rank` (a node number per world
// rank); otherwise the error to stop with, naming the fix.
std::string mesh_locality_problem(const MeshShape& shape, const std::vector<int>& node_of_rank);
// Empty, or a warning: hybrid sharding's shard groups cross nodes (their per-unit collectives then
// run over the slower link).
std::string mesh_locality_warning(const MeshShape& shape, const std::vector<int>& node_of_rank);

}  // namespace pv
