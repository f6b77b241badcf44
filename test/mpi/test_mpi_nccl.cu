// NCCL across ranks (run as `mpirun -np N`, N = 2 and 4; the same code for every N): every
// collective, type and reduction op against plain loops, in place and out of place, at counts that
// do not divide by N; send/recv rings in groups; split communicators; errors; streams ordered by
// events. On the host backend this tests host/nccl.cpp (NCCL on MPI); on a GPU machine, NCCL itself.
//
// Expectations: every rank generates every rank's input from a seed keyed by (case, rank) and
// reduces them itself, in rank order 0..N-1, in plain loops: the bits every rank must get. Each
// test case ends by all-gathering a digest of everything each rank received and requiring that all
// ranks agree. Host-side MPI calls synchronise the device first (a rule of the host NCCL's deferred
// mode: never block in MPI with NCCL work queued).
#include "platform/platform.h"
#include "test/check.h"

#include <mpi.h>
#include <nccl.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

using pv::test::DeviceArray;

namespace nccl_test {

#define NCCL_REQUIRE(call)                                               \
    do {                                                                 \
        const ncclResult_t nccl_result_ = (call);                        \
        INFO(#call << " returned " << ncclGetErrorString(nccl_result_)); \
        REQUIRE(nccl_result_ == ncclSuccess);                            \
    } while (0)

int world_rank() {
    int r = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
}
int world_size() {
    int n = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    return n;
}

// Host-side MPI, after the device is idle.
std::vector<uint64_t> allgather_u64(uint64_t value) {
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<uint64_t> all(static_cast<size_t>(world_size()));
    MPI_Allgather(&value, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD);
    return all;
}
template <class T>
void bcast_bytes(T* value, int root) {
    CUDA_CHECK(cudaDeviceSynchronize());
    MPI_Bcast(value, int(sizeof(T)), MPI_BYTE, root, MPI_COMM_WORLD);
}

// The communicator of every rank, made once per process as llm.c does: rank 0's id, broadcast.
ncclComm_t world_comm() {
    static ncclComm_t comm = [] {
        ncclUniqueId id;
        if (world_rank() == 0) NCCL_REQUIRE(ncclGetUniqueId(&id));
        bcast_bytes(&id, 0);
        ncclComm_t c = nullptr;
        NCCL_REQUIRE(ncclCommInitRank(&c, world_size(), id, world_rank()));
        return c;
    }();
    return comm;
}

// ---- element types ------------------------------------------------------------------------------
template <class T>
constexpr ncclDataType_t nccl_type();
template <>
constexpr ncclDataType_t nccl_type<double>() {
    return ncclFloat64;
}
template <>
constexpr ncclDataType_t nccl_type<float>() {
    return ncclFloat32;
}
template <>
constexpr ncclDataType_t nccl_type<__nv_bfloat16>() {
    return ncclBfloat16;
}
template <>
constexpr ncclDataType_t nccl_type<__half>() {
    return ncclFloat16;
}
template <>
constexpr ncclDataType_t nccl_type<int8_t>() {
    return ncclInt8;
}
template <>
constexpr ncclDataType_t nccl_type<uint8_t>() {
    return ncclUint8;
}
template <>
constexpr ncclDataType_t nccl_type<int32_t>() {
    return ncclInt32;
}
template <>
constexpr ncclDataType_t nccl_type<uint32_t>() {
    return ncclUint32;
}
template <>
constexpr ncclDataType_t nccl_type<int64_t>() {
    return ncclInt64;
}
template <>
constexpr ncclDataType_t nccl_type<uint64_t>() {
    return ncclUint64;
}

template <class F>
void for_each_type(F&& f) {
    f(double{});
    f(float{});
    f(__nv_bfloat16{});
    f(__half{});
    f(int8_t{});
    f(uint8_t{});
    f(int32_t{});
    f(uint32_t{});
    f(int64_t{});
    f(uint64_t{});
}

template <class T>
constexpr bool is_16bit_float = std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>;

inline float widen(__nv_bfloat16 x) { return __bfloat162float(x); }
inline float widen(__half x) { return __half2float(x); }
template <class T>
T narrow(float x) {
    if constexpr (std::is_same_v<T, __nv_bfloat16>)
        return __float2bfloat16_rn(x);
    else
        return __float2half_rn(x);
}

const ncclRedOp_t kOps[] = {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg};
const char* op_name(ncclRedOp_t op) {
    switch (op) {
        case ncclSum: return "sum";
        case ncclProd: return "prod";
        case ncclMax: return "max";
        case ncclMin: return "min";
        case ncclAvg: return "avg";
        default: return "?";
    }
}

uint64_t splitmix(uint64_t& state) {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// Rank `rank`'s input for case `key`: uniform in [-1, 1) for floating types, every bit pattern
// for integers (so sums and products wrap).
template <class T>
std::vector<T> input_of(uint64_t key, int rank, size_t n) {
    uint64_t state = key * 0x100000001B3ull + uint64_t(rank) * 0x9E3779B97F4A7C15ull + 12345;
    std::vector<T> v(n);
    for (auto& x : v) {
        const uint64_t bits = splitmix(state);
        const double u = double(bits >> 11) * 0x1.0p-53 * 2.0 - 1.0;
        if constexpr (std::is_integral_v<T>)
            x = T(bits);
        else if constexpr (is_16bit_float<T>)
            x = narrow<T>(float(u));
        else
            x = T(u);
    }
    return v;
}

// ((x0 ⊕ x1) ⊕ x2) ⊕ ... for elements [begin, begin + count) of the inputs x[rank]: NCCL's
// semantics (avg on floating types pre-multiplies by 1/N, on integers divides the wrapped sum;
// max/min are fmax/fmin on floating types) with 16-bit floats combined in float and rounded once.
template <class T>
std::vector<T> reduce_in_rank_order(const std::vector<std::vector<T>>& x, size_t begin, size_t count, ncclRedOp_t op) {
    const int n = int(x.size());
    std::vector<T> out(count);
    for (size_t i = 0; i < count; ++i) {
        if constexpr (std::is_integral_v<T>) {
            using U = std::make_unsigned_t<T>;
            T acc = x[0][begin + i];
            for (int j = 1; j < n; ++j) {
                const T v = x[size_t(j)][begin + i];
                if (op == ncclSum || op == ncclAvg) acc = T(U(U(acc) + U(v)));
                if (op == ncclProd) acc = T(U(U(acc) * U(v)));
                if (op == ncclMax) acc = std::max(acc, v);
                if (op == ncclMin) acc = std::min(acc, v);
            }
            out[i] = op == ncclAvg ? T(acc / T(n)) : acc;
        } else {
            using Acc = std::conditional_t<is_16bit_float<T>, float, T>;
            auto wide = [](T v) -> Acc {
                if constexpr (is_16bit_float<T>)
                    return widen(v);
                else
                    return v;
            };
            const Acc scale = Acc(1) / Acc(n);
            Acc acc = wide(x[0][begin + i]);
            if (op == ncclAvg) acc = acc * scale;
            for (int j = 1; j < n; ++j) {
                const Acc v = wide(x[size_t(j)][begin + i]);
                if (op == ncclSum) acc = acc + v;
                if (op == ncclAvg) acc = acc + v * scale;
                if (op == ncclProd) acc = acc * v;
                if (op == ncclMax) acc = std::fmax(acc, v);
                if (op == ncclMin) acc = std::fmin(acc, v);
            }
            if constexpr (is_16bit_float<T>)
                out[i] = narrow<T>(acc);
            else
                out[i] = acc;
        }
    }
    return out;
}

// "" when a and b hold the same bits, else where they first differ.
template <class T>
std::string bit_difference(const std::vector<T>& got, const std::vector<T>& expected) {
    if (got.size() != expected.size()) return "sizes differ";
    for (size_t i = 0; i < got.size(); ++i)
        if (std::memcmp(&got[i], &expected[i], sizeof(T)) != 0) {
            uint64_t g = 0, e = 0;
            std::memcpy(&g, &got[i], sizeof(T));
            std::memcpy(&e, &expected[i], sizeof(T));
            return "element " + std::to_string(i) + " of " + std::to_string(got.size()) + ": bits " +
                   std::to_string(g) + ", expected " + std::to_string(e);
        }
    return "";
}

// A digest of everything a rank received; ranks compare theirs at the end of a test case.
struct Digest {
    uint64_t h = 0xCBF29CE484222325ull;
    template <class T>
    void add(const std::vector<T>& v) {
        const auto* p = reinterpret_cast<const unsigned char*>(v.data());
        for (size_t i = 0; i < v.size() * sizeof(T); ++i) h = (h ^ p[i]) * 0x100000001B3ull;
    }
    // Every rank received the same bits.
    void require_same_on_every_rank() const {
        const auto all = allgather_u64(h);
        for (size_t j = 0; j < all.size(); ++j) {
            INFO("rank " << j << "'s digest against rank 0's");
            REQUIRE(all[j] == all[0]);
        }
    }
    // Rank j received what expected[j] describes (each rank checks every rank's).
    void require_on_every_rank(const std::vector<Digest>& expected) const {
        const auto all = allgather_u64(h);
        REQUIRE(all.size() == expected.size());
        for (size_t j = 0; j < all.size(); ++j) {
            INFO("rank " << j << "'s digest");
            REQUIRE(all[j] == expected[j].h);
        }
    }
};

// A distinct key per case, identical on every rank.
uint64_t case_key(int a, int b, size_t c, int d) {
    return (uint64_t(a) << 48) ^ (uint64_t(b) << 40) ^ (uint64_t(c) << 8) ^ uint64_t(d);
}

__global__ void fill_values(float* x, int n, int rank) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = float(rank + 1) * 0.5f + float(i) * 0.25f;
}

// fill_values's values for rank `rank` + *round: read from device memory, so a graph's launches differ.
__global__ void fill_round(float* x, int n, int rank, const int* round) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = float(rank + *round + 1) * 0.5f + float(i) * 0.25f;
}

__global__ void scale_into(float* out, const float* x, int n, float factor) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i] * factor;
}

