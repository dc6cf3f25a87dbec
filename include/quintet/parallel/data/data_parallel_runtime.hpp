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
//   zero<3>  parameters sharded too: between uses a rank holds only its shard of each bucket's
//            values (the master copy AdamW updates) and gradients. The registry is cut into
//            buckets per piece (layer); the model acquires a piece's buckets before it runs
//            (all-gather of the values, the next piece's gather posted at once: prefetch) and
//            releases them after. In backward each micro-batch's gradient of a piece is
//            reduce-scattered as soon as the piece announces it, added into the rank's shard, and
//            its buffer dropped (the scatter of one piece overlaps the backward of the next)
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
#include <quintet/kernels/elementwise.hpp>
#include <quintet/kernels/execution.hpp>
#include <quintet/kernels/squared_norm.hpp>
#include <quintet/mesh/mesh_axis.hpp>
#include <quintet/mesh/mesh_like.hpp>
#include <quintet/nn/parameter.hpp>
#include <quintet/nn/parameter_access.hpp>
#include <quintet/parallel/flat_sharding.hpp>
#include <quintet/parallel/gradient_norm.hpp>
#include <quintet/parallel/strategy.hpp>
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
#include <string>
#include <unordered_map>
#include <vector>

namespace quintet::parallel {

struct data_parallel_options {
  int zero_stage = 0;
  std::int64_t bucket_elements = 0;  // 0: one bucket per set of partial axes (per piece: ZeRO-3)
};

// The range of a parameter's flattened elements one rank's optimizer updates under ZeRO, and
// where that range's reduced gradient (ZeRO-2, 3) and values (ZeRO-3) live when not in the
// parameter's own views (empty views otherwise): what optim::adamw::own takes.
template <class T, class Device>
struct owned_parameter_range {
  std::string name;
  flat_range range;
  tensor_view<T, Device> gradient{};
  tensor_view<T, Device> value{};
};

// Bytes one rank holds between steps, by kind (parameters, gradients, AdamW's two moments), and
// (ZeRO-3) the most it held at once during the last step in whole buckets gathered for use or
// gradients not yet scattered: the gathered layers on top of the shards.
struct data_parallel_memory {
  std::int64_t parameters = 0;
  std::int64_t gradients = 0;
  std::int64_t optimizer_state = 0;
  std::int64_t peak_gathered = 0;

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

// How a registry must be flattened for `options`: buckets of at most options.bucket_elements,
// padded to split over their groups under ZeRO; under ZeRO-3 cut at the model's pieces (each
// piece's parameters, as nn::gpt_stage::piece_parameters gives them), so no bucket mixes two.
// Parameters of any element type: a mixed-precision model's buckets are cut as its master's.
template <class Parameter>
nn::bucket_layout data_parallel_layout(const data_parallel_options& options,
                                       std::span<const std::vector<Parameter*>> pieces) {
  nn::bucket_layout out;
  out.max_elements = options.bucket_elements;
  out.shardable = options.zero_stage >= 1;
  if (options.zero_stage == 3) {
    QUINTET_CHECK(!pieces.empty(),
                  "data parallelism: ZeRO-3 cuts the buckets at the model's pieces; give them");
    for (std::size_t i = 0; i < pieces.size(); ++i)
      for (const auto* p : pieces[i]) out.piece_of.emplace(p->name, static_cast<int>(i));
  }
  return out;
}

template <class T, class Device, mesh_like Mesh>
class data_parallel_runtime {
  using comm_type = std::remove_reference_t<decltype(std::declval<Mesh&>().dp())>;
  using state_type = kernels::accumulator_t<T>;
  using parameter_type = nn::parameter<T, Device>;

 public:
  // How the registry must be flattened for `options` (data_parallel_layout).
  static nn::bucket_layout layout(const data_parallel_options& options,
                                  std::span<const std::vector<parameter_type*>> pieces = {}) {
    return data_parallel_layout(options, pieces);
  }

