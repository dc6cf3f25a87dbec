// runtime: runs one rank's action list of a pipeline schedule over the stages that rank holds,
// exchanging activations and their gradients with the neighbouring stages' ranks over the pp
// communicator. The schedule is verified once, at construction (pipeline::check: every rank's
// order, coverage and send/receive matching), so a list that could deadlock or run a backward
// before its forward never starts; the runtime then only follows the lists.
//
//   rank 1 of 1F1B, p = 2, m = 2:   1RECV_F0 1RECV_F1 1F0 1B0 1SEND_B0 1F1 1B1 1SEND_B1
//     RECV_F0 RECV_F1  one exchange, two receives into buffers shaped by links.boundary_shape
//     F0      waits for that exchange, then stage.forward(ctx of (1, 0), links.input(1, 0, &act))
//     B0      stage.backward(ctx, links.gradient(1, 0, null)): the last stage's loss gradient
//     SEND_B0 posts the input gradient to rank 0; the buffer lives until the send completes
// Consecutive transfers in a list are posted together (exchange_async), in batches that each end
// at a receive: sends travel with the receive after them, the compute that follows runs while
// they are in flight, and a compute waits for the batch holding its own input (so, by the
// ordering rule, for those before it) but never for a later receive in the same run — the peer's
// next micro-batch. Because operations on one communicator complete in the order they were
// issued, and the verifier proved the lists run even when every send and receive blocks, posting
// ahead never deadlocks.
//
// Contexts are held per (stage, micro-batch) from F until B (or W) finishes; the most held at
// once is measured (run_stats). An overlapped pair (DualPipeV's F&B) starts once the inputs of
// both halves are here and runs them as an overlapped_pair (comm/overlapped_pair.hpp): the forward
// first, and wherever one half waits for a collective inside its stage (under ep, the experts'
// all-to-alls) the other computes meanwhile. Neither half reads what the other writes (different
// stages — halves of one stage run in sequence — and never one micro-batch's F with its own B),
// so the results are those of the halves run one after the other, which is what
// overlap_pairs(false) and stages without such collectives do.
// BPipe's context moves carry nn::packed_context buffers:
//   EVICT   the owner packs the context, keeps its manifest, sends its size (the buffer's words
//           and the context's bytes) and the buffer, frees it
//   ACCEPT  the partner receives the size (blocking: the buffer's is known only then), then posts
//           the buffer's receive, and keeps the buffer without looking into it
//   RETURN  the partner sends the buffer back
//   RELOAD  the owner receives it into a buffer its manifest sizes; the backward that needs the
//           context waits for it and unpacks
// Each run starts with a pp barrier and times every action (run_stats: starts, ends): a compute
// from the moment its received inputs are here (a wait for a peer is idle time, not its cost), a
// transfer from its post to its exchange seen complete; measured_timeline() gathers every rank's
// times into the simulator's format, sends joined to their receives, so chrome_trace draws the
// measured step as it draws the predicted one.
#pragma once

#include <quintet/comm/all_reduce_from_host.hpp>
#include <quintet/comm/comm_request.hpp>
#include <quintet/comm/communicator.hpp>
#include <quintet/comm/overlapped_pair.hpp>
#include <quintet/core/error.hpp>
#include <quintet/core/shape.hpp>
#include <quintet/nn/context.hpp>
#include <quintet/nn/packed_context.hpp>
#include <quintet/nn/stage.hpp>
#include <quintet/parallel/pipeline/action.hpp>
#include <quintet/parallel/pipeline/schedule.hpp>
#include <quintet/parallel/pipeline/simulator.hpp>
#include <quintet/parallel/pipeline/verifier.hpp>
#include <quintet/tensor/copy.hpp>
#include <quintet/tensor/fill.hpp>
#include <quintet/tensor/tensor.hpp>

#include <algorithm>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace quintet::parallel::pipeline {

