// mlp: the transformer's feed-forward block, y = proj(gelu(fc(x))) with fc (d -> hidden) and
// proj (hidden -> d). Keeps the GELU input for the backward. Under a tensor-parallel plan fc is a
// column_linear and proj a row_linear: each rank holds hidden / tp of the hidden units.
#pragma once

#include <quintet/kernels/elementwise.hpp>
#include <quintet/kernels/execution.hpp>
#include <quintet/nn/context.hpp>
#include <quintet/nn/linear.hpp>
#include <quintet/nn/parameter.hpp>
#include <quintet/parallel/plan.hpp>
#include <quintet/parallel/projections.hpp>
#include <quintet/tensor/copy.hpp>
#include <quintet/tensor/tensor.hpp>

#include <cstdint>
#include <string>

namespace quintet::nn {

template <class T, class Device, class Plan = serial_plan, class Mesh = parallel::no_mesh>
class mlp {
  using projections = parallel::projections<T, Device, Plan, Mesh>;

 public:
  // `proj_init_stddev` lets a GPT scale the residual projection by 1/sqrt(2 layers), as GPT-2 does.
  mlp(parameter_registry<T, Device>& registry, const execution<Device>& exec, std::string name,
      std::int64_t d_model, std::int64_t hidden, double init_stddev = 0.02,
      double proj_init_stddev = 0.02, Mesh* mesh = nullptr)
      : exec_(exec),
        name_(std::move(name)),
        fc_(projections::make_column(registry, exec, mesh, name_ + ".fc", d_model, hidden,
                                     {.init_stddev = init_stddev})),
        proj_(projections::make_row(registry, exec, mesh, name_ + ".proj", hidden, d_model,
                                    {.init_stddev = proj_init_stddev})) {}
  mlp(parameter_registry<T, Device>&, const execution<Device>&&, std::string, std::int64_t,
      std::int64_t, double = 0.02, double = 0.02, Mesh* = nullptr) = delete;

  // x (..., d) -> y (..., d)
  quintet::tensor<T, Device> forward(context<Device>& ctx, tensor_view<const T, Device> x) {
    quintet::tensor<T, Device> h = fc_.forward(ctx, x);  // (..., hidden / tp), before GELU
    auto& saved = ctx.template save<T>(name_ + ".gelu_input", h.shape());
    copy(saved, h);
    kernels::gelu_forward(exec_, saved, h);  // h now holds gelu(fc(x))
    return proj_.forward(ctx, h.view());
  }

  // dy (..., d) -> dx (..., d)
  quintet::tensor<T, Device> backward(context<Device>& ctx, tensor_view<const T, Device> dy) {
    quintet::tensor<T, Device> da = proj_.backward(ctx, dy);  // (..., hidden)
    kernels::gelu_backward(exec_, ctx.template get<T>(name_ + ".gelu_input"), da, da);
    return fc_.backward(ctx, da.view());
  }

  // The input pass (keeps each linear's dy) and the weight pass: together, backward's bits.
  quintet::tensor<T, Device> backward_input(context<Device>& ctx, tensor_view<const T, Device> dy) {
    quintet::tensor<T, Device> da = proj_.backward_input(ctx, dy);  // (..., hidden)
    kernels::gelu_backward(exec_, ctx.template get<T>(name_ + ".gelu_input"), da, da);
    return fc_.backward_input(ctx, da.view());
  }
  void backward_weight(context<Device>& ctx) {
    proj_.backward_weight(ctx);
    fc_.backward_weight(ctx);
  }

  // After the input pass, for a caller that will not run this micro-batch's backward again (a
  // recomputing block whose weight pass may come much later): erases what only the input pass
  // reads, the GELU input.
  void drop_input_pass_tensors(context<Device>& ctx) { ctx.erase(name_ + ".gelu_input"); }

 private:
  const execution<Device>& exec_;
  std::string name_;
  typename projections::column fc_;  // d -> hidden (hidden / tp on this rank)
  typename projections::row proj_;   // hidden -> d
};

}  // namespace quintet::nn
