// transformer_block: GPT-2's pre-LN block, h = x + attention(ln1(x)), y = h + mlp(ln2(h)). The
// plan decides how attention and MLP are split; layer norms and residuals see whole activations.
#pragma once

#include <quintet/kernels/elementwise.hpp>
#include <quintet/kernels/execution.hpp>
#include <quintet/nn/causal_self_attention.hpp>
#include <quintet/nn/context.hpp>
#include <quintet/nn/layer_norm.hpp>
#include <quintet/nn/mlp.hpp>
#include <quintet/nn/parameter.hpp>
#include <quintet/parallel/plan.hpp>
#include <quintet/parallel/projections.hpp>
#include <quintet/tensor/tensor.hpp>

#include <cstdint>
#include <string>

namespace quintet::nn {

struct block_options {
  std::int64_t d_model = 64;
  std::int64_t heads = 4;
  std::int64_t mlp_hidden = 256;
  double init_stddev = 0.02;
  double proj_init_stddev = 0.02;  // the two projections into the residual stream
};

template <class T, class Device, class Plan = serial_plan, class Mesh = parallel::no_mesh>
class transformer_block {
 public:
  transformer_block(parameter_registry<T, Device>& registry, const execution<Device>& exec,
                    const std::string& name, const block_options& options, Mesh* mesh = nullptr)
      : exec_(exec),
        ln1_(registry, exec, name + ".ln1", options.d_model),
        attention_(registry, exec, name + ".attn", options.d_model, options.heads,
                   options.init_stddev, options.proj_init_stddev, mesh),
        ln2_(registry, exec, name + ".ln2", options.d_model),
        mlp_(registry, exec, name + ".mlp", options.d_model, options.mlp_hidden,
             options.init_stddev, options.proj_init_stddev, mesh) {}
  transformer_block(parameter_registry<T, Device>&, const execution<Device>&&, const std::string&,
                    const block_options&, Mesh* = nullptr) = delete;

  // x (batch, seq, d) -> y (batch, seq, d)
  quintet::tensor<T, Device> forward(context<Device>& ctx, tensor_view<const T, Device> x) {
    quintet::tensor<T, Device> h = attention_.forward(ctx, ln1_.forward(ctx, x).view());
    kernels::add(exec_, h, x, h);
    quintet::tensor<T, Device> y = mlp_.forward(ctx, ln2_.forward(ctx, h.view()).view());
    kernels::add(exec_, y, h, y);
    return y;
  }

  // dy (batch, seq, d) -> dx (batch, seq, d)
  quintet::tensor<T, Device> backward(context<Device>& ctx, tensor_view<const T, Device> dy) {
    quintet::tensor<T, Device> dh = ln2_.backward(ctx, mlp_.backward(ctx, dy).view());
    kernels::add(exec_, dh, dy, dh);  // the residual path
    quintet::tensor<T, Device> dx = ln1_.backward(ctx, attention_.backward(ctx, dh.view()).view());
    kernels::add(exec_, dx, dh, dx);
    return dx;
  }

  // The input pass (every layer keeps what its weight pass needs) and the weight pass: together,
  // backward's bits.
  quintet::tensor<T, Device> backward_input(context<Device>& ctx, tensor_view<const T, Device> dy) {
    quintet::tensor<T, Device> dh = ln2_.backward_input(ctx, mlp_.backward_input(ctx, dy).view());
    kernels::add(exec_, dh, dy, dh);
    quintet::tensor<T, Device> dx =
        ln1_.backward_input(ctx, attention_.backward_input(ctx, dh.view()).view());
    kernels::add(exec_, dx, dh, dx);
    return dx;
  }
  void backward_weight(context<Device>& ctx) {
    mlp_.backward_weight(ctx);
    ln2_.backward_weight(ctx);
    attention_.backward_weight(ctx);
    ln1_.backward_weight(ctx);
  }

 private:
  const execution<Device>& exec_;
  layer_norm<T, Device> ln1_;
  causal_self_attention<T, Device, Plan, Mesh> attention_;
  layer_norm<T, Device> ln2_;
  mlp<T, Device, Plan, Mesh> mlp_;
};

}  // namespace quintet::nn
