// gpt: a GPT-2 style decoder — token + position embeddings, L pre-LN transformer blocks, a final
// layer norm and a language-model head (tied to the token embeddings by default) — trained with
// softmax cross-entropy on next-token targets. Forward returns the loss sum and count; backward
// takes the scale of the loss sum (1 / count for the mean, divided again by the micro-batches
// the mean runs over).
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/kernels/accumulator.hpp>
#include <quintet/kernels/cross_entropy.hpp>
#include <quintet/kernels/execution.hpp>
#include <quintet/kernels/matmul.hpp>
#include <quintet/nn/context.hpp>
#include <quintet/nn/embedding.hpp>
#include <quintet/nn/layer_norm.hpp>
#include <quintet/nn/linear.hpp>
#include <quintet/nn/parameter.hpp>
#include <quintet/nn/transformer_block.hpp>
#include <quintet/parallel/plan.hpp>
#include <quintet/parallel/projections.hpp>
#include <quintet/tensor/copy.hpp>
#include <quintet/tensor/reshape.hpp>
#include <quintet/tensor/tensor.hpp>

#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace quintet::nn {

struct gpt_config {
  std::int64_t vocab = 64;
  std::int64_t max_seq = 128;  // rows of the position table
  std::int64_t layers = 2;
  std::int64_t d_model = 64;
  std::int64_t heads = 4;
  std::int64_t mlp_hidden = 0;  // 0: 4 d_model
  bool tie_weights = true;
  double init_stddev = 0.02;

  std::int64_t hidden() const { return mlp_hidden == 0 ? 4 * d_model : mlp_hidden; }

  void validate() const {
    QUINTET_CHECK(vocab >= 2, "gpt: vocabulary of {} tokens, need at least 2", vocab);
    QUINTET_CHECK(max_seq >= 1, "gpt: max_seq {} must be positive", max_seq);
    QUINTET_CHECK(layers >= 1, "gpt: {} layers, need at least 1", layers);
    QUINTET_CHECK(d_model >= 1 && heads >= 1, "gpt: d_model {} and heads {} must be positive",
                  d_model, heads);
    QUINTET_CHECK(d_model % heads == 0, "gpt: {} heads do not divide d_model {}", heads, d_model);
    QUINTET_CHECK(mlp_hidden >= 0, "gpt: mlp_hidden {} is negative", mlp_hidden);
    QUINTET_CHECK(init_stddev > 0, "gpt: init_stddev {} must be positive", init_stddev);
  }
};

// Under a tensor-parallel plan the blocks are split over tp; the embeddings, the final norm and
// the head stay replicated (every tp rank computes them whole, on identical activations).
template <class T, class Device, class Plan = serial_plan, class Mesh = parallel::no_mesh>
class gpt {
  using stat_type = kernels::accumulator_t<T>;

 public:
  gpt(parameter_registry<T, Device>& registry, const execution<Device>& exec,
      const gpt_config& config, Mesh* mesh = nullptr)
      : exec_(exec),
        config_((config.validate(), config)),
        embedding_(registry, exec, "embedding", config.vocab, config.max_seq, config.d_model,
                   config.init_stddev),
        final_norm_(registry, exec, "final_norm", config.d_model) {
    // GPT-2 scales the projections into the residual stream by 1/sqrt(2 L): the stream's variance
    // then stays O(1) however deep the model.
    const block_options options{
        .d_model = config.d_model,
        .heads = config.heads,
        .mlp_hidden = config.hidden(),
        .init_stddev = config.init_stddev,
        .proj_init_stddev =
            config.init_stddev / std::sqrt(2.0 * static_cast<double>(config.layers))};
    blocks_.reserve(static_cast<std::size_t>(config.layers));
    for (std::int64_t l = 0; l < config.layers; ++l)
      blocks_.push_back(std::make_unique<transformer_block<T, Device, Plan, Mesh>>(
          registry, exec, "blocks." + std::to_string(l), options, mesh));
    if (!config.tie_weights)
      head_.emplace(registry, exec, "lm_head", config.d_model, config.vocab,
                    linear_options{.bias = false, .init_stddev = config.init_stddev});
  }
  gpt(parameter_registry<T, Device>&, const execution<Device>&&, const gpt_config&,
      Mesh* = nullptr) = delete;

