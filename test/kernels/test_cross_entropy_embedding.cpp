// Cross-entropy against a naive double log-softmax (with padding rows ignored), its backward
// against finite differences of the mean loss; embeddings against a naive gather, their backward
// against finite differences, and the errors for bad ids and too-long sequences. Then the
// vocabulary-parallel pieces: the shard kernels of the loss, the token lookup over a vocabulary
// range and the position embeddings on their own, against naive double loops.
#include "kernel_test_support.hpp"

#include <quintet/kernels/cross_entropy.hpp>
#include <quintet/kernels/embedding.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

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
  const execution<host> exec;
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
      const auto result = k::cross_entropy_forward(exec, logits, targets, lse, -100);
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
  const execution<host> exec;
  for (const std::int64_t vocab : {std::int64_t{1}, std::int64_t{7}, std::int64_t{33}}) {
    auto logits = random_tensor<double>(shape{2, 3, vocab}, 20 + vocab, -2.0, 2.0);
    const auto targets = random_targets(shape{2, 3}, vocab, 30 + vocab, 4, k::no_target);
    tensor<double, host> lse(shape{2, 3});
    auto loss = [&] { return k::cross_entropy_forward(exec, logits, targets, lse).mean(); };
    const auto numeric = finite_difference_gradient(logits, loss);
    const auto result = k::cross_entropy_forward(exec, logits, targets, lse);
    REQUIRE(result.count == 5);  // one row of six is padding
    tensor<double, host> dlogits(logits.shape());
    k::cross_entropy_backward(exec, logits, targets, lse, dlogits, 1.0 / result.count);
    INFO("vocab " << vocab);
    require_close(dlogits, numeric, 1e-6, 1e-8, "dlogits");
  }
}

TEST_CASE("cross_entropy rejects bad targets and shapes", "[kernels][cross_entropy][errors]") {
  const execution<host> exec;
  auto logits = random_tensor<float>(shape{4, 10}, 1);
  tensor<float, host> lse(shape{4});
  tensor<std::int32_t, host> targets(shape{4});
  for (std::int64_t i = 0; i < 4; ++i) targets.data()[i] = static_cast<std::int32_t>(i);
  targets.data()[2] = 10;
  REQUIRE_THROWS_WITH(k::cross_entropy_forward(exec, logits, targets, lse),
                      Catch::Contains("target 10 of row 2 is outside the vocabulary [0, 10)"));
  tensor<std::int32_t, host> short_targets(shape{3});
  REQUIRE_THROWS_WITH(k::cross_entropy_forward(exec, logits, short_targets, lse),
                      Catch::Contains("targets has shape (3,), expected (4,)"));
  tensor<float, host> dlogits(shape{4, 9});
  targets.data()[2] = 1;
  REQUIRE_THROWS_WITH(k::cross_entropy_backward(exec, logits, targets, lse, dlogits, 1.0),
                      Catch::Contains("(4, 10)") && Catch::Contains("(4, 9)"));
}

