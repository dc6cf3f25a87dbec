// ring: ring attention (context parallelism), a style of parallel::sp<...> on the sp axis. Each sp
// rank holds two zig-zag chunks of the sequence everywhere (chunks r and 2 sp - 1 - r, so every
// rank does the same share of causal work); attention passes keys and values around the sp ring
// and merges the blocks with the online softmax (ring_attention.hpp).
//
//   sp = 2, seq 8:   rank 0 holds positions 0 1 | 6 7, rank 1 positions 2 3 | 4 5
// Every parameter sees only the rank's rows: every gradient is partial over sp.
#pragma once

#include <quintet/mesh/mesh_axis.hpp>
#include <quintet/parallel/sequence/ring_attention.hpp>
#include <quintet/parallel/sequence/sequence_layout.hpp>
#include <quintet/parallel/sequence/whole_sequence.hpp>
#include <quintet/parallel/strategy.hpp>

#include <cstdint>
#include <string_view>
#include <utility>

namespace quintet::parallel {

struct ring {};

template <>
struct strategy_traits<ring> : style_traits_defaults, whole_sequence {
  static constexpr strategy kind = strategy::sequence;
  static constexpr std::string_view name = "ring";
  static constexpr mesh_axis_set axes{mesh_axis::sp};
  static constexpr bool splits_tokens_over_sp = true;

  static constexpr mesh_axis_set partial_gradient_axes(const placement&) { return {mesh_axis::sp}; }

  template <class Mesh>
  static sequence_layout input_layout(Mesh* mesh, std::int64_t seq) {
    return sequence_layout::zigzag(seq, mesh->sp().size(), mesh->sp().rank());
  }
  template <class Mesh>
  static sequence_layout activation_layout(Mesh* mesh, std::int64_t seq) {
    return input_layout(mesh, seq);
  }

  template <class Mesh, class Device, class... Operands>
  static void attention_forward(const execution<Device>& exec, Mesh* mesh, Operands&&... operands) {
    ring_attention_forward(exec, mesh->sp(), std::forward<Operands>(operands)...);
  }
  template <class Mesh, class Device, class... Operands>
  static void attention_backward(const execution<Device>& exec, Mesh* mesh,
                                 Operands&&... operands) {
    ring_attention_backward(exec, mesh->sp(), std::forward<Operands>(operands)...);
  }

  template <class Mesh>
  static kernels::cross_entropy_result complete_loss(Mesh* mesh,
                                                     kernels::cross_entropy_result loss) {
    return sum_loss_over(mesh->sp(), loss);
  }
};

}  // namespace quintet::parallel
