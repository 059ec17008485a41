// braid/emu/runtime/streams.hpp — the emulated runtime's streams, events, stream capture and graphs.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "memory.hpp"

// ---- streams ------------------------------------------------------------------------------------

inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags) {
  using namespace braid::emu::detail;
  BRAID_EMU_ENTER();
  if (!s || (flags & ~cudaStreamNonBlocking)) return fail(cudaErrorInvalidValue);
  *s = reinterpret_cast<cudaStream_t>(rt().create_stream(tls_device, flags).get());
  return cudaSuccess;
}
inline cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }

inline cudaError_t cudaStreamDestroy(cudaStream_t s) {
  using namespace braid::emu::detail;
  BRAID_EMU_ENTER();
  if (!rt().destroy_stream(s)) {
    diag("cudaStreamDestroy", "stream " + hex(s) + " is not a live stream");
    return fail(cudaErrorInvalidResourceHandle);
  }
  return cudaSuccess;
}

inline cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  using namespace braid::emu::detail;
  BRAID_EMU_ENTER();
  std::shared_ptr<stream_state> s;
  if (const cudaError_t e = stream_for("cudaStreamSynchronize", stream, s)) return fail(e);
  if (s->capture) return fail(refuse_in_capture(*s, "cudaStreamSynchronize", nullptr));
  s->wait_for(s->last_enqueued());
  return cudaSuccess;
}

inline cudaError_t cudaStreamQuery(cudaStream_t stream) {
  using namespace braid::emu::detail;
  BRAID_EMU_ENTER();
  ++tls_runtime_polls;
  std::shared_ptr<stream_state> s;
  if (const cudaError_t e = stream_for("cudaStreamQuery", stream, s)) return fail(e);
  if (s->capture) return fail(refuse_in_capture(*s, "cudaStreamQuery", nullptr));
  return s->done_through(s->last_enqueued()) ? cudaSuccess : cudaErrorNotReady;
}

// ---- events -------------------------------------------------------------------------------------

inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned flags) {
  using namespace braid::emu::detail;
  BRAID_EMU_ENTER();
  if (!e || (flags & ~(cudaEventBlockingSync | cudaEventDisableTiming))) return fail(cudaErrorInvalidValue);
  *e = reinterpret_cast<cudaEvent_t>(rt().create_event(flags));
  return cudaSuccess;
}
inline cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, cudaEventDefault); }

inline cudaError_t cudaEventDestroy(cudaEvent_t e) {
  using namespace braid::emu::detail;
  BRAID_EMU_ENTER();
  if (!rt().destroy_event(reinterpret_cast<event_state*>(e))) {
    diag("cudaEventDestroy", "event " + hex(e) + " is not a live event");
    return fail(cudaErrorInvalidResourceHandle);
  }
  return cudaSuccess;
}

inline cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t stream = nullptr) {
  using namespace braid::emu::detail;
  BRAID_EMU_ENTER();
  auto* ev = reinterpret_cast<event_state*>(e);
  if (!rt().live_event(ev)) {
    diag("cudaEventRecord", "event " + hex(e) + " is not a live event");
    return fail(cudaErrorInvalidResourceHandle);
  }
  std::shared_ptr<stream_state> s;
  if (const cudaError_t err = stream_for("cudaEventRecord", stream, s)) return fail(err);
  if (s->capture) return fail(refuse_in_capture(*s, "cudaEventRecord", "recording an event into a capture is not emulated"));
  auto rec = std::make_shared<event_record>();
  rec->stream = s;
  rec->seq = rt().enqueue(*s, [rec] { rec->at_ns.store(now_ns()); });
  rt().set_record(ev, rec);
  return cudaSuccess;
}

inline cudaError_t cudaEventRecordWithFlags(cudaEvent_t e, cudaStream_t stream = nullptr, unsigned flags = 0) {
  using namespace braid::emu::detail;
  BRAID_EMU_ENTER();
  if (flags == cudaEventRecordDefault) return cudaEventRecord(e, stream);
  auto* ev = reinterpret_cast<event_state*>(e);
  if (!rt().live_event(ev)) return fail(cudaErrorInvalidResourceHandle);
  if (flags != cudaEventRecordExternal) return fail(cudaErrorInvalidValue);
  std::shared_ptr<stream_state> s;
  if (const cudaError_t err = stream_for("cudaEventRecordWithFlags", stream, s)) return fail(err);
  cudaError_t err = cudaSuccess;
  if (captured(*s, graph_node{{}, nullptr, ev}, err)) return fail(err);
  diag("cudaEventRecordWithFlags", "cudaEventRecordExternal is valid only during a stream capture");
  return fail(cudaErrorInvalidValue);
}

