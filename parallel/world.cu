// The world of ranks (see world.h).
#include "parallel/world.h"

#include "platform/device_memory.h"

#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace pv {

namespace {

bool mpi_running() {
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    return initialized && !finalized;
}

void mpi_check(int result, const char* what) {
    if (result != MPI_SUCCESS) abort_all_ranks(std::string("MPI call failed: ") + what);
}

}  // namespace

std::string gpu_sharing_problem(int local_ranks, int devices) {
    if (devices < 1) return "no CUDA device visible: run on a machine with a GPU (check CUDA_VISIBLE_DEVICES)";
    if (local_ranks <= devices) return "";
    return std::to_string(local_ranks) + " ranks run on this node but it has " + std::to_string(devices) +
           " GPU(s) visible: each rank needs a GPU of its own (NCCL refuses two ranks on one device); start at most " +
           std::to_string(devices) + " rank(s) per node (mpirun -np, or --map-by ppr:" + std::to_string(devices) +
           ":node) or make more GPUs visible (CUDA_VISIBLE_DEVICES)";
}

bool launched_as_rank() {
    for (const char* variable : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"})
        if (std::getenv(variable)) return true;
    return false;
}

void abort_all_ranks(const std::string& message) {
    int rank = 0, size = 1;
    const bool running = mpi_running();
    if (running) MPI_Comm_rank(MPI_COMM_WORLD, &rank), MPI_Comm_size(MPI_COMM_WORLD, &size);
    std::fflush(stdout);
    if (size > 1)
        std::fprintf(stderr, "rank %d/%d: %s\n", rank, size, message.c_str());
    else
        std::fprintf(stderr, "%s\n", message.c_str());
    std::fflush(stderr);
    if (running && size > 1) MPI_Abort(MPI_COMM_WORLD, 1);
    std::_Exit(1);
}

World::World(int* argc, char*** argv) {
    if (!mpi_running() && launched_as_rank()) {
        int provided = 0;
        mpi_check(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
        owns_mpi_ = true;
    }
    const bool mpi = mpi_running();  // else a world of one (rank 0 of 1, alone on its node)
    int local_ranks = 1;
    if (mpi) {
        mpi_check(MPI_Comm_rank(MPI_COMM_WORLD, &rank_), "MPI_Comm_rank");
        mpi_check(MPI_Comm_size(MPI_COMM_WORLD, &size_), "MPI_Comm_size");
        MPI_Comm node;
        mpi_check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node),
                  "MPI_Comm_split_type");
        mpi_check(MPI_Comm_rank(node, &local_rank_), "MPI_Comm_rank");
        mpi_check(MPI_Comm_size(node, &local_ranks), "MPI_Comm_size");
        MPI_Comm_free(&node);
    }
    int devices = 0;
    CUDA_CHECK(cudaGetDeviceCount(&devices));
    if (const std::string problem = gpu_sharing_problem(local_ranks, devices); !problem.empty())
        abort_all_ranks(problem);
    device_ = local_rank_;
    CUDA_CHECK(cudaSetDevice(device_));
    ncclUniqueId id;
    if (rank_ == 0) NCCL_CHECK(ncclGetUniqueId(&id));
    if (mpi) mpi_check(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD), "MPI_Bcast of the NCCL id");
    NCCL_CHECK(ncclCommInitRank(&nccl_, size_, id, rank_));
    comm_ = std::make_unique<Comm>(nccl_, "world");
}

void World::watch_collectives(double timeout_seconds) {
    if (size_ > 1 && !watchdog_) watchdog_ = std::make_unique<CollectiveWatchdog>(timeout_seconds);
}

std::vector<std::string> World::all_texts(const std::string& mine) {
    if (size_ == 1) return {mine};
    // Collectives of the world's communicator, not MPI calls: a rank that never arrives (it failed,
    // or stalls loading) is named by the collective watchdog within --collective-timeout, as in
    // training. Every rank's length first, then each text padded to the longest, as int32 words.
    Comm& c = *comm_;
    const cudaStream_t s = c.stream();
    const size_t n = size_t(size_);
    std::vector<long long> lengths(n);
    const long long length = (long long)mine.size();
    DeviceBuffer<long long> my_length(1, MemoryCategory::comm_buffers), all_lengths(n, MemoryCategory::comm_buffers);
    CUDA_CHECK(cudaMemcpyAsync(my_length.get(), &length, sizeof length, cudaMemcpyHostToDevice, s));
    c.all_gather(my_length.get(), all_lengths.get(), 1);
    wait_polling(s, {&c});
    CUDA_CHECK(cudaMemcpyAsync(lengths.data(), all_lengths.get(), n * sizeof(long long), cudaMemcpyDeviceToHost, s));
    CUDA_CHECK(cudaStreamSynchronize(s));
    long long longest = 0;
    for (long long l : lengths) longest = std::max(longest, l);
    const size_t words = size_t(longest + 3) / 4;
    std::vector<int> packed(words, 0), gathered(words * n);
    std::memcpy(packed.data(), mine.data(), mine.size());
    DeviceBuffer<int> send(std::max<size_t>(words, 1), MemoryCategory::comm_buffers),
        recv(std::max<size_t>(words * n, 1), MemoryCategory::comm_buffers);
    CUDA_CHECK(cudaMemcpyAsync(send.get(), packed.data(), words * sizeof(int), cudaMemcpyHostToDevice, s));
    c.all_gather(send.get(), recv.get(), words);
    wait_polling(s, {&c});
    CUDA_CHECK(cudaMemcpyAsync(gathered.data(), recv.get(), words * n * sizeof(int), cudaMemcpyDeviceToHost, s));
    CUDA_CHECK(cudaStreamSynchronize(s));
    std::vector<std::string> texts;
    for (size_t r = 0; r < n; ++r)
        texts.emplace_back(reinterpret_cast<const char*>(gathered.data() + r * words), size_t(lengths[r]));
    return texts;
}

World::~World() {
    watchdog_.reset();
    comm_.reset();
    if (nccl_) ncclCommDestroy(nccl_);
    if (owns_mpi_ && mpi_running()) MPI_Finalize();
}

}  // namespace pv
