// braid/mpi/front.hpp — what braid::mpi's two communicators (communicator.hpp on host memory,
// cuda.cuh on device memory) share in front of their algorithms: the hosts' layout and MPI
// communicators, the call's name and number, the failed state that makes every later call refuse,
// the argument checks, the start of the inter-host call check, and the MPI types of element sizes.
// Needs <mpi.h>: this header is not part of <braid/braid.hpp>.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <map>
#include <string>
#include <string_view>
#include <utility>

#include "../comm/validate.hpp"
#include "../core/error.hpp"
#include "bootstrap.hpp"
#include "call_check.hpp"
#include "check.hpp"

namespace braid::mpi::detail {

class front {
public:
  bool valid() const noexcept { return live_; }
  int rank() const { return lay().rank; }
  int size() const { return lay().size; }
  int host() const { return lay().host; }
  int hosts() const { return lay().hosts; }
  int local_rank() const { return lay().local_rank; }
  int local_size() const { return lay().local_size; }
  bool uniform() const { return lay().uniform; }
  const host_layout& layout() const { return lay(); }
  MPI_Comm cross_comm() const { return (void)lay(), hc_.cross.get(); } // same local rank, one per host
  std::uint64_t calls() const { return seq_; }

protected:
  // `kind`: the class's name in braid::mpi, for the messages.
  explicit front(const char* kind) noexcept : kind_(kind) {}
  front(const char* kind, host_comms hc) : hc_(std::move(hc)), kind_(kind) {}
  front(const front&) = delete;
  front& operator=(const front&) = delete;
  front& operator=(front&& o) noexcept {
    if (this != &o) {
      free_types();
      hc_ = std::move(o.hc_);
      live_ = std::exchange(o.live_, false);
      failed_ = std::exchange(o.failed_, false);
      failure_ = std::move(o.failure_);
      what_ = o.what_;
      seq_ = std::exchange(o.seq_, 0);
      check_ = std::exchange(o.check_, {});
      types_ = std::exchange(o.types_, {});
    }
    return *this;
  }
  ~front() { free_types(); }

  const host_layout& lay() const {
    if (!live_) raise(errc::invalid_usage, std::string("this braid::mpi::") + kind_ + " is empty (default-constructed or moved from)");
    return hc_.layout;
  }
  error_context ctx() const { return error_context{hc_.layout.rank, what_, seq_, -1}; }

  // Argument checks of collective `c` under Op, before anything moves: braid::communicator's
  // (comm/validate.hpp), plus MPI's int counts; and a communicator that failed refuses. Returns the
  // call's record, which the call check folds in (start_check).
  template <collective c, class Op, class T> braid::detail::call_record check_call(const T* in, T* out, std::size_t count, int root) {
    const host_layout& L = lay();
    what_ = std::string_view(name(c)).data();
    const error_context cx{L.rank, what_, seq_ + 1, -1};
    refuse_if_failed(cx);
    braid::detail::call_record k = braid::detail::validate_call<c, T, Op>(in, out, count, root, L.size, L.rank, algo::automatic, cx);
    if (std::max(k.in_n, k.out_n) > static_cast<std::uint64_t>(INT_MAX))
      raise(errc::unsupported, "braid::mpi: more than INT_MAX elements in one call", cx);
    return k;
  }
  // A call named `what` begins: it is numbered, unless the communicator failed earlier (it raises).
  void begin_call(const char* what) {
    (void)lay();
    what_ = what;
    refuse_if_failed(ctx());
    ++seq_;
  }
  // An error ended a call (or check()): every later call refuses, naming it.
  void mark_failed(const std::exception& e) const {
    failed_ = true;
    failure_ = e.what();
  }
  // The inter-host call check of this call (call_check.hpp), folded in at its start.
  void start_check(const braid::detail::call_record& k) { check_.start(hc_.layout, k); }

  // A committed MPI type of `bytes` contiguous bytes (one per element size, kept until destruction).
  MPI_Datatype type_of(std::size_t bytes) {
    auto it = types_.find(bytes);
    if (it != types_.end()) return it->second;
    MPI_Datatype t = MPI_DATATYPE_NULL;
    BRAID_MPI_CHECK_CTX(MPI_Type_contiguous(static_cast<int>(bytes), MPI_BYTE, &t), ctx());
    BRAID_MPI_CHECK_CTX(MPI_Type_commit(&t), ctx());
    types_.emplace(bytes, t);
    return t;
  }
  void free_types() noexcept {
    if (!types_.empty() && mpi_usable())
      for (auto& [b, t] : types_) MPI_Type_free(&t);
    types_.clear();
  }

  host_comms hc_;
  bool live_ = false;
  const char* what_ = nullptr;
  std::uint64_t seq_ = 0;
  call_check check_; // the inter-host call check

private:
  void refuse_if_failed(const error_context& cx) const {
    if (failed_) raise(errc::invalid_usage, "the communicator failed earlier and refuses further calls: " + failure_, cx);
  }

  mutable bool failed_ = false; // check() marks it too
  mutable std::string failure_;
  std::map<std::size_t, MPI_Datatype> types_;
  const char* kind_;
};

} // namespace braid::mpi::detail
