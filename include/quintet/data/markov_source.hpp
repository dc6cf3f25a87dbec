// markov_source: a synthetic token corpus from an order-k Markov source whose entropy rate is
// computed exactly, so the best loss any model can reach on it is known (the trainer's floor).
// held_out() is the same source drawing its windows from another family of Philox streams, one
// that training never reads: batches to evaluate a model on.
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/core/philox.hpp>
#include <quintet/data/markov_table.hpp>
#include <quintet/data/token_batch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace quintet {

namespace detail {

// Sum with Neumaier's compensation: entropy sums over 2^20 contexts stay exact to a few ulps.
class compensated_sum {
 public:
  void add(double x) {
    const double t = sum_ + x;
    compensation_ += std::abs(sum_) >= std::abs(x) ? (sum_ - t) + x : (x - t) + sum_;
    sum_ = t;
  }
  double value() const { return sum_ + compensation_; }

 private:
  double sum_ = 0.0;
  double compensation_ = 0.0;
};

// -sum p log p over the entries of `distribution` (zeros contribute nothing).
inline double entropy_of(std::span<const double> distribution) {
  compensated_sum h;
  for (const double p : distribution) {
    if (p > 0.0) h.add(-p * std::log(p));
  }
  return h.value();
}

}  // namespace detail

// The source: a markov_table, its stationary distribution pi over contexts and its entropy rate
//   H = sum_c pi(c) H(P(. | c))   nats/token,
// the mean cross-entropy that the true conditional distributions reach on an endless stationary
// sequence, and no model can beat. Windows are sampled from the stationary process: the first k
// tokens are a context drawn from pi, each further token from P(. | last k tokens).
class markov_source {
 public:
  // The synthetic corpus of `config`: the table is drawn from config.seed, and so are the samples.
  explicit markov_source(const markov_config& config)
      : markov_source(random_markov_table(config), config.seed) {}

  // A source over a given table (it must have exactly one closed class); `seed` keys the samples.
  markov_source(markov_table table, std::uint64_t seed) : table_(std::move(table)), seed_(seed) {
    const markov_classes classes = find_markov_classes(table_);
    QUINTET_CHECK(classes.closed_class_count == 1,
                  "Markov table (vocabulary {}, order {}) has {} closed classes; its stationary "
                  "distribution is not unique, so it has no single entropy rate",
                  table_.vocab(), table_.order(), classes.closed_class_count);
    solve_stationary(classes.recurrent);
    compute_entropies();
    build_cumulative();
  }

  const markov_table& table() const { return table_; }
  std::int64_t vocab_size() const { return table_.vocab(); }
  int order() const { return table_.order(); }
  std::uint64_t seed() const { return seed_; }

  // One line for logs and reports.
  std::string description() const {
    return "markov(vocab " + std::to_string(vocab_size()) + ", order " + std::to_string(order()) +
           ", " + std::to_string(table_.transition_count()) + " transitions, seed " +
           std::to_string(seed_) + (held_out_ ? ", held-out stream" : "") + ")";
  }

  // The same chain (table, pi, floors), its windows drawn from the held-out streams: step t of
  // the held-out source uses stream rng_stream_for("quintet.data.markov.held_out") + t, training
  // step t stream rng_stream_for("quintet.data.markov.sample") + t. The two bases are 2^60 apart
  // or more (tested), so no run long enough to reach the other family shares a stream with it.
  markov_source held_out() const {
    markov_source out = *this;
    out.sample_stream_ = rng_stream_for("quintet.data.markov.held_out");
    out.held_out_ = true;
    return out;
  }
  bool is_held_out() const { return held_out_; }
  // The Philox stream of step 0's windows (step t uses this + t).
  std::uint64_t sample_stream() const { return sample_stream_; }

  // pi: the stationary distribution over contexts (exact zeros on transient contexts).
  std::span<const double> stationary() const { return stationary_; }
  // Iterations the power method took, and ||pi P - pi||_1 at the end.
  std::int64_t stationary_iterations() const { return iterations_; }
  double stationary_residual() const { return residual_; }

  // nats per token of the endless stationary sequence.
  double entropy_rate() const { return entropy_rate_; }
  std::optional<double> entropy_floor() const { return entropy_rate_; }

