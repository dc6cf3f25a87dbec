// verify: proves that a schedule can run, or names the first action that breaks it. What is
// proven:
//   1. shape      every action names a stage and micro-batch that exist, on the rank that holds
//                 the stage; a transfer's peer is the rank of the neighbouring stage (and not the
//                 rank itself: consecutive stages on one rank exchange nothing)
//   2. coverage   each stage runs F exactly once per micro-batch, and either B once or I then W
//   3. order      each action comes after what it needs: F after the previous stage's F (or the
//                 RECV_F that brings it), B/I after its F and after the next stage's B/I (or the
//                 RECV_B), W after its I, a send after the compute that produced its data, no
//                 compute on an evicted context; an overlapped pair (OVERLAP_F_B) needs what both
//                 its halves need before it starts (neither half may feed the other: they run
//                 together) and counts as both for coverage
//   4. matching   run as blocking rendezvous — a send and a receive each wait for the other, and a
//                 receive takes the next message its peer sends it — every send meets exactly
//                 one receive carrying the same tensor (same kind, stage and micro-batch, so the
//                 same size), in the same order on both sides, and no rank waits forever: a real
//                 simulation of the lists, not a heuristic; a deadlock is reported as the cycle
//                 of waiting ranks
//   5. memory     at no point does a rank hold more contexts than a declared cap (optional)
// A schedule that passes runs under any executor that keeps each rank's order, blocking or not.
// Compute-only schedules (no SEND/RECV listed) are checked the same way with data moving
// implicitly as soon as it exists.
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/parallel/pipeline/schedule.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace quintet::parallel::pipeline {

struct verify_options {
  int context_cap = 0;            // the most contexts any rank may hold at once; 0: no cap
  std::vector<int> context_caps;  // per rank, where given (overrides context_cap)
};

struct verification {
  bool ok = true;
  std::string message;  // why not, naming the action; empty when ok
  int rank = -1;        // the offending action, where there is one
  int index = -1;
  std::vector<int> peak_contexts;  // (ranks) most contexts held at once (own and accepted)

  explicit operator bool() const { return ok; }
};

namespace detail {

class verifier {
 public:
  verifier(const schedule& s, const verify_options& options)
      : s_(s),
        options_(options),
        ranks_(s.ranks()),
        stages_(s.stages()),
        micro_batches_(s.micro_batches),
        explicit_(s.has_stage_transfers()) {}

  verification run() {
    if (!check_shape() || !check_actions() || !check_coverage()) return std::move(out_);
    simulate_rendezvous();
    return std::move(out_);
  }

 private:
  // The flags kept per (stage, micro-batch).
  enum flag : std::uint16_t {
    forward_done = 1 << 0,
    input_done = 1 << 1,    // B or I
    weight_done = 1 << 2,   // W or B
    whole = 1 << 3,         // ran as B
    got_input = 1 << 4,     // RECV_F done
    got_gradient = 1 << 5,  // RECV_B done
    away = 1 << 6,          // evicted, not reloaded
    held = 1 << 7,          // accepted by the partner, not returned
  };

  std::size_t key(int stage, int micro_batch) const {
    return static_cast<std::size_t>(stage) * static_cast<std::size_t>(micro_batches_) +
           static_cast<std::size_t>(micro_batch);
  }
  std::uint16_t& flags(int stage, int micro_batch) { return flags_[key(stage, micro_batch)]; }
  bool has(int stage, int micro_batch, flag f) const {
    return (flags_[key(stage, micro_batch)] & f) != 0;
  }

  std::string name(int r, std::size_t i) const {
    return to_string(s_.on(r)[i], true) + " (rank " + std::to_string(r) + ", action " +
           std::to_string(i) + ")";
  }

  // "pipeline schedule 'name': <action> (rank r, action i) why" (why may begin with ": ").
  bool fail(int r, std::size_t i, const std::string& why) {
    out_.ok = false;
    out_.rank = r;
    out_.index = static_cast<int>(i);
    out_.message = "pipeline schedule '" + s_.name + "': " + name(r, i) +
                   (why.starts_with(": ") ? "" : " ") + why;
    return false;
  }
  bool fail(const std::string& why) {
    out_.ok = false;
    out_.message = "pipeline schedule '" + s_.name + "': " + why;
    return false;
  }

  bool check_shape() {
    if (ranks_ < 1) return fail("it has no ranks");
    if (stages_ < 1) return fail("it has no stages");
    if (micro_batches_ < 1)
      return fail("it has " + std::to_string(micro_batches_) + " micro-batches");
    std::vector<int> stages_of(static_cast<std::size_t>(ranks_), 0);
    for (int stage = 0; stage < stages_; ++stage) {
      const int r = s_.rank_of(stage);
      if (r < 0 || r >= ranks_) {
        return fail("the stage map puts stage " + std::to_string(stage) + " on rank " +
                    std::to_string(r) + ", but the schedule has " + std::to_string(ranks_) +
                    " ranks");
      }
      ++stages_of[static_cast<std::size_t>(r)];
    }
    for (int r = 0; r < ranks_; ++r) {
      if (stages_of[static_cast<std::size_t>(r)] == 0) {
        return fail("rank " + std::to_string(r) + " holds no stage");
      }
    }
    flags_.assign(static_cast<std::size_t>(stages_) * micro_batches_, 0);
    return true;
  }

  // 1: where each action may run, and no compute or stage transfer listed twice.
  bool check_actions() {
    // One bit per (kind, stage, micro-batch) for the kinds that must not repeat.
    std::vector<std::uint16_t> seen(flags_.size(), 0);
    for (int r = 0; r < ranks_; ++r) {
      const auto& list = s_.on(r);
      for (std::size_t i = 0; i < list.size(); ++i) {
        const action& a = list[i];
        // An overlapped pair is checked half by half, each named in the message.
        if (a.kind != action_kind::overlap_f_b) {
          if (!check_action(r, i, a, false, seen)) return false;
          continue;
        }
        if (!check_action(r, i, forward_half(a), true, seen) ||
            !check_action(r, i, backward_half(a), true, seen)) {
          return false;
        }
      }
    }
    coverage_ = std::move(seen);
    return true;
  }

  // One single action `a` at rank r's index i (one half of the overlapped pair there if `half`).
  bool check_action(int r, std::size_t i, const action& a, bool half,
                    std::vector<std::uint16_t>& seen) {
    // "X (rank r, action i) why", or for a pair's half "X (rank r, action i): its forward half
    // 0F7 why".
    const auto refuse = [&](const std::string& why) {
      if (!half) return fail(r, i, why);
      return fail(r, i,
                  std::string(a.kind == action_kind::forward ? ": its forward half "
                                                             : ": its backward half ") +
                      to_string(a) + " " + why);
    };
    if (a.stage < 0 || a.stage >= stages_) {
      return refuse("names stage " + std::to_string(a.stage) + ", but the schedule has " +
                    std::to_string(stages_) + " stages");
    }
    if (a.micro_batch < 0 || a.micro_batch >= micro_batches_) {
      return refuse("names micro-batch " + std::to_string(a.micro_batch) +
                    ", but the schedule has " + std::to_string(micro_batches_));
    }
    const int owner = s_.rank_of(a.stage);
    const bool partner_side = a.kind == action_kind::accept || a.kind == action_kind::hand_back;
    if (!partner_side && owner != r) {
      return refuse("runs on rank " + std::to_string(r) + ", but stage " + std::to_string(a.stage) +
                    " lives on rank " + std::to_string(owner));
    }
    if (is_stage_transfer(a.kind)) {
      const int expected = mapped_peer(s_, a);
      const bool to_next =
          a.kind == action_kind::send_forward || a.kind == action_kind::recv_backward;
      if (expected == action::no_peer) {
        return fail(r, i,
                    std::string("has no ") + (to_next ? "next" : "previous") + " stage to talk to");
      }
      if (expected == r) {
        return fail(
            r, i,
            "moves data between stages " +
                std::to_string(std::min(a.stage, to_next ? a.stage + 1 : a.stage - 1)) + " and " +
                std::to_string(std::max(a.stage, to_next ? a.stage + 1 : a.stage - 1)) +
                ", which are both on rank " + std::to_string(r) + ": nothing crosses ranks there");
      }
      if (a.peer != expected) {
        return fail(r, i,
                    "names peer rank " + std::to_string(a.peer) + ", but stage " +
                        std::to_string(to_next ? a.stage + 1 : a.stage - 1) + " lives on rank " +
                        std::to_string(expected));
      }
    }
    if (is_context_transfer(a.kind)) {
      if (a.peer < 0 || a.peer >= ranks_ || a.peer == r) {
        return fail(r, i,
                    "names partner rank " + std::to_string(a.peer) +
                        ", which is not another rank of the schedule");
      }
      if (partner_side && a.peer != owner) {
        return fail(r, i,
                    "names peer rank " + std::to_string(a.peer) + ", but stage " +
                        std::to_string(a.stage) + "'s context belongs to rank " +
                        std::to_string(owner));
      }
      if (partner_side && owner == r) {
        return fail(r, i, "is the partner's side of a context move, on the owner's own rank");
      }
      return true;  // a context may move out and back more than once
    }
    const std::size_t k = key(a.stage, a.micro_batch);
    const auto bit = [](action_kind kind) {
      return static_cast<std::uint16_t>(1u << static_cast<unsigned>(kind));
    };
    if (seen[k] & bit(a.kind)) return refuse("is listed twice");
    if (a.kind == action_kind::backward && (seen[k] & bit(action_kind::backward_input))) {
      return refuse("is a whole backward of a micro-batch whose input pass (I) is listed");
    }
    if (a.kind == action_kind::backward_input && (seen[k] & bit(action_kind::backward))) {
      return refuse("is an input pass of a micro-batch whose whole backward (B) is listed");
    }
    if (a.kind == action_kind::backward_weight && (seen[k] & bit(action_kind::backward))) {
      return refuse("is a weight pass of a micro-batch whose whole backward (B) is listed");
    }
    seen[k] = static_cast<std::uint16_t>(seen[k] | bit(a.kind));
    return true;
  }

  // 2: every (stage, micro-batch) runs F, and B or I + W.
  bool check_coverage() {
    const auto bit = [](action_kind kind) { return 1u << static_cast<unsigned>(kind); };
    for (int stage = 0; stage < stages_; ++stage) {
      const std::string owner = " on rank " + std::to_string(s_.rank_of(stage));
      for (int m = 0; m < micro_batches_; ++m) {
        const unsigned seen = coverage_[key(stage, m)];
        const std::string what = std::to_string(stage) + "?" + std::to_string(m);
        const auto listed_as = [&](action_kind kind) {
          return to_string(action{kind, stage, m, action::no_peer});
        };
        if (!(seen & bit(action_kind::forward))) {
          return fail("stage " + std::to_string(stage) + " never runs the forward of micro-batch " +
                      std::to_string(m) + " (" + listed_as(action_kind::forward) + owner + ")");
        }
        const bool split = seen & bit(action_kind::backward_input);
        if (!(seen & bit(action_kind::backward)) && !split) {
          return fail("stage " + std::to_string(stage) +
                      " never runs the backward of micro-batch " + std::to_string(m) + " (" +
                      listed_as(action_kind::backward) + ", or " +
                      listed_as(action_kind::backward_input) + " and " +
                      listed_as(action_kind::backward_weight) + owner + ")");
        }
        if (split && !(seen & bit(action_kind::backward_weight))) {
          return fail("stage " + std::to_string(stage) + " runs the input pass of micro-batch " +
                      std::to_string(m) + " but never its weight pass (" +
                      listed_as(action_kind::backward_weight) + owner + ")");
        }
        if (!split && (seen & bit(action_kind::backward_weight))) {
          return fail("stage " + std::to_string(stage) + " runs a weight pass of micro-batch " +
                      std::to_string(m) + " without its input pass (" +
                      listed_as(action_kind::backward_input) + owner + ")");
        }
      }
    }
    return true;
  }

  // 3-5: the lists run as blocking rendezvous.
  void simulate_rendezvous() {
    const auto n = static_cast<std::size_t>(ranks_);
    cursor_.assign(n, 0);
    waits_for_.assign(n, -1);
    queued_.assign(n, 1);
    live_.assign(n, 0);
    out_.peak_contexts.assign(n, 0);
    for (int r = ranks_ - 1; r >= 0; --r) work_.push_back(r);
    while (!work_.empty()) {
      const int r = work_.back();
      work_.pop_back();
      queued_[static_cast<std::size_t>(r)] = 0;
      if (!advance(r)) return;
    }
    if (!report_deadlock()) return;
    for (int stage = 0; stage < stages_; ++stage) {
      for (int m = 0; m < micro_batches_; ++m) {
        if (has(stage, m, away) || has(stage, m, held)) {
          fail("stage " + std::to_string(stage) + " micro-batch " + std::to_string(m) +
               "'s context is still with its partner at the end (no RETURN and RELOAD)");
          return;
        }
      }
    }
  }

  void wake(int rank) {
    if (rank < 0 || queued_[static_cast<std::size_t>(rank)]) return;
    queued_[static_cast<std::size_t>(rank)] = 1;
    work_.push_back(rank);
  }

  // Runs rank r as far as it can go; false on an error.
  bool advance(int r) {
    auto& at = cursor_[static_cast<std::size_t>(r)];
    const auto& list = s_.on(r);
    while (at < list.size()) {
      const int outcome = step(r, at);
      if (outcome < 0) return false;
      if (outcome == 0) return true;  // waits
    }
    waits_for_[static_cast<std::size_t>(r)] = -1;
    return true;
  }

  bool hold(int r, std::size_t i, int delta) {
    int& live = live_[static_cast<std::size_t>(r)];
    live += delta;
    int& peak = out_.peak_contexts[static_cast<std::size_t>(r)];
    peak = std::max(peak, live);
    const int cap =
        options_.context_caps.empty()
            ? options_.context_cap
            : options_.context_caps[static_cast<std::size_t>(r) % options_.context_caps.size()];
    if (cap > 0 && live > cap) {
      return fail(r, i,
                  "leaves rank " + std::to_string(r) + " holding " + std::to_string(live) +
                      " contexts, over its cap of " + std::to_string(cap));
    }
    return true;
  }

  // What a compute needs that is not there yet: a reason it can never run in time (an error), or
  // the rank it waits for (compute-only lists, where data moves implicitly); neither: it may run.
  // A code, so that the checks that pass (nearly all) build no message.
  enum class missing : std::uint8_t {
    nothing,
    previous_forward,  // the previous stage's F, on this rank, has not run
    input,             // no RECV_F of this stage's input before it
    own_forward,       // its own F has not run
    context,           // its context is with the partner
    next_backward,     // the next stage's B/I, on this rank, has not run
    gradient,          // no RECV_B of its output gradient before it
  };
  struct need {
    missing what = missing::nothing;
    int wait_for = -1;
  };

  static std::string named(action_kind kind, int stage, int micro_batch) {
    return to_string(action{kind, stage, micro_batch, action::no_peer});
  }

  std::string describe(missing what, int r, int s, int m) const {
    switch (what) {
      case missing::previous_forward:
        return "runs before " + named(action_kind::forward, s - 1, m) +
               ", the previous stage's forward on the same rank";
      case missing::input:
        return "runs before its input arrives: no " + named(action_kind::recv_forward, s, m) +
               " earlier on rank " + std::to_string(r);
      case missing::own_forward:
        return "runs before its forward " + named(action_kind::forward, s, m);
      case missing::context:
        return "runs while its context is with the partner rank (no " +
               named(action_kind::reload, s, m) + " before it)";
      case missing::next_backward:
        return "runs before the next stage's backward " +
               named(action_kind::backward_input, s + 1, m) + " / " +
               named(action_kind::backward, s + 1, m) + " on the same rank";
      case missing::gradient:
        return "runs before its gradient arrives: no " + named(action_kind::recv_backward, s, m) +
               " earlier on rank " + std::to_string(r);
      case missing::nothing:
        break;
    }
    return "";
  }

  need forward_needs(int r, int s, int m) const {
    if (s == 0) return {};
    const int producer = s_.rank_of(s - 1);
    if (producer == r && !has(s - 1, m, forward_done)) return {missing::previous_forward};
    if (producer != r && explicit_ && !has(s, m, got_input)) return {missing::input};
    if (producer != r && !explicit_ && !has(s - 1, m, forward_done)) {
      return {missing::nothing, producer};
    }
    return {};
  }

  need backward_needs(int r, int s, int m) const {
    if (!has(s, m, forward_done)) return {missing::own_forward};
    if (has(s, m, away)) return {missing::context};
    if (s + 1 < stages_) {
      const int producer = s_.rank_of(s + 1);
      if (producer == r && !has(s + 1, m, input_done)) return {missing::next_backward};
      if (producer != r && explicit_ && !has(s, m, got_gradient)) return {missing::gradient};
      if (producer != r && !explicit_ && !has(s + 1, m, input_done)) {
        return {missing::nothing, producer};
      }
    }
    return {};
  }

  void forward_ran(int s, int m) {
    flags(s, m) |= forward_done;
    if (!explicit_ && s + 1 < stages_) wake(s_.rank_of(s + 1));
  }

  void input_backward_ran(int s, int m, bool entire) {
    flags(s, m) |= input_done;
    if (entire) flags(s, m) |= weight_done | whole;
    if (!explicit_ && s > 0) wake(s_.rank_of(s - 1));
  }

  // 1: ran (cursor moved); 0: waits; -1: error.
  int step(int r, std::size_t& at) {
    const action& a = s_.on(r)[at];
    const int s = a.stage, m = a.micro_batch;
    const auto error = [&](const std::string& why) { return fail(r, at, why) ? 1 : -1; };
    switch (a.kind) {
      case action_kind::forward: {
        const need n = forward_needs(r, s, m);
        if (n.what != missing::nothing) return error(describe(n.what, r, s, m));
        if (n.wait_for >= 0) return wait(r, n.wait_for);
        forward_ran(s, m);
        ++at;
        return hold(r, at - 1, 1) ? 1 : -1;
      }
      case action_kind::backward:
      case action_kind::backward_input: {
        const need n = backward_needs(r, s, m);
        if (n.what != missing::nothing) return error(describe(n.what, r, s, m));
        if (n.wait_for >= 0) return wait(r, n.wait_for);
        const bool whole = a.kind == action_kind::backward;
        input_backward_ran(s, m, whole);
        ++at;
        if (whole) return hold(r, at - 1, -1) ? 1 : -1;
        return 1;
      }
      case action_kind::overlap_f_b: {
        // Both halves start together: each needs its inputs from before the pair, so a half that
        // feeds the other (B of the forward's micro-batch, ...) is refused here.
        const int bs = a.backward_stage, bm = a.backward_micro_batch;
        const need f = forward_needs(r, s, m);
        if (f.what != missing::nothing) {
          return error(": its forward half " + named(action_kind::forward, s, m) + " " +
                       describe(f.what, r, s, m));
        }
        const need b = backward_needs(r, bs, bm);
        if (b.what != missing::nothing) {
          return error(": its backward half " + named(action_kind::backward, bs, bm) + " " +
                       describe(b.what, r, bs, bm));
        }
        if (f.wait_for >= 0) return wait(r, f.wait_for);
        if (b.wait_for >= 0) return wait(r, b.wait_for);
        forward_ran(s, m);
        input_backward_ran(bs, bm, true);
        ++at;
        // The forward's context is taken as the pair starts, the backward's freed as it ends.
        return hold(r, at - 1, 1) && hold(r, at - 1, -1) ? 1 : -1;
      }
      case action_kind::backward_weight: {
        if (!has(s, m, input_done)) {
          return error("runs before its input pass " + named(action_kind::backward_input, s, m));
        }
        if (has(s, m, away)) {
          return error("runs while its context is with the partner rank (no " +
                       named(action_kind::reload, s, m) + " before it)");
        }
        flags(s, m) |= weight_done;
        ++at;
        return hold(r, at - 1, -1) ? 1 : -1;
      }
      case action_kind::send_forward:
        if (!has(s, m, forward_done)) {
          return error("sends before the forward that produces it, " +
                       named(action_kind::forward, s, m));
        }
        return meet(r, at);
      case action_kind::send_backward:
        if (!has(s, m, input_done)) {
          return error("sends before the backward that produces it, " +
                       named(action_kind::backward_input, s, m) + " / " +
                       named(action_kind::backward, s, m));
        }
        return meet(r, at);
      case action_kind::evict:
        if (!has(s, m, forward_done) || has(s, m, weight_done) || has(s, m, away)) {
          return error("evicts a context rank " + std::to_string(r) + " does not hold");
        }
        return meet(r, at);
      case action_kind::hand_back:
        if (!has(s, m, held)) return error("returns a context this rank does not hold");
        return meet(r, at);
      case action_kind::reload:
        if (!has(s, m, away)) return error("reloads a context that was not evicted");
        return meet(r, at);
      case action_kind::recv_forward:
      case action_kind::recv_backward:
      case action_kind::accept:
        return meet(r, at);
    }
    return -1;
  }

  int wait(int r, int on) {
    waits_for_[static_cast<std::size_t>(r)] = on;
    return 0;
  }

  // The tensor a transfer carries, as (what, stage of the data, micro-batch): a send and the
  // receive it meets must agree on it.
  static std::pair<int, int> payload(const action& a) {
    switch (a.kind) {
      case action_kind::send_forward:
        return {0, a.stage};
      case action_kind::recv_forward:
        return {0, a.stage - 1};
      case action_kind::send_backward:
        return {1, a.stage};
      case action_kind::recv_backward:
        return {1, a.stage + 1};
      case action_kind::evict:
      case action_kind::accept:
        return {2, a.stage};
      default:
        return {3, a.stage};
    }
  }

  static std::string describe_payload(const action& a) {
    const auto [what, stage] = payload(a);
    const std::string whose =
        "stage " + std::to_string(stage) + " micro-batch " + std::to_string(a.micro_batch);
    switch (what) {
      case 0:
        return whose + "'s activation";
      case 1:
        return whose + "'s input gradient";
      case 2:
        return whose + "'s context (evicted)";
      default:
        return whose + "'s context (returned)";
    }
  }

  // A transfer at rank r's cursor: meets the peer if the peer waits at the matching action.
  int meet(int r, std::size_t& at) {
    const action& a = s_.on(r)[at];
    const int q = a.peer;
    const auto& theirs = s_.on(q);
    std::size_t& there = cursor_[static_cast<std::size_t>(q)];
    // The peer must be waiting there (so its own checks of that action have passed).
    if (there < theirs.size() && waits_for_[static_cast<std::size_t>(q)] == r) {
      const action& b = theirs[there];
      if (b.kind == counterpart(a.kind) && b.peer == r && is_transfer(b.kind)) {
        if (payload(a) != payload(b) || a.micro_batch != b.micro_batch) {
          const bool a_sends = is_send(a.kind);
          const int send_rank = a_sends ? r : q, recv_rank = a_sends ? q : r;
          const std::size_t send_at = a_sends ? at : there, recv_at = a_sends ? there : at;
          const action& sent = a_sends ? a : b;
          const action& expected = a_sends ? b : a;
          return fail(send_rank, send_at,
                      "meets " + name(recv_rank, recv_at) +
                          ": a receive takes the next message its peer sends, and this one "
                          "carries " +
                          describe_payload(sent) + " where " + describe_payload(expected) +
                          " is expected (a different tensor, so a different size or content)")
                     ? 1
                     : -1;
        }
        // Both sides run: the sender's effects first, then the receiver's.
        const bool a_sends = is_send(a.kind);
        if (!arrive(a_sends ? r : q, a_sends ? at : there) ||
            !arrive(a_sends ? q : r, a_sends ? there : at)) {
          return -1;
        }
        ++at;
        ++there;
        waits_for_[static_cast<std::size_t>(q)] = -1;
        waits_for_[static_cast<std::size_t>(r)] = -1;
        wake(q);
        return 1;
      }
    }
    return wait(r, q);
  }

  // The effects of a transfer action once its rendezvous happened.
  bool arrive(int r, std::size_t i) {
    const action& a = s_.on(r)[i];
    const int s = a.stage, m = a.micro_batch;
    switch (a.kind) {
      case action_kind::recv_forward:
        flags(s, m) |= got_input;
        return true;
      case action_kind::recv_backward:
        flags(s, m) |= got_gradient;
        return true;
      case action_kind::evict:
        flags(s, m) |= away;
        return hold(r, i, -1);
      case action_kind::accept:
        flags(s, m) |= held;
        return hold(r, i, 1);
      case action_kind::hand_back:
        flags(s, m) &= static_cast<std::uint16_t>(~held);
        return hold(r, i, -1);
      case action_kind::reload:
        flags(s, m) &= static_cast<std::uint16_t>(~away);
        return hold(r, i, 1);
      default:
        return true;
    }
  }

  // Nothing can move: if some rank has not finished, name the cycle of waits it is caught in.
  bool report_deadlock() {
    int start = -1;
    for (int r = 0; r < ranks_; ++r) {
      if (cursor_[static_cast<std::size_t>(r)] < s_.on(r).size()) {
        start = r;
        break;
      }
    }
    if (start < 0) return true;
    std::string chain;
    std::vector<char> visited(static_cast<std::size_t>(ranks_), 0);
    int r = start;
    while (true) {
      visited[static_cast<std::size_t>(r)] = 1;
      const std::size_t at = cursor_[static_cast<std::size_t>(r)];
      const int q = waits_for_[static_cast<std::size_t>(r)];
      if (!chain.empty()) chain += "; ";
      chain += "rank " + std::to_string(r) + " waits at " + to_string(s_.on(r)[at], true) +
               " (action " + std::to_string(at) + ") for rank " + std::to_string(q);
      if (q < 0) break;
      if (cursor_[static_cast<std::size_t>(q)] >= s_.on(q).size()) {
        chain += ", which has run all its actions: nothing will ever meet it";
        break;
      }
      if (visited[static_cast<std::size_t>(q)]) {
        chain += ", which is waiting already: a cycle";
        break;
      }
      r = q;
    }
    const std::size_t at = cursor_[static_cast<std::size_t>(start)];
    return fail(start, at,
                "never runs: the lists deadlock under blocking send/recv (" + chain + ")" +
                    unmatched(start, at));
  }

  // For a transfer nothing will ever meet: says so (its peer lists no counterpart from where it
  // stands).
  std::string unmatched(int r, std::size_t at) const {
    const action& a = s_.on(r)[at];
    if (!is_transfer(a.kind) || a.peer < 0) return "";
    const auto& theirs = s_.on(a.peer);
    for (std::size_t j = cursor_[static_cast<std::size_t>(a.peer)]; j < theirs.size(); ++j) {
      const action& b = theirs[j];
      if (b.kind == counterpart(a.kind) && b.peer == r && payload(a) == payload(b) &&
          a.micro_batch == b.micro_batch) {
        return "";
      }
    }
    const int their_stage = a.kind == action_kind::send_forward    ? a.stage + 1
                            : a.kind == action_kind::send_backward ? a.stage - 1
                            : a.kind == action_kind::recv_forward  ? a.stage - 1
                            : a.kind == action_kind::recv_backward ? a.stage + 1
                                                                   : a.stage;
    return "; rank " + std::to_string(a.peer) + " lists no " +
           to_string(action{counterpart(a.kind), their_stage, a.micro_batch, action::no_peer}) +
           " from where it stands, so nothing will ever meet " + to_string(a);
  }

  const schedule& s_;
  const verify_options& options_;
  int ranks_, stages_, micro_batches_;
  bool explicit_;
  std::vector<std::uint16_t> flags_;     // (stages x micro-batches)
  std::vector<std::uint16_t> coverage_;  // (stages x micro-batches) which kinds are listed
  std::vector<std::size_t> cursor_;
  std::vector<int> waits_for_;
  std::vector<char> queued_;
  std::vector<int> live_;
  std::vector<int> work_;
  verification out_;
};

}  // namespace detail

inline verification verify(const schedule& s, const verify_options& options = {}) {
  return detail::verifier(s, options).run();
}

// verify, throwing quintet::error with the verdict's message when the schedule is refused.
inline void check(const schedule& s, const verify_options& options = {}) {
  verification v = verify(s, options);
  if (!v) throw quintet::error("quintet: " + v.message);
}

}  // namespace quintet::parallel::pipeline
