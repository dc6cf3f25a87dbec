// data_parallel_runtime: what parallel::dp<zero<S>> does to a step once backward has produced the
// gradients — reduce them over the ranks that hold summands, in buckets launched while backward
// still runs; under ZeRO, update only the range each rank owns, then gather the parameters.
//
// The registry is flattened with layout(): buckets of at most `bucket_elements` elements, cut at
// parameter boundaries in registration order (embedding .. head), so backward, which runs head
// first, completes the last buckets first. Each bucket is reduced over the product group of its
// partial axes (dp, with sp or tp where the plan leaves those partial too: one collective):
//
//   zero<0>  all-reduce in place; every rank updates every element (DDP)
//   zero<1>  reduce-scatter; this rank's reduced shard is copied back into its range of the
//            gradient buffer, where the optimizer, whose state covers that range only, reads it;
//            after the update, all-gather the parameters
//   zero<2>  reduce-scatter into a shard buffer the optimizer reads; the full gradient buffers
//            are dropped until the next step's zero_grad (only the shards live between steps)
//   zero<3>  parameters sharded between uses: not implemented (refused at construction)
//
//   bucket of 12 elements (padded), group of 3:  [ rank 0 | rank 1 | rank 2 ]  shards of 4
//   a parameter at [3, 9) -> rank 0 owns its elements [0, 1), rank 1 [1, 5), rank 2 [5, 6)
//
// A bucket is launched once every parameter in it has been announced ready `micro_batches` times
// (nn::gpt_stage::on_gradients_ready): after the last micro-batch's backward of its piece, whatever
// the order the micro-batches run in. Every rank announces in the same order, so the collectives
// of a group are posted in the same order everywhere.
#pragma once

#include <quintet/comm/all_reduce_from_host.hpp>
#include <quintet/comm/comm_request.hpp>
#include <quintet/comm/communicator.hpp>
#include <quintet/core/error.hpp>
#include <quintet/kernels/execution.hpp>
#include <quintet/kernels/squared_norm.hpp>
#include <quintet/mesh/mesh_axis.hpp>
#include <quintet/mesh/mesh_like.hpp>
#include <quintet/nn/parameter.hpp>
#include <quintet/optim/adamw.hpp>
#include <quintet/parallel/flat_sharding.hpp>
#include <quintet/parallel/gradient_norm.hpp>
#include <quintet/tensor/copy.hpp>
#include <quintet/tensor/slice.hpp>
#include <quintet/tensor/tensor.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

namespace quintet::parallel {

struct data_parallel_options {
  int zero_stage = 0;
  std::int64_t bucket_elements = 0;  // 0: one bucket per set of partial axes
};

// Bytes one rank holds between steps, by kind (parameters, gradients, AdamW's two moments).
struct data_parallel_memory {
  std::int64_t parameters = 0;
  std::int64_t gradients = 0;
  std::int64_t optimizer_state = 0;

  std::int64_t total() const { return parameters + gradients + optimizer_state; }
};

// When the buckets of the last step were launched, and when backward ended (finish_reduction()
// was called): the overlap, as measured. `launched_early` counts the buckets launched while some
// gradient of the step was still to be computed — reductions that can overlap backward.
struct reduction_timeline {
  using clock = std::chrono::steady_clock;
  std::vector<clock::time_point> launches;  // in launch order
  clock::time_point backward_end{};
  std::int64_t launched_early = 0;
};

template <class T, class Device, mesh_like Mesh>
class data_parallel_runtime {
  using comm_type = std::remove_reference_t<decltype(std::declval<Mesh&>().dp())>;
  using state_type = kernels::accumulator_t<T>;

 public:
  // How the registry must be flattened for `options`.
  static nn::bucket_layout layout(const data_parallel_options& options) {
    return {.max_elements = options.bucket_elements, .shardable = options.zero_stage >= 1};
  }

