// The five strategy policies a plan is made of, named after the mesh axis each runs on, and the
// built-in styles each accepts. A policy is a type: parallel::tp<megatron_1d> selects which code is
// compiled; how many ranks share the work (the degree) is a runtime value of the device mesh.
//
//   dp<zero<S>>        data parallelism, ZeRO stage S (0, 1, 2)    parallel/data/zero.hpp
//   tp<megatron_1d>    tensor parallelism                          parallel/tensor/megatron_1d.hpp
//   sp<megatron_sp>    sequence parallelism on the tp group parallel/sequence/megatron_sp.hpp
//   sp<ulysses>        all-to-all over heads on the sp axis        parallel/sequence/ulysses.hpp
//   sp<ring>           ring attention on the sp axis               parallel/sequence/ring.hpp
//   ep<top_k<K>>       expert parallelism (needs dp<...>): MoE     parallel/expert/top_k.hpp
//                      layers' experts split over ep (nn::moe)
//   pp<Schedule>       any pipeline_schedule: gpipe, one_f_one_b,  parallel/pipeline/ (generated,
//                      interleaved<V>, zb_h1, zb_h2, zb_v,         verified, simulated; not run
//                      bpipe<Base>, or the user's own              yet)
// A style is any type with strategy_traits (parallel/strategy.hpp) of the policy's strategy, so
// the set is open: a new style is one header beside its strategy's others.
#pragma once

#include <quintet/parallel/data/zero.hpp>
#include <quintet/parallel/expert/top_k.hpp>
#include <quintet/parallel/pipeline/pipeline_schedule.hpp>
#include <quintet/parallel/sequence/megatron_sp.hpp>
#include <quintet/parallel/sequence/ring.hpp>
#include <quintet/parallel/sequence/ulysses.hpp>
#include <quintet/parallel/strategy.hpp>
#include <quintet/parallel/tensor/megatron_1d.hpp>

#include <concepts>

namespace quintet::parallel {

template <strategy S, class Style>
struct strategy_policy {
  // Completing the style runs its own checks (zero<4> is rejected here, not silently accepted).
  static_assert(sizeof(Style) > 0);
  static constexpr strategy kind = S;
  using style = Style;
  using traits = strategy_traits<Style>;
};

template <class Style>
struct dp : strategy_policy<strategy::data, Style> {
  static_assert(is_style_of<strategy::data, Style>,
                "parallel::dp<Style>: Style must be a data-parallel style: zero<0..3>");
};

template <class Style>
struct tp : strategy_policy<strategy::tensor, Style> {
  static_assert(is_style_of<strategy::tensor, Style>,
                "parallel::tp<Style>: Style must be a tensor-parallel style: megatron_1d");
};

template <class Style>
struct sp : strategy_policy<strategy::sequence, Style> {
  static_assert(is_style_of<strategy::sequence, Style>,
                "parallel::sp<Style>: Style must be a sequence-parallel style: megatron_sp, "
                "ulysses or ring");
};

template <class Style>
struct ep : strategy_policy<strategy::expert, Style> {
  static_assert(is_style_of<strategy::expert, Style>,
                "parallel::ep<Style>: Style must be an expert-parallel style: top_k<K>");
};

template <class Schedule>
struct pp : strategy_policy<strategy::pipeline, Schedule> {
  static_assert(pipeline_schedule<Schedule>,
                "parallel::pp<Schedule>: Schedule must satisfy parallel::pipeline_schedule (a type "
                "whose strategy_traits say kind = strategy::pipeline, with a static "
                "generate(pipeline::schedule_shape) returning a pipeline::schedule)");
};

// strategy_policy_type: one of the five policies above (with any valid style).
template <class Policy>
concept strategy_policy_type = requires {
  { Policy::kind } -> std::convertible_to<strategy>;
  typename Policy::style;
}
&&std::derived_from<Policy, strategy_policy<Policy::kind, typename Policy::style>>;

}  // namespace quintet::parallel
