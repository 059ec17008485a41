// braid/nn/layers_device.cuh — braid::nn's hand-written layer arithmetic on a CUDA device: the ops of
// nn/ops.hpp (the same text the host layers run), each launched as one kernel over its output
// elements on a stream, and the batch-norm sums, a block per channel (bn_stats, bn_grad_sums).
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
#include "../cuda/kernel.cuh"
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
  const std::int64_t step = std::int64_t(gpu::grid_size()) * gpu::block_size();
  for (std::int64_t i = std::int64_t(gpu::block_index()) * gpu::block_size() + gpu::thread_index(); i < n; i += step) op(i);
}

// The per-channel sums of ops.hpp's channel order: a block per channel, its threads taking partials
// t, t + block, ... (consecutive threads read consecutive elements), then the fixed tree in shared
// memory. Every thread calls channel_tree; part[0] holds the sum after it.
template <class Acc> BRAID_DEVICE void channel_tree(Acc* part) {
  for (int s = ops::channel_parts / 2; s >= 1; s /= 2) {
    for (int p = int(gpu::thread_index()); p < s; p += int(gpu::block_size())) part[p] += part[p + s];
    gpu::sync_block();
  }
}
template <class T> BRAID_KERNEL_BOUNDED(op_threads) void bn_stats_kernel(ops::bn_stats<T> op) {
  BRAID_SHARED double part[ops::channel_parts];
  const std::int64_t c = std::int64_t(gpu::block_index()), m = op.n * op.hw;
  const int t = int(gpu::thread_index()), bs = int(gpu::block_size());
  if (!op.training) {
    if (t == 0) op.finish(c, 0, 0);
    return;
  }
  for (int p = t; p < ops::channel_parts; p += bs) part[p] = ops::channel_partial<double>(m, p, op.values(c));
  gpu::sync_block();
  channel_tree(part);
  const double s = part[0];
  gpu::sync_block(); // every thread has read the sum before the partials are overwritten
  for (int p = t; p < ops::channel_parts; p += bs) part[p] = ops::channel_partial<double>(m, p, op.deviations(c, s / double(m)));
  gpu::sync_block();
  channel_tree(part);
  if (t == 0) op.finish(c, s, part[0]);
}
template <class T> BRAID_KERNEL_BOUNDED(op_threads) void bn_grad_sums_kernel(ops::bn_grad_sums<T> op) {
  BRAID_SHARED ops::sum2 part[ops::channel_parts];
  const std::int64_t c = std::int64_t(gpu::block_index()), m = op.n * op.hw;
  const int t = int(gpu::thread_index()), bs = int(gpu::block_size());
  for (int p = t; p < ops::channel_parts; p += bs) part[p] = ops::channel_partial<ops::sum2>(m, p, op.terms_of(c));
  gpu::sync_block();
  channel_tree(part);
  if (t == 0) op.finish(c, part[0]);
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
  const cudaError_t e = gpu::launch(detail::for_each_kernel<Op>, blocks, detail::op_block, 0, stream, n, op);
  if (e != cudaSuccess) cuda_detail::raise_cuda(e, "nn::fused::for_each", __FILE__, __LINE__);
}

// Batch-norm statistics and gradient sums, one block per channel (C blocks of the op block size):
// the bits of the host's op(c) (ops.hpp's channel order), in parallel over the channel's elements.
template <class T> void bn_stats(const ops::bn_stats<T>& op, cudaStream_t s) {
  detail::require_shape(op.C > 0 && op.n > 0 && op.hw > 0, "bn_stats: bad shape");
  const cudaError_t e = gpu::launch(detail::bn_stats_kernel<T>, unsigned(op.C), detail::op_block, 0, s, op);
  if (e != cudaSuccess) cuda_detail::raise_cuda(e, "nn::fused::bn_stats", __FILE__, __LINE__);
}
template <class T> void bn_grad_sums(const ops::bn_grad_sums<T>& op, cudaStream_t s) {
  detail::require_shape(op.C > 0 && op.n > 0 && op.hw > 0, "bn_grad_sums: bad shape");
  const cudaError_t e = gpu::launch(detail::bn_grad_sums_kernel<T>, unsigned(op.C), detail::op_block, 0, s, op);
  if (e != cudaSuccess) cuda_detail::raise_cuda(e, "nn::fused::bn_grad_sums", __FILE__, __LINE__);
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
