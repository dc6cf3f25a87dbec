// placement: how one parameter is laid out over the device mesh — for each mesh axis, replicated
// or sharded along one of its dimensions. Gradient synchronisation, ZeRO, clipping (count each
// element once) and checkpoint resharding read it; initialisation turns it into the rank's region.
//
//   weight (out=8, in=4), sharded on dim 0 over tp=2:   tp rank 0 owns rows [0, 4)
//                                                       tp rank 1 owns rows [4, 8)
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/core/shape.hpp>
#include <quintet/tensor/region.hpp>

#include <array>
#include <cstdint>
#include <string_view>

namespace quintet::parallel {

// The axes of the device mesh a parameter can be sharded over.
enum class mesh_axis : std::uint8_t { dp, pp, tp, sp, ep };
inline constexpr int mesh_axis_count = 5;

constexpr std::string_view name_of(mesh_axis axis) {
  constexpr std::string_view names[] = {"dp", "pp", "tp", "sp", "ep"};
  return names[static_cast<int>(axis)];
}

// Where this rank sits on one axis: the axis' degree and the rank's coordinate along it.
struct axis_position {
  std::int64_t degree = 1;
  std::int64_t coordinate = 0;
};
using mesh_position = std::array<axis_position, mesh_axis_count>;

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

  // The block of a tensor of shape `global` this rank holds. Axes are applied in the order dp, pp,
  // tp, sp, ep; two axes sharding one dimension split it hierarchically (the later axis inside the
  // earlier one's piece). Degrees must divide the sharded extents.
  region local_region(const shape& global, const mesh_position& position) const {
    region where(global);
    for (int a = 0; a < mesh_axis_count; ++a) {
      if (dims_[a] == replicated_dim) continue;
      const axis_position& p = position[a];
      QUINTET_CHECK(dims_[a] < global.rank(),
                    "placement: dimension {} sharded over {} does not exist in shape {}", dims_[a],
                    name_of(static_cast<mesh_axis>(a)), global);
      QUINTET_CHECK(where.local_shape()[dims_[a]] % p.degree == 0,
                    "placement: dimension {} of extent {} does not divide over {} = {}", dims_[a],
                    where.local_shape()[dims_[a]], name_of(static_cast<mesh_axis>(a)), p.degree);
      where = where.chunk(dims_[a], p.degree, p.coordinate);
    }
    return where;
  }

  friend bool operator==(const placement&, const placement&) = default;

 private:
  static int index(mesh_axis axis) { return static_cast<int>(axis); }

  std::array<int, mesh_axis_count> dims_{replicated_dim, replicated_dim, replicated_dim,
                                         replicated_dim, replicated_dim};
};

}  // namespace quintet::parallel
