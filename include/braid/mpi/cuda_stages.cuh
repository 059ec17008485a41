// braid/mpi/cuda_stages.cuh — braid::mpi::cuda_communicator's collectives, stage by stage: within
// each host on its CUDA communicator, between hosts over MPI (host-staged or CUDA-aware), and the
// reduction of the pieces that come back. Included by mpi/cuda.cuh, which declares them.
#pragma once

#include "cuda.cuh"

namespace braid::mpi {

// dst[i] = finalize(op(piece_0[i], ..., piece_{H-1}[i])), pieces of m elements one after another.
// Host (staged) memory: braid's host reduction loop; device memory: process_communicator's reduce
// kernel on the side stream. Both accumulate in piece order in the operator's accumulator type.
template <class T, class Op> void cuda_communicator::reduce_pieces(const T* pieces, int H, std::size_t m, T* dst, const Op& op) {
  if (!m) return;
  if (!direct_) {
    std::vector<const T*> src(static_cast<std::size_t>(H));
    for (int j = 0; j < H; ++j) src[static_cast<std::size_t>(j)] = pieces + static_cast<std::size_t>(j) * m;
    reduce_n<T>(src.data(), H, dst, nullptr, m, op, true, hc_.layout.size);
    return;
  }
  cuda::ipc_detail::sources<T> src{};
  for (int j = 0; j < H; ++j) src.p[j] = pieces + static_cast<std::size_t>(j) * m;
  const unsigned threads = 256;
  const unsigned blocks = static_cast<unsigned>(std::min<std::size_t>(64, (m + threads - 1) / threads));
  const cuda::ipc_detail::u64 m64 = m; // the kernel's parameter type (a cast would be useless where it is size_t)
  BRAID_CUDA_CHECK(gpu::launch(&cuda::ipc_detail::reduce_kernel<T, Op>, blocks, threads, 0, side_.h, src, H, dst,
                               static_cast<T*>(nullptr), m64, op, true, hc_.layout.size));
  BRAID_CUDA_CHECK(cudaStreamSynchronize(side_.h));
}

// Across the members of `comm` (H, this one `me`): data[0, n) — host or device memory as MPI is
// handed it — becomes the reduction in member order of every member's data (two-shot, as
// communicator.hpp's cross_all_reduce).
template <class T, class Op> void cuda_communicator::cross_all_reduce(T* data, std::size_t n, MPI_Comm comm, int H, int me, const Op& op) {
  inter_host_check();
  const detail::piece_counts p = detail::split_pieces(n, H);
  const int mine = p.of(me);
  const detail::piece_counts in_p = detail::equal_pieces(H, mine);
  const std::size_t np = static_cast<std::size_t>(H) * static_cast<std::size_t>(mine);
  T* pieces = direct_ ? pieces_dev_.get<T>(np, done_.h) : host_staging<T>(np);
  const MPI_Datatype t = type_of(sizeof(T));
  BRAID_MPI_CHECK_CTX(MPI_Alltoallv(data, p.cnt.data(), p.off.data(), t, pieces, in_p.cnt.data(), in_p.off.data(), t, comm), ctx());
  reduce_pieces(pieces, H, static_cast<std::size_t>(mine), data + p.at(me), op);
  BRAID_MPI_CHECK_CTX(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data, p.cnt.data(), p.off.data(), t, comm), ctx());
}

// The inter-host all_reduce of device data[0, n), stream-ordered after the work on `stream` (the
// host waits for it), the result back in data before later work on `stream`.
template <class T, class Op> void cuda_communicator::cross_all_reduce_device(T* data, std::size_t n, cudaStream_t stream, const Op& op) {
  const host_layout& L = hc_.layout;
  if (direct_) {
    sync(stream);
    cross_all_reduce(data, n, hc_.cross.get(), L.hosts, L.host, op);
    return;
  }
  T* h = pinned_.get<T>(n, done_.h);
  d2h(h, data, n, stream);
  sync(stream);
  cross_all_reduce(h, n, hc_.cross.get(), L.hosts, L.host, op);
  h2d(data, h, n, stream);
}