inline cudaError_t cudaEventQuery(cudaEvent_t e) {
  using namespace braid::emu::detail;
  BRAID_EMU_ENTER();
  ++tls_runtime_polls;
  auto* ev = reinterpret_cast<event_state*>(e);
  if (!rt().live_event(ev)) return fail(cudaErrorInvalidResourceHandle);
  auto rec = rt().record_of(ev);
  if (!rec) return cudaSuccess;
  return rec->stream->done_through(rec->seq) ? cudaSuccess : cudaErrorNotReady;
}

inline cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  using namespace braid::emu::detail;
  BRAID_EMU_ENTER();
  auto* ev = reinterpret_cast<event_state*>(e);
  if (!rt().live_event(ev)) return fail(cudaErrorInvalidResourceHandle);
  if (auto rec = rt().record_of(ev)) rec->stream->wait_for(rec->seq);
  return cudaSuccess;
}

// Milliseconds between two completed records: CPU time on the emulator, never a GPU timing.
inline cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
  using namespace braid::emu::detail;
  BRAID_EMU_ENTER();
  auto *ea = reinterpret_cast<event_state*>(a), *eb = reinterpret_cast<event_state*>(b);
  if (!ms || !rt().live_event(ea) || !rt().live_event(eb)) return fail(cudaErrorInvalidResourceHandle);
  if ((ea->flags | eb->flags) & cudaEventDisableTiming) return fail(cudaErrorInvalidResourceHandle);
  auto ra = rt().record_of(ea), rb = rt().record_of(eb);
  if (!ra || !rb) return fail(cudaErrorInvalidResourceHandle);
  if (!ra->stream->done_through(ra->seq) || !rb->stream->done_through(rb->seq)) return fail(cudaErrorNotReady);
  *ms = static_cast<float>(static_cast<double>(rb->at_ns.load() - ra->at_ns.load()) * 1e-6);
  return cudaSuccess;
}

inline cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t e, unsigned flags = 0) {
  using namespace braid::emu::detail;
  BRAID_EMU_ENTER();
  auto* ev = reinterpret_cast<event_state*>(e);
  if (!rt().live_event(ev)) return fail(cudaErrorInvalidResourceHandle);
  if (flags & ~cudaEventWaitExternal) return fail(cudaErrorInvalidValue);
  std::shared_ptr<stream_state> s;
  if (const cudaError_t err = stream_for("cudaStreamWaitEvent", stream, s)) return fail(err);
  if (flags & cudaEventWaitExternal) {
    cudaError_t err = cudaSuccess;
    if (captured(*s, graph_node{{}, ev, nullptr}, err)) return fail(err);
    diag("cudaStreamWaitEvent", "cudaEventWaitExternal is valid only during a stream capture");
    return fail(cudaErrorInvalidValue);
  }
  auto rec = rt().record_of(ev);
  if (!rec) return cudaSuccess;
  if (s->capture) return fail(refuse_in_capture(*s, "cudaStreamWaitEvent", "waiting for an event inside a capture is not emulated"));
  rt().enqueue(*s, {}, {dependency{rec->stream, rec->seq}});
  return cudaSuccess;
}

// ---- capture and graphs -------------------------------------------------------------------------

inline cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode) {
  using namespace braid::emu::detail;
  BRAID_EMU_ENTER();
  if (stream == nullptr || stream == cudaStreamLegacy) return fail(cudaErrorStreamCaptureUnsupported);
  std::shared_ptr<stream_state> s;
  if (const cudaError_t e = stream_for("cudaStreamBeginCapture", stream, s)) return fail(e);
  std::lock_guard<std::mutex> lk(rt().lock());
  if (s->capture) return fail(cudaErrorIllegalState);
  auto* c = new capture_state;
  c->mode = mode;
  c->owner = std::this_thread::get_id();
  c->graph = new graph_state;
  s->capture = c;
  rt().captures().insert(c);
  return cudaSuccess;
}