  // The smallest mean cross-entropy over the `seq` targets of a window (positions 1..seq), for a
  // model that sees every earlier token of the window. Target i >= k costs the entropy rate;
  // target i < k sees only i tokens, and costs H(X_i | X_0..X_{i-1}) = J_{i+1} - J_i, J_m being
  // the entropy of the first m tokens (a marginal of pi). So the mean is
  //   (J_{min(seq, k-1)+1} - J_1 + max(0, seq - k + 1) H) / seq,   which tends to H as seq grows.
  std::optional<double> entropy_floor(std::int64_t seq) const {
    QUINTET_CHECK(seq >= 1, "entropy floor asked for sequence length {}; need seq >= 1", seq);
    const std::int64_t early = std::min<std::int64_t>(seq, order() - 1);
    const double late_targets = static_cast<double>(std::max<std::int64_t>(0, seq - order() + 1));
    return (prefix_entropy_[early + 1] - prefix_entropy_[1] + late_targets * entropy_rate_) /
           static_cast<double>(seq);
  }

  // J_m, the joint entropy of the first m <= k tokens of a window (J_0 = 0).
  double prefix_entropy(int tokens) const {
    QUINTET_CHECK(tokens >= 0 && tokens <= order(),
                  "prefix entropy of {} tokens asked of an order-{} source", tokens, order());
    return prefix_entropy_[tokens];
  }

  // Writes window `row` of step `step`: window.size() consecutive tokens of the stationary
  // process, drawn from Philox stream (seed, step) at indices [row 2^32, row 2^32 + size), so any
  // row of any step is produced alone, identically on every rank.
  void write_window(std::int64_t step, std::int64_t row, std::span<std::int32_t> window) const {
    QUINTET_CHECK(step >= 0 && row >= 0 && row < max_batch_rows,
                  "Markov window (step {}, row {}) is out of range", step, row);
    QUINTET_CHECK(std::int64_t(window.size()) <= max_sequence_length + 1,
                  "Markov window of {} tokens is longer than {}", window.size(),
                  max_sequence_length + 1);
    rng_cursor draws(rng_key{.seed = seed_, .stream = sample_stream_ + std::uint64_t(step)});
    const std::uint64_t base = static_cast<std::uint64_t>(row) << 32;
    // The first draw picks the starting context from pi by inverting its cumulative sum.
    const double start = draws.uniform_double(base) * stationary_cumulative_.back();
    std::int64_t context =
        std::upper_bound(stationary_cumulative_.begin(), stationary_cumulative_.end(), start) -
        stationary_cumulative_.begin();
    if (context >= table_.context_count()) context = last_recurrent_;  // u * total rounded up
    const std::size_t k = static_cast<std::size_t>(order());
    std::int64_t digits = context;
    std::vector<std::int32_t> first(k);
    for (std::size_t i = k; i-- > 0;) {
      first[i] = static_cast<std::int32_t>(digits % table_.vocab());
      digits /= table_.vocab();
    }
    for (std::size_t i = 0; i < std::min(k, window.size()); ++i) window[i] = first[i];
    for (std::size_t i = k; i < window.size(); ++i) {
      const std::int32_t token = next_token(context, draws.uniform_double(base + i - k + 1));
      window[i] = token;
      context = table_.next_context(context, token);
    }
  }

  // Rows `rows` of the global batch of step `step`; each row is write_window(step, row) of
  // seq + 1 tokens, inputs its first seq and targets its last seq.
  token_batch batch(std::int64_t step, row_range rows, std::int64_t seq) const {
    return assemble_token_batch(*this, step, rows, seq);
  }

 private:
  // Power iteration on the lazy chain (I + P) / 2, which has P's stationary distribution and
  // converges even when P is periodic, started uniform on the recurrent class (mass never leaves a
  // closed class, so transient contexts stay exactly zero). With the L1 change d_t shrinking by a
  // ratio r per step, the distance to pi is about d_t r / (1 - r): it stops when that and d_t are
  // below `tolerance`, or when d_t has reached rounding noise and stopped shrinking.
  void solve_stationary(const std::vector<bool>& recurrent) {
    const std::int64_t n = table_.context_count();
    const double recurrent_count = double(std::count(recurrent.begin(), recurrent.end(), true));
    std::vector<double> pi(n), next(n);
    for (std::int64_t c = 0; c < n; ++c) pi[c] = recurrent[c] ? 1.0 / recurrent_count : 0.0;
    constexpr double tolerance = 1e-15;
    constexpr double noise = 1e-13;  // ~900 ulps of the total mass 1
    constexpr std::int64_t max_iterations = 100'000;
    double change = 1.0, previous_change = 2.0;
    std::int64_t iteration = 0;
    for (; iteration < max_iterations; ++iteration) {
      apply_transition(pi, next);
      detail::compensated_sum total;
      for (std::int64_t c = 0; c < n; ++c) {
        next[c] = 0.5 * (next[c] + pi[c]);
        total.add(next[c]);
      }
      const double norm = total.value();
      detail::compensated_sum difference;
      for (std::int64_t c = 0; c < n; ++c) {
        next[c] /= norm;
        difference.add(std::abs(next[c] - pi[c]));
      }
      pi.swap(next);
      previous_change = change;
      change = difference.value();
      const double ratio = change / previous_change;
      const bool settled =
          change <= tolerance && ratio < 1.0 && change * ratio / (1.0 - ratio) <= tolerance;
      const bool at_noise_floor = change <= noise && ratio >= 0.95;  // stagnating
      if (settled || at_noise_floor) break;
    }
    QUINTET_CHECK(iteration < max_iterations,
                  "stationary distribution of the Markov source (vocabulary {}, order {}) did not "
                  "converge in {} iterations: last L1 change {}",
                  table_.vocab(), table_.order(), max_iterations, change);
    iterations_ = iteration + 1;
    apply_transition(pi, next);
    detail::compensated_sum residual;
    for (std::int64_t c = 0; c < n; ++c) residual.add(std::abs(next[c] - pi[c]));
    residual_ = residual.value();
    stationary_ = std::move(pi);
    for (std::int64_t c = 0; c < n; ++c) {
      if (stationary_[c] > 0.0) last_recurrent_ = c;
    }
  }

