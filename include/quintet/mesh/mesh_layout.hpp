// mesh_layout: which world rank holds which (pp, dp, sp, tp) coordinates, as plain data testable
// without a communicator. tp varies fastest, then sp, then dp, then pp (Megatron's order, so a tp
// group sits on the fastest links); the expert groups subdivide dp. A group is given by one axis or
// by a set of axes (a product group: the ranks that agree on every other axis, sp x dp say).
//
//   rank = tp + T * (sp + S * (dp + D * pp))   (T, S, D: the tp, sp and dp degrees)
//   world 8, {.dp = 2, .pp = 2, .tp = 2}:
//     pp 0: dp 0 -> ranks 0 1 (tp 0, 1)        tp groups {0,1} {2,3} {4,5} {6,7}
//           dp 1 -> ranks 2 3                  dp groups {0,2} {1,3} {4,6} {5,7}
//     pp 1: dp 0 -> ranks 4 5,  dp 1 -> 6 7    pp groups {0,4} {1,5} {2,6} {3,7}
//   Expert groups split dp = edp * ep + e: ep groups gather consecutive dp indices (same edp),
//   expert-data groups the same e. ep = 2, dp = 4: ep {dp 0,1} {dp 2,3}; edp {dp 0,2} {dp 1,3}.
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/mesh/mesh_axis.hpp>

#include <array>
#include <cstdint>
#include <string_view>
#include <vector>

namespace quintet {

// Degrees of each kind of parallelism; dp * pp * tp * sp is the world size and ep divides dp.
struct mesh_degrees {
  int dp = 1;
  int pp = 1;
  int tp = 1;
  int sp = 1;
  int ep = 1;
};

// A rank's place in the mesh. ep = dp % ep_degree and edp = dp / ep_degree are derived from dp.
struct mesh_coordinates {
  int tp = 0;
  int sp = 0;
  int dp = 0;
  int pp = 0;
  int ep = 0;
  int edp = 0;

  friend bool operator==(const mesh_coordinates&, const mesh_coordinates&) = default;
};

class mesh_layout {
 public:
  mesh_layout(mesh_degrees degrees, int world_size) : degrees_(degrees), world_size_(world_size) {
    QUINTET_CHECK(
        degrees.dp >= 1 && degrees.pp >= 1 && degrees.tp >= 1 && degrees.sp >= 1 && degrees.ep >= 1,
        "device_mesh degrees must be at least 1, got dp {} pp {} tp {} sp {} ep {}", degrees.dp,
        degrees.pp, degrees.tp, degrees.sp, degrees.ep);
    const std::int64_t ranks = std::int64_t{degrees.dp} * degrees.pp * degrees.tp * degrees.sp;
    QUINTET_CHECK(ranks == world_size,
                  "device_mesh: dp {} x pp {} x tp {} x sp {} = {} ranks, but the world has {}",
                  degrees.dp, degrees.pp, degrees.tp, degrees.sp, ranks, world_size);
    QUINTET_CHECK(degrees.dp % degrees.ep == 0,
                  "device_mesh: the expert degree ep {} does not divide the data degree dp {}",
                  degrees.ep, degrees.dp);
  }

  const mesh_degrees& degrees() const { return degrees_; }
  int world_size() const { return world_size_; }

  int size(mesh_axis axis) const {
    switch (axis) {
      case mesh_axis::tp:
        return degrees_.tp;
      case mesh_axis::sp:
        return degrees_.sp;
      case mesh_axis::dp:
        return degrees_.dp;
      case mesh_axis::pp:
        return degrees_.pp;
      case mesh_axis::ep:
        return degrees_.ep;
      case mesh_axis::edp:
        return degrees_.dp / degrees_.ep;
    }
    return 0;
  }

  mesh_coordinates coordinates_of(int rank) const {
    QUINTET_CHECK(rank >= 0 && rank < world_size_, "mesh_layout: rank {} is outside a world of {}",
                  rank, world_size_);
    mesh_coordinates at;
    at.tp = rank % degrees_.tp;
    rank /= degrees_.tp;
    at.sp = rank % degrees_.sp;
    rank /= degrees_.sp;
    at.dp = rank % degrees_.dp;
    at.pp = rank / degrees_.dp;
    at.ep = at.dp % degrees_.ep;
    at.edp = at.dp / degrees_.ep;
    return at;
  }

