// parameter and parameter_registry: every trainable tensor of a model, under a stable name
// (`blocks.3.attn.qkv.weight`), with its gradient, its placement over the mesh, and its
// initialisation drawn from Philox keyed by (seed, name, global element index) — so a rank's shard
// equals the same slice of the serial model's parameter.
//
// Values and gradients are views. While a model is being built each parameter has storage of its
// own (immediate storage, the default); flatten() (or the first buckets()) moves them into flat
// buffers, one per set of axes their gradient is partial over — the unit gradient synchronisation
// reduces in one collective and ZeRO will shard (megatron_sp, say):
//
//   bucket {partial: -}    [ qkv.weight | pad | proj.weight | pad | fc.weight | ... ]
//   bucket {partial: tp}   [ ln1.weight | pad | ln1.bias | pad | proj.bias | ... ]
// Each parameter starts on a 64-byte boundary, as its own allocation did, so kernels see the same
// alignment (and give the same bits) before and after.
// A registry that defers storage (the trainer's: it flattens as soon as the model is built) gives
// parameters no storage of their own: add() records the initialiser, the views stay empty, and
// flatten() draws each parameter's values in place in its bucket — the same bits, since the draw
// is keyed by global index, without a second copy of the parameters in memory.
//
// Data parallelism asks for more (flatten(bucket_layout)): buckets of at most `max_elements`,
// cut at parameter boundaries, so the first ones backward completes are reduced while the rest
// is computed; and buckets padded to split evenly, 64-byte aligned, over the ranks they are
// reduced over (ZeRO's shards). ZeRO-2 drops the gradient buffers between steps
// (release_gradients(); zero_grad() makes them again).
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/core/philox.hpp>
#include <quintet/core/shape.hpp>
#include <quintet/kernels/elementwise.hpp>
#include <quintet/kernels/execution.hpp>
#include <quintet/mesh/device_mesh.hpp>
#include <quintet/mesh/mesh_axis.hpp>
#include <quintet/parallel/placement.hpp>
#include <quintet/tensor/copy.hpp>
#include <quintet/tensor/fill.hpp>
#include <quintet/tensor/random.hpp>
#include <quintet/tensor/region.hpp>
#include <quintet/tensor/reshape.hpp>
#include <quintet/tensor/slice.hpp>
#include <quintet/tensor/tensor.hpp>
#include <quintet/tensor/tensor_view.hpp>

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace quintet::nn {

// How a parameter's initial values are drawn.
struct initializer {
  enum class kind { normal, uniform, constant };
  kind type = kind::constant;
  double a = 0.0, b = 0.0;  // normal: mean, stddev; uniform: low, high; constant: value

  static initializer normal(double stddev, double mean = 0.0) {
    return {kind::normal, mean, stddev};
  }
  static initializer uniform(double low, double high) { return {kind::uniform, low, high}; }
  static initializer constant(double value) { return {kind::constant, value, 0.0}; }
};

// Whether the optimizer's weight decay applies: to weights and embeddings, not to biases and
// normalisation scales (GPT-2's recipe). The layer that creates a parameter decides.
enum class weight_decay : std::uint8_t { apply, exempt };

template <class T, class Device>
struct parameter {
  std::string name;
  quintet::shape global_shape;            // the serial model's (stored) shape
  parallel::placement placement;          // how it is laid out over the mesh
  region local;                           // the block of global_shape this rank holds
  quintet::tensor_view<T, Device> value;  // local_shape(local)
  quintet::tensor_view<T, Device> grad;   // same shape, accumulated by backward
  nn::weight_decay decay = nn::weight_decay::apply;

  // The shape of this rank's block, whether or not its views have storage now (a deferred or
  // released buffer leaves them empty).
  quintet::shape local_shape() const { return local.local_shape(); }
};

// Parameters flattened together: the same axes their gradient is partial over (and the registry's
// one dtype), so one collective per bucket completes them. `offsets[i]` is where parameters[i]
// starts in `values` and `grads`.
template <class T, class Device>
struct parameter_bucket {
  mesh_axis_set partial_axes;
  quintet::tensor<T, Device> values;  // (padded elements)
  quintet::tensor<T, Device> grads;   // (padded elements); padding stays zero
  std::vector<parameter<T, Device>*> parameters;
  std::vector<std::int64_t> offsets;
};

// How flatten() cuts a set of parameters with the same partial axes into buckets.
struct bucket_layout {
  std::int64_t max_elements = 0;  // 0: one bucket per set; else at most this many (a larger
                                  // parameter gets a bucket of its own)
  bool shardable = false;         // pad each bucket to split evenly over its partial axes' ranks
  // The piece (layer) of each named parameter: parameters of different pieces never share a
  // bucket, so a piece's buckets are what ZeRO-3 gathers before the piece runs. Unnamed: piece -1.
  std::map<std::string, int, std::less<>> piece_of{};

  friend bool operator==(const bucket_layout&, const bucket_layout&) = default;
};

// Whether add() gives each parameter storage at once, or flatten() does (see above).
enum class parameter_storage : std::uint8_t { immediate, deferred };

template <class T, class Device>
class parameter_registry {
 public:
  // Which axes a parameter's gradient is left partial over, given its placement (a plan's rule).
  using partial_rule = mesh_axis_set (*)(const parallel::placement&);

  // The serial model's registry: every degree 1, nothing partial. `seed` keys every parameter's
  // initialisation.
  explicit parameter_registry(std::uint64_t seed,
                              parameter_storage storage = parameter_storage::immediate)
      : seed_(seed), storage_(storage) {}

  // A rank's registry under a plan: its place on `mesh` picks the block of each parameter it
  // holds, and the plan says which gradients backward leaves partial (Plan{} is a tag).
  template <class Plan, mesh_like Mesh>
  parameter_registry(std::uint64_t seed, const Mesh& mesh, Plan,
                     parameter_storage storage = parameter_storage::immediate)
      : seed_(seed),
        storage_(storage),
        position_(parallel::position_in(mesh.layout(), mesh.world_rank())),
        partial_(&Plan::partial_gradient_axes) {}

  // The same from a position given by hand (unit tests of placement without a mesh).
  parameter_registry(std::uint64_t seed, parallel::mesh_position position,
                     partial_rule partial = nullptr,
                     parameter_storage storage = parameter_storage::immediate)
      : seed_(seed), storage_(storage), position_(position), partial_(partial) {}

  parameter_registry(const parameter_registry&) = delete;
  parameter_registry& operator=(const parameter_registry&) = delete;

  // Creates, initialises and zero-grads a parameter (deferred: records how, for flatten() to do
  // it). The returned reference stays valid for the registry's lifetime (layers keep it); its
  // value and grad views follow flatten().
  parameter<T, Device>& add(std::string name, shape global, initializer init,
                            parallel::placement where = parallel::placement::replicated(),
                            weight_decay decay = weight_decay::apply) {
    QUINTET_CHECK(buckets_.empty(),
                  "parameter_registry: '{}' is added after the parameters were flattened into "
                  "buckets; build the whole model first",
                  name);
    for (const auto& p : parameters_)
      QUINTET_CHECK(p.name != name, "parameter_registry: a parameter named '{}' already exists",
                    name);
    if (partial_ != nullptr) where = where.partial(where.partial_axes() | partial_(where));
    // Summing a gradient over an axis it is sharded over would add different blocks together;
    // that takes a reduce-scatter (ZeRO), which the buckets do not do yet.
    QUINTET_CHECK((where.partial_axes() & where.sharded_axes()).empty(),
                  "parameter_registry: '{}' is sharded over {} and its gradient partial over {}",
                  name, name_of(where.sharded_axes()), name_of(where.partial_axes()));
    check_initializer(name, init);
    const region local = where.local_region(global, position_);
    if (storage_ == parameter_storage::deferred) {
      parameter<T, Device>& p = parameters_.emplace_back(
          parameter<T, Device>{std::move(name), global, where, local, {}, {}, decay});
      pending_.emplace(&p, init);
      return p;
    }
    auto& storage = own_storage_.emplace_back(quintet::tensor<T, Device>(local.local_shape()),
                                              quintet::tensor<T, Device>(local.local_shape()));
    parameter<T, Device>& p = parameters_.emplace_back(parameter<T, Device>{
        std::move(name), global, where, local, storage.first.view(), storage.second.view(), decay});
    initialize(p.value, p, init);
    fill(p.grad, T(0));
    return p;
  }

  parameter<T, Device>& find(std::string_view name) {
    for (auto& p : parameters_)
      if (p.name == name) return p;
    QUINTET_FAIL("parameter_registry: no parameter named '{}'", name);
  }

  // Zero gradients (made again first, after release_gradients()). The buckets are filled over the
  // context's threads.
  void zero_grad() { zero_grad(execution<Device>{}); }
  void zero_grad(const execution<Device>& exec) {
    QUINTET_CHECK(initialized(),
                  "parameter_registry: zero_grad before flatten in a registry that defers "
                  "storage; flatten it (with its bucket layout) first");
    if (!buckets_.empty()) {
      for (auto& bucket : buckets_) {
        if (gradients_released_) {
          bucket.grads = quintet::tensor<T, Device>(shape{flat_elements(bucket)});
          point_gradients(bucket);
        }
        zero(exec, bucket.grads);
      }
      gradients_released_ = false;
      return;
    }
    for (auto& p : parameters_) fill(p.grad, T(0));
  }

  // Frees every bucket's gradient buffer (ZeRO-2 keeps only its reduced shard between steps);
  // parameters' grad views are empty until zero_grad().
  void release_gradients() {
    QUINTET_CHECK(!buckets_.empty(),
                  "parameter_registry: gradients are released only once flattened into buckets");
    for (auto& bucket : buckets_) {
      bucket.grads = quintet::tensor<T, Device>();
      for (auto* p : bucket.parameters) p->grad = {};
    }
    gradients_released_ = true;
  }
  bool gradients_released() const { return gradients_released_; }

  // ZeRO-3 holds a bucket's whole values and gradients only while a layer uses them. Releasing
  // frees a buffer and empties its parameters' views; holding makes it again (values uninitialised,
  // for the caller to gather into; gradients zeroed) and points the views at it.
  void release_values(parameter_bucket<T, Device>& bucket) {
    bucket.values = quintet::tensor<T, Device>();
    for (auto* p : bucket.parameters) p->value = {};
  }
  void hold_values(parameter_bucket<T, Device>& bucket) {
    bucket.values = quintet::tensor<T, Device>(shape{flat_elements(bucket)});
    for (std::size_t i = 0; i < bucket.parameters.size(); ++i)
      bucket.parameters[i]->value = view_of(bucket.values, bucket, i);
  }
  void release_gradients(parameter_bucket<T, Device>& bucket) {
    bucket.grads = quintet::tensor<T, Device>();
    for (auto* p : bucket.parameters) p->grad = {};
    gradients_released_ = true;
  }
  void hold_gradients(parameter_bucket<T, Device>& bucket) {
    bucket.grads = quintet::tensor<T, Device>(shape{flat_elements(bucket)});
    fill(bucket.grads, T(0));
    point_gradients(bucket);
  }

  // Moves every parameter's value and gradient into its bucket's flat buffers (bit for bit) and
  // frees their own storage (deferred: initialises them there). Once flattened, no parameter can be
  // added. Idempotent. flatten() keeps whatever layout the registry already has; flatten(layout)
  // insists on its own (a registry flattened before with another layout is an error, not silently
  // kept). The large fills (a deferred registry's gradients) run over `exec`'s threads.
  void flatten() { flatten(execution<Device>{}); }
  void flatten(const execution<Device>& exec) {
    if (buckets_.empty()) flatten(bucket_layout{}, exec);
  }
  void flatten(const bucket_layout& layout) { flatten(layout, execution<Device>{}); }
  void flatten(const bucket_layout& layout, const execution<Device>& exec) {
    QUINTET_CHECK(layout.max_elements >= 0, "parameter_registry: buckets of at most {} elements",
                  layout.max_elements);
    if (!buckets_.empty()) {
      QUINTET_CHECK(layout == layout_,
                    "parameter_registry: already flattened into buckets of at most {} elements{}; "
                    "asked for {}{}",
                    layout_.max_elements, layout_.shardable ? " (shardable)" : "",
                    layout.max_elements, layout.shardable ? " (shardable)" : "");
      return;
    }
    if (parameters_.empty()) return;
    layout_ = layout;
    // Buckets in order of first appearance, parameters in registration order within each.
    std::map<std::uint8_t, std::size_t> index;
    std::vector<std::vector<parameter<T, Device>*>> members;
    std::vector<mesh_axis_set> keys;
    for (auto& p : parameters_) {
      const mesh_axis_set partial = p.placement.partial_axes();
      const auto [found, inserted] = index.try_emplace(partial.bits(), members.size());
      if (inserted) {
        members.emplace_back();
        keys.push_back(partial);
      }
      members[found->second].push_back(&p);
    }
    std::deque<parameter_bucket<T, Device>> buckets;
    for (std::size_t b = 0; b < members.size(); ++b) {
      // Consecutive runs of the set's parameters, each within the size limit.
      std::vector<std::vector<parameter<T, Device>*>> runs(1);
      std::int64_t run_elements = 0;
      for (auto* p : members[b]) {
        const std::int64_t n = aligned(p->local_shape().numel());
        const bool new_piece = !runs.back().empty() &&
                               piece(layout, runs.back().back()->name) != piece(layout, p->name);
        if (!runs.back().empty() &&
            (new_piece || (layout.max_elements > 0 && run_elements + n > layout.max_elements))) {
          runs.emplace_back();
          run_elements = 0;
        }
        runs.back().push_back(p);
        run_elements += n;
      }
      for (auto& run : runs) {
        parameter_bucket<T, Device>& bucket = buckets.emplace_back();
        bucket.partial_axes = keys[b];
        std::int64_t total = 0;
        for (auto* p : run) {
          bucket.parameters.push_back(p);
          bucket.offsets.push_back(total);
          total += aligned(p->local_shape().numel());
        }
        total = split_evenly(total, keys[b]);
        bucket.values = quintet::tensor<T, Device>(shape{total});
        bucket.grads = quintet::tensor<T, Device>(shape{total});
        const bool deferred = storage_ == parameter_storage::deferred;
        if (deferred) zero(exec, bucket.grads);
        // Each element written once: the parameters' values and gradients copied (deferred: the
        // values drawn, the gradients zeroed above), the padding after each (and the bucket's
        // tail) zeroed.
        const auto zero_padding = [&](std::int64_t begin, std::int64_t end) {
          if (begin == end) return;
          fill(slice(bucket.values, 0, begin, end), T(0));
          if (!deferred) fill(slice(bucket.grads, 0, begin, end), T(0));
        };
        for (std::size_t i = 0; i < bucket.parameters.size(); ++i) {
          parameter<T, Device>& p = *bucket.parameters[i];
          const shape local = p.local_shape();
          const std::int64_t begin = bucket.offsets[i], n = local.numel();
          const auto value = reshape(slice(bucket.values, 0, begin, begin + n), local);
          const auto grad = reshape(slice(bucket.grads, 0, begin, begin + n), local);
          if (deferred) {
            initialize(value, p, pending_.at(&p));
          } else {
            copy(value, p.value);
            copy(grad, p.grad);
          }
          p.value = value;
          p.grad = grad;
          zero_padding(begin + n, i + 1 < bucket.parameters.size() ? bucket.offsets[i + 1] : total);
        }
      }
    }
    buckets_ = std::move(buckets);
    own_storage_.clear();
    pending_.clear();
  }

  // The flat buckets (flattening first if needed).
  std::deque<parameter_bucket<T, Device>>& buckets() {
    if (buckets_.empty()) flatten();
    return buckets_;
  }
  bool flattened() const { return !buckets_.empty(); }
  // Whether the parameters hold their values: always, unless the registry defers storage and has
  // not been flattened yet (released buffers, ZeRO's, leave views empty either way).
  bool initialized() const {
    return storage_ == parameter_storage::immediate || flattened() || parameters_.empty();
  }

  // Elements of the serial model's parameters (each counted once, whatever the placement).
  std::int64_t global_numel() const {
    std::int64_t n = 0;
    for (const auto& p : parameters_) n += p.global_shape.numel();
    return n;
  }

  // A bucket's flat length, padding included (whether or not its buffers are held now).
  std::int64_t flat_elements(const parameter_bucket<T, Device>& bucket) const {
    return split_evenly(
        bucket.offsets.back() + aligned(bucket.parameters.back()->local.local_shape().numel()),
        bucket.partial_axes);
  }

  std::size_t size() const { return parameters_.size(); }
  auto begin() { return parameters_.begin(); }
  auto end() { return parameters_.end(); }
  auto begin() const { return parameters_.begin(); }
  auto end() const { return parameters_.end(); }
  std::uint64_t seed() const { return seed_; }
  const parallel::mesh_position& position() const { return position_; }

 private:
  static constexpr std::int64_t per_line = std::max<std::int64_t>(1, 64 / sizeof(T));
  // Elements rounded up to a 64-byte boundary.
  static std::int64_t aligned(std::int64_t n) { return (n + per_line - 1) / per_line * per_line; }

  // A large buffer zeroed over the context's threads where the device has that kernel (the host);
  // elsewhere by the tensor fill.
  static void zero(const execution<Device>& exec, quintet::tensor<T, Device>& buffer) {
    if constexpr (std::same_as<Device, host>) {
      kernels::fill(exec, buffer, T(0));
    } else {
      fill(buffer, T(0));
    }
  }

  // An initialiser's arguments checked when the parameter is added (a deferred one draws later).
  static void check_initializer(std::string_view name, const initializer& init) {
    QUINTET_CHECK(init.type != initializer::kind::normal || init.b >= 0,
                  "parameter_registry: '{}' is initialised with a negative standard deviation {}",
                  name, init.b);
    QUINTET_CHECK(init.type != initializer::kind::uniform || init.a <= init.b,
                  "parameter_registry: '{}' is initialised uniformly over [{}, {}): low above high",
                  name, init.a, init.b);
  }

  // Draws a parameter's initial values into `value` (its local block, wherever it lives).
  void initialize(quintet::tensor_view<T, Device> value, const parameter<T, Device>& p,
                  const initializer& init) const {
    const rng_key key{.seed = seed_, .stream = rng_stream_for(p.name)};
    switch (init.type) {
      case initializer::kind::normal:
        fill_normal(value, key, init.a, init.b, p.local);
        break;
      case initializer::kind::uniform:
        fill_uniform(value, key, init.a, init.b, p.local);
        break;
      case initializer::kind::constant:
        fill(value, static_cast<T>(init.a));
        break;
    }
  }

  static int piece(const bucket_layout& layout, std::string_view name) {
    const auto found = layout.piece_of.find(name);
    return found == layout.piece_of.end() ? -1 : found->second;
  }

  // Ranks of the group over the axes `axes` (the product of their degrees).
  std::int64_t group_size(mesh_axis_set axes) const {
    std::int64_t ranks = 1;
    axes.for_each(
        [&](mesh_axis axis) { ranks *= position_[static_cast<std::size_t>(axis)].degree; });
    return ranks;
  }

  // Each of the bucket's parameters' grad views onto its range of bucket.grads.
  static void point_gradients(parameter_bucket<T, Device>& bucket) {
    for (std::size_t i = 0; i < bucket.parameters.size(); ++i)
      bucket.parameters[i]->grad = view_of(bucket.grads, bucket, i);
  }
  // Parameter i's range of one of the bucket's flat buffers, in its local shape.
  static quintet::tensor_view<T, Device> view_of(quintet::tensor<T, Device>& buffer,
                                                 const parameter_bucket<T, Device>& bucket,
                                                 std::size_t i) {
    const shape local = bucket.parameters[i]->local.local_shape();
    const std::int64_t begin = bucket.offsets[i];
    return reshape(slice(buffer, 0, begin, begin + local.numel()), local);
  }
  // `elements` rounded up to split into 64-byte aligned shards over the axes' ranks (when the
  // layout is shardable).
  std::int64_t split_evenly(std::int64_t elements, mesh_axis_set axes) const {
    const std::int64_t unit = (layout_.shardable ? group_size(axes) : 1) * per_line;
    return (elements + unit - 1) / unit * unit;
  }

  std::uint64_t seed_;
  parameter_storage storage_ = parameter_storage::immediate;
  parallel::mesh_position position_{};
  partial_rule partial_ = nullptr;
  std::deque<parameter<T, Device>> parameters_;  // a deque never moves its elements
  // Each parameter's (value, grad) storage until flatten().
  std::deque<std::pair<quintet::tensor<T, Device>, quintet::tensor<T, Device>>> own_storage_;
  // Deferred: each parameter's initialiser until flatten().
  std::unordered_map<const parameter<T, Device>*, initializer> pending_;
  std::deque<parameter_bucket<T, Device>> buckets_;
  bucket_layout layout_{};
  bool gradients_released_ = false;
};

}  // namespace quintet::nn
