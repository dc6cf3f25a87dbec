// gpt_stage: a contiguous range of a GPT's pieces — piece 0 the embedding, pieces 1..L the blocks,
// piece L+1 the head (final layer norm, language-model head, cross-entropy) — as an nn::stage.
// The serial model is one stage holding every piece (nn::gpt); a pipeline cuts the pieces at
// layer boundaries, one stage per rank (or several, interleaved). Parameters keep their global
// names on whatever stage holds them (`blocks.7.mlp.fc.weight`), drawn from the same Philox
// streams, so a stage's parameters equal the serial model's slice of them.
//
//   L = 4, cut {0, 3, 6}:   stage 0 = [embedding, blocks.0, blocks.1]   -> activations (b, s, d)
//                           stage 1 = [blocks.2, blocks.3, head]        -> loss
// With tied weights the head needs the token table too: the last stage holds its own copy
// (`embedding.token_weight`, the same values), and both copies are marked in their placement as
// held by the first and the last stage; their gradients are summed between the two once per step
// (the pipeline's job). The plan's strategies apply inside every stage as in the serial model.
//
// on_gradients_ready(hook): backward (or backward_weight) calls hook(parameters) as soon as a
// piece's parameter gradients of this micro-batch are complete — the head's first, the
// embedding's (with the tied table) last — so data parallelism can reduce them while the rest of
// backward runs.
//
// on_parameter_access(access): forward and backward acquire each piece's parameters before the
// piece runs and release them after (nn::parameter_access; ZeRO-3 gathers them). The head's use
// includes the tied table (this stage's copy, or the first stage's on a rank holding both). The
// split backward acquires values in its input pass and gradients in its weight pass (no piece's
// weight pass reads its values). A block's activation recomputation (gpt_config::recompute) runs
// inside its backward, so inside the backward's acquire: the parameters the recomputed forward
// reads are there.
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
#include <quintet/nn/parameter_access.hpp>
#include <quintet/nn/recompute_mode.hpp>
#include <quintet/nn/stage.hpp>
#include <quintet/nn/transformer_block.hpp>
#include <quintet/parallel/mappings.hpp>
#include <quintet/parallel/no_mesh.hpp>
#include <quintet/parallel/plan.hpp>
#include <quintet/parallel/projections.hpp>
#include <quintet/parallel/replicated_batch.hpp>
#include <quintet/parallel/sequence/sequence_layout.hpp>
#include <quintet/parallel/tensor/vocab_parallel_cross_entropy.hpp>
#include <quintet/parallel/tensor/vocab_shard.hpp>
#include <quintet/tensor/copy.hpp>
#include <quintet/tensor/reshape.hpp>
#include <quintet/tensor/tensor.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
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
  // What each block keeps for backward: everything (none), all but the attention core's output
  // and log-sum-exp (selective), or its input only (full); the gradients are the same bits.
  recompute_mode recompute = recompute_mode::none;
  // Mixture of experts (nn::moe). 0 experts: every block's feed-forward is the dense MLP. E > 0:
  // block i (counted from 0) holds E experts, MLPs of hidden() units each, when
  // (i + 1) % moe_every == 0 — every block for 1; blocks 1, 3, 5, ... for 2 (every other block, as
  // GShard and Switch); the others stay dense. Each token goes to its top_k experts, at most
  // ceil(capacity_factor x tokens x top_k / E) tokens per expert and routing group (0: dropless),
  // the excess dropped by `drop`. The auxiliary losses — aux_loss_coef x Switch's load-balancing
  // loss and z_loss_coef x the router z-loss — are added to the objective (gpt_stage_gradient).
  // routing_groups: each forward's tokens are routed as this many equal groups of batch rows, each
  // with its own capacity and auxiliary losses (GShard's groups); with dp data-parallel ranks a
  // serial model of routing_groups = dp routes a micro-batch exactly as the ranks do their rows.
  std::int64_t experts = 0;
  std::int64_t top_k = 2;
  std::int64_t moe_every = 2;
  double capacity_factor = 1.25;
  kernels::drop_order drop = kernels::drop_order::lowest_probability;
  double aux_loss_coef = 0.01;
  double z_loss_coef = 0.001;
  std::int64_t routing_groups = 1;

  std::int64_t hidden() const { return mlp_hidden == 0 ? 4 * d_model : mlp_hidden; }
  // The embedding, every block, the head.
  std::int64_t pieces() const { return layers + 2; }
  // Whether block `index` (from 0) is a mixture of experts.
  bool is_moe_block(std::int64_t index) const {
    return experts > 0 && (index + 1) % moe_every == 0;
  }
  // The MoE layer's options of a MoE block.
  moe_options moe() const {
    return {.experts = experts,
            .top_k = top_k,
            .capacity_factor = capacity_factor,
            .drop = drop,
            .load_balancing_coef = aux_loss_coef,
            .z_loss_coef = z_loss_coef,
            .groups = routing_groups};
  }

  void validate() const {
    QUINTET_CHECK(vocab >= 2, "gpt: vocabulary of {} tokens, need at least 2", vocab);
    QUINTET_CHECK(max_seq >= 1, "gpt: max_seq {} must be positive", max_seq);
    QUINTET_CHECK(layers >= 1, "gpt: {} layers, need at least 1", layers);
    QUINTET_CHECK(d_model >= 1 && heads >= 1, "gpt: d_model {} and heads {} must be positive",
                  d_model, heads);
    QUINTET_CHECK(d_model % heads == 0, "gpt: {} heads do not divide d_model {}", heads, d_model);
    QUINTET_CHECK(mlp_hidden >= 0, "gpt: mlp_hidden {} is negative", mlp_hidden);
    QUINTET_CHECK(init_stddev > 0, "gpt: init_stddev {} must be positive", init_stddev);
    QUINTET_CHECK(experts >= 0, "gpt: {} experts; 0 (dense) or more", experts);
    if (experts == 0) return;
    QUINTET_CHECK(top_k >= 1 && top_k <= experts,
                  "gpt: top-{} routing needs 1 <= top_k <= the {} experts", top_k, experts);
    QUINTET_CHECK(moe_every >= 1 && moe_every <= layers,
                  "gpt: MoE in every {}-th block of {} leaves no block with experts; moe_every "
                  "must be in [1, layers]",
                  moe_every, layers);
    QUINTET_CHECK(capacity_factor >= 0 && std::isfinite(capacity_factor),
                  "gpt: the capacity factor {} must be finite and non-negative (0: dropless)",
                  capacity_factor);
    QUINTET_CHECK(aux_loss_coef >= 0 && z_loss_coef >= 0 && std::isfinite(aux_loss_coef) &&
                      std::isfinite(z_loss_coef),
                  "gpt: the auxiliary loss coefficients ({}, {}) must be finite and non-negative",
                  aux_loss_coef, z_loss_coef);
    QUINTET_CHECK(routing_groups >= 1, "gpt: {} routing groups; at least 1", routing_groups);
  }
};

