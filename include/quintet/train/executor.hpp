// executor: runs one rank's ordered list of per-micro-batch steps — forward, backward, or backward
// split into its input and weight passes — over the stages the rank holds, each micro-batch with a
// context of its own. A stage's output feeds the next stage's forward of the same micro-batch, and
// its input gradient the previous stage's backward; `links` say how (for the first stage, the
// micro-batch's data; for the last, the objective's gradient).
//
//   the trainer's list (one stage, 2 micro-batches):   F0 B0 F1 B1          (s = 0 everywhere)
//   two stages on one rank, split backward:            F0 F0' I0' I0 W0' W0 (' = stage 1)
// The list is data: pipeline schedules (the next issue) hand the executor their per-rank lists,
// with communication steps added to these kinds. Every step is checked against what ran before
// it — a backward before its forward, a weight pass before its input pass, a forward run twice, a
// stage or micro-batch out of range, work left unfinished — before any stage runs, so a refused
// list changes no gradient; errors name the step.
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/nn/context.hpp>
#include <quintet/nn/stage.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace quintet::train {

enum class step_kind : std::uint8_t { forward, backward, backward_input, backward_weight };

constexpr std::string_view name_of(step_kind kind) {
  switch (kind) {
    case step_kind::forward:
      return "F";
    case step_kind::backward:
      return "B";
    case step_kind::backward_input:
      return "I";
    case step_kind::backward_weight:
      return "W";
  }
  return "?";
}

// One step: what to run, on which of the rank's stages, for which micro-batch.
struct step {
  step_kind kind = step_kind::forward;
  int stage = 0;
  int micro_batch = 0;

  friend bool operator==(const step&, const step&) = default;
};

// "<stage><kind><micro-batch>", the notation of PyTorch's pipelining schedules: 0F1, 1W0.
inline std::string to_string(const step& s) {
  return std::to_string(s.stage) + std::string(name_of(s.kind)) + std::to_string(s.micro_batch);
}

// Forward then the whole backward of each micro-batch in turn over `stages` stages on one rank:
// what a training loop without a pipeline runs (stages > 1: a model cut into stages, all local).
inline std::vector<step> forward_backward_steps(int micro_batches, int stages = 1) {
  std::vector<step> steps;
  for (int m = 0; m < micro_batches; ++m) {
    for (int s = 0; s < stages; ++s) steps.push_back({step_kind::forward, s, m});
    for (int s = stages - 1; s >= 0; --s) steps.push_back({step_kind::backward, s, m});
  }
  return steps;
}

template <nn::stage Stage>
class executor {
 public:
  using device_type = typename Stage::device_type;
  using input_type = typename Stage::input_type;
  using output_type = typename Stage::output_type;
  using gradient_type = typename Stage::gradient_type;
  using input_gradient_type = typename Stage::input_gradient_type;

  // How data moves between a rank's stages and in from outside:
  //   input(stage, micro_batch, previous)   the stage's input; `previous` is the output of the
  //                                         stage before (null for the first)
  //   gradient(stage, micro_batch, next)    what the stage's backward is given; `next` is the
  //                                         input gradient of the stage after (null for the last)
  struct links {
    std::function<input_type(int, int, const output_type*)> input;
    std::function<gradient_type(int, int, const input_gradient_type*)> gradient;
  };

  explicit executor(std::vector<Stage*> stages) : stages_(std::move(stages)) {
    QUINTET_CHECK(!stages_.empty(), "executor: a rank needs at least one stage");
    for (const Stage* s : stages_) QUINTET_CHECK(s != nullptr, "executor: a stage is missing");
  }

  // Checks `steps` over this rank's stages and `micro_batches` micro-batches without running
  // anything: the first step that breaks a dependency, and a list that leaves work unfinished,
  // are errors naming them. run() checks first, so a refused list changes no gradient.
  void check(const std::vector<step>& steps, int micro_batches) const {
    walk<false>(steps, micro_batches, nullptr);
  }

  // Runs `steps` in order with `micro_batches` micro-batches; returns the last stage's output of
  // every micro-batch, in micro-batch order (the losses, for a model's last stage).
  std::vector<output_type> run(const std::vector<step>& steps, int micro_batches,
                               const links& link) {
    QUINTET_CHECK(link.input && link.gradient, "executor: both links must be given");
    check(steps, micro_batches);
    return walk<true>(steps, micro_batches, &link);
  }

 private:
  using key = std::pair<int, int>;  // (stage, micro-batch)
  struct slot {
    nn::context<device_type> ctx;
    std::optional<output_type> output;                  // until the next stage's forward
    std::optional<input_gradient_type> input_gradient;  // until the previous stage's backward
    bool output_held = false, input_gradient_held = false;
    bool input_done = false, weight_done = false;
  };

