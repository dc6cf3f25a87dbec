// Cross-entropy against a naive double log-softmax (with padding rows ignored), its backward
// against finite differences of the mean loss; embeddings against a naive gather, their backward
// against finite differences, and the errors for bad ids and too-long sequences.
#include "kernel_test_support.hpp"

#include <quintet/kernels/cross_entropy.hpp>
#include <quintet/kernels/embedding.hpp>

#include <algorithm>
#include <cmath>

using namespace kernel_test;
using quintet::execution;
namespace k = quintet::kernels;

namespace {

// Targets from a Philox stream, every `pad_every`-th one the ignore index.
tensor<std::int32_t, host> random_targets(shape s, std::int64_t vocab, std::uint64_t stream,
                                          std::int64_t pad_every, std::int32_t ignore) {
  tensor<std::int32_t, host> t(s);
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    const auto draw = quintet::uniform_double({.seed = 3, .stream = stream}, i);
    t.data()[i] = (pad_every > 0 && i % pad_every == pad_every - 1)
                      ? ignore
                      : static_cast<std::int32_t>(draw * static_cast<double>(vocab));
  }
  return t;
}

double cross_entropy_reference(const std::vector<double>& logits,
                               const tensor<std::int32_t, host>& targets, std::int64_t vocab,
                               std::int32_t ignore, std::int64_t& count) {
  double sum = 0;
  count = 0;
  for (std::int64_t r = 0; r < targets.numel(); ++r) {
    if (targets.data()[r] == ignore) continue;
    const auto first = logits.begin() + r * vocab;
    const double peak = *std::max_element(first, first + vocab);
    double total = 0;
    for (std::int64_t j = 0; j < vocab; ++j) total += std::exp(first[j] - peak);
    sum += peak + std::log(total) - first[targets.data()[r]];
    ++count;
  }
  return sum;
}

}  // namespace

TEST_CASE("cross_entropy_forward equals the double log-softmax loss, ignoring padding",
          "[kernels][cross_entropy]") {
  const execution<host> ctx;
  std::uint64_t stream = 700;
  for (const auto& [s, vocab] :
       {std::pair{shape{1}, std::int64_t{1}}, std::pair{shape{3}, std::int64_t{17}},
        std::pair{shape{2, 9}, std::int64_t{33}}, std::pair{shape{4, 16}, std::int64_t{257}}}) {
    for (const double spread : {3.0, 80.0}) {  // 80: exp would overflow float unshifted
      std::vector<std::int64_t> dims(s.begin(), s.end());
      dims.push_back(vocab);
      auto logits = random_tensor<float>(shape(std::span<const std::int64_t>(dims)), ++stream,
                                         -spread, spread);
      const auto targets = random_targets(s, vocab, ++stream, 5, -100);
      tensor<float, host> lse(s);
      const auto result = k::cross_entropy_forward(ctx, logits, targets, lse, -100);
      std::int64_t count = 0;
      const double want = cross_entropy_reference(to_double(logits), targets, vocab, -100, count);
      INFO("shape " << s.to_string() << " vocab " << vocab << " spread " << spread);
      REQUIRE(result.count == count);
      REQUIRE(result.loss_sum == Approx(want).epsilon(1e-5).margin(1e-5));
      if (count > 0) REQUIRE(result.mean() == Approx(want / count).epsilon(1e-5).margin(1e-6));
    }
  }
}

TEST_CASE("cross_entropy_backward is the gradient of the mean loss (finite differences)",
          "[kernels][cross_entropy]") {
  const execution<host> ctx;
  for (const std::int64_t vocab : {std::int64_t{1}, std::int64_t{7}, std::int64_t{33}}) {
    auto logits = random_tensor<double>(shape{2, 3, vocab}, 20 + vocab, -2.0, 2.0);
    const auto targets = random_targets(shape{2, 3}, vocab, 30 + vocab, 4, k::no_target);
    tensor<double, host> lse(shape{2, 3});
    auto loss = [&] { return k::cross_entropy_forward(ctx, logits, targets, lse).mean(); };
    const auto numeric = finite_difference_gradient(logits, loss);
    const auto result = k::cross_entropy_forward(ctx, logits, targets, lse);
    REQUIRE(result.count == 5);  // one row of six is padding
    tensor<double, host> dlogits(logits.shape());
    k::cross_entropy_backward(ctx, logits, targets, lse, dlogits, 1.0 / result.count);
    INFO("vocab " << vocab);
    require_close(dlogits, numeric, 1e-6, 1e-8, "dlogits");
  }
}

