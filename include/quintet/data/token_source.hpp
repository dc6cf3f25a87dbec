// token_source: what a trainer needs from the data it learns from. Implemented by markov_source
// (synthetic, with a known entropy floor) and byte_corpus (any file, floor unknown).
#pragma once

#include <quintet/data/token_batch.hpp>

#include <concepts>
#include <cstdint>
#include <optional>

namespace quintet {

// A token_source S provides
//   s.vocab_size()            -> std::int64_t: token ids lie in [0, vocab_size());
//   s.entropy_floor(seq)      -> std::optional<double>: the smallest mean cross-entropy (nats per
//                                target) any model can reach on windows of `seq` targets, or
//                                nullopt where it is not known;
//   s.batch(step, rows, seq)  -> token_batch: rows `rows` of the global batch of step `step`.
// batch() is a pure function of (the source's seed, step, row) for each row: never of how many
// ranks ask or which rows they ask for together, so every parallel configuration trains on the
// same global batches as the serial run.
template <class Source>
concept token_source = requires(const Source& source, std::int64_t step, row_range rows,
                                std::int64_t seq) {
  { source.vocab_size() } -> std::convertible_to<std::int64_t>;
  { source.entropy_floor(seq) } -> std::same_as<std::optional<double>>;
  { source.batch(step, rows, seq) } -> std::same_as<token_batch>;
};

}  // namespace quintet
