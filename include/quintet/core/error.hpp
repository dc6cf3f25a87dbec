// quintet::error and the QUINTET_CHECK macro: every bad input becomes an exception whose message
// names the values involved and the place in the library that rejected them.
#pragma once

#include <quintet/core/format.hpp>

#include <stdexcept>
#include <string>
#include <string_view>

namespace quintet {

// The one exception type the library throws for bad input and failed resources. Subsystems derive
// from it (communicators throw quintet::comm_error) so callers can catch broadly or narrowly.
class error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {

// Trims a __FILE__ path to the part that starts at "quintet/" so messages stay short and stable
// whatever directory the library was installed in.
constexpr std::string_view short_source_path(std::string_view path) {
  const auto at = path.rfind("quintet/");
  return at == std::string_view::npos ? path : path.substr(at);
}

// `condition` is the source text of the failed check, or empty for QUINTET_FAIL.
[[noreturn]] inline void throw_check_failure(std::string_view file, int line,
                                             std::string_view condition,
                                             const std::string& message) {
  std::string text = "quintet: " + message + " [";
  if (!condition.empty()) text += "check `" + std::string(condition) + "` failed ";
  text += "at " + std::string(short_source_path(file)) + ":" + std::to_string(line) + "]";
  throw error(text);
}

}  // namespace detail
}  // namespace quintet

// QUINTET_CHECK(condition, fmt-format, args...): throws quintet::error when `condition` is false.
// The message is formatted only on failure, so checks are cheap on the hot path.
#define QUINTET_CHECK(condition, ...)                                                     \
  do {                                                                                    \
    if (!(condition)) [[unlikely]] {                                                      \
      ::quintet::detail::throw_check_failure(__FILE__, __LINE__, #condition,              \
                                             ::quintet::detail::format_message(__VA_ARGS__));                 \
    }                                                                                     \
  } while (false)

// QUINTET_FAIL(fmt-format, args...): unconditional failure, for branches that must not be taken.
#define QUINTET_FAIL(...)                                                                 \
  ::quintet::detail::throw_check_failure(__FILE__, __LINE__, "",                          \
                                         ::quintet::detail::format_message(__VA_ARGS__))
