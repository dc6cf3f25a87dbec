// strategy_traits<Style>: what a parallel style is, stated once, beside the style in its
// strategy's folder (parallel/tensor/megatron_1d.hpp, parallel/sequence/ring.hpp, ...). The plan
// folds the traits of its styles; the model, the training loop, gradient synchronisation, the
// gradient norm and the batch check ask the plan, never which style it is.
//
//   kind                      the strategy it belongs to (which policy, dp<> .. pp<>, takes it)
//   name                      how messages and reports spell it ("megatron_1d"; a template's
//                             parameters() adds its arguments: "zero" "<1>")
//   implemented               false: a plan naming it is a compile error, not a silent serial run
//   axes                      the mesh axes it runs on; a mesh degree > 1 on an axis no style uses
//                             is refused
//   batch_split_axes          axes whose ranks train on different rows of the batch (data
//                             parallelism); on the style's other axes every rank gets the whole
//                             micro-batch, which the batch check verifies
//   staged_axes               axes whose ranks run different parts of the model one after the
//                             other (pipeline stages): they never run a forward together, so the
//                             batch check does not compare over them
//   partial_gradient_axes(p)  the axes over which a parameter of placement p is left with a
//                             partial gradient after backward (summed once per step)
//   check(degrees, model)     its runtime checks of the mesh degrees and the model's dimensions
//   check_composition<Policies...>   static_asserts on the rest of the plan (megatron_sp needs tp)
#pragma once

#include <quintet/mesh/mesh_axis.hpp>
#include <quintet/mesh/mesh_layout.hpp>
#include <quintet/parallel/placement.hpp>

#include <concepts>
#include <cstdint>
#include <string>
#include <string_view>

namespace quintet::parallel {

enum class strategy : std::uint8_t { data, tensor, sequence, expert, pipeline };

// The policy that takes a strategy's styles: parallel::dp<...> for data, and so on.
constexpr std::string_view policy_name(strategy s) {
  switch (s) {
    case strategy::data:
      return "dp";
    case strategy::tensor:
      return "tp";
    case strategy::sequence:
      return "sp";
    case strategy::expert:
      return "ep";
    case strategy::pipeline:
      return "pp";
  }
  return "unknown";
}

// The style of a strategy a plan does not use.
struct none {};

// The model dimensions a style checks its degrees against when a model is built.
struct model_dimensions {
  std::int64_t d_model = 0;
  std::int64_t heads = 0;
  std::int64_t hidden = 0;  // of the feed-forward block
  std::int64_t vocab = 0;
  std::int64_t layers = 0;
  // Mixture of experts: experts per MoE layer and the experts each token goes to (0: the model has
  // no MoE layer, which a plan with ep<...> refuses rather than train dense layers only).
  std::int64_t experts = 0;
  std::int64_t top_k = 0;
};

// Specialised beside each style; a type without traits is not a style.
template <class Style>
struct strategy_traits;

// What a style's traits inherit unless they say otherwise.
struct style_traits_defaults {
  static constexpr bool implemented = true;
  static constexpr mesh_axis_set batch_split_axes{};
  static constexpr mesh_axis_set staged_axes{};
  static constexpr mesh_axis_set partial_gradient_axes(const placement&) { return {}; }
  static void check(const mesh_degrees&, const model_dimensions&) {}
  template <class... Policies>
  struct check_composition {};
};

// parallel_style<S>: S has complete strategy traits.
template <class Style>
concept parallel_style = requires(const placement& where, const mesh_degrees& degrees,
                                  const model_dimensions& model) {
  { strategy_traits<Style>::kind } -> std::convertible_to<strategy>;
  { strategy_traits<Style>::name } -> std::convertible_to<std::string_view>;
  { strategy_traits<Style>::implemented } -> std::convertible_to<bool>;
  { strategy_traits<Style>::axes } -> std::convertible_to<mesh_axis_set>;
  { strategy_traits<Style>::batch_split_axes } -> std::convertible_to<mesh_axis_set>;
  { strategy_traits<Style>::staged_axes } -> std::convertible_to<mesh_axis_set>;
  { strategy_traits<Style>::partial_gradient_axes(where) } -> std::same_as<mesh_axis_set>;
  strategy_traits<Style>::check(degrees, model);
};

// How reports and messages name a style: its traits' name, and its template arguments where the
// traits give them (parameters(): "<1>" for zero<1>), so dp<zero<1>> and dp<zero<3>> differ.
template <class Style>
std::string style_name() {
  std::string out(strategy_traits<Style>::name);
  if constexpr (requires { strategy_traits<Style>::parameters(); })
    out += strategy_traits<Style>::parameters();
  return out;
}

// Whether Style is a style of strategy S (false for a type that is no style at all).
template <strategy S, class Style>
inline constexpr bool is_style_of = [] {
  if constexpr (parallel_style<Style>) {
    return strategy_traits<Style>::kind == S;
  } else {
    return false;
  }
}();

}  // namespace quintet::parallel
