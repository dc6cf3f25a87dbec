// pipeline_schedule: what parallel::pp<...> accepts — an open set. Any type whose strategy
// traits say it is a pipeline schedule qualifies, so users bring their own by specialising
// strategy_traits for it; the schedules-as-data issue adds what a schedule generates (one action
// list per rank) to this concept. The built-in schedules are named here; none runs yet, so a plan
// naming one does not compile (issue: pipeline parallelism that runs).
#pragma once

#include <quintet/mesh/mesh_axis.hpp>
#include <quintet/parallel/strategy.hpp>

#include <string_view>

namespace quintet::parallel {

template <class Schedule>
concept pipeline_schedule =
    parallel_style<Schedule> && strategy_traits<Schedule>::kind == strategy::pipeline;

// What every pipeline schedule's traits share: stages on the pp axis.
struct pipeline_traits_defaults : style_traits_defaults {
  static constexpr strategy kind = strategy::pipeline;
  static constexpr mesh_axis_set axes{mesh_axis::pp};
};

struct gpipe {};
struct one_f_one_b {};
template <int VirtualStages>
struct interleaved {
  static_assert(VirtualStages >= 2, "parallel::interleaved<V>: V (chunks per device) must be >= 2");
  static constexpr int virtual_stages = VirtualStages;
};
struct zero_bubble {};

template <>
struct strategy_traits<gpipe> : pipeline_traits_defaults {
  static constexpr std::string_view name = "gpipe";
  static constexpr bool implemented = false;
};
template <>
struct strategy_traits<one_f_one_b> : pipeline_traits_defaults {
  static constexpr std::string_view name = "one_f_one_b";
  static constexpr bool implemented = false;
};
template <int V>
struct strategy_traits<interleaved<V>> : pipeline_traits_defaults {
  static constexpr std::string_view name = "interleaved";
  static constexpr bool implemented = false;
};
template <>
struct strategy_traits<zero_bubble> : pipeline_traits_defaults {
  static constexpr std::string_view name = "zero_bubble";
  static constexpr bool implemented = false;
};

}  // namespace quintet::parallel
