// causal_self_attention: one fused projection to q, k, v (d -> 3d), causal multi-head attention,
// and an output projection (d -> d). q, k and v are column slices of the fused projection, so
// neither direction transposes or copies them. Under a tensor-parallel plan the heads are split
// over tp: qkv is a column_linear (each rank gets q, k, v of its heads), the output projection a
// row_linear. Sequence parallelism on the sp axis changes only the attention itself: Ulysses
// trades sequence rows for heads around it (all-to-all), ring passes keys and values around the sp
// ranks (each keeps its zig-zag rows).
//
// Selective recomputation (`recompute_core`, Korthikanti et al.): forward keeps q, k, v but not
// the core's output and log-sum-exp; backward recomputes them from q, k, v with the same kernel
// (ring attention: the same exchanges around the ring, in the same order) before the output
// projection's backward, and drops them as soon as nothing needs them.
//
//   qkv (batch, seq, 3d):  [ q: heads x head_dim | k: heads x head_dim | v: heads x head_dim ]
//   ulysses, sp = 2:       rank r: (batch, seq / sp, 3d / tp) -> (batch, seq, 3d / (tp sp))
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/kernels/accumulator.hpp>
#include <quintet/kernels/attention.hpp>
#include <quintet/kernels/execution.hpp>
#include <quintet/nn/context.hpp>
#include <quintet/nn/linear.hpp>
#include <quintet/nn/parameter.hpp>
#include <quintet/parallel/plan.hpp>
#include <quintet/parallel/projections.hpp>
#include <quintet/tensor/copy.hpp>
#include <quintet/tensor/slice.hpp>
#include <quintet/tensor/tensor.hpp>

#include <cstdint>
#include <string>
#include <type_traits>

namespace quintet::nn {

template <class T, class Device, class Plan = serial_plan, class Mesh = parallel::no_mesh>
class causal_self_attention {
  using stat_type = kernels::accumulator_t<T>;
  using projections = parallel::projections<T, Device, Plan, Mesh>;
  using sequence = parallel::sequence_of<Plan>;

 public:
  causal_self_attention(parameter_registry<T, Device>& registry, const execution<Device>& exec,
                        std::string name, std::int64_t d_model, std::int64_t heads,
                        double init_stddev = 0.02, double proj_init_stddev = 0.02,
                        Mesh* mesh = nullptr, bool recompute_core = false)
      : exec_(exec),
        name_(std::move(name)),
        mesh_(mesh),
        recompute_core_(recompute_core),
        d_model_(d_model),
        heads_(checked_heads(name_, d_model, heads, projections::tp_size(mesh), mesh)),
        local_heads_(heads / projections::tp_size(mesh)),
        qkv_(projections::make_column(registry, exec, mesh, name_ + ".qkv", d_model, 3 * d_model,
                                      {.init_stddev = init_stddev, .output_groups = 3})),
        proj_(projections::make_row(registry, exec, mesh, name_ + ".proj", d_model, d_model,
                                    {.init_stddev = proj_init_stddev})) {}
  causal_self_attention(parameter_registry<T, Device>&, const execution<Device>&&, std::string,
                        std::int64_t, std::int64_t, double = 0.02, double = 0.02, Mesh* = nullptr,
                        bool = false) = delete;

