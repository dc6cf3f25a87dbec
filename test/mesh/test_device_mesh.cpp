// device_mesh: the rank -> coordinates mapping as plain data for every factorisation of 8 ranks,
// then the communicators a thread_comm world is cut into, member by member.
#include <quintet/comm/counting_comm.hpp>
#include <quintet/comm/thread_comm.hpp>
#include <quintet/mesh/device_mesh.hpp>

#include <catch2/catch.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <map>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

using namespace quintet;

namespace {

// Every (dp, pp, tp, sp) with product `world`, with every ep that divides dp.
std::vector<mesh_degrees> every_mesh_of(int world) {
  std::vector<mesh_degrees> meshes;
  for (int dp = 1; dp <= world; ++dp) {
    for (int pp = 1; pp <= world; ++pp) {
      for (int tp = 1; tp <= world; ++tp) {
        for (int sp = 1; sp <= world; ++sp) {
          if (dp * pp * tp * sp != world) continue;
          for (int ep = 1; ep <= dp; ++ep) {
            if (dp % ep == 0) meshes.push_back({.dp = dp, .pp = pp, .tp = tp, .sp = sp, .ep = ep});
          }
        }
      }
    }
  }
  return meshes;
}

// Two ranks share a group along `axis` when every other coordinate agrees (for ep: the same edp;
// for edp: the same ep), stated directly from the definitions rather than through the layout.
bool same_group(mesh_axis axis, const mesh_coordinates& a, const mesh_coordinates& b) {
  const bool same_pp = a.pp == b.pp, same_dp = a.dp == b.dp, same_sp = a.sp == b.sp,
             same_tp = a.tp == b.tp;
  switch (axis) {
    case mesh_axis::tp:
      return same_pp && same_dp && same_sp;
    case mesh_axis::sp:
      return same_pp && same_dp && same_tp;
    case mesh_axis::dp:
      return same_pp && same_sp && same_tp;
    case mesh_axis::pp:
      return same_dp && same_sp && same_tp;
    case mesh_axis::ep:
      return same_pp && same_sp && same_tp && a.edp == b.edp;
    case mesh_axis::edp:
      return same_pp && same_sp && same_tp && a.ep == b.ep;
  }
  return false;
}

}  // namespace

TEST_CASE("mesh_layout: rank order is tp fastest, then sp, dp, pp", "[mesh]") {
  const mesh_layout layout({.dp = 2, .pp = 2, .tp = 2}, 8);
  CHECK(layout.group_members(mesh_axis::tp, 2) == std::vector<int>{2, 3});
  CHECK(layout.group_members(mesh_axis::dp, 1) == std::vector<int>{1, 3});
  CHECK(layout.group_members(mesh_axis::dp, 5) == std::vector<int>{5, 7});
  CHECK(layout.group_members(mesh_axis::pp, 2) == std::vector<int>{2, 6});
  CHECK(layout.coordinates_of(6) ==
        mesh_coordinates{.tp = 0, .sp = 0, .dp = 1, .pp = 1, .ep = 0, .edp = 1});

  const mesh_layout experts({.dp = 4, .tp = 2, .ep = 2}, 8);
  // dp index = rank / 2; ep groups join consecutive dp indices, edp groups every other one.
  CHECK(experts.group_members(mesh_axis::ep, 0) == std::vector<int>{0, 2});
  CHECK(experts.group_members(mesh_axis::ep, 5) == std::vector<int>{5, 7});
  CHECK(experts.group_members(mesh_axis::edp, 0) == std::vector<int>{0, 4});
  CHECK(experts.group_members(mesh_axis::edp, 3) == std::vector<int>{3, 7});

  const mesh_layout sequence({.dp = 2, .tp = 2, .sp = 2}, 8);
  CHECK(sequence.group_members(mesh_axis::sp, 1) == std::vector<int>{1, 3});
  CHECK(sequence.group_members(mesh_axis::dp, 1) == std::vector<int>{1, 5});
}

