// Kernel launch on the host: the configuration checks a GPU makes, per-kernel attributes
// (cudaFuncSetAttribute), and a pool of worker threads that share a grid's blocks.
//
// Worker count: POLEVAULT_HOST_WORKERS if set; otherwise the machine's cores divided among the
// ranks on this node (Open MPI's OMPI_COMM_WORLD_LOCAL_SIZE), at least one. The launching thread
// is one of the workers, so with one worker a launch never leaves the calling thread.
#include "host/access_meter.h"
#include "host/block_runner.h"
#include "host/device_profile.h"
#include "host/schedule.h"
#include "host/stream.h"
#include "platform/cpu_cores.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

namespace pv::host {
namespace {

// Dynamic shared memory each kernel may use: 48 KiB unless raised with
// cudaFuncAttributeMaxDynamicSharedMemorySize (up to the opt-in limit), as on the device.
std::mutex attributes_mutex;
std::map<const void*, int> max_dynamic_smem;

int dynamic_smem_limit(const void* kernel) {
    std::lock_guard lock(attributes_mutex);
    auto it = max_dynamic_smem.find(kernel);
    // Never past the device's opt-in limit, which a test may lower after raising a kernel's.
    return it == max_dynamic_smem.end() ? kSharedMemPerBlock : std::min(it->second, shared_mem_per_block_optin());
}

// A bad grid or block is cudaErrorInvalidValue, not the cudaErrorInvalidConfiguration the host
// platform first assumed: measured on an H100 with CUDA 13.0 (driver 580) for every case of
// test_kernels_platform's launch-configuration test (too many threads, a z extent over 64, an
// empty grid, grid y over 65535).
cudaError_t check_configuration(const KernelLaunch& k) {
    if (!k.kernel) return cudaErrorInvalidDeviceFunction;
    const dim3 b = k.block, g = k.grid;
    if (b.x == 0 || b.y == 0 || b.z == 0 || b.x > unsigned(kMaxBlockDim[0]) || b.y > unsigned(kMaxBlockDim[1]) ||
        b.z > unsigned(kMaxBlockDim[2]) || size_t(b.x) * b.y * b.z > size_t(kMaxThreadsPerBlock))
        return cudaErrorInvalidValue;
    if (g.x == 0 || g.y == 0 || g.z == 0 || g.x > unsigned(kMaxGridDim[0]) || g.y > unsigned(kMaxGridDim[1]) ||
        g.z > unsigned(kMaxGridDim[2]))
        return cudaErrorInvalidValue;
    if (k.smem_bytes > size_t(dynamic_smem_limit(k.kernel))) return cudaErrorInvalidValue;
    return cudaSuccess;
}

uint3 block_index(const KernelLaunch& k, size_t linear) {
    const size_t gx = k.grid.x, gy = k.grid.y;
    return uint3{unsigned(linear % gx), unsigned((linear / gx) % gy), unsigned(linear / (gx * gy))};
}

// The order in which a grid's blocks are taken: the i-th block taken is order[i] (or i itself
// when in order, without building the table).
class BlockSequence {
  public:
    BlockSequence(const KernelLaunch& k, size_t blocks) : blocks_(blocks), order_(schedule().blocks) {
        if (order_ == BlockOrder::random) {
            perm_.resize(blocks);
            for (size_t i = 0; i < blocks; ++i) perm_[i] = i;
            Rng rng(mix_seed(schedule().seed, k.sequence, ~uint64_t(0)));
            shuffle(perm_.data(), blocks, rng);
        }
    }
    size_t operator[](size_t i) const {
        switch (order_) {
            case BlockOrder::reverse: return blocks_ - 1 - i;
            case BlockOrder::random: return perm_[i];
            default: return i;
        }
    }