  // `registry` must already be flattened with layout(options).
  data_parallel_runtime(nn::parameter_registry<T, Device>& registry, Mesh& mesh,
                        const data_parallel_options& options)
      : registry_(registry), mesh_(mesh), options_(options) {
    QUINTET_CHECK(options.zero_stage >= 0 && options.zero_stage <= 3,
                  "data parallelism: ZeRO stage {} is not one of 0, 1, 2, 3", options.zero_stage);
    QUINTET_CHECK(options.zero_stage != 3,
                  "data parallelism: ZeRO stage 3 (parameters sharded between uses) is not "
                  "implemented yet; stages 0, 1 and 2 are");
    QUINTET_CHECK(options.bucket_elements >= 0,
                  "data parallelism: a bucket of {} elements; give a positive size (or 0: one "
                  "bucket per set of partial axes)",
                  options.bucket_elements);
    QUINTET_CHECK(registry.flattened(),
                  "data parallelism: flatten the registry with data_parallel_runtime::layout() "
                  "first");
    auto& buckets = registry.buckets();
    slots_.resize(buckets.size());
    for (std::size_t b = 0; b < buckets.size(); ++b) {
      auto& bucket = buckets[b];
      bucket_slot& slot = slots_[b];
      // Made now, on every rank in the same order: a product group is split from the world.
      slot.group = &mesh.group(bucket.partial_axes);
      for (std::size_t i = 0; i < bucket.parameters.size(); ++i)
        announcements_[bucket.parameters[i]] = {.bucket = b};
      if (sharded()) {
        slot.sharding = flat_sharding::of(bucket.values.numel(), slot.group->size());
        QUINTET_CHECK(slot.sharding.padded == bucket.values.numel(),
                      "data parallelism: bucket {} of {} elements does not split over {} ranks; "
                      "flatten the registry with data_parallel_runtime::layout()",
                      b, bucket.values.numel(), slot.group->size());
        if (options.zero_stage >= 2) {
          slot.shard = quintet::tensor<T, Device>(shape{slot.sharding.per_rank});
          fill(slot.shard, T(0));
        }
      }
    }
    // The norm's groups too: each parameter's sharded axes with its bucket's partial axes.
    for (std::size_t b = 0; b < buckets.size(); ++b)
      for (auto* p : buckets[b].parameters)
        mesh.group(p->placement.sharded_axes() | buckets[b].partial_axes);
  }

  int zero_stage() const { return options_.zero_stage; }
  bool sharded() const { return options_.zero_stage >= 1; }

  // Under ZeRO: `optimizer` keeps state for, and updates, only this rank's shard of each bucket,
  // reading its reduced gradient from the shard. Call before the first step.
  void own_optimizer_state(optim::adamw<T, Device>& optimizer) {
    if (!sharded()) return;
    auto& buckets = registry_.buckets();
    for (std::size_t b = 0; b < buckets.size(); ++b) {
      const auto& bucket = buckets[b];
      bucket_slot& slot = slots_[b];
      const flat_range mine = slot.sharding.owned(slot.group->rank());
      for (std::size_t i = 0; i < bucket.parameters.size(); ++i) {
        const auto* p = bucket.parameters[i];
        const flat_range owned = owned_range(bucket.offsets[i], p->value.numel(), mine);
        const std::int64_t in_shard = bucket.offsets[i] + owned.begin - mine.begin;
        optimizer.own(p->name, owned,
                      owned.size() == 0 || options_.zero_stage < 2
                          ? tensor_view<T, Device>{}
                          : slice(slot.shard, 0, in_shard, in_shard + owned.size()));
      }
    }
  }

  // Before a step's first backward (and before its zero_grad): each parameter is to be announced
  // `micro_batches` times. A step that threw midway leaves reductions in flight on the gradient
  // buffers: they are completed (their errors dropped: the step already failed) before anything
  // touches those buffers again.
  void begin_step(int micro_batches) {
    QUINTET_CHECK(micro_batches >= 1, "data parallelism: {} micro-batches", micro_batches);
    if (in_step_) {
      for (auto& slot : slots_) {
        try {
          slot.request.wait();
        } catch (...) {
        }
        if (options_.zero_stage == 1) slot.shard = {};  // ZeRO-1's shard lives for a step
      }
    }
    in_step_ = true;
    auto& buckets = registry_.buckets();
    for (std::size_t b = 0; b < buckets.size(); ++b) {
      slots_[b].parameters_left = static_cast<std::int64_t>(buckets[b].parameters.size());
      slots_[b].launched = false;
    }
    for (auto& [p, count] : announcements_) count.left = micro_batches;
    timeline_ = {};
  }

