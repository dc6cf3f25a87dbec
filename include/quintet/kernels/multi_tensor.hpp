// How one pass covers a list of tensors (the optimizer updates and the squared norms of every
// gradient: one parallel_for on the host, one launch per group of tensors on cuda, instead of one
// per tensor). Each tensor's elements are cut into units of `unit` elements from its own start
// (its last unit shorter), and the units of all tensors are numbered in list order:
//
//   counts  [ 5          | 0 | 12                            ]     unit = 4
//   units   [ 0    | 1   |   | 2    | 3    | 4    ]                first = {0, 2, 2, 5}
//
// A unit never spans two tensors and starts at a multiple of `unit` in its tensor, so the work on
// it is the single-tensor kernel's on that range (the same bits), and a unit that is a multiple of
// the vector lanes keeps each tensor's 16-byte alignment. A cuda launch carries at most `capacity`
// tensors in its parameters (a fixed-size struct, under the 4 KiB every toolkit accepts); a longer
// list takes consecutive groups. Plain C++, tested on the host; the lookups run on both.
#pragma once

#include <quintet/core/config.hpp>
#include <quintet/core/error.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace quintet::kernels::multi_tensor {

inline std::int64_t units_of(std::int64_t count, std::int64_t unit) {
  return (count + unit - 1) / unit;
}

// first[i]: the units of tensors 0 .. i - 1; first[n]: the units of all n tensors.
inline std::vector<std::int64_t> first_units(std::span<const std::int64_t> counts,
                                             std::int64_t unit) {
  QUINTET_CHECK(unit >= 1, "multi_tensor: a unit of {} elements", unit);
  std::vector<std::int64_t> first(counts.size() + 1, 0);
  for (std::size_t i = 0; i < counts.size(); ++i) {
    QUINTET_CHECK(counts[i] >= 0, "multi_tensor: tensor {} has {} elements", i, counts[i]);
    first[i + 1] = first[i] + units_of(counts[i], unit);
  }
  return first;
}

// The tensor holding unit u (0 <= u < first[tensors]): the last t with first[t] <= u, by
// bisection. A tensor without elements has no units and is never the answer.
QUINTET_HOST_DEVICE inline int tensor_of_unit(const std::int64_t* first, int tensors,
                                              std::int64_t u) {
  int low = 0, high = tensors - 1;  // the answer lies in [low, high]
  while (low < high) {
    const int middle = low + (high - low + 1) / 2;
    if (first[middle] <= u)
      low = middle;
    else
      high = middle - 1;
  }
  return low;
}

// Unit u's place: its tensor and its first element there (its last is min(begin + unit, count)).
struct unit_place {
  int tensor;
  std::int64_t begin;
};
QUINTET_HOST_DEVICE inline unit_place locate(const std::int64_t* first, int tensors,
                                             std::int64_t unit, std::int64_t u) {
  const int t = tensor_of_unit(first, tensors, u);
  return {t, (u - first[t]) * unit};
}

// Tensors [begin, end) of the list: one launch's.
struct group {
  std::size_t begin, end;
  std::size_t size() const { return end - begin; }
};

// Consecutive groups of at most `capacity` tensors covering [0, tensors).
inline std::vector<group> groups_of(std::size_t tensors, std::size_t capacity) {
  QUINTET_CHECK(capacity >= 1, "multi_tensor: groups of capacity {}", capacity);
  std::vector<group> groups;
  for (std::size_t begin = 0; begin < tensors; begin += capacity)
    groups.push_back({begin, std::min(tensors, begin + capacity)});
  return groups;
}

}  // namespace quintet::kernels::multi_tensor
