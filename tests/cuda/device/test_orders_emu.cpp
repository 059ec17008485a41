// tests/cuda/device/test_orders_emu.cpp — the reduction orders of docs/guarantees.md ("Exact reduction
// order", CUDA backend) checked bit for bit against the one-process CUDA communicator, on the emulated
// CUDA device (braid::emu: the kernels' own text, compiled by the host compiler). The rule and the check
// are the host test's (tests/comm/orders_rule.hpp): the guarantee is that the kernels replay the host's
// schedules with the same rule, half = staging_bytes / 2 rounded up to a multiple of 4096.
//
// Every rank on an emulated GPU of its own (BRAID_EMU_DEVICES, set by CTest), so one thread enqueues
// every rank's call (a rank alone on its GPU does not wait on the host for the others). Sizes are
// scaled to the emulator: counts 1, 7, 1000 and 20011 at the default staging (one round; tree
// pipelines of 2 chunks; the large one read in place), 1000 at 8 KiB of staging (many rounds) and
// 20011 at 64 KiB (rounds of a few thousand elements: ring chunks and tree chunks move between
// rounds).
#include <braid/cuda.cuh>

#include "../../comm/orders_rule.hpp"

#include <cstdlib>

namespace {

using namespace orders_rule;

int emu_devices() {
  const char* s = std::getenv("BRAID_EMU_DEVICES");
  return s ? std::atoi(s) : 2;
}

// Runs every case of one staging size on n ranks of a one-process CUDA group, rank r on GPU r.
std::vector<outcome> run_cases_cuda(int n, u64 staging, const std::vector<u64>& counts) {
  using braid::algo;
  using braid::collective;
  std::vector<outcome> cases = every_case(n, staging, counts);
  braid::cuda::group_options go;
  go.base.staging_bytes = staging;
  go.threads_per_block = 64; // the emulator runs every thread; the order does not depend on the grid
  go.max_blocks_per_rank = 4;
  std::vector<int> devices;
  for (int r = 0; r < n; ++r) devices.push_back(r);
  std::vector<braid::cuda::communicator> comms = braid::cuda::create_group(devices, go);
  std::vector<cudaStream_t> streams(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) {
    REQUIRE(cudaSetDevice(r) == cudaSuccess);
    REQUIRE(cudaStreamCreate(&streams[static_cast<std::size_t>(r)]) == cudaSuccess);
  }
  for (auto& cs : cases) {
    cs.got.assign(static_cast<std::size_t>(n), {});
    const rule& ru = cs.ru;
    const bool rs = ru.c == collective::reduce_scatter;
    const u64 in_n = rs ? ru.count * static_cast<u64>(n) : ru.count;
    std::vector<float*> din(static_cast<std::size_t>(n)), dout(static_cast<std::size_t>(n));
    for (int r = 0; r < n; ++r) {
      const auto ur = static_cast<std::size_t>(r);
      REQUIRE(cudaSetDevice(r) == cudaSuccess);
      std::vector<float> in(in_n);
      for (u64 i = 0; i < in_n; ++i) in[i] = value(r, i);
      const std::vector<float> fill(ru.count, -0.0f);
      REQUIRE(cudaMalloc(reinterpret_cast<void**>(&din[ur]), in_n * sizeof(float)) == cudaSuccess);
      REQUIRE(cudaMalloc(reinterpret_cast<void**>(&dout[ur]), ru.count * sizeof(float)) == cudaSuccess);
      REQUIRE(cudaMemcpy(din[ur], in.data(), in_n * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
      REQUIRE(cudaMemcpy(dout[ur], fill.data(), ru.count * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
    }
    const braid::call_options co{ru.a};
    for (int r = 0; r < n; ++r) {
      const auto ur = static_cast<std::size_t>(r);
      braid::cuda::communicator& comm = comms[ur];
      auto call = [&](auto op) {
        if (ru.c == collective::all_reduce) comm.all_reduce(din[ur], dout[ur], ru.count, op, streams[ur], co);
        else if (ru.c == collective::reduce) comm.reduce(din[ur], dout[ur], ru.count, ru.root, op, streams[ur], co);
        else comm.reduce_scatter(din[ur], dout[ur], ru.count, op, streams[ur], co);
      };
      if (cs.k == opk::sum) call(braid::sum<>{});
      else call(minus{});
    }
    for (int r = 0; r < n; ++r) {
      const auto ur = static_cast<std::size_t>(r);
      REQUIRE(cudaSetDevice(r) == cudaSuccess);
      REQUIRE(cudaStreamSynchronize(streams[ur]) == cudaSuccess);
      comms[ur].check();
      if (ru.c != collective::reduce || r == ru.root) {
        std::vector<float> out(ru.count);
        REQUIRE(cudaMemcpy(out.data(), dout[ur], ru.count * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
        cs.got[ur] = std::move(out);
      }
      REQUIRE(cudaFree(din[ur]) == cudaSuccess);
      REQUIRE(cudaFree(dout[ur]) == cudaSuccess);
    }
  }
  for (int r = 0; r < n; ++r) {
    REQUIRE(cudaSetDevice(r) == cudaSuccess);
    REQUIRE(cudaStreamDestroy(streams[static_cast<std::size_t>(r)]) == cudaSuccess);
  }
  return cases;
}

} // namespace

TEST_CASE("reduction orders, CUDA communicator (emulated device): every algorithm follows docs/guarantees.md") {
  const int max_n = std::min(8, emu_devices());
  REQUIRE_MESSAGE(max_n >= 5, "BRAID_EMU_DEVICES must be at least 5 (CTest sets 8)");
  std::map<std::string, bool> alternative_differs;
  tally t;
  for (int n = 2; n <= max_n; ++n) {
    if (n == 6 || n == 7) continue; // 5 covers a non-power of two with a remainder; 8 the full butterfly
    for (const auto& [staging, counts] : {std::pair<u64, std::vector<u64>>{u64{8} << 20, {1, 7, 1000, 20011}},
                                          std::pair<u64, std::vector<u64>>{u64{8} << 10, {1000}},
                                          std::pair<u64, std::vector<u64>>{u64{64} << 10, {20011}}}) {
      for (const outcome& oc : run_cases_cuda(n, staging, counts)) check(oc, alternative_differs, t);
    }
  }
  MESSAGE(t.cases << " cases, " << t.elements << " output elements compared bit for bit (emulated device)");
  CHECK(t.cases > 0);
  for (const auto& [key, differs] : alternative_differs) {
    const bool must = key.find(" minus") != std::string::npos || key.find(" n=2 ") == std::string::npos;
    if (must) CHECK_MESSAGE(differs, key << ": no alternative order gives different bits on this data");
  }
}