template <class T, class Op> void cuda_communicator::do_all_reduce(const T* in, T* out, std::size_t count, const Op& op, cudaStream_t stream) {
  const host_layout& L = hc_.layout;
  if (count == 0) return;
  if (L.hosts == 1) return local_.all_reduce(in, out, count, op, stream);
  const detail::without_finalize<Op, T> part{op};
  if (!L.uniform) {
    T* buf = scratch_.get<T>(count, done_.h);
    local_.reduce(in, buf, count, 0, part, stream);
    if (L.local_rank == 0) cross_all_reduce_device(buf, count, stream, op);
    local_.broadcast(buf, out, count, 0, stream);
    return;
  }
  // Uniform: slice l of s = ceil(count / n) elements per local rank (zero-padded to n * s), as
  // communicator.hpp's. The slice goes through the inter-host step in chunks of c elements: chunk k
  // of every block is packed (n rows of c), reduce_scattered inside the host (rank l keeps its row:
  // the elements of its slice, reduced in the same order as by one reduce_scatter of the whole),
  // exchanged across hosts, all_gathered inside the host and unpacked into place.
  const std::size_t n = static_cast<std::size_t>(L.local_size);
  const std::size_t s = (count + n - 1) / n, padded = s * n;
  const std::size_t c = std::max<std::size_t>(1, std::min(s, chunk_bytes_ / sizeof(T)));
  const std::size_t K = (s + c - 1) / c;
  constexpr std::size_t depth = std::tuple_size_v<decltype(events_)>; // chunks in flight
  // Scratch: the padded copy (when count is not a multiple of n), `depth` packed chunks, the slice.
  const std::size_t pad_elems = padded == count ? 0 : padded;
  T* base = scratch_.get<T>(pad_elems + depth * n * c + s, done_.h);
  T* work = pad_elems ? base : nullptr;
  T* packed = base + pad_elems;
  T* slice = packed + depth * n * c;
  T* hslice = direct_ ? nullptr : pinned_.get<T>(s, done_.h);
  const T* src = in;
  T* dst = out;
  if (work) {
    d2d(work, in, count, stream);
    BRAID_CUDA_CHECK(cudaMemsetAsync(work + count, 0, (padded - count) * sizeof(T), stream));
    src = work;
    dst = work;
  }
  std::size_t enqueued = 0; // chunks whose intra-host reduce_scatter is on the stream
  auto enqueue = [&](std::size_t k) {
    enqueued = k + 1;
    const std::size_t o = k * c, w = std::min(c, s - o);
    T* pk = packed + (k % depth) * n * c;
    d2d_2d(pk, w, src + o, s, w, n, stream);
    local_.reduce_scatter(pk, slice + o, w, part, stream);
    if (!direct_) d2h(hslice + o, slice + o, w, stream);
    BRAID_CUDA_CHECK(cudaEventRecord(events_[k % depth].h, stream));
  };
  for (std::size_t k = 0; k < std::min(depth, K); ++k) enqueue(k);
  for (std::size_t k = 0; k < K; ++k) {
    const std::size_t o = k * c, w = std::min(c, s - o);
    sync_event(events_[k % depth].h);
    if (enqueued > k + 1) {
      ++stats_.ahead; // a later chunk's GPU work is queued beside this MPI step
      if (cudaEventQuery(events_[(k + 1) % depth].h) == cudaErrorNotReady) ++stats_.gpu_busy;
      (void)cudaGetLastError();
    }
    ++stats_.chunks;
    if (direct_) {
      cross_all_reduce(slice + o, w, hc_.cross.get(), L.hosts, L.host, op);
    } else {
      cross_all_reduce(hslice + o, w, hc_.cross.get(), L.hosts, L.host, op);
      h2d(slice + o, hslice + o, w, stream);
    }
    T* pk = packed + (k % depth) * n * c;
    local_.all_gather(slice + o, pk, w, stream);
    d2d_2d(dst + o, s, pk, w, w, n, stream);
    if (k + depth < K) enqueue(k + depth);
  }
  if (work) d2d(out, work, count, stream);
}

