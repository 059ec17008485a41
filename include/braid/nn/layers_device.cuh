// braid/nn/layers_device.cuh — braid::nn's hand-written layer arithmetic on a CUDA device: the ops of
// nn/ops.hpp (the same text the host layers run), each launched as one kernel over its output
// elements on a stream, and the batch-norm sums, a block per channel and group (bn_stats,
// bn_grad_sums).
// Functions over device pointers and explicit shapes; the layers that hold them, with the GEMM
// layers, are in model_device.cuh. Namespace braid::nn::fused.
//
//   for_each(n, op, stream)        op(i) for i in [0, n), one thread per i (grid-stride), any op of ops.hpp
//   relu_forward / relu_backward / add / pool2d_forward / pool2d_backward / global_avgpool_forward /
//   global_avgpool_backward / im2col / col2im / softmax_ce_forward / softmax_ce_backward:
//                                  the layer's step over device buffers, enqueued on the stream
//
// Every call only enqueues (no host synchronisation); a launch the runtime refuses raises cuda_error.
// Sizes are checked (negative counts, shapes that give no output: invalid_argument), pointers are not
// (they must be device memory of the stream's device). The results are the host layers' bits on the
// emulated device, and on a GPU up to nvcc's contraction of multiply-adds (ops.hpp).
#pragma once

#include <cstdint>
#include <string>

#include "../core/error.hpp"
#include "../cuda/check.cuh"
#include "../cuda/device/kernel.cuh"
#include "ops.hpp"

