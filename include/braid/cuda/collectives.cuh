// braid/cuda/collectives.cuh — the five stream-taking collective calls, written once for every CUDA
// communicator (cuda::communicator, cuda::process_communicator). A communicator derives from
// stream_collectives<Self> and provides
//   template <collective c, class T, class Op>
//   void collective_call(const T* in, T* out, std::size_t count, int root, const Op& op,
//                        cudaStream_t stream, call_options co);
// (it may be private if the communicator befriends stream_collectives<Self>).
#pragma once

#include "runtime.cuh"

#include <cstddef>

#include "../comm/options.hpp"
#include "../core/ops.hpp"
#include "../core/types.hpp"
#include "../schedule/common.hpp"

namespace braid::cuda::detail {

template <class Self> class stream_collectives {
public:
  template <element T, class Op = sum<>>
    requires reduction_for<Op, T>
  void all_reduce(const T* in, T* out, std::size_t count, Op op, cudaStream_t stream, call_options co = {}) {
    self().template collective_call<collective::all_reduce, T>(in, out, count, 0, op, stream, co);
  }
  template <element T>
  void broadcast(const T* in, T* out, std::size_t count, int root, cudaStream_t stream, call_options co = {}) {
    self().template collective_call<collective::broadcast, T>(in, out, count, root, braid::detail::copy_only{}, stream, co);
  }
  template <element T, class Op = sum<>>
    requires reduction_for<Op, T>
  void reduce(const T* in, T* out, std::size_t count, int root, Op op, cudaStream_t stream, call_options co = {}) {
    self().template collective_call<collective::reduce, T>(in, out, count, root, op, stream, co);
  }
  template <element T, class Op = sum<>>
    requires reduction_for<Op, T>
  void reduce_scatter(const T* in, T* out, std::size_t recv_count, Op op, cudaStream_t stream, call_options co = {}) {
    self().template collective_call<collective::reduce_scatter, T>(in, out, recv_count, 0, op, stream, co);
  }
  template <element T>
  void all_gather(const T* in, T* out, std::size_t send_count, cudaStream_t stream, call_options co = {}) {
    self().template collective_call<collective::all_gather, T>(in, out, send_count, 0, braid::detail::copy_only{}, stream, co);
  }

private:
  Self& self() { return static_cast<Self&>(*this); }
};

} // namespace braid::cuda::detail
