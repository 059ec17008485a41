// braid/nn/data.hpp — Fashion-MNIST from IDX files (gzipped, as Debian's dataset-fashion-mnist
// installs them), normalisation, random-crop and flip augmentation, and a distributed sampler.
#pragma once

#include <zlib.h>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <sys/stat.h>
#include <vector>

#include "tensor.hpp"

namespace braid::nn {

// The contents of one IDX file: unsigned bytes with their dimensions.
struct idx_file {
  std::vector<std::int64_t> dims;
  std::vector<std::uint8_t> data;
};

// Reads an IDX file of unsigned bytes (type code 0x08), gzipped or not (zlib reads both). Raises
// invalid_argument naming the file when it is missing, unreadable or malformed; `hint` is appended to
// the message for a missing file (say which package provides it).
inline idx_file read_idx(const std::string& path, const std::string& hint = {}) {
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0)
    raise(errc::invalid_argument, "cannot open " + path + ": " + std::strerror(errno) + (hint.empty() ? "" : " (" + hint + ")"));
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) raise(errc::invalid_argument, "cannot open " + path + ": " + std::strerror(errno));
  auto fail = [&](const std::string& why) {
    gzclose(f);
    raise(errc::invalid_argument, path + ": " + why);
  };
  auto read = [&](void* p, std::size_t n) {
    std::size_t got = 0;
    while (got < n) {
      const unsigned chunk = unsigned(std::min<std::size_t>(n - got, 1u << 30));
      const int r = gzread(f, static_cast<char*>(p) + got, chunk);
      if (r <= 0) fail("truncated or corrupt IDX file");
      got += std::size_t(r);
    }
  };
  std::uint8_t magic[4];
  read(magic, 4);
  if (magic[0] != 0 || magic[1] != 0 || magic[2] != 0x08 || magic[3] == 0 || magic[3] > 4)
    fail("not an IDX file of unsigned bytes");
  idx_file out;
  std::int64_t total = 1;
  for (int i = 0; i < magic[3]; ++i) {
    std::uint8_t b[4];
    read(b, 4);
    const std::int64_t d = (std::int64_t(b[0]) << 24) | (b[1] << 16) | (b[2] << 8) | b[3];
    out.dims.push_back(d);
    if (d != 0 && total > (std::int64_t(1) << 34) / d) fail("dimensions too large"); // before it could overflow
    total *= d;
  }
  try {
    out.data.resize(std::size_t(total));
  } catch (...) {
    gzclose(f);
    throw;
  }
  if (total) read(out.data.data(), std::size_t(total));
  gzclose(f);
  return out;
}

// Images [n, rows*cols] as bytes, and labels.
struct image_dataset {
  std::int64_t n = 0;
  int rows = 0, cols = 0;
  std::vector<std::uint8_t> pixels;
  std::vector<std::int32_t> labels;
  // The first k samples (for short runs and tests).
  image_dataset head(std::int64_t k) const {
    image_dataset d = *this;
    k = std::min(k, n);
    d.n = k;
    d.pixels.resize(std::size_t(k) * std::size_t(rows * cols));
    d.labels.resize(std::size_t(k));
    return d;
  }
};

inline constexpr const char* fashion_mnist_dir = "/usr/share/datasets/fashion-mnist";

// Loads the training (60000) or test (10000) split from `dir`, which holds
// {train,t10k}-{images-idx3,labels-idx1}-ubyte.gz (or the same names without .gz).
inline image_dataset load_fashion_mnist(bool train, const std::string& dir = fashion_mnist_dir) {
  const std::string stem = dir + "/" + (train ? "train" : "t10k");
  auto pick = [](const std::string& base) {
    struct stat st{};
    if (::stat((base + ".gz").c_str(), &st) != 0 && ::stat(base.c_str(), &st) == 0) return base;
    return base + ".gz";
  };
  const std::string hint = "Fashion-MNIST: install the Debian package dataset-fashion-mnist";
  idx_file img = read_idx(pick(stem + "-images-idx3-ubyte"), hint);
  idx_file lab = read_idx(pick(stem + "-labels-idx1-ubyte"), hint);
  if (img.dims.size() != 3 || lab.dims.size() != 1 || img.dims[0] != lab.dims[0])
    raise(errc::invalid_argument, stem + ": images and labels do not match");
  image_dataset d;
  d.n = img.dims[0];
  d.rows = int(img.dims[1]);
  d.cols = int(img.dims[2]);
  d.pixels = std::move(img.data);
  d.labels.assign(lab.data.begin(), lab.data.end());
  for (std::int32_t y : d.labels)
    if (y > 9) raise(errc::invalid_argument, stem + ": label out of range");
  return d;
}

