// transformer_block: GPT-2's pre-LN block, h = x + attention(ln1(x)), y = h + mlp(ln2(h)). The
// plan decides how attention and MLP are split; layer norms and residuals see whole activations.
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
// weight pass needs what it kept, the weight pass erases the rest.
#pragma once

#include <quintet/kernels/elementwise.hpp>
#include <quintet/kernels/execution.hpp>
#include <quintet/nn/causal_self_attention.hpp>
#include <quintet/nn/context.hpp>
#include <quintet/nn/layer_norm.hpp>
#include <quintet/nn/mlp.hpp>
#include <quintet/nn/parameter.hpp>
#include <quintet/nn/recompute_mode.hpp>
#include <quintet/parallel/plan.hpp>
#include <quintet/parallel/projections.hpp>
#include <quintet/tensor/tensor.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace quintet::nn {

struct block_options {
  std::int64_t d_model = 64;
  std::int64_t heads = 4;
  std::int64_t mlp_hidden = 256;
  double init_stddev = 0.02;
  double proj_init_stddev = 0.02;                   // the two projections into the residual stream
  recompute_mode recompute = recompute_mode::none;  // what forward keeps for backward
};

template <class T, class Device, class Plan = serial_plan, class Mesh = parallel::no_mesh>
class transformer_block {
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
        ln2_(registry, exec, name + ".ln2", options.d_model),
        mlp_(registry, exec, name + ".mlp", options.d_model, options.mlp_hidden,
             options.init_stddev, options.proj_init_stddev, mesh) {}
  transformer_block(parameter_registry<T, Device>&, const execution<Device>&&, const std::string&,
                    const block_options&, Mesh* = nullptr) = delete;

  // x (batch, seq, d) -> y (batch, seq, d)
  quintet::tensor<T, Device> forward(context<Device>& ctx, tensor_view<const T, Device> x) {
    if (recompute_ != recompute_mode::full) return run_forward(ctx, x);
    copy(ctx.template save<T>(input_name(), x.shape()), x);
    context<Device> scratch;  // what the sublayers keep, dropped: backward recomputes it
    return run_forward(scratch, x);
  }

  // dy (batch, seq, d) -> dx (batch, seq, d)
  quintet::tensor<T, Device> backward(context<Device>& ctx, tensor_view<const T, Device> dy) {
    if (recompute_ != recompute_mode::full) return run_backward(ctx, dy);
    context<Device> scratch;
    rerun_forward(scratch, ctx);
    return run_backward(scratch, dy);
  }

  // The input pass (every layer keeps what its weight pass needs) and the weight pass: together,
  // backward's bits.
  quintet::tensor<T, Device> backward_input(context<Device>& ctx, tensor_view<const T, Device> dy) {
    if (recompute_ == recompute_mode::full) rerun_forward(ctx, ctx);
    quintet::tensor<T, Device> dh = ln2_.backward_input(ctx, mlp_.backward_input(ctx, dy).view());
    kernels::add(exec_, dh, dy, dh);
    quintet::tensor<T, Device> dx =
        ln1_.backward_input(ctx, attention_.backward_input(ctx, dh.view()).view());
    kernels::add(exec_, dx, dh, dx);
    if (recompute_ != recompute_mode::none) {
      attention_.drop_input_pass_tensors(ctx);
      mlp_.drop_input_pass_tensors(ctx);
      if (recompute_ == recompute_mode::full) ctx.erase(input_name());
    }
    return dx;
  }
  void backward_weight(context<Device>& ctx) {
    mlp_.backward_weight(ctx);
    ln2_.backward_weight(ctx);
    attention_.backward_weight(ctx);
    ln1_.backward_weight(ctx);
    if (recompute_ == recompute_mode::full) drop_recomputed(ctx);
  }

  recompute_mode recompute() const { return recompute_; }

 private:
  quintet::tensor<T, Device> run_forward(context<Device>& ctx, tensor_view<const T, Device> x) {
    quintet::tensor<T, Device> h = attention_.forward(ctx, ln1_.forward(ctx, x).view());
    kernels::add(exec_, h, x, h);
    quintet::tensor<T, Device> y = mlp_.forward(ctx, ln2_.forward(ctx, h.view()).view());
    kernels::add(exec_, y, h, y);
    return y;
  }

  quintet::tensor<T, Device> run_backward(context<Device>& ctx, tensor_view<const T, Device> dy) {
    quintet::tensor<T, Device> dh = ln2_.backward(ctx, mlp_.backward(ctx, dy).view());
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
  mlp<T, Device, Plan, Mesh> mlp_;
};

}  // namespace quintet::nn