// A stage whose data between ranks is one tensor each way: its output carries the activations
// for the next stage in `activations` (the same owning tensor type as its input gradient), and
// an output can be made from received activations alone.
template <class S>
concept transferable_stage = nn::stage<S> && std::default_initializable<typename S::output_type> &&
    tensor_like<typename S::input_gradient_type> &&
    std::constructible_from<typename S::input_gradient_type, shape> &&
    requires(typename S::output_type out) {
  requires std::same_as<decltype(out.activations), typename S::input_gradient_type>;
};

// What one run measured on this rank.
struct run_stats {
  int peak_contexts = 0;               // most contexts held at once, own and accepted (BPipe)
  std::size_t peak_context_bytes = 0;  // most bytes those contexts held at once
  int batches_posted = 0;              // exchange_async calls (a run of transfers, cut at receives)
  int contexts_moved = 0;              // contexts this rank sent away (EVICT, RETURN)
  int hand_overs = 0;  // times an overlapped pair's halves took turns at their collectives
  // When each action of the rank's list started and ended, in seconds since the run began
  // (index: the action's place in the list): a compute from when its inputs were here to its end;
  // a transfer from its post to when the rank saw its exchange complete (looked at after every
  // action, so up to one compute late; the exchange may carry other transfers, e.g. 1F1B's SEND_F
  // with its RECV_B, and ends with the last of them). bytes: a transfer's payload (0 for computes).
  std::vector<double> starts, ends, bytes;
};

template <transferable_stage Stage, communicator Comm>
class runtime {
 public:
  using device_type = typename Stage::device_type;
  using input_type = typename Stage::input_type;
  using output_type = typename Stage::output_type;
  using gradient_type = typename Stage::gradient_type;
  using wire_type = typename Stage::input_gradient_type;  // what crosses between ranks

  // How data comes in from outside the pipeline, as train::executor's links:
  //   input(stage, micro_batch, previous)   the stage's input; `previous` is the output of the
  //                                         stage before (on this rank, or received from its
  //                                         rank: then only its activations are set); null for
  //                                         stage 0
  //   gradient(stage, micro_batch, next)    what the stage's backward is given; `next` is the
  //                                         input gradient of the stage after (local or
  //                                         received); null for the last stage (the loss scale)
  //   boundary_shape(stage, micro_batch)    the shape of what stage sends to stage + 1 (and of
  //                                         its gradient), which sizes the receive buffers
  struct links {
    std::function<input_type(int, int, const output_type*)> input;
    std::function<gradient_type(int, int, const wire_type*)> gradient;
    std::function<shape(int, int)> boundary_shape;
  };

  // `stages` are this rank's stages, one per virtual stage it holds in `s`, in increasing stage
  // order (s.stages_on(pp.rank())). The schedule is verified here; every rank refuses the same
  // schedule, so a refusal leaves no peer waiting.
  runtime(schedule s, Comm& pp, std::vector<Stage*> stages)
      : schedule_(std::move(s)), pp_(&pp), stages_(std::move(stages)) {
    QUINTET_CHECK(schedule_.ranks() == pp.size(),
                  "pipeline runtime: schedule '{}' has {} ranks, the pp communicator {}",
                  schedule_.name, schedule_.ranks(), pp.size());
    check(schedule_);
    held_ = schedule_.stages_on(pp.rank());
    QUINTET_CHECK(stages_.size() == held_.size(),
                  "pipeline runtime: rank {} holds {} stages of schedule '{}', {} given", pp.rank(),
                  held_.size(), schedule_.name, stages_.size());
    local_.assign(static_cast<std::size_t>(schedule_.stages()), -1);
    for (std::size_t i = 0; i < held_.size(); ++i) {
      QUINTET_CHECK(stages_[i] != nullptr, "pipeline runtime: stage {} is missing", held_[i]);
      if constexpr (requires(const Stage& st) { st.cut().index; }) {
        QUINTET_CHECK(
            stages_[i]->cut().index == held_[i] && stages_[i]->cut().count == schedule_.stages(),
            "pipeline runtime: rank {}'s stage {} of {} was given a stage cut as {} of {}",
            pp.rank(), held_[i], schedule_.stages(), stages_[i]->cut().index,
            stages_[i]->cut().count);
      }
      local_[static_cast<std::size_t>(held_[i])] = static_cast<int>(i);
    }
  }

