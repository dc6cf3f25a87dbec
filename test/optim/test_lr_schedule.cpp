// cosine_schedule: warm-up is linear, the decay is a half cosine from peak to floor, and bad
// configurations are rejected naming the values.
#include <catch2/catch.hpp>

#include <quintet/optim/lr_schedule.hpp>

#include <cmath>
#include <numbers>

using quintet::optim::cosine_schedule;

TEST_CASE("warm-up rises linearly to the peak", "[optim][schedule]") {
  const cosine_schedule schedule(1e-3, 1e-4, 10, 110);
  CHECK(schedule(0) == Approx(1e-4));
  CHECK(schedule(4) == Approx(5e-4));
  CHECK(schedule(9) == Approx(1e-3));
}

TEST_CASE("the decay follows a half cosine from peak to floor", "[optim][schedule]") {
  const cosine_schedule schedule(1e-3, 1e-4, 10, 110);
  CHECK(schedule(10) == Approx(1e-3));                 // start of the decay: the peak
  CHECK(schedule(60) == Approx(0.5 * (1e-3 + 1e-4)));  // half way: the mid point
  CHECK(schedule(35) == Approx(1e-4 + 0.5 * 9e-4 * (1 + std::cos(std::numbers::pi / 4))));
  CHECK(schedule(110) == Approx(1e-4));
  CHECK(schedule(500) == Approx(1e-4));
  for (int step = 11; step < 110; ++step) REQUIRE(schedule(step) < schedule(step - 1));
}

TEST_CASE("no warm-up and no decay are both allowed", "[optim][schedule]") {
  CHECK(cosine_schedule(2e-3, 0, 0, 100)(0) == Approx(2e-3));
  CHECK(cosine_schedule(2e-3, 1e-3, 5, 5)(7) == Approx(1e-3));
}

TEST_CASE("bad schedules are rejected naming the values", "[optim][schedule]") {
  REQUIRE_THROWS_WITH(cosine_schedule(0, 0, 1, 10), Catch::Contains("peak rate 0"));
  REQUIRE_THROWS_WITH(cosine_schedule(1e-3, 2e-3, 1, 10),
                      Catch::Contains("floor rate 0.002 must lie in [0, peak 0.001]"));
  REQUIRE_THROWS_WITH(cosine_schedule(1e-3, 0, 20, 10),
                      Catch::Contains("warm-up of 20 steps does not fit in 10 total steps"));
  REQUIRE_THROWS_WITH(cosine_schedule(1e-3, 0, 2, 10)(-1), Catch::Contains("step -1 is negative"));
}
