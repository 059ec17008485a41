#include "backend.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <numeric>

#include <c10/util/Exception.h>

#include <braid/host/rendezvous/unique_id.hpp>

#include "cuda_path.hpp"

namespace braid_torch {

namespace {

std::size_t nbytes(const at::Tensor& t) { return static_cast<std::size_t>(t.numel()) * t.element_size(); }

// The tensor braid reads and writes: t itself when contiguous, else a contiguous copy that
// write_back() copies into t.
struct dense {
  at::Tensor t, d;
  explicit dense(const at::Tensor& x) : t(x), d(x.is_contiguous() ? x : x.contiguous()) {}
  void* data() const { return d.data_ptr(); }
  void write_back() const {
    if (!d.is_same(t)) t.copy_(d);
  }
};

std::exception_ptr as_backend_error(const std::string& what, int rank) {
  try {
    throw;
  } catch (const c10::Error&) {
    return std::current_exception();
  } catch (const std::exception& e) {
    return std::make_exception_ptr(c10::DistBackendError(
        c10::SourceLocation{__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
        "braid: " + what + " failed on rank " + std::to_string(rank) + ": " + e.what()));
  } catch (...) {
    return std::make_exception_ptr(c10::DistBackendError(
        c10::SourceLocation{__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
        "braid: " + what + " failed on rank " + std::to_string(rank) + " with an unknown exception"));
  }
}

// A channel operation's completion: finishes w with the operation's error, if any, as a
// DistBackendError naming w.
std::function<void(std::exception_ptr)> completes(const c10::intrusive_ptr<work>& w, int rank) {
  return [w, rank](std::exception_ptr e) {
    if (e) {
      try {
        std::rethrow_exception(e);
      } catch (...) {
        e = as_backend_error(w->what(), rank);
      }
    }
    w->complete(e);
  };
}

void check_one(const std::vector<at::Tensor>& ts, const char* what) {
  TORCH_CHECK(ts.size() == 1, "braid: ", what, " takes exactly one tensor per rank, got ", ts.size());
}

// A flat byte view of n bytes at p on device d.
at::Tensor blob(const void* p, std::size_t n, const at::Device& d) {
  return at::from_blob(const_cast<void*>(p), {static_cast<int64_t>(n)}, at::TensorOptions().dtype(at::kByte).device(d));
}

at::Tensor bytes_of(void* p, std::size_t n) {
  return at::from_blob(p, {static_cast<int64_t>(n)}, at::TensorOptions().dtype(at::kByte));
}

// The Gloo tag all_to_all's blocks between hosts travel with (above any tag a user is likely to pick;
// the group's collectives run in order, so one tag suffices).
constexpr int all_to_all_tag = 1 << 30;

} // namespace

braid::options braid_options(std::chrono::milliseconds timeout, bool small) {
  braid::options o = braid::options::from_env();
  if (timeout.count() > 0) o.timeout = timeout;
  if (small) o.staging_bytes = std::size_t{64} << 10; // point-to-point channels move data through p2p_bytes
  return o;
}

// Waits for `key` by polling: a blocking Store::wait holds the store's connection, so another thread
// of this process (a channel publishing its id) could not reach the store until it returned.
std::vector<uint8_t> await_key(const c10::intrusive_ptr<c10d::Store>& store, const std::string& key, std::chrono::milliseconds timeout,
                               const std::string& what) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  auto pause = std::chrono::microseconds(50);
  while (!store->check({key})) {
    if (std::chrono::steady_clock::now() >= until)
      C10_THROW_ERROR(DistBackendError, "braid: " + what + ": no peer published '" + key + "' within " + std::to_string(timeout.count()) + " ms");
    std::this_thread::sleep_for(pause);
    pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(5));
  }
  return store->get(key);
}

braid::communicator join_through_store(const c10::intrusive_ptr<c10d::Store>& store, const std::string& key, int rank, int size,
                                       const braid::options& o, std::chrono::milliseconds timeout, const std::string& what) {
  if (rank == 0) {
    const auto id = braid::unique_id::generate();
    if (size > 1) {
      const std::string s = id.to_string();
      store->set(key, std::vector<uint8_t>(s.begin(), s.end()));
    }
    return braid::communicator::join(id, 0, size, o);
  }
  const auto v = await_key(store, key, timeout, what);
  return braid::communicator::join(braid::unique_id::parse(std::string(v.begin(), v.end())), rank, size, o);
}

host_map host_map::make(std::vector<int> host_of) {
  host_map m;
  m.host_of = std::move(host_of);
  m.hosts = m.host_of.empty() ? 1 : 1 + *std::max_element(m.host_of.begin(), m.host_of.end());
  m.members.assign(static_cast<std::size_t>(m.hosts), {});
  for (int r = 0; r < static_cast<int>(m.host_of.size()); ++r) m.members[static_cast<std::size_t>(m.host_of[r])].push_back(r);
  for (auto& v : m.members) TORCH_CHECK(!v.empty(), "braid: host numbers must be dense (0..hosts-1)");
  return m;
}

// One direction between two ranks of one host, for one tag: a two-rank braid communicator (rank 0
// sends, rank 1 receives) and the thread its operations run on, in the order they were posted.
class channel {
public:
  channel(const c10::intrusive_ptr<c10d::Store>& store, const std::string& key, bool sender, std::chrono::milliseconds timeout) {
    runner_.post([this, store, key, sender, timeout] {
      try {
        comm_ = join_through_store(store, key, sender ? 0 : 1, 2, braid_options(timeout, true), timeout, "connecting a send/recv channel");
      } catch (...) {
        failure_ = std::current_exception();
      }
    });
  }
  ~channel() { runner_.stop(); }
  // Runs f(communicator) on the channel's thread; a failed connection is f's failure.
  void post(std::function<void(braid::communicator&)> f, std::function<void(std::exception_ptr)> done) {
    runner_.post([this, f = std::move(f), done = std::move(done)] {
      std::exception_ptr e = failure_;
      if (!e) {
        try {
          f(comm_);
        } catch (...) {
          e = std::current_exception();
        }
      }
      done(e);
    });
  }
  void abort() noexcept {
    try {
      if (comm_.valid()) comm_.abort();
    } catch (...) {
    }
  }

private:
  braid::communicator comm_;
  std::exception_ptr failure_;
  progress runner_; // last: stops first
};

backend::backend(c10::intrusive_ptr<c10d::Store> store, int rank, int size, std::chrono::milliseconds timeout,
                 std::vector<int> host_of, c10::intrusive_ptr<c10d::Backend> cross, c10::intrusive_ptr<c10d::Backend> world)
    : c10d::Backend(rank, size), store_(std::move(store)), timeout_(timeout), cross_(std::move(cross)), world_(std::move(world)) {
  TORCH_CHECK(static_cast<int>(host_of.size()) == size, "braid: host_of must name a host for each of the ", size, " ranks");
  map_ = host_map::make(std::move(host_of));
  host_ = map_.host_of[static_cast<std::size_t>(rank)];
  const auto& mine = map_.members[static_cast<std::size_t>(host_)];
  local_size_ = static_cast<int>(mine.size());
  local_rank_ = static_cast<int>(std::find(mine.begin(), mine.end(), rank) - mine.begin());
  TORCH_CHECK(map_.hosts == 1 || world_, "braid: a group over ", map_.hosts, " hosts needs the Gloo group between hosts");
  TORCH_CHECK(map_.hosts == 1 || local_rank_ != 0 || cross_, "braid: a host's first rank needs the Gloo group of hosts");
  if (const char* a = std::getenv("BRAID_ANY_SOURCE"); a && *a && std::string(a) != "0") any_source_ = true;
  const std::string key = "braid/uid/" + std::to_string(host_);
  try {
    local_ = join_through_store(store_, key, local_rank_, local_size_, braid_options(timeout_, false), timeout_,
                                "joining the ranks of host " + std::to_string(host_));
  } catch (const braid::error& e) {
    C10_THROW_ERROR(DistBackendError, std::string("braid: rank ") + std::to_string(rank) + " could not join its host's " +
                                          std::to_string(local_size_) + " ranks: " + e.what());
  }
}

backend::~backend() { shutdown(); }

void backend::abort() {
  try {
    if (local_.valid()) local_.abort();
  } catch (...) {
  }
  cuda_abort();
  std::lock_guard<std::mutex> lk(channels_m_);
  for (auto& [k, c] : channels_) c->abort();
}

void backend::shutdown() {
  if (shut_) return;
  shut_ = true;
  // Operations still queued or running when the group goes would wait for peers that may never come:
  // abort them, so that they (and the peers' matching calls) fail now instead of at the deadline.
  if (progress_.pending()) abort();
  progress_.stop();
  any_thread_.stop();
  remote_.stop();
  cuda_close();
  {
    std::lock_guard<std::mutex> lk(channels_m_);
    channels_.clear();
  }
  local_.close();
}

c10::intrusive_ptr<c10d::Work> backend::submit(c10d::OpType type, const char* what, std::vector<at::Tensor> outputs,
                                               bool async_op, std::optional<at::Device> device, body_fn body) {
  TORCH_CHECK(!shut_, "braid: ", what, ": the process group was shut down");
  if (device) return submit_cuda(type, what, std::move(outputs), async_op, *device, std::move(body));
  return enqueue(type, what, std::move(outputs), async_op, std::nullopt, [this, body = std::move(body)] {
    medium m{*this};
    body(m);
  });
}

c10::intrusive_ptr<c10d::Work> backend::enqueue(c10d::OpType type, const char* what, std::vector<at::Tensor> outputs, bool async_op,
                                                std::optional<c10::Stream> stream, std::function<void()> body) {
  const std::uint64_t n = ++calls_;
  auto w = c10::make_intrusive<work>(
      rank_, type, [what, n, r = rank_] { return std::string(what) + " (call " + std::to_string(n) + " of this group, rank " + std::to_string(r) + ")"; },
      std::move(outputs), stream);
  auto task = [w, body = std::move(body), r = rank_] {
    std::exception_ptr e;
    try {
      body();
    } catch (...) {
      e = as_backend_error(w->what(), r);
    }
    w->complete(e);
  };
  if (async_op) progress_.post(std::move(task));
  else progress_.run_or_post(std::move(task));
  return w;
}

// ---- between hosts ---------------------------------------------------------------------------------

void backend::hier_all_reduce(const reduce_plan& p, const void* in, void* out) {
  const std::size_t bytes = p.count * braid::size_of(p.type);
  reduce_plan local = p;
  if (local.op == reduction::avg) local.op = reduction::sum; // divided once, by the world size, below
  if (local_size_ > 1) typed_reduce(local_, local, in, out, 0);
  else if (in != out) std::memcpy(out, in, bytes);
  if (local_rank_ == 0) {
    at::Tensor all = at::empty({static_cast<int64_t>(bytes) * map_.hosts}, at::TensorOptions().dtype(at::kByte));
    std::vector<std::vector<at::Tensor>> outs(1);
    for (int h = 0; h < map_.hosts; ++h) outs[0].push_back(all.narrow(0, static_cast<int64_t>(bytes) * h, static_cast<int64_t>(bytes)));
    std::vector<at::Tensor> ins{bytes_of(out, bytes)};
    cross_->allgather(outs, ins)->wait();
    typed_combine(p, all.data_ptr(), static_cast<std::size_t>(map_.hosts), out, size_);
  }
  if (local_size_ > 1) local_.broadcast(static_cast<std::uint8_t*>(out), static_cast<std::uint8_t*>(out), bytes, 0);
}

void backend::hier_broadcast(void* data, std::size_t bytes, int root) {
  auto* b = static_cast<std::uint8_t*>(data);
  if (map_.hosts == 1) {
    local_.broadcast(b, b, bytes, root);
    return;
  }
  const int root_host = map_.host_of[static_cast<std::size_t>(root)];
  const auto& rm = map_.members[static_cast<std::size_t>(root_host)];
  const int root_local = static_cast<int>(std::find(rm.begin(), rm.end(), root) - rm.begin());
  if (host_ == root_host && local_size_ > 1) local_.broadcast(b, b, bytes, root_local);
  if (local_rank_ == 0) {
    std::vector<at::Tensor> ts{bytes_of(data, bytes)};
    c10d::BroadcastOptions o;
    o.rootRank = root_host;
    cross_->broadcast(ts, o)->wait();
  }
  if (host_ != root_host && local_size_ > 1) local_.broadcast(b, b, bytes, 0);
}

void backend::hier_all_gather(const void* in, void* out, std::size_t bytes) {
  auto* o = static_cast<std::uint8_t*>(out);
  const auto* i = static_cast<const std::uint8_t*>(in);
  if (map_.hosts == 1) {
    local_.all_gather(i, o, bytes);
    return;
  }
  std::size_t widest = 0;
  for (const auto& m : map_.members) widest = std::max(widest, m.size());
  // Each host's blocks, padded to the widest host, gathered between hosts, then put in rank order.
  at::Tensor mine = at::zeros({static_cast<int64_t>(widest * bytes)}, at::TensorOptions().dtype(at::kByte));
  if (local_size_ > 1) local_.all_gather(i, mine.data_ptr<std::uint8_t>(), bytes);
  else if (bytes) std::memcpy(mine.data_ptr(), i, bytes);
  if (local_rank_ == 0) {
    at::Tensor all = at::empty({static_cast<int64_t>(widest * bytes) * map_.hosts}, at::TensorOptions().dtype(at::kByte));
    std::vector<std::vector<at::Tensor>> outs(1);
    for (int h = 0; h < map_.hosts; ++h)
      outs[0].push_back(all.narrow(0, static_cast<int64_t>(widest * bytes) * h, static_cast<int64_t>(widest * bytes)));
    std::vector<at::Tensor> ins{mine};
    cross_->allgather(outs, ins)->wait();
    const auto* a = all.data_ptr<std::uint8_t>();
    for (int h = 0; h < map_.hosts; ++h)
      for (std::size_t k = 0; k < map_.members[static_cast<std::size_t>(h)].size(); ++k)
        if (bytes)
          std::memcpy(o + static_cast<std::size_t>(map_.members[static_cast<std::size_t>(h)][k]) * bytes,
                      a + (static_cast<std::size_t>(h) * widest + k) * bytes, bytes);
  }
  if (local_size_ > 1) local_.broadcast(o, o, bytes * static_cast<std::size_t>(size_), 0);
}

void backend::hier_barrier() {
  if (local_size_ > 1) local_.barrier();
  if (map_.hosts > 1) {
    if (local_rank_ == 0) cross_->barrier()->wait();
    if (local_size_ > 1) local_.barrier();
  }
}

// ---- the medium: host memory or device memory --------------------------------------------------------

std::optional<at::Device> backend::device_of(const std::vector<at::Tensor>& tensors, const char* what) const {
  if (tensors.empty()) return std::nullopt;
  const at::Device d = tensors[0].device();
  for (const auto& t : tensors) {
    TORCH_CHECK(t.layout() == at::kStrided, "braid: ", what, ": sparse tensors are not supported");
    TORCH_CHECK(t.device() == d, "braid: ", what, ": the tensors are on ", d.str(), " and ", t.device().str(),
                "; one operation's tensors must be on one device");
  }
  if (d.is_cpu()) return std::nullopt;
  TORCH_CHECK(d.is_cuda(), "braid: ", what, ": a tensor on ", d.str(), " was passed; braid serves CPU and CUDA tensors");
  TORCH_CHECK(cuda_built(), "braid: ", what, ": a tensor on ", d.str(),
              " was passed, and this build of braid_torch has no CUDA support (it was built without nvcc, or against a torch "
              "without CUDA): rebuild it where both are present, or use CPU tensors");
  return d;
}

at::TensorOptions backend::medium::bytes() const {
  const auto o = at::TensorOptions().dtype(at::kByte);
  return device ? o.device(*device) : o;
}

void backend::medium::staged(const void* in, std::size_t in_bytes, void* out, std::size_t out_bytes,
                             const std::function<void(medium&, const void*, void*)>& f) {
  // .cpu() and copy_ run on the current stream (the backend's, which waits for the caller's) and
  // return once the bytes have arrived.
  at::Tensor hin = in_bytes ? blob(in, in_bytes, *device).cpu() : at::empty({0}, at::kByte);
  at::Tensor hout = out == in ? hin : at::empty({static_cast<int64_t>(out_bytes)}, at::kByte);
  medium host{b};
  f(host, hin.data_ptr(), hout.data_ptr());
  if (out_bytes) blob(out, out_bytes, *device).copy_(hout);
}

void backend::medium::all_reduce(const reduce_plan& p, const void* in, void* out) {
  const std::size_t n = p.count * braid::size_of(p.type);
  if (device) {
    if (g && gpu::serves(p)) return gpu::all_reduce(*g, p, in, out, stream);
    return staged(in, n, out, n, [&](medium& h, const void* i, void* o) { h.all_reduce(p, i, o); });
  }
  if (b.map_.hosts == 1) typed_all_reduce(b.local_, p, in, out);
  else b.hier_all_reduce(p, in, out);
}

void backend::medium::reduce(const reduce_plan& p, const void* in, void* out, int root) {
  const std::size_t n = p.count * braid::size_of(p.type);
  if (device) {
    if (g && gpu::serves(p)) return gpu::reduce(*g, p, in, out, root, stream);
    return staged(in, n, out, n, [&](medium& h, const void* i, void* o) { h.reduce(p, i, o, root); });
  }
  if (b.map_.hosts == 1) return typed_reduce(b.local_, p, in, out, root);
  // Between hosts: an all_reduce whose result only the root keeps.
  at::Tensor result = at::empty({static_cast<int64_t>(n)}, at::kByte);
  b.hier_all_reduce(p, in, result.data_ptr());
  if (b.rank_ == root && n) std::memcpy(out, result.data_ptr(), n);
}

void backend::medium::reduce_scatter(const reduce_plan& p, const void* in, void* out) {
  const std::size_t per = p.count * braid::size_of(p.type), whole = per * static_cast<std::size_t>(b.size_);
  if (device) {
    if (g && gpu::serves(p)) return gpu::reduce_scatter(*g, p, in, out, stream);
    return staged(in, whole, out, per, [&](medium& h, const void* i, void* o) { h.reduce_scatter(p, i, o); });
  }
  if (b.map_.hosts == 1) return typed_reduce_scatter(b.local_, p, in, out);
  reduce_plan all_of = p;
  all_of.count = p.count * static_cast<std::size_t>(b.size_);
  at::Tensor all = at::empty({static_cast<int64_t>(whole)}, at::kByte);
  b.hier_all_reduce(all_of, in, all.data_ptr());
  if (per) std::memcpy(out, all.data_ptr<std::uint8_t>() + per * static_cast<std::size_t>(b.rank_), per);
}

void backend::medium::broadcast(void* data, std::size_t bytes, int root) {
  if (device) {
    if (g) return gpu::broadcast(*g, data, bytes, root, stream);
    return staged(data, bytes, data, bytes, [&](medium& h, const void*, void* o) { h.broadcast(o, bytes, root); });
  }
  b.hier_broadcast(data, bytes, root);
}

void backend::medium::all_gather(const void* in, void* out, std::size_t bytes) {
  if (device) {
    if (g) return gpu::all_gather(*g, in, out, bytes, stream);
    return staged(in, bytes, out, bytes * static_cast<std::size_t>(b.size_),
                  [&](medium& h, const void* i, void* o) { h.all_gather(i, o, bytes); });
  }
  b.hier_all_gather(in, out, bytes);
}

// ---- collectives -------------------------------------------------------------------------------------

namespace {
// The reduction of `src` into `out` (both contiguous, same shape): PREMUL_SUM scales first.
template <class F> void with_premul(const reduce_plan& p, const at::Tensor& src, F&& f) {
  if (p.premul && src.is_cuda()) {
    // On the device torch scales (in float for 16-bit types), each rank its own input.
    const at::Tensor scaled = at::mul(src, p.factor);
    f(scaled.data_ptr());
  } else if (p.premul) {
    at::Tensor scaled = at::empty_like(src);
    reduce_plan whole = p; // all of src: a reduce_scatter's input is size() times its plan's count
    whole.count = nbytes(src) / braid::size_of(p.type);
    typed_scale(whole, src.data_ptr(), scaled.data_ptr());
    f(scaled.data_ptr());
  } else {
    f(src.data_ptr());
  }
}
} // namespace

c10::intrusive_ptr<c10d::Work> backend::allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  check_one(tensors, "all_reduce");
  const reduce_plan p = plan_reduction(tensors[0], opts.reduceOp, "all_reduce");
  at::Tensor t = tensors[0];
  return submit(c10d::OpType::ALLREDUCE, "all_reduce", tensors, opts.asyncOp, device_of(tensors, "all_reduce"), [p, t](medium& m) {
    dense d(t);
    with_premul(p, d.d, [&](const void* in) { m.all_reduce(p, in, d.data()); });
    d.write_back();
  });
}

