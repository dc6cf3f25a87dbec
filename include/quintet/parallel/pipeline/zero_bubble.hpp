// zb_h1, zb_h2: the handcrafted zero-bubble schedules (Qi et al., ICLR 2024). The backward is
// split into I (input gradient, which the previous stage waits for) and W (weight gradient, which
// nobody waits for), and W's fill what would be bubbles. Both are 1F1B-shaped: stage i runs `a`
// warm-up forwards, then repeats "I, the W of `b` micro-batches ago, the next F", then drains
// the remaining W's:
//
//   zb_h1   a = p - i       b = i     1F1B's memory: at most (p-i) + i = p contexts on any stage;
//                                     bubble (p-1)(F + B - W): a third of 1F1B's at F = B = W
//   zb_h2   a = 2(p-i) - 1  b = 2i    at most 2p-1 contexts; the warm-up fills the first bubble
//                                     and the deferred W's the last, so each stage runs without a
//                                     gap from its first action to its last (a parallelogram);
//                                     the step's bubble is then only the skew p-1, which the
//                                     next step absorbs when the optimizer step is validated
//                                     after the fact (the paper's post-validation)
//
//   zb_h1, p = 4, m = 6, F = I = W = 1 (1F1B would take 27 units, this 21):
//   rank 0  F0 F1 F2 F3 .  .  .  I0 W0 F4 I1 W1 F5 I2 W2 I3 W3 I4 W4 I5 W5
//   rank 1  .  F0 F1 F2 .  .  I0 F3 I1 W0 F4 I2 W1 F5 I3 W2 I4 W3 I5 W4 W5
//   rank 2  .  .  F0 F1 .  I0 F2 I1 F3 I2 W0 F4 I3 W1 F5 I4 W2 I5 W3 W4 W5
//   rank 3  .  .  .  F0 I0 F1 I1 F2 I2 F3 I3 W0 F4 I4 W1 F5 I5 W2 W3 W4 W5
//
//   zb_h2, p = 4, m = 7: no gap inside any rank's span
//   rank 0  F0 F1 F2 F3 F4 F5 F6 I0 W0 I1 W1 I2 W2 I3 W3 I4 W4 I5 W5 I6 W6 .  .  .
//   rank 1  .  F0 F1 F2 F3 F4 I0 F5 I1 F6 I2 W0 I3 W1 I4 W2 I5 W3 I6 W4 W5 W6 .  .
//   rank 2  .  .  F0 F1 F2 I0 F3 I1 F4 I2 F5 I3 F6 I4 W0 I5 W1 I6 W2 W3 W4 W5 W6 .
//   rank 3  .  .  .  F0 I0 F1 I1 F2 I2 F3 I3 F4 I4 F5 I5 F6 I6 W0 W1 W2 W3 W4 W5 W6
#pragma once

#include <quintet/parallel/pipeline/communication.hpp>
#include <quintet/parallel/pipeline/schedule_style.hpp>

#include <algorithm>
#include <string>

namespace quintet::parallel {

namespace pipeline {

namespace detail {

// Stage i: min(warmup(i), m) forwards, then for each micro-batch k in turn: I(k), W(k - lag(i))
// when there is one, the next F when one is left; then the W's still owed.
template <class Warmup, class Lag>
schedule split_backward_order(std::string name, const schedule_shape& shape, Warmup warmup,
                              Lag lag) {
  check_shape(name, shape);
  const int p = shape.ranks, m = shape.micro_batches;
  schedule s{std::move(name), m, looped_stage_map(p, 1), {}};
  s.actions.resize(static_cast<std::size_t>(p));
  for (int i = 0; i < p; ++i) {
    auto& list = s.actions[static_cast<std::size_t>(i)];
    const int a = std::min(warmup(p, i), m), b = lag(p, i);
    int forwards = 0, weights = 0;
    while (forwards < a) list.push_back({action_kind::forward, i, forwards++});
    for (int k = 0; k < m; ++k) {
      list.push_back({action_kind::backward_input, i, k});
      if (k >= b) list.push_back({action_kind::backward_weight, i, weights++});
      if (forwards < m) list.push_back({action_kind::forward, i, forwards++});
    }
    while (weights < m) list.push_back({action_kind::backward_weight, i, weights++});
  }
  return s;
}

}  // namespace detail

inline schedule zb_h1_order(const schedule_shape& shape) {
  return detail::split_backward_order(
      "zb-h1", shape, [](int p, int i) { return p - i; }, [](int, int i) { return i; });
}

inline schedule zb_h2_order(const schedule_shape& shape) {
  return detail::split_backward_order(
      "zb-h2", shape, [](int p, int i) { return 2 * (p - i) - 1; },
      [](int, int i) { return 2 * i; });
}

inline schedule generate_zb_h1(const schedule_shape& shape) {
  return add_transfers(zb_h1_order(shape));
}
inline schedule generate_zb_h2(const schedule_shape& shape) {
  return add_transfers(zb_h2_order(shape));
}

}  // namespace pipeline

struct zb_h1 {
  static pipeline::schedule generate(const pipeline::schedule_shape& shape) {
    return pipeline::generate_zb_h1(shape);
  }
};
struct zb_h2 {
  static pipeline::schedule generate(const pipeline::schedule_shape& shape) {
    return pipeline::generate_zb_h2(shape);
  }
};

template <>
struct strategy_traits<zb_h1> : pipeline_traits_defaults {
  static constexpr std::string_view name = "zb_h1";
  static constexpr bool implemented = true;  // runs in train::trainer (pipeline runtime)
  static void check(const mesh_degrees& degrees, const model_dimensions& model) {
    pipeline::detail::check_layers(name, degrees, model, 1, false);
  }
};
template <>
struct strategy_traits<zb_h2> : pipeline_traits_defaults {
  static constexpr std::string_view name = "zb_h2";
  static constexpr bool implemented = true;  // runs in train::trainer (pipeline runtime)
  static void check(const mesh_degrees& degrees, const model_dimensions& model) {
    pipeline::detail::check_layers(name, degrees, model, 1, false);
  }
};

}  // namespace quintet::parallel
