// thread_comm: N ranks as threads of one process, launched by thread_world{n}.run(fn). Collectives
// read and write peers' buffers directly through shared memory; a waiting rank polls briefly, then
// yields its core, then sleeps.
// Blocking calls run on the caller's thread, asynchronous ones on the communicator's own thread
// (but an asynchronous exchange posts its sends at once, on the caller's).
#pragma once

#include <quintet/comm/comm_error.hpp>
#include <quintet/comm/comm_request.hpp>
#include <quintet/comm/communicator.hpp>
#include <quintet/comm/host_reduce.hpp>
#include <quintet/comm/progress_thread.hpp>
#include <quintet/core/error.hpp>
#include <quintet/tensor/device.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <iterator>
#include <memory>
#include <mutex>
#include <numeric>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#if defined(__linux__)
#include <sched.h>
#endif

namespace quintet {

namespace detail {

// State every group of one thread_world shares: the timeout and the abort record. The first rank
// to fail records itself; every wait polls `aborted` and raises comm_error naming that rank.
struct thread_world_state {
  std::chrono::milliseconds timeout;
  // How long a waiting rank polls before it yields its core (see spin_until).
  std::chrono::nanoseconds spin;
  std::atomic<bool> aborted{false};
  std::mutex mutex;  // guards the two fields below
  int failed_rank = -1;
  std::string failure;

  thread_world_state(std::chrono::milliseconds limit, std::chrono::nanoseconds spin_budget)
      : timeout(limit), spin(spin_budget) {}

  // Returns true when this call recorded the first failure.
  bool abort(int world_rank, const std::string& message) {
    const std::lock_guard lock(mutex);
    if (aborted.load(std::memory_order_relaxed)) return false;
    failed_rank = world_rank;
    failure = message;
    aborted.store(true, std::memory_order_release);
    return true;
  }

  [[noreturn]] void raise_aborted(int world_rank) {
    const std::lock_guard lock(mutex);
    throw comm_error(
        format_message("quintet: thread_comm rank {} (world) stops: rank {} (world) "
                       "failed: {}",
                       world_rank, failed_rank, failure));
  }
};

// What a rank says about the collective it has entered; the ranks compare these.
enum class thread_collective : std::uint8_t {
  barrier,
  all_reduce,
  reduce_scatter,
  all_gather,
  broadcast,
  all_to_all,
  all_to_all_v,
  split
};

constexpr std::string_view name_of(thread_collective op) {
  constexpr std::string_view names[] = {"barrier",   "all_reduce", "reduce_scatter", "all_gather",
                                        "broadcast", "all_to_all", "all_to_all_v",   "split"};
  return names[static_cast<int>(op)];
}

struct collective_entry {
  thread_collective op = thread_collective::barrier;
  reduce_op reduction = reduce_op::sum;
  dtype type = dtype::f32;
  std::int64_t count = 0;  // input elements (split: the color)
  std::int64_t root = 0;   // broadcast root (split: the key)
  const void* in = nullptr;
  void* out = nullptr;
  const std::int64_t* in_counts = nullptr;  // all_to_all_v
  const std::int64_t* out_counts = nullptr;
};

// Messages up to this size take the one-barrier path through per-rank staging buffers.
inline constexpr std::size_t thread_comm_small_bytes = 8192;
// Messages from this size on are written with streaming stores (bench_collectives: at 64 MiB they
// cut all-reduce time by about a quarter on the 2-core development machine; below a few MiB the
// output is better left in cache).
inline constexpr std::size_t thread_comm_streaming_bytes = std::size_t{4} << 20;

struct alignas(64) thread_rank_slot {
  std::atomic<std::uint64_t> arrivals{0};  // barriers this rank has entered (timeout reports)
  std::atomic<int> cpu{-1};                // the core this rank last waited on (-1: not known)
  // Two of each, alternating by collective: a rank may enter collective k+1 while slower peers
  // still read its entry for collective k, never k-1 (they have all passed k's barrier).
  collective_entry entry[2];
  alignas(64) std::byte staging[2][thread_comm_small_bytes];
};

struct alignas(64) posted_send {
  int source = 0;
  int tag = 0;
  comm_buffer buffer;
  // 0 posted, 1 taken by the receiver, 2 delivered, 3 refused (size or type mismatch)
  std::atomic<int> state{0};
  std::int64_t receiver_count = 0;
  dtype receiver_type = dtype::f32;
};

// A waker's look at a sleeper count, after it published what the sleepers wait for: a
// read-modify-write (adding nothing), so that it and a sleeper's increment are ordered one way or
// the other — the sleeper then sees the publication, or the waker sees the sleeper.
inline int count_sleepers(std::atomic<int>& sleepers) {
  return sleepers.fetch_add(0, std::memory_order_acq_rel);
}

struct alignas(64) thread_mailbox {
  std::mutex mutex;
  std::condition_variable changed;  // a send arrived, or one of this rank's sends completed
  std::deque<posted_send*> sends;
  // sends.size(), readable without the lock: a receiver spins on it before it sleeps.
  std::atomic<std::int64_t> waiting{0};
  // Threads of the owner asleep on `changed` (or about to be): only then is it notified.
  std::atomic<int> sleepers{0};