TEST_CASE("embedding_forward gathers token and position rows", "[kernels][embedding]") {
  const execution<host> exec;
  const std::int64_t vocab = 13, positions = 9, width = 5;
  auto token_table = random_tensor<float>(shape{vocab, width}, 1);
  auto position_table = random_tensor<float>(shape{positions, width}, 2);
  const auto tokens = random_targets(shape{3, 4}, vocab, 3, 0, 0);
  for (const std::int64_t offset : {0, 5}) {
    tensor<float, host> out(shape{3, 4, width});
    k::embedding_forward(exec, tokens, token_table, position_table, out, offset);
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
  const execution<host> exec;
  const std::int64_t vocab = 6, positions = 5, width = 3;
  auto token_table = random_tensor<double>(shape{vocab, width}, 1);
  auto position_table = random_tensor<double>(shape{positions, width}, 2);
  auto tokens = random_targets(shape{2, 4}, vocab, 4, 0, 0);
  tokens(1, 2) = tokens(0, 0);  // a repeated token: its gradient rows add up
  auto w = random_tensor<double>(shape{2, 4, width}, 5);
  tensor<double, host> out(shape{2, 4, width});
  auto loss = [&] {
    k::embedding_forward(exec, tokens, token_table, position_table, out, 1);
    return weighted_sum(out, w);
  };
  const auto dtoken_numeric = finite_difference_gradient(token_table, loss);
  const auto dposition_numeric = finite_difference_gradient(position_table, loss);
  tensor<double, host> dtoken(token_table.shape()), dposition(position_table.shape());
  quintet::fill(dtoken, 0.0);
  quintet::fill(dposition, 0.0);
  k::embedding_backward(exec, tokens, w, dtoken, dposition, 1);
  require_close(dtoken, dtoken_numeric, 1e-7, 1e-8, "dtoken_table");
  require_close(dposition, dposition_numeric, 1e-7, 1e-8, "dposition_table");
}

TEST_CASE("embedding rejects bad ids and sequences longer than the position table",
          "[kernels][embedding][errors]") {
  const execution<host> exec;
  tensor<float, host> token_table(shape{10, 4}), position_table(shape{8, 4}), out(shape{2, 6, 4});
  quintet::fill(token_table, 0.5f);
  quintet::fill(position_table, 0.25f);
  tensor<std::int32_t, host> tokens(shape{2, 6});
  quintet::fill(tokens, 3);
  REQUIRE_THROWS_WITH(k::embedding_forward(exec, tokens, token_table, position_table, out, 3),
                      Catch::Contains("positions [3, 9) of a sequence of 6 exceed the position "
                                      "table of 8 positions"));
  tokens(1, 4) = 10;
  REQUIRE_THROWS_WITH(
      k::embedding_forward(exec, tokens, token_table, position_table, out),
      Catch::Contains("token 10 at (batch 1, position 4) is outside the vocabulary [0, 10)"));
  tensor<float, host> dtoken(shape{10, 4});
  quintet::fill(dtoken, 0.0f);
  REQUIRE_THROWS(k::embedding_backward(exec, tokens, out, dtoken, position_table));
  for (std::int64_t i = 0; i < dtoken.numel(); ++i) REQUIRE(dtoken.data()[i] == 0.0f);  // untouched
  tensor<float, host> narrow_positions(shape{8, 3});
  tokens(1, 4) = 1;
  REQUIRE_THROWS_WITH(k::embedding_forward(exec, tokens, token_table, narrow_positions, out),
                      Catch::Contains("differ in width"));
}

// --- vocabulary-parallel pieces ------------------------------------------------------------------
//
// The shard kernels are run on every block of a padded vocabulary, their partial statistics
// combined the way the all-reduces would (max, then sum in rank order), and the result compared
// with naive double loops over the whole, unpadded logits. Padding columns hold 1e30: were they
// not masked, every row's max and loss would be off by ~1e30.

namespace {

constexpr double padding_garbage = 1e30;

// The block [begin, begin + columns) of a (rows, vocab) double matrix, ids >= vocab as garbage.
template <class T>
tensor<T, host> vocab_block(const std::vector<double>& full, std::int64_t rows, std::int64_t vocab,
                            std::int64_t begin, std::int64_t columns) {
  std::vector<double> block;
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t j = begin; j < begin + columns; ++j)
      block.push_back(j < vocab ? full[r * vocab + j]
                                : (j % 2 == 0 ? 1.0 : -1.0) * padding_garbage);
  return from_double<T>(block, shape{rows, columns});
}

// The same rounding the logits had (float or double), as doubles.
template <class T>
std::vector<double> rounded(const std::vector<double>& values) {
  std::vector<double> out;
  for (const double v : values) out.push_back(static_cast<double>(static_cast<T>(v)));
  return out;
}

}  // namespace