  // `registry` must already be flattened with layout(options, ...).
  data_parallel_runtime(nn::parameter_registry<T, Device>& registry, Mesh& mesh,
                        const execution<Device>& exec, const data_parallel_options& options)
      : registry_(registry), mesh_(mesh), exec_(exec), options_(options) {
    QUINTET_CHECK(options.zero_stage >= 0 && options.zero_stage <= 3,
                  "data parallelism: ZeRO stage {} is not one of 0, 1, 2, 3", options.zero_stage);
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
        if (options.zero_stage == 3) {
          // The rank keeps its range of the values; the whole buffers go until a piece uses them.
          const flat_range mine = slot.sharding.owned(slot.group->rank());
          slot.value_shard = quintet::tensor<T, Device>(shape{mine.size()});
          copy(slot.value_shard, slice(bucket.values, 0, mine.begin, mine.end));
          registry.release_values(bucket);
          registry.release_gradients(bucket);
        }
      }
    }
    // The norm's groups too: each parameter's sharded axes with its bucket's partial axes.
    for (std::size_t b = 0; b < buckets.size(); ++b)
      for (auto* p : buckets[b].parameters)
        mesh.group(p->placement.sharded_axes() | buckets[b].partial_axes);
  }
  data_parallel_runtime(nn::parameter_registry<T, Device>&, Mesh&, const execution<Device>&&,
                        const data_parallel_options&) = delete;

  int zero_stage() const { return options_.zero_stage; }
  bool sharded() const { return options_.zero_stage >= 1; }

  // Under ZeRO: the range of each parameter this rank's optimizer is to keep state for and update
  // (optim::adamw::own), with where its reduced gradient and values live. Empty for ZeRO-0.
  std::vector<owned_parameter_range<T, Device>> optimizer_ranges() {
    std::vector<owned_parameter_range<T, Device>> out;
    if (!sharded()) return out;
    auto& buckets = registry_.buckets();
    for (std::size_t b = 0; b < buckets.size(); ++b) {
      const auto& bucket = buckets[b];
      bucket_slot& slot = slots_[b];
      const flat_range mine = slot.sharding.owned(slot.group->rank());
      for (std::size_t i = 0; i < bucket.parameters.size(); ++i) {
        const auto* p = bucket.parameters[i];
        const flat_range owned = owned_range(bucket.offsets[i], numel_of(*p), mine);
        const std::int64_t in_shard = bucket.offsets[i] + owned.begin - mine.begin;
        const auto in = [&](quintet::tensor<T, Device>& shard) {
          return owned.size() == 0 || shard.data() == nullptr
                     ? tensor_view<T, Device>{}
                     : slice(shard, 0, in_shard, in_shard + owned.size());
        };
        out.push_back({p->name, owned, in(slot.shard), in(slot.value_shard)});
      }
    }
    return out;
  }

  // Before a step's first backward (and before its zero_grad): each parameter is to be announced
  // `micro_batches` times. A step that threw midway leaves reductions (and, ZeRO-3, gathers) in
  // flight on the buffers: they are completed (their errors dropped: the step already failed)
  // before anything touches those buffers again, and ZeRO-3's whole buffers released.
  void begin_step(int micro_batches) {
    QUINTET_CHECK(micro_batches >= 1, "data parallelism: {} micro-batches", micro_batches);
    QUINTET_CHECK(!whole_model_held_,
                  "data parallelism: a step while the whole model is gathered; call "
                  "release_whole_model() first");
    if (in_step_) {
      for (auto& slot : slots_) {
        for (comm_request* request : {&slot.request, &slot.gather}) {
          try {
            request->wait();
          } catch (...) {
          }
        }
        slot.gathering = false;
        if (options_.zero_stage == 1) slot.shard = {};  // ZeRO-1's shard lives for a step
        slot.incoming = {};
        slot.scattering = false;
      }
      if (options_.zero_stage == 3) release_whole_buffers();
    }
    in_step_ = true;
    auto& buckets = registry_.buckets();
    for (std::size_t b = 0; b < buckets.size(); ++b) {
      slots_[b].parameters_left = static_cast<std::int64_t>(buckets[b].parameters.size());
      slots_[b].launched = false;
      slots_[b].users = 0;
    }
    for (auto& [p, count] : announcements_) count.left = micro_batches;
    timeline_ = {};
    peak_gathered_ = held_elements_;
  }

