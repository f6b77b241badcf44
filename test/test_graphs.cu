// CUDA graphs by stream capture: work captured is recorded, not run; a launch runs it as often as
// asked, reading memory as it is then; streams fork from and join back into a capture through
// events; and what CUDA forbids during a capture is refused, the capture then ending without a
// graph. Written for both backends; [host-only] cases check where the emulation is stricter
// than CUDA or where CUDA's own answer is not pinned down by its documentation.
#include "test/check.h"

#include <cmath>
#include <functional>
#include <thread>

using namespace pv::test;

namespace graphs_test {

// x[i] = x[i] * a + b: each node's result depends on the order it ran in.
__global__ void scale_add(float* x, int n, float a, float b) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = x[i] * a + b;
}

// y[i] += x[i].
__global__ void add_into(const float* x, float* y, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += x[i];
}

constexpr int kN = 300;

void scale_add_on(cudaStream_t s, float* x, float a, float b) {
    launch(scale_add, dim3((kN + 127) / 128), dim3(128), 0, s, x, kN, a, b);
    CUDA_CHECK_LAUNCH();
}

void add_into_on(cudaStream_t s, const float* x, float* y) {
    launch(add_into, dim3((kN + 127) / 128), dim3(128), 0, s, x, y, kN);
    CUDA_CHECK_LAUNCH();
}

struct Stream {
    cudaStream_t s = nullptr;
    Stream() { CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
    ~Stream() { cudaStreamDestroy(s); }
};

struct Event {
    cudaEvent_t e = nullptr;
    Event() { CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming)); }
    ~Event() { cudaEventDestroy(e); }
};

cudaStreamCaptureStatus status_of(cudaStream_t s) {
    cudaStreamCaptureStatus status{};
    CUDA_CHECK(cudaStreamIsCapturing(s, &status));
    return status;
}

// Ends a capture that an illegal call must have invalidated: no graph, CUDA's error.
void require_invalidated(cudaStream_t s) {
    REQUIRE(status_of(s) == cudaStreamCaptureStatusInvalidated);
    cudaGraph_t graph = reinterpret_cast<cudaGraph_t>(0x1);
    REQUIRE(cudaStreamEndCapture(s, &graph) == cudaErrorStreamCaptureInvalidated);
    REQUIRE(graph == nullptr);
    REQUIRE(status_of(s) == cudaStreamCaptureStatusNone);
    (void)cudaGetLastError();
}

}  // namespace graphs_test

using namespace graphs_test;

TEST_CASE("captured work runs at each launch, not at capture, reading memory as it is then", "[graphs]") {
    Stream stream;
    const auto x0 = random_vector<float>(kN, 501);
    DeviceArray<float> x(x0), y(kN);
    float* pinned = nullptr;
    CUDA_CHECK(cudaMallocHost(&pinned, kN * sizeof(float)));
    for (int i = 0; i < kN; ++i) pinned[i] = float(i);

    CUDA_CHECK(cudaStreamBeginCapture(stream.s, cudaStreamCaptureModeGlobal));
    REQUIRE(status_of(stream.s) == cudaStreamCaptureStatusActive);
    CUDA_CHECK(cudaMemcpyAsync(y.get(), pinned, kN * sizeof(float), cudaMemcpyHostToDevice, stream.s));
    scale_add_on(stream.s, y.get(), 2.0f, 1.0f);  // y = 2·pinned + 1
    add_into_on(stream.s, y.get(), x.get());      // x += y
    CUDA_CHECK(cudaMemsetAsync(y.get(), 0, kN * sizeof(float), stream.s));
    cudaGraph_t graph = nullptr;
    CUDA_CHECK(cudaStreamEndCapture(stream.s, &graph));
    REQUIRE(graph != nullptr);
    REQUIRE(status_of(stream.s) == cudaStreamCaptureStatusNone);
    size_t nodes = 0;
    CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &nodes));
    REQUIRE(nodes == 4);
    // Nothing ran: x is as uploaded, y still poison.
    REQUIRE(x.download() == x0);
    for (float v : y.download()) REQUIRE(std::isnan(v));

    cudaGraphExec_t exec = nullptr;
    CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    std::vector<float> expected = x0;
    for (int launch_index = 0; launch_index < 3; ++launch_index) {
        // The host buffer changes between launches: each launch copies what it holds then.
        for (int i = 0; i < kN; ++i) pinned[i] = float(i * (launch_index + 1)) * 0.5f;
        CUDA_CHECK(cudaGraphLaunch(exec, stream.s));
        CUDA_CHECK(cudaStreamSynchronize(stream.s));
        for (int i = 0; i < kN; ++i) expected[size_t(i)] += pinned[i] * 2.0f + 1.0f;
        REQUIRE(x.download() == expected);
        for (float v : y.download()) REQUIRE(v == 0.0f);
    }
    CUDA_CHECK(cudaGraphExecDestroy(exec));
    CUDA_CHECK(cudaGraphDestroy(graph));
    CUDA_CHECK(cudaFreeHost(pinned));
}

