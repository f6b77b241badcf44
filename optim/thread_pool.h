// A small pool of host threads for CPU work the trainer does beside the device: the offloaded
// AdamW update (optim/adamw_cpu.h). Product code cannot use the host backend's block workers
// (host/launch.cpp), which exist only on the CPU platform, nor OpenMP (not in the CUDA build's
// flags), so it is std::thread: the threads start once and sleep on a condition variable between
// jobs. run(n, f) calls f(0) … f(n − 1), spread over the pool and the calling thread, and returns
// when all have run; the index-to-thread assignment varies, so f(i) must depend on i alone. A pool
// may be bound to a set of CPUs (optim/host_placement.h: those of the GPU's memory node): each
// worker restricts itself to them when it starts, and ScopedAffinity does the same for the calling
// thread while it works beside them.
#pragma once

#include <atomic>
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
    // `threads` in all, the caller included (1: everything runs on the caller); `cpus` non-empty:
    // the workers run on those CPUs only.
    explicit ThreadPool(int threads, std::vector<int> cpus = {});
    ~ThreadPool();
    ThreadPool(const ThreadPool&) = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;

    int threads() const { return int(workers_.size()) + 1; }
    const std::vector<int>& cpus() const { return cpus_; }
    // Every worker runs on cpus() (false when unbound, or the system refused a binding).
    bool bound() const { return !cpus_.empty() && bound_workers_.load() == int(workers_.size()); }
    // f(i) for every i < n; rethrows the first exception any call threw.
    void run(size_t n, const std::function<void(size_t)>& f);

  private:
    void work();
    bool take(unsigned long long generation, size_t* i);  // the next index of that job; false: none left
    void finish_one();

    std::vector<int> cpus_;
    std::atomic<int> bound_workers_{0};
    std::atomic<int> started_{0};
    std::vector<std::thread> workers_;
    std::mutex mutex_;
    std::condition_variable wake_, done_;
    const std::function<void(size_t)>* job_ = nullptr;
    size_t next_ = 0, count_ = 0, finished_ = 0;
    unsigned long long generation_ = 0;
    bool stop_ = false;
    std::exception_ptr error_;
};

// Restricts the calling thread to `cpus` (all of them; nothing when empty) until destroyed, then
// restores what it had. ok() says whether the system took it.
class ScopedAffinity {
  public:
    explicit ScopedAffinity(const std::vector<int>& cpus);
    ~ScopedAffinity();
    ScopedAffinity(const ScopedAffinity&) = delete;
    ScopedAffinity& operator=(const ScopedAffinity&) = delete;
    bool ok() const { return ok_; }

  private:
    bool changed_ = false, ok_ = false;
    std::vector<int> previous_;
};

// Binds the calling thread to `cpus` (all of them); false when the system refuses or cpus is empty.
bool bind_current_thread(const std::vector<int>& cpus);
// The CPUs the calling thread may run on.
std::vector<int> current_thread_cpus();

// Threads for CPU work on this rank: the machine's cores shared among the ranks of this node
// (Open MPI's OMPI_COMM_WORLD_LOCAL_SIZE), at least 1; POLEVAULT_CPU_THREADS overrides it.
int cpu_threads_per_rank();

}  // namespace pv
