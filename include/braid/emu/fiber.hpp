// braid/emu/fiber.hpp — the emulated device's CUDA threads: one fiber (a stack and saved registers)
// per thread of a block, all fibers of a block on one OS thread, switched cooperatively at block
// barriers and at the yield points of device waits (emu/exec.hpp decides when).
//
// Switching: on x86-64, a few instructions that save the callee-saved registers and the floating
// point control words on the old stack and restore them from the new one (no system call); elsewhere,
// ucontext's swapcontext (slower: it saves the signal mask with a system call).
//
// Sanitizers: under ThreadSanitizer every fiber is a TSan fiber (__tsan_create_fiber) and every switch
// is announced with __tsan_switch_to_fiber *without* synchronisation, so TSan sees the threads of a
// block as concurrent threads: a block-shared variable written by one thread and read by another
// without a block barrier in between is reported as a race. The scheduler adds the happens-before
// edges CUDA promises (block barrier, block start and end) explicitly (emu/exec.hpp). Under
// AddressSanitizer every switch is announced with __sanitizer_start/finish_switch_fiber.
#pragma once

#include "../core/config.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <sys/mman.h>
#include <unistd.h>

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

#if defined(__SANITIZE_THREAD__)
#define BRAID_EMU_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define BRAID_EMU_TSAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define BRAID_EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define BRAID_EMU_ASAN 1
#endif
#endif
#ifndef BRAID_EMU_TSAN
#define BRAID_EMU_TSAN 0
#endif
#ifndef BRAID_EMU_ASAN
#define BRAID_EMU_ASAN 0
#endif

#if BRAID_EMU_TSAN
#include <sanitizer/tsan_interface.h>
#endif
#if BRAID_EMU_ASAN
#include <pthread.h>
#include <sanitizer/common_interface_defs.h>
#endif

namespace braid::emu::detail {

[[noreturn]] inline void fatal(const char* what) {
  std::fprintf(stderr, "braid emulated CUDA device: %s\n", what);
  std::fflush(stderr);
  std::abort();
}

#if defined(__x86_64__)
// Saves rbp, rbx and r12-r15 on the current stack, stores the stack pointer in *save, switches to
// `to` and restores the same from there. The floating-point control state (MXCSR, x87 control word)
// is not switched: it is the OS thread's, and no CUDA kernel changes it.
__attribute__((naked, noinline)) inline void switch_stack(void** /*save*/, void* /*to*/) {
  __asm__ volatile(
      "pushq %rbp\n\tpushq %rbx\n\tpushq %r12\n\tpushq %r13\n\tpushq %r14\n\tpushq %r15\n\t"
      "movq %rsp, (%rdi)\n\tmovq %rsi, %rsp\n\t"
      "popq %r15\n\tpopq %r14\n\tpopq %r13\n\tpopq %r12\n\tpopq %rbx\n\tpopq %rbp\n\tret\n\t");
}
// First instructions of a new fiber: call r13(r12) with an aligned stack; the entry never returns.
__attribute__((naked, noinline)) inline void fiber_start() {
  __asm__ volatile("movq %r12, %rdi\n\tcallq *%r13\n\tud2\n\t");
}
#endif

// A stack and a saved context. `entry(arg)` runs on it the first time it is switched to, and must
// never return (it switches away for good instead).
class fiber {
public:
  using entry_fn = void (*)(void*);

  fiber() = default;
  fiber(const fiber&) = delete;
  fiber& operator=(const fiber&) = delete;
  ~fiber() { release(); }

  // The context of the calling OS thread (the scheduler side): no stack of its own.
  void adopt_current_thread() {
#if BRAID_EMU_TSAN
    tsan_ = __tsan_get_current_fiber();
#endif
#if BRAID_EMU_ASAN
    pthread_attr_t at;
    if (::pthread_getattr_np(::pthread_self(), &at) == 0) {
      void* lo = nullptr;
      std::size_t n = 0;
      ::pthread_attr_getstack(&at, &lo, &n);
      asan_bottom_ = lo;
      asan_size_ = n;
      ::pthread_attr_destroy(&at);
    }
#endif
    own_thread_ = true;
  }