// Mean and standard deviation of all pixels scaled to [0, 1].
inline std::pair<double, double> pixel_mean_std(const image_dataset& d) {
  double s = 0, s2 = 0;
  for (std::uint8_t p : d.pixels) {
    const double x = p / 255.0;
    s += x;
    s2 += x * x;
  }
  const double m = d.pixels.empty() ? 0 : s / double(d.pixels.size());
  const double v = d.pixels.empty() ? 1 : s2 / double(d.pixels.size()) - m * m;
  return {m, std::sqrt(std::max(v, 1e-12))};
}

// Augmentation: shift by a random crop of the image zero-padded by `pad` pixels on each side
// (offsets uniform in [-pad, pad]), then mirror left-right with probability 1/2.
struct augment {
  int pad = 0;
  bool flip = false;
};

// Builds a batch [k, 1, rows, cols] of float ((pixel/255 - mean) / std) and its labels from the
// samples `idx[0..k)`. Random choices come from `rng` only when `aug` asks for any, in sample order.
inline tensor make_batch(const image_dataset& d, const std::int64_t* idx, std::int64_t k, double mean, double stdev,
                         const augment& aug, std::mt19937_64& rng, std::vector<std::int32_t>& labels) {
  const int h = d.rows, w = d.cols;
  tensor x({k, 1, h, w});
  float* out = x.data<float>();
  labels.resize(std::size_t(k));
  const float a = float(1.0 / (255.0 * stdev)), b = float(-mean / stdev);
  for (std::int64_t i = 0; i < k; ++i) {
    const std::int64_t s = idx[i];
    if (s < 0 || s >= d.n) raise(errc::invalid_argument, "make_batch: sample index out of range");
    labels[std::size_t(i)] = d.labels[std::size_t(s)];
    const std::uint8_t* src = d.pixels.data() + s * h * w;
    float* dst = out + i * h * w;
    int dy = 0, dx = 0;
    bool mirror = false;
    if (aug.pad > 0) {
      dy = int(rng() % std::uint64_t(2 * aug.pad + 1)) - aug.pad;
      dx = int(rng() % std::uint64_t(2 * aug.pad + 1)) - aug.pad;
    }
    if (aug.flip) mirror = (rng() >> 63) != 0;
    for (int y = 0; y < h; ++y)
      for (int xx = 0; xx < w; ++xx) {
        const int sy = y + dy, sx0 = xx + dx;
        const int sx = mirror ? (w - 1 - sx0) : sx0;
        const bool inside = sy >= 0 && sy < h && sx0 >= 0 && sx0 < w;
        dst[y * w + xx] = (inside ? float(src[sy * w + sx]) : 0.0f) * a + b;
      }
  }
  return x;
}

// Splits [0, n) among `nranks` ranks for one epoch: a permutation drawn from (seed, epoch) (or the
// identity when shuffle is off), cut to a multiple of nranks (the last n % nranks samples of the
// permutation are dropped), rank r taking positions r, r + nranks, ... Shards are disjoint and of
// equal size n / nranks; every rank computes the same permutation without communicating.
class distributed_sampler {
public:
  distributed_sampler(std::int64_t n, int nranks, int rank, std::uint64_t seed, bool shuffle = true)
      : n_(n), k_(nranks), r_(rank), seed_(seed), shuffle_(shuffle) {
    if (n < 0 || nranks < 1 || rank < 0 || rank >= nranks)
      raise(errc::invalid_argument, "distributed_sampler: bad n, nranks or rank");
  }
  std::int64_t shard_size() const noexcept { return n_ / k_; }
  std::vector<std::int64_t> indices(std::int64_t epoch) const {
    std::vector<std::int64_t> perm(static_cast<std::size_t>(n_));
    for (std::int64_t i = 0; i < n_; ++i) perm[std::size_t(i)] = i;
    if (shuffle_) {
      std::seed_seq ss{std::uint32_t(seed_), std::uint32_t(seed_ >> 32), std::uint32_t(epoch),
                       std::uint32_t(std::uint64_t(epoch) >> 32)};
      std::mt19937_64 g(ss);
      for (std::int64_t i = n_ - 1; i > 0; --i) std::swap(perm[std::size_t(i)], perm[g() % std::uint64_t(i + 1)]);
    }
    std::vector<std::int64_t> mine;
    mine.reserve(std::size_t(shard_size()));
    for (std::int64_t i = r_; i < shard_size() * k_; i += k_) mine.push_back(perm[std::size_t(i)]);
    return mine;
  }

private:
  std::int64_t n_;
  int k_, r_;
  std::uint64_t seed_;
  bool shuffle_;
};

} // namespace braid::nn
