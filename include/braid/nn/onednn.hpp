// braid/nn/onednn.hpp — conv2d<float> and batchnorm2d<float> on oneDNN (Debian: libdnnl-dev), used by
// layers.hpp where CMake found the library (it then defines BRAID_HAVE_DNNL=1 for braid::nn).
//
// The layer's API stays NCHW. Inside, the convolution runs in the layout oneDNN prefers for the
// shape (format_tag::any: a channel-blocked layout such as nChw16c on AVX-512), and the tensors are
// reordered at the convolution's edges: the input in, the output out, the weights in on each call
// (they change every step), the gradients likewise. Primitives and reorders are created once per
// input shape and thread count, and cached in the layer.
//
// Threads: Debian's oneDNN runs on OpenMP, whose thread count is a per-thread setting. braid's ranks
// are threads of one process, so each rank thread applies the count that blas::set_threads asked for
// (apply_threads, called before a primitive is created or run); with no such call OpenMP's default
// (OMP_NUM_THREADS, else the core count) holds.
#pragma once

#include "blas.hpp"
#include "tensor.hpp"

#include <oneapi/dnnl/dnnl.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>

// OpenMP's thread control (libgomp, which Debian's libdnnl links); weak so that a oneDNN built on
// another runtime links too. Declared as gcc's omp.h declares them.
extern "C" void omp_set_num_threads(int) noexcept __attribute__((weak));
extern "C" int omp_get_max_threads() noexcept __attribute__((weak));

namespace braid::nn::onednn {

using dnnl::memory;

inline dnnl::engine& cpu() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

// Applies blas::set_threads's count to the calling thread; returns the count oneDNN will use here.
inline int apply_threads() {
#if DNNL_CPU_THREADING_RUNTIME == DNNL_RUNTIME_OMP
  if (&omp_get_max_threads == nullptr || &omp_set_num_threads == nullptr) return 1;
  const int want = blas::detail::threads_per_rank().load(std::memory_order_relaxed);
  if (want > 0 && omp_get_max_threads() != want) omp_set_num_threads(want);
  return omp_get_max_threads();
#else
  return 0;
#endif
}

// The channel block of the layout oneDNN prefers for the trainer's convolutions (16: nChw16c on
// AVX-512, 8: nChw8c on AVX2), found by asking it for a 16-to-16-channel 3x3 convolution; 0 when it
// prefers neither. Networks whose channel counts are all multiples of it keep their activations in
// that layout between layers (resnet()).
inline int block() {
  static const int b = [] {
    using tag = memory::format_tag;
    const auto f32 = memory::data_type::f32;
    const memory::desc x({2, 16, 8, 8}, f32, tag::any), w({16, 16, 3, 3}, f32, tag::any);
    dnnl::convolution_forward::desc d(dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct, x, w,
                                      x, {1, 1}, {1, 1}, {1, 1});
    const memory::desc y = dnnl::convolution_forward::primitive_desc(d, cpu()).dst_desc();
    if (y == memory::desc({2, 16, 8, 8}, f32, tag::nChw16c)) return 16;
    if (y == memory::desc({2, 16, 8, 8}, f32, tag::nChw8c)) return 8;
    return 0;
  }();
  return b;
}
// The activation layout: plain NCHW, or channel-blocked by block() (same element count where the
// channel count is a multiple of the block).
inline memory::format_tag layout(bool blocked) {
  if (!blocked) return memory::format_tag::nchw;
  return block() == 16 ? memory::format_tag::nChw16c : memory::format_tag::nChw8c;
}

// A block of memory in oneDNN's layout `md`, backed by a pooled braid tensor.
inline memory pooled(const memory::desc& md, tensor& keep) {
  keep = tensor({std::int64_t((md.get_size() + sizeof(float) - 1) / sizeof(float))}, dtype::float32);
  return memory(md, cpu(), keep.raw());
}

// One edge between a user's plain tensor and the layout a primitive wants: a cached reorder, or
// nothing where the layouts agree.
struct edge {
  memory::desc user, inner;
  std::optional<dnnl::reorder> to_inner, to_user;
  edge() = default;
  edge(const memory::desc& u, const memory::desc& i, bool in, bool out) : user(u), inner(i) {
    if (u == i) return;
    if (in) to_inner.emplace(dnnl::reorder::primitive_desc(cpu(), u, cpu(), i));
    if (out) to_user.emplace(dnnl::reorder::primitive_desc(cpu(), i, cpu(), u));
  }
  bool same() const { return user == inner; }
  // The primitive's view of user data at p: p itself, or a reordered copy in `keep`.
  memory in(dnnl::stream& s, void* p, tensor& keep) const {
    memory u(user, cpu(), p);
    if (same()) return u;
    memory m = pooled(inner, keep);
    to_inner->execute(s, u, m);
    return m;
  }
  // Writes the primitive's result m (in the inner layout) to user data at p.
  void out(dnnl::stream& s, memory& m, void* p) const {
    memory u(user, cpu(), p);
    to_user->execute(s, m, u);
  }
};

// conv2d's float convolution: y = conv(x, w) + b, dx, dw, db; NCHW/OIHW at the edges.
class conv {
public:
  // in_blocked/out_blocked: x and dx, y and dy are in layout(true) instead of NCHW.
  conv(int c, int o, int k, int s, int p, bool bias, bool in_blocked = false, bool out_blocked = false)
      : c_(c), o_(o), k_(k), s_(s), p_(p), bias_(bias), in_(layout(in_blocked)), out_(layout(out_blocked)) {}

