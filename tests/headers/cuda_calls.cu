// tests/headers/cuda_calls.cu — what a user's translation unit does with <braid/cuda.cuh>: every
// collective of both CUDA communicators (and the one-process group's send / recv), for float, double, half, bfloat16 and fp8 and several
// operators, so that their host paths and kernels are instantiated, and braid::nn's fused optimizers.
// tests/headers/other_toolkit.sh compiles it (-c, sm_90) with toolchains other than the build's, and
// header_check_cuda with the build's nvcc under the strict warning set; it is never linked or run.
#include <braid/cuda.cuh>
#include <braid/nn/ddp_device.cuh>
#include <braid/nn/layers_device.cuh>
#include <braid/nn/optim_device.cuh>

namespace braid_header_check {

// A user type reduced by a user operator (api.md, "Your own types"), as in type_calls.hpp.
struct val_idx {
  float value;
  int index;
};
struct argmax {
  BRAID_HD val_idx operator()(const val_idx& a, const val_idx& b) const {
    return (b.value > a.value || (b.value == a.value && b.index < a.index)) ? b : a;
  }
};
// A 3-byte type with no operators: the copy collectives move any trivially copyable type (api.md).
struct rgb {
  unsigned char r, g, b;
};
void user_type_calls(braid::cuda::communicator& c, braid::cuda::process_communicator& p, cudaStream_t s, val_idx* v, rgb* px) {
  c.all_reduce(v, v, 1, argmax{}, s);
  c.reduce(v, v, 1, 0, argmax{}, s);
  c.reduce_scatter(v, v, 1, argmax{}, s);
  p.all_reduce(v, v, 1, argmax{}, s);
  p.reduce(v, v, 1, 0, argmax{}, s);
  p.reduce_scatter(v, v, 1, argmax{}, s);
  c.broadcast(px, px, 1, 0, s);
  c.all_gather(px, px, 1, s);
  c.send(px, 1, 1, s); // point to point moves bytes: any trivially copyable type
  c.recv(px, 1, 1, s);
  c.send(v, 1, 1, s);
  c.recv(v, 1, 1, s);
  p.broadcast(px, px, 1, 0, s);
  p.all_gather(px, px, 1, s);
}

void calls(braid::cuda::communicator& c, braid::cuda::process_communicator& p, cudaStream_t s, float* f, double* d,
           braid::half* h, braid::bfloat16* b, braid::fp8_e4m3* e) {
  c.all_reduce(f, f, 1, braid::sum{}, s);            // every all_reduce schedule
  c.all_reduce(h, h, 1, braid::sum<float>{}, s);     // half data, float accumulation
  c.reduce_scatter(b, b, 1, braid::avg<float>{}, s); // an operator with a finalize step
  c.reduce(e, e, 1, 0, braid::max{}, s);             // fp8
  c.broadcast(d, d, 1, 0, s);                        // copies only
  c.all_gather(f, f, 1, s);
  c.send(f, 1, 1, s);                                // point to point (one-process group only)
  c.recv(f, 1, 1, s);
  c.send(static_cast<const double*>(d), 1, 1, s);
  c.recv(h, 1, 1, s);
  c.send(e, 1, 1, s);
  p.all_reduce(f, f, 1, braid::sum{}, s);            // the cross-process reduce kernel
  p.reduce_scatter(h, h, 1, braid::min{}, s);
  p.broadcast(b, b, 1, 0, s);
}

} // namespace braid_header_check

// braid::nn's fused optimizers, clipping and loss scaling (nn/optim_device.cuh): every kernel
// instantiated, as a user's training step would (the emulated-device test runs them; nvcc only
// compiles them here).
template class braid::nn::fused::sgd<float>;
template class braid::nn::fused::adam<float>;
template class braid::nn::fused::lamb<float>;
template class braid::nn::fused::grad_clipper<float>;
template class braid::nn::fused::adam<double>;
// And the DDP bucket reducer (nn/ddp_device.cuh) over both CUDA communicators.
template class braid::nn::fused::bucket_reducer<braid::cuda::communicator>;
template class braid::nn::fused::bucket_reducer<braid::cuda::process_communicator>;

// And the layer ops on the device (nn/layers_device.cuh): every kernel for float.
namespace braid_header_check {
void nn_layer_calls(float* f, std::int32_t* i, double* d, cudaStream_t s) {
  namespace fused = braid::nn::fused;
  fused::relu_forward(f, f, 1, s);
  fused::relu_backward(f, f, f, 1, s);
  fused::add(f, f, f, 1, s);
  const auto pg = fused::pool_geometry(1, 4, 4, 2, 2);
  fused::pool2d_forward<float, true>(f, f, i, pg, s);
  fused::pool2d_backward<float, true>(f, i, f, pg, s);
  fused::pool2d_forward<float, false>(f, f, i, pg, s);
  fused::pool2d_backward<float, false>(f, i, f, pg, s);
  fused::global_avgpool_forward(f, f, 1, 4, s);
  fused::global_avgpool_backward(f, f, 1, 4, s);
  const auto cg = fused::conv_geometry(1, 4, 4, 3, 1, 1);
  fused::im2col(f, f, cg, s);
  fused::col2im(f, f, cg, s);
  fused::softmax_ce_forward(f, i, f, d, i, 1, 2, s);
  fused::softmax_ce_backward(f, i, f, 1, 2, 1.0, s);
  namespace ops = braid::nn::ops;
  fused::bn_stats(ops::bn_stats<float>{f, 1, 1, 4, 0.1, 1e-5, true, f, f, f, f}, d, s);
  fused::bn_grad_sums(ops::bn_grad_sums<float>{f, f, f, f, 1, 1, 4, f, f, f}, d, s);
}
} // namespace braid_header_check
