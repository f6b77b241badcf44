// Tensor parallelism's collective (Megatron-LM): the model holds its slice of every block matrix
// and calls its seam (model/llama.h ModelOptions::tensor_reduce) where the conjugate operators sit
// — after each row-parallel linear in the forward, after each column-parallel linear's input
// gradient in the backward, after the vocabulary-parallel embedding and the head's input gradient;
// this is what the seam does: an in-place all-reduce over the tensor axis of the mesh
// (parallel/mesh.h), ordered with the model's stream. Its second seam (tensor_gather) gathers the
// vocabulary-parallel cross-entropy's partials. Under sequence parallelism the model's rows
// between the regions are gathered (tensor_group_gather of T) before a column-parallel linear and
// reduce-scattered (tensor_group_reduce_scatter) after a row-parallel one. The strategy binds them
// (parallel/strategies.h); the model never sees a communicator.
#pragma once

#include "parallel/comm.h"

#include <functional>

namespace pv {

// Sums `count` elements of T at `data` over `group`'s ranks, in place, on the model's `stream`'s
// timeline (the collective on the group's stream, fenced both ways).
template <class T>
std::function<void(void*, long long)> tensor_group_sum(Comm& group, cudaStream_t stream) {
    return [&group, stream](void* data, long long count) {
        T* x = static_cast<T*>(data);
        group.fence_from(stream);
        group.all_reduce(x, x, size_t(count));
        group.fence_to(stream);
    };
}

// Gathers `count` elements of T from each of `group`'s ranks into recv[size·count], rank after
// rank, on the model's `stream`'s timeline.
template <class T>
std::function<void(const void*, void*, long long)> tensor_group_gather(Comm& group, cudaStream_t stream) {
    return [&group, stream](const void* send, void* recv, long long count) {
        group.fence_from(stream);
        group.all_gather(static_cast<const T*>(send), static_cast<T*>(recv), size_t(count));
        group.fence_to(stream);
    };
}

// Sums recv_count·size elements of T at `send` over `group`'s ranks, leaving rank r elements
// [r·recv_count, (r + 1)·recv_count) of the sum in recv, on the model's `stream`'s timeline.
template <class T>
std::function<void(const void*, void*, long long)> tensor_group_reduce_scatter(Comm& group, cudaStream_t stream) {
    return [&group, stream](const void* send, void* recv, long long recv_count) {
        group.fence_from(stream);
        group.reduce_scatter(static_cast<const T*>(send), static_cast<T*>(recv), size_t(recv_count));
        group.fence_to(stream);
    };
}

}  // namespace pv
