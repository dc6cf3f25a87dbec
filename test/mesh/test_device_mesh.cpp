// device_mesh: the rank -> coordinates mapping as plain data for every factorisation of 8 ranks,
// then the communicators a thread_comm world is cut into, member by member.
#include <quintet/comm/thread_comm.hpp>
#include <quintet/mesh/device_mesh.hpp>

#include <catch2/catch.hpp>

#include <fmt/format.h>

#include <stdexcept>
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