template <class T, class Op> void cuda_communicator::do_reduce_scatter(const T* in, T* out, std::size_t rc, const Op& op, cudaStream_t stream) {
  const host_layout& L = hc_.layout;
  if (rc == 0) return;
  if (L.hosts == 1) return local_.reduce_scatter(in, out, rc, op, stream);
  const detail::without_finalize<Op, T> part{op};
  const std::size_t H = static_cast<std::size_t>(L.hosts), N = static_cast<std::size_t>(L.size);
  const MPI_Datatype t = type_of(sizeof(T));
  if (L.uniform) {
    const std::size_t n = static_cast<std::size_t>(L.local_size), l = static_cast<std::size_t>(L.local_rank);
    T* packed = scratch_.get<T>(N * rc + H * rc, done_.h); // group g = blocks of ranks (0, g), ..., (H-1, g)
    T* pieces_d = packed + N * rc;
    for (std::size_t g = 0; g < n; ++g)
      for (std::size_t h = 0; h < H; ++h)
        d2d(packed + (g * H + h) * rc, in + static_cast<std::size_t>(L.members[h][g]) * rc, rc, stream);
    T* group = packed + l * H * rc;
    local_.reduce_scatter(packed, group, H * rc, part, stream);
    inter_host_check();
    if (direct_) {
      sync(stream);
      BRAID_MPI_CHECK_CTX(MPI_Alltoall(group, static_cast<int>(rc), t, pieces_d, static_cast<int>(rc), t, hc_.cross.get()), ctx());
      reduce_pieces(pieces_d, L.hosts, rc, out, op);
      return;
    }
    T* hg = pinned_.get<T>(2 * H * rc, done_.h);
    T* hres = hg + H * rc;
    d2h(hg, group, H * rc, stream);
    sync(stream);
    T* pieces = host_staging<T>(H * rc);
    BRAID_MPI_CHECK_CTX(MPI_Alltoall(hg, static_cast<int>(rc), t, pieces, static_cast<int>(rc), t, hc_.cross.get()), ctx());
    reduce_pieces(pieces, L.hosts, rc, hres, op);
    h2d(out, hres, rc, stream);
    return;
  }
  // Leaders: the host's partial of everything, then each leader reduces its own host's blocks.
  const std::size_t hn = static_cast<std::size_t>(L.local_size) * rc;
  T* buf = scratch_.get<T>(N * rc + hn, done_.h);
  T* host_result = buf + N * rc; // this host's blocks, by local rank
  local_.reduce(in, buf, N * rc, 0, part, stream);
  if (L.local_rank == 0) {
    inter_host_check();
    const detail::piece_counts out_p = detail::host_blocks(L, rc); // host h's ranks' blocks, to host h
    const int mine = out_p.of(L.host);
    const detail::piece_counts in_p = detail::equal_pieces(L.hosts, mine); // this host's blocks, from every host
    T* send = direct_ ? pieces_dev_.get<T>(N * rc + H * static_cast<std::size_t>(mine), done_.h) : pinned_.get<T>(N * rc + H * static_cast<std::size_t>(mine), done_.h);
    T* recv = send + N * rc;
    for (std::size_t h = 0, o = 0; h < H; ++h)
      for (int q : L.members[h]) {
        if (direct_) d2d(send + o, buf + static_cast<std::size_t>(q) * rc, rc, stream);
        else d2h(send + o, buf + static_cast<std::size_t>(q) * rc, rc, stream);
        o += rc;
      }
    sync(stream);
    if (direct_) {
      // recv lies in pieces_dev_ after send; reduce_pieces (device) reads it there.
      BRAID_MPI_CHECK_CTX(MPI_Alltoallv(send, out_p.cnt.data(), out_p.off.data(), t, recv, in_p.cnt.data(), in_p.off.data(), t, hc_.cross.get()), ctx());
      reduce_pieces(recv, L.hosts, static_cast<std::size_t>(mine), host_result, op);
    } else {
      T* hres = host_staging<T>(static_cast<std::size_t>(mine));
      BRAID_MPI_CHECK_CTX(MPI_Alltoallv(send, out_p.cnt.data(), out_p.off.data(), t, recv, in_p.cnt.data(), in_p.off.data(), t, hc_.cross.get()), ctx());
      reduce_pieces(recv, L.hosts, static_cast<std::size_t>(mine), hres, op);
      h2d(host_result, hres, static_cast<std::size_t>(mine), stream);
    }
  }
  local_.broadcast(host_result, host_result, hn, 0, stream);
  d2d(out, host_result + static_cast<std::size_t>(L.local_rank) * rc, rc, stream);
}

