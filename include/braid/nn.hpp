// braid/nn.hpp — data-parallel training on top of braid's communicator: tensors and a caching memory
// pool, layers with explicit forward/backward, softmax cross-entropy, optimizers and schedules, DDP
// and mixed precision, pipeline (model) parallelism, Fashion-MNIST data, checkpoints. Needs a CBLAS
// and zlib (CMake: braid::nn). Not included by braid.hpp.
#pragma once

#include "nn/blas.hpp"
#include "nn/checkpoint.hpp"
#include "nn/data.hpp"
#include "nn/ddp.hpp"
#include "nn/layers.hpp"
#include "nn/loss.hpp"
#include "nn/optim.hpp"
#include "nn/pipeline.hpp"
#include "nn/tensor.hpp"