TEMPLATE_TEST_CASE(
    "cross_entropy shard kernels combined over the vocabulary blocks equal the "
    "double loss, lse and gradient",
    "[kernels][cross_entropy][vocab_parallel]", float, double) {
  using T = TestType;
  using acc = k::accumulator_t<T>;
  // float: the shards' exp sums differ from a double loop by the exp polynomial (1.1e-7) and float
  // rounding of ~40 terms; lse of |logits| <= 30 is off by a few ulp of 30 (~2e-6 absolute), which
  // exp(x - lse) turns into a relative error of the gradient; the target's entry scale (p - 1)
  // cancels as p -> 1, so its error is absolute: scale times lse's. double: summation order only.
  const bool is_float = std::is_same_v<T, float>;
  const double lse_tol = is_float ? 4e-6 : 1e-12;
  const double loss_rtol = is_float ? 1e-5 : 1e-12;
  const double grad_rtol = is_float ? 2e-5 : 1e-11;
  const execution<host> exec;
  const std::int32_t ignore = -100;
  std::uint64_t stream = 900;
  for (const auto& [vocab, tp] : {std::pair{std::int64_t{7}, 1}, std::pair{std::int64_t{8}, 2},
                                  std::pair{std::int64_t{10}, 4}, std::pair{std::int64_t{5}, 4},
                                  std::pair{std::int64_t{33}, 3}}) {
    for (const double spread : {3.0, 30.0}) {
      const std::int64_t rows = 12;
      const std::int64_t columns = (vocab + tp - 1) / tp;
      INFO("vocab " << vocab << " tp " << tp << " spread " << spread);
      const auto full = rounded<T>(
          to_double(random_tensor<double>(shape{rows, vocab}, ++stream, -spread, spread)));
      const auto targets = random_targets(shape{rows}, vocab, ++stream, 4, ignore);
      std::vector<tensor<T, host>> blocks;
      for (int r = 0; r < tp; ++r)
        blocks.push_back(vocab_block<T>(full, rows, vocab, r * columns, columns));
      auto valid_of = [&](int r) {
        return std::clamp<std::int64_t>(vocab - r * columns, 0, columns);
      };

      // 1. row maxima, combined by max.
      tensor<acc, host> row_max(shape{rows});
      quintet::fill(row_max, -std::numeric_limits<acc>::infinity());
      for (int r = 0; r < tp; ++r) {
        tensor<acc, host> local(shape{rows});
        k::cross_entropy_shard_max(exec, blocks[r], local, valid_of(r));
        for (std::int64_t i = 0; i < rows; ++i) {
          if (valid_of(r) == 0) REQUIRE(local(i) == -std::numeric_limits<acc>::infinity());
          row_max(i) = std::max(row_max(i), local(i));
        }
      }
      for (std::int64_t i = 0; i < rows; ++i)  // a max picks an element: exact
        REQUIRE(static_cast<double>(row_max(i)) ==
                *std::max_element(full.begin() + i * vocab, full.begin() + (i + 1) * vocab));

      // 2. partials, combined by sum in rank order.
      tensor<acc, host> partials(shape{rows, 2});
      quintet::fill(partials, acc(0));
      for (int r = 0; r < tp; ++r) {
        tensor<acc, host> local(shape{rows, 2});
        k::cross_entropy_shard_partials(exec, blocks[r], targets, row_max, local, r * columns,
                                        valid_of(r), ignore);
        for (std::int64_t i = 0; i < 2 * rows; ++i) partials.data()[i] += local.data()[i];
      }
      std::vector<double> want_sums, want_target_logits, want_lse;
      for (std::int64_t i = 0; i < rows; ++i) {
        double total = 0;
        for (std::int64_t j = 0; j < vocab; ++j)
          total += std::exp(full[i * vocab + j] - static_cast<double>(row_max(i)));
        want_sums.push_back(total);
        want_target_logits.push_back(targets(i) == ignore ? 0.0 : full[i * vocab + targets(i)]);
        want_lse.push_back(static_cast<double>(row_max(i)) + std::log(total));
      }
      std::vector<double> got_sums, got_target_logits;
      for (std::int64_t i = 0; i < rows; ++i) {
        got_sums.push_back(partials(i, 0));
        got_target_logits.push_back(partials(i, 1));
      }
      require_close(got_sums, want_sums, is_float ? 2e-6 : 1e-13, 0.0, "sum_exp");
      require_close(got_target_logits, want_target_logits, 0.0, 0.0, "target logit");  // copied

      // 3. lse and the loss.
      tensor<acc, host> lse(shape{rows});
      const auto result =
          k::cross_entropy_shard_finish(exec, targets, row_max, partials, lse, vocab, ignore);
      std::int64_t count = 0;
      const double want_loss = cross_entropy_reference(full, targets, vocab, ignore, count);
      REQUIRE(result.count == count);
      REQUIRE(result.loss_sum == Approx(want_loss).epsilon(loss_rtol));
      require_close(lse, want_lse, lse_tol, lse_tol, "lse");

      // 4. the gradient of each block against the matching columns of the double gradient.
      const double scale = 1.0 / static_cast<double>(count);
      for (int r = 0; r < tp; ++r) {
        tensor<T, host> dlogits(shape{rows, columns});
        quintet::fill(dlogits, T(7));  // every element must be written
        k::cross_entropy_shard_backward(exec, blocks[r], targets, lse, dlogits, scale, r * columns,
                                        valid_of(r), ignore);
        std::vector<double> want;
        for (std::int64_t i = 0; i < rows; ++i)
          for (std::int64_t j = r * columns; j < (r + 1) * columns; ++j) {
            const bool counted = targets(i) != ignore && j < vocab;
            const double p = counted ? std::exp(full[i * vocab + j] - want_lse[i]) : 0.0;
            want.push_back(counted ? scale * (p - (j == targets(i) ? 1.0 : 0.0)) : 0.0);
          }
        INFO("rank " << r);
        require_close(dlogits, want, grad_rtol, scale * lse_tol, "dlogits");
        for (std::int64_t i = 0; i < rows; ++i)
          for (std::int64_t j = valid_of(r); j < columns; ++j) REQUIRE(dlogits(i, j) == T(0));
      }
    }
  }
}

