// braid/nn/layers.hpp — layers with explicit forward and backward (no autograd engine), on the CPU.
//
// Every layer is a module<T> for T = float or double (double is what the gradient checks use). The
// contract of a module:
//   y  = forward(x)    keeps what backward needs (the input, masks, batch statistics);
//   dx = backward(dy)  for the last forward's x: returns dL/dx and ADDS dL/dparam into each
//                      parameter's grad (so gradients accumulate until zero_grad()); when a layer's
//                      parameter gradients are final for this backward it calls the grad hook (DDP uses
//                      it to start reducing a bucket while backward goes on), in the reverse of the
//                      order collect() lists them.
// Tensors are NCHW (images) or NF (features), row-major. Float convolutions run on oneDNN where it was
// found (BRAID_HAVE_DNNL; onednn.hpp); double ones, and all where it was not, go through im2col and
// BLAS gemm, as linear layers do; nothing calls a virtual function per element.
#pragma once

// In five rooms (nn/layers/): the module contract, conv2d, batchnorm2d, the simple layers, and the
// containers with resnet().
#include "layers/module.hpp"
#include "layers/conv.hpp"
#include "layers/norm.hpp"
#include "layers/basic.hpp"
#include "layers/containers.hpp"