namespace braid::nn::fused {

namespace detail {
constexpr unsigned op_threads = 256; // the launch bound, and the block size on a GPU
#if defined(BRAID_CUDA_EMULATOR) && !defined(__CUDACC__)
// On the emulated device every CUDA thread is a fiber and each costs a context switch per launch, so
// the same kernel is launched with fewer, longer-running threads (each takes more of the grid-stride
// loop). Every element is computed by its own op call either way: the results do not depend on it.
constexpr unsigned op_block = 32;
constexpr std::int64_t op_max_blocks = 4;
#else
constexpr unsigned op_block = op_threads;
constexpr std::int64_t op_max_blocks = 4096;
#endif

template <class Op> BRAID_KERNEL_BOUNDED(op_threads) void for_each_kernel(std::int64_t n, Op op) {
  const std::int64_t step = std::int64_t(cuda::device::grid_size()) * cuda::device::block_size();
  for (std::int64_t i = std::int64_t(cuda::device::block_index()) * cuda::device::block_size() + cuda::device::thread_index(); i < n; i += step) op(i);
}

// The per-channel sums of ops.hpp's channel order, in two steps. First a block per (channel, group)
// item (grid-stride over the C * channel_groups items): its threads take the group's partials t,
// t + block, ... (consecutive threads on consecutive elements; any block size gives the same
// partials), then the group's fixed tree in shared memory, and thread 0 writes the group sum to the
// scratch at item c * channel_groups + g. Then the group sums of a channel are added in their fixed
// tree (group_total) by whoever needs the channel's sum: a thread per channel in the finishing
// kernel, and every thread of the deviations pass (the mean).
template <class Acc, class F>
BRAID_DEVICE void group_sum(Acc* part, const ops::channel_walk& w, std::int64_t c, int g, const F& f) {
  const int t = int(cuda::device::thread_index()), bs = int(cuda::device::block_size());
  for (int j = t; j < ops::channel_group; j += bs)
    part[j] = ops::channel_partial<Acc>(w, c, std::int64_t(g) * ops::channel_group + j, f);
  cuda::device::sync_block();
  for (int s = ops::channel_group / 2; s >= 1; s /= 2) {
    for (int p = t; p < s; p += bs) part[p] += part[p + s];
    cuda::device::sync_block();
  }
}
template <class Acc> BRAID_DEVICE Acc group_total(const Acc* sums, std::int64_t c) {
  Acc v[ops::channel_groups];
  for (int g = 0; g < ops::channel_groups; ++g) v[g] = sums[c * ops::channel_groups + g];
  ops::channel_tree(v, ops::channel_groups);
  return v[0];
}
// Deviations = false: the group sums of x into sum; true: of the squared deviations from the mean
// (from sum's group sums) into dev.
template <class T, bool Deviations>
BRAID_KERNEL_BOUNDED(op_threads) void bn_stats_groups_kernel(ops::bn_stats<T> op, ops::channel_walk w, double* sum, double* dev) {
  BRAID_SHARED double part[ops::channel_group];
  const std::int64_t items = op.C * ops::channel_groups;
  for (std::int64_t item = cuda::device::block_index(); item < items; item += cuda::device::grid_size()) {
    const std::int64_t c = item / ops::channel_groups;
    const int g = int(item - c * ops::channel_groups);
    if constexpr (Deviations)
      group_sum(part, w, c, g, op.deviations(group_total(sum, c) / double(w.m)));
    else
      group_sum(part, w, c, g, op.values());
    if (cuda::device::thread_index() == 0) (Deviations ? dev : sum)[item] = part[0];
    cuda::device::sync_block(); // part[0] is read before the next item overwrites it
  }
}
template <class T> BRAID_KERNEL_BOUNDED(op_threads) void bn_stats_finish_kernel(ops::bn_stats<T> op, const double* sum, const double* dev) {
  const std::int64_t step = std::int64_t(cuda::device::grid_size()) * cuda::device::block_size();
  for (std::int64_t c = std::int64_t(cuda::device::block_index()) * cuda::device::block_size() + cuda::device::thread_index(); c < op.C; c += step) {
    if (op.training)
      op.finish(c, group_total(sum, c), group_total(dev, c));
    else
      op.finish(c, 0, 0);
  }
}
template <class T>
BRAID_KERNEL_BOUNDED(op_threads) void bn_grad_groups_kernel(ops::bn_grad_sums<T> op, ops::channel_walk w, ops::sum2* sum) {
  BRAID_SHARED ops::sum2 part[ops::channel_group];
  const std::int64_t items = op.C * ops::channel_groups;
  for (std::int64_t item = cuda::device::block_index(); item < items; item += cuda::device::grid_size()) {
    const std::int64_t c = item / ops::channel_groups;
    group_sum(part, w, c, int(item - c * ops::channel_groups), op.terms_of());
    if (cuda::device::thread_index() == 0) sum[item] = part[0];
    cuda::device::sync_block();
  }
}
template <class T> BRAID_KERNEL_BOUNDED(op_threads) void bn_grad_finish_kernel(ops::bn_grad_sums<T> op, const ops::sum2* sum) {
  const std::int64_t step = std::int64_t(cuda::device::grid_size()) * cuda::device::block_size();
  for (std::int64_t c = std::int64_t(cuda::device::block_index()) * cuda::device::block_size() + cuda::device::thread_index(); c < op.C; c += step)
    op.finish(c, group_total(sum, c));
}

inline void require_shape(bool ok, const char* what) {
  if (!ok) raise(errc::invalid_argument, std::string("nn::fused: ") + what);
}
} // namespace detail

// op(i) for every i in [0, n), on `stream`.
template <class Op> void for_each(std::int64_t n, const Op& op, cudaStream_t stream) {
  detail::require_shape(n >= 0, "for_each: n < 0");
  if (n == 0) return;
  const std::int64_t want = (n + detail::op_block - 1) / detail::op_block;
  const unsigned blocks = unsigned(want < detail::op_max_blocks ? want : detail::op_max_blocks);
  const cudaError_t e = cuda::device::launch(detail::for_each_kernel<Op>, blocks, detail::op_block, 0, stream, n, op);
  if (e != cudaSuccess) cuda::detail::raise_cuda(e, "nn::fused::for_each", __FILE__, __LINE__);
}

// Batch-norm statistics and gradient sums (ops.hpp's channel order, the bits of the host's op(c)):
// a block per (channel, group), C * channel_groups blocks of the op block size on a GPU, then a thread
// per channel; bn_stats makes two such passes (the sum, then the squared deviations from the mean)
// and one finishing kernel, bn_grad_sums one pass and one finishing kernel. `scratch`: device memory
// of at least bn_scratch_doubles(C) doubles (8-byte aligned), used by the calls on the stream in
// order (one scratch serves every call on one stream); its contents need no initialisation.
inline std::int64_t bn_scratch_doubles(std::int64_t C) { return 2 * C * ops::channel_groups; }

namespace detail {
inline unsigned bn_blocks(std::int64_t items, std::int64_t max_blocks) {
  return unsigned(items < max_blocks ? items : max_blocks);
}
// The launches, with the block size and the most blocks given (the public calls use this build's
// op_block and op_max_blocks; the tests try other shapes: the results do not depend on them).
template <class T>
void bn_stats_launch(const ops::bn_stats<T>& op, double* scratch, cudaStream_t s, unsigned block, std::int64_t max_blocks) {
  require_shape(op.C > 0 && op.n > 0 && op.hw > 0, "bn_stats: bad shape");
  require_shape(scratch != nullptr, "bn_stats: no scratch");
  double* sum = scratch;
  double* dev = scratch + op.C * ops::channel_groups;
  cudaError_t e = cudaSuccess;
  if (op.training) {
    const ops::channel_walk w = ops::make_channel_walk(op.n, op.C, op.hw);
    const unsigned blocks = bn_blocks(op.C * ops::channel_groups, max_blocks);
    e = cuda::device::launch(bn_stats_groups_kernel<T, false>, blocks, block, 0, s, op, w, sum, dev);
    if (e == cudaSuccess) e = cuda::device::launch(bn_stats_groups_kernel<T, true>, blocks, block, 0, s, op, w, sum, dev);
  }
  if (e == cudaSuccess)
    e = cuda::device::launch(bn_stats_finish_kernel<T>, bn_blocks((op.C + block - 1) / block, max_blocks), block, 0, s, op,
                    static_cast<const double*>(sum), static_cast<const double*>(dev));
  if (e != cudaSuccess) cuda::detail::raise_cuda(e, "nn::fused::bn_stats", __FILE__, __LINE__);
}
template <class T>
void bn_grad_sums_launch(const ops::bn_grad_sums<T>& op, double* scratch, cudaStream_t s, unsigned block, std::int64_t max_blocks) {
  require_shape(op.C > 0 && op.n > 0 && op.hw > 0, "bn_grad_sums: bad shape");
  require_shape(scratch != nullptr, "bn_grad_sums: no scratch");
  auto* sum = reinterpret_cast<ops::sum2*>(scratch);
  const ops::channel_walk w = ops::make_channel_walk(op.n, op.C, op.hw);
  cudaError_t e = cuda::device::launch(bn_grad_groups_kernel<T>, bn_blocks(op.C * ops::channel_groups, max_blocks), block, 0, s, op, w, sum);
  if (e == cudaSuccess)
    e = cuda::device::launch(bn_grad_finish_kernel<T>, bn_blocks((op.C + block - 1) / block, max_blocks), block, 0, s, op,
                    static_cast<const ops::sum2*>(sum));
  if (e != cudaSuccess) cuda::detail::raise_cuda(e, "nn::fused::bn_grad_sums", __FILE__, __LINE__);
}
} // namespace detail

template <class T> void bn_stats(const ops::bn_stats<T>& op, double* scratch, cudaStream_t s) {
  detail::bn_stats_launch(op, scratch, s, detail::op_block, detail::op_max_blocks);
}
template <class T> void bn_grad_sums(const ops::bn_grad_sums<T>& op, double* scratch, cudaStream_t s) {
  detail::bn_grad_sums_launch(op, scratch, s, detail::op_block, detail::op_max_blocks);
}

template <class T> void relu_forward(const T* x, T* y, std::int64_t n, cudaStream_t s) {
  for_each(n, ops::relu_forward<T>{x, y}, s);
}
template <class T> void relu_backward(const T* y, const T* dy, T* dx, std::int64_t n, cudaStream_t s) {
  for_each(n, ops::relu_backward<T>{y, dy, dx}, s);
}
template <class T> void add(const T* a, const T* b, T* y, std::int64_t n, cudaStream_t s) {
  for_each(n, ops::add_forward<T>{a, b, y}, s);
}

// Pooling geometry for [n*c planes of h x w], k x k windows, stride s (the host pool2d's rules).
inline ops::pool_shape pool_geometry(std::int64_t nc, int h, int w, int k, int stride) {
  detail::require_shape(nc >= 0 && h > 0 && w > 0 && k > 0 && stride > 0, "pool2d: bad geometry");
  const int ho = (h - k) / stride + 1, wo = (w - k) / stride + 1;
  detail::require_shape(h >= k && w >= k && ho > 0 && wo > 0, "pool2d: input smaller than the window");
  return ops::pool_shape{nc, h, w, ho, wo, k, stride};
}
// arg: nc*ho*wo int32 (max pooling; unused for average pooling).
template <class T, bool Max>
void pool2d_forward(const T* x, T* y, std::int32_t* arg, const ops::pool_shape& g, cudaStream_t s) {
  for_each(g.nc * g.ho * g.wo, ops::pool_forward<T, Max>{x, y, arg, g}, s);
}
template <class T, bool Max>
void pool2d_backward(const T* dy, const std::int32_t* arg, T* dx, const ops::pool_shape& g, cudaStream_t s) {
  for_each(g.nc * g.h * g.w, ops::pool_backward<T, Max>{dy, arg, dx, g}, s);
}

template <class T> void global_avgpool_forward(const T* x, T* y, std::int64_t nc, std::int64_t hw, cudaStream_t s) {
  detail::require_shape(nc >= 0 && hw > 0, "global_avgpool: bad shape");
  for_each(nc, ops::global_avgpool_forward<T>{x, y, hw}, s);
}
template <class T> void global_avgpool_backward(const T* dy, T* dx, std::int64_t nc, std::int64_t hw, cudaStream_t s) {
  detail::require_shape(nc >= 0 && hw > 0, "global_avgpool: bad shape");
  for_each(nc * hw, ops::global_avgpool_backward<T>{dy, dx, hw}, s);
}

// Convolution geometry (the host conv2d's rules).
inline ops::conv_shape conv_geometry(int c, int h, int w, int k, int stride, int pad) {
  detail::require_shape(c > 0 && h > 0 && w > 0 && k > 0 && stride > 0 && pad >= 0, "conv2d: bad geometry");
  const int ho = (h + 2 * pad - k) / stride + 1, wo = (w + 2 * pad - k) / stride + 1;
  detail::require_shape(h + 2 * pad >= k && w + 2 * pad >= k && ho > 0 && wo > 0, "conv2d: input smaller than the kernel");
  return ops::conv_shape{c, h, w, k, stride, pad, ho, wo};
}
// One image: x [c, h, w] -> col [c*k*k, ho*wo].
template <class T> void im2col(const T* x, T* col, const ops::conv_shape& g, cudaStream_t s) {
  for_each(std::int64_t(g.c) * g.k * g.k * g.ho * g.wo, ops::im2col<T>{x, col, g}, s);
}
// One image: col [c*k*k, ho*wo] -> dx [c, h, w] (overwritten, not added to).
template <class T> void col2im(const T* col, T* dx, const ops::conv_shape& g, cudaStream_t s) {
  for_each(std::int64_t(g.c) * g.h * g.w, ops::col2im<T>{col, dx, g}, s);
}

// Softmax cross-entropy over [n, k] logits: probabilities p, per-row losses (double) and per-row
// "arg-max is the label" flags; the mean loss is the sum of the row losses in row order over n (read
// them back to get it). Labels must lie in [0, k): not checked on the device.
template <class T>
void softmax_ce_forward(const T* z, const std::int32_t* labels, T* p, double* row_loss, std::int32_t* row_right, std::int64_t n,
                        std::int64_t k, cudaStream_t s) {
  detail::require_shape(n >= 0 && k > 0, "softmax_ce: bad shape");
  for_each(n, ops::softmax_ce_forward<T>{z, labels, p, row_loss, row_right, k}, s);
}
// d(scale * mean loss)/dlogits.
template <class T>
void softmax_ce_backward(const T* p, const std::int32_t* labels, T* g, std::int64_t n, std::int64_t k, double scale, cudaStream_t s) {
  detail::require_shape(n > 0 && k > 0, "softmax_ce: bad shape");
  for_each(n * k, ops::softmax_ce_backward<T>{p, labels, g, T(scale / double(n)), k}, s);
}
// The same with the scale in device memory (*scale, read by the kernel: fused::loss_scaler's).
template <class T>
void softmax_ce_backward(const T* p, const std::int32_t* labels, T* g, std::int64_t n, std::int64_t k, const double* scale,
                         cudaStream_t s) {
  detail::require_shape(n > 0 && k > 0 && scale != nullptr, "softmax_ce: bad shape, or a null scale");
  for_each(n * k, ops::softmax_ce_backward<T>{p, labels, g, T(0), k, scale, n}, s);
}

} // namespace braid::nn::fused
