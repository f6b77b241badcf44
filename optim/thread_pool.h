// A small pool of host threads for CPU work the trainer does beside the device: the offloaded
// AdamW update (optim/adamw_cpu.h). Product code cannot use the host backend's block workers
// (host/launch.cpp), which exist only on the CPU platform, nor OpenMP (not in the CUDA build's
// flags), so it is std::thread: the threads start once and sleep on a condition variable between
// jobs. run(n, f) calls f(0) … f(n − 1), spread over the pool and the calling thread, and returns
// when all have run; the index-to-thread assignment varies, so f(i) must depend on i alone.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace pv {

class ThreadPool {
  public:
    // `threads` in all, the caller included (1: everything runs on the caller).
    explicit ThreadPool(int threads);
    ~ThreadPool();
    ThreadPool(const ThreadPool&) = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;

    int threads() const { return int(workers_.size()) + 1; }
    // f(i) for every i < n; rethrows the first exception any call threw.
    void run(size_t n, const std::function<void(size_t)>& f);

  private:
    void work();
    bool take(unsigned long long generation, size_t* i);  // the next index of that job; false: none left
    void finish_one();

    std::vector<std::thread> workers_;
    std::mutex mutex_;
    std::condition_variable wake_, done_;
    const std::function<void(size_t)>* job_ = nullptr;
    size_t next_ = 0, count_ = 0, finished_ = 0;
    unsigned long long generation_ = 0;
    bool stop_ = false;
    std::exception_ptr error_;
};

// Threads for CPU work on this rank: the machine's cores shared among the ranks of this node
// (Open MPI's OMPI_COMM_WORLD_LOCAL_SIZE), at least 1; POLEVAULT_CPU_THREADS overrides it.
int cpu_threads_per_rank();

}  // namespace pv