  // nn::gpt_stage's hook: these parameters' gradients of one micro-batch are complete.
  void gradients_ready(std::span<nn::parameter<T, Device>* const> parameters) {
    if (!in_step_) return;  // a backward outside train steps (tests of the model alone)
    for (auto* p : parameters) {
      const auto found = announcements_.find(p);
      QUINTET_CHECK(found != announcements_.end(),
                    "data parallelism: parameter '{}' is not in the registry's buckets", p->name);
      announcement_count& count = found->second;
      QUINTET_CHECK(count.left > 0,
                    "data parallelism: parameter '{}' was announced ready more often than its "
                    "micro-batches",
                    p->name);
      // A bucket goes once each of its parameters has had all its micro-batches.
      if (--count.left == 0 && --slots_[count.bucket].parameters_left == 0)
        launch(count.bucket, true);
    }
  }

  // After the last backward: launches what was not announced (in bucket order), waits for every
  // reduction; under ZeRO-2 drops the full gradient buffers.
  void finish_reduction() {
    QUINTET_CHECK(in_step_, "data parallelism: finish_reduction() without begin_step()");
    timeline_.backward_end = reduction_timeline::clock::now();
    for (std::size_t b = 0; b < slots_.size(); ++b)
      if (!slots_[b].launched) launch(b, false);
    auto& buckets = registry_.buckets();
    for (std::size_t b = 0; b < slots_.size(); ++b) {
      bucket_slot& slot = slots_[b];
      slot.request.wait();
      if (options_.zero_stage == 1) {
        const flat_range mine = slot.sharding.owned(slot.group->rank());
        copy(slice(buckets[b].grads, 0, mine.begin, mine.end), slot.shard);
        slot.shard = {};
      }
    }
    if (options_.zero_stage >= 2) registry_.release_gradients();
    in_step_ = false;
  }

  // The global norm of the reduced gradient, every element of the serial model counted once.
  template <class Plan>
  double gradient_norm(const execution<Device>& exec) {
    if (!sharded()) return global_gradient_norm<Plan>(exec, registry_, mesh_);
    for (const auto& p : registry_)
      QUINTET_CHECK(Plan::axes.contains_all(p.placement.sharded_axes()),
                    "gradient norm: parameter '{}' is sharded over {}, but the plan {} runs on {} "
                    "only",
                    p.name, name_of(p.placement.sharded_axes()), Plan::name(), name_of(Plan::axes));
    // Each rank's shard: a parameter's owned range is unique over its bucket's group, and its
    // blocks over its sharded axes; summed over the union of the two.
    std::map<mesh_axis_set, double> squares;
    auto& buckets = registry_.buckets();
    for (std::size_t b = 0; b < buckets.size(); ++b) {
      const auto& bucket = buckets[b];
      const bucket_slot& slot = slots_[b];
      const flat_range mine = slot.sharding.owned(slot.group->rank());
      for (std::size_t i = 0; i < bucket.parameters.size(); ++i) {
        const auto* p = bucket.parameters[i];
        const mesh_axis_set axes = p->placement.sharded_axes() | bucket.partial_axes;
        const flat_range owned = owned_range(bucket.offsets[i], p->value.numel(), mine);
        double& sum = squares[axes];
        if (owned.size() == 0) continue;
        const std::int64_t in_shard = bucket.offsets[i] + owned.begin - mine.begin;
        sum += kernels::squared_norm(exec,
                                     slice(reduced_shard(b), 0, in_shard, in_shard + owned.size()));
      }
    }
    return std::sqrt(sum_over_groups(mesh_, squares));
  }

  // Under ZeRO, after the optimizer updated each rank's shard: every rank's parameters whole
  // again (all-gather of each bucket's values over its group).
  void gather_parameters() {
    if (!sharded()) return;
    auto& buckets = registry_.buckets();
    std::vector<quintet::tensor<T, Device>> sent;
    std::vector<comm_request> requests;
    sent.reserve(buckets.size());
    for (std::size_t b = 0; b < buckets.size(); ++b) {
      auto& bucket = buckets[b];
      const bucket_slot& slot = slots_[b];
      const flat_range mine = slot.sharding.owned(slot.group->rank());
      // The shard is sent from a copy: the output is the bucket it sits in.
      quintet::tensor<T, Device>& copy_of_mine = sent.emplace_back(shape{mine.size()});
      copy(copy_of_mine, slice(bucket.values, 0, mine.begin, mine.end));
      requests.push_back(slot.group->all_gather_async(copy_of_mine, bucket.values));
    }
    for (auto& request : requests) request.wait();
  }

