// Hybrid sharding's communicators (FSDP's HSDP; `--shard-group K`, parallel/plan.h). The N ranks
// form N/K shard groups of K consecutive ranks: group j is ranks [j·K, (j+1)·K). Parameters,
// gradients and optimizer state are sharded over the K ranks of a group exactly as ZeRO shards them
// over the world, and every group holds the same shards (a replica of the others):
//   shard comm    the K ranks of this rank's group, in rank order (color rank / K): the reduce-
//                 scatters, all-gathers and the gradient norm's sum run here;
//   replica comm  the N/K ranks holding the same shard, one per group (color rank mod K): the
//                 group-reduced gradient slices are all-reduced here, once per step.
// Both are split off the world communicator (ncclCommSplit, collective over the world) and run on
// the world Comm's stream, so every collective of a rank is issued and run in one order — NCCL's
// rule for communicators sharing ranks — and a strategy's fences cover all of them.
// K = N needs no split (the world is the one group); K = 1 has groups of one (replication: the
// replica all-reduce is DDP's).
#pragma once

#include "parallel/comm.h"

#include <memory>

namespace pv {

class ShardGroups {
  public:
    // Collective over `world`: every rank constructs it with the same `group` (1 ≤ group < N,
    // dividing N; parallel/plan.h checks the options).
    ShardGroups(Comm& world, int group);
    ~ShardGroups();
    ShardGroups(const ShardGroups&) = delete;
    ShardGroups& operator=(const ShardGroups&) = delete;

    Comm& shard() { return *shard_; }
    Comm& replica() { return *replica_; }

  private:
    ncclComm_t shard_nccl_ = nullptr, replica_nccl_ = nullptr;
    std::unique_ptr<Comm> shard_, replica_;
};

}  // namespace pv
