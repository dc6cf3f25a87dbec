// The whole GPT in double precision: the gradient of the mean loss against central finite
// differences for every parameter (tied and untied heads, padding targets ignored), and the
// errors for bad configurations and inputs.
#include <catch2/catch.hpp>

#include "gradient_check.hpp"

#include <utility>
#include <vector>

#include <quintet/nn/gpt.hpp>

using quintet::host;
using quintet::shape;

namespace {

const quintet::execution<host> exec;

quintet::tensor<std::int32_t, host> token_tensor(shape s, std::initializer_list<std::int32_t> ids) {
  quintet::tensor<std::int32_t, host> t(s);
  std::int64_t i = 0;
  for (const auto id : ids) t.data()[i++] = id;
  return t;
}

}  // namespace

TEST_CASE("GPT gradients match finite differences of the mean loss", "[nn][gpt]") {
  // The whole backward, and its two passes (input, then weight).
  for (const auto& [tied, split] : {std::pair{true, false}, std::pair{false, false},
                                   std::pair{true, true}, std::pair{false, true}}) {
    INFO("tied " << tied << ", backward in two passes " << split);
    quintet::nn::parameter_registry<double, host> registry(29);
    const quintet::nn::gpt_config config{.vocab = 5,
                                         .max_seq = 4,
                                         .layers = 2,
                                         .d_model = 4,
                                         .heads = 2,
                                         .mlp_hidden = 6,
                                         .tie_weights = tied,
                                         .init_stddev = 0.4};
    quintet::nn::gpt<double, host> model(registry, exec, config);
    for (auto& p : registry)
      if (p.name.ends_with(".bias"))
        quintet::fill_normal(p.value, {.seed = 3, .stream = 3}, 0.0, 0.2);
    const auto tokens = token_tensor(shape{2, 3}, {1, 4, 0, 2, 2, 3});
    const auto targets = token_tensor(shape{2, 3}, {4, 0, -1, 2, 3, 1});  // one padding target

    quintet::nn::context<host> ctx;
    const auto result = model.forward(ctx, tokens.view(), targets.view());
    REQUIRE(result.count == 5);
    registry.zero_grad();
    if (split) {
      model.backward_input(ctx, 1.0 / static_cast<double>(result.count));
      model.backward_weight(ctx);
    } else {
      model.backward(ctx, 1.0 / static_cast<double>(result.count));
    }
    const auto mean_loss = [&] {
      quintet::nn::context<host> fresh;
      return model.forward(fresh, tokens.view(), targets.view()).mean();
    };
    constexpr double step = 1e-6;
    for (auto& p : registry) {
      for (std::int64_t i = 0; i < p.value.numel(); ++i) {
        const double numeric =
            quintet::test::central_difference(p.value.data()[i], step, mean_loss);
        quintet::test::require_close(p.grad.data()[i], numeric, 1e-6,
                                     p.name + "[" + std::to_string(i) + "]");
      }
    }
  }
}

TEST_CASE("GPT rejects bad configurations and inputs naming the values", "[nn][gpt]") {
  quintet::nn::parameter_registry<float, host> registry(1);
  REQUIRE_THROWS_WITH((quintet::nn::gpt<float, host>(registry, exec, {.d_model = 10, .heads = 4})),
                      Catch::Contains("gpt: 4 heads do not divide d_model 10"));
  REQUIRE_THROWS_WITH((quintet::nn::gpt<float, host>(registry, exec, {.vocab = 1})),
                      Catch::Contains("vocabulary of 1 tokens"));
  quintet::nn::parameter_registry<float, host> fine(1);
  quintet::nn::gpt<float, host> model(
      fine, exec, {.vocab = 8, .max_seq = 4, .layers = 1, .d_model = 8, .heads = 2});
  quintet::nn::context<host> ctx;
  const auto long_tokens = token_tensor(shape{1, 5}, {1, 2, 3, 4, 5});
  REQUIRE_THROWS_WITH(model.forward(ctx, long_tokens.view(), long_tokens.view()),
                      Catch::Contains("sequence of 5 tokens is longer than max_seq 4"));
  const auto tokens = token_tensor(shape{1, 2}, {1, 2});
  const auto targets = token_tensor(shape{2, 1}, {1, 2});
  REQUIRE_THROWS_WITH(model.forward(ctx, tokens.view(), targets.view()),
                      Catch::Contains("tokens (1, 2) and targets (2, 1) must have the same shape"));
}

TEST_CASE("each micro-batch's backward uses its own padding id", "[nn][gpt]") {
  const quintet::nn::gpt_config config{
      .vocab = 5, .max_seq = 3, .layers = 1, .d_model = 4, .heads = 2};
  const auto tokens = token_tensor(shape{1, 3}, {1, 2, 3});
  const auto targets = token_tensor(shape{1, 3}, {2, 0, 2});
  const auto gradients = [&](bool interleaved) {
    quintet::nn::parameter_registry<double, host> registry(3);
    quintet::nn::gpt<double, host> model(registry, exec, config);
    registry.zero_grad();
    quintet::nn::context<host> a, b;
    if (interleaved) {  // two micro-batches in flight, as a pipeline holds them
      model.forward(a, tokens.view(), targets.view(), 2);
      model.forward(b, tokens.view(), targets.view(), 0);
      model.backward(a, 1.0);
      model.backward(b, 1.0);
    } else {
      model.forward(a, tokens.view(), targets.view(), 2);
      model.backward(a, 1.0);
      model.forward(b, tokens.view(), targets.view(), 0);
      model.backward(b, 1.0);
    }
    std::vector<double> all;
    for (auto& p : registry) all.insert(all.end(), p.grad.data(), p.grad.data() + p.grad.numel());
    return all;
  };
  REQUIRE(gradients(true) == gradients(false));
}
