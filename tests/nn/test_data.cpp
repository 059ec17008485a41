// Data: the IDX reader (gzipped and plain, malformed, missing file), Fashion-MNIST as Debian installs
// it, normalisation and augmentation, the distributed sampler.
#include <doctest/doctest.h>

#include <braid/nn/data.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <set>
#include <string>
#include <filesystem>
#include <unistd.h>

using namespace braid::nn;

namespace {
std::string tmpdir() {
  std::string t = (std::filesystem::temp_directory_path() / "braid-nn-data-XXXXXX").string();
  REQUIRE(mkdtemp(t.data()) != nullptr);
  return t;
}
std::vector<std::uint8_t> idx_bytes(std::vector<std::uint32_t> dims, const std::vector<std::uint8_t>& data) {
  std::vector<std::uint8_t> b = {0, 0, 8, std::uint8_t(dims.size())};
  for (std::uint32_t d : dims)
    for (int s = 24; s >= 0; s -= 8) b.push_back(std::uint8_t(d >> s));
  b.insert(b.end(), data.begin(), data.end());
  return b;
}
void write_plain(const std::string& p, const std::vector<std::uint8_t>& b) {
  std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
}
void write_gz(const std::string& p, const std::vector<std::uint8_t>& b) {
  gzFile f = gzopen(p.c_str(), "wb");
  REQUIRE(f);
  REQUIRE(gzwrite(f, b.data(), unsigned(b.size())) == int(b.size()));
  gzclose(f);
}
} // namespace

TEST_CASE("IDX: gzipped and plain files, malformed files, missing files") {
  const std::string dir = tmpdir();
  std::vector<std::uint8_t> px(2 * 3 * 4);
  for (std::size_t i = 0; i < px.size(); ++i) px[i] = std::uint8_t(i * 7);
  write_gz(dir + "/a.gz", idx_bytes({2, 3, 4}, px));
  write_plain(dir + "/a", idx_bytes({2, 3, 4}, px));
  for (const char* name : {"/a.gz", "/a"}) {
    idx_file f = read_idx(dir + name);
    CHECK(f.dims == std::vector<std::int64_t>{2, 3, 4});
    CHECK(f.data == px);
  }
  std::vector<std::uint8_t> whole = idx_bytes({2, 3, 4}, px);
  write_plain(dir + "/short", std::vector<std::uint8_t>(whole.begin(), whole.begin() + 20));
  CHECK_THROWS_WITH_AS(read_idx(dir + "/short"), doctest::Contains("truncated"), braid::invalid_argument);
  write_plain(dir + "/bad", {1, 2, 3, 4, 5});
  CHECK_THROWS_WITH_AS(read_idx(dir + "/bad"), doctest::Contains("not an IDX"), braid::invalid_argument);

  // A directory without the files: the error names the missing file and the Debian package.
  try {
    load_fashion_mnist(true, dir);
    FAIL("no error");
  } catch (const braid::invalid_argument& e) {
    const std::string m = e.what();
    CHECK(m.find(dir + "/train-images-idx3-ubyte.gz") != std::string::npos);
    CHECK(m.find("dataset-fashion-mnist") != std::string::npos);
  }
  // Labels present but images absent for t10k: the images file is named.
  write_gz(dir + "/t10k-labels-idx1-ubyte.gz", idx_bytes({2}, {1, 2}));
  CHECK_THROWS_WITH_AS(load_fashion_mnist(false, dir), doctest::Contains("t10k-images-idx3-ubyte"), braid::invalid_argument);
  write_gz(dir + "/t10k-images-idx3-ubyte.gz", idx_bytes({2, 3, 4}, px));
  image_dataset d = load_fashion_mnist(false, dir);
  CHECK(d.n == 2);
  CHECK(d.rows == 3);
  CHECK(d.cols == 4);
  CHECK(d.labels == std::vector<std::int32_t>{1, 2});
  for (const char* f : {"/a.gz", "/a", "/short", "/bad", "/t10k-labels-idx1-ubyte.gz", "/t10k-images-idx3-ubyte.gz"})
    std::remove((dir + f).c_str());
  rmdir(dir.c_str());
}