// Which pieces a stage holds, [first_piece, end_piece), and where it sits among the model's
// stages (index, of count) — which decides the stages its parameters are marked as held by.
struct stage_cut {
  std::int64_t first_piece = 0;
  std::int64_t end_piece = 0;  // 0 with the defaults below: every piece (the serial model)
  int index = 0;
  int count = 1;

  static stage_cut whole(const gpt_config& config) { return {0, config.pieces(), 0, 1}; }
};

// What a stage is given per micro-batch: every stage gets the micro-batch's ids (the first embeds
// the tokens, the last scores the targets; every one checks that its group's ranks agree), and
// all but the first the previous stage's activations.
template <class T, class Device>
struct gpt_stage_input {
  tensor_view<const std::int32_t, Device> tokens{};   // (batch, seq)
  tensor_view<const std::int32_t, Device> targets{};  // (batch, seq)
  tensor_view<const T, Device> activations{};         // (batch, rows, d); empty on the first stage
  std::int32_t ignore_index = kernels::no_target;
};

// What it returns: activations for the next stage, or (the last stage) the loss of the micro-batch.
template <class T, class Device>
struct gpt_stage_output {
  quintet::tensor<T, Device> activations;  // (batch, rows, d); empty on the last stage
  kernels::cross_entropy_result loss;      // the last stage's
};

