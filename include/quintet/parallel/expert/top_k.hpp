// top_k<K>: expert parallelism with a softmax router that keeps the top K experts per token, the
// style of parallel::ep<...>. Not implemented yet: a plan naming it does not compile (issue:
// expert parallelism). Experts will be split over the ep groups that subdivide dp.
//
//   ep = 2, 4 experts:   rank 0 holds experts 0, 1; rank 1 holds experts 2, 3
//   tokens routed to their top K experts, exchanged with all_to_all_v inside the ep group
#pragma once

#include <quintet/mesh/mesh_axis.hpp>
#include <quintet/parallel/strategy.hpp>

#include <fmt/format.h>

#include <string>
#include <string_view>

namespace quintet::parallel {

template <int K>
struct top_k {
  static_assert(K >= 1, "parallel::top_k<K>: K must be at least 1");
  static constexpr int k = K;
};

template <int K>
struct strategy_traits<top_k<K>> : style_traits_defaults {
  static constexpr strategy kind = strategy::expert;
  static constexpr std::string_view name = "top_k";
  static constexpr bool implemented = false;
  static std::string parameters() { return fmt::format("<{}>", K); }
  static constexpr mesh_axis_set axes{mesh_axis::ep};
};

}  // namespace quintet::parallel
