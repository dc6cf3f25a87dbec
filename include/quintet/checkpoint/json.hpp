// json_value, parse_json and dump_json: the JSON that checkpoints read and write (safetensors
// headers, the checkpoint index, training state). The parser is strict (RFC 8259: no comments,
// no trailing commas, no leading zeros, no NaN), validates UTF-8, rejects duplicate object keys
// (a safetensors header with two tensors of one name is an error, not a silent overwrite), keeps
// integers exact in 64 bits (rejecting overflow rather than rounding through double), and bounds
// nesting depth and input size. Every error names the document and the byte offset.
//
//   json_value v = parse_json(R"({"step": 100, "seeds": [1, 2]})", "index.json");
//   v.find("step")->as_u64() == 100;  dump_json(v) == R"({"step":100,"seeds":[1,2]})"
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/core/utf8.hpp>

#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <unordered_set>
#include <utility>
#include <variant>
#include <vector>

namespace quintet::checkpoint {

class json_value;
using json_array = std::vector<json_value>;
// Members in document order; keys are unique (the parser enforces it, builders should too).
using json_object = std::vector<std::pair<std::string, json_value>>;

class json_value {
 public:
  enum class kind : std::uint8_t { null, boolean, integer, number, string, array, object };

  json_value() = default;  // null
  json_value(std::nullptr_t) {}
  json_value(bool b) : value_(b) {}
  template <std::integral I>
  requires(!std::same_as<I, bool>) json_value(I n) {
    if constexpr (std::is_signed_v<I>) {
      const auto wide = static_cast<std::int64_t>(n);
      value_ = integer{
          wide < 0 ? ~static_cast<std::uint64_t>(wide) + 1 : static_cast<std::uint64_t>(wide),
          wide < 0};
    } else {
      value_ = integer{static_cast<std::uint64_t>(n), false};
    }
  }
  json_value(double x) : value_(x) {}
  json_value(std::string s) : value_(std::move(s)) {}
  json_value(std::string_view s) : value_(std::string(s)) {}
  json_value(const char* s) : value_(std::string(s)) {}
  json_value(json_array a) : value_(std::move(a)) {}
  json_value(json_object o) : value_(std::move(o)) {}

  // A negative integer given by its magnitude (what the parser reads); 0 is never negative.
  static json_value negative_integer(std::uint64_t magnitude) {
    json_value v;
    v.value_ = integer{magnitude, magnitude != 0};
    return v;
  }

  kind type() const { return static_cast<kind>(value_.index()); }
  bool is_null() const { return type() == kind::null; }
  bool is_bool() const { return type() == kind::boolean; }
  bool is_integer() const { return type() == kind::integer; }
  // integer or number
  bool is_numeric() const { return type() == kind::integer || type() == kind::number; }
  bool is_string() const { return type() == kind::string; }
  bool is_array() const { return type() == kind::array; }
  bool is_object() const { return type() == kind::object; }
  // A non-negative integer (what sizes, offsets and steps are).
  bool is_u64() const { return is_integer() && !std::get<integer>(value_).negative; }

  bool as_bool() const { return get<bool>("a boolean"); }
  std::uint64_t as_u64() const {
    const integer& n = get<integer>("an integer");
    QUINTET_CHECK(!n.negative, "json: -{} is not a non-negative integer", n.magnitude);
    return n.magnitude;
  }
  std::int64_t as_i64() const {
    const integer& n = get<integer>("an integer");
    constexpr std::uint64_t max = std::numeric_limits<std::int64_t>::max();
    QUINTET_CHECK(n.magnitude <= max + (n.negative ? 1 : 0), "json: {}{} does not fit in int64",
                  n.negative ? "-" : "", n.magnitude);
    return n.negative ? static_cast<std::int64_t>(~n.magnitude + 1)
                      : static_cast<std::int64_t>(n.magnitude);
  }
  // Integers convert (rounding beyond 2^53).
  double as_double() const {
    if (const integer* n = std::get_if<integer>(&value_)) {
      const double magnitude = static_cast<double>(n->magnitude);
      return n->negative ? -magnitude : magnitude;
    }
    return get<double>("a number");
  }
  const std::string& as_string() const { return get<std::string>("a string"); }
  const json_array& as_array() const { return get<json_array>("an array"); }
  const json_object& as_object() const { return get<json_object>("an object"); }
  json_array& as_array() { return const_cast<json_array&>(std::as_const(*this).as_array()); }
  json_object& as_object() { return const_cast<json_object&>(std::as_const(*this).as_object()); }