TEST_CASE("a capture forks into another stream and joins back through events", "[graphs]") {
    Stream origin, side;
    Event fork, join;
    const auto a0 = random_vector<float>(kN, 502), b0 = random_vector<float>(kN, 503),
               c0 = random_vector<float>(kN, 509);
    DeviceArray<float> a(a0), b(b0), c(c0);
    CUDA_CHECK(cudaStreamBeginCapture(origin.s, cudaStreamCaptureModeGlobal));
    scale_add_on(origin.s, a.get(), 3.0f, 0.0f);  // a = 3a
    CUDA_CHECK(cudaEventRecord(fork.e, origin.s));
    CUDA_CHECK(cudaStreamWaitEvent(side.s, fork.e, 0));  // side joins the capture after a = 3a
    REQUIRE(status_of(side.s) == cudaStreamCaptureStatusActive);
    // Both streams report the one capture's id (what Comm::join_to compares).
    cudaStreamCaptureStatus origin_status = cudaStreamCaptureStatusNone, side_status = cudaStreamCaptureStatusNone;
    unsigned long long origin_id = 0, side_id = 0;
    CUDA_CHECK(cudaStreamGetCaptureInfo(origin.s, &origin_status, &origin_id));
    CUDA_CHECK(cudaStreamGetCaptureInfo(side.s, &side_status, &side_id));
    CHECK(origin_status == cudaStreamCaptureStatusActive);
    CHECK(side_status == cudaStreamCaptureStatusActive);
    CHECK(origin_id == side_id);
    add_into_on(side.s, a.get(), b.get());        // side: b += a (reads 3a)
    scale_add_on(origin.s, c.get(), 2.0f, 1.0f);  // origin, beside it: c = 2c + 1
    CUDA_CHECK(cudaEventRecord(join.e, side.s));
    CUDA_CHECK(cudaStreamWaitEvent(origin.s, join.e, 0));
    add_into_on(origin.s, b.get(), a.get());  // after the join: a += b
    cudaGraph_t graph = nullptr;
    CUDA_CHECK(cudaStreamEndCapture(origin.s, &graph));
    REQUIRE(status_of(side.s) == cudaStreamCaptureStatusNone);
    {  // another capture has another id
        CUDA_CHECK(cudaStreamBeginCapture(side.s, cudaStreamCaptureModeGlobal));
        cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
        unsigned long long id = 0;
        CUDA_CHECK(cudaStreamGetCaptureInfo(side.s, &status, &id));
        CHECK(status == cudaStreamCaptureStatusActive);
        CHECK(id != origin_id);
        cudaGraph_t empty = nullptr;
        CUDA_CHECK(cudaStreamEndCapture(side.s, &empty));
        CUDA_CHECK(cudaGraphDestroy(empty));
    }
    size_t nodes = 0;
    CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &nodes));
    REQUIRE(nodes == 4);  // the kernels; events and waits are edges
    cudaGraphExec_t exec = nullptr;
    CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    CUDA_CHECK(cudaGraphDestroy(graph));  // the executable graph does not need it
    std::vector<float> a_ref(a0), b_ref(b0), c_ref(c0);
    for (int launch_index = 0; launch_index < 4; ++launch_index) {
        CUDA_CHECK(cudaGraphLaunch(exec, origin.s));
        for (size_t i = 0; i < size_t(kN); ++i) {
            const float tripled = a_ref[i] * 3.0f + 0.0f;
            b_ref[i] += tripled;
            c_ref[i] = c_ref[i] * 2.0f + 1.0f;
            a_ref[i] = tripled + b_ref[i];
        }
    }
    CUDA_CHECK(cudaStreamSynchronize(origin.s));
    REQUIRE(b.download() == b_ref);
    REQUIRE(a.download() == a_ref);
    REQUIRE(c.download() == c_ref);
    CUDA_CHECK(cudaGraphExecDestroy(exec));
}