template <class T> void cuda_communicator::do_all_gather(const T* in, T* out, std::size_t sc, cudaStream_t stream) {
  const host_layout& L = hc_.layout;
  if (sc == 0) return;
  if (L.hosts == 1) return local_.all_gather(in, out, sc, stream);
  const std::size_t H = static_cast<std::size_t>(L.hosts), N = static_cast<std::size_t>(L.size);
  const MPI_Datatype t = type_of(sizeof(T));
  if (L.uniform) {
    const std::size_t n = static_cast<std::size_t>(L.local_size), l = static_cast<std::size_t>(L.local_rank);
    T* buf = scratch_.get<T>(N * sc, done_.h); // group g = blocks of ranks (0, g), ..., (H-1, g)
    T* group = buf + l * H * sc;
    inter_host_check();
    if (direct_) {
      sync(stream);
      BRAID_MPI_CHECK_CTX(MPI_Allgather(in, static_cast<int>(sc), t, group, static_cast<int>(sc), t, hc_.cross.get()), ctx());
    } else {
      T* h = pinned_.get<T>(sc + H * sc, done_.h);
      d2h(h, in, sc, stream);
      sync(stream);
      BRAID_MPI_CHECK_CTX(MPI_Allgather(h, static_cast<int>(sc), t, h + sc, static_cast<int>(sc), t, hc_.cross.get()), ctx());
      h2d(group, h + sc, H * sc, stream);
    }
    local_.all_gather(group, buf, H * sc, stream);
    for (std::size_t g = 0; g < n; ++g)
      for (std::size_t h = 0; h < H; ++h) d2d(out + static_cast<std::size_t>(L.members[h][g]) * sc, buf + (g * H + h) * sc, sc, stream);
    return;
  }
  const std::size_t hn = static_cast<std::size_t>(L.local_size) * sc;
  T* buf = scratch_.get<T>(hn + N * sc, done_.h);
  T* all = buf + hn; // blocks by (host, local rank)
  local_.all_gather(in, buf, sc, stream);
  if (L.local_rank == 0) {
    inter_host_check();
    const detail::piece_counts p = detail::host_blocks(L, sc);
    if (direct_) {
      sync(stream);
      BRAID_MPI_CHECK_CTX(MPI_Allgatherv(buf, static_cast<int>(hn), t, all, p.cnt.data(), p.off.data(), t, hc_.cross.get()), ctx());
    } else {
      T* h = pinned_.get<T>(hn + N * sc, done_.h);
      d2h(h, buf, hn, stream);
      sync(stream);
      BRAID_MPI_CHECK_CTX(MPI_Allgatherv(h, static_cast<int>(hn), t, h + hn, p.cnt.data(), p.off.data(), t, hc_.cross.get()), ctx());
      h2d(all, h + hn, N * sc, stream);
    }
  }
  local_.broadcast(all, all, N * sc, 0, stream);
  for (std::size_t h = 0, o = 0; h < H; ++h)
    for (int q : L.members[h]) {
      d2d(out + static_cast<std::size_t>(q) * sc, all + o, sc, stream);
      o += sc;
    }
}

// MPI_Bcast of device data[0, count) over the cross communicator from member `root`.
template <class T> void cuda_communicator::cross_broadcast(T* data, std::size_t count, int root, cudaStream_t stream) {
  const MPI_Datatype t = type_of(sizeof(T));
  const int c = static_cast<int>(count);
  if (direct_) {
    sync(stream);
    BRAID_MPI_CHECK_CTX(MPI_Bcast(data, c, t, root, hc_.cross.get()), ctx());
    return;
  }
  T* h = pinned_.get<T>(count, done_.h);
  if (hc_.layout.host == root) d2h(h, data, count, stream);
  sync(stream);
  BRAID_MPI_CHECK_CTX(MPI_Bcast(h, c, t, root, hc_.cross.get()), ctx());
  if (hc_.layout.host != root) h2d(data, h, count, stream);
}

template <class T> void cuda_communicator::do_broadcast(const T* in, T* out, std::size_t count, int root, cudaStream_t stream) {
  const host_layout& L = hc_.layout;
  if (count == 0) return;
  if (L.hosts == 1) return local_.broadcast(in, out, count, root, stream);
  const int rh = L.host_of[static_cast<std::size_t>(root)], rl = L.local_of[static_cast<std::size_t>(root)];
  if (L.uniform) {
    inter_host_check(); // every rank checks; the members of the root's local rank carry the data
    if (L.rank == root) d2d(out, in, count, stream);
    if (L.local_rank == rl) cross_broadcast(out, count, rh, stream);
    local_.broadcast(out, out, count, rl, stream);
    return;
  }
  // The leaders compare before the root's host moves anything: its other ranks only enqueue their
  // local broadcast, whose kernels must find a mismatch published rather than the root's data.
  if (L.local_rank == 0) inter_host_check();
  if (L.host == rh) local_.broadcast(in, out, count, rl, stream);
  if (L.local_rank == 0) cross_broadcast(out, count, rh, stream);
  if (L.host != rh) local_.broadcast(out, out, count, 0, stream);
}

} // namespace braid::mpi