  // Runs this rank's actions once (one training step's forward and backward). Returns the last
  // stage's output of every micro-batch, in micro-batch order, on the rank holding the last
  // stage; an empty list elsewhere.
  std::vector<output_type> run(const links& link) {
    QUINTET_CHECK(link.input && link.gradient && link.boundary_shape,
                  "pipeline runtime: every link (input, gradient, boundary_shape) must be given");
    stats_ = {};
    const int micro_batches = schedule_.micro_batches;
    // Every rank starts its clock at the same moment (as near as a barrier makes it), so the
    // measured timelines of different ranks line up.
    pp_->barrier();
    began_ = std::chrono::steady_clock::now();
    const int last = schedule_.stages() - 1;
    const bool scores = local_[static_cast<std::size_t>(last)] >= 0;
    std::vector<std::optional<output_type>> results(scores ? static_cast<std::size_t>(micro_batches)
                                                           : 0);
    // Declared before the batches: buffers of receives in flight outlive their requests.
    std::map<key, slot> slots;
    std::map<key, parked> accepted;  // BPipe: partners' contexts this rank keeps
    std::deque<batch> batches;
    std::size_t oldest_open = 0;  // batches before it are done
    const std::vector<action>& list = schedule_.on(pp_->rank());
    stats_.starts.assign(list.size(), 0.0);
    stats_.ends.assign(list.size(), 0.0);
    stats_.bytes.assign(list.size(), 0.0);

    std::size_t i = 0;
    while (i < list.size()) {
      if (is_transfer(list[i].kind)) {
        std::size_t end = i;
        while (end < list.size() && is_transfer(list[end].kind)) ++end;
        post(list, i, end, slots, accepted, batches, link);
        i = end;
      } else {
        // The clock starts once what the action (a pair: both halves) received is here: waiting
        // for a peer is idle time, not the action's cost (the simulator adds the wait).
        for (const action& half : halves(list[i])) await_inputs(half, slots, batches);
        stats_.starts[i] = since();
        // Halves of one stage (a hand-written list may pair them) share its layers, whose
        // per-call state (the router's statistics) the other half would overwrite meanwhile.
        if (list[i].kind == action_kind::overlap_f_b && overlap_pairs() &&
            forward_half(list[i]).stage != backward_half(list[i]).stage) {
          run_overlapped(list[i], i, slots, accepted, batches, results, link);
        } else {
          // A pair's forward takes its context before its backward frees the other: measured
          // between the halves, as the verifier counts it.
          for (const action& half : halves(list[i])) {
            compute(half, i, slots, batches, results, link);
            measure(slots, accepted);
          }
        }
        stats_.ends[i] = since();
        ++i;
      }
      measure(slots, accepted);
      release_finished(batches, oldest_open);
    }
    for (auto& b : batches) finish(b);

    std::vector<output_type> out;
    out.reserve(results.size());
    for (std::size_t m = 0; m < results.size(); ++m) {
      QUINTET_CHECK(results[m].has_value(),
                    "pipeline runtime: micro-batch {} never ran the last stage on rank {}", m,
                    pp_->rank());
      out.push_back(std::move(*results[m]));
    }
    return out;
  }

  // Whether overlapped pairs overlap their halves (default), or run them one after the other.
  bool overlap_pairs() const { return overlap_pairs_; }
  void overlap_pairs(bool on) { overlap_pairs_ = on; }

  const schedule& plan() const { return schedule_; }
  // The global virtual stages this rank holds, in increasing order.
  const std::vector<int>& stages() const { return held_; }
  // What the last run measured.
  const run_stats& stats() const { return stats_; }

