// Hybrid sharding's communicators (see shard_groups.h).
#include "parallel/shard_groups.h"

#include <stdexcept>
#include <string>

namespace pv {

ShardGroups::ShardGroups(Comm& world, int group) {
    const int n = world.size(), r = world.rank();
    if (group < 1 || group >= n || n % group != 0)
        throw std::invalid_argument("shard groups of " + std::to_string(group) + " ranks cannot tile " +
                                    std::to_string(n) + " ranks");
    world.synchronize();  // the split is collective: nothing of the world may be pending on its stream
    NCCL_CHECK(ncclCommSplit(world.nccl(), r / group, r, &shard_nccl_, nullptr));
    NCCL_CHECK(ncclCommSplit(world.nccl(), r % group, r, &replica_nccl_, nullptr));
    shard_ = std::make_unique<Comm>(shard_nccl_, "shard", world);
    replica_ = std::make_unique<Comm>(replica_nccl_, "replica", world);
}

ShardGroups::~ShardGroups() {
    shard_.reset();
    replica_.reset();
    if (shard_nccl_) ncclCommDestroy(shard_nccl_);
    if (replica_nccl_) ncclCommDestroy(replica_nccl_);
}

}  // namespace pv