TEST_CASE("Fashion-MNIST as dataset-fashion-mnist installs it") {
  // scripts/deps.sh installs the dataset: its absence is a broken setup, not a reason to pass.
  REQUIRE_MESSAGE(access((std::string(fashion_mnist_dir) + "/t10k-labels-idx1-ubyte.gz").c_str(), R_OK) == 0,
                  "dataset-fashion-mnist is not installed (scripts/deps.sh installs it)");
  image_dataset t = load_fashion_mnist(false);
  CHECK(t.n == 10000);
  CHECK(t.rows == 28);
  CHECK(t.cols == 28);
  std::vector<int> count(10);
  for (std::int32_t y : t.labels) ++count[std::size_t(y)];
  for (int c : count) CHECK(c == 1000); // the test split is balanced
  auto [m, s] = pixel_mean_std(t);
  CHECK(m > 0.25);
  CHECK(m < 0.32);
  CHECK(s > 0.3);
  CHECK(s < 0.4);
}

TEST_CASE("make_batch: normalisation, crop offsets and flips") {
  image_dataset d;
  d.n = 2;
  d.rows = 3;
  d.cols = 3;
  for (int i = 0; i < 18; ++i) d.pixels.push_back(std::uint8_t(10 * i));
  d.labels = {4, 7};
  std::mt19937_64 rng(1);
  std::vector<std::int32_t> y;
  const std::int64_t idx[2] = {1, 0};
  tensor x = make_batch(d, idx, 2, 0.5, 0.25, {}, rng, y);
  CHECK(y == std::vector<std::int32_t>{7, 4});
  CHECK(x.shape() == shape_t({2, 1, 3, 3}));
  CHECK(x.data<float>()[0] == doctest::Approx((90 / 255.0 - 0.5) / 0.25));
  CHECK(x.data<float>()[9 + 8] == doctest::Approx((80 / 255.0 - 0.5) / 0.25));

  // With padding 1 and flips, every output is the image shifted by (dy, dx) in [-1, 1]^2 (zeros
  // outside), possibly mirrored; over many draws all 18 variants appear.
  std::set<std::vector<float>> seen;
  const std::int64_t zero[1] = {0};
  for (int t = 0; t < 400; ++t) {
    tensor a = make_batch(d, zero, 1, 0.0, 1.0, augment{1, true}, rng, y);
    std::vector<float> v(a.data<float>(), a.data<float>() + 9);
    bool match = false;
    for (int dy = -1; dy <= 1; ++dy)
      for (int dx = -1; dx <= 1; ++dx)
        for (int mir = 0; mir < 2; ++mir) {
          bool ok = true;
          for (int r = 0; r < 3; ++r)
            for (int c = 0; c < 3; ++c) {
              const int sy = r + dy, sx0 = c + dx, sx = mir ? 2 - sx0 : sx0;
              const float want = (sy >= 0 && sy < 3 && sx0 >= 0 && sx0 < 3) ? float(d.pixels[std::size_t(sy * 3 + sx)]) / 255.0f : 0.0f;
              ok = ok && std::abs(v[std::size_t(r * 3 + c)] - want) < 1e-6f;
            }
          match = match || ok;
        }
    CHECK(match);
    seen.insert(v);
  }
  CHECK(seen.size() == 18);
}

TEST_CASE("distributed sampler: disjoint equal shards, reshuffled per epoch, deterministic") {
  const std::int64_t n = 103;
  for (int k : {1, 2, 3, 4}) {
    std::set<std::int64_t> all;
    for (int r = 0; r < k; ++r) {
      distributed_sampler s(n, k, r, 42);
      auto e0 = s.indices(0);
      CHECK(std::int64_t(e0.size()) == n / k);
      CHECK(e0 == distributed_sampler(n, k, r, 42).indices(0)); // same on every call and rank object
      CHECK(e0 != s.indices(1));                                 // a new order each epoch
      for (std::int64_t i : e0) CHECK(all.insert(i).second);     // disjoint
    }
    CHECK(std::int64_t(all.size()) == (n / k) * k);
  }
  // one rank with shuffle off: identity
  auto id = distributed_sampler(5, 1, 0, 1, false).indices(3);
  CHECK(id == std::vector<std::int64_t>{0, 1, 2, 3, 4});
  // the union over ranks of one epoch is the same permutation's prefix, whatever k
  CHECK(distributed_sampler(10, 2, 0, 7).indices(0)[1] == distributed_sampler(10, 1, 0, 7).indices(0)[2]);
  CHECK_THROWS_AS(distributed_sampler(10, 2, 2, 0), braid::invalid_argument);
}