TEST_CASE("mesh_layout: every factorisation of 8 ranks has the groups its definition gives",
          "[mesh]") {
  const auto meshes = every_mesh_of(8);
  CHECK(meshes.size() == 35);
  for (const mesh_degrees& degrees : meshes) {
    const mesh_layout layout(degrees, 8);
    INFO(fmt::format("dp {} pp {} tp {} sp {} ep {}", degrees.dp, degrees.pp, degrees.tp,
                     degrees.sp, degrees.ep));
    std::vector<int> seen(8, 0);
    for (int rank = 0; rank < 8; ++rank) {
      const mesh_coordinates at = layout.coordinates_of(rank);
      CHECK(layout.rank_of(at) == rank);
      CHECK(at.tp == rank % degrees.tp);                              // tp varies fastest
      CHECK(at.pp == rank / (degrees.tp * degrees.sp * degrees.dp));  // pp slowest
      ++seen[rank];
      for (const mesh_axis axis : all_mesh_axes) {
        std::vector<int> expected;
        for (int other = 0; other < 8; ++other) {
          if (same_group(axis, at, layout.coordinates_of(other))) expected.push_back(other);
        }
        const std::vector<int> members = layout.group_members(axis, rank);
        CHECK(static_cast<int>(members.size()) == layout.size(axis));
        std::vector<int> sorted = members;
        std::sort(sorted.begin(), sorted.end());
        CHECK(sorted == expected);  // group order is by coordinate, which is ascending rank too
        CHECK(members == expected);
        CHECK(members[layout.index_in_group(axis, rank)] == rank);
        CHECK(layout.group_id(axis, rank) == members.front());
      }
    }
  }
}

TEST_CASE("mesh_layout: degrees that do not fit the world are rejected, naming them", "[mesh]") {
  CHECK_THROWS_WITH(mesh_layout({.dp = 2, .tp = 3}, 8),
                    Catch::Contains("dp 2 x pp 1 x tp 3 x sp 1 = 6 ranks, but the world has 8"));
  CHECK_THROWS_WITH(mesh_layout({.dp = 4, .pp = 2, .ep = 3}, 8),
                    Catch::Contains("the expert degree ep 3 does not divide the data degree dp 4"));
  CHECK_THROWS_WITH(mesh_layout({.dp = 0}, 8), Catch::Contains("must be at least 1"));
  CHECK_THROWS_WITH(mesh_layout({.dp = 2}, 2).coordinates_of(2),
                    Catch::Contains("rank 2 is outside a world of 2"));
}

TEST_CASE(
    "device_mesh: every factorisation of 8 thread ranks gives communicators with the right "
    "members",
    "[mesh][thread]") {
  const auto meshes = every_mesh_of(8);
  REQUIRE_NOTHROW(thread_world{8}.run([&](thread_comm& world) {
    for (const mesh_degrees& degrees : meshes) {
      device_mesh<thread_comm> mesh(world, degrees);
      if (!(mesh.coordinates() == mesh.layout().coordinates_of(world.rank()))) {
        throw std::runtime_error("device_mesh: coordinates differ from the layout's");
      }
      for (const mesh_axis axis : all_mesh_axes) {
        thread_comm& group = mesh.axis(axis);
        const std::vector<int> expected = mesh.layout().group_members(axis, world.rank());
        tensor<std::int32_t, host> mine(shape{1});
        tensor<std::int32_t, host> members(shape{group.size()});
        mine.data()[0] = world.rank();
        group.all_gather(mine, members);
        const std::vector<int> got(members.data(), members.data() + group.size());
        if (got != expected || group.rank() != mesh.layout().index_in_group(axis, world.rank())) {
          throw std::runtime_error(fmt::format(
              "dp {} pp {} tp {} sp {} ep {}: rank {} axis {} has members {} (rank {}), expected "
              "{}",
              degrees.dp, degrees.pp, degrees.tp, degrees.sp, degrees.ep, world.rank(),
              name_of(axis), fmt::join(got, ","), group.rank(), fmt::join(expected, ",")));
        }
      }
    }
  }));
  CHECK_THROWS_WITH(thread_world{4}.run([](thread_comm& world) {
    device_mesh<thread_comm> mesh(world, {.dp = 2, .tp = 3});
  }),
                    Catch::Contains("6 ranks, but the world has 4"));
}

