// Planted races: bugs that a GPU shows only as rare wrong answers, and the host tool meant to
// make each show up every time. Each buggy program runs in a hidden test case ("[.planted]")
// that checks its own output with REQUIRE; visible tests start it in a child process under a
// chosen schedule and check whether it failed, or what ThreadSanitizer printed.
//
//   bug                                          caught by
//   a missing barrier between a shared write     random and warp-greedy thread orders (wrong
//     and another thread's read                  output); ThreadSanitizer (report)
//   a reduction missing its trailing barrier,    ThreadSanitizer only
//     right in every order
//   a second stream reading without waiting      deferred streams (wrong output)
//     for the first stream's event
//   a kernel relying on block order              reversed or random block order (wrong output)
//
// Each bug's correct twin passes under the same tool, so no tool reports everything.
#include "test/check.h"

using namespace pv::test;

namespace planted_races {

// Thread t reads what thread t-1 wrote to shared memory. `with_barrier` selects the correct twin.
template <bool with_barrier>
__global__ void shift_right(const float* in, float* out) {
    __shared__ float s[128];
    const int t = threadIdx.x, i = blockIdx.x * blockDim.x + t;
    s[t] = in[i];
    if (with_barrier) __syncthreads();
    out[i] = t > 0 ? s[t - 1] : 0.0f;
}

// A block sum through `partial`, missing the barrier after the partials are read unless
// `trailing_barrier`: a second call overwrites `partial` while slower warps may still read it.
template <bool trailing_barrier>
__device__ float block_sum(float v, float* partial) {
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
    __syncthreads();
    float total = 0.0f;
    for (unsigned w = 0; w < blockDim.x / 32; ++w) total += partial[w];
    if (trailing_barrier) __syncthreads();
    return total;
}

// Sums each block's inputs twice: the second call writes the very values the first one read, so
// the output is right in every order, and only a race checker can tell the barrier is missing.
template <bool trailing_barrier>
__global__ void sum_twice(const float* in, float* out) {
    __shared__ float partial[32];
    const float v = in[blockIdx.x * blockDim.x + threadIdx.x];
    const float a = block_sum<trailing_barrier>(v, partial);
    const float b = block_sum<trailing_barrier>(v, partial);
    if (threadIdx.x == 0) out[blockIdx.x] = a + b;
}

__global__ void add_one(float* x, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += 1.0f;
}

__global__ void double_into(const float* x, float* y, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 2.0f * x[i];
}

__global__ void set_value(float* x, float v, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = v;
}

// Block b adds its input to block b-1's output: right only if blocks run in order, one at a time.
__global__ void chained_prefix(const float* in, float* out) {
    if (threadIdx.x == 0) out[blockIdx.x] = in[blockIdx.x] + (blockIdx.x > 0 ? out[blockIdx.x - 1] : 0.0f);
}

template <bool with_barrier>
void run_shift() {
    const int blocks = 8, threads = 128;
    const auto host = random_vector<float>(size_t(blocks * threads), 31);
    DeviceArray<float> in(host), out(host.size());
    launch(shift_right<with_barrier>, dim3(blocks), dim3(threads), 0, nullptr, in.get(), out.get());
    CUDA_CHECK_LAUNCH();
    const auto got = out.download();
    for (int b = 0; b < blocks; ++b)
        for (int t = 0; t < threads; ++t)
            REQUIRE(got[size_t(b * threads + t)] == (t > 0 ? host[size_t(b * threads + t - 1)] : 0.0f));
}

template <bool trailing_barrier>
void run_sum_twice() {
    const int blocks = 4, threads = 128;
    const auto host = random_vector<float>(size_t(blocks * threads), 32);
    DeviceArray<float> in(host), out{size_t(blocks)};
    launch(sum_twice<trailing_barrier>, dim3(blocks), dim3(threads), 0, nullptr, in.get(), out.get());
    CUDA_CHECK_LAUNCH();
    std::vector<double> ref(size_t(blocks), 0.0);
    for (int i = 0; i < blocks * threads; ++i) ref[size_t(i / threads)] += 2.0 * double(host[size_t(i)]);
    const std::string err = compare(to_double(out.download()), ref, tolerance<float>());
    INFO(err);
    REQUIRE(err.empty());
}

void run_two_streams(bool wait_for_event) {
    const int n = 1024;
    const auto host = random_vector<float>(size_t(n), 33);
    DeviceArray<float> x(host), y{size_t(n)};
    cudaStream_t producer, consumer;
    CUDA_CHECK(cudaStreamCreateWithFlags(&producer, cudaStreamNonBlocking));
    CUDA_CHECK(cudaStreamCreateWithFlags(&consumer, cudaStreamNonBlocking));
    cudaEvent_t produced;
    CUDA_CHECK(cudaEventCreateWithFlags(&produced, cudaEventDisableTiming));
    // Sixteen producer kernels: the consumer runs after all of them in only 1 of 2^17 random
    // interleavings.
    for (int k = 0; k < 16; ++k) launch(add_one, dim3(n / 256), dim3(256), 0, producer, x.get(), n);
    CUDA_CHECK(cudaEventRecord(produced, producer));
    if (wait_for_event) CUDA_CHECK(cudaStreamWaitEvent(consumer, produced, 0));
    launch(double_into, dim3(n / 256), dim3(256), 0, consumer, x.get(), y.get(), n);
    CUDA_CHECK(cudaStreamSynchronize(consumer));
    const auto got = y.download();
    for (int i = 0; i < n; ++i) {
        float expected = host[size_t(i)];
        for (int k = 0; k < 16; ++k) expected += 1.0f;
        REQUIRE(got[size_t(i)] == 2.0f * expected);
    }
    CUDA_CHECK(cudaEventDestroy(produced));
    CUDA_CHECK(cudaStreamDestroy(producer));
    CUDA_CHECK(cudaStreamDestroy(consumer));
}

// A buffer reused while another stream still reads it (ZeRO-2 rotates gradient buffers this
// way): each round the writer fills x, the reader (after an event) copies it out, and the writer
// goes on with other work and then refills x for the next round. Without waiting for the reader
// the refill can overtake the copy — but only if the writer runs far ahead, which a per-item
// random choice of stream almost never does and the bursts mode often does.
void run_reuse(bool wait_for_reader) {
    const int n = 1024, rounds = 20;
    DeviceArray<float> x{size_t(n)}, y{size_t(n) * rounds}, busy(random_vector<float>(size_t(n), 35));
    cudaStream_t writer, reader;
    CUDA_CHECK(cudaStreamCreateWithFlags(&writer, cudaStreamNonBlocking));
    CUDA_CHECK(cudaStreamCreateWithFlags(&reader, cudaStreamNonBlocking));
    cudaEvent_t written, read;
    CUDA_CHECK(cudaEventCreateWithFlags(&written, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&read, cudaEventDisableTiming));
    for (int r = 0; r < rounds; ++r) {
        launch(set_value, dim3(n / 256), dim3(256), 0, writer, x.get(), float(r), n);
        CUDA_CHECK(cudaEventRecord(written, writer));
        CUDA_CHECK(cudaStreamWaitEvent(reader, written, 0));
        launch(double_into, dim3(n / 256), dim3(256), 0, reader, x.get(), y.get() + size_t(r) * n, n);
        CUDA_CHECK(cudaEventRecord(read, reader));
        for (int k = 0; k < 4; ++k) launch(add_one, dim3(n / 256), dim3(256), 0, writer, busy.get(), n);
        if (wait_for_reader) CUDA_CHECK(cudaStreamWaitEvent(writer, read, 0));
    }
    CUDA_CHECK(cudaDeviceSynchronize());
    const auto got = y.download();
    for (int r = 0; r < rounds; ++r)
        for (int i = 0; i < n; ++i) REQUIRE(got[size_t(r) * n + size_t(i)] == 2.0f * float(r));
    CUDA_CHECK(cudaEventDestroy(written));
    CUDA_CHECK(cudaEventDestroy(read));
    CUDA_CHECK(cudaStreamDestroy(writer));
    CUDA_CHECK(cudaStreamDestroy(reader));
}

}  // namespace planted_races

