// quintet::error and QUINTET_CHECK: the message carries the values, the condition and the place.
#include <catch2/catch.hpp>

#include <quintet/core/error.hpp>

#include <stdexcept>
#include <string>

namespace {

void reject_negative(int value) { QUINTET_CHECK(value >= 0, "value {} is negative", value); }

}  // namespace

TEST_CASE("QUINTET_CHECK passes silently when the condition holds", "[core][error]") {
  REQUIRE_NOTHROW(reject_negative(3));
}

TEST_CASE("QUINTET_CHECK throws quintet::error naming values, condition, file and line",
          "[core][error]") {
  try {
    reject_negative(-5);
    FAIL("no exception");
  } catch (const quintet::error& e) {
    const std::string message = e.what();
    CHECK_THAT(message, Catch::Contains("value -5 is negative"));
    CHECK_THAT(message, Catch::Contains("`value >= 0`"));
    CHECK_THAT(message, Catch::Contains("test_error.cpp:"));
  }
}

TEST_CASE("quintet::error is a std::runtime_error", "[core][error]") {
  REQUIRE_THROWS_AS(reject_negative(-1), std::runtime_error);
}

TEST_CASE("QUINTET_FAIL throws with the message and the place", "[core][error]") {
  REQUIRE_THROWS_WITH([] { QUINTET_FAIL("unsupported mode {}", 4); }(),
                      Catch::Contains("unsupported mode 4") && Catch::Contains("test_error.cpp:"));
}

TEST_CASE("source paths are shortened to the quintet/ part", "[core][error]") {
  using quintet::detail::short_source_path;
  CHECK(short_source_path("/opt/x/include/quintet/core/shape.hpp") == "quintet/core/shape.hpp");
  CHECK(short_source_path("/tmp/other.cpp") == "/tmp/other.cpp");
}
