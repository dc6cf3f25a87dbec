// The five strategy policies a plan is made of, and the styles each accepts. A policy is a type:
// parallel::tensor<megatron_1d> selects which code is compiled; how many ranks share the work
// (the degree) is a runtime value of the device mesh.
#pragma once

#include <concepts>
#include <cstdint>

namespace quintet::parallel {

enum class strategy : std::uint8_t { data, tensor, sequence, expert, pipeline };

// ---- styles -----------------------------------------------------------------------------------

// Data parallel: ZeRO stage 0 (DDP, replicated optimizer) .. 3 (FSDP, parameters sharded).
template <int Stage>
struct zero {
  static_assert(Stage >= 0 && Stage <= 3, "parallel::zero<Stage>: Stage must be 0, 1, 2 or 3");
  static constexpr int stage = Stage;
};

// Tensor parallel: Megatron-LM column/row-parallel linears, vocab-parallel embedding and loss.
struct megatron_1d {};

// Sequence parallel: Megatron-SP (on the tensor-parallel group), DeepSpeed-Ulysses (all-to-all
// of heads), ring attention (context parallelism, K/V passed around a ring).
struct megatron_sp {};
struct ulysses {};
struct ring {};

// Expert parallel: a softmax router keeping the top K experts per token.
template <int K>
struct top_k {
  static_assert(K >= 1, "parallel::top_k<K>: K must be at least 1");
  static constexpr int k = K;
};

// Pipeline schedules.
struct gpipe {};
struct one_f_one_b {};
template <int VirtualStages>
struct interleaved {
  static_assert(VirtualStages >= 2, "parallel::interleaved<V>: V (chunks per device) must be >= 2");
  static constexpr int virtual_stages = VirtualStages;
};
struct zero_bubble {};

// ---- which style belongs to which strategy ------------------------------------------------------

template <strategy S, class Style>
inline constexpr bool is_style_of = false;

template <int Stage>
inline constexpr bool is_style_of<strategy::data, zero<Stage>> = true;
template <>
inline constexpr bool is_style_of<strategy::tensor, megatron_1d> = true;
template <>
inline constexpr bool is_style_of<strategy::sequence, megatron_sp> = true;
template <>
inline constexpr bool is_style_of<strategy::sequence, ulysses> = true;
template <>
inline constexpr bool is_style_of<strategy::sequence, ring> = true;
template <int K>
inline constexpr bool is_style_of<strategy::expert, top_k<K>> = true;
template <>
inline constexpr bool is_style_of<strategy::pipeline, gpipe> = true;
template <>
inline constexpr bool is_style_of<strategy::pipeline, one_f_one_b> = true;
template <int V>
inline constexpr bool is_style_of<strategy::pipeline, interleaved<V>> = true;
template <>
inline constexpr bool is_style_of<strategy::pipeline, zero_bubble> = true;

// ---- the policies -------------------------------------------------------------------------------

template <strategy S, class Style>
struct strategy_policy {
  // Completing the style runs its own checks (zero<4> is rejected here, not silently accepted).
  static_assert(sizeof(Style) > 0);
  static constexpr strategy kind = S;
  using style = Style;
};

template <class Style>
struct data : strategy_policy<strategy::data, Style> {
  static_assert(is_style_of<strategy::data, Style>,
                "parallel::data<Style>: Style must be a data-parallel style: zero<0..3>");
};

template <class Style>
struct tensor : strategy_policy<strategy::tensor, Style> {
  static_assert(is_style_of<strategy::tensor, Style>,
                "parallel::tensor<Style>: Style must be a tensor-parallel style: megatron_1d");
};

template <class Style>
struct sequence : strategy_policy<strategy::sequence, Style> {
  static_assert(is_style_of<strategy::sequence, Style>,
                "parallel::sequence<Style>: Style must be a sequence-parallel style: "
                "megatron_sp, ulysses or ring");
};

template <class Style>
struct expert : strategy_policy<strategy::expert, Style> {
  static_assert(is_style_of<strategy::expert, Style>,
                "parallel::expert<Style>: Style must be an expert-parallel style: top_k<K>");
};

template <class Style>
struct pipeline : strategy_policy<strategy::pipeline, Style> {
  static_assert(is_style_of<strategy::pipeline, Style>,
                "parallel::pipeline<Style>: Style must be a pipeline schedule: gpipe, "
                "one_f_one_b, interleaved<V> or zero_bubble");
};

// strategy_policy_type: one of the five wrappers above (with any valid style).
template <class Policy>
concept strategy_policy_type = requires {
  { Policy::kind } -> std::convertible_to<strategy>;
  typename Policy::style;
}
&&std::derived_from<Policy, strategy_policy<Policy::kind, typename Policy::style>>;

}  // namespace quintet::parallel
