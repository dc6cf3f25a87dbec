// master_weights: mixed-precision training's fp32 copy of a model that computes in a 16-bit type
// (bf16; half would also need loss scaling, which is not built), as Micikevicius et al. (2018) and
// Megatron's distributed optimizer keep it.
//
//   model registry (T = bf16)          master registry (float)
//   values   compute forward/backward  <- rounded from the master after each update (write_back)
//   grads    since the last announcement -> added into the master's fp32 gradient as soon as the
//            (a micro-batch's), in T       model announces them (accumulate), then zeroed
//                                          master values, gradients (summed over micro-batches and
//                                          reduced over ranks in fp32), and the optimizer's state
//
// The master registry mirrors the model's: the same names, shapes, placements and weight decay, in
// registration order; its values start as the model's, widened exactly (the model is initialised
// in T, as a bf16 model cast from fp32 is). Everything that reduces, clips or updates gradients
// (data parallelism's buckets, synchronize_gradients, the norm, AdamW) works on the master
// registry; the model's gradients live only between a piece's backward and its announcement.
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/kernels/accumulator.hpp>
#include <quintet/kernels/elementwise.hpp>
#include <quintet/kernels/execution.hpp>
#include <quintet/nn/parameter.hpp>

#include <algorithm>
#include <cstdint>
#include <span>
#include <type_traits>
#include <unordered_map>
#include <vector>

namespace quintet::optim {

// The type whose master weights a model computing in T trains: float for the 16-bit types, T
// itself for float and double (which need none).
template <class T>
using master_type_t = kernels::accumulator_t<T>;
template <class T>
inline constexpr bool needs_master_weights = !std::is_same_v<master_type_t<T>, T>;

template <class T, class Device>
class master_weights {
  static_assert(needs_master_weights<T>,
                "master_weights: the model's element type must be a 16-bit type (bf16, half); "
                "float and double models are their own master weights");

 public:
  using master_type = master_type_t<T>;

  // Mirrors every parameter of `model` (complete: no parameter is added after this; a model
  // registry that defers storage is flattened here, to have values to copy).
  master_weights(nn::parameter_registry<T, Device>& model, const execution<Device>& exec)
      : model_(model), exec_(exec), master_(model.seed(), model.position()) {
    if (!model_.initialized()) model_.flatten(exec_);
    for (auto& p : model_) {
      // The placement is the model's as given (its partial axes already applied).
      auto& m =
          master_.add(p.name, p.global_shape, nn::initializer::constant(0.0), p.placement, p.decay);
      kernels::convert(exec_, p.value, m.value);
      index_.emplace(&p, pairs_.size());
      pairs_.push_back({&p, &m});
    }
  }
  master_weights(nn::parameter_registry<T, Device>&, const execution<Device>&&) = delete;
  master_weights(const master_weights&) = delete;
  master_weights& operator=(const master_weights&) = delete;

  nn::parameter_registry<master_type, Device>& registry() { return master_; }
  const nn::parameter_registry<master_type, Device>& registry() const { return master_; }

  // The master parameter of one of the model's.
  nn::parameter<master_type, Device>& master_of(const nn::parameter<T, Device>& p) {
    return *pairs_[index_of(p)].master;
  }

  // A step begins: no micro-batch's gradient has been accumulated, the model's gradients are
  // zero. A model whose gradient buffers were released is left so (ZeRO-3 makes them per piece,
  // zeroed: parallel::master_shard_access).
  void begin_step() {
    accumulated_.assign(pairs_.size(), 0);
    if (!model_.gradients_released()) model_.zero_grad(exec_);
    in_step_ = true;
  }

  // The model announced these parameters' gradients of one micro-batch complete (a piece's: a
  // block, the head, the embedding): each is added into its master gradient (exactly widened,
  // summed in fp32) and zeroed for the next, the set in one pass. Returns the master parameters,
  // in the same order, for whoever reduces them. Outside a step (between begin_step and
  // finish_backward: a backward of the model alone) nothing is touched and nothing returned, as
  // data parallelism ignores such announcements. A parameter listed twice is an error (one pass
  // would add and zero it twice at once).
  std::vector<nn::parameter<master_type, Device>*> accumulate(
      std::span<nn::parameter<T, Device>* const> ready) {
    std::vector<nn::parameter<master_type, Device>*> masters;
    if (!in_step_) return masters;
    // Checked whole before anything is counted or moved.
    std::vector<std::size_t> listed;
    listed.reserve(ready.size());
    for (auto* p : ready) {
      const std::size_t at = index_of(*p);
      QUINTET_CHECK(std::find(listed.begin(), listed.end(), at) == listed.end(),
                    "mixed precision: parameter '{}' is announced twice in one set", p->name);
      listed.push_back(at);
    }
    masters.reserve(ready.size());
    std::vector<kernels::accumulate_operands<T, master_type, Device>> moves;
    moves.reserve(ready.size());
    for (const std::size_t at : listed) {
      auto& [model, master] = pairs_[at];
      ++accumulated_[at];
      moves.push_back({model->grad, master->grad});
      masters.push_back(master);
    }
    kernels::accumulate_and_zero(exec_, moves);
    return masters;
  }

  // After the step's backwards: every parameter's gradient was accumulated once per micro-batch
  // (a gradient never announced would be missing from the update, silently). Ends the step.
  void finish_backward(std::int64_t micro_batches) {
    in_step_ = false;
    QUINTET_CHECK(accumulated_.size() == pairs_.size(),
                  "mixed precision: finish_backward without begin_step");
    for (std::size_t i = 0; i < pairs_.size(); ++i)
      QUINTET_CHECK(accumulated_[i] == micro_batches,
                    "mixed precision: parameter '{}' had {} micro-batch gradients accumulated in "
                    "a step of {}",
                    pairs_[i].model->name, accumulated_[i], micro_batches);
  }

  // The model's values from the master's, rounded to nearest even (after every update, and after
  // a checkpoint restored the master; under ZeRO-3 each piece's values are rounded as it is
  // gathered instead).
  void write_back() {
    std::vector<kernels::convert_operands<master_type, T, Device>> rounds;
    rounds.reserve(pairs_.size());
    for (auto& [model, master] : pairs_) rounds.push_back({master->value, model->value});
    kernels::convert(exec_, rounds);
  }

 private:
  struct pair {
    nn::parameter<T, Device>* model;
    nn::parameter<master_type, Device>* master;
  };

  // Where one of the model's parameters sits in pairs_; a parameter of another registry is an
  // error naming it.
  std::size_t index_of(const nn::parameter<T, Device>& p) const {
    const auto found = index_.find(&p);
    QUINTET_CHECK(found != index_.end(),
                  "mixed precision: parameter '{}' is not one of the model's", p.name);
    return found->second;
  }

  nn::parameter_registry<T, Device>& model_;
  const execution<Device>& exec_;
  nn::parameter_registry<master_type, Device> master_;
  std::vector<pair> pairs_;  // registration order
  std::unordered_map<const nn::parameter<T, Device>*, std::size_t> index_;
  std::vector<std::int64_t> accumulated_;  // micro-batch gradients per parameter this step
  bool in_step_ = false;
};

}  // namespace quintet::optim
