// The global gradient norm of a model laid out over a mesh: every element of the serial model
// counted once. Each parameter's squares are summed locally with the others sharded over the same
// axes; each such sum is all-reduced over the product group of its axes (replicated parameters
// hold the same gradient on every rank and are not reduced). A parameter sharded over an axis no
// policy of the plan uses is refused: its layout does not match the plan.
//
// Under pipeline parallelism a rank holds the parameters of its stages only: every set is summed
// over the pp group too, and a parameter several stages hold (the tied token table, on the first
// and the last stage's ranks, each with the same summed gradient) counts on the rank holding the
// first of its stages only, so every element of the serial model is counted once.
//
//   p = 4, 1F1B:  rank 0: embedding (table counted) | ranks 1, 2: blocks | rank 3: head (its copy
//                 of the table not counted)  ->  squares summed over pp
#pragma once

#include <quintet/comm/all_reduce_from_host.hpp>
#include <quintet/comm/communicator.hpp>
#include <quintet/core/error.hpp>
#include <quintet/kernels/execution.hpp>
#include <quintet/kernels/squared_norm.hpp>
#include <quintet/mesh/device_mesh.hpp>
#include <quintet/mesh/mesh_axis.hpp>
#include <quintet/nn/parameter.hpp>
#include <quintet/optim/gradient_norm.hpp>
#include <quintet/parallel/no_mesh.hpp>
#include <quintet/parallel/strategy.hpp>
#include <quintet/tensor/tensor.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <vector>

namespace quintet::parallel {

// `stages_here`: the pipeline stages this rank holds (in increasing order), under a plan with
// pp<...>; empty otherwise, when every parameter must be stage 0's alone.
// Each set's partial sum of squares all-reduced on the product group of its axes (the empty set:
// this rank's sum is the whole), then added up: the square of a norm whose elements are spread
// over those groups. The sets go in the map's order, the same on every rank.
template <mesh_like Mesh>
double sum_over_groups(Mesh& mesh, const std::map<mesh_axis_set, double>& squares) {
  double total = 0.0;
  for (const auto& [axes, sum] : squares) {
    if (axes.empty()) {
      total += sum;
      continue;
    }
    quintet::tensor<double, host> value(shape{1});
    value(0) = sum;
    all_reduce_from_host(mesh.group(axes), value, reduce_op::sum);
    total += value(0);
  }
  return total;
}

// Under pp every rank must reduce the same sets in the same order, but a rank holds its own
// stages' parameters only (a stage may lack, say, every tp-sharded parameter): the sets any rank
// of the pp group has become every rank's, through one all-reduce of a flag per set.
template <mesh_like Mesh>
void unite_over_pp(Mesh& mesh, std::map<mesh_axis_set, double>& squares) {
  constexpr std::size_t subsets = std::size_t{1} << all_mesh_axes.size();
  const auto subset = [](std::size_t index) {
    mesh_axis_set out;
    for (std::size_t k = 0; k < all_mesh_axes.size(); ++k)
      if ((index >> k) & 1u) out = out.with(all_mesh_axes[k]);
    return out;
  };
  quintet::tensor<std::int32_t, host> present(shape{static_cast<std::int64_t>(subsets)});
  for (std::size_t i = 0; i < subsets; ++i)
    present(static_cast<std::int64_t>(i)) = squares.contains(subset(i)) ? 1 : 0;
  all_reduce_from_host(mesh.pp(), present, reduce_op::max);
  for (std::size_t i = 0; i < subsets; ++i)
    if (present(static_cast<std::int64_t>(i)) != 0) squares.try_emplace(subset(i), 0.0);
}

template <class Plan, class T, class Device, mesh_like Mesh>
double global_gradient_norm(const execution<Device>& exec,
                            const nn::parameter_registry<T, Device>& registry, Mesh& mesh,
                            const std::vector<int>& stages_here) {
  constexpr bool pipelined = Plan::template has<strategy::pipeline>;
  QUINTET_CHECK(pipelined || stages_here.empty(),
                "global_gradient_norm: pipeline stages given, but the plan {} has no pp<...>",
                Plan::name());
  QUINTET_CHECK(!pipelined || !stages_here.empty(),
                "global_gradient_norm: the plan {} is pipelined; give the stages this rank holds",
                Plan::name());
  // Sums in registration order per set of sharded axes (with pp when pipelined: the stages' sums
  // add up over it); sets in order of their bits, the replicated set first.
  const mesh_axis_set over_stages = pipelined ? mesh_axis_set{mesh_axis::pp} : mesh_axis_set{};
  std::map<mesh_axis_set, double> squares;
  std::vector<mesh_axis_set> sets;  // of the gradients counted here, in registration order
  std::vector<tensor_view<const T, Device>> grads;
  for (const auto& p : registry) {
    const std::vector<int> held = p.placement.stages();
    if constexpr (pipelined) {
      const auto here = [&](int stage) {
        return std::find(stages_here.begin(), stages_here.end(), stage) != stages_here.end();
      };
      QUINTET_CHECK(std::any_of(held.begin(), held.end(), here),
                    "global_gradient_norm: this rank holds '{}', which none of its pipeline "
                    "stages holds",
                    p.name);
      // Counted by the rank holding the first of its stages (the tied table: stage 0's).
      if (!here(held.front())) continue;
    } else {
      QUINTET_CHECK(held == std::vector<int>{0},
                    "global_gradient_norm: parameter '{}' is held by pipeline stages other than 0 "
                    "alone, but the plan {} has no pp<...>",
                    p.name, Plan::name());
    }
    const mesh_axis_set sharded = p.placement.sharded_axes();
    QUINTET_CHECK(Plan::axes.contains_all(sharded),
                  "global_gradient_norm: parameter '{}' is sharded over {}, but the plan {} runs "
                  "on {} only",
                  p.name, name_of(sharded), Plan::name(), name_of(Plan::axes));
    sets.push_back(sharded | over_stages);
    grads.push_back(p.grad);
  }
  const std::vector<double> sums = kernels::squared_norms(exec, grads);
  for (std::size_t i = 0; i < sums.size(); ++i) squares[sets[i]] += sums[i];
  if constexpr (pipelined) {
    // Every pp rank reduces the same sets, in the same order, whichever parameters it holds.
    squares.try_emplace(over_stages, 0.0);
    for (const auto& p : registry)
      squares.try_emplace(p.placement.sharded_axes() | over_stages, 0.0);
    unite_over_pp(mesh, squares);
  }
  return std::sqrt(sum_over_groups(mesh, squares));
}

template <class Plan, class T, class Device, mesh_like Mesh>
double global_gradient_norm(const execution<Device>& exec,
                            const nn::parameter_registry<T, Device>& registry, Mesh& mesh) {
  return global_gradient_norm<Plan>(exec, registry, mesh, {});
}

// The serial model: every parameter whole on the one rank.
template <class Plan, class T, class Device>
double global_gradient_norm(const execution<Device>& exec,
                            const nn::parameter_registry<T, Device>& registry, no_mesh&) {
  return optim::global_gradient_norm(exec, registry);
}

}  // namespace quintet::parallel