inline cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* g) {
  using namespace braid::emu::detail;
  BRAID_EMU_ENTER();
  if (!g) return fail(cudaErrorInvalidValue);
  *g = nullptr;
  std::shared_ptr<stream_state> s;
  if (stream == nullptr || stream == cudaStreamLegacy) return fail(cudaErrorIllegalState);
  s = rt().resolve(stream, tls_device);
  if (!s) return fail(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> lk(rt().lock());
  capture_state* c = s->capture;
  if (!c) return fail(cudaErrorIllegalState);
  if (c->mode != cudaStreamCaptureModeRelaxed && c->owner != std::this_thread::get_id())
    return fail(cudaErrorStreamCaptureWrongThread);
  s->capture = nullptr;
  rt().captures().erase(c);
  const bool bad = c->invalidated;
  graph_state* graph = c->graph;
  delete c;
  if (bad) {
    delete graph;
    return fail(cudaErrorStreamCaptureInvalidated);
  }
  rt().graphs().insert(graph);
  *g = reinterpret_cast<cudaGraph_t>(graph);
  return cudaSuccess;
}

// A number for the stream that no other stream of the process has had (the handle of a destroyed
// stream may name a later one).
inline cudaError_t cudaStreamGetId(cudaStream_t stream, unsigned long long* id) {
  using namespace braid::emu::detail;
  BRAID_EMU_ENTER();
  if (!id) return fail(cudaErrorInvalidValue);
  std::shared_ptr<stream_state> s;
  // stream_for's one refusal with a stream found (the legacy stream while a capture forbids syncing
  // with it) does not concern a query.
  if (const cudaError_t e = stream_for("cudaStreamGetId", stream, s); e != cudaSuccess && !s) return fail(e);
  *id = s->id;
  return cudaSuccess;
}

inline cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* st) {
  using namespace braid::emu::detail;
  BRAID_EMU_ENTER();
  if (!st) return fail(cudaErrorInvalidValue);
  if (stream == nullptr || stream == cudaStreamLegacy) {
    std::lock_guard<std::mutex> lk(rt().lock());
    for (capture_state* c : rt().captures())
      if (c->mode == cudaStreamCaptureModeGlobal) return fail(cudaErrorStreamCaptureImplicit);
    *st = cudaStreamCaptureStatusNone;
    return cudaSuccess;
  }
  auto s = rt().resolve(stream, tls_device);
  if (!s) return fail(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> lk(rt().lock());
  *st = !s->capture ? cudaStreamCaptureStatusNone
                    : s->capture->invalidated ? cudaStreamCaptureStatusInvalidated : cudaStreamCaptureStatusActive;
  return cudaSuccess;
}

inline cudaError_t cudaGraphInstantiate(cudaGraphExec_t* e, cudaGraph_t g, unsigned long long flags = 0) {
  using namespace braid::emu::detail;
  BRAID_EMU_ENTER();
  if (!e || flags != 0) return fail(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> lk(rt().lock());
  auto* graph = reinterpret_cast<graph_state*>(g);
  if (!rt().graphs().count(graph)) return fail(cudaErrorInvalidResourceHandle);
  auto* x = new graph_exec_state;
  x->nodes = graph->nodes;
  rt().graph_execs().insert(x);
  *e = reinterpret_cast<cudaGraphExec_t>(x);
  return cudaSuccess;
}

inline cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t stream) {
  using namespace braid::emu::detail;
  BRAID_EMU_ENTER();
  std::vector<graph_node> nodes;
  {
    std::lock_guard<std::mutex> lk(rt().lock());
    auto* x = reinterpret_cast<graph_exec_state*>(e);
    if (!rt().graph_execs().count(x)) return fail(cudaErrorInvalidResourceHandle);
    nodes = x->nodes;
  }
  std::shared_ptr<stream_state> s;
  if (const cudaError_t err = stream_for("cudaGraphLaunch", stream, s)) return fail(err);
  if (s->capture) return fail(refuse_in_capture(*s, "cudaGraphLaunch", "launching a graph into a capture is not emulated"));
  // External event nodes take the events as they are now: a wait node waits for the record current at
  // this launch; a record node's record is this launch (complete when all of it is).
  std::vector<std::function<void()>> run;
  std::vector<event_state*> records;
  for (const graph_node& n : nodes) {
    if (n.wait || n.record) {
      event_state* ev = n.wait ? n.wait : n.record;
      if (!rt().live_event(ev)) {
        diag("cudaGraphLaunch", "the graph's external event " + hex(ev) + " was destroyed");
        return fail(cudaErrorInvalidResourceHandle);
      }
    }
    if (n.wait) {
      if (auto rec = rt().record_of(n.wait)) run.push_back([rec] { rec->stream->wait_for(rec->seq); });
    } else if (n.record) {
      records.push_back(n.record);
    } else {
      run.push_back(n.run);
    }
  }
  auto rec = std::make_shared<event_record>();
  rec->stream = s;
  rec->seq = rt().enqueue(*s, [run = std::move(run), rec] {
    for (const auto& f : run) f();
    rec->at_ns.store(now_ns());
  });
  for (event_state* ev : records) rt().set_record(ev, rec);
  return cudaSuccess;
}

inline cudaError_t cudaGraphDestroy(cudaGraph_t g) {
  BRAID_EMU_ENTER();
  return braid::emu::detail::destroy_handle(braid::emu::detail::rt().graphs(), reinterpret_cast<braid::emu::detail::graph_state*>(g));
}

inline cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e) {
  BRAID_EMU_ENTER();
  return braid::emu::detail::destroy_handle(braid::emu::detail::rt().graph_execs(),
                                            reinterpret_cast<braid::emu::detail::graph_exec_state*>(e));
}
