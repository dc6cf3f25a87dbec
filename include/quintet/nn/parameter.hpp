// parameter and parameter_registry: every trainable tensor of a model, under a stable name
// (`blocks.3.attn.qkv.weight`), with its gradient, its placement over the mesh, and its
// initialisation drawn from Philox keyed by (seed, name, global element index) — so a rank's shard
// equals the same slice of the serial model's parameter.
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/core/philox.hpp>
#include <quintet/core/shape.hpp>
#include <quintet/parallel/placement.hpp>
#include <quintet/tensor/fill.hpp>
#include <quintet/tensor/random.hpp>
#include <quintet/tensor/region.hpp>
#include <quintet/tensor/tensor.hpp>

#include <cstdint>
#include <deque>
#include <string>
#include <string_view>
#include <utility>

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
  quintet::shape global_shape;       // the serial model's shape
  parallel::placement placement;     // how it is laid out over the mesh
  region local;                      // the block of global_shape this rank holds
  quintet::tensor<T, Device> value;  // local_shape(local)
  quintet::tensor<T, Device> grad;   // same shape, accumulated by backward
  nn::weight_decay decay = nn::weight_decay::apply;
};

template <class T, class Device>
class parameter_registry {
 public:
  // `seed` keys every parameter's initialisation; `position` is this rank's place on the mesh
  // (all degrees 1 for the serial model).
  explicit parameter_registry(std::uint64_t seed, parallel::mesh_position position = {})
      : seed_(seed), position_(position) {}

  parameter_registry(const parameter_registry&) = delete;
  parameter_registry& operator=(const parameter_registry&) = delete;

  // Creates, initialises and zero-grads a parameter. The returned reference stays valid for the
  // registry's lifetime (layers keep it).
  parameter<T, Device>& add(std::string name, shape global, initializer init,
                            parallel::placement where = parallel::placement::replicated(),
                            weight_decay decay = weight_decay::apply) {
    for (const auto& p : parameters_)
      QUINTET_CHECK(p.name != name, "parameter_registry: a parameter named '{}' already exists",
                    name);
    const region local = where.local_region(global, position_);
    parameter<T, Device>& p = parameters_.emplace_back(parameter<T, Device>{
        std::move(name), global, where, local, quintet::tensor<T, Device>(local.local_shape()),
        quintet::tensor<T, Device>(local.local_shape()), decay});
    const rng_key key{.seed = seed_, .stream = rng_stream_for(p.name)};
    switch (init.type) {
      case initializer::kind::normal:
        fill_normal(p.value, key, init.a, init.b, local);
        break;
      case initializer::kind::uniform:
        fill_uniform(p.value, key, init.a, init.b, local);
        break;
      case initializer::kind::constant:
        fill(p.value, static_cast<T>(init.a));
        break;
    }
    fill(p.grad, T(0));
    return p;
  }

  parameter<T, Device>& find(std::string_view name) {
    for (auto& p : parameters_)
      if (p.name == name) return p;
    QUINTET_FAIL("parameter_registry: no parameter named '{}'", name);
  }

  void zero_grad() {
    for (auto& p : parameters_) fill(p.grad, T(0));
  }

  // Elements of the serial model's parameters (each counted once, whatever the placement).
  std::int64_t global_numel() const {
    std::int64_t n = 0;
    for (const auto& p : parameters_) n += p.global_shape.numel();
    return n;
  }

  std::size_t size() const { return parameters_.size(); }
  auto begin() { return parameters_.begin(); }
  auto end() { return parameters_.end(); }
  auto begin() const { return parameters_.begin(); }
  auto end() const { return parameters_.end(); }
  std::uint64_t seed() const { return seed_; }
  const parallel::mesh_position& position() const { return position_; }

 private:
  std::uint64_t seed_;
  parallel::mesh_position position_;
  std::deque<parameter<T, Device>> parameters_;  // a deque never moves its elements
};

}  // namespace quintet::nn