// What it is given back: the gradient of its activations from the next stage, or (the last stage)
// d(objective)/d(loss sum), e.g. 1 / (targets counted in the whole batch); and, on every stage,
// d(objective)/d(each MoE block's auxiliary losses of this micro-batch): the trainer's objective is
// the mean over micro-batches and dp ranks, 1 / (micro-batches x dp).
template <class T, class Device>
struct gpt_stage_gradient {
  tensor_view<const T, Device> activations{};  // (batch, rows, d); empty on the last stage
  double loss_scale = 1.0;
  double aux_loss_scale = 1.0;
};

// One MoE block's routing over the forwards since the last reset (gpt_stage::routing).
struct block_routing {
  std::int64_t layer = 0;  // the block's index in the model
  routing_totals totals;
};

template <class T, class Device, class Plan = serial_plan, class Mesh = parallel::no_mesh>
class gpt_stage {
  static_assert(parallel::mesh_for<Mesh, Plan>,
                "nn::gpt_stage<T, Device, Plan, Mesh>: a parallel plan needs a device mesh type "
                "(Mesh = device_mesh<Comm>), not parallel::no_mesh");
  using stat_type = kernels::accumulator_t<T>;
  using projections = parallel::projections<T, Device, Plan, Mesh>;
  using sequence = parallel::sequence_of<Plan>;
  using block_type = transformer_block<T, Device, Plan, Mesh>;
  static constexpr bool vocab_parallel = parallel::uses_tensor_parallel<Plan>;

 public:
  using device_type = Device;
  using input_type = gpt_stage_input<T, Device>;
  using output_type = gpt_stage_output<T, Device>;
  using gradient_type = gpt_stage_gradient<T, Device>;
  using input_gradient_type = quintet::tensor<T, Device>;  // no data from the first stage
  // Called with the parameters whose gradients a piece's backward has just completed.
  using gradients_ready_hook = std::function<void(std::span<parameter<T, Device>* const>)>;

  gpt_stage(parameter_registry<T, Device>& registry, const execution<Device>& exec,
            const gpt_config& config, stage_cut cut, Mesh* mesh = nullptr)
      : exec_(exec),
        config_(
            (config.validate(), parallel::check_mesh<Plan>(mesh, dimensions_of(config)), config)),
        cut_(checked_cut(cut, config)),
        mesh_(mesh),
        shard_(parallel::vocab_shard_of(config.vocab, projections::tp_size(mesh), tp_rank(mesh))) {
    const std::size_t first_parameter = registry.size();
    // Registration order is the serial model's (embedding, final norm, blocks, head; a last
    // stage's copy of the tied table comes last): the gradient norm sums in it.
    if (holds_embedding())
      embedding_.emplace(registry, exec, "embedding", config.vocab, config.max_seq, config.d_model,
                         config.init_stddev, mesh);
    embedding_parameters_ = registered_since(registry, first_parameter);
    if (holds_head()) final_norm_.emplace(registry, exec, "final_norm", config.d_model);
    head_parameters_ = registered_since(registry, first_parameter + embedding_parameters_.size());
    // GPT-2 scales the projections into the residual stream by 1/sqrt(2 L): the stream's variance
    // then stays O(1) however deep the model.
    const block_options options{
        .d_model = config.d_model,
        .heads = config.heads,
        .mlp_hidden = config.hidden(),
        .init_stddev = config.init_stddev,
        .proj_init_stddev =
            config.init_stddev / std::sqrt(2.0 * static_cast<double>(config.layers)),
        .recompute = config.recompute};
    for (std::int64_t piece = std::max<std::int64_t>(cut_.first_piece, 1);
         piece < std::min(cut_.end_piece, config.layers + 1); ++piece) {
      const std::size_t before = registry.size();
      block_options block = options;
      if (config.is_moe_block(piece - 1)) block.moe = config.moe();
      blocks_.push_back(std::make_unique<block_type>(
          registry, exec, "blocks." + std::to_string(piece - 1), block, mesh));
      block_layers_.push_back(piece - 1);
      block_parameters_.push_back(registered_since(registry, before));
    }
    const std::size_t before_head = registry.size();
    if (holds_head() && !config.tie_weights)
      head_.emplace(projections::make_column(
          registry, exec, mesh, "lm_head", config.d_model,
          parallel::padded_vocab(config.vocab, projections::tp_size(mesh)),
          linear_options{.bias = false,
                         .init_stddev = config.init_stddev,
                         // (padded vocab, d) stored; the vocabulary's rows are the logical ones
                         .weight_placement = parallel::placement::replicated().with_logical_shape(
                             shape{config.vocab, config.d_model})}));
    if (holds_head() && config.tie_weights && !holds_embedding()) {
      // The last stage's copy of the token table, registered as the embedding registers it —
      // unless this registry already has it: a rank that also holds the first stage (a V-shaped
      // pipeline puts stages 0 and 2p-1 on rank 0) keeps one table, both gradients in it.
      for (auto& p : registry)
        if (p.name == "embedding.token_weight") tied_table_ = &p;
      if (tied_table_ == nullptr)
        tied_table_ = &embedding<T, Device, Plan, Mesh>::add_token_table(
            registry, "embedding", config.vocab, config.d_model, config.init_stddev, mesh);
    }
    for (auto* p : registered_since(registry, before_head)) head_parameters_.push_back(p);
    mark_stages(registry, first_parameter);
    if (holds_embedding()) piece_uses_.push_back(embedding_parameters_);
    for (const auto& parameters : block_parameters_) piece_uses_.push_back(parameters);
    if (holds_head()) {
      piece_uses_.push_back(head_parameters_);
      if (config_.tie_weights && std::find(head_parameters_.begin(), head_parameters_.end(),
                                           &token_table()) == head_parameters_.end())
        piece_uses_.back().push_back(&token_table());
    }
  }
  gpt_stage(parameter_registry<T, Device>&, const execution<Device>&&, const gpt_config&, stage_cut,
            Mesh* = nullptr) = delete;