  // Wakes the owner if it sleeps. The caller has published what it waits for; the empty critical
  // section orders that before a sleeper's check under the lock.
  void wake() {
    if (count_sleepers(sleepers) == 0) return;
    { const std::lock_guard lock(mutex); }
    changed.notify_all();
  }
};

struct thread_group_state {
  std::shared_ptr<thread_world_state> world;
  std::vector<int> world_ranks;  // group rank -> world rank
  std::unique_ptr<thread_rank_slot[]> slots;
  std::unique_ptr<thread_mailbox[]> mailboxes;
  std::vector<std::shared_ptr<thread_group_state>> split_results;  // leader -> new group

  alignas(64) std::atomic<int> arrived{0};
  // The next chunk of a large all-reduce to claim; reset at every barrier, when nobody claims.
  alignas(64) std::atomic<std::int64_t> next_chunk{0};
  alignas(64) std::atomic<std::uint64_t> generation{0};
  std::atomic<int> sleepers{0};
  std::mutex mutex;
  std::condition_variable released;

  thread_group_state(std::shared_ptr<thread_world_state> shared, std::vector<int> members)
      : world(std::move(shared)),
        world_ranks(std::move(members)),
        slots(std::make_unique<thread_rank_slot[]>(world_ranks.size())),
        mailboxes(std::make_unique<thread_mailbox[]>(world_ranks.size())),
        split_results(world_ranks.size()) {}

  int size() const { return static_cast<int>(world_ranks.size()); }
};

// Tells the core that this is a busy-wait, without giving the core up.
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// How long a waiting rank polls before it yields: a few small messages' worth. A yield is a system
// call that can take microseconds to return, so yielding early made a 1 KiB send/recv between two
// cores take 4 us where polling takes under 1 (bench_collectives, docs/comm.md). With more ranks
// than cores the rank waited for may need this very core: then yield at once.
inline std::chrono::nanoseconds spin_budget_for(int ranks) {
  int cores = static_cast<int>(std::thread::hardware_concurrency());
#if defined(__linux__)
  cpu_set_t allowed;  // the cores this process may use (taskset, a cgroup's cpuset)
  if (sched_getaffinity(0, sizeof(allowed), &allowed) == 0) cores = CPU_COUNT(&allowed);
#endif
  if (cores != 0 && ranks > cores) return std::chrono::nanoseconds{0};
  return std::chrono::microseconds{20};
}

// The core the calling thread runs on, -1 where the system does not say.
inline int current_cpu() {
#if defined(__linux__)
  return sched_getcpu();
#else
  return -1;
#endif
}

// Moves the calling thread to a core of its affinity mask that is not in `busy`, then gives it its
// mask back (a nudge, not a pin: the scheduler may move it again). False if no such core exists or
// the system refuses.
inline bool move_to_free_core(std::span<const int> busy) {
#if defined(__linux__)
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return false;
  cpu_set_t target = allowed;
  for (const int cpu : busy) {
    if (cpu >= 0 && cpu < CPU_SETSIZE) CPU_CLR(cpu, &target);
  }
  if (CPU_COUNT(&target) == 0 || sched_setaffinity(0, sizeof(target), &target) != 0) return false;
  sched_setaffinity(0, sizeof(allowed), &allowed);
  return true;
#else
  (void)busy;
  return false;
#endif
}

// How a rank waits before it sleeps on a condition variable: polling for the world's spin budget
// and then yielding a few times, only yielding, or neither.
enum class wait_style : std::uint8_t { poll, yield, sleep };

// Waits for `ready` in `style` (before any sleep); returns whether it became true. The predicate
// runs unlocked, so it must only read atomics.
template <class Ready>
inline bool spin_until(const thread_world_state& world, wait_style style, Ready ready) {
  // Not even one look for a sleeper: its predicate may need the lock (a receive's match).
  if (style == wait_style::sleep) return false;
  if (ready()) return true;
  if (style == wait_style::poll && world.spin.count() > 0) {
    const auto until = std::chrono::steady_clock::now() + world.spin;
    do {
      for (int poll = 0; poll < 64; ++poll) {
        cpu_relax();
        if (ready()) return true;
      }
    } while (std::chrono::steady_clock::now() < until);
  }
  for (int yield = 0; yield < 192; ++yield) {
    std::this_thread::yield();
    if (ready()) return true;
  }
  return false;
}

// Waits in `style` (spin_until), then sleeps on a condition variable in short slices that poll for
// an abort and the deadline (default: the world's timeout from now).
template <class Ready, class OnTimeout>
inline void wait_until(thread_world_state& world, std::mutex& mutex, std::condition_variable& cv,
                       std::atomic<int>* sleepers, int world_rank, wait_style style, Ready ready,
                       OnTimeout on_timeout, std::chrono::steady_clock::time_point deadline = {}) {
  if (spin_until(world, style, ready)) return;
  if (deadline == std::chrono::steady_clock::time_point{})
    deadline = std::chrono::steady_clock::now() + world.timeout;
  // A read-modify-write, as the wakers' look at the count is (count_sleepers): if a waker's
  // comes first, this one reads what it wrote and so sees what the waker stored before it.
  if (sleepers != nullptr) sleepers->fetch_add(1, std::memory_order_acq_rel);
  struct leave {
    std::atomic<int>* count;
    ~leave() {
      if (count != nullptr) count->fetch_sub(1, std::memory_order_relaxed);
    }
  } on_exit{sleepers};
  std::unique_lock lock(mutex);
  while (!ready()) {
    if (world.aborted.load(std::memory_order_acquire)) {
      lock.unlock();
      world.raise_aborted(world_rank);
    }
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      lock.unlock();
      on_timeout();
    }
    cv.wait_for(lock, std::min<std::chrono::steady_clock::duration>(deadline - now,
                                                                    std::chrono::milliseconds(5)));
  }
}

// The sends of one exchange, rendezvous style: each is posted to its receiver's mailbox, and the
// receiver copies it and publishes the outcome in the record. The blocking exchange keeps its
// records in a pool; an asynchronous one owns them until it completes.
struct posted_sends {
  std::vector<std::unique_ptr<posted_send>> records;  // records[0, count) are this batch's
  std::vector<int> peers;                             // the receiver of each
  std::size_t count = 0;

