// megatron_1d: Megatron-LM's 1D tensor parallelism, the style of parallel::tp<...>. Attention heads
// and the MLP's hidden units are split over the tp group (column_linear then row_linear, two
// all-reduces forward and two backward per block), the token table and the logits over the
// vocabulary (padded to a multiple of tp), and the loss is taken without gathering the logits.
//
//   tp = 2:   rank 0: heads [0, h/2), hidden [0, 4d/2), ids [0, V_pad/2)
//             rank 1: heads [h/2, h), hidden [4d/2, 4d), ids [V_pad/2, V_pad)
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/mesh/mesh_axis.hpp>
#include <quintet/parallel/strategy.hpp>

#include <string_view>

namespace quintet::parallel {

struct megatron_1d {};

template <>
struct strategy_traits<megatron_1d> : style_traits_defaults {
  static constexpr strategy kind = strategy::tensor;
  static constexpr std::string_view name = "megatron_1d";
  static constexpr mesh_axis_set axes{mesh_axis::tp};
  // Every tp rank sees the whole activations, so replicated parameters (layer norms, positions,
  // row biases) get whole gradients: nothing is left partial.

  static void check(const mesh_degrees& degrees, const model_dimensions& model) {
    QUINTET_CHECK(model.heads % degrees.tp == 0,
                  "tp<megatron_1d>: {} heads do not divide over tp = {}", model.heads, degrees.tp);
    QUINTET_CHECK(model.hidden % degrees.tp == 0,
                  "tp<megatron_1d>: the MLP's {} hidden units do not divide over tp = {}",
                  model.hidden, degrees.tp);
  }
};

}  // namespace quintet::parallel