TEST_CASE("cross_entropy shard kernels reject bad targets and inconsistent shards",
          "[kernels][cross_entropy][vocab_parallel][errors]") {
  const execution<host> exec;
  auto logits = random_tensor<float>(shape{4, 3}, 11);
  tensor<std::int32_t, host> targets(shape{4});
  for (std::int64_t i = 0; i < 4; ++i) targets.data()[i] = static_cast<std::int32_t>(i);
  targets.data()[1] = 5;  // a padding id of vocabulary 5 padded to 6
  tensor<float, host> row_max(shape{4}), lse(shape{4}), partials(shape{4, 2});
  k::cross_entropy_shard_max(exec, logits, row_max, 3);
  k::cross_entropy_shard_partials(exec, logits, targets, row_max, partials, 3, 2);
  REQUIRE_THROWS_WITH(k::cross_entropy_shard_finish(exec, targets, row_max, partials, lse, 5),
                      Catch::Contains("target 5 of row 1 is outside the vocabulary [0, 5) and is "
                                      "not the ignore index -1"));
  REQUIRE_THROWS_WITH(k::cross_entropy_shard_max(exec, logits, row_max, 4),
                      Catch::Contains("a shard of 3 columns cannot hold 4 valid vocabulary ids"));
  tensor<float, host> flat_partials(shape{4});
  REQUIRE_THROWS_WITH(
      k::cross_entropy_shard_partials(exec, logits, targets, row_max, flat_partials, 0, 3),
      Catch::Contains("partials has shape (4,), expected (4, 2)"));
}

TEMPLATE_TEST_CASE("token_embedding over a vocabulary range gathers its own ids and zeros others",
                   "[kernels][embedding][vocab_parallel]", float, double) {
  using T = TestType;
  const execution<host> exec;
  const std::int64_t vocab = 12, width = 5, begin = 4, rows = 4;
  const auto full_table = random_tensor<T>(shape{vocab, width}, 31);
  tensor<T, host> table(shape{rows, width});  // ids [4, 8)
  std::copy(full_table.data() + begin * width, full_table.data() + (begin + rows) * width,
            table.data());
  const auto tokens = random_targets(shape{3, 7}, vocab, 32, 0, 0);
  tensor<T, host> out(shape{3, 7, width});
  quintet::fill(out, T(9));
  k::token_embedding_forward(exec, tokens, table, out, begin);
  std::vector<double> want;
  for (std::int64_t i = 0; i < tokens.numel(); ++i) {
    const std::int32_t t = tokens.data()[i];
    for (std::int64_t c = 0; c < width; ++c)
      want.push_back(t >= begin && t < begin + rows ? static_cast<double>(full_table(t, c)) : 0.0);
  }
  require_close(out, want, 0.0, 0.0, "token_embedding_forward");  // copies: exact

  // Backward: += into the shard's rows for its own ids, repeated ids adding up.
  const auto dout = random_tensor<T>(shape{3, 7, width}, 33);
  auto dtable = random_tensor<T>(shape{rows, width}, 34);
  std::vector<double> want_dtable = to_double(dtable);
  for (std::int64_t i = 0; i < tokens.numel(); ++i) {
    const std::int32_t t = tokens.data()[i];
    if (t < begin || t >= begin + rows) continue;
    for (std::int64_t c = 0; c < width; ++c)
      want_dtable[(t - begin) * width + c] += static_cast<double>(dout.data()[i * width + c]);
  }
  k::token_embedding_backward(exec, tokens, dout, dtable, begin);
  // float: a row is a running float sum of at most 21 terms of |x| < 1.
  require_close(dtable, want_dtable, std::is_same_v<T, float> ? 1e-6 : 1e-15,
                std::is_same_v<T, float> ? 1e-6 : 1e-15, "token_embedding_backward");
}

