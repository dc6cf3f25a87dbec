// transformer_block: GPT-2's pre-LN block, h = x + attention(ln1(x)), y = h + ffn(ln2(h)), where
// the feed-forward ffn is the dense nn::mlp (`<name>.mlp`) or, when block_options::moe is set, a
// mixture of experts nn::moe (`<name>.moe`), whose auxiliary losses enter backward with weight
// aux_loss_scale. The plan decides how attention and the feed-forward are split; layer norms and
// residuals see whole activations.
//
// What forward keeps for backward is the block's recompute mode (recompute_mode.hpp):
//   none        every sublayer's tensors (docs/nn.md lists them)
//   selective   the same but the attention core's output and log-sum-exp (recomputed from q, k, v)
//   full        the block's input only, under "<name>.input": backward reruns the forward into a
//               scratch context (re-issuing its collectives in the same order on every rank), then
//               runs the backward from it.
// After a whole backward the context holds what forward kept. In two passes (zero-bubble
// schedules hold a micro-batch between them) a recomputing block's input pass erases what only it
// reads (q, k, v, the log-sum-exp, the GELU input; under full recomputation the block's input),
// and under full recomputation, which reruns the forward into the context itself since the
// weight pass needs what it kept, the weight pass erases the rest. A recomputed MoE forward routes
// the same tokens with the same weights, so it makes the same decisions and, under ep, issues the
// same all-to-alls (every ep rank reruns the same block at the same point of its step): the same
// bits. routing() counts the forwards only, not their recomputations.
#pragma once

#include <quintet/kernels/elementwise.hpp>
#include <quintet/kernels/execution.hpp>
#include <quintet/nn/causal_self_attention.hpp>
#include <quintet/nn/context.hpp>
#include <quintet/nn/layer_norm.hpp>
#include <quintet/nn/mlp.hpp>
#include <quintet/nn/moe.hpp>
#include <quintet/nn/parameter.hpp>
#include <quintet/nn/recompute_mode.hpp>
#include <quintet/parallel/plan.hpp>
#include <quintet/parallel/projections.hpp>
#include <quintet/tensor/tensor.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace quintet::nn {

struct block_options {
  std::int64_t d_model = 64;
  std::int64_t heads = 4;
  std::int64_t mlp_hidden = 256;
  double init_stddev = 0.02;
  double proj_init_stddev = 0.02;                   // the two projections into the residual stream
  recompute_mode recompute = recompute_mode::none;  // what forward keeps for backward
  // The feed-forward: none, the dense MLP; given, a mixture of experts of mlp_hidden units each
  // (its init_stddev and proj_init_stddev are the block's).
  std::optional<moe_options> moe{};
};

template <class T, class Device, class Plan = serial_plan, class Mesh = parallel::no_mesh>
class transformer_block {
  // Without ep, tp or tokens split over sp a MoE layer runs alone on every rank whatever the plan:
  // the serial layer, one instantiation for every such plan.
  static constexpr bool parallel_moe = parallel::uses_expert_parallel<Plan> ||
                                       parallel::uses_tensor_parallel<Plan> ||
                                       parallel::splits_tokens_over_sp<Plan>;
  using moe_type = std::conditional_t<parallel_moe, moe<T, Device, Plan, Mesh>, moe<T, Device>>;

 public:
  transformer_block(parameter_registry<T, Device>& registry, const execution<Device>& exec,
                    const std::string& name, const block_options& options, Mesh* mesh = nullptr)
      : exec_(exec),
        name_(name),
        recompute_(options.recompute),
        ln1_(registry, exec, name + ".ln1", options.d_model),
        attention_(registry, exec, name + ".attn", options.d_model, options.heads,
                   options.init_stddev, options.proj_init_stddev, mesh,
                   options.recompute == recompute_mode::selective),
        ln2_(registry, exec, name + ".ln2", options.d_model) {
    if (options.moe) {
      moe_options experts = *options.moe;
      experts.init_stddev = options.init_stddev;
      experts.proj_init_stddev = options.proj_init_stddev;
      if constexpr (parallel_moe) {
        moe_.emplace(registry, exec, name + ".moe", options.d_model, options.mlp_hidden, experts,
                     mesh);
      } else {
        check_moe_mesh<Plan>(name + ".moe", mesh);
        moe_.emplace(registry, exec, name + ".moe", options.d_model, options.mlp_hidden, experts);
      }
      routing_.kept.assign(static_cast<std::size_t>(experts.experts), 0);
      routing_.routed = routing_.kept;
    } else {
      mlp_.emplace(registry, exec, name + ".mlp", options.d_model, options.mlp_hidden,
                   options.init_stddev, options.proj_init_stddev, mesh);
    }
  }
  transformer_block(parameter_registry<T, Device>&, const execution<Device>&&, const std::string&,
                    const block_options&, Mesh* = nullptr) = delete;

  // x (batch, seq, d) -> y (batch, seq, d)
  quintet::tensor<T, Device> forward(context<Device>& ctx, tensor_view<const T, Device> x) {
    quintet::tensor<T, Device> y;
    if (recompute_ != recompute_mode::full) {
      y = run_forward(ctx, x);
    } else {
      copy(ctx.template save<T>(input_name(), x.shape()), x);
      context<Device> scratch;  // what the sublayers keep, dropped: backward recomputes it
      y = run_forward(scratch, x);
    }
    if (moe_) routing_.add(moe_->statistics());
    return y;
  }