  std::span<const std::unique_ptr<posted_send>> batch() const { return {records.data(), count}; }

  // Posts every send of `ops` (reusing the records). Should it throw, records[0, count) are
  // exactly those in mailboxes, for retract().
  void post(thread_group_state& group, int rank, std::span<const p2p_op> ops) {
    count = 0;
    peers.clear();
    const auto sends =
        static_cast<std::size_t>(std::count_if(ops.begin(), ops.end(), [](const p2p_op& op) {
          return op.direction == p2p_op::kind::send;
        }));
    while (records.size() < sends) records.push_back(std::make_unique<posted_send>());
    peers.reserve(sends);
    for (const p2p_op& op : ops) {
      if (op.direction != p2p_op::kind::send) continue;
      posted_send& posted = *records[count];
      posted.source = rank;
      posted.tag = op.tag;
      posted.buffer = op.buffer;
      posted.state.store(0, std::memory_order_relaxed);
      auto& box = group.mailboxes[op.peer];
      {
        const std::lock_guard lock(box.mutex);
        box.sends.push_back(&posted);
        box.waiting.store(static_cast<std::int64_t>(box.sends.size()), std::memory_order_release);
      }
      ++count;
      peers.push_back(op.peer);  // reserved: does not throw
      if (box.sleepers.load(std::memory_order_seq_cst) > 0) box.changed.notify_all();
    }
  }

  bool delivered() const {
    for (const auto& posted : batch())
      if (posted->state.load(std::memory_order_acquire) < 2) return false;
    return true;
  }

  // Waits until every receiver has copied its send; a send not taken by `deadline` (default: the
  // world's timeout from now) aborts the world, a refused one (size or type) throws. Either way
  // comm_error.
  void await(thread_group_state& group, int rank, wait_style style,
             std::chrono::steady_clock::time_point deadline = {}) const {
    auto& world = *group.world;
    const int world_rank = group.world_ranks[rank];
    auto& own = group.mailboxes[rank];
    for (std::size_t s = 0; s < count; ++s) {
      const posted_send& posted = *records[s];
      wait_until(
          world, own.mutex, own.changed, &own.sleepers, world_rank, style,
          [&] { return posted.state.load(std::memory_order_acquire) >= 2; },
          [&] {
            const std::string message = format_message(
                "quintet: thread_comm send from rank {} to rank {} (tag {}) was not received "
                "within {} ms",
                rank, peers[s], posted.tag, world.timeout.count());
            world.abort(world_rank, message);
            throw comm_error(message);
          },
          deadline);
      if (posted.state.load(std::memory_order_acquire) == 3) {
        throw comm_error(format_message(
            "quintet: thread_comm send from rank {} to rank {} (tag {}): {} {} elements sent, but "
            "the receive expects {} {} elements",
            rank, peers[s], posted.tag, posted.buffer.count, name_of(posted.buffer.type),
            posted.receiver_count, name_of(posted.receiver_type)));
      }
    }
  }

  // On failure, sends nobody has taken are withdrawn; one being copied is waited for, so no peer
  // reads memory this rank is about to release.
  void retract(thread_group_state& group) const {
    for (std::size_t s = 0; s < count; ++s) {
      auto& box = group.mailboxes[peers[s]];
      {
        const std::lock_guard lock(box.mutex);
        auto it = std::find(box.sends.begin(), box.sends.end(), records[s].get());
        if (it != box.sends.end()) {
          box.sends.erase(it);
          box.waiting.store(static_cast<std::int64_t>(box.sends.size()), std::memory_order_release);
          continue;
        }
      }
      while (records[s]->state.load(std::memory_order_acquire) == 1) std::this_thread::yield();
    }
  }
};

// An asynchronous operation of thread_comm: a part queued for the progress thread (a collective,
// or an exchange's receives) and an exchange's sends. The sends are in their receivers' mailboxes
// from the call on, so a send never waits behind this rank's earlier receives (a pipeline posts
// receives well before their data exists). It holds the operation issued before it on the
// communicator, which completes first (the ordering rule). Used from the thread that issued it.
class thread_operation final : public pending_operation {
 public:
  thread_operation(std::shared_ptr<thread_group_state> group, int rank,
                   std::shared_ptr<thread_operation> previous)
      : group_(std::move(group)),
        rank_(rank),
        previous_(std::move(previous)),
        deadline_(std::chrono::steady_clock::now() + group_->world->timeout) {}

  posted_sends& sends() { return sends_; }
  void set_queued(std::shared_ptr<pending_operation> queued) { queued_ = std::move(queued); }

  void wait() override {
    complete();
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }

