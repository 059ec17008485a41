// braid/cuda/process.cuh's host path (some ranks share a GPU): each round meets on the host, no
// kernel waits for a peer; the reduce kernel reads peers' pieces through IPC mappings (process.cuh's
// header comment describes the rounds).
#pragma once

#include "runtime.cuh"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../comm/communicator.hpp"
#include "../comm/options.hpp"
#include "../comm/validate.hpp"
#include "../core/error.hpp"
#include "../core/ops.hpp"
#include "../core/types.hpp"
#include "check.cuh"
#include "collectives.cuh"
#include "group_state.cuh"
#include "launcher.cuh"
#include "device.cuh"
#include "handles.cuh"
#include "ipc.cuh"
#include "process_state.cuh"
#include "kernel.cuh"
#include "process_layout.hpp"
#include "../schedule/call_word.hpp"

namespace braid::cuda::ipc_detail {

// One round's call, as every rank announces it (also the synchronisation point of the round): the
// call's description (schedule/call_word.hpp, compared whole), the round, and where the rank's input
// lies for peers that read it in place.
struct call_desc {
  braid::detail::call_description call;
  u64 round, in_off;
  std::int32_t in_reg, valid;
};
static_assert(std::is_trivially_copyable_v<call_desc>);

template <class T> struct sources {
  const T* p[max_ranks];
};

// Launched with process_options::threads (512) threads per block: the bound keeps ptxas within 128
// registers. The sources stay in the parameter space (grid constant), where reduce_copy reads them.
template <class T, class Op>
BRAID_KERNEL_BOUNDED(512) void reduce_kernel(const BRAID_GRID_CONSTANT sources<T> s, int ns, T* dst, T* dst2, u64 count, Op op,
                                             bool final, int nranks) {
  const u64 tid = static_cast<u64>(gpu::block_index()) * gpu::block_size() + gpu::thread_index();
  const u64 nthreads = static_cast<u64>(gpu::grid_size()) * gpu::block_size();
  cuda_detail::reduce_copy<T>(s.p, ns, dst, dst2, count, op, final, nranks, tid, nthreads);
}

// A device-to-device copy on `stream` (nothing for 0 bytes).
inline void copy(void* dst, const void* src, std::size_t bytes, cudaStream_t stream) {
  if (bytes) BRAID_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
}

template <collective c, class T, class Op>
void run_rounds(process_state& s, const T* in, T* out, std::size_t count, int root, const Op& op, cudaStream_t stream,
                const braid::detail::call_shape& sh, error_context& ctx) {
  using ipc_detail::u64;
  const int n = s.host.size(), r = s.host.rank();
  const auto un = static_cast<u64>(n);
  constexpr std::size_t E = sizeof(T);
  // The host's blocking steps, counted (process_stats::host_syncs).
  auto wait_stream = [&] {
    sync_stream(s, stream, ctx);
    ++s.stats.host_syncs;
  };
  auto host_barrier = [&] {
    s.host.barrier();
    ++s.stats.host_syncs;
  };
  if (n == 1) {
    if (sh.writes_out && !sh.in_place) copy(out, in, sh.out_n * E, stream);
    wait_stream();
    return;
  }
  const ipc_detail::half_layout L = ipc_detail::fit_layout(c, n, E, s.half, count);
  if (L.per == 0) raise(errc::unsupported, "staging memory too small for one element per rank", ctx);
  // Peers read this rank's input: all_reduce, reduce_scatter, all_gather; reduce's non-roots;
  // broadcast's root.
  const bool shared_in = c == collective::all_reduce || c == collective::reduce_scatter || c == collective::all_gather ||
                         (c == collective::reduce && r != root) || (c == collective::broadcast && r == root);
  const int in_reg = shared_in ? find_registration(s, in, sh.in_n * E) : -1;
  const auto in_base = in_reg >= 0 ? s.regs[static_cast<std::size_t>(in_reg)].mine : 0;
  const u64 rounds = (count + L.per - 1) / L.per;
  const u64 first = s.round; // round k of this call uses staging half (first + k) & 1
  const bool stages = shared_in && in_reg < 0;
  // (1) Round k's input slice, copied where peers can read it (its half of this rank's staging).
  auto stage = [&](u64 k, cudaStream_t st) {
    const u64 base = k * L.per, len = std::min<u64>(L.per, count - base);
    std::byte* to = static_cast<std::byte*>(s.staging.p) + ((first + k) & 1) * s.half + L.in_off;
    if constexpr (c == collective::reduce_scatter) {
      if (count * E <= s.max_pitch) {
        BRAID_CUDA_CHECK(cudaMemcpy2DAsync(to, len * E, in + base, count * E, len * E, un, cudaMemcpyDeviceToDevice, st));
      } else { // a pitch the 2D copy does not take: one copy per block
        for (u64 q = 0; q < un; ++q) copy(to + q * len * E, in + q * count + base, len * E, st);
      }
      s.stats.staged_bytes += len * E * un;
    } else {
      copy(to, in + base, len * E, st);
      s.stats.staged_bytes += len * E;
    }
  };
  // Round k + 1's staging runs on the side stream beside round k's reads. It may start once every
  // peer has entered round k (the all_gather below), which each does only after its reads of round
  // k - 1's inputs, the last reads of that half's input region (its result region is another
  // matter: see (4)); the caller's stream waits for it before the round's wait.
  // The side stream's work needs no wait for the caller's earlier work: the first wait below
  // covered all of it.
  auto stage_ahead = [&](u64 k) {
    if (!stages || k + 1 >= rounds) return;
    stage(k + 1, s.side.h);
    BRAID_CUDA_CHECK(cudaEventRecord(s.staged.e, s.side.h));
    BRAID_CUDA_CHECK(cudaStreamWaitEvent(stream, s.staged.e, 0));
    ++s.stats.staged_ahead;
  };
  if (stages) stage(0, stream);
  wait_stream(); // the caller's earlier work (the input) and round 0's staging
  std::vector<ipc_detail::call_desc> descs(un);
  for (u64 k = 0; k < rounds; ++k) {
    const u64 base = k * L.per, len = std::min<u64>(L.per, count - base);
    const u64 h = s.round++ & 1;
    ++s.stats.rounds;
    std::byte* mine = static_cast<std::byte*>(s.staging.p) + h * s.half;
    // (2) Announce the round; every rank checks that all make the same call.
    ipc_detail::call_desc d{};
    d.call = braid::detail::describe_call<T, Op>(c, algo::automatic, count, root, 0);
    d.round = k;
    d.in_reg = in_reg;
    d.in_off = in_reg >= 0 ? reinterpret_cast<std::uintptr_t>(in) - in_base : 0;
    d.valid = 1;
    s.host.all_gather(reinterpret_cast<const std::uint8_t*>(&d), reinterpret_cast<std::uint8_t*>(descs.data()), sizeof d);
    ++s.stats.host_syncs;
    bool any_reg = false;
    for (int q = 0; q < n; ++q) {
      const auto& o = descs[static_cast<std::size_t>(q)];
      if (o.call != d.call || o.round != d.round || !o.valid) {
        ctx.peer = q;
        raise(errc::mismatch, "rank " + std::to_string(q) + " called " + braid::detail::call_text(o.call) + " while this rank called " +
                                  braid::detail::call_text(d.call),
              ctx);
      }
      if (o.in_reg >= 0) {
        any_reg = true;
        if (q != r && (o.in_reg >= static_cast<std::int32_t>(s.regs.size()) || !s.regs[static_cast<std::size_t>(o.in_reg)].live))
          raise(errc::protocol, "rank " + std::to_string(q) + " named registration " + std::to_string(o.in_reg) + ", unknown here", ctx);
        if (q != r && o.in_off + sh.in_n * E > s.regs[static_cast<std::size_t>(o.in_reg)].peer_bytes[static_cast<std::size_t>(q)])
          raise(errc::protocol, "rank " + std::to_string(q) + "'s input runs past its registration", ctx);
      }
    }
    // Rank q's input element `elem` (index into its whole input), or element `staged` of its
    // staged slice.
    auto input_of = [&](int q, u64 elem, u64 staged) -> const T* {
      if (q == r) return in + elem;
      const auto& o = descs[static_cast<std::size_t>(q)];
      if (o.in_reg >= 0) {
        const registration& g = s.regs[static_cast<std::size_t>(o.in_reg)];
        return reinterpret_cast<const T*>(g.peer[static_cast<std::size_t>(q)] + o.in_off) + elem;
      }
      return reinterpret_cast<const T*>(s.peer_staging[static_cast<std::size_t>(q)] + h * s.half + L.in_off) + staged;
    };
    // Reduces the n pieces (rank order) of `m` elements into dst (and dst2).
    auto reduce_pieces = [&](ipc_detail::sources<T> src, u64 m, T* dst, T* dst2) {
      if (m == 0) return;
      if constexpr (std::is_invocable_v<const Op&, const accumulator_t<T, Op>&, const accumulator_t<T, Op>&>) {
        const bool engines = m * E >= s.opts.copy_engine_min_bytes;
        int slot = 0;
        for (int q = 0; q < n; ++q) {
          if (q == r) continue;
          if (engines && !s.same_gpu[static_cast<std::size_t>(q)]) {
            T* to = reinterpret_cast<T*>(mine + L.scratch_off + ipc_detail::round_up(L.piece_bytes, 256) * static_cast<u64>(slot));
            copy(to, src.p[q], m * E, stream);
            src.p[q] = to;
            s.stats.copy_engine_bytes += m * E;
          } else {
            s.stats.direct_read_bytes += m * E;
          }
          ++slot;
        }
        const auto blocks = static_cast<int>(ipc_detail::reduce_grid(m, E, s.opts.reduce_blocks, s.sms, s.opts.threads));
        s.stats.reduce_grid = static_cast<std::uint64_t>(blocks);
        BRAID_CUDA_CHECK(gpu::launch(&ipc_detail::reduce_kernel<T, Op>, static_cast<unsigned>(blocks),
                                     static_cast<unsigned>(s.opts.threads), 0, stream, src, n, dst, dst2, m, op, true, n));
      } else {
        raise(errc::internal, "reduction requested for an operator that does not reduce", ctx);
      }
    };
    // (3) Each collective's reads.
    if constexpr (c == collective::all_reduce) {
      const u64 sh_n = ipc_detail::shard_elems(len, n, E);
      auto shard = [&](int q, u64& lo) {
        lo = std::min<u64>(len, static_cast<u64>(q) * sh_n);
        return std::min<u64>(len, lo + sh_n) - lo;
      };
      u64 lo = 0;
      const u64 m = shard(r, lo);
      ipc_detail::sources<T> src{};
      for (int q = 0; q < n; ++q) src.p[q] = input_of(q, base + lo, lo);
      reduce_pieces(src, m, out + base + lo, reinterpret_cast<T*>(mine + L.res_off));
      stage_ahead(k);
      wait_stream();
      host_barrier();
      // (4) Everyone's reduced shard, from its staging memory. Not awaited here: a peer rewrites
      // that result only in round k + 2, after an all_gather this rank joins after the next
      // round's wait, which covers these copies.
      for (int q = 0; q < n; ++q) {
        if (q == r) continue;
        u64 qlo = 0;
        const u64 qm = shard(q, qlo);
        copy(out + base + qlo, s.peer_staging[static_cast<std::size_t>(q)] + h * s.half + L.res_off, qm * E, stream);
        s.stats.copy_engine_bytes += qm * E;
      }
      if (k + 1 == rounds) wait_stream();
    } else if constexpr (c == collective::reduce_scatter) {
      ipc_detail::sources<T> src{};
      for (int q = 0; q < n; ++q) src.p[q] = input_of(q, static_cast<u64>(r) * count + base, static_cast<u64>(r) * len);
      reduce_pieces(src, len, out + base, nullptr);
      stage_ahead(k);
      wait_stream();
      if (any_reg) host_barrier(); // peers read registered inputs in place until here
    } else if constexpr (c == collective::reduce) {
      if (r == root) {
        ipc_detail::sources<T> src{};
        for (int q = 0; q < n; ++q) src.p[q] = input_of(q, base, 0);
        reduce_pieces(src, len, out + base, nullptr);
      }
      stage_ahead(k);
      wait_stream();
      if (any_reg) host_barrier();
    } else if constexpr (c == collective::all_gather) {
      for (int q = 0; q < n; ++q) {
        T* to = out + static_cast<u64>(q) * count + base;
        if (q == r) {
          if (!sh.in_place) copy(to, in + base, len * E, stream);
          continue;
        }
        copy(to, input_of(q, base, 0), len * E, stream);
        s.stats.copy_engine_bytes += len * E;
      }
      stage_ahead(k);
      wait_stream();
      if (any_reg) host_barrier();
    } else if constexpr (c == collective::broadcast) {
      if (r != root) {
        copy(out + base, input_of(root, base, 0), len * E, stream);
        s.stats.copy_engine_bytes += len * E;
      } else if (!sh.in_place) {
        copy(out + base, in + base, len * E, stream);
      }
      stage_ahead(k);
      wait_stream();
      if (any_reg) host_barrier();
    }
  }
}

} // namespace braid::cuda::ipc_detail