  // The member named `key` of an object, or nullptr (also when this is not an object).
  const json_value* find(std::string_view key) const {
    if (!is_object()) return nullptr;
    for (const auto& [name, value] : std::get<json_object>(value_))
      if (name == key) return &value;
    return nullptr;
  }

  friend bool operator==(const json_value& a, const json_value& b) = default;

 private:
  struct integer {
    std::uint64_t magnitude = 0;
    bool negative = false;
    friend bool operator==(const integer&, const integer&) = default;
  };

  template <class T>
  const T& get(std::string_view expected) const {
    const T* value = std::get_if<T>(&value_);
    QUINTET_CHECK(value != nullptr, "json: expected {}, found {}", expected, kind_name(type()));
    return *value;
  }

 public:
  static constexpr std::string_view kind_name(kind k) {
    switch (k) {
      case kind::null:
        return "null";
      case kind::boolean:
        return "a boolean";
      case kind::integer:
        return "an integer";
      case kind::number:
        return "a number";
      case kind::string:
        return "a string";
      case kind::array:
        return "an array";
      case kind::object:
        return "an object";
    }
    return "?";
  }

 private:
  // The order of the alternatives is the order of `kind`.
  std::variant<std::nullptr_t, bool, integer, double, std::string, json_array, json_object> value_{
      nullptr};
};

struct json_limits {
  std::size_t max_bytes = std::size_t{100} << 20;  // 100 MiB: the safetensors header limit
  int max_depth = 64;                              // nested arrays and objects
};

namespace detail {

class json_parser {
 public:
  json_parser(std::string_view text, std::string_view document, json_limits limits)
      : text_(text), document_(document), limits_(limits) {}

  json_value parse() {
    if (text_.size() > limits_.max_bytes)
      fail(0, fmt::format("the document is {} bytes, above the limit of {}", text_.size(),
                          limits_.max_bytes));
    skip_space();
    json_value value = parse_value(0);
    skip_space();
    if (at_ < text_.size()) fail(at_, "unexpected characters after the JSON value");
    return value;
  }

 private:
  [[noreturn]] void fail(std::size_t at, const std::string& what) const {
    QUINTET_FAIL("{}: invalid JSON at byte {}: {}", document_, at, what);
  }

  void skip_space() {
    while (at_ < text_.size() &&
           (text_[at_] == ' ' || text_[at_] == '\t' || text_[at_] == '\n' || text_[at_] == '\r'))
      ++at_;
  }

  char peek() const { return at_ < text_.size() ? text_[at_] : '\0'; }

  void expect_literal(std::string_view word) {
    if (text_.substr(at_, word.size()) != word) fail(at_, fmt::format("expected '{}'", word));
    at_ += word.size();
  }

  json_value parse_value(int depth) {
    if (at_ >= text_.size()) fail(at_, "unexpected end of the document, expected a value");
    switch (text_[at_]) {
      case '{':
        return parse_object(depth + 1);
      case '[':
        return parse_array(depth + 1);
      case '"':
        return json_value(parse_string());
      case 't':
        expect_literal("true");
        return json_value(true);
      case 'f':
        expect_literal("false");
        return json_value(false);
      case 'n':
        expect_literal("null");
        return json_value(nullptr);
      default:
        if (text_[at_] == '-' || (text_[at_] >= '0' && text_[at_] <= '9')) return parse_number();
        fail(at_, fmt::format("unexpected character {}", describe(text_[at_])));
    }
  }

  static std::string describe(char c) {
    const auto byte = static_cast<unsigned char>(c);
    return byte >= 0x20 && byte < 0x7f ? fmt::format("'{}'", c) : fmt::format("0x{:02x}", byte);
  }

  void check_depth(int depth) const {
    if (depth > limits_.max_depth)
      fail(at_, fmt::format("nesting deeper than the limit of {}", limits_.max_depth));
  }

  json_value parse_object(int depth) {
    check_depth(depth);
    ++at_;  // '{'
    json_object members;
    std::unordered_set<std::string> keys;
    skip_space();
    if (peek() == '}') {
      ++at_;
      return json_value(std::move(members));
    }
    for (;;) {
      skip_space();
      if (peek() != '"') fail(at_, "expected a string key");
      const std::size_t key_at = at_;
      std::string key = parse_string();
      if (!keys.insert(key).second) fail(key_at, fmt::format("duplicate key \"{}\"", key));
      skip_space();
      if (peek() != ':') fail(at_, "expected ':' after a key");
      ++at_;
      skip_space();
      json_value value = parse_value(depth);
      members.emplace_back(std::move(key), std::move(value));
      skip_space();
      if (peek() == ',') {
        ++at_;
        continue;
      }
      if (peek() == '}') {
        ++at_;
        return json_value(std::move(members));
      }
      fail(at_, "expected ',' or '}' in an object");
    }
  }