  // The last run's actions on every rank with their measured start and end (run_stats), in
  // milliseconds, as a simulation: the timeline, and each send joined to its receive in
  // `transfers` (from the send's post to the receiver seeing it complete), so chrome_trace draws
  // it as it draws a prediction. The makespan is the last compute's end; peak_bytes, each rank's
  // peak context bytes. Collective over the pp ranks: every rank gets every rank's times.
  simulation measured_timeline() const {
    const int ranks = schedule_.ranks();
    std::vector<std::size_t> first(static_cast<std::size_t>(ranks) + 1, 0);
    for (int r = 0; r < ranks; ++r)
      first[static_cast<std::size_t>(r) + 1] =
          first[static_cast<std::size_t>(r)] + schedule_.on(r).size();
    // Each rank's (start, end, bytes) in its slot of one buffer, then each rank's peak context
    // bytes; summed over pp, every slot full.
    const auto peaks_at = static_cast<std::int64_t>(3 * first.back());
    quintet::tensor<double, host> times(shape{peaks_at + ranks});
    fill(times, 0.0);
    const std::size_t mine = first[static_cast<std::size_t>(pp_->rank())];
    for (std::size_t i = 0; i < stats_.starts.size(); ++i) {
      const auto at = static_cast<std::int64_t>(3 * (mine + i));
      times(at) = 1e3 * stats_.starts[i];
      times(at + 1) = 1e3 * stats_.ends[i];
      times(at + 2) = stats_.bytes[i];
    }
    times(peaks_at + pp_->rank()) = static_cast<double>(stats_.peak_context_bytes);
    all_reduce_from_host(*pp_, times, reduce_op::sum);
    simulation out;
    out.timeline.resize(static_cast<std::size_t>(ranks));
    for (int r = 0; r < ranks; ++r) out.peak_bytes.push_back(times(peaks_at + r));
    // A send and its receive name the same data: (sender, receiver, the sender's stage, the
    // micro-batch, the send's kind) -> the send's place.
    std::map<std::tuple<int, int, int, int, action_kind>, int> sends;
    for (int r = 0; r < ranks; ++r) {
      const auto& list = schedule_.on(r);
      for (std::size_t i = 0; i < list.size(); ++i) {
        const auto at = static_cast<std::int64_t>(3 * (first[static_cast<std::size_t>(r)] + i));
        const action& a = list[i];
        out.timeline[static_cast<std::size_t>(r)].push_back({a, times(at), times(at + 1)});
        if (is_compute(a.kind)) out.makespan = std::max(out.makespan, times(at + 1));
        if (is_send(a.kind))
          sends[{r, peer_of(a), a.stage, a.micro_batch, a.kind}] = static_cast<int>(i);
      }
    }
    for (int r = 0; r < ranks; ++r) {
      const auto& list = schedule_.on(r);
      for (std::size_t i = 0; i < list.size(); ++i) {
        const action& a = list[i];
        if (!is_recv(a.kind)) continue;
        const int sender_stage = a.kind == action_kind::recv_forward    ? a.stage - 1
                                 : a.kind == action_kind::recv_backward ? a.stage + 1
                                                                        : a.stage;
        const int from = peer_of(a);
        const auto found = sends.find({from, r, sender_stage, a.micro_batch, counterpart(a.kind)});
        if (found == sends.end()) continue;
        const timed_action& sent =
            out.timeline[static_cast<std::size_t>(from)][static_cast<std::size_t>(found->second)];
        const timed_action& received = out.timeline[static_cast<std::size_t>(r)][i];
        out.transfers.push_back(
            {.kind = counterpart(a.kind),
             .stage = sender_stage,
             .micro_batch = a.micro_batch,
             .from_rank = from,
             .from_index = found->second,
             .to_rank = r,
             .to_index = static_cast<int>(i),
             .begin = sent.start,
             .end = received.end,
             .bytes = times(
                 static_cast<std::int64_t>(3 * (first[static_cast<std::size_t>(r)] + i)) + 2)});
      }
    }
    return out;
  }

 private:
  using key = std::pair<int, int>;  // (global stage, micro-batch)

