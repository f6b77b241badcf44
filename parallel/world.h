// The world of ranks (DESIGN.md §2): MPI start-up, each rank's device, the NCCL communicator of all
// ranks, and the rule that an error on any rank ends every rank.
//
// Start-up follows llm.c: MPI_Init, rank and size from MPI_COMM_WORLD, the local rank from the
// ranks sharing this node (MPI_COMM_TYPE_SHARED), device = local rank modulo the device count
// (cudaSetDevice), rank 0's ncclGetUniqueId broadcast with MPI_Bcast, ncclCommInitRank.
// MPI is initialised here only if nobody did it before (a test harness may have), and finalised
// only by whoever initialised it. A process no launcher started (a plain `./train`, no mpirun,
// srun or mpiexec: launched_as_rank) is a world of one without MPI: rank 0 of 1 on device 0 with
// a one-rank NCCL communicator. Open MPI would start it as a singleton, spawning its runtime
// daemon first (0.38 s of every such run on the development VM) for a world that needs none of it.
//
// Failure. A failed assertion or error on one rank must end every rank within seconds, never a
// hang where the others wait in a collective: abort_all_ranks prints the message with the rank
// and calls MPI_Abort, which makes mpirun kill the job. On a world of one it just exits non-zero.
// A rank that stalls — never arrives at a collective — is found by the watchdog of
// parallel/collective_watch.h (watch_collectives); MPI is started with MPI_THREAD_MULTIPLE for
// it, its thread talking MPI while the main thread may be inside the host NCCL's MPI calls.
#pragma once

#include "parallel/comm.h"

#include <memory>
#include <string>
#include <vector>

namespace pv {

class World {
  public:
    // Starts MPI (unless already started), picks the device, creates the communicator of all ranks.
    World(int* argc, char*** argv);
    ~World();
    World(const World&) = delete;
    World& operator=(const World&) = delete;

    int rank() const { return rank_; }
    int size() const { return size_; }
    int local_rank() const { return local_rank_; }
    int device() const { return device_; }
    Comm& comm() { return *comm_; }

    // Every rank ends once one has waited `timeout_seconds` in a collective (--collective-timeout):
    // starts the watchdog thread (collective over the world). A world of one has no collectives:
    // nothing to watch.
    void watch_collectives(double timeout_seconds);

    // Every rank's `mine`, in rank order, on every rank (two all-gathers of the world's
    // communicator, watched like any collective): for what the ranks must agree on before the
    // first step (trainer/rank_agreement.h).
    std::vector<std::string> all_texts(const std::string& mine);

  private:
    int rank_ = 0, size_ = 1, local_rank_ = 0, device_ = 0;
    bool owns_mpi_ = false;
    ncclComm_t nccl_ = nullptr;
    std::unique_ptr<Comm> comm_;
    std::unique_ptr<CollectiveWatchdog> watchdog_;
};

// Whether a launcher started this process as a rank of a job (its environment says so: Open MPI's
// mpirun and PMIx launchers, MPICH's and Slurm's PMI): such a process starts MPI.
bool launched_as_rank();

// Empty when `local_ranks` ranks of one node can each have a GPU of their own among `devices`
// visible ones; otherwise the error to stop with, naming the fix. Two ranks on one GPU would
// share its memory and NCCL refuses a communicator with two ranks on one device.
std::string gpu_sharing_problem(int local_ranks, int devices);

// Prints "rank R/N: message" to stderr and ends every rank (MPI_Abort), or exits with status 1
// when MPI is not running or the world has one rank.
[[noreturn]] void abort_all_ranks(const std::string& message);

}  // namespace pv