// The streams cases' set-up: a compute, a communication and another non-blocking stream, and two
// events (x produced on compute, x reduced on communication).
struct StreamsAndEvents {
    cudaStream_t compute = nullptr, communication = nullptr, other = nullptr;
    cudaEvent_t produced = nullptr, reduced = nullptr;
    StreamsAndEvents() {
        for (cudaStream_t* s : {&compute, &communication, &other})
            CUDA_CHECK(cudaStreamCreateWithFlags(s, cudaStreamNonBlocking));
        for (cudaEvent_t* e : {&produced, &reduced}) CUDA_CHECK(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
    }
    ~StreamsAndEvents() {
        for (cudaEvent_t e : {produced, reduced}) cudaEventDestroy(e);
        for (cudaStream_t s : {compute, communication, other}) cudaStreamDestroy(s);
    }
    StreamsAndEvents(const StreamsAndEvents&) = delete;
    StreamsAndEvents& operator=(const StreamsAndEvents&) = delete;
};

// The inputs of an all-reduce of 1003 floats and an all-gather of 7 ints per rank, keyed by `key`:
// this rank's, every rank's floats, and the all-gather's expected output.
struct CallInputs {
    std::vector<float> a_mine;
    std::vector<int32_t> b_mine;
    std::vector<std::vector<float>> a_all;
    std::vector<int32_t> b_expected;
    CallInputs(uint64_t key, int r, int n)
        : a_mine(input_of<float>(key, r, 1003)), b_mine(input_of<int32_t>(key + 1, r, 7)) {
        for (int j = 0; j < n; ++j) {
            a_all.push_back(input_of<float>(key, j, 1003));
            const auto b = input_of<int32_t>(key + 1, j, 7);
            b_expected.insert(b_expected.end(), b.begin(), b.end());
        }
    }
};

}  // namespace nccl_test

using namespace nccl_test;