namespace {

// Every subset of the six axes, built with with() so the tests do not rely on bits().
std::vector<mesh_axis_set> every_axis_set() {
  std::vector<mesh_axis_set> sets;
  for (unsigned mask = 0; mask < (1u << all_mesh_axes.size()); ++mask) {
    mesh_axis_set set;
    for (std::size_t i = 0; i < all_mesh_axes.size(); ++i)
      if ((mask >> i) & 1u) set = set.with(all_mesh_axes[i]);
    sets.push_back(set);
  }
  return sets;
}

// ep and edp subdivide dp, so a product group may name dp or an expert axis, not both.
bool allowed(mesh_axis_set axes) {
  return !(axes.contains(mesh_axis::dp) &&
           (axes.contains(mesh_axis::ep) || axes.contains(mesh_axis::edp)));
}

// The degree of one axis, from the degrees themselves (edp = dp / ep).
int degree_of(const mesh_degrees& degrees, mesh_axis axis) {
  switch (axis) {
    case mesh_axis::tp:
      return degrees.tp;
    case mesh_axis::sp:
      return degrees.sp;
    case mesh_axis::dp:
      return degrees.dp;
    case mesh_axis::pp:
      return degrees.pp;
    case mesh_axis::ep:
      return degrees.ep;
    case mesh_axis::edp:
      return degrees.dp / degrees.ep;
  }
  return 0;
}

int coordinate_of(const mesh_coordinates& at, mesh_axis axis) {
  switch (axis) {
    case mesh_axis::tp:
      return at.tp;
    case mesh_axis::sp:
      return at.sp;
    case mesh_axis::dp:
      return at.dp;
    case mesh_axis::pp:
      return at.pp;
    case mesh_axis::ep:
      return at.ep;
    case mesh_axis::edp:
      return at.edp;
  }
  return -1;
}

// Two ranks share the product group of `axes` iff they agree on every coordinate outside it. A
// rank's coordinates are (tp, sp, pp, ep, edp) (dp is the pair ep, edp); dp in the set frees both.
bool same_product_group(mesh_axis_set axes, const mesh_coordinates& a, const mesh_coordinates& b) {
  const auto agree = [&](mesh_axis axis, bool free) {
    return free || coordinate_of(a, axis) == coordinate_of(b, axis);
  };
  const bool dp_free = axes.contains(mesh_axis::dp);
  return agree(mesh_axis::tp, axes.contains(mesh_axis::tp)) &&
         agree(mesh_axis::sp, axes.contains(mesh_axis::sp)) &&
         agree(mesh_axis::pp, axes.contains(mesh_axis::pp)) &&
         agree(mesh_axis::ep, dp_free || axes.contains(mesh_axis::ep)) &&
         agree(mesh_axis::edp, dp_free || axes.contains(mesh_axis::edp));
}

// A rank's index in its product group: its coordinates on `axes` as a mixed-radix number, fastest
// axis (tp, sp, dp, pp, ep, edp) first.
int mixed_radix_index(mesh_axis_set axes, const mesh_degrees& degrees, const mesh_coordinates& at) {
  int index = 0, stride = 1;
  for (const mesh_axis axis : {mesh_axis::tp, mesh_axis::sp, mesh_axis::dp, mesh_axis::pp,
                               mesh_axis::ep, mesh_axis::edp}) {
    if (!axes.contains(axis)) continue;
    index += stride * coordinate_of(at, axis);
    stride *= degree_of(degrees, axis);
  }
  return index;
}

}  // namespace

