// How one pass covers a list of tensors (the optimizer updates, the squared norms of every
// gradient, mixed precision's list convert and accumulate_and_zero: one parallel_for on the host,
// one launch per group of tensors on cuda, instead of one per tensor). Each tensor's elements are
// cut into units of `unit` elements from its own start (its last unit shorter), and the units of
// all tensors are numbered in list order:
//
//   counts  [ 5          | 0 | 12                            ]     unit = 4
//   units   [ 0    | 1   |   | 2    | 3    | 4    ]                first = {0, 2, 2, 5}
//
// A unit never spans two tensors and starts at a multiple of `unit` in its tensor, so the work on
// it is the single-tensor kernel's on that range (the same bits), and a unit that is a multiple of
// the vector lanes keeps each tensor's 16-byte alignment. A cuda launch carries at most `capacity`
// tensors in its parameters (a fixed-size struct, under the 4 KiB every toolkit accepts); a longer
// list takes consecutive groups (plan_launches, which also checks each group's blocks). Plain C++,
// tested on the host; the lookups run on both.
#pragma once

#include <quintet/core/config.hpp>
#include <quintet/core/error.hpp>
#include <quintet/kernels/execution.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace quintet::kernels::multi_tensor {

// Elements per unit of an elementwise pass over a list (the optimizer updates, convert,
// accumulate; not tuned): a multiple of every vector width, so each unit keeps its tensor's 16-byte
// alignment on cuda, where a 256-thread block takes 8 chunks of 4 floats a thread; on the host 8
// units are the 2^16 elements worth waking a thread for.
inline constexpr std::int64_t elementwise_unit = std::int64_t{1} << 13;

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

// The element counts of a list of records that carry theirs as `count`.
template <class Record>
std::vector<std::int64_t> counts_of(std::span<const Record> records) {
  std::vector<std::int64_t> counts;
  counts.reserve(records.size());
  for (const Record& r : records) counts.push_back(r.count);
  return counts;
}

// The most blocks, hence units, one cuda launch may have (a grid's x extent).
inline constexpr std::int64_t max_launch_units = 2147483647;

// A list cut into launches: its units numbered (first, as first_units) and its groups of tensors.
struct launch_plan {
  std::vector<std::int64_t> first;
  std::vector<group> groups;

  std::int64_t units(group g) const { return first[g.end] - first[g.begin]; }
  // g's tensors' first units counted from g's start, and at [g.size()] its units: what a
  // launch's parameters carry (`out` holds g.size() + 1).
  void group_first_units(group g, std::int64_t* out) const {
    for (std::size_t i = 0; i <= g.size(); ++i) out[i] = first[g.begin + i] - first[g.begin];
  }
};

// Plans the launches of `what` over tensors of `counts` elements, in units of `unit`, at most
// `capacity` tensors each. Every launch's units are checked against `max_units` here, before the
// caller launches anything, so a list that does not fit changes nothing.
inline launch_plan plan_launches(std::span<const std::int64_t> counts, std::int64_t unit,
                                 std::size_t capacity, const char* what,
                                 std::int64_t max_units = max_launch_units) {
  launch_plan plan{first_units(counts, unit), groups_of(counts.size(), capacity)};
  for (const group g : plan.groups)
    QUINTET_CHECK(plan.units(g) <= max_units,
                  "{}: tensors {} to {} make {} units of {} elements, more than one launch's {} "
                  "blocks",
                  what, g.begin, g.end - 1, plan.units(g), unit, max_units);
  return plan;
}

// The name a list kernel's errors give: the kernel's, and in a list of several which tensor.
inline std::string list_kernel_name(const char* kernel, std::size_t index, std::size_t size) {
  return size == 1 ? std::string(kernel)
                   : quintet::detail::format_message("{} (tensor {} of {})", kernel, index, size);
}

// On the host: pass(record, begin, end) on every unit of every record of the list (records with
// `count`), the units split over exec's threads.
template <class Record, class Pass>
void for_each_unit(const execution<host>& exec, std::span<const Record> records, std::int64_t unit,
                   const Pass& pass) {
  const std::vector<std::int64_t> first = first_units(counts_of(records), unit);
  const int listed = static_cast<int>(records.size());
  exec.parallel_for(first.back(), execution<host>::grain_for(unit),
                    [&](std::int64_t begin, std::int64_t end) {
                      for (std::int64_t u = begin; u < end; ++u) {
                        const unit_place at = locate(first.data(), listed, unit, u);
                        const Record& r = records[static_cast<std::size_t>(at.tensor)];
                        pass(r, at.begin, std::min(at.begin + unit, r.count));
                      }
                    });
}

}  // namespace quintet::kernels::multi_tensor