  struct slot {
    std::optional<nn::context<device_type>> ctx;  // from F until B or W
    std::optional<wire_type> received_input;      // RECV_F's buffer
    std::optional<output_type> output;            // until the next stage's F or SEND_F
    std::optional<wire_type> received_gradient;   // RECV_B's buffer
    std::optional<wire_type> input_gradient;      // until the previous stage's B/I or SEND_B
    std::optional<nn::context_manifest> evicted;  // BPipe: on the partner
    std::optional<nn::packed_context<device_type>> reloading;  // RELOAD's buffer
    std::size_t input_batch = 0, gradient_batch = 0, reload_batch = 0;
  };

  // A partner's context this rank keeps (BPipe), from ACCEPT to RETURN.
  struct parked {
    quintet::tensor<nn::packed_word, device_type> buffer;
    std::size_t bytes = 0;  // the context's, as its owner counts it (the buffer adds padding)
    std::size_t batch = 0;  // the one receiving it
  };

  struct batch {
    // Declared first: destroyed after the request has completed.
    std::vector<wire_type> sent;
    std::vector<std::size_t> actions;  // the list's transfers it carries (their end is its end)
    std::deque<quintet::tensor<nn::packed_word, device_type>> sent_words;
    comm_request request;
    bool done = false;
  };

  std::string where(const action& a, std::size_t index) const {
    return "rank " + std::to_string(pp_->rank()) + " action " + std::to_string(index) + " (" +
           to_string(a) + ")";
  }

  int peer_of(const action& a) const {
    return a.peer != action::no_peer ? a.peer : mapped_peer(schedule_, a);
  }

  bool holds(int stage) const {
    return stage >= 0 && stage < schedule_.stages() && local_[static_cast<std::size_t>(stage)] >= 0;
  }

  // Posts list[begin, end) (all transfers) as exchanges that each end at a receive — split too
  // where an ACCEPT must first learn the size of what it receives.
  void post(const std::vector<action>& list, std::size_t begin, std::size_t end,
            std::map<key, slot>& slots, std::map<key, parked>& accepted, std::deque<batch>& batches,
            const links& link) {
    std::vector<p2p_op> ops;
    batches.emplace_back();
    const auto flush = [&] {
      if (ops.empty()) return;
      batches.back().request = pp_->exchange_async(ops);
      ++stats_.batches_posted;
      ops.clear();
      batches.emplace_back();
    };
    for (std::size_t i = begin; i < end; ++i) {
      const action& a = list[i];
      batch& b = batches.back();
      const std::size_t id = batches.size() - 1;
      stats_.starts[i] = since();
      if (is_context_transfer(a.kind)) {
        move_context(a, i, slots, accepted, batches, ops, flush);
        batches.back().actions.push_back(i);
        stats_.bytes[i] = static_cast<double>(ops.back().buffer.bytes());
        continue;
      }
      b.actions.push_back(i);
      slot& here = slots[{a.stage, a.micro_batch}];
      switch (a.kind) {
        case action_kind::send_forward:
          QUINTET_CHECK(here.output.has_value(),
                        "pipeline runtime: {} sends an activation not made", where(a, i));
          b.sent.push_back(std::move(here.output->activations));
          here.output.reset();
          ops.push_back(p2p_op::send(b.sent.back(), peer_of(a)));
          break;
        case action_kind::send_backward:
          QUINTET_CHECK(here.input_gradient.has_value(),
                        "pipeline runtime: {} sends an input gradient not made", where(a, i));
          b.sent.push_back(std::move(*here.input_gradient));
          here.input_gradient.reset();
          ops.push_back(p2p_op::send(b.sent.back(), peer_of(a)));
          break;
        case action_kind::recv_forward:
          here.received_input.emplace(link.boundary_shape(a.stage - 1, a.micro_batch));
          here.input_batch = id;
          ops.push_back(p2p_op::recv(*here.received_input, peer_of(a)));
          break;
        default:  // recv_backward
          here.received_gradient.emplace(link.boundary_shape(a.stage, a.micro_batch));
          here.gradient_batch = id;
          ops.push_back(p2p_op::recv(*here.received_gradient, peer_of(a)));
          break;
      }
      stats_.bytes[i] = static_cast<double>(ops.back().buffer.bytes());
      // A compute waits for the whole batch holding its input: a receive ends its batch, so it
      // never waits on a later receive too (the peer's next micro-batch). Sends ride with the
      // receive that follows them.
      if (is_recv(a.kind)) flush();  // (context moves went on above)
    }
    if (!ops.empty()) {
      batches.back().request = pp_->exchange_async(ops);
      ++stats_.batches_posted;
    }
  }