TEST_CASE("token_embedding shards sum to the whole lookup, exactly",
          "[kernels][embedding][vocab_parallel]") {
  const execution<host> exec;
  const std::int64_t vocab = 10, width = 3, tp = 4, rows = 3;  // padded to 12: rank 3 holds 1 id
  auto table = random_tensor<float>(shape{tp * rows, width}, 41);
  const auto tokens = random_targets(shape{2, 9}, vocab, 42, 0, 0);
  tensor<float, host> whole(shape{2, 9, width}), sum(shape{2, 9, width}), part(shape{2, 9, width});
  quintet::fill(sum, 0.0f);
  k::token_embedding_forward(exec, tokens, table, whole);
  for (std::int64_t r = 0; r < tp; ++r) {
    tensor<float, host> shard(shape{rows, width});
    std::copy(table.data() + r * rows * width, table.data() + (r + 1) * rows * width, shard.data());
    k::token_embedding_forward(exec, tokens, shard, part, r * rows);
    for (std::int64_t i = 0; i < sum.numel(); ++i) sum.data()[i] += part.data()[i];
  }
  for (std::int64_t i = 0; i < sum.numel(); ++i) REQUIRE(sum.data()[i] == whole.data()[i]);
}

TEMPLATE_TEST_CASE("position embeddings alone: add_position_embedding and its backward",
                   "[kernels][embedding]", float, double) {
  using T = TestType;
  const execution<host> exec;
  const std::int64_t batch = 3, seq = 4, width = 5, positions = 9, offset = 3;
  const auto table = random_tensor<T>(shape{positions, width}, 51);
  auto out = random_tensor<T>(shape{batch, seq, width}, 52);
  std::vector<double> want = to_double(out);
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t s = 0; s < seq; ++s)
      for (std::int64_t c = 0; c < width; ++c)
        want[(b * seq + s) * width + c] += static_cast<double>(table(offset + s, c));
  k::add_position_embedding(exec, table, out, offset);
  // One rounding of a sum of two |x| < 1.
  const double tol = std::is_same_v<T, float> ? 2.5e-7 : 1e-16;
  require_close(out, want, tol, tol, "add_position_embedding");

  const auto dout = random_tensor<T>(shape{batch, seq, width}, 53);
  auto dtable = random_tensor<T>(shape{positions, width}, 54);
  std::vector<double> want_dtable = to_double(dtable);
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t s = 0; s < seq; ++s)
      for (std::int64_t c = 0; c < width; ++c)
        want_dtable[(offset + s) * width + c] +=
            static_cast<double>(dout.data()[(b * seq + s) * width + c]);
  k::position_embedding_backward(exec, dout, dtable, offset);
  const double sum_tol = std::is_same_v<T, float> ? 1e-6 : 1e-15;  // 4 terms, float
  require_close(dtable, want_dtable, sum_tol, sum_tol, "position_embedding_backward");

  REQUIRE_THROWS_WITH(k::add_position_embedding(exec, table, out, 6),
                      Catch::Contains("positions [6, 10) of a sequence of 4 exceed the position "
                                      "table of 9 positions"));
}

