// gpt: a GPT-2 style decoder — token + position embeddings, L pre-LN transformer blocks, a final
// layer norm and a language-model head (tied to the token embeddings by default) — trained with
// softmax cross-entropy on next-token targets: the model as one stage holding every piece
// (gpt_stage.hpp cuts it into several). Forward returns the loss sum and count; backward takes the
// scale of the loss sum (1 / count for the mean, divided again by the micro-batches the mean runs
// over), whole or as an input pass and a weight pass. With mixture-of-experts blocks
// (gpt_config::experts) the objective also holds each MoE block's auxiliary losses of the forward,
// times aux_loss_scale (1 by default: the objective of one forward is its mean cross-entropy plus
// the auxiliary losses; the trainer gives 1 / (micro-batches x dp ranks)); stage().routing() says
// what the blocks routed.
//
// Every rank of a parallel plan is given the whole micro-batch and returns the loss of the whole
// micro-batch; after backward (and parallel::synchronize_gradients) each rank holds its part of
// the serial model's gradient.
#pragma once

#include <quintet/kernels/cross_entropy.hpp>
#include <quintet/kernels/execution.hpp>
#include <quintet/nn/context.hpp>
#include <quintet/nn/gpt_stage.hpp>
#include <quintet/nn/parameter.hpp>
#include <quintet/parallel/no_mesh.hpp>
#include <quintet/parallel/plan.hpp>
#include <quintet/tensor/tensor.hpp>

#include <cstdint>

namespace quintet::nn {

template <class T, class Device, class Plan = serial_plan, class Mesh = parallel::no_mesh>
class gpt {
 public:
  using stage_type = gpt_stage<T, Device, Plan, Mesh>;

  gpt(parameter_registry<T, Device>& registry, const execution<Device>& exec,
      const gpt_config& config, Mesh* mesh = nullptr)
      : stage_(registry, exec, config, stage_cut::whole(config), mesh) {}
  gpt(parameter_registry<T, Device>&, const execution<Device>&&, const gpt_config&,
      Mesh* = nullptr) = delete;

  // tokens, targets (batch, seq), the whole micro-batch on every rank: the loss summed over
  // targets that are not `ignore_index`, and their count.
  kernels::cross_entropy_result forward(context<Device>& ctx,
                                        tensor_view<const std::int32_t, Device> tokens,
                                        tensor_view<const std::int32_t, Device> targets,
                                        std::int32_t ignore_index = kernels::no_target) {
    return stage_.forward(ctx, {.tokens = tokens, .targets = targets, .ignore_index = ignore_index})
        .loss;
  }

  // Accumulates the gradients of loss_scale * (the loss sum of the forward) + aux_loss_scale * (the
  // MoE blocks' auxiliary losses) into the parameters.
  void backward(context<Device>& ctx, double loss_scale, double aux_loss_scale = 1.0) {
    stage_.backward(ctx, {.loss_scale = loss_scale, .aux_loss_scale = aux_loss_scale});
  }
  // The same in two passes (the bits of backward): the input gradients through every layer,
  // keeping what each weight gradient needs, then the weight gradients.
  void backward_input(context<Device>& ctx, double loss_scale, double aux_loss_scale = 1.0) {
    stage_.backward_input(ctx, {.loss_scale = loss_scale, .aux_loss_scale = aux_loss_scale});
  }
  void backward_weight(context<Device>& ctx) { stage_.backward_weight(ctx); }

  const gpt_config& config() const { return stage_.config(); }
  stage_type& stage() { return stage_; }

 private:
  stage_type stage_;
};

}  // namespace quintet::nn
