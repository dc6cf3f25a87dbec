// flat_sharding: cutting a flat buffer into equal, aligned ranges per rank (what ZeRO does to a
// bucket). Checked exhaustively on small sizes against what the ranges must be (a tiling of the
// padded buffer, data ranges tiling [0, numel), the least padding the alignment allows), then on
// the header's examples and the errors.
#include <catch2/catch.hpp>

#include <quintet/parallel/flat_sharding.hpp>

#include <algorithm>
#include <cstdint>

using quintet::parallel::flat_range;
using quintet::parallel::flat_sharding;

TEST_CASE("flat_sharding: ranges tile the padded buffer and the data, for every small case",
          "[parallel][flat_sharding]") {
  for (std::int64_t numel = 0; numel <= 40; ++numel) {
    for (int ranks = 1; ranks <= 9; ++ranks) {
      for (std::int64_t alignment = 1; alignment <= 8; ++alignment) {
        INFO("numel " << numel << " ranks " << ranks << " alignment " << alignment);
        const flat_sharding s = flat_sharding::of(numel, ranks, alignment);
        REQUIRE(s.numel == numel);
        REQUIRE(s.ranks == ranks);
        REQUIRE(s.per_rank >= 0);
        REQUIRE(s.per_rank % alignment == 0);
        REQUIRE(s.padded == ranks * s.per_rank);
        REQUIRE(s.padded >= numel);
        // Minimal: one alignment step less per rank would not hold the data.
        if (s.per_rank > 0) REQUIRE(ranks * (s.per_rank - alignment) < numel);

        std::int64_t owned_end = 0, data_end = 0;
        for (int rank = 0; rank < ranks; ++rank) {
          const flat_range owned = s.owned(rank);
          const flat_range data = s.data(rank);
          REQUIRE(owned.begin == owned_end);  // contiguous, in rank order
          REQUIRE(owned.size() == s.per_rank);
          REQUIRE(data.begin == data_end);
          REQUIRE(data.size() >= 0);
          // data = owned cut to [0, numel)
          REQUIRE(data.begin == std::min(owned.begin, numel));
          REQUIRE(data.end == std::min(owned.end, numel));
          owned_end = owned.end;
          data_end = data.end;
        }
        REQUIRE(owned_end == s.padded);
        REQUIRE(data_end == numel);

        for (std::int64_t index = 0; index < numel; ++index) {
          const int owner = s.owner(index);
          REQUIRE(owner >= 0);
          REQUIRE(owner < ranks);
          REQUIRE(s.owned(owner).begin <= index);
          REQUIRE(index < s.owned(owner).end);
          REQUIRE(s.data(owner).begin <= index);
          REQUIRE(index < s.data(owner).end);
        }
      }
    }
  }
}

TEST_CASE("flat_sharding: the header's examples", "[parallel][flat_sharding]") {
  // 10 over 4: 3 each, 12 in all; rank 3 owns [9, 12) of which [9, 10) is data.
  const flat_sharding ten = flat_sharding::of(10, 4);
  CHECK(ten.per_rank == 3);
  CHECK(ten.padded == 12);
  CHECK(ten.owned(3) == flat_range{9, 12});
  CHECK(ten.data(3) == flat_range{9, 10});
  CHECK(ten.owner(9) == 3);

  // 768 over 64: 12 each, no padding.
  const flat_sharding even = flat_sharding::of(768, 64);
  CHECK(even.per_rank == 12);
  CHECK(even.padded == 768);
  CHECK(even.owned(63) == flat_range{756, 768});
  CHECK(even.data(63) == flat_range{756, 768});
  CHECK(even.owner(767) == 63);

  // 770 over 64: 13 each (ceil(770 / 64)), 832 in all: rank 59 holds the last data [767, 770),
  // ranks 60..63 hold only padding.
  const flat_sharding odd = flat_sharding::of(770, 64);
  CHECK(odd.per_rank == 13);
  CHECK(odd.padded == 832);
  CHECK(odd.owned(59) == flat_range{767, 780});
  CHECK(odd.data(59) == flat_range{767, 770});
  CHECK(odd.owner(769) == 59);
  CHECK(odd.data(60).size() == 0);
  CHECK(odd.data(63).size() == 0);
  CHECK(odd.owned(63) == flat_range{819, 832});

  // Alignment rounds each rank's share up: 770 over 64 in 16-element lines -> 16 each.
  const flat_sharding aligned = flat_sharding::of(770, 64, 16);
  CHECK(aligned.per_rank == 16);
  CHECK(aligned.padded == 1024);
  CHECK(aligned.owner(769) == 48);

  // No data: nothing owned by anyone.
  const flat_sharding empty = flat_sharding::of(0, 4, 8);
  CHECK(empty.per_rank == 0);
  CHECK(empty.padded == 0);
  CHECK(empty.data(2).size() == 0);
}

TEST_CASE("flat_sharding: bad sizes, ranks and indices are refused", "[parallel][flat_sharding]") {
  CHECK_THROWS_WITH(flat_sharding::of(-1, 2), Catch::Contains("-1 elements is negative"));
  CHECK_THROWS_WITH(flat_sharding::of(10, 0), Catch::Contains("0 ranks, need at least 1"));
  CHECK_THROWS_WITH(flat_sharding::of(10, 2, 0), Catch::Contains("alignment 0 must be positive"));
  const flat_sharding s = flat_sharding::of(10, 4);
  CHECK_THROWS_WITH(s.owned(4), Catch::Contains("rank 4 is outside [0, 4)"));
  CHECK_THROWS_WITH(s.owned(-1), Catch::Contains("rank -1 is outside [0, 4)"));
  CHECK_THROWS_WITH(s.data(4), Catch::Contains("rank 4 is outside [0, 4)"));
  CHECK_THROWS_WITH(s.owner(10), Catch::Contains("element 10 is outside [0, 10)"));
  CHECK_THROWS_WITH(s.owner(-1), Catch::Contains("element -1 is outside [0, 10)"));
  // Padding is not data: the padded tail has no owner.
  CHECK_THROWS_WITH(s.owner(11), Catch::Contains("outside [0, 10)"));
}