c10::intrusive_ptr<c10d::Work> backend::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                            const c10d::AllreduceCoalescedOptions& opts) {
  TORCH_CHECK(!tensors.empty(), "braid: all_reduce_coalesced: no tensors");
  std::vector<reduce_plan> plans;
  for (const auto& t : tensors) {
    TORCH_CHECK(t.scalar_type() == tensors[0].scalar_type(), "braid: all_reduce_coalesced: the tensors must have one dtype, got ",
                tensors[0].scalar_type(), " and ", t.scalar_type());
    plans.push_back(plan_reduction(t, opts.reduceOp, "all_reduce_coalesced"));
  }
  std::vector<at::Tensor> ts = tensors;
  return submit(c10d::OpType::ALLREDUCE_COALESCED, "all_reduce_coalesced", tensors, opts.asyncOp, device_of(tensors, "all_reduce_coalesced"),
                [plans, ts](medium& m) {
    std::vector<at::Tensor> flat;
    for (const auto& t : ts) flat.push_back(t.reshape({-1}));
    at::Tensor all = at::cat(flat);
    reduce_plan p = plans[0];
    p.count = 0;
    for (const auto& q : plans) p.count += q.count;
    with_premul(p, all, [&](const void* in) { m.all_reduce(p, in, all.data_ptr()); });
    int64_t at = 0;
    for (const auto& t : ts) {
      t.copy_(all.narrow(0, at, t.numel()).view(t.sizes()));
      at += t.numel();
    }
  });
}

