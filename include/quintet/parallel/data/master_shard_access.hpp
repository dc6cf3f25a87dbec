// master_shard_access: ZeRO-3 under mixed precision. data_parallel_runtime shards the fp32 master
// registry (values, gradients and AdamW's moments: 16 / dp bytes per parameter, as in fp32); the
// model's 16-bit buffers exist only while a piece (a layer) uses them. The model's registry is
// flattened with buckets cut at the same pieces as the master's (data_parallel_layout's piece
// boundaries; each parameter is mapped to its master, so the two need not split a piece alike),
// so a piece's model buckets are made and dropped together:
//
//   acquire(piece)    the runtime gathers the piece's master buckets (fp32, the next piece's
//                     gather posted); the piece's model value buffers are made and take the
//                     master's values rounded to nearest even (what write_back gives without
//                     ZeRO-3); in backward the model's gradient buffers are made, zeroed, and the
//                     master's (the runtime's)
//   announcement      each micro-batch's 16-bit gradient of a piece is added into the master's
//                     fp32 buffer (accumulate) and handed to the runtime by the caller, which
//                     reduce-scatters it; a model gradient buffer whose parameters have all been
//                     announced is dropped (the tied table's lives from the head's backward to
//                     the embedding's announcement)
//   release(piece)    the model's value buffers dropped, and the master's (reference counted:
//                     the head's use holds the embedding's buckets too)
//
// Gathers move fp32 master values, twice the bytes of gathering 16-bit ones (the simple order:
// every rank rounds the same gathered values, so the copies agree bit for bit).
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/kernels/elementwise.hpp>
#include <quintet/kernels/execution.hpp>
#include <quintet/mesh/mesh_like.hpp>
#include <quintet/nn/parameter.hpp>
#include <quintet/nn/parameter_access.hpp>
#include <quintet/optim/master_weights.hpp>
#include <quintet/parallel/data/data_parallel_runtime.hpp>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

namespace quintet::parallel {

template <class T, class Device, mesh_like Mesh>
class master_shard_access {
  using master_type = optim::master_type_t<T>;
  using model_parameter = nn::parameter<T, Device>;
  using master_parameter = nn::parameter<master_type, Device>;

 public:
  using runtime_type = data_parallel_runtime<master_type, Device, Mesh>;

  // `model` flattened with buckets cut at the master's pieces; `runtime` under ZeRO-3, on
  // `master`'s registry. The model's buffers are dropped here: from now on they exist per use.
  master_shard_access(nn::parameter_registry<T, Device>& model,
                      optim::master_weights<T, Device>& master, runtime_type& runtime,
                      const execution<Device>& exec)
      : model_(model), master_(master), runtime_(runtime), exec_(exec) {
    QUINTET_CHECK(runtime.zero_stage() == 3,
                  "mixed precision: master_shard_access serves ZeRO-3, not ZeRO-{}",
                  runtime.zero_stage());
    QUINTET_CHECK(model.flattened(),
                  "mixed precision: flatten the model's registry first, its buckets cut at "
                  "the master's piece boundaries (data_parallel_layout's pieces)");
    auto& buckets = model.buckets();
    slots_.resize(buckets.size());
    for (std::size_t b = 0; b < buckets.size(); ++b)
      for (auto* p : buckets[b].parameters) bucket_of_[p] = b;
    for (auto& bucket : buckets) {
      model.release_values(bucket);
      model.release_gradients(bucket);
    }
  }
  master_shard_access(nn::parameter_registry<T, Device>&, optim::master_weights<T, Device>&,
                      runtime_type&, const execution<Device>&&) = delete;

  // The hooks the model's stage takes (nn::gpt_stage::on_parameter_access).
  nn::parameter_access<T, Device> parameter_access() {
    return {.acquire = [this](const nn::parameter_use<T, Device>& now,
                              const nn::parameter_use<T, Device>* next) { acquire(now, next); },
            .release = [this](const nn::parameter_use<T, Device>& now) { release(now); }};
  }

  // After the runtime's begin_step: whatever a failed step left held is dropped.
  void begin_step() {
    auto& buckets = model_.buckets();
    for (std::size_t b = 0; b < slots_.size(); ++b) {
      if (buckets[b].values.data() != nullptr) model_.release_values(buckets[b]);
      if (buckets[b].grads.data() != nullptr) model_.release_gradients(buckets[b]);
      slots_[b] = {};
    }
  }

  // The stage's hook: these model parameters' gradients of one micro-batch are complete. They are
  // added into their masters' fp32 gradients, which are returned for the runtime to hear of
  // (data_parallel_runtime::gradients_ready: the caller may hold some back, as a pipeline holds
  // the tied table until its pp sum); model gradient buffers wholly announced are dropped.
  [[nodiscard]] std::vector<master_parameter*> accumulate(std::span<model_parameter* const> ready) {
    std::vector<master_parameter*> masters = master_.accumulate(ready);
    if (masters.empty()) return masters;  // outside a step: nothing was touched
    auto& buckets = model_.buckets();
    for (auto* p : ready) {
      const std::size_t b = bucket(*p);
      if (++slots_[b].announced == static_cast<std::int64_t>(buckets[b].parameters.size())) {
        slots_[b].announced = 0;
        model_.release_gradients(buckets[b]);
      }
    }
    return masters;
  }