  output_type forward(context<Device>& ctx, const input_type& in) {
    // First, before any check that could stop some ranks only, while the others wait.
    parallel::check_replicated_batch<Plan>(mesh_, in.tokens, in.targets);
    QUINTET_CHECK(in.tokens.shape() == in.targets.shape(),
                  "gpt: tokens {} and targets {} must have the same shape", in.tokens.shape(),
                  in.targets.shape());
    QUINTET_CHECK(in.tokens.rank() == 2, "gpt: tokens have shape {}, expected (batch, seq)",
                  in.tokens.shape());
    const std::int64_t seq = in.tokens.shape()[1];
    QUINTET_CHECK(seq <= config_.max_seq, "gpt: sequence of {} tokens is longer than max_seq {}",
                  seq, config_.max_seq);
    const parallel::sequence_layout input = sequence::input_layout(mesh_, seq);
    const parallel::sequence_layout activation = sequence::activation_layout(mesh_, seq);
    // The padding id and the batch's shape belong to this micro-batch: they are kept with its
    // activations, so backwards of several micro-batches in flight (pipelines) use their own.
    {
      quintet::tensor<std::int32_t, host> kept(shape{3});
      kept(0) = in.ignore_index;
      kept(1) = static_cast<std::int32_t>(in.tokens.shape()[0]);
      kept(2) = static_cast<std::int32_t>(seq);
      copy(ctx.template save<std::int32_t>("gpt.micro_batch", shape{3}), kept);
    }
    quintet::tensor<T, Device> x;  // (batch, rows, d)
    std::size_t next_block = 0;
    if (holds_embedding()) {
      x = in_piece(0, pass::forward, [&] {
        return embedding_->forward(ctx, parallel::take_rows(in.tokens, input), activation);
      });
    } else {
      const shape expected{in.tokens.shape()[0], activation.rows(), config_.d_model};
      QUINTET_CHECK(in.activations.shape() == expected,
                    "gpt stage {}: activations of shape {} from the previous stage, expected {}",
                    cut_.index, in.activations.shape(), expected);
      if (blocks_.empty()) {
        x = copy_of(in.activations);
      } else {
        x = in_piece(block_piece(0), pass::forward,
                     [&] { return blocks_[0]->forward(ctx, in.activations); });
        ++next_block;
      }
    }
    for (; next_block < blocks_.size(); ++next_block)
      x = in_piece(block_piece(next_block), pass::forward,
                   [&] { return blocks_[next_block]->forward(ctx, x.view()); });
    output_type out;
    if (holds_head()) {
      out.loss = in_piece(piece_uses_.size() - 1, pass::forward, [&] {
        return head_forward(ctx, std::move(x), in.targets, input, in.ignore_index);
      });
    } else {
      out.activations = std::move(x);
    }
    return out;
  }