  // x (batch, seq, d) -> y (batch, seq, d); seq is this rank's rows under sequence parallelism.
  quintet::tensor<T, Device> forward(context<Device>& ctx, tensor_view<const T, Device> x) {
    QUINTET_CHECK(x.rank() == 3 && x.shape()[2] == d_model_,
                  "attention '{}': input has shape {}, expected (batch, seq, {})", name_, x.shape(),
                  d_model_);
    // (batch, seq, 3d / tp); Ulysses: (batch, whole seq, 3d / (tp sp))
    quintet::tensor<T, Device> projected = sequence::to_attention(mesh_, qkv_.forward(ctx, x), 3);
    auto& qkv = ctx.template save<T>(name_ + ".qkv_output", projected.shape());
    copy(qkv, projected);
    if (recompute_core_) {
      // The core's output and lse live until the projection has its input; backward recomputes
      // them.
      quintet::tensor<T, Device> out(output_shape(qkv));
      quintet::tensor<stat_type, Device> lse(lse_shape(qkv));
      attend(qkv, out, lse);
      if constexpr (sequence::attention_output_is_projection_input) {
        return proj_.apply(out.view());
      } else {
        return proj_.forward(ctx, sequence::from_attention(mesh_, out.view(), 1).view());
      }
    }
    auto& out = ctx.template save<T>(output_name(), output_shape(qkv));
    auto& lse = ctx.template save<stat_type>(lse_name(), lse_shape(qkv));
    attend(qkv, out, lse);
    if constexpr (sequence::attention_output_is_projection_input) {
      // The output projection's dW needs `out`, which attention keeps anyway for its backward.
      return proj_.forward_kept(ctx, output_name());
    } else {
      return proj_.forward(ctx, sequence::from_attention(mesh_, out.view(), 1).view());
    }
  }

  // dy (batch, seq, d) -> dx (batch, seq, d)
  quintet::tensor<T, Device> backward(context<Device>& ctx, tensor_view<const T, Device> dy) {
    recompute(ctx);
    quintet::tensor<T, Device> projection_dx = proj_.backward(ctx, dy);
    return qkv_.backward(ctx, attention_backward(ctx, std::move(projection_dx), true).view());
  }

  // The input pass (keeps each projection's dy) and the weight pass: together, backward's bits.
  quintet::tensor<T, Device> backward_input(context<Device>& ctx, tensor_view<const T, Device> dy) {
    recompute(ctx);
    quintet::tensor<T, Device> projection_dx = proj_.backward_input(ctx, dy);
    return qkv_.backward_input(ctx,
                               attention_backward(ctx, std::move(projection_dx), false).view());
  }
  void backward_weight(context<Device>& ctx) {
    proj_.backward_weight(ctx);
    qkv_.backward_weight(ctx);
    if constexpr (sequence::attention_output_is_projection_input) {
      if (recompute_core_) drop_output(ctx);  // the projection's dW was its last use
    }
  }

  // After the input pass, for a caller that will not run this micro-batch's backward again (a
  // recomputing block whose weight pass may come much later): erases what only the input pass
  // reads — q, k, v, the log-sum-exp, and the attention output unless it is the output
  // projection's input (its weight pass reads it).
  void drop_input_pass_tensors(context<Device>& ctx) {
    ctx.erase(name_ + ".qkv_output");
    if (ctx.contains(lse_name())) ctx.erase(lse_name());
    if (!sequence::attention_output_is_projection_input && ctx.contains(output_name()))
      ctx.erase(output_name());
  }

  std::int64_t heads() const { return heads_; }

 private:
  static std::int64_t checked_heads(const std::string& name, std::int64_t d_model,
                                    std::int64_t heads, int tp, Mesh* mesh) {
    QUINTET_CHECK(heads > 0 && d_model % heads == 0,
                  "attention '{}': {} heads do not divide d_model {}", name, heads, d_model);
    QUINTET_CHECK(heads % tp == 0, "attention '{}': {} heads do not divide over tp = {}", name,
                  heads, tp);
    if constexpr (mesh_like<Mesh>) {
      QUINTET_CHECK(mesh != nullptr, "attention '{}': a parallel plan needs the device mesh", name);
    }
    const std::int64_t split = sequence::head_split(mesh);
    QUINTET_CHECK(heads % (tp * split) == 0,
                  "attention '{}': {} heads do not divide over tp x {} = {} x {} (the plan's "
                  "sequence style gives each rank whole heads)",
                  name, heads, split, tp, split);
    return heads;
  }