  // The step's gradients start at zero: the registry's buffers (made again if ZeRO-2 released
  // them), or ZeRO-3's shards (its buffers are made per piece in backward).
  void zero_grad() {
    if (options_.zero_stage < 3) return registry_.zero_grad(exec_);
    for (auto& slot : slots_) fill(slot.shard, T(0));
  }

  // nn::gpt_stage's hook: these parameters' gradients of one micro-batch are complete.
  void gradients_ready(std::span<parameter_type* const> parameters) {
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
      --count.left;
      bucket_slot& slot = slots_[count.bucket];
      if (options_.zero_stage == 3) {
        // Every micro-batch's gradient of a piece is scattered as soon as the piece is done.
        if (++slot.announced ==
            static_cast<std::int64_t>(registry_.buckets()[count.bucket].parameters.size())) {
          slot.announced = 0;
          scatter(count.bucket);
        }
        continue;
      }
      // A bucket goes once each of its parameters has had all its micro-batches.
      if (count.left == 0 && --slot.parameters_left == 0) launch(count.bucket, true);
    }
  }

  // ZeRO-3's parameter access (nn::parameter_access): a piece's buckets gathered before it runs,
  // gradient buffers made for its backward, the next piece's gather posted; released after.
  nn::parameter_access<T, Device> parameter_access() {
    return {.acquire = [this](const nn::parameter_use<T, Device>& now,
                              const nn::parameter_use<T, Device>* next) { acquire(now, next); },
            .release = [this](const nn::parameter_use<T, Device>& now) { release(now); }};
  }

  void acquire(const nn::parameter_use<T, Device>& now, const nn::parameter_use<T, Device>* next) {
    const std::vector<std::size_t> buckets = buckets_of(now.parameters);
    if (now.values) {
      for (const std::size_t b : buckets) {
        ++slots_[b].users;
        if (!held(registry_.buckets()[b].values) && !slots_[b].gathering) start_gather(b);
      }
      for (const std::size_t b : buckets) finish_gather(b);
    }
    if (now.gradients)
      for (const std::size_t b : buckets) {
        auto& bucket = registry_.buckets()[b];
        // The last micro-batch's gradient of it may still be on its way out.
        if (slots_[b].scattering) settle_scatter(b);
        if (held(bucket.grads)) continue;
        registry_.hold_gradients(bucket);
        count_held(bucket.grads.numel());
      }
    if (next != nullptr && next->values)
      for (const std::size_t b : buckets_of(next->parameters))
        if (!held(registry_.buckets()[b].values) && !slots_[b].gathering) start_gather(b);
  }

  void release(const nn::parameter_use<T, Device>& now) {
    if (!now.values) return;
    for (const std::size_t b : buckets_of(now.parameters)) {
      bucket_slot& slot = slots_[b];
      QUINTET_CHECK(slot.users > 0, "data parallelism: bucket {} released more often than acquired",
                    b);
      if (--slot.users == 0) release_values(b);
    }
  }

  // After the last backward: launches what was not announced (in bucket order), waits for every
  // reduction; under ZeRO-2 drops the full gradient buffers (ZeRO-3 dropped each after its
  // scatter).
  void finish_reduction() {
    QUINTET_CHECK(in_step_, "data parallelism: finish_reduction() without begin_step()");
    timeline_.backward_end = reduction_timeline::clock::now();
    if (options_.zero_stage == 3) {
      auto& buckets = registry_.buckets();
      // A piece's gradient that was not announced (a hook-less backward) is scattered now.
      for (std::size_t b = 0; b < slots_.size(); ++b)
        if (held(buckets[b].grads) && !slots_[b].scattering) scatter(b);
      settle_scatters();
      release_whole_buffers();
      in_step_ = false;
      return;
    }
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
  // `stages_here`: under pp<...>, the pipeline stages this rank holds (as global_gradient_norm
  // takes them): the sums add up over pp too, a parameter several stages hold counted by the rank
  // of its first stage only.
  template <class Plan>
  double gradient_norm(const execution<Device>& exec, const std::vector<int>& stages_here = {}) {
    if (!sharded()) return global_gradient_norm<Plan>(exec, registry_, mesh_, stages_here);
    constexpr bool pipelined = Plan::template has<strategy::pipeline>;
    QUINTET_CHECK(pipelined != stages_here.empty(),
                  "gradient norm: the plan {} {}, but {} pipeline stages were given", Plan::name(),
                  pipelined ? "is pipelined" : "has no pp<...>", stages_here.size());
    for (const auto& p : registry_)
      QUINTET_CHECK(Plan::axes.contains_all(p.placement.sharded_axes()),
                    "gradient norm: parameter '{}' is sharded over {}, but the plan {} runs on {} "
                    "only",
                    p.name, name_of(p.placement.sharded_axes()), Plan::name(), name_of(Plan::axes));
    const mesh_axis_set over_stages = pipelined ? mesh_axis_set{mesh_axis::pp} : mesh_axis_set{};
    const auto counted_here = [&](const parameter_type& p) {
      if (!pipelined) return true;
      const int first = p.placement.stages().front();
      return std::find(stages_here.begin(), stages_here.end(), first) != stages_here.end();
    };
    // Each rank's shard: a parameter's owned range is unique over its bucket's group, and its
    // blocks over its sharded axes; summed over the union of the two (and pp).
    std::map<mesh_axis_set, double> squares;
    std::vector<mesh_axis_set> sets;  // of the owned ranges counted here, in order
    std::vector<tensor_view<const T, Device>> ranges;
    auto& buckets = registry_.buckets();
    for (std::size_t b = 0; b < buckets.size(); ++b) {
      const auto& bucket = buckets[b];
      const bucket_slot& slot = slots_[b];
      const flat_range mine = slot.sharding.owned(slot.group->rank());
      for (std::size_t i = 0; i < bucket.parameters.size(); ++i) {
        const auto* p = bucket.parameters[i];
        const mesh_axis_set axes = p->placement.sharded_axes() | bucket.partial_axes | over_stages;
        const flat_range owned = owned_range(bucket.offsets[i], numel_of(*p), mine);
        squares.try_emplace(axes, 0.0);
        if (owned.size() == 0 || !counted_here(*p)) continue;
        const std::int64_t in_shard = bucket.offsets[i] + owned.begin - mine.begin;
        sets.push_back(axes);
        ranges.push_back(slice(reduced_shard(b), 0, in_shard, in_shard + owned.size()));
      }
    }
    const std::vector<double> sums = kernels::squared_norms(exec, ranges);
    for (std::size_t i = 0; i < sums.size(); ++i) squares[sets[i]] += sums[i];
    if constexpr (pipelined) unite_over_pp(mesh_, squares);
    return std::sqrt(sum_over_groups(mesh_, squares));
  }

  // Under ZeRO-1 and -2, after the optimizer updated each rank's shard: every rank's parameters
  // whole again (all-gather of each bucket's values over its group). ZeRO-3 gathers per use.
  void gather_parameters() {
    if (!sharded() || options_.zero_stage == 3) return;
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

  // ZeRO-3: every parameter whole on this rank (to read the model outside a step: sampling,
  // comparisons), until release_whole_model(). Every rank of the dp groups calls both together.
  void gather_whole_model() {
    if (options_.zero_stage != 3) return;
    QUINTET_CHECK(!in_step_ && !whole_model_held_,
                  "data parallelism: gather_whole_model() inside a step or twice");
    whole_model_held_ = true;
    for (std::size_t b = 0; b < slots_.size(); ++b) {
      ++slots_[b].users;
      if (!held(registry_.buckets()[b].values) && !slots_[b].gathering) start_gather(b);
    }
    for (std::size_t b = 0; b < slots_.size(); ++b) finish_gather(b);
  }
  void release_whole_model() {
    if (options_.zero_stage != 3) return;
    QUINTET_CHECK(whole_model_held_,
                  "data parallelism: release_whole_model() without gather_whole_model()");
    whole_model_held_ = false;
    for (std::size_t b = 0; b < slots_.size(); ++b)
      if (--slots_[b].users == 0) release_values(b);
  }

  // What this rank holds between steps (the registry's buffers, the shards, AdamW's moments in
  // the accumulator type), padding included.
  data_parallel_memory memory() {
    data_parallel_memory out;
    constexpr auto bytes = static_cast<std::int64_t>(sizeof(T));
    for (std::size_t b = 0; b < slots_.size(); ++b) {
      const auto& bucket = registry_.buckets()[b];
      const bucket_slot& slot = slots_[b];
      const std::int64_t optimized = sharded() ? slot.sharding.per_rank : held(bucket.values);
      out.parameters += (held(bucket.values) + held(slot.value_shard)) * bytes;
      out.gradients += (held(bucket.grads) + held(slot.shard) + held(slot.incoming)) * bytes;
      out.optimizer_state += 2 * optimized * static_cast<std::int64_t>(sizeof(state_type));
    }
    out.peak_gathered = peak_gathered_ * bytes;
    return out;
  }

  const reduction_timeline& timeline() const { return timeline_; }
  std::size_t bucket_count() const { return slots_.size(); }

 private:
  struct bucket_slot {
    comm_type* group = nullptr;        // the product group of the bucket's partial axes
    flat_sharding sharding{};          // ZeRO: the bucket's shards over the group
    quintet::tensor<T, Device> shard;  // this rank's reduced shard (ZeRO-2, 3; ZeRO-1 in a step)
    std::int64_t parameters_left = 0;  // with micro-batches still to announce, this step
    bool launched = false;
    comm_request request{};  // the reduction (ZeRO-3: the micro-batch's scatter)
    // ZeRO-3
    quintet::tensor<T, Device> value_shard;  // this rank's range of the values, between uses
    quintet::tensor<T, Device> incoming;     // a micro-batch's scattered gradient, in flight
    comm_request gather{};                   // the values' all-gather, in flight
    bool gathering = false;
    bool scattering = false;
    int users = 0;               // pieces (or gather_whole_model) using the whole values
    std::int64_t announced = 0;  // parameters announced in this micro-batch
  };

  // The part of a parameter at [offset, offset + numel) of its bucket inside `mine`, relative to
  // the parameter's first element (empty when none).
  static flat_range owned_range(std::int64_t offset, std::int64_t numel, flat_range mine) {
    const std::int64_t begin = std::clamp(mine.begin - offset, std::int64_t{0}, numel);
    const std::int64_t end = std::clamp(mine.end - offset, begin, numel);
    return {begin, end};
  }
  // A parameter's elements on this rank (its views may be released: ZeRO-3).
  static std::int64_t numel_of(const parameter_type& p) { return p.local.local_shape().numel(); }

  // This rank's reduced shard of bucket b's gradient: in its own buffer (ZeRO-2, 3) or in its
  // range of the gradient buffer (ZeRO-1).
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

  // ZeRO-3: the buckets holding `parameters`, each once, in bucket order.
  std::vector<std::size_t> buckets_of(std::span<parameter_type* const> parameters) const {
    std::vector<std::size_t> out;
    for (const auto* p : parameters) {
      const auto found = announcements_.find(p);
      QUINTET_CHECK(found != announcements_.end(),
                    "data parallelism: parameter '{}' is not in the registry's buckets", p->name);
      out.push_back(found->second.bucket);
    }
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return out;
  }

  void count_held(std::int64_t elements) {
    held_elements_ += elements;
    peak_gathered_ = std::max(peak_gathered_, held_elements_);
  }

  // ZeRO-3: bucket b's whole values made and its all-gather posted.
  void start_gather(std::size_t b) {
    auto& bucket = registry_.buckets()[b];
    bucket_slot& slot = slots_[b];
    registry_.hold_values(bucket);
    count_held(bucket.values.numel());
    slot.gather = slot.group->all_gather_async(slot.value_shard, bucket.values);
    slot.gathering = true;
  }
  void finish_gather(std::size_t b) {
    bucket_slot& slot = slots_[b];
    if (!slot.gathering) return;
    slot.gathering = false;
    slot.gather.wait();
  }
  void release_values(std::size_t b) {
    auto& bucket = registry_.buckets()[b];
    finish_gather(b);
    held_elements_ -= held(bucket.values);
    registry_.release_values(bucket);
  }

  // ZeRO-3: a micro-batch's gradient of bucket b reduce-scattered over its group (the scatters
  // posted before are completed first: one piece's scatter overlaps the next piece's backward).
  void scatter(std::size_t b) {
    settle_scatters();
    auto& bucket = registry_.buckets()[b];
    bucket_slot& slot = slots_[b];
    slot.incoming = quintet::tensor<T, Device>(shape{slot.sharding.per_rank});
    count_held(slot.incoming.numel());
    slot.request = slot.group->reduce_scatter_async(bucket.grads, slot.incoming, reduce_op::sum);
    slot.scattering = true;
    slot.launched = true;
    timeline_.launches.push_back(reduction_timeline::clock::now());
  }
  // Every scatter in flight completed: its shard added into the rank's gradient shard, the whole
  // gradient buffer dropped.
  void settle_scatters() {
    for (std::size_t b = 0; b < slots_.size(); ++b)
      if (slots_[b].scattering) settle_scatter(b);
  }
  void settle_scatter(std::size_t b) {
    auto& bucket = registry_.buckets()[b];
    bucket_slot& slot = slots_[b];
    slot.scattering = false;
    slot.request.wait();
    kernels::add(exec_, slot.shard, slot.incoming, slot.shard);
    held_elements_ -= held(slot.incoming) + held(bucket.grads);
    slot.incoming = {};
    registry_.release_gradients(bucket);
  }
  // ZeRO-3: every whole buffer dropped (after a step, or after a failed one).
  void release_whole_buffers() {
    auto& buckets = registry_.buckets();
    for (std::size_t b = 0; b < slots_.size(); ++b) {
      slots_[b].users = 0;
      if (held(buckets[b].values) > 0) registry_.release_values(buckets[b]);
      if (held(buckets[b].grads) > 0) registry_.release_gradients(buckets[b]);
      slots_[b].announced = 0;
    }
    held_elements_ = 0;
  }

  nn::parameter_registry<T, Device>& registry_;
  Mesh& mesh_;
  const execution<Device>& exec_;
  data_parallel_options options_;
  std::vector<bucket_slot> slots_;
  struct announcement_count {
    std::size_t bucket = 0;
    std::int64_t left = 0;  // micro-batches of this step not yet announced
  };
  std::unordered_map<const parameter_type*, announcement_count> announcements_;
  bool in_step_ = false;
  reduction_timeline timeline_;
  bool whole_model_held_ = false;
  std::int64_t held_elements_ = 0;  // ZeRO-3: whole values, gradients, incoming shards held now
  std::int64_t peak_gathered_ = 0;  // the most of them held at once since begin_step
};

}  // namespace quintet::parallel