  // Accumulates the gradients of the objective (given back as `gradient`) into this stage's
  // parameters; returns the gradient of its input activations (a tensor without data from the
  // first stage, whose input is token ids).
  input_gradient_type backward(context<Device>& ctx, const gradient_type& gradient) {
    const std::int64_t seq = saved(ctx).seq;
    quintet::tensor<T, Device> dx = blocks_backward(
        ctx, gradient, false, [&](block_type& block, tensor_view<const T, Device> dy) {
          quintet::tensor<T, Device> block_dx = block.backward(ctx, dy, gradient.aux_loss_scale);
          announce(parameters_of(block));
          return block_dx;
        });
    if (!holds_embedding()) return dx;
    in_piece(0, pass::backward, [&] {
      embedding_->backward(ctx, dx.view(), sequence::activation_layout(mesh_, seq));
      announce(embedding_parameters_);
    });
    return {};
  }

  // The input pass of backward: the same input gradient; keeps what backward_weight needs.
  input_gradient_type backward_input(context<Device>& ctx, const gradient_type& gradient) {
    quintet::tensor<T, Device> dx = blocks_backward(
        ctx, gradient, true, [&](block_type& block, tensor_view<const T, Device> dy) {
          return block.backward_input(ctx, dy, gradient.aux_loss_scale);
        });
    if (!holds_embedding()) return dx;
    embedding_->backward_input(ctx, dx.view());
    return {};
  }

  // The weight pass, in backward's order (the tied table takes the head's part, then the
  // embedding's), so the two passes give backward's bits.
  void backward_weight(context<Device>& ctx) {
    const std::int64_t seq = saved(ctx).seq;
    if (holds_head()) {
      in_piece(piece_uses_.size() - 1, pass::backward_weight, [&] {
        if (head_) {
          head_->backward_weight(ctx);
        } else {
          tied_head_weight_gradient(ctx, ctx.template get<T>("lm_head.output_grad"));
          ctx.erase("lm_head.output_grad");
        }
        final_norm_->backward_weight(ctx);
        announce(head_parameters_);
      });
    }
    for (auto block = blocks_.rbegin(); block != blocks_.rend(); ++block)
      in_piece(block_piece(blocks_.rend() - block - 1), pass::backward_weight, [&] {
        (*block)->backward_weight(ctx);
        announce(parameters_of(**block));
      });
    if (holds_embedding()) {
      in_piece(0, pass::backward_weight, [&] {
        embedding_->backward_weight(ctx, sequence::activation_layout(mesh_, seq));
        announce(embedding_parameters_);
      });
    }
  }

  // From now on, `hook` hears of every piece's completed gradients (none: an empty function).
  void on_gradients_ready(gradients_ready_hook hook) { gradients_ready_ = std::move(hook); }
  // From now on, each piece acquires its parameters before it runs and releases them after.
  void on_parameter_access(parameter_access<T, Device> access) { access_ = std::move(access); }
  // Each piece's parameters, in forward order (the embedding, the blocks, the head: those held),
  // the head's with the tied table when it reads it.
  const std::vector<std::vector<parameter<T, Device>*>>& piece_parameters() const {
    return piece_uses_;
  }

  // The routing of every MoE block this stage holds, summed over the forwards since
  // reset_routing() (a block's recomputation is not counted), in layer order; empty when dense.
  std::vector<block_routing> routing() const {
    std::vector<block_routing> out;
    for (std::size_t i = 0; i < blocks_.size(); ++i)
      if (blocks_[i]->is_moe()) out.push_back({block_layers_[i], blocks_[i]->routing()});
    return out;
  }
  void reset_routing() {
    for (auto& block : blocks_) block->reset_routing();
  }

  bool holds_embedding() const { return cut_.first_piece == 0; }
  bool holds_head() const { return cut_.end_piece == config_.pieces(); }
  const stage_cut& cut() const { return cut_; }
  const gpt_config& config() const { return config_; }

 private:
  static parallel::model_dimensions dimensions_of(const gpt_config& config) {
    return {.d_model = config.d_model,
            .heads = config.heads,
            .hidden = config.hidden(),
            .vocab = config.vocab,
            .layers = config.layers,
            .experts = config.experts,
            .top_k = config.experts > 0 ? config.top_k : 0};
  }