  json_value parse_array(int depth) {
    check_depth(depth);
    ++at_;  // '['
    json_array items;
    skip_space();
    if (peek() == ']') {
      ++at_;
      return json_value(std::move(items));
    }
    for (;;) {
      skip_space();
      items.push_back(parse_value(depth));
      skip_space();
      if (peek() == ',') {
        ++at_;
        continue;
      }
      if (peek() == ']') {
        ++at_;
        return json_value(std::move(items));
      }
      fail(at_, "expected ',' or ']' in an array");
    }
  }

  unsigned hex4() {
    if (text_.size() - at_ < 4) fail(at_, "\\u needs four hexadecimal digits");
    unsigned value = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = text_[at_];
      unsigned digit = 0;
      if (c >= '0' && c <= '9') {
        digit = static_cast<unsigned>(c - '0');
      } else if (c >= 'a' && c <= 'f') {
        digit = static_cast<unsigned>(c - 'a' + 10);
      } else if (c >= 'A' && c <= 'F') {
        digit = static_cast<unsigned>(c - 'A' + 10);
      } else {
        fail(at_, "\\u needs four hexadecimal digits");
      }
      value = value * 16 + digit;
      ++at_;
    }
    return value;
  }

  static void append_utf8(std::string& out, unsigned code) {
    if (code < 0x80) {
      out += static_cast<char>(code);
    } else if (code < 0x800) {
      out += static_cast<char>(0xc0 | (code >> 6));
      out += static_cast<char>(0x80 | (code & 0x3f));
    } else if (code < 0x10000) {
      out += static_cast<char>(0xe0 | (code >> 12));
      out += static_cast<char>(0x80 | ((code >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (code & 0x3f));
    } else {
      out += static_cast<char>(0xf0 | (code >> 18));
      out += static_cast<char>(0x80 | ((code >> 12) & 0x3f));
      out += static_cast<char>(0x80 | ((code >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (code & 0x3f));
    }
  }

  std::string parse_string() {
    const std::size_t opening = at_;
    ++at_;  // '"'
    std::string out;
    for (;;) {
      if (at_ >= text_.size()) fail(opening, "unterminated string");
      const char c = text_[at_];
      const auto byte = static_cast<unsigned char>(c);
      if (c == '"') {
        ++at_;
        return out;
      }
      if (byte < 0x20) fail(at_, fmt::format("control character 0x{:02x} in a string", byte));
      if (byte >= 0x80) {
        const std::size_t length = utf8_sequence_length(text_, at_);
        if (length == 0) fail(at_, "invalid UTF-8 in a string");
        out.append(text_.substr(at_, length));
        at_ += length;
        continue;
      }
      if (c != '\\') {
        out += c;
        ++at_;
        continue;
      }
      const std::size_t escape_at = at_;
      ++at_;
      if (at_ >= text_.size()) fail(opening, "unterminated string");
      const char e = text_[at_++];
      switch (e) {
        case '"':
          out += '"';
          break;
        case '\\':
          out += '\\';
          break;
        case '/':
          out += '/';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          unsigned code = hex4();
          if (code >= 0xdc00 && code <= 0xdfff)
            fail(escape_at, "\\u escape is a lone low surrogate");
          if (code >= 0xd800 && code <= 0xdbff) {
            if (text_.substr(at_, 2) != "\\u")
              fail(escape_at, "\\u escape is a high surrogate without its low surrogate");
            at_ += 2;
            const unsigned low = hex4();
            if (low < 0xdc00 || low > 0xdfff)
              fail(escape_at, "\\u escape is a high surrogate without its low surrogate");
            code = 0x10000 + ((code - 0xd800) << 10) + (low - 0xdc00);
          }
          append_utf8(out, code);
          break;
        }
        default:
          fail(escape_at, fmt::format("invalid escape \\{}", describe(e)));
      }
    }
  }

  json_value parse_number() {
    const std::size_t start = at_;
    const bool negative = peek() == '-';
    if (negative) ++at_;
    const auto digits = [&] {
      const std::size_t from = at_;
      while (at_ < text_.size() && text_[at_] >= '0' && text_[at_] <= '9') ++at_;
      return at_ - from;
    };
    const std::size_t int_begin = at_;
    const std::size_t int_digits = digits();
    if (int_digits == 0) fail(at_, "expected a digit");
    if (int_digits > 1 && text_[int_begin] == '0') fail(int_begin, "leading zero in a number");
    bool integral = true;
    if (peek() == '.') {
      ++at_;
      if (digits() == 0) fail(at_, "expected a digit after '.'");
      integral = false;
    }
    if (peek() == 'e' || peek() == 'E') {
      ++at_;
      if (peek() == '+' || peek() == '-') ++at_;
      if (digits() == 0) fail(at_, "expected a digit in the exponent");
      integral = false;
    }
    const std::string_view literal = text_.substr(start, at_ - start);
    if (integral) {
      std::uint64_t magnitude = 0;
      const auto [end, ec] =
          std::from_chars(text_.data() + int_begin, text_.data() + at_, magnitude);
      constexpr std::uint64_t min_magnitude =
          static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) + 1;
      if (ec == std::errc::result_out_of_range || (negative && magnitude > min_magnitude))
        fail(start, fmt::format("integer {} does not fit in 64 bits", literal));
      return negative ? json_value::negative_integer(magnitude) : json_value(magnitude);
    }
    double value = 0;
    const auto [end, ec] = std::from_chars(literal.data(), literal.data() + literal.size(), value);
    if (ec != std::errc{})
      fail(start, fmt::format("number {} is out of the range of a double", literal));
    return json_value(value);
  }

  std::string_view text_;
  std::string_view document_;
  json_limits limits_;
  std::size_t at_ = 0;
};

inline void dump_string(std::string& out, std::string_view s) {
  if (const auto bad = first_invalid_utf8(s))
    QUINTET_FAIL("json: string has invalid UTF-8 at byte {}", *bad);
  out += '"';
  for (const char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

inline void dump_value(std::string& out, const json_value& v, int indent, int level) {
  const auto newline = [&](int at_level) {
    if (indent < 0) return;
    out += '\n';
    out.append(static_cast<std::size_t>(indent * at_level), ' ');
  };
  switch (v.type()) {
    case json_value::kind::null:
      out += "null";
      break;
    case json_value::kind::boolean:
      out += v.as_bool() ? "true" : "false";
      break;
    case json_value::kind::integer:
      out += v.is_u64() ? std::to_string(v.as_u64()) : std::to_string(v.as_i64());
      break;
    case json_value::kind::number: {
      const double x = v.as_double();
      QUINTET_CHECK(std::isfinite(x), "json: {} has no JSON form", x);
      // The shortest text that reads back as the same double, kept a number (not an integer)
      // when it would have neither a fraction nor an exponent.
      const std::string text = fmt::format("{}", x);
      out += text;
      if (text.find_first_of(".e") == std::string::npos) out += ".0";
      break;
    }
    case json_value::kind::string:
      dump_string(out, v.as_string());
      break;
    case json_value::kind::array: {
      const json_array& items = v.as_array();
      out += '[';
      for (std::size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out += ',';
        dump_value(out, items[i], -1, 0);  // arrays stay on one line: shapes, offsets
      }
      out += ']';
      break;
    }
    case json_value::kind::object: {
      const json_object& members = v.as_object();
      out += '{';
      for (std::size_t i = 0; i < members.size(); ++i) {
        if (i > 0) out += ',';
        newline(level + 1);
        dump_string(out, members[i].first);
        out += indent < 0 ? ":" : ": ";
        dump_value(out, members[i].second, indent, level + 1);
      }
      if (!members.empty()) newline(level);
      out += '}';
      break;
    }
  }
}

}  // namespace detail

// Parses one JSON document. `document` names it in errors ("index.json", "header of
// x.safetensors").
inline json_value parse_json(std::string_view text, std::string_view document,
                             json_limits limits = {}) {
  return detail::json_parser(text, document, limits).parse();
}

// The JSON text of `v`: compact when `indent` < 0, else objects one member per line indented by
// `indent` spaces (arrays stay on one line). Strings must be valid UTF-8 and numbers finite.
inline std::string dump_json(const json_value& v, int indent = -1) {
  std::string out;
  detail::dump_value(out, v, indent, 0);
  return out;
}

}  // namespace quintet::checkpoint