  private:
    size_t blocks_;
    BlockOrder order_;
    std::vector<size_t> perm_;
};

void run_block_at(const KernelLaunch& k, const BlockSequence& order, size_t i) {
    const size_t linear = order[i];
    run_block(k, block_index(k, linear), linear);
}

// Workers wait for a grid, take block indices from a shared counter until none are left, and
// report back. One grid runs at a time.
class WorkerPool {
  public:
    explicit WorkerPool(size_t workers) {
        for (size_t i = 1; i < workers; ++i) threads_.emplace_back([this] { work(); });
    }
    ~WorkerPool() {
        {
            std::lock_guard lock(mutex_);
            stopping_ = true;
        }
        wake_.notify_all();
        for (auto& t : threads_) t.join();
    }

    void run_grid(const KernelLaunch& k) {
        std::lock_guard one_grid_at_a_time(grid_mutex_);
        const size_t blocks = size_t(k.grid.x) * k.grid.y * k.grid.z;
        const BlockSequence order(k, blocks);
        if (threads_.empty() || blocks == 1) {
            for (size_t i = 0; i < blocks; ++i) run_block_at(k, order, i);
            return;
        }
        {
            std::lock_guard lock(mutex_);
            grid_ = &k;
            order_ = &order;
            blocks_ = blocks;
            next_block_ = 0;
            busy_workers_ = threads_.size();
            ++generation_;
        }
        wake_.notify_all();
        take_blocks(k, order, blocks);
        std::unique_lock lock(mutex_);
        done_.wait(lock, [this] { return busy_workers_ == 0; });
        grid_ = nullptr;
        order_ = nullptr;
    }

  private:
    void take_blocks(const KernelLaunch& k, const BlockSequence& order, size_t blocks) {
        for (size_t i; (i = next_block_.fetch_add(1)) < blocks;) run_block_at(k, order, i);
    }

    void work() {
        uint64_t seen = 0;
        for (;;) {
            const KernelLaunch* k;
            const BlockSequence* order;
            size_t blocks;
            {
                std::unique_lock lock(mutex_);
                wake_.wait(lock, [&] { return stopping_ || generation_ != seen; });
                if (stopping_) return;
                seen = generation_;
                k = grid_;
                order = order_;
                blocks = blocks_;
            }
            take_blocks(*k, *order, blocks);
            {
                std::lock_guard lock(mutex_);
                --busy_workers_;
            }
            done_.notify_all();
        }
    }

    std::vector<std::thread> threads_;
    std::mutex grid_mutex_, mutex_;
    std::condition_variable wake_, done_;
    const KernelLaunch* grid_ = nullptr;
    const BlockSequence* order_ = nullptr;
    size_t blocks_ = 0, busy_workers_ = 0;
    std::atomic<size_t> next_block_{0};
    uint64_t generation_ = 0;
    bool stopping_ = false;
};

WorkerPool& pool() {
    static WorkerPool p(size_t(cpu_cores_per_rank("POLEVAULT_HOST_WORKERS")));
    return p;
}

}  // namespace

void launch_kernel(KernelLaunch launch, cudaStream_t stream) {
    if (const cudaError_t e = check_configuration(launch); e != cudaSuccess) {
        set_last_error(e);
        return;
    }
    if (!stream_is_valid(stream)) {
        set_last_error(cudaErrorInvalidResourceHandle);
        return;
    }
    static std::atomic<uint64_t> launches{0};
    launch.sequence = launches.fetch_add(1);
    const cudaError_t e = stream_submit(stream, [k = std::move(launch)] {
        access_meter_launch_begin();
        pool().run_grid(k);
        access_meter_launch_end(k.kernel);
    });
    if (e != cudaSuccess) set_last_error(e);
}

}  // namespace pv::host

extern "C" cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
    using namespace pv::host;
    if (!func) return set_last_error(cudaErrorInvalidDeviceFunction);
    switch (attr) {
        case cudaFuncAttributeMaxDynamicSharedMemorySize:
            if (value < 0 || value > shared_mem_per_block_optin()) return set_last_error(cudaErrorInvalidValue);
            {
                std::lock_guard lock(attributes_mutex);
                max_dynamic_smem[func] = value;
            }
            return cudaSuccess;
        case cudaFuncAttributePreferredSharedMemoryCarveout:
            if (value < -1 || value > 100) return set_last_error(cudaErrorInvalidValue);
            return cudaSuccess;
        default: return set_last_error(cudaErrorInvalidValue);
    }
}