  // Runs `entry(arg)` on [stack, stack + stack_bytes) the first time this fiber is switched to. The
  // stack belongs to the caller (emu/exec.hpp keeps a worker's stacks in one mapping: one guard page
  // per fiber would exhaust the kernel's limit on mappings with tens of thousands of CUDA threads);
  // its lowest bytes hold a canary that stack_intact() checks.
  void create(char* stack, std::size_t stack_bytes, entry_fn entry, void* arg) {
    stack_lo_ = stack;
    stack_bytes_ = stack_bytes;
    for (std::size_t i = 0; i < canary_zone; i += sizeof canary) std::memcpy(stack_lo_ + i, &canary, sizeof canary);
#if defined(__x86_64__)
    const auto top = reinterpret_cast<std::uintptr_t>(stack_lo_) + stack_bytes;
    // The frame switch_stack pops: r15, r14, r13 (entry), r12 (arg), rbx, rbp, then the return
    // address (fiber_start). After the pops the stack pointer is top - 16: 16-byte aligned, as
    // fiber_start's call needs.
    auto* sp = reinterpret_cast<std::uint64_t*>((top & ~std::uintptr_t{15}) - 72);
    sp[0] = 0;
    sp[1] = 0;
    sp[2] = reinterpret_cast<std::uint64_t>(reinterpret_cast<void*>(entry));
    sp[3] = reinterpret_cast<std::uint64_t>(arg);
    sp[4] = 0;
    sp[5] = 0;
    sp[6] = reinterpret_cast<std::uint64_t>(reinterpret_cast<void*>(&fiber_start));
    sp_ = sp;
#else
    if (::getcontext(&uc_) != 0) fatal("getcontext failed");
    uc_.uc_stack.ss_sp = stack_lo_;
    uc_.uc_stack.ss_size = stack_bytes;
    uc_.uc_link = nullptr;
    uc_entry_ = entry;
    uc_arg_ = arg;
    ::makecontext(&uc_, reinterpret_cast<void (*)()>(&fiber::uc_trampoline), 1, this);
#endif
#if BRAID_EMU_TSAN
    tsan_ = __tsan_create_fiber(0);
#endif
  }

  // Switches from `from` (the running context) to this fiber. `sync`: whether TSan should order
  // everything `from` did before everything this fiber does next (only the scheduler's first entry
  // into a thread of a new block asks for it).
  __attribute__((no_sanitize("thread"))) __attribute__((noinline)) void switch_from(fiber& from, bool sync) {
#if BRAID_EMU_TSAN
    __tsan_switch_to_fiber(tsan_, sync ? 0 : __tsan_switch_to_fiber_no_sync);
#else
    (void)sync;
#endif
#if BRAID_EMU_ASAN
    void* fake = nullptr;
    __sanitizer_start_switch_fiber(&fake, own_thread_ ? asan_bottom_ : stack_lo_, own_thread_ ? asan_size_ : stack_bytes_);
#endif
#if defined(__x86_64__)
    switch_stack(&from.sp_, sp_);
#else
    if (::swapcontext(&from.uc_, &uc_) != 0) fatal("swapcontext failed");
#endif
#if BRAID_EMU_ASAN
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
  }

  // False once the fiber has written into the lowest bytes of its stack: stack_intact looks at the
  // lowest word (cheap: the scheduler checks it at every switch back), stack_zone_intact at the whole
  // lowest 4 KiB (at the end of every block), which catches frames that skipped the word. An overflow
  // beyond the zone runs into the neighbouring thread's stack and may go unseen (no guard page per
  // thread: they would exhaust the kernel's mapping limit).
  bool stack_intact() const {
    std::uint64_t v;
    std::memcpy(&v, stack_lo_, sizeof v);
    return own_thread_ || v == canary;
  }
  bool stack_zone_intact() const {
    if (own_thread_) return true;
    for (std::size_t i = 0; i < canary_zone; i += sizeof canary) {
      std::uint64_t v;
      std::memcpy(&v, stack_lo_ + i, sizeof v);
      if (v != canary) return false;
    }
    return true;
  }

#if BRAID_EMU_ASAN
  // A fiber's first instructions must finish the switch that started it.
  static void asan_entered() { __sanitizer_finish_switch_fiber(nullptr, nullptr, nullptr); }
#else
  static void asan_entered() {}
#endif

private:
  static constexpr std::uint64_t canary = 0xB4A1D5C0FFEE5AFEull;
  static constexpr std::size_t canary_zone = 4096;
  void* sp_ = nullptr;
  char* stack_lo_ = nullptr;
  std::size_t stack_bytes_ = 0;
  bool own_thread_ = false;
#if BRAID_EMU_TSAN
  void* tsan_ = nullptr;
#endif
#if BRAID_EMU_ASAN
  const void* asan_bottom_ = nullptr;
  std::size_t asan_size_ = 0;
#endif
#if !defined(__x86_64__)
  ucontext_t uc_{};
  entry_fn uc_entry_ = nullptr;
  void* uc_arg_ = nullptr;
  static void uc_trampoline(fiber* f) { f->uc_entry_(f->uc_arg_); }
#endif

  void release() {
#if BRAID_EMU_TSAN
    if (tsan_ && !own_thread_) __tsan_destroy_fiber(tsan_);
    tsan_ = nullptr;
#endif
  }
};

} // namespace braid::emu::detail
