// A small pool of host threads (see optim/thread_pool.h).
#include "optim/thread_pool.h"
#include "platform/cpu_cores.h"

#include <algorithm>
#include <cstdlib>

#include <pthread.h>
#include <sched.h>

namespace pv {

bool bind_current_thread(const std::vector<int>& cpus) {
    if (cpus.empty()) return false;
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int c : cpus)
        if (c >= 0 && c < CPU_SETSIZE) CPU_SET(c, &set);
    return pthread_setaffinity_np(pthread_self(), sizeof set, &set) == 0;
}

std::vector<int> current_thread_cpus() {
    cpu_set_t set;
    CPU_ZERO(&set);
    std::vector<int> out;
    if (pthread_getaffinity_np(pthread_self(), sizeof set, &set) != 0) return out;
    for (int c = 0; c < CPU_SETSIZE; ++c)
        if (CPU_ISSET(c, &set)) out.push_back(c);
    return out;
}

ScopedAffinity::ScopedAffinity(const std::vector<int>& cpus) {
    if (cpus.empty()) return;
    previous_ = current_thread_cpus();
    ok_ = changed_ = bind_current_thread(cpus);
}

ScopedAffinity::~ScopedAffinity() {
    if (changed_) bind_current_thread(previous_);
}

ThreadPool::ThreadPool(int threads, std::vector<int> cpus) : cpus_(std::move(cpus)) {
    for (int k = 1; k < threads; ++k)
        workers_.emplace_back([this] {
            if (bind_current_thread(cpus_)) ++bound_workers_;
            ++started_;
            work();
        });
    // Every worker has tried its binding before the pool is used (bound() is then final).
    while (started_.load() < int(workers_.size())) std::this_thread::yield();
}

ThreadPool::~ThreadPool() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stop_ = true;
    }
    wake_.notify_all();
    for (std::thread& t : workers_) t.join();
}

bool ThreadPool::take(unsigned long long generation, size_t* i) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!job_ || generation != generation_ || next_ >= count_) return false;  // a later job is not ours
    *i = next_++;
    return true;
}

void ThreadPool::finish_one() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (++finished_ == count_) done_.notify_all();
}

void ThreadPool::work() {
    unsigned long long seen = 0;
    for (;;) {
        const std::function<void(size_t)>* job = nullptr;
        {
            std::unique_lock<std::mutex> lock(mutex_);
            wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
            if (stop_) return;
            seen = generation_;
            job = job_;
        }
        for (size_t i; take(seen, &i);) {
            try {
                (*job)(i);
            } catch (...) {
                std::lock_guard<std::mutex> lock(mutex_);
                if (!error_) error_ = std::current_exception();
            }
            finish_one();
        }
    }
}

void ThreadPool::run(size_t n, const std::function<void(size_t)>& f) {
    if (n == 0) return;
    if (workers_.empty() || n == 1) {
        for (size_t i = 0; i < n; ++i) f(i);
        return;
    }
    unsigned long long generation = 0;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        job_ = &f;
        next_ = 0, count_ = n, finished_ = 0;
        error_ = nullptr;
        generation = ++generation_;
    }
    wake_.notify_all();
    for (size_t i; take(generation, &i);) {  // the caller works too
        try {
            f(i);
        } catch (...) {
            std::lock_guard<std::mutex> lock(mutex_);
            if (!error_) error_ = std::current_exception();
        }
        finish_one();
    }
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return finished_ == count_; });
    job_ = nullptr;
    if (error_) std::rethrow_exception(error_);
}

int cpu_threads_per_rank() { return cpu_cores_per_rank("POLEVAULT_CPU_THREADS"); }

}  // namespace pv
