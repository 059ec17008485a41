// braid/nn/ops.hpp — the per-element arithmetic of braid::nn's hand-written layers, written once for
// the host loops (layers.hpp, loss.hpp) and the device kernels (layers_device.cuh): one text per layer
// where one text can serve.
//
// Each op is a small struct of pointers and sizes with a BRAID_HD operator()(i) that computes ONE
// output element i (host: a loop over i; device: one thread per i, grid-stride). An output element is
// never written by two i, and every sum an element needs is taken inside its own call in a fixed order,
// so the host and the device compute the same bits (same compiler and no contraction on the emulated
// device; on a GPU, nvcc may contract multiply-adds) and the device needs no atomics. Where a layer's
// natural loop scatters (pooling's and col2im's backward), the op gathers instead, adding each
// output's terms in the order a scatter loop would add them, so it gives that loop's bits.
//
// What is NOT here, and why: the GEMMs (conv2d and linear: a BLAS, cuBLAS on the device), the
// channel statistics of batchnorm2d (a reduction over N*H*W, which a GPU needs as a tree over a block,
// not as the host's sequential sum), the fast row-wise im2col of the host conv (std::copy runs; the
// device uses im2col below, element by element: both are tested against each other), and everything
// oneDNN does on the host.
#pragma once

// In five rooms (nn/ops/): common (the unroll pragma, the host loop), pool, conv, channels, loss.
#include "ops/common.hpp"
#include "ops/pool.hpp"
#include "ops/conv.hpp"
#include "ops/channels.hpp"
#include "ops/loss.hpp"