  // dy (batch, seq, d) -> dx (batch, seq, d). The objective is sum(dy * y) + aux_loss_scale x the
  // MoE layer's auxiliary losses (none in a dense block).
  quintet::tensor<T, Device> backward(context<Device>& ctx, tensor_view<const T, Device> dy,
                                      double aux_loss_scale = 1.0) {
    if (recompute_ != recompute_mode::full) return run_backward(ctx, dy, aux_loss_scale);
    context<Device> scratch;
    rerun_forward(scratch, ctx);
    return run_backward(scratch, dy, aux_loss_scale);
  }

  // The input pass (every layer keeps what its weight pass needs) and the weight pass: together,
  // backward's bits.
  quintet::tensor<T, Device> backward_input(context<Device>& ctx, tensor_view<const T, Device> dy,
                                            double aux_loss_scale = 1.0) {
    if (recompute_ == recompute_mode::full) rerun_forward(ctx, ctx);
    quintet::tensor<T, Device> dh = ln2_.backward_input(
        ctx, (moe_ ? moe_->backward_input(ctx, dy, aux_loss_scale) : mlp_->backward_input(ctx, dy))
                 .view());
    kernels::add(exec_, dh, dy, dh);
    quintet::tensor<T, Device> dx =
        ln1_.backward_input(ctx, attention_.backward_input(ctx, dh.view()).view());
    kernels::add(exec_, dx, dh, dx);
    if (recompute_ != recompute_mode::none) {
      attention_.drop_input_pass_tensors(ctx);
      if (moe_) {
        moe_->drop_input_pass_tensors(ctx);
      } else {
        mlp_->drop_input_pass_tensors(ctx);
      }
      if (recompute_ == recompute_mode::full) ctx.erase(input_name());
    }
    return dx;
  }
  void backward_weight(context<Device>& ctx) {
    if (moe_) {
      moe_->backward_weight(ctx);
    } else {
      mlp_->backward_weight(ctx);
    }
    ln2_.backward_weight(ctx);
    attention_.backward_weight(ctx);
    ln1_.backward_weight(ctx);
    if (recompute_ == recompute_mode::full) drop_recomputed(ctx);
  }

  recompute_mode recompute() const { return recompute_; }

  // Whether the feed-forward is a mixture of experts, and its layer (null when dense).
  bool is_moe() const { return moe_.has_value(); }
  moe_type* moe_layer() { return moe_ ? &*moe_ : nullptr; }
  // The MoE layer's routing summed over the forwards since reset_routing() (empty when dense).
  const routing_totals& routing() const { return routing_; }
  void reset_routing() {
    const std::size_t experts = routing_.kept.size();
    routing_ = {};
    routing_.kept.assign(experts, 0);
    routing_.routed = routing_.kept;
  }

 private:
  quintet::tensor<T, Device> run_forward(context<Device>& ctx, tensor_view<const T, Device> x) {
    quintet::tensor<T, Device> h = attention_.forward(ctx, ln1_.forward(ctx, x).view());
    kernels::add(exec_, h, x, h);
    const quintet::tensor<T, Device> normed = ln2_.forward(ctx, h.view());
    quintet::tensor<T, Device> y =
        moe_ ? moe_->forward(ctx, normed.view()) : mlp_->forward(ctx, normed.view());
    kernels::add(exec_, y, h, y);
    return y;
  }

  quintet::tensor<T, Device> run_backward(context<Device>& ctx, tensor_view<const T, Device> dy,
                                          double aux_loss_scale) {
    quintet::tensor<T, Device> dh = ln2_.backward(
        ctx, (moe_ ? moe_->backward(ctx, dy, aux_loss_scale) : mlp_->backward(ctx, dy)).view());
    kernels::add(exec_, dh, dy, dh);  // the residual path
    quintet::tensor<T, Device> dx = ln1_.backward(ctx, attention_.backward(ctx, dh.view()).view());
    kernels::add(exec_, dx, dh, dx);
    return dx;
  }

  // Full recomputation: the forward again, from the input `kept` holds, into `into` (the same
  // kernels and collectives as the first time, so the same bits); its output is not needed.
  void rerun_forward(context<Device>& into, context<Device>& kept) {
    const quintet::tensor<T, Device>& x = kept.template get<T>(input_name());
    run_forward(into, x.view());
  }

  // After the weight pass of a fully recomputed block: every entry the recomputation put in the
  // context and the passes left (the block's sublayers all name theirs "<name>.<sublayer>..."),
  // aliases first.
  void drop_recomputed(context<Device>& ctx) {
    const std::string prefix = name_ + ".";
    std::vector<std::string> aliases, tensors;
    ctx.for_each([&](const context_entry& entry) {
      if (!entry.name.starts_with(prefix)) return;
      (entry.is_alias() ? aliases : tensors).emplace_back(entry.name);
    });
    for (const auto& name : aliases) ctx.erase(name);
    for (const auto& name : tensors) ctx.erase(name);
  }

  std::string input_name() const { return name_ + ".input"; }

  const execution<Device>& exec_;
  std::string name_;
  recompute_mode recompute_;
  layer_norm<T, Device> ln1_;
  causal_self_attention<T, Device, Plan, Mesh> attention_;
  layer_norm<T, Device> ln2_;
  std::optional<mlp<T, Device, Plan, Mesh>> mlp_;  // the feed-forward: one of the two
  std::optional<moe_type> moe_;
  routing_totals routing_;
};

}  // namespace quintet::nn