  static stage_cut checked_cut(stage_cut cut, const gpt_config& config) {
    QUINTET_CHECK(
        0 <= cut.first_piece && cut.first_piece < cut.end_piece && cut.end_piece <= config.pieces(),
        "gpt stage: pieces [{}, {}) are not a non-empty range of the model's {} pieces "
        "(embedding, {} blocks, head)",
        cut.first_piece, cut.end_piece, config.pieces(), config.layers);
    QUINTET_CHECK(0 <= cut.index && cut.index < cut.count,
                  "gpt stage: stage index {} is outside [0, {})", cut.index, cut.count);
    // The embedding is the first stage's and the head the last's: the placements that mark the
    // tied table as held by stages 0 and count - 1 depend on it.
    QUINTET_CHECK((cut.first_piece == 0) == (cut.index == 0),
                  "gpt stage: stage {} of {} {} the embedding (piece 0); the first stage holds it",
                  cut.index, cut.count, cut.first_piece == 0 ? "holds" : "does not hold");
    QUINTET_CHECK((cut.end_piece == config.pieces()) == (cut.index == cut.count - 1),
                  "gpt stage: stage {} of {} {} the head (piece {}); the last stage holds it",
                  cut.index, cut.count,
                  cut.end_piece == config.pieces() ? "holds" : "does not hold",
                  config.pieces() - 1);
    return cut;
  }

  static int tp_rank(Mesh* mesh) {
    if constexpr (vocab_parallel) {
      return mesh->tp().rank();
    } else {
      return 0;
    }
  }

  // Every parameter this stage registered is held by this stage; the tied token table by the
  // first and the last.
  void mark_stages(parameter_registry<T, Device>& registry, std::size_t first_parameter) {
    const parameter<T, Device>* table =
        config_.tie_weights && (holds_embedding() || holds_head()) ? &token_table() : nullptr;
    std::size_t i = 0;
    for (auto& p : registry) {
      if (i++ < first_parameter) continue;
      p.placement = &p == table ? p.placement.held_by({0, cut_.count - 1})
                                : p.placement.held_by({cut_.index});
    }
  }

  parameter<T, Device>& token_table() {
    return tied_table_ != nullptr ? *tied_table_ : embedding_->token_weight();
  }

  static std::vector<parameter<T, Device>*> registered_since(
      parameter_registry<T, Device>& registry, std::size_t first) {
    std::vector<parameter<T, Device>*> out;
    for (auto p = registry.begin() + static_cast<std::ptrdiff_t>(first); p != registry.end(); ++p)
      out.push_back(&*p);
    return out;
  }
  const std::vector<parameter<T, Device>*>& parameters_of(const block_type& block) const {
    for (std::size_t i = 0; i < blocks_.size(); ++i)
      if (blocks_[i].get() == &block) return block_parameters_[i];
    QUINTET_FAIL("gpt stage {}: a block it does not hold", cut_.index);
  }
  // backward_input and backward_weight: the split backward's two passes.
  enum class pass { forward, backward, backward_input, backward_weight };
  std::size_t block_piece(std::ptrdiff_t block) const {
    return static_cast<std::size_t>(block) + (holds_embedding() ? 1 : 0);
  }
  // Piece i's use of its parameters in a pass: values except in the embedding's backward (which
  // scatters into its gradient) and in a weight pass, gradients in backward and the weight pass.
  parameter_use<T, Device> use_of(std::size_t i, pass p) const {
    const bool embedding = holds_embedding() && i == 0;
    return {.parameters = piece_uses_[i],
            .values = p == pass::forward ||
                      ((p == pass::backward || p == pass::backward_input) && !embedding),
            .gradients = p == pass::backward || p == pass::backward_weight};
  }
  // Runs `run` (piece i's computation in pass p) between the access hooks' acquire and release.
  template <class Run>
  decltype(auto) in_piece(std::size_t i, pass p, Run&& run) {
    if (!access_) return run();
    const parameter_use<T, Device> now = use_of(i, p);
    std::optional<parameter_use<T, Device>> next;
    if (p == pass::forward && i + 1 < piece_uses_.size()) next = use_of(i + 1, p);
    if (p != pass::forward && i > 0) next = use_of(i - 1, p);
    access_.acquire(now, next ? &*next : nullptr);
    if constexpr (std::is_void_v<decltype(run())>) {
      run();
      access_.release(now);
    } else {
      decltype(auto) result = run();
      access_.release(now);
      return result;
    }
  }

