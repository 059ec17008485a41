// tests/headers/nn_calls.cu — braid::nn's device model (nn/model_device.cuh) and pipeline
// (nn/pipeline_device.cuh) instantiated under nvcc with the header check's strict flags:
// fused::sequential and fused::resnet, float and double, every member, hence every kernel its layers launch (the ops of
// nn/ops.hpp through for_each) and its cuBLAS calls, and fused::pipeline over braid::cuda's
// communicator (its send/recv). Compiled, not run (no GPU in CI); its own TU because cuda_calls.cu is
// also compiled with toolchains that ship no cuBLAS headers (other_toolkit.sh).
#include <braid/cuda.cuh>
#include <braid/nn/model_device.cuh>
#include <braid/nn/pipeline_device.cuh>

template class braid::nn::fused::sequential<float>;
template class braid::nn::fused::sequential<double>;
template class braid::nn::fused::resnet<float>;
template class braid::nn::fused::resnet<double>;
template class braid::nn::fused::pipeline<braid::cuda::communicator, float>;
template class braid::nn::fused::pipeline<braid::cuda::communicator, double>;
