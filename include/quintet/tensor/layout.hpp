// Strided layouts reduced to what memory engines understand: runs of contiguous elements.
// copy collapses two layouts together; host loops walk one layout row by row.
#pragma once

#include <quintet/core/shape.hpp>

#include <array>
#include <cstdint>

namespace quintet::detail {

// Two strided layouts of one shape with their dimensions merged wherever both are dense across
// the boundary, and dimensions of extent 1 dropped. The innermost dimension has unit stride in
// both (a unit dimension is appended when the real innermost one does not).
struct paired_layout {
  using index_array = std::array<std::int64_t, shape::max_rank + 1>;  // room for the unit dim
  int rank = 0;
  index_array extent{}, stride_a{}, stride_b{};
};

inline paired_layout pair_layouts(const shape& extents, const shape::index_array& strides_a,
                                  const shape::index_array& strides_b) {
  paired_layout out;
  for (int d = 0; d < extents.rank(); ++d) {
    if (extents[d] == 1) continue;
    const int last = out.rank - 1;
    if (out.rank > 0 && out.stride_a[last] == extents[d] * strides_a[d] &&
        out.stride_b[last] == extents[d] * strides_b[d]) {
      out.extent[last] *= extents[d];
      out.stride_a[last] = strides_a[d];
      out.stride_b[last] = strides_b[d];
      continue;
    }
    out.extent[out.rank] = extents[d];
    out.stride_a[out.rank] = strides_a[d];
    out.stride_b[out.rank] = strides_b[d];
    ++out.rank;
  }
  const bool unit_inner =
      out.rank > 0 && out.stride_a[out.rank - 1] == 1 && out.stride_b[out.rank - 1] == 1;
  if (!unit_inner) {
    out.extent[out.rank] = 1;
    out.stride_a[out.rank] = 1;
    out.stride_b[out.rank] = 1;
    ++out.rank;
  }
  return out;
}

// Calls row(coordinates, offset) for every innermost row of a strided host layout: coordinates
// has the innermost coordinate 0, offset is the element offset of the row's first element.
// A rank-0 layout is one row of one element.
template <class Row>
void for_each_row(const shape& extents, const shape::index_array& strides, Row&& row) {
  if (extents.numel() == 0) return;
  shape::index_array coordinates{};
  const int outer = extents.rank() - 1;  // dimensions iterated by the odometer
  while (true) {
    std::int64_t offset = 0;
    for (int d = 0; d < outer; ++d) offset += coordinates[d] * strides[d];
    row(coordinates, offset);
    int d = outer - 1;
    while (d >= 0 && ++coordinates[d] == extents[d]) coordinates[d--] = 0;
    if (d < 0) return;
  }
}

}  // namespace quintet::detail
