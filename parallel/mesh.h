// The device mesh (DESIGN.md §2): the world's ranks laid out on named axes, and the communicator of
// each group of axes a strategy talks over.
//
// Axes, innermost first — rank = ((pipeline·R + replicate)·S + shard)·T + tensor:
//   tensor     T ranks splitting each matrix (size 1 until tensor parallelism lands);
//   shard      S ranks sharding the parameters, gradients and optimizer state (ZeRO's ranks; DDP
//              counts its ranks here too, every rank owning slice s of 1/S for the gradient norm);
//   replicate  R groups of shards holding the same slices (hybrid sharding's replicas: --shard-group);
//   pipeline   P stages, each a contiguous run of the units (parallel/pp.h).
// The data-parallel ranks — those splitting the batch — are the shard and replicate axes together.
// Inner axes are the chatty ones (a tensor-parallel all-reduce per matrix, ZeRO's gathers per
// unit) and consecutive ranks share a node under mpirun's default mapping; the pipeline, which
// sends one residual stream per micro-batch, is outermost, so its stages spread across nodes.
//
// Communicators. A strategy asks for the group of some axes (comm(axes)): the ranks that differ
// only in those coordinates, in rank order. A group of one rank has no communicator (null); the
// group of every axis larger than one is the world's own; any other is split off the world with
// ncclCommSplit once, at construction (collective over the world, in the same order on every rank),
// and shared by every set of axes naming the same ranks. Every split communicator runs on the
// world's stream, so a rank issues all its collectives in one order — NCCL's rule for
// communicators sharing ranks — and a strategy's fences cover them all.
// The pipeline's tied-embedding pair (its first and last stage, same other coordinates) is split
// here too: it replaces mp's own two-rank communicator.
//
// Nodes. The ranks sharing a node are found with Open MPI's shared-memory split; an axis meant to
// stay inside a node (tensor) that crosses one is refused, naming the fix.
#pragma once

#include "parallel/comm.h"
#include "parallel/mesh_shape.h"

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace pv {

// The node number (0, 1, … in order of first rank) of every rank of MPI_COMM_WORLD, from Open
// MPI's shared-memory split; {0} without MPI running. Collective over MPI_COMM_WORLD.
std::vector<int> node_of_each_rank();

// The mesh over a world communicator (null: one rank, every group empty), with the communicators
// of the axis sets `needed` (and the pipeline's ends when `pipeline_ends`). Collective over the
// world. Throws std::invalid_argument when the shape does not tile the world or an axis meant to
// stay inside a node crosses one.
class Mesh {
  public:
    Mesh(Comm* world, const MeshShape& shape, const std::vector<MeshAxes>& needed, bool pipeline_ends = false);
    ~Mesh();
    Mesh(const Mesh&) = delete;
    Mesh& operator=(const Mesh&) = delete;

    const MeshShape& shape() const { return shape_; }
    const MeshCoords& coords() const { return coords_; }
    Comm* world() const { return world_; }
    // The communicator of the ranks differing from this one only on `set` (null: a group of one,
    // but in a world of one rank its communicator; with kOwnComm, if it was needed so, its own);
    // `set` must have been needed at construction (or name the world, or one rank).
    Comm* comm(MeshAxes set) const;
    // Empty, or what mesh_locality_warning says of this world's nodes.
    const std::string& warning() const { return warning_; }
    // The pipeline's first and last stage with this rank's other coordinates (null: this rank is
    // neither, or the pipeline has one stage).
    Comm* pipeline_ends() const { return ends_; }
    // Every distinct communicator, the world's first: for counting and for polling waits.
    std::vector<Comm*> comms() const;

  private:
    MeshAxes effective(MeshAxes set) const;  // without the axes of size 1 (and without kOwnComm)
    MeshAxes key_of(MeshAxes set) const;     // its communicator's key in by_set_
    Comm* split(int color, const std::string& name);

    Comm* world_;
    MeshShape shape_;
    MeshCoords coords_;
    std::string warning_;
    std::vector<std::pair<ncclComm_t, std::unique_ptr<Comm>>> splits_;
    std::map<MeshAxes, Comm*> by_set_;  // effective set (| kOwnComm for a group of one or the world) -> its communicator
    Comm* ends_ = nullptr;
};

}  // namespace pv