  // y (NCHW [n, o, ho, wo], allocated by the caller) from x (NCHW [n, c, h, w]).
  void forward(const tensor& x, const tensor& w, const tensor* b, tensor& y) {
    prepare(x);
    memory src = src_.in(strm_, x.raw(), src_keep_);
    memory wei = wfwd_.in(strm_, w.raw(), wkeep_);
    tensor dkeep;
    memory dst = dst_.same() ? memory(dst_.user, cpu(), y.raw()) : pooled(dst_.inner, dkeep);
    std::unordered_map<int, memory> args{{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, dst}};
    if (bias_) args.emplace(DNNL_ARG_BIAS, memory(bias_md(), cpu(), b->raw()));
    fwd_->execute(strm_, args);
    if (!dst_.same()) dst_.out(strm_, dst, y.raw());
    strm_.wait();
    src_fwd_ = src; // kept for backward-weights (in src_keep_ unless it is x itself)
    if (src_.same()) src_keep_ = x;
  }

  // dx (NCHW, allocated by the caller, overwritten) and dw, db (written: the caller adds them).
  void backward(const tensor& x, const tensor& w, const tensor& dy, tensor& dx, tensor& dw, tensor* db) {
    apply_threads();
    tensor k1, k2, k3, k4;
    // backward-weights: diff_dst and src in its layouts
    memory ddw = dyw_.in(strm_, dy.raw(), k1);
    memory srcw = src_bw_same_ ? src_fwd_ : srcw_.in(strm_, x.raw(), k2);
    memory dwm = dw_.same() ? memory(dw_.user, cpu(), dw.raw()) : pooled(dw_.inner, k3);
    std::unordered_map<int, memory> wargs{{DNNL_ARG_SRC, srcw}, {DNNL_ARG_DIFF_DST, ddw}, {DNNL_ARG_DIFF_WEIGHTS, dwm}};
    if (bias_) wargs.emplace(DNNL_ARG_DIFF_BIAS, memory(bias_md(), cpu(), db->raw()));
    bww_->execute(strm_, wargs);
    if (!dw_.same()) dw_.out(strm_, dwm, dw.raw());
    // backward-data
    memory ddd = dyd_same_ ? ddw : dyd_.in(strm_, dy.raw(), k4);
    memory wd = wbd_.in(strm_, w.raw(), wkeep_);
    tensor k6;
    memory dsrc = dx_.same() ? memory(dx_.user, cpu(), dx.raw()) : pooled(dx_.inner, k6);
    bwd_->execute(strm_, {{DNNL_ARG_DIFF_DST, ddd}, {DNNL_ARG_WEIGHTS, wd}, {DNNL_ARG_DIFF_SRC, dsrc}});
    if (!dx_.same()) dx_.out(strm_, dsrc, dx.raw());
    strm_.wait();
    src_fwd_ = memory();
    src_keep_ = tensor();
  }

  // Whether x/dx or y/dy are in layout(true).
  bool blocked() const { return in_ != memory::format_tag::nchw || out_ != memory::format_tag::nchw; }

  // The implementations oneDNN chose (for tests and logs): "fwd / bwd-data / bwd-weights".
  std::string impl() const {
    if (!fwd_) return "";
    return std::string(fwd_pd_.impl_info_str()) + " / " + bwd_pd_.impl_info_str() + " / " + bww_pd_.impl_info_str();
  }

private:
  memory::desc bias_md() const { return memory::desc({o_}, memory::data_type::f32, memory::format_tag::x); }