using namespace planted_races;

TEST_CASE("planted: buffer reused before its reader finished", "[.planted]") { run_reuse(false); }
TEST_CASE("planted: buffer reused before its reader finished - fixed", "[.planted]") { run_reuse(true); }

// ---- the programs (hidden; run by name in a child) --------------------------------------------

TEST_CASE("planted: missing barrier", "[.planted]") { run_shift<false>(); }
TEST_CASE("planted: missing barrier - fixed", "[.planted]") { run_shift<true>(); }
TEST_CASE("planted: missing trailing barrier", "[.planted]") { run_sum_twice<false>(); }
TEST_CASE("planted: missing trailing barrier - fixed", "[.planted]") { run_sum_twice<true>(); }
TEST_CASE("planted: missing stream wait", "[.planted]") { run_two_streams(false); }
TEST_CASE("planted: missing stream wait - fixed", "[.planted]") { run_two_streams(true); }

TEST_CASE("planted: block-order dependence", "[.planted]") {
    const int blocks = 64;
    const auto host = random_vector<float>(size_t(blocks), 34);
    DeviceArray<float> in(host), out{size_t(blocks)};
    launch(chained_prefix, dim3(blocks), dim3(32), 0, nullptr, in.get(), out.get());
    CUDA_CHECK_LAUNCH();
    const auto got = out.download();
    float sum = 0.0f;
    for (int b = 0; b < blocks; ++b) REQUIRE(got[size_t(b)] == (sum += host[size_t(b)]));
}

