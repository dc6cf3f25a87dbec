// ulysses: DeepSpeed-Ulysses, a style of parallel::sp<...> on the sp axis. Each sp rank embeds,
// normalises and projects its contiguous block of the sequence; around the attention kernel an
// all-to-all trades sequence rows for heads, so attention sees the whole sequence for 1/sp of the
// heads, and a second all-to-all trades them back.
//
//   sp = 2, seq 8, 4 heads:   rank 0: positions 0..3 (all heads) <-> all positions, heads 0, 1
//                             rank 1: positions 4..7 (all heads) <-> all positions, heads 2, 3
// Every parameter sees only the rank's rows: every gradient is partial over sp.
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/mesh/mesh_axis.hpp>
#include <quintet/parallel/sequence/sequence_collectives.hpp>
#include <quintet/parallel/sequence/sequence_layout.hpp>
#include <quintet/parallel/sequence/whole_sequence.hpp>
#include <quintet/parallel/strategy.hpp>

#include <cstdint>
#include <string_view>

namespace quintet::parallel {

struct ulysses {};

template <>
struct strategy_traits<ulysses> : style_traits_defaults, whole_sequence {
  static constexpr strategy kind = strategy::sequence;
  static constexpr std::string_view name = "ulysses";
  static constexpr mesh_axis_set axes{mesh_axis::sp};
  static constexpr bool splits_tokens_over_sp = true;
  static constexpr bool attention_output_is_projection_input = false;

  static constexpr mesh_axis_set partial_gradient_axes(const placement&) { return {mesh_axis::sp}; }
  static void check(const mesh_degrees& degrees, const model_dimensions& model) {
    QUINTET_CHECK(model.heads % (degrees.tp * degrees.sp) == 0,
                  "sp<ulysses>: {} heads do not divide over tp x sp = {} x {} (Ulysses gives each "
                  "rank whole heads)",
                  model.heads, degrees.tp, degrees.sp);
  }

  template <class Mesh>
  static sequence_layout input_layout(Mesh* mesh, std::int64_t seq) {
    return sequence_layout::contiguous(seq, mesh->sp().size(), mesh->sp().rank(), "ulysses");
  }
  template <class Mesh>
  static sequence_layout activation_layout(Mesh* mesh, std::int64_t seq) {
    return input_layout(mesh, seq);
  }

  template <class Mesh>
  static std::int64_t head_split(Mesh* mesh) {
    return mesh->sp().size();
  }
  // (batch, seq / sp, groups * w) -> (batch, seq, groups * w / sp), and back; from a tensor or a
  // view of one (attention's kept output).
  template <class Mesh, class X>
  static auto to_attention(Mesh* mesh, const X& rows, std::int64_t groups) {
    return sequence_to_heads(mesh->sp(), view_of(rows), groups);
  }
  template <class Mesh, class X>
  static auto from_attention(Mesh* mesh, const X& heads, std::int64_t groups) {
    return heads_to_sequence(mesh->sp(), view_of(heads), groups);
  }

  template <class Mesh>
  static kernels::cross_entropy_result complete_loss(Mesh* mesh,
                                                     kernels::cross_entropy_result loss) {
    return sum_loss_over(mesh->sp(), loss);
  }
};

}  // namespace quintet::parallel
