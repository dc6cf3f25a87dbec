// overlapped_pair: two pieces of one rank's work (DualPipe's forward of one chunk and backward of
// another) run so that while one waits for a collective it started, the other computes. They take
// turns on the caller's thread, handing the rank over at their overlap points:
//
//   first:   compute ─ start a2a ┐                  ┌ wait a2a (done) ─ compute ─ end
//   second:                      └ compute ─ start ─┘                              └ wait ─ ... end
//
// A layer marks an overlap point by starting its collective asynchronously and calling
// await_collective(request): inside a half, that hands the rank to the other half until it too
// waits for a collective or ends, then waits for the request; anywhere else it is request.wait().
// first runs first; second starts only when first first hands over, so a pair without overlap
// points runs exactly as first(), then second() (second not at all if first threw). When one half
// ends, the other runs to its end without handing over — unless the first ended by throwing: the
// other, which can only be waiting at an overlap point, then throws there ("the other half ...
// failed") instead of going on, so it issues no collective the rank's peers would not match (its
// request in flight was issued in their order, and completes in its destructor), and run()
// rethrows the failure that came first.
//
// The turns follow from the code alone (the same halves make the same collectives in the same
// order), so every rank of a group issues its collectives in one order, as the communicator
// concept requires, and the results are those of running first, then second — provided neither
// half reads what the other writes. second runs on a stack of its own (a ucontext fiber) but on
// the same thread: a switch costs no scheduler wake-up (on an oversubscribed machine a wake-up can
// take milliseconds), thread-bound state stays right (MPI_THREAD_FUNNELED, a thread's current
// GPU, thread-local caches), and only one half runs at a time. The fiber is made once and kept: it
// runs each run's second half in a loop, so every call it makes returns (the sanitizers' shadow
// stacks stay balanced). The halves' exceptions are rethrown by run(), first's first. A half must
// not hand over from inside a catch handler (the thread's record of the exceptions being handled
// is shared); overlap points are collectives, and no layer waits for one there. POSIX ucontext
// (glibc; deprecated but present on macOS, absent from musl).
#pragma once

#include <quintet/comm/comm_request.hpp>
#include <quintet/core/error.hpp>

#include <sys/mman.h>
#include <ucontext.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>

// The sanitizers follow the switches through their fiber interfaces (GCC defines __SANITIZE_*,
// Clang answers __has_feature).
#if defined(__SANITIZE_ADDRESS__)
#define QUINTET_FIBER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define QUINTET_FIBER_ASAN 1
#endif
#endif
#if defined(__SANITIZE_THREAD__)
#define QUINTET_FIBER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define QUINTET_FIBER_TSAN 1
#endif
#endif
#if defined(QUINTET_FIBER_ASAN)
#include <sanitizer/common_interface_defs.h>
#endif
#if defined(QUINTET_FIBER_TSAN)
#include <sanitizer/tsan_interface.h>
#endif

namespace quintet {

class overlapped_pair;

namespace detail {
// The half running on this thread, if any.
struct pair_half {
  overlapped_pair* pair = nullptr;
  int side = 0;  // 0: first, 1: second
};
inline thread_local pair_half running_half;
}  // namespace detail

class overlapped_pair {
 public:
  // The second half's stack: what a thread gets by default, reserved, not committed (pages are
  // touched only as deep as the half goes), below a guard page that turns an overflow into a fault.
  static constexpr std::size_t stack_bytes = std::size_t{8} << 20;

  overlapped_pair() = default;
  overlapped_pair(const overlapped_pair&) = delete;
  overlapped_pair& operator=(const overlapped_pair&) = delete;
  // The fiber, parked at the end of its loop, is dropped with its stack (nothing on it needs
  // destroying).
  ~overlapped_pair() {
    if (stack_ != nullptr) munmap(stack_, stack_bytes + guard_bytes);
#if defined(QUINTET_FIBER_TSAN)
    if (tsan_fibers_[1] != nullptr) __tsan_destroy_fiber(tsan_fibers_[1]);
#endif
  }

  // Runs first and second as described above; returns once both have ended, or rethrows the
  // first failure of either. Not reentrant: a half may not run a pair itself.
  void run(const std::function<void()>& first, const std::function<void()>& second) {
    QUINTET_CHECK(detail::running_half.pair == nullptr,
                  "overlapped_pair: run from inside a half of a pair");
    second_ = &second;
    second_started_ = ended_[0] = ended_[1] = false;
    errors_[0] = errors_[1] = nullptr;
    failed_ = -1;
    hand_overs_ = 0;
    detail::running_half = {this, 0};
    try {
      first();
    } catch (...) {
      fail(0);
    }
    ended_[0] = true;
    if (second_started_ && !ended_[1]) switch_to(0, 1);  // second runs to its end, then back here
    detail::running_half = {};
    if (!second_started_ && failed_ < 0) {  // first never handed over: second runs here, after it
      try {
        second();
      } catch (...) {
        fail(1);
      }
    }
    second_ = nullptr;
    if (failed_ >= 0) std::rethrow_exception(errors_[failed_]);
  }

  // How often the last run handed the rank from one half to the other.
  int hand_overs() const { return hand_overs_; }

 private:
  friend void await_collective(comm_request& request);
  static constexpr std::size_t guard_bytes = 4096;
  static_assert(sizeof(std::uintptr_t) == 8,
                "overlapped_pair passes a 64-bit address to the fiber");