TEST_CASE("mesh_axis_set: membership, count and the set operations", "[mesh][axis]") {
  // Usable in constant expressions (plans fold their axes at compile time).
  STATIC_REQUIRE(mesh_axis_set{mesh_axis::sp, mesh_axis::dp}.count() == 2);
  STATIC_REQUIRE(mesh_axis_set{}.empty());
  STATIC_REQUIRE((mesh_axis_set{mesh_axis::tp} | mesh_axis_set{mesh_axis::sp}) ==
                 mesh_axis_set{mesh_axis::sp, mesh_axis::tp});

  const mesh_axis_set none;
  CHECK(none.empty());
  CHECK(none.count() == 0);
  for (const mesh_axis axis : all_mesh_axes) CHECK_FALSE(none.contains(axis));

  const mesh_axis_set tp_dp{mesh_axis::dp, mesh_axis::tp};
  CHECK_FALSE(tp_dp.empty());
  CHECK(tp_dp.count() == 2);
  CHECK(tp_dp.contains(mesh_axis::tp));
  CHECK(tp_dp.contains(mesh_axis::dp));
  CHECK_FALSE(tp_dp.contains(mesh_axis::sp));
  CHECK_FALSE(tp_dp.contains(mesh_axis::ep));
  // A repeated axis is one member.
  CHECK(mesh_axis_set{mesh_axis::pp, mesh_axis::pp}.count() == 1);
  CHECK(mesh_axis_set{mesh_axis::pp, mesh_axis::pp} == mesh_axis_set{mesh_axis::pp});

  CHECK(tp_dp.with(mesh_axis::sp) == mesh_axis_set{mesh_axis::tp, mesh_axis::sp, mesh_axis::dp});
  CHECK(tp_dp.with(mesh_axis::tp) == tp_dp);  // already there
  CHECK(tp_dp.without(mesh_axis::tp) == mesh_axis_set{mesh_axis::dp});
  CHECK(tp_dp.without(mesh_axis::edp) == tp_dp);  // not there
  CHECK(tp_dp.without(mesh_axis::tp).without(mesh_axis::dp).empty());

  // Every pair of the 64 sets against the member-wise definitions.
  const std::vector<mesh_axis_set> sets = every_axis_set();
  REQUIRE(sets.size() == 64);
  for (const mesh_axis_set a : sets) {
    int members = 0;
    for (const mesh_axis axis : all_mesh_axes) members += a.contains(axis) ? 1 : 0;
    REQUIRE(a.count() == members);
    REQUIRE(a.empty() == (members == 0));
    for (const mesh_axis_set b : sets) {
      bool b_in_a = true;
      for (const mesh_axis axis : all_mesh_axes) {
        REQUIRE((a | b).contains(axis) == (a.contains(axis) || b.contains(axis)));
        REQUIRE((a & b).contains(axis) == (a.contains(axis) && b.contains(axis)));
        REQUIRE((a - b).contains(axis) == (a.contains(axis) && !b.contains(axis)));
        if (b.contains(axis) && !a.contains(axis)) b_in_a = false;
      }
      REQUIRE(a.contains_all(b) == b_in_a);
    }
  }
  CHECK((tp_dp - mesh_axis_set{mesh_axis::dp, mesh_axis::sp}) == mesh_axis_set{mesh_axis::tp});
  CHECK(tp_dp.contains_all({}));
  CHECK_FALSE(none.contains_all(tp_dp));
}

TEST_CASE("mesh_axis_set: for_each visits tp, sp, dp, pp, ep, edp in order, and names join with x",
          "[mesh][axis]") {
  const mesh_axis_set every{mesh_axis::edp, mesh_axis::pp, mesh_axis::sp,
                            mesh_axis::tp,  mesh_axis::ep, mesh_axis::dp};
  std::vector<mesh_axis> visited;
  every.for_each([&](mesh_axis axis) { visited.push_back(axis); });
  CHECK(visited == std::vector<mesh_axis>{mesh_axis::tp, mesh_axis::sp, mesh_axis::dp,
                                          mesh_axis::pp, mesh_axis::ep, mesh_axis::edp});
  visited.clear();
  mesh_axis_set{mesh_axis::dp, mesh_axis::sp}.for_each(
      [&](mesh_axis axis) { visited.push_back(axis); });
  CHECK(visited == std::vector<mesh_axis>{mesh_axis::sp, mesh_axis::dp});
  visited.clear();
  mesh_axis_set{}.for_each([&](mesh_axis axis) { visited.push_back(axis); });
  CHECK(visited.empty());

  CHECK(name_of(mesh_axis_set{mesh_axis::dp, mesh_axis::sp}) == "sp x dp");
  CHECK(name_of(mesh_axis_set{}) == "none");
  CHECK(name_of(mesh_axis_set{mesh_axis::pp}) == "pp");
  CHECK(name_of(mesh_axis_set{mesh_axis::edp, mesh_axis::tp}) == "tp x edp");
  CHECK(name_of(every) == "tp x sp x dp x pp x ep x edp");
}

