// parse_json and dump_json: values, escapes, exact integers, round trips of random documents,
// and every malformed input the parser must reject with its position.
#include <catch2/catch.hpp>

#include <quintet/checkpoint/json.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>

using quintet::checkpoint::dump_json;
using quintet::checkpoint::json_array;
using quintet::checkpoint::json_limits;
using quintet::checkpoint::json_object;
using quintet::checkpoint::json_value;
using quintet::checkpoint::parse_json;

TEST_CASE("parse_json reads every kind of value", "[checkpoint][json]") {
  const json_value v = parse_json(
      R"( {"o": {"a": [1, -2, 3.5, -0.25e2, true, false, null]},
           "big": 18446744073709551615, "min": -9223372036854775808,
           "s": "q\"b\\s\/\b\f\n\r\t\u00e9\ud83d\ude00", "e": {}, "ea": []} )",
      "test");
  REQUIRE(v.is_object());
  const json_array& a = v.find("o")->find("a")->as_array();
  REQUIRE(a.size() == 7);
  CHECK(a[0].as_u64() == 1);
  CHECK(a[1].as_i64() == -2);
  CHECK_FALSE(a[1].is_u64());
  CHECK(a[2].as_double() == 3.5);
  CHECK(a[3].as_double() == -25.0);
  CHECK(a[4].as_bool());
  CHECK_FALSE(a[5].as_bool());
  CHECK(a[6].is_null());
  CHECK(v.find("big")->as_u64() == std::numeric_limits<std::uint64_t>::max());
  CHECK(v.find("min")->as_i64() == std::numeric_limits<std::int64_t>::min());
  CHECK(v.find("s")->as_string() == "q\"b\\s/\b\f\n\r\t\xc3\xa9\xf0\x9f\x98\x80");
  CHECK(v.find("e")->as_object().empty());
  CHECK(v.find("ea")->as_array().empty());
  CHECK(v.find("missing") == nullptr);
  REQUIRE_THROWS_WITH(v.find("big")->as_i64(), Catch::Contains("does not fit in int64"));
  REQUIRE_THROWS_WITH(v.find("s")->as_u64(), Catch::Contains("expected an integer"));
}

TEST_CASE("parse_json rejects malformed documents, naming the byte", "[checkpoint][json]") {
  struct bad {
    std::string text;
    std::string message;
  };
  const bad cases[] = {
      {"", "byte 0: unexpected end"},
      {"[1,]", "byte 3: unexpected character ']'"},
      {"[1 2]", "byte 3: expected ',' or ']'"},
      {"{\"a\" 1}", "byte 5: expected ':'"},
      {"{\"a\":1,}", "byte 7: expected a string key"},
      {"{a:1}", "byte 1: expected a string key"},
      {"01", "byte 0: leading zero"},
      {"1.", "byte 2: expected a digit after '.'"},
      {"1e", "byte 2: expected a digit in the exponent"},
      {"+1", "unexpected character '+'"},
      {"-", "byte 1: expected a digit"},
      {"NaN", "unexpected character 'N'"},
      {"tru", "expected 'true'"},
      {"{} x", "byte 3: unexpected characters after the JSON value"},
      {"// c\n1", "unexpected character '/'"},
      {"'a'", "unexpected character '''"},
      {"\"abc", "byte 0: unterminated string"},
      {"\"a\nb\"", "byte 2: control character 0x0a"},
      {"\"\\x\"", "byte 1: invalid escape \\'x'"},
      {"\"\\u12g4\"", "four hexadecimal digits"},
      {"\"\\udc00\"", "lone low surrogate"},
      {"\"\\ud800x\"", "without its low surrogate"},
      {"\"\\ud800\\u0041\"", "without its low surrogate"},
      {"\"\xff\"", "byte 1: invalid UTF-8"},
      {"\"\xc0\xaf\"", "invalid UTF-8"},      // overlong '/'
      {"\"\xed\xa0\x80\"", "invalid UTF-8"},  // an encoded surrogate
      {"\"\xe2\x82\"", "invalid UTF-8"},      // cut short
      {"18446744073709551616", "integer 18446744073709551616 does not fit in 64 bits"},
      {"-9223372036854775809", "does not fit in 64 bits"},
      {"1e400", "out of the range of a double"},
      {"{\"a\":1,\"b\":2,\"a\":3}", "byte 13: duplicate key \"a\""},
      {"\x01", "unexpected character 0x01"},
  };
  for (const bad& c : cases) {
    INFO("input: " << c.text);
    REQUIRE_THROWS_WITH(parse_json(c.text, "doc.json"),
                        Catch::Contains("doc.json: invalid JSON") && Catch::Contains(c.message));
  }
}

