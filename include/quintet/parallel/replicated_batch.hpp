// check_replicated_batch<Plan>: on the axes the plan does not split the batch over (tp, sp), every
// rank is given the whole micro-batch and picks its rows itself (the sequence styles' layouts);
// pp's ranks are too, but they run their stages' forwards at different times, so a pipeline
// compares its step's micro-batches once before the step instead (micro_batch_hash and
// require_same_batches over pp; train::gpt_pipeline), not here (Plan::batch_checked_axes). A
// loader that hands ranks different batches — its own rows, say, as other libraries' sequence
// parallelism expects, or one that drifts after a resume — would otherwise train on garbage
// silently. Each forward, each rank hashes the shapes and ids of its tokens and targets; one
// all-reduce of (hash, -hash) under max per such axis tells every rank whether all hashes agree,
// so all ranks throw together (none is left waiting in a collective). The cost: a host copy of the
// ids and a 16-byte all-reduce per axis.
#pragma once

#include <quintet/comm/all_reduce_from_host.hpp>
#include <quintet/comm/communicator.hpp>
#include <quintet/core/error.hpp>
#include <quintet/mesh/mesh_axis.hpp>
#include <quintet/tensor/copy.hpp>
#include <quintet/tensor/tensor.hpp>

#include <cstdint>
#include <string_view>

namespace quintet::parallel {

namespace detail {

// FNV-1a over the shape and then the ids; a 63-bit value, so that its negation is representable.
template <class Device>
std::int64_t batch_hash(tensor_view<const std::int32_t, Device> ids, std::uint64_t hash) {
  const auto mix = [&](std::uint64_t word) {
    hash ^= word;
    hash *= 1099511628211ull;
  };
  mix(static_cast<std::uint64_t>(ids.rank()));
  for (int d = 0; d < ids.rank(); ++d) mix(static_cast<std::uint64_t>(ids.shape()[d]));
  quintet::tensor<std::int32_t, host> on_host(ids.shape());
  copy(on_host, ids);
  for (std::int64_t i = 0; i < on_host.numel(); ++i)
    mix(static_cast<std::uint32_t>(on_host.data()[i]));
  return static_cast<std::int64_t>(hash >> 1);
}

template <class Comm>
void require_same_hash(Comm& group, std::int64_t hash, std::string_view axis) {
  quintet::tensor<std::int64_t, host> extremes(shape{2});
  extremes(0) = hash;
  extremes(1) = -hash;
  all_reduce_from_host(group, extremes, reduce_op::max);
  QUINTET_CHECK(extremes(0) == -extremes(1),
                "the ranks of the {} group were given different micro-batches: every rank of a "
                "plan takes the whole micro-batch (the same tokens and targets) and picks its rows "
                "itself",
                axis);
}

}  // namespace detail

// FNV-1a's offset basis: the hash of no micro-batch.
inline constexpr std::uint64_t no_batch_hash = 14695981039346656037ull;

// The hash of a micro-batch's tokens and targets (shapes and ids), continuing `hash` (chain the
// micro-batches of a step through it).
template <class Device>
std::int64_t micro_batch_hash(tensor_view<const std::int32_t, Device> tokens,
                              tensor_view<const std::int32_t, Device> targets,
                              std::uint64_t hash = no_batch_hash) {
  return detail::batch_hash(targets, static_cast<std::uint64_t>(detail::batch_hash(tokens, hash)));
}

// Raises on every rank of `group` (the ranks of `axis`) unless they all give the same hash.
template <class Comm>
void require_same_batches(Comm& group, std::int64_t hash, std::string_view axis) {
  detail::require_same_hash(group, hash, axis);
}

// tokens, targets (batch, seq): must be the same on every rank of each axis in
// Plan::batch_checked_axes (the replicated axes but the pipeline's).
template <class Plan, class Mesh, class Device>
void check_replicated_batch(Mesh* mesh, tensor_view<const std::int32_t, Device> tokens,
                            tensor_view<const std::int32_t, Device> targets) {
  if constexpr (!Plan::batch_checked_axes.empty()) {
    const std::int64_t hash = micro_batch_hash(tokens, targets);
    Plan::batch_checked_axes.for_each(
        [&](mesh_axis axis) { require_same_batches(mesh->axis(axis), hash, name_of(axis)); });
  }
}

}  // namespace quintet::parallel