TEST_CASE("mesh_axis_set: < is a strict total order consistent with ==, so sets key maps",
          "[mesh][axis]") {
  const std::vector<mesh_axis_set> sets = every_axis_set();
  for (const mesh_axis_set a : sets) {
    REQUIRE_FALSE(a < a);
    for (const mesh_axis_set b : sets) {
      // Exactly one of a < b, b < a, a == b.
      const int holds = (a < b ? 1 : 0) + (b < a ? 1 : 0) + (a == b ? 1 : 0);
      REQUIRE(holds == 1);
      for (const mesh_axis_set c : sets)
        if (a < b && b < c) REQUIRE(a < c);
    }
  }
  std::map<mesh_axis_set, int> keyed;
  for (const mesh_axis_set set : sets) keyed[set] = set.count();
  CHECK(keyed.size() == 64);
  CHECK(keyed.at(mesh_axis_set{mesh_axis::sp, mesh_axis::dp}) == 2);
}

TEST_CASE("mesh_layout: product groups of every allowed axis set, for every factorisation of 8",
          "[mesh]") {
  const std::vector<mesh_axis_set> sets = every_axis_set();
  for (const mesh_degrees& degrees : every_mesh_of(8)) {
    const mesh_layout layout(degrees, 8);
    INFO(fmt::format("dp {} pp {} tp {} sp {} ep {}", degrees.dp, degrees.pp, degrees.tp,
                     degrees.sp, degrees.ep));
    for (const mesh_axis_set axes : sets) {
      INFO("axes " << name_of(axes));
      if (!allowed(axes)) {
        REQUIRE_THROWS_WITH(layout.check_axes(axes),
                            Catch::Contains("names dp and an expert axis that subdivides it"));
        REQUIRE_THROWS_WITH(layout.size(axes), Catch::Contains("names dp and an expert axis"));
        REQUIRE_THROWS_WITH(layout.index_in_group(axes, 0),
                            Catch::Contains("names dp and an expert axis"));
        REQUIRE_THROWS_WITH(layout.group_members(axes, 0),
                            Catch::Contains("names dp and an expert axis"));
        REQUIRE_THROWS_WITH(layout.group_id(axes, 0),
                            Catch::Contains("names dp and an expert axis"));
        continue;
      }
      REQUIRE_NOTHROW(layout.check_axes(axes));
      int expected_size = 1;
      axes.for_each([&](mesh_axis axis) { expected_size *= degree_of(degrees, axis); });
      REQUIRE(layout.size(axes) == expected_size);
      for (int rank = 0; rank < 8; ++rank) {
        INFO("rank " << rank);
        const mesh_coordinates mine = layout.coordinates_of(rank);
        // The group by definition, placed by mixed-radix index.
        std::vector<int> expected(static_cast<std::size_t>(expected_size), -1);
        int found = 0;
        for (int other = 0; other < 8; ++other) {
          const mesh_coordinates theirs = layout.coordinates_of(other);
          if (!same_product_group(axes, mine, theirs)) continue;
          const int index = mixed_radix_index(axes, degrees, theirs);
          REQUIRE(index < expected_size);
          REQUIRE(expected[static_cast<std::size_t>(index)] == -1);  // indices are distinct
          expected[static_cast<std::size_t>(index)] = other;
          ++found;
        }
        REQUIRE(found == expected_size);
        const std::vector<int> members = layout.group_members(axes, rank);
        REQUIRE(members == expected);
        REQUIRE(layout.index_in_group(axes, rank) == mixed_radix_index(axes, degrees, mine));
        REQUIRE(layout.group_id(axes, rank) == *std::min_element(expected.begin(), expected.end()));
        if (axes.count() == 1) {
          // A one-axis set is that axis' group.
          mesh_axis only = mesh_axis::tp;
          axes.for_each([&](mesh_axis axis) { only = axis; });
          REQUIRE(layout.size(axes) == layout.size(only));
          REQUIRE(members == layout.group_members(only, rank));
          REQUIRE(layout.index_in_group(axes, rank) == layout.index_in_group(only, rank));
          REQUIRE(layout.group_id(axes, rank) == layout.group_id(only, rank));
        }
        if (axes.empty()) {
          REQUIRE(members == std::vector<int>{rank});
          REQUIRE(layout.index_in_group(axes, rank) == 0);
          REQUIRE(layout.group_id(axes, rank) == rank);
        }
      }
    }
  }
}

