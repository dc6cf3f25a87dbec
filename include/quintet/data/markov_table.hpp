// markov_table: the sparse transition table of an order-k Markov source over V tokens, built by
// hand (tests) or drawn from Philox keyed by a seed (the synthetic corpus), and the analysis that
// proves a table has exactly one closed class, so its stationary distribution is unique.
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/core/philox.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace quintet {

// The synthetic corpus: `successors` distinct next tokens per context, their probabilities drawn
// as normalised (Exp(1) + 0.1) weights (a Dirichlet(1) draw kept away from zero, so the chain
// mixes quickly). The defaults are what examples/train_gpt learns from: order 2 makes the model
// attend to the previous token, and 16^2 contexts x 3 successors are few enough for a small GPT
// to learn in minutes on 2 cores (32^2 contexts were not; see docs/data.md).
struct markov_config {
  std::int64_t vocab = 16;
  int order = 2;
  int successors = 3;
  std::uint64_t seed = 0;
};

// V^k is bounded so that the table and the stationary distribution stay small.
inline constexpr std::int64_t max_markov_contexts = std::int64_t{1} << 20;
inline constexpr std::int64_t max_markov_transitions = std::int64_t{1} << 25;

// V^order, or an error when it exceeds max_markov_contexts.
inline std::int64_t markov_context_count(std::int64_t vocab, int order) {
  QUINTET_CHECK(vocab >= 2 && vocab <= std::int64_t{1} << 31,
                "Markov source vocabulary {} is out of range: need 2 <= vocab <= 2^31", vocab);
  QUINTET_CHECK(order >= 1, "Markov source order {} must be at least 1", order);
  std::int64_t contexts = 1;
  for (int i = 0; i < order; ++i) {
    QUINTET_CHECK(contexts <= max_markov_contexts / vocab,
                  "Markov source with vocabulary {} and order {} has more than {} contexts "
                  "(vocab^order); lower the order or the vocabulary",
                  vocab, order, max_markov_contexts);
    contexts *= vocab;
  }
  return contexts;
}

// Contexts are numbered in base V with the oldest token most significant:
//   context(x_{t-k+1}, ..., x_t) = x_{t-k+1} V^{k-1} + ... + x_t,
// so appending token y gives (context V + y) mod V^k. Context c's successors are the tokens
// tokens[offsets[c] .. offsets[c+1]) with probabilities probabilities[same range], each > 0.
class markov_table {
 public:
  markov_table(std::int64_t vocab, int order, std::vector<std::int64_t> offsets,
               std::vector<std::int32_t> tokens, std::vector<double> probabilities)
      : vocab_(vocab),
        order_(order),
        contexts_(markov_context_count(vocab, order)),
        offsets_(std::move(offsets)),
        tokens_(std::move(tokens)),
        probabilities_(std::move(probabilities)) {
    QUINTET_CHECK(std::int64_t(offsets_.size()) == contexts_ + 1,
                  "Markov table with {} contexts needs {} offsets, got {}", contexts_,
                  contexts_ + 1, offsets_.size());
    QUINTET_CHECK(tokens_.size() == probabilities_.size(),
                  "Markov table has {} successor tokens but {} probabilities", tokens_.size(),
                  probabilities_.size());
    QUINTET_CHECK(std::int64_t(tokens_.size()) <= max_markov_transitions,
                  "Markov table has {} transitions, more than the limit {}", tokens_.size(),
                  max_markov_transitions);
    QUINTET_CHECK(offsets_.front() == 0 && offsets_.back() == std::int64_t(tokens_.size()),
                  "Markov table offsets must run from 0 to {} (the transition count), got {} to {}",
                  tokens_.size(), offsets_.front(), offsets_.back());
    std::vector<bool> seen(static_cast<std::size_t>(vocab_), false);
    for (std::int64_t c = 0; c < contexts_; ++c) {
      QUINTET_CHECK(offsets_[c] < offsets_[c + 1],
                    "Markov table context {} has no successors (offsets {} and {})", c, offsets_[c],
                    offsets_[c + 1]);
      double total = 0.0;
      for (std::int64_t j = offsets_[c]; j < offsets_[c + 1]; ++j) {
        const std::int32_t token = tokens_[j];
        const double p = probabilities_[j];
        QUINTET_CHECK(token >= 0 && token < vocab_,
                      "Markov table context {} has successor token {} outside [0, {})", c, token,
                      vocab_);
        QUINTET_CHECK(!seen[token], "Markov table context {} lists successor {} twice", c, token);
        QUINTET_CHECK(p > 0.0 && p <= 1.0,
                      "Markov table context {} gives successor {} probability {}; need (0, 1]", c,
                      token, p);
        seen[token] = true;
        total += p;
      }
      QUINTET_CHECK(std::abs(total - 1.0) <= 1e-12,
                    "Markov table context {}: successor probabilities sum to {}, not 1", c, total);
      for (std::int64_t j = offsets_[c]; j < offsets_[c + 1]; ++j) seen[tokens_[j]] = false;
    }
  }

  // A table from a dense (contexts, vocab) row-major matrix of probabilities; zeros are dropped.
  static markov_table from_dense(std::int64_t vocab, int order,
                                 std::span<const double> probabilities) {
    const std::int64_t contexts = markov_context_count(vocab, order);
    QUINTET_CHECK(std::int64_t(probabilities.size()) == contexts * vocab,
                  "dense Markov table for vocabulary {} and order {} needs {} x {} = {} "
                  "probabilities, got {}",
                  vocab, order, contexts, vocab, contexts * vocab, probabilities.size());
    std::vector<std::int64_t> offsets{0};
    std::vector<std::int32_t> tokens;
    std::vector<double> kept;
    for (std::int64_t c = 0; c < contexts; ++c) {
      for (std::int64_t y = 0; y < vocab; ++y) {
        const double p = probabilities[static_cast<std::size_t>(c * vocab + y)];
        QUINTET_CHECK(p >= 0.0, "dense Markov table entry ({}, {}) is negative: {}", c, y, p);
        if (p == 0.0) continue;
        tokens.push_back(static_cast<std::int32_t>(y));
        kept.push_back(p);
      }
      offsets.push_back(std::int64_t(tokens.size()));
    }
    return markov_table(vocab, order, std::move(offsets), std::move(tokens), std::move(kept));
  }

  std::int64_t vocab() const { return vocab_; }
  int order() const { return order_; }
  std::int64_t context_count() const { return contexts_; }
  std::int64_t transition_count() const { return std::int64_t(tokens_.size()); }

  std::span<const std::int32_t> successors(std::int64_t context) const {
    return std::span<const std::int32_t>(tokens_).subspan(
        offsets_[context], offsets_[context + 1] - offsets_[context]);
  }
  std::span<const double> probabilities(std::int64_t context) const {
    return std::span<const double>(probabilities_)
        .subspan(offsets_[context], offsets_[context + 1] - offsets_[context]);
  }

  // Where context's successors start in the flat (transitions,) arrays.
  std::int64_t first_transition(std::int64_t context) const { return offsets_[context]; }

  // P(token | context), zero for a token that is not a successor.
  double probability(std::int64_t context, std::int32_t token) const {
    const auto next = successors(context);
    const auto at = std::find(next.begin(), next.end(), token);
    return at == next.end() ? 0.0 : probabilities(context)[at - next.begin()];
  }

  std::int64_t next_context(std::int64_t context, std::int32_t token) const {
    return (context * vocab_ + token) % contexts_;
  }

 private:
  std::int64_t vocab_;
  int order_;
  std::int64_t contexts_;
  std::vector<std::int64_t> offsets_;  // (contexts + 1,)
  std::vector<std::int32_t> tokens_;   // (transitions,)
  std::vector<double> probabilities_;  // (transitions,)
};

// Which contexts are recurrent: the closed communicating classes of the context chain (strongly
// connected components with no edge leaving them). A chain with exactly one closed class has a
// unique stationary distribution, supported on that class; every other context is transient.
struct markov_classes {
  std::int64_t closed_class_count = 0;
  std::vector<bool> recurrent;  // (contexts,)
};

inline markov_classes find_markov_classes(const markov_table& table) {
  // Tarjan's strongly connected components, iterative so that 2^20 contexts cannot overflow the
  // call stack.
  const std::int64_t n = table.context_count();
  std::vector<std::int64_t> index(n, -1), low(n, 0), component(n, -1);
  std::vector<bool> on_stack(n, false);
  std::vector<std::int64_t> stack;
  struct frame {
    std::int64_t context;
    std::int64_t next_edge;
  };
  std::vector<frame> calls;
  std::int64_t counter = 0, components = 0;
  for (std::int64_t start = 0; start < n; ++start) {
    if (index[start] >= 0) continue;
    index[start] = low[start] = counter++;
    stack.push_back(start);
    on_stack[start] = true;
    calls.push_back({start, 0});
    while (!calls.empty()) {
      const std::int64_t v = calls.back().context;
      const auto next = table.successors(v);
      if (calls.back().next_edge < std::int64_t(next.size())) {
        const std::int64_t w = table.next_context(v, next[calls.back().next_edge++]);
        if (index[w] < 0) {
          index[w] = low[w] = counter++;
          stack.push_back(w);
          on_stack[w] = true;
          calls.push_back({w, 0});
        } else if (on_stack[w]) {
          low[v] = std::min(low[v], index[w]);
        }
        continue;
      }
      if (low[v] == index[v]) {
        std::int64_t w = -1;
        do {
          w = stack.back();
          stack.pop_back();
          on_stack[w] = false;
          component[w] = components;
        } while (w != v);
        ++components;
      }
      calls.pop_back();
      if (!calls.empty()) low[calls.back().context] = std::min(low[calls.back().context], low[v]);
    }
  }
  std::vector<bool> closed(components, true);
  for (std::int64_t v = 0; v < n; ++v) {
    for (const std::int32_t token : table.successors(v)) {
      if (component[table.next_context(v, token)] != component[v]) closed[component[v]] = false;
    }
  }
  markov_classes classes;
  classes.recurrent.resize(n);
  for (std::int64_t v = 0; v < n; ++v) classes.recurrent[v] = closed[component[v]];
  classes.closed_class_count = std::count(closed.begin(), closed.end(), true);
  return classes;
}

// A random sparse table for `config`, a pure function of config: successor sets and weights are
// Philox draws keyed by (seed, context), so every rank and every run builds the same table. A draw
// whose chain has more than one closed class is discarded and the next attempt (a different
// Philox stream) is drawn, so the source's stationary distribution is always unique.
inline markov_table random_markov_table(const markov_config& config) {
  const std::int64_t contexts = markov_context_count(config.vocab, config.order);
  QUINTET_CHECK(config.successors >= 2 && config.successors <= config.vocab,
                "Markov source needs 2 <= successors per context <= vocabulary, got {} successors "
                "for vocabulary {}",
                config.successors, config.vocab);
  QUINTET_CHECK(contexts <= max_markov_transitions / config.successors,
                "Markov source with {} contexts x {} successors exceeds {} transitions", contexts,
                config.successors, max_markov_transitions);
  constexpr double weight_floor = 0.1;  // keeps every probability above ~0.1 / (s + 0.1 s)
  constexpr int max_attempts = 64;
  const std::uint64_t table_stream = rng_stream_for("quintet.data.markov.table");
  const std::size_t transitions = static_cast<std::size_t>(contexts * config.successors);
  for (int attempt = 0; attempt < max_attempts; ++attempt) {
    rng_cursor draws(rng_key{.seed = config.seed, .stream = table_stream + attempt});
    std::vector<std::int64_t> offsets(static_cast<std::size_t>(contexts) + 1);
    std::vector<std::int32_t> tokens(transitions);
    std::vector<double> probabilities(transitions);
    for (std::int64_t c = 0; c < contexts; ++c) {
      // Each context owns 2^32 draws: successor candidates from the start, weights from 2^31.
      const std::uint64_t base = static_cast<std::uint64_t>(c) << 32;
      const std::int64_t first = c * config.successors;
      offsets[c + 1] = first + config.successors;
      std::uint64_t candidate = 0;
      for (int j = 0; j < config.successors; ++j) {
        std::int32_t token = 0;
        bool fresh = false;
        while (!fresh) {  // rejection keeps the successors distinct and uniform over the vocabulary
          const double u = draws.uniform_double(base + candidate++);
          token = static_cast<std::int32_t>(
              std::min<std::int64_t>(config.vocab - 1, std::int64_t(u * double(config.vocab))));
          fresh = std::find(tokens.begin() + first, tokens.begin() + first + j, token) ==
                  tokens.begin() + first + j;
        }
        tokens[first + j] = token;
      }
      double total = 0.0;
      for (int j = 0; j < config.successors; ++j) {
        const double u = draws.uniform_double(base + (std::uint64_t{1} << 31) + j);
        // -log(1 - u) is Exp(1); quintet's log gives the same bits on every machine.
        const double weight = weight_floor - detail::log_unit_interval(1.0 - u);
        probabilities[first + j] = weight;
        total += weight;
      }
      for (int j = 0; j < config.successors; ++j) probabilities[first + j] /= total;
    }
    markov_table table(config.vocab, config.order, std::move(offsets), std::move(tokens),
                       std::move(probabilities));
    if (find_markov_classes(table).closed_class_count == 1) return table;
  }
  QUINTET_FAIL(
      "no Markov table with a single closed class in {} attempts for vocabulary {}, order {}, {} "
      "successors, seed {}; use more successors per context",
      max_attempts, config.vocab, config.order, config.successors, config.seed);
}

}  // namespace quintet