  // out = pi P: context c sends pi(c) P(y | c) to context (c V + y) mod V^k.
  void apply_transition(const std::vector<double>& pi, std::vector<double>& out) const {
    std::fill(out.begin(), out.end(), 0.0);
    for (std::int64_t c = 0; c < table_.context_count(); ++c) {
      if (pi[c] == 0.0) continue;
      const auto tokens = table_.successors(c);
      const auto probabilities = table_.probabilities(c);
      for (std::size_t j = 0; j < tokens.size(); ++j) {
        out[table_.next_context(c, tokens[j])] += pi[c] * probabilities[j];
      }
    }
  }

  void compute_entropies() {
    detail::compensated_sum rate;
    for (std::int64_t c = 0; c < table_.context_count(); ++c) {
      if (stationary_[c] > 0.0)
        rate.add(stationary_[c] * detail::entropy_of(table_.probabilities(c)));
    }
    entropy_rate_ = rate.value();
    // J_m: pi marginalised onto the oldest m tokens of the context, i.e. summed over blocks of
    // V^(k-m) consecutive contexts.
    prefix_entropy_.assign(static_cast<std::size_t>(order()) + 1, 0.0);
    std::int64_t block = table_.context_count();
    for (int m = 1; m <= order(); ++m) {
      block /= table_.vocab();
      std::vector<double> marginal(static_cast<std::size_t>(table_.context_count() / block));
      for (std::int64_t c = 0; c < table_.context_count(); ++c)
        marginal[c / block] += stationary_[c];
      prefix_entropy_[m] = detail::entropy_of(marginal);
    }
  }

  void build_cumulative() {
    stationary_cumulative_.resize(stationary_.size());
    double running = 0.0;
    for (std::size_t c = 0; c < stationary_.size(); ++c) {
      running += stationary_[c];
      stationary_cumulative_[c] = running;
    }
    successor_cumulative_.resize(static_cast<std::size_t>(table_.transition_count()));
    std::size_t at = 0;
    for (std::int64_t c = 0; c < table_.context_count(); ++c) {
      running = 0.0;
      for (const double p : table_.probabilities(c)) successor_cumulative_[at++] = (running += p);
    }
  }

  // The successor of `context` that the uniform draw u in [0, 1) selects; the last successor
  // takes whatever rounding leaves past the cumulative sum.
  std::int32_t next_token(std::int64_t context, double u) const {
    const auto tokens = table_.successors(context);
    const std::size_t first = static_cast<std::size_t>(table_.first_transition(context));
    const double target = u * successor_cumulative_[first + tokens.size() - 1];
    for (std::size_t j = 0; j + 1 < tokens.size(); ++j) {
      if (target < successor_cumulative_[first + j]) return tokens[j];
    }
    return tokens.back();
  }

  markov_table table_;
  std::uint64_t seed_;
  std::uint64_t sample_stream_ = rng_stream_for("quintet.data.markov.sample");
  bool held_out_ = false;
  std::vector<double> stationary_;             // (contexts,) pi
  std::vector<double> stationary_cumulative_;  // (contexts,) running sum of pi
  std::vector<double> successor_cumulative_;   // (transitions,) running sums within each context
  std::vector<double> prefix_entropy_;         // (order + 1,) J_0 .. J_k
  double entropy_rate_ = 0.0;
  std::int64_t last_recurrent_ = 0;
  std::int64_t iterations_ = 0;
  double residual_ = 0.0;
};

}  // namespace quintet