// ---- the checks ---------------------------------------------------------------------------------

namespace {

// A fully specified schedule for a child (one worker, so block order is exactly the order
// given). TSan's reports are off here: these checks are about wrong output.
Environment schedule(const char* threads, const char* blocks, const char* streams, const char* seed = "1") {
    return {{"POLEVAULT_HOST_THREAD_ORDER", threads}, {"POLEVAULT_HOST_BLOCK_ORDER", blocks},
            {"POLEVAULT_HOST_STREAMS", streams},      {"POLEVAULT_HOST_SEED", seed},
            {"POLEVAULT_HOST_WORKERS", "1"},          {"TSAN_OPTIONS", "report_bugs=0"}};
}

// Runs `test` in a child under `env` and returns whether its own checks failed.
bool fails(const char* test, const Environment& env) {
    const ChildResult child = run_in_child(test, env);
    INFO(test << "\n" << child.output);
    REQUIRE_FALSE(child.timed_out);
    if (child.died) REQUIRE(child.output.find(": failed: ") != std::string::npos);  // its REQUIRE, not a crash
    return child.died;
}

}  // namespace

TEST_CASE("a missing barrier: hidden in thread order, wrong under random and warp-greedy orders",
          "[host-only][planted][schedules]") {
    CHECK_FALSE(fails("planted: missing barrier", schedule("in-order", "in-order", "sync")));
    for (const char* seed : {"1", "2", "3"}) {
        CHECK(fails("planted: missing barrier", schedule("random", "in-order", "sync", seed)));
        CHECK(fails("planted: missing barrier", schedule("warp-greedy", "in-order", "sync", seed)));
        CHECK_FALSE(fails("planted: missing barrier - fixed", schedule("random", "random", "sync", seed)));
        CHECK_FALSE(fails("planted: missing barrier - fixed", schedule("warp-greedy", "reverse", "sync", seed)));
    }
}

