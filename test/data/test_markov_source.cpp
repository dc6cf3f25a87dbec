// markov_source: the entropy rate and the window floor against closed forms and an independent
// dense solve, sampled log-loss converging to them, and batches that are pure functions of
// (seed, step, row).
#include <catch2/catch.hpp>

#include <quintet/data/markov_source.hpp>
#include <quintet/data/markov_table.hpp>
#include <quintet/data/token_source.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

using quintet::markov_config;
using quintet::markov_source;
using quintet::markov_table;
using quintet::row_range;

static_assert(quintet::token_source<markov_source>);

namespace {

double binary_entropy(double p) { return -p * std::log(p) - (1 - p) * std::log(1 - p); }

// An independent computation of what markov_source derives: the context chain as a dense matrix,
// pi from (P^T - I) pi = 0 with sum(pi) = 1 by Gaussian elimination in long double, then
// H = sum_c pi(c) H(P(. | c)) and the entropies J_m of the first m tokens.
struct dense_reference {
  std::vector<long double> pi;      // (contexts,)
  long double rate = 0;             // nats/token
  std::vector<long double> prefix;  // (order + 1,) J_0 .. J_k
};

dense_reference solve_dense(const markov_table& table) {
  const std::int64_t v = table.vocab(), n = table.context_count();
  const std::int64_t oldest = n / v;  // V^(k-1): dropping the oldest token is c mod V^(k-1)
  std::vector<long double> a(n * n, 0.0L), b(n, 0.0L);  // (n, n) row-major: a x = b
  for (std::int64_t c = 0; c < n; ++c) {
    for (std::int64_t y = 0; y < v; ++y) {
      const std::int64_t next = (c % oldest) * v + y;
      a[next * n + c] += table.probability(c, static_cast<std::int32_t>(y));
    }
    a[c * n + c] -= 1.0L;
  }
  for (std::int64_t c = 0; c < n; ++c) a[(n - 1) * n + c] = 1.0L;  // replace one equation
  b[n - 1] = 1.0L;
  for (std::int64_t col = 0; col < n; ++col) {
    std::int64_t pivot = col;
    for (std::int64_t r = col + 1; r < n; ++r) {
      if (std::fabs(a[r * n + col]) > std::fabs(a[pivot * n + col])) pivot = r;
    }
    for (std::int64_t k = 0; k < n; ++k) std::swap(a[col * n + k], a[pivot * n + k]);
    std::swap(b[col], b[pivot]);
    for (std::int64_t r = 0; r < n; ++r) {
      if (r == col) continue;
      const long double f = a[r * n + col] / a[col * n + col];
      for (std::int64_t k = col; k < n; ++k) a[r * n + k] -= f * a[col * n + k];
      b[r] -= f * b[col];
    }
  }
  dense_reference ref;
  ref.pi.resize(n);
  for (std::int64_t c = 0; c < n; ++c) ref.pi[c] = b[c] / a[c * n + c];
  for (std::int64_t c = 0; c < n; ++c) {
    for (std::int64_t y = 0; y < v; ++y) {
      const long double p = table.probability(c, static_cast<std::int32_t>(y));
      if (p > 0) ref.rate -= ref.pi[c] * p * std::log(p);
    }
  }
  ref.prefix.assign(table.order() + 1, 0.0L);
  for (int m = 1; m <= table.order(); ++m) {
    std::int64_t groups = 1;
    for (int i = 0; i < m; ++i) groups *= v;
    std::vector<long double> marginal(groups, 0.0L);
    for (std::int64_t c = 0; c < n; ++c) marginal[c / (n / groups)] += ref.pi[c];
    for (const long double p : marginal) {
      if (p > 0) ref.prefix[m] -= p * std::log(p);
    }
  }
  return ref;
}

std::int64_t context_of(std::span<const std::int32_t> tokens, std::int64_t vocab) {
  std::int64_t c = 0;
  for (const std::int32_t t : tokens) c = c * vocab + t;
  return c;
}

}  // namespace