  // Also true once wait() would throw at once: the world was aborted, or a send has waited past
  // the world's timeout from its issue (a peer that failed never takes it).
  bool ready() override {
    if (group_->world->aborted.load(std::memory_order_acquire)) return true;
    for (thread_operation* op = this; op != nullptr && !op->completed_; op = op->previous_.get()) {
      // The queued part ends by itself (its data, an abort or its own timeout).
      if (op->queued_ && !op->queued_->ready()) return false;
      if (!op->sends_.delivered() && std::chrono::steady_clock::now() < op->deadline_) return false;
    }
    return true;
  }

  void abandon(const std::string& message) noexcept override {
    group_->world->abort(group_->world_ranks[rank_], message);
  }

  // Completes the operations issued before this one, oldest first, then this one. Their errors
  // are kept for their own wait().
  void complete() noexcept {
    std::vector<thread_operation*> chain;
    for (thread_operation* op = this; op != nullptr && !op->completed_; op = op->previous_.get()) {
      chain.push_back(op);
    }
    for (auto op = chain.rbegin(); op != chain.rend(); ++op) (*op)->complete_own();
  }

 private:
  void complete_own() noexcept {
    try {
      if (queued_) queued_->wait();
      // Polls only where the world has cores to spare (its spin budget), then yields and sleeps.
      sends_.await(*group_, rank_, wait_style::poll, deadline_);
    } catch (...) {
      sends_.retract(*group_);
      error_ = std::current_exception();
    }
    queued_.reset();
    previous_.reset();
    completed_ = true;
  }

  std::shared_ptr<thread_group_state> group_;
  int rank_;
  std::shared_ptr<thread_operation> previous_;  // null once complete
  posted_sends sends_;
  std::shared_ptr<pending_operation> queued_;       // null when nothing was queued
  std::chrono::steady_clock::time_point deadline_;  // issued + the world's timeout
  std::exception_ptr error_;
  bool completed_ = false;
};

}  // namespace detail

class thread_comm : public communicator_api<thread_comm, host> {
 public:
  thread_comm(std::shared_ptr<detail::thread_group_state> group, int rank)
      : group_(std::move(group)), rank_(rank) {}
  // The progress thread works on the object it was started for: a moved-from communicator first
  // completes its pending operations and stops it; the moved-to one starts its own when needed.
  thread_comm(thread_comm&& other) noexcept { take(other); }
  thread_comm& operator=(thread_comm&& other) noexcept {
    if (this != &other) {
      complete_pending();
      progress_.reset();
      take(other);
    }
    return *this;
  }
  // A copy would share the collective counter's history, not its future: ranks would diverge.
  thread_comm(const thread_comm&) = delete;
  thread_comm& operator=(const thread_comm&) = delete;

  int rank() const { return rank_; }
  int size() const { return group_->size(); }
  int world_rank() const { return group_->world_ranks[rank_]; }

  // Collective over this communicator: ranks with the same color form a new one, ordered by
  // (key, rank). Colors must be non-negative.
  thread_comm split(int color, int key) {
    QUINTET_CHECK(color >= 0, "thread_comm::split: color {} is negative", color);
    complete_pending();
    detail::collective_entry entry;
    entry.op = detail::thread_collective::split;
    entry.count = color;
    entry.root = key;
    enter(entry);
    const int n = size();
    std::vector<int> members;
    for (int j = 0; j < n; ++j) {
      if (peer_entry(j).count == color) members.push_back(j);
    }
    std::stable_sort(members.begin(), members.end(),
                     [&](int a, int b) { return peer_entry(a).root < peer_entry(b).root; });
    const int leader = *std::min_element(members.begin(), members.end());
    if (leader == rank_) {
      std::vector<int> world_members;
      for (const int member : members) world_members.push_back(group_->world_ranks[member]);
      group_->split_results[rank_] =
          std::make_shared<detail::thread_group_state>(group_->world, std::move(world_members));
    }
    arrive_and_wait("split");
    auto group = group_->split_results[leader];
    arrive_and_wait("split");
    if (leader == rank_) group_->split_results[rank_].reset();
    const int new_rank =
        static_cast<int>(std::find(members.begin(), members.end(), rank_) - members.begin());
    return thread_comm(std::move(group), new_rank);
  }

 private:
  friend class communicator_api<thread_comm, host>;

  void do_barrier() {
    complete_pending();
    detail::collective_entry entry;
    entry.op = detail::thread_collective::barrier;
    enter(entry);
  }

  void do_all_reduce(comm_buffer in, comm_buffer out, reduce_op op) {
    complete_pending();
    run_all_reduce(in, out, op);
  }
  comm_request do_all_reduce_async(comm_buffer in, comm_buffer out, reduce_op op) {
    return submit([this, in, out, op] { run_all_reduce(in, out, op); });
  }

  void do_reduce_scatter(comm_buffer in, comm_buffer out, reduce_op op) {
    complete_pending();
    run_reduce_scatter(in, out, op);
  }
  comm_request do_reduce_scatter_async(comm_buffer in, comm_buffer out, reduce_op op) {
    return submit([this, in, out, op] { run_reduce_scatter(in, out, op); });
  }

  void do_all_gather(comm_buffer in, comm_buffer out) {
    complete_pending();
    run_all_gather(in, out);
  }
  comm_request do_all_gather_async(comm_buffer in, comm_buffer out) {
    return submit([this, in, out] { run_all_gather(in, out); });
  }

