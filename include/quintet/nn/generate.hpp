// generate: text from a model — sample the next token from the logits a decoder gives, append it,
// repeat — and choose_token, the sampling rule: greedy (temperature 0 or top-k 1), or a draw from
// softmax(logits / temperature) over the k most likely tokens. Draws come from Philox keyed by a
// seed and a stream (sampling_key(seed, step)), token i of a generation using element i, so every
// rank of a plan, given the same logits, draws the same token, and a fixed key reproduces a sample.
//
// The decoder has a position table of max_seq rows. When the context is full, generation keeps its
// last max_seq / 2 tokens (at least one) and starts a new window over them at position 0:
//
//   max_seq 8, prompt p, generated g:
//   token      0 1 2 3 4 5 6 7 8 9 a b c d
//              p p p p g g g g g g g g g g
//   window 1  [0 1 2 3 4 5 6 7]               positions of tokens 0..7; it predicts tokens 4..8
//   window 2            [0 1 2 3 4 5 6 7]     tokens 5..c re-encoded; it predicts tokens 9..d
//
// generation_mode::cached runs each window's first pass over its tokens, then one token per step
// on the kv_cache; generation_mode::recompute runs the whole window again for every token (what a
// model without a cache does). Both give the same logits up to rounding, so at temperature 0 the
// same tokens (tested).
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/core/philox.hpp>
#include <quintet/kernels/accumulator.hpp>
#include <quintet/tensor/copy.hpp>
#include <quintet/tensor/device.hpp>
#include <quintet/tensor/slice.hpp>
#include <quintet/tensor/tensor.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <span>
#include <vector>

namespace quintet::nn {

struct sampling_options {
  double temperature = 1.0;  // 0: greedy
  std::int64_t top_k = 0;    // 0: the whole vocabulary; 1: greedy
  rng_key key{};             // the draws' stream; draw i (token i of a generation) is element i

  void validate() const {
    QUINTET_CHECK(temperature >= 0.0 && std::isfinite(temperature),
                  "sampling: temperature {} must be a finite number >= 0", temperature);
    QUINTET_CHECK(top_k >= 0, "sampling: top-k {} must be >= 0 (0: every token)", top_k);
  }
  bool greedy() const { return temperature == 0.0 || top_k == 1; }
};

// The key of the samples taken at training step `step` of a run seeded `seed`.
inline rng_key sampling_key(std::uint64_t seed, std::int64_t step) {
  return {.seed = seed, .stream = rng_stream_for("quintet.nn.sample") + std::uint64_t(step)};
}

// The token chosen from `logits` (vocab,) by `options`, with draw number `draw`. Greedy: the
// largest logit (the smallest id among equals). Otherwise the k largest (ties to the smaller id)
// weighted by exp((logit - max) / temperature), in double, picked by one uniform draw walking
// their cumulative sum from the most likely.
template <class T>
std::int32_t choose_token(std::span<const T> logits, const sampling_options& options,
                          std::uint64_t draw) {
  options.validate();
  QUINTET_CHECK(!logits.empty(), "sampling: no logits to choose from");
  // Widened exactly (16-bit logits through float).
  const auto logit = [&](std::size_t i) { return static_cast<double>(kernels::widen(logits[i])); };
  for (std::size_t i = 0; i < logits.size(); ++i)
    QUINTET_CHECK(std::isfinite(logit(i)), "sampling: logit {} of token {} is not a number",
                  logit(i), i);
  std::vector<std::int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  const auto more_likely = [&](std::int32_t a, std::int32_t b) {
    const double la = logit(static_cast<std::size_t>(a)), lb = logit(static_cast<std::size_t>(b));
    return la > lb || (la == lb && a < b);
  };
  if (options.greedy()) return *std::min_element(order.begin(), order.end(), more_likely);
  const std::size_t k = options.top_k == 0
                            ? order.size()
                            : std::min(order.size(), static_cast<std::size_t>(options.top_k));
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(),
                    more_likely);
  const double top = logit(static_cast<std::size_t>(order[0]));
  std::vector<double> cumulative(k);
  double total = 0.0;
  for (std::size_t i = 0; i < k; ++i) {
    total += std::exp((logit(static_cast<std::size_t>(order[i])) - top) / options.temperature);
    cumulative[i] = total;
  }
  const double target = rng_cursor(options.key).uniform_double(draw) * total;
  for (std::size_t i = 0; i + 1 < k; ++i)
    if (target < cumulative[i]) return order[i];
  return order[k - 1];
}

enum class generation_mode { cached, recompute };

// `count` tokens following `prompt` (at least one token), one sequence, from `decoder` (an
// nn::gpt_decoder): the generated tokens, without the prompt. Under a plan every rank calls it
// with the same arguments and gets the same tokens.
template <class Decoder>
std::vector<std::int32_t> generate(Decoder& decoder, std::span<const std::int32_t> prompt,
                                   std::int64_t count, const sampling_options& options,
                                   generation_mode mode = generation_mode::cached) {
  options.validate();
  QUINTET_CHECK(!prompt.empty(), "generate: the prompt needs at least one token");
  QUINTET_CHECK(count >= 0, "generate: {} tokens asked for", count);
  const std::int64_t limit = decoder.config().max_seq;
  const std::int64_t keep = std::max<std::int64_t>(1, limit / 2);
  std::vector<std::int32_t> tokens(prompt.begin(), prompt.end());
  std::vector<std::int32_t> generated;
  std::int64_t begin = std::max<std::int64_t>(0, std::int64_t(tokens.size()) - limit);
  auto cache = decoder.make_cache(1, limit);
  using device_type = typename decltype(cache)::device_type;
  using value_type = typename decltype(cache)::value_type;
  // The logits of the last of tokens [from, end), run on the cache from its current length.
  const auto run = [&](std::int64_t from) {
    const std::int64_t n = std::int64_t(tokens.size()) - from;
    quintet::tensor<std::int32_t, host> ids(shape{1, n});
    std::copy(tokens.begin() + from, tokens.end(), ids.data());
    quintet::tensor<std::int32_t, device_type> on_device(ids.shape());
    copy(on_device, ids);
    const auto logits = decoder.forward(cache, on_device.view());  // (1, n, vocab)
    const std::int64_t vocab = logits.shape()[2];
    quintet::tensor<value_type, host> last(shape{1, 1, vocab});
    copy(last, slice(logits, 1, n - 1, n));
    return last;
  };
  // A new window over tokens [begin, end), from position 0.
  const auto window = [&] {
    cache.reset();
    return run(begin);
  };
  auto last = window();
  for (std::int64_t i = 0; i < count; ++i) {
    const std::int32_t next = choose_token(std::span<const value_type>(last.data(), last.numel()),
                                           options, std::uint64_t(i));
    tokens.push_back(next);
    generated.push_back(next);
    if (i + 1 == count) break;
    if (std::int64_t(tokens.size()) - begin > limit) {
      begin = std::int64_t(tokens.size()) - keep;
      last = window();
    } else if (mode == generation_mode::recompute) {
      last = window();
    } else {
      last = run(std::int64_t(tokens.size()) - 1);
    }
  }
  return generated;
}

}  // namespace quintet::nn