  void announce(const std::vector<parameter<T, Device>*>& parameters) {
    if (gradients_ready_ && !parameters.empty()) gradients_ready_(parameters);
  }

  // The head's (or the next stage's) gradient through the blocks, last first, by `pass`: dx
  // (batch, rows, d) into the embedding or the previous stage.
  template <class Pass>
  quintet::tensor<T, Device> blocks_backward(context<Device>& ctx, const gradient_type& gradient,
                                             bool split, Pass&& pass) {
    auto block = blocks_.rbegin();
    quintet::tensor<T, Device> dx;
    if (holds_head()) {
      dx = in_piece(piece_uses_.size() - 1, split ? pass::backward_input : pass::backward, [&] {
        quintet::tensor<T, Device> head_dx = head_backward(ctx, gradient.loss_scale, split);
        if (!split) announce(head_parameters_);
        return head_dx;
      });
    } else {
      const saved_micro_batch kept = saved(ctx);
      const shape expected{kept.batch, sequence::activation_layout(mesh_, kept.seq).rows(),
                           config_.d_model};
      QUINTET_CHECK(gradient.activations.shape() == expected,
                    "gpt stage {}: a gradient of shape {} from the next stage, expected {}",
                    cut_.index, gradient.activations.shape(), expected);
      if (block == blocks_.rend()) return copy_of(gradient.activations);
      dx = in_piece(block_piece(blocks_.rend() - block - 1),
                    split ? pass::backward_input : pass::backward,
                    [&] { return pass(**block, gradient.activations); });
      ++block;
    }
    for (; block != blocks_.rend(); ++block)
      dx = in_piece(block_piece(blocks_.rend() - block - 1),
                    split ? pass::backward_input : pass::backward,
                    [&] { return pass(**block, dx.view()); });
    return dx;
  }

  static quintet::tensor<T, Device> copy_of(tensor_view<const T, Device> x) {
    quintet::tensor<T, Device> out(x.shape());
    copy(out, x);
    return out;
  }

  // x (batch, rows, d) -> the micro-batch's loss; keeps what the head's backward needs.
  kernels::cross_entropy_result head_forward(context<Device>& ctx, quintet::tensor<T, Device> x,
                                             tensor_view<const std::int32_t, Device> targets,
                                             const parallel::sequence_layout& input,
                                             std::int32_t ignore_index) {
    x = final_norm_->forward(ctx, x.view());
    const std::int64_t batch = targets.shape()[0], rows = input.rows();
    auto& logits = ctx.template save<T>("lm_head.logits", shape{batch, rows, shard_.columns});
    if (head_) {
      copy(logits, head_->forward(ctx, x.view()));
    } else {
      // The tied head is a column-parallel projection over the vocabulary: under megatron_sp it
      // keeps the sequence block and gathers it (again in backward), as column_linear does.
      auto& kept = ctx.template save<T>("lm_head.input", x.shape());
      copy(kept, x);
      parallel::with_whole_rows<Plan>(mesh_, kept, [&](tensor_view<const T, Device> rows_in) {
        kernels::matmul(exec_, rows_in, token_table().value, logits, {.transpose_b = true});
      });
    }
    auto& my_targets = ctx.template save<std::int32_t>("lm_head.targets", shape{batch, rows});
    copy(my_targets, parallel::take_rows(targets, input));
    auto& lse = ctx.template save<stat_type>("lm_head.lse", shape{batch, rows});
    kernels::cross_entropy_result loss;
    if constexpr (vocab_parallel) {
      loss = parallel::vocab_parallel_cross_entropy_forward(exec_, mesh_->tp(), logits, my_targets,
                                                            lse, ignore_index, shard_);
    } else {
      loss = kernels::cross_entropy_forward(exec_, logits, my_targets, lse, ignore_index);
    }
    return sequence::complete_loss(mesh_, loss);
  }