  void do_all_to_all_v(comm_buffer in, std::span<const std::int64_t> in_counts, comm_buffer out,
                       std::span<const std::int64_t> out_counts) {
    complete_pending();
    run_all_to_all_v(in, in_counts, out, out_counts);
  }
  // The counts are copied: the peers read them from this rank's entry while the operation runs.
  comm_request do_all_to_all_v_async(comm_buffer in, std::span<const std::int64_t> in_counts,
                                     comm_buffer out, std::span<const std::int64_t> out_counts) {
    return submit([this, in, out,
                   sent = std::vector<std::int64_t>(in_counts.begin(), in_counts.end()),
                   expected = std::vector<std::int64_t>(out_counts.begin(), out_counts.end())] {
      run_all_to_all_v(in, sent, out, expected);
    });
  }

  void do_exchange(std::span<const p2p_op> ops) {
    complete_pending();
    run_exchange(ops);
  }
  comm_request do_exchange_async(std::span<const p2p_op> ops) {
    auto& world = *group_->world;
    if (world.aborted.load(std::memory_order_acquire)) world.raise_aborted(world_rank());
    std::vector<p2p_op> receives;
    std::copy_if(ops.begin(), ops.end(), std::back_inserter(receives),
                 [](const p2p_op& op) { return op.direction == p2p_op::kind::recv; });
    auto operation = std::make_shared<detail::thread_operation>(group_, rank_, last_);
    try {
      operation->sends().post(*group_, rank_, ops);
      if (!receives.empty()) {
        operation->set_queued(enqueue([this, receives = std::move(receives)] {
          for (const p2p_op& op : receives) receive(op);
        }));
      }
    } catch (...) {  // no record may stay in a peer's mailbox once the operation is gone
      operation->sends().retract(*group_);
      throw;
    }
    last_ = operation;
    return comm_request(std::move(operation));
  }

  template <class Body>
  comm_request submit(Body body) {
    auto operation = std::make_shared<detail::thread_operation>(group_, rank_, last_);
    operation->set_queued(enqueue(std::move(body)));
    last_ = operation;
    return comm_request(std::move(operation));
  }

  // The first asynchronous operation starts the progress thread.
  template <class Body>
  std::shared_ptr<detail::pending_operation> enqueue(Body body) {
    if (!progress_) progress_ = std::make_unique<detail::progress_thread>();
    return progress_->submit(
        std::move(body), [world = group_->world, rank = world_rank()](const std::string& message) {
          world->abort(rank, message);
        });
  }

  // Blocking calls run inline once the operations issued before them are complete (their errors
  // stay with their requests).
  void complete_pending() {
    if (progress_) progress_->drain();
    if (last_) last_->complete();
    last_.reset();
  }

  void take(thread_comm& other) noexcept {
    other.complete_pending();
    other.progress_.reset();
    group_ = std::move(other.group_);
    rank_ = other.rank_;
    sequence_ = other.sequence_;
    entered_parity_ = other.entered_parity_;
    last_move_ = other.last_move_;
  }

  void run_all_reduce(comm_buffer in, comm_buffer out, reduce_op op) {
    const int n = size();
    detail::collective_entry entry = make_entry(detail::thread_collective::all_reduce, in, out);
    entry.reduction = op;
    const std::size_t bytes = in.bytes();
    if (bytes <= detail::thread_comm_small_bytes) {
      // Low latency: stage the input, one barrier, every rank reduces all staged copies itself.
      std::byte* staging = group_->slots[rank_].staging[sequence_ % 2];
      if (bytes > 0) std::memcpy(staging, in.data, bytes);
      const std::uint64_t parity = sequence_ % 2;
      enter(entry);
      std::vector<const void*> inputs(n);
      for (int j = 0; j < n; ++j) inputs[j] = group_->slots[j].staging[parity];
      void* const outputs[] = {out.data};
      detail::reduce_buffers(in.type, inputs, outputs, 0, in.count, op);
      return;
    }
    enter(entry);
    // The ranks claim chunks (64-byte aligned, at least 4 per rank) until none is left; a chunk
    // is read from every input once and written to every output once: a reduce-scatter and an
    // all-gather in one pass. Claiming instead of fixed 1/n shares lets running ranks take over
    // the work of a preempted one (8 ranks share 2 cores in the tests). Which rank reduces a
    // chunk does not change its bits: every chunk is combined in rank order.
    std::vector<const void*> inputs(n);
    std::vector<void*> outputs(n);
    for (int j = 0; j < n; ++j) {
      inputs[j] = peer_entry(j).in;
      outputs[j] = peer_entry(j).out;
    }
    const std::int64_t chunk = chunk_elements(in.count, in.type);
    const bool streaming = bytes >= detail::thread_comm_streaming_bytes;
    auto& next = group_->next_chunk;
    for (std::int64_t begin = next.fetch_add(1, std::memory_order_relaxed) * chunk;
         begin < in.count; begin = next.fetch_add(1, std::memory_order_relaxed) * chunk) {
      detail::reduce_buffers(in.type, inputs, outputs, begin, std::min(chunk, in.count - begin), op,
                             streaming);
    }
    if (streaming) detail::stream_fence();
    arrive_and_wait("all_reduce");
  }