c10::intrusive_ptr<c10d::Work> backend::broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) {
  check_one(tensors, "broadcast");
  TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < size_, "braid: broadcast: root ", opts.rootRank, " is not a rank of this group of ", size_);
  TORCH_CHECK(opts.rootTensor == 0, "braid: broadcast: rootTensor must be 0 (one tensor per rank)");
  at::Tensor t = tensors[0];
  const int root = static_cast<int>(opts.rootRank);
  return submit(c10d::OpType::BROADCAST, "broadcast", tensors, opts.asyncOp, device_of(tensors, "broadcast"), [t, root](medium& m) {
    dense d(t);
    m.broadcast(d.data(), nbytes(d.d), root);
    d.write_back();
  });
}

c10::intrusive_ptr<c10d::Work> backend::reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) {
  check_one(tensors, "reduce");
  TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < size_, "braid: reduce: root ", opts.rootRank, " is not a rank of this group of ", size_);
  const reduce_plan p = plan_reduction(tensors[0], opts.reduceOp, "reduce");
  at::Tensor t = tensors[0];
  const int root = static_cast<int>(opts.rootRank);
  return submit(c10d::OpType::REDUCE, "reduce", tensors, opts.asyncOp, device_of(tensors, "reduce"), [this, p, t, root](medium& m) {
    dense d(t);
    with_premul(p, d.d, [&](const void* in) { m.reduce(p, in, d.data(), root); });
    if (rank_ == root) d.write_back();
  });
}