TEST_CASE("two-state chain: stationary distribution and entropy rate match the closed form",
          "[data][markov]") {
  const double a = 0.3, b = 0.1;  // P(0 -> 1), P(1 -> 0)
  const std::vector<double> p{1 - a, a, b, 1 - b};
  const markov_source source(markov_table::from_dense(2, 1, p), 5);
  const double pi0 = b / (a + b), pi1 = a / (a + b);
  CHECK(source.stationary()[0] == Approx(pi0).margin(1e-14));
  CHECK(source.stationary()[1] == Approx(pi1).margin(1e-14));
  const double rate = pi0 * binary_entropy(a) + pi1 * binary_entropy(b);
  CHECK(source.entropy_rate() == Approx(rate).epsilon(1e-13));
  CHECK(source.stationary_residual() < 1e-14);
  // Order 1: every target sees its whole context, so the floor is the rate at any length.
  for (const std::int64_t seq : {1, 2, 17}) {
    CHECK(*source.entropy_floor(seq) == Approx(rate).epsilon(1e-13));
  }
  CHECK(source.entropy_floor().value() == source.entropy_rate());
}

TEST_CASE(
    "order-2 'repeat the token two back with probability q' chain: H = h(q) and the window "
    "floor counts the first target's extra uncertainty",
    "[data][markov]") {
  const double q = 0.85;
  std::vector<double> p(4 * 2);
  for (int a = 0; a < 2; ++a) {
    for (int b = 0; b < 2; ++b) {
      for (int y = 0; y < 2; ++y) p[(a * 2 + b) * 2 + y] = y == a ? q : 1 - q;
    }
  }
  const markov_source source(markov_table::from_dense(2, 2, p), 1);
  for (const double pi : source.stationary()) CHECK(pi == Approx(0.25).margin(1e-14));
  CHECK(source.entropy_rate() == Approx(binary_entropy(q)).epsilon(1e-13));
  CHECK(source.prefix_entropy(1) == Approx(std::log(2.0)).epsilon(1e-13));
  CHECK(source.prefix_entropy(2) == Approx(std::log(4.0)).epsilon(1e-13));
  // Target 1 sees only x_0, which says nothing about x_1 here: it costs log 2, the rest h(q).
  for (const std::int64_t seq : {1, 2, 3, 64}) {
    const double expected = (std::log(2.0) + double(seq - 1) * binary_entropy(q)) / double(seq);
    CHECK(*source.entropy_floor(seq) == Approx(expected).epsilon(1e-13));
  }
}

TEST_CASE("a transient context gets probability zero and is never sampled", "[data][markov]") {
  // Token 2 leads into {0, 1} and nothing leads back to it.
  const std::vector<double> p{0.7, 0.3, 0.0, 0.2, 0.8, 0.0, 0.5, 0.5, 0.0};
  const markov_source source(markov_table::from_dense(3, 1, p), 9);
  CHECK(source.stationary()[2] == 0.0);
  CHECK(source.stationary()[0] == Approx(0.4).margin(1e-14));
  const double rate = 0.4 * binary_entropy(0.3) + 0.6 * binary_entropy(0.2);
  CHECK(source.entropy_rate() == Approx(rate).epsilon(1e-13));
  const auto batch = source.batch(0, {0, 64}, 32);
  for (std::int64_t i = 0; i < batch.inputs.numel(); ++i) CHECK(batch.inputs.data()[i] != 2);
}

TEST_CASE("a periodic chain still has its unique stationary distribution", "[data][markov]") {
  const markov_source source(markov_table::from_dense(2, 1, std::vector<double>{0, 1, 1, 0}), 3);
  CHECK(source.stationary()[0] == Approx(0.5).margin(1e-15));
  CHECK(source.entropy_rate() == 0.0);
  const auto batch = source.batch(0, {0, 4}, 9);
  for (std::int64_t r = 0; r < 4; ++r) {
    for (std::int64_t i = 0; i < 9; ++i) CHECK(batch.targets(r, i) == 1 - batch.inputs(r, i));
  }
}

