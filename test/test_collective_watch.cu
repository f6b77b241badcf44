// The stall watchdog's bookkeeping (parallel/collective_watch.h) in one process: which collective a
// device waits in, given which of a communicator's collectives it has reached and finished, and the
// wait the host publishes around an NCCL call and while it polls. The watchdog's questions to the
// other ranks and the end of the job are tested under mpirun (test_train.cpp, "a stalled rank ...").
#include <catch2/catch.hpp>

#include "parallel/collective_watch.h"

#include <chrono>
#include <string>
#include <thread>

namespace {

// A device that has reached collectives 1..reached of this tracker and finished 1..finished: the
// states a GPU passes through, which the host backend's streams (done at the call) never show.
class PlayedDevice : public pv::CollectiveTracker {
  public:
    explicit PlayedDevice(cudaStream_t stream) : CollectiveTracker("world", stream) {}
    long long reached = 0, finished = 0;

  protected:
    bool happened(const Slot& s, bool done) override { return s.id.seq <= (done ? finished : reached); }
};

void issue(PlayedDevice& device, int n, const char* kind) {
    for (int i = 0; i < n; ++i) {
        device.before(kind);
        device.after();
    }
}

std::string waits_in(PlayedDevice& device) {
    const std::optional<pv::CollectiveId> id = device.arrived_unfinished();
    return id ? pv::describe(*id) : "none";
}

struct Stream {
    cudaStream_t s = nullptr;
    Stream() { REQUIRE(cudaStreamCreate(&s) == cudaSuccess); }
    ~Stream() { cudaStreamDestroy(s); }
};

}  // namespace

TEST_CASE("collective watch: a device waits in the oldest collective it has reached and not finished",
          "[collective_watch]") {
    Stream stream;
    PlayedDevice device(stream.s);
    CHECK(waits_in(device) == "none");  // nothing issued
    pv::note_training_step(7);
    issue(device, 3, "all-reduce");
    pv::note_training_step(8);
    issue(device, 2, "all-gather");
    device.reached = 2, device.finished = 1;
    CHECK(waits_in(device) == "all-reduce #2 on communicator 'world' (step 7)");
    device.reached = 3, device.finished = 2;
    CHECK(waits_in(device) == "all-reduce #3 on communicator 'world' (step 7)");
    device.reached = 3, device.finished = 3;  // computing before #4: no collective wait
    CHECK(waits_in(device) == "none");
    device.reached = 4;
    CHECK(waits_in(device) == "all-gather #4 on communicator 'world' (step 8)");
    device.reached = 5, device.finished = 5;
    CHECK(waits_in(device) == "none");
    // A later collective after all were seen done.
    issue(device, 1, "broadcast");
    CHECK(waits_in(device) == "none");  // not reached
    device.reached = 6;
    CHECK(waits_in(device) == "broadcast #6 on communicator 'world' (step 8)");
}

// --cuda-graphs: a graph's launch holding the communicator's captured collectives is bracketed on
// the stream it is launched on (the compute stream), as one collective numbered among the others.
TEST_CASE("collective watch: a graph launched on another stream is one collective in the communicator's order",
          "[collective_watch]") {
    Stream comm, compute;
    PlayedDevice device(comm.s);
    pv::note_training_step(8);  // (the step the cases after this one were written at)
    issue(device, 1, "all-reduce");
    device.before("captured micro-step", compute.s);
    device.after(compute.s);
    issue(device, 1, "all-gather");
    device.reached = 2, device.finished = 1;
    CHECK(waits_in(device) == "captured micro-step #2 on communicator 'world' (step 8)");
    device.reached = 3, device.finished = 2;
    CHECK(waits_in(device) == "all-gather #3 on communicator 'world' (step 8)");
    device.finished = 3;
    CHECK(waits_in(device) == "none");
}

TEST_CASE("collective watch: a host more than the tracked collectives ahead of its device", "[collective_watch]") {
    Stream stream;
    PlayedDevice device(stream.s);
    const int ahead = pv::CollectiveTracker::kTrackedCollectives + 3;
    issue(device, ahead, "reduce-scatter");
    // #3's slot now holds #515, not reached: whether #3 is done cannot be told, so no wait (never a
    // false one).
    device.reached = 3, device.finished = 2;
    CHECK(waits_in(device) == "none");
    // The device reached #515: every collective before it is done, and it waits there.
    device.reached = ahead, device.finished = ahead - 1;
    CHECK(waits_in(device) == "reduce-scatter #" + std::to_string(ahead) + " on communicator 'world' (step 8)");
    device.finished = ahead;
    CHECK(waits_in(device) == "none");
    issue(device, 1, "reduce-scatter");
    device.reached = ahead + 1;
    CHECK(waits_in(device) == "reduce-scatter #" + std::to_string(ahead + 1) + " on communicator 'world' (step 8)");
}

TEST_CASE("collective watch: the host waits in a collective during its NCCL call, and from when it first saw it",
          "[collective_watch]") {
    Stream stream;
    PlayedDevice device(stream.s);
    pv::note_training_step(3);
    device.before("broadcast");
    const pv::CollectiveWait in_call = pv::current_wait();
    CHECK(in_call.waiting);
    CHECK(pv::describe(in_call.collective) == "broadcast #1 on communicator 'world' (step 3)");
    device.after();
    CHECK_FALSE(pv::current_wait().waiting);
    // A wait seen again at the next poll keeps its start; another collective starts anew.
    const pv::CollectiveId first{"all-reduce", "world", 9, 3}, second{"all-reduce", "world", 10, 3};
    pv::publish_device_wait(first);
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    pv::publish_device_wait(first);
    CHECK(pv::current_wait().seconds >= 0.03);
    pv::publish_device_wait(second);
    CHECK(pv::current_wait().seconds < 0.03);
    CHECK(pv::current_wait().collective.seq == 10);
    pv::publish_no_wait();
    CHECK_FALSE(pv::current_wait().waiting);
}

TEST_CASE("collective watch: long host work is published while it lasts, the outermost of nested ones",
          "[collective_watch]") {
    CHECK(pv::current_wait().busy.empty());
    {
        const pv::LongHostWork writing("writing checkpoint out/step_4");
        CHECK(pv::current_wait().busy == "writing checkpoint out/step_4");
        {
            const pv::LongHostWork reading("reading weights from a.safetensors");
            CHECK(pv::current_wait().busy == "writing checkpoint out/step_4");
        }
        CHECK(pv::current_wait().busy == "writing checkpoint out/step_4");
    }
    CHECK(pv::current_wait().busy.empty());
}