  void run_reduce_scatter(comm_buffer in, comm_buffer out, reduce_op op) {
    const int n = size();
    detail::collective_entry entry = make_entry(detail::thread_collective::reduce_scatter, in, out);
    entry.reduction = op;
    enter(entry);
    std::vector<const void*> inputs(n);
    for (int j = 0; j < n; ++j) inputs[j] = peer_entry(j).in;
    // Rank r's block starts at r * count in every input; shifting the output pointer back by the
    // same offset lets one call address both.
    const std::int64_t offset = static_cast<std::int64_t>(rank_) * out.count;
    void* const outputs[] = {static_cast<std::byte*>(out.data) -
                             static_cast<std::ptrdiff_t>(offset * size_of(out.type))};
    const bool streaming = in.bytes() >= detail::thread_comm_streaming_bytes;
    detail::reduce_buffers(in.type, inputs, outputs, offset, out.count, op, streaming);
    if (streaming) detail::stream_fence();
    arrive_and_wait("reduce_scatter");
  }

  void run_all_gather(comm_buffer in, comm_buffer out) {
    enter(make_entry(detail::thread_collective::all_gather, in, out));
    const std::size_t block = in.bytes();
    for (int j = 0; j < size(); ++j) {
      auto* target = static_cast<std::byte*>(out.data) + block * j;
      if (target != peer_entry(j).in) copy_bytes(target, peer_entry(j).in, block, out.bytes());
    }
    arrive_and_wait("all_gather");
  }

  void do_broadcast(comm_buffer inout, int root) {
    complete_pending();
    detail::collective_entry entry = make_entry(detail::thread_collective::broadcast, inout, inout);
    entry.root = root;
    enter(entry);
    if (rank_ != root) copy_bytes(inout.data, peer_entry(root).in, inout.bytes(), inout.bytes());
    arrive_and_wait("broadcast");
  }

  void do_all_to_all(comm_buffer in, comm_buffer out) {
    complete_pending();
    enter(make_entry(detail::thread_collective::all_to_all, in, out));
    const std::size_t block = in.bytes() / size();
    for (int j = 0; j < size(); ++j) {
      copy_bytes(static_cast<std::byte*>(out.data) + block * j,
                 static_cast<const std::byte*>(peer_entry(j).in) + block * rank_, block,
                 out.bytes());
    }
    arrive_and_wait("all_to_all");
  }

  void run_all_to_all_v(comm_buffer in, std::span<const std::int64_t> in_counts, comm_buffer out,
                        std::span<const std::int64_t> out_counts) {
    const int n = size();
    detail::collective_entry entry = make_entry(detail::thread_collective::all_to_all_v, in, out);
    entry.count = 0;  // the buffers may differ in size; the per-peer counts are compared instead
    entry.in_counts = in_counts.data();
    entry.out_counts = out_counts.data();
    enter(entry);
    // Every rank checks every pair, so all raise the same error; they leave together (one more
    // barrier), since the counts are read from the peers' memory.
    std::string disagreement;
    for (int receiver = 0; receiver < n && disagreement.empty(); ++receiver) {
      for (int sender = 0; sender < n && disagreement.empty(); ++sender) {
        const std::int64_t sent = peer_entry(sender).in_counts[receiver];
        const std::int64_t expected = peer_entry(receiver).out_counts[sender];
        if (sent != expected) {
          disagreement = detail::format_message(
              "quintet: thread_comm all_to_all_v: rank {} sends {} elements to rank {}, which "
              "expects {}",
              sender, sent, receiver, expected);
        }
      }
    }
    if (!disagreement.empty()) {
      arrive_and_wait("all_to_all_v");
      throw comm_error(disagreement);
    }
    const std::size_t element = size_of(in.type);
    std::int64_t out_offset = 0;
    for (int j = 0; j < n; ++j) {
      const std::int64_t* sent = peer_entry(j).in_counts;
      const std::int64_t in_offset = std::accumulate(sent, sent + rank_, std::int64_t{0});
      copy_bytes(static_cast<std::byte*>(out.data) + out_offset * element,
                 static_cast<const std::byte*>(peer_entry(j).in) + in_offset * element,
                 static_cast<std::size_t>(out_counts[j]) * element);
      out_offset += out_counts[j];
    }
    arrive_and_wait("all_to_all_v");
  }

  // Sends are posted to the receivers' mailboxes first, then receives are served in order, then
  // the sends are awaited: a batch never waits on itself. The receiver copies (rendezvous).
  void run_exchange(std::span<const p2p_op> ops) {
    auto& world = *group_->world;
    if (world.aborted.load(std::memory_order_acquire)) world.raise_aborted(world_rank());
    try {
      sends_.post(*group_, rank_, ops);
      for (const p2p_op& op : ops) {
        if (op.direction == p2p_op::kind::recv) receive(op);
      }
      sends_.await(*group_, rank_, style_of_wait());
    } catch (...) {
      sends_.retract(*group_);
      throw;
    }
  }

