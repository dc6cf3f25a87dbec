// gpt: a GPT-2 style decoder — token + position embeddings, L pre-LN transformer blocks, a final
// layer norm and a language-model head (tied to the token embeddings by default) — trained with
// softmax cross-entropy on next-token targets. Forward returns the loss sum and count; backward
// takes the scale of the loss sum (1 / count for the mean, divided again by the micro-batches
// the mean runs over).
//
// Every rank of a parallel plan is given the whole micro-batch and returns the loss of the whole
// micro-batch; after backward (and parallel::synchronize_gradients) each rank holds its part of
// the serial model's gradient.
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
#include <quintet/parallel/mappings.hpp>
#include <quintet/parallel/no_mesh.hpp>
#include <quintet/parallel/plan.hpp>
#include <quintet/parallel/projections.hpp>
#include <quintet/parallel/replicated_batch.hpp>
#include <quintet/parallel/sequence/sequence_layout.hpp>
#include <quintet/parallel/tensor/vocab_parallel_cross_entropy.hpp>
#include <quintet/tensor/copy.hpp>
#include <quintet/tensor/reshape.hpp>
#include <quintet/tensor/tensor.hpp>

#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
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

// How the plan splits the model:
//   tensor<megatron_1d>    blocks split over tp; token table and logits split on the vocabulary
//                          (padded to a multiple of tp), loss computed without gathering logits.
//   sequence<megatron_sp>  activations between the linears hold the tp group's sequence block.
//   sequence<ulysses|ring> each sp rank embeds and scores its own rows (contiguous, or zig-zag
//                          for ring); the loss sum and count are summed over sp.
template <class T, class Device, class Plan = serial_plan, class Mesh = parallel::no_mesh>
class gpt {
  using stat_type = kernels::accumulator_t<T>;
  using projections = parallel::projections<T, Device, Plan, Mesh>;
  static constexpr bool vocab_parallel = parallel::uses_tensor_parallel<Plan>;
  static constexpr bool sequence_on_sp = parallel::shards_sequence_on_sp<Plan>;