TEST_CASE("mesh_layout: product groups on a known mesh, written out", "[mesh]") {
  // {.dp = 2, .tp = 2, .sp = 2}: rank = tp + 2 sp + 4 dp.
  const mesh_layout layout({.dp = 2, .tp = 2, .sp = 2}, 8);
  CHECK(layout.group_members({mesh_axis::sp, mesh_axis::dp}, 1) == std::vector<int>{1, 3, 5, 7});
  CHECK(layout.group_members({mesh_axis::tp, mesh_axis::dp}, 2) == std::vector<int>{2, 3, 6, 7});
  CHECK(layout.index_in_group({mesh_axis::sp, mesh_axis::dp}, 5) == 2);  // sp 0, dp 1
  CHECK(layout.group_id({mesh_axis::sp, mesh_axis::dp}, 7) == 1);
  // {.dp = 4, .tp = 2, .ep = 2}: {ep, edp} numbers the ranks as dp does.
  const mesh_layout experts({.dp = 4, .tp = 2, .ep = 2}, 8);
  CHECK(experts.group_members({mesh_axis::ep, mesh_axis::edp}, 1) ==
        experts.group_members(mesh_axis::dp, 1));
  CHECK(experts.group_members({mesh_axis::tp, mesh_axis::ep}, 4) == std::vector<int>{4, 5, 6, 7});
  CHECK_THROWS_WITH(experts.size({mesh_axis::dp, mesh_axis::ep}),
                    Catch::Contains("the axis set dp x ep names dp and an expert axis"));
}

TEST_CASE("device_mesh: product groups on thread ranks have the layout's members, size and rank",
          "[mesh][thread]") {
  const auto meshes = every_mesh_of(8);
  std::vector<mesh_axis_set> sets;
  for (const mesh_axis_set axes : every_axis_set())
    if (allowed(axes)) sets.push_back(axes);
  // Each rank writes only its own slot; Catch2 asserts on the main thread afterwards.
  std::vector<std::vector<std::string>> failures(8);
  REQUIRE_NOTHROW(thread_world{8}.run([&](thread_comm& world) {
    const int me = world.rank();
    auto fail = [&](std::string message) {
      failures[static_cast<std::size_t>(me)].push_back(message);
    };
    for (const mesh_degrees& degrees : meshes) {
      device_mesh<thread_comm> mesh(world, degrees);
      const mesh_layout& layout = mesh.layout();
      for (const mesh_axis_set axes : sets) {  // the same sets in the same order on every rank
        const std::string where =
            fmt::format("dp {} pp {} tp {} sp {} ep {}, {}", degrees.dp, degrees.pp, degrees.tp,
                        degrees.sp, degrees.ep, name_of(axes));
        thread_comm& group = mesh.group(axes);
        const std::vector<int> expected = layout.group_members(axes, me);
        if (group.size() != static_cast<int>(expected.size()))
          fail(fmt::format("{}: size {} != {}", where, group.size(), expected.size()));
        if (group.rank() != layout.index_in_group(axes, me))
          fail(fmt::format("{}: rank {} != {}", where, group.rank(),
                           layout.index_in_group(axes, me)));
        // Sum of the members' world ranks, and the members themselves in group order.
        tensor<std::int64_t, host> sum(shape{1});
        sum.data()[0] = me;
        group.all_reduce(sum, reduce_op::sum);
        std::int64_t expected_sum = 0;
        for (const int member : expected) expected_sum += member;
        if (sum.data()[0] != expected_sum)
          fail(fmt::format("{}: sum of world ranks {} != {}", where, sum.data()[0], expected_sum));
        tensor<std::int32_t, host> mine(shape{1});
        tensor<std::int32_t, host> gathered(shape{group.size()});
        mine.data()[0] = me;
        group.all_gather(mine, gathered);
        const std::vector<int> got(gathered.data(), gathered.data() + group.size());
        if (got != expected)
          fail(fmt::format("{}: members {} != {}", where, fmt::join(got, ","),
                           fmt::join(expected, ",")));
      }
    }
  }));
  for (int rank = 0; rank < 8; ++rank) {
    INFO("rank " << rank);
    CHECK(failures[static_cast<std::size_t>(rank)] == std::vector<std::string>{});
  }
}