TEST_CASE("embedding_forward is token_embedding_forward then add_position_embedding, bit for bit",
          "[kernels][embedding]") {
  const execution<host> exec;
  const auto token_table = random_tensor<float>(shape{11, 6}, 61);
  const auto position_table = random_tensor<float>(shape{8, 6}, 62);
  const auto tokens = random_targets(shape{2, 5}, 11, 63, 0, 0);
  tensor<float, host> fused(shape{2, 5, 6}), split(shape{2, 5, 6});
  k::embedding_forward(exec, tokens, token_table, position_table, fused, 2);
  k::token_embedding_forward(exec, tokens, token_table, split);
  k::add_position_embedding(exec, position_table, split, 2);
  for (std::int64_t i = 0; i < fused.numel(); ++i) REQUIRE(split.data()[i] == fused.data()[i]);

  tensor<float, host> dtoken_fused(shape{11, 6}), dposition_fused(shape{8, 6});
  tensor<float, host> dtoken_split(shape{11, 6}), dposition_split(shape{8, 6});
  for (auto* t : {&dtoken_fused, &dposition_fused, &dtoken_split, &dposition_split})
    quintet::fill(*t, 0.5f);
  const auto dout = random_tensor<float>(shape{2, 5, 6}, 64);
  k::embedding_backward(exec, tokens, dout, dtoken_fused, dposition_fused, 2);
  k::token_embedding_backward(exec, tokens, dout, dtoken_split);
  k::position_embedding_backward(exec, dout, dposition_split, 2);
  for (std::int64_t i = 0; i < dtoken_fused.numel(); ++i)
    REQUIRE(dtoken_split.data()[i] == dtoken_fused.data()[i]);
  for (std::int64_t i = 0; i < dposition_fused.numel(); ++i)
    REQUIRE(dposition_split.data()[i] == dposition_fused.data()[i]);
}

TEST_CASE("cross-entropy split over rows gives the one-thread bits and names a bad row",
          "[kernels][execution][cross_entropy]") {
  const execution<host> one(1), two(2);
  const std::int64_t rows = 12, vocab = 1 << 13;  // 8 rows per part at least: two parts
  const auto logits = random_tensor<float>(shape{rows, vocab}, 5, -4.0, 4.0);
  const auto targets = random_targets(shape{rows}, vocab, 6, 3, -100);
  tensor<float, host> lse_one(shape{rows}), lse_two(shape{rows});
  const auto result_one = k::cross_entropy_forward(one, logits, targets, lse_one, -100);
  const auto result_two = k::cross_entropy_forward(two, logits, targets, lse_two, -100);
  REQUIRE(result_one.count == result_two.count);
  REQUIRE(std::memcmp(&result_one.loss_sum, &result_two.loss_sum, sizeof(double)) == 0);
  REQUIRE(std::memcmp(lse_one.data(), lse_two.data(), sizeof(float) * rows) == 0);
  tensor<float, host> d_one(shape{rows, vocab}), d_two(shape{rows, vocab});
  k::cross_entropy_backward(one, logits, targets, lse_one, d_one, 0.125, -100);
  k::cross_entropy_backward(two, logits, targets, lse_two, d_two, 0.125, -100);
  REQUIRE(std::memcmp(d_one.data(), d_two.data(), sizeof(float) * rows * vocab) == 0);

  auto bad = random_targets(shape{rows}, vocab, 6, 3, -100);
  bad.data()[10] = static_cast<std::int32_t>(vocab);  // a row of the second part
  REQUIRE_THROWS_WITH(k::cross_entropy_forward(two, logits, bad, lse_two, -100),
                      Catch::Contains("of row 10 is outside the vocabulary"));
  REQUIRE_THROWS_WITH(k::cross_entropy_backward(two, logits, bad, lse_two, d_two, 0.125, -100),
                      Catch::Contains("of row 10 is outside the vocabulary"));

  // Bad targets in two workers' parts (rows 16-31 and 32-47 of three): the lower row is named,
  // as a loop over the rows in order would.
  const execution<host> three(3);
  const std::int64_t more_rows = 48, narrow_vocab = 1 << 12;  // 16 rows per part
  const auto more_logits = random_tensor<float>(shape{more_rows, narrow_vocab}, 8, -4.0, 4.0);
  auto two_bad = random_targets(shape{more_rows}, narrow_vocab, 9, 3, -100);
  two_bad.data()[20] = static_cast<std::int32_t>(narrow_vocab);
  two_bad.data()[40] = -7;
  tensor<float, host> more_lse(shape{more_rows}), more_d(shape{more_rows, narrow_vocab});
  quintet::fill(more_lse, 0.0f);
  for (int attempt = 0; attempt < 20; ++attempt)
    REQUIRE_THROWS_WITH(
        k::cross_entropy_backward(three, more_logits, two_bad, more_lse, more_d, 0.125, -100),
        Catch::Contains("of row 20 is outside the vocabulary"));
}