 public:
  gpt(parameter_registry<T, Device>& registry, const execution<Device>& exec,
      const gpt_config& config, Mesh* mesh = nullptr)
      : exec_(exec),
        config_((config.validate(), check_mesh(mesh), config)),
        mesh_(mesh),
        embedding_(registry, exec, "embedding", config.vocab, config.max_seq, config.d_model,
                   config.init_stddev, mesh),
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
      head_.emplace(projections::make_column(
          registry, exec, mesh, "lm_head", config.d_model,
          parallel::padded_vocab(config.vocab, projections::tp_size(mesh)),
          linear_options{.bias = false, .init_stddev = config.init_stddev}));
  }
  gpt(parameter_registry<T, Device>&, const execution<Device>&&, const gpt_config&,
      Mesh* = nullptr) = delete;

  // tokens, targets (batch, seq), the whole micro-batch on every rank: the loss summed over
  // targets that are not `ignore_index`, and their count.
  kernels::cross_entropy_result forward(context<Device>& ctx,
                                        tensor_view<const std::int32_t, Device> tokens,
                                        tensor_view<const std::int32_t, Device> targets,
                                        std::int32_t ignore_index = kernels::no_target) {
    // First, before any check that could stop some ranks only, while the others wait.
    parallel::check_replicated_batch<Plan>(mesh_, tokens, targets);
    QUINTET_CHECK(tokens.shape() == targets.shape(),
                  "gpt: tokens {} and targets {} must have the same shape", tokens.shape(),
                  targets.shape());
    QUINTET_CHECK(tokens.rank() == 2, "gpt: tokens have shape {}, expected (batch, seq)",
                  tokens.shape());
    const std::int64_t batch = tokens.shape()[0], seq = tokens.shape()[1];
    QUINTET_CHECK(seq <= config_.max_seq, "gpt: sequence of {} tokens is longer than max_seq {}",
                  seq, config_.max_seq);
    const parallel::sequence_layout input = parallel::input_layout<Plan>(mesh_, seq);
    const parallel::sequence_layout activation = parallel::activation_layout<Plan>(mesh_, seq);
    // The padding id and the layout belong to this micro-batch: they are kept with its
    // activations, so backwards of several micro-batches in flight (pipelines) use their own.
    {
      quintet::tensor<std::int32_t, host> kept(shape{2});
      kept(0) = ignore_index;
      kept(1) = static_cast<std::int32_t>(seq);
      copy(ctx.template save<std::int32_t>("lm_head.ignore_index_and_seq", shape{2}), kept);
    }
    const quintet::tensor<std::int32_t, Device> my_tokens = parallel::take_rows(tokens, input);
    quintet::tensor<T, Device> x = embedding_.forward(ctx, my_tokens, activation);  // (b, rows, d)
    for (auto& block : blocks_) x = block->forward(ctx, x.view());
    x = final_norm_.forward(ctx, x.view());

    const std::int64_t rows = input.rows(), columns = embedding_.shard().columns;
    auto& logits = ctx.template save<T>("lm_head.logits", shape{batch, rows, columns});
    if (head_) {
      copy(logits, head_->forward(ctx, x.view()));
    } else {
      // The tied head is a column-parallel projection over the vocabulary: under megatron_sp it
      // keeps the sequence block and gathers it (again in backward), as column_linear does.
      auto& kept = ctx.template save<T>("lm_head.input", x.shape());
      copy(kept, x);
      parallel::with_whole_rows<Plan>(mesh_, kept, [&](tensor_view<const T, Device> input) {
        kernels::matmul(exec_, input, embedding_.token_weight().value, logits,
                        {.transpose_b = true});
      });
    }
    auto& my_targets = ctx.template save<std::int32_t>("lm_head.targets", shape{batch, rows});
    copy(my_targets, parallel::take_rows(targets, input));
    auto& lse = ctx.template save<stat_type>("lm_head.lse", shape{batch, rows});
    kernels::cross_entropy_result loss;
    if constexpr (vocab_parallel) {
      loss = parallel::vocab_parallel_cross_entropy_forward(exec_, mesh_->tp(), logits, my_targets,
                                                            lse, ignore_index, embedding_.shard());
    } else {
      loss = kernels::cross_entropy_forward(exec_, logits, my_targets, lse, ignore_index);
    }
    return parallel::sum_loss_over_sequence<Plan>(mesh_, loss);
  }

  // Accumulates the gradients of loss_scale * (the loss sum of the forward) into the parameters.
  void backward(context<Device>& ctx, double loss_scale) {
    const auto [ignore_index, seq] = saved_ignore_index_and_seq(ctx);
    const parallel::sequence_layout activation = parallel::activation_layout<Plan>(mesh_, seq);
    const auto& logits = ctx.template get<T>("lm_head.logits");
    const auto& targets = ctx.template get<std::int32_t>("lm_head.targets");
    const auto& lse = ctx.template get<stat_type>("lm_head.lse");
    quintet::tensor<T, Device> dlogits(logits.shape());  // (batch, rows, vocab / tp)
    if constexpr (vocab_parallel) {
      parallel::vocab_parallel_cross_entropy_backward(exec_, logits, targets, lse, dlogits,
                                                      loss_scale, ignore_index, embedding_.shard());
    } else {
      kernels::cross_entropy_backward(exec_, logits, targets, lse, dlogits, loss_scale,
                                      ignore_index);
    }
    quintet::tensor<T, Device> dx;  // (batch, rows, d)
    if (head_) {
      dx = head_->backward(ctx, dlogits.view());
    } else {
      dx = tied_head_backward(ctx, dlogits);
    }
    dx = final_norm_.backward(ctx, dx.view());
    for (auto block = blocks_.rbegin(); block != blocks_.rend(); ++block)
      dx = (*block)->backward(ctx, dx.view());
    embedding_.backward(ctx, dx.view(), activation);
  }

  const gpt_config& config() const { return config_; }

 private:
  // A mesh whose degrees the plan does not use would train a different model on each rank.
  static bool check_mesh(Mesh* mesh) {
    if constexpr (!std::is_same_v<Mesh, parallel::no_mesh>) {
      QUINTET_CHECK(mesh != nullptr, "gpt: a model of a parallel plan needs the device mesh");
      const auto& degrees = mesh->degrees();
      QUINTET_CHECK(vocab_parallel || degrees.tp == 1,
                    "gpt: the mesh has tp = {} but the plan has no parallel::tensor policy",
                    degrees.tp);
      QUINTET_CHECK(sequence_on_sp || degrees.sp == 1,
                    "gpt: the mesh has sp = {} but the plan has no parallel::sequence<ulysses> or "
                    "<ring> policy (megatron_sp shards the sequence on tp and needs sp = 1)",
                    degrees.sp);
      QUINTET_CHECK(degrees.dp == 1 && degrees.pp == 1,
                    "gpt: data and pipeline parallelism (dp = {}, pp = {}) are not implemented yet",
                    degrees.dp, degrees.pp);
    }
    return true;
  }

  // dlogits (batch, rows, vocab / tp) -> dx (batch, rows of the activations, d); accumulates the
  // token table's gradient from the head's use of it.
  quintet::tensor<T, Device> tied_head_backward(context<Device>& ctx,
                                                const quintet::tensor<T, Device>& dlogits) {
    auto& table = embedding_.token_weight();
    const std::int64_t columns = embedding_.shard().columns;
    quintet::tensor<T, Device> dx;  // (batch, rows of the logits, d)
    parallel::with_whole_rows<Plan>(
        mesh_, ctx.template get<T>("lm_head.input"), [&](tensor_view<const T, Device> input) {
          const std::int64_t rows = input.numel() / config_.d_model;
          kernels::matmul(exec_, reshape(dlogits, shape{rows, columns}),
                          reshape(input, shape{rows, config_.d_model}), table.grad,
                          {.transpose_a = true, .beta = 1.0});
          dx = quintet::tensor<T, Device>(input.shape());
        });
    kernels::matmul(exec_, dlogits, table.value, dx);
    return parallel::complete_partial_rows<Plan>(mesh_, std::move(dx));
  }

  static std::pair<std::int32_t, std::int64_t> saved_ignore_index_and_seq(
      const context<Device>& ctx) {
    quintet::tensor<std::int32_t, host> kept(shape{2});
    copy(kept, ctx.template get<std::int32_t>("lm_head.ignore_index_and_seq"));
    return {kept(0), kept(1)};
  }

  const execution<Device>& exec_;
  gpt_config config_;
  Mesh* mesh_;
  embedding<T, Device, Plan, Mesh> embedding_;
  std::vector<std::unique_ptr<transformer_block<T, Device, Plan, Mesh>>> blocks_;
  layer_norm<T, Device> final_norm_;
  std::optional<typename projections::column> head_;  // only when the weights are not tied
};

}  // namespace quintet::nn