  // The world rank at (tp, sp, dp, pp); ep and edp are ignored (they follow from dp).
  int rank_of(const mesh_coordinates& at) const {
    return at.tp + degrees_.tp * (at.sp + degrees_.sp * (at.dp + degrees_.dp * at.pp));
  }

  // The rank's index within its group along `axis`.
  int index_in_group(mesh_axis axis, int rank) const {
    const mesh_coordinates at = coordinates_of(rank);
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
    return 0;
  }

  // The world ranks of the rank's group along `axis`, in group order.
  std::vector<int> group_members(mesh_axis axis, int rank) const {
    std::vector<int> members;
    for (int index = 0; index < size(axis); ++index) {
      members.push_back(rank_of(moved(coordinates_of(rank), axis, index)));
    }
    return members;
  }

  // A number that names the group (its lowest world rank): the color for split().
  int group_id(mesh_axis axis, int rank) const {
    return rank_of(moved(coordinates_of(rank), axis, 0));
  }

  // Product groups. ep and edp subdivide dp, so a set may hold dp or either of them, not both.
  void check_axes(mesh_axis_set axes) const {
    QUINTET_CHECK(!axes.contains(mesh_axis::dp) ||
                      !(axes.contains(mesh_axis::ep) || axes.contains(mesh_axis::edp)),
                  "mesh_layout: the axis set {} names dp and an expert axis that subdivides it",
                  name_of(axes));
  }

  // Ranks in the product group of `axes`: the product of their sizes (1 for the empty set).
  int size(mesh_axis_set axes) const {
    check_axes(axes);
    int n = 1;
    axes.for_each([&](mesh_axis axis) { n *= size(axis); });
    return n;
  }

  // The rank's index in its product group: its coordinates on `axes` as a mixed-radix number,
  // fastest axis first (so {ep, edp} numbers ranks as dp does).
  int index_in_group(mesh_axis_set axes, int rank) const {
    check_axes(axes);
    int index = 0, stride = 1;
    axes.for_each([&](mesh_axis axis) {
      index += stride * index_in_group(axis, rank);
      stride *= size(axis);
    });
    return index;
  }

  // The world ranks of the rank's product group along `axes`, in group order.
  std::vector<int> group_members(mesh_axis_set axes, int rank) const {
    std::vector<int> members(static_cast<std::size_t>(size(axes)), -1);
    const mesh_coordinates mine = coordinates_of(rank);
    for (int other = 0; other < world_size_; ++other)
      if (agree_outside(axes, mine, coordinates_of(other)))
        members[static_cast<std::size_t>(index_in_group(axes, other))] = other;
    return members;
  }

  // The product group's lowest world rank: the color for split().
  int group_id(mesh_axis_set axes, int rank) const { return group_members(axes, rank).front(); }

 private:
  // Whether a and b agree on every coordinate outside `axes` (dp counts as outside when neither
  // it nor an expert axis is in the set; an expert axis frees only its part of dp).
  static bool agree_outside(mesh_axis_set axes, const mesh_coordinates& a,
                            const mesh_coordinates& b) {
    const auto same = [&](mesh_axis axis, int x, int y) { return axes.contains(axis) || x == y; };
    const bool dp_free = axes.contains(mesh_axis::dp);
    return same(mesh_axis::tp, a.tp, b.tp) && same(mesh_axis::sp, a.sp, b.sp) &&
           same(mesh_axis::pp, a.pp, b.pp) &&
           (dp_free || (same(mesh_axis::ep, a.ep, b.ep) && same(mesh_axis::edp, a.edp, b.edp)));
  }

  // `at` with its coordinate along `axis` set to `index`.
  mesh_coordinates moved(mesh_coordinates at, mesh_axis axis, int index) const {
    switch (axis) {
      case mesh_axis::tp:
        at.tp = index;
        break;
      case mesh_axis::sp:
        at.sp = index;
        break;
      case mesh_axis::dp:
        at.dp = index;
        break;
      case mesh_axis::pp:
        at.pp = index;
        break;
      case mesh_axis::ep:
        at.dp = at.edp * degrees_.ep + index;
        break;
      case mesh_axis::edp:
        at.dp = index * degrees_.ep + at.ep;
        break;
    }
    at.ep = at.dp % degrees_.ep;
    at.edp = at.dp / degrees_.ep;
    return at;
  }

  mesh_degrees degrees_;
  int world_size_;
};

}  // namespace quintet
