// braid_torch/csrc/backend.hpp — braid as a torch.distributed backend (c10d::Backend) for CPU and CUDA
// tensors.
//
// One group's ranks on one host share a braid::communicator (processes over shared memory), created
// at construction through the group's c10d store: the host's first rank publishes a fresh
// braid::unique_id under "braid/uid/<host>", the others read it. Between hosts an existing engine
// carries the step: a Gloo process group of the hosts' first ranks (`cross`) for the collectives, and
// one of every rank (`world`) for point-to-point between hosts; reductions then run braid inside
// each host, the hosts' partial results combined in host order (typed_combine), so every rank gets
// the same bits.
//
// Operations run on the group's progress thread in call order; a synchronous one runs on the
// caller's thread when nothing is queued. send and recv run on a thread per (direction, peer, tag)
// channel, each a two-rank braid communicator, so that sends and receives between two ranks never
// wait for each other's order. Unsupported input raises RuntimeError on the calling thread before any
// data moves; a failure inside an operation (timeout, dead peer, mismatch) completes its Work with a
// DistBackendError naming the operation, its call number in this group and the rank.
//
// CUDA tensors (a build with nvcc): the collectives run the same bodies over a `medium` whose steps
// are braid::cuda::process_communicator calls on the backend's stream of the rank's device, joined
// at the group's first CUDA collective (cuda_path.hpp). That stream first waits for the caller's
// current stream; the Work completes once the device has finished, and its future is CUDA-aware.
// Steps the device path does not serve (other hosts, reductions of types or operators it has no
// kernel for) are staged: copied to host memory, run as for CPU tensors, copied back.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <braid/comm/communicator.hpp>

#include "progress.hpp"
#include "types.hpp"
#include "work.hpp"

namespace braid_torch {

// Where a group's ranks are: host_of[r] is group rank r's host, hosts numbered 0.. in the order of
// their first rank.
struct host_map {
  std::vector<int> host_of;
  int hosts = 1;
  std::vector<std::vector<int>> members; // group ranks on each host, ascending
  static host_map make(std::vector<int> host_of);
};

// braid's options for a group's communicators: from the environment, the group's timeout (when set)
// as the deadline; `small` for point-to-point channels (less staging memory).
braid::options braid_options(std::chrono::milliseconds timeout, bool small);
// Waits for `key` in `store` by polling (Store::wait would hold the store's connection), at most
// `timeout`; raises DistBackendError naming `what` when it does not appear.
std::vector<uint8_t> await_key(const c10::intrusive_ptr<c10d::Store>& store, const std::string& key, std::chrono::milliseconds timeout,
                               const std::string& what);

// Joins rank `rank` of `size`: rank 0 generates a braid::unique_id and publishes it under `key`
// (when there are other ranks), the others wait for it (await_key, naming `what`).
braid::communicator join_through_store(const c10::intrusive_ptr<c10d::Store>& store, const std::string& key, int rank, int size,
                                       const braid::options& o, std::chrono::milliseconds timeout, const std::string& what);

class channel;
namespace gpu {
class group;
}

class backend final : public c10d::Backend {
public:
  backend(c10::intrusive_ptr<c10d::Store> store, int rank, int size, std::chrono::milliseconds timeout,
          std::vector<int> host_of, c10::intrusive_ptr<c10d::Backend> cross, c10::intrusive_ptr<c10d::Backend> world);
  ~backend() override;

