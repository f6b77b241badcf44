// The mesh's shape: coordinates, groups, the printed layout and the node checks (mesh_shape.h).
#include "parallel/mesh_shape.h"

#include <algorithm>
#include <stdexcept>

namespace pv {

namespace {

// Innermost first: the order of rank = ((pipeline·R + replicate)·S + shard)·T + tensor.
constexpr MeshAxis kOrder[] = {MeshAxis::tensor, MeshAxis::shard, MeshAxis::replicate, MeshAxis::pipeline};

const char* axis_name(MeshAxis a) {
    switch (a) {
        case MeshAxis::tensor: return "tensor";
        case MeshAxis::shard: return "dp-shard";
        case MeshAxis::replicate: return "dp-replicate";
        case MeshAxis::pipeline: return "pipeline";
    }
    return "?";
}

}  // namespace

int MeshShape::size(MeshAxis a) const {
    switch (a) {
        case MeshAxis::tensor: return tensor;
        case MeshAxis::shard: return shard;
        case MeshAxis::replicate: return replicate;
        case MeshAxis::pipeline: return pipeline;
    }
    return 1;
}

int MeshShape::size(MeshAxes set) const {
    int n = 1;
    for (MeshAxis a : kOrder)
        if (set & axes(a)) n *= size(a);
    return n;
}

int MeshCoords::of(MeshAxis a) const {
    switch (a) {
        case MeshAxis::tensor: return tensor;
        case MeshAxis::shard: return shard;
        case MeshAxis::replicate: return replicate;
        case MeshAxis::pipeline: return pipeline;
    }
    return 0;
}

MeshCoords mesh_coords(const MeshShape& shape, int rank) {
    if (rank < 0 || rank >= shape.ranks())
        throw std::out_of_range("rank " + std::to_string(rank) + " is outside a mesh of " +
                                std::to_string(shape.ranks()) + " ranks");
    MeshCoords c;
    c.tensor = rank % shape.tensor, rank /= shape.tensor;
    c.shard = rank % shape.shard, rank /= shape.shard;
    c.replicate = rank % shape.replicate, rank /= shape.replicate;
    c.pipeline = rank;
    return c;
}

int mesh_rank(const MeshShape& shape, const MeshCoords& c) {
    return ((c.pipeline * shape.replicate + c.replicate) * shape.shard + c.shard) * shape.tensor + c.tensor;
}

// Mixed-radix numbers over the axes in `set` (or not in it), innermost fastest.
static int index_over(const MeshShape& shape, const MeshCoords& c, MeshAxes set) {
    int index = 0, scale = 1;
    for (MeshAxis a : kOrder)
        if (set & axes(a)) index += c.of(a) * scale, scale *= shape.size(a);
    return index;
}

int mesh_group_rank(const MeshShape& shape, MeshAxes set, int rank) {
    return index_over(shape, mesh_coords(shape, rank), set);
}

int mesh_group_index(const MeshShape& shape, MeshAxes set, int rank) {
    return index_over(shape, mesh_coords(shape, rank), kAllAxes & ~set);
}

std::string describe_mesh(const MeshShape& s) {
    std::string out;
    for (int i = 3; i >= 0; --i)
        out += std::string(axis_name(kOrder[i])) + " " + std::to_string(s.size(kOrder[i])) + (i > 0 ? " × " : "");
    out += " = " + std::to_string(s.ranks()) + " rank" + (s.ranks() == 1 ? "" : "s");
    out += "; rank = ((pipeline·" + std::to_string(s.replicate) + " + replicate)·" + std::to_string(s.shard) +
           " + shard)·" + std::to_string(s.tensor) + " + tensor";
    return out;
}

std::string draw_mesh(const MeshShape& s) {
    std::string out;
    for (int p = 0; p < s.pipeline; ++p) {
        out += s.pipeline > 1 ? "stage " + std::to_string(p) + ":" : "ranks:";
        for (int r = 0; r < s.replicate; ++r) {
            out += " [";
            for (int d = 0; d < s.shard; ++d) {
                if (d > 0) out += " ";
                if (s.tensor > 1) out += "(";
                for (int t = 0; t < s.tensor; ++t)
                    out += (t > 0 ? " " : "") + std::to_string(mesh_rank(s, MeshCoords{p, r, d, t}));
                if (s.tensor > 1) out += ")";
            }
            out += "]";
        }
        out += "\n";
    }
    out += "(each [ ] a dp-shard group of " + std::to_string(s.shard) + ", side by side its " +
           std::to_string(s.replicate) + " replica(s)";
    if (s.tensor > 1) out += ", each ( ) a tensor group of " + std::to_string(s.tensor);
    if (s.pipeline > 1) out += "; one line per pipeline stage";
    return out + ")\n";
}

// The first group of `set` whose ranks are on more than one node, as "ranks a and b"; empty if none.
static std::string crossing_group(const MeshShape& shape, MeshAxes set, const std::vector<int>& node_of_rank) {
    if (int(node_of_rank.size()) != shape.ranks())
        throw std::logic_error("mesh: " + std::to_string(node_of_rank.size()) + " node numbers for " +
                               std::to_string(shape.ranks()) + " ranks");
    std::vector<int> first(size_t(shape.ranks()), -1);  // per group: its first rank seen
    for (int r = 0; r < shape.ranks(); ++r) {
        int& f = first[size_t(mesh_group_index(shape, set, r))];
        if (f < 0) f = r;
        if (node_of_rank[size_t(f)] != node_of_rank[size_t(r)])
            return "ranks " + std::to_string(f) + " and " + std::to_string(r);
    }
    return "";
}

std::string mesh_locality_problem(const MeshShape& shape, const std::vector<int>& node_of_rank) {
    const std::string where = crossing_group(shape, axes(MeshAxis::tensor), node_of_rank);
    if (where.empty()) return "";
    return "a tensor-parallel group of " + std::to_string(shape.tensor) + " ranks spans two nodes (" + where +
           "): its all-reduces per matrix need the node's own links; start the same number of ranks on every node, "
           "a multiple of " + std::to_string(shape.tensor) + " (mpirun --map-by ppr:N:node)";
}

std::string mesh_locality_warning(const MeshShape& shape, const std::vector<int>& node_of_rank) {
    if (shape.replicate == 1 || shape.shard == 1) return "";
    const std::string where = crossing_group(shape, axes(MeshAxis::shard), node_of_rank);
    if (where.empty()) return "";
    return "hybrid sharding's shard groups of " + std::to_string(shape.shard) + " span nodes (" + where +
           "): their gathers and reduce-scatters per unit run between nodes; a --shard-group that divides the ranks "
           "per node keeps them inside one";
}

}  // namespace pv
