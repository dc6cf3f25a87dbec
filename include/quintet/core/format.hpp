// Message formatting for checks. Host code uses fmt, with format strings checked at compile time.
// nvcc's front end does not take fmt 9's consteval format strings, so CUDA translation units use
// a small substitute that replaces each "{}" with the next argument as an ostream prints it.
#pragma once

#include <string>
#include <string_view>
#include <utility>

#if defined(__CUDACC__)
#include <sstream>
#else
#include <fmt/format.h>
#endif

namespace quintet::detail {

#if defined(__CUDACC__)
template <class Value>
void append_formatted(std::ostringstream& out, const Value& value) {
  if constexpr (requires { value.to_string(); }) {
    out << value.to_string();
  } else {
    out << value;
  }
}

template <class... Args>
std::string format_message(std::string_view format, const Args&... args) {
  std::ostringstream out;
  [[maybe_unused]] auto emit = [&](const auto& value) {
    const auto at = format.find("{}");
    if (at == std::string_view::npos) return;
    out << format.substr(0, at);
    append_formatted(out, value);
    format.remove_prefix(at + 2);
  };
  (emit(args), ...);
  out << format;
  return out.str();
}
#else
template <class... Args>
std::string format_message(fmt::format_string<Args...> format, Args&&... args) {
  return fmt::format(format, std::forward<Args>(args)...);
}
#endif

}  // namespace quintet::detail