c10::intrusive_ptr<c10d::Work> backend::allgather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                                  const c10d::AllgatherOptions& opts) {
  check_one(inputs, "all_gather");
  TORCH_CHECK(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == size_, "braid: all_gather: expected a list of ", size_,
              " output tensors");
  const at::Tensor in = inputs[0];
  for (const auto& o : outputs[0]) {
    TORCH_CHECK(o.numel() == in.numel() && o.scalar_type() == in.scalar_type(),
                "braid: all_gather: every output tensor must have the input's dtype and number of elements (", in.numel(), " of ",
                in.scalar_type(), "); got ", o.numel(), " of ", o.scalar_type(), " (uneven all_gather is not supported)");
  }
  std::vector<at::Tensor> outs = outputs[0], every = outs;
  every.push_back(in);
  return submit(c10d::OpType::ALLGATHER, "all_gather", outs, opts.asyncOp, device_of(every, "all_gather"), [this, in, outs](medium& m) {
    const at::Tensor src = in.contiguous();
    const std::size_t b = nbytes(src);
    at::Tensor all = at::empty({static_cast<int64_t>(b) * size_}, m.bytes());
    m.all_gather(src.data_ptr(), all.data_ptr(), b);
    for (int r = 0; r < size_; ++r) {
      at::Tensor block = all.narrow(0, static_cast<int64_t>(b) * r, static_cast<int64_t>(b)).view(src.scalar_type()).view(src.sizes());
      outs[static_cast<std::size_t>(r)].copy_(block);
    }
  });
}

