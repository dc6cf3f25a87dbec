// placement: how one parameter is laid out over the device mesh — for each mesh axis, replicated
// or sharded along one of its dimensions; the axes its gradient is partial over after backward
// (summed once per step); which pipeline stages hold it; and its logical shape when the stored one
// is padded (a vocabulary padded to a multiple of tp). Gradient synchronisation, ZeRO, clipping
// (count each element once) and checkpoint resharding read it; initialisation turns it into the
// rank's region.
//
//   weight (out=8, in=4), sharded on dim 0 over tp=2:   tp rank 0 owns rows [0, 4)
//                                                       tp rank 1 owns rows [4, 8)
//   token table (10, d) stored as (12, d) over tp=4:    logical shape (10, d); rank 3 holds ids
//                                                       [9, 12), of which 10 and 11 are padding
//   experts.5.fc.weight, 8 experts over ep=4:           owned by ep rank 2: held whole there,
//                                                       absent on ep ranks 0, 1, 3
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/core/shape.hpp>
#include <quintet/mesh/mesh_axis.hpp>
#include <quintet/mesh/mesh_layout.hpp>
#include <quintet/tensor/region.hpp>

#include <array>
#include <bit>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string_view>
#include <vector>

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
    QUINTET_CHECK(!is_owned(axis),
                  "placement: a tensor owned by {} rank {} cannot also be sharded over {}",
                  name_of(axis), owner(axis), name_of(axis));
    placement out = *this;
    out.dims_[index(axis)] = dim;
    return out;
  }

  // This placement, held whole by the ranks whose coordinate on `axis` is `coordinate` and by no
  // other rank of an `axis` group: one expert of a layer whose experts are split over ep. Owning
  // counts as sharding over `axis` (the ranks of a group hold different tensors, so no gradient is
  // summed over it and a norm sums squares over it), without cutting a dimension: the owner's
  // local region is the whole tensor, and local_region() refuses any other coordinate.
  placement owned_by(mesh_axis axis, int coordinate) const {
    QUINTET_CHECK(coordinate >= 0, "placement: owner {} on {} is negative", coordinate,
                  name_of(axis));
    QUINTET_CHECK(dims_[index(axis)] == replicated_dim,
                  "placement: a tensor sharded along dimension {} over {} cannot also be owned by "
                  "one {} rank",
                  dims_[index(axis)], name_of(axis), name_of(axis));
    placement out = *this;
    out.owners_[index(axis)] = coordinate;
    return out;
  }
  // The coordinate on `axis` of the ranks that hold the tensor, or no_owner (every coordinate does:
  // replicated or sharded along a dimension).
  static constexpr int no_owner = -1;
  constexpr int owner(mesh_axis axis) const { return owners_[index(axis)]; }
  constexpr bool is_owned(mesh_axis axis) const { return owners_[index(axis)] != no_owner; }
  // Whether a rank at `position` holds (part of) the tensor: its coordinate is the owner's on every
  // axis with an owner. (Pipeline stages are held_by_stage's business.)
  bool held_at(const mesh_position& position) const {
    for (const mesh_axis axis : all_mesh_axes)
      if (is_owned(axis) && position[index(axis)].coordinate != owner(axis)) return false;
    return true;
  }

  // Sharded along a dimension over `axis`, or owned by one of its ranks.
  constexpr bool is_sharded(mesh_axis axis) const {
    return dims_[index(axis)] != replicated_dim || is_owned(axis);
  }
  constexpr bool is_replicated() const { return sharded_axes().empty(); }
  // The tensor dimension sharded over `axis`, or replicated_dim (also when owned: no dimension is
  // cut).
  constexpr int sharded_dim(mesh_axis axis) const { return dims_[index(axis)]; }
  constexpr mesh_axis_set sharded_axes() const {
    mesh_axis_set axes;
    for (const mesh_axis axis : all_mesh_axes)
      if (is_sharded(axis)) axes = axes.with(axis);
    return axes;
  }

  // This placement, with its gradient partial over `axes` (each rank holding a summand).
  placement partial(mesh_axis_set axes) const {
    placement out = *this;
    out.partial_ = axes;
    return out;
  }
  constexpr mesh_axis_set partial_axes() const { return partial_; }

  // Which pipeline stages hold the parameter: stage 0 alone unless said otherwise (the serial
  // model is one stage); a token table shared by the first and last stage is held by both.
  placement held_by(std::initializer_list<int> stages) const {
    return held_by(std::vector<int>(stages));
  }
  placement held_by(const std::vector<int>& stages) const {
    QUINTET_CHECK(!stages.empty(), "placement: a parameter must be held by at least one stage");
    placement out = *this;
    out.stages_ = 0;
    for (const int stage : stages) {
      QUINTET_CHECK(stage >= 0 && stage < max_stages, "placement: stage {} is outside [0, {})",
                    stage, max_stages);
      out.stages_ |= std::uint64_t{1} << stage;
    }
    return out;
  }
  constexpr bool held_by_stage(int stage) const {
    return stage >= 0 && stage < max_stages && ((stages_ >> stage) & 1u) != 0;
  }
  std::vector<int> stages() const {
    std::vector<int> out;
    for (int stage = 0; stage < max_stages; ++stage)
      if (held_by_stage(stage)) out.push_back(stage);
    return out;
  }
  // The stage that is to count the parameter once when several hold it (the gradient norm over
  // pp and checkpoints, with pipeline parallelism).
  constexpr int first_stage() const { return std::countr_zero(stages_); }

  // The shape a checkpoint or a comparison with the serial model sees: the stored global shape
  // cut to `logical` (rows of a padded vocabulary dropped). Every extent must fit in the stored
  // one.
  placement with_logical_shape(const shape& logical) const {
    placement out = *this;
    out.logical_ = logical;
    return out;
  }
  shape logical_shape(const shape& global) const {
    if (!logical_) return global;
    QUINTET_CHECK(logical_->rank() == global.rank(),
                  "placement: logical shape {} and stored shape {} differ in rank", *logical_,
                  global);
    for (int d = 0; d < global.rank(); ++d)
      QUINTET_CHECK((*logical_)[d] <= global[d],
                    "placement: logical shape {} does not fit in the stored shape {}", *logical_,
                    global);
    return *logical_;
  }

  // The block of a tensor of shape `global` this rank holds. Axes are applied in the order of
  // all_mesh_axes (tp, sp, dp, pp, ep, edp); two axes sharding one dimension split it
  // hierarchically (dp inside the tp piece, as ZeRO-3 over a tensor-parallel shard does). Degrees
  // must divide the sharded extents. A tensor owned on an axis is whole on its owner; asking for
  // the region of another rank of that axis is an error (it holds none: see held_at).
  region local_region(const shape& global, const mesh_position& position) const {
    region where(global);
    for (const mesh_axis axis : all_mesh_axes) {
      if (is_owned(axis)) {
        const axis_position& p = position[index(axis)];
        QUINTET_CHECK(owner(axis) < p.degree,
                      "placement: owner {} on {} is outside the axis' {} ranks", owner(axis),
                      name_of(axis), p.degree);
        QUINTET_CHECK(p.coordinate == owner(axis),
                      "placement: the tensor is held by {} rank {} only, not by {} rank {}",
                      name_of(axis), owner(axis), name_of(axis), p.coordinate);
      }
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
  static constexpr int max_stages = 64;
  static constexpr std::size_t index(mesh_axis axis) { return static_cast<std::size_t>(axis); }

  std::array<int, all_mesh_axes.size()> dims_ = [] {
    std::array<int, all_mesh_axes.size()> dims{};
    dims.fill(replicated_dim);
    return dims;
  }();
  std::array<int, all_mesh_axes.size()> owners_ = [] {
    std::array<int, all_mesh_axes.size()> owners{};
    owners.fill(no_owner);
    return owners;
  }();
  mesh_axis_set partial_;
  std::uint64_t stages_ = 1;  // bit s: stage s holds it
  std::optional<shape> logical_;
};

}  // namespace quintet::parallel