TEST_CASE("communicator: size, rank, device, version, error strings, unique ids", "[nccl]") {
    ncclComm_t comm = world_comm();
    int count = 0, rank = -1, device = -1, current = -2, version = 0;
    NCCL_REQUIRE(ncclCommCount(comm, &count));
    NCCL_REQUIRE(ncclCommUserRank(comm, &rank));
    NCCL_REQUIRE(ncclCommCuDevice(comm, &device));
    CUDA_CHECK(cudaGetDevice(&current));
    REQUIRE(count == world_size());
    REQUIRE(rank == world_rank());
    REQUIRE(device == current);
    NCCL_REQUIRE(ncclGetVersion(&version));
    REQUIRE(version >= NCCL_VERSION(2, 18, 0));
    REQUIRE(std::string(ncclGetErrorString(ncclInvalidArgument)).find("invalid argument") == 0);
    REQUIRE(std::string(ncclGetErrorString(ncclSuccess)) == "no error");
    ncclUniqueId a, b;
    NCCL_REQUIRE(ncclGetUniqueId(&a));
    NCCL_REQUIRE(ncclGetUniqueId(&b));
    REQUIRE(std::memcmp(&a, &b, sizeof a) != 0);
}

TEST_CASE("all-reduce: every type and op in rank order, in place and not, uneven counts", "[nccl]") {
    ncclComm_t comm = world_comm();
    const int n = world_size(), r = world_rank();
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreate(&stream));
    Digest digest;
    int type_index = 0;
    for_each_type([&](auto tag) {
        using T = decltype(tag);
        ++type_index;
        for (ncclRedOp_t op : kOps)
            for (size_t count : {size_t(1), size_t(7), size_t(1003)})
                for (int in_place = 0; in_place < 2; ++in_place) {
                    INFO("type " << type_index << ", op " << op_name(op) << ", count " << count << ", in place "
                                 << in_place);
                    const uint64_t key = case_key(type_index, int(op), count, in_place);
                    std::vector<std::vector<T>> inputs;
                    for (int j = 0; j < n; ++j) inputs.push_back(input_of<T>(key, j, count));
                    DeviceArray<T> send(inputs[size_t(r)]), recv(count);
                    T* out = in_place ? send.get() : recv.get();
                    NCCL_REQUIRE(ncclAllReduce(send.get(), out, count, nccl_type<T>(), op, comm, stream));
                    CUDA_CHECK(cudaStreamSynchronize(stream));
                    const auto got = in_place ? send.download() : recv.download();
                    REQUIRE(bit_difference(got, reduce_in_rank_order(inputs, 0, count, op)) == "");
                    if (!in_place) REQUIRE(bit_difference(send.download(), inputs[size_t(r)]) == "");  // untouched
                    digest.add(got);
                }
    });
    CUDA_CHECK(cudaStreamDestroy(stream));
    digest.require_same_on_every_rank();
}

TEST_CASE("reduce-scatter: every type and op in rank order, in place at send + rank * recvcount", "[nccl]") {
    ncclComm_t comm = world_comm();
    const int n = world_size(), r = world_rank();
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreate(&stream));
    Digest received;
    std::vector<Digest> expected_blocks(static_cast<size_t>(n));  // what each rank must receive
    int type_index = 0;
    for_each_type([&](auto tag) {
        using T = decltype(tag);
        ++type_index;
        for (ncclRedOp_t op : kOps)
            for (size_t recvcount : {size_t(1), size_t(7), size_t(1003)})
                for (int in_place = 0; in_place < 2; ++in_place) {
                    INFO("type " << type_index << ", op " << op_name(op) << ", recvcount " << recvcount << ", in place "
                                 << in_place);
                    const uint64_t key = case_key(type_index + 16, int(op), recvcount, in_place);
                    const size_t total = recvcount * size_t(n);
                    std::vector<std::vector<T>> inputs;
                    for (int j = 0; j < n; ++j) inputs.push_back(input_of<T>(key, j, total));
                    DeviceArray<T> send(inputs[size_t(r)]), recv(recvcount);
                    T* out = in_place ? send.get() + size_t(r) * recvcount : recv.get();
                    NCCL_REQUIRE(ncclReduceScatter(send.get(), out, recvcount, nccl_type<T>(), op, comm, stream));
                    CUDA_CHECK(cudaStreamSynchronize(stream));
                    std::vector<T> got(recvcount);
                    CUDA_CHECK(cudaMemcpy(got.data(), out, recvcount * sizeof(T), cudaMemcpyDeviceToHost));
                    REQUIRE(bit_difference(got, reduce_in_rank_order(inputs, size_t(r) * recvcount, recvcount, op)) ==
                            "");
                    if (!in_place) REQUIRE(bit_difference(send.download(), inputs[size_t(r)]) == "");
                    received.add(got);
                    for (int j = 0; j < n; ++j)
                        expected_blocks[size_t(j)].add(
                            reduce_in_rank_order(inputs, size_t(j) * recvcount, recvcount, op));
                }
    });
    CUDA_CHECK(cudaStreamDestroy(stream));
    received.require_on_every_rank(expected_blocks);
}

TEST_CASE("all-gather: every type, in place at recv + rank * sendcount, uneven counts", "[nccl]") {
    ncclComm_t comm = world_comm();
    const int n = world_size(), r = world_rank();
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreate(&stream));
    Digest digest;
    int type_index = 0;
    for_each_type([&](auto tag) {
        using T = decltype(tag);
        ++type_index;
        for (size_t sendcount : {size_t(1), size_t(7), size_t(1003)})
            for (int in_place = 0; in_place < 2; ++in_place) {
                INFO("type " << type_index << ", sendcount " << sendcount << ", in place " << in_place);
                const uint64_t key = case_key(type_index + 32, 0, sendcount, in_place);
                std::vector<T> expected;
                for (int j = 0; j < n; ++j) {
                    const auto in = input_of<T>(key, j, sendcount);
                    expected.insert(expected.end(), in.begin(), in.end());
                }
                const auto mine = input_of<T>(key, r, sendcount);
                DeviceArray<T> send(mine), recv(sendcount * size_t(n));
                const T* source = send.get();
                if (in_place) {
                    T* slot = recv.get() + size_t(r) * sendcount;
                    CUDA_CHECK(cudaMemcpy(slot, mine.data(), sendcount * sizeof(T), cudaMemcpyHostToDevice));
                    source = slot;
                }
                NCCL_REQUIRE(ncclAllGather(source, recv.get(), sendcount, nccl_type<T>(), comm, stream));
                CUDA_CHECK(cudaStreamSynchronize(stream));
                const auto got = recv.download();
                REQUIRE(bit_difference(got, expected) == "");
                digest.add(got);
            }
    });
    CUDA_CHECK(cudaStreamDestroy(stream));
    digest.require_same_on_every_rank();
}