  // At an overlap point of half `side` (0: first, 1: second): the other half runs until it hands
  // back or ends.
  void hand_over(int side) {
    const int other = 1 - side;
    if (!ended_[other]) {
      if (other == 1 && !second_started_) {  // first's first overlap point: second starts
        if (stack_ == nullptr) make_fiber();
        second_started_ = true;
      }
      ++hand_overs_;
      switch_to(side, other);
    }
    QUINTET_CHECK(failed_ < 0 || failed_ == side,
                  "overlapped_pair: the other half of the pair failed; this one stops at its "
                  "collective");
  }

  // The running half `side` threw: keeps its exception; the first failure is the one run() gives.
  void fail(int side) {
    errors_[side] = std::current_exception();
    if (failed_ < 0) failed_ = side;
  }

  // The fiber that runs second halves, entering fiber_main() on its own stack when first switched
  // to. Made once.
  void make_fiber() {
    void* memory = mmap(nullptr, stack_bytes + guard_bytes, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
    QUINTET_CHECK(memory != MAP_FAILED, "overlapped_pair: no stack for the second half ({})",
                  std::strerror(errno));
    if (mprotect(memory, guard_bytes, PROT_NONE) != 0 || getcontext(&contexts_[1]) != 0) {
      const int failure = errno;
      munmap(memory, stack_bytes + guard_bytes);
      QUINTET_FAIL("overlapped_pair: no guarded context for the second half ({})",
                   std::strerror(failure));
    }
    stack_ = static_cast<std::byte*>(memory);
    contexts_[1].uc_stack.ss_sp = stack_ + guard_bytes;
    contexts_[1].uc_stack.ss_size = stack_bytes;
    contexts_[1].uc_link = nullptr;  // fiber_main() never returns
    // makecontext passes ints: the pair's address in two halves.
    const auto address = reinterpret_cast<std::uintptr_t>(this);
    makecontext(&contexts_[1], reinterpret_cast<void (*)()>(&fiber_main), 2,
                static_cast<unsigned>(address >> 32), static_cast<unsigned>(address & 0xffffffffu));
#if defined(QUINTET_FIBER_TSAN)
    tsan_fibers_[1] = __tsan_create_fiber(0);
#endif
  }

  // Each run's second half, then back to first (or to run(), first having ended), parked there
  // until the next run's second starts.
  static void fiber_main(unsigned high, unsigned low) {
    auto* pair = reinterpret_cast<overlapped_pair*>((static_cast<std::uintptr_t>(high) << 32) |
                                                    static_cast<std::uintptr_t>(low));
    pair->arrived(1);
    for (;;) {
      detail::running_half = {pair, 1};
      try {
        (*pair->second_)();
      } catch (...) {
        pair->fail(1);
      }
      pair->ended_[1] = true;
      pair->switch_to(1, 0);
    }
  }

  // Saves half `from`'s context and resumes half `to`'s; returns when `from` is resumed.
  void switch_to(int from, int to) {
#if defined(QUINTET_FIBER_TSAN)
    if (to == 1) tsan_fibers_[0] = __tsan_get_current_fiber();  // the caller's, where run() is
    __tsan_switch_to_fiber(tsan_fibers_[to], 0);
#endif
#if defined(QUINTET_FIBER_ASAN)
    const void* bottom = to == 1 ? static_cast<const void*>(stack_ + guard_bytes) : main_bottom_;
    const std::size_t size = to == 1 ? stack_bytes : main_size_;
    __sanitizer_start_switch_fiber(&fake_stacks_[from], bottom, size);
#endif
    swapcontext(&contexts_[from], &contexts_[to]);
    // Back in `from`, possibly much later.
    arrived(from);
    detail::running_half = {this, from};
  }

  // After a switch into half `here`: tells AddressSanitizer which stack is in use now (and, in
  // second, learns the caller's, where it came from).
  void arrived([[maybe_unused]] int here) {
#if defined(QUINTET_FIBER_ASAN)
    const void* bottom = nullptr;
    std::size_t size = 0;
    __sanitizer_finish_switch_fiber(fake_stacks_[here], &bottom, &size);
    if (here == 1) {
      main_bottom_ = bottom;
      main_size_ = size;
    }
#endif
  }

  const std::function<void()>* second_ = nullptr;
  bool second_started_ = false;  // in this run (first starts with it)
  bool ended_[2] = {false, false};
  std::exception_ptr errors_[2];
  int failed_ = -1;  // the half that threw first, if any
  int hand_overs_ = 0;
  ucontext_t contexts_[2]{};
  std::byte* stack_ = nullptr;  // the fiber's, with its guard page first (made once, kept)
#if defined(QUINTET_FIBER_ASAN)
  void* fake_stacks_[2] = {nullptr, nullptr};
  const void* main_bottom_ = nullptr;
  std::size_t main_size_ = 0;
#endif
#if defined(QUINTET_FIBER_TSAN)
  void* tsan_fibers_[2] = {nullptr, nullptr};
#endif
};

// Waits for `request`; inside a half of an overlapped_pair, first lets the other half run until
// it waits for a collective of its own or ends.
inline void await_collective(comm_request& request) {
  const detail::pair_half half = detail::running_half;
  if (half.pair != nullptr) half.pair->hand_over(half.side);
  request.wait();
}

// Whether this thread runs a half of an overlapped_pair: a layer then starts its collective
// asynchronously and calls await_collective; elsewhere it may as well block.
inline bool inside_overlapped_half() { return detail::running_half.pair != nullptr; }

}  // namespace quintet