TEST_CASE("a capture whose forked stream is not joined back ends without a graph", "[graphs]") {
    Stream origin, side;
    Event fork;
    DeviceArray<float> a(random_vector<float>(kN, 504));
    CUDA_CHECK(cudaStreamBeginCapture(origin.s, cudaStreamCaptureModeGlobal));
    CUDA_CHECK(cudaEventRecord(fork.e, origin.s));
    CUDA_CHECK(cudaStreamWaitEvent(side.s, fork.e, 0));
    scale_add_on(side.s, a.get(), 2.0f, 0.0f);
    cudaGraph_t graph = nullptr;
    REQUIRE(cudaStreamEndCapture(origin.s, &graph) == cudaErrorStreamCaptureUnjoined);
    REQUIRE(graph == nullptr);
    REQUIRE(status_of(side.s) == cudaStreamCaptureStatusNone);
    (void)cudaGetLastError();
}

TEST_CASE("synchronising with a capturing stream, or querying it, invalidates the capture", "[graphs]") {
    Stream stream;
    DeviceArray<float> a(random_vector<float>(kN, 505));
    for (bool query : {false, true}) {
        CUDA_CHECK(cudaStreamBeginCapture(stream.s, cudaStreamCaptureModeGlobal));
        scale_add_on(stream.s, a.get(), 2.0f, 1.0f);
        REQUIRE((query ? cudaStreamQuery(stream.s) : cudaStreamSynchronize(stream.s)) ==
                cudaErrorStreamCaptureUnsupported);
        require_invalidated(stream.s);
    }
}

TEST_CASE("an event recorded in a capture cannot be waited for or queried from the host", "[graphs][host-only]") {
    Stream stream;
    Event marker;
    DeviceArray<float> a(random_vector<float>(kN, 506));
    CUDA_CHECK(cudaStreamBeginCapture(stream.s, cudaStreamCaptureModeGlobal));
    scale_add_on(stream.s, a.get(), 2.0f, 1.0f);
    CUDA_CHECK(cudaEventRecord(marker.e, stream.s));
    REQUIRE(cudaEventQuery(marker.e) == cudaErrorCapturedEvent);
    REQUIRE(cudaEventSynchronize(marker.e) == cudaErrorCapturedEvent);
    (void)cudaGetLastError();
    cudaGraph_t graph = nullptr;
    CUDA_CHECK(cudaStreamEndCapture(stream.s, &graph));  // the capture itself is still valid
    CUDA_CHECK(cudaGraphDestroy(graph));
    // After the capture has ended the event still marks no work that will run: a wait on it is
    // refused rather than joining the ended capture (which would swallow the stream's later work).
    Stream other;
    REQUIRE(cudaStreamWaitEvent(other.s, marker.e, 0) == cudaErrorCapturedEvent);
    REQUIRE(status_of(other.s) == cudaStreamCaptureStatusNone);
    (void)cudaGetLastError();
    // Recorded again outside a capture, it is an ordinary event.
    CUDA_CHECK(cudaEventRecord(marker.e, stream.s));
    CUDA_CHECK(cudaStreamWaitEvent(other.s, marker.e, 0));
    CUDA_CHECK(cudaEventSynchronize(marker.e));
}