  // tokens, targets (batch, seq): the loss summed over targets that are not `ignore_index`, and
  // their count.
  kernels::cross_entropy_result forward(context<Device>& ctx,
                                        tensor_view<const std::int32_t, Device> tokens,
                                        tensor_view<const std::int32_t, Device> targets,
                                        std::int32_t ignore_index = kernels::no_target) {
    QUINTET_CHECK(tokens.shape() == targets.shape(),
                  "gpt: tokens {} and targets {} must have the same shape", tokens.shape(),
                  targets.shape());
    QUINTET_CHECK(tokens.rank() == 2, "gpt: tokens have shape {}, expected (batch, seq)",
                  tokens.shape());
    QUINTET_CHECK(tokens.shape()[1] <= config_.max_seq,
                  "gpt: sequence of {} tokens is longer than max_seq {}", tokens.shape()[1],
                  config_.max_seq);
    // The padding id belongs to this micro-batch: it is kept with its activations, so backwards
    // of several micro-batches in flight (pipelines) each use their own.
    {
      quintet::tensor<std::int32_t, host> id(shape{1});
      id(0) = ignore_index;
      copy(ctx.template save<std::int32_t>("lm_head.ignore_index", shape{1}), id);
    }
    quintet::tensor<T, Device> x = embedding_.forward(ctx, tokens);  // (batch, seq, d)
    for (auto& block : blocks_) x = block->forward(ctx, x.view());
    x = final_norm_.forward(ctx, x.view());

    const std::int64_t batch = tokens.shape()[0], seq = tokens.shape()[1];
    auto& logits = ctx.template save<T>("lm_head.logits", shape{batch, seq, config_.vocab});
    if (head_) {
      copy(logits, head_->forward(ctx, x.view()));
    } else {
      auto& input = ctx.template save<T>("lm_head.input", x.shape());
      copy(input, x);
      kernels::matmul(exec_, input, embedding_.token_weight().value, logits, {.transpose_b = true});
    }
    auto& saved_targets = ctx.template save<std::int32_t>("lm_head.targets", targets.shape());
    copy(saved_targets, targets);
    auto& lse = ctx.template save<stat_type>("lm_head.lse", shape{batch, seq});
    return kernels::cross_entropy_forward(exec_, logits, saved_targets, lse, ignore_index);
  }

  // Accumulates the gradients of loss_scale * (the loss sum of the forward) into the parameters.
  void backward(context<Device>& ctx, double loss_scale) {
    const auto& logits = ctx.template get<T>("lm_head.logits");
    quintet::tensor<T, Device> dlogits(logits.shape());  // (batch, seq, vocab)
    kernels::cross_entropy_backward(
        exec_, logits, ctx.template get<std::int32_t>("lm_head.targets"),
        ctx.template get<stat_type>("lm_head.lse"), dlogits, loss_scale, saved_ignore_index(ctx));
    quintet::tensor<T, Device> dx;  // (batch, seq, d)
    if (head_) {
      dx = head_->backward(ctx, dlogits.view());
    } else {
      const auto& input = ctx.template get<T>("lm_head.input");
      auto& table = embedding_.token_weight();
      const std::int64_t rows = input.numel() / config_.d_model;
      kernels::matmul(exec_, reshape(dlogits, shape{rows, config_.vocab}),
                      reshape(input, shape{rows, config_.d_model}), table.grad,
                      {.transpose_a = true, .beta = 1.0});
      dx = quintet::tensor<T, Device>(input.shape());
      kernels::matmul(exec_, dlogits, table.value, dx);
    }
    dx = final_norm_.backward(ctx, dx.view());
    for (auto block = blocks_.rbegin(); block != blocks_.rend(); ++block)
      dx = (*block)->backward(ctx, dx.view());
    embedding_.backward(ctx, dx.view());
  }

  const gpt_config& config() const { return config_; }

 private:
  static std::int32_t saved_ignore_index(const context<Device>& ctx) {
    quintet::tensor<std::int32_t, host> id(shape{1});
    copy(id, ctx.template get<std::int32_t>("lm_head.ignore_index"));
    return id(0);
  }

  const execution<Device>& exec_;
  gpt_config config_;
  embedding<T, Device> embedding_;
  std::vector<std::unique_ptr<transformer_block<T, Device, Plan, Mesh>>> blocks_;
  layer_norm<T, Device> final_norm_;
  std::optional<linear<T, Device>> head_;  // only when the weights are not tied
};

}  // namespace quintet::nn