  // What this rank holds between steps (the registry's buffers, the shards, AdamW's moments in
  // the accumulator type), padding included.
  data_parallel_memory memory() {
    data_parallel_memory out;
    for (std::size_t b = 0; b < slots_.size(); ++b) {
      const auto& bucket = registry_.buckets()[b];
      const std::int64_t elements = bucket.values.numel();
      const std::int64_t optimized = sharded() ? slots_[b].sharding.per_rank : elements;
      out.parameters += elements * static_cast<std::int64_t>(sizeof(T));
      out.gradients +=
          (held(bucket.grads) + held(slots_[b].shard)) * static_cast<std::int64_t>(sizeof(T));
      out.optimizer_state += 2 * optimized * static_cast<std::int64_t>(sizeof(state_type));
    }
    return out;
  }

  const reduction_timeline& timeline() const { return timeline_; }
  std::size_t bucket_count() const { return slots_.size(); }

 private:
  struct bucket_slot {
    comm_type* group = nullptr;        // the product group of the bucket's partial axes
    flat_sharding sharding{};          // ZeRO: the bucket's shards over the group
    quintet::tensor<T, Device> shard;  // this rank's reduced shard (ZeRO-2; ZeRO-1 in a step)
    std::int64_t parameters_left = 0;  // with micro-batches still to announce, this step
    bool launched = false;
    comm_request request{};
  };

  // The part of a parameter at [offset, offset + numel) of its bucket inside `mine`, relative to
  // the parameter's first element (empty when none).
  static flat_range owned_range(std::int64_t offset, std::int64_t numel, flat_range mine) {
    const std::int64_t begin = std::clamp(mine.begin - offset, std::int64_t{0}, numel);
    const std::int64_t end = std::clamp(mine.end - offset, begin, numel);
    return {begin, end};
  }

  // This rank's reduced shard of bucket b's gradient: in its own buffer (ZeRO-2) or in its range
  // of the gradient buffer (ZeRO-1).
  tensor_view<T, Device> reduced_shard(std::size_t b) {
    if (options_.zero_stage >= 2) return slots_[b].shard.view();
    const flat_range mine = slots_[b].sharding.owned(slots_[b].group->rank());
    return slice(registry_.buckets()[b].grads, 0, mine.begin, mine.end);
  }

  // Elements a tensor holds (none when it has no storage: a released or unused buffer).
  static std::int64_t held(const quintet::tensor<T, Device>& t) {
    return t.data() == nullptr ? 0 : t.numel();
  }

  // `announced`: launched by the last announcement of its parameters (not by finish_reduction).
  void launch(std::size_t b, bool announced) {
    auto& bucket = registry_.buckets()[b];
    bucket_slot& slot = slots_[b];
    slot.launched = true;
    timeline_.launches.push_back(reduction_timeline::clock::now());
    if (announced && std::any_of(slots_.begin(), slots_.end(), [](const bucket_slot& other) {
          return other.parameters_left > 0;
        }))
      ++timeline_.launched_early;
    if (sharded()) {
      // ZeRO-1 receives into a shard buffer of the step only (copied into the gradient buffer).
      if (options_.zero_stage == 1)
        slot.shard = quintet::tensor<T, Device>(shape{slot.sharding.per_rank});
      slot.request = slot.group->reduce_scatter_async(bucket.grads, slot.shard, reduce_op::sum);
    } else {
      slot.request = slot.group->all_reduce_async(bucket.grads, reduce_op::sum);
    }
  }

  nn::parameter_registry<T, Device>& registry_;
  Mesh& mesh_;
  data_parallel_options options_;
  std::vector<bucket_slot> slots_;
  struct announcement_count {
    std::size_t bucket = 0;
    std::int64_t left = 0;  // micro-batches of this step not yet announced
  };
  std::unordered_map<const nn::parameter<T, Device>*, announcement_count> announcements_;
  bool in_step_ = false;
  reduction_timeline timeline_;
};

}  // namespace quintet::parallel
