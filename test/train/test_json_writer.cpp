// json_writer: documents, escaping, exact doubles, and the misuse it rejects.
#include <catch2/catch.hpp>

#include <quintet/train/json_writer.hpp>

#include <cstdlib>
#include <limits>

using quintet::train::json_writer;

TEST_CASE("json_writer writes nested objects and arrays", "[train][json]") {
  json_writer w;
  w.begin_object().member("name", "gpt").member("layers", 2).member("tied", true);
  w.key("losses").begin_array().value(1.5).value(0.25).end_array();
  w.key("floor").null();
  w.end_object();
  CHECK(w.str() == R"({"name":"gpt","layers":2,"tied":true,"losses":[1.5,0.25],"floor":null})");
}

TEST_CASE("json_writer escapes strings and round-trips doubles", "[train][json]") {
  json_writer w;
  const double third = 1.0 / 3.0;
  w.begin_array()
      .value("a\"b\\c\n\x01")
      .value(third)
      .value(std::numeric_limits<double>::infinity())
      .end_array();
  CHECK(w.str().starts_with(R"(["a\"b\\c\n\u0001",)"));
  const auto comma = w.str().find(',');
  CHECK(std::strtod(w.str().c_str() + comma + 1, nullptr) == third);
  CHECK(w.str().ends_with(",null]"));
}

TEST_CASE("json_writer rejects malformed documents", "[train][json]") {
  json_writer unclosed;
  unclosed.begin_object();
  REQUIRE_THROWS_WITH(unclosed.str(), Catch::Contains("1 object(s) or array(s) still open"));
  json_writer keyless;
  keyless.begin_object();
  REQUIRE_THROWS_WITH(keyless.value(1), Catch::Contains("needs a key"));
  json_writer wrong_close;
  wrong_close.begin_array();
  REQUIRE_THROWS_WITH(wrong_close.end_object(), Catch::Contains("does not close"));
}