c10::intrusive_ptr<c10d::Work> backend::_allgather_base(at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) {
  TORCH_CHECK(output.scalar_type() == input.scalar_type(), "braid: all_gather_into_tensor: output dtype ", output.scalar_type(),
              " differs from input dtype ", input.scalar_type());
  TORCH_CHECK(output.numel() == input.numel() * size_, "braid: all_gather_into_tensor: the output must hold ", size_, " x ",
              input.numel(), " elements, it holds ", output.numel());
  at::Tensor in = input, out = output;
  return submit(c10d::OpType::_ALLGATHER_BASE, "all_gather_into_tensor", {output}, opts.asyncOp,
                device_of({input, output}, "all_gather_into_tensor"), [in, out](medium& m) {
    const at::Tensor src = in.contiguous();
    dense d(out);
    m.all_gather(src.data_ptr(), d.data(), nbytes(src));
    d.write_back();
  });
}

c10::intrusive_ptr<c10d::Work> backend::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                            std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts) {
  TORCH_CHECK(static_cast<int>(outputs.size()) == size_, "braid: all_gather_coalesced: expected ", size_, " output lists");
  for (const auto& list : outputs) {
    TORCH_CHECK(list.size() == inputs.size(), "braid: all_gather_coalesced: every output list must have one tensor per input");
    for (std::size_t i = 0; i < list.size(); ++i) {
      TORCH_CHECK(list[i].numel() == inputs[i].numel() && list[i].scalar_type() == inputs[i].scalar_type(),
                  "braid: all_gather_coalesced: output ", i, " must match input ", i, " in dtype and number of elements");
    }
  }
  std::vector<at::Tensor> ins = inputs, flat_outs;
  for (const auto& l : outputs) flat_outs.insert(flat_outs.end(), l.begin(), l.end());
  std::vector<at::Tensor> every = flat_outs;
  every.insert(every.end(), ins.begin(), ins.end());
  auto outs = outputs;
  return submit(c10d::OpType::ALLGATHER_COALESCED, "all_gather_coalesced", flat_outs, opts.asyncOp,
                device_of(every, "all_gather_coalesced"), [this, ins, outs](medium& m) {
    std::vector<at::Tensor> parts;
    for (const auto& t : ins) parts.push_back(t.contiguous().reshape({-1}).view(at::kByte));
    const at::Tensor mine = parts.empty() ? at::empty({0}, m.bytes()) : at::cat(parts);
    const std::size_t b = nbytes(mine);
    at::Tensor all = at::empty({static_cast<int64_t>(b) * size_}, m.bytes());
    m.all_gather(mine.data_ptr(), all.data_ptr(), b);
    for (int r = 0; r < size_; ++r) {
      int64_t at = static_cast<int64_t>(b) * r;
      for (std::size_t i = 0; i < ins.size(); ++i) {
        const auto& o = outs[static_cast<std::size_t>(r)][i];
        const int64_t nb = static_cast<int64_t>(nbytes(o));
        o.copy_(all.narrow(0, at, nb).view(o.scalar_type()).view(o.sizes()));
        at += nb;
      }
    }
  });
}

c10::intrusive_ptr<c10d::Work> backend::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                                                        const c10d::AllgatherOptions& opts) {
  TORCH_CHECK(outputs.size() == inputs.size(), "braid: all_gather_into_tensor_coalesced: one output per input");
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    TORCH_CHECK(outputs[i].numel() == inputs[i].numel() * size_ && outputs[i].scalar_type() == inputs[i].scalar_type(),
                "braid: all_gather_into_tensor_coalesced: output ", i, " must hold ", size_, " x input ", i);
  }
  std::vector<at::Tensor> ins = inputs, outs = outputs, every = inputs;
  every.insert(every.end(), outputs.begin(), outputs.end());
  return submit(c10d::OpType::COALESCED, "all_gather_into_tensor_coalesced", outputs, opts.asyncOp,
                device_of(every, "all_gather_into_tensor_coalesced"), [ins, outs](medium& m) {
    for (std::size_t i = 0; i < ins.size(); ++i) {
      const at::Tensor src = ins[i].contiguous();
      dense d(outs[i]);
      m.all_gather(src.data_ptr(), d.data(), nbytes(src));
      d.write_back();
    }
  });
}

c10::intrusive_ptr<c10d::Work> backend::gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                               const c10d::GatherOptions& opts) {
  check_one(inputs, "gather");
  TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < size_, "braid: gather: root ", opts.rootRank, " is not a rank of this group of ", size_);
  const int root = static_cast<int>(opts.rootRank);
  const at::Tensor in = inputs[0];
  std::vector<at::Tensor> outs;
  if (rank_ == root) {
    TORCH_CHECK(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == size_, "braid: gather: the root needs a list of ", size_,
                " output tensors");
    for (const auto& o : outputs[0]) {
      TORCH_CHECK(o.numel() == in.numel() && o.scalar_type() == in.scalar_type(),
                  "braid: gather: every output tensor must have the input's dtype and number of elements");
    }
    outs = outputs[0];
  } else {
    TORCH_CHECK(outputs.empty() || (outputs.size() == 1 && outputs[0].empty()), "braid: gather: only the root passes output tensors");
  }
  std::vector<at::Tensor> every = outs;
  every.push_back(in);
  return submit(c10d::OpType::GATHER, "gather", outs, opts.asyncOp, device_of(every, "gather"), [this, in, outs, root](medium& m) {
    const at::Tensor src = in.contiguous();
    const std::size_t b = nbytes(src);
    at::Tensor all = at::empty({static_cast<int64_t>(b) * size_}, m.bytes());
    m.all_gather(src.data_ptr(), all.data_ptr(), b);
    if (rank_ == root)
      for (int r = 0; r < size_; ++r)
        outs[static_cast<std::size_t>(r)].copy_(
            all.narrow(0, static_cast<int64_t>(b) * r, static_cast<int64_t>(b)).view(src.scalar_type()).view(src.sizes()));
  });
}