TEST_CASE("parse_json enforces its depth and size limits", "[checkpoint][json]") {
  const std::string deep_ok = std::string(64, '[') + std::string(64, ']');
  CHECK(parse_json(deep_ok, "d").is_array());
  const std::string too_deep = std::string(65, '[') + std::string(65, ']');
  REQUIRE_THROWS_WITH(parse_json(too_deep, "d"), Catch::Contains("byte 64: nesting deeper than "
                                                                 "the limit of 64"));
  REQUIRE_THROWS_WITH(parse_json("[1, 2, 3]", "d", json_limits{.max_bytes = 8}),
                      Catch::Contains("9 bytes, above the limit of 8"));
}

namespace {

std::string random_string(std::mt19937_64& rng) {
  // Code points from every UTF-8 length, control characters and the characters JSON escapes.
  const char32_t pool[] = {U'a',      U'"',      U'\\',         U'/',         U'\n',
                           U'\x01',   U'\x1f',   U'\x7f',       U'\u00e9',    U'\u07ff',
                           U'\u0800', U'\uffff', U'\U0001f600', U'\U0010ffff'};
  std::string s;
  const int length = static_cast<int>(rng() % 8);
  for (int i = 0; i < length; ++i) {
    const char32_t c = pool[rng() % std::size(pool)];
    if (c < 0x80) {
      s += static_cast<char>(c);
    } else if (c < 0x800) {
      s += static_cast<char>(0xc0 | (c >> 6));
      s += static_cast<char>(0x80 | (c & 0x3f));
    } else if (c < 0x10000) {
      s += static_cast<char>(0xe0 | (c >> 12));
      s += static_cast<char>(0x80 | ((c >> 6) & 0x3f));
      s += static_cast<char>(0x80 | (c & 0x3f));
    } else {
      s += static_cast<char>(0xf0 | (c >> 18));
      s += static_cast<char>(0x80 | ((c >> 12) & 0x3f));
      s += static_cast<char>(0x80 | ((c >> 6) & 0x3f));
      s += static_cast<char>(0x80 | (c & 0x3f));
    }
  }
  return s;
}

json_value random_value(std::mt19937_64& rng, int depth) {
  switch (rng() % (depth < 4 ? 8 : 6)) {
    case 0:
      return json_value(nullptr);
    case 1:
      return json_value(rng() % 2 == 0);
    case 2:
      return json_value(static_cast<std::uint64_t>(rng()));
    case 3:
      return json_value(static_cast<std::int64_t>(rng()) |
                        std::numeric_limits<std::int64_t>::min());
    case 4: {
      std::uniform_real_distribution<double> exponent(-300, 300);
      // Not integral (an integral double reads back as an integer): keep a fraction.
      return json_value(std::pow(10.0, exponent(rng)) * 1.2345678901234567);
    }
    case 5:
      return json_value(random_string(rng));
    case 6: {
      json_array a;
      for (int i = static_cast<int>(rng() % 4); i > 0; --i)
        a.push_back(random_value(rng, depth + 1));
      return json_value(std::move(a));
    }
    default: {
      json_object o;
      for (int i = static_cast<int>(rng() % 4); i > 0; --i)
        o.emplace_back(random_string(rng) + std::to_string(i), random_value(rng, depth + 1));
      return json_value(std::move(o));
    }
  }
}

}  // namespace

TEST_CASE("dump_json and parse_json round-trip random documents exactly", "[checkpoint][json]") {
  std::mt19937_64 rng(20240515);
  for (int trial = 0; trial < 500; ++trial) {
    const json_value original = random_value(rng, 0);
    const std::string compact = dump_json(original);
    INFO("document: " << compact);
    REQUIRE(parse_json(compact, "compact") == original);
    REQUIRE(parse_json(dump_json(original, 2), "indented") == original);
  }
}

TEST_CASE("dump_json writes compact and indented text", "[checkpoint][json]") {
  const json_value v = json_object{
      {"a", json_array{1, -2, 0.5}}, {"b", json_object{}}, {"c", "x\ty"}, {"d", nullptr}};
  CHECK(dump_json(v) == R"({"a":[1,-2,0.5],"b":{},"c":"x\ty","d":null})");
  CHECK(dump_json(v, 1) ==
        "{\n \"a\": [1,-2,0.5],\n \"b\": {},\n \"c\": \"x\\ty\",\n \"d\": null\n}");
  REQUIRE_THROWS_WITH(dump_json(json_value(std::numeric_limits<double>::infinity())),
                      Catch::Contains("has no JSON form"));
  REQUIRE_THROWS_WITH(dump_json(json_value("\xff")), Catch::Contains("invalid UTF-8"));
}