TEST_CASE("broadcast from every root, in place and not", "[nccl]") {
    ncclComm_t comm = world_comm();
    const int n = world_size(), r = world_rank();
    Digest digest;
    for (int root = 0; root < n; ++root)
        for (size_t count : {size_t(7), size_t(1003)})
            for (int in_place = 0; in_place < 2; ++in_place) {
                INFO("root " << root << ", count " << count << ", in place " << in_place);
                const auto data = input_of<double>(case_key(48, root, count, in_place), root, count);
                DeviceArray<double> send(count), recv(count);
                if (r == root) send.upload(data);
                if (r == root && in_place) recv.upload(data);
                // Non-roots pass a sendbuff that is never read: NULL.
                const double* source = r != root ? nullptr : in_place ? recv.get() : send.get();
                NCCL_REQUIRE(ncclBroadcast(source, recv.get(), count, ncclFloat64, root, comm, nullptr));
                const auto got = recv.download();
                REQUIRE(bit_difference(got, data) == "");
                digest.add(got);
            }
    // bf16 from the last rank.
    const auto data = input_of<__nv_bfloat16>(77, n - 1, 333);
    DeviceArray<__nv_bfloat16> buffer(333);
    if (r == n - 1) buffer.upload(data);
    NCCL_REQUIRE(ncclBroadcast(buffer.get(), buffer.get(), 333, ncclBfloat16, n - 1, comm, nullptr));
    REQUIRE(bit_difference(buffer.download(), data) == "");
    digest.add(buffer.download());
    digest.require_same_on_every_rank();
}

TEST_CASE("send/recv: rings in one group never deadlock, sends to one peer keep their order, sends to self", "[nccl]") {
    ncclComm_t comm = world_comm();
    const int n = world_size(), r = world_rank();
    const int right = (r + 1) % n, left = (r + n - 1) % n;
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreate(&stream));
    // Large enough for MPI's rendezvous protocol: a blocking send would wait for its receive.
    const size_t m = size_t(1) << 18;
    const uint64_t to_right = 1, to_left = 2, to_self = 3;
    DeviceArray<float> send_right(input_of<float>(to_right, r, m)), send_left(input_of<float>(to_left, r, m));
    DeviceArray<float> from_left(m), from_right(m);
    NCCL_REQUIRE(ncclGroupStart());
    NCCL_REQUIRE(ncclSend(send_right.get(), m, ncclFloat32, right, comm, stream));
    NCCL_REQUIRE(ncclRecv(from_left.get(), m, ncclFloat32, left, comm, stream));
    NCCL_REQUIRE(ncclGroupEnd());
    CUDA_CHECK(cudaStreamSynchronize(stream));
    REQUIRE(bit_difference(from_left.download(), input_of<float>(to_right, left, m)) == "");

    // Both directions at once (with two ranks both neighbours are one peer: order decides), plus an
    // int64 transfer to oneself (with one rank every transfer is to oneself, paired in order).
    from_left.poison();
    from_right.poison();
    const auto self_data = input_of<int64_t>(to_self, r, 999);
    DeviceArray<int64_t> self_send(self_data), self_recv(999);
    NCCL_REQUIRE(ncclGroupStart());
    NCCL_REQUIRE(ncclSend(send_right.get(), m, ncclFloat32, right, comm, stream));
    NCCL_REQUIRE(ncclSend(send_left.get(), m, ncclFloat32, left, comm, stream));
    NCCL_REQUIRE(ncclRecv(from_left.get(), m, ncclFloat32, left, comm, stream));
    NCCL_REQUIRE(ncclRecv(from_right.get(), m, ncclFloat32, right, comm, stream));
    NCCL_REQUIRE(ncclRecv(self_recv.get(), 999, ncclInt64, r, comm, stream));
    NCCL_REQUIRE(ncclSend(self_send.get(), 999, ncclInt64, r, comm, stream));
    NCCL_REQUIRE(ncclGroupEnd());
    CUDA_CHECK(cudaStreamSynchronize(stream));
    const auto got_left = from_left.download(), got_right = from_right.download();
    const auto got_self = self_recv.download();
    REQUIRE(bit_difference(got_left, input_of<float>(to_right, left, m)) == "");
    REQUIRE(bit_difference(got_right, input_of<float>(to_left, right, m)) == "");
    REQUIRE(bit_difference(got_self, self_data) == "");
    CUDA_CHECK(cudaStreamDestroy(stream));
    Digest received;
    received.add(got_left);
    received.add(got_right);
    received.add(got_self);
    std::vector<Digest> expected(static_cast<size_t>(n));
    for (int j = 0; j < n; ++j) {
        expected[size_t(j)].add(input_of<float>(to_right, (j + n - 1) % n, m));
        expected[size_t(j)].add(input_of<float>(to_left, (j + 1) % n, m));
        expected[size_t(j)].add(input_of<int64_t>(to_self, j, 999));
    }
    received.require_on_every_rank(expected);
}

TEST_CASE("a group of collectives and send/recv, nested groups run at the outermost end", "[nccl]") {
    ncclComm_t comm = world_comm();
    const int n = world_size(), r = world_rank();
    const int right = (r + 1) % n, left = (r + n - 1) % n;
    std::vector<std::vector<float>> sums;
    for (int j = 0; j < n; ++j) sums.push_back(input_of<float>(500, j, 1001));
    const auto gathered_mine = input_of<int32_t>(501, r, 5);
    DeviceArray<float> sum_in(sums[size_t(r)]), sum_out(1001);
    DeviceArray<int32_t> gather_in(gathered_mine), gather_out(5 * size_t(n));
    DeviceArray<double> ring_in(input_of<double>(502, r, 4096)), ring_out(4096);

    NCCL_REQUIRE(ncclGroupStart());
    NCCL_REQUIRE(ncclSend(ring_in.get(), 4096, ncclFloat64, right, comm, nullptr));
    NCCL_REQUIRE(ncclGroupStart());
    NCCL_REQUIRE(ncclAllReduce(sum_in.get(), sum_out.get(), 1001, ncclFloat32, ncclSum, comm, nullptr));
    NCCL_REQUIRE(ncclRecv(ring_out.get(), 4096, ncclFloat64, left, comm, nullptr));
    NCCL_REQUIRE(ncclGroupEnd());
    // The inner end runs nothing: outputs are still poisoned.
    const auto before = sum_out.download();
    REQUIRE(std::isnan(before[0]));
    NCCL_REQUIRE(ncclAllGather(gather_in.get(), gather_out.get(), 5, ncclInt32, comm, nullptr));
    NCCL_REQUIRE(ncclGroupEnd());

    const auto got_sum = sum_out.download();
    REQUIRE(bit_difference(got_sum, reduce_in_rank_order(sums, 0, 1001, ncclSum)) == "");
    std::vector<int32_t> gathered;
    for (int j = 0; j < n; ++j) {
        const auto in = input_of<int32_t>(501, j, 5);
        gathered.insert(gathered.end(), in.begin(), in.end());
    }
    REQUIRE(bit_difference(gather_out.download(), gathered) == "");
    REQUIRE(bit_difference(ring_out.download(), input_of<double>(502, left, 4096)) == "");
    Digest digest;
    digest.add(got_sum);
    digest.add(gather_out.download());
    digest.require_same_on_every_rank();
}