TEST_CASE("random tables: pi, the entropy rate and prefix entropies match a dense solve",
          "[data][markov]") {
  const markov_config configs[] = {{.vocab = 7, .order = 1, .successors = 3, .seed = 11},
                                   {.vocab = 5, .order = 2, .successors = 3, .seed = 12},
                                   {.vocab = 4, .order = 3, .successors = 2, .seed = 13},
                                   {.vocab = 6, .order = 2, .successors = 6, .seed = 14}};
  for (const auto& config : configs) {
    CAPTURE(config.vocab, config.order, config.successors);
    const markov_source source(config);
    const dense_reference ref = solve_dense(source.table());
    double worst = 0;
    for (std::int64_t c = 0; c < source.table().context_count(); ++c) {
      worst = std::max(worst, double(std::fabs(source.stationary()[c] - ref.pi[c])));
    }
    CHECK(worst < 1e-13);
    CHECK(source.entropy_rate() == Approx(double(ref.rate)).epsilon(1e-12));
    CHECK(source.entropy_rate() > 0.1);
    for (int m = 1; m <= config.order; ++m) {
      CHECK(source.prefix_entropy(m) == Approx(double(ref.prefix[m])).epsilon(1e-12));
    }
    for (std::int64_t c = 0; c < source.table().context_count(); ++c) {
      CHECK(source.table().successors(c).size() == std::size_t(config.successors));
    }
  }
}

TEST_CASE("the default source: sampled log-loss under the true model converges to the rate",
          "[data][markov]") {
  const markov_source source(markov_config{.seed = 2024});
  const std::int64_t v = source.vocab_size(), k = source.order(), rows = 512, seq = 512;
  const auto batch = source.batch(0, {0, rows}, seq);
  // Rows are independent stationary samples, so the spread of per-row means gives the error bar.
  double sum = 0, sum_squares = 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    double row_loss = 0;
    for (std::int64_t i = k - 1; i < seq; ++i) {  // targets whose whole context is in the window
      std::vector<std::int32_t> context;
      for (std::int64_t j = i - k + 1; j <= i; ++j) context.push_back(batch.inputs(r, j));
      const double p = source.table().probability(context_of(context, v), batch.targets(r, i));
      REQUIRE(p > 0);
      row_loss -= std::log(p);
    }
    row_loss /= double(seq - k + 1);
    sum += row_loss;
    sum_squares += row_loss * row_loss;
  }
  const double mean = sum / rows;
  const double standard_error = std::sqrt((sum_squares / rows - mean * mean) / (rows - 1));
  INFO("empirical " << mean << " +- " << standard_error << ", rate " << source.entropy_rate());
  CHECK(standard_error < 0.005);
  CHECK(std::abs(mean - source.entropy_rate()) < 4.5 * standard_error);
}

TEST_CASE(
    "short windows: the best possible mean loss converges to entropy_floor(seq), and the "
    "starting context follows pi",
    "[data][markov]") {
  const markov_source source(markov_config{.vocab = 5, .order = 2, .successors = 3, .seed = 77});
  const dense_reference ref = solve_dense(source.table());
  const std::int64_t v = 5, rows = 40000, seq = 3;
  const auto batch = source.batch(4, {0, rows}, seq);
  std::vector<double> first_context_count(25, 0.0);
  double sum = 0, sum_squares = 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int32_t x0 = batch.inputs(r, 0), x1 = batch.inputs(r, 1);
    first_context_count[x0 * v + x1] += 1;
    // Target 1 given x_0 alone: the marginal conditional pi(x0, x1) / sum_y pi(x0, y).
    long double marginal = 0;
    for (std::int64_t y = 0; y < v; ++y) marginal += ref.pi[x0 * v + y];
    double loss = -std::log(double(ref.pi[x0 * v + x1] / marginal));
    for (std::int64_t i = 1; i < seq; ++i) {
      const std::int64_t c = batch.inputs(r, i - 1) * v + batch.inputs(r, i);
      loss -= std::log(source.table().probability(c, batch.targets(r, i)));
    }
    loss /= double(seq);
    sum += loss;
    sum_squares += loss * loss;
  }
  const double mean = sum / rows;
  const double standard_error = std::sqrt((sum_squares / rows - mean * mean) / (rows - 1));
  const double floor = *source.entropy_floor(seq);
  INFO("empirical " << mean << " +- " << standard_error << ", floor " << floor);
  CHECK(standard_error < 0.005);
  CHECK(std::abs(mean - floor) < 4.5 * standard_error);
  CHECK(floor > source.entropy_rate());  // the first target sees less than a full context
  for (std::int64_t c = 0; c < 25; ++c) {
    const double pi = double(ref.pi[c]);
    CHECK(std::abs(first_context_count[c] / rows - pi) <= 5 * std::sqrt(pi * (1 - pi) / rows));
  }
}

