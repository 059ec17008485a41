// tests/nn/device/test_layers_device.cpp — nn/layers_device.cuh on the emulated CUDA device against the
// host layers of braid::nn (layers.hpp, loss.hpp), which run the same ops (nn/ops.hpp): ReLU, the
// residual add, max and average pooling with overlapping windows, global average pooling and softmax
// cross-entropy, forward and backward, bit for bit; and a double convolution assembled on the device
// from im2col, the emulated cuBLAS's DGEMM and col2im, against the host conv2d<double> (its im2col +
// BLAS path), forward and backward, within a few units in the last place (the GEMMs are laid out
// differently). Emulated device only: no GPU ran this.
#include <doctest/doctest.h>

#include <braid/emu/cublas.hpp>
#include <braid/nn/layers.hpp>
#include <braid/nn/layers_device.cuh>
#include <braid/nn/loss.hpp>

#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

using namespace braid::nn;

namespace {

#define EMU_OK(expr) REQUIRE_EQ((expr), cudaSuccess)

// A device copy of a host tensor (or of n elements), freed at scope end.
template <class T> struct dev {
  T* p = nullptr;
  std::int64_t n = 0;
  explicit dev(std::int64_t count) : n(count) { EMU_OK(cudaMalloc(reinterpret_cast<void**>(&p), std::size_t(count > 0 ? count : 1) * sizeof(T))); }
  explicit dev(const tensor& t) : dev(t.numel()) {
    EMU_OK(cudaMemcpy(p, t.data<T>(), std::size_t(n) * sizeof(T), cudaMemcpyHostToDevice));
    EMU_OK(cudaDeviceSynchronize());
  }
  ~dev() { cudaFree(p); }
  dev(const dev&) = delete;
  dev& operator=(const dev&) = delete;
  std::vector<T> host() const {
    std::vector<T> v(static_cast<std::size_t>(n));
    EMU_OK(cudaDeviceSynchronize());
    EMU_OK(cudaMemcpy(v.data(), p, v.size() * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
  }
};

template <class T> tensor random_tensor(shape_t s, std::mt19937_64& rng) {
  tensor t(s, braid::dtype_of_v<T>);
  std::normal_distribution<double> nd(0, 1);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data<T>()[i] = T(nd(rng));
  return t;
}
template <class T> bool same(const std::vector<T>& d, const tensor& h) {
  return std::int64_t(d.size()) == h.numel() && std::memcmp(d.data(), h.data<T>(), d.size() * sizeof(T)) == 0;
}

// A host layer's forward and backward on random inputs: x of shape s, y = forward(x), dy of y's
// shape, dx = backward(dy). The device code under test must reproduce y and dx.
struct host_pass {
  tensor x, y, dy, dx;
};
template <class T, class Layer> host_pass host_forward_backward(Layer& layer, shape_t s, std::mt19937_64& rng) {
  host_pass h;
  h.x = random_tensor<T>(s, rng);
  h.y = layer.forward(h.x);
  h.dy = random_tensor<T>(h.y.shape(), rng);
  h.dx = layer.backward(h.dy);
  return h;
}

struct stream_fixture {
  cudaStream_t s = nullptr;
  stream_fixture() { EMU_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~stream_fixture() {
    cudaStreamSynchronize(s);
    cudaStreamDestroy(s);
  }
};

template <bool Max> void check_pool(std::mt19937_64& rng, cudaStream_t s) {
  // Overlapping windows (3 x 3, stride 2) on 11 x 9 planes: the last column of windows is partial and dropped.
  pool2d<float, Max> layer(3, 2);
  const auto [x, y, dy, dx] = host_forward_backward<float>(layer, {2, 3, 11, 9}, rng);
  dev<float> dx_in(x), d_y(y.numel()), d_dy(dy), d_dx(x.numel());
  dev<std::int32_t> arg(y.numel());
  const ops::pool_shape g = fused::pool_geometry(6, 11, 9, 3, 2);
  CHECK(g.ho == 5);
  CHECK(g.wo == 4);
  fused::pool2d_forward<float, Max>(dx_in.p, d_y.p, arg.p, g, s);
  fused::pool2d_backward<float, Max>(d_dy.p, arg.p, d_dx.p, g, s);
  CHECK(same(d_y.host(), y));
  CHECK(same(d_dx.host(), dx));
}

} // namespace

TEST_CASE("device layers: ReLU, add, pooling, global average pooling and softmax cross-entropy give the host layers' bits") {
  std::mt19937_64 rng(7);
  stream_fixture f;
  {
    relu<float> layer;
    const auto [x, y, dy, dx] = host_forward_backward<float>(layer, {4, 5, 6, 7}, rng); // y and dy: x's shape
    dev<float> d_x(x), d_y(x.numel()), d_dy(dy), d_dx(x.numel());
    fused::relu_forward(d_x.p, d_y.p, x.numel(), f.s);
    fused::relu_backward(d_y.p, d_dy.p, d_dx.p, x.numel(), f.s);
    CHECK(same(d_y.host(), y));
    CHECK(same(d_dx.host(), dx));
    const tensor b = random_tensor<float>(x.shape(), rng);
    dev<float> d_b(b), d_sum(x.numel());
    fused::add(d_x.p, d_b.p, d_sum.p, x.numel(), f.s);
    CHECK(same(d_sum.host(), add<float>(x, b)));
  }
  check_pool<true>(rng, f.s);
  check_pool<false>(rng, f.s);
  {
    global_avgpool<double> layer;
    const auto [x, y, dy, dx] = host_forward_backward<double>(layer, {3, 4, 5, 6}, rng);
    dev<double> d_x(x), d_y(y.numel()), d_dy(dy), d_dx(x.numel());
    fused::global_avgpool_forward(d_x.p, d_y.p, 12, 30, f.s);
    fused::global_avgpool_backward(d_dy.p, d_dx.p, 12, 30, f.s);
    CHECK(same(d_y.host(), y));
    CHECK(same(d_dx.host(), dx));
  }
  {
    softmax_cross_entropy<float> ce;
    const tensor z = random_tensor<float>({37, 10}, rng);
    std::vector<std::int32_t> labels(37);
    for (std::size_t i = 0; i < labels.size(); ++i) labels[i] = std::int32_t((i * 7 + 3) % 10);
    const double loss = ce.forward(z, labels);
    const tensor g = ce.backward(0.5);
    dev<float> d_z(z), d_p(z.numel()), d_g(z.numel());
    dev<std::int32_t> d_labels(37), d_right(37);
    dev<double> d_loss(37);
    EMU_OK(cudaMemcpy(d_labels.p, labels.data(), labels.size() * sizeof(std::int32_t), cudaMemcpyHostToDevice));
    EMU_OK(cudaDeviceSynchronize());
    fused::softmax_ce_forward(d_z.p, d_labels.p, d_p.p, d_loss.p, d_right.p, 37, 10, f.s);
    fused::softmax_ce_backward(d_p.p, d_labels.p, d_g.p, 37, 10, 0.5, f.s);
    double total = 0;
    std::int64_t correct = 0;
    const std::vector<double> rows = d_loss.host();
    const std::vector<std::int32_t> right = d_right.host();
    for (std::size_t i = 0; i < rows.size(); ++i) {
      total += rows[i];
      correct += right[i];
    }
    CHECK(total / 37 == loss); // the same bits
    CHECK(correct == ce.correct());
    CHECK(same(d_g.host(), g));
  }
}

TEST_CASE("device convolution from im2col, DGEMM and col2im equals the host conv2d<double>") {
  std::mt19937_64 rng(11);
  stream_fixture f;
  for (const auto& [c, o, k, stride, pad, h, w] : std::vector<std::array<int, 7>>{{3, 4, 3, 1, 1, 8, 7}, {2, 5, 3, 2, 1, 9, 9}, {4, 3, 1, 2, 0, 6, 5}}) {
    std::mt19937_64 init(5);
    conv2d<double> layer(c, o, k, stride, pad, false, init);
    const int n = 2;
    const auto [x, y, dy, dx] = host_forward_backward<double>(layer, {n, c, h, w}, rng);
    const ops::conv_shape g = fused::conv_geometry(c, h, w, k, stride, pad);
    REQUIRE(g.ho == y.dim(2));
    REQUIRE(g.wo == y.dim(3));
    const int ck = c * k * k, hw = g.ho * g.wo;
    dev<double> d_x(x), d_w(layer.weight().value), d_y(y.numel()), d_dy(dy), d_dx(x.numel()), d_col(std::int64_t(ck) * hw),
        d_dw(std::int64_t(o) * ck);
    EMU_OK(cudaMemsetAsync(d_dw.p, 0, std::size_t(o) * std::size_t(ck) * sizeof(double), f.s));
    cublasHandle_t blas = nullptr;
    REQUIRE(cublasCreate(&blas) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublasSetStream(blas, f.s) == CUBLAS_STATUS_SUCCESS);
    const double one = 1, zero = 0;
    for (int i = 0; i < n; ++i) {
      const double* xi = d_x.p + std::int64_t(i) * c * h * w;
      double* yi = d_y.p + std::int64_t(i) * o * hw;
      const double* dyi = d_dy.p + std::int64_t(i) * o * hw;
      fused::im2col(xi, d_col.p, g, f.s);
      // Row-major y[o, hw] = W[o, ck] col[ck, hw]: column-major y^T = col^T W^T.
      REQUIRE(cublasDgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, hw, o, ck, &one, d_col.p, hw, d_w.p, ck, &zero, yi, hw) == CUBLAS_STATUS_SUCCESS);
      // dW[o, ck] += dy[o, hw] col^T: column-major dW^T = col dy^T... as (ck x o) = (ck x hw)(hw x o).
      REQUIRE(cublasDgemm(blas, CUBLAS_OP_T, CUBLAS_OP_N, ck, o, hw, &one, d_col.p, hw, dyi, hw, &one, d_dw.p, ck) == CUBLAS_STATUS_SUCCESS);
      // col = W^T dy: column-major col^T (hw x ck) = dy^T (hw x o) W (o x ck).
      REQUIRE(cublasDgemm(blas, CUBLAS_OP_N, CUBLAS_OP_T, hw, ck, o, &one, dyi, hw, d_w.p, ck, &zero, d_col.p, hw) == CUBLAS_STATUS_SUCCESS);
      fused::col2im(d_col.p, d_dx.p + std::int64_t(i) * c * h * w, g, f.s);
    }
    auto close = [](const std::vector<double>& a, const tensor& b) {
      double worst = 0;
      for (std::size_t i = 0; i < a.size(); ++i) {
        const double ref = b.data<double>()[i];
        worst = std::max(worst, std::abs(a[i] - ref) / std::max(std::abs(ref), 1e-300));
      }
      return worst;
    };
    const double ey = close(d_y.host(), y), edx = close(d_dx.host(), dx), edw = close(d_dw.host(), layer.weight().grad);
    MESSAGE("conv " << c << "->" << o << " k" << k << " s" << stride << ": max relative difference y " << ey << ", dx " << edx << ", dW " << edw);
    CHECK(ey < 1e-13);
    CHECK(edx < 1e-13);
    CHECK(edw < 1e-13);
    cublasDestroy(blas);
  }
}

TEST_CASE("device layers refuse shapes that give no output") {
  CHECK_THROWS_AS(fused::pool_geometry(1, 2, 2, 3, 1), braid::invalid_argument);
  CHECK_THROWS_AS(fused::pool_geometry(1, 4, 4, 2, 0), braid::invalid_argument);
  CHECK_THROWS_AS(fused::conv_geometry(1, 2, 2, 5, 1, 0), braid::invalid_argument);
  CHECK_THROWS_AS(fused::conv_geometry(0, 4, 4, 3, 1, 1), braid::invalid_argument);
  CHECK_THROWS_AS(fused::global_avgpool_forward<float>(nullptr, nullptr, 1, 0, nullptr), braid::invalid_argument);
  CHECK_THROWS_AS(fused::for_each(-1, ops::relu_forward<float>{nullptr, nullptr}, nullptr), braid::invalid_argument);
}

namespace {
// Batch-norm statistics and gradient sums on the device (a block per channel and group, ops.hpp's
// channel order) against the host batchnorm2d's hand-written path (op(c), one pass), for one shape.
template <class T> void bn_sums_case(std::int64_t n, std::int64_t C, std::int64_t h, std::int64_t w, bool training, std::mt19937_64& rng) {
  INFO("n ", n, " C ", C, " h ", h, " w ", w, std::string(training ? " training" : " evaluation"),
       std::string(sizeof(T) == 4 ? " float" : " double"));
  const tensor x = random_tensor<T>({n, C, h, w}, rng), dy = random_tensor<T>({n, C, h, w}, rng);
  const tensor gamma = random_tensor<T>({C}, rng);
  tensor rm = random_tensor<T>({C}, rng), rv({C}, braid::dtype_of_v<T>);
  for (std::int64_t c = 0; c < C; ++c) rv.data<T>()[c] = T(0.5 + 0.25 * double(c));
  const std::int64_t hw = h * w;
  // Host.
  tensor h_rm = rm.clone(), h_rv = rv.clone(), h_mu({C}, braid::dtype_of_v<T>), h_is({C}, braid::dtype_of_v<T>);
  ops::for_each_host(C, ops::bn_stats<T>{x.data<T>(), n, C, hw, 0.1, 1e-5, training, h_rm.data<T>(), h_rv.data<T>(),
                                         h_mu.data<T>(), h_is.data<T>()});
  tensor xhat = x.clone(); // any values serve as xhat for the gradient sums
  tensor h_dg = tensor::zeros({C}, braid::dtype_of_v<T>), h_db = tensor::zeros({C}, braid::dtype_of_v<T>), h_coef({3 * C}, braid::dtype_of_v<T>);
  ops::for_each_host(C, ops::bn_grad_sums<T>{dy.data<T>(), xhat.data<T>(), gamma.data<T>(), h_is.data<T>(), n, C, hw, h_dg.data<T>(),
                                             h_db.data<T>(), h_coef.data<T>()});
  // Device: this build's launch shape (fused::bn_stats), then the GPU's (256 threads, a block per
  // channel and group) and an odd one (64 threads, 3 blocks: each block several groups, grid-stride),
  // whatever this build's is. The results must not depend on it.
  stream_fixture f;
  const tensor zeros = tensor::zeros({C}, braid::dtype_of_v<T>);
  dev<T> d_x(x), d_dy(dy), d_gamma(gamma), d_xhat(xhat);
  dev<double> scratch(fused::bn_scratch_doubles(C));
  for (int shape = 0; shape < 3; ++shape) {
    INFO("launch shape ", shape);
    dev<T> d_rm(rm), d_rv(rv), d_mu(C), d_is(C), d_dg(zeros), d_db(zeros), d_coef(3 * C);
    const ops::bn_stats<T> st{d_x.p, n, C, hw, 0.1, 1e-5, training, d_rm.p, d_rv.p, d_mu.p, d_is.p};
    const ops::bn_grad_sums<T> gs{d_dy.p, d_xhat.p, d_gamma.p, d_is.p, n, C, hw, d_dg.p, d_db.p, d_coef.p};
    if (shape == 0) {
      fused::bn_stats(st, scratch.p, f.s);
      fused::bn_grad_sums(gs, scratch.p, f.s);
    } else {
      const unsigned block = shape == 1 ? 256u : 64u;
      const std::int64_t most = shape == 1 ? 4096 : 3;
      fused::detail::bn_stats_launch(st, scratch.p, f.s, block, most);
      fused::detail::bn_grad_sums_launch(gs, scratch.p, f.s, block, most);
    }
    EMU_OK(cudaStreamSynchronize(f.s));
    CHECK(same(d_mu.host(), h_mu));
    CHECK(same(d_is.host(), h_is));
    CHECK(same(d_rm.host(), h_rm));
    CHECK(same(d_rv.host(), h_rv));
    CHECK(same(d_dg.host(), h_dg));
    CHECK(same(d_db.host(), h_db));
    CHECK(same(d_coef.host(), h_coef));
  }
}
} // namespace

TEST_CASE("batch-norm sums on the device (a block per channel and group) equal the host's op(c), bit for bit") {
  std::mt19937_64 rng(41);
  // m = n*h*w per channel against the 4096 partials (16 groups of 256): below one group, at one, in
  // a few groups (the rest empty), at exactly 4096, and above it (each partial several elements:
  // 4805, 10619, 9800 with hw = 4900 > 4096, 12288 with hw = 64 dividing 4096); 1 element; several
  // channels.
  for (bool training : {true, false}) {
    bn_sums_case<float>(2, 3, 5, 7, training, rng);     // m = 70
    bn_sums_case<float>(4, 2, 8, 8, training, rng);     // m = 256
    bn_sums_case<float>(3, 5, 13, 11, training, rng);   // m = 429
    bn_sums_case<double>(8, 4, 14, 14, training, rng);  // m = 1568
    bn_sums_case<double>(1, 2, 1, 1, training, rng);    // m = 1
    bn_sums_case<float>(16, 2, 16, 16, training, rng);  // m = 4096
    bn_sums_case<float>(5, 3, 31, 31, training, rng);   // m = 4805
    bn_sums_case<double>(7, 2, 37, 41, training, rng);  // m = 10619
    bn_sums_case<float>(2, 2, 70, 70, training, rng);   // m = 9800, hw > 4096
    bn_sums_case<double>(192, 2, 8, 8, training, rng);  // m = 12288, hw divides 4096
  }
  // The order is not the plain running sum, nor a single block's 256 partials: on this data the sums
  // differ (so a kernel that summed in another of these orders could not pass the checks above by
  // accident of the data).
  const tensor x = random_tensor<double>({16, 1, 28, 28}, rng);
  double plain = 0;
  std::vector<double> part256(256);
  for (std::int64_t k = 0; k < x.numel(); ++k) {
    plain += x.data<double>()[k];
    part256[std::size_t(k % 256)] += x.data<double>()[k];
  }
  ops::channel_tree(part256.data(), 256);
  const double tree = ops::channel_sum<double>(ops::make_channel_walk(16, 1, 784), 0, ops::bn_stats<double>::value{x.data<double>()});
  CHECK(tree != plain);
  CHECK(tree != part256[0]);
  CHECK(std::fabs(tree - plain) <= 1e-9 * std::fabs(plain) + 1e-9);
}

TEST_CASE("ops::divider gives the quotient of every dividend tried") {
  std::mt19937_64 rng(43);
  const std::uint32_t most = 0x7fffffffu;
  std::vector<std::uint32_t> ds{1, 2, 3, 5, 7, 9, 25, 49, 196, 784, 1000, 4096, 100352, 12845056, 1u << 30, most - 1, most};
  for (int t = 0; t < 200; ++t) ds.push_back(std::uint32_t(rng() % most) + 1);
  for (std::uint32_t d : ds) {
    const ops::divider by = ops::divider::of(d);
    std::vector<std::uint32_t> ns{0, 1, d - 1, d, most, most - 1};
    if (d < most) ns.push_back(d + 1);
    for (std::uint32_t q : {1u, 2u, 3u, 1000u}) {
      if (std::uint64_t(q) * d <= most) {
        ns.push_back(q * d);
        ns.push_back(q * d - 1);
      }
    }
    for (int t = 0; t < 200; ++t) ns.push_back(std::uint32_t(rng() % (std::uint64_t(most) + 1)));
    for (std::uint32_t n : ns) {
      if (by.div(n) != n / d) {
        FAIL_CHECK("divider " << d << ": " << n << " / d = " << n / d << ", got " << by.div(n));
        break;
      }
    }
  }
}

TEST_CASE("batched im2col and col2im: the 32-bit path (make) copies and adds what the 64-bit path does, bit for bit") {
  std::mt19937_64 rng(44);
  stream_fixture f;
  struct geo {
    int n, c, h, w, k, s, pad;
  };
  for (const geo& q : {geo{3, 2, 7, 5, 3, 1, 1}, geo{2, 3, 9, 8, 3, 2, 1}, geo{2, 2, 6, 6, 1, 1, 0}, geo{1, 3, 11, 7, 5, 3, 2},
                       geo{4, 1, 5, 5, 2, 2, 0}, geo{2, 2, 4, 4, 4, 1, 3}}) {
    INFO("n ", q.n, " c ", q.c, " ", q.h, "x", q.w, " k ", q.k, " s ", q.s, " pad ", q.pad);
    const ops::conv_shape g = fused::conv_geometry(q.c, q.h, q.w, q.k, q.s, q.pad);
    const std::int64_t n = q.n, hw = std::int64_t(g.ho) * g.wo, ck = std::int64_t(q.c) * q.k * q.k;
    const tensor x = random_tensor<float>({n, q.c, q.h, q.w}, rng), col = random_tensor<float>({ck, n * hw}, rng);
    dev<float> d_x(x), d_col(col), wide_col(ck * n * hw), narrow_col(ck * n * hw), wide_dx(x.numel()), narrow_dx(x.numel());
    const auto im_fast = ops::im2col_batch<float>::make(d_x.p, narrow_col.p, g, n);
    const auto col_fast = ops::col2im_batch<float>::make(d_col.p, narrow_dx.p, g, n);
    CHECK(im_fast.narrow);
    CHECK(col_fast.narrow);
    fused::for_each(ck * n * hw, ops::im2col_batch<float>{d_x.p, wide_col.p, g, n}, f.s);
    fused::for_each(ck * n * hw, im_fast, f.s);
    fused::for_each(x.numel(), ops::col2im_batch<float>{d_col.p, wide_dx.p, g, n}, f.s);
    fused::for_each(x.numel(), col_fast, f.s);
    EMU_OK(cudaStreamSynchronize(f.s));
    const auto wc = wide_col.host(), nc = narrow_col.host(), wd = wide_dx.host(), nd = narrow_dx.host();
    CHECK(std::memcmp(wc.data(), nc.data(), wc.size() * sizeof(float)) == 0);
    CHECK(std::memcmp(wd.data(), nd.data(), wd.size() * sizeof(float)) == 0);
    // And the wide path is the per-image op im2col_at on the last image.
    const std::int64_t last = n - 1;
    for (std::int64_t r = 0; r < ck; ++r)
      for (std::int64_t j = 0; j < hw; ++j)
        if (wc[std::size_t(r * n * hw + last * hw + j)] != ops::im2col_at(x.data<float>() + last * q.c * q.h * q.w, g, r, int(j))) {
          FAIL_CHECK("im2col row " << r << " column " << j);
          r = ck;
          break;
        }
  }
}

// What decides these kernels' speed on a GPU (bench/results/h200-2026-11-27/8-bn-im2col-ab.txt: the
// change to the choices below made the ResNet-20 step 2.1x faster on an H200), asserted so that a
// change cannot lose it unseen: ResNet-20's convolutions on Fashion-MNIST at batch 128 and 512 take
// the 32-bit path, and the batch-norm sums of its 16, 32 and 64 channels launch a block per channel
// and group at the GPU's launch shape (not one per channel).
TEST_CASE("the speed-deciding choices: ResNet-20's convolutions take the 32-bit path, batch norm a block per channel and group") {
  struct conv {
    int c, h, k, s, pad;
  };
  // The stem, each stage's 3x3 convolutions, the strided ones and the 1x1 shortcuts (nn::resnet).
  for (const int n : {128, 512})
    for (const conv& q : {conv{1, 28, 3, 1, 1}, conv{16, 28, 3, 1, 1}, conv{16, 28, 3, 2, 1}, conv{32, 14, 3, 1, 1},
                          conv{32, 14, 3, 2, 1}, conv{64, 7, 3, 1, 1}, conv{16, 28, 1, 2, 0}, conv{32, 14, 1, 2, 0}}) {
      INFO("n ", n, " c ", q.c, " ", q.h, "x", q.h, " k ", q.k, " s ", q.s);
      const ops::conv_shape g = fused::conv_geometry(q.c, q.h, q.h, q.k, q.s, q.pad);
      CHECK(ops::im2col_batch<float>::make(nullptr, nullptr, g, n).narrow);
      CHECK(ops::col2im_batch<float>::make(nullptr, nullptr, g, n).narrow);
    }
  // The GPU's launch shape (at most 4096 blocks): C * 16 blocks for every channel count of ResNet-20,
  // so 256 to 1024 blocks over 132 SMs (one per channel gave 16 to 64).
  for (const std::int64_t C : {16, 32, 64}) CHECK(fused::detail::bn_blocks(C * ops::channel_groups, 4096) == C * ops::channel_groups);
  CHECK(ops::channel_groups == 16);
  CHECK(ops::channel_parts == 4096);
}