TEST_CASE("ncclCommSplit: halves, reversed keys, singletons, no color; collectives on the splits", "[nccl]") {
    ncclComm_t world = world_comm();
    const int n = world_size(), r = world_rank();
    Digest digest;

    // Halves (with two ranks: singletons). Members are world ranks in order; rank = index.
    const int half = r < n / 2 ? 0 : 1;
    std::vector<int> members;
    for (int j = 0; j < n; ++j)
        if ((j < n / 2 ? 0 : 1) == half) members.push_back(j);
    ncclComm_t halves = nullptr;
    NCCL_REQUIRE(ncclCommSplit(world, half, r, &halves, nullptr));
    REQUIRE(halves != nullptr);
    int count = 0, rank = -1;
    NCCL_REQUIRE(ncclCommCount(halves, &count));
    NCCL_REQUIRE(ncclCommUserRank(halves, &rank));
    REQUIRE(count == int(members.size()));
    REQUIRE(members[size_t(rank)] == r);
    std::vector<std::vector<float>> inputs;
    for (int w : members) inputs.push_back(input_of<float>(600, w, 777));
    DeviceArray<float> in(input_of<float>(600, r, 777)), out(777);
    NCCL_REQUIRE(ncclAllReduce(in.get(), out.get(), 777, ncclFloat32, ncclSum, halves, nullptr));
    const auto got_half = out.download();
    REQUIRE(bit_difference(got_half, reduce_in_rank_order(inputs, 0, 777, ncclSum)) == "");

    // Reversed keys: rank order is world order reversed, and so is the order of the sum.
    ncclComm_t reversed = nullptr;
    NCCL_REQUIRE(ncclCommSplit(world, 0, n - r, &reversed, nullptr));
    NCCL_REQUIRE(ncclCommUserRank(reversed, &rank));
    REQUIRE(rank == n - 1 - r);
    std::vector<std::vector<float>> reversed_inputs;
    for (int j = n - 1; j >= 0; --j) reversed_inputs.push_back(input_of<float>(601, j, 1003));
    DeviceArray<float> rin(input_of<float>(601, r, 1003)), rout(1003);
    NCCL_REQUIRE(ncclAllReduce(rin.get(), rout.get(), 1003, ncclFloat32, ncclSum, reversed, nullptr));
    const auto got_reversed = rout.download();
    REQUIRE(bit_difference(got_reversed, reduce_in_rank_order(reversed_inputs, 0, 1003, ncclSum)) == "");
    digest.add(got_reversed);

    // Singletons (color = rank): the single-rank reference of a parity test.
    ncclComm_t alone = nullptr;
    NCCL_REQUIRE(ncclCommSplit(world, r, 0, &alone, nullptr));
    NCCL_REQUIRE(ncclCommCount(alone, &count));
    NCCL_REQUIRE(ncclCommUserRank(alone, &rank));
    REQUIRE(count == 1);
    REQUIRE(rank == 0);
    const auto mine = input_of<__nv_bfloat16>(602, r, 100);
    DeviceArray<__nv_bfloat16> a(mine), b(100);
    NCCL_REQUIRE(ncclAllReduce(a.get(), b.get(), 100, ncclBfloat16, ncclAvg, alone, nullptr));
    REQUIRE(bit_difference(b.download(), mine) == "");
    b.poison();
    NCCL_REQUIRE(ncclReduceScatter(a.get(), b.get(), 100, ncclBfloat16, ncclSum, alone, nullptr));
    REQUIRE(bit_difference(b.download(), mine) == "");
    b.poison();
    NCCL_REQUIRE(ncclAllGather(a.get(), b.get(), 100, ncclBfloat16, alone, nullptr));
    REQUIRE(bit_difference(b.download(), mine) == "");

    // No color on rank 0: it gets no communicator; the others share one of n - 1 ranks.
    ncclComm_t rest = reinterpret_cast<ncclComm_t>(&digest);  // must be overwritten
    NCCL_REQUIRE(ncclCommSplit(world, r == 0 ? NCCL_SPLIT_NOCOLOR : 7, r, &rest, nullptr));
    if (r == 0) {
        REQUIRE(rest == nullptr);
    } else {
        NCCL_REQUIRE(ncclCommCount(rest, &count));
        NCCL_REQUIRE(ncclCommUserRank(rest, &rank));
        REQUIRE(count == n - 1);
        REQUIRE(rank == r - 1);
        std::vector<std::vector<int64_t>> rest_inputs;
        for (int j = 1; j < n; ++j) rest_inputs.push_back(input_of<int64_t>(603, j, 64));
        DeviceArray<int64_t> x(input_of<int64_t>(603, r, 64));
        NCCL_REQUIRE(ncclAllReduce(x.get(), x.get(), 64, ncclInt64, ncclMax, rest, nullptr));
        REQUIRE(bit_difference(x.download(), reduce_in_rank_order(rest_inputs, 0, 64, ncclMax)) == "");
        NCCL_REQUIRE(ncclCommDestroy(rest));
    }
    NCCL_REQUIRE(ncclCommDestroy(alone));
    NCCL_REQUIRE(ncclCommDestroy(reversed));
    NCCL_REQUIRE(ncclCommDestroy(halves));
    digest.require_same_on_every_rank();
}

