// zero<Stage>: data parallelism with ZeRO stage 0 (DDP: replicated optimizer) .. 3 (FSDP:
// parameters sharded), the style of parallel::dp<...>. Each dp rank trains on its own rows of the
// batch and leaves every gradient partial over dp; data_parallel_runtime.hpp reduces them and
// shards the optimizer (stages 1, 2), and the parameters between uses (stage 3).
//
//   dp = 2, batch 8:   rank 0 rows 0..3, rank 1 rows 4..7; each a whole model replica
//   zero<1>: optimizer state of a flat bucket split   [ rank 0 | rank 1 ]  (flat_sharding)
//   zero<2>: + gradients reduce-scattered to the same ranges
//   zero<3>: + the parameters themselves, gathered per layer before use
#pragma once

#include <quintet/mesh/mesh_axis.hpp>
#include <quintet/parallel/strategy.hpp>

#include <fmt/format.h>

#include <string>
#include <string_view>

namespace quintet::parallel {

// zero<runtime_stage>: the stage chosen at run time (train::training_options::zero_stage). The
// stage changes which collectives the data-parallel runtime posts and what it keeps, not the
// model's code, so one plan type serves all four: a binary that picks its plan from the command
// line instantiates the model once instead of once per stage.
inline constexpr int runtime_stage = -1;

template <int Stage>
struct zero {
  static_assert(Stage == runtime_stage || (Stage >= 0 && Stage <= 3),
                "parallel::zero<Stage>: Stage must be 0, 1, 2 or 3 (or runtime_stage)");
  static constexpr int stage = Stage;
};

template <int Stage>
struct strategy_traits<zero<Stage>> : style_traits_defaults {
  static constexpr strategy kind = strategy::data;
  static constexpr std::string_view name = "zero";
  static std::string parameters() {
    return Stage == runtime_stage ? std::string("<runtime_stage>") : fmt::format("<{}>", Stage);
  }
  static constexpr mesh_axis_set axes{mesh_axis::dp};
  static constexpr mesh_axis_set batch_split_axes{mesh_axis::dp};
  static constexpr mesh_axis_set partial_gradient_axes(const placement&) { return {mesh_axis::dp}; }
};

}  // namespace quintet::parallel
