// braid/nn/onednn_side.hpp — the one place braid::nn's layers meet oneDNN. Where braid::nn was built
// with it (BRAID_HAVE_DNNL=1, and the compiler is not nvcc), detail::onednn_conv and onednn_bnorm are
// onednn.hpp's primitives; elsewhere they are stand-ins of the same shape that no layer ever creates,
// so conv2d and batchnorm2d are written once, with no #if: a float layer holds its oneDNN side where
// serves_onednn<T>, and runs its own loops where that side is absent.
#pragma once

#include <string>
#include <type_traits>

#include "../core/error.hpp"
#include "tensor.hpp"

// nvcc 13.0's front end stops with an internal error on oneDNN's dnnl.hpp: what nvcc compiles sees
// braid::nn without oneDNN (every layer on its im2col + BLAS path). Compile all of one program's
// translation units that use braid::nn with the same compiler (one definition of each layer).
#if defined(__CUDACC__) && BRAID_HAVE_DNNL
#undef BRAID_HAVE_DNNL
#define BRAID_HAVE_DNNL 0
#endif
#if BRAID_HAVE_DNNL
#include "onednn.hpp"
#endif

namespace braid::nn::detail {

#if BRAID_HAVE_DNNL
inline constexpr bool have_onednn = true;
using onednn_conv = onednn::conv;
using onednn_bnorm = onednn::bnorm;
// oneDNN's preferred channel block (onednn::block()); 0 where it prefers none.
inline int onednn_block() { return onednn::block(); }
#else
inline constexpr bool have_onednn = false;
[[noreturn]] inline void no_onednn() {
  raise(errc::internal, "braid::nn: a oneDNN primitive was used in a build without oneDNN");
}
// Stand-ins with onednn::conv's and onednn::bnorm's members; constructing one raises.
class onednn_conv {
public:
  onednn_conv(int, int, int, int, int, bool, bool = false, bool = false) { no_onednn(); }
  void forward(const tensor&, const tensor&, const tensor*, tensor&) { no_onednn(); }
  void backward(const tensor&, const tensor&, const tensor&, tensor&, tensor&, tensor*) { no_onednn(); }
  bool blocked() const { return false; }
  std::string impl() const { return ""; }
};
class onednn_bnorm {
public:
  onednn_bnorm(int, double, bool = false) { no_onednn(); }
  void forward(const tensor&, const tensor&, const tensor&, bool, tensor&, tensor&, tensor&) { no_onednn(); }
  void backward(const tensor&, const tensor&, const tensor&, const tensor&, const tensor&, const tensor&, tensor&, tensor&,
                tensor&) {
    no_onednn();
  }
  bool blocked() const { return false; }
  std::string impl() const { return ""; }
};
inline int onednn_block() { return 0; }
#endif

// Whether a layer of element type T runs on oneDNN by default: float layers, where it is built in.
template <class T> inline constexpr bool serves_onednn = have_onednn && std::is_same_v<T, float>;

} // namespace braid::nn::detail
