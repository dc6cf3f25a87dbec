// Layers' backward against central finite differences in double precision, on random inputs of
// several shapes (odd sizes included), and their errors for inputs of the wrong shape.
#include <catch2/catch.hpp>

#include "gradient_check.hpp"

#include <quintet/nn/layer_norm.hpp>
#include <quintet/nn/linear.hpp>
#include <quintet/nn/mlp.hpp>

using quintet::host;
using quintet::shape;
using quintet::test::host_tensor;

namespace {

const quintet::execution<host> exec;

}  // namespace

TEST_CASE("linear backward matches finite differences", "[nn][linear]") {
  for (const auto& [input_shape, out, bias] :
       {std::tuple{shape{3, 5}, 4, true}, std::tuple{shape{2, 3, 7}, 1, false},
        std::tuple{shape{1, 1, 2}, 3, true}}) {
    quintet::nn::parameter_registry<double, host> registry(5);
    const std::int64_t in = input_shape[input_shape.rank() - 1];
    quintet::nn::linear<double, host> layer(registry, exec, "proj", in, out,
                                            {.bias = bias, .init_stddev = 0.5});
    if (bias) quintet::fill_normal(layer.bias()->value, {.seed = 9, .stream = 9}, 0.0, 0.5);
    host_tensor x(input_shape);
    quintet::fill_normal(x, {.seed = 1, .stream = 2}, 0.0, 1.0);
    quintet::test::check_gradients(
        registry, x,
        [&](auto& ctx, const host_tensor& input) { return layer.forward(ctx, input.view()); },
        [&](auto& ctx, const host_tensor& dy) { return layer.backward(ctx, dy.view()); });
  }
}

TEST_CASE("linear rejects inputs and gradients of the wrong width", "[nn][linear]") {
  quintet::nn::parameter_registry<float, host> registry(5);
  quintet::nn::linear<float, host> layer(registry, exec, "fc", 4, 6);
  quintet::nn::context<host> ctx;
  quintet::tensor<float, host> x(shape{2, 5});
  REQUIRE_THROWS_WITH(
      layer.forward(ctx, x.view()),
      Catch::Contains("linear 'fc': input has shape (2, 5), its last dimension must be 4"));
  quintet::tensor<float, host> good(shape{2, 4}), dy(shape{3, 6});
  quintet::fill(good, 1.0f);
  layer.forward(ctx, good.view());
  REQUIRE_THROWS_WITH(
      layer.backward(ctx, dy.view()),
      Catch::Contains("output gradient (3, 6) does not match the saved input (2, 4)"));
}

TEST_CASE("mlp backward matches finite differences", "[nn][mlp]") {
  for (const auto& [input_shape, hidden] :
       {std::pair{shape{2, 3, 4}, 7}, std::pair{shape{5, 3}, 12}}) {
    quintet::nn::parameter_registry<double, host> registry(11);
    const std::int64_t d = input_shape[input_shape.rank() - 1];
    quintet::nn::mlp<double, host> block(registry, exec, "mlp", d, hidden, 0.7, 0.7);
    for (auto& p : registry)  // non-zero biases, so their paths are exercised
      if (p.name.ends_with(".bias"))
        quintet::fill_normal(p.value, {.seed = 3, .stream = 4}, 0.0, 0.5);
    host_tensor x(input_shape);
    quintet::fill_normal(x, {.seed = 2, .stream = 2}, 0.0, 1.0);
    quintet::test::check_gradients(
        registry, x,
        [&](auto& ctx, const host_tensor& input) { return block.forward(ctx, input.view()); },
        [&](auto& ctx, const host_tensor& dy) { return block.backward(ctx, dy.view()); });
  }
}

TEST_CASE("layer_norm backward matches finite differences", "[nn][layer_norm]") {
  for (const auto& input_shape : {shape{3, 5}, shape{2, 3, 8}, shape{1, 1}}) {
    quintet::nn::parameter_registry<double, host> registry(13);
    const std::int64_t n = input_shape[input_shape.rank() - 1];
    quintet::nn::layer_norm<double, host> norm(registry, exec, "ln", n);
    for (auto& p : registry) quintet::fill_normal(p.value, {.seed = 5, .stream = 6}, 1.0, 0.5);
    host_tensor x(input_shape);
    quintet::fill_normal(x, {.seed = 4, .stream = 4}, 0.3, 2.0);
    quintet::test::check_gradients(
        registry, x,
        [&](auto& ctx, const host_tensor& input) { return norm.forward(ctx, input.view()); },
        [&](auto& ctx, const host_tensor& dy) { return norm.backward(ctx, dy.view()); });
  }
}