  void receive(const p2p_op& op) {
    auto& world = *group_->world;
    auto& own = group_->mailboxes[rank_];
    detail::posted_send* match = nullptr;
    auto find = [&] {
      for (auto it = own.sends.begin(); it != own.sends.end(); ++it) {
        if ((*it)->source == op.peer && (*it)->tag == op.tag) {
          match = *it;
          own.sends.erase(it);
          own.waiting.store(static_cast<std::int64_t>(own.sends.size()), std::memory_order_release);
          match->state.store(1, std::memory_order_relaxed);
          return true;
        }
      }
      return false;
    };
    // The mailbox is read with its lock held; first spin on its count of waiting sends (a message
    // that is already there, or arrives within the spin, costs no sleep and no wake-up), then
    // sleep on the condition variable.
    auto arrived = [&] {
      if (own.waiting.load(std::memory_order_acquire) == 0) return false;
      const std::lock_guard lock(own.mutex);
      return find();
    };
    if (!detail::spin_until(world, style_of_wait(), arrived))
      detail::wait_until(
          world, own.mutex, own.changed, &own.sleepers, world_rank(), detail::wait_style::sleep,
          find, [&] {
            fail(detail::format_message(
                "quintet: thread_comm rank {} waited {} ms for a send from rank {} (tag {}) that "
                "never came",
                rank_, world.timeout.count(), op.peer, op.tag));
          });
    const bool fits =
        match->buffer.count == op.buffer.count && match->buffer.type == op.buffer.type;
    if (fits) copy_bytes(op.buffer.data, match->buffer.data, op.buffer.bytes());
    // Once the state is published the sender may release `match`: keep what the message needs.
    const comm_buffer sent = match->buffer;
    match->receiver_count = op.buffer.count;
    match->receiver_type = op.buffer.type;
    match->state.store(fits ? 2 : 3, std::memory_order_seq_cst);
    group_->mailboxes[op.peer].wake();
    if (!fits) {
      throw comm_error(detail::format_message(
          "quintet: thread_comm recv on rank {} from rank {} (tag {}): expects {} {} elements, "
          "but {} {} elements were sent",
          rank_, op.peer, op.tag, op.buffer.count, name_of(op.buffer.type), sent.count,
          name_of(sent.type)));
    }
  }

  detail::collective_entry make_entry(detail::thread_collective op, comm_buffer in,
                                      comm_buffer out) const {
    detail::collective_entry entry;
    entry.op = op;
    entry.type = in.type;
    entry.count = in.count;
    entry.in = in.data;
    entry.out = out.data;
    return entry;
  }

  const detail::collective_entry& peer_entry(int peer) const {
    return group_->slots[peer].entry[entered_parity_];
  }

  // Publishes this rank's entry, waits for every rank, and checks that all entered the same
  // collective with the same element type, count and root.
  void enter(const detail::collective_entry& entry) {
    auto& world = *group_->world;
    if (world.aborted.load(std::memory_order_acquire)) world.raise_aborted(world_rank());
    entered_parity_ = sequence_ % 2;
    ++sequence_;
    group_->slots[rank_].entry[entered_parity_] = entry;
    arrive_and_wait(name_of(entry.op));
    check_agreement(entry);
  }

  void check_agreement(const detail::collective_entry& mine) const {
    const int n = size();
    bool agree = true;
    for (int j = 0; j < n; ++j) {
      const auto& other = peer_entry(j);
      const bool same_root =
          mine.op != detail::thread_collective::broadcast || other.root == mine.root;
      const bool same_values = mine.op == detail::thread_collective::split ||
                               (other.count == mine.count && other.type == mine.type &&
                                other.reduction == mine.reduction && same_root);
      agree = agree && other.op == mine.op && same_values;
    }
    if (agree) return;
    std::string ranks;
    for (int j = 0; j < n; ++j) {
      const auto& other = peer_entry(j);
      ranks += detail::format_message("{}rank {}: {} of {} {} elements", j == 0 ? "" : "; ", j,
                                      name_of(other.op), other.count, name_of(other.type));
      if (other.op == detail::thread_collective::broadcast) {
        ranks += detail::format_message(" from root {}", other.root);
      }
      if (other.op == detail::thread_collective::all_reduce ||
          other.op == detail::thread_collective::reduce_scatter) {
        ranks += detail::format_message(" ({})", name_of(other.reduction));
      }
    }
    throw comm_error("quintet: thread_comm ranks disagree about the collective: " + ranks);
  }

  void arrive_and_wait(std::string_view what) {
    auto& group = *group_;
    const int n = group.size();
    const std::uint64_t arrivals =
        group.slots[rank_].arrivals.fetch_add(1, std::memory_order_relaxed) + 1;
    const std::uint64_t generation = group.generation.load(std::memory_order_acquire);
    if (group.arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == n) {
      group.arrived.store(0, std::memory_order_relaxed);
      group.next_chunk.store(0, std::memory_order_relaxed);
      group.generation.store(generation + 1, std::memory_order_seq_cst);
      if (detail::count_sleepers(group.sleepers) > 0) {
        { const std::lock_guard lock(group.mutex); }
        group.released.notify_all();
      }
      return;
    }
    detail::wait_until(
        *group.world, group.mutex, group.released, &group.sleepers, world_rank(), style_of_wait(),
        [&] { return group.generation.load(std::memory_order_acquire) != generation; },
        [&] {
          std::string missing;
          for (int j = 0; j < n; ++j) {
            if (group.slots[j].arrivals.load(std::memory_order_relaxed) < arrivals) {
              missing += detail::format_message("{}{} (world {})", missing.empty() ? "" : ", ", j,
                                                group.world_ranks[j]);
            }
          }
          fail(detail::format_message(
              "quintet: thread_comm {} timed out after {} ms on rank {}: ranks {} did not arrive",
              what, group.world->timeout.count(), rank_, missing));
        });
  }