TEST_CASE("the legacy default stream cannot capture; a stream captures one capture at a time", "[graphs][host-only]") {
    REQUIRE(cudaStreamBeginCapture(nullptr, cudaStreamCaptureModeGlobal) == cudaErrorStreamCaptureUnsupported);
    Stream stream;
    CUDA_CHECK(cudaStreamBeginCapture(stream.s, cudaStreamCaptureModeRelaxed));
    REQUIRE(cudaStreamBeginCapture(stream.s, cudaStreamCaptureModeRelaxed) != cudaSuccess);
    cudaGraph_t graph = nullptr;
    CUDA_CHECK(cudaStreamEndCapture(stream.s, &graph));  // an empty capture is a graph of no nodes
    size_t nodes = 1;
    CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &nodes));
    REQUIRE(nodes == 0);
    CUDA_CHECK(cudaGraphDestroy(graph));
    REQUIRE(cudaStreamEndCapture(stream.s, &graph) != cudaSuccess);  // not capturing any more
    (void)cudaGetLastError();
}

TEST_CASE("during a global capture allocating, freeing and pageable or synchronous copies are refused",
          "[graphs][host-only]") {
    Stream stream;
    DeviceArray<float> a(random_vector<float>(kN, 507));
    std::vector<float> pageable(kN, 1.0f);
    const std::vector<std::function<cudaError_t()>> calls{
        [] {
            void* p = nullptr;
            return cudaMalloc(&p, 64);
        },
        [&] { return cudaFree(a.get()); },
        [&] { return cudaMemcpy(a.get(), pageable.data(), kN * sizeof(float), cudaMemcpyHostToDevice); },
        [&] { return cudaMemset(a.get(), 0, kN * sizeof(float)); },
        [] { return cudaDeviceSynchronize(); },
        [&] {  // pageable memory on the capturing stream itself
            return cudaMemcpyAsync(a.get(), pageable.data(), kN * sizeof(float), cudaMemcpyHostToDevice, stream.s);
        },
    };
    for (size_t i = 0; i < calls.size(); ++i) {
        INFO("call " << i);
        CUDA_CHECK(cudaStreamBeginCapture(stream.s, cudaStreamCaptureModeGlobal));
        REQUIRE(calls[i]() == cudaErrorStreamCaptureUnsupported);
        require_invalidated(stream.s);
    }
    // Relaxed mode allows the unsafe calls (not the pageable copy on the capturing stream).
    CUDA_CHECK(cudaStreamBeginCapture(stream.s, cudaStreamCaptureModeRelaxed));
    void* p = nullptr;
    CUDA_CHECK(cudaMalloc(&p, 64));
    CUDA_CHECK(cudaFree(p));
    cudaGraph_t graph = nullptr;
    CUDA_CHECK(cudaStreamEndCapture(stream.s, &graph));
    CUDA_CHECK(cudaGraphDestroy(graph));
}

TEST_CASE("a thread-local capture refuses the unsafe calls of its own thread only", "[graphs][host-only]") {
    Stream stream;
    CUDA_CHECK(cudaStreamBeginCapture(stream.s, cudaStreamCaptureModeThreadLocal));
    cudaError_t other_thread = cudaErrorUnknown;
    std::thread([&] {
        void* p = nullptr;
        other_thread = cudaMalloc(&p, 64);
        if (other_thread == cudaSuccess) other_thread = cudaFree(p);
    }).join();
    REQUIRE(other_thread == cudaSuccess);
    REQUIRE(status_of(stream.s) == cudaStreamCaptureStatusActive);
    void* p = nullptr;
    REQUIRE(cudaMalloc(&p, 64) == cudaErrorStreamCaptureUnsupported);
    require_invalidated(stream.s);
}

TEST_CASE("a capture cannot wait for work recorded outside it", "[graphs][host-only]") {
    Stream stream, other;
    Event outside;
    DeviceArray<float> a(random_vector<float>(kN, 508));
    scale_add_on(other.s, a.get(), 2.0f, 0.0f);
    CUDA_CHECK(cudaEventRecord(outside.e, other.s));
    CUDA_CHECK(cudaStreamBeginCapture(stream.s, cudaStreamCaptureModeGlobal));
    REQUIRE(cudaStreamWaitEvent(stream.s, outside.e, 0) == cudaErrorStreamCaptureIsolation);
    require_invalidated(stream.s);
    CUDA_CHECK(cudaStreamSynchronize(other.s));
}
