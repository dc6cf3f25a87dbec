// box: a rectangular block of a global tensor, a start and an extent per dimension. Shards are
// boxes, and so are the regions a rank asks for; reading a region copies, from every shard, the
// intersection of the two boxes.
//
//   global (4, 6):  shard {start (0, 3), extent (2, 3)}   region {start (1, 2), extent (2, 2)}
//       . . . s s s          intersection {start (1, 3), extent (1, 1)}
//       . . r S s s          (S: in both)
//       . . r r . .
//       . . . . . .
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/tensor/region.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace quintet::checkpoint {

struct box {
  std::vector<std::uint64_t> start;   // first index along each dimension
  std::vector<std::uint64_t> extent;  // length along each dimension

  box() = default;
  box(std::vector<std::uint64_t> start_, std::vector<std::uint64_t> extent_)
      : start(std::move(start_)), extent(std::move(extent_)) {
    QUINTET_CHECK(start.size() == extent.size(), "box: {} starts for {} extents", start.size(),
                  extent.size());
  }

  // The whole of a tensor of shape `shape`.
  static box whole(std::span<const std::uint64_t> shape) {
    return box(std::vector<std::uint64_t>(shape.size(), 0),
               std::vector<std::uint64_t>(shape.begin(), shape.end()));
  }

  // Where a quintet::region's local block sits in its global tensor.
  static box of(const quintet::region& where) {
    box b;
    for (int d = 0; d < where.global_shape().rank(); ++d) {
      b.start.push_back(static_cast<std::uint64_t>(where.offsets()[d]));
      b.extent.push_back(static_cast<std::uint64_t>(where.local_shape()[d]));
    }
    return b;
  }

  std::size_t rank() const { return extent.size(); }

  // Number of elements (1 for rank 0). Callers check bounds first, so the product fits.
  std::uint64_t volume() const {
    std::uint64_t v = 1;
    for (const std::uint64_t e : extent) v *= e;
    return v;
  }

  // True when every index of the box lies inside a tensor of shape `shape` (no overflow:
  // start + extent is compared as start <= shape - extent).
  bool inside(std::span<const std::uint64_t> shape) const {
    if (shape.size() != rank()) return false;
    for (std::size_t d = 0; d < rank(); ++d)
      if (extent[d] > shape[d] || start[d] > shape[d] - extent[d]) return false;
    return true;
  }

  // "[0, 2) x [3, 6)"; "[]" for rank 0.
  std::string to_string() const {
    if (rank() == 0) return "[]";
    std::string text;
    for (std::size_t d = 0; d < rank(); ++d)
      text += (d == 0 ? "[" : " x [") + std::to_string(start[d]) + ", " +
              std::to_string(start[d] + extent[d]) + ")";
    return text;
  }

  friend bool operator==(const box&, const box&) = default;
};

// The common part of two boxes of one rank, or nullopt when it holds no element.
inline std::optional<box> intersect(const box& a, const box& b) {
  QUINTET_CHECK(a.rank() == b.rank(), "box: cannot intersect boxes of rank {} and {}", a.rank(),
                b.rank());
  box common;
  for (std::size_t d = 0; d < a.rank(); ++d) {
    const std::uint64_t begin = std::max(a.start[d], b.start[d]);
    const std::uint64_t end = std::min(a.start[d] + a.extent[d], b.start[d] + b.extent[d]);
    if (end <= begin) return std::nullopt;
    common.start.push_back(begin);
    common.extent.push_back(end - begin);
  }
  return common;
}

}  // namespace quintet::checkpoint