TEST_CASE("a missing trailing barrier that never changes the output: right in every order",
          "[host-only][planted][schedules]") {
    for (const char* threads : {"in-order", "reverse", "random", "warp-greedy"})
        CHECK_FALSE(fails("planted: missing trailing barrier", schedule(threads, "random", "sync")));
}

TEST_CASE("a missing cudaStreamWaitEvent: hidden by synchronous streams, wrong under deferred streams",
          "[host-only][planted][schedules]") {
    CHECK_FALSE(fails("planted: missing stream wait", schedule("in-order", "in-order", "sync")));
    for (const char* seed : {"1", "2", "3"}) {
        CHECK(fails("planted: missing stream wait", schedule("in-order", "in-order", "deferred", seed)));
        CHECK_FALSE(fails("planted: missing stream wait - fixed", schedule("random", "random", "deferred", seed)));
    }
}

TEST_CASE("a buffer reused before its reader finished: wrong when one stream runs far ahead (bursts)",
          "[host-only][planted][schedules]") {
    CHECK_FALSE(fails("planted: buffer reused before its reader finished", schedule("in-order", "in-order", "sync")));
    for (const char* seed : {"1", "2", "3"}) {
        CHECK(fails("planted: buffer reused before its reader finished",
                    schedule("in-order", "in-order", "bursts", seed)));
        CHECK_FALSE(fails("planted: buffer reused before its reader finished - fixed",
                          schedule("random", "random", "bursts", seed)));
        CHECK_FALSE(fails("planted: buffer reused before its reader finished - fixed",
                          schedule("random", "random", "deferred", seed)));
    }
}

TEST_CASE("a kernel relying on block order: wrong under reversed and random block orders",
          "[host-only][planted][schedules]") {
    CHECK_FALSE(fails("planted: block-order dependence", schedule("in-order", "in-order", "sync")));
    CHECK(fails("planted: block-order dependence", schedule("in-order", "reverse", "sync")));
    CHECK(fails("planted: block-order dependence", schedule("in-order", "random", "sync")));
}

// ---- ThreadSanitizer (make test-tsan) ----------------------------------------------------------

namespace {

ChildResult run_under_tsan(const char* test) {
    return run_in_child(test, {{"POLEVAULT_HOST_THREAD_ORDER", "in-order"},
                               {"POLEVAULT_HOST_STREAMS", "sync"},
                               {"TSAN_OPTIONS", "halt_on_error=0 exitcode=66 history_size=4"}});
}

}  // namespace

TEST_CASE("ThreadSanitizer reports a missing barrier, even in the order that hides it", "[host-only][tsan][planted]") {
    const ChildResult bug = run_under_tsan("planted: missing barrier");
    INFO(bug.output);
    REQUIRE(bug.died);
    REQUIRE(bug.output.find("ThreadSanitizer: data race") != std::string::npos);
    REQUIRE(bug.output.find("shift_right<false>") != std::string::npos);
    REQUIRE(bug.output.find("Passed 1 test case") != std::string::npos);  // the output itself was right

    const ChildResult fixed = run_under_tsan("planted: missing barrier - fixed");
    INFO(fixed.output);
    REQUIRE_FALSE(fixed.died);
    REQUIRE(fixed.output.find("ThreadSanitizer") == std::string::npos);
}

TEST_CASE("ThreadSanitizer reports a missing trailing barrier whose output is always right",
          "[host-only][tsan][planted]") {
    const ChildResult bug = run_under_tsan("planted: missing trailing barrier");
    INFO(bug.output);
    REQUIRE(bug.died);
    REQUIRE(bug.output.find("ThreadSanitizer: data race") != std::string::npos);
    REQUIRE(bug.output.find("block_sum<false>") != std::string::npos);
    REQUIRE(bug.output.find("Passed 1 test case") != std::string::npos);

    const ChildResult fixed = run_under_tsan("planted: missing trailing barrier - fixed");
    INFO(fixed.output);
    REQUIRE_FALSE(fixed.died);
    REQUIRE(fixed.output.find("ThreadSanitizer") == std::string::npos);
}