TEST_CASE("ncclCommInitRank: a one-rank communicator, ids that partition the world, inconsistent calls fail everywhere",
          "[nccl]") {
    const int n = world_size(), r = world_rank();
    // One rank alone, from its own id: no peers involved.
    ncclUniqueId own;
    NCCL_REQUIRE(ncclGetUniqueId(&own));
    ncclComm_t alone = nullptr;
    NCCL_REQUIRE(ncclCommInitRank(&alone, 1, own, 0));
    const auto mine = input_of<float>(700, r, 50);
    DeviceArray<float> x(mine), y(50);
    NCCL_REQUIRE(ncclAllReduce(x.get(), y.get(), 50, ncclFloat32, ncclSum, alone, nullptr));
    REQUIRE(bit_difference(y.download(), mine) == "");
    NCCL_REQUIRE(ncclCommDestroy(alone));

    // Two ids, one per parity: even world ranks form one communicator, odd ones the other.
    if (n % 2 == 0) {
        ncclUniqueId ids[2];
        if (r < 2) NCCL_REQUIRE(ncclGetUniqueId(&ids[r]));
        bcast_bytes(&ids[0], 0);
        bcast_bytes(&ids[1], 1);
        ncclComm_t parity = nullptr;
        NCCL_REQUIRE(ncclCommInitRank(&parity, n / 2, ids[r % 2], r / 2));
        int count = 0, rank = -1;
        NCCL_REQUIRE(ncclCommCount(parity, &count));
        NCCL_REQUIRE(ncclCommUserRank(parity, &rank));
        REQUIRE(count == n / 2);
        REQUIRE(rank == r / 2);
        std::vector<std::vector<double>> inputs;
        for (int j = r % 2; j < n; j += 2) inputs.push_back(input_of<double>(701, j, 300));
        DeviceArray<double> in(input_of<double>(701, r, 300)), out(300);
        NCCL_REQUIRE(ncclAllReduce(in.get(), out.get(), 300, ncclFloat64, ncclAvg, parity, nullptr));
        REQUIRE(bit_difference(out.download(), reduce_in_rank_order(inputs, 0, 300, ncclAvg)) == "");
        NCCL_REQUIRE(ncclCommDestroy(parity));
    }

    // A wrong nranks on every rank is refused on every rank (they all see the same table): no hang.
    ncclUniqueId id;
    if (r == 0) NCCL_REQUIRE(ncclGetUniqueId(&id));
    bcast_bytes(&id, 0);
    if (pv::kHostBackend) {  // real NCCL would wait for the missing rank
        ncclComm_t bad = reinterpret_cast<ncclComm_t>(&id);
        REQUIRE(ncclCommInitRank(&bad, n + 1, id, r) == ncclInvalidUsage);
        REQUIRE(bad == nullptr);
        REQUIRE_THAT(ncclGetLastError(nullptr), Catch::Contains("passed nranks = " + std::to_string(n + 1)));
    }
}

TEST_CASE("errors: host pointers, short buffers, bad roots and peers, types, ops, overlaps, groups",
          "[nccl][host-only]") {
    ncclComm_t comm = world_comm();
    const int n = world_size(), r = world_rank();
    DeviceArray<float> dev(64), out(64 * size_t(n));
    std::vector<float> host(64, 1.0f);
    auto last_error = [] { return std::string(ncclGetLastError(nullptr)); };

    REQUIRE(ncclAllReduce(host.data(), dev.get(), 64, ncclFloat32, ncclSum, comm, nullptr) == ncclInvalidArgument);
    REQUIRE_THAT(last_error(), Catch::Contains("ncclAllReduce: sendbuff") && Catch::Contains("is not device memory"));
    REQUIRE(ncclAllReduce(dev.get(), dev.get(), 65, ncclFloat32, ncclSum, comm, nullptr) == ncclInvalidArgument);
    REQUIRE_THAT(last_error(), Catch::Contains("runs past the end of its cudaMalloc allocation"));
    REQUIRE(ncclAllGather(dev.get(), host.data(), 1, ncclFloat32, comm, nullptr) == ncclInvalidArgument);
    REQUIRE_THAT(last_error(), Catch::Contains("ncclAllGather: recvbuff"));
    REQUIRE(ncclReduceScatter(out.get(), dev.get(), 65, ncclFloat32, ncclSum, comm, nullptr) == ncclInvalidArgument);
    REQUIRE(ncclBroadcast(dev.get(), dev.get(), 64, ncclFloat32, n, comm, nullptr) == ncclInvalidArgument);
    REQUIRE_THAT(last_error(), Catch::Contains("root " + std::to_string(n) + " is not a rank"));
    REQUIRE(ncclSend(dev.get(), 64, ncclFloat32, -1, comm, nullptr) == ncclInvalidArgument);
    REQUIRE_THAT(last_error(), Catch::Contains("ncclSend: peer -1 is not a rank"));
    REQUIRE(ncclAllReduce(dev.get(), dev.get(), 16, ncclFloat8e4m3, ncclSum, comm, nullptr) == ncclInvalidArgument);
    REQUIRE_THAT(last_error(), Catch::Contains("ncclFloat8e4m3") && Catch::Contains("not supported"));
    REQUIRE(ncclAllReduce(dev.get(), dev.get(), 16, ncclFloat32, ncclNumOps, comm, nullptr) == ncclInvalidArgument);
    REQUIRE_THAT(last_error(), Catch::Contains("reduction op 5 is not supported"));
    REQUIRE(ncclAllReduce(dev.get(), dev.get(), 16, ncclFloat32, ncclSum, nullptr, nullptr) == ncclInvalidArgument);
    REQUIRE_THAT(last_error(), Catch::Contains("comm is NULL"));
    REQUIRE(ncclAllReduce(dev.get(), dev.get() + 1, 16, ncclFloat32, ncclSum, comm, nullptr) == ncclInvalidArgument);
    REQUIRE_THAT(last_error(), Catch::Contains("overlap"));
    if (n > 1) {  // in place is recv + rank * sendcount; any other overlap is refused
        REQUIRE(ncclAllGather(out.get() + size_t(r == 0 ? 1 : 0) * 8, out.get(), 8, ncclFloat32, comm, nullptr) ==
                ncclInvalidArgument);
        REQUIRE_THAT(last_error(), Catch::Contains("without being the in-place form"));
    }
    REQUIRE(ncclGroupEnd() == ncclInvalidUsage);
    REQUIRE_THAT(last_error(), Catch::Contains("without a matching ncclGroupStart"));
    ncclUniqueId zeros;
    std::memset(&zeros, 0, sizeof zeros);
    ncclComm_t c = nullptr;
    REQUIRE(ncclCommInitRank(&c, 1, zeros, 0) == ncclInvalidArgument);
    REQUIRE_THAT(last_error(), Catch::Contains("not made by ncclGetUniqueId"));
    REQUIRE(ncclCommSplit(comm, -5, 0, &c, nullptr) == ncclInvalidArgument);

    // A send to oneself without its receive would wait forever: refused.
    REQUIRE(ncclSend(dev.get(), 4, ncclFloat32, r, comm, nullptr) == ncclInvalidUsage);
    REQUIRE_THAT(last_error(), Catch::Contains("needs a matching receive in the same group"));

    // A failed call inside a group: the group end reports it and runs nothing (on every rank,
    // since every rank makes the same mistake).
    DeviceArray<float> sum(16);
    NCCL_REQUIRE(ncclGroupStart());
    NCCL_REQUIRE(ncclAllReduce(dev.get(), sum.get(), 16, ncclFloat32, ncclSum, comm, nullptr));
    REQUIRE(ncclSend(host.data(), 16, ncclFloat32, (r + 1) % n, comm, nullptr) == ncclInvalidArgument);
    REQUIRE(ncclGroupEnd() == ncclInvalidArgument);
    REQUIRE_THAT(last_error(),
                 Catch::Contains("nothing in the group was run") && Catch::Contains("ncclSend: sendbuff"));
    REQUIRE(std::isnan(sum.download()[0]));

    // A destroyed communicator is refused, not used.
    ncclComm_t split = nullptr;
    NCCL_REQUIRE(ncclCommSplit(comm, 0, r, &split, nullptr));
    NCCL_REQUIRE(ncclCommDestroy(split));
    REQUIRE(ncclAllReduce(dev.get(), dev.get(), 16, ncclFloat32, ncclSum, split, nullptr) == ncclInvalidArgument);
    REQUIRE_THAT(last_error(), Catch::Contains("not a live communicator"));
}