c10::intrusive_ptr<c10d::Work> backend::scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ScatterOptions& opts) {
  check_one(outputs, "scatter");
  TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < size_, "braid: scatter: root ", opts.rootRank, " is not a rank of this group of ", size_);
  const int root = static_cast<int>(opts.rootRank);
  const at::Tensor out = outputs[0];
  std::vector<at::Tensor> ins;
  if (rank_ == root) {
    TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == size_, "braid: scatter: the root needs a list of ", size_,
                " input tensors");
    for (const auto& t : inputs[0]) {
      TORCH_CHECK(t.numel() == out.numel() && t.scalar_type() == out.scalar_type(),
                  "braid: scatter: every input tensor must have the output's dtype and number of elements");
    }
    ins = inputs[0];
  } else {
    TORCH_CHECK(inputs.empty() || (inputs.size() == 1 && inputs[0].empty()), "braid: scatter: only the root passes input tensors");
  }
  std::vector<at::Tensor> every = ins;
  every.push_back(out);
  return submit(c10d::OpType::SCATTER, "scatter", outputs, opts.asyncOp, device_of(every, "scatter"), [this, ins, out, root](medium& m) {
    const std::size_t b = nbytes(out);
    at::Tensor all = at::empty({static_cast<int64_t>(b) * size_}, m.bytes());
    if (rank_ == root)
      for (int r = 0; r < size_; ++r)
        all.narrow(0, static_cast<int64_t>(b) * r, static_cast<int64_t>(b))
            .copy_(ins[static_cast<std::size_t>(r)].contiguous().reshape({-1}).view(at::kByte));
    m.broadcast(all.data_ptr(), b * static_cast<std::size_t>(size_), root);
    out.copy_(all.narrow(0, static_cast<int64_t>(b) * rank_, static_cast<int64_t>(b)).view(out.scalar_type()).view(out.sizes()));
  });
}

c10::intrusive_ptr<c10d::Work> backend::_reduce_scatter_base(at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK(output.scalar_type() == input.scalar_type(), "braid: reduce_scatter_tensor: output dtype ", output.scalar_type(),
              " differs from input dtype ", input.scalar_type());
  TORCH_CHECK(input.numel() == output.numel() * size_, "braid: reduce_scatter_tensor: the input must hold ", size_, " x ",
              output.numel(), " elements, it holds ", input.numel());
  const reduce_plan p = plan_reduction(output, opts.reduceOp, "reduce_scatter_tensor");
  at::Tensor in = input, out = output;
  return submit(c10d::OpType::_REDUCE_SCATTER_BASE, "reduce_scatter_tensor", {output}, opts.asyncOp,
                device_of({input, output}, "reduce_scatter_tensor"), [p, in, out](medium& m) {
    const at::Tensor src = in.contiguous();
    dense d(out);
    with_premul(p, src, [&](const void* data) { m.reduce_scatter(p, data, d.data()); });
    d.write_back();
  });
}

c10::intrusive_ptr<c10d::Work> backend::reduce_scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                                       const c10d::ReduceScatterOptions& opts) {
  check_one(outputs, "reduce_scatter");
  TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == size_, "braid: reduce_scatter: expected a list of ", size_,
              " input tensors");
  const at::Tensor out = outputs[0];
  for (const auto& t : inputs[0]) {
    TORCH_CHECK(t.numel() == out.numel() && t.scalar_type() == out.scalar_type(),
                "braid: reduce_scatter: every input tensor must have the output's dtype and number of elements");
  }
  std::vector<at::Tensor> flat;
  for (const auto& t : inputs[0]) flat.push_back(t.reshape({-1}));
  at::Tensor cat = at::cat(flat); // copied now, on the caller's thread: the inputs are read before this returns
  at::Tensor o = outputs[0];
  return _reduce_scatter_base(o, cat, opts);
}

c10::intrusive_ptr<c10d::Work> backend::reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                                                        const c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK(outputs.size() == inputs.size(), "braid: reduce_scatter_tensor_coalesced: one output per input");
  c10::intrusive_ptr<c10d::Work> last;
  std::vector<c10::intrusive_ptr<c10d::Work>> all;
  for (std::size_t i = 0; i < inputs.size(); ++i) all.push_back(_reduce_scatter_base(outputs[i], inputs[i], opts));
  // One Work for the batch: the group's operations complete in order, so the last one completes last.
  std::vector<at::Tensor> outs = outputs;
  return submit(c10d::OpType::COALESCED, "reduce_scatter_tensor_coalesced", outs, true, std::nullopt, [all](medium&) {
    for (const auto& w : all) w->wait();
  });
}

c10::intrusive_ptr<c10d::Work> backend::barrier(const c10d::BarrierOptions& opts) {
  return submit(c10d::OpType::BARRIER, "barrier", {}, opts.asyncOp, std::nullopt, [this](medium&) { hier_barrier(); });
}

// ---- point to point ---------------------------------------------------------------------------------------

std::shared_ptr<channel> backend::channel_to(int src, int dst, const std::string& tag) {
  std::lock_guard<std::mutex> lk(channels_m_);
  auto& c = channels_[{src, dst, tag}];
  if (!c) c = std::make_shared<channel>(store_, "braid/p2p/" + std::to_string(src) + "/" + std::to_string(dst) + "/" + tag,
                                        src == rank_, timeout_);
  return c;
}