  // BPipe's four context moves, into the batch being filled (batches.back()); `flush` posts it
  // and opens the next.
  template <class Flush>
  void move_context(const action& a, std::size_t index, std::map<key, slot>& slots,
                    std::map<key, parked>& accepted, std::deque<batch>& batches,
                    std::vector<p2p_op>& ops, const Flush& flush) {
    const key at{a.stage, a.micro_batch};
    switch (a.kind) {
      case action_kind::evict: {
        slot& here = slots[at];
        QUINTET_CHECK(here.ctx.has_value(),
                      "pipeline runtime: {} evicts a context it does not hold", where(a, index));
        nn::packed_context<device_type> packed = nn::pack(*here.ctx);
        // Its size first: the buffer's words and the context's bytes.
        quintet::tensor<nn::packed_word, host> words(shape{2});
        words(0) = packed.buffer().numel();
        words(1) = static_cast<nn::packed_word>(packed.bytes());
        auto& count = batches.back().sent_words.emplace_back(shape{2});
        copy(count, words);
        auto& buffer = batches.back().sent_words.emplace_back(packed.buffer().shape());
        copy(buffer, packed.buffer());
        ops.push_back(p2p_op::send(count, a.peer));
        ops.push_back(p2p_op::send(buffer, a.peer));
        here.evicted = packed.manifest();
        here.ctx.reset();
        ++stats_.contexts_moved;
        return;
      }
      case action_kind::accept: {
        QUINTET_CHECK(!accepted.contains(at), "pipeline runtime: {} accepts a context twice",
                      where(a, index));
        flush();
        quintet::tensor<nn::packed_word, device_type> count(shape{2});
        pp_->recv(count, a.peer);  // blocking: the buffer's size comes first
        quintet::tensor<nn::packed_word, host> words(shape{2});
        copy(words, count);
        parked& kept = accepted[at];
        kept.buffer = quintet::tensor<nn::packed_word, device_type>(shape{words(0)});
        kept.bytes = static_cast<std::size_t>(words(1));
        kept.batch = batches.size() - 1;
        ops.push_back(p2p_op::recv(kept.buffer, a.peer));
        return;
      }
      case action_kind::hand_back: {
        const auto found = accepted.find(at);
        QUINTET_CHECK(found != accepted.end(),
                      "pipeline runtime: {} returns a context it did not accept", where(a, index));
        if (found->second.batch == batches.size() - 1) flush();  // received in this very batch
        finish(batches[found->second.batch]);
        auto& buffer = batches.back().sent_words.emplace_back(std::move(found->second.buffer));
        accepted.erase(found);
        ops.push_back(p2p_op::send(buffer, a.peer));
        ++stats_.contexts_moved;
        return;
      }
      default: {  // reload
        slot& here = slots[at];
        QUINTET_CHECK(here.evicted.has_value() && !here.reloading.has_value(),
                      "pipeline runtime: {} reloads a context that was not evicted",
                      where(a, index));
        here.reloading.emplace(std::move(*here.evicted));
        here.evicted.reset();
        here.reload_batch = batches.size() - 1;
        ops.push_back(p2p_op::recv(here.reloading->buffer(), a.peer));
        return;
      }
    }
  }

