// Layers' backward against central finite differences in double precision, on random inputs of
// several shapes (odd sizes included), and their errors for inputs of the wrong shape.
#include <catch2/catch.hpp>

#include "gradient_check.hpp"

#include <quintet/nn/causal_self_attention.hpp>
#include <quintet/nn/embedding.hpp>
#include <quintet/nn/layer_norm.hpp>
#include <quintet/nn/linear.hpp>
#include <quintet/nn/mlp.hpp>
#include <quintet/nn/transformer_block.hpp>

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

TEST_CASE("causal self-attention backward matches finite differences", "[nn][attention]") {
  for (const auto& [batch, seq, d, heads] : {std::tuple{2, 3, 4, 2}, std::tuple{1, 5, 6, 3}}) {
    quintet::nn::parameter_registry<double, host> registry(17);
    quintet::nn::causal_self_attention<double, host> attention(registry, exec, "attn", d, heads,
                                                               0.6, 0.6);
    for (auto& p : registry)
      if (p.name.ends_with(".bias"))
        quintet::fill_normal(p.value, {.seed = 8, .stream = 1}, 0.0, 0.3);
    host_tensor x(shape{batch, seq, d});
    quintet::fill_normal(x, {.seed = 6, .stream = 6}, 0.0, 1.0);
    quintet::test::check_gradients(
        registry, x,
        [&](auto& ctx, const host_tensor& input) { return attention.forward(ctx, input.view()); },
        [&](auto& ctx, const host_tensor& dy) { return attention.backward(ctx, dy.view()); });
  }
}

TEST_CASE("attention rejects heads that do not divide d_model", "[nn][attention]") {
  quintet::nn::parameter_registry<float, host> registry(1);
  REQUIRE_THROWS_WITH(
      (quintet::nn::causal_self_attention<float, host>(registry, exec, "attn", 10, 4)),
      Catch::Contains("attention 'attn': 4 heads do not divide d_model 10"));
}

TEST_CASE("embedding backward matches finite differences", "[nn][embedding]") {
  quintet::nn::parameter_registry<double, host> registry(19);
  quintet::nn::embedding<double, host> embed(registry, exec, "wte", 5, 6, 3, 0.5);
  quintet::tensor<std::int32_t, host> tokens(shape{2, 4});
  const std::int32_t ids[] = {0, 3, 3, 4, 1, 0, 2, 3};  // repeated ids accumulate
  for (int i = 0; i < 8; ++i) tokens.data()[i] = ids[i];
  quintet::test::check_gradients_of(
      registry, nullptr, [&](auto& ctx) { return embed.forward(ctx, tokens.view()); },
      [&](auto& ctx, const host_tensor& dy) {
        embed.backward(ctx, dy.view());
        return 0;
      },
      1e-6, 1e-6);
}

TEST_CASE("embedding rejects a sequence longer than the position table", "[nn][embedding]") {
  quintet::nn::parameter_registry<float, host> registry(1);
  quintet::nn::embedding<float, host> embed(registry, exec, "wte", 8, 4, 2);
  quintet::tensor<std::int32_t, host> tokens(shape{1, 5});
  quintet::fill(tokens, 0);
  quintet::nn::context<host> ctx;
  REQUIRE_THROWS_WITH(
      embed.forward(ctx, tokens.view()),
      Catch::Contains("sequence of 5 tokens is longer than the position table (4)"));
}

TEST_CASE("transformer block backward matches finite differences", "[nn][block]") {
  quintet::nn::parameter_registry<double, host> registry(23);
  quintet::nn::transformer_block<double, host> block(
      registry, exec, "blocks.0",
      {.d_model = 4, .heads = 2, .mlp_hidden = 6, .init_stddev = 0.5, .proj_init_stddev = 0.5});
  for (auto& p : registry)
    if (p.name.ends_with(".bias"))
      quintet::fill_normal(p.value, {.seed = 2, .stream = 9}, 0.0, 0.3);
  host_tensor x(shape{2, 3, 4});
  quintet::fill_normal(x, {.seed = 7, .stream = 7}, 0.0, 1.0);
  quintet::test::check_gradients(
      registry, x,
      [&](auto& ctx, const host_tensor& input) { return block.forward(ctx, input.view()); },
      [&](auto& ctx, const host_tensor& dy) { return block.backward(ctx, dy.view()); });
}
