// gpipe: every micro-batch's forward, then every backward (Huang et al., 2019). The simplest
// schedule: each stage holds all m contexts at once; bubble (p-1)/(m+p-1) of the step.
//
//   p = 4, m = 4, F = 1, B = 2 (a cell is one unit; '-' continues the action before it):
//   rank 0  F0 F1 F2 F3 .  .  .  .  .  .  .  .  .  B0 -  B1 -  B2 -  B3 -
//   rank 1  .  F0 F1 F2 F3 .  .  .  .  .  .  B0 -  B1 -  B2 -  B3 -  .  .
//   rank 2  .  .  F0 F1 F2 F3 .  .  .  B0 -  B1 -  B2 -  B3 -  .  .  .  .
//   rank 3  .  .  .  F0 F1 F2 F3 B0 -  B1 -  B2 -  B3 -  .  .  .  .  .  .
#pragma once

#include <quintet/parallel/pipeline/communication.hpp>
#include <quintet/parallel/pipeline/schedule_style.hpp>

namespace quintet::parallel {

namespace pipeline {

// The compute order: on every rank F0 .. F(m-1), then B0 .. B(m-1).
inline schedule gpipe_order(const schedule_shape& shape) {
  detail::check_shape("gpipe", shape);
  schedule s{"gpipe", shape.micro_batches, looped_stage_map(shape.ranks, 1), {}};
  s.actions.resize(static_cast<std::size_t>(shape.ranks));
  for (int r = 0; r < shape.ranks; ++r) {
    auto& list = s.actions[static_cast<std::size_t>(r)];
    for (int m = 0; m < shape.micro_batches; ++m) list.push_back({action_kind::forward, r, m});
    for (int m = 0; m < shape.micro_batches; ++m) list.push_back({action_kind::backward, r, m});
  }
  return s;
}

inline schedule generate_gpipe(const schedule_shape& shape) {
  return add_transfers(gpipe_order(shape));
}

}  // namespace pipeline

struct gpipe {
  static pipeline::schedule generate(const pipeline::schedule_shape& shape) {
    return pipeline::generate_gpipe(shape);
  }
};

template <>
struct strategy_traits<gpipe> : pipeline_traits_defaults {
  static constexpr std::string_view name = "gpipe";
  static constexpr bool implemented = true;  // runs in train::trainer (pipeline runtime)
  static void check(const mesh_degrees& degrees, const model_dimensions& model) {
    pipeline::detail::check_layers(name, degrees, model, 1, false);
  }
};

}  // namespace quintet::parallel