TEST_CASE("cross_entropy rejects bad targets and shapes", "[kernels][cross_entropy][errors]") {
  const execution<host> ctx;
  auto logits = random_tensor<float>(shape{4, 10}, 1);
  tensor<float, host> lse(shape{4});
  tensor<std::int32_t, host> targets(shape{4});
  for (std::int64_t i = 0; i < 4; ++i) targets.data()[i] = static_cast<std::int32_t>(i);
  targets.data()[2] = 10;
  REQUIRE_THROWS_WITH(k::cross_entropy_forward(ctx, logits, targets, lse),
                      Catch::Contains("target 10 of row 2 is outside the vocabulary [0, 10)"));
  tensor<std::int32_t, host> short_targets(shape{3});
  REQUIRE_THROWS_WITH(k::cross_entropy_forward(ctx, logits, short_targets, lse),
                      Catch::Contains("targets has shape (3,), expected (4,)"));
  tensor<float, host> dlogits(shape{4, 9});
  targets.data()[2] = 1;
  REQUIRE_THROWS_WITH(k::cross_entropy_backward(ctx, logits, targets, lse, dlogits, 1.0),
                      Catch::Contains("(4, 10)") && Catch::Contains("(4, 9)"));
}

TEST_CASE("embedding_forward gathers token and position rows", "[kernels][embedding]") {
  const execution<host> ctx;
  const std::int64_t vocab = 13, positions = 9, width = 5;
  auto token_table = random_tensor<float>(shape{vocab, width}, 1);
  auto position_table = random_tensor<float>(shape{positions, width}, 2);
  const auto tokens = random_targets(shape{3, 4}, vocab, 3, 0, 0);
  for (const std::int64_t offset : {0, 5}) {
    tensor<float, host> out(shape{3, 4, width});
    k::embedding_forward(ctx, tokens, token_table, position_table, out, offset);
    std::vector<double> want;
    for (std::int64_t b = 0; b < 3; ++b)
      for (std::int64_t s = 0; s < 4; ++s)
        for (std::int64_t c = 0; c < width; ++c)
          want.push_back(static_cast<double>(token_table(tokens(b, s), c)) +
                         static_cast<double>(position_table(offset + s, c)));
    require_close(out, want, 1e-6, 1e-7, "embedding");
  }
}

TEST_CASE("embedding_backward scatter-adds and matches finite differences",
          "[kernels][embedding]") {
  const execution<host> ctx;
  const std::int64_t vocab = 6, positions = 5, width = 3;
  auto token_table = random_tensor<double>(shape{vocab, width}, 1);
  auto position_table = random_tensor<double>(shape{positions, width}, 2);
  auto tokens = random_targets(shape{2, 4}, vocab, 4, 0, 0);
  tokens(1, 2) = tokens(0, 0);  // a repeated token: its gradient rows add up
  auto w = random_tensor<double>(shape{2, 4, width}, 5);
  tensor<double, host> out(shape{2, 4, width});
  auto loss = [&] {
    k::embedding_forward(ctx, tokens, token_table, position_table, out, 1);
    return weighted_sum(out, w);
  };
  const auto dtoken_numeric = finite_difference_gradient(token_table, loss);
  const auto dposition_numeric = finite_difference_gradient(position_table, loss);
  tensor<double, host> dtoken(token_table.shape()), dposition(position_table.shape());
  quintet::fill(dtoken, 0.0);
  quintet::fill(dposition, 0.0);
  k::embedding_backward(ctx, tokens, w, dtoken, dposition, 1);
  require_close(dtoken, dtoken_numeric, 1e-7, 1e-8, "dtoken_table");
  require_close(dposition, dposition_numeric, 1e-7, 1e-8, "dposition_table");
}

TEST_CASE("embedding rejects bad ids and sequences longer than the position table",
          "[kernels][embedding][errors]") {
  const execution<host> ctx;
  tensor<float, host> token_table(shape{10, 4}), position_table(shape{8, 4}), out(shape{2, 6, 4});
  quintet::fill(token_table, 0.5f);
  quintet::fill(position_table, 0.25f);
  tensor<std::int32_t, host> tokens(shape{2, 6});
  quintet::fill(tokens, 3);
  REQUIRE_THROWS_WITH(k::embedding_forward(ctx, tokens, token_table, position_table, out, 3),
                      Catch::Contains("positions [3, 9) of a sequence of 6 exceed the position "
                                      "table of 8 positions"));
  tokens(1, 4) = 10;
  REQUIRE_THROWS_WITH(
      k::embedding_forward(ctx, tokens, token_table, position_table, out),
      Catch::Contains("token 10 at (batch 1, position 4) is outside the vocabulary [0, 10)"));
  tensor<float, host> dtoken(shape{10, 4});
  quintet::fill(dtoken, 0.0f);
  REQUIRE_THROWS(k::embedding_backward(ctx, tokens, out, dtoken, position_table));
  for (std::int64_t i = 0; i < dtoken.numel(); ++i) REQUIRE(dtoken.data()[i] == 0.0f);  // untouched
  tensor<float, host> narrow_positions(shape{8, 3});
  tokens(1, 4) = 1;
  REQUIRE_THROWS_WITH(k::embedding_forward(ctx, tokens, token_table, narrow_positions, out),
                      Catch::Contains("differ in width"));
}