c10::intrusive_ptr<c10d::Work> backend::send(std::vector<at::Tensor>& tensors, int dst, int tag) {
  check_one(tensors, "send");
  require_cpu(tensors[0], "send");
  TORCH_CHECK(dst >= 0 && dst < size_ && dst != rank_, "braid: send: destination ", dst, " is not another rank of this group of ", size_);
  const at::Tensor t = tensors[0].contiguous();
  if (map_.host_of[static_cast<std::size_t>(dst)] != host_) { // another host: Gloo's send, its Work as it is
    std::vector<at::Tensor> ts{t};
    return world_->send(ts, dst, tag);
  }
  auto w = c10::make_intrusive<work>(
      rank_, c10d::OpType::SEND,
      [dst, tag, r = rank_] { return "send to rank " + std::to_string(dst) + " (tag " + std::to_string(tag) + ", rank " + std::to_string(r) + ")"; },
      tensors);
  if (any_source_) {
    // Announced here, before the channel connects: a receiver from any source connects only the
    // channels whose messages it was told of.
    const std::string box = "braid/any/" + std::to_string(dst) + "/" + std::to_string(tag);
    const auto k = store_->add(box, 1);
    const std::string me = std::to_string(rank_);
    store_->set(box + "/" + std::to_string(k), std::vector<uint8_t>(me.begin(), me.end()));
  }
  channel_to(rank_, dst, std::to_string(tag))->post(
      [t](braid::communicator& c) {
        c.send(static_cast<const std::uint8_t*>(t.data_ptr()), nbytes(t), 1);
      },
      completes(w, rank_));
  return w;
}

c10::intrusive_ptr<c10d::Work> backend::recv(std::vector<at::Tensor>& tensors, int src, int tag) {
  check_one(tensors, "recv");
  require_cpu(tensors[0], "recv");
  TORCH_CHECK(src >= 0 && src < size_ && src != rank_, "braid: recv: source ", src, " is not another rank of this group of ", size_);
  auto w = c10::make_intrusive<work>(
      rank_, c10d::OpType::RECV,
      [src, tag, r = rank_] { return "recv from rank " + std::to_string(src) + " (tag " + std::to_string(tag) + ", rank " + std::to_string(r) + ")"; },
      tensors);
  const at::Tensor t = tensors[0];
  if (map_.host_of[static_cast<std::size_t>(src)] != host_) { // another host: Gloo's recv
    auto d = std::make_shared<dense>(t);
    std::vector<at::Tensor> ts{d->d};
    auto inner = world_->recv(ts, src, tag);
    if (d->d.is_same(t)) return inner;
    remote_.post([w, inner, d, r = rank_] { // copied into the non-contiguous tensor once it arrived
      std::exception_ptr e;
      try { inner->wait(); d->write_back(); } catch (...) { e = as_backend_error(w->what(), r); }
      w->complete(e);
    });
    return w;
  }
  if (any_source_) {
    std::lock_guard<std::mutex> lk(any_m_);
    ++any_[tag].skip[src];
  }
  auto d = std::make_shared<dense>(t);
  channel_to(src, rank_, std::to_string(tag))->post(
      [d](braid::communicator& c) {
        c.recv(static_cast<std::uint8_t*>(d->data()), nbytes(d->d), 0);
        d->write_back();
      },
      completes(w, rank_));
  return w;
}

c10::intrusive_ptr<c10d::Work> backend::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  check_one(tensors, "recv from any source");
  require_cpu(tensors[0], "recv from any source");
  TORCH_CHECK(any_source_, "braid: recv from any source needs BRAID_ANY_SOURCE=1 in the environment of every rank of the group ",
              "(each send then announces itself through the store, which costs it two store round trips)");
  TORCH_CHECK(map_.hosts == 1, "braid: recv from any source is not supported across hosts (this group spans ", map_.hosts, ")");
  auto w = c10::make_intrusive<work>(
      rank_, c10d::OpType::RECVANYSOURCE,
      [tag, r = rank_] { return "recv from any source (tag " + std::to_string(tag) + ", rank " + std::to_string(r) + ")"; }, tensors);
  auto d = std::make_shared<dense>(tensors[0]);
  any_thread_.post([this, w, d, tag] {
    const std::string box = "braid/any/" + std::to_string(rank_) + "/" + std::to_string(tag);
    int src = -1;
    try {
      for (;;) {
        std::uint64_t k;
        {
          std::lock_guard<std::mutex> lk(any_m_);
          k = any_[tag].next++;
        }
        const std::string key = box + "/" + std::to_string(k);
        const auto v = await_key(store_, key, timeout_, w->what());
        store_->deleteKey(key);
        const int from = std::stoi(std::string(v.begin(), v.end()));
        std::lock_guard<std::mutex> lk(any_m_);
        auto& skip = any_[tag].skip[from];
        if (skip > 0) { // a receive naming this source takes this message
          --skip;
          continue;
        }
        src = from;
        break;
      }
    } catch (...) {
      w->complete(as_backend_error(w->what(), rank_));
      return;
    }
    w->set_source(src);
    std::mutex m;
    std::condition_variable cv;
    bool done = false;
    channel_to(src, rank_, std::to_string(tag))->post(
        [d](braid::communicator& c) {
          c.recv(static_cast<std::uint8_t*>(d->data()), nbytes(d->d), 0);
          d->write_back();
        },
        [&, finish = completes(w, rank_)](std::exception_ptr e) {
          finish(e);
          std::lock_guard<std::mutex> lk(m);
          done = true;
          cv.notify_all();
        });
    std::unique_lock<std::mutex> lk(m);
    cv.wait(lk, [&] { return done; }); // the next receive from any source reads the next announcement
  });
  return w;
}

// Sends and receives blocks with every listed peer at once, each on its own channel, and waits for all.
void backend::exchange(const std::vector<std::tuple<int, const void*, std::size_t>>& sends,
                       const std::vector<std::tuple<int, void*, std::size_t>>& recvs, const std::string& tag) {
  struct pending_t {
    std::mutex m;
    std::condition_variable cv;
    std::size_t left = 0;
    std::exception_ptr first;
  };
  auto st = std::make_shared<pending_t>();
  st->left = sends.size() + recvs.size();
  auto done = [st](std::exception_ptr e) {
    std::lock_guard<std::mutex> lk(st->m);
    if (e && !st->first) st->first = e;
    if (--st->left == 0) st->cv.notify_all();
  };
  // Peers on other hosts: Gloo's send and recv, waited for after the channels' operations are posted.
  std::vector<c10::intrusive_ptr<c10d::Work>> remote;
  for (const auto& [peer, data, bytes] : sends) {
    if (map_.host_of[static_cast<std::size_t>(peer)] != host_) {
      std::vector<at::Tensor> ts{bytes_of(const_cast<void*>(data), bytes)};
      remote.push_back(world_->send(ts, peer, all_to_all_tag));
      done(nullptr);
    } else {
      channel_to(rank_, peer, tag)->post([data = data, bytes = bytes](braid::communicator& c) { c.send(static_cast<const std::uint8_t*>(data), bytes, 1); }, done);
    }
  }
  for (const auto& [peer, data, bytes] : recvs) {
    if (map_.host_of[static_cast<std::size_t>(peer)] != host_) {
      std::vector<at::Tensor> ts{bytes_of(data, bytes)};
      remote.push_back(world_->recv(ts, peer, all_to_all_tag));
      done(nullptr);
    } else {
      channel_to(peer, rank_, tag)->post([data = data, bytes = bytes](braid::communicator& c) { c.recv(static_cast<std::uint8_t*>(data), bytes, 0); }, done);
    }
  }
  std::exception_ptr remote_error;
  for (auto& w : remote) {
    try {
      w->wait();
    } catch (...) {
      if (!remote_error) remote_error = std::current_exception();
    }
  }
  std::unique_lock<std::mutex> lk(st->m);
  st->cv.wait(lk, [&] { return st->left == 0; });
  if (st->first) std::rethrow_exception(st->first);
  if (remote_error) std::rethrow_exception(remote_error);
}

