// plan<Policies...>: a parallel plan as a type. Policies come in any order; a strategy left out is
// not parallel (degree 1, its code compiled away). Layers ask the plan which style, if any, each
// strategy uses:
//
//   using my_plan = quintet::plan<parallel::tensor<parallel::megatron_1d>,
//                                 parallel::data<parallel::zero<1>>>;
//   my_plan::has<strategy::tensor>                      -> true
//   my_plan::style<strategy::sequence>                  -> parallel::none
// and the queries layers make of a plan (uses_tensor_parallel<Plan>, shards_sequence_on_tp<Plan>).
#pragma once

#include <quintet/parallel/policies.hpp>

#include <type_traits>

namespace quintet {

namespace parallel {

// The style of a strategy the plan does not use.
struct none {};

namespace detail {

// Instantiated once per policy, so a compiler error shows the offending type beside the message.
template <class Policy>
struct checked_policy {
  static_assert(strategy_policy_type<Policy>,
                "quintet::plan: every argument must be a strategy policy: parallel::data<...>, "
                "parallel::tensor<...>, parallel::sequence<...>, parallel::expert<...> or "
                "parallel::pipeline<...>");
  static constexpr bool ok = true;
};

template <strategy S, class... Policies>
inline constexpr int count_of = (0 + ... + (Policies::kind == S ? 1 : 0));

template <strategy S, class... Policies>
struct find_style {
  using type = none;
};
template <strategy S, class First, class... Rest>
struct find_style<S, First, Rest...> {
  using type = std::conditional_t<First::kind == S, typename First::style,
                                  typename find_style<S, Rest...>::type>;
};

}  // namespace detail
}  // namespace parallel

template <class... Policies>
struct plan {
  static_assert((parallel::detail::checked_policy<Policies>::ok && ...));
  static_assert(parallel::detail::count_of<parallel::strategy::data, Policies...> <= 1,
                "quintet::plan: duplicate policy: two parallel::data<...>");
  static_assert(parallel::detail::count_of<parallel::strategy::tensor, Policies...> <= 1,
                "quintet::plan: duplicate policy: two parallel::tensor<...>");
  static_assert(parallel::detail::count_of<parallel::strategy::sequence, Policies...> <= 1,
                "quintet::plan: duplicate policy: two parallel::sequence<...>");
  static_assert(parallel::detail::count_of<parallel::strategy::expert, Policies...> <= 1,
                "quintet::plan: duplicate policy: two parallel::expert<...>");
  static_assert(parallel::detail::count_of<parallel::strategy::pipeline, Policies...> <= 1,
                "quintet::plan: duplicate policy: two parallel::pipeline<...>");

  // The style the plan gives strategy S, or parallel::none.
  template <parallel::strategy S>
  using style = typename parallel::detail::find_style<S, Policies...>::type;

  template <parallel::strategy S>
  static constexpr bool has = !std::is_same_v<style<S>, parallel::none>;

  static_assert(!std::is_same_v<style<parallel::strategy::sequence>, parallel::megatron_sp> ||
                    has<parallel::strategy::tensor>,
                "quintet::plan: sequence<megatron_sp> shards activations on the tensor-parallel "
                "group, so the plan also needs parallel::tensor<...>");
};

// The plan of the serial model: no strategy is parallel.
using serial_plan = plan<>;

namespace parallel {

// What layers ask of a plan.
template <class Plan>
inline constexpr bool uses_tensor_parallel = Plan::template has<strategy::tensor>;

template <class Plan>
using sequence_style_of = typename Plan::template style<strategy::sequence>;

// megatron_sp: the sequence is sharded on the tp group, between the tensor-parallel linears.
template <class Plan>
inline constexpr bool shards_sequence_on_tp = std::is_same_v<sequence_style_of<Plan>, megatron_sp>;

// ulysses, ring: the sequence is sharded on the sp axis, everywhere.
template <class Plan>
inline constexpr bool shards_sequence_on_sp = std::is_same_v<sequence_style_of<Plan>, ulysses> ||
                                              std::is_same_v<sequence_style_of<Plan>, ring>;

}  // namespace parallel

}  // namespace quintet
