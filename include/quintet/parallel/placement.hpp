// placement: how one parameter is laid out over the device mesh — for each mesh axis, replicated
// or sharded along one of its dimensions. Gradient synchronisation, ZeRO, clipping (count each
// element once) and checkpoint resharding read it; initialisation turns it into the rank's region.
//
//   weight (out=8, in=4), sharded on dim 0 over tp=2:   tp rank 0 owns rows [0, 4)
//                                                       tp rank 1 owns rows [4, 8)
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/core/shape.hpp>
#include <quintet/mesh/mesh_layout.hpp>
#include <quintet/tensor/region.hpp>

#include <array>
#include <cstdint>
#include <string_view>

namespace quintet::parallel {

// Where this rank sits on one axis of the mesh: the axis' degree and the rank's coordinate on it.
struct axis_position {
  std::int64_t degree = 1;
  std::int64_t coordinate = 0;
};

// Indexed by mesh_axis; every axis of degree 1 by default (the serial model).
using mesh_position = std::array<axis_position, all_mesh_axes.size()>;

inline axis_position& position_on(mesh_position& position, mesh_axis axis) {
  return position[static_cast<std::size_t>(axis)];
}

// The position of world rank `rank` in a mesh layout.
inline mesh_position position_in(const mesh_layout& layout, int rank) {
  mesh_position position{};
  for (const mesh_axis axis : all_mesh_axes)
    position_on(position, axis) = {layout.size(axis), layout.index_in_group(axis, rank)};
  return position;
}

class placement {
 public:
  static constexpr int replicated_dim = -1;

  // Replicated on every axis: every rank holds the whole tensor.
  static placement replicated() { return placement(); }

  // This placement, additionally sharded along tensor dimension `dim` over `axis`.
  placement sharded(mesh_axis axis, int dim) const {
    QUINTET_CHECK(dim >= 0 && dim < shape::max_rank, "placement: dimension {} cannot be sharded",
                  dim);
    placement out = *this;
    out.dims_[index(axis)] = dim;
    return out;
  }

  bool is_sharded(mesh_axis axis) const { return dims_[index(axis)] != replicated_dim; }
  bool is_replicated() const {
    for (const int dim : dims_)
      if (dim != replicated_dim) return false;
    return true;
  }
  // The tensor dimension sharded over `axis`, or replicated_dim.
  int sharded_dim(mesh_axis axis) const { return dims_[index(axis)]; }

  // The block of a tensor of shape `global` this rank holds. Axes are applied in the order of
  // all_mesh_axes (tp, sp, dp, pp, ep, edp); two axes sharding one dimension split it
  // hierarchically (dp inside the tp piece, as ZeRO-3 over a tensor-parallel shard does). Degrees
  // must divide the sharded extents.
  region local_region(const shape& global, const mesh_position& position) const {
    region where(global);
    for (const mesh_axis axis : all_mesh_axes) {
      const int dim = dims_[index(axis)];
      if (dim == replicated_dim) continue;
      const axis_position& p = position[index(axis)];
      QUINTET_CHECK(dim < global.rank(),
                    "placement: dimension {} sharded over {} does not exist in shape {}", dim,
                    name_of(axis), global);
      QUINTET_CHECK(where.local_shape()[dim] % p.degree == 0,
                    "placement: dimension {} of extent {} does not divide over {} = {}", dim,
                    where.local_shape()[dim], name_of(axis), p.degree);
      where = where.chunk(dim, p.degree, p.coordinate);
    }
    return where;
  }

  friend bool operator==(const placement&, const placement&) = default;

 private:
  static std::size_t index(mesh_axis axis) { return static_cast<std::size_t>(axis); }

  std::array<int, all_mesh_axes.size()> dims_ = [] {
    std::array<int, all_mesh_axes.size()> dims{};
    dims.fill(replicated_dim);
    return dims;
  }();
};

}  // namespace quintet::parallel