c10::intrusive_ptr<c10d::Work> backend::alltoall_base(at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_splits,
                                                      std::vector<int64_t>& input_splits, const c10d::AllToAllOptions& opts) {
  require_cpu(input, "all_to_all_single");
  require_cpu(output, "all_to_all_single");
  TORCH_CHECK(input.scalar_type() == output.scalar_type(), "braid: all_to_all_single: input and output dtypes differ");
  auto splits = [&](const std::vector<int64_t>& s, const at::Tensor& t, const char* which) {
    std::vector<int64_t> rows;
    const int64_t dim0 = t.dim() ? t.size(0) : 1;
    if (s.empty()) {
      TORCH_CHECK(dim0 % size_ == 0, "braid: all_to_all_single: the ", which, "'s first dimension ", dim0, " does not divide by ", size_);
      rows.assign(static_cast<std::size_t>(size_), dim0 / size_);
    } else {
      TORCH_CHECK(static_cast<int>(s.size()) == size_, "braid: all_to_all_single: ", which, " split sizes must have ", size_, " entries");
      TORCH_CHECK(std::accumulate(s.begin(), s.end(), int64_t{0}) == dim0, "braid: all_to_all_single: ", which,
                  " split sizes do not add up to its first dimension ", dim0);
      rows = s;
    }
    return rows;
  };
  const auto in_rows = splits(input_splits, input, "input"), out_rows = splits(output_splits, output, "output");
  const std::size_t in_row = input.dim() ? nbytes(input) / std::max<int64_t>(1, input.size(0)) : nbytes(input);
  const std::size_t out_row = output.dim() ? nbytes(output) / std::max<int64_t>(1, output.size(0)) : nbytes(output);
  at::Tensor in = input, out = output;
  return submit(c10d::OpType::ALLTOALL_BASE, "all_to_all_single", {output}, opts.asyncOp, std::nullopt,
                [this, in, out, in_rows, out_rows, in_row, out_row](medium&) {
    const at::Tensor src = in.contiguous();
    dense d(out);
    const auto* s = static_cast<const std::uint8_t*>(src.data_ptr());
    auto* o = static_cast<std::uint8_t*>(d.data());
    std::vector<std::tuple<int, const void*, std::size_t>> sends;
    std::vector<std::tuple<int, void*, std::size_t>> recvs;
    std::size_t so = 0, ro = 0;
    for (int q = 0; q < size_; ++q) {
      const std::size_t sb = static_cast<std::size_t>(in_rows[static_cast<std::size_t>(q)]) * in_row;
      const std::size_t rb = static_cast<std::size_t>(out_rows[static_cast<std::size_t>(q)]) * out_row;
      if (q == rank_) {
        TORCH_CHECK(sb == rb, "braid: all_to_all_single: this rank sends itself ", sb, " bytes but expects ", rb);
        if (sb) std::memcpy(o + ro, s + so, sb);
      } else {
        sends.emplace_back(q, s + so, sb);
        recvs.emplace_back(q, o + ro, rb);
      }
      so += sb;
      ro += rb;
    }
    exchange(sends, recvs, "all_to_all");
    d.write_back();
  });
}

c10::intrusive_ptr<c10d::Work> backend::alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                                 const c10d::AllToAllOptions& opts) {
  TORCH_CHECK(static_cast<int>(outputs.size()) == size_ && static_cast<int>(inputs.size()) == size_, "braid: all_to_all: expected ",
              size_, " input and ", size_, " output tensors");
  for (int q = 0; q < size_; ++q) {
    require_cpu(inputs[static_cast<std::size_t>(q)], "all_to_all");
    require_cpu(outputs[static_cast<std::size_t>(q)], "all_to_all");
  }
  std::vector<at::Tensor> ins = inputs, outs = outputs;
  return submit(c10d::OpType::ALLTOALL, "all_to_all", outputs, opts.asyncOp, std::nullopt, [this, ins, outs](medium&) {
    std::vector<at::Tensor> srcs;
    std::vector<std::shared_ptr<dense>> dsts;
    for (int q = 0; q < size_; ++q) {
      srcs.push_back(ins[static_cast<std::size_t>(q)].contiguous());
      dsts.push_back(std::make_shared<dense>(outs[static_cast<std::size_t>(q)]));
    }
    std::vector<std::tuple<int, const void*, std::size_t>> sends;
    std::vector<std::tuple<int, void*, std::size_t>> recvs;
    for (int q = 0; q < size_; ++q) {
      const auto& s = srcs[static_cast<std::size_t>(q)];
      const auto& d = *dsts[static_cast<std::size_t>(q)];
      if (q == rank_) {
        TORCH_CHECK(nbytes(s) == nbytes(d.d), "braid: all_to_all: this rank's block to itself changes size");
        d.d.reshape({-1}).view(at::kByte).copy_(s.reshape({-1}).view(at::kByte));
      } else {
        sends.emplace_back(q, s.data_ptr(), nbytes(s));
        recvs.emplace_back(q, d.data(), nbytes(d.d));
      }
    }
    exchange(sends, recvs, "all_to_all");
    for (const auto& d : dsts) d->write_back();
  });
}

} // namespace braid_torch
