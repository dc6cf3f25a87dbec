// megatron_sp: Megatron sequence parallelism (Korthikanti et al. 2022), a style of
// parallel::sp<...> that runs on the tensor-parallel group. Between the tensor-parallel linears
// (layer norms, dropout, residuals) each tp rank holds its block of the sequence; the column linear
// gathers it, the row linear reduce-scatters back to it, so the per-rank activations there are
// 1/tp.
//
//   tp = 2, seq 8:   rank 0 holds positions 0..3 between the linears, rank 1 positions 4..7;
//                    inside attention and the MLP both hold all 8 (their heads / hidden units)
// Parameters replicated over tp (layer norms, position table, row biases) see only their rank's
// block: their gradients are partial over tp.
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/mesh/mesh_axis.hpp>
#include <quintet/parallel/sequence/sequence_layout.hpp>
#include <quintet/parallel/sequence/whole_sequence.hpp>
#include <quintet/parallel/strategy.hpp>

#include <cstdint>
#include <string_view>

namespace quintet::parallel {

struct megatron_sp {};

template <>
struct strategy_traits<megatron_sp> : style_traits_defaults, whole_sequence {
  static constexpr strategy kind = strategy::sequence;
  static constexpr std::string_view name = "megatron_sp";
  static constexpr mesh_axis_set axes{mesh_axis::tp};
  static constexpr bool shards_activations_on_tp = true;
  using linear_sequence = megatron_sp;

  static constexpr mesh_axis_set partial_gradient_axes(const placement& where) {
    return where.is_sharded(mesh_axis::tp) ? mesh_axis_set{} : mesh_axis_set{mesh_axis::tp};
  }
  static void check(const mesh_degrees& degrees, const model_dimensions&) {
    QUINTET_CHECK(
        degrees.sp == 1,
        "the mesh has sp = {}, but megatron_sp shards the sequence on tp and needs sp = 1 "
        "(sp<ulysses> and sp<ring> use an sp axis)",
        degrees.sp);
  }
  template <class... Policies>
  struct check_composition {
    static_assert(((Policies::kind == strategy::tensor) || ...),
                  "quintet::plan: sp<megatron_sp> shards activations on the tensor-parallel "
                  "group, so the plan also needs parallel::tp<...>");
  };

  template <class Mesh>
  static sequence_layout activation_layout(Mesh* mesh, std::int64_t seq) {
    return sequence_layout::contiguous(seq, mesh->tp().size(), mesh->tp().rank(), "megatron_sp");
  }
};

}  // namespace quintet::parallel