TEST_CASE("streams: a communication stream fenced by events; one communicator's calls on two streams in issue order",
          "[nccl]") {
    ncclComm_t comm = world_comm();
    const int n = world_size(), r = world_rank();
    const int count = 1000;
    const StreamsAndEvents streams;
    cudaStream_t compute = streams.compute, communication = streams.communication, other = streams.other;
    cudaEvent_t produced = streams.produced, reduced = streams.reduced;
    DeviceArray<float> x(count), y(count);

    // compute: produce x -> communication: all-reduce x in place -> compute: y = 2x.
    for (int round = 0; round < 3; ++round) {
        x.poison();
        y.poison();
        launch(fill_values, dim3((count + 255) / 256), dim3(256), 0, compute, x.get(), count, r + round);
        CUDA_CHECK_LAUNCH();
        CUDA_CHECK(cudaEventRecord(produced, compute));
        CUDA_CHECK(cudaStreamWaitEvent(communication, produced, 0));
        NCCL_REQUIRE(ncclAllReduce(x.get(), x.get(), count, ncclFloat32, ncclSum, comm, communication));
        CUDA_CHECK(cudaEventRecord(reduced, communication));
        CUDA_CHECK(cudaStreamWaitEvent(compute, reduced, 0));
        launch(scale_into, dim3((count + 255) / 256), dim3(256), 0, compute, y.get(), x.get(), count, 2.0f);
        CUDA_CHECK_LAUNCH();
        CUDA_CHECK(cudaStreamSynchronize(compute));
        std::vector<float> expected(count);
        for (int i = 0; i < count; ++i) {
            float acc = float(0 + round + 1) * 0.5f + float(i) * 0.25f;
            for (int j = 1; j < n; ++j) acc = acc + (float(j + round + 1) * 0.5f + float(i) * 0.25f);
            expected[size_t(i)] = acc * 2.0f;
        }
        REQUIRE(bit_difference(y.download(), expected) == "");
    }

    // Calls on two streams with no event between them run in issue order on every rank (NCCL's
    // rule for one communicator), even when the ranks' streams are busy differently: each rank
    // first queues a rank-dependent number of kernels on one of them.
    const CallInputs in(800, r, n);
    const auto& [a_mine, b_mine, a_all, b_expected] = in;
    DeviceArray<float> a(a_mine), a_out(1003), busy(256);
    DeviceArray<int32_t> b(b_mine), b_out(7 * size_t(n));
    for (int round = 0; round < 4; ++round) {
        INFO("round " << round);
        cudaStream_t first = round % 2 ? communication : other, second = round % 2 ? other : communication;
        a.upload(a_mine);
        a_out.poison();
        b_out.poison();
        for (int k = 0; k <= (r + round) % n; ++k)
            launch(fill_values, dim3(1), dim3(256), 0, first, busy.get(), 256, k);
        NCCL_REQUIRE(ncclAllReduce(a.get(), a_out.get(), 1003, ncclFloat32, ncclMax, comm, first));
        NCCL_REQUIRE(ncclAllGather(b.get(), b_out.get(), 7, ncclInt32, comm, second));
        NCCL_REQUIRE(ncclAllReduce(a.get(), a.get(), 1003, ncclFloat32, ncclAvg, comm, first));
        CUDA_CHECK(cudaDeviceSynchronize());
        REQUIRE(bit_difference(a_out.download(), reduce_in_rank_order(a_all, 0, 1003, ncclMax)) == "");
        REQUIRE(bit_difference(a.download(), reduce_in_rank_order(a_all, 0, 1003, ncclAvg)) == "");
        REQUIRE(bit_difference(b_out.download(), b_expected) == "");
    }

    // Two communicators on two streams: the world and a split of it.
    ncclComm_t pairs = nullptr;
    NCCL_REQUIRE(ncclCommSplit(comm, r / 2, r, &pairs, nullptr));
    for (int k = 0; k <= r; ++k) launch(fill_values, dim3(1), dim3(256), 0, communication, busy.get(), 256, k);
    a.upload(a_mine);
    NCCL_REQUIRE(ncclAllReduce(a.get(), a_out.get(), 1003, ncclFloat32, ncclSum, pairs, communication));
    NCCL_REQUIRE(ncclAllGather(b.get(), b_out.get(), 7, ncclInt32, comm, other));
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<std::vector<float>> pair_inputs;
    for (int j = (r / 2) * 2; j < std::min(n, (r / 2) * 2 + 2); ++j) pair_inputs.push_back(a_all[size_t(j)]);
    REQUIRE(bit_difference(a_out.download(), reduce_in_rank_order(pair_inputs, 0, 1003, ncclSum)) == "");
    REQUIRE(bit_difference(b_out.download(), b_expected) == "");
    NCCL_REQUIRE(ncclCommDestroy(pairs));
}