  void prepare(const tensor& x) {
    const int nthr = apply_threads();
    const memory::dims xd{x.dim(0), x.dim(1), x.dim(2), x.dim(3)};
    if (fwd_ && xd == xdims_ && nthr == nthr_) return;
    xdims_ = xd;
    nthr_ = nthr;
    using tag = memory::format_tag;
    const auto f32 = memory::data_type::f32;
    const std::int64_t ho = (x.dim(2) + 2 * p_ - k_) / s_ + 1, wo = (x.dim(3) + 2 * p_ - k_) / s_ + 1;
    const memory::dims wd{o_, c_, k_, k_}, yd{x.dim(0), o_, ho, wo}, st{s_, s_}, pad{p_, p_};
    const memory::desc xu(xd, f32, in_), wu(wd, f32, tag::oihw), yu(yd, f32, out_);
    const memory::desc xa(xd, f32, tag::any), wa(wd, f32, tag::any), ya(yd, f32, tag::any);
    const auto alg = dnnl::algorithm::convolution_direct;
    auto fd = bias_ ? dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, alg, xa, wa, bias_md(), ya,
                                                      st, pad, pad)
                    : dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, alg, xa, wa, ya, st, pad, pad);
    fwd_pd_ = dnnl::convolution_forward::primitive_desc(fd, cpu());
    dnnl::convolution_backward_data::desc bd(alg, xa, wa, ya, st, pad, pad);
    bwd_pd_ = dnnl::convolution_backward_data::primitive_desc(bd, cpu(), fwd_pd_);
    auto wdsc = bias_ ? dnnl::convolution_backward_weights::desc(alg, xa, wa, bias_md(), ya, st, pad, pad)
                      : dnnl::convolution_backward_weights::desc(alg, xa, wa, ya, st, pad, pad);
    bww_pd_ = dnnl::convolution_backward_weights::primitive_desc(wdsc, cpu(), fwd_pd_);
    fwd_.emplace(fwd_pd_);
    bwd_.emplace(bwd_pd_);
    bww_.emplace(bww_pd_);
    src_ = edge(xu, fwd_pd_.src_desc(), true, false);
    wfwd_ = edge(wu, fwd_pd_.weights_desc(), true, false);
    dst_ = edge(yu, fwd_pd_.dst_desc(), false, true);
    srcw_ = edge(xu, bww_pd_.src_desc(), true, false);
    src_bw_same_ = bww_pd_.src_desc() == fwd_pd_.src_desc();
    dyw_ = edge(yu, bww_pd_.diff_dst_desc(), true, false);
    dw_ = edge(wu, bww_pd_.diff_weights_desc(), false, true);
    dyd_ = edge(yu, bwd_pd_.diff_dst_desc(), true, false);
    dyd_same_ = bwd_pd_.diff_dst_desc() == bww_pd_.diff_dst_desc();
    wbd_ = edge(wu, bwd_pd_.weights_desc(), true, false);
    dx_ = edge(xu, bwd_pd_.diff_src_desc(), false, true);
  }

  int c_, o_, k_, s_, p_;
  bool bias_;
  memory::format_tag in_, out_;
  memory::dims xdims_;
  int nthr_ = -1;
  dnnl::stream strm_{cpu()};
  dnnl::convolution_forward::primitive_desc fwd_pd_;
  dnnl::convolution_backward_data::primitive_desc bwd_pd_;
  dnnl::convolution_backward_weights::primitive_desc bww_pd_;
  std::optional<dnnl::convolution_forward> fwd_;
  std::optional<dnnl::convolution_backward_data> bwd_;
  std::optional<dnnl::convolution_backward_weights> bww_;
  edge src_, wfwd_, dst_, srcw_, dyw_, dw_, dyd_, wbd_, dx_;
  bool src_bw_same_ = false, dyd_same_ = false;
  memory src_fwd_;
  tensor src_keep_, wkeep_;
};

// batchnorm2d's float normalisation, on NCHW data or in layout(true) (blocked: a JIT kernel, several
// times faster than oneDNN's NCHW kernel and braid's loops; docs/nn.md has the figures): training mode returns the batch mean and biased variance (the
// caller moves the running statistics), eval mode normalises with the given statistics.
class bnorm {
public:
  bnorm(int c, double eps, bool blocked = false) : c_(c), eps_(float(eps)), tag_(layout(blocked)) {}

