// any_token_source: a token source chosen at run time (the synthetic Markov corpus, or a byte
// corpus when the trainer is given --data PATH), itself a token_source.
#pragma once

#include <quintet/data/byte_corpus.hpp>
#include <quintet/data/markov_source.hpp>
#include <quintet/data/token_batch.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace quintet {

class any_token_source {
 public:
  any_token_source(markov_source source) : source_(std::move(source)) {}  // NOLINT(implicit)
  any_token_source(byte_corpus source) : source_(std::move(source)) {}    // NOLINT(implicit)

  std::int64_t vocab_size() const {
    return std::visit([](const auto& s) { return s.vocab_size(); }, source_);
  }
  std::optional<double> entropy_floor(std::int64_t seq) const {
    return std::visit([&](const auto& s) { return s.entropy_floor(seq); }, source_);
  }
  token_batch batch(std::int64_t step, row_range rows, std::int64_t seq) const {
    return std::visit([&](const auto& s) { return s.batch(step, rows, seq); }, source_);
  }
  // One line for logs and reports, e.g. "markov(vocab 16, order 2, 1024 transitions, seed 0)".
  std::string description() const {
    return std::visit([](const auto& s) { return s.description(); }, source_);
  }

  // The source itself, or nullptr when it is of the other kind.
  const markov_source* markov() const { return std::get_if<markov_source>(&source_); }
  const byte_corpus* bytes() const { return std::get_if<byte_corpus>(&source_); }

 private:
  std::variant<markov_source, byte_corpus> source_;
};

}  // namespace quintet