  const std::string getBackendName() const override { return "braid"; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits, const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  // Receives from any source need BRAID_ANY_SOURCE=1 on every rank of the group: then every send
  // announces itself in the store (two store round trips per send) so that the receiver learns, in
  // the order the messages were sent, which channel to read next.
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;

  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override { return calls_.load(); }
  void setTimeout(std::chrono::milliseconds timeout) override { timeout_ = timeout; }
  void abort() override;
  void shutdown() override;

  // Whether this build serves CUDA tensors.
  static bool cuda_built();

private:
  // Where an operation's steps run: host memory over braid's CPU communicator (and Gloo between
  // hosts), or device memory over the group's CUDA communicator on `stream` (g set).
  struct medium {
    backend& b;
    gpu::group* g = nullptr;
    void* stream = nullptr;
    std::optional<at::Device> device; // set for CUDA tensors
    void all_reduce(const reduce_plan& p, const void* in, void* out);
    void reduce(const reduce_plan& p, const void* in, void* out, int root);
    void reduce_scatter(const reduce_plan& p, const void* in, void* out); // p.count per rank
    void broadcast(void* data, std::size_t bytes, int root);
    void all_gather(const void* in, void* out, std::size_t bytes); // out: size() blocks in rank order
    // Options for scratch tensors beside the operation's data.
    at::TensorOptions bytes() const;
    // Runs f(host_in, host_out) over host copies of in (in_bytes) and out (out_bytes), the result
    // copied back into out: a step of CUDA tensors the device path does not serve.
    void staged(const void* in, std::size_t in_bytes, void* out, std::size_t out_bytes, const std::function<void(medium&, const void*, void*)>& f);
  };
  using body_fn = std::function<void(medium&)>;

  // Queues (or, when synchronous and idle, runs) `body` as operation `what` on the progress thread.
  // `device`: the operation's CUDA device, nullopt for CPU tensors (submit_cuda).
  c10::intrusive_ptr<c10d::Work> submit(c10d::OpType type, const char* what, std::vector<at::Tensor> outputs, bool async_op,
                                        std::optional<at::Device> device, body_fn body);
  // The Work of operation `what`, its task queued (or run, when synchronous and idle); `stream`: the
  // device stream the task's result is on (CUDA tensors), for the Work's future.
  c10::intrusive_ptr<c10d::Work> enqueue(c10d::OpType type, const char* what, std::vector<at::Tensor> outputs, bool async_op,
                                         std::optional<c10::Stream> stream, std::function<void()> task);
  c10::intrusive_ptr<c10d::Work> submit_cuda(c10d::OpType type, const char* what, std::vector<at::Tensor> outputs, bool async_op,
                                             at::Device device, body_fn body);
  // The one device of `tensors` (nullopt: all on the CPU); raises when they are on several devices
  // or on one this build does not serve.
  std::optional<at::Device> device_of(const std::vector<at::Tensor>& tensors, const char* what) const;
  struct cuda_state; // backend_cuda.cpp
  void cuda_abort() noexcept;
  void cuda_close() noexcept;
  std::shared_ptr<channel> channel_to(int src, int dst, const std::string& tag);
  void exchange(const std::vector<std::tuple<int, const void*, std::size_t>>& sends,
                const std::vector<std::tuple<int, void*, std::size_t>>& recvs, const std::string& tag);

  // The collectives over hosts, run on the progress thread (bytes unless typed).
  void hier_all_reduce(const reduce_plan& p, const void* in, void* out);
  void hier_broadcast(void* data, std::size_t bytes, int root);
  void hier_all_gather(const void* in, void* out, std::size_t bytes); // out: size() blocks in rank order
  void hier_barrier();

  c10::intrusive_ptr<c10d::Store> store_;
  std::chrono::milliseconds timeout_;
  host_map map_;
  int host_ = 0, local_rank_ = 0, local_size_ = 1;
  braid::communicator local_;
  c10::intrusive_ptr<c10d::Backend> cross_, world_;
  std::atomic<std::uint64_t> calls_{0};
  std::mutex channels_m_;
  std::map<std::tuple<int, int, std::string>, std::shared_ptr<channel>> channels_;
  std::shared_ptr<cuda_state> cuda_; // the CUDA side, made at the first CUDA collective
  bool shut_ = false;
  bool any_source_ = false; // BRAID_ANY_SOURCE
  struct any_state {
    std::uint64_t next = 1;          // the next announcement to read
    std::map<int, std::uint64_t> skip; // receives posted per source, not yet matched to an announcement
  };
  std::mutex any_m_;
  std::map<int, any_state> any_; // by tag
  progress any_thread_; // reads the announcements for receives from any source, in their order
  progress remote_;   // completes receives from other hosts into non-contiguous tensors
  progress progress_; // last: its thread stops first
};

} // namespace braid_torch