TEST_CASE("tables are a pure function of the seed", "[data][markov]") {
  const markov_config config{.vocab = 16, .order = 2, .successors = 3, .seed = 99};
  const markov_table first = quintet::random_markov_table(config);
  const markov_table second = quintet::random_markov_table(config);
  markov_config other = config;
  other.seed = 100;
  const markov_table third = quintet::random_markov_table(other);
  bool differs = false;
  for (std::int64_t c = 0; c < first.context_count(); ++c) {
    const auto t1 = first.successors(c), t2 = second.successors(c), t3 = third.successors(c);
    const auto p1 = first.probabilities(c), p2 = second.probabilities(c);
    REQUIRE(t1.size() == 3);
    CHECK(std::memcmp(t1.data(), t2.data(), t1.size_bytes()) == 0);
    CHECK(std::memcmp(p1.data(), p2.data(), p1.size_bytes()) == 0);
    differs = differs || std::memcmp(t1.data(), t3.data(), t1.size_bytes()) != 0;
  }
  CHECK(differs);
  CHECK(markov_source(config).entropy_rate() == markov_source(config).entropy_rate());
}

TEST_CASE("batch rows are a pure function of (seed, step, row): slices equal the global batch",
          "[data][markov]") {
  const markov_config config{.seed = 31};
  const markov_source source(config), same(config);
  const std::int64_t global = 8, seq = 33;
  const auto whole = source.batch(3, {0, global}, seq);
  const auto again = same.batch(3, {0, global}, seq);
  CHECK(std::memcmp(whole.inputs.data(), again.inputs.data(), whole.inputs.bytes()) == 0);
  CHECK(std::memcmp(whole.targets.data(), again.targets.data(), whole.targets.bytes()) == 0);
  for (const std::int64_t ranks : {1, 2, 4, 8}) {
    for (std::int64_t rank = 0; rank < ranks; ++rank) {
      const row_range rows = quintet::split_rows({0, global}, ranks, rank);
      const auto part = source.batch(3, rows, seq);
      REQUIRE(part.inputs.shape() == quintet::shape{rows.size(), seq});
      CHECK(std::memcmp(part.inputs.data(), whole.inputs.data() + rows.begin * seq,
                        part.inputs.bytes()) == 0);
      CHECK(std::memcmp(part.targets.data(), whole.targets.data() + rows.begin * seq,
                        part.targets.bytes()) == 0);
    }
  }
  const auto odd = source.batch(3, {3, 6}, seq);
  CHECK(std::memcmp(odd.inputs.data(), whole.inputs.data() + 3 * seq, odd.inputs.bytes()) == 0);
  // Other steps, other rows and other seeds give other tokens.
  const auto next_step = source.batch(4, {0, global}, seq);
  CHECK(std::memcmp(next_step.inputs.data(), whole.inputs.data(), whole.inputs.bytes()) != 0);
  CHECK(std::memcmp(whole.inputs.data(), whole.inputs.data() + seq, seq * sizeof(std::int32_t)) !=
        0);
  const auto other_seed = markov_source(markov_config{.seed = 32}).batch(3, {0, global}, seq);
  CHECK(std::memcmp(other_seed.inputs.data(), whole.inputs.data(), whole.inputs.bytes()) != 0);
}