  void compute(const action& a, std::size_t index, std::map<key, slot>& slots,
               std::deque<batch>& batches, std::vector<std::optional<output_type>>& results,
               const links& link) {
    const int last = schedule_.stages() - 1;
    Stage& stage = *stages_[static_cast<std::size_t>(local_[static_cast<std::size_t>(a.stage)])];
    slot& here = slots[{a.stage, a.micro_batch}];
    if (a.kind == action_kind::forward) {
      QUINTET_CHECK(!here.ctx.has_value(), "pipeline runtime: {} runs a forward twice",
                    where(a, index));
      output_type out;
      nn::context<device_type>& ctx = here.ctx.emplace();
      if (a.stage == 0) {
        out = stage.forward(ctx, link.input(a.stage, a.micro_batch, nullptr));
      } else if (holds(a.stage - 1)) {
        slot& previous = slots[{a.stage - 1, a.micro_batch}];
        QUINTET_CHECK(previous.output.has_value(),
                      "pipeline runtime: {} runs before the forward of stage {}", where(a, index),
                      a.stage - 1);
        out = stage.forward(ctx, link.input(a.stage, a.micro_batch, &*previous.output));
        previous.output.reset();
        forget_if_empty(slots, {a.stage - 1, a.micro_batch});
      } else {
        QUINTET_CHECK(here.received_input.has_value(),
                      "pipeline runtime: {} runs before its activation was received",
                      where(a, index));
        finish(batches[here.input_batch]);
        output_type received;
        received.activations = std::move(*here.received_input);
        here.received_input.reset();
        out = stage.forward(ctx, link.input(a.stage, a.micro_batch, &received));
      }
      if (a.stage == last) {
        results[static_cast<std::size_t>(a.micro_batch)] = std::move(out);
      } else {
        here.output = std::move(out);
      }
      return;
    }
    if (here.reloading.has_value()) {  // BPipe: the context came back
      finish(batches[here.reload_batch]);
      here.ctx.emplace(nn::unpack(*here.reloading));
      here.reloading.reset();
    }
    QUINTET_CHECK(here.ctx.has_value(), "pipeline runtime: {} runs without its forward's context",
                  where(a, index));
    if (a.kind == action_kind::backward_weight) {
      stage.backward_weight(*here.ctx);
      here.ctx.reset();
      forget_if_empty(slots, {a.stage, a.micro_batch});
      return;
    }
    wire_type dx;
    const auto backward = [&](const gradient_type& gradient) {
      return a.kind == action_kind::backward ? stage.backward(*here.ctx, gradient)
                                             : stage.backward_input(*here.ctx, gradient);
    };
    if (a.stage == last) {
      dx = backward(link.gradient(a.stage, a.micro_batch, nullptr));
    } else if (holds(a.stage + 1)) {
      slot& next = slots[{a.stage + 1, a.micro_batch}];
      QUINTET_CHECK(next.input_gradient.has_value(),
                    "pipeline runtime: {} runs before the backward of stage {}", where(a, index),
                    a.stage + 1);
      dx = backward(link.gradient(a.stage, a.micro_batch, &*next.input_gradient));
      next.input_gradient.reset();
      forget_if_empty(slots, {a.stage + 1, a.micro_batch});
    } else {
      QUINTET_CHECK(here.received_gradient.has_value(),
                    "pipeline runtime: {} runs before its gradient was received", where(a, index));
      finish(batches[here.gradient_batch]);
      const wire_type received = std::move(*here.received_gradient);
      here.received_gradient.reset();
      dx = backward(link.gradient(a.stage, a.micro_batch, &received));
    }
    if (a.stage > 0) here.input_gradient = std::move(dx);  // stage 0's has nowhere to go
    if (a.kind == action_kind::backward) here.ctx.reset();
    forget_if_empty(slots, {a.stage, a.micro_batch});
  }

  // An overlapped pair's halves as an overlapped_pair. The backward's context, whole since its
  // forward, is freed at the pair's end: the peak is counted as between the halves, with the
  // forward's context complete and the backward's still held.
  void run_overlapped(const action& pair, std::size_t index, std::map<key, slot>& slots,
                      const std::map<key, parked>& accepted, std::deque<batch>& batches,
                      std::vector<std::optional<output_type>>& results, const links& link) {
    const action backward = backward_half(pair);
    const auto held = slots.find({backward.stage, backward.micro_batch});
    int contexts = 0;
    std::size_t backward_bytes = 0;
    if (held != slots.end() && (held->second.ctx || held->second.reloading)) {
      contexts = 1;
      backward_bytes =
          held->second.ctx ? held->second.ctx->bytes() : held->second.reloading->bytes();
    }
    if (!pair_) pair_ = std::make_unique<overlapped_pair>();
    pair_->run([&] { compute(forward_half(pair), index, slots, batches, results, link); },
               [&] { compute(backward, index, slots, batches, results, link); });
    stats_.hand_overs += pair_->hand_overs();
    measure(slots, accepted, contexts, backward_bytes);
  }

