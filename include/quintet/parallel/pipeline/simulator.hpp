// simulate: runs a schedule's lists against a cost model and gives the start and end of every
// action, the transfers, the makespan, each rank's bubble and its peak activation memory. The
// generators time their compute order with it (unit costs) to place communication, the formula
// tests compare its numbers with the published ones, and the trace and SVG draw its timeline.
//
// How time passes, as executors run (PyTorch's runtime, Megatron's batched p2p, NCCL):
//   compute      starts when the rank is free and its inputs are there, runs for its cost
//   SEND / RECV  post the transfer and take no time on the rank; the transfer starts once both
//                sides have posted and lasts latency + bytes / bandwidth; the compute that needs
//                the data waits for it
//   EVICT ...    likewise on the context link: the owner's memory is freed when its context has
//                left, the partner's is taken when the transfer starts (its receive buffer)
//   OVERLAP_F_B  one compute: starts when the rank is free and the inputs of both halves are
//                there, lasts the pair's F&B time (below), and both outputs appear at its end
// A compute-only schedule (no SEND/RECV listed) moves data implicitly: a transfer starts when the
// data is produced. Memory: a forward takes its context's bytes when it starts; the input pass
// (I) gives back what the weight pass does not need; the weight pass or a whole backward (B) gives
// back the rest when it ends. A context counts until its last backward pass ends; an overlapped
// pair takes its forward's context at its start and frees its backward's at its end.
//
// F&B, the time of an overlapped pair (DeepSeek's "execution time of two mutually overlapped
// forward and backward chunks"), is stage_costs::forward_and_backward of the forward's stage
// when given, and by default the sum of its halves, F + B. Why the sum: what DualPipe overlaps
// is one chunk's communication (expert all-to-all, pipeline p2p) with the other chunk's compute;
// the two computes share the device, so without communication inside a chunk (this model has
// none) the pair takes F + B. Give the measured pair time — max(F, B) is perfect overlap — to
// model a chunk whose communication the pair hides.
//
// The schedule must be valid (verifier.hpp); one that cannot run stops with an error naming where.
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/parallel/pipeline/schedule.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace quintet::parallel::pipeline {

// What one virtual stage costs (time in any unit; bytes in any unit).
struct stage_costs {
  double forward = 1;
  double backward_input = 1;
  double backward_weight = 1;
  double backward = 0;        // a whole backward; 0: backward_input + backward_weight
  double context_bytes = 1;   // what a forward keeps for the backward (activation memory)
  double weight_bytes = -1;   // what the input pass leaves for the weight pass; < 0: all of it
  double boundary_bytes = 1;  // the stage's output (and its gradient), sent to the next stage
  // F&B: an OVERLAP_F_B whose forward half runs on this stage; 0: its halves' F + B (see above).
  double forward_and_backward = 0;

  double whole_backward() const {
    return backward > 0 ? backward : backward_input + backward_weight;
  }
  double kept_for_weight() const { return weight_bytes < 0 ? context_bytes : weight_bytes; }

  // The same stage cut into `parts` equal pieces (a device's layers over v chunks).
  stage_costs divided(int parts) const {
    const double n = parts;
    return {forward / n,    backward_input / n,      backward_weight / n,
            backward / n,   context_bytes / n,       weight_bytes < 0 ? -1 : weight_bytes / n,
            boundary_bytes, forward_and_backward / n};
  }
};

struct cost_model {
  std::vector<stage_costs> stages =
      std::vector<stage_costs>(1);  // one per virtual stage, or one for all
  double p2p_latency = 0;
  double p2p_bandwidth = 0;      // bytes per time unit; 0: unlimited
  double context_latency = 0;    // the link EVICT and RELOAD use
  double context_bandwidth = 0;  // 0: unlimited

  const stage_costs& of(int stage) const {
    return stages.size() == 1 ? stages.front() : stages[static_cast<std::size_t>(stage)];
  }

  // Every virtual stage is 1/chunks of a device stage costing `device`.
  static cost_model split(const stage_costs& device, int chunks) {
    cost_model m;
    m.stages = {device.divided(chunks)};
    return m;
  }
};

struct timed_action {
  action what;
  double start = 0;
  double end = 0;  // a transfer's end is when its data arrived
};

// One transfer: a send met by its recv (or, in a compute-only schedule, data moved implicitly:
// then the indices are those of the producing and consuming compute actions).
struct transfer_record {
  action_kind kind = action_kind::send_forward;  // SEND_F, SEND_B, EVICT or RETURN
  int stage = 0;  // the sending stage (the owner's stage for context moves)
  int micro_batch = 0;
  int from_rank = 0, from_index = 0;
  int to_rank = 0, to_index = 0;
  double begin = 0, end = 0, bytes = 0;
};

struct simulation {
  std::vector<std::vector<timed_action>> timeline;  // (ranks) the schedule's actions, timed
  std::vector<transfer_record> transfers;
  double makespan = 0;              // the end of the last compute
  std::vector<double> busy;         // (ranks) time spent computing
  std::vector<double> bubble;       // (ranks) idle share of the makespan: 1 - busy / makespan
  std::vector<double> span_bubble;  // (ranks) idle share of the rank's own first start .. last
                                    // end: what remains when steps overlap (post-validation)
  std::vector<int> peak_contexts;   // (ranks) most contexts held at once (own and accepted)
  std::vector<double> peak_bytes;   // (ranks) most activation bytes held at once
  double p2p_bytes = 0;             // between stages
  int p2p_messages = 0;
  double context_bytes_moved = 0;  // evictions and reloads

  double max_bubble() const {
    return busy.empty() ? 0 : *std::max_element(bubble.begin(), bubble.end());
  }
  double max_idle() const {
    double most = 0;
    for (const double b : busy) most = std::max(most, makespan - b);
    return most;
  }
};

namespace detail {

inline double transfer_time(double bytes, double latency, double bandwidth) {
  return latency + (bandwidth > 0 ? bytes / bandwidth : 0);
}

struct memory_event {
  double time;
  double bytes;
  int contexts;
};

// Runs the lists; see the header comment for the rules.
class simulator {
 public:
  simulator(const schedule& s, const cost_model& costs)
      : s_(s),
        costs_(costs),
        ranks_(s.ranks()),
        stages_(s.stages()),
        micro_batches_(s.micro_batches),
        explicit_(s.has_stage_transfers()) {
    QUINTET_CHECK(costs.stages.size() == 1 || static_cast<int>(costs.stages.size()) == stages_,
                  "simulate: the cost model has {} stage entries for {} stages (give one, or one "
                  "per stage)",
                  costs.stages.size(), stages_);
    const std::size_t keys = static_cast<std::size_t>(stages_) * micro_batches_;
    f_end_.assign(keys, unknown);
    i_end_.assign(keys, unknown);
    in_arrival_.assign(keys, unknown);
    grad_arrival_.assign(keys, unknown);
    if (explicit_) stage_posts_.assign(2 * keys, posted{-1, 0, false});
    out_.timeline.resize(static_cast<std::size_t>(ranks_));
    std::size_t sends = 0;
    for (int r = 0; r < ranks_; ++r) {
      auto& line = out_.timeline[static_cast<std::size_t>(r)];
      line.reserve(s.on(r).size());
      for (const action& a : s.on(r)) {
        line.push_back({a, 0, 0});
        sends += is_send(a.kind) || (!explicit_ && a.kind != action_kind::backward_weight) ? 1 : 0;
      }
    }
    out_.transfers.reserve(sends);
    memory_.resize(static_cast<std::size_t>(ranks_));
    cursor_.assign(static_cast<std::size_t>(ranks_), 0);
    free_at_.assign(static_cast<std::size_t>(ranks_), 0.0);
    queued_.assign(static_cast<std::size_t>(ranks_), 1);
    for (int r = ranks_ - 1; r >= 0; --r) work_.push_back(r);
  }

  simulation run() {
    while (!work_.empty()) {
      const int r = work_.back();
      work_.pop_back();
      queued_[static_cast<std::size_t>(r)] = 0;
      advance(r);
    }
    for (int r = 0; r < ranks_; ++r) {
      const std::size_t at = cursor_[static_cast<std::size_t>(r)];
      const auto& list = s_.on(r);
      QUINTET_CHECK(at == list.size(),
                    "simulate: rank {} cannot run its action {} ({}): the schedule waits forever "
                    "there (verify it first: pipeline::verify names the cause)",
                    r, at, to_string(list[at]));
    }
    finish();
    return std::move(out_);
  }

 private:
  static constexpr double unknown = -1;

  std::size_t key(int stage, int micro_batch) const {
    return static_cast<std::size_t>(stage) * static_cast<std::size_t>(micro_batches_) +
           static_cast<std::size_t>(micro_batch);
  }
  // A transfer's channel: what moves (0 activation, 1 gradient, 2 eviction, 3 return) and whose.
  static std::uint64_t channel(int what, int stage, int micro_batch) {
    return (static_cast<std::uint64_t>(what) << 60) | (static_cast<std::uint64_t>(stage) << 32) |
           static_cast<std::uint64_t>(micro_batch);
  }

  void wake(int rank) {
    if (rank < 0 || queued_[static_cast<std::size_t>(rank)]) return;
    queued_[static_cast<std::size_t>(rank)] = 1;
    work_.push_back(rank);
  }

  void advance(int r) {
    auto& at = cursor_[static_cast<std::size_t>(r)];
    const auto& list = s_.on(r);
    while (at < list.size()) {
      if (!step(r, static_cast<int>(at), list[at])) return;
      ++at;
    }
  }

  void memory(int rank, double time, double bytes, int contexts) {
    memory_[static_cast<std::size_t>(rank)].push_back({time, bytes, contexts});
  }

  void compute(int r, int index, double ready, double cost) {
    double& free = free_at_[static_cast<std::size_t>(r)];
    timed_action& t = out_.timeline[static_cast<std::size_t>(r)][static_cast<std::size_t>(index)];
    t.start = std::max(free, ready);
    t.end = t.start + cost;
    free = t.end;
  }

  // Bytes a context holds now: all of it before its input pass, what W needs after.
  double held_bytes(int stage, int micro_batch) const {
    const stage_costs& c = costs_.of(stage);
    return i_end_[key(stage, micro_batch)] == unknown ? c.context_bytes : c.kept_for_weight();
  }

  // When an evicted context is back (unknown while it is away); 0 if it never left.
  double context_ready(int stage, int micro_batch) const {
    const auto found = away_.find(key(stage, micro_batch));
    return found == away_.end() ? 0 : found->second;
  }

  // When (stage s, micro-batch k)'s forward on rank r has its input; unknown while it has not.
  double forward_ready(int r, int s, int k) const {
    if (s == 0) return 0;
    const double produced = f_end_[key(s - 1, k)];
    if (s_.rank_of(s - 1) == r) return produced;
    if (explicit_) return in_arrival_[key(s, k)];
    if (produced == unknown) return unknown;
    return produced + boundary_time(s - 1);
  }

  // When (s, k)'s backward (B or I) on rank r has its context and its output gradient.
  double backward_ready(int r, int s, int k) const {
    const double forward_done = f_end_[key(s, k)];
    const double back = context_ready(s, k);
    if (forward_done == unknown || back == unknown) return unknown;
    double ready = std::max(forward_done, back);
    if (s + 1 < stages_) {
      const double produced = i_end_[key(s + 1, k)];
      double gradient = unknown;
      if (s_.rank_of(s + 1) == r) {
        gradient = produced;
      } else if (explicit_) {
        gradient = grad_arrival_[key(s, k)];
      } else if (produced != unknown) {
        gradient = produced + boundary_time(s);
      }
      if (gradient == unknown) return unknown;
      ready = std::max(ready, gradient);
    }
    return ready;
  }

  // The p2p time of stage s's output (or of its gradient).
  double boundary_time(int s) const {
    return transfer_time(costs_.of(s).boundary_bytes, costs_.p2p_latency, costs_.p2p_bandwidth);
  }

  // The effects of a forward that ran as `t`.
  void forward_ran(int r, const timed_action& t, int s, int k) {
    if (!explicit_ && s > 0 && s_.rank_of(s - 1) != r) {
      implicit_transfer(action_kind::send_forward, s - 1, k, s_.rank_of(s - 1), r,
                        f_end_[key(s - 1, k)], costs_.of(s - 1).boundary_bytes);
    }
    f_end_[key(s, k)] = t.end;
    memory(r, t.start, costs_.of(s).context_bytes, 1);
    if (!explicit_ && s + 1 < stages_) wake(s_.rank_of(s + 1));
  }

  // The effects of a backward (B, or I when not `whole`) that ran as `t`.
  void backward_ran(int r, const timed_action& t, int s, int k, bool whole) {
    if (!explicit_ && s + 1 < stages_ && s_.rank_of(s + 1) != r) {
      implicit_transfer(action_kind::send_backward, s + 1, k, s_.rank_of(s + 1), r,
                        i_end_[key(s + 1, k)], costs_.of(s).boundary_bytes);
    }
    const stage_costs& c = costs_.of(s);
    i_end_[key(s, k)] = t.end;
    if (whole) {
      memory(r, t.end, -c.context_bytes, -1);
    } else {
      memory(r, t.end, -(c.context_bytes - c.kept_for_weight()), 0);
    }
    if (!explicit_ && s > 0) wake(s_.rank_of(s - 1));
  }

  // F&B: the forward stage's given pair time, or the sum of the halves.
  double pair_time(const action& a) const {
    const stage_costs& f = costs_.of(a.stage);
    if (f.forward_and_backward > 0) return f.forward_and_backward;
    return f.forward + costs_.of(a.backward_stage).whole_backward();
  }

  bool step(int r, int index, const action& a) {
    const int s = a.stage, k = a.micro_batch;
    for (const action& half : halves(a)) {
      QUINTET_CHECK(half.stage >= 0 && half.stage < stages_ && half.micro_batch >= 0 &&
                        half.micro_batch < micro_batches_,
                    "simulate: rank {} action {} ({}) is outside {} stages x {} micro-batches", r,
                    index, to_string(a), stages_, micro_batches_);
    }
    QUINTET_CHECK(!is_stage_transfer(a.kind) || mapped_peer(s_, a) != action::no_peer,
                  "simulate: rank {} action {} ({}) has no neighbouring stage to talk to", r, index,
                  to_string(a));
    const stage_costs& c = costs_.of(s);
    timed_action& t = out_.timeline[static_cast<std::size_t>(r)][static_cast<std::size_t>(index)];
    double& free = free_at_[static_cast<std::size_t>(r)];
    switch (a.kind) {
      case action_kind::forward: {
        const double ready = forward_ready(r, s, k);
        if (ready == unknown) return false;
        compute(r, index, ready, c.forward);
        forward_ran(r, t, s, k);
        return true;
      }
      case action_kind::backward:
      case action_kind::backward_input: {
        const double ready = backward_ready(r, s, k);
        if (ready == unknown) return false;
        const bool whole = a.kind == action_kind::backward;
        compute(r, index, ready, whole ? c.whole_backward() : c.backward_input);
        backward_ran(r, t, s, k, whole);
        return true;
      }
      case action_kind::overlap_f_b: {
        const int bs = a.backward_stage, bk = a.backward_micro_batch;
        const double forward = forward_ready(r, s, k);
        const double backward = backward_ready(r, bs, bk);
        if (forward == unknown || backward == unknown) return false;
        compute(r, index, std::max(forward, backward), pair_time(a));
        forward_ran(r, t, s, k);
        backward_ran(r, t, bs, bk, true);
        return true;
      }
      case action_kind::backward_weight: {
        const double input_done = i_end_[key(s, k)];
        const double back = context_ready(s, k);
        if (input_done == unknown || back == unknown) return false;
        compute(r, index, std::max(input_done, back), c.backward_weight);
        memory(r, t.end, -c.kept_for_weight(), -1);
        return true;
      }
      case action_kind::send_forward:
      case action_kind::send_backward: {
        const bool forward = a.kind == action_kind::send_forward;
        const double data = forward ? f_end_[key(s, k)] : i_end_[key(s, k)];
        if (data == unknown) return false;
        t.start = t.end = std::max(free, data);
        post(channel(forward ? 0 : 1, s, k), r, index, true);
        return true;
      }
      case action_kind::recv_forward:
      case action_kind::recv_backward: {
        const bool forward = a.kind == action_kind::recv_forward;
        t.start = t.end = free;
        post(channel(forward ? 0 : 1, forward ? s - 1 : s + 1, k), r, index, false);
        return true;
      }
      case action_kind::evict: {
        if (f_end_[key(s, k)] == unknown) return false;
        away_[key(s, k)] = unknown;
        t.start = t.end = free;
        post(channel(2, s, k), r, index, true);
        return true;
      }
      case action_kind::accept: {
        t.start = t.end = free;
        post(channel(2, s, k), r, index, false);
        return true;
      }
      case action_kind::hand_back: {
        // A context can go back only once it has arrived here.
        if (evicted_end_.find(key(s, k)) == evicted_end_.end()) return false;
        t.start = t.end = free;
        post(channel(3, s, k), r, index, true);
        return true;
      }
      case action_kind::reload: {
        t.start = t.end = free;
        post(channel(3, s, k), r, index, false);
        return true;
      }
    }
    return true;
  }

  struct posted {
    int rank;
    int index;
    bool send;
  };

  void post(std::uint64_t ch, int r, int index, bool send) {
    const int what = static_cast<int>(ch >> 60);
    if (what <= 1) {  // activations and gradients: one slot per (what, stage, micro-batch)
      const std::size_t slot =
          2 * key(static_cast<int>((ch >> 32) & 0x0fffffff), static_cast<int>(ch & 0xffffffff)) +
          static_cast<std::size_t>(what);
      posted& other = stage_posts_[slot];
      if (other.rank < 0 || other.send == send) {
        other = posted{r, index, send};
        return;
      }
      const posted first = other;
      other.rank = -1;
      if (send) {
        resolve(ch, {r, index, true}, first);
      } else {
        resolve(ch, first, {r, index, false});
      }
      return;
    }
    const auto found = pending_.find(ch);
    if (found == pending_.end() || found->second.send == send) {
      pending_.insert_or_assign(ch, posted{r, index, send});
      return;
    }
    const posted other = found->second;
    pending_.erase(found);
    if (send) {
      resolve(ch, {r, index, true}, other);
    } else {
      resolve(ch, other, {r, index, false});
    }
  }

  void resolve(std::uint64_t ch, const posted& from, const posted& to) {
    timed_action& sent =
        out_.timeline[static_cast<std::size_t>(from.rank)][static_cast<std::size_t>(from.index)];
    timed_action& received =
        out_.timeline[static_cast<std::size_t>(to.rank)][static_cast<std::size_t>(to.index)];
    const int what = static_cast<int>(ch >> 60);
    const action& a = sent.what;
    const int s = a.stage, k = a.micro_batch;
    double begin = std::max(sent.start, received.start);
    double bytes = 0, end = 0;
    if (what <= 1) {
      bytes = costs_.of(what == 0 ? s : s - 1).boundary_bytes;
      end = begin + transfer_time(bytes, costs_.p2p_latency, costs_.p2p_bandwidth);
      if (what == 0) {
        in_arrival_[key(s + 1, k)] = end;
      } else {
        grad_arrival_[key(s - 1, k)] = end;
      }
      out_.p2p_bytes += bytes;
      ++out_.p2p_messages;
    } else {
      if (what == 3) begin = std::max(begin, evicted_end_.at(key(s, k)));
      bytes = held_bytes(s, k);
      end = begin + transfer_time(bytes, costs_.context_latency, costs_.context_bandwidth);
      if (what == 2) {
        evicted_end_[key(s, k)] = end;
        memory(from.rank, end, -bytes, -1);  // the owner's copy is gone once it has arrived
        memory(to.rank, begin, bytes, 1);    // the partner's buffer is taken when it starts
      } else {
        away_[key(s, k)] = end;
        evicted_end_.erase(key(s, k));
        memory(to.rank, begin, bytes, 1);
        memory(from.rank, end, -bytes, -1);
      }
      out_.context_bytes_moved += bytes;
    }
    sent.end = received.end = end;
    out_.transfers.push_back(
        {a.kind, s, k, from.rank, from.index, to.rank, to.index, begin, end, bytes});
    wake(to.rank);
    wake(from.rank);
  }

  // Records data a compute-only schedule moved: `stage` sent it, `bytes` long (as the explicit
  // transfer of the same tensor would be).
  void implicit_transfer(action_kind kind, int stage, int micro_batch, int from, int to,
                         double produced, double bytes) {
    const double end = produced + transfer_time(bytes, costs_.p2p_latency, costs_.p2p_bandwidth);
    out_.transfers.push_back({kind, stage, micro_batch, from, -1, to, -1, produced, end, bytes});
    out_.p2p_bytes += bytes;
    ++out_.p2p_messages;
  }

  void finish() {
    const auto n = static_cast<std::size_t>(ranks_);
    out_.busy.assign(n, 0);
    out_.bubble.assign(n, 0);
    out_.span_bubble.assign(n, 0);
    out_.peak_contexts.assign(n, 0);
    out_.peak_bytes.assign(n, 0);
    std::vector<double> first(n, -1), last(n, 0);
    for (std::size_t r = 0; r < n; ++r) {
      for (const timed_action& t : out_.timeline[r]) {
        if (!is_compute(t.what.kind)) continue;
        out_.busy[r] += t.end - t.start;
        if (first[r] < 0) first[r] = t.start;
        last[r] = std::max(last[r], t.end);
        out_.makespan = std::max(out_.makespan, t.end);
      }
    }
    for (std::size_t r = 0; r < n; ++r) {
      if (out_.makespan > 0) out_.bubble[r] = 1 - out_.busy[r] / out_.makespan;
      const double span = first[r] < 0 ? 0 : last[r] - first[r];
      if (span > 0) out_.span_bubble[r] = 1 - out_.busy[r] / span;
      // Frees before takes at the same instant: a context that ends as another begins never
      // coexists with it.
      auto& events = memory_[r];
      const auto frees = [](const memory_event& e) { return e.bytes < 0 || e.contexts < 0; };
      std::stable_sort(events.begin(), events.end(),
                       [&](const memory_event& x, const memory_event& y) {
                         if (x.time != y.time) return x.time < y.time;
                         return frees(x) && !frees(y);
                       });
      double bytes = 0;
      int contexts = 0;
      for (const memory_event& e : events) {
        bytes += e.bytes;
        contexts += e.contexts;
        out_.peak_bytes[r] = std::max(out_.peak_bytes[r], bytes);
        out_.peak_contexts[r] = std::max(out_.peak_contexts[r], contexts);
      }
    }
  }

  const schedule& s_;
  const cost_model& costs_;
  int ranks_, stages_, micro_batches_;
  bool explicit_;
  std::vector<double> f_end_, i_end_, in_arrival_, grad_arrival_;  // (stages x micro-batches)
  std::unordered_map<std::size_t, double> away_;         // evicted: when it is back (or unknown)
  std::unordered_map<std::size_t, double> evicted_end_;  // arrived at the partner: when
  std::vector<posted> stage_posts_;                      // one side of a stage transfer, posted
  std::unordered_map<std::uint64_t, posted> pending_;    // one side of a context move, posted
  std::vector<std::vector<memory_event>> memory_;
  std::vector<std::size_t> cursor_;
  std::vector<double> free_at_;
  std::vector<char> queued_;
  std::vector<int> work_;
  simulation out_;
};

}  // namespace detail

inline simulation simulate(const schedule& s, const cost_model& costs = {}) {
  return detail::simulator(s, costs).run();
}

}  // namespace quintet::parallel::pipeline