  // How a wait should begin. Polling pays only while no peer of the group shares this rank's core.
  // A new thread starts on its parent's core, and ranks that mostly wait for each other can stay
  // there (a 2-rank broadcast of 4 KiB took 10.6 us instead of 0.3): polling would keep the peer
  // from running, and sleeping lets the wake-up place the sleeper next to its waker again. So the
  // higher rank of such a pair moves itself to a core no rank of the group uses, if there is one
  // (at most once a millisecond), while the lower one yields to it. Every wait publishes the
  // rank's core, so the answer follows the scheduler.
  detail::wait_style style_of_wait() {
    auto& slots = group_->slots;
    int cpu = detail::current_cpu();
    slots[rank_].cpu.store(cpu, std::memory_order_relaxed);
    if (cpu < 0) return detail::wait_style::poll;
    bool shared = false, below = false;
    for (int j = 0; j < size(); ++j) {
      if (j != rank_ && slots[j].cpu.load(std::memory_order_relaxed) == cpu) {
        shared = true;
        below = below || j < rank_;
      }
    }
    if (!shared) return detail::wait_style::poll;
    if (group_->world->spin.count() == 0)
      return detail::wait_style::yield;            // more ranks than cores
    if (!below) return detail::wait_style::yield;  // the peer above moves
    const auto now = std::chrono::steady_clock::now();
    if (now - last_move_ < std::chrono::milliseconds(1)) return detail::wait_style::yield;
    last_move_ = now;
    std::vector<int> busy(static_cast<std::size_t>(size()));
    for (int j = 0; j < size(); ++j) busy[j] = slots[j].cpu.load(std::memory_order_relaxed);
    if (!detail::move_to_free_core(busy)) return detail::wait_style::yield;
    slots[rank_].cpu.store(detail::current_cpu(), std::memory_order_relaxed);
    return detail::wait_style::poll;
  }

  // Chunks of a large all-reduce: at most 64 KiB and at least 4 per rank, on 64-byte boundaries
  // so that ranks never write the same cache line.
  std::int64_t chunk_elements(std::int64_t count, dtype type) const {
    const auto element = static_cast<std::int64_t>(size_of(type));
    const std::int64_t align = std::max<std::int64_t>(1, 64 / element);
    const std::int64_t wanted = std::min<std::int64_t>((64 << 10) / element, count / (4 * size()));
    return std::max(align, wanted / align * align);
  }

  // `total` is the size of the whole message, which decides whether streaming stores pay.
  static void copy_bytes(void* target, const void* source, std::size_t bytes,
                         std::size_t total = 0) {
    if (bytes == 0) return;
    const bool streaming = total >= detail::thread_comm_streaming_bytes;
    detail::write_block(target, source, bytes, streaming);
    if (streaming) detail::stream_fence();
  }

  [[noreturn]] void fail(const std::string& message) {
    group_->world->abort(world_rank(), message);
    throw comm_error(message);
  }

  std::shared_ptr<detail::thread_group_state> group_;
  int rank_ = 0;
  std::uint64_t sequence_ = 0;  // collectives entered on this communicator
  std::uint64_t entered_parity_ = 0;
  // The blocking exchange's send records, reused from batch to batch.
  detail::posted_sends sends_;
  // The asynchronous operation issued last, unless a blocking call has completed it since. Each
  // holds the one before it, so completing it completes everything issued on this communicator.
  std::shared_ptr<detail::thread_operation> last_;
  // When style_of_wait last moved this rank off a core it shared with a peer.
  std::chrono::steady_clock::time_point last_move_{};
  // Started by the first asynchronous operation; it works on this object's members above. Last,
  // so that on destruction it runs what is pending (peers take part) while those still exist.
  std::unique_ptr<detail::progress_thread> progress_;
};

// thread_world{n}.run(fn): runs fn(thread_comm&) on n ranks, each a thread (rank 0 is the calling
// thread), and rethrows the error of the first rank that failed. A failure aborts every rank's
// communicators; `timeout` bounds every wait, turning a hang into comm_error.
struct thread_world {
  int size = 1;
  std::chrono::milliseconds timeout{60000};

  template <class Fn>
  void run(Fn&& fn) const {
    QUINTET_CHECK(size >= 1, "thread_world needs at least one rank, got {}", size);
    QUINTET_CHECK(timeout.count() > 0, "thread_world timeout must be positive, got {} ms",
                  timeout.count());
    auto world =
        std::make_shared<detail::thread_world_state>(timeout, detail::spin_budget_for(size));
    std::vector<int> members(size);
    std::iota(members.begin(), members.end(), 0);
    auto group = std::make_shared<detail::thread_group_state>(world, std::move(members));
    std::vector<std::exception_ptr> errors(size);
    auto body = [&](int rank) {
      try {
        thread_comm comm(group, rank);
        fn(comm);
      } catch (const std::exception& failure) {
        errors[rank] = std::current_exception();
        world->abort(rank, failure.what());
      } catch (...) {
        errors[rank] = std::current_exception();
        world->abort(rank, "an exception not derived from std::exception");
      }
    };
    std::vector<std::thread> threads;
    threads.reserve(size - 1);
    for (int rank = 1; rank < size; ++rank) threads.emplace_back(body, rank);
    body(0);
    for (auto& thread : threads) thread.join();
    if (world->aborted.load(std::memory_order_acquire)) {
      const int first = world->failed_rank;
      if (errors[first]) std::rethrow_exception(errors[first]);
      throw comm_error("quintet: thread_world rank " + std::to_string(first) +
                       " failed: " + world->failure);
    }
  }
};

}  // namespace quintet