TEST_CASE(
    "device_mesh: sp x dp and tp x pp reduce over the right ranks, one axis is its own "
    "communicator, and product groups are cached",
    "[mesh][thread]") {
  struct rank_record {
    std::int64_t sp_dp_sum = -1, tp_pp_sum = -1;
    int sp_dp_size = 0, sp_dp_rank = -1, tp_pp_size = 0, tp_pp_rank = -1;
    bool single_is_axis = false, cached = false, refused_dp_ep = false;
  };
  const mesh_degrees degrees{.dp = 2, .pp = 2, .tp = 2};
  const mesh_degrees degrees_sp{.dp = 2, .tp = 2, .sp = 2};
  std::vector<rank_record> sp_dp(8), tp_pp(8);
  REQUIRE_NOTHROW(thread_world{8}.run([&](thread_comm& world) {
    const auto me = static_cast<std::size_t>(world.rank());
    const auto sum_of_ranks = [&](thread_comm& group) {
      tensor<std::int64_t, host> sum(shape{1});
      sum.data()[0] = world.rank();
      group.all_reduce(sum, reduce_op::sum);
      return sum.data()[0];
    };
    {
      device_mesh<thread_comm> mesh(world, degrees_sp);
      rank_record& r = sp_dp[me];
      thread_comm& group = mesh.group({mesh_axis::sp, mesh_axis::dp});
      r.sp_dp_size = group.size();
      r.sp_dp_rank = group.rank();
      r.sp_dp_sum = sum_of_ranks(group);
      r.cached = &mesh.group({mesh_axis::dp, mesh_axis::sp}) == &group;
      r.single_is_axis = true;
      for (const mesh_axis axis : all_mesh_axes)
        r.single_is_axis = r.single_is_axis && &mesh.group(mesh_axis_set{axis}) == &mesh.axis(axis);
      try {
        mesh.group({mesh_axis::dp, mesh_axis::ep});
      } catch (const std::exception& e) {
        r.refused_dp_ep = std::string_view(e.what()).find("names dp and an expert axis") !=
                          std::string_view::npos;
      }
    }
    {
      device_mesh<thread_comm> mesh(world, degrees);
      rank_record& r = tp_pp[me];
      thread_comm& group = mesh.group({mesh_axis::pp, mesh_axis::tp});
      r.tp_pp_size = group.size();
      r.tp_pp_rank = group.rank();
      r.tp_pp_sum = sum_of_ranks(group);
      r.cached = &mesh.group({mesh_axis::tp, mesh_axis::pp}) == &group;
    }
  }));
  for (int rank = 0; rank < 8; ++rank) {
    INFO("rank " << rank);
    const auto me = static_cast<std::size_t>(rank);
    // {.dp = 2, .tp = 2, .sp = 2}: rank = tp + 2 sp + 4 dp; sp x dp fixes tp.
    const int tp = rank % 2, sp = rank / 2 % 2, dp = rank / 4;
    CHECK(sp_dp[me].sp_dp_size == 4);
    CHECK(sp_dp[me].sp_dp_rank == sp + 2 * dp);
    CHECK(sp_dp[me].sp_dp_sum == tp + (tp + 2) + (tp + 4) + (tp + 6));
    CHECK(sp_dp[me].cached);
    CHECK(sp_dp[me].single_is_axis);
    CHECK(sp_dp[me].refused_dp_ep);
    // {.dp = 2, .pp = 2, .tp = 2}: rank = tp + 2 dp + 4 pp; tp x pp fixes dp.
    const int dp2 = rank / 2 % 2, tp2 = rank % 2, pp2 = rank / 4;
    CHECK(tp_pp[me].tp_pp_size == 4);
    CHECK(tp_pp[me].tp_pp_rank == tp2 + 2 * pp2);
    CHECK(tp_pp[me].tp_pp_sum == 4 * (2 * dp2) + (0 + 1 + 4 + 5));
    CHECK(tp_pp[me].cached);
  }
}

