// recompute_mode: what a transformer block keeps from its forward for its backward, and what it
// recomputes in backward instead (Korthikanti et al. 2022, "Reducing Activation Recomputation").
//
//   none        every sublayer keeps what its backward needs (the default)
//   selective   the attention core's output and log-sum-exp are not kept; backward recomputes the
//               core from the kept q, k, v
//   full        only the block's input is kept; backward reruns the block's forward first
//
// Gradients are the same bits in every mode: the recomputation runs the same kernels, and the
// same collectives in the same order, on the same inputs (docs/nn.md, "Activation recomputation").
#pragma once

#include <quintet/core/error.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace quintet::nn {

enum class recompute_mode : std::uint8_t { none, selective, full };

namespace detail {
inline constexpr std::array<std::string_view, 3> recompute_mode_names{"none", "selective", "full"};
}  // namespace detail

// "none", "selective" or "full": what parse_recompute_mode reads back.
constexpr std::string_view name_of(recompute_mode mode) {
  return detail::recompute_mode_names[static_cast<std::size_t>(mode)];
}

// The mode a name denotes, or nullopt for any other text (names are lower case, as printed).
constexpr std::optional<recompute_mode> try_parse_recompute_mode(std::string_view name) {
  for (std::size_t i = 0; i < detail::recompute_mode_names.size(); ++i)
    if (detail::recompute_mode_names[i] == name) return static_cast<recompute_mode>(i);
  return std::nullopt;
}

// The same for a command line: any other text is an error that names it and the choices.
inline recompute_mode parse_recompute_mode(std::string_view name) {
  const std::optional<recompute_mode> mode = try_parse_recompute_mode(name);
  QUINTET_CHECK(mode.has_value(), "recompute mode '{}': expected none, selective or full", name);
  return *mode;
}

}  // namespace quintet::nn
