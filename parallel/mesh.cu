// The mesh's communicators (see mesh.h).
#include "parallel/mesh.h"

#include <mpi.h>

#include <stdexcept>

namespace pv {

std::vector<int> node_of_each_rank() {
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (!initialized || finalized) return {0};
    int rank = 0, size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
    int leader = rank;  // the node's first world rank names it
    MPI_Bcast(&leader, 1, MPI_INT, 0, node);
    MPI_Comm_free(&node);
    std::vector<int> leaders(size_t(size), 0);
    MPI_Allgather(&leader, 1, MPI_INT, leaders.data(), 1, MPI_INT, MPI_COMM_WORLD);
    std::vector<int> out, seen;  // leaders renumbered 0, 1, … in order of first rank
    for (int l : leaders) {
        size_t i = 0;
        while (i < seen.size() && seen[i] != l) ++i;
        if (i == seen.size()) seen.push_back(l);
        out.push_back(int(i));
    }
    return out;
}

Mesh::Mesh(Comm* world, const MeshShape& shape, const std::vector<MeshAxes>& needed, bool pipeline_ends)
    : world_(world), shape_(shape) {
    const int ranks = world ? world->size() : 1;
    if (shape.ranks() != ranks)
        throw std::invalid_argument("the mesh " + describe_mesh(shape) + " does not tile the " + std::to_string(ranks) +
                                    " ranks started");
    coords_ = mesh_coords(shape, world ? world->rank() : 0);
    if (!world) return;
    std::vector<int> nodes = node_of_each_rank();
    if (int(nodes.size()) != ranks) nodes.assign(size_t(ranks), 0);  // not MPI_COMM_WORLD's ranks: no node facts
    if (const std::string problem = mesh_locality_problem(shape, nodes); !problem.empty())
        throw std::invalid_argument(problem);
    warning_ = mesh_locality_warning(shape, nodes);
    const int rank = world->rank();
    for (MeshAxes set : needed) {
        const MeshAxes e = effective(set), key = key_of(set);
        if (key == 0 || key == effective(kAllAxes) || by_set_.count(key)) continue;
        std::string name;
        for (auto [axis, label] : {std::pair{MeshAxis::tensor, "tensor"}, std::pair{MeshAxis::shard, "shard"},
                                   std::pair{MeshAxis::replicate, "replica"}, std::pair{MeshAxis::pipeline, "pipeline"}})
            if ((key == e ? e : set) & axes(axis)) name += (name.empty() ? "" : "+") + std::string(label);
        by_set_[key] = split(mesh_group_index(shape, set & kAllAxes, rank), name);
    }
    if (pipeline_ends && shape.pipeline > 1) {
        // Colour: the other coordinates' group (every pipeline's own pair), or none for middle stages.
        const bool end = coords_.pipeline == 0 || coords_.pipeline == shape.pipeline - 1;
        ends_ = split(end ? mesh_group_index(shape, axes(MeshAxis::pipeline), rank) : NCCL_SPLIT_NOCOLOR,
                      "tied-embedding");
    }
}

Mesh::~Mesh() {
    for (auto& [nccl, comm] : splits_) {
        comm.reset();
        if (nccl) ncclCommDestroy(nccl);
    }
}

MeshAxes Mesh::key_of(MeshAxes set) const {
    const MeshAxes e = effective(set);
    const bool own = (set & kOwnComm) && (e == 0 || e == effective(kAllAxes));
    return own ? (set & kAllAxes) | kOwnComm : e;
}

MeshAxes Mesh::effective(MeshAxes set) const {
    MeshAxes e = 0;
    for (MeshAxis a : {MeshAxis::tensor, MeshAxis::shard, MeshAxis::replicate, MeshAxis::pipeline})
        if ((set & axes(a)) && shape_.size(a) > 1) e |= axes(a);
    return e;
}

Comm* Mesh::split(int color, const std::string& name) {
    world_->synchronize();  // the split is collective: nothing of the world may be pending on its stream
    ncclComm_t c = nullptr;
    NCCL_CHECK(ncclCommSplit(world_->nccl(), color, world_->rank(), &c, nullptr));
    if (!c) return nullptr;  // NCCL_SPLIT_NOCOLOR: not a member
    splits_.emplace_back(c, std::make_unique<Comm>(c, name, *world_));
    return splits_.back().second.get();
}

Comm* Mesh::comm(MeshAxes set) const {
    if (!world_) return nullptr;
    const MeshAxes e = effective(set);
    if (const auto own = by_set_.find(key_of(set)); (set & kOwnComm) && own != by_set_.end()) return own->second;
    if (e == effective(kAllAxes)) return world_;  // (a world of one rank too: its own group)
    if (e == 0) return nullptr;
    const auto it = by_set_.find(e);
    if (it == by_set_.end()) throw std::logic_error("Mesh: a communicator of axes not asked for at construction");
    return it->second;
}

std::vector<Comm*> Mesh::comms() const {
    std::vector<Comm*> out;
    if (world_) out.push_back(world_);
    for (const auto& [nccl, comm] : splits_) out.push_back(comm.get());
    return out;
}

}  // namespace pv