  // The head's backward from d(objective)/d(loss sum) -> dx (batch, rows, d) into the last block.
  // `split`: the input pass only (the head's weight gradients wait for backward_weight).
  quintet::tensor<T, Device> head_backward(context<Device>& ctx, double loss_scale, bool split) {
    const std::int32_t ignore_index = saved(ctx).ignore_index;
    const auto& logits = ctx.template get<T>("lm_head.logits");
    const auto& targets = ctx.template get<std::int32_t>("lm_head.targets");
    const auto& lse = ctx.template get<stat_type>("lm_head.lse");
    quintet::tensor<T, Device> dlogits(logits.shape());  // (batch, rows, vocab / tp)
    if constexpr (vocab_parallel) {
      parallel::vocab_parallel_cross_entropy_backward(exec_, logits, targets, lse, dlogits,
                                                      loss_scale, ignore_index, shard_);
    } else {
      kernels::cross_entropy_backward(exec_, logits, targets, lse, dlogits, loss_scale,
                                      ignore_index);
    }
    if (split) {
      // The weight pass needs dlogits, not what made them: a zero-bubble schedule holds the
      // context between the passes, so the (batch, rows, vocab / tp) logits go now.
      ctx.erase("lm_head.logits");
      ctx.erase("lm_head.targets");
      ctx.erase("lm_head.lse");
    }
    quintet::tensor<T, Device> dx;  // (batch, rows, d)
    if (head_) {
      dx =
          split ? head_->backward_input(ctx, dlogits.view()) : head_->backward(ctx, dlogits.view());
    } else {
      if (split) {
        copy(ctx.template save<T>("lm_head.output_grad", dlogits.shape()), dlogits);
      } else {
        tied_head_weight_gradient(ctx, dlogits);
      }
      // dx = dlogits W over the logits' rows (whole under megatron_sp), summed over tp.
      dx = quintet::tensor<T, Device>(dlogits.shape().with_extent(2, config_.d_model));
      kernels::matmul(exec_, dlogits, token_table().value, dx);
      dx = parallel::complete_partial_rows<Plan>(mesh_, std::move(dx));
    }
    return split ? final_norm_->backward_input(ctx, dx.view())
                 : final_norm_->backward(ctx, dx.view());
  }

  // The token table's gradient from the head's use of it: dW += dlogits^T x over the logits' rows.
  void tied_head_weight_gradient(context<Device>& ctx, const quintet::tensor<T, Device>& dlogits) {
    parameter<T, Device>& table = token_table();
    parallel::with_whole_rows<Plan>(
        mesh_, ctx.template get<T>("lm_head.input"), [&](tensor_view<const T, Device> input) {
          const std::int64_t rows = input.numel() / config_.d_model;
          kernels::matmul(exec_, reshape(dlogits, shape{rows, shard_.columns}),
                          reshape(input, shape{rows, config_.d_model}), table.grad,
                          {.transpose_a = true, .beta = 1.0});
        });
  }

  struct saved_micro_batch {
    std::int32_t ignore_index = 0;
    std::int64_t batch = 0, seq = 0;
  };
  static saved_micro_batch saved(const context<Device>& ctx) {
    quintet::tensor<std::int32_t, host> kept(shape{3});
    copy(kept, ctx.template get<std::int32_t>("gpt.micro_batch"));
    return {kept(0), kept(1), kept(2)};
  }

  const execution<Device>& exec_;
  gpt_config config_;
  stage_cut cut_;
  Mesh* mesh_;
  parallel::vocab_shard shard_;  // this rank's block of the (padded) vocabulary
  std::optional<embedding<T, Device, Plan, Mesh>> embedding_;
  std::optional<layer_norm<T, Device>> final_norm_;
  std::vector<std::unique_ptr<block_type>> blocks_;
  std::vector<std::int64_t> block_layers_;            // each block's index in the model
  std::optional<typename projections::column> head_;  // only when the weights are not tied
  parameter<T, Device>* tied_table_ = nullptr;        // the last stage's copy of the table
  // The parameters each piece registered: what a piece's backward completes.
  std::vector<parameter<T, Device>*> embedding_parameters_, head_parameters_;
  std::vector<std::vector<parameter<T, Device>*>> block_parameters_;
  gradients_ready_hook gradients_ready_;
  std::vector<std::vector<parameter<T, Device>*>> piece_uses_;  // forward order
  parameter_access<T, Device> access_;
};

static_assert(stage<gpt_stage<float, host>>);

}  // namespace quintet::nn
