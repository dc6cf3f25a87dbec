// json_writer: a small streaming JSON writer for run reports (configuration, per-step losses).
// Numbers are written with 17 significant digits so a report reproduces doubles exactly.
#pragma once

#include <quintet/core/error.hpp>

#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace quintet::train {

class json_writer {
 public:
  json_writer& begin_object() { return open('{'); }
  json_writer& end_object() { return close('}'); }
  json_writer& begin_array() { return open('['); }
  json_writer& end_array() { return close(']'); }

  // The key of the next member of the enclosing object.
  json_writer& key(std::string_view name) {
    QUINTET_CHECK(!stack_.empty() && stack_.back().bracket == '{' && !stack_.back().expecting_value,
                  "json_writer: key '{}' outside an object or after another key", name);
    separate();
    write_string(name);
    text_ += ':';
    stack_.back().expecting_value = true;
    return *this;
  }

  json_writer& value(std::string_view s) {
    before_value();
    write_string(s);
    return *this;
  }
  json_writer& value(const char* s) { return value(std::string_view(s)); }
  json_writer& value(bool b) {
    before_value();
    text_ += b ? "true" : "false";
    return *this;
  }
  json_writer& value(std::int64_t n) {
    before_value();
    text_ += std::to_string(n);
    return *this;
  }
  json_writer& value(int n) { return value(static_cast<std::int64_t>(n)); }
  // Non-finite numbers have no JSON form: they are written as null.
  json_writer& value(double x) {
    before_value();
    text_ += std::isfinite(x) ? fmt::format("{:.17g}", x) : "null";
    return *this;
  }
  json_writer& null() {
    before_value();
    text_ += "null";
    return *this;
  }

  template <class T>
  json_writer& member(std::string_view name, const T& v) {
    key(name);
    return value(v);
  }

  // The document; every object and array must be closed.
  const std::string& str() const {
    QUINTET_CHECK(stack_.empty(), "json_writer: {} object(s) or array(s) still open",
                  stack_.size());
    return text_;
  }

 private:
  struct level {
    char bracket;
    bool has_members = false;
    bool expecting_value = false;
  };

  json_writer& open(char bracket) {
    before_value();
    text_ += bracket;
    stack_.push_back({bracket});
    return *this;
  }
  json_writer& close(char bracket) {
    const char opening = bracket == '}' ? '{' : '[';
    QUINTET_CHECK(
        !stack_.empty() && stack_.back().bracket == opening && !stack_.back().expecting_value,
        "json_writer: '{}' does not close the open container", bracket);
    stack_.pop_back();
    text_ += bracket;
    return *this;
  }
  void separate() {
    if (stack_.back().has_members) text_ += ',';
    stack_.back().has_members = true;
  }
  void before_value() {
    if (stack_.empty()) {
      QUINTET_CHECK(text_.empty(), "json_writer: a document has one top-level value");
      return;
    }
    level& top = stack_.back();
    if (top.bracket == '{') {
      QUINTET_CHECK(top.expecting_value, "json_writer: a value inside an object needs a key");
      top.expecting_value = false;
    } else {
      separate();
    }
  }
  void write_string(std::string_view s) {
    text_ += '"';
    for (const char ch : s) {
      switch (ch) {
        case '"':
          text_ += "\\\"";
          break;
        case '\\':
          text_ += "\\\\";
          break;
        case '\n':
          text_ += "\\n";
          break;
        case '\t':
          text_ += "\\t";
          break;
        case '\r':
          text_ += "\\r";
          break;
        default:
          if (static_cast<unsigned char>(ch) < 0x20) {
            text_ += fmt::format("\\u{:04x}", static_cast<unsigned>(ch));
          } else {
            text_ += ch;
          }
      }
    }
    text_ += '"';
  }

  std::string text_;
  std::vector<level> stack_;
};

}  // namespace quintet::train
