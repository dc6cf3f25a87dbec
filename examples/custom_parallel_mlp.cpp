// Example 3: a tensor-parallel block composed by hand, outside the GPT.
//
// A two-layer MLP, y = W2 gelu(W1 x + b1) + b2, split Megatron-style over 2 thread ranks: W1 is a
// column_linear (each rank holds half of the hidden units), W2 a row_linear (each rank holds the
// matching half of its inputs; one all-reduce sums the halves). The same block is built serially
// from nn::linear, and the example checks that the two compute the same output and gradients.
#include <quintet/comm/thread_comm.hpp>
#include <quintet/kernels/elementwise.hpp>
#include <quintet/mesh/device_mesh.hpp>
#include <quintet/nn/linear.hpp>
#include <quintet/parallel/placement.hpp>
#include <quintet/parallel/plan.hpp>
#include <quintet/parallel/tensor/column_linear.hpp>
#include <quintet/parallel/tensor/row_linear.hpp>
#include <quintet/tensor/copy.hpp>
#include <quintet/tensor/random.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace {

using quintet::host;
using quintet::shape;
using host_tensor = quintet::tensor<float, host>;

constexpr std::int64_t batch = 4, width = 8, hidden = 32;
constexpr std::uint64_t seed = 7;

// The block, written once for any pair of layers with forward/backward.
template <class First, class Second>
struct two_layer_mlp {
  const quintet::execution<host>& exec;
  First fc;
  Second proj;

  host_tensor forward(quintet::nn::context<host>& ctx, const host_tensor& x) {
    host_tensor h = fc.forward(ctx, x.view());  // (batch, hidden) or (batch, hidden / tp)
    auto& pre_activation = ctx.save<float>("mlp.gelu_input", h.shape());
    quintet::copy(pre_activation, h);
    quintet::kernels::gelu_forward(exec, pre_activation, h);
    return proj.forward(ctx, h.view());  // (batch, width), whole on every rank
  }
  host_tensor backward(quintet::nn::context<host>& ctx, const host_tensor& dy) {
    host_tensor da = proj.backward(ctx, dy.view());
    quintet::kernels::gelu_backward(exec, ctx.get<float>("mlp.gelu_input"), da, da);
    return fc.backward(ctx, da.view());
  }
};

host_tensor input() {
  host_tensor x(shape{batch, width});
  quintet::fill_normal(x, {.seed = 1, .stream = 1}, 0.0, 1.0);
  return x;
}

double max_difference(const host_tensor& a, const host_tensor& b) {
  double worst = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i)
    worst = std::max(worst, static_cast<double>(std::abs(a.data()[i] - b.data()[i])));
  return worst;
}

}  // namespace

int main() {
  const quintet::execution<host> exec;
  const host_tensor x = input();
  host_tensor dy(shape{batch, width});
  quintet::fill_normal(dy, {.seed = 1, .stream = 2}, 0.0, 1.0);

  // Serial: two nn::linear, the whole weights on one rank.
  quintet::nn::parameter_registry<float, host> serial_params(seed);
  two_layer_mlp<quintet::nn::linear<float, host>, quintet::nn::linear<float, host>> serial{
      exec,
      {serial_params, exec, "mlp.fc", width, hidden, {.init_stddev = 0.3}},
      {serial_params, exec, "mlp.proj", hidden, width, {.init_stddev = 0.3}}};
  quintet::nn::context<host> serial_ctx;
  const host_tensor serial_y = serial.forward(serial_ctx, x);
  const host_tensor serial_dx = serial.backward(serial_ctx, dy);

  // Tensor parallel over 2 thread ranks: the same parameters by name, each rank drawing its shard.
  double worst_y = 0, worst_dx = 0;
  quintet::thread_world{2}.run([&](quintet::thread_comm& world) {
    quintet::device_mesh<quintet::thread_comm> mesh(world, {.tp = 2});
    // The registry takes this rank's place from the mesh, and from the plan which gradients are left
    // partial (none under plain tensor parallelism).
    using tp_plan = quintet::plan<quintet::parallel::tp<quintet::parallel::megatron_1d>>;
    quintet::nn::parameter_registry<float, host> params(seed, mesh, tp_plan{});
    using column = quintet::parallel::column_linear<float, host, quintet::thread_comm>;
    using row = quintet::parallel::row_linear<float, host, quintet::thread_comm>;
    two_layer_mlp<column, row> parallel{
        exec,
        {params, exec, mesh.tp(), "mlp.fc", width, hidden, {.init_stddev = 0.3}},
        {params, exec, mesh.tp(), "mlp.proj", hidden, width, {.init_stddev = 0.3}}};
    quintet::nn::context<host> ctx;
    const host_tensor y = parallel.forward(ctx, x);
    const host_tensor dx = parallel.backward(ctx, dy);
    if (world.rank() == 0) {
      fmt::print("rank 0 holds mlp.fc.weight {} of {}, mlp.proj.weight {} of {}\n",
                 params.find("mlp.fc.weight").value.shape(), shape{hidden, width},
                 params.find("mlp.proj.weight").value.shape(), shape{width, hidden});
      worst_y = max_difference(y, serial_y);
      worst_dx = max_difference(dx, serial_dx);
    }
  });
  fmt::print("largest difference from the serial block: output {:.2e}, input gradient {:.2e}\n",
             worst_y, worst_dx);
  const bool same = worst_y < 1e-5 && worst_dx < 1e-5;  // fp32, sums in another order
  fmt::print("tensor-parallel block {} the serial block\n", same ? "matches" : "DOES NOT match");
  return same ? 0 : 1;
}