  // Every model parameter's values whole (sampling, comparisons) until release_whole_model();
  // every rank of the dp groups calls both together.
  void hold_whole_model() {
    runtime_.gather_whole_model();
    auto& buckets = model_.buckets();
    for (std::size_t b = 0; b < slots_.size(); ++b) hold_values(b);
    for (auto& bucket : buckets) refresh(bucket.parameters);
  }
  void release_whole_model() {
    for (std::size_t b = 0; b < slots_.size(); ++b) release_values(b);
    runtime_.release_whole_model();
  }

 private:
  struct bucket_slot {
    int users = 0;               // uses holding the bucket's values
    std::int64_t announced = 0;  // parameters announced since its gradient buffer was made
  };

  std::size_t bucket(const model_parameter& p) const {
    const auto found = bucket_of_.find(&p);
    QUINTET_CHECK(found != bucket_of_.end(),
                  "mixed precision: parameter '{}' is not in the model's buckets", p.name);
    return found->second;
  }
  std::vector<std::size_t> buckets_of(std::span<model_parameter* const> parameters) const {
    std::vector<std::size_t> out;
    for (const auto* p : parameters) out.push_back(bucket(*p));
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return out;
  }
  std::vector<master_parameter*> masters_of(std::span<model_parameter* const> parameters) {
    std::vector<master_parameter*> out;
    out.reserve(parameters.size());
    for (const auto* p : parameters) out.push_back(&master_.master_of(*p));
    return out;
  }

  void acquire(const nn::parameter_use<T, Device>& now, const nn::parameter_use<T, Device>* next) {
    const std::vector<master_parameter*> masters = masters_of(now.parameters);
    std::vector<master_parameter*> next_masters;
    std::optional<nn::parameter_use<master_type, Device>> master_next;
    if (next != nullptr) {
      next_masters = masters_of(next->parameters);
      master_next = {
          .parameters = next_masters, .values = next->values, .gradients = next->gradients};
    }
    runtime_.acquire({.parameters = masters, .values = now.values, .gradients = now.gradients},
                     master_next ? &*master_next : nullptr);
    auto& buckets = model_.buckets();
    if (now.values) {
      for (const std::size_t b : buckets_of(now.parameters)) hold_values(b);
      // The parameters used now, from their gathered masters (a bucket's other parameters, say
      // the position table in the head's use of the embedding's bucket, when their piece runs).
      refresh(now.parameters);
    }
    if (now.gradients)
      for (const std::size_t b : buckets_of(now.parameters))
        if (buckets[b].grads.data() == nullptr) {
          model_.hold_gradients(buckets[b]);
          slots_[b].announced = 0;
        }
  }

  void release(const nn::parameter_use<T, Device>& now) {
    const std::vector<master_parameter*> masters = masters_of(now.parameters);
    if (now.values)
      for (const std::size_t b : buckets_of(now.parameters)) release_values(b);
    runtime_.release({.parameters = masters, .values = now.values, .gradients = now.gradients});
  }

  void hold_values(std::size_t b) {
    if (slots_[b].users++ > 0) return;
    model_.hold_values(model_.buckets()[b]);
    for (auto* p : model_.buckets()[b].parameters) current_[p] = false;
  }
  void release_values(std::size_t b) {
    QUINTET_CHECK(slots_[b].users > 0,
                  "mixed precision: model bucket {} released more often than acquired", b);
    if (--slots_[b].users == 0) model_.release_values(model_.buckets()[b]);
  }
  // The values of `parameters` rounded from their masters' (held: gathered), each once per hold
  // of its bucket, in one list pass (one launch per 40 parameters on cuda).
  void refresh(std::span<model_parameter* const> parameters) {
    std::vector<kernels::convert_operands<master_type, T, Device>> rounds;
    for (auto* p : parameters) {
      bool& current = current_[p];
      if (current) continue;  // also a parameter named twice
      rounds.push_back({master_.master_of(*p).value, p->value});
      current = true;
    }
    if (!rounds.empty()) kernels::convert(exec_, rounds);
  }

  nn::parameter_registry<T, Device>& model_;
  optim::master_weights<T, Device>& master_;
  runtime_type& runtime_;
  const execution<Device>& exec_;
  std::vector<bucket_slot> slots_;
  std::unordered_map<const model_parameter*, std::size_t> bucket_of_;
  std::unordered_map<const model_parameter*, bool> current_;  // its values taken since held
};

}  // namespace quintet::parallel
