// any_token_source: the run-time choice between the Markov corpus and a byte corpus forwards to
// the source it holds, bit for bit.
#include <catch2/catch.hpp>

#include <quintet/data/any_token_source.hpp>
#include <quintet/data/token_source.hpp>

#include <cstdint>
#include <cstring>
#include <vector>

using quintet::any_token_source;
using quintet::byte_corpus;
using quintet::markov_config;
using quintet::markov_source;

static_assert(quintet::token_source<any_token_source>);

TEST_CASE("any_token_source holding a Markov source forwards to it", "[data][source]") {
  const markov_config config{.vocab = 12, .order = 2, .successors = 3, .seed = 4};
  const markov_source direct(config);
  const any_token_source source = markov_source(config);
  REQUIRE(source.markov() != nullptr);
  CHECK(source.bytes() == nullptr);
  CHECK(source.vocab_size() == 12);
  CHECK(source.entropy_floor(20).value() == direct.entropy_floor(20).value());
  CHECK(source.markov()->entropy_rate() == direct.entropy_rate());
  const auto expected = direct.batch(6, {2, 5}, 20);
  const auto batch = source.batch(6, {2, 5}, 20);
  CHECK(std::memcmp(batch.inputs.data(), expected.inputs.data(), expected.inputs.bytes()) == 0);
  CHECK(std::memcmp(batch.targets.data(), expected.targets.data(), expected.targets.bytes()) == 0);
  CHECK(source.description() == "markov(vocab 12, order 2, 432 transitions, seed 4)");
}

TEST_CASE("any_token_source holding a byte corpus forwards to it", "[data][source]") {
  std::vector<std::uint8_t> bytes(300);
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<std::uint8_t>(i * 7 % 251);
  const byte_corpus direct(bytes, 9, "text");
  const any_token_source source = byte_corpus(bytes, 9, "text");
  REQUIRE(source.bytes() != nullptr);
  CHECK(source.markov() == nullptr);
  CHECK(source.vocab_size() == 256);
  CHECK_FALSE(source.entropy_floor(16).has_value());
  const auto expected = direct.batch(1, {0, 4}, 16);
  const auto batch = source.batch(1, {0, 4}, 16);
  CHECK(std::memcmp(batch.inputs.data(), expected.inputs.data(), expected.inputs.bytes()) == 0);
  CHECK(source.description() == "bytes(text, 300 bytes, seed 9)");
  REQUIRE_THROWS_WITH(source.batch(1, {0, 4}, 300), Catch::Contains("has 300 bytes, fewer than"));
}