TEST_CASE(
    "markov batches: targets are inputs shifted by one, tokens in range, every transition "
    "possible",
    "[data][markov]") {
  const markov_source source(markov_config{.vocab = 40, .order = 2, .successors = 3, .seed = 5});
  const std::int64_t rows = 6, seq = 50;
  const auto batch = source.batch(11, {10, 10 + rows}, seq);
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t i = 0; i < seq; ++i) {
      CHECK(batch.inputs(r, i) >= 0);
      CHECK(batch.inputs(r, i) < 40);
      CHECK(batch.targets(r, i) >= 0);
      CHECK(batch.targets(r, i) < 40);
      if (i + 1 < seq) CHECK(batch.targets(r, i) == batch.inputs(r, i + 1));
      if (i >= 1) {
        const std::int64_t c = batch.inputs(r, i - 1) * 40 + batch.inputs(r, i);
        CHECK(source.table().probability(c, batch.targets(r, i)) > 0);
      }
    }
  }
  // A window shorter than the order is the start of the context drawn from pi.
  const auto tiny = source.batch(11, {10, 11}, 1);
  CHECK(tiny.inputs(0, 0) == batch.inputs(0, 0));
  CHECK(tiny.targets(0, 0) == batch.inputs(0, 1));
}

TEST_CASE("bad Markov configurations and tables are rejected with the values named",
          "[data][markov][errors]") {
  REQUIRE_THROWS_WITH(markov_source(markov_config{.vocab = 1}),
                      Catch::Contains("vocabulary 1 is out of range"));
  REQUIRE_THROWS_WITH(markov_source(markov_config{.order = 0}),
                      Catch::Contains("order 0 must be at least 1"));
  REQUIRE_THROWS_WITH(markov_source(markov_config{.vocab = 1024, .order = 3}),
                      Catch::Contains("vocabulary 1024 and order 3 has more than 1048576"));
  REQUIRE_THROWS_WITH(markov_source(markov_config{.successors = 1}),
                      Catch::Contains("got 1 successors for vocabulary 16"));
  REQUIRE_THROWS_WITH(markov_source(markov_config{.vocab = 8, .successors = 9}),
                      Catch::Contains("got 9 successors for vocabulary 8"));
  // Two closed classes (each token repeats forever): no unique stationary distribution.
  REQUIRE_THROWS_WITH(
      markov_source(markov_table::from_dense(2, 1, std::vector<double>{1, 0, 0, 1}), 0),
      Catch::Contains("has 2 closed classes"));
  REQUIRE_THROWS_WITH(markov_table::from_dense(2, 1, std::vector<double>{0.5, 0.5, 1}),
                      Catch::Contains("needs 2 x 2 = 4 probabilities, got 3"));
  REQUIRE_THROWS_WITH(markov_table::from_dense(2, 1, std::vector<double>{0.5, 0.4, 0, 1}),
                      Catch::Contains("context 0: successor probabilities sum to 0.9"));
  REQUIRE_THROWS_WITH(markov_table::from_dense(2, 1, std::vector<double>{1.5, -0.5, 0, 1}),
                      Catch::Contains("entry (0, 1) is negative: -0.5"));
  REQUIRE_THROWS_WITH(markov_table(2, 1, {0, 2, 3}, {1, 1, 0}, {0.5, 0.5, 1.0}),
                      Catch::Contains("context 0 lists successor 1 twice"));
  REQUIRE_THROWS_WITH(markov_table(2, 1, {0, 1, 2}, {2, 0}, {1.0, 1.0}),
                      Catch::Contains("successor token 2 outside [0, 2)"));
  REQUIRE_THROWS_WITH(markov_table(2, 1, {0, 0, 2}, {0, 1}, {0.5, 0.5}),
                      Catch::Contains("context 0 has no successors"));
  const markov_source source(markov_config{.seed = 1});
  REQUIRE_THROWS_WITH(source.batch(0, {0, 4}, 0), Catch::Contains("sequence length 0"));
  REQUIRE_THROWS_WITH(source.batch(0, {2, 1}, 8), Catch::Contains("batch rows [2, 1)"));
  REQUIRE_THROWS_WITH(source.batch(-5, {0, 1}, 8), Catch::Contains("batch step -5"));
  REQUIRE_THROWS_WITH(source.entropy_floor(0), Catch::Contains("sequence length 0"));
  REQUIRE_THROWS_WITH(source.prefix_entropy(3), Catch::Contains("prefix entropy of 3 tokens"));
}