  // dout (batch, seq, d / tp), the output projection's input gradient -> dqkv (batch, seq,
  // 3d / tp). `projection_done`: the projection's weight gradient is taken (whole backward).
  quintet::tensor<T, Device> attention_backward(context<Device>& ctx,
                                                quintet::tensor<T, Device> projection_dx,
                                                bool projection_done) {
    // As attention saw it (Ulysses: the whole sequence for this rank's heads).
    const quintet::tensor<T, Device> dout =
        sequence::to_attention(mesh_, std::move(projection_dx), 1);
    auto& qkv = ctx.template get<T>(name_ + ".qkv_output");
    const auto& out = ctx.template get<T>(output_name());
    const auto& lse = ctx.template get<stat_type>(lse_name());
    quintet::tensor<T, Device> dqkv(qkv.shape());
    sequence::attention_backward(exec_, mesh_, part(qkv, 0), part(qkv, 1), part(qkv, 2), out, lse,
                                 dout, part(dqkv, 0), part(dqkv, 1), part(dqkv, 2),
                                 attended_heads());
    if (recompute_core_) {
      // What recompute() made goes as soon as nothing needs it: lse now, the output too unless it
      // is the output projection's input and the projection's weight pass is still to come.
      ctx.erase(lse_name());
      if (!sequence::attention_output_is_projection_input || projection_done) drop_output(ctx);
    }
    return sequence::from_attention(mesh_, std::move(dqkv), 3);
  }

  // The core: out (batch, seq, width) and lse (batch, heads, seq) from the fused q, k, v.
  void attend(quintet::tensor<T, Device>& qkv, quintet::tensor<T, Device>& out,
              quintet::tensor<stat_type, Device>& lse) {
    sequence::attention_forward(exec_, mesh_, part(qkv, 0), part(qkv, 1), part(qkv, 2), out, lse,
                                attended_heads());
  }

  // Selective recomputation: the core's output and lse again, under the names forward keeps them
  // by otherwise, from the kept q, k, v; and the output projection referred to the output.
  void recompute(context<Device>& ctx) {
    if (!recompute_core_) return;
    auto& qkv = ctx.template get<T>(name_ + ".qkv_output");
    auto& out = ctx.template save<T>(output_name(), output_shape(qkv));
    auto& lse = ctx.template save<stat_type>(lse_name(), lse_shape(qkv));
    attend(qkv, out, lse);
    if constexpr (sequence::attention_output_is_projection_input)
      proj_.refer_input(ctx, output_name());
  }
  void drop_output(context<Device>& ctx) {
    if constexpr (sequence::attention_output_is_projection_input) proj_.drop_input(ctx);
    ctx.erase(output_name());
  }

  // (batch, seq, 3w) -> out (batch, seq, w) and lse (batch, attended heads, seq); seq as attention
  // sees it (Ulysses: the whole sequence).
  static shape output_shape(const quintet::tensor<T, Device>& qkv) {
    return shape{qkv.shape()[0], qkv.shape()[1], qkv.shape()[2] / 3};
  }
  shape lse_shape(const quintet::tensor<T, Device>& qkv) const {
    return shape{qkv.shape()[0], attended_heads(), qkv.shape()[1]};
  }
  std::string output_name() const { return name_ + ".attention_output"; }
  std::string lse_name() const { return name_ + ".lse"; }

  // The heads this rank attends with: its tp share, and under Ulysses its sp share of those.
  std::int64_t attended_heads() const { return local_heads_ / sequence::head_split(mesh_); }

  // q (0), k (1) or v (2): a (batch, seq, d / tp) column slice of the fused (batch, seq, 3d / tp)
  // tensor.
  tensor_view<T, Device> part(quintet::tensor<T, Device>& fused, int which) const {
    return chunk(fused, 2, 3, which);
  }

  const execution<Device>& exec_;
  std::string name_;
  Mesh* mesh_;
  bool recompute_core_;  // selective recomputation: keep q, k, v only
  std::int64_t d_model_, heads_;
  std::int64_t local_heads_;          // heads / tp on this rank
  typename projections::column qkv_;  // d -> 3d, as (3, d, d)
  typename projections::row proj_;    // d -> d
};

}  // namespace quintet::nn