  // The bookkeeping of a step list; with Execute, the stages run too.
  template <bool Execute>
  std::vector<output_type> walk(const std::vector<step>& steps, int micro_batches,
                                const links* link) const {
    QUINTET_CHECK(micro_batches >= 1, "executor: {} micro-batches, need at least one",
                  micro_batches);
    const int last = static_cast<int>(stages_.size()) - 1;
    std::vector<std::optional<output_type>> results(static_cast<std::size_t>(micro_batches));
    std::vector<bool> scored(static_cast<std::size_t>(micro_batches), false);
    std::map<key, slot> slots;  // (stage, micro-batch) begun and not yet finished
    std::set<key> finished;
    for (std::size_t i = 0; i < steps.size(); ++i) {
      const step& s = steps[i];
      const auto where = [&] { return "step " + std::to_string(i) + " (" + to_string(s) + ")"; };
      QUINTET_CHECK(s.stage >= 0 && s.stage <= last, "executor: {} names stage {} of {}", where(),
                    s.stage, last + 1);
      QUINTET_CHECK(s.micro_batch >= 0 && s.micro_batch < micro_batches,
                    "executor: {} names micro-batch {} of {}", where(), s.micro_batch,
                    micro_batches);
      const key here{s.stage, s.micro_batch};
      slot* mine = find(slots, here);
      if (s.kind == step_kind::forward) {
        QUINTET_CHECK(mine == nullptr && !finished.contains(here),
                      "executor: {} runs a forward twice", where());
        slot* previous = s.stage == 0 ? nullptr : find(slots, {s.stage - 1, s.micro_batch});
        QUINTET_CHECK(s.stage == 0 || (previous != nullptr && previous->output_held),
                      "executor: {} runs before the forward of stage {}", where(), s.stage - 1);
        mine = &slots[here];
        if constexpr (Execute) {
          output_type out = stages_[s.stage]->forward(
              mine->ctx, link->input(s.stage, s.micro_batch,
                                     previous != nullptr ? &*previous->output : nullptr));
          if (previous != nullptr) previous->output.reset();
          if (s.stage == last) {
            results[s.micro_batch] = std::move(out);
          } else {
            mine->output = std::move(out);
          }
        }
        if (previous != nullptr) previous->output_held = false;  // consumed
        mine->output_held = s.stage != last;
        if (s.stage == last) scored[s.micro_batch] = true;
        continue;
      }
      QUINTET_CHECK(mine != nullptr, "executor: {} runs before its forward", where());
      if (s.kind == step_kind::backward_weight) {
        QUINTET_CHECK(mine->input_done && !mine->weight_done,
                      "executor: {} runs without its input pass, or twice", where());
        if constexpr (Execute) stages_[s.stage]->backward_weight(mine->ctx);
        mine->weight_done = true;
        finish_if_done(slots, finished, here);
        continue;
      }
      QUINTET_CHECK(!mine->input_done, "executor: {} runs a backward twice", where());
      slot* next = s.stage == last ? nullptr : find(slots, {s.stage + 1, s.micro_batch});
      QUINTET_CHECK(s.stage == last || (next != nullptr && next->input_gradient_held),
                    "executor: {} runs before the backward of stage {}", where(), s.stage + 1);
      if constexpr (Execute) {
        const gradient_type gradient = link->gradient(
            s.stage, s.micro_batch, next != nullptr ? &*next->input_gradient : nullptr);
        input_gradient_type dx = s.kind == step_kind::backward
                                     ? stages_[s.stage]->backward(mine->ctx, gradient)
                                     : stages_[s.stage]->backward_input(mine->ctx, gradient);
        // The first stage's input gradient has nowhere to go on this rank.
        if (s.stage > 0) mine->input_gradient = std::move(dx);
        if (next != nullptr) next->input_gradient.reset();
      }
      mine->input_gradient_held = s.stage > 0;
      mine->input_done = true;
      mine->weight_done = s.kind == step_kind::backward;
      if (next != nullptr) {
        next->input_gradient_held = false;  // consumed
        finish_if_done(slots, finished, {s.stage + 1, s.micro_batch});
      }
      finish_if_done(slots, finished, here);
    }
    QUINTET_CHECK(slots.empty(),
                  "executor: the steps leave stage {} micro-batch {} unfinished (a forward "
                  "without its whole backward)",
                  slots.begin()->first.first, slots.begin()->first.second);
    for (std::size_t m = 0; m < scored.size(); ++m)
      QUINTET_CHECK(scored[m], "executor: micro-batch {} never ran the last stage", m);
    std::vector<output_type> out;
    if constexpr (Execute) {
      out.reserve(results.size());
      for (auto& result : results) out.push_back(std::move(*result));
    }
    return out;
  }

  static slot* find(std::map<key, slot>& slots, key at) {
    const auto found = slots.find(at);
    return found == slots.end() ? nullptr : &found->second;
  }

  // A micro-batch's stage is finished once its weights have their gradient and its input
  // gradient was taken: its context goes.
  static void finish_if_done(std::map<key, slot>& slots, std::set<key>& finished, key at) {
    const slot* held = find(slots, at);
    if (held != nullptr && held->weight_done && !held->input_gradient_held) {
      slots.erase(at);
      finished.insert(at);
    }
  }

  std::vector<Stage*> stages_;
};

}  // namespace quintet::train