  // y from x; mean and var: in training written (batch statistics), in eval read (running ones).
  void forward(const tensor& x, const tensor& gamma, const tensor& beta, bool training, tensor& mean, tensor& var,
               tensor& y) {
    prepare(x, training);
    std::unordered_map<int, memory> args = common_args(x, gamma, beta, mean, var);
    args.emplace(DNNL_ARG_DST, memory(data_, cpu(), y.raw()));
    fwd_->execute(strm_, args);
    strm_.wait();
  }

  // dx (written) and dgamma, dbeta (written: the caller adds them) for the forward's x, mean, var.
  // (oneDNN 2.6 wants the shift among backward's arguments too, though dx does not depend on it.)
  void backward(const tensor& x, const tensor& gamma, const tensor& beta, const tensor& mean, const tensor& var, const tensor& dy,
                tensor& dx, tensor& dgamma, tensor& dbeta) {
    apply_threads();
    const memory::desc s = stat_md();
    std::unordered_map<int, memory> args = common_args(x, gamma, beta, mean, var);
    args.emplace(DNNL_ARG_DIFF_DST, memory(data_, cpu(), dy.raw()));
    args.emplace(DNNL_ARG_DIFF_SRC, memory(data_, cpu(), dx.raw()));
    args.emplace(DNNL_ARG_DIFF_SCALE, memory(s, cpu(), dgamma.raw()));
    args.emplace(DNNL_ARG_DIFF_SHIFT, memory(s, cpu(), dbeta.raw()));
    bwd_->execute(strm_, args);
    strm_.wait();
  }

  // Whether x, y, dy and dx are in layout(true).
  bool blocked() const { return tag_ != memory::format_tag::nchw; }

  std::string impl() const { return fwd_ ? std::string(fwd_pd_.impl_info_str()) + " / " + bwd_pd_.impl_info_str() : ""; }

private:
  memory::desc stat_md() const { return memory::desc({c_}, memory::data_type::f32, memory::format_tag::x); }
  // The arguments forward and backward both take: x, and the scale, shift and statistics.
  std::unordered_map<int, memory> common_args(const tensor& x, const tensor& gamma, const tensor& beta, const tensor& mean,
                                              const tensor& var) const {
    const memory::desc s = stat_md();
    return {{DNNL_ARG_SRC, memory(data_, cpu(), x.raw())},
            {DNNL_ARG_SCALE, memory(s, cpu(), gamma.raw())},
            {DNNL_ARG_SHIFT, memory(s, cpu(), beta.raw())},
            {DNNL_ARG_MEAN, memory(s, cpu(), mean.raw())},
            {DNNL_ARG_VARIANCE, memory(s, cpu(), var.raw())}};
  }
  void prepare(const tensor& x, bool training) {
    const int nthr = apply_threads();
    const memory::dims xd{x.dim(0), x.dim(1), x.dim(2), x.dim(3)};
    if (fwd_ && xd == xdims_ && nthr == nthr_ && training == training_) return;
    xdims_ = xd;
    nthr_ = nthr;
    training_ = training;
    data_ = memory::desc(xd, memory::data_type::f32, tag_);
    using nf = dnnl::normalization_flags;
    nf flags = nf::use_scale | nf::use_shift;
    if (!training) flags = flags | nf::use_global_stats;
    dnnl::batch_normalization_forward::desc fd(dnnl::prop_kind::forward_training, data_, eps_, flags);
    fwd_pd_ = dnnl::batch_normalization_forward::primitive_desc(fd, cpu());
    dnnl::batch_normalization_backward::desc bd(dnnl::prop_kind::backward, data_, data_, eps_, flags);
    bwd_pd_ = dnnl::batch_normalization_backward::primitive_desc(bd, cpu(), fwd_pd_);
    fwd_.emplace(fwd_pd_);
    bwd_.emplace(bwd_pd_);
  }

  int c_;
  float eps_;
  memory::format_tag tag_;
  memory::dims xdims_;
  int nthr_ = -1;
  bool training_ = true;
  memory::desc data_;
  dnnl::stream strm_{cpu()};
  dnnl::batch_normalization_forward::primitive_desc fwd_pd_;
  dnnl::batch_normalization_backward::primitive_desc bwd_pd_;
  std::optional<dnnl::batch_normalization_forward> fwd_;
  std::optional<dnnl::batch_normalization_backward> bwd_;
};

} // namespace braid::nn::onednn
