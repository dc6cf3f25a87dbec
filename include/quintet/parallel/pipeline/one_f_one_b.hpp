// one_f_one_b: PipeDream-flush / Megatron's 1F1B. Stage i runs min(p-1-i, m) warm-up forwards,
// then alternates one forward and one backward, then drains the remaining backwards. Same bubble
// as GPipe, (p-1)/(m+p-1), but stage i holds at most min(p-i, m) contexts instead of m.
// Any m >= 1 runs; with m < p every stage's warm-up is cut short and the bubble grows as the
// formula says (PyTorch refuses m < p; here it is a correct schedule with its larger bubble).
//
//   p = 4, m = 6, F = 1, B = 2:
//   rank 0  F0 F1 F2 F3 .  .  .  .  .  .  B0 -  F4 B1 -  F5 B2 -  .  B3 -  .  B4 -  .  B5 -
//   rank 1  .  F0 F1 F2 .  .  .  .  B0 -  F3 B1 -  F4 B2 -  F5 B3 -  .  B4 -  .  B5 -  .  .
//   rank 2  .  .  F0 F1 .  .  B0 -  F2 B1 -  F3 B2 -  F4 B3 -  F5 B4 -  .  B5 -  .  .  .  .
//   rank 3  .  .  .  F0 B0 -  F1 B1 -  F2 B2 -  F3 B3 -  F4 B4 -  F5 B5 -  .  .  .  .  .  .
#pragma once

#include <quintet/parallel/pipeline/communication.hpp>
#include <quintet/parallel/pipeline/schedule_style.hpp>

#include <algorithm>

namespace quintet::parallel {

namespace pipeline {

inline schedule one_f_one_b_order(const schedule_shape& shape) {
  detail::check_shape("1f1b", shape);
  const int p = shape.ranks, m = shape.micro_batches;
  schedule s{"1f1b", m, looped_stage_map(p, 1), {}};
  s.actions.resize(static_cast<std::size_t>(p));
  for (int r = 0; r < p; ++r) {
    auto& list = s.actions[static_cast<std::size_t>(r)];
    const int warmup = std::min(p - 1 - r, m);
    int forwards = 0, backwards = 0;
    while (forwards < warmup) list.push_back({action_kind::forward, r, forwards++});
    while (forwards < m) {
      list.push_back({action_kind::forward, r, forwards++});
      list.push_back({action_kind::backward, r, backwards++});
    }
    while (backwards < m) list.push_back({action_kind::backward, r, backwards++});
  }
  return s;
}

inline schedule generate_one_f_one_b(const schedule_shape& shape) {
  return add_transfers(one_f_one_b_order(shape));
}

}  // namespace pipeline

struct one_f_one_b {
  static pipeline::schedule generate(const pipeline::schedule_shape& shape) {
    return pipeline::generate_one_f_one_b(shape);
  }
};

template <>
struct strategy_traits<one_f_one_b> : pipeline_traits_defaults {
  static constexpr std::string_view name = "one_f_one_b";
  static constexpr bool implemented = true;  // runs in train::trainer (pipeline runtime)
  static void check(const mesh_degrees& degrees, const model_dimensions& model) {
    pipeline::detail::check_layers(name, degrees, model, 1, false);
  }
};

}  // namespace quintet::parallel