// NCCL calls captured in a CUDA graph (NCCL 2.9 and later; the host NCCL too) run at each launch,
// not at the capture, and mixed with calls outside the graph on the same communicator (NCCL:
// "any combination of graph-captured or non-captured is supported") they keep their issue order.
TEST_CASE("graphs: captured collectives run at each launch, in issue order with the calls around them", "[nccl]") {
    ncclComm_t comm = world_comm();
    const int n = world_size(), r = world_rank();
    const int block = 257, total = block * n;  // the reduce-scatter's block per rank, the all-reduce's count
    const StreamsAndEvents streams;
    cudaStream_t compute = streams.compute, communication = streams.communication, other = streams.other;
    cudaEvent_t produced = streams.produced, reduced = streams.reduced;
    DeviceArray<int> round(1);
    DeviceArray<float> x{size_t(total)}, y{size_t(total)}, part{size_t(block)}, busy(256);
    x.poison(), y.poison(), part.poison();
    const std::vector<float> poisoned = part.download();

    // compute: x = rank's values -> communication: all-reduce x in place, reduce-scatter it into
    // part -> compute: y = 2x. Captured on compute, communication forked in and joined back.
    CUDA_CHECK(cudaStreamBeginCapture(compute, cudaStreamCaptureModeThreadLocal));
    launch(fill_round, dim3((total + 255) / 256), dim3(256), 0, compute, x.get(), total, r, round.get());
    CUDA_CHECK_LAUNCH();
    CUDA_CHECK(cudaEventRecord(produced, compute));
    CUDA_CHECK(cudaStreamWaitEvent(communication, produced, 0));
    NCCL_REQUIRE(ncclAllReduce(x.get(), x.get(), size_t(total), ncclFloat32, ncclSum, comm, communication));
    NCCL_REQUIRE(ncclReduceScatter(x.get(), part.get(), size_t(block), ncclFloat32, ncclSum, comm, communication));
    CUDA_CHECK(cudaEventRecord(reduced, communication));
    CUDA_CHECK(cudaStreamWaitEvent(compute, reduced, 0));
    launch(scale_into, dim3((total + 255) / 256), dim3(256), 0, compute, y.get(), x.get(), total, 2.0f);
    CUDA_CHECK_LAUNCH();
    cudaGraph_t graph = nullptr;
    CUDA_CHECK(cudaStreamEndCapture(compute, &graph));
    cudaGraphExec_t exec = nullptr;
    CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    CUDA_CHECK(cudaDeviceSynchronize());
    REQUIRE(bit_difference(part.download(), poisoned) == "");  // captured, not run

    // Each launch sits between an eager all-reduce and an eager all-gather on another stream, with
    // no event between them and the graph; each rank first keeps that stream busy differently.
    const CallInputs in(900, r, n);
    const auto& [a_mine, b_mine, a_all, b_expected] = in;
    DeviceArray<float> a(a_mine), a_out(1003);
    DeviceArray<int32_t> b(b_mine), b_out(7 * size_t(n));
    Digest digest;
    for (int k = 0; k < 3; ++k) {
        INFO("launch " << k);
        round.upload({k});
        x.poison(), y.poison(), part.poison(), a_out.poison(), b_out.poison();
        for (int j = 0; j <= (r + k) % n; ++j) launch(fill_values, dim3(1), dim3(256), 0, other, busy.get(), 256, j);
        NCCL_REQUIRE(ncclAllReduce(a.get(), a_out.get(), 1003, ncclFloat32, ncclMax, comm, other));
        CUDA_CHECK(cudaGraphLaunch(exec, compute));
        NCCL_REQUIRE(ncclAllGather(b.get(), b_out.get(), 7, ncclInt32, comm, other));
        CUDA_CHECK(cudaDeviceSynchronize());

        std::vector<std::vector<float>> filled;  // every rank's x before the all-reduce
        for (int j = 0; j < n; ++j) {
            filled.emplace_back(size_t(total));
            for (int i = 0; i < total; ++i) filled.back()[size_t(i)] = float(j + k + 1) * 0.5f + float(i) * 0.25f;
        }
        const std::vector<float> summed = reduce_in_rank_order(filled, 0, size_t(total), ncclSum);
        std::vector<float> doubled(summed.size());
        for (size_t i = 0; i < summed.size(); ++i) doubled[i] = summed[i] * 2.0f;
        const std::vector<std::vector<float>> every_rank_summed(size_t(n), summed);  // all-reduced on every rank
        const auto expected_part = reduce_in_rank_order(every_rank_summed, size_t(r) * block, size_t(block), ncclSum);
        REQUIRE(bit_difference(x.download(), summed) == "");
        REQUIRE(bit_difference(y.download(), doubled) == "");
        REQUIRE(bit_difference(part.download(), expected_part) == "");
        REQUIRE(bit_difference(a_out.download(), reduce_in_rank_order(a_all, 0, 1003, ncclMax)) == "");
        REQUIRE(bit_difference(b_out.download(), b_expected) == "");
        digest.add(x.download());
    }
    digest.require_same_on_every_rank();

    CUDA_CHECK(cudaGraphExecDestroy(exec));
    CUDA_CHECK(cudaGraphDestroy(graph));
}