  static void forget_if_empty(std::map<key, slot>& slots, key at) {
    const auto found = slots.find(at);
    if (found == slots.end()) return;
    const slot& s = found->second;
    if (!s.ctx && !s.received_input && !s.output && !s.received_gradient && !s.input_gradient &&
        !s.evicted && !s.reloading)
      slots.erase(found);
  }

  // Contexts held after an action (or a run of transfers), as the verifier counts them: own ones
  // from F to their last backward except while evicted (one coming back counts from its RELOAD),
  // and accepted ones from ACCEPT to RETURN. Bytes are the contexts' tensors' (context::bytes())
  // wherever a context is, as the simulator prices them; a packed buffer's alignment padding (at
  // most 63 bytes per tensor) is not counted.
  // `freed`, `freed_bytes`: the context an overlapped pair has just freed, counted as still held.
  void measure(const std::map<key, slot>& slots, const std::map<key, parked>& accepted,
               int freed = 0, std::size_t freed_bytes = 0) {
    int contexts = freed;
    std::size_t bytes = freed_bytes;
    for (const auto& [at, s] : slots) {
      if (s.ctx) {
        ++contexts;
        bytes += s.ctx->bytes();
      } else if (s.reloading) {
        ++contexts;
        bytes += s.reloading->bytes();
      }
    }
    for (const auto& [at, kept] : accepted) {
      ++contexts;
      bytes += kept.bytes;
    }
    stats_.peak_contexts = std::max(stats_.peak_contexts, contexts);
    stats_.peak_context_bytes = std::max(stats_.peak_context_bytes, bytes);
  }

  // Waits for the transfers that bring compute action `a` its input: the activation (F), the
  // output gradient (B, I) or the reloaded context (BPipe). compute() would wait for them first
  // thing; waiting here lets the runtime time the compute alone.
  void await_inputs(const action& a, std::map<key, slot>& slots, std::deque<batch>& batches) {
    const auto found = slots.find({a.stage, a.micro_batch});
    if (found == slots.end()) return;
    const slot& here = found->second;
    if (a.kind == action_kind::forward) {
      if (here.received_input.has_value()) finish(batches[here.input_batch]);
      return;
    }
    if (here.reloading.has_value()) finish(batches[here.reload_batch]);
    if (a.kind != action_kind::backward_weight && here.received_gradient.has_value())
      finish(batches[here.gradient_batch]);
  }

  // Waits for a batch (and so for every one posted before it) and frees what it sent.
  void finish(batch& b) {
    if (b.done) return;
    b.request.wait();
    b.sent.clear();
    b.sent_words.clear();
    b.done = true;
    for (const std::size_t i : b.actions) stats_.ends[i] = since();
  }

  double since() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - began_).count();
  }

  // Frees the send buffers of batches already complete, oldest first, without blocking.
  void release_finished(std::deque<batch>& batches, std::size_t& oldest_open) {
    for (; oldest_open < batches.size(); ++oldest_open) {
      batch& b = batches[oldest_open];
      if (b.done) continue;
      if (!b.request.ready()) return;
      finish(b);
    }
  }

  schedule schedule_;
  Comm* pp_;
  std::vector<Stage*> stages_;
  std::vector<int> held_;   // global stages on this rank, increasing
  std::vector<int> local_;  // (stages) global stage -> index into stages_, -1 if elsewhere
  run_stats stats_;
  std::chrono::steady_clock::time_point began_;  // of the last run, after its barrier
  bool overlap_pairs_ = true;
  std::unique_ptr<overlapped_pair> pair_;  // made by the first overlapped pair
};

}  // namespace quintet::parallel::pipeline