TEST_CASE("device_mesh: a counted product group is labelled with its axes and split once",
          "[mesh][thread][counting]") {
  struct rank_record {
    std::string label;
    std::int64_t splits_first = -1, splits_again = -1;
    comm_tally sp_dp, sp, dp;
    std::int64_t sum = -1;
  };
  std::vector<rank_record> records(8);
  REQUIRE_NOTHROW(thread_world{8}.run([&](thread_comm& world) {
    rank_record& r = records[static_cast<std::size_t>(world.rank())];
    counting_comm<thread_comm> counted(world.split(0, world.rank()), "world");
    device_mesh<counting_comm<thread_comm>> mesh(counted, {.dp = 2, .tp = 2, .sp = 2});
    const comm_ledger& ledger = counted.ledger();
    const std::int64_t before = ledger.total(comm_operation::split).calls;
    counting_comm<thread_comm>& group = mesh.group({mesh_axis::sp, mesh_axis::dp});
    r.splits_first = ledger.total(comm_operation::split).calls - before;
    mesh.group({mesh_axis::sp, mesh_axis::dp});
    r.splits_again = ledger.total(comm_operation::split).calls - before;
    r.label = group.axis_label();
    tensor<std::int64_t, host> sum(shape{1});
    sum.data()[0] = world.rank();
    group.all_reduce(sum, reduce_op::sum);
    r.sum = sum.data()[0];
    r.sp_dp = ledger.tally("sp x dp", comm_operation::all_reduce);
    r.sp = ledger.tally("sp", comm_operation::all_reduce);
    r.dp = ledger.tally("dp", comm_operation::all_reduce);
  }));
  for (int rank = 0; rank < 8; ++rank) {
    INFO("rank " << rank);
    const rank_record& r = records[static_cast<std::size_t>(rank)];
    CHECK(r.label == "sp x dp");
    CHECK(r.splits_first == 1);  // made on first use
    CHECK(r.splits_again == 1);  // then cached
    CHECK(r.sum == 4 * (rank % 2) + 12);
    CHECK(r.sp_dp.calls == 1);
    CHECK(r.sp_dp.bytes == 8);
    CHECK(r.sp.calls == 0);
    CHECK(r.dp.calls == 0);
  }
}

TEST_CASE("device_mesh: axes of degree 1 are dropped from a product group, costing no split",
          "[mesh][product]") {
  std::vector<int> same_as_sp(4, 0), same_as_dp(4, 0), splits(4, -1);
  thread_world{4}.run([&](thread_comm& world) {
    counting_comm<thread_comm> counted(world.split(0, world.rank()));
    device_mesh<counting_comm<thread_comm>> mesh(counted, {.tp = 2, .sp = 2});
    counted.ledger().clear();
    const int r = world.rank();
    same_as_sp[r] = &mesh.group({mesh_axis::sp, mesh_axis::dp}) == &mesh.sp() ? 1 : 0;
    same_as_dp[r] = &mesh.group({mesh_axis::dp, mesh_axis::pp}) == &mesh.dp() ? 1 : 0;
    splits[r] = static_cast<int>(counted.ledger().total(comm_operation::split).calls);
  });
  for (int r = 0; r < 4; ++r) {
    INFO("rank " << r);
    CHECK(same_as_sp[r] == 1);  // dp = 1: sp x dp is the sp group
    CHECK(same_as_dp[r] == 1);  // dp = pp = 1: a group of this rank alone, the dp communicator
    CHECK(splits[r] == 0);
  }
}
