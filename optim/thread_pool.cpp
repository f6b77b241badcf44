// A small pool of host threads (see optim/thread_pool.h).
#include "optim/thread_pool.h"
#include "platform/cpu_cores.h"

#include <algorithm>
#include <cstdlib>

namespace pv {

ThreadPool::ThreadPool(int threads) {
    for (int k = 1; k < threads; ++k) workers_.emplace_back([this] { work(); });
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
